//! Answers that come on the wrong stream. A server may take the session's
//! GET stream for a call's reconnection (2025-11-25 SSE polling) and send
//! the call's response there rather than on the stream resumed with
//! `Last-Event-ID`: a client matches responses by id whatever stream they
//! come on, so the router must too. A call of an upstream session whose
//! answer is an SSE stream waits on both ([`Answerable`]), registered
//! even before the GET stream opens (it may open while the call runs);
//! the GET stream hands a response to the call with its id ([`Elsewhere::take`]).
//!
//! Nothing here is on the path of a call answered with JSON: only SSE
//! answers register, and only responses on the GET stream are looked at.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::{Item, MessageStream, UpstreamError};

/// How many responses the GET stream brought before their call waited
/// for them (the call's own answer was still on its way) are kept, how
/// large each may be, and for how long: a narrow race, so little is kept.
const EARLY_KEPT: usize = 4;
const EARLY_MAX_BYTES: usize = 64 << 10;
const EARLY_FOR: Duration = Duration::from_secs(2);

/// How long a call whose own stream ended without its response still
/// waits for it on the GET stream.
const GRACE: Duration = Duration::from_secs(1);

/// The calls of one channel waiting for an answer that may come on the
/// GET stream, and the responses it brought that no call waited for yet.
#[derive(Default)]
pub(super) struct Elsewhere {
    inner: Mutex<Waiting>,
    /// Whether the channel's GET stream is kept open.
    listening: AtomicBool,
}

#[derive(Default)]
struct Waiting {
    /// (id as sent, registration, where the response goes)
    calls: Vec<(Box<[u8]>, u64, oneshot::Sender<Bytes>)>,
    next: u64,
    early: VecDeque<(Box<[u8]>, Bytes, Instant)>,
}

impl Elsewhere {
    /// The channel keeps its GET stream open from now (`true`), or no
    /// longer.
    pub(super) fn listening(&self, listening: bool) {
        self.listening.store(listening, Ordering::Relaxed);
    }

    /// Registers a call with the id `id` (its JSON text), whose answer is
    /// `stream`: the stream returned also yields the call's response if
    /// the GET stream brings it (and then ends).
    pub(super) fn answerable(self: &Arc<Self>, id: &[u8], stream: Box<dyn MessageStream>) -> Box<dyn MessageStream> {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.inner.lock().expect("lock");
        waiting.forget_old();
        if let Some(at) = waiting.early.iter().position(|(early, ..)| &early[..] == id) {
            let (_, response, _) = waiting.early.remove(at).expect("present");
            let _ = tx.send(response);
            return Box::new(Answerable {
                stream,
                response: Some(rx),
                elsewhere: self.clone(),
                token: None,
                done: false,
            });
        }
        let token = waiting.next;
        waiting.next += 1;
        waiting.calls.push((id.into(), token, tx));
        drop(waiting);
        Box::new(Answerable { stream, response: Some(rx), elsewhere: self.clone(), token: Some(token), done: false })
    }

    /// Takes a response the GET stream brought, with its id: handed to
    /// the call waiting for it, else kept a short while for a call about
    /// to wait (if small enough). Returns what is not kept: this response
    /// if neither, and kept ones it pushed out or that waited too long,
    /// for the inbox (which counts them as strays).
    pub(super) fn take(&self, id: &[u8], response: Bytes) -> Vec<Bytes> {
        let mut waiting = self.inner.lock().expect("lock");
        let mut response = Some(response);
        while let Some(at) = waiting.calls.iter().position(|(call, ..)| &call[..] == id) {
            let (_, _, tx) = waiting.calls.swap_remove(at);
            match tx.send(response.take().expect("kept until sent")) {
                Ok(()) => return Vec::new(),
                // That call was given up on meanwhile: try another.
                Err(back) => response = Some(back),
            }
        }
        let response = response.expect("not sent");
        let mut strays = waiting.forget_old();
        if response.len() > EARLY_MAX_BYTES {
            strays.push(response);
            return strays;
        }
        if waiting.early.len() == EARLY_KEPT {
            strays.extend(waiting.early.pop_front().map(|(_, r, _)| r));
        }
        waiting.early.push_back((id.into(), response, Instant::now()));
        strays
    }

    fn unregister(&self, token: u64) {
        let mut waiting = self.inner.lock().expect("lock");
        if let Some(at) = waiting.calls.iter().position(|(_, t, _)| *t == token) {
            waiting.calls.swap_remove(at);
        }
    }
}

impl Waiting {
    /// Drops kept responses older than [`EARLY_FOR`]; returns them.
    fn forget_old(&mut self) -> Vec<Bytes> {
        let mut old = Vec::new();
        while self.early.front().is_some_and(|(_, _, at)| at.elapsed() > EARLY_FOR) {
            old.extend(self.early.pop_front().map(|(_, r, _)| r));
        }
        old
    }
}

/// A call's SSE answer that also yields the call's response if the GET
/// stream brings it: after the messages its own stream has ready, and
/// instead of whatever that stream was waiting for (a resumption that
/// would bring nothing more). The response is the last message.
struct Answerable {
    stream: Box<dyn MessageStream>,
    response: Option<oneshot::Receiver<Bytes>>,
    elsewhere: Arc<Elsewhere>,
    /// Its registration, undone when the stream is dropped.
    token: Option<u64>,
    done: bool,
}

impl Drop for Answerable {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.elsewhere.unregister(token);
        }
    }
}

/// What came first.
enum Next {
    Own(Option<Result<Item, UpstreamError>>),
    Answer(Result<Bytes, oneshot::error::RecvError>),
}

#[async_trait]
impl MessageStream for Answerable {
    async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>> {
        if self.done {
            return None;
        }
        let Some(response) = self.response.as_mut() else { return self.stream.next_item().await };
        let next = tokio::select! {
            biased;
            item = self.stream.next_item() => Next::Own(item),
            answer = &mut *response => Next::Answer(answer),
        };
        match next {
            // Ended without its response: the GET stream may still bring
            // it, a little later, if it is open (one it brought already
            // is taken whatever the wait).
            Next::Own(None) => {
                self.done = true;
                let wait = if self.elsewhere.listening.load(Ordering::Relaxed) { GRACE } else { Duration::ZERO };
                match tokio::time::timeout(wait, response).await {
                    Ok(Ok(answer)) => Some(Ok(Item::Message(answer))),
                    _ => None,
                }
            }
            // Its own stream's messages, pauses and errors, as they come.
            Next::Own(item) => item,
            Next::Answer(Ok(answer)) => {
                self.done = true;
                Some(Ok(Item::Message(answer)))
            }
            // Not registered any more (cannot happen while `token` is
            // held): its own stream alone.
            Next::Answer(Err(_)) => {
                self.response = None;
                self.stream.next_item().await
            }
        }
    }

    fn resume_point(&self) -> Option<&str> {
        self.stream.resume_point()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's own stream: these items, then the end (or, `silent`,
    /// nothing ever again: a resumption that brings nothing).
    struct Own {
        items: VecDeque<Item>,
        silent: bool,
    }

    #[async_trait]
    impl MessageStream for Own {
        async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>> {
            match self.items.pop_front() {
                Some(item) => Some(Ok(item)),
                None if self.silent => std::future::pending().await,
                None => None,
            }
        }
    }

    fn own(items: &[&'static str], silent: bool) -> Box<dyn MessageStream> {
        let items = items.iter().map(|m| Item::Message(Bytes::from_static(m.as_bytes()))).collect();
        Box::new(Own { items, silent })
    }

    async fn messages(mut stream: Box<dyn MessageStream>) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(item) = stream.next_item().await {
            if let Ok(Item::Message(m)) = item {
                out.push(String::from_utf8(m.to_vec()).unwrap());
            }
        }
        out
    }

    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":"c1","result":{}}"#;

    #[tokio::test(start_paused = true)]
    async fn a_response_on_the_get_stream_ends_its_calls_stream_after_what_that_had() {
        let elsewhere = Arc::new(Elsewhere::default());
        let stream = elsewhere.answerable(br#""c1""#, own(&["progress"], true));
        // Another call's id: not this call's, kept a while, nobody's.
        assert!(elsewhere.take(br#""c2""#, Bytes::from_static(b"other")).is_empty());
        assert!(elsewhere.take(br#""c1""#, Bytes::from_static(ANSWER.as_bytes())).is_empty());
        assert_eq!(messages(stream).await, ["progress", ANSWER]);
        // Once the call has its answer it waits no more: a second one with
        // its id is kept for nobody.
        assert!(elsewhere.inner.lock().unwrap().calls.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_calls_own_answer_still_wins_and_unregisters_it_once_dropped() {
        let elsewhere = Arc::new(Elsewhere::default());
        let stream = elsewhere.answerable(br#""c1""#, own(&["progress", ANSWER], true));
        let mut stream = stream;
        assert!(matches!(stream.next_item().await, Some(Ok(Item::Message(m))) if &m[..] == b"progress"));
        assert!(matches!(stream.next_item().await, Some(Ok(Item::Message(m))) if &m[..] == ANSWER.as_bytes()));
        drop(stream);
        assert!(elsewhere.inner.lock().unwrap().calls.is_empty(), "unregistered with its stream");
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_that_comes_before_its_call_waits_is_kept_a_short_while() {
        let elsewhere = Arc::new(Elsewhere::default());
        assert!(elsewhere.take(br#""c1""#, Bytes::from_static(ANSWER.as_bytes())).is_empty());
        let stream = elsewhere.answerable(br#""c1""#, own(&[], true));
        assert_eq!(messages(stream).await, [ANSWER]);
        // Too old: given back (for the inbox to count) the next time.
        assert!(elsewhere.take(br#""old""#, Bytes::from_static(b"old")).is_empty());
        tokio::time::advance(EARLY_FOR + Duration::from_millis(1)).await;
        let stray = elsewhere.take(br#""new""#, Bytes::from_static(b"new"));
        assert_eq!(stray, [Bytes::from_static(b"old")]);
        let stream = elsewhere.answerable(br#""old""#, own(&[], false));
        assert!(messages(stream).await.is_empty(), "forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn few_and_small_responses_are_kept() {
        let elsewhere = Elsewhere::default();
        for n in 0..EARLY_KEPT {
            assert!(elsewhere.take(format!("{n}").as_bytes(), Bytes::from(format!("r{n}"))).is_empty());
        }
        // One more pushes the oldest out.
        assert_eq!(elsewhere.take(b"9", Bytes::from_static(b"r9")), [Bytes::from_static(b"r0")]);
        // One too large is not kept at all.
        let large = Bytes::from(vec![b' '; EARLY_MAX_BYTES + 1]);
        assert_eq!(elsewhere.take(b"10", large.clone()), [large]);
        assert_eq!(elsewhere.inner.lock().unwrap().early.len(), EARLY_KEPT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_ends_without_its_answer_waits_a_little_for_it() {
        let elsewhere = Arc::new(Elsewhere::default());
        // No GET stream: nothing more can come, the stream ends at once.
        let started = Instant::now();
        assert!(messages(elsewhere.answerable(br#""c0""#, own(&[], false))).await.is_empty());
        assert_eq!(started.elapsed(), Duration::ZERO);
        elsewhere.listening(true);
        let stream = elsewhere.answerable(br#""c1""#, own(&[], false));
        let late = {
            let elsewhere = elsewhere.clone();
            tokio::spawn(async move {
                tokio::time::sleep(GRACE / 2).await;
                elsewhere.take(br#""c1""#, Bytes::from_static(ANSWER.as_bytes()))
            })
        };
        assert_eq!(messages(stream).await, [ANSWER]);
        assert!(late.await.unwrap().is_empty());
        // Longer than that: the stream ends without it.
        let started = Instant::now();
        let stream = elsewhere.answerable(br#""c2""#, own(&[], false));
        assert!(messages(stream).await.is_empty());
        assert!(started.elapsed() >= GRACE);
    }
}
