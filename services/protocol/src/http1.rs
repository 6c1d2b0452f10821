//! HTTP/1.1 request heads and response heads, for the router's own path
//! for its hot request (a `POST` to the MCP endpoint with a
//! `Content-Length` body). Everything else (HTTP/2, `GET` streams,
//! chunked bodies, `Expect`, upgrades) stays with hyper; this module only
//! says which is which, and refuses what must not be guessed at.
//!
//! A head is parsed with `httparse` straight from the connection's buffer
//! into spans of it (nothing is copied). What makes a request's framing
//! ambiguous is refused, never resolved (RFC 9112 §6.3, request
//! smuggling): a `Content-Length` that is not one plain decimal number, or
//! is given twice, or beside `Transfer-Encoding`. `httparse` itself
//! refuses obsolete line folding, a bare CR, white space before a header
//! name's colon and control characters in values.

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
    let mut lengths = 0;
    for line in request.headers.iter() {
        let name = line.name.as_bytes();
        let value = trim(line.value);
        headers.push(HeaderSpan { name: span(name), value: span(value) });
        if name.eq_ignore_ascii_case(b"content-length") {
            lengths += 1;
            if lengths > 1 {
                return Err(HeadError::RepeatedLength);
            }
            head.content_length = Some(decimal(value).ok_or(HeadError::BadLength)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            head.transfer_encoding = true;
        } else if name.eq_ignore_ascii_case(b"host") {
            head.hosts += 1;
        } else if name.eq_ignore_ascii_case(b"expect") {
            head.expect = true;
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            head.upgrade = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',').map(trim) {
                if token.eq_ignore_ascii_case(b"close") {
                    head.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && minor == 0 {
                    head.close = false;
                }
            }
        }
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
