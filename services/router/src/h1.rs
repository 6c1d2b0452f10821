//! The router's own HTTP/1.1 path for its hot request: a `POST` to `/mcp`
//! with a `Content-Length` body, the way nginx and pingora serve theirs.
//! The head is parsed with `httparse` straight from the connection's
//! buffer (`switchboard_protocol::http1`), the body is taken from the same
//! buffer without a copy, the request goes through the same phases as
//! hyper's ([`downstream::post_read`]), and the response is written with one
//! vectored write: no body channel, no per-request timer, no task. The
//! connection's one timer keeps its requests' upstream deadlines too
//! ([`deadline`]).
//!
//! Everything else stays with hyper: HTTP/2 (by ALPN or prior knowledge),
//! `GET` and `DELETE`, other paths, HTTP/1.0, chunked bodies, `Expect`,
//! `Upgrade`, a missing `Host`, a body over the limit. The first such
//! request hands the connection to hyper for good, with the bytes already
//! read put back in front of it ([`Rewind`]).
//!
//! What must never be guessed at is refused and the connection closed:
//! ambiguous framing (a `Content-Length` twice, or beside
//! `Transfer-Encoding`, or not a plain number), obsolete line folding, a
//! bare CR, a head over 64 KiB or 100 lines — 400 or 431 with a JSON-RPC
//! error, counted in `switchboard_http_rejections_total`.
//!
//! The connection bounds of `connections.rs` hold here as under hyper: the
//! first head within `server.header_timeout` of accept, and no more than
//! `server.idle_timeout` without a request in flight. A body may pause
//! between its bytes for at most `server.idle_timeout`, and room for it is
//! made 64 KiB at a time as it arrives (a large announced length reserves
//! nothing). A client that takes none of its answer for
//! `server.idle_timeout` is let go (counted as `idle`). They are kept with
//! one timer per connection, moved only when it fires early or must fire
//! sooner.
//!
//! A client that ends its side after pipelining requests (a half-close) is
//! answered every request it sent, then closed (hyper too answers those
//! handed to it, told of the half-close); one that ends it with no request
//! behind the one in flight has hung up, and that request is abandoned, as
//! under hyper.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::{Buf, Bytes, BytesMut};
use http::Response;
use http_body::Body as _;
use switchboard_protocol::http1::{self, Framing, RequestHead};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use crate::app::App;
use crate::body::Body;
use crate::connections::Connections;
use crate::deadline;
use crate::downstream;
use crate::error::Error;
use crate::headers::Head;

/// How a connection served here ended.
pub enum Ended<S> {
    /// Closed (by either side, or for idleness, or refused).
    Closed,
    /// A request this path does not serve: hyper takes the connection,
    /// reading what was buffered first. `requests` were served here before;
    /// `half_closed`: the client ended its side after sending what is
    /// buffered (hyper must answer it all the same).
    HandOff { io: Rewind<S>, requests: u64, half_closed: bool },
}

/// What a connection served here needs of the server.
pub struct Ctx<'a> {
    pub app: &'a Arc<App>,
    pub conns: &'a Connections,
    /// The connection's client certificate and address, as requests carry them.
    pub extensions: &'a http::Extensions,
    /// Changes when the server begins to drain: an idle connection closes,
    /// a busy one after its answer. `None` while draining already (one
    /// request, then close).
    pub drain: Option<tokio::sync::watch::Receiver<bool>>,
}

/// What waiting for bytes ended with.
enum Wait {
    Data,
    /// The client closed its side (or the read failed).
    Eof,
    /// No request in time: `header_timeout` or `idle`.
    Expired(&'static str),
    /// The server is draining and this connection is idle.
    Drain,
}

struct Conn<'a, S> {
    io: S,
    cx: Ctx<'a>,
    buf: BytesMut,
    out: Vec<u8>,
    /// The current request's header lines, as the phases read them: kept
    /// for the connection (emptied after each request, its room kept).
    headers: Head,
    requests: u64,
    /// The end of the last answer (or the accept): idleness counts from it.
    quiet_since: Instant,
    timer: deadline::Timer,
    /// The `Date` of the current second.
    date: (u64, [u8; 29]),
    /// The client ended its side: what is buffered is served, nothing more
    /// is read.
    eof: bool,
}

/// Serves `io` (a connection just accepted, or its TLS stream) for as long
/// as its requests are this path's.
pub async fn serve<S>(io: S, cx: Ctx<'_>) -> Ended<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limits = cx.conns.limits();
    let now = Instant::now();
    let mut conn = Conn {
        io,
        cx,
        buf: BytesMut::with_capacity(8 * 1024),
        out: Vec::with_capacity(1024),
        headers: Head::default(),
        requests: 0,
        quiet_since: now,
        timer: deadline::Timer::new(now + limits.header_timeout),
        date: (0, [0; 29]),
        eof: false,
    };
    loop {
        let head = match conn.read_head().await {
            Ok(Some(head)) => head,
            Ok(None) => return conn.close().await,
            Err(HandOff) => return conn.hand_off(),
        };
        if !conn.ours(&head) {
            return conn.hand_off();
        }
        match conn.exchange(head).await {
            Next::Continue => {}
            Next::Close => return conn.close().await,
        }
    }
}

/// How long a closing connection's shutdown (TLS `close_notify`, FIN) may take.
const SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// The connection goes to hyper.
struct HandOff;

enum Next {
    Continue,
    Close,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<'_, S> {
    /// Reads until a whole head is buffered; `None` when the connection
    /// ended or was closed (a refused head answered first).
    async fn read_head(&mut self) -> Result<Option<RequestHead>, HandOff> {
        loop {
            // HTTP/2 with prior knowledge: hyper's.
            if self.requests == 0 && self.buf.len() >= 3 && self.buf.starts_with(b"PRI") {
                return Err(HandOff);
            }
            match http1::parse_request(&self.buf, &mut self.headers.spans) {
                Ok(Some(head)) => return Ok(Some(head)),
                Ok(None) => {}
                // Longer heads are hyper's (it takes up to 400 KiB, 100 lines).
                Err(http1::HeadError::TooLarge | http1::HeadError::TooManyHeaders) => return Err(HandOff),
                Err(e) => {
                    let response = downstream::transport::reject_unread(self.cx.app, Error::MalformedHttp(e));
                    let _ = self.respond(response, true).await;
                    return Ok(None);
                }
            }
            let idle = self.buf.is_empty();
            let limits = self.cx.conns.limits();
            let (limit, reason) = if self.requests == 0 {
                (limits.header_timeout, "header_timeout")
            } else {
                (limits.idle_timeout, "idle")
            };
            match self.wait_for_bytes(idle, self.quiet_since + limit, reason).await {
                Wait::Data => {}
                Wait::Eof | Wait::Drain => return Ok(None),
                Wait::Expired(reason) => {
                    self.cx.conns.closed(reason);
                    tracing::debug!(reason, "connection closed: no request in flight for too long");
                    return Ok(None);
                }
            }
        }
    }

    /// Whether this path serves the request `head` names.
    fn ours(&self, head: &RequestHead) -> bool {
        let method = &self.buf[head.method.clone()];
        let target = &self.buf[head.target.clone()];
        let path = target.split(|&b| b == b'?').next().unwrap_or(b"");
        method == b"POST"
            && path == b"/mcp"
            && head.minor == 1
            && head.hosts == 1
            && !head.transfer_encoding
            && !head.expect
            && !head.upgrade
            && head.content_length.is_some_and(|n| n <= self.cx.app.config.server.max_body_bytes as u64)
    }

    /// Serves one request: its body read, its phases run, its answer written.
    async fn exchange(&mut self, head: RequestHead) -> Next {
        let started = std::time::Instant::now();
        let length = head.content_length.unwrap_or(0) as usize;
        // The body, whole, after the head; room made as it comes, and a
        // pause between its bytes bounded by the idle limit.
        while self.buf.len() < head.len + length {
            self.buf.reserve((head.len + length - self.buf.len()).min(BODY_ROOM));
            let deadline = Instant::now() + self.cx.conns.limits().idle_timeout;
            match self.wait_for_bytes(false, deadline, "idle").await {
                Wait::Data | Wait::Drain => {}
                Wait::Eof => return Next::Close,
                Wait::Expired(reason) => {
                    self.cx.conns.closed(reason);
                    return Next::Close;
                }
            }
        }
        let head_bytes = self.buf.split_to(head.len).freeze();
        let body = self.buf.split_to(length).freeze();
        self.headers.index(head_bytes);
        self.requests += 1;
        // The phases run while the client is watched: one that hangs up
        // abandons its request (cancelled upstream), as under hyper.
        let answered = {
            let Conn { io, buf, cx, eof, headers, timer, .. } = self;
            // Pinned where it is made: moving it is copying all of it.
            let phases = std::pin::pin!(downstream::post_read(cx.app, started, headers, body, cx.extensions));
            until_hang_up(phases, timer, io, buf, eof).await.map(downstream::refused_or)
        };
        // The values are the head's bytes: let them go.
        self.headers.clear();
        let Some(response) = answered else {
            return Next::Close;
        };
        let close = head.close || self.draining();
        match self.respond(response, close).await {
            Ok(false) => {
                self.quiet_since = Instant::now();
                Next::Continue
            }
            Ok(true) => Next::Close,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    self.cx.conns.closed("idle");
                    tracing::debug!("connection closed: the client took none of its answer for the idle limit");
                }
                Next::Close
            }
        }
    }

    /// Whether this connection ends after its current request (the server
    /// drains).
    fn draining(&self) -> bool {
        self.cx.drain.as_ref().is_none_or(|d| *d.borrow()) || self.cx.app.shutting_down()
    }

    /// Waits for more bytes of the client (into the buffer), `deadline`
    /// (then `Expired(reason)`), or (`idle`: nothing of a request read
    /// yet) the server's drain.
    async fn wait_for_bytes(&mut self, idle: bool, deadline: Instant, reason: &'static str) -> Wait {
        if self.eof {
            return Wait::Eof;
        }
        let Conn { io, buf, timer, cx, requests, .. } = self;
        // The timer may have been left later than this deadline.
        if timer.deadline() > deadline {
            timer.reset(deadline);
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        let served = *requests > 0;
        let drain = &mut cx.drain;
        let draining = async move {
            match (drain, idle) {
                (Some(drain), true) => {
                    let _ = drain.wait_for(|d| *d).await;
                }
                // Draining already: one request, then close.
                (None, true) if served => {}
                _ => std::future::pending().await,
            }
        };
        tokio::pin!(draining);
        loop {
            tokio::select! {
                biased;
                read = io.read_buf(buf) => return match read {
                    Ok(0) | Err(_) => Wait::Eof,
                    Ok(_) => Wait::Data,
                },
                () = &mut *timer => {
                    if Instant::now() >= deadline {
                        return Wait::Expired(reason);
                    }
                    // Early: the connection was busy since it was set.
                    timer.reset(deadline);
                }
                () = &mut draining => return Wait::Drain,
            }
        }
    }

    /// Writes `response`; `Ok(true)` when the connection must close after
    /// it (`close`, or the response says so).
    async fn respond(&mut self, response: Response<Body>, close: bool) -> std::io::Result<bool> {
        let (parts, body) = response.into_parts();
        let close = close
            || parts.headers.get(http::header::CONNECTION).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let status = parts.status.as_u16();
        let headers = parts.headers.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
        let date = self.date();
        self.out.clear();
        match body {
            Body::Empty => {
                let framing = if status == 204 || status == 304 { None } else { Some(Framing::Length(0)) };
                write_head(&mut self.out, status, headers, &date, framing, close);
                let out = std::mem::take(&mut self.out);
                let sent = self.send(&mut [&out[..]]).await;
                self.out = out;
                sent?;
            }
            Body::Full(data) => {
                let data = data.unwrap_or_default();
                write_head(&mut self.out, status, headers, &date, Some(Framing::Length(data.len())), close);
                let out = std::mem::take(&mut self.out);
                let sent = self.send(&mut [&out[..], &data[..]]).await;
                self.out = out;
                sent?;
            }
            Body::Json(data) => {
                let data = data.unwrap_or_default();
                let json: (&[u8], &[u8]) = (b"content-type", downstream::respond::JSON_TYPE.as_bytes());
                let headers = std::iter::once(json).chain(headers);
                write_head(&mut self.out, status, headers, &date, Some(Framing::Length(data.len())), close);
                let out = std::mem::take(&mut self.out);
                let sent = self.send(&mut [&out[..], &data[..]]).await;
                self.out = out;
                sent?;
            }
            Body::Parts(parts) => {
                let length = parts.iter().map(Bytes::len).sum();
                write_head(&mut self.out, status, headers, &date, Some(Framing::Length(length)), close);
                let out = std::mem::take(&mut self.out);
                let mut slices: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
                slices.push(&out);
                slices.extend(parts.iter().map(|p| &p[..]));
                let sent = self.send(&mut slices).await;
                drop(slices);
                self.out = out;
                sent?;
            }
            body @ Body::Sse { .. } => {
                write_head(&mut self.out, status, headers, &date, Some(Framing::Chunked), close);
                let head = std::mem::take(&mut self.out);
                let streamed = self.stream(&head, body).await;
                self.out = head;
                return streamed.map(|ended_by_client| close || ended_by_client);
            }
        }
        Ok(close)
    }

    /// Writes a streamed body as chunks, after `head`, while watching the
    /// client: one that hangs up ends the stream (its body dropped, as
    /// hyper drops it), and bytes it sends meanwhile (its next request)
    /// are kept. `Ok(true)`: the client is gone.
    async fn stream(&mut self, head: &[u8], mut body: Body) -> std::io::Result<bool> {
        let mut pending: &[u8] = head;
        let mut chunk = Vec::with_capacity(32);
        loop {
            if !pending.is_empty() {
                self.send(&mut [pending]).await?;
                pending = &[];
            }
            let event = std::future::poll_fn(|cx| {
                if let Poll::Ready(frame) = Pin::new(&mut body).poll_frame(cx) {
                    return Poll::Ready(Some(frame));
                }
                match watch_client(&mut self.io, cx, &mut self.buf, &mut self.eof) {
                    Poll::Ready(()) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            match event {
                None => return Ok(true),
                Some(None) => {
                    self.send(&mut [b"0\r\n\r\n"]).await?;
                    return Ok(false);
                }
                Some(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    chunk.clear();
                    http1::write_chunk_head(&mut chunk, data.len());
                    self.send(&mut [&chunk[..], &data[..], b"\r\n"]).await?;
                }
                Some(Some(Err(never))) => match never {},
            }
        }
    }

    /// Writes every byte of `slices`, in order, then flushes (TLS may hold
    /// part of what a write took). A client that takes nothing for the idle
    /// limit gets `TimedOut`. The timer is only looked at while the socket
    /// is full.
    async fn send(&mut self, slices: &mut [&[u8]]) -> std::io::Result<()> {
        let idle = self.cx.conns.limits().idle_timeout;
        let Conn { io, timer, .. } = self;
        write_all_vectored(io, timer, idle, slices).await?;
        within_idle(timer, idle, |cx| Pin::new(&mut *io).poll_flush(cx)).await
    }

    /// The `Date` of now, made once a second.
    fn date(&mut self) -> [u8; 29] {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if self.date.0 != now || self.date.1[0] == 0 {
            self.date = (now, http1::http_date(now));
        }
        self.date.1
    }

    /// Closes the connection: a TLS client is told (`close_notify`), as
    /// hyper tells it; a peer that does not take it is not waited for.
    async fn close(mut self) -> Ended<S> {
        let _ = tokio::time::timeout(SHUTDOWN, self.io.shutdown()).await;
        Ended::Closed
    }

    /// The connection as hyper takes it: what was read, then the socket.
    fn hand_off(self) -> Ended<S> {
        Ended::HandOff {
            io: Rewind { buffered: self.buf.freeze(), inner: self.io },
            requests: self.requests,
            half_closed: self.eof,
        }
    }
}

/// `work`'s output, or `None` if the client hangs up (or its connection
/// fails) first; bytes it sends meanwhile (its next request) are kept in
/// `buf` (see [`watch_client`]). The connection's `timer` keeps the
/// request's upstream deadlines meanwhile ([`deadline`]).
async fn until_hang_up<F: std::future::Future, S: AsyncRead + Unpin>(
    mut work: Pin<&mut F>,
    timer: &mut deadline::Timer,
    io: &mut S,
    buf: &mut BytesMut,
    eof: &mut bool,
) -> Option<F::Output> {
    let mut watcher = deadline::Watcher::new();
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = watcher.poll(work.as_mut(), timer, cx) {
            return Poll::Ready(Some(output));
        }
        match watch_client(io, cx, buf, eof) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Watches a client while its request is served: what it sends (its next
/// requests) is kept in `buf`, up to a head's worth (then it is not read
/// until the answer is written). `Ready` when it hung up: its side ended
/// (or failed) with nothing of another request sent. Its side ended after
/// sending more (pipelined requests, then a half-close) is not a hang-up:
/// `eof` is set, and what it sent is served.
fn watch_client<S: AsyncRead + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
    eof: &mut bool,
) -> Poll<()> {
    while !*eof && buf.len() < http1::MAX_HEAD {
        match poll_read_buf(io, cx, buf) {
            Poll::Ready(Ok(0)) if !buf.is_empty() => *eof = true,
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => break,
        }
    }
    Poll::Pending
}

/// How much room is made at a time for a body still arriving.
const BODY_ROOM: usize = 64 * 1024;

/// Polls `op` (a write or a flush) until it is done, or `TimedOut` once it
/// made no progress for `idle`. `timer` is moved only when `op` must wait.
async fn within_idle<T>(
    timer: &mut deadline::Timer,
    idle: std::time::Duration,
    mut op: impl FnMut(&mut Context<'_>) -> Poll<std::io::Result<T>>,
) -> std::io::Result<T> {
    let mut waiting = false;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(done) = op(cx) {
            return Poll::Ready(done);
        }
        if !waiting {
            waiting = true;
            timer.reset(Instant::now() + idle);
        }
        match std::future::Future::poll(Pin::new(&mut *timer), cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

fn write_head<'h>(
    out: &mut Vec<u8>,
    status: u16,
    headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
    date: &[u8],
    framing: Option<Framing>,
    close: bool,
) {
    match framing {
        Some(framing) => http1::write_response_head(out, status, headers, date, framing, close),
        // 204 and 304 carry no framing at all.
        None => {
            http1::write_response_head(out, status, headers, date, Framing::Length(0), close);
            let line = b"content-length: 0\r\n";
            if let Some(at) = out.windows(line.len()).position(|w| w == line) {
                out.drain(at..at + line.len());
            }
        }
    }
}

/// Reads what the socket has into `buf` (through a small copy: this is
/// for the rare bytes a client sends while its request is served).
fn poll_read_buf<S: AsyncRead + Unpin>(
    io: &mut S,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    // Uninitialised: mostly the socket has nothing, and nothing is written.
    let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut read = ReadBuf::uninit(&mut chunk);
    match Pin::new(io).poll_read(cx, &mut read) {
        Poll::Ready(Ok(())) => {
            buf.extend_from_slice(read.filled());
            Poll::Ready(Ok(read.filled().len()))
        }
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    }
}

/// Writes every byte of `slices`, in order, with as few writes as the
/// socket allows; `TimedOut` when one write waits more than `idle`.
async fn write_all_vectored<S: AsyncWrite + Unpin>(
    io: &mut S,
    timer: &mut deadline::Timer,
    idle: std::time::Duration,
    slices: &mut [&[u8]],
) -> std::io::Result<()> {
    let mut first = 0;
    while first < slices.len() {
        if slices[first].is_empty() {
            first += 1;
            continue;
        }
        // On the stack for the usual few pieces (a head, a body, a chunk's end).
        let pending = &slices[first..];
        let written = if pending.len() <= 4 {
            let mut io_slices = [IoSlice::new(&[]); 4];
            for (to, from) in io_slices.iter_mut().zip(pending) {
                *to = IoSlice::new(from);
            }
            let io_slices = &io_slices[..pending.len()];
            within_idle(timer, idle, |cx| Pin::new(&mut *io).poll_write_vectored(cx, io_slices)).await?
        } else {
            let io_slices: Vec<IoSlice<'_>> = pending.iter().map(|s| IoSlice::new(s)).collect();
            within_idle(timer, idle, |cx| Pin::new(&mut *io).poll_write_vectored(cx, &io_slices)).await?
        };
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 {
            let len = slices[first].len();
            if left >= len {
                left -= len;
                first += 1;
            } else {
                slices[first] = &slices[first][left..];
                left = 0;
            }
        }
    }
    Ok(())
}

/// A stream with bytes already read from it put back in front.
pub struct Rewind<S> {
    buffered: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if !self.buffered.is_empty() {
            let n = self.buffered.len().min(buf.remaining());
            buf.put_slice(&self.buffered[..n]);
            self.buffered.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
