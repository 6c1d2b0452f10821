//! Tenants and API keys: who is calling, and what they may see.
//!
//! The [`Directory`] holds an immutable snapshot of every tenant (from the
//! config file and the database; the database wins on a name in both) and
//! every live key's hash, swapped whole when the database changes. The
//! request path only reads that snapshot: it never queries the database.
//!
//! Keys are `sb_` and 40 random base62 characters (about 238 bits). Only
//! their SHA-256 is stored, with the first 11 characters as a visible prefix
//! that names the key in lists, logs and audit records. A key is never
//! logged.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::{Database, KeyRow, StoreError, TenantRow};

/// Length of a key's visible prefix (`sb_` and 8 characters).
pub const PREFIX_LEN: usize = 11;
const KEY_BODY_LEN: usize = 40;

/// What a tenant may use and how much: stored as JSON in the database and
/// written as `[[tenants]]` in the config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Upstream names the tenant subscribes to; `"*"` for all.
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Per upstream name: which of its tools the tenant sees.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolFilter>,
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Store `tools/call` arguments in audit records.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub audit_arguments: bool,
}

/// Tool name patterns (`*` matches any run of characters, `?` one): a tool is
/// seen if it matches an `allow` pattern (or `allow` is empty) and no `deny`
/// pattern. Patterns match the upstream's own tool name, not the namespaced one.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl ToolFilter {
    pub fn permits(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|p| glob(p, name))) && !self.deny.iter().any(|p| glob(p, name))
    }
}

/// Rate limits of a tenant: each is optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Requests of one API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Rate>,
    /// Requests of all the tenant's keys together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Rate>,
    /// `tools/call` of one tool, by all the tenant's keys together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Rate>,
    /// Forwarded requests of the tenant in flight at once, on one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u32>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.key.is_none() && self.tenant.is_none() && self.tool.is_none() && self.concurrent.is_none()
    }
}

/// A sustained rate with a burst: `burst` requests at once, then one every
/// `1 / per_second` seconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub per_second: f64,
    #[serde(default = "one")]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

impl Policy {
    /// Problems with this policy, each as `(field, message)`; `upstreams`
    /// are the configured upstream names.
    pub fn problems(&self, upstreams: &[&str]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            if u != "*" && !upstreams.contains(&u.as_str()) {
                out.push((format!("upstreams[{i}]"), format!("{u:?} is not a configured upstream")));
            }
        }
        for u in self.tools.keys() {
            if !upstreams.contains(&u.as_str()) {
                out.push((format!("tools.{u}"), format!("{u:?} is not a configured upstream")));
            }
        }
        for (name, rate) in [("key", self.limits.key), ("tenant", self.limits.tenant), ("tool", self.limits.tool)] {
            if let Some(rate) = rate {
                if !(rate.per_second.is_finite() && rate.per_second > 0.0) {
                    out.push((format!("limits.{name}.per_second"), "must be greater than zero".into()));
                }
                if rate.burst == 0 {
                    out.push((format!("limits.{name}.burst"), "must be at least 1".into()));
                }
            }
        }
        if self.limits.concurrent == Some(0) {
            out.push(("limits.concurrent".into(), "must be at least 1".into()));
        }
        out
    }
}

/// A tenant, resolved against the configured upstreams.
#[derive(Debug)]
pub struct Tenant {
    pub name: Arc<str>,
    /// Per upstream index: `None` if not subscribed.
    access: Vec<Option<ToolFilter>>,
    /// Subscribed to everything, with no tool filter.
    unrestricted: bool,
    pub limits: Limits,
    pub audit_arguments: bool,
}

impl Tenant {
    /// Resolves `policy`; upstream names that are not configured are ignored.
    pub fn new(name: &str, policy: &Policy, upstreams: &[Arc<str>]) -> Tenant {
        let all = policy.upstreams.iter().any(|u| u == "*");
        let access: Vec<Option<ToolFilter>> = upstreams
            .iter()
            .map(|u| {
                let subscribed = all || policy.upstreams.iter().any(|p| **p == **u);
                subscribed.then(|| policy.tools.get(&**u).cloned().unwrap_or_default())
            })
            .collect();
        let unrestricted = access.iter().all(|a| a.as_ref().is_some_and(|f| f.allow.is_empty() && f.deny.is_empty()));
        Tenant {
            name: Arc::from(name),
            access,
            unrestricted,
            limits: policy.limits.clone(),
            audit_arguments: policy.audit_arguments,
        }
    }

    /// Whether the tenant subscribes to upstream `u` (its resources, prompts, tools).
    pub fn sees_upstream(&self, u: usize) -> bool {
        self.access.get(u).is_some_and(Option::is_some)
    }

    /// Whether the tenant sees tool `name` (the upstream's own name) of upstream `u`.
    pub fn sees_tool(&self, u: usize, name: &str) -> bool {
        match self.access.get(u) {
            Some(Some(filter)) => filter.permits(name),
            _ => false,
        }
    }

    /// Sees every upstream and every tool: lists need no filtering.
    pub fn unrestricted(&self) -> bool {
        self.unrestricted
    }
}

/// Who made a request: the tenant, and the prefix of the key used.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: Arc<Tenant>,
    /// Empty when authentication is off.
    pub key_prefix: Arc<str>,
    /// The key's hash, for the per-key rate limit.
    pub key_id: Arc<str>,
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Bearer` or `X-API-Key`.
    Missing,
    /// Not a key we know (or revoked).
    Invalid,
    /// Known, but past its expiry.
    Expired,
}

impl AuthFailure {
    pub fn label(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Invalid => "invalid",
            AuthFailure::Expired => "expired",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "an API key is required: send it as \"Authorization: Bearer <key>\" or \"X-API-Key: <key>\""
            }
            AuthFailure::Invalid => "the API key is not valid (unknown or revoked)",
            AuthFailure::Expired => "the API key has expired; ask for a new one",
        }
    }
}

struct LiveKey {
    prefix: Arc<str>,
    id: Arc<str>,
    tenant: Arc<Tenant>,
    expires_at_ms: Option<i64>,
}

/// The tenants and keys at one moment.
#[derive(Default)]
struct Snapshot {
    version: i64,
    keys: HashMap<[u8; 32], LiveKey>,
    tenants: HashMap<Arc<str>, Arc<Tenant>>,
}

/// The in-memory directory of tenants and keys.
pub struct Directory {
    snapshot: ArcSwap<Snapshot>,
    /// `auth.mode = "none"`: every request is this tenant's.
    open: Option<Principal>,
    static_tenants: Vec<(String, Policy)>,
    upstreams: Vec<Arc<str>>,
    db: Option<Database>,
}

impl Directory {
    /// A directory for the configured upstreams. With `open`, authentication
    /// is off and every request belongs to a tenant `default` that sees
    /// everything.
    pub fn new(
        upstreams: Vec<Arc<str>>,
        static_tenants: Vec<(String, Policy)>,
        db: Option<Database>,
        open: bool,
    ) -> Directory {
        let open = open.then(|| {
            let policy = Policy { upstreams: vec!["*".into()], ..Policy::default() };
            Principal {
                tenant: Arc::new(Tenant::new("default", &policy, &upstreams)),
                key_prefix: Arc::from(""),
                key_id: Arc::from(""),
            }
        });
        let directory = Directory { snapshot: ArcSwap::default(), open, static_tenants, upstreams, db };
        directory.install(0, Vec::new(), Vec::new());
        directory
    }

    /// Whether requests must carry a key.
    pub fn required(&self) -> bool {
        self.open.is_none()
    }

    /// The caller of a request, from its `Authorization: Bearer` or
    /// `X-API-Key` header.
    pub fn authenticate(&self, headers: &HeaderMap, now_ms: i64) -> Result<Principal, AuthFailure> {
        self.authenticate_key(presented_key(headers), now_ms)
    }

    /// The owner of an API key presented some other way (an edge device's
    /// `register` message). With authentication off, the open tenant.
    pub fn authenticate_key(&self, key: Option<&str>, now_ms: i64) -> Result<Principal, AuthFailure> {
        if let Some(open) = &self.open {
            return Ok(open.clone());
        }
        let key = key.filter(|k| !k.is_empty()).ok_or(AuthFailure::Missing)?;
        let snapshot = self.snapshot.load();
        let live = snapshot.keys.get(&hash(key)).ok_or(AuthFailure::Invalid)?;
        if live.expires_at_ms.is_some_and(|at| at <= now_ms) {
            return Err(AuthFailure::Expired);
        }
        Ok(Principal { tenant: live.tenant.clone(), key_prefix: live.prefix.clone(), key_id: live.id.clone() })
    }

    /// The tenant with this name, if any.
    pub fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.snapshot.load().tenants.get(name).cloned()
    }

    /// Names of the tenants declared in the config file.
    pub fn static_tenants(&self) -> &[(String, Policy)] {
        &self.static_tenants
    }

    /// Reads tenants and keys from the database and swaps them in.
    pub async fn reload(&self) -> Result<(), StoreError> {
        let Some(db) = &self.db else { return Ok(()) };
        let (version, tenants, keys) = db.load().await?;
        self.install(version, tenants, keys);
        Ok(())
    }

    fn install(&self, version: i64, db_tenants: Vec<TenantRow>, keys: Vec<KeyRow>) {
        let mut tenants: HashMap<Arc<str>, Arc<Tenant>> = HashMap::new();
        for (name, policy) in &self.static_tenants {
            tenants.insert(Arc::from(name.as_str()), Arc::new(Tenant::new(name, policy, &self.upstreams)));
        }
        for row in &db_tenants {
            // The database is the source of truth for a name in both.
            tenants
                .insert(Arc::from(row.name.as_str()), Arc::new(Tenant::new(&row.name, &row.policy, &self.upstreams)));
        }
        let mut live = HashMap::new();
        for key in keys {
            let Some(tenant) = tenants.get(key.tenant.as_str()) else {
                tracing::warn!(key = %key.prefix, tenant = %key.tenant, "API key of an unknown tenant ignored");
                continue;
            };
            let Some(digest) = parse_hex32(&key.hash) else {
                tracing::warn!(key = %key.prefix, "API key with a malformed hash ignored");
                continue;
            };
            live.insert(
                digest,
                LiveKey {
                    prefix: Arc::from(key.prefix.as_str()),
                    id: Arc::from(key.hash.as_str()),
                    tenant: tenant.clone(),
                    expires_at_ms: key.expires_at_ms,
                },
            );
        }
        self.snapshot.store(Arc::new(Snapshot { version, keys: live, tenants }));
    }

    /// Keeps the snapshot current: reloads on every database notification
    /// (PostgreSQL) and whenever the change counter moved (polled every
    /// `refresh`, on both databases, as a safety net).
    pub fn start(self: &Arc<Self>, refresh: Duration, on_reload: impl Fn(bool) + Send + Sync + 'static) {
        let Some(db) = self.db.clone() else { return };
        let directory = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut notified = db.watch();
            let mut healthy = true;
            loop {
                let wake = async {
                    match notified.as_mut() {
                        Some(rx) => tokio::time::timeout(refresh, rx.recv()).await.ok().flatten().is_some(),
                        None => {
                            tokio::time::sleep(refresh).await;
                            false
                        }
                    }
                };
                let by_notification = wake.await;
                let Some(directory) = directory.upgrade() else { return };
                let current = directory.snapshot.load().version;
                let outcome = if by_notification {
                    directory.reload().await.map(|()| true)
                } else {
                    match db.version().await {
                        Ok(v) if v != current => directory.reload().await.map(|()| true),
                        Ok(_) => Ok(false),
                        Err(e) => Err(e),
                    }
                };
                match outcome {
                    Ok(reloaded) => {
                        if !healthy {
                            tracing::info!("tenant directory: database reachable again");
                        }
                        healthy = true;
                        if reloaded {
                            tracing::debug!("tenant directory reloaded");
                        }
                        on_reload(true);
                    }
                    Err(e) => {
                        if healthy {
                            tracing::warn!(error = %e, "tenant directory: cannot reach the database; serving the last known tenants and keys");
                        }
                        healthy = false;
                        on_reload(false);
                    }
                }
            }
        });
    }
}

/// The key a request presents, if any.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer ") {
            let key = v[7..].trim();
            if !key.is_empty() {
                return Some(key);
            }
        }
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim).filter(|k| !k.is_empty())
}

/// A new random key, with its prefix and the hash to store.
pub fn generate_key() -> (String, String, String) {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut key = String::with_capacity(3 + KEY_BODY_LEN);
    key.push_str("sb_");
    let mut filled = 0;
    while filled < KEY_BODY_LEN {
        let mut bytes = [0u8; 64];
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        for b in bytes {
            // 62 * 4 = 248: rejecting 248..=255 keeps every character equally likely.
            if b < 248 && filled < KEY_BODY_LEN {
                key.push(ALPHABET[(b % 62) as usize] as char);
                filled += 1;
            }
        }
    }
    let prefix = key[..PREFIX_LEN].to_owned();
    let hash = hex(&hash(&key));
    (key, prefix, hash)
}

/// SHA-256 of a key. Keys are long and random, so a fast hash is enough:
/// there is nothing to brute-force.
pub fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// SHA-256 of any bytes.
pub fn hash_bytes(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// `*` matches any run of characters, `?` exactly one; everything else itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("echo", "echo"));
        assert!(!glob("echo", "echoes"));
        assert!(glob("echo*", "echoes"));
        assert!(glob("*_file", "create_file"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("g?t", "get"));
        assert!(!glob("g?t", "gt"));
    }

    #[test]
    fn filters() {
        let f = ToolFilter { allow: vec!["get_*".into(), "echo".into()], deny: vec!["get_secret*".into()] };
        assert!(f.permits("get_time"));
        assert!(f.permits("echo"));
        assert!(!f.permits("get_secret_key"));
        assert!(!f.permits("delete_all"));
        assert!(ToolFilter::default().permits("anything"));
    }

    #[test]
    fn tenants_resolve_against_upstreams() {
        let ups: Vec<Arc<str>> = vec!["a".into(), "b".into(), "c".into()];
        let mut policy = Policy { upstreams: vec!["a".into(), "c".into(), "gone".into()], ..Policy::default() };
        policy.tools.insert("c".into(), ToolFilter { allow: vec!["x*".into()], deny: vec![] });
        let t = Tenant::new("t", &policy, &ups);
        assert!(t.sees_upstream(0) && !t.sees_upstream(1) && t.sees_upstream(2));
        assert!(t.sees_tool(0, "anything"));
        assert!(!t.sees_tool(1, "anything"));
        assert!(t.sees_tool(2, "xray") && !t.sees_tool(2, "yak"));
        assert!(!t.unrestricted());
        let all = Tenant::new("all", &Policy { upstreams: vec!["*".into()], ..Policy::default() }, &ups);
        assert!(all.unrestricted());
        assert_eq!(
            policy.problems(&["a", "b", "c"]).iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["upstreams[2]"]
        );
    }

    #[test]
    fn keys_are_random_and_only_their_hash_is_kept() {
        let (k1, p1, h1) = generate_key();
        let (k2, _, h2) = generate_key();
        assert_ne!(k1, k2);
        assert_eq!(k1.len(), 43);
        assert!(k1.starts_with("sb_") && k1.starts_with(&p1) && p1.len() == PREFIX_LEN);
        assert!(k1[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(h1, h2);
        assert_eq!(parse_hex32(&h1), Some(hash(&k1)));
        assert!(!h1.contains(&k1[3..]));
    }

    #[test]
    fn keys_are_read_from_either_header() {
        let ups: Vec<Arc<str>> = vec!["a".into()];
        let dir = Directory::new(
            ups,
            vec![("t".into(), Policy { upstreams: vec!["a".into()], ..Policy::default() })],
            None,
            false,
        );
        let (key, prefix, h) = generate_key();
        let (old, old_prefix, old_h) = generate_key();
        let row = |prefix: &str, hash: &str, expires| KeyRow {
            prefix: prefix.into(),
            hash: hash.into(),
            tenant: "t".into(),
            created_at_ms: 0,
            expires_at_ms: expires,
            revoked_at_ms: None,
        };
        dir.install(1, vec![], vec![row(&prefix, &h, None), row(&old_prefix, &old_h, Some(1000))]);
        let mut headers = HeaderMap::new();
        assert_eq!(dir.authenticate(&headers, 0).unwrap_err(), AuthFailure::Missing);
        headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
        let p = dir.authenticate(&headers, 0).unwrap();
        assert_eq!(&*p.tenant.name, "t");
        assert_eq!(&*p.key_prefix, prefix);
        headers.clear();
        headers.insert("x-api-key", key.parse().unwrap());
        assert!(dir.authenticate(&headers, 0).is_ok());
        headers.insert("x-api-key", "sb_nope".parse().unwrap());
        assert_eq!(dir.authenticate(&headers, 0).unwrap_err(), AuthFailure::Invalid);
        headers.insert("x-api-key", old.parse().unwrap());
        assert!(dir.authenticate(&headers, 999).is_ok());
        assert_eq!(dir.authenticate(&headers, 1000).unwrap_err(), AuthFailure::Expired);
    }
}
