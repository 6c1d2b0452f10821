//! A quick read of an upstream's answer to a request: a single pass over
//! its bytes that checks it is JSON, as strictly as serde_json does, and
//! finds what the router reads of it (its kind and its id), without
//! building anything. It is sure or it says nothing: anything it is not
//! sure of (escaped or repeated member names, `method` or `params`, a `null`
//! id, nesting deeper than 128, bytes that are not JSON) is `None`, and the
//! caller reads the message with [`Envelope::parse`](crate::jsonrpc::Envelope::parse),
//! which decides. What it accepts, `Envelope::parse` accepts with the same
//! kind and id (`tests/scan_fuzz.rs` checks that on generated answers).
//!
//! Through serde_json an answer of about 100 bytes cost about 3,300
//! instructions (its visitor machinery on every short string); this pass,
//! a few per byte.

use std::ops::Range;

use crate::jsonrpc::MessageKind;

/// The kind of an answer ([`MessageKind::Response`] or
/// [`MessageKind::Error`]) and where its id is in `input`, if `input` is
/// surely one (see the module docs).
pub fn answer(input: &[u8]) -> Option<(MessageKind, Range<usize>)> {
    let mut s = Scanner { b: input, at: 0 };
    s.ws();
    s.eat(b'{')?;
    let (mut jsonrpc, mut id, mut result, mut error) = (None, None, None, None);
    loop {
        s.ws();
        let key = s.string()?;
        let key = &input[key.start + 1..key.end - 1];
        s.ws();
        s.eat(b':')?;
        s.ws();
        let start = s.at;
        s.value()?;
        let slot = match key {
            b"jsonrpc" => &mut jsonrpc,
            b"id" => &mut id,
            b"result" => &mut result,
            b"error" => &mut error,
            // Not an answer's, or a name that may be one of those escaped.
            b"method" | b"params" => return None,
            _ if key.contains(&b'\\') => return None,
            _ => &mut None,
        };
        if slot.replace(start..s.at).is_some() {
            return None;
        }
        s.ws();
        match s.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    s.ws();
    if s.at != input.len() || input.get(jsonrpc?)? != b"\"2.0\"" {
        return None;
    }
    let kind = match (result, error) {
        (Some(_), None) => MessageKind::Response,
        (None, Some(_)) => MessageKind::Error,
        _ => return None,
    };
    let id = id?;
    let first = input[id.start];
    (first == b'"' || first == b'-' || first.is_ascii_digit()).then_some((kind, id))
}

struct Scanner<'a> {
    b: &'a [u8],
    at: usize,
}

/// The bytes a string holds as they are: printable ASCII but `"` and `\`.
static PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0x20;
    while b < 0x80 {
        plain[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    plain
};

/// How deep [`Scanner::value`] follows nesting (one bit per level).
const MAX_DEPTH: u32 = 128;

impl Scanner<'_> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.b.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// A string, from its opening quote: its span, quotes included.
    /// Control characters, bad escapes and bytes that are not UTF-8 are
    /// `None` (serde_json's rules: any `\u` of four hex digits goes).
    fn string(&mut self) -> Option<Range<usize>> {
        let open = self.at;
        self.eat(b'"')?;
        let mut high = false;
        loop {
            // The plain run, at a few instructions a byte.
            let rest = &self.b[self.at..];
            self.at += rest.iter().position(|&b| !PLAIN[usize::from(b)]).unwrap_or(rest.len());
            match self.next()? {
                b'"' => break,
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    b'u' => {
                        for _ in 0..4 {
                            if !self.next()?.is_ascii_hexdigit() {
                                return None;
                            }
                        }
                    }
                    _ => return None,
                },
                0..=0x1f => return None,
                0x80.. => high = true,
                _ => {}
            }
        }
        if high && std::str::from_utf8(&self.b[open + 1..self.at - 1]).is_err() {
            return None;
        }
        Some(open..self.at)
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at.checked_add(word.len())?;
        (self.b.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A member's name and its colon, inside an object.
    fn name(&mut self) -> Option<()> {
        self.ws();
        self.string()?;
        self.ws();
        self.eat(b':')
    }

    /// Any JSON value, without recursion: the open containers are bits of
    /// `objects` (1: an object), `depth` of them.
    fn value(&mut self) -> Option<()> {
        let mut objects: u128 = 0;
        let mut depth: u32 = 0;
        loop {
            self.ws();
            match self.peek()? {
                b'"' => {
                    self.string()?;
                }
                open @ (b'{' | b'[') => {
                    self.at += 1;
                    self.ws();
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.peek()? == close {
                        self.at += 1;
                    } else {
                        if depth == MAX_DEPTH {
                            return None;
                        }
                        if open == b'{' {
                            objects |= 1 << depth;
                            depth += 1;
                            self.name()?;
                        } else {
                            objects &= !(1 << depth);
                            depth += 1;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return None,
            }
            // A value ended: close what it ends, or go on to the next one.
            loop {
                if depth == 0 {
                    return Some(());
                }
                let object = objects >> (depth - 1) & 1 == 1;
                self.ws();
                match self.next()? {
                    b',' => {
                        if object {
                            self.name()?;
                        }
                        break;
                    }
                    b'}' if object => depth -= 1,
                    b']' if !object => depth -= 1,
                    _ => return None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_and_anything_unsure_is_left_to_the_parser() {
        let ok = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\"text\":\"hello\"}"}]}}"#;
        let (kind, id) = answer(ok).unwrap();
        assert_eq!((kind, &ok[id]), (MessageKind::Response, &b"1"[..]));
        let error =
            r#" { "error" : {"code":-32602,"message":"caf\u00e9 ☕"}, "id" : "a\"b" , "jsonrpc":"2.0" } "#.as_bytes();
        let (kind, id) = answer(error).unwrap();
        assert_eq!((kind, &error[id]), (MessageKind::Error, &br#""a\"b""#[..]));
        let numbers = br#"{"jsonrpc":"2.0","id":-0.5e+3,"result":[0,1.25,-7,3E2,true,false,null,[],{},[[{"a":[]}]]]}"#;
        assert!(answer(numbers).is_some());
        for unsure in [
            &br#"{"jsonrpc":"2.0","id":1,"result":{},"result":{}}"#[..], // repeated
            br#"{"jsonrpc":"2.0","\u0069d":1,"result":{}}"#,             // escaped name
            br#"{"jsonrpc":"2.0","id":null,"error":{}}"#,                // null id
            br#"{"jsonrpc":"2.0","id":1,"method":"x","result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
            br#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
            br#"{"id":1,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":true,"result":{}}"#,
            br#"{}"#,
        ] {
            assert_eq!(answer(unsure), None, "{}", String::from_utf8_lossy(unsure));
        }
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"result":{},}"#[..],
            br#"{"jsonrpc":"2.0","id":01,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1.,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":-,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":[1,]}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{"a" 1}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":"\x"}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":"\u12g4"}"#,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"a\x01\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xff\"}",
            br#"{"jsonrpc":"2.0","id":1,"result":tru}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{}} x"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{}"#,
        ] {
            assert_eq!(answer(bad), None, "{}", String::from_utf8_lossy(bad));
            assert!(crate::jsonrpc::Envelope::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // Nesting: 128 levels are read here, deeper is the parser's.
        let nested = |n: usize| format!(r#"{{"jsonrpc":"2.0","id":1,"result":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
        assert!(answer(nested(128).as_bytes()).is_some());
        assert_eq!(answer(nested(129).as_bytes()), None);
    }
}
