//! Property tests of the edge frame codec: any frames, split anywhere or
//! merged, decode back exactly; garbage, truncation and corruption never
//! panic, never grow the buffer past the frame limit, and never lose a
//! good frame that follows them.

use bytes::BytesMut;
use proptest::prelude::*;
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

/// Encodes specs: text as text frames (split as the encoder likes), other
/// payloads as JSON strings. Returns the wire bytes and the frames expected.
/// A decoded frame's type, task id and payload.
type Decoded = (u8, [u8; 8], Vec<u8>);

fn wire(specs: &[Spec]) -> (Vec<u8>, Vec<Decoded>) {
    let mut out = BytesMut::new();
    let mut expected = Vec::new();
    for s in specs {
        if s.kind == edge::TEXT {
            let mut chunk = BytesMut::new();
            let n = edge::encode_text(&s.task, s.seq, &s.text, 40, &mut chunk);
            let mut d = Decoder::new(MAX);
            d.push(&chunk);
            for _ in 0..n {
                let f = d.next_frame().unwrap().unwrap();
                expected.push((f.kind, f.task, f.payload.to_vec()));
            }
            out.extend_from_slice(&chunk);
        } else {
            let json = serde_json::to_vec(&s.text).unwrap();
            let payload = edge::guard_json(&json).into_owned();
            edge::encode(s.kind, &s.task, s.seq, &payload, &mut out);
            expected.push((s.kind, s.task, payload));
        }
    }
    (out.to_vec(), expected)
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
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// Frames split at arbitrary points (and merged several per read) come
    /// back exactly, with no error.
    #[test]
    fn round_trip(specs in proptest::collection::vec(spec(), 0..8), cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
        let (bytes, expected) = wire(&specs);
        let (frames, errors) = feed(&bytes, &cuts);
        prop_assert!(errors.is_empty(), "{errors:?}");
        let got: Vec<Decoded> = frames.iter().map(|f| (f.kind, f.task, f.payload.to_vec())).collect();
        prop_assert_eq!(got, expected);
        // Joined text frames give back the text; JSON payloads parse back.
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
        prop_assert_eq!(frames.len(), expected.len());
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
        let got: Vec<Decoded> = frames.iter().map(|f| (f.kind, f.task, f.payload.to_vec())).collect();
        prop_assert!(got.ends_with(&expected), "{got:?}");
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
        let last = frames.last().map(|f| (f.kind, f.task, f.payload.to_vec()));
        prop_assert_eq!(last, expected.into_iter().next());
    }
}
