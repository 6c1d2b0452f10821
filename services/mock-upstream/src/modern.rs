//! MCP 2026-07-28 ("modern", stateless) over Streamable HTTP, decided per
//! request next to the 2025 session-based path of `http.rs`.
//!
//! A modern request carries its protocol version and the client's
//! capabilities in `params._meta` and repeats the method (and the tool,
//! prompt or resource name) in headers. This module checks all that, answers
//! `server/discover` and `subscriptions/listen`, runs the input-needing tools
//! as `input_required` rounds (`mrtr.rs`) with a sealed `requestState`, and
//! hands everything else to the 2025 logic, adding the era's result members
//! (`resultType`, `ttlMs`/`cacheScope`, `_meta` serverInfo) to its answers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Map, Value};
use switchboard_protocol::jsonrpc::code;
use switchboard_protocol::sse;
use tokio::sync::mpsc;

use crate::body::Body;
use crate::listen::{frame, Filter, Listener, META_SERVER_INFO, META_SUBSCRIPTION};
use crate::mcp::Server;
use crate::mrtr::{self, Kind, Round, Step};
use crate::session::{Reply, SUPPORTED_VERSIONS};
use crate::{conformance, seal};

/// The version of this era.
pub const MODERN: &str = "2026-07-28";

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

const HEADER_MISMATCH: i64 = -32020;
const UNSUPPORTED_VERSION: i64 = -32022;

/// Methods of 2025 that this era removed: 404 like an unknown method.
const REMOVED: &[&str] = &["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];

/// Results that carry `ttlMs` and `cacheScope`.
const CACHEABLE: &[&str] =
    &["server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"];

/// How long a `requestState` stays valid.
const STATE_LIFETIME_SECS: u64 = 3600;

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// Whether a POST without a session id is a 2026-07-28 request: its
/// `MCP-Protocol-Version` header names a version other than the 2025 ones,
/// or its `params._meta` names one. `initialize` is always 2025.
pub(crate) fn wants(headers: &HeaderMap, body: &[u8]) -> bool {
    let header = header_str(headers, "mcp-protocol-version");
    let by_header = header.is_some_and(|v| !SUPPORTED_VERSIONS.contains(&v));
    let by_meta = !by_header && contains(body, META_VERSION.as_bytes());
    if !by_header && !by_meta {
        return false;
    }
    let Ok(message) = serde_json::from_slice::<Value>(body) else { return by_header };
    if message["method"] == "initialize" && message["params"]["protocolVersion"].is_string() {
        // A real handshake: the 2025 path negotiates its version.
        return false;
    }
    by_header || message["params"]["_meta"][META_VERSION].as_str().is_some_and(|v| !SUPPORTED_VERSIONS.contains(&v))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `GET` and `DELETE` have no meaning in this era.
pub(crate) fn is_modern_get(headers: &HeaderMap) -> bool {
    header_str(headers, "mcp-protocol-version") == Some(MODERN)
}

/// The 405 for a modern `GET` or `DELETE`.
pub(crate) fn method_not_allowed() -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

fn json_response(status: StatusCode, message: &Value) -> Response<Body> {
    let mut response = Response::new(Body::Full(Some(Bytes::from(message.to_string()))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A streamed answer of SSE frames: as SSE, or (`ndjson_streams`) as the
/// frames' messages, one JSON line each, in an `application/json` body.
fn sse_body(server: &Server, rx: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
    if server.opts.ndjson_streams {
        let (tx, lines) = mpsc::unbounded_channel();
        let mut frames = rx;
        tokio::spawn(async move {
            let mut decoder = sse::Decoder::new(usize::MAX);
            while let Some(frame) = frames.recv().await {
                decoder.push(&frame);
                while let Ok(Some(event)) = decoder.next_event() {
                    let mut line = event.data.to_vec();
                    line.push(b'\n');
                    if tx.send(Bytes::from(line)).is_err() {
                        return;
                    }
                }
            }
        });
        let mut response = Response::new(Body::Stream(lines));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    let mut response = Response::new(Body::Stream(rx));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn error(status: StatusCode, id: &Value, code: i64, message: &str, data: Option<Value>) -> Response<Body> {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    json_response(status, &json!({"jsonrpc": "2.0", "id": id, "error": error}))
}

fn server_info(server: &Server) -> Value {
    json!({"name": server.opts.name, "version": env!("CARGO_PKG_VERSION")})
}

/// Adds the era's members to a result of `method`.
fn decorate(server: &Server, method: &str, result: &mut Value) {
    let Some(object) = result.as_object_mut() else { return };
    object.entry("resultType").or_insert_with(|| json!("complete"));
    let meta = object.entry("_meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(META_SERVER_INFO.into(), server_info(server));
    }
    if CACHEABLE.contains(&method) {
        object.entry("ttlMs").or_insert_with(|| json!(server.opts.list_ttl_ms));
        object.entry("cacheScope").or_insert_with(|| json!("public"));
    }
}

fn ok(server: &Server, id: &Value, method: &str, mut result: Value) -> Response<Body> {
    decorate(server, method, &mut result);
    json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// The versions the mock says it speaks (in discovery and in -32022's
/// data): this era, then the 2025 ones (reached with `initialize`); only
/// this era with `--modern-only`, and with `--discover-2026-only` (which
/// serves the others all the same, as the official conformance server does).
fn supported(server: &Server) -> Vec<&'static str> {
    let mut all = vec![MODERN];
    if !server.opts.modern_only && !server.opts.discover_modern_only {
        all.extend(SUPPORTED_VERSIONS.iter().rev());
    }
    all
}

/// Answers one modern POST.
pub(crate) async fn post(server: Arc<Server>, headers: &HeaderMap, body: Bytes) -> Response<Body> {
    let null = Value::Null;
    let message: Value = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(e) => return error(StatusCode::BAD_REQUEST, &null, code::PARSE_ERROR, &format!("Parse error: {e}"), None),
    };
    if !message.is_object() {
        return error(StatusCode::BAD_REQUEST, &null, code::INVALID_REQUEST, "Invalid request: not one object", None);
    }
    let Some(method) = message["method"].as_str() else {
        // A response: this era has no server-to-client requests to answer.
        return accepted();
    };
    let Some(id) = message.get("id").filter(|id| id.is_string() || id.is_number()) else {
        if method == "notifications/cancelled" {
            server.stats.cancelled.lock().expect("lock").push(message["params"]["requestId"].to_string());
        }
        return accepted();
    };
    let params = message.get("params").cloned().unwrap_or_else(|| json!({}));
    if let Err(response) = validate(&server, headers, id, method, &params) {
        return *response;
    }
    if let Err(response) = check_param_headers(&server, headers, id, method, &params) {
        return *response;
    }
    let meta = &params["_meta"];
    match method {
        "server/discover" => ok(&server, id, method, discover(&server)),
        "subscriptions/listen" => listen(&server, id, &params),
        m if REMOVED.contains(&m) => {
            error(StatusCode::NOT_FOUND, id, code::METHOD_NOT_FOUND, &format!("Method not found: {m}"), None)
        }
        "tools/call" | "prompts/get" => {
            let kind = if method == "tools/call" { Kind::Tool } else { Kind::Prompt };
            let name = params["name"].as_str().unwrap_or_default();
            if kind == Kind::Tool {
                server.stats.calls.fetch_add(1, Ordering::Relaxed);
            }
            if mrtr::is_program(server.opts.conformance, kind, name) {
                return rounds(&server, id, method, kind, name, &params);
            }
            legacy(server.clone(), id, method, meta, body).await
        }
        "tools/list"
        | "prompts/list"
        | "resources/list"
        | "resources/templates/list"
        | "resources/read"
        | "completion/complete" => legacy(server.clone(), id, method, meta, body).await,
        other => error(StatusCode::NOT_FOUND, id, code::METHOD_NOT_FOUND, &format!("Method not found: {other}"), None),
    }
}

fn accepted() -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// The checks every modern request passes, in the era's order: `_meta`,
/// version header against `_meta`, the version itself, `Mcp-Method`,
/// `Mcp-Name`.
fn validate(
    server: &Server,
    headers: &HeaderMap,
    id: &Value,
    method: &str,
    params: &Value,
) -> Result<(), Box<Response<Body>>> {
    let bad = |code: i64, message: &str, data: Option<Value>| {
        Box::new(error(StatusCode::BAD_REQUEST, id, code, message, data))
    };
    let Some(meta) = params.get("_meta").and_then(Value::as_object) else {
        return Err(bad(code::INVALID_PARAMS, "Invalid params: a 2026-07-28 request needs params._meta", None));
    };
    let missing: Vec<&str> = [META_VERSION, META_CAPABILITIES].into_iter().filter(|k| !meta.contains_key(*k)).collect();
    if !missing.is_empty() {
        return Err(bad(
            code::INVALID_PARAMS,
            &format!("Invalid params: params._meta lacks {}", missing.join(", ")),
            None,
        ));
    }
    if !meta[META_CAPABILITIES].is_object() {
        return Err(bad(code::INVALID_PARAMS, "Invalid params: clientCapabilities must be an object", None));
    }
    let Some(version) = meta[META_VERSION].as_str() else {
        return Err(bad(code::INVALID_PARAMS, "Invalid params: protocolVersion must be a string", None));
    };
    match header_str(headers, "mcp-protocol-version") {
        None => return Err(bad(HEADER_MISMATCH, "Header mismatch: the MCP-Protocol-Version header is missing", None)),
        Some(h) if h != version => {
            return Err(bad(
                HEADER_MISMATCH,
                &format!("Header mismatch: MCP-Protocol-Version is {h:?} but params._meta says {version:?}"),
                None,
            ))
        }
        Some(_) => {}
    }
    if version != MODERN {
        return Err(bad(
            UNSUPPORTED_VERSION,
            &format!("Unsupported protocol version: {version}"),
            Some(json!({"supported": supported(server), "requested": version})),
        ));
    }
    match header_str(headers, "mcp-method") {
        Some(h) if h == method => {}
        Some(h) => {
            return Err(bad(
                HEADER_MISMATCH,
                &format!("Header mismatch: Mcp-Method is {h:?}, the body says {method:?}"),
                None,
            ))
        }
        None => return Err(bad(HEADER_MISMATCH, "Header mismatch: the Mcp-Method header is missing", None)),
    }
    let named = match method {
        "tools/call" | "prompts/get" => params["name"].as_str(),
        "resources/read" => params["uri"].as_str(),
        _ => None,
    };
    if let Some(named) = named {
        match header_str(headers, "mcp-name").map(decode_header_value) {
            Some(Some(h)) if h == named => {}
            Some(_) => {
                return Err(bad(HEADER_MISMATCH, &format!("Header mismatch: Mcp-Name does not match {named:?}"), None))
            }
            None => return Err(bad(HEADER_MISMATCH, "Header mismatch: the Mcp-Name header is missing", None)),
        }
    }
    Ok(())
}

/// A header value: `=?base64?…?=` is decoded (strictly; `None` if it is not
/// valid Base64 of UTF-8), anything else is taken literally.
fn decode_header_value(value: &str) -> Option<String> {
    match value.strip_prefix("=?base64?").and_then(|v| v.strip_suffix("?=")) {
        Some(encoded) => String::from_utf8(seal::decode_standard(encoded)?).ok(),
        None => Some(value.to_owned()),
    }
}

/// The tool `name`'s arguments mirrored into `Mcp-Param-*` headers
/// (`x-mcp-header` in its input schema): (argument, header suffix).
fn mirrored_arguments(server: &Server, name: &str) -> Vec<(String, String)> {
    if !server.opts.conformance {
        return Vec::new();
    }
    let tools = conformance::tools();
    let Some(tool) = tools["tools"].as_array().into_iter().flatten().find(|t| t["name"] == name) else {
        return Vec::new();
    };
    let Some(properties) = tool["inputSchema"]["properties"].as_object() else { return Vec::new() };
    properties
        .iter()
        .filter_map(|(arg, schema)| schema["x-mcp-header"].as_str().map(|h| (arg.clone(), h.to_owned())))
        .collect()
}

/// `Mcp-Param-*` headers of a `tools/call` must match the arguments.
fn check_param_headers(
    server: &Server,
    headers: &HeaderMap,
    id: &Value,
    method: &str,
    params: &Value,
) -> Result<(), Box<Response<Body>>> {
    if method != "tools/call" {
        return Ok(());
    }
    let name = params["name"].as_str().unwrap_or_default();
    for (argument, suffix) in mirrored_arguments(server, name) {
        let header_name = format!("mcp-param-{}", suffix.to_ascii_lowercase());
        let in_body = match &params["arguments"][&argument] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        };
        let in_header = header_str(headers, &header_name).map(decode_header_value);
        let problem = match (in_header, in_body) {
            (None, None) => None,
            (None, Some(_)) => Some(format!("the Mcp-Param-{suffix} header is missing")),
            (Some(None), _) => Some(format!("Mcp-Param-{suffix} is not valid Base64")),
            (Some(Some(h)), Some(b)) if h == b => None,
            (Some(Some(_)), _) => Some(format!("Mcp-Param-{suffix} does not match arguments.{argument}")),
        };
        if let Some(problem) = problem {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                id,
                HEADER_MISMATCH,
                &format!("Header mismatch: {problem}"),
                None,
            )));
        }
    }
    Ok(())
}

fn discover(server: &Server) -> Value {
    if server.opts.discover_modern_only {
        // As the official conformance server answers: one version, and
        // the server's implementation in `_meta`.
        return json!({
            "supportedVersions": [MODERN],
            "capabilities": crate::mcp::capabilities(),
            "_meta": {"io.modelcontextprotocol/serverInfo": server_info(server)},
            "instructions": format!("Mock upstream {}.", server.opts.name),
        });
    }
    json!({
        "supportedVersions": supported(server),
        "capabilities": crate::mcp::capabilities(),
        "serverInfo": server_info(server),
        "instructions": format!("Mock upstream {}.", server.opts.name),
    })
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Opens a `requestState` issued for `method` and `name`; the data it carries.
fn open_state(server: &Server, sealed: &str, method: &str, name: &str) -> Result<Value, &'static str> {
    let payload =
        seal::open(server.opts.state_key.as_bytes(), sealed).ok_or("requestState failed its integrity check")?;
    let state: Value = serde_json::from_slice(&payload).map_err(|_| "requestState is not readable")?;
    if state["m"] != method || state["n"] != name {
        return Err("requestState was issued for another request");
    }
    let issued = state["t"].as_u64().unwrap_or(0);
    if now_secs().saturating_sub(issued) > STATE_LIFETIME_SECS {
        return Err("requestState has expired");
    }
    Ok(state["d"].clone())
}

fn seal_state(server: &Server, method: &str, name: &str, data: Value) -> String {
    let payload = json!({"m": method, "n": name, "t": now_secs(), "d": data});
    seal::seal(server.opts.state_key.as_bytes(), payload.to_string().as_bytes())
}

/// One round of an input-needing tool or prompt.
fn rounds(server: &Server, id: &Value, method: &str, kind: Kind, name: &str, params: &Value) -> Response<Body> {
    let invalid = |message: &str| error(StatusCode::OK, id, code::INVALID_PARAMS, message, None);
    let empty = Map::new();
    let responses = match params.get("inputResponses") {
        None => &empty,
        Some(Value::Object(map)) => map,
        Some(_) => return invalid("Invalid params: inputResponses must be an object"),
    };
    let state = match params.get("requestState") {
        None => None,
        Some(Value::String(sealed)) => match open_state(server, sealed, method, name) {
            Ok(data) => Some(data),
            Err(why) => return invalid(&format!("Invalid params: {why}")),
        },
        Some(_) => return invalid("Invalid params: requestState must be a string"),
    };
    let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
    let round = Round {
        args: &args,
        caps: (!server.opts.ask_regardless).then_some(&params["_meta"][META_CAPABILITIES]),
        responses,
        state: state.as_ref(),
    };
    let response = match mrtr::run(kind, name, &round) {
        Step::Done(result) => ok(server, id, method, result),
        Step::Ask { requests, state } => {
            let result = json!({
                "resultType": "input_required",
                "inputRequests": requests,
                "requestState": seal_state(server, method, name, state),
                "_meta": {META_SERVER_INFO: server_info(server)},
            });
            json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
        }
        Step::Fail(failure) => {
            let status = if failure.bad_request { StatusCode::BAD_REQUEST } else { StatusCode::OK };
            error(status, id, failure.code, &failure.message, failure.data)
        }
    };
    if name == "test_streaming_elicitation" && response.status() == StatusCode::OK {
        // The same answer, as the single event of an SSE stream.
        return resend_as_sse(server, response);
    }
    response
}

fn resend_as_sse(server: &Server, response: Response<Body>) -> Response<Body> {
    let Body::Full(Some(bytes)) = response.into_body() else { return method_not_allowed() };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(sse::encode_event(None, None, &bytes));
    sse_body(server, rx)
}

/// Hands a request to the 2025 logic and adapts its answer.
async fn legacy(server: Arc<Server>, id: &Value, method: &str, meta: &Value, body: Bytes) -> Response<Body> {
    let reply = server.handle(server.shared(), body).await;
    let log_level = meta[META_LOG_LEVEL].as_str().map(level_rank);
    match reply {
        Reply::Json(bytes) | Reply::Invalid(bytes) => match adapt(&server, method, &bytes, log_level) {
            Some(message) => json_response(StatusCode::OK, &message),
            None => error(StatusCode::INTERNAL_SERVER_ERROR, id, code::INTERNAL_ERROR, "no answer", None),
        },
        Reply::Accepted => accepted(),
        Reply::Stream(mut messages) | Reply::Polled(mut messages) => {
            let (tx, rx) = mpsc::unbounded_channel();
            let method = method.to_owned();
            let adapting = server.clone();
            tokio::spawn(async move {
                while let Some(message) = messages.recv().await {
                    let Some(adapted) = adapt(&adapting, &method, &message, log_level) else { continue };
                    let last = adapted.get("id").is_some();
                    if tx.send(frame(&adapted)).is_err() || last {
                        break;
                    }
                }
            });
            sse_body(&server, rx)
        }
    }
}

/// A 2025 message as this era has it; `None` for what it must not send
/// (server-to-client requests, their cancellations, unwanted log messages).
fn adapt(server: &Server, method: &str, message: &[u8], log_level: Option<usize>) -> Option<Value> {
    let mut message: Value = serde_json::from_slice(message).ok()?;
    if let Some(kind) = message.get("method").and_then(Value::as_str) {
        if message.get("id").is_some() || kind == "notifications/cancelled" {
            return None;
        }
        if kind == "notifications/message" {
            let wanted = log_level?;
            if level_rank(message["params"]["level"].as_str().unwrap_or("info")) < wanted {
                return None;
            }
        }
        return Some(message);
    }
    if let Some(result) = message.get_mut("result") {
        decorate(server, method, result);
    } else if method == "resources/read" && message["error"]["code"] == code::RESOURCE_NOT_FOUND {
        // This era reports an unknown resource as invalid params, naming it.
        message["error"]["code"] = json!(code::INVALID_PARAMS);
    }
    if method == "resources/read" && message["error"]["code"] == code::INVALID_PARAMS {
        if let Some(uri) = request_uri(message["error"]["message"].as_str()) {
            message["error"]["data"] = json!({"uri": uri});
        }
    }
    Some(message)
}

/// The URI named by a "Resource not found: URI" message.
fn request_uri(message: Option<&str>) -> Option<String> {
    message?.strip_prefix("Resource not found: ").map(str::to_owned)
}

fn level_rank(level: &str) -> usize {
    const LEVELS: [&str; 8] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];
    LEVELS.iter().position(|l| *l == level).unwrap_or(1)
}

/// Ends every listen stream with its result (on shutdown).
pub(crate) fn close_listeners(server: &Server) {
    server.listeners.close_all(&server_info(server));
}

fn listen(server: &Server, id: &Value, params: &Value) -> Response<Body> {
    let filter = Filter::from_request(&params["notifications"]);
    let (tx, rx) = mpsc::unbounded_channel();
    let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": filter.to_value(), "_meta": {META_SUBSCRIPTION: id}}});
    let _ = tx.send(frame(&ack));
    server.listeners.add(Listener { id: id.clone(), filter, out: tx });
    sse_body(server, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn the_era_is_decided_by_header_or_meta_and_initialize_stays_2025() {
        let discover = br#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert!(wants(
            &headers(&[("mcp-protocol-version", MODERN)]),
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(wants(&headers(&[]), discover), "by _meta alone");
        assert!(wants(&headers(&[("mcp-protocol-version", "v999.0.0")]), b"{}"), "an unknown version");
        assert!(!wants(
            &headers(&[("mcp-protocol-version", "2025-11-25")]),
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(!wants(&headers(&[]), br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#));
        let initialize = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2026-07-28"}}"#;
        assert!(!wants(&headers(&[("mcp-protocol-version", MODERN)]), initialize));
        let removed = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{}}}"#;
        assert!(wants(&headers(&[("mcp-protocol-version", MODERN)]), removed));
    }

    #[test]
    fn header_values_may_be_base64() {
        assert_eq!(decode_header_value("=?base64?SGVsbG8=?=").as_deref(), Some("Hello"));
        assert_eq!(decode_header_value("=?base64?SGVsbG8?="), None);
        assert_eq!(decode_header_value("=?base64?SGVsbG8=").as_deref(), Some("=?base64?SGVsbG8="));
    }

    #[test]
    fn log_levels_are_ordered() {
        assert!(level_rank("error") > level_rank("warning"));
        assert!(level_rank("debug") < level_rank("info"));
    }
}
