//! TLS on the MCP listener: the official Python SDK checks the router's
//! certificate against the test CA; a certificate replaced on disk is taken
//! up without a restart, while a connection opened before goes on; a large
//! answer reaches a slow reader whole; client certificates (mTLS) name
//! their tenant by their subject.

use std::time::Duration;

use serde_json::json;
use switchboard_test_support::services::{make_certificate, make_client_certificate, unique};
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

/// A router serving TLS (a certificate of the test CA, in a new folder)
/// in front of the mock `web`, with `server` settings added; the folder.
async fn tls_router(server: &str) -> (Router, MockServer, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(unique("sb-tls-"));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificate(&dir, "router");
    let web = MockServer::start(mock_named("web")).await;
    let config = format!(
        "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{server}{}",
        dir.join("router.pem").display(),
        dir.join("router.key").display(),
        http_upstream("web", &web.url, "")
    );
    (Router::start(&config).await, web, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_listener_speaks_tls_and_takes_a_new_certificate_without_a_restart() {
    let (router, _web, dir) = tls_router("").await;
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

/// Reads one answer with a `Content-Length` body from `stream`, `chunk`
/// bytes at a time with `pause` between reads: its head and body.
async fn read_answer<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    chunk: usize,
    pause: Duration,
) -> (String, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap())
                })
                .expect("a Content-Length");
            if got.len() >= end + 4 + length {
                return (head, got[end + 4..end + 4 + length].to_vec());
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
        tokio::time::sleep(pause).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_over_tls_arrives_whole_to_a_slow_reader() {
    // The idle limit is shorter than the reading takes: a client that keeps
    // taking its answer is not idle.
    let (router, _web, dir) = tls_router("idle_timeout = \"1s\"\n").await;
    let (mut stream, _) = handshake(router.addr, &dir.join("ca.pem")).await;
    let post = |session: &str, body: serde_json::Value| {
        let body = body.to_string();
        format!(
            "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{session}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    stream.write_all(post("", init).as_bytes()).await.unwrap();
    let (head, _) = read_answer(&mut stream, 4096, Duration::ZERO).await;
    let session = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id: ").map(str::to_owned))
        .expect("a session");
    let headers = format!("Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-06-18\r\n");
    let size = 2_000_000;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "web__big", "arguments": {"bytes": size}}});
    stream.write_all(post(&headers, call).as_bytes()).await.unwrap();
    // 16 KiB every 10 ms: about 1.3 s for the whole.
    let started = std::time::Instant::now();
    let (head, body) = read_answer(&mut stream, 16 * 1024, Duration::from_millis(10)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(started.elapsed() > Duration::from_secs(1), "the reading outlasted the idle limit");
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["result"]["content"][0]["text"].as_str().map(str::len), Some(size));
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

/// A POST of `body` to `/mcp` over TLS, presenting the client certificate
/// `client` (`<dir>/<client>.pem` and `.key`) if any and the API key `key`
/// if any: the answer's status line and body, or why there is none (the
/// handshake refused).
async fn post_as(
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    client: Option<&str>,
    key: Option<&str>,
    body: &serde_json::Value,
) -> Result<(String, serde_json::Value), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let config = match client {
        Some(name) => {
            let chain = CertificateDer::pem_file_iter(dir.join(format!("{name}.pem"))).unwrap().map(Result::unwrap);
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain.collect(), key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let body = body.to_string();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| format!("no answer: {answer:?}"))?;
    let status = head.lines().next().unwrap_or_default().to_owned();
    Ok((status, serde_json::from_str(body.trim()).unwrap_or(serde_json::Value::Null)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_name_their_tenant_beside_api_keys() {
    let dir = std::env::temp_dir().join(unique("sb-mtls-"));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificate(&dir, "router");
    make_client_certificate(&dir, "clients-ca", "bot", "/O=Acme/CN=build-bot");
    make_client_certificate(&dir, "clients-ca", "stranger", "/O=Acme/CN=stranger");
    make_client_certificate(&dir, "clients-ca", "team-bot", "/CN=team-bot");
    // The same subject as `bot`, from a CA the router does not trust.
    make_client_certificate(&dir, "rogue-ca", "rogue", "/O=Acme/CN=build-bot");
    let alpha = MockServer::start(mock_named("alpha")).await;
    let beta = MockServer::start(mock_named("beta")).await;
    let db = format!("sqlite:{}", dir.join("switchboard.db").display());
    let config = format!(
        "[auth]\nmode = \"keys\"\n[database]\nurl = \"{db}\"\nrefresh = \"200ms\"\n\
         [audit]\nspool = \"{spool}\"\n\
         [server]\ntls_cert = \"{cert}\"\ntls_key = \"{key}\"\n\
         [mtls]\nca = \"{ca}\"\n[mtls.subjects]\n\"CN=build-bot,O=Acme\" = \"acme\"\n\"/CN=team-bot\" = \"team\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"alpha\"]\naccept = [\"client_cert\"]\n\
         [[tenants]]\nname = \"team\"\nupstreams = [\"beta\"]\naccept = [\"api_keys\"]\n{}{}",
        http_upstream("alpha", &alpha.url, ""),
        http_upstream("beta", &beta.url, ""),
        spool = dir.join("audit.spool").display(),
        cert = dir.join("router.pem").display(),
        key = dir.join("router.key").display(),
        ca = dir.join("clients-ca.pem").display(),
    );
    let router = Router::start(&config).await;
    let url = format!("https://127.0.0.1:{}/mcp", router.addr.port());

    // The official Python SDK with the machine's certificate and no key:
    // acme's tools only, and a call.
    let file = |name: &str| dir.join(name).display().to_string();
    let target =
        json!({"url": url, "ca": file("ca.pem"), "client_cert": file("bot.pem"), "client_key": file("bot.key")});
    let out =
        run_python_client("list_and_call.py", &[&target.to_string(), r#"[["alpha__echo", {"text": "by cert"}]]"#])
            .await;
    let tools = out["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "alpha__echo") && !tools.iter().any(|t| t == "beta__echo"), "{out}");
    assert_eq!(out["results"][0]["content"][0]["text"], r#"{"text":"by cert"}"#);

    // Its audit records name the tenant and the certificate's subject.
    let records = || async {
        let db = switchboard_db::Database::connect(&db, Duration::from_secs(3)).unwrap();
        let query = switchboard_db::AuditQuery { tenant: Some("acme".into()), limit: 100, ..Default::default() };
        db.query_audit(&query).await.unwrap().into_iter().map(|(_, r)| r).collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            records().await.iter().any(|r| r.target.as_deref() == Some("alpha__echo"))
        })
        .await
    );
    for r in records().await {
        assert_eq!(r.user.as_deref(), Some("CN=build-bot,O=Acme"), "{r:?}");
    }

    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let (status, _) = post_as(router.addr, &dir, Some("bot"), None, &init).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // No certificate and no key: 401, as without mTLS (it is optional).
    let (status, body) = post_as(router.addr, &dir, None, None, &init).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status} {body}");
    // A good certificate whose subject names no tenant.
    let (status, body) = post_as(router.addr, &dir, Some("stranger"), None, &init).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not mapped to a tenant"), "{body}");
    let (mut stream, _) = handshake(router.addr, &dir.join("ca.pem")).await;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut metrics = String::new();
    stream.read_to_string(&mut metrics).await.unwrap();
    assert!(metrics.contains(r#"switchboard_auth_failures_total{reason="certificate_unmapped"} 1"#), "{metrics}");
    // A tenant that takes API keys only refuses its certificate...
    let (status, body) = post_as(router.addr, &dir, Some("team-bot"), None, &init).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not accepted"), "{body}");
    // ...and a key sent with the request is the caller, certificate or not:
    // team's key works over team-bot's connection, and a bad key over
    // bot's connection is refused even though the certificate is good.
    let admin = super::tenancy::admin_for(&config).await;
    let team_key = admin.create_key("team", None).await.unwrap().key;
    let with_key = || async {
        let answer = post_as(router.addr, &dir, Some("team-bot"), Some(&team_key), &init).await.unwrap();
        answer.0.starts_with("HTTP/1.1 200")
    };
    assert!(eventually(Duration::from_secs(5), with_key).await, "the key is the caller");
    let (status, body) = post_as(router.addr, &dir, Some("bot"), Some("sb_not_a_key"), &init).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status} {body}");
    // A certificate from another CA: the handshake fails.
    let refused = post_as(router.addr, &dir, Some("rogue"), None, &init).await;
    assert!(refused.is_err(), "{refused:?}");
    // And the router is healthy.
    let (status, _) = post_as(router.addr, &dir, Some("bot"), None, &init).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}
