//! The credential vault end to end: two users of one tenant, each with
//! their own credential for one upstream, through two router replicas
//! sharing PostgreSQL and Redis, with OAuth tokens from a real
//! authorization server naming the users; the upstream (the mock, which
//! needs a bearer token and tells each session which ones it was sent)
//! sees each user's credential only on that user's upstream session. And
//! the vault's key: records unreadable without it, a rotation through the
//! CLI, the router refusing to start with the wrong key. And upstreams
//! acting for each user added, changed and removed by a reload of the
//! config file.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_db::Database;
use switchboard_oauth::fetch::Fetcher;
use switchboard_test_support::peers::authorization_server;
use switchboard_test_support::services::{redis_url, unique, TempDatabase};
use switchboard_test_support::{
    eventually, http_upstream, mock_named, router_binary, Client, MockServer, Router, Stateless,
};

use super::tenancy::{admin_for, with_own_spool};

/// A client-credentials token of the test server's client `client` (its
/// user, as the router names it, is the client id).
async fn token_of(issuer: &str, client: &str, resource: &str) -> String {
    let fetcher = Fetcher::new(None, Duration::from_secs(10), switchboard_core::egress::Egress::anywhere()).unwrap();
    let form = [("grant_type", "client_credentials"), ("scope", "mcp:list mcp:call"), ("resource", resource)];
    let body = fetcher.post_form(&format!("{issuer}/token"), &form, Some((client, "machine-secret"))).await.unwrap();
    let answer: Value = serde_json::from_slice(&body).unwrap();
    answer["access_token"].as_str().unwrap_or_else(|| panic!("no token: {answer}")).to_owned()
}

/// What `whoami` says: the upstream session and the Authorization headers
/// it was sent; or the error.
fn whoami(response: &Value) -> Result<(String, Vec<String>), Value> {
    let Some(text) = response["result"]["content"][0]["text"].as_str() else {
        return Err(response["error"].clone());
    };
    let v: Value = serde_json::from_str(text).unwrap();
    let seen = v["authorizations"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
    Ok((v["session"].as_str().unwrap().to_owned(), seen))
}

/// The same client (same session) at another replica.
fn at(client: &Client, url: &str) -> Client {
    let mut other = client.clone();
    other.url = url.to_owned();
    other
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_carries_their_own_credential_on_their_own_upstream_session_across_replicas() {
    let (_as, issuer) = authorization_server(&[]).await;
    let mut options = mock_named("gh");
    options.whoami = true;
    options.require_auth = true;
    let gh = MockServer::start(options).await;
    let db = TempDatabase::create().await;
    let key = switchboard_vault::Key::generate();
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    // The upstream's own header is for the catalog (the router's own
    // requests); a client's requests need a vault credential.
    let config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n\
         [database]\nurl = \"{db}\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\n\
         [sessions]\nstore = \"redis\"\ncache = \"100ms\"\n[redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\
         [vault]\nkey = \"{key}\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"gh\"]\naccept = [\"oauth\", \"api_keys\"]\n\
         [oauth]\nresource = \"http://127.0.0.1:9/mcp\"\n\
         [oauth.servers.test]\nissuer = \"{issuer}\"\ntenant_claim = \"org\"\n{upstream}\
         [upstreams.headers]\nAuthorization = \"Bearer router-own\"\n",
        db = db.url,
        spool = spool.display(),
        redis = redis_url(),
        prefix = unique("sbtest:"),
        upstream = http_upstream("gh", &gh.url, "credentials = \"required\""),
    );
    let admin = admin_for(&config).await;
    admin
        .set_credential("acme", Some("machine"), "gh", vec![("Authorization".into(), "Bearer alice-token".into())])
        .await
        .unwrap();
    admin
        .set_credential("acme", Some("machine2"), "gh", vec![("Authorization".into(), "Bearer bob-token".into())])
        .await
        .unwrap();
    let key = admin.create_key("acme", None).await.unwrap().key;
    let (a, b) = (Router::start(&config).await, Router::start(&with_own_spool(&config)).await);
    // Both replicas are one resource (the test server takes 127.0.0.1 ones).
    let resource = "http://127.0.0.1:9/mcp";
    let (alice, bob) = (token_of(&issuer, "machine", resource).await, token_of(&issuer, "machine2", resource).await);

    // Alice opens a session on A; her calls, on A and then on B, reach one
    // upstream session that has only ever been sent her credential.
    let mut alice_a = Client::with_key(&a.url, &alice);
    alice_a.initialize().await;
    let (alice_session, seen) = whoami(&alice_a.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!(seen, ["Bearer alice-token"]);
    let alice_b = at(&alice_a, &b.url);
    let (on_b, seen) = whoami(&alice_b.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!((on_b.as_str(), seen.as_slice()), (alice_session.as_str(), &["Bearer alice-token".to_owned()][..]));

    // Bob, on B: his own upstream session, his own credential.
    let mut bob_b = Client::with_key(&b.url, &bob);
    bob_b.initialize().await;
    let (bob_session, seen) = whoami(&bob_b.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_ne!(bob_session, alice_session);
    assert_eq!(seen, ["Bearer bob-token"]);
    // Bob's token does not reach Alice's session on either replica.
    for url in [&a.url, &b.url] {
        let mut bob_on_alice = at(&alice_a, url);
        bob_on_alice.api_key = Some(bob.clone());
        let reply = bob_on_alice.post(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})).await;
        assert_eq!(reply.status, http::StatusCode::NOT_FOUND, "{url}");
    }

    // Stateless (2026-07-28) clients share a bridged session per user, not
    // per tenant: each carries its own user's credential.
    for (token, expected) in [(&alice, "Bearer alice-token"), (&bob, "Bearer bob-token")] {
        let mut stateless = Stateless::new(&a.url, json!({}));
        stateless.client.api_key = Some(token.clone());
        let answer = stateless.call("tools/call", json!({"name": "gh__whoami", "arguments": {}})).await;
        let (session, seen) = whoami(&answer).unwrap();
        assert_eq!(seen, [expected], "{answer}");
        assert!(session != alice_session && session != bob_session);
    }

    // A key of the tenant has no user: the tenant's credential, and there
    // is none yet: a clear error, naming what to do; nothing reached the upstream.
    let mut keyed = Client::with_key(&a.url, &key);
    keyed.initialize().await;
    let error = whoami(&keyed.call_tool("gh__whoami", json!({})).await).unwrap_err();
    assert_eq!(error["code"], -32012, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("switchboard credentials set --tenant acme --upstream gh"), "{message}");
    assert_eq!(error["data"]["upstream"], "gh");
    assert!(a.metric("switchboard_vault_refused_total", &["upstream=\"gh\"", "reason=\"missing\""]).await >= 1.0);
    // Bob's credential deleted: his open session does not fall back to the
    // upstream's own; with no tenant credential either, his next call is
    // refused, naming him.
    admin.delete_credential("acme", Some("machine2"), "gh").await.unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        let answer = bob_b.call_tool("gh__whoami", json!({})).await;
        let answer = whoami(&answer);
        match answer {
            Err(error) => error["message"].as_str().unwrap_or("").contains("--user machine2"),
            // Until B has reloaded: still his own.
            Ok((_, seen)) => {
                assert_eq!(seen, ["Bearer bob-token"]);
                false
            }
        }
    })
    .await;
    assert!(refused, "bob's call was not refused once his credential was gone");
    // The tenant's credential, once set (through the admin CLI's path, so
    // A learns it by notification), serves keys and users without their own.
    admin.set_credential("acme", None, "gh", vec![("Authorization".into(), "Bearer acme-token".into())]).await.unwrap();
    let tenant_used = eventually(Duration::from_secs(10), || async {
        whoami(&keyed.call_tool("gh__whoami", json!({})).await).is_ok_and(|(_, seen)| seen == ["Bearer acme-token"])
    })
    .await;
    assert!(tenant_used, "the tenant's credential was not used");
    // Bob, who has none of his own now, gets the tenant's: user, else tenant
    // (on B, once B has heard of it: A was asked above).
    let b_knows = eventually(Duration::from_secs(10), || async {
        whoami(&bob_b.call_tool("gh__whoami", json!({})).await).is_ok()
    })
    .await;
    assert!(b_knows, "replica B did not learn of the tenant's credential");
    let (session, seen) = whoami(&bob_b.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!(
        (session.as_str(), seen.as_slice()),
        (bob_session.as_str(), &["Bearer bob-token".to_owned(), "Bearer acme-token".to_owned()][..])
    );

    // The upstream's own header went only with the router's own requests.
    let (_, seen) = whoami(&alice_b.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!(seen, ["Bearer alice-token"]);

    // Nothing readable in the database.
    let raw = Database::connect(&db.url, Duration::from_secs(3)).unwrap();
    for row in raw.credentials(None).await.unwrap() {
        assert!(!row.sealed.contains("token") && !row.names.contains("token"), "{row:?}");
    }
    drop((a, b));
    db.drop_now().await;
}

/// Runs the `switchboard` binary with `args`; its exit status and output.
async fn switchboard(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(router_binary())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the switchboard binary (cargo build --workspace --bins)");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output()).await.expect("it ends").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_reseals_with_the_new_key_and_the_wrong_key_stops_the_router_at_start() {
    let mut options = mock_named("gh");
    options.whoami = true;
    options.require_auth = true;
    let gh = MockServer::start(options).await;
    let dir = std::env::temp_dir().join(unique("sb-vault-"));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite:{}", dir.join("switchboard.db").display());
    let config_with = |keys: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n\
             [database]\nurl = \"{db}\"\n[audit]\nspool = \"{spool}\"\n[vault]\n{keys}\n\
             [[tenants]]\nname = \"acme\"\nupstreams = [\"gh\"]\n{upstream}\
             [upstreams.headers]\nAuthorization = \"Bearer catalog-only\"\n",
            spool = dir.join("audit.spool").display(),
            upstream = http_upstream("gh", &gh.url, "credentials = \"required\""),
        )
    };
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (old, new) = (switchboard_vault::Key::generate(), switchboard_vault::Key::generate());
    let old_config = write("old.toml", config_with(&format!("key = \"{old}\"")));

    // Set through the CLI, the value on standard input; listed without it.
    let (ok, out) = switchboard(
        &["credentials", "set", "-c", &old_config, "--tenant", "acme", "--upstream", "gh", "--stdin"],
        Some("Authorization: Bearer tenant-s3cret\n"),
    )
    .await;
    assert!(ok, "{out}");
    assert!(!out.contains("s3cret"), "{out}");
    let (ok, listed) = switchboard(&["credentials", "list", "-c", &old_config, "--json"], None).await;
    assert!(ok && listed.contains("authorization") && !listed.contains("s3cret"), "{listed}");
    let old_id = switchboard_vault::Key::parse(&old).unwrap().id().to_owned();
    assert!(listed.contains(&old_id), "{listed}");
    let file = std::fs::read(dir.join("switchboard.db")).unwrap();
    assert!(!file.windows(6).any(|w| w == b"s3cret"));

    // The router started with another key refuses, saying which key it needs.
    let wrong_config = write("wrong.toml", config_with(&format!("key = \"{new}\"")));
    let (ok, out) = switchboard(&["serve", "-c", &wrong_config], None).await;
    assert!(!ok, "it started with the wrong key: {out}");
    assert!(out.contains("wrong vault key") && out.contains(&old_id), "{out}");

    // Rotation: the new key current, the old one kept to open; resealed.
    let rotating = write("rotating.toml", config_with(&format!("key = \"{new}\"\nprevious_keys = \"{old}\"")));
    let (ok, out) = switchboard(&["vault", "rotate", "-c", &rotating], None).await;
    assert!(ok && out.contains("1 credentials resealed"), "{out}");
    let (_, listed) = switchboard(&["credentials", "list", "-c", &rotating, "--json"], None).await;
    let new_id = switchboard_vault::Key::parse(&new).unwrap().id().to_owned();
    assert!(listed.contains(&new_id) && !listed.contains(&old_id), "{listed}");

    // Now the new key alone serves: the credential goes upstream.
    let (ok, key) = switchboard(&["keys", "create", "-c", &wrong_config, "--tenant", "acme"], None).await;
    assert!(ok, "{key}");
    let router = Router::start(&std::fs::read_to_string(&wrong_config).unwrap()).await;
    let key = key.lines().find(|l| l.starts_with("sb_")).expect("the key");
    let mut client = Client::with_key(&router.url, key);
    client.initialize().await;
    let (_, seen) = whoami(&client.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!(seen, ["Bearer tenant-s3cret"]);
    // And the old key alone no longer opens anything.
    let (ok, out) = switchboard(&["serve", "-c", &old_config], None).await;
    assert!(!ok && out.contains(&new_id), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The claims of a JWT (its payload, not checked).
fn claims(jwt: &str) -> Value {
    use base64::Engine;
    let payload = jwt.split('.').nth(1).unwrap_or_else(|| panic!("not a JWT: {jwt}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_to_machine_upstream_gets_the_routers_own_client_credentials_token_renewed_before_it_expires() {
    // Tokens that live 3 s: renewed after 2.7 s.
    let (_as, issuer) = authorization_server(&[("TOKEN_TTL", "3")]).await;
    let mut options = mock_named("m2m");
    options.whoami = true;
    options.require_auth = true;
    let m2m = MockServer::start(options).await;
    let config = format!(
        "{upstream}[upstreams.oauth]\ngrant = \"client_credentials\"\nissuer = \"{issuer}\"\n\
         client_id = \"machine\"\nclient_secret = \"machine-secret\"\nscope = \"mcp:list mcp:call\"\n\
         [upstreams.headers]\nX-Tenant-Hint = \"switchboard\"\n",
        upstream = http_upstream("m2m", &m2m.url, ""),
    );
    let router = Router::start(&config).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    // The catalog's own requests got through with the token too.
    assert!(client.tool_names().await.contains(&"m2m__whoami".to_owned()));
    let (_, seen) = whoami(&client.call_tool("m2m__whoami", json!({})).await).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let first = seen[0].strip_prefix("Bearer ").unwrap_or_else(|| panic!("not a bearer token: {seen:?}"));
    let token = claims(first);
    // A token for this upstream (RFC 8707), of the router's client.
    assert_eq!(
        (token["aud"].as_str(), token["client_id"].as_str()),
        (Some(m2m.url.as_str()), Some("machine")),
        "{token}"
    );
    // Kept while good: the next call carries the same one.
    let (_, seen) = whoami(&client.call_tool("m2m__whoami", json!({})).await).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    // Renewed before it expires.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let (_, seen) = whoami(&client.call_tool("m2m__whoami", json!({})).await).unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let second = claims(seen[1].strip_prefix("Bearer ").unwrap());
    assert!(second["exp"].as_i64() > token["exp"].as_i64(), "{second} after {token}");
}

/// A browser, for the test authorization server's redirects: one GET
/// (`Connection: close`) with cookies; the status, `Location` and the
/// cookies it sets.
async fn browse(url: &str, cookies: &mut Vec<String>) -> (u16, Option<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("http");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
    let cookie = if cookies.is_empty() { String::new() } else { format!("Cookie: {}\r\n", cookies.join("; ")) };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n{cookie}Connection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let head = text.split("\r\n\r\n").next().unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut location = None;
    for line in head.lines().skip(1) {
        let Some((name, value)) = line.split_once(':') else { continue };
        match name.to_ascii_lowercase().as_str() {
            "location" => location = Some(value.trim().to_owned()),
            "set-cookie" => {
                let pair = value.trim().split(';').next().unwrap().to_owned();
                let name = pair.split('=').next().unwrap().to_owned();
                cookies.retain(|c| !c.starts_with(&format!("{name}=")));
                cookies.push(pair);
            }
            _ => {}
        }
    }
    let location = location.map(|l| if l.starts_with('/') { format!("http://{authority}{l}") } else { l });
    (status, location)
}

/// The router's OAuth client acting for a user, step by step against a real
/// authorization server: metadata (issuer checked), dynamic registration,
/// the authorization request with PKCE, the user's consent, the redirect
/// checked, the code exchanged for tokens of the upstream's audience, and
/// a refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delegated_client_registers_authorizes_for_a_user_and_refreshes() {
    use switchboard_oauth::delegated::{self, Pkce};
    let (_as, issuer) = authorization_server(&[]).await;
    let fetcher = Fetcher::new(None, Duration::from_secs(10), switchboard_core::egress::Egress::anywhere()).unwrap();
    let server = delegated::server_metadata(&fetcher, &issuer).await.unwrap();
    assert_eq!(server.issuer, issuer);
    // Another issuer's name in the metadata is refused.
    assert!(delegated::server_metadata(&fetcher, &format!("{issuer}/")).await.is_err());

    let redirect = "http://127.0.0.1:9/oauth/callback";
    let client = delegated::register(&fetcher, &server, redirect, "switchboard test").await.unwrap();
    assert!(client.client_secret.is_some(), "{client:?}");
    let resource = "http://127.0.0.1:9/mcp";
    let scope = delegated::choose_scope(Some("mcp:list mcp:call"), &[], &server.scopes_supported, None);
    assert_eq!(scope.as_deref(), Some("mcp:list mcp:call offline_access"));
    let pkce = Pkce::new();
    let url =
        delegated::authorization_url(&server, &client.client_id, redirect, "st-1", &pkce, scope.as_deref(), resource)
            .unwrap();
    // The user (bob) signs in and consents; the server redirects to the router.
    let mut cookies = Vec::new();
    let mut at = format!("{url}&login_hint=bob");
    let query = loop {
        let (status, location) = browse(&at, &mut cookies).await;
        let location = location.unwrap_or_else(|| panic!("{status} without a Location at {at}"));
        if let Some(query) = location.strip_prefix(&format!("{redirect}?")) {
            break query.to_owned();
        }
        at = location;
    };
    assert!(delegated::authorization_code(&query, "st-other", &server).is_err(), "another state");
    let code = delegated::authorization_code(&query, "st-1", &server).unwrap();
    // A wrong verifier gets nothing.
    let wrong = Pkce::new();
    assert!(delegated::exchange_code(&fetcher, &server, &client, &code, &wrong, redirect, resource).await.is_err());
    // The right verifier, on a fresh authorization (a code is tried once):
    // tokens for bob, of the upstream's audience.
    let pkce = Pkce::new();
    let url =
        delegated::authorization_url(&server, &client.client_id, redirect, "st-2", &pkce, scope.as_deref(), resource)
            .unwrap();
    let mut at = format!("{url}&login_hint=bob");
    let query = loop {
        let (_, location) = browse(&at, &mut cookies).await;
        let location = location.expect("a redirect");
        if let Some(query) = location.strip_prefix(&format!("{redirect}?")) {
            break query.to_owned();
        }
        at = location;
    };
    let code = delegated::authorization_code(&query, "st-2", &server).unwrap();
    let tokens = delegated::exchange_code(&fetcher, &server, &client, &code, &pkce, redirect, resource).await.unwrap();
    let access = claims(&tokens.access_token);
    assert_eq!((access["sub"].as_str(), access["aud"].as_str()), (Some("bob"), Some(resource)), "{access}");
    let refresh_token = tokens.refresh_token.clone().expect("offline_access gives a refresh token");
    let renewed = delegated::refresh(&fetcher, &server, &client, &refresh_token, resource).await.unwrap();
    assert_ne!(renewed.access_token, tokens.access_token);
    assert_eq!(claims(&renewed.access_token)["sub"], "bob");
    assert!(!format!("{tokens:?}").contains(&tokens.access_token), "tokens never shown");
}

/// Token exchange (RFC 8693) against a real authorization server: each
/// caller's own access token (the front door's) is traded for a token of
/// the upstream, naming the same user; the caller's token never reaches the
/// upstream. Each user's lists of the upstream come with their token; a
/// caller with an API key (no token to exchange) gets a clear error; an
/// exchange the server refuses leaves that upstream out of the lists and
/// the router healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_callers_own_token_is_exchanged_for_one_of_the_upstream() {
    let (_as, issuer) = authorization_server(&[]).await;
    let mut options = mock_named("docs");
    options.whoami = true;
    options.require_auth = true;
    let docs = MockServer::start(options).await;
    let mut options = mock_named("wide");
    options.require_auth = true;
    let wide = MockServer::start(options).await;
    let db = TempDatabase::create().await;
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    let exchange = |scope: &str| {
        format!(
            "[upstreams.oauth]\ngrant = \"token_exchange\"\nissuer = \"{issuer}\"\n\
             client_id = \"exchanger\"\nclient_secret = \"exchanger-secret\"\nscope = \"{scope}\"\n"
        )
    };
    let config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n\
         [database]\nurl = \"{db}\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"docs\", \"wide\"]\naccept = [\"oauth\", \"api_keys\"]\n\
         [oauth]\nresource = \"http://127.0.0.1:9/mcp\"\n\
         [oauth.servers.test]\nissuer = \"{issuer}\"\ntenant_claim = \"org\"\n\
         {docs}{docs_oauth}[upstreams.headers]\nX-Tenant-Hint = \"switchboard\"\n\
         {wide}{wide_oauth}",
        db = db.url,
        spool = spool.display(),
        docs = http_upstream("docs", &docs.url, ""),
        docs_oauth = exchange("mcp:list mcp:call"),
        wide = http_upstream("wide", &wide.url, ""),
        // Wider than the callers' tokens: the server refuses to exchange.
        wide_oauth = exchange("mcp:list mcp:call mcp:read"),
    );
    let admin = admin_for(&config).await;
    let key = admin.create_key("acme", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let resource = "http://127.0.0.1:9/mcp";
    let (alice, bob) = (token_of(&issuer, "machine", resource).await, token_of(&issuer, "machine2", resource).await);

    let mut alice_client = Client::with_key(&router.url, &alice);
    alice_client.initialize().await;
    // Her list of docs came with her exchanged token; wide's exchange was
    // refused, so wide lists nothing for her (and offers no authorize tool).
    let names = alice_client.tool_names().await;
    assert!(names.contains(&"docs__whoami".to_owned()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("wide__")), "{names:?}");
    let (alice_session, seen) = whoami(&alice_client.call_tool("docs__whoami", json!({})).await).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let exchanged = seen[0].strip_prefix("Bearer ").unwrap_or_else(|| panic!("not a bearer token: {seen:?}"));
    assert_ne!(exchanged, alice, "the caller's own token went upstream");
    let token = claims(exchanged);
    // Her user, the upstream's audience, issued to the router's client.
    assert_eq!(
        (token["sub"].as_str(), token["aud"].as_str(), token["client_id"].as_str()),
        (Some("machine"), Some(docs.url.as_str()), Some("exchanger")),
        "{token}"
    );
    // Kept while good: the next call carries the same one, exchanged once.
    let (_, seen) = whoami(&alice_client.call_tool("docs__whoami", json!({})).await).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");

    // Bob: his own upstream session, his own exchanged token.
    let mut bob_client = Client::with_key(&router.url, &bob);
    bob_client.initialize().await;
    let (bob_session, seen) = whoami(&bob_client.call_tool("docs__whoami", json!({})).await).unwrap();
    assert_ne!(bob_session, alice_session);
    assert_eq!(seen.len(), 1, "{seen:?}");
    let bobs = seen[0].strip_prefix("Bearer ").unwrap();
    assert_ne!(bobs, bob);
    assert_eq!(claims(bobs)["sub"], "machine2");
    assert_eq!(
        router.metric("switchboard_token_exchanges_total", &["upstream=\"docs\"", "outcome=\"ok\""]).await,
        2.0,
        "one exchange per user"
    );

    // A stateless (2026-07-28) client's call carries its user's exchanged token too.
    let mut stateless = Stateless::new(&router.url, json!({}));
    stateless.client.api_key = Some(alice.clone());
    let (_, seen) = whoami(&stateless.call("tools/call", json!({"name": "docs__whoami", "arguments": {}})).await)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claims(seen[0].strip_prefix("Bearer ").unwrap())["sub"], "machine");

    // An API key has no token to exchange: a clear error, nothing sent.
    let mut keyed = Client::with_key(&router.url, &key);
    keyed.initialize().await;
    assert!(!keyed.tool_names().await.iter().any(|n| n.starts_with("docs__")));
    let error = whoami(&keyed.call_tool("docs__whoami", json!({})).await).unwrap_err();
    assert_eq!((error["code"].as_i64(), error["data"]["upstream"].as_str()), (Some(-32012), Some("docs")), "{error}");
    assert!(error["message"].as_str().unwrap().contains("OAuth access token"), "{error}");

    // The refused exchange: its reason is the error, counted, and the
    // router answers as before.
    let error = whoami(&alice_client.call_tool("wide__echo", json!({"text": "x"})).await).unwrap_err();
    assert_eq!(error["code"], -32012, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("did not exchange") && message.contains("invalid_scope"), "{message}");
    assert!(
        router.metric("switchboard_token_exchanges_total", &["upstream=\"wide\"", "outcome=\"failed\""]).await >= 1.0
    );
    let (session, _) = whoami(&alice_client.call_tool("docs__whoami", json!({})).await).unwrap();
    assert_eq!(session, alice_session);
    drop(router);
    db.drop_now().await;
}

/// How many tokens the test authorization server has issued by `grant`.
async fn issued(issuer: &str, grant: &str) -> u64 {
    let stats: Value = get_json(&format!("{issuer}/stats")).await;
    stats["issued"][grant].as_u64().unwrap_or(0)
}

async fn get_json(url: &str) -> Value {
    let fetcher = Fetcher::new(None, Duration::from_secs(10), switchboard_core::egress::Egress::anywhere()).unwrap();
    serde_json::from_slice(&fetcher.get(url).await.unwrap()).unwrap()
}

/// A user connects the router to the upstream: the upstream's `authorize`
/// tool answers with the link, which a browser follows (the user, named
/// to the authorization server by `login_hint`, signs in and consents) back
/// to the router's callback. Returns the callback's page.
async fn authorize(client: &Client, issuer: &str, login_hint: &str) -> String {
    let names = client.tool_names().await;
    assert!(names.contains(&"gh__authorize".to_owned()) && !names.contains(&"gh__whoami".to_owned()), "{names:?}");
    let answer = client.call_tool("gh__authorize", json!({})).await;
    assert_eq!(answer["error"]["code"], -32012, "{answer}");
    let link = answer["error"]["data"]["url"].as_str().unwrap_or_else(|| panic!("no link: {answer}"));
    let mut cookies = Vec::new();
    let mut at = link.to_owned();
    for _ in 0..10 {
        let (status, location) = browse(&at, &mut cookies).await;
        let Some(location) = location else {
            assert_eq!(status, 200, "{at}");
            assert!(at.contains("/oauth/callback?"), "ended at {at}");
            return at;
        };
        at = match location.starts_with(&format!("{issuer}/auth?")) {
            true => format!("{location}&login_hint={login_hint}"),
            false => location,
        };
    }
    panic!("too many redirects, at {at}");
}

/// Acting for each user end to end, through two replicas sharing
/// PostgreSQL and Redis, against a real authorization server: each user
/// authorizes the router at the upstream through the link it hands them
/// (dynamic registration, PKCE, their consent); from then on their
/// requests, on either replica, carry their own token (its `sub` theirs,
/// its audience the upstream) on their own upstream session; tokens are
/// renewed before they expire, and only the replica holding a grant's
/// lease presents its refresh token (every refresh the server issued was
/// stored: none wasted by a second replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_authorizes_the_router_and_one_replica_renews_each_grant() {
    // Upstream tokens live 6 s: renewed after 5.4 s.
    let (_as, issuer) = authorization_server(&[("TOKEN_TTL", "6")]).await;
    let mut options = mock_named("gh");
    options.whoami = true;
    options.require_auth = true;
    options.authorization_server = Some(issuer.clone());
    let gh = MockServer::start(options).await;
    let db = TempDatabase::create().await;
    let key = switchboard_vault::Key::generate();
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    let config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[server]\npublic_url = \"{{router}}\"\n\
         [database]\nurl = \"{db}\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\n\
         [sessions]\nstore = \"redis\"\ncache = \"100ms\"\n[redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\
         [vault]\nkey = \"{key}\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"gh\"]\naccept = [\"oauth\"]\n\
         [oauth]\nresource = \"http://127.0.0.1:9/mcp\"\n\
         [oauth.servers.test]\nissuer = \"{issuer}\"\ntenant_claim = \"org\"\n{upstream}\
         [upstreams.oauth]\ngrant = \"authorization_code\"\n",
        db = db.url,
        spool = spool.display(),
        redis = redis_url(),
        prefix = unique("sbtest:"),
        upstream = http_upstream("gh", &gh.url, ""),
    );
    // (The database's schema, made as the admin would.)
    admin_for(&config.replace("{router}", "http://127.0.0.1:9")).await;
    let (a, b) = (Router::start(&config).await, Router::start(&with_own_spool(&config)).await);
    let resource = "http://127.0.0.1:9/mcp";
    // Front-door tokens also live 6 s: fresh ones for each step.
    let front = |client: &'static str| token_of(&issuer, client, resource);

    // Alice (client "machine" at the front door) connects on A.
    let mut alice = Client::with_key(&a.url, &front("machine").await);
    alice.initialize().await;
    let page = authorize(&alice, &issuer, "alice").await;
    assert!(page.starts_with(&a.path("/oauth/callback")), "{page}");
    let (alice_session, seen) = whoami(&alice.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let token = claims(seen[0].strip_prefix("Bearer ").unwrap());
    assert_eq!((token["sub"].as_str(), token["aud"].as_str()), (Some("alice"), Some(gh.url.as_str())), "{token}");
    // Her session at B: the same upstream session, her token.
    let mut alice_b = at(&alice, &b.url);
    alice_b.api_key = Some(front("machine").await);
    let (on_b, seen_b) = whoami(&alice_b.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!((on_b.as_str(), &seen_b), (alice_session.as_str(), &seen));

    // Bob (client "machine2") connects on B: his own token, his own session.
    let mut bob = Client::with_key(&b.url, &front("machine2").await);
    bob.initialize().await;
    authorize(&bob, &issuer, "bob").await;
    let (bob_session, seen) = whoami(&bob.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_ne!(bob_session, alice_session);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(claims(seen[0].strip_prefix("Bearer ").unwrap())["sub"], "bob");

    // Renewed before they expire, each by one replica.
    let renewed = eventually(Duration::from_secs(40), || async { issued(&issuer, "refresh_token").await >= 4 }).await;
    assert!(renewed, "tokens were not renewed: {}", issued(&issuer, "refresh_token").await);
    let ok = ["upstream=\"gh\"", "outcome=\"ok\""];
    let all_stored = eventually(Duration::from_secs(10), || async {
        let stored = a.metric("switchboard_upstream_token_renewals_total", &ok).await
            + b.metric("switchboard_upstream_token_renewals_total", &ok).await;
        stored as u64 == issued(&issuer, "refresh_token").await
    })
    .await;
    assert!(all_stored, "a refresh token was presented by a replica that did not hold the grant's lease");
    for r in [&a, &b] {
        let failed = ["upstream=\"gh\"", "outcome=\"failed\""];
        assert_eq!(r.metric("switchboard_upstream_token_renewals_total", &failed).await, 0.0);
    }
    // Alice's next call carries her renewed token, still hers.
    alice.api_key = Some(front("machine").await);
    let (session, seen) = whoami(&alice.call_tool("gh__whoami", json!({})).await).unwrap();
    assert_eq!(session, alice_session);
    assert!(seen.len() >= 2, "{seen:?}");
    let last = claims(seen.last().unwrap().strip_prefix("Bearer ").unwrap());
    assert_eq!(last["sub"], "alice");
    assert!(last["exp"].as_i64() > token["exp"].as_i64(), "{last} after {token}");
    assert!(
        a.metric("switchboard_upstream_authorizations_total", &["upstream=\"gh\"", "outcome=\"authorized\""]).await
            >= 1.0
    );
    drop((a, b));
    db.drop_now().await;
}

/// Upstreams acting for each user come and go with the config file, as
/// others do: added by a reload, one taking exchanged tokens serves the
/// user's call with her exchanged token and one taking her consent offers
/// its `authorize` tool, whose link completes the flow; changed, the
/// exchange follows the new settings (the token held for the old ones is
/// not sent again); removed, their tools leave her list and the
/// authorization pages answer no more. Nothing waits for a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_acting_for_each_user_are_added_changed_and_removed_by_a_reload() {
    let (_as, issuer) = authorization_server(&[]).await;
    let plain = MockServer::start(mock_named("plain")).await;
    let mut options = mock_named("docs");
    options.whoami = true;
    options.require_auth = true;
    let docs = MockServer::start(options).await;
    let mut options = mock_named("gh");
    options.whoami = true;
    options.require_auth = true;
    options.authorization_server = Some(issuer.clone());
    let gh = MockServer::start(options).await;
    let dir = std::env::temp_dir().join(unique("sb-reload-acting-"));
    std::fs::create_dir_all(&dir).unwrap();
    let key = switchboard_vault::Key::generate();
    let config = |upstreams: &str| {
        format!(
            "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[server]\npublic_url = \"{{router}}\"\n\
             [database]\nurl = \"sqlite://{db}?mode=rwc\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\n\
             [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"an-admin-token-for-tests\"\n\
             [vault]\nkey = \"{key}\"\n\
             [[tenants]]\nname = \"acme\"\nupstreams = [\"*\"]\naccept = [\"oauth\"]\n\
             [oauth]\nresource = \"http://127.0.0.1:9/mcp\"\n\
             [oauth.servers.test]\nissuer = \"{issuer}\"\ntenant_claim = \"org\"\n{plain}{upstreams}",
            db = dir.join("router.db").display(),
            spool = dir.join("audit.spool").display(),
            plain = http_upstream("plain", &plain.url, ""),
        )
    };
    let exchanged = |scope: &str| {
        format!(
            "{}[upstreams.oauth]\ngrant = \"token_exchange\"\nissuer = \"{issuer}\"\n\
             client_id = \"exchanger\"\nclient_secret = \"exchanger-secret\"\nscope = \"{scope}\"\n",
            http_upstream("docs", &docs.url, "")
        )
    };
    let consented = format!("{}[upstreams.oauth]\ngrant = \"authorization_code\"\n", http_upstream("gh", &gh.url, ""));
    admin_for(&config("").replace("{router}", "http://127.0.0.1:9")).await;
    let router = Router::start(&config("")).await;
    let resource = "http://127.0.0.1:9/mcp";
    let metadata = router.path("/oauth/client-metadata.json");
    let status_of = |url: String| async move { browse(&url, &mut Vec::new()).await.0 };
    assert_eq!(status_of(metadata.clone()).await, 404, "authorization pages without an upstream needing them");

    let mut alice = Client::with_key(&router.url, &token_of(&issuer, "machine", resource).await);
    alice.initialize().await;
    let mut stream = alice.open_stream().await;
    assert!(!alice.tool_names().await.iter().any(|n| n.starts_with("docs__") || n.starts_with("gh__")));

    // Added: both, by one reload.
    router.rewrite(&config(&format!("{}{consented}", exchanged("mcp:list mcp:call"))));
    let mut heard = false;
    while let Some(message) = stream.next(Duration::from_secs(10)).await {
        if message["method"] == "notifications/tools/list_changed" {
            heard = true;
            break;
        }
    }
    assert!(heard, "no notifications/tools/list_changed after the upstreams were added");
    let names = alice.tool_names().await;
    assert!(
        names.contains(&"docs__whoami".to_owned()),
        "the added exchanged upstream lists nothing for her: {names:?}"
    );
    let (_, seen) = whoami(&alice.call_tool("docs__whoami", json!({})).await).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen.len(), 1, "{seen:?}");
    let token = claims(seen[0].strip_prefix("Bearer ").unwrap());
    assert_eq!((token["sub"].as_str(), token["aud"].as_str()), (Some("machine"), Some(docs.url.as_str())), "{token}");
    assert_eq!(status_of(metadata.clone()).await, 200, "the authorization pages did not come with the added upstream");
    let page = authorize(&alice, &issuer, "alice").await;
    assert!(page.starts_with(&router.path("/oauth/callback")), "{page}");
    let (_, seen) = whoami(&alice.call_tool("gh__whoami", json!({})).await).unwrap_or_else(|e| panic!("{e}"));
    let token = claims(seen[0].strip_prefix("Bearer ").unwrap());
    assert_eq!((token["sub"].as_str(), token["aud"].as_str()), (Some("alice"), Some(gh.url.as_str())), "{token}");

    // Changed: docs's exchange now asks for more than her token allows, so
    // the server refuses it; the token held for the old settings is dropped.
    router.rewrite(&config(&format!("{}{consented}", exchanged("mcp:list mcp:call mcp:read"))));
    let refused = eventually(Duration::from_secs(10), || async {
        let answer = alice.call_tool("docs__whoami", json!({})).await;
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("did not exchange") && m.contains("invalid_scope"))
    })
    .await;
    assert!(refused, "the changed upstream's exchange kept its old settings");

    // Removed: gh's tools and the authorization pages go; docs (changed
    // back) serves her again with a fresh exchange.
    router.rewrite(&config(&exchanged("mcp:list mcp:call")));
    let gone = eventually(Duration::from_secs(10), || async {
        !alice.tool_names().await.iter().any(|n| n.starts_with("gh__"))
    })
    .await;
    assert!(gone, "the removed upstream's tools are still listed");
    let answer = alice.call_tool("gh__whoami", json!({})).await;
    assert!(answer["error"].is_object(), "{answer}");
    assert_eq!(status_of(metadata.clone()).await, 404, "the authorization pages outlived their last upstream");
    let served = eventually(Duration::from_secs(10), || async {
        whoami(&alice.call_tool("docs__whoami", json!({})).await).is_ok()
    })
    .await;
    assert!(served, "the upstream changed back does not serve her");

    let admin = format!("http://{}/v1/config", router.admin_addr.unwrap());
    let config: Value = serde_json::from_str(
        &switchboard_test_support::get_text_with(&admin, &[("authorization", "Bearer an-admin-token-for-tests")]).await,
    )
    .unwrap();
    assert_eq!(config["pending_restart"], json!([]), "{config}");
    assert_eq!(config["last_refusal"], Value::Null, "{config}");
    drop(router);
}
