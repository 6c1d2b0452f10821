//! Edge devices in the router: what the devices crate asks of the router
//! ([`Host`]: keys, the tools a tenant already sees, news of devices coming
//! and going, text tasks).
//!
//! Text tasks: a device's user text is handed to the tool its tenant names
//! (`task_handler` of the tenant), else to `edge.task_handler` (resolved
//! in the device's tenant's catalog, or among its device tools), called with `{"text", "task_id", "device"}` on a
//! session of the device's own, and audited as the device's key. The
//! handler's text answer goes back to the device; so does a clear error
//! text when there is no handler or it fails.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use switchboard_core::policy::{AuthFailure, Principal, Tenant};
use switchboard_devices::{Device, Host, TaskRunner};
use switchboard_protocol::edge::{task_str, TaskId};
use switchboard_protocol::methods::ListKind;
use switchboard_session::Session;
use switchboard_upstream::{Outgoing, UpstreamError};

use crate::app::App;
use crate::error::Error;

/// The router, as edge devices see it.
pub struct EdgeHost(pub Arc<App>);

impl Host for EdgeHost {
    fn authenticate(&self, key: Option<&str>) -> Result<Principal, AuthFailure> {
        self.0.directory.authenticate_key(key, switchboard_core::time::now_ms)
    }

    fn sees_tool(&self, tenant: &Tenant, tool: &str) -> bool {
        let snapshot = self.0.catalog.current();
        snapshot.list(ListKind::Tools).get(tool).is_some_and(|item| tenant.sees_tool(item.upstream, &item.name))
    }

    fn tools_changed(&self, tenant: &str) {
        self.0.announce_tools(tenant);
    }

    fn task_runner(&self, principal: &Principal, device: &Arc<Device>) -> Arc<dyn TaskRunner> {
        let session = self.0.sessions.private(switchboard_session::Client {
            tenant: principal.tenant.name.clone(),
            key: principal.key_id.clone(),
            user: principal.user.clone(),
            version: switchboard_protocol::ProtocolVersion::LATEST,
            capabilities: Arc::from(switchboard_upstream::empty_object()),
        });
        Arc::new(Tasks { app: self.0.clone(), principal: principal.clone(), device: device.clone(), session })
    }
}

/// The text tasks of one device connection, on a session of its own.
struct Tasks {
    app: Arc<App>,
    principal: Principal,
    device: Arc<Device>,
    session: Arc<Session>,
}

#[async_trait]
impl TaskRunner for Tasks {
    async fn run(&self, task: TaskId, text: String) -> String {
        let (app, principal, device, session) = (&self.app, &self.principal, &self.device, &self.session);
        let metrics = &app.metrics.edge;
        // The tenant's handler as its policy is now (the directory's).
        let tenant = app.directory.tenant(&principal.tenant.name).unwrap_or_else(|| principal.tenant.clone());
        let handler =
            tenant.task_handler.as_deref().map(str::to_owned).or_else(|| app.edge.config.task_handler.clone());
        let Some(handler) = handler else {
            metrics.task("no_handler");
            return "error: no task handler for text tasks: the tenant names none (task_handler) and edge.task_handler is not set".into();
        };
        let arguments = json!({"text": text, "task_id": task_str(&task), "device": &*device.name});
        let timeout = app.edge.config.task_timeout;
        let started = std::time::Instant::now();
        let (upstream, result) = match app.edge.lookup(&principal.tenant.name, &handler) {
            // The handler may itself be a device's tool.
            Some((handler_device, index)) => {
                let call = app.edge.call(&handler_device, index, &arguments, None);
                let result = match tokio::time::timeout(timeout, call).await {
                    Ok(result) => result.map(|bytes| serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null)),
                    Err(_) => Err(switchboard_devices::CallError::Timeout {
                        device: handler_device.name.clone(),
                        after: timeout,
                    }),
                };
                (Some(Arc::from(format!("edge:{}", handler_device.name))), result.map_err(Error::from))
            }
            None => {
                let result = call_internal(app, &principal.tenant, session, &handler, &arguments, timeout).await;
                // Named after the call, which loads the catalog if it was not
                // yet (a task right after the router started).
                let upstream = app
                    .catalog
                    .current()
                    .list(switchboard_protocol::methods::ListKind::Tools)
                    .get(&handler)
                    .map(|item| app.upstreams[item.upstream].name.clone());
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
                let outcome = if matches!(e, Error::UpstreamTimeout { .. }) { "timeout" } else { "upstream_failed" };
                (format!("error: the task handler {handler} failed: {e}"), outcome, Some(e.code()))
            }
        };
        // The handler call is audited like a client's call, as the device's key.
        if let Some(audit) = &app.audit {
            let record = switchboard_db::AuditRecord {
                id: String::new(),
                at_ms: switchboard_core::time::now_ms(),
                tenant: Some(principal.tenant.name.clone()),
                key_prefix: Some(principal.key_prefix.clone()).filter(|p| !p.is_empty()),
                session: Some(session.id.clone()),
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
                user: principal.user.clone(),
            };
            app.feed.publish(&record);
            audit.record(record);
        }
        answer
    }

    async fn close(&self) {
        self.session.close().await;
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

/// Calls tool `name` (as `tenant` sees it) on behalf of the router itself,
/// on `session`'s channel, and returns the tool result (the `result`
/// object). Used for edge text tasks.
async fn call_internal(
    app: &Arc<App>,
    tenant: &Tenant,
    session: &Arc<Session>,
    name: &str,
    arguments: &Value,
    timeout: std::time::Duration,
) -> Result<Value, Error> {
    let (u, original) = app.catalog_tools.find(tenant, ListKind::Tools, name).await?;
    let upstream = &app.upstreams[u];
    let mut params = Vec::with_capacity(original.len() + 64);
    params.extend_from_slice(b"{\"name\":");
    params.extend_from_slice(&original);
    params.extend_from_slice(b",\"arguments\":");
    params.extend_from_slice(&serde_json::to_vec(arguments).expect("serializable"));
    params.push(b'}');
    let (out, id) = Outgoing::own("tools/call", &params, "edge-task");
    let work = async {
        let channel = session.channel(u).await?;
        let reply = channel.request(out).await.map_err(|e| Error::upstream(&upstream.name, e))?;
        switchboard_upstream::collect_response(reply, &id).await.map_err(|e| Error::upstream(&upstream.name, e))
    };
    let message = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| Error::UpstreamTimeout { upstream: upstream.name.clone(), after: timeout })??;
    let mut value: Value = serde_json::from_slice(&message).map_err(|e| {
        Error::upstream(&upstream.name, UpstreamError::Protocol(switchboard_upstream::Cause::from_error(e)))
    })?;
    if let Some(error) = value.get("error") {
        let text = error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned();
        return Err(Error::upstream(
            &upstream.name,
            UpstreamError::Protocol(format!("it answered an error: {text}").into()),
        ));
    }
    Ok(value.get_mut("result").map(Value::take).unwrap_or(Value::Null))
}
