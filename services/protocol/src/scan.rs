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
//! instructions (its visitor machinery on every short string); this pass
//! takes about 1,800 for one of 131 bytes (callgrind).
//!
//! [`request`] does the same for a client's request or notification, and
//! reads the routing members of its `params` (and of `params._meta`) in
//! the same pass: what `Envelope::parse` and `Target::parse` would read.
//! For a `tools/call` of 105 bytes this pass takes about 2,000
//! instructions, and `Envelope::parse` with its target about 2,700, where
//! serde_json took about 4,800 (callgrind). It too is sure or says nothing
//! (`tests/scan_fuzz.rs` checks `Envelope::parse` against serde_json alone
//! on generated requests).

use std::ops::Range;

use crate::kind::MessageKind;

/// The kind of an answer ([`MessageKind::Response`] or
/// [`MessageKind::Error`]) and where its id is in `input`, if `input` is
/// surely one (see the module docs).
pub fn answer(input: &[u8]) -> Option<(MessageKind, Range<usize>)> {
    let (kind, id, end) = answer_at_start(input)?;
    let mut s = Scanner { b: input, at: end };
    s.ws();
    (s.at == input.len()).then_some((kind, id))
}

/// [`answer`] of the JSON object at the start of `input` (after any
/// whitespace), whatever follows it, and where that object ends: what
/// [`object_len`] and [`answer`] find, in one pass, of an answer in a
/// stream of values.
pub fn answer_at_start(input: &[u8]) -> Option<(MessageKind, Range<usize>, usize)> {
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
    if input.get(jsonrpc?)? != b"\"2.0\"" {
        return None;
    }
    let kind = match (result, error) {
        (Some(_), None) => MessageKind::Response,
        (None, Some(_)) => MessageKind::Error,
        _ => return None,
    };
    let id = id?;
    let first = input[id.start];
    (first == b'"' || first == b'-' || first.is_ascii_digit()).then_some((kind, id, s.at))
}

/// The length of the JSON object `input` begins with, if it surely is one
/// (see the module docs): where a stream of JSON values (an answer's body)
/// ends its first. `None` for anything else or anything unsure, an object
/// cut short included.
pub fn object_len(input: &[u8]) -> Option<usize> {
    if input.first() != Some(&b'{') {
        return None;
    }
    let mut s = Scanner { b: input, at: 0 };
    s.value()?;
    Some(s.at)
}

/// Where a request's (or notification's) members are in its bytes, by
/// [`request`]: each value's span, quotes included for strings.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestSpans {
    /// `id`: a string or a number; `None` in a notification.
    pub id: Option<Range<usize>>,
    /// `method`: a string without escapes.
    pub method: Range<usize>,
    /// `params`: an object.
    pub params: Option<Range<usize>>,
    /// The members of `params` a router reads (`null` is taken as absent,
    /// as `Target::parse` takes it).
    pub name: Option<Range<usize>>,
    pub uri: Option<Range<usize>>,
    pub arguments: Option<Range<usize>>,
    pub request_id: Option<Range<usize>>,
    /// `params._meta`: an object (`null` is absent).
    pub meta: Option<Range<usize>>,
    pub progress_token: Option<Range<usize>>,
    pub traceparent: Option<Range<usize>>,
    /// The 2026-07-28 era's members of `params._meta`: the request's
    /// protocol version, the client's capabilities and the log level it
    /// wants (`modern::META_*`).
    pub protocol_version: Option<Range<usize>>,
    pub client_capabilities: Option<Range<usize>>,
    pub log_level: Option<Range<usize>>,
}

/// How deep a value inside a request is followed here: well inside
/// serde_json's limit (128 levels, counted from the message), which the
/// message, `params` and `_meta` take three of.
const REQUEST_DEPTH: u32 = 100;

/// Where the members of `input` are, if it is surely a request or a
/// notification: one JSON object with `"jsonrpc":"2.0"`, a `method` string
/// without escapes, maybe a string or number `id`, maybe a `params` object,
/// no `result` or `error`, nothing after it. `None` for anything else or
/// anything unsure (escaped or repeated member names at the top, in
/// `params` or in `params._meta`; `params.ref`; a `_meta` that is neither
/// an object nor `null`; nesting deeper than 100).
pub fn request(input: &[u8]) -> Option<RequestSpans> {
    let mut s = Scanner { b: input, at: 0 };
    let mut out = RequestSpans::default();
    let (mut jsonrpc, mut id, mut method, mut params) = (None, None, None, None);
    s.ws();
    s.object(|s, key| {
        let start = s.at;
        let slot = match key {
            b"params" => {
                s.params(&mut out)?;
                &mut params
            }
            _ => {
                s.value_within(REQUEST_DEPTH)?;
                match key {
                    b"jsonrpc" => &mut jsonrpc,
                    b"id" => &mut id,
                    b"method" => &mut method,
                    b"result" | b"error" => return None,
                    _ if key.contains(&b'\\') => return None,
                    _ => return Some(()),
                }
            }
        };
        first(slot, start..s.at)
    })?;
    out.params = params;
    s.ws();
    if s.at != input.len() || input.get(jsonrpc?)? != b"\"2.0\"" {
        return None;
    }
    let method: Range<usize> = method?;
    let text = &input[method.clone()];
    if text[0] != b'"' || text.contains(&b'\\') {
        return None;
    }
    out.method = method;
    if let Some(id) = &id {
        let first = input[id.start];
        if !(first == b'"' || first == b'-' || first.is_ascii_digit()) {
            return None;
        }
    }
    out.id = id;
    Some(out)
}

/// Keeps `span` in `slot`, which must be empty: a member named twice is
/// not read here (`None`).
fn first(slot: &mut Option<Range<usize>>, span: Range<usize>) -> Option<()> {
    slot.replace(span).is_none().then_some(())
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

impl<'a> Scanner<'a> {
    /// White space, if any: one comparison when there is none (a compact
    /// message has none, and this is called about four times a member).
    #[inline(always)]
    fn ws(&mut self) {
        // Every white space byte is at or below `b' '`.
        if self.b.get(self.at).is_some_and(|&b| b <= b' ') {
            self.ws_run();
        }
    }

    #[inline(never)]
    fn ws_run(&mut self) {
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
    ///
    /// A string of plain bytes (most of them: names, methods, short values)
    /// is read here, inlined where it is called; the rest by
    /// [`Scanner::string_rest`]. Called a score of times a message, the
    /// call itself had cost about as much as the bytes it reads.
    #[inline(always)]
    fn string(&mut self) -> Option<Range<usize>> {
        let open = self.at;
        if self.b.get(open) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        self.plain_run();
        if self.b.get(self.at) == Some(&b'"') {
            self.at += 1;
            return Some(open..self.at);
        }
        self.string_rest(open)
    }

    /// Past the plain bytes from here (see [`PLAIN`]): eight at a time
    /// while eight are left (a JSON text goes on after a string), then a
    /// byte at a time.
    #[inline(always)]
    fn plain_run(&mut self) {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        // Where a byte of `v` is zero (a borrow into its high bit); only
        // the lowest is sure, which is the one read.
        let zero = |v: u64| v.wrapping_sub(ONES) & !v;
        while let Some(chunk) = self.b.get(self.at..self.at + 8) {
            let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            // Below 0x20, the high half, `"` or `\\`: the first of them ends
            // the run (a borrow only reaches the bytes after it).
            let stop =
                (x.wrapping_sub(0x20 * ONES) & !x | x | zero(x ^ (0x22 * ONES)) | zero(x ^ (0x5c * ONES))) & HIGH;
            if stop != 0 {
                self.at += (stop.trailing_zeros() / 8) as usize;
                return;
            }
            self.at += 8;
        }
        while self.b.get(self.at).is_some_and(|&c| PLAIN[usize::from(c)]) {
            self.at += 1;
        }
    }

    /// The rest of a string opened at `open`, from its first byte that is
    /// not plain.
    #[inline(never)]
    fn string_rest(&mut self, open: usize) -> Option<Range<usize>> {
        let mut high = false;
        loop {
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
            self.plain_run();
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

    /// An object, from its opening brace: `each` reads each member's value,
    /// given its name, or says `None` (the object is not one to read here).
    fn object(&mut self, mut each: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.member()?;
            each(self, key)?;
            if self.end_of_member()? {
                return Some(());
            }
        }
    }

    /// A member's name, its colon and the white space after it, at the
    /// start of a member of an object: the name's bytes, quotes left out.
    fn member(&mut self) -> Option<&'a [u8]> {
        let b = self.b;
        self.ws();
        let key = self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(&b[key.start + 1..key.end - 1])
    }

    /// After a member's value: `true` at the object's end, `false` before
    /// its next member.
    fn end_of_member(&mut self) -> Option<bool> {
        self.ws();
        match self.next()? {
            b',' => Some(false),
            b'}' => Some(true),
            _ => None,
        }
    }

    /// A value that is `null` (after a member's name) is absent.
    fn not_null(&self, value: Range<usize>) -> Option<Range<usize>> {
        (&self.b[value.clone()] != b"null").then_some(value)
    }

    /// A request's `params`: an object, its routing members into `out`.
    fn params(&mut self, out: &mut RequestSpans) -> Option<()> {
        let (mut name, mut uri, mut arguments, mut request_id, mut cursor, mut meta) =
            (None, None, None, None, None, None);
        self.object(|s, key| {
            let start = s.at;
            let slot = match key {
                b"_meta" => {
                    match s.peek()? {
                        b'{' => s.meta(out)?,
                        b'n' => s.literal(b"null")?,
                        _ => return None,
                    }
                    &mut meta
                }
                // A reference is read by the parser, for the rare completion.
                b"ref" => return None,
                _ => {
                    s.value_within(REQUEST_DEPTH)?;
                    match key {
                        b"name" => &mut name,
                        b"uri" => &mut uri,
                        b"arguments" => &mut arguments,
                        b"requestId" => &mut request_id,
                        b"cursor" => &mut cursor,
                        _ if key.contains(&b'\\') => return None,
                        _ => return Some(()),
                    }
                }
            };
            first(slot, start..s.at)
        })?;
        out.name = name.and_then(|v| self.not_null(v));
        out.uri = uri.and_then(|v| self.not_null(v));
        out.arguments = arguments.and_then(|v| self.not_null(v));
        out.request_id = request_id.and_then(|v| self.not_null(v));
        out.meta = meta.and_then(|v| self.not_null(v));
        Some(())
    }

    /// `params._meta`, an object: its routing members into `out`.
    fn meta(&mut self, out: &mut RequestSpans) -> Option<()> {
        let (mut progress_token, mut traceparent) = (None, None);
        let (mut version, mut capabilities, mut log_level) = (None, None, None);
        self.object(|s, key| {
            let start = s.at;
            s.value_within(REQUEST_DEPTH)?;
            match key {
                b"progressToken" => first(&mut progress_token, start..s.at),
                b"traceparent" => first(&mut traceparent, start..s.at),
                b"io.modelcontextprotocol/protocolVersion" => first(&mut version, start..s.at),
                b"io.modelcontextprotocol/clientCapabilities" => first(&mut capabilities, start..s.at),
                b"io.modelcontextprotocol/logLevel" => first(&mut log_level, start..s.at),
                _ if key.contains(&b'\\') => None,
                _ => Some(()),
            }
        })?;
        out.progress_token = progress_token.and_then(|v| self.not_null(v));
        out.traceparent = traceparent.and_then(|v| self.not_null(v));
        out.protocol_version = version.and_then(|v| self.not_null(v));
        out.client_capabilities = capabilities.and_then(|v| self.not_null(v));
        out.log_level = log_level.and_then(|v| self.not_null(v));
        Some(())
    }

    /// Any JSON value, without recursion: the open containers are bits of
    /// `objects` (1: an object), `depth` of them.
    fn value(&mut self) -> Option<()> {
        self.value_within(MAX_DEPTH)
    }

    /// [`Scanner::value`], `max` levels deep at most.
    fn value_within(&mut self, max: u32) -> Option<()> {
        let mut objects: u128 = 0;
        let mut depth: u32 = 0;
        // Whether the innermost open container is an object: the bit of
        // `objects` at `depth - 1`, kept apart (a shift of a `u128` at
        // every value's end cost more than the value).
        let mut object = false;
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
                        if depth == max {
                            return None;
                        }
                        object = open == b'{';
                        if object {
                            objects |= 1 << depth;
                        } else {
                            objects &= !(1 << depth);
                        }
                        depth += 1;
                        if object {
                            self.name()?;
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
                self.ws();
                match self.next()? {
                    b',' => {
                        if object {
                            self.name()?;
                        }
                        break;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                depth -= 1;
                object = depth > 0 && objects >> (depth - 1) & 1 == 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_runs_end_at_the_first_byte_that_is_not_plain() {
        // Every byte in every place of runs of every length up to 40, from
        // every start up to 8 (in words, in the bytes after the last word).
        for b in 0..=255u8 {
            for at in 0..40 {
                let mut bytes = [b'a'; 40];
                bytes[at] = b;
                for start in 0..8 {
                    for len in start..=40 {
                        let mut s = Scanner { b: &bytes[..len], at: start };
                        s.plain_run();
                        let end = if PLAIN[usize::from(b)] || at >= len || at < start { len } else { at };
                        assert_eq!(s.at, end, "{b:#x} at {at} of {start}..{len}");
                    }
                }
            }
        }
    }

    #[test]
    fn requests_are_read_with_their_target_and_anything_unsure_is_left_to_the_parser() {
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"u0__echo","arguments":{"text":"hi"},"_meta":{"progressToken":7,"traceparent":null,"x":{}}}}"#;
        let spans = request(call).unwrap();
        let at = |r: Option<Range<usize>>| r.map(|r| std::str::from_utf8(&call[r]).unwrap());
        assert_eq!(at(spans.id.clone()), Some("1"));
        assert_eq!(at(Some(spans.method.clone())), Some(r#""tools/call""#));
        assert_eq!(at(spans.name.clone()), Some(r#""u0__echo""#));
        assert_eq!(at(spans.arguments.clone()), Some(r#"{"text":"hi"}"#));
        assert_eq!(at(spans.progress_token.clone()), Some("7"));
        assert_eq!(at(spans.traceparent.clone()), None, "null is absent");
        assert_eq!(at(spans.meta.clone()), Some(r#"{"progressToken":7,"traceparent":null,"x":{}}"#));
        let nulls = br#"{"jsonrpc":"2.0","method":"m","params":{"name":null,"_meta":null,"uri":null}}"#;
        let spans = request(nulls).unwrap();
        assert!(spans.id.is_none() && spans.name.is_none() && spans.meta.is_none() && spans.uri.is_none());
        for unsure in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#[..], // repeated
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{},"params":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"name":null,"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"_meta":{"traceparent":"a","traceparent":"b"}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"cursor":"a","cursor":"b"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"me\u0074hod":"a"}"#, // escaped names
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"na\u006de":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"_meta":{"progress\u0054oken":1}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools\/call"}"#, // an escaped method
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"ref":{"type":"ref/prompt","name":"p"}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"_meta":[]}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":[1]}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":null}"#,
            br#"{"jsonrpc":"2.0","id":null,"method":"a"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"a"}"#,
            br#"{"id":1,"method":"a"}"#,
            br#"{}"#,
        ] {
            assert_eq!(request(unsure), None, "{}", String::from_utf8_lossy(unsure));
        }
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"a",}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"name":"x",}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"arguments":{"a" 1}}}"#,
            br#"{"jsonrpc":"2.0","id":01,"method":"a"}"#,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\x01\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\",\"params\":{\"name\":\"\xff\"}}",
            br#"{"jsonrpc":"2.0","id":1,"method":"a"} x"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"a""#,
        ] {
            assert_eq!(request(bad), None, "{}", String::from_utf8_lossy(bad));
            assert!(crate::jsonrpc::Envelope::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // Nesting: 100 levels inside a member are read here, deeper is the parser's.
        let nested = |n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"a","params":{{"arguments":{}1{}}}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        assert!(request(nested(100).as_bytes()).is_some());
        assert_eq!(request(nested(101).as_bytes()), None);
    }

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

    #[test]
    fn an_objects_length_is_where_serde_json_ends_it_and_anything_unsure_is_none() {
        let first = br#"{"jsonrpc":"2.0","id":1,"result":{"a":[1,"}",{"b":null}]}}"#;
        for tail in [&b""[..], b"\n", b"\n{\"jsonrpc\":\"2.0\"}", b" x"] {
            let input = [&first[..], tail].concat();
            let mut values = serde_json::Deserializer::from_slice(&input).into_iter::<serde::de::IgnoredAny>();
            values.next().unwrap().unwrap();
            assert_eq!(object_len(&input), Some(values.byte_offset()), "{:?}", String::from_utf8_lossy(&input));
            assert_eq!(object_len(&input), Some(first.len()));
        }
        // Cut short anywhere: not an object yet.
        for end in 0..first.len() {
            assert_eq!(object_len(&first[..end]), None, "{:?}", String::from_utf8_lossy(&first[..end]));
        }
        // Not an object, not JSON, or too deep: left to serde_json.
        for input in [&b" {}"[..], b"[1]", b"1", b"\"a\"", b"{\"a\":}", b"{\"a\":1,}", b"{'a':1}", b"{\"a\":tru}"] {
            assert_eq!(object_len(input), None, "{:?}", String::from_utf8_lossy(input));
        }
        let deep = format!("{}1{}", r#"{"a":"#.repeat(129), "}".repeat(129));
        assert_eq!(object_len(deep.as_bytes()), None);
        let fine = format!("{}1{}", r#"{"a":"#.repeat(128), "}".repeat(128));
        assert_eq!(object_len(fine.as_bytes()), Some(fine.len()));
    }

    #[test]
    fn an_answer_at_the_start_is_what_answer_says_of_it_alone_and_ends_where_it_does() {
        let answers: [&[u8]; 4] = [
            br#"{"jsonrpc":"2.0","id":1,"result":{"a":[1,"}",{"b":null}]}}"#,
            br#"{"result":{},"id":"x\"y","jsonrpc":"2.0"}"#,
            br#"{"jsonrpc":"2.0","id":-2,"error":{"code":-32602,"message":"no"}}"#,
            br#"{ "jsonrpc" : "2.0" , "id" : 7 , "result" : 1 }"#,
        ];
        for first in answers {
            let (kind, id) = answer(first).expect("an answer");
            for tail in [&b""[..], b"\n", b"\n{\"jsonrpc\":\"2.0\"}", b" x"] {
                let input = [first, tail].concat();
                assert_eq!(answer_at_start(&input), Some((kind, id.clone(), first.len())), "{:?}", input);
            }
            // Cut short anywhere: nothing.
            for end in 0..first.len() {
                assert_eq!(answer_at_start(&first[..end]), None);
            }
        }
        // Not an answer (whatever follows): nothing, as from answer.
        for input in [
            &br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#,
            br#"{"jsonrpc":"1.0","id":1,"result":1}"#,
            br#"{"jsonrpc":"2.0","id":null,"result":1}"#,
            br#"{"jsonrpc":"2.0","result":1,"result":2,"id":1}"#,
        ] {
            assert_eq!(answer(input), None);
            assert_eq!(answer_at_start(&[input, b"\n{}"].concat()), None, "{:?}", String::from_utf8_lossy(input));
        }
    }
}
