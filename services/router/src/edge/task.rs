//! Text tasks: a device's user text, handed to the tool named by
//! `edge.task_handler` (resolved in the device's tenant's catalog, or among
//! its device tools), called with `{"text", "task_id", "device"}`. The
//! handler's text answer goes back to the device; so does a clear error
//! text when there is no handler or it fails.

use std::sync::Arc;

use serde_json::{json, Value};
use switchboard_protocol::edge::{task_str, TaskId};

use super::Device;
use crate::app::App;
use switchboard_core::policy::Principal;
use switchboard_session::Session;

/// Runs one text task and returns the text to send back.
pub async fn run(
    app: &Arc<App>,
    principal: &Principal,
    device: &Device,
    session: &Arc<Session>,
    task: TaskId,
    text: String,
) -> String {
    let metrics = &app.metrics.edge;
    let Some(handler) = app.edge.config.task_handler.clone() else {
        metrics.task("no_handler");
        return "error: this router has no task handler for text tasks (edge.task_handler is not set)".into();
    };
    let arguments = json!({"text": text, "task_id": task_str(&task), "device": &*device.name});
    let timeout = app.edge.config.task_timeout;
    let started = std::time::Instant::now();
    let (upstream, result) = match app.edge.lookup(&principal.tenant.name, &handler) {
        // The handler may itself be a device's tool.
        Some((handler_device, index)) => {
            let call = app.edge.call(&handler_device, index, &arguments);
            let result = match tokio::time::timeout(timeout, call).await {
                Ok(result) => result.map(|bytes| serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null)),
                Err(_) => Err(crate::error::Error::UpstreamTimeout {
                    upstream: Arc::from(format!("edge:{}", handler_device.name)),
                    after: timeout,
                }),
            };
            (Some(format!("edge:{}", handler_device.name)), result)
        }
        None => {
            let upstream = app
                .catalog
                .current()
                .list(switchboard_protocol::methods::ListKind::Tools)
                .get(&handler)
                .map(|item| app.upstreams[item.upstream].name.to_string());
            let result = crate::downstream::forward::call_internal(
                app,
                &principal.tenant,
                session,
                &handler,
                &arguments,
                timeout,
            )
            .await;
            (upstream, result)
        }
    };
    let (answer, outcome, code) = match result {
        Ok(result) => {
            let text = result_text(&result);
            if result.get("isError").and_then(Value::as_bool).unwrap_or(false) {
                metrics.task("handler_failed");
                (format!("error: the task handler {handler} failed: {text}"), "error", None)
            } else {
                metrics.task("answered");
                (text, "ok", None)
            }
        }
        Err(e) => {
            metrics.task("handler_failed");
            tracing::info!(handler, device = %device.name, error = %e, "edge text task: the handler failed");
            let outcome =
                if matches!(e, crate::error::Error::UpstreamTimeout { .. }) { "timeout" } else { "upstream_failed" };
            (format!("error: the task handler {handler} failed: {e}"), outcome, Some(e.code()))
        }
    };
    // The handler call is audited like a client's call, as the device's key.
    if let Some(audit) = &app.audit {
        audit.record(switchboard_db::AuditRecord {
            id: audit.new_id(),
            at_ms: switchboard_core::time::now_ms(),
            tenant: Some(principal.tenant.name.to_string()),
            key_prefix: Some(principal.key_prefix.to_string()).filter(|p| !p.is_empty()),
            session: Some(session.id.to_string()),
            method: "tools/call".into(),
            target: Some(handler.clone()),
            upstream,
            outcome: outcome.into(),
            error_code: code,
            latency_us: started.elapsed().as_micros() as i64,
            request_bytes: text.len() as i64,
            response_bytes: answer.len() as i64,
            trace_id: None,
            arguments: principal.tenant.audit_arguments.then(|| arguments.to_string()),
        });
    }
    answer
}

/// The text of a tool result: its text contents, one per line; else its
/// structured content as JSON.
fn result_text(result: &Value) -> String {
    let texts: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter_map(|item| item.get("text").and_then(Value::as_str)).collect())
        .unwrap_or_default();
    if !texts.is_empty() {
        return texts.join("\n");
    }
    match result.get("structuredContent") {
        Some(v) if !v.is_null() => v.to_string(),
        _ => String::new(),
    }
}
