//! Where the audit writer writes, on its own thread: PostgreSQL through a
//! connection of its own (binary `COPY`s of up to 64 rows, one transaction
//! per batch, or one `COPY` for a batch when the writer is behind:
//! `audit_pg.rs`), or an SQLite file through a connection of its own
//! (rusqlite), prepared inserts of up to 16 rows each in one transaction
//! per batch, offering the CPU to the request threads between them.
//!
//! Why not the pool for PostgreSQL: sqlx's pool pings a connection (a round
//! trip to the server) when it hands it out and again when it is given
//! back, in a task spawned for that; the writer, the only user, took a
//! connection for every batch, and paid two round trips more than the
//! batch's own, the server a wake-up for each.
//!
//! Why not sqlx for SQLite here: sqlx runs each statement on a worker thread
//! of its own, after copying every bound value (twice through its `Any`
//! driver), and that cost per record was most of the writer's (the audit
//! bench: 5.9 µs per record through sqlx against about 2 µs this way). The
//! writer's thread does nothing else, so a blocking call on it holds up no
//! request. Everything else keeps using sqlx.
//!
//! Never called on the request path.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::{AuditRecord, Backend, Database, DbError};

/// The rows one insert carries, largest first: a batch is cut into
/// statements of these sizes (each prepared once per connection and kept).
/// A statement of many rows costs SQLite less per row than one per row: the
/// statement's opening and closing (its cursors on the table and its four
/// indexes, the `AUTOINCREMENT` counter read and written back) once for all
/// of them.
const CHUNKS: [usize; 3] = [ROWS_BETWEEN_YIELDS, 4, 1];

/// The inserts of [`CHUNKS`] rows, made once.
fn insert(rows: usize) -> &'static str {
    static MADE: std::sync::OnceLock<[String; 3]> = std::sync::OnceLock::new();
    let made = MADE.get_or_init(|| CHUNKS.map(|rows| crate::audit_values_insert(Backend::Sqlite, rows)));
    &made[CHUNKS.iter().position(|&n| n == rows).expect("one of the chunk sizes")]
}

/// Rows written between two offers of the CPU to the request threads (one
/// statement of the largest chunk). A thread that has just been given the
/// CPU keeps it for its slice (1 ms or more) even when a request thread
/// wakes: without these offers, a request arriving while a batch of a
/// thousand rows is written waited out the batch (p99 at one connection,
/// pinned beside the request thread: 1.35 ms without, 0.4 to 0.7 ms with
/// one every 16 rows).
const ROWS_BETWEEN_YIELDS: usize = 16;

/// An offer of the CPU that kept the writer off it this long met a core
/// kept busy by requests (under load, every thread on it runnable), not a
/// request waiting for its turn: the rest of the batch is written without
/// offers, each of which would cost the writer a scheduler slice. (Offered
/// every 16 rows whatever the load, the writer kept up with about 31,000
/// records a second on a saturated core, at 10.6 ms p99, against 40,000
/// and 2.3 ms without the offers; pinned as `loadtest/run` pins, SQLite
/// audit at 32 connections, medians of three rounds.)
const BUSY_CORE: std::time::Duration = std::time::Duration::from_micros(200);

/// How a batch goes to PostgreSQL (SQLite writes every batch one way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// In COPYs of 64 rows, the writer waiting for the server after each:
    /// the server's work comes in short pieces, which a server sharing the
    /// router's cores needs (p99 at one connection), at two round trips a
    /// COPY.
    Paced,
    /// In one COPY, three round trips a batch: for a writer that has
    /// fallen behind (a server a millisecond or more away, where the
    /// round trips of the paced way are most of a batch's time).
    AtOnce,
}

/// The audit writer's way to its database.
pub enum AuditWriter {
    /// An in-memory SQLite database, which only the pool's own connections
    /// can see, or an SQLite URL only sqlx's connections honour: the pool.
    Pool(Database),
    /// An SQLite file, through a connection of the writer's own.
    Sqlite(SqliteAudit),
    /// PostgreSQL, through a connection of the writer's own (boxed: its
    /// options and connection are large beside the other variants).
    Postgres(Box<PgAudit>),
}

impl Database {
    /// The audit writer's way to this database, for a writer on a runtime
    /// and thread of its own (must be called inside that runtime). `busy`:
    /// how long an SQLite write waits for another connection's lock.
    pub fn audit_writer(&self, busy: Duration) -> Result<AuditWriter, DbError> {
        if self.backend == Backend::Postgres {
            let options = sqlx::postgres::PgConnectOptions::from_str(&self.url)?;
            return Ok(AuditWriter::Postgres(Box::new(PgAudit { options, conn: None, busy: false })));
        }
        match sqlite_file(self) {
            Some(path) => Ok(AuditWriter::Sqlite(SqliteAudit { path, busy, conn: None })),
            None => Ok(AuditWriter::Pool(self.separate_pool()?)),
        }
    }
}

/// The file of an SQLite database the writer may open a connection of its
/// own to. `None`: PostgreSQL, an in-memory database, or a URL asking for
/// more than a file opened read-write (a VFS, read-only, immutable...),
/// which only sqlx's connections honour: the writer then uses the pool.
fn sqlite_file(db: &Database) -> Option<PathBuf> {
    if db.backend != Backend::Sqlite || db.url.contains(":memory:") {
        return None;
    }
    let query = db.url.split_once('?').map_or("", |(_, query)| query);
    if !query.split('&').all(|p| matches!(p, "" | "mode=rw" | "mode=rwc")) {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url).ok()?;
    Some(options.get_filename().to_path_buf())
}

impl AuditWriter {
    /// Writes `records`, each once (an id already written is skipped: a
    /// replayed record); how many were new. On SQLite this blocks the
    /// calling thread for the write (the writer's own).
    pub async fn insert(&mut self, records: &[AuditRecord], pace: Pace) -> Result<u64, DbError> {
        match self {
            AuditWriter::Pool(db) => db.insert_audit_paced(records, pace).await,
            AuditWriter::Sqlite(sqlite) => sqlite.insert(records),
            AuditWriter::Postgres(pg) => pg.insert(records, pace).await,
        }
    }
}

/// PostgreSQL's audit log, through a connection opened on first use, again
/// after a failure or a write cancelled halfway, and again after
/// [`REOPEN_AFTER`].
pub struct PgAudit {
    options: sqlx::postgres::PgConnectOptions,
    conn: Option<(sqlx::PgConnection, std::time::Instant)>,
    /// A write began and has not ended: it was cancelled halfway (the
    /// writer's timeout), and the connection may be in the middle of a
    /// statement. It is dropped before the next write (the server rolls
    /// back what it had of it).
    busy: bool,
}

impl PgAudit {
    async fn insert(&mut self, records: &[AuditRecord], pace: Pace) -> Result<u64, DbError> {
        if records.is_empty() {
            return Ok(0);
        }
        if std::mem::take(&mut self.busy) {
            self.conn = None;
        }
        if let Some((conn, _)) = self.conn.take_if(|(_, opened)| opened.elapsed() >= REOPEN_AFTER) {
            let _ = sqlx::Connection::close(conn).await;
        }
        if self.conn.is_none() {
            let conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&self.options).await?;
            self.conn = Some((conn, std::time::Instant::now()));
        }
        let (conn, _) = self.conn.as_mut().expect("opened above");
        self.busy = true;
        let written = crate::audit_pg::write(conn, records, pace).await;
        self.busy = false;
        written.map_err(|e| {
            // The server's refusal leaves the connection ready for the next
            // statement; anything else (I/O, the protocol) may not have.
            if !matches!(e, sqlx::Error::Database(_)) {
                self.conn = None;
            }
            e.into()
        })
    }
}

/// An SQLite file's audit log, through a connection opened on first use,
/// again after a failure, and again after [`REOPEN_AFTER`].
pub struct SqliteAudit {
    path: PathBuf,
    busy: Duration,
    conn: Option<(rusqlite::Connection, std::time::Instant)>,
}

/// A connection is opened afresh this often: a file replaced under the
/// router (restored from a backup), or a PostgreSQL name that now resolves
/// to another server (a failover), is written to within this long, as the
/// pool's connections, which it recycles, would.
const REOPEN_AFTER: Duration = Duration::from_secs(10 * 60);

impl SqliteAudit {
    fn insert(&mut self, records: &[AuditRecord]) -> Result<u64, DbError> {
        if records.is_empty() {
            return Ok(0);
        }
        self.try_insert(records).map_err(|e| {
            if e.sqlite_error().is_some_and(|f| crate::sqlite_refuses_content(f.extended_code)) {
                // The rows, not the connection: it is kept.
                return DbError::Refused(e.to_string());
            }
            // Opened afresh next time (the file may have been replaced).
            self.conn = None;
            DbError::Sqlite(e.to_string())
        })
    }

    fn try_insert(&mut self, records: &[AuditRecord]) -> Result<u64, rusqlite::Error> {
        if self.conn.as_ref().is_none_or(|(_, opened)| opened.elapsed() >= REOPEN_AFTER) {
            self.conn = None;
            self.conn = Some((open(&self.path, self.busy)?, std::time::Instant::now()));
        }
        let (conn, _) = self.conn.as_mut().expect("opened above");
        // IMMEDIATE: the write lock is taken (or waited for) at the start,
        // never upgraded halfway.
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut written = 0u64;
        let mut yielding = true;
        let mut left = records;
        while !left.is_empty() {
            let rows = *CHUNKS.iter().find(|&&n| n <= left.len()).expect("the last chunk is one row");
            let (chunk, rest) = left.split_at(rows);
            left = rest;
            let mut statement = tx.prepare_cached(insert(rows))?;
            let mut at = 0;
            for r in chunk {
                let values: [&dyn rusqlite::ToSql; crate::AUDIT_COLUMN_COUNT] = [
                    &r.id,
                    &r.at_ms,
                    &r.tenant,
                    &r.key_prefix,
                    &r.session,
                    &r.method,
                    &r.target,
                    &r.upstream,
                    &r.outcome,
                    &r.error_code,
                    &r.latency_us,
                    &r.request_bytes,
                    &r.response_bytes,
                    &r.trace_id,
                    &r.arguments,
                    &r.user,
                ];
                for value in values {
                    at += 1;
                    statement.raw_bind_parameter(at, value)?;
                }
            }
            written += statement.raw_execute()? as u64;
            if yielding && rows == ROWS_BETWEEN_YIELDS && !left.is_empty() {
                let offered = std::time::Instant::now();
                std::thread::yield_now();
                yielding = offered.elapsed() < BUSY_CORE;
            }
        }
        tx.commit()?;
        Ok(written)
    }
}

/// A connection to the (migrated) file: never created here, every commit
/// synced as sqlx's connections sync theirs (`synchronous = FULL`), and
/// nothing in temporary files, as with the pool's connections (`connect`):
/// a batch's statements outgrow SQLite's 64 KiB for a statement journal in
/// memory, and with no writable temporary directory every batch failed;
/// with one, a file was created, written (27,000 writes in 3 s at one
/// connection) and deleted for each.
fn open(path: &std::path::Path, busy: Duration) -> Result<rusqlite::Connection, rusqlite::Error> {
    use rusqlite::OpenFlags;
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(busy)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::Connection as _;

    use super::*;
    use crate::audit_pg::tests::record;

    /// The writer's own PostgreSQL connection: a write cancelled while the
    /// server waited for a lock (the writer's timeout) leaves nothing of it
    /// written, and the next write goes through on a connection opened
    /// afresh; a refused one keeps the connection.
    #[tokio::test]
    async fn the_writers_own_postgres_connection_survives_a_cancelled_write() {
        let temp = switchboard_test_support::services::TempDatabase::create().await;
        let db = Database::connect(&temp.url, Duration::from_secs(5)).unwrap();
        db.migrate().await.unwrap();
        let AuditWriter::Postgres(mut pg) = db.audit_writer(Duration::from_secs(1)).unwrap() else {
            panic!("PostgreSQL's writer has a connection of its own");
        };
        assert_eq!(pg.insert(&[record("first")], Pace::Paced).await.unwrap(), 1);
        let first = pid(&mut pg).await;
        assert_eq!(pg.insert(&[record("second")], Pace::AtOnce).await.unwrap(), 1);
        assert_eq!(pid(&mut pg).await, first, "the same connection for every batch");

        let mut holder = sqlx::PgConnection::connect(&temp.url).await.unwrap();
        let mut held = holder.begin().await.unwrap();
        sqlx::query("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE").execute(&mut *held).await.unwrap();
        let batch: Vec<AuditRecord> = (0..100).map(|i| record(&format!("cancelled-{i}"))).collect();
        let cancelled = tokio::time::timeout(Duration::from_millis(300), pg.insert(&batch, Pace::Paced)).await;
        assert!(cancelled.is_err(), "the COPY waited for the table");
        held.rollback().await.unwrap();
        let batch: Vec<AuditRecord> = (0..100).map(|i| record(&format!("after-{i}"))).collect();
        assert_eq!(pg.insert(&batch, Pace::Paced).await.unwrap(), 100);
        assert_ne!(pid(&mut pg).await, first, "the cancelled write's connection was dropped");
        assert_eq!(pg.insert(&batch, Pace::AtOnce).await.unwrap(), 0, "written again: every id is present");
        assert_eq!(db.count_audit(None).await.unwrap(), 102, "nothing of the cancelled batch was written");

        // A record the server refuses (a constraint an operator added).
        let kept = pid(&mut pg).await;
        sqlx::query("ALTER TABLE audit_log ADD CONSTRAINT no_negative CHECK (latency_us >= 0)")
            .execute(&mut holder)
            .await
            .unwrap();
        let mut refused = record("refused");
        refused.latency_us = -1;
        let e = pg.insert(&[refused], Pace::Paced).await.unwrap_err();
        assert!(e.refuses_content(), "{e}");
        assert_eq!(pg.insert(&[record("after-refusal")], Pace::Paced).await.unwrap(), 1);
        assert_eq!(pid(&mut pg).await, kept, "a refusal keeps the connection");
        drop((db, pg, holder));
        temp.drop_now().await;
    }

    /// The server's process for the writer's connection.
    async fn pid(pg: &mut PgAudit) -> i32 {
        let (conn, _) = pg.conn.as_mut().expect("a connection");
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(conn).await.unwrap()
    }
}
