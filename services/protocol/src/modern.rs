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
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion", deserialize_with = "text")]
    pub protocol_version: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    pub client_capabilities: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/logLevel", deserialize_with = "text")]
    pub log_level: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "progressToken")]
    pub progress_token: Option<&'a RawValue>,
}

/// A string member, borrowed unless it has escapes (serde borrows a `Cow`
/// only when it is not in an `Option`: the version was copied for every
/// stateless request); `null` is absent.
fn text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct Text<'de>(Cow<'de, str>);
    impl<'de> Deserialize<'de> for Text<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Text<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a string")
                }
                fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                    Ok(Text(Cow::Borrowed(v)))
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                    Ok(Text(Cow::Owned(v.to_owned())))
                }
            }
            d.deserialize_str(Visit)
        }
    }
    Ok(Option::<Text<'de>>::deserialize(d)?.map(|t| t.0))
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
    meta_members(wire.meta)
}

/// [`request_meta`] from `params._meta` itself, raw, as a read of `params`
/// already found it ([`Target::meta`](crate::jsonrpc::Target::meta)):
/// `params` are not read again.
pub fn meta_members(meta: Option<&RawValue>) -> Result<Option<RequestMeta<'_>>, ParseError> {
    let Some(meta) = meta else { return Ok(None) };
    if !meta.get().starts_with('{') {
        return Err(ParseError::Invalid(Cow::Borrowed("params._meta must be an object")));
    }
    serde_json::from_str(meta.get())
        .map(Some)
        .map_err(|e| ParseError::Invalid(Cow::Owned(format!("params._meta: {e}"))))
}

/// [`meta_members`] from what a read of `params` found of `_meta`
/// ([`Target`](crate::jsonrpc::Target)): nothing read again. The request's
/// quick read ([`scan::request`](crate::scan::request)) finds the era's
/// members in the same pass as the routing ones; through serde_json,
/// `_meta` read a second time cost a stateless `tools/call` about 1,100
/// instructions (callgrind).
pub fn target_meta<'a>(target: &crate::jsonrpc::Target<'a>) -> Result<Option<RequestMeta<'a>>, ParseError> {
    let Some(meta) = target.meta else { return Ok(None) };
    if !meta.get().starts_with('{') {
        return Err(ParseError::Invalid(Cow::Borrowed("params._meta must be an object")));
    }
    let text = |raw: Option<&'a RawValue>, key: &str| match raw {
        None => Ok(None),
        Some(raw) => crate::jsonrpc::as_str(raw)
            .map(Some)
            .ok_or_else(|| ParseError::Invalid(Cow::Owned(format!("params._meta[\"{key}\"]: expected a string")))),
    };
    Ok(Some(RequestMeta {
        protocol_version: text(target.protocol_version, META_PROTOCOL_VERSION)?,
        client_capabilities: target.client_capabilities,
        log_level: text(target.log_level, META_LOG_LEVEL)?,
        progress_token: target.progress_token,
    }))
}

/// The prefix of the `_meta` keys the era reserves (`io.modelcontextprotocol/…`).
pub const RESERVED_META_PREFIX: &str = "io.modelcontextprotocol/";

/// `message` (a request) without the era's reserved keys in its
/// `params._meta`, for a session-era peer, which refuses them (or may):
/// `None` if it has none. The other `_meta` members (`progressToken`,
/// anything else) stay, in their order, as the bytes they were; nothing
/// outside `_meta` is touched.
pub fn without_era_meta(message: &[u8]) -> Option<bytes::Bytes> {
    let env = crate::jsonrpc::Envelope::parse(message).ok()?;
    let wire: ParamsMeta<'_> = serde_json::from_str(env.params?.get()).ok()?;
    let meta = wire.meta?;
    let members: MetaMembers<'_> = serde_json::from_str(meta.get()).ok()?;
    if !members.0.iter().any(|(k, _)| k.starts_with(RESERVED_META_PREFIX)) {
        return None;
    }
    let mut kept = Vec::with_capacity(meta.get().len());
    kept.push(b'{');
    for (key, value) in members.0.iter().filter(|(k, _)| !k.starts_with(RESERVED_META_PREFIX)) {
        if kept.len() > 1 {
            kept.push(b',');
        }
        kept.extend_from_slice(&crate::jsonrpc::json_string(key));
        kept.push(b':');
        kept.extend_from_slice(value.get().as_bytes());
    }
    kept.push(b'}');
    let at = crate::jsonrpc::span(message, meta.get());
    Some(crate::rewrite::splice(message, &mut [crate::rewrite::Edit::new(at, &kept)]))
}

/// An object's members in order, values raw.
struct MetaMembers<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for MetaMembers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = MetaMembers<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    out.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(MetaMembers(out))
            }
        }
        d.deserialize_map(Members)
    }
}

/// A header value as text: trimmed, and decoded if it is in the
/// `=?base64?…?=` form the era uses for values that are not plain ASCII
/// (`Mcp-Name`, `Mcp-Param-*`). `None` if that form does not decode to UTF-8.
/// Borrowed unless decoded (a stateless request's three headers checked
/// without an allocation). ASCII, as nearly every value is, is its own
/// text with no UTF-8 decode (about 110 instructions a header less).
pub fn header_text(raw: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    use base64::Engine;
    let text = trim(crate::ascii(raw).or_else(|| std::str::from_utf8(raw).ok())?);
    if let Some(inner) = text.strip_prefix("=?base64?").and_then(|t| t.strip_suffix("?=")) {
        let bytes = base64::engine::general_purpose::STANDARD.decode(inner).ok()?;
        return String::from_utf8(bytes).ok().map(std::borrow::Cow::Owned);
    }
    Some(std::borrow::Cow::Borrowed(text))
}

/// `text.trim()`, without decoding characters at either end when they are
/// visible ASCII (a header value's, nearly always): white space trimmed as
/// bytes first, and the Unicode trim only if that leaves anything else at
/// an end (another character, or the vertical tab `trim_ascii` keeps).
pub fn trim(text: &str) -> &str {
    let ascii = text.trim_ascii();
    match (ascii.as_bytes().first(), ascii.as_bytes().last()) {
        (Some(a), Some(b)) if a.is_ascii_graphic() && b.is_ascii_graphic() => ascii,
        (None, None) => ascii,
        _ => ascii.trim(),
    }
}

/// The header value for `text`: as it is if it is visible ASCII without
/// surrounding spaces (borrowed then), else in the `=?base64?…?=` form.
pub fn header_value_text(text: &str) -> Cow<'_, str> {
    use base64::Engine;
    // Visible ASCII and spaces: a space is the only white space to trim.
    let plain = !text.is_empty()
        && text.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !text.starts_with(' ')
        && !text.ends_with(' ');
    if plain {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(text)))
}

/// The `Mcp-Param-*` headers a `tools/call` of `tool` (its definition, as
/// `tools/list` gives it) carries: one for each argument its input schema
/// marks with `x-mcp-header`, whose value is a string, number or boolean.
/// Returns (header name, in lower case; value, in the era's header form).
pub fn mirrored_params(tool: &serde_json::Value, arguments: Option<&serde_json::Value>) -> Vec<(String, String)> {
    use serde_json::Value;
    let Some(properties) = tool.pointer("/inputSchema/properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut headers = Vec::new();
    for (argument, schema) in properties {
        let Some(suffix) = schema.get("x-mcp-header").and_then(Value::as_str) else { continue };
        let text = match arguments.and_then(|a| a.get(argument)) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            _ => continue,
        };
        headers.push((format!("mcp-param-{}", suffix.to_ascii_lowercase()), header_value_text(&text).into_owned()));
    }
    headers
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
    fn the_meta_strings_are_borrowed_unless_escaped_and_null_is_absent() {
        let meta = raw(
            r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/logLevel":"in\u0066o"}"#,
        );
        let read = meta_members(Some(&meta)).unwrap().unwrap();
        assert!(matches!(read.protocol_version, Some(Cow::Borrowed("2026-07-28"))), "{read:?}");
        assert!(matches!(read.log_level.as_ref(), Some(Cow::Owned(level)) if level == "info"), "{read:?}");
        let null = raw(r#"{"io.modelcontextprotocol/protocolVersion":null,"io.modelcontextprotocol/logLevel":null}"#);
        let read = meta_members(Some(&null)).unwrap().unwrap();
        assert!(read.protocol_version.is_none() && read.log_level.is_none(), "{read:?}");
        for wrong in [r#"{"io.modelcontextprotocol/protocolVersion":1}"#, r#"{"io.modelcontextprotocol/logLevel":{}}"#]
        {
            let e = meta_members(Some(&raw(wrong))).unwrap_err().to_string();
            assert!(e.contains("expected a string"), "{wrong}: {e}");
        }
    }

    /// The era's members as the envelope's read of `params` found them (its
    /// quick read, and serde_json's), read into a `RequestMeta`, are those
    /// `meta_members` reads from `_meta` alone: the same values, the same
    /// refusals.
    #[test]
    fn the_era_members_found_with_the_target_read_as_meta_members_reads_them() {
        use crate::jsonrpc::{Envelope, Target};
        let cases = [
            r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}"#,
            r#"{"progressToken":7,"io.modelcontextprotocol/logLevel":"in\u0066o","other":[1,{"a":null}]}"#,
            r#"{"io.modelcontextprotocol/protocolVersion":null,"io.modelcontextprotocol/clientCapabilities":null}"#,
            r#"{"io.modelcontextprotocol/protocolVersion":"2026-\u00307-28","io.modelcontextprotocol/logLevel":null}"#,
            r#"{"io.modelcontextprotocol/protocolVersion":1}"#,
            r#"{"io.modelcontextprotocol/logLevel":{"a":1}}"#,
            r#"{"io.modelcontextprotocol/clientCapabilities":"none"}"#,
            r#"{}"#,
        ];
        for meta in cases {
            let request =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","_meta":{meta}}}}}"#);
            let env = Envelope::parse(request.as_bytes()).unwrap();
            let quick = target_meta(env.target().unwrap().unwrap());
            let target = Target::parse(env.params.unwrap()).unwrap();
            let serde = target_meta(&target);
            let meta_raw = raw(meta);
            let alone = meta_members(Some(&meta_raw));
            let show = |r: &Result<Option<RequestMeta<'_>>, ParseError>| match r {
                Ok(m) => format!("{m:?}"),
                Err(_) => "refused".to_owned(),
            };
            assert_eq!(show(&quick), show(&alone), "{meta}");
            assert_eq!(show(&serde), show(&alone), "{meta}");
            if let Err(e) = &quick {
                assert!(e.to_string().contains("expected a string"), "{meta}: {e}");
            }
        }
        // A member named twice is refused whichever way `params` was read.
        let twice = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"a","io.modelcontextprotocol/protocolVersion":"b"}}}"#;
        let env = Envelope::parse(twice.as_bytes()).unwrap();
        assert!(env.target().unwrap().is_err(), "the version named twice");
    }

    #[test]
    fn era_meta_is_taken_out_for_session_peers_and_nothing_else() {
        let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"_meta":{"io.modelcontextprotocol/x":1}},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":"p 1","io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"trace":{"a":[1,2]}}}}"#;
        let out = without_era_meta(call).expect("reserved keys to take out");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"_meta":{"io.modelcontextprotocol/x":1}},"_meta":{"progressToken":"p 1","trace":{"a":[1,2]}}}}"#,
            "arguments untouched; the other _meta members kept in order"
        );
        let only = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(
            &without_era_meta(only).unwrap()[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{}}}"#
        );
        // Escaped keys are read as keys, and written back escaped.
        let escaped = br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"io.modelcontextprotocol\/logLevel":"info","k\"q":2}}}"#;
        assert_eq!(
            &without_era_meta(escaped).unwrap()[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"k\"q":2}}}"#
        );
        assert!(without_era_meta(br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"progressToken":1}}}"#)
            .is_none());
        assert!(without_era_meta(br#"{"jsonrpc":"2.0","id":1,"method":"m"}"#).is_none());
    }

    #[test]
    fn trim_is_strs_trim() {
        let edges =
            ["", " ", "\t", "\u{b}", "\u{c}", "\r\n", "\u{a0}", "\u{2003}", "\u{3000}", " \u{85}", "x", "é", "\u{b} y"];
        for left in edges {
            for inner in ["", "a", "tools/call", "a b", "\u{a0}", "é"] {
                for right in edges {
                    let text = format!("{left}{inner}{right}");
                    assert_eq!(trim(&text), text.trim(), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn header_values_round_trip() {
        assert_eq!(header_value_text("plain_tool"), "plain_tool");
        assert_eq!(header_value_text("café"), "=?base64?Y2Fmw6k=?=");
        assert_eq!(header_text(b" =?base64?Y2Fmw6k=?= ").as_deref(), Some("café"));
        assert_eq!(header_text(b" tools/call ").as_deref(), Some("tools/call"));
        assert_eq!(header_text(b"=?base64?//8=?="), None, "not UTF-8");
        // A value's own bytes beyond ASCII (obs-text): read as UTF-8, or not at all.
        assert_eq!(header_text(" café ".as_bytes()).as_deref(), Some("café"));
        assert_eq!(header_text(b"caf\xe9"), None, "not UTF-8");
        assert_eq!(header_value_text(" padded"), "=?base64?IHBhZGRlZA==?=");
        // Spaces at either end are encoded (a header's are trimmed); within, kept.
        for text in ["padded ", " ", "a b", "tab\there"] {
            let value = header_value_text(text);
            assert_eq!(header_text(value.as_bytes()).as_deref(), Some(text), "{value}");
        }
        assert_eq!(header_value_text("a b"), "a b");
    }
}
