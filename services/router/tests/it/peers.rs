//! Real peers through the router: the official Python SDK client (`mcp` 2.x,
//! `mode="legacy"`) against `@modelcontextprotocol/server-everything` (over
//! Streamable HTTP and over stdio) and `mcp-server-time` (stdio). Each result
//! through the router is compared with the same call made directly. And the
//! same client in the stateless era (`mode="2026-07-28"` and `"auto"`)
//! against server-everything (2025 only: the router bridges) and the SDK's
//! own `MCPServer` (2026-07-28: passed through, and bridged the other way
//! for a `mode="legacy"` client).
//!
//! Needs `scripts/install-peers` (run by `scripts/test`).

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::peers::{dual_era_http, everything_http, node_bin, python_script, run_python_client};
use switchboard_test_support::{http_upstream, Router};

fn stdio_upstream(name: &str, command: &std::path::Path, args: &[&str]) -> String {
    format!(
        "[[upstreams]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = {}\nlist_timeout = \"20s\"\n",
        command.display(),
        serde_json::to_string(args).unwrap()
    )
}

/// Real peers start slower than our mock, above all on a busy machine: give
/// their lists time, and retry a failed one quickly.
async fn start_router(upstreams: &str) -> Router {
    Router::start(&format!("[catalog]\nretry_after = \"250ms\"\n{upstreams}")).await
}

fn stdio_target(command: &std::path::Path, args: &[&str]) -> String {
    json!({"command": command, "args": args}).to_string()
}

fn names(output: &Value) -> Vec<&str> {
    output["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_through_the_router_to_everything_over_http_and_time_over_stdio() {
    let (_everything, everything_url) = everything_http().await;
    let time = python_script("mcp-server-time");
    let time_args = ["--local-timezone", "UTC"];
    let router = start_router(&format!(
        "{}{}",
        http_upstream("everything", &everything_url, "list_timeout = \"20s\""),
        stdio_upstream("time", &time, &time_args)
    ))
    .await;

    let convert = json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"});
    let routed_calls = json!([
        ["everything__echo", {"message": "through the router"}],
        ["everything__get-sum", {"a": 2, "b": 3}],
        ["time__convert_time", convert],
    ]);
    let routed = run_python_client("list_and_call.py", &[&router.url, &routed_calls.to_string()]).await;
    let tools = names(&routed);
    assert!(tools.contains(&"everything__echo"), "{tools:?}");
    assert!(tools.contains(&"time__get_current_time"), "{tools:?}");
    assert!(tools.contains(&"time__convert_time"));
    assert!(!tools.iter().any(|t| !t.starts_with("everything__") && !t.starts_with("time__")), "{tools:?}");

    let direct_everything = run_python_client(
        "list_and_call.py",
        &[
            &everything_url,
            &json!([["echo", {"message": "through the router"}], ["get-sum", {"a": 2, "b": 3}]]).to_string(),
        ],
    )
    .await;
    let direct_time = run_python_client(
        "list_and_call.py",
        &[&stdio_target(&time, &time_args), &json!([["convert_time", convert]]).to_string()],
    )
    .await;
    assert_eq!(routed["results"][0], direct_everything["results"][0], "echo: the upstream's result, unchanged");
    assert_eq!(routed["results"][1], direct_everything["results"][1], "get-sum");
    assert_eq!(routed["results"][2], direct_time["results"][0], "convert_time");
    assert_eq!(routed["results"][0]["content"][0]["text"], "Echo: through the router");

    // The same list as the upstreams give directly, only namespaced; plus the
    // tools server-everything offers only to clients that can answer sampling
    // or elicitation (the catalog is fetched declaring both).
    let mut expected: Vec<String> = names(&direct_everything).iter().map(|n| format!("everything__{n}")).collect();
    expected.extend(names(&direct_time).iter().map(|n| format!("time__{n}")));
    let got: Vec<String> = tools.iter().map(|s| s.to_string()).collect();
    for name in &expected {
        assert!(got.contains(name), "{name} missing from {got:?}");
    }
    let extra: Vec<&String> = got.iter().filter(|n| !expected.contains(n)).collect();
    let gated = [
        "everything__trigger-sampling-request",
        "everything__trigger-elicitation-request",
        "everything__trigger-url-elicitation",
    ];
    assert!(extra.iter().all(|n| gated.contains(&n.as_str())), "unexpected extra tools {extra:?}");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_through_the_router_to_everything_over_stdio() {
    let everything = node_bin("mcp-server-everything");
    let router = start_router(&stdio_upstream("everything", &everything, &[])).await;
    let calls = json!([["everything__echo", {"message": "stdio"}], ["everything__get-sum", {"a": 20, "b": 22}]]);
    let routed = run_python_client("list_and_call.py", &[&router.url, &calls.to_string()]).await;
    assert!(names(&routed).contains(&"everything__echo"));
    let direct = run_python_client(
        "list_and_call.py",
        &[
            &stdio_target(&everything, &[]),
            &json!([["echo", {"message": "stdio"}], ["get-sum", {"a": 20, "b": 22}]]).to_string(),
        ],
    )
    .await;
    assert_eq!(routed["results"], direct["results"]);
    assert_eq!(routed["results"][1]["content"][0]["text"], "The sum of 20 and 22 is 42.");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_stdio_through_switchboard_connect() {
    use switchboard_test_support::{mock_named, stdio_mock_upstream, MockServer};
    let web = MockServer::start(mock_named("web")).await;
    let router =
        start_router(&format!("{}{}", http_upstream("web", &web.url, ""), stdio_mock_upstream("local", ""))).await;
    let bridge = stdio_target(
        &switchboard_test_support::router_binary(),
        &["connect", &router.url, "--header", "X-Client: bridge-test"],
    );
    let calls = json!([["web__echo", {"via": "bridge"}], ["local__add", {"a": 1, "b": 2}]]);
    let bridged = run_python_client("list_and_call.py", &[&bridge, &calls.to_string()]).await;
    let direct = run_python_client("list_and_call.py", &[&router.url, &calls.to_string()]).await;
    assert!(names(&bridged).contains(&"web__echo") && names(&bridged).contains(&"local__add"));
    assert_eq!(bridged["tools"], direct["tools"], "the same catalog over stdio as over HTTP");
    assert_eq!(bridged["results"], direct["results"]);
    assert_eq!(bridged["results"][0]["content"][0]["text"], r#"{"via":"bridge"}"#);
    router.stop().await;
}

/// What a router must relay, with a real server and the real Python SDK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_sampling_elicitation_subscriptions_and_colliding_clients_through_the_router() {
    let (_everything, everything_url) = everything_http().await;
    let router =
        start_router(&http_upstream("everything", &everything_url, "timeout = \"30s\"\nlist_timeout = \"20s\"")).await;
    let out = run_python_client(
        "fidelity.py",
        &[&router.url, "everything__", "progress,sampling,elicitation,url_elicitation,subscribe,collide"],
    )
    .await;
    // Sampling and elicitation tools appear because the router declared the client's capabilities upstream.
    let tools = names(&out);
    assert!(tools.contains(&"everything__trigger-sampling-request"), "{tools:?}");
    assert!(tools.contains(&"everything__trigger-elicitation-request"), "{tools:?}");

    let progress = out["progress"]["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 3, "every progress notification arrives: {out}");
    assert_eq!(progress[2]["progress"], 3.0);
    assert!(out["sampling"].to_string().contains("four"), "the client's sampling answer reached the server: {out}");
    assert!(out["elicitation"].to_string().to_lowercase().contains("decline"), "{out}");
    assert_eq!(
        out["url_elicitation_modes"],
        json!(["form", "url"]),
        "form, then URL-mode elicitation reach the client: {out}"
    );
    assert!(out["url_elicitation"].to_string().to_lowercase().contains("declined"), "{out}");

    let subscribed = out["subscribed"].as_str().unwrap();
    assert_eq!(subscribed, "everything+demo://resource/dynamic/text/1");
    let updates = out["updates"].as_array().unwrap();
    assert!(!updates.is_empty(), "resources/updated arrives: {out}");
    assert!(updates.iter().all(|u| u == subscribed), "for the URI the client subscribed to: {updates:?}");

    // Two clients with the same request ids, at once: each sees only its own messages.
    let a = &out["collide"]["a"];
    let b = &out["collide"]["b"];
    assert_eq!(a["progress"].as_array().unwrap().len(), 2, "{a}");
    assert_eq!(b["progress"].as_array().unwrap().len(), 4, "{b}");
    assert!(a["progress"].as_array().unwrap().iter().all(|p| p["total"] == 2.0), "{a}");
    assert!(b["progress"].as_array().unwrap().iter().all(|p| p["total"] == 4.0), "{b}");
    assert_eq!(a["echo"][0], "Echo: client-a");
    assert_eq!(b["echo"][0], "Echo: client-b");
    router.stop().await;
}

/// server-everything killed and restarted mid-session: the next call succeeds
/// without the client re-initialising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_restarted_mid_session_is_reinitialised() {
    use switchboard_test_support::peers::everything;
    use switchboard_test_support::Client;
    let (mut everything_process, port) = everything("streamableHttp", 0).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let router = start_router(&http_upstream("everything", &url, "list_timeout = \"20s\"")).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let first = client.call_tool("everything__echo", json!({"message": "before"})).await;
    assert_eq!(first["result"]["content"][0]["text"], "Echo: before");

    everything_process.child.kill().await.unwrap();
    let _ = everything_process.child.wait().await;
    // Restarted on the same port (the router's configuration names it).
    let _restarted = everything("streamableHttp", port).await;

    let second = client.call_tool("everything__echo", json!({"message": "after"})).await;
    assert_eq!(second["result"]["content"][0]["text"], "Echo: after", "{second}");
    assert!(router.metric("switchboard_upstream_reinitializations_total", &["upstream=\"everything\""]).await >= 1.0);
    router.stop().await;
}

/// The same relaying with server-everything behind the router over legacy
/// HTTP+SSE and over stdio; and the same SSE endpoint configured as
/// `transport = "http"`, found to be legacy HTTP+SSE by the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaying_over_legacy_sse_and_stdio_upstreams() {
    use switchboard_test_support::peers::everything_sse;
    let (_everything, sse_url) = everything_sse().await;
    let upstreams = format!(
        "[[upstreams]]\nname = \"legacy\"\ntransport = \"sse\"\nurl = \"{sse_url}\"\ntimeout = \"30s\"\nlist_timeout = \"20s\"\n\
         [[upstreams]]\nname = \"detected\"\ntransport = \"http\"\nurl = \"{sse_url}\"\ntimeout = \"30s\"\nlist_timeout = \"20s\"\n{}",
        stdio_upstream("local", &node_bin("mcp-server-everything"), &[])
    );
    let router = start_router(&upstreams).await;
    for prefix in ["legacy__", "detected__", "local__"] {
        let out =
            run_python_client("fidelity.py", &[&router.url, prefix, "progress,sampling,elicitation,subscribe"]).await;
        assert_eq!(out["progress"]["progress"].as_array().unwrap().len(), 3, "{prefix}: {out}");
        assert!(out["sampling"].to_string().contains("four"), "{prefix}: {out}");
        assert!(out["elicitation"].to_string().to_lowercase().contains("decline"), "{prefix}: {out}");
        let subscribed = out["subscribed"].as_str().unwrap();
        let updates = out["updates"].as_array().unwrap();
        assert!(!updates.is_empty() && updates.iter().all(|u| u == subscribed), "{prefix}: {out}");
    }
    // Stateless clients of one tenant share one upstream session with it,
    // and a legacy HTTP+SSE upstream routes progress by token: two calls
    // at once with the same token each hear only their own progress.
    let stateless = switchboard_test_support::Stateless::new(&router.url, json!({}));
    let progress_of = |tag: &'static str| {
        let stateless = &stateless;
        async move {
            let params = json!({"name": "legacy__trigger-long-running-operation",
                "arguments": {"duration": 1, "steps": if tag == "a" { 3 } else { 5 }}, "_meta": {"progressToken": 1}});
            let (status, _, mut stream) = stateless.stream("tools/call", params).await;
            assert_eq!(status, http::StatusCode::OK, "{tag}");
            let mut seen = Vec::new();
            loop {
                let event = stream.next_event(Duration::from_secs(20)).await.expect("an event");
                let message: Value = serde_json::from_slice(&event.data).unwrap();
                if message["method"] == "notifications/progress" {
                    assert_eq!(message["params"]["progressToken"], 1, "{tag}: the client's own token");
                    seen.push(message["params"]["total"].as_f64().unwrap_or_default());
                } else {
                    assert_eq!(message["result"]["resultType"], "complete", "{tag}: {message}");
                    return seen;
                }
            }
        }
    };
    let (a, b) = tokio::join!(progress_of("a"), progress_of("b"));
    assert!(a.len() == 3 && a.iter().all(|t| *t == 3.0), "call a heard only its own progress: {a:?}");
    assert!(b.len() == 5 && b.iter().all(|t| *t == 5.0), "call b heard only its own progress: {b:?}");
    for (upstream, era, expected) in [
        ("legacy", "2024-11-05", 1.0),
        ("legacy", "2025", 0.0),
        ("detected", "2024-11-05", 1.0),
        ("detected", "2025", 0.0),
        ("local", "2025", 1.0),
    ] {
        let labels = [format!("upstream=\"{upstream}\""), format!("era=\"{era}\"")];
        let found = router.metric("switchboard_upstream_era", &[&labels[0], &labels[1]]).await;
        assert_eq!(found, expected, "switchboard_upstream_era{{{},{}}}", labels[0], labels[1]);
    }
    router.stop().await;
}

/// A client that speaks only legacy HTTP+SSE (the Python SDK's `sse_client`)
/// uses the router's `/sse` endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_sse_client_through_the_router() {
    use switchboard_test_support::{mock_named, MockServer};
    let web = MockServer::start(mock_named("web")).await;
    let router = start_router(&http_upstream("web", &web.url, "")).await;
    let sse_url = router.path("/sse");
    let calls = json!([["web__echo", {"legacy": true}], ["web__progress", {"steps": 3}]]);
    let out = run_python_client("legacy_client.py", &[&sse_url, &calls.to_string()]).await;
    assert!(names(&out).contains(&"web__echo"));
    assert_eq!(out["results"][0]["content"][0]["text"], r#"{"legacy":true}"#);
    assert_eq!(out["results"][1]["content"][0]["text"], "done after 3 steps");
    assert_eq!(out["progress"], json!([1.0, 2.0, 3.0]), "progress reaches a legacy client too");
    router.stop().await;
}

/// The Python SDK with an API key (sent by its HTTP client) sees only its
/// tenant's catalog: server-everything for one tenant, mcp-server-time for
/// the other, through one router backed by PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_with_a_tenant_key_sees_only_its_catalog() {
    use switchboard_test_support::services::{unique, TempDatabase};
    let pg = TempDatabase::create().await;
    let (_everything, url) = everything_http().await;
    let time = python_script("mcp-server-time");
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    let config = format!(
        "[auth]\nmode = \"keys\"\n[database]\nurl = \"{}\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{}\"\n\
         [[tenants]]\nname = \"everyone\"\nupstreams = [\"everything\"]\n\
         [[tenants]]\nname = \"timely\"\nupstreams = [\"time\"]\n{}{}",
        pg.url,
        spool.display(),
        http_upstream("everything", &url, "list_timeout = \"20s\""),
        stdio_upstream("time", &time, &["--local-timezone", "UTC"]),
    );
    let db = switchboard_db::Database::connect(&pg.url, std::time::Duration::from_secs(3)).unwrap();
    db.migrate().await.unwrap();
    let admin = switchboard_router::admin::Admin::new(db, &switchboard_router::Config::from_toml(&config).unwrap());
    let key_everyone = admin.create_key("everyone", None).await.unwrap().key;
    let key_timely = admin.create_key("timely", None).await.unwrap().key;
    let router = start_router(&config).await;

    let target = |key: &str| json!({"url": router.url, "key": key}).to_string();
    let calls = json!([["everything__echo", {"message": "hi"}]]);
    let everyone = run_python_client("list_and_call.py", &[&target(&key_everyone), &calls.to_string()]).await;
    let tools = names(&everyone);
    assert!(tools.contains(&"everything__echo") && tools.iter().all(|t| t.starts_with("everything__")), "{tools:?}");
    assert_eq!(everyone["results"][0]["content"][0]["text"], "Echo: hi");

    let calls = json!([["time__get_current_time", {"timezone": "UTC"}]]);
    let timely = run_python_client("list_and_call.py", &[&target(&key_timely), &calls.to_string()]).await;
    let tools = names(&timely);
    assert!(tools.contains(&"time__get_current_time") && tools.iter().all(|t| t.starts_with("time__")), "{tools:?}");
    assert!(timely["results"][0]["content"][0]["text"].as_str().unwrap().contains("UTC"), "{timely}");
    router.stop().await;
    pg.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_in_both_eras_against_a_2025_upstream_and_a_2026_upstream() {
    let (_everything, everything_url) = everything_http().await;
    let (_dual, dual_url) = dual_era_http().await;
    let router = start_router(&format!(
        "{}{}",
        http_upstream("everything", &everything_url, "list_timeout = \"20s\""),
        http_upstream("dual", &dual_url, "list_timeout = \"20s\"")
    ))
    .await;
    // Each run checks every answer (texts, progress counts, one sampling and
    // one elicitation callback each) and fails otherwise.
    for mode in ["2026-07-28", "auto", "legacy"] {
        for (flavour, prefix) in [("everything", "everything__"), ("dual", "dual__")] {
            let out = run_python_client("modern_client.py", &[&router.url, mode, flavour, prefix]).await;
            assert_eq!(out["ok"], true, "{mode} {flavour}: {out}");
            let modern = mode != "legacy";
            assert_eq!(out["connect"]["modern"], modern, "{mode} {flavour}: the era used: {}", out["connect"]);
            let expected = if modern { "2026-07-28" } else { "2025-11-25" };
            assert_eq!(out["connect"]["protocol_version"], expected, "{mode} {flavour}");
            assert_eq!(out["callbacks"], json!({"sampling": 1, "elicitation": 1}), "{mode} {flavour}");
        }
    }
    // The router tells the 2026-07-28 upstream apart by asking it.
    let metrics = switchboard_test_support::get_text(&router.path("/metrics")).await;
    assert!(metrics.contains("switchboard_upstream_era{era=\"2026-07-28\",upstream=\"dual\"} 1"), "{metrics}");
    assert!(metrics.contains("switchboard_upstream_era{era=\"2025\",upstream=\"everything\"} 1"));
}
