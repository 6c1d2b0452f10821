//! MCP 2026-07-28 (stateless requests) through the router, against a
//! session-based (2025) upstream that the router bridges: validation of the
//! era's headers and `_meta`, discovery, lists with cache hints, calls with
//! progress, sampling and elicitation as `input_required` rounds, a tenant's
//! calls sharing one upstream session, and `subscriptions/listen`.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_test_support::{http_upstream, mock_named, MockServer, Router, Stateless};

async fn router_and_web() -> (Router, MockServer) {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&format!("[server]\nkeep_alive = \"1s\"\n{}", http_upstream("web", &web.url, ""))).await;
    (router, web)
}

fn text_of(response: &Value) -> String {
    response["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {response}")).to_owned()
}

fn error_of(reply: &switchboard_test_support::Reply) -> (StatusCode, i64) {
    let body = reply.json();
    (reply.status, body["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {body}")))
}

#[tokio::test]
async fn discovery_and_lists_carry_the_eras_result_members() {
    let (router, _web) = router_and_web().await;
    let client = Stateless::new(&router.url, json!({}));

    let discovered = client.call("server/discover", json!({})).await;
    let result = &discovered["result"];
    assert!(result["supportedVersions"].as_array().unwrap().contains(&json!("2026-07-28")), "{discovered}");
    assert!(result["supportedVersions"].as_array().unwrap().contains(&json!("2025-11-25")));
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(result["resultType"], "complete");
    assert!(result["ttlMs"].is_u64() && result["cacheScope"].is_string(), "{result}");
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "switchboard");

    let listed = client.call("tools/list", json!({})).await;
    let result = &listed["result"];
    let names: Vec<&str> = result["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"web__echo") && names.contains(&"web__sample"), "{names:?}");
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["cacheScope"], "public", "an open router's list is the same for everyone");
    assert!(result["ttlMs"].is_u64());
    for method in ["prompts/list", "resources/list", "resources/templates/list"] {
        let listed = client.call(method, json!({})).await;
        assert_eq!(listed["result"]["resultType"], "complete", "{method}: {listed}");
    }
}

#[tokio::test]
async fn headers_and_meta_are_checked_and_removed_methods_are_404() {
    let (router, _web) = router_and_web().await;
    let client = Stateless::new(&router.url, json!({}));
    let call = client.message(7, "tools/call", json!({"name": "web__echo", "arguments": {"x": 1}}));
    let good = Stateless::headers(&call);
    let good: Vec<(&str, &str)> = good.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    // Right headers: answered, with resultType, to the client's id.
    let ok = client.send(&call, &good).await.response();
    assert_eq!(ok["id"], 7);
    assert_eq!(ok["result"]["resultType"], "complete", "{ok}");
    assert_eq!(text_of(&ok), r#"{"x":1}"#);

    // Mcp-Method, Mcp-Name and the version header must agree with the body.
    let wrong_method = client.send(&call, &[good[0], ("mcp-method", "tools/list"), good[2]]).await;
    assert_eq!(error_of(&wrong_method), (StatusCode::BAD_REQUEST, -32020));
    assert_eq!(wrong_method.json()["id"], 7, "the error names the request");
    assert_eq!(error_of(&client.send(&call, &[good[0], good[1]]).await), (StatusCode::BAD_REQUEST, -32020));
    let other_name = client.send(&call, &[good[0], good[1], ("mcp-name", "web__add")]).await;
    assert_eq!(error_of(&other_name), (StatusCode::BAD_REQUEST, -32020));
    let base64 = client.send(&call, &[good[0], good[1], ("mcp-name", "=?base64?d2ViX19lY2hv?=")]).await;
    assert_eq!(base64.response()["result"]["resultType"], "complete", "a base64 header value is decoded");
    let other_version = client.send(&call, &[("mcp-protocol-version", "2025-11-25"), good[1], good[2]]).await;
    assert_eq!(other_version.status, StatusCode::BAD_REQUEST, "a session-era request without a session");

    // Versions we do not speak are refused with the list we do.
    let mut future = call.clone();
    future["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let refused = client.send(&future, &[("mcp-protocol-version", "2099-01-01"), good[1], good[2]]).await;
    assert_eq!(error_of(&refused), (StatusCode::BAD_REQUEST, -32022));
    assert!(refused.json()["error"]["data"]["supported"].as_array().unwrap().contains(&json!("2026-07-28")));

    // _meta must say what the client is.
    let mut bare = call.clone();
    bare["params"]["_meta"].as_object_mut().unwrap().remove("io.modelcontextprotocol/clientCapabilities");
    assert_eq!(error_of(&client.send(&bare, &good).await), (StatusCode::BAD_REQUEST, -32602));

    // Removed and unknown methods: 404. Unknown tools: a JSON-RPC error in a 200.
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "no/such"] {
        let reply = client.request(method, json!({"level": "info", "uri": "x"})).await;
        assert_eq!(error_of(&reply), (StatusCode::NOT_FOUND, -32601), "{method}");
    }
    let unknown = client.request("tools/call", json!({"name": "web__nope", "arguments": {}})).await;
    assert_eq!(error_of(&unknown), (StatusCode::OK, -32602));

    // No session to stream or end: GET and DELETE are 405.
    for method in [http::Method::GET, http::Method::DELETE] {
        let reply =
            client.client.send(method.clone(), bytes::Bytes::new(), &[("mcp-protocol-version", "2026-07-28")]).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(reply.headers["allow"], "POST");
    }
    // The session era goes on beside it on the same endpoint.
    let mut legacy = switchboard_test_support::Client::new(&router.url);
    legacy.initialize().await;
    assert_eq!(text_of(&legacy.call_tool("web__echo", json!({"y": 2})).await), r#"{"y":2}"#);
}

#[tokio::test]
async fn calls_stream_progress_and_share_one_upstream_session_per_tenant() {
    let (router, web) = router_and_web().await;
    let client = Stateless::new(&router.url, json!({}));
    // The catalog's own upstream session exists once something was listed.
    client.call("tools/list", json!({})).await;
    let before = web.mock.initialize_count();

    let (status, headers, mut stream) = client
        .stream(
            "tools/call",
            json!({"name": "web__progress", "arguments": {"steps": 3, "interval_ms": 20}, "_meta": {"progressToken": "tok"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut progress = 0;
    let last = loop {
        let event = stream.next_event(Duration::from_secs(10)).await.expect("an event");
        assert!(event.id.is_none(), "no event ids in the stateless era");
        let message: Value = serde_json::from_slice(&event.data).unwrap();
        if message["method"] == "notifications/progress" {
            assert_eq!(message["params"]["progressToken"], "tok");
            progress += 1;
        } else {
            break message;
        }
    };
    assert_eq!(progress, 3);
    assert_eq!(last["result"]["resultType"], "complete", "{last}");

    for i in 0..5 {
        let added = client.call("tools/call", json!({"name": "web__add", "arguments": {"a": i, "b": 1}})).await;
        assert_eq!(text_of(&added), (i + 1).to_string());
    }
    assert_eq!(web.mock.initialize_count(), before + 1, "one upstream session for the tenant, not one per request");
}

#[tokio::test]
async fn a_bridged_call_the_upstream_does_not_answer_in_time_gets_a_clear_error() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&http_upstream("web", &web.url, "timeout = \"300ms\"")).await;
    let client = Stateless::new(&router.url, json!({}));
    let started = std::time::Instant::now();
    let slow = client.call("tools/call", json!({"name": "web__sleep", "arguments": {"ms": 5000}})).await;
    assert!(started.elapsed() < Duration::from_secs(3), "answered after {:?}", started.elapsed());
    assert_eq!(slow["error"]["code"], -32001, "{slow}");
    assert!(slow["error"]["message"].as_str().unwrap().contains("300ms"), "{slow}");
    let added = client.call("tools/call", json!({"name": "web__add", "arguments": {"a": 2, "b": 3}})).await;
    assert_eq!(text_of(&added), "5", "the upstream session still serves");
    router.stop().await;
}

#[tokio::test]
async fn sampling_and_elicitation_become_input_required_rounds() {
    let (router, _web) = router_and_web().await;
    let client = Stateless::new(&router.url, json!({"sampling": {}, "elicitation": {"form": {}}}));

    let params = json!({"name": "web__sample", "arguments": {"prompt": "haiku"}});
    let first = client.call("tools/call", params.clone()).await;
    let result = &first["result"];
    assert_eq!(result["resultType"], "input_required", "{first}");
    let requests = result["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1);
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    let state = result["requestState"].as_str().unwrap().to_owned();

    // A tampered state is refused, and the call still waits for a real answer.
    let mut tampered = params.clone();
    tampered["requestState"] = json!(format!("x{state}"));
    tampered["inputResponses"] =
        json!({key: {"role": "assistant", "content": {"type": "text", "text": "no"}, "model": "m"}});
    let refused = client.call("tools/call", tampered).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");

    // The tenant's shared upstream session is nobody's to post to: its id,
    // worked out from the tenant's name, opens nothing at the legacy endpoint.
    let shared: String = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(b"default");
        "t.".chars().chain(digest[..16].iter().flat_map(|b| format!("{b:02x}").chars().collect::<Vec<_>>())).collect()
    };
    let outsider = switchboard_test_support::Client::new(&router.path(&format!("/messages?sessionId={shared}")));
    let forged = json!({"jsonrpc": "2.0", "id": key,
        "result": {"role": "assistant", "content": {"type": "text", "text": "forged"}, "model": "m"}});
    assert_eq!(outsider.post(forged).await.status, StatusCode::NOT_FOUND);

    let mut retry = params.clone();
    retry["requestState"] = json!(state);
    // Keys besides the one asked about are ignored (they could name another call's requests).
    retry["inputResponses"] = json!({key: {"role": "assistant", "content": {"type": "text", "text": "re haiku"},
        "model": "test", "stopReason": "endTurn"}, "0.n999": {"action": "decline"}});
    let done = client.call("tools/call", retry).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(text_of(&done), "sampled: re haiku");

    // Elicitation the same way.
    let first = client.call("tools/call", json!({"name": "web__elicit", "arguments": {"message": "who?"}})).await;
    let result = &first["result"];
    let (key, request) = result["inputRequests"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(request["method"], "elicitation/create", "{first}");
    let retry = json!({"name": "web__elicit", "arguments": {"message": "who?"}, "requestState": result["requestState"],
        "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}}});
    let done = client.call("tools/call", retry).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert!(text_of(&done).contains("Ada"), "{done}");

    // A client that did not declare sampling is told what the call needs.
    let plain = Stateless::new(&router.url, json!({}));
    let reply = plain.request("tools/call", json!({"name": "web__sample", "arguments": {"prompt": "x"}})).await;
    assert_eq!(error_of(&reply), (StatusCode::BAD_REQUEST, -32021));
    assert_eq!(reply.json()["error"]["data"]["requiredCapabilities"], json!({"sampling": {}}));
}

#[tokio::test]
async fn listen_streams_list_changes_tagged_with_the_subscription() {
    let (router, _web) = router_and_web().await;
    let client = Stateless::new(&router.url, json!({}));
    let (status, _, mut stream) = client
        .stream(
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true, "promptsListChanged": false}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let ack = stream.next(Duration::from_secs(5)).await.expect("the acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}), "only what was asked and honoured");
    let subscription = ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"].clone();
    assert!(subscription.is_u64(), "the listen request's id: {ack}");

    // Make the upstream's tool list change (through the router).
    let added = client.call("tools/call", json!({"name": "web__add_tool", "arguments": {"name": "fresh"}})).await;
    assert_eq!(added["result"]["resultType"], "complete", "{added}");
    let note = stream.next(Duration::from_secs(10)).await.expect("a list change");
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    assert_eq!(note["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], subscription);
    let listed = client.call("tools/list", json!({})).await;
    assert!(listed["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "web__fresh"), "{listed}");
}

#[tokio::test]
async fn a_2026_upstream_gets_requests_as_they_came_and_its_answers_go_back_untouched() {
    let mut options = mock_named("new");
    options.modern = true;
    options.list_ttl_ms = 60_000;
    let upstream = MockServer::start(options).await;
    let router =
        Router::start(&format!("[server]\nkeep_alive = \"1s\"\n{}", http_upstream("new", &upstream.url, ""))).await;
    let client = Stateless::new(&router.url, json!({"sampling": {}}));

    // The router's lists carry the upstream's cache hint (what is left of it).
    let listed = client.call("tools/list", json!({})).await;
    let ttl = listed["result"]["ttlMs"].as_u64().unwrap();
    assert!(ttl > 50_000 && ttl <= 60_000, "the upstream's ttlMs, counted down: {listed}");
    let metrics = switchboard_test_support::get_text(&router.path("/metrics")).await;
    assert!(metrics.contains(r#"switchboard_upstream_era{era="2026-07-28",upstream="new"} 1"#), "{metrics}");

    // input_required comes back as the upstream made it: its own key and state.
    let params = json!({"name": "new__sample", "arguments": {"prompt": "sonnet"}});
    let first = client.call("tools/call", params.clone()).await;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    let keys: Vec<&String> = first["result"]["inputRequests"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["sampling"], "the upstream's own key, not a relayed request's id");
    let mut retry = params.clone();
    retry["requestState"] = first["result"]["requestState"].clone();
    retry["inputResponses"] = json!({"sampling": {"role": "assistant", "content": {"type": "text", "text": "re sonnet"},
        "model": "test", "stopReason": "endTurn"}});
    let done = client.call("tools/call", retry.clone()).await;
    assert_eq!(text_of(&done), "sampled: re sonnet", "{done}");
    // The upstream checks its own state: a tampered one is refused there.
    retry["requestState"] = json!("tampered");
    assert_eq!(client.call("tools/call", retry).await["error"]["code"], -32602);
    // The upstream's -32021 keeps its 400.
    let plain = Stateless::new(&router.url, json!({}));
    let refused = plain.request("tools/call", params).await;
    assert_eq!(error_of(&refused), (StatusCode::BAD_REQUEST, -32021));
    assert_eq!(upstream.mock.initialize_count(), 0, "stateless all the way: no upstream session");

    // The upstream's list changes reach listen streams (the router listens to it).
    let (status, _, mut stream) =
        client.stream("subscriptions/listen", json!({"notifications": {"toolsListChanged": true}})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        stream.next(Duration::from_secs(5)).await.unwrap()["method"],
        "notifications/subscriptions/acknowledged"
    );
    client.call("tools/call", json!({"name": "new__add_tool", "arguments": {"name": "later"}})).await;
    let note = stream.next(Duration::from_secs(10)).await.expect("a list change");
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    let listed = client.call("tools/list", json!({})).await;
    assert!(listed["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "new__later"), "{listed}");

    // A session client of this dual-era upstream keeps a session of its own with it.
    let mut legacy = switchboard_test_support::Client::new(&router.url);
    legacy.initialize().await;
    assert_eq!(text_of(&legacy.call_tool("new__echo", json!({"z": 1})).await), r#"{"z":1}"#);
    assert_eq!(upstream.mock.initialize_count(), 1);
}

/// The era says closing the stream cancels the request: a client that hangs
/// up before the first event of a bridged call (nothing to relay yet) gets
/// its call cancelled upstream.
#[tokio::test]
async fn hanging_up_before_the_first_event_cancels_the_bridged_call() {
    let (router, web) = router_and_web().await;
    let client = Stateless::new(&router.url, json!({}));
    // No progress token: the upstream streams, but says nothing for 5 s.
    let call =
        client.request("tools/call", json!({"name": "web__progress", "arguments": {"steps": 50, "interval_ms": 100}}));
    assert!(tokio::time::timeout(Duration::from_millis(500), call).await.is_err(), "nothing comes before the end");
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(5), || async {
            // The only call this upstream had: any cancellation is of it.
            !web.mock.cancelled().is_empty()
        })
        .await,
        "the upstream hears the call cancelled: {:?}",
        web.mock.cancelled()
    );
}

/// A session (2025) client calling a 2026-07-28-only upstream's tool whose
/// input schema mirrors an argument into a header (`x-mcp-header`): the
/// router adds the `Mcp-Param-*` header the era asks of clients, which the
/// upstream checks against the body (-32020 without it).
#[tokio::test]
async fn a_session_clients_call_to_a_2026_only_upstream_carries_mirrored_argument_headers() {
    let mut options = mock_named("conf");
    options.modern = true;
    options.modern_only = true;
    options.conformance = true;
    let conf = MockServer::start(options).await;
    let router = Router::start(&http_upstream("conf", &conf.url, "")).await;
    let mut client = switchboard_test_support::Client::new(&router.url);
    client.initialize().await;
    for region in ["eu-west-1", "Zürich"] {
        let done = client.call_tool("conf__test_header_param", json!({"region": region})).await;
        assert_eq!(text_of(&done), format!("region: {region}"), "{done}");
    }
    assert_eq!(conf.mock.initialize_count(), 0, "reached statelessly");
}

/// A session client's resource subscriptions to a 2026-07-28-only upstream,
/// which has no `resources/subscribe`: a `subscriptions/listen` stream of
/// the session's names the subscribed URIs, and its updates reach the
/// client's GET stream with the exposed URI. Unsubscribing from the last
/// URI ends the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_clients_subscriptions_to_a_2026_only_upstream_are_kept_as_listen_streams() {
    let mut options = mock_named("web");
    options.modern = true;
    options.modern_only = true;
    let web = MockServer::start(options).await;
    let router = Router::start(&http_upstream("web", &web.url, "")).await;
    let mut client = switchboard_test_support::Client::new(&router.url);
    client.initialize().await;
    // The catalog's own listen stream (list changes).
    let streams = || web.mock.listen_streams();
    assert!(switchboard_test_support::eventually(Duration::from_secs(10), || async { streams() == 1 }).await);
    let mut events = client.open_stream().await;

    let uri = "web+mock://web/hello";
    assert_eq!(client.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    assert_eq!(streams(), 2, "listening by the time the subscription is answered");
    client.call_tool("web__touch", json!({"uri": "mock://web/other"})).await;
    client.call_tool("web__touch", json!({"uri": "mock://web/hello"})).await;
    let update = events.next(Duration::from_secs(10)).await.expect("the update");
    assert_eq!(update["method"], "notifications/resources/updated", "{update}");
    assert_eq!(update["params"]["uri"], uri, "the exposed URI, and only the subscribed one");

    assert_eq!(client.call("resources/unsubscribe", json!({"uri": uri})).await["result"], json!({}));
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(10), || async { streams() == 1 }).await,
        "the session's listen stream ended: {} open",
        streams()
    );
    assert_eq!(web.mock.initialize_count(), 0, "reached statelessly");
}

/// A 2026-07-28 upstream that streams its answers as newline-delimited JSON
/// in an `application/json` body (as the official conformance server does)
/// rather than SSE: the router reads them message by message, so a call's
/// progress reaches the client as it comes, and the upstream's list
/// changes reach the router through its own listen stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_streaming_newline_delimited_json_is_relayed_as_it_streams() {
    let mut options = mock_named("new");
    options.modern = true;
    options.ndjson_streams = true;
    let upstream = MockServer::start(options).await;
    let router = Router::start(&http_upstream("new", &upstream.url, "")).await;
    let client = Stateless::new(&router.url, json!({}));

    let (status, headers, mut stream) = client
        .stream(
            "tools/call",
            json!({"name": "new__progress", "arguments": {"steps": 3, "interval_ms": 200},
                "_meta": {"progressToken": "p"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"), "relayed as a stream");
    let first = stream.next(Duration::from_secs(5)).await.expect("the first progress notification");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    let rest = stream.until_end(Duration::from_secs(10)).await.expect("the stream ends");
    let last = rest.last().expect("the result");
    assert_eq!(text_of(last), "done after 3 steps", "{last}");

    let (_, _, mut listen) =
        client.stream("subscriptions/listen", json!({"notifications": {"toolsListChanged": true}})).await;
    listen.next(Duration::from_secs(5)).await.expect("the acknowledgement");
    client.call("tools/call", json!({"name": "new__add_tool", "arguments": {"name": "later"}})).await;
    let note = listen.next(Duration::from_secs(10)).await.expect("the upstream's list change, through the router");
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
}

/// A 2026-07-28-only upstream that asks for input whatever the client
/// declared (as the official conformance server does): a session client
/// that did not declare sampling is never sent a `sampling/createMessage`
/// it cannot answer; its call fails, saying why. One that declared it is
/// asked, and its answer completes the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_client_is_asked_only_what_it_declared() {
    let mut options = mock_named("conf");
    options.modern = true;
    options.modern_only = true;
    options.conformance = true;
    options.ask_regardless = true;
    let conf = MockServer::start(options).await;
    let router = Router::start(&http_upstream("conf", &conf.url, "")).await;
    let tool = "conf__test_input_required_result_sampling";

    let mut plain = switchboard_test_support::Client::new(&router.url);
    plain.initialize().await;
    let (status, _, mut stream) = plain.request_stream("tools/call", json!({"name": tool, "arguments": {}})).await;
    assert_eq!(status, StatusCode::OK);
    let answer = stream.next(Duration::from_secs(10)).await.expect("an answer");
    assert!(answer.get("method").is_none(), "no request the client cannot answer: {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not declare the sampling capability"), "{answer}");

    let mut sampler = switchboard_test_support::Client::new(&router.url);
    sampler.initialize_with(json!({"sampling": {}})).await;
    let (_, _, mut stream) = sampler.request_stream("tools/call", json!({"name": tool, "arguments": {}})).await;
    let ask = stream.next(Duration::from_secs(10)).await.expect("the sampling request");
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let reply = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "Paris"}, "model": "m", "stopReason": "endTurn"}});
    assert_eq!(sampler.post(reply).await.status, StatusCode::ACCEPTED);
    let done = stream.next(Duration::from_secs(10)).await.expect("the result");
    assert!(text_of(&done).contains("Paris"), "{done}");
}

/// A stateless call's audit record holds its outcome, and an error
/// response's code, whether the answer came whole or at the end of a
/// stream; a result's record has no code. A call the upstream does not
/// answer within its timeout is answered with the timeout's error then.
#[tokio::test]
async fn a_stateless_calls_audit_record_has_its_outcome_and_error_code() {
    let mut options = mock_named("new");
    options.modern = true;
    let upstream = MockServer::start(options).await;
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-stateless-audit-"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("switchboard.db").display());
    let router = Router::start(&format!(
        "[database]\nurl = \"{url}\"\n[audit]\nspool = \"{}\"\nflush_every = \"20ms\"\n{}",
        dir.join("audit.spool").display(),
        http_upstream("new", &upstream.url, "timeout = \"400ms\"")
    ))
    .await;
    let client = Stateless::new(&router.url, json!({}));

    let done = client.call("tools/call", json!({"name": "new__echo", "arguments": {"a": 1}})).await;
    assert_eq!(text_of(&done), r#"{"a":1}"#);
    let refused = client.call("tools/call", json!({"name": "new__add", "arguments": {"a": "one"}})).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let (status, _, mut stream) = client
        .stream(
            "tools/call",
            json!({"name": "new__progress", "arguments": {"steps": 2, "interval_ms": 10, "error_code": -32050},
                "_meta": {"progressToken": "p"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let messages = stream.until_end(Duration::from_secs(10)).await.expect("the stream ends");
    assert_eq!(messages.iter().filter(|m| m["method"] == "notifications/progress").count(), 2, "{messages:?}");
    let last = messages.last().expect("the answer");
    assert_eq!(last["error"]["code"], -32050, "{last}");
    let asked = std::time::Instant::now();
    let late = client.call("tools/call", json!({"name": "new__sleep", "arguments": {"ms": 5000}})).await;
    assert_eq!(late["error"]["code"], -32001, "{late}");
    assert!(asked.elapsed() < Duration::from_secs(4), "answered at the timeout, not with the upstream");

    let db = switchboard_db::Database::connect(&url, Duration::from_secs(3)).unwrap();
    let query = switchboard_db::AuditQuery { limit: 100, ..Default::default() };
    let mut records = Vec::new();
    for _ in 0..100 {
        records = db.query_audit(&query).await.unwrap();
        if records.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen: Vec<_> = records
        .iter()
        .map(|(_, r)| (r.target.clone().unwrap_or_default(), r.outcome.to_string(), r.error_code))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("new__add".to_owned(), "error".to_owned(), Some(-32602)),
            ("new__echo".to_owned(), "ok".to_owned(), None),
            ("new__progress".to_owned(), "error".to_owned(), Some(-32050)),
            ("new__sleep".to_owned(), "timeout".to_owned(), Some(-32001)),
        ]
    );
}
