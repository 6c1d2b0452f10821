//! Traces to the OpenTelemetry MCP semantic conventions, against a real
//! OTLP receiver (built on the official protocol definitions), over
//! OTLP/HTTP and OTLP/gRPC: a `tools/call` that comes with a `traceparent`
//! has its SERVER span (name and attributes) as a child of the caller's
//! span, the CLIENT span of its upstream request as the SERVER span's
//! child, and the upstream gets that CLIENT span as its parent in both the
//! `traceparent` header and `params._meta.traceparent`. And the MCP metrics
//! of the conventions on `/metrics`.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::peers::otlp_receiver;
use switchboard_test_support::{eventually, http_upstream, mock_named, Client, MockServer, Router};

async fn get_json(url: &str) -> Value {
    let text = switchboard_test_support::get_text(url).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"))
}

/// The spans the receiver has of `trace`.
pub(crate) async fn spans_of(receiver: &str, trace: &str) -> Vec<Value> {
    let all = get_json(&format!("{receiver}/spans")).await;
    all.as_array().unwrap().iter().filter(|s| s["trace_id"] == trace).cloned().collect()
}

/// What the upstream's `whoami` saw of the call's trace context.
fn seen_context(answer: &Value) -> (Option<String>, Option<String>) {
    let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{answer}"));
    let v: Value = serde_json::from_str(text).unwrap();
    let get = |k: &str| v["traceparent"][k].as_str().map(str::to_owned);
    (get("header"), get("meta"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_call_has_server_and_client_spans_and_the_upstream_gets_the_context_both_ways() {
    let (_receiver, receiver) = otlp_receiver().await;
    let grpc = get_json(&format!("{receiver}/info")).await["grpc"].as_str().unwrap().to_owned();
    for (protocol, endpoint) in [("http/protobuf", receiver.clone()), ("grpc", format!("http://{grpc}"))] {
        let mut options = mock_named("gh");
        options.whoami = true;
        let gh = MockServer::start(options).await;
        // Sampling 0: only requests whose caller sampled them are traced.
        let config = format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\notlp_protocol = \"{protocol}\"\nsample_ratio = 0.0\n{upstream}",
            upstream = http_upstream("gh", &gh.url, ""),
        );
        let router = Router::start(&config).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;

        // The caller's context in `params._meta` (the header names another
        // trace, which `_meta` wins over).
        let trace = format!("{:032x}", rand_u128());
        let caller_span = "00f067aa0ba902b7";
        let parent = format!("00-{trace}-{caller_span}-01");
        let other = format!("00-{:032x}-1111111111111111-01", rand_u128());
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "gh__whoami", "arguments": {}, "_meta": {"traceparent": parent}}});
        let reply = client.post_raw(serde_json::to_vec(&call).unwrap().into(), &[("traceparent", &other)]).await;
        let answer = reply.json();
        let (header, meta) = seen_context(&answer);
        let (header, meta) = (header.expect("no traceparent header upstream"), meta.expect("no _meta.traceparent"));
        assert_eq!(header, meta, "{protocol}: the header and _meta name one span");
        assert!(header.starts_with(&format!("00-{trace}-")) && header.ends_with("-01"), "{header}");
        let client_span = header[36..52].to_owned();
        assert_ne!(client_span, caller_span);

        let arrived =
            eventually(Duration::from_secs(15), || async { spans_of(&receiver, &trace).await.len() >= 2 }).await;
        let spans = spans_of(&receiver, &trace).await;
        assert!(arrived, "{protocol}: spans of the trace: {spans:#?}");
        let server = spans.iter().find(|s| s["kind"] == 2).unwrap_or_else(|| panic!("no SERVER span: {spans:#?}"));
        let upstream = spans.iter().find(|s| s["kind"] == 3).unwrap_or_else(|| panic!("no CLIENT span: {spans:#?}"));
        let via = if protocol == "grpc" { "grpc" } else { "http" };
        assert_eq!((server["via"].as_str(), upstream["via"].as_str()), (Some(via), Some(via)));
        // SERVER: a child of the caller's span, named and attributed per the conventions.
        assert_eq!(server["name"], "tools/call gh__whoami");
        assert_eq!(server["parent_span_id"], caller_span);
        let a = &server["attributes"];
        assert_eq!(a["mcp.method.name"], "tools/call");
        assert_eq!(a["gen_ai.tool.name"], "gh__whoami");
        assert_eq!(a["gen_ai.operation.name"], "execute_tool");
        assert_eq!(a["jsonrpc.request.id"], "7");
        assert_eq!(a["mcp.session.id"].as_str(), client.session.as_deref());
        assert_eq!(a["mcp.protocol.version"], "2025-11-25");
        assert_eq!((a["network.transport"].as_str(), a["network.protocol.name"].as_str()), (Some("tcp"), Some("http")));
        assert_eq!(a["client.address"], "127.0.0.1");
        assert!(a["client.port"].as_i64().is_some_and(|p| p > 0), "{a}");
        assert_eq!(a["switchboard.tenant"], "default");
        assert!(a.get("error.type").is_none(), "{a}");
        assert_eq!(server["resource"]["service.name"], "switchboard");
        // CLIENT: the SERVER span's child, the span the upstream was told of,
        // naming the upstream and the tool as the upstream knows it.
        assert_eq!(upstream["parent_span_id"], server["span_id"]);
        assert_eq!(upstream["span_id"], client_span.as_str());
        assert_eq!(upstream["name"], "tools/call whoami");
        let a = &upstream["attributes"];
        assert_eq!(a["gen_ai.tool.name"], "whoami");
        let port = gh.url.rsplit(':').next().unwrap().split('/').next().unwrap().parse::<i64>().unwrap();
        assert_eq!((a["server.address"].as_str(), a["server.port"].as_i64()), (Some("127.0.0.1"), Some(port)));
        assert_eq!(a["switchboard.upstream"], "gh");
        // Within the SERVER span.
        let within = |s: &Value, k: &str| s[k].as_u64().unwrap();
        assert!(
            within(upstream, "start") >= within(server, "start") && within(upstream, "end") <= within(server, "end")
        );

        // A failing call: its span says so.
        let trace2 = format!("{:032x}", rand_u128());
        let failing = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "gh__nope", "arguments": {}}});
        let header = format!("00-{trace2}-{caller_span}-01");
        client.post_raw(serde_json::to_vec(&failing).unwrap().into(), &[("traceparent", &header)]).await;
        let arrived =
            eventually(Duration::from_secs(15), || async { !spans_of(&receiver, &trace2).await.is_empty() }).await;
        assert!(arrived, "{protocol}: no span of the failing call");
        let failed = &spans_of(&receiver, &trace2).await[0];
        assert_eq!(failed["attributes"]["error.type"], "-32602", "{failed}");
        assert_eq!(failed["status"]["code"], 2, "{failed}");

        // Not sampled by the caller, and sampling 0: no span, the caller's
        // context passed on as it came.
        let trace3 = format!("{:032x}", rand_u128());
        let unsampled = format!("00-{trace3}-{caller_span}-00");
        let answer = client
            .post_raw(
                serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                    "params": {"name": "gh__whoami", "arguments": {}}}))
                .unwrap()
                .into(),
                &[("traceparent", &unsampled)],
            )
            .await
            .json();
        assert_eq!(seen_context(&answer), (Some(unsampled.clone()), Some(unsampled.clone())));

        // The conventions' metrics.
        let labels = ["mcp_method_name=\"tools/call\"", "gen_ai_tool_name=\"gh__whoami\"", "le=\"+Inf\""];
        assert!(router.metric("mcp_server_operation_duration_seconds_bucket", &labels).await >= 2.0);
        let labels = ["mcp_method_name=\"tools/call\"", "gen_ai_tool_name=\"whoami\"", "server_address=\"127.0.0.1\""];
        assert!(router.metric("mcp_client_operation_duration_seconds_count", &labels).await >= 2.0);
        let labels = ["mcp_method_name=\"tools/call\"", "error_type=\"-32602\""];
        assert!(router.metric("mcp_server_operation_duration_seconds_count", &labels).await >= 1.0);
        assert_eq!(spans_of(&receiver, &trace3).await.len(), 0);
        let exported = router.metric("switchboard_trace_spans_total", &["outcome=\"exported\""]).await;
        assert!(exported >= 3.0, "{exported}");
        // The session ended: its duration, and its upstream session's.
        assert_eq!(client.delete().await, http::StatusCode::OK);
        let ended = eventually(Duration::from_secs(5), || async {
            router.metric("mcp_server_session_duration_seconds_count", &["mcp_protocol_version=\"2025-11-25\""]).await
                >= 1.0
                && router.metric("mcp_client_session_duration_seconds_count", &["server_address=\"127.0.0.1\""]).await
                    >= 1.0
        })
        .await;
        assert!(ended, "no session durations");
    }
}

/// A random trace id's worth of bits.
fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let half = || std::collections::hash_map::RandomState::new().build_hasher().finish();
    (u128::from(half()) << 64 | u128::from(half())) | 1
}

/// JSON logs lead to the trace: a line written while a traced request is
/// served carries its trace id and the router's span id for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_of_a_traced_request_carry_its_trace_and_span_ids() {
    use switchboard_test_support::peers::Process;
    let (_receiver, receiver) = otlp_receiver().await;
    let gh = MockServer::start(mock_named("gh")).await;
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-logs-"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("router.toml");
    let config = format!(
        "[auth]\nmode = \"none\"\n[database]\nurl = \"\"\n[egress]\nallow = [\"loopback\"]\n\
         [log]\nformat = \"json\"\nlevel = \"warn,switchboard_router=debug,switchboard_session=debug\"\n\
         [telemetry]\notlp_endpoint = \"{receiver}\"\nsample_ratio = 1.0\n{upstream}",
        upstream = http_upstream("gh", &gh.url, ""),
    );
    std::fs::write(&file, config).unwrap();
    let (router, addr) = Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    let mut client = Client::new(&format!("http://{addr}/mcp"));
    client.initialize().await;
    let trace = format!("{:032x}", rand_u128());
    let parent = format!("00-{trace}-00f067aa0ba902b7-01");
    // A call of an unknown tool: the router logs why it fails.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "gh__echo", "arguments": {"x": 1}}});
    client.post_raw(serde_json::to_vec(&call).unwrap().into(), &[("traceparent", &parent)]).await;
    let arrived = eventually(Duration::from_secs(15), || async { !spans_of(&receiver, &trace).await.is_empty() }).await;
    assert!(arrived, "no span");
    let spans = spans_of(&receiver, &trace).await;
    let server = spans.iter().find(|s| s["kind"] == 2).expect("a SERVER span");
    let lines: Vec<Value> = router
        .output()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["span"]["trace_id"] == trace.as_str())
        .collect();
    assert!(!lines.is_empty(), "no log line names the trace: {:#?}", router.output());
    for line in &lines {
        assert_eq!(line["span"]["span_id"], server["span_id"], "{line}");
    }
}

/// A sampling request an upstream sends within a traced call is the
/// router's CLIENT span towards the client, a child of the call's span
/// towards the upstream; the client is told of it in the request's
/// `params._meta.traceparent`, and the span ends with the client's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_server_request_is_a_span_of_the_call_and_the_client_is_told_of_it() {
    let (_receiver, receiver) = otlp_receiver().await;
    let web = MockServer::start(mock_named("web")).await;
    let config = format!(
        "[telemetry]\notlp_endpoint = \"{receiver}\"\nsample_ratio = 0.0\n{}",
        http_upstream("web", &web.url, "")
    );
    let router = Router::start(&config).await;
    let mut client = Client::new(&router.url);
    client.initialize_with(json!({"sampling": {}})).await;

    let trace = format!("{:032x}", rand_u128());
    let caller = format!("00-{trace}-00f067aa0ba902b7-01");
    let call = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
        "params": {"name": "web__sample", "arguments": {"prompt": "p"}, "_meta": {"traceparent": caller}}});
    let (status, _, mut stream) = client.post_stream(serde_json::to_vec(&call).unwrap().into(), &[]).await;
    assert_eq!(status.as_u16(), 200);
    let ask = stream.next(Duration::from_secs(10)).await.expect("the sampling request");
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let told = ask["params"]["_meta"]["traceparent"].as_str().unwrap_or_else(|| panic!("not told: {ask}")).to_owned();
    assert!(told.starts_with(&format!("00-{trace}-")) && told.ends_with("-01"), "{told}");
    let relay_span = told[36..52].to_owned();
    // The rest of the request as the upstream sent it.
    assert_eq!(ask["params"]["messages"][0]["content"]["text"], "p", "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "hi"}, "model": "m", "stopReason": "endTurn"}});
    assert_eq!(client.post(answer).await.status.as_u16(), 202);
    let done = stream.next(Duration::from_secs(10)).await.expect("the result");
    assert_eq!(done["result"]["content"][0]["text"], "sampled: hi", "{done}");

    let arrived = eventually(Duration::from_secs(15), || async { spans_of(&receiver, &trace).await.len() >= 3 }).await;
    let spans = spans_of(&receiver, &trace).await;
    assert!(arrived, "{spans:#?}");
    let relayed = spans.iter().find(|s| s["span_id"] == relay_span.as_str()).unwrap_or_else(|| panic!("{spans:#?}"));
    let to_upstream = spans
        .iter()
        .find(|s| s["kind"] == 3 && s["name"] == "tools/call sample")
        .unwrap_or_else(|| panic!("no span of the call upstream: {spans:#?}"));
    assert_eq!(relayed["kind"], 3, "{relayed}");
    assert_eq!(relayed["name"], "sampling/createMessage");
    assert_eq!(relayed["parent_span_id"], to_upstream["span_id"], "{spans:#?}");
    assert_eq!(relayed["attributes"]["mcp.method.name"], "sampling/createMessage");
    assert_eq!(relayed["attributes"]["mcp.session.id"].as_str(), client.session.as_deref());
    assert_eq!(relayed["attributes"]["switchboard.upstream"], "web");
    let at = |s: &Value, k: &str| s[k].as_u64().unwrap();
    assert!(at(relayed, "start") >= at(to_upstream, "start") && at(relayed, "end") <= at(to_upstream, "end"));
}

/// The MCP metrics reach the collector too, over OTLP/HTTP and OTLP/gRPC,
/// under the conventions' names and attributes, cumulative.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_metrics_are_exported_over_otlp_both_ways() {
    let (_receiver, receiver) = otlp_receiver().await;
    let grpc = get_json(&format!("{receiver}/info")).await["grpc"].as_str().unwrap().to_owned();
    let web = MockServer::start(mock_named("web")).await;
    for (protocol, endpoint, via) in
        [("http/protobuf", receiver.clone(), "http"), ("grpc", format!("http://{grpc}"), "grpc")]
    {
        let config = format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\notlp_protocol = \"{protocol}\"\nsample_ratio = 0.0\n\
             metrics_interval = \"1s\"\nservice_name = \"sb-{via}\"\n{}",
            http_upstream("web", &web.url, "")
        );
        let router = Router::start(&config).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        for _ in 0..3 {
            assert!(client.call_tool("web__echo", json!({"x": 1})).await["result"].is_object());
        }
        let points = || async {
            let all = get_json(&format!("{receiver}/metrics")).await;
            all.as_array()
                .unwrap()
                .iter()
                .filter(|p| p["via"] == via && p["resource"]["service.name"] == format!("sb-{via}"))
                .cloned()
                .collect::<Vec<_>>()
        };
        let calls = |points: &[Value], name: &str| {
            points
                .iter()
                .filter(|p| p["name"] == name && p["attributes"]["mcp.method.name"] == "tools/call")
                .map(|p| p["count"].as_u64().unwrap())
                .max()
                .unwrap_or(0)
        };
        let arrived = eventually(Duration::from_secs(10), || async {
            let points = points().await;
            calls(&points, "mcp.server.operation.duration") >= 3 && calls(&points, "mcp.client.operation.duration") >= 3
        })
        .await;
        let points = points().await;
        assert!(arrived, "{protocol}: {points:#?}");
        let server = points
            .iter()
            .rev()
            .find(|p| {
                p["name"] == "mcp.server.operation.duration" && p["attributes"]["mcp.method.name"] == "tools/call"
            })
            .unwrap();
        assert_eq!(server["unit"], "s");
        assert_eq!(server["temporality"], 2, "cumulative");
        assert_eq!(server["attributes"]["gen_ai.tool.name"], "web__echo", "{server}");
        assert_eq!(server["attributes"]["mcp.protocol.version"], "2025-11-25", "{server}");
        let buckets: u64 = server["bucket_counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
        assert_eq!(buckets, server["count"].as_u64().unwrap(), "{server}");
        assert_eq!(server["bounds"].as_array().unwrap().len() + 1, server["bucket_counts"].as_array().unwrap().len());
        let client_side = points
            .iter()
            .rev()
            .find(|p| {
                p["name"] == "mcp.client.operation.duration" && p["attributes"]["mcp.method.name"] == "tools/call"
            })
            .unwrap();
        assert_eq!(client_side["attributes"]["gen_ai.tool.name"], "echo", "{client_side}");
        assert_eq!(client_side["attributes"]["server.address"], "127.0.0.1", "{client_side}");
        assert!(client_side["attributes"]["server.port"].as_i64().is_some(), "an integer: {client_side}");
        let exported = router.metric("switchboard_otlp_metric_exports_total", &["outcome=\"exported\""]).await;
        assert!(exported >= 1.0, "{protocol}: {exported}");
        router.stop().await;
    }
}

/// Spans wait up to `flush_every` to go out together; a router shut down
/// sends those it gathered before it ends, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_gathered_for_a_batch_are_sent_when_the_router_stops() {
    let (_receiver, receiver) = otlp_receiver().await;
    let gh = MockServer::start(mock_named("gh")).await;
    let config = format!(
        "[telemetry]\notlp_endpoint = \"{receiver}\"\nsample_ratio = 0.0\nflush_every = \"60s\"\n{upstream}",
        upstream = http_upstream("gh", &gh.url, ""),
    );
    let router = Router::start(&config).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let trace = format!("{:032x}", rand_u128());
    let parent = format!("00-{trace}-00f067aa0ba902b7-01");
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "gh__echo", "arguments": {"text": "x"}}});
    let reply = client.post_raw(serde_json::to_vec(&call).unwrap().into(), &[("traceparent", &parent)]).await;
    assert!(reply.json()["result"].is_object(), "{}", reply.json());
    // Gathered, not sent: a batch is far from full and 60s far off.
    let early = eventually(Duration::from_secs(2), || async { !spans_of(&receiver, &trace).await.is_empty() }).await;
    assert!(!early, "sent before flush_every passed");
    router.stop().await;
    let spans = spans_of(&receiver, &trace).await;
    assert_eq!(spans.len(), 2, "the SERVER and CLIENT spans, sent as the router stopped: {spans:#?}");
}
