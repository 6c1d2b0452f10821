//! A session client's resource subscriptions to upstreams that speak only
//! MCP 2026-07-28, which has no `resources/subscribe`: per upstream, one
//! `subscriptions/listen` stream whose filter names the URIs the client
//! subscribed to, opened again with the new set whenever it changes (a
//! stream closed is a stream cancelled, in that era). Its
//! `notifications/resources/updated` reach the session's inbox as any
//! upstream's do. The streams live on the replica that took the
//! subscriptions (as stdio upstream sessions do) and end with the session.
//!
//! A subscribe or unsubscribe is answered once the upstream acknowledged the
//! new stream; if it refuses, the set is as it was.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use switchboard_core::credential::Credentials;

use bytes::Bytes;
use serde_json::{json, Value};
use switchboard_core::UpstreamId;
use switchboard_protocol::jsonrpc::{Envelope, MessageKind};
use switchboard_protocol::{modern, Method};
use switchboard_upstream::{Inbox, MessageStream, ModernAnswer, Reply, Upstream, UpstreamError};
use tokio::task::JoinHandle;

/// Longest wait for an upstream to acknowledge a listen stream.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// Pause before a listen stream the upstream ended is opened again.
const REOPEN: Duration = Duration::from_secs(1);

/// Resources a session may subscribe to at one such upstream: each change
/// sends the upstream the whole set again.
pub const MAX_URIS: usize = 256;

/// The subscriptions of one session, by upstream.
#[derive(Default)]
pub(crate) struct Subscriptions {
    by_upstream: tokio::sync::Mutex<HashMap<UpstreamId, Listening>>,
    /// Set by [`Subscriptions::stop`]: a change under way when the session
    /// ended starts no stream.
    stopped: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Listening {
    uris: BTreeSet<String>,
    task: Option<JoinHandle<()>>,
}

/// What a listen request declares about its client.
pub(crate) struct Client<'a> {
    pub capabilities: &'a str,
    pub affinity: &'a str,
    /// Whose upstream credentials the listen request carries.
    pub credentials: Option<Arc<dyn Credentials>>,
}

impl Subscriptions {
    /// Subscribes to `uri` at upstream `upstream` (the upstream's own URI),
    /// or (`on` false) unsubscribes; returns once the upstream listens with
    /// the new set (or nothing is left to listen for).
    pub(crate) async fn change(
        &self,
        upstream: &Arc<Upstream>,
        uri: &str,
        on: bool,
        client: Client<'_>,
        inbox: Arc<dyn Inbox>,
    ) -> Result<(), UpstreamError> {
        let mut all = self.by_upstream.lock().await;
        let listening = all.entry(upstream.id).or_default();
        let mut uris = listening.uris.clone();
        let changed = if on { uris.insert(uri.to_owned()) } else { uris.remove(uri) };
        if !changed {
            return Ok(());
        }
        if uris.len() > MAX_URIS {
            return Err(UpstreamError::Limit(format!(
                "a session may subscribe to at most {MAX_URIS} resources of an upstream that speaks only MCP 2026-07-28"
            )));
        }
        if uris.is_empty() {
            if let Some(task) = listening.task.take() {
                task.abort();
            }
            listening.uris = uris;
            return Ok(());
        }
        let body = listen_request(&uris, client.capabilities);
        let stream = open(upstream, body.clone(), client.affinity, client.credentials.as_ref()).await?;
        if self.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return Err(UpstreamError::Closed);
        }
        if let Some(task) = listening.task.take() {
            task.abort();
        }
        let (upstream, affinity) = (upstream.clone(), client.affinity.to_owned());
        let credentials = client.credentials;
        listening.task = Some(tokio::spawn(keep_listening(upstream, body, affinity, credentials, stream, inbox)));
        listening.uris = uris;
        Ok(())
    }

    /// Whether a listen stream is kept here (or a change is under way).
    pub(crate) fn any(&self) -> bool {
        self.by_upstream.try_lock().map_or(true, |all| all.values().any(|l| l.task.is_some()))
    }

    /// Ends every listen stream (the session ended, or left this replica).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        if let Ok(mut all) = self.by_upstream.try_lock() {
            for (_, listening) in all.drain() {
                if let Some(task) = listening.task {
                    task.abort();
                }
            }
        }
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `subscriptions/listen` request for `uris`, declaring the client's
/// capabilities.
fn listen_request(uris: &BTreeSet<String>, capabilities: &str) -> Bytes {
    let capabilities: Value = serde_json::from_str(capabilities).unwrap_or_else(|_| json!({}));
    let id = format!("switchboard-subscribe-{}", &switchboard_core::ids::random_id()[..12]);
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
        "notifications": {"resourceSubscriptions": uris},
        "_meta": {
            modern::META_PROTOCOL_VERSION: "2026-07-28",
            modern::META_CLIENT_CAPABILITIES: capabilities,
        },
    }});
    Bytes::from(serde_json::to_vec(&message).expect("serializable"))
}

/// Opens a listen stream and waits for the upstream's acknowledgement
/// (within the upstream's `timeout`, then `ACK_WAIT` for the first message).
async fn open(
    upstream: &Upstream,
    body: Bytes,
    affinity: &str,
    credentials: Option<&Arc<dyn Credentials>>,
) -> Result<Box<dyn MessageStream>, UpstreamError> {
    let limit = upstream.config.timeout;
    let credential = switchboard_upstream::credential(credentials)?;
    let listen =
        upstream.transport.modern(body, Method::SubscriptionsListen, Vec::new(), affinity, credential.as_deref());
    let answer = tokio::time::timeout(limit, listen).await.map_err(|_| UpstreamError::Timeout(limit))??;
    let mut stream = match answer {
        ModernAnswer { reply: Reply::Stream(stream), .. } => stream,
        ModernAnswer { reply: Reply::Done(message), status, .. } => {
            let detail = String::from_utf8_lossy(&message[..message.len().min(300)]).into_owned();
            return Err(UpstreamError::Status { status, detail });
        }
    };
    match tokio::time::timeout(ACK_WAIT, stream.next()).await {
        Ok(Some(Ok(first))) => match Envelope::parse(&first) {
            Ok(env) if env.kind == MessageKind::Notification => Ok(stream),
            _ => Err(UpstreamError::Protocol(
                format!("subscriptions/listen answered {}", String::from_utf8_lossy(&first)).into(),
            )),
        },
        Ok(Some(Err(e))) => Err(e),
        Ok(None) => Err(UpstreamError::Closed),
        Err(_) => Err(UpstreamError::Timeout(ACK_WAIT)),
    }
}

/// Hands the stream's updates to the session's inbox; opens it again when
/// the upstream ends it, until aborted.
async fn keep_listening(
    upstream: Arc<Upstream>,
    body: Bytes,
    affinity: String,
    credentials: Option<Arc<dyn Credentials>>,
    mut stream: Box<dyn MessageStream>,
    inbox: Arc<dyn Inbox>,
) {
    loop {
        while let Some(Ok(message)) = stream.next().await {
            let is_update = Envelope::parse(&message).is_ok_and(|env| {
                env.kind == MessageKind::Notification && env.method_str() == "notifications/resources/updated"
            });
            if is_update {
                inbox.deliver(message);
            }
        }
        loop {
            tokio::time::sleep(REOPEN).await;
            match open(&upstream, body.clone(), &affinity, credentials.as_ref()).await {
                Ok(reopened) => {
                    stream = reopened;
                    break;
                }
                Err(e) => {
                    tracing::debug!(upstream = %upstream.name, error = %e, "resource subscriptions not listened to yet")
                }
            }
        }
    }
}
