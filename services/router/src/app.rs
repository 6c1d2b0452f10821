//! The router's shared state: configuration, upstreams, catalog, sessions,
//! metrics; and the rules for messages that come from upstreams on their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};
use switchboard_core::UpstreamId;

use bytes::Bytes;
use switchboard_protocol::jsonrpc::{self, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::Method;

use tokio::sync::mpsc;

use crate::audit::Audit;
use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::ratelimit::Limiter;
use crate::session::{Session, Sessions};
use crate::session_store::{Repair, SessionStore, Stored, Touch};
use crate::shared_streams::SharedStreams;
use crate::store::Database;
use crate::tenancy::Directory;
use switchboard_catalog::Catalog;
use switchboard_upstream::{self as upstream, Inbox, Upstream, Upstreams};

/// A legacy connection's stream, and the tenant that opened it.
type LegacyConnection = (mpsc::Sender<Bytes>, Arc<str>);

/// An input request awaiting its answer: the session asked, and where the
/// answer goes.
type AwaitedAnswer = (Arc<str>, tokio::sync::oneshot::Sender<Bytes>);

/// What `subscriptions/listen` streams follow.
#[derive(Debug, Clone)]
pub enum Change {
    /// A list changed: for every tenant, or (`Some`) for one.
    List(ListKind, Option<Arc<str>>),
    /// The router is shutting down: streams end gracefully.
    Shutdown,
}

/// Everything a request handler needs.
pub struct App {
    pub config: Config,
    pub upstreams: Upstreams,
    pub catalog: Catalog,
    /// This replica's live sessions (for stored ones, a cache of the store).
    pub sessions: Sessions,
    /// Where sessions live between requests: memory, or Redis shared by replicas.
    pub store: Arc<dyn SessionStore>,
    /// With the Redis session store: event streams every replica reads.
    pub shared_streams: Option<Arc<SharedStreams>>,
    pub metrics: Arc<Metrics>,
    /// Tenants and API keys (an in-memory copy of the database's).
    pub directory: Arc<Directory>,
    pub limiter: Limiter,
    /// `None` without a database or with `audit.enabled = false`.
    pub audit: Option<Audit>,
    pub database: Option<Database>,
    /// Edge devices and their tools.
    pub edge: Arc<crate::edge::Edge>,
    /// When the router started; sessions measure idleness from it.
    pub epoch: Instant,
    shutting_down: AtomicBool,
    /// List changes, for stateless clients' `subscriptions/listen` streams.
    pub changes: tokio::sync::broadcast::Sender<Change>,
    /// The key that signs the `requestState` of bridged calls (shared by
    /// the replicas through Redis, else this process's own).
    state_key: RwLock<Option<(String, [u8; 32])>>,
    /// Input requests of stateless upstreams awaiting the client's answer,
    /// by the router's id (`m.…`).
    awaiting: Mutex<HashMap<String, AwaitedAnswer>>,
    /// Legacy HTTP+SSE connections waiting for their `initialize`.
    legacy: Mutex<HashMap<Arc<str>, LegacyConnection>>,
}

impl App {
    /// Builds the state and starts each upstream's transport (stdio children
    /// are spawned here), the audit writer and the rate limiter. Must run
    /// inside a Tokio runtime. Fails only if the audit spool cannot be opened
    /// or a URL cannot be used.
    pub fn new(config: Config) -> std::io::Result<Arc<App>> {
        let names: Vec<Arc<str>> = config.upstreams.iter().map(|u| Arc::from(u.name.as_str())).collect();
        let metrics = Metrics::new(&names);
        let database = match &config.database.url {
            Some(url) => Some(
                Database::connect(url, config.database.connect_timeout)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
            ),
            None => None,
        };
        let directory =
            Arc::new(Directory::new(names.clone(), config.tenants.clone(), database.clone(), !config.auth.required));
        let audit = match (&database, config.audit.enabled) {
            (Some(db), true) => Some(Audit::start(
                db.clone(),
                &config.audit.spool,
                crate::audit::Options {
                    queue: config.audit.queue,
                    batch: config.audit.batch,
                    write_timeout: config.audit.write_timeout,
                    retry_every: config.audit.retry_every,
                    flush_every: config.audit.flush_every,
                },
                metrics.clone(),
            )?),
            _ => None,
        };
        let redis = match &config.redis.url {
            Some(url) => Some(
                switchboard_core::redis::RedisLink::new(url, &config.redis.key_prefix, config.redis.timeout)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
            ),
            None => None,
        };
        let shared = redis.clone().filter(|_| config.sessions.redis);
        // The streams get a connection of their own (see shared_streams.rs).
        let shared_streams = match (&config.redis.url, config.sessions.redis) {
            (Some(url), true) => Some(SharedStreams::start(
                switchboard_core::redis::RedisLink::new(url, &config.redis.key_prefix, crate::shared_streams::TIMEOUT)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
                config.server.session_idle_timeout,
                metrics.clone(),
            )),
            _ => None,
        };
        let store = crate::session_store::build(shared, config.server.session_idle_timeout);
        let limiter = Limiter::new(redis.map(crate::ratelimit::cluster::Shared::new), metrics.clone());
        let reserved: Vec<String> = config
            .upstreams
            .iter()
            .flat_map(|u| [u.name.clone(), u.prefix.clone()])
            .filter(|p| !p.is_empty())
            .collect();
        let edge =
            Arc::new(crate::edge::Edge::new(config.edge.clone(), &config.catalog.separator, reserved, metrics.clone()));
        let upstreams = Upstreams::new(
            config
                .upstreams
                .iter()
                .enumerate()
                .map(|(index, u)| {
                    Arc::new(Upstream {
                        id: UpstreamId::new(index),
                        name: names[index].clone(),
                        config: u.clone(),
                        transport: upstream::build(u, &metrics.upstreams),
                    })
                })
                .collect(),
            metrics.upstreams.clone(),
        );
        let app = Arc::new_cyclic(|me: &Weak<App>| {
            let for_inbox = me.clone();
            let inbox = Box::new(move |u: UpstreamId| -> Arc<dyn Inbox> {
                Arc::new(ControlInbox { app: for_inbox.clone(), upstream: u })
            });
            let for_announce = me.clone();
            let announce = Box::new(move |kind: ListKind| {
                if let Some(app) = for_announce.upgrade() {
                    app.announce(kind);
                }
            });
            App {
                catalog: Catalog::new(
                    upstreams.clone(),
                    config.catalog.clone(),
                    metrics.catalog.clone(),
                    inbox,
                    announce,
                ),
                config,
                upstreams,
                sessions: Sessions::default(),
                store,
                shared_streams,
                metrics,
                directory,
                limiter,
                audit,
                database,
                edge,
                epoch: Instant::now(),
                shutting_down: AtomicBool::new(false),
                changes: tokio::sync::broadcast::channel(256).0,
                state_key: RwLock::new(None),
                awaiting: Mutex::new(HashMap::new()),
                legacy: Mutex::new(HashMap::new()),
            }
        });
        if let Some(shared) = &app.shared_streams {
            let weak = Arc::downgrade(&app);
            shared.on_cancel(Box::new(move |session, notification| {
                let Some(app) = weak.upgrade() else { return };
                // Another replica's client answered an input request awaited here.
                if let Ok(env) = Envelope::parse(&notification) {
                    if matches!(env.kind, MessageKind::Response | MessageKind::Error) {
                        if let Some(ours) = env.id.and_then(jsonrpc::as_str) {
                            app.deliver_answer(session, &ours, notification.clone());
                        }
                        return;
                    }
                }
                let Some(session) = app.sessions.get(session) else { return };
                tokio::spawn(async move {
                    if let Ok(env) = Envelope::parse(&notification) {
                        crate::downstream::cancel_here(&app, &session, &env, &notification).await;
                    }
                });
            }));
        }
        Ok(app)
    }

    /// Migrates the database (if configured to) and loads tenants and keys;
    /// a database that cannot be reached is logged, not fatal: the router
    /// serves the tenants of its config file and retries in the background.
    pub async fn prepare(&self) {
        let Some(db) = &self.database else { return };
        if self.config.database.migrate_on_start {
            if let Err(e) = db.migrate().await {
                tracing::error!(error = %e, "database migrations failed; run `switchboard migrate` to see why");
            }
        }
        match self.directory.reload().await {
            Ok(()) => self.metrics.set_directory_db(true),
            Err(e) => {
                self.metrics.set_directory_db(false);
                tracing::warn!(error = %e, "cannot load tenants and keys from the database yet; retrying in the background");
            }
        }
    }

    /// Starts background work: the catalog warm-up, the session sweeper and
    /// the tenant directory refresh.
    pub fn start(self: &Arc<Self>) {
        let metrics = self.metrics.clone();
        self.directory.start(self.config.database.refresh, move |up| metrics.set_directory_db(up));
        let app = self.clone();
        tokio::spawn(async move {
            app.catalog.ensure(&ListKind::ALL).await;
        });
        let app = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let period = match app.upgrade() {
                    Some(app) => (app.config.server.session_idle_timeout / 4)
                        .clamp(Duration::from_millis(100), Duration::from_secs(30)),
                    None => return,
                };
                tokio::time::sleep(period).await;
                let Some(app) = app.upgrade() else { return };
                app.sweep_sessions().await;
            }
        });
    }

    /// Registers a legacy HTTP+SSE connection until its `initialize` arrives
    /// (connections that closed meanwhile are forgotten); `tenant` opened it.
    pub fn legacy_connect(&self, id: Arc<str>, stream: mpsc::Sender<Bytes>, tenant: Arc<str>) {
        let mut legacy = self.legacy.lock().expect("lock");
        legacy.retain(|_, (s, _)| !s.is_closed());
        legacy.insert(id, (stream, tenant));
    }

    /// Takes a legacy connection's stream for its `initialize`, if `tenant`
    /// opened it.
    pub fn legacy_take(&self, id: &str, tenant: &str) -> Option<mpsc::Sender<Bytes>> {
        let mut legacy = self.legacy.lock().expect("lock");
        if legacy.get(id).is_some_and(|(_, t)| &**t != tenant) {
            return None;
        }
        legacy.remove(id).map(|(s, _)| s).filter(|s| !s.is_closed())
    }

    /// Whether shutdown has begun.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// First step of shutdown: refuse new sessions and end every GET stream
    /// (clients reconnect elsewhere); requests in flight go on.
    /// With shared streams, the streams of requests in flight are handed off
    /// too: copied to Redis and ended here, for their clients to resume at
    /// another replica while this one finishes the requests.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
        let _ = self.changes.send(Change::Shutdown);
        for session in self.sessions.all() {
            session.close_stream();
            session.hand_off_streams();
        }
    }

    /// Waits (at most `limit`) until no request of any session is in flight
    /// here: answers whose streams were handed off are still being relayed.
    pub async fn wait_for_requests(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if !self.sessions.all().iter().any(|s| s.has_inflight()) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Last step of shutdown: end upstream sessions and stop child processes.
    /// Sessions in a shared store go on at other replicas: their upstream
    /// sessions are left open for them.
    pub async fn close(&self) {
        self.edge.close_all();
        for session in self.sessions.all() {
            if let Some(session) = self.sessions.remove(&session.id) {
                if session.stored && self.store.shared() {
                    session.detach().await;
                } else {
                    session.close().await;
                }
            }
        }
        if let Some(shared) = &self.shared_streams {
            // Events still queued for Redis (answers relayed for streams
            // handed off) go out before the process does.
            if !shared.flush(self.config.server.shutdown_grace).await {
                tracing::warn!("shutting down with shared stream events not yet written to Redis");
            }
        }
        self.catalog.close().await;
        for upstream in self.upstreams.iter() {
            upstream.transport.shutdown().await;
        }
        if let Some(audit) = &self.audit {
            audit.close(self.config.server.shutdown_grace).await;
        }
    }

    /// An upstream's list changed: mark it stale and, if clients may have
    /// seen it, tell every session once; listen streams hear of every change.
    pub fn list_changed(&self, u: UpstreamId, kind: ListKind) {
        if self.catalog.invalidate(u, kind) {
            self.announce(kind);
        } else {
            // Sessions were told already; a listen stream opened since was
            // not (its client expects every change after it subscribed).
            let _ = self.changes.send(Change::List(kind, None));
        }
    }

    /// Tells `tenant`'s sessions that its tool list changed (an edge device
    /// came, went or changed its services).
    pub fn announce_tools(&self, tenant: &str) {
        let _ = self.changes.send(Change::List(ListKind::Tools, Some(Arc::from(tenant))));
        let note = jsonrpc::request(None, ListKind::Tools.changed_notification(), None);
        for session in self.sessions.all() {
            if &*session.tenant == tenant {
                session.announce(note.clone(), ListKind::Tools.changed_notification());
            }
        }
    }

    /// Tells every session that a list changed.
    fn announce(&self, kind: ListKind) {
        let _ = self.changes.send(Change::List(kind, None));
        let note = jsonrpc::request(None, kind.changed_notification(), None);
        for session in self.sessions.all() {
            session.announce(note.clone(), kind.changed_notification());
        }
    }

    /// What a session's client should see of a message upstream `u` sent
    /// outside a response: requests get a session-unique id, cancellations of
    /// them are mapped, list changes are absorbed (and announced once by
    /// [`App::list_changed`]). `None` means nothing to deliver.
    pub fn relay_from_upstream(&self, session: &Session, u: UpstreamId, message: &Bytes) -> Option<Bytes> {
        match Envelope::parse(message) {
            Ok(env) => self.relay_parsed(session, u, &env, message),
            Err(_) => {
                self.metrics.upstreams.protocol_error(&self.upstreams[u].name);
                None
            }
        }
    }

    /// [`App::relay_from_upstream`] for a message already parsed.
    pub fn relay_parsed(&self, session: &Session, u: UpstreamId, env: &Envelope<'_>, message: &Bytes) -> Option<Bytes> {
        match env.kind {
            MessageKind::Request => Some(session.ask(u, env, message)),
            MessageKind::Notification => {
                let method = Method::from_name(env.method_str());
                if let Some(kind) = method.list_changed() {
                    self.list_changed(u, kind);
                    return None;
                }
                if method == Method::ResourcesUpdated {
                    return Some(self.expose_updated_uri(u, env, message));
                }
                if method == Method::Cancelled {
                    let theirs = env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.request_id)?;
                    let ours = session.asked_cancelled(u, theirs.get());
                    return Some(splice(message, &mut [Edit::new(span(message, theirs.get()), ours.as_bytes())]));
                }
                Some(message.clone())
            }
            MessageKind::Response | MessageKind::Error => {
                self.metrics.upstreams.relay_dropped(&self.upstreams[u].name, "stray_response");
                None
            }
        }
    }
}

/// A replica forgets a stored session it has not used for this long (at
/// most; less if sessions expire sooner), while other replicas may go on
/// with it.
const LOCAL_KEEP: Duration = Duration::from_secs(300);

/// Sessions across replicas: the local registry is a cache of the store.
impl App {
    /// How often a replica asks the store about a session it is using.
    fn check_every(&self) -> Duration {
        self.config.sessions.cache.min(self.config.server.session_idle_timeout / 4)
    }

    /// The index of the upstream named `name`.
    fn upstream_index(&self, name: &str) -> Option<UpstreamId> {
        self.upstreams.find(name)
    }

    /// Registers a new session here and, if it is a stored one, in the
    /// store. A store that cannot be reached is logged: the session then
    /// lives on this replica, and is written to the store when it answers
    /// again ([`Touch::Unknown`]).
    pub async fn add_session(&self, session: &Arc<Session>) {
        self.sessions.insert(session.clone());
        self.metrics.set_sessions(self.sessions.len());
        if session.stored {
            if let Err(e) = self.store.create(&session.id, &session.to_stored(self)).await {
                self.metrics.session_store_error("create");
                tracing::warn!(error = %e, "new session not in the session store; only this replica serves it until the store answers");
            }
        }
    }

    /// The session a tenant's stateless calls to session-based upstreams
    /// share (`t.` and a hash of the tenant's name): this replica's copy,
    /// the store's, or a new one. If the store cannot be reached, a copy of
    /// this replica's own serves until it can.
    pub async fn tenant_session(&self, tenant: &Arc<str>) -> Result<Arc<Session>, Error> {
        let id = crate::session::tenant_session_id(tenant);
        match self.find_session(&id).await {
            Ok(Some(session)) if session.tenant == *tenant => return Ok(session),
            Ok(Some(_)) => return Err(Error::Internal("tenant session names another tenant".into())),
            Ok(None) => {}
            Err(_) => {
                if let Some(session) = self.sessions.get(&id) {
                    return Ok(session);
                }
            }
        }
        let session =
            Session::for_tenant(id, tenant.clone(), self.upstreams.len(), self.epoch, self.shared_streams.clone());
        let kept = self.sessions.insert_if_absent(session.clone());
        if Arc::ptr_eq(&kept, &session) {
            self.metrics.set_sessions(self.sessions.len());
            if let Err(e) = self.store.create(&session.id, &session.to_stored(self)).await {
                self.metrics.session_store_error("create");
                tracing::warn!(error = %e, "tenant session not in the session store; only this replica uses it until the store answers");
            }
        }
        Ok(kept)
    }

    /// Waits for the answer of session `session`'s client to the input
    /// request `ours` (an id of the form `m.…`, unique to this request).
    pub fn await_answer(self: &Arc<Self>, session: &Arc<str>, ours: &str) -> Awaiting {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.awaiting.lock().expect("lock").insert(ours.to_owned(), (session.clone(), tx));
        Awaiting { rx, app: Arc::downgrade(self), ours: ours.to_owned() }
    }

    /// Hands the answer session `session`'s client sent to the request
    /// awaiting it here; `false` if none of that session's does.
    pub fn deliver_answer(&self, session: &str, ours: &str, answer: Bytes) -> bool {
        let mut awaiting = self.awaiting.lock().expect("lock");
        if awaiting.get(ours).is_none_or(|(s, _)| &**s != session) {
            return false;
        }
        let (_, tx) = awaiting.remove(ours).expect("present");
        tx.send(answer).is_ok()
    }

    /// The key of bridged calls' `requestState`s: one every replica shares
    /// (agreed through Redis) with shared sessions, else this process's own.
    pub async fn state_key(&self) -> [u8; 32] {
        if let Some((_, key)) = &*self.state_key.read().expect("lock") {
            return *key;
        }
        let own = switchboard_core::ids::random_id().to_string() + &switchboard_core::ids::random_id();
        let text = match &self.shared_streams {
            Some(shared) => match shared.shared_secret(&own).await {
                Ok(text) => text,
                Err(e) => {
                    // Rounds then continue only at this replica, until the
                    // sweeper gets this key into Redis.
                    tracing::warn!(error = %e, "no shared requestState key: Redis unreachable; using this replica's own");
                    own
                }
            },
            None => own,
        };
        self.set_state_key(text)
    }

    fn set_state_key(&self, text: String) -> [u8; 32] {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(text.as_bytes()).into();
        *self.state_key.write().expect("lock") = Some((text, key));
        key
    }

    /// Puts this replica's `requestState` key back into Redis if Redis lost
    /// it (restarted empty), or adopts the one Redis has: the replicas agree
    /// again (rounds sealed with a key given up on are refused, and their
    /// clients start the call again).
    async fn reassert_state_key(&self) {
        let (Some(shared), Some((ours, _))) = (&self.shared_streams, self.state_key.read().expect("lock").clone())
        else {
            return;
        };
        match shared.shared_secret(&ours).await {
            Ok(theirs) if theirs != ours => {
                tracing::info!("adopted the requestState key the other replicas use");
                self.set_state_key(theirs);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot check the shared requestState key"),
        }
    }

    /// The live session `id`: this replica's copy (checked against the
    /// store at most once per `sessions.cache`), or the store's, which this
    /// replica then continues. `Ok(None)`: no such session.
    pub async fn find_session(&self, id: &str) -> Result<Option<Arc<Session>>, Error> {
        if let Some(session) = self.sessions.get(id) {
            if session.stored && session.due_for_check(self.check_every()) && !self.still_live(&session).await {
                return Ok(None);
            }
            return Ok(Some(session));
        }
        if !self.store.shared() {
            return Ok(None);
        }
        let stored = match self.store.load(id).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.metrics.session_store_error("load");
                tracing::debug!(error = %e, "cannot load a session from the store");
                return Err(Error::SessionStoreDown);
            }
        };
        let known =
            stored.upstreams.iter().filter_map(|(name, at)| Some((self.upstream_index(name)?, at.clone()))).collect();
        let adopted = Session::adopt(
            Arc::from(id),
            &stored.record,
            known,
            self.upstreams.len(),
            self.epoch,
            self.shared_streams.clone(),
        );
        let Some(session) = adopted else {
            tracing::warn!(session = id, "a stored session names an unknown protocol version; treated as unknown");
            return Ok(None);
        };
        let session = self.sessions.insert_if_absent(session);
        self.metrics.session_adopted();
        self.metrics.set_sessions(self.sessions.len());
        Ok(Some(session))
    }

    /// Asks the store whether a session this replica holds is still live
    /// (which slides its expiry). One that ended elsewhere is forgotten
    /// here; one the store lost is written back. If the store cannot be
    /// reached, the session goes on here.
    async fn still_live(&self, session: &Arc<Session>) -> bool {
        match self.check_store(session).await {
            Some(true) | None => true,
            Some(false) => {
                // Ended through another replica, which ended the upstream
                // sessions it knew of; end the ones opened here too (a second
                // DELETE of one is harmless).
                if let Some(session) = self.sessions.remove(&session.id) {
                    self.metrics.set_sessions(self.sessions.len());
                    session.close().await;
                }
                false
            }
        }
    }

    /// Whether the store has the session live (sliding its expiry), after
    /// writing it back if the store had lost it; `None` if the store cannot
    /// be reached.
    async fn check_store(&self, session: &Session) -> Option<bool> {
        match self.store.touch(&session.id).await {
            Ok(Touch::Alive) => Some(true),
            Ok(Touch::Ended) => Some(false),
            Ok(Touch::Unknown) => match self.store.repair(&session.id, &session.to_stored(self)).await {
                Ok(Repair::Written) => {
                    self.metrics.session_repaired();
                    tracing::info!(session = %session.id, "session written back to the session store, which had lost it");
                    Some(true)
                }
                Ok(Repair::Live) => Some(true),
                Ok(Repair::Ended) => Some(false),
                Err(e) => {
                    self.metrics.session_store_error("repair");
                    tracing::debug!(error = %e, "cannot write a session back to the store");
                    None
                }
            },
            Err(e) => {
                self.metrics.session_store_error("touch");
                tracing::debug!(error = %e, "cannot check a session in the store; serving it from this replica");
                None
            }
        }
    }

    /// Ends a session for good (DELETE, expiry): its channels here and every
    /// upstream session the store lists for it, wherever it was opened.
    pub async fn end_session(&self, id: &str, local: Option<Arc<Session>>, stored: Option<Stored>) {
        if let Some(shared) = &self.shared_streams {
            shared.forget(&Arc::from(id));
        }
        let mut closed: Vec<Option<upstream::UpstreamSession>> = vec![None; self.upstreams.len()];
        if let Some(session) = &local {
            for (u, channel) in session.open_channels() {
                closed[u.index()] = channel.upstream_session();
            }
            session.close().await;
        }
        for (name, at) in stored.iter().flat_map(|s| s.upstreams.iter()) {
            let Some(u) = self.upstream_index(name) else { continue };
            // Closed just now, unless another replica moved it elsewhere.
            if closed[u.index()].as_ref() == Some(at) {
                continue;
            }
            let discard: Arc<dyn Inbox> = Arc::new(upstream::Discard);
            if let Some(channel) = self.upstreams[u].transport.resume(&upstream::Hello::router(), discard, at) {
                channel.close().await;
            }
        }
    }

    /// One round of the session sweeper: sessions the store says expired are
    /// ended (each by exactly one replica); stored sessions in use here
    /// (a request in flight, a GET stream) are kept live in the store;
    /// stored sessions unused here for a while are forgotten here (a shared
    /// store keeps them for other replicas); this replica's own sessions
    /// (legacy) expire when idle.
    pub async fn sweep_sessions(&self) {
        self.reassert_state_key().await;
        let idle = self.config.server.session_idle_timeout;
        match self.store.take_expired(1000).await {
            Ok(expired) => {
                if !expired.is_empty() {
                    tracing::debug!(count = expired.len(), "sessions expired");
                }
                for (id, stored) in expired {
                    // Used here since the store last heard of it (touches
                    // are at most `check_every` apart): it is not idle.
                    if let Some(session) = self.sessions.get(&id).filter(|s| s.idle() < idle) {
                        if self.store.create(&id, &session.to_stored(self)).await.is_ok() {
                            continue;
                        }
                    }
                    let local = self.sessions.remove(&id);
                    self.end_session(&id, local, Some(stored)).await;
                }
            }
            Err(e) => {
                self.metrics.session_store_error("take_expired");
                tracing::debug!(error = %e, "cannot sweep expired sessions from the store");
            }
        }
        for session in self.sessions.all() {
            if !session.stored {
                continue;
            }
            if session.busy() {
                if session.due_for_check(self.check_every()) {
                    self.still_live(&session).await;
                }
            } else if self.store.shared() && session.idle() > idle.min(LOCAL_KEEP) {
                // Forgotten here only once the store has it for the others
                // (written back if it had lost it); kept while the store
                // cannot be reached.
                match self.check_store(&session).await {
                    Some(true) => {
                        if let Some(session) = self.sessions.remove(&session.id) {
                            session.detach().await;
                        }
                    }
                    Some(false) => {
                        self.still_live(&session).await;
                    }
                    None => {}
                }
            }
        }
        for session in self.sessions.take_expired(idle, |s| !s.stored) {
            session.close().await;
        }
        self.metrics.set_sessions(self.sessions.len());
    }

    /// `notifications/resources/updated` names the upstream's URI; clients
    /// subscribed to the exposed one.
    fn expose_updated_uri(&self, u: UpstreamId, env: &Envelope<'_>, message: &Bytes) -> Bytes {
        let raw = env.params.and_then(|p| Target::parse(p).ok()).and_then(|t| t.uri);
        let Some(raw) = raw else { return message.clone() };
        let Some(uri) = switchboard_protocol::jsonrpc::as_str(raw) else { return message.clone() };
        let exposed = self.catalog.expose_uri(u, &uri);
        if exposed == uri {
            return message.clone();
        }
        let exposed = jsonrpc::json_string(&exposed);
        splice(message, &mut [Edit::new(span(message, raw.get()), &exposed)])
    }
}

/// The inbox of an upstream's control channel: only list changes matter.
struct ControlInbox {
    app: Weak<App>,
    upstream: UpstreamId,
}

impl Inbox for ControlInbox {
    fn deliver(&self, message: Bytes) {
        let Some(app) = self.app.upgrade() else { return };
        let Ok(env) = Envelope::parse(&message) else { return };
        if let Some(kind) = Method::from_name(env.method_str()).list_changed() {
            app.list_changed(self.upstream, kind);
        }
    }
}

/// An answer awaited ([`App::await_answer`]); no longer awaited once dropped
/// (answered, given up on, or its request abandoned).
pub struct Awaiting {
    pub rx: tokio::sync::oneshot::Receiver<Bytes>,
    app: std::sync::Weak<App>,
    ours: String,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        if let Some(app) = self.app.upgrade() {
            app.awaiting.lock().expect("lock").remove(&self.ours);
        }
    }
}
