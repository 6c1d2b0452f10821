//! Real peers: the official Python SDK, `@modelcontextprotocol/server-everything`,
//! `mcp-server-time`. `scripts/install-peers` puts them in the tools
//! directory (`$SWITCHBOARD_TOOLS`, default `~/.cache/switchboard/tools`);
//! tests that need them fail with instructions if they are missing.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Where `scripts/install-peers` installs the real peers.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SWITCHBOARD_TOOLS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache/switchboard/tools")
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-peers (scripts/test does) to install the real MCP peers",
        path.display()
    );
    path
}

/// The Python with the `mcp` SDK and `mcp-server-time` installed.
pub fn python() -> PathBuf {
    require(tools_dir().join("venv/bin/python"))
}

/// A console script installed in the Python environment.
pub fn python_script(name: &str) -> PathBuf {
    require(tools_dir().join("venv/bin").join(name))
}

/// An npm package binary (`mcp-server-everything`).
pub fn node_bin(name: &str) -> PathBuf {
    require(tools_dir().join("npm/node_modules/.bin").join(name))
}

/// The directory of this repository's Python test clients.
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../router/tests/peers")
}

/// A free TCP port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Waits until something listens on `port`.
pub async fn wait_for_port(port: u16, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A child process killed when dropped.
pub struct Process {
    pub child: Child,
}

impl Process {
    /// Starts `program` with `args` and extra environment; output is inherited
    /// only when `SWITCHBOARD_TEST_VERBOSE` is set.
    pub fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Process {
        let verbose = std::env::var_os("SWITCHBOARD_TEST_VERBOSE").is_some();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(if verbose { Stdio::inherit() } else { Stdio::null() })
            .stderr(if verbose { Stdio::inherit() } else { Stdio::null() })
            .kill_on_drop(true);
        Process { child: cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", program.display())) }
    }
}

/// `@modelcontextprotocol/server-everything` over Streamable HTTP on a free port.
/// Returns the process and its `/mcp` URL.
pub async fn everything_http() -> (Process, String) {
    let port = free_port();
    let process =
        Process::spawn(&node_bin("mcp-server-everything"), &["streamableHttp"], &[("PORT", &port.to_string())]);
    assert!(wait_for_port(port, Duration::from_secs(30)).await, "server-everything did not start on port {port}");
    (process, format!("http://127.0.0.1:{port}/mcp"))
}

/// `@modelcontextprotocol/server-everything` over legacy HTTP+SSE on a free
/// port. Returns the process and its `/sse` URL.
pub async fn everything_sse() -> (Process, String) {
    let port = free_port();
    let process = Process::spawn(&node_bin("mcp-server-everything"), &["sse"], &[("PORT", &port.to_string())]);
    assert!(wait_for_port(port, Duration::from_secs(30)).await, "server-everything did not start on port {port}");
    (process, format!("http://127.0.0.1:{port}/sse"))
}

/// `dual_era_server.py` (the Python SDK's `MCPServer`, serving 2025 sessions
/// and 2026-07-28 stateless requests on one endpoint) on a free port.
/// Returns the process and its `/mcp` URL.
pub async fn dual_era_http() -> (Process, String) {
    let port = free_port();
    let script = scripts_dir().join("dual_era_server.py");
    let process = Process::spawn(&python(), &[script.to_str().expect("utf-8 path"), &port.to_string()], &[]);
    assert!(wait_for_port(port, Duration::from_secs(30)).await, "dual_era_server.py did not start on port {port}");
    (process, format!("http://127.0.0.1:{port}/mcp"))
}

/// Runs one of the Python test clients against `url` with arguments and
/// returns what it printed on stdout (it prints JSON), panicking with its
/// stderr if it failed.
pub async fn run_python_client(script: &str, args: &[&str]) -> serde_json::Value {
    let script = scripts_dir().join(script);
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(python()).arg(&script).args(args).stdin(Stdio::null()).output(),
    )
    .await
    .expect("the Python client finishes within 120 s")
    .expect("running python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} failed ({}):\n{stderr}\n{stdout}", script.display(), out.status);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON output:\n{stdout}\n{stderr}"));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("bad JSON output ({e}): {last}"))
}
