//! MCP 2026-07-28 clients: stateless requests.
//!
//! A POST is stateless when it names no session, is not `initialize`, and
//! its `MCP-Protocol-Version` header (or, without one, its `params._meta`)
//! says 2026-07-28 or later ([`is_stateless`]); everything else takes the
//! session path of `mod.rs`. Both eras share one endpoint, the transport
//! checks, the authentication, the rate limits and the audit.
//!
//! A stateless request goes through the same phases as a session's, with
//! validation in place of the session phase:
//!
//! 1. validate ([`validate`]): `params._meta` carries the protocol version and
//!    the client's capabilities; the `MCP-Protocol-Version`, `Mcp-Method`
//!    and `Mcp-Name` headers agree with the body (400 and -32020 if not);
//!    the version is one we speak (400 and -32022 with the supported list);
//! 2. authenticate and admit, as for sessions;
//! 3. route: `server/discover` and the lists are answered here (with
//!    `resultType`, `ttlMs` and `cacheScope`); `tools/call`, `prompts/get`,
//!    `resources/read` and `completion/complete` are forwarded;
//!    `subscriptions/listen` opens a stream of list changes; the methods the
//!    era removed (`initialize` aside, which is always a session's) and
//!    unknown ones are 404 and -32601.
//!
//! Forwarding depends on the upstream's era. A stateless upstream gets the
//! request as it came, but for the rewritten name and its own `Mcp-Name`
//! header (with `Mcp-Param-*` headers passed on), and its answer comes back
//! untouched: `input_required` results and their `requestState` included.
//! A session-era upstream is bridged (`bridge.rs`).

mod bridge;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use switchboard_core::policy::Principal;
use switchboard_core::Outcome;
use switchboard_protocol::jsonrpc::{self, span, Envelope, MessageKind};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::modern::{self, RequestMeta};
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::{Method, ProtocolVersion};
use tokio::sync::{broadcast, mpsc};

use super::resolve::{self, Resolution, Resolved};
use super::stateless_upstream::upstream_headers;
use super::{lists, respond};
use crate::app::{App, Change};
use crate::body::Body;
use crate::error::Error;
use crate::exchange::Exchange;
use crate::headers::{Header, Headers};
use switchboard_upstream::{ModernAnswer, Reply, UpstreamError};

/// Whether a POST is a stateless request (see the module docs).
pub fn is_stateless(headers: Headers<'_>, env: &Envelope<'_>) -> bool {
    if headers.contains(Header::McpSessionId) {
        return false;
    }
    // A session client's `initialize` names the version it wants; one that
    // does not, sent statelessly, asks for a method the era removed (404).
    if env.method_str() == "initialize" && initialize_names_a_version(env) {
        return false;
    }
    let body_says = || match env.target() {
        Some(Ok(target)) => modern::target_meta(target).ok().flatten().is_some_and(|m| m.protocol_version.is_some()),
        _ => modern::request_meta(env.params).ok().flatten().is_some_and(|m| m.protocol_version.is_some()),
    };
    match headers.text(Header::McpProtocolVersion) {
        Some(value) => match ProtocolVersion::parse(modern::trim(value.unwrap_or(""))) {
            Some(v) => v.is_modern(),
            // A version we do not know: stateless if the body says it is one.
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
pub(crate) fn header_text(headers: Headers<'_>, name: Header) -> Option<Cow<'_, str>> {
    modern::header_text(headers.get(name)?)
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
pub fn validate<'a>(headers: Headers<'_>, env: &Envelope<'a>) -> Result<Validated<'a>, Error> {
    let method = env.method_str();
    // `params._meta` as the envelope's read of `params` found it (an
    // object's, read once for every phase), else read here.
    let meta = match env.target() {
        Some(Ok(target)) if env.params.is_some_and(|p| p.get().starts_with('{')) => modern::target_meta(target),
        _ => modern::request_meta(env.params),
    };
    let meta = meta
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
    match header_text(headers, Header::McpProtocolVersion) {
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
    match header_text(headers, Header::McpMethod) {
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
        let target = env.target().and_then(Result::ok);
        let raw = target.and_then(|t| if field == "name" { t.name } else { t.uri });
        let body = raw.and_then(jsonrpc::as_str);
        match (header_text(headers, Header::McpName), body) {
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
///
/// This and the phases it awaits on the way to an upstream are functions
/// returning an async block, with the rare ways boxed, as the session
/// path's are (`post_phases`): each async level is copied whole when
/// awaited, and an async fn holds its arguments twice.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
pub fn post<'a, 'e>(
    mut x: Exchange,
    headers: Headers<'a>,
    env: &'a Envelope<'e>,
    body: &'a Bytes,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'e> {
    async move {
        if env.kind != MessageKind::Request {
            if let Err(e) = x.authenticate(headers).await {
                return x.refuse(headers, Some(env), body.len(), e, "POST");
            }
            // Nothing for a stateless server to take: notifications are dropped,
            // and there are no server requests for a response to answer.
            if env.kind == MessageKind::Notification {
                x.discard();
                return respond::accepted();
            }
            return x.reject(env.id, Error::InvalidParams("no request of the router awaits this answer".into()));
        }
        let id = env.id.expect("a request has an id");
        // In place of the session phase: the request says all about its client.
        let valid = match validate(headers, env) {
            Ok(valid) => valid,
            Err(e) => return x.reject(Some(id), e),
        };
        let who = match x.authenticate(headers).await {
            Ok(who) => who,
            Err(e) => return x.refuse(headers, Some(env), body.len(), e, "POST"),
        };
        // Progressive discovery's call meta-tool: the call of the tool it names
        // from here on (its headers named the meta-tool, and were checked).
        let separator = &x.app().config.catalog.separator;
        match crate::tools::meta::unwrap_call(env, body, separator) {
            Err(e) => x.reject(Some(id), e),
            Ok(None) => authenticated(x, headers, &valid, who, env, body).await,
            // Boxed: the meta-tool's way is the rare one.
            Ok(Some(inner)) => {
                Box::pin(async move {
                    match Envelope::parse(&inner) {
                        Ok(inner_env) => {
                            x.set_unwrapped();
                            authenticated(x, headers, &valid, who, &inner_env, &inner).await
                        }
                        Err(e) => x.reject(Some(id), Error::Parse(e)),
                    }
                })
                .await
            }
        }
    }
}

/// [`post`] once its headers are checked and its caller known.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
fn authenticated<'a, 'e>(
    mut x: Exchange,
    headers: Headers<'a>,
    valid: &'a Validated<'e>,
    who: Principal,
    env: &'a Envelope<'e>,
    body: &'a Bytes,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'e> {
    async move {
        let id = env.id.expect("a request has an id");
        if let Err(e) = x.admit(env).await {
            return x.refuse(headers, Some(env), body.len(), e, "POST");
        }
        let method = Method::from_name(env.method_str());
        x.set_method(method);
        let app = x.app().clone();
        match method {
            // Boxed, as every way but the forwarded call's.
            Method::ServerDiscover => {
                let result = Box::pin(discover(&app, &who, id)).await;
                x.answer(id, result)
            }
            Method::ToolsList | Method::PromptsList | Method::ResourcesList | Method::ResourcesTemplatesList => {
                let result = Box::pin(async {
                    let kind = lists::kind_of(method);
                    // Fetched first, so that the cache hint counts from this fetch.
                    app.catalog.ensure_for(&[kind], |u| who.tenant.sees_upstream(u)).await;
                    let tail = result_tail(&app, &who, true);
                    lists::list(&app, &who, kind, id, env.params, &tail).await
                })
                .await;
                x.answer(id, result)
            }
            Method::SubscriptionsListen => {
                let result = listen(&app, &who, id, env.params);
                x.answer(id, result)
            }
            Method::ToolsCall | Method::PromptsGet | Method::ResourcesRead | Method::CompletionComplete => {
                if let Err(e) = x.open_books(headers, env, body.len()) {
                    return x.refuse(headers, Some(env), body.len(), e, "POST");
                }
                if method == Method::ToolsCall && super::may_be_meta_tool(&x) {
                    x = match Box::pin(super::meta_tool(x, None, env)).await {
                        Ok(answered) => return answered,
                        Err(x) => x,
                    };
                }
                call(x, headers, valid, method, env, body).await
            }
            _ => {
                x.set_method(Method::Other);
                x.fail_as(Some(id), &Error::NoSuchMethod(env.method_str().to_owned()), Outcome::Rejected)
            }
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
        let public = who.tenant.unrestricted() && who.key_id.is_empty();
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
    let snapshot = app.catalog.ensure_once_for(&[ListKind::Tools], |u| who.tenant.sees_upstream(u)).await;
    let mut result = json!({
        "supportedVersions": switchboard_protocol::version::supported(),
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

/// A forwarded request: to a stateless upstream as it is, to a session-era
/// one bridged.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
fn call<'a, 'e>(
    mut x: Exchange,
    headers: Headers<'a>,
    valid: &'a Validated<'e>,
    method: Method,
    env: &'a Envelope<'e>,
    body: &'a Bytes,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'e> {
    async move {
        let id = env.id.expect("a request has an id");
        let app = x.app().clone();
        let who = x.principal().expect("authenticated").clone();
        let traceparent = x.upstream_traceparent();
        let resolved = match resolve::resolve(&app, &who, method, env, body, traceparent.as_deref()).await {
            Ok(Resolution::Upstream(mut resolved)) => {
                if let Some(named) = resolved.target.take() {
                    x.set_target(named);
                }
                resolved
            }
            Ok(Resolution::Local(tool, named)) => {
                x.set_target(named);
                return respond::json(stamp_complete(Box::pin(resolve::call_local(x, tool, id)).await));
            }
            Err(e) => {
                let outcome =
                    if e.side() == crate::error::Side::Upstream { Outcome::UpstreamFailed } else { Outcome::Rejected };
                return x.fail_as(Some(id), &e, outcome);
            }
        };
        let u = resolved.upstream;
        if super::authorize::era_catalog(&app, &who, u).is_modern(u) {
            x.served_by(u);
            return passthrough(x, headers, method, env, resolved).await;
        }
        if let Some(state) = bridge::retry_state(env) {
            // The first round's record covers the call.
            x.close_books();
            return match state {
                Ok(state) => {
                    let client_token = resolved.progress_token.as_ref().map(|r| bridge::token_text(&resolved.body, r));
                    Box::pin(bridge::resume(x, valid, method, id, state, client_token)).await
                }
                Err(e) => {
                    x.served_by(u);
                    x.fail_as(Some(id), &e, Outcome::Rejected)
                }
            };
        }
        x.served_by(u);
        // Boxed, as `resume` above: a bridged call's future (several kilobytes)
        // held inline made every stateless request's as large, and each was
        // copied whole where it was made.
        Box::pin(bridge::bridged(x, valid, method, id, resolved)).await
    }
}

/// To a stateless upstream: the request as it came, with the rewritten name,
/// and its answer as it comes (status, `input_required`, streams).
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see post_phases)")]
fn passthrough<'a, 'e>(
    mut x: Exchange,
    headers: Headers<'a>,
    method: Method,
    env: &'a Envelope<'e>,
    resolved: Resolved,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'e> {
    async move {
        let id = env.id.expect("a request has an id");
        let app = x.app().clone();
        let who = x.principal().expect("authenticated").clone();
        let u = resolved.upstream;
        let upstream = &app.upstreams[u];
        let mut extra = upstream_headers(method, x.target().map(|n| &*n.original), Some(headers));
        if let Some(traceparent) = resolved.traceparent.clone() {
            extra.push((http::HeaderName::from_static("traceparent"), traceparent));
        }
        let now = tokio::time::Instant::now();
        x.upstream_sent(now.into_std());
        // The id as sent, read where it is in the body (shared, not copied): an
        // answer's is held to it. Owned only by a stream's task.
        let sent_body = resolved.body.clone();
        let sent: &RawValue = serde_json::from_slice(&sent_body[resolved.id.clone()]).expect("the id is JSON");
        // The caller's credential (its user's, else its tenant's), asked now.
        let required = upstream.config.credential_required;
        let credential = app.keychain.current(&who.tenant.name, who.user.as_deref(), &upstream.name, required);
        let answer = {
            let work = std::pin::pin!(async {
                let credential = credential.map_err(|missing| UpstreamError::Credential(missing.0))?;
                let (body, tenant, credential) = (resolved.body, &who.tenant.name, credential.as_deref());
                match upstream.transport.stateless_http() {
                    Some(http) => http.stateless(body, method, extra, tenant, credential).await,
                    None => upstream.transport.modern(body, method, extra, tenant, credential).await,
                }
            });
            // Its deadline kept by the connection's timer, as a session call's
            // is (crate::deadline), not a timer entry of its own.
            match crate::deadline::until(now + upstream.config.timeout, work).await {
                Err(_) => {
                    Err(Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout })
                }
                Ok(Err(e)) => Err(Error::upstream(&upstream.name, e)),
                Ok(Ok(answer)) => Ok(answer),
            }
        };
        match answer {
            Err(e) => {
                let outcome = e.outcome();
                x.fail_as(Some(id), &e, outcome)
            }
            Ok(ModernAnswer { status, reply: Reply::Done(message), scanned }) => {
                let Some((message, outcome)) =
                    resolve::parse_scanned_answer(&app, u, method, &message, scanned, sent, id)
                else {
                    let e = super::resolve::not_the_answer(&app, u);
                    return x.fail_as(Some(id), &e, Outcome::UpstreamFailed);
                };
                x.add_sent(message.len());
                x.finish(outcome, resolve::error_code(outcome, &message));
                let mut response = respond::json(message);
                *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                response
            }
            Ok(ModernAnswer { reply: Reply::Stream(mut stream), .. }) => {
                let (tx, rx) = mpsc::channel(64);
                let keep_alive = app.config.server.keep_alive;
                let deadline = tokio::time::Instant::now() + upstream.config.timeout;
                let (name, timeout) = (upstream.name.clone(), upstream.config.timeout);
                let client_id = id.to_owned();
                let sent = sent.to_owned();
                tokio::spawn(async move {
                    // Ends the client's stream with an error in place of the answer.
                    let fail = |e: Error| {
                        let message =
                            jsonrpc::error_response(Some(&client_id), e.code(), &e.to_string(), e.data().as_ref());
                        (switchboard_protocol::sse::encode_event(None, None, &message), e.code())
                    };
                    let (outcome, code) = loop {
                        let next = tokio::select! {
                            next = tokio::time::timeout_at(deadline, stream.next()) => next,
                            // A stateless client hanging up cancels: the upstream
                            // sees its stream close when this task drops it.
                            _ = tx.closed() => break (Outcome::Abandoned, None),
                        };
                        let next = match next {
                            Ok(next) => next,
                            Err(_) => {
                                let (event, code) =
                                    fail(Error::UpstreamTimeout { upstream: name.clone(), after: timeout });
                                let _ = tx.send(event).await;
                                break (Outcome::Timeout, Some(code));
                            }
                        };
                        match next {
                            Some(Ok(message)) => {
                                let last = Envelope::parse(&message).is_ok_and(|e| e.method.is_none());
                                let (message, answered) = match last {
                                    false => (message, Outcome::Ok),
                                    true => match resolve::parse_answer(&app, u, method, &message, &sent, &client_id) {
                                        Some(answer) => answer,
                                        None => {
                                            app.metrics.upstreams.relay_dropped(&name, "stray_response");
                                            continue;
                                        }
                                    },
                                };
                                x.add_sent(message.len());
                                let event = switchboard_protocol::sse::encode_event(None, None, &message);
                                if tx.send(event).await.is_err() {
                                    // A stateless client hanging up cancels: the
                                    // upstream sees its stream close.
                                    break (Outcome::Abandoned, None);
                                }
                                if last {
                                    break (answered, resolve::error_code(answered, &message));
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
                    x.finish(outcome, code);
                });
                respond::sse(rx, keep_alive)
            }
        }
    }
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
    use crate::downstream::stateless_upstream::header_value;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> Headers<'static> {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        Headers::Map(Box::leak(Box::new(h)))
    }

    const CALL: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"café","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}}}"#;

    #[test]
    fn era_is_decided_per_request() {
        let env = Envelope::parse(CALL.as_bytes()).unwrap();
        assert!(is_stateless(headers(&[("mcp-protocol-version", "2026-07-28")]), &env));
        assert!(is_stateless(headers(&[]), &env), "the body's _meta says so");
        assert!(!is_stateless(headers(&[("mcp-protocol-version", "2025-11-25")]), &env));
        assert!(!is_stateless(headers(&[("mcp-protocol-version", "2026-07-28"), ("mcp-session-id", "abc")]), &env));
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#;
        assert!(!is_stateless(headers(&[("mcp-protocol-version", "2026-07-28")]), &Envelope::parse(init).unwrap()));
        let bare = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{}}}"#;
        assert!(is_stateless(headers(&[("mcp-protocol-version", "2026-07-28")]), &Envelope::parse(bare).unwrap()));
    }

    #[test]
    fn headers_must_agree_with_the_body() {
        let env = Envelope::parse(CALL.as_bytes()).unwrap();
        let ok = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", " tools/call "),
            ("mcp-name", "=?base64?Y2Fmw6k=?="),
        ];
        let valid = validate(headers(&ok), &env).unwrap();
        assert!(valid.declares("sampling") && !valid.declares("elicitation"));
        let code = |pairs: &[(&'static str, &str)]| {
            validate(headers(pairs), &env).err().map(|e| (e.status().as_u16(), e.code()))
        };
        assert_eq!(code(&[ok[0], ("mcp-method", "tools/list"), ok[2]]), Some((400, -32020)));
        assert_eq!(
            code(&[ok[0], ("mcp-method", "Tools/Call"), ok[2]]),
            Some((400, -32020)),
            "values are case-sensitive"
        );
        assert_eq!(code(&[ok[0], ok[1]]), Some((400, -32020)), "Mcp-Name is required for tools/call");
        // The refusal names the header the client must fix.
        let missing = validate(headers(&[ok[0], ok[1]]), &env).err().unwrap().to_string();
        assert!(missing.contains("the Mcp-Name header is required"), "{missing}");
        let differs = validate(headers(&[ok[0], ok[1], ("mcp-name", "cafe")]), &env).err().unwrap().to_string();
        assert!(differs.contains("Mcp-Name header \"cafe\" does not match"), "{differs}");
        assert_eq!(code(&[ok[0], ok[1], ("mcp-name", "cafe")]), Some((400, -32020)));
        assert_eq!(code(&[("mcp-protocol-version", "2025-11-25"), ok[1], ok[2]]), Some((400, -32020)));
        let old = CALL.replace("\"2026-07-28\"", "\"2099-01-01\"");
        let env = Envelope::parse(old.as_bytes()).unwrap();
        let e = validate(headers(&[("mcp-protocol-version", "2099-01-01"), ok[1], ok[2]]), &env).err().unwrap();
        assert_eq!((e.status().as_u16(), e.code()), (400, -32022));
        assert_eq!(e.data().unwrap()["supported"][0], "2026-07-28");
        let bare = br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#;
        let e =
            validate(headers(&[ok[0], ("mcp-method", "tools/list")]), &Envelope::parse(bare).unwrap()).err().unwrap();
        assert_eq!((e.status().as_u16(), e.code()), (400, -32602));
    }

    #[test]
    fn header_values_round_trip() {
        assert_eq!(header_value("plain_tool").to_str().unwrap(), "plain_tool");
        let encoded = header_value("café");
        let mut h = http::HeaderMap::new();
        h.insert("mcp-name", encoded);
        assert_eq!(header_text(Headers::Map(&h), Header::McpName).as_deref(), Some("café"));
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
    }
}
