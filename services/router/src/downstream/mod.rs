//! The client-facing Streamable HTTP endpoint (`/mcp`, MCP 2025-03-26,
//! 2025-06-18 and 2025-11-25 with sessions; 2026-07-28 stateless requests
//! take their own path from phase 2 on, in [`modern`]).
//!
//! [`handle`] dispatches on the HTTP method. A POST goes through its phases in
//! this order, each a function of its own:
//!
//! 1. transport checks — `Origin`, `Content-Type`, body size;
//! 2. parse the JSON-RPC envelope (nothing deeper);
//! 3. authenticate — the API key names the tenant ([`crate::tenancy`]);
//! 4. session — `initialize` creates one for the tenant, everything else must
//!    name a live one of the same tenant; `MCP-Protocol-Version` must be
//!    supported;
//! 5. rate limit — requests only, per key, tenant and tool ([`crate::ratelimit`]);
//! 6. route by message kind and method — answered locally (`ping`, lists
//!    filtered to the tenant's catalog, `logging/setLevel`), or resolved to an
//!    upstream the tenant sees and forwarded ([`forward`]), or relayed back
//!    (a client's answer to a server request);
//! 7. record metrics, and audit what reached an upstream or was refused.
//!
//! Errors are values of [`Error`] until [`respond::error`] turns them into a
//! response; this module never builds an error body by hand.

pub(crate) mod forward;
pub mod legacy;
mod lists;
pub mod modern;
pub mod respond;
mod stateless;

use std::sync::Arc;
use std::time::Instant;
use switchboard_core::UpstreamId;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, ORIGIN};
use http::{HeaderMap, HeaderValue, Method as HttpMethod, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::value::RawValue;
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind, Target};
use switchboard_protocol::{Method, ProtocolVersion};

use crate::app::App;
use crate::body::Body;
use crate::config::ResponseMode;
use crate::error::Error;
use switchboard_core::body::CollectError;
use switchboard_core::policy::Principal;
use switchboard_core::Outcome;
use switchboard_db::AuditRecord;
use switchboard_limits::Decision;
use switchboard_protocol::sse::EventId;
use switchboard_session::Session;

pub(crate) static PROTOCOL_VERSION: http::HeaderName = http::HeaderName::from_static("mcp-protocol-version");
static LAST_EVENT_ID: http::HeaderName = http::HeaderName::from_static("last-event-id");

/// Serves one request to `/mcp`.
pub async fn handle(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if *req.method() != HttpMethod::POST && stateless_only(req.headers()) {
        // A 2026-07-28 exchange is POST only: no session to stream or end.
        let mut response = respond::text(StatusCode::METHOD_NOT_ALLOWED, "stateless MCP (2026-07-28) is POST only\n");
        response.headers_mut().insert(http::header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    match *req.method() {
        HttpMethod::POST => post(app, req).await,
        HttpMethod::GET => get(app, req.headers()).await,
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

/// Refuses a request whose body may be partly unread: the connection is
/// closed rather than left for the client to reuse while the server drops it.
fn reject_unread(app: &App, err: Error) -> Response<Body> {
    let mut response = reject(app, None, err);
    response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn post(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let (parts, body) = req.into_parts();

    // 1. Transport checks.
    let body = match receive(app, &parts.headers, body).await {
        Ok(body) => body,
        Err(e) => return reject_unread(app, e),
    };

    // 2. The envelope.
    let env = match Envelope::parse(&body) {
        Ok(env) => env,
        Err(e) => return reject(app, None, Error::Parse(e)),
    };

    // A stateless (2026-07-28) request takes its own path from here.
    if modern::is_modern(&parts.headers, &env) {
        return modern::post(app, &parts.headers, &env, &body, started).await;
    }

    // 3. Who is calling.
    let who = match authenticate(app, &parts.headers) {
        Ok(who) => who,
        Err(e) => return refuse(app, None, &parts.headers, None, Some(&env), body.len(), e, started, "POST"),
    };

    // 4. The session.
    if env.kind == MessageKind::Request && env.method_str() == "initialize" {
        if let Err(e) = admit(app, &who, &env).await {
            return refuse(app, Some(&who), &parts.headers, None, Some(&env), body.len(), e, started, "POST");
        }
        return lists::initialize(app, &who, &env, started).await;
    }
    let session = match session_of(app, &parts.headers, &who).await {
        Ok(session) => session,
        Err(e) => return reject(app, env.id, e),
    };
    if let Err(e) = check_version(&parts.headers) {
        return reject(app, env.id, e);
    }
    session.touch();

    // 5. Rate limits.
    if env.kind == MessageKind::Request {
        if let Err(e) = admit(app, &who, &env).await {
            return refuse(app, Some(&who), &parts.headers, Some(&session), Some(&env), body.len(), e, started, "POST");
        }
    }

    // 6. Route.
    let accepts_sse = accepts_sse(&parts.headers);
    match env.kind {
        MessageKind::Request => {
            let response = request(app, &who, &parts.headers, &session, &env, &body, accepts_sse, started).await;
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
            answer(app, &who, &session, &env, &body).await;
            respond::accepted()
        }
    }
}

/// A request from the client: answered here or forwarded.
#[allow(clippy::too_many_arguments)]
async fn request(
    app: &Arc<App>,
    who: &Principal,
    headers: &HeaderMap,
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
            local(lists::list(app, &who.tenant, kind, id, env.params, b"").await)
        }
        Method::LoggingSetLevel => local(set_level(app, session, env).await),
        Method::ToolsCall
        | Method::PromptsGet
        | Method::ResourcesRead
        | Method::ResourcesSubscribe
        | Method::ResourcesUnsubscribe
        | Method::CompletionComplete => {
            let ledger = match ledger(app, who, headers, Some(session), env, body.len(), method, started) {
                Ok(ledger) => ledger,
                Err(response) => return *response,
            };
            forward::forward(app, who, session, method, env, body, accepts_sse, started, ledger).await
        }
        Method::Initialize => unreachable!("handled before the session phase"),
        _ => {
            app.metrics.request(Method::Other, None).record(Outcome::Rejected, started.elapsed());
            respond::error(Some(id), &Error::MethodNotFound(env.method_str().to_owned()))
        }
    }
}

/// The ledger of a request about to be forwarded: its audit record, and a
/// slot of the tenant's limit on requests in flight (or the response
/// refusing it when none is free).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ledger(
    app: &App,
    who: &Principal,
    headers: &HeaderMap,
    session: Option<&Arc<Session>>,
    env: &Envelope<'_>,
    request_bytes: usize,
    method: Method,
    started: Instant,
) -> Result<forward::Ledger, Box<Response<Body>>> {
    let mut ledger = forward::Ledger {
        draft: app.audit.as_ref().map(|audit| draft(audit, Some(who), headers, session, Some(env), request_bytes)),
        permit: None,
        sink: app.audit.as_ref().map(switchboard_audit::Audit::sink),
        started,
    };
    if let Some(max) = who.tenant.limits.concurrent {
        match app.limiter.enter(&who.tenant.name, max) {
            Some(permit) => ledger.permit = Some(permit),
            None => {
                let e = Error::TooManyInFlight(max);
                app.metrics.limits.rate_limited(&who.tenant.name, "concurrent");
                ledger.close(app, None, Outcome::Rejected, Some(e.code()), 0, started);
                app.metrics.request(method, None).record(Outcome::Rejected, started.elapsed());
                return Err(Box::new(respond::error(env.id, &e)));
            }
        }
    }
    Ok(ledger)
}

/// A GET or DELETE that names no session and says 2026-07-28 or later.
fn stateless_only(headers: &HeaderMap) -> bool {
    !headers.contains_key(&respond::SESSION_ID)
        && headers
            .get(&PROTOCOL_VERSION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| ProtocolVersion::parse(v.trim()))
            .is_some_and(ProtocolVersion::is_modern)
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
    // Stateless upstreams get the level with each request (`_meta`).
    session.set_log_level(&level);
    let targets: Vec<UpstreamId> = app
        .upstreams
        .ids()
        .filter(|&u| !app.catalog.is_stateless_only(u) && app.catalog.handshake(u).is_some_and(|h| h.has("logging")))
        .collect();
    let sends = targets.into_iter().map(|u| {
        let session = session.clone();
        let params = params.get().as_bytes().to_vec();
        async move {
            let upstream = &app.upstreams[u];
            let (out, request_id) = switchboard_upstream::Outgoing::own("logging/setLevel", &params, "set-level");
            let result = async {
                let channel = session.channel(u).await?;
                let reply = tokio::time::timeout(upstream.config.timeout, channel.request(out))
                    .await
                    .map_err(|_| Error::UpstreamTimeout {
                        upstream: upstream.name.clone(),
                        after: upstream.config.timeout,
                    })?
                    .map_err(|e| Error::upstream(&upstream.name, e))?;
                switchboard_upstream::collect_response(reply, &request_id)
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
            let here = cancel_here(app, session, env, body).await;
            // If not here, perhaps another replica serves the request.
            if let Some(shared) = app.sessions.shared_streams().filter(|_| !here && session.stored) {
                shared.broadcast_cancel(&session.id, body).await;
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

/// Passes a client's cancellation upstream if the request is in flight
/// here; `false` if it is not.
pub(crate) async fn cancel_here(app: &App, session: &Session, env: &Envelope<'_>, body: &Bytes) -> bool {
    let request_id = env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.request_id);
    let Some(u) = request_id.and_then(|id| session.inflight_upstream(id)) else { return false };
    if let Some(channel) = session.open_channel(u) {
        if let Err(e) = channel.send(body.clone()).await {
            tracing::debug!(upstream = %app.upstreams[u].name, error = %e, "cancellation not delivered");
        }
    }
    true
}

/// The client's answer to a request an upstream sent it.
async fn answer(app: &Arc<App>, who: &Principal, session: &Arc<Session>, env: &Envelope<'_>, body: &Bytes) {
    let Some(id) = env.id else { return };
    let Some((u, their_id)) = session.answered(id).filter(|(u, _)| who.tenant.sees_upstream(*u)) else {
        // An input request of a stateless upstream: awaited here, or at
        // another replica.
        if let Some(ours) = jsonrpc::as_str(id).filter(|i| i.starts_with("m.")) {
            if !app.deliver_answer(&session.id, &ours, body.clone()) {
                if let Some(shared) = app.sessions.shared_streams().filter(|_| session.stored) {
                    shared.broadcast_cancel(&session.id, body).await;
                }
            }
            return;
        }
        app.metrics.upstreams.relay_dropped("", "unknown_answer");
        tracing::debug!(id = id.get(), "client answered a request the router does not know");
        return;
    };
    let restored = switchboard_protocol::rewrite::splice(
        body,
        &mut [switchboard_protocol::rewrite::Edit::new(jsonrpc::span(body, id.get()), their_id.as_bytes())],
    );
    // The request may have come through another replica: the channel
    // continues the same upstream session, whichever replica opened it. An
    // answer never opens an upstream session (no request of one awaits it).
    let Some(channel) = session.existing_channel(u).await else {
        app.metrics.upstreams.relay_dropped(&app.upstreams[u].name, "unknown_answer");
        tracing::debug!(id = id.get(), "client answered for an upstream session this session does not have");
        return;
    };
    if let Err(e) = channel.send(restored).await {
        tracing::warn!(upstream = %app.upstreams[u].name, error = %e, "answer to a server request not delivered");
    }
}

/// GET: the session's stream of messages not tied to a request.
async fn get(app: &Arc<App>, headers: &HeaderMap) -> Response<Body> {
    let started = Instant::now();
    if let Err(e) = check_origin(app, headers) {
        return reject(app, None, e);
    }
    let who = match authenticate(app, headers) {
        Ok(who) => who,
        Err(e) => return refuse(app, None, headers, None, None, 0, e, started, "GET /mcp"),
    };
    let session = match session_of(app, headers, &who).await {
        Ok(session) => session,
        Err(e) => return reject(app, None, e),
    };
    if let Err(e) = check_version(headers) {
        return reject(app, None, e);
    }
    let resume = headers.get(&LAST_EVENT_ID).and_then(|v| v.to_str().ok()).and_then(EventId::parse);
    // While draining, answers in flight may still be resumed; nothing new starts.
    if app.shutting_down() && resume.is_none_or(|id| id.stream == 0) {
        return reject(app, None, Error::ShuttingDown);
    }
    session.touch();
    match session.open_get(resume).await {
        Ok(rx) => respond::sse(rx, app.config.server.keep_alive),
        Err(e) => reject(app, None, e.into()),
    }
}

/// DELETE: ends the session and its upstream sessions.
async fn delete(app: &Arc<App>, headers: &HeaderMap) -> Response<Body> {
    if let Err(e) = check_origin(app, headers) {
        return reject(app, None, e);
    }
    let who = match authenticate(app, headers) {
        Ok(who) => who,
        Err(e) => return refuse(app, None, headers, None, None, 0, e, Instant::now(), "DELETE /mcp"),
    };
    // Checks the session exists and is this tenant's (loading it if another
    // replica created it).
    let session = match session_of(app, headers, &who).await {
        Ok(session) => session,
        Err(e) => return reject(app, None, e),
    };
    // Ended everywhere, or (the store unreachable) nowhere: the client retries.
    if let Err(e) = app.sessions.delete(&session).await {
        return reject(app, None, e.into());
    }
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::OK;
    response
}

/// The session a request names, if it is `who`'s tenant's. Another tenant's
/// session is reported exactly like one that does not exist.
pub(crate) async fn session_of(app: &App, headers: &HeaderMap, who: &Principal) -> Result<Arc<Session>, Error> {
    let id = headers.get(&respond::SESSION_ID).ok_or(Error::MissingSession)?;
    let id = id.to_str().map_err(|_| Error::UnknownSession)?;
    // `t.…` names a tenant's shared session (stateless clients'): never a client's.
    if id.is_empty() || id.len() > 128 || id.starts_with(switchboard_session::TENANT_PREFIX) {
        return Err(Error::UnknownSession);
    }
    let session = app.sessions.find(id).await?.ok_or(Error::UnknownSession)?;
    if session.tenant != who.tenant.name {
        app.directory.metrics().auth_failed("wrong_tenant");
        return Err(Error::UnknownSession);
    }
    Ok(session)
}

/// Phase 3: the caller, from its API key (or the open tenant when
/// `auth.mode = "none"`).
pub(crate) fn authenticate(app: &App, headers: &HeaderMap) -> Result<Principal, Error> {
    app.directory.authenticate(headers, switchboard_core::time::now_ms()).map_err(Error::Unauthenticated)
}

/// Phase 5: the rate limits of a request (key, tenant, and the tool for `tools/call`).
pub(crate) async fn admit(app: &App, who: &Principal, env: &Envelope<'_>) -> Result<(), Error> {
    let limits = &who.tenant.limits;
    if limits.key.is_none() && limits.tenant.is_none() && limits.tool.is_none() {
        return Ok(());
    }
    let tool = match (limits.tool.is_some() && env.method_str() == "tools/call", env.params) {
        (true, Some(params)) => Target::parse(params).ok().and_then(|t| t.name).and_then(jsonrpc::as_str),
        _ => None,
    };
    let checks = switchboard_limits::checks(who, tool.as_deref());
    match app.limiter.check(&checks).await {
        Decision::Allow => Ok(()),
        Decision::Deny { limit, retry_after } => {
            app.metrics.limits.rate_limited(&who.tenant.name, limit);
            Err(Error::RateLimited { limit, retry_after })
        }
    }
}

/// A request refused by authentication or a limit: counted, audited, answered.
#[allow(clippy::too_many_arguments)]
pub(crate) fn refuse(
    app: &App,
    who: Option<&Principal>,
    headers: &HeaderMap,
    session: Option<&Arc<Session>>,
    env: Option<&Envelope<'_>>,
    request_bytes: usize,
    err: Error,
    started: Instant,
    http: &'static str,
) -> Response<Body> {
    app.metrics.rejected(err.label());
    let id = env.and_then(|e| e.id);
    let response = respond::error(id, &err);
    if let Some(audit) = &app.audit {
        let mut record = draft(audit, who, headers, session, env, request_bytes);
        if env.is_none() {
            // Not a JSON-RPC message: name the HTTP request instead.
            record.method = http.to_owned();
        }
        record.outcome = "refused".into();
        record.error_code = Some(err.code());
        record.latency_us = started.elapsed().as_micros() as i64;
        audit.record(record);
    }
    response
}

/// The audit record of a request, before its outcome is known.
pub(crate) fn draft(
    audit: &switchboard_audit::Audit,
    who: Option<&Principal>,
    headers: &HeaderMap,
    session: Option<&Arc<Session>>,
    env: Option<&Envelope<'_>>,
    request_bytes: usize,
) -> AuditRecord {
    let target = env
        .and_then(|e| e.params)
        .and_then(|p| Target::parse(p).ok())
        .and_then(|t| t.name.or(t.uri).or_else(|| t.reference.as_ref().and_then(|r| r.name.or(r.uri))));
    let arguments = match (who, env) {
        (Some(who), Some(env)) if who.tenant.audit_arguments => env.params.and_then(|p| {
            #[derive(Deserialize)]
            struct Args<'a> {
                #[serde(borrow)]
                arguments: Option<&'a RawValue>,
            }
            serde_json::from_str::<Args<'_>>(p.get()).ok().and_then(|a| a.arguments).map(|a| a.get().to_owned())
        }),
        _ => None,
    };
    let key_prefix = match who {
        Some(who) if !who.key_prefix.is_empty() => Some(who.key_prefix.to_string()),
        Some(_) => None,
        // An unknown key: keep its prefix only if it has our format (never
        // part of some other secret).
        None => switchboard_tenancy::presented_key(headers)
            .filter(|k| k.len() == 43 && k.starts_with("sb_"))
            .map(|k| k[..switchboard_tenancy::PREFIX_LEN].to_owned()),
    };
    AuditRecord {
        id: audit.new_id(),
        at_ms: switchboard_core::time::now_ms(),
        tenant: who.map(|w| w.tenant.name.to_string()),
        key_prefix,
        session: session.map(|s| s.id.to_string()),
        method: env.map_or_else(String::new, |e| e.method_str().to_owned()),
        target: target.and_then(jsonrpc::as_str).map(|t| t.into_owned()),
        upstream: None,
        outcome: String::new(),
        error_code: None,
        latency_us: 0,
        request_bytes: request_bytes as i64,
        response_bytes: 0,
        trace_id: trace_id(headers),
        arguments,
    }
}

/// The trace id of a W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`).
fn trace_id(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    let mut parts = value.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit()) && trace != "0".repeat(32))
        .then(|| trace.to_ascii_lowercase())
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
    match switchboard_core::body::collect(body, limit).await {
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
