//! The response body: complete, in pieces, or an SSE stream with keep-alives.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use switchboard_protocol::sse;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};

/// What a response carries.
pub enum Body {
    /// Nothing.
    Empty,
    /// One buffer.
    Full(Option<Bytes>),
    /// One JSON message, labelled `application/json` where the response's
    /// head is written ([`crate::h1`]) or before hyper takes it
    /// ([`crate::downstream::respond::labelled`]), not in its header map:
    /// the forwarded call's answer, whose map would otherwise be built (two
    /// allocations) for that one header.
    Json(Option<Bytes>),
    /// Buffers sent in order, so that a prebuilt part (a cached list) is sent
    /// without copying it.
    Parts(VecDeque<Bytes>),
    /// Server-Sent Events as they are produced; a keep-alive comment after
    /// every idle `keep_alive`. Ends when the sender is dropped.
    Sse { rx: mpsc::Receiver<Bytes>, ticker: Interval },
}

impl Body {
    /// One buffer.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Body::Full(Some(bytes.into()))
    }

    /// An SSE stream fed by `rx`.
    pub fn sse(rx: mpsc::Receiver<Bytes>, keep_alive: Duration) -> Self {
        let mut ticker = tokio::time::interval_at(Instant::now() + keep_alive, keep_alive);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Body::Sse { rx, ticker }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Full(data) | Body::Json(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Body::Parts(parts) => Poll::Ready(parts.pop_front().map(|p| Ok(Frame::data(p)))),
            Body::Sse { rx, ticker } => match rx.poll_recv(cx) {
                Poll::Ready(Some(event)) => {
                    ticker.reset();
                    Poll::Ready(Some(Ok(Frame::data(event))))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => match ticker.poll_tick(cx) {
                    Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(sse::KEEP_ALIVE))))),
                    Poll::Pending => Poll::Pending,
                },
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(data) | Body::Json(data) => data.is_none(),
            Body::Parts(parts) => parts.is_empty(),
            Body::Sse { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Full(data) | Body::Json(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Body::Parts(parts) => SizeHint::with_exact(parts.iter().map(|p| p.len() as u64).sum()),
            Body::Sse { .. } => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn idle_sse_streams_get_keep_alive_comments() {
        let (tx, rx) = mpsc::channel(4);
        let mut body = Body::sse(rx, Duration::from_secs(15));
        tx.send(Bytes::from_static(b"data: {}\n\n")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"data: {}\n\n");
        // Nothing to send for 15 s: a comment keeps the connection alive.
        let started = Instant::now();
        let idle = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&idle[..], sse::KEEP_ALIVE);
        assert!(started.elapsed() >= Duration::from_secs(15));
        drop(tx);
        assert!(body.frame().await.is_none(), "the stream ends when its sender goes");
    }
}
