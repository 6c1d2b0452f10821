//! HTTP/1.1 request heads and response heads, for the router's own path
//! for its hot request (a `POST` to the MCP endpoint with a
//! `Content-Length` body). Everything else (HTTP/2, `GET` streams,
//! chunked bodies, `Expect`, upgrades) stays with hyper; this module only
//! says which is which, and refuses what must not be guessed at.
//!
//! A head is parsed straight from the connection's buffer into spans of it
//! (nothing is copied). What makes a request's framing ambiguous is
//! refused, never resolved (RFC 9112 §6.3, request smuggling): a
//! `Content-Length` that is not one plain decimal number, or is given
//! twice, or beside `Transfer-Encoding`. `httparse` refuses obsolete line
//! folding, a bare CR, white space before a header name's colon and
//! control characters in values.
//!
//! The head most clients send is read first by a narrower pass of this
//! module's own ([`parse_request`]): one request line of a token method,
//! a target of visible ASCII and `HTTP/1.1` or `HTTP/1.0`, then header
//! lines of a token name, a colon and a value of visible ASCII, spaces
//! and tabs, every line ended by CRLF. It reads such a head in one pass,
//! eight value bytes at a time, at under half what httparse and the walk
//! over its lines took (about 2,700 instructions for the load test's head
//! of seven lines; callgrind). Anything else (a partial head, a bare LF,
//! obs-text, an empty line before the request, a framing header it would
//! refuse, too many lines) it leaves to httparse, which decides: what the
//! narrow pass accepts, httparse reads the same (the `fast_*` property
//! tests check that on generated heads and on arbitrary bytes).

use std::ops::Range;

/// The longest head taken (request line and headers); longer is refused
/// (431).
pub const MAX_HEAD: usize = 64 * 1024;

/// The most header lines taken; more is refused (431).
pub const MAX_HEADERS: usize = 100;

/// One header line of a head: its name and value, as spans of the buffer
/// the head was parsed from (the value without surrounding white space).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSpan {
    pub name: Range<usize>,
    pub value: Range<usize>,
    /// The name, if it is one of those [`Known`] (in any case).
    pub known: Option<Known>,
}

/// The header names read here and by the router (its `Header`), and a few
/// others most heads carry: each is recognised as its line is parsed, so
/// that nothing matches a line's name against names again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Known {
    Accept,
    Authorization,
    ContentType,
    LastEventId,
    McpMethod,
    McpName,
    McpProtocolVersion,
    McpSessionId,
    Origin,
    Traceparent,
    XApiKey,
    ContentLength,
    TransferEncoding,
    Host,
    Expect,
    Upgrade,
    Connection,
    WwwAuthenticate,
    AcceptEncoding,
    UserAgent,
    Date,
}

/// How many [`Known`] names there are.
pub const KNOWN: usize = 21;

/// Each [`Known`] name in lower case, with its bytes as little-endian words
/// and the bits that fold its letters' case, for matching eight bytes at a
/// time.
struct Spelling {
    text: &'static [u8],
    words: [u64; 3],
    folds: [u64; 3],
    /// The bytes of each word that are the name's.
    masks: [u64; 3],
}

const fn spelling(text: &'static [u8]) -> Spelling {
    let mut words = [0u64; 3];
    let mut folds = [0u64; 3];
    let mut masks = [0u64; 3];
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        words[i / 8] |= (b as u64) << (8 * (i % 8));
        masks[i / 8] |= 0xff << (8 * (i % 8));
        if b.is_ascii_lowercase() {
            folds[i / 8] |= 0x20 << (8 * (i % 8));
        }
        i += 1;
    }
    Spelling { text, words, folds, masks }
}

static SPELLINGS: [Spelling; KNOWN] = [
    spelling(b"accept"),
    spelling(b"authorization"),
    spelling(b"content-type"),
    spelling(b"last-event-id"),
    spelling(b"mcp-method"),
    spelling(b"mcp-name"),
    spelling(b"mcp-protocol-version"),
    spelling(b"mcp-session-id"),
    spelling(b"origin"),
    spelling(b"traceparent"),
    spelling(b"x-api-key"),
    spelling(b"content-length"),
    spelling(b"transfer-encoding"),
    spelling(b"host"),
    spelling(b"expect"),
    spelling(b"upgrade"),
    spelling(b"connection"),
    spelling(b"www-authenticate"),
    spelling(b"accept-encoding"),
    spelling(b"user-agent"),
    spelling(b"date"),
];

impl Known {
    /// Every name, in order.
    pub const ALL: [Known; KNOWN] = [
        Known::Accept,
        Known::Authorization,
        Known::ContentType,
        Known::LastEventId,
        Known::McpMethod,
        Known::McpName,
        Known::McpProtocolVersion,
        Known::McpSessionId,
        Known::Origin,
        Known::Traceparent,
        Known::XApiKey,
        Known::ContentLength,
        Known::TransferEncoding,
        Known::Host,
        Known::Expect,
        Known::Upgrade,
        Known::Connection,
        Known::WwwAuthenticate,
        Known::AcceptEncoding,
        Known::UserAgent,
        Known::Date,
    ];

    /// The name in lower case.
    pub fn text(self) -> &'static [u8] {
        SPELLINGS[self as usize].text
    }

    /// The names that begin with `first` (in either case). Where one name
    /// begins another (`accept`, `accept-encoding`), the colon after it
    /// tells them apart.
    #[inline(always)]
    fn starting_with(first: u8) -> &'static [Known] {
        use Known::*;
        match first | 0x20 {
            b'a' => &[AcceptEncoding, Accept, Authorization],
            b'c' => &[ContentLength, ContentType, Connection],
            b'd' => &[Date],
            b'e' => &[Expect],
            b'h' => &[Host],
            b'l' => &[LastEventId],
            b'm' => &[McpSessionId, McpProtocolVersion, McpMethod, McpName],
            b'o' => &[Origin],
            b't' => &[Traceparent, TransferEncoding],
            b'u' => &[UserAgent, Upgrade],
            b'w' => &[WwwAuthenticate],
            b'x' => &[XApiKey],
            _ => &[],
        }
    }

    /// Which name `name` (a whole name, in any case) is.
    pub fn of(name: &[u8]) -> Option<Known> {
        let first = *name.first()?;
        Known::starting_with(first).iter().copied().find(|k| name.eq_ignore_ascii_case(k.text()))
    }

    /// Which name begins `line` and is followed by its colon, and where the
    /// colon is, matched eight bytes at a time; `None` when none is, or the
    /// line is too short to tell this way.
    #[inline(always)]
    fn at_start_of(line: &[u8]) -> Option<(Known, usize)> {
        let first = *line.first()?;
        for &known in Known::starting_with(first) {
            let s = &SPELLINGS[known as usize];
            let len = s.text.len();
            let words = len.div_ceil(8);
            if line.len() < words * 8 || line.len() <= len || line[len] != b':' {
                continue;
            }
            let same = (0..words).all(|w| {
                let x = u64::from_le_bytes(line[w * 8..w * 8 + 8].try_into().expect("eight bytes"));
                (x | s.folds[w]) & s.masks[w] == s.words[w]
            });
            if same {
                return Some((known, len));
            }
        }
        None
    }
}

/// The name at the start of `line`: its length and which [`Known`] it is.
#[inline(always)]
fn name_at(line: &[u8]) -> (usize, Option<Known>) {
    if let Some((known, len)) = Known::at_start_of(line) {
        return (len, Some(known));
    }
    let len = run(line, &TOKEN);
    (len, Known::of(&line[..len]))
}

/// A request head, as spans of the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Bytes of the head, the blank line included: the body starts here.
    pub len: usize,
    pub method: Range<usize>,
    /// The request target (path and query).
    pub target: Range<usize>,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub minor: u8,
    /// The body's length, when `Content-Length` gives it.
    pub content_length: Option<u64>,
    /// `Transfer-Encoding` is present (the body is chunked, or worse).
    pub transfer_encoding: bool,
    /// `Expect` is present (`100-continue`).
    pub expect: bool,
    /// `Upgrade` is present.
    pub upgrade: bool,
    /// The client will not send another request on this connection
    /// (`Connection: close`, or HTTP/1.0 without `keep-alive`).
    pub close: bool,
    /// How many `Host` lines it has.
    pub hosts: usize,
}

/// Why a head was refused. Every one of them ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is longer than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("the request has more than {MAX_HEADERS} header lines")]
    TooManyHeaders,
    #[error("malformed request head ({0})")]
    Malformed(&'static str),
    #[error("Content-Length is not one decimal number")]
    BadLength,
    #[error("Content-Length is given more than once")]
    RepeatedLength,
    #[error("both Content-Length and Transfer-Encoding are given")]
    LengthAndTransferEncoding,
    #[error("unsupported HTTP version")]
    Version,
}

impl HeadError {
    /// The status to answer with: 431 for a head too large, else 400 (505
    /// for a version other than 1.0 and 1.1).
    pub fn status(self) -> u16 {
        match self {
            HeadError::TooLarge | HeadError::TooManyHeaders => 431,
            HeadError::Version => 505,
            _ => 400,
        }
    }

    /// A label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            HeadError::TooLarge => "head_too_large",
            HeadError::TooManyHeaders => "too_many_headers",
            HeadError::Malformed(_) => "malformed_head",
            HeadError::BadLength => "bad_content_length",
            HeadError::RepeatedLength => "repeated_content_length",
            HeadError::LengthAndTransferEncoding => "length_and_transfer_encoding",
            HeadError::Version => "http_version",
        }
    }
}

/// Parses the request head at the start of `buf`: `Ok(None)` while it is
/// incomplete (read more, unless `buf` already holds [`MAX_HEAD`] bytes:
/// then it is refused). The header lines go to `headers` (cleared first;
/// kept by the caller to be reused, so that parsing allocates nothing once
/// it has grown).
pub fn parse_request(buf: &[u8], headers: &mut Vec<HeaderSpan>) -> Result<Option<RequestHead>, HeadError> {
    if let Some(head) = parse_plain(buf, headers) {
        return Ok(Some(head));
    }
    parse_any(buf, headers)
}

/// Token characters (RFC 9110 §5.6.2): a method, a header name.
static TOKEN: [bool; 256] = {
    let mut token = [false; 256];
    let mut b = 0;
    while b < 256 {
        token[b] = matches!(b as u8, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
            || matches!(
                b as u8,
                b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~'
            );
        b += 1;
    }
    token
};

/// The length of the run of bytes at the start of `bytes` that `set` holds.
#[inline(always)]
fn run(bytes: &[u8], set: &[bool; 256]) -> usize {
    bytes.iter().position(|&b| !set[usize::from(b)]).unwrap_or(bytes.len())
}

/// The length of the run of visible ASCII and spaces (`0x20..=0x7e`) at the
/// start of `bytes`: eight bytes at a time for the first two words (most
/// values end within them), then thirty-two a turn while it lasts
/// ([`all_plain`]), then eight at a time to find where it ends. The load
/// test's OAuth access token (a JWT of about a kilobyte) cost the head's
/// parse about 1,200 instructions eight bytes at a time, 1,060 thirty-two
/// at a time in words and 680 in SSE2 registers (callgrind); the `head`
/// benchmark of a 1 KiB token: 197 ns in words, 143 to 153 in registers.
#[inline(always)]
fn plain_run(bytes: &[u8]) -> usize {
    let mut at = 0;
    for _ in 0..2 {
        let Some(chunk) = bytes.get(at..at + 8) else { return at + plain_tail(&bytes[at..]) };
        let first = outside(word(chunk)) & HIGH;
        if first != 0 {
            return at + (first.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(block) = bytes.get(at..at + 32) {
        if !all_plain(block.try_into().expect("thirty-two bytes")) {
            break;
        }
        at += 32;
    }
    while let Some(chunk) = bytes.get(at..at + 8) {
        let first = outside(word(chunk)) & HIGH;
        if first != 0 {
            return at + (first.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + plain_tail(&bytes[at..])
}

/// Whether all of `block` is visible ASCII and spaces: two SSE2 registers
/// on x86-64 (every x86-64 processor has SSE2), four words elsewhere.
#[inline(always)]
fn all_plain(block: &[u8; 32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        sse2::all_plain(block)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let (a, b) = (outside(word(&block[..8])), outside(word(&block[8..16])));
        let (c, d) = (outside(word(&block[16..24])), outside(word(&block[24..])));
        (a | b | c | d) & HIGH == 0
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod sse2 {
    use std::arch::x86_64::{
        _mm_add_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };

    /// [`super::all_plain`] in two registers of sixteen bytes.
    #[inline(always)]
    pub(super) fn all_plain(block: &[u8; 32]) -> bool {
        let (lo, hi) = block.split_at(16);
        // SAFETY: SSE2, all these intrinsics need, is part of every x86-64
        // target; each load reads the 16 bytes of a half of the 32-byte
        // array, and `_mm_loadu_si128` needs no alignment.
        unsafe {
            let (lo, hi) = (_mm_loadu_si128(lo.as_ptr().cast()), _mm_loadu_si128(hi.as_ptr().cast()));
            // Each byte plus one, as a signed byte: a plain byte
            // (0x20..=0x7e) becomes 0x21..=0x7f, every other byte
            // 0x80..=0xff (negative) or 0x00..=0x20; so a byte is plain
            // exactly when this is above 0x20.
            let (one, floor) = (_mm_set1_epi8(1), _mm_set1_epi8(0x21));
            let below = _mm_or_si128(
                _mm_cmplt_epi8(_mm_add_epi8(lo, one), floor),
                _mm_cmplt_epi8(_mm_add_epi8(hi, one), floor),
            );
            _mm_movemask_epi8(below) == 0
        }
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

#[inline(always)]
fn word(chunk: &[u8]) -> u64 {
    u64::from_le_bytes(chunk.try_into().expect("eight bytes"))
}

/// In each byte's high bit (the others are noise): whether it is outside
/// `0x20..=0x7e`, exactly for the first such byte. A byte below 0x20
/// borrows into its high bit (which was clear); a byte above 0x7e sets it
/// when one is added (or had it set). A borrow or carry only reaches the
/// bytes after the first such byte, so the lowest high bit set is that
/// byte's, and a word with none set has no such byte.
#[inline(always)]
fn outside(x: u64) -> u64 {
    (x.wrapping_sub(0x20 * ONES) & !x) | x.wrapping_add(ONES) | x
}

/// [`plain_run`] of fewer than eight bytes.
#[inline(always)]
fn plain_tail(bytes: &[u8]) -> usize {
    bytes.iter().position(|&b| !(0x20..=0x7e).contains(&b)).unwrap_or(bytes.len())
}

/// The common head, read in one pass (see the module docs); `None` for
/// anything else, which [`parse_any`] decides.
fn parse_plain(buf: &[u8], headers: &mut Vec<HeaderSpan>) -> Option<RequestHead> {
    headers.clear();
    let method = 0..run(buf, &TOKEN);
    if method.is_empty() || buf.get(method.end) != Some(&b' ') {
        return None;
    }
    let start = method.end + 1;
    // Visible ASCII: a target has no spaces.
    let target = start..start + buf[start..].iter().position(|&b| !(0x21..=0x7e).contains(&b)).unwrap_or(0);
    if target.is_empty() || buf.get(target.end) != Some(&b' ') {
        return None;
    }
    let mut at = target.end + 1;
    let minor = match buf.get(at..at + 10)? {
        b"HTTP/1.1\r\n" => 1,
        b"HTTP/1.0\r\n" => 0,
        _ => return None,
    };
    at += 10;
    let mut head = RequestHead {
        len: 0,
        method,
        target,
        minor,
        content_length: None,
        transfer_encoding: false,
        expect: false,
        upgrade: false,
        close: minor == 0,
        hosts: 0,
    };
    loop {
        let rest = &buf[at..];
        if rest.starts_with(b"\r\n") {
            at += 2;
            break;
        }
        let (len, known) = name_at(rest);
        let name = at..at + len;
        if name.is_empty() || buf.get(name.end) != Some(&b':') || headers.len() == MAX_HEADERS {
            return None;
        }
        at = name.end + 1;
        while let Some(b' ' | b'\t') = buf.get(at) {
            at += 1;
        }
        let end = value_end(buf, at);
        if buf.get(end..end + 2)? != b"\r\n" {
            return None;
        }
        let mut last = end;
        while last > at && matches!(buf[last - 1], b' ' | b'\t') {
            last -= 1;
        }
        let value = at..last;
        at = end + 2;
        if note(&mut head, known, &buf[value.clone()]).is_err() {
            return None;
        }
        headers.push(HeaderSpan { name, value, known });
    }
    if at > MAX_HEAD || (head.transfer_encoding && head.content_length.is_some()) {
        return None;
    }
    head.len = at;
    Some(head)
}

/// The most header lines [`parse_response_plain`] reads (more: `None`).
pub const MAX_RESPONSE_HEADERS: usize = 64;

/// A response head's status line and length, as [`parse_response_plain`]
/// read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseLine {
    /// Bytes of the head, the blank line included: the body starts here.
    pub len: usize,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub minor: u8,
    pub status: u16,
}

/// The common response head, read in one pass as [`parse_request`] reads
/// the common request head: `HTTP/1.1` or `HTTP/1.0`, a three-digit status,
/// a reason of visible ASCII and spaces, then at most
/// [`MAX_RESPONSE_HEADERS`] lines of a token name, a colon and a value of
/// visible ASCII, spaces and tabs not ending in white space, every line
/// ended by CRLF. Each line's name, if it is one [`Known`], and its value
/// (without the white space before it) are given to `line`, in order.
/// `None` for a partial head and anything else, which the caller reads with
/// httparse (after throwing away what `line` was given): what this accepts,
/// httparse reads the same.
pub fn parse_response_plain(buf: &[u8], mut line: impl FnMut(Option<Known>, &[u8])) -> Option<ResponseLine> {
    let minor = match buf.get(..9)? {
        b"HTTP/1.1 " => 1,
        b"HTTP/1.0 " => 0,
        _ => return None,
    };
    let code = buf.get(9..12)?;
    if !code.iter().all(u8::is_ascii_digit) || buf.get(12) != Some(&b' ') {
        return None;
    }
    let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    let mut at = 13 + plain_run(&buf[13..]);
    if buf.get(at..at + 2)? != b"\r\n" {
        return None;
    }
    at += 2;
    let mut lines = 0;
    loop {
        let rest = &buf[at..];
        if rest.starts_with(b"\r\n") {
            at += 2;
            break;
        }
        let (len, known) = name_at(rest);
        let name = at..at + len;
        if name.is_empty() || buf.get(name.end) != Some(&b':') || lines == MAX_RESPONSE_HEADERS {
            return None;
        }
        at = name.end + 1;
        while let Some(b' ' | b'\t') = buf.get(at) {
            at += 1;
        }
        let end = value_end(buf, at);
        if buf.get(end..end + 2)? != b"\r\n" || (end > at && matches!(buf[end - 1], b' ' | b'\t')) {
            return None;
        }
        line(known, &buf[at..end]);
        lines += 1;
        at = end + 2;
    }
    Some(ResponseLine { len: at, minor, status })
}

/// Where the run of a value's bytes (visible ASCII, spaces and tabs) that
/// starts at `at` ends.
#[inline(always)]
fn value_end(buf: &[u8], at: usize) -> usize {
    let mut end = at;
    // Tabs are taken a byte at a time (they are rare).
    loop {
        end += plain_run(&buf[end..]);
        if buf.get(end) != Some(&b'\t') {
            return end;
        }
        end += 1;
    }
}

/// What a header line tells of the request's framing and connection,
/// noted in `head`: `Err` for a line that makes the framing ambiguous.
#[inline(always)]
fn note(head: &mut RequestHead, name: Option<Known>, value: &[u8]) -> Result<(), HeadError> {
    match name {
        Some(Known::ContentLength) => {
            if head.content_length.is_some() {
                return Err(HeadError::RepeatedLength);
            }
            head.content_length = Some(decimal(value).ok_or(HeadError::BadLength)?);
        }
        Some(Known::TransferEncoding) => head.transfer_encoding = true,
        Some(Known::Host) => head.hosts += 1,
        Some(Known::Expect) => head.expect = true,
        Some(Known::Upgrade) => head.upgrade = true,
        Some(Known::Connection) => {
            for token in value.split(|&b| b == b',').map(trim) {
                if token.eq_ignore_ascii_case(b"close") {
                    head.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && head.minor == 0 {
                    head.close = false;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Any head, read by httparse.
fn parse_any(buf: &[u8], headers: &mut Vec<HeaderSpan>) -> Result<Option<RequestHead>, HeadError> {
    headers.clear();
    // Left uninitialised: 100 empty headers would be written on every parse.
    let mut lines = [std::mem::MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(buf, &mut lines) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(httparse::Error::Version) => return Err(HeadError::Version),
        Err(e) => return Err(HeadError::Malformed(malformed(e))),
    };
    if len > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let span = |part: &[u8]| {
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + part.len()
    };
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version) else {
        return Err(HeadError::Malformed("incomplete request line"));
    };
    let mut head = RequestHead {
        len,
        method: span(method.as_bytes()),
        target: span(target.as_bytes()),
        minor,
        content_length: None,
        transfer_encoding: false,
        expect: false,
        upgrade: false,
        close: minor == 0,
        hosts: 0,
    };
    for line in request.headers.iter() {
        let name = line.name.as_bytes();
        let value = trim(line.value);
        let known = Known::of(name);
        headers.push(HeaderSpan { name: span(name), value: span(value), known });
        note(&mut head, known, value)?;
    }
    if head.transfer_encoding && head.content_length.is_some() {
        return Err(HeadError::LengthAndTransferEncoding);
    }
    Ok(Some(head))
}

fn malformed(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid method or target",
        _ => "invalid request line",
    }
}

fn trim(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// A plain decimal number (1 to 19 digits, no sign, no white space).
fn decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The reason phrase of a status code the router sends (empty for others:
/// a client must not depend on it).
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        421 => "Misdirected Request",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// How a response's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length`.
    Length(usize),
    /// `Transfer-Encoding: chunked` (a stream).
    Chunked,
}

/// Writes a response head to `out`: the status line, `headers` (names and
/// values as given; `Content-Length`, `Transfer-Encoding` and `Connection`
/// among them are left out, the framing and `close` decide those), `Date`,
/// the framing, and `Connection: close` when the connection ends after it.
pub fn write_response_head<'h>(
    out: &mut Vec<u8>,
    status: u16,
    headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
    date: &[u8],
    framing: Framing,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(digits(status as u64, &mut [0; 20]));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"connection")
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n");
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(digits(n as u64, &mut [0; 20]));
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the head of one chunk of `len` bytes (`len` 0: the last chunk,
/// with the blank line that ends the body).
pub fn write_chunk_head(out: &mut Vec<u8>, len: usize) {
    if len == 0 {
        out.extend_from_slice(b"0\r\n\r\n");
        return;
    }
    let mut digits = [0u8; 16];
    let mut n = len;
    let mut at = digits.len();
    while n > 0 {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written at the end of `buf`: the digits.
pub fn digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// An HTTP date (RFC 9110 §5.6.7, IMF-fixdate) for `unix_seconds`:
/// `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(unix_seconds: u64) -> [u8; 29] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] =
        [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
    let days = unix_seconds / 86_400;
    let seconds = unix_seconds % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as usize;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as u64;
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    out[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    let two = |n: u64| [b'0' + (n / 10 % 10) as u8, b'0' + (n % 10) as u8];
    out[5..7].copy_from_slice(&two(u64::from(day)));
    out[8..11].copy_from_slice(MONTHS[month - 1]);
    out[12..14].copy_from_slice(&two(year / 100));
    out[14..16].copy_from_slice(&two(year % 100));
    out[17..19].copy_from_slice(&two(seconds / 3_600));
    out[20..22].copy_from_slice(&two(seconds / 60 % 60));
    out[23..25].copy_from_slice(&two(seconds % 60));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_decimal() {
        assert_eq!(digits(0, &mut [0; 20]), b"0");
        assert_eq!(digits(1234567, &mut [0; 20]), b"1234567");
        assert_eq!(digits(u64::MAX, &mut [0; 20]), u64::MAX.to_string().as_bytes());
    }

    fn parse(text: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        parse_request(text, &mut Vec::new())
    }

    #[test]
    fn a_post_with_a_length_is_read_into_spans() {
        let text =
            b"POST /mcp?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length:  12 \r\nMcp-Session-Id: s1\r\n\r\n{\"jsonrpc\":1}";
        let mut headers = Vec::new();
        let head = parse_request(text, &mut headers).unwrap().unwrap();
        assert_eq!(&text[head.method.clone()], b"POST");
        assert_eq!(&text[head.target.clone()], b"/mcp?x=1");
        assert_eq!((head.minor, head.content_length, head.hosts, head.close), (1, Some(12), 1, false));
        assert_eq!(&text[head.len..], b"{\"jsonrpc\":1}");
        assert_eq!(headers.len(), 3);
        assert_eq!(&text[headers[1].value.clone()], b"12");
        assert_eq!(&text[headers[2].name.clone()], b"Mcp-Session-Id");
        assert_eq!(parse(&text[..20]), Ok(None), "incomplete");
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let refused = |head: &str| parse(head.as_bytes()).unwrap_err();
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
            HeadError::RepeatedLength
        );
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            HeadError::RepeatedLength
        );
        assert_eq!(refused("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"), HeadError::BadLength);
        assert_eq!(refused("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n"), HeadError::BadLength);
        assert_eq!(refused("POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n"), HeadError::BadLength);
        assert_eq!(refused("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"), HeadError::BadLength);
        assert_eq!(
            refused("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"),
            HeadError::LengthAndTransferEncoding
        );
        // Obsolete line folding, a bare CR, white space before the colon, NUL.
        assert!(matches!(
            refused("POST / HTTP/1.1\r\nX: a\r\n b\r\nContent-Length: 5\r\n\r\n"),
            HeadError::Malformed(_)
        ));
        assert!(matches!(refused("POST / HTTP/1.1\r\nX: a\rContent-Length: 5\r\n\r\n"), HeadError::Malformed(_)));
        assert!(matches!(refused("POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n"), HeadError::Malformed(_)));
        assert!(matches!(refused("POST / HTTP/1.1\r\nX: a\0b\r\n\r\n"), HeadError::Malformed(_)));
        assert_eq!(refused("POST / HTTP/2.0\r\n\r\n"), HeadError::Version);
        // Chunked alone is fine: it is simply not this path's.
        let head = parse(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap().unwrap();
        assert!(head.transfer_encoding && head.content_length.is_none());
    }

    /// What the narrow pass reads, httparse reads the same: `None` from
    /// it is always allowed (httparse then decides), a head never differs.
    fn agree(bytes: &[u8]) -> bool {
        let (mut plain, mut any) = (Vec::new(), Vec::new());
        let Some(head) = parse_plain(bytes, &mut plain) else {
            return false;
        };
        assert_eq!(parse_any(bytes, &mut any), Ok(Some(head)), "{:?}", String::from_utf8_lossy(bytes));
        assert_eq!(plain, any, "{:?}", String::from_utf8_lossy(bytes));
        true
    }

    #[test]
    fn known_names_are_told_in_any_case_and_only_whole() {
        for (i, known) in Known::ALL.into_iter().enumerate() {
            assert_eq!(known as usize, i, "ALL is in order");
            let lower = known.text();
            // Each name is spelt as its variant says (`McpSessionId`:
            // `mcp-session-id`).
            let mut spelt = String::new();
            for (j, c) in format!("{known:?}").chars().enumerate() {
                if c.is_ascii_uppercase() && j > 0 {
                    spelt.push('-');
                }
                spelt.push(c.to_ascii_lowercase());
            }
            assert_eq!(lower, spelt.as_bytes());
            assert_eq!(Known::of(lower), Some(known));
            let upper = lower.to_ascii_uppercase();
            assert_eq!(Known::of(&upper), Some(known));
            let line = [&upper[..], b": value of some length\r\n"].concat();
            assert_eq!(Known::at_start_of(&line), Some((known, lower.len())));
            assert_eq!(name_at(&line), (lower.len(), Some(known)));
            // One byte changed anywhere (a neighbour in case folding, a
            // control byte), a byte more or less: another name.
            for at in 0..lower.len() {
                for other in [lower[at] ^ 0x01, lower[at] ^ 0x40, b'\r', 0x0d ^ 0x20, b'_'] {
                    let mut changed = line.clone();
                    changed[at] = other;
                    if changed[at].eq_ignore_ascii_case(&lower[at]) {
                        continue;
                    }
                    assert_eq!(Known::at_start_of(&changed), None, "{:?}", String::from_utf8_lossy(&changed));
                    assert_ne!(name_at(&changed).1, Some(known));
                }
            }
            assert_eq!(Known::of(&lower[..lower.len() - 1]), None);
            assert_eq!(Known::of(&[lower, b"x"].concat()), None);
            let longer = [lower, b"x: v\r\n\r\n...........\r\n"].concat();
            assert_eq!(Known::at_start_of(&longer), None);
            assert_eq!(name_at(&longer), (lower.len() + 1, None));
        }
        // Names of other lengths (and `x-api-key`, nine bytes) near the end
        // of what was read: told by the byte walk.
        assert_eq!(name_at(b"Host:"), (4, Some(Known::Host)));
        assert_eq!(name_at(b"x-api-key:"), (9, Some(Known::XApiKey)));
    }

    #[test]
    fn plain_runs_stop_at_the_first_byte_outside_them() {
        // Every byte in every place of runs of every length up to 90 (in
        // the first two words, in a block of four after them, in a word
        // after the blocks, in the bytes after the last word).
        for b in 0..=255u8 {
            for at in 0..90 {
                let mut bytes = [b'a'; 90];
                bytes[at] = b;
                let plain = (0x20..=0x7e).contains(&b);
                for len in 0..=90 {
                    let run = if plain || at >= len { len } else { at };
                    assert_eq!(plain_run(&bytes[..len]), run, "{b:#x} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn the_common_head_takes_the_narrow_pass() {
        let common = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept-Encoding: identity\r\n\
            Content-Length: 105\r\nContent-Type: application/json\r\n\
            Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-11-25\r\n\
            Mcp-Session-Id: 0f5b3c1e-9a4d-4b8e-a1f2-6c7d8e9f0a1b\r\n\r\n{}";
        assert!(agree(common));
        assert!(agree(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nX:\r\nY: \t a\tb \t\r\n\r\n"));
        // Left to httparse: a bare LF, obs-text, a leading empty line, a
        // partial head, and every framing it refuses.
        for other in [
            &b"POST / HTTP/1.1\nHost: a\n\n"[..],
            b"POST / HTTP/1.1\r\nX: \xe9\r\n\r\n",
            b"\r\nPOST / HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        ] {
            assert!(!agree(other), "{:?}", String::from_utf8_lossy(other));
        }
    }

    /// One of `right` nine times in ten, else one of `wrong`.
    fn pick(
        right: &'static [&'static [u8]],
        wrong: &'static [&'static [u8]],
    ) -> impl proptest::strategy::Strategy<Value = &'static [u8]> + Clone {
        use proptest::prelude::*;
        use proptest::sample::select;
        prop_oneof![9 => select(right), 1 => select(wrong)]
    }

    type Pieces = (&'static [&'static [u8]], &'static [&'static [u8]]);

    const NAMES: Pieces = (
        &[
            b"Host",
            b"content-LENGTH",
            b"Transfer-Encoding",
            b"Connection",
            b"Expect",
            b"Upgrade",
            b"X-a",
            b"Mcp-Session-Id",
            b"!#$%&'*+-.^_`|~",
        ],
        &[b"X a", b"", b" X", b"X(", b"\xc3\xa9"],
    );
    const COLONS: Pieces = (&[b":", b": ", b":  ", b":\t", b": \t "], &[b" :", b"", b"::"]);
    const VALUES: Pieces = (
        &[
            b"12",
            b"0",
            b"chunked",
            b"close",
            b"keep-alive, Close",
            b"a b",
            b" ",
            b"\t",
            b"application/json, text/event-stream",
            b"\"quoted\\\"\"",
        ],
        &[b"+1", b"1,1", b"\x7f", b"\x80", b"\0", b"\r", b"\n ", b"\x0b"],
    );
    const ENDS: Pieces = (&[b"\r\n"], &[b"\n", b"\r", b"\r\r\n", b"\n\r"]);

    /// Header lines built of parts that are mostly right (nine times in
    /// ten) and sometimes slightly wrong, after `first` (a request or
    /// status line), then a last line end and a body; one in ten cut
    /// anywhere.
    fn near(
        first: impl proptest::strategy::Strategy<Value = Vec<u8>>,
    ) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let value = prop::collection::vec(pick(VALUES.0, VALUES.1), 0..3);
        let line = (pick(NAMES.0, NAMES.1), pick(COLONS.0, COLONS.1), value, pick(ENDS.0, ENDS.1));
        (first, prop::collection::vec(line, 0..8), pick(ENDS.0, ENDS.1), 0..10usize, any::<prop::sample::Index>())
            .prop_map(|(mut bytes, lines, end, chance, cut)| {
                for (name, colon, values, end) in lines {
                    bytes.extend_from_slice(name);
                    bytes.extend_from_slice(colon);
                    bytes.extend(values.concat());
                    bytes.extend_from_slice(end);
                }
                bytes.extend_from_slice(end);
                bytes.extend_from_slice(b"{}");
                if chance == 0 {
                    bytes.truncate(cut.index(bytes.len()));
                }
                bytes
            })
    }

    /// Near-requests.
    fn near_head() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let method = pick(&[b"POST", b"GET", b"M-SEARCH"], &[b"P(ST", b"", b"\r\nPOST"]);
        let target = pick(&[b"/mcp", b"/a?b=c%20d", b"*"], &[b"/m cp", b"/\x80", b""]);
        let version = pick(
            &[b" HTTP/1.1\r\n", b" HTTP/1.0\r\n"],
            &[b" HTTP/2.0\r\n", b"  HTTP/1.1\r\n", b" HTTP/1.1\n", b" http/1.1\r\n", b" HTTP/1.1"],
        );
        near((method, target, version).prop_map(|(method, target, version)| [method, b" ", target, version].concat()))
    }

    /// Near-responses.
    fn near_response() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let line = pick(
            &[b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 404 Not Found\r\n", b"HTTP/1.1 101 \r\n"],
            &[
                b"HTTP/1.1 200\r\n",
                b"HTTP/1.1 20 OK\r\n",
                b"HTTP/2 200 OK\r\n",
                b"HTTP/1.1 200 O\x80K\r\n",
                b"HTTP/1.1 200 OK\n",
            ],
        );
        near(line.prop_map(<[u8]>::to_vec))
    }

    proptest::proptest! {
        #[test]
        fn the_narrow_pass_agrees_with_httparse_on_near_heads(bytes in near_head()) {
            agree(&bytes);
        }

        #[test]
        fn the_narrow_passes_agree_with_httparse_on_any_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            agree(&bytes);
            response_agrees(&bytes);
            agree(&[&b"POST / HTTP/1.1\r\nX: "[..], &bytes].concat());
            response_agrees(&[&b"HTTP/1.1 200 OK\r\nX: "[..], &bytes].concat());
        }

        #[test]
        fn the_narrow_pass_agrees_with_httparse_on_near_responses(bytes in near_response()) {
            response_agrees(&bytes);
        }
    }

    /// What the narrow pass reads of a response, httparse reads the same.
    fn response_agrees(bytes: &[u8]) -> bool {
        let mut plain = Vec::new();
        let Some(head) = parse_response_plain(bytes, |known, v| plain.push((known, v.to_vec()))) else {
            return false;
        };
        let mut storage = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
        let mut parsed = httparse::Response::new(&mut storage);
        let text = String::from_utf8_lossy(bytes);
        assert_eq!(parsed.parse(bytes), Ok(httparse::Status::Complete(head.len)), "{text:?}");
        assert_eq!((parsed.version, parsed.code), (Some(head.minor), Some(head.status)), "{text:?}");
        let any: Vec<_> = parsed.headers.iter().map(|h| (Known::of(h.name.as_bytes()), h.value.to_vec())).collect();
        assert_eq!(plain, any, "{text:?}");
        true
    }

    #[test]
    fn the_common_response_takes_the_narrow_pass() {
        assert!(response_agrees(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 82\r\n\
              date: Sun, 29 Nov 2026 07:14:06 GMT\r\n\r\n{}"
        ));
        assert!(response_agrees(b"HTTP/1.0 599 \r\nX:\r\nY:   \r\nZ: a\tb\r\n\r\n"));
        for other in [
            &b"HTTP/1.1 200 OK\nX: a\n\n"[..],
            b"HTTP/1.1 200\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a \r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: \xe9\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\r\n",
        ] {
            assert!(!response_agrees(other), "{:?}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn heads_are_bounded() {
        let mut long = b"POST / HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse(&long), Err(HeadError::TooLarge));
        let many = format!("POST / HTTP/1.1\r\n{}\r\n", "X: a\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(parse(many.as_bytes()), Err(HeadError::TooManyHeaders));
        assert_eq!(HeadError::TooManyHeaders.status(), 431);
    }

    #[test]
    fn connection_close_and_http_1_0() {
        let head = |t: &str| parse(t.as_bytes()).unwrap().unwrap();
        assert!(head("POST / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").close);
        assert!(head("POST / HTTP/1.0\r\n\r\n").close);
        assert!(!head("POST / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").close);
        assert!(head("POST / HTTP/1.1\r\nExpect: 100-continue\r\nUpgrade: h2c\r\n\r\n").expect);
    }

    #[test]
    fn response_heads() {
        let mut out = Vec::new();
        let headers = [(&b"content-type"[..], &b"application/json"[..]), (b"content-length", b"99")];
        write_response_head(
            &mut out,
            200,
            headers.into_iter(),
            b"Thu, 01 Jan 1970 00:00:00 GMT",
            Framing::Length(7),
            false,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\ncontent-length: 7\r\n\r\n"
        );
        let mut out = Vec::new();
        write_response_head(&mut out, 599, std::iter::empty(), b"d", Framing::Chunked, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 599 \r\ndate: d\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        let mut out = Vec::new();
        write_chunk_head(&mut out, 0x1a2f);
        write_chunk_head(&mut out, 0);
        assert_eq!(out, b"1a2f\r\n0\r\n\r\n");
    }

    #[test]
    fn http_dates() {
        assert_eq!(&http_date(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&http_date(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&http_date(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&http_date(1_795_737_599), b"Thu, 26 Nov 2026 23:59:59 GMT");
    }
}
