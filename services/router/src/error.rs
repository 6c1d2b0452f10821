//! The router's one error type, and the one place errors become responses.
//!
//! Each variant knows which side caused it ([`Side`]) and maps to an HTTP
//! status and a JSON-RPC error code in [`Error::status`] and [`Error::code`].
//! Messages say what was wrong and, where it helps, what to do.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use switchboard_core::policy::AuthFailure;
use switchboard_protocol::jsonrpc::{code, ParseError};
use switchboard_protocol::modern::code as modern;

use switchboard_upstream::UpstreamError;

/// JSON-RPC code of a request refused for its API key (HTTP 401).
pub const UNAUTHENTICATED: i64 = -32011;
/// JSON-RPC code of a request its token's scopes do not cover (HTTP 403).
pub const INSUFFICIENT_SCOPE: i64 = -32013;
/// JSON-RPC code of a request its upstream needs a credential for that the
/// caller has not got (the message says how to add one).
pub const CREDENTIAL_REQUIRED: i64 = -32012;
/// JSON-RPC code of a request that needs the user to open a URL first
/// (URL-mode elicitation, MCP 2025-11-25).
pub const URL_ELICITATION_REQUIRED: i64 = -32042;
/// JSON-RPC code of a request refused by a rate limit (HTTP 429).
pub const RATE_LIMITED: i64 = -32029;

/// Who caused a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something we cannot serve.
    Downstream,
    /// An upstream server failed or is unreachable.
    Upstream,
    /// The router itself.
    Internal,
}

/// Everything that can go wrong while serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Parse(#[from] ParseError),
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("unsupported Content-Type {0:?}: send application/json")]
    UnsupportedMediaType(String),
    #[error("Origin {0:?} is not allowed (see server.allowed_origins)")]
    ForbiddenOrigin(String),
    #[error("the Mcp-Session-Id header is required after initialize")]
    MissingSession,
    #[error("unknown or expired session: initialize a new one")]
    UnknownSession,
    /// The session is not on this replica and the shared store cannot be
    /// reached to load it (not a 404: the session may well be alive).
    #[error("the session store is unreachable, so this replica cannot load the session; retry shortly")]
    SessionStoreDown,
    #[error("an HTTP/1.1 request needs exactly one Host header (RFC 9112, section 3.2)")]
    MissingHost,
    /// A request head the router's HTTP/1.1 path refuses (ambiguous
    /// framing, malformed, too large); the connection is closed.
    #[error("{0}")]
    MalformedHttp(switchboard_protocol::http1::HeadError),
    #[error("unknown or expired event stream in Last-Event-ID")]
    UnknownStream,
    #[error("unsupported MCP-Protocol-Version {0:?} (supported: {versions})", versions = switchboard_protocol::version::session_versions())]
    UnsupportedVersion(String),
    #[error("the router has reached its limit of {0} sessions; try again later")]
    TooManySessions(usize),
    /// A tenant's cap on its sessions (`limits.sessions`) or its keys'
    /// (`limits.key_sessions`), on this replica.
    #[error("session limit reached: the {limit} limit allows at most {max} sessions at once on this replica; end one (DELETE) or retry later")]
    SessionCap { limit: &'static str, max: u32 },
    #[error("method not found: {0}")]
    MethodNotFound(String),
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("unknown tool: {0}")]
    UnknownTool(String),
    /// A pinned tool whose definition is not approved (changed since it
    /// was, or never approved yet): withheld until an operator approves it.
    #[error("tool {0} is withheld: its definition changed since it was approved (or was never approved), and waits for an operator's approval")]
    ToolWithheld(String),
    /// Arguments that do not match the tool's input schema (checked by the router).
    #[error("invalid arguments for {tool}: {invalid}")]
    InvalidArguments { tool: String, invalid: switchboard_protocol::schema::Invalid },
    #[error("unknown prompt: {0}")]
    UnknownPrompt(String),
    #[error("unknown resource: {0}")]
    UnknownResource(String),
    #[error("invalid cursor: {0}")]
    InvalidCursor(String),
    #[error("upstream {upstream:?} did not answer within {after:?}")]
    UpstreamTimeout { upstream: Arc<str>, after: Duration },
    #[error("upstream {upstream:?} is unavailable: {source}")]
    Upstream { upstream: Arc<str>, source: UpstreamError },
    /// The upstream needs a credential of the caller's (its user's or
    /// tenant's) that the vault does not hold: nothing was sent.
    #[error("{message}")]
    CredentialRequired { upstream: Arc<str>, message: String },
    /// The upstream acts for each user and needs this one's consent: the
    /// link to open (as URL-mode elicitation to a client that takes it).
    #[error("upstream {upstream:?} acts for you and needs your consent: open {url} to authorize the router there, then retry")]
    AuthorizationRequired { upstream: Arc<str>, url: String, elicitation: bool },
    #[error("the router is shutting down")]
    ShuttingDown,
    #[error("{}", .0.message())]
    Unauthenticated(switchboard_core::policy::AuthFailure),
    /// The access token's scopes do not cover the request; the `String` is
    /// the scope to ask for (the token's and the one that would allow it).
    #[error("the access token's scopes do not allow this request; ask for scope \"{0}\"")]
    InsufficientScope(String),
    #[error("rate limit exceeded: the {limit} limit allows no more requests now; retry after {retry_after:?}")]
    RateLimited { limit: &'static str, retry_after: Duration },
    #[error("too many requests in flight for this tenant (at most {0}); retry when one finishes")]
    TooManyInFlight(u32),
    #[error("internal error: {0}")]
    Internal(String),
    // MCP 2026-07-28 (stateless requests).
    /// A header disagrees with the body, or a required one is missing.
    #[error("{0}")]
    HeaderMismatch(String),
    /// `params._meta` lacks what the era requires.
    #[error("invalid params: {0}")]
    InvalidMeta(String),
    /// A version in `MCP-Protocol-Version` / `_meta` the router does not speak.
    #[error("unsupported protocol version {0:?}")]
    UnsupportedModernVersion(String),
    /// A method that does not exist in the stateless era (or at all), asked
    /// statelessly: HTTP 404.
    #[error("method not found: {0}")]
    NoSuchMethod(String),
    /// The upstream asked the client for something it did not declare.
    #[error("the client did not declare the {0} capability, which this request needs")]
    MissingCapability(&'static str),
    /// A `requestState` the router did not issue, or one that expired.
    #[error("invalid requestState: {0}")]
    InvalidRequestState(String),
    /// The client answered a server request the router does not know of
    /// (not one it relayed, or one no upstream awaits any more).
    #[error("no request with id {0} awaits an answer from this session")]
    UnknownAnswer(String),
    /// The client's answer could not be passed to the upstream that asked.
    #[error("the answer could not be delivered to upstream {upstream:?}: {source}")]
    AnswerNotDelivered { upstream: Arc<str>, source: UpstreamError },
}

impl From<switchboard_session::SessionError> for Error {
    fn from(e: switchboard_session::SessionError) -> Error {
        use switchboard_session::SessionError as S;
        match e {
            S::Unknown => Error::UnknownSession,
            S::StoreDown => Error::SessionStoreDown,
            S::UnknownStream => Error::UnknownStream,
            S::Upstream { upstream, source } => Error::upstream(&upstream, source),
            S::UpstreamTimeout { upstream, after } => Error::UpstreamTimeout { upstream, after },
        }
    }
}

impl Error {
    /// Who caused it, the HTTP status the response carries, the JSON-RPC
    /// error code, and a short, bounded label for metrics: one table, every
    /// variant named (a new one must be placed here).
    ///
    /// Errors about the transport (body, headers, session) get a 4xx status;
    /// errors about a well-formed request (unknown tool, upstream down) are
    /// JSON-RPC errors in a 200 response, as MCP clients expect.
    fn class(&self) -> (Side, StatusCode, i64, &'static str) {
        use Side::{Downstream, Internal, Upstream};
        match self {
            Error::Parse(e) => (Downstream, StatusCode::BAD_REQUEST, e.code(), "parse"),
            Error::BodyTooLarge { .. } => {
                (Downstream, StatusCode::PAYLOAD_TOO_LARGE, code::INVALID_REQUEST, "too_large")
            }
            Error::UnsupportedMediaType(_) => {
                (Downstream, StatusCode::UNSUPPORTED_MEDIA_TYPE, code::INVALID_REQUEST, "media_type")
            }
            Error::ForbiddenOrigin(_) => (Downstream, StatusCode::FORBIDDEN, code::INVALID_REQUEST, "origin"),
            Error::MissingSession => (Downstream, StatusCode::BAD_REQUEST, code::INVALID_REQUEST, "missing_session"),
            Error::MissingHost => (Downstream, StatusCode::BAD_REQUEST, code::INVALID_REQUEST, "missing_host"),
            Error::MalformedHttp(e) => (
                Downstream,
                StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
                code::INVALID_REQUEST,
                e.label(),
            ),
            Error::UnknownSession => (Downstream, StatusCode::NOT_FOUND, code::REQUEST_TIMEOUT, "unknown_session"),
            Error::SessionStoreDown => {
                (Internal, StatusCode::SERVICE_UNAVAILABLE, code::INTERNAL_ERROR, "session_store_down")
            }
            // Not 404: that would tell the client its session is gone.
            Error::UnknownStream => (Downstream, StatusCode::BAD_REQUEST, code::INVALID_REQUEST, "unknown_stream"),
            Error::UnsupportedVersion(_) => {
                (Downstream, StatusCode::BAD_REQUEST, code::INVALID_REQUEST, "protocol_version")
            }
            Error::TooManySessions(_) => {
                (Internal, StatusCode::SERVICE_UNAVAILABLE, code::INTERNAL_ERROR, "too_many_sessions")
            }
            Error::SessionCap { .. } => (Downstream, StatusCode::TOO_MANY_REQUESTS, RATE_LIMITED, "too_many_sessions"),
            Error::MethodNotFound(_) => (Downstream, StatusCode::OK, code::METHOD_NOT_FOUND, "method_not_found"),
            Error::InvalidParams(_) | Error::InvalidArguments { .. } | Error::InvalidCursor(_) => {
                (Downstream, StatusCode::OK, code::INVALID_PARAMS, "invalid_params")
            }
            Error::ToolWithheld(_) => (Downstream, StatusCode::OK, code::INVALID_PARAMS, "tool_withheld"),
            Error::UnknownTool(_) | Error::UnknownPrompt(_) => {
                (Downstream, StatusCode::OK, code::INVALID_PARAMS, "unknown_target")
            }
            Error::UnknownResource(_) => (Downstream, StatusCode::OK, code::RESOURCE_NOT_FOUND, "unknown_target"),
            Error::UpstreamTimeout { .. } => (Upstream, StatusCode::OK, code::REQUEST_TIMEOUT, "upstream_timeout"),
            Error::Upstream { .. } => (Upstream, StatusCode::OK, code::INTERNAL_ERROR, "upstream_unavailable"),
            Error::CredentialRequired { .. } => (Downstream, StatusCode::OK, CREDENTIAL_REQUIRED, "credential_missing"),
            Error::AuthorizationRequired { elicitation: true, .. } => {
                (Downstream, StatusCode::OK, URL_ELICITATION_REQUIRED, "authorization_required")
            }
            Error::AuthorizationRequired { .. } => {
                (Downstream, StatusCode::OK, CREDENTIAL_REQUIRED, "authorization_required")
            }
            Error::ShuttingDown => (Internal, StatusCode::SERVICE_UNAVAILABLE, code::INTERNAL_ERROR, "shutting_down"),
            Error::Unauthenticated(AuthFailure::NotLoaded) => {
                (Internal, StatusCode::SERVICE_UNAVAILABLE, code::INTERNAL_ERROR, "keys_not_loaded")
            }
            Error::Unauthenticated(AuthFailure::Unverifiable) => {
                (Internal, StatusCode::SERVICE_UNAVAILABLE, code::INTERNAL_ERROR, "token_unverifiable")
            }
            Error::InsufficientScope(_) => {
                (Downstream, StatusCode::FORBIDDEN, INSUFFICIENT_SCOPE, "insufficient_scope")
            }
            Error::Unauthenticated(_) => (Downstream, StatusCode::UNAUTHORIZED, UNAUTHENTICATED, "unauthenticated"),
            Error::RateLimited { .. } | Error::TooManyInFlight(_) => {
                (Downstream, StatusCode::TOO_MANY_REQUESTS, RATE_LIMITED, "rate_limited")
            }
            Error::Internal(_) => (Internal, StatusCode::OK, code::INTERNAL_ERROR, "internal"),
            Error::HeaderMismatch(_) => {
                (Downstream, StatusCode::BAD_REQUEST, modern::HEADER_MISMATCH, "header_mismatch")
            }
            Error::InvalidMeta(_) | Error::InvalidRequestState(_) => {
                let status =
                    if matches!(self, Error::InvalidMeta(_)) { StatusCode::BAD_REQUEST } else { StatusCode::OK };
                (Downstream, status, code::INVALID_PARAMS, "invalid_params")
            }
            Error::UnsupportedModernVersion(_) => {
                (Downstream, StatusCode::BAD_REQUEST, modern::UNSUPPORTED_VERSION, "protocol_version")
            }
            Error::NoSuchMethod(_) => (Downstream, StatusCode::NOT_FOUND, code::METHOD_NOT_FOUND, "method_not_found"),
            Error::MissingCapability(_) => {
                (Downstream, StatusCode::BAD_REQUEST, modern::MISSING_CAPABILITY, "missing_capability")
            }
            Error::UnknownAnswer(_) => (Downstream, StatusCode::BAD_REQUEST, code::INVALID_REQUEST, "unknown_answer"),
            Error::AnswerNotDelivered { .. } => {
                (Upstream, StatusCode::BAD_GATEWAY, code::INTERNAL_ERROR, "answer_not_delivered")
            }
        }
    }

    /// Which side caused it.
    pub fn side(&self) -> Side {
        self.class().0
    }

    /// The HTTP status the response carries.
    pub fn status(&self) -> StatusCode {
        self.class().1
    }

    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        self.class().2
    }

    /// A short, bounded label for metrics.
    pub fn label(&self) -> &'static str {
        self.class().3
    }

    /// Whether the same request may succeed if sent again later (the
    /// answer's `Retry-After`, where there is one, says when).
    pub fn retryable(&self) -> bool {
        match self.side() {
            Side::Upstream => true,
            Side::Internal => !matches!(self, Error::Internal(_)),
            Side::Downstream => {
                matches!(self, Error::RateLimited { .. } | Error::TooManyInFlight(_) | Error::SessionCap { .. })
            }
        }
    }

    /// When to try again, for the answers that say so (`Retry-After` on 429
    /// and 503).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RateLimited { retry_after, .. } => Some(*retry_after),
            Error::TooManyInFlight(_)
            | Error::TooManySessions(_)
            | Error::SessionCap { .. }
            | Error::SessionStoreDown
            | Error::ShuttingDown
            | Error::Unauthenticated(AuthFailure::NotLoaded) => Some(Duration::from_secs(1)),
            Error::Unauthenticated(AuthFailure::Unverifiable) => Some(Duration::from_secs(5)),
            _ => None,
        }
    }

    /// How the request ended, for metrics and audit records, when this
    /// error ends it.
    pub fn outcome(&self) -> switchboard_core::Outcome {
        use switchboard_core::Outcome;
        match self {
            Error::UpstreamTimeout { .. } => Outcome::Timeout,
            _ if self.side() == Side::Upstream => Outcome::UpstreamFailed,
            _ => Outcome::Rejected,
        }
    }

    /// Structured detail for the JSON-RPC `data` member.
    pub fn data(&self) -> Option<serde_json::Value> {
        match self {
            Error::UpstreamTimeout { upstream, .. }
            | Error::Upstream { upstream, .. }
            | Error::CredentialRequired { upstream, .. }
            | Error::AnswerNotDelivered { upstream, .. } => Some(serde_json::json!({ "upstream": &**upstream })),
            Error::AuthorizationRequired { upstream, url, elicitation: true } => Some(serde_json::json!({
                "elicitations": [{
                    "mode": "url",
                    "elicitationId": format!("{:016x}", switchboard_core::hash::fnv1a64(url.as_bytes())),
                    "url": url,
                    "message": format!("Authorize Switchboard to reach {upstream} for you"),
                }],
                "upstream": &**upstream,
            })),
            Error::AuthorizationRequired { upstream, url, .. } => {
                Some(serde_json::json!({ "upstream": &**upstream, "url": url }))
            }
            Error::UnknownTool(name) => Some(serde_json::json!({ "tool": name })),
            Error::ToolWithheld(name) => Some(serde_json::json!({ "tool": name, "withheld": true })),
            Error::InvalidArguments { tool, invalid } => {
                Some(serde_json::json!({ "tool": tool, "path": invalid.path, "problem": invalid.message }))
            }
            Error::RateLimited { limit, retry_after } => {
                Some(serde_json::json!({ "limit": limit, "retryAfterMs": retry_after.as_millis() as u64 }))
            }
            Error::TooManyInFlight(max) => Some(serde_json::json!({ "limit": "concurrent", "max": max })),
            Error::SessionCap { limit, max } => Some(serde_json::json!({ "limit": limit, "max": max })),
            Error::TooManySessions(max) => Some(serde_json::json!({ "limit": "max_sessions", "max": max })),
            Error::UnsupportedModernVersion(requested) => Some(serde_json::json!({
                "supported": switchboard_protocol::version::supported(),
                "requested": requested,
            })),
            Error::MissingCapability(capability) => {
                Some(serde_json::json!({ "requiredCapabilities": { *capability: {} } }))
            }
            _ => None,
        }
    }

    /// Wraps an upstream failure with the upstream's name.
    pub fn upstream(upstream: &Arc<str>, source: UpstreamError) -> Self {
        match source {
            UpstreamError::Timeout(after) => Error::UpstreamTimeout { upstream: upstream.clone(), after },
            UpstreamError::Credential(message) => Error::CredentialRequired { upstream: upstream.clone(), message },
            source => Error::Upstream { upstream: upstream.clone(), source },
        }
    }
}

/// A device call's failure, named as an upstream's would be (`edge:<device>`).
impl From<switchboard_devices::CallError> for Error {
    fn from(e: switchboard_devices::CallError) -> Error {
        use switchboard_devices::{CallError, Unavailable};
        let upstream = |device: &str| -> Arc<str> { Arc::from(format!("edge:{device}")) };
        match e {
            CallError::InvalidArguments { tool, invalid } => Error::InvalidArguments { tool, invalid },
            e @ CallError::TooLarge { .. } => Error::InvalidParams(e.to_string()),
            CallError::Timeout { device, after } => Error::UpstreamTimeout { upstream: upstream(&device), after },
            CallError::Unavailable { device, why } => {
                let source = match why {
                    Unavailable::Closed => UpstreamError::Closed,
                    why => UpstreamError::Down(why.to_string()),
                };
                Error::Upstream { upstream: upstream(&device), source }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_get_4xx_and_request_errors_200() {
        assert_eq!(Error::BodyTooLarge { limit: 1 }.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(Error::UnknownSession.status(), StatusCode::NOT_FOUND);
        assert_eq!(Error::Parse(ParseError::Syntax("x".into())).code(), code::PARSE_ERROR);
        assert_eq!(Error::Parse(ParseError::Batch).status(), StatusCode::BAD_REQUEST);
        let unknown = Error::UnknownTool("a__b".into());
        assert_eq!((unknown.status(), unknown.code()), (StatusCode::OK, code::INVALID_PARAMS));
        assert!(unknown.to_string().contains("a__b"));
        let down = Error::upstream(&Arc::from("db"), UpstreamError::Connect("refused".into()));
        assert_eq!(down.side(), Side::Upstream);
        assert!(down.to_string().contains("\"db\""));
        let slow = Error::upstream(&Arc::from("db"), UpstreamError::Timeout(Duration::from_secs(1)));
        assert!(matches!(slow, Error::UpstreamTimeout { .. }));
    }
}
