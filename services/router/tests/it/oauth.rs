//! The router as an OAuth 2.1 resource server, against a real authorization
//! server (oidc-provider, `peers/auth_server.mjs`) and the official Python
//! SDK as the client: the whole flow (401, protected resource metadata,
//! discovery, dynamic registration, PKCE, step-up on 403, refresh), the
//! bad-token matrix, tokens mapped to tenants and users (in audit records),
//! sessions bound to their caller, API keys beside tokens, opaque tokens
//! through introspection (revocation seen), key rotation, and the
//! authorization server going down.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_db::Database;
use switchboard_oauth::fetch::Fetcher;
use switchboard_test_support::peers::{authorization_server, run_python_client, Process};
use switchboard_test_support::services::unique;
use switchboard_test_support::{get_text, http_upstream, mock_named, Client, MockServer, Router};

use super::tenancy::admin_for;

/// A router config with the mock upstream `alpha`, a SQLite database with
/// audit, tenant `acme` (tokens name it in their `org` claim; it takes
/// tokens only) and tenant `team` (API keys only), and `[oauth]` trusting
/// `issuer`; and the database's URL.
fn config(issuer: &str, alpha: &MockServer, extra_oauth: &str) -> (String, String) {
    let dir = std::env::temp_dir().join(unique("sb-oauth-"));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite:{}", dir.join("switchboard.db").display());
    let config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[database]\nurl = \"{db}\"\nrefresh = \"200ms\"\n\
         [audit]\nspool = \"{spool}\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"alpha\"]\naccept = [\"oauth\"]\n\
         [[tenants]]\nname = \"team\"\nupstreams = [\"alpha\"]\naccept = [\"api_keys\"]\n\
         [oauth]\nresource = \"{{router}}/mcp\"\nleeway = \"0s\"\nscope = \"mcp:list\"\n{extra_oauth}\n\
         [oauth.scopes]\n\"mcp:list\" = [\"list\"]\n\"mcp:call\" = [\"call\"]\n\
         [oauth.servers.test]\nissuer = \"{issuer}\"\ntenant_claim = \"org\"\n\
         client_id = \"router\"\nclient_secret = \"router-secret\"\n{upstream}",
        spool = dir.join("audit.spool").display(),
        upstream = http_upstream("alpha", &alpha.url, ""),
    );
    (config, db)
}

/// A client-credentials token from the test server (`client` is one of its
/// pre-registered clients: `machine`, `machine2`, `machine-opaque`) for
/// `resource`.
async fn machine_token(issuer: &str, client: &str, scope: &str, resource: &str) -> String {
    let fetcher = Fetcher::new(None, Duration::from_secs(10), loopback()).unwrap();
    let form = [("grant_type", "client_credentials"), ("scope", scope), ("resource", resource)];
    let body = fetcher.post_form(&format!("{issuer}/token"), &form, Some((client, "machine-secret"))).await.unwrap();
    let answer: Value = serde_json::from_slice(&body).unwrap();
    answer["access_token"].as_str().unwrap_or_else(|| panic!("no token: {answer}")).to_owned()
}

/// A POST to `url` with this bearer token (or none): status, headers, body.
async fn post(url: &str, token: Option<&str>, body: Value) -> (StatusCode, http::HeaderMap, Value) {
    let c = match token {
        Some(token) => Client::with_key(url, token),
        None => Client::new(url),
    };
    let reply = c.post(body).await;
    let json = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    (reply.status, reply.headers, json)
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
}

fn challenge(headers: &http::HeaderMap) -> String {
    headers.get("www-authenticate").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
}

async fn records(db_url: &str, tenant: &str) -> Vec<switchboard_db::AuditRecord> {
    let db = Database::connect(db_url, Duration::from_secs(3)).unwrap();
    let query = switchboard_db::AuditQuery { tenant: Some(tenant.into()), limit: 1000, ..Default::default() };
    db.query_audit(&query).await.unwrap().into_iter().map(|(_, r)| r).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_completes_the_oauth_flow_with_step_up_and_refresh_and_audit_names_the_user() {
    let (_as, issuer) = authorization_server(&[]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let (config, db) = config(&issuer, &alpha, "");
    let router = Router::start(&config).await;

    let out = run_python_client("oauth_client.py", &[&router.url, "carol"]).await;
    assert!(out["tools"].as_array().unwrap().iter().any(|t| t == "alpha__echo"), "{out}");
    assert!(out["call"].as_str().unwrap().contains("hello"), "{out}");
    // The challenge asked for listing only; the call needed more: step-up.
    assert_eq!(out["scope_before"], "mcp:list", "{out}");
    assert!(out["scope_after"].as_str().unwrap().split(' ').any(|s| s == "mcp:call"), "{out}");
    assert_eq!(out["refreshed"], true, "{out}");
    assert!(out["call_after_refresh"].as_str().unwrap().contains("again"), "{out}");
    assert!(router.metric("switchboard_http_rejections_total", &["reason=\"insufficient_scope\""]).await >= 1.0);

    // The calls' audit records name the tenant from the token, and its user.
    let echoed = || async {
        records(&db, "acme")
            .await
            .into_iter()
            .filter(|r| r.target.as_deref() == Some("alpha__echo"))
            .collect::<Vec<_>>()
    };
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(10), || async { echoed().await.len() >= 2 }).await
    );
    for r in echoed().await {
        assert_eq!((r.user.as_deref(), r.key_prefix.as_deref()), (Some("carol"), None), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_get_401_with_the_challenge_and_keys_work_beside_tokens() {
    let (_as, issuer) = authorization_server(&[("TOKEN_TTL", "2")]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let (config, _db) = config(&issuer, &alpha, "");
    let router = Router::start(&config).await;
    let resource = router.url.clone();

    // The protected resource metadata, at the path-suffixed well-known URL
    // and the root one.
    let metadata_url = router.path("/.well-known/oauth-protected-resource/mcp");
    for url in [&metadata_url, &router.path("/.well-known/oauth-protected-resource")] {
        let metadata: Value = serde_json::from_str(&get_text(url).await).unwrap();
        assert_eq!(metadata["resource"], resource.as_str());
        assert_eq!(metadata["authorization_servers"], json!([issuer]));
        assert_eq!(metadata["scopes_supported"], json!(["mcp:call", "mcp:list"]));
    }

    // No token: 401 naming the metadata and the scope to ask for.
    let (status, headers, body) = post(&router.url, None, initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(challenge(&headers), format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"mcp:list\""));
    assert_eq!(body["error"]["code"], -32011);

    // The bad-token matrix: each one 401 invalid_token, the router healthy.
    let good = machine_token(&issuer, "machine", "mcp:list mcp:call", &resource).await;
    let elsewhere = machine_token(&issuer, "machine", "mcp:list", "http://127.0.0.1:9/mcp").await;
    let mut forged: Vec<String> = good.split('.').map(str::to_owned).collect();
    forged[1] = forged[1].chars().rev().collect();
    let unsigned = format!("eyJhbGciOiJub25lIn0.{}.", good.split('.').nth(1).unwrap());
    let huge = format!("{}.{}.{}", good.split('.').next().unwrap(), "A".repeat(100_000), "sig");
    let bad = [
        ("another resource's token", elsewhere),
        ("tampered claims", forged.join(".")),
        ("alg none", unsigned),
        ("garbage", "not-a-token-at-all".to_owned()),
        ("a token 100 KB long", huge),
        ("a malformed header", format!("eyJhbGciOi.{}", good.split_once('.').unwrap().1)),
    ];
    for (what, token) in &bad {
        let (status, headers, _) = post(&router.url, Some(token), initialize()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
        assert!(challenge(&headers).starts_with("Bearer error=\"invalid_token\", resource_metadata="), "{what}");
    }
    // The good token works; once expired (TTL 2 s, no leeway) it does not.
    let (status, _, body) = post(&router.url, Some(&good), initialize()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let (status, headers, body) = post(&router.url, Some(&good), initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(challenge(&headers).contains("invalid_token"));
    assert!(body["error"]["message"].as_str().unwrap().contains("expired"), "{body}");
    assert!(router.metric("switchboard_auth_failures_total", &["reason=\"token_expired\""]).await >= 1.0);

    // The legacy HTTP+SSE endpoint answers the same way.
    let legacy = Client::new(&router.path("/sse"));
    let reply = legacy.send(http::Method::GET, bytes::Bytes::new(), &[("accept", "text/event-stream")]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(challenge(&reply.headers).contains("resource_metadata="));

    // API keys beside tokens: team's key works; acme takes tokens only.
    let admin = admin_for(&config.replace("{router}", "http://127.0.0.1:1")).await;
    let team_key = admin.create_key("team", None).await.unwrap().key;
    let acme_key = admin.create_key("acme", None).await.unwrap().key;
    let fresh = machine_token(&issuer, "machine", "mcp:list", &resource).await;
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(5), || async {
            post(&router.url, Some(&team_key), initialize()).await.0 == StatusCode::OK
        })
        .await
    );
    // The router may have learned team's key before acme's was made: until
    // it learns acme's too, that key is unknown (a different refusal).
    let acme_refused = || async {
        let (status, _, body) = post(&router.url, Some(&acme_key), initialize()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        body["error"]["message"].as_str().unwrap().contains("not accepted")
    };
    assert!(switchboard_test_support::eventually(Duration::from_secs(5), acme_refused).await);
    assert_eq!(post(&router.url, Some(&fresh), initialize()).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_answers_only_the_caller_that_opened_it() {
    let (_as, issuer) = authorization_server(&[]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let (config, _db) = config(&issuer, &alpha, "");
    let router = Router::start(&config).await;
    let one = machine_token(&issuer, "machine", "mcp:list mcp:call", &router.url).await;
    let two = machine_token(&issuer, "machine2", "mcp:list mcp:call", &router.url).await;

    let mut mine = Client::with_key(&router.url, &one);
    mine.initialize().await;
    assert!(mine.call_tool("alpha__echo", json!({"x": 1})).await["result"].is_object());
    // Another user of the same tenant, presenting the same session id: 404.
    let mut theirs = Client::with_key(&router.url, &two);
    theirs.session = mine.session.clone();
    let reply = theirs.request("tools/list", json!({})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(router.metric("switchboard_auth_failures_total", &["reason=\"wrong_principal\""]).await >= 1.0);
    // A new token of the same user keeps the session.
    let again = machine_token(&issuer, "machine", "mcp:list", &router.url).await;
    let mut same = Client::with_key(&router.url, &again);
    same.session = mine.session.clone();
    assert_eq!(same.request("tools/list", json!({})).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_tokens_are_introspected_cached_and_revocation_is_seen() {
    let (_as, issuer) = authorization_server(&[]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let (config, _db) = config(&issuer, &alpha, "introspection_cache = \"1s\"");
    let router = Router::start(&config).await;
    let token = machine_token(&issuer, "machine-opaque", "mcp:list mcp:call", &router.url).await;
    assert!(!token.contains('.'), "an opaque token: {token}");

    let mut c = Client::with_key(&router.url, &token);
    c.initialize().await;
    let hits = router.metric("switchboard_oauth_introspection_cache_hits_total", &[]).await;
    assert!(c.call_tool("alpha__echo", json!({"n": 1})).await["result"].is_object());
    assert!(router.metric("switchboard_oauth_introspection_cache_hits_total", &[]).await > hits);

    // Revoked at the authorization server: refused once the cache lapses.
    let fetcher = Fetcher::new(None, Duration::from_secs(10), loopback()).unwrap();
    fetcher
        .post_form(
            &format!("{issuer}/token/revocation"),
            &[("token", &token)],
            Some(("machine-opaque", "machine-secret")),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let reply = c.request("tools/list", json!({})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(
        router.metric("switchboard_oauth_fetches_total", &["what=\"introspection\"", "result=\"ok\""]).await >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_are_picked_up_and_a_down_server_degrades_as_documented() {
    let (mut auth_server, issuer) = authorization_server(&[]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let (warm_config, _db) = config(&issuer, &alpha, "jwks_refetch_every = \"200ms\"");
    let router = Router::start(&warm_config).await;
    let first = machine_token(&issuer, "machine", "mcp:list", &router.url).await;
    assert_eq!(post(&router.url, Some(&first), initialize()).await.0, StatusCode::OK);

    // A new signing key: tokens under its kid make the router fetch the keys again.
    Fetcher::new(None, Duration::from_secs(5), loopback())
        .unwrap()
        .post_form(&format!("{issuer}/rotate"), &[], None)
        .await
        .unwrap();
    // (The router fetches keys at most every 200 ms here: let that pass.)
    tokio::time::sleep(Duration::from_millis(250)).await;
    let second = machine_token(&issuer, "machine", "mcp:list", &router.url).await;
    assert_ne!(kid(&first), kid(&second));
    assert_eq!(post(&router.url, Some(&second), initialize()).await.0, StatusCode::OK);

    // The authorization server goes down: cached keys keep working...
    stop(&mut auth_server).await;
    assert_eq!(post(&router.url, Some(&second), initialize()).await.0, StatusCode::OK);
    // ...while a router that never fetched them cannot check tokens: 503, Retry-After.
    let (cold_config, _) = config(&issuer, &alpha, "");
    let cold = Router::start(&cold_config).await;
    let for_cold = second.clone();
    let (status, headers, body) = post(&cold.url, Some(&for_cold), initialize()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(headers.get("retry-after").is_some());
    assert!(body["error"]["message"].as_str().unwrap().contains("authorization server"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_authorization_servers_each_for_the_tenants_that_trust_it() {
    // Two servers for two tenants; a third, configured, whose tokens name
    // acme (which does not trust it); a fourth nobody configured.
    let (_first, first) = authorization_server(&[("ORG", "acme")]).await;
    let (_second, second) = authorization_server(&[("ORG", "beta")]).await;
    let (_third, third) = authorization_server(&[("ORG", "acme")]).await;
    let (_stranger, stranger) = authorization_server(&[("ORG", "acme")]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let beta = MockServer::start(mock_named("beta")).await;
    let dir = std::env::temp_dir().join(unique("sb-oauth-several-"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "[auth]\nmode = \"keys\"\n[database]\nurl = \"sqlite:{db}\"\n[audit]\nspool = \"{spool}\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"alpha\"]\naccept = [\"oauth:first\"]\n\
         [[tenants]]\nname = \"beta\"\nupstreams = [\"beta\"]\naccept = [\"oauth:second\", \"api_keys\"]\n\
         [oauth]\nresource = \"{{router}}/mcp\"\n\
         [oauth.servers.first]\nissuer = \"{first}\"\ntenant_claim = \"org\"\n\
         [oauth.servers.second]\nissuer = \"{second}\"\ntenant_claim = \"org\"\n\
         [oauth.servers.third]\nissuer = \"{third}\"\ntenant_claim = \"org\"\n{}{}",
        http_upstream("alpha", &alpha.url, ""),
        http_upstream("beta", &beta.url, ""),
        db = dir.join("switchboard.db").display(),
        spool = dir.join("audit.spool").display(),
    );
    let router = Router::start(&config).await;
    let metadata: Value =
        serde_json::from_str(&get_text(&router.path("/.well-known/oauth-protected-resource/mcp")).await).unwrap();
    assert_eq!(metadata["authorization_servers"], json!([first, second, third]));

    // Each trusted server's token is a caller of its tenant, seeing its tools.
    let tools = |reply: &switchboard_test_support::Reply| -> Vec<String> {
        let body: Value = serde_json::from_slice(&reply.body).unwrap();
        body["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
    };
    let from_first = machine_token(&first, "machine", "mcp:list mcp:call", &router.url).await;
    let mut acme = Client::with_key(&router.url, &from_first);
    acme.initialize().await;
    let listed = tools(&acme.request("tools/list", json!({})).await);
    assert!(listed.iter().all(|t| t.starts_with("alpha__")) && !listed.is_empty(), "{listed:?}");
    let from_second = machine_token(&second, "machine", "mcp:list mcp:call", &router.url).await;
    let mut beta_client = Client::with_key(&router.url, &from_second);
    beta_client.initialize().await;
    let listed = tools(&beta_client.request("tools/list", json!({})).await);
    assert!(listed.iter().all(|t| t.starts_with("beta__")) && !listed.is_empty(), "{listed:?}");
    // The same client id at another server is another user: acme's session
    // is not beta's caller's.
    beta_client.session = acme.session.clone();
    assert_eq!(beta_client.request("tools/list", json!({})).await.status, StatusCode::NOT_FOUND);

    // A server acme does not trust, though its token names acme: 401.
    let from_third = machine_token(&third, "machine", "mcp:list mcp:call", &router.url).await;
    let (status, headers, body) = post(&router.url, Some(&from_third), initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not accepted"), "{body}");
    assert!(challenge(&headers).contains("invalid_token"));
    // A server nobody configured: its issuer is unknown, 401.
    let from_stranger = machine_token(&stranger, "machine", "mcp:list mcp:call", &router.url).await;
    let (status, _, body) = post(&router.url, Some(&from_stranger), initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(router.metric("switchboard_oauth_rejected_tokens_total", &["reason=\"issuer\""]).await >= 1.0);
    // Beta's API keys work beside its tokens.
    let admin = admin_for(&config.replace("{router}", "http://127.0.0.1:1")).await;
    let key = admin.create_key("beta", None).await.unwrap().key;
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(5), || async {
            post(&router.url, Some(&key), initialize()).await.0 == StatusCode::OK
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_appear_in_logs_metrics_or_audit_records() {
    let (_as, issuer) = authorization_server(&[]).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let (config, db) = config(&issuer, &alpha, "");
    let config = config.replace("{router}", &base) + "\n[log]\nlevel = \"trace\"\n";
    let file = std::env::temp_dir().join(unique("sb-oauth-") + ".toml");
    std::fs::write(&file, &config).unwrap();
    let (router, _) = Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", &format!("127.0.0.1:{port}")],
        &[("RUST_LOG", "trace")],
        "switchboard listening on",
    )
    .await;
    let url = format!("{base}/mcp");

    // A good JWT (list and call), an opaque one (introspected), bad ones.
    let jwt = machine_token(&issuer, "machine", "mcp:list mcp:call", &url).await;
    let opaque = machine_token(&issuer, "machine-opaque", "mcp:list mcp:call", &url).await;
    for token in [&jwt, &opaque] {
        let mut c = Client::with_key(&url, token);
        c.initialize().await;
        assert!(c.call_tool("alpha__echo", json!({"n": 1})).await["result"].is_object());
    }
    let tampered = format!("{}x", &jwt[..jwt.len() - 1]);
    let unknown = format!("{opaque}-not");
    for token in [&tampered, &unknown] {
        assert_eq!(post(&url, Some(token), initialize()).await.0, StatusCode::UNAUTHORIZED);
    }

    // Each token's secret part: a JWT's signature, an opaque token whole.
    let secrets = [
        jwt.rsplit('.').next().unwrap().to_owned(),
        tampered.rsplit('.').next().unwrap().to_owned(),
        opaque.clone(),
        unknown.clone(),
    ];
    let metrics = get_text(&format!("{base}/metrics")).await;
    let audited = || async { records(&db, "acme").await };
    assert!(
        switchboard_test_support::eventually(Duration::from_secs(10), || async {
            audited().await.iter().filter(|r| r.target.as_deref() == Some("alpha__echo")).count() >= 2
        })
        .await
    );
    let audit = format!("{:?}", audited().await);
    let logs = router.output().join("\n");
    assert!(logs.lines().count() > 20, "trace logging is on: {logs}");
    for secret in &secrets {
        assert!(!logs.contains(secret.as_str()), "a token in the logs");
        assert!(!metrics.contains(secret.as_str()), "a token in the metrics");
        assert!(!audit.contains(secret.as_str()), "a token in the audit records");
    }
}

/// The test authorization servers are on loopback.
fn loopback() -> switchboard_core::egress::Egress {
    switchboard_core::egress::Egress::parse(&["loopback".into()]).unwrap()
}

fn kid(token: &str) -> String {
    use base64::Engine as _;
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap();
    serde_json::from_slice::<Value>(&header).unwrap()["kid"].as_str().unwrap().to_owned()
}

async fn stop(process: &mut Process) {
    let _ = process.child.kill().await;
}
