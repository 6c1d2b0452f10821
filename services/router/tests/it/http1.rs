//! The router's own HTTP/1.1 path for `POST /mcp` (`h1.rs`), from a raw
//! socket: what it serves, what it hands to hyper, and what it refuses.
//!
//! - Many calls on one keep-alive connection, pipelined or not, each
//!   answered in order; `Connection: close` honoured.
//! - A request that is not its own (a `GET`, a chunked body, `Expect`,
//!   HTTP/1.0, a head over 64 KiB) is served by hyper on the same
//!   connection, after what came before it.
//! - Request smuggling is refused with 400 and a JSON-RPC error, the
//!   connection closed, counted by reason, and the router healthy after:
//!   `Content-Length` twice (equal or not), beside `Transfer-Encoding`, not
//!   a plain number; obsolete line folding; a bare CR; white space before a
//!   colon.
//! - Requests pipelined before a half-close are all answered; a body that
//!   arrives slowly (each pause within the idle limit) is served past the
//!   header limit; a client that reads none of its answer is let go after
//!   the idle limit.
//! - An upstream's deadline holds to the moment on a kept-alive connection
//!   whatever the connection's own timer was set for.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::{http_upstream, mock_named, Client, MockServer, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::routing::config;

/// Sends `bytes` on a new connection, then reads until the router closes it.
async fn exchange(router: &Router, bytes: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .expect("the router closes the connection")
        .unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

fn call(session: &str, id: u32, close: bool) -> Vec<u8> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "web__echo", "arguments": {"n": id}}})
    .to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" },
    )
    .into_bytes()
}

/// The bodies of the responses in `text` (each with a Content-Length), in order.
fn bodies(text: &str) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(head_end) = rest.find("\r\n\r\n") {
        let head = &rest[..head_end];
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let length: usize = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0);
        let body_start = head_end + 4;
        if rest.len() < body_start + length {
            break;
        }
        out.push((status, rest[body_start..body_start + length].to_owned()));
        rest = &rest[body_start + length..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_one_connection_are_answered_in_order_and_other_requests_go_to_hyper() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let session = client.session.clone().expect("a session");

    // Keep-alive, one at a time: three calls, then one that closes.
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let mut got = Vec::new();
    for id in 1..=3 {
        stream.write_all(&call(&session, id, false)).await.unwrap();
        // Each answer whole before the next request.
        while bodies(&String::from_utf8_lossy(&got)).len() < id as usize {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed after {id} requests");
            got.extend_from_slice(&chunk[..n]);
        }
    }
    stream.write_all(&call(&session, 4, true)).await.unwrap();
    stream.read_to_end(&mut got).await.unwrap();
    let text = String::from_utf8_lossy(&got);
    let answers = bodies(&text);
    assert_eq!(answers.len(), 4, "{text}");
    for (i, (status, body)) in answers.iter().enumerate() {
        let answer: Value = serde_json::from_str(body).unwrap();
        assert_eq!((*status, &answer["id"]), (200, &json!(i + 1)), "{text}");
        assert_eq!(answer["result"]["content"][0]["text"], json!({"n": i + 1}).to_string());
    }
    assert!(text.contains("date: ") && text.contains("connection: close"), "{text}");

    // Pipelined: two calls, a GET (hyper's from here), all in one write.
    let mut pipelined = call(&session, 5, false);
    pipelined.extend(call(&session, 6, false));
    pipelined.extend_from_slice(b"GET /healthz HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n");
    let text = exchange(&router, &pipelined).await;
    let answers = bodies(&text);
    assert_eq!(answers.len(), 3, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&answers[0].1).unwrap()["id"], 5);
    assert_eq!(serde_json::from_str::<Value>(&answers[1].1).unwrap()["id"], 6);
    assert_eq!(answers[2], (200, "ok\n".to_owned()));

    // A chunked body, Expect: 100-continue and HTTP/1.0: served by hyper.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "web__echo", "arguments": {}}})
    .to_string();
    let chunked = format!(
        "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let text = exchange(&router, chunked.as_bytes()).await;
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("\"id\":7"), "{text}");
    let expecting = format!(
        "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\n\
         Expect: 100-continue\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let text = exchange(&router, expecting.as_bytes()).await;
    assert!(text.contains("\"id\":7"), "{text}");
    let old = format!(
        "POST /mcp HTTP/1.0\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let text = exchange(&router, old.as_bytes()).await;
    assert!(text.contains("\"id\":7"), "{text}");
    // A head over 64 KiB is hyper's too (which takes up to 400 KiB).
    let mut big = call(&session, 8, true);
    let filler = format!("X-Filler: {}\r\n", "f".repeat(80 * 1024));
    let at = big.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    big.splice(at..at, filler.into_bytes());
    let text = exchange(&router, &big).await;
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("\"id\":8"), "{text}");
    assert_eq!(web.mock.call_count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_smuggling_is_refused_and_the_router_stays_healthy() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let session = client.session.clone().expect("a session");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "web__echo", "arguments": {}}})
    .to_string();
    // After each, a smuggled request that must never be served.
    let smuggled = String::from_utf8(call(&session, 99, true)).unwrap();
    let head = |lines: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nMcp-Session-Id: {session}\r\n{lines}\r\n{body}{smuggled}"
        )
    };
    let n = body.len();
    let cases = [
        (head(&format!("Content-Length: {n}\r\nContent-Length: {n}\r\n")), "repeated_content_length"),
        (
            head(&format!("Content-Length: {n}\r\nContent-Length: {}\r\n", n + smuggled.len())),
            "repeated_content_length",
        ),
        (head(&format!("Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n")), "length_and_transfer_encoding"),
        (head(&format!("Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n")), "length_and_transfer_encoding"),
        (head(&format!("Content-Length: {n}, {n}\r\n")), "bad_content_length"),
        (head(&format!("Content-Length: +{n}\r\n")), "bad_content_length"),
        (head(&format!("Content-Length: {n}\r\nX-Folded: a\r\n b\r\n")), "malformed_head"),
        (head(&format!("Content-Length: {n}\r\nX-Bare: a\rTransfer-Encoding: chunked\r\n")), "malformed_head"),
        (head(&format!("Content-Length : {n}\r\n")), "malformed_head"),
    ];
    for (request, reason) in &cases {
        let text = exchange(&router, request.as_bytes()).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{reason}: {text}");
        let answers = bodies(&text);
        assert_eq!(answers.len(), 1, "one answer, then closed: {text}");
        let error: Value = serde_json::from_str(&answers[0].1).unwrap();
        assert_eq!(error["error"]["code"], -32600, "{text}");
        assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
    }
    for reason in ["repeated_content_length", "length_and_transfer_encoding", "bad_content_length", "malformed_head"] {
        let expected = cases.iter().filter(|(_, r)| r == &reason).count() as f64;
        let counted = router.metric("switchboard_http_rejections_total", &[&format!("reason=\"{reason}\"")]).await;
        assert_eq!(counted, expected, "{reason}");
    }
    // Nothing reached the upstream, smuggled or not; the router still serves.
    assert_eq!(web.mock.call_count(), 0);
    let answer = client.call_tool("web__echo", json!({"after": true})).await;
    assert_eq!(answer["result"]["content"][0]["text"], r#"{"after":true}"#, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_close_after_pipelining_and_a_slow_body_are_served() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&format!(
        "[server]\nheader_timeout = \"1s\"\nidle_timeout = \"1s\"\n{}",
        http_upstream("web", &web.url, "")
    ))
    .await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let session = client.session.clone().expect("a session");

    // Two calls and a GET (hyper's) in one write, then the client's side
    // ended: all three answered.
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let mut pipelined = call(&session, 1, false);
    pipelined.extend(call(&session, 2, false));
    pipelined.extend_from_slice(b"GET /healthz HTTP/1.1\r\nHost: router\r\n\r\n");
    stream.write_all(&pipelined).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got)).await.expect("closed").unwrap();
    let text = String::from_utf8_lossy(&got);
    let answers = bodies(&text);
    assert_eq!(answers.len(), 3, "{text}");
    let ids: Vec<Value> =
        answers[..2].iter().map(|(_, body)| serde_json::from_str::<Value>(body).unwrap()["id"].clone()).collect();
    assert_eq!(ids, [json!(1), json!(2)], "{text}");
    assert_eq!(answers[2], (200, "ok\n".to_owned()), "{text}");

    // A body sent over 2 s, a piece every 400 ms: each pause is within the
    // 1 s idle limit, though the whole outlasts the 1 s header limit.
    let request = call(&session, 3, true);
    let body_at = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    stream.write_all(&request[..body_at]).await.unwrap();
    let pieces = request[body_at..].chunks((request.len() - body_at).div_ceil(5)).collect::<Vec<_>>();
    for piece in pieces {
        tokio::time::sleep(Duration::from_millis(400)).await;
        stream.write_all(piece).await.unwrap();
    }
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got)).await.expect("closed").unwrap();
    let text = String::from_utf8_lossy(&got);
    let answers = bodies(&text);
    assert_eq!(answers.len(), 1, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&answers[0].1).unwrap()["id"], 3, "{text}");

    // An answer larger than the socket buffers can hold, never read: the
    // router lets the client go after the idle limit, with part of it unsent.
    let size = 7_000_000;
    let body = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "web__big", "arguments": {"bytes": size}}})
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stream = socket.connect(router.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut got)).await.expect("closed");
    assert!(read.is_err() || got.len() < size, "the whole answer was written to a client that read none of it");
    assert!(router.metric("switchboard_connections_closed_total", &["\"idle\""]).await >= 1.0);
    // The router serves on.
    let answer = client.call_tool("web__echo", json!({"after": true})).await;
    assert_eq!(answer["result"]["content"][0]["text"], r#"{"after":true}"#, "{answer}");
}

/// Reads one response with a `Content-Length` body from `stream`: its status
/// and body.
async fn read_response(stream: &mut tokio::net::TcpStream) -> (u16, Value) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a content-length");
            if got.len() >= end + 4 + length {
                let status = head.split(' ').nth(1).unwrap().parse().unwrap();
                return (status, serde_json::from_slice(&got[end + 4..end + 4 + length]).unwrap());
            }
        }
        let n =
            tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await.expect("an answer").unwrap();
        assert!(n > 0, "closed before a whole answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
}

/// An upstream's deadline is kept by the connection's own timer while a
/// request is served here (`deadline.rs`): it must hold to the moment
/// whatever that timer was set for: sooner (the header limit, firing in the
/// middle of the call), later (the idle limit), or the deadline of a call
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_deadline_holds_on_a_kept_alive_connection_whatever_its_timer_was_set_for() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&format!(
        "[server]\nheader_timeout = \"200ms\"\nidle_timeout = \"10s\"\n{}",
        http_upstream("web", &web.url, "timeout = \"700ms\"")
    ))
    .await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let session = client.session.clone().expect("a session");
    let tool = |id: u32, name: &str, arguments: Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}})
        .to_string();
        format!(
            "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let slow = async |stream: &mut tokio::net::TcpStream, id: u32| {
        let started = std::time::Instant::now();
        stream.write_all(tool(id, "web__sleep", json!({"ms": 6000})).as_bytes()).await.unwrap();
        let (status, answer) = read_response(stream).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["error"]["code"], -32001, "{answer}");
        assert!(took >= Duration::from_millis(700), "timed out before its deadline: {took:?}");
        assert!(took < Duration::from_secs(4), "timed out long after its deadline: {took:?}");
    };
    // The connection's timer is set for the header limit, 200 ms after
    // accept: it fires during the call, which still waits its 700 ms.
    slow(&mut stream, 1).await;
    // Set for the idle limit now (10 s): moved sooner for a quick call...
    stream.write_all(tool(2, "web__echo", json!({"quick": true})).as_bytes()).await.unwrap();
    let (status, answer) = read_response(&mut stream).await;
    assert_eq!((status, answer["result"]["content"][0]["text"].as_str()), (200, Some(r#"{"quick":true}"#)), "{answer}");
    // ...whose deadline it is still set for, sooner than the next call's:
    // it fires early for that one, which again waits its whole 700 ms.
    slow(&mut stream, 3).await;
    assert!(router.metric("switchboard_requests_total", &["upstream=\"web\"", "outcome=\"timeout\""]).await >= 2.0);
    // The connection serves on.
    stream.write_all(tool(4, "web__echo", json!({"after": true})).as_bytes()).await.unwrap();
    let (_, answer) = read_response(&mut stream).await;
    assert_eq!(answer["result"]["content"][0]["text"], r#"{"after":true}"#, "{answer}");
}
