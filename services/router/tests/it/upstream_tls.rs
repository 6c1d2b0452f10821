//! HTTPS upstreams: the router verifies each upstream's certificate (the
//! platform's roots plus the upstream's `ca`), presents a client
//! certificate where one is configured, and refuses a certificate from an
//! unknown CA or for another host with an error that says so. The upstream
//! is the mock serving TLS with certificates made by the openssl CLI.

use std::time::Duration;

use serde_json::json;
use switchboard_test_support::peers::Process;
use switchboard_test_support::services::{make_certificate, make_certificate_for, make_client_certificate, unique};
use switchboard_test_support::{eventually, get_text, mock_named, Client, MockServer};

/// The router binary with `config` (written in `dir`), and its address.
async fn router_process(dir: &std::path::Path, config: &str) -> (Process, std::net::SocketAddr) {
    let path = dir.join("router.toml");
    std::fs::write(&path, config).unwrap();
    Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", path.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await
}

/// Whether the router has logged a line containing `needle` (for `eventually`).
fn said<'a>(router: &'a Process, needle: &'a str) -> impl Fn() -> std::future::Ready<bool> + 'a {
    move || std::future::ready(router.output().iter().any(|l| l.contains(needle)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_and_refused_with_a_clear_error() {
    let dir = std::env::temp_dir().join(unique("sb-upstream-tls-"));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificate(&dir, "upstream");
    make_certificate_for(&dir, "elsewhere", "DNS:elsewhere.test");
    make_client_certificate(&dir, "clients-ca", "router-client", "/O=Switchboard/CN=router");
    let file = |name: &str| dir.join(name).display().to_string();
    let acceptor = |cert: &str, key: &str, client_ca: Option<&str>| {
        let client_ca = client_ca.map(|c| dir.join(c));
        switchboard_mock::tls_acceptor(&dir.join(cert), &dir.join(key), client_ca.as_deref()).unwrap()
    };
    let secure = MockServer::start_tls(mock_named("secure"), acceptor("upstream.pem", "upstream.key", None)).await;
    let fast = MockServer::start_tls(mock_named("fast"), acceptor("upstream.pem", "upstream.key", None)).await;
    let wrong = MockServer::start_tls(mock_named("wrong"), acceptor("elsewhere.pem", "elsewhere.key", None)).await;
    let mutual =
        MockServer::start_tls(mock_named("mutual"), acceptor("upstream.pem", "upstream.key", Some("clients-ca.pem")))
            .await;
    let upstream = |name: &str, url: &str, extra: &str| {
        format!(
            "[[upstreams]]\nname = \"{name}\"\ntransport = \"http\"\nurl = \"{url}\"\nlist_timeout = \"5s\"\n{extra}"
        )
    };
    let ca = format!("ca = \"{}\"\n", file("ca.pem"));
    let client_cert = format!(
        "tls_client_cert = \"{}\"\ntls_client_key = \"{}\"\n",
        file("router-client.pem"),
        file("router-client.key")
    );
    let config = [
        "[auth]\nmode = \"none\"\n[database]\nurl = \"\"\n[catalog]\nretry_after = \"1s\"\n\
         [egress]\nallow = [\"loopback\"]\n"
            .to_owned(),
        upstream("secure", &secure.url, &ca),
        upstream("mutual", &mutual.url, &format!("{ca}{client_cert}")),
        // HTTP/2, negotiated by ALPN.
        upstream("fast", &fast.url, &format!("{ca}http2 = true\n")),
        // The platform's roots only: the test CA is unknown.
        upstream("untrusted", &secure.url, ""),
        // A good CA, but the certificate is for another host.
        upstream("wronghost", &wrong.url, &ca),
        // A server that wants a client certificate, and none configured.
        upstream("nocert", &mutual.url, &ca),
    ]
    .concat();
    let (router, addr) = router_process(&dir, &config).await;
    let url = format!("http://{addr}/mcp");

    // The verified upstreams serve their tools through the router.
    let mut client = Client::new(&url);
    client.initialize().await;
    let listed = || async {
        let reply = client.request("tools/list", json!({})).await;
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        body["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            let names = listed().await;
            ["secure__echo", "mutual__echo", "fast__echo"].iter().all(|want| names.iter().any(|n| n == want))
        })
        .await,
        "{:?}",
        listed().await
    );
    let names = listed().await;
    for refused in ["untrusted__", "wronghost__", "nocert__"] {
        assert!(!names.iter().any(|n| n.starts_with(refused)), "{refused} {names:?}");
    }
    let answer = client.call_tool("secure__echo", json!({"text": "over https"})).await;
    assert_eq!(answer["result"]["content"][0]["text"], r#"{"text":"over https"}"#, "{answer}");
    let answer = client.call_tool("mutual__echo", json!({"text": "with a client certificate"})).await;
    assert!(answer["result"]["content"][0]["text"].as_str().unwrap().contains("client certificate"), "{answer}");
    let answer = client.call_tool("fast__echo", json!({"text": "over h2"})).await;
    assert!(answer["result"]["content"][0]["text"].as_str().unwrap().contains("over h2"), "{answer}");
    let (http1, http2) = fast.mock.http_versions();
    assert!(http2 > 0 && http1 == 0, "HTTP/2 over TLS: {http1} HTTP/1 and {http2} HTTP/2 requests");
    let (http1, http2) = secure.mock.http_versions();
    assert!(http1 > 0 && http2 == 0, "HTTP/1.1 over TLS by default: {http1} HTTP/1 and {http2} HTTP/2 requests");

    // The others are down, and the log says why, naming the upstream.
    let metrics = get_text(&format!("http://{addr}/metrics")).await;
    for name in ["untrusted", "wronghost", "nocert"] {
        assert!(metrics.contains(&format!("switchboard_upstream_up{{upstream=\"{name}\"}} 0")), "{name}: {metrics}");
    }
    for why in ["UnknownIssuer", "certificate not valid for name", "CertificateRequired"] {
        assert!(
            eventually(Duration::from_secs(10), said(&router, why)).await,
            "no log line says {why}: {:#?}",
            router.output()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_egress_guard_keeps_upstreams_off_addresses_not_allowed() {
    let local = MockServer::start(mock_named("local")).await;
    let port = local.addr.port();
    let dir = std::env::temp_dir().join(unique("sb-egress-"));
    std::fs::create_dir_all(&dir).unwrap();
    let upstream = |name: &str, url: &str| {
        format!("[[upstreams]]\nname = \"{name}\"\ntransport = \"http\"\nurl = \"{url}\"\nlist_timeout = \"5s\"\n")
    };
    // A private network allowed, but not loopback, and never metadata.
    let config = [
        "[auth]\nmode = \"none\"\n[database]\nurl = \"\"\n[egress]\nallow = [\"10.0.0.0/8\"]\n".to_owned(),
        upstream("byaddress", &format!("http://127.0.0.1:{port}/mcp")),
        upstream("byname", &format!("http://localhost:{port}/mcp")),
        upstream("metadata", "http://169.254.169.254/mcp"),
    ]
    .concat();
    let (router, addr) = router_process(&dir, &config).await;
    for why in [
        "upstream=byaddress list=\"tools\" error=cannot connect: 127.0.0.1: 127.0.0.1 is a loopback address",
        "upstream=byname list=\"tools\" error=cannot connect: localhost: ",
        "upstream=metadata list=\"tools\" error=cannot connect: 169.254.169.254: 169.254.169.254 is a metadata address",
    ] {
        assert!(
            eventually(Duration::from_secs(10), said(&router, why)).await,
            "no log line says {why}: {:#?}",
            router.output()
        );
    }
    // Nothing reached the mock, and the router serves on without them.
    assert_eq!(local.mock.http_versions(), (0, 0));
    let mut client = Client::new(&format!("http://{addr}/mcp"));
    client.initialize().await;
    let reply = client.request("tools/list", json!({})).await;
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["result"]["tools"], json!([]), "{body}");
}
