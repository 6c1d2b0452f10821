//! The audit log: one record per request that reaches an upstream, and per
//! refused request, written to the database by a background task.
//!
//! The request path only hands a record to a bounded queue ([`Audit::record`])
//! and never waits for the database. The writer takes what has queued (up to
//! a batch) and writes it in one transaction: paced (on PostgreSQL, COPYs of
//! 64 rows, waiting for the server after each), or at once (one COPY) when a
//! whole batch more is already waiting behind it. When the database fails
//! or is too slow, the batch goes to the [`spool`] file instead, and so does
//! everything after it until the spool has been replayed, in order; so
//! records reach the database in the order they were made, each exactly once
//! (the database skips ids it already has). If the queue is full, the request
//! path appends its record to the spool itself rather than drop it.
//!
//! A record the database refuses for what it holds (a check, a type, a size:
//! PostgreSQL once refused a NUL character), rather than for being down,
//! would be refused on every retry and hold up every record behind it. The
//! writer then writes the batch in halves, halving any part refused, and
//! sets aside the records refused on their own: appended to the rejected
//! file beside the spool, counted, logged. The rest are written.
//!
//! The spool is written at once and synced apart ([`spool`]): by the writer
//! after its own appends, outside the spool's lock, and for records the
//! requests spool themselves by one blocking task at a time ([`Syncs`]), so
//! that a request never waits for the disk.
//!
//! A record's id is given where it leaves the queue: by the writer as it
//! takes the record, or by the request that spools it itself. The request
//! path does not make one (an allocation freed on the writer's thread).

mod metrics;
pub mod spool;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use switchboard_db::{AuditRecord, AuditWriter, Database, Pace};

pub use crate::metrics::Metrics;
use spool::Spool;

/// Tuning of the writer (from `[audit]`).
#[derive(Debug, Clone)]
pub struct Options {
    pub queue: usize,
    pub batch: usize,
    /// A write that takes longer counts as failed (the batch is spooled).
    pub write_timeout: Duration,
    /// After a failure, how long before the database is tried again.
    pub retry_every: Duration,
    /// How long records are gathered before an insert that is not full: at
    /// low rates one insert (one commit) per interval rather than one per
    /// record.
    pub flush_every: Duration,
}

/// A clonable handle that queues records (or spools them).
#[derive(Clone)]
pub struct Sink {
    /// Boxed: a request's record is made in a box, and goes through as
    /// it is: a pointer copied into the queue and out, not the record's
    /// 250 bytes twice, and the queue's blocks (32 slots each, allocated as
    /// it grows) stay small (`Sink::record` went from 0.3% of the router's
    /// CPU samples to 0.1%, keys, limits and PostgreSQL audit at 32
    /// connections).
    queue: mpsc::Sender<Box<AuditRecord>>,
    spool: Arc<Mutex<Spool>>,
    metrics: Arc<Metrics>,
    ids: Arc<Ids>,
    syncs: Arc<Syncs>,
}

impl Sink {
    /// Queues a record; never waits for the disk. If the queue is full the
    /// record is appended to the spool here instead, and synced soon
    /// ([`Syncs`]). After the writer has stopped (a request finished after
    /// shutdown's drain), it is appended and synced here: no sync would
    /// follow. A record without an id (`""`) is given one.
    pub fn record(&self, record: impl Into<Box<AuditRecord>>) {
        match self.queue.try_send(record.into()) {
            Ok(()) => {}
            Err(refused) => {
                let stopped = matches!(refused, mpsc::error::TrySendError::Closed(_));
                let record = self.ids.stamp(*refused.into_inner());
                self.metrics.overflow();
                let mut spool = self.spool.lock().expect("lock");
                match spool.append(std::slice::from_ref(&record)) {
                    Ok(()) => {
                        self.metrics.set_spool_bytes(spool.pending_bytes());
                        self.metrics.spooled(1);
                        if stopped {
                            sync(spool.unsynced(), &self.metrics);
                        } else {
                            drop(spool);
                            self.syncs.ask(&self.spool, &self.metrics);
                        }
                    }
                    Err(e) => {
                        self.metrics.lost(1);
                        tracing::error!(error = %e, id = %record.id, "audit: record lost: queue full and the spool cannot be written");
                    }
                }
            }
        }
    }
}

/// However long the writer gathers records (`flush_every` is not bounded),
/// the records the requests spool are on disk within about this long.
const SYNCS_GATHER_AT_MOST: Duration = Duration::from_secs(1);

/// The syncs of records the requests spooled themselves: one blocking task
/// at a time, each covering every record appended before it began, which
/// is `audit.flush_every` (at most [`SYNCS_GATHER_AT_MOST`]) after it was
/// asked for. Records the requests spool are in the file at once (a crash
/// of the router loses none), and on disk within that time plus the
/// sync's, as queued records are in the database within `flush_every` plus
/// the write's. Synced at once, the syncs followed one another, each a few
/// records, and their writes and interrupts cost the requests' core: 11,000
/// calls a second while the requests spooled, 27,000 to 30,000 with syncs
/// 10 or 100 ms apart, against 30,000 to 34,000 before the queue filled
/// (pinned as `loadtest/run` pins, SQLite audit, its database locked, 32
/// connections; synced one by one on the requests' threads, as before,
/// 5,000). `loadtest/spooling` measures it.
struct Syncs {
    /// A task is asked for and has not yet taken what it will sync.
    asked: std::sync::atomic::AtomicBool,
    gathers: Duration,
}

impl Syncs {
    /// After an append: a sync that covers it, on a blocking thread (or
    /// here and now, outside a runtime). A record appended while a task is
    /// asked for is covered by that task, which takes what to sync only
    /// after it is no longer asked for: whoever appends after that asks
    /// again.
    fn ask(self: &Arc<Self>, spool: &Arc<Mutex<Spool>>, metrics: &Arc<Metrics>) {
        if self.asked.swap(true, Ordering::SeqCst) {
            return;
        }
        let (syncs, spool, metrics) = (self.clone(), spool.clone(), metrics.clone());
        let gathers = self.gathers;
        let sync_now = move || {
            syncs.asked.store(false, Ordering::SeqCst);
            let unsynced = spool.lock().expect("lock").unsynced();
            sync(unsynced, &metrics);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || {
                std::thread::sleep(gathers);
                sync_now();
            })),
            Err(_) => sync_now(),
        }
    }
}

/// Syncs records written to the spool; if that fails they may be lost:
/// counted and logged so.
fn sync(unsynced: Option<spool::Unsynced>, metrics: &Metrics) {
    let Some(unsynced) = unsynced else { return };
    let records = unsynced.records;
    if let Err(e) = unsynced.sync() {
        metrics.lost(records);
        tracing::error!(error = %e, records, "audit: records may be lost: written to the spool, which could not be synced to disk");
    }
}

/// The handle the request path uses.
pub struct Audit {
    sink: Sink,
    stop: Arc<Notify>,
    done: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    ids: Arc<Ids>,
}

impl Audit {
    /// Opens the spool and starts the writer on a thread of its own, with
    /// its own runtime and its own way to the database (a connection of its
    /// own, or a pool for an in-memory database): building and sending a batch of
    /// hundreds of rows takes a millisecond or more of CPU, which on the
    /// request threads' runtime would hold up requests behind it; as a
    /// thread of its own the OS schedules it beside them.
    pub fn start(db: Database, spool_path: &Path, options: Options, metrics: Arc<Metrics>) -> std::io::Result<Audit> {
        let spool = Arc::new(Mutex::new(Spool::open(spool_path)?));
        {
            let s = spool.lock().expect("lock");
            if s.pending() {
                tracing::info!(bytes = s.pending_bytes(), path = %spool_path.display(), "audit: spooled records from an earlier run will be replayed");
            }
            metrics.set_spool_bytes(s.pending_bytes());
        }
        let (tx, rx) = mpsc::channel(options.queue.max(1));
        let stop = Arc::new(Notify::new());
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let db = {
            let _context = runtime.enter();
            db.audit_writer(options.write_timeout).map_err(std::io::Error::other)?
        };
        let ids = Arc::new(Ids::new());
        let flush_every = options.flush_every;
        let writer = Writer {
            db,
            rejected: rejected_path(spool_path),
            rx,
            spool: spool.clone(),
            metrics: metrics.clone(),
            options,
            capacity: tx.max_capacity(),
            ids: ids.clone(),
        };
        let stop_writer = stop.clone();
        std::thread::Builder::new().name("switchboard-audit".into()).spawn(move || {
            runtime.block_on(writer.run(stop_writer));
            let _ = done_tx.send(());
        })?;
        let syncs = Arc::new(Syncs { asked: false.into(), gathers: flush_every.min(SYNCS_GATHER_AT_MOST) });
        let sink = Sink { queue: tx, spool, metrics, ids: ids.clone(), syncs };
        Ok(Audit { sink, stop, done: Mutex::new(Some(done)), ids })
    }

    /// A new record id, unique across replicas and restarts, for a record
    /// whose id must be known before it is queued (a record queued with
    /// `""` is given one as it leaves the queue).
    pub fn new_id(&self) -> String {
        self.ids.next()
    }

    /// Queues a record; never waits. If the queue is full the record is
    /// appended to the spool here instead.
    pub fn record(&self, record: impl Into<Box<AuditRecord>>) {
        self.sink.record(record)
    }

    /// Where records go, as a handle of its own: for a record written when
    /// a request's state is dropped (a client that hung up).
    pub fn sink(&self) -> Sink {
        self.sink.clone()
    }

    /// Writes what is queued (to the database, or else the spool) and stops
    /// the writer; waits at most `grace`.
    pub async fn close(&self, grace: Duration) {
        self.stop.notify_one();
        let handle = self.done.lock().expect("lock").take();
        if let Some(handle) = handle {
            if tokio::time::timeout(grace, handle).await.is_err() {
                tracing::warn!("audit: writer did not finish within {grace:?}; queued records are spooled on the next start only if they reached the spool");
            }
        }
    }
}

/// Record ids: 64 random bits fixed per process, then a counter.
struct Ids {
    process: String,
    counter: AtomicU64,
}

impl Ids {
    fn new() -> Ids {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        Ids { process: hex::encode(bytes), counter: AtomicU64::new(0) }
    }

    /// `record` with an id: its own, or a new one if it has none.
    fn stamp(&self, mut record: AuditRecord) -> AuditRecord {
        if record.id.is_empty() {
            record.id = self.next();
        }
        record
    }

    fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // The counter's 16 hex digits, made in a stack buffer and added at
        // once (pushed a `char` at a time, each checked for its width and
        // the string's capacity, they cost about 300 instructions a record).
        let mut digits = [0u8; 16];
        for (i, digit) in digits.iter_mut().enumerate() {
            *digit = b"0123456789abcdef"[((n >> ((15 - i) * 4)) & 15) as usize];
        }
        let mut id = String::with_capacity(32);
        id.push_str(&self.process);
        id.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
        id
    }
}

/// Where the records the database refused go: beside the spool, its name
/// ending in `.rejected` instead of the spool's extension.
pub fn rejected_path(spool_path: &Path) -> std::path::PathBuf {
    spool_path.with_extension("rejected")
}

struct Writer {
    db: AuditWriter,
    rejected: std::path::PathBuf,
    rx: mpsc::Receiver<Box<AuditRecord>>,
    spool: Arc<Mutex<Spool>>,
    metrics: Arc<Metrics>,
    options: Options,
    capacity: usize,
    ids: Arc<Ids>,
}

impl Writer {
    async fn run(mut self, stop: Arc<Notify>) {
        let mut batch: Vec<AuditRecord> = Vec::with_capacity(self.options.batch);
        let mut retry_at = tokio::time::Instant::now();
        let mut stopping = false;
        loop {
            let spooling = self.spool.lock().expect("lock").pending();
            // While records wait in the spool, wake up to replay them even
            // when no new ones arrive.
            let wait = if spooling {
                retry_at.max(tokio::time::Instant::now() + Duration::from_millis(50))
            } else {
                tokio::time::Instant::now() + Duration::from_secs(3600)
            };
            if !stopping {
                tokio::select! {
                    r = self.rx.recv() => match r {
                        Some(r) => batch.push(self.ids.stamp(*r)),
                        None => stopping = true,
                    },
                    () = tokio::time::sleep_until(wait) => {}
                    () = stop.notified() => {
                        stopping = true;
                        self.rx.close();
                    }
                }
            }
            // Let records gather until a batch is waiting or `flush_every`
            // has passed since the first. Looking every 10 ms rather than
            // waking for each record: a wake-up per record, across threads,
            // costs the request path more than the insert saves.
            let deadline = tokio::time::Instant::now() + self.options.flush_every;
            while !stopping && !batch.is_empty() && batch.len() + self.rx.len() < self.options.batch {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline.min(now + Duration::from_millis(10))) => {}
                    () = stop.notified() => {
                        stopping = true;
                        self.rx.close();
                    }
                }
            }
            while batch.len() < self.options.batch {
                match self.rx.try_recv() {
                    Ok(r) => batch.push(self.ids.stamp(*r)),
                    Err(_) => break,
                }
            }
            self.metrics.set_queue(self.capacity - self.rx.capacity());
            if !batch.is_empty() {
                // A whole batch more already waiting: the writer is behind,
                // and writes this one in the fewest round trips.
                let pace = if self.rx.len() >= self.options.batch { Pace::AtOnce } else { Pace::Paced };
                self.write(&mut batch, &mut retry_at, pace).await;
            }
            if self.spool.lock().expect("lock").pending() && tokio::time::Instant::now() >= retry_at {
                self.replay(&mut retry_at).await;
            }
            if stopping && batch.is_empty() && self.rx.is_empty() {
                // What the requests spooled last may still wait for its sync.
                let unsynced = self.spool.lock().expect("lock").unsynced();
                sync(unsynced, &self.metrics);
                return;
            }
        }
    }

    /// Writes a batch to the database, or to the spool when records already
    /// wait there (to keep order) or the database fails.
    async fn write(&mut self, batch: &mut Vec<AuditRecord>, retry_at: &mut tokio::time::Instant, pace: Pace) {
        let spooling = self.spool.lock().expect("lock").pending();
        if !spooling {
            match tokio::time::timeout(self.options.write_timeout, self.db.insert(batch, pace)).await {
                Ok(Ok(_)) => {
                    self.metrics.batch_written(pace);
                    self.metrics.written(batch.len());
                    if let Some(oldest) = batch.iter().map(|r| r.at_ms).min() {
                        self.metrics.written_at(oldest);
                    }
                    batch.clear();
                    return;
                }
                Ok(Err(e)) if e.refuses_content() => {
                    if let Some(written) = self.sort_out(batch, &e).await {
                        self.metrics.written(written);
                        batch.clear();
                        return;
                    }
                    tracing::warn!(records = batch.len(), "audit: database write failed while setting aside a refused record; spooling to disk until it is back");
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, records = batch.len(), "audit: database write failed; spooling to disk until it is back");
                }
                Err(_) => {
                    tracing::warn!(timeout = ?self.options.write_timeout, records = batch.len(), "audit: database write timed out; spooling to disk until it is back");
                }
            }
            self.metrics.write_failed();
            *retry_at = tokio::time::Instant::now() + self.options.retry_every;
        }
        self.spool_batch(batch);
    }

    fn spool_batch(&mut self, batch: &mut Vec<AuditRecord>) {
        let mut spool = self.spool.lock().expect("lock");
        let appended = spool.append(batch);
        // The gauge first, as everywhere: whoever sees the records counted
        // sees the spool's bytes that hold them.
        self.metrics.set_spool_bytes(spool.pending_bytes());
        // Synced with the lock let go: a request spooling its own record
        // meanwhile does not wait for the disk.
        let unsynced = spool.unsynced();
        drop(spool);
        match appended {
            Ok(()) => self.metrics.spooled(batch.len()),
            Err(e) => {
                self.metrics.lost(batch.len());
                tracing::error!(error = %e, records = batch.len(), "audit: records lost: the database and the spool both failed");
            }
        }
        sync(unsynced, &self.metrics);
        batch.clear();
    }

    /// Writes `records`, which the database refused together (`refusal`), in
    /// parts: halves, and halves of any part refused, until each record it
    /// refuses is found on its own; those are set aside. How many were
    /// written; `None` if the database failed otherwise on the way (then
    /// nothing is set aside, and the caller keeps all the records: those
    /// already written are skipped when they are written again).
    async fn sort_out(&mut self, records: &[AuditRecord], refusal: &switchboard_db::DbError) -> Option<usize> {
        let mut refused: Vec<(usize, String)> = Vec::new();
        let mut written = 0;
        // Parts still to write, the next one last: in order.
        let mut parts = vec![(0, records.len())];
        let mut first = Some(refusal.to_string());
        while let Some((start, end)) = parts.pop() {
            // The whole was refused already.
            let outcome = match first.take() {
                Some(refusal) => Err(refusal),
                None => {
                    match tokio::time::timeout(
                        self.options.write_timeout,
                        self.db.insert(&records[start..end], Pace::Paced),
                    )
                    .await
                    {
                        Ok(Ok(_)) => {
                            self.metrics.batch_written(Pace::Paced);
                            Ok(())
                        }
                        Ok(Err(e)) if e.refuses_content() => Err(e.to_string()),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "audit: database write failed while sorting out a refused batch");
                            return None;
                        }
                        Err(_) => return None,
                    }
                }
            };
            match outcome {
                Ok(()) => written += end - start,
                Err(refusal) if end - start == 1 => refused.push((start, refusal)),
                Err(_) => {
                    let middle = start + (end - start) / 2;
                    parts.push((middle, end));
                    parts.push((start, middle));
                }
            }
        }
        if refused.is_empty() {
            return Some(written);
        }
        let set_aside = spool::set_aside(&self.rejected, refused.iter().map(|&(i, _)| &records[i]));
        for (i, refusal) in &refused {
            let r = &records[*i];
            match &set_aside {
                Ok(()) => tracing::error!(
                    id = %r.id, tenant = r.tenant.as_deref().unwrap_or(""), method = %r.method, error = %refusal,
                    path = %self.rejected.display(),
                    "audit: the database refused a record; set aside in the rejected file"
                ),
                Err(e) => tracing::error!(
                    id = %r.id, tenant = r.tenant.as_deref().unwrap_or(""), method = %r.method, error = %refusal,
                    write_error = %e, path = %self.rejected.display(),
                    "audit: record lost: the database refused it and the rejected file cannot be written"
                ),
            }
        }
        match set_aside {
            Ok(()) => self.metrics.rejected(refused.len()),
            Err(_) => self.metrics.lost(refused.len()),
        }
        Some(written)
    }

    /// Replays the spool into the database, batch by batch, until it is
    /// empty or the database fails again.
    async fn replay(&mut self, retry_at: &mut tokio::time::Instant) {
        loop {
            let peeked = self.spool.lock().expect("lock").peek(self.options.batch);
            let (records, offset, corrupt) = match peeked {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "audit: cannot read the spool");
                    *retry_at = tokio::time::Instant::now() + self.options.retry_every;
                    return;
                }
            };
            if corrupt > 0 {
                self.metrics.lost(corrupt);
                tracing::error!(
                    lines = corrupt,
                    "audit: unreadable lines in the spool skipped (a write cut short by a crash)"
                );
            }
            let mut replayed = 0;
            if !records.is_empty() {
                // Catching up: at once.
                match tokio::time::timeout(self.options.write_timeout, self.db.insert(&records, Pace::AtOnce)).await {
                    Ok(Ok(_)) => {
                        self.metrics.batch_written(Pace::AtOnce);
                        replayed = records.len();
                    }
                    Ok(Err(e)) if e.refuses_content() => match self.sort_out(&records, &e).await {
                        Some(written) => replayed = written,
                        None => {
                            *retry_at = tokio::time::Instant::now() + self.options.retry_every;
                            return;
                        }
                    },
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "audit: database still unavailable");
                        *retry_at = tokio::time::Instant::now() + self.options.retry_every;
                        return;
                    }
                    Err(_) => {
                        *retry_at = tokio::time::Instant::now() + self.options.retry_every;
                        return;
                    }
                }
            }
            let mut spool = self.spool.lock().expect("lock");
            let advanced = spool.advance(offset);
            if advanced.is_ok() {
                self.metrics.set_spool_bytes(spool.pending_bytes());
            }
            // Counted once the spool says so too: whoever sees the records
            // replayed sees their bytes gone from the spool.
            self.metrics.replayed(replayed);
            self.metrics.written(replayed);
            if let Err(e) = advanced {
                tracing::error!(error = %e, "audit: cannot record replay progress");
                *retry_at = tokio::time::Instant::now() + self.options.retry_every;
                return;
            }
            if !spool.pending() {
                tracing::info!("audit: spool replayed; writing to the database again");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migrated SQLite database in a directory of its own, made afresh:
    /// the directory, the file, the database.
    async fn sqlite(name: &str) -> (std::path::PathBuf, std::path::PathBuf, Database) {
        let dir = std::env::temp_dir().join(format!("sb-audit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("audit.db");
        let db = Database::connect(&format!("sqlite:{}?mode=rwc", file.display()), Duration::from_secs(5)).unwrap();
        db.migrate().await.unwrap();
        (dir, file, db)
    }

    /// A connection holding the file's write lock until it commits.
    fn locked(file: &Path) -> rusqlite::Connection {
        let lock = rusqlite::Connection::open(file).unwrap();
        lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
        lock
    }

    /// A writer's options for a database held locked: it waits for the
    /// lock rather than spool.
    fn behind_a_lock(queue: usize) -> Options {
        Options {
            queue,
            batch: 50,
            write_timeout: Duration::from_secs(20),
            retry_every: Duration::from_millis(50),
            flush_every: Duration::from_millis(10),
        }
    }

    /// A spool stuck behind a record the database refuses (as a NUL once
    /// held up PostgreSQL's): on start, its replay writes the records around
    /// that one and sets that one aside, and the spool empties.
    #[tokio::test]
    async fn a_spooled_record_the_database_refuses_is_set_aside_and_the_rest_replayed() {
        let (dir, file, db) = sqlite("refused").await;
        rusqlite::Connection::open(&file)
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER no_poison BEFORE INSERT ON audit_log WHEN NEW.target = 'poison' \
                 BEGIN SELECT RAISE(ABORT, 'no poison'); END",
            )
            .unwrap();
        let spool_path = dir.join("audit.spool");
        let mut records: Vec<AuditRecord> = (0..7).map(spool::tests::record).collect();
        records[2].target = Some("poison".into());
        Spool::open(&spool_path).unwrap().append_durably(&records).unwrap();

        let metrics = Arc::new(Metrics::new(&switchboard_core::metrics::Registry::new()));
        let options = Options {
            queue: 16,
            batch: 100,
            write_timeout: Duration::from_secs(5),
            retry_every: Duration::from_millis(50),
            flush_every: Duration::from_millis(10),
        };
        let audit = Audit::start(db.clone(), &spool_path, options, metrics.clone()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while db.count_audit(Some("t")).await.unwrap() < 6 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        audit.close(Duration::from_secs(5)).await;
        assert_eq!(db.count_audit(Some("t")).await.unwrap(), 6, "the six others written");
        let rejected = std::fs::read_to_string(rejected_path(&spool_path)).unwrap();
        let rejected: Vec<AuditRecord> = rejected.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rejected, [records[2].clone()]);
        assert!(!Spool::open(&spool_path).unwrap().pending(), "the spool emptied");
        let count = |event: &str| metrics.count(event);
        assert_eq!((count("replayed"), count("rejected"), count("lost")), (6, 1, 0));
        // Halves [0, 3) and [3, 7); of the first, [0, 1) and [1, 3); of that,
        // [1, 2) and [2, 3), refused: three parts written, each a batch.
        assert_eq!((metrics.batches("paced"), metrics.batches("at_once")), (3, 0));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A writer with a whole batch more waiting writes at once; one keeping
    /// up, paced. The database is held locked while records queue up behind
    /// the writer's first write, then let go.
    #[tokio::test]
    async fn a_writer_behind_writes_at_once_and_one_keeping_up_paced() {
        let (dir, file, db) = sqlite("behind").await;
        let lock = locked(&file);

        let metrics = Arc::new(Metrics::new(&switchboard_core::metrics::Registry::new()));
        let audit = Audit::start(db.clone(), &dir.join("audit.spool"), behind_a_lock(1000), metrics.clone()).unwrap();
        let wait_for = async |n: i64| {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while db.count_audit(Some("t")).await.unwrap() < n && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(db.count_audit(Some("t")).await.unwrap(), n);
        };
        // The first write waits for the lock; 150 more queue up behind it.
        audit.record(spool::tests::record(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
        for i in 1..=150 {
            audit.record(spool::tests::record(i));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        lock.execute_batch("COMMIT").unwrap();
        wait_for(151).await;
        let at_once = metrics.batches("at_once");
        assert!(at_once >= 1, "a batch written with a whole batch more waiting is written at once");
        // Then a few at a time: the writer keeps up.
        let paced = metrics.batches("paced");
        for i in 151..154 {
            audit.record(spool::tests::record(i));
            wait_for(i as i64 + 1).await;
        }
        assert_eq!((metrics.batches("paced") - paced, metrics.batches("at_once")), (3, at_once));
        audit.close(Duration::from_secs(5)).await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Requests that spool their own records (the queue full, the writer
    /// stuck behind a locked database) never sync the spool themselves: a
    /// sync already asked for covers every record appended before it begins,
    /// on a blocking thread, and every record is synced and, once the
    /// database is back, written once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_the_requests_spool_are_synced_together_off_their_threads() {
        let (dir, file, db) = sqlite("overflow").await;
        let lock = locked(&file);
        let metrics = Arc::new(Metrics::new(&switchboard_core::metrics::Registry::new()));
        let audit = Audit::start(db.clone(), &dir.join("audit.spool"), behind_a_lock(1), metrics.clone()).unwrap();
        let (spool, syncs) = (audit.sink.spool.clone(), audit.sink.syncs.clone());
        // The writer takes the first record and waits for the lock.
        audit.record(spool::tests::record(0));
        tokio::time::sleep(Duration::from_millis(100)).await;

        // As if a sync were asked for and had not begun: 300 records spooled
        // by the requests are left to it.
        syncs.asked.store(true, Ordering::SeqCst);
        for i in 1..=300 {
            audit.record(spool::tests::record(i));
        }
        assert!(metrics.count("overflow") >= 299, "the queue of one was full: {}", metrics.count("overflow"));
        assert_eq!(spool.lock().unwrap().syncs(), 0, "no request synced the spool");
        // The sync begins: the next record spooled asks for none, and the
        // one sync covers them all.
        syncs.asked.store(false, Ordering::SeqCst);
        audit.record(spool::tests::record(301));
        let synced = || {
            let spool = spool.lock().unwrap();
            (spool.syncs(), spool.unsynced_records())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while synced() != (1, 0) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(synced(), (1, 0), "(syncs, records not synced): one sync for the 301");

        // The database back: each record written once.
        lock.execute_batch("COMMIT").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while db.count_audit(Some("t")).await.unwrap() < 302 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        audit.close(Duration::from_secs(5)).await;
        assert_eq!(db.count_audit(Some("t")).await.unwrap(), 302);
        assert_eq!(metrics.count("lost"), 0);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// However long the writer gathers (`flush_every`: an hour here), the
    /// records the requests spool are synced within about a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_the_requests_spool_are_synced_within_a_second_whatever_flush_every() {
        let (dir, _, db) = sqlite("slow-flush").await;
        let metrics = Arc::new(Metrics::new(&switchboard_core::metrics::Registry::new()));
        let options = Options { flush_every: Duration::from_secs(3600), ..behind_a_lock(1) };
        let audit = Audit::start(db.clone(), &dir.join("audit.spool"), options, metrics.clone()).unwrap();
        // The writer gathers the first; the second fills the queue of one;
        // the others are spooled by the requests.
        for i in 0..5 {
            audit.record(spool::tests::record(i));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(metrics.count("overflow"), 3);
        let synced = || {
            let spool = audit.sink.spool.lock().unwrap();
            (spool.syncs(), spool.unsynced_records())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while synced() != (1, 0) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(synced(), (1, 0), "(syncs, records not synced)");
        audit.close(Duration::from_secs(5)).await;
        assert_eq!(db.count_audit(Some("t")).await.unwrap(), 5, "each record written once, in the end");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A record made after the writer stopped (a request finished after
    /// shutdown's drain) is spooled and synced before `record` returns, for
    /// the next start to replay: no sync would follow it.
    #[tokio::test]
    async fn a_record_made_after_the_writer_stopped_is_spooled_and_synced_at_once() {
        let (dir, _, db) = sqlite("stopped").await;
        let metrics = Arc::new(Metrics::new(&switchboard_core::metrics::Registry::new()));
        let audit = Audit::start(db.clone(), &dir.join("audit.spool"), behind_a_lock(16), metrics.clone()).unwrap();
        audit.close(Duration::from_secs(5)).await;
        audit.record(spool::tests::record(7));
        {
            let mut spool = audit.sink.spool.lock().unwrap();
            assert_eq!((spool.syncs(), spool.unsynced_records()), (1, 0), "(syncs, records not synced)");
            let (waiting, _, _) = spool.peek(10).unwrap();
            assert_eq!(waiting.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r7"]);
        }
        assert_eq!((metrics.count("spooled"), metrics.count("lost")), (1, 0));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn ids_are_the_process_then_the_counter_in_hex() {
        let ids = Ids::new();
        ids.counter.store(0x0123_4567_89ab_cdef, Ordering::Relaxed);
        let id = ids.next();
        assert_eq!(id.len(), 32);
        assert_eq!(&id[..16], ids.process);
        assert_eq!(&id[16..], "0123456789abcdef");
        assert_eq!(&ids.next()[16..], "0123456789abcdf0");
    }

    #[test]
    fn a_record_without_an_id_is_given_one_and_one_with_an_id_keeps_it() {
        let ids = Ids::new();
        let record = |id: &str| AuditRecord { id: id.into(), ..spool::tests::record(0) };
        let (a, b) = (ids.stamp(record("")).id, ids.stamp(record("")).id);
        assert_eq!((a.len(), b.len()), (32, 32));
        assert_ne!(a, b);
        assert_eq!(ids.stamp(record("pin-1")).id, "pin-1");
    }
}
