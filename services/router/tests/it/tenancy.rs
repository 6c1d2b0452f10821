//! Tenants and their catalogs, limits (local and in Redis), migrations and
//! the CLI, against real PostgreSQL and Redis (the machine's, or private
//! instances a test stops and starts) and the embedded SQLite default.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_core::policy::{Limits, Policy, Rate, ToolFilter};
use switchboard_db::Database;
use switchboard_router::admin::Admin;
use switchboard_router::Config;
use switchboard_test_support::services::{unique, PrivateRedis, TempDatabase};
use switchboard_test_support::{eventually, http_upstream, mock_named, Client, MockServer, Router, Stateless};

/// Two mock upstreams, `alpha` and `beta`, and the config text for a router
/// with keys required, this database, and `extra` sections.
pub(super) async fn setup(database_url: &str, extra: &str) -> (MockServer, MockServer, String) {
    let alpha = MockServer::start(mock_named("alpha")).await;
    let beta = MockServer::start(mock_named("beta")).await;
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    let config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[database]\nurl = \"{database_url}\"\nrefresh = \"200ms\"\nconnect_timeout = \"1s\"\n\
         [audit]\nspool = \"{}\"\nwrite_timeout = \"1s\"\nretry_every = \"200ms\"\n{extra}\n{}{}",
        spool.display(),
        http_upstream("alpha", &alpha.url, ""),
        http_upstream("beta", &beta.url, ""),
    );
    (alpha, beta, config)
}

/// `setup`, and the admin interface on its database (migrated).
pub(super) async fn setup_with_admin(database_url: &str, extra: &str) -> (MockServer, MockServer, String, Admin) {
    let (alpha, beta, config) = setup(database_url, extra).await;
    let admin = admin_for(&config).await;
    (alpha, beta, config, admin)
}

/// A second router config on the same database needs its own spool.
pub(super) fn with_own_spool(config: &str) -> String {
    let spool = std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool");
    config
        .lines()
        .map(|l| if l.starts_with("spool = ") { format!("spool = \"{}\"", spool.display()) } else { l.to_owned() })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) async fn admin_for(config: &str) -> Admin {
    let config = Config::from_toml(config).expect("config");
    let db = Database::connect(config.database.url.as_deref().expect("a database"), Duration::from_secs(3)).unwrap();
    db.migrate().await.expect("migrate");
    Admin::new(db, &config)
}

pub(super) fn policy(upstreams: &[&str]) -> Policy {
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

    let (_alpha, _beta, config, admin) = setup_with_admin(&sqlite, "").await;
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
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
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

const PREFIX_LEN: usize = switchboard_tenancy::PREFIX_LEN;

#[tokio::test]
async fn a_burst_over_the_limit_gets_429_with_retry_after() {
    let pg = TempDatabase::create().await;
    let (alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
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
            .map(|(_, r)| (r.method.into_owned(), r.target.unwrap_or_default(), r.outcome.into_owned(), r.error_code))
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
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, &extra).await;
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
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, &extra).await;
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
    let (alpha, beta, config, admin) = setup_with_admin(&pg.url, "").await;
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
            (r.method.into_owned(), r.target.unwrap_or_default(), r.outcome.into_owned(), own_key)
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

/// A tenant's pages hold only the tools it sees: full pages (but the last),
/// no page promised that would be empty, and every tool of its filtered
/// catalog once, across both upstreams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_pages_hold_exactly_its_filtered_tools() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "[catalog]\npage_size = 2").await;
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
