//! Changing a few fields of a message by splicing bytes.
//!
//! A router must change a tool's name, a request id or a progress token on
//! the way through, and nothing else. Re-serialising the whole message for
//! that would decode and re-encode every argument and every result; instead
//! the caller finds the byte ranges of the fields (with
//! [`crate::jsonrpc::span`]) and [`splice`] copies the message once, with the
//! replacements in place.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

/// One replacement: the bytes in `range` of the input become `with`.
#[derive(Debug, Clone)]
pub struct Edit<'a> {
    /// The byte range of the input to replace.
    pub range: Range<usize>,
    /// The new bytes.
    pub with: &'a [u8],
}

impl<'a> Edit<'a> {
    /// Replaces `range` with `with`.
    pub fn new(range: Range<usize>, with: &'a [u8]) -> Self {
        Edit { range, with }
    }
}

/// Copies `input` once with every edit applied.
///
/// Edits may come in any order but must not overlap.
///
/// # Panics
/// If two edits overlap or one lies outside `input`.
pub fn splice(input: &[u8], edits: &mut [Edit<'_>]) -> Bytes {
    edits.sort_unstable_by_key(|e| e.range.start);
    let mut len = input.len();
    let mut last_end = 0;
    for e in edits.iter() {
        assert!(e.range.start >= last_end && e.range.end <= input.len(), "edits overlap or lie outside the input");
        last_end = e.range.end;
        len = len - e.range.len() + e.with.len();
    }
    let mut out = BytesMut::with_capacity(len);
    let mut at = 0;
    for e in edits.iter() {
        out.put_slice(&input[at..e.range.start]);
        out.put_slice(e.with);
        at = e.range.end;
    }
    out.put_slice(&input[at..]);
    out.freeze()
}

/// Where `range` of the input lies in [`splice`]'s output: moved by the
/// edits before it, or the replacement's place if an edit replaces exactly
/// it. It must not otherwise overlap an edit.
pub fn moved(range: Range<usize>, edits: &[Edit<'_>]) -> Range<usize> {
    let mut start = range.start as isize;
    let mut len = range.len();
    for e in edits {
        if e.range == range {
            len = e.with.len();
        }
        if e.range.end <= range.start && e.range != range {
            start += e.with.len() as isize - e.range.len() as isize;
        }
    }
    start as usize..start as usize + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{span, Envelope, Target};

    #[test]
    fn splices_name_and_id_leaving_arguments_untouched() {
        let input = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"up__echo","arguments":{"name":"keep me","n":1.50}}}"#;
        let env = Envelope::parse(input).unwrap();
        let target = Target::parse(env.params.unwrap()).unwrap();
        let name = span(input, target.name.unwrap().get());
        let id = span(input, env.id.unwrap().get());
        let out = splice(input, &mut [Edit::new(name, b"\"echo\""), Edit::new(id, b"\"r-9\"")]);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":"r-9","method":"tools/call","params":{"name":"echo","arguments":{"name":"keep me","n":1.50}}}"#
        );
    }

    #[test]
    fn moved_follows_the_edits_before_a_range() {
        let input = br#"{"id":1.0,"params":{"name":"up__echo","_meta":{"progressToken":7}}}"#;
        let at = |part: &[u8]| {
            let start = input.windows(part.len()).position(|w| w == part).unwrap();
            start..start + part.len()
        };
        let (id, name, token) = (at(b"1.0"), at(b"\"up__echo\""), at(b"7"));
        let edits = [Edit::new(id.clone(), b"\"sb~1.0\""), Edit::new(name.clone(), b"\"echo\"")];
        let out = splice(input, &mut edits.clone());
        assert_eq!(&out[moved(id, &edits)], b"\"sb~1.0\"");
        assert_eq!(&out[moved(name, &edits)], b"\"echo\"");
        assert_eq!(&out[moved(token, &edits)], b"7");
    }

    #[test]
    fn no_edits_is_a_copy() {
        assert_eq!(&splice(b"abc", &mut [])[..], b"abc");
    }

    #[test]
    #[should_panic(expected = "overlap")]
    fn overlapping_edits_panic() {
        splice(b"abcdef", &mut [Edit::new(0..3, b"x"), Edit::new(2..4, b"y")]);
    }
}
