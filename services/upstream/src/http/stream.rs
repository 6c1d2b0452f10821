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
                    return Some(Ok(Item::Paused));
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
