//! Legacy HTTP+SSE upstreams (MCP 2024-11-05): a long-lived `GET` on the
//! configured URL whose first event, `endpoint`, names where to POST; every
//! answer and server message then arrives on that one stream.
//!
//! Each channel is its own connection (its own upstream session), so the
//! client's ids and progress tokens pass through unchanged and answers are
//! matched by id. Messages not tied to a request go to the request in flight
//! when there is exactly one (they belong to it, as far as anyone can tell),
//! otherwise to the channel's inbox. When the stream ends the session is
//! gone; the next request connects and initialises again, transparently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::Uri;
use switchboard_core::credential::Credential;
use switchboard_protocol::jsonrpc::{self, Envelope, MessageKind};
use switchboard_protocol::{sse, Method};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{h1, Handshake, Hello, Inbox, Outgoing, Reply, SinkStream, UpstreamError};
use crate::config::HttpConfig;
use crate::Metrics;

const MAX_MESSAGE: usize = 64 << 20;

/// A legacy HTTP+SSE upstream.
pub struct Transport {
    shared: Arc<Shared>,
}

struct Shared {
    name: Arc<str>,
    pool: Arc<h1::Pool>,
    /// The SSE endpoint's path and query.
    path: String,
    raw_headers: Vec<u8>,
    /// The router's own credential, obtained when needed (in place of `raw_headers`).
    own: Option<Arc<dyn super::OwnCredential>>,
    handshake_timeout: Duration,
    metrics: Arc<Metrics>,
}

type Sink = mpsc::UnboundedSender<(bool, Bytes)>;

struct Pending {
    token: Option<Box<str>>,
    sink: Sink,
}

/// One GET stream and what depends on it. Dropping it stops its reader.
struct Connection {
    /// Where to POST (path and query).
    endpoint: String,
    pending: Mutex<HashMap<Box<str>, Pending>>,
    alive: AtomicBool,
    reader: Mutex<Option<JoinHandle<()>>>,
    handshake: Mutex<Arc<Handshake>>,
}

impl Transport {
    /// A transport for `config.url` (the SSE endpoint); connects lazily.
    pub fn new(name: Arc<str>, config: &HttpConfig, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        let connect = h1::Connect::to(&config.url, config.connect_timeout, config.tls.as_ref(), &config.egress)
            .expect("validated: an https upstream has its TLS configuration");
        let authority = config.url.authority().map_or("localhost", |a| a.as_str());
        let raw_headers = h1::raw_headers(&config.headers);
        Transport {
            shared: Arc::new(Shared {
                name,
                pool: h1::Pool::new(connect, authority, config.pool_max_idle),
                path: config.url.path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
                raw_headers,
                own: config.own.as_ref().map(|o| o.0.clone()),
                handshake_timeout: timeout.min(Duration::from_secs(30)),
                metrics,
            }),
        }
    }
}

#[async_trait]
impl super::Transport for Transport {
    async fn open(&self, hello: &Hello, inbox: Arc<dyn Inbox>) -> Result<Arc<dyn super::Channel>, UpstreamError> {
        let connection = connect(&self.shared, hello, &inbox).await?;
        self.shared.metrics.set_era(&self.shared.name, super::Era::LegacySse);
        Ok(Arc::new(Channel {
            shared: self.shared.clone(),
            hello: hello.clone(),
            inbox,
            connection: RwLock::new(connection),
            reconnect: tokio::sync::Mutex::new(()),
        }))
    }

    async fn shutdown(&self) {}
}

impl Shared {
    /// What a request of `hello`'s caller carries: its credential, else the
    /// router's own obtained one, else (`None`) the configured headers.
    async fn credential(&self, hello: &Hello) -> Result<Option<Arc<Credential>>, UpstreamError> {
        match (crate::credential(hello.credentials.as_ref())?, &self.own) {
            (Some(credential), _) => Ok(Some(credential)),
            (None, Some(own)) => own.current().await.map(Some),
            (None, None) => Ok(None),
        }
    }

    /// POSTs a message to the endpoint, with the credential of `hello`'s
    /// caller (or the upstream's own headers).
    async fn post(&self, path: &str, body: &[u8], hello: &Hello) -> Result<(), UpstreamError> {
        let credential = self.credential(hello).await?;
        let request = h1::Request {
            method: "POST",
            path,
            headers: &[("Content-Type", b"application/json")],
            more: &[],
            extra: credential.as_deref().map_or(&self.raw_headers[..], Credential::raw),
            body,
        };
        let response =
            self.pool.send(&request, false).await.map_err(|e| UpstreamError::Connect(crate::Cause::from_error(e)))?;
        let status = response.status;
        let text = response.body.collect(64 << 10).await.unwrap_or_default();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(UpstreamError::Status {
                status,
                detail: String::from_utf8_lossy(&text).trim().chars().take(200).collect(),
            })
        }
    }
}

/// Opens the GET stream, learns the endpoint, runs `initialize`.
async fn connect(
    shared: &Arc<Shared>,
    hello: &Hello,
    inbox: &Arc<dyn Inbox>,
) -> Result<Arc<Connection>, UpstreamError> {
    let work = async {
        let credential = shared.credential(hello).await?;
        let request = h1::Request {
            method: "GET",
            path: &shared.path,
            headers: &[("Accept", b"text/event-stream")],
            more: &[],
            extra: credential.as_deref().map_or(&shared.raw_headers[..], Credential::raw),
            body: b"",
        };
        let response =
            shared.pool.send(&request, false).await.map_err(|e| UpstreamError::Connect(crate::Cause::from_error(e)))?;
        if !(200..300).contains(&response.status) || !response.event_stream {
            return Err(UpstreamError::Status {
                status: response.status,
                detail: "the SSE endpoint did not answer with an event stream".into(),
            });
        }
        let mut body = response.body;
        let mut decoder = sse::Decoder::new(MAX_MESSAGE);
        let endpoint = loop {
            if let Some(event) =
                decoder.next_event().map_err(|e| UpstreamError::Protocol(crate::Cause::from_error(e)))?
            {
                if event.event.as_deref() == Some("endpoint") {
                    break resolve_endpoint(&shared.path, &String::from_utf8_lossy(&event.data))?;
                }
                continue;
            }
            match body.chunk().await {
                Some(Ok(data)) => decoder.push(&data),
                Some(Err(e)) => return Err(UpstreamError::Connect(crate::Cause::from_error(e))),
                None => return Err(UpstreamError::Protocol("the stream ended before the endpoint event".into())),
            }
        };
        let connection = Arc::new(Connection {
            endpoint,
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            reader: Mutex::new(None),
            handshake: Mutex::new(Arc::default()),
        });
        let reader = tokio::spawn(read(Arc::downgrade(&connection), body, decoder, inbox.clone(), shared.clone()));
        *connection.reader.lock().expect("lock") = Some(reader);

        // initialize, answered on the stream.
        let (tx, mut rx) = mpsc::unbounded_channel();
        connection.pending.lock().expect("lock").insert("0".into(), Pending { token: None, sink: tx });
        let init = jsonrpc::request(Some(b"0"), "initialize", Some(&hello.params()));
        shared.post(&connection.endpoint, &init, hello).await?;
        let answer = loop {
            match rx.recv().await {
                Some((true, message)) => break message,
                Some((false, _)) => continue,
                None => return Err(UpstreamError::Closed),
            }
        };
        let handshake = Handshake::from_response(&answer)?;
        *connection.handshake.lock().expect("lock") = Arc::new(handshake);
        let note = jsonrpc::request(None, "notifications/initialized", None);
        shared.post(&connection.endpoint, &note, hello).await?;
        Ok(connection)
    };
    match tokio::time::timeout(shared.handshake_timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(UpstreamError::Timeout(shared.handshake_timeout)),
    }
}

/// The POST target announced by the `endpoint` event: an absolute path, a
/// URL on the same server, or a path relative to the SSE endpoint.
fn resolve_endpoint(sse_path: &str, announced: &str) -> Result<String, UpstreamError> {
    let announced = announced.trim();
    if announced.starts_with("http://") || announced.starts_with("https://") {
        let uri: Uri =
            announced.parse().map_err(|_| UpstreamError::Protocol(format!("bad endpoint {announced:?}").into()))?;
        return Ok(uri.path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()));
    }
    if announced.starts_with('/') {
        return Ok(announced.to_owned());
    }
    let dir = sse_path.split('?').next().unwrap_or("/");
    let dir = &dir[..dir.rfind('/').map_or(0, |i| i + 1)];
    Ok(format!("{}{announced}", if dir.is_empty() { "/" } else { dir }))
}

/// Reads the stream and routes each message.
async fn read(
    connection: Weak<Connection>,
    mut body: h1::Body,
    mut decoder: sse::Decoder,
    inbox: Arc<dyn Inbox>,
    shared: Arc<Shared>,
) {
    'stream: loop {
        loop {
            match decoder.next_event() {
                Ok(Some(event)) => {
                    if event.data.is_empty() || !event.is_message() {
                        continue;
                    }
                    let Some(connection) = connection.upgrade() else { return };
                    dispatch(&connection, &inbox, &shared, event.data);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(upstream = %shared.name, error = %e, "legacy SSE stream refused");
                    break 'stream;
                }
            }
        }
        if connection.strong_count() == 0 {
            return;
        }
        match body.chunk().await {
            Some(Ok(data)) => decoder.push(&data),
            _ => break,
        }
    }
    if let Some(connection) = connection.upgrade() {
        let mut pending = connection.pending.lock().expect("lock");
        connection.alive.store(false, Ordering::SeqCst);
        pending.clear();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.lock().expect("lock").take() {
            reader.abort();
        }
    }
}

fn dispatch(connection: &Connection, inbox: &Arc<dyn Inbox>, shared: &Shared, message: Bytes) {
    let Ok(env) = Envelope::parse(&message) else {
        shared.metrics.protocol_error(&shared.name);
        return;
    };
    let mut pending = connection.pending.lock().expect("lock");
    match env.kind {
        MessageKind::Response | MessageKind::Error => {
            if let Some(p) = env.id.and_then(|id| pending.remove(id.get())) {
                let _ = p.sink.send((true, message));
            }
        }
        MessageKind::Notification if Method::from_name(env.method_str()) == Method::Progress => {
            let token = env.params.and_then(jsonrpc::progress_token).map(|t| t.get().to_owned());
            match token.and_then(|t| pending.values().find(|p| p.token.as_deref() == Some(&t)).map(|p| p.sink.clone()))
            {
                Some(sink) => {
                    let _ = sink.send((false, message));
                }
                None => shared.metrics.relay_dropped(&shared.name, "unattributable_notification"),
            }
        }
        _ => {
            let sole = (pending.len() == 1).then(|| pending.values().next().map(|p| p.sink.clone())).flatten();
            drop(pending);
            match sole {
                Some(sink) if Method::from_name(env.method_str()).list_changed().is_none() => {
                    let _ = sink.send((false, message));
                }
                _ => inbox.deliver(message),
            }
        }
    }
}

/// One upstream session over legacy HTTP+SSE.
struct Channel {
    shared: Arc<Shared>,
    hello: Hello,
    inbox: Arc<dyn Inbox>,
    connection: RwLock<Arc<Connection>>,
    reconnect: tokio::sync::Mutex<()>,
}

impl Channel {
    /// The live connection, reconnecting (and re-initialising) if the stream ended.
    async fn live(&self) -> Result<Arc<Connection>, UpstreamError> {
        let current = self.connection.read().expect("lock").clone();
        if current.alive.load(Ordering::SeqCst) {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnect.lock().await;
        let current = self.connection.read().expect("lock").clone();
        if current.alive.load(Ordering::SeqCst) {
            return Ok(current);
        }
        let fresh = connect(&self.shared, &self.hello, &self.inbox).await?;
        *self.connection.write().expect("lock") = fresh.clone();
        self.shared.metrics.reinitialized(&self.shared.name);
        tracing::info!(upstream = %self.shared.name, "legacy SSE stream ended; reconnected and re-initialised");
        Ok(fresh)
    }
}

/// Unregisters a request when its caller stops waiting.
struct PendingGuard {
    connection: Weak<Connection>,
    id: Box<str>,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.upgrade() {
            connection.pending.lock().expect("lock").remove(&self.id);
        }
    }
}

#[async_trait]
impl super::Channel for Channel {
    async fn request(&self, out: Outgoing) -> Result<Reply, UpstreamError> {
        let connection = self.live().await?;
        let id: Box<str> = String::from_utf8_lossy(&out.body[out.id.clone()]).into();
        let token = out.progress_token.clone().map(|r| String::from_utf8_lossy(&out.body[r]).into());
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut pending = connection.pending.lock().expect("lock");
            // The reader clears `pending` when the stream ends; don't wait on a dead one.
            if !connection.alive.load(Ordering::SeqCst) {
                return Err(UpstreamError::Closed);
            }
            pending.insert(id.clone(), Pending { token, sink: tx });
        }
        let guard = PendingGuard { connection: Arc::downgrade(&connection), id };
        self.shared.post(&connection.endpoint, &out.body, &self.hello).await?;
        match rx.recv().await {
            None => Err(UpstreamError::Closed),
            Some((true, response)) => Ok(Reply::Done(response)),
            Some((false, first)) => Ok(Reply::Stream(Box::new(SinkStream::new(first, rx, guard)))),
        }
    }

    async fn send(&self, message: Bytes) -> Result<(), UpstreamError> {
        let limit = self.shared.handshake_timeout;
        let work = async {
            let connection = self.live().await?;
            self.shared.post(&connection.endpoint, &message, &self.hello).await
        };
        tokio::time::timeout(limit, work).await.unwrap_or(Err(UpstreamError::Timeout(limit)))
    }

    fn listen(&self) {}

    fn handshake(&self) -> Arc<Handshake> {
        self.connection.read().expect("lock").handshake.lock().expect("lock").clone()
    }

    async fn close(&self) {
        let connection = self.connection.read().expect("lock").clone();
        connection.alive.store(false, Ordering::SeqCst);
        let reader = connection.reader.lock().expect("lock").take();
        if let Some(reader) = reader {
            reader.abort();
        }
        connection.pending.lock().expect("lock").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_resolve_against_the_sse_url() {
        assert_eq!(resolve_endpoint("/sse", "/message?sessionId=1").unwrap(), "/message?sessionId=1");
        assert_eq!(resolve_endpoint("/a/sse", "messages/?session_id=2").unwrap(), "/a/messages/?session_id=2");
        assert_eq!(resolve_endpoint("/sse", "http://h:1/x/messages?s=3").unwrap(), "/x/messages?s=3");
    }
}
