//! Bad input gets a clear HTTP status and JSON-RPC error, and the router
//! keeps serving afterwards.

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use switchboard_test_support::{http_upstream, mock_named, Client, MockServer, Router};

struct Case {
    what: &'static str,
    body: Vec<u8>,
    headers: Vec<(&'static str, &'static str)>,
    status: StatusCode,
    code: i64,
    message_contains: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_leave_the_router_healthy() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&format!(
        "[server]\nmax_body_bytes = 65536\nallowed_origins = [\"https://app.example.com\"]\n{}",
        http_upstream("web", &web.url, "")
    ))
    .await;
    let mut client = Client::new(&router.url);
    client.initialize().await;

    let cases = vec![
        Case {
            what: "malformed JSON",
            body: b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":".to_vec(),
            headers: vec![],
            status: StatusCode::BAD_REQUEST,
            code: -32700,
            message_contains: "malformed JSON",
        },
        Case {
            what: "a JSON array (batch)",
            body: br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.to_vec(),
            headers: vec![],
            status: StatusCode::BAD_REQUEST,
            code: -32600,
            message_contains: "batches are not supported",
        },
        Case {
            what: "not a JSON-RPC message",
            body: br#"{"hello":"world"}"#.to_vec(),
            headers: vec![],
            status: StatusCode::BAD_REQUEST,
            code: -32600,
            message_contains: "jsonrpc",
        },
        Case {
            what: "unknown method",
            body: br#"{"jsonrpc":"2.0","id":1,"method":"tools/explode"}"#.to_vec(),
            headers: vec![],
            status: StatusCode::OK,
            code: -32601,
            message_contains: "tools/explode",
        },
        Case {
            what: "unknown tool",
            body: br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"web__nope","arguments":{}}}"#.to_vec(),
            headers: vec![],
            status: StatusCode::OK,
            code: -32602,
            message_contains: "unknown tool: web__nope",
        },
        Case {
            what: "tools/call without a name",
            body: br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#.to_vec(),
            headers: vec![],
            status: StatusCode::OK,
            code: -32602,
            message_contains: "params.name",
        },
        Case {
            what: "body over the limit",
            body: format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"web__echo","arguments":{{"x":"{}"}}}}}}"#, "x".repeat(70_000))
                .into_bytes(),
            headers: vec![],
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: -32600,
            message_contains: "65536",
        },
        Case {
            what: "wrong content type",
            body: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            headers: vec![("content-type", "text/plain")],
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: -32600,
            message_contains: "application/json",
        },
        Case {
            what: "foreign Origin",
            body: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            headers: vec![("origin", "https://evil.example.net")],
            status: StatusCode::FORBIDDEN,
            code: -32600,
            message_contains: "evil.example.net",
        },
        Case {
            what: "unsupported MCP-Protocol-Version",
            body: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            headers: vec![("mcp-protocol-version", "1999-12-31")],
            status: StatusCode::BAD_REQUEST,
            code: -32600,
            message_contains: "1999-12-31",
        },
    ];
    for case in cases {
        let reply = client.post_raw(case.body.into(), &case.headers).await;
        assert_eq!(reply.status, case.status, "{}: {}", case.what, String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.content_type(), "application/json", "{}", case.what);
        let body: Value = reply.json();
        assert_eq!(body["jsonrpc"], "2.0", "{}", case.what);
        assert_eq!(body["error"]["code"], case.code, "{}: {body}", case.what);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(case.message_contains), "{}: {message}", case.what);
        // Still serving, same session.
        assert_eq!(client.call("ping", json!({})).await["result"], json!({}), "after {}", case.what);
    }

    // An allowed Origin passes.
    let ok = client
        .post_raw(
            br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#.to_vec().into(),
            &[("origin", "https://app.example.com")],
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK);

    // Other HTTP methods are refused with Allow.
    let put = client.send(Method::PUT, bytes::Bytes::new(), &[]).await;
    assert_eq!(put.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(put.headers.get("allow").is_some());

    // Notifications and responses get 202 with no body.
    let note = client.post(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})).await;
    assert_eq!(note.status, StatusCode::ACCEPTED);
    assert!(note.body.is_empty());

    // Rejections are counted by reason.
    assert!(router.metric("switchboard_http_rejections_total", &["reason=\"too_large\""]).await >= 1.0);
    assert!(router.metric("switchboard_http_rejections_total", &["reason=\"parse\""]).await >= 2.0);

    // And real work still flows.
    let echo = client.call_tool("web__echo", json!({"after": "all that"})).await;
    assert_eq!(echo["result"]["content"][0]["text"], r#"{"after":"all that"}"#);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_negotiates_the_version() {
    let router = Router::start("").await;
    for (asked, answered) in [
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2031-01-01", "2025-11-25"),
    ] {
        let mut client = Client::new(&router.url);
        client.protocol_version = asked.into();
        let result = client.initialize().await;
        assert_eq!(result["protocolVersion"], answered, "asked for {asked}");
    }
    // With no upstreams the router still answers, with empty lists.
    let mut client = Client::new(&router.url);
    client.initialize().await;
    assert!(client.tool_names().await.is_empty());
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_endpoint_event_keeps_the_path_prefix() {
    let router = Router::start("").await;
    for (path, forwarded, expected) in [
        ("/sse", None, "/messages?sessionId="),
        ("/team-a/tools/sse", None, "/team-a/tools/messages?sessionId="),
        ("/sse", Some("/behind/proxy"), "/behind/proxy/messages?sessionId="),
    ] {
        let mut client = Client::new(&router.path(path));
        client.session = None;
        let mut headers = vec![];
        if let Some(prefix) = forwarded {
            headers.push(("x-forwarded-prefix", prefix));
        }
        let mut stream = client.sse_get(&headers).await;
        let endpoint = stream.next_event(std::time::Duration::from_secs(5)).await.expect("the endpoint event");
        assert_eq!(endpoint.event.as_deref(), Some("endpoint"));
        let data = String::from_utf8(endpoint.data.to_vec()).unwrap();
        assert!(data.starts_with(expected), "{path}: {data}");
    }
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_the_router_cannot_deliver_are_refused_and_counted_never_acknowledged() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&http_upstream("web", &web.url, "")).await;
    let mut client = Client::new(&router.url);
    client.initialize_with(json!({"sampling": {}})).await;
    let answer = |id: Value| {
        json!({"jsonrpc": "2.0", "id": id, "result": {"role": "assistant",
        "content": {"type": "text", "text": "hi"}, "model": "m", "stopReason": "endTurn"}})
    };
    let dropped = |reason: &'static str| {
        let router = &router;
        async move { router.metric("switchboard_relay_dropped_total", &[&format!("reason=\"{reason}\"")]).await }
    };

    // An id the router never gave a request.
    let reply = client.post(answer(json!("not-ours"))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&reply.body));
    assert!(reply.json()["error"]["message"].as_str().unwrap().contains("awaits an answer"), "{}", reply.json());
    assert_eq!(dropped("unknown_answer").await, 1.0);
    // A relayed id for an upstream the session has no upstream session with.
    let web_id = format!("{:08x}.n1", switchboard_upstream::key_of("web"));
    let reply = client.post(answer(json!(web_id))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(dropped("unknown_answer").await, 2.0);

    // The upstream session exists but the upstream cannot take the answer
    // (it forgot the session): 502, counted.
    client.call_tool("web__echo", json!({})).await;
    web.mock.forget_sessions();
    let reply = client.post(answer(json!(web_id))).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.json()["error"]["data"]["upstream"], "web");
    assert_eq!(dropped("answer_not_delivered").await, 1.0);

    // A real round trip still works, and is acknowledged.
    let (status, _, mut stream) =
        client.request_stream("tools/call", json!({"name": "web__sample", "arguments": {"prompt": "p"}})).await;
    assert_eq!(status, StatusCode::OK);
    let ask = stream.next(std::time::Duration::from_secs(10)).await.expect("the sampling request");
    assert_eq!(client.post(answer(ask["id"].clone())).await.status, StatusCode::ACCEPTED);
    let done = stream.next(std::time::Duration::from_secs(10)).await.expect("the result");
    assert_eq!(done["result"]["content"][0]["text"], "sampled: hi", "{done}");
}

/// A body announced larger than `server.max_body_bytes` is refused with 413
/// before it is read, and the client, still sending it, gets the answer
/// rather than a reset connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_oversized_body_gets_413_that_the_client_receives() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&crate::routing::config(&http_upstream("web", &web.url, ""))).await;
    for size in [5usize << 20, 40 << 20] {
        let stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {size}\r\n\r\n"
        );
        // As an asynchronous client does: the whole body written, then the
        // answer read.
        let writer = tokio::spawn(async move {
            write.write_all(head.as_bytes()).await?;
            let chunk = vec![b' '; 64 << 10];
            let mut sent = 0;
            while sent < size {
                let n = chunk.len().min(size - sent);
                write.write_all(&chunk[..n]).await?;
                sent += n;
            }
            Ok::<_, std::io::Error>(())
        });
        let written = tokio::time::timeout(Duration::from_secs(30), writer).await;
        // A client that stops at a failed write (as most do) never reads
        // the answer: the router reads what is announced (within bounds).
        assert!(matches!(written, Ok(Ok(Ok(())))), "{size} bytes announced: the body could be sent: {written:?}");
        let mut answer = Vec::new();
        let got = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413"), "{size} bytes announced: {got:?} {text}");
        assert!(text.contains("-32600"), "{text}");
    }
    // Still serving.
    let mut client = Client::new(&router.url);
    client.initialize().await;
}
