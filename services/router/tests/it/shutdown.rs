//! Shutdown and stdio children's lifecycle, as docs/operations.md describes
//! them: the drain with the memory session store, the order in which a
//! child is stopped, and the backoff with which one is restarted.

use std::path::Path;
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_test_support::{
    eventually, get_text, http_upstream, mock_named, try_get_text_with, Client, MockServer, Router,
};

fn text_of(response: &Value) -> &str {
    response["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {response}"))
}

/// While a call is in flight, a router told to stop drains: `/readyz` says
/// 503, GET streams end, a new session gets 503 with `Retry-After`, a request
/// of an existing session is still served, the call in flight gets its
/// answer; then every upstream session the router opened is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_router_refuses_new_sessions_finishes_calls_then_ends_upstream_sessions() {
    let web = MockServer::start(mock_named("web")).await;
    let mut router = Router::start(&http_upstream("web", &web.url, "")).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    client.call_tool("web__echo", json!({})).await;
    let mut stream = client.open_stream().await;
    assert_eq!(get_text(&router.path("/readyz")).await, "ready\n");
    assert!(web.mock.live_sessions() >= 2, "the router's own session and the client's");

    let calls_before = web.mock.call_count();
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("web__sleep", json!({"ms": 1500})).await })
    };
    assert!(eventually(Duration::from_secs(10), || async { web.mock.call_count() > calls_before }).await);
    router.begin_stop();

    // A connection opened at the very moment the drain begins may be closed
    // before its request is read (hyper's graceful shutdown of an idle
    // connection, as any server's): a prober asks again.
    assert!(
        eventually(Duration::from_secs(5), || async {
            try_get_text_with(&router.path("/readyz"), &[]).await.is_ok_and(|t| t == "shutting down\n")
        })
        .await,
        "/readyz says 503 while draining"
    );
    stream.until_end(Duration::from_secs(5)).await.expect("the GET stream ends");
    let fresh = Client::new(&router.url);
    let refused = fresh
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "late", "version": "0"}}}))
        .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", String::from_utf8_lossy(&refused.body));
    assert!(refused.headers.contains_key("retry-after"), "{:?}", refused.headers);
    assert!(refused.json()["error"]["message"].is_string());
    let served = client.call_tool("web__echo", json!({"during": "drain"})).await;
    assert_eq!(text_of(&served), r#"{"during":"drain"}"#, "an existing session is still served: {served}");

    let finished = slow.await.unwrap();
    assert_eq!(text_of(&finished), "slept 1500 ms", "the call in flight got its answer");
    router.stop().await;
    assert_eq!(web.mock.live_sessions(), 0, "every upstream session the router opened was deleted");
}

/// A log line per event, with the time in ms: what a child script saw.
fn events(log: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (what, at) = l.split_once(' ')?;
            Some((what.to_owned(), at.trim().parse::<u64>().ok()? / 1_000_000))
        })
        .collect()
}

/// A stdio upstream that is a shell script writing what happens to it in
/// `log` (its first argument).
fn script_upstream(name: &str, script: &str, log: &Path, extra: &str) -> String {
    let file = log.with_extension("sh");
    std::fs::write(&file, script).unwrap();
    format!(
        "[[upstreams]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"/bin/sh\"\n\
         args = [\"{}\", \"{}\"]\n{extra}\n",
        file.display(),
        log.display()
    )
}

/// An MCP server in shell: answers `initialize`, and every other request
/// with empty lists, until its stdin ends; then it notes `eof` and stays,
/// noting SIGTERM but not leaving for it.
const STUBBORN: &str = r#"log=$1
trap 'echo term $(date +%s%N) >> "$log"' TERM
echo started $(date +%s%N) >> "$log"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([^,}]*\).*/\1/p')
  [ -n "$id" ] || continue
  case "$line" in
    *'"method":"initialize"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"stub","version":"0"}}}\n' "$id" ;;
    *'"method"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[],"resources":[],"resourceTemplates":[],"prompts":[]}}\n' "$id" ;;
  esac
done
echo eof $(date +%s%N) >> "$log"
while :; do sleep 0.05; done
"#;

/// On shutdown a stdio child's stdin is closed first; a child that stays is
/// sent SIGTERM `shutdown_grace` later, and one that ignores that is killed
/// `shutdown_grace` after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_child_is_stopped_by_closing_stdin_then_sigterm_then_sigkill() {
    let log = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-child-")).with_extension("log");
    let config = script_upstream("stubborn", STUBBORN, &log, "shutdown_grace = \"300ms\"");
    let router = Router::start(&config).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            router.metric("switchboard_upstream_up", &["upstream=\"stubborn\""]).await == 1.0
        })
        .await,
        "the child started and answered initialize"
    );
    let stopping = std::time::Instant::now();
    router.stop().await;
    let took = stopping.elapsed();
    let seen = events(&log);
    let names: Vec<&str> = seen.iter().map(|(what, _)| what.as_str()).collect();
    assert_eq!(names, ["started", "eof", "term"], "stdin closed, then SIGTERM: {seen:?}");
    let gap = seen[2].1.saturating_sub(seen[1].1);
    assert!(gap >= 250, "SIGTERM came shutdown_grace (300 ms) after stdin closed, not {gap} ms");
    assert!(took >= Duration::from_millis(550), "SIGKILL came a second grace later: stop took {took:?}");
    // Killed: nothing runs the script any more.
    let marker = log.display().to_string();
    let running = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .any(|cmd| String::from_utf8_lossy(&cmd).contains(&marker))
    };
    assert!(!running(), "the child was killed");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("sh"));
}

/// A child that keeps exiting is restarted after 250 ms, then after twice
/// as long each time, up to `restart_max_backoff`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exiting_stdio_child_is_restarted_with_doubling_backoff_up_to_the_cap() {
    let log = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-crash-")).with_extension("log");
    let script = r#"echo started $(date +%s%N) >> "$1"; exit 3"#;
    let config = script_upstream("crashy", script, &log, "restart_max_backoff = \"500ms\"");
    let router = Router::start(&config).await;
    assert!(
        eventually(Duration::from_secs(20), || async { events(&log).len() >= 6 }).await,
        "restarted again and again: {:?}",
        events(&log)
    );
    router.stop().await;
    let starts: Vec<u64> = events(&log).iter().map(|(_, at)| *at).collect();
    let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    // Waits of 250, 500, 500, 500 ms (the cap), each plus the time to start
    // a shell. Lower bounds hold on any machine; the upper bound only tells
    // the capped wait (500 ms) from an uncapped one (1000, then 2000 ms).
    assert!(gaps[0] >= 240 && gaps[1] >= 490 && gaps[2] >= 490 && gaps[3] >= 490, "{gaps:?}");
    assert!(gaps[1] > gaps[0], "the wait grows: {gaps:?}");
    assert!(gaps[3] < 1500, "capped at restart_max_backoff (500 ms): {gaps:?}");
    assert!(router_restarts_counted(&config).await);
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("sh"));
}

/// `switchboard_upstream_restarts_total` counts restarts (checked on a
/// router of its own, which may not have restarted yet: at least one).
async fn router_restarts_counted(config: &str) -> bool {
    let router = Router::start(config).await;
    let counted = eventually(Duration::from_secs(10), || async {
        router.metric("switchboard_upstream_restarts_total", &["upstream=\"crashy\""]).await >= 1.0
    })
    .await;
    router.stop().await;
    counted
}
