//! Credentials towards upstreams: headers that stand in for an upstream's
//! own configured ones, for one tenant or one user.
//!
//! The vault (`switchboard-vault`) keeps them; an upstream channel asks its
//! [`Credentials`] before every request which to send, since an operator
//! may change or remove one while the channel is open. A [`Keychain`] hands
//! a session the [`Credentials`] of its caller for one upstream.
//!
//! A credential's values never appear in `Debug` output, logs or errors:
//! only its [`label`](Credential::label), which names whose it is.

use std::sync::Arc;

use http::{HeaderName, HeaderValue};

/// Headers the router sets itself on requests to upstreams: neither an
/// upstream's `headers` nor a credential may carry them.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "last-event-id",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "proxy-connection",
];

/// A header an upstream may be sent as a credential: a valid name that the
/// router does not set itself, and a valid value (no CR, LF or NUL); the
/// value marked sensitive.
pub fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
    if RESERVED_HEADERS.contains(&name.as_str()) {
        return Err(format!("{name} is set by the router and cannot be configured"));
    }
    let value = value.trim();
    // Visible ASCII and spaces only: what every server reads the same way.
    if !value.bytes().all(|b| b == b' ' || b == b'\t' || (0x21..0x7f).contains(&b)) {
        return Err(format!("the value of {name} is not a valid header value (visible ASCII only)"));
    }
    let mut value =
        HeaderValue::from_str(value).map_err(|_| format!("the value of {name} is not a valid header value"))?;
    value.set_sensitive(true);
    Ok((name, value))
}

/// Headers sent to an upstream in place of its own configured ones.
pub struct Credential {
    label: Arc<str>,
    headers: Vec<(HeaderName, HeaderValue)>,
    raw: Vec<u8>,
}

impl Credential {
    /// A credential of `headers` (each value marked sensitive), named
    /// `label` in logs (`tenant/user/upstream`, never a value).
    pub fn new(label: impl Into<Arc<str>>, headers: Vec<(HeaderName, HeaderValue)>) -> Credential {
        let headers: Vec<_> = headers
            .into_iter()
            .map(|(name, mut value)| {
                value.set_sensitive(true);
                (name, value)
            })
            .collect();
        let mut raw = Vec::new();
        for (name, value) in &headers {
            raw.extend_from_slice(b"\r\n");
            raw.extend_from_slice(name.as_str().as_bytes());
            raw.extend_from_slice(b": ");
            raw.extend_from_slice(value.as_bytes());
        }
        Credential { label: label.into(), headers, raw }
    }

    /// Whose it is, for logs: never its values.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The headers.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The headers as raw `\r\nName: value` lines (an HTTP/1.1 request's).
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Credential").field("label", &self.label).field("headers", &names).finish_non_exhaustive()
    }
}

/// Why no credential may be sent: one is required and there is none. The
/// words say whose is missing and how to add one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Missing(pub String);

/// What a channel to one upstream, for one caller, sends.
pub trait Credentials: Send + Sync {
    /// Asked before every request: `Ok(Some)`, these headers instead of
    /// the upstream's own; `Ok(None)`, the upstream's own; `Err`, the
    /// upstream needs a credential this caller does not have.
    fn current(&self) -> Result<Option<Arc<Credential>>, Missing>;
}

/// Hands out the [`Credentials`] of a caller for an upstream.
pub trait Keychain: Send + Sync {
    /// The credentials of `user` of `tenant` (`None`: the tenant itself,
    /// as an API key calls) for upstream `upstream`, looked up anew as the
    /// vault changes. `required`: the upstream is not called with its own
    /// headers for lack of one.
    fn credentials(&self, tenant: &str, user: Option<&str>, upstream: &str, required: bool) -> Arc<dyn Credentials>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_the_router_sets_cannot_be_credentials() {
        assert!(header("Authorization", "Bearer x").is_ok());
        assert!(header("X-Api-Key", " k ").is_ok_and(|(_, v)| v.as_bytes() == b"k"));
        for name in ["Host", "content-length", "Mcp-Session-Id", "Transfer-Encoding", "Mcp-Method"] {
            assert!(header(name, "x").unwrap_err().contains("set by the router"), "{name}");
        }
        assert!(header("Bad Name", "x").is_err());
        assert!(header("X-A", "a\r\nInjected: yes").is_err());
        assert!(header("Authorization", "Bearer tökén").is_err());
    }

    #[test]
    fn a_credential_never_shows_its_values() {
        let c = Credential::new(
            "acme/alice/github",
            vec![(http::header::AUTHORIZATION, HeaderValue::from_static("Bearer s3cret-token"))],
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("authorization") && shown.contains("acme/alice/github"), "{shown}");
        assert_eq!(c.raw(), b"\r\nauthorization: Bearer s3cret-token");
        assert!(c.headers()[0].1.is_sensitive());
    }
}
