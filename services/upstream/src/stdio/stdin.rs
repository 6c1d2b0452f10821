//! A stdio child's stdin: one queue every session writes to, bounded in
//! bytes (a child that stops reading makes requests fail at once instead of
//! the router's memory grow), and the task that writes it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

use crate::UpstreamError;

pub(super) async fn write_stdin(mut stdin: ChildStdin, mut queue: StdinQueue) {
    while let Some(line) = queue.rx.recv().await {
        let written = stdin.write_all(&line).await;
        queue.written(line.len());
        if written.is_err() || (queue.rx.is_empty() && stdin.flush().await.is_err()) {
            return;
        }
    }
    let _ = stdin.shutdown().await;
}

/// The sending side of the child's stdin, shared by every session: unbounded
/// in messages (senders never wait) but bounded in bytes, so a child that
/// stops reading makes requests fail instead of the router's memory grow.
#[derive(Clone)]
pub(super) struct Stdin {
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<AtomicUsize>,
    limit: usize,
}

/// The writer task's side.
pub(super) struct StdinQueue {
    rx: mpsc::UnboundedReceiver<Bytes>,
    queued: Arc<AtomicUsize>,
}

impl Stdin {
    pub(super) fn new(limit: usize) -> (Stdin, StdinQueue) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        (Stdin { tx, queued: queued.clone(), limit }, StdinQueue { rx, queued })
    }

    pub(super) fn send(&self, line: Bytes) -> Result<(), UpstreamError> {
        let len = line.len();
        let before = self.queued.fetch_add(len, Ordering::Relaxed);
        if before > 0 && before + len > self.limit {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return Err(UpstreamError::Down(format!("the process is not reading its stdin ({before} bytes queued)")));
        }
        self.tx.send(line).map_err(|_| {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            UpstreamError::Closed
        })
    }
}

impl StdinQueue {
    fn written(&self, len: usize) {
        self.queued.fetch_sub(len, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_stops_reading_gets_a_bounded_backlog() {
        let (stdin, mut queue) = Stdin::new(100);
        // One message always goes, however large.
        stdin.send(Bytes::from(vec![b'x'; 150])).unwrap();
        let refused = stdin.send(Bytes::from_static(b"{}\n")).unwrap_err();
        assert!(refused.to_string().contains("not reading its stdin (150 bytes queued)"), "{refused}");
        // The writer catches up: room again.
        let line = queue.rx.try_recv().unwrap();
        queue.written(line.len());
        for _ in 0..3 {
            stdin.send(Bytes::from(vec![b'y'; 30])).unwrap();
        }
        assert!(stdin.send(Bytes::from(vec![b'y'; 30])).is_err(), "90 + 30 is over 100");
        assert_eq!(queue.queued.load(Ordering::Relaxed), 90, "refused bytes are not counted");
        drop(queue);
        assert!(matches!(stdin.send(Bytes::from_static(b"{}\n")), Err(UpstreamError::Closed)));
        assert_eq!(stdin.queued.load(Ordering::Relaxed), 90);
    }
}
