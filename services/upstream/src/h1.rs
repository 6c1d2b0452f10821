//! A lean HTTP/1.1 client for upstream servers: the hot path of every
//! forwarded request over Streamable HTTP.
//!
//! The request's own task does the I/O: it takes an idle keep-alive
//! connection from the pool (or connects), writes the request head and body
//! in one vectored write, parses the response head where it lies (the
//! common head in one pass of `switchboard_protocol::http1`'s, anything
//! else with `httparse` into a stack array), and reads the body into the
//! connection's buffer. A body with
//! a `Content-Length` comes back as one slice of that buffer, without a copy.
//! There is no connection task, channel or wake-up between tasks, which is
//! where a general-purpose client spends much of its time on small messages.
//!
//! A connection goes back to the pool only after its response body was read to
//! the end and the server did not ask to close it. Before reuse, a pooled
//! connection is dropped if it idled past [`POOL_IDLE`] (shorter than the
//! common 5 s server keep-alive) or if the server closed it or sent something
//! unasked. A request is sent again, on a fresh connection, only when writing
//! it to a reused connection failed: once written, it may have been acted on,
//! so it is never repeated.
//!
//! This client speaks only what MCP servers need: `Content-Length` and
//! chunked bodies, keep-alive, `Connection: close`, over TCP or TLS (an
//! `https` upstream: the server's certificate verified, ALPN `http/1.1`).
//! HTTP/2 upstreams use hyper.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use switchboard_protocol::http1::{self, Known};

/// Response heads larger than this are refused.
const MAX_HEAD: usize = 64 << 10;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 << 10;
/// A pooled connection idle longer than this is not reused.
pub const POOL_IDLE: Duration = Duration::from_secs(4);

/// One upstream's connections.
pub struct Pool {
    connect: Connect,
    /// The `Host` header value.
    host: Vec<u8>,
    idle: Mutex<Idle>,
    /// Idle connections kept, at most (all threads' together).
    max_idle: usize,
    /// For an `https` upstream: the TLS client and the name its
    /// certificate must carry.
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

/// How a connection to an upstream is made: TCP (to the addresses of its
/// host that the egress guard allows), or TLS over TCP.
#[derive(Clone)]
pub struct Connect {
    pub host: String,
    pub port: u16,
    /// For the TCP connection (and the TLS handshake).
    pub timeout: Duration,
    /// TLS (the client configuration, with ALPN `http/1.1`) and the server
    /// name (the URL's host) its certificate must be valid for.
    pub tls: Option<(Arc<tokio_rustls::rustls::ClientConfig>, ServerName<'static>)>,
    pub egress: switchboard_core::egress::Egress,
}

impl Connect {
    /// How to reach `url`: its host and port (80 for `http`, 443 for
    /// `https`), and for `https` TLS with `tls` (required then), the URL's
    /// host being the name the certificate must carry.
    pub fn to(
        url: &http::Uri,
        timeout: Duration,
        tls: Option<&Arc<tokio_rustls::rustls::ClientConfig>>,
        egress: &switchboard_core::egress::Egress,
    ) -> io::Result<Connect> {
        let host = url.host().unwrap_or("localhost");
        let secure = url.scheme_str() == Some("https");
        let port = url.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let tls = match (secure, tls) {
            (false, _) => None,
            (true, None) => return Err(invalid("an https upstream needs a TLS configuration")),
            (true, Some(config)) => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(bare.to_owned())
                    .map_err(|_| invalid("the upstream's host is not a name a certificate can carry"))?;
                Some((config.clone(), name))
            }
        };
        Ok(Connect { host: host.to_owned(), port, timeout, tls, egress: egress.clone() })
    }

    /// `host:port`, for logs and errors.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// A TCP connection, within the timeout, to an address the guard allows.
    pub async fn tcp(&self) -> io::Result<TcpStream> {
        self.egress.connect(&self.host, self.port, self.timeout).await
    }

    /// A connection: TCP, and TLS over it with `tls` when given, the
    /// handshake within the same timeout (a certificate that does not
    /// verify is an error naming why).
    pub(crate) async fn open(&self, tls: Option<&(TlsConnector, ServerName<'static>)>) -> io::Result<Io> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let tcp = self.tcp().await?;
        let Some((connector, name)) = tls else {
            return Ok(Io::Plain(tcp));
        };
        let address = self.address();
        match tokio::time::timeout_at(deadline, connector.connect(name.clone(), tcp)).await {
            Ok(Ok(tls)) => Ok(Io::Tls(Box::new(tls))),
            Ok(Err(e)) => Err(io::Error::new(e.kind(), format!("TLS handshake with {address} failed: {e}"))),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("TLS handshake with {address} timed out"))),
        }
    }
}

/// A connection's byte stream.
pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Io {
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(tcp) => tcp,
            Io::Tls(tls) => tls.get_ref().0,
        }
    }

    /// The protocol TLS agreed on (ALPN), if any.
    pub(crate) fn alpn(&self) -> Option<&[u8]> {
        match self {
            Io::Plain(_) => None,
            Io::Tls(tls) => tls.get_ref().1.alpn_protocol(),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(tcp) => tcp.is_write_vectored(),
            Io::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Io::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The idle connections, apart per connection thread
/// ([`switchboard_core::thread`]): a socket is registered with the runtime of
/// the thread that opened it, and only that thread reuses it (another's
/// reading it would go through the opener's thread to be woken).
#[derive(Default)]
struct Idle {
    by_thread: Vec<Vec<Conn>>,
    count: usize,
}

impl Idle {
    /// Takes out every connection that idled past [`POOL_IDLE`], whichever
    /// thread's it is, for the caller to close once the lock is let go
    /// (closing deregisters a socket: a system call; a socket may be
    /// closed from any thread).
    fn take_expired(&mut self) -> Vec<Conn> {
        let mut expired = Vec::new();
        for list in &mut self.by_thread {
            let mut i = 0;
            while i < list.len() {
                if list[i].idle_since.elapsed() < POOL_IDLE {
                    i += 1;
                } else {
                    expired.push(list.swap_remove(i));
                }
            }
        }
        self.count -= expired.len();
        expired
    }
}

/// A keep-alive connection and its buffers (reused across requests).
pub struct Conn {
    io: Io,
    read: BytesMut,
    head: Vec<u8>,
    idle_since: Instant,
    /// The connection thread that opened it.
    thread: usize,
}

/// A request to send.
pub struct Request<'a> {
    /// `POST`, `GET` or `DELETE`.
    pub method: &'static str,
    /// Path and query.
    pub path: &'a str,
    /// Headers besides `Host` and `Content-Length`.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// More headers, as `http` keeps them, after those (a stateless
    /// request's `Mcp-*` headers).
    pub more: &'a [(http::HeaderName, http::HeaderValue)],
    /// More headers, prebuilt as `\r\nName: value` lines.
    pub extra: &'a [u8],
    /// The body (empty for none).
    pub body: &'a [u8],
}

/// A response head, and its body to read.
pub struct Response {
    pub status: u16,
    /// `Content-Type` is `text/event-stream`.
    pub event_stream: bool,
    /// `Mcp-Session-Id`, when asked for.
    pub session_id: Option<Bytes>,
    /// `WWW-Authenticate` of a 401 or 403 (an OAuth challenge).
    pub challenge: Option<Bytes>,
    pub body: Body,
}

/// How the body is delimited.
enum Framing {
    Length(usize),
    Chunked(Chunked),
    UntilClose,
}

#[derive(Clone, Copy)]
enum Chunked {
    /// Expecting a size line.
    Size,
    /// Inside a chunk, this many bytes left.
    Data(usize),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailers until an empty line.
    Trailers,
}

/// A response body being read. Dropping it before the end closes the connection.
pub struct Body {
    conn: Option<Conn>,
    pool: Arc<Pool>,
    framing: Framing,
    keep_alive: bool,
    done: bool,
}

impl Pool {
    /// A pool of connections made as `connect` says (the `Host` header is
    /// `authority`).
    pub fn new(connect: Connect, authority: &str, max_idle: usize) -> Arc<Pool> {
        Arc::new(Pool {
            tls: connect.tls.clone().map(|(config, name)| (TlsConnector::from(config), name)),
            connect,
            host: authority.as_bytes().to_vec(),
            idle: Mutex::new(Idle::default()),
            max_idle,
        })
    }

    /// An idle connection of this thread's that is still usable, if there
    /// is one.
    fn checkout(&self) -> Option<Conn> {
        let thread = switchboard_core::thread::index();
        loop {
            let mut conn = {
                let mut idle = self.idle.lock().expect("lock");
                let conn = idle.by_thread.get_mut(thread)?.pop()?;
                idle.count -= 1;
                conn
            };
            if conn.idle_since.elapsed() < POOL_IDLE && conn.quiet() {
                return Some(conn);
            }
        }
    }

    fn checkin(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().expect("lock");
        // Only its own thread takes from a thread's list: another's
        // connections that idled too long to be reused give way here.
        let expired = if idle.count >= self.max_idle { idle.take_expired() } else { Vec::new() };
        if idle.count < self.max_idle {
            if idle.by_thread.len() <= conn.thread {
                idle.by_thread.resize_with(conn.thread + 1, Vec::new);
            }
            idle.count += 1;
            idle.by_thread[conn.thread].push(conn);
        }
        drop(idle);
        drop(expired);
    }

    async fn connect(&self) -> io::Result<Conn> {
        let io = self.connect.open(self.tls.as_ref()).await?;
        Ok(Conn {
            io,
            read: BytesMut::with_capacity(READ_CHUNK),
            head: Vec::with_capacity(512),
            idle_since: Instant::now(),
            thread: switchboard_core::thread::index(),
        })
    }

    /// Sends `req` and reads the response head. `want_session_id` copies the
    /// `Mcp-Session-Id` header out.
    pub async fn send(self: &Arc<Self>, req: &Request<'_>, want_session_id: bool) -> io::Result<Response> {
        let mut retried = false;
        loop {
            let (mut conn, reused) = match self.checkout() {
                Some(conn) => (conn, true),
                // Boxed (as below): the exchange with a pooled connection
                // is the common case, and every await of this future
                // copies it whole, room for a connect included.
                None => (Box::pin(self.connect()).await?, false),
            };
            match conn.exchange(&self.host, req, want_session_id).await {
                Ok(head) => {
                    let framing = head.framing;
                    let done = matches!(framing, Framing::Length(0)) || req.method == "HEAD";
                    let mut body =
                        Body { conn: Some(conn), pool: self.clone(), framing, keep_alive: head.keep_alive, done };
                    if done {
                        body.finish();
                    }
                    return Ok(Response {
                        status: head.status,
                        event_stream: head.event_stream,
                        session_id: head.session_id,
                        challenge: head.challenge,
                        body,
                    });
                }
                // Nothing reached the server: safe to send again, on a new connection.
                Err(Exchange::Unsent(_)) if reused && !retried => {
                    retried = true;
                    let conn = Box::pin(self.connect()).await?;
                    self.checkin(conn);
                }
                Err(Exchange::Unsent(e)) | Err(Exchange::Failed(e)) => return Err(e),
            }
        }
    }
}

struct Head {
    status: u16,
    event_stream: bool,
    session_id: Option<Bytes>,
    challenge: Option<Bytes>,
    framing: Framing,
    keep_alive: bool,
}

enum Exchange {
    /// Writing the request failed: the server has not seen it.
    Unsent(io::Error),
    Failed(io::Error),
}

fn is_stale(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted)
}

impl Conn {
    async fn exchange(&mut self, host: &[u8], req: &Request<'_>, want_session_id: bool) -> Result<Head, Exchange> {
        self.write_request(host, req).await.map_err(|e| {
            if is_stale(&e) {
                Exchange::Unsent(e)
            } else {
                Exchange::Failed(e)
            }
        })?;
        self.read_head(want_session_id).await
    }

    async fn write_request(&mut self, host: &[u8], req: &Request<'_>) -> io::Result<()> {
        #[inline(always)]
        fn header_line(head: &mut Vec<u8>, name: &[u8], value: &[u8]) {
            head.extend_from_slice(b"\r\n");
            head.extend_from_slice(name);
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
        }
        let head = &mut self.head;
        head.clear();
        head.extend_from_slice(req.method.as_bytes());
        head.push(b' ');
        head.extend_from_slice(req.path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        head.extend_from_slice(host);
        // Two loops, not one over both chained: a chain's every step cost
        // the common request (no `more`) about 50 instructions in all.
        for (name, value) in req.headers {
            header_line(head, name.as_bytes(), value);
        }
        for (name, value) in req.more {
            header_line(head, name.as_str().as_bytes(), value.as_bytes());
        }
        head.extend_from_slice(req.extra);
        if !req.body.is_empty() || req.method == "POST" {
            head.extend_from_slice(b"\r\nContent-Length: ");
            head.extend_from_slice(switchboard_protocol::http1::digits(req.body.len() as u64, &mut [0u8; 20]));
        }
        head.extend_from_slice(b"\r\n\r\n");
        if req.body.len() <= 4096 {
            // Small bodies: one buffer, one write.
            head.extend_from_slice(req.body);
            self.io.write_all(head).await?;
            // (TLS may hold the last record until flushed; TCP has nothing to flush.)
            return self.io.flush().await;
        }
        let mut parts = [IoSlice::new(head), IoSlice::new(req.body)];
        let mut slices: &mut [IoSlice<'_>] = &mut parts;
        while !slices.is_empty() {
            let n = self.io.write_vectored(slices).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut slices, n);
        }
        self.io.flush().await
    }

    async fn fill(&mut self) -> io::Result<usize> {
        if self.read.capacity() - self.read.len() < READ_CHUNK / 4 {
            self.read.reserve(READ_CHUNK);
        }
        self.io.read_buf(&mut self.read).await
    }

    /// Whether an idle connection is still open and silent (without a syscall
    /// unless the reactor saw it become readable).
    fn quiet(&mut self) -> bool {
        use futures_util::FutureExt;
        if !self.read.is_empty() {
            return false;
        }
        match self.io.tcp().ready(tokio::io::Interest::READABLE).now_or_never() {
            None => true,
            Some(Err(_)) => false,
            // Readable while idle: closed (0 bytes) or unasked data; either way, unusable.
            Some(Ok(_)) => match &mut self.io {
                Io::Plain(tcp) => {
                    matches!(tcp.try_read(&mut [0u8; 1]), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
                }
                // TLS may have sent what is not data (a TLS 1.3 session
                // ticket): read through it; only data or the end is unusable.
                Io::Tls(tls) => tls.read(&mut [0u8; 1]).now_or_never().is_none(),
            },
        }
    }

    async fn read_head(&mut self, want_session_id: bool) -> Result<Head, Exchange> {
        loop {
            if !self.read.is_empty() {
                // The common head in one pass; anything else through httparse.
                let mut reading = Reading::default();
                if let Some(line) =
                    http1::parse_response_plain(&self.read, |name, value| reading.line(name, value, want_session_id))
                {
                    if (100..200).contains(&line.status) {
                        self.read.advance(line.len);
                        continue;
                    }
                    let head = reading.head(line.minor == 1, line.status).map_err(Exchange::Failed)?;
                    self.read.advance(line.len);
                    return Ok(head);
                }
                let mut storage = [httparse::EMPTY_HEADER; http1::MAX_RESPONSE_HEADERS];
                let mut parsed = httparse::Response::new(&mut storage);
                match parsed.parse(&self.read) {
                    Ok(httparse::Status::Complete(len)) => {
                        let status = parsed.code.unwrap_or(0);
                        if (100..200).contains(&status) {
                            // An interim answer (100 Continue): skip it.
                            self.read.advance(len);
                            continue;
                        }
                        let head = interpret(&parsed, status, want_session_id).map_err(Exchange::Failed)?;
                        self.read.advance(len);
                        return Ok(head);
                    }
                    Ok(httparse::Status::Partial) if self.read.len() > MAX_HEAD => {
                        return Err(Exchange::Failed(invalid("response head too large")));
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(Exchange::Failed(invalid(&format!("malformed response head: {e}")))),
                }
            }
            match self.fill().await {
                Ok(0) => {
                    return Err(Exchange::Failed(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed before answering",
                    )))
                }
                Ok(_) => {}
                Err(e) => return Err(Exchange::Failed(e)),
            }
        }
    }
}

fn interpret(parsed: &httparse::Response<'_, '_>, status: u16, want_session_id: bool) -> io::Result<Head> {
    let mut reading = Reading::default();
    for h in parsed.headers.iter() {
        reading.line(http1::Known::of(h.name.as_bytes()), h.value, want_session_id);
    }
    reading.head(parsed.version == Some(1), status)
}

/// What a response head's lines said, as they are read.
#[derive(Default)]
struct Reading {
    length: Option<usize>,
    /// A `Content-Length` that is not a number.
    bad_length: bool,
    chunked: bool,
    /// `Connection` said `close` (`Some(false)`) or `keep-alive`, last.
    keep_alive: Option<bool>,
    event_stream: bool,
    session_id: Option<Bytes>,
    /// `WWW-Authenticate` (kept for a 401 or 403).
    challenge: Option<Bytes>,
}

impl Reading {
    fn line(&mut self, name: Option<Known>, value: &[u8], want_session_id: bool) {
        match name {
            Some(Known::ContentLength) => {
                // Plain digits, most often; else as `str::parse` reads them.
                let plain = !value.is_empty() && value.len() <= 18 && value.iter().all(u8::is_ascii_digit);
                let length = if plain {
                    usize::try_from(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))).ok()
                } else {
                    std::str::from_utf8(value).ok().and_then(|text| text.trim().parse().ok())
                };
                match length {
                    Some(n) => self.length = Some(n),
                    None => self.bad_length = true,
                }
            }
            Some(Known::TransferEncoding) => {
                self.chunked = value
                    .split(|&b| b == b',')
                    .next_back()
                    .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
            Some(Known::Connection) => {
                for token in value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        self.keep_alive = Some(false);
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        self.keep_alive = Some(true);
                    }
                }
            }
            Some(Known::ContentType) => {
                self.event_stream =
                    value.trim_ascii_start().get(..17).is_some_and(|t| t.eq_ignore_ascii_case(b"text/event-stream"));
            }
            Some(Known::McpSessionId) if want_session_id => {
                self.session_id = Some(Bytes::copy_from_slice(value));
            }
            Some(Known::WwwAuthenticate) => {
                self.challenge = Some(Bytes::copy_from_slice(value));
            }
            _ => {}
        }
    }

    /// The head, for an answer of `status` over HTTP/1.1 (`http11`) or 1.0.
    fn head(self, http11: bool, status: u16) -> io::Result<Head> {
        if self.bad_length {
            return Err(invalid("bad Content-Length"));
        }
        let mut keep_alive = self.keep_alive.unwrap_or(http11);
        let framing = if status == 204 || status == 304 {
            Framing::Length(0)
        } else if self.chunked {
            Framing::Chunked(Chunked::Size)
        } else if let Some(n) = self.length {
            Framing::Length(n)
        } else {
            keep_alive = false;
            Framing::UntilClose
        };
        let challenge = if status == 401 || status == 403 { self.challenge } else { None };
        Ok(Head {
            status,
            event_stream: self.event_stream,
            session_id: self.session_id,
            challenge,
            framing,
            keep_alive,
        })
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_owned())
}

/// Configured headers as raw `\r\nName: value` lines, for [`Request::extra`].
pub fn raw_headers(headers: &[(http::HeaderName, http::HeaderValue)]) -> Vec<u8> {
    let mut raw = Vec::new();
    for (name, value) in headers {
        raw.extend_from_slice(b"\r\n");
        raw.extend_from_slice(name.as_str().as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value.as_bytes());
    }
    raw
}

impl Body {
    /// The next piece of the body; `None` at the end.
    pub async fn chunk(&mut self) -> Option<io::Result<Bytes>> {
        if self.done {
            return None;
        }
        let result = self.next_piece().await;
        match &result {
            Some(Ok(_)) => {}
            Some(Err(_)) => {
                self.done = true;
                self.conn = None;
            }
            None => self.finish(),
        }
        result
    }

    async fn next_piece(&mut self) -> Option<io::Result<Bytes>> {
        loop {
            let conn = self.conn.as_mut()?;
            match &mut self.framing {
                Framing::Length(0) => return None,
                Framing::Length(left) => {
                    if !conn.read.is_empty() {
                        let n = (*left).min(conn.read.len());
                        *left -= n;
                        return Some(Ok(conn.read.split_to(n).freeze()));
                    }
                }
                Framing::UntilClose => {
                    if !conn.read.is_empty() {
                        return Some(Ok(conn.read.split().freeze()));
                    }
                }
                Framing::Chunked(state) => match *state {
                    Chunked::Size => {
                        if let Some(end) = conn.read.windows(2).position(|w| w == b"\r\n") {
                            let line = &conn.read[..end];
                            let digits = line.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii();
                            let size = std::str::from_utf8(digits)
                                .ok()
                                .and_then(|d| usize::from_str_radix(d, 16).ok())
                                .ok_or_else(|| invalid("bad chunk size"));
                            let size = match size {
                                Ok(size) => size,
                                Err(e) => return Some(Err(e)),
                            };
                            conn.read.advance(end + 2);
                            *state = if size == 0 { Chunked::Trailers } else { Chunked::Data(size) };
                            continue;
                        }
                        if conn.read.len() > 1024 {
                            return Some(Err(invalid("chunk size line too long")));
                        }
                    }
                    Chunked::Data(left) => {
                        if !conn.read.is_empty() {
                            let n = left.min(conn.read.len());
                            *state = if n == left { Chunked::DataEnd } else { Chunked::Data(left - n) };
                            return Some(Ok(conn.read.split_to(n).freeze()));
                        }
                    }
                    Chunked::DataEnd => {
                        if conn.read.len() >= 2 {
                            if &conn.read[..2] != b"\r\n" {
                                return Some(Err(invalid("chunk not followed by CRLF")));
                            }
                            conn.read.advance(2);
                            *state = Chunked::Size;
                            continue;
                        }
                    }
                    Chunked::Trailers => {
                        if let Some(end) = conn.read.windows(2).position(|w| w == b"\r\n") {
                            conn.read.advance(end + 2);
                            if end == 0 {
                                return None;
                            }
                            continue;
                        }
                        if conn.read.len() > MAX_HEAD {
                            return Some(Err(invalid("chunked trailers too large")));
                        }
                    }
                },
            }
            match conn.fill().await {
                Ok(0) => {
                    return match self.framing {
                        Framing::UntilClose => None,
                        _ => Some(Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed mid-body"))),
                    }
                }
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The whole body, at most `limit` bytes. A `Content-Length` body is
    /// returned as one slice of the read buffer.
    pub async fn collect(mut self, limit: usize) -> io::Result<Bytes> {
        if let (Framing::Length(n), Some(conn)) = (&self.framing, self.conn.as_mut()) {
            let n = *n;
            if n > limit {
                return Err(invalid("body over the limit"));
            }
            while conn.read.len() < n {
                if conn.read.capacity() - conn.read.len() < n - conn.read.len() {
                    conn.read.reserve(n - conn.read.len());
                }
                if conn.io.read_buf(&mut conn.read).await? == 0 {
                    self.conn = None;
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed mid-body"));
                }
            }
            let body = conn.read.split_to(n).freeze();
            self.framing = Framing::Length(0);
            self.finish();
            return Ok(body);
        }
        let mut first: Option<Bytes> = None;
        let mut joined: Option<BytesMut> = None;
        let mut total = 0;
        while let Some(piece) = self.chunk().await {
            let piece = piece?;
            total += piece.len();
            if total > limit {
                return Err(invalid("body over the limit"));
            }
            match (&mut joined, first.take()) {
                (Some(j), _) => j.extend_from_slice(&piece),
                (None, Some(head)) => {
                    let mut j = BytesMut::with_capacity(total);
                    j.extend_from_slice(&head);
                    j.extend_from_slice(&piece);
                    joined = Some(j);
                }
                (None, None) => first = Some(piece),
            }
        }
        Ok(joined.map(BytesMut::freeze).or(first).unwrap_or_default())
    }

    /// Marks the body read; the connection goes back to the pool if it can.
    fn finish(&mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.read.is_empty() {
                self.pool.checkin(conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each request on a connection with the next
    /// canned response, and counts connections.
    async fn canned(responses: Vec<&'static [u8]>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        canned_over(responses, None).await
    }

    trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
    impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

    /// [`canned`], over TLS with `tls`.
    async fn canned_over(
        responses: Vec<&'static [u8]>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            let responses = Arc::new(responses);
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let responses = responses.clone();
                let next = next.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let mut io: Box<dyn Stream> = match tls {
                        None => Box::new(tcp),
                        Some(acceptor) => match acceptor.accept(tcp).await {
                            Ok(stream) => Box::new(stream),
                            Err(_) => return,
                        },
                    };
                    let mut buf = vec![0u8; 65536];
                    loop {
                        let mut got = Vec::new();
                        // Read one request: head, then Content-Length bytes.
                        loop {
                            let n = match io.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            got.extend_from_slice(&buf[..n]);
                            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                                let len = head
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length: "))
                                    .map_or(0, |v| v.trim().parse().unwrap());
                                if got.len() >= end + 4 + len {
                                    break;
                                }
                            }
                        }
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(response) = responses.get(i) else { return };
                        if response.is_empty() {
                            return; // close without answering
                        }
                        io.write_all(response).await.unwrap();
                    }
                });
            }
        });
        (addr, connections)
    }

    #[tokio::test]
    async fn tls_connections_are_verified_and_kept_alive_across_session_tickets() {
        use tokio_rustls::rustls;
        let dir = std::env::temp_dir().join(format!("sb-h1-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A CA, and a certificate for localhost it signs.
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).current_dir(&dir).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"];
        openssl(&[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ca"]].concat());
        openssl(&[&["req"][..], &ec[..5], &["-keyout", "k.pem", "-out", "c.csr", "-subj", "/CN=localhost"]].concat());
        std::fs::write(dir.join("ext.cnf"), "subjectAltName=DNS:localhost\n").unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "c.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            "c.pem",
            "-extfile",
            "ext.cnf",
        ]);
        let (chain, key) = switchboard_core::tls::read_pem(&dir.join("c.pem"), &dir.join("k.pem"), "test").unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let (addr, connections) =
            canned_over(vec![ok; 5], Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))).await;
        let url: http::Uri = format!("https://localhost:{}/mcp", addr.rsplit(':').next().unwrap()).parse().unwrap();
        let ca = std::fs::read(dir.join("ca.pem")).unwrap();
        let trusting = switchboard_core::tls::client_config(Some(&ca), None, &[b"http/1.1"]).unwrap();
        let pool =
            Pool::new(Connect::to(&url, Duration::from_secs(2), Some(&trusting), &loopback()).unwrap(), "localhost", 4);
        for _ in 0..5 {
            let answer = pool.send(&post(b"{}"), false).await.unwrap();
            assert_eq!(answer.body.collect(1024).await.unwrap(), &b"{}"[..]);
            // Time for the server's TLS 1.3 session tickets to arrive while idle.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1, "one TLS connection, kept alive");
        // Not trusting the certificate: refused, saying why.
        let platform = switchboard_core::tls::client_config(None, None, &[b"http/1.1"]).unwrap();
        let refusing =
            Pool::new(Connect::to(&url, Duration::from_secs(2), Some(&platform), &loopback()).unwrap(), "localhost", 4);
        let err = refusing.send(&post(b"{}"), false).await.err().unwrap().to_string();
        assert!(err.contains("TLS handshake") && err.contains("UnknownIssuer"), "{err}");
        // An https URL with no TLS configuration is an error, not plain text.
        assert!(Connect::to(&url, Duration::from_secs(1), None, &loopback()).is_err());
    }

    /// A plain connection to `addr` (`127.0.0.1:PORT`).
    fn plain(addr: &str) -> Connect {
        let url: http::Uri = format!("http://{addr}/mcp").parse().unwrap();
        Connect::to(&url, Duration::from_secs(1), None, &loopback()).unwrap()
    }

    fn loopback() -> switchboard_core::egress::Egress {
        switchboard_core::egress::Egress::parse(&["loopback".into()]).unwrap()
    }

    fn post(body: &[u8]) -> Request<'_> {
        Request {
            method: "POST",
            path: "/mcp",
            headers: &[("Content-Type", b"application/json")],
            more: &[],
            extra: b"",
            body,
        }
    }

    #[tokio::test]
    async fn content_length_and_chunked_bodies_on_one_kept_alive_connection() {
        let (addr, connections) = canned(vec![
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: abc\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n3;ext=1\r\n x\n\r\n0\r\nTrailer: t\r\n\r\n",
            b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let pool = Pool::new(plain(&addr), &addr, 4);
        let first = pool.send(&post(b"{}"), true).await.unwrap();
        assert_eq!(first.status, 200);
        assert!(!first.event_stream);
        assert_eq!(first.session_id.as_deref(), Some(&b"abc"[..]));
        assert_eq!(&first.body.collect(1024).await.unwrap()[..], b"{\"a\":1}");

        let mut second = pool.send(&post(&[b'x'; 10_000]), false).await.unwrap();
        assert!(second.event_stream);
        assert_eq!(second.session_id, None, "copied only when asked for");
        let mut body = Vec::new();
        while let Some(piece) = second.body.chunk().await {
            body.extend_from_slice(&piece.unwrap());
        }
        assert_eq!(body, b"data: x\n");
        drop(second);

        let third = pool.send(&post(b"{}"), false).await.unwrap();
        assert_eq!(third.status, 202);
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1, "all three on one connection");
    }

    #[tokio::test]
    async fn each_connection_thread_reuses_only_the_connections_it_opened() {
        let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let (addr, connections) = canned(vec![ok; 7]).await;
        let pool = Pool::new(plain(&addr), &addr, 4);
        let opened = || connections.load(std::sync::atomic::Ordering::SeqCst);
        // A request from connection thread `index`, on a runtime of its own
        // (kept: its sockets are registered with it), as the router runs them.
        async fn on_thread(
            index: usize,
            pool: &Arc<Pool>,
            runtime: tokio::runtime::Runtime,
        ) -> tokio::runtime::Runtime {
            let pool = pool.clone();
            let (done, back) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                switchboard_core::thread::set_index(index);
                runtime.block_on(here(&pool));
                let _ = done.send(runtime);
            });
            back.await.expect("the thread's request failed")
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // A request from the current thread; bounded, since reading a
        // socket of another thread's idle runtime would wait for ever.
        async fn here(pool: &Arc<Pool>) {
            let answer = tokio::time::timeout(Duration::from_secs(5), async {
                pool.send(&post(b"{}"), false).await.unwrap().body.collect(64).await.unwrap()
            });
            assert_eq!(&answer.await.expect("answered in time")[..], b"{}");
        }
        let runtime = on_thread(1, &pool, runtime).await;
        assert_eq!(opened(), 1);
        // Thread 0 (this one) does not take thread 1's connection.
        here(&pool).await;
        assert_eq!(opened(), 2, "a connection of its own");
        // Each reuses its own.
        let runtime = on_thread(1, &pool, runtime).await;
        here(&pool).await;
        assert_eq!(opened(), 2, "both kept alive and reused by the thread that opened them");
        // The idle limit counts all threads' connections together.
        let small = Pool::new(plain(&addr), &addr, 1);
        here(&small).await;
        assert_eq!(small.idle.lock().unwrap().count, 1);
        let runtime = on_thread(2, &small, runtime).await;
        {
            let idle = small.idle.lock().unwrap();
            assert_eq!((idle.count, idle.by_thread.iter().map(Vec::len).sum::<usize>()), (1, 1), "one kept, not two");
            assert_eq!(idle.by_thread[0].len(), 1, "thread 0's, kept first");
        }
        // A thread's connection idle too long gives way to another's, though
        // only its own thread would take it out.
        tokio::time::sleep(POOL_IDLE + Duration::from_millis(100)).await;
        let runtime = on_thread(2, &small, runtime).await;
        let idle = small.idle.lock().unwrap();
        assert_eq!(idle.count, 1);
        assert_eq!((idle.by_thread[0].len(), idle.by_thread[2].len()), (0, 1), "the stale one dropped");
        drop(idle);
        // Dropped off this runtime (a runtime may not be dropped inside another).
        std::thread::spawn(move || drop(runtime)).join().unwrap();
    }

    #[tokio::test]
    async fn a_request_the_server_saw_is_never_sent_twice() {
        let (addr, connections) = canned(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"", // the server reads this request, then closes without answering
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nagain",
        ])
        .await;
        let pool = Pool::new(plain(&addr), &addr, 4);
        assert_eq!(&pool.send(&post(b"1"), false).await.unwrap().body.collect(64).await.unwrap()[..], b"ok");
        assert!(pool.send(&post(b"2"), false).await.is_err(), "it may have been acted on: not repeated");
        assert_eq!(&pool.send(&post(b"3"), false).await.unwrap().body.collect(64).await.unwrap()[..], b"again");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn pooled_connections_the_server_closed_are_not_reused() {
        // The server answers once per connection, then closes it.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut io, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let _ = io.read(&mut buf).await;
                    let _ = io.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
                    // Keep-alive was promised, but the server closes anyway.
                });
            }
        });
        let pool = Pool::new(plain(&addr), &addr, 4);
        for _ in 0..3 {
            let answer = pool.send(&post(b"x"), false).await.unwrap().body.collect(64).await.unwrap();
            assert_eq!(&answer[..], b"ok");
            tokio::time::sleep(Duration::from_millis(50)).await; // let the close arrive
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3, "each closed connection was replaced");
    }

    #[tokio::test]
    async fn connection_close_and_unread_bodies_do_not_return_to_the_pool() {
        let (addr, connections) = canned(vec![
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nsome",
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nmore",
        ])
        .await;
        let pool = Pool::new(plain(&addr), &addr, 4);
        pool.send(&post(b"1"), false).await.unwrap().body.collect(64).await.unwrap();
        drop(pool.send(&post(b"2"), false).await.unwrap()); // body never read
        pool.send(&post(b"3"), false).await.unwrap().body.collect(64).await.unwrap();
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 3, "neither of the first two was reused");
    }

    #[tokio::test]
    async fn refuses_oversized_bodies() {
        let (addr, _) = canned(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"]).await;
        let pool = Pool::new(plain(&addr), &addr, 4);
        let response = pool.send(&post(b"{}"), false).await.unwrap();
        assert!(response.body.collect(10).await.is_err());
    }
}
