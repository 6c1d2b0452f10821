//! TLS on the MCP listener: the official Python SDK checks the router's
//! certificate against the test CA; a certificate replaced on disk is taken
//! up without a restart, while a connection opened before goes on.

use std::time::Duration;

use serde_json::json;
use switchboard_test_support::services::{make_certificate, unique};
use switchboard_test_support::{eventually, http_upstream, mock_named, peers::run_python_client, MockServer, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

/// A TLS client that trusts only the test CA; the certificate it was shown.
async fn handshake(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
) -> (tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Vec<u8>) {
    handshake_offering(addr, ca, &[b"http/1.1"]).await
}

/// [`handshake`], offering these ALPN protocols.
async fn handshake_offering(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    alpn: &[&[u8]],
) -> (tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Vec<u8>) {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.expect("a certificate the test CA vouches for");
    let shown = stream.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec();
    (stream, shown)
}

async fn healthz(stream: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await.unwrap().unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_listener_speaks_tls_and_takes_a_new_certificate_without_a_restart() {
    let dir = std::env::temp_dir().join(unique("sb-tls-"));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificate(&dir, "router");
    let web = MockServer::start(mock_named("web")).await;
    let config = format!(
        "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{}",
        dir.join("router.pem").display(),
        dir.join("router.key").display(),
        http_upstream("web", &web.url, "")
    );
    let router = Router::start(&config).await;
    let url = format!("https://127.0.0.1:{}/mcp", router.addr.port());
    let ca = dir.join("ca.pem");

    // The official Python SDK, checking the certificate against the test CA.
    let target = json!({"url": url, "ca": ca.display().to_string()}).to_string();
    let out = run_python_client("list_and_call.py", &[&target, r#"[["web__echo", {"text": "over tls"}]]"#]).await;
    assert!(out["tools"].as_array().unwrap().iter().any(|t| t == "web__echo"), "{out}");
    assert_eq!(out["results"][0]["content"][0]["text"], r#"{"text":"over tls"}"#);

    // Plain HTTP on the TLS port gets nowhere.
    let mut plain = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut got)).await;
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"));

    // ALPN: h2 when offered, else HTTP/1.1.
    let (h2, _) = handshake_offering(router.addr, &ca, &[b"h2", b"http/1.1"]).await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

    // A connection opened now, kept open across the change.
    let (mut before, first) = handshake(router.addr, &ca).await;
    assert!(healthz(&mut before).await.starts_with("HTTP/1.1 200"));

    // A new certificate (same CA) written over the old files.
    make_certificate(&dir, "renewed");
    std::fs::copy(dir.join("renewed.key"), dir.join("router.key")).unwrap();
    std::fs::copy(dir.join("renewed.pem"), dir.join("router.pem")).unwrap();
    let renewed = std::fs::read(dir.join("renewed.pem")).unwrap();
    let renewed_der: Vec<u8> = {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(&renewed).unwrap().as_ref().to_vec()
    };
    assert_ne!(first, renewed_der);
    let taken =
        eventually(Duration::from_secs(10), || async { handshake(router.addr, &ca).await.1 == renewed_der }).await;
    assert!(taken, "new connections get the new certificate");
    // The connection opened before goes on, on the old one.
    assert!(healthz(&mut before).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_speaks_tls_too() {
    let dir = std::env::temp_dir().join(unique("sb-admin-tls-"));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificate(&dir, "admin");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let token = "an-admin-token-of-some-length";
    let file = dir.join("router.toml");
    std::fs::write(
        &file,
        format!(
            "[auth]\nmode = \"none\"\n[log]\nlevel = \"warn,switchboard_router::server=info\"\n\
             [database]\nurl = \"sqlite:{}\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{token}\"\n\
             tls_cert = \"{}\"\ntls_key = \"{}\"\n",
            dir.join("switchboard.db").display(),
            dir.join("admin.pem").display(),
            dir.join("admin.key").display()
        ),
    )
    .unwrap();
    let (_router, _) = switchboard_test_support::peers::Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    let admin: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (mut stream, _) = handshake(admin, &dir.join("ca.pem")).await;
    let request = format!("GET /v1/tenants HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
