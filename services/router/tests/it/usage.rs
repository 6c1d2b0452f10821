//! Usage metering from the audit log: for a run of known calls by two
//! tenants (some failing), the usage the admin API reports, grouped by
//! tenant, upstream and tool or by key, equals what the audit records add
//! up to, on SQLite and on PostgreSQL; as JSON and as CSV.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard_db::usage::{Dimension, UsageQuery};
use switchboard_db::AuditQuery;
use switchboard_test_support::services::{unique, TempDatabase};
use switchboard_test_support::{eventually, get_text_with, Client, Router};

use super::keys::reqwest_like::Http;
use super::tenancy::{policy, setup_with_admin};

const TOKEN: &str = "usage-admin-token";

/// (tenant, upstream, tool).
type Group = (Option<String>, Option<String>, Option<String>);

async fn metered_run(database_url: &str) {
    let (_alpha, _beta, config, admin) = setup_with_admin(
        database_url,
        // Right after setup's [audit] table: its flush, then the admin API.
        &format!("flush_every = \"20ms\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n"),
    )
    .await;
    let (t1, t2) = (unique("t1-"), unique("t2-"));
    admin.create_tenant(&t1, policy(&["alpha", "beta"])).await.unwrap();
    admin.create_tenant(&t2, policy(&["alpha"])).await.unwrap();
    let (k1, k1b, k2) = (
        admin.create_key(&t1, None).await.unwrap().key,
        admin.create_key(&t1, None).await.unwrap().key,
        admin.create_key(&t2, None).await.unwrap().key,
    );
    let router = Router::start(&config).await;
    let started = switchboard_core::time::now_ms();

    // The known calls: t1 with two keys, t2 with one; some fail.
    let mut expected_calls = 0;
    for (key, calls) in [
        (
            &k1,
            vec![
                ("alpha__echo", json!({"x": 1})),
                ("alpha__echo", json!({"x": 22})),
                ("beta__add", json!({"a": 1, "b": 2})),
            ],
        ),
        (&k1b, vec![("alpha__echo", json!({})), ("beta__add", json!({"a": "no"})), ("alpha__nope", json!({}))]),
        (
            &k2,
            vec![
                ("alpha__echo", json!({"y": "z"})),
                ("alpha__echo", json!({})),
                ("beta__add", json!({"a": 1, "b": 1})),
            ],
        ),
    ] {
        let mut client = Client::with_key(&router.url, key);
        client.initialize().await;
        for (tool, arguments) in calls {
            client.call_tool(tool, arguments).await;
            expected_calls += 1;
        }
    }
    let records = || async {
        let all =
            admin.audit(&AuditQuery { since_ms: Some(started), limit: 10_000, ..Default::default() }).await.unwrap();
        all.into_iter().map(|(_, r)| r).filter(|r| r.method == "tools/call").collect::<Vec<_>>()
    };
    let all_in = eventually(Duration::from_secs(10), || async { records().await.len() == expected_calls }).await;
    let records = records().await;
    assert!(all_in, "{} of {expected_calls} records", records.len());

    // What the records add up to, by (tenant, upstream, tool).
    let mut sums: BTreeMap<Group, [i64; 6]> = BTreeMap::new();
    for r in &records {
        let s = sums
            .entry((r.tenant.as_deref().map(str::to_owned), r.upstream.as_deref().map(str::to_owned), r.target.clone()))
            .or_default();
        s[0] += 1;
        s[1] += i64::from(r.outcome != "ok");
        s[2] += r.request_bytes;
        s[3] += r.response_bytes;
        s[4] += r.latency_us;
        s[5] = s[5].max(r.latency_us);
    }
    let to = switchboard_core::time::now_ms() + 1;
    let query = UsageQuery {
        from_ms: started,
        to_ms: to,
        tenant: None,
        method: Some("tools/call".into()),
        group_by: vec![Dimension::Tenant, Dimension::Upstream, Dimension::Tool],
    };
    let rows = admin.usage(&query).await.unwrap();
    let reported: BTreeMap<_, _> = rows
        .iter()
        .map(|r| {
            let key = (r.group[0].clone(), r.group[1].clone(), r.group[2].clone());
            (key, [r.calls, r.errors, r.request_bytes, r.response_bytes, r.total_latency_us, r.max_latency_us])
        })
        .collect();
    assert_eq!(reported, sums, "usage differs from the audit records it comes from");
    // The known figures: t1 called alpha's echo three times, one call failed
    // as unknown, one with bad arguments...
    let calls = |tenant: &str, tool: &str| {
        rows.iter()
            .filter(|r| r.group[0].as_deref() == Some(tenant) && r.group[2].as_deref() == Some(tool))
            .map(|r| r.calls)
            .sum::<i64>()
    };
    assert_eq!(calls(&t1, "alpha__echo"), 3);
    assert_eq!(calls(&t2, "alpha__echo"), 2);
    assert_eq!(calls(&t1, "beta__add"), 2);
    // ...and t2 may not use beta: refused, and metered as such.
    let refused =
        rows.iter().find(|r| r.group[0].as_deref() == Some(t2.as_str()) && r.group[2].as_deref() == Some("beta__add"));
    assert_eq!(refused.map(|r| (r.calls, r.errors)), Some((1, 1)), "{rows:?}");

    // By key, through the admin API, as JSON and as CSV.
    let http = Http::new(TOKEN);
    let api = format!("http://{}/v1/usage", router.admin_addr.expect("the admin API"));
    let (status, body) =
        http.send("GET", &format!("{api}?from={started}&to={to}&tenant={t1}&group_by=key"), Value::Null).await;
    assert_eq!(status.as_u16(), 200, "{body}");
    let by_key: BTreeMap<String, i64> = body["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["group"][0].as_str().unwrap().to_owned(), r["calls"].as_i64().unwrap()))
        .collect();
    assert_eq!(by_key, BTreeMap::from([(k1[..11].to_owned(), 3), (k1b[..11].to_owned(), 3)]), "{body}");
    let csv = get_text_with(
        &format!("{api}?from={started}&to={to}&group_by=tenant,tool&format=csv"),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "tenant,tool,calls,errors,request_bytes,response_bytes,total_latency_us,max_latency_us");
    let total: i64 = lines[1..].iter().map(|l| l.split(',').nth(2).unwrap().parse::<i64>().unwrap()).sum();
    assert_eq!(total as usize, expected_calls, "{csv}");
    let (status, body) = http.send("GET", &format!("{api}?group_by=planet"), Value::Null).await;
    assert_eq!(status.as_u16(), 400, "{body}");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_equals_the_audit_records_it_comes_from_on_sqlite() {
    let dir = std::env::temp_dir().join(unique("sb-usage-"));
    std::fs::create_dir_all(&dir).unwrap();
    metered_run(&format!("sqlite:{}?mode=rwc", dir.join("router.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_equals_the_audit_records_it_comes_from_on_postgres() {
    let db = TempDatabase::create().await;
    metered_run(&db.url).await;
    db.drop_now().await;
}
