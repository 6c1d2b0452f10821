//! Edge devices through the router: the reference device (`switchboard-edge`)
//! and raw devices speaking the framed protocol, MCP clients of the same and
//! of another tenant (the official Python SDK and our raw client), keys in
//! SQLite, the admin API, audit, metrics, TLS.
//!
//! The Python client needs `scripts/install-peers` (run by `scripts/test`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::{json, Value};
use switchboard_core::policy::Policy;
use switchboard_db::Database;
use switchboard_protocol::edge::{self as frames, Decoder, Frame};
use switchboard_router::admin::Admin;
use switchboard_router::Config;
use switchboard_test_support::peers::{run_python_client, Process};
use switchboard_test_support::services::unique;
use switchboard_test_support::{
    edge_binary, eventually, get_text, get_text_with, http_upstream, mock_named, Client, MockServer, Router,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ADMIN_TOKEN: &str = "edge-test-admin-token";

/// A router config with keys in a fresh SQLite database, audit on, the
/// admin API, and an edge listener with `edge_extra` settings.
fn config(dir: &Path, edge_extra: &str, extra: &str) -> String {
    config_on(dir, 0, edge_extra, extra)
}

/// [`config`] with the edge listener on `port` (0: any free port).
fn config_on(dir: &Path, port: u16, edge_extra: &str, extra: &str) -> String {
    format!(
        "[auth]\nmode = \"keys\"\n[database]\nurl = \"sqlite:{db}\"\nrefresh = \"200ms\"\n\
         [audit]\nspool = \"{spool}\"\nflush_every = \"20ms\"\n\
         [admin]\nlisten = \"127.0.0.1:1\"\ntoken = \"{ADMIN_TOKEN}\"\n\
         [edge]\nlisten = \"127.0.0.1:{port}\"\n{edge_extra}\n{extra}",
        db = dir.join("switchboard.db").display(),
        spool = dir.join("audit.spool").display(),
    )
}

fn temp_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(prefix));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Creates tenants `acme` and `globex` and returns a key of each.
async fn tenants(config: &str) -> (String, String) {
    let config = Config::from_toml(config).expect("config");
    let db = Database::connect(config.database.url.as_deref().unwrap(), Duration::from_secs(3)).unwrap();
    db.migrate().await.unwrap();
    let admin = Admin::new(db, &config);
    let all = Policy { upstreams: vec!["*".into()], ..Policy::default() };
    admin.create_tenant("acme", all.clone()).await.unwrap();
    admin.create_tenant("globex", all).await.unwrap();
    (admin.create_key("acme", None).await.unwrap().key, admin.create_key("globex", None).await.unwrap().key)
}

/// A router on a fresh database in `dir` with tenants `acme` and `globex`;
/// returns it with a key of each.
async fn start(dir: &Path, edge_extra: &str, extra: &str) -> (Router, String, String) {
    let config = config(dir, edge_extra, extra);
    let (key_a, key_b) = tenants(&config).await;
    (Router::start(&config).await, key_a, key_b)
}

/// The reference device, connected to `edge` with `key`.
fn reference_device(edge: SocketAddr, key: &str, device: &str, sandbox: &Path, extra: &[&str]) -> Process {
    let mut args = vec!["--router".to_owned(), edge.to_string(), "--device".into(), device.into()];
    args.extend(["--sandbox".into(), sandbox.display().to_string(), "--max-backoff".into(), "1".into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Process::spawn(&edge_binary(), &args, &[("SWITCHBOARD_KEY", key)])
}

async fn admin_get(router: &Router, path: &str) -> Value {
    let url = format!("http://{}{path}", router.admin_addr.expect("admin API"));
    let text = get_text_with(&url, &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))]).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

async fn connected_devices(router: &Router) -> f64 {
    router.metric("switchboard_edge_devices", &["state=\"connected\""]).await
}

/// A device speaking the framed protocol by hand.
pub(crate) struct RawDevice {
    stream: TcpStream,
    decoder: Decoder,
    seq: u16,
}

impl RawDevice {
    pub(crate) async fn connect(edge: SocketAddr) -> RawDevice {
        RawDevice { stream: TcpStream::connect(edge).await.unwrap(), decoder: Decoder::new(1 << 20), seq: 0 }
    }

    async fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, message: Value) {
        let mut out = BytesMut::new();
        frames::encode_json(self.seq, message.to_string().as_bytes(), &mut out);
        self.seq += 1;
        self.send_bytes(&out).await;
    }

    pub(crate) async fn register(&mut self, key: &str, device: &str, services: Value) -> Value {
        self.send(
            json!({"type": "register", "data": {"device": device, "auth": {"api_key": key}, "services": services}}),
        )
        .await;
        self.message().await.expect("an answer to register")
    }

    /// The next frame; `None` when the router closed the connection.
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(decoded) = self.decoder.next_frame() {
                return Some(decoded.expect("the router sends well-formed frames"));
            }
            let read =
                tokio::time::timeout(Duration::from_secs(10), self.stream.read_buf(self.decoder.buffer_mut(4096)))
                    .await
                    .expect("the router says something within 10 s");
            match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The next MCP message.
    async fn message(&mut self) -> Option<Value> {
        loop {
            let frame = self.frame().await?;
            if frame.kind == frames::MCP {
                return Some(serde_json::from_slice(&frame.payload).expect("JSON"));
            }
        }
    }
}

fn slow_service() -> Value {
    json!({"wait": {"description": "Answers when it likes.", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_device_serves_its_tenant_through_the_python_sdk() {
    let dir = temp_dir("sb-edge-");
    let (router, key_a, key_b) = start(&dir, "", "").await;
    let edge = router.edge_addr.unwrap();
    let sandbox = dir.join("sandbox");
    let _device = reference_device(edge, &key_a, "desk", &sandbox, &[]);
    assert!(eventually(Duration::from_secs(20), || async { connected_devices(&router).await == 1.0 }).await);

    // The Python SDK client of the same tenant lists and calls the device's tools.
    let target = json!({"url": router.url, "key": key_a}).to_string();
    let calls = json!([
        ["desk__get_current_time", {"format": "simple"}],
        ["desk__get_current_time", {"format": "detailed"}],
        ["desk__create_file", {"filename": "notes/hello.txt", "content": "hello from MCP"}],
        ["desk__create_file", {"filename": "../escape.txt", "content": "out"}],
    ]);
    let out = run_python_client("list_and_call.py", &[&target, &calls.to_string()]).await;
    let tools: Vec<&str> = out["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tools, ["desk__create_file", "desk__get_current_time"], "only the device's tools (no upstreams)");
    let results = &out["results"];
    let simple = results[0]["content"][0]["text"].as_str().unwrap();
    assert!(simple.ends_with(" UTC") && simple.len() == "2026-11-22 12:00:00 UTC".len(), "{simple}");
    assert!(results[0].get("isError").is_none_or(|e| e == false));
    let detailed = &results[1]["structuredContent"];
    assert_eq!(detailed["timezone"], "UTC");
    assert!(detailed["unix_seconds"].as_i64().unwrap() > 1_700_000_000);
    let detailed_text: Value = serde_json::from_str(results[1]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&detailed_text, detailed, "the JSON data also as JSON text");
    assert_eq!(std::fs::read_to_string(sandbox.join("notes/hello.txt")).unwrap(), "hello from MCP");
    assert_eq!(results[2]["structuredContent"]["bytes"], 14);
    assert_eq!(results[3]["isError"], true, "{}", results[3]);
    assert!(results[3]["content"][0]["text"].as_str().unwrap().contains("escapes the sandbox"));
    assert!(!dir.join("escape.txt").exists());

    // Invalid arguments are refused by the router, before the device.
    let client = {
        let mut c = Client::with_key(&router.url, &key_a);
        c.initialize().await;
        c
    };
    let calls_before = router.metric("switchboard_edge_frames_total", &["direction=\"out\"", "type=\"mcp\""]).await;
    let bad = client.call_tool("desk__get_current_time", json!({"format": "verbose"})).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert_eq!(bad["error"]["data"]["path"], "arguments.format");
    assert!(bad["error"]["message"].as_str().unwrap().contains("must be one of \"simple\", \"detailed\""), "{bad}");
    let missing = client.call_tool("desk__create_file", json!({"filename": "x"})).await;
    assert_eq!(missing["error"]["code"], -32602);
    assert!(missing["error"]["message"].as_str().unwrap().contains("\"content\" is required"), "{missing}");
    let wrong_type = client.call_tool("desk__create_file", json!({"filename": 7, "content": ""})).await;
    assert_eq!(wrong_type["error"]["data"]["path"], "arguments.filename");
    let too_long = client.call_tool("desk__create_file", json!({"filename": "x".repeat(256), "content": ""})).await;
    assert!(too_long["error"]["message"].as_str().unwrap().contains("at most 255 characters"), "{too_long}");
    let calls_after = router.metric("switchboard_edge_frames_total", &["direction=\"out\"", "type=\"mcp\""]).await;
    assert_eq!(calls_before, calls_after, "no call frame reached the device");
    assert_eq!(router.metric("switchboard_edge_calls_total", &["outcome=\"rejected\""]).await, 4.0);

    // Another tenant sees none of it: not in its list, and unknown when named.
    let other =
        run_python_client("list_and_call.py", &[&json!({"url": router.url, "key": key_b}).to_string(), "[]"]).await;
    assert_eq!(other["tools"], json!([]));
    let mut stranger = Client::with_key(&router.url, &key_b);
    stranger.initialize().await;
    let unknown = stranger.call_tool("desk__get_current_time", json!({"format": "simple"})).await;
    let nowhere = stranger.call_tool("nothing__here", json!({})).await;
    assert_eq!(unknown["error"]["code"], nowhere["error"]["code"]);
    assert_eq!(unknown["error"]["message"], "unknown tool: desk__get_current_time");
    assert_eq!(
        admin_get(&router, "/v1/edge/devices?tenant=globex").await["devices"],
        json!([]),
        "the admin API filters by tenant"
    );

    // Operations: the admin API lists the device, metrics count it, and
    // every call has its audit record.
    let devices = admin_get(&router, "/v1/edge/devices").await;
    let desk = &devices["devices"][0];
    assert_eq!(
        (desk["tenant"].as_str(), desk["device"].as_str(), desk["connected"].as_bool()),
        (Some("acme"), Some("desk"), Some(true))
    );
    assert_eq!(desk["services"].as_array().unwrap().len(), 2);
    assert!(desk["key_prefix"].as_str().unwrap().starts_with("sb_"), "the key's prefix, never the key");
    assert!(!devices.to_string().contains(&key_a));
    assert_eq!(router.metric("switchboard_edge_services", &[]).await, 2.0);
    assert_eq!(router.metric("switchboard_edge_calls_total", &["outcome=\"ok\""]).await, 4.0);
    let audited = eventually(Duration::from_secs(10), || async {
        let records = admin_get(&router, "/v1/audit?tenant=acme&limit=100").await;
        records["records"].as_array().unwrap().iter().filter(|r| r["upstream"] == "edge:desk").count() == 8
    })
    .await;
    assert!(audited, "{}", admin_get(&router, "/v1/audit?tenant=acme&limit=100").await);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_drops_mid_call_fails_the_call_promptly_and_can_come_back() {
    let dir = temp_dir("sb-edge-");
    let (router, key, _) = start(&dir, "grace = \"500ms\"\ncall_timeout = \"30s\"", "").await;
    let edge = router.edge_addr.unwrap();
    let mut client = Client::with_key(&router.url, &key);
    client.initialize().await;
    let mut stream = client.open_stream().await;

    let mut device = RawDevice::connect(edge).await;
    let registered = device.register(&key, "slow", slow_service()).await;
    assert_eq!(registered["type"], "registered", "{registered}");
    assert_eq!(registered["data"]["tools"], json!(["slow__wait"]));
    let note = stream.next(Duration::from_secs(5)).await.expect("list_changed on register");
    assert_eq!(note["method"], "notifications/tools/list_changed");

    // A call the device receives and never answers; then the device drops.
    let caller = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (client.call_tool("slow__wait", json!({"n": 1})).await, started.elapsed())
        })
    };
    let call = device.message().await.unwrap();
    assert_eq!(call["type"], "call");
    assert_eq!(call["data"]["method"], "wait");
    assert_eq!(call["data"]["params"], json!({"n": 1}));
    drop(device);
    let (answer, took) = caller.await.unwrap();
    assert!(took < Duration::from_secs(5), "the caller hears at once, not after the 30 s timeout: {took:?}");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("disconnected"), "{answer}");

    // Within the grace period the tool stays listed, and calls fail at once.
    assert_eq!(client.tool_names().await, ["slow__wait"]);
    let during = client.call_tool("slow__wait", json!({})).await;
    assert!(during["error"]["message"].as_str().unwrap().contains("the device is disconnected"), "{during}");
    // After it, the tool goes and the tenant's sessions hear so.
    let note = stream.next(Duration::from_secs(5)).await.expect("list_changed after the grace period");
    assert_eq!(note["method"], "notifications/tools/list_changed");
    assert!(client.tool_names().await.is_empty());
    assert_eq!(connected_devices(&router).await, 0.0);

    // It reconnects, registers again, and calls work; this time it answers,
    // and many concurrent calls on one connection are matched by call_id.
    let mut device = RawDevice::connect(edge).await;
    assert_eq!(device.register(&key, "slow", slow_service()).await["type"], "registered");
    let mut callers = Vec::new();
    for n in 0..8 {
        let client = client.clone();
        callers.push(tokio::spawn(async move { client.call_tool("slow__wait", json!({"n": n})).await }));
    }
    let mut calls = Vec::new();
    for _ in 0..8 {
        calls.push(device.message().await.unwrap());
    }
    // Answer in reverse order, with a result for no call in between.
    device
        .send(json!({"type": "result", "data": {"call_id": "nobody", "result": {"success": true, "data": "lost"}}}))
        .await;
    for call in calls.iter().rev() {
        let n = call["data"]["params"]["n"].as_i64().unwrap();
        let result = if n == 3 {
            json!({"success": false, "error": "three is unlucky"})
        } else {
            json!({"success": true, "data": format!("waited {n}")})
        };
        device.send(json!({"type": "result", "data": {"call_id": call["data"]["call_id"], "result": result}})).await;
    }
    for (n, caller) in callers.into_iter().enumerate() {
        let answer = caller.await.unwrap();
        let result = &answer["result"];
        if n == 3 {
            assert_eq!(result["isError"], true);
            assert_eq!(result["content"][0]["text"], "three is unlucky");
        } else {
            assert_eq!(result["content"][0]["text"], format!("waited {n}"), "{answer}");
            assert!(result.get("isError").is_none());
        }
    }
    assert!(
        eventually(Duration::from_secs(2), || async {
            router.metric("switchboard_edge_frame_errors_total", &["reason=\"unknown_call_id\""]).await == 1.0
        })
        .await
    );
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_device_reconnects_to_a_restarted_router() {
    let dir = temp_dir("sb-edge-");
    let (key, _) = tenants(&config_on(&dir, 0, "", "")).await;
    let router = Router::start(&config_on(&dir, 0, "", "")).await;
    // The restarted router listens where the first one bound (port 0 there).
    let config = config_on(&dir, router.edge_addr.unwrap().port(), "", "");
    let sandbox = dir.join("sandbox");
    let _device = reference_device(router.edge_addr.unwrap(), &key, "desk", &sandbox, &[]);
    assert!(eventually(Duration::from_secs(20), || async { connected_devices(&router).await == 1.0 }).await);
    router.stop().await;

    // A new router on the same port: the device comes back by itself.
    let router = Router::start(&config).await;
    assert!(eventually(Duration::from_secs(20), || async { connected_devices(&router).await == 1.0 }).await);
    let mut client = Client::with_key(&router.url, &key);
    client.initialize().await;
    let answer = client.call_tool("desk__create_file", json!({"filename": "again.txt", "content": "back"})).await;
    assert_eq!(answer["result"]["structuredContent"]["bytes"], 4, "{answer}");
    assert_eq!(std::fs::read_to_string(sandbox.join("again.txt")).unwrap(), "back");

    // The README's third command: `switchboard call`.
    let out = tokio::process::Command::new(switchboard_test_support::router_binary())
        .args(["call", &router.url, "desk__get_current_time", r#"{"format":"detailed"}"#])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["structuredContent"]["timezone"], "UTC", "{result}");
    let refused = tokio::process::Command::new(switchboard_test_support::router_binary())
        .args(["call", &router.url, "desk__get_current_time", r#"{"format":"long"}"#])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("arguments.format"));
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_devices_get_clear_errors_and_the_router_stays_healthy() {
    let dir = temp_dir("sb-edge-");
    let (router, key, _) = start(&dir, "register_timeout = \"300ms\"\nmax_frame_bytes = 4096", "").await;
    let edge = router.edge_addr.unwrap();

    // A wrong key: an error message, then the connection closes.
    let mut device = RawDevice::connect(edge).await;
    let refused = device.register("sb_not_a_real_key_at_all_000000000000000000", "x", json!({})).await;
    assert_eq!(refused["type"], "error");
    assert_eq!(refused["data"]["code"], "unauthenticated");
    assert!(device.frame().await.is_none(), "closed");
    // No key at all.
    let mut device = RawDevice::connect(edge).await;
    device.send(json!({"type": "register", "data": {"device": "x", "services": {}}})).await;
    assert_eq!(device.message().await.unwrap()["data"]["code"], "unauthenticated");
    // Something other than register first.
    let mut device = RawDevice::connect(edge).await;
    device.send(json!({"type": "result", "data": {"call_id": "1", "result": {}}})).await;
    assert_eq!(device.message().await.unwrap()["data"]["code"], "not_registered");
    assert!(device.frame().await.is_none());
    // An unknown frame type before registering: error, closed.
    let mut device = RawDevice::connect(edge).await;
    let mut unknown = BytesMut::new();
    frames::encode(0x09, b"task0042", 0, b"?", &mut unknown);
    device.send_bytes(&unknown).await;
    assert_eq!(device.message().await.unwrap()["data"]["code"], "not_registered");
    assert!(device.frame().await.is_none());
    // Silence: closed after register_timeout.
    let mut device = RawDevice::connect(edge).await;
    assert_eq!(device.message().await.unwrap()["data"]["code"], "register_timeout");
    assert!(device.frame().await.is_none());
    // A bad device name; a service whose parameters are not an object schema.
    let mut device = RawDevice::connect(edge).await;
    assert_eq!(device.register(&key, "bad name!", json!({})).await["data"]["code"], "invalid");
    let mut device = RawDevice::connect(edge).await;
    let services = json!({"ok": {"description": "fine"}, "bad": {"parameters": {"type": "string"}}});
    let registered = device.register(&key, "mixed", services).await;
    assert_eq!(registered["data"]["tools"], json!(["mixed__ok"]));
    assert!(registered["data"]["refused"]["bad"].as_str().unwrap().contains("type \"object\""));
    // Two devices whose tool names would collide (`a` + `_b`, `a_` + `b`): the second is refused that tool.
    let mut first = RawDevice::connect(edge).await;
    assert_eq!(first.register(&key, "a", json!({"_b": {}})).await["data"]["tools"], json!(["a___b"]));
    let mut second = RawDevice::connect(edge).await;
    let clash = second.register(&key, "a_", json!({"b": {}, "c": {}})).await;
    assert_eq!(clash["data"]["tools"], json!(["a___c"]), "{clash}");
    assert!(clash["data"]["refused"]["b"].as_str().unwrap().contains("taken by device \"a\""));
    // A second connection with the same name takes the device over; the first is closed.
    let mut again = RawDevice::connect(edge).await;
    assert_eq!(again.register(&key, "a", json!({"_b": {}})).await["type"], "registered");
    assert!(first.frame().await.is_none(), "the replaced connection is closed");

    // Garbage, an unknown frame type, bad JSON, an unknown message and an
    // oversized frame: each answered or counted; the connection stays up.
    device.send_bytes(b"noise before a frame").await;
    let mut unknown = BytesMut::new();
    frames::encode(0x09, b"task0042", 0, b"?", &mut unknown);
    device.send_bytes(&unknown).await;
    let error = device.message().await.unwrap();
    assert_eq!(error["data"]["code"], "unknown_frame_type", "{error}");
    assert!(error["data"]["message"].as_str().unwrap().contains("0x09"));
    device.send_bytes(b"##START\x06mcp000010009{not json##END").await;
    assert_eq!(device.message().await.unwrap()["data"]["code"], "bad_json");
    device.send(json!({"type": "dance"})).await;
    assert_eq!(device.message().await.unwrap()["data"]["code"], "unknown_message");
    let mut big = BytesMut::new();
    frames::encode(frames::TEXT, b"task0001", 0, &vec![b'x'; 5000], &mut big);
    device.send_bytes(&big).await;
    // Still registered and answering: a call goes through.
    let mut client = Client::with_key(&router.url, &key);
    client.initialize().await;
    let caller = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("mixed__ok", json!({})).await })
    };
    let call = device.message().await.unwrap();
    device.send(json!({"type": "result", "data": {"call_id": call["data"]["call_id"], "result": {"success": true, "data": {"fine": true}}}})).await;
    assert_eq!(caller.await.unwrap()["result"]["structuredContent"], json!({"fine": true}));
    for reason in ["garbage", "unknown_type", "bad_json", "unknown_message", "too_large"] {
        let n = router.metric("switchboard_edge_frame_errors_total", &[&format!("reason=\"{reason}\"")]).await;
        assert!(n >= 1.0, "{reason} counted");
    }
    assert_eq!(get_text(&router.path("/healthz")).await, "ok\n");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_tasks_go_to_the_handler_tool_and_back() {
    let agent = MockServer::start(mock_named("agent")).await;
    let dir = temp_dir("sb-edge-");
    let upstream = http_upstream("agent", &agent.url, "");
    let (router, key, _) = start(&dir, "task_handler = \"agent__echo\"\nmax_frame_bytes = 256", &upstream).await;
    let mut device = RawDevice::connect(router.edge_addr.unwrap()).await;
    assert_eq!(device.register(&key, "desk", json!({})).await["type"], "registered");

    // The question in two frames with the bracketed seq form, a long tail in
    // more frames (so that the answer needs several 256-byte frames too), then the end.
    device.send_bytes(b"##START\x04task0007[0000]what time##END##START\x04task0007[0001] is it?##END").await;
    let tail = " Please answer ##END-safely.".repeat(12);
    let mut out = BytesMut::new();
    let n = frames::encode_text(b"task0007", 2, &tail, 200, &mut out);
    frames::encode_end(b"task0007", 2 + n as u16, &mut out);
    device.send_bytes(&out).await;
    let question = format!("what time is it?{tail}");
    let mut answer = Vec::new();
    let mut seqs = Vec::new();
    loop {
        let frame = device.frame().await.expect("an answer");
        assert_eq!(frame.task_str(), "task0007");
        seqs.push(frame.seq);
        match frame.kind {
            frames::TEXT => answer.extend_from_slice(&frame.payload),
            frames::END => break,
            other => panic!("unexpected frame type {other}"),
        }
    }
    // The mock's echo answers with its arguments as JSON text.
    let echoed: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(echoed, json!({"text": question, "task_id": "task0007", "device": "desk"}));
    assert_eq!(seqs, (0..seqs.len() as u16).collect::<Vec<_>>(), "seqs count up from 0, the end frame last");
    assert!(seqs.len() >= 3, "an answer of {} bytes takes several text frames", answer.len());
    assert_eq!(router.metric("switchboard_edge_tasks_total", &["outcome=\"answered\""]).await, 1.0);
    // The handler call is audited as the device's tenant and key.
    let audited = eventually(Duration::from_secs(10), || async {
        let records = admin_get(&router, "/v1/audit?tenant=acme").await;
        records["records"].as_array().unwrap().iter().any(|r| {
            r["target"] == "agent__echo"
                && r["upstream"] == "agent"
                && r["outcome"] == "ok"
                && r["key_prefix"].is_string()
        })
    })
    .await;
    assert!(audited, "{}", admin_get(&router, "/v1/audit?tenant=acme").await);
    router.stop().await;

    // With no handler configured: a clear error text, and the end frame.
    let dir = temp_dir("sb-edge-");
    let (router, key, _) = start(&dir, "", "").await;
    let mut device = RawDevice::connect(router.edge_addr.unwrap()).await;
    assert_eq!(device.register(&key, "desk", json!({})).await["type"], "registered");
    let mut out = BytesMut::new();
    frames::encode_text(b"task0001", 0, "hello", 100, &mut out);
    frames::encode_end(b"task0001", 1, &mut out);
    device.send_bytes(&out).await;
    let text = device.frame().await.unwrap();
    assert_eq!(text.kind, frames::TEXT);
    assert!(String::from_utf8_lossy(&text.payload).contains("edge.task_handler is not set"));
    assert_eq!(device.frame().await.unwrap().kind, frames::END);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_device_over_tls_and_its_text_task() {
    let dir = temp_dir("sb-edge-tls-");
    // A CA, and a certificate for localhost signed by it.
    switchboard_test_support::services::make_certificate(&dir, "router");

    let agent = MockServer::start(mock_named("agent")).await;
    let tls = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntask_handler = \"agent__echo\"",
        dir.join("router.pem").display(),
        dir.join("router.key").display()
    );
    let (router, key, _) = start(&dir, &tls, &http_upstream("agent", &agent.url, "")).await;
    let edge = router.edge_addr.unwrap();

    // A plain TCP device cannot talk to a TLS listener.
    let mut plain = RawDevice::connect(edge).await;
    plain.send(json!({"type": "register", "data": {"auth": {"api_key": key}}})).await;
    let mut buf = [0u8; 64];
    let read =
        tokio::time::timeout(Duration::from_secs(10), plain.stream.read(&mut buf)).await.expect("closed in time");
    assert!(!matches!(read, Ok(n) if n > 0 && buf[..n].starts_with(b"##START")), "no frame over plain TCP");

    // The reference device over TLS asks a text task and prints the answer.
    let ca = dir.join("ca.pem").display().to_string();
    let tls_args = ["--tls", "--ca", &ca, "--server-name", "localhost", "--ask", "what time is it?"];
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(edge_binary())
            .args(["--router", &edge.to_string(), "--device", "secure", "--sandbox"])
            .arg(dir.join("sandbox"))
            .args(tls_args)
            .env("SWITCHBOARD_KEY", &key)
            .output(),
    )
    .await
    .expect("the device answers within 30 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let echoed: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(echoed, json!({"text": "what time is it?", "task_id": "task0001", "device": "secure"}));
    let devices = admin_get(&router, "/v1/edge/devices").await;
    let devices = devices["devices"].as_array().unwrap();
    assert!(!devices.is_empty() && devices.iter().all(|d| d["tls"] == true), "{devices:?}");
    router.stop().await;
}

/// A traced call of a device's tool: the device is told the router's span
/// for the call in `data.traceparent`, and that span reaches the trace
/// collector as a CLIENT span, the child of the call's SERVER span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_device_call_carries_the_routers_span_to_the_device() {
    let (_receiver, receiver) = switchboard_test_support::peers::otlp_receiver().await;
    let dir = temp_dir("sb-edge-trace-");
    let telemetry = format!("[telemetry]\notlp_endpoint = \"{receiver}\"\nsample_ratio = 0.0\n");
    let (router, key, _) = start(&dir, "", &telemetry).await;
    let mut device = RawDevice::connect(router.edge_addr.unwrap()).await;
    assert_eq!(device.register(&key, "slow", slow_service()).await["type"], "registered");
    let mut client = Client::with_key(&router.url, &key);
    client.initialize().await;

    let trace = format!("{:032x}", u128::from_le_bytes(*b"switchboard-edge"));
    let caller = format!("00-{trace}-00f067aa0ba902b7-01");
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "slow__wait", "arguments": {"n": 2}}});
    let calling = {
        let client = client.clone();
        let caller = caller.clone();
        tokio::spawn(async move {
            client.post_raw(serde_json::to_vec(&call).unwrap().into(), &[("traceparent", &caller)]).await.json()
        })
    };
    let message = device.message().await.unwrap();
    let told =
        message["data"]["traceparent"].as_str().unwrap_or_else(|| panic!("no traceparent: {message}")).to_owned();
    assert!(told.starts_with(&format!("00-{trace}-")) && told.ends_with("-01"), "{told}");
    let span = told[36..52].to_owned();
    assert_ne!(span, "00f067aa0ba902b7", "the device is told the router's span, not the caller's");
    device
        .send(json!({"type": "result", "data": {"call_id": message["data"]["call_id"], "result": {"success": true, "data": "ok"}}}))
        .await;
    let answer = calling.await.unwrap();
    assert!(answer["result"].is_object(), "{answer}");

    let arrived = eventually(Duration::from_secs(15), || async {
        super::telemetry::spans_of(&receiver, &trace).await.len() >= 2
    })
    .await;
    let spans = super::telemetry::spans_of(&receiver, &trace).await;
    assert!(arrived, "{spans:#?}");
    let server = spans.iter().find(|s| s["kind"] == 2).unwrap_or_else(|| panic!("{spans:#?}"));
    let to_device = spans.iter().find(|s| s["kind"] == 3).unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(to_device["span_id"], span.as_str());
    assert_eq!(to_device["parent_span_id"], server["span_id"]);
    assert_eq!(to_device["name"], "tools/call slow__wait");
    assert_eq!(to_device["attributes"]["switchboard.device"], "edge:slow");
    // An untraced call carries none.
    let plain = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("slow__wait", json!({"n": 3})).await })
    };
    let message = device.message().await.unwrap();
    assert!(message["data"].get("traceparent").is_none(), "{message}");
    device
        .send(json!({"type": "result", "data": {"call_id": message["data"]["call_id"], "result": {"success": true, "data": "ok"}}}))
        .await;
    assert!(plain.await.unwrap()["result"].is_object());
}

/// Each tenant names its own text-task handler: globex's devices' tasks go
/// to its handler, acme's to the router-wide one until acme names its own
/// (applied without a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_names_its_own_text_task_handler() {
    let (alpha, beta) = tokio::join!(MockServer::start(mock_named("alpha")), MockServer::start(mock_named("beta")));
    let dir = temp_dir("sb-edge-tasks-");
    let upstreams = format!("{}{}", http_upstream("alpha", &alpha.url, ""), http_upstream("beta", &beta.url, ""));
    let config = config(&dir, "task_handler = \"alpha__echo\"", &upstreams);
    let (acme_key, globex_key) = tenants(&config).await;
    let admin = {
        let parsed = Config::from_toml(&config).unwrap();
        Admin::new(Database::connect(parsed.database.url.as_deref().unwrap(), Duration::from_secs(3)).unwrap(), &parsed)
    };
    let all = |handler: Option<&str>| Policy {
        upstreams: vec!["*".into()],
        task_handler: handler.map(str::to_owned),
        ..Policy::default()
    };
    admin.update_tenant("globex", all(Some("beta__echo"))).await.unwrap();
    let router = Router::start(&config).await;
    let task = |device: &'static str, key: String, id: &'static [u8; 8]| {
        let edge = router.edge_addr.unwrap();
        async move {
            let mut d = RawDevice::connect(edge).await;
            assert_eq!(d.register(&key, device, json!({})).await["type"], "registered");
            let mut out = BytesMut::new();
            frames::encode_text(id, 0, "hello", 100, &mut out);
            frames::encode_end(id, 1, &mut out);
            d.send_bytes(&out).await;
            let text = d.frame().await.unwrap();
            assert_eq!(d.frame().await.unwrap().kind, frames::END);
            let answer: Value = serde_json::from_slice(&text.payload)
                .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&text.payload)));
            assert_eq!(answer["device"], device);
        }
    };
    task("g1", globex_key.clone(), b"task0001").await;
    assert_eq!((alpha.mock.call_count(), beta.mock.call_count()), (0, 1), "globex's task went to its own handler");
    task("a1", acme_key.clone(), b"task0002").await;
    assert_eq!((alpha.mock.call_count(), beta.mock.call_count()), (1, 1), "acme's task went to the router's handler");
    // acme names its own: its next task goes there.
    admin.update_tenant("acme", all(Some("beta__echo"))).await.unwrap();
    // The directory reloads every 200 ms here (database.refresh).
    tokio::time::sleep(Duration::from_secs(1)).await;
    task("a2", acme_key.clone(), b"task0003").await;
    assert_eq!((alpha.mock.call_count(), beta.mock.call_count()), (1, 2), "acme's own handler was not used");
    // A bad handler name is refused.
    assert!(admin.update_tenant("acme", all(Some(""))).await.is_err());
    router.stop().await;
}
