//! W3C Trace Context (`traceparent`): read from a request, written on the
//! requests the router sends, and the head sampling decision.

use std::cell::Cell;

/// A 16-byte trace id and an 8-byte span id, as W3C Trace Context has them.
pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

/// What a `traceparent` says: the trace, the caller's span, and whether
/// the caller sampled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace: TraceId,
    pub span: SpanId,
    pub sampled: bool,
}

/// Reads a `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`; a later version
/// may carry more after a `-`). Ids of all zeros, version `ff` and
/// upper-case hex are invalid.
pub fn parse_traceparent(value: &str) -> Option<Parent> {
    let value = value.trim();
    let bytes = value.as_bytes();
    if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
        return None;
    }
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let version = hex_bytes::<1>(&value[0..2])?;
    if version[0] == 0xff || (version[0] == 0 && bytes.len() != 55) {
        return None;
    }
    let trace = hex_bytes::<16>(&value[3..35])?;
    let span = hex_bytes::<8>(&value[36..52])?;
    let flags = hex_bytes::<1>(&value[53..55])?;
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some(Parent { trace, span, sampled: flags[0] & 1 == 1 })
}

/// `traceparent` for `trace`, span `span`.
pub fn traceparent(trace: &TraceId, span: &SpanId, sampled: bool) -> String {
    let mut out = String::with_capacity(55);
    out.push_str("00-");
    push_hex(&mut out, trace);
    out.push('-');
    push_hex(&mut out, span);
    out.push_str(if sampled { "-01" } else { "-00" });
    out
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != N * 2 {
        return None;
    }
    let value = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks(2).enumerate() {
        out[i] = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(out)
}

thread_local! {
    /// A per-thread xorshift64* state, seeded from the OS once: ids and
    /// sampling decisions without a system call per request.
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes) | 1
}

fn next() -> u64 {
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// A new trace id (never all zeros).
pub fn new_trace_id() -> TraceId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&next().to_be_bytes());
    id[8..].copy_from_slice(&(next() | 1).to_be_bytes());
    id
}

/// A new span id (never all zeros).
pub fn new_span_id() -> SpanId {
    (next() | 1).to_be_bytes()
}

/// Whether a request without a sampled parent is sampled, at `ratio` (0 to 1).
pub fn sample(ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    (next() >> 11) as f64 / (1u64 << 53) as f64 <= ratio
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_bad_ones_are_refused() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parent = parse_traceparent(text).unwrap();
        assert!(parent.sampled);
        assert_eq!(traceparent(&parent.trace, &parent.span, true), text);
        assert!(!parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled);
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        // A later version may carry more.
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-whatever").is_some());
    }

    #[test]
    fn sampling_follows_the_ratio() {
        assert!((0..1000).all(|_| sample(1.0)));
        assert!((0..1000).all(|_| !sample(0.0)));
        let hits = (0..100_000).filter(|_| sample(0.1)).count();
        assert!((8_000..12_000).contains(&hits), "{hits}");
        assert_ne!(new_trace_id(), new_trace_id());
        assert_ne!(new_span_id(), [0; 8]);
    }
}
