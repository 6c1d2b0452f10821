//! Stdio upstreams run once per client session (`per_session = true`).
//!
//! A shared process (`stdio.rs`) is initialised with the router's own
//! hello and cannot tell which client a request outside a call is for, so
//! servers that act on one client's roots (`mcp-server-filesystem`) cannot
//! work through it. Here each [`Transport::open`] (one per client session,
//! and one for the catalog) runs a process of its own, initialised with
//! that client's version and capabilities; what it sends outside a call
//! goes to that session, and the client's answers come back to it, as with
//! a desktop client's own server.
//!
//! Bounded: at most `max_processes` run at once for the upstream; opening
//! one more fails with a clear error (logged and counted) until a session
//! ends or a process is reaped. A process with no request for
//! `idle_timeout` (and none in flight) is stopped; its session's next
//! request starts a fresh one, initialised again. Stopping is stdin close,
//! SIGTERM, SIGKILL, as for a shared process.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use super::{Handshake, Hello, Inbox, Outgoing, Reply, UpstreamError};
use crate::config::{PerSession, StdioConfig};
use crate::Metrics;

/// A stdio upstream whose every session gets a process of its own.
pub struct Transport {
    shared: Arc<Shared>,
    reaper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

struct Shared {
    name: Arc<str>,
    config: StdioConfig,
    limits: PerSession,
    metrics: Arc<Metrics>,
    /// Processes running now.
    running: AtomicUsize,
    /// Every channel opened (those dropped are pruned by the reaper).
    channels: Mutex<Vec<Weak<Channel>>>,
    /// Time is measured from here.
    epoch: Instant,
}

impl Transport {
    /// A transport that starts processes on demand; starts its reaper (so
    /// it must run inside a Tokio runtime).
    pub fn new(name: Arc<str>, config: StdioConfig, limits: PerSession, metrics: Arc<Metrics>) -> Self {
        metrics.set_processes(&name, 0);
        let shared = Arc::new(Shared {
            name,
            config,
            limits,
            metrics,
            running: AtomicUsize::new(0),
            channels: Mutex::new(Vec::new()),
            epoch: Instant::now(),
        });
        let every = (limits.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        let reaper = tokio::spawn(reap(Arc::downgrade(&shared), every));
        Transport { shared, reaper: Mutex::new(Some(reaper)) }
    }
}

#[async_trait]
impl super::Transport for Transport {
    async fn open(&self, hello: &Hello, inbox: Arc<dyn Inbox>) -> Result<Arc<dyn super::Channel>, UpstreamError> {
        let channel = Arc::new(Channel {
            shared: self.shared.clone(),
            hello: hello.clone(),
            inbox,
            process: tokio::sync::Mutex::new(None),
            handshake: Mutex::new(Arc::default()),
            last_used_ms: AtomicU64::new(self.shared.now_ms()),
            closed: AtomicBool::new(false),
        });
        // Started now: a refusal (the limit) or a process that cannot start
        // is the open's failure, not the first request's.
        channel.process().await?;
        let mut channels = self.shared.channels.lock().expect("lock");
        channels.retain(|c| c.strong_count() > 0);
        channels.push(Arc::downgrade(&channel));
        Ok(channel)
    }

    async fn shutdown(&self) {
        if let Some(reaper) = self.reaper.lock().expect("lock").take() {
            reaper.abort();
        }
        let channels: Vec<Arc<Channel>> =
            self.shared.channels.lock().expect("lock").drain(..).filter_map(|c| c.upgrade()).collect();
        for channel in channels {
            channel.stop(false).await;
        }
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Takes a place for one more process, if the limit allows.
    fn reserve(self: &Arc<Self>) -> Result<Slot, UpstreamError> {
        let max = self.limits.max_processes;
        let taken = self.running.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        match taken {
            Ok(n) => {
                self.metrics.set_processes(&self.name, n + 1);
                Ok(Slot(self.clone()))
            }
            Err(_) => {
                self.metrics.process_refused(&self.name);
                tracing::warn!(upstream = %self.name, max, "a session was refused a process: max_processes are running");
                Err(UpstreamError::Down(format!(
                    "{max} processes of this upstream are running, its max_processes; try again when a session ends"
                )))
            }
        }
    }

    fn release(&self) {
        let left = self.running.fetch_sub(1, Ordering::AcqRel) - 1;
        self.metrics.set_processes(&self.name, left);
    }
}

/// A place under `max_processes`, given back when dropped: however the
/// start of a process ends (a failure, or the caller giving up on the
/// wait), and when the process is.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A session's process: its supervisor, and the session's view of it. Its
/// place under `max_processes` is given back when it is dropped (and the
/// supervisor then stops the process, if `stop` did not already).
struct Process {
    transport: crate::stdio::Transport,
    view: Arc<dyn super::Channel>,
    _slot: Slot,
}

/// One session's channel: its own process, started on demand.
struct Channel {
    shared: Arc<Shared>,
    hello: Hello,
    inbox: Arc<dyn Inbox>,
    process: tokio::sync::Mutex<Option<Process>>,
    /// The last process's handshake (kept while it is stopped).
    handshake: Mutex<Arc<Handshake>>,
    last_used_ms: AtomicU64,
    closed: AtomicBool,
}

impl Channel {
    /// The view of the running process, starting one if there is none.
    async fn process(&self) -> Result<Arc<dyn super::Channel>, UpstreamError> {
        self.last_used_ms.store(self.shared.now_ms(), Ordering::Relaxed);
        let mut process = self.process.lock().await;
        if let Some(running) = process.as_ref() {
            return Ok(running.view.clone());
        }
        if self.closed.load(Ordering::Relaxed) {
            return Err(UpstreamError::Closed);
        }
        let slot = self.shared.reserve()?;
        let (transport, view) = crate::stdio::Transport::for_session(
            self.shared.name.clone(),
            self.shared.config.clone(),
            self.shared.metrics.clone(),
            self.hello.clone(),
            self.inbox.clone(),
        )
        .await;
        match view {
            Ok(view) => {
                *self.handshake.lock().expect("lock") = view.handshake();
                *process = Some(Process { transport, view: view.clone(), _slot: slot });
                Ok(view)
            }
            Err(e) => {
                super::Transport::shutdown(&transport).await;
                drop(slot);
                Err(e)
            }
        }
    }

    /// Stops the process, if one runs (`only_if_idle`: only if nothing is
    /// in flight and nothing was asked of it for `idle_timeout`).
    async fn stop(&self, only_if_idle: bool) {
        let mut process = self.process.lock().await;
        if only_if_idle {
            let idle = self.shared.now_ms().saturating_sub(self.last_used_ms.load(Ordering::Relaxed));
            let busy = process.as_ref().is_some_and(|p| p.transport.pending() > 0);
            if busy || idle < self.shared.limits.idle_timeout.as_millis() as u64 {
                return;
            }
        }
        if let Some(stopped) = process.take() {
            if only_if_idle {
                tracing::info!(upstream = %self.shared.name, "a session's process stopped after being idle; its next request starts another");
            }
            stopped.view.close().await;
            super::Transport::shutdown(&stopped.transport).await;
        }
    }
}

#[async_trait]
impl super::Channel for Channel {
    async fn request(&self, out: Outgoing) -> Result<Reply, UpstreamError> {
        let view = self.process().await?;
        let reply = view.request(out).await;
        self.last_used_ms.store(self.shared.now_ms(), Ordering::Relaxed);
        reply
    }

    async fn send(&self, message: Bytes) -> Result<(), UpstreamError> {
        let view = self.process().await?;
        view.send(message).await
    }

    fn listen(&self) {}

    fn handshake(&self) -> Arc<Handshake> {
        self.handshake.lock().expect("lock").clone()
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.stop(false).await;
    }
}

/// Stops the processes that have been idle too long, every `every`.
async fn reap(shared: Weak<Shared>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else { return };
        let channels: Vec<Arc<Channel>> = {
            let mut channels = shared.channels.lock().expect("lock");
            channels.retain(|c| c.strong_count() > 0);
            channels.iter().filter_map(Weak::upgrade).collect()
        };
        drop(shared);
        for channel in channels {
            channel.stop(true).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Transport as _;

    #[tokio::test]
    async fn a_start_given_up_on_gives_its_place_back() {
        // `sleep` never answers `initialize`: each open waits until the
        // caller gives up (as the catalog does after its list_timeout).
        let config = StdioConfig {
            command: "sleep".into(),
            args: vec!["30".into()],
            env: Default::default(),
            inherit_env: false,
            cwd: None,
            restart_max_backoff: Duration::from_secs(1),
            shutdown_grace: Duration::from_millis(50),
            per_session: None,
        };
        let limits = PerSession { max_processes: 1, idle_timeout: Duration::from_secs(60) };
        let metrics = Arc::new(Metrics::new(&switchboard_core::metrics::Registry::new(), &["slow"]));
        let transport = Transport::new("slow".into(), config, limits, metrics);
        let hello = Hello::router();
        for _ in 0..3 {
            let open = transport.open(&hello, Arc::new(crate::Discard));
            let given_up = tokio::time::timeout(Duration::from_millis(200), open).await;
            assert!(given_up.is_err(), "the open waits for a handshake that never comes");
            assert_eq!(transport.shared.running.load(Ordering::Acquire), 0, "its place under max_processes is back");
        }
        transport.shutdown().await;
    }
}
