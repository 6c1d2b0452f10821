//! The edge protocol's framing: how devices and the router talk over one TCP
//! (or TLS) connection.
//!
//! ```text
//! ##START <type: 1 byte> <task id: 8 ASCII bytes> <seq: 4 ASCII digits> <payload> ##END
//! ```
//!
//! with no spaces. The seq may also be written in brackets (`[0000]`); both
//! are accepted, and [`encode`] writes the plain form. Types: [`MCP`] (`0x06`,
//! a JSON message, task id [`MCP_TASK`]), [`TEXT`] (`0x04`, user text in
//! UTF-8) and [`END`] (`0x03`, the end of a text task). Other types decode
//! (the connection decides what to answer) and are reported by
//! [`is_known`].
//!
//! A payload has no length: it ends at the first `##END`. A `##START` before
//! that means the frame was cut off (the sender restarted mid-frame); it is
//! reported as [`DecodeError::Truncated`] and decoding resumes at the new
//! frame, so one broken frame never swallows the next. So a payload must not
//! contain `##START` or `##END`; the encoders here never write `##` inside
//! a payload at all:
//! - [`encode_json`]: `#` only occurs inside JSON strings, where `\u0023`
//!   means the same thing, so a `#` after a `#` is written escaped;
//! - [`encode_text`]: a text is split into frames of the same task, between
//!   two `#`, since the receiver joins them anyway (and at a frame's size
//!   limit, on a character boundary).
//!
//! The [`Decoder`] is incremental: bytes arrive in any split, several frames
//! may come in one read, bytes before `##START` are skipped (and reported,
//! to be counted), and a frame longer than the maximum is refused and
//! skipped. A payload is handed out as a slice of the bytes read from the
//! socket ([`Bytes`]): never copied again.

use std::borrow::Cow;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The marker that opens a frame.
pub const START_MARK: &[u8] = b"##START";
/// The marker that closes a frame.
pub const END_MARK: &[u8] = b"##END";

/// An MCP message (JSON).
pub const MCP: u8 = 0x06;
/// User text (UTF-8); the frames of one task id join into one message.
pub const TEXT: u8 = 0x04;
/// The end of a text task.
pub const END: u8 = 0x03;

/// The task id of MCP messages.
pub const MCP_TASK: TaskId = *b"mcp00001";

/// A task id: 8 ASCII bytes.
pub type TaskId = [u8; 8];

/// `##START` + type + task id + 4-digit seq.
const HEADER: usize = 7 + 1 + 8 + 4;
/// The same with the seq in brackets.
const HEADER_BRACKETED: usize = HEADER + 2;
/// Bytes kept at the end of the buffer while looking for a marker, in case
/// it arrives split: one less than the longest marker.
const KEEP: usize = START_MARK.len() - 1;

/// Whether a frame type is one of the three the protocol defines.
pub fn is_known(kind: u8) -> bool {
    matches!(kind, MCP | TEXT | END)
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The type byte.
    pub kind: u8,
    /// The task id.
    pub task: TaskId,
    /// The sequence number (0 to 9999).
    pub seq: u16,
    /// The payload: a slice of the received bytes.
    pub payload: Bytes,
}

impl Frame {
    /// The task id as text (it is ASCII).
    pub fn task_str(&self) -> &str {
        task_str(&self.task)
    }
}

/// A task id as text; task ids are ASCII by construction.
pub fn task_str(task: &TaskId) -> &str {
    std::str::from_utf8(task).unwrap_or("????????")
}

/// A task id from text: exactly 8 printable ASCII characters.
pub fn task_id(text: &str) -> Option<TaskId> {
    let bytes: TaskId = text.as_bytes().try_into().ok()?;
    bytes.iter().all(|b| b.is_ascii_graphic()).then_some(bytes)
}

/// What went wrong in the byte stream. Decoding goes on after each one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Bytes that are not part of any frame were dropped.
    #[error("{skipped} bytes outside any frame were skipped")]
    Garbage { skipped: usize },
    /// A frame grew past the maximum; it is skipped up to the next `##START`.
    #[error("a frame is longer than {max} bytes")]
    TooLarge { max: usize },
    /// The header after `##START` is not a task id and a seq.
    #[error("bad frame header: {0}")]
    BadHeader(&'static str),
    /// A new `##START` came before this frame's `##END`.
    #[error("a frame was cut off by the start of another")]
    Truncated,
}

impl DecodeError {
    /// A short name, for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::Garbage { .. } => "garbage",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::BadHeader(_) => "bad_header",
            DecodeError::Truncated => "truncated",
        }
    }
}

/// Incremental frame decoder.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    max_frame: usize,
    /// Inside a frame: where to resume looking for its end.
    scanned: usize,
    /// After a frame that was too large: drop silently until the next start.
    skipping: bool,
}

impl Decoder {
    /// A decoder that refuses frames longer than `max_frame` bytes (markers
    /// included; at least the size of an empty frame).
    pub fn new(max_frame: usize) -> Self {
        Decoder {
            buf: BytesMut::new(),
            max_frame: max_frame.max(HEADER_BRACKETED + END_MARK.len()),
            scanned: 0,
            skipping: false,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The buffer to read into directly (the one copy of a payload), with
    /// room for at least `n` more bytes.
    pub fn buffer_mut(&mut self, n: usize) -> &mut BytesMut {
        self.buf.reserve(n);
        &mut self.buf
    }

    /// Bytes received and not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next frame, an error to count (decoding may go on), or `None`
    /// when more bytes are needed.
    pub fn next_frame(&mut self) -> Option<Result<Frame, DecodeError>> {
        loop {
            // Find the start of a frame.
            if !self.buf.starts_with(START_MARK) {
                let skipped = match find(&self.buf, START_MARK, 0) {
                    Some(at) => at,
                    None => {
                        // Keep what could be the beginning of a split marker.
                        let keep = partial_suffix(&self.buf, START_MARK);
                        self.buf.len() - keep
                    }
                };
                if skipped == 0 {
                    return None;
                }
                self.buf.advance(skipped);
                if self.skipping {
                    // The rest of a frame already reported as too large.
                    if self.buf.starts_with(START_MARK) {
                        continue;
                    }
                    return None;
                }
                return Some(Err(DecodeError::Garbage { skipped }));
            }
            self.skipping = false;
            // The header.
            if self.buf.len() < HEADER {
                return None;
            }
            let kind = self.buf[7];
            let mut task = [0u8; 8];
            task.copy_from_slice(&self.buf[8..16]);
            if !task.iter().all(|b| b.is_ascii_graphic()) {
                self.buf.advance(START_MARK.len());
                return Some(Err(DecodeError::BadHeader("the task id is not 8 printable ASCII characters")));
            }
            let (seq_digits, header) = if self.buf[16] == b'[' {
                if self.buf.len() < HEADER_BRACKETED {
                    return None;
                }
                if self.buf[21] != b']' {
                    self.buf.advance(START_MARK.len());
                    return Some(Err(DecodeError::BadHeader("a bracketed seq must be \"[dddd]\"")));
                }
                (17..21, HEADER_BRACKETED)
            } else {
                (16..20, HEADER)
            };
            let digits = &self.buf[seq_digits];
            if !digits.iter().all(u8::is_ascii_digit) {
                self.buf.advance(START_MARK.len());
                return Some(Err(DecodeError::BadHeader("the seq is not 4 ASCII digits")));
            }
            let seq = digits.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
            // The end, or a new start that cuts this frame off.
            let from = self.scanned.max(header);
            match find_marker(&self.buf, from) {
                Some((at, true)) => {
                    self.scanned = 0;
                    if at + END_MARK.len() > self.max_frame {
                        self.buf.advance(at + END_MARK.len());
                        return Some(Err(DecodeError::TooLarge { max: self.max_frame }));
                    }
                    let mut frame = self.buf.split_to(at + END_MARK.len()).freeze();
                    frame.truncate(at);
                    frame.advance(header);
                    return Some(Ok(Frame { kind, task, seq, payload: frame }));
                }
                Some((at, false)) => {
                    self.scanned = 0;
                    self.buf.advance(at);
                    return Some(Err(DecodeError::Truncated));
                }
                None => {
                    if self.buf.len() > self.max_frame {
                        // Drop it, keeping what may begin the next marker.
                        let keep = partial_suffix(&self.buf, START_MARK);
                        let drop = self.buf.len() - keep;
                        self.buf.advance(drop);
                        self.scanned = 0;
                        self.skipping = true;
                        return Some(Err(DecodeError::TooLarge { max: self.max_frame }));
                    }
                    self.scanned = self.buf.len().saturating_sub(KEEP).max(header);
                    return None;
                }
            }
        }
    }
}

/// The first `needle` in `hay` at or after `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while at + needle.len() <= hay.len() {
        let rel = memchr::memchr(needle[0], &hay[at..=hay.len() - needle.len()])?;
        at += rel;
        if hay[at..].starts_with(needle) {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// The first `##END` (true) or `##START` (false) at or after `from`.
fn find_marker(hay: &[u8], from: usize) -> Option<(usize, bool)> {
    let mut at = from;
    while at < hay.len() {
        let rel = memchr::memchr(b'#', &hay[at..])?;
        at += rel;
        let rest = &hay[at..];
        if rest.starts_with(END_MARK) {
            return Some((at, true));
        }
        if rest.starts_with(START_MARK) {
            return Some((at, false));
        }
        at += 1;
    }
    None
}

/// The length of the longest suffix of `hay` that is a proper prefix of `marker`.
fn partial_suffix(hay: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(hay.len() + 1)).rev().find(|&n| hay.ends_with(&marker[..n])).unwrap_or(0)
}

/// Writes one frame. The payload must not contain `##START` or `##END`
/// (use [`encode_json`] or [`encode_text`] for payloads that may).
pub fn encode(kind: u8, task: &TaskId, seq: u16, payload: &[u8], out: &mut BytesMut) {
    debug_assert!(find_marker(payload, 0).is_none(), "a payload with a frame marker");
    out.reserve(HEADER + payload.len() + END_MARK.len());
    out.put_slice(START_MARK);
    out.put_u8(kind);
    out.put_slice(task);
    let seq = seq % 10_000;
    out.put_slice(&[
        b'0' + (seq / 1000) as u8,
        b'0' + (seq / 100 % 10) as u8,
        b'0' + (seq / 10 % 10) as u8,
        b'0' + (seq % 10) as u8,
    ]);
    out.put_slice(payload);
    out.put_slice(END_MARK);
}

/// JSON text with no `##` in it: each `#` that follows a `#` is written
/// `\u0023` (a `#` can only be inside a string). Borrowed when nothing changes.
pub fn guard_json(json: &[u8]) -> Cow<'_, [u8]> {
    if !json.windows(2).any(|w| w == b"##") {
        return Cow::Borrowed(json);
    }
    let mut out = Vec::with_capacity(json.len() + 16);
    let mut previous = 0u8;
    for &b in json {
        if b == b'#' && previous == b'#' {
            out.extend_from_slice(b"\\u0023");
            previous = 0;
        } else {
            out.push(b);
            previous = b;
        }
    }
    Cow::Owned(out)
}

/// Writes an MCP (JSON) frame on the MCP task.
pub fn encode_json(seq: u16, json: &[u8], out: &mut BytesMut) {
    encode(MCP, &MCP_TASK, seq, &guard_json(json), out);
}

/// Writes `text` as text frames of `task`, each payload at most `max_payload`
/// bytes (at least 4), never splitting a character and never leaving `##` in
/// one frame. Returns the number of frames written (their seqs run from
/// `seq`). An empty text writes no frame.
pub fn encode_text(task: &TaskId, mut seq: u16, text: &str, max_payload: usize, out: &mut BytesMut) -> usize {
    let max_payload = max_payload.max(4);
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut frames = 0;
    while start < bytes.len() {
        let mut end = (start + max_payload).min(bytes.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // Split between two `#` so no frame holds `##`.
        if let Some(rel) = bytes[start..end].windows(2).position(|w| w == b"##") {
            end = start + rel + 1;
        }
        encode(TEXT, task, seq, &bytes[start..end], out);
        seq = (seq + 1) % 10_000;
        frames += 1;
        start = end;
    }
    frames
}

/// Writes the end-of-task frame.
pub fn encode_end(task: &TaskId, seq: u16, out: &mut BytesMut) {
    encode(END, task, seq, b"", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, task: &[u8; 8], seq: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode(kind, task, seq, payload, &mut out);
        out.to_vec()
    }

    fn all(d: &mut Decoder) -> Vec<Result<Frame, DecodeError>> {
        std::iter::from_fn(|| d.next_frame()).collect()
    }

    #[test]
    fn encodes_the_documented_layout() {
        assert_eq!(frame(MCP, b"mcp00001", 7, b"{}"), b"##START\x06mcp000010007{}##END");
        assert_eq!(frame(END, b"task0001", 12345, b""), b"##START\x03task00012345##END");
    }

    #[test]
    fn decodes_plain_and_bracketed_seq() {
        let mut d = Decoder::new(1024);
        d.push(b"##START\x06mcp000010042{\"a\":1}##END##START\x04task0001[0003]hello##END");
        let frames = all(&mut d);
        let first = frames[0].clone().unwrap();
        assert_eq!(
            (first.kind, first.task_str(), first.seq, &first.payload[..]),
            (MCP, "mcp00001", 42, &b"{\"a\":1}"[..])
        );
        let second = frames[1].clone().unwrap();
        assert_eq!(
            (second.kind, second.task_str(), second.seq, &second.payload[..]),
            (TEXT, "task0001", 3, &b"hello"[..])
        );
        assert_eq!(frames.len(), 2);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn frames_split_at_every_byte() {
        let wire = [frame(MCP, b"mcp00001", 1, b"{\"x\":\"#a#\"}"), frame(END, b"t0000001", 2, b"")].concat();
        for cut in 0..wire.len() {
            let mut d = Decoder::new(1024);
            d.push(&wire[..cut]);
            let mut got = all(&mut d);
            d.push(&wire[cut..]);
            got.extend(all(&mut d));
            let got: Vec<Frame> = got.into_iter().map(|r| r.unwrap_or_else(|e| panic!("cut {cut}: {e}"))).collect();
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(&got[0].payload[..], b"{\"x\":\"#a#\"}");
            assert_eq!(got[1].kind, END);
        }
    }

    #[test]
    fn garbage_before_a_frame_is_skipped_and_reported() {
        let mut d = Decoder::new(1024);
        d.push(b"hello##STA");
        assert_eq!(d.next_frame(), Some(Err(DecodeError::Garbage { skipped: 5 })));
        assert_eq!(d.next_frame(), None);
        d.push(b"RT\x04abcdefgh0000hi##END");
        assert_eq!(d.next_frame().unwrap().unwrap().payload, Bytes::from_static(b"hi"));
    }

    #[test]
    fn a_cut_off_frame_does_not_swallow_the_next() {
        let mut d = Decoder::new(1024);
        d.push(b"##START\x06mcp000010001{\"trunc");
        d.push(&frame(MCP, b"mcp00001", 2, b"{}"));
        assert_eq!(d.next_frame(), Some(Err(DecodeError::Truncated)));
        let next = d.next_frame().unwrap().unwrap();
        assert_eq!((next.seq, &next.payload[..]), (2, &b"{}"[..]));
    }

    #[test]
    fn oversized_frames_are_refused_and_skipped() {
        let mut d = Decoder::new(64);
        d.push(b"##START\x04task00010000");
        d.push(&[b'x'; 100]);
        assert_eq!(d.next_frame(), Some(Err(DecodeError::TooLarge { max: 64 })));
        d.push(&[b'y'; 100]);
        d.push(b"##END");
        // The rest of the big frame is dropped without more errors.
        assert_eq!(d.next_frame(), None);
        d.push(&frame(TEXT, b"task0002", 0, b"ok"));
        assert_eq!(d.next_frame().unwrap().unwrap().payload, Bytes::from_static(b"ok"));
        // A complete frame over the limit in one read is refused too.
        let mut d = Decoder::new(64);
        d.push(&frame(TEXT, b"task0003", 0, &[b'z'; 80]));
        d.push(&frame(TEXT, b"task0004", 0, b"next"));
        assert_eq!(d.next_frame(), Some(Err(DecodeError::TooLarge { max: 64 })));
        assert_eq!(d.next_frame().unwrap().unwrap().payload, Bytes::from_static(b"next"));
    }

    #[test]
    fn bad_headers_are_reported_and_skipped() {
        let mut d = Decoder::new(1024);
        d.push(b"##START\x06mcp0000100x1{}##END");
        assert!(matches!(d.next_frame(), Some(Err(DecodeError::BadHeader(_)))));
        // The rest is garbage up to the next frame.
        assert!(matches!(d.next_frame(), Some(Err(DecodeError::Garbage { .. }))));
        d.push(&frame(MCP, b"mcp00001", 1, b"{}"));
        assert!(d.next_frame().unwrap().is_ok());
        let mut d = Decoder::new(1024);
        d.push(b"##START\x06mcp\x0000001[0001}{}##END");
        assert!(matches!(d.next_frame(), Some(Err(DecodeError::BadHeader(_)))));
    }

    #[test]
    fn unknown_types_still_decode() {
        let mut d = Decoder::new(1024);
        d.push(&frame(0x7f, b"mcp00001", 0, b"?"));
        let f = d.next_frame().unwrap().unwrap();
        assert_eq!(f.kind, 0x7f);
        assert!(!is_known(f.kind));
    }

    #[test]
    fn payloads_are_not_copied() {
        let mut d = Decoder::new(1024);
        d.push(&frame(TEXT, b"task0001", 0, b"payload"));
        let start = d.buf.as_ptr() as usize;
        let f = d.next_frame().unwrap().unwrap();
        // The payload points into the receive buffer.
        assert_eq!(f.payload.as_ptr() as usize, start + HEADER);
    }

    #[test]
    fn json_with_hashes_stays_one_valid_frame() {
        let json = br###"{"text":"## not the end ##END ##START ###"}"###;
        let mut out = BytesMut::new();
        encode_json(5, json, &mut out);
        let mut d = Decoder::new(1024);
        d.push(&out);
        let f = d.next_frame().unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&f.payload).unwrap();
        assert_eq!(v["text"], "## not the end ##END ##START ###");
        assert_eq!(d.next_frame(), None);
    }

    #[test]
    fn text_is_split_by_size_characters_and_markers() {
        let text = "héllo ##END wörld ##START ###".repeat(3);
        let mut out = BytesMut::new();
        let n = encode_text(b"task0001", 9998, &text, 7, &mut out);
        let mut d = Decoder::new(64);
        d.push(&out);
        let frames: Vec<Frame> = all(&mut d).into_iter().map(Result::unwrap).collect();
        assert_eq!(frames.len(), n);
        assert_eq!(frames[1].seq, 9999);
        assert_eq!(frames[2].seq, 0, "the seq wraps at 10000");
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.payload.iter().copied()).collect();
        assert_eq!(String::from_utf8(joined).unwrap(), text);
        assert!(frames.iter().all(|f| std::str::from_utf8(&f.payload).is_ok() && f.payload.len() <= 7));
    }
}
