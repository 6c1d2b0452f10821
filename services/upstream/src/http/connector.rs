//! How hyper's HTTP/2 client reaches an upstream: TCP for `http` (HTTP/2
//! with prior knowledge), TLS for `https` with ALPN `h2` (the server must
//! choose it: an upstream that only speaks HTTP/1.1 over TLS is an error
//! saying so, and `http2 = false` is the way to reach it). The connection
//! itself is made as the HTTP/1.1 pool makes its own ([`Connect::open`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::h1::{Connect, Io};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TCP (to an address the egress guard allows), or TLS over it offering
/// only `h2`. Every connection goes to the one upstream replica it was made
/// for, whatever URI hyper asks for.
#[derive(Clone)]
pub struct Connector {
    connect: Arc<Connect>,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Connector {
    /// For an upstream reached as `connect` says (its TLS configuration
    /// taken with ALPN `h2` in place of `http/1.1`).
    pub fn new(connect: &Connect) -> Connector {
        let tls = connect.tls.as_ref().map(|(config, name)| {
            let mut h2 = (**config).clone();
            h2.alpn_protocols = vec![b"h2".to_vec()];
            (TlsConnector::from(Arc::new(h2)), name.clone())
        });
        Connector { connect: Arc::new(connect.clone()), tls }
    }
}

/// A connection hyper speaks HTTP/2 on.
pub struct H2Io(TokioIo<Io>);

impl tower_service::Service<Uri> for Connector {
    type Response = H2Io;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<H2Io, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let (connect, tls) = (self.connect.clone(), self.tls.clone());
        Box::pin(async move {
            let io = connect.open(tls.as_ref()).await?;
            if tls.is_some() && io.alpn() != Some(b"h2") {
                let address = connect.address();
                return Err(format!(
                    "{address} does not offer HTTP/2 over TLS (ALPN h2): set http2 = false for this upstream"
                )
                .into());
            }
            // Long-lived: let the kernel notice a peer that vanished.
            let keepalive = socket2::TcpKeepalive::new().with_time(std::time::Duration::from_secs(60));
            let _ = socket2::SockRef::from(io.tcp()).set_tcp_keepalive(&keepalive);
            Ok(H2Io(TokioIo::new(io)))
        })
    }
}

impl Connection for H2Io {
    fn connected(&self) -> Connected {
        match self.0.inner().alpn() {
            Some(_) => Connected::new().negotiated_h2(),
            None => Connected::new(),
        }
    }
}

impl hyper::rt::Read for H2Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for H2Io {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
