//! Helpers for Switchboard's integration tests. Never a dependency of
//! production code.
//!
//! - [`Router`]: the real router, in-process, on `127.0.0.1:0`.
//! - [`MockServer`]: the mock upstream over HTTP, in-process; [`mock_binary`]
//!   for stdio upstreams.
//! - [`Client`]: a raw MCP-over-HTTP client that shows status codes, headers
//!   and SSE events, for asserting on the wire.
//! - [`peers`]: real peers installed by `scripts/install-peers` (the Python
//!   SDK, the official servers).
//! - [`services`]: PostgreSQL and Redis for tests: a fresh database on the
//!   machine's server, or private instances a test may stop and start.

pub mod peers;
pub mod services;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use switchboard_protocol::sse;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use switchboard_mock::{Mock, Options as MockOptions};

/// The router, running in this process.
pub struct Router {
    pub addr: SocketAddr,
    /// `http://ADDR/mcp`.
    pub url: String,
    /// The edge listener, when the configuration has `edge.listen` (port 0
    /// there: a free port on 127.0.0.1).
    pub edge_addr: Option<SocketAddr>,
    /// The admin API, when the configuration has `[admin]` and a database
    /// (`admin.listen` is ignored likewise).
    pub admin_addr: Option<SocketAddr>,
    /// Its configuration file (reloaded when it changes) and what
    /// [`Router::start`] put before the test's configuration.
    file: PathBuf,
    preamble: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Router {
    /// Starts the router with this configuration (TOML; `server.listen` is
    /// ignored; `{router}` stands for `http://ADDR` where it listens). Unless the configuration has its own `[auth]` and
    /// `[database]`, authentication is off and there is no database (so a
    /// test of routing needs neither keys nor a database file).
    pub async fn start(config_toml: &str) -> Router {
        let mut text = String::new();
        if !config_toml.contains("[auth]") {
            text.push_str("[auth]\nmode = \"none\"\n");
        }
        if !config_toml.contains("[database]") {
            text.push_str("[database]\nurl = \"\"\n");
        }
        // The mocks are on loopback, which the egress guard refuses unless allowed.
        if !config_toml.contains("[egress]") {
            text.push_str("[egress]\nallow = [\"loopback\"]\n");
        }
        let preamble = text.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // `{router}` in the configuration: where the router listens (an
        // OAuth resource identifier names it).
        text.push_str(&config_toml.replace("{router}", &format!("http://{addr}")));
        let config = switchboard_router::Config::from_toml(&text).unwrap_or_else(|e| panic!("test config: {e}"));
        // Connections dealt to the test's runtime and a thread of their
        // own, as `switchboard serve` serves them on two cores.
        let mut extra = switchboard_router::Listeners { threads: 1, ..Default::default() };
        // Written to a file as a served router's is: it is reloaded when it
        // changes, and the upstream registry applied with it.
        let file = std::env::temp_dir().join(services::unique("sb-router-")).with_extension("toml");
        std::fs::write(&file, &text).expect("write the test's configuration file");
        extra.reload = Some(switchboard_router::reload::Source { path: file.clone(), log_level: None });
        let mut edge_addr = None;
        if let Some(wanted) = config.edge.listen {
            // Port 0 in the test's config: any free port; else that one (a
            // test restarting the router where devices reconnect).
            let at = if wanted.port() == 0 { "127.0.0.1:0".parse().expect("address") } else { wanted };
            let edge = TcpListener::bind(at).await.expect("bind the edge listener");
            edge_addr = Some(edge.local_addr().expect("addr"));
            extra.edge = Some(edge);
        }
        let mut admin_addr = None;
        if let (Some(_), Some(token), Some(url)) = (config.admin.listen, &config.admin.token, &config.database.url) {
            let db = switchboard_db::Database::connect(url, config.database.connect_timeout).expect("database");
            let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            admin_addr = Some(admin.local_addr().expect("addr"));
            extra.admin = Some((admin, switchboard_router::admin::Admin::new(db, &config), token.clone()));
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(switchboard_router::serve_with(listener, extra, config, async {
            let _ = stopped.await;
        }));
        Router {
            addr,
            url: format!("http://{addr}/mcp"),
            edge_addr,
            admin_addr,
            file,
            preamble,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Writes `config_toml` over its configuration file, as
    /// [`Router::start`] would have written it: the router reloads it (it
    /// looks every 2 s). Only once it serves (a request answered): it reads
    /// the file it starts from as it gets going, after `start` returns.
    pub fn rewrite(&self, config_toml: &str) {
        let text = format!("{}{}", self.preamble, config_toml.replace("{router}", &format!("http://{}", self.addr)));
        std::fs::write(&self.file, text).expect("rewrite the test's configuration file");
    }

    /// A path on the router (`/metrics`, `/healthz`).
    pub fn path(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Starts the router's shutdown without waiting for it, so that a test
    /// can watch it drain; [`Router::stop`] then waits for the end.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Shuts the router down and waits until it has drained.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("router task").expect("router result");
        }
    }

    /// The value of one sample in `/metrics`, matched by metric name and
    /// label fragments (`upstream="a"`).
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let text = get_text(&self.path("/metrics")).await;
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| labels.iter().all(|f| l.contains(f)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The mock upstream over HTTP, in this process.
pub struct MockServer {
    pub mock: Mock,
    pub addr: SocketAddr,
    /// `http://ADDR/mcp`.
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
}

impl MockServer {
    /// Starts a mock with these options on a free port.
    pub async fn start(options: MockOptions) -> MockServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::on(listener, options).await
    }

    /// Starts a mock on a given listener (to restart one on the same port).
    pub async fn on(listener: TcpListener, options: MockOptions) -> MockServer {
        Self::serving(listener, options, None).await
    }

    /// Starts a mock serving HTTPS with this TLS acceptor
    /// ([`switchboard_mock::tls_acceptor`]); `url` is `https://localhost:PORT/mcp`.
    pub async fn start_tls(options: MockOptions, tls: tokio_rustls::TlsAcceptor) -> MockServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serving(listener, options, Some(tls)).await
    }

    async fn serving(
        listener: TcpListener,
        options: MockOptions,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> MockServer {
        let addr = listener.local_addr().expect("addr");
        let url = match tls {
            None => format!("http://{addr}/mcp"),
            Some(_) => format!("https://localhost:{}/mcp", addr.port()),
        };
        let mock = Mock::new(options);
        let (stop, stopped) = oneshot::channel::<()>();
        let served = mock.clone();
        tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            let _ = match tls {
                None => served.serve_http(listener, stopped).await,
                Some(tls) => served.serve_https(listener, tls, stopped).await,
            };
        });
        MockServer { mock, addr, url, stop: Some(stop) }
    }

    /// Stops serving (the port closes).
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Options for a named mock.
pub fn mock_named(name: &str) -> MockOptions {
    MockOptions { name: name.into(), ..MockOptions::default() }
}

/// The `switchboard-mock` binary, built next to the test binaries.
pub fn mock_binary() -> PathBuf {
    sibling_binary("switchboard-mock")
}

/// The router binary (`switchboard`), built next to the test binaries, for
/// tests that kill a router process.
pub fn router_binary() -> PathBuf {
    sibling_binary("switchboard")
}

/// The reference edge device binary (`switchboard-edge`), built next to
/// the test binaries.
pub fn edge_binary() -> PathBuf {
    sibling_binary("switchboard-edge")
}

fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: run `cargo build --workspace --bins` (scripts/test does)", path.display());
    path
}

/// A TOML `[[upstreams]]` entry for a stdio mock named `name`.
pub fn stdio_mock_upstream(name: &str, extra: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"--stdio\", \"--name\", \"{name}\"]\n{extra}\n",
        mock_binary().display()
    )
}

/// A TOML `[[upstreams]]` entry for an HTTP upstream.
pub fn http_upstream(name: &str, url: &str, extra: &str) -> String {
    format!("[[upstreams]]\nname = \"{name}\"\ntransport = \"http\"\nurl = \"{url}\"\n{extra}\n")
}

/// A stateless (MCP 2026-07-28) client: no session; every request carries
/// `_meta` (version, capabilities) and the `MCP-Protocol-Version`,
/// `Mcp-Method` and `Mcp-Name` headers.
#[derive(Clone)]
pub struct Stateless {
    /// Sends requests (an API key goes with them if it has one).
    pub client: Client,
    /// The capabilities declared in each request's `_meta`.
    pub capabilities: Value,
}

impl Stateless {
    /// A stateless client of `url` declaring `capabilities`.
    pub fn new(url: &str, capabilities: Value) -> Stateless {
        Stateless { client: Client::new(url), capabilities }
    }

    /// The message of a request: `params` with the era's `_meta` added.
    pub fn message(&self, id: u64, method: &str, params: Value) -> Value {
        let mut params = if params.is_null() { json!({}) } else { params };
        let meta = params.as_object_mut().expect("params is an object").entry("_meta").or_insert_with(|| json!({}));
        meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
        meta["io.modelcontextprotocol/clientCapabilities"] = self.capabilities.clone();
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    /// The headers the era asks for, from the message.
    pub fn headers(message: &Value) -> Vec<(String, String)> {
        let method = message["method"].as_str().unwrap_or_default().to_owned();
        let mut headers =
            vec![("mcp-protocol-version".to_owned(), "2026-07-28".to_owned()), ("mcp-method".to_owned(), method)];
        let params = &message["params"];
        if let Some(name) = params["name"].as_str().or_else(|| params["uri"].as_str()) {
            if matches!(message["method"].as_str(), Some("tools/call" | "prompts/get" | "resources/read")) {
                headers.push(("mcp-name".to_owned(), name.to_owned()));
            }
        }
        headers
    }

    /// Sends a request with the right headers.
    pub async fn request(&self, method: &str, params: Value) -> Reply {
        let id = self.client.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let message = self.message(id, method, params);
        let headers = Self::headers(&message);
        self.send(&message, &headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>()).await
    }

    /// Sends `message` with exactly these era headers (besides the usual
    /// `Content-Type` and `Accept`), to test what a server does with wrong ones.
    pub async fn send(&self, message: &Value, headers: &[(&str, &str)]) -> Reply {
        self.client.post_raw(serde_json::to_vec(message).expect("json").into(), headers).await
    }

    /// A request; returns its JSON-RPC response (from JSON or the SSE stream).
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.request(method, params).await.response()
    }

    /// A request whose answer is read as it streams.
    pub async fn stream(&self, method: &str, params: Value) -> (StatusCode, HeaderMap, EventStream) {
        let id = self.client.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let message = self.message(id, method, params);
        let headers = Self::headers(&message);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.client.post_stream(serde_json::to_vec(&message).expect("json").into(), &headers).await
    }
}

/// One HTTP answer, whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `Content-Type` header.
    pub fn content_type(&self) -> &str {
        self.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// The messages of an SSE body, in order.
    pub fn events(&self) -> Vec<Value> {
        let mut decoder = sse::Decoder::new(usize::MAX);
        decoder.push(&self.body);
        let mut out = Vec::new();
        while let Some(event) = decoder.next_event().expect("valid SSE") {
            if !event.data.is_empty() {
                out.push(serde_json::from_slice(&event.data).expect("JSON event"));
            }
        }
        out
    }

    /// The JSON-RPC response: the body itself, or the last SSE event.
    pub fn response(&self) -> Value {
        if self.content_type().starts_with("text/event-stream") {
            self.events().pop().expect("at least one event")
        } else {
            self.json()
        }
    }
}

/// A raw MCP client over HTTP.
#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    pub url: String,
    pub session: Option<String>,
    pub protocol_version: String,
    /// Sent as `Authorization: Bearer …` when set.
    pub api_key: Option<String>,
    next_id: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Client {
    /// A client for `url` (the router's `/mcp`).
    pub fn new(url: &str) -> Client {
        Client {
            http: HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
            url: url.to_owned(),
            session: None,
            protocol_version: "2025-11-25".into(),
            api_key: None,
            next_id: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1)),
        }
    }

    /// A client that sends this API key.
    pub fn with_key(url: &str, key: &str) -> Client {
        Client { api_key: Some(key.to_owned()), ..Client::new(url) }
    }

    /// `initialize` with these capabilities, then `notifications/initialized`.
    /// Returns the initialize result.
    pub async fn initialize_with(&mut self, capabilities: Value) -> Value {
        let reply = self
            .post(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": self.protocol_version, "capabilities": capabilities,
                "clientInfo": {"name": "switchboard-tests", "version": "0"}}}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "initialize: {}", String::from_utf8_lossy(&reply.body));
        let session = reply.headers.get("mcp-session-id").expect("a session id").to_str().expect("ascii");
        self.session = Some(session.to_owned());
        let result = reply.json()["result"].clone();
        if let Some(v) = result["protocolVersion"].as_str() {
            self.protocol_version = v.to_owned();
        }
        let note = self.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        assert_eq!(note.status, StatusCode::ACCEPTED);
        result
    }

    /// `initialize` declaring no capabilities.
    pub async fn initialize(&mut self) -> Value {
        self.initialize_with(json!({})).await
    }

    /// POSTs a JSON value with the usual headers.
    pub async fn post(&self, message: Value) -> Reply {
        self.post_raw(serde_json::to_vec(&message).expect("json").into(), &[]).await
    }

    /// POSTs raw bytes, with extra headers (which replace the usual ones).
    pub async fn post_raw(&self, body: Bytes, headers: &[(&str, &str)]) -> Reply {
        self.send(Method::POST, body, headers).await
    }

    /// A request to `/mcp`: JSON, both answer types accepted, the session's
    /// id (and, with `version`, its protocol version), the key, `headers`.
    fn build(&self, method: Method, body: Bytes, headers: &[(&str, &str)], version: bool) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = self.url.parse().expect("url");
        let h = req.headers_mut();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("accept", HeaderValue::from_static("application/json, text/event-stream"));
        if let Some(session) = &self.session {
            h.insert("mcp-session-id", HeaderValue::from_str(session).expect("ascii"));
            if version {
                h.insert("mcp-protocol-version", HeaderValue::from_str(&self.protocol_version).expect("ascii"));
            }
        }
        self.authorize(h);
        for (k, v) in headers {
            h.insert(HeaderName::from_bytes(k.as_bytes()).expect("name"), HeaderValue::from_str(v).expect("value"));
        }
        req
    }

    /// POSTs `message` and tells a failed exchange (the connection refused
    /// or cut: `Err` with the cause) from an answer; waits at most `wait`
    /// (`Err("timed out")` then, never mistaken for a cut connection).
    pub async fn try_post(&self, message: Value, wait: Duration) -> Result<Reply, String> {
        let req = self.build(Method::POST, serde_json::to_vec(&message).expect("json").into(), &[], true);
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| format!("request failed: {e:?}"))?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| format!("body failed: {e:?}"))?.to_bytes();
            Ok(Reply { status: parts.status, headers: parts.headers, body })
        };
        tokio::time::timeout(wait, exchange).await.unwrap_or_else(|_| Err("timed out".into()))
    }

    /// Sends any request to `/mcp` with the session headers.
    pub async fn send(&self, method: Method, body: Bytes, headers: &[(&str, &str)]) -> Reply {
        let req = self.build(method, body, headers, true);
        let resp = tokio::time::timeout(Duration::from_secs(30), self.http.request(req))
            .await
            .expect("the router answers within 30 s")
            .expect("request");
        let (parts, body) = resp.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(30), body.collect())
            .await
            .expect("the body ends within 30 s")
            .expect("body")
            .to_bytes();
        Reply { status: parts.status, headers: parts.headers, body }
    }

    /// A request with a fresh id; returns the whole reply.
    pub async fn request(&self, method: &str, params: Value) -> Reply {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await
    }

    /// A request; returns the JSON-RPC response (from JSON or the SSE stream).
    pub async fn call(&self, method: &str, params: Value) -> Value {
        let reply = self.request(method, params).await;
        assert_eq!(reply.status, StatusCode::OK, "{method}: {}", String::from_utf8_lossy(&reply.body));
        reply.response()
    }

    /// `tools/call`; returns the JSON-RPC response.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Value {
        self.call("tools/call", json!({"name": name, "arguments": arguments})).await
    }

    /// Exposed tool names from `tools/list`.
    pub async fn tool_names(&self) -> Vec<String> {
        let list = self.call("tools/list", json!({})).await;
        list["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("tools/list: {list}"))
            .iter()
            .map(|t| t["name"].as_str().expect("name").to_owned())
            .collect()
    }

    /// A request whose answer is read as it streams: returns the status,
    /// headers and the open event stream (a JSON answer arrives as one event).
    pub async fn request_stream(&self, method: &str, params: Value) -> (StatusCode, HeaderMap, EventStream) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).expect("json");
        self.post_stream(Bytes::from(body), &[]).await
    }

    /// POSTs `body` (with extra headers) and reads the answer as it streams.
    pub async fn post_stream(&self, body: Bytes, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, EventStream) {
        let req = self.build(Method::POST, body, headers, false);
        let resp = self.http.request(req).await.expect("POST");
        let (parts, body) = resp.into_parts();
        let is_sse = parts.headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if is_sse {
            return (
                parts.status,
                parts.headers,
                EventStream { body: Some(body), decoder: sse::Decoder::new(usize::MAX), ended: false },
            );
        }
        // Present a JSON answer as a single event.
        let whole = body.collect().await.expect("body").to_bytes();
        let mut decoder = sse::Decoder::new(usize::MAX);
        decoder.push(&sse::encode_event(None, None, &whole));
        (parts.status, parts.headers, EventStream { body: None, decoder, ended: true })
    }

    /// A plain SSE GET on this client's URL with extra headers (for the
    /// legacy `/sse` endpoint).
    pub async fn sse_get(&self, headers: &[(&str, &str)]) -> EventStream {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = self.url.parse().expect("url");
        req.headers_mut().insert("accept", HeaderValue::from_static("text/event-stream"));
        self.authorize(req.headers_mut());
        for (k, v) in headers {
            req.headers_mut()
                .insert(HeaderName::from_bytes(k.as_bytes()).expect("name"), HeaderValue::from_str(v).expect("value"));
        }
        let resp = self.http.request(req).await.expect("GET");
        assert_eq!(resp.status(), StatusCode::OK, "GET {}", self.url);
        EventStream { body: Some(resp.into_body()), decoder: sse::Decoder::new(usize::MAX), ended: false }
    }

    /// Opens the session's GET stream.
    pub async fn open_stream(&self) -> EventStream {
        self.resume_stream(None).await.1
    }

    /// Opens a GET stream, resuming after `last_event_id` if given; returns
    /// the status too.
    pub async fn resume_stream(&self, last_event_id: Option<&str>) -> (StatusCode, EventStream) {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = self.url.parse().expect("url");
        let h = req.headers_mut();
        h.insert("accept", HeaderValue::from_static("text/event-stream"));
        if let Some(id) = last_event_id {
            h.insert("last-event-id", HeaderValue::from_str(id).expect("ascii"));
        }
        if let Some(session) = &self.session {
            h.insert("mcp-session-id", HeaderValue::from_str(session).expect("ascii"));
        }
        self.authorize(h);
        let resp = self.http.request(req).await.expect("GET");
        let status = resp.status();
        if last_event_id.is_none() {
            assert_eq!(status, StatusCode::OK, "GET stream");
        }
        (status, EventStream { body: Some(resp.into_body()), decoder: sse::Decoder::new(usize::MAX), ended: false })
    }

    fn authorize(&self, h: &mut HeaderMap) {
        if let Some(key) = &self.api_key {
            h.insert("authorization", HeaderValue::from_str(&format!("Bearer {key}")).expect("ascii"));
        }
    }

    /// Ends the session.
    pub async fn delete(&self) -> StatusCode {
        self.send(Method::DELETE, Bytes::new(), &[]).await.status
    }
}

/// An open SSE stream.
pub struct EventStream {
    body: Option<hyper::body::Incoming>,
    decoder: sse::Decoder,
    /// The response body has ended (or failed): nothing more can arrive.
    ended: bool,
}

impl EventStream {
    /// The next message, or `None` if none arrives within `wait` or the stream ends.
    pub async fn next(&mut self, wait: Duration) -> Option<Value> {
        loop {
            let event = self.next_event(wait).await?;
            if !event.data.is_empty() {
                return Some(serde_json::from_slice(&event.data).expect("JSON event"));
            }
        }
    }

    /// The next SSE event as sent (priming events with empty data included).
    pub async fn next_event(&mut self, wait: Duration) -> Option<sse::Event> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(event) = self.decoder.next_event().expect("valid SSE") {
                return Some(event);
            }
            let body = self.body.as_mut()?;
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Ok(_) => {
                    self.ended = true;
                    self.body = None;
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// Every message until the stream ends; `None` if it has not ended
    /// within `wait` (so "the stream ends" is told apart from "nothing came").
    pub async fn until_end(&mut self, wait: Duration) -> Option<Vec<Value>> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut messages = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(message) => messages.push(message),
                None if self.ended => return Some(messages),
                None => return None,
            }
        }
    }
}

/// GETs a URL and returns its body as text.
pub async fn get_text(url: &str) -> String {
    get_text_with(url, &[]).await
}

/// GETs a URL with extra headers (`authorization`) and returns its body as text.
pub async fn get_text_with(url: &str, headers: &[(&str, &str)]) -> String {
    try_get_text_with(url, headers).await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// GETs a URL and returns its body as text, or why there is none (the
/// connection refused, or closed before an answer).
pub async fn try_get_text_with(url: &str, headers: &[(&str, &str)]) -> Result<String, String> {
    let client: HyperClient<HttpConnector, Full<Bytes>> =
        HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut req = Request::builder().method(Method::GET).uri(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp =
        client.request(req.body(Full::new(Bytes::new())).expect("request")).await.map_err(|e| format!("{e:?}"))?;
    let body = resp.into_body().collect().await.map_err(|e| format!("{e:?}"))?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Polls `check` until it is true or `wait` passes.
pub async fn eventually<F, Fut>(wait: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
