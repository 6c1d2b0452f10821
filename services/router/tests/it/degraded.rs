//! The degraded modes of docs/operations.md ("what happens when something is
//! down"), each against a PostgreSQL server of the test's own that it stops,
//! freezes and starts: the router keeps serving, and no audit record is lost
//! (or, when the spool's disk fails too, each lost one is counted).

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use switchboard_core::policy::Policy;
use switchboard_db::Database;
use switchboard_router::admin::Admin;
use switchboard_router::Config;
use switchboard_test_support::services::{unique, PrivatePostgres, TempDatabase};
use switchboard_test_support::{eventually, get_text, http_upstream, mock_named, Client, MockServer, Router};

const WAIT: Duration = Duration::from_secs(20);

/// A router's configuration: keys required, `db_url`, the audit spool at
/// `spool` with `audit` lines added to `[audit]`, the config-file tenant
/// `static`, and the upstream `alpha`.
fn config(db_url: &str, spool: &Path, audit: &str, alpha: &MockServer) -> String {
    format!(
        "[auth]\nmode = \"keys\"\n\
         [database]\nurl = \"{db_url}\"\nrefresh = \"200ms\"\nconnect_timeout = \"1s\"\n\
         [audit]\nspool = \"{}\"\nretry_every = \"200ms\"\n{audit}\n\
         [[tenants]]\nname = \"static\"\nupstreams = [\"alpha\"]\n{}",
        spool.display(),
        http_upstream("alpha", &alpha.url, ""),
    )
}

fn spool_path() -> PathBuf {
    std::env::temp_dir().join(unique("sb-spool-")).join("audit.spool")
}

/// The admin interface on the router's database, without migrating it.
fn admin(config: &str) -> (Admin, Database) {
    let config = Config::from_toml(config).expect("config");
    let db = Database::connect(config.database.url.as_deref().expect("a database"), Duration::from_secs(3)).unwrap();
    (Admin::new(db.clone(), &config), db)
}

/// A PostgreSQL server of the test's own with a migrated database on it, a
/// tenant `dbt` (upstream `alpha`) and one of its keys.
async fn database_with_a_key() -> (PrivatePostgres, TempDatabase, MockServer, String) {
    let server = PrivatePostgres::start();
    let pg = TempDatabase::create_on(&server.url).await;
    let alpha = MockServer::start(mock_named("alpha")).await;
    let (admin, db) = admin(&config(&pg.url, &spool_path(), "", &alpha));
    db.migrate().await.unwrap();
    admin.create_tenant("dbt", Policy { upstreams: vec!["alpha".into()], ..Policy::default() }).await.unwrap();
    let key = admin.create_key("dbt", None).await.unwrap().key;
    (server, pg, alpha, key)
}

/// `n` calls of `alpha__echo`, each answered.
/// A router on `text`, and a client of it with `key`, initialized.
async fn started(text: &str, key: &str) -> (Router, Client) {
    let router = Router::start(text).await;
    let mut client = Client::with_key(&router.url, key);
    client.initialize().await;
    (router, client)
}

async fn calls(client: &Client, n: usize) {
    for i in 0..n {
        let reply = client.call_tool("alpha__echo", json!({"i": i})).await;
        assert!(reply["result"].is_object(), "{reply}");
    }
}

async fn records(db: &Database, tenant: &str) -> i64 {
    db.count_audit(Some(tenant)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_started_while_its_database_is_down_waits_for_its_keys_then_serves() {
    // An empty database (not even migrated) on a server that is down: as
    // when a compose file starts the router before PostgreSQL.
    let server = PrivatePostgres::start();
    let pg = TempDatabase::create_on(&server.url).await;
    server.stop();
    let alpha = MockServer::start(mock_named("alpha")).await;
    let other = MockServer::start(mock_named("other")).await;
    let text = format!(
        "{}{}",
        config(&pg.url, &spool_path(), "write_timeout = \"1s\"", &alpha),
        http_upstream("other", &other.url, "")
    );
    let router = Router::start(&text).await;
    assert_eq!(router.metric("switchboard_tenant_directory_db_up", &[]).await, 0.0);

    // Any key might be a good one: 503 with Retry-After, not 401.
    let unknown = Client::with_key(&router.url, "sb_0000000000000000000000000000000000000000");
    let mut refused = 0;
    for _ in 0..3 {
        let reply = unknown.request("ping", json!({})).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reply.headers.get("retry-after").unwrap(), "1");
        assert!(reply.headers.get("www-authenticate").is_none());
        assert!(reply.json()["error"]["message"].as_str().unwrap().contains("cannot check API keys yet"));
        refused += 1;
    }
    assert_eq!(router.metric("switchboard_auth_failures_total", &["reason=\"not_loaded\""]).await, 3.0);
    assert_eq!(router.metric("switchboard_http_rejections_total", &["reason=\"keys_not_loaded\""]).await, 3.0);
    assert_eq!(get_text(&router.path("/healthz")).await.trim(), "ok");

    // The database comes up: the router migrates it and loads it.
    server.resume();
    assert!(
        eventually(WAIT, || async { router.metric("switchboard_tenant_directory_db_up", &[]).await == 1.0 }).await,
        "the directory reloads once the database is back"
    );
    // Up means its keys are read: an unknown key is invalid from then on
    // (a fresh database's version is the empty directory's, and was once
    // taken for "nothing new to read": 503 until the first change).
    let reply = unknown.request("ping", json!({})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", String::from_utf8_lossy(&reply.body));
    let (admin, db) = admin(&text);
    // A key of the config file's tenant works, with that tenant's catalog.
    let key = admin.create_key("static", None).await.expect("migrated by the router").key;
    let mut client = Client::with_key(&router.url, &key);
    assert!(
        eventually(WAIT, || async { client.request("ping", json!({})).await.status == StatusCode::BAD_REQUEST }).await,
        "the new key is known within seconds"
    );
    client.initialize().await;
    let names = client.tool_names().await;
    assert!(!names.is_empty() && names.iter().all(|n| n.starts_with("alpha__")), "{names:?}");
    calls(&client, 2).await;
    // Now that the keys are loaded, an unknown key is invalid.
    let reply = unknown.request("ping", json!({})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);

    // The refusals of the outage were spooled and are in the database now,
    // beside the two calls.
    assert!(
        eventually(WAIT, || async {
            router.metric("switchboard_audit_spool_bytes", &[]).await == 0.0
                && db.count_audit(Some("static")).await.is_ok_and(|n| n == 2)
        })
        .await,
        "the spool is replayed into the migrated database"
    );
    router.stop().await;
    let all = db.query_audit(&switchboard_db::AuditQuery { limit: 100, ..Default::default() }).await.unwrap();
    let outage: Vec<_> = all.iter().filter(|(_, r)| r.outcome == "refused" && r.error_code == Some(-32603)).collect();
    assert_eq!(outage.len(), refused, "{all:?}");
    assert_eq!(records(&db, "static").await, 2);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_while_running_is_served_from_memory_and_followed_after() {
    let (server, pg, alpha, key) = database_with_a_key().await;
    let spool = spool_path();
    let text = config(&pg.url, &spool, "write_timeout = \"1s\"", &alpha);
    let (router, client) = started(&text, &key).await;
    calls(&client, 2).await;
    assert_eq!(router.metric("switchboard_tenant_directory_db_up", &[]).await, 1.0);

    server.stop();
    assert!(
        eventually(WAIT, || async { router.metric("switchboard_tenant_directory_db_up", &[]).await == 0.0 }).await,
        "the outage is noticed"
    );
    // Tenants and keys from memory: the old session and a new one work.
    calls(&client, 3).await;
    let mut second = Client::with_key(&router.url, &key);
    second.initialize().await;
    assert!(second.tool_names().await.iter().all(|n| n.starts_with("alpha__")));
    calls(&second, 1).await;
    // Keys were loaded before: an unknown one is invalid, as before.
    let stranger = Client::with_key(&router.url, "sb_0000000000000000000000000000000000000000");
    assert_eq!(stranger.request("ping", json!({})).await.status, StatusCode::UNAUTHORIZED);

    server.resume();
    assert!(
        eventually(WAIT, || async { router.metric("switchboard_tenant_directory_db_up", &[]).await == 1.0 }).await,
        "the return is noticed"
    );
    // Changes made after the outage reach the router again.
    let (admin, db) = admin(&text);
    let fresh = admin.create_key("dbt", None).await.unwrap();
    let newcomer = Client::with_key(&router.url, &fresh.key);
    assert!(
        eventually(WAIT, || async { newcomer.request("ping", json!({})).await.status == StatusCode::BAD_REQUEST })
            .await
    );
    let old_prefix = &key[..switchboard_tenancy::PREFIX_LEN];
    admin.revoke_key(old_prefix).await.unwrap();
    assert!(
        eventually(WAIT, || async { client.request("ping", json!({})).await.status == StatusCode::UNAUTHORIZED }).await
    );
    // Every call of the three phases is in the audit log once.
    router.stop().await;
    assert_eq!(records(&db, "dbt").await, 2 + 3 + 1);
    pg.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_audit_queue_has_each_request_spool_its_own_record_and_none_is_lost() {
    let (server, pg, alpha, key) = database_with_a_key().await;
    // A queue of two, and a writer that waits long for a database that
    // stopped answering (frozen, not down: its insert hangs).
    let text = config(&pg.url, &spool_path(), "queue = 2\nwrite_timeout = \"30s\"", &alpha);
    let (router, client) = started(&text, &key).await;
    calls(&client, 3).await;
    let mut total = 3;

    server.freeze();
    let overflow = || async { router.metric("switchboard_audit_records_total", &["event=\"overflow\""]).await };
    while overflow().await == 0.0 {
        assert!(total < 200, "200 calls and no overflow with a queue of 2 and a stuck writer");
        calls(&client, 1).await;
        total += 1;
    }
    // The writer may not yet be stuck: it may still be gathering (for
    // flush_every, 100 ms) and take the queued records, or, on a busy
    // machine, not yet have woken for the first of them. Give it time to
    // reach the insert that hangs; from then on it takes nothing, so at most
    // the queue's two places are free and every call after them spools its
    // own record.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let first = overflow().await;
    let mut more = 0;
    while overflow().await < first + 5.0 {
        assert!(more < 10, "calls after the queue filled did not spool their records: {}", overflow().await);
        calls(&client, 1).await;
        more += 1;
        total += 1;
    }
    assert!(more <= 7, "at most the queue's two records went to the writer: {more} calls for 5 spooled");
    server.thaw();

    let (_, db) = admin(&text);
    assert!(
        eventually(WAIT, || async { db.count_audit(Some("dbt")).await.is_ok_and(|n| n >= total as i64) }).await,
        "every record arrives"
    );
    assert!(
        eventually(WAIT, || async { router.metric("switchboard_audit_spool_bytes", &[]).await == 0.0 }).await,
        "the spool is replayed"
    );
    router.stop().await;
    assert_eq!(records(&db, "dbt").await, total as i64, "each record once");
    pg.drop_now().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_that_reach_neither_the_database_nor_the_spool_are_counted_as_lost() {
    let (server, pg, alpha, key) = database_with_a_key().await;
    // A spool on a disk that is always full.
    let text = config(&pg.url, Path::new("/dev/full"), "write_timeout = \"1s\"", &alpha);
    let (router, client) = started(&text, &key).await;
    calls(&client, 2).await;
    let written = || async { router.metric("switchboard_audit_records_total", &["event=\"written\""]).await };
    assert!(eventually(WAIT, || async { written().await == 2.0 }).await);

    server.stop();
    // The router serves on; the records of these calls have nowhere to go.
    calls(&client, 4).await;
    let lost = || async { router.metric("switchboard_audit_records_total", &["event=\"lost\""]).await };
    assert!(eventually(WAIT, || async { lost().await == 4.0 }).await, "lost: {}", lost().await);
    assert_eq!(router.metric("switchboard_audit_records_total", &["event=\"spooled\""]).await, 0.0);
    assert_eq!(written().await, 2.0);
    router.stop().await;
    server.resume();
    let (_, db) = admin(&text);
    assert_eq!(records(&db, "dbt").await, 2);
    pg.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spool_of_a_stopped_router_is_replayed_by_the_next_one_exactly_once() {
    let (server, pg, alpha, key) = database_with_a_key().await;
    let spool = spool_path();
    let text = config(&pg.url, &spool, "write_timeout = \"1s\"", &alpha);
    let (first, client) = started(&text, &key).await;
    calls(&client, 2).await;
    assert!(
        eventually(WAIT, || async {
            first.metric("switchboard_audit_records_total", &["event=\"written\""]).await == 2.0
        })
        .await
    );

    server.stop();
    calls(&client, 6).await;
    assert!(
        eventually(WAIT, || async {
            first.metric("switchboard_audit_records_total", &["event=\"spooled\""]).await == 6.0
        })
        .await,
        "the outage's records are spooled"
    );
    first.stop().await;
    let on_disk = std::fs::metadata(&spool).map(|m| m.len()).unwrap_or(0);
    assert!(on_disk > 0, "the spool holds the records after the router stopped");

    server.resume();
    let second = Router::start(&text).await;
    assert!(
        eventually(WAIT, || async {
            second.metric("switchboard_audit_records_total", &["event=\"replayed\""]).await == 6.0
        })
        .await,
        "the next router replays the spool"
    );
    assert_eq!(second.metric("switchboard_audit_spool_bytes", &[]).await, 0.0);
    second.stop().await;
    let (_, db) = admin(&text);
    assert_eq!(records(&db, "dbt").await, 2 + 6, "each record once");
    pg.drop_now().await;
}
