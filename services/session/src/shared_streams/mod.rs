//! Event streams shared by every replica, in Redis: a client's streams go on
//! at whichever replica it reconnects to.
//!
//! With the Redis session store, a session's stream 0 (its GET stream,
//! messages not tied to a request) lives here, not in one replica's memory:
//! any replica that receives such a message (an upstream's GET stream, a list
//! change) appends it, and the replica holding the client's GET stream is
//! woken to send it. A request's stream is read from the memory of the
//! replica serving the request, and copied here as it goes (*spilled*,
//! written behind by a queue, off the request's path), so that a client that
//! lost it (a dropped connection, an upstream's SSE polling, a draining or
//! dead replica) resumes it at any replica with `Last-Event-ID`.
//!
//! Keys, per session and stream:
//! - `{prefix}ev:{session}:{stream}`: a Redis stream of events, capped at
//!   [`MAX_EVENTS`] (approximately). Entry id `1-{seq}` carries the event's
//!   sequence number: stream 0's are counted in Redis (`seq` below), from
//!   the time the count started in µs-like units (milliseconds × 1000), so
//!   that a count Redis lost and restarted goes on above every number a
//!   client saw before; a spilled stream keeps the numbers its replica gave. An entry holds
//!   either `m` (a message, encoded as SSE by the reader) or `e` (an event
//!   already encoded, spilled).
//! - `{prefix}evm:{session}:{stream}`: a hash: `seq` (the last number),
//!   `reader` (the token of the one response reading the stream),
//!   `delivered` (the last event a reader sent), `closed` (the request was
//!   answered), `open` (events exist), `owner` and `last` (the replica
//!   serving the request, and when it last appended), and for a request
//!   relayed from an upstream's stream `origin` (the upstream, its session,
//!   the request's id and method, as JSON) and `upe` (the upstream's last
//!   event id relayed so far).
//! - `{prefix}evd:{session}:{what}`: a list change announced to the session
//!   in the last 2 s (every replica holding the session announces it; one
//!   event is enough).
//! - `{prefix}replica:{replica}`: a replica's heartbeat (3 s, renewed every
//!   second). A request stream whose replica's heartbeat is gone and that has
//!   had no event for 3 s is *abandoned*: one reader takes it over (a
//!   compare-and-set on `owner`) and continues the upstream's stream from
//!   `upe` (see [`SharedStreams::on_abandoned`]); a stream with no `origin`
//!   is sent as it is, and ends.
//!
//! An open stream's keys expire `session_idle_timeout` after its last write
//! or read; an answered one 5 minutes after its answer; an ended session's
//! stream 0 is deleted. If Redis loses a stream (a restart), a reader
//! resuming beyond what it has gets everything there is.
//!
//! Each replica subscribes to `{prefix}wake:{replica}` (and `{prefix}cancel`,
//! below); appending to a stream publishes `{session} {stream}` to the
//! channel of the replica whose reader holds it. A new reader takes the
//! stream over (the old one ends at its next read), as on one replica. Every
//! operation is one Lua script; the subscription is pinged every 15 s and
//! replaced if it stops answering.
//!
//! A client's `notifications/cancelled` for a request this replica is not
//! serving is published on `{prefix}cancel`, which every replica subscribes
//! to; the replica serving the request passes it upstream (cancellations are
//! rare: one broadcast each costs less than tracking every request in Redis).
//!
//! News about sessions goes on `{prefix}session-events` (every replica
//! subscribes), as [`Event`]s: `opened {session} {upstream}` when a replica
//! recorded a new upstream session for a session (a replica whose client
//! reads the GET stream there listens on it too), `repair {session}` when
//! a replica was asked for a session the store had lost (the replica
//! holding it writes it back at once).
//!
//! The streams have a Redis connection of their own ([`TIMEOUT`] per call),
//! so large events or a slow batch never hold up the session store and rate
//! limits. Writes go through one queue per replica, in order, in round trips
//! of up to 64 writes or 1 MiB, retried while Redis is down (so an outage
//! delays GET-stream messages, it does not lose them); the queue is bounded
//! ([`QUEUE`]), and a full queue, or an event over [`MAX_EVENT_BYTES`], is
//! dropped and counted in `switchboard_stream_events_dropped_total`.

mod scripts;
mod signals;
mod takeover;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use switchboard_core::redis::{RedisError, RedisLink};
use switchboard_protocol::sse::{self, EventId};
use tokio::sync::{mpsc, oneshot, Notify};

use self::scripts::{APPEND, CLOSE, DELIVERED, OPEN, READ, TAKE_OVER};
use self::signals::subscribe;
pub use self::signals::{CancelHandler, Event, EventHandler};
use self::takeover::TakeOver;
pub use self::takeover::{AbandonedHandler, Takeover};

use crate::metrics::Metrics;

/// Events kept per stream (Redis trims approximately).
pub const MAX_EVENTS: usize = 512;
/// Writes waiting for Redis, per replica.
pub const QUEUE: usize = 65_536;
/// An event larger than this is not copied (the local log keeps it).
pub const MAX_EVENT_BYTES: usize = 4 << 20;
/// Events read per round trip, and writes per round trip.
const BATCH: usize = 64;
/// Bytes written per round trip (more events wait for the next one).
const BATCH_BYTES: usize = 1 << 20;
/// A reader looks again this often even without a wake-up (a lost publish).
const POLL: Duration = Duration::from_secs(5);
/// Pause between attempts while Redis does not answer.
const RETRY: Duration = Duration::from_millis(250);
/// Longest wait for one Redis call on the streams' own connection.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// A replica's heartbeat lives this long; it is renewed every second.
const HEARTBEAT_MS: u64 = 3_000;
/// A request stream is abandoned when its replica's heartbeat is gone and
/// nothing was appended for this long.
const ORPHAN_MS: u64 = 3_000;
/// A finished request stream stays resumable this long.
const CLOSED_TTL_MS: u64 = 300_000;
/// A stream taken over goes on numbered this far above the last event in
/// Redis: the replica that died may have sent its client a few events it
/// had not copied yet, whose numbers must not be given to other events (a
/// client resuming after one of them then gets everything that follows).
const TAKEOVER_GAP: u64 = 1_000;
/// Two announcements of the same list change to one session within this
/// long (from several replicas holding it) are one.
const ANNOUNCE_DEDUPE_MS: u64 = 2_000;

/// A write waiting for Redis.
/// What to do when a stream 0 message is refused (its client is not
/// reading): tell the upstream, count it.
pub type OnRefused = Box<dyn FnOnce() + Send + Sync>;

enum Op {
    Append {
        session: Arc<str>,
        stream: u64,
        /// `None`: the next number (stream 0).
        seq: Option<u64>,
        /// Already SSE-encoded (a request stream's event).
        encoded: bool,
        data: Bytes,
        /// Skipped if the same key was appended within the dedupe window.
        dedupe: Option<Arc<str>>,
        /// The upstream's resume point after this event.
        resume: Option<Box<str>>,
        /// Called if Redis refuses the event (stream 0 full of unread
        /// events), once the write is done.
        refused: Option<OnRefused>,
    },
    /// Where a request stream's events come from.
    Origin {
        session: Arc<str>,
        stream: u64,
        origin: String,
    },
    Close {
        session: Arc<str>,
        stream: u64,
    },
    /// The session ended: its GET stream goes.
    Forget {
        session: Arc<str>,
    },
    Flush(oneshot::Sender<()>),
}

impl Op {
    fn bytes(&self) -> usize {
        match self {
            Op::Append { data, .. } => data.len() + 64,
            _ => 64,
        }
    }
}

/// One local reader, woken by its replica's channel.
struct Waiter {
    stream: u64,
    nonce: u64,
    notify: Notify,
    /// Set by [`SharedStreams::cut_session`]: end now.
    cut: AtomicBool,
}

/// Local readers by session.
type Waiters = HashMap<Arc<str>, Vec<Arc<Waiter>>>;

/// This replica's access to the shared streams.
pub struct SharedStreams {
    /// A connection of the streams' own: large events and slow batches do
    /// not hold up (or put in back-off) the session store and rate limits.
    link: Arc<RedisLink>,
    /// This replica's name in reader tokens, its wake channel and heartbeat.
    replica: String,
    ttl_ms: u64,
    queue: mpsc::Sender<Op>,
    waiters: Mutex<Waiters>,
    on_cancel: std::sync::OnceLock<CancelHandler>,
    on_event: std::sync::OnceLock<EventHandler>,
    on_abandoned: std::sync::OnceLock<AbandonedHandler>,
    next_reader: AtomicU64,
    /// Whether the full queue was reported and has not drained since.
    warned_full: AtomicBool,
    metrics: Arc<Metrics>,
    append: redis::Script,
    close: redis::Script,
    open: redis::Script,
    read: redis::Script,
    delivered: redis::Script,
    take_over: redis::Script,
}

/// What a reader got from one read.
enum Read {
    /// Another reader holds the stream now.
    TakenOver,
    Batch {
        closed: bool,
        /// The replica serving the request is gone: no more events will come.
        abandoned: bool,
        events: Vec<(u64, Bytes)>,
    },
}

impl SharedStreams {
    /// Starts the writer, the heartbeat and this replica's subscriptions on
    /// `link` (a connection for the streams only). `ttl` is how long a
    /// stream outlives its last write (the session idle timeout).
    pub fn start(link: Arc<RedisLink>, ttl: Duration, metrics: Arc<Metrics>) -> Arc<SharedStreams> {
        let (queue, writes) = mpsc::channel(QUEUE);
        let shared = Arc::new(SharedStreams {
            replica: switchboard_core::ids::random_id()[..16].to_owned(),
            ttl_ms: ttl.as_millis().max(1000) as u64,
            queue,
            waiters: Mutex::new(HashMap::new()),
            on_cancel: std::sync::OnceLock::new(),
            on_event: std::sync::OnceLock::new(),
            on_abandoned: std::sync::OnceLock::new(),
            next_reader: AtomicU64::new(1),
            warned_full: AtomicBool::new(false),
            metrics,
            append: redis::Script::new(APPEND),
            close: redis::Script::new(CLOSE),
            open: redis::Script::new(OPEN),
            read: redis::Script::new(READ),
            delivered: redis::Script::new(DELIVERED),
            take_over: redis::Script::new(TAKE_OVER),
            link,
        });
        tokio::spawn(write(Arc::downgrade(&shared), writes));
        tokio::spawn(subscribe(Arc::downgrade(&shared)));
        tokio::spawn(heartbeat(Arc::downgrade(&shared)));
        shared
    }

    fn log_key(&self, session: &str, stream: u64) -> String {
        format!("{}ev:{session}:{stream}", self.link.prefix)
    }

    fn meta_key(&self, session: &str, stream: u64) -> String {
        format!("{}evm:{session}:{stream}", self.link.prefix)
    }

    fn wake_prefix(&self) -> String {
        format!("{}wake:", self.link.prefix)
    }

    fn heartbeat_prefix(&self) -> String {
        format!("{}replica:", self.link.prefix)
    }

    /// Queues a message for a session's stream 0 (numbered by Redis).
    /// `refused` is called if the message is not delivered: at once if the
    /// write cannot even be queued (then `false`), or once Redis finds the
    /// stream full of events its client has not read.
    pub fn push(&self, session: &Arc<str>, message: Bytes, refused: Option<OnRefused>) -> bool {
        self.append_to_stream_zero(session, message, None, refused)
    }

    /// Queues an announcement (a list change) for a session's stream 0: the
    /// same announcement from several replicas within a moment is sent once.
    pub fn announce(&self, session: &Arc<str>, message: Bytes, what: Arc<str>) {
        let _ = self.append_to_stream_zero(session, message, Some(what), None);
    }

    fn append_to_stream_zero(
        &self,
        session: &Arc<str>,
        message: Bytes,
        dedupe: Option<Arc<str>>,
        refused: Option<OnRefused>,
    ) -> bool {
        let append = Op::Append {
            session: session.clone(),
            stream: 0,
            seq: None,
            encoded: false,
            data: message,
            dedupe,
            resume: None,
            refused,
        };
        match self.enqueue(append) {
            Ok(()) => true,
            Err(Op::Append { refused: Some(on_refused), .. }) => {
                on_refused();
                false
            }
            Err(_) => false,
        }
    }

    /// Queues an event of a spilled stream, already encoded, with its
    /// number (and, for an event relayed from an upstream's stream, where
    /// the upstream could resume it after this event).
    pub fn spill(&self, session: &Arc<str>, stream: u64, seq: u64, event: Bytes, resume: Option<&str>) {
        let _ = self.enqueue(Op::Append {
            session: session.clone(),
            stream,
            seq: Some(seq),
            encoded: true,
            data: event,
            dedupe: None,
            resume: resume.map(Box::from),
            refused: None,
        });
    }

    /// Queues the end of a spilled stream: its readers end after its last event.
    pub fn spill_closed(&self, session: &Arc<str>, stream: u64) {
        let _ = self.enqueue(Op::Close { session: session.clone(), stream });
    }

    /// Queues the removal of an ended session's GET stream (request streams
    /// expire on their own, shortly after their answer).
    pub fn forget(&self, session: &Arc<str>) {
        let _ = self.enqueue(Op::Forget { session: session.clone() });
    }

    /// Queues a write; gives it back if it was dropped (too large, or the
    /// queue is full).
    fn enqueue(&self, op: Op) -> Result<(), Op> {
        if op.bytes() > MAX_EVENT_BYTES {
            self.metrics.stream_event_dropped();
            tracing::debug!(bytes = op.bytes(), "an event too large to copy to Redis; only this replica can replay it");
            return Err(op);
        }
        if let Err(full) = self.queue.try_send(op) {
            self.metrics.stream_event_dropped();
            // Once per burst, not once per event.
            if !self.warned_full.swap(true, Ordering::Relaxed) {
                tracing::warn!("shared stream queue full (Redis too slow or down): events are dropped");
            }
            return Err(full.into_inner());
        }
        if self.warned_full.load(Ordering::Relaxed) && self.queue.capacity() > QUEUE / 2 {
            self.warned_full.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Waits (at most `limit`) until every write queued so far reached Redis.
    pub async fn flush(&self, limit: Duration) -> bool {
        let (done, wait) = oneshot::channel();
        tokio::time::timeout(limit, async { self.queue.send(Op::Flush(done)).await.is_ok() && wait.await.is_ok() })
            .await
            .unwrap_or(false)
    }

    /// Opens a reader of `stream` for one response, sending events after
    /// `after` (for `None`: after what earlier readers delivered, or from the
    /// start) into `tx`. `Ok(false)`: a request stream nobody spilled.
    /// `guard` is dropped when the reader ends, however it ends.
    pub async fn reader<G: Send + 'static>(
        self: &Arc<Self>,
        session: &Arc<str>,
        stream: u64,
        after: Option<u64>,
        tx: mpsc::Sender<Bytes>,
        guard: G,
    ) -> Result<bool, RedisError> {
        let nonce = self.next_reader.fetch_add(1, Ordering::Relaxed);
        let token = format!("{}:{nonce}", self.replica);
        let waiter = Arc::new(Waiter { stream, nonce, notify: Notify::new(), cut: AtomicBool::new(false) });
        self.waiters.lock().expect("lock").entry(session.clone()).or_default().push(waiter.clone());
        let registered = Registered { shared: Arc::downgrade(self), session: session.clone(), nonce };
        let mut invocation = self.open.prepare_invoke();
        invocation.key(self.meta_key(session, stream));
        invocation.arg(&token).arg(self.ttl_ms).arg(self.wake_prefix()).arg(format!("{session} {stream}"));
        invocation.arg(if stream == 0 { "0" } else { "1" });
        let opened: Option<Vec<String>> =
            self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?;
        let Some(opened) = opened else { return Ok(false) };
        let after = after.or_else(|| opened.first().and_then(|d| d.parse().ok()));
        let shared = self.clone();
        let session = session.clone();
        tokio::spawn(async move {
            shared.read_loop(&session, stream, &token, after, &waiter, tx).await;
            drop(registered);
            drop(guard);
        });
        Ok(true)
    }

    async fn read_loop(
        &self,
        session: &str,
        stream: u64,
        token: &str,
        mut after: Option<u64>,
        waiter: &Waiter,
        tx: mpsc::Sender<Bytes>,
    ) {
        loop {
            let woken = waiter.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if waiter.cut.load(Ordering::Relaxed) {
                break;
            }
            let full = match self.read_once(session, stream, token, after).await {
                Ok(Read::TakenOver) => break,
                Ok(Read::Batch { closed, abandoned, events }) => {
                    let full = events.len() == BATCH;
                    let sent = after;
                    for (seq, event) in events {
                        if tx.send(event).await.is_err() {
                            break;
                        }
                        after = Some(seq);
                    }
                    if after != sent {
                        if let Some(seq) = after {
                            self.record_delivered(session, stream, seq, token).await;
                        }
                    }
                    if tx.is_closed() || (closed && !full) {
                        break;
                    }
                    if abandoned && !full {
                        match self.take_over(session, stream).await {
                            // Continued here from now: events follow.
                            Ok(TakeOver::Taken(mut takeover)) => match self.on_abandoned.get() {
                                Some(handler) => {
                                    // Numbered above what this reader's client
                                    // has seen too (events the dead replica
                                    // sent it but never copied).
                                    takeover.next = takeover.next.max(after.map_or(0, |seq| seq + 1));
                                    handler(session, stream, takeover)
                                }
                                None => break,
                            },
                            // Another replica serves it (it took it over).
                            Ok(TakeOver::Served) => {}
                            Ok(TakeOver::Impossible) => break,
                            Err(e) => {
                                self.metrics.store_error("stream_take_over");
                                tracing::debug!(error = %e, "cannot take an abandoned stream over; trying again");
                            }
                        }
                    }
                    full
                }
                Err(e) => {
                    self.metrics.store_error("stream_read");
                    tracing::debug!(error = %e, "cannot read a shared stream; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = tx.closed() => return,
                    }
                    continue;
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep(POLL) => {}
                () = tx.closed() => break,
            }
        }
    }

    /// Records what a reader sent (best effort: a reader that cannot tell
    /// Redis means at worst a few events sent twice to a client that
    /// reconnects without `Last-Event-ID`).
    async fn record_delivered(&self, session: &str, stream: u64, seq: u64, token: &str) {
        let mut invocation = self.delivered.prepare_invoke();
        invocation.key(self.meta_key(session, stream)).arg(seq).arg(token);
        let result = self
            .link
            .call(|mut c| async move {
                let _: redis::Value = invocation.invoke_async(&mut c).await?;
                Ok(())
            })
            .await;
        if let Err(e) = result {
            self.metrics.store_error("stream_delivered");
            tracing::debug!(error = %e, "cannot record what a shared stream reader sent");
        }
    }

    async fn read_once(&self, session: &str, stream: u64, token: &str, after: Option<u64>) -> Result<Read, RedisError> {
        let mut invocation = self.read.prepare_invoke();
        invocation.key(self.log_key(session, stream)).key(self.meta_key(session, stream));
        invocation.arg(token).arg(after.map(|a| a.to_string()).unwrap_or_default());
        invocation.arg(BATCH).arg(self.ttl_ms).arg(self.heartbeat_prefix()).arg(ORPHAN_MS);
        invocation.arg(if stream == 0 { "0" } else { "1" });
        let value: redis::Value =
            self.link.call(|mut c| async move { Ok(invocation.invoke_async(&mut c).await?) }).await?;
        parse_read(stream, value)
    }

    /// Ends this replica's readers of a session's streams (the client
    /// reconnects, here or elsewhere).
    pub fn cut_session(&self, session: &str) {
        let waiters = self.waiters.lock().expect("lock");
        for waiter in waiters.get(session).into_iter().flatten() {
            waiter.cut.store(true, Ordering::Relaxed);
            waiter.notify.notify_one();
        }
    }

    fn wake(&self, session: &str, stream: u64) {
        let waiters = self.waiters.lock().expect("lock");
        for waiter in waiters.get(session).into_iter().flatten().filter(|w| w.stream == stream) {
            waiter.notify.notify_one();
        }
    }

    fn wake_all(&self) {
        for waiter in self.waiters.lock().expect("lock").values().flatten() {
            waiter.notify.notify_one();
        }
    }

    /// Writes a batch in one round trip (a pipeline of scripts); returns
    /// the positions in `batch` of the appends Redis refused.
    async fn execute(&self, batch: &[Op]) -> Result<Vec<usize>, RedisError> {
        let mut pipe = redis::pipe();
        let mut any = false;
        for op in batch {
            match op {
                Op::Forget { session } => {
                    pipe.cmd("DEL").arg(self.log_key(session, 0)).arg(self.meta_key(session, 0)).ignore();
                    any = true;
                }
                Op::Origin { session, stream, origin } => {
                    let meta = self.meta_key(session, *stream);
                    pipe.cmd("HSET").arg(&meta).arg("origin").arg(origin).ignore();
                    pipe.cmd("PEXPIRE").arg(&meta).arg(self.ttl_ms).ignore();
                    any = true;
                }
                _ => {}
            }
        }
        // Each invocation with whether its answer is wanted, and where.
        let invocations: Vec<(usize, bool, redis::ScriptInvocation<'_>)> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, op)| {
                // Only a GET stream's appends can be refused.
                let watched = matches!(op, Op::Append { seq: None, dedupe: None, .. });
                self.invocation(op).map(|invocation| (i, watched, invocation))
            })
            .collect();
        if invocations.is_empty() && !any {
            return Ok(Vec::new());
        }
        pipe.load_script(&self.append).ignore().load_script(&self.close).ignore();
        let mut watched = Vec::new();
        for (i, watch, invocation) in &invocations {
            pipe.invoke_script(invocation);
            if *watch {
                watched.push(*i);
            } else {
                pipe.ignore();
            }
        }
        let answers: Vec<redis::Value> = self
            .link
            .call(|mut c| async move {
                let answers: Vec<redis::Value> = pipe.query_async(&mut c).await?;
                Ok(answers)
            })
            .await?;
        Ok(watched
            .into_iter()
            .zip(answers)
            .filter(|(_, answer)| matches!(answer, redis::Value::Int(2)))
            .map(|(i, _)| i)
            .collect())
    }

    fn invocation(&self, op: &Op) -> Option<redis::ScriptInvocation<'_>> {
        let wake = |invocation: &mut redis::ScriptInvocation<'_>, session: &str, stream: u64| {
            invocation.arg(self.wake_prefix()).arg(format!("{session} {stream}"));
        };
        match op {
            Op::Append { session, stream, seq, encoded, data, dedupe, resume, .. } => {
                let mut invocation = self.append.prepare_invoke();
                invocation.key(self.log_key(session, *stream)).key(self.meta_key(session, *stream));
                invocation.key(format!("{}evd:{session}:{}", self.link.prefix, dedupe.as_deref().unwrap_or("")));
                invocation.arg(seq.map(|s| s.to_string()).unwrap_or_default());
                invocation.arg(if *encoded { "e" } else { "m" }).arg(&data[..]);
                invocation.arg(MAX_EVENTS).arg(self.ttl_ms);
                wake(&mut invocation, session, *stream);
                invocation.arg(if seq.is_some() { self.replica.as_str() } else { "" });
                invocation.arg(if dedupe.is_some() { ANNOUNCE_DEDUPE_MS.to_string() } else { String::new() });
                invocation.arg(resume.as_deref().unwrap_or(""));
                Some(invocation)
            }
            Op::Close { session, stream } => {
                let mut invocation = self.close.prepare_invoke();
                invocation.key(self.meta_key(session, *stream)).key(self.log_key(session, *stream));
                invocation.arg(CLOSED_TTL_MS.min(self.ttl_ms));
                wake(&mut invocation, session, *stream);
                Some(invocation)
            }
            Op::Forget { .. } | Op::Origin { .. } | Op::Flush(_) => None,
        }
    }
}

/// Removes a reader's waiter when the reader ends.
struct Registered {
    shared: Weak<SharedStreams>,
    session: Arc<str>,
    nonce: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else { return };
        let mut waiters = shared.waiters.lock().expect("lock");
        if let Some(list) = waiters.get_mut(&self.session) {
            list.retain(|w| w.nonce != self.nonce);
            if list.is_empty() {
                waiters.remove(&self.session);
            }
        }
    }
}

/// The writer: every queued write, in order, in round trips of up to
/// [`BATCH`] writes and [`BATCH_BYTES`], each retried until Redis takes it.
/// A retry after a timeout may write a GET-stream message twice (Redis may
/// have taken the first attempt); request-stream events carry their numbers
/// and are written once.
async fn write(shared: Weak<SharedStreams>, mut writes: mpsc::Receiver<Op>) {
    let mut batch = Vec::with_capacity(BATCH);
    while writes.recv_many(&mut batch, BATCH).await > 0 {
        let mut refused = Vec::new();
        let mut from = 0;
        while from < batch.len() {
            let mut to = from;
            let mut bytes = 0;
            while to < batch.len() && (to == from || bytes + batch[to].bytes() <= BATCH_BYTES) {
                bytes += batch[to].bytes();
                to += 1;
            }
            loop {
                let Some(streams) = shared.upgrade() else { return };
                match streams.execute(&batch[from..to]).await {
                    Ok(these) => {
                        refused.extend(these.into_iter().map(|i| from + i));
                        break;
                    }
                    Err(e) => {
                        streams.metrics.store_error("stream_write");
                        tracing::debug!(error = %e, "cannot write shared stream events yet; retrying");
                        drop(streams);
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
            from = to;
        }
        for (i, op) in batch.drain(..).enumerate() {
            match op {
                Op::Flush(done) => {
                    let _ = done.send(());
                }
                Op::Append { refused: on_refused, .. } if refused.contains(&i) => match on_refused {
                    Some(on_refused) => on_refused(),
                    None => {
                        if let Some(streams) = shared.upgrade() {
                            streams.metrics.stream_event_dropped();
                        }
                        tracing::debug!("a GET stream message refused: its client has not read the 512 before it");
                    }
                },
                _ => {}
            }
        }
    }
}

/// Tells the other replicas this one is alive: readers of its request
/// streams elsewhere end them if it dies before answering.
async fn heartbeat(shared: Weak<SharedStreams>) {
    loop {
        let Some(streams) = shared.upgrade() else { return };
        let key = format!("{}{}", streams.heartbeat_prefix(), streams.replica);
        let result = streams
            .link
            .call(|mut c| async move {
                let _: redis::Value =
                    redis::cmd("SET").arg(key).arg("1").arg("PX").arg(HEARTBEAT_MS).query_async(&mut c).await?;
                Ok(())
            })
            .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "cannot renew this replica's heartbeat");
        }
        drop(streams);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `{0}` or `{1, closed, [[id, [field, value]], …]}` as events.
fn parse_read(stream: u64, value: redis::Value) -> Result<Read, RedisError> {
    use redis::Value;
    let bad = |what: &str| RedisError::Answer(format!("shared stream read: {what}"));
    let Value::Array(parts) = value else { return Err(bad("not an array")) };
    let mut parts = parts.into_iter();
    match parts.next() {
        Some(Value::Int(0)) => return Ok(Read::TakenOver),
        Some(Value::Int(1)) => {}
        _ => return Err(bad("no status")),
    }
    let closed = matches!(parts.next(), Some(Value::Int(1)));
    let Some(Value::Array(entries)) = parts.next() else { return Err(bad("no entries")) };
    let abandoned = matches!(parts.next(), Some(Value::Int(1)));
    let mut events = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(entry) = entry else { return Err(bad("entry")) };
        let mut entry = entry.into_iter();
        let id = match entry.next() {
            Some(Value::BulkString(id)) => String::from_utf8(id).map_err(|_| bad("entry id"))?,
            _ => return Err(bad("entry id")),
        };
        let seq: u64 = id.strip_prefix("1-").and_then(|s| s.parse().ok()).ok_or_else(|| bad("entry id"))?;
        let Some(Value::Array(fields)) = entry.next() else { return Err(bad("entry fields")) };
        let mut fields = fields.into_iter();
        let (Some(Value::BulkString(field)), Some(Value::BulkString(data))) = (fields.next(), fields.next()) else {
            return Err(bad("entry fields"));
        };
        let event = match &field[..] {
            b"e" => Bytes::from(data),
            _ => sse::encode_with_id(EventId { stream, seq }, None, &data),
        };
        events.push((seq, event));
    }
    Ok(Read::Batch { closed, abandoned, events })
}
