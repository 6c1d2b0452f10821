//! The spool: an append-only file of audit records (one JSON object per
//! line) kept while the database is unreachable, and replayed in order when
//! it returns. A sidecar file holds how far replay got, so a restart resumes
//! there; records carry their own ids and the database skips ids it has, so
//! a batch replayed twice after a crash is still written once.
//!
//! Must never lose a record it accepted. An append is written to the file
//! at once (from then on a crash of the router loses nothing: the records
//! are the kernel's), and made durable (`fsync`) apart from the append,
//! with the spool's lock let go: [`Spool::unsynced`] hands out what is not
//! yet on disk, and one sync covers every record appended before it. The
//! writer syncs its own appends; the records the requests spool themselves
//! (the queue full) are synced by a blocking task, together (the audit
//! crate's `Syncs`): synced one by one, on the requests' threads, under the
//! lock, the requests of a router whose writer was held up waited for the
//! disk in turn (5,000 calls a second instead of about 30,000, here:
//! `loadtest/spooling`).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchboard_db::AuditRecord;

pub struct Spool {
    path: PathBuf,
    offset_path: PathBuf,
    /// Shared with the syncs made outside the lock ([`Unsynced`]).
    file: Arc<File>,
    /// Bytes of the file already replayed.
    offset: u64,
    /// Bytes in the file.
    len: u64,
    /// Records appended and not yet handed out to be synced.
    unsynced: usize,
    /// Syncs handed out (for the tests: one covers many records).
    syncs: u64,
}

/// Records written to the spool and not yet on disk: [`Unsynced::sync`]
/// puts them there, without the spool's lock.
#[must_use = "the records are not on disk until synced"]
pub struct Unsynced {
    file: Arc<File>,
    /// How many.
    pub records: usize,
}

impl Unsynced {
    pub fn sync(self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

impl Spool {
    /// Opens (or creates) the spool at `path`, resuming an earlier replay.
    pub fn open(path: &Path) -> std::io::Result<Spool> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).read(true).append(true).open(path)?;
        let len = file.metadata()?.len();
        let offset_path = path.with_extension("offset");
        let offset = std::fs::read_to_string(&offset_path).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        Ok(Spool {
            path: path.to_owned(),
            offset_path,
            file: Arc::new(file),
            offset: offset.min(len),
            len,
            unsynced: 0,
            syncs: 0,
        })
    }

    /// Whether records wait for replay.
    pub fn pending(&self) -> bool {
        self.offset < self.len
    }

    /// Bytes waiting for replay.
    pub fn pending_bytes(&self) -> u64 {
        self.len - self.offset
    }

    /// Appends records to the file; durable once [`Spool::unsynced`]'s
    /// sync has been made.
    pub fn append(&mut self, records: &[AuditRecord]) -> std::io::Result<()> {
        let buf = lines(records);
        (&*self.file).write_all(&buf)?;
        self.len += buf.len() as u64;
        self.unsynced += records.len();
        Ok(())
    }

    /// The records appended since the last call, to be synced (outside the
    /// lock); `None` when there are none.
    pub fn unsynced(&mut self) -> Option<Unsynced> {
        if self.unsynced == 0 {
            return None;
        }
        self.syncs += 1;
        Some(Unsynced { file: self.file.clone(), records: std::mem::take(&mut self.unsynced) })
    }

    /// Appends records and syncs them.
    #[cfg(test)]
    pub(crate) fn append_durably(&mut self, records: &[AuditRecord]) -> std::io::Result<()> {
        self.append(records)?;
        self.unsynced().map_or(Ok(()), Unsynced::sync)
    }

    /// Syncs handed out so far.
    #[cfg(test)]
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Records appended and not yet handed out to be synced.
    #[cfg(test)]
    pub(crate) fn unsynced_records(&self) -> usize {
        self.unsynced
    }

    /// Up to `max` records from where replay stands, and the offset after
    /// them. Lines that do not parse (a write cut short by a crash) are
    /// skipped and counted in the third value.
    pub fn peek(&mut self, max: usize) -> std::io::Result<(Vec<AuditRecord>, u64, usize)> {
        let mut reader = BufReader::new(File::open(&self.path)?);
        reader.seek(SeekFrom::Start(self.offset))?;
        let mut out = Vec::new();
        let mut offset = self.offset;
        let mut corrupt = 0;
        let mut line = Vec::new();
        while out.len() < max && offset < self.len {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') && offset + n as u64 >= self.len {
                // A partial last line: only possible after a crash mid-append.
                corrupt += 1;
                offset += n as u64;
                break;
            }
            offset += n as u64;
            match serde_json::from_slice::<AuditRecord>(&line) {
                Ok(r) => out.push(r),
                Err(_) => corrupt += 1,
            }
        }
        Ok((out, offset, corrupt))
    }

    /// Marks everything before `offset` as written to the database. When all
    /// is written the spool is emptied.
    pub fn advance(&mut self, offset: u64) -> std::io::Result<()> {
        self.offset = offset.min(self.len);
        if self.offset == self.len {
            self.file.set_len(0)?;
            self.file.sync_data()?;
            self.len = 0;
            self.offset = 0;
            match std::fs::remove_file(&self.offset_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            return Ok(());
        }
        let tmp = self.offset_path.with_extension("offset.tmp");
        std::fs::write(&tmp, self.offset.to_string())?;
        File::open(&tmp)?.sync_data()?;
        std::fs::rename(&tmp, &self.offset_path)
    }
}

/// Records as the spool holds them: one JSON object per line.
fn lines<'r>(records: impl IntoIterator<Item = &'r AuditRecord>) -> Vec<u8> {
    let records = records.into_iter();
    let mut buf = Vec::with_capacity(records.size_hint().0 * 256);
    for r in records {
        serde_json::to_writer(&mut buf, r).expect("serializable");
        buf.push(b'\n');
    }
    buf
}

/// Appends records the database refused to `path` (created if need be), in
/// the spool's format, durably: kept for the operator, never replayed by the
/// router. Appended to the spool of a stopped router, once what made the
/// database refuse them is fixed, they are replayed when it starts.
pub fn set_aside<'r>(path: &Path, records: impl IntoIterator<Item = &'r AuditRecord>) -> std::io::Result<()> {
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(&lines(records))?;
    file.sync_data()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record with id `r{i}`.
    pub(crate) fn record(i: usize) -> AuditRecord {
        AuditRecord {
            id: format!("r{i}"),
            at_ms: i as i64,
            tenant: Some("t".into()),
            key_prefix: None,
            session: None,
            method: "tools/call".into(),
            target: Some("x".into()),
            upstream: None,
            outcome: "ok".into(),
            error_code: None,
            latency_us: 1,
            request_bytes: 2,
            response_bytes: 3,
            trace_id: None,
            arguments: None,
            user: None,
        }
    }

    #[test]
    fn records_come_back_in_order_across_reopen() {
        let dir = std::env::temp_dir().join(format!("sb-spool-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("audit.spool");
        let mut spool = Spool::open(&path).unwrap();
        assert!(!spool.pending());
        spool.append_durably(&(0..5).map(record).collect::<Vec<_>>()).unwrap();
        let (first, offset, corrupt) = spool.peek(2).unwrap();
        assert_eq!((first.len(), corrupt), (2, 0));
        assert_eq!(first[1].id, "r1");
        spool.advance(offset).unwrap();
        drop(spool);

        // Reopened (a restart), with a torn last line from a crash.
        OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"id\":\"tor").unwrap();
        let mut spool = Spool::open(&path).unwrap();
        let (rest, offset, corrupt) = spool.peek(100).unwrap();
        assert_eq!(rest.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r2", "r3", "r4"]);
        assert_eq!(corrupt, 1);
        spool.advance(offset).unwrap();
        assert!(!spool.pending());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
