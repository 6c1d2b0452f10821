//! Resumable SSE streams: every event the router sends a client is kept, for
//! a while, in the log of the stream it belongs to, so that a client that
//! reconnects with `Last-Event-ID` gets what it missed.
//!
//! A session has stream 0 (its GET stream) and one stream per request
//! answered as SSE. Event ids are `STREAM-SEQ`, unique in the session. A
//! reader ([`Log::reader`]) sends a log's events from a position onwards to
//! one HTTP response, and ends when the log closes (the request was answered)
//! or is *cut*: the router ends the response but keeps the log going, as
//! when an upstream ends its stream early (2025-11-25 SSE polling) and the
//! client is expected to come back with `Last-Event-ID`.
//!
//! Logs are bounded (events and bytes). To make room, events a reader has
//! sent are dropped first (a client resuming from before them gets what is
//! left); events no reader has sent yet are never dropped: a relayed
//! message that does not fit is refused ([`Log::offer`] says so, and the
//! caller tells the upstream or counts the loss), while the answer that
//! ends a stream ([`Log::push`]) is always kept.
//!
//! A log can be *spilled* ([`Log::spill`]) into the streams shared by every
//! replica (`shared_streams.rs`): what it keeps and every later event are
//! copied there, so that the client resumes the stream at any replica.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use switchboard_protocol::sse::{self, EventId};
use tokio::sync::{mpsc, Notify};

use crate::shared_streams::SharedStreams;

/// Events kept per stream.
const MAX_EVENTS: usize = 512;
/// Bytes kept per stream.
const MAX_BYTES: usize = 4 << 20;

/// One stream's events.
pub struct Log {
    /// The stream number within its session.
    pub stream: u64,
    state: Mutex<State>,
    changed: Notify,
}

struct State {
    events: VecDeque<(u64, Bytes)>,
    bytes: usize,
    next: u64,
    closed: bool,
    /// Bumped by [`Log::cut`]; readers started before a cut end at it.
    cuts: u64,
    /// The highest sequence number a reader has sent.
    delivered: Option<u64>,
    /// Readers running now.
    readers: usize,
    /// Where every event is copied once the log is spilled: the shared
    /// streams and the session's id.
    mirror: Option<(Arc<SharedStreams>, Arc<str>)>,
}

impl Log {
    /// An empty, open log.
    pub fn new(stream: u64) -> Arc<Log> {
        Arc::new(Log {
            stream,
            state: Mutex::new(State {
                events: VecDeque::new(),
                bytes: 0,
                next: 0,
                closed: false,
                cuts: 0,
                delivered: None,
                readers: 0,
                mirror: None,
            }),
            changed: Notify::new(),
        })
    }

    /// A log that goes on with an existing stream of this session from
    /// `next` (another replica's, which this one continues).
    pub fn continuing(stream: u64, next: u64) -> Arc<Log> {
        let log = Log::new(stream);
        log.state.lock().expect("lock").next = next;
        log
    }

    /// Appends one message as an event with the next id, whatever the
    /// backlog (the answer or error that ends a stream: one per stream),
    /// up to a hard ceiling of twice the usual bounds: `false` beyond it (a
    /// legacy client, whose every answer comes on its one stream, that
    /// reads none of them).
    pub fn push(&self, message: &[u8]) -> bool {
        self.append(None, message, None, false)
    }

    /// Appends a message relayed from an upstream, if it fits: `false` if
    /// the log is full of events no reader has sent yet (the client is not
    /// reading, or not fast enough), or closed. `resume_point` is where the
    /// upstream could resume its stream after this message: copied with
    /// the event, so that another replica can continue the stream there.
    #[must_use]
    pub fn offer(&self, message: &[u8], resume_point: Option<&str>) -> bool {
        self.append(None, message, resume_point, true)
    }

    /// Whether the log is copied to the shared streams.
    pub fn is_spilled(&self) -> bool {
        self.state.lock().expect("lock").mirror.is_some()
    }

    /// Records where the stream's events come from (an upstream's stream,
    /// as JSON), with the spilled copy, for a replica that continues it.
    pub fn set_origin(&self, origin: String) {
        let state = self.state.lock().expect("lock");
        if let Some((shared, session)) = &state.mirror {
            shared.set_origin(session, self.stream, origin);
        }
    }

    /// Appends the priming event: an id, a `retry:` hint and empty data, so a
    /// client has something to resume from before the first real event.
    pub fn prime(&self, retry: Duration) {
        self.append(Some(retry), b"", None, false);
    }

    fn append(&self, retry: Option<Duration>, data: &[u8], resume_point: Option<&str>, refusable: bool) -> bool {
        {
            let mut state = self.state.lock().expect("lock");
            if state.closed {
                return false;
            }
            let seq = state.next;
            let event =
                sse::encode_with_id(EventId { stream: self.stream, seq }, retry.map(|r| r.as_millis() as u64), data);
            // Room is made from events already sent; unsent ones stay.
            let fits =
                |s: &State| s.events.len() < MAX_EVENTS && (s.bytes + event.len() <= MAX_BYTES || s.events.is_empty());
            while !fits(&state)
                && state.events.front().is_some_and(|(seq, _)| state.delivered.is_some_and(|d| *seq <= d))
            {
                if let Some((_, old)) = state.events.pop_front() {
                    state.bytes -= old.len();
                }
            }
            if refusable && !fits(&state) {
                return false;
            }
            if state.events.len() >= 2 * MAX_EVENTS || state.bytes + event.len() > 2 * MAX_BYTES {
                return false;
            }
            state.next += 1;
            if let Some((shared, session)) = &state.mirror {
                shared.spill(session, self.stream, seq, event.clone(), resume_point);
            }
            state.bytes += event.len();
            state.events.push_back((seq, event));
        }
        self.changed.notify_waiters();
        true
    }

    /// No more events will come.
    pub fn close(&self) {
        {
            let mut state = self.state.lock().expect("lock");
            if !state.closed {
                if let Some((shared, session)) = &state.mirror {
                    shared.spill_closed(session, self.stream);
                }
            }
            state.closed = true;
        }
        self.changed.notify_waiters();
    }

    /// Copies the log into the shared streams, the events it keeps now and
    /// every later one (in order: under the log's lock), so that a client
    /// can resume it at another replica. Once is enough.
    pub fn spill(&self, shared: &Arc<SharedStreams>, session: &Arc<str>) {
        let mut state = self.state.lock().expect("lock");
        if state.mirror.is_some() {
            return;
        }
        for (seq, event) in &state.events {
            shared.spill(session, self.stream, *seq, event.clone(), None);
        }
        if state.closed {
            shared.spill_closed(session, self.stream);
        }
        state.mirror = Some((shared.clone(), session.clone()));
    }

    /// Whether no more events will come.
    pub fn is_closed(&self) -> bool {
        self.state.lock().expect("lock").closed
    }

    /// Ends the responses reading this log now; later readers go on.
    pub fn cut(&self) {
        self.state.lock().expect("lock").cuts += 1;
        self.changed.notify_waiters();
    }

    /// Closed, with every event sent to a client: nothing left to replay.
    pub fn finished(&self) -> bool {
        let state = self.state.lock().expect("lock");
        state.closed && state.delivered.map_or(state.next == 0, |d| d + 1 >= state.next)
    }

    /// Whether a reader is sending this log to a client now.
    pub fn has_readers(&self) -> bool {
        self.state.lock().expect("lock").readers > 0
    }

    /// Where a new reader without `Last-Event-ID` starts: after everything a
    /// reader already sent.
    pub fn undelivered(&self) -> Option<u64> {
        self.state.lock().expect("lock").delivered
    }

    /// Sends the events after `after` (all of them for `None`) into `tx` until
    /// the log closes or is cut, or the receiver goes away. Spawn the future
    /// it returns; it belongs to the cuts made after this call.
    pub fn reader(self: Arc<Self>, after: Option<u64>, tx: mpsc::Sender<Bytes>) -> impl Future<Output = ()> + Send {
        let cuts = {
            let mut state = self.state.lock().expect("lock");
            state.readers += 1;
            state.cuts
        };
        let counted = ReaderCount(self.clone());
        async move {
            self.read(cuts, after, tx).await;
            drop(counted);
        }
    }

    async fn read(self: Arc<Self>, cuts: u64, mut after: Option<u64>, tx: mpsc::Sender<Bytes>) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (batch, done) = {
                let state = self.state.lock().expect("lock");
                let batch: Vec<(u64, Bytes)> =
                    state.events.iter().filter(|(seq, _)| after.is_none_or(|a| *seq > a)).cloned().collect();
                (batch, state.closed || state.cuts != cuts)
            };
            for (seq, event) in batch {
                if tx.send(event).await.is_err() {
                    return;
                }
                after = Some(seq);
                let mut state = self.state.lock().expect("lock");
                state.delivered = Some(state.delivered.map_or(seq, |d| d.max(seq)));
            }
            if done {
                return;
            }
            tokio::select! {
                () = &mut changed => {}
                () = tx.closed() => return,
            }
        }
    }
}

/// Counts a reader from its creation to its end, however it ends.
struct ReaderCount(Arc<Log>);

impl Drop for ReaderCount {
    fn drop(&mut self) {
        self.0.state.lock().expect("lock").readers -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_protocol::sse::Decoder;

    async fn drain(log: Arc<Log>, after: Option<u64>) -> Vec<(String, Bytes)> {
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(log.reader(after, tx));
        let mut decoder = Decoder::new(usize::MAX);
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            decoder.push(&chunk);
            while let Some(event) = decoder.next_event().unwrap() {
                out.push((event.id.unwrap_or_default(), event.data));
            }
        }
        task.await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_reader_gets_everything_then_ends_when_the_log_closes() {
        let log = Log::new(3);
        log.prime(Duration::from_millis(500));
        log.push(b"{\"a\":1}");
        let reader = tokio::spawn(drain(log.clone(), None));
        tokio::task::yield_now().await;
        log.push(b"{\"b\":2}");
        log.close();
        let got = reader.await.unwrap();
        let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["3-0", "3-1", "3-2"]);
        assert!(got[0].1.is_empty(), "the priming event has empty data");
        assert_eq!(&got[2].1[..], b"{\"b\":2}");
    }

    #[tokio::test]
    async fn resuming_after_an_id_replays_only_what_follows() {
        let log = Log::new(1);
        for i in 0..5 {
            log.push(format!("{{\"n\":{i}}}").as_bytes());
        }
        log.close();
        let id = EventId::parse("1-2").unwrap();
        assert_eq!(id.stream, 1);
        let got = drain(log, Some(id.seq)).await;
        assert_eq!(got.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["1-3", "1-4"]);
    }

    #[tokio::test]
    async fn a_cut_ends_current_readers_but_not_later_ones() {
        let log = Log::new(2);
        log.push(b"1");
        let first = tokio::spawn(drain(log.clone(), None));
        tokio::task::yield_now().await;
        log.cut();
        let got = first.await.unwrap();
        assert_eq!(got.len(), 1);
        log.push(b"2");
        log.close();
        let resumed = drain(log.clone(), Some(0)).await;
        assert_eq!(resumed.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["2-1"]);
        assert_eq!(log.undelivered(), Some(1));
    }

    #[test]
    fn answers_are_kept_up_to_a_hard_ceiling() {
        let log = Log::new(0);
        let kept = (0..3 * MAX_EVENTS).filter(|_| log.push(b"answer")).count();
        assert_eq!(kept, 2 * MAX_EVENTS, "twice the usual bound, then refused");
    }

    #[tokio::test]
    async fn logs_are_bounded_and_never_drop_what_no_reader_has_sent() {
        let log = Log::new(0);
        for _ in 0..MAX_EVENTS {
            assert!(log.offer(b"x", None));
        }
        // Full of events nobody has read: the next relayed message is
        // refused, not slipped in by dropping an unread one.
        assert!(!log.offer(b"y", None));
        assert_eq!(log.state.lock().unwrap().events.front().unwrap().0, 0);
        // The answer that ends a stream is kept all the same.
        log.push(b"answer");
        assert_eq!(log.state.lock().unwrap().events.len(), MAX_EVENTS + 1);
        // Once a reader has sent them, sent events make room (oldest first).
        let (tx, mut rx) = mpsc::channel(2 * MAX_EVENTS);
        let reader = tokio::spawn(log.clone().reader(None, tx));
        for _ in 0..=MAX_EVENTS {
            rx.recv().await.unwrap();
        }
        for _ in 0..10 {
            assert!(log.offer(b"z", None));
        }
        {
            let state = log.state.lock().unwrap();
            assert_eq!(state.events.len(), MAX_EVENTS);
            assert_eq!(state.events.front().unwrap().0, 11, "513 sent, 10 more: the 11 oldest went");
        }
        log.close();
        for _ in 0..10 {
            rx.recv().await.unwrap();
        }
        reader.await.unwrap();
        assert!(!log.offer(b"late", None), "a closed log takes nothing");
    }
}
