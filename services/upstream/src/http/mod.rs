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

mod channel;
mod connector;
mod elsewhere;
mod replicas;
mod stream;

use std::error::Error as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use switchboard_protocol::jsonrpc::{self, MessageKind};
use tokio::task::JoinHandle;

use self::channel::Channel;
pub(crate) use self::channel::Channel as HttpChannel;
use self::replicas::{health_loop, Replicas};
use self::stream::{JsonValues, SseStream};
use crate::config::HttpConfig;
use crate::Metrics;
use crate::{collect_response, h1, Handshake, Hello, Inbox, OwnCredential, Reply, UpstreamError};
use switchboard_core::body::CollectError;
use switchboard_core::credential::{Credential, Credentials};

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

struct Shared {
    name: Arc<str>,
    /// Its place among the upstream's replicas.
    index: usize,
    url: Uri,
    /// The URL as text: which replica an upstream session is on.
    replica: String,
    /// How to connect, for health probes.
    connect: h1::Connect,
    /// The last handshake's answer, for channels resumed without one.
    last_handshake: Mutex<Option<Arc<Handshake>>>,
    /// `Host`, prebuilt (the client would otherwise build it per request).
    host: HeaderValue,
    /// The request target (path and query).
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The configured headers as raw `\r\nName: value` lines, for HTTP/1.1.
    raw_headers: Vec<u8>,
    /// The router's own credential, obtained when needed (in place of `headers`).
    own: Option<Arc<dyn OwnCredential>>,
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
        let connect = h1::Connect::to(url, config.connect_timeout, config.tls.as_ref(), &config.egress)
            .expect("validated: an https upstream has its TLS configuration");
        let client = if config.http2 {
            Client::Http2(Box::new(
                HyperClient::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .http2_only(true)
                    .build(connector::Connector::new(&connect)),
            ))
        } else {
            let authority = host_header(url);
            let authority = authority.to_str().unwrap_or("localhost");
            Client::Http1(h1::Pool::new(connect.clone(), authority, config.pool_max_idle))
        };
        Shared {
            name,
            index,
            host: host_header(url),
            path: url.path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            url: url.clone(),
            replica: url.to_string(),
            connect,
            last_handshake: Mutex::new(None),
            headers: config.headers.clone(),
            raw_headers: h1::raw_headers(&config.headers),
            own: config.own.as_ref().map(|o| o.0.clone()),
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
    /// HTTP/2 through hyper (one multiplexed connection): with prior
    /// knowledge over TCP, or negotiated (ALPN `h2`) over TLS.
    Http2(Box<HyperClient<connector::Connector, Full<Bytes>>>),
}

/// An upstream's answer: the status, the two headers MCP needs, the body.
struct Answer {
    status: StatusCode,
    event_stream: bool,
    session_id: Option<HeaderValue>,
    /// `WWW-Authenticate` of a 401 or 403.
    challenge: Option<String>,
    body: AnswerBody,
}

enum AnswerBody {
    Http1(h1::Body),
    Http2(Incoming),
    /// A body in fixed pieces, for unit tests of what reads bodies.
    #[cfg(test)]
    Pieces(std::collections::VecDeque<Bytes>),
}

impl AnswerBody {
    /// The next piece of the body.
    async fn chunk(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        match self {
            AnswerBody::Http1(body) => {
                body.chunk().await.map(|r| r.map_err(|e| UpstreamError::Connect(crate::Cause::from_error(e))))
            }
            #[cfg(test)]
            AnswerBody::Pieces(pieces) => pieces.pop_front().map(Ok),
            AnswerBody::Http2(body) => loop {
                match body.frame().await? {
                    Ok(frame) => {
                        if let Ok(data) = frame.into_data() {
                            return Some(Ok(data));
                        }
                    }
                    Err(e) => return Some(Err(UpstreamError::Connect(crate::Cause::from_error(e)))),
                }
            },
        }
    }

    /// The whole body, at most `limit` bytes.
    async fn collect(self, limit: usize) -> Result<Bytes, UpstreamError> {
        match self {
            AnswerBody::Http1(body) => body.collect(limit).await.map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => UpstreamError::Protocol(crate::Cause::from_error(e)),
                _ => UpstreamError::Connect(crate::Cause::with_source(format!("reading the response: {e}"), e)),
            }),
            AnswerBody::Http2(mut body) => match switchboard_core::body::collect(&mut body, limit).await {
                Ok(body) => Ok(body),
                Err(CollectError::TooLarge) => {
                    Err(UpstreamError::Protocol(format!("a response larger than {limit} bytes").into()))
                }
                Err(CollectError::Read(e)) => {
                    Err(UpstreamError::Connect(crate::Cause::with_source(format!("reading the response: {e}"), e)))
                }
            },
            #[cfg(test)]
            AnswerBody::Pieces(pieces) => Ok(pieces.into_iter().flatten().collect::<Vec<u8>>().into()),
        }
    }
}

impl Transport {
    /// [`Transport::modern`](super::Transport::modern), as an inherent
    /// method: the router awaits it in a request's own future (found
    /// through [`stateless_http`](super::Transport::stateless_http)), and
    /// the trait's `modern` and the transport that wraps this one
    /// ([`crate::detect`]) in their boxed futures, not in a second box.
    pub async fn stateless(
        &self,
        body: Bytes,
        method: switchboard_protocol::Method,
        headers: Vec<(HeaderName, HeaderValue)>,
        affinity: &str,
        credential: Option<&Credential>,
    ) -> Result<super::ModernAnswer, UpstreamError> {
        // After the caller's (which leave room for these two).
        let mut all = headers;
        all.push((PROTOCOL_VERSION.clone(), HeaderValue::from_static("2026-07-28")));
        all.push((MCP_METHOD.clone(), HeaderValue::from_static(method.as_str())));
        let replicas = &self.replicas;
        let mut avoid = None;
        let mut body = body;
        let resp = loop {
            let i = replicas.pick(affinity, avoid);
            // Moved on the last try (a clone of a body not yet shared allocates).
            let sent = if replicas.several() && avoid.is_none() { body.clone() } else { std::mem::take(&mut body) };
            match replicas.members[i].send(Method::POST, sent, None, None, false, &all, credential).await {
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
        if matches!(status, 401 | 403) && resp.challenge.is_some() {
            return Err(status_error(resp).await);
        }
        if resp.status.is_success() && resp.event_stream {
            let reply = Reply::Stream(Box::new(SseStream::new(resp.body, None)));
            return Ok(super::ModernAnswer { status, reply, scanned: None });
        }
        if resp.status == StatusCode::ACCEPTED {
            return Err(UpstreamError::Protocol("202 Accepted for a request".into()));
        }
        if resp.status.is_success() {
            // One JSON value, the response, as a rule; a server that streams
            // newline-delimited messages (notifications first) is relayed
            // as it streams.
            let mut values = JsonValues::new(resp.body);
            let first = match values.next_value().await {
                Some(first) => first?,
                None => return Err(UpstreamError::Protocol("an empty answer to a request".into())),
            };
            // Its kind by the quick read of answers (made as it was
            // delimited), sure of most; the envelope's parse decides the rest.
            let scanned = values.scanned_answer();
            let kind = match &scanned {
                Some((kind, _)) => Ok(*kind),
                None => switchboard_protocol::Envelope::parse(&first).map(|e| e.kind),
            };
            return match kind {
                Ok(MessageKind::Response | MessageKind::Error) => {
                    Ok(super::ModernAnswer { status, reply: Reply::Done(first), scanned })
                }
                Ok(_) => {
                    values.push_front(first);
                    Ok(super::ModernAnswer { status, reply: Reply::Stream(Box::new(values)), scanned: None })
                }
                Err(_) => {
                    let detail = String::from_utf8_lossy(&first[..first.len().min(200)]).trim().to_owned();
                    Err(UpstreamError::Status { status, detail })
                }
            };
        }
        let body = resp.body.collect(MAX_MESSAGE_BYTES).await?;
        // A JSON-RPC message, whatever the status (4xx errors are the era's).
        if switchboard_protocol::Envelope::parse(&body).is_ok_and(|e| e.id.is_some()) {
            return Ok(super::ModernAnswer { status, reply: Reply::Done(body), scanned: None });
        }
        let detail = String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned();
        Err(UpstreamError::Status { status, detail })
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
                    let credentials = hello.credentials.clone();
                    let state =
                        SessionState { shared: shared.clone(), sid: None, version, handshake, epoch: 0, credentials };
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

    // `modern` is the trait's: this transport's `stateless`, through
    // `stateless_http`.
    fn stateless_http(&self) -> Option<&Transport> {
        Some(self)
    }

    fn resume(
        &self,
        hello: &Hello,
        inbox: Arc<dyn Inbox>,
        at: &super::UpstreamSession,
    ) -> Option<Arc<dyn super::Channel>> {
        let state = self.replicas.state_for(at, hello)?;
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
    /// Whose credential its requests carry (the hello's).
    credentials: Option<Arc<dyn Credentials>>,
}

impl SessionState {
    /// The upstream session as another replica can continue it (`None`
    /// for a server that issues no session id).
    fn upstream_session(&self) -> Option<super::UpstreamSession> {
        Some(super::UpstreamSession {
            replica: self.shared.replica.clone(),
            session: self.sid.as_ref()?.to_str().ok()?.to_owned(),
            version: self.version.to_str().ok()?.to_owned(),
        })
    }

    /// The credential its requests carry now (`None`: the upstream's own
    /// headers).
    fn credential(&self) -> Result<Option<Arc<Credential>>, UpstreamError> {
        crate::credential(self.credentials.as_ref())
    }

    /// Ends the upstream session (DELETE, bounded; a failure is harmless:
    /// the upstream expires it).
    async fn end(&self) {
        if self.sid.is_none() {
            return;
        }
        let Ok(credential) = self.credential() else { return };
        let delete = async {
            let sent =
                self.shared.send(Method::DELETE, Bytes::new(), Some(self), None, false, &[], credential.as_deref());
            if let Ok(resp) = sent.await {
                drain(resp).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), delete).await;
    }
}

impl Replicas {
    /// The state of a channel on `at`, an upstream session opened earlier
    /// (maybe by another router replica); `None` if its replica is gone
    /// from the configuration or down (the session is then opened afresh
    /// on a live one).
    fn state_for(&self, at: &super::UpstreamSession, hello: &Hello) -> Option<SessionState> {
        let i = self.members.iter().position(|m| m.replica == at.replica)?;
        if !self.is_up(i) {
            return None;
        }
        let shared = self.members[i].clone();
        let sid = HeaderValue::from_str(&at.session).ok()?;
        let version = HeaderValue::from_str(&at.version).ok()?;
        let handshake = shared.last_handshake.lock().expect("lock").clone().unwrap_or_default();
        let _ = shared.statefulness.compare_exchange(UNKNOWN, STATEFUL, Ordering::Relaxed, Ordering::Relaxed);
        let credentials = hello.credentials.clone();
        Some(SessionState { shared, sid: Some(sid), version, handshake, epoch: 0, credentials })
    }
}

impl Shared {
    /// Sends one request: a POST with `body`, or (empty `body` and
    /// `Method::GET`) the GET stream, or a DELETE; with `credential`'s
    /// headers in place of the upstream's own, if there is one. The
    /// router's own credential, when it has one obtained on demand, goes
    /// in their place otherwise; refused (401), it is dropped and the
    /// request sent once more with a fresh one.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        method: Method,
        body: Bytes,
        state: Option<&SessionState>,
        last_event_id: Option<&str>,
        want_session_id: bool,
        extra: &[(HeaderName, HeaderValue)],
        credential: Option<&Credential>,
    ) -> Result<Answer, UpstreamError> {
        let own = match (&self.own, credential) {
            (Some(own), None) => own,
            _ => return self.send_once(method, body, state, last_event_id, want_session_id, extra, credential).await,
        };
        let used = own.current().await?;
        let (m, b) = (method.clone(), body.clone());
        let answer = self.send_once(m, b, state, last_event_id, want_session_id, extra, Some(&used)).await?;
        if answer.status != StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        drop(answer);
        own.refused(&used).await;
        let fresh = own.current().await?;
        self.send_once(method, body, state, last_event_id, want_session_id, extra, Some(&fresh)).await
    }

    /// [`Shared::send`], once, with exactly these headers.
    #[allow(clippy::too_many_arguments)]
    async fn send_once(
        &self,
        method: Method,
        body: Bytes,
        state: Option<&SessionState>,
        last_event_id: Option<&str>,
        want_session_id: bool,
        extra: &[(HeaderName, HeaderValue)],
        credential: Option<&Credential>,
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
                let request = h1::Request {
                    method: match method {
                        Method::GET => "GET",
                        Method::DELETE => "DELETE",
                        _ => "POST",
                    },
                    path: &self.path,
                    headers: &headers[..n],
                    // Stateless requests' headers, written as they are.
                    more: extra,
                    extra: credential.map_or(&self.raw_headers[..], Credential::raw),
                    body: &body,
                };
                let response = pool
                    .send(&request, want_session_id)
                    .await
                    .map_err(|e| UpstreamError::Connect(crate::Cause::from_error(e)))?;
                Ok(Answer {
                    status: StatusCode::from_u16(response.status)
                        .map_err(|_| UpstreamError::Protocol(format!("invalid status {}", response.status).into()))?,
                    event_stream: response.event_stream,
                    session_id: response.session_id.and_then(|b| HeaderValue::from_maybe_shared(b).ok()),
                    challenge: response.challenge.map(|b| String::from_utf8_lossy(&b).into_owned()),
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
                for (name, value) in credential.map_or(&self.headers[..], Credential::headers) {
                    h.insert(name.clone(), value.clone());
                }
                for (name, value) in extra {
                    h.insert(name.clone(), value.clone());
                }
                let resp = client
                    .request(req)
                    .await
                    .map_err(|e| UpstreamError::Connect(crate::Cause::with_source(describe(&e), e)))?;
                let event_stream = resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|ct| {
                    ct.trim_start().get(..17).is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
                });
                let session_id = resp.headers().get(&SESSION_ID).cloned();
                let challenge = matches!(resp.status().as_u16(), 401 | 403)
                    .then(|| resp.headers().get(http::header::WWW_AUTHENTICATE))
                    .flatten()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                Ok(Answer {
                    status: resp.status(),
                    event_stream,
                    session_id,
                    challenge,
                    body: AnswerBody::Http2(resp.into_body()),
                })
            }
        }
    }

    /// POSTs one message on the session `state`, with `extra` headers.
    async fn post(
        &self,
        body: Bytes,
        state: &SessionState,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Result<Answer, UpstreamError> {
        let credential = state.credential()?;
        self.send(Method::POST, body, Some(state), None, false, extra, credential.as_deref()).await
    }

    /// GETs the session's stream, optionally resuming after `last_event_id`.
    async fn get(&self, state: &SessionState, last_event_id: Option<&str>) -> Result<Answer, UpstreamError> {
        let credential = state.credential()?;
        self.send(Method::GET, Bytes::new(), Some(state), last_event_id, false, &[], credential.as_deref()).await
    }

    /// `initialize`, then `notifications/initialized`.
    async fn handshake(self: &Arc<Self>, hello: &Hello) -> Result<SessionState, UpstreamError> {
        let work = async {
            // `Mcp-Method` too: a 2026-07-28 server (probed for sessions)
            // wants it on every POST, and older ones ignore it.
            let body = jsonrpc::request(Some(b"0"), "initialize", Some(&hello.params()));
            // And the version asked for as a header, as that era sends it on
            // every POST (servers of earlier ones read it after initialize only).
            let named = [
                (MCP_METHOD.clone(), HeaderValue::from_static("initialize")),
                (PROTOCOL_VERSION.clone(), HeaderValue::from_static(hello.protocol_version.as_str())),
            ];
            let credential = crate::credential(hello.credentials.as_ref())?;
            let mut resp = self.send(Method::POST, body, None, None, true, &named, credential.as_deref()).await?;
            if !resp.status.is_success() || resp.status == StatusCode::ACCEPTED {
                let status = resp.status;
                let error = status_error(resp).await;
                // Kept as a status for these: what a legacy HTTP+SSE
                // server answers (see `detect.rs`); kept as a refusal
                // for the caller to authorize.
                if matches!(status.as_u16(), 400 | 404 | 405) || matches!(error, UpstreamError::Unauthorized { .. }) {
                    return Err(error);
                }
                return Err(UpstreamError::Initialize(error.to_string().into()));
            }
            let sid = resp.session_id.take();
            let reply = self.read_reply(resp, None).await?;
            let message = collect_response(reply, "0").await?;
            let handshake = Handshake::from_response(&message)?;
            // The version agreed (the one asked for, if the answer names none).
            let agreed = Some(handshake.protocol_version.as_str())
                .filter(|v| !v.is_empty())
                .unwrap_or(hello.protocol_version.as_str())
                .to_owned();
            let version = HeaderValue::from_str(&agreed)
                .unwrap_or_else(|_| HeaderValue::from_static(hello.protocol_version.as_str()));
            let handshake = Arc::new(handshake);
            *self.last_handshake.lock().expect("lock") = Some(handshake.clone());
            let credentials = hello.credentials.clone();
            let mut state = SessionState { shared: self.clone(), sid, version, handshake, epoch: 0, credentials };
            let meta = format!(r#"{{"_meta":{}}}"#, hello.meta(&agreed));
            let note = jsonrpc::request(None, "notifications/initialized", Some(meta.as_bytes()));
            let named = [(MCP_METHOD.clone(), HeaderValue::from_static("notifications/initialized"))];
            let sent = self.send(Method::POST, note, Some(&state), None, false, &named, credential.as_deref());
            let resp = sent.await?;
            if !resp.status.is_success() {
                return Err(UpstreamError::Initialize(
                    format!("notifications/initialized: {}", status_error(resp).await).into(),
                ));
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
    if let (401 | 403, Some(challenge)) = (status, &resp.challenge) {
        let challenge = challenge.chars().take(crate::MAX_CHALLENGE).collect();
        drain(resp).await;
        return UpstreamError::Unauthorized { status, challenge };
    }
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
