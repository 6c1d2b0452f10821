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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use switchboard_core::policy::{AuthFailure, Policy, Principal, Tenant};

use switchboard_db::{Database, DbError, KeyRow, TenantRow};

mod metrics;
pub use metrics::Metrics;

/// Length of a key's visible prefix (`sb_` and 8 characters).
pub const PREFIX_LEN: usize = 11;
const KEY_BODY_LEN: usize = 40;

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
    open: Option<ArcSwap<Principal>>,
    /// The config file's tenants (replaced when the file is reloaded).
    static_tenants: std::sync::RwLock<Vec<(String, Policy)>>,
    /// What the database said last, to rebuild the snapshot from when the
    /// config file's tenants change.
    last: std::sync::Mutex<(i64, Vec<TenantRow>, Vec<KeyRow>)>,
    /// Each upstream's name, by id (retired ones too: ids are slots).
    upstreams: std::sync::RwLock<Vec<Arc<str>>>,
    db: Option<Database>,
    /// Whether keys were loaded from the database at least once (or there
    /// is no database): until then an unknown key may be a valid one.
    loaded: AtomicBool,
    /// Moves on every snapshot installed ([`Directory::generation`]).
    generation: AtomicU64,
    metrics: Arc<Metrics>,
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
        metrics: Arc<Metrics>,
    ) -> Directory {
        let open = open.then(|| ArcSwap::from_pointee(open_principal(&upstreams)));
        let loaded = AtomicBool::new(db.is_none());
        let directory = Directory {
            snapshot: ArcSwap::default(),
            open,
            static_tenants: std::sync::RwLock::new(static_tenants),
            last: std::sync::Mutex::default(),
            upstreams: std::sync::RwLock::new(upstreams),
            db,
            loaded,
            generation: AtomicU64::new(0),
            metrics,
        };
        directory.install(0, Vec::new(), Vec::new());
        directory
    }

    /// Whether requests must carry a key.
    pub fn required(&self) -> bool {
        self.open.is_none()
    }

    /// The owner of the API key a request presents (the router reads it
    /// from `Authorization: Bearer` or `X-API-Key`; an edge device, from its
    /// `register` message). With authentication off, the open tenant. A
    /// refusal is counted. `now_ms` (the wall clock, in milliseconds) is
    /// asked only of a key that can expire.
    pub fn authenticate_key(&self, key: Option<&str>, now_ms: impl FnOnce() -> i64) -> Result<Principal, AuthFailure> {
        self.authenticate_key_expiring(key, now_ms).map(|(principal, _)| principal)
    }

    /// [`Directory::authenticate_key`], with when the key expires (wall
    /// clock, milliseconds; `None`: never), for a caller that remembers
    /// the outcome while [`Directory::generation`] stays the same.
    pub fn authenticate_key_expiring(
        &self,
        key: Option<&str>,
        now_ms: impl FnOnce() -> i64,
    ) -> Result<(Principal, Option<i64>), AuthFailure> {
        self.check_key(key, now_ms).inspect_err(|failure| self.metrics.auth_failed(failure.label()))
    }

    /// Which snapshot of tenants and keys is in force: it moves whenever
    /// one is installed (a key created, revoked or expired by an operator,
    /// a tenant changed, the config file reloaded, upstreams changed). A
    /// caller's check made under one generation holds while it lasts.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// What the metrics of this directory record (a refusal the directory
    /// cannot see, such as a key naming another tenant's session).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn check_key(
        &self,
        key: Option<&str>,
        now_ms: impl FnOnce() -> i64,
    ) -> Result<(Principal, Option<i64>), AuthFailure> {
        if let Some(open) = &self.open {
            return Ok((Principal::clone(&open.load()), None));
        }
        let key = key.filter(|k| !k.is_empty()).ok_or(AuthFailure::Missing)?;
        let snapshot = self.snapshot.load();
        let live = snapshot.keys.get(&hash(key)).ok_or_else(|| {
            if self.loaded.load(Ordering::Acquire) {
                AuthFailure::Invalid
            } else {
                AuthFailure::NotLoaded
            }
        })?;
        // The clock is read only for a key that can expire.
        if live.expires_at_ms.is_some_and(|at| at <= now_ms()) {
            return Err(AuthFailure::Expired);
        }
        if !live.tenant.accepts_keys() {
            return Err(AuthFailure::NotAccepted);
        }
        Ok((Principal::of_key(live.tenant.clone(), live.prefix.clone(), live.id.clone()), live.expires_at_ms))
    }

    /// The tenant with this name, if any.
    pub fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.snapshot.load().tenants.get(name).cloned()
    }

    /// Every tenant (the database's and the config file's).
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.snapshot.load().tenants.values().cloned().collect()
    }

    /// The tenants declared in the config file.
    pub fn static_tenants(&self) -> Vec<(String, Policy)> {
        self.static_tenants.read().expect("lock").clone()
    }

    /// The config file's tenants changed (it was reloaded): the snapshot is
    /// rebuilt with them and what the database said last (whose tenants
    /// still win on a name). Keys of a tenant that is gone stop working; a
    /// key whose tenant appears starts.
    pub fn set_static_tenants(&self, tenants: Vec<(String, Policy)>) {
        *self.static_tenants.write().expect("lock") = tenants;
        let (version, db_tenants, keys) = self.last.lock().expect("lock").clone();
        self.install(version, db_tenants, keys);
    }

    /// The upstreams changed (some added or retired while the router
    /// runs): `upstreams` names every id's upstream, and each tenant is
    /// resolved again against them.
    pub fn set_upstreams(&self, upstreams: Vec<Arc<str>>) {
        if let Some(open) = &self.open {
            open.store(Arc::new(open_principal(&upstreams)));
        }
        *self.upstreams.write().expect("lock") = upstreams;
        let (version, db_tenants, keys) = self.last.lock().expect("lock").clone();
        self.install(version, db_tenants, keys);
    }

    /// Reads tenants and keys from the database and swaps them in.
    /// `switchboard_tenant_directory_db_up` says whether it could.
    pub async fn reload(&self) -> Result<(), DbError> {
        let Some(db) = &self.db else { return Ok(()) };
        let (version, tenants, keys) = db.load().await.inspect_err(|_| self.metrics.set_db_up(false))?;
        self.install(version, tenants, keys);
        self.loaded.store(true, Ordering::Release);
        // Up once what it holds is in force, not before.
        self.metrics.set_db_up(true);
        Ok(())
    }

    fn install(&self, version: i64, db_tenants: Vec<TenantRow>, keys: Vec<KeyRow>) {
        *self.last.lock().expect("lock") = (version, db_tenants.clone(), keys.clone());
        let upstreams = self.upstreams.read().expect("lock").clone();
        let mut tenants: HashMap<Arc<str>, Arc<Tenant>> = HashMap::new();
        for (name, policy) in self.static_tenants.read().expect("lock").iter() {
            tenants.insert(Arc::from(name.as_str()), Arc::new(Tenant::new(name, policy, &upstreams)));
        }
        for row in &db_tenants {
            // The database is the source of truth for a name in both.
            tenants.insert(Arc::from(row.name.as_str()), Arc::new(Tenant::new(&row.name, &row.policy, &upstreams)));
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
        // After the store: a check that read the old snapshot carries the
        // old generation, and is not kept past it.
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Keeps the snapshot current: reloads on every database notification
    /// (PostgreSQL) and whenever the change counter moved (polled every
    /// `refresh`, on both databases, as a safety net).
    pub fn start(self: &Arc<Self>, refresh: Duration) {
        let Some(db) = self.db.clone() else { return };
        let directory = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut wakeups = db.wakeups(switchboard_db::CHANGES_CHANNEL, refresh);
            let mut healthy = true;
            loop {
                let by_notification = wakeups.next().await;
                let Some(directory) = directory.upgrade() else { return };
                let current = directory.snapshot.load().version;
                // Never loaded yet (the database was down at start): the
                // version may well be the empty snapshot's (0, as a fresh
                // database's is), and the keys must be read all the same.
                let loaded = directory.loaded.load(Ordering::Acquire);
                let outcome = if by_notification {
                    directory.reload().await.map(|()| true)
                } else {
                    match db.version().await {
                        Ok(v) if v != current || !loaded => directory.reload().await.map(|()| true),
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
                        directory.metrics.set_db_up(true);
                    }
                    Err(e) => {
                        if healthy {
                            tracing::warn!(error = %e, "tenant directory: cannot reach the database; serving the last known tenants and keys");
                        }
                        healthy = false;
                        directory.metrics.set_db_up(false);
                    }
                }
            }
        });
    }
}

/// Who every request is when authentication is off: tenant `default`,
/// which sees every upstream.
fn open_principal(upstreams: &[Arc<str>]) -> Principal {
    let policy = Policy { upstreams: vec!["*".into()], ..Policy::default() };
    Principal::of_key(Arc::new(Tenant::new("default", &policy, upstreams)), Arc::from(""), Arc::from(""))
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
    let hash = hex::encode(hash(&key));
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

fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_stored_hash_is_sha256_of_the_key() {
        // Known answer from coreutils' `sha256sum`, not from this crate.
        let key = "sb_0123456789abcdefghijABCDEFGHIJ0123456789";
        assert_eq!(hex::encode(hash(key)), "fc85ec054819180cd5680700c8c4de1e292b1c3b849c853e12f7bee274331365");
    }

    #[tokio::test]
    async fn keys_are_unknown_rather_than_invalid_until_the_database_was_read() {
        let path = std::env::temp_dir().join(format!("sb-directory-{}.db", std::process::id()));
        let db = Database::connect(&format!("sqlite:{}", path.display()), Duration::from_secs(1)).unwrap();
        let dir = Directory::new(vec![], vec![], Some(db.clone()), false, Arc::new(Metrics::new(&Default::default())));
        // Not migrated yet: the load fails, as with a database that is down.
        assert!(dir.reload().await.is_err());
        assert_eq!(dir.authenticate_key(Some("sb_whatever"), || 0).unwrap_err(), AuthFailure::NotLoaded);
        db.migrate().await.unwrap();
        dir.reload().await.unwrap();
        assert_eq!(dir.authenticate_key(Some("sb_whatever"), || 0).unwrap_err(), AuthFailure::Invalid);
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn a_database_that_comes_up_empty_is_read_by_the_refresh() {
        let path = std::env::temp_dir().join(format!("sb-directory-empty-{}.db", std::process::id()));
        let db = Database::connect(&format!("sqlite:{}", path.display()), Duration::from_secs(1)).unwrap();
        let metrics = Arc::new(Metrics::new(&Default::default()));
        let dir = Arc::new(Directory::new(vec![], vec![], Some(db.clone()), false, metrics));
        // Not migrated: unreadable, as a database that is down at start.
        assert!(dir.reload().await.is_err());
        dir.start(Duration::from_millis(20));
        // It comes up with nothing in it: its version (0) is the empty
        // directory's, yet it was never read.
        db.migrate().await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while dir.authenticate_key(Some("sb_whatever"), || 0).unwrap_err() == AuthFailure::NotLoaded {
            assert!(std::time::Instant::now() < deadline, "a database whose version is the empty one's is never read");
            // Polling: the refresh reads it within its period.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(dir.authenticate_key(Some("sb_whatever"), || 0).unwrap_err(), AuthFailure::Invalid);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_key_is_its_tenants_until_it_expires_and_unknown_or_missing_ones_are_refused() {
        let ups: Vec<Arc<str>> = vec!["a".into()];
        let dir = Directory::new(
            ups,
            vec![("t".into(), Policy { upstreams: vec!["a".into()], ..Policy::default() })],
            None,
            false,
            Arc::new(Metrics::new(&Default::default())),
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
        assert_eq!(dir.authenticate_key(None, || 0).unwrap_err(), AuthFailure::Missing);
        assert_eq!(dir.authenticate_key(Some(""), || 0).unwrap_err(), AuthFailure::Missing);
        let p = dir.authenticate_key(Some(&key), || 0).unwrap();
        assert_eq!(&*p.tenant.name, "t");
        assert_eq!(&*p.key_prefix, prefix);
        assert_eq!(dir.authenticate_key(Some("sb_nope"), || 0).unwrap_err(), AuthFailure::Invalid);
        assert!(dir.authenticate_key(Some(&old), || 999).is_ok());
        assert_eq!(dir.authenticate_key(Some(&old), || 1000).unwrap_err(), AuthFailure::Expired);
    }
}
