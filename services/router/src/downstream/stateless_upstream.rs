//! Session clients' requests to stateless (2026-07-28) upstreams: the other
//! way round from `stateless_client`'s bridge.
//!
//! A 2026-07-28 upstream keeps no session, so a session client's request
//! reaches it as a stateless request: `params._meta` gets the protocol
//! version, the client's capabilities (from its `initialize`) and its log
//! level (from `logging/setLevel`); the headers get `Mcp-Method` and
//! `Mcp-Name`. Progress and log notifications come back on the request's
//! stream. An `input_required` result becomes server-to-client requests on
//! that stream (or the session's GET stream, for a client that takes only
//! JSON), one per input request, with router ids (`m.…`); when the client
//! has answered them all, the request is sent again with `inputResponses`
//! and the upstream's `requestState` untouched, until the upstream completes
//! it. An answer may reach another replica: it is passed on through Redis
//! to the replica waiting for it (`App::deliver_answer`).

use std::sync::Arc;
use switchboard_core::UpstreamId;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::modern;
use switchboard_protocol::Method;
use tokio::sync::mpsc;

use super::resolve::{self, Resolved};
use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use crate::exchange::Exchange;
use crate::headers::Headers;
use switchboard_core::Outcome;
use switchboard_session::events::Log;
use switchboard_session::Session;
use switchboard_upstream::{ModernAnswer, Reply, UpstreamError};

/// Forwards one request of `session` to the stateless upstream `resolved`
/// names; the exchange is finished when the last round ends.
pub(super) async fn forward(
    x: Exchange,
    session: &Arc<Session>,
    method: Method,
    id: &RawValue,
    resolved: Resolved,
    accepts_sse: bool,
) -> Response<Body> {
    let u = resolved.upstream;
    let app = x.app().clone();
    let request = match with_meta(&resolved.body, session) {
        Ok(request) => request,
        Err(e) => return x.fail_as(Some(id), &e, Outcome::Rejected),
    };
    let mut headers = upstream_headers(method, x.target().map(|n| &*n.original), None);
    if let Some(traceparent) = resolved.traceparent.clone() {
        headers.push((http::HeaderName::from_static("traceparent"), traceparent));
    }
    let mut x = x;
    x.upstream_sent(std::time::Instant::now());
    if method == Method::ToolsCall {
        headers.extend(mirrored_arguments(&app, u, &request));
    }
    let call = Call { x, session: session.clone(), upstream: u, method, id: id.to_owned(), headers };
    if accepts_sse {
        let log = session.new_stream();
        // No other replica can go on with a stateless upstream's rounds:
        // one taking the stream over answers the request with an error.
        let sent = &resolved.body[resolved.id.clone()];
        if let Ok(sent) = serde_json::from_slice::<&RawValue>(sent) {
            super::origin::record_origin(&app, &log, u, None, sent, method);
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(log.clone().reader(None, tx));
        tokio::spawn(async move {
            let message = call.run(request, Some(&log)).await;
            log.push(&message);
            log.close();
        });
        respond::sse(rx, app.config.server.keep_alive)
    } else {
        respond::json(call.run(request, None).await)
    }
}

/// `resources/subscribe` or `resources/unsubscribe` of a session client to
/// a stateless upstream, which has neither: kept as the session's
/// `subscriptions/listen` stream to that upstream, naming every URI the
/// client subscribed to there (`Session::subscribe_stateless`).
pub(super) async fn subscribe(
    mut x: Exchange,
    session: &Arc<Session>,
    method: Method,
    id: &RawValue,
    resolved: Resolved,
) -> Response<Body> {
    let uri = Envelope::parse(&resolved.body)
        .ok()
        .and_then(|env| env.params)
        .and_then(|p| Target::parse(p).ok())
        .and_then(|t| t.uri)
        .and_then(jsonrpc::as_str)
        .map(|uri| uri.into_owned());
    let Some(uri) = uri else {
        return x.fail_as(Some(id), &Error::InvalidParams("params.uri must be a string".into()), Outcome::Rejected);
    };
    match session.subscribe_stateless(resolved.upstream, &uri, method == Method::ResourcesSubscribe).await {
        Ok(()) => {
            let answer = jsonrpc::result_response(id, b"{}");
            x.add_sent(answer.len());
            x.finish(Outcome::Ok, None);
            respond::json(answer)
        }
        Err(e) => {
            let e = Error::from(e);
            let outcome = e.outcome();
            x.fail_as(Some(id), &e, outcome)
        }
    }
}

pub(crate) static MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// The headers of a request to a stateless upstream besides the version and
/// method: `Mcp-Name` (the upstream's own name or URI, `original`: the JSON
/// text resolution put in the request, [`Named::original`](crate::exchange::Named))
/// and the client's `Mcp-Param-*` headers, passed through. (Read from the
/// rewritten request instead, its envelope and `params` were parsed again
/// for it: about 8,800 instructions of a stateless call's 80,000.)
pub(crate) fn upstream_headers(
    method: Method,
    original: Option<&[u8]>,
    client: Option<Headers<'_>>,
) -> Vec<(HeaderName, http::HeaderValue)> {
    // Room for the two headers every request gets (`Transport::modern`).
    let mut extra = Vec::with_capacity(4);
    let named = matches!(method, Method::ToolsCall | Method::PromptsGet | Method::ResourcesRead);
    if let Some(name) = original.filter(|_| named).and_then(jsonrpc::json_text) {
        extra.push((MCP_NAME.clone(), header_value(&name)));
    }
    if let Some(client) = client {
        client.each_with_prefix(b"mcp-param-", |name, value| {
            // Both valid already (the head parser's checks are http's).
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
                extra.push((name, value));
            }
        });
    }
    extra
}

/// A header value for `text`: as is if it is visible ASCII, else in the
/// `=?base64?…?=` form.
pub(crate) fn header_value(text: &str) -> http::HeaderValue {
    http::HeaderValue::from_str(&modern::header_value_text(text)).expect("ASCII or base64 is a valid header value")
}

/// The request as the upstream gets it: `params._meta` with the era's keys.
fn with_meta(body: &[u8], session: &Session) -> Result<Value, Error> {
    let mut request: Value =
        serde_json::from_slice(body).map_err(|e| Error::InvalidParams(format!("the request: {e}")))?;
    let params = request
        .as_object_mut()
        .expect("a request is an object")
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(params) = params.as_object_mut() else {
        return Err(Error::InvalidParams("params must be an object".into()));
    };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return Err(Error::InvalidParams("params._meta must be an object".into()));
    };
    meta.insert(modern::META_PROTOCOL_VERSION.into(), Value::String("2026-07-28".into()));
    let capabilities = serde_json::from_str(session.capabilities.get()).unwrap_or_else(|_| json!({}));
    meta.insert(modern::META_CLIENT_CAPABILITIES.into(), capabilities);
    if let Some(level) = session.log_level() {
        meta.insert(modern::META_LOG_LEVEL.into(), Value::String(level));
    }
    Ok(request)
}

/// The schema key of an argument mirrored into a header.
const MIRROR_KEY: &[u8] = b"\"x-mcp-header\"";

/// The `Mcp-Param-*` headers a 2026-07-28 upstream expects of a
/// `tools/call`: the arguments its tool's input schema marks with
/// `x-mcp-header`, mirrored as the era says (a session client knows
/// nothing of them, so the router adds them). Only strings, numbers and
/// booleans are mirrored; strings that are not plain ASCII go as
/// `=?base64?…?=`.
fn mirrored_arguments(app: &App, u: UpstreamId, request: &Value) -> Vec<(HeaderName, HeaderValue)> {
    let Some(name) = request.pointer("/params/name").and_then(Value::as_str) else { return Vec::new() };
    let snapshot = app.catalog.current();
    let tools = snapshot.list(ListKind::Tools);
    // Only this upstream's span of the list; most tools mirror nothing, and
    // those are not parsed.
    let Some(&(_, first, count)) = tools.spans.iter().find(|(upstream, _, _)| *upstream == u) else {
        return Vec::new();
    };
    let Some(tool) = tools.items[first..first + count].iter().find(|t| &*t.name == name) else { return Vec::new() };
    if !tool.json.windows(MIRROR_KEY.len()).any(|w| w == MIRROR_KEY) {
        return Vec::new();
    }
    let Ok(tool) = serde_json::from_slice::<Value>(&tool.json) else { return Vec::new() };
    modern::mirrored_params(&tool, request.pointer("/params/arguments"))
        .into_iter()
        .filter_map(|(name, value)| {
            Some((HeaderName::from_bytes(name.as_bytes()).ok()?, HeaderValue::from_str(&value).ok()?))
        })
        .collect()
}

/// One request to a stateless upstream, over as many rounds as it takes.
struct Call {
    x: Exchange,
    session: Arc<Session>,
    upstream: UpstreamId,
    method: Method,
    id: Box<RawValue>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Call {
    /// Runs the rounds and returns the final message for the client
    /// (relaying notifications and input requests into `log` meanwhile).
    async fn run(mut self, mut request: Value, log: Option<&Arc<Log>>) -> Bytes {
        let app = self.x.app().clone();
        let upstream = app.upstreams[self.upstream].clone();
        let deadline = tokio::time::Instant::now() + upstream.config.timeout;
        let mut sent = 0usize;
        let result: Result<Bytes, (Error, Outcome)> = async {
            loop {
                let body = Bytes::from(serde_json::to_vec(&request).expect("serializable"));
                let credentials = self.session.credentials(self.upstream);
                let work = async {
                    let credential = switchboard_upstream::credential(credentials.as_ref())?;
                    let headers = self.headers.clone();
                    upstream.transport.modern(body, self.method, headers, &self.session.id, credential.as_deref()).await
                };
                let answer = match tokio::time::timeout_at(deadline, work).await {
                    Err(_) => {
                        let e =
                            Error::UpstreamTimeout { upstream: upstream.name.clone(), after: upstream.config.timeout };
                        return Err((e, Outcome::Timeout));
                    }
                    Ok(Err(e)) => {
                        let e = Error::upstream(&upstream.name, e);
                        let outcome = e.outcome();
                        return Err((e, outcome));
                    }
                    Ok(Ok(answer)) => answer,
                };
                let message = match answer {
                    ModernAnswer { reply: Reply::Done(message), .. } => message,
                    ModernAnswer { reply: Reply::Stream(mut stream), .. } => loop {
                        let next = tokio::time::timeout_at(deadline, stream.next()).await;
                        let message = match next {
                            Err(_) => {
                                let after = upstream.config.timeout;
                                return Err((
                                    Error::UpstreamTimeout { upstream: upstream.name.clone(), after },
                                    Outcome::Timeout,
                                ));
                            }
                            Ok(Some(Ok(message))) => message,
                            Ok(Some(Err(e))) => {
                                return Err((Error::upstream(&upstream.name, e), Outcome::UpstreamFailed))
                            }
                            Ok(None) => {
                                return Err((
                                    Error::upstream(&upstream.name, UpstreamError::Closed),
                                    Outcome::UpstreamFailed,
                                ))
                            }
                        };
                        let Ok(env) = Envelope::parse(&message) else { continue };
                        match env.kind {
                            MessageKind::Notification => {
                                if let Some(log) = log {
                                    if log.offer(&message, None) {
                                        sent += message.len();
                                    } else {
                                        let app = self.x.app();
                                        app.metrics.upstreams.relay_dropped(&upstream.name, "client_backlog");
                                    }
                                }
                            }
                            MessageKind::Response | MessageKind::Error
                                if env.id.is_some_and(|id| {
                                    serde_json::from_str::<Value>(id.get()).is_ok_and(|id| id == request["id"])
                                }) =>
                            {
                                break message
                            }
                            MessageKind::Response | MessageKind::Error => {
                                app.metrics.upstreams.relay_dropped(&upstream.name, "stray_response");
                            }
                            // No server requests on a stateless stream.
                            MessageKind::Request => {}
                        }
                    },
                };
                let mut value: Value = serde_json::from_slice(&message).map_err(|e| {
                    (
                        Error::upstream(
                            &upstream.name,
                            UpstreamError::Protocol(switchboard_upstream::Cause::from_error(e)),
                        ),
                        Outcome::UpstreamFailed,
                    )
                })?;
                if value.get("id") != Some(&request["id"]) {
                    return Err((super::resolve::not_the_answer(&app, self.upstream), Outcome::UpstreamFailed));
                }
                let input_required =
                    value.pointer("/result/resultType").and_then(Value::as_str) == Some("input_required");
                if !input_required {
                    if serde_json::to_string(&request["id"]).is_ok_and(|sent| sent == self.id.get()) {
                        return Ok(message);
                    }
                    // A retry's answer: under the client's id again.
                    value["id"] = serde_json::from_str(self.id.get()).unwrap_or(Value::Null);
                    return Ok(Bytes::from(serde_json::to_vec(&value).expect("serializable")));
                }
                let result = value.get_mut("result").map(Value::take).unwrap_or_default();
                let responses = self.ask(&result, log, deadline).await?;
                let params = request["params"].as_object_mut().expect("params is an object");
                params.insert("inputResponses".into(), Value::Object(responses));
                match result.get("requestState") {
                    Some(state) => params.insert("requestState".into(), state.clone()),
                    None => params.remove("requestState"),
                };
                // The era's retry is a new request: a new id.
                request["id"] = Value::String(format!("sb.r{}", &switchboard_core::ids::random_id()[..16]));
            }
        }
        .await;
        let (message, outcome, code) = match result {
            Ok(message) => {
                let (message, outcome) = resolve::classify(&app, self.upstream, self.method, message);
                let code = resolve::error_code(outcome, &message);
                // The client's id: the upstream answers the id it was sent.
                (message, outcome, code)
            }
            Err((e, outcome)) => {
                let message = jsonrpc::error_response(Some(&self.id), e.code(), &e.to_string(), e.data().as_ref());
                (message, outcome, Some(e.code()))
            }
        };
        self.x.add_sent(sent + message.len());
        self.x.finish(outcome, code);
        message
    }

    /// Asks the client for every input an `input_required` result names, as
    /// server requests, and collects the answers by key.
    async fn ask(
        &self,
        result: &Value,
        log: Option<&Arc<Log>>,
        deadline: tokio::time::Instant,
    ) -> Result<Map<String, Value>, (Error, Outcome)> {
        let upstream = &self.x.app().upstreams[self.upstream];
        let protocol = |why: String| {
            (Error::upstream(&upstream.name, UpstreamError::Protocol(why.into())), Outcome::UpstreamFailed)
        };
        let requests = result
            .get("inputRequests")
            .and_then(Value::as_object)
            .ok_or_else(|| protocol("input_required without inputRequests".into()))?;
        let mut waiting = Vec::with_capacity(requests.len());
        let declared: Value = serde_json::from_str(self.session.capabilities.get()).unwrap_or_default();
        for (key, input) in requests {
            let method = input
                .get("method")
                .and_then(Value::as_str)
                .ok_or_else(|| protocol(format!("input request {key:?} has no method")))?;
            // A session client is asked only what it declared it can answer
            // (its capabilities went upstream with the request; a server
            // that asks anyway gets the call failed, not the client a
            // request it cannot handle).
            let needs = match method {
                "sampling/createMessage" => Some("sampling"),
                "elicitation/create" => Some("elicitation"),
                "roots/list" => Some("roots"),
                _ => None,
            };
            if let Some(capability) = needs.filter(|c| declared.get(*c).is_none_or(Value::is_null)) {
                return Err(protocol(format!(
                    "it asked the client for {method}, but the client did not declare the {capability} capability"
                )));
            }
            let ours = format!("m.{}", switchboard_core::ids::random_id());
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let awaiting = self.x.app().await_answer(&self.session.id, &ours, left).await;
            let mut message = json!({"jsonrpc": "2.0", "id": ours, "method": method});
            if let Some(params) = input.get("params") {
                message["params"] = params.clone();
            }
            let message = serde_json::to_vec(&message).expect("serializable");
            let delivered = match log {
                Some(log) => log.offer(&message, None),
                None => self.session.push(Bytes::from(message), None),
            };
            if !delivered {
                let why = "the client is not reading the messages already waiting for it; the upstream's request for input could not be passed on";
                return Err((Error::Internal(why.into()), Outcome::UpstreamFailed));
            }
            waiting.push((key.clone(), awaiting));
        }
        let mut responses = Map::new();
        // Every entry still awaited is forgotten however this ends (a
        // timeout, a refusal, the client hanging up): `Awaiting` drops.
        for (key, awaiting) in &mut waiting {
            let key = std::mem::take(key);
            let answer = tokio::time::timeout_at(deadline, &mut awaiting.rx).await;
            let answer = match answer {
                Ok(Ok(answer)) => answer,
                _ => {
                    let after = upstream.config.timeout;
                    return Err((Error::UpstreamTimeout { upstream: upstream.name.clone(), after }, Outcome::Timeout));
                }
            };
            let mut value: Value = serde_json::from_slice(&answer).unwrap_or_default();
            match value.get_mut("result").map(Value::take) {
                Some(result) => {
                    responses.insert(key, result);
                }
                None => {
                    let why = value.pointer("/error/message").and_then(Value::as_str).unwrap_or("no result").to_owned();
                    return Err((
                        Error::InvalidParams(format!("the client refused the upstream's {key:?} request: {why}")),
                        Outcome::Error,
                    ));
                }
            }
        }
        Ok(responses)
    }
}
