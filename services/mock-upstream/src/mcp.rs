//! The mock's MCP logic, shared by both transports.
//!
//! A [`Server`] takes one message at a time for a [`Session`] and returns a
//! [`Reply`]: nothing (a notification or a response was taken), one JSON
//! message, or a stream of messages that ends with the response. Messages not
//! tied to a request (list changes, resource updates) go to the session's
//! `unsolicited` sink: the GET stream over HTTP, stdout over stdio.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use switchboard_protocol::jsonrpc::{self, code, Envelope, MessageKind};
use tokio::sync::mpsc;

use crate::conformance;
use crate::listen::{Change, Listeners};
use crate::mrtr::{self, Kind};
use crate::options::{AnswerIds, Options};
pub(crate) use crate::session::{Reply, Session, SUPPORTED_VERSIONS};

/// Counters for tests.
#[derive(Default)]
pub(crate) struct Stats {
    pub initialize: AtomicU64,
    pub calls: AtomicU64,
    /// `tools/list` requests received.
    pub tool_lists: AtomicU64,
    pub deleted: AtomicU64,
    /// The `requestId`s of `notifications/cancelled` received, as written.
    pub cancelled: Mutex<Vec<String>>,
    /// The names of the tools added at run time that were called.
    pub called: Mutex<Vec<String>>,
    /// HTTP requests by version.
    pub http1: AtomicU64,
    pub http2: AtomicU64,
}

/// The server: sessions, tools, counters.
pub(crate) struct Server {
    pub opts: Options,
    pub stats: Stats,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// The session of a stateless server and of stdio.
    shared: Arc<Session>,
    dynamic_tools: Mutex<Vec<String>>,
    /// Descriptions changed at run time (`redescribe`), by tool name.
    descriptions: Mutex<std::collections::HashMap<String, String>>,
    tools_page: Mutex<Option<Bytes>>,
    /// How GET is answered for now: [`GetMode`].
    pub(crate) get_mode: std::sync::atomic::AtomicU8,
    /// GET requests held unanswered ([`GetMode::Hold`]) so far.
    pub(crate) held_gets: AtomicU64,
    /// The open `subscriptions/listen` streams (2026-07-28).
    pub(crate) listeners: Listeners,
}

const TOOLS: &[(&str, &str, &str)] = &[
    ("echo", "Returns its arguments as JSON text.", r#"{"type":"object","additionalProperties":true}"#),
    (
        "add",
        "Adds two numbers.",
        r#"{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}"#,
    ),
    ("sleep", "Waits `ms` milliseconds.", r#"{"type":"object","properties":{"ms":{"type":"integer"}}}"#),
    (
        "progress",
        "Sends `steps` progress notifications, `interval_ms` apart; with `error_code`, then a JSON-RPC error of that code.",
        r#"{"type":"object","properties":{"steps":{"type":"integer"},"interval_ms":{"type":"integer"},"error_code":{"type":"integer"}}}"#,
    ),
    ("log", "Sends a log message, then answers.", r#"{"type":"object","properties":{"message":{"type":"string"}}}"#),
    (
        "sample",
        "Asks the client for a sampling completion.",
        r#"{"type":"object","properties":{"prompt":{"type":"string"}}}"#,
    ),
    ("elicit", "Asks the client to fill a form.", r#"{"type":"object","properties":{"message":{"type":"string"}}}"#),
    ("roots", "Asks the client for its roots.", r#"{"type":"object"}"#),
    ("whoami", "Tells this session's id and the Authorization headers it was sent.", r#"{"type":"object"}"#),
    ("fail", "Answers with a tool error.", r#"{"type":"object","properties":{"message":{"type":"string"}}}"#),
    ("big", "Answers with `bytes` bytes of text.", r#"{"type":"object","properties":{"bytes":{"type":"integer"}}}"#),
    (
        "add_tool",
        "Adds a tool and announces the change.",
        r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}"#,
    ),
    (
        "redescribe",
        "Changes a tool's description and announces the change.",
        r#"{"type":"object","properties":{"name":{"type":"string"},"description":{"type":"string"}},"required":["name","description"]}"#,
    ),
    (
        "touch",
        "Announces an update of a resource to its subscribers.",
        r#"{"type":"object","properties":{"uri":{"type":"string"}},"required":["uri"]}"#,
    ),
    ("exit", "Ends the server process (stdio only).", r#"{"type":"object","properties":{"code":{"type":"integer"}}}"#),
    ("cancelled", "Lists the request ids of the cancellations this server received.", r#"{"type":"object"}"#),
    ("ask_and_cancel", "Asks the client for sampling, then cancels that request.", r#"{"type":"object"}"#),
    (
        "reconnect",
        "Ends its SSE response early and answers after the client resumes (SSE polling); with `on: \"get\"`, answers on the GET stream instead.",
        r#"{"type":"object"}"#,
    ),
];

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<Meta<'a>>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
}

/// How the server answers a GET that opens a session's stream (see
/// [`crate::Mock::refuse_get`], [`crate::Mock::hold_get`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum GetMode {
    /// With the session's stream.
    Serve,
    /// 405: this server has no GET stream.
    Refuse,
    /// Never: the request is read and its answer never begins.
    Hold,
}

impl Server {
    pub fn new(opts: Options) -> Self {
        Server {
            opts,
            stats: Stats::default(),
            sessions: Mutex::new(HashMap::new()),
            shared: Session::new(String::new()),
            dynamic_tools: Mutex::new(Vec::new()),
            descriptions: Mutex::default(),
            tools_page: Mutex::new(None),
            get_mode: std::sync::atomic::AtomicU8::new(GetMode::Serve as u8),
            held_gets: AtomicU64::new(0),
            listeners: Listeners::default(),
        }
    }

    pub(crate) fn get_mode(&self) -> GetMode {
        match self.get_mode.load(Ordering::Relaxed) {
            1 => GetMode::Refuse,
            2 => GetMode::Hold,
            _ => GetMode::Serve,
        }
    }

    /// The session for stateless HTTP and for stdio.
    pub fn shared(&self) -> &Arc<Session> {
        &self.shared
    }

    /// Starts a session for an `initialize` request.
    pub fn open_session(&self) -> Arc<Session> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).expect("OS randomness");
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let session = Session::new(id.clone());
        self.sessions.lock().expect("lock").insert(id, session.clone());
        session
    }

    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().expect("lock").get(id).cloned()
    }

    pub fn close_session(&self, id: &str) -> bool {
        let removed = self.sessions.lock().expect("lock").remove(id).is_some();
        if removed {
            self.stats.deleted.fetch_add(1, Ordering::Relaxed);
        }
        removed
    }

    pub fn forget_sessions(&self) {
        self.sessions.lock().expect("lock").clear();
    }

    pub fn live_sessions(&self) -> usize {
        self.sessions.lock().expect("lock").len()
    }

    /// Sessions whose GET stream is open (a client listens for messages
    /// not tied to a request).
    pub fn listening_sessions(&self) -> usize {
        let sessions = self.sessions.lock().expect("lock");
        sessions
            .values()
            .filter(|s| s.unsolicited.lock().expect("lock").as_ref().is_some_and(|sink| !sink.is_closed()))
            .count()
    }

    /// Handles one received message.
    pub async fn handle(self: &Arc<Self>, session: &Arc<Session>, body: Bytes) -> Reply {
        let env = match Envelope::parse(&body) {
            Ok(env) => env,
            Err(e) => return Reply::Invalid(jsonrpc::error_response(None, e.code(), &e.to_string(), None)),
        };
        match env.kind {
            MessageKind::Response | MessageKind::Error => {
                let id = env.id;
                session.resolve(id, body.clone());
                Reply::Accepted
            }
            MessageKind::Notification => {
                if env.method_str() == "notifications/cancelled" {
                    let params: Value =
                        env.params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or(Value::Null);
                    self.stats.cancelled.lock().expect("lock").push(params["requestId"].to_string());
                }
                Reply::Accepted
            }
            MessageKind::Request => {
                let how = match self.opts.answer_ids {
                    AnswerIds::Stray if env.method_str() != "tools/call" => AnswerIds::Echo,
                    how => how,
                };
                let reply = match self.request(session, &env).await {
                    Reply::Json(bytes) => Reply::Json(answer_id(how, bytes)),
                    other => other,
                };
                match reply {
                    Reply::Json(bytes) if self.opts.always_sse => {
                        let (tx, rx) = mpsc::unbounded_channel();
                        let _ = tx.send(bytes);
                        Reply::Stream(rx)
                    }
                    other => other,
                }
            }
        }
    }

    async fn request(self: &Arc<Self>, session: &Arc<Session>, env: &Envelope<'_>) -> Reply {
        let id = env.id.expect("a request has an id");
        let ok = |result: &[u8]| Reply::Json(jsonrpc::result_response(id, result));
        let err = |code: i64, message: &str| Reply::Json(jsonrpc::error_response(Some(id), code, message, None));
        let params = env.params.map_or("{}", RawValue::get);
        if self.opts.conformance {
            if let Some(reply) = self.conformance(session, id, env.method_str(), params) {
                return reply;
            }
        }
        match env.method_str() {
            "tools/call" => self.call_tool(session, id, params).await,
            "initialize" if self.opts.modern_only => {
                err(code::METHOD_NOT_FOUND, "this server speaks only MCP 2026-07-28: no initialize")
            }
            "initialize" => {
                if !self.opts.initialize_delay.is_zero() {
                    tokio::time::sleep(self.opts.initialize_delay).await;
                }
                self.stats.initialize.fetch_add(1, Ordering::Relaxed);
                let requested: Value = serde_json::from_str(params).unwrap_or(Value::Null);
                let requested = requested["protocolVersion"].as_str().unwrap_or("");
                let version = if SUPPORTED_VERSIONS.contains(&requested) { requested } else { "2025-11-25" };
                let result = json!({
                    "protocolVersion": version,
                    "capabilities": capabilities(),
                    "serverInfo": {"name": self.opts.name, "version": env!("CARGO_PKG_VERSION")},
                    "instructions": format!("Mock upstream {}.", self.opts.name),
                });
                ok(&serde_json::to_vec(&result).expect("serializable"))
            }
            "ping" | "logging/setLevel" => ok(b"{}"),
            "tools/list" => {
                self.stats.tool_lists.fetch_add(1, Ordering::Relaxed);
                if !self.opts.list_delay.is_zero() {
                    tokio::time::sleep(self.opts.list_delay).await;
                }
                ok(&self.tools_list(params))
            }
            "resources/list" => {
                let uri = format!("mock://{}/hello", self.opts.name);
                ok(&serde_json::to_vec(&json!({"resources": [
                    {"uri": uri, "name": "hello", "mimeType": "text/plain"}
                ]}))
                .expect("serializable"))
            }
            "resources/templates/list" => {
                let template = format!("mock://{}/items/{{id}}", self.opts.name);
                ok(&serde_json::to_vec(&json!({"resourceTemplates": [
                    {"uriTemplate": template, "name": "item", "mimeType": "text/plain"}
                ]}))
                .expect("serializable"))
            }
            "resources/read" => {
                let uri = serde_json::from_str::<Value>(params).ok().and_then(|p| p["uri"].as_str().map(String::from));
                let Some(uri) = uri else { return err(code::INVALID_PARAMS, "missing uri") };
                let base = format!("mock://{}/", self.opts.name);
                let text = match uri.strip_prefix(&base) {
                    Some("hello") => format!("hello from {}", self.opts.name),
                    Some(rest) if rest.starts_with("items/") => format!("item {}", &rest[6..]),
                    _ => return err(code::RESOURCE_NOT_FOUND, &format!("Resource not found: {uri}")),
                };
                ok(&serde_json::to_vec(&json!({"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}))
                    .expect("serializable"))
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let uri = serde_json::from_str::<Value>(params).ok().and_then(|p| p["uri"].as_str().map(String::from));
                let Some(uri) = uri else { return err(code::INVALID_PARAMS, "missing uri") };
                let mut subs = session.subscriptions.lock().expect("lock");
                if env.method_str() == "resources/subscribe" {
                    subs.insert(uri);
                } else {
                    subs.remove(&uri);
                }
                ok(b"{}")
            }
            "prompts/list" => ok(br#"{"prompts":[{"name":"greet","description":"Greets someone.","arguments":[{"name":"name","required":true}]}]}"#),
            "prompts/get" => {
                let p: Value = serde_json::from_str(params).unwrap_or(Value::Null);
                if p["name"] != "greet" {
                    return err(code::INVALID_PARAMS, &format!("Unknown prompt: {}", p["name"]));
                }
                let who = p["arguments"]["name"].as_str().unwrap_or("world");
                ok(&serde_json::to_vec(&json!({"messages": [
                    {"role": "user", "content": {"type": "text", "text": format!("Hello, {who}!")}}
                ]}))
                .expect("serializable"))
            }
            "completion/complete" => {
                let p: Value = serde_json::from_str(params).unwrap_or(Value::Null);
                let prefix = p["argument"]["value"].as_str().unwrap_or("");
                let values: Vec<&str> = ["alice", "bob", "carol"].into_iter().filter(|v| v.starts_with(prefix)).collect();
                ok(&serde_json::to_vec(&json!({"completion": {"values": values, "total": values.len(), "hasMore": false}}))
                    .expect("serializable"))
            }
            other => err(code::METHOD_NOT_FOUND, &format!("Method not found: {other}")),
        }
    }

    /// The conformance fixtures; `None` for methods answered as usual (ping,
    /// initialize, logging, subscriptions).
    fn conformance(
        self: &Arc<Self>,
        session: &Arc<Session>,
        id: &RawValue,
        method: &str,
        params: &str,
    ) -> Option<Reply> {
        let p: Value = serde_json::from_str(params).unwrap_or(Value::Null);
        let ok = |v: Value| Reply::Json(jsonrpc::result_response(id, &serde_json::to_vec(&v).expect("serializable")));
        let err = |code: i64, m: String| Reply::Json(jsonrpc::error_response(Some(id), code, &m, None));
        Some(match method {
            "tools/list" => ok(conformance::tools()),
            "resources/list" => ok(conformance::resources()),
            "resources/templates/list" => ok(conformance::templates()),
            "prompts/list" => ok(conformance::prompts()),
            "completion/complete" => ok(conformance::complete(&p)),
            "resources/read" => {
                let uri = p["uri"].as_str().unwrap_or_default();
                match conformance::read(uri) {
                    Some(v) => ok(v),
                    None => err(code::RESOURCE_NOT_FOUND, format!("Resource not found: {uri}")),
                }
            }
            "prompts/get" => {
                let name = p["name"].as_str().unwrap_or_default();
                if mrtr::is_program(true, Kind::Prompt, name) {
                    return Some(driven(session, id, Kind::Prompt, name, &p["arguments"]));
                }
                match conformance::prompt(name, &p["arguments"]) {
                    Some(v) => ok(v),
                    None => err(code::INVALID_PARAMS, format!("Unknown prompt: {name}")),
                }
            }
            "tools/call" => {
                self.stats.calls.fetch_add(1, Ordering::Relaxed);
                let name = p["name"].as_str().unwrap_or_default().to_owned();
                if name == "test_reconnection" {
                    return Some(Reply::Polled(delayed(
                        id,
                        "Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.",
                    )));
                }
                if let Some(result) = conformance::immediate(&name, &p["arguments"]) {
                    return Some(ok(result));
                }
                match name.as_str() {
                    "test_trigger_tool_change" => {
                        self.announce(Change::Tools);
                        return Some(ok(conformance::text("Announced a tool list change")));
                    }
                    "test_trigger_prompt_change" => {
                        self.announce(Change::Prompts);
                        return Some(ok(conformance::text("Announced a prompt list change")));
                    }
                    _ => {}
                }
                if !conformance::is_streamed(&name) && mrtr::is_program(true, Kind::Tool, &name) {
                    return Some(driven(session, id, Kind::Tool, &name, &p["arguments"]));
                }
                if !conformance::is_streamed(&name) {
                    return Some(err(code::INVALID_PARAMS, format!("Unknown tool: {name}")));
                }
                let (tx, rx) = mpsc::unbounded_channel();
                let token = p["_meta"].get("progressToken").map(Value::to_string);
                let args = p["arguments"].clone();
                let id = id.to_owned();
                let session = session.clone();
                tokio::spawn(async move {
                    let result = conformance::streamed(&session, &name, &args, token.as_deref(), &tx).await;
                    let result =
                        result.unwrap_or_else(|e| json!({"content": [{"type": "text", "text": e}], "isError": true}));
                    let _ = tx.send(jsonrpc::result_response(&id, &serde_json::to_vec(&result).expect("serializable")));
                });
                Reply::Stream(rx)
            }
            _ => return None,
        })
    }

    fn tools_list(&self, params: &str) -> Bytes {
        if self.opts.page_size == 0 && self.opts.tool_padding == 0 {
            if let Some(cached) = self.tools_page.lock().expect("lock").clone() {
                return cached;
            }
        }
        let mut tools: Vec<Value> = TOOLS
            .iter()
            .filter(|(name, _, _)| *name != "exit" || self.opts.allow_exit)
            .filter(|(name, _, _)| *name != "whoami" || self.opts.whoami)
            .map(|(name, description, schema)| {
                json!({"name": name, "description": description, "inputSchema": serde_json::from_str::<Value>(schema).expect("valid schema")})
            })
            .collect();
        for i in 0..self.opts.extra_tools {
            tools.push(
                json!({"name": format!("tool_{i}"), "description": "Like echo.", "inputSchema": {"type": "object"}}),
            );
        }
        for name in self.dynamic_tools.lock().expect("lock").iter() {
            tools.push(json!({"name": name, "description": "Added at run time; like echo.", "inputSchema": {"type": "object"}}));
        }
        if self.opts.burst_tool {
            tools.push(json!({"name": "burst", "description": "Sends `count` requests of `method` to the client at once and tells how each was answered.", "inputSchema": {"type": "object", "properties": {"count": {"type": "integer"}, "method": {"type": "string"}}}}));
        }
        if self.opts.duplicate_tool {
            tools.push(json!({"name": "echo", "description": "Listed twice.", "inputSchema": {"type": "object"}}));
        }
        for (name, description) in self.descriptions.lock().expect("lock").iter() {
            for tool in tools.iter_mut().filter(|t| t["name"] == name.as_str()) {
                tool["description"] = Value::String(description.clone());
            }
        }
        // Padded descriptions are made for the page asked for only.
        let pad = |page: &[Value]| -> Vec<Value> {
            let padding = "x".repeat(self.opts.tool_padding);
            page.iter()
                .cloned()
                .map(|mut tool| {
                    if self.opts.tool_padding > 0 && tool["name"].as_str().is_some_and(|n| n.starts_with("tool_")) {
                        tool["description"] = Value::String(padding.clone());
                    }
                    tool
                })
                .collect()
        };
        if self.opts.page_size == 0 {
            let bytes = Bytes::from(serde_json::to_vec(&json!({"tools": pad(&tools)})).expect("serializable"));
            if self.opts.tool_padding == 0 {
                *self.tools_page.lock().expect("lock") = Some(bytes.clone());
            }
            return bytes;
        }
        let cursor: usize = serde_json::from_str::<Value>(params)
            .ok()
            .and_then(|p| p["cursor"].as_str().and_then(|c| c.parse().ok()))
            .unwrap_or(0);
        let end = (cursor + self.opts.page_size).min(tools.len());
        let page = pad(&tools[cursor.min(end)..end]);
        let mut result = json!({"tools": page});
        if end < tools.len() {
            result["nextCursor"] = json!(end.to_string());
        }
        Bytes::from(serde_json::to_vec(&result).expect("serializable"))
    }

    fn is_echo(&self, name: &str) -> bool {
        if name == "echo" {
            return true;
        }
        if let Some(n) = name.strip_prefix("tool_").and_then(|n| n.parse::<usize>().ok()) {
            return n < self.opts.extra_tools;
        }
        let dynamic = self.dynamic_tools.lock().expect("lock").iter().any(|t| t == name);
        if dynamic {
            self.stats.called.lock().expect("lock").push(name.to_owned());
        }
        dynamic
    }

    async fn call_tool(self: &Arc<Self>, session: &Arc<Session>, id: &RawValue, params: &str) -> Reply {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let call: CallParams<'_> = match serde_json::from_str(params) {
            Ok(call) => call,
            Err(e) => {
                return Reply::Json(jsonrpc::error_response(Some(id), code::INVALID_PARAMS, &e.to_string(), None))
            }
        };
        let args_raw = call.arguments.map_or("{}", RawValue::get);
        if self.is_echo(&call.name) {
            return Reply::Json(echo_response(id, args_raw));
        }
        let args: Value = serde_json::from_str(args_raw).unwrap_or(Value::Null);
        let text_result = |text: &str| -> Bytes {
            let result = json!({"content": [{"type": "text", "text": text}]});
            jsonrpc::result_response(id, &serde_json::to_vec(&result).expect("serializable"))
        };
        let tool_error = |text: &str| -> Bytes {
            let result = json!({"content": [{"type": "text", "text": text}], "isError": true});
            jsonrpc::result_response(id, &serde_json::to_vec(&result).expect("serializable"))
        };
        match &*call.name {
            "add" => match (args["a"].as_f64(), args["b"].as_f64()) {
                (Some(a), Some(b)) => {
                    let sum = a + b;
                    let result = json!({"content": [{"type": "text", "text": sum.to_string()}], "structuredContent": {"sum": sum}});
                    Reply::Json(jsonrpc::result_response(id, &serde_json::to_vec(&result).expect("serializable")))
                }
                _ => Reply::Json(jsonrpc::error_response(
                    Some(id),
                    code::INVALID_PARAMS,
                    "add needs numbers \"a\" and \"b\"",
                    None,
                )),
            },
            "fail" => Reply::Json(tool_error(args["message"].as_str().unwrap_or("failed on purpose"))),
            "big" => {
                let n = args["bytes"].as_u64().unwrap_or(1024).min(64 << 20) as usize;
                Reply::Json(text_result(&"x".repeat(n)))
            }
            "sleep" => {
                let ms = args["ms"].as_u64().unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Reply::Json(text_result(&format!("slept {ms} ms")))
            }
            "add_tool" => {
                let Some(name) = args["name"].as_str() else {
                    return Reply::Json(tool_error("add_tool needs a name"));
                };
                self.dynamic_tools.lock().expect("lock").push(name.to_owned());
                *self.tools_page.lock().expect("lock") = None;
                self.announce(Change::Tools);
                Reply::Json(text_result(&format!("added {name}")))
            }
            "redescribe" => {
                let (Some(name), Some(description)) = (args["name"].as_str(), args["description"].as_str()) else {
                    return Reply::Json(tool_error("redescribe needs a name and a description"));
                };
                self.redescribe(name, description);
                Reply::Json(text_result(&format!("redescribed {name}")))
            }
            "touch" => {
                let uri = args["uri"].as_str().unwrap_or_default().to_owned();
                let params = serde_json::to_vec(&json!({"uri": uri})).expect("serializable");
                let note = jsonrpc::request(None, "notifications/resources/updated", Some(&params));
                let mut told = 0;
                for s in self.all_sessions() {
                    if s.subscriptions.lock().expect("lock").contains(&uri) {
                        s.send_unsolicited(note.clone());
                        told += 1;
                    }
                }
                self.listeners.notify(Change::Updated(&uri));
                Reply::Json(text_result(&format!("told {told} subscribers")))
            }
            "cancelled" => {
                let seen = self.stats.cancelled.lock().expect("lock").clone();
                Reply::Json(text_result(&serde_json::to_string(&seen).expect("serializable")))
            }
            // `"on": "get"`: the answer goes out on the session's GET stream
            // (as a lax server does, taking any GET for the reconnection),
            // once one is open, and the call's resumed stream carries nothing.
            "reconnect" if args["on"] == "get" => {
                let (keep, rx) = mpsc::unbounded_channel();
                let mut answer = delayed(id, "Reconnection test completed successfully.");
                let session = session.clone();
                tokio::spawn(async move {
                    if let Some(message) = answer.recv().await {
                        for _ in 0..500 {
                            if session.unsolicited.lock().expect("lock").is_some() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        session.send_unsolicited(message);
                    }
                    // The call's own stream stays open, silent, a while.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(keep);
                });
                Reply::Polled(rx)
            }
            "reconnect" => Reply::Polled(delayed(id, "Reconnection test completed successfully.")),
            "whoami" if self.opts.whoami => {
                let seen = session.authorizations.lock().expect("lock").clone();
                // And the trace context this call came with (header and `_meta`).
                let header = session.traceparent.lock().expect("lock").clone();
                let meta = serde_json::from_str::<Value>(params)
                    .ok()
                    .and_then(|p| p["_meta"]["traceparent"].as_str().map(str::to_owned));
                let result = json!({"session": session.id, "authorizations": seen, "traceparent": {"header": header, "meta": meta}});
                Reply::Json(text_result(&result.to_string()))
            }
            "exit" if self.opts.allow_exit => {
                let code = args["code"].as_i64().unwrap_or(0) as i32;
                std::process::exit(code)
            }
            "progress" | "log" | "sample" | "elicit" | "roots" | "ask_and_cancel" | "burst"
                if &*call.name != "burst" || self.opts.burst_tool =>
            {
                let (tx, rx) = mpsc::unbounded_channel();
                let token = call.meta.and_then(|m| m.progress_token).map(|t| t.get().to_owned());
                let id = id.to_owned();
                let name = call.name.into_owned();
                let session = session.clone();
                let server = self.clone();
                tokio::spawn(async move {
                    let response = server.streamed_tool(&session, &name, &args, token, &tx).await;
                    let error_code = args["error_code"].as_i64().filter(|_| name == "progress");
                    let bytes = match (response, error_code) {
                        (Ok(_), Some(code)) => {
                            jsonrpc::error_response(Some(&id), code, "failed after its progress, on purpose", None)
                        }
                        (Ok(result), None) => {
                            jsonrpc::result_response(&id, &serde_json::to_vec(&result).expect("serializable"))
                        }
                        (Err(text), _) => jsonrpc::result_response(
                            &id,
                            &serde_json::to_vec(&json!({"content": [{"type": "text", "text": text}], "isError": true}))
                                .expect("serializable"),
                        ),
                    };
                    let _ = tx.send(bytes);
                });
                Reply::Stream(rx)
            }
            other => Reply::Json(jsonrpc::error_response(
                Some(id),
                code::INVALID_PARAMS,
                &format!("Unknown tool: {other}"),
                None,
            )),
        }
    }

    async fn streamed_tool(
        &self,
        session: &Session,
        name: &str,
        args: &Value,
        token: Option<String>,
        out: &mpsc::UnboundedSender<Bytes>,
    ) -> Result<Value, String> {
        let text = |t: String| json!({"content": [{"type": "text", "text": t}]});
        match name {
            "progress" => {
                let steps = args["steps"].as_u64().unwrap_or(3);
                let interval = Duration::from_millis(args["interval_ms"].as_u64().unwrap_or(10));
                for step in 1..=steps {
                    if let Some(token) = &token {
                        let params = format!(
                            r#"{{"progressToken":{token},"progress":{step},"total":{steps},"message":"step {step} of {steps}"}}"#
                        );
                        let _ = out.send(jsonrpc::request(None, "notifications/progress", Some(params.as_bytes())));
                    }
                    tokio::time::sleep(interval).await;
                }
                Ok(text(format!("done after {steps} steps")))
            }
            "log" => {
                let message = args["message"].as_str().unwrap_or("hello");
                let params = serde_json::to_vec(&json!({"level": "info", "logger": self.opts.name, "data": message}))
                    .expect("serializable");
                let _ = out.send(jsonrpc::request(None, "notifications/message", Some(&params)));
                Ok(text(format!("logged {message}")))
            }
            "sample" => {
                let prompt = args["prompt"].as_str().unwrap_or("hello");
                let answer = session
                    .ask(
                        out,
                        "sampling/createMessage",
                        json!({"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}], "maxTokens": 100}),
                    )
                    .await?;
                let said = answer["content"]["text"].as_str().unwrap_or_default();
                Ok(text(format!("sampled: {said}")))
            }
            "elicit" => {
                let message = args["message"].as_str().unwrap_or("Please answer");
                let answer = session
                    .ask(
                        out,
                        "elicitation/create",
                        json!({"message": message, "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}}),
                    )
                    .await?;
                Ok(text(format!("elicited: {answer}")))
            }
            "ask_and_cancel" => {
                let id = session.next_id.fetch_add(1, Ordering::Relaxed);
                let params = serde_json::to_vec(&json!({"messages": [], "maxTokens": 1})).expect("serializable");
                let _ = out.send(jsonrpc::request(
                    Some(id.to_string().as_bytes()),
                    "sampling/createMessage",
                    Some(&params),
                ));
                let cancel =
                    serde_json::to_vec(&json!({"requestId": id, "reason": "changed my mind"})).expect("serializable");
                let _ = out.send(jsonrpc::request(None, "notifications/cancelled", Some(&cancel)));
                Ok(text(format!("cancelled request {id}")))
            }
            "roots" => {
                let answer = session.ask(out, "roots/list", json!({})).await?;
                Ok(text(format!("roots: {}", answer["roots"])))
            }
            "burst" => {
                let count = args["count"].as_u64().unwrap_or(100) as usize;
                let method = args["method"].as_str().unwrap_or("ping");
                let params = if method == "ping" { json!({}) } else { json!({"messages": [], "maxTokens": 1}) };
                // On the call's stream, or (`"on": "get"`) the GET stream.
                let get_stream = session.unsolicited.lock().expect("lock").clone();
                let out = match (args["on"].as_str(), &get_stream) {
                    (Some("get"), Some(sink)) => sink,
                    (Some("get"), None) => return Err("no GET stream to send on".into()),
                    _ => out,
                };
                // Every request out at once; then each answer (or none).
                let asked: Vec<_> = (0..count).map(|_| session.ask(out, method, params.clone())).collect();
                let answers = futures_util::future::join_all(asked).await;
                let mut answered = 0;
                let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
                let mut missing = 0;
                for answer in answers {
                    match answer {
                        Ok(_) => answered += 1,
                        Err(e) if e.starts_with('{') => {
                            let code = serde_json::from_str::<Value>(&e).ok().and_then(|e| e["code"].as_i64());
                            *errors.entry(code.map_or("?".into(), |c| c.to_string())).or_default() += 1;
                        }
                        Err(_) => missing += 1,
                    }
                }
                let tally = json!({"answered": answered, "errors": errors, "missing": missing});
                Ok(json!({"content": [{"type": "text", "text": tally.to_string()}], "structuredContent": tally}))
            }
            _ => Err(format!("not a streamed tool: {name}")),
        }
    }

    fn all_sessions(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<_> = self.sessions.lock().expect("lock").values().cloned().collect();
        all.push(self.shared.clone());
        all
    }

    fn broadcast(&self, message: Bytes) {
        for s in self.all_sessions() {
            s.send_unsolicited(message.clone());
        }
    }

    /// Announces a list change to every session's GET stream (2025) and to
    /// the listen streams that asked for it (2026-07-28).
    /// Gives tool `name` a new description, and announces the change.
    pub(crate) fn redescribe(&self, name: &str, description: &str) {
        self.descriptions.lock().expect("lock").insert(name.to_owned(), description.to_owned());
        *self.tools_page.lock().expect("lock") = None;
        self.announce(Change::Tools);
    }

    pub(crate) fn announce(&self, change: Change<'_>) {
        let method = match change {
            Change::Tools => "notifications/tools/list_changed",
            Change::Prompts => "notifications/prompts/list_changed",
            Change::Updated(_) => return self.listeners.notify(change),
        };
        self.broadcast(jsonrpc::request(None, method, None));
        self.listeners.notify(change);
    }
}

/// Runs an input-needing program for a 2025 session: its questions go to
/// the client as requests on the response stream.
/// What the mock declares, in either era.
pub(crate) fn capabilities() -> Value {
    json!({
        "tools": {"listChanged": true},
        "resources": {"subscribe": true, "listChanged": true},
        "prompts": {"listChanged": true},
        "logging": {},
        "completions": {},
    })
}

fn driven(session: &Arc<Session>, id: &RawValue, kind: Kind, name: &str, args: &Value) -> Reply {
    let (tx, rx) = mpsc::unbounded_channel();
    let (session, id, name, args) = (session.clone(), id.to_owned(), name.to_owned(), args.clone());
    tokio::spawn(async move {
        let message = match mrtr::drive(&session, kind, &name, &args, &tx).await {
            Ok(result) => jsonrpc::result_response(&id, &serde_json::to_vec(&result).expect("serializable")),
            Err(failure) if kind == Kind::Tool => {
                let result = json!({"content": [{"type": "text", "text": failure.message}], "isError": true});
                jsonrpc::result_response(&id, &serde_json::to_vec(&result).expect("serializable"))
            }
            Err(failure) => jsonrpc::error_response(Some(&id), failure.code, &failure.message, failure.data.as_ref()),
        };
        let _ = tx.send(message);
    });
    Reply::Stream(rx)
}

/// A channel that yields a text result after 100 ms.
pub(crate) fn delayed(id: &RawValue, text: &str) -> mpsc::UnboundedReceiver<Bytes> {
    let (tx, rx) = mpsc::unbounded_channel();
    let result = serde_json::to_vec(&json!({"content": [{"type": "text", "text": text}]})).expect("serializable");
    let message = jsonrpc::result_response(id, &result);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tx.send(message);
    });
    rx
}

/// `answer` under the id `how` says (see [`AnswerIds`]).
fn answer_id(how: AnswerIds, answer: Bytes) -> Bytes {
    if how == AnswerIds::Echo {
        return answer;
    }
    let Some(id) = Envelope::parse(&answer).ok().and_then(|e| e.id) else { return answer };
    let Ok(number) = id.get().parse::<f64>() else { return answer };
    let text = match how {
        AnswerIds::Stray => format!("{}", number + 1000.0),
        // JavaScript prints integral numbers without a fraction, and -0 as 0.
        _ if number.fract() == 0.0 && number.abs() < 1e15 => format!("{}", number as i64),
        _ => format!("{number}"),
    };
    let at = jsonrpc::span(&answer, id.get());
    switchboard_protocol::rewrite::splice(&answer, &mut [switchboard_protocol::rewrite::Edit::new(at, text.as_bytes())])
}

/// `{"jsonrpc":"2.0","id":ID,"result":{"content":[{"type":"text","text":ARGS}]}}`,
/// written straight from the request's bytes.
fn echo_response(id: &RawValue, args: &str) -> Bytes {
    const HEAD: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";
    const MID: &[u8] = b",\"result\":{\"content\":[{\"type\":\"text\",\"text\":";
    const TAIL: &[u8] = b"}]}}";
    let mut out = BytesMut::with_capacity(HEAD.len() + id.get().len() + MID.len() + args.len() + 16 + TAIL.len());
    out.put_slice(HEAD);
    out.put_slice(id.get().as_bytes());
    out.put_slice(MID);
    write_json_string(&mut out, args);
    out.put_slice(TAIL);
    out.freeze()
}

fn write_json_string(out: &mut BytesMut, s: &str) {
    out.put_u8(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0..=0x1f => None,
            _ => continue,
        };
        out.put_slice(&bytes[start..i]);
        match escape {
            Some(e) => out.put_slice(e),
            None => out.put_slice(format!("\\u{b:04x}").as_bytes()),
        }
        start = i + 1;
    }
    out.put_slice(&bytes[start..]);
    out.put_u8(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_response_is_valid_json_with_the_arguments_as_text() {
        let id = RawValue::from_string("42".into()).unwrap();
        let args = r#"{"text":"a \"q\" \\ b\n","n":[1,2]}"#;
        let out = echo_response(&id, args);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], 42);
        assert_eq!(v["result"]["content"][0]["text"], args);
    }
}
