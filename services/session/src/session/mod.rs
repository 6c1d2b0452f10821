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
//! A session never sees another session's messages: everything it receives
//! comes through its own channels or its own streams.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use switchboard_core::credential::Credentials;
use switchboard_core::hash::fnv1a64;
use switchboard_core::ids::random_id;
use switchboard_core::UpstreamId;
use switchboard_protocol::jsonrpc::{span, Envelope};
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::sse::EventId;
use switchboard_protocol::ProtocolVersion;
use switchboard_upstream::{Channel, Inbox, UpstreamSession};
use tokio::sync::{mpsc, OnceCell};

use crate::events::Log;
use crate::relayed;
use crate::shared_streams::{OnRefused, SharedStreams};
use crate::store::{Record, Stored};
use crate::{Client, Context, SessionError};

mod upstreams;
use self::upstreams::SessionInbox;

/// A session's credentials for one upstream, made on first use (`None`
/// inside: no vault).
type CredentialsSlot = std::sync::OnceLock<Option<Arc<dyn Credentials>>>;

/// What a session holds for one upstream it used: its channel, the
/// credentials its requests carry, when the channel was opened here.
#[derive(Default)]
struct Link {
    channel: OnceCell<Arc<dyn Channel>>,
    credentials: CredentialsSlot,
    /// When its upstream session was opened here (ms since the epoch; 0:
    /// not known, or opened by another replica).
    opened: AtomicU64,
}

/// The prefix of tenant sessions' ids (see [`Session::for_tenant`]).
pub const TENANT_PREFIX: &str = "t.";

/// The id of the session `tenant`'s stateless calls share, one per user
/// (`owner`: the caller id of a user, whose upstream credentials it
/// carries; `None`: the tenant's, as API keys call): the prefix and 128
/// bits of a SHA-256 of the names.
pub fn tenant_session_id(tenant: &str, owner: Option<&str>) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    digest.update(tenant.as_bytes());
    if let Some(owner) = owner {
        // A tenant's name has no NUL: no (tenant, owner) pair meets another.
        digest.update(b"\0");
        digest.update(owner.as_bytes());
    }
    format!("{TENANT_PREFIX}{}", hex::encode(&digest.finalize()[..16]))
}

/// Events buffered between a stream's log and its HTTP response.
const STREAM_BUFFER: usize = 64;
/// Request streams kept for resumption.
const KEPT_STREAMS: usize = 32;
/// Request streams a tenant session keeps (calls awaiting input).
const TENANT_KEPT_STREAMS: usize = 1024;

/// One client session.
pub struct Session {
    /// The router-issued `Mcp-Session-Id`.
    pub id: Arc<str>,
    /// The tenant whose key created it: only that tenant's keys may use it.
    pub tenant: Arc<str>,
    /// The hash of the API key that opened it (empty without keys).
    pub key: Arc<str>,
    /// The user it acts for, whose upstream credentials its channels
    /// carry; `None`: the tenant's.
    pub user: Option<Arc<str>>,
    /// The negotiated protocol version.
    pub version: ProtocolVersion,
    /// What the client declared in `initialize`.
    pub capabilities: Arc<RawValue>,
    /// A legacy HTTP+SSE session: its answers travel on stream 0, which the
    /// client cannot resume.
    pub legacy: bool,
    /// Kept in the session store (a Streamable HTTP session), so that other
    /// replicas can continue it; legacy and edge sessions are this replica's.
    pub stored: bool,
    /// A tenant's session shared by its stateless calls: its request
    /// streams are read by the calls' rounds, never cut for resumption.
    pub for_tenant: bool,
    /// Request streams kept for resumption (many for a tenant session, whose
    /// calls may wait for their clients' input).
    kept_streams: usize,
    /// When the store last confirmed the session is live (ms since `epoch`).
    checked_ms: AtomicU64,
    /// Upstream sessions that other replicas may continue, by upstream:
    /// loaded from the store (channels resume them on first use) or opened here.
    known: Mutex<Known>,
    /// Each upstream it used, made on first use: few, so a vector. An
    /// upstream retired while the router runs leaves it
    /// ([`drop_upstream`](Self::drop_upstream)).
    links: Mutex<Vec<(UpstreamId, Arc<Link>)>>,
    /// Requests in flight: (hash of the client's id, upstream). A vector that
    /// keeps its capacity, so tracking a request costs no allocation.
    inflight: Mutex<Vec<(u64, UpstreamId)>>,
    /// Stream 0: messages not tied to a request, made when the first is
    /// sent or a GET stream opens ([`Session::standalone`]).
    standalone: OnceLock<Arc<Log>>,
    /// Whether a GET stream was ever opened: upstream channels then listen.
    listening: AtomicBool,
    /// Recent request streams, for resumption.
    streams: Mutex<VecDeque<Arc<Log>>>,
    next_stream: AtomicU64,
    /// With a shared session store: the streams every replica reads, where
    /// stream 0 lives and request streams are copied as they go.
    shared: Option<Arc<SharedStreams>>,
    /// Readers of shared streams running here.
    shared_readers: AtomicUsize,
    /// The level of `logging/setLevel`, for stateless upstreams (which get
    /// it with each request).
    log_level: Mutex<Option<String>>,
    /// Milliseconds since the router started, at the last request.
    last_used: AtomicU64,
    /// When it was opened (ms since the epoch; 0: not known).
    opened_ms: AtomicU64,
    /// What every session of this replica shares: upstreams, store, relay.
    ctx: Arc<Context>,
    closed: AtomicBool,
    /// Closed by [`detach`](Session::detach): the session goes on elsewhere.
    detached: AtomicBool,
    /// Resource subscriptions to stateless (2026-07-28) upstreams, made on
    /// the first (few sessions have any).
    subscriptions: OnceLock<Box<crate::subscriptions::Subscriptions>>,
    me: Weak<Session>,
}

/// What kind of session to build.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// This replica's only, with a fresh id (an edge device's tasks).
    Private,
    /// A legacy HTTP+SSE connection's.
    Legacy,
    /// In the session store.
    Stored,
}

impl Session {
    /// A session of this replica only, with a fresh random id (an edge
    /// device's tasks).
    pub(crate) fn private(ctx: &Arc<Context>, client: Client) -> Arc<Self> {
        Self::build(random_id(), Kind::Private, client, ctx, None)
    }

    /// A new Streamable HTTP session with a fresh random id, to be kept in
    /// the session store.
    pub(crate) fn stored(ctx: &Arc<Context>, client: Client) -> Arc<Self> {
        Self::build(random_id(), Kind::Stored, client, ctx, ctx.shared.clone())
    }

    /// A stored session another replica created (or this one, before it
    /// forgot it), continuing its upstream sessions: `known` by upstream.
    pub(crate) fn adopt(
        ctx: &Arc<Context>,
        id: Arc<str>,
        record: &Record,
        known: HashMap<UpstreamId, UpstreamSession>,
    ) -> Option<Arc<Self>> {
        let version = ProtocolVersion::parse(&record.version)?;
        let capabilities: Arc<RawValue> = Arc::from(RawValue::from_string(record.capabilities.clone()).ok()?);
        let client = Client {
            tenant: Arc::from(record.tenant.as_str()),
            key: Arc::from(record.key.as_str()),
            user: record.user.as_deref().map(Arc::from),
            version,
            capabilities,
        };
        let session = Self::build(id, Kind::Stored, client, ctx, ctx.shared.clone());
        *session.known.lock().expect("lock") = Known(known.into_iter().collect());
        session.opened_ms.store(record.opened_ms, Ordering::Relaxed);
        Some(session)
    }

    /// The session `tenant`'s stateless calls to session-based upstreams
    /// share, named `id` ([`tenant_session_id`]), kept in the store: one
    /// per user (`owner` their caller id, kept as the session's key). It
    /// declares sampling, elicitation and roots: each call's round checks
    /// what its own client declared.
    pub(crate) fn for_tenant(
        ctx: &Arc<Context>,
        id: String,
        tenant: Arc<str>,
        user: Option<Arc<str>>,
        owner: Option<Arc<str>>,
    ) -> Arc<Self> {
        let capabilities =
            RawValue::from_string(r#"{"sampling":{},"elicitation":{"form":{},"url":{}},"roots":{}}"#.into())
                .expect("valid JSON");
        let client = Client {
            tenant,
            key: owner.unwrap_or_else(|| Arc::from("")),
            user,
            version: ProtocolVersion::LATEST,
            capabilities: Arc::from(capabilities),
        };
        Self::build(Arc::from(id), Kind::Stored, client, ctx, ctx.shared.clone())
    }

    /// A legacy HTTP+SSE session, named by its connection's id.
    pub(crate) fn legacy(ctx: &Arc<Context>, id: Arc<str>, client: Client) -> Arc<Self> {
        Self::build(id, Kind::Legacy, client, ctx, None)
    }

    fn build(
        id: Arc<str>,
        kind: Kind,
        client: Client,
        ctx: &Arc<Context>,
        shared: Option<Arc<SharedStreams>>,
    ) -> Arc<Self> {
        let Client { tenant, key, user, version, capabilities } = client;
        let now_ms = ctx.epoch.elapsed().as_millis() as u64;
        // Stream numbers are unique in the session across replicas: each
        // replica's copy counts from its own random start.
        let first_stream = if shared.is_some() {
            let mut raw = [0u8; 4];
            getrandom::fill(&mut raw).expect("the OS provides randomness");
            (u64::from(u32::from_le_bytes(raw)) << 16) + 1
        } else {
            1
        };
        Arc::new_cyclic(|me| Session {
            tenant,
            key,
            user,
            legacy: kind == Kind::Legacy,
            stored: kind == Kind::Stored,
            for_tenant: id.starts_with(TENANT_PREFIX),
            kept_streams: if id.starts_with(TENANT_PREFIX) { TENANT_KEPT_STREAMS } else { KEPT_STREAMS },
            checked_ms: AtomicU64::new(now_ms),
            known: Mutex::new(Known(Vec::new())),
            version,
            capabilities,
            links: Mutex::new(Vec::new()),
            opened_ms: AtomicU64::new(switchboard_core::time::now_ms() as u64),
            inflight: Mutex::new(Vec::new()),
            standalone: OnceLock::new(),
            listening: AtomicBool::new(false),
            streams: Mutex::new(VecDeque::new()),
            next_stream: AtomicU64::new(first_stream),
            shared,
            shared_readers: AtomicUsize::new(0),
            log_level: Mutex::new(None),
            last_used: AtomicU64::new(now_ms),
            ctx: ctx.clone(),
            closed: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            subscriptions: OnceLock::new(),
            me: me.clone(),
            id,
        })
    }

    /// Records the client's log level (`logging/setLevel`).
    pub fn set_log_level(&self, level: &str) {
        *self.log_level.lock().expect("lock") = Some(level.to_owned());
    }

    /// The client's log level, if it set one.
    pub fn log_level(&self) -> Option<String> {
        self.log_level.lock().expect("lock").clone()
    }

    /// Records use, for idle expiry.
    pub fn touch(&self) {
        self.touch_at(std::time::Instant::now());
    }

    /// Records use at `at` (a request's arrival: no clock read of its own).
    pub fn touch_at(&self, at: std::time::Instant) {
        let ms = at.saturating_duration_since(self.ctx.epoch).as_millis() as u64;
        self.last_used.store(ms, Ordering::Relaxed);
    }

    /// Whether the client declared `capability` (`sampling`, `roots`, ...)
    /// in `initialize`.
    pub fn declares(&self, capability: &str) -> bool {
        self.declares_capability(capability)
    }

    /// Whose credentials requests to upstream `u` on this session's behalf
    /// carry (its user's, else its tenant's, as the vault has them when
    /// each request goes); `None` without a vault.
    pub fn credentials(&self, u: UpstreamId) -> Option<Arc<dyn Credentials>> {
        self.link(u)
            .credentials
            .get_or_init(|| {
                let keychain = self.ctx.keychain.as_ref()?;
                let upstream = &self.ctx.upstreams[u];
                let required = upstream.config.credential_required;
                Some(keychain.credentials(&self.tenant, self.user.as_deref(), &upstream.name, required))
            })
            .clone()
    }

    fn declares_capability(&self, capability: &str) -> bool {
        serde_json::from_str::<HashMap<std::borrow::Cow<'_, str>, &RawValue>>(self.capabilities.get())
            .is_ok_and(|c| c.get(capability).is_some_and(|v| v.get() != "null"))
    }

    /// When the last request came (ms since the sessions' epoch).
    pub(crate) fn last_used_ms(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    /// How long since the last request.
    pub fn idle(&self) -> Duration {
        let now = self.ctx.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_used.load(Ordering::Relaxed)))
    }

    /// Whether the session is in use even without new requests: a request
    /// in flight, or a client reading its GET stream.
    pub fn busy(&self) -> bool {
        self.has_inflight()
            || self.standalone.get().is_some_and(|log| log.has_readers())
            || self.shared_readers.load(Ordering::Relaxed) > 0
    }

    /// Stream 0, made on first use.
    fn standalone(&self) -> &Arc<Log> {
        self.standalone.get_or_init(|| Log::new(0))
    }

    /// Whether the session keeps resource subscriptions here (listen
    /// streams to upstreams that speak only MCP 2026-07-28): another
    /// replica could not take them over.
    pub fn holds_subscriptions(&self) -> bool {
        self.subscriptions.get().is_some_and(|s| s.any())
    }

    /// Whether a request of the session is in flight here.
    pub fn has_inflight(&self) -> bool {
        !self.inflight.lock().expect("lock").is_empty()
    }

    /// The session as the store keeps it.
    pub(crate) fn to_stored(&self) -> Stored {
        let upstreams = self
            .known
            .lock()
            .expect("lock")
            .0
            .iter()
            .map(|(u, at)| (self.ctx.upstreams[*u].name.to_string(), at.clone()))
            .collect();
        Stored {
            record: Record {
                tenant: self.tenant.to_string(),
                key: self.key.to_string(),
                user: self.user.as_deref().map(str::to_owned),
                version: self.version.as_str().to_owned(),
                capabilities: self.capabilities.get().to_owned(),
                opened_ms: self.opened_ms.load(Ordering::Relaxed),
            },
            upstreams,
        }
    }

    /// Whether the store should be asked again whether the session is live
    /// (at most once per `every`); claims the check for the caller.
    pub fn due_for_check(&self, every: Duration) -> bool {
        let now = self.ctx.epoch.elapsed().as_millis() as u64;
        let checked = self.checked_ms.load(Ordering::Relaxed);
        now.saturating_sub(checked) >= every.as_millis() as u64
            && self.checked_ms.compare_exchange(checked, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// The channel to upstream `u` if it is already open.
    pub fn open_channel(&self, u: UpstreamId) -> Option<Arc<dyn Channel>> {
        self.existing_link(u).and_then(|link| link.channel.get().cloned())
    }

    /// Every open channel with its upstream index.
    pub fn open_channels(&self) -> Vec<(UpstreamId, Arc<dyn Channel>)> {
        let links = self.links.lock().expect("lock");
        links.iter().filter_map(|(u, link)| link.channel.get().map(|c| (*u, c.clone()))).collect()
    }

    /// Sends a message on the session's GET stream, or keeps it (bounded)
    /// for when one opens. If the client has not read the messages already
    /// waiting (or, with shared streams, the queue to Redis is full), the
    /// message is refused (`false` when that is known at once). `from`:
    /// the upstream it came from and the message as that upstream sent it,
    /// which the router's relay then refuses back (a request) or counts, at
    /// once or, with shared streams, once Redis says so.
    pub fn push(&self, message: Bytes, from: Option<(UpstreamId, &Bytes)>) -> bool {
        match &self.shared {
            Some(shared) => {
                // Told later, on the writer's task: the refusal travels with
                // the write.
                let on_refused = from.map(|(u, original)| {
                    let (me, relay, original) = (self.me.clone(), self.ctx.relay.clone(), original.clone());
                    Box::new(move || {
                        if let (Some(session), Some(relay)) = (me.upgrade(), relay.upgrade()) {
                            relay.not_delivered(&session, u, &original, "client_backlog");
                        }
                    }) as OnRefused
                });
                shared.push(&self.id, message, on_refused)
            }
            None => {
                let taken = self.standalone().offer(&message, None);
                if let (false, Some((u, original)), Some(relay)) = (taken, from, self.ctx.relay.upgrade()) {
                    relay.not_delivered(self, u, original, "client_backlog");
                }
                taken
            }
        }
    }

    /// Sends the answer to a request on a legacy session's stream (its only
    /// stream), whatever is waiting there, up to a hard ceiling: `false`
    /// beyond it (the client reads none of its answers; end the session).
    #[must_use]
    pub fn push_answer(&self, message: Bytes) -> bool {
        match &self.shared {
            Some(shared) => shared.push(&self.id, message, None),
            None => self.standalone().push(&message),
        }
    }

    /// Sends an announcement (`what`: a list change) on the GET stream; with
    /// shared streams, once however many replicas announce it.
    pub fn announce(&self, message: Bytes, what: Arc<str>) {
        match &self.shared {
            Some(shared) => shared.announce(&self.id, message, what),
            None => {
                // An announcement that does not fit is one the client
                // would learn nothing new from: lists are fetched whole.
                let _ = self.standalone().offer(&message, None);
            }
        }
    }

    /// A new stream for the answer to one request. With shared streams, its
    /// events are copied to Redis from the first, so that the client can
    /// resume it at any replica (the copy is written behind, off the
    /// request's path).
    pub fn new_stream(&self) -> Arc<Log> {
        let log = Log::new(self.next_stream.fetch_add(1, Ordering::Relaxed));
        if let Some(shared) = &self.shared {
            log.spill(shared, &self.id);
        }
        let mut streams = self.streams.lock().expect("lock");
        // A stream whose every event reached the client needs no replay.
        streams.retain(|l| !l.finished());
        streams.push_back(log.clone());
        while streams.len() > self.kept_streams {
            streams.pop_front();
        }
        log
    }

    /// Opens (or takes over) an SSE stream for a GET: the standalone stream
    /// from where the last reader left it, or — with `Last-Event-ID` — any of
    /// the session's streams from just after that event. Upstream channels
    /// start listening from the first GET on.
    pub fn open_stream(&self, resume: Option<EventId>) -> Result<mpsc::Receiver<Bytes>, SessionError> {
        let (log, after) = match resume.map(|id| (id.stream, id.seq)) {
            None => (self.standalone().clone(), self.standalone().undelivered()),
            Some((0, seq)) => (self.standalone().clone(), Some(seq)),
            Some((stream, seq)) => {
                let streams = self.streams.lock().expect("lock");
                let log = streams.iter().find(|l| l.stream == stream).cloned().ok_or(SessionError::UnknownStream)?;
                (log, Some(seq))
            }
        };
        let standalone = log.stream == 0;
        let rx = self.read_log(log, after);
        if standalone {
            self.listen();
        }
        Ok(rx)
    }

    /// From the first GET on, upstream channels listen for messages not
    /// tied to a request.
    fn listen(&self) {
        if !self.listening.swap(true, Ordering::Relaxed) {
            for (_, channel) in self.open_channels() {
                channel.listen();
            }
        }
    }

    /// Reads a log of this replica's for one response. Only one response
    /// reads a stream at a time: a reconnecting client takes over from the
    /// connection it lost.
    fn read_log(&self, log: Arc<Log>, after: Option<u64>) -> mpsc::Receiver<Bytes> {
        log.cut();
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(log.reader(after, tx));
        rx
    }

    /// Opens an SSE stream for a GET ([`open_stream`](Self::open_stream)).
    /// With shared streams, stream 0 is read from Redis, as is a request
    /// stream another replica spilled; the upstream sessions this session
    /// has are resumed here to listen, as on the replica that opened them.
    pub async fn open_get(&self, resume: Option<EventId>) -> Result<mpsc::Receiver<Bytes>, SessionError> {
        let Some(shared) = self.shared.clone() else { return self.open_stream(resume) };
        let stream = resume.map_or(0, |id| id.stream);
        if stream != 0 {
            let local = self.streams.lock().expect("lock").iter().find(|l| l.stream == stream).cloned();
            if let Some(log) = local {
                return Ok(self.read_log(log, resume.map(|id| id.seq)));
            }
        }
        self.shared_readers.fetch_add(1, Ordering::Relaxed);
        let guard = Arc::new(ReaderGuard(self.me.clone()));
        let after = resume.map(|id| id.seq);
        let open = |tx, guard| async {
            shared.reader(&self.id, stream, after, tx, guard).await.map_err(|e| {
                self.ctx.metrics.store_error("stream_open");
                tracing::debug!(error = %e, "cannot open a shared stream");
                SessionError::StoreDown
            })
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut opened = open(tx.clone(), guard.clone()).await?;
        if !opened && stream != 0 {
            // Its replica writes a request stream to Redis behind the
            // request: give a client that came back at once a moment.
            tokio::time::sleep(Duration::from_millis(250)).await;
            opened = open(tx, guard).await?;
        }
        if !opened {
            return Err(SessionError::UnknownStream);
        }
        if stream == 0 {
            let known: Vec<UpstreamId> = self.known.lock().expect("lock").0.iter().map(|(u, _)| *u).collect();
            for u in known {
                let _ = self.existing_channel(u).await;
            }
            self.listen();
        }
        Ok(rx)
    }

    /// Ends the session's unanswered request streams here (they are in the
    /// shared streams): their clients resume them at another replica (a
    /// draining replica's hand-off). Only for clients that resume request
    /// streams (2025-11-25 and later); others keep reading here.
    pub fn hand_off_streams(&self) {
        let Some(shared) = &self.shared else { return };
        if self.version < ProtocolVersion::V2025_11_25 {
            return;
        }
        let streams: Vec<Arc<Log>> = self.streams.lock().expect("lock").iter().cloned().collect();
        for log in streams {
            if !log.is_closed() {
                log.spill(shared, &self.id);
                log.cut();
            }
        }
    }

    /// A server-to-client request from upstream `u`, with an id of the
    /// router's that says where the answer goes: `"u.n42"` for the
    /// upstream's id `42`, `"u.x<hex>"` for any other id (its JSON, in hex).
    /// Any replica can route the client's answer from the id alone
    /// ([`answered`](Self::answered)), and two upstreams using the same id
    /// get different ones.
    pub fn ask(&self, u: UpstreamId, env: &Envelope<'_>, message: &[u8]) -> Bytes {
        let their_id = env.id.expect("a request has an id");
        let ours = relayed::id(self.ctx.upstreams.key(u), their_id.get());
        splice(message, &mut [Edit::new(span(message, their_id.get()), ours.as_bytes())])
    }

    /// Where the client's answer to a relayed request goes: the upstream and
    /// its own id (JSON), from the id the client answered with. `None` for an
    /// id the router did not make.
    pub fn answered(&self, id: &RawValue) -> Option<(UpstreamId, Box<str>)> {
        relayed::parse(id, &self.ctx.upstreams)
    }

    /// Our id for a relayed request the upstream cancelled (given its id).
    pub fn asked_cancelled(&self, u: UpstreamId, their_id: &str) -> String {
        relayed::id(self.ctx.upstreams.key(u), their_id)
    }

    /// Notes a request in flight to upstream `u`, by its id (JSON text).
    pub fn begin(&self, id: &[u8], u: UpstreamId) {
        self.inflight.lock().expect("lock").push((fnv1a64(id), u));
    }

    /// Notes that a request (its id, JSON text) finished.
    pub fn end(&self, id: &[u8]) {
        let key = fnv1a64(id);
        let mut inflight = self.inflight.lock().expect("lock");
        if let Some(i) = inflight.iter().position(|(k, _)| *k == key) {
            inflight.swap_remove(i);
        }
    }

    /// The upstream a request in flight went to.
    pub fn inflight_upstream(&self, id: &RawValue) -> Option<UpstreamId> {
        let key = fnv1a64(id.get().as_bytes());
        self.inflight.lock().expect("lock").iter().find(|(k, _)| *k == key).map(|(_, u)| *u)
    }

    /// Passes the client's cancellation (`body`, parsed as `env`) to the
    /// upstream if the request it names is in flight here; `false` if it
    /// is not (another replica may be serving it).
    pub async fn cancel_here(&self, env: &Envelope<'_>, body: &Bytes) -> bool {
        let request_id =
            env.params.and_then(|p| switchboard_protocol::jsonrpc::Target::parse(p).ok()).and_then(|t| t.request_id);
        let Some((u, request_id)) = request_id.and_then(|id| Some((self.inflight_upstream(id)?, id))) else {
            return false;
        };
        if let Some(channel) = self.open_channel(u) {
            // Under the id the upstream knows, if the router sent it another.
            let body = match switchboard_protocol::jsonrpc::upstream_id(request_id.get()) {
                std::borrow::Cow::Borrowed(_) => body.clone(),
                std::borrow::Cow::Owned(sent) => {
                    splice(body, &mut [Edit::new(span(body, request_id.get()), sent.as_bytes())])
                }
            };
            if let Err(e) = channel.send(body).await {
                tracing::debug!(upstream = %self.ctx.upstreams[u].name, error = %e, "cancellation not delivered");
            }
        }
        true
    }

    /// Subscribes the client to `uri` (the upstream's own) at `u`, an
    /// upstream that speaks only MCP 2026-07-28, or (`on` false)
    /// unsubscribes: kept as a `subscriptions/listen` stream of this
    /// session's, whose updates come to the client as any upstream's do.
    pub async fn subscribe_stateless(&self, u: UpstreamId, uri: &str, on: bool) -> Result<(), SessionError> {
        let upstream = &self.ctx.upstreams[u];
        let inbox: Arc<dyn Inbox> = Arc::new(SessionInbox { session: self.me.clone(), upstream: u });
        let client = crate::subscriptions::Client {
            capabilities: self.capabilities.get(),
            affinity: &self.id,
            credentials: self.credentials(upstream.id),
        };
        let subscriptions = self.subscriptions.get_or_init(Box::default);
        // Made after the session ended (which stops only those it finds):
        // stopped as it would have been, so that no stream starts.
        if self.closed.load(Ordering::SeqCst) {
            subscriptions.stop();
        }
        let changed = subscriptions.change(upstream, uri, on, client, inbox).await;
        // Ended meanwhile (its stop may have found the change under way and
        // left it): whatever the change started ends now.
        if self.closed.load(Ordering::SeqCst) {
            subscriptions.stop();
        }
        changed.map_err(|e| SessionError::upstream(&upstream.name, e))
    }

    /// Stops serving the session here while it goes on at other replicas:
    /// its stream ends and its channels stop, leaving upstream sessions open.
    pub async fn detach(&self) {
        self.detached.store(true, Ordering::Relaxed);
        self.closed.store(true, Ordering::SeqCst);
        self.close_stream();
        self.stop_subscriptions();
        for (_, channel) in self.open_channels() {
            channel.detach().await;
        }
    }

    /// Ends the session: closes its stream and its upstream sessions
    /// (their durations, and its own, measured).
    pub async fn close(&self) {
        self.end_here(true).await;
    }

    /// [`close`](Self::close) for a session another replica ended (and
    /// measured): its channels here closed, nothing measured twice.
    pub async fn close_ended_elsewhere(&self) {
        self.end_here(false).await;
    }

    async fn end_here(&self, measured_here: bool) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.close_stream();
        self.stop_subscriptions();
        let now = switchboard_core::time::now_ms() as u64;
        let since = |opened: u64| (opened > 0).then(|| std::time::Duration::from_millis(now.saturating_sub(opened)));
        if let Some(lasted) = since(self.opened_ms.load(Ordering::Relaxed)).filter(|_| measured_here) {
            if !self.for_tenant {
                self.ctx.metrics.session_ended(self.version.as_str(), lasted);
            }
        }
        let links: Vec<(UpstreamId, Arc<Link>)> = self.links.lock().expect("lock").clone();
        for (u, link) in links {
            if let Some(channel) = link.channel.get() {
                channel.close().await;
                self.measure_link(u, &link, now);
            }
        }
    }

    /// Measures the duration of the upstream session with `u` opened
    /// here, if one was, as it ends at `now`.
    fn measure_link(&self, u: UpstreamId, link: &Link, now: u64) {
        let opened = link.opened.load(Ordering::Relaxed);
        if opened > 0 {
            let address = self.ctx.upstreams[u].address();
            let lasted = std::time::Duration::from_millis(now.saturating_sub(opened));
            self.ctx.metrics.upstream_session_ended(address.as_ref().map(|(h, p)| (&**h, *p)), lasted);
        }
    }

    /// What the session holds for upstream `u`, made if it held nothing.
    fn link(&self, u: UpstreamId) -> Arc<Link> {
        let mut links = self.links.lock().expect("lock");
        if let Some((_, link)) = links.iter().find(|(id, _)| *id == u) {
            return link.clone();
        }
        let link = Arc::new(Link::default());
        links.push((u, link.clone()));
        link
    }

    /// What the session holds for upstream `u`, if anything.
    fn existing_link(&self, u: UpstreamId) -> Option<Arc<Link>> {
        let links = self.links.lock().expect("lock");
        links.iter().find(|(id, _)| *id == u).map(|(_, link)| link.clone())
    }

    /// Stops the session's resource subscriptions, if it has any.
    fn stop_subscriptions(&self) {
        if let Some(subscriptions) = self.subscriptions.get() {
            subscriptions.stop();
        }
    }

    /// Upstream `u` was retired: the session's channel to it is closed
    /// (its upstream session ended, and measured) and forgotten, with the
    /// upstream session other replicas knew.
    pub async fn drop_upstream(&self, u: UpstreamId) {
        let link = {
            let mut links = self.links.lock().expect("lock");
            let at = links.iter().position(|(id, _)| *id == u);
            at.map(|at| links.swap_remove(at).1)
        };
        self.known.lock().expect("lock").remove(u);
        let Some(link) = link else { return };
        if let Some(channel) = link.channel.get() {
            channel.close().await;
            self.measure_link(u, &link, switchboard_core::time::now_ms() as u64);
        }
    }

    /// Ends the response reading the session's GET stream (the client may
    /// reconnect, here or elsewhere). Answers in flight go on; a legacy
    /// session's only stream carries its answers, so it is left alone.
    pub fn close_stream(&self) {
        if !self.legacy {
            if let Some(log) = self.standalone.get() {
                log.cut();
            }
            if let Some(shared) = &self.shared {
                shared.cut_session(&self.id);
            }
        }
    }
}

/// Counts a shared-stream reader of a session while it runs.
struct ReaderGuard(Weak<Session>);

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        if let Some(session) = self.0.upgrade() {
            session.shared_readers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Upstream sessions other replicas may continue, by upstream: few, so a
/// vector (smaller than a map when idle).
struct Known(Vec<(UpstreamId, UpstreamSession)>);

impl Known {
    fn get(&self, u: UpstreamId) -> Option<&UpstreamSession> {
        self.0.iter().find(|(id, _)| *id == u).map(|(_, at)| at)
    }

    fn insert(&mut self, u: UpstreamId, at: UpstreamSession) {
        match self.0.iter_mut().find(|(id, _)| *id == u) {
            Some((_, slot)) => *slot = at,
            None => self.0.push((u, at)),
        }
    }

    fn remove(&mut self, u: UpstreamId) {
        self.0.retain(|(id, _)| *id != u);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::registry::Registry;
    use crate::testing::context;
    use switchboard_upstream::empty_object;

    fn client() -> Client {
        Client {
            tenant: Arc::from("t"),
            key: Arc::from(""),
            user: None,
            version: ProtocolVersion::LATEST,
            capabilities: Arc::from(empty_object()),
        }
    }

    fn session() -> Arc<Session> {
        Session::private(&context(2, Instant::now()), client())
    }

    #[test]
    fn ids_are_random_hex() {
        let (a, b) = (session(), session());
        assert_eq!(a.id.len(), 32);
        assert!(a.id.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn relayed_requests_get_ids_that_route_their_answers_from_any_replica() {
        let s = session();
        let msg = br#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{}}"#;
        let env = Envelope::parse(msg).unwrap();
        let first = s.ask(UpstreamId::new(0), &env, msg);
        let second = s.ask(UpstreamId::new(1), &env, msg);
        let id1 = Envelope::parse(&first).unwrap().id.unwrap().get().to_owned();
        let id2 = Envelope::parse(&second).unwrap().id.unwrap().get().to_owned();
        assert_ne!(id1, id2, "two upstreams using id 1 must not collide");
        // Another replica's copy of the session routes the answer too: the id says it all.
        let elsewhere = session();
        let raw = RawValue::from_string(id2.clone()).unwrap();
        assert_eq!(elsewhere.answered(&raw), Some((UpstreamId::new(1), "1".into())));
        // String ids, even with quotes and escapes inside, come back byte for byte.
        let msg = br#"{"jsonrpc":"2.0","id":"a\"b.c","method":"roots/list"}"#;
        let relayed = s.ask(UpstreamId::new(0), &Envelope::parse(msg).unwrap(), msg);
        let ours = Envelope::parse(&relayed).unwrap().id.unwrap().get().to_owned();
        let raw = RawValue::from_string(ours).unwrap();
        assert_eq!(elsewhere.answered(&raw), Some((UpstreamId::new(0), r#""a\"b.c""#.into())));
        // An upstream cancelling its request: the same id the client saw.
        assert_eq!(s.asked_cancelled(UpstreamId::new(0), "1"), id1);
        // An upstream this router does not have.
        let raw = RawValue::from_string(r#""2.n1""#.into()).unwrap();
        assert_eq!(elsewhere.answered(&raw), None);
    }

    #[tokio::test]
    async fn messages_wait_for_the_get_stream_and_a_new_get_takes_over() {
        let s = session();
        assert!(s.push(Bytes::from_static(b"{\"n\":1}"), None));
        let mut first = s.open_stream(None).unwrap();
        let event = first.recv().await.unwrap();
        assert_eq!(&event[..], b"id: 0-0\ndata: {\"n\":1}\n\n", "queued before the GET, with an event id");
        // A second GET takes over: the first ends, the new one gets only what is new.
        let mut second = s.open_stream(None).unwrap();
        assert!(first.recv().await.is_none());
        assert!(s.push(Bytes::from_static(b"{\"n\":2}"), None));
        assert_eq!(&second.recv().await.unwrap()[..], b"id: 0-1\ndata: {\"n\":2}\n\n");
        // Resuming from an event id replays what followed it.
        let mut resumed = s.open_stream(Some(EventId { stream: 0, seq: 0 })).unwrap();
        assert_eq!(&resumed.recv().await.unwrap()[..], b"id: 0-1\ndata: {\"n\":2}\n\n");
        // An unknown stream is refused.
        assert!(matches!(s.open_stream(Some(EventId { stream: 99, seq: 0 })), Err(SessionError::UnknownStream)));
    }

    #[test]
    fn registry_counts_and_expires() {
        let sessions = Registry::default();
        let s = session();
        sessions.insert(s.clone());
        assert_eq!(sessions.len(), 1);
        assert!(sessions.get(&s.id).is_some());
        assert!(sessions.take_expired(Duration::from_secs(60), |_| true).is_empty());
        let old = Session::private(&context(0, Instant::now() - Duration::from_secs(120)), client());
        old.last_used.store(0, Ordering::Relaxed);
        sessions.insert(old.clone());
        let expired = sessions.take_expired(Duration::from_secs(60), |_| true);
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].id, old.id);
        assert_eq!(sessions.len(), 1);
        assert!(sessions.get(&old.id).is_none());
    }

    #[test]
    fn registry_caps_sessions_by_tenant_and_key_and_expiry_frees_places_at_once() {
        use crate::registry::{Full, Quota};
        let sessions = Registry::default();
        let ctx = context(0, Instant::now() - Duration::from_secs(120));
        let of = |tenant: &str, key: &str| {
            let client = Client {
                tenant: Arc::from(tenant),
                key: Arc::from(key),
                user: None,
                version: ProtocolVersion::LATEST,
                capabilities: Arc::from(empty_object()),
            };
            Session::private(&ctx, client)
        };
        let quota = Quota { router: 4, tenant: Some(2), key: Some(1) };
        assert_eq!(sessions.insert_within(of("a", "k1"), quota), Ok(()));
        assert_eq!(sessions.insert_within(of("a", "k1"), quota), Err(Full::Key(1)));
        assert_eq!(sessions.insert_within(of("a", "k2"), quota), Ok(()));
        assert_eq!(sessions.insert_within(of("a", "k3"), quota), Err(Full::Tenant(2)));
        // Tenant a at its cap leaves tenant b its own places.
        assert_eq!(sessions.insert_within(of("b", "k4"), quota), Ok(()));
        assert_eq!(sessions.insert_within(of("b", "k5"), quota), Ok(()));
        assert_eq!(sessions.insert_within(of("c", "k6"), quota), Err(Full::Router(4)));
        assert_eq!(sessions.len(), 4);
        assert_eq!(sessions.of_tenant("a"), 2);

        // Nothing expired: nothing taken, and the next look is skipped
        // until the earliest expiry.
        let now_ms = ctx.epoch.elapsed().as_millis() as u64;
        assert!(sessions.reclaim(Duration::from_secs(60), now_ms).is_empty());
        // Sixty-one seconds on, every session unused since has expired.
        let later = now_ms + 61_000;
        let reclaimed = sessions.reclaim(Duration::from_secs(60), later);
        assert_eq!(reclaimed.len(), 4);
        assert_eq!(sessions.len(), 0);
        assert_eq!(sessions.of_tenant("a"), 0);
        assert_eq!(sessions.insert_within(of("a", "k1"), quota), Ok(()), "the key's place is free again");
    }
}
