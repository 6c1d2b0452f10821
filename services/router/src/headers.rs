//! A request's headers as the phases read them: hyper's `HeaderMap`, or
//! the router's own HTTP/1.1 path's head ([`crate::h1`]), indexed as it
//! was parsed.
//!
//! The phases look up a handful of names ([`Header`]): MCP's own, the
//! credentials, `Origin`, `Content-Type`, `Accept`, `traceparent`. On the
//! h1 path each line's name is told as the head is parsed (`Header` is
//! `switchboard_protocol::http1::Known`), and the first line of each is
//! remembered: a lookup is an index, and nothing is allocated or copied.
//! Building a `HeaderMap` instead cost
//! about 550 instructions per line, and each lookup hashed the name again
//! (about 4,500 instructions per forwarded call, an eighth of it).
//!
//! Values read as text the way `HeaderValue::to_str` reads them: visible
//! ASCII and tabs only. The head's parse has already refused what a
//! `HeaderValue` refuses (control characters) and any name that is not a
//! token.

use std::ops::Range;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use switchboard_protocol::http1::{HeaderSpan, KNOWN};

/// The header names the phases read: those the head's parse tells as each
/// line is parsed (MCP's own, the credentials, `Origin`, `Content-Type`,
/// `Accept`, `traceparent`, the framing's and a few others), one list for
/// both.
pub use switchboard_protocol::http1::Known as Header;

/// Each [`Header`], in order, as http names it (in lower case).
static HEADER_NAMES: [HeaderName; KNOWN] = [
    http::header::ACCEPT,
    http::header::AUTHORIZATION,
    http::header::CONTENT_TYPE,
    HeaderName::from_static("last-event-id"),
    HeaderName::from_static("mcp-method"),
    HeaderName::from_static("mcp-name"),
    HeaderName::from_static("mcp-protocol-version"),
    HeaderName::from_static("mcp-session-id"),
    http::header::ORIGIN,
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("x-api-key"),
    http::header::CONTENT_LENGTH,
    http::header::TRANSFER_ENCODING,
    http::header::HOST,
    http::header::EXPECT,
    http::header::UPGRADE,
    http::header::CONNECTION,
    http::header::WWW_AUTHENTICATE,
    http::header::ACCEPT_ENCODING,
    http::header::USER_AGENT,
    http::header::DATE,
];

/// The name as http's `HeaderName`, for hyper's map.
fn header_name(name: Header) -> &'static HeaderName {
    &HEADER_NAMES[name as usize]
}

/// No line: an index into [`Head::first`] that names none.
const NONE: u8 = u8::MAX;

/// An HTTP/1.1 request head's header lines: the head's bytes, each line's
/// name and value as spans of them, and the first line of each [`Header`].
/// Kept for a connection and refilled for each request, its room kept.
#[derive(Default)]
pub struct Head {
    bytes: Bytes,
    /// Filled by the head's parse ([`switchboard_protocol::http1::parse_request`]).
    pub spans: Vec<HeaderSpan>,
    /// Each line's [`Header`] (as `u8`), or [`NONE`].
    names: Vec<u8>,
    /// Each [`Header`]'s first line, or [`NONE`].
    first: [u8; KNOWN],
}

impl Head {
    /// Indexes the lines of `bytes`, the head [`Head::spans`] were parsed
    /// from (at most 255 lines: `http1::MAX_HEADERS` is 100).
    pub fn index(&mut self, bytes: Bytes) {
        self.first = [NONE; KNOWN];
        self.names.clear();
        for (line, span) in self.spans.iter().enumerate() {
            let name = span.known;
            let line = u8::try_from(line).unwrap_or(NONE);
            if let Some(name) = name {
                let first = &mut self.first[name as usize];
                if *first == NONE {
                    *first = line;
                }
            }
            self.names.push(name.map_or(NONE, |n| n as u8));
        }
        self.bytes = bytes;
    }

    /// Lets go of the head's bytes (the values shared them).
    pub fn clear(&mut self) {
        self.bytes = Bytes::new();
        self.spans.clear();
        self.names.clear();
        self.first = [NONE; KNOWN];
    }

    fn value(&self, span: &Range<usize>) -> &[u8] {
        &self.bytes[span.clone()]
    }
}

/// A request's headers, as the phases read them.
#[derive(Clone, Copy)]
pub enum Headers<'a> {
    /// hyper's request (HTTP/2, GET, DELETE, the legacy endpoints, and
    /// whatever the h1 path hands it).
    Map(&'a HeaderMap),
    /// The h1 path's request.
    Head(&'a Head),
}

impl<'a> From<&'a HeaderMap> for Headers<'a> {
    fn from(map: &'a HeaderMap) -> Self {
        Headers::Map(map)
    }
}

impl<'a> Headers<'a> {
    /// The first value of `name`, trimmed.
    pub fn get(self, name: Header) -> Option<&'a [u8]> {
        match self {
            Headers::Map(map) => map.get(header_name(name)).map(http::HeaderValue::as_bytes),
            Headers::Head(head) => {
                let line = head.first[name as usize];
                (line != NONE).then(|| head.value(&head.spans[line as usize].value))
            }
        }
    }

    /// The first value of `name` as text, if it is visible ASCII (as
    /// `HeaderValue::to_str` has it).
    pub fn text(self, name: Header) -> Option<Result<&'a str, NotText>> {
        self.get(name).map(text)
    }

    /// Whether the request has `name` at all.
    pub fn contains(self, name: Header) -> bool {
        self.get(name).is_some()
    }

    /// Every value of `name`, in order.
    pub fn get_all(self, name: Header) -> impl Iterator<Item = &'a [u8]> {
        let (map, head) = match self {
            Headers::Map(map) => (Some(map.get_all(header_name(name)).iter()), None),
            Headers::Head(head) => (None, Some(head)),
        };
        let lines = head.into_iter().flat_map(move |head| {
            head.names
                .iter()
                .zip(&head.spans)
                .filter(move |(n, _)| **n == name as u8)
                .map(move |(_, span)| head.value(&span.value))
        });
        map.into_iter().flatten().map(http::HeaderValue::as_bytes).chain(lines)
    }

    /// Every line, its name in lower case for hyper's and as sent for the
    /// h1 path's (the framing lines included).
    pub fn iter(self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        let (map, head) = match self {
            Headers::Map(map) => (Some(map.iter()), None),
            Headers::Head(head) => (None, Some(head)),
        };
        let lines = head
            .into_iter()
            .flat_map(|head| head.spans.iter().map(move |s| (&head.bytes[s.name.clone()], head.value(&s.value))));
        map.into_iter().flatten().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())).chain(lines)
    }

    /// Each line whose name starts with `prefix` (lower case, and no
    /// [`Known`](switchboard_protocol::http1::Known) name's start), in any
    /// case: for the h1 path's head, a loop over its lines that passes by
    /// those of a known name, not [`Headers::iter`]'s chain of adapters (a
    /// stateless request's `Mcp-Param-*` look-up cost 1,000 instructions
    /// through it).
    pub fn each_with_prefix(self, prefix: &[u8], mut each: impl FnMut(&'a [u8], &'a [u8])) {
        debug_assert!(switchboard_protocol::http1::Known::ALL.iter().all(|k| !k.text().starts_with(prefix)));
        let starts = |name: &[u8]| name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix);
        match self {
            Headers::Map(map) => {
                for (name, value) in map.iter().filter(|(n, _)| starts(n.as_str().as_bytes())) {
                    each(name.as_str().as_bytes(), value.as_bytes());
                }
            }
            Headers::Head(head) => {
                for span in head.spans.iter().filter(|s| s.known.is_none()) {
                    let name = &head.bytes[span.name.clone()];
                    if starts(name) {
                        each(name, head.value(&span.value));
                    }
                }
            }
        }
    }

    /// The API key or token the request presents: `Authorization: Bearer`,
    /// else `X-API-Key`.
    pub fn presented_key(self) -> Option<&'a str> {
        if let Some(key) = self.text(Header::Authorization).and_then(Result::ok).and_then(bearer) {
            return Some(key);
        }
        self.text(Header::XApiKey)?.ok().map(str::trim).filter(|k| !k.is_empty())
    }
}

/// The token of an `Authorization` value in the `Bearer` scheme (any case).
pub fn bearer(value: &str) -> Option<&str> {
    let token = bearer_bytes(value.as_bytes())?;
    // Where it starts in `value` (ASCII was trimmed: a character boundary).
    let start = token.as_ptr() as usize - value.as_ptr() as usize;
    value.get(start..start + token.len())
}

/// The token of an `Authorization` value in the `Bearer` scheme (any
/// case), in the value's bytes (not checked as text; a header value holds
/// no other white space than spaces and tabs).
pub fn bearer_bytes(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    if !value.get(..7)?.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(value[7..].trim_ascii()).filter(|t| !t.is_empty())
}

/// A value that is not visible ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotText;

/// A header's `value` as text if it is visible ASCII and tabs, as
/// `HeaderValue::to_str` has it. Values hold no control characters
/// (httparse and http refuse them), so that is: if it is ASCII (checked a
/// word at a time, not a byte).
fn text(value: &[u8]) -> Result<&str, NotText> {
    switchboard_protocol::ascii(value).ok_or(NotText)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use switchboard_protocol::http1;

    #[test]
    fn every_name_is_http_s_name_for_it() {
        for name in Header::ALL {
            assert_eq!(header_name(name).as_str().as_bytes(), name.text(), "{name:?}");
        }
    }

    /// A head and the same lines in a HeaderMap, as hyper would give them.
    fn both(raw: &'static [u8]) -> (Head, HeaderMap) {
        let mut head = Head::default();
        http1::parse_request(raw, &mut head.spans).unwrap().unwrap();
        let mut map = HeaderMap::new();
        for span in &head.spans {
            map.append(
                HeaderName::from_bytes(&raw[span.name.clone()]).unwrap(),
                HeaderValue::from_bytes(&raw[span.value.clone()]).unwrap(),
            );
        }
        head.index(Bytes::from_static(raw));
        (head, map)
    }

    #[test]
    fn the_head_answers_every_lookup_as_the_map_does() {
        let (head, map) = both(
            b"POST /mcp HTTP/1.1\r\nHOST: a\r\nMcp-Session-Id: s1\r\nX-Custom-Thing: one\r\n\
              accept: application/json\r\nAccept:  text/event-stream \r\nMCP-PROTOCOL-VERSION: 2025-11-25\r\n\
              Content-Length: 2\r\nx-custom-thing: two\r\nmcp-session-id: s2\r\nOrigin: caf\xc3\xa9\r\n\r\n",
        );
        for headers in [Headers::Head(&head), Headers::Map(&map)] {
            assert_eq!(headers.get(Header::McpSessionId), Some(&b"s1"[..]), "the first of two");
            assert_eq!(headers.text(Header::McpProtocolVersion), Some(Ok("2025-11-25")));
            assert!(!headers.contains(Header::Authorization));
            assert_eq!(headers.get(Header::Traceparent), None);
            let accept: Vec<_> = headers.get_all(Header::Accept).collect();
            assert_eq!(accept, [&b"application/json"[..], b"text/event-stream"], "in order, trimmed");
            let sessions: Vec<_> = headers.get_all(Header::McpSessionId).collect();
            assert_eq!(sessions, [&b"s1"[..], b"s2"]);
            assert_eq!(headers.text(Header::Origin), Some(Err(NotText)), "not visible ASCII");
            assert_eq!(headers.get(Header::Origin), Some("café".as_bytes()));
            let custom: Vec<_> =
                headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(b"x-custom-thing")).map(|(_, v)| v).collect();
            assert_eq!(custom, [&b"one"[..], b"two"]);
            assert_eq!(headers.iter().count(), 10);
            let mut prefixed = Vec::new();
            headers.each_with_prefix(b"x-custom-", |n, v| prefixed.push((n.to_ascii_lowercase(), v)));
            assert_eq!(prefixed, [(b"x-custom-thing".to_vec(), &b"one"[..]), (b"x-custom-thing".to_vec(), b"two")]);
            let mut none = 0;
            headers.each_with_prefix(b"x-custom-thing-", |_, _| none += 1);
            assert_eq!(none, 0, "a name shorter than the prefix");
        }
    }

    #[test]
    fn a_refilled_head_forgets_the_last_request() {
        let mut head = Head::default();
        let first: &'static [u8] = b"POST /mcp HTTP/1.1\r\nHost: a\r\nMcp-Session-Id: s1\r\nAccept: */*\r\n\r\n";
        http1::parse_request(first, &mut head.spans).unwrap().unwrap();
        head.index(Bytes::from_static(first));
        assert_eq!(Headers::Head(&head).get(Header::McpSessionId), Some(&b"s1"[..]));
        let second: &'static [u8] = b"POST /mcp HTTP/1.1\r\nAccept: text/event-stream\r\nHost: a\r\n\r\n";
        http1::parse_request(second, &mut head.spans).unwrap().unwrap();
        head.index(Bytes::from_static(second));
        let headers = Headers::Head(&head);
        assert_eq!(headers.get(Header::McpSessionId), None);
        assert_eq!(headers.get_all(Header::Accept).collect::<Vec<_>>(), [&b"text/event-stream"[..]]);
        head.clear();
        assert_eq!(Headers::Head(&head).get(Header::Accept), None);
        assert_eq!(Headers::Head(&head).iter().count(), 0);
    }

    #[test]
    fn the_presented_key_is_the_bearer_token_else_x_api_key() {
        let key = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (n, v) in pairs {
                map.append(*n, HeaderValue::from_static(v));
            }
            Headers::Map(&map).presented_key().map(str::to_owned)
        };
        assert_eq!(key(&[("authorization", "Bearer sb_1")]).as_deref(), Some("sb_1"));
        assert_eq!(key(&[("authorization", "bearer   sb_1 ")]).as_deref(), Some("sb_1"));
        assert_eq!(key(&[("authorization", "Basic abc"), ("x-api-key", " sb_2 ")]).as_deref(), Some("sb_2"));
        assert_eq!(key(&[("authorization", "Bearer "), ("x-api-key", "sb_2")]).as_deref(), Some("sb_2"));
        assert_eq!(key(&[("x-api-key", "")]), None);
        assert_eq!(key(&[]), None);
    }

    #[test]
    fn a_bearer_token_is_found_the_same_in_bytes_and_in_text() {
        for value in [
            "Bearer abc",
            "bearer   abc \t",
            "\t BEARER a.b.c",
            "Bearer",
            "Bearer ",
            "Bearer \t ",
            "Bearerabc",
            "Basic abc",
            "",
            "Bearer a b",
        ] {
            let text = bearer(value);
            assert_eq!(text.map(str::as_bytes), bearer_bytes(value.as_bytes()), "{value:?}");
            // As it was found in text before: trimmed, the scheme, trimmed.
            let before = Some(value.trim())
                .filter(|v| v.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("bearer ")))
                .map(|v| v[7..].trim())
                .filter(|t| !t.is_empty());
            assert_eq!(text, before, "{value:?}");
        }
        assert_eq!(bearer("bearer   abc \t"), Some("abc"));
        assert_eq!(bearer("Bearer a b"), Some("a b"));
        assert_eq!(bearer("Bearer \t "), None);
    }

    #[test]
    fn text_is_what_header_value_to_str_says_of_every_value_a_head_can_hold() {
        // Every byte httparse takes in a value (it refuses the others).
        for b in (0..=255u8).filter(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f)) {
            let value = [b'a', b, b'z'];
            let http = HeaderValue::from_bytes(&value).unwrap();
            assert_eq!(text(&value).ok(), http.to_str().ok(), "{b:#x}");
            let raw = [&b"POST / HTTP/1.1\r\nOrigin: a"[..], &[b], b"z\r\n\r\n"].concat();
            assert!(http1::parse_request(&raw, &mut Vec::new()).is_ok(), "{b:#x}");
        }
        for b in (0..0x20u8).filter(|&b| b != b'\t').chain([0x7f]) {
            let raw = [&b"POST / HTTP/1.1\r\nOrigin: a"[..], &[b], b"z\r\n\r\n"].concat();
            assert!(http1::parse_request(&raw, &mut Vec::new()).is_err(), "{b:#x} is refused before it is read");
        }
    }

    mod any_head {
        //! For any head httparse takes, every lookup answers as hyper's map
        //! of the same lines does.
        use super::*;
        use proptest::prelude::*;

        /// A header name: one the phases read, in any case, or any token.
        fn name() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                (0..KNOWN, any::<u64>()).prop_map(|(i, case)| {
                    let lower = Header::ALL[i].text();
                    lower
                        .iter()
                        .enumerate()
                        .map(|(j, b)| if case >> (j % 64) & 1 == 1 { b.to_ascii_uppercase() } else { *b })
                        .collect()
                }),
                "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,21}".prop_map(String::into_bytes),
            ]
            .prop_filter("framing is placed by the head's own test", |n| {
                !n.eq_ignore_ascii_case(b"content-length") && !n.eq_ignore_ascii_case(b"transfer-encoding")
            })
        }

        /// A value: visible ASCII with spaces and tabs inside, or obs-text.
        fn value() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                "[!-~]([ \t!-~]{0,30}[!-~])?".prop_map(String::into_bytes),
                Just(Vec::new()),
                prop::collection::vec(0x80u8..=0xff, 1..8),
            ]
        }

        proptest! {
            #[test]
            fn every_lookup_answers_as_the_map_does(lines in prop::collection::vec((name(), value()), 0..24)) {
                let mut raw = b"POST /mcp HTTP/1.1\r\n".to_vec();
                for (n, v) in &lines {
                    raw.extend_from_slice(n);
                    raw.extend_from_slice(b": ");
                    raw.extend_from_slice(v);
                    raw.extend_from_slice(b"\r\n");
                }
                raw.extend_from_slice(b"\r\n");
                let mut head = Head::default();
                http1::parse_request(&raw, &mut head.spans).unwrap().unwrap();
                head.index(Bytes::from(raw));
                let mut map = HeaderMap::new();
                for (n, v) in &lines {
                    map.append(HeaderName::from_bytes(n).unwrap(), HeaderValue::from_bytes(v).unwrap());
                }
                let (ours, theirs) = (Headers::Head(&head), Headers::Map(&map));
                for name in Header::ALL {
                    prop_assert_eq!(ours.get(name), theirs.get(name), "{:?}", name);
                    let http = |v: &[u8]| HeaderValue::from_bytes(v).unwrap().to_str().map(str::to_owned).map_err(|_| NotText);
                    prop_assert_eq!(ours.text(name).map(|t| t.map(str::to_owned)), theirs.get(name).map(http), "{:?}", name);
                    prop_assert_eq!(ours.get_all(name).collect::<Vec<_>>(), theirs.get_all(name).collect::<Vec<_>>(), "{:?}", name);
                }
                prop_assert_eq!(ours.presented_key(), theirs.presented_key());
                let lower = |(n, v): (&[u8], &[u8])| (n.to_ascii_lowercase(), v.to_vec());
                let mut ours: Vec<_> = ours.iter().map(lower).collect();
                let mut theirs: Vec<_> = theirs.iter().map(lower).collect();
                // The map groups a name's lines; the order within a name is kept.
                ours.sort_by(|a, b| a.0.cmp(&b.0));
                theirs.sort_by(|a, b| a.0.cmp(&b.0));
                prop_assert_eq!(ours, theirs);
            }
        }
    }
}
