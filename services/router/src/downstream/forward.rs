//! Forwarding a request to the upstream that serves it: resolve the exposed
//! name or URI, rewrite just that field by splicing, send it on the session's
//! channel, and relay the answer — as one JSON body, or as an SSE stream when
//! the upstream streams (progress, logging, server-to-client requests).
//!
//! The hot path: the body is never decoded beyond the envelope and the routing
//! members of `params`; arguments and results travel as the bytes received.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;
use switchboard_core::UpstreamId;

use bytes::Bytes;
use http::Response;
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_protocol::jsonrpc::{self, as_str, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::{Method, ProtocolVersion};
use tokio::sync::mpsc;

use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use switchboard_catalog::Snapshot;
use switchboard_core::policy::{Principal, Tenant};
use switchboard_core::Outcome;
use switchboard_db::AuditRecord;
use switchboard_limits::InflightPermit;
use switchboard_session::events::Log;
use switchboard_session::Session;
use switchboard_upstream::{Item, MessageStream, Outgoing, Reply, UpstreamError};

/// The `retry:` hint sent with priming events.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// A request rewritten for its upstream.
pub(super) struct Resolved {
    pub upstream: UpstreamId,
    pub body: Bytes,
    pub id: Range<usize>,
    pub progress_token: Option<Range<usize>>,
}

/// What a forwarded request leaves behind when it ends, however it ends:
/// its audit record (when auditing) and its slot of the tenant's limit on
/// requests in flight.
pub struct Ledger {
    pub draft: Option<AuditRecord>,
    pub permit: Option<InflightPermit>,
    /// Where a record still in `draft` goes when the ledger is dropped
    /// unclosed (the client hung up first): written as `abandoned`.
    pub sink: Option<switchboard_audit::Sink>,
    pub started: Instant,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if let (Some(mut record), Some(sink)) = (self.draft.take(), self.sink.as_ref()) {
            record.outcome = Outcome::Abandoned.label().to_owned();
            record.latency_us = self.started.elapsed().as_micros() as i64;
            sink.record(record);
        }
    }
}

impl Ledger {
    /// Frees the slot and writes the audit record.
    pub fn close(
        &mut self,
        app: &App,
        upstream: Option<UpstreamId>,
        outcome: Outcome,
        error_code: Option<i64>,
        response_bytes: usize,
        started: Instant,
    ) {
        self.close_named(app, upstream.map(|u| &*app.upstreams[u].name), outcome, error_code, response_bytes, started);
    }

    /// [`Ledger::close`] for a request answered by something other than a
    /// configured upstream (an edge device).
    pub fn close_named(
        &mut self,
        app: &App,
        upstream: Option<&str>,
        outcome: Outcome,
        error_code: Option<i64>,
        response_bytes: usize,
        started: Instant,
    ) {
        self.permit.take();
        if let (Some(mut record), Some(audit)) = (self.draft.take(), app.audit.as_ref()) {
            record.upstream = upstream.map(str::to_owned);
            record.outcome = outcome.label().to_owned();
            record.error_code = error_code;
            record.latency_us = started.elapsed().as_micros() as i64;
            record.response_bytes = response_bytes as i64;
            audit.record(record);
        }
    }
}

/// The `error.code` of an error response, if it is one.
pub(super) fn error_code(message: &[u8]) -> Option<i64> {
    let env = Envelope::parse(message).ok()?;
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(env.error?.get()).ok().map(|c| c.code)
}

/// Resolves, forwards and answers one request.
#[allow(clippy::too_many_arguments)]
pub async fn forward(
    app: &Arc<App>,
    who: &Principal,
    session: &Arc<Session>,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
    accepts_sse: bool,
    started: Instant,
    mut ledger: Ledger,
) -> Response<Body> {
    let id = env.id.expect("a request has an id");
    if method == Method::ToolsCall {
        if let Some(target) = crate::edge::target(app, &who.tenant.name, env) {
            return respond::json(crate::edge::answer(app, target, id, started, ledger).await);
        }
    }
    let resolved = match resolve(app, &who.tenant, method, env, body).await {
        Ok(resolved) => resolved,
        Err(e) => {
            let outcome = match e {
                _ if e.side() == crate::error::Side::Upstream => Outcome::UpstreamFailed,
                Error::InvalidParams(_) => Outcome::Rejected,
                _ => Outcome::Error,
            };
            app.metrics.request(method, None).record(outcome, started.elapsed());
            ledger.close(app, None, outcome, Some(e.code()), 0, started);
            return respond::error(Some(id), &e);
        }
    };
    let u = resolved.upstream;
    if app.catalog.is_stateless_only(u) {
        if matches!(method, Method::ResourcesSubscribe | Method::ResourcesUnsubscribe) {
            let e = Error::InvalidParams(format!(
                "upstream {:?} speaks MCP 2026-07-28, whose resource subscriptions the router does not bridge",
                app.upstreams[u].name
            ));
            app.metrics.request(method, Some(u)).record(Outcome::Rejected, started.elapsed());
            ledger.close(app, Some(u), Outcome::Rejected, Some(e.code()), 0, started);
            return respond::error(Some(id), &e);
        }
        return super::stateless::forward(app, session, method, id, resolved, accepts_sse, started, ledger).await;
    }
    let upstream = &app.upstreams[u];
    let metrics = app.metrics.request(method, Some(u));
    let channel = match session.channel(u).await.map_err(Error::from) {
        Ok(channel) => channel,
        Err(e) => {
            let outcome =
                if matches!(e, Error::UpstreamTimeout { .. }) { Outcome::Timeout } else { Outcome::UpstreamFailed };
            metrics.record(outcome, started.elapsed());
            ledger.close(app, Some(u), outcome, Some(e.code()), 0, started);
            return respond::error(Some(id), &e);
        }
    };
    let deadline = tokio::time::Instant::now() + upstream.config.timeout;
    let out = Outgoing { body: resolved.body, method, id: resolved.id, progress_token: resolved.progress_token };
    session.begin(id, u);
    let inflight = Inflight { app, session, id, upstream: u, method, started, armed: true, ledger };
    let reply = tokio::time::timeout_at(deadline, channel.request(out)).await;
    match reply {
        Err(_) => {
            cancel_upstream(app, session, u, id, "timeout");
            let e = Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout };
            inflight.finish(Outcome::Timeout, Some(e.code()), 0);
            respond::error(Some(id), &e)
        }
        Ok(Err(e)) => {
            let e = Error::upstream(&upstream.name, e);
            inflight.finish(Outcome::UpstreamFailed, Some(e.code()), 0);
            respond::error(Some(id), &e)
        }
        Ok(Ok(Reply::Done(message))) => {
            let (message, outcome) = finish(app, u, method, message);
            let code =
                if outcome == Outcome::Error && inflight.ledger.draft.is_some() { error_code(&message) } else { None };
            inflight.finish(outcome, code, message.len());
            respond::json(message)
        }
        Ok(Ok(Reply::Stream(stream))) => {
            let mut inflight = inflight;
            let call = Call {
                app: app.clone(),
                session: session.clone(),
                upstream: u,
                method,
                id: id.to_owned(),
                started,
                deadline,
                ledger: inflight.take_ledger(),
                sent: 0,
            };
            if accepts_sse {
                // The relay does the bookkeeping from here, client or no client.
                inflight.disarm();
                let log = session.new_stream();
                if session.version >= ProtocolVersion::V2025_11_25 && !session.legacy {
                    // Something to resume from before the first real event.
                    log.prime(RETRY);
                }
                let (tx, rx) = mpsc::channel(64);
                tokio::spawn(log.clone().reader(None, tx));
                tokio::spawn(call.relay(stream, log));
                respond::sse(rx, app.config.server.keep_alive)
            } else {
                let response = call.drain(stream).await;
                inflight.disarm();
                response
            }
        }
    }
}

/// The bookkeeping of a request in flight, done however the handler ends:
/// if the client disconnects, hyper drops the handler mid-await, and the
/// request is then recorded as abandoned and cancelled upstream.
pub(super) struct Inflight<'a> {
    app: &'a Arc<App>,
    session: &'a Arc<Session>,
    id: &'a RawValue,
    upstream: UpstreamId,
    method: Method,
    started: Instant,
    armed: bool,
    ledger: Ledger,
}

impl<'a> Inflight<'a> {
    /// Bookkeeping for a request to upstream `u` under the id `id`.
    pub(super) fn new(
        app: &'a Arc<App>,
        session: &'a Arc<Session>,
        id: &'a RawValue,
        upstream: UpstreamId,
        method: Method,
        started: Instant,
        ledger: Ledger,
    ) -> Self {
        Inflight { app, session, id, upstream, method, started, armed: true, ledger }
    }

    pub(super) fn finish(mut self, outcome: Outcome, error_code: Option<i64>, response_bytes: usize) {
        self.armed = false;
        self.session.end(self.id.get());
        self.app.metrics.request(self.method, Some(self.upstream)).record(outcome, self.started.elapsed());
        self.ledger.close(self.app, Some(self.upstream), outcome, error_code, response_bytes, self.started);
    }

    /// Hands the ledger to whoever finishes the request (a streamed answer).
    pub(super) fn take_ledger(&mut self) -> Ledger {
        Ledger {
            draft: self.ledger.draft.take(),
            permit: self.ledger.permit.take(),
            sink: self.ledger.sink.clone(),
            started: self.ledger.started,
        }
    }

    /// Someone else does the bookkeeping.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.session.end(self.id.get());
            let metrics = self.app.metrics.request(self.method, Some(self.upstream));
            metrics.record(Outcome::Abandoned, self.started.elapsed());
            self.ledger.close(self.app, Some(self.upstream), Outcome::Abandoned, None, 0, self.started);
            cancel_upstream(self.app, self.session, self.upstream, self.id, "the client disconnected");
        }
    }
}

/// Finds the upstream and builds the rewritten body.
/// Only what `tenant` sees resolves; anything else is unknown, exactly as if
/// it did not exist.
pub(super) async fn resolve(
    app: &Arc<App>,
    tenant: &Tenant,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
) -> Result<Resolved, Error> {
    let params = env.params.ok_or_else(|| Error::InvalidParams(format!("{} needs params", method.as_str())))?;
    let target = Target::parse(params).map_err(|e| Error::InvalidParams(e.to_string()))?;
    let mut snapshot = app.catalog.current();
    let (upstream, field, replacement): (UpstreamId, &RawValue, Original) = match method {
        Method::ToolsCall | Method::PromptsGet => {
            let kind = if method == Method::ToolsCall { ListKind::Tools } else { ListKind::Prompts };
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            let (u, original) = find(app, tenant, &mut snapshot, kind, &name).await?;
            (u, raw, original)
        }
        Method::ResourcesRead | Method::ResourcesSubscribe | Method::ResourcesUnsubscribe => {
            let raw = target.uri.ok_or_else(|| Error::InvalidParams("params.uri is required".into()))?;
            let (u, original) = resolve_uri(app, tenant, &snapshot, raw)?;
            (u, raw, Original::Built(original))
        }
        Method::CompletionComplete => {
            let reference =
                target.reference.as_ref().ok_or_else(|| Error::InvalidParams("params.ref is required".into()))?;
            match reference.kind.as_deref() {
                Some("ref/prompt") => {
                    let raw =
                        reference.name.ok_or_else(|| Error::InvalidParams("params.ref.name is required".into()))?;
                    let name =
                        as_str(raw).ok_or_else(|| Error::InvalidParams("params.ref.name must be a string".into()))?;
                    let (u, original) = find(app, tenant, &mut snapshot, ListKind::Prompts, &name).await?;
                    (u, raw, original)
                }
                Some("ref/resource") => {
                    let raw = reference.uri.ok_or_else(|| Error::InvalidParams("params.ref.uri is required".into()))?;
                    let (u, original) = resolve_uri(app, tenant, &snapshot, raw)?;
                    (u, raw, Original::Built(original))
                }
                other => return Err(Error::InvalidParams(format!("unknown ref type {other:?}"))),
            }
        }
        _ => unreachable!("only forwarded methods reach resolve"),
    };
    let field_span = span(body, field.get());
    let id = span(body, env.id.expect("a request has an id").get());
    let token = target.progress_token.map(|t| span(body, t.get()));
    if *replacement == *field.get().as_bytes() {
        return Ok(Resolved { upstream, body: body.clone(), id, progress_token: token });
    }
    let delta = replacement.len() as isize - field_span.len() as isize;
    let shift = |r: Range<usize>| {
        if r.start >= field_span.end {
            (r.start as isize + delta) as usize..(r.end as isize + delta) as usize
        } else {
            r
        }
    };
    let rewritten = splice(body, &mut [Edit::new(field_span.clone(), &replacement)]);
    Ok(Resolved { upstream, body: rewritten, id: shift(id), progress_token: token.map(shift) })
}

/// A name or URI as its upstream knows it (JSON text): shared with the
/// catalog (no copy per call), or built for this request.
enum Original {
    Shared(Arc<[u8]>),
    Built(Vec<u8>),
}

impl std::ops::Deref for Original {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Original::Shared(bytes) => bytes,
            Original::Built(bytes) => bytes,
        }
    }
}

/// Looks a tool or prompt up, refreshing the catalog once if it is missing.
async fn find(
    app: &Arc<App>,
    tenant: &Tenant,
    snapshot: &mut Arc<Snapshot>,
    kind: ListKind,
    name: &str,
) -> Result<(UpstreamId, Original), Error> {
    let unknown = || match kind {
        ListKind::Prompts => Error::UnknownPrompt(name.to_owned()),
        _ => Error::UnknownTool(name.to_owned()),
    };
    let visible = |item: &switchboard_catalog::Item| super::lists::sees(tenant, kind, item);
    if let Some(item) = snapshot.list(kind).get(name) {
        return if visible(item) {
            Ok((item.upstream, Original::Shared(item.original.clone())))
        } else {
            Err(unknown())
        };
    }
    *snapshot = app.catalog.ensure(&[kind]).await;
    if let Some(item) = snapshot.list(kind).get(name) {
        return if visible(item) {
            Ok((item.upstream, Original::Shared(item.original.clone())))
        } else {
            Err(unknown())
        };
    }
    if let Some(u) = app.catalog.missing_upstream(kind, name).filter(|&u| tenant.sees_upstream(u)) {
        let why = format!("left out of the catalog after failing; retried every {:?}", app.catalog.retry_after());
        return Err(Error::upstream(&app.upstreams[u].name, UpstreamError::Down(why)));
    }
    Err(unknown())
}

/// Calls tool `name` (as `tenant` sees it) on behalf of the router itself,
/// on `session`'s channel, and returns the tool result (the `result`
/// object). Used for edge text tasks.
pub(crate) async fn call_internal(
    app: &Arc<App>,
    tenant: &Tenant,
    session: &Arc<Session>,
    name: &str,
    arguments: &Value,
    timeout: std::time::Duration,
) -> Result<Value, Error> {
    let mut snapshot = app.catalog.current();
    let (u, original) = find(app, tenant, &mut snapshot, ListKind::Tools, name).await?;
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
    let mut value: Value = serde_json::from_slice(&message)
        .map_err(|e| Error::upstream(&upstream.name, UpstreamError::Protocol(e.to_string())))?;
    if let Some(error) = value.get("error") {
        let text = error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned();
        return Err(Error::upstream(&upstream.name, UpstreamError::Protocol(format!("it answered an error: {text}"))));
    }
    Ok(value.get_mut("result").map(Value::take).unwrap_or(Value::Null))
}

fn resolve_uri(
    app: &App,
    tenant: &Tenant,
    snapshot: &Snapshot,
    raw: &RawValue,
) -> Result<(UpstreamId, Vec<u8>), Error> {
    let uri = as_str(raw).ok_or_else(|| Error::InvalidParams("the uri must be a string".into()))?;
    let (u, original) = app
        .catalog
        .resolve_uri(snapshot, &uri)
        .filter(|&(u, _)| tenant.sees_upstream(u))
        .ok_or_else(|| Error::UnknownResource(uri.to_string()))?;
    Ok((u, jsonrpc::json_string(original)))
}

/// Classifies the response and applies the few rewrites results need
/// (resource URIs in `resources/read`).
pub(super) fn finish(app: &App, u: UpstreamId, method: Method, message: Bytes) -> (Bytes, Outcome) {
    let outcome = match Envelope::parse(&message) {
        Ok(env) if env.kind == MessageKind::Response => Outcome::Ok,
        _ => Outcome::Error,
    };
    if method != Method::ResourcesRead || outcome != Outcome::Ok || app.upstreams[u].config.prefix.is_empty() {
        return (message, outcome);
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&message) else { return (message, outcome) };
    if let Some(Value::Array(contents)) = value.pointer_mut("/result/contents") {
        for content in contents {
            if let Some(uri) = content.get("uri").and_then(Value::as_str) {
                let exposed = app.catalog.expose_uri(u, uri);
                content["uri"] = Value::String(exposed);
            }
        }
    }
    (Bytes::from(serde_json::to_vec(&value).expect("serializable")), outcome)
}

/// Tells the upstream to stop working on a request (best effort, in the background).
pub(super) fn cancel_upstream(app: &Arc<App>, session: &Arc<Session>, u: UpstreamId, id: &RawValue, reason: &str) {
    let Some(channel) = session.open_channel(u) else { return };
    let params =
        format!(r#"{{"requestId":{},"reason":{}}}"#, id.get(), String::from_utf8_lossy(&jsonrpc::json_string(reason)));
    let note = jsonrpc::request(None, "notifications/cancelled", Some(params.as_bytes()));
    let name = app.upstreams[u].name.clone();
    tokio::spawn(async move {
        if let Err(e) = channel.send(note).await {
            tracing::debug!(upstream = %name, error = %e, "cancellation not delivered");
        }
    });
}

/// Relays a streamed answer into `log` in the background, and does the
/// request's bookkeeping when it ends (a stateless client's call, whose
/// rounds read the log).
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn_relay(
    app: &Arc<App>,
    session: &Arc<Session>,
    upstream: UpstreamId,
    method: Method,
    id: &RawValue,
    started: Instant,
    deadline: tokio::time::Instant,
    ledger: Ledger,
    stream: Box<dyn MessageStream>,
    log: Arc<Log>,
) {
    let call = Call {
        app: app.clone(),
        session: session.clone(),
        upstream,
        method,
        id: id.to_owned(),
        started,
        deadline,
        ledger,
        sent: 0,
    };
    tokio::spawn(call.relay(stream, log));
}

/// A forwarded request whose answer streams.
struct Call {
    app: Arc<App>,
    session: Arc<Session>,
    upstream: UpstreamId,
    method: Method,
    id: Box<RawValue>,
    started: Instant,
    deadline: tokio::time::Instant,
    ledger: Ledger,
    /// Bytes relayed to the client, for the audit record.
    sent: usize,
}

/// What one upstream message means for the call.
enum Step {
    /// The response: the call is over.
    Done(Bytes, Outcome),
    /// A related message for the client; `true` if it is a request (which
    /// the client must answer).
    Relay(Bytes, bool),
    /// Nothing to send.
    Skip,
}

impl Call {
    fn step(&self, message: Bytes) -> Step {
        let env = match Envelope::parse(&message) {
            Ok(env) => env,
            Err(_) => {
                self.app.metrics.upstreams.protocol_error(&self.app.upstreams[self.upstream].name);
                return Step::Skip;
            }
        };
        if matches!(env.kind, MessageKind::Response | MessageKind::Error)
            && env.id.is_some_and(|i| same_id(i, &self.id))
        {
            drop(env);
            let (message, outcome) = finish(&self.app, self.upstream, self.method, message);
            return Step::Done(message, outcome);
        }
        let is_request = env.kind == MessageKind::Request;
        match self.app.relay_parsed(&self.session, self.upstream, &env, &message) {
            Some(out) => Step::Relay(out, is_request),
            None => Step::Skip,
        }
    }

    fn error_message(&self, err: &Error) -> Bytes {
        jsonrpc::error_response(Some(&self.id), err.code(), &err.to_string(), err.data().as_ref())
    }

    /// Relays the stream into the request's event log until the response.
    /// The relay goes on if the client disconnects: a disconnect is not a
    /// cancellation, and the client may resume with `Last-Event-ID`.
    async fn relay(mut self, mut stream: Box<dyn MessageStream>, log: Arc<Log>) {
        let name = self.app.upstreams[self.upstream].name.clone();
        let outcome = loop {
            let next = tokio::select! {
                next = stream.next_item() => next,
                () = tokio::time::sleep_until(self.deadline) => {
                    let timeout = self.app.upstreams[self.upstream].config.timeout;
                    log.push(&self.error_message(&Error::UpstreamTimeout { upstream: name.clone(), after: timeout }));
                    cancel_upstream(&self.app, &self.session, self.upstream, &self.id, "timeout");
                    break (Outcome::Timeout, Some(switchboard_protocol::jsonrpc::code::REQUEST_TIMEOUT));
                }
            };
            match next {
                Some(Ok(Item::Message(message))) => match self.step(message) {
                    Step::Done(message, outcome) => {
                        log.push(&message);
                        self.sent += message.len();
                        let code = if outcome == Outcome::Error { error_code(&message) } else { None };
                        break (outcome, code);
                    }
                    Step::Relay(out, _) => {
                        self.sent += out.len();
                        log.push(&out)
                    }
                    Step::Skip => {}
                },
                Some(Ok(Item::Paused)) => {
                    // The upstream ended its stream early and will be resumed;
                    // end ours likewise when the client can resume it.
                    if self.session.version >= ProtocolVersion::V2025_11_25
                        && !self.session.legacy
                        && !self.session.for_tenant
                    {
                        log.cut();
                    }
                }
                Some(Err(e)) => {
                    let e = Error::upstream(&name, e);
                    log.push(&self.error_message(&e));
                    break (Outcome::UpstreamFailed, Some(e.code()));
                }
                None => {
                    let e = Error::upstream(&name, UpstreamError::Closed);
                    log.push(&self.error_message(&e));
                    break (Outcome::UpstreamFailed, Some(e.code()));
                }
            }
        };
        log.close();
        self.finish(outcome.0, outcome.1);
    }

    /// For a client that takes only JSON: waits for the response; server
    /// requests go to the session's GET stream, notifications are dropped.
    async fn drain(mut self, mut stream: Box<dyn MessageStream>) -> Response<Body> {
        let name = self.app.upstreams[self.upstream].name.clone();
        let result = loop {
            let next = match tokio::time::timeout_at(self.deadline, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    cancel_upstream(&self.app, &self.session, self.upstream, &self.id, "timeout");
                    let timeout = self.app.upstreams[self.upstream].config.timeout;
                    break Err((Error::UpstreamTimeout { upstream: name.clone(), after: timeout }, Outcome::Timeout));
                }
            };
            match next {
                Some(Ok(message)) => match self.step(message) {
                    Step::Done(message, outcome) => break Ok((message, outcome)),
                    Step::Relay(out, is_request) => {
                        if is_request {
                            self.session.push(out);
                        } else {
                            self.app.metrics.upstreams.relay_dropped(&name, "client_accepts_json_only");
                        }
                    }
                    Step::Skip => {}
                },
                Some(Err(e)) => break Err((Error::upstream(&name, e), Outcome::UpstreamFailed)),
                None => break Err((Error::upstream(&name, UpstreamError::Closed), Outcome::UpstreamFailed)),
            }
        };
        match result {
            Ok((message, outcome)) => {
                self.sent += message.len();
                let code = if outcome == Outcome::Error { error_code(&message) } else { None };
                self.finish(outcome, code);
                respond::json(message)
            }
            Err((e, outcome)) => {
                self.finish(outcome, Some(e.code()));
                respond::error(Some(&self.id), &e)
            }
        }
    }

    fn finish(&mut self, outcome: Outcome, error_code: Option<i64>) {
        self.session.end(self.id.get());
        self.app.metrics.request(self.method, Some(self.upstream)).record(outcome, self.started.elapsed());
        let app = self.app.clone();
        self.ledger.close(&app, Some(self.upstream), outcome, error_code, self.sent, self.started);
    }
}

impl Drop for Call {
    /// A call dropped before it finished (the client hung up while a
    /// JSON-only answer was drained) still leaves its audit record.
    fn drop(&mut self) {
        if self.ledger.draft.is_some() || self.ledger.permit.is_some() {
            let app = self.app.clone();
            self.ledger.close(&app, Some(self.upstream), Outcome::Abandoned, None, self.sent, self.started);
        }
    }
}

/// Whether a response's id is the request's: byte-equal as a rule, equal as
/// JSON values when an upstream reformats it (escapes in a string).
fn same_id(a: &RawValue, b: &RawValue) -> bool {
    a.get() == b.get()
        || matches!(
            (serde_json::from_str::<Value>(a.get()), serde_json::from_str::<Value>(b.get())),
            (Ok(x), Ok(y)) if x == y
        )
}
