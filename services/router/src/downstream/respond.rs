//! Building HTTP responses. Strict on the way out: every body is labelled
//! exactly `application/json` or `text/event-stream`.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use switchboard_protocol::jsonrpc;
use tokio::sync::mpsc;

use crate::body::Body;
use crate::error::Error;

pub const JSON_TYPE: &str = "application/json";
pub const JSON: HeaderValue = HeaderValue::from_static(JSON_TYPE);
pub const SSE: HeaderValue = HeaderValue::from_static("text/event-stream");
pub static SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
static ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// `200 application/json` with one message (its type implied by the body:
/// see [`Body::Json`] and [`labelled`]).
pub fn json(body: Bytes) -> Response<Body> {
    Response::new(Body::Json(Some(body)))
}

/// `response` with the content type its body implies in its header map,
/// for a consumer that reads the map (hyper). Any other response is
/// returned as it is.
pub fn labelled(response: Response<Body>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    let body = match body {
        Body::Json(data) => {
            parts.headers.insert(CONTENT_TYPE, JSON);
            Body::Full(data)
        }
        other => other,
    };
    Response::from_parts(parts, body)
}

/// `200 application/json` assembled from parts (prebuilt pieces are not copied).
pub fn json_parts(parts: VecDeque<Bytes>) -> Response<Body> {
    with_type(StatusCode::OK, Body::Parts(parts), JSON)
}

/// A JSON-RPC error response for `err`, with the status it calls for.
/// A 429 or 503 carries `Retry-After` (whole seconds, rounded up); the
/// `WWW-Authenticate` of a 401 or 403 is the authenticator's to add
/// ([`crate::exchange::Exchange`] does).
pub fn error(id: Option<&RawValue>, err: &Error) -> Response<Body> {
    let body = jsonrpc::error_response(id, err.code(), &err.to_string(), err.data().as_ref());
    let mut response = with_type(err.status(), Body::full(body), JSON);
    if let Some(after) = err.retry_after() {
        let seconds = after.as_millis().div_ceil(1000).max(1);
        response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(seconds as u64));
    }
    response
}

/// `202 Accepted`, no body: a notification or response was taken.
pub fn accepted() -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// `200 text/event-stream`, fed by `rx`.
pub fn sse(rx: mpsc::Receiver<Bytes>, keep_alive: Duration) -> Response<Body> {
    let mut response = with_type(StatusCode::OK, Body::sse(rx, keep_alive), SSE);
    let headers = response.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    headers.insert(ACCEL_BUFFERING.clone(), HeaderValue::from_static("no"));
    response
}

/// The same answer as a one-event SSE stream (for `response_mode = "sse"`).
/// Anything but a `200 application/json` answer is returned unchanged.
pub fn as_sse(response: Response<Body>) -> Response<Body> {
    let response = labelled(response);
    if response.status() != StatusCode::OK || response.headers().get(CONTENT_TYPE) != Some(&JSON) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let message = match body {
        Body::Full(Some(bytes)) => bytes,
        Body::Parts(pieces) => {
            let mut joined = bytes::BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
            for piece in pieces {
                joined.extend_from_slice(&piece);
            }
            joined.freeze()
        }
        other => return Response::from_parts(parts, other),
    };
    parts.headers.insert(CONTENT_TYPE, SSE);
    parts.headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    parts.headers.insert(ACCEL_BUFFERING.clone(), HeaderValue::from_static("no"));
    Response::from_parts(parts, Body::full(switchboard_protocol::sse::encode_event(None, None, &message)))
}

/// A plain status with a short text body (for non-MCP paths).
pub fn text(status: StatusCode, text: &'static str) -> Response<Body> {
    with_type(
        status,
        Body::full(Bytes::from_static(text.as_bytes())),
        HeaderValue::from_static("text/plain; charset=utf-8"),
    )
}

/// A plain status with a text body made for this response.
pub fn owned_text(status: StatusCode, text: String) -> Response<Body> {
    with_type(status, Body::full(Bytes::from(text)), HeaderValue::from_static("text/plain; charset=utf-8"))
}

fn with_type(status: StatusCode, body: Body, content_type: HeaderValue) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn bytes(response: Response<Body>) -> Bytes {
        response.into_body().collect().await.expect("infallible").to_bytes()
    }

    #[tokio::test]
    async fn a_json_answer_is_labelled_where_its_head_is_made() {
        let message = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        let answer = json(message.clone());
        // No header map built for it here: its body says what it is.
        assert!(answer.headers().is_empty());
        assert!(matches!(answer.body(), Body::Json(Some(_))));
        let sent = labelled(answer);
        assert_eq!(sent.status(), StatusCode::OK);
        assert_eq!(sent.headers().get(CONTENT_TYPE), Some(&JSON));
        assert_eq!(sent.headers().len(), 1);
        assert!(matches!(sent.body(), Body::Full(Some(_))));
        assert_eq!(bytes(sent).await, message);
        // Anything else is left as it is.
        let text = labelled(super::text(StatusCode::OK, "ok\n"));
        assert_eq!(text.headers().get(CONTENT_TYPE).unwrap(), "text/plain; charset=utf-8");
        assert_eq!(bytes(text).await, "ok\n");
        assert!(labelled(accepted()).headers().is_empty());
    }

    #[tokio::test]
    async fn a_json_answer_turns_into_one_event_when_asked_to() {
        let message = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        let streamed = as_sse(json(message.clone()));
        assert_eq!(streamed.headers().get(CONTENT_TYPE), Some(&SSE));
        let body = bytes(streamed).await;
        assert_eq!(body, switchboard_protocol::sse::encode_event(None, None, &message));
        // An error keeps its own type and status.
        let refused = as_sse(error(None, &Error::Parse(switchboard_protocol::jsonrpc::ParseError::Batch)));
        assert_eq!(refused.headers().get(CONTENT_TYPE), Some(&JSON));
        assert_ne!(refused.status(), StatusCode::OK);
    }
}
