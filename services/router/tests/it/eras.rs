//! Protocol eras bridged both ways, with the official SDK clients (Python
//! `mcp` 2.x and TypeScript `@modelcontextprotocol/client` 2.x) in each of
//! their modes: `auto` (which finds that the router speaks 2026-07-28),
//! `legacy` (sessions) and `2026-07-28`, at the router's URL and through
//! `switchboard connect` (stdio), against session-era upstreams (over
//! stdio: `mcp-server-time`, which refuses the stateless era's `_meta`).
//!
//! Needs `scripts/install-peers` (run by `scripts/test`).

use std::sync::Arc;

use serde_json::{json, Value};
use switchboard_test_support::peers::{python_script, run_sdk_client, Sdk};
use switchboard_test_support::{router_binary, Router};

fn stdio_upstream(name: &str, command: &std::path::Path, args: &[&str]) -> String {
    format!(
        "[[upstreams]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = {}\nlist_timeout = \"20s\"\n",
        command.display(),
        serde_json::to_string(args).unwrap()
    )
}

const MODES: [&str; 3] = ["auto", "legacy", "2026-07-28"];

/// The era a client in `mode` should end up in with the router (which
/// speaks both, and answers `server/discover`).
fn expected_era(mode: &str) -> &'static str {
    if mode == "legacy" {
        "legacy"
    } else {
        "modern"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_clients_in_every_mode_call_a_stdio_session_era_upstream_directly_and_through_connect() {
    let time = python_script("mcp-server-time");
    let router = Router::start(&format!(
        "[catalog]\nretry_after = \"250ms\"\n{}",
        stdio_upstream("time", &time, &["--local-timezone", "UTC"])
    ))
    .await;
    let convert = json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"}).to_string();
    // The same call straight at the server, for what the result must be.
    let direct = run_sdk_client(
        Sdk::Python,
        &["--mode", "legacy", "--command", time.to_str().unwrap(), "--local-timezone", "UTC"]
            .into_iter()
            .chain(["--call", "convert_time", "--args", &convert])
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the call made directly");
    let bridge = router_binary();
    let bridge = bridge.to_str().unwrap();
    // Two cores: four clients at a time.
    let slots = Arc::new(tokio::sync::Semaphore::new(4));
    let mut runs = Vec::new();
    for sdk in [Sdk::Python, Sdk::TypeScript] {
        for mode in MODES {
            for via in ["url", "connect"] {
                let (slots, url, convert) = (slots.clone(), router.url.clone(), convert.clone());
                runs.push(async move {
                    let _slot = slots.acquire().await.unwrap();
                    let target: Vec<&str> = match via {
                        "url" => vec!["--url", &url],
                        _ => vec!["--command", bridge, "connect", &url],
                    };
                    let mut args = vec!["--mode", mode];
                    args.extend(target);
                    args.extend(["--call", "time__convert_time", "--args", &convert]);
                    ((sdk, mode, via), run_sdk_client(sdk, &args).await)
                });
            }
        }
    }
    let mut failures = Vec::new();
    for ((sdk, mode, via), outcome) in futures_util::future::join_all(runs).await {
        let what = format!("{sdk:?} mode={mode} via {via}");
        match outcome {
            Err(e) => failures.push(format!("{what}: {e}")),
            Ok(out) => {
                let tools: Vec<&str> = out["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
                if !tools.contains(&"time__convert_time") || !tools.contains(&"time__get_current_time") {
                    failures.push(format!("{what}: tools {tools:?}"));
                }
                if out["result"]["structuredContent"] != direct["result"]["structuredContent"] {
                    failures.push(format!("{what}: {} != {}", out["result"], direct["result"]));
                }
                if out["era"] != expected_era(mode) {
                    failures.push(format!("{what}: era {} (protocol {})", out["era"], out["protocolVersion"]));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of 12 failed:\n{}", failures.len(), failures.join("\n"));
    router.stop().await;
}
