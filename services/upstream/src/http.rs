//! Streamable HTTP upstreams (MCP 2025-03-26 and later).
//!
//! Requests go through our own keep-alive HTTP/1.1 pool (`h1.rs`), or
//! through hyper's client for HTTP/2 with prior knowledge when configured;
//! [`Answer`] hides which. A [`Channel`](super::Channel) holds the
//! upstream's `Mcp-Session-Id` and negotiated version; when the upstream
//! answers 404 (or 400, as some servers do) for that session, the channel runs
//! `initialize` again and retries the request once, so the client never
//! notices an upstream restart. A server that issues no session id is
//! stateless: later channels skip the handshake altogether.
//!
//! Responses come back as `application/json` (returned whole) or
//! `text/event-stream` (returned as a [`MessageStream`] that reads events as
//! they arrive, and resumes with `Last-Event-ID` if the server closes the
//! stream before answering, as 2025-11-25 SSE polling allows).
//!
//! This module must never forward anything from the downstream request
//! except the JSON-RPC body the router built.

use std::error::Error as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use switchboard_protocol::{jsonrpc, sse};
use tokio::task::JoinHandle;

use super::{collect_response, h1, Handshake, Hello, Inbox, Item, MessageStream, Outgoing, Reply, UpstreamError};
use crate::config::HttpConfig;
use crate::Metrics;
use switchboard_core::body::CollectError;

/// Largest message accepted from an upstream.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

static SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
static PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
static LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
static MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const JSON: HeaderValue = HeaderValue::from_static("application/json");
const JSON_AND_SSE: HeaderValue = HeaderValue::from_static("application/json, text/event-stream");
const SSE: HeaderValue = HeaderValue::from_static("text/event-stream");

const UNKNOWN: u8 = 0;
const STATELESS: u8 = 1;
const STATEFUL: u8 = 2;

/// A Streamable HTTP upstream: one server, or several replicas of one.
pub struct Transport {
    replicas: Arc<Replicas>,
    /// Checks the replicas' health (with several).
    health: Mutex<Option<JoinHandle<()>>>,
}

/// The replicas of one upstream, and which of them are up.
struct Replicas {
    name: Arc<str>,
    members: Vec<Arc<Shared>>,
    up: Vec<AtomicBool>,
    /// Failed periodic probes in a row, per replica.
    failures: Vec<std::sync::atomic::AtomicU32>,
    connect_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Replicas {
    /// The replica for `key` (a session id, or "" for the router's own
    /// channels) by rendezvous hashing over the replicas that are up (all of
    /// them if none is), leaving out `avoid`: a key keeps its replica while
    /// that replica is up, and only the keys of a replica that goes down move.
    fn pick(&self, key: &str, avoid: Option<usize>) -> usize {
        let score = |i: usize| {
            let mut bytes = Vec::with_capacity(key.len() + self.members[i].replica.len() + 1);
            bytes.extend_from_slice(key.as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(self.members[i].replica.as_bytes());
            switchboard_core::hash::fnv1a64(&bytes)
        };
        let candidates: Vec<usize> = (0..self.members.len()).filter(|&i| Some(i) != avoid).collect();
        let live: Vec<usize> = candidates.iter().copied().filter(|&i| self.is_up(i)).collect();
        let pool = if live.is_empty() { &candidates } else { &live };
        pool.iter().copied().max_by_key(|&i| score(i)).unwrap_or(0)
    }

    fn is_up(&self, i: usize) -> bool {
        self.up[i].load(Ordering::Relaxed)
    }

    fn several(&self) -> bool {
        self.members.len() > 1
    }

    /// Records replica `i`'s health, logging changes.
    fn mark(&self, i: usize, up: bool) {
        if self.up[i].swap(up, Ordering::Relaxed) != up {
            let replica = &self.members[i].replica;
            if up {
                tracing::info!(upstream = %self.name, %replica, "upstream replica is up again");
            } else {
                tracing::warn!(upstream = %self.name, %replica, "upstream replica is down; its sessions move to another");
            }
        }
        self.metrics.set_replica_up(&self.name, &self.members[i].replica, up);
    }

    /// Whether replica `i` accepts a TCP connection now.
    async fn accepts(&self, i: usize) -> bool {
        let address = &self.members[i].address;
        matches!(tokio::time::timeout(self.connect_timeout, tokio::net::TcpStream::connect(address)).await, Ok(Ok(_)))
    }

    /// After a request to replica `i` could not connect: whether it accepts
    /// connections now; if not, it is marked down at once.
    async fn probe(&self, i: usize) -> bool {
        let up = self.accepts(i).await;
        if !up {
            self.mark(i, false);
        }
        up
    }

    /// A periodic check of replica `i`: up at the first success, down after
    /// two failures in a row (one lost probe does not move its sessions).
    async fn check(&self, i: usize) {
        if self.accepts(i).await {
            self.failures[i].store(0, Ordering::Relaxed);
            self.mark(i, true);
        } else if self.failures[i].fetch_add(1, Ordering::Relaxed) + 1 >= 2 {
            self.mark(i, false);
        }
    }
}

/// Checks every replica every `every`, until the replicas are dropped.
async fn health_loop(replicas: Weak<Replicas>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(replicas) = replicas.upgrade() else { return };
        let checks = (0..replicas.members.len()).map(|i| replicas.check(i));
        futures_util::future::join_all(checks).await;
    }
}

struct Shared {
    name: Arc<str>,
    /// Its place among the upstream's replicas.
    index: usize,
    url: Uri,
    /// The URL as text: which replica an upstream session is on.
    replica: String,
    /// `host:port`, for health probes.
    address: String,
    /// The last handshake's answer, for channels resumed without one.
    last_handshake: Mutex<Option<Arc<Handshake>>>,
    /// `Host`, prebuilt (the client would otherwise build it per request).
    host: HeaderValue,
    /// The request target (path and query).
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The configured headers as raw `\r\nName: value` lines, for HTTP/1.1.
    raw_headers: Vec<u8>,
    client: Client,
    handshake_timeout: Duration,
    metrics: Arc<Metrics>,
    /// Whether the server issues session ids, learned from the first handshake.
    statefulness: AtomicU8,
    stateless_handshake: Mutex<Option<(HeaderValue, Arc<Handshake>)>>,
}

impl Transport {
    /// A transport for `config`; connects lazily. With several replicas,
    /// starts their health checks (so it must run inside a Tokio runtime).
    pub fn new(name: Arc<str>, config: &HttpConfig, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        let members: Vec<Arc<Shared>> = config
            .replicas
            .iter()
            .enumerate()
            .map(|(index, url)| Arc::new(Shared::new(name.clone(), index, url, config, timeout, metrics.clone())))
            .collect();
        let replicas = Arc::new(Replicas {
            name,
            up: members.iter().map(|_| AtomicBool::new(true)).collect(),
            failures: members.iter().map(|_| Default::default()).collect(),
            members,
            connect_timeout: config.connect_timeout,
            metrics,
        });
        let health = if replicas.several() {
            for i in 0..replicas.members.len() {
                replicas.mark(i, true);
            }
            Some(tokio::spawn(health_loop(Arc::downgrade(&replicas), config.health_interval)))
        } else {
            None
        };
        Transport { replicas, health: Mutex::new(health) }
    }
}

impl Shared {
    fn new(
        name: Arc<str>,
        index: usize,
        url: &Uri,
        config: &HttpConfig,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Shared {
        let host = url.host().unwrap_or("localhost");
        let port = url.port_u16().unwrap_or(80);
        let address = format!("{host}:{port}");
        let client = if config.http2 {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(Some(config.connect_timeout));
            connector.set_keepalive(Some(Duration::from_secs(60)));
            Client::Http2(Box::new(
                HyperClient::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .http2_only(true)
                    .build(connector),
            ))
        } else {
            let authority = host_header(url);
            let authority = authority.to_str().unwrap_or("localhost");
            Client::Http1(h1::Pool::new(address.clone(), authority, config.pool_max_idle, config.connect_timeout))
        };
        Shared {
            name,
            index,
            host: host_header(url),
            path: url.path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            url: url.clone(),
            replica: url.to_string(),
            address,
            last_handshake: Mutex::new(None),
            headers: config.headers.clone(),
            raw_headers: h1::raw_headers(&config.headers),
            client,
            handshake_timeout: timeout.min(Duration::from_secs(30)),
            metrics,
            statefulness: AtomicU8::new(UNKNOWN),
            stateless_handshake: Mutex::new(None),
        }
    }
}

/// How requests reach the upstream.
enum Client {
    /// Our keep-alive HTTP/1.1 pool: the request's task does the I/O.
    Http1(Arc<h1::Pool>),
    /// HTTP/2 with prior knowledge, through hyper (one multiplexed connection).
    Http2(Box<HyperClient<HttpConnector, Full<Bytes>>>),
}

/// An upstream's answer: the status, the two headers MCP needs, the body.
struct Answer {
    status: StatusCode,
    event_stream: bool,
    session_id: Option<HeaderValue>,
    body: AnswerBody,
}

enum AnswerBody {
    Http1(h1::Body),
    Http2(Incoming),
}

impl AnswerBody {
    /// The next piece of the body.
    async fn chunk(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        match self {
            AnswerBody::Http1(body) => body.chunk().await.map(|r| r.map_err(|e| UpstreamError::Connect(e.to_string()))),
            AnswerBody::Http2(body) => loop {
                match body.frame().await? {
                    Ok(frame) => {
                        if let Ok(data) = frame.into_data() {
                            return Some(Ok(data));
                        }
                    }
                    Err(e) => return Some(Err(UpstreamError::Connect(e.to_string()))),
                }
            },
        }
    }

    /// The whole body, at most `limit` bytes.
    async fn collect(self, limit: usize) -> Result<Bytes, UpstreamError> {
        match self {
            AnswerBody::Http1(body) => body.collect(limit).await.map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => UpstreamError::Protocol(e.to_string()),
                _ => UpstreamError::Connect(format!("reading the response: {e}")),
            }),
            AnswerBody::Http2(body) => match switchboard_core::body::collect(body, limit).await {
                Ok(body) => Ok(body),
                Err(CollectError::TooLarge) => {
                    Err(UpstreamError::Protocol(format!("a response larger than {limit} bytes")))
                }
                Err(CollectError::Read(e)) => Err(UpstreamError::Connect(format!("reading the response: {e}"))),
            },
        }
    }
}

#[async_trait]
impl super::Transport for Transport {
    async fn open(&self, hello: &Hello, inbox: Arc<dyn Inbox>) -> Result<Arc<dyn super::Channel>, UpstreamError> {
        let replicas = &self.replicas;
        let mut avoid = None;
        loop {
            let i = replicas.pick(&hello.affinity, avoid);
            let shared = &replicas.members[i];
            if shared.statefulness.load(Ordering::Relaxed) == STATELESS {
                if let Some((version, handshake)) = shared.stateless_handshake.lock().expect("lock").clone() {
                    let state = SessionState { shared: shared.clone(), sid: None, version, handshake, epoch: 0 };
                    return Ok(Channel::open(replicas.clone(), hello.clone(), state, inbox));
                }
            }
            let state = match shared.handshake(hello).await {
                Ok(state) => state,
                // A replica that is down: mark it and try another, once.
                Err(e @ UpstreamError::Connect(_)) if replicas.several() && avoid.is_none() => {
                    if replicas.probe(i).await {
                        return Err(e);
                    }
                    avoid = Some(i);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if state.sid.is_none() {
                shared.statefulness.store(STATELESS, Ordering::Relaxed);
                *shared.stateless_handshake.lock().expect("lock") =
                    Some((state.version.clone(), state.handshake.clone()));
            } else {
                shared.statefulness.store(STATEFUL, Ordering::Relaxed);
            }
            return Ok(Channel::open(replicas.clone(), hello.clone(), state, inbox));
        }
    }

    async fn modern(
        &self,
        body: Bytes,
        method: switchboard_protocol::Method,
        headers: Vec<(HeaderName, HeaderValue)>,
        affinity: &str,
    ) -> Result<super::ModernAnswer, UpstreamError> {
        let mut all = Vec::with_capacity(headers.len() + 2);
        all.push((PROTOCOL_VERSION.clone(), HeaderValue::from_static("2026-07-28")));
        all.push((MCP_METHOD.clone(), HeaderValue::from_static(method.as_str())));
        all.extend(headers);
        let replicas = &self.replicas;
        let mut avoid = None;
        let resp = loop {
            let i = replicas.pick(affinity, avoid);
            match replicas.members[i].send(Method::POST, body.clone(), None, None, false, &all).await {
                Ok(resp) => break resp,
                Err(e @ UpstreamError::Connect(_)) if replicas.several() && avoid.is_none() => {
                    if replicas.probe(i).await {
                        return Err(e);
                    }
                    avoid = Some(i);
                }
                Err(e) => return Err(e),
            }
        };
        let status = resp.status.as_u16();
        if resp.status.is_success() && resp.event_stream {
            return Ok(super::ModernAnswer { status, reply: Reply::Stream(Box::new(SseStream::new(resp.body, None))) });
        }
        if resp.status == StatusCode::ACCEPTED {
            return Err(UpstreamError::Protocol("202 Accepted for a request".into()));
        }
        let body = resp.body.collect(MAX_MESSAGE_BYTES).await?;
        // A JSON-RPC message, whatever the status (4xx errors are the era's).
        if switchboard_protocol::Envelope::parse(&body).is_ok_and(|e| e.id.is_some()) {
            return Ok(super::ModernAnswer { status, reply: Reply::Done(body) });
        }
        let detail = String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned();
        Err(UpstreamError::Status { status, detail })
    }

    fn resume(
        &self,
        hello: &Hello,
        inbox: Arc<dyn Inbox>,
        at: &super::UpstreamSession,
    ) -> Option<Arc<dyn super::Channel>> {
        // A replica that is gone from the configuration, or down: the
        // session is opened afresh on a live one instead.
        let i = self.replicas.members.iter().position(|m| m.replica == at.replica)?;
        if !self.replicas.is_up(i) {
            return None;
        }
        let shared = self.replicas.members[i].clone();
        let sid = HeaderValue::from_str(&at.session).ok()?;
        let version = HeaderValue::from_str(&at.version).ok()?;
        let handshake = shared.last_handshake.lock().expect("lock").clone().unwrap_or_default();
        let _ = shared.statefulness.compare_exchange(UNKNOWN, STATEFUL, Ordering::Relaxed, Ordering::Relaxed);
        let state = SessionState { shared, sid: Some(sid), version, handshake, epoch: 0 };
        Some(Channel::open(self.replicas.clone(), hello.clone(), state, inbox))
    }

    async fn shutdown(&self) {
        if let Some(health) = self.health.lock().expect("lock").take() {
            health.abort();
        }
    }
}

/// The upstream session a channel is on.
#[derive(Clone)]
struct SessionState {
    /// The replica that holds it.
    shared: Arc<Shared>,
    sid: Option<HeaderValue>,
    version: HeaderValue,
    handshake: Arc<Handshake>,
    /// Bumped on every re-initialisation.
    epoch: u64,
}

impl Shared {
    /// Sends one request: a POST with `body`, or (empty `body` and
    /// `Method::GET`) the GET stream, or a DELETE.
    async fn send(
        &self,
        method: Method,
        body: Bytes,
        state: Option<&SessionState>,
        last_event_id: Option<&str>,
        want_session_id: bool,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Result<Answer, UpstreamError> {
        let last_event_id = last_event_id.and_then(|id| HeaderValue::from_str(id).ok());
        match &self.client {
            Client::Http1(pool) => {
                let mut headers: [(&str, &[u8]); 5] = [("", b""); 5];
                let mut n = 0;
                if method == Method::POST {
                    headers[n] = ("Content-Type", b"application/json");
                    n += 1;
                }
                if method != Method::DELETE {
                    let accept: &[u8] = if method == Method::GET {
                        b"text/event-stream"
                    } else {
                        b"application/json, text/event-stream"
                    };
                    headers[n] = ("Accept", accept);
                    n += 1;
                }
                if let Some(state) = state {
                    if let Some(sid) = &state.sid {
                        headers[n] = ("Mcp-Session-Id", sid.as_bytes());
                        n += 1;
                    }
                    headers[n] = ("Mcp-Protocol-Version", state.version.as_bytes());
                    n += 1;
                }
                if let Some(id) = &last_event_id {
                    headers[n] = ("Last-Event-ID", id.as_bytes());
                    n += 1;
                }
                // Stateless requests' headers: an allocation only for them.
                let with_extra: Vec<(&str, &[u8])>;
                let headers: &[(&str, &[u8])] = if extra.is_empty() {
                    &headers[..n]
                } else {
                    with_extra = headers[..n]
                        .iter()
                        .copied()
                        .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_bytes())))
                        .collect();
                    &with_extra
                };
                let request = h1::Request {
                    method: match method {
                        Method::GET => "GET",
                        Method::DELETE => "DELETE",
                        _ => "POST",
                    },
                    path: &self.path,
                    headers,
                    extra: &self.raw_headers,
                    body: &body,
                };
                let response =
                    pool.send(&request, want_session_id).await.map_err(|e| UpstreamError::Connect(e.to_string()))?;
                Ok(Answer {
                    status: StatusCode::from_u16(response.status)
                        .map_err(|_| UpstreamError::Protocol(format!("invalid status {}", response.status)))?,
                    event_stream: response.event_stream,
                    session_id: response.session_id.and_then(|b| HeaderValue::from_maybe_shared(b).ok()),
                    body: AnswerBody::Http1(response.body),
                })
            }
            Client::Http2(client) => {
                let mut req = Request::new(Full::new(body));
                *req.method_mut() = method.clone();
                *req.uri_mut() = self.url.clone();
                let h = req.headers_mut();
                h.reserve(8);
                h.insert(HOST, self.host.clone());
                if method == Method::POST {
                    h.insert(CONTENT_TYPE, JSON);
                }
                if method == Method::GET {
                    h.insert(ACCEPT, SSE);
                } else if method == Method::POST {
                    h.insert(ACCEPT, JSON_AND_SSE);
                }
                if let Some(state) = state {
                    if let Some(sid) = &state.sid {
                        h.insert(SESSION_ID.clone(), sid.clone());
                    }
                    h.insert(PROTOCOL_VERSION.clone(), state.version.clone());
                }
                if let Some(id) = last_event_id {
                    h.insert(LAST_EVENT_ID.clone(), id);
                }
                for (name, value) in &self.headers {
                    h.insert(name.clone(), value.clone());
                }
                for (name, value) in extra {
                    h.insert(name.clone(), value.clone());
                }
                let resp = client.request(req).await.map_err(|e| UpstreamError::Connect(describe(&e)))?;
                let event_stream = resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|ct| {
                    ct.trim_start().get(..17).is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
                });
                let session_id = resp.headers().get(&SESSION_ID).cloned();
                Ok(Answer {
                    status: resp.status(),
                    event_stream,
                    session_id,
                    body: AnswerBody::Http2(resp.into_body()),
                })
            }
        }
    }

    /// POSTs one message on the session `state`.
    async fn post(&self, body: Bytes, state: Option<&SessionState>) -> Result<Answer, UpstreamError> {
        self.send(Method::POST, body, state, None, state.is_none(), &[]).await
    }

    /// GETs the session's stream, optionally resuming after `last_event_id`.
    async fn get(&self, state: &SessionState, last_event_id: Option<&str>) -> Result<Answer, UpstreamError> {
        self.send(Method::GET, Bytes::new(), Some(state), last_event_id, false, &[]).await
    }

    /// `initialize`, then `notifications/initialized`.
    async fn handshake(self: &Arc<Self>, hello: &Hello) -> Result<SessionState, UpstreamError> {
        let work = async {
            let body = jsonrpc::request(Some(b"0"), "initialize", Some(&hello.params()));
            let mut resp = self.post(body, None).await?;
            if !resp.status.is_success() || resp.status == StatusCode::ACCEPTED {
                let status = resp.status;
                let error = status_error(resp).await;
                // Kept as a status for these: what a legacy HTTP+SSE
                // server answers (see `detect.rs`).
                if matches!(status.as_u16(), 400 | 404 | 405) {
                    return Err(error);
                }
                return Err(UpstreamError::Initialize(error.to_string()));
            }
            let sid = resp.session_id.take();
            let reply = self.read_reply(resp, None).await?;
            let message = collect_response(reply, "0").await?;
            let handshake = Handshake::from_response(&message)?;
            let version = HeaderValue::from_str(&handshake.protocol_version)
                .unwrap_or_else(|_| HeaderValue::from_static(hello.protocol_version.as_str()));
            let handshake = Arc::new(handshake);
            *self.last_handshake.lock().expect("lock") = Some(handshake.clone());
            let mut state = SessionState { shared: self.clone(), sid, version, handshake, epoch: 0 };
            let note = jsonrpc::request(None, "notifications/initialized", None);
            let resp = self.post(note, Some(&state)).await?;
            if !resp.status.is_success() {
                return Err(UpstreamError::Initialize(format!(
                    "notifications/initialized: {}",
                    status_error(resp).await
                )));
            }
            drain(resp).await;
            state.epoch = 0;
            Ok(state)
        };
        match tokio::time::timeout(self.handshake_timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::Timeout(self.handshake_timeout)),
        }
    }

    /// Turns a successful response into a [`Reply`].
    async fn read_reply(self: &Arc<Self>, resp: Answer, state: Option<&SessionState>) -> Result<Reply, UpstreamError> {
        if resp.event_stream {
            return Ok(Reply::Stream(Box::new(SseStream::new(
                resp.body,
                state.map(|s| (Arc::downgrade(self), s.clone())),
            ))));
        }
        resp.body.collect(MAX_MESSAGE_BYTES).await.map(Reply::Done)
    }
}

/// One upstream session over Streamable HTTP, on one of the upstream's
/// replicas (it moves to another, with a new handshake, if that one dies).
struct Channel {
    replicas: Arc<Replicas>,
    hello: Hello,
    state: RwLock<SessionState>,
    reinit: tokio::sync::Mutex<()>,
    inbox: Arc<dyn Inbox>,
    listener: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    me: Weak<Channel>,
}

impl Channel {
    fn open(
        replicas: Arc<Replicas>,
        hello: Hello,
        state: SessionState,
        inbox: Arc<dyn Inbox>,
    ) -> Arc<dyn super::Channel> {
        Arc::new_cyclic(|me| Channel {
            replicas,
            hello,
            state: RwLock::new(state),
            reinit: tokio::sync::Mutex::new(()),
            inbox,
            listener: Mutex::new(None),
            closed: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    fn state(&self) -> SessionState {
        self.state.read().expect("lock").clone()
    }

    /// Runs `initialize` again unless another caller already did since
    /// `stale`: on the same replica, or (`move_away`) on another one, for a
    /// replica that is down.
    async fn reinitialize(&self, stale: &SessionState, move_away: bool) -> Result<(), UpstreamError> {
        let _one_at_a_time = self.reinit.lock().await;
        if self.state().epoch != stale.epoch {
            return Ok(());
        }
        let shared = if move_away {
            self.replicas.mark(stale.shared.index, false);
            self.replicas.members[self.replicas.pick(&self.hello.affinity, Some(stale.shared.index))].clone()
        } else {
            stale.shared.clone()
        };
        let mut fresh = shared.handshake(&self.hello).await?;
        fresh.epoch = stale.epoch + 1;
        *self.state.write().expect("lock") = fresh;
        shared.metrics.reinitialized(&shared.name);
        if move_away {
            tracing::info!(upstream = %shared.name, replica = %shared.replica, "upstream session moved to another replica; re-initialised");
        } else {
            tracing::info!(upstream = %shared.name, "upstream session expired; re-initialised");
        }
        self.inbox.session_changed();
        Ok(())
    }
}

#[async_trait]
impl super::Channel for Channel {
    async fn request(&self, out: Outgoing) -> Result<Reply, UpstreamError> {
        let mut retried = false;
        let mut moved = !self.replicas.several();
        let mut body = Some(out.body);
        loop {
            let state = self.state();
            // Its replica was found down (by the health checks): move first.
            if !moved && !self.replicas.is_up(state.shared.index) {
                self.reinitialize(&state, true).await?;
                moved = true;
                continue;
            }
            // Only an upstream session that can expire, or a replica that can
            // die, makes us send again: keep a copy of the body only then (a
            // first copy of a spliced body costs an allocation).
            let may_retry = (state.sid.is_some() && !retried) || !moved;
            let send = if may_retry { body.clone() } else { body.take() };
            let send = send.expect("the body is kept while a retry is possible");
            let resp = match state.shared.post(send, Some(&state)).await {
                Ok(resp) => resp,
                // The replica is gone (it refuses connections now, not just
                // this once): the session moves to another, and the request
                // follows it. A replica that still answers probes gets the
                // error back, unchanged.
                Err(e @ UpstreamError::Connect(_)) if !moved => {
                    if self.replicas.probe(state.shared.index).await {
                        return Err(e);
                    }
                    self.reinitialize(&state, true).await?;
                    moved = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let status = resp.status;
            if status.is_success() && status != StatusCode::ACCEPTED {
                return state.shared.read_reply(resp, Some(&state)).await;
            }
            if status == StatusCode::ACCEPTED {
                return Err(UpstreamError::Protocol("it answered a request with 202 Accepted".into()));
            }
            let error = status_error(resp).await;
            if session_lost(status, &error) && state.sid.is_some() && !retried {
                self.reinitialize(&state, false).await?;
                retried = true;
                continue;
            }
            return Err(error);
        }
    }

    async fn send(&self, message: Bytes) -> Result<(), UpstreamError> {
        let state = self.state();
        let limit = state.shared.handshake_timeout;
        let work = async {
            let resp = state.shared.post(message, Some(&state)).await?;
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
        *listener = Some(tokio::spawn(listen_loop(me)));
    }

    fn handshake(&self) -> Arc<Handshake> {
        self.state().handshake
    }

    fn upstream_session(&self) -> Option<super::UpstreamSession> {
        let state = self.state();
        Some(super::UpstreamSession {
            replica: state.shared.replica.clone(),
            session: state.sid?.to_str().ok()?.to_owned(),
            version: state.version.to_str().ok()?.to_owned(),
        })
    }

    async fn detach(&self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(task) = self.listener.lock().expect("lock").take() {
            task.abort();
        }
    }

    async fn close(&self) {
        self.detach().await;
        let state = self.state();
        if state.sid.is_none() {
            return;
        }
        let delete = async {
            if let Ok(resp) = state.shared.send(Method::DELETE, Bytes::new(), Some(&state), None, false, &[]).await {
                drain(resp).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), delete).await;
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
        drop(me);
        match shared.get(&state, last_event_id.as_deref()).await {
            Ok(resp) if resp.status == StatusCode::METHOD_NOT_ALLOWED => return,
            // Not an event stream: the server offers none.
            Ok(resp) if resp.status.is_success() && !resp.event_stream => return,
            Ok(resp) if resp.status.is_success() => {
                let mut stream = SseStream::new(resp.body, None);
                let mut delivered = false;
                while let Some(message) = stream.next().await {
                    match message {
                        Ok(message) => {
                            delivered = true;
                            inbox.deliver(message);
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

/// Messages of one SSE response, resuming with `Last-Event-ID` when the
/// server ends the stream early.
struct SseStream {
    body: AnswerBody,
    decoder: sse::Decoder,
    resume: Option<(Weak<Shared>, SessionState)>,
    last_event_id: Option<String>,
    retry: Option<Duration>,
    resumes: u32,
    /// The stream ended early; resume on the next call.
    paused: bool,
}

impl SseStream {
    fn new(body: AnswerBody, resume: Option<(Weak<Shared>, SessionState)>) -> Self {
        SseStream {
            body,
            decoder: sse::Decoder::new(MAX_MESSAGE_BYTES),
            resume,
            last_event_id: None,
            retry: None,
            resumes: 0,
            paused: false,
        }
    }

    /// Whether the stream can be resumed with `Last-Event-ID`.
    fn can_resume(&self) -> bool {
        self.resume.is_some() && self.last_event_id.is_some() && self.resumes < 5
    }

    /// Reconnects with `Last-Event-ID`; false if that is not possible.
    async fn resume(&mut self) -> bool {
        if !self.can_resume() {
            return false;
        }
        let (Some((shared, state)), Some(last)) = (&self.resume, &self.last_event_id) else { return false };
        let Some(shared) = shared.upgrade() else { return false };
        self.resumes += 1;
        tokio::time::sleep(self.retry.unwrap_or(Duration::from_millis(100)).min(Duration::from_secs(10))).await;
        match shared.get(state, Some(last)).await {
            Ok(resp) if resp.status.is_success() => {
                self.body = resp.body;
                self.decoder = sse::Decoder::new(MAX_MESSAGE_BYTES);
                true
            }
            _ => false,
        }
    }
}

#[async_trait]
impl MessageStream for SseStream {
    async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>> {
        if std::mem::take(&mut self.paused) && !self.resume().await {
            return None;
        }
        loop {
            match self.decoder.next_event() {
                Err(e) => return Some(Err(UpstreamError::Protocol(e.to_string()))),
                Ok(Some(mut event)) => {
                    if let Some(id) = event.id.take() {
                        self.last_event_id = Some(id);
                    }
                    if let Some(ms) = event.retry {
                        self.retry = Some(Duration::from_millis(ms));
                    }
                    if event.data.is_empty() || !event.is_message() {
                        continue;
                    }
                    self.resumes = 0;
                    return Some(Ok(Item::Message(event.data)));
                }
                Ok(None) => {}
            }
            match self.body.chunk().await {
                Some(Ok(data)) => self.decoder.push(&data),
                // The server ended (or lost) the stream before answering: if it
                // gave an event id, we can resume with it; say so first.
                Some(Err(_)) | None if self.can_resume() => {
                    self.paused = true;
                    return Some(Ok(Item::Paused));
                }
                Some(Err(e)) => return Some(Err(UpstreamError::Connect(format!("stream broke: {e}")))),
                None => return None,
            }
        }
    }
}

/// The `Host` header for `url` (host, and port unless it is the default).
fn host_header(url: &Uri) -> HeaderValue {
    let authority = url.authority().map(|a| a.as_str()).unwrap_or("localhost");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    HeaderValue::from_str(host).unwrap_or_else(|_| HeaderValue::from_static("localhost"))
}

/// Reads and discards a body so the connection can be reused.
async fn drain(resp: Answer) {
    let _ = resp.body.collect(1 << 20).await;
}

/// An error for a non-success status, with the upstream's own message if it sent one.
async fn status_error(resp: Answer) -> UpstreamError {
    let status = resp.status.as_u16();
    let body = resp.body.collect(64 << 10).await.unwrap_or_default();
    let detail = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned());
    UpstreamError::Status { status, detail }
}

/// The most specific message in an error's source chain.
fn describe(err: &hyper_util::client::legacy::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        message = s.to_string();
        source = s.source();
    }
    message
}
