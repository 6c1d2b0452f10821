//! Tool-definition pinning: per tenant that turns it on (`pinning` in its
//! policy), each tool's definition (name, title, description, input and
//! output schema, annotations) is approved once, as first seen or by an
//! operator, and kept as a digest. A tool whose definition differs from
//! the approved one (an upstream changed it: a "rug pull") is withheld
//! from that tenant, neither listed nor callable, or passed marked in its
//! `_meta` (`on_change = "warn"`), until an operator approves the new
//! definition through the admin API, the CLI or the console.
//!
//! The request path decides from this replica's copy of the pins and the
//! catalog item's digest (made once per snapshot item): a map lookup, no
//! database. The copy is reloaded when the pins' version moves (notified on
//! PostgreSQL, looked at every `database.refresh`). A survey, run on the
//! same wakeups and whenever the catalog's tools change, records what it
//! finds: tools seen for the first time (pinned, or waiting for an
//! operator), and definitions that changed (waiting, an audit record, a
//! metric, a log line), each once across replicas (the database decides
//! which replica recorded it).
//!
//! Until the pins are first loaded, a pinning tenant's tools are withheld:
//! with its database down at start, a tenant that asked for pinning gets
//! nothing it has not approved.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use switchboard_catalog::Item;
use switchboard_core::policy::{Approve, OnChange, Tenant};
use switchboard_db::{Database, NewPin};
use switchboard_protocol::methods::ListKind;

/// The fields of a tool that make its definition.
pub const DEFINITION_FIELDS: &[&str] = &["name", "title", "description", "inputSchema", "outputSchema", "annotations"];

/// The key of the mark a warned tool carries in its `_meta`.
pub const CHANGED_META: &str = "io.switchboard/definitionChanged";

/// At most this many pins per tenant: beyond, tools it has never seen are
/// withheld from it (not pinned, counted, logged) rather than the table
/// growing with an upstream that keeps renaming its tools.
pub const MAX_PINS_PER_TENANT: usize = 100_000;

/// What a tenant gets of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Admitted, marked: its definition changed since it was approved.
    Warn,
    Withhold,
}

/// What this replica knows of one pin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Known {
    approved: Option<[u8; 32]>,
    pending: Option<[u8; 32]>,
    /// Every definition rejected (the pending one, if it was).
    rejected: Box<[[u8; 32]]>,
}

/// What the last survey that left nothing to retry looked at: the same
/// again finds nothing new.
#[derive(Debug, PartialEq, Eq)]
struct Surveyed {
    catalog: u64,
    pins: i64,
    /// The pinning tenants, by identity (a changed policy is a new value).
    tenants: Vec<usize>,
}

/// Tenant → exposed tool name → pin.
type Table = HashMap<Arc<str>, HashMap<Box<str>, Known>>;

pub struct Pins {
    db: Option<Database>,
    table: ArcSwap<Table>,
    /// The pins' version loaded (-1: none yet).
    version: AtomicI64,
    loaded: AtomicBool,
    /// Runs a survey soon (the catalog's tools changed).
    wake: tokio::sync::Notify,
    surveyed: Mutex<Option<Surveyed>>,
    metrics: Metrics,
}

impl Pins {
    pub fn new(db: Option<Database>, registry: &Registry) -> Pins {
        Pins {
            db,
            table: ArcSwap::default(),
            version: AtomicI64::new(-1),
            loaded: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            surveyed: Mutex::new(None),
            metrics: Metrics::new(registry),
        }
    }

    /// What `tenant` gets of tool `item`.
    pub fn verdict(&self, tenant: &Tenant, item: &Item) -> Verdict {
        let Some(pinning) = tenant.pinning else { return Verdict::Admit };
        if !self.loaded.load(Ordering::Acquire) {
            return Verdict::Withhold;
        }
        let table = self.table.load();
        let tools = table.get(&*tenant.name);
        let d = digest(item);
        match tools.and_then(|tools| tools.get(&*item.exposed)) {
            Some(k) if k.approved == Some(d) => Verdict::Admit,
            // Rejected: withheld, whatever the tenant's on_change says.
            Some(k) if k.rejected.contains(&d) => Verdict::Withhold,
            Some(k) if k.approved.is_some() => match pinning.on_change {
                OnChange::Withhold => Verdict::Withhold,
                OnChange::Warn => Verdict::Warn,
            },
            // Never approved, waiting for an operator.
            Some(_) => Verdict::Withhold,
            // Seen for the first time: the survey pins it (unless the
            // tenant holds all the pins it may).
            None if pinning.approve == Approve::FirstSight && tools.map_or(0, HashMap::len) < MAX_PINS_PER_TENANT => {
                Verdict::Admit
            }
            None => Verdict::Withhold,
        }
    }

    /// Asks for a survey soon (the catalog's tools changed).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Loads the pins now (at start).
    pub async fn load(&self) -> Result<(), switchboard_db::DbError> {
        let Some(db) = &self.db else {
            self.loaded.store(true, Ordering::Release);
            return Ok(());
        };
        let (version, rows) = db.load_pin_digests().await?;
        let mut table = Table::new();
        for row in rows {
            let known = Known {
                approved: row.approved.as_deref().and_then(hex32),
                pending: row.pending.as_deref().and_then(hex32),
                rejected: row.rejected.iter().filter_map(|d| hex32(d)).collect(),
            };
            table.entry(Arc::from(row.tenant)).or_default().insert(row.tool.into_boxed_str(), known);
        }
        let waiting = |k: &&Known| k.pending.is_some_and(|p| !k.rejected.contains(&p));
        let pending = table.values().flat_map(|t| t.values()).filter(waiting).count();
        self.metrics.pending.set(pending as i64);
        self.table.store(Arc::new(table));
        self.version.store(version, Ordering::Release);
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Reloads the pins if their version moved; the tenants whose approved
    /// or rejected definitions changed (their sessions are told their tool
    /// list changed: what they get depends on those only).
    async fn reload_if_changed(&self) -> Result<Vec<Arc<str>>, switchboard_db::DbError> {
        let Some(db) = &self.db else { return Ok(Vec::new()) };
        if db.pins_version().await? == self.version.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let before = self.table.load_full();
        self.load().await?;
        let after = self.table.load();
        // What decides what a tenant gets: approved, and rejected, definitions.
        type Decided<'a> = (&'a str, Option<[u8; 32]>, &'a [[u8; 32]]);
        fn decided<'a>(table: &'a Table, tenant: &str) -> Vec<Decided<'a>> {
            let mut approved: Vec<_> = table
                .get(tenant)
                .into_iter()
                .flatten()
                .filter(|(_, known)| known.approved.is_some() || !known.rejected.is_empty())
                .map(|(tool, known)| (&**tool, known.approved, &*known.rejected))
                .collect();
            approved.sort();
            approved
        }
        let mut tenants: Vec<Arc<str>> = after.keys().chain(before.keys()).cloned().collect();
        tenants.sort();
        tenants.dedup();
        tenants.retain(|t| decided(&before, t) != decided(&after, t));
        Ok(tenants)
    }

    /// Surveys what each pinning tenant sees of the catalog's tools and
    /// records first sights and changed definitions. Skipped when the
    /// catalog, the pins and the pinning tenants are as the last survey
    /// that left nothing to retry found them.
    async fn survey(&self, app: &impl Running) -> Result<(), switchboard_db::DbError> {
        let Some(db) = &self.db else { return Ok(()) };
        if !self.loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut tenants: Vec<Arc<Tenant>> =
            app.directory().tenants().into_iter().filter(|t| t.pinning.is_some()).collect();
        if tenants.is_empty() {
            return Ok(());
        }
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
        // Stale lists (an upstream said its tools changed) fetched first.
        let snapshot = app.catalog().ensure(&[ListKind::Tools]).await;
        let looked_at = Surveyed {
            catalog: snapshot.generation,
            pins: self.version.load(Ordering::Acquire),
            tenants: tenants.iter().map(|t| Arc::as_ptr(t) as usize).collect(),
        };
        if self.surveyed.lock().expect("lock").as_ref() == Some(&looked_at) {
            return Ok(());
        }
        let tools = snapshot.list(ListKind::Tools);
        let table = self.table.load_full();
        let (mut first, mut changed, mut over) = (Vec::new(), Vec::new(), 0usize);
        for tenant in &tenants {
            let approve = tenant.pinning.map(|p| p.approve).unwrap_or_default();
            let known = table.get(&*tenant.name);
            let mut room = MAX_PINS_PER_TENANT.saturating_sub(known.map_or(0, HashMap::len));
            for item in tools.items.iter().filter(|i| crate::tools::sees(tenant, ListKind::Tools, i)) {
                let d = digest(item);
                match known.and_then(|k| k.get(&*item.exposed)) {
                    None if room == 0 => over += 1,
                    None => {
                        room -= 1;
                        first.push(NewPin {
                            tenant: tenant.name.to_string(),
                            tool: item.exposed.to_string(),
                            upstream: app.upstreams()[item.upstream].name.to_string(),
                            digest: hex(&d),
                            definition: definition(&item.json),
                            approved: approve == Approve::FirstSight,
                        });
                    }
                    // As approved (a definition waiting stays, for the
                    // operator to decide), already waiting, or rejected.
                    Some(k) if k.approved == Some(d) || k.pending == Some(d) || k.rejected.contains(&d) => {}
                    Some(k) => changed.push((tenant.clone(), item, d, k.approved.is_some())),
                }
            }
        }
        if over > 0 {
            self.metrics.over_limit.inc_by(over as u64);
            tracing::warn!(
                tools = over,
                limit = MAX_PINS_PER_TENANT,
                "tools withheld unpinned: their tenants hold as many tool pins as they may"
            );
        }
        let now = switchboard_core::time::now_ms();
        // In one order at every replica (concurrent inserts never deadlock).
        first.sort_by(|a, b| (&a.tenant, &a.tool).cmp(&(&b.tenant, &b.tool)));
        if !first.is_empty() {
            let added = db.first_pins(&first, now).await?;
            if added > 0 {
                tracing::info!(pins = added, "tool definitions pinned as first seen, or waiting for an operator");
            }
        }
        let mut retry = false;
        for (tenant, item, d, was_approved) in changed {
            let upstream = app.upstreams()[item.upstream].name.clone();
            let recorded =
                db.pin_changed(&tenant.name, &item.exposed, &upstream, &hex(&d), &definition(&item.json), now).await?;
            if !recorded {
                // Another replica did (the pins' version moves), or another
                // definition waits too recently to be replaced: looked at again.
                retry = true;
                continue;
            }
            if !was_approved {
                // A tool never approved, still waiting: the operator sees
                // its definition as it is now.
                tracing::info!(tenant = %tenant.name, tool = %item.exposed, "a tool waiting for approval changed its definition");
                continue;
            }
            let on_change = tenant.pinning.map(|p| p.on_change).unwrap_or_default();
            let outcome = match on_change {
                OnChange::Withhold => "withheld",
                OnChange::Warn => "warned",
            };
            self.metrics.changes.with_label_values(&[&upstream, outcome]).inc();
            tracing::warn!(tenant = %tenant.name, tool = %item.exposed, upstream = %upstream, outcome,
                digest = %hex(&d), "a pinned tool's definition changed; it waits for an operator's approval");
            if let Some(audit) = app.audit() {
                let event = Event { tenant: &tenant.name, tool: &item.exposed, upstream: &upstream };
                audit.record(event.record(audit.new_id(), METHOD_CHANGED, outcome, None));
            }
        }
        // What it recorded moves the pins' version: the next survey looks again.
        *self.surveyed.lock().expect("lock") = (!retry).then_some(looked_at);
        Ok(())
    }

    /// Reloads and surveys on every wakeup (a change notified, the catalog's
    /// tools changed, or `database.refresh` passed), until the router stops.
    pub fn start<R: Running>(self: &Arc<Self>, router: std::sync::Weak<R>, refresh: std::time::Duration) {
        let Some(db) = self.db.clone() else { return };
        let me = router;
        let pins = self.clone();
        let mut wakeups = db.wakeups(switchboard_db::PINS_CHANNEL, refresh);
        tokio::spawn(async move {
            loop {
                {
                    let Some(app) = me.upgrade() else { return };
                    match pins.reload_if_changed().await {
                        Ok(tenants) => {
                            for tenant in tenants {
                                app.announce_tools(&tenant);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot read tool pins; kept as they were"),
                    }
                    if let Err(e) = pins.survey(&*app).await {
                        tracing::warn!(error = %e, "cannot record tool pins; tried again at the next refresh");
                    }
                }
                let woken = pins.wake.notified();
                tokio::select! {
                    _ = wakeups.next() => {}
                    () = woken => {
                        // The catalog's tools changed: its snapshot settles first.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }
}

/// What the pins' loop needs of the running router.
pub trait Running: Send + Sync + 'static {
    fn directory(&self) -> &switchboard_tenancy::Directory;
    fn catalog(&self) -> &switchboard_catalog::Catalog;
    fn upstreams(&self) -> &switchboard_upstream::Upstreams;
    fn audit(&self) -> Option<&switchboard_audit::Audit>;
    /// Tells `tenant`'s sessions that its tool list changed.
    fn announce_tools(&self, tenant: &str);
}

/// A pin's event, for its audit record.
pub struct Event<'a> {
    pub tenant: &'a str,
    pub tool: &'a str,
    pub upstream: &'a str,
}

impl Event<'_> {
    /// Its audit record (`user`: the operator who decided, if one did).
    pub fn record(
        &self,
        id: String,
        method: &str,
        outcome: &str,
        user: Option<Arc<str>>,
    ) -> switchboard_db::AuditRecord {
        switchboard_db::AuditRecord {
            id,
            at_ms: switchboard_core::time::now_ms(),
            tenant: Some(Arc::from(self.tenant)),
            key_prefix: None,
            session: None,
            method: Cow::Owned(method.to_owned()),
            target: Some(self.tool.to_owned()),
            upstream: Some(Arc::from(self.upstream)),
            outcome: Cow::Owned(outcome.to_owned()),
            error_code: None,
            latency_us: 0,
            request_bytes: 0,
            response_bytes: 0,
            trace_id: None,
            arguments: None,
            user,
        }
    }
}

/// The audit record's method for a changed definition.
pub const METHOD_CHANGED: &str = "switchboard/tool_definition_changed";
/// … for an operator's approval or rejection.
pub const METHOD_APPROVED: &str = "switchboard/tool_definition_approved";
pub const METHOD_REJECTED: &str = "switchboard/tool_definition_rejected";

/// The digest of tool `item`'s definition (made once per item).
pub fn digest(item: &Item) -> [u8; 32] {
    *item.digest.get_or_init(|| Sha256::digest(definition(&item.json).as_bytes()).into())
}

/// A tool's definition as canonical JSON: its definition's fields only,
/// every object's keys sorted, no white space.
pub fn definition(tool_json: &[u8]) -> String {
    let Ok(Value::Object(tool)) = serde_json::from_slice::<Value>(tool_json) else { return String::new() };
    let picked: Map<String, Value> = DEFINITION_FIELDS
        .iter()
        .filter_map(|&field| tool.get(field).map(|v| (field.to_owned(), canonical(v))))
        .collect();
    canonical(&Value::Object(picked)).to_string()
}

fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), canonical(&map[k]))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// `json` (a tool) with the mark of a changed definition in its `_meta`.
pub fn marked(json: &[u8]) -> Vec<u8> {
    let Ok(Value::Object(mut tool)) = serde_json::from_slice::<Value>(json) else { return json.to_vec() };
    let meta = tool.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert(CHANGED_META.into(), Value::Bool(true));
    }
    serde_json::to_vec(&tool).expect("serializable")
}

pub fn hex(digest: &[u8; 32]) -> String {
    hex::encode(digest)
}

fn hex32(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok().map(|()| out)
}

struct Metrics {
    changes: IntCounterVec,
    pending: IntGauge,
    over_limit: prometheus::IntCounter,
}

impl Metrics {
    fn new(registry: &Registry) -> Metrics {
        let changes = IntCounterVec::new(
            Opts::new(
                "switchboard_tool_definition_changes_total",
                "Pinned tool definitions found changed (recorded once across replicas), by upstream and what the tenant gets: withheld or warned.",
            ),
            &["upstream", "outcome"],
        )
        .expect("valid metric");
        let pending = IntGauge::new(
            "switchboard_tool_pins_pending",
            "Tool definitions waiting for an operator's approval (changed, or never approved), all tenants.",
        )
        .expect("valid metric");
        let over_limit = prometheus::IntCounter::new(
            "switchboard_tool_pins_over_limit_total",
            "Tools found unpinned while their tenant held as many pins as it may (withheld from it, not pinned).",
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(changes.clone()));
        let _ = registry.register(Box::new(pending.clone()));
        let _ = registry.register(Box::new(over_limit.clone()));
        Metrics { changes, pending, over_limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_is_its_fields_with_keys_sorted() {
        let a = definition(br#"{"name":"t","_meta":{"x":1},"inputSchema":{"type":"object","properties":{"b":{},"a":{}}},"description":"d"}"#);
        let b = definition(br#"{"description":"d","inputSchema":{"properties":{"a":{},"b":{}},"type":"object"},"name":"t","icons":[]}"#);
        assert_eq!(a, b);
        assert_eq!(a, r#"{"description":"d","inputSchema":{"properties":{"a":{},"b":{}},"type":"object"},"name":"t"}"#);
        assert_ne!(a, definition(br#"{"name":"t","description":"e","inputSchema":{"type":"object"}}"#));
    }

    #[test]
    fn digests_read_back_from_hex() {
        let d: [u8; 32] = Sha256::digest(b"x").into();
        assert_eq!(hex32(&hex(&d)), Some(d));
        assert_eq!(hex32("zz"), None);
    }

    #[test]
    fn a_warned_tool_is_marked_in_its_meta() {
        let v: Value = serde_json::from_slice(&marked(br#"{"name":"t","_meta":{"k":1}}"#)).unwrap();
        assert_eq!(v["_meta"][CHANGED_META], true);
        assert_eq!(v["_meta"]["k"], 1);
    }
}
