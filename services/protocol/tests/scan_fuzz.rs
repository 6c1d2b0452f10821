//! Property tests (fuzzing) of the quick read of upstreams' answers
//! (`switchboard_protocol::scan::answer`) against `Envelope::parse`, which
//! it stands in for on the hot path.
//!
//! - Whatever it accepts, `Envelope::parse` accepts, with the same kind and
//!   the same id at the same place: on generated answers (any JSON in
//!   `result` and `error`, ids of every form, members in any order, other
//!   members, white space), on requests and notifications, and on each of
//!   them with a byte deleted, inserted or changed.
//! - It is not idle: every well-formed answer with a string or number id
//!   and no escaped member names is read by it.
//!
//! - The quick read of requests (`switchboard_protocol::scan::request`),
//!   which `Envelope::parse` takes first, changes nothing: on generated
//!   requests and notifications (routing members of `params` and of
//!   `params._meta` in any order, `null`, repeated, escaped, of any type;
//!   `ref`; other members) and on each with a byte deleted, inserted or
//!   changed, `Envelope::parse` answers as serde_json alone
//!   (`Envelope::parse_by_serde`) does: the same error or the same kind,
//!   id, method, params and target, at the same places. And every
//!   well-formed request it should read, it reads.
//!
//! CI runs the default number of cases (a few seconds);
//! `PROPTEST_CASES=1000000 cargo test --release -p switchboard-protocol
//! --test scan_fuzz` is the longer run.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use switchboard_protocol::jsonrpc::Target;
use switchboard_protocol::jsonrpc::{span, Envelope};
use switchboard_protocol::scan::{answer, request};

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

/// White space as JSON allows it, mostly none.
fn ws() -> impl Strategy<Value = &'static str> {
    prop_oneof![6 => Just(""), 1 => Just(" "), 1 => Just("\n  "), 1 => Just("\t"), 1 => Just("\r\n")]
}

/// A JSON string literal: plain, with every kind of escape, with text
/// beyond ASCII; now and then (`loose`) with what JSON does not allow in
/// one (a control character, a bad escape).
fn string_of(loose: bool) -> impl Strategy<Value = String> {
    let bad = u32::from(loose);
    prop_oneof![
        bad => prop::collection::vec(prop_oneof!["[\\x00-\\x1f]", "\\\\[a-z0-9']", "\\\\u[0-9a-gx]{0,4}", "[a-z]{1,3}"], 1..4)
            .prop_map(|parts| format!("\"{}\"", parts.concat())),
        4 => string_parts(),
    ]
}

fn string() -> impl Strategy<Value = String> {
    string_of(false)
}

fn string_parts() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_/.]{0,12}".prop_map(|s| format!("\"{s}\"")),
        prop::collection::vec(
            prop_oneof![
                "[ -!#-\\[\\]-~]{1,4}",
                Just("\\\"".to_owned()),
                Just("\\\\".to_owned()),
                Just("\\/".to_owned()),
                Just("\\n\\t\\r\\b\\f".to_owned()),
                "\\\\u[0-9a-fA-F]{4}",
                Just("é☕\u{1F600}".to_owned()),
            ],
            0..6
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat())),
    ]
}

/// A JSON number, in every form the grammar has; now and then (`loose`)
/// in a form it does not (`01`, `1.`, `-`, `1e`).
fn number_of(loose: bool) -> impl Strategy<Value = String> {
    let bad = u32::from(loose);
    prop_oneof![
        4 => ("-?", "0|[1-9][0-9]{0,8}", "(\\.[0-9]{1,4})?", "([eE][+-]?[0-9]{1,3})?")
            .prop_map(|(sign, int, frac, exp)| format!("{sign}{int}{frac}{exp}")),
        bad => "-?[0-9]{0,3}(\\.[0-9]{0,2})?([eE][+-]?[0-9]{0,2})?",
    ]
}

fn number() -> impl Strategy<Value = String> {
    number_of(false)
}

/// Any JSON value, as text (`loose`: now and then a part of it is not JSON:
/// see [`string_of`], [`number_of`], a cut literal, a trailing comma).
fn value_of(loose: bool) -> impl Strategy<Value = String> {
    let bad = u32::from(loose);
    let leaf = prop_oneof![
        3 => string_of(loose),
        3 => number_of(loose),
        1 => Just("true".to_owned()),
        1 => Just("false".to_owned()),
        1 => Just("null".to_owned()),
        bad => prop::sample::select(vec!["tru", "nul", "falsey", "True", "-", "\"open"]).prop_map(str::to_owned),
    ];
    let comma = if loose { "(,)?" } else { "" };
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            (prop::collection::vec((ws(), inner.clone(), ws()), 0..6), comma).prop_map(|(items, end)| {
                let items: Vec<String> = items.into_iter().map(|(a, v, b)| format!("{a}{v}{b}")).collect();
                format!("[{}{end}]", items.join(","))
            }),
            (prop::collection::vec((string_of(loose), ws(), inner), 0..6), comma).prop_map(|(members, end)| {
                let members: Vec<String> = members.into_iter().map(|(k, w, v)| format!("{k}{w}:{w}{v}")).collect();
                format!("{{{}{end}}}", members.join(","))
            }),
        ]
    })
}

fn value() -> impl Strategy<Value = String> {
    value_of(false)
}

/// An id: mostly what answers carry, sometimes what they must not.
fn id() -> impl Strategy<Value = String> {
    prop_oneof![4 => string_of(true), 4 => number_of(true), 1 => Just("null".to_owned()), 1 => Just("true".to_owned()), 1 => Just("{}".to_owned())]
}

/// A message's members: an answer's, or else some of a request's.
fn members() -> impl Strategy<Value = Vec<(String, String)>> {
    let jsonrpc =
        prop_oneof![8 => Just("\"2.0\"".to_owned()), 1 => Just("\"1.0\"".to_owned()), 1 => Just("2.0".to_owned())];
    let outcome = prop_oneof![
        4 => value_of(true).prop_map(|v| vec![("\"result\"".to_owned(), v)]),
        4 => value_of(true).prop_map(|v| vec![("\"error\"".to_owned(), v)]),
        1 => (value(), value()).prop_map(|(a, b)| vec![("\"result\"".to_owned(), a), ("\"error\"".to_owned(), b)]),
        1 => Just(vec![]),
        1 => (string(), value()).prop_map(|(m, p)| vec![("\"method\"".to_owned(), m), ("\"params\"".to_owned(), p)]),
    ];
    let others = prop::collection::vec(
        (prop_oneof![string(), Just("\"\\u0069d\"".to_owned()), Just("\"result\"".to_owned())], value()),
        0..3,
    );
    (prop::option::weighted(0.95, jsonrpc), prop::option::weighted(0.95, id()), outcome, others, any::<u64>()).prop_map(
        |(jsonrpc, id, outcome, others, order)| {
            let mut all: Vec<(String, String)> = Vec::new();
            all.extend(jsonrpc.map(|v| ("\"jsonrpc\"".to_owned(), v)));
            all.extend(id.map(|v| ("\"id\"".to_owned(), v)));
            all.extend(outcome);
            all.extend(others);
            // Any order.
            let n = all.len();
            for i in (1..n).rev() {
                all.swap(i, (order as usize >> (i % 16)) % (i + 1));
            }
            all
        },
    )
}

fn message(members: &[(String, String)], ws: &[&str]) -> Vec<u8> {
    let w = |i: usize| ws[i % ws.len()];
    let body: Vec<String> = members
        .iter()
        .enumerate()
        .map(|(i, (k, v))| format!("{}{k}{}:{}{v}{}", w(i), w(i + 1), w(i + 2), w(i + 3)))
        .collect();
    format!("{}{{{}}}{}", w(7), body.join(","), w(9)).into_bytes()
}

/// A byte to put in a message: any, or one that means something in JSON.
fn stray_byte() -> impl Strategy<Value = u8> {
    prop_oneof![any::<u8>(), prop::sample::select(b"\"\\{}[],:0-.eEn \x01\xc3\xff".to_vec())]
}

/// `bytes` with the byte `at` deleted (`how` 0), `byte` inserted there
/// (1) or put in its place (2).
fn with_a_stray_byte(mut bytes: Vec<u8>, at: prop::sample::Index, byte: u8, how: u8) -> Vec<u8> {
    let i = at.index(bytes.len());
    match how {
        0 => {
            bytes.remove(i);
        }
        1 => bytes.insert(i, byte),
        _ => bytes[i] = byte,
    }
    bytes
}

/// Whatever `answer` accepts, `Envelope::parse` does, with the same kind and id.
fn agrees(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Some((kind, id)) = answer(bytes) {
        let env = Envelope::parse(bytes);
        prop_assert!(env.is_ok(), "scanned but refused: {}: {:?}", String::from_utf8_lossy(bytes), env.err());
        let env = env.unwrap();
        prop_assert_eq!(env.kind, kind);
        prop_assert_eq!(span(bytes, env.id.expect("an answer has an id").get()), id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn what_it_reads_the_parser_reads_alike(members in members(), ws in prop::collection::vec(ws(), 1..8)) {
        agrees(&message(&members, &ws))?;
    }

    #[test]
    fn so_with_a_byte_deleted_inserted_or_changed(
        members in members(),
        ws in prop::collection::vec(ws(), 1..8),
        at in any::<prop::sample::Index>(),
        byte in stray_byte(),
        how in 0..3u8,
    ) {
        agrees(&with_a_stray_byte(message(&members, &ws), at, byte, how))?;
    }

    #[test]
    fn every_well_formed_answer_is_read(members in well_formed(), ws in prop::collection::vec(ws(), 1..8)) {
        let bytes = message(&members, &ws);
        prop_assert!(answer(&bytes).is_some(), "{}", String::from_utf8_lossy(&bytes));
        agrees(&bytes)?;
    }

    #[test]
    fn one_defect_in_a_well_formed_answer_is_not_read_unless_the_parser_reads_it(
        members in well_formed(),
        ws in prop::collection::vec(ws(), 1..8),
        at in any::<prop::sample::Index>(),
        defect in 0..5u8,
    ) {
        let mut bytes = message(&members, &ws);
        let from = at.index(bytes.len());
        let find = |bytes: &[u8], what: &dyn Fn(u8) -> bool| {
            (from..bytes.len()).chain(0..from).find(|&i| what(bytes[i]))
        };
        match defect {
            // A leading zero (or a second one).
            0 => if let Some(i) = find(&bytes, &|b| b.is_ascii_digit()) { bytes.insert(i, b'0') },
            // A container closed by the other bracket.
            1 => if let Some(i) = find(&bytes, &|b| b == b'}' || b == b']') { bytes[i] ^= b'}' ^ b']' },
            // A trailing comma.
            2 => if let Some(i) = find(&bytes, &|b| b == b'}' || b == b']') { bytes.insert(i, b',') },
            // A control character in a string (or between tokens).
            3 => if let Some(i) = find(&bytes, &|b| b == b'"') { bytes.insert(i + 1, 0x01) },
            // An escape that is not one.
            _ => if let Some(i) = find(&bytes, &|b| b == b'"') { bytes.splice(i + 1..i + 1, *b"\\q"); },
        }
        agrees(&bytes)?;
    }
}

/// A well-formed answer's members: a string or number id, any JSON as its
/// result or error, maybe a member it does not read.
fn well_formed() -> impl Strategy<Value = Vec<(String, String)>> {
    let other = prop::option::of((
        string().prop_filter("not a member it reads", |k| {
            !["\"jsonrpc\"", "\"id\"", "\"result\"", "\"error\"", "\"method\"", "\"params\""].contains(&k.as_str())
                && !k.contains('\\')
        }),
        value(),
    ));
    (prop_oneof![string(), number()], value(), any::<bool>(), other).prop_map(|(id, result, is_error, other)| {
        let mut members = vec![
            ("\"jsonrpc\"".to_owned(), "\"2.0\"".to_owned()),
            ("\"id\"".to_owned(), id),
            ((if is_error { "\"error\"" } else { "\"result\"" }).to_owned(), result),
        ];
        members.extend(other);
        members
    })
}

/// A value for a routing member: mostly what it should be, sometimes any
/// JSON (`null` too), sometimes not JSON.
fn member_value() -> impl Strategy<Value = String> {
    prop_oneof![4 => string(), 2 => value(), 1 => Just("null".to_owned()), 1 => value_of(true)]
}

/// `params._meta`: an object of the members the router reads and others,
/// or `null`, or something else.
fn meta() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        3 => Just("\"progressToken\"".to_owned()),
        3 => Just("\"traceparent\"".to_owned()),
        2 => Just("\"io.modelcontextprotocol/protocolVersion\"".to_owned()),
        1 => Just("\"io.modelcontextprotocol/clientCapabilities\"".to_owned()),
        1 => Just("\"io.modelcontextprotocol/logLevel\"".to_owned()),
        1 => Just("\"progress\\u0054oken\"".to_owned()),
        2 => string(),
    ];
    prop_oneof![
        6 => prop::collection::vec((key, member_value()), 0..4).prop_map(|m| object(&m)),
        1 => Just("null".to_owned()),
        1 => value(),
    ]
}

/// `params`: an object of routing members (some repeated, some escaped,
/// `ref` now and then) and others; or, rarely, something else.
fn params() -> impl Strategy<Value = String> {
    let member = prop_oneof![
        4 => member_value().prop_map(|v| ("\"name\"".to_owned(), v)),
        2 => member_value().prop_map(|v| ("\"uri\"".to_owned(), v)),
        3 => value().prop_map(|v| ("\"arguments\"".to_owned(), v)),
        1 => member_value().prop_map(|v| ("\"requestId\"".to_owned(), v)),
        1 => member_value().prop_map(|v| ("\"cursor\"".to_owned(), v)),
        3 => meta().prop_map(|v| ("\"_meta\"".to_owned(), v)),
        1 => value().prop_map(|v| ("\"ref\"".to_owned(), v)),
        1 => member_value().prop_map(|v| ("\"na\\u006de\"".to_owned(), v)),
        2 => (string(), value()),
    ];
    prop_oneof![
        12 => prop::collection::vec(member, 0..5).prop_map(|m| object(&m)),
        1 => value(),
    ]
}

fn object(members: &[(String, String)]) -> String {
    let members: Vec<String> = members.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("{{{}}}", members.join(","))
}

/// A request's or notification's members, in any order, now and then with
/// what it must not have.
fn request_members() -> impl Strategy<Value = Vec<(String, String)>> {
    let jsonrpc = prop_oneof![12 => Just("\"2.0\"".to_owned()), 1 => Just("\"1.0\"".to_owned())];
    let method = prop_oneof![
        8 => prop::sample::select(vec!["\"tools/call\"", "\"ping\"", "\"notifications/progress\"", "\"resources/read\""])
            .prop_map(str::to_owned),
        2 => string(),
        1 => value(),
    ];
    let others = prop::collection::vec(
        (
            prop_oneof![
                4 => string(),
                1 => Just("\"\\u0069d\"".to_owned()),
                1 => Just("\"result\"".to_owned()),
                1 => Just("\"method\"".to_owned()),
                1 => Just("\"params\"".to_owned()),
            ],
            value(),
        ),
        0..2,
    );
    (
        prop::option::weighted(0.97, jsonrpc),
        prop::option::weighted(0.8, id()),
        prop::option::weighted(0.97, method),
        prop::option::weighted(0.85, params()),
        prop::option::weighted(0.2, others),
        any::<u64>(),
    )
        .prop_map(|(jsonrpc, id, method, params, others, order)| {
            let mut all: Vec<(String, String)> = Vec::new();
            all.extend(jsonrpc.map(|v| ("\"jsonrpc\"".to_owned(), v)));
            all.extend(id.map(|v| ("\"id\"".to_owned(), v)));
            all.extend(method.map(|v| ("\"method\"".to_owned(), v)));
            all.extend(params.map(|v| ("\"params\"".to_owned(), v)));
            all.extend(others.unwrap_or_default());
            let n = all.len();
            for i in (1..n).rev() {
                all.swap(i, (order as usize >> (i % 16)) % (i + 1));
            }
            all
        })
}

/// The routing members of a target, as places in `bytes`.
fn target_spans(bytes: &[u8], t: &Target<'_>) -> [Option<std::ops::Range<usize>>; 10] {
    [
        t.name,
        t.uri,
        t.progress_token,
        t.request_id,
        t.arguments,
        t.meta,
        t.traceparent,
        t.protocol_version,
        t.client_capabilities,
        t.log_level,
    ]
    .map(|v| v.map(|r| span(bytes, r.get())))
}

/// `Envelope::parse` (which reads a request quickly when it can) answers as
/// serde_json alone does.
fn parses_alike(bytes: &[u8]) -> Result<(), TestCaseError> {
    let shown = || String::from_utf8_lossy(bytes).into_owned();
    let quick = Envelope::parse(bytes);
    let slow = Envelope::parse_by_serde(bytes);
    match (&quick, &slow) {
        (Ok(q), Ok(s)) => {
            prop_assert_eq!(q.kind, s.kind, "{}", shown());
            prop_assert_eq!(q.id.map(|r| span(bytes, r.get())), s.id.map(|r| span(bytes, r.get())), "{}", shown());
            prop_assert_eq!(q.method_str(), s.method_str(), "{}", shown());
            prop_assert_eq!(q.params.map(|r| span(bytes, r.get())), s.params.map(|r| span(bytes, r.get())));
            match (q.target(), s.target()) {
                (None, None) => {}
                (Some(Ok(qt)), Some(Ok(st))) => {
                    prop_assert_eq!(target_spans(bytes, qt), target_spans(bytes, st), "{}", shown());
                    prop_assert!(qt.reference.is_none() == st.reference.is_none());
                }
                (Some(Err(qe)), Some(Err(se))) => prop_assert_eq!(qe.to_string(), se.to_string()),
                (q, s) => prop_assert!(
                    false,
                    "targets differ on {}: {:?} / {:?}",
                    shown(),
                    q.map(|t| t.is_ok()),
                    s.map(|t| t.is_ok())
                ),
            }
        }
        (Err(q), Err(s)) => prop_assert_eq!(q.to_string(), s.to_string(), "{}", shown()),
        _ => prop_assert!(false, "{}: quick {:?}, serde {:?}", shown(), quick.is_ok(), slow.is_ok()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_request_read_quickly_is_read_as_serde_json_reads_it(
        members in request_members(),
        ws in prop::collection::vec(ws(), 1..8),
    ) {
        parses_alike(&message(&members, &ws))?;
    }

    #[test]
    fn so_with_a_byte_of_it_deleted_inserted_or_changed(
        members in request_members(),
        ws in prop::collection::vec(ws(), 1..8),
        at in any::<prop::sample::Index>(),
        byte in stray_byte(),
        how in 0..3u8,
    ) {
        parses_alike(&with_a_stray_byte(message(&members, &ws), at, byte, how))?;
    }

    #[test]
    fn every_well_formed_request_is_read_quickly(members in well_formed_request(), ws in prop::collection::vec(ws(), 1..8)) {
        let bytes = message(&members, &ws);
        prop_assert!(request(&bytes).is_some(), "{}", String::from_utf8_lossy(&bytes));
        parses_alike(&bytes)?;
    }
}

/// A well-formed request or notification the quick read must read: routing
/// members at most once each and unescaped, no `ref`, `_meta` an object or
/// `null`, a method without escapes.
fn well_formed_request() -> impl Strategy<Value = Vec<(String, String)>> {
    let plain = || "[a-z_/]{1,12}".prop_map(|s| format!("\"{s}\""));
    let meta = prop_oneof![
        3 => (
            prop::option::of(good_value()),
            prop::option::of(good_value()),
            prop::option::of(value()),
            prop::option::of(good_value())
        )
            .prop_map(|(token, parent, other, version)| {
                let mut m = Vec::new();
                m.extend(token.map(|v| ("\"progressToken\"".to_owned(), v)));
                m.extend(version.map(|v| ("\"io.modelcontextprotocol/protocolVersion\"".to_owned(), v)));
                m.extend(other.map(|v| ("\"other\"".to_owned(), v)));
                m.extend(parent.map(|v| ("\"traceparent\"".to_owned(), v)));
                object(&m)
            }
        ),
        1 => Just("null".to_owned()),
    ];
    let params = (
        prop::option::of(good_value()),
        prop::option::of(value()),
        prop::option::of(meta),
        prop::option::of(good_value()),
    )
        .prop_map(|(name, arguments, meta, uri)| {
            let mut m = Vec::new();
            m.extend(meta.map(|v| ("\"_meta\"".to_owned(), v)));
            m.extend(name.map(|v| ("\"name\"".to_owned(), v)));
            m.extend(arguments.map(|v| ("\"arguments\"".to_owned(), v)));
            m.extend(uri.map(|v| ("\"uri\"".to_owned(), v)));
            object(&m)
        });
    (prop::option::of(prop_oneof![string(), number()]), plain(), prop::option::of(params)).prop_map(
        |(id, method, params)| {
            let mut members = vec![("\"jsonrpc\"".to_owned(), "\"2.0\"".to_owned())];
            members.extend(id.map(|v| ("\"id\"".to_owned(), v)));
            members.push(("\"method\"".to_owned(), method));
            members.extend(params.map(|v| ("\"params\"".to_owned(), v)));
            members
        },
    )
}

/// What a routing member holds in a well-formed request: any JSON.
fn good_value() -> impl Strategy<Value = String> {
    prop_oneof![4 => string(), 2 => value(), 1 => Just("null".to_owned())]
}
