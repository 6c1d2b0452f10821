//! Upstreams that run as child processes speaking newline-delimited JSON.
//!
//! One process per upstream, shared by every downstream session: each
//! session gets a *view* ([`Channel`](super::Channel)) of it. Because the
//! sessions share one JSON-RPC id space on the child's stdin, every request is
//! given a fresh numeric id (and its progress token the same number) on the
//! way in; responses and progress notifications get the originals back on the
//! way out.
//!
//! The supervisor starts the child, performs `initialize`, restarts it with
//! exponential backoff when it exits (failing the requests it had in flight),
//! and on shutdown closes its stdin, then sends SIGTERM, then SIGKILL. The
//! child's stderr is its log, forwarded to ours line by line.
//!
//! Subscriptions are counted across views: the child hears the first
//! `resources/subscribe` of a URI and the last `resources/unsubscribe` (also
//! when a session ends); the others are answered here.
//!
//! With `per_session`, each session has a process of its own
//! (`per_session.rs` runs them, one [`Transport`] each): it is initialised
//! with that client's hello, and what it sends outside a call goes to that
//! session. Messages a shared process sends outside any request cannot
//! always be tied to one session: list changes go to every view (the catalog de-duplicates),
//! resource updates to the views that subscribed, logging and server-to-client
//! requests to the one request in flight that could have caused them (a call,
//! not a list or the router's own handshake) when there is exactly one, and
//! are otherwise dropped (logging) or refused (requests) and counted.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use switchboard_protocol::jsonrpc::{self, as_str, span, Envelope, MessageKind, Target};
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::{ndjson, Method};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch, Notify};

use self::stdin::{write_stdin, Stdin};
use super::{Handshake, Hello, Inbox, Outgoing, Reply, SinkStream, UpstreamError};

mod stdin;
use crate::config::{StdioConfig, SAFE_ENV};
use crate::Metrics;

/// Largest line accepted from a child.
const MAX_LINE: usize = 64 << 20;
/// Bytes queued for the child's stdin beyond which new messages are refused
/// (the child is not reading); one message is always let through.
const MAX_BACKLOG: usize = 2 * MAX_LINE;
/// How long `open` waits for a (re)starting child.
const START_WAIT: Duration = Duration::from_secs(20);

/// A stdio upstream and its supervisor.
pub struct Transport {
    shared: Arc<Shared>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A message for one pending request: `(is_the_response, message)`.
type Sink = mpsc::UnboundedSender<(bool, Bytes)>;

struct Pending {
    view: u64,
    /// The request's id as the downstream wrote it.
    id: Box<str>,
    /// The request's progress token as the downstream wrote it.
    progress_token: Option<Box<str>>,
    sink: Sink,
    /// Whether the server may send requests or notifications on its behalf
    /// (a `tools/call` may; a list or the handshake may not).
    may_cause: bool,
}

struct View {
    inbox: Arc<dyn Inbox>,
    subscriptions: HashSet<String>,
}

/// A running, initialised child.
struct Running {
    stdin: Stdin,
    handshake: Arc<Handshake>,
}

struct Shared {
    name: Arc<str>,
    config: StdioConfig,
    /// What the child is told of its client in `initialize`: the router's
    /// own hello for a process shared by every session; the client's for a
    /// process of one session's own.
    hello: Hello,
    /// The process serves one session (`per_session`): what it sends
    /// outside a call goes to that session.
    single: bool,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    views: Mutex<HashMap<u64, View>>,
    /// Server-to-client request id → the view it went to and the request it
    /// was relayed with (for cancellations).
    asked: Mutex<HashMap<Box<str>, (u64, u64)>>,
    /// How many views are subscribed to each URI: the child hears the first
    /// subscribe and the last unsubscribe only.
    subscribers: Mutex<HashMap<String, usize>>,
    running: watch::Sender<Option<Arc<Running>>>,
    last_error: Mutex<String>,
    stop: Notify,
    stopping: std::sync::atomic::AtomicBool,
}

impl Transport {
    /// Starts the supervisor, which spawns the child (one for every session).
    pub fn start(name: Arc<str>, config: StdioConfig, metrics: Arc<Metrics>) -> Self {
        Self::with(name, config, metrics, Hello::router(), false)
    }

    /// Starts a child of one session's own, initialised with `hello` (that
    /// client's version and capabilities), and returns the session's view
    /// of it: everything the child sends outside a call goes to `inbox`
    /// (its `roots/list` included, which reaches the client).
    pub(crate) async fn for_session(
        name: Arc<str>,
        config: StdioConfig,
        metrics: Arc<Metrics>,
        hello: Hello,
        inbox: Arc<dyn Inbox>,
    ) -> (Transport, Result<Arc<dyn super::Channel>, UpstreamError>) {
        let transport = Self::with(name, config, metrics, hello, true);
        // The view exists before the child does: what it asks as soon as it
        // is initialised (the client's roots) has somewhere to go.
        let view = transport.shared.next_id.fetch_add(1, Ordering::Relaxed);
        transport.shared.views.lock().expect("lock").insert(view, View { inbox, subscriptions: HashSet::new() });
        let channel: Arc<dyn super::Channel> = Arc::new(Channel { shared: transport.shared.clone(), view });
        let started = transport.shared.wait_running(START_WAIT).await.map(|_| channel);
        (transport, started)
    }

    /// Requests in flight in the child now.
    pub(crate) fn pending(&self) -> usize {
        self.shared.pending.lock().expect("lock").len()
    }

    fn with(name: Arc<str>, config: StdioConfig, metrics: Arc<Metrics>, hello: Hello, single: bool) -> Self {
        let (running, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            name,
            config,
            hello,
            single,
            metrics,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            views: Mutex::new(HashMap::new()),
            asked: Mutex::new(HashMap::new()),
            subscribers: Mutex::new(HashMap::new()),
            running,
            last_error: Mutex::new("starting".into()),
            stop: Notify::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        let supervisor = tokio::spawn(supervise(shared.clone()));
        Transport { shared, supervisor: Mutex::new(Some(supervisor)) }
    }
}

#[async_trait]
impl super::Transport for Transport {
    async fn open(&self, _hello: &Hello, inbox: Arc<dyn Inbox>) -> Result<Arc<dyn super::Channel>, UpstreamError> {
        self.shared.wait_running(START_WAIT).await?;
        let view = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.views.lock().expect("lock").insert(view, View { inbox, subscriptions: HashSet::new() });
        Ok(Arc::new(Channel { shared: self.shared.clone(), view }))
    }

    async fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.stop.notify_one();
        let task = self.supervisor.lock().expect("lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// A transport dropped without `shutdown` (a session's own process whose
/// session went away) still stops its child: the supervisor is told to.
impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.stop.notify_one();
    }
}

impl Shared {
    async fn wait_running(&self, wait: Duration) -> Result<Arc<Running>, UpstreamError> {
        let mut rx = self.running.subscribe();
        let ready = tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await;
        match ready {
            Ok(Ok(running)) => Ok(running.clone().expect("is some")),
            _ => Err(UpstreamError::NotRunning(self.last_error.lock().expect("lock").clone())),
        }
    }

    fn fail_all_pending(&self) {
        self.pending.lock().expect("lock").clear();
        self.asked.lock().expect("lock").clear();
    }

    /// Routes one line the child wrote.
    fn dispatch(&self, line: Bytes, stdin: &Stdin) {
        let env = match Envelope::parse(&line) {
            Ok(env) => env,
            Err(e) => {
                self.metrics.protocol_error(&self.name);
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                tracing::warn!(upstream = %self.name, error = %e, line = %shown, "child wrote a line that is not JSON-RPC");
                return;
            }
        };
        match env.kind {
            MessageKind::Response | MessageKind::Error => {
                let Some(uid) = env.id.and_then(|id| id.get().parse::<u64>().ok()) else { return };
                let Some(p) = self.pending.lock().expect("lock").remove(&uid) else {
                    tracing::debug!(upstream = %self.name, id = uid, "response for a request nobody waits for");
                    return;
                };
                let id_span = span(&line, env.id.expect("checked").get());
                let restored = splice(&line, &mut [Edit::new(id_span, p.id.as_bytes())]);
                let _ = p.sink.send((true, restored));
            }
            MessageKind::Notification => self.notification(&env, &line),
            MessageKind::Request => self.server_request(&env, &line, stdin),
        }
    }

    fn notification(&self, env: &Envelope<'_>, line: &Bytes) {
        let method = Method::from_name(env.method_str());
        match method {
            Method::Progress => {
                let target = env.params.and_then(|p| Target::parse(p).ok());
                let token_raw = env.params.and_then(jsonrpc::progress_token);
                let (Some(token_raw), Some(_)) = (token_raw, target) else { return };
                let Ok(uid) = token_raw.get().parse::<u64>() else { return };
                let pending = self.pending.lock().expect("lock");
                let Some(p) = pending.get(&uid) else { return };
                let Some(original) = &p.progress_token else { return };
                let restored = splice(line, &mut [Edit::new(span(line, token_raw.get()), original.as_bytes())]);
                let _ = p.sink.send((false, restored));
            }
            Method::ToolsListChanged | Method::PromptsListChanged | Method::ResourcesListChanged => {
                for view in self.views.lock().expect("lock").values() {
                    view.inbox.deliver(line.clone());
                }
            }
            Method::ResourcesUpdated => {
                let uri = env
                    .params
                    .and_then(|p| Target::parse(p).ok())
                    .and_then(|t| t.uri)
                    .and_then(|u| as_str(u).map(|s| s.into_owned()));
                let Some(uri) = uri else { return };
                for view in self.views.lock().expect("lock").values() {
                    if view.subscriptions.contains(&uri) {
                        view.inbox.deliver(line.clone());
                    }
                }
            }
            Method::Cancelled => {
                // The child gave up on a request it sent to a client: tell that
                // client where it got the request (the call's stream, if the
                // call is still going, else its session).
                let request_id = env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.request_id);
                let Some((view, uid)) = request_id.and_then(|id| self.asked.lock().expect("lock").remove(id.get()))
                else {
                    return;
                };
                if let Some(p) = self.pending.lock().expect("lock").get(&uid) {
                    let _ = p.sink.send((false, line.clone()));
                    return;
                }
                if let Some(inbox) = self.views.lock().expect("lock").get(&view).map(|v| v.inbox.clone()) {
                    inbox.deliver(line.clone());
                }
            }
            _ => match self.sole_pending() {
                Some(sink) => {
                    let _ = sink.send((false, line.clone()));
                }
                None if self.single => self.deliver_to_the_session(line),
                None => self.metrics.relay_dropped(&self.name, "unattributable_notification"),
            },
        }
    }

    fn server_request(&self, env: &Envelope<'_>, line: &Bytes, stdin: &Stdin) {
        let id = env.id.expect("a request has an id");
        if env.method_str() == "ping" {
            let _ = stdin.send(ndjson::encode(&jsonrpc::result_response(id, b"{}")));
            return;
        }
        // A session's own process asks for the session's roots about the
        // session, not about a call that happens to be in flight (it asks
        // as soon as it is initialised, when the first call is on its way):
        // to the session's GET stream, as a server asks a client directly.
        if self.single && env.method_str() == "roots/list" {
            self.deliver_to_the_session(line);
            return;
        }
        let target = {
            let pending = self.pending.lock().expect("lock");
            let mut views =
                pending.values().filter(|p| p.may_cause).map(|p| p.view).collect::<HashSet<_>>().into_iter();
            match (views.next(), views.next()) {
                (Some(view), None) => pending
                    .iter()
                    .filter(|(_, p)| p.view == view && p.may_cause)
                    .max_by_key(|(uid, _)| **uid)
                    .map(|(uid, p)| (view, *uid, p.sink.clone())),
                _ => None,
            }
        };
        match target {
            Some((view, uid, sink)) => {
                self.asked.lock().expect("lock").insert(id.get().into(), (view, uid));
                let _ = sink.send((false, line.clone()));
            }
            // A process of one session's own asks its client, call or no call.
            None if self.single => self.deliver_to_the_session(line),
            None => {
                self.metrics.relay_dropped(&self.name, "unattributable_request");
                let message = format!(
                    "switchboard cannot tell which client {} is meant for: this stdio upstream is shared by several sessions",
                    env.method_str()
                );
                let reply = jsonrpc::error_response(Some(id), jsonrpc::code::INTERNAL_ERROR, &message, None);
                let _ = stdin.send(ndjson::encode(&reply));
            }
        }
    }

    /// A message for the one session a process of its own serves.
    fn deliver_to_the_session(&self, line: &Bytes) {
        let inbox = self.views.lock().expect("lock").values().next().map(|v| v.inbox.clone());
        match inbox {
            Some(inbox) => inbox.deliver(line.clone()),
            None => self.metrics.relay_dropped(&self.name, "unattributable_request"),
        }
    }

    /// The sink of the only request in flight that could cause server
    /// messages, if there is exactly one.
    fn sole_pending(&self) -> Option<Sink> {
        let pending = self.pending.lock().expect("lock");
        let mut causes = pending.values().filter(|p| p.may_cause);
        match (causes.next(), causes.next()) {
            (Some(p), None) => Some(p.sink.clone()),
            _ => None,
        }
    }
}

/// Starts, watches and restarts the child.
async fn supervise(shared: Arc<Shared>) {
    let mut backoff = Duration::from_millis(250);
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        match spawn(&shared) {
            Ok(child) => run(&shared, child).await,
            Err(e) => {
                let message = format!("cannot start {:?}: {e}", shared.config.command);
                tracing::error!(upstream = %shared.name, "{message}");
                *shared.last_error.lock().expect("lock") = message;
            }
        }
        shared.running.send_replace(None);
        shared.fail_all_pending();
        shared.metrics.set_up(&shared.name, false);
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        shared.metrics.restarted(&shared.name);
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(250);
        }
        tracing::warn!(upstream = %shared.name, ?backoff, "restarting the upstream process");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shared.stop.notified() => return,
        }
        backoff = (backoff * 2).min(shared.config.restart_max_backoff);
    }
}

fn spawn(shared: &Shared) -> std::io::Result<Child> {
    let c = &shared.config;
    let mut cmd = Command::new(&c.command);
    cmd.args(&c.args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    if !c.inherit_env {
        cmd.env_clear();
        for key in SAFE_ENV {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
    }
    cmd.envs(&c.env);
    if let Some(cwd) = &c.cwd {
        cmd.current_dir(cwd);
    }
    cmd.spawn()
}

/// Runs one child from start to exit (or to shutdown).
async fn run(shared: &Arc<Shared>, mut child: Child) {
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return;
    };
    let (stdin_tx, stdin_rx) = Stdin::new(MAX_BACKLOG);
    let writer = tokio::spawn(write_stdin(stdin, stdin_rx));
    let name = shared.name.clone();
    let log = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(upstream = %name, "stderr: {line}");
        }
    });
    let reader = {
        let shared = shared.clone();
        let stdin_tx = stdin_tx.clone();
        tokio::spawn(async move {
            let mut stdout = stdout;
            let mut decoder = ndjson::Decoder::new(MAX_LINE);
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = match stdout.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        // stdout closed: nothing in flight can be answered.
                        shared.fail_all_pending();
                        return;
                    }
                    Ok(n) => n,
                };
                decoder.push(&chunk[..n]);
                loop {
                    match decoder.next_line() {
                        Ok(Some(line)) => shared.dispatch(line, &stdin_tx),
                        Ok(None) => break,
                        Err(e) => tracing::warn!(upstream = %shared.name, "child wrote an oversized line: {e}"),
                    }
                }
            }
        })
    };

    match initialize(shared, &stdin_tx).await {
        Ok(handshake) => {
            tracing::info!(upstream = %shared.name, pid, version = %handshake.protocol_version, "upstream process ready");
            resubscribe(shared, &stdin_tx);
            shared
                .running
                .send_replace(Some(Arc::new(Running { stdin: stdin_tx.clone(), handshake: Arc::new(handshake) })));
            shared.metrics.set_up(&shared.name, true);
            let exited = tokio::select! {
                status = child.wait() => Some(status),
                () = shared.stop.notified() => None,
            };
            shared.running.send_replace(None);
            match exited {
                Some(status) => {
                    let message =
                        format!("process exited: {}", status.map_or_else(|e| e.to_string(), |s| s.to_string()));
                    tracing::warn!(upstream = %shared.name, "{message}");
                    *shared.last_error.lock().expect("lock") = message;
                }
                None => {
                    // Dropping the writer closes the child's stdin.
                    writer.abort();
                    stop_child(shared, &mut child).await;
                }
            }
        }
        Err(e) => {
            let message = format!("initialize failed: {e}");
            tracing::error!(upstream = %shared.name, "{message}");
            *shared.last_error.lock().expect("lock") = message;
            let _ = child.kill().await;
        }
    }
    writer.abort();
    reader.abort();
    log.abort();
}

/// A restarted child knows nothing of the subscriptions sessions hold on it:
/// subscribe it again to each (its answers are dropped, as nobody waits).
fn resubscribe(shared: &Shared, stdin: &Stdin) {
    let uris: Vec<String> = shared.subscribers.lock().expect("lock").keys().cloned().collect();
    for uri in &uris {
        let uid = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let params = format!(r#"{{"uri":{}}}"#, String::from_utf8_lossy(&jsonrpc::json_string(uri)));
        let request =
            jsonrpc::request(Some(uid.to_string().as_bytes()), "resources/subscribe", Some(params.as_bytes()));
        let _ = stdin.send(ndjson::encode(&request));
    }
    if !uris.is_empty() {
        tracing::info!(upstream = %shared.name, count = uris.len(), "subscriptions renewed in the new process");
    }
}

/// Close stdin, wait; SIGTERM, wait; SIGKILL.
async fn stop_child(shared: &Shared, child: &mut Child) {
    let grace = shared.config.shutdown_grace;
    if tokio::time::timeout(grace, child.wait()).await.is_ok() {
        return;
    }
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    tracing::warn!(upstream = %shared.name, "process ignored stdin close and SIGTERM; killing it");
    let _ = child.kill().await;
}

async fn initialize(shared: &Shared, stdin: &Stdin) -> Result<Handshake, UpstreamError> {
    let uid = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::unbounded_channel();
    shared
        .pending
        .lock()
        .expect("lock")
        .insert(uid, Pending { view: 0, id: "0".into(), progress_token: None, sink: tx, may_cause: false });
    let request = jsonrpc::request(Some(uid.to_string().as_bytes()), "initialize", Some(&shared.hello.params()));
    stdin.send(ndjson::encode(&request))?;
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match rx.recv().await {
                Some((true, message)) => return Ok(message),
                Some((false, _)) => continue,
                None => return Err(UpstreamError::Closed),
            }
        }
    })
    .await
    .map_err(|_| UpstreamError::Timeout(Duration::from_secs(30)))??;
    let handshake = Handshake::from_response(&answer)?;
    let note = jsonrpc::request(None, "notifications/initialized", None);
    stdin.send(ndjson::encode(&note))?;
    Ok(handshake)
}

/// One session's view of the shared process.
struct Channel {
    shared: Arc<Shared>,
    view: u64,
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.leave();
    }
}

#[async_trait]
impl super::Channel for Channel {
    async fn request(&self, out: Outgoing) -> Result<Reply, UpstreamError> {
        let running = self.shared.wait_running(START_WAIT).await?;
        let uid = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let uid_text = uid.to_string();
        let body = &out.body;
        let original_id: Box<str> = String::from_utf8_lossy(&body[out.id.clone()]).into();
        let mut edits = vec![Edit::new(out.id.clone(), uid_text.as_bytes())];
        let progress_token = out.progress_token.clone().map(|range| {
            let original: Box<str> = String::from_utf8_lossy(&body[range.clone()]).into();
            edits.push(Edit::new(range, uid_text.as_bytes()));
            original
        });
        if matches!(out.method, Method::ResourcesSubscribe | Method::ResourcesUnsubscribe)
            && !self.track_subscription(&out)
        {
            // Another session keeps (or already holds) the child's subscription: answer here.
            return Ok(Reply::Done(jsonrpc::result_response(
                &serde_json::value::RawValue::from_string(original_id.into())
                    .map_err(|e| UpstreamError::Protocol(crate::Cause::from_error(e)))?,
                b"{}",
            )));
        }
        let line = ndjson::encode(&splice(body, &mut edits));
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.shared.pending.lock().expect("lock").insert(
            uid,
            Pending {
                view: self.view,
                id: original_id,
                progress_token,
                sink: tx,
                may_cause: out.method.may_cause_messages(),
            },
        );
        let guard = PendingGuard { shared: Arc::downgrade(&self.shared), uid };
        running.stdin.send(line)?;
        match rx.recv().await {
            None => Err(UpstreamError::Closed),
            Some((true, response)) => Ok(Reply::Done(response)),
            Some((false, first)) => Ok(Reply::Stream(Box::new(SinkStream::new(first, rx, guard)))),
        }
    }

    async fn send(&self, message: Bytes) -> Result<(), UpstreamError> {
        let running = self.shared.wait_running(Duration::from_secs(1)).await?;
        let line = match Envelope::parse(&message) {
            Ok(env) if env.method_str() == "notifications/cancelled" => self.map_cancel(&env, &message),
            Ok(env) if matches!(env.kind, MessageKind::Response | MessageKind::Error) => {
                if let Some(id) = env.id {
                    self.shared.asked.lock().expect("lock").remove(id.get());
                }
                Some(message.clone())
            }
            _ => Some(message.clone()),
        };
        if let Some(line) = line {
            running.stdin.send(ndjson::encode(&line))?;
        }
        Ok(())
    }

    fn listen(&self) {}

    fn handshake(&self) -> Arc<Handshake> {
        self.shared.running.borrow().as_ref().map(|r| r.handshake.clone()).unwrap_or_default()
    }

    async fn close(&self) {
        self.leave();
    }
}

impl Channel {
    /// Records a subscribe or unsubscribe of this view; returns whether the
    /// child must hear it (the first subscriber, or the last to leave).
    fn track_subscription(&self, out: &Outgoing) -> bool {
        let uri = Envelope::parse(&out.body).ok().and_then(|env| {
            env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.uri.and_then(as_str).map(|u| u.into_owned()))
        });
        let Some(uri) = uri else { return true };
        let mut views = self.shared.views.lock().expect("lock");
        let Some(view) = views.get_mut(&self.view) else { return true };
        let mut subscribers = self.shared.subscribers.lock().expect("lock");
        if out.method == Method::ResourcesSubscribe {
            if !view.subscriptions.insert(uri.clone()) {
                return false;
            }
            let count = subscribers.entry(uri).or_default();
            *count += 1;
            *count == 1
        } else {
            if !view.subscriptions.remove(&uri) {
                return false;
            }
            let count = subscribers.entry(uri.clone()).or_default();
            *count = count.saturating_sub(1);
            if *count == 0 {
                subscribers.remove(&uri);
                true
            } else {
                false
            }
        }
    }

    /// Removes this view; subscriptions only it held are ended in the child.
    fn leave(&self) {
        let Some(view) = self.shared.views.lock().expect("lock").remove(&self.view) else { return };
        let mut ended = Vec::new();
        {
            let mut subscribers = self.shared.subscribers.lock().expect("lock");
            for uri in view.subscriptions {
                if let Some(count) = subscribers.get_mut(&uri) {
                    *count -= 1;
                    if *count == 0 {
                        subscribers.remove(&uri);
                        ended.push(uri);
                    }
                }
            }
        }
        let stdin = self.shared.running.borrow().as_ref().map(|r| r.stdin.clone());
        let Some(stdin) = stdin else { return };
        for uri in ended {
            let uid = self.shared.next_id.fetch_add(1, Ordering::Relaxed).to_string();
            let params = serde_json::to_vec(&serde_json::json!({ "uri": uri })).expect("serializable");
            let request = jsonrpc::request(Some(uid.as_bytes()), "resources/unsubscribe", Some(&params));
            let _ = stdin.send(ndjson::encode(&request));
        }
    }

    /// A client's `notifications/cancelled` names its own request id; the
    /// child knows that request by the id we gave it.
    fn map_cancel(&self, env: &Envelope<'_>, message: &Bytes) -> Option<Bytes> {
        let request_id = env.params.and_then(|p| Target::parse(p).ok())?.request_id?;
        let uid = {
            let pending = self.shared.pending.lock().expect("lock");
            pending.iter().find(|(_, p)| p.view == self.view && *p.id == *request_id.get()).map(|(uid, _)| *uid)
        }?;
        let uid = uid.to_string();
        Some(splice(message, &mut [Edit::new(span(message, request_id.get()), uid.as_bytes())]))
    }
}

/// Removes a pending request when its caller stops waiting.
struct PendingGuard {
    shared: Weak<Shared>,
    uid: u64,
}

impl Drop for PendingGuard {
    /// A request abandoned before its answer (the caller timed out or went
    /// away) is cancelled in the child, under the id the child knows.
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else { return };
        if shared.pending.lock().expect("lock").remove(&self.uid).is_none() {
            return;
        }
        let params = format!(r#"{{"requestId":{},"reason":"the caller stopped waiting"}}"#, self.uid);
        let note = jsonrpc::request(None, "notifications/cancelled", Some(params.as_bytes()));
        let stdin = shared.running.borrow().as_ref().map(|r| r.stdin.clone());
        if let Some(stdin) = stdin {
            let _ = stdin.send(ndjson::encode(&note));
        }
    }
}
