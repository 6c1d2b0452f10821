//! Property tests (fuzzing) of the HTTP/1.1 request head parser that the
//! router's own path for its hot `POST` reads every client's bytes with
//! (`switchboard_protocol::http1`).
//!
//! - On any bytes it never panics, and what it accepts lies within the
//!   bytes it was given.
//! - A well-formed head (any token method, target, header names and values
//!   of the characters HTTP allows, a `Content-Length` or none) is read
//!   back exactly: every header's name and value as written (values
//!   without surrounding white space), the length as given, the body
//!   starting right after the blank line. Every prefix of it is
//!   "incomplete", never a different head: the connection waits for more.
//! - Every way of making its framing ambiguous is refused, whatever else
//!   the head holds: a second `Content-Length` (equal or not), one beside
//!   `Transfer-Encoding`, one that is not a plain decimal number, a header
//!   line folded onto the next (obs-fold), a bare CR in place of a line
//!   end, white space before a header name's colon.
//!
//! CI runs the default number of cases (a few seconds);
//! `PROPTEST_CASES=1000000 cargo test --release -p switchboard-protocol
//! --test http1_fuzz` is the longer run.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use switchboard_protocol::http1::{parse_request, HeadError, RequestHead};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

fn parse(bytes: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    parse_request(bytes, &mut Vec::new())
}

/// A header name: a token, not one of those that decide framing.
fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}".prop_filter("framing headers are placed on purpose", |n| {
        let n = n.to_ascii_lowercase();
        n != "content-length" && n != "transfer-encoding"
    })
}

/// A header value: visible ASCII, spaces and tabs inside, obs-text.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[!-~]([ \t!-~]{0,30}[!-~])?".prop_map(String::into_bytes),
        Just(Vec::new()),
        prop::collection::vec(0x80u8..=0xff, 1..8),
    ]
}

/// White space around a value, as senders write it.
fn ows() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just(""), Just(" "), Just("  "), Just("\t"), Just(" \t ")]
}

/// A well-formed head: its text, the headers as written (name, value),
/// and its Content-Length.
type Head = (Vec<u8>, Vec<(String, Vec<u8>)>, Option<u64>);

fn head() -> impl Strategy<Value = Head> {
    head_of(0..12, prop::option::of(any::<u32>()))
}

/// A well-formed head with this many header lines besides its
/// `Content-Length`, and that length. Tests that need a kind of head ask for
/// it here rather than filter `head()`: a long run rejects too many cases.
fn head_of(lines: std::ops::Range<usize>, length: impl Strategy<Value = Option<u32>>) -> impl Strategy<Value = Head> {
    (
        "[A-Z]{1,7}",
        "/[A-Za-z0-9/._~?=&%-]{0,40}",
        prop::collection::vec((name(), ows(), value(), ows()), lines),
        length,
        any::<prop::sample::Index>(),
        prop::bool::ANY,
    )
        .prop_map(|(method, target, lines, length, at, bare_lf)| {
            let eol: &[u8] = if bare_lf { b"\n" } else { b"\r\n" };
            let mut headers: Vec<(String, Vec<u8>, &str, &str)> =
                lines.into_iter().map(|(n, before, v, after)| (n, v, before, after)).collect();
            if let Some(n) = length {
                let i = at.index(headers.len() + 1);
                headers.insert(i, ("Content-Length".to_owned(), n.to_string().into_bytes(), " ", ""));
            }
            let mut text = format!("{method} {target} HTTP/1.1").into_bytes();
            text.extend_from_slice(eol);
            for (n, v, before, after) in &headers {
                text.extend_from_slice(n.as_bytes());
                text.push(b':');
                text.extend_from_slice(before.as_bytes());
                text.extend_from_slice(v);
                text.extend_from_slice(after.as_bytes());
                text.extend_from_slice(eol);
            }
            text.extend_from_slice(eol);
            let written = headers.into_iter().map(|(n, v, _, _)| (n, v)).collect();
            (text, written, length.map(u64::from))
        })
}

/// Puts `line` (a header line, without its end) right after the request
/// line of `text`.
fn with_line(text: &[u8], line: &[u8]) -> Vec<u8> {
    let end = text.iter().position(|&b| b == b'\n').unwrap() + 1;
    let mut out = text[..end].to_vec();
    out.extend_from_slice(line);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&text[end..]);
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_bytes_are_refused_or_read_within_themselves(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut spans = Vec::new();
        if let Ok(Some(head)) = parse_request(&bytes, &mut spans) {
            prop_assert!(head.len <= bytes.len());
            prop_assert!(head.method.end <= head.len && head.target.end <= head.len);
            for span in &spans {
                prop_assert!(span.name.end <= head.len && span.value.end <= head.len);
            }
        }
    }

    #[test]
    fn a_well_formed_head_is_read_back_exactly(
        (text, written, length) in head(),
        body in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut bytes = text.clone();
        bytes.extend_from_slice(&body);
        let mut spans = Vec::new();
        let head = parse_request(&bytes, &mut spans).unwrap().expect("complete");
        prop_assert_eq!(head.len, text.len());
        prop_assert_eq!(&bytes[head.len..], &body[..]);
        prop_assert_eq!(head.content_length, length);
        prop_assert_eq!(spans.len(), written.len());
        for (span, (name, value)) in spans.iter().zip(&written) {
            prop_assert_eq!(&bytes[span.name.clone()], name.as_bytes());
            let trimmed = value.trim_ascii();
            prop_assert_eq!(&bytes[span.value.clone()], trimmed);
        }
        // Every prefix is incomplete: never a different head.
        for cut in 0..text.len() {
            prop_assert_eq!(parse(&text[..cut]), Ok(None), "prefix of {} bytes", cut);
        }
    }

    #[test]
    fn a_second_length_is_refused(
        (text, _, length) in head(),
        second in prop_oneof![any::<u32>().prop_map(|n| n.to_string()), Just("0".to_owned())],
        same in prop::bool::ANY,
    ) {
        let first = length.map_or_else(|| "7".to_owned(), |n| n.to_string());
        let text = if length.is_some() { text } else { with_line(&text, format!("Content-Length: {first}").as_bytes()) };
        let second = if same { first } else { second };
        let doubled = with_line(&text, format!("content-length: {second}").as_bytes());
        prop_assert_eq!(parse(&doubled), Err(HeadError::RepeatedLength));
    }

    #[test]
    fn a_length_beside_transfer_encoding_is_refused(
        (text, _, length) in head(),
        coding in prop_oneof![Just("chunked"), Just("gzip, chunked"), Just("identity"), Just("")],
    ) {
        let text = if length.is_some() { text } else { with_line(&text, b"Content-Length: 5") };
        let both = with_line(&text, format!("Transfer-Encoding: {coding}").as_bytes());
        prop_assert_eq!(parse(&both), Err(HeadError::LengthAndTransferEncoding));
    }

    #[test]
    fn a_length_that_is_not_a_plain_number_is_refused(
        (text, _, _) in head_of(0..12, Just(None)),
        bad in prop_oneof![
            Just("+5".to_owned()), Just("-5".to_owned()), Just("5, 5".to_owned()), Just("0x10".to_owned()),
            Just("5 5".to_owned()), Just("".to_owned()), Just("1e3".to_owned()), Just("٣".to_owned()),
            "[0-9]{20,24}",
        ],
    ) {
        let line = format!("Content-Length: {bad}");
        let refused = parse(&with_line(&text, line.as_bytes()));
        prop_assert!(matches!(refused, Err(HeadError::BadLength | HeadError::Malformed(_))), "{:?}", refused);
    }

    #[test]
    fn folded_lines_bare_crs_and_spaced_colons_are_refused(
        (text, _, length) in head_of(1..12, prop::option::of(any::<u32>())),
        which in 0..3usize,
        fold in prop_oneof![Just(" "), Just("\t")],
    ) {
        // The first header line's end.
        let start = text.iter().position(|&b| b == b'\n').unwrap() + 1;
        let eol = start + text[start..].iter().position(|&b| b == b'\n').unwrap();
        let crlf = text[eol - 1] == b'\r';
        let mut bad = text.clone();
        match which {
            // obs-fold: the line goes on, on the next one.
            0 => {
                let mut folded = format!("\r\n{fold}continued").into_bytes();
                if !crlf {
                    folded.remove(0);
                }
                let at = if crlf { eol - 1 } else { eol };
                bad.splice(at..at, folded);
            }
            // A bare CR in the line (a line end to some, not to others).
            1 => {
                let at = if crlf { eol - 1 } else { eol };
                bad.splice(at..at, *b"\rX-Smuggled: 1");
            }
            // White space between the name and its colon.
            _ => {
                let colon = start + text[start..].iter().position(|&b| b == b':').unwrap();
                bad.insert(colon, b' ');
            }
        }
        let refused = parse(&bad);
        prop_assert!(matches!(refused, Err(HeadError::Malformed(_))), "{:?} for {:?} (length {:?})",
            refused, String::from_utf8_lossy(&bad), length);
    }
}
