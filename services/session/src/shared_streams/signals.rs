//! What replicas tell each other through Redis pub/sub, beside the wake-ups
//! of stream readers: cancellations of requests served elsewhere, news
//! about sessions ([`Event`]), answers awaited at some replica, and the one
//! secret they share. The subscription itself ([`subscribe`]) is here too.

use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use switchboard_core::redis::RedisError;

use super::{SharedStreams, TIMEOUT};

/// What a replica does with a cancellation another replica received: the
/// session id and the client's notification.
pub type CancelHandler = Box<dyn Fn(&str, Bytes) + Send + Sync>;

/// News about a session, for every replica ([`SharedStreams::publish_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A replica recorded a new upstream session (the argument: the
    /// upstream's key, [`switchboard_upstream::Upstreams::key`]: slots differ between replicas).
    Opened,
    /// The store lost the session: whoever holds it, write it back now.
    Repair,
}

impl Event {
    fn word(self) -> &'static str {
        match self {
            Event::Opened => "opened",
            Event::Repair => "repair",
        }
    }

    fn from_word(word: &str) -> Option<Event> {
        match word {
            "opened" => Some(Event::Opened),
            "repair" => Some(Event::Repair),
            _ => None,
        }
    }
}

/// What a replica does with news about a session: the event, the session
/// id, the event's argument.
pub type EventHandler = Box<dyn Fn(Event, &str, usize) + Send + Sync>;

impl SharedStreams {
    /// A secret every replica shares (`{prefix}state-key`, set once by
    /// whichever replica asks first): the key of the `requestState`s the
    /// router issues, so that any replica accepts another's.
    pub async fn shared_secret(&self, candidate: &str) -> Result<String, RedisError> {
        let key = format!("{}state-key", self.link.prefix);
        let candidate = candidate.to_owned();
        self.link
            .call(|mut c| async move {
                let (_, value): (Option<String>, String) = redis::pipe()
                    .cmd("SET")
                    .arg(&key)
                    .arg(&candidate)
                    .arg("NX")
                    .cmd("GET")
                    .arg(&key)
                    .query_async(&mut c)
                    .await?;
                Ok(value)
            })
            .await
    }

    pub(super) fn cancel_channel(&self) -> String {
        format!("{}cancel", self.link.prefix)
    }

    fn events_channel(&self) -> String {
        format!("{}session-events", self.link.prefix)
    }

    /// Sets what to do with news about sessions from any replica (this one's own included).
    pub fn on_event(&self, handler: EventHandler) {
        let _ = self.on_event.set(handler);
    }

    /// Tells every replica (best effort) news about session `session`.
    pub async fn publish_event(&self, event: Event, session: &str, argument: usize) {
        let payload = format!("{} {session} {argument}", event.word()).into_bytes();
        if let Err(e) = self.publish(self.events_channel(), payload).await {
            self.metrics.store_error("session_event");
            tracing::debug!(error = %e, "cannot tell the other replicas about a session");
        }
    }

    /// Publishes `payload` on `channel` (every replica subscribes).
    async fn publish(&self, channel: String, payload: Vec<u8>) -> Result<(), RedisError> {
        self.link
            .call(|mut c| async move {
                let _: redis::Value = redis::cmd("PUBLISH").arg(channel).arg(payload).query_async(&mut c).await?;
                Ok(())
            })
            .await
    }

    fn awaited_key(&self, session: &str, ours: &str) -> String {
        format!("{}await:{session}:{ours}", self.link.prefix)
    }

    /// Notes that this replica awaits the answer to input request `ours`
    /// of session `session` (for at most `ttl`), so that a replica the
    /// client's answer reaches knows someone takes it. Best effort: if
    /// Redis cannot be reached, answers are passed on unchecked.
    pub async fn expect_answer(&self, session: &str, ours: &str, ttl: Duration) {
        let key = self.awaited_key(session, ours);
        let ms = ttl.as_millis().max(1) as u64;
        let result = self
            .link
            .call(|mut c| async move {
                let _: redis::Value = redis::cmd("SET").arg(key).arg("1").arg("PX").arg(ms).query_async(&mut c).await?;
                Ok(())
            })
            .await;
        if let Err(e) = result {
            self.metrics.store_error("expect_answer");
            tracing::debug!(error = %e, "cannot note an awaited answer in Redis");
        }
    }

    /// Whether some replica awaits the answer to `ours` (`true` when Redis
    /// cannot tell: the answer is then passed on, as before such notes).
    pub async fn answer_awaited(&self, session: &str, ours: &str) -> bool {
        let key = self.awaited_key(session, ours);
        self.link
            .call(|mut c| async move { Ok(redis::cmd("EXISTS").arg(key).query_async::<i64>(&mut c).await? == 1) })
            .await
            .unwrap_or(true)
    }

    /// The answer to `ours` is no longer awaited (best effort; it expires anyway).
    pub async fn forget_answer(&self, session: &str, ours: &str) {
        let key = self.awaited_key(session, ours);
        let _ = self
            .link
            .call(|mut c| async move {
                let _: redis::Value = redis::cmd("DEL").arg(key).query_async(&mut c).await?;
                Ok(())
            })
            .await;
    }

    /// Sets what to do with cancellations other replicas received.
    pub fn on_cancel(&self, handler: CancelHandler) {
        let _ = self.on_cancel.set(handler);
    }

    /// Tells every replica about a cancellation of a request this replica is
    /// not serving (best effort, like the notification itself).
    pub async fn broadcast_cancel(&self, session: &str, notification: &[u8]) {
        let mut payload = Vec::with_capacity(session.len() + 1 + notification.len());
        payload.extend_from_slice(session.as_bytes());
        payload.push(b' ');
        payload.extend_from_slice(notification);
        if let Err(e) = self.publish(self.cancel_channel(), payload).await {
            self.metrics.store_error("stream_cancel");
            tracing::debug!(error = %e, "cannot pass a cancellation to the other replicas");
        }
    }

    /// `{event} {session} {argument}` from the events channel, to the handler.
    fn session_event(&self, payload: &[u8]) {
        let Ok(text) = std::str::from_utf8(payload) else { return };
        let mut words = text.splitn(3, ' ');
        let (Some(event), Some(session), Some(argument)) = (words.next(), words.next(), words.next()) else { return };
        let (Some(event), Ok(argument)) = (Event::from_word(event), argument.parse()) else { return };
        if let Some(handler) = self.on_event.get() {
            handler(event, session, argument);
        }
    }
}

/// This replica's channels: its wake-ups and everyone's cancellations.
/// The connection is pinged; a lost one is replaced, and every reader is
/// woken to catch up on what it missed meanwhile.
pub(super) async fn subscribe(shared: Weak<SharedStreams>) {
    loop {
        let Some(streams) = shared.upgrade() else { return };
        let channel = format!("{}{}", streams.wake_prefix(), streams.replica);
        let cancel = streams.cancel_channel();
        let events = streams.events_channel();
        let link = streams.link.clone();
        drop(streams);
        match link.pubsub().await {
            Ok(pubsub) => {
                let (mut sink, mut messages) = pubsub.split();
                match sink.subscribe(&[&channel, &cancel, &events]).await {
                    Ok(()) => {
                        if let Some(streams) = shared.upgrade() {
                            streams.wake_all();
                        }
                        let mut ping = tokio::time::interval(Duration::from_secs(15));
                        ping.tick().await;
                        loop {
                            let message = tokio::select! {
                                message = messages.next() => message,
                                _ = ping.tick() => {
                                    let alive = tokio::time::timeout(TIMEOUT, sink.ping::<redis::Value>()).await;
                                    if matches!(alive, Ok(Ok(_))) {
                                        continue;
                                    }
                                    tracing::debug!("the shared stream subscription stopped answering; reconnecting");
                                    break;
                                }
                            };
                            let Some(message) = message else { break };
                            let Some(streams) = shared.upgrade() else { return };
                            let payload: Vec<u8> = message.get_payload().unwrap_or_default();
                            if message.get_channel_name() == events {
                                streams.session_event(&payload);
                                continue;
                            }
                            let Some(space) = payload.iter().position(|b| *b == b' ') else { continue };
                            let Ok(session) = std::str::from_utf8(&payload[..space]) else { continue };
                            let rest = &payload[space + 1..];
                            if message.get_channel_name() == cancel {
                                if let Some(handler) = streams.on_cancel.get() {
                                    handler(session, Bytes::copy_from_slice(rest));
                                }
                            } else if let Some(stream) = std::str::from_utf8(rest).ok().and_then(|s| s.parse().ok()) {
                                streams.wake(session, stream);
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot subscribe to shared stream wake-ups"),
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot connect for shared stream wake-ups"),
        }
        if let Some(streams) = shared.upgrade() {
            streams.wake_all();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
