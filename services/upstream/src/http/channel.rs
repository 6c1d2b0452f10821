//! One upstream session over Streamable HTTP: its requests (re-initialised
//! once when the upstream forgot the session), and its GET stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::StatusCode;
use switchboard_protocol::jsonrpc::MessageKind;
use tokio::task::JoinHandle;

use super::elsewhere::Elsewhere;
use super::replicas::Replicas;
use super::stream::SseStream;
use super::{drain, status_error, SessionState};
use crate::{Claimed, Handshake, Hello, Inbox, MessageStream, Outgoing, Reply, UpstreamError};

/// One upstream session over Streamable HTTP, on one of the upstream's
/// replicas (it moves to another, with a new handshake, if that one dies).
pub(crate) struct Channel {
    replicas: Arc<Replicas>,
    hello: Hello,
    /// Shared, so that a request takes it with one count, not a copy.
    state: RwLock<Arc<SessionState>>,
    reinit: tokio::sync::Mutex<()>,
    inbox: Arc<dyn Inbox>,
    listener: Mutex<Option<JoinHandle<()>>>,
    /// Set (and told) once the GET stream's first request was answered, or
    /// once a request waited for that in vain ([`crate::Channel::listening`]).
    get_answered: AtomicBool,
    get_answer: tokio::sync::Notify,
    closed: AtomicBool,
    /// Told when the channel moves to another upstream session.
    switched: tokio::sync::Notify,
    /// Calls whose response may come on the GET stream.
    elsewhere: Arc<Elsewhere>,
    me: Weak<Channel>,
}

impl Channel {
    pub(super) fn open(
        replicas: Arc<Replicas>,
        hello: Hello,
        state: SessionState,
        inbox: Arc<dyn Inbox>,
    ) -> Arc<dyn crate::Channel> {
        Arc::new_cyclic(|me| Channel {
            replicas,
            hello,
            state: RwLock::new(Arc::new(state)),
            reinit: tokio::sync::Mutex::new(()),
            inbox,
            listener: Mutex::new(None),
            get_answered: AtomicBool::new(false),
            get_answer: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            switched: tokio::sync::Notify::new(),
            elsewhere: Arc::default(),
            me: me.clone(),
        })
    }

    fn state(&self) -> Arc<SessionState> {
        self.state.read().expect("lock").clone()
    }

    /// Runs `initialize` again unless another caller already did since
    /// `stale`: on the same replica, or (`move_away`) on another one, for a
    /// replica that is down. With several router replicas, the upstream
    /// session they agreed on wins: if another replica re-initialised
    /// first, this channel moves to its upstream session instead; if it
    /// does so meanwhile, the fresh session is ended and theirs used.
    async fn reinitialize(&self, stale: &SessionState, move_away: bool) -> Result<(), UpstreamError> {
        let _one_at_a_time = self.reinit.lock().await;
        if self.state().epoch != stale.epoch {
            return Ok(());
        }
        if move_away {
            self.replicas.mark(stale.shared.index, false);
        }
        let stale_at = stale.upstream_session();
        if let Some(agreed) = self.inbox.agreed(stale_at.as_ref()).await {
            if let Some(state) = self.replicas.state_for(&agreed, &self.hello) {
                tracing::info!(upstream = %state.shared.name, "upstream session re-initialised by another router replica; following it");
                self.switch(state, stale.epoch + 1);
                return Ok(());
            }
        }
        let shared = if move_away {
            self.replicas.members[self.replicas.pick(&self.hello.affinity, Some(stale.shared.index))].clone()
        } else {
            stale.shared.clone()
        };
        let mut fresh = shared.handshake(&self.hello).await?;
        if let Some(fresh_at) = fresh.upstream_session() {
            if let Claimed::Theirs(theirs) = self.inbox.claim(stale_at.as_ref(), &fresh_at).await {
                if let Some(state) = self.replicas.state_for(&theirs, &self.hello) {
                    // Ours is not used by anyone: ended, off this path.
                    let ours = fresh;
                    tokio::spawn(async move { ours.end().await });
                    fresh = state;
                }
            }
        }
        self.switch(fresh, stale.epoch + 1);
        shared.metrics.reinitialized(&shared.name);
        if move_away {
            tracing::info!(upstream = %shared.name, replica = %shared.replica, "upstream session moved to another replica; re-initialised");
        } else {
            tracing::info!(upstream = %shared.name, "upstream session expired; re-initialised");
        }
        Ok(())
    }

    /// A call's SSE answer (`reply`), which its response may also reach
    /// through the GET stream (see [`Elsewhere`]): registered even if
    /// that stream is not open yet, as it may open while the call runs
    /// (its client's GET came after the call).
    fn answerable(&self, reply: Reply, id: &[u8]) -> Reply {
        match reply {
            Reply::Stream(stream) if !id.is_empty() => Reply::Stream(self.elsewhere.answerable(id, stream)),
            reply => reply,
        }
    }

    /// Puts the channel on another upstream session.
    fn switch(&self, mut state: SessionState, epoch: u64) {
        state.epoch = epoch;
        *self.state.write().expect("lock") = Arc::new(state);
        self.switched.notify_waiters();
    }
}

impl Channel {
    /// [`crate::Channel::request`], for [`crate::request`] to await in place.
    pub(crate) async fn request_in_place(&self, out: Outgoing) -> Result<Reply, UpstreamError> {
        let mut retried = false;
        let mut moved = !self.replicas.several();
        let mut body = Some(out.body);
        let id = out.id;
        let extra: Vec<(http::HeaderName, http::HeaderValue)> =
            out.traceparent.into_iter().map(|t| (http::HeaderName::from_static("traceparent"), t)).collect();
        // Re-initialising (a replica gone, a session lost) is boxed where
        // awaited: this future is copied whole into its box on every
        // request, and that way was most of it (4.6 to 2.3 KB).
        loop {
            let state = self.state();
            // Its replica was found down (by the health checks): move first.
            if !moved && !self.replicas.is_up(state.shared.index) {
                Box::pin(self.reinitialize(&state, true)).await?;
                moved = true;
                continue;
            }
            // Only an upstream session that can expire, or a replica that can
            // die, makes us send again: keep a copy of the body only then (a
            // first copy of a spliced body costs an allocation). And with a
            // session, the id it holds (see `answerable`).
            let may_retry = (state.sid.is_some() && !retried) || !moved;
            let send = if may_retry || state.sid.is_some() { body.clone() } else { body.take() };
            let send = send.expect("the body is kept while a retry is possible");
            let resp = match state.shared.post(send, &state, &extra).await {
                Ok(resp) => resp,
                // The replica is gone (it refuses connections now, not just
                // this once): the session moves to another, and the request
                // follows it. A replica that still answers probes gets the
                // error back, unchanged.
                Err(e @ UpstreamError::Connect(_)) if !moved => {
                    if self.replicas.probe(state.shared.index).await {
                        return Err(e);
                    }
                    Box::pin(self.reinitialize(&state, true)).await?;
                    moved = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let status = resp.status;
            if status.is_success() && status != StatusCode::ACCEPTED {
                let event_stream = resp.event_stream;
                let reply = state.shared.read_reply(resp, Some(&state)).await?;
                // Only a session has a GET stream to bring a response.
                return Ok(match &body {
                    Some(sent) if event_stream && state.sid.is_some() => {
                        self.answerable(reply, sent.get(id.clone()).unwrap_or_default())
                    }
                    _ => reply,
                });
            }
            if status == StatusCode::ACCEPTED {
                return Err(UpstreamError::Protocol("it answered a request with 202 Accepted".into()));
            }
            let error = status_error(resp).await;
            if session_lost(status, &error) && state.sid.is_some() && !retried {
                Box::pin(self.reinitialize(&state, false)).await?;
                retried = true;
                continue;
            }
            return Err(error);
        }
    }
}

#[async_trait]
impl crate::Channel for Channel {
    async fn request(&self, out: Outgoing) -> Result<Reply, UpstreamError> {
        self.request_in_place(out).await
    }

    fn direct(&self) -> Option<crate::Direct<'_>> {
        Some(crate::Direct(self))
    }

    async fn send(&self, message: Bytes) -> Result<(), UpstreamError> {
        let state = self.state();
        let limit = state.shared.handshake_timeout;
        let work = async {
            let resp = state.shared.post(message, &state, &[]).await?;
            if resp.status.is_success() {
                drain(resp).await;
                Ok(())
            } else {
                Err(status_error(resp).await)
            }
        };
        tokio::time::timeout(limit, work).await.unwrap_or(Err(UpstreamError::Timeout(limit)))
    }

    fn listen(&self) {
        let mut listener = self.listener.lock().expect("lock");
        if listener.is_some() || self.closed.load(Ordering::Relaxed) || self.state().sid.is_none() {
            return;
        }
        let me = self.me.clone();
        self.elsewhere.listening(true);
        *listener = Some(tokio::spawn(listen_loop(me)));
    }

    async fn listening(&self, within: Duration) {
        if self.listener.lock().expect("lock").is_none() {
            return;
        }
        let answered = self.get_answer.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        if self.get_answered.load(Ordering::Acquire) {
            return;
        }
        if tokio::time::timeout(within, answered).await.is_err() {
            // Waited for once: a GET the upstream never answers holds up
            // no request after this one.
            self.get_answered.store(true, Ordering::Release);
        }
    }

    fn opening_get(&self) -> bool {
        !self.get_answered.load(Ordering::Acquire) && self.listener.lock().expect("lock").is_some()
    }

    fn handshake(&self) -> Arc<Handshake> {
        self.state().handshake.clone()
    }

    fn upstream_session(&self) -> Option<crate::UpstreamSession> {
        self.state().upstream_session()
    }

    async fn resume_stream(&self, last_event_id: &str) -> Result<Box<dyn MessageStream>, UpstreamError> {
        let state = self.state();
        let resp = state.shared.get(&state, Some(last_event_id)).await?;
        if !resp.status.is_success() {
            return Err(status_error(resp).await);
        }
        if !resp.event_stream {
            return Err(UpstreamError::Protocol("it answered a resumption with something other than a stream".into()));
        }
        let resume = Some((Arc::downgrade(&state.shared), SessionState::clone(&state)));
        Ok(Box::new(SseStream::resumed(resp.body, resume, last_event_id)))
    }

    async fn detach(&self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(task) = self.listener.lock().expect("lock").take() {
            task.abort();
        }
        self.elsewhere.listening(false);
    }

    async fn close(&self) {
        self.detach().await;
        self.state().end().await;
    }
}

/// Whether an error answer means the upstream no longer knows our session:
/// 404 (the spec's answer), or 400 about the session (what some servers send).
fn session_lost(status: StatusCode, error: &UpstreamError) -> bool {
    match (status, error) {
        (StatusCode::NOT_FOUND, _) => true,
        (StatusCode::BAD_REQUEST, UpstreamError::Status { detail, .. }) => {
            detail.to_ascii_lowercase().contains("session")
        }
        _ => false,
    }
}

/// How long after an upstream said it offers no GET stream it is asked
/// again, if its session is not initialised anew before.
const NOT_OFFERED_RETRY: Duration = Duration::from_secs(300);

/// Waits until the channel's upstream session is initialised anew (a new
/// epoch), or `limit`: `false` if the channel went away meanwhile.
async fn wait_for_new_session(channel: &Weak<Channel>, state: &SessionState, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let Some(me) = channel.upgrade() else { return false };
        // Listening for a switch before looking, so none is missed. (The
        // channel is held while waiting; closing it aborts this task.)
        let switched = me.switched.notified();
        tokio::pin!(switched);
        switched.as_mut().enable();
        if me.closed.load(Ordering::Relaxed) {
            return false;
        }
        if me.state().epoch != state.epoch || tokio::time::Instant::now() >= deadline {
            return true;
        }
        let _ = tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + Duration::from_secs(30)), switched)
            .await;
    }
}

/// Keeps the session's GET stream open and hands its messages to the inbox.
async fn listen_loop(channel: Weak<Channel>) {
    let mut last_event_id: Option<String> = None;
    let mut pause = Duration::from_millis(250);
    loop {
        let Some(me) = channel.upgrade() else { return };
        if me.closed.load(Ordering::Relaxed) {
            return;
        }
        let state = me.state();
        // Its replica is down: move the session before listening again.
        if me.replicas.several() && !me.replicas.is_up(state.shared.index) {
            last_event_id = None;
            if me.reinitialize(&state, true).await.is_err() {
                drop(me);
                pause = (pause * 2).min(Duration::from_secs(30));
                tokio::time::sleep(pause).await;
            }
            continue;
        }
        let shared = state.shared.clone();
        let inbox = me.inbox.clone();
        let elsewhere = me.elsewhere.clone();
        drop(me);
        let answer = shared.get(&state, last_event_id.as_deref()).await;
        if let Some(me) = channel.upgrade() {
            if !me.get_answered.swap(true, Ordering::AcqRel) {
                me.get_answer.notify_waiters();
            }
        }
        match answer {
            // The server offers no GET stream (405, or not an event stream):
            // asked again once its session is initialised anew (it restarted,
            // maybe as a version that offers one), or after a long while.
            Ok(resp)
                if resp.status == StatusCode::METHOD_NOT_ALLOWED
                    || (resp.status.is_success() && !resp.event_stream) =>
            {
                if !wait_for_new_session(&channel, &state, NOT_OFFERED_RETRY).await {
                    return;
                }
                last_event_id = None;
                pause = Duration::from_millis(250);
                continue;
            }
            Ok(resp) if resp.status.is_success() => {
                let mut stream = SseStream::new(resp.body, None);
                let mut delivered = false;
                while let Some(message) = stream.next().await {
                    match message {
                        Ok(message) => {
                            delivered = true;
                            deliver(&*inbox, &elsewhere, message);
                        }
                        Err(_) => break,
                    }
                }
                if stream.last_event_id.is_some() {
                    last_event_id = stream.last_event_id.take();
                }
                pause = match stream.retry {
                    Some(retry) => retry.clamp(Duration::from_millis(100), Duration::from_secs(30)),
                    None if delivered => Duration::from_millis(250),
                    // Ended without a message: back off, so a server that
                    // closes at once is not asked again and again.
                    None => (pause * 2).min(Duration::from_secs(30)),
                };
            }
            Ok(resp) => {
                let status = resp.status;
                let error = status_error(resp).await;
                last_event_id = None;
                pause = (pause * 2).min(Duration::from_secs(30));
                // The upstream forgot the session (it restarted): initialise
                // again now, or a control channel would never hear of changes.
                if session_lost(status, &error) {
                    if let Some(me) = channel.upgrade() {
                        if me.reinitialize(&state, false).await.is_ok() {
                            pause = Duration::from_millis(50);
                        }
                    }
                }
            }
            Err(_) => pause = (pause * 2).min(Duration::from_secs(30)),
        }
        tokio::time::sleep(pause).await;
    }
}

/// Hands a message of the GET stream on: a response to the call waiting
/// for it (a server that took this stream for the call's reconnection),
/// anything else to the inbox.
fn deliver(inbox: &dyn Inbox, elsewhere: &Elsewhere, message: Bytes) {
    let response = switchboard_protocol::Envelope::parse(&message)
        .ok()
        .filter(|env| matches!(env.kind, MessageKind::Response | MessageKind::Error))
        .and_then(|env| env.id.map(|id| Box::<[u8]>::from(id.get().as_bytes())));
    let Some(id) = response else { return inbox.deliver(message) };
    for stray in elsewhere.take(&id, message) {
        inbox.deliver(stray);
    }
}
