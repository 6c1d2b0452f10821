//! Server-Sent Events: an encoder for what we send and an incremental decoder
//! for what upstreams send us.
//!
//! The decoder follows the WHATWG event-stream grammar (lines end in `\n`,
//! `\r\n` or `\r`; `:` starts a comment; `data` lines of one event are joined
//! with `\n`; an optional BOM at the start) and takes input in arbitrary
//! chunks. A single-line `data` field is returned as a slice of the buffered
//! input, so a message is copied once, from the network chunk into the buffer.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// The `id` field, if the event had one.
    pub id: Option<String>,
    /// The `event` field (the type), if set; `None` means `message`.
    pub event: Option<String>,
    /// The data lines, joined with `\n`.
    pub data: Bytes,
    /// The `retry` field in milliseconds, if set.
    pub retry: Option<u64>,
}

impl Event {
    /// Whether this event carries a `message` (the default type).
    pub fn is_message(&self) -> bool {
        self.event.as_deref().is_none_or(|e| e == "message")
    }
}

/// The stream broke a limit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// An event grew past the configured maximum.
    #[error("SSE event larger than {0} bytes")]
    TooLarge(usize),
}

/// Incremental event-stream decoder.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    max_event: usize,
    started: bool,
    // The event being assembled.
    data: Vec<Bytes>,
    data_len: usize,
    id: Option<String>,
    event: Option<String>,
    retry: Option<u64>,
    has_fields: bool,
}

impl Decoder {
    /// A decoder that refuses events larger than `max_event` bytes.
    pub fn new(max_event: usize) -> Self {
        Decoder {
            buf: BytesMut::new(),
            max_event,
            started: false,
            data: Vec::new(),
            data_len: 0,
            id: None,
            event: None,
            retry: None,
            has_fields: false,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete event, if the buffered input holds one.
    ///
    /// Events without data (such as a priming event carrying only an `id`)
    /// are returned too, with empty `data`: callers decide what they mean.
    pub fn next_event(&mut self) -> Result<Option<Event>, DecodeError> {
        if !self.started {
            if self.buf.len() < 3 && b"\xEF\xBB\xBF".starts_with(&self.buf) {
                return Ok(None);
            }
            if self.buf.starts_with(b"\xEF\xBB\xBF") {
                self.buf.advance(3);
            }
            self.started = true;
        }
        loop {
            let Some((line_len, term_len)) = find_line(&self.buf) else {
                if self.buf.len() + self.data_len > self.max_event {
                    return Err(DecodeError::TooLarge(self.max_event));
                }
                return Ok(None);
            };
            let line = self.buf.split_to(line_len + term_len).freeze().slice(..line_len);
            if line.is_empty() {
                if self.has_fields {
                    return Ok(Some(self.dispatch()));
                }
                continue;
            }
            if line[0] == b':' {
                continue;
            }
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(colon) => {
                    let value_start = if line.get(colon + 1) == Some(&b' ') { colon + 2 } else { colon + 1 };
                    (line.slice(..colon), line.slice(value_start..))
                }
                None => (line.clone(), Bytes::new()),
            };
            match &field[..] {
                b"data" => {
                    self.data_len += value.len() + 1;
                    if self.data_len > self.max_event {
                        return Err(DecodeError::TooLarge(self.max_event));
                    }
                    self.data.push(value);
                    self.has_fields = true;
                }
                b"id" => {
                    if !value.contains(&0) {
                        self.id = Some(String::from_utf8_lossy(&value).into_owned());
                    }
                    self.has_fields = true;
                }
                b"event" => {
                    self.event = Some(String::from_utf8_lossy(&value).into_owned());
                    self.has_fields = true;
                }
                b"retry" => {
                    if let Some(ms) = std::str::from_utf8(&value).ok().and_then(|s| s.parse().ok()) {
                        self.retry = Some(ms);
                    }
                    self.has_fields = true;
                }
                _ => {}
            }
        }
    }

    fn dispatch(&mut self) -> Event {
        let data = match self.data.len() {
            0 => Bytes::new(),
            1 => self.data.pop().expect("one part"),
            _ => {
                let mut joined = BytesMut::with_capacity(self.data_len);
                for (i, part) in self.data.drain(..).enumerate() {
                    if i > 0 {
                        joined.put_u8(b'\n');
                    }
                    joined.put_slice(&part);
                }
                joined.freeze()
            }
        };
        self.data.clear();
        self.data_len = 0;
        self.has_fields = false;
        Event { id: self.id.take(), event: self.event.take(), data, retry: self.retry.take() }
    }
}

/// Finds the first complete line: `(length without terminator, terminator length)`.
/// A trailing lone `\r` is not complete yet: a `\n` may follow in the next chunk.
fn find_line(buf: &[u8]) -> Option<(usize, usize)> {
    let pos = buf.iter().position(|&b| b == b'\n' || b == b'\r')?;
    if buf[pos] == b'\n' {
        return Some((pos, 1));
    }
    match buf.get(pos + 1) {
        Some(b'\n') => Some((pos, 2)),
        Some(_) => Some((pos, 1)),
        None => None,
    }
}

/// Writes one `message` event: optional `id`, then `data` (split into
/// several `data:` lines if the payload contains line breaks).
pub fn encode_event(id: Option<&str>, event: Option<&str>, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len() + 32 + id.map_or(0, str::len));
    if let Some(event) = event {
        out.put_slice(b"event: ");
        out.put_slice(event.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(id) = id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        out.put_slice(b"data: ");
        out.put_slice(line);
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    out.freeze()
}

/// The id of an event the router sends: `STREAM-SEQ`, unique in a session
/// (stream 0 is the session's GET stream, every other number one request's
/// stream). A client that reconnects with `Last-Event-ID` names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId {
    pub stream: u64,
    pub seq: u64,
}

impl EventId {
    /// Reads `STREAM-SEQ` (surrounding spaces allowed).
    pub fn parse(text: &str) -> Option<EventId> {
        let (stream, seq) = text.trim().split_once('-')?;
        Some(EventId { stream: stream.parse().ok()?, seq: seq.parse().ok()? })
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.stream, self.seq)
    }
}

/// An event with id `id`, an optional `retry:` hint (in that order, before
/// the data lines) and `data`.
pub fn encode_with_id(id: EventId, retry: Option<u64>, data: &[u8]) -> Bytes {
    let id = id.to_string();
    match retry {
        None => encode_event(Some(&id), None, data),
        Some(millis) => {
            let mut out = BytesMut::with_capacity(48 + data.len());
            out.put_slice(format!("id: {id}\nretry: {millis}\n").as_bytes());
            out.put_slice(&encode_event(None, None, data));
            out.freeze()
        }
    }
}

/// A `retry:` field on its own, telling the client how long to wait before
/// reconnecting (SSE polling, 2025-11-25).
pub fn encode_retry(millis: u64) -> Bytes {
    Bytes::from(format!("retry: {millis}\n\n"))
}

/// A comment line that keeps an idle stream alive through proxies.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip() {
        let id = EventId { stream: 12, seq: 345 };
        assert_eq!(id.to_string(), "12-345");
        assert_eq!(EventId::parse(" 12-345 "), Some(id));
        assert_eq!(EventId::parse("nope"), None);
        assert_eq!(EventId::parse("1-x"), None);
        assert_eq!(&encode_with_id(id, None, b"{}")[..], b"id: 12-345\ndata: {}\n\n");
        assert_eq!(&encode_with_id(id, Some(500), b"")[..], b"id: 12-345\nretry: 500\ndata: \n\n");
    }

    fn decode_all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut d = Decoder::new(1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            d.push(c);
            while let Some(e) = d.next_event().unwrap() {
                out.push(e);
            }
        }
        out
    }

    #[test]
    fn decodes_events_split_anywhere() {
        let stream = b"\xEF\xBB\xBFid: 1\ndata: \n\n: comment\nevent: message\nid: 2\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\nretry: 3000\n\n";
        let whole = decode_all(&[stream]);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].id.as_deref(), Some("1"));
        assert!(whole[0].data.is_empty());
        assert_eq!(&whole[1].data[..], b"{\"a\":1}");
        assert_eq!(whole[1].id.as_deref(), Some("2"));
        assert!(whole[1].is_message());
        assert_eq!(&whole[2].data[..], b"x\ny");
        assert_eq!(whole[2].retry, Some(3000));
        // Every split point gives the same events.
        for cut in 0..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(decode_all(&[a, b]), whole, "cut at {cut}");
        }
        // Byte by byte too.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(decode_all(&bytes), whole);
    }

    #[test]
    fn lone_cr_terminates_lines() {
        let events = decode_all(&[b"data: a\r\rdata: b\r", b"\r\n"]);
        assert_eq!(events.len(), 2);
        assert_eq!(&events[1].data[..], b"b");
    }

    #[test]
    fn oversized_events_are_refused() {
        let mut d = Decoder::new(16);
        d.push(b"data: 0123456789abcdefghij");
        assert_eq!(d.next_event(), Err(DecodeError::TooLarge(16)));
    }

    #[test]
    fn encode_round_trips() {
        let bytes = encode_event(Some("s1-4"), None, b"{\n \"a\": 1\r\n}");
        let events = decode_all(&[&bytes]);
        assert_eq!(events[0].id.as_deref(), Some("s1-4"));
        assert_eq!(&events[0].data[..], b"{\n \"a\": 1\n}");
        let typed = encode_event(None, Some("endpoint"), b"/messages?sessionId=1");
        assert_eq!(decode_all(&[&typed])[0].event.as_deref(), Some("endpoint"));
    }
}
