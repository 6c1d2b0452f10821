//! Downstream sessions: what the router remembers between a client's requests.
//!
//! A [`Session`] is created by `initialize` and named by the router-issued
//! `Mcp-Session-Id`. It holds the negotiated version and the client's
//! capabilities, one upstream channel per upstream it has used (opened on
//! first use, declaring the client's capabilities), the server-to-client
//! requests relayed to it (so its answers find their way back), its requests
//! in flight (so its cancellations do), and its event streams (`events.rs`):
//! stream 0 for messages not tied to a request (the GET stream, kept while no
//! GET stream is open), and one per request answered as SSE, all resumable
//! with `Last-Event-ID`.
//!
//! [`Sessions`] is the in-memory registry, sharded to keep lock hold times
//! short. A session never sees another session's messages: everything it
//! receives comes through its own channels or its own streams.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::value::RawValue;
use switchboard_protocol::jsonrpc::{span, Envelope};
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::ProtocolVersion;
use tokio::sync::{mpsc, OnceCell};

use crate::app::App;
use crate::catalog::naming::fnv1a64;
use crate::error::Error;
use crate::events::Log;
use crate::upstream::{Channel, Hello, Inbox};

/// Events buffered between a stream's log and its HTTP response.
const STREAM_BUFFER: usize = 64;
/// Request streams kept for resumption.
const KEPT_STREAMS: usize = 32;
/// Unanswered server-to-client requests remembered per session.
pub const MAX_ASKED: usize = 1024;

/// One client session.
pub struct Session {
    /// The router-issued `Mcp-Session-Id`.
    pub id: Arc<str>,
    /// The tenant whose key created it: only that tenant's keys may use it.
    pub tenant: Arc<str>,
    /// The negotiated protocol version.
    pub version: ProtocolVersion,
    /// What the client declared in `initialize`.
    pub capabilities: Arc<RawValue>,
    /// A legacy HTTP+SSE session: its answers travel on stream 0, which the
    /// client cannot resume.
    pub legacy: bool,
    channels: Box<[OnceCell<Arc<dyn Channel>>]>,
    asked: Mutex<HashMap<u64, (usize, Box<str>)>>,
    next_asked: AtomicU64,
    /// Requests in flight: (hash of the client's id, upstream). A vector that
    /// keeps its capacity, so tracking a request costs no allocation.
    inflight: Mutex<Vec<(u64, usize)>>,
    /// Stream 0: messages not tied to a request.
    standalone: Arc<Log>,
    /// Whether a GET stream was ever opened: upstream channels then listen.
    listening: AtomicBool,
    /// Recent request streams, for resumption.
    streams: Mutex<VecDeque<Arc<Log>>>,
    next_stream: AtomicU64,
    /// Milliseconds since the router started, at the last request.
    last_used: AtomicU64,
    epoch: Instant,
    closed: AtomicBool,
    me: Weak<Session>,
}

impl Session {
    /// A new session with a fresh random id.
    pub fn new(
        tenant: Arc<str>,
        version: ProtocolVersion,
        capabilities: Arc<RawValue>,
        upstreams: usize,
        epoch: Instant,
    ) -> Arc<Self> {
        Self::build(new_session_id(), tenant, false, version, capabilities, upstreams, epoch)
    }

    /// A legacy HTTP+SSE session, named by its connection's id.
    pub fn legacy(
        id: Arc<str>,
        tenant: Arc<str>,
        version: ProtocolVersion,
        capabilities: Arc<RawValue>,
        upstreams: usize,
        epoch: Instant,
    ) -> Arc<Self> {
        Self::build(id, tenant, true, version, capabilities, upstreams, epoch)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        id: Arc<str>,
        tenant: Arc<str>,
        legacy: bool,
        version: ProtocolVersion,
        capabilities: Arc<RawValue>,
        upstreams: usize,
        epoch: Instant,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Session {
            id,
            tenant,
            legacy,
            version,
            capabilities,
            channels: (0..upstreams).map(|_| OnceCell::new()).collect(),
            asked: Mutex::new(HashMap::new()),
            next_asked: AtomicU64::new(1),
            inflight: Mutex::new(Vec::new()),
            standalone: Log::new(0),
            listening: AtomicBool::new(false),
            streams: Mutex::new(VecDeque::new()),
            next_stream: AtomicU64::new(1),
            last_used: AtomicU64::new(epoch.elapsed().as_millis() as u64),
            epoch,
            closed: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    /// Records use, for idle expiry.
    pub fn touch(&self) {
        self.last_used.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the last request.
    pub fn idle(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_used.load(Ordering::Relaxed)))
    }

    /// Whether the session is in use even without new requests: a request
    /// in flight, or a client reading its GET stream.
    pub fn busy(&self) -> bool {
        !self.inflight.lock().expect("lock").is_empty() || self.standalone.has_readers()
    }

    /// The channel to upstream `u`, opened on first use with this client's
    /// version and capabilities.
    pub async fn channel(&self, app: &Arc<App>, u: usize) -> Result<Arc<dyn Channel>, Error> {
        if let Some(channel) = self.channels[u].get() {
            return Ok(channel.clone());
        }
        let upstream = &app.upstreams[u];
        let channel = self.channels[u]
            .get_or_try_init(|| async {
                let hello = Hello { protocol_version: self.version, capabilities: self.capabilities.clone() };
                let inbox: Arc<dyn Inbox> =
                    Arc::new(SessionInbox { app: Arc::downgrade(app), session: self.me.clone(), upstream: u });
                let opened =
                    tokio::time::timeout(upstream.config.timeout, upstream.transport.open(&hello, inbox)).await;
                let channel = match opened {
                    Ok(Ok(channel)) => channel,
                    Ok(Err(e)) => return Err(Error::upstream(&upstream.name, e)),
                    Err(_) => {
                        return Err(Error::UpstreamTimeout {
                            upstream: upstream.name.clone(),
                            after: upstream.config.timeout,
                        })
                    }
                };
                if self.listening.load(Ordering::Relaxed) {
                    channel.listen();
                }
                Ok(channel)
            })
            .await?;
        if self.closed.load(Ordering::Relaxed) {
            channel.close().await;
            return Err(Error::UnknownSession);
        }
        Ok(channel.clone())
    }

    /// The channel to upstream `u` if it is already open.
    pub fn open_channel(&self, u: usize) -> Option<Arc<dyn Channel>> {
        self.channels.get(u).and_then(|c| c.get()).cloned()
    }

    /// Every open channel with its upstream index.
    pub fn open_channels(&self) -> Vec<(usize, Arc<dyn Channel>)> {
        self.channels.iter().enumerate().filter_map(|(u, c)| c.get().map(|c| (u, c.clone()))).collect()
    }

    /// Sends a message on the session's GET stream, or keeps it (bounded)
    /// for when one opens.
    pub fn push(&self, message: Bytes) {
        self.standalone.push(&message);
    }

    /// A new stream for the answer to one request.
    pub fn new_stream(&self) -> Arc<Log> {
        let log = Log::new(self.next_stream.fetch_add(1, Ordering::Relaxed));
        let mut streams = self.streams.lock().expect("lock");
        // A stream whose every event reached the client needs no replay.
        streams.retain(|l| !l.finished());
        streams.push_back(log.clone());
        while streams.len() > KEPT_STREAMS {
            streams.pop_front();
        }
        log
    }

    /// Opens (or takes over) an SSE stream for a GET: the standalone stream
    /// from where the last reader left it, or — with `Last-Event-ID` — any of
    /// the session's streams from just after that event. Upstream channels
    /// start listening from the first GET on.
    pub fn open_stream(&self, resume: Option<(u64, u64)>) -> Result<mpsc::Receiver<Bytes>, Error> {
        let (log, after) = match resume {
            None => (self.standalone.clone(), self.standalone.undelivered()),
            Some((0, seq)) => (self.standalone.clone(), Some(seq)),
            Some((stream, seq)) => {
                let streams = self.streams.lock().expect("lock");
                let log = streams.iter().find(|l| l.stream == stream).cloned().ok_or(Error::UnknownStream)?;
                (log, Some(seq))
            }
        };
        // Only one response reads a stream at a time: a reconnecting client
        // takes over from the connection it lost.
        log.cut();
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let standalone = log.stream == 0;
        tokio::spawn(log.reader(after, tx));
        if standalone && !self.listening.swap(true, Ordering::Relaxed) {
            for (_, channel) in self.open_channels() {
                channel.listen();
            }
        }
        Ok(rx)
    }

    /// Registers a server-to-client request from upstream `u` and returns it
    /// with an id of the router's, unique in this session. At most
    /// [`MAX_ASKED`] unanswered requests are remembered; the oldest go first.
    pub fn ask(&self, u: usize, env: &Envelope<'_>, message: &[u8]) -> Bytes {
        let their_id = env.id.expect("a request has an id");
        let ours = self.next_asked.fetch_add(1, Ordering::Relaxed);
        {
            let mut asked = self.asked.lock().expect("lock");
            asked.insert(ours, (u, their_id.get().into()));
            if asked.len() > MAX_ASKED {
                if let Some(oldest) = asked.keys().min().copied() {
                    asked.remove(&oldest);
                }
            }
        }
        let ours = ours.to_string();
        splice(message, &mut [Edit::new(span(message, their_id.get()), ours.as_bytes())])
    }

    /// Takes the record of a relayed request, given the id the client answered with.
    pub fn answered(&self, id: &RawValue) -> Option<(usize, Box<str>)> {
        let ours: u64 = id.get().parse().ok()?;
        self.asked.lock().expect("lock").remove(&ours)
    }

    /// Our id for a relayed request the upstream cancelled (given its id); the
    /// request is forgotten, as no answer will be taken.
    pub fn asked_cancelled(&self, u: usize, their_id: &str) -> Option<u64> {
        let mut asked = self.asked.lock().expect("lock");
        let ours = asked.iter().find(|(_, (up, id))| *up == u && **id == *their_id).map(|(ours, _)| *ours)?;
        asked.remove(&ours);
        Some(ours)
    }

    /// Notes a request in flight to upstream `u`.
    pub fn begin(&self, id: &RawValue, u: usize) {
        self.inflight.lock().expect("lock").push((fnv1a64(id.get().as_bytes()), u));
    }

    /// Notes that a request finished.
    pub fn end(&self, id: &str) {
        let key = fnv1a64(id.as_bytes());
        let mut inflight = self.inflight.lock().expect("lock");
        if let Some(i) = inflight.iter().position(|(k, _)| *k == key) {
            inflight.swap_remove(i);
        }
    }

    /// The upstream a request in flight went to.
    pub fn inflight_upstream(&self, id: &RawValue) -> Option<usize> {
        let key = fnv1a64(id.get().as_bytes());
        self.inflight.lock().expect("lock").iter().find(|(k, _)| *k == key).map(|(_, u)| *u)
    }

    /// Ends the session: closes its stream and its upstream sessions.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.close_stream();
        for (_, channel) in self.open_channels() {
            channel.close().await;
        }
    }

    /// Ends the response reading the session's GET stream (the client may
    /// reconnect, here or elsewhere). Answers in flight go on; a legacy
    /// session's only stream carries its answers, so it is left alone.
    pub fn close_stream(&self) {
        if !self.legacy {
            self.standalone.cut();
        }
    }
}

/// Where a session's upstream channels deliver messages not tied to a request.
struct SessionInbox {
    app: Weak<App>,
    session: Weak<Session>,
    upstream: usize,
}

impl Inbox for SessionInbox {
    fn deliver(&self, message: Bytes) {
        let (Some(app), Some(session)) = (self.app.upgrade(), self.session.upgrade()) else { return };
        if let Some(out) = app.relay_from_upstream(&session, self.upstream, &message) {
            session.push(out);
        }
    }
}

/// 128 random bits as 32 hex digits.
pub fn new_session_id() -> Arc<str> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).expect("the OS provides randomness");
    let mut id = String::with_capacity(32);
    for b in raw {
        id.push(char::from_digit(u32::from(b >> 4), 16).expect("hex"));
        id.push(char::from_digit(u32::from(b & 15), 16).expect("hex"));
    }
    Arc::from(id)
}

const SHARDS: usize = 16;

/// The in-memory session registry.
pub struct Sessions {
    shards: Vec<RwLock<HashMap<Arc<str>, Arc<Session>>>>,
    count: AtomicU64,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions { shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(), count: AtomicU64::new(0) }
    }
}

impl Sessions {
    fn shard(&self, id: &str) -> &RwLock<HashMap<Arc<str>, Arc<Session>>> {
        &self.shards[fnv1a64(id.as_bytes()) as usize % SHARDS]
    }

    /// Adds a session.
    pub fn insert(&self, session: Arc<Session>) {
        self.shard(&session.id).write().expect("lock").insert(session.id.clone(), session);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The session with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.shard(id).read().expect("lock").get(id).cloned()
    }

    /// Removes and returns a session.
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let removed = self.shard(id).write().expect("lock").remove(id);
        if removed.is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed) as usize
    }

    /// Every live session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.shards.iter().flat_map(|s| s.read().expect("lock").values().cloned().collect::<Vec<_>>()).collect()
    }

    /// Removes and returns the sessions idle for longer than `idle`.
    pub fn take_expired(&self, idle: Duration) -> Vec<Arc<Session>> {
        let mut expired = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.write().expect("lock");
            shard.retain(|_, s| {
                if s.idle() > idle && !s.busy() {
                    expired.push(s.clone());
                    false
                } else {
                    true
                }
            });
        }
        self.count.fetch_sub(expired.len() as u64, Ordering::Relaxed);
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::empty_object;

    fn session() -> Arc<Session> {
        Session::new(Arc::from("t"), ProtocolVersion::LATEST, Arc::from(empty_object()), 2, Instant::now())
    }

    #[test]
    fn ids_are_random_hex() {
        let (a, b) = (session(), session());
        assert_eq!(a.id.len(), 32);
        assert!(a.id.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn relayed_requests_get_session_unique_ids_and_map_back() {
        let s = session();
        let msg = br#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{}}"#;
        let env = Envelope::parse(msg).unwrap();
        let first = s.ask(0, &env, msg);
        let second = s.ask(1, &env, msg);
        let id1 = Envelope::parse(&first).unwrap().id.unwrap().get().to_owned();
        let id2 = Envelope::parse(&second).unwrap().id.unwrap().get().to_owned();
        assert_ne!(id1, id2, "two upstreams using id 1 must not collide");
        let raw = RawValue::from_string(id2.clone()).unwrap();
        assert_eq!(s.answered(&raw), Some((1, "1".into())));
        assert_eq!(s.answered(&raw), None, "an answer is routed once");
        // An upstream cancelling its request: mapped, then forgotten.
        assert_eq!(s.asked_cancelled(0, "1").map(|n| n.to_string()), Some(id1));
        assert_eq!(s.asked_cancelled(0, "1"), None);
    }

    #[tokio::test]
    async fn messages_wait_for_the_get_stream_and_a_new_get_takes_over() {
        let s = session();
        s.push(Bytes::from_static(b"{\"n\":1}"));
        let mut first = s.open_stream(None).unwrap();
        let event = first.recv().await.unwrap();
        assert_eq!(&event[..], b"id: 0-0\ndata: {\"n\":1}\n\n", "queued before the GET, with an event id");
        // A second GET takes over: the first ends, the new one gets only what is new.
        let mut second = s.open_stream(None).unwrap();
        assert!(first.recv().await.is_none());
        s.push(Bytes::from_static(b"{\"n\":2}"));
        assert_eq!(&second.recv().await.unwrap()[..], b"id: 0-1\ndata: {\"n\":2}\n\n");
        // Resuming from an event id replays what followed it.
        let mut resumed = s.open_stream(Some((0, 0))).unwrap();
        assert_eq!(&resumed.recv().await.unwrap()[..], b"id: 0-1\ndata: {\"n\":2}\n\n");
        // An unknown stream is refused.
        assert!(matches!(s.open_stream(Some((99, 0))), Err(Error::UnknownStream)));
    }

    #[test]
    fn registry_counts_and_expires() {
        let sessions = Sessions::default();
        let s = session();
        sessions.insert(s.clone());
        assert_eq!(sessions.len(), 1);
        assert!(sessions.get(&s.id).is_some());
        assert!(sessions.take_expired(Duration::from_secs(60)).is_empty());
        let old = Session::new(
            Arc::from("t"),
            ProtocolVersion::LATEST,
            Arc::from(empty_object()),
            0,
            Instant::now() - Duration::from_secs(120),
        );
        old.last_used.store(0, Ordering::Relaxed);
        sessions.insert(old.clone());
        let expired = sessions.take_expired(Duration::from_secs(60));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].id, old.id);
        assert_eq!(sessions.len(), 1);
        assert!(sessions.get(&old.id).is_none());
    }
}
