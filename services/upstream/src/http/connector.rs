//! How hyper's HTTP/2 client reaches an upstream: TCP for `http` (HTTP/2
//! with prior knowledge), TLS for `https` with ALPN `h2` (the server must
//! choose it: an upstream that only speaks HTTP/1.1 over TLS is an error
//! saying so, and `http2 = false` is the way to reach it).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TCP (to an address the egress guard allows), or TLS over it offering
/// only `h2`. Every connection goes to the one upstream replica it was made
/// for, whatever URI hyper asks for.
#[derive(Clone)]
pub struct Connector {
    connect: Arc<crate::h1::Connect>,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Connector {
    /// For an upstream reached as `connect` says (its TLS configuration
    /// taken with ALPN `h2` in place of `http/1.1`).
    pub fn new(connect: &crate::h1::Connect) -> Connector {
        let tls = connect.tls.as_ref().map(|(config, name)| {
            let mut h2 = (**config).clone();
            h2.alpn_protocols = vec![b"h2".to_vec()];
            (TlsConnector::from(Arc::new(h2)), name.clone())
        });
        Connector { connect: Arc::new(connect.clone()), tls }
    }
}

/// A connection hyper speaks HTTP/2 on.
pub enum Io {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl tower_service::Service<Uri> for Connector {
    type Response = Io;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Io, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let (connect, tls) = (self.connect.clone(), self.tls.clone());
        Box::pin(async move {
            let tcp = connect.tcp().await?;
            // Long-lived: let the kernel notice a peer that vanished.
            let keepalive = socket2::TcpKeepalive::new().with_time(std::time::Duration::from_secs(60));
            let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
            let Some((connector, name)) = tls else {
                return Ok(Io::Plain(TokioIo::new(tcp)));
            };
            let address = connect.address();
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {address} failed: {e}")))?;
            if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(format!(
                    "{address} does not offer HTTP/2 over TLS (ALPN h2): set http2 = false for this upstream"
                )
                .into());
            }
            Ok(Io::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

impl Connection for Io {
    fn connected(&self) -> Connected {
        match self {
            Io::Plain(tcp) => tcp.connected(),
            Io::Tls(_) => Connected::new().negotiated_h2(),
        }
    }
}

impl hyper::rt::Read for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_flush(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }
}
