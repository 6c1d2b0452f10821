//! The credential vault: what the router sends an upstream for one tenant,
//! or for one user of a tenant, in place of the upstream's own headers.
//!
//! Credentials live in the database (`credentials` table), each sealed with
//! AES-256-GCM under the vault key ([`keys`]) and bound to its record; the
//! key never reaches the database, and a record names the key that sealed
//! it by an id derived from the key. Every replica opens them all into an
//! in-memory snapshot, swapped whole when the vault's version moves (a
//! PostgreSQL notification, or a poll every `database.refresh`); the
//! request path reads that snapshot only, through [`Keychain`].
//!
//! A request's credential for an upstream is its user's, else its
//! tenant's, else none (the upstream's own headers), unless the upstream
//! requires one: then the request fails with words saying how to add it. A
//! credential that cannot be opened (sealed with a key this replica does not
//! have) is never replaced by a less specific one: its requests fail too.
//!
//! A value is shown once, to whoever sets it: the vault never returns one,
//! and nothing it logs or counts carries one.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use switchboard_core::credential::{Credential, Credentials, Keychain, Missing};
use switchboard_core::metrics::{counter_vec, gauge, IntCounterVec, IntGauge, Registry};
use switchboard_db::{CredentialRow, Database, DbError, VAULT_CHANNEL};

pub mod keys;
pub use keys::{Key, Keyring};

/// Largest credential: its headers' names and values together.
pub const MAX_CREDENTIAL_BYTES: usize = 8 << 10;
/// Most headers in one credential.
pub const MAX_HEADERS: usize = 16;
/// Longest user name.
pub const MAX_USER_LEN: usize = 256;

/// What can go wrong with the vault.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("vault key {0}")]
    BadKey(String),
    #[error("no vault key is configured (vault.key or vault.key_file): credentials cannot be stored; make a key with `switchboard vault new-key`")]
    NoKey,
    #[error("credentials need a database (database.url)")]
    NoDatabase,
    /// Records this replica cannot open: the startup check's refusal.
    #[error("{0}")]
    Unreadable(String),
    #[error("invalid credential: {0}")]
    Invalid(String),
    #[error("tenant {tenant:?} has {max} credentials, the most vault.max_per_tenant allows; delete one first")]
    TooMany { tenant: String, max: u32 },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// What a credential holds, as sealed.
#[derive(Serialize, Deserialize)]
struct Secret {
    headers: Vec<(String, String)>,
    /// An OAuth grant's particulars (kind `oauth`): what renews it, as the
    /// router's upstream OAuth client reads them; opaque here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    grant: Option<serde_json::Value>,
}

/// An OAuth grant the vault holds for a caller (kind `oauth`).
#[derive(Clone)]
pub struct Grant {
    pub tenant: String,
    /// `""`: the tenant's own.
    pub user: String,
    pub upstream: String,
    /// What the router's OAuth client keeps with its tokens.
    pub particulars: Arc<serde_json::Value>,
    /// The sealed record, for a compare-and-set replacement.
    pub sealed: String,
    /// What it sends (its access token as `Authorization: Bearer`).
    pub credential: Arc<Credential>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant").field("label", &label(&self.tenant, &self.user, &self.upstream)).finish_non_exhaustive()
    }
}

/// What an OAuth state sealed by [`Vault::seal_state`] is bound to.
const STATE_AAD: &[u8] = b"switchboard-oauth-state";

/// A credential to store: the headers of `user` of `tenant` (`None`: the
/// tenant's own) for `upstream`.
#[derive(Clone)]
pub struct NewCredential {
    pub tenant: String,
    pub user: Option<String>,
    pub upstream: String,
    /// Names and values; shown nowhere once stored.
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for NewCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("NewCredential")
            .field("tenant", &self.tenant)
            .field("user", &self.user)
            .field("upstream", &self.upstream)
            .field("headers", &names)
            .finish()
    }
}

/// What [`Vault::rotate`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rotation {
    /// Sealed again with the current key.
    pub resealed: u64,
    /// Already sealed with it.
    pub current: u64,
}

/// A credential in the snapshot.
enum Entry {
    Ready(Arc<Credential>),
    /// Stored, but not openable here (why is logged, not told the client).
    Unreadable,
}

#[derive(Default)]
struct Snapshot {
    /// Whether it was loaded from the database (else: empty because the
    /// database has not answered yet).
    loaded: bool,
    version: i64,
    /// By [`entry_key`].
    entries: HashMap<Box<str>, Entry>,
    /// The OAuth grants among them, by [`entry_key`].
    grants: HashMap<Box<str>, Grant>,
}

struct Inner {
    db: Option<Database>,
    keyring: Option<Keyring>,
    max_per_tenant: u32,
    snapshot: ArcSwap<Snapshot>,
    /// One reload at a time, so that an older snapshot never replaces a newer one.
    reloading: tokio::sync::Mutex<()>,
    metrics: Metrics,
}

/// The vault: a cheap handle, shared by the router, its sessions and the
/// admin API.
#[derive(Clone)]
pub struct Vault {
    inner: Arc<Inner>,
}

impl Vault {
    /// A vault over `db` (none: no credentials can exist), sealing with
    /// `keyring` (none: none can be stored), at most `max_per_tenant`
    /// credentials per tenant (its users' included). Empty until loaded.
    pub fn new(db: Option<Database>, keyring: Option<Keyring>, max_per_tenant: u32, registry: &Registry) -> Vault {
        // Without a database or a key none can be stored or opened: loaded,
        // and empty (stored ones, with no key, are refused at start).
        let loaded = db.is_none() || keyring.is_none();
        let snapshot = ArcSwap::from_pointee(Snapshot { loaded, ..Snapshot::default() });
        let reloading = tokio::sync::Mutex::new(());
        let inner = Inner { db, keyring, max_per_tenant, snapshot, reloading, metrics: Metrics::new(registry) };
        Vault { inner: Arc::new(inner) }
    }

    /// The ids of the configured keys, the current one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.inner.keyring.as_ref().map(|k| k.ids().into_iter().map(str::to_owned).collect()).unwrap_or_default()
    }

    /// Loads every credential, refusing if any cannot be opened with the
    /// configured keys (the startup check: a wrong key is an error here,
    /// not a stream of failed requests later).
    pub async fn load(&self) -> Result<(), VaultError> {
        let unreadable = self.reload().await?;
        if unreadable.is_empty() {
            return Ok(());
        }
        Err(VaultError::Unreadable(self.explain(&unreadable)))
    }

    /// Opens every stored credential into a new snapshot; the ones that
    /// do not open are kept as unreadable (their requests fail) and
    /// returned as (label, key id).
    async fn reload(&self) -> Result<Vec<(String, String)>, VaultError> {
        let Some(db) = &self.inner.db else { return Ok(Vec::new()) };
        let _one_at_a_time = self.inner.reloading.lock().await;
        let (version, rows) = db.load_credentials().await.inspect_err(|_| self.inner.metrics.db_up.set(0))?;
        self.inner.metrics.db_up.set(1);
        let mut entries = HashMap::with_capacity(rows.len());
        let mut grants = HashMap::new();
        let mut unreadable = Vec::new();
        for row in &rows {
            let label = label(&row.tenant, &row.user_id, &row.upstream);
            let entry = match self.open(row) {
                Ok((credential, grant)) => {
                    let credential = Arc::new(credential);
                    if let Some(particulars) = grant {
                        let grant = Grant {
                            tenant: row.tenant.clone(),
                            user: row.user_id.clone(),
                            upstream: row.upstream.clone(),
                            particulars: Arc::new(particulars),
                            sealed: row.sealed.clone(),
                            credential: credential.clone(),
                        };
                        grants.insert(entry_key(&row.tenant, &row.user_id, &row.upstream), grant);
                    }
                    Entry::Ready(credential)
                }
                Err(why) => {
                    tracing::error!(credential = %label, "{why}");
                    unreadable.push((label.clone(), row.key_id.clone()));
                    Entry::Unreadable
                }
            };
            entries.insert(entry_key(&row.tenant, &row.user_id, &row.upstream), entry);
        }
        let metrics = &self.inner.metrics;
        metrics.credentials.set((rows.len() - unreadable.len()) as i64);
        metrics.unreadable.set(unreadable.len() as i64);
        if !unreadable.is_empty() {
            tracing::error!(
                count = unreadable.len(),
                first = %unreadable[0].0,
                "vault credentials that this replica's keys cannot open; their requests fail until the key that sealed them is configured"
            );
        }
        self.inner.snapshot.store(Arc::new(Snapshot { loaded: true, version, entries, grants }));
        Ok(unreadable)
    }

    /// The refusal of [`Vault::load`], in words.
    fn explain(&self, unreadable: &[(String, String)]) -> String {
        let mut sealed_with: Vec<&str> = unreadable.iter().map(|(_, id)| id.as_str()).collect();
        sealed_with.sort_unstable();
        sealed_with.dedup();
        let first = &unreadable[0].0;
        match &self.inner.keyring {
            None => format!(
                "the vault holds {} credentials (the first {first}) and no vault key is configured: set vault.key or vault.key_file to the key that sealed them (key id {})",
                unreadable.len(),
                sealed_with.join(", ")
            ),
            Some(keyring) => {
                let known: Vec<&str> = keyring.ids();
                let foreign: Vec<&str> = sealed_with.iter().copied().filter(|id| !known.contains(id)).collect();
                if foreign.is_empty() {
                    format!(
                        "{} vault credentials (the first {first}) do not open with the key that sealed them (key id {}): they were altered or corrupted in the database; set them again",
                        unreadable.len(),
                        sealed_with.join(", ")
                    )
                } else {
                    format!(
                        "{} vault credentials (the first {first}) were sealed with key id {}, which is not configured (configured: {}): this is the wrong vault key; configure the key that sealed them as vault.key, or among vault.previous_keys until `switchboard vault rotate` reseals them",
                        unreadable.len(),
                        foreign.join(", "),
                        known.join(", ")
                    )
                }
            }
        }
    }

    /// Opens one record: its credential, and its grant's particulars if
    /// it is an OAuth grant.
    fn open(&self, row: &CredentialRow) -> Result<(Credential, Option<serde_json::Value>), String> {
        let whose = label(&row.tenant, &row.user_id, &row.upstream);
        let Some(keyring) = &self.inner.keyring else {
            return Err(format!("the credential {whose} cannot be read: no vault key is configured on this replica"));
        };
        let Some(key) = keyring.get(&row.key_id) else {
            return Err(format!(
                "the credential {whose} cannot be read: it was sealed with vault key id {}, which this replica does not have",
                row.key_id
            ));
        };
        let plain = key.open(aad(row).as_bytes(), &row.sealed).ok_or_else(|| {
            format!("the credential {whose} does not open with its key: altered or corrupted; set it again")
        })?;
        let secret: Secret = serde_json::from_slice(&plain)
            .map_err(|_| format!("the credential {whose} holds no headers; set it again"))?;
        let mut headers = Vec::with_capacity(secret.headers.len());
        for (name, value) in &secret.headers {
            headers.push(
                switchboard_core::credential::header(name, value)
                    .map_err(|problem| format!("the credential {whose}: {problem}; set it again"))?,
            );
        }
        Ok((Credential::new(whose, headers), secret.grant))
    }

    /// Keeps the snapshot current: reloads on every vault notification
    /// (PostgreSQL) and whenever the vault's version moved (polled every
    /// `refresh`).
    pub fn start(&self, refresh: Duration) {
        let Some(db) = self.inner.db.clone() else { return };
        let vault: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut wakeups = db.wakeups(VAULT_CHANNEL, refresh);
            let mut healthy = true;
            loop {
                let by_notification = wakeups.next().await;
                let Some(inner) = vault.upgrade() else { return };
                let vault = Vault { inner };
                let current = vault.inner.snapshot.load().version;
                let outcome = match by_notification {
                    true => vault.reload().await.map(drop),
                    false => match db.vault_version().await {
                        Ok(v) if v != current => vault.reload().await.map(drop),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e.into()),
                    },
                };
                match outcome {
                    Ok(()) => {
                        if !healthy {
                            tracing::info!("vault: database reachable again");
                        }
                        healthy = true;
                        vault.inner.metrics.db_up.set(1);
                    }
                    Err(e) => {
                        if healthy {
                            tracing::warn!(error = %e, "vault: cannot reach the database; using the credentials last loaded");
                        }
                        healthy = false;
                        vault.inner.metrics.db_up.set(0);
                    }
                }
            }
        });
    }

    fn db(&self) -> Result<&Database, VaultError> {
        self.inner.db.as_ref().ok_or(VaultError::NoDatabase)
    }

    /// Stores a credential (replacing the one of the same tenant, user
    /// and upstream), and reloads this replica's snapshot at once. The
    /// caller checks that the tenant and upstream exist.
    pub async fn put(&self, new: NewCredential, now_ms: i64) -> Result<CredentialRow, VaultError> {
        Ok(self.store(new, None, None, now_ms).await?.expect("stored without a compare-and-set"))
    }

    /// Stores a credential (an OAuth grant's, with its `grant`
    /// particulars); with `replacing`, only if that sealed record is still
    /// the one stored (`Ok(None)` if not). Reloads this replica's snapshot.
    async fn store(
        &self,
        new: NewCredential,
        grant: Option<serde_json::Value>,
        replacing: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<CredentialRow>, VaultError> {
        let db = self.db()?;
        let keyring = self.inner.keyring.as_ref().ok_or(VaultError::NoKey)?;
        let user = new.user.clone().unwrap_or_default();
        if new.user.as_deref() == Some("") || user.len() > MAX_USER_LEN || user.contains('\0') {
            return Err(VaultError::Invalid(format!(
                "a user is 1 to {MAX_USER_LEN} characters, without NUL (omit it for the tenant's own credential)"
            )));
        }
        if new.tenant.contains('\0') || new.upstream.contains('\0') {
            return Err(VaultError::Invalid("names may not contain NUL".into()));
        }
        if new.headers.is_empty() || new.headers.len() > MAX_HEADERS {
            return Err(VaultError::Invalid(format!("a credential is 1 to {MAX_HEADERS} headers")));
        }
        let size: usize = new.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        if size > MAX_CREDENTIAL_BYTES {
            return Err(VaultError::Invalid(format!("its headers are {size} bytes; at most {MAX_CREDENTIAL_BYTES}")));
        }
        let mut names = Vec::with_capacity(new.headers.len());
        let mut headers = Vec::with_capacity(new.headers.len());
        for (name, value) in &new.headers {
            let (name, value) = switchboard_core::credential::header(name, value).map_err(VaultError::Invalid)?;
            if names.contains(&name) {
                return Err(VaultError::Invalid(format!("header {name} is given twice")));
            }
            headers.push((name.as_str().to_owned(), value.to_str().unwrap_or_default().to_owned()));
            names.push(name);
        }
        if replacing.is_none() {
            let existing = db.credentials(Some(&new.tenant)).await?;
            let replaces = existing.iter().any(|r| r.user_id == user && r.upstream == new.upstream);
            if !replaces && existing.len() as u64 >= u64::from(self.inner.max_per_tenant) {
                return Err(VaultError::TooMany { tenant: new.tenant, max: self.inner.max_per_tenant });
            }
        }
        let mut row = CredentialRow {
            tenant: new.tenant,
            user_id: user,
            upstream: new.upstream,
            kind: if grant.is_some() { "oauth" } else { "headers" }.into(),
            key_id: keyring.current().id().to_owned(),
            sealed: String::new(),
            names: names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(","),
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        };
        let plain = serde_json::to_vec(&Secret { headers, grant }).expect("serializable");
        row.sealed = keyring.current().seal(aad(&row).as_bytes(), &plain);
        let stored = match replacing {
            None => {
                db.put_credential(&row).await?;
                true
            }
            Some(was) => db.reseal_credentials(&[(row.clone(), was.to_owned())]).await? == 1,
        };
        if let Err(e) = self.reload().await {
            tracing::warn!(error = %e, "vault: stored a credential but could not reload; the next refresh will");
        }
        Ok(stored.then_some(row))
    }

    /// Stores the OAuth grant of `user` of `tenant` (`None`: the tenant's
    /// own) for `upstream`: its access token, sent as `Authorization:
    /// Bearer`, and `particulars`, which renew it. With `replacing` (the
    /// sealed record a renewal read), only if that record is still the one
    /// stored: `Ok(None)` when another replica replaced it first. The new
    /// sealed record, for the next compare-and-set.
    pub async fn put_grant(
        &self,
        new: NewCredential,
        particulars: serde_json::Value,
        replacing: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<String>, VaultError> {
        Ok(self.store(new, Some(particulars), replacing, now_ms).await?.map(|row| row.sealed))
    }

    /// The OAuth grant stored for exactly `user` of `tenant` (`None`: the
    /// tenant's own) and `upstream`, as this replica last loaded it.
    pub fn grant(&self, tenant: &str, user: Option<&str>, upstream: &str) -> Option<Grant> {
        self.inner.snapshot.load().grants.get(&entry_key(tenant, user.unwrap_or(""), upstream)).cloned()
    }

    /// Every OAuth grant, as this replica last loaded them.
    pub fn grants(&self) -> Vec<Grant> {
        self.inner.snapshot.load().grants.values().cloned().collect()
    }

    /// Seals `plain` (an authorization in progress) under the current
    /// vault key, as URL-safe text any replica with the key opens; `None`
    /// without a key.
    pub fn seal_state(&self, plain: &[u8]) -> Option<String> {
        let key = self.inner.keyring.as_ref()?.current();
        let sealed = key.seal(STATE_AAD, plain);
        // URL-safe: nothing in it a query needs to escape.
        let safe: String = sealed
            .chars()
            .filter(|&c| c != '=')
            .map(|c| {
                if c == '+' {
                    '-'
                } else if c == '/' {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        Some(format!("{}.{safe}", key.id()))
    }

    /// Seals a registered upstream's headers under the current vault key,
    /// bound to its name: `(key id, sealed)`.
    pub fn seal_upstream_headers(
        &self,
        upstream: &str,
        headers: &[(String, String)],
    ) -> Result<(String, String), VaultError> {
        let keyring = self.inner.keyring.as_ref().ok_or(VaultError::NoKey)?;
        let plain = serde_json::to_vec(headers).expect("serializable");
        let key = keyring.current();
        Ok((key.id().to_owned(), key.seal(upstream_aad(upstream).as_bytes(), &plain)))
    }

    /// Opens what [`Vault::seal_upstream_headers`] sealed (with any
    /// configured key): `None` if no key opens it (unknown key, or altered).
    pub fn open_upstream_headers(&self, upstream: &str, key_id: &str, sealed: &str) -> Option<Vec<(String, String)>> {
        let key = self.inner.keyring.as_ref()?.get(key_id)?;
        let plain = key.open(upstream_aad(upstream).as_bytes(), sealed)?;
        serde_json::from_slice(&plain).ok()
    }

    /// Opens what [`Vault::seal_state`] sealed (with any configured key).
    pub fn open_state(&self, sealed: &str) -> Option<Vec<u8>> {
        let (id, safe) = sealed.split_once('.')?;
        let mut sealed: String = safe
            .chars()
            .map(|c| {
                if c == '-' {
                    '+'
                } else if c == '_' {
                    '/'
                } else {
                    c
                }
            })
            .collect();
        while !sealed.len().is_multiple_of(4) {
            sealed.push('=');
        }
        self.inner.keyring.as_ref()?.get(id)?.open(STATE_AAD, &sealed)
    }

    /// Deletes the credential of `user` of `tenant` (`None`: the tenant's
    /// own) for `upstream`.
    pub async fn delete(&self, tenant: &str, user: Option<&str>, upstream: &str) -> Result<(), VaultError> {
        self.db()?.delete_credential(tenant, user.unwrap_or(""), upstream).await?;
        if let Err(e) = self.reload().await {
            tracing::warn!(error = %e, "vault: deleted a credential but could not reload; the next refresh will");
        }
        Ok(())
    }

    /// Reloads this replica's snapshot now (after a change made outside
    /// the vault, such as a tenant deleted with its credentials).
    pub async fn refresh(&self) -> Result<(), VaultError> {
        self.reload().await.map(drop)
    }

    /// What is stored for `tenant` (every tenant with `None`): names,
    /// header names, key ids and times; never a value.
    pub async fn list(&self, tenant: Option<&str>) -> Result<Vec<CredentialRow>, VaultError> {
        Ok(self.db()?.credentials(tenant).await?)
    }

    /// Reseals every credential not sealed with the current key (step 3 of
    /// a key rotation, docs/operations.md). Refuses, changing nothing, if
    /// any credential cannot be opened with the configured keys.
    pub async fn rotate(&self) -> Result<Rotation, VaultError> {
        let db = self.db()?;
        let keyring = self.inner.keyring.as_ref().ok_or(VaultError::NoKey)?;
        let rows = db.credentials(None).await?;
        let mut resealed = Vec::new();
        let mut unreadable = Vec::new();
        let mut current = 0;
        for row in rows {
            if row.key_id == keyring.current().id() {
                current += 1;
                continue;
            }
            let plain = keyring
                .get(&row.key_id)
                .and_then(|key| key.open(aad(&row).as_bytes(), &row.sealed))
                .ok_or_else(|| (label(&row.tenant, &row.user_id, &row.upstream), row.key_id.clone()));
            match plain {
                Ok(plain) => {
                    let was = row.sealed.clone();
                    let mut row = row;
                    row.key_id = keyring.current().id().to_owned();
                    row.sealed = keyring.current().seal(aad(&row).as_bytes(), &plain);
                    resealed.push((row, was));
                }
                Err(which) => unreadable.push(which),
            }
        }
        if !unreadable.is_empty() {
            return Err(VaultError::Unreadable(self.explain(&unreadable)));
        }
        let mut done = 0;
        for batch in resealed.chunks(500) {
            done += db.reseal_credentials(batch).await?;
        }
        let _ = self.reload().await;
        tracing::info!(
            resealed = done,
            key_id = keyring.current().id(),
            "vault credentials resealed with the current key"
        );
        Ok(Rotation { resealed: done, current })
    }
}

impl Vault {
    /// What a request of `user` of `tenant` to `upstream` carries now (as
    /// [`Keychain::credentials`]' `current`), without building anything
    /// when the vault holds no credential and none is required.
    pub fn current(
        &self,
        tenant: &str,
        user: Option<&str>,
        upstream: &str,
        required: bool,
    ) -> Result<Option<Arc<Credential>>, Missing> {
        let snapshot = self.inner.snapshot.load();
        if snapshot.loaded && snapshot.entries.is_empty() && !required {
            return Ok(None);
        }
        self.credentials(tenant, user, upstream, required).current()
    }
}

impl Keychain for Vault {
    fn credentials(&self, tenant: &str, user: Option<&str>, upstream: &str, required: bool) -> Arc<dyn Credentials> {
        Arc::new(Bound {
            inner: self.inner.clone(),
            user_key: user.map(|u| entry_key(tenant, u, upstream)),
            tenant_key: entry_key(tenant, "", upstream),
            required,
            tenant: tenant.into(),
            user: user.map(Box::from),
            upstream: upstream.into(),
        })
    }
}

/// The credentials of one caller for one upstream, looked up in the
/// current snapshot on every request.
struct Bound {
    inner: Arc<Inner>,
    user_key: Option<Box<str>>,
    tenant_key: Box<str>,
    required: bool,
    tenant: Box<str>,
    user: Option<Box<str>>,
    upstream: Box<str>,
}

impl Credentials for Bound {
    fn current(&self) -> Result<Option<Arc<Credential>>, Missing> {
        let snapshot = self.inner.snapshot.load();
        if !snapshot.loaded {
            // The caller may well have a credential: never the upstream's
            // own headers in its place.
            self.inner.metrics.refused(&self.upstream, "not_loaded");
            return Err(Missing(format!(
                "the router has not loaded its credentials for upstream {:?} yet (its database has not answered since it started); retry shortly",
                self.upstream
            )));
        }
        if snapshot.entries.is_empty() && !self.required {
            return Ok(None);
        }
        for key in self.user_key.iter().chain(std::iter::once(&self.tenant_key)) {
            match snapshot.entries.get(key) {
                Some(Entry::Ready(credential)) => return Ok(Some(credential.clone())),
                Some(Entry::Unreadable) => {
                    self.inner.metrics.refused(&self.upstream, "unreadable");
                    return Err(Missing(format!(
                        "the credential for upstream {:?} cannot be read by this router (an operator must check its vault key; its log says why)",
                        self.upstream
                    )));
                }
                None => {}
            }
        }
        if !self.required {
            return Ok(None);
        }
        self.inner.metrics.refused(&self.upstream, "missing");
        let (tenant, upstream) = (&self.tenant, &self.upstream);
        Err(Missing(match &self.user {
            Some(user) => format!(
                "upstream {upstream:?} needs a credential of user {user:?} (or of tenant {tenant:?}) and none is stored: an operator adds it with `switchboard credentials set --tenant {tenant} --user {user} --upstream {upstream} --header \"Authorization: Bearer …\"` (or PUT /admin/credentials)"
            ),
            None => format!(
                "upstream {upstream:?} needs a credential of tenant {tenant:?} and none is stored: an operator adds it with `switchboard credentials set --tenant {tenant} --upstream {upstream} --header \"Authorization: Bearer …\"` (or PUT /admin/credentials)"
            ),
        }))
    }
}

/// A credential's place in the snapshot.
fn entry_key(tenant: &str, user: &str, upstream: &str) -> Box<str> {
    format!("{tenant}\0{user}\0{upstream}").into()
}

/// What a sealed value is bound to: its record's identity.
/// What a registered upstream's sealed headers are bound to.
fn upstream_aad(upstream: &str) -> String {
    format!("upstream-headers\u{0}{upstream}")
}

fn aad(row: &CredentialRow) -> String {
    format!("switchboard-credential\0{}\0{}\0{}\0{}", row.tenant, row.user_id, row.upstream, row.kind)
}

/// A credential's name in logs and errors: `tenant/user/upstream`, `-` for
/// the tenant's own.
fn label(tenant: &str, user: &str, upstream: &str) -> String {
    format!("{tenant}/{}/{upstream}", if user.is_empty() { "-" } else { user })
}

/// The vault's metrics.
struct Metrics {
    credentials: IntGauge,
    unreadable: IntGauge,
    db_up: IntGauge,
    refused: IntCounterVec,
}

impl Metrics {
    fn new(registry: &Registry) -> Metrics {
        let db_up = gauge(
            registry,
            "switchboard_vault_db_up",
            "1 if the last refresh of the vault reached the database, else 0.",
        );
        Metrics {
            credentials: gauge(registry, "switchboard_vault_credentials", "Credentials in the vault this replica can open."),
            unreadable: gauge(
                registry,
                "switchboard_vault_unreadable",
                "Credentials in the vault this replica cannot open (sealed with a key it does not have, or altered).",
            ),
            db_up,
            refused: counter_vec(
                registry,
                "switchboard_vault_refused_total",
                "Requests to upstreams not sent for want of a credential, by upstream and reason (missing, unreadable, not_loaded).",
                &["upstream", "reason"],
            ),
        }
    }

    fn refused(&self, upstream: &str, reason: &str) {
        self.refused.with_label_values(&[upstream, reason]).inc();
    }
}

#[cfg(test)]
mod tests;
