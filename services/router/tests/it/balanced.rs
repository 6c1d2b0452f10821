//! Two router replicas behind a real round-robin load balancer (Debian's
//! nginx, `proxy_buffering off`, no stickiness: each request to whichever
//! replica is next), driven by the official Python SDK as users drive it
//! (`tests/peers/balanced.py`). What works against one replica works
//! through the balancer, with exactly one upstream session per client
//! session (counted by a logging nginx in front of the upstream); a call
//! whose replica is killed is answered through the other; Redis restarting
//! empty mid-run costs no call.
//!
//! Needs nginx and `scripts/install-peers` (run by `scripts/test`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use switchboard_test_support::peers::{everything_http, python, scripts_dir, Process};
use switchboard_test_support::services::{redis_url, unique, PrivateRedis};
use switchboard_test_support::{get_text, router_binary, MockOptions, MockServer};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A port nothing listens on now (nginx binds it after; a clash is retried).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// nginx in front of the routers, round robin; and, with `tap`, a second
/// server in front of the upstream (`tap.1`) logging each request's method,
/// its `Mcp-Session-Id` and body (JSON lines in `tap.log`).
struct Balancer {
    _nginx: Process,
    url: String,
    dir: PathBuf,
}

impl Balancer {
    async fn start(routers: &[u16], tap: Option<(u16, u16)>) -> Balancer {
        let dir = std::env::temp_dir().join(unique("sb-balancer-"));
        std::fs::create_dir_all(&dir).unwrap();
        for _ in 0..5 {
            let listen = free_port();
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&dir, listen, routers, tap)).unwrap();
            let nginx = Process::spawn(Path::new("nginx"), &["-c", conf.to_str().unwrap()], &[]);
            let up = switchboard_test_support::eventually(Duration::from_secs(10), || async {
                tokio::net::TcpStream::connect(("127.0.0.1", listen)).await.is_ok()
                    && tap.is_none_or(|(port, _)| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
            })
            .await;
            if up {
                return Balancer { _nginx: nginx, url: format!("http://127.0.0.1:{listen}/mcp"), dir };
            }
        }
        panic!("nginx did not start: {}", std::fs::read_to_string(dir.join("error.log")).unwrap_or_default());
    }

    /// What the tap logged so far: (the `Mcp-Session-Id` sent upstream,
    /// the JSON-RPC method of the body, if any), per request.
    fn tapped(&self) -> Vec<(String, Option<String>)> {
        let text = std::fs::read_to_string(self.dir.join("tap.log")).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|entry| {
                let body: Option<Value> = entry["body"].as_str().and_then(|b| serde_json::from_str(b).ok());
                let method = body.and_then(|b| b["method"].as_str().map(str::to_owned));
                (entry["sid"].as_str().unwrap_or_default().to_owned(), method)
            })
            .collect()
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nginx_conf(dir: &Path, listen: u16, routers: &[u16], tap: Option<(u16, u16)>) -> String {
    let d = dir.display();
    let servers: String =
        routers.iter().map(|p| format!("server 127.0.0.1:{p} max_fails=1 fail_timeout=30s; ")).collect();
    let tap = match tap {
        Some((listen, upstream)) => format!(
            "server {{ listen 127.0.0.1:{listen}; access_log {d}/tap.log tap;
               location / {{ proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1;
                 proxy_set_header Connection \"\"; proxy_buffering off; proxy_read_timeout 300s; }} }}"
        ),
        None => String::new(),
    };
    format!(
        // One process (no master): the test's kill ends nginx whole, where
        // a master killed alone leaves its worker running.
        "master_process off; daemon off; pid {d}/nginx.pid; error_log {d}/error.log warn;
         events {{ worker_connections 1024; }}
         http {{
           access_log off;
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
           client_body_buffer_size 1m;
           log_format tap escape=json '{{\"m\":\"$request_method\",\"s\":\"$status\",\"sid\":\"$http_mcp_session_id\",\"body\":\"$request_body\"}}';
           upstream routers {{ {servers} }}
           server {{ listen 127.0.0.1:{listen};
             location / {{ proxy_pass http://routers; proxy_http_version 1.1; proxy_set_header Connection \"\";
               proxy_buffering off; proxy_read_timeout 300s; proxy_next_upstream error timeout; }} }}
           {tap}
         }}"
    )
}

/// A router process with `config` (TOML), and its port.
async fn router(config: &str, dir: &Path, name: &str) -> (Process, u16) {
    let file = dir.join(format!("{name}.toml"));
    let text = format!(
        "[auth]\nmode = \"none\"\n[database]\nurl = \"\"\n[egress]\nallow = [\"loopback\"]\n[log]\nlevel = \"warn,switchboard_router::server=info\"\n{config}"
    );
    std::fs::write(&file, text).unwrap();
    let (process, addr) = Process::spawn_announced(
        &router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    (process, addr.port())
}

fn replica_config(redis: &str, prefix: &str, upstream: &str, url: &str) -> String {
    format!(
        "[sessions]\nstore = \"redis\"\n[redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\ntimeout = \"500ms\"\n\
         [catalog]\nretry_after = \"250ms\"\n\
         [[upstreams]]\nname = \"{upstream}\"\ntransport = \"http\"\nurl = \"{url}\"\nlist_timeout = \"20s\"\n"
    )
}

/// `balanced.py URL MODE`, running: its `MARK` lines arrive on `marks`,
/// and `done` gives the JSON it printed last.
struct Run {
    marks: tokio::sync::mpsc::UnboundedReceiver<()>,
    done: tokio::task::JoinHandle<Value>,
}

impl Run {
    fn start(url: &str, mode: &str) -> Run {
        let mut child = tokio::process::Command::new(python())
            .arg(scripts_dir().join("balanced.py"))
            .args([url, mode])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python");
        let (tx, marks) = tokio::sync::mpsc::unbounded_channel();
        let mode = mode.to_owned();
        let done = tokio::spawn(async move {
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut last = None;
            let reading = async {
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.starts_with("MARK") {
                        let _ = tx.send(());
                    } else if line.starts_with('{') {
                        last = Some(line);
                    }
                }
            };
            tokio::time::timeout(Duration::from_secs(180), reading).await.expect("the SDK run ends within 3 minutes");
            let status = child.wait().await.unwrap();
            let mut stderr = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).await.unwrap();
            assert!(status.success(), "balanced.py {mode} failed: {stderr}");
            serde_json::from_str(&last.unwrap_or_else(|| panic!("no JSON from balanced.py: {stderr}"))).unwrap()
        });
        Run { marks, done }
    }

    /// Waits for the next `MARK`.
    async fn mark(&mut self) {
        tokio::time::timeout(Duration::from_secs(60), self.marks.recv())
            .await
            .expect("a MARK within a minute")
            .expect("the run goes on to its MARK");
    }

    async fn output(self) -> Value {
        self.done.await.expect("the run")
    }
}

async fn metric(port: u16, name: &str, labels: &[&str]) -> f64 {
    let text = get_text(&format!("http://127.0.0.1:{port}/metrics")).await;
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The upstream sessions (their ids) that carried a `tools/call`.
fn calling_sessions(tapped: &[(String, Option<String>)]) -> BTreeSet<String> {
    tapped.iter().filter(|(_, m)| m.as_deref() == Some("tools/call")).map(|(sid, _)| sid.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_through_a_round_robin_balancer_gets_what_one_replica_gives() {
    let (_everything, everything_url) = everything_http().await;
    let upstream_port: u16 = everything_url.rsplit(':').next().unwrap().trim_end_matches("/mcp").parse().unwrap();
    let dir = std::env::temp_dir().join(unique("sb-replicas-"));
    std::fs::create_dir_all(&dir).unwrap();
    let tap_port = free_port();
    let config =
        replica_config(&redis_url(), &unique("sbtest:"), "everything", &format!("http://127.0.0.1:{tap_port}/mcp"));
    let ((_a, a), (_b, b)) = tokio::join!(router(&config, &dir, "a"), router(&config, &dir, "b"));
    let balancer = Balancer::start(&[a, b], Some((tap_port, upstream_port))).await;

    let balanced = Run::start(&balancer.url, "everything").output().await;
    let calling = calling_sessions(&balancer.tapped());
    assert_eq!(calling.len(), 1, "one upstream session for the client's session: {calling:?}");
    for port in [a, b] {
        let calls = metric(port, "switchboard_requests_total", &["method=\"tools/call\""]).await;
        assert!(calls >= 5.0, "each replica served the session's calls ({calls} at {port})");
    }
    // The same, straight at one replica.
    let direct = Run::start(&format!("http://127.0.0.1:{a}/mcp"), "everything").output().await;
    assert_eq!(calling_sessions(&balancer.tapped()).len(), 2, "and one for that session");

    assert!(balanced["tools"].as_array().unwrap().len() >= 10, "{balanced}");
    for field in ["tools", "echoes", "progress", "sampling", "elicitation", "logged", "updated"] {
        assert_eq!(balanced[field], direct[field], "{field}: through the balancer as against one replica");
    }
    assert_eq!(balanced["echoes"][19], "Echo: m19");
    assert_eq!(balanced["progress"]["seen"].as_array().unwrap().len(), 4, "{balanced}");
    assert!(balanced["sampling"][0].as_str().unwrap().contains("four"), "{balanced}");
    assert_eq!(balanced["logged"], true, "log messages on the GET stream: {balanced}");
    assert_eq!(balanced["updated"], true, "resource updates: {balanced}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_replica_is_killed_behind_the_balancer_is_answered_through_the_other() {
    let web =
        MockServer::start(MockOptions { name: "web".into(), resumable_streams: true, ..MockOptions::default() }).await;
    let dir = std::env::temp_dir().join(unique("sb-replicas-"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = replica_config(&redis_url(), &unique("sbtest:"), "web", &web.url);
    let ((a_process, a), (b_process, b)) = tokio::join!(router(&config, &dir, "a"), router(&config, &dir, "b"));
    let balancer = Balancer::start(&[a, b], None).await;
    let mut replicas = BTreeMap::from([(a, a_process), (b, b_process)]);
    let mut run = Run::start(&balancer.url, "kill");
    run.mark().await;
    // The replica relaying the call dies (kill -9), mid-call.
    let mut killed = None;
    for (port, process) in replicas.iter_mut() {
        if metric(*port, "switchboard_requests_in_flight", &[]).await >= 1.0 {
            process.child.start_kill().unwrap();
            process.child.wait().await.unwrap();
            killed = Some(*port);
            break;
        }
    }
    let out = run.output().await;
    let killed = killed.expect("a replica was relaying the call when it was killed");
    let survivor = if killed == a { b } else { a };
    assert_eq!(out["text"][0], "done after 8 steps", "the answer, through the survivor: {out}");
    assert_eq!(out["is_error"], false);
    let seen: Vec<u64> =
        out["progress"].as_array().unwrap().iter().filter_map(Value::as_f64).map(|p| p as u64).collect();
    assert_eq!(seen.last(), Some(&8), "progress to the end: {seen:?}");
    assert_eq!(metric(survivor, "switchboard_streams_taken_over_total", &["result=\"resumed\""]).await, 1.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Behind a round-robin balancer both replicas soon hold the session, so
/// this run shows the whole path holding up (both replicas serving from
/// their copies, then writing them back); a replica asked for a session
/// only the other holds, right after the restart, is
/// `scale_out::agreement::after_redis_restarts_empty_no_live_session_is_answered_404_at_any_replica`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarting_empty_behind_the_balancer_costs_no_call() {
    let mut redis = PrivateRedis::start();
    let web = MockServer::start(switchboard_test_support::mock_named("web")).await;
    let dir = std::env::temp_dir().join(unique("sb-replicas-"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = replica_config(&redis.url, "sb:", "web", &web.url);
    let ((_a, a), (_b, b)) = tokio::join!(router(&config, &dir, "a"), router(&config, &dir, "b"));
    let balancer = Balancer::start(&[a, b], None).await;

    let mut run = Run::start(&balancer.url, "loop");
    run.mark().await;
    redis.stop();
    redis.resume();
    let out = run.output().await;
    assert_eq!(out["failures"], Value::Array(vec![]), "no call of the live session failed: {out}");
    assert!(out["calls"].as_u64().unwrap() >= 40, "{out}");
    let lost = metric(a, "switchboard_session_store_lost_total", &[]).await
        + metric(b, "switchboard_session_store_lost_total", &[]).await;
    assert!(lost >= 1.0, "the replicas noticed Redis had lost everything");
    let _ = std::fs::remove_dir_all(&dir);
}
