//! The router in-process in front of mock upstreams over HTTP and stdio:
//! aggregation, forwarding, relaying, sessions, failures.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};
use switchboard_test_support::{
    eventually, http_upstream, mock_named, peers, stdio_mock_upstream, Client, MockOptions, MockServer, Router,
};

pub(super) fn config(upstreams: &str) -> String {
    format!("[server]\nkeep_alive = \"1s\"\n{upstreams}")
}

pub(super) async fn router_with_web_and_local() -> (Router, MockServer) {
    let web = MockServer::start(mock_named("web")).await;
    let router =
        Router::start(&config(&format!("{}{}", http_upstream("web", &web.url, ""), stdio_mock_upstream("local", ""))))
            .await;
    (router, web)
}

pub(super) fn text_of(response: &Value) -> &str {
    response["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {response}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_two_upstreams_and_forwards_over_http_and_stdio() {
    let (router, web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    let init = client.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "switchboard");
    assert_eq!(init["protocolVersion"], "2025-11-25");
    assert_eq!(init["capabilities"]["tools"]["listChanged"], true);
    assert!(init["capabilities"]["logging"].is_object(), "the mocks do logging: {init}");
    assert!(init["capabilities"]["completions"].is_object());
    assert!(init["instructions"].as_str().unwrap().contains("Mock upstream web."));

    let names = client.tool_names().await;
    for expected in ["web__echo", "web__add", "local__echo", "local__add", "local__progress"] {
        assert!(names.contains(&expected.to_owned()), "{expected} missing from {names:?}");
    }
    assert!(!names.contains(&"local__exit".to_owned()), "the mock offers exit only when asked to");
    assert!(!names.contains(&"echo".to_owned()));

    // The upstream's answer comes back byte for byte: compare with asking the mock directly.
    let request = r#"{"jsonrpc":"2.0","id":"same-id","method":"tools/call","params":{"name":"NAME","arguments":{"text":"h\u00e9llo \"q\"","n":[1,2.50,-0.0e1],"nested":{"deep":[true,null]}}}}"#;
    let routed = client.post_raw(request.replace("NAME", "web__echo").into(), &[]).await;
    let mut direct_client = Client::new(&web.url);
    direct_client.initialize().await;
    let direct = direct_client.post_raw(request.replace("NAME", "echo").into(), &[]).await;
    assert_eq!(routed.status, StatusCode::OK);
    assert_eq!(routed.content_type(), "application/json");
    assert_eq!(routed.body, direct.body, "the result must be the upstream's bytes, unchanged");
    let echoed = text_of(&routed.json()).to_owned();
    assert!(echoed.contains(r#"[1,2.50,-0.0e1]"#), "arguments are forwarded as the bytes received: {echoed}");

    // Over stdio too (ids are remapped on the wire and restored).
    let local = client.post_raw(request.replace("NAME", "local__echo").into(), &[]).await;
    assert_eq!(local.body, direct.body);

    let sum = client.call_tool("local__add", json!({"a": 2, "b": 40})).await;
    assert_eq!(sum["result"]["structuredContent"]["sum"], 42.0);

    // Prompts, resources, templates, completion, ping.
    let prompt = client.call("prompts/get", json!({"name": "local__greet", "arguments": {"name": "Ada"}})).await;
    assert_eq!(prompt["result"]["messages"][0]["content"]["text"], "Hello, Ada!");
    let resources = client.call("resources/list", json!({})).await;
    let uris: Vec<&str> =
        resources["result"]["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap()).collect();
    assert_eq!(uris, ["web+mock://web/hello", "local+mock://local/hello"]);
    let read = client.call("resources/read", json!({"uri": "web+mock://web/hello"})).await;
    assert_eq!(read["result"]["contents"][0]["text"], "hello from web");
    assert_eq!(read["result"]["contents"][0]["uri"], "web+mock://web/hello", "URIs in results are namespaced too");
    let templates = client.call("resources/templates/list", json!({})).await;
    assert!(templates.to_string().contains("local+mock://local/items/{id}"), "{templates}");
    let item = client.call("resources/read", json!({"uri": "local+mock://local/items/7"})).await;
    assert_eq!(item["result"]["contents"][0]["text"], "item 7");
    let missing = client.call("resources/read", json!({"uri": "nowhere://x"})).await;
    assert_eq!(missing["error"]["code"], -32002, "{missing}");
    let completion = client
        .call(
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "web__greet"}, "argument": {"name": "name", "value": "a"}}),
        )
        .await;
    assert_eq!(completion["result"]["completion"]["values"], json!(["alice"]));
    let pong = client.call("ping", json!({})).await;
    assert_eq!(pong["result"], json!({}));
    let level = client.call("logging/setLevel", json!({"level": "debug"})).await;
    assert_eq!(level["result"], json!({}));
    let bad_level = client.call("logging/setLevel", json!({"level": "loud"})).await;
    assert_eq!(bad_level["error"]["code"], -32602);

    assert!(
        router
            .metric("switchboard_requests_total", &["method=\"tools/call\"", "upstream=\"web\"", "outcome=\"ok\""])
            .await
            >= 1.0
    );
    assert!(
        router
            .metric("switchboard_requests_total", &["method=\"tools/call\"", "upstream=\"local\"", "outcome=\"ok\""])
            .await
            >= 2.0
    );
    assert_eq!(router.metric("switchboard_upstream_up", &["upstream=\"local\""]).await, 1.0);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_streams_as_sse_with_the_clients_token() {
    let (router, _web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    for tool in ["web__progress", "local__progress"] {
        let reply = client
            .request(
                "tools/call",
                json!({"name": tool, "arguments": {"steps": 3, "interval_ms": 5}, "_meta": {"progressToken": "tok-1"}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.content_type(), "text/event-stream", "{tool}");
        assert_eq!(reply.headers.get("x-accel-buffering").unwrap(), "no");
        let events = reply.events();
        assert_eq!(events.len(), 4, "{tool}: {events:?}");
        for (i, event) in events[..3].iter().enumerate() {
            assert_eq!(event["method"], "notifications/progress");
            assert_eq!(event["params"]["progressToken"], "tok-1", "{tool}: the client's own token comes back");
            assert_eq!(event["params"]["progress"], i as u64 + 1);
        }
        assert_eq!(text_of(&events[3]), "done after 3 steps");
    }
    // A client that accepts only JSON still gets its answer, as JSON.
    let reply = client
        .post_raw(
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": "web__progress", "arguments": {"steps": 2}, "_meta": {"progressToken": 5}}}))
            .unwrap()
            .into(),
            &[("accept", "application/json")],
        )
        .await;
    assert_eq!(reply.content_type(), "application/json");
    assert_eq!(text_of(&reply.json()), "done after 2 steps");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_to_client_requests_reach_the_client_and_its_answer_gets_back() {
    let (router, _web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize_with(json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}})).await;
    let cases = [
        (
            "sample",
            json!({"prompt": "2+2?"}),
            "sampling/createMessage",
            json!({"role": "assistant", "content": {"type": "text", "text": "four"}, "model": "test", "stopReason": "endTurn"}),
            "sampled: four",
        ),
        (
            "elicit",
            json!({"message": "Your name?"}),
            "elicitation/create",
            json!({"action": "accept", "content": {"answer": "Ada"}}),
            "elicited: {\"action\":\"accept\",\"content\":{\"answer\":\"Ada\"}}",
        ),
        (
            "roots",
            json!({}),
            "roots/list",
            json!({"roots": [{"uri": "file:///work", "name": "work"}]}),
            "roots: [{\"name\":\"work\",\"uri\":\"file:///work\"}]",
        ),
    ];
    for upstream in ["web", "local"] {
        for (tool, args, method, answer, expected) in &cases {
            let tool = format!("{upstream}__{tool}");
            let (status, headers, mut stream) =
                client.request_stream("tools/call", json!({"name": tool, "arguments": args})).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(headers["content-type"], "text/event-stream");
            let ask = stream.next(Duration::from_secs(10)).await.expect("the server's request");
            assert_eq!(ask["method"], *method, "{tool}: {ask}");
            let reply = json!({"jsonrpc": "2.0", "id": ask["id"], "result": answer});
            assert_eq!(client.post(reply).await.status, StatusCode::ACCEPTED);
            let done = stream.next(Duration::from_secs(10)).await.expect("the tool result");
            let text: Value = text_of(&done).into();
            let text = text.as_str().unwrap();
            // The mock prints JSON objects with sorted keys; compare parsed when JSON follows.
            assert_eq!(normalize(text), normalize(expected), "{tool}");
        }
    }
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_cancelling_its_request_names_the_id_the_client_saw() {
    let (router, _web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize_with(json!({"sampling": {}})).await;
    for upstream in ["web", "local"] {
        let (_, _, mut stream) = client
            .request_stream("tools/call", json!({"name": format!("{upstream}__ask_and_cancel"), "arguments": {}}))
            .await;
        let ask = stream.next(Duration::from_secs(10)).await.expect("the sampling request");
        assert_eq!(ask["method"], "sampling/createMessage");
        let cancel = stream.next(Duration::from_secs(10)).await.expect("the cancellation");
        assert_eq!(cancel["method"], "notifications/cancelled", "{upstream}: {cancel}");
        assert_eq!(cancel["params"]["requestId"], ask["id"], "{upstream}: the id the client knows the request by");
        let done = stream.next(Duration::from_secs(10)).await.expect("the result");
        assert!(text_of(&done).starts_with("cancelled request"));
    }
    router.stop().await;
}

/// Parses `label: {json}` so key order does not matter.
fn normalize(text: &str) -> (String, Value) {
    match text.split_once(": ") {
        Some((label, rest)) => (label.to_owned(), serde_json::from_str(rest).unwrap_or(Value::String(rest.to_owned()))),
        None => (text.to_owned(), Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancellations_reach_the_upstream_with_its_own_request_id() {
    let (router, web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    for upstream in ["web", "local"] {
        let tool = format!("{upstream}__progress");
        let call = json!({"jsonrpc": "2.0", "id": "cancel-me", "method": "tools/call",
            "params": {"name": tool, "arguments": {"steps": 4, "interval_ms": 100}, "_meta": {"progressToken": "c"}}});
        let (status, _, mut stream) = client.post_stream(Bytes::from(call.to_string()), &[]).await;
        assert_eq!(status, StatusCode::OK);
        // The first progress notification: the upstream has the request.
        let first = stream.next(Duration::from_secs(10)).await.expect("progress");
        assert_eq!(first["method"], "notifications/progress", "{first}");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "cancel-me", "reason": "test"}});
        assert_eq!(client.post(note).await.status, StatusCode::ACCEPTED);
        // The mock ignores cancellations and finishes: the cancelled call's
        // stream still ends (nothing hangs) and carries only its own messages.
        let rest = stream.until_end(Duration::from_secs(10)).await.expect("the cancelled call's stream ends");
        for message in &rest {
            assert!(
                message["method"] == "notifications/progress" || message["id"] == "cancel-me",
                "{upstream}: {message}"
            );
        }
    }
    // Over HTTP the upstream session is the client's own: the id passes through.
    assert!(
        eventually(Duration::from_secs(5), || async { web.mock.cancelled().contains(&"\"cancel-me\"".to_owned()) })
            .await,
        "{:?}",
        web.mock.cancelled()
    );
    // Over stdio the shared process knows the request by the id the router gave it.
    let seen = client.call_tool("local__cancelled", json!({})).await;
    let seen: Vec<String> = serde_json::from_str(text_of(&seen)).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].parse::<u64>().is_ok(), "the child saw its own numeric id, not the client's: {seen:?}");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_required_checked_and_ended_with_their_upstream_sessions() {
    let (router, web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    client.call_tool("web__echo", json!({})).await;
    let live_before = web.mock.live_sessions();
    assert!(live_before >= 2, "a control session and this client's session: {live_before}");

    let mut stranger = client.clone();
    stranger.session = Some("0123456789abcdef0123456789abcdef".into());
    let reply = stranger.request("tools/list", json!({})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.json()["error"]["code"], -32001);

    let mut anonymous = client.clone();
    anonymous.session = None;
    let reply = anonymous.request("tools/list", json!({})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.json()["error"]["message"].as_str().unwrap().contains("Mcp-Session-Id"));

    assert_eq!(client.delete().await, StatusCode::OK);
    assert!(
        eventually(Duration::from_secs(5), || async { web.mock.deleted_sessions() >= 1 }).await,
        "DELETE ends the upstream session too"
    );
    assert_eq!(web.mock.live_sessions(), live_before - 1);
    assert_eq!(client.request("tools/list", json!({})).await.status, StatusCode::NOT_FOUND);
    assert_eq!(client.delete().await, StatusCode::NOT_FOUND);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_upstream_session_is_reinitialised_transparently() {
    for status in [404u16, 400] {
        let web = MockServer::start(MockOptions { unknown_session_status: status, ..mock_named("web") }).await;
        let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        assert_eq!(text_of(&client.call_tool("web__echo", json!({"n": 1})).await), r#"{"n":1}"#);
        let before = web.mock.initialize_count();
        web.mock.forget_sessions(); // as if the upstream restarted
        let again = client.call_tool("web__echo", json!({"n": 2})).await;
        assert_eq!(text_of(&again), r#"{"n":2}"#, "status {status}: {again}");
        assert!(web.mock.initialize_count() > before, "status {status}: the router initialised again");
        assert!(router.metric("switchboard_upstream_reinitializations_total", &["upstream=\"web\""]).await >= 1.0);
        router.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_or_slow_upstream_is_left_out_and_named_in_errors() {
    let up = MockServer::start(mock_named("up")).await;
    let slow = MockServer::start(MockOptions { list_delay: Duration::from_secs(3), ..mock_named("slow") }).await;
    let (_held, dead_port) = peers::closed_port();
    let upstreams = format!(
        "{}{}{}",
        http_upstream("down", &format!("http://127.0.0.1:{dead_port}/mcp"), ""),
        http_upstream("slow", &slow.url, "list_timeout = \"300ms\""),
        http_upstream("up", &up.url, "")
    );
    let router = Router::start(&config(&upstreams)).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let started = std::time::Instant::now();
    let names = client.tool_names().await;
    assert!(started.elapsed() < Duration::from_secs(3), "the list does not wait for the slow upstream");
    assert!(names.contains(&"up__echo".to_owned()));
    assert!(!names.iter().any(|n| n.starts_with("down__") || n.starts_with("slow__")), "{names:?}");
    assert!(
        router.metric("switchboard_catalog_upstream_failures_total", &["upstream=\"down\"", "list=\"tools\""]).await
            >= 1.0
    );
    assert!(
        router.metric("switchboard_catalog_upstream_failures_total", &["upstream=\"slow\"", "list=\"tools\""]).await
            >= 1.0
    );
    assert_eq!(router.metric("switchboard_upstream_up", &["upstream=\"down\""]).await, 0.0);

    let failed = client.call_tool("down__echo", json!({})).await;
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    assert!(failed["error"]["message"].as_str().unwrap().contains("\"down\""), "{failed}");
    assert_eq!(failed["error"]["data"]["upstream"], "down");
    assert_eq!(text_of(&client.call_tool("up__echo", json!({"still": "fine"})).await), r#"{"still":"fine"}"#);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_does_not_answer_in_time_gets_a_clear_error() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, "timeout = \"300ms\""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let started = std::time::Instant::now();
    let slow = client.call_tool("web__sleep", json!({"ms": 5000})).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(slow["error"]["code"], -32001, "{slow}");
    let message = slow["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"web\"") && message.contains("300ms"), "{message}");
    assert_eq!(text_of(&client.call_tool("web__echo", json!({})).await), "{}");
    assert!(router.metric("switchboard_requests_total", &["upstream=\"web\"", "outcome=\"timeout\""]).await >= 1.0);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_has_its_request_cancelled_upstream() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let caller = client.clone();
    let call = tokio::spawn(async move {
        caller
            .post(json!({"jsonrpc": "2.0", "id": "gone", "method": "tools/call",
                "params": {"name": "web__sleep", "arguments": {"ms": 10000}}}))
            .await
    });
    // Once the upstream has the request, hang up: dropping the request closes
    // its connection before any answer.
    assert!(eventually(Duration::from_secs(10), || async { web.mock.call_count() == 1 }).await);
    call.abort();
    let _ = call.await;
    assert!(
        eventually(Duration::from_secs(5), || async { web.mock.cancelled().contains(&"\"gone\"".to_owned()) }).await,
        "{:?}",
        web.mock.cancelled()
    );
    assert_eq!(router.metric("switchboard_requests_total", &["upstream=\"web\"", "outcome=\"abandoned\""]).await, 1.0);
    // The router and the session carry on.
    assert_eq!(text_of(&client.call_tool("web__echo", json!({"still": "here"})).await), r#"{"still":"here"}"#);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_upstream_that_exits_is_restarted() {
    let upstream = format!(
        "[[upstreams]]\nname = \"local\"\ntransport = \"stdio\"\ncommand = \"{}\"\n\
         args = [\"--stdio\", \"--allow-exit\"]\nrestart_max_backoff = \"500ms\"\n",
        switchboard_test_support::mock_binary().display()
    );
    let router = Router::start(&config(&upstream)).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let mut stream = client.open_stream().await;
    let uri = "local+mock://local/hello";
    assert_eq!(client.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    let crashed = client.call_tool("local__exit", json!({"code": 3})).await;
    assert!(crashed["error"].is_object(), "{crashed}");
    let mut attempts = 0;
    let recovered = loop {
        attempts += 1;
        let reply = client.call_tool("local__echo", json!({"back": true})).await;
        if reply["result"].is_object() || attempts > 50 {
            break reply;
        }
        // Polling: the restart's backoff ends unannounced; a call is the probe.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(text_of(&recovered), r#"{"back":true}"#);
    assert!(router.metric("switchboard_upstream_restarts_total", &["upstream=\"local\""]).await >= 1.0);
    // The new process was subscribed again on the session's behalf.
    let told = client.call_tool("local__touch", json!({"uri": "mock://local/hello"})).await;
    assert_eq!(text_of(&told), "told 1 subscribers", "{told}");
    let update = stream.next(Duration::from_secs(5)).await.expect("the update after the restart");
    assert_eq!(update["method"], "notifications/resources/updated");
    assert_eq!(update["params"]["uri"], uri);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_stdio_children() {
    let marker = format!("shutdown-marker-{}", std::process::id());
    let router = Router::start(&config(&stdio_mock_upstream(&marker, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    client.call_tool(&format!("{marker}__echo"), json!({})).await;
    let running = || {
        let marker = marker.clone();
        async move {
            std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
                .any(|cmd| String::from_utf8_lossy(&cmd).contains(&marker))
        }
    };
    assert!(running().await, "the child runs while the router does");
    router.stop().await;
    assert!(
        eventually(Duration::from_secs(10), || async { !running().await }).await,
        "the child is gone after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_loses_a_stream_resumes_it_with_last_event_id() {
    let (router, _web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize().await; // negotiates 2025-11-25
    let (status, _, mut stream) = client
        .request_stream(
            "tools/call",
            json!({"name": "web__progress", "arguments": {"steps": 4, "interval_ms": 150}, "_meta": {"progressToken": "r"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let priming = stream.next_event(Duration::from_secs(5)).await.expect("a priming event");
    assert!(priming.data.is_empty() && priming.retry.is_some(), "{priming:?}");
    let first = stream.next_event(Duration::from_secs(5)).await.expect("the first progress event");
    let first_id = first.id.clone().expect("every event has an id");
    let first: Value = serde_json::from_slice(&first.data).unwrap();
    assert_eq!(first["params"]["progress"], 1);
    drop(stream); // the connection is lost mid-call

    let (status, mut resumed) = client.resume_stream(Some(&first_id)).await;
    assert_eq!(status, StatusCode::OK);
    let mut rest = Vec::new();
    while let Some(message) = resumed.next(Duration::from_secs(5)).await {
        let done = message.get("result").is_some();
        rest.push(message);
        if done {
            break;
        }
    }
    let progress: Vec<u64> = rest.iter().filter_map(|m| m["params"]["progress"].as_u64()).collect();
    assert_eq!(progress, [2, 3, 4], "nothing lost, nothing repeated: {rest:?}");
    assert_eq!(text_of(rest.last().unwrap()), "done after 4 steps");

    // A stream the session never had (or no longer keeps) is a 400, not a
    // 404, which would tell the client its whole session is gone.
    let (status, _) = client.resume_stream(Some("999-0")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_polls_is_mirrored_and_the_client_resumes() {
    let (router, _web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    // The upstream ends its SSE answer after a priming event (2025-11-25 polling).
    let (status, _, mut stream) =
        client.request_stream("tools/call", json!({"name": "web__reconnect", "arguments": {}})).await;
    assert_eq!(status, StatusCode::OK);
    let priming = stream.next_event(Duration::from_secs(5)).await.expect("the router's priming event");
    assert!(priming.data.is_empty() && priming.retry.is_some());
    let id = priming.id.expect("an event id to resume from");
    // The router ends its answer too, before the result.
    assert!(stream.next_event(Duration::from_secs(5)).await.is_none(), "the POST stream closes mid-call");
    // Resuming gets the result, which the router fetched by resuming upstream.
    let (status, mut resumed) = client.resume_stream(Some(&id)).await;
    assert_eq!(status, StatusCode::OK);
    let result = resumed.next(Duration::from_secs(5)).await.expect("the result after reconnecting");
    assert_eq!(text_of(&result), "Reconnection test completed successfully.");
    router.stop().await;
}

/// A server may take the session's GET stream for a call's reconnection
/// and answer there, not on the stream resumed with `Last-Event-ID` (the
/// official conformance server does when its GET comes after the call): a
/// client matches a response by id whatever stream brings it, and so does
/// the router, whether its client listened before the call or only after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_upstream_sends_on_its_get_stream_reaches_the_call() {
    for listen_first in [true, false] {
        let (router, _web) = router_with_web_and_local().await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        // The client listens, so the router's upstream session does too.
        let mut listening = if listen_first { Some(client.open_stream().await) } else { None };
        let (status, _, mut stream) =
            client.request_stream("tools/call", json!({"name": "web__reconnect", "arguments": {"on": "get"}})).await;
        assert_eq!(status, StatusCode::OK);
        let priming = stream.next_event(Duration::from_secs(5)).await.expect("the router's priming event");
        let id = priming.id.expect("an event id to resume from");
        assert!(stream.next_event(Duration::from_secs(5)).await.is_none(), "the POST stream closes mid-call");
        if listening.is_none() {
            listening = Some(client.open_stream().await);
        }
        let (status, mut resumed) = client.resume_stream(Some(&id)).await;
        assert_eq!(status, StatusCode::OK);
        let result = resumed
            .next(Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("listen_first={listen_first}: the answer, though it came on the GET stream"));
        assert_eq!(text_of(&result), "Reconnection test completed successfully.");
        // Not counted as a stray, and the session goes on.
        assert_eq!(router.metric("switchboard_relay_dropped_total", &[]).await, 0.0);
        let echoed = client.call_tool("web__echo", json!({"text": "after"})).await;
        assert!(text_of(&echoed).contains("after"), "{echoed}");
        drop(listening);
        router.stop().await;
    }
}

/// An upstream that asks for a longer wait than the router's own `retry:`
/// (1 s) before its client resumes: the router resumes upstream only after
/// that wait (as a client must), so it tells its client to wait as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_longer_retry_is_passed_on_to_the_client() {
    let web = MockServer::start(switchboard_test_support::MockOptions {
        name: "web".into(),
        poll_retry: Duration::from_millis(1500),
        ..switchboard_test_support::MockOptions::default()
    })
    .await;
    let router = Router::start(&http_upstream("web", &web.url, "")).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let (_, _, mut stream) =
        client.request_stream("tools/call", json!({"name": "web__reconnect", "arguments": {}})).await;
    let priming = stream.next_event(Duration::from_secs(5)).await.expect("the router's priming event");
    assert_eq!(priming.retry, Some(1000), "the router's own");
    let passed_on = stream.next_event(Duration::from_secs(5)).await.expect("an event before the stream ends");
    assert_eq!((passed_on.retry, passed_on.data.is_empty()), (Some(1500), true), "the upstream's wait, passed on");
    assert!(stream.next_event(Duration::from_secs(5)).await.is_none(), "then the POST stream closes");
    let (status, mut resumed) = client.resume_stream(passed_on.id.as_deref()).await;
    assert_eq!(status, StatusCode::OK);
    let result = resumed.next(Duration::from_secs(5)).await.expect("the result after reconnecting");
    assert_eq!(text_of(&result), "Reconnection test completed successfully.");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_to_a_shared_stdio_upstream_are_counted_per_session() {
    let (router, _web) = router_with_web_and_local().await;
    let uri = "local+mock://local/hello";
    let mut a = Client::new(&router.url);
    a.initialize().await;
    let mut b = Client::new(&router.url);
    b.initialize().await;
    let mut a_stream = a.open_stream().await;
    let mut b_stream = b.open_stream().await;
    // A also follows another resource: its update is the marker that A's
    // stream is flowing, after which A must not have heard of `uri`.
    let other = "local+mock://local/other";
    assert_eq!(a.call("resources/subscribe", json!({"uri": other})).await["result"], json!({}));
    assert_eq!(a.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    assert_eq!(b.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    // A leaves; the child must keep the subscription for B.
    assert_eq!(a.call("resources/unsubscribe", json!({"uri": uri})).await["result"], json!({}));
    let told = b.call_tool("local__touch", json!({"uri": "mock://local/hello"})).await;
    assert_eq!(text_of(&told), "told 1 subscribers", "the child still has one subscriber: {told}");
    let update = b_stream.next(Duration::from_secs(5)).await.expect("B hears the update");
    assert_eq!(update["method"], "notifications/resources/updated");
    assert_eq!(update["params"]["uri"], uri);
    assert_eq!(text_of(&b.call_tool("local__touch", json!({"uri": "mock://local/other"})).await), "told 1 subscribers");
    let heard = a_stream.next(Duration::from_secs(5)).await.expect("A hears the other resource's update");
    assert_eq!(heard["params"]["uri"], other, "A unsubscribed from {uri} and hears nothing of it: {heard}");
    // B leaves too: now the child is told, and nobody hears the next touch.
    b.call("resources/unsubscribe", json!({"uri": uri})).await;
    let told = b.call_tool("local__touch", json!({"uri": "mock://local/hello"})).await;
    assert_eq!(text_of(&told), "told 0 subscribers");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upstream_gets_every_request_over_http2() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, "http2 = true"))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    assert!(client.tool_names().await.contains(&"web__echo".into()));
    assert_eq!(text_of(&client.call_tool("web__echo", json!({"over": "h2"})).await), r#"{"over":"h2"}"#);
    // A streamed answer (progress over SSE), and the session's end.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "web__progress", "arguments": {"steps": 3, "interval_ms": 10}, "_meta": {"progressToken": "p"}}});
    let (status, _, mut events) = client.post_stream(Bytes::from(body.to_string()), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let all = events.until_end(Duration::from_secs(10)).await.expect("the stream ends");
    assert_eq!(all.iter().filter(|m| m["method"] == "notifications/progress").count(), 3, "{all:?}");
    assert!(all.last().unwrap()["result"].is_object(), "{all:?}");
    assert_eq!(client.delete().await, StatusCode::OK);
    let (http1, http2) = web.mock.http_versions();
    assert_eq!(http1, 0, "no request over HTTP/1.1");
    assert!(http2 >= 5, "{http2} requests over HTTP/2");
    // The same without `http2`: HTTP/1.1, so the count above means something.
    let plain = MockServer::start(mock_named("plain")).await;
    let router2 = Router::start(&config(&http_upstream("plain", &plain.url, ""))).await;
    let mut c2 = Client::new(&router2.url);
    c2.initialize().await;
    c2.call_tool("plain__echo", json!({})).await;
    let (http1, http2) = plain.mock.http_versions();
    assert!(http1 >= 2 && http2 == 0, "{http1} {http2}");
    router.stop().await;
    router2.stop().await;
}
