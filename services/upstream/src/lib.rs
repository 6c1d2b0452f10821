//! Upstream MCP servers, behind one trait whatever the transport.
//!
//! A [`Transport`] knows how to reach one configured server. Its
//! [`open`](Transport::open) performs the `initialize` handshake and returns a
//! [`Channel`]: one logical MCP session with that server. The router opens a
//! channel per downstream session and upstream (so that the server sees the
//! client's own capabilities, and its requests reach the right client), plus
//! one "control" channel per upstream for the catalog.
//!
//! The contract every transport keeps:
//! - A [`Channel`] speaks the downstream's id space. A response comes back with
//!   the id of the request it answers, and progress notifications with the
//!   progress token the request carried, whatever the transport did with them
//!   on the wire.
//! - Server-to-client requests come out with the upstream's ids; answers to
//!   them are sent back with [`Channel::send`] carrying those same ids.
//! - Messages not tied to a request go to the channel's [`Inbox`].
//! - No client credential, `Host` or `Origin` ever reaches an upstream:
//!   requests are built from scratch.
//!
//! Adding a transport is one new file implementing these traits and one line
//! in [`build`].

pub mod config;
mod detect;
mod h1;
pub mod http;
mod metrics;
mod per_session;
pub mod sse;
pub mod stdio;

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use switchboard_core::credential::{Credential, Credentials};
use switchboard_core::UpstreamId;
use switchboard_protocol::{Method, ProtocolVersion};

use crate::config::{TransportConfig, UpstreamConfig};
pub use crate::metrics::Metrics;

/// A session with one upstream, as another replica can continue it
/// ([`Transport::resume`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamSession {
    /// Which of the upstream's replicas (its URL) holds it.
    pub replica: String,
    /// The upstream's `Mcp-Session-Id`.
    pub session: String,
    /// The version negotiated with the upstream.
    pub version: String,
}

/// How an upstream failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect or the connection broke.
    #[error("cannot connect: {0}")]
    Connect(#[source] Cause),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// An HTTP status other than success.
    #[error("it answered HTTP {status}: {detail}")]
    Status { status: u16, detail: String },
    /// The `initialize` handshake failed.
    #[error("initialize failed: {0}")]
    Initialize(#[source] Cause),
    /// It sent something that is not valid MCP.
    #[error("protocol error: {0}")]
    Protocol(#[source] Cause),
    /// The child process is not running (it is being restarted).
    #[error("the process is not running: {0}")]
    NotRunning(String),
    /// The stream or process ended before the answer.
    #[error("connection closed before the answer")]
    Closed,
    /// Known to be failing; not tried for now.
    #[error("it is down ({0})")]
    Down(String),
    /// A bound the router keeps was reached (the words say which).
    #[error("a limit was reached: {0}")]
    Limit(String),
    /// It needs a credential the caller does not have (the words say
    /// whose is missing and how to add one); nothing was sent.
    #[error("{0}")]
    Credential(String),
    /// The router could not get its own access token for it.
    #[error("no access token for it: {0}")]
    Token(String),
    /// It refused the request's credential, or its lack of one (401), or
    /// found its scope short (403), with an OAuth challenge
    /// (`WWW-Authenticate`, at most [`MAX_CHALLENGE`] characters): what
    /// the caller's authorization starts from.
    #[error("it refused the request's authorization (HTTP {status})")]
    Unauthorized { status: u16, challenge: String },
}

/// The longest `WWW-Authenticate` challenge kept from an upstream.
pub const MAX_CHALLENGE: usize = 4096;

/// What went wrong, in words, and the error that caused it when there is
/// one (an I/O error, a parse error), kept as the source of the error chain.
#[derive(Debug, Clone)]
pub struct Cause {
    text: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    /// `err`, in its own words, kept as the source.
    pub fn from_error(err: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause { text: err.to_string(), source: Some(Arc::new(err)) }
    }

    /// `text` (which says what `err` means here), keeping `err` as the source.
    pub fn with_source(text: impl Into<String>, err: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause { text: text.into(), source: Some(Arc::new(err)) }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Cause {
        Cause { text, source: None }
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Cause {
        Cause { text: text.to_owned(), source: None }
    }
}

/// What the router says about itself and its client when opening a channel.
#[derive(Clone)]
pub struct Hello {
    /// The version to ask for (the downstream client's, for its channels).
    pub protocol_version: ProtocolVersion,
    /// The client capabilities to declare, as JSON.
    pub capabilities: Arc<RawValue>,
    /// What picks the replica of an upstream with several (consistent
    /// hashing): the downstream session id, or "" for the router's own.
    pub affinity: Arc<str>,
    /// Whose credentials the channel sends, asked before each request
    /// (the vault's, for a client's channel); `None`: the upstream's own
    /// headers (the router's channels).
    pub credentials: Option<Arc<dyn Credentials>>,
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hello")
            .field("protocol_version", &self.protocol_version)
            .field("affinity", &self.affinity)
            .field("credentials", &self.credentials.is_some())
            .finish_non_exhaustive()
    }
}

/// The router's own credential for an upstream that is not a fixed set of
/// headers: an OAuth access token, obtained (and renewed) when needed.
#[async_trait]
pub trait OwnCredential: Send + Sync {
    /// The credential to send now (fetched if there is none good).
    async fn current(&self) -> Result<Arc<Credential>, UpstreamError>;

    /// The upstream refused `used` (401): it is not sent again.
    async fn refused(&self, used: &Arc<Credential>);
}

/// The credential to send now with `credentials` (`Ok(None)`: the
/// upstream's own headers).
pub fn credential(credentials: Option<&Arc<dyn Credentials>>) -> Result<Option<Arc<Credential>>, UpstreamError> {
    match credentials {
        None => Ok(None),
        Some(c) => c.current().map_err(|missing| UpstreamError::Credential(missing.0)),
    }
}

impl Hello {
    /// The `initialize` request params; the same in `_meta` as the
    /// 2026-07-28 era puts them on every request (a server of that era
    /// probed for sessions looks there; older ones ignore `_meta`).
    pub fn params(&self) -> Vec<u8> {
        let (version, capabilities) = (self.protocol_version.as_str(), self.capabilities.get());
        let info = format!(r#"{{"name":"switchboard","version":"{}"}}"#, env!("CARGO_PKG_VERSION"));
        format!(
            r#"{{"protocolVersion":"{version}","capabilities":{capabilities},"clientInfo":{info},"_meta":{}}}"#,
            self.meta(version)
        )
        .into_bytes()
    }

    /// The `_meta` of the handshake's messages: `version` (asked for, then
    /// agreed), the capabilities and client info, as the 2026-07-28 era
    /// names them.
    pub fn meta(&self, version: &str) -> String {
        format!(
            r#"{{"io.modelcontextprotocol/protocolVersion":"{}","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{{"name":"switchboard","version":"{}"}}}}"#,
            version,
            self.capabilities.get(),
            env!("CARGO_PKG_VERSION")
        )
    }

    /// The hello of the router's own channels (catalog, shared stdio
    /// processes). It declares sampling and elicitation, which a server only
    /// uses while answering a call, so that tools a server offers only to
    /// clients with those capabilities appear in the catalog; each client's
    /// own channel declares exactly that client's capabilities. It never
    /// declares roots, which a server may ask for at any time.
    pub fn router() -> Self {
        let capabilities =
            RawValue::from_string(r#"{"sampling":{},"elicitation":{"form":{},"url":{}}}"#.into()).expect("valid JSON");
        Hello {
            protocol_version: ProtocolVersion::LATEST,
            capabilities: Arc::from(capabilities),
            affinity: Arc::from(""),
            credentials: None,
        }
    }
}

/// `{}` as a raw value.
pub fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".into()).expect("valid JSON")
}

/// What the upstream said in its `initialize` result.
#[derive(Debug, Clone, Default)]
pub struct Handshake {
    /// The version it chose.
    pub protocol_version: String,
    /// Its capabilities object.
    pub capabilities: Value,
    /// Its instructions, if any.
    pub instructions: Option<String>,
    /// Its `serverInfo`.
    pub server_info: Value,
}

impl Handshake {
    /// Reads an `initialize` response (the whole JSON-RPC message).
    pub fn from_response(message: &[u8]) -> Result<Self, UpstreamError> {
        let v: Value = serde_json::from_slice(message).map_err(|e| UpstreamError::Initialize(Cause::from_error(e)))?;
        if let Some(error) = v.get("error") {
            let msg = error.get("message").and_then(Value::as_str).unwrap_or("no message");
            return Err(UpstreamError::Initialize(format!("it refused: {msg}").into()));
        }
        let result = v.get("result").ok_or_else(|| UpstreamError::Initialize("no result".into()))?;
        Ok(Handshake {
            protocol_version: result.get("protocolVersion").and_then(Value::as_str).unwrap_or_default().to_owned(),
            capabilities: result.get("capabilities").cloned().unwrap_or(Value::Object(Default::default())),
            instructions: result.get("instructions").and_then(Value::as_str).map(str::to_owned),
            server_info: result.get("serverInfo").cloned().unwrap_or(Value::Null),
        })
    }

    /// Whether it declared a capability (`tools`, `logging`, …).
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.get(capability).is_some_and(|c| !c.is_null())
    }
}

/// A request on its way to an upstream.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The whole message, already rewritten for the upstream (names, URIs).
    pub body: Bytes,
    /// The method.
    pub method: Method,
    /// Where the `id` sits in `body`.
    pub id: Range<usize>,
    /// Where `params._meta.progressToken` sits in `body`, if present.
    pub progress_token: Option<Range<usize>>,
    /// The W3C `traceparent` header to send with it (HTTP upstreams), when
    /// the request is traced.
    pub traceparent: Option<::http::HeaderValue>,
}

impl Outgoing {
    /// A request of the router's own (a list, `logging/setLevel`), with an id
    /// unique in this process, as one channel may carry several at once.
    /// Returns the id too, to collect the answer by.
    pub fn own(method: &str, params: &[u8], tag: &str) -> (Outgoing, String) {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("\"switchboard-{tag}-{n}\"");
        let body = switchboard_protocol::jsonrpc::request(Some(id.as_bytes()), method, Some(params));
        let start = body.windows(id.len()).position(|w| w == id.as_bytes()).expect("the id is in the body");
        let out = Outgoing {
            body,
            method: Method::from_name(method),
            id: start..start + id.len(),
            progress_token: None,
            traceparent: None,
        };
        (out, id)
    }
}

/// The answer to a request.
pub enum Reply {
    /// The response, complete.
    Done(Bytes),
    /// Related messages (notifications, server-to-client requests), ending with the response.
    Stream(Box<dyn MessageStream>),
}

/// What a stream of related messages yields.
pub enum Item {
    /// A message.
    Message(Bytes),
    /// The upstream ended its stream before answering and the stream will
    /// resume it (2025-11-25 SSE polling) after `retry`, the wait the
    /// upstream asked for (if it did); the router may do the same to its
    /// client.
    Paused { retry: Option<Duration> },
}

/// Messages related to one request, in order; the response is the last one.
#[async_trait]
pub trait MessageStream: Send {
    /// The next message or pause; `None` when the stream ended.
    async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>>;

    /// Where the upstream could resume this stream from now (its last
    /// event id), if it gave one: another replica can continue the stream
    /// there with [`Channel::resume_stream`].
    fn resume_point(&self) -> Option<&str> {
        None
    }

    /// The next message, passing over pauses; `None` when the stream ended.
    async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        loop {
            match self.next_item().await? {
                Ok(Item::Message(message)) => return Some(Ok(message)),
                Ok(Item::Paused { .. }) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// The messages of one request on a transport that multiplexes a single
/// stream (stdio, legacy SSE): fed by the dispatcher through a channel of
/// `(is_the_response, message)`. `G` is dropped with the stream (it
/// unregisters the request).
pub(crate) struct SinkStream<G> {
    first: Option<Bytes>,
    rx: tokio::sync::mpsc::UnboundedReceiver<(bool, Bytes)>,
    done: bool,
    _guard: G,
}

impl<G: Send> SinkStream<G> {
    pub(crate) fn new(first: Bytes, rx: tokio::sync::mpsc::UnboundedReceiver<(bool, Bytes)>, guard: G) -> Self {
        SinkStream { first: Some(first), rx, done: false, _guard: guard }
    }
}

#[async_trait]
impl<G: Send> MessageStream for SinkStream<G> {
    async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(Item::Message(first)));
        }
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            Some((is_response, message)) => {
                self.done = is_response;
                Some(Ok(Item::Message(message)))
            }
            None => Some(Err(UpstreamError::Closed)),
        }
    }
}

/// Receives messages that are not tied to any request, and says which
/// upstream session a channel should be on when several replicas of the
/// router may use it.
#[async_trait]
pub trait Inbox: Send + Sync {
    /// Takes one message (a notification or a server-to-client request).
    fn deliver(&self, message: Bytes);

    /// Before a channel re-initialises (the upstream forgot its session, or
    /// its replica died): the upstream session the router's replicas have
    /// agreed on since, if it is not `current` (another replica
    /// re-initialised first). By default none: the channel goes on alone.
    async fn agreed(&self, _current: Option<&UpstreamSession>) -> Option<UpstreamSession> {
        None
    }

    /// A channel opened `fresh` in place of `stale` (`None`: it had none):
    /// recorded for the other replicas, unless one of them recorded another
    /// first, which the channel then uses instead. By default, its own.
    async fn claim(&self, _stale: Option<&UpstreamSession>, _fresh: &UpstreamSession) -> Claimed {
        Claimed::Ours
    }
}

/// What [`Inbox::claim`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The fresh upstream session is the one.
    Ours,
    /// Another replica's is: use it, and end the fresh one.
    Theirs(UpstreamSession),
}

/// An inbox that drops everything (a channel opened only to be closed).
pub struct Discard;

impl Inbox for Discard {
    fn deliver(&self, _message: Bytes) {}
}

/// One logical MCP session with an upstream.
#[async_trait]
pub trait Channel: Send + Sync {
    /// Sends a request and waits until the upstream answers or starts streaming.
    async fn request(&self, out: Outgoing) -> Result<Reply, UpstreamError>;

    /// Sends a notification, or a response to a server-to-client request.
    async fn send(&self, message: Bytes) -> Result<(), UpstreamError>;

    /// Starts delivering messages not tied to a request to the inbox (over
    /// HTTP, opens the GET stream). Idempotent.
    fn listen(&self);

    /// Once [`Channel::listen`] was called: waits (at most `within`) until
    /// the upstream has answered the GET stream's request, so that a
    /// request sent next finds the stream there. A server sends what is not
    /// tied to a request on that stream only if it is open at that moment
    /// (the TypeScript SDK's servers drop it otherwise, a request made in a
    /// tool's handler included).
    async fn listening(&self, within: Duration) {
        let _ = within;
    }

    /// Whether [`Channel::listen`] was called and the GET stream's request
    /// is not answered yet: a request sent now could reach the upstream
    /// before it (then [`Channel::listening`] first).
    fn opening_get(&self) -> bool {
        false
    }

    /// What the upstream said when this channel was opened (or last re-opened).
    fn handshake(&self) -> Arc<Handshake>;

    /// The upstream session this channel is on, if another replica could
    /// continue it ([`Transport::resume`]): an HTTP session with an id.
    fn upstream_session(&self) -> Option<UpstreamSession> {
        None
    }

    /// Continues a request's stream after `last_event_id` (a
    /// [`MessageStream::resume_point`] of a stream on this upstream
    /// session, maybe read by another replica that is gone): the messages
    /// that followed it, up to the response. By default the transport
    /// cannot.
    async fn resume_stream(&self, _last_event_id: &str) -> Result<Box<dyn MessageStream>, UpstreamError> {
        Err(UpstreamError::Protocol("this transport cannot resume a stream".into()))
    }

    /// The channel's concrete kind, for [`request`] to await its request in
    /// place rather than through this trait's boxed future. Only this
    /// crate's channels have one (its field is private); by default none.
    fn direct(&self) -> Option<Direct<'_>> {
        None
    }

    /// Ends the session with the upstream.
    async fn close(&self);

    /// Stops this replica's use of the channel while the session goes on
    /// elsewhere: background work stops, but an upstream session another
    /// replica may continue is not ended. By default the same as `close`.
    async fn detach(&self) {
        self.close().await
    }
}

/// What [`Channel::direct`] gives: the HTTP channel itself.
pub struct Direct<'a>(&'a http::HttpChannel);

/// Sends a request on `channel`, as [`Channel::request`] does. For an HTTP
/// channel, the hot path's, its future is part of the caller's rather than a
/// box of its own: a fresh block of some 2 KB for every call, cold in the
/// cache each time (the allocator hands out another block of the page until
/// the page is used up) and copied whole when made.
pub async fn request(channel: &dyn Channel, out: Outgoing) -> Result<Reply, UpstreamError> {
    match channel.direct() {
        Some(Direct(http)) => http.request_in_place(out).await,
        None => channel.request(out).await,
    }
}

/// The answer to a stateless (2026-07-28) request: the HTTP status (errors
/// such as -32021 come with 4xx statuses the client must see) and the reply.
pub struct ModernAnswer {
    pub status: u16,
    pub reply: Reply,
    /// A whole answer's kind and where its id is, when the transport's
    /// quick read of it ([`scan::answer`](switchboard_protocol::scan::answer))
    /// was sure: its caller need not read it again to match the id.
    pub scanned: Option<(switchboard_protocol::MessageKind, Range<usize>)>,
}

/// The `_meta` of the router's own stateless requests (discovery, lists,
/// listening): the version and the capabilities of [`Hello::router`].
pub const ROUTER_META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{},"elicitation":{"form":{},"url":{}}},"io.modelcontextprotocol/clientInfo":{"name":"switchboard","version":"0.1.0"}}"#;

/// The protocol era an upstream was found to speak (a label of
/// `switchboard_upstream_era`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// MCP 2026-07-28: stateless requests.
    Stateless,
    /// 2025-03-26 to 2025-11-25: sessions over Streamable HTTP (or stdio).
    Sessions,
    /// 2024-11-05: legacy HTTP+SSE.
    LegacySse,
}

impl Era {
    pub const ALL: [Era; 3] = [Era::Stateless, Era::Sessions, Era::LegacySse];

    pub fn label(self) -> &'static str {
        match self {
            Era::Stateless => "2026-07-28",
            Era::Sessions => "2025",
            Era::LegacySse => "2024-11-05",
        }
    }
}

/// A way to reach one upstream server.
#[async_trait]
pub trait Transport: Send + Sync {
    /// Sends one stateless (2026-07-28) request: `body` as it is, with the
    /// era's headers (`MCP-Protocol-Version`, `Mcp-Method` for `method`) and
    /// `headers` (`Mcp-Name`, `Mcp-Param-*`); `affinity` picks the replica.
    /// Only HTTP upstreams speak the stateless era. `credential` stands in
    /// for the upstream's own headers.
    async fn modern(
        &self,
        body: Bytes,
        method: Method,
        headers: Vec<(::http::HeaderName, ::http::HeaderValue)>,
        affinity: &str,
        credential: Option<&Credential>,
    ) -> Result<ModernAnswer, UpstreamError> {
        match self.stateless_http() {
            Some(http) => http.stateless(body, method, headers, affinity, credential).await,
            None => Err(UpstreamError::Protocol("this transport has no stateless (2026-07-28) requests".into())),
        }
    }

    /// The HTTP transport a stateless request goes through, when this is
    /// one that speaks the era over HTTP: its
    /// [`stateless`](http::Transport::stateless) is awaited in the caller's
    /// future, not boxed as [`modern`](Self::modern)'s is.
    fn stateless_http(&self) -> Option<&http::Transport> {
        None
    }

    /// Opens a session: `initialize` with `hello`, then `notifications/initialized`.
    async fn open(&self, hello: &Hello, inbox: Arc<dyn Inbox>) -> Result<Arc<dyn Channel>, UpstreamError>;

    /// A channel on an upstream session opened earlier (maybe by another
    /// replica), without a handshake; `None` if this transport cannot
    /// continue it (another kind of transport, or a replica it no longer has).
    fn resume(&self, _hello: &Hello, _inbox: Arc<dyn Inbox>, _at: &UpstreamSession) -> Option<Arc<dyn Channel>> {
        None
    }

    /// Stops background work and child processes.
    async fn shutdown(&self);
}

/// One configured upstream.
pub struct Upstream {
    /// Its slot; indexes per-upstream tables.
    pub id: UpstreamId,
    /// Its configured name.
    pub name: Arc<str>,
    /// Its settings.
    pub config: UpstreamConfig,
    /// How to reach it.
    pub transport: Arc<dyn Transport>,
}

impl Upstream {
    /// Its host and port (of its first URL), as telemetry names a server;
    /// none for a stdio upstream.
    pub fn address(&self) -> Option<(Arc<str>, u16)> {
        match &self.config.transport {
            config::TransportConfig::Http(h) | config::TransportConfig::Sse(h) => {
                let host = h.url.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
                let https = h.url.scheme_str() == Some("https");
                Some((Arc::from(host), h.url.port_u16().unwrap_or(if https { 443 } else { 80 })))
            }
            config::TransportConfig::Stdio(_) => None,
        }
    }
}

/// The upstreams this process serves, indexed by [`UpstreamId`]: the
/// configured ones, then each one added while it runs. Clones share one
/// table, so every layer holding one sees an upstream added or retired at
/// once. Lookups take no lock. A retired upstream leaves the set (it is no
/// longer found, listed or iterated) but keeps its slot, so what still
/// holds its id (a request in flight, a channel being closed) can reach it.
#[derive(Clone)]
pub struct Upstreams {
    table: Arc<Table>,
    metrics: Arc<Metrics>,
}

struct Table {
    slots: switchboard_core::slots::Slots<Slot>,
    /// Slots used (ids below it are set).
    used: std::sync::atomic::AtomicUsize,
    /// Serialises changes.
    changing: std::sync::Mutex<()>,
}

struct Slot {
    upstream: Arc<Upstream>,
    live: std::sync::atomic::AtomicBool,
}

/// Upstreams added over a process's life, at most (changes included: a
/// changed upstream takes a new slot); beyond, a restart is needed.
pub const MAX_SLOTS: usize = 65_536;

impl Upstreams {
    /// The upstreams of `list`, whose ids must be their positions.
    pub fn new(list: Vec<Arc<Upstream>>, metrics: Arc<Metrics>) -> Upstreams {
        debug_assert!(list.iter().enumerate().all(|(i, u)| u.id.index() == i));
        let table = Table {
            slots: switchboard_core::slots::Slots::new(),
            used: std::sync::atomic::AtomicUsize::new(list.len()),
            changing: std::sync::Mutex::new(()),
        };
        for (i, upstream) in list.into_iter().enumerate() {
            table.slots.set(i, Slot { upstream, live: std::sync::atomic::AtomicBool::new(true) });
        }
        Upstreams { table: Arc::new(table), metrics }
    }

    /// Adds an upstream made by `make` with its new id, not yet in the set
    /// (see [`enter`](Self::enter)): every table kept per upstream can be
    /// ready for it before any request finds it. `None` once [`MAX_SLOTS`]
    /// are used.
    pub fn add(&self, make: impl FnOnce(UpstreamId) -> Upstream) -> Option<Arc<Upstream>> {
        let _changing = self.table.changing.lock().expect("lock");
        let index = self.table.used.load(Ordering::Acquire);
        if index >= MAX_SLOTS {
            return None;
        }
        let upstream = Arc::new(make(UpstreamId::new(index)));
        debug_assert_eq!(upstream.id.index(), index);
        self.table.slots.set(index, Slot { upstream: upstream.clone(), live: false.into() });
        self.table.used.store(index + 1, Ordering::Release);
        Some(upstream)
    }

    /// Puts added upstream `u` in the set: found, listed, iterated.
    pub fn enter(&self, u: UpstreamId) {
        if let Some(slot) = self.table.slots.get(u.index()) {
            slot.live.store(true, Ordering::Release);
        }
    }

    /// Takes upstream `u` out of the set; its slot stays.
    pub fn retire(&self, u: UpstreamId) {
        if let Some(slot) = self.table.slots.get(u.index()) {
            slot.live.store(false, Ordering::Release);
        }
    }

    /// What the upstreams record: reachability, era, restarts, …
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Slots used: every id ever given is below it.
    pub fn slots(&self) -> usize {
        self.table.used.load(Ordering::Acquire)
    }

    /// How many are in the set.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Each upstream in the set, in the order of their ids (configured
    /// ones in configuration order, then the ones added since).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        (0..self.slots())
            .filter_map(|i| self.table.slots.get(i))
            .filter(|slot| slot.live.load(Ordering::Acquire))
            .map(|slot| &slot.upstream)
    }

    /// Each id in the set, in order.
    pub fn ids(&self) -> impl Iterator<Item = UpstreamId> + '_ {
        self.iter().map(|u| u.id)
    }

    /// The upstream in the set named `name`.
    pub fn find(&self, name: &str) -> Option<UpstreamId> {
        self.iter().find(|u| &*u.name == name).map(|u| u.id)
    }

    /// The upstream `id`, if it is in the set (an id read from a client's
    /// message, or kept since before a change).
    pub fn get(&self, id: UpstreamId) -> Option<&Arc<Upstream>> {
        self.table.slots.get(id.index()).filter(|slot| slot.live.load(Ordering::Acquire)).map(|slot| &slot.upstream)
    }

    /// Whether `id` is in the set.
    pub fn is_live(&self, id: UpstreamId) -> bool {
        self.get(id).is_some()
    }

    /// The name of upstream `id` as other replicas know it: a stable hash of
    /// its name (slots differ between replicas; names do not).
    pub fn key(&self, id: UpstreamId) -> u32 {
        key_of(&self[id].name)
    }

    /// The upstream in the set whose [`key`](Self::key) is `key`.
    pub fn by_key(&self, key: u32) -> Option<UpstreamId> {
        self.iter().find(|u| key_of(&u.name) == key).map(|u| u.id)
    }
}

/// [`Upstreams::key`] of a name: its FNV-1a hash, folded to 32 bits.
pub fn key_of(name: &str) -> u32 {
    let h = switchboard_core::hash::fnv1a64(name.as_bytes());
    (h ^ (h >> 32)) as u32
}

impl std::ops::Index<UpstreamId> for Upstreams {
    type Output = Arc<Upstream>;

    /// Upstream `id`, in the set or retired (ids come from this table).
    fn index(&self, id: UpstreamId) -> &Arc<Upstream> {
        &self.table.slots.get(id.index()).expect("an id this table gave").upstream
    }
}

/// Builds the transport for one upstream.
pub fn build(config: &UpstreamConfig, metrics: &Arc<Metrics>) -> Arc<dyn Transport> {
    let name: Arc<str> = Arc::from(config.name.as_str());
    match &config.transport {
        // One URL: Streamable HTTP, or legacy HTTP+SSE if it turns out to be
        // that (several replicas are taken to be Streamable HTTP servers).
        TransportConfig::Http(http) if http.replicas.len() == 1 => Arc::new(detect::Transport::new(
            name.clone(),
            http::Transport::new(name.clone(), http, config.timeout, metrics.clone()),
            sse::Transport::new(name, http, config.timeout, metrics.clone()),
        )),
        TransportConfig::Http(http) => Arc::new(http::Transport::new(name, http, config.timeout, metrics.clone())),
        TransportConfig::Stdio(stdio) => match stdio.per_session {
            Some(limits) => Arc::new(per_session::Transport::new(name, stdio.clone(), limits, metrics.clone())),
            None => Arc::new(stdio::Transport::start(name, stdio.clone(), metrics.clone())),
        },
        TransportConfig::Sse(sse) => Arc::new(sse::Transport::new(name, sse, config.timeout, metrics.clone())),
    }
}

/// Finds the first message in `stream` that answers `id`, dropping the rest.
/// Used for the router's own requests (handshakes, lists).
pub async fn collect_response(reply: Reply, id: &str) -> Result<Bytes, UpstreamError> {
    match reply {
        Reply::Done(bytes) => {
            let env = switchboard_protocol::Envelope::parse(&bytes)
                .map_err(|e| UpstreamError::Protocol(format!("its answer is not JSON-RPC: {e}").into()))?;
            if env.method.is_some() || env.id.is_none_or(|i| i.get() != id) {
                return Err(UpstreamError::Protocol("it answered with a message that is not the response".into()));
            }
            drop(env);
            Ok(bytes)
        }
        Reply::Stream(mut stream) => {
            while let Some(message) = stream.next().await {
                let message = message?;
                if let Ok(env) = switchboard_protocol::Envelope::parse(&message) {
                    if env.method.is_none() && env.id.is_some_and(|i| i.get() == id) {
                        return Ok(message);
                    }
                }
            }
            Err(UpstreamError::Closed)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn an_upstream_error_keeps_its_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = UpstreamError::Connect(Cause::with_source("connecting to 127.0.0.1:9", io));
        assert_eq!(e.to_string(), "cannot connect: connecting to 127.0.0.1:9");
        let cause = e.source().expect("the cause").source().expect("the I/O error");
        let io = cause.downcast_ref::<std::io::Error>().expect("an I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(UpstreamError::Protocol("words only".into()).source().unwrap().source().is_none());
    }
}
