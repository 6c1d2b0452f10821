//! Real peers through the router: the official Python SDK client (`mcp` 2.x,
//! `mode="legacy"`) against `@modelcontextprotocol/server-everything` (over
//! Streamable HTTP and over stdio) and `mcp-server-time` (stdio). Each result
//! through the router is compared with the same call made directly.
//!
//! Needs `scripts/install-peers` (run by `scripts/test`).

use serde_json::{json, Value};
use switchboard_test_support::peers::{everything_http, node_bin, python_script, run_python_client};
use switchboard_test_support::{http_upstream, Router};

fn stdio_upstream(name: &str, command: &std::path::Path, args: &[&str]) -> String {
    format!(
        "[[upstreams]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = {}\n",
        command.display(),
        serde_json::to_string(args).unwrap()
    )
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
    let router = Router::start(&format!(
        "{}{}",
        http_upstream("everything", &everything_url, ""),
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

    // The same list as the upstreams give directly, only namespaced.
    let mut expected: Vec<String> = names(&direct_everything).iter().map(|n| format!("everything__{n}")).collect();
    let direct_time_list = names(&direct_time).iter().map(|n| format!("time__{n}")).collect::<Vec<_>>();
    expected.extend(direct_time_list);
    let mut got: Vec<String> = tools.iter().map(|s| s.to_string()).collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_through_the_router_to_everything_over_stdio() {
    let everything = node_bin("mcp-server-everything");
    let router = Router::start(&stdio_upstream("everything", &everything, &[])).await;
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
        Router::start(&format!("{}{}", http_upstream("web", &web.url, ""), stdio_mock_upstream("local", ""))).await;
    let bridge = stdio_target(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchboard")),
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
