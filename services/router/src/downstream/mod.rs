//! The client-facing endpoints: Streamable HTTP at `/mcp` (sessions, MCP
//! 2025-03-26 to 2025-11-25, and stateless 2026-07-28 requests, decided per
//! request), and legacy HTTP+SSE at `/sse` and `/messages` (2024-11-05).
//!
//! Every request goes through the same phases, in this order, each a step
//! of its own ([`Exchange`] carries what they learn):
//!
//! 1. transport checks — `Origin`, `Content-Type`, body size ([`transport`]);
//! 2. parse the JSON-RPC envelope (nothing deeper);
//! 3. authenticate — the caller's credentials name the tenant;
//! 4. session — `initialize` creates one, everything else must name a live
//!    one of the same tenant (a stateless request has none: [`stateless_client`]);
//! 5. admit — rate limits, for requests;
//! 6. resolve — answered here (`ping`, lists, `logging/setLevel`), or the
//!    tool, prompt or resource resolved to its upstream or tool source;
//! 7. forward — by the upstream's era ([`forward`], [`stateless_upstream`]);
//! 8. finish — metrics and the audit record, once, however it ends.
//!
//! Errors are values of [`Error`] until [`respond::error`] turns them into a
//! response; this module never builds an error body by hand.

pub mod authorize;
pub mod forward;
pub mod legacy;
mod lists;
mod origin;
mod resolve;
pub mod respond;
pub mod stateless_client;
mod stateless_upstream;
pub(crate) mod takeover;
pub mod transport;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method as HttpMethod, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use switchboard_core::policy::Principal;
use switchboard_core::UpstreamId;
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind};
use switchboard_protocol::sse::EventId;
use switchboard_protocol::{Method, ProtocolVersion};
use switchboard_session::Session;

use self::transport::{accepts_sse, check_origin, check_version};
use crate::app::App;
use crate::body::Body;
use crate::config::ResponseMode;
use crate::error::Error;
use crate::exchange::{Exchange, Refusal};
use crate::headers::{Header, Headers};

/// Serves one request to `/mcp`.
pub async fn handle(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if *req.method() != HttpMethod::POST && stateless_only(req.headers().into()) {
        // A 2026-07-28 exchange is POST only: no session to stream or end.
        let mut response = respond::text(StatusCode::METHOD_NOT_ALLOWED, "stateless MCP (2026-07-28) is POST only\n");
        response.headers_mut().insert(http::header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    match *req.method() {
        HttpMethod::POST => post(app, req).await,
        // Boxed (as every branch off the hot POST): the request's future
        // stays small, and hyper moves it whole (see `future_sizes`).
        HttpMethod::GET => Box::pin(get(app, req.headers().into(), req.extensions())).await,
        HttpMethod::DELETE => Box::pin(delete(app, req.headers().into(), req.extensions())).await,
        _ => {
            let mut response = respond::text(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE\n");
            response.headers_mut().insert(http::header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            response
        }
    }
}

/// A GET or DELETE that names no session and says 2026-07-28 or later.
fn stateless_only(headers: Headers<'_>) -> bool {
    !headers.contains(Header::McpSessionId)
        && headers
            .text(Header::McpProtocolVersion)
            .and_then(Result::ok)
            .and_then(|v| ProtocolVersion::parse(v.trim()))
            .is_some_and(ProtocolVersion::is_modern)
}

/// A POST to `/mcp`.
async fn post(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let mut x = Exchange::new(app, Instant::now(), &parts.extensions);
    x.set_http_version(parts.version);
    let body = transport::PostBody::incoming(body, &parts.headers);
    post_phases(x, Headers::Map(&parts.headers), body, &parts.extensions).await.unwrap_or_else(|refusal| *refusal)
}

/// A POST to `/mcp` over HTTP/1.1 whose body was read already, at
/// `started`, over a connection with these extensions; its output, a
/// refusal or not, is what to answer ([`refused_or`]).
///
/// The phases' own future, not one around it: each async level a future
/// sits in is one more copy of it, whole, when awaited (6 KB here).
pub fn post_read<'a>(
    app: &'a Arc<App>,
    started: Instant,
    headers: &'a crate::headers::Head,
    body: Bytes,
    connection: &'a http::Extensions,
) -> impl std::future::Future<Output = Result<Response<Body>, Refusal>> + Send + 'a {
    let x = Exchange::new(app, started, connection);
    post_phases(x, Headers::Head(headers), transport::PostBody::Read(body), connection)
}

/// What to answer, when `phases` refused to send or not.
pub fn refused_or(phases: Result<Response<Body>, Refusal>) -> Response<Body> {
    phases.unwrap_or_else(|refusal| *refusal)
}

/// The phases of a POST to `/mcp`, in order; `Err` is a refusal to send.
///
/// This and the phases it awaits on the way to an upstream are functions
/// returning an async block, not async fns: an async fn holds its arguments
/// twice in its future (the `Exchange` alone is 336 bytes), and every level
/// is copied whole when awaited (see `future_sizes`).
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
fn post_phases<'a>(
    mut x: Exchange,
    headers: Headers<'a>,
    body: transport::PostBody,
    connection: &'a http::Extensions,
) -> impl std::future::Future<Output = Result<Response<Body>, Refusal>> + 'a {
    async move {
        // 1. Transport checks.
        let body = x.receive(headers, body).await?;
        // 2. The envelope (and the request's trace, when traces are on).
        let env = x.parse(headers, &body, Some(connection))?;
        // Progressive discovery's call meta-tool: the call of the tool it names
        // from here on (a stateless request's, once its headers are checked).
        let stateless = stateless_client::is_stateless(headers, &env);
        let inner = if stateless {
            None
        } else {
            let separator = &x.app().config.catalog.separator;
            crate::tools::meta::unwrap_call(&env, &body, separator).map_err(|e| Box::new(x.reject(env.id, e)))?
        };
        let unwrapped: Bytes;
        let (env, body) = match inner {
            None => (env, &body),
            Some(inner) => {
                unwrapped = inner;
                let env = Envelope::parse(&unwrapped).map_err(|e| Box::new(x.reject(None, Error::Parse(e))))?;
                x.set_unwrapped();
                (env, &unwrapped)
            }
        };
        // The rest, its log lines naming the request's trace (a span that
        // is none when untraced: entering it does nothing). One call, one
        // future: each place a phase's future is made is one more copy of
        // it, whole, into this one's.
        use tracing::Instrument;
        let logs = x.log_span();
        after_parse(x, headers, env, body, stateless).instrument(logs).await
    }
}

/// The phases after the envelope's; `stateless`: the request is a
/// stateless one ([`stateless_client::is_stateless`], asked once).
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
fn after_parse<'a>(
    mut x: Exchange,
    headers: Headers<'a>,
    env: Envelope<'a>,
    body: &'a Bytes,
    stateless: bool,
) -> impl std::future::Future<Output = Result<Response<Body>, Refusal>> + 'a {
    async move {
        // A stateless (2026-07-28) request takes its own session phase.
        if stateless {
            return Ok(Box::pin(stateless_client::post(x, headers, &env, body)).await);
        }
        // 3. Who is calling.
        x.authenticate(headers).await.map_err(|e| x.refuse(headers, Some(&env), body.len(), e, "POST"))?;
        // 4. The session: `initialize` makes one; anything else names one.
        if env.kind == MessageKind::Request && env.method_str() == "initialize" {
            x.admit(&env).await.map_err(|e| x.refuse(headers, Some(&env), body.len(), e, "POST"))?;
            return Ok(Box::pin(lists::initialize(x, &env)).await);
        }
        let session = x.find_session(headers).await.map_err(|e| x.reject(env.id, e))?;
        check_version(headers).map_err(|e| x.reject(env.id, e))?;
        session.touch_at(x.started());
        // 5. Admission, then 6–8 by what the message is.
        match env.kind {
            MessageKind::Request => {
                x.admit(&env).await.map_err(|e| x.refuse(headers, Some(&env), body.len(), e, "POST"))?;
                let accepts_sse = accepts_sse(headers);
                let sse = accepts_sse && x.app().config.server.response_mode == ResponseMode::Sse;
                let response = request(x, headers, &session, &env, body, accepts_sse).await;
                Ok(if sse { respond::as_sse(response) } else { response })
            }
            MessageKind::Notification => {
                let app = x.app().clone();
                x.discard();
                Box::pin(notification(&app, &session, &env, body)).await;
                Ok(respond::accepted())
            }
            MessageKind::Response | MessageKind::Error => {
                let (app, who) = (x.app().clone(), x.principal().expect("authenticated").clone());
                match Box::pin(answer(&app, &who, &session, &env, body)).await {
                    Ok(()) => {
                        x.discard();
                        Ok(respond::accepted())
                    }
                    Err(e) => Err(Box::new(x.reject(None, e))),
                }
            }
        }
    }
}

/// A session's request: answered here, or resolved and forwarded.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
pub(crate) fn request<'a, 'e>(
    mut x: Exchange,
    headers: Headers<'a>,
    session: &'a Arc<Session>,
    env: &'a Envelope<'e>,
    body: &'a Bytes,
    accepts_sse: bool,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'e> {
    async move {
        let method = Method::from_name(env.method_str());
        x.set_method(method);
        let id = env.id.expect("a request has an id");
        match method {
            Method::Ping => x.answer(id, Ok(respond::json(jsonrpc::result_response(id, b"{}")))),
            Method::ToolsList | Method::PromptsList | Method::ResourcesList | Method::ResourcesTemplatesList => {
                let who = x.principal().expect("authenticated").clone();
                let result = lists::list(x.app(), &who, lists::kind_of(method), id, env.params, b"").await;
                x.answer(id, result)
            }
            Method::LoggingSetLevel => {
                let result = set_level(x.app(), session, env).await;
                x.answer(id, result)
            }
            Method::ToolsCall
            | Method::PromptsGet
            | Method::ResourcesRead
            | Method::ResourcesSubscribe
            | Method::ResourcesUnsubscribe
            | Method::CompletionComplete => {
                if let Err(e) = x.open_books(headers, env, body.len()) {
                    return x.refuse(headers, Some(env), body.len(), e, "POST");
                }
                if method == Method::ToolsCall && may_be_meta_tool(&x) {
                    x = match Box::pin(meta_tool(x, Some(&session.id), env)).await {
                        Ok(answered) => return answered,
                        Err(x) => x,
                    };
                }
                forward::forward(x, session, method, env, body, accepts_sse).await
            }
            Method::Initialize => unreachable!("handled before the session phase"),
            _ => {
                x.set_method(Method::Other);
                x.fail_as(
                    Some(id),
                    &Error::MethodNotFound(env.method_str().to_owned()),
                    switchboard_core::Outcome::Rejected,
                )
            }
        }
    }
}

/// Whether a `tools/call` may be one of progressive discovery's meta-tools
/// ([`meta_tool`]): its tenant discovers progressively, or the call was
/// unwrapped from the call meta-tool. Asked before [`meta_tool`] is called,
/// so that the common call neither moves its exchange (336 bytes) in and
/// out of it nor holds its future.
pub(crate) fn may_be_meta_tool(x: &Exchange) -> bool {
    x.unwrapped()
        || x.principal().is_some_and(|w| w.tenant.discovery == switchboard_core::policy::Discovery::Progressive)
}

/// A `tools/call` of progressive discovery's meta-tools: search and describe
/// answered here; a call unwrapped from the call meta-tool checked (only a
/// progressive tenant has the meta-tools) and counted, then forwarded as
/// any call (`Err`: the exchange, to go on with).
pub(crate) async fn meta_tool(
    x: Exchange,
    session: Option<&str>,
    env: &Envelope<'_>,
) -> Result<Response<Body>, Exchange> {
    if !may_be_meta_tool(&x) {
        return Err(x);
    }
    let id = env.id.expect("a request has an id");
    let who = x.principal().expect("authenticated").clone();
    let app = x.app().clone();
    if x.unwrapped() {
        if who.tenant.discovery != switchboard_core::policy::Discovery::Progressive {
            let e = Error::UnknownTool(crate::tools::meta::Meta::Call.name(&app.config.catalog.separator));
            return Ok(x.fail_as(Some(id), &e, switchboard_core::Outcome::Rejected));
        }
        let target = env.target().and_then(Result::ok);
        if let Some(name) = target.and_then(|t| t.name).and_then(jsonrpc::as_str) {
            app.discoveries.called(&who, session, &name);
        }
        return Err(x);
    }
    match Box::pin(crate::discovery::answer(&app, &who, session, env)).await {
        Some(answered) => Ok(x.answer(id, answered.map(|result| respond::json(jsonrpc::result_response(id, &result))))),
        None => Err(x),
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
pub(crate) async fn notification(app: &Arc<App>, session: &Arc<Session>, env: &Envelope<'_>, body: &Bytes) {
    match Method::from_name(env.method_str()) {
        Method::Cancelled => {
            let here = session.cancel_here(env, body).await;
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

/// The client's answer to a request an upstream sent it, passed to the
/// upstream session that asked (opened by whichever replica). An answer
/// that cannot be delivered is an error for the client (400: nothing asked
/// this; 502: the upstream could not take it) and is counted in
/// `switchboard_relay_dropped_total`, never acknowledged as if delivered.
pub(crate) async fn answer(
    app: &Arc<App>,
    who: &Principal,
    session: &Arc<Session>,
    env: &Envelope<'_>,
    body: &Bytes,
) -> Result<(), Error> {
    let Some(id) = env.id else { return Err(Error::UnknownAnswer("null".into())) };
    let unknown = |upstream: &str| {
        app.metrics.upstreams.relay_dropped(upstream, "unknown_answer");
        tracing::info!(session = %session.id, id = id.get(), "the client answered a request no upstream awaits; refused");
        Error::UnknownAnswer(id.get().to_owned())
    };
    let Some((u, their_id)) = session.answered(id).filter(|(u, _)| who.tenant.sees_upstream(*u)) else {
        // An input request of a stateless upstream: awaited here, or at
        // another replica.
        if let Some(ours) = jsonrpc::as_str(id).filter(|i| i.starts_with("m.")) {
            if app.deliver_answer(&session.id, &ours, body.clone()) {
                return Ok(());
            }
            if let Some(shared) = app.sessions.shared_streams().filter(|_| session.stored) {
                if shared.answer_awaited(&session.id, &ours).await {
                    shared.broadcast_cancel(&session.id, body).await;
                    return Ok(());
                }
            }
        }
        return Err(unknown(""));
    };
    let name = &app.upstreams[u].name;
    let failed = (env.kind == MessageKind::Error).then(|| "the client answered with an error".to_owned());
    app.relayed_spans.end(&app.telemetry, &session.id, id.get(), failed);
    let restored = switchboard_protocol::rewrite::splice(
        body,
        &mut [switchboard_protocol::rewrite::Edit::new(jsonrpc::span(body, id.get()), their_id.as_bytes())],
    );
    // The request may have come through another replica: the channel
    // continues the same upstream session, whichever replica opened it. An
    // answer never opens an upstream session (no request of one awaits it).
    let Some(channel) = session.existing_channel(u).await else { return Err(unknown(name)) };
    channel.send(restored).await.map_err(|source| {
        app.metrics.upstreams.relay_dropped(name, "answer_not_delivered");
        tracing::warn!(upstream = %name, error = %source, "answer to a server request not delivered");
        Error::AnswerNotDelivered { upstream: name.clone(), source }
    })
}

/// The phases a GET or DELETE goes through (it has no body): `Origin`,
/// authenticate, the session it names (`http` names it in the audit record
/// of a refusal).
async fn session_phases(
    app: &Arc<App>,
    headers: Headers<'_>,
    connection: &http::Extensions,
    http: &'static str,
) -> Result<(Exchange, Arc<Session>), Response<Body>> {
    let mut x = Exchange::new(app, Instant::now(), connection);
    if let Err(e) = check_origin(app, headers) {
        return Err(x.reject(None, e));
    }
    if let Err(e) = x.authenticate(headers).await {
        return Err(x.refuse(headers, None, 0, e, http));
    }
    // Loaded if another replica created it; another tenant's is unknown.
    match x.find_session(headers).await {
        Ok(session) => Ok((x, session)),
        Err(e) => Err(x.reject(None, e)),
    }
}

/// GET: the session's stream of messages not tied to a request.
async fn get(app: &Arc<App>, headers: Headers<'_>, connection: &http::Extensions) -> Response<Body> {
    let (mut x, session) = match session_phases(app, headers, connection, "GET /mcp").await {
        Ok(found) => found,
        Err(response) => return response,
    };
    if let Err(e) = check_version(headers) {
        return x.reject(None, e);
    }
    let resume = headers.text(Header::LastEventId).and_then(Result::ok).and_then(EventId::parse);
    // While draining, answers in flight may still be resumed; nothing new starts.
    if app.shutting_down() && resume.is_none_or(|id| id.stream == 0) {
        return x.reject(None, Error::ShuttingDown);
    }
    session.touch();
    match session.open_get(resume).await {
        Ok(rx) => {
            x.discard();
            respond::sse(rx, app.config.server.keep_alive)
        }
        Err(e) => x.reject(None, e.into()),
    }
}

/// DELETE: ends the session and its upstream sessions.
async fn delete(app: &Arc<App>, headers: Headers<'_>, connection: &http::Extensions) -> Response<Body> {
    let (mut x, session) = match session_phases(app, headers, connection, "DELETE /mcp").await {
        Ok(found) => found,
        Err(response) => return response,
    };
    // Ended everywhere, or (the store unreachable) nowhere: the client retries.
    if let Err(e) = app.sessions.delete(&session).await {
        return x.reject(None, e.into());
    }
    x.discard();
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::OK;
    response
}

#[cfg(test)]
mod future_sizes {
    //! The hot POST's future is moved whole at least once per request (into
    //! hyper's slot for it): what it holds is copied every time. Branches off
    //! the common path (other eras, lists, answers, streams, stores) are
    //! boxed where they are awaited; these bounds keep it that way.
    use super::*;
    use std::future::Future;

    /// The size of the future `f` returns, without making one.
    fn size<A, F: Future>(_: impl Fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }
    type H = Headers<'static>;
    type E = &'static Envelope<'static>;
    type B = &'static Bytes;
    type S = &'static Arc<Session>;

    #[test]
    fn the_hot_posts_future_stays_small() {
        let handle = size(|(a, r): (&'static Arc<App>, Request<Incoming>)| super::handle(a, r));
        let request = size(|(x, h, s, e, b): (Exchange, H, S, E, B)| super::request(x, h, s, e, b, true));
        let forward = size(|(x, s, e, b): (Exchange, S, E, B)| forward::forward(x, s, Method::ToolsCall, e, b, true));
        let find_session = size(|(mut x, h): (Exchange, H)| async move { x.find_session(h).await });
        let post_read = size(|(a, h, b): (&'static Arc<App>, &'static crate::headers::Head, Bytes)| {
            super::post_read(a, Instant::now(), h, b, Box::leak(Box::default()))
        });
        // Each async level a future sits in copies it whole once more when
        // awaited: the phases are plain functions returning their async
        // block (an async fn keeps its arguments twice), and rare ways boxed.
        // The HTTP channel's request future (about 2.5 KB) is in forward's
        // on purpose, not in a box of its own (a fresh, cold block each
        // call): `forward::until` keeps it from being moved once pinned.
        let admit = size(|(mut x, e): (Exchange, E)| async move { x.admit(e).await });
        // A stateless request's, boxed off the session's, held as small.
        let stateless = size(|(x, h, e, b): (Exchange, H, E, B)| stateless_client::post(x, h, e, b));
        println!(
            "handle {handle}, post_read {post_read}, request {request}, forward {forward}, find_session {find_session}, admit {admit}, stateless {stateless}"
        );
        assert!(post_read <= 6 * 1024 + 512, "the future of a POST read by the HTTP/1.1 path holds {post_read} bytes");
        assert!(handle <= 8 * 1024, "the future of a request to /mcp holds {handle} bytes");
        assert!(request <= 5 * 1024, "a session's request: {request} bytes");
        assert!(forward <= 4 * 1024 + 512, "forward: {forward} bytes");
        assert!(find_session <= 512 && admit <= 1024, "the store's and the limits' slow ways are not boxed");
        assert!(stateless <= 5 * 1024 + 512, "a stateless request: {stateless} bytes");
        assert!(std::mem::size_of::<Exchange>() <= 384, "Exchange: {} bytes", std::mem::size_of::<Exchange>());
    }
}
