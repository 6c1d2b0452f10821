//! MCP 2026-07-28, the stateless era: what each request carries instead of a
//! session (`params._meta`), the `_meta` keys, and the era's error codes.
//!
//! A modern request names its protocol version and the client's
//! capabilities in `params._meta`, and the HTTP headers `MCP-Protocol-Version`,
//! `Mcp-Method` and `Mcp-Name` repeat what the body says so that a proxy can
//! route on headers alone.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::jsonrpc::ParseError;

/// `_meta` key: the protocol version of this request.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities, for this request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the client's implementation (optional).
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key: the lowest log level the client wants as `notifications/message`.
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key of a result: the server's implementation.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key of `subscriptions/listen` notifications: the listen request's id.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The era's JSON-RPC error codes.
pub mod code {
    /// An HTTP header disagrees with the body, or a required one is missing.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// The request needs a client capability the client did not declare.
    pub const MISSING_CAPABILITY: i64 = -32021;
    /// The protocol version is not one the server speaks.
    pub const UNSUPPORTED_VERSION: i64 = -32022;
}

/// The members of a request's `params._meta` the era defines, raw.
#[derive(Debug, Default, Deserialize)]
pub struct RequestMeta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    pub protocol_version: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    pub client_capabilities: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/logLevel")]
    pub log_level: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "progressToken")]
    pub progress_token: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ParamsMeta<'a> {
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

/// `params._meta` of a request, if it has one (other members of `params`
/// are skipped undecoded). An `_meta` that is not an object is an error.
pub fn request_meta(params: Option<&RawValue>) -> Result<Option<RequestMeta<'_>>, ParseError> {
    let Some(params) = params else { return Ok(None) };
    let wire: ParamsMeta<'_> =
        serde_json::from_str(params.get()).map_err(|e| ParseError::Invalid(Cow::Owned(format!("params: {e}"))))?;
    let Some(meta) = wire.meta else { return Ok(None) };
    if !meta.get().starts_with('{') {
        return Err(ParseError::Invalid(Cow::Borrowed("params._meta must be an object")));
    }
    serde_json::from_str(meta.get())
        .map(Some)
        .map_err(|e| ParseError::Invalid(Cow::Owned(format!("params._meta: {e}"))))
}

/// A header value as text: trimmed, and decoded if it is in the
/// `=?base64?…?=` form the era uses for values that are not plain ASCII
/// (`Mcp-Name`, `Mcp-Param-*`). `None` if that form does not decode to UTF-8.
pub fn header_text(raw: &[u8]) -> Option<String> {
    use base64::Engine;
    let text = std::str::from_utf8(raw).ok()?.trim();
    if let Some(inner) = text.strip_prefix("=?base64?").and_then(|t| t.strip_suffix("?=")) {
        let bytes = base64::engine::general_purpose::STANDARD.decode(inner).ok()?;
        return String::from_utf8(bytes).ok();
    }
    Some(text.to_owned())
}

/// The header value for `text`: as it is if it is visible ASCII without
/// surrounding spaces, else in the `=?base64?…?=` form.
pub fn header_value_text(text: &str) -> String {
    use base64::Engine;
    let plain = !text.is_empty() && text.bytes().all(|b| (0x20..0x7f).contains(&b)) && text.trim() == text;
    if plain {
        return text.to_owned();
    }
    format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(text))
}

/// The log levels, least severe first (RFC 5424 order).
pub const LOG_LEVELS: [&str; 8] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// The rank of a log level (`None` if unknown).
pub fn log_rank(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn reads_the_meta_members_and_skips_the_rest() {
        let params = raw(
            r#"{"name":"x","arguments":{"_meta":1},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"progressToken":7,"other":true}}"#,
        );
        let meta = request_meta(Some(&params)).unwrap().unwrap();
        assert_eq!(meta.protocol_version.as_deref(), Some("2026-07-28"));
        assert_eq!(meta.client_capabilities.unwrap().get(), r#"{"sampling":{}}"#);
        assert_eq!(meta.progress_token.unwrap().get(), "7");
        assert!(meta.log_level.is_none());
        assert!(request_meta(Some(&raw(r#"{"name":"x"}"#))).unwrap().is_none());
        assert!(request_meta(None).unwrap().is_none());
        assert!(request_meta(Some(&raw(r#"{"_meta":[1]}"#))).is_err());
        assert_eq!(log_rank("warning"), Some(3));
        assert_eq!(log_rank("loud"), None);
    }

    #[test]
    fn header_values_round_trip() {
        assert_eq!(header_value_text("plain_tool"), "plain_tool");
        assert_eq!(header_value_text("café"), "=?base64?Y2Fmw6k=?=");
        assert_eq!(header_text(b" =?base64?Y2Fmw6k=?= ").as_deref(), Some("café"));
        assert_eq!(header_text(b" tools/call ").as_deref(), Some("tools/call"));
        assert_eq!(header_text(b"=?base64?//8=?="), None, "not UTF-8");
        assert_eq!(header_value_text(" padded"), "=?base64?IHBhZGRlZA==?=");
    }
}
