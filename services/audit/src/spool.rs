//! The spool: an append-only file of audit records (one JSON object per
//! line) kept while the database is unreachable, and replayed in order when
//! it returns. A sidecar file holds how far replay got, so a restart resumes
//! there; records carry their own ids and the database skips ids it has, so
//! a batch replayed twice after a crash is still written once.
//!
//! Must never lose a record it accepted: appends are flushed to disk
//! (`fsync`) before `append` returns.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use switchboard_db::AuditRecord;

pub struct Spool {
    path: PathBuf,
    offset_path: PathBuf,
    file: File,
    /// Bytes of the file already replayed.
    offset: u64,
    /// Bytes in the file.
    len: u64,
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
        Ok(Spool { path: path.to_owned(), offset_path, file, offset: offset.min(len), len })
    }

    /// Whether records wait for replay.
    pub fn pending(&self) -> bool {
        self.offset < self.len
    }

    /// Bytes waiting for replay.
    pub fn pending_bytes(&self) -> u64 {
        self.len - self.offset
    }

    /// Appends records, durably.
    pub fn append(&mut self, records: &[AuditRecord]) -> std::io::Result<()> {
        let buf = lines(records);
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.len += buf.len() as u64;
        Ok(())
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
        spool.append(&(0..5).map(record).collect::<Vec<_>>()).unwrap();
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
