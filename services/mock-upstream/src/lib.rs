//! A small, fast MCP server: the upstream behind Switchboard in tests, demos
//! and load tests.
//!
//! It speaks Streamable HTTP ([`Mock::serve_http`]) and stdio
//! ([`Mock::serve_stdio`]) and offers a fixed set of tools that exercise what a
//! router must relay: plain results (`echo`, `add`), progress (`progress`),
//! server-to-client requests (`sample`, `elicit`, `roots`), logging (`log`),
//! errors (`fail`), catalog changes (`add_tool`, `redescribe`), resource updates (`touch`),
//! large payloads (`big`) and slowness (`sleep`). The `tools/call` path for
//! `echo` writes its response straight from the request bytes so that the
//! mock is never the bottleneck of a load test.
//!
//! - `mcp.rs`: the protocol logic, independent of the transport.
//! - `http.rs`: Streamable HTTP on hyper; each POST is answered in the era it
//!   belongs to (2025 sessions, or 2026-07-28 stateless requests).
//! - `modern.rs`: MCP 2026-07-28: validation, `server/discover`,
//!   `subscriptions/listen`, `input_required` rounds, the era's result members.
//! - `mrtr.rs`: the tools and prompts that need input from the client, as
//!   round-based programs served in both eras.
//! - `seal.rs`: HMAC-sealed `requestState`, Base64.
//! - `stdio.rs`: newline-delimited JSON on stdin/stdout.
//! - `body.rs`: the response body type.
//!
//! It must stay lean: no logging on the request path, no per-request
//! allocation beyond the response.
#![forbid(unsafe_code)]

mod body;
mod conformance;
mod http;
mod listen;
mod mcp;
mod modern;
mod mrtr;
mod options;
mod seal;
mod session;
mod stdio;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::mcp::GetMode;

pub use options::{AnswerIds, Options};

/// A mock MCP server. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct Mock {
    server: Arc<mcp::Server>,
}

impl Mock {
    /// A server with the given options.
    pub fn new(options: Options) -> Self {
        Mock { server: Arc::new(mcp::Server::new(options)) }
    }

    /// Serves Streamable HTTP on `/mcp` until `shutdown` completes.
    pub async fn serve_http(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        http::serve(self.server.clone(), listener, None, shutdown).await
    }

    /// The same over TLS: HTTPS, with this acceptor (see [`tls_acceptor`]).
    pub async fn serve_https(
        &self,
        listener: TcpListener,
        tls: tokio_rustls::TlsAcceptor,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        http::serve(self.server.clone(), listener, Some(tls), shutdown).await
    }

    /// Serves newline-delimited JSON on this process's stdin and stdout until
    /// stdin closes.
    pub async fn serve_stdio(&self) -> std::io::Result<()> {
        stdio::serve(self.server.clone()).await
    }

    /// Forgets every session, as a restarted server would: the next request
    /// with an old session id gets the "unknown session" status.
    pub fn forget_sessions(&self) {
        self.server.forget_sessions();
    }

    /// Answers GET with 405 (no GET stream) from now on, or no longer (a
    /// server redeployed with or without one).
    pub fn refuse_get(&self, refuse: bool) {
        let mode = if refuse { GetMode::Refuse } else { GetMode::Serve };
        self.server.get_mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Reads every GET that opens a session's stream and never begins its
    /// answer (a stalled or hostile server), from now on, or no longer.
    /// Resumptions (`Last-Event-ID`) are still answered.
    pub fn hold_get(&self, hold: bool) {
        let mode = if hold { GetMode::Hold } else { GetMode::Serve };
        self.server.get_mode.store(mode as u8, Ordering::Relaxed);
    }

    /// How many GETs [`Mock::hold_get`] has held so far.
    pub fn held_gets(&self) -> u64 {
        self.server.held_gets.load(Ordering::Relaxed)
    }

    /// How many `initialize` requests this server has answered.
    pub fn initialize_count(&self) -> u64 {
        self.server.stats.initialize.load(Ordering::Relaxed)
    }

    /// How many `tools/call` requests this server has answered.
    pub fn call_count(&self) -> u64 {
        self.server.stats.calls.load(Ordering::Relaxed)
    }

    /// How many `tools/list` requests this server has received.
    pub fn list_count(&self) -> u64 {
        self.server.stats.tool_lists.load(Ordering::Relaxed)
    }

    /// The names of the tools added at run time (`add_tool`) that were
    /// called, in order, as the caller wrote them.
    pub fn called_tools(&self) -> Vec<String> {
        self.server.stats.called.lock().expect("lock").clone()
    }

    /// HTTP requests received over HTTP/1.x and over HTTP/2.
    pub fn http_versions(&self) -> (u64, u64) {
        (self.server.stats.http1.load(Ordering::Relaxed), self.server.stats.http2.load(Ordering::Relaxed))
    }

    /// Gives tool `name` a new description (what a server changing a tool
    /// under its clients does), and tells its sessions their list changed.
    pub fn redescribe(&self, name: &str, description: &str) {
        self.server.redescribe(name, description);
    }

    /// How many `DELETE` requests ended a session.
    pub fn deleted_sessions(&self) -> u64 {
        self.server.stats.deleted.load(Ordering::Relaxed)
    }

    /// The `requestId`s of the cancellations received, as JSON text.
    pub fn cancelled(&self) -> Vec<String> {
        self.server.stats.cancelled.lock().expect("lock").clone()
    }

    /// How many sessions are live now.
    pub fn live_sessions(&self) -> usize {
        self.server.live_sessions()
    }

    /// How many sessions have their GET stream open now.
    pub fn listening_sessions(&self) -> usize {
        self.server.listening_sessions()
    }

    /// How many `subscriptions/listen` streams (2026-07-28) are open now.
    pub fn listen_streams(&self) -> usize {
        self.server.listeners.len()
    }
}

/// A TLS acceptor for [`Mock::serve_https`]: this certificate chain and key
/// (PEM files), ALPN `h2` and `http/1.1`, and client certificates checked
/// against `client_ca` (PEM) when given (required then).
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> std::io::Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls;
    let invalid = |e: &dyn std::fmt::Display| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string());
    let (chain, key) = switchboard_core::tls::read_pem(cert, key, "mock TLS")?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&e))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let pem = std::fs::read(ca)?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in switchboard_core::tls::pem_certificates(&pem).map_err(|e| invalid(&e))? {
                roots.add(cert).map_err(|e| invalid(&e))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
                    .build()
                    .map_err(|e| invalid(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| invalid(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}
