//! A session's upstream channels: opened on first use with the client's
//! capabilities, or resumed from the session store; one upstream session
//! per (session, upstream) however many replicas open one (a claim in the
//! store); and the inbox through which a channel hands the session what
//! its upstream sends outside a request.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use switchboard_core::UpstreamId;
use switchboard_upstream::{Channel, Claimed, Hello, Inbox, UpstreamSession};

use super::Session;
use crate::store::Claim;
use crate::SessionError;

/// How long a new upstream session's first request waits for its GET
/// stream to open, at most (a session whose client listens).
const GET_FIRST: std::time::Duration = std::time::Duration::from_secs(1);

/// [`Session::open`]'s future.
type Opening<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Arc<dyn Channel>, SessionError>> + Send + 'a>>;

impl Session {
    /// The channel to upstream `u`, opened on first use with this client's
    /// version and capabilities. A stored session has one upstream session
    /// per upstream whichever replica opens it: one the store records
    /// (maybe opened by another replica since this one loaded the session)
    /// is resumed; a new one is claimed in the store, and if another
    /// replica claimed one first, that one is used and ours ended.
    pub async fn channel(&self, u: UpstreamId) -> Result<Arc<dyn Channel>, SessionError> {
        let link = self.link(u);
        if let Some(channel) = link.channel.get() {
            // The client's GET came just before this request: the upstream
            // GET it opened goes out first, as for a new channel (see
            // `listening_if_asked`). A server may otherwise take that GET,
            // coming after this request, for the request's reconnection.
            if self.listening.load(Ordering::Relaxed) && channel.opening_get() {
                channel.listening(GET_FIRST).await;
            }
            return Ok(channel.clone());
        }
        let channel = link.channel.get_or_try_init(|| self.open(u, &link)).await?;
        if self.closed.load(Ordering::Relaxed) {
            // Forgotten here while it opened: others may go on with it.
            if self.detached.load(Ordering::Relaxed) {
                channel.detach().await;
            } else {
                channel.close().await;
            }
            return Err(SessionError::Unknown);
        }
        Ok(channel.clone())
    }

    /// Opens (or resumes) the channel to `u`: the slow path of
    /// [`channel`](Self::channel), once per channel, boxed (it awaits the
    /// store, the upstream's handshake and the claim: a deep future, kept
    /// out of every caller's own).
    fn open<'a>(&'a self, u: UpstreamId, link: &'a super::Link) -> Opening<'a> {
        let upstream = &self.ctx.upstreams[u];
        Box::pin(async move {
            let hello = Hello {
                protocol_version: self.version,
                capabilities: self.capabilities.clone(),
                affinity: self.id.clone(),
                credentials: self.credentials(u),
            };
            let inbox: Arc<dyn Inbox> = Arc::new(SessionInbox { session: self.me.clone(), upstream: u });
            let known = self.known_upstream(u).await;
            if let Some(channel) = known.as_ref().and_then(|at| upstream.transport.resume(&hello, inbox.clone(), at)) {
                self.ctx.upstreams.metrics().session_resumed(&upstream.name);
                return Ok(self.listening_if_asked(channel).await);
            }
            let opened =
                tokio::time::timeout(upstream.config.timeout, upstream.transport.open(&hello, inbox.clone())).await;
            let channel = match opened {
                Ok(Ok(channel)) => channel,
                Ok(Err(e)) => return Err(SessionError::upstream(&upstream.name, e)),
                Err(_) => {
                    return Err(SessionError::UpstreamTimeout {
                        upstream: upstream.name.clone(),
                        after: upstream.config.timeout,
                    })
                }
            };
            // A new upstream session: its duration is measured from now.
            let now = switchboard_core::time::now_ms() as u64;
            link.opened.store(now, Ordering::Relaxed);
            let Some(fresh) = channel.upstream_session() else { return Ok(self.listening_if_asked(channel).await) };
            match self.claim_upstream(u, known.as_ref(), &fresh).await {
                Claimed::Ours => Ok(self.listening_if_asked(channel).await),
                Claimed::Theirs(theirs) => match upstream.transport.resume(&hello, inbox, &theirs) {
                    Some(resumed) => {
                        // Another replica's upstream session: its start is not known here.
                        link.opened.store(0, Ordering::Relaxed);
                        // Nobody uses ours: ended, off this request's path.
                        tokio::spawn(async move { channel.close().await });
                        self.ctx.upstreams.metrics().session_resumed(&upstream.name);
                        Ok(self.listening_if_asked(resumed).await)
                    }
                    None => {
                        tracing::warn!(upstream = %upstream.name, "another router replica's upstream session is on a replica this one cannot reach; using this one's own");
                        Ok(self.listening_if_asked(channel).await)
                    }
                },
            }
        })
    }

    /// A channel, listening if a GET stream asked for that: its upstream
    /// GET stream is open (or was refused, or [`GET_FIRST`] passed) before
    /// the request that opened the channel goes out, so that what the
    /// server sends on that stream while handling it is not lost.
    async fn listening_if_asked(&self, channel: Arc<dyn Channel>) -> Arc<dyn Channel> {
        if self.listening.load(Ordering::Relaxed) {
            channel.listen();
            channel.listening(GET_FIRST).await;
        }
        channel
    }

    /// The upstream session with `u` this session has: as this replica
    /// knows it, else (a session other replicas share) as the store
    /// records it now, which another replica may have opened since this
    /// one loaded the session. A store that cannot be reached: none known.
    async fn known_upstream(&self, u: UpstreamId) -> Option<UpstreamSession> {
        if let Some(at) = self.known.lock().expect("lock").get(u).cloned() {
            return Some(at);
        }
        if !self.stored || !self.ctx.store.shared() {
            return None;
        }
        match self.ctx.store.upstream(&self.id, &self.ctx.upstreams[u].name).await {
            Ok(Some(at)) => {
                self.known.lock().expect("lock").insert(u, at.clone());
                Some(at)
            }
            Ok(None) => None,
            Err(e) => {
                self.ctx.metrics.store_error("upstream");
                tracing::debug!(error = %e, "cannot read a session's upstream session from the store");
                None
            }
        }
    }

    /// The channel to upstream `u` if it is open here, or if this session
    /// has an upstream session with it (opened by any replica, whenever)
    /// that this replica can resume; never a new upstream session.
    pub async fn existing_channel(&self, u: UpstreamId) -> Option<Arc<dyn Channel>> {
        if let Some(channel) = self.open_channel(u) {
            return Some(channel);
        }
        // Being opened right now: the answer to a request the upstream sent
        // as soon as it was initialised (roots, from a process of the
        // session's own) can overtake the end of the opening. Waited for;
        // with no opening under way, the closure fails at once and nothing
        // is opened.
        if let Some(link) = self.existing_link(u) {
            let opening = link.channel.get_or_try_init(|| async { Err::<Arc<dyn Channel>, ()>(()) }).await;
            if let Ok(channel) = opening {
                return Some(channel.clone());
            }
        }
        self.known_upstream(u).await?;
        self.channel(u).await.ok()
    }

    /// Records `fresh` as this session's upstream session with `u`, in
    /// place of `stale`: for a stored session, a compare-and-set in the
    /// store, which another replica may have won (its session is then the
    /// one). A store that cannot be reached is logged: the session goes on
    /// here with its own.
    pub(crate) async fn claim_upstream(
        &self,
        u: UpstreamId,
        stale: Option<&UpstreamSession>,
        fresh: &UpstreamSession,
    ) -> Claimed {
        let name = &self.ctx.upstreams[u].name;
        let decided = if self.stored {
            match self.ctx.store.claim_upstream(&self.id, name, stale, fresh).await {
                Ok(Claim::Won) => {
                    if let Some(shared) = &self.shared {
                        let key = self.ctx.upstreams.key(u) as usize;
                        shared.publish_event(crate::shared_streams::Event::Opened, &self.id, key).await;
                    }
                    Claimed::Ours
                }
                Ok(Claim::Lost(theirs)) => {
                    self.ctx.metrics.claim_lost();
                    tracing::debug!(upstream = %name, "another router replica opened this session's upstream session first; using it");
                    Claimed::Theirs(theirs)
                }
                // Ended meanwhile (the request will find out), or lost by
                // the store (written back with this one when repaired).
                Ok(Claim::Gone) => Claimed::Ours,
                Err(e) => {
                    self.ctx.metrics.store_error("claim_upstream");
                    tracing::warn!(error = %e, upstream = %name, "upstream session not recorded in the session store; only this replica uses it until the store answers");
                    Claimed::Ours
                }
            }
        } else {
            Claimed::Ours
        };
        let at = match &decided {
            Claimed::Ours => fresh.clone(),
            Claimed::Theirs(theirs) => theirs.clone(),
        };
        self.known.lock().expect("lock").insert(u, at);
        decided
    }

    /// The upstream session the replicas agree on for `u`, if it is not
    /// `current` (another replica re-initialised it).
    async fn agreed_upstream(&self, u: UpstreamId, current: Option<&UpstreamSession>) -> Option<UpstreamSession> {
        if !self.stored || !self.ctx.store.shared() {
            return None;
        }
        let recorded = match self.ctx.store.upstream(&self.id, &self.ctx.upstreams[u].name).await {
            Ok(recorded) => recorded?,
            Err(e) => {
                self.ctx.metrics.store_error("upstream");
                tracing::debug!(error = %e, "cannot read a session's upstream session from the store");
                return None;
            }
        };
        if Some(&recorded) == current {
            return None;
        }
        self.known.lock().expect("lock").insert(u, recorded.clone());
        Some(recorded)
    }

    /// Another replica opened an upstream session with `u` for this
    /// session: if a GET stream listens here, it hears that one too.
    pub(crate) async fn follow_upstream(&self, u: UpstreamId) {
        if !self.listening.load(Ordering::Relaxed) || self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.open_channel(u).is_none() {
            // Read from the store: the new one.
            self.known.lock().expect("lock").remove(u);
            let _ = self.existing_channel(u).await;
        }
    }
}

/// Where a session's upstream channels deliver messages not tied to a request.
pub(super) struct SessionInbox {
    pub(super) session: Weak<Session>,
    pub(super) upstream: UpstreamId,
}

#[async_trait::async_trait]
impl Inbox for SessionInbox {
    fn deliver(&self, message: Bytes) {
        let Some(session) = self.session.upgrade() else { return };
        let Some(relay) = session.ctx.relay.upgrade() else { return };
        if let Some(out) = relay.relay(&session, self.upstream, &message) {
            session.push(out, Some((self.upstream, &message)));
        }
    }

    async fn agreed(&self, current: Option<&UpstreamSession>) -> Option<UpstreamSession> {
        let session = self.session.upgrade()?;
        session.agreed_upstream(self.upstream, current).await
    }

    async fn claim(&self, stale: Option<&UpstreamSession>, fresh: &UpstreamSession) -> Claimed {
        match self.session.upgrade() {
            Some(session) => session.claim_upstream(self.upstream, stale, fresh).await,
            None => Claimed::Ours,
        }
    }
}
