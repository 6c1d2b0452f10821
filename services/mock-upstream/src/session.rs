//! One client's state in the mock, and what the mock answers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_protocol::jsonrpc;
use tokio::sync::{mpsc, oneshot};

pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// What to answer.
pub(crate) enum Reply {
    /// A notification or response was taken (HTTP 202).
    Accepted,
    /// One message.
    Json(Bytes),
    /// Not a JSON-RPC message at all (HTTP 400).
    Invalid(Bytes),
    /// Related messages, then the response.
    Stream(mpsc::UnboundedReceiver<Bytes>),
    /// Like `Stream`, but the server ends the SSE response right after a
    /// priming event and the client must resume with `Last-Event-ID` (SSE
    /// polling, 2025-11-25). Over stdio it is an ordinary stream.
    Polled(mpsc::UnboundedReceiver<Bytes>),
}

/// One client's state.
pub(crate) struct Session {
    pub id: String,
    pub(crate) unsolicited: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    pub(crate) pending: Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) subscriptions: Mutex<HashSet<String>>,
    /// Events of polled streams, by stream number, for `Last-Event-ID`.
    pub(crate) polled: Mutex<HashMap<u64, Vec<Bytes>>>,
    pub(crate) next_stream: AtomicU64,
    /// Every distinct `Authorization` header its requests carried, in the
    /// order first seen (`""` for none).
    pub(crate) authorizations: Mutex<Vec<String>>,
    /// The `traceparent` header of its last request, if any.
    pub(crate) traceparent: Mutex<Option<String>>,
}

impl Session {
    pub(crate) fn new(id: String) -> Arc<Self> {
        Arc::new(Session {
            id,
            unsolicited: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            subscriptions: Mutex::new(HashSet::new()),
            polled: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            authorizations: Mutex::new(Vec::new()),
            traceparent: Mutex::new(None),
        })
    }

    /// Records the `Authorization` header of one of its requests.
    pub(crate) fn saw_authorization(&self, value: Option<&str>) {
        let value = value.unwrap_or("");
        let mut seen = self.authorizations.lock().expect("lock");
        if !seen.iter().any(|v| v == value) {
            seen.push(value.to_owned());
        }
    }

    /// Routes messages not tied to a request to `sink` from now on.
    pub fn set_unsolicited(&self, sink: mpsc::UnboundedSender<Bytes>) {
        *self.unsolicited.lock().expect("lock") = Some(sink);
    }

    /// Stops routing messages not tied to a request.
    pub fn clear_unsolicited(&self) {
        *self.unsolicited.lock().expect("lock") = None;
    }

    pub(crate) fn send_unsolicited(&self, message: Bytes) {
        if let Some(sink) = self.unsolicited.lock().expect("lock").as_ref() {
            let _ = sink.send(message);
        }
    }

    /// Sends a server-to-client request on `out` and waits for the answer.
    pub(crate) async fn ask(
        &self,
        out: &mpsc::UnboundedSender<Bytes>,
        method: &str,
        params: Value,
    ) -> Result<Value, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("lock").insert(id, tx);
        let params = serde_json::to_vec(&params).expect("serializable");
        let _ = out.send(jsonrpc::request(Some(id.to_string().as_bytes()), method, Some(&params)));
        let answer = tokio::time::timeout(Duration::from_secs(30), rx).await;
        self.pending.lock().expect("lock").remove(&id);
        let bytes = match answer {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => return Err("the request was dropped".into()),
            Err(_) => return Err(format!("no answer to {method} within 30 s")),
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        match (value.get("result"), value.get("error")) {
            (Some(result), _) => Ok(result.clone()),
            (_, Some(error)) => Err(error.to_string()),
            _ => Err("malformed answer".into()),
        }
    }

    pub(crate) fn resolve(&self, id: Option<&RawValue>, message: Bytes) {
        let Some(id) = id.and_then(|id| id.get().parse::<u64>().ok()) else { return };
        if let Some(waiter) = self.pending.lock().expect("lock").remove(&id) {
            let _ = waiter.send(message);
        }
    }
}
