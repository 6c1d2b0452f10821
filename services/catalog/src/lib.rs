//! The merged catalog: every upstream's tools, prompts, resources and
//! resource templates under their exposed names.
//!
//! Lists are fetched over each upstream's *control* channel (a session of the
//! router's own), concurrently and each within its upstream's `list_timeout`,
//! following the upstream's cursors. An upstream that fails or is too slow is
//! left out, logged and counted, and not asked again for `retry_after`; the
//! list still answers. Fetched lists are cached until a
//! `notifications/*/list_changed` marks them stale.
//!
//! Readers never lock: every change builds a new immutable [`Snapshot`]
//! (indexes, and each list pre-serialised as JSON) and swaps it in. Refreshes
//! are single-flight.
//!
//! Names that collide after namespacing are never merged: the item of the
//! upstream listed first in the configuration wins, the other is left out, and
//! the collision is logged and counted.

pub mod cursor;
pub mod metrics;
pub mod naming;
pub mod search;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchboard_core::credential::{Credential, Credentials};
use switchboard_core::slots::Slots;
use switchboard_core::UpstreamId;

use arc_swap::ArcSwap;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};
use switchboard_protocol::jsonrpc;
use switchboard_protocol::methods::ListKind;

pub use crate::metrics::Metrics;
use switchboard_upstream::{collect_response, Channel, Handshake, Hello, Inbox, Outgoing, UpstreamError, Upstreams};

/// `[catalog]`: how lists are merged and served.
#[derive(Debug, Clone)]
pub struct CatalogConfig {
    /// Between upstream prefix and tool or prompt name.
    pub separator: String,
    /// Items per page of a list answer; 0 for one page with everything.
    pub page_size: usize,
    /// An upstream whose list failed is left out this long before it is asked again.
    pub retry_after: Duration,
    /// At most this many pages are read from one upstream's list.
    pub max_upstream_pages: usize,
    /// One upstream's list with more items than this is left out.
    pub max_upstream_items: usize,
    /// One upstream's list whose pages (as received) add up to more bytes
    /// than this is left out; a page is measured before it is parsed.
    pub max_upstream_bytes: usize,
}

/// One exposed item.
#[derive(Debug)]
pub struct Item {
    /// Index of the upstream it comes from.
    pub upstream: UpstreamId,
    /// The name or URI clients see.
    pub exposed: Box<str>,
    /// The upstream's own name or URI, as a JSON string literal (ready to splice).
    pub original: Arc<[u8]>,
    /// The upstream's own name or URI (what tenant tool patterns match).
    pub name: Box<str>,
    /// The item as clients see it, serialised.
    pub json: Bytes,
    /// A digest of its definition, made when first needed (the router's
    /// tool-definition pinning).
    pub digest: std::sync::OnceLock<[u8; 32]>,
}

/// One merged list.
#[derive(Debug)]
pub struct Listing {
    /// Items in order: upstreams in configuration order, each in its own order.
    pub items: Vec<Item>,
    /// Exposed name or URI → position in `items`. Hashed with foldhash
    /// (seeded at random), not SipHash: read on every call, its keys
    /// bounded by `max_upstream_items`.
    pub index: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    /// Per upstream that contributed: `(upstream, first item, count)`, in order.
    pub spans: Vec<(UpstreamId, usize, usize)>,
    /// All items as one JSON array.
    pub all: Bytes,
}

impl Default for Listing {
    fn default() -> Self {
        Listing { items: Vec::new(), index: HashMap::default(), spans: Vec::new(), all: Bytes::from_static(b"[]") }
    }
}

impl Listing {
    /// The item with this exposed name or URI.
    pub fn get(&self, exposed: &str) -> Option<&Item> {
        self.index.get(exposed).map(|&i| &self.items[i])
    }

    /// Appends upstream `u`'s items, exposed by `expose`. Items whose exposed
    /// name is already taken are left out; their names are returned, each
    /// with the upstream whose item has it (`u` itself for a name the
    /// upstream lists twice).
    pub fn extend(
        &mut self,
        u: UpstreamId,
        kind: ListKind,
        items: &[Map<String, Value>],
        expose: impl Fn(&str) -> String,
    ) -> Vec<(String, UpstreamId)> {
        let key_field = match kind {
            ListKind::Tools | ListKind::Prompts => "name",
            ListKind::Resources => "uri",
            ListKind::ResourceTemplates => "uriTemplate",
        };
        let start = self.items.len();
        let mut collisions = Vec::new();
        for item in items {
            let Some(original) = item.get(key_field).and_then(Value::as_str) else { continue };
            let exposed = expose(original);
            if let Some(&at) = self.index.get(exposed.as_str()) {
                collisions.push((exposed, self.items[at].upstream));
                continue;
            }
            let mut shown = item.clone();
            shown.insert(key_field.to_owned(), Value::String(exposed.clone()));
            let json = Bytes::from(serde_json::to_vec(&shown).expect("serializable"));
            self.index.insert(exposed.clone().into_boxed_str(), self.items.len());
            self.items.push(Item {
                upstream: u,
                exposed: exposed.into_boxed_str(),
                original: jsonrpc::json_string(original).into(),
                name: original.into(),
                json,
                digest: std::sync::OnceLock::new(),
            });
        }
        self.spans.push((u, start, self.items.len() - start));
        collisions
    }

    /// Pre-serialises the whole list as one JSON array; call after the last `extend`.
    pub fn seal(&mut self) {
        let mut all = BytesMut::with_capacity(self.items.iter().map(|i| i.json.len() + 1).sum::<usize>() + 2);
        all.put_u8(b'[');
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                all.put_u8(b',');
            }
            all.put_slice(&item.json);
        }
        all.put_u8(b']');
        self.all = all.freeze();
    }
}

/// What the router can promise clients, merged from upstream capabilities.
#[derive(Debug, Default, Clone)]
pub struct Merged {
    pub logging: bool,
    pub completions: bool,
    pub subscribe: bool,
    /// Each upstream's instructions, labelled with its name.
    pub instructions: Option<String>,
}

/// An immutable view of the catalog.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Bumped on every rebuild.
    pub generation: u64,
    lists: [Listing; 4],
    pub merged: Merged,
    /// The search index of its tools, built when first searched.
    tool_index: std::sync::OnceLock<search::Index>,
}

impl Snapshot {
    /// The merged list of `kind`.
    pub fn list(&self, kind: ListKind) -> &Listing {
        &self.lists[kind as usize]
    }

    /// The search index of its tools (documents numbered as the tools list's
    /// items), built on first use.
    pub fn tool_index(&self) -> &search::Index {
        self.tool_index.get_or_init(|| {
            search::Index::build(self.list(ListKind::Tools).items.iter().map(|item| {
                let tool: Value = serde_json::from_slice(&item.json).unwrap_or_default();
                search::tool_words(&item.exposed, &tool)
            }))
        })
    }
}

/// Lists a caller fetches itself (with their change counts as the fetch
/// starts), and lists another caller is fetching.
type Claims = (Vec<(UpstreamId, ListKind, u64)>, Vec<(UpstreamId, ListKind)>);

/// Rounds a caller waits for lists other callers fetch before it goes on
/// with what it has.
const WAIT_ROUNDS: usize = 3;

/// One upstream's four cached lists, as fetched.
type CachedLists = [Option<Arc<Vec<Map<String, Value>>>>; 4];

#[derive(Default)]
struct ListState {
    items: Option<Arc<Vec<Map<String, Value>>>>,
    fresh: bool,
    /// When a stateless upstream's `ttlMs` says the list goes stale.
    expires: Option<Instant>,
    failed_at: Option<Instant>,
    /// A fetch is under way.
    fetching: bool,
    /// Bumped by every `list_changed`; a fetch that started before one is
    /// not fresh when it ends.
    changes: u64,
}

#[derive(Default)]
struct UpstreamState {
    control: Option<Arc<dyn Channel>>,
    handshake: Option<Arc<Handshake>>,
    lists: [ListState; 4],
    /// Its era, once probed: `Some(true)` if it speaks 2026-07-28.
    modern: Option<bool>,
    /// A 2026-07-28 upstream that speaks no session version besides.
    stateless_only: bool,
    /// A stateless upstream's `subscriptions/listen` stream (list changes).
    listener: Option<tokio::task::JoinHandle<()>>,
    /// How it last refused a list for want of authorization: the status
    /// and its challenge.
    refusal: Option<(u16, String)>,
    /// Its last failure to list, and when (ms since the epoch).
    last_error: Option<(String, i64)>,
}

/// How an upstream fares in the catalog, as the admin API shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UpstreamStatus {
    /// Its lists answer (those fetched so far, at least one).
    pub up: bool,
    /// The protocol version it speaks (`None`: not yet known).
    pub protocol_version: Option<String>,
    /// Items of each list in the catalog: tools, prompts, resources,
    /// resource templates.
    pub tools: usize,
    pub prompts: usize,
    pub resources: usize,
    pub resource_templates: usize,
    /// Its last failure to list (it may have recovered since), and when
    /// (ms since the epoch).
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<i64>,
}

/// Builds the inbox for an upstream's control channel.
pub type InboxFactory = Box<dyn Fn(UpstreamId) -> Arc<dyn Inbox> + Send + Sync>;

/// Tells clients that a list changed (an upstream was left out or came back).
pub type Announce = Box<dyn Fn(ListKind) + Send + Sync>;

/// Whose credential the catalog's requests to an upstream carry (a user's
/// catalog of the upstreams that act for each user).
pub type Acting = Box<dyn Fn(UpstreamId) -> Arc<dyn Credentials> + Send + Sync>;

/// Which upstreams a catalog lists.
type Covers = Box<dyn Fn(&switchboard_upstream::Upstream) -> bool + Send + Sync>;

/// Which upstream serves an exposed URI: by its scheme prefix, else the
/// upstreams without a prefix.
#[derive(Default)]
struct UriRoutes {
    scheme_index: HashMap<String, UpstreamId>,
    unprefixed: Vec<UpstreamId>,
}

/// The catalog of every upstream.
pub struct Catalog {
    upstreams: Upstreams,
    config: CatalogConfig,
    metrics: Arc<Metrics>,
    /// Each upstream's lists and channel, by id, made on first use.
    states: Slots<Box<Mutex<UpstreamState>>>,
    /// One opening of a control channel (or era probe) at a time per upstream.
    opening: Slots<tokio::sync::Mutex<()>>,
    snapshot: ArcSwap<Snapshot>,
    /// Held while a snapshot is built and swapped in: the last one built
    /// is built from the latest lists.
    rebuilding: Mutex<()>,
    /// Bumped whenever fetches settle: callers waiting for a list another
    /// caller is fetching look again.
    settled: tokio::sync::watch::Sender<u64>,
    /// Names already reported as colliding (logged and counted once each),
    /// as hashes of (upstream, list, name).
    reported: Mutex<std::collections::HashSet<u64>>,
    generation: AtomicU64,
    /// Each upstream's URI scheme prefix, by id, made on first use.
    scheme_prefixes: Slots<String>,
    /// Which upstream in the set serves a URI.
    routes: ArcSwap<UriRoutes>,
    inbox: InboxFactory,
    announce: Announce,
    /// The upstreams it lists (the others are some user's catalog's, or
    /// the router's); `None`: all.
    covers: Option<Covers>,
    /// A user's catalog: whose credentials its requests carry.
    acting: Option<Acting>,
}

impl Catalog {
    /// An empty catalog over `upstreams`; nothing is fetched until asked.
    pub fn new(
        upstreams: Upstreams,
        config: CatalogConfig,
        metrics: Arc<Metrics>,
        inbox: InboxFactory,
        announce: Announce,
    ) -> Self {
        let catalog = Catalog {
            states: Slots::new(),
            opening: Slots::new(),
            upstreams,
            config,
            metrics,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            rebuilding: Mutex::new(()),
            settled: tokio::sync::watch::Sender::new(0),
            reported: Mutex::default(),
            generation: AtomicU64::new(0),
            scheme_prefixes: Slots::new(),
            routes: ArcSwap::from_pointee(UriRoutes::default()),
            inbox,
            announce,
            covers: None,
            acting: None,
        };
        catalog.route_uris();
        catalog
    }

    /// The catalog of only the upstreams `covers` picks.
    pub fn covering(
        mut self,
        covers: impl Fn(&switchboard_upstream::Upstream) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.covers = Some(Box::new(covers));
        self
    }

    /// Upstream `u`'s lists and channel.
    fn state(&self, u: UpstreamId) -> &Mutex<UpstreamState> {
        self.states.get_or_init(u.index(), Box::default)
    }

    /// The lock that has one opening of `u`'s control channel at a time.
    fn opening(&self, u: UpstreamId) -> &tokio::sync::Mutex<()> {
        self.opening.get_or_init(u.index(), || tokio::sync::Mutex::new(()))
    }

    /// Upstream `u`'s URI scheme prefix (empty without a prefix).
    fn scheme_prefix(&self, u: UpstreamId) -> &str {
        self.scheme_prefixes.get_or_init(u.index(), || naming::scheme_prefix(&self.upstreams[u].config.prefix))
    }

    /// Routes URIs to the upstreams in the set.
    fn route_uris(&self) {
        let mut routes = UriRoutes::default();
        for upstream in self.upstreams.iter() {
            let prefix = self.scheme_prefix(upstream.id);
            if prefix.is_empty() {
                routes.unprefixed.push(upstream.id);
            } else {
                routes.scheme_index.insert(prefix.to_owned(), upstream.id);
            }
        }
        self.routes.store(Arc::new(routes));
    }

    /// The set of upstreams changed (some added, some retired): URIs are
    /// routed to the new set and a snapshot built from its lists (the
    /// caller tells clients every list changed). The added upstreams'
    /// lists are fetched when next asked for; the retired ones' control
    /// channels are closed by [`close_upstream`](Self::close_upstream).
    pub fn upstreams_changed(&self) {
        self.route_uris();
        self.rebuild();
        self.settled.send_modify(|n| *n += 1);
    }

    /// Closes retired upstream `u`'s control channel and listener, and
    /// forgets its lists.
    pub async fn close_upstream(&self, u: UpstreamId) {
        let Some(state) = self.states.get(u.index()) else { return };
        let (control, listener) = {
            let mut state = state.lock().expect("lock");
            state.lists = Default::default();
            (state.control.take(), state.listener.take())
        };
        if let Some(listener) = listener {
            listener.abort();
        }
        if let Some(channel) = control {
            channel.close().await;
        }
    }

    /// A caller's own catalog: its requests carry `acting`'s credentials,
    /// and it follows no upstream's list changes (it is fetched again when
    /// stale).
    pub fn acting_for(mut self, acting: Acting) -> Self {
        self.acting = Some(acting);
        self
    }

    /// Whether it holds a list of `kind` from upstream `u` (fetched once,
    /// and not failing since).
    pub fn listed(&self, u: UpstreamId, kind: ListKind) -> bool {
        let state = self.state(u).lock().expect("lock");
        let list = &state.lists[kind as usize];
        list.items.is_some() && list.failed_at.is_none()
    }

    /// How upstream `u` last refused one of its lists for want of
    /// authorization (its status and `WWW-Authenticate`), if it did since
    /// it last listed.
    pub fn refusal(&self, u: UpstreamId) -> Option<(u16, String)> {
        self.state(u).lock().expect("lock").refusal.clone()
    }

    /// Whether it lists upstream `u`.
    fn covers(&self, u: UpstreamId) -> bool {
        self.covers.as_ref().is_none_or(|covers| covers(&self.upstreams[u]))
    }

    /// The hello of its channels to `u`.
    fn hello(&self, u: UpstreamId) -> Hello {
        let mut hello = Hello::router();
        hello.credentials = self.acting.as_ref().map(|acting| acting(u));
        hello
    }

    /// The credential its stateless requests to `u` carry (`None`: the
    /// upstream's own headers).
    fn credential(&self, u: UpstreamId) -> Result<Option<Arc<Credential>>, UpstreamError> {
        match &self.acting {
            None => Ok(None),
            Some(acting) => switchboard_upstream::credential(Some(&acting(u))),
        }
    }

    /// The current snapshot, without refreshing anything.
    pub fn current(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// A snapshot in which the lists of `kinds` are fresh for every upstream
    /// that can currently answer; fetches what is missing or stale first.
    pub async fn ensure(&self, kinds: &[ListKind]) -> Arc<Snapshot> {
        self.ensure_for(kinds, |_| true).await
    }

    /// [`ensure`](Self::ensure) for the upstreams `which` picks (a tenant's):
    /// fetches what is missing or stale among them, and waits for their
    /// lists that other callers are fetching, never for other upstreams.
    pub async fn ensure_for(&self, kinds: &[ListKind], which: impl Fn(UpstreamId) -> bool) -> Arc<Snapshot> {
        let lists: Vec<(UpstreamId, ListKind)> =
            self.upstreams.ids().filter(|&u| which(u)).flat_map(|u| kinds.iter().map(move |&k| (u, k))).collect();
        self.ensure_lists(&lists).await
    }

    /// [`ensure_for`](Self::ensure_for), but only for lists never fetched
    /// yet (fresh or stale, a list that was had once is not waited for):
    /// what a new session's capabilities need.
    pub async fn ensure_once_for(&self, kinds: &[ListKind], which: impl Fn(UpstreamId) -> bool) -> Arc<Snapshot> {
        let lists: Vec<(UpstreamId, ListKind)> = self
            .upstreams
            .ids()
            .filter(|&u| which(u))
            .flat_map(|u| kinds.iter().map(move |&k| (u, k)))
            .filter(|&(u, k)| {
                let state = self.state(u).lock().expect("lock");
                let list = &state.lists[k as usize];
                list.items.is_none() && list.failed_at.is_none()
            })
            .collect();
        if lists.is_empty() {
            return self.snapshot.load_full();
        }
        self.ensure_lists(&lists).await
    }

    async fn ensure_lists(&self, lists: &[(UpstreamId, ListKind)]) -> Arc<Snapshot> {
        let mut settled = self.settled.subscribe();
        let (mine, mut theirs) = self.claim_lists(lists);
        if !mine.is_empty() {
            self.fetch_claimed(mine).await;
        }
        // Lists another caller was fetching: waited for; should that caller
        // have gone away before its fetch settled (or the list changed
        // again meanwhile), fetched here, a few rounds at most.
        for _ in 0..WAIT_ROUNDS {
            if theirs.is_empty() {
                break;
            }
            while theirs.iter().any(|&(u, kind)| self.state(u).lock().expect("lock").lists[kind as usize].fetching) {
                if settled.changed().await.is_err() {
                    return self.snapshot.load_full();
                }
            }
            let (mine, again) = self.claim_lists(&theirs);
            if !mine.is_empty() {
                self.fetch_claimed(mine).await;
            }
            theirs = again;
        }
        self.snapshot.load_full()
    }

    /// Of `lists`, those that need fetching now: those this caller fetches (marked as being fetched,
    /// with their change counts as the fetch starts), and those another
    /// caller is fetching already.
    fn claim_lists(&self, lists: &[(UpstreamId, ListKind)]) -> Claims {
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        for &(u, kind) in lists.iter().filter(|&&(u, _)| self.covers(u)) {
            let mut state = self.state(u).lock().expect("lock");
            let list = &mut state.lists[kind as usize];
            let backing_off = list.failed_at.is_some_and(|t| t.elapsed() < self.config.retry_after);
            let expired = list.expires.is_some_and(|t| t <= Instant::now());
            if list.fetching {
                theirs.push((u, kind));
            } else if (!list.fresh || expired) && !backing_off {
                list.fetching = true;
                mine.push((u, kind, list.changes));
            }
        }
        (mine, theirs)
    }

    /// Fetches the lists this caller claimed, concurrently; as each (or
    /// each batch that completes together) comes, publishes a snapshot
    /// built from it and marks it settled: a list waits for no other.
    async fn fetch_claimed(&self, claimed: Vec<(UpstreamId, ListKind, u64)>) {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        use futures_util::FutureExt;
        // Should this caller go away mid-fetch, the lists are let go.
        let mut guard = Claimed { catalog: self, lists: claimed.iter().map(|&(u, k, _)| (u, k)).collect() };
        let mut pending: FuturesUnordered<_> = claimed
            .into_iter()
            .map(|(u, kind, changes)| async move { (u, kind, changes, self.fetch(u, kind).await) })
            .collect();
        while let Some(first) = pending.next().await {
            let mut batch = vec![first];
            while let Some(Some(more)) = pending.next().now_or_never() {
                batch.push(more);
            }
            let done: Vec<(UpstreamId, ListKind)> = batch.iter().map(|(u, kind, _, _)| (*u, *kind)).collect();
            self.settle(batch);
            guard.lists.retain(|list| !done.contains(list));
        }
    }

    /// Takes fetched lists in: first the items, then the snapshot, and
    /// only then the flags that let callers go on without waiting (a caller
    /// that sees a list fresh, or failed, must find the snapshot already
    /// built from it); then tells waiters, and clients of lists whose
    /// membership changed.
    #[allow(clippy::type_complexity)]
    fn settle(&self, batch: Vec<(UpstreamId, ListKind, u64, Result<Vec<Map<String, Value>>, FetchError>)>) {
        let mut membership_changed = Vec::new();
        let mut settled = Vec::with_capacity(batch.len());
        for (u, kind, changes, result) in batch {
            let upstream = &self.upstreams[u];
            self.metrics.refreshed(&upstream.name, kind);
            let mut state = self.state(u).lock().expect("lock");
            let list = &mut state.lists[kind as usize];
            match result {
                Ok(items) => {
                    // Back after being left out: clients may have listed without it.
                    if list.failed_at.is_some() && !items.is_empty() {
                        membership_changed.push(kind);
                    }
                    list.items = Some(Arc::new(items));
                    state.refusal = None;
                    settled.push((u, kind, changes, true));
                    self.upstreams.metrics().set_up(&upstream.name, true);
                }
                Err(e) => {
                    if list.items.as_ref().is_some_and(|i| !i.is_empty()) {
                        membership_changed.push(kind);
                    }
                    list.items = None;
                    if let FetchError::Refused(status, challenge) = &e {
                        state.refusal = Some((*status, challenge.clone()));
                    }
                    state.last_error = Some((format!("{}: {e}", kind.label()), switchboard_core::time::now_ms()));
                    settled.push((u, kind, changes, false));
                    self.metrics.failed(&upstream.name, kind);
                    if let FetchError::TooLarge(_) = e {
                        self.metrics.oversized(&upstream.name, kind);
                    } else {
                        self.upstreams.metrics().set_up(&upstream.name, false);
                    }
                    tracing::warn!(upstream = %upstream.name, list = kind.label(), error = %e,
                        "upstream left out of the catalog");
                }
            }
        }
        self.rebuild();
        for (u, kind, changes, ok) in settled {
            let mut state = self.state(u).lock().expect("lock");
            let list = &mut state.lists[kind as usize];
            list.fetching = false;
            // A change announced during the fetch may not be in it.
            list.fresh = ok && list.changes == changes;
            list.failed_at = if ok { None } else { Some(Instant::now()) };
        }
        self.settled.send_modify(|n| *n += 1);
        membership_changed.sort_by_key(|k| *k as usize);
        membership_changed.dedup();
        for kind in membership_changed {
            (self.announce)(kind);
        }
    }

    /// Marks `kind` of upstream `u` stale. Returns whether it was fresh (or
    /// being fetched), so that callers tell clients about a change once, not
    /// once per report.
    pub fn invalidate(&self, u: UpstreamId, kind: ListKind) -> bool {
        let Some(state) = self.states.get(u.index()) else { return false };
        let mut state = state.lock().expect("lock");
        let mut was_fresh = false;
        let kinds: &[ListKind] =
            if kind == ListKind::Resources { &[ListKind::Resources, ListKind::ResourceTemplates] } else { &[kind] };
        for k in kinds {
            let list = &mut state.lists[*k as usize];
            was_fresh |= list.fresh || list.fetching;
            list.fresh = false;
            list.changes += 1;
        }
        was_fresh
    }

    /// The control channel of upstream `u`, opened if needed.
    async fn control(&self, u: UpstreamId) -> Result<Arc<dyn Channel>, UpstreamError> {
        if let Some(channel) = self.state(u).lock().expect("lock").control.clone() {
            return Ok(channel);
        }
        // Concurrent fetches open one channel, not one each.
        let _opening = self.opening(u).lock().await;
        if let Some(channel) = self.state(u).lock().expect("lock").control.clone() {
            return Ok(channel);
        }
        let channel = self.upstreams[u].transport.open(&self.hello(u), (self.inbox)(u)).await?;
        channel.listen();
        let existing = {
            let mut state = self.state(u).lock().expect("lock");
            state.handshake = Some(channel.handshake());
            match &state.control {
                Some(existing) => Some(existing.clone()),
                None => {
                    state.control = Some(channel.clone());
                    None
                }
            }
        };
        match existing {
            // Another fetch opened one meanwhile; keep that and close ours.
            Some(existing) => {
                channel.close().await;
                Ok(existing)
            }
            None => Ok(channel),
        }
    }

    /// The handshake of upstream `u`'s control channel, once it has one.
    pub fn handshake(&self, u: UpstreamId) -> Option<Arc<Handshake>> {
        let state = self.state(u).lock().expect("lock");
        state.control.as_ref().map(|c| c.handshake()).or_else(|| state.handshake.clone())
    }

    /// How upstream `u` fares: its lists, era, last failure.
    pub fn status(&self, u: UpstreamId) -> UpstreamStatus {
        let snapshot = self.current();
        let count = |kind: ListKind| {
            snapshot.list(kind).spans.iter().filter(|(id, _, _)| *id == u).map(|(_, start, end)| end - start).sum()
        };
        let state = self.state(u).lock().expect("lock");
        let fetched: Vec<&ListState> =
            state.lists.iter().filter(|l| l.items.is_some() || l.failed_at.is_some()).collect();
        let handshake = state.control.as_ref().map(|c| c.handshake()).or_else(|| state.handshake.clone());
        UpstreamStatus {
            up: !fetched.is_empty() && fetched.iter().all(|l| l.failed_at.is_none()),
            protocol_version: match state.modern {
                Some(true) => Some("2026-07-28".to_owned()),
                _ => handshake.map(|h| h.protocol_version.clone()),
            },
            tools: count(ListKind::Tools),
            prompts: count(ListKind::Prompts),
            resources: count(ListKind::Resources),
            resource_templates: count(ListKind::ResourceTemplates),
            last_error: state.last_error.as_ref().map(|(e, _)| e.clone()),
            last_error_at_ms: state.last_error.as_ref().map(|(_, at)| *at),
        }
    }

    /// Whether upstream `u` speaks 2026-07-28 (known after its first fetch).
    pub fn is_modern(&self, u: UpstreamId) -> bool {
        self.state(u).lock().expect("lock").modern == Some(true)
    }

    /// Whether upstream `u` speaks only 2026-07-28 (no sessions): session
    /// clients then reach it with stateless requests too.
    pub fn is_stateless_only(&self, u: UpstreamId) -> bool {
        let state = self.state(u).lock().expect("lock");
        state.modern == Some(true) && state.stateless_only
    }

    /// The `ttlMs` of the router's lists: how long the soonest-expiring
    /// upstream list hint has left, or 0 (no promise) if no upstream gave one.
    pub fn ttl_ms(&self) -> u64 {
        let now = Instant::now();
        self.upstreams
            .ids()
            .filter_map(|u| {
                let s = self.states.get(u.index())?.lock().expect("lock");
                s.lists.iter().filter_map(|l| l.expires).min()
            })
            .min()
            .map_or(0, |t| t.saturating_duration_since(now).as_millis() as u64)
    }

    /// Probes upstream `u`'s era once (`server/discover`): a 2026-07-28
    /// upstream is served statelessly, its handshake taken from the
    /// discovery; anything else (no answer, an error, only older versions)
    /// is a session-based upstream, reached with `initialize`. A refusal
    /// of the request's authorization decides nothing: it is the answer.
    async fn era(&self, u: UpstreamId) -> Result<bool, FetchError> {
        if let Some(modern) = self.state(u).lock().expect("lock").modern {
            return Ok(modern);
        }
        let _opening = self.opening(u).lock().await;
        if let Some(modern) = self.state(u).lock().expect("lock").modern {
            return Ok(modern);
        }
        let upstream = &self.upstreams[u];
        let body = jsonrpc::request(
            Some(b"\"switchboard-discover\""),
            "server/discover",
            Some(format!(r#"{{"_meta":{}}}"#, switchboard_upstream::ROUTER_META).as_bytes()),
        );
        let mut discovered = None;
        // Asked again once if the server says it does not support the version
        // asked for, yet lists it (or another 2026 one) as supported: how
        // the era's version negotiation goes (error -32022).
        for _ in 0..2 {
            let credential = self.credential(u).ok().flatten();
            let probe = upstream.transport.modern(
                body.clone(),
                switchboard_protocol::Method::ServerDiscover,
                Vec::new(),
                "",
                credential.as_deref(),
            );
            let answer = match tokio::time::timeout(upstream.config.list_timeout, probe).await {
                Ok(Ok(switchboard_upstream::ModernAnswer {
                    status,
                    reply: switchboard_upstream::Reply::Done(m),
                    ..
                })) => serde_json::from_slice::<Value>(&m).ok().map(|v| (status, v)),
                // No answer at all (down, or not listening yet): ask again next
                // time rather than take it for a session-era server for good.
                Err(_) | Ok(Err(UpstreamError::Connect(_) | UpstreamError::Timeout(_))) => return Ok(false),
                Ok(Err(refused @ UpstreamError::Unauthorized { .. })) => return Err(refused.into()),
                _ => None,
            };
            match answer {
                Some((200, mut v)) => {
                    discovered = v.get_mut("result").map(Value::take);
                    break;
                }
                Some((_, v)) if offers_modern_version(&v) => continue,
                _ => break,
            }
        }
        let versions: Vec<String> = discovered
            .as_ref()
            .and_then(|r| r.get("supportedVersions"))
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        let modern = versions.iter().any(|v| {
            switchboard_protocol::ProtocolVersion::parse(v)
                .is_some_and(switchboard_protocol::ProtocolVersion::is_modern)
        });
        let mut sessions_too = versions.iter().any(|v| {
            switchboard_protocol::ProtocolVersion::parse(v)
                .is_some_and(switchboard_protocol::ProtocolVersion::is_streamable_http)
        });
        if modern && !sessions_too {
            // Discovery lists only the stateless era, yet one endpoint may
            // serve both (the official conformance server does): a session
            // handshake tells. Session clients then keep their own
            // sessions, with everything that only sessions carry.
            sessions_too = self.takes_sessions(u).await;
        }
        let mut state = self.state(u).lock().expect("lock");
        if state.modern.is_some() {
            return Ok(state.modern == Some(true));
        }
        state.modern = Some(modern);
        state.stateless_only = modern && !sessions_too;
        self.upstreams.metrics().set_era(
            &upstream.name,
            if modern { switchboard_upstream::Era::Stateless } else { switchboard_upstream::Era::Sessions },
        );
        if modern {
            let r = discovered.expect("a discovery result");
            state.handshake = Some(Arc::new(Handshake {
                protocol_version: "2026-07-28".into(),
                capabilities: r.get("capabilities").cloned().unwrap_or_else(|| Value::Object(Map::new())),
                instructions: r.get("instructions").and_then(Value::as_str).map(str::to_owned),
                // Top-level in early drafts; in `_meta` as the era now says.
                server_info: r
                    .get("serverInfo")
                    .or_else(|| r.pointer("/_meta/io.modelcontextprotocol~1serverInfo"))
                    .cloned()
                    .unwrap_or(Value::Null),
            }));
            tracing::info!(upstream = %upstream.name, sessions_too, "upstream speaks MCP 2026-07-28: stateless clients reach it statelessly");
            if self.acting.is_none() {
                let transport = upstream.transport.clone();
                let inbox = (self.inbox)(u);
                let name = upstream.name.clone();
                state.listener = Some(tokio::spawn(listen_upstream(transport, inbox, name)));
            }
        }
        Ok(modern)
    }

    /// Whether a stateless upstream also serves sessions: an `initialize`
    /// (then DELETE of the session it made) succeeds within `list_timeout`.
    async fn takes_sessions(&self, u: UpstreamId) -> bool {
        let upstream = &self.upstreams[u];
        let inbox: Arc<dyn Inbox> = Arc::new(switchboard_upstream::Discard);
        let hello = self.hello(u);
        match tokio::time::timeout(upstream.config.list_timeout, upstream.transport.open(&hello, inbox)).await {
            Ok(Ok(channel)) => {
                channel.close().await;
                tracing::info!(upstream = %upstream.name, "upstream lists only MCP 2026-07-28 in server/discover but takes initialize: session clients keep sessions with it");
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(upstream = %upstream.name, error = %e, "stateless upstream refuses sessions");
                false
            }
            Err(_) => false,
        }
    }

    /// One page of a list from a stateless upstream, with its `ttlMs`.
    async fn modern_page(
        &self,
        u: UpstreamId,
        kind: ListKind,
        cursor: Option<&str>,
        budget: &mut Budget,
    ) -> Result<(Value, Option<u64>), FetchError> {
        let params = match cursor {
            Some(c) => {
                format!(r#"{{"cursor":{},"_meta":{}}}"#, Value::String(c.to_owned()), switchboard_upstream::ROUTER_META)
            }
            None => format!(r#"{{"_meta":{}}}"#, switchboard_upstream::ROUTER_META),
        };
        let body = jsonrpc::request(Some(b"\"switchboard-list\""), kind.method(), Some(params.as_bytes()));
        let method = switchboard_protocol::Method::from_name(kind.method());
        let credential = self.credential(u)?;
        let answer = self.upstreams[u].transport.modern(body, method, Vec::new(), "", credential.as_deref()).await?;
        let message = match answer.reply {
            switchboard_upstream::Reply::Done(message) => message,
            reply => collect_response(reply, "\"switchboard-list\"").await?,
        };
        budget.take_bytes(message.len(), kind)?;
        let result = result_of(&message, kind)?;
        let ttl = result.get("ttlMs").and_then(Value::as_u64);
        Ok((result, ttl))
    }

    /// Fetches every page of one list of one upstream, within its deadline
    /// and the bounds on one upstream's list.
    async fn fetch(&self, u: UpstreamId, kind: ListKind) -> Result<Vec<Map<String, Value>>, FetchError> {
        let upstream = &self.upstreams[u];
        let deadline = upstream.config.list_timeout;
        let late = || FetchError::Failed(format!("no complete answer within {deadline:?} (list_timeout)"));
        let max_bytes = self.config.max_upstream_bytes;
        let mut budget = Budget { items: self.config.max_upstream_items, bytes: max_bytes, max_bytes };
        if self.era(u).await? {
            return tokio::time::timeout(deadline, self.fetch_modern(u, kind, &mut budget))
                .await
                .unwrap_or_else(|_| Err(late()));
        }
        let work = async {
            let channel = self.control(u).await?;
            let handshake = channel.handshake();
            self.state(u).lock().expect("lock").handshake = Some(handshake.clone());
            if !handshake.has(kind.capability()) {
                return Ok(Vec::new());
            }
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            for page in 0..self.config.max_upstream_pages {
                let params = match &cursor {
                    Some(c) => serde_json::to_vec(&serde_json::json!({ "cursor": c })).expect("serializable"),
                    None => b"{}".to_vec(),
                };
                let (out, id) = Outgoing::own(kind.method(), &params, &format!("{}-{page}", kind.label()));
                let reply = channel.request(out).await?;
                let message = collect_response(reply, &id).await?;
                budget.take_bytes(message.len(), kind)?;
                let mut result = result_of(&message, kind)?;
                drop(message);
                cursor = take_page(&mut result, kind, &mut items);
                budget.check_items(items.len(), kind)?;
                if cursor.is_none() {
                    break;
                }
                if page + 1 == self.config.max_upstream_pages {
                    tracing::warn!(upstream = %upstream.name, list = kind.label(), pages = page + 1,
                        "stopped following the upstream's cursors at catalog.max_upstream_pages");
                }
            }
            Ok(items)
        };
        tokio::time::timeout(deadline, work).await.unwrap_or_else(|_| Err(late()))
    }

    /// [`fetch`](Self::fetch) from a stateless upstream: every page, and the
    /// list's expiry from the smallest `ttlMs` of its pages.
    async fn fetch_modern(
        &self,
        u: UpstreamId,
        kind: ListKind,
        budget: &mut Budget,
    ) -> Result<Vec<Map<String, Value>>, FetchError> {
        let handshake = self.handshake(u).unwrap_or_default();
        if !handshake.has(kind.capability()) {
            return Ok(Vec::new());
        }
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        let mut ttl: Option<u64> = None;
        for _ in 0..self.config.max_upstream_pages {
            let (mut result, page_ttl) = self.modern_page(u, kind, cursor.as_deref(), budget).await?;
            ttl = match (ttl, page_ttl) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            cursor = take_page(&mut result, kind, &mut items);
            budget.check_items(items.len(), kind)?;
            if cursor.is_none() {
                break;
            }
        }
        let expires = ttl.map(|ms| Instant::now() + Duration::from_millis(ms));
        self.state(u).lock().expect("lock").lists[kind as usize].expires = expires;
        Ok(items)
    }

    /// Builds and publishes a new snapshot from the cached lists.
    fn rebuild(&self) {
        let _one_at_a_time = self.rebuilding.lock().expect("lock");
        let mut lists: [Listing; 4] = Default::default();
        let mut merged = Merged::default();
        let mut instructions = Vec::new();
        let per_upstream: Vec<(UpstreamId, CachedLists, Option<Arc<Handshake>>)> = self
            .upstreams
            .ids()
            .filter_map(|u| {
                let s = self.states.get(u.index())?.lock().expect("lock");
                Some((
                    u,
                    [0, 1, 2, 3].map(|k| s.lists[k].items.clone()),
                    s.control.as_ref().map(|c| c.handshake()).or_else(|| s.handshake.clone()),
                ))
            })
            .collect();
        for (u, items, handshake) in &per_upstream {
            let u = *u;
            let upstream = &self.upstreams[u];
            if let Some(h) = handshake {
                merged.logging |= h.has("logging");
                merged.completions |= h.has("completions");
                merged.subscribe |=
                    h.capabilities.pointer("/resources/subscribe").and_then(Value::as_bool).unwrap_or(false);
                if let Some(text) = h.instructions.as_deref().filter(|t| !t.trim().is_empty()) {
                    instructions.push(format!("## {}\n{}", upstream.name, text.trim()));
                }
            }
            for kind in ListKind::ALL {
                let Some(items) = &items[kind as usize] else { continue };
                let expose = |original: &str| match kind {
                    ListKind::Tools | ListKind::Prompts => {
                        naming::expose_name(&upstream.config.prefix, &self.config.separator, original)
                    }
                    ListKind::Resources | ListKind::ResourceTemplates => {
                        naming::expose_uri(self.scheme_prefix(u), original)
                    }
                };
                for (exposed, holder) in lists[kind as usize].extend(u, kind, items, expose) {
                    self.report_collision(u, kind, exposed, holder);
                }
            }
        }
        // Digests of unchanged tools carried over (made once per definition,
        // not once per rebuild).
        let before = self.snapshot.load();
        let old_tools = &before.lists[ListKind::Tools as usize];
        for item in &lists[ListKind::Tools as usize].items {
            let old = old_tools.index.get(&item.exposed).map(|&at| &old_tools.items[at]);
            if let Some(digest) = old.filter(|o| o.json == item.json).and_then(|o| o.digest.get()) {
                let _ = item.digest.set(*digest);
            }
        }
        for listing in lists.iter_mut() {
            listing.seal();
        }
        if !instructions.is_empty() {
            merged.instructions = Some(instructions.join("\n\n"));
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.snapshot.store(Arc::new(Snapshot { generation, lists, merged, tool_index: Default::default() }));
    }

    /// Logs and counts a name left out of a list because it was taken,
    /// once per name (not at every rebuild): by another upstream, a
    /// configuration matter; by the same upstream, which lists it twice.
    fn report_collision(&self, u: UpstreamId, kind: ListKind, exposed: String, holder: UpstreamId) {
        /// Beyond this many names reported, more are counted but not logged.
        const REMEMBERED: usize = 10_000;
        /// Logged names are cut to this many characters.
        const SHOWN: usize = 120;
        let key =
            switchboard_core::hash::fnv1a64(format!("{}\u{0}{}\u{0}{exposed}", u.index(), kind.label()).as_bytes());
        {
            let mut reported = self.reported.lock().expect("lock");
            if reported.contains(&key) {
                return;
            }
            if reported.len() >= REMEMBERED {
                self.metrics.collision(kind);
                return;
            }
            reported.insert(key);
        }
        let upstream = &self.upstreams[u];
        self.metrics.collision(kind);
        let name: String = exposed.chars().take(SHOWN).collect();
        if holder == u {
            tracing::warn!(upstream = %upstream.name, list = kind.label(), name = %name,
                "the upstream lists this name more than once; the first is kept");
        } else {
            tracing::error!(upstream = %upstream.name, list = kind.label(), name = %name,
                other = %self.upstreams[holder].name,
                "name collision: another upstream already exposes this name; this one is left out");
        }
    }

    /// Which upstream serves `uri` (an exposed URI), and the upstream's own URI.
    pub fn resolve_uri<'a>(&self, snapshot: &Snapshot, uri: &'a str) -> Option<(UpstreamId, &'a str)> {
        let routes = self.routes.load();
        if let Some((prefix, original)) = naming::split_uri(uri) {
            if let Some(&u) = routes.scheme_index.get(prefix) {
                return Some((u, original));
            }
        }
        match routes.unprefixed.as_slice() {
            [] => None,
            [only] => Some((*only, uri)),
            several => {
                let by_list = snapshot.list(ListKind::Resources).get(uri).map(|item| item.upstream);
                Some((by_list.unwrap_or(several[0]), uri))
            }
        }
    }

    /// The exposed form of upstream `u`'s URI.
    pub fn expose_uri(&self, u: UpstreamId, uri: &str) -> String {
        naming::expose_uri(self.scheme_prefix(u), uri)
    }

    /// For a name that is not in the catalog: the upstream it would belong to
    /// if that upstream is currently left out (so the client hears "upstream
    /// down", not "unknown tool").
    pub fn missing_upstream(&self, kind: ListKind, exposed: &str) -> Option<UpstreamId> {
        let (prefix, _) = exposed.split_once(self.config.separator.as_str())?;
        let u = self.upstreams.iter().find(|u| u.config.prefix == prefix)?.id;
        let state = self.state(u).lock().expect("lock");
        state.lists[kind as usize].failed_at.is_some().then_some(u)
    }

    /// Closes every control channel (and stateless upstreams' listeners).
    pub async fn close(&self) {
        let states: Vec<&Mutex<UpstreamState>> =
            (0..self.upstreams.slots()).filter_map(|i| self.states.get(i).map(|s| &**s)).collect();
        for state in &states {
            if let Some(listener) = state.lock().expect("lock").listener.take() {
                listener.abort();
            }
        }
        let channels: Vec<_> = states.iter().filter_map(|s| s.lock().expect("lock").control.take()).collect();
        for channel in channels {
            channel.close().await;
        }
    }

    /// How long a failed upstream is left out before being asked again.
    pub fn retry_after(&self) -> Duration {
        self.config.retry_after
    }
}

/// Follows a stateless upstream's list changes: a `subscriptions/listen`
/// stream, reopened (after a pause) whenever it ends; each change goes to
/// the inbox as the notification it is.
async fn listen_upstream(transport: Arc<dyn switchboard_upstream::Transport>, inbox: Arc<dyn Inbox>, name: Arc<str>) {
    let params = format!(
        r#"{{"notifications":{{"toolsListChanged":true,"promptsListChanged":true,"resourcesListChanged":true}},"_meta":{}}}"#,
        switchboard_upstream::ROUTER_META
    );
    loop {
        let body = jsonrpc::request(Some(b"\"switchboard-listen\""), "subscriptions/listen", Some(params.as_bytes()));
        match transport.modern(body, switchboard_protocol::Method::SubscriptionsListen, Vec::new(), "", None).await {
            Ok(switchboard_upstream::ModernAnswer {
                reply: switchboard_upstream::Reply::Stream(mut stream), ..
            }) => {
                while let Some(Ok(message)) = stream.next().await {
                    inbox.deliver(message);
                }
            }
            Ok(_) => tracing::debug!(upstream = %name, "subscriptions/listen answered without a stream"),
            Err(e) => tracing::debug!(upstream = %name, error = %e, "subscriptions/listen failed"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The `result` of an answer to a list request, or why there is none.
fn result_of(message: &[u8], kind: ListKind) -> Result<Value, String> {
    let mut value: Value = serde_json::from_slice(message).map_err(|e| format!("invalid JSON: {e}"))?;
    if let Some(error) = value.get("error") {
        return Err(format!("it answered {} with an error: {}", kind.method(), error));
    }
    value.get_mut("result").map(Value::take).ok_or_else(|| "a response without result".to_owned())
}

/// Moves the items of one page (`result`) into `items` and returns the
/// cursor of the next page, if any.
fn take_page(result: &mut Value, kind: ListKind, items: &mut Vec<Map<String, Value>>) -> Option<String> {
    if let Some(Value::Array(list)) = result.get_mut(kind.field()).map(Value::take) {
        items.extend(list.into_iter().filter_map(|v| match v {
            Value::Object(map) => Some(map),
            _ => None,
        }));
    }
    result.get("nextCursor").and_then(Value::as_str).map(str::to_owned)
}

/// Why an upstream's list could not be had.
#[derive(Debug)]
enum FetchError {
    /// The upstream failed, answered badly or too late.
    Failed(String),
    /// Its list is larger than the bounds on one upstream's list.
    TooLarge(String),
    /// It refused the request's authorization, with this challenge.
    Refused(u16, String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Failed(why) | FetchError::TooLarge(why) => f.write_str(why),
            FetchError::Refused(status, _) => write!(f, "it refused the request's authorization (HTTP {status})"),
        }
    }
}

impl From<UpstreamError> for FetchError {
    fn from(e: UpstreamError) -> Self {
        match e {
            UpstreamError::Unauthorized { status, challenge } => FetchError::Refused(status, challenge),
            e => FetchError::Failed(e.to_string()),
        }
    }
}

impl From<String> for FetchError {
    fn from(why: String) -> Self {
        FetchError::Failed(why)
    }
}

/// What is left of the bounds on one upstream's list as its pages come.
struct Budget {
    items: usize,
    bytes: usize,
    max_bytes: usize,
}

impl Budget {
    /// Counts a page of `len` bytes, before it is parsed.
    fn take_bytes(&mut self, len: usize, kind: ListKind) -> Result<(), FetchError> {
        self.bytes = self.bytes.checked_sub(len).ok_or_else(|| {
            FetchError::TooLarge(format!(
                "its {} list is larger than catalog.max_upstream_bytes ({} bytes); left out until it shrinks",
                kind.label(),
                self.max_bytes
            ))
        })?;
        Ok(())
    }

    /// Checks the items received so far.
    fn check_items(&self, count: usize, kind: ListKind) -> Result<(), FetchError> {
        if count > self.items {
            return Err(FetchError::TooLarge(format!(
                "its {} list has more than catalog.max_upstream_items ({}) items; left out until it shrinks",
                kind.label(),
                self.items
            )));
        }
        Ok(())
    }
}

/// Lists a caller claimed to fetch: let go (no longer being fetched, and
/// waiters told) if the caller goes away before it settles them.
struct Claimed<'a> {
    catalog: &'a Catalog,
    lists: Vec<(UpstreamId, ListKind)>,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if self.lists.is_empty() {
            return;
        }
        for &(u, kind) in &self.lists {
            self.catalog.state(u).lock().expect("lock").lists[kind as usize].fetching = false;
        }
        self.catalog.settled.send_modify(|n| *n += 1);
    }
}

/// Whether an error answer is "unsupported protocol version" (-32022)
/// listing a 2026-07-28-era version among those the server supports.
fn offers_modern_version(answer: &Value) -> bool {
    let error = &answer["error"];
    error["code"].as_i64() == Some(-32022)
        && error["data"]["supported"].as_array().is_some_and(|versions| {
            versions.iter().filter_map(Value::as_str).any(|v| {
                switchboard_protocol::ProtocolVersion::parse(v)
                    .is_some_and(switchboard_protocol::ProtocolVersion::is_modern)
            })
        })
}
