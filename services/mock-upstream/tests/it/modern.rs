//! MCP 2026-07-28 (stateless requests) against the mock over HTTP: discovery,
//! validation, an `input_required` round trip, listen streams, and the 2025
//! path still answering on the same endpoint.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use switchboard_mock::{Mock, Options};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

const V: &str = "2026-07-28";

struct Served {
    addr: std::net::SocketAddr,
    mock: Mock,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A mock serving both eras.
async fn serve(options: Options) -> Served {
    let options = Options { modern: true, ..options };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mock = Mock::new(options);
    let (stop, stopped) = oneshot::channel::<()>();
    let served = mock.clone();
    tokio::spawn(async move {
        let _ = served
            .serve_http(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    Served { addr, mock, stop: Some(stop) }
}

struct Answer {
    status: u16,
    content_type: String,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    /// The JSON body, or the last JSON-RPC response of an SSE body.
    fn json(&self) -> Value {
        if self.content_type.starts_with("text/event-stream") {
            return self.events().into_iter().rev().find(|m| m.get("id").is_some()).expect("a response event");
        }
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    fn events(&self) -> Vec<Value> {
        let text = std::str::from_utf8(&self.body).unwrap();
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect()
    }
}

async fn send(addr: std::net::SocketAddr, method: &str, headers: &[(&str, String)], body: &str) -> Answer {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}/mcp"))
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        request = request.header(*k, v);
    }
    let request = request.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer { status, content_type, headers, body }
}

/// A mock serving 2025 only (the default).
async fn serve_2025_only() -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mock = Mock::new(Options::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let served = mock.clone();
    tokio::spawn(async move {
        let _ = served
            .serve_http(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    Served { addr, mock, stop: Some(stop) }
}

/// A well-formed 2026-07-28 request: `_meta` and the routing headers.
async fn call(addr: std::net::SocketAddr, id: u64, method: &str, mut params: Value, caps: Value) -> Answer {
    let meta = params["_meta"].as_object().cloned().unwrap_or_default();
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
    });
    params["_meta"].as_object_mut().unwrap().extend(meta);
    let mut headers = vec![("mcp-protocol-version", V.to_owned()), ("mcp-method", method.to_owned())];
    if let Some(name) = params["name"].as_str().or(params["uri"].as_str()) {
        headers.push(("mcp-name", name.to_owned()));
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
    send(addr, "POST", &headers, &body).await
}

#[tokio::test]
async fn discovery_names_both_eras_and_results_carry_the_eras_members() {
    let served = serve(Options { name: "m".into(), ..Options::default() }).await;
    let answer = call(served.addr, 1, "server/discover", json!({}), json!({})).await;
    assert_eq!(answer.status, 200);
    let result = &answer.json()["result"];
    let versions = result["supportedVersions"].as_array().unwrap();
    assert!(versions.contains(&json!(V)) && versions.contains(&json!("2025-11-25")), "{result}");
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["cacheScope"], "public");
    assert!(result["ttlMs"].is_u64());
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "m");
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true);

    let listed = call(served.addr, 2, "tools/list", json!({}), json!({})).await.json();
    assert_eq!(listed["result"]["resultType"], "complete");
    assert!(listed["result"]["ttlMs"].is_u64() && listed["result"]["cacheScope"].is_string(), "{listed}");
    let echoed = call(served.addr, 3, "tools/call", json!({"name": "echo", "arguments": {"a": 1}}), json!({})).await;
    assert_eq!(echoed.json()["result"]["content"][0]["text"], r#"{"a":1}"#);
    assert_eq!(echoed.json()["result"]["resultType"], "complete");
}

#[tokio::test]
async fn invalid_requests_are_refused_in_the_eras_order() {
    let served = serve(Options::default()).await;
    let addr = served.addr;
    let headers = |method: &str| vec![("mcp-protocol-version", V.to_owned()), ("mcp-method", method.to_owned())];

    // No _meta: -32602, HTTP 400, the request's id echoed.
    let answer = send(addr, "POST", &headers("tools/list"), r#"{"jsonrpc":"2.0","id":41,"method":"tools/list"}"#).await;
    assert_eq!((answer.status, answer.json()["error"]["code"].as_i64()), (400, Some(-32602)));
    assert_eq!(answer.json()["id"], 41);

    // Header and _meta disagree: -32020.
    let body = json!({"jsonrpc": "2.0", "id": 42, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "v999", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let answer = send(addr, "POST", &headers("tools/list"), &body.to_string()).await;
    assert_eq!((answer.status, answer.json()["error"]["code"].as_i64()), (400, Some(-32020)));

    // Both name an unknown version: -32022 with the supported ones.
    let answer = send(
        addr,
        "POST",
        &[("mcp-protocol-version", "v999".into()), ("mcp-method", "tools/list".into())],
        &body.to_string(),
    )
    .await;
    let error = &answer.json()["error"];
    assert_eq!((answer.status, error["code"].as_i64()), (400, Some(-32022)));
    assert_eq!(error["data"]["requested"], "v999");
    assert!(error["data"]["supported"].as_array().unwrap().contains(&json!(V)));

    // Mcp-Method and Mcp-Name must match the body.
    let mut params = json!({"name": "echo", "arguments": {}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}});
    let call_body = json!({"jsonrpc": "2.0", "id": 43, "method": "tools/call", "params": params}).to_string();
    let answer = send(addr, "POST", &headers("tools/list"), &call_body).await;
    assert_eq!((answer.status, answer.json()["error"]["code"].as_i64()), (400, Some(-32020)));
    let answer = send(addr, "POST", &headers("tools/call"), &call_body).await;
    assert_eq!((answer.status, answer.json()["error"]["code"].as_i64()), (400, Some(-32020)), "no Mcp-Name");
    let mut named = headers("tools/call");
    named.push(("mcp-name", "=?base64?ZWNobw==?=".into()));
    let answer = send(addr, "POST", &named, &call_body).await;
    assert_eq!(answer.status, 200, "a Base64 Mcp-Name is decoded: {:?}", answer.body);

    // Removed and unknown methods: 404, -32601.
    for method in ["ping", "initialize", "no/such"] {
        params = json!({"_meta": {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}});
        let body = json!({"jsonrpc": "2.0", "id": 44, "method": method, "params": params}).to_string();
        let answer = send(addr, "POST", &headers(method), &body).await;
        assert_eq!((answer.status, answer.json()["error"]["code"].as_i64()), (404, Some(-32601)), "{method}");
    }

    // GET in this era: 405, Allow: POST.
    let answer = send(addr, "GET", &[("mcp-protocol-version", V.into())], "").await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.headers["allow"], "POST");
}

#[tokio::test]
async fn an_input_required_round_trip_works_at_a_restarted_mock() {
    let first = serve(Options::default()).await;
    let caps = json!({"sampling": {}});
    let params = json!({"name": "sample", "arguments": {"prompt": "haiku"}});
    let asked = call(first.addr, 1, "tools/call", params.clone(), caps.clone()).await.json();
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let (key, request) = result["inputRequests"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["messages"][0]["content"]["text"], "haiku");
    let state = result["requestState"].as_str().unwrap().to_owned();
    drop(first);

    // Another mock (a replica, or this one restarted) takes the state.
    let second = serve(Options::default()).await;
    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "re haiku"}, "model": "m"});
    let mut retry = params.clone();
    retry["requestState"] = json!(state);
    retry["inputResponses"] = json!({key.as_str(): answer});
    let done = call(second.addr, 2, "tools/call", retry.clone(), caps.clone()).await;
    assert_eq!(done.status, 200);
    let done = done.json();
    assert_eq!(done["id"], 2);
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "sampled: re haiku");

    // An altered state is refused (HTTP 200, -32602).
    retry["requestState"] = json!(format!("{state}x"));
    let refused = call(second.addr, 3, "tools/call", retry, caps).await;
    assert_eq!((refused.status, refused.json()["error"]["code"].as_i64()), (200, Some(-32602)));

    // Without the capability the call says what it needs.
    let missing = call(second.addr, 4, "tools/call", params, json!({})).await;
    assert_eq!((missing.status, missing.json()["error"]["code"].as_i64()), (400, Some(-32021)));
    assert_eq!(missing.json()["error"]["data"]["requiredCapabilities"], json!({"sampling": {}}));
}

#[tokio::test]
async fn progress_and_logs_stream_on_the_post_and_logs_need_a_level() {
    let served = serve(Options::default()).await;
    let mut params = json!({"name": "progress", "arguments": {"steps": 2, "interval_ms": 1}});
    params["_meta"] = json!({"progressToken": "p"});
    let answer = call(served.addr, 1, "tools/call", params, json!({})).await;
    assert!(answer.content_type.starts_with("text/event-stream"));
    assert!(!std::str::from_utf8(&answer.body).unwrap().contains("id: "), "no event ids in this era");
    let events = answer.events();
    assert_eq!(events.iter().filter(|e| e["method"] == "notifications/progress").count(), 2);
    assert_eq!(events.last().unwrap()["result"]["resultType"], "complete");

    let quiet = call(served.addr, 2, "tools/call", json!({"name": "log", "arguments": {}}), json!({})).await;
    assert!(quiet.events().iter().all(|e| e["method"] != "notifications/message"), "no logLevel, no logs");
    let mut params = json!({"name": "log", "arguments": {}});
    params["_meta"] = json!({"io.modelcontextprotocol/logLevel": "info"});
    let mut body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params});
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!(V);
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let headers = [
        ("mcp-protocol-version", V.to_owned()),
        ("mcp-method", "tools/call".to_owned()),
        ("mcp-name", "log".to_owned()),
    ];
    let loud = send(served.addr, "POST", &headers, &body.to_string()).await;
    assert!(loud.events().iter().any(|e| e["method"] == "notifications/message"), "{:?}", loud.body);
}

/// The next SSE event of a stream, as JSON.
async fn next_event(body: &mut hyper::body::Incoming) -> Value {
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.unwrap().unwrap().unwrap();
    let data = frame.into_data().unwrap();
    let text = std::str::from_utf8(&data).unwrap();
    serde_json::from_str(text.trim().strip_prefix("data: ").unwrap()).unwrap()
}

#[tokio::test]
async fn listen_streams_hear_the_changes_they_asked_for() {
    let served = serve(Options::default()).await;
    let addr = served.addr;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let body = json!({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": {
        "notifications": {"toolsListChanged": true},
        "_meta": {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}}});
    let request = http::Request::post(format!("http://{addr}/mcp"))
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V)
        .header("mcp-method", "subscriptions/listen")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let mut response = sender.send_request(request).await.unwrap().into_body();
    let ack = next_event(&mut response).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub-1");
    assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}));
    assert_eq!(served.mock.listen_streams(), 1);

    let added =
        call(addr, 1, "tools/call", json!({"name": "add_tool", "arguments": {"name": "extra"}}), json!({})).await;
    assert_eq!(added.status, 200);
    let changed = next_event(&mut response).await;
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    assert_eq!(changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub-1");
}

#[tokio::test]
async fn the_2025_handshake_still_works_on_the_same_endpoint() {
    let served = serve(Options::default()).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let answer = send(served.addr, "POST", &[], &init.to_string()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["result"]["protocolVersion"], "2025-11-25");
    assert!(answer.json()["result"].get("resultType").is_none());
    let session = answer.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let headers = [("mcp-session-id", session), ("mcp-protocol-version", "2025-11-25".to_owned())];
    let listed = send(served.addr, "POST", &headers, &list).await;
    assert!(listed.json()["result"]["tools"].is_array());
    assert_eq!(served.mock.initialize_count(), 1);
}

#[tokio::test]
async fn without_modern_the_mock_answers_2026_requests_as_a_2025_server() {
    let served = serve_2025_only().await;
    let answer = call(served.addr, 1, "server/discover", json!({}), json!({})).await;
    assert_eq!(answer.status, 400, "no session: {:?}", answer.body);
}
