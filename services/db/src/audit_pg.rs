//! The audit writer's way into PostgreSQL: a batch as `COPY ... FROM STDIN`
//! in PostgreSQL's binary format, 64 rows a COPY, in one transaction, or in
//! one COPY when the writer is behind ([`write`], [`Pace`]); or, when some
//! of its records are already there, as `UNNEST` inserts that skip them.
//!
//! Why COPY: an insert of many rows (`INSERT ... SELECT FROM UNNEST(...)
//! ON CONFLICT DO NOTHING`) costs the server a plan, a function scan and a
//! speculative insertion per row, and the writer an array per column; COPY
//! is the server's bulk load, and each record is written once, row by row,
//! as the server reads it. COPY cannot skip a row whose id is present (a
//! batch written again after a write that timed out but went through), so
//! such a batch fails whole (nothing of it written) and goes the `UNNEST`
//! way instead.

use std::borrow::Cow;

use crate::{AuditRecord, Pace, AUDIT_COLUMNS};

/// The most rows in one COPY of a paced batch, and in one insert of the
/// `UNNEST` way (a batch is cut into statements of this many in one
/// transaction).
const PG_AUDIT_CHUNK: usize = 64;

/// PostgreSQL's SQLSTATE for a unique key already present.
const UNIQUE_VIOLATION: &str = "23505";

/// Writes `records` on `conn`, each once: an id already written is
/// skipped. A write cancelled halfway (the writer's timeout) leaves `conn`
/// unready: its owner must not use it again (the pool tests every
/// connection given back, and closes it; the writer's own connection is
/// dropped, `audit_writer::PgAudit`).
pub(crate) async fn write(
    conn: &mut sqlx::PgConnection,
    records: &[AuditRecord],
    pace: Pace,
) -> Result<u64, sqlx::Error> {
    let copied = match pace {
        Pace::Paced => in_pieces(conn, records, copy_rows).await,
        // One statement: all of it, or none, with no transaction around it.
        Pace::AtOnce => copy_rows(conn, records).await,
    };
    match copied {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNIQUE_VIOLATION) => {
            in_pieces(conn, records, async |conn: &mut sqlx::PgConnection, rows: &[AuditRecord]| {
                unnest(conn, rows).await
            })
            .await
        }
        written => written,
    }
}

/// `records` written by `write` [`PG_AUDIT_CHUNK`] rows at a time, in one
/// transaction (a batch that small, on its own): all of it, or none. The
/// writer waits for each piece, so the server's part comes in short pieces
/// the request path's threads get the cores between. (Pinned as
/// `loadtest/run` pins, audit to PostgreSQL, five rounds each: p99 at one
/// connection 1.7 ms with one COPY per batch, 0.48 ms in these pieces, 0.84
/// with the `UNNEST` inserts of before; the server's CPU per call 4.8 µs in
/// these pieces, 7.2 with the inserts.) The waits cost the writer: one COPY
/// per batch (3 round trips to the server a batch of 500 instead of 19)
/// took half its CPU at 32 connections (0.09 s against 0.19 s a 4 s run),
/// but p99 at one connection went back up (1.5 to 2.9 ms against 0.67 to
/// 1.4, the same A/B runs, 2026-11-30), also with the COPY's pieces sent a
/// millisecond apart: the server buffers a COPY's rows (up to 64 kB) and
/// inserts them together, so a long COPY's part comes in bursts whatever
/// the writer does. So the pieces stay, but a writer behind (a server a
/// millisecond away: 19 round trips a batch were most of its time) writes
/// in one COPY ([`Pace::AtOnce`]).
async fn in_pieces(
    conn: &mut sqlx::PgConnection,
    records: &[AuditRecord],
    write: impl AsyncFn(&mut sqlx::PgConnection, &[AuditRecord]) -> Result<u64, sqlx::Error>,
) -> Result<u64, sqlx::Error> {
    if records.len() <= PG_AUDIT_CHUNK {
        return write(conn, records).await;
    }
    let mut tx = sqlx::Connection::begin(conn).await?;
    let mut written = 0;
    for chunk in records.chunks(PG_AUDIT_CHUNK) {
        written += write(&mut tx, chunk).await?;
    }
    tx.commit().await?;
    Ok(written)
}

/// Binary COPY's head: its signature, no flags, no header extension.
const COPY_HEAD: &[u8; 19] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// Binary COPY's trailer: a row of -1 columns.
const COPY_TRAILER: [u8; 2] = (-1i16).to_be_bytes();

/// One COPY of `records`, encoded straight from them into one buffer, no
/// value copied on its own.
async fn copy_rows(conn: &mut sqlx::PgConnection, records: &[AuditRecord]) -> Result<u64, sqlx::Error> {
    static STATEMENT: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("COPY audit_log ({AUDIT_COLUMNS}) FROM STDIN (FORMAT binary)"));
    let mut copy = conn.copy_in_raw(&STATEMENT).await?;
    let mut data = Vec::with_capacity(COPY_HEAD.len() + records.len() * (COPY_ROW_FIXED + 128) + COPY_TRAILER.len());
    data.extend_from_slice(COPY_HEAD);
    for record in records {
        copy_row(record, &mut data).map_err(|e| sqlx::Error::Encode(e.into()))?;
    }
    data.extend_from_slice(&COPY_TRAILER);
    copy.send(data).await?;
    copy.finish().await
}

/// One record as a row of binary COPY: its column count, then each column
/// as its length (-1: NULL) and bytes (`text` as UTF-8, `int8` as 8 bytes,
/// big-endian), in [`AUDIT_COLUMNS`]' order, room for the row made once.
fn copy_row(r: &AuditRecord, out: &mut Vec<u8>) -> Result<(), &'static str> {
    out.reserve(COPY_ROW_FIXED + copy_text_len(r));
    out.extend_from_slice(&(COLUMNS.len() as i16).to_be_bytes());
    copy_text(out, Some(&r.id))?;
    copy_number(out, Some(r.at_ms));
    copy_text(out, r.tenant.as_deref())?;
    copy_text(out, r.key_prefix.as_deref())?;
    copy_text(out, r.session.as_deref())?;
    copy_text(out, Some(&r.method))?;
    copy_text(out, r.target.as_deref())?;
    copy_text(out, r.upstream.as_deref())?;
    copy_text(out, Some(&r.outcome))?;
    copy_number(out, r.error_code);
    copy_number(out, Some(r.latency_us));
    copy_number(out, Some(r.request_bytes));
    copy_number(out, Some(r.response_bytes));
    copy_text(out, r.trace_id.as_deref())?;
    copy_text(out, r.arguments.as_deref())?;
    copy_text(out, r.user.as_deref())
}

/// A COPY row's bytes besides its text: its column count, each column's
/// length, the five numbers.
const COPY_ROW_FIXED: usize = 2 + COLUMNS.len() * 4 + 5 * 8;

/// The bytes of a record's text columns (a NUL's replacement takes two
/// more, room made as it comes).
fn copy_text_len(r: &AuditRecord) -> usize {
    let len = |t: Option<&str>| t.map_or(0, str::len);
    r.id.len()
        + r.method.len()
        + r.outcome.len()
        + len(r.tenant.as_deref())
        + len(r.key_prefix.as_deref())
        + len(r.session.as_deref())
        + len(r.target.as_deref())
        + len(r.upstream.as_deref())
        + len(r.trace_id.as_deref())
        + len(r.arguments.as_deref())
        + len(r.user.as_deref())
}

#[inline(always)]
fn copy_text(out: &mut Vec<u8>, text: Option<&str>) -> Result<(), &'static str> {
    let Some(text) = text else {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return Ok(());
    };
    let text = pg_text(text);
    let len = i32::try_from(text.len()).map_err(|_| "an audit value over 2 GiB")?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

#[inline(always)]
fn copy_number(out: &mut Vec<u8>, n: Option<i64>) {
    match n {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(n) => {
            out.extend_from_slice(&8i32.to_be_bytes());
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

/// A batch of audit records in one PostgreSQL statement, whatever its size:
/// each column bound as one array (prepared once per connection; no
/// per-row placeholders to bind and convert), encoded straight from the
/// records ([`Column`]).
async fn unnest<'e, E>(pg: E, records: &[AuditRecord]) -> Result<u64, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    const INSERT: &str = "INSERT INTO audit_log (id, at_ms, tenant, key_prefix, session, method, target, upstream, \
        outcome, error_code, latency_us, request_bytes, response_bytes, trace_id, arguments, user_id) \
        SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
        $8::text[], $9::text[], $10::int8[], $11::int8[], $12::int8[], $13::int8[], $14::text[], $15::text[], \
        $16::text[]) ON CONFLICT (id) DO NOTHING";
    // Room for every column's array, made once: grown as each came, the
    // arguments' buffer was copied a doubling at a time. Each array's head
    // is 20 bytes, and sqlx puts its length before it.
    let room = COLUMNS.len() * 24
        + records.iter().map(|r| COLUMNS.iter().map(|get| get.size(r)).sum::<usize>()).sum::<usize>();
    let mut query = sqlx::query::<sqlx::Postgres>(INSERT);
    for (i, &get) in COLUMNS.iter().enumerate() {
        query = query.bind(Column { records, get, room: if i == 0 { room } else { 0 } });
    }
    let done = query.execute(pg).await?;
    Ok(done.rows_affected())
}

/// One column of a batch of audit records, bound as a PostgreSQL array
/// (`text[]` or `int8[]`) and encoded from the records as it is sent: no
/// vector of values made first, no per-value length patched in afterwards.
/// sqlx's own encoding of the same arrays (vectors of `Option<Cow<str>>`
/// and `i64`) cost about 1,000 instructions a record more (callgrind: the
/// writer's thread about 3,400 a record before, 2,600 after).
struct Column<'a> {
    records: &'a [AuditRecord],
    get: Get,
    /// Bytes to make room for in the arguments' buffer first (the first
    /// column's: every column's).
    room: usize,
}

#[derive(Clone, Copy)]
enum Get {
    Text(fn(&AuditRecord) -> Option<&str>),
    Number(fn(&AuditRecord) -> Option<i64>),
}

impl Get {
    /// The bytes `record`'s value takes in its array (its length, then
    /// itself; a NUL's replacement takes two more, room made as it comes).
    fn size(self, record: &AuditRecord) -> usize {
        match self {
            Get::Text(get) => 4 + get(record).map_or(0, str::len),
            Get::Number(get) => 4 + get(record).map_or(0, |_| 8),
        }
    }
}

/// The insert's columns, in its parameters' order.
const COLUMNS: [Get; 16] = [
    Get::Text(|r| Some(&r.id)),
    Get::Number(|r| Some(r.at_ms)),
    Get::Text(|r| r.tenant.as_deref()),
    Get::Text(|r| r.key_prefix.as_deref()),
    Get::Text(|r| r.session.as_deref()),
    Get::Text(|r| Some(r.method.as_ref())),
    Get::Text(|r| r.target.as_deref()),
    Get::Text(|r| r.upstream.as_deref()),
    Get::Text(|r| Some(r.outcome.as_ref())),
    Get::Number(|r| r.error_code),
    Get::Number(|r| Some(r.latency_us)),
    Get::Number(|r| Some(r.request_bytes)),
    Get::Number(|r| Some(r.response_bytes)),
    Get::Text(|r| r.trace_id.as_deref()),
    Get::Text(|r| r.arguments.as_deref()),
    Get::Text(|r| r.user.as_deref()),
];

impl sqlx::Type<sqlx::Postgres> for Column<'_> {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        // Told apart by `produces`; the statement casts each parameter.
        <Vec<String> as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, sqlx::Postgres> for Column<'_> {
    fn produces(&self) -> Option<sqlx::postgres::PgTypeInfo> {
        Some(match self.get {
            Get::Text(_) => <Vec<String> as sqlx::Type<sqlx::Postgres>>::type_info(),
            Get::Number(_) => <Vec<i64> as sqlx::Type<sqlx::Postgres>>::type_info(),
        })
    }

    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, Box<dyn std::error::Error + Send + Sync>> {
        /// The element types' object ids (`pg_type`).
        const TEXT: u32 = 25;
        const INT8: u32 = 20;
        let count = i32::try_from(self.records.len()).map_err(|_| "too many audit records for one array")?;
        // PostgreSQL's binary array: one dimension, "may hold NULLs", the
        // element type, the dimension's length and lower bound (1); then each
        // element as its length (-1: NULL) and bytes.
        let element = match self.get {
            Get::Text(_) => TEXT,
            Get::Number(_) => INT8,
        };
        buf.reserve(self.room);
        for word in [1, 1, element as i32, count, 1] {
            buf.extend_from_slice(&word.to_be_bytes());
        }
        match self.get {
            Get::Text(get) => {
                for record in self.records {
                    let Some(text) = get(record) else {
                        buf.extend_from_slice(&(-1i32).to_be_bytes());
                        continue;
                    };
                    let text = pg_text(text);
                    let len = i32::try_from(text.len()).map_err(|_| "an audit value over 2 GiB")?;
                    buf.extend_from_slice(&len.to_be_bytes());
                    buf.extend_from_slice(text.as_bytes());
                }
            }
            Get::Number(get) => {
                for record in self.records {
                    match get(record) {
                        None => buf.extend_from_slice(&(-1i32).to_be_bytes()),
                        Some(n) => {
                            buf.extend_from_slice(&8i32.to_be_bytes());
                            buf.extend_from_slice(&n.to_be_bytes());
                        }
                    }
                }
            }
        }
        Ok(sqlx::encode::IsNull::No)
    }
}

/// `text` for PostgreSQL, whose `text` cannot hold the NUL character: a NUL
/// a client sent (in a tool's name, a method, a token's user) is stored as
/// U+FFFD. Stored as sent, it failed the whole insert, and every batch after
/// it, spooled behind it, failed with it.
fn pg_text(text: &str) -> Cow<'_, str> {
    if text.as_bytes().contains(&0) {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use sqlx::Connection as _;

    use super::*;
    use crate::Database;

    /// A record with `id` (also the audit writer's tests').
    pub(crate) fn record(id: &str) -> AuditRecord {
        AuditRecord {
            id: id.to_owned(),
            at_ms: 1,
            tenant: Some("acme".into()),
            key_prefix: None,
            session: None,
            method: "tools/call".into(),
            target: Some("web__echo".into()),
            upstream: Some("web".into()),
            outcome: "ok".into(),
            error_code: None,
            latency_us: 2,
            request_bytes: 3,
            response_bytes: 4,
            trace_id: None,
            arguments: None,
            user: None,
        }
    }

    /// A COPY cancelled before it was answered (the writer's timeout, while
    /// another session held the table) leaves no connection in the pool
    /// halfway through it: the next write on the same pool is written whole.
    #[tokio::test]
    async fn a_copy_cancelled_halfway_leaves_the_pool_writing() {
        let temp = switchboard_test_support::services::TempDatabase::create().await;
        let db = Database::connect(&temp.url, Duration::from_secs(5)).unwrap();
        db.migrate().await.unwrap();
        assert_eq!(db.insert_audit(&[record("warm")]).await.unwrap(), 1, "one connection, idle in the pool");
        let mut holder = sqlx::PgConnection::connect(&temp.url).await.unwrap();
        let mut held = holder.begin().await.unwrap();
        sqlx::query("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE").execute(&mut *held).await.unwrap();
        let cancelled = tokio::time::timeout(Duration::from_millis(300), db.insert_audit(&[record("cancelled")])).await;
        assert!(cancelled.is_err(), "the COPY waited for the table");
        held.rollback().await.unwrap();
        let batch: Vec<AuditRecord> = (0..100).map(|i| record(&format!("after-{i}"))).collect();
        assert_eq!(db.insert_audit_paced(&batch, Pace::Paced).await.unwrap(), 100);
        assert_eq!(db.insert_audit_paced(&batch, Pace::AtOnce).await.unwrap(), 0, "written again: every id is present");
        assert_eq!(db.count_audit(None).await.unwrap(), 101, "the cancelled record was not written");
        drop((db, holder));
        temp.drop_now().await;
    }

    /// A paced batch is one transaction of COPYs, a batch at once one COPY:
    /// either way a record already present at its end fails it whole, the
    /// COPYs before it too (nothing of it is left half-written), and the
    /// batch is written again the other way, each of its new records once.
    #[tokio::test]
    async fn a_batch_failing_in_its_last_copy_is_written_whole_the_other_way() {
        let temp = switchboard_test_support::services::TempDatabase::create().await;
        let db = Database::connect(&temp.url, Duration::from_secs(5)).unwrap();
        db.migrate().await.unwrap();
        let mut conn = sqlx::PgConnection::connect(&temp.url).await.unwrap();
        for pace in [Pace::Paced, Pace::AtOnce] {
            let last = format!("last-{pace:?}");
            assert_eq!(write(&mut conn, &[record(&last)], pace).await.unwrap(), 1);
            let mut batch: Vec<AuditRecord> =
                (0..3 * PG_AUDIT_CHUNK).map(|i| record(&format!("{pace:?}-{i}"))).collect();
            batch.push(record(&last));
            assert_eq!(write(&mut conn, &batch, pace).await.unwrap(), 3 * PG_AUDIT_CHUNK as u64, "{pace:?}");
        }
        assert_eq!(db.count_audit(None).await.unwrap(), 2 * (3 * PG_AUDIT_CHUNK as i64 + 1));
        drop((db, conn));
        temp.drop_now().await;
    }
}
