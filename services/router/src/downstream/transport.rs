//! The first phase of every request: HTTP-level checks, before anything is
//! parsed. `Origin` (a browser page on another site must not reach a local
//! router), `Content-Type`, the body's size, `Accept`, and the
//! `MCP-Protocol-Version` of a session's request. Failures here are
//! rejections: counted (`switchboard_http_rejections_total`), not audited.

use bytes::Bytes;
use http::{HeaderValue, Response};
use hyper::body::Incoming;
use serde_json::value::RawValue;
use switchboard_core::body::CollectError;
use switchboard_protocol::jsonrpc;
use switchboard_protocol::ProtocolVersion;

use super::respond;
use crate::app::App;
use crate::body::Body;
use crate::error::Error;
use crate::headers::{Header, Headers};

/// Refuses a request before it reaches the MCP layer, and counts it.
pub fn reject(app: &App, id: Option<&RawValue>, err: Error) -> Response<Body> {
    app.metrics.rejected(err.label());
    respond::error(id, &err)
}

/// Refuses a request whose body may be partly unread: the connection is
/// closed rather than left for the client to reuse while the server drops it.
pub fn reject_unread(app: &App, err: Error) -> Response<Body> {
    let mut response = reject(app, None, err);
    response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A POST's body: hyper's, to be read within the limit (with the length
/// its `Content-Length` declares, if any), or read already (by the
/// router's own HTTP/1.1 path, [`crate::h1`], which checked its length
/// against the limit).
pub enum PostBody {
    Incoming { body: Incoming, declared: Option<u64> },
    Read(Bytes),
}

impl PostBody {
    /// hyper's body, with the length `headers` declare.
    pub fn incoming(body: Incoming, headers: &http::HeaderMap) -> PostBody {
        let declared =
            headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        PostBody::Incoming { body, declared }
    }
}

/// The transport checks of a POST (`Origin`, `Content-Type`, size), then its
/// body; a refusal is the response to send.
pub async fn receive(app: &App, headers: Headers<'_>, body: PostBody) -> Result<Bytes, Response<Body>> {
    check_origin(app, headers).map_err(|e| reject_unread(app, e))?;
    check_content_type(headers).map_err(|e| reject_unread(app, e))?;
    match body {
        PostBody::Incoming { body, declared } => {
            read_body(app, declared, body).await.map_err(|e| reject_unread(app, e))
        }
        PostBody::Read(body) => Ok(body),
    }
}

/// Browsers send `Origin`; a page on another site must not reach a local router.
pub fn check_origin(app: &App, headers: Headers<'_>) -> Result<(), Error> {
    let Some(origin) = headers.text(Header::Origin) else { return Ok(()) };
    let origin = origin.unwrap_or("");
    if app.config.server.allowed_origins.iter().any(|p| p.matches(origin)) {
        Ok(())
    } else {
        Err(Error::ForbiddenOrigin(origin.to_owned()))
    }
}

/// `application/json` (with any parameters), or no `Content-Type` at all.
fn check_content_type(headers: Headers<'_>) -> Result<(), Error> {
    let Some(ct) = headers.get(Header::ContentType) else { return Ok(()) };
    if essence(ct).eq_ignore_ascii_case(b"application/json") {
        Ok(())
    } else {
        Err(Error::UnsupportedMediaType(String::from_utf8_lossy(ct).into_owned()))
    }
}

/// `MCP-Protocol-Version`, when a session's request sends it, must be one
/// we speak on this endpoint.
pub fn check_version(headers: Headers<'_>) -> Result<(), Error> {
    let Some(text) = headers.text(Header::McpProtocolVersion) else { return Ok(()) };
    let text = text.unwrap_or("");
    match ProtocolVersion::parse(text) {
        Some(v) if v.is_streamable_http() => Ok(()),
        _ => Err(Error::UnsupportedVersion(text.to_owned())),
    }
}

/// Whether the client can take an SSE answer. Lenient: a missing `Accept`
/// or a wildcard counts as yes; only an explicit list without
/// `text/event-stream` means JSON only.
pub fn accepts_sse(headers: Headers<'_>) -> bool {
    // Nearly every request has one `Accept` line: the first is found by
    // index, and the others looked for only when it does not list SSE.
    match headers.get(Header::Accept) {
        None => true,
        Some(first) if lists_sse(first) => true,
        Some(_) => headers.get_all(Header::Accept).skip(1).any(lists_sse),
    }
}

/// Whether one `Accept` value lists `text/event-stream` (or a range with it).
/// Its items are found with `memchr`: the whole check of
/// `application/json, text/event-stream` went from about 710 instructions
/// (a walk over every line, split and searched a byte at a time) to 470.
fn lists_sse(value: &[u8]) -> bool {
    // What the official SDKs, and most clients, send: one comparison (the
    // walk below takes about 430 instructions over it).
    if value == b"application/json, text/event-stream" {
        return true;
    }
    let mut rest = value;
    loop {
        let (item, next) = match memchr::memchr(b',', rest) {
            Some(comma) => (&rest[..comma], Some(&rest[comma + 1..])),
            None => (rest, None),
        };
        let essence = essence(item);
        if essence.eq_ignore_ascii_case(b"text/event-stream")
            || essence == b"*/*"
            || essence.eq_ignore_ascii_case(b"text/*")
        {
            return true;
        }
        match next {
            Some(next) => rest = next,
            None => return false,
        }
    }
}

/// A media type without its parameters or surrounding white space.
fn essence(media_type: &[u8]) -> &[u8] {
    let end = memchr::memchr(b';', media_type).unwrap_or(media_type.len());
    media_type[..end].trim_ascii()
}

async fn read_body(app: &App, declared: Option<u64>, mut body: Incoming) -> Result<Bytes, Error> {
    let limit = app.config.server.max_body_bytes;
    if declared.is_some_and(|n| n > limit as u64) {
        // Refused before a byte of it is read; read and dropped meanwhile,
        // so that a client that writes its whole body before reading the
        // answer gets the 413 rather than a broken connection.
        drain(body, limit);
        return Err(Error::BodyTooLarge { limit });
    }
    match switchboard_core::body::collect(&mut body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(CollectError::TooLarge) => {
            drain(body, limit);
            Err(Error::BodyTooLarge { limit })
        }
        Err(CollectError::Read(e)) => {
            Err(Error::Parse(jsonrpc::ParseError::Syntax(format!("could not read the body: {e}"))))
        }
    }
}

/// Reads the rest of a refused body and drops it, in the background, for
/// at most [`DRAIN_TIME`] and the larger of [`DRAIN_BYTES`] and 16 times the
/// body limit; then the connection closes (its answer says so).
fn drain(mut body: Incoming, limit: usize) {
    use http_body_util::BodyExt;
    let mut left = DRAIN_BYTES.max(limit.saturating_mul(16));
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + DRAIN_TIME;
        while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, body.frame()).await {
            let Ok(data) = frame.into_data() else { continue };
            let Some(rest) = left.checked_sub(data.len()) else { break };
            left = rest;
        }
    });
}

/// Bounds on reading a refused body to its end.
const DRAIN_BYTES: usize = 64 << 20;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> Headers<'static> {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        Headers::Map(Box::leak(Box::new(h)))
    }

    #[test]
    fn accept_is_lenient() {
        assert!(accepts_sse(headers(&[])));
        assert!(accepts_sse(headers(&[("accept", "application/json, text/event-stream")])));
        assert!(accepts_sse(headers(&[("accept", "*/*")])));
        assert!(!accepts_sse(headers(&[("accept", "application/json")])));
        assert!(accepts_sse(headers(&[("accept", "application/json"), ("accept", "text/event-stream;q=0.5")])));
        assert!(accepts_sse(headers(&[("accept", "application/json"), ("accept", "image/png"), ("accept", "text/*")])));
        assert!(!accepts_sse(headers(&[("accept", "application/json"), ("accept", "image/png, text/plain")])));
        assert!(accepts_sse(headers(&[("accept", " Text/Event-Stream ; q=1"), ("accept", "application/json")])));
        // The common value is taken at once; its neighbours are walked.
        assert!(lists_sse(b"application/json, text/event-stream"));
        assert!(lists_sse(b"application/json,text/event-stream"));
        assert!(lists_sse(b"application/json, text/event-stream;q=0.9"));
        assert!(!lists_sse(b"application/json, text/event-streams"));
        assert!(!lists_sse(b"application/json, text/event-strea"));
    }

    #[test]
    fn content_type_and_version() {
        assert!(check_content_type(headers(&[("content-type", "application/json; charset=utf-8")])).is_ok());
        assert!(check_content_type(headers(&[])).is_ok());
        assert!(matches!(
            check_content_type(headers(&[("content-type", "text/plain")])),
            Err(Error::UnsupportedMediaType(_))
        ));
        assert!(check_version(headers(&[("mcp-protocol-version", "2025-06-18")])).is_ok());
        assert!(check_version(headers(&[("mcp-protocol-version", "2024-11-05")])).is_err());
        assert!(check_version(headers(&[("mcp-protocol-version", "1999-01-01")])).is_err());
    }
}
