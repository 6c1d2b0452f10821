//! Protocol eras bridged both ways, with the official SDK clients (Python
//! `mcp` 2.x and TypeScript `@modelcontextprotocol/client` 2.x) in each of
//! their modes: `auto` (which finds that the router speaks 2026-07-28),
//! `legacy` (sessions) and `2026-07-28`, at the router's URL and through
//! `switchboard connect` (stdio), against session-era upstreams (over
//! stdio: `mcp-server-time`, which refuses the stateless era's `_meta`).
//!
//! Needs `scripts/install-peers` (run by `scripts/test`).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_test_support::peers::{node_bin, python_script, run_sdk_client, Sdk};
use switchboard_test_support::{router_binary, Client, Router};

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

/// Answers every `roots/list` that arrives on `stream` with `root`.
fn answer_roots(client: Client, mut stream: switchboard_test_support::EventStream, root: String) {
    tokio::spawn(async move {
        while let Some(message) = stream.next(Duration::from_secs(60)).await {
            if message["method"] == "roots/list" {
                let answer = json!({"jsonrpc": "2.0", "id": message["id"],
                    "result": {"roots": [{"uri": format!("file://{root}"), "name": "work"}]}});
                let status = client.post(answer).await.status;
                assert_eq!(status, StatusCode::ACCEPTED, "the answer to roots/list");
            }
        }
    });
}

/// The text of a tool result, or its error's.
fn result_text(response: &Value) -> String {
    let text = response["result"]["content"][0]["text"].as_str();
    text.map(str::to_owned).unwrap_or_else(|| response.to_string())
}

/// `mcp-server-filesystem` run per client session: each process is
/// initialised with its client's capabilities, asks that client for its
/// roots, and serves exactly those; a bound on processes, and idle ones
/// reaped (and restarted on the next request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_session_stdio_upstream_honours_each_clients_roots() {
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-roots-"));
    let (base, root_a, root_b) = (dir.join("base"), dir.join("a"), dir.join("b"));
    for (d, file) in [(&base, "base.txt"), (&root_a, "a.txt"), (&root_b, "b.txt")] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join(file), format!("this is {file}")).unwrap();
    }
    let files = node_bin("mcp-server-filesystem");
    let router = Router::start(&format!(
        "[catalog]\nretry_after = \"250ms\"\n{}per_session = true\nmax_processes = 3\nidle_timeout = \"5s\"\n",
        stdio_upstream("files", &files, &[base.to_str().unwrap()])
    ))
    .await;
    let processes = || async { router.metric("switchboard_upstream_processes", &["upstream=\"files\""]).await };

    // Two clients with different roots, each answering its own process's roots/list.
    let mut clients = Vec::new();
    for root in [&root_a, &root_b] {
        let mut client = Client::new(&router.url);
        client.initialize_with(json!({"roots": {"listChanged": true}})).await;
        let stream = client.open_stream().await;
        answer_roots(client.clone(), stream, root.to_str().unwrap().to_owned());
        clients.push(client);
    }
    let read = |client: &Client, path: std::path::PathBuf| {
        let client = client.clone();
        async move { result_text(&client.call_tool("files__read_text_file", json!({"path": path.to_str().unwrap()})).await) }
    };
    // The process asks for roots once initialised; a read may come first.
    for (client, mine) in clients.iter().zip([root_a.join("a.txt"), root_b.join("b.txt")]) {
        let name = mine.file_name().unwrap().to_str().unwrap().to_owned();
        let ok = switchboard_test_support::eventually(Duration::from_secs(30), || {
            let (read, mine, name) = (&read, mine.clone(), name.clone());
            async move { read(client, mine).await == format!("this is {name}") }
        })
        .await;
        assert!(ok, "{name} is readable by the client whose root holds it");
    }
    // Each client's process serves its roots only: not the other's, nor the command line's.
    assert!(read(&clients[0], root_b.join("b.txt")).await.contains("denied"), "a cannot read b's root");
    assert!(read(&clients[1], root_a.join("a.txt")).await.contains("denied"), "b cannot read a's root");
    assert!(read(&clients[0], base.join("base.txt")).await.contains("denied"), "roots replace the arguments");

    // The catalog's process and two sessions': the bound (3) is reached.
    assert_eq!(processes().await, 3.0);
    let mut third = Client::new(&router.url);
    third.initialize_with(json!({"roots": {}})).await;
    let refused = third.call_tool("files__list_allowed_directories", json!({})).await;
    assert!(result_text(&refused).contains("max_processes"), "{refused}");
    assert_eq!(router.metric("switchboard_upstream_process_refusals_total", &[]).await, 1.0);
    // A session that ends gives its process back.
    assert_eq!(clients.pop().unwrap().delete().await, StatusCode::OK);
    assert!(switchboard_test_support::eventually(Duration::from_secs(10), || async { processes().await == 2.0 }).await);
    // Idle processes are reaped (5 s), and started again on the next request.
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(20), || async { processes().await == 0.0 }).await,
        "idle processes reaped"
    );
    let again = switchboard_test_support::eventually(Duration::from_secs(30), || {
        let read = &read;
        let (client, path) = (&clients[0], root_a.join("a.txt"));
        async move { read(client, path).await == "this is a.txt" }
    })
    .await;
    assert!(again, "a reaped session's process starts again, with its roots");
    router.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
