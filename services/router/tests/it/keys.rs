//! API keys: their lifecycle through the admin API on two replicas,
//! revocation by `LISTEN/NOTIFY`, and keys never kept or shown in plain text.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_test_support::services::{unique, PrivatePostgres, TempDatabase};
use switchboard_test_support::{eventually, get_text, Client, Router};

use super::tenancy::{admin_for, policy, setup, setup_with_admin, with_own_spool};

const PREFIX_LEN: usize = switchboard_tenancy::PREFIX_LEN;

#[tokio::test]
async fn key_lifecycle_through_the_admin_api_on_two_replicas() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
    let token = "an-admin-token-of-some-length";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_admin, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(switchboard_router::admin::serve(listener, admin, token.into(), async {
        let _ = stopped.await;
    }));
    let http = reqwest_like::Http::new(token);

    // The admin API wants its token.
    let (status, _) = http.without_token("GET", &format!("{admin_url}/v1/tenants")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, body) =
        http.send("POST", &format!("{admin_url}/v1/tenants"), json!({"name": "initech", "upstreams": ["alpha"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!((body["name"].as_str(), body["source"].as_str()), (Some("initech"), Some("database")));
    assert_eq!(body["upstreams"], json!(["alpha"]));
    let (status, body) = http.send("POST", &format!("{admin_url}/v1/tenants"), json!({"name": "initech"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) =
        http.send("POST", &format!("{admin_url}/v1/tenants"), json!({"name": "bad", "upstreams": ["nope"]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, created) = http.send("POST", &format!("{admin_url}/v1/tenants/initech/keys"), json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let key = created["key"].as_str().unwrap().to_owned();
    let prefix = created["prefix"].as_str().unwrap().to_owned();
    assert!(key.starts_with(&prefix) && created.get("hash").is_none(), "{created}");
    // Listing shows the prefix, never the key or its hash.
    let (_, listed) = http.send("GET", &format!("{admin_url}/v1/tenants/initech/keys"), Value::Null).await;
    assert_eq!(listed["keys"][0]["prefix"], prefix.as_str());
    assert!(!listed.to_string().contains(&key[PREFIX_LEN..]), "{listed}");

    // Two replicas on one database: the key works on both.
    let one = Router::start(&config).await;
    let two = Router::start(&with_own_spool(&config)).await;
    let mut c1 = Client::with_key(&one.url, &key);
    c1.initialize().await;
    let mut c2 = Client::with_key(&two.url, &key);
    c2.initialize().await;

    let (status, _) = http.send("DELETE", &format!("{admin_url}/v1/keys/{prefix}"), Value::Null).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let revoked = Instant::now();
    for c in [&c1, &c2] {
        assert!(
            eventually(Duration::from_secs(5), || async {
                c.request("ping", json!({})).await.status == StatusCode::UNAUTHORIZED
            })
            .await,
            "a revoked key is refused within seconds on every replica"
        );
    }
    eprintln!("revocation took effect on both replicas after {:?}", revoked.elapsed());
    let (status, _) = http.send("DELETE", &format!("{admin_url}/v1/keys/{prefix}"), Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An expiring key works until its time, then gets 401 "expired".
    let at = switchboard_core::time::now_ms() + 1500;
    let (_, created) =
        http.send("POST", &format!("{admin_url}/v1/tenants/initech/keys"), json!({"expires_at_ms": at})).await;
    let short = Client::with_key(&one.url, created["key"].as_str().unwrap());
    assert!(
        eventually(Duration::from_secs(5), || async {
            // Authenticated, but no session yet: 400, not 401.
            short.request("ping", json!({})).await.status == StatusCode::BAD_REQUEST
        })
        .await,
        "a new key is accepted within seconds"
    );
    // Polled until refused; it must not be refused before its time.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let reply = loop {
        let reply = short.request("ping", json!({})).await;
        let now = switchboard_core::time::now_ms();
        if reply.status == StatusCode::UNAUTHORIZED {
            assert!(now >= at, "refused before it expired: {now} < {at}");
            break reply;
        }
        assert!(std::time::Instant::now() < deadline, "an expired key is still accepted");
        // Polling: what changes here is the wall clock, not an event to await.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(reply.json()["error"]["message"].as_str().unwrap().contains("expired"));

    // Deleting the tenant removes its keys.
    let (status, _) = http.send("DELETE", &format!("{admin_url}/v1/tenants/initech"), Value::Null).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, listed) = http.send("GET", &format!("{admin_url}/v1/keys"), Value::Null).await;
    assert_eq!(listed["keys"], json!([]));

    let _ = stop_admin.send(());
    one.stop().await;
    two.stop().await;
    pg.drop_now().await;
}

/// A tiny JSON-over-HTTP client for the admin API.
pub(crate) mod reqwest_like {
    use bytes::Bytes;
    use http::{Request, StatusCode};
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use serde_json::Value;

    pub struct Http {
        token: String,
        client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    }

    impl Http {
        pub fn new(token: &str) -> Http {
            Http {
                token: token.into(),
                client: Client::builder(TokioExecutor::new())
                    .build(hyper_util::client::legacy::connect::HttpConnector::new()),
            }
        }

        pub async fn send(&self, method: &str, url: &str, body: Value) -> (StatusCode, Value) {
            self.request(method, url, body, true).await
        }

        pub async fn without_token(&self, method: &str, url: &str) -> (StatusCode, Value) {
            self.request(method, url, Value::Null, false).await
        }

        async fn request(&self, method: &str, url: &str, body: Value, auth: bool) -> (StatusCode, Value) {
            let bytes = if body.is_null() { Bytes::new() } else { Bytes::from(serde_json::to_vec(&body).unwrap()) };
            let mut req = Request::builder().method(method).uri(url).header("content-type", "application/json");
            if auth {
                req = req.header("authorization", format!("Bearer {}", self.token));
            }
            let resp = self.client.request(req.body(Full::new(bytes)).unwrap()).await.expect("admin API");
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
        }
    }
}

/// A connection remembers the key its last request was let in with (not
/// hashed and looked up again for the next request presenting it), but
/// never past a revocation or the key's expiry, and a connection whose
/// requests alternate between keys gets each one's answer.
#[tokio::test]
async fn a_connection_never_keeps_a_key_past_its_revocation_or_expiry() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
    admin.create_tenant("kept", policy(&["alpha"])).await.unwrap();
    let lasting = admin.create_key("kept", None).await.unwrap();
    let other = admin.create_key("kept", None).await.unwrap();
    let router = Router::start(&config).await;
    let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let mut buffer = Vec::new();
    // A ping with `key` on the one connection: its status (400 for a known
    // key, which names no session; 401 for a refused one).
    let mut ask = async |key: &str| -> u16 {
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nAuthorization: Bearer {key}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap()))
                    .expect("a content-length");
                if buffer.len() >= end + 4 + length {
                    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status");
                    assert!(!head.contains("connection: close"), "the connection stays open: {head}");
                    buffer.drain(..end + 4 + length);
                    return status;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
                .await
                .expect("an answer")
                .unwrap();
            assert!(n > 0, "the router closed the connection");
            buffer.extend_from_slice(&chunk[..n]);
        }
    };
    for _ in 0..3 {
        assert_eq!(ask(&lasting.key).await, 400, "a known key, again and again");
    }
    assert_eq!(ask("sb_this-is-not-a-key-of-ours-at-all-00000000").await, 401, "another credential is checked");
    assert_eq!(ask(&other.key).await, 400);
    assert_eq!(ask(&lasting.key).await, 400, "each key in turn");

    // Revoked: refused on the very connection that was using it.
    admin.revoke_key(&lasting.row.prefix).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ask(&lasting.key).await != 401 {
        assert!(Instant::now() < deadline, "a revoked key is still let in on its connection");
        // Polling: the router hears of the revocation within its refresh.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ask(&other.key).await, 400, "the other key still works");

    // An expiring key: let in until its time, on the same connection, then refused.
    let at = switchboard_core::time::now_ms() + 3000;
    let expiring = admin.create_key("kept", Some(at)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while ask(&expiring.key).await != 400 {
        assert!(Instant::now() < deadline, "a new key is not let in");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let status = ask(&expiring.key).await;
        let now = switchboard_core::time::now_ms();
        if status == 401 {
            assert!(now >= at, "refused before it expired: {now} < {at}");
            break;
        }
        assert_eq!(status, 400);
        assert!(Instant::now() < deadline, "an expired key is still let in on its connection");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    router.stop().await;
    pg.drop_now().await;
}

/// Revocation "at once on PostgreSQL": with a refresh of a minute, a revoked
/// key is refused within seconds because the change arrives by
/// `LISTEN/NOTIFY`; and again after the database restarted (the listener
/// reconnects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_arrives_by_notification_not_by_the_refresh() {
    let server = PrivatePostgres::start();
    let pg = TempDatabase::create_on(&server.url).await;
    let (_alpha, _beta, config) = setup(&pg.url, "").await;
    let config = config.replace("refresh = \"200ms\"", "refresh = \"60s\"");
    let admin = admin_for(&config).await;
    admin.create_tenant("watched", policy(&["alpha"])).await.unwrap();
    let first = admin.create_key("watched", None).await.unwrap();
    let second = admin.create_key("watched", None).await.unwrap();
    let one = Router::start(&config).await;
    let two = Router::start(&with_own_spool(&config)).await;
    let soon = Duration::from_secs(10);
    let refused = |url: String, key: String| async move {
        let c = Client::with_key(&url, &key);
        eventually(soon, || async { c.request("ping", json!({})).await.status == StatusCode::UNAUTHORIZED }).await
    };
    for r in [&one, &two] {
        let mut c = Client::with_key(&r.url, &first.key);
        c.initialize().await;
    }

    let started = Instant::now();
    admin.revoke_key(&first.row.prefix).await.unwrap();
    for r in [&one, &two] {
        assert!(refused(r.url.clone(), first.key.clone()).await, "refused within seconds, not the minute's refresh");
    }
    eprintln!("revoked on both replicas after {:?}", started.elapsed());
    // A key created now is accepted as quickly.
    let third = admin.create_key("watched", None).await.unwrap();
    let c = Client::with_key(&one.url, &third.key);
    assert!(eventually(soon, || async { c.request("ping", json!({})).await.status == StatusCode::BAD_REQUEST }).await);

    // The database restarts; the routers listen again.
    server.stop();
    server.resume();
    let c = Client::with_key(&two.url, &second.key);
    assert_eq!(c.request("ping", json!({})).await.status, StatusCode::BAD_REQUEST, "known, no session");
    let started = Instant::now();
    admin.revoke_key(&second.row.prefix).await.expect("the admin's pool reconnects");
    for r in [&one, &two] {
        assert!(refused(r.url.clone(), second.key.clone()).await, "refused within seconds after a restart too");
    }
    eprintln!("after the restart, revoked on both replicas after {:?}", started.elapsed());
    one.stop().await;
    two.stop().await;
    pg.drop_now().await;
}

/// Keys are secrets: the router keeps their SHA-256 only. A router process
/// logging at `trace` level is given keys every way they arrive (created
/// through its admin API, as a bearer token, as `X-API-Key`, on a GET
/// stream, in an edge device's registration, unknown, revoked), and none
/// of them appears in its logs, its metrics, or a dump of its database
/// (audit records included). Nor does a vault credential given through
/// the admin API and sent upstream, nor the vault key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_never_appear_in_logs_metrics_or_the_database() {
    use switchboard_test_support::peers::Process;
    let pg = TempDatabase::create().await;
    let token = "an-admin-token-for-this-test";
    let vault_key = switchboard_vault::Key::generate();
    let extra = format!(
        "[log]\nlevel = \"trace\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n[edge]\nlisten = \"127.0.0.1:0\"\n\
         [vault]\nkey = \"{vault_key}\"\n"
    );
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, &extra).await;
    let mut p = policy(&["alpha"]);
    p.audit_arguments = true;
    admin.create_tenant("secretive", p).await.unwrap();
    let file = std::env::temp_dir().join(unique("sb-keys-") + ".toml");
    std::fs::write(&file, &config).unwrap();
    let (mut router, addr) = Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[("RUST_LOG", "trace")],
        "switchboard listening on",
    )
    .await;
    let url = format!("http://{addr}/mcp");
    // The other listeners say where they are in lines of their own.
    let logged_at = |marker: &'static str| {
        let router = &router;
        async move {
            for _ in 0..100 {
                let found = router.output().iter().find_map(|l| {
                    let rest = &l[l.find(marker)? + marker.len()..];
                    rest.split(['/', ' ']).next()?.parse::<std::net::SocketAddr>().ok()
                });
                if let Some(addr) = found {
                    return addr;
                }
                // Polling the output: no event to await.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("no line with {marker:?} within 5 s")
        }
    };
    let admin_addr = logged_at("admin API listening on http://").await;
    let edge_addr = logged_at("edge devices connect to tcp://").await;
    let http = reqwest_like::Http::new(token);

    // A key created through the router's own admin API, and used every way.
    let (status, created) =
        http.send("POST", &format!("http://{admin_addr}/v1/tenants/secretive/keys"), json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let key = created["key"].as_str().unwrap().to_owned();
    let mut c = Client::with_key(&url, &key);
    assert!(
        eventually(Duration::from_secs(5), || async {
            c.request("ping", json!({})).await.status == StatusCode::BAD_REQUEST
        })
        .await,
        "the new key is known within seconds"
    );
    // A credential for the tenant's calls to alpha, through the admin API:
    // stored (never shown back, listed by header name), then sent upstream.
    let credential = "Bearer vault-credential-0123456789abcdef";
    let at = format!("http://{admin_addr}/v1/tenants/secretive/credentials/alpha");
    let (status, stored) = http.send("PUT", &at, json!({"headers": {"Authorization": credential}})).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!((stored["names"].as_str(), stored["user"].as_str()), (Some("authorization"), Some("")), "{stored}");
    let (status, refused) = http.send("PUT", &at, json!({"headers": {"Host": "evil.example"}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (_, listed) =
        http.send("GET", &format!("http://{admin_addr}/v1/credentials?tenant=secretive"), Value::Null).await;
    assert_eq!(listed["credentials"].as_array().map(Vec::len), Some(1), "{listed}");
    let (status, rotated) = http.send("POST", &format!("http://{admin_addr}/v1/vault/rotate"), Value::Null).await;
    assert_eq!((status, &rotated["current"]), (StatusCode::OK, &json!(1)), "{rotated}");
    c.initialize().await;
    let stream = c.open_stream().await;
    c.tool_names().await;
    assert!(c.call_tool("alpha__echo", json!({"note": "hello"})).await["result"].is_object());
    drop(stream);
    let reply = Client::new(&url)
        .post_raw(bytes::Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#), &[("x-api-key", &key)])
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "authenticated, without a session");
    let mut device = crate::edge::RawDevice::connect(edge_addr).await;
    let registered =
        device.register(&key, "gadget", json!({"ping": {"description": "p", "parameters": {"type": "object"}}})).await;
    assert_eq!(registered["type"], "registered", "{registered}");
    // An unknown key, and a revoked one.
    let unknown = format!("sb_{}", "Q".repeat(40));
    assert_eq!(Client::with_key(&url, &unknown).request("ping", json!({})).await.status, StatusCode::UNAUTHORIZED);
    let (_, second) = http.send("POST", &format!("http://{admin_addr}/v1/tenants/secretive/keys"), json!({})).await;
    let revoked = second["key"].as_str().unwrap().to_owned();
    let prefix = second["prefix"].as_str().unwrap();
    let (status, _) = http.send("DELETE", &format!("http://{admin_addr}/v1/keys/{prefix}"), Value::Null).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let r = Client::with_key(&url, &revoked);
    assert!(
        eventually(Duration::from_secs(5), || async {
            r.request("ping", json!({})).await.status == StatusCode::UNAUTHORIZED
        })
        .await
    );

    let metrics = get_text(&format!("http://{addr}/metrics")).await;
    drop(device);
    // Stopped cleanly: every log line and audit record is out.
    let pid = nix::unistd::Pid::from_raw(router.child.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), router.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_file(&file);
    let dump = std::process::Command::new("pg_dump").args(["--data-only", "--dbname", &pg.url]).output().unwrap();
    assert!(dump.status.success(), "pg_dump: {}", String::from_utf8_lossy(&dump.stderr));
    let dump = String::from_utf8(dump.stdout).unwrap();
    let logs = router.output().join("\n");

    // The dump has the keys' rows and the audit records, by hash and prefix.
    let sha256 = |text: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_owned()
    };
    assert!(dump.contains(&sha256(&key)) && dump.contains(&sha256(&revoked)), "keys are stored as their SHA-256");
    assert!(dump.contains(&key[..PREFIX_LEN]) && dump.contains("alpha__echo"), "the audit record is in the dump");
    assert!(
        logs.lines().count() > 30 && logs.contains(" DEBUG ") && logs.contains("edge device registered"),
        "the router logged at debug level and below ({} lines):\n{logs}",
        logs.lines().count()
    );
    // Not one key, nor the secret part after its prefix, anywhere; nor
    // the credential or the vault key.
    let secrets = [
        &key[PREFIX_LEN..],
        &revoked[PREFIX_LEN..],
        &unknown[PREFIX_LEN..],
        "vault-credential-0123456789abcdef",
        &vault_key[..24],
    ];
    for body in secrets {
        for (what, text) in [("logs", &logs), ("metrics", &metrics), ("database", &dump)] {
            let line = text.lines().find(|l| l.contains(body));
            assert!(line.is_none(), "a key appears in the {what}: {line:?}");
        }
    }
    pg.drop_now().await;
}
