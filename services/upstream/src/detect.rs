//! An `"http"` upstream that may turn out to speak only the legacy HTTP+SSE
//! transport (protocol 2024-11-05).
//!
//! The era probe (`server/discover`, in the catalog) comes first; a server
//! that does not speak 2026-07-28 is sent `initialize` as Streamable HTTP.
//! If that POST is refused with 400, 404 or 405 (what a legacy server's
//! SSE endpoint answers a POST), the router does what the specification's
//! backwards-compatibility section tells clients to do: it GETs the same URL
//! expecting an event stream that opens with an `endpoint` event, and if one
//! comes, the upstream is a legacy HTTP+SSE server from then on (until a
//! restart). If the GET fails too, the Streamable HTTP error stands.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use switchboard_protocol::Method;

use super::{Channel, Hello, Inbox, ModernAnswer, UpstreamError, UpstreamSession};

const UNKNOWN: u8 = 0;
const STREAMABLE: u8 = 1;
const LEGACY: u8 = 2;

/// Streamable HTTP, falling back to legacy HTTP+SSE on the same URL.
pub struct Transport {
    name: Arc<str>,
    http: super::http::Transport,
    sse: super::sse::Transport,
    found: AtomicU8,
}

impl Transport {
    pub fn new(name: Arc<str>, http: super::http::Transport, sse: super::sse::Transport) -> Self {
        Transport { name, http, sse, found: AtomicU8::new(UNKNOWN) }
    }

    fn legacy(&self) -> bool {
        self.found.load(Ordering::Relaxed) == LEGACY
    }
}

/// Whether an `initialize` POST was refused the way a legacy HTTP+SSE
/// server's endpoint refuses it (the statuses the specification names).
fn refused_like_legacy(error: &UpstreamError) -> bool {
    matches!(error, UpstreamError::Status { status: 400 | 404 | 405, .. })
}

#[async_trait]
impl super::Transport for Transport {
    async fn modern(
        &self,
        body: Bytes,
        method: Method,
        headers: Vec<(::http::HeaderName, ::http::HeaderValue)>,
        affinity: &str,
        credential: Option<&switchboard_core::credential::Credential>,
    ) -> Result<ModernAnswer, UpstreamError> {
        if self.legacy() {
            return Err(UpstreamError::Protocol("a legacy HTTP+SSE upstream has no stateless requests".into()));
        }
        self.http.stateless(body, method, headers, affinity, credential).await
    }

    fn stateless_http(&self) -> Option<&crate::http::Transport> {
        (!self.legacy()).then_some(&self.http)
    }

    async fn open(&self, hello: &Hello, inbox: Arc<dyn Inbox>) -> Result<Arc<dyn Channel>, UpstreamError> {
        if self.legacy() {
            return self.sse.open(hello, inbox).await;
        }
        match self.http.open(hello, inbox.clone()).await {
            Ok(channel) => {
                let _ = self.found.compare_exchange(UNKNOWN, STREAMABLE, Ordering::Relaxed, Ordering::Relaxed);
                Ok(channel)
            }
            Err(e) if self.found.load(Ordering::Relaxed) == UNKNOWN && refused_like_legacy(&e) => {
                match self.sse.open(hello, inbox).await {
                    Ok(channel) => {
                        if self.found.swap(LEGACY, Ordering::Relaxed) != LEGACY {
                            tracing::info!(upstream = %self.name, "upstream refused a Streamable HTTP initialize ({e}) and answered as a legacy HTTP+SSE server: using HTTP+SSE");
                        }
                        Ok(channel)
                    }
                    Err(sse_error) => {
                        tracing::debug!(upstream = %self.name, "not a legacy HTTP+SSE server either: {sse_error}");
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    fn resume(&self, hello: &Hello, inbox: Arc<dyn Inbox>, at: &UpstreamSession) -> Option<Arc<dyn Channel>> {
        if self.legacy() {
            return self.sse.resume(hello, inbox, at);
        }
        self.http.resume(hello, inbox, at)
    }

    async fn shutdown(&self) {
        self.http.shutdown().await;
        self.sse.shutdown().await;
    }
}
