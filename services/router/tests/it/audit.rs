//! The audit log: one record per forwarded call, and records kept through a
//! PostgreSQL outage exactly once.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use switchboard_db::Database;
use switchboard_test_support::services::{PrivatePostgres, TempDatabase};
use switchboard_test_support::{eventually, Client, Router};

use super::tenancy::{policy, setup_with_admin};

#[tokio::test]
async fn every_forwarded_call_leaves_one_audit_record() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
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
        (unknown.outcome.as_ref(), unknown.error_code, unknown.upstream.as_deref()),
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

/// PostgreSQL's text cannot hold a NUL character: a client's tool name with
/// one is audited (as U+FFFD), and the records after it are written too, not
/// spooled behind a batch that can never be written.
#[tokio::test]
async fn a_nul_character_a_client_sends_is_audited_and_holds_up_no_record_after_it() {
    let pg = TempDatabase::create().await;
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
    admin.create_tenant("nul", policy(&["alpha"])).await.unwrap();
    let key = admin.create_key("nul", None).await.unwrap().key;
    let router = Router::start(&config).await;
    let mut c = Client::with_key(&router.url, &key);
    c.initialize().await;
    let unknown = c.call_tool("alpha__ec\u{0}ho", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    for i in 0..3 {
        assert!(c.call_tool("alpha__echo", json!({"i": i})).await["result"].is_object());
    }
    let db = Database::connect(&pg.url, Duration::from_secs(3)).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async { db.count_audit(Some("nul")).await.unwrap() == 4 }).await,
        "every record written: {:?}",
        db.count_audit(Some("nul")).await
    );
    let records = db
        .query_audit(&switchboard_db::AuditQuery { tenant: Some("nul".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(records[0].1.target.as_deref(), Some("alpha__ec\u{FFFD}ho"));
    assert_eq!(records[0].1.outcome, "error");
    assert_eq!(router.metric("switchboard_audit_write_failures_total", &[]).await, 0.0);
    assert_eq!(router.metric("switchboard_audit_records_total", &["event=\"spooled\""]).await, 0.0);
    router.stop().await;
    pg.drop_now().await;
}

/// A record the database refuses for what it holds (here a constraint the
/// operator added; before, a NUL character on PostgreSQL) is set aside in
/// the rejected file, counted and logged, and the records around it, in its
/// batch and after it, are written: none waits behind it in the spool. On
/// PostgreSQL and on the default SQLite file.
#[tokio::test]
async fn a_record_the_database_refuses_is_set_aside_and_the_others_are_written() {
    let pg = TempDatabase::create().await;
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-refused-"));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = format!("sqlite://{}?mode=rwc", dir.join("switchboard.db").display());
    for url in [pg.url.clone(), sqlite] {
        // A batch gathers for 300 ms: the refused record is written in one
        // with the records around it.
        let (_alpha, _beta, config, admin) = setup_with_admin(&url, "flush_every = \"300ms\"").await;
        admin.create_tenant("refused", policy(&["alpha"])).await.unwrap();
        let key = admin.create_key("refused", None).await.unwrap().key;
        if url.starts_with("postgres") {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(
                "ALTER TABLE audit_log ADD CONSTRAINT no_poison CHECK (target IS DISTINCT FROM 'alpha__poison')",
            )
            .execute(&pool)
            .await
            .unwrap();
        } else {
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            sqlx::query(
                "CREATE TRIGGER no_poison BEFORE INSERT ON audit_log WHEN NEW.target = 'alpha__poison' \
                 BEGIN SELECT RAISE(ABORT, 'no poison'); END",
            )
            .execute(&pool)
            .await
            .unwrap();
        }
        let spool = switchboard_router::Config::from_toml(&config).unwrap().audit.spool;
        let rejected = switchboard_audit::rejected_path(&spool);
        let router = Router::start(&config).await;
        let mut c = Client::with_key(&router.url, &key);
        c.initialize().await;
        for i in 0..6 {
            if i == 3 {
                assert_eq!(c.call_tool("alpha__poison", json!({})).await["error"]["code"], -32602);
            }
            assert!(c.call_tool("alpha__echo", json!({"i": i})).await["result"].is_object());
        }
        let db = Database::connect(&url, Duration::from_secs(3)).unwrap();
        assert!(
            eventually(Duration::from_secs(10), || async { db.count_audit(Some("refused")).await.unwrap() == 6 }).await,
            "{url}: the six other records written: {:?}",
            db.count_audit(Some("refused")).await
        );
        assert!(
            eventually(Duration::from_secs(10), || async {
                router.metric("switchboard_audit_records_total", &["event=\"rejected\""]).await == 1.0
            })
            .await,
            "{url}"
        );
        let set_aside = std::fs::read_to_string(&rejected).unwrap();
        let lines: Vec<switchboard_db::AuditRecord> =
            set_aside.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 1, "{url}: {set_aside}");
        assert_eq!(
            (lines[0].tenant.as_deref(), lines[0].target.as_deref(), lines[0].outcome.as_ref()),
            (Some("refused"), Some("alpha__poison"), "error")
        );
        assert_eq!(lines[0].id.len(), 32, "given its id");
        // Later records are written directly, nothing spooled or lost.
        assert!(c.call_tool("alpha__echo", json!({"i": 6})).await["result"].is_object());
        assert!(
            eventually(Duration::from_secs(10), || async { db.count_audit(Some("refused")).await.unwrap() == 7 }).await
        );
        for event in ["spooled", "lost"] {
            assert_eq!(
                router.metric("switchboard_audit_records_total", &[&format!("event=\"{event}\"")]).await,
                0.0,
                "{url}: {event}"
            );
        }
        assert_eq!(router.metric("switchboard_audit_spool_bytes", &[]).await, 0.0);
        router.stop().await;
    }
    pg.drop_now().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_records_survive_a_postgres_outage_exactly_once() {
    let server = PrivatePostgres::start();
    let pg = TempDatabase::create_on(&server.url).await;
    let (_alpha, _beta, config, admin) = setup_with_admin(&pg.url, "").await;
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
