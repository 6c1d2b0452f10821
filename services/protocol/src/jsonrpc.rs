//! The JSON-RPC 2.0 envelope, read without decoding what it carries.
//!
//! [`Envelope::parse`] looks at the top-level members of one message
//! (`jsonrpc`, `id`, `method`, `params`, `result`, `error`) and keeps the
//! values as borrowed [`RawValue`]s pointing into the received bytes. The
//! payload inside `params` or `result` is scanned for well-formedness but
//! never turned into a tree. [`Target::parse`] does the same one level
//! down, for the few `params` members a router routes on. A plain request
//! is read by one pass of [`crate::scan::request`], its target with it;
//! anything that pass is unsure of, by serde_json.
//!
//! This module must never copy payload bytes: everything it returns borrows
//! from the input.

use std::borrow::Cow;
use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// Standard JSON-RPC and MCP error codes.
pub mod code {
    /// The body is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The body is JSON but not a valid JSON-RPC message.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The method exists but its params are wrong (also: unknown tool).
    pub const INVALID_PARAMS: i64 = -32602;
    /// Something failed inside the router or behind it.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Connection to the peer was lost (the TypeScript SDK's `ConnectionClosed`).
    pub const CONNECTION_CLOSED: i64 = -32000;
    /// The request took too long (the TypeScript SDK's `RequestTimeout`);
    /// also used for an unknown session, as the SDK servers do.
    pub const REQUEST_TIMEOUT: i64 = -32001;
    /// MCP: the resource does not exist (2025 revisions).
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

pub use crate::kind::MessageKind;

/// Why a body is not a usable JSON-RPC message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all (JSON-RPC `-32700`).
    #[error("malformed JSON: {0}")]
    Syntax(String),
    /// A JSON array: a batch, which MCP removed in 2025-06-18.
    #[error("JSON-RPC batches are not supported: send one message per request")]
    Batch,
    /// JSON, but not a JSON-RPC 2.0 message (JSON-RPC `-32600`).
    #[error("invalid JSON-RPC message: {0}")]
    Invalid(Cow<'static, str>),
}

impl ParseError {
    /// The JSON-RPC error code this failure is reported with.
    pub fn code(&self) -> i64 {
        match self {
            ParseError::Syntax(_) => code::PARSE_ERROR,
            ParseError::Batch | ParseError::Invalid(_) => code::INVALID_REQUEST,
        }
    }

    fn from_serde(err: serde_json::Error) -> Self {
        use serde_json::error::Category;
        match err.classify() {
            Category::Syntax | Category::Eof | Category::Io => ParseError::Syntax(err.to_string()),
            Category::Data => ParseError::Invalid(Cow::Owned(err.to_string())),
        }
    }
}

/// The members of a message that matter for routing, borrowed from the input.
#[derive(Debug, Clone)]
pub struct Envelope<'a> {
    /// Request, notification or response.
    pub kind: MessageKind,
    /// The id exactly as it was written (a string or a number), if any.
    pub id: Option<&'a RawValue>,
    /// The method name, for requests and notifications.
    pub method: Option<Cow<'a, str>>,
    /// The params, undecoded.
    pub params: Option<&'a RawValue>,
    /// The result of a response, undecoded.
    pub result: Option<&'a RawValue>,
    /// The error of an error response, undecoded.
    pub error: Option<&'a RawValue>,
    /// `params`' routing members ([`Envelope::target`]).
    target: TargetSlot<'a>,
}

/// Where an envelope keeps its target: read with it (by the quick read of
/// a request), or read on first use. (Not a `OnceLock` set at once: setting
/// one takes its `Once`, about 235 instructions.)
#[derive(Debug, Clone)]
enum TargetSlot<'a> {
    Read(Target<'a>),
    Later(std::sync::OnceLock<Result<Target<'a>, ParseError>>),
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// Deserializes a member that is present (even as `null`) into `Some`, so
/// that `"id": null` and a missing `id` stay distinguishable.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl<'a> Envelope<'a> {
    /// Parses one JSON-RPC message from `input`.
    ///
    /// Arrays are refused with [`ParseError::Batch`]; anything that is valid
    /// JSON but not a JSON-RPC 2.0 request, notification or response is
    /// [`ParseError::Invalid`].
    pub fn parse(input: &'a [u8]) -> Result<Self, ParseError> {
        Self::parse_as(input, true)
    }

    /// [`Envelope::parse`] without the quick read of requests
    /// ([`scan::request`](crate::scan::request)): serde_json decides
    /// everything. For the tests that hold the two to the same answers.
    #[doc(hidden)]
    pub fn parse_by_serde(input: &'a [u8]) -> Result<Self, ParseError> {
        Self::parse_as(input, false)
    }

    fn parse_as(input: &'a [u8], quick: bool) -> Result<Self, ParseError> {
        match input.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => {}
            Some(b'[') => {
                // Only call it a batch if it is well-formed JSON.
                return match serde_json::from_slice::<serde::de::IgnoredAny>(input) {
                    Ok(_) => Err(ParseError::Batch),
                    Err(e) => Err(ParseError::from_serde(e)),
                };
            }
            None => return Err(ParseError::Syntax("empty body".into())),
            Some(_) => {
                return match serde_json::from_slice::<serde::de::IgnoredAny>(input) {
                    Ok(_) => Err(ParseError::Invalid("a message must be a JSON object".into())),
                    Err(e) => Err(ParseError::from_serde(e)),
                };
            }
        }
        // Valid UTF-8 (nearly every message) is checked once here, as a
        // whole, and parsed as text: parsed as bytes, each raw member would
        // be checked again as it is borrowed (seven checks per forwarded
        // call, request and answer). Anything else is parsed as bytes, for
        // serde_json's own error at the bad byte (or none, when the bad
        // bytes are in a member skipped unread): the same outcome either way.
        let text = std::str::from_utf8(input);
        if let (true, Ok(text)) = (quick, text) {
            // A request read in one pass, its target with it; anything
            // the pass is unsure of is serde_json's to decide.
            if let Some(spans) = crate::scan::request(text.as_bytes()) {
                return Ok(Envelope::of_request(text, spans));
            }
        }
        let wire: Result<Wire<'a>, _> = match text {
            Ok(text) => serde_json::from_str(text),
            Err(_) => serde_json::from_slice(input),
        };
        let wire = wire.map_err(ParseError::from_serde)?;
        match wire.jsonrpc {
            Some(v) if v.get() == "\"2.0\"" => {}
            Some(_) => return Err(ParseError::Invalid("\"jsonrpc\" must be \"2.0\"".into())),
            None => return Err(ParseError::Invalid("missing \"jsonrpc\": \"2.0\"".into())),
        }
        // Read as a raw value and borrowed unless escaped: serde would copy an
        // `Option<Cow<str>>` every time.
        let method = match wire.method {
            Some(raw) => Some(as_str(raw).ok_or(ParseError::Invalid("\"method\" must be a string".into()))?),
            None => None,
        };
        let kind = match (&method, wire.id, wire.result, wire.error) {
            (Some(_), Some(_), None, None) => MessageKind::Request,
            (Some(_), None, None, None) => MessageKind::Notification,
            (None, Some(_), Some(_), None) => MessageKind::Response,
            (None, Some(_), None, Some(_)) => MessageKind::Error,
            (None, None, _, Some(_)) => {
                // An error response to a message whose id could not be read.
                return Err(ParseError::Invalid("an error response needs the id of the request it answers".into()));
            }
            (Some(_), _, _, _) => {
                return Err(ParseError::Invalid("a request must not carry \"result\" or \"error\"".into()))
            }
            (None, Some(_), Some(_), Some(_)) => {
                return Err(ParseError::Invalid("a response carries \"result\" or \"error\", not both".into()))
            }
            (None, _, _, _) => {
                return Err(ParseError::Invalid(
                    "neither a request (\"method\") nor a response (\"result\"/\"error\")".into(),
                ))
            }
        };
        if let Some(id) = wire.id {
            let first = id.get().as_bytes()[0];
            let null_error = kind == MessageKind::Error && id.get() == "null";
            if !(first == b'"' || first == b'-' || first.is_ascii_digit() || null_error) {
                return Err(ParseError::Invalid("\"id\" must be a string or a number".into()));
            }
        }
        if let Some(params) = wire.params {
            let first = params.get().as_bytes()[0];
            if first != b'{' && first != b'[' {
                return Err(ParseError::Invalid("\"params\" must be an object".into()));
            }
        }
        Ok(Envelope {
            kind,
            id: wire.id,
            method,
            params: wire.params,
            result: wire.result,
            error: wire.error,
            target: TargetSlot::Later(std::sync::OnceLock::new()),
        })
    }

    /// The routing members of `params` ([`Target::parse`]), read once
    /// however many phases ask (limits, audit, resolution); `None` without
    /// `params`.
    pub fn target(&self) -> Option<Result<&Target<'a>, &ParseError>> {
        let params = self.params?;
        match &self.target {
            TargetSlot::Read(target) => Some(Ok(target)),
            TargetSlot::Later(slot) => Some(slot.get_or_init(|| Target::parse(params)).as_ref()),
        }
    }

    /// The method name, or `""` for responses.
    pub fn method_str(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }

    /// The envelope of a request `text` that [`scan::request`](crate::scan::request)
    /// read: the same members, kind and target `parse` and `Target::parse`
    /// give it (the scan's own test holds them to that).
    fn of_request(text: &'a str, spans: crate::scan::RequestSpans) -> Self {
        let raw = |span: std::ops::Range<usize>| raw_value(&text[span]);
        let target = spans.params.is_some().then(|| {
            TargetSlot::Read(Target {
                name: spans.name.map(raw),
                uri: spans.uri.map(raw),
                reference: None,
                progress_token: spans.progress_token.map(raw),
                request_id: spans.request_id.map(raw),
                arguments: spans.arguments.map(raw),
                meta: spans.meta.map(raw),
                traceparent: spans.traceparent.map(raw),
                protocol_version: spans.protocol_version.map(raw),
                client_capabilities: spans.client_capabilities.map(raw),
                log_level: spans.log_level.map(raw),
            })
        });
        Envelope {
            kind: if spans.id.is_some() { MessageKind::Request } else { MessageKind::Notification },
            id: spans.id.map(raw),
            method: Some(Cow::Borrowed(&text[spans.method.start + 1..spans.method.end - 1])),
            params: spans.params.map(raw),
            result: None,
            error: None,
            target: target.unwrap_or(TargetSlot::Later(std::sync::OnceLock::new())),
        }
    }
}

/// The `params` members a router routes on: `name` (tools, prompts), `uri`
/// (resources), `ref` (completion) and `_meta.progressToken`. Each is kept
/// raw so that its position in the message is known for splicing.
#[derive(Debug, Default, Clone)]
pub struct Target<'a> {
    /// `params.name`, raw (a JSON string if well-formed).
    pub name: Option<&'a RawValue>,
    /// `params.uri`, raw.
    pub uri: Option<&'a RawValue>,
    /// `params.ref`, for `completion/complete`.
    pub reference: Option<Reference<'a>>,
    /// `params._meta.progressToken`, raw.
    pub progress_token: Option<&'a RawValue>,
    /// `params.requestId`, for `notifications/cancelled`.
    pub request_id: Option<&'a RawValue>,
    /// `params.arguments`, raw (what the audit records of a `tools/call`).
    pub arguments: Option<&'a RawValue>,
    /// `params._meta`, raw (where trace context is put).
    pub meta: Option<&'a RawValue>,
    /// `params._meta.traceparent`, raw.
    pub traceparent: Option<&'a RawValue>,
    /// The 2026-07-28 era's members of `params._meta`, raw: the request's
    /// protocol version, the client's capabilities, the log level it wants
    /// (read into a [`RequestMeta`](crate::modern::RequestMeta) by
    /// [`modern::target_meta`](crate::modern::target_meta)).
    pub protocol_version: Option<&'a RawValue>,
    pub client_capabilities: Option<&'a RawValue>,
    pub log_level: Option<&'a RawValue>,
}

/// `params.ref` of a `completion/complete` request.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Reference<'a> {
    /// `ref/prompt` or `ref/resource`.
    #[serde(borrow, rename = "type", default)]
    pub kind: Option<Cow<'a, str>>,
    /// The prompt name, for `ref/prompt`.
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    /// The resource URI or template, for `ref/resource`.
    #[serde(borrow, default)]
    pub uri: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct TargetWire<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "ref")]
    reference: Option<Reference<'a>>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "requestId")]
    request_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    // Read by the list handlers; here so that a duplicate is refused too.
    #[serde(borrow, default)]
    #[allow(dead_code)]
    cursor: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MetaWire<'a> {
    #[serde(borrow, default, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
    #[serde(borrow, default)]
    traceparent: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    protocol_version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    client_capabilities: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/logLevel")]
    log_level: Option<&'a RawValue>,
}

impl<'a> Target<'a> {
    /// Reads the routing members of `params`; other members are skipped
    /// without being decoded. A member the router reads or records that
    /// appears twice is an error: the upstream would act on one value while
    /// the router routed or audited another.
    pub fn parse(params: &'a RawValue) -> Result<Self, ParseError> {
        let invalid = |e: serde_json::Error| ParseError::Invalid(Cow::Owned(format!("params: {e}")));
        let wire: TargetWire<'a> = serde_json::from_str(params.get()).map_err(invalid)?;
        let meta = match wire.meta {
            // `_meta` is an object when present (null is taken as absent).
            Some(raw) if raw.get() != "null" => Some(serde_json::from_str::<MetaWire<'a>>(raw.get()).map_err(invalid)?),
            _ => None,
        };
        Ok(Target {
            name: wire.name,
            uri: wire.uri,
            reference: wire.reference,
            progress_token: meta.as_ref().and_then(|m| m.progress_token),
            request_id: wire.request_id,
            arguments: wire.arguments,
            meta: wire.meta.filter(|raw| raw.get() != "null"),
            traceparent: meta.as_ref().and_then(|m| m.traceparent),
            protocol_version: meta.as_ref().and_then(|m| m.protocol_version),
            client_capabilities: meta.as_ref().and_then(|m| m.client_capabilities),
            log_level: meta.and_then(|m| m.log_level),
        })
    }
}

/// `params.progressToken` of a `notifications/progress`, raw.
pub fn progress_token(params: &RawValue) -> Option<&RawValue> {
    #[derive(Deserialize)]
    struct Progress<'a> {
        #[serde(borrow, default, rename = "progressToken")]
        progress_token: Option<&'a RawValue>,
    }
    serde_json::from_str::<Progress<'_>>(params.get()).ok()?.progress_token
}

/// `json`, one whole JSON value already checked (by [`crate::scan`]), as
/// the [`RawValue`] serde_json would have borrowed for it.
#[allow(unsafe_code)]
fn raw_value(json: &str) -> &RawValue {
    // SAFETY: `RawValue` is `#[repr(transparent)]` over `str` (serde_json
    // 1.0's `struct RawValue { json: str }`), so a `&str` and a `&RawValue`
    // have the same layout and the same metadata, and this is the cast
    // serde_json's own `RawValue::from_borrowed` makes. Its one invariant,
    // that the text is a JSON value, is the scan's. The test
    // `a_raw_value_made_here_is_serde_jsons_own` checks the layout.
    unsafe { &*(json as *const str as *const RawValue) }
}

/// Reads a raw JSON value as a string, borrowing when it has no escapes.
/// Returns `None` when the value is not a JSON string.
pub fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

/// The text of the JSON string `raw`, borrowed unless it has escapes;
/// `None` if `raw` is not one JSON string. A plain string (nothing
/// escaped) is its own text, with no parse.
pub fn json_text(raw: &[u8]) -> Option<Cow<'_, str>> {
    if let [b'"', inner @ .., b'"'] = raw {
        if !inner.iter().any(|&b| b == b'\\' || b == b'"' || b < 0x20) {
            let text = crate::ascii(inner).or_else(|| std::str::from_utf8(inner).ok());
            return text.map(Cow::Borrowed);
        }
    }
    serde_json::from_slice::<&RawValue>(raw).ok().and_then(as_str)
}

/// What marks an id the router sent upstream in place of a client's
/// ([`upstream_id`]).
const MAPPED: &str = "sb~";

/// The id to send upstream for a client's request id (JSON text): the same
/// id when any upstream echoes it unchanged (a string, or an integer of at
/// most 15 digits); otherwise a string the router owns, `"sb~"` followed by
/// the client's id, so that it round-trips whatever the upstream's JSON
/// library makes of numbers (`1.0`, `1E2` and `-0` come back as `1`, `100`
/// and `0` from most). [`client_id`] turns it back.
pub fn upstream_id(id: &str) -> Cow<'_, str> {
    let echoed = match id.as_bytes() {
        [b'"', rest @ ..] => !rest.contains(&b'\\') && !rest.starts_with(MAPPED.as_bytes()),
        b"0" => true,
        digits => {
            let digits = digits.strip_prefix(b"-").unwrap_or(digits);
            (1..=15).contains(&digits.len()) && digits[0] != b'0' && digits.iter().all(u8::is_ascii_digit)
        }
    };
    if echoed {
        return Cow::Borrowed(id);
    }
    Cow::Owned(String::from_utf8(json_string(&format!("{MAPPED}{id}"))).expect("JSON text is UTF-8"))
}

/// The client's id (JSON text) for an id the router sent upstream
/// ([`upstream_id`]): the same id unless the router made it.
pub fn client_id(id: &str) -> Cow<'_, str> {
    if !id.starts_with('"') || (!id[1..].starts_with(MAPPED) && !id.contains('\\')) {
        return Cow::Borrowed(id);
    }
    match serde_json::from_str::<String>(id) {
        Ok(text) if text.starts_with(MAPPED) => Cow::Owned(text[MAPPED.len()..].to_owned()),
        _ => Cow::Borrowed(id),
    }
}

/// Where and what to write so that `params._meta.traceparent` is
/// `traceparent`: its value replaced, or the member added to `_meta`, or
/// `_meta` added to `params` (`None` without `params`).
pub fn traceparent_edit(
    body: &[u8],
    env: &Envelope<'_>,
    target: &Target<'_>,
    traceparent: &str,
) -> Option<(Range<usize>, Vec<u8>)> {
    let quoted = json_string(traceparent);
    if let Some(raw) = target.traceparent {
        return Some((span(body, raw.get()), quoted));
    }
    let (object, member): (&RawValue, Vec<u8>) = match target.meta {
        Some(meta) => (meta, [&b"\"traceparent\":"[..], &quoted[..]].concat()),
        None => (env.params?, [&b"\"_meta\":{\"traceparent\":"[..], &quoted[..], &b"}"[..]].concat()),
    };
    let at = span(body, object.get());
    let inner = &body[at.start + 1..at.end - 1];
    let empty = inner.iter().all(u8::is_ascii_whitespace);
    let text = if empty { member } else { [&member[..], b","].concat() };
    Some((at.start + 1..at.start + 1, text))
}

/// `message` with `params._meta.traceparent` set to `traceparent` (see
/// [`traceparent_edit`]); `None` if it has no `params` object.
pub fn with_traceparent(message: &Bytes, env: &Envelope<'_>, target: &Target<'_>, traceparent: &str) -> Option<Bytes> {
    let (range, text) = traceparent_edit(message, env, target, traceparent)?;
    Some(crate::rewrite::splice(message, &mut [crate::rewrite::Edit::new(range, &text)]))
}

/// The byte range that `part` occupies inside `whole`.
///
/// `part` must be a sub-slice of `whole` (as every [`RawValue`] returned by
/// this module is of the input it was parsed from).
///
/// # Panics
/// If `part` does not lie within `whole`.
pub fn span(whole: &[u8], part: &str) -> Range<usize> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize).expect("part lies within whole");
    let end = start + part.len();
    assert!(end <= whole.len(), "part lies within whole");
    start..end
}

/// Encodes `s` as a JSON string literal (with quotes).
pub fn json_string(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).expect("a str always serializes")
}

/// A complete error response: `{"jsonrpc":"2.0","id":ID,"error":{...}}`.
/// `id` is written as given, or `null` when the request's id is unknown.
pub fn error_response(id: Option<&RawValue>, code: i64, message: &str, data: Option<&serde_json::Value>) -> Bytes {
    let mut out = BytesMut::with_capacity(64 + message.len());
    out.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.put_slice(id.map_or("null", |r| r.get()).as_bytes());
    out.put_slice(b",\"error\":{\"code\":");
    out.put_slice(code.to_string().as_bytes());
    out.put_slice(b",\"message\":");
    out.put_slice(&json_string(message));
    if let Some(data) = data {
        out.put_slice(b",\"data\":");
        out.put_slice(&serde_json::to_vec(data).expect("a Value always serializes"));
    }
    out.put_slice(b"}}");
    out.freeze()
}

/// A complete success response whose result is the given JSON text.
pub fn result_response(id: &RawValue, result: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(40 + id.get().len() + result.len());
    out.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.put_slice(id.get().as_bytes());
    out.put_slice(b",\"result\":");
    out.put_slice(result);
    out.put_slice(b"}");
    out.freeze()
}

/// A complete request (or, with `id = None`, notification).
pub fn request(id: Option<&[u8]>, method: &str, params: Option<&[u8]>) -> Bytes {
    let mut out = BytesMut::with_capacity(48 + method.len() + params.map_or(0, <[u8]>::len));
    out.put_slice(b"{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.put_slice(b"\"id\":");
        out.put_slice(id);
        out.put_slice(b",");
    }
    out.put_slice(b"\"method\":");
    out.put_slice(&json_string(method));
    if let Some(params) = params {
        out.put_slice(b",\"params\":");
        out.put_slice(params);
    }
    out.put_slice(b"}");
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_reads_plain_strings_in_place_and_escaped_ones_through_the_parser() {
        use std::borrow::Cow;
        assert!(matches!(super::json_text(br#""web__echo""#), Some(Cow::Borrowed("web__echo"))));
        assert!(matches!(super::json_text(br#""""#), Some(Cow::Borrowed(""))));
        assert_eq!(super::json_text(br#""a\"b\u00e9""#).as_deref(), Some("a\"bé"));
        assert!(matches!(super::json_text("\"caf\u{e9}\"".as_bytes()), Some(Cow::Borrowed("café"))));
        assert_eq!(super::json_text(b"\"a\x01b\""), None, "a control character is not JSON");
        assert_eq!(super::json_text(b"12"), None);
        assert_eq!(super::json_text(b"\""), None);
    }

    #[test]
    fn a_raw_value_made_here_is_serde_jsons_own() {
        let text = r#"{"a":[1,"b\"c"],"d":null}"#;
        let ours = raw_value(text);
        let theirs: &RawValue = serde_json::from_str(text).unwrap();
        assert_eq!(ours.get(), theirs.get());
        // Borrowed where it is, not copied.
        assert_eq!(ours.get().as_ptr(), text.as_ptr());
        assert_eq!(std::mem::size_of::<&RawValue>(), std::mem::size_of::<&str>());
        assert_eq!(serde_json::to_string(ours).unwrap(), text);
        assert_eq!(format!("{ours}"), text);
    }

    #[test]
    fn a_request_read_quickly_is_the_request_serde_json_reads() {
        let input = br#" {"method":"tools/call","params":{"_meta":{"progressToken":"p","traceparent":"00-ab"},"name":"a__b","arguments":{"x":[1]},"other":{"name":2}},"id":"7","jsonrpc":"2.0"} "#;
        assert!(crate::scan::request(input).is_some());
        let quick = Envelope::parse(input).unwrap();
        let slow = Envelope::parse_by_serde(input).unwrap();
        assert_eq!((quick.kind, slow.kind), (MessageKind::Request, MessageKind::Request));
        assert_eq!(quick.id.unwrap().get(), slow.id.unwrap().get());
        assert_eq!(quick.method_str(), slow.method_str());
        assert_eq!(span(input, quick.params.unwrap().get()), span(input, slow.params.unwrap().get()));
        let (q, s) = (quick.target().unwrap().unwrap(), slow.target().unwrap().unwrap());
        let fields = |t: &Target<'_>| {
            [t.name, t.uri, t.progress_token, t.request_id, t.arguments, t.meta, t.traceparent]
                .map(|v| v.map(|r| span(input, r.get())))
        };
        assert_eq!(fields(q), fields(s));
        assert_eq!(as_str(q.name.unwrap()).unwrap(), "a__b");
        assert_eq!(q.traceparent.unwrap().get(), r#""00-ab""#);
        // A notification, and a request without params.
        let note = Envelope::parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert_eq!(note.kind, MessageKind::Notification);
        assert!(note.id.is_none() && note.params.is_none() && note.target().is_none());
        let ping = Envelope::parse(br#"{"jsonrpc":"2.0","id":-1.5e3,"method":"ping"}"#).unwrap();
        assert_eq!((ping.kind, ping.id.unwrap().get()), (MessageKind::Request, "-1.5e3"));
    }

    #[test]
    fn request_envelope_borrows_members() {
        let input = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a__b","arguments":{"x":[1,2,{"y":"z"}]}}}"#;
        let env = Envelope::parse(input).unwrap();
        assert_eq!(env.kind, MessageKind::Request);
        assert_eq!(env.id.unwrap().get(), "7");
        assert_eq!(env.method_str(), "tools/call");
        let params = env.params.unwrap();
        let range = span(input, params.get());
        assert_eq!(&input[range], params.get().as_bytes());
        let target = Target::parse(params).unwrap();
        assert_eq!(as_str(target.name.unwrap()).unwrap(), "a__b");
        assert!(target.progress_token.is_none());
    }

    #[test]
    fn kinds() {
        let n = Envelope::parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert_eq!(n.kind, MessageKind::Notification);
        let r = Envelope::parse(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#).unwrap();
        assert_eq!(r.kind, MessageKind::Response);
        let e = Envelope::parse(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"}}"#).unwrap();
        assert_eq!(e.kind, MessageKind::Error);
    }

    #[test]
    fn rejects_bad_messages_with_the_right_code() {
        let cases: &[(&[u8], i64)] = &[
            (b"{not json", code::PARSE_ERROR),
            (b"", code::PARSE_ERROR),
            (br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, code::INVALID_REQUEST),
            (br#""hello""#, code::INVALID_REQUEST),
            (br#"{"id":1,"method":"ping"}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","method":5}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#, code::INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#, code::INVALID_REQUEST),
        ];
        for (input, expected) in cases {
            let err = Envelope::parse(input).expect_err(std::str::from_utf8(input).unwrap());
            assert_eq!(err.code(), *expected, "{}: {err}", String::from_utf8_lossy(input));
        }
        assert!(matches!(Envelope::parse(b"[1,2]"), Err(ParseError::Batch)));
    }

    #[test]
    fn bytes_that_are_not_utf8_are_a_parse_error_wherever_the_router_reads_them() {
        // In a member read (a string, or borrowed raw): -32700, as before
        // the text was checked whole.
        for input in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi\xffng\"}"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":\"\xc3\",\"method\":\"ping\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":{\"a\":\"\xe2\x82\"}}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":[\"\xff\"]}",
        ] {
            let err = Envelope::parse(input).expect_err(&String::from_utf8_lossy(input));
            assert_eq!(err.code(), code::PARSE_ERROR, "{}: {err}", String::from_utf8_lossy(input));
        }
        // Valid UTF-8 beyond ASCII, raw and escaped, is read as before.
        let env = Envelope::parse("{\"jsonrpc\":\"2.0\",\"id\":\"caf\u{e9}\",\"method\":\"\u{2603}\",\"params\":{\"t\":\"\\u00e9\u{1F600}\"}}".as_bytes())
            .unwrap();
        assert_eq!(env.id.unwrap().get(), "\"caf\u{e9}\"");
        assert_eq!(env.method_str(), "\u{2603}");
        assert_eq!(env.params.unwrap().get(), "{\"t\":\"\\u00e9\u{1F600}\"}");
    }

    #[test]
    fn ids_an_upstream_might_rewrite_are_mapped_and_come_back() {
        for kept in ["1", "0", "-5", "123456789012345", r#""abc""#, r#""""#] {
            assert_eq!(upstream_id(kept), kept);
            assert_eq!(client_id(kept), kept);
        }
        for odd in ["1.0", "1E2", "-0", "1e-3", "0.5", "1234567890123456", "00", r#""sb~x""#, r#""a\u0041""#] {
            let mapped = upstream_id(odd);
            assert_ne!(mapped, odd);
            assert!(as_str(&RawValue::from_string(mapped.to_string()).unwrap()).is_some(), "{mapped} is a string");
            assert_eq!(client_id(&mapped), odd, "{odd} round-trips");
            // However an upstream re-escapes the string, it is the same value.
            let value: serde_json::Value = serde_json::from_str(&mapped).unwrap();
            let ascii = serde_json::to_string(&value).unwrap();
            assert_eq!(client_id(&ascii), odd);
        }
    }

    #[test]
    fn target_refuses_duplicates_of_what_the_router_reads_or_records() {
        for params in [
            r#"{"name":"a","arguments":{"x":1},"arguments":{"x":2}}"#,
            r#"{"name":"a","name":"b"}"#,
            r#"{"uri":"a","uri":"b"}"#,
            r#"{"cursor":"a","cursor":"b"}"#,
            r#"{"requestId":1,"requestId":2}"#,
            r#"{"_meta":{"progressToken":1,"progressToken":2}}"#,
            r#"{"_meta":{},"_meta":{}}"#,
            r#"{"ref":{"type":"ref/prompt","name":"a","name":"b"}}"#,
        ] {
            let raw = RawValue::from_string(params.into()).unwrap();
            let err = Target::parse(&raw).expect_err(params);
            assert!(err.to_string().contains("duplicate field"), "{params}: {err}");
        }
        let raw =
            RawValue::from_string(r#"{"name":"a","arguments":{"x":1,"x":2},"other":1,"other":2}"#.into()).unwrap();
        let target = Target::parse(&raw).expect("members the router does not read may repeat");
        assert_eq!(target.arguments.unwrap().get(), r#"{"x":1,"x":2}"#);
    }

    #[test]
    fn target_reads_meta_ref_and_escaped_names() {
        let params = RawValue::from_string(
            r#"{"name":"we\"ird","arguments":{"_meta":{"progressToken":9}},"_meta":{"progressToken":"tok"}}"#.into(),
        )
        .unwrap();
        let t = Target::parse(&params).unwrap();
        assert_eq!(as_str(t.name.unwrap()).unwrap(), "we\"ird");
        assert_eq!(t.progress_token.unwrap().get(), "\"tok\"");

        let params = RawValue::from_string(
            r#"{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":"v"}}"#.into(),
        )
        .unwrap();
        let t = Target::parse(&params).unwrap();
        let r = t.reference.unwrap();
        assert_eq!(r.kind.as_deref(), Some("ref/prompt"));
        assert_eq!(as_str(r.name.unwrap()).unwrap(), "p");
    }

    #[test]
    fn as_str_refuses_non_strings() {
        let raw = RawValue::from_string("12".into()).unwrap();
        assert!(as_str(&raw).is_none());
    }

    #[test]
    fn built_messages_parse_back() {
        let id = RawValue::from_string("\"abc\"".into()).unwrap();
        let err = error_response(Some(&id), code::INVALID_PARAMS, "unknown tool \"x\"", None);
        let v: serde_json::Value = serde_json::from_slice(&err).unwrap();
        assert_eq!(v["error"]["message"], "unknown tool \"x\"");
        assert_eq!(v["id"], "abc");
        let null = error_response(None, code::PARSE_ERROR, "bad", Some(&serde_json::json!({"k": 1})));
        let v: serde_json::Value = serde_json::from_slice(&null).unwrap();
        assert!(v["id"].is_null());
        assert_eq!(v["error"]["data"]["k"], 1);
        let ok = result_response(&id, b"{}");
        assert_eq!(Envelope::parse(&ok).unwrap().kind, MessageKind::Response);
        let req = request(Some(b"5"), "ping", None);
        assert_eq!(Envelope::parse(&req).unwrap().kind, MessageKind::Request);
        let note = request(None, "notifications/initialized", Some(b"{}"));
        assert_eq!(Envelope::parse(&note).unwrap().kind, MessageKind::Notification);
    }
}
