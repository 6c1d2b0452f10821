//! Property tests (fuzzing) of the two parsers every client and upstream
//! message goes through: the JSON-RPC envelope parser and the SSE decoder.
//!
//! - The envelope parser never panics, on any bytes; on JSON-RPC-shaped
//!   objects (members repeated, ids of every JSON form, escapes, odd
//!   whitespace) what it accepts is valid JSON, its id is the id member
//!   byte for byte, its method the method member decoded, and a member it
//!   routes by is never taken from one of two copies.
//! - The SSE decoder gives back exactly the events written, however the
//!   stream is cut into reads and whichever line endings it uses; on any
//!   bytes it never panics and never buffers past its limit.
//!
//! CI runs the default number of cases (the smoke form, a few seconds);
//! `PROPTEST_CASES=200000 cargo test --release -p switchboard-protocol
//! --test mcp_fuzz` is the longer run (docs/testing.md).

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use switchboard_protocol::jsonrpc::{Envelope, MessageKind};
use switchboard_protocol::sse::{DecodeError, Decoder, Event};

/// An id: a number in any form JSON allows, or a string.
fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("-0".to_owned()),
        Just("1.0".to_owned()),
        Just("1E2".to_owned()),
        Just("2.5e-3".to_owned()),
        Just("123456789012345678901".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z/._é€ -]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just(r#""a\"b\\c\u00e9""#.to_owned()),
    ]
}

/// The JSON text of a member value.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        // Ids, other numbers and strings (escapes, multi-byte characters).
        4 => id(),
        1 => Just(r#""tools\/call""#.to_owned()),
        1 => Just(r#""2.0""#.to_owned()),
        1 => Just("null".to_owned()),
        1 => Just("true".to_owned()),
        1 => Just("{}".to_owned()),
        1 => Just(r#"{"name":"x","arguments":{"a":[1,{"b":null}]}}"#.to_owned()),
        1 => Just("[1,2]".to_owned()),
        // Not JSON at all.
        1 => Just("tru".to_owned()),
        1 => Just(r#""unterminated"#.to_owned()),
        1 => Just("01".to_owned()),
    ]
}

fn member() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof![
            Just("jsonrpc"),
            Just("id"),
            Just("method"),
            Just("params"),
            Just("result"),
            Just("error"),
            Just("x"),
            Just("i\\u0064"),
        ],
        prop_oneof![3 => value(), 1 => Just(r#""2.0""#.to_owned())],
    )
        .prop_map(|(k, v)| (k.to_owned(), v))
}

fn whitespace() -> impl Strategy<Value = String> {
    "[ \t\r\n]{0,2}"
}

/// An object of `members`, with whitespace between tokens.
fn object(members: &[(String, String)], gaps: &[String]) -> String {
    let gap = |i: usize| gaps.get(i % gaps.len().max(1)).cloned().unwrap_or_default();
    let mut text = format!("{}{{", gap(0));
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&format!("{}\"{k}\"{}:{}{v}{}", gap(i + 1), gap(i + 2), gap(i + 3), gap(i + 4)));
    }
    text.push_str(&format!("}}{}", gap(members.len() + 5)));
    text
}

/// The SSE line endings.
const ENDINGS: [&str; 3] = ["\n", "\r\n", "\r"];

#[derive(Debug, Clone)]
enum Field {
    Data(String),
    Id(String),
    Event(String),
    Retry(u32),
    Comment(String),
}

fn field() -> impl Strategy<Value = Field> {
    let text = "[a-z0-9 :{}\"é€-]{0,10}";
    prop_oneof![
        4 => text.prop_map(Field::Data),
        1 => "[a-z0-9-]{0,6}".prop_map(Field::Id),
        1 => "[a-z]{1,6}".prop_map(Field::Event),
        1 => any::<u32>().prop_map(Field::Retry),
        1 => text.prop_map(Field::Comment),
    ]
}

/// The wire form of events (each a list of fields, at least one not a
/// comment), and the events a decoder must give back.
fn sse_wire(events: &[Vec<Field>], endings: &[usize]) -> (Vec<u8>, Vec<Event>) {
    let mut wire = String::new();
    let mut expected = Vec::new();
    let mut n = 0;
    let mut end = |wire: &String, line_is_empty: bool| {
        n += 1;
        let ending = ENDINGS[endings.get(n % endings.len().max(1)).copied().unwrap_or(0) % 3];
        // CR then an empty line ended by LF would read as one CRLF.
        if line_is_empty && ending == "\n" && wire.ends_with('\r') {
            "\r\n"
        } else {
            ending
        }
    };
    for fields in events {
        let mut event = Event::default();
        let mut data: Vec<&str> = Vec::new();
        for f in fields {
            let line = match f {
                Field::Data(d) => {
                    data.push(d);
                    format!("data: {d}")
                }
                Field::Id(id) => {
                    event.id = Some(id.clone());
                    format!("id: {id}")
                }
                Field::Event(e) => {
                    event.event = Some(e.clone());
                    format!("event: {e}")
                }
                Field::Retry(ms) => {
                    event.retry = Some(u64::from(*ms));
                    format!("retry: {ms}")
                }
                Field::Comment(c) => format!(":{c}"),
            };
            wire.push_str(&line);
            let ending = end(&wire, line.is_empty());
            wire.push_str(ending);
        }
        let ending = end(&wire, true);
        wire.push_str(ending);
        event.data = data.join("\n").into_bytes().into();
        if fields.iter().any(|f| !matches!(f, Field::Comment(_))) {
            expected.push(event);
        }
    }
    // A lone CR at the very end waits for a LF that may follow.
    if wire.ends_with('\r') {
        wire.push('\n');
    }
    (wire.into_bytes(), expected)
}

/// Feeds `bytes` to a decoder in reads cut at `cuts`, taking events as
/// they come.
fn decode(bytes: &[u8], cuts: &[usize], max: usize) -> (Vec<Event>, Option<DecodeError>) {
    let mut decoder = Decoder::new(max);
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(bytes.len());
    points.sort_unstable();
    let mut events = Vec::new();
    let mut from = 0;
    for to in points {
        decoder.push(&bytes[from..to]);
        from = to;
        loop {
            match decoder.next_event() {
                Ok(Some(event)) => events.push(event),
                Ok(None) => break,
                Err(e) => return (events, Some(e)),
            }
        }
    }
    (events, None)
}

fn check_envelope(text: &str, members: &[(String, String)]) -> Result<(), TestCaseError> {
    let parsed = Envelope::parse(text.as_bytes());
    let valid_json = serde_json::from_str::<serde_json::Value>(text).is_ok();
    let Ok(env) = parsed else { return Ok(()) };
    prop_assert!(valid_json, "accepted something that is not JSON: {text}");
    // Member names as JSON decodes them (`i\u0064` is `id`).
    let named = |name: &str| -> Vec<&String> {
        members
            .iter()
            .filter(|(k, _)| serde_json::from_str::<String>(&format!("\"{k}\"")).is_ok_and(|k| k == name))
            .map(|(_, v)| v)
            .collect()
    };
    for routed in ["id", "method", "params"] {
        prop_assert!(named(routed).len() <= 1, "{routed} repeated, yet accepted: {text}");
    }
    match (env.id, named("id").first()) {
        (Some(id), Some(written)) => prop_assert_eq!(id.get(), written.as_str()),
        (Some(id), None) => prop_assert!(false, "an id {} that was not written: {}", id.get(), text),
        (None, Some(written)) => prop_assert_eq!(written.as_str(), "null", "an id lost: {}", text),
        (None, None) => {}
    }
    if let Some(method) = &env.method {
        let written = named("method");
        prop_assert_eq!(written.len(), 1);
        let decoded: String = serde_json::from_str(written[0]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(method.as_ref(), decoded.as_str());
        let kind = if env.id.is_some() { MessageKind::Request } else { MessageKind::Notification };
        prop_assert_eq!(env.kind, kind);
    }
    Ok(())
}

/// 2,000 cases by default (CI's smoke run, about two seconds); more with
/// `PROPTEST_CASES`.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// JSON-RPC-shaped objects: what the parser accepts agrees with JSON.
    #[test]
    fn the_envelope_parser_agrees_with_json(
        members in proptest::collection::vec(member(), 0..8),
        gaps in proptest::collection::vec(whitespace(), 1..6),
    ) {
        let text = object(&members, &gaps);
        check_envelope(&text, &members)?;
    }

    /// A request that is well formed is always accepted, with its id and
    /// method exactly.
    #[test]
    fn a_well_formed_request_is_read_exactly(id in id(), method in "[a-z/._é€-]{1,16}", gaps in proptest::collection::vec(whitespace(), 1..6)) {
        let members = vec![
            ("jsonrpc".to_owned(), r#""2.0""#.to_owned()),
            ("id".to_owned(), id.clone()),
            ("method".to_owned(), serde_json::to_string(&method).unwrap()),
            ("params".to_owned(), "{}".to_owned()),
        ];
        let text = object(&members, &gaps);
        let env = Envelope::parse(text.as_bytes()).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(env.id.map(|i| i.get()), Some(id.as_str()));
        prop_assert_eq!(env.method.as_deref(), Some(method.as_str()));
        check_envelope(&text, &members)?;
    }

    /// Any bytes, and any byte of a valid message changed: no panic.
    #[test]
    fn the_envelope_parser_never_panics(noise in proptest::collection::vec(any::<u8>(), 0..300), at in any::<usize>(), byte in any::<u8>()) {
        let _ = Envelope::parse(&noise);
        let mut message = br#"{"jsonrpc":"2.0","id":"a\u00e9","method":"tools/call","params":{"name":"x","arguments":{}}}"#.to_vec();
        let at = at % message.len();
        message[at] = byte;
        let _ = Envelope::parse(&message);
    }

    /// Events written with any line endings, read in reads cut anywhere,
    /// come back exactly.
    #[test]
    fn sse_events_come_back_exactly_however_the_stream_is_cut(
        events in proptest::collection::vec(proptest::collection::vec(field(), 1..6), 0..8),
        endings in proptest::collection::vec(0usize..3, 1..5),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        bom in any::<bool>(),
    ) {
        let (mut wire, expected) = sse_wire(&events, &endings);
        if bom {
            wire.splice(0..0, b"\xEF\xBB\xBF".iter().copied());
        }
        let (got, error) = decode(&wire, &cuts, 1 << 20);
        prop_assert_eq!(error, None);
        prop_assert_eq!(got, expected);
    }

    /// Any bytes: no panic, and an event larger than the limit is an error,
    /// never buffered without end.
    #[test]
    fn the_sse_decoder_is_bounded_on_any_bytes(noise in proptest::collection::vec(any::<u8>(), 0..3000), cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
        const MAX: usize = 256;
        let (events, error) = decode(&noise, &cuts, MAX);
        for event in &events {
            prop_assert!(event.data.len() <= MAX, "an event of {} bytes passed a limit of {MAX}", event.data.len());
        }
        if let Some(e) = error {
            prop_assert_eq!(e, DecodeError::TooLarge(MAX));
        }
    }
}
