//! Connections of the MCP listener: how many, from which address, and for
//! how long one may hold the router without asking anything.
//!
//! - At most `server.max_connections` open at once, and
//!   `server.max_connections_per_address` from one client address: a
//!   connection beyond is answered with a canned 503 (written if the socket
//!   takes it at once, never waited for) and closed, before any parsing.
//! - A connection must have sent its first request's headers within
//!   `server.header_timeout` of being accepted, and one with no request in
//!   flight is closed after `server.idle_timeout` (a stream being read, an
//!   SSE answer or GET, is a request in flight).
//! - Accept failures (out of file descriptors) back off from 10 ms to 1 s
//!   and are logged once per episode, not once per attempt.
//!
//! Counted in `switchboard_connections_open`,
//! `switchboard_connections_refused_total{reason}` and
//! `switchboard_connections_closed_total{reason}`.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use prometheus::{IntCounterVec, IntGauge};
use switchboard_core::metrics::{counter_vec, gauge, Registry};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The bounds of `[server]` on connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max: usize,
    /// 0: no bound per address.
    pub per_address: usize,
}

/// The metrics of connections.
pub struct Metrics {
    open: IntGauge,
    refused: IntCounterVec,
    closed: IntCounterVec,
    accept_errors: IntCounterVec,
}

/// Which listener connections are counted for: its metrics' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The MCP endpoint: `switchboard_connections_*`, `switchboard_accept_errors_total`.
    Mcp,
    /// The admin API: `switchboard_admin_connections_*`, `switchboard_admin_accept_errors_total`.
    Admin,
}

impl Metrics {
    pub fn new(registry: &Registry, listener: Listener) -> Self {
        let (prefix, which) = match listener {
            Listener::Mcp => ("switchboard_", "the MCP listener"),
            Listener::Admin => ("switchboard_admin_", "the admin listener"),
        };
        Metrics {
            open: gauge(registry, &format!("{prefix}connections_open"), &format!("Client connections open on {which}.")),
            refused: counter_vec(
                registry,
                &format!("{prefix}connections_refused_total"),
                &format!("Connections refused at accept on {which} (503 and closed): `max_connections` or `per_address`."),
                &["reason"],
            ),
            closed: counter_vec(
                registry,
                &format!("{prefix}connections_closed_total"),
                &format!("Connections on {which} the router closed: `header_timeout` (no request in time after accept) or `idle` (no request in flight for idle_timeout)."),
                &["reason"],
            ),
            accept_errors: counter_vec(
                registry,
                &format!("{prefix}accept_errors_total"),
                &format!("Failed accepts on {which}, by error kind (`out_of_files` or `other`)."),
                &["kind"],
            ),
        }
    }
}

/// The open connections, counted globally and per client address.
pub struct Connections {
    limits: Limits,
    open: AtomicUsize,
    by_address: Mutex<HashMap<IpAddr, usize>>,
    metrics: Metrics,
    /// Refusals since the last log line about them.
    refusals_unlogged: AtomicU64,
    last_refusal_log: Mutex<Option<Instant>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Global,
    PerAddress,
}

impl Refused {
    fn label(self) -> &'static str {
        match self {
            Refused::Global => "max_connections",
            Refused::PerAddress => "per_address",
        }
    }
}

/// A place among the open connections, given back when dropped.
pub struct Admitted {
    connections: Arc<Connections>,
    address: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let c = &self.connections;
        c.open.fetch_sub(1, Ordering::AcqRel);
        c.metrics.open.dec();
        if c.limits.per_address > 0 {
            let mut by_address = c.by_address.lock().expect("lock");
            if let Some(n) = by_address.get_mut(&self.address) {
                *n -= 1;
                if *n == 0 {
                    by_address.remove(&self.address);
                }
            }
        }
    }
}

impl Connections {
    pub fn new(limits: Limits, registry: &Registry, listener: Listener) -> Arc<Self> {
        Arc::new(Connections {
            limits,
            open: AtomicUsize::new(0),
            by_address: Mutex::new(HashMap::new()),
            metrics: Metrics::new(registry, listener),
            refusals_unlogged: AtomicU64::new(0),
            last_refusal_log: Mutex::new(None),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes a place for a connection from `address`, if there is one.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Admitted, Refused> {
        let taken =
            self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limits.max).then_some(n + 1));
        if taken.is_err() {
            return Err(self.refused(Refused::Global, address));
        }
        if self.limits.per_address > 0 {
            let mut by_address = self.by_address.lock().expect("lock");
            let n = by_address.entry(address).or_insert(0);
            if *n >= self.limits.per_address {
                drop(by_address);
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(self.refused(Refused::PerAddress, address));
            }
            *n += 1;
        }
        self.metrics.open.inc();
        Ok(Admitted { connections: self.clone(), address })
    }

    /// Counts a refusal, and logs refusals at most every 10 s.
    fn refused(&self, why: Refused, address: IpAddr) -> Refused {
        self.metrics.refused.with_label_values(&[why.label()]).inc();
        let unlogged = self.refusals_unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_refusal_log.lock().expect("lock");
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            self.refusals_unlogged.store(0, Ordering::Relaxed);
            let (max, per_address) = (self.limits.max, self.limits.per_address);
            tracing::warn!(
                reason = why.label(),
                %address,
                refused = unlogged,
                max,
                per_address,
                "connections refused: the router has as many open as it allows (this and the ones since the last such line)"
            );
        }
        why
    }

    /// Counts a connection the router closed (`header_timeout` or `idle`).
    pub fn closed(&self, reason: &'static str) {
        self.metrics.closed.with_label_values(&[reason]).inc();
    }
}

/// Raises the process's open-file limit to its hard limit (each connection
/// is a file descriptor), and says what it is; warns if `max_connections`
/// would not fit under it.
pub fn raise_open_files_limit(max_connections: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() { hard } else { soft };
    tracing::info!(before = soft, now = limit, "open-file limit");
    // Room for upstream connections, stdio children, the databases, logs.
    if (max_connections as u64).saturating_add(256) > limit {
        tracing::warn!(
            max_connections,
            open_file_limit = limit,
            "server.max_connections does not fit under the open-file limit (with 256 to spare): accepts will fail before the cap refuses; raise the limit (ulimit -n, LimitNOFILE=) or lower max_connections"
        );
    }
}

/// The canned answer to a connection refused at accept.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 107\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":\"the router has too many connections open\"}}";

/// Answers a refused connection without waiting for it, and closes it.
pub fn refuse(stream: TcpStream) {
    let _ = stream.try_write(REFUSAL);
    drop(stream);
}

/// Accepts the next connection; failures (out of file descriptors above
/// all) are waited out with a doubling pause, logged once per episode.
pub async fn accept(listener: &TcpListener, connections: &Connections) -> (TcpStream, IpAddr) {
    let mut pause = Duration::from_millis(10);
    let mut failures = 0u64;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if failures > 0 {
                    tracing::info!(failures, "accepting connections again");
                }
                let _ = stream.set_nodelay(true);
                return (stream, peer.ip());
            }
            Err(e) => {
                // EMFILE (the process's limit) or ENFILE (the system's).
                let out_of_files = matches!(e.raw_os_error(), Some(24 | 23));
                let kind = if out_of_files { "out_of_files" } else { "other" };
                connections.metrics.accept_errors.with_label_values(&[kind]).inc();
                if failures == 0 {
                    tracing::warn!(error = %e, "accept failed; retrying with a growing pause (logged again when it recovers)");
                }
                failures += 1;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// What one connection is doing: requests in flight, and when it last had
/// none.
pub struct Activity {
    epoch: tokio::time::Instant,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    /// Milliseconds since `epoch` when the last request ended (or accept).
    quiet_since: AtomicU64,
    ended: Notify,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            epoch: tokio::time::Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            quiet_since: AtomicU64::new(0),
            ended: Notify::new(),
        })
    }

    /// A request begins; it ends when the returned guard (kept by its
    /// response body) is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Waits until the connection should be closed for inactivity, and
    /// says why (`header_timeout` or `idle`).
    pub async fn expired(&self, limits: Limits) -> &'static str {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) > 0 {
                ended.await;
                continue;
            }
            let first = self.requests.load(Ordering::Relaxed) == 0;
            let (limit, reason) =
                if first { (limits.header_timeout, "header_timeout") } else { (limits.idle_timeout, "idle") };
            let quiet = Duration::from_millis(self.quiet_since.load(Ordering::Acquire));
            let deadline = self.epoch + quiet + limit;
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    // Still nothing in flight, and nothing ended since?
                    let now_quiet = Duration::from_millis(self.quiet_since.load(Ordering::Acquire));
                    let same_first = (self.requests.load(Ordering::Relaxed) == 0) == first;
                    if self.in_flight.load(Ordering::Acquire) == 0 && now_quiet == quiet && same_first {
                        return reason;
                    }
                }
                () = &mut ended => {}
            }
        }
    }
}

/// A request in flight on a connection.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.quiet_since.store(a.epoch.elapsed().as_millis() as u64, Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
        a.ended.notify_waiters();
    }
}

/// A response body that keeps its request in flight until it is done.
pub struct Tracked<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B> Tracked<B> {
    pub fn new(body: B, in_flight: InFlight) -> Self {
        Tracked { body, _in_flight: in_flight }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves one connection until it ends, or closes it when it has had no
/// request in flight for too long (see `connections.rs`); its place among
/// the open connections is given back either way.
pub async fn supervise<E: std::fmt::Display>(
    conn: impl Future<Output = Result<(), E>>,
    admitted: Admitted,
    activity: Arc<Activity>,
    conns: Arc<Connections>,
) {
    let _admitted = admitted;
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        reason = activity.expired(conns.limits()) => {
            conns.closed(reason);
            tracing::debug!(reason, "connection closed: no request in flight for too long");
        }
    }
}

/// The TLS handshake of an accepted connection, within the header timeout;
/// `None` (counted as `tls_handshake` or `header_timeout`) if it fails.
pub async fn tls_handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    conns: &Connections,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(conns.limits().header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            conns.closed("tls_handshake");
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            conns.closed("header_timeout");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_address: usize) -> Limits {
        Limits { header_timeout: Duration::from_secs(1), idle_timeout: Duration::from_secs(2), max, per_address }
    }

    #[test]
    fn places_are_bounded_globally_and_per_address_and_given_back() {
        let c = Connections::new(limits(3, 2), &Registry::new(), Listener::Mcp);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = c.admit(a).unwrap();
        let _a2 = c.admit(a).unwrap();
        assert_eq!(c.admit(a).err(), Some(Refused::PerAddress));
        let _b1 = c.admit(b).unwrap();
        assert_eq!(c.admit(b).err(), Some(Refused::Global));
        drop(a1);
        let _b2 = c.admit(b).expect("a place given back is free again");
        assert_eq!(c.open.load(Ordering::Acquire), 3, "a refused one took nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_expires_only_when_nothing_is_in_flight_for_its_limit() {
        let activity = Activity::new();
        let l = limits(1, 0);
        let started = tokio::time::Instant::now();
        assert_eq!(activity.expired(l).await, "header_timeout");
        let took = started.elapsed();
        assert!(took >= l.header_timeout && took < l.header_timeout + Duration::from_millis(5), "{took:?}");

        let activity = Activity::new();
        let request = activity.begin();
        let waiting = tokio::spawn({
            let activity = activity.clone();
            async move { activity.expired(l).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiting.is_finished(), "a request in flight (a stream being read) keeps it open");
        let ended = tokio::time::Instant::now();
        drop(request);
        assert_eq!(waiting.await.unwrap(), "idle");
        let took = ended.elapsed();
        assert!(
            took >= l.idle_timeout - Duration::from_millis(1) && took < l.idle_timeout + Duration::from_millis(5),
            "idle counts from the end of the last request: {took:?}"
        );
    }
}
