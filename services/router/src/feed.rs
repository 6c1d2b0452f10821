//! The live call feed: each request's audit record, as it is made, to the
//! operators watching (the console, `GET /v1/calls/stream` on the admin
//! API). Nothing is built while nobody watches; a watcher too slow to keep
//! up misses events (told how many), never holds a request back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use switchboard_db::AuditRecord;
use tokio::sync::{broadcast, mpsc};

/// Events kept for a watcher that falls behind.
pub const BACKLOG: usize = 1024;
/// Watchers at once per replica.
pub const MAX_WATCHERS: usize = 32;
/// Bytes of a call's arguments an event carries at most (a tenant that
/// keeps arguments); the audit record keeps them whole.
pub const MAX_ARGUMENTS: usize = 2048;

pub struct Feed {
    tx: broadcast::Sender<Arc<Value>>,
    watchers: Arc<AtomicUsize>,
}

impl Default for Feed {
    fn default() -> Self {
        Feed { tx: broadcast::channel(BACKLOG).0, watchers: Arc::default() }
    }
}

impl Feed {
    /// Publishes `record` if anyone watches. Arguments appear only when the
    /// tenant keeps them (the record has them only then).
    pub fn publish(&self, record: &AuditRecord) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let mut event = json!({
            "at_ms": record.at_ms,
            "tenant": record.tenant,
            "key_prefix": record.key_prefix,
            "user": record.user,
            "method": record.method,
            "target": record.target,
            "upstream": record.upstream,
            "outcome": record.outcome,
            "error_code": record.error_code,
            "latency_us": record.latency_us,
        });
        if let Some(arguments) = &record.arguments {
            // Bounded: the feed's one ring holds up to BACKLOG events.
            let mut end = arguments.len().min(MAX_ARGUMENTS);
            while !arguments.is_char_boundary(end) {
                end -= 1;
            }
            event["arguments"] = Value::String(arguments[..end].to_owned());
            if end < arguments.len() {
                event["arguments_truncated"] = Value::Bool(true);
            }
        }
        let _ = self.tx.send(Arc::new(event));
    }

    /// An SSE stream of the events of `tenant` (all: `None`) from now on,
    /// as `event: call` with the event as data; `None` when
    /// [`MAX_WATCHERS`] already watch.
    pub fn watch(&self, tenant: Option<String>) -> Option<mpsc::Receiver<Bytes>> {
        let watchers = self.watchers.clone();
        if watchers.fetch_add(1, Ordering::AcqRel) >= MAX_WATCHERS {
            watchers.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let mut rx = self.tx.subscribe();
        let (out, events) = mpsc::channel::<Bytes>(16);
        tokio::spawn(async move {
            // Something first: the watcher knows it is connected.
            let _ = out.send(Bytes::from_static(b"event: ready\ndata: {}\n\n")).await;
            loop {
                let event = tokio::select! {
                    got = rx.recv() => got,
                    () = out.closed() => break,
                };
                let text = match event {
                    Ok(event) if tenant.as_deref().is_none_or(|t| event["tenant"] == t) => {
                        format!("event: call\ndata: {event}\n\n")
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        format!("event: missed\ndata: {{\"events\":{n}}}\n\n")
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                let sent = tokio::time::timeout(Duration::from_secs(30), out.send(Bytes::from(text))).await;
                if !matches!(sent, Ok(Ok(()))) {
                    break;
                }
            }
            watchers.fetch_sub(1, Ordering::AcqRel);
        });
        Some(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tenant: &str) -> AuditRecord {
        AuditRecord {
            id: "1".into(),
            at_ms: 1,
            tenant: Some(tenant.into()),
            key_prefix: None,
            session: None,
            method: "tools/call".into(),
            target: Some("fs__echo".into()),
            upstream: Some("fs".into()),
            outcome: "ok".into(),
            error_code: None,
            latency_us: 7,
            request_bytes: 1,
            response_bytes: 1,
            trace_id: None,
            arguments: None,
            user: None,
        }
    }

    #[tokio::test]
    async fn a_watcher_gets_its_tenants_calls_only() {
        let feed = Feed::default();
        let mut events = feed.watch(Some("acme".into())).unwrap();
        assert_eq!(&events.recv().await.unwrap()[..], b"event: ready\ndata: {}\n\n");
        feed.publish(&record("beta"));
        feed.publish(&record("acme"));
        let event = events.recv().await.unwrap();
        let text = std::str::from_utf8(&event).unwrap();
        assert!(text.starts_with("event: call\ndata: ") && text.contains("\"tenant\":\"acme\""), "{text}");
        assert!(!text.contains("arguments"), "{text}");
    }

    async fn next_call(events: &mut mpsc::Receiver<Bytes>) -> Value {
        let event = events.recv().await.unwrap();
        let text = std::str::from_utf8(&event).unwrap();
        let data = text.strip_prefix("event: call\ndata: ").unwrap_or_else(|| panic!("{text}"));
        serde_json::from_str(data.trim_end()).unwrap()
    }

    #[tokio::test]
    async fn arguments_kept_by_the_tenant_are_shown_cut_at_2_kib_on_a_character() {
        let feed = Feed::default();
        let mut events = feed.watch(None).unwrap();
        events.recv().await.unwrap();
        let mut short = record("acme");
        short.arguments = Some(r#"{"q":"weather"}"#.into());
        feed.publish(&short);
        let shown = next_call(&mut events).await;
        assert_eq!(shown["arguments"], r#"{"q":"weather"}"#);
        assert!(shown.get("arguments_truncated").is_none(), "{shown}");
        // 2047 ASCII bytes, then a 3-byte character across the limit.
        let mut long = record("acme");
        long.arguments = Some(format!("{}€ and more", "a".repeat(MAX_ARGUMENTS - 1)));
        feed.publish(&long);
        let shown = next_call(&mut events).await;
        assert_eq!(shown["arguments"].as_str().unwrap(), "a".repeat(MAX_ARGUMENTS - 1));
        assert_eq!(shown["arguments_truncated"], true);
    }

    #[tokio::test]
    async fn watchers_are_bounded_and_one_that_leaves_makes_room() {
        let feed = Feed::default();
        let mut held: Vec<_> = (0..MAX_WATCHERS).map(|_| feed.watch(None).unwrap()).collect();
        assert!(feed.watch(None).is_none());
        // One leaves: its task notices (at the next event) and frees its slot.
        drop(held.pop());
        feed.publish(&record("acme"));
        let mut room = None;
        for _ in 0..100 {
            tokio::task::yield_now().await;
            if let Some(watch) = feed.watch(None) {
                room = Some(watch);
                break;
            }
        }
        assert!(room.is_some(), "a watcher that left kept its slot");
    }
}
