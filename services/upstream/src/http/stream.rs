//! The messages of one SSE answer, resumed with `Last-Event-ID` when the
//! server ends the stream early (2025-11-25 SSE polling).

use std::sync::Weak;
use std::time::Duration;

use async_trait::async_trait;
use switchboard_protocol::sse;

use super::{AnswerBody, SessionState, Shared, MAX_MESSAGE_BYTES};
use crate::{Item, MessageStream, UpstreamError};

/// Messages of one SSE response, resuming with `Last-Event-ID` when the
/// server ends the stream early.
pub(super) struct SseStream {
    body: AnswerBody,
    decoder: sse::Decoder,
    resume: Option<(Weak<Shared>, SessionState)>,
    pub(super) last_event_id: Option<String>,
    pub(super) retry: Option<Duration>,
    resumes: u32,
    /// The stream ended early; resume on the next call.
    paused: bool,
}

impl SseStream {
    /// A stream resumed after `last_event_id` (see [`SseStream::new`]).
    pub(super) fn resumed(body: AnswerBody, resume: Option<(Weak<Shared>, SessionState)>, last_event_id: &str) -> Self {
        let mut stream = SseStream::new(body, resume);
        stream.last_event_id = Some(last_event_id.to_owned());
        stream
    }

    pub(super) fn new(body: AnswerBody, resume: Option<(Weak<Shared>, SessionState)>) -> Self {
        SseStream {
            body,
            decoder: sse::Decoder::new(MAX_MESSAGE_BYTES),
            resume,
            last_event_id: None,
            retry: None,
            resumes: 0,
            paused: false,
        }
    }

    /// Whether the stream can be resumed with `Last-Event-ID`.
    fn can_resume(&self) -> bool {
        self.resume.is_some() && self.last_event_id.is_some() && self.resumes < 5
    }

    /// Reconnects with `Last-Event-ID`; false if that is not possible.
    async fn resume(&mut self) -> bool {
        if !self.can_resume() {
            return false;
        }
        let (Some((shared, state)), Some(last)) = (&self.resume, &self.last_event_id) else { return false };
        let Some(shared) = shared.upgrade() else { return false };
        self.resumes += 1;
        tokio::time::sleep(self.retry.unwrap_or(Duration::from_millis(100)).min(Duration::from_secs(10))).await;
        match shared.get(state, Some(last)).await {
            Ok(resp) if resp.status.is_success() => {
                self.body = resp.body;
                self.decoder = sse::Decoder::new(MAX_MESSAGE_BYTES);
                true
            }
            _ => false,
        }
    }
}

#[async_trait]
impl MessageStream for SseStream {
    fn resume_point(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>> {
        if std::mem::take(&mut self.paused) && !self.resume().await {
            return None;
        }
        loop {
            match self.decoder.next_event() {
                Err(e) => return Some(Err(UpstreamError::Protocol(crate::Cause::from_error(e)))),
                Ok(Some(mut event)) => {
                    if let Some(id) = event.id.take() {
                        self.last_event_id = Some(id);
                    }
                    if let Some(ms) = event.retry {
                        self.retry = Some(Duration::from_millis(ms));
                    }
                    if event.data.is_empty() || !event.is_message() {
                        continue;
                    }
                    self.resumes = 0;
                    return Some(Ok(Item::Message(event.data)));
                }
                Ok(None) => {}
            }
            match self.body.chunk().await {
                Some(Ok(data)) => self.decoder.push(&data),
                // The server ended (or lost) the stream before answering: if it
                // gave an event id, we can resume with it; say so first.
                Some(Err(_)) | None if self.can_resume() => {
                    self.paused = true;
                    return Some(Ok(Item::Paused { retry: self.retry }));
                }
                Some(Err(e)) => {
                    return Some(Err(UpstreamError::Connect(crate::Cause::with_source(
                        format!("stream broke: {e}"),
                        e,
                    ))))
                }
                None => return None,
            }
        }
    }
}

/// Bodies of `application/json` answers up to this size are parsed as they
/// arrive (to find where a value ends); larger ones only once complete.
const EAGER_PARSE_BYTES: usize = 1 << 20;

/// The JSON values of an `application/json` answer, one after another as
/// each completes: the response alone as a rule, but some servers stream
/// several, newline-delimited (the official conformance server does, for
/// a stateless request's notifications), which are relayed as they come.
pub(super) struct JsonValues {
    body: AnswerBody,
    buf: bytes::BytesMut,
    ended: bool,
    /// A value read ahead, to be yielded first.
    first: Option<bytes::Bytes>,
    /// The last value's kind and id, when it was delimited as an answer by
    /// the quick read ([`scan::answer_at_start`](switchboard_protocol::scan::answer_at_start)).
    answer: Option<(switchboard_protocol::MessageKind, std::ops::Range<usize>)>,
}

impl JsonValues {
    pub(super) fn new(body: AnswerBody) -> Self {
        JsonValues { body, buf: bytes::BytesMut::new(), ended: false, first: None, answer: None }
    }

    /// The kind and id of the value [`next_value`](Self::next_value) gave
    /// last, if the quick read found it to be an answer (with the id's
    /// place in that value).
    pub(super) fn scanned_answer(&mut self) -> Option<(switchboard_protocol::MessageKind, std::ops::Range<usize>)> {
        self.answer.take()
    }

    /// The value at `start..end` of the buffer, taken with what is before it.
    fn take(&mut self, start: usize, end: usize) -> bytes::Bytes {
        let mut value = self.buf.split_to(end);
        let _ = value.split_to(start);
        value.freeze()
    }

    /// Puts a value read with [`next_value`](Self::next_value) back in front.
    pub(super) fn push_front(&mut self, value: bytes::Bytes) {
        self.first = Some(value);
    }

    /// The next complete value, as its bytes; `None` at the end.
    pub(super) async fn next_value(&mut self) -> Option<Result<bytes::Bytes, UpstreamError>> {
        self.answer = None;
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        // Parsed after a read that ended a line (how values are delimited
        // when several come) or at the end of the body: a single large
        // value is parsed once, not once per piece of it.
        let mut try_parse = !self.buf.is_empty();
        if !try_parse && !self.ended {
            match self.first_piece().await {
                Ok(Piece::Answer(value)) => return Some(Ok(value)),
                Ok(Piece::Buffered { newline }) => try_parse = newline || self.ended,
                Err(e) => return Some(Err(e)),
            }
        }
        loop {
            let start = self.buf.iter().position(|b| !b.is_ascii_whitespace());
            let Some(start) = start else {
                self.buf.clear();
                if self.ended {
                    return None;
                }
                match self.read().await {
                    Ok(newline) => try_parse = newline || self.ended,
                    Err(e) => return Some(Err(e)),
                }
                continue;
            };
            if try_parse {
                // An answer (as a rule, the only value) by the quick read,
                // its kind and id found with its end; another object by the
                // quick read too, sure of most; serde_json decides the rest,
                // and says when one is cut short.
                if let Some((kind, id, len)) = switchboard_protocol::scan::answer_at_start(&self.buf[start..]) {
                    self.answer = Some((kind, id));
                    return Some(Ok(self.take(start, start + len)));
                }
                if let Some(len) = switchboard_protocol::scan::object_len(&self.buf[start..]) {
                    return Some(Ok(self.take(start, start + len)));
                }
                let mut values =
                    serde_json::Deserializer::from_slice(&self.buf[start..]).into_iter::<serde::de::IgnoredAny>();
                match values.next() {
                    Some(Ok(_)) => {
                        let end = start + values.byte_offset();
                        return Some(Ok(self.take(start, end)));
                    }
                    Some(Err(e)) if e.is_eof() && !self.ended => {}
                    Some(Err(e)) => return Some(Err(UpstreamError::Protocol(crate::Cause::from_error(e)))),
                    None => {}
                }
            }
            if self.ended {
                return None;
            }
            match self.read().await {
                Ok(newline) => try_parse = self.ended || (newline && self.buf.len() <= EAGER_PARSE_BYTES),
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Reads the next piece of the body; whether it held a line break.
    async fn read(&mut self) -> Result<bool, UpstreamError> {
        match self.body.chunk().await {
            Some(Ok(data)) => self.push(&data),
            Some(Err(e)) => Err(e),
            None => {
                self.ended = true;
                Ok(false)
            }
        }
    }

    /// Buffers a piece of the body; whether it held a line break.
    fn push(&mut self, data: &[u8]) -> Result<bool, UpstreamError> {
        if self.buf.len() + data.len() > MAX_MESSAGE_BYTES {
            return Err(UpstreamError::Protocol(format!("a message larger than {MAX_MESSAGE_BYTES} bytes").into()));
        }
        self.buf.extend_from_slice(data);
        Ok(data.contains(&b'\n'))
    }

    /// A value from the next piece of the body, read with the buffer empty
    /// (the body's first, as a rule), when that piece holds an answer by
    /// the quick read and nothing else but white space: the piece's own
    /// bytes, not copied into the buffer and cut from it, as an answer of
    /// one piece (nearly every answer) was. What is read, and when, is what
    /// the loop of [`next_value`](Self::next_value) would read: with a line
    /// break after the answer, nothing more; else the next piece, whose
    /// absence (the body's end) hands the answer on. Anything else is
    /// buffered as [`read`](Self::read) buffers it.
    async fn first_piece(&mut self) -> Result<Piece, UpstreamError> {
        let data = match self.body.chunk().await {
            Some(data) => data?,
            None => {
                self.ended = true;
                return Ok(Piece::Buffered { newline: false });
            }
        };
        let start = data.iter().position(|b| !b.is_ascii_whitespace());
        let answer = match start {
            Some(start) if data.len() <= MAX_MESSAGE_BYTES => {
                switchboard_protocol::scan::answer_at_start(&data[start..])
                    .map(|(kind, id, len)| (start, kind, id, len))
            }
            _ => None,
        };
        if let Some((start, kind, id, len)) = answer {
            let after = &data[start + len..];
            if after.iter().all(u8::is_ascii_whitespace) {
                if !after.contains(&b'\n') {
                    match self.body.chunk().await {
                        None => self.ended = true,
                        Some(more) => {
                            let more = more?;
                            let newline = self.push(&data)?;
                            return Ok(Piece::Buffered { newline: self.push(&more)? || newline });
                        }
                    }
                }
                self.answer = Some((kind, id));
                return Ok(Piece::Answer(data.slice(start..start + len)));
            }
        }
        Ok(Piece::Buffered { newline: self.push(&data)? })
    }
}

/// What [`JsonValues::first_piece`] made of a piece read with the buffer empty.
enum Piece {
    /// An answer, the whole of it.
    Answer(bytes::Bytes),
    /// Buffered; whether it held a line break.
    Buffered { newline: bool },
}

#[async_trait]
impl MessageStream for JsonValues {
    async fn next_item(&mut self) -> Option<Result<Item, UpstreamError>> {
        self.next_value().await.map(|value| value.map(Item::Message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that arrives in these pieces.
    fn body(pieces: &[&str]) -> AnswerBody {
        AnswerBody::Pieces(pieces.iter().map(|p| bytes::Bytes::copy_from_slice(p.as_bytes())).collect())
    }

    async fn all(pieces: &[&str]) -> Vec<String> {
        let mut values = JsonValues::new(body(pieces));
        let mut out = Vec::new();
        while let Some(value) = values.next_value().await {
            out.push(String::from_utf8(value.unwrap().to_vec()).unwrap());
        }
        out
    }

    #[tokio::test]
    async fn json_answers_are_read_value_by_value_however_they_arrive() {
        // One value, in pieces, pretty-printed (line breaks inside it).
        assert_eq!(all(&["{\"a\":\n", "[1,\n2]", "}\n"]).await, ["{\"a\":\n[1,\n2]}"]);
        // Several, newline-delimited, cut anywhere.
        assert_eq!(
            all(&["{\"n\":1}\n{\"n\"", ":2}\n", "\n{\"n\":3}"]).await,
            [r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]
        );
        assert!(all(&["  \n "]).await.is_empty());
        // A value cut off by the end of the body is an error, not silence.
        let mut cut = JsonValues::new(body(&["{\"n\":1}\n{\"n\":"]));
        assert_eq!(&cut.next_value().await.unwrap().unwrap()[..], br#"{"n":1}"#);
        assert!(cut.next_value().await.unwrap().is_err());
    }

    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":7,"result":{"n":1}}"#;

    #[tokio::test]
    async fn an_answer_in_one_piece_is_that_pieces_own_bytes_once_the_body_ends() {
        let piece = bytes::Bytes::from(format!(" \r\n{ANSWER}\t "));
        let mut values = JsonValues::new(AnswerBody::Pieces([piece.clone()].into()));
        let value = values.next_value().await.unwrap().unwrap();
        assert_eq!(&value[..], ANSWER.as_bytes());
        assert_eq!(value.as_ptr(), piece[3..].as_ptr(), "not copied");
        assert!(values.ended, "the body's end was seen (its connection goes back to the pool)");
        let (kind, id) = values.scanned_answer().expect("read as an answer");
        assert_eq!((kind, &value[id]), (switchboard_protocol::MessageKind::Response, &b"7"[..]));
        assert!(values.next_value().await.is_none());
    }

    #[tokio::test]
    async fn an_answer_with_more_after_it_is_read_as_any_value() {
        // More values in the next pieces, with and without a line break
        // after the answer; another value in the answer's piece; a
        // notification first.
        let note = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#;
        for pieces in [
            vec![ANSWER.to_owned(), "\n{\"n\":2}".to_owned()],
            vec![format!("{ANSWER}\n"), "{\"n\":2}".to_owned()],
            vec![format!("{ANSWER}\n{{\"n\":2}}")],
            vec![format!("{ANSWER} {{\"n\":"), "2}".to_owned()],
        ] {
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(all(&pieces).await, [ANSWER, r#"{"n":2}"#], "{pieces:?}");
        }
        assert_eq!(all(&[&format!("{note}\n"), ANSWER]).await, [note, ANSWER]);
        // An answer cut short: the rest comes in the next piece.
        assert_eq!(all(&[&ANSWER[..20], &ANSWER[20..]]).await, [ANSWER]);
    }
}
