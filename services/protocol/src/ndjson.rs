//! Newline-delimited JSON, the stdio framing of MCP.
//!
//! Each message is one line; a message must not contain a raw line break. A
//! valid JSON text can only contain raw `\n` or `\r` as whitespace between
//! tokens (inside strings they must be escaped), so [`encode`] may replace
//! them with spaces without changing the message.

use bytes::{BufMut, Bytes, BytesMut};

/// A line grew past the configured maximum.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line longer than {0} bytes")]
pub struct LineTooLong(pub usize);

/// Incremental line splitter.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    max_line: usize,
    scanned: usize,
    // After an over-long line: drop bytes up to the next line break.
    skipping: bool,
}

impl Decoder {
    /// A decoder that refuses lines longer than `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        Decoder { buf: BytesMut::new(), max_line, scanned: 0, skipping: false }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The spare capacity to read into directly, growing it to at least `n`.
    pub fn buffer_mut(&mut self, n: usize) -> &mut BytesMut {
        self.buf.reserve(n);
        &mut self.buf
    }

    /// The next non-blank line without its terminator (`\n` or `\r\n`).
    ///
    /// After a [`LineTooLong`] error the decoder skips to the next line break.
    pub fn next_line(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        loop {
            let Some(rel) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') else {
                self.scanned = self.buf.len();
                if self.skipping || self.buf.len() > self.max_line {
                    self.buf.clear();
                    self.scanned = 0;
                    if !self.skipping {
                        self.skipping = true;
                        return Err(LineTooLong(self.max_line));
                    }
                }
                return Ok(None);
            };
            let end = self.scanned + rel;
            self.scanned = 0;
            let mut line = self.buf.split_to(end + 1).freeze();
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.truncate(end - 1);
            }
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if line.len() > self.max_line {
                return Err(LineTooLong(self.max_line));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Ok(Some(line));
        }
    }
}

/// One message as a line: raw line breaks become spaces, and `\n` ends it.
pub fn encode(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(message.len() + 1);
    out.put_slice(message);
    for b in out.iter_mut() {
        if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
    out.put_u8(b'\n');
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_across_chunks() {
        let mut d = Decoder::new(64);
        d.push(b"{\"a\":1}\n\n  \r\n{\"b\"");
        assert_eq!(d.next_line().unwrap().as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(d.next_line().unwrap(), None);
        d.push(b":2}\r\n");
        assert_eq!(d.next_line().unwrap().as_deref(), Some(&b"{\"b\":2}"[..]));
        assert_eq!(d.next_line().unwrap(), None);
    }

    #[test]
    fn long_lines_are_refused_and_skipped() {
        let mut d = Decoder::new(4);
        d.push(b"0123456789");
        assert_eq!(d.next_line(), Err(LineTooLong(4)));
        d.push(b"tail");
        assert_eq!(d.next_line(), Ok(None));
        d.push(b"\nok\n");
        // The rest of the long line is dropped, then decoding resumes.
        assert_eq!(d.next_line().unwrap().as_deref(), Some(&b"ok"[..]));
    }

    #[test]
    fn encode_removes_raw_breaks() {
        let out = encode(b"{\n  \"a\": \"x\\ny\"\r\n}");
        assert_eq!(&out[..], b"{   \"a\": \"x\\ny\"  }\n");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["a"], "x\ny");
    }
}
