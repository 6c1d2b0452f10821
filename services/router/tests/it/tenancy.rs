//! Tenants, API keys, rate limits and the audit log, against real
//! PostgreSQL and Redis (the machine's, or private instances a test stops and
//! starts) and the embedded SQLite default.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_core::policy::{Limits, Policy, Rate, ToolFilter};
use switchboard_db::Database;
use switchboard_router::admin::Admin;
use switchboard_router::Config;
use switchboard_test_support::services::{unique, PrivatePostgres, PrivateRedis, TempDatabase};
use switchboard_test_support::{
    eventually, get_text, http_upstream, mock_named, Client, MockServer, Router, Stateless,
};

/// Two mock upstreams, `alpha` and `beta`, and the config text for a router
/// with keys required, this database, and `extra` sections.
async fn setup(database_url: &str, extra: &str) -> (MockServer, MockServer, String) {
    let alpha = MockServer::start(mock_named("alpha")).await;
    let beta = MockServer::start(mock_named("beta")).await;
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    let config = format!(
        "[auth]\nmode = \"keys\"\n[database]\nurl = \"{database_url}\"\nrefresh = \"200ms\"\nconnect_timeout = \"1s\"\n\
         [audit]\nspool = \"{}\"\nwrite_timeout = \"1s\"\nretry_every = \"200ms\"\n{extra}\n{}{}",
        spool.display(),
        http_upstream("alpha", &alpha.url, ""),
        http_upstream("beta", &beta.url, ""),
    );
    (alpha, beta, config)
}

/// A second router config on the same database needs its own spool.
fn with_own_spool(config: &str) -> String {
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    config
        .lines()
        .map(|l| if l.starts_with("spool = ") { format!("spool = \"{}\"", spool.display()) } else { l.to_owned() })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn admin_for(config: &str) -> Admin {
    let config = Config::from_toml(config).expect("config");
    let db = Database::connect(config.database.url.as_deref().expect("a database"), Duration::from_secs(3)).unwrap();
    db.migrate().await.expect("migrate");
    Admin::new(db, &config)
}

fn policy(upstreams: &[&str]) -> Policy {
    Policy { upstreams: upstreams.iter().map(|u| u.to_string()).collect(), ..Policy::default() }
}

fn tool_error(reply: &Value) -> (i64, String) {
    (reply["error"]["code"].as_i64().unwrap_or(0), reply["error"]["message"].as_str().unwrap_or("").to_owned())
}

#[tokio::test]
async fn migrations_apply_to_empty_databases_and_again() {
    // PostgreSQL: an empty database, twice.
    let pg = TempDatabase::create().await;
    let db = Database::connect(&pg.url, Duration::from_secs(3)).unwrap();
    db.migrate().await.expect("first migration on PostgreSQL");
    db.migrate().await.expect("second migration on PostgreSQL is a no-op");
    assert_eq!(db.version().await.unwrap(), 0);
    assert_eq!(db.count_audit(None).await.unwrap(), 0);

    // SQLite: a file that does not exist yet, twice; then the whole flow on
    // it (the quickstart's database).
    let dir = std::env::temp_dir().join(unique("sb-sqlite-"));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = format!("sqlite:{}", dir.join("switchboard.db").display());
    let lite = Database::connect(&sqlite, Duration::from_secs(3)).unwrap();
    lite.migrate().await.expect("first migration on SQLite");
    lite.migrate().await.expect("second migration on SQLite is a no-op");

    let (_alpha, _beta, config) = setup(&sqlite, "").await;
    let admin = admin_for(&config).await;
    admin.create_tenant("solo", policy(&["alpha"])).await.unwrap();
    let key = admin.create_key("solo", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let mut client = Client::with_key(&router.url, &key);
    client.initialize().await;
    let answer = client.call_tool("alpha__echo", json!({"text": "on sqlite"})).await;
    assert!(answer["result"].is_object(), "{answer}");
    assert!(
        eventually(Duration::from_secs(10), || async { lite.count_audit(Some("solo")).await.unwrap() == 1 }).await,
        "one audit record in SQLite"
    );
    router.stop().await;
    pg.drop_now().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn each_tenant_sees_exactly_its_own_catalog() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config) = setup(&pg.url, "").await;
    let admin = admin_for(&config).await;
    let mut acme = policy(&["alpha"]);
    acme.tools.insert("alpha".into(), ToolFilter { allow: vec![], deny: vec!["big".into(), "fail".into()] });
    admin.create_tenant("acme", acme).await.unwrap();
    admin.create_tenant("globex", policy(&["beta"])).await.unwrap();
    let key_a = admin.create_key("acme", None).await.unwrap().key;
    let key_b = admin.create_key("globex", None).await.unwrap().key;
    let router = Router::start(&config).await;

    // No key, a wrong key: 401 with a challenge, and the router stays healthy.
    let anonymous = Client::new(&router.url);
    let reply = anonymous.request("ping", json!({})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(reply.headers.get("www-authenticate").unwrap().to_str().unwrap().starts_with("Bearer"));
    assert_eq!(reply.json()["error"]["code"], -32011);
    let forged = Client::with_key(&router.url, "sb_0000000000000000000000000000000000000000");
    let reply = forged.request("ping", json!({})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(reply.headers.get("www-authenticate").unwrap().to_str().unwrap().contains("invalid_token"));

    let mut a = Client::with_key(&router.url, &key_a);
    a.initialize().await;
    let mut b = Client::with_key(&router.url, &key_b);
    b.initialize().await;

    let tools_a = a.tool_names().await;
    let tools_b = b.tool_names().await;
    assert!(tools_a.contains(&"alpha__echo".to_owned()), "{tools_a:?}");
    assert!(tools_a.iter().all(|t| t.starts_with("alpha__")), "{tools_a:?}");
    assert!(!tools_a.contains(&"alpha__big".to_owned()) && !tools_a.contains(&"alpha__fail".to_owned()));
    assert!(tools_b.contains(&"beta__echo".to_owned()), "{tools_b:?}");
    assert!(tools_b.iter().all(|t| t.starts_with("beta__")), "{tools_b:?}");
    // Resources follow the subscriptions too.
    let resources = a.call("resources/list", json!({})).await;
    for r in resources["result"]["resources"].as_array().unwrap() {
        assert!(r["uri"].as_str().unwrap().starts_with("alpha+"), "{r}");
    }

    // The other tenant's tool, and a denied one, fail exactly like a tool
    // that does not exist anywhere.
    let theirs = a.call_tool("beta__echo", json!({"text": "x"})).await;
    let denied = a.call_tool("alpha__big", json!({})).await;
    let nowhere = a.call_tool("gamma__echo", json!({})).await;
    assert_eq!(tool_error(&theirs), (-32602, "unknown tool: beta__echo".into()));
    assert_eq!(tool_error(&denied), (-32602, "unknown tool: alpha__big".into()));
    assert_eq!(tool_error(&nowhere).0, -32602);
    assert_eq!(theirs["error"]["data"], json!({"tool": "beta__echo"}));
    let mine = a.call_tool("alpha__echo", json!({"text": "mine"})).await;
    assert!(mine["result"]["content"][0]["text"].as_str().unwrap().contains("mine"), "{mine}");

    // A's session with B's key: as if it did not exist, for POST, GET and DELETE.
    let mut intruder = a.clone();
    intruder.api_key = Some(key_b.clone());
    assert_eq!(intruder.request("tools/list", json!({})).await.status, StatusCode::NOT_FOUND);
    let (status, _) = intruder.resume_stream(Some("0-0")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(intruder.delete().await, StatusCode::NOT_FOUND);
    // A's session is untouched.
    assert_eq!(a.request("ping", json!({})).await.status, StatusCode::OK);
    assert!(router.metric("switchboard_auth_failures_total", &["reason=\"wrong_tenant\""]).await >= 3.0);
    assert!(router.metric("switchboard_auth_failures_total", &["reason=\"missing\""]).await >= 1.0);
    assert_eq!(a.delete().await, StatusCode::OK);

    router.stop().await;
    pg.drop_now().await;
}

#[tokio::test]
async fn key_lifecycle_through_the_admin_api_on_two_replicas() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config) = setup(&pg.url, "").await;
    let admin = admin_for(&config).await;
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

const PREFIX_LEN: usize = switchboard_tenancy::PREFIX_LEN;

#[tokio::test]
async fn a_burst_over_the_limit_gets_429_with_retry_after() {
    let pg = TempDatabase::create().await;
    let (alpha, _beta, config) = setup(&pg.url, "").await;
    let admin = admin_for(&config).await;
    let mut p = policy(&["alpha"]);
    p.limits = Limits { key: Some(Rate { per_second: 0.5, burst: 3 }), ..Limits::default() };
    admin.create_tenant("limited", p).await.unwrap();
    let mut p = policy(&["alpha"]);
    p.limits = Limits { tool: Some(Rate { per_second: 0.5, burst: 1 }), ..Limits::default() };
    admin.create_tenant("tooly", p).await.unwrap();
    let key = admin.create_key("limited", None).await.unwrap().key;
    let tool_key = admin.create_key("tooly", None).await.unwrap().key;
    let router = Router::start(&config).await;

    let mut c = Client::with_key(&router.url, &key);
    c.initialize().await; // 1 of 3
    assert_eq!(c.request("ping", json!({})).await.status, StatusCode::OK);
    assert_eq!(c.request("ping", json!({})).await.status, StatusCode::OK);
    let refused = c.request("ping", json!({})).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers.get("retry-after").unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    let error = &refused.json()["error"];
    assert_eq!(error["code"], -32029);
    assert_eq!(error["data"]["limit"], "key");
    assert!(error["message"].as_str().unwrap().contains("key limit"), "{error}");
    // Notifications are not limited.
    assert_eq!(
        c.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await.status,
        StatusCode::ACCEPTED
    );

    // The per-tool limit counts calls of one tool only.
    let mut t = Client::with_key(&router.url, &tool_key);
    t.initialize().await;
    assert!(t.call_tool("alpha__echo", json!({})).await["result"].is_object());
    let second = t.request("tools/call", json!({"name": "alpha__echo", "arguments": {}})).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.json()["error"]["data"]["limit"], "tool");
    assert!(t.call_tool("alpha__add", json!({"a": 1, "b": 2})).await["result"].is_object());
    assert!(router.metric("switchboard_rate_limited_total", &["tenant=\"limited\"", "limit=\"key\""]).await >= 1.0);

    // At most one forwarded request in flight: a second waits its turn as 429.
    let mut p = policy(&["alpha"]);
    p.limits = Limits { concurrent: Some(1), ..Limits::default() };
    admin.create_tenant("serial", p).await.unwrap();
    let serial_key = admin.create_key("serial", None).await.unwrap().key;
    let mut s = Client::with_key(&router.url, &serial_key);
    assert!(
        eventually(Duration::from_secs(5), || async {
            s.request("ping", json!({})).await.status == StatusCode::BAD_REQUEST
        })
        .await
    );
    s.initialize().await;
    let calls_before = alpha.mock.call_count();
    let slow = {
        let s = s.clone();
        tokio::spawn(async move { s.call_tool("alpha__sleep", json!({"ms": 1500})).await })
    };
    // The slot is taken once the upstream has the slow call.
    assert!(eventually(Duration::from_secs(10), || async { alpha.mock.call_count() > calls_before }).await);
    let busy = s.request("tools/call", json!({"name": "alpha__echo", "arguments": {}})).await;
    assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.json()["error"]["data"]["limit"], "concurrent");
    assert!(slow.await.unwrap()["result"].is_object());
    // The slot is free again once the answer is complete.
    assert!(s.call_tool("alpha__echo", json!({})).await["result"].is_object());

    // Every refusal by a limit is audited as `refused` with -32029, beside
    // the forwarded calls; requests the router answers itself are not.
    router.stop().await;
    let db = Database::connect(&pg.url, Duration::from_secs(3)).unwrap();
    let records = |tenant: &'static str| {
        let db = db.clone();
        async move {
            db.query_audit(&switchboard_db::AuditQuery {
                tenant: Some(tenant.into()),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|(_, r)| (r.method, r.target.unwrap_or_default(), r.outcome, r.error_code))
            .collect::<Vec<_>>()
        }
    };
    let row = |method: &str, target: &str, outcome: &str, code: Option<i64>| {
        (method.to_owned(), target.to_owned(), outcome.to_owned(), code)
    };
    assert_eq!(records("limited").await, vec![row("ping", "", "refused", Some(-32029))]);
    assert_eq!(
        records("tooly").await,
        vec![
            row("tools/call", "alpha__echo", "ok", None),
            row("tools/call", "alpha__echo", "refused", Some(-32029)),
            row("tools/call", "alpha__add", "ok", None),
        ]
    );
    assert_eq!(
        records("serial").await,
        vec![
            // In the order they ended: the refusal while the slow call ran.
            row("tools/call", "alpha__echo", "refused", Some(-32029)),
            row("tools/call", "alpha__sleep", "ok", None),
            row("tools/call", "alpha__echo", "ok", None),
        ]
    );
    pg.drop_now().await;
}

#[tokio::test]
async fn limits_are_shared_through_redis_and_local_when_it_is_gone() {
    let mut redis = PrivateRedis::start();
    let pg = TempDatabase::create().await;
    let extra = format!("[redis]\nurl = \"{}\"\nkey_prefix = \"{}:\"\n", redis.url, unique("sbtest"));
    let (_alpha, _beta, config) = setup(&pg.url, &extra).await;
    let admin = admin_for(&config).await;
    let mut p = policy(&["alpha"]);
    p.limits = Limits { tenant: Some(Rate { per_second: 0.2, burst: 6 }), ..Limits::default() };
    admin.create_tenant("shared", p).await.unwrap();
    let key = admin.create_key("shared", None).await.unwrap().key;
    let one = Router::start(&config).await;
    let two = Router::start(&with_own_spool(&config)).await;

    let mut c1 = Client::with_key(&one.url, &key);
    c1.initialize().await; // 1
    assert_eq!(c1.request("ping", json!({})).await.status, StatusCode::OK); // 2
    let mut c2 = Client::with_key(&two.url, &key);
    c2.initialize().await; // 3
    for _ in 0..3 {
        assert_eq!(c2.request("ping", json!({})).await.status, StatusCode::OK); // 4, 5, 6
    }
    assert_eq!(c2.request("ping", json!({})).await.status, StatusCode::TOO_MANY_REQUESTS);
    // Replica one has seen only two requests itself: only a shared limit refuses.
    let refused = c1.request("ping", json!({})).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "the limit is shared across replicas");
    assert_eq!(refused.json()["error"]["data"]["limit"], "tenant");
    assert_eq!(one.metric("switchboard_ratelimit_redis_up", &[]).await, 1.0);

    // Redis goes away: both replicas keep serving, each with local limits.
    redis.stop();
    assert_eq!(c1.request("ping", json!({})).await.status, StatusCode::OK);
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(c1.request("ping", json!({})).await.status);
    }
    assert!(statuses.contains(&StatusCode::OK) && statuses.contains(&StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
    assert_eq!(c2.request("tools/list", json!({})).await.status, StatusCode::OK);
    assert_eq!(one.metric("switchboard_ratelimit_redis_up", &[]).await, 0.0);
    assert!(one.metric("switchboard_ratelimit_local_fallbacks_total", &[]).await >= 1.0);

    one.stop().await;
    two.stop().await;
    pg.drop_now().await;
}

/// Limits in Redis: 429 with `Retry-After`; refilled with time; the key,
/// tenant and tool limits of one request checked and taken together (a
/// request one limit refuses costs nothing of the others); local while Redis
/// is gone; shared by the replicas again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_limits_refill_are_taken_together_and_are_shared_again_after_an_outage() {
    let mut redis = PrivateRedis::start();
    let pg = TempDatabase::create().await;
    let extra = format!("[redis]\nurl = \"{}\"\nkey_prefix = \"{}:\"\n", redis.url, unique("sbtest"));
    let (_alpha, _beta, config) = setup(&pg.url, &extra).await;
    let admin = admin_for(&config).await;
    let never = |burst| Some(Rate { per_second: 0.001, burst });
    let mut p = policy(&["alpha"]);
    p.limits = Limits { key: never(4), tool: never(1), ..Limits::default() };
    admin.create_tenant("together", p).await.unwrap();
    let mut p = policy(&["alpha"]);
    p.limits = Limits { key: Some(Rate { per_second: 4.0, burst: 2 }), ..Limits::default() };
    admin.create_tenant("refill", p).await.unwrap();
    let mut p = policy(&["alpha"]);
    p.limits = Limits { tenant: never(6), ..Limits::default() };
    admin.create_tenant("after", p).await.unwrap();
    let key_together = admin.create_key("together", None).await.unwrap().key;
    let key_refill = admin.create_key("refill", None).await.unwrap().key;
    let key_refill_two = admin.create_key("refill", None).await.unwrap().key;
    let key_after = admin.create_key("after", None).await.unwrap().key;
    let one = Router::start(&config).await;
    let two = Router::start(&with_own_spool(&config)).await;
    let ping = |c: &Client| {
        let c = c.clone();
        async move { c.request("ping", json!({})).await }
    };

    // Taken together: the call the tool limit refuses takes no key token.
    let mut t = Client::with_key(&one.url, &key_together);
    t.initialize().await; // key: 1 of 4
    assert!(t.call_tool("alpha__echo", json!({})).await["result"].is_object()); // 2 of 4; the tool's 1 of 1
    let refused = t.request("tools/call", json!({"name": "alpha__echo", "arguments": {}})).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.json()["error"]["data"]["limit"], "tool");
    assert_eq!(ping(&t).await.status, StatusCode::OK, "3 of 4: the refused call cost no key token");
    assert_eq!(ping(&t).await.status, StatusCode::OK, "4 of 4");
    let over = ping(&t).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over.json()["error"]["data"]["limit"], "key");
    let retry: u64 = over.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 900, "the next key token is 1000 s away: Retry-After {retry}");

    // Refilled: two at once, then one every 250 ms.
    let mut r = Client::with_key(&one.url, &key_refill);
    r.initialize().await;
    assert_eq!(ping(&r).await.status, StatusCode::OK);
    let refused = ping(&r).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(
        eventually(Duration::from_secs(5), || async { ping(&r).await.status == StatusCode::OK }).await,
        "a token comes back with time"
    );
    assert_eq!(one.metric("switchboard_ratelimit_redis_up", &[]).await, 1.0);
    assert_eq!(one.metric("switchboard_ratelimit_local_fallbacks_total", &[]).await, 0.0, "all of it in Redis");

    // Another key of the tenant (its own key limit) at the other replica.
    let mut r_two = Client::with_key(&two.url, &key_refill_two);
    r_two.initialize().await;

    // Redis gone: answered from local limits at each replica, not failed.
    redis.stop();
    for (c, replica) in [(&r, &one), (&r_two, &two)] {
        let status = ping(c).await.status;
        assert!(status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS, "{status}");
        assert_eq!(replica.metric("switchboard_ratelimit_redis_up", &[]).await, 0.0);
        assert!(replica.metric("switchboard_ratelimit_local_fallbacks_total", &[]).await >= 1.0);
    }

    // Redis back (empty): both replicas use it again.
    redis.resume();
    assert!(
        eventually(Duration::from_secs(15), || async {
            ping(&r).await;
            ping(&r_two).await;
            one.metric("switchboard_ratelimit_redis_up", &[]).await == 1.0
                && two.metric("switchboard_ratelimit_redis_up", &[]).await == 1.0
        })
        .await,
        "both replicas find Redis again"
    );
    // A tenant's six requests, three at each replica: the seventh is refused
    // at either, though each replica has seen only three.
    let mut a1 = Client::with_key(&one.url, &key_after);
    a1.initialize().await;
    let a2 = {
        let mut c = Client::with_key(&two.url, &key_after);
        c.initialize().await;
        c
    };
    for c in [&a1, &a1, &a2, &a2] {
        assert_eq!(ping(c).await.status, StatusCode::OK);
    }
    for c in [&a2, &a1] {
        let refused = ping(c).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "shared again: {}", c.url);
        assert_eq!(refused.json()["error"]["data"]["limit"], "tenant");
    }
    one.stop().await;
    two.stop().await;
    pg.drop_now().await;
}

#[tokio::test]
async fn every_forwarded_call_leaves_one_audit_record() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config) = setup(&pg.url, "").await;
    let admin = admin_for(&config).await;
    let mut p = policy(&["alpha"]);
    p.audit_arguments = true;
    admin.create_tenant("audited", p).await.unwrap();
    admin.create_tenant("private", policy(&["alpha"])).await.unwrap();
    let created = admin.create_key("audited", None).await.unwrap();
    let private_key = admin.create_key("private", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let mut c = Client::with_key(&router.url, &created.key);
    c.initialize().await;

    const N: usize = 25;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    for i in 0..N {
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                          "params": {"name": "alpha__echo", "arguments": {"n": i}}});
        let bytes = serde_json::to_vec(&body).unwrap();
        let reply = c.post_raw(bytes.into(), &[("traceparent", &format!("00-{trace}-00f067aa0ba902b7-01"))]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let unknown = c.call_tool("beta__echo", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32602);
    let mut p = Client::with_key(&router.url, &private_key);
    p.initialize().await;
    p.call_tool("alpha__echo", json!({"secret": "not stored"})).await;
    let refused = Client::with_key(&router.url, "sb_1234567890123456789012345678901234567890");
    assert_eq!(refused.request("ping", json!({})).await.status, StatusCode::UNAUTHORIZED);

    let db = Database::connect(&pg.url, Duration::from_secs(3)).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.count_audit(Some("audited")).await.unwrap() == N as i64 + 1
        })
        .await,
        "N calls and one unknown tool give N + 1 records"
    );
    let records = db
        .query_audit(&switchboard_db::AuditQuery { tenant: Some("audited".into()), limit: 1000, ..Default::default() })
        .await
        .unwrap();
    let calls: Vec<_> = records.iter().map(|(_, r)| r).filter(|r| r.target.as_deref() == Some("alpha__echo")).collect();
    assert_eq!(calls.len(), N);
    for (i, r) in calls.iter().enumerate() {
        assert_eq!(r.method, "tools/call");
        assert_eq!(r.key_prefix.as_deref(), Some(created.row.prefix.as_str()));
        assert_eq!(r.session.as_deref(), c.session.as_deref());
        assert_eq!(r.upstream.as_deref(), Some("alpha"));
        assert_eq!(r.outcome, "ok");
        assert_eq!(r.error_code, None);
        assert!(r.latency_us > 0 && r.request_bytes > 50 && r.response_bytes > 20, "{r:?}");
        assert_eq!(r.trace_id.as_deref(), Some(trace));
        assert_eq!(r.arguments.as_deref(), Some(format!("{{\"n\":{i}}}").as_str()), "in order, with arguments");
    }
    let unknown = records.iter().map(|(_, r)| r).find(|r| r.target.as_deref() == Some("beta__echo")).unwrap();
    assert_eq!(
        (unknown.outcome.as_str(), unknown.error_code, unknown.upstream.as_deref()),
        ("error", Some(-32602), None)
    );

    // A tenant that did not opt in: no arguments. An unknown key: a refused record without a tenant.
    assert!(
        eventually(Duration::from_secs(10), || async { db.count_audit(Some("private")).await.unwrap() == 1 }).await
    );
    let private = db
        .query_audit(&switchboard_db::AuditQuery { tenant: Some("private".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(private[0].1.arguments, None);
    assert!(
        eventually(Duration::from_secs(10), || async {
            let all = db.query_audit(&switchboard_db::AuditQuery { limit: 1000, ..Default::default() }).await.unwrap();
            all.iter().any(|(_, r)| {
                r.outcome == "refused"
                    && r.tenant.is_none()
                    && r.error_code == Some(-32011)
                    && r.key_prefix.as_deref() == Some("sb_12345678")
            })
        })
        .await
    );
    router.stop().await;
    pg.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_records_survive_a_postgres_outage_exactly_once() {
    let server = PrivatePostgres::start();
    let pg = TempDatabase::create_on(&server.url).await;
    let (_alpha, _beta, config) = setup(&pg.url, "").await;
    let admin = admin_for(&config).await;
    admin.create_tenant("outage", policy(&["alpha"])).await.unwrap();
    let key = admin.create_key("outage", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let mut c = Client::with_key(&router.url, &key);
    c.initialize().await;

    // Load from four clients while PostgreSQL stops and comes back.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut load = Vec::new();
    for w in 0..4 {
        let c = c.clone();
        let stop = stop.clone();
        let answered = answered.clone();
        load.push(tokio::spawn(async move {
            let mut ok = 0u64;
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let reply =
                    c.request("tools/call", json!({"name": "alpha__echo", "arguments": {"w": w, "i": i}})).await;
                assert_eq!(
                    reply.status,
                    StatusCode::OK,
                    "the router keeps serving: {}",
                    String::from_utf8_lossy(&reply.body)
                );
                assert!(reply.response()["result"].is_object());
                ok += 1;
                i += 1;
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            ok
        }));
    }
    let calls_so_far = || answered.load(std::sync::atomic::Ordering::Relaxed);
    // Some calls before the outage, during it, and after it.
    assert!(eventually(Duration::from_secs(20), || async { calls_so_far() >= 20 }).await);
    server.stop();
    let at_outage = calls_so_far();
    assert!(
        eventually(Duration::from_secs(20), || async {
            router.metric("switchboard_audit_records_total", &["event=\"spooled\""]).await > 0.0
        })
        .await,
        "records spooled"
    );
    assert!(eventually(Duration::from_secs(20), || async { calls_so_far() >= at_outage + 20 }).await);
    server.resume();
    assert!(
        eventually(Duration::from_secs(20), || async {
            router.metric("switchboard_audit_records_total", &["event=\"replayed\""]).await > 0.0
        })
        .await,
        "the spool is replayed once PostgreSQL is back"
    );
    let after_outage = calls_so_far();
    assert!(eventually(Duration::from_secs(20), || async { calls_so_far() >= after_outage + 20 }).await);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut calls = 0;
    for l in load {
        calls += l.await.unwrap();
    }
    eprintln!("{calls} calls during the outage test");

    let db = Database::connect(&pg.url, Duration::from_secs(3)).unwrap();
    let expected = calls as i64;
    let arrived = eventually(Duration::from_secs(20), || async {
        db.count_audit(Some("outage")).await.is_ok_and(|n| n >= expected)
    })
    .await;
    let got = db.count_audit(Some("outage")).await.unwrap();
    assert!(arrived, "records arrive after the outage: {got} of {expected}");
    let records = db
        .query_audit(&switchboard_db::AuditQuery {
            tenant: Some("outage".into()),
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let calls_recorded = records.iter().filter(|(_, r)| r.method == "tools/call").count() as i64;
    assert_eq!(calls_recorded, expected, "every call exactly once");
    // (No check of distinct ids here: the table ignores a second insert of an
    // id, so it could not fail. The exact count above is the check: a record
    // lost, or two calls sharing an id, would make it short.)
    assert_eq!(router.metric("switchboard_audit_records_total", &["event=\"lost\""]).await, 0.0);
    assert_eq!(router.metric("switchboard_audit_spool_bytes", &[]).await, 0.0);
    router.stop().await;
    pg.drop_now().await;
}

/// A tiny JSON-over-HTTP client for the admin API.
mod reqwest_like {
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

/// The CLI a newcomer uses: `migrate`, `tenants`, `keys`, `audit`, on SQLite.
#[tokio::test]
async fn the_cli_manages_tenants_keys_and_reads_the_audit_log() {
    use std::process::Command;
    let dir = std::env::temp_dir().join(unique("sb-cli-"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("cli.db").display());
    let (_alpha, _beta, config) = setup(&url, "").await;
    let file = dir.join("switchboard.toml");
    std::fs::write(&file, &config).unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(switchboard_test_support::router_binary())
            .args(args)
            .arg("--config")
            .arg(&file)
            .output()
            .expect("switchboard");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    assert!(cli(&["migrate"]).0);
    assert!(cli(&["migrate"]).0, "migrate twice");
    let (ok, _, err) =
        cli(&["tenants", "create", "cli-co", "--upstream", "alpha", "--deny", "alpha:big", "--key-rate", "50/100"]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&["tenants", "create", "cli-co", "--upstream", "alpha"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, _, err) = cli(&["tenants", "create", "typo", "--upstream", "alhpa"]);
    assert!(!ok && err.contains("alhpa"), "{err}");
    let (ok, out, _) = cli(&["tenants", "list", "--json"]);
    let tenants: Value = serde_json::from_str(&out).unwrap();
    assert!(ok && tenants[0]["name"] == "cli-co" && tenants[0]["limits"]["key"]["burst"] == 100, "{out}");

    // `keys create` prints the key and nothing else.
    let (ok, key, err) = cli(&["keys", "create", "--tenant", "cli-co", "--expires", "30d"]);
    assert!(ok, "{err}");
    let key = key.strip_suffix('\n').expect("one line").to_owned();
    assert!(key.starts_with("sb_") && key.len() == 43 && !key.contains('\n'), "{key:?}");
    let (ok, _, err) = cli(&["keys", "create", "--tenant", "nobody"]);
    assert!(!ok && err.contains("nobody"), "{err}");

    let router = Router::start(&config).await;
    let mut c = Client::with_key(&router.url, &key);
    c.initialize().await;
    c.call_tool("alpha__echo", json!({"from": "cli"})).await;
    let db = Database::connect(&url, Duration::from_secs(3)).unwrap();
    assert!(eventually(Duration::from_secs(10), || async { db.count_audit(Some("cli-co")).await.unwrap() == 1 }).await);
    let (ok, out, err) = cli(&["audit", "query", "--tenant", "cli-co", "--since", "10m"]);
    assert!(ok, "{err}");
    let line: Value = serde_json::from_str(out.lines().next().expect("a record")).unwrap();
    assert_eq!((line["method"].as_str(), line["target"].as_str()), (Some("tools/call"), Some("alpha__echo")));
    assert!(line["at"].as_str().unwrap().ends_with('Z'));

    // `audit tail` prints what is there (with --since), then follows new records.
    let mut tail = tokio::process::Command::new(switchboard_test_support::router_binary())
        .args(["audit", "tail", "--tenant", "cli-co", "--since", "10m", "--config"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tail.stdout.take().unwrap()));
    let wait = Duration::from_secs(10);
    let first = tokio::time::timeout(wait, lines.next_line()).await.expect("tail prints").unwrap().unwrap();
    assert!(first.contains("alpha__echo"), "{first}");
    // Tail is running and has printed the old record: a new one follows.
    c.call_tool("alpha__add", json!({"a": 1, "b": 2})).await;
    let next = tokio::time::timeout(wait, lines.next_line()).await.expect("tail follows").unwrap().unwrap();
    assert!(next.contains("alpha__add"), "{next}");
    let _ = tail.kill().await;

    let prefix = &key[..PREFIX_LEN];
    let (ok, out, _) = cli(&["keys", "list", "--tenant", "cli-co"]);
    assert!(ok && out.contains(prefix) && out.contains("active") && !out.contains(&key[PREFIX_LEN..]), "{out}");
    assert!(cli(&["keys", "revoke", prefix]).0);
    let (_, out, _) = cli(&["keys", "list"]);
    assert!(out.contains("revoked"), "{out}");
    assert!(
        eventually(Duration::from_secs(5), || async {
            c.request("ping", json!({})).await.status == StatusCode::UNAUTHORIZED
        })
        .await
    );
    assert!(cli(&["tenants", "delete", "cli-co"]).0);
    router.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn stateless_clients_are_tenants_too() {
    let pg = TempDatabase::create().await;
    let (alpha, beta, config) = setup(&pg.url, "").await;
    let admin = admin_for(&config).await;
    let mut acme = policy(&["alpha"]);
    acme.tools.insert("alpha".into(), ToolFilter { allow: vec![], deny: vec!["fail".into()] });
    admin.create_tenant("acme", acme).await.unwrap();
    admin.create_tenant("globex", policy(&["alpha", "beta"])).await.unwrap();
    let key_a = admin.create_key("acme", None).await.unwrap().key;
    let key_g = admin.create_key("globex", None).await.unwrap().key;
    let key_a2 = admin.create_key("acme", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let caps = json!({"sampling": {}});
    let stateless = |key: Option<&str>| {
        let mut client = Stateless::new(&router.url, caps.clone());
        client.client.api_key = key.map(str::to_owned);
        client
    };
    let (anonymous, acme, globex) = (stateless(None), stateless(Some(&key_a)), stateless(Some(&key_g)));

    // No key: 401, like a session request.
    let reply = anonymous.request("tools/list", json!({})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.json()["error"]["code"], -32011);

    // Each tenant's list is its own, and says so (private).
    let listed = acme.call("tools/list", json!({})).await;
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"alpha__echo") && !names.contains(&"alpha__fail"), "{names:?}");
    assert!(names.iter().all(|n| !n.starts_with("beta__")), "{names:?}");
    assert_eq!(listed["result"]["cacheScope"], "private");
    let hidden = acme.call("tools/call", json!({"name": "beta__echo", "arguments": {}})).await;
    assert_eq!(tool_error(&hidden).0, -32602, "another tenant's tool does not exist for acme: {hidden}");

    // Each tenant's calls go over its own upstream session.
    let before = alpha.mock.initialize_count();
    acme.call("tools/call", json!({"name": "alpha__echo", "arguments": {"who": "acme"}})).await;
    globex.call("tools/call", json!({"name": "alpha__echo", "arguments": {"who": "globex"}})).await;
    acme.call("tools/call", json!({"name": "alpha__echo", "arguments": {"who": "acme again"}})).await;
    assert_eq!(alpha.mock.initialize_count(), before + 2, "one upstream session per tenant");
    let _ = beta;

    // A round acme started cannot be continued with globex's key, nor with
    // another of acme's keys: only the key that made the call.
    let first = acme.call("tools/call", json!({"name": "alpha__sample", "arguments": {"prompt": "p"}})).await;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    let (key, _) = first["result"]["inputRequests"].as_object().unwrap().iter().next().unwrap();
    let retry = json!({"name": "alpha__sample", "arguments": {"prompt": "p"},
        "requestState": first["result"]["requestState"],
        "inputResponses": {key: {"role": "assistant", "content": {"type": "text", "text": "stolen"}, "model": "m"}}});
    let refused = globex.call("tools/call", retry.clone()).await;
    assert_eq!(tool_error(&refused).0, -32602, "{refused}");
    let refused = stateless(Some(&key_a2)).call("tools/call", retry.clone()).await;
    assert_eq!(tool_error(&refused).0, -32602, "another key of the same tenant: {refused}");
    let done = acme.call("tools/call", retry).await;
    assert_eq!(done["result"]["content"][0]["text"], "sampled: stolen", "{done}");

    // Stateless calls are audited under their tenant and key, each once
    // (the router's shutdown writes every queued record, so the log is
    // complete once it has stopped).
    router.stop().await;
    let db = Database::connect(&pg.url, Duration::from_secs(3)).unwrap();
    let query =
        |tenant: &str| switchboard_db::AuditQuery { tenant: Some(tenant.into()), limit: 1000, ..Default::default() };
    let mut acme_records: Vec<(String, String, String, bool)> = db
        .query_audit(&query("acme"))
        .await
        .unwrap()
        .into_iter()
        .map(|(_, r)| {
            let own_key = key_a.starts_with(r.key_prefix.as_deref().unwrap_or("-"));
            (r.method, r.target.unwrap_or_default(), r.outcome, own_key)
        })
        .collect();
    acme_records.sort();
    let record = |target: &str, outcome: &str| ("tools/call".to_owned(), target.to_owned(), outcome.to_owned(), true);
    // Its two echoes, the hidden tool refused, and the sampling call once
    // (a bridged call's later rounds are covered by its first round's record).
    assert_eq!(
        acme_records,
        [
            record("alpha__echo", "ok"),
            record("alpha__echo", "ok"),
            record("alpha__sample", "ok"),
            record("beta__echo", "rejected"),
        ]
    );
    let globex_records = db.query_audit(&query("globex")).await.unwrap();
    assert_eq!(globex_records.len(), 1, "globex's one echo: {globex_records:?}");
    assert_eq!(globex_records[0].1.target.as_deref(), Some("alpha__echo"));
    assert!(key_g.starts_with(globex_records[0].1.key_prefix.as_deref().unwrap()));
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
/// (audit records included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_never_appear_in_logs_metrics_or_the_database() {
    use switchboard_test_support::peers::Process;
    let pg = TempDatabase::create().await;
    let token = "an-admin-token-for-this-test";
    let extra = format!(
        "[log]\nlevel = \"trace\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n[edge]\nlisten = \"127.0.0.1:0\"\n"
    );
    let (_alpha, _beta, config) = setup(&pg.url, &extra).await;
    let admin = admin_for(&config).await;
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
    // Not one key, nor the secret part after its prefix, anywhere.
    for secret in [&key, &revoked, &unknown] {
        let body = &secret[PREFIX_LEN..];
        for (what, text) in [("logs", &logs), ("metrics", &metrics), ("database", &dump)] {
            let line = text.lines().find(|l| l.contains(body));
            assert!(line.is_none(), "a key appears in the {what}: {line:?}");
        }
    }
    pg.drop_now().await;
}

/// A tenant's pages hold only the tools it sees: full pages (but the last),
/// no page promised that would be empty, and every tool of its filtered
/// catalog once, across both upstreams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_pages_hold_exactly_its_filtered_tools() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config) = setup(&pg.url, "[catalog]\npage_size = 2").await;
    let admin = admin_for(&config).await;
    let mut p = policy(&["alpha", "beta"]);
    p.tools.insert("alpha".into(), ToolFilter { allow: vec!["echo".into(), "s*".into()], deny: vec![] });
    p.tools.insert("beta".into(), ToolFilter { allow: vec!["t*".into(), "c*".into()], deny: vec!["touch".into()] });
    admin.create_tenant("picky", p).await.unwrap();
    let key = admin.create_key("picky", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let mut c = Client::with_key(&router.url, &key);
    c.initialize().await;
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let page = c.call("tools/list", params).await;
        let names: Vec<String> =
            page["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().into()).collect();
        pages.push(names);
        match page["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages.len() < 10, "{pages:?}");
    }
    // alpha: echo, sleep, sample (in its order); beta: cancelled (touch denied).
    assert_eq!(
        pages,
        vec![vec!["alpha__echo", "alpha__sleep"], vec!["alpha__sample", "beta__cancelled"]],
        "two full pages and no empty third"
    );
    router.stop().await;
    pg.drop_now().await;
}
