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
use crate::session::Session;
use crate::tenancy::Principal;

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
    let result = match app.edge.lookup(&principal.tenant.name, &handler) {
        // The handler may itself be a device's tool.
        Some((handler_device, index)) => app
            .edge
            .call(&handler_device, index, &arguments)
            .await
            .map(|bytes| serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null)),
        None => {
            crate::downstream::forward::call_internal(app, &principal.tenant, session, &handler, &arguments, timeout)
                .await
        }
    };
    match result {
        Ok(result) => {
            let text = result_text(&result);
            if result.get("isError").and_then(Value::as_bool).unwrap_or(false) {
                metrics.task("handler_failed");
                format!("error: the task handler {handler} failed: {text}")
            } else {
                metrics.task("answered");
                text
            }
        }
        Err(e) => {
            metrics.task("handler_failed");
            tracing::info!(handler, device = %device.name, error = %e, "edge text task: the handler failed");
            format!("error: the task handler {handler} failed: {e}")
        }
    }
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
