//! [`Sessions`]: this replica's sessions, as a cache of the session store.
//!
//! - **Any replica continues a session.** A request whose session this
//!   replica does not hold loads it from a shared store (one round trip)
//!   and keeps a local copy; its channels resume the stored upstream
//!   sessions instead of opening new ones.
//! - **The local copy is checked**, not trusted forever: at most once per
//!   `cache` a request asks the store whether the session is live (which
//!   slides its expiry). Ended elsewhere: the copy is dropped and the client
//!   told the session is gone. Unknown to the store (Redis lost it): the copy
//!   is written back. The store unreachable: the copy serves on.
//! - **The store restarting empty** costs no live session: every replica
//!   watches the store's generation ([`Sessions::check_generation`], once a
//!   second) and writes every session it holds back when it changes; and a
//!   replica asked for a session the store does not know, shortly after
//!   such a restart, asks the replicas to write it back (`repair`) and
//!   waits a bounded time for the one holding it before answering 404.
//! - **Ending.** DELETE removes the session from the store and ends every
//!   upstream session the store lists, opened by whichever replica. Expiry:
//!   each replica's sweep asks the store for expired sessions, and the store
//!   hands each to exactly one replica, which ends it the same way.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use switchboard_core::UpstreamId;
use switchboard_upstream::{Inbox, UpstreamSession, Upstreams};

use crate::registry::{Full, Quota, Registry};
use crate::shared_streams::Event;
use crate::shared_streams::SharedStreams;
use crate::store::{Loaded, Repair, SessionStore, Stored, Touch};
use crate::{Client, Context, Metrics, Relay, Session, SessionError};

/// A replica forgets a stored session it has not used for this long (at
/// most; less if sessions expire sooner), while other replicas may go on
/// with it.
const LOCAL_KEEP: Duration = Duration::from_secs(300);

/// How long after the store lost everything a replica that does not hold
/// an unknown session asks the others to write it back (after that, every
/// holder has long since written its sessions back).
const REPAIR_WINDOW: Duration = Duration::from_secs(60);
/// The longest a request waits for another replica to write its session back.
const REPAIR_WAIT: Duration = Duration::from_secs(3);
/// Requests waiting so at once, at most: beyond, an unknown session is
/// unknown at once (a client sending made-up ids cannot hold many).
const REPAIR_WAITERS: usize = 64;

/// How long a request for a session this replica does not hold waits for
/// a store that cannot answer, before 503.
const LOAD_PATIENCE: Duration = Duration::from_millis(1500);
/// Between two attempts to load a session.
const LOAD_RETRY: Duration = Duration::from_millis(250);

/// Expired sessions the sweep takes from the store at a time, and batches
/// in one round at most.
const SWEEP_BATCH: usize = 1000;
const SWEEP_BATCHES: usize = 20;

/// Timing of sessions.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// A session unused this long expires (`server.session_idle_timeout`).
    pub idle_timeout: Duration,
    /// How often a replica asks the store about a session it is using
    /// (`sessions.cache`).
    pub cache: Duration,
}

/// What the sessions of this replica are built on.
pub struct Setup {
    pub upstreams: Upstreams,
    pub store: Arc<dyn SessionStore>,
    /// With the Redis store: the streams every replica reads.
    pub shared_streams: Option<Arc<SharedStreams>>,
    pub metrics: Arc<Metrics>,
    pub options: Options,
    /// Where sessions' channels find their callers' upstream credentials
    /// (the vault); `None`: upstreams' own headers only.
    pub keychain: Option<Arc<dyn switchboard_core::credential::Keychain>>,
}

/// This replica's sessions.
pub struct Sessions {
    ctx: Arc<Context>,
    registry: Registry,
    options: Options,
    /// The store's generation as this replica last saw it.
    generation: std::sync::Mutex<Option<String>>,
    /// The last write-back after the store lost everything was cut short
    /// (the store failed again): the next check does it again.
    write_back_unfinished: std::sync::atomic::AtomicBool,
    /// Places for requests waiting for a repair ([`REPAIR_WAITERS`]).
    repair_waiters: tokio::sync::Semaphore,
    /// When a refused session was last logged (ms since the epoch): one
    /// warning per [`REFUSAL_LOG_EVERY`], not one per refusal.
    refusal_logged_ms: std::sync::atomic::AtomicU64,
}

/// At most one warning about refused sessions this often.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

impl Sessions {
    /// No sessions yet; `relay` takes what upstreams send sessions on their own.
    pub fn new(setup: Setup, relay: Weak<dyn Relay>) -> Sessions {
        let Setup { upstreams, store, shared_streams, metrics, options, keychain } = setup;
        let ctx = Context { upstreams, store, shared: shared_streams, metrics, relay, keychain, epoch: Instant::now() };
        Sessions {
            ctx: Arc::new(ctx),
            registry: Registry::default(),
            options,
            generation: Default::default(),
            write_back_unfinished: std::sync::atomic::AtomicBool::new(false),
            repair_waiters: tokio::sync::Semaphore::new(REPAIR_WAITERS),
            refusal_logged_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// What sessions record.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.ctx.metrics
    }

    /// With the Redis store: the streams every replica reads.
    pub fn shared_streams(&self) -> Option<&Arc<SharedStreams>> {
        self.ctx.shared.as_ref()
    }

    /// How many sessions this replica holds.
    pub fn len(&self) -> usize {
        self.registry.len()
    }

    /// Whether this replica holds no session.
    pub fn is_empty(&self) -> bool {
        self.registry.len() == 0
    }

    /// This replica's copy of session `id`, unchecked (a legacy connection's
    /// session lives only here).
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.registry.get(id)
    }

    /// Every session this replica holds.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.registry.all()
    }

    /// A session of this replica only, not registered (an edge device's).
    pub fn private(&self, client: Client) -> Arc<Session> {
        Session::private(&self.ctx, client)
    }

    /// A new Streamable HTTP session, here and in the store, if it fits
    /// under `quota`. A store that cannot be reached is logged: the session
    /// then lives on this replica, and is written to the store when it
    /// answers again.
    pub async fn open(&self, client: Client, quota: Quota) -> Result<Arc<Session>, Full> {
        let session = Session::stored(&self.ctx, client);
        self.admit(&session, quota)?;
        if let Err(e) = self.ctx.store.create(&session.id, &session.to_stored()).await {
            self.ctx.metrics.store_error("create");
            tracing::warn!(error = %e, "new session not in the session store; only this replica serves it until the store answers");
        }
        Ok(session)
    }

    /// A new legacy HTTP+SSE session, named by its connection's id, if it
    /// fits under `quota`.
    pub fn open_legacy(&self, id: Arc<str>, client: Client, quota: Quota) -> Result<Arc<Session>, Full> {
        let session = Session::legacy(&self.ctx, id, client);
        self.admit(&session, quota)?;
        Ok(session)
    }

    /// Registers a new session if it fits under `quota`. A cap reached
    /// first ends the sessions that expired since the sweep last ran, at
    /// once: an expired session never holds a place.
    fn admit(&self, session: &Arc<Session>, quota: Quota) -> Result<(), Full> {
        let result = match self.registry.insert_within(session.clone(), quota) {
            Err(_) if self.reclaim() > 0 => self.registry.insert_within(session.clone(), quota),
            result => result,
        };
        self.ctx.metrics.set_sessions(self.registry.len());
        if let Err(full) = result {
            self.log_refusal(&session.tenant, full);
        }
        result
    }

    /// Takes out every session that expired, at once, and ends them in the
    /// background (their upstream sessions too); returns how many.
    fn reclaim(&self) -> usize {
        let now_ms = self.ctx.epoch.elapsed().as_millis() as u64;
        let expired = self.registry.reclaim(self.options.idle_timeout, now_ms);
        let n = expired.len();
        if n == 0 {
            return 0;
        }
        self.ctx.metrics.reclaimed(n);
        self.ctx.metrics.set_sessions(self.registry.len());
        tracing::debug!(count = n, "expired sessions ended to make room for a new one");
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            for session in expired {
                if !session.stored {
                    session.close().await;
                } else if ctx.store.shared() {
                    // Other replicas may go on with it; the store expires
                    // it (and a replica's sweep ends it) if none does.
                    session.detach().await;
                } else {
                    let stored = ctx.store.remove(&session.id).await.ok().flatten();
                    end(&ctx, &session.id.clone(), Some(session), stored).await;
                }
            }
        });
        n
    }

    /// One warning per [`REFUSAL_LOG_EVERY`] about sessions refused.
    fn log_refusal(&self, tenant: &str, full: Full) {
        use std::sync::atomic::Ordering;
        let now_ms = self.ctx.epoch.elapsed().as_millis() as u64;
        let last = self.refusal_logged_ms.load(Ordering::Relaxed);
        if last != 0 && now_ms.saturating_sub(last) < REFUSAL_LOG_EVERY.as_millis() as u64 {
            return;
        }
        if self.refusal_logged_ms.compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return;
        }
        let (cap, max) = match full {
            Full::Router(max) => ("server.max_sessions", max as u64),
            Full::Tenant(max) => ("limits.sessions", u64::from(max)),
            Full::Key(max) => ("limits.key_sessions", u64::from(max)),
        };
        tracing::warn!(tenant, cap, max, "new session refused: a session cap is reached (logged once per 10 s)");
    }

    /// The session a tenant's stateless calls to session-based upstreams
    /// share (`t.` and a hash of the tenant's name): this replica's copy,
    /// the store's, or a new one. If the store cannot be reached, a copy of
    /// this replica's own serves until it can.
    pub async fn tenant_session(
        &self,
        tenant: &Arc<str>,
        user: Option<&Arc<str>>,
        caller: &Arc<str>,
    ) -> Result<Arc<Session>, SessionError> {
        // A user's is theirs alone: named by the caller's identity (its
        // authorization server and user, or its certificate), which two
        // users of one name from two sources do not share.
        let owner = user.map(|_| caller.clone());
        let id = crate::tenant_session_id(tenant, owner.as_deref());
        match self.find(&id).await {
            Ok(Some(session))
                if session.tenant == *tenant
                    && session.user.as_ref() == user
                    && owner.as_ref().is_none_or(|o| *o == session.key) =>
            {
                return Ok(session)
            }
            // 128 bits of SHA-256 of two tenants' names do not meet.
            Ok(Some(_)) => return Err(SessionError::Unknown),
            Ok(None) => {}
            Err(_) => {
                if let Some(session) = self.registry.get(&id) {
                    return Ok(session);
                }
            }
        }
        let session = Session::for_tenant(&self.ctx, id, tenant.clone(), user.cloned(), owner);
        let kept = self.registry.insert_if_absent(session.clone());
        if Arc::ptr_eq(&kept, &session) {
            self.ctx.metrics.set_sessions(self.registry.len());
            if let Err(e) = self.ctx.store.create(&session.id, &session.to_stored()).await {
                self.ctx.metrics.store_error("create");
                tracing::warn!(error = %e, "tenant session not in the session store; only this replica uses it until the store answers");
            }
        }
        Ok(kept)
    }

    /// How often a replica asks the store about a session it is using.
    fn check_every(&self) -> Duration {
        self.options.cache.min(self.options.idle_timeout / 4)
    }

    /// The live session `id`: this replica's copy (checked against the
    /// store at most once per `cache`), or the store's, which this replica
    /// then continues. `Ok(None)`: no such session.
    pub async fn find(&self, id: &str) -> Result<Option<Arc<Session>>, SessionError> {
        if let Some(session) = self.registry.get(id) {
            // Boxed, as the store's other ways below: a request's future
            // holds only what the common case (a session cached here) needs.
            if session.stored && session.due_for_check(self.check_every()) && !Box::pin(self.still_live(&session)).await
            {
                return Ok(None);
            }
            return Ok(Some(session));
        }
        if !self.ctx.store.shared() {
            return Ok(None);
        }
        Box::pin(self.find_in_store(id)).await
    }

    /// [`find`](Self::find) for a session not cached here: loaded from the
    /// store (another replica made it), or waited for while it is repaired.
    async fn find_in_store(&self, id: &str) -> Result<Option<Arc<Session>>, SessionError> {
        let stored = match self.load_patiently(id).await {
            Ok(Loaded::Live(stored)) => stored,
            Ok(Loaded::Ended) => return Ok(None),
            Ok(Loaded::Unknown) => match self.wait_for_repair(id).await {
                Some(stored) => stored,
                None => return Ok(None),
            },
            Err(e) => {
                self.ctx.metrics.store_error("load");
                tracing::debug!(error = %e, "cannot load a session from the store");
                return Err(SessionError::StoreDown);
            }
        };
        let known = stored
            .upstreams
            .iter()
            .filter_map(|(name, at)| Some((self.ctx.upstreams.find(name)?, at.clone())))
            .collect();
        let Some(session) = Session::adopt(&self.ctx, Arc::from(id), &stored.record, known) else {
            tracing::warn!(session = id, "a stored session names an unknown protocol version; treated as unknown");
            return Ok(None);
        };
        let session = self.registry.insert_if_absent(session);
        self.ctx.metrics.adopted();
        self.ctx.metrics.set_sessions(self.registry.len());
        Ok(Some(session))
    }

    /// Loads a session from the store, trying again for up to
    /// [`LOAD_PATIENCE`] if the store cannot answer (a Redis that just came
    /// back, or a link holding back after a failure): the client then
    /// notices nothing, where an immediate 503 would fail its call.
    async fn load_patiently(&self, id: &str) -> Result<Loaded, crate::store::StoreError> {
        let deadline = tokio::time::Instant::now() + LOAD_PATIENCE;
        loop {
            match self.ctx.store.load(id).await {
                Err(_) if tokio::time::Instant::now() + LOAD_RETRY <= deadline => {
                    tokio::time::sleep(LOAD_RETRY).await;
                }
                result => return result,
            }
        }
    }

    /// A session the store does not know, shortly after the store lost
    /// everything: perhaps another replica holds it and has not written it
    /// back yet. Asks every replica to (`repair`), and loads it again, for
    /// at most [`REPAIR_WAIT`]. Long after a loss, or without one, an
    /// unknown session is simply unknown.
    async fn wait_for_repair(&self, id: &str) -> Option<crate::store::Stored> {
        let shared = self.ctx.shared.as_ref()?;
        let recent = match self.ctx.store.generation().await {
            Ok(generation) => generation.age < REPAIR_WINDOW,
            // The store answered the load a moment ago: it may have
            // restarted just before this brief failure. Waited for as if
            // it had (bounded by `REPAIR_WAIT` and `REPAIR_WAITERS`).
            Err(_) => true,
        };
        if !recent {
            return None;
        }
        let Ok(_place) = self.repair_waiters.try_acquire() else {
            tracing::debug!(
                session = id,
                "too many requests wait for sessions to be written back; this one is unknown"
            );
            return None;
        };
        shared.publish_event(Event::Repair, id, 0).await;
        let deadline = tokio::time::Instant::now() + REPAIR_WAIT;
        let mut pause = Duration::from_millis(20);
        loop {
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(tokio::time::Instant::now()))).await;
            match self.ctx.store.load(id).await {
                Ok(Loaded::Live(stored)) => {
                    self.ctx.metrics.waited_for_repair(true);
                    tracing::info!(
                        session = id,
                        "session written back by the replica holding it, after the session store lost it"
                    );
                    return Some(stored);
                }
                Ok(Loaded::Ended) => return None,
                Ok(Loaded::Unknown) | Err(_) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                self.ctx.metrics.waited_for_repair(false);
                return None;
            }
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// News about a session from a replica (this one included): `Opened`
    /// (a new upstream session, upstream index `argument`): a GET stream
    /// listening here hears it too; `Repair`: the store lost the session,
    /// written back at once if this replica holds it.
    pub fn on_event(&self, event: Event, id: &str, argument: usize) {
        let Some(session) = self.registry.get(id) else { return };
        match event {
            Event::Opened => {
                let key = u32::try_from(argument).ok();
                if let Some(u) = key.and_then(|key| self.ctx.upstreams.by_key(key)) {
                    tokio::spawn(async move { session.follow_upstream(u).await });
                }
            }
            Event::Repair if session.stored => {
                let ctx = self.ctx.clone();
                tokio::spawn(async move {
                    if let Ok(Repair::Written) = ctx.store.repair(&session.id, &session.to_stored()).await {
                        ctx.metrics.repaired();
                        tracing::info!(session = %session.id, "session written back to the session store at another replica's request");
                    }
                });
            }
            Event::Repair => {}
        }
    }

    /// Checks whether the store lost everything since the last check (its
    /// generation changed: Redis restarted empty), and if so writes back
    /// every session this replica holds, at once rather than as each is
    /// next used. Called every second with a shared store.
    pub async fn check_generation(&self) {
        let generation = match self.ctx.store.generation().await {
            Ok(generation) => generation.token,
            Err(_) => return,
        };
        let previous = self.generation.lock().expect("lock").replace(generation.clone());
        let lost = previous.is_some_and(|p| p != generation);
        // A write-back the store cut short is done again, whole (those
        // written already are found live), until one finishes.
        let unfinished = self.write_back_unfinished.swap(false, std::sync::atomic::Ordering::Relaxed);
        if !lost && !unfinished {
            return;
        }
        let sessions: Vec<Arc<Session>> = self.registry.all().into_iter().filter(|s| s.stored).collect();
        if lost {
            self.ctx.metrics.store_lost();
            tracing::info!(
                count = sessions.len(),
                "the session store lost its sessions (Redis restarted empty?); writing this replica's back"
            );
        }
        let mut written = 0usize;
        for session in sessions {
            match self.ctx.store.repair(&session.id, &session.to_stored()).await {
                Ok(Repair::Written) => {
                    written += 1;
                    self.ctx.metrics.repaired();
                }
                Ok(_) => {}
                Err(e) => {
                    self.ctx.metrics.store_error("repair");
                    tracing::debug!(error = %e, "cannot write a session back to the store; all are written back again at the next check");
                    self.write_back_unfinished.store(true, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
            }
        }
        tracing::info!(written, "sessions written back to the session store");
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
                if let Some(session) = self.registry.remove(&session.id) {
                    self.ctx.metrics.set_sessions(self.registry.len());
                    session.close_ended_elsewhere().await;
                }
                false
            }
        }
    }

    /// Whether the store has the session live (sliding its expiry), after
    /// writing it back if the store had lost it; `None` if the store cannot
    /// be reached.
    async fn check_store(&self, session: &Session) -> Option<bool> {
        match self.ctx.store.touch(&session.id).await {
            Ok(Touch::Alive) => Some(true),
            Ok(Touch::Ended) => Some(false),
            Ok(Touch::Unknown) => match self.ctx.store.repair(&session.id, &session.to_stored()).await {
                Ok(Repair::Written) => {
                    self.ctx.metrics.repaired();
                    tracing::info!(session = %session.id, "session written back to the session store, which had lost it");
                    Some(true)
                }
                Ok(Repair::Live) => Some(true),
                Ok(Repair::Ended) => Some(false),
                Err(e) => {
                    self.ctx.metrics.store_error("repair");
                    tracing::debug!(error = %e, "cannot write a session back to the store");
                    None
                }
            },
            Err(e) => {
                self.ctx.metrics.store_error("touch");
                tracing::debug!(error = %e, "cannot check a session in the store; serving it from this replica");
                None
            }
        }
    }

    /// Ends a session for good at its client's request (DELETE), here and
    /// at every replica: the store first (if it cannot be reached, other
    /// replicas would go on with the session, so it is not ended anywhere:
    /// [`SessionError::StoreDown`]), then every upstream session it had.
    pub async fn delete(&self, session: &Session) -> Result<(), SessionError> {
        let stored = if session.stored {
            match self.ctx.store.remove(&session.id).await {
                Ok(stored) => stored,
                Err(e) => {
                    self.ctx.metrics.store_error("remove");
                    tracing::warn!(error = %e, "DELETE refused: the session store is unreachable");
                    return Err(SessionError::StoreDown);
                }
            }
        } else {
            None
        };
        let Some(local) = self.registry.remove(&session.id) else { return Err(SessionError::Unknown) };
        self.ctx.metrics.set_sessions(self.registry.len());
        end(&self.ctx, &local.id.clone(), Some(local), stored).await;
        Ok(())
    }

    /// Ends a session only this replica has (a legacy connection that closed).
    pub async fn end_here(&self, id: &str) {
        if let Some(session) = self.registry.remove(id) {
            self.ctx.metrics.set_sessions(self.registry.len());
            session.close().await;
        }
    }

    /// One round of the sweep: sessions the store says expired are ended
    /// (each by exactly one replica); stored sessions in use here (a request
    /// in flight, a GET stream) are kept live in the store; stored sessions
    /// unused here for a while are forgotten here (a shared store keeps them
    /// for other replicas); this replica's own sessions (legacy) expire when
    /// idle.
    pub async fn sweep(&self) {
        let idle = self.options.idle_timeout;
        // Batches of SWEEP_BATCH until the store has no more expired ones
        // (at most SWEEP_BATCHES a round): a steady flow of new sessions
        // must not outrun the sweep.
        for _ in 0..SWEEP_BATCHES {
            let expired = match self.ctx.store.take_expired(SWEEP_BATCH).await {
                Ok(expired) => expired,
                Err(e) => {
                    self.ctx.metrics.store_error("take_expired");
                    tracing::debug!(error = %e, "cannot sweep expired sessions from the store");
                    break;
                }
            };
            if !expired.is_empty() {
                tracing::debug!(count = expired.len(), "sessions expired");
            }
            let full = expired.len() >= SWEEP_BATCH;
            for (id, stored) in expired {
                // Used here since the store last heard of it (touches
                // are at most `check_every` apart): it is not idle.
                if let Some(session) = self.registry.get(&id).filter(|s| s.idle() < idle) {
                    if self.ctx.store.create(&id, &session.to_stored()).await.is_ok() {
                        continue;
                    }
                }
                let local = self.registry.remove(&id);
                end(&self.ctx, &id, local, Some(stored)).await;
            }
            if !full {
                break;
            }
        }
        for session in self.registry.all() {
            if !session.stored {
                continue;
            }
            // Subscriptions kept here keep it here while it lives.
            if session.busy() || session.holds_subscriptions() {
                if session.due_for_check(self.check_every()) {
                    self.still_live(&session).await;
                }
            } else if self.ctx.store.shared() && session.idle() > idle.min(LOCAL_KEEP) {
                // Forgotten here only once the store has it for the others
                // (written back if it had lost it); kept while the store
                // cannot be reached.
                match self.check_store(&session).await {
                    Some(true) => {
                        if let Some(session) = self.registry.remove(&session.id) {
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
        for session in self.registry.take_expired(idle, |s| !s.stored) {
            session.close().await;
        }
        self.ctx.metrics.set_sessions(self.registry.len());
    }

    /// Tells every session (or `tenant`'s) that a list changed: `note` is
    /// the notification, `what` names the change (announced once however
    /// many replicas announce it).
    pub fn announce(&self, note: &Bytes, what: &str, tenant: Option<&str>) {
        let what: Arc<str> = Arc::from(what);
        for session in self.registry.all() {
            if tenant.is_none_or(|t| *session.tenant == *t) {
                session.announce(note.clone(), what.clone());
            }
        }
    }

    /// First step of shutdown: every GET stream ends (clients reconnect
    /// elsewhere); with shared streams, the streams of requests in flight
    /// are handed off too, for their clients to resume at another replica
    /// while this one finishes the requests.
    pub fn begin_shutdown(&self) {
        for session in self.registry.all() {
            session.close_stream();
            session.hand_off_streams();
        }
    }

    /// Waits (at most `limit`) until no request of any session is in flight
    /// here: answers whose streams were handed off are still being relayed.
    pub async fn wait_for_requests(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if !self.registry.all().iter().any(|s| s.has_inflight()) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Last step of shutdown: upstream sessions end, but those of sessions
    /// in a shared store, which other replicas continue.
    pub async fn close_all(&self) {
        for session in self.registry.all() {
            if let Some(session) = self.registry.remove(&session.id) {
                if session.stored && self.ctx.store.shared() {
                    session.detach().await;
                } else {
                    session.close().await;
                }
            }
        }
        self.ctx.metrics.set_sessions(self.registry.len());
    }

    /// Upstream `u` was retired: every session here closes its channel to
    /// it (its upstream session ends) and goes on with the others.
    pub async fn drop_upstream(&self, u: UpstreamId) {
        for session in self.registry.all() {
            session.drop_upstream(u).await;
        }
    }
}

/// Ends a session: its channels here and every upstream session the
/// store lists for it, wherever it was opened.
async fn end(ctx: &Context, id: &str, local: Option<Arc<Session>>, stored: Option<Stored>) {
    if let Some(shared) = &ctx.shared {
        shared.forget(&Arc::from(id));
    }
    let upstreams = &ctx.upstreams;
    let mut closed: HashMap<UpstreamId, UpstreamSession> = HashMap::new();
    if let Some(session) = &local {
        for (u, channel) in session.open_channels() {
            if let Some(at) = channel.upstream_session() {
                closed.insert(u, at);
            }
        }
        session.close().await;
    }
    for (name, at) in stored.iter().flat_map(|s| s.upstreams.iter()) {
        let Some(u): Option<UpstreamId> = upstreams.find(name) else { continue };
        // Closed just now, unless another replica moved it elsewhere.
        if closed.get(&u) == Some(at) {
            continue;
        }
        let discard: Arc<dyn Inbox> = Arc::new(switchboard_upstream::Discard);
        // The DELETE goes with the session's caller's credential, as its
        // requests did.
        let mut hello = switchboard_upstream::Hello::router();
        if let (Some(keychain), Some(record)) = (&ctx.keychain, stored.as_ref().map(|s| &s.record)) {
            let required = upstreams[u].config.credential_required;
            hello.credentials = Some(keychain.credentials(&record.tenant, record.user.as_deref(), name, required));
        }
        if let Some(channel) = upstreams[u].transport.resume(&hello, discard, at) {
            channel.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use async_trait::async_trait;
    use switchboard_core::redis::RedisError;

    use super::*;

    use crate::store::{Claim, Generation, MemoryStore, StoreError};

    /// A store shared with other replicas (as Redis is), in memory, that
    /// can lose everything (a new generation) and fail on cue.
    struct Flaky {
        inner: Mutex<Arc<MemoryStore>>,
        token: Mutex<String>,
        /// Repairs that succeed before the rest fail (`usize::MAX`: all succeed).
        repairs_left: AtomicUsize,
        generation_fails: AtomicBool,
    }

    impl Flaky {
        fn new() -> Arc<Flaky> {
            Arc::new(Flaky {
                inner: Mutex::new(Arc::new(MemoryStore::new(Duration::from_secs(600)))),
                token: Mutex::new("first".into()),
                repairs_left: AtomicUsize::new(usize::MAX),
                generation_fails: AtomicBool::new(false),
            })
        }

        fn inner(&self) -> Arc<MemoryStore> {
            self.inner.lock().unwrap().clone()
        }

        /// As Redis restarting empty.
        fn lose_everything(&self) {
            *self.inner.lock().unwrap() = Arc::new(MemoryStore::new(Duration::from_secs(600)));
            *self.token.lock().unwrap() = "second".into();
        }

        fn fail() -> StoreError {
            StoreError::Redis(RedisError::Backoff)
        }
    }

    #[async_trait]
    impl SessionStore for Flaky {
        fn shared(&self) -> bool {
            true
        }
        fn skip_ahead(&self, by: Duration) {
            self.inner().skip_ahead(by)
        }
        async fn create(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
            self.inner().create(id, stored).await
        }
        async fn repair(&self, id: &str, stored: &Stored) -> Result<Repair, StoreError> {
            let left = self.repairs_left.load(Ordering::Relaxed);
            if left == 0 {
                return Err(Flaky::fail());
            }
            if left != usize::MAX {
                self.repairs_left.store(left - 1, Ordering::Relaxed);
            }
            self.inner().repair(id, stored).await
        }
        async fn load(&self, id: &str) -> Result<Loaded, StoreError> {
            self.inner().load(id).await
        }
        async fn touch(&self, id: &str) -> Result<Touch, StoreError> {
            self.inner().touch(id).await
        }
        async fn upstream(&self, id: &str, upstream: &str) -> Result<Option<UpstreamSession>, StoreError> {
            self.inner().upstream(id, upstream).await
        }
        async fn claim_upstream(
            &self,
            id: &str,
            upstream: &str,
            stale: Option<&UpstreamSession>,
            fresh: &UpstreamSession,
        ) -> Result<Claim, StoreError> {
            self.inner().claim_upstream(id, upstream, stale, fresh).await
        }
        async fn generation(&self) -> Result<Generation, StoreError> {
            if self.generation_fails.load(Ordering::Relaxed) {
                return Err(Flaky::fail());
            }
            Ok(Generation { token: self.token.lock().unwrap().clone(), age: Duration::ZERO })
        }
        async fn remove(&self, id: &str) -> Result<Option<Stored>, StoreError> {
            self.inner().remove(id).await
        }
        async fn take_expired(&self, max: usize) -> Result<Vec<(String, Stored)>, StoreError> {
            self.inner().take_expired(max).await
        }
    }

    fn sessions_on(store: Arc<Flaky>, shared_streams: Option<Arc<SharedStreams>>) -> Sessions {
        let base = crate::testing::context(1, Instant::now());
        let options = Options { idle_timeout: Duration::from_secs(600), cache: Duration::from_secs(1) };
        let setup = Setup {
            upstreams: base.upstreams.clone(),
            store,
            shared_streams,
            metrics: base.metrics.clone(),
            options,
            keychain: None,
        };
        Sessions::new(setup, base.relay.clone())
    }

    fn client() -> Client {
        Client {
            tenant: Arc::from("t"),
            key: Arc::from(""),
            user: None,
            version: switchboard_protocol::ProtocolVersion::LATEST,
            capabilities: Arc::from(serde_json::value::RawValue::from_string("{}".into()).unwrap()),
        }
    }

    const ANY: Quota = Quota { router: 100, tenant: None, key: None };

    #[tokio::test]
    async fn a_write_back_cut_short_by_the_store_is_done_again_at_the_next_check() {
        let store = Flaky::new();
        let sessions = sessions_on(store.clone(), None);
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(sessions.open(client(), ANY).await.unwrap().id.clone());
        }
        sessions.check_generation().await;
        let live = |ids: Vec<Arc<str>>| {
            let store = store.clone();
            async move {
                let mut n = 0;
                for id in ids {
                    n += usize::from(matches!(store.load(&id).await.unwrap(), Loaded::Live(_)));
                }
                n
            }
        };
        assert_eq!(live(ids.clone()).await, 3);

        // Redis restarts empty, and fails again after one session is back.
        store.lose_everything();
        store.repairs_left.store(1, Ordering::Relaxed);
        sessions.check_generation().await;
        assert_eq!(live(ids.clone()).await, 1);
        // It answers again: the next check writes back the rest.
        store.repairs_left.store(usize::MAX, Ordering::Relaxed);
        sessions.check_generation().await;
        assert_eq!(live(ids.clone()).await, 3, "every session written back");
        assert_eq!(sessions.metrics().store_lost_count(), 1, "one loss, counted once");
        assert!(!sessions.write_back_unfinished.load(Ordering::Relaxed), "nothing left for the check after");
    }

    #[tokio::test]
    async fn a_session_the_store_lost_is_waited_for_when_the_stores_generation_cannot_be_read() {
        // Streams on a Redis that is not there: the request for a write-back
        // is not heard; the replica holding the session writes it back anyway
        // (its own check), as `holder` does here.
        let nowhere =
            switchboard_core::redis::RedisLink::new("redis://127.0.0.1:1", "t:", Duration::from_millis(200)).unwrap();
        let shared = SharedStreams::start(
            nowhere,
            Duration::from_secs(600),
            crate::testing::context(0, Instant::now()).metrics.clone(),
        );
        let store = Flaky::new();
        let sessions = sessions_on(store.clone(), Some(shared));
        store.generation_fails.store(true, Ordering::Relaxed);
        let holder = {
            let store = store.inner();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                store.create("s1", &crate::store::tests::sample("t")).await.unwrap();
            })
        };
        let found = sessions.find("s1").await.unwrap();
        holder.await.unwrap();
        assert_eq!(found.expect("the session, written back by the replica holding it").tenant.as_ref(), "t");
        // One that nobody holds is unknown once the wait is over.
        let started = tokio::time::Instant::now();
        assert!(sessions.find("s2").await.unwrap().is_none());
        assert!(started.elapsed() >= REPAIR_WAIT);
    }
}
