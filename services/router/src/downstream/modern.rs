//! MCP 2026-07-28 on the client side: stateless requests.
//!
//! A POST is *modern* when it names no session, is not `initialize`, and its
//! `MCP-Protocol-Version` header (or, without one, its `params._meta`) says
//! 2026-07-28 or later ([`is_modern`]); everything else takes the session
//! path of `mod.rs`. Both eras share one endpoint, the transport checks, the
//! authentication, the rate limits and the audit.
//!
//! A modern request goes through these phases:
//!
//! 1. validate ([`validate`]): `params._meta` carries the protocol version and
//!    the client's capabilities; the `MCP-Protocol-Version`, `Mcp-Method`
//!    and `Mcp-Name` headers agree with the body (400 and -32020 if not);
//!    the version is one we speak (400 and -32022 with the supported list);
//! 2. authenticate and rate-limit, as for sessions;
//! 3. route: `server/discover` and the lists are answered here (with
//!    `resultType`, `ttlMs` and `cacheScope`); `tools/call`, `prompts/get`,
//!    `resources/read` and `completion/complete` are forwarded;
//!    `subscriptions/listen` opens a stream of list changes; the methods the
//!    era removed (`initialize` aside, which is always a session's) and
//!    unknown ones are 404 and -32601.
//!
//! Forwarding depends on the upstream's era. A modern upstream gets the
//! request as it came, but for the rewritten name and its own `Mcp-Name`
//! header (with `Mcp-Param-*` headers passed on), and its answer comes back
//! untouched: `input_required` results and their `requestState` included.
//! A session-based upstream (2025) is *bridged* ([`bridged`]): the tenant's
//! calls share one router session per tenant (its upstream sessions are
//! recorded in the session store like any other, so every replica reuses
//! them: one `initialize` per tenant and upstream, not per request); the
//! request gets an id unique on that session; the upstream's progress and
//! log notifications are relayed on the POST's SSE stream; a server request
//! (sampling, elicitation, roots) ends the round with `resultType:
//! "input_required"`, its key being the relayed request's id, and a
//! `requestState` the router signs ([`RoundState`]) naming the tenant, the
//! API key that made the call (only it may continue the call), the tenant
//! session, the request's event stream and the position in it. The retry
//! (any replica) sends the client's `inputResponses` to the upstream as the
//! answers, and goes on reading the request's stream from that position:
//! locally, or from Redis where the stream is copied.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchboard_core::UpstreamId;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, Response, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use switchboard_protocol::jsonrpc::{self, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::modern::{self, RequestMeta};
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::{Method, ProtocolVersion};
use tokio::sync::{broadcast, mpsc};

use super::forward::{self, Ledger};
use super::{lists, respond, PROTOCOL_VERSION};
use crate::app::{App, Change};
use crate::body::Body;
use crate::error::Error;
use switchboard_core::policy::Principal;
use switchboard_core::Outcome;
use switchboard_protocol::sse::EventId;
use switchboard_session::{Session, SessionError};
use switchboard_upstream::{ModernAnswer, Reply};

/// The versions the router speaks, newest first (`server/discover`, -32022).
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"];

pub(crate) static MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub(crate) static MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// How long a bridged `requestState` stays valid (the upstream's timeout
/// bounds the call anyway).
const STATE_LIFETIME: Duration = Duration::from_secs(600);

/// Whether a POST is a stateless request (see the module docs).
pub fn is_modern(headers: &HeaderMap, env: &Envelope<'_>) -> bool {
    if headers.contains_key(&respond::SESSION_ID) {
        return false;
    }
    // A session client's `initialize` names the version it wants; one that
    // does not, sent statelessly, asks for a method the era removed (404).
    if env.method_str() == "initialize" && initialize_names_a_version(env) {
        return false;
    }
    let body_says = || modern::request_meta(env.params).ok().flatten().is_some_and(|m| m.protocol_version.is_some());
    match headers.get(&PROTOCOL_VERSION) {
        Some(value) => match ProtocolVersion::parse(value.to_str().unwrap_or("").trim()) {
            Some(v) => v.is_modern(),
            // A version we do not know: modern if the body says it is one.
            None => body_says(),
        },
        None => body_says(),
    }
}

/// Whether an `initialize` has `params.protocolVersion`.
fn initialize_names_a_version(env: &Envelope<'_>) -> bool {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "protocolVersion", default)]
        version: Option<&'a RawValue>,
    }
    env.params.and_then(|p| serde_json::from_str::<Params<'_>>(p.get()).ok()).is_some_and(|p| p.version.is_some())
}

/// A header's value as text: trimmed, and decoded if it is in the
/// `=?base64?…?=` form used for values that are not plain ASCII.
pub(crate) fn header_text(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let raw = headers.get(name)?;
    let text = std::str::from_utf8(raw.as_bytes()).ok()?.trim();
    if let Some(inner) = text.strip_prefix("=?base64?").and_then(|t| t.strip_suffix("?=")) {
        let bytes = base64::engine::general_purpose::STANDARD.decode(inner).ok()?;
        return String::from_utf8(bytes).ok();
    }
    Some(text.to_owned())
}

/// A header value for `text`: as is if it is visible ASCII, else in the
/// `=?base64?…?=` form.
pub(crate) fn header_value(text: &str) -> http::HeaderValue {
    let plain = !text.is_empty() && text.bytes().all(|b| (0x20..0x7f).contains(&b)) && text.trim() == text;
    if plain {
        if let Ok(value) = http::HeaderValue::from_str(text) {
            return value;
        }
    }
    let encoded = format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(text));
    http::HeaderValue::from_str(&encoded).expect("base64 is a valid header value")
}

/// What phase 1 learned of a request.
pub struct Validated<'a> {
    pub meta: RequestMeta<'a>,
}

impl Validated<'_> {
    /// Whether the client declared a capability for this request.
    fn declares(&self, capability: &str) -> bool {
        self.meta
            .client_capabilities
            .and_then(|c| serde_json::from_str::<HashMap<Cow<'_, str>, &RawValue>>(c.get()).ok())
            .is_some_and(|c| c.get(capability).is_some_and(|v| v.get() != "null"))
    }

    /// The rank of the lowest log level the client wants, if it wants logs.
    fn log_rank(&self) -> Option<usize> {
        self.meta.log_level.as_deref().and_then(modern::log_rank)
    }
}

/// Phase 1: the request's `_meta` and headers (see the module docs).
pub fn validate<'a>(headers: &HeaderMap, env: &Envelope<'a>) -> Result<Validated<'a>, Error> {
    let method = env.method_str();
    let meta = modern::request_meta(env.params)
        .map_err(|e| Error::InvalidMeta(e.to_string()))?
        .ok_or_else(|| Error::InvalidMeta("params._meta is required without a session".into()))?;
    let Some(version) = meta.protocol_version.as_deref() else {
        return Err(Error::InvalidMeta(format!("params._meta[\"{}\"] is required", modern::META_PROTOCOL_VERSION)));
    };
    if meta.client_capabilities.is_none_or(|c| !c.get().starts_with('{')) {
        return Err(Error::InvalidMeta(format!(
            "params._meta[\"{}\"] is required (an object)",
            modern::META_CLIENT_CAPABILITIES
        )));
    }
    match header_text(headers, &PROTOCOL_VERSION) {
        Some(header) if header != version => {
            return Err(Error::HeaderMismatch(format!(
                "MCP-Protocol-Version header {header:?} does not match params._meta version {version:?}"
            )))
        }
        _ => {}
    }
    if !ProtocolVersion::parse(version).is_some_and(ProtocolVersion::is_modern) {
        return Err(Error::UnsupportedModernVersion(version.to_owned()));
    }
    match header_text(headers, &MCP_METHOD) {
        None => return Err(Error::HeaderMismatch("the Mcp-Method header is required".into())),
        Some(header) if header != method => {
            return Err(Error::HeaderMismatch(format!(
                "Mcp-Method header {header:?} does not match the body's method {method:?}"
            )))
        }
        Some(_) => {}
    }
    let named = match Method::from_name(method) {
        Method::ToolsCall | Method::PromptsGet => Some("name"),
        Method::ResourcesRead => Some("uri"),
        _ => None,
    };
    if let Some(field) = named {
        let target = env.params.and_then(|p| Target::parse(p).ok()).unwrap_or_default();
        let raw = if field == "name" { target.name } else { target.uri };
        let body = raw.and_then(jsonrpc::as_str);
        match (header_text(headers, &MCP_NAME), body) {
            (None, _) => {
                return Err(Error::HeaderMismatch(format!("the Mcp-Name header is required for {method}")));
            }
            (Some(header), Some(body)) if header == *body => {}
            (Some(header), body) => {
                return Err(Error::HeaderMismatch(format!(
                    "Mcp-Name header {header:?} does not match params.{field} {:?}",
                    body.as_deref().unwrap_or("")
                )))
            }
        }
    }
    Ok(Validated { meta })
}

/// Serves one stateless request, after the transport checks and the envelope.
pub async fn post(
    app: &Arc<App>,
    headers: &HeaderMap,
    env: &Envelope<'_>,
    body: &Bytes,
    started: Instant,
) -> Response<Body> {
    if env.kind != MessageKind::Request {
        if let Err(e) = super::authenticate(app, headers) {
            return super::refuse(app, None, headers, None, Some(env), body.len(), e, started, "POST");
        }
        // Nothing for a stateless server to take: notifications are dropped,
        // and there are no server requests for a response to answer.
        if env.kind == MessageKind::Notification {
            return respond::accepted();
        }
        return super::reject(app, env.id, Error::InvalidParams("no request of the router awaits this answer".into()));
    }
    let id = env.id.expect("a request has an id");
    let valid = match validate(headers, env) {
        Ok(valid) => valid,
        Err(e) => return super::reject(app, Some(id), e),
    };
    let who = match super::authenticate(app, headers) {
        Ok(who) => who,
        Err(e) => return super::refuse(app, None, headers, None, Some(env), body.len(), e, started, "POST"),
    };
    if let Err(e) = super::admit(app, &who, env).await {
        return super::refuse(app, Some(&who), headers, None, Some(env), body.len(), e, started, "POST");
    }
    let method = Method::from_name(env.method_str());
    let local = |result: Result<Response<Body>, Error>| {
        let outcome = if result.is_ok() { Outcome::Ok } else { Outcome::Rejected };
        app.metrics.request(method, None).record(outcome, started.elapsed());
        result.unwrap_or_else(|e| respond::error(Some(id), &e))
    };
    match method {
        Method::ServerDiscover => local(discover(app, &who, id).await),
        Method::ToolsList | Method::PromptsList | Method::ResourcesList | Method::ResourcesTemplatesList => {
            let kind = lists::kind_of(method);
            // Fetched first, so that the cache hint counts from this fetch.
            app.catalog.ensure(&[kind]).await;
            let tail = result_tail(app, &who, true);
            local(lists::list(app, &who.tenant, kind, id, env.params, &tail).await)
        }
        Method::SubscriptionsListen => local(listen(app, &who, id, env.params)),
        Method::ToolsCall | Method::PromptsGet | Method::ResourcesRead | Method::CompletionComplete => {
            let ledger = match super::ledger(app, &who, headers, None, env, body.len(), method, started) {
                Ok(ledger) => ledger,
                Err(response) => return *response,
            };
            call(app, &who, headers, &valid, method, env, body, started, ledger).await
        }
        _ => {
            app.metrics.request(Method::Other, None).record(Outcome::Rejected, started.elapsed());
            respond::error(Some(id), &Error::NoSuchMethod(env.method_str().to_owned()))
        }
    }
}

/// What every result the router builds itself ends with (before its
/// closing brace): `resultType`, the cache hints when `cache`, and the
/// router's `serverInfo`. Lists are `private` when the tenant sees a part of
/// the catalog (or keys are required): another client may see another list.
fn result_tail(app: &App, who: &Principal, cache: bool) -> Vec<u8> {
    let mut tail = Vec::with_capacity(160);
    tail.extend_from_slice(br#","resultType":"complete""#);
    if cache {
        let public = who.tenant.unrestricted() && who.key_prefix.is_empty();
        let scope = if public { "public" } else { "private" };
        tail.extend_from_slice(format!(r#","ttlMs":{},"cacheScope":"{scope}""#, app.catalog.ttl_ms()).as_bytes());
    }
    tail.extend_from_slice(
        format!(
            r#","_meta":{{"{}":{{"name":"switchboard","version":"{}"}}}}"#,
            modern::META_SERVER_INFO,
            env!("CARGO_PKG_VERSION")
        )
        .as_bytes(),
    );
    tail
}

/// `server/discover`: the versions and capabilities, without a session.
async fn discover(app: &Arc<App>, who: &Principal, id: &RawValue) -> Result<Response<Body>, Error> {
    let snapshot = match app.catalog.current() {
        s if s.generation > 0 => s,
        _ => app.catalog.ensure(&[ListKind::Tools]).await,
    };
    let mut result = json!({
        "supportedVersions": SUPPORTED_VERSIONS,
        "capabilities": lists::server_capabilities(&snapshot.merged),
        "serverInfo": {"name": "switchboard", "title": "Switchboard MCP router", "version": env!("CARGO_PKG_VERSION")},
    });
    if let Some(instructions) = &snapshot.merged.instructions {
        result["instructions"] = Value::String(instructions.clone());
    }
    let mut bytes = serde_json::to_vec(&result).expect("serializable");
    bytes.pop(); // the closing brace
    bytes.extend_from_slice(&result_tail(app, who, true));
    bytes.push(b'}');
    Ok(respond::json(jsonrpc::result_response(id, &bytes)))
}

/// `subscriptions/listen`: an SSE stream of the list changes the client
/// asked for (`params.notifications`), acknowledged first, each tagged with
/// the listen request's id; it ends with a result when the router shuts down.
fn listen(app: &Arc<App>, who: &Principal, id: &RawValue, params: Option<&RawValue>) -> Result<Response<Body>, Error> {
    #[derive(Deserialize, Default)]
    struct Params {
        #[serde(default)]
        notifications: Option<Value>,
    }
    let params: Params = match params {
        Some(p) => {
            serde_json::from_str(p.get()).map_err(|e| Error::InvalidParams(format!("subscriptions/listen: {e}")))?
        }
        None => Params::default(),
    };
    let wanted = params.notifications.unwrap_or_else(|| json!({}));
    if !wanted.is_object() {
        return Err(Error::InvalidParams("params.notifications must be an object".into()));
    }
    let mut honoured = serde_json::Map::new();
    let mut kinds = Vec::new();
    for (key, kind) in [
        ("toolsListChanged", ListKind::Tools),
        ("promptsListChanged", ListKind::Prompts),
        ("resourcesListChanged", ListKind::Resources),
    ] {
        if wanted.get(key).and_then(Value::as_bool) == Some(true) {
            honoured.insert(key.to_owned(), Value::Bool(true));
            kinds.push(kind);
        }
    }
    let tag = format!(r#"{{"{}":{}}}"#, modern::META_SUBSCRIPTION_ID, id.get());
    let ack = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{},"_meta":{tag}}}}}"#,
        Value::Object(honoured)
    );
    let end = format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{"resultType":"complete","_meta":{tag}}}}}"#, id.get());
    let mut changes = app.changes.subscribe();
    let tenant = who.tenant.name.clone();
    let (tx, rx) = mpsc::channel(16);
    let sse = |m: &str| switchboard_protocol::sse::encode_event(None, None, m.as_bytes());
    let notes: Vec<(ListKind, Bytes)> = kinds
        .iter()
        .map(|&k| {
            (
                k,
                sse(&format!(
                    r#"{{"jsonrpc":"2.0","method":"{}","params":{{"_meta":{tag}}}}}"#,
                    k.changed_notification()
                )),
            )
        })
        .collect();
    let shutting_down = app.shutting_down();
    tokio::spawn(async move {
        if tx.send(sse(&ack)).await.is_err() {
            return;
        }
        if shutting_down {
            let _ = tx.send(sse(&end)).await;
            return;
        }
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                () = tx.closed() => return,
            };
            match change {
                Ok(Change::List(kind, only)) => {
                    if only.as_ref().is_some_and(|t| *t != tenant) {
                        continue;
                    }
                    // The template list changes with the resource list.
                    let kind = if kind == ListKind::ResourceTemplates { ListKind::Resources } else { kind };
                    if let Some((_, note)) = notes.iter().find(|(k, _)| *k == kind) {
                        if tx.send(note.clone()).await.is_err() {
                            return;
                        }
                    }
                }
                // Missed some: the client re-lists whatever it follows.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    for (_, note) in &notes {
                        if tx.send(note.clone()).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Change::Shutdown) | Err(broadcast::error::RecvError::Closed) => {
                    let _ = tx.send(sse(&end)).await;
                    return;
                }
            }
        }
    });
    Ok(respond::sse(rx, app.config.server.keep_alive))
}

/// A forwarded request: to a modern upstream as it is, to a session-based one
/// bridged.
#[allow(clippy::too_many_arguments)]
async fn call(
    app: &Arc<App>,
    who: &Principal,
    headers: &HeaderMap,
    valid: &Validated<'_>,
    method: Method,
    env: &Envelope<'_>,
    body: &Bytes,
    started: Instant,
    mut ledger: Ledger,
) -> Response<Body> {
    let id = env.id.expect("a request has an id");
    if method == Method::ToolsCall {
        if let Some(target) = crate::edge::target(app, &who.tenant.name, env) {
            let message = crate::edge::answer(app, target, id, started, ledger).await;
            return respond::json(stamp_complete(message));
        }
    }
    let resolved = match forward::resolve(app, &who.tenant, method, env, body).await {
        Ok(resolved) => resolved,
        Err(e) => {
            let outcome =
                if e.side() == crate::error::Side::Upstream { Outcome::UpstreamFailed } else { Outcome::Rejected };
            app.metrics.request(method, None).record(outcome, started.elapsed());
            ledger.close(app, None, outcome, Some(e.code()), 0, started);
            return respond::error(Some(id), &e);
        }
    };
    let u = resolved.upstream;
    if app.catalog.is_modern(u) {
        return passthrough(app, who, headers, method, env, resolved, started, ledger).await;
    }
    if let Some(state) = retry_state(env) {
        ledger.permit.take();
        ledger.draft = None; // the first round's record covers the call
        return match state {
            Ok(state) => {
                let client_token = resolved.progress_token.as_ref().map(|r| token_text(&resolved.body, r));
                resume(app, who, valid, method, id, state, client_token, started).await
            }
            Err(e) => {
                app.metrics.request(method, Some(u)).record(Outcome::Rejected, started.elapsed());
                respond::error(Some(id), &e)
            }
        };
    }
    bridged(app, who, valid, method, id, resolved, started, ledger).await
}

/// To a modern upstream: the request as it came, with the rewritten name,
/// and its answer as it comes (status, `input_required`, streams).
#[allow(clippy::too_many_arguments)]
async fn passthrough(
    app: &Arc<App>,
    who: &Principal,
    headers: &HeaderMap,
    method: Method,
    env: &Envelope<'_>,
    resolved: forward::Resolved,
    started: Instant,
    mut ledger: Ledger,
) -> Response<Body> {
    let id = env.id.expect("a request has an id");
    let u = resolved.upstream;
    let upstream = &app.upstreams[u];
    let extra = upstream_headers(method, &resolved.body, Some(headers));
    let work = upstream.transport.modern(resolved.body, method, extra, &who.tenant.name);
    let answer = match tokio::time::timeout(upstream.config.timeout, work).await {
        Err(_) => Err(Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout }),
        Ok(Err(e)) => Err(Error::upstream(&upstream.name, e)),
        Ok(Ok(answer)) => Ok(answer),
    };
    match answer {
        Err(e) => {
            let outcome =
                if matches!(e, Error::UpstreamTimeout { .. }) { Outcome::Timeout } else { Outcome::UpstreamFailed };
            app.metrics.request(method, Some(u)).record(outcome, started.elapsed());
            ledger.close(app, Some(u), outcome, Some(e.code()), 0, started);
            respond::error(Some(id), &e)
        }
        Ok(ModernAnswer { status, reply: Reply::Done(message) }) => {
            let (message, outcome) = forward::finish(app, u, method, message);
            app.metrics.request(method, Some(u)).record(outcome, started.elapsed());
            ledger.close(app, Some(u), outcome, forward::error_code(&message), message.len(), started);
            let mut response = respond::json(message);
            *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            response
        }
        Ok(ModernAnswer { reply: Reply::Stream(mut stream), .. }) => {
            let (tx, rx) = mpsc::channel(64);
            let task_app = app.clone();
            let deadline = tokio::time::Instant::now() + upstream.config.timeout;
            let (name, timeout) = (upstream.name.clone(), upstream.config.timeout);
            let client_id = id.to_owned();
            tokio::spawn(async move {
                let app = task_app;
                let mut sent = 0;
                // Ends the client's stream with an error in place of the answer.
                let fail = |e: Error| {
                    let message =
                        jsonrpc::error_response(Some(&client_id), e.code(), &e.to_string(), e.data().as_ref());
                    (switchboard_protocol::sse::encode_event(None, None, &message), e.code())
                };
                let outcome = loop {
                    let next = tokio::select! {
                        next = tokio::time::timeout_at(deadline, stream.next()) => next,
                        // A modern client hanging up cancels: the upstream
                        // sees its stream close when this task drops it.
                        _ = tx.closed() => break (Outcome::Abandoned, None),
                    };
                    let next = match next {
                        Ok(next) => next,
                        Err(_) => {
                            let (event, code) = fail(Error::UpstreamTimeout { upstream: name.clone(), after: timeout });
                            let _ = tx.send(event).await;
                            break (Outcome::Timeout, Some(code));
                        }
                    };
                    match next {
                        Some(Ok(message)) => {
                            let last = Envelope::parse(&message).is_ok_and(|e| e.method.is_none());
                            let message = if last { forward::finish(&app, u, method, message).0 } else { message };
                            sent += message.len();
                            let event = switchboard_protocol::sse::encode_event(None, None, &message);
                            if tx.send(event).await.is_err() {
                                // A modern client hanging up cancels: the
                                // upstream sees its stream close.
                                break (Outcome::Abandoned, None);
                            }
                            if last {
                                break (Outcome::Ok, forward::error_code(&message));
                            }
                        }
                        Some(Err(e)) => {
                            let (event, code) = fail(Error::upstream(&name, e));
                            let _ = tx.send(event).await;
                            break (Outcome::UpstreamFailed, Some(code));
                        }
                        None => {
                            let (event, code) =
                                fail(Error::upstream(&name, switchboard_upstream::UpstreamError::Closed));
                            let _ = tx.send(event).await;
                            break (Outcome::UpstreamFailed, Some(code));
                        }
                    }
                };
                app.metrics.request(method, Some(u)).record(outcome.0, started.elapsed());
                ledger.close(&app, Some(u), outcome.0, outcome.1, sent, started);
            });
            respond::sse(rx, app.config.server.keep_alive)
        }
    }
}

/// A retry's `requestState` and `inputResponses`.
type Retry = (String, HashMap<String, Box<RawValue>>);

/// The headers of a request to a stateless upstream besides the version and
/// method: `Mcp-Name` (the upstream's own name or URI, from the rewritten
/// `body`) and the client's `Mcp-Param-*` headers, passed through.
pub(crate) fn upstream_headers(
    method: Method,
    body: &[u8],
    client: Option<&HeaderMap>,
) -> Vec<(HeaderName, http::HeaderValue)> {
    let mut extra = Vec::new();
    if let Some(target) = Envelope::parse(body).ok().and_then(|e| e.params).and_then(|p| Target::parse(p).ok()) {
        let named = match method {
            Method::ToolsCall | Method::PromptsGet => target.name,
            Method::ResourcesRead => target.uri,
            _ => None,
        };
        if let Some(name) = named.and_then(jsonrpc::as_str) {
            extra.push((MCP_NAME.clone(), header_value(&name)));
        }
    }
    for (name, value) in client.into_iter().flatten() {
        if name.as_str().starts_with("mcp-param-") {
            extra.push((name.clone(), value.clone()));
        }
    }
    extra
}

/// The round a retry continues, if the request carries a `requestState`
/// (checked: one this router signed, for this tenant, not expired).
fn retry_state(env: &Envelope<'_>) -> Option<Result<Retry, Error>> {
    #[derive(Deserialize)]
    struct Wire {
        #[serde(rename = "requestState")]
        request_state: Option<String>,
        #[serde(rename = "inputResponses", default)]
        input_responses: HashMap<String, Box<RawValue>>,
    }
    let params = env.params?;
    let retry: Wire = match serde_json::from_str(params.get()) {
        Ok(retry) => retry,
        Err(e) => return Some(Err(Error::InvalidParams(format!("requestState/inputResponses: {e}")))),
    };
    let state = retry.request_state?;
    Some(Ok((state, retry.input_responses)))
}

/// Where a bridged call waits for the client's input: sealed into the
/// `requestState` of an `input_required` result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundState {
    /// The tenant whose call it is.
    pub tenant: String,
    /// The visible prefix of the API key that made the call ("" without
    /// keys): only that key may continue it.
    pub caller: String,
    /// The tenant session the call runs on.
    pub session: String,
    /// The call's event stream, and the position of the server request in it.
    pub stream: u64,
    pub seq: u64,
    /// The id the upstream knows the call by (JSON).
    pub call_id: String,
    /// The server request awaiting an answer: its relayed id (JSON).
    pub key: String,
    /// Milliseconds since the Unix epoch after which it is refused.
    pub expires_ms: u64,
}

impl RoundState {
    /// `payload.mac`, both base64url: the payload is the fields joined by
    /// newlines, the mac HMAC-SHA256 over it (truncated to 128 bits).
    pub fn seal(&self, key: &[u8; 32]) -> String {
        let payload = [
            self.tenant.as_str(),
            &self.caller,
            &self.session,
            &self.stream.to_string(),
            &self.seq.to_string(),
            &self.call_id,
            &self.key,
            &self.expires_ms.to_string(),
        ]
        .join("\n");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mac = hmac(key, payload.as_bytes());
        format!("{}.{}", b64.encode(payload), b64.encode(&mac[..16]))
    }

    /// Checks and reads a sealed state.
    pub fn open(sealed: &str, key: &[u8; 32], now_ms: u64) -> Result<RoundState, Error> {
        let bad = |why: &str| Error::InvalidRequestState(why.to_owned());
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (payload, mac) = sealed.split_once('.').ok_or_else(|| bad("not one this router issued"))?;
        let payload = b64.decode(payload).map_err(|_| bad("not one this router issued"))?;
        let mac = b64.decode(mac).map_err(|_| bad("not one this router issued"))?;
        let expected = hmac(key, &payload);
        // Constant time: every byte is compared.
        let same = mac.len() == 16 && mac.iter().zip(&expected[..16]).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if !same {
            return Err(bad("it was altered, or is not one this router issued"));
        }
        let text = String::from_utf8(payload).map_err(|_| bad("malformed"))?;
        let parts: Vec<&str> = text.split('\n').collect();
        let [tenant, caller, session, stream, seq, call_id, key, expires] = parts[..] else {
            return Err(bad("malformed"));
        };
        let state = RoundState {
            tenant: tenant.to_owned(),
            caller: caller.to_owned(),
            session: session.to_owned(),
            stream: stream.parse().map_err(|_| bad("malformed"))?,
            seq: seq.parse().map_err(|_| bad("malformed"))?,
            call_id: call_id.to_owned(),
            key: key.to_owned(),
            expires_ms: expires.parse().map_err(|_| bad("malformed"))?,
        };
        if state.expires_ms < now_ms {
            return Err(bad("it expired; send the request again without it"));
        }
        Ok(state)
    }
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut inner = Sha256::new();
    let mut outer = Sha256::new();
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    inner.update(ipad);
    inner.update(message);
    outer.update(opad);
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// A progress token's JSON text, from its place in a body.
fn token_text(body: &[u8], at: &Range<usize>) -> Box<str> {
    String::from_utf8_lossy(&body[at.clone()]).into()
}

/// The first round of a bridged call.
#[allow(clippy::too_many_arguments)]
async fn bridged(
    app: &Arc<App>,
    who: &Principal,
    valid: &Validated<'_>,
    method: Method,
    id: &RawValue,
    resolved: forward::Resolved,
    started: Instant,
    mut ledger: Ledger,
) -> Response<Body> {
    let u = resolved.upstream;
    let upstream = &app.upstreams[u];
    let fail = |ledger: &mut Ledger, e: Error, outcome: Outcome| {
        app.metrics.request(method, Some(u)).record(outcome, started.elapsed());
        ledger.close(app, Some(u), outcome, Some(e.code()), 0, started);
        respond::error(Some(id), &e)
    };
    let session = match app.sessions.tenant_session(&who.tenant.name).await {
        Ok(session) => session,
        Err(e) => return fail(&mut ledger, e.into(), Outcome::Error),
    };
    session.touch();
    let channel = match session.channel(u).await.map_err(Error::from) {
        Ok(channel) => channel,
        Err(e) => {
            let outcome =
                if matches!(e, Error::UpstreamTimeout { .. }) { Outcome::Timeout } else { Outcome::UpstreamFailed };
            return fail(&mut ledger, e, outcome);
        }
    };
    // Many clients share the tenant session: the call gets an id of its own,
    // and so does its progress token (two clients' token 1 must not meet on
    // an upstream that routes progress by token); the client's come back in
    // the answer and the notifications.
    let call_id = format!("\"sb.{}\"", &switchboard_core::ids::random_id()[..16]);
    let client_token = resolved.progress_token.as_ref().map(|r| token_text(&resolved.body, r));
    let mut edits = vec![Edit::new(resolved.id.clone(), call_id.as_bytes())];
    if let Some(r) = &resolved.progress_token {
        edits.push(Edit::new(r.clone(), call_id.as_bytes()));
    }
    let body = splice(&resolved.body, &mut edits);
    // Where the two sit in the new body: each moves by what the edits
    // before it added.
    let moved = |r: &Range<usize>| {
        let shift: isize = edits
            .iter()
            .filter(|e| e.range.start < r.start)
            .map(|e| e.with.len() as isize - e.range.len() as isize)
            .sum();
        let start = (r.start as isize + shift) as usize;
        start..start + call_id.len()
    };
    let id_range = moved(&resolved.id);
    let progress_token = resolved.progress_token.as_ref().map(moved);
    let call_raw: Box<RawValue> = RawValue::from_string(call_id.clone()).expect("a JSON string");
    let deadline = tokio::time::Instant::now() + upstream.config.timeout;
    let out = switchboard_upstream::Outgoing { body, method, id: id_range, progress_token };
    session.begin(&call_raw, u);
    let inflight = forward::Inflight::new(app, &session, &call_raw, u, method, started, ledger);
    let reply = tokio::time::timeout_at(deadline, channel.request(out)).await;
    match reply {
        Err(_) => {
            forward::cancel_upstream(app, &session, u, &call_raw, "timeout");
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
            let (message, outcome) = forward::finish(app, u, method, message);
            inflight.finish(outcome, forward::error_code(&message), message.len());
            respond::json(for_client(&message, id, method))
        }
        Ok(Ok(Reply::Stream(stream))) => {
            let mut inflight = inflight;
            let ledger = inflight.take_ledger();
            inflight.disarm();
            let log = session.new_stream();
            forward::spawn_relay(app, &session, u, method, &call_raw, started, deadline, ledger, stream, log.clone());
            let (tx, rx) = mpsc::channel(64);
            tokio::spawn(log.clone().reader(None, tx));
            let round = Round {
                app: app.clone(),
                method,
                session,
                tenant: who.tenant.name.to_string(),
                caller: who.key_prefix.to_string(),
                client_token,
                upstream: u,
                stream: log.stream,
                client_id: id.to_owned(),
                call_id,
                sampling: valid.declares("sampling"),
                elicitation: valid.declares("elicitation"),
                roots: valid.declares("roots"),
                log_rank: valid.log_rank(),
            };
            round.respond(rx).await
        }
    }
}

/// A later round of a bridged call: the client's answers go to the upstream,
/// and the call's stream is read on from where the last round ended.
#[allow(clippy::too_many_arguments)]
async fn resume(
    app: &Arc<App>,
    who: &Principal,
    valid: &Validated<'_>,
    method: Method,
    id: &RawValue,
    (sealed, responses): Retry,
    client_token: Option<Box<str>>,
    started: Instant,
) -> Response<Body> {
    let result = async {
        let key = app.state_key().await;
        let state = RoundState::open(&sealed, &key, switchboard_core::time::now_ms() as u64)?;
        if state.tenant != *who.tenant.name || state.caller != *who.key_prefix {
            return Err(Error::InvalidRequestState("not one this router issued".into()));
        }
        let session =
            app.sessions.find(&state.session).await?.filter(|s| s.tenant == who.tenant.name).ok_or_else(|| {
                Error::InvalidRequestState("the call it continues is over; send the request again".into())
            })?;
        let wanted =
            jsonrpc::as_str(&RawValue::from_string(state.key.clone()).map_err(|_| Error::Internal("key".into()))?)
                .map(Cow::into_owned)
                .unwrap_or_default();
        // Only the request this round asked about is answered: other keys
        // are ignored (they could name another call's requests).
        let Some(response) = responses.get(&wanted) else {
            return Err(Error::InvalidParams(format!("inputResponses must answer {wanted:?}")));
        };
        let u = {
            let raw = RawValue::from_string(state.key.clone()).map_err(|_| Error::Internal("key".into()))?;
            let Some((u, their_id)) = session.answered(&raw) else {
                return Err(Error::InvalidRequestState("not one this router issued".into()));
            };
            let channel = session
                .existing_channel(u)
                .await
                .ok_or_else(|| Error::InvalidRequestState("the upstream session of the call is gone".into()))?;
            let message = jsonrpc::result_response(
                &RawValue::from_string(their_id.to_string()).expect("JSON"),
                response.get().as_bytes(),
            );
            channel.send(message).await.map_err(|e| Error::upstream(&app.upstreams[u].name, e))?;
            u
        };
        session.touch();
        let rx =
            session.open_get(Some(EventId { stream: state.stream, seq: state.seq })).await.map_err(|e| match e {
                SessionError::UnknownStream => {
                    Error::InvalidRequestState("the call it continues is over; send the request again".into())
                }
                e => e.into(),
            })?;
        Ok((session, state, rx, u))
    }
    .await;
    match result {
        Err(e) => {
            app.metrics.request(method, None).record(Outcome::Rejected, started.elapsed());
            respond::error(Some(id), &e)
        }
        Ok((session, state, rx, u)) => {
            app.metrics.request(method, Some(u)).record(Outcome::Ok, started.elapsed());
            let round = Round {
                app: app.clone(),
                method,
                session,
                tenant: who.tenant.name.to_string(),
                caller: who.key_prefix.to_string(),
                client_token,
                upstream: u,
                stream: state.stream,
                client_id: id.to_owned(),
                call_id: state.call_id,
                sampling: valid.declares("sampling"),
                elicitation: valid.declares("elicitation"),
                roots: valid.declares("roots"),
                log_rank: valid.log_rank(),
            };
            round.respond(rx).await
        }
    }
}

/// One round of a bridged call: reads the call's event stream and answers
/// the client.
struct Round {
    app: Arc<App>,
    method: Method,
    session: Arc<Session>,
    tenant: String,
    caller: String,
    /// The client's progress token (JSON), in place of the call's own.
    client_token: Option<Box<str>>,
    upstream: UpstreamId,
    stream: u64,
    client_id: Box<RawValue>,
    call_id: String,
    sampling: bool,
    elicitation: bool,
    roots: bool,
    log_rank: Option<usize>,
}

/// What a round makes of one event.
enum Frame {
    /// A notification for the client (progress, a log message).
    Note(Bytes),
    /// The round's answer: the call's result, or `input_required`.
    Last(Bytes),
    /// The round's answer is an error with its own HTTP status.
    Refused(Error),
}

impl Round {
    /// A progress notification with the client's own token in place of the
    /// call's.
    fn with_client_token(&self, data: &Bytes) -> Bytes {
        let Some(token) = &self.client_token else { return data.clone() };
        let Ok(mut value) = serde_json::from_slice::<Value>(data) else { return data.clone() };
        let Ok(token) = serde_json::from_str::<Value>(token) else { return data.clone() };
        match value.pointer_mut("/params/progressToken") {
            Some(at) => *at = token,
            None => return data.clone(),
        }
        Bytes::from(serde_json::to_vec(&value).expect("serializable"))
    }

    /// Answers the client: as JSON if the round ends before any
    /// notification, else as an SSE stream.
    async fn respond(self, mut rx: mpsc::Receiver<Bytes>) -> Response<Body> {
        let keep_alive = self.app.config.server.keep_alive;
        let this = Arc::new(self);
        // A client that hangs up before the first event (this future is
        // dropped) cancels the call too.
        struct CancelOnDrop(Option<Arc<Round>>);
        impl Drop for CancelOnDrop {
            fn drop(&mut self) {
                if let Some(round) = self.0.take() {
                    round.hung_up();
                }
            }
        }
        let mut waiting = CancelOnDrop(Some(this.clone()));
        let first = loop {
            match rx.recv().await {
                None => break None,
                Some(event) => {
                    if let Some(frame) = this.frame(&event).await {
                        break Some(frame);
                    }
                }
            }
        };
        waiting.0 = None;
        let first = match first {
            None => return respond::error(Some(&this.client_id), &this.closed()),
            Some(Frame::Last(message)) => return respond::json(message),
            Some(Frame::Refused(e)) => return respond::error(Some(&this.client_id), &e),
            Some(Frame::Note(note)) => note,
        };
        let (tx, out) = mpsc::channel(64);
        let sse = |m: &[u8]| switchboard_protocol::sse::encode_event(None, None, m);
        let _ = tx.send(sse(&first)).await;
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = rx.recv() => event,
                    () = tx.closed() => {
                        this.hung_up();
                        return;
                    }
                };
                let Some(event) = event else {
                    let e = this.closed();
                    let _ = tx
                        .send(sse(&jsonrpc::error_response(Some(&this.client_id), e.code(), &e.to_string(), None)))
                        .await;
                    return;
                };
                let (message, last) = match this.frame(&event).await {
                    None => continue,
                    Some(Frame::Note(note)) => (note, false),
                    Some(Frame::Last(message)) => (message, true),
                    Some(Frame::Refused(e)) => (
                        jsonrpc::error_response(Some(&this.client_id), e.code(), &e.to_string(), e.data().as_ref()),
                        true,
                    ),
                };
                if tx.send(sse(&message)).await.is_err() {
                    if !last {
                        this.hung_up();
                    }
                    return;
                }
                if last {
                    return;
                }
            }
        });
        respond::sse(out, keep_alive)
    }

    /// The call's stream ended without an answer (its replica died, or it
    /// was taken over by a newer round).
    fn closed(&self) -> Error {
        Error::upstream(&self.app.upstreams[self.upstream].name, switchboard_upstream::UpstreamError::Closed)
    }

    /// A modern client hanging up cancels its call.
    fn hung_up(&self) {
        if let Ok(raw) = RawValue::from_string(self.call_id.clone()) {
            forward::cancel_upstream(&self.app, &self.session, self.upstream, &raw, "the client disconnected");
        }
    }

    /// One event of the call's stream (`id: S-N` and `data:` lines).
    async fn frame(&self, event: &[u8]) -> Option<Frame> {
        let mut seq = None;
        let mut data = BytesMut::new();
        for line in event.split(|&b| b == b'\n') {
            if let Some(id) = line.strip_prefix(b"id: ") {
                seq = std::str::from_utf8(id).ok().and_then(EventId::parse).map(|id| id.seq);
            } else if let Some(d) = line.strip_prefix(b"data: ").or_else(|| line.strip_prefix(b"data:")) {
                if !data.is_empty() {
                    data.put_u8(b'\n');
                }
                data.put_slice(d);
            }
        }
        if data.is_empty() {
            return None; // a priming event
        }
        let data = data.freeze();
        let env = Envelope::parse(&data).ok()?;
        match env.kind {
            MessageKind::Response | MessageKind::Error => {
                if env.id.is_some_and(|i| i.get() == self.call_id) {
                    Some(Frame::Last(for_client(&data, &self.client_id, self.method)))
                } else {
                    None
                }
            }
            MessageKind::Notification => match Method::from_name(env.method_str()) {
                // Only for a client that asked (with a token of its own).
                Method::Progress => self.client_token.is_some().then(|| Frame::Note(self.with_client_token(&data))),
                Method::LogMessage => {
                    let wanted = self.log_rank?;
                    #[derive(Deserialize)]
                    struct Level<'a> {
                        #[serde(borrow)]
                        level: Cow<'a, str>,
                    }
                    let level = env.params.and_then(|p| serde_json::from_str::<Level<'_>>(p.get()).ok())?;
                    (modern::log_rank(&level.level)? >= wanted).then(|| Frame::Note(data.clone()))
                }
                _ => None,
            },
            MessageKind::Request => {
                let key = env.id?.get().to_owned();
                let method = Method::from_name(env.method_str());
                let (needed, declared) = match method {
                    Method::SamplingCreateMessage => ("sampling", self.sampling),
                    Method::ElicitationCreate => ("elicitation", self.elicitation),
                    Method::RootsList => ("roots", self.roots),
                    // Anything else (ping) is answered here.
                    _ => {
                        self.answer_upstream(&key, Ok(b"{}")).await;
                        return None;
                    }
                };
                if !declared {
                    self.answer_upstream(&key, Err(needed)).await;
                    if let Ok(raw) = RawValue::from_string(self.call_id.clone()) {
                        forward::cancel_upstream(&self.app, &self.session, self.upstream, &raw, "missing capability");
                    }
                    return Some(Frame::Refused(Error::MissingCapability(needed)));
                }
                let state = RoundState {
                    tenant: self.tenant.clone(),
                    caller: self.caller.clone(),
                    session: self.session.id.to_string(),
                    stream: self.stream,
                    seq: seq?,
                    call_id: self.call_id.clone(),
                    key: key.clone(),
                    expires_ms: switchboard_core::time::now_ms() as u64 + STATE_LIFETIME.as_millis() as u64,
                };
                let sealed = state.seal(&self.app.state_key().await);
                let params = env.params.map_or("{}", RawValue::get);
                let result = format!(
                    r#"{{"resultType":"input_required","inputRequests":{{{key}:{{"method":{},"params":{params}}}}},"requestState":{}}}"#,
                    String::from_utf8_lossy(&jsonrpc::json_string(env.method_str())),
                    String::from_utf8_lossy(&jsonrpc::json_string(&sealed)),
                );
                Some(Frame::Last(jsonrpc::result_response(&self.client_id, result.as_bytes())))
            }
        }
    }

    /// Answers a server request of the upstream here: a result, or an error
    /// naming the capability the client lacks.
    async fn answer_upstream(&self, key: &str, answer: Result<&[u8], &str>) {
        let Ok(raw) = RawValue::from_string(key.to_owned()) else { return };
        let Some((u, their_id)) = self.session.answered(&raw) else { return };
        let their: Box<RawValue> = match RawValue::from_string(their_id.to_string()) {
            Ok(raw) => raw,
            Err(_) => return,
        };
        let message = match answer {
            Ok(result) => jsonrpc::result_response(&their, result),
            Err(capability) => jsonrpc::error_response(
                Some(&their),
                jsonrpc::code::METHOD_NOT_FOUND,
                &format!("the client does not support {capability}"),
                None,
            ),
        };
        if let Some(channel) = self.session.existing_channel(u).await {
            let _ = channel.send(message).await;
        }
    }
}

/// A response from a session-based upstream as a modern client gets it:
/// the client's id, and `resultType: "complete"` in the result (with cache
/// hints that promise nothing for `resources/read`, which the era says
/// carries them: the upstream gave none).
fn for_client(message: &Bytes, client_id: &RawValue, method: Method) -> Bytes {
    let Ok(env) = Envelope::parse(message) else { return message.clone() };
    let Some(theirs) = env.id else { return message.clone() };
    let restored = splice(message, &mut [Edit::new(span(message, theirs.get()), client_id.get().as_bytes())]);
    stamp(restored, method == Method::ResourcesRead)
}

/// Adds `resultType: "complete"` to a result that has no `resultType`.
pub(crate) fn stamp_complete(message: Bytes) -> Bytes {
    stamp(message, false)
}

/// [`stamp_complete`], and with `cache` also `ttlMs: 0` and
/// `cacheScope: "private"`.
fn stamp(message: Bytes, cache: bool) -> Bytes {
    let Ok(env) = Envelope::parse(&message) else { return message };
    let Some(result) = env.result else { return message };
    let text = result.get();
    if !text.starts_with('{') {
        return message;
    }
    #[derive(Deserialize)]
    struct Keys<'a> {
        #[serde(borrow, rename = "resultType", default)]
        result_type: Option<&'a RawValue>,
    }
    if serde_json::from_str::<Keys<'_>>(text).ok().is_some_and(|k| k.result_type.is_some()) {
        return message;
    }
    let at = span(&message, text).start + 1;
    let empty = text[1..].trim_start().starts_with('}');
    let mut insert: Vec<u8> = br#""resultType":"complete""#.to_vec();
    if cache {
        insert.extend_from_slice(br#","ttlMs":0,"cacheScope":"private""#);
    }
    if !empty {
        insert.push(b',');
    }
    splice(&message, &mut [Edit::new(at..at, &insert)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const CALL: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"café","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}}}"#;

    #[test]
    fn era_is_decided_per_request() {
        let env = Envelope::parse(CALL.as_bytes()).unwrap();
        assert!(is_modern(&headers(&[("mcp-protocol-version", "2026-07-28")]), &env));
        assert!(is_modern(&headers(&[]), &env), "the body's _meta says so");
        assert!(!is_modern(&headers(&[("mcp-protocol-version", "2025-11-25")]), &env));
        assert!(!is_modern(&headers(&[("mcp-protocol-version", "2026-07-28"), ("mcp-session-id", "abc")]), &env));
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#;
        assert!(!is_modern(&headers(&[("mcp-protocol-version", "2026-07-28")]), &Envelope::parse(init).unwrap()));
        let bare = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{}}}"#;
        assert!(is_modern(&headers(&[("mcp-protocol-version", "2026-07-28")]), &Envelope::parse(bare).unwrap()));
    }

    #[test]
    fn headers_must_agree_with_the_body() {
        let env = Envelope::parse(CALL.as_bytes()).unwrap();
        let ok = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", " tools/call "),
            ("mcp-name", "=?base64?Y2Fmw6k=?="),
        ];
        let valid = validate(&headers(&ok), &env).unwrap();
        assert!(valid.declares("sampling") && !valid.declares("elicitation"));
        let code = |pairs: &[(&'static str, &str)]| {
            validate(&headers(pairs), &env).err().map(|e| (e.status().as_u16(), e.code()))
        };
        assert_eq!(code(&[ok[0], ("mcp-method", "tools/list"), ok[2]]), Some((400, -32020)));
        assert_eq!(
            code(&[ok[0], ("mcp-method", "Tools/Call"), ok[2]]),
            Some((400, -32020)),
            "values are case-sensitive"
        );
        assert_eq!(code(&[ok[0], ok[1]]), Some((400, -32020)), "Mcp-Name is required for tools/call");
        assert_eq!(code(&[ok[0], ok[1], ("mcp-name", "cafe")]), Some((400, -32020)));
        assert_eq!(code(&[("mcp-protocol-version", "2025-11-25"), ok[1], ok[2]]), Some((400, -32020)));
        let old = CALL.replace("\"2026-07-28\"", "\"2099-01-01\"");
        let env = Envelope::parse(old.as_bytes()).unwrap();
        let e = validate(&headers(&[("mcp-protocol-version", "2099-01-01"), ok[1], ok[2]]), &env).err().unwrap();
        assert_eq!((e.status().as_u16(), e.code()), (400, -32022));
        assert_eq!(e.data().unwrap()["supported"][0], "2026-07-28");
        let bare = br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#;
        let e =
            validate(&headers(&[ok[0], ("mcp-method", "tools/list")]), &Envelope::parse(bare).unwrap()).err().unwrap();
        assert_eq!((e.status().as_u16(), e.code()), (400, -32602));
    }

    #[test]
    fn header_values_round_trip() {
        assert_eq!(header_value("plain_tool").to_str().unwrap(), "plain_tool");
        let encoded = header_value("café");
        let h = {
            let mut h = HeaderMap::new();
            h.insert(MCP_NAME.clone(), encoded);
            h
        };
        assert_eq!(header_text(&h, &MCP_NAME).as_deref(), Some("café"));
    }

    #[test]
    fn results_are_stamped_once() {
        let stamped = stamp_complete(Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#));
        assert_eq!(&stamped[..], br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","content":[]}}"#);
        assert_eq!(stamp_complete(stamped.clone()), stamped);
        let empty = stamp_complete(Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{ }}"#));
        assert_eq!(&empty[..], br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete" }}"#);
        let error = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#);
        assert_eq!(stamp_complete(error.clone()), error);
        let restored = for_client(
            &Bytes::from_static(br#"{"jsonrpc":"2.0","id":"sb.1","result":{}}"#),
            &RawValue::from_string("7".into()).unwrap(),
            Method::ToolsCall,
        );
        assert_eq!(&restored[..], br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete"}}"#);
        let read = for_client(
            &Bytes::from_static(br#"{"jsonrpc":"2.0","id":"sb.1","result":{"contents":[]}}"#),
            &RawValue::from_string("7".into()).unwrap(),
            Method::ResourcesRead,
        );
        assert_eq!(
            &read[..],
            br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","ttlMs":0,"cacheScope":"private","contents":[]}}"#
        );
    }

    #[test]
    fn request_state_is_sealed() {
        let key = [7u8; 32];
        let state = RoundState {
            tenant: "acme".into(),
            caller: "sb_abcdefgh".into(),
            session: "t.abc".into(),
            stream: 5,
            seq: 2,
            call_id: "\"sb.1\"".into(),
            key: "\"0.n1\"".into(),
            expires_ms: 2_000,
        };
        let sealed = state.seal(&key);
        assert_eq!(RoundState::open(&sealed, &key, 1_000).unwrap(), state);
        assert!(matches!(RoundState::open(&sealed, &key, 3_000), Err(Error::InvalidRequestState(_))), "expired");
        assert!(RoundState::open(&sealed, &[8u8; 32], 1_000).is_err(), "another key");
        let (payload, mac) = sealed.split_once('.').unwrap();
        let mut forged = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
        forged[0] = b'b';
        let forged = format!("{}.{mac}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(forged));
        assert!(RoundState::open(&forged, &key, 1_000).is_err(), "tampered");
        assert!(RoundState::open("garbage", &key, 1_000).is_err());
    }
}
