//! The client-facing Streamable HTTP endpoint (`/mcp`, MCP 2025-03-26,
//! 2025-06-18 and 2025-11-25).
//!
//! [`handle`] dispatches on the HTTP method. A POST goes through its phases in
//! this order, each a function of its own:
//!
//! 1. transport checks — `Origin`, `Content-Type`, body size;
//! 2. parse the JSON-RPC envelope (nothing deeper);
//! 3. session — `initialize` creates one, everything else must name a live one;
//!    `MCP-Protocol-Version` must be supported;
//! 4. route by message kind and method — answered locally (`ping`, lists,
//!    `logging/setLevel`), or resolved to an upstream and forwarded
//!    ([`forward`]), or relayed back (a client's answer to a server request);
//! 5. record metrics.
//!
//! Authentication, tenancy and rate limiting slot in between 2 and 3.
//!
//! Errors are values of [`Error`] until [`respond::error`] turns them into a
//! response; this module never builds an error body by hand.

mod forward;
pub mod legacy;
mod lists;
pub mod respond;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, ORIGIN};
use http::{HeaderMap, HeaderValue, Method as HttpMethod, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::value::RawValue;
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind, Target};
use switchboard_protocol::{Method, ProtocolVersion};

use crate::app::App;
use crate::body::{Body, CollectError};
use crate::config::ResponseMode;
use crate::error::Error;
use crate::events;
use crate::metrics::Outcome;
use crate::session::Session;

static PROTOCOL_VERSION: http::HeaderName = http::HeaderName::from_static("mcp-protocol-version");
static LAST_EVENT_ID: http::HeaderName = http::HeaderName::from_static("last-event-id");

/// Serves one request to `/mcp`.
pub async fn handle(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    match *req.method() {
        HttpMethod::POST => post(app, req).await,
        HttpMethod::GET => get(app, req.headers()),
        HttpMethod::DELETE => delete(app, req.headers()).await,
        _ => {
            let mut response = respond::text(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE\n");
            response.headers_mut().insert(http::header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            response
        }
    }
}

/// Refuses a request before it reaches the MCP layer, and counts it.
fn reject(app: &App, id: Option<&RawValue>, err: Error) -> Response<Body> {
    app.metrics.rejected(err.label());
    respond::error(id, &err)
}

async fn post(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let (parts, body) = req.into_parts();

    // 1. Transport checks.
    let body = match receive(app, &parts.headers, body).await {
        Ok(body) => body,
        Err(e) => return reject(app, None, e),
    };

    // 2. The envelope.
    let env = match Envelope::parse(&body) {
        Ok(env) => env,
        Err(e) => return reject(app, None, Error::Parse(e)),
    };

    // 3. The session.
    if env.kind == MessageKind::Request && env.method_str() == "initialize" {
        return lists::initialize(app, &env, started).await;
    }
    let session = match session_of(app, &parts.headers) {
        Ok(session) => session,
        Err(e) => return reject(app, env.id, e),
    };
    if let Err(e) = check_version(&parts.headers) {
        return reject(app, env.id, e);
    }
    session.touch();

    // 4. Route.
    let accepts_sse = accepts_sse(&parts.headers);
    match env.kind {
        MessageKind::Request => {
            let response = request(app, &session, &env, &body, accepts_sse, started).await;
            if accepts_sse && app.config.server.response_mode == ResponseMode::Sse {
                respond::as_sse(response)
            } else {
                response
            }
        }
        MessageKind::Notification => {
            notification(app, &session, &env, &body).await;
            respond::accepted()
        }
        MessageKind::Response | MessageKind::Error => {
            answer(app, &session, &env, &body).await;
            respond::accepted()
        }
    }
}

/// A request from the client: answered here or forwarded.
async fn request(
    app: &Arc<App>,
    session: &Arc<Session>,
    env: &Envelope<'_>,
    body: &Bytes,
    accepts_sse: bool,
    started: Instant,
) -> Response<Body> {
    let method = Method::from_name(env.method_str());
    let id = env.id.expect("a request has an id");
    let local = |result: Result<Response<Body>, Error>| {
        let outcome = if result.is_ok() { Outcome::Ok } else { Outcome::Rejected };
        app.metrics.request(method, None).record(outcome, started.elapsed());
        result.unwrap_or_else(|e| respond::error(Some(id), &e))
    };
    match method {
        Method::Ping => local(Ok(respond::json(jsonrpc::result_response(id, b"{}")))),
        Method::ToolsList | Method::PromptsList | Method::ResourcesList | Method::ResourcesTemplatesList => {
            let kind = lists::kind_of(method);
            local(lists::list(app, kind, id, env.params).await)
        }
        Method::LoggingSetLevel => local(set_level(app, session, env).await),
        Method::ToolsCall
        | Method::PromptsGet
        | Method::ResourcesRead
        | Method::ResourcesSubscribe
        | Method::ResourcesUnsubscribe
        | Method::CompletionComplete => forward::forward(app, session, method, env, body, accepts_sse, started).await,
        Method::Initialize => unreachable!("handled before the session phase"),
        _ => {
            app.metrics.request(Method::Other, None).record(Outcome::Rejected, started.elapsed());
            respond::error(Some(id), &Error::MethodNotFound(env.method_str().to_owned()))
        }
    }
}

/// `logging/setLevel`: passed to every upstream that does logging.
async fn set_level(app: &Arc<App>, session: &Arc<Session>, env: &Envelope<'_>) -> Result<Response<Body>, Error> {
    let id = env.id.expect("a request has an id");
    let params = env.params.ok_or_else(|| Error::InvalidParams("logging/setLevel needs params.level".into()))?;
    #[derive(Deserialize)]
    struct Level<'a> {
        #[serde(borrow)]
        level: std::borrow::Cow<'a, str>,
    }
    let level = serde_json::from_str::<Level<'_>>(params.get())
        .map_err(|e| Error::InvalidParams(format!("logging/setLevel: {e}")))?
        .level;
    const LEVELS: [&str; 8] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];
    if !LEVELS.contains(&&*level) {
        return Err(Error::InvalidParams(format!("unknown log level {level:?}; use one of {}", LEVELS.join(", "))));
    }
    let targets: Vec<usize> =
        (0..app.upstreams.len()).filter(|&u| app.catalog.handshake(u).is_some_and(|h| h.has("logging"))).collect();
    let sends = targets.into_iter().map(|u| {
        let session = session.clone();
        let params = params.get().as_bytes().to_vec();
        async move {
            let upstream = &app.upstreams[u];
            let (out, request_id) = crate::upstream::Outgoing::own("logging/setLevel", &params, "set-level");
            let result = async {
                let channel = session.channel(app, u).await?;
                let reply = tokio::time::timeout(upstream.config.timeout, channel.request(out))
                    .await
                    .map_err(|_| Error::UpstreamTimeout {
                        upstream: upstream.name.clone(),
                        after: upstream.config.timeout,
                    })?
                    .map_err(|e| Error::upstream(&upstream.name, e))?;
                crate::upstream::collect_response(reply, &request_id)
                    .await
                    .map_err(|e| Error::upstream(&upstream.name, e))
            }
            .await;
            if let Err(e) = result {
                tracing::warn!(upstream = %upstream.name, error = %e, "logging/setLevel not passed on");
            }
        }
    });
    futures_util::future::join_all(sends).await;
    Ok(respond::json(jsonrpc::result_response(id, b"{}")))
}

/// A notification from the client.
async fn notification(app: &Arc<App>, session: &Arc<Session>, env: &Envelope<'_>, body: &Bytes) {
    match Method::from_name(env.method_str()) {
        Method::Cancelled => {
            let request_id = env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.request_id);
            let Some(u) = request_id.and_then(|id| session.inflight_upstream(id)) else { return };
            if let Some(channel) = session.open_channel(u) {
                if let Err(e) = channel.send(body.clone()).await {
                    tracing::debug!(upstream = %app.upstreams[u].name, error = %e, "cancellation not delivered");
                }
            }
        }
        Method::RootsListChanged => {
            for (u, channel) in session.open_channels() {
                if let Err(e) = channel.send(body.clone()).await {
                    tracing::debug!(upstream = %app.upstreams[u].name, error = %e, "roots/list_changed not delivered");
                }
            }
        }
        // `initialized` and anything else: nothing to pass on.
        _ => {}
    }
}

/// The client's answer to a request an upstream sent it.
async fn answer(app: &Arc<App>, session: &Arc<Session>, env: &Envelope<'_>, body: &Bytes) {
    let Some(id) = env.id else { return };
    let Some((u, their_id)) = session.answered(id) else {
        app.metrics.relay_dropped("", "unknown_answer");
        tracing::debug!(id = id.get(), "client answered a request the router does not know");
        return;
    };
    let restored = switchboard_protocol::rewrite::splice(
        body,
        &mut [switchboard_protocol::rewrite::Edit::new(jsonrpc::span(body, id.get()), their_id.as_bytes())],
    );
    if let Some(channel) = session.open_channel(u) {
        if let Err(e) = channel.send(restored).await {
            tracing::warn!(upstream = %app.upstreams[u].name, error = %e, "answer to a server request not delivered");
        }
    }
}

/// GET: the session's stream of messages not tied to a request.
fn get(app: &Arc<App>, headers: &HeaderMap) -> Response<Body> {
    let session = match check_origin(app, headers).and_then(|()| session_of(app, headers)) {
        Ok(session) => session,
        Err(e) => return reject(app, None, e),
    };
    if let Err(e) = check_version(headers) {
        return reject(app, None, e);
    }
    let resume = headers.get(&LAST_EVENT_ID).and_then(|v| v.to_str().ok()).and_then(events::parse_event_id);
    // While draining, answers in flight may still be resumed; nothing new starts.
    if app.shutting_down() && resume.is_none_or(|(stream, _)| stream == 0) {
        return reject(app, None, Error::ShuttingDown);
    }
    session.touch();
    match session.open_stream(resume) {
        Ok(rx) => respond::sse(rx, app.config.server.keep_alive),
        Err(e) => reject(app, None, e),
    }
}

/// DELETE: ends the session and its upstream sessions.
async fn delete(app: &Arc<App>, headers: &HeaderMap) -> Response<Body> {
    if let Err(e) = check_origin(app, headers) {
        return reject(app, None, e);
    }
    let id = match headers.get(&respond::SESSION_ID).and_then(|v| v.to_str().ok()) {
        Some(id) => id,
        None => return reject(app, None, Error::MissingSession),
    };
    match app.sessions.remove(id) {
        Some(session) => {
            app.metrics.set_sessions(app.sessions.len());
            session.close().await;
            let mut response = Response::new(Body::Empty);
            *response.status_mut() = StatusCode::OK;
            response
        }
        None => reject(app, None, Error::UnknownSession),
    }
}

fn session_of(app: &App, headers: &HeaderMap) -> Result<Arc<Session>, Error> {
    let id = headers.get(&respond::SESSION_ID).ok_or(Error::MissingSession)?;
    let id = id.to_str().map_err(|_| Error::UnknownSession)?;
    app.sessions.get(id).ok_or(Error::UnknownSession)
}

/// Browsers send `Origin`; a page on another site must not reach a local router.
fn check_origin(app: &App, headers: &HeaderMap) -> Result<(), Error> {
    let Some(origin) = headers.get(ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().unwrap_or("");
    if app.config.server.allowed_origins.iter().any(|p| p.matches(origin)) {
        Ok(())
    } else {
        Err(Error::ForbiddenOrigin(origin.to_owned()))
    }
}

/// `application/json` (with any parameters), or no `Content-Type` at all.
fn check_content_type(headers: &HeaderMap) -> Result<(), Error> {
    let Some(ct) = headers.get(CONTENT_TYPE) else { return Ok(()) };
    let text = ct.to_str().unwrap_or("");
    let essence = text.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(Error::UnsupportedMediaType(text.to_owned()))
    }
}

/// `MCP-Protocol-Version`, when sent, must be one we speak on this endpoint.
fn check_version(headers: &HeaderMap) -> Result<(), Error> {
    let Some(v) = headers.get(&PROTOCOL_VERSION) else { return Ok(()) };
    let text = v.to_str().unwrap_or("");
    match ProtocolVersion::parse(text) {
        Some(v) if v.is_streamable_http() => Ok(()),
        _ => Err(Error::UnsupportedVersion(text.to_owned())),
    }
}

/// Whether the client can take an SSE answer. Lenient: a missing `Accept`
/// or a wildcard counts as yes; only an explicit list without
/// `text/event-stream` means JSON only.
fn accepts_sse(headers: &HeaderMap) -> bool {
    let mut any = false;
    for value in headers.get_all(http::header::ACCEPT) {
        any = true;
        let Ok(text) = value.to_str() else { continue };
        for item in text.split(',') {
            let essence = item.split(';').next().unwrap_or("").trim();
            if essence.eq_ignore_ascii_case("text/event-stream")
                || essence == "*/*"
                || essence.eq_ignore_ascii_case("text/*")
            {
                return true;
            }
        }
    }
    !any
}

/// The transport checks of a POST (`Origin`, `Content-Type`, size), then its body.
async fn receive(app: &App, headers: &HeaderMap, body: Incoming) -> Result<Bytes, Error> {
    check_origin(app, headers)?;
    check_content_type(headers)?;
    read_body(app, headers, body).await
}

async fn read_body(app: &App, headers: &HeaderMap, body: Incoming) -> Result<Bytes, Error> {
    let limit = app.config.server.max_body_bytes;
    let declared = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Error::BodyTooLarge { limit });
    }
    match crate::body::collect(body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(CollectError::TooLarge) => Err(Error::BodyTooLarge { limit }),
        Err(CollectError::Read(e)) => {
            Err(Error::Parse(jsonrpc::ParseError::Syntax(format!("could not read the body: {e}"))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn accept_is_lenient() {
        assert!(accepts_sse(&headers(&[])));
        assert!(accepts_sse(&headers(&[("accept", "application/json, text/event-stream")])));
        assert!(accepts_sse(&headers(&[("accept", "*/*")])));
        assert!(!accepts_sse(&headers(&[("accept", "application/json")])));
        assert!(accepts_sse(&headers(&[("accept", "application/json"), ("accept", "text/event-stream;q=0.5")])));
    }

    #[test]
    fn content_type_and_version() {
        assert!(check_content_type(&headers(&[("content-type", "application/json; charset=utf-8")])).is_ok());
        assert!(check_content_type(&headers(&[])).is_ok());
        assert!(matches!(
            check_content_type(&headers(&[("content-type", "text/plain")])),
            Err(Error::UnsupportedMediaType(_))
        ));
        assert!(check_version(&headers(&[("mcp-protocol-version", "2025-06-18")])).is_ok());
        assert!(check_version(&headers(&[("mcp-protocol-version", "2024-11-05")])).is_err());
        assert!(check_version(&headers(&[("mcp-protocol-version", "1999-01-01")])).is_err());
    }
}
