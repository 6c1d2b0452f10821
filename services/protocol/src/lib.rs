//! The wire formats Switchboard speaks, with no I/O.
//!
//! Everything in this crate works on byte slices and returns byte buffers; it
//! never opens a socket, spawns a task or reads a clock. That keeps it cheap to
//! benchmark and easy to fuzz, and it is the only place that knows how a
//! JSON-RPC message is laid out on the wire.
//!
//! - [`jsonrpc`]: the envelope of a JSON-RPC 2.0 message, parsed over borrowed
//!   [`serde_json::value::RawValue`]s so that `params` and `result` are never
//!   decoded, plus prebuilt error bodies.
//! - [`scan`]: a quick read of an upstream's answer (one pass, checked as
//!   strictly as serde_json checks it) for its kind and id, and of a
//!   client's request for its members and routing target, the parser
//!   reading what it is unsure of.
//! - [`rewrite`]: byte splicing, to change one field of a message (an id, a
//!   tool name, a progress token) without re-serialising the rest.
//! - [`methods`]: MCP method names and their classification.
//! - [`version`]: the MCP protocol versions we know.
//! - [`modern`]: the stateless era (2026-07-28): per-request `_meta`, its
//!   keys and error codes.
//! - [`sse`]: Server-Sent Events encoder and incremental decoder.
//! - [`ndjson`]: newline-delimited JSON framing, as used over stdio.
//! - [`http1`]: HTTP/1.1 request heads (spans of the connection's buffer,
//!   ambiguous framing refused) and response heads, for the router's own
//!   path for its hot `POST`.
//! - [`edge`]: the edge protocol's frames (`##START` … `##END`), for devices
//!   that connect out to the router over TCP.
//! - [`schema`]: argument checks against a tool's JSON Schema (the subset
//!   edge devices declare).
//!
//! Nothing here may allocate per byte of payload: a message is copied at most
//! once, when a rewrite produces its new form.
// Two `unsafe` blocks, allowed where they are:
// - `jsonrpc::raw_value`: a request's members borrowed as serde_json's
//   `RawValue` after the quick read (`scan::request`), as serde_json itself
//   borrows them. Measured: a `tools/call`'s envelope and target in about
//   2,700 instructions where serde_json took about 4,800.
// - [`ascii`]: ASCII bytes taken as the text they are, without checking
//   them as UTF-8 a second time (after `is_ascii`, `std::str::from_utf8`
//   cost 80 to 125 instructions more on each short header value).
#![deny(unsafe_code)]

pub mod edge;
pub mod http1;
pub mod jsonrpc;
mod kind;
pub mod methods;
pub mod modern;
pub mod ndjson;
pub mod rewrite;
pub mod scan;
pub mod schema;
pub mod sse;
pub mod version;

pub use jsonrpc::{Envelope, MessageKind, ParseError};
pub use methods::Method;
pub use version::ProtocolVersion;

/// `bytes` as text, if they are ASCII (checked a word at a time); `None`
/// otherwise, even when they are other UTF-8: for those the caller checks
/// with `std::str::from_utf8`, whose check an ASCII text needs no more.
#[allow(unsafe_code)]
#[inline]
pub fn ascii(bytes: &[u8]) -> Option<&str> {
    if !bytes.is_ascii() {
        return None;
    }
    // SAFETY: every ASCII byte is a UTF-8 character of its own, so ASCII
    // bytes are valid UTF-8, the one thing `from_utf8_unchecked` requires.
    Some(unsafe { std::str::from_utf8_unchecked(bytes) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ascii_bytes_are_their_text_and_no_others_are_taken() {
        // Every byte alone and in the middle of a word's worth and more.
        for b in 0..=255u8 {
            for len in [1, 7, 8, 9, 17, 40] {
                let mut bytes = vec![b'a'; len];
                bytes[len / 2] = b;
                let expected = std::str::from_utf8(&bytes).ok().filter(|_| b.is_ascii());
                assert_eq!(super::ascii(&bytes), expected, "{b:#x} in {len}");
            }
        }
        assert_eq!(super::ascii(b""), Some(""));
        assert_eq!(super::ascii("café".as_bytes()), None, "UTF-8, not ASCII");
    }
}
