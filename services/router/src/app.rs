//! The router's shared state: configuration, upstreams, catalog, sessions,
//! metrics; and the rules for messages that come from upstreams on their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use switchboard_core::UpstreamId;

use bytes::Bytes;
use switchboard_protocol::jsonrpc::{self, span, Envelope, MessageKind, Target};
use switchboard_protocol::methods::ListKind;
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::Method;

use tokio::sync::mpsc;

use crate::auth::{Authenticator, Front};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::tools::{CatalogTools, DeviceTools, ToolSource};
use switchboard_audit::Audit;
use switchboard_catalog::Catalog;
use switchboard_core::policy::Principal;
use switchboard_db::Database;
use switchboard_limits::Limiter;
use switchboard_session::shared_streams::SharedStreams;
use switchboard_session::{Relay, Session, Sessions};
use switchboard_tenancy::Directory;
use switchboard_upstream::{self as upstream, Inbox, Upstream, Upstreams};

/// A legacy connection's stream, and the tenant and caller (key or user,
/// [`switchboard_core::policy::Principal::key_id`]) that opened it.
type LegacyConnection = (mpsc::Sender<Bytes>, Arc<str>, Arc<str>);

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
    pub catalog: Arc<Catalog>,
    /// How callers are authenticated (API keys, OAuth access tokens) and
    /// what their scopes allow.
    pub auth: Arc<dyn Authenticator>,
    /// Where tools come from, asked in this order: edge devices, the catalog.
    pub tools: Vec<Arc<dyn ToolSource>>,
    /// The catalog as a tool source (prompts and the router's own calls
    /// resolve through it too).
    pub catalog_tools: Arc<CatalogTools>,
    /// This replica's sessions: a cache of the session store (memory, or
    /// Redis shared by every replica).
    pub sessions: Sessions,
    pub metrics: Arc<Metrics>,
    /// Tenants and API keys (an in-memory copy of the database's).
    pub directory: Arc<Directory>,
    pub limiter: Limiter,
    /// `None` without a database or with `audit.enabled = false`.
    pub audit: Option<Audit>,
    pub database: Option<Database>,
    /// Upstream credentials of tenants and users (opened from the database).
    pub vault: switchboard_vault::Vault,
    /// Whose credentials requests carry: the vault's, and exchanged tokens.
    pub keychain: Arc<crate::keychain::RouterKeychain>,
    /// The upstreams that act for each user with their consent, and their
    /// users' tokens (empty when none does).
    pub delegation: Arc<crate::delegation::Delegation>,
    /// The upstreams that take each caller's own token, exchanged (empty
    /// when none does).
    pub exchange: Arc<crate::token_exchange::TokenExchange>,
    /// Each user's catalog of the upstreams acting for each user (empty
    /// when none does).
    pub user_catalogs: Arc<crate::user_catalogs::UserCatalogs>,
    /// Edge devices and their tools.
    pub edge: Arc<switchboard_devices::Devices>,
    /// Traces, and the MCP metrics of the OpenTelemetry conventions.
    pub telemetry: switchboard_telemetry::Telemetry,
    /// Each upstream's host, port and port as text (none for stdio), as
    /// spans and the MCP client metrics name it; by id.
    addresses: switchboard_core::slots::Slots<Option<Address>>,
    shutting_down: AtomicBool,
    /// List changes, for stateless clients' `subscriptions/listen` streams.
    pub changes: tokio::sync::broadcast::Sender<Change>,
    /// The key that signs the `requestState` of bridged calls (shared by
    /// the replicas through Redis, else this process's own).
    state_key: RwLock<Option<(String, [u8; 32])>>,
    /// Input requests of stateless upstreams awaiting the client's answer,
    /// by the router's id (`m.…`).
    awaiting: Mutex<HashMap<String, AwaitedAnswer>>,
    /// Refusals of upstream requests being sent back at once
    /// ([`REFUSALS_IN_FLIGHT`]), and waiting to be ([`REFUSALS_QUEUED`]);
    /// beyond, a refusal is counted, not sent.
    refusals: Arc<tokio::sync::Semaphore>,
    refusals_queued: Arc<std::sync::atomic::AtomicUsize>,
    /// Legacy HTTP+SSE connections waiting for their `initialize`.
    legacy: Mutex<HashMap<Arc<str>, LegacyConnection>>,
    /// Spans of server-to-client requests relayed, until their answers.
    pub(crate) relayed_spans: crate::relayed_spans::RelayedSpans,
    /// Progressive discovery's metrics and its callers' last results.
    pub(crate) discoveries: crate::tools::meta::Discoveries,
    /// Tool-definition pinning: each pinning tenant's approved definitions.
    pub pins: Arc<crate::pins::Pins>,
    /// The live call feed (operators watching).
    pub feed: crate::feed::Feed,
}

/// Upstream `u`'s address, as telemetry names it (none for stdio).
fn address_of(u: &Upstream) -> Option<Address> {
    u.address().map(|(host, port)| Address { host, port, port_text: port.to_string().into() })
}

/// An upstream's address, as telemetry names it.
pub struct Address {
    pub host: Arc<str>,
    pub port: u16,
    pub port_text: Box<str>,
}

impl App {
    /// Upstream `u`'s host and port (none for stdio).
    pub fn upstream_address(&self, u: UpstreamId) -> Option<&Address> {
        self.addresses.get(u.index()).and_then(Option::as_ref)
    }

    /// Records an added upstream's address.
    pub(crate) fn set_address(&self, upstream: &Upstream) {
        self.addresses.set(upstream.id.index(), address_of(upstream));
    }

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
        let directory = Arc::new(Directory::new(
            names.clone(),
            config.tenants.clone(),
            database.clone(),
            !config.auth.required,
            metrics.tenancy.clone(),
        ));
        let front = match &config.oauth {
            Some(oauth) => Front::with_oauth(directory.clone(), oauth.clone(), metrics.oauth.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("[oauth]: {e}")))?,
            None => Front::keys(directory.clone()),
        };
        let vault = switchboard_vault::Vault::new(
            database.clone(),
            config.vault.keyring(),
            config.vault.max_per_tenant,
            metrics.registry(),
        );
        let subjects = config.mtls.as_ref().map(|m| m.subjects.clone()).unwrap_or_default();
        if let (Some(settings), Some(every)) = (&config.telemetry.export, config.telemetry.metrics_interval) {
            switchboard_telemetry::otlp_metrics::start(settings, metrics.registry(), every);
        }
        let telemetry = match &config.telemetry.export {
            Some(settings) => {
                switchboard_telemetry::Telemetry::exporting(settings, config.telemetry.sample_ratio, metrics.registry())
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("[telemetry]: {e}")))?
            }
            None => switchboard_telemetry::Telemetry::metrics_only(metrics.registry()),
        };

        let auth: Arc<dyn Authenticator> = Arc::new(front.with_client_certs(subjects));
        let audit = match (&database, config.audit.enabled) {
            (Some(db), true) => Some(Audit::start(
                db.clone(),
                &config.audit.spool,
                switchboard_audit::Options {
                    queue: config.audit.queue,
                    batch: config.audit.batch,
                    write_timeout: config.audit.write_timeout,
                    retry_every: config.audit.retry_every,
                    flush_every: config.audit.flush_every,
                },
                metrics.audit.clone(),
            )?),
            _ => None,
        };
        // Every link to Redis reports to one health: one line when it goes, one when it is back.
        let redis_health = match &config.redis.url {
            Some(_) => switchboard_core::redis::RedisHealth::new(metrics.registry()),
            None => switchboard_core::redis::RedisHealth::unreported(),
        };
        let redis = match &config.redis.url {
            Some(url) => Some(
                switchboard_core::redis::RedisLink::with_health(
                    url,
                    &config.redis.key_prefix,
                    config.redis.timeout,
                    redis_health.clone(),
                )
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
            ),
            None => None,
        };
        let shared = redis.clone().filter(|_| config.sessions.redis);
        // The streams get a connection of their own (see shared_streams.rs).
        let shared_streams = match (&config.redis.url, config.sessions.redis) {
            (Some(url), true) => Some(SharedStreams::start(
                switchboard_core::redis::RedisLink::with_health(
                    url,
                    &config.redis.key_prefix,
                    switchboard_session::shared_streams::TIMEOUT,
                    redis_health.clone(),
                )
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
                config.server.session_idle_timeout,
                metrics.sessions.clone(),
            )),
            _ => None,
        };
        let store = switchboard_session::store::build(shared, config.server.session_idle_timeout);
        let limiter = Limiter::new(redis.map(switchboard_limits::cluster::Shared::new), metrics.limits.clone());
        let reserved: Vec<String> = config
            .upstreams
            .iter()
            .flat_map(|u| [u.name.clone(), u.prefix.clone()])
            .filter(|p| !p.is_empty())
            .collect();
        let edge = Arc::new(switchboard_devices::Devices::new(
            config.edge.clone(),
            &config.catalog.separator,
            reserved,
            metrics.edge.clone(),
        ));
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
            let catalog = Arc::new(
                Catalog::new(upstreams.clone(), config.catalog.clone(), metrics.catalog.clone(), inbox, announce)
                    .covering(|u| !u.config.per_user),
            );
            // Made even when no upstream acts for each user: a reload may add one.
            let exchange = Arc::new(crate::token_exchange::TokenExchange::new(&config.exchanged, metrics.registry()));
            let keychain =
                Arc::new(crate::keychain::RouterKeychain { vault: vault.clone(), exchange: exchange.clone() });
            let user_catalogs = Arc::new(crate::user_catalogs::UserCatalogs::new(keychain.clone()));
            let base = config.server.public_url.clone().unwrap_or_else(|| format!("http://{}", config.server.listen));
            let delegation = Arc::new(crate::delegation::Delegation::new(
                vault.clone(),
                base,
                &config.delegated,
                user_catalogs.clone(),
                metrics.registry(),
            ));
            let addresses = switchboard_core::slots::Slots::new();
            for u in upstreams.iter() {
                addresses.set(u.id.index(), address_of(u));
            }
            let discoveries = crate::tools::meta::Discoveries::new(metrics.registry());
            let pins = Arc::new(crate::pins::Pins::new(database.clone(), metrics.registry()));
            let catalog_tools =
                Arc::new(CatalogTools { catalog: catalog.clone(), upstreams: upstreams.clone(), pins: pins.clone() });
            let relay: Weak<dyn Relay> = me.clone();
            let sessions = Sessions::new(
                switchboard_session::Setup {
                    upstreams: upstreams.clone(),
                    store,
                    shared_streams,
                    metrics: metrics.sessions.clone(),
                    options: switchboard_session::Options {
                        idle_timeout: config.server.session_idle_timeout,
                        cache: config.sessions.cache,
                    },
                    keychain: Some(keychain.clone()),
                },
                relay,
            );
            App {
                catalog,
                auth,
                tools: vec![
                    Arc::new(crate::tools::MetaTools(config.catalog.separator.clone())),
                    Arc::new(DeviceTools(edge.clone())),
                    catalog_tools.clone(),
                ],
                catalog_tools,
                config,
                upstreams,
                sessions,
                metrics,
                directory,
                limiter,
                audit,
                database,
                vault,
                keychain,
                delegation,
                exchange,
                user_catalogs,
                telemetry,
                addresses,
                edge,
                shutting_down: AtomicBool::new(false),
                changes: tokio::sync::broadcast::channel(256).0,
                state_key: RwLock::new(None),
                awaiting: Mutex::new(HashMap::new()),
                refusals: Arc::new(tokio::sync::Semaphore::new(REFUSALS_IN_FLIGHT)),
                refusals_queued: Arc::default(),
                legacy: Mutex::new(HashMap::new()),
                relayed_spans: Default::default(),
                discoveries,
                pins,
                feed: crate::feed::Feed::default(),
            }
        });
        if let Some(shared) = app.sessions.shared_streams() {
            let weak = Arc::downgrade(&app);
            shared.on_event(Box::new(move |event, session, argument| {
                if let Some(app) = weak.upgrade() {
                    app.sessions.on_event(event, session, argument);
                }
            }));
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
                        session.cancel_here(&env, &notification).await;
                    }
                });
            }));
        }
        Ok(app)
    }

    /// Migrates the database (if configured to) and loads tenants and keys;
    /// a database that cannot be reached is logged, not fatal: the router
    /// knows the tenants of its config file and retries in the background
    /// (the migrations too: a database that comes up after the router, as
    /// in a compose file, may be empty). The vault too, except that
    /// credentials the configured keys cannot open are an error: the
    /// router does not start with the wrong vault key.
    pub async fn prepare(&self) -> std::io::Result<()> {
        let Some(db) = &self.database else { return Ok(()) };
        if self.config.database.migrate_on_start {
            if let Err(e) = db.migrate().await {
                tracing::error!(error = %e, "database migrations failed; retrying in the background (`switchboard migrate` shows why)");
                let (db, every) = (db.clone(), self.config.database.refresh);
                let directory = Arc::downgrade(&self.directory);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        // Until the router stops.
                        let Some(directory) = directory.upgrade() else { return };
                        if db.migrate().await.is_ok() {
                            tracing::info!("database migrations applied");
                            let _ = directory.reload().await;
                            return;
                        }
                    }
                });
            }
        }
        match self.directory.reload().await {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot load tenants and keys from the database yet; retrying in the background");
            }
        }
        if let Err(e) = self.pins.load().await {
            tracing::warn!(error = %e, "cannot load tool pins yet; pinning tenants' tools are withheld until they load (retried in the background)");
        }
        match self.vault.load().await {
            Ok(()) => {}
            Err(e @ switchboard_vault::VaultError::Unreadable(_)) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot load the vault's credentials yet; retrying in the background");
            }
        }
        Ok(())
    }

    /// Starts background work: the catalog warm-up, the session sweeper and
    /// the tenant directory refresh.
    pub fn start(self: &Arc<Self>) {
        self.directory.start(self.config.database.refresh);
        self.vault.start(self.config.database.refresh);
        self.delegation.start_renewing();
        self.pins.start(Arc::downgrade(self), self.config.database.refresh);
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
                app.sessions.sweep().await;
                app.reassert_state_key().await;
            }
        });
        if self.sessions.shared_streams().is_some() {
            // A store that restarted empty is noticed within a second, and
            // this replica's sessions written back.
            let app = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    let Some(sessions) = app.upgrade() else { return };
                    sessions.sessions.check_generation().await;
                    drop(sessions);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
    }

    /// Registers a legacy HTTP+SSE connection until its `initialize` arrives
    /// (connections that closed meanwhile are forgotten); `tenant` opened it.
    pub fn legacy_connect(&self, id: Arc<str>, stream: mpsc::Sender<Bytes>, who: &Principal) {
        let mut legacy = self.legacy.lock().expect("lock");
        legacy.retain(|_, (s, _, _)| !s.is_closed());
        legacy.insert(id, (stream, who.tenant.name.clone(), who.key_id.clone()));
    }

    /// Takes a legacy connection's stream for its `initialize`, if `who`
    /// opened it.
    pub fn legacy_take(&self, id: &str, who: &Principal) -> Option<mpsc::Sender<Bytes>> {
        let mut legacy = self.legacy.lock().expect("lock");
        if legacy.get(id).is_some_and(|(_, t, k)| *t != who.tenant.name || *k != who.key_id) {
            return None;
        }
        legacy.remove(id).map(|(s, _, _)| s).filter(|s| !s.is_closed())
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
        self.sessions.begin_shutdown();
    }

    /// Last step of shutdown: end upstream sessions and stop child processes.
    /// Sessions in a shared store go on at other replicas: their upstream
    /// sessions are left open for them.
    pub async fn close(&self) {
        self.edge.close_all();
        self.sessions.close_all().await;
        if let Some(shared) = self.sessions.shared_streams() {
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
        // The spans of the last requests, gathered for a batch, go too.
        self.telemetry.close(self.config.server.shutdown_grace).await;
    }

    /// An upstream's list changed: mark it stale and, if clients may have
    /// seen it, tell every session once; listen streams hear of every change.
    pub fn list_changed(&self, u: UpstreamId, kind: ListKind) {
        if kind == ListKind::Tools {
            // Pinned definitions are checked against the list fetched anew.
            self.pins.wake();
        }
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
        self.sessions.announce(&note, ListKind::Tools.changed_notification(), Some(tenant));
    }

    /// Tells every session that a list changed, in a change that `tag`
    /// names the same at every replica (the configuration's version): the
    /// client hears it once however many replicas apply it, and hears
    /// each change.
    pub(crate) fn announce_change(&self, kind: ListKind, tag: &str) {
        if kind == ListKind::Tools {
            self.pins.wake();
        }
        let _ = self.changes.send(Change::List(kind, None));
        let note = jsonrpc::request(None, kind.changed_notification(), None);
        self.sessions.announce(&note, &format!("{}#{tag}", kind.changed_notification()), None);
    }

    /// Tells every session that a list changed.
    fn announce(&self, kind: ListKind) {
        if kind == ListKind::Tools {
            self.pins.wake();
        }
        let _ = self.changes.send(Change::List(kind, None));
        let note = jsonrpc::request(None, kind.changed_notification(), None);
        self.sessions.announce(&note, kind.changed_notification(), None);
    }

    /// [`Relay::relay`] for a message already parsed.
    pub fn relay_parsed(&self, session: &Session, u: UpstreamId, env: &Envelope<'_>, message: &Bytes) -> Option<Bytes> {
        self.relay_within(session, u, env, message, None)
    }

    /// [`relay_parsed`](Self::relay_parsed) for a message that comes within
    /// a call whose trace and span towards the upstream are `within`.
    pub(crate) fn relay_within(
        &self,
        session: &Session,
        u: UpstreamId,
        env: &Envelope<'_>,
        message: &Bytes,
        within: Option<(&switchboard_telemetry::Trace, switchboard_telemetry::SpanId)>,
    ) -> Option<Bytes> {
        match env.kind {
            MessageKind::Request => {
                // A client is asked only what it said it can answer.
                let method = Method::from_name(env.method_str());
                if method.client_capability().is_some_and(|c| !session.declares(c)) {
                    self.not_delivered(session, u, message, "undeclared_capability");
                    return None;
                }
                let relayed = session.ask(u, env, message);
                if !self.telemetry.tracing() {
                    return Some(relayed);
                }
                let their_id = env.id.map(|id| id.get()).unwrap_or("");
                let ours = session.asked_cancelled(u, their_id);
                let name = &self.upstreams[u].name;
                Some(self.relayed_spans.begin(&self.telemetry, &session.id, name, &ours, relayed, within))
            }
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

/// Cross-replica state of the stateless bridge: awaited answers and the
/// `requestState` key.
impl App {
    /// Waits (at most `ttl`) for the answer of session `session`'s client
    /// to the input request `ours` (an id of the form `m.…`, unique to this
    /// request); with shared sessions, every replica can tell it is awaited.
    pub async fn await_answer(self: &Arc<Self>, session: &Arc<str>, ours: &str, ttl: Duration) -> Awaiting {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.awaiting.lock().expect("lock").insert(ours.to_owned(), (session.clone(), tx));
        if let Some(shared) = self.sessions.shared_streams() {
            shared.expect_answer(session, ours, ttl).await;
        }
        Awaiting { rx, app: Arc::downgrade(self), ours: ours.to_owned(), session: session.clone() }
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
        let own = switchboard_core::ids::random_hex(32);
        let text = match self.sessions.shared_streams() {
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
        let (Some(shared), Some((ours, _))) =
            (self.sessions.shared_streams(), self.state_key.read().expect("lock").clone())
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

/// Refusals of upstream requests being sent back at once, at most, and
/// waiting to be.
const REFUSALS_IN_FLIGHT: usize = 256;
const REFUSALS_QUEUED: usize = 65_536;

impl Relay for App {
    fn not_delivered(&self, session: &Session, u: UpstreamId, message: &Bytes, reason: &'static str) {
        let upstream = &self.upstreams[u];
        self.metrics.upstreams.relay_dropped(&upstream.name, reason);
        let Ok(env) = Envelope::parse(message) else { return };
        let (MessageKind::Request, Some(id)) = (env.kind, env.id) else {
            tracing::debug!(upstream = %upstream.name, session = %session.id, reason, "message for the client dropped");
            return;
        };
        let (code, why) = match reason {
            "undeclared_capability" => (
                jsonrpc::code::METHOD_NOT_FOUND,
                format!("the client did not declare the capability {} needs", env.method_str()),
            ),
            _ => (
                jsonrpc::code::INTERNAL_ERROR,
                "the router could not pass this request on: the client is not reading the messages already waiting for it"
                    .to_owned(),
            ),
        };
        tracing::debug!(upstream = %upstream.name, session = %session.id, reason, method = env.method_str(),
            "server-to-client request refused back to the upstream");
        let answer = jsonrpc::error_response(Some(id), code, &why, None);
        let Some(channel) = session.open_channel(u) else {
            tracing::debug!(upstream = %upstream.name, "no channel to refuse a request on");
            return;
        };
        let queued = self.refusals_queued.clone();
        if queued.fetch_add(1, Ordering::Relaxed) >= REFUSALS_QUEUED {
            queued.fetch_sub(1, Ordering::Relaxed);
            // An upstream flooding far faster than it takes answers: the
            // refusal is counted (above), not sent.
            tracing::debug!(upstream = %upstream.name, "too many refusals on their way; this one is not sent");
            return;
        }
        let places = self.refusals.clone();
        tokio::spawn(async move {
            let place = places.acquire_owned().await;
            let _ = channel.send(answer).await;
            drop(place);
            queued.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// What a session's client should see of a message upstream `u` sent
    /// outside a response: requests get a session-unique id, cancellations of
    /// them are mapped, list changes are absorbed (and announced once by
    /// [`App::list_changed`]). `None` means nothing to deliver.
    fn relay(&self, session: &Session, u: UpstreamId, message: &Bytes) -> Option<Bytes> {
        match Envelope::parse(message) {
            Ok(env) => self.relay_parsed(session, u, &env, message),
            Err(_) => {
                self.metrics.upstreams.protocol_error(&self.upstreams[u].name);
                None
            }
        }
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
    session: Arc<str>,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        if let Some(app) = self.app.upgrade() {
            app.awaiting.lock().expect("lock").remove(&self.ours);
            if let Some(shared) = app.sessions.shared_streams().cloned() {
                let (session, ours) = (self.session.clone(), std::mem::take(&mut self.ours));
                tokio::spawn(async move { shared.forget_answer(&session, &ours).await });
            }
        }
    }
}

impl crate::pins::Running for App {
    fn directory(&self) -> &Directory {
        &self.directory
    }

    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn upstreams(&self) -> &Upstreams {
        &self.upstreams
    }

    fn audit(&self) -> Option<&Audit> {
        self.audit.as_ref()
    }

    fn announce_tools(&self, tenant: &str) {
        App::announce_tools(self, tenant)
    }
}
