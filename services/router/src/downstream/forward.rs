//! Phases 6 and 7 of a session's request: resolve the exposed name or URI,
//! rewrite just that field by splicing, send it on the session's channel,
//! and relay the answer — as one JSON body, or as an SSE stream when the
//! upstream streams (progress, logging, server-to-client requests).
//!
//! The hot path: the body is never decoded beyond the envelope and the routing
//! members of `params`; arguments and results travel as the bytes received.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_core::policy::Tenant;
use switchboard_core::{Outcome, UpstreamId};
use switchboard_protocol::jsonrpc::{self, as_str, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::{Method, ProtocolVersion};
use switchboard_session::events::Log;
use switchboard_session::Session;
use switchboard_upstream::{Item, MessageStream, Outgoing, Reply, UpstreamError};
use tokio::sync::mpsc;

use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use crate::exchange::{cancel_upstream, Exchange};
use crate::tools::{LocalTool, Tool};

/// The `retry:` hint sent with priming events.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// A request rewritten for its upstream.
pub(crate) struct Resolved {
    pub upstream: UpstreamId,
    pub body: Bytes,
    pub id: Range<usize>,
    pub progress_token: Option<Range<usize>>,
}

/// What a request resolved to.
pub(crate) enum Resolution {
    /// A configured upstream's tool, prompt or resource: the request rewritten for it.
    Upstream(Resolved),
    /// A tool its source calls itself.
    Local(Box<dyn LocalTool>),
}

/// Phase 6: resolves, then phase 7: forwards and answers one request of a
/// session. The exchange is finished however it ends.
pub async fn forward(
    mut x: Exchange,
    session: &Arc<Session>,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
    accepts_sse: bool,
) -> Response<Body> {
    let id = env.id.expect("a request has an id");
    let tenant = x.principal().expect("authenticated").tenant.clone();
    let resolved = match resolve(x.app(), &tenant, method, env, body).await {
        Ok(Resolution::Upstream(resolved)) => resolved,
        Ok(Resolution::Local(tool)) => return respond::json(call_local(x, tool, id).await),
        Err(e) => {
            let outcome = match e {
                _ if e.side() == crate::error::Side::Upstream => Outcome::UpstreamFailed,
                Error::InvalidParams(_) => Outcome::Rejected,
                _ => Outcome::Error,
            };
            return x.fail_as(Some(id), &e, outcome);
        }
    };
    let u = resolved.upstream;
    x.served_by(u);
    let app = x.app().clone();
    if app.catalog.is_stateless_only(u) {
        if matches!(method, Method::ResourcesSubscribe | Method::ResourcesUnsubscribe) {
            let e = Error::InvalidParams(format!(
                "upstream {:?} speaks MCP 2026-07-28, whose resource subscriptions the router does not bridge",
                app.upstreams[u].name
            ));
            return x.fail_as(Some(id), &e, Outcome::Rejected);
        }
        return super::stateless_upstream::forward(x, session, method, id, resolved, accepts_sse).await;
    }
    let upstream = &app.upstreams[u];
    let channel = match session.channel(u).await.map_err(Error::from) {
        Ok(channel) => channel,
        Err(e) => {
            let outcome =
                if matches!(e, Error::UpstreamTimeout { .. }) { Outcome::Timeout } else { Outcome::UpstreamFailed };
            return x.fail_as(Some(id), &e, outcome);
        }
    };
    let deadline = tokio::time::Instant::now() + upstream.config.timeout;
    x.in_flight(session, u, &resolved.body, resolved.id.clone());
    let out = Outgoing { body: resolved.body, method, id: resolved.id, progress_token: resolved.progress_token };
    match tokio::time::timeout_at(deadline, channel.request(out)).await {
        Err(_) => {
            cancel_upstream(&app, session, u, id.get(), "timeout");
            let e = Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout };
            x.fail_as(Some(id), &e, Outcome::Timeout)
        }
        Ok(Err(e)) => x.fail_as(Some(id), &Error::upstream(&upstream.name, e), Outcome::UpstreamFailed),
        Ok(Ok(Reply::Done(message))) => {
            let (message, outcome) = classify(&app, u, method, message);
            let code = if outcome == Outcome::Error { error_code(&message) } else { None };
            x.add_sent(message.len());
            x.finish(outcome, code);
            respond::json(message)
        }
        Ok(Ok(Reply::Stream(stream))) => {
            let call = Call { x, session: session.clone(), upstream: u, method, id: id.to_owned(), deadline };
            if !accepts_sse {
                return call.drain(stream).await;
            }
            // The relay finishes the exchange from here, client or no client.
            let log = session.new_stream();
            if session.version >= ProtocolVersion::V2025_11_25 && !session.legacy {
                // Something to resume from before the first real event.
                log.prime(RETRY);
            }
            let (tx, rx) = mpsc::channel(64);
            tokio::spawn(log.clone().reader(None, tx));
            tokio::spawn(call.relay(stream, log));
            respond::sse(rx, app.config.server.keep_alive)
        }
    }
}

/// Calls a tool its source answers itself, and returns the JSON-RPC answer;
/// the exchange is finished however the call ends, a client that hangs up
/// included.
pub(crate) async fn call_local(mut x: Exchange, tool: Box<dyn LocalTool>, id: &RawValue) -> Bytes {
    x.served_locally(tool.served_by());
    match tool.call().await {
        Ok(result) => {
            let body = jsonrpc::result_response(id, &result);
            x.add_sent(body.len());
            x.finish(Outcome::Ok, None);
            body
        }
        Err(e) => {
            let outcome = match &e {
                Error::InvalidArguments { .. } => Outcome::Rejected,
                Error::UpstreamTimeout { .. } => Outcome::Timeout,
                _ => Outcome::UpstreamFailed,
            };
            let body = jsonrpc::error_response(Some(id), e.code(), &e.to_string(), e.data().as_ref());
            x.add_sent(body.len());
            x.finish(outcome, Some(e.code()));
            body
        }
    }
}

/// The `error.code` of an error response, if it is one.
pub(crate) fn error_code(message: &[u8]) -> Option<i64> {
    let env = Envelope::parse(message).ok()?;
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(env.error?.get()).ok().map(|c| c.code)
}

/// Finds who serves the request and builds the rewritten body. Only what
/// `tenant` sees resolves; anything else is unknown, exactly as if it did
/// not exist.
pub(crate) async fn resolve(
    app: &Arc<App>,
    tenant: &Tenant,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
) -> Result<Resolution, Error> {
    let params = env.params.ok_or_else(|| Error::InvalidParams(format!("{} needs params", method.as_str())))?;
    let target = Target::parse(params).map_err(|e| Error::InvalidParams(e.to_string()))?;
    let (upstream, field, replacement): (UpstreamId, &RawValue, Vec<u8>) = match method {
        Method::ToolsCall => {
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            match crate::tools::resolve(&app.tools, tenant, &name, params).await? {
                Tool::Local(tool) => return Ok(Resolution::Local(tool)),
                Tool::Upstream { upstream, original } => {
                    return Ok(Resolution::Upstream(rewrite(upstream, body, env, &target, raw, &original)))
                }
            }
        }
        Method::PromptsGet => {
            let raw = target.name.ok_or_else(|| Error::InvalidParams("params.name is required".into()))?;
            let name = as_str(raw).ok_or_else(|| Error::InvalidParams("params.name must be a string".into()))?;
            let (u, original) = app.catalog_tools.find(tenant, ListKind::Prompts, &name).await?;
            return Ok(Resolution::Upstream(rewrite(u, body, env, &target, raw, &original)));
        }
        Method::ResourcesRead | Method::ResourcesSubscribe | Method::ResourcesUnsubscribe => {
            let raw = target.uri.ok_or_else(|| Error::InvalidParams("params.uri is required".into()))?;
            let (u, original) = resolve_uri(app, tenant, raw)?;
            (u, raw, original)
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
                    let (u, original) = app.catalog_tools.find(tenant, ListKind::Prompts, &name).await?;
                    return Ok(Resolution::Upstream(rewrite(u, body, env, &target, raw, &original)));
                }
                Some("ref/resource") => {
                    let raw = reference.uri.ok_or_else(|| Error::InvalidParams("params.ref.uri is required".into()))?;
                    let (u, original) = resolve_uri(app, tenant, raw)?;
                    (u, raw, original)
                }
                other => return Err(Error::InvalidParams(format!("unknown ref type {other:?}"))),
            }
        }
        _ => unreachable!("only forwarded methods reach resolve"),
    };
    Ok(Resolution::Upstream(rewrite(upstream, body, env, &target, field, &replacement)))
}

/// The request with `field` (a name or URI in it) replaced by `replacement`,
/// the upstream's own (JSON text), and where its id and progress token are.
fn rewrite(
    upstream: UpstreamId,
    body: &Bytes,
    env: &Envelope<'_>,
    target: &Target<'_>,
    field: &RawValue,
    replacement: &[u8],
) -> Resolved {
    let field_span = span(body, field.get());
    let id = span(body, env.id.expect("a request has an id").get());
    let token = target.progress_token.map(|t| span(body, t.get()));
    if *replacement == *field.get().as_bytes() {
        return Resolved { upstream, body: body.clone(), id, progress_token: token };
    }
    let delta = replacement.len() as isize - field_span.len() as isize;
    let shift = |r: Range<usize>| {
        if r.start >= field_span.end {
            (r.start as isize + delta) as usize..(r.end as isize + delta) as usize
        } else {
            r
        }
    };
    let rewritten = splice(body, &mut [Edit::new(field_span.clone(), replacement)]);
    Resolved { upstream, body: rewritten, id: shift(id), progress_token: token.map(shift) }
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
    let mut value: Value = serde_json::from_slice(&message)
        .map_err(|e| Error::upstream(&upstream.name, UpstreamError::Protocol(e.to_string())))?;
    if let Some(error) = value.get("error") {
        let text = error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned();
        return Err(Error::upstream(&upstream.name, UpstreamError::Protocol(format!("it answered an error: {text}"))));
    }
    Ok(value.get_mut("result").map(Value::take).unwrap_or(Value::Null))
}

fn resolve_uri(app: &App, tenant: &Tenant, raw: &RawValue) -> Result<(UpstreamId, Vec<u8>), Error> {
    let uri = as_str(raw).ok_or_else(|| Error::InvalidParams("the uri must be a string".into()))?;
    let snapshot = app.catalog.current();
    let (u, original) = app
        .catalog
        .resolve_uri(&snapshot, &uri)
        .filter(|&(u, _)| tenant.sees_upstream(u))
        .ok_or_else(|| Error::UnknownResource(uri.to_string()))?;
    Ok((u, jsonrpc::json_string(original)))
}

/// Classifies an upstream's answer and applies the few rewrites results
/// need (resource URIs in `resources/read`).
pub(crate) fn classify(app: &App, u: UpstreamId, method: Method, message: Bytes) -> (Bytes, Outcome) {
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

/// A forwarded request whose answer streams. It owns the exchange, and
/// finishes it when the answer (or a failure in its place) is relayed.
pub(crate) struct Call {
    pub x: Exchange,
    pub session: Arc<Session>,
    pub upstream: UpstreamId,
    pub method: Method,
    /// The id the upstream knows the request by.
    pub id: Box<RawValue>,
    pub deadline: tokio::time::Instant,
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
        let app = self.x.app();
        let env = match Envelope::parse(&message) {
            Ok(env) => env,
            Err(_) => {
                app.metrics.upstreams.protocol_error(&app.upstreams[self.upstream].name);
                return Step::Skip;
            }
        };
        if matches!(env.kind, MessageKind::Response | MessageKind::Error)
            && env.id.is_some_and(|i| same_id(i, &self.id))
        {
            drop(env);
            let (message, outcome) = classify(app, self.upstream, self.method, message);
            return Step::Done(message, outcome);
        }
        let is_request = env.kind == MessageKind::Request;
        match app.relay_parsed(&self.session, self.upstream, &env, &message) {
            Some(out) => Step::Relay(out, is_request),
            None => Step::Skip,
        }
    }

    fn error_message(&self, err: &Error) -> Bytes {
        jsonrpc::error_response(Some(&self.id), err.code(), &err.to_string(), err.data().as_ref())
    }

    fn timeout(&self) -> Error {
        let upstream = &self.x.app().upstreams[self.upstream];
        Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout }
    }

    fn failed(&self, e: UpstreamError) -> Error {
        Error::upstream(&self.x.app().upstreams[self.upstream].name, e)
    }

    /// Relays the stream into the request's event log until the response,
    /// in the background. The relay goes on if the client disconnects: a
    /// disconnect is not a cancellation, and the client may resume with
    /// `Last-Event-ID`.
    pub fn spawn_relay(self, stream: Box<dyn MessageStream>, log: Arc<Log>) {
        tokio::spawn(self.relay(stream, log));
    }

    async fn relay(mut self, mut stream: Box<dyn MessageStream>, log: Arc<Log>) {
        let (outcome, code) = loop {
            let next = tokio::select! {
                next = stream.next_item() => next,
                () = tokio::time::sleep_until(self.deadline) => {
                    log.push(&self.error_message(&self.timeout()));
                    cancel_upstream(self.x.app(), &self.session, self.upstream, self.id.get(), "timeout");
                    break (Outcome::Timeout, Some(switchboard_protocol::jsonrpc::code::REQUEST_TIMEOUT));
                }
            };
            match next {
                Some(Ok(Item::Message(message))) => match self.step(message) {
                    Step::Done(message, outcome) => {
                        log.push(&message);
                        self.x.add_sent(message.len());
                        let code = if outcome == Outcome::Error { error_code(&message) } else { None };
                        break (outcome, code);
                    }
                    Step::Relay(out, _) => {
                        self.x.add_sent(out.len());
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
                    let e = self.failed(e);
                    log.push(&self.error_message(&e));
                    break (Outcome::UpstreamFailed, Some(e.code()));
                }
                None => {
                    let e = self.failed(UpstreamError::Closed);
                    log.push(&self.error_message(&e));
                    break (Outcome::UpstreamFailed, Some(e.code()));
                }
            }
        };
        log.close();
        self.x.finish(outcome, code);
    }

    /// For a client that takes only JSON: waits for the response; server
    /// requests go to the session's GET stream, notifications are dropped.
    async fn drain(self, mut stream: Box<dyn MessageStream>) -> Response<Body> {
        let result = loop {
            let next = match tokio::time::timeout_at(self.deadline, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    cancel_upstream(self.x.app(), &self.session, self.upstream, self.id.get(), "timeout");
                    break Err((self.timeout(), Outcome::Timeout));
                }
            };
            match next {
                Some(Ok(message)) => match self.step(message) {
                    Step::Done(message, outcome) => break Ok((message, outcome)),
                    Step::Relay(out, is_request) => {
                        if is_request {
                            self.session.push(out);
                        } else {
                            let app = self.x.app();
                            app.metrics
                                .upstreams
                                .relay_dropped(&app.upstreams[self.upstream].name, "client_accepts_json_only");
                        }
                    }
                    Step::Skip => {}
                },
                Some(Err(e)) => break Err((self.failed(e), Outcome::UpstreamFailed)),
                None => break Err((self.failed(UpstreamError::Closed), Outcome::UpstreamFailed)),
            }
        };
        let Call { mut x, id, .. } = self;
        match result {
            Ok((message, outcome)) => {
                x.add_sent(message.len());
                let code = if outcome == Outcome::Error { error_code(&message) } else { None };
                x.finish(outcome, code);
                respond::json(message)
            }
            Err((e, outcome)) => x.fail_as(Some(&id), &e, outcome),
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
