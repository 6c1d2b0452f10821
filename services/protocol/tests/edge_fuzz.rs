//! Property tests of the edge frame codec: any frames, split anywhere or
//! merged, decode back exactly; garbage, truncation and corruption never
//! panic, never grow the buffer past the frame limit, and never lose a
//! good frame that follows them.

use bytes::BytesMut;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use switchboard_protocol::edge::{self, DecodeError, Decoder, Frame};

const MAX: usize = 512;

#[derive(Debug, Clone)]
struct Spec {
    kind: u8,
    task: [u8; 8],
    seq: u16,
    text: String,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![Just(edge::MCP), Just(edge::TEXT), Just(edge::END), any::<u8>()],
        proptest::array::uniform8(0x21u8..0x7f),
        0u16..10_000,
        // Text with plenty of `#`, markers and multi-byte characters.
        proptest::collection::vec(
            prop_oneof![Just("#".to_owned()), Just("##END".to_owned()), Just("##START".to_owned()), "[a-zé€ ]{0,6}"],
            0..12,
        )
        .prop_map(|parts| parts.concat()),
    )
        .prop_map(|(kind, task, seq, text)| Spec { kind, task, seq, text })
}

/// A decoded frame's type, task id and payload.
type Decoded = (u8, [u8; 8], Vec<u8>);

/// What the wire should decode to, worked out from the specs alone (never
/// from the decoder under test).
#[derive(Debug)]
enum Expect {
    /// One frame, exactly.
    Frame(Decoded),
    /// A text written as text frames: `frames` of them, seqs counting up
    /// from `seq`, each payload at most `TEXT_CHUNK` bytes with no `##`,
    /// their payloads joined giving back `text`.
    Text { task: [u8; 8], seq: u16, text: String, frames: usize },
}

impl Expect {
    fn frames(&self) -> usize {
        match self {
            Expect::Frame(_) => 1,
            Expect::Text { frames, .. } => *frames,
        }
    }
}

const TEXT_CHUNK: usize = 40;

/// Encodes specs: text as text frames (split as the encoder likes), other
/// payloads as JSON strings. Returns the wire bytes and what they hold.
fn wire(specs: &[Spec]) -> (Vec<u8>, Vec<Expect>) {
    let mut out = BytesMut::new();
    let mut expected = Vec::new();
    for s in specs {
        if s.kind == edge::TEXT {
            let frames = edge::encode_text(&s.task, s.seq, &s.text, TEXT_CHUNK, &mut out);
            expected.push(Expect::Text { task: s.task, seq: s.seq, text: s.text.clone(), frames });
        } else {
            let json = serde_json::to_vec(&s.text).unwrap();
            let payload = edge::guard_json(&json).into_owned();
            edge::encode(s.kind, &s.task, s.seq, &payload, &mut out);
            expected.push(Expect::Frame((s.kind, s.task, payload)));
        }
    }
    (out.to_vec(), expected)
}

/// Checks decoded frames against what was expected, in order, all of them.
fn check(frames: &[Frame], expected: &[Expect]) -> Result<(), TestCaseError> {
    let wanted: usize = expected.iter().map(Expect::frames).sum();
    prop_assert_eq!(frames.len(), wanted, "{:?}", frames);
    let mut rest = frames;
    for e in expected {
        let (these, after) = rest.split_at(e.frames());
        rest = after;
        match e {
            Expect::Frame(want) => {
                let got = (these[0].kind, these[0].task, these[0].payload.to_vec());
                prop_assert_eq!(&got, want);
            }
            Expect::Text { task, seq, text, frames } => {
                prop_assert_eq!(*frames == 0, text.is_empty(), "an empty text writes no frame, others do");
                let mut joined = Vec::new();
                for (i, f) in these.iter().enumerate() {
                    prop_assert_eq!(f.kind, edge::TEXT);
                    prop_assert_eq!(&f.task, task);
                    prop_assert_eq!(f.seq, ((*seq as usize + i) % 10_000) as u16);
                    prop_assert!(f.payload.len() <= TEXT_CHUNK && !f.payload.is_empty(), "{:?}", f.payload);
                    prop_assert!(!f.payload.windows(2).any(|w| w == b"##"), "no `##` in one frame: {:?}", f.payload);
                    prop_assert!(std::str::from_utf8(&f.payload).is_ok(), "no character split: {:?}", f.payload);
                    joined.extend_from_slice(&f.payload);
                }
                prop_assert_eq!(String::from_utf8(joined).unwrap(), text.clone());
            }
        }
    }
    Ok(())
}

fn drain(d: &mut Decoder, frames: &mut Vec<Frame>, errors: &mut Vec<DecodeError>) {
    while let Some(r) = d.next_frame() {
        match r {
            Ok(f) => frames.push(f),
            Err(e) => errors.push(e),
        }
    }
    // With nothing more to decode, what is left is at most one partial frame.
    assert!(d.pending() <= MAX, "the buffer stays bounded: {}", d.pending());
}

fn feed(bytes: &[u8], cuts: &[usize]) -> (Vec<Frame>, Vec<DecodeError>) {
    let mut d = Decoder::new(MAX);
    let (mut frames, mut errors) = (Vec::new(), Vec::new());
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut from = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        d.push(&bytes[from..p]);
        from = p;
        drain(&mut d, &mut frames, &mut errors);
    }
    (frames, errors)
}

proptest! {
    // Failures are kept next to this file (edge_fuzz.proptest-regressions,
    // committed) and their seeds replayed first on every run.
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Frames split at arbitrary points (and merged several per read) come
    /// back exactly, with no error: text frames give back their text, JSON
    /// payloads parse back to theirs.
    #[test]
    fn round_trip(specs in proptest::collection::vec(spec(), 0..8), cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
        let (bytes, expected) = wire(&specs);
        let (frames, errors) = feed(&bytes, &cuts);
        prop_assert!(errors.is_empty(), "{errors:?}");
        check(&frames, &expected)?;
        for s in &specs {
            if s.kind != edge::TEXT {
                let f = frames.iter().find(|f| f.task == s.task && f.kind == s.kind && f.seq == s.seq).unwrap();
                let text: String = serde_json::from_slice(&f.payload).unwrap();
                prop_assert_eq!(&text, &s.text);
            }
        }
    }

    /// Garbage (with no `#`) before and between frames is skipped and
    /// reported; every frame still arrives.
    #[test]
    fn garbage_is_skipped(specs in proptest::collection::vec(spec(), 1..5), junk in proptest::collection::vec("[^#]{1,30}", 1..5), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let mut bytes = Vec::new();
        let mut expected = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            bytes.extend_from_slice(junk[i % junk.len()].as_bytes());
            let (b, e) = wire(std::slice::from_ref(s));
            bytes.extend_from_slice(&b);
            expected.extend(e);
        }
        let (frames, errors) = feed(&bytes, &cuts);
        check(&frames, &expected)?;
        prop_assert!(!errors.is_empty());
        prop_assert!(errors.iter().all(|e| matches!(e, DecodeError::Garbage { .. })), "{errors:?}");
        let skipped: usize = errors.iter().map(|e| match e { DecodeError::Garbage { skipped } => *skipped, _ => 0 }).sum();
        let junk_bytes: usize = (0..specs.len()).map(|i| junk[i % junk.len()].len()).sum();
        prop_assert_eq!(skipped, junk_bytes);
    }

    /// A frame cut off anywhere, then a good frame: the good frame arrives.
    #[test]
    fn truncation_loses_only_the_cut_frame(a in spec(), b in spec(), cut in any::<usize>(), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let (first, _) = wire(std::slice::from_ref(&a));
        let (second, expected) = wire(std::slice::from_ref(&b));
        prop_assume!(!first.is_empty());
        let keep = cut % first.len();
        let mut bytes = first[..keep].to_vec();
        bytes.extend_from_slice(&second);
        let (frames, _) = feed(&bytes, &cuts);
        let n: usize = expected.iter().map(Expect::frames).sum();
        prop_assert!(frames.len() >= n, "{frames:?}");
        check(&frames[frames.len() - n..], &expected)?;
    }

    /// Any bytes at all: no panic, bounded buffer, and decoding resumes for
    /// a good frame after them (once a marker-free separator ends them).
    #[test]
    fn arbitrary_bytes_never_break_the_decoder(noise in proptest::collection::vec(any::<u8>(), 0..2000), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let mut bytes = noise.clone();
        // "##END" closes any frame the noise opened; then one good frame.
        bytes.extend_from_slice(b"##END");
        let (good, expected) = wire(&[Spec { kind: edge::MCP, task: *b"mcp00001", seq: 1, text: "ok".into() }]);
        bytes.extend_from_slice(&good);
        let (frames, _) = feed(&bytes, &cuts);
        prop_assert!(!frames.is_empty());
        check(&frames[frames.len() - 1..], &expected)?;
    }
}
