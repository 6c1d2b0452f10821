//! The database: tenants, API keys, the audit log and the vault's sealed
//! credentials (`credentials.rs`), on PostgreSQL or on an
//! embedded SQLite file, through sqlx's `Any` driver with one set of queries
//! (the audit writer's inserts on drivers of their own: `audit_writer.rs`).
//!
//! The schema lives in `migrations/postgres` and `migrations/sqlite` (the same
//! tables; only the auto-increment column differs). Every change to tenants or
//! keys bumps `config_version` in the same transaction, and on PostgreSQL also
//! sends `NOTIFY switchboard_changes`; replicas watch for either and reload
//! their in-memory copy ([`crate::tenancy`]). This module must never be called
//! per request: the request path reads that copy only.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::{Arc, Once};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use tokio::sync::mpsc;

/// The channel PostgreSQL replicas listen on.
pub const CHANGES_CHANNEL: &str = "switchboard_changes";

mod audit_pg;
mod audit_writer;
mod credentials;
mod pins;
mod upstreams;
pub mod usage;
pub use audit_writer::{AuditWriter, Pace};
pub use credentials::{CredentialRow, VAULT_CHANNEL};
pub use pins::{NewPin, PinDigests, PinRow, PINS_CHANNEL};
pub use upstreams::{UpstreamRow, UPSTREAMS_CHANNEL};

static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");
static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// What can go wrong with the database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("sqlite: {0}")]
    Sqlite(String),
    /// The database refused what was written (a check, a type, a size), not
    /// the writing: the same rows would be refused again.
    #[error("refused by the database: {0}")]
    Refused(String),
    #[error("unsupported database URL {0:?}: use postgres://… or sqlite:…")]
    Url(String),
    #[error("stored policy of tenant {tenant:?} is not valid JSON: {error}")]
    Policy { tenant: String, error: String },
}

impl DbError {
    /// Whether the database refused the rows it was given for what they
    /// hold (PostgreSQL's SQLSTATE classes 22, data exception, 23, integrity
    /// constraint violation, and 54, a value too large for an index; SQLite's
    /// TOOBIG, CONSTRAINT and MISMATCH), rather than failing to write: the
    /// same rows would be refused again however often they were retried.
    pub fn refuses_content(&self) -> bool {
        match self {
            DbError::Refused(_) => true,
            DbError::Database(sqlx::Error::Database(e)) => match e.code() {
                Some(code) if e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() => {
                    matches!(code.get(..2), Some("22" | "23" | "54"))
                }
                Some(code) if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
                    code.parse().is_ok_and(sqlite_refuses_content)
                }
                _ => false,
            },
            _ => false,
        }
    }
}

/// Whether an SQLite result code (primary or extended) says the database
/// refused a row for what it holds: TOOBIG (18), CONSTRAINT (19), MISMATCH (20).
fn sqlite_refuses_content(code: i32) -> bool {
    matches!(code & 0xff, 18..=20)
}

/// Which server a [`Database`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A tenant row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TenantRow {
    pub name: String,
    pub policy: switchboard_core::policy::Policy,
    pub created_at_ms: i64,
}

/// An API key row: never the key, only its hash and visible prefix.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyRow {
    pub prefix: String,
    #[serde(skip_serializing)]
    pub hash: String,
    pub tenant: String,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
}

/// One audit record.
///
/// Made on the request path and written on the audit writer's thread: the
/// names it shares with the request (tenant, key prefix, session, upstream,
/// user) are the request's own `Arc`s, and the method and outcome the
/// router's constant names where it has one, so that a record costs few
/// allocations, each freed on another thread.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditRecord {
    /// Unique (64 random bits fixed per process, then a counter; hex). A
    /// request's record is queued with none (`""`) and given one as it
    /// leaves the audit queue.
    pub id: String,
    pub at_ms: i64,
    pub tenant: Option<Arc<str>>,
    pub key_prefix: Option<Arc<str>>,
    pub session: Option<Arc<str>>,
    pub method: Cow<'static, str>,
    /// The tool, prompt or resource, as the client named it.
    pub target: Option<String>,
    pub upstream: Option<Arc<str>>,
    pub outcome: Cow<'static, str>,
    pub error_code: Option<i64>,
    pub latency_us: i64,
    pub request_bytes: i64,
    pub response_bytes: i64,
    pub trace_id: Option<String>,
    /// The call's arguments, only for tenants that opted in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// The user an OAuth access token named (`None` for an API key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<Arc<str>>,
}

/// A filter for reading the audit log back.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub tenant: Option<String>,
    pub since_ms: Option<i64>,
    /// Only records inserted after this sequence number (for `tail`).
    pub after_seq: Option<i64>,
    pub limit: i64,
}

/// A connection pool to the configured database.
#[derive(Clone)]
pub struct Database {
    pool: AnyPool,
    /// PostgreSQL's own driver, for the audit writer's inserts (the `Any`
    /// driver cannot bind arrays, and converts every value it binds).
    pg: Option<sqlx::PgPool>,
    backend: Backend,
    url: String,
    acquire_timeout: Duration,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("backend", &self.backend).finish_non_exhaustive()
    }
}

/// The sizes of the audit inserts a batch is cut into, largest first.
const AUDIT_CHUNKS: [usize; 4] = [128, 32, 8, 1];

/// The insert of `rows` audit records (one of [`AUDIT_CHUNKS`]), made once.
fn audit_insert(backend: Backend, rows: usize) -> &'static str {
    static MADE: std::sync::OnceLock<[[String; 4]; 2]> = std::sync::OnceLock::new();
    let made = MADE.get_or_init(|| {
        [Backend::Postgres, Backend::Sqlite].map(|backend| AUDIT_CHUNKS.map(|rows| audit_values_insert(backend, rows)))
    });
    let chunk = AUDIT_CHUNKS.iter().position(|&n| n == rows).expect("one of the chunk sizes");
    &made[usize::from(backend == Backend::Sqlite)][chunk]
}

/// An insert of `rows` audit records, each row's values as placeholders in
/// [`AUDIT_COLUMNS`]' order; an id already present is skipped.
fn audit_values_insert(backend: Backend, rows: usize) -> String {
    let mut q = Sql::new(backend, &format!("INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES "));
    for i in 0..rows {
        q.text.push_str(if i == 0 { "(" } else { ", (" });
        for j in 0..AUDIT_COLUMN_COUNT {
            if j > 0 {
                q.text.push_str(", ");
            }
            q.param(Param::Int(None));
        }
        q.text.push(')');
    }
    q.text.push_str(" ON CONFLICT (id) DO NOTHING");
    q.text
}

/// How many columns [`AUDIT_COLUMNS`] names.
const AUDIT_COLUMN_COUNT: usize = 16;

pub(crate) const AUDIT_COLUMNS: &str =
    "id, at_ms, tenant, key_prefix, session, method, target, upstream, outcome, error_code, \
                             latency_us, request_bytes, response_bytes, trace_id, arguments, user_id";

impl Database {
    /// Connects (lazily: the pool opens connections when first used, so a
    /// router can start while its database is down). A SQLite file is
    /// created if missing.
    pub fn connect(url: &str, acquire_timeout: Duration) -> Result<Database, DbError> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            return Err(DbError::Url(url.to_owned()));
        };
        let mut url = url.to_owned();
        if backend == Backend::Sqlite && !url.contains("mode=") && !url.contains(":memory:") {
            url.push_str(if url.contains('?') { "&mode=rwc" } else { "?mode=rwc" });
        }
        let options = sqlx::any::AnyConnectOptions::from_str(&url)?;
        let mut pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 4 } else { 8 })
            .acquire_timeout(acquire_timeout);
        if backend == Backend::Sqlite {
            // What SQLite would put in temporary files (a statement's
            // journal past 64 KiB, a sort, an index being built) is kept in
            // memory: a router on a read-only root file system (as the
            // Kubernetes manifests run it) has no temporary directory, and
            // there every audit batch of some size failed, through the pool
            // and through the audit writer's connection ("disk I/O error").
            pool = pool.after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::Executor::execute(conn, "PRAGMA temp_store = MEMORY").await?;
                    Ok(())
                })
            });
        }
        let pool = pool.connect_lazy_with(options);
        let pg = match backend {
            Backend::Postgres => Some(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(acquire_timeout)
                    .connect_lazy_with(sqlx::postgres::PgConnectOptions::from_str(&url)?),
            ),
            Backend::Sqlite => None,
        };
        Ok(Database { pool, pg, backend, url, acquire_timeout })
    }

    /// The same database through a pool of its own, for a component that
    /// runs on a runtime of its own (a pool's connections belong to the
    /// runtime that opened them). Must be called inside that runtime.
    pub fn separate_pool(&self) -> Result<Database, DbError> {
        Database::connect(&self.url, self.acquire_timeout)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Applies the migrations not yet applied (idempotent).
    pub async fn migrate(&self) -> Result<(), DbError> {
        match self.backend {
            Backend::Postgres => POSTGRES.run(&self.pool).await?,
            Backend::Sqlite => {
                // WAL lets the router's audit writer and the CLI share the file.
                sqlx::query("PRAGMA journal_mode = WAL").execute(&self.pool).await?;
                SQLITE.run(&self.pool).await?
            }
        }
        Ok(())
    }

    /// The number bumped by every change to tenants or keys.
    pub async fn version(&self) -> Result<i64, DbError> {
        let row = sqlx::query("SELECT version FROM config_version WHERE id = 1").fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Every tenant and every key that is not revoked.
    pub async fn load(&self) -> Result<(i64, Vec<TenantRow>, Vec<KeyRow>), DbError> {
        // Read the version first: a change racing with the load bumps it
        // again, and the next poll reloads.
        let version = self.version().await?;
        let tenants = self.tenants().await?;
        let keys = self.keys(None, false).await?;
        Ok((version, tenants, keys))
    }

    pub async fn tenants(&self) -> Result<Vec<TenantRow>, DbError> {
        let rows =
            sqlx::query("SELECT name, policy, created_at_ms FROM tenants ORDER BY name").fetch_all(&self.pool).await?;
        rows.iter().map(tenant_row).collect()
    }

    pub async fn create_tenant(&self, tenant: &TenantRow) -> Result<(), DbError> {
        let policy = serde_json::to_string(&tenant.policy).expect("serializable");
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO tenants (name, policy, created_at_ms) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
        )
        .bind(&tenant.name)
        .bind(policy)
        .bind(tenant.created_at_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(DbError::Exists(format!("tenant {:?}", tenant.name)));
        }
        self.bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replaces a tenant's policy.
    pub async fn update_tenant(&self, name: &str, policy: &switchboard_core::policy::Policy) -> Result<(), DbError> {
        let policy = serde_json::to_string(policy).expect("serializable");
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("UPDATE tenants SET policy = $1 WHERE name = $2")
            .bind(policy)
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 0 {
            return Err(DbError::NotFound(format!("tenant {name:?}")));
        }
        self.bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes a tenant, its keys and its credentials (audit records stay).
    pub async fn delete_tenant(&self, name: &str) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM api_keys WHERE tenant = $1").bind(name).execute(&mut *tx).await?;
        let n = sqlx::query("DELETE FROM tenants WHERE name = $1").bind(name).execute(&mut *tx).await?.rows_affected();
        if n == 0 {
            return Err(DbError::NotFound(format!("tenant {name:?}")));
        }
        // Its credentials (its users' too) go with it: a tenant created
        // later under the name inherits none.
        let gone = sqlx::query("DELETE FROM credentials WHERE tenant = $1").bind(name).execute(&mut *tx).await?;
        if gone.rows_affected() > 0 {
            self.bump_vault(&mut tx).await?;
        }
        // And its pinned tool definitions: a tenant created later under
        // the name approves its tools afresh.
        let unpinned = sqlx::query("DELETE FROM tool_pins WHERE tenant = $1").bind(name).execute(&mut *tx).await?;
        if unpinned.rows_affected() > 0 {
            self.bump_pins(&mut tx).await?;
        }
        self.bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Stores a key. The caller checks that its tenant exists (in the
    /// database or the config file).
    pub async fn create_key(&self, key: &KeyRow) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO api_keys (prefix, hash, tenant, created_at_ms, expires_at_ms, revoked_at_ms) \
             VALUES ($1, $2, $3, $4, $5, NULL)",
        )
        .bind(&key.prefix)
        .bind(&key.hash)
        .bind(&key.tenant)
        .bind(key.created_at_ms)
        .bind(key.expires_at_ms)
        .execute(&mut *tx)
        .await?;
        self.bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Keys, of one tenant or all, with or without the revoked ones.
    pub async fn keys(&self, tenant: Option<&str>, with_revoked: bool) -> Result<Vec<KeyRow>, DbError> {
        let mut q = Sql::new(
            self.backend,
            "SELECT prefix, hash, tenant, created_at_ms, expires_at_ms, revoked_at_ms FROM api_keys WHERE 1 = 1",
        );
        if let Some(t) = tenant {
            q.and("tenant =", Param::Text(Some(t.to_owned())));
        }
        if !with_revoked {
            q.text.push_str(" AND revoked_at_ms IS NULL");
        }
        q.text.push_str(" ORDER BY tenant, created_at_ms, prefix");
        let rows = q.query().fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(KeyRow {
                    prefix: r.try_get(0)?,
                    hash: r.try_get(1)?,
                    tenant: r.try_get(2)?,
                    created_at_ms: r.try_get(3)?,
                    expires_at_ms: r.try_get(4)?,
                    revoked_at_ms: r.try_get(5)?,
                })
            })
            .collect()
    }

    /// Revokes a key by its prefix; `NotFound` if there is no such live key.
    pub async fn revoke_key(&self, prefix: &str, now_ms: i64) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("UPDATE api_keys SET revoked_at_ms = $1 WHERE prefix = $2 AND revoked_at_ms IS NULL")
            .bind(now_ms)
            .bind(prefix)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n == 0 {
            return Err(DbError::NotFound(format!("live key {prefix:?}")));
        }
        self.bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn bump(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), DbError> {
        sqlx::query("UPDATE config_version SET version = version + 1 WHERE id = 1").execute(&mut **tx).await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, '')").bind(CHANGES_CHANNEL).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Writes audit records: on PostgreSQL in COPYs ([`audit_pg`]), on
    /// SQLite in multi-row inserts, in one transaction. Records already
    /// present (same id) are skipped, so a batch may be written again safely.
    pub async fn insert_audit(&self, records: &[AuditRecord]) -> Result<u64, DbError> {
        self.insert_audit_paced(records, Pace::Paced).await
    }

    /// [`insert_audit`](Self::insert_audit), on PostgreSQL at `pace`.
    pub async fn insert_audit_paced(&self, records: &[AuditRecord], pace: Pace) -> Result<u64, DbError> {
        if records.is_empty() {
            return Ok(0);
        }
        if let Some(pg) = &self.pg {
            return Ok(audit_pg::write(&mut *pg.acquire().await?, records, pace).await?);
        }
        // In statements of a few fixed sizes, so that each is prepared once
        // per connection and kept (a statement per batch size would be
        // parsed anew for nearly every batch), in one transaction (one commit).
        let mut plan = Vec::new();
        let mut left = records.len();
        while left > 0 {
            let rows = *AUDIT_CHUNKS.iter().find(|&&n| n <= left).expect("the last chunk is one row");
            plan.push(rows);
            left -= rows;
        }
        let mut written = 0;
        let mut at = 0;
        if let [rows] = plan[..] {
            return Ok(self.insert_audit_rows(&records[..rows], &self.pool).await?);
        }
        let mut tx = self.pool.begin().await?;
        for rows in plan {
            written += self.insert_audit_rows(&records[at..at + rows], &mut *tx).await?;
            at += rows;
        }
        tx.commit().await?;
        Ok(written)
    }

    /// One insert of `rows` (as many as one of [`AUDIT_CHUNKS`]), its values
    /// bound as they are (nothing copied).
    async fn insert_audit_rows<'e, E>(&self, rows: &[AuditRecord], executor: E) -> Result<u64, sqlx::Error>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        let statement = audit_insert(self.backend, rows.len());
        let mut q = sqlx::query(statement);
        for r in rows {
            q = q
                .bind(r.id.as_str())
                .bind(r.at_ms)
                .bind(r.tenant.as_deref())
                .bind(r.key_prefix.as_deref())
                .bind(r.session.as_deref())
                .bind(r.method.as_ref())
                .bind(r.target.as_deref())
                .bind(r.upstream.as_deref())
                .bind(r.outcome.as_ref())
                .bind(r.error_code)
                .bind(r.latency_us)
                .bind(r.request_bytes)
                .bind(r.response_bytes)
                .bind(r.trace_id.as_deref())
                .bind(r.arguments.as_deref())
                .bind(r.user.as_deref());
        }
        Ok(q.execute(executor).await?.rows_affected())
    }

    /// Reads audit records back, oldest first, with their sequence numbers.
    pub async fn query_audit(&self, query: &AuditQuery) -> Result<Vec<(i64, AuditRecord)>, DbError> {
        let mut q = Sql::new(self.backend, &format!("SELECT seq, {AUDIT_COLUMNS} FROM audit_log WHERE 1 = 1"));
        if let Some(t) = &query.tenant {
            q.and("tenant =", Param::Text(Some(t.clone())));
        }
        if let Some(since) = query.since_ms {
            q.and("at_ms >=", Param::Int(Some(since)));
        }
        if let Some(after) = query.after_seq {
            q.and("seq >", Param::Int(Some(after)));
        }
        q.text.push_str(" ORDER BY seq LIMIT ");
        q.param(Param::Int(Some(query.limit.max(1))));
        let rows = q.query().fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((r.try_get::<i64, _>(0)?, audit_row(r)?))).collect()
    }

    /// The sequence number of the newest audit record.
    pub async fn latest_audit_seq(&self) -> Result<Option<i64>, DbError> {
        let row = sqlx::query("SELECT MAX(seq) FROM audit_log").fetch_one(&self.pool).await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }

    /// How many audit records there are (for tests and the benchmark).
    pub async fn count_audit(&self, tenant: Option<&str>) -> Result<i64, DbError> {
        let mut q = Sql::new(self.backend, "SELECT COUNT(*) FROM audit_log WHERE 1 = 1");
        if let Some(t) = tenant {
            q.and("tenant =", Param::Text(Some(t.to_owned())));
        }
        let row = q.query().fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// What wakes a replica to look for changes: a notification on
    /// `channel` ([`CHANGES_CHANNEL`] for tenants and keys,
    /// [`VAULT_CHANNEL`] for credentials; PostgreSQL only), and every
    /// `refresh` in any case.
    pub fn wakeups(&self, channel: &'static str, refresh: Duration) -> Wakeups {
        Wakeups { notified: self.watch(channel), refresh }
    }

    /// On PostgreSQL, a channel that receives `()` on every notification on
    /// `channel`, and also when the listening connection was lost and
    /// restored (changes may have been missed). `None` on SQLite: poll.
    fn watch(&self, channel: &'static str) -> Option<mpsc::Receiver<()>> {
        if self.backend != Backend::Postgres {
            return None;
        }
        let (tx, rx) = mpsc::channel(1);
        let url = self.url.clone();
        tokio::spawn(async move {
            loop {
                let connected = async {
                    let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
                    listener.listen(channel).await?;
                    // Anything may have changed while we were not listening.
                    let _ = tx.try_send(());
                    loop {
                        match listener.try_recv().await? {
                            Some(_) => {}
                            None => tracing::debug!("database change listener reconnecting"),
                        }
                        if tx.is_closed() {
                            return Ok::<(), sqlx::Error>(());
                        }
                        let _ = tx.try_send(());
                    }
                }
                .await;
                if tx.is_closed() {
                    return;
                }
                if let Err(e) = connected {
                    tracing::debug!(error = %e, "database change listener failed; retrying");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Some(rx)
    }
}

/// See [`Database::wakeups`].
pub struct Wakeups {
    notified: Option<mpsc::Receiver<()>>,
    refresh: Duration,
}

impl Wakeups {
    /// Waits for the next: `true` when notified of a change, `false` when
    /// `refresh` passed (check whether something changed).
    pub async fn next(&mut self) -> bool {
        match self.notified.as_mut() {
            Some(rx) => match tokio::time::timeout(self.refresh, rx.recv()).await {
                Ok(Some(())) => true,
                Ok(None) => {
                    // The listener is gone: poll, and never spin.
                    tracing::warn!("database change listener ended; polling every refresh instead");
                    self.notified = None;
                    false
                }
                Err(_) => false,
            },
            None => {
                tokio::time::sleep(self.refresh).await;
                false
            }
        }
    }
}

/// A bound value of a query built at run time.
enum Param {
    Text(Option<String>),
    Int(Option<i64>),
}

/// SQL with `$n` placeholders, which both PostgreSQL and SQLite read
/// (sqlx's query builder writes `?` for the `Any` driver, which PostgreSQL
/// does not).
struct Sql {
    text: String,
    params: Vec<Param>,
    backend: Backend,
}

impl Sql {
    fn new(backend: Backend, text: &str) -> Sql {
        Sql { text: text.to_owned(), params: Vec::new(), backend }
    }

    /// Appends a placeholder: `$n` for PostgreSQL, `?` for SQLite. SQLite
    /// reads `$n` as a *named* parameter and resolves each name by a linear
    /// search, which made a 500-row audit insert (7,500 parameters) 30 times
    /// slower than with positional `?`.
    fn param(&mut self, p: Param) {
        self.params.push(p);
        match self.backend {
            Backend::Postgres => {
                self.text.push('$');
                self.text.push_str(&self.params.len().to_string());
            }
            Backend::Sqlite => self.text.push('?'),
        }
    }

    /// ` AND <condition> $n`.
    fn and(&mut self, condition: &str, p: Param) {
        self.text.push_str(" AND ");
        self.text.push_str(condition);
        self.text.push(' ');
        self.param(p);
    }

    /// The query with its parameters (moved into it, not copied).
    fn query(&mut self) -> sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments<'_>> {
        let params = std::mem::take(&mut self.params);
        let mut q = sqlx::query(&self.text);
        for p in params {
            q = match p {
                Param::Text(t) => q.bind(t),
                Param::Int(i) => q.bind(i),
            };
        }
        q
    }
}

fn tenant_row(r: &AnyRow) -> Result<TenantRow, DbError> {
    let name: String = r.try_get(0)?;
    let policy: String = r.try_get(1)?;
    let policy =
        serde_json::from_str(&policy).map_err(|e| DbError::Policy { tenant: name.clone(), error: e.to_string() })?;
    Ok(TenantRow { name, policy, created_at_ms: r.try_get(2)? })
}

fn audit_row(r: &AnyRow) -> Result<AuditRecord, sqlx::Error> {
    let shared = |i: usize| r.try_get::<Option<String>, _>(i).map(|t| t.map(Arc::from));
    Ok(AuditRecord {
        id: r.try_get(1)?,
        at_ms: r.try_get(2)?,
        tenant: shared(3)?,
        key_prefix: shared(4)?,
        session: shared(5)?,
        method: Cow::Owned(r.try_get(6)?),
        target: r.try_get(7)?,
        upstream: shared(8)?,
        outcome: Cow::Owned(r.try_get(9)?),
        error_code: r.try_get(10)?,
        latency_us: r.try_get(11)?,
        request_bytes: r.try_get(12)?,
        response_bytes: r.try_get(13)?,
        trace_id: r.try_get(14)?,
        arguments: r.try_get(15)?,
        user: shared(16)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` records whose every column differs from the others' (a value
    /// bound to the wrong column is read back wrong), some absent.
    fn records(n: usize, run: &str) -> Vec<AuditRecord> {
        (0..n)
            .map(|i| AuditRecord {
                id: format!("{run}-{i:05}"),
                at_ms: 11 * i as i64,
                tenant: Some("acme".into()),
                key_prefix: (i % 3 != 0).then(|| format!("k{i}").into()),
                session: Some(format!("s{i}").into()),
                method: format!("m{i}").into(),
                target: Some(format!("t{i}")),
                upstream: (i % 4 != 0).then(|| format!("u{i}").into()),
                outcome: format!("o{i}").into(),
                error_code: (i % 7 == 0).then_some(-32603 - i as i64),
                latency_us: 3 * i as i64 + 1,
                request_bytes: 5 * i as i64 + 2,
                response_bytes: 7 * i as i64 + 3,
                trace_id: (i % 2 == 0).then(|| format!("trace{i}")),
                arguments: (i % 5 == 0).then(|| format!("{{\"i\":{i}}}")),
                user: (i % 6 != 0).then(|| format!("user{i}").into()),
            })
            .collect()
    }

    /// Writes through the audit writer's way at once if given (on
    /// PostgreSQL: one COPY a batch), else the pool's, paced (COPYs of 64).
    async fn insert(db: &Database, writer: &mut Option<AuditWriter>, batch: &[AuditRecord]) -> u64 {
        match writer {
            Some(writer) => writer.insert(batch, Pace::AtOnce).await.unwrap(),
            None => db.insert_audit(batch).await.unwrap(),
        }
    }

    /// Every size of batch is written whole, once, each record as it was
    /// (every column read back), in order, in its fixed-size statements;
    /// written again, nothing is duplicated, and a batch of old and new
    /// records writes the new ones, and NUL characters are no obstacle.
    /// Through the pool, or the audit writer's way.
    async fn batches_are_written_exactly_once(db: &Database, mut writer: Option<AuditWriter>) {
        db.migrate().await.unwrap();
        let mut written = Vec::new();
        for (run, n) in [1, 7, 8, 9, 15, 16, 17, 33, 128, 129, 300, 500].into_iter().enumerate() {
            let batch = records(n, &format!("r{run}"));
            assert_eq!(insert(db, &mut writer, &batch).await, n as u64, "a batch of {n}");
            assert_eq!(insert(db, &mut writer, &batch).await, 0, "a batch of {n}, again");
            written.extend(batch);
        }
        let new = records(20, "mixed");
        let mixed: Vec<AuditRecord> =
            written[..20].iter().cloned().zip(new.iter().cloned()).flat_map(|(a, b)| [a, b]).collect();
        assert_eq!(insert(db, &mut writer, &mixed).await, 20, "the new records of a mixed batch");
        written.extend(new);
        // NUL characters a client sent: written (on PostgreSQL, whose text
        // cannot hold them, as U+FFFD), with the records after them.
        let mut nul = records(2, "nul");
        nul[0].target = Some("al\0pha".into());
        nul[0].method = "tools/\0call".into();
        nul[0].user = Some("u\0".into());
        assert_eq!(insert(db, &mut writer, &nul).await, 2, "a batch with NUL characters");
        if db.backend == Backend::Postgres {
            nul[0].target = Some("al\u{FFFD}pha".into());
            nul[0].method = "tools/\u{FFFD}call".into();
            nul[0].user = Some("u\u{FFFD}".into());
        }
        written.extend(nul);
        assert_eq!(db.count_audit(Some("acme")).await.unwrap(), written.len() as i64);
        let back = db.query_audit(&AuditQuery { tenant: None, since_ms: None, after_seq: None, limit: 10_000 }).await;
        let back: Vec<AuditRecord> = back.unwrap().into_iter().map(|(_, r)| r).collect();
        assert_eq!(back.len(), written.len());
        for (back, written) in back.iter().zip(&written) {
            assert_eq!(back, written);
        }
    }

    /// Runs `check` on a new SQLite file, once through the pool and once
    /// through the audit writer's way (a connection of its own).
    async fn on_sqlite(check: impl AsyncFn(&Database, Option<AuditWriter>)) {
        for through_writer in [false, true] {
            let file = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-db-audit-"));
            let db = Database::connect(&format!("sqlite:{}?mode=rwc", file.display()), Duration::from_secs(5)).unwrap();
            let writer = through_writer.then(|| db.audit_writer(Duration::from_secs(5)).unwrap());
            assert_eq!(
                matches!(writer, Some(AuditWriter::Sqlite(_))),
                through_writer,
                "a file has a connection of its own"
            );
            check(&db, writer).await;
            let _ = std::fs::remove_file(file);
        }
    }

    /// Runs `check` on a new PostgreSQL database, once through the pool and
    /// once through the audit writer's way (a pool of its own).
    async fn on_postgres(check: impl AsyncFn(&Database, Option<AuditWriter>)) {
        for through_writer in [false, true] {
            let temp = switchboard_test_support::services::TempDatabase::create().await;
            let db = Database::connect(&temp.url, Duration::from_secs(5)).unwrap();
            let writer = through_writer.then(|| db.audit_writer(Duration::from_secs(5)).unwrap());
            check(&db, writer).await;
            drop(db);
            temp.drop_now().await;
        }
    }

    #[tokio::test]
    async fn audit_batches_on_sqlite() {
        on_sqlite(batches_are_written_exactly_once).await;
    }

    #[tokio::test]
    async fn audit_batches_on_postgres() {
        on_postgres(batches_are_written_exactly_once).await;
    }

    /// A batch with a row the database refuses (a constraint on what it
    /// holds) fails whole, as refused for its content; a table that is not
    /// there fails, but not for the rows' content. Through the pool, or the
    /// audit writer's way; `refuse` and `drop` are the backend's statements.
    async fn refusals_are_told_from_other_failures(db: &Database, mut writer: Option<AuditWriter>) {
        db.migrate().await.unwrap();
        let (refuse, drop) = match db.backend {
            Backend::Postgres => (
                "ALTER TABLE audit_log ADD CONSTRAINT no_poison CHECK (target IS DISTINCT FROM 'poison')",
                "ALTER TABLE audit_log RENAME TO audit_log_gone",
            ),
            Backend::Sqlite => (
                "CREATE TRIGGER no_poison BEFORE INSERT ON audit_log WHEN NEW.target = 'poison' \
                 BEGIN SELECT RAISE(ABORT, 'no poison'); END",
                "ALTER TABLE audit_log RENAME TO audit_log_gone",
            ),
        };
        sqlx::query(refuse).execute(&db.pool).await.unwrap();
        let mut insert = async |batch: &[AuditRecord]| match &mut writer {
            Some(writer) => writer.insert(batch, Pace::AtOnce).await,
            None => db.insert_audit(batch).await,
        };
        for n in [1, 3, 40] {
            let mut batch = records(n, &format!("refused{n}"));
            batch[n / 2].target = Some("poison".into());
            let refused = insert(&batch).await.expect_err("a row is refused");
            assert!(refused.refuses_content(), "{n} rows: {refused}");
        }
        assert_eq!(db.count_audit(None).await.unwrap(), 0, "a refused batch writes nothing");
        assert_eq!(insert(&records(3, "fine")).await.unwrap(), 3, "the way to the database still works");
        sqlx::query(drop).execute(&db.pool).await.unwrap();
        let failed = insert(&records(3, "gone")).await.expect_err("no table");
        assert!(!failed.refuses_content(), "{failed}");
    }

    #[tokio::test]
    async fn refusals_on_sqlite() {
        on_sqlite(refusals_are_told_from_other_failures).await;
    }

    #[tokio::test]
    async fn refusals_on_postgres() {
        on_postgres(refusals_are_told_from_other_failures).await;
    }

    /// Where [`sqlite_needs_no_temporary_directory`] keeps its database: a
    /// directory beside the test binary (in the build's target directory),
    /// or in the home directory when that is under one of the directories
    /// it makes read-only.
    const NO_TEMP_DIR: &str = "SWITCHBOARD_TEST_NO_TEMP_DIR";

    /// The directories [`sqlite_needs_no_temporary_directory`] makes
    /// read-only: every one SQLite would put a temporary file in.
    const TEMPORARY_DIRS: [&str; 3] = ["/tmp", "/var/tmp", "/usr/tmp"];

    /// SQLite, with no writable temporary directory (a read-only root file
    /// system, as the Kubernetes manifests run the router): batches of 500
    /// records of a router's sizes are written, through the audit writer's
    /// connection and through the pool. SQLite spills a statement's journal
    /// to a temporary file once it outgrows 64 KiB, which such batches do
    /// (a file opened and deleted in `/var/tmp` for each batch): with none
    /// to be had, every batch failed with "disk I/O error" and went to the
    /// spool, for good. Runs [`sqlite_in_a_read_only_world`] in a mount
    /// namespace of its own (`unshare`) where `/tmp`, `/var/tmp` and its
    /// working directory are read-only.
    #[test]
    fn sqlite_needs_no_temporary_directory() {
        let exe = std::env::current_exe().unwrap();
        let temporary = |d: &std::path::Path| TEMPORARY_DIRS.iter().any(|t| d.starts_with(t));
        let beside = exe.parent().unwrap().to_path_buf();
        let base = if temporary(&beside) {
            std::env::var_os("HOME").map(std::path::PathBuf::from).filter(|home| !temporary(home)).unwrap_or_else(
                || panic!("the target directory ({}) and HOME are both under a temporary directory", beside.display()),
            )
        } else {
            beside
        };
        let dir = base.join(switchboard_test_support::services::unique("sb-no-temp-"));
        std::fs::create_dir_all(&dir).unwrap();
        let read_only = TEMPORARY_DIRS
            .iter()
            .filter(|d| std::path::Path::new(d).is_dir())
            .map(|d| format!("mount --bind {d} {d} && mount -o remount,bind,ro {d} && "))
            .collect::<String>();
        // Root in a user namespace of its own (`-r`): as any user, where the
        // kernel allows unprivileged namespaces, and as root.
        let out = std::process::Command::new("unshare")
            .args(["-r", "-m", "sh", "-c"])
            .arg(format!("{read_only}cd /tmp && ! touch /tmp/sb-writable 2>/dev/null && exec \"$0\" \"$@\""))
            .arg(&exe)
            .args(["--exact", "tests::sqlite_in_a_read_only_world", "--ignored", "--test-threads", "1"])
            .env(NO_TEMP_DIR, &dir)
            .env_remove("SQLITE_TMPDIR")
            .env_remove("TMPDIR")
            .output()
            .expect("unshare (util-linux) runs");
        let _ = std::fs::remove_dir_all(&dir);
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("1 passed"), "{said}");
    }

    /// Run by [`sqlite_needs_no_temporary_directory`] only.
    #[tokio::test]
    #[ignore = "run by sqlite_needs_no_temporary_directory, in a mount namespace"]
    async fn sqlite_in_a_read_only_world() {
        let dir =
            std::path::PathBuf::from(std::env::var(NO_TEMP_DIR).expect("run by sqlite_needs_no_temporary_directory"));
        for through_writer in [false, true] {
            let file = dir.join(format!("audit-{through_writer}.db"));
            let db = Database::connect(&format!("sqlite:{}", file.display()), Duration::from_secs(5)).unwrap();
            db.migrate().await.unwrap();
            let mut writer = through_writer.then(|| db.audit_writer(Duration::from_secs(5)).unwrap());
            for run in 0..4 {
                // As a router's records are: 32-character ids, sessions and traces.
                let batch: Vec<AuditRecord> = records(500, "")
                    .into_iter()
                    .enumerate()
                    .map(|(i, mut r)| {
                        r.id = format!("{:016x}{:016x}", 0x5b5b_5b5b_u64, run * 1000 + i);
                        r.session = Some(format!("{:032x}", i).into());
                        r.trace_id = Some(format!("{:032x}", i * 7));
                        r
                    })
                    .collect();
                let written = match &mut writer {
                    Some(writer) => writer.insert(&batch, Pace::Paced).await,
                    None => db.insert_audit(&batch).await,
                };
                assert_eq!(written.unwrap(), 500, "batch {run}, through the writer: {through_writer}");
            }
            assert_eq!(db.count_audit(None).await.unwrap(), 2000);
        }
    }

    #[tokio::test]
    async fn the_writer_opens_sqlite_files_itself_only_when_the_url_asks_for_nothing_more() {
        let file = std::env::temp_dir().join("sb-db-never-created.db");
        let way = |url: String| {
            let db = Database::connect(&url, Duration::from_secs(1)).unwrap();
            matches!(db.audit_writer(Duration::from_secs(1)).unwrap(), AuditWriter::Sqlite(_))
        };
        let path = file.display();
        assert!(way(format!("sqlite:{path}")));
        assert!(way(format!("sqlite://{path}?mode=rwc")));
        assert!(way(format!("sqlite:{path}?mode=rw")));
        // Settings only sqlx's connections honour: the pool writes.
        assert!(!way(format!("sqlite:{path}?vfs=unix-dotfile")));
        assert!(!way(format!("sqlite:{path}?mode=ro")));
        assert!(!way(format!("sqlite:{path}?mode=rwc&immutable=1")));
        assert!(!way("sqlite::memory:".to_owned()));
        assert!(!file.exists(), "nothing is opened before the first write");
    }
}
