//! A full `tools/call` through the router, in-process, to the mock upstream
//! over HTTP, next to the same call made directly; the router's heap
//! allocations per forwarded call; the heap an idle session holds;
//! `tools/list` across 50 upstreams from the cache; and calls with 10, 1,000
//! and 10,000 tools in the catalog.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use switchboard_benches::rig::Rig;
use switchboard_benches::{live_bytes, marked_allocations, Conn, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CALL: &[u8] =
    br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"u0__echo","arguments":{"text":"hello"}}}"#;
const DIRECT: &[u8] =
    br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}"#;

fn tools_call(c: &mut Criterion) {
    let rig = Rig::start(1, 0);
    let mut routed = rig.connect();
    let routed_request = rig.request(&routed, CALL);
    let mut direct = Conn::open(rig.mocks[0]);
    let direct_request = direct.request("/mcp", &[], DIRECT);

    let per_call = allocations_per_call(&mut routed, &routed_request);
    println!("allocations: router heap allocations per forwarded small tools/call: {per_call:.1}");
    audited_allocations();

    let mut group = c.benchmark_group("tools_call");
    group.bench_function("direct", |b| b.iter(|| assert_eq!(direct.send(&direct_request).status, 200)));
    group.bench_function("routed", |b| b.iter(|| assert_eq!(routed.send(&routed_request).status, 200)));
    group.finish();
}

/// The router's allocations per `request` sent on `conn`, after a warm-up
/// (connections, pools, catalog).
fn allocations_per_call(conn: &mut Conn, request: &[u8]) -> f64 {
    for _ in 0..1_000 {
        assert_eq!(conn.send(request).status, 200);
    }
    let calls = 10_000;
    let before = marked_allocations();
    for _ in 0..calls {
        black_box(conn.send(request));
    }
    (marked_allocations() - before) as f64 / calls as f64
}

/// The same count with every call audited (to an SQLite file): what an
/// audit record adds to the request path (its writer's thread is not
/// counted).
fn audited_allocations() {
    let dir = std::env::temp_dir().join(format!("switchboard-bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rig = Rig::start_with(
        1,
        0,
        &format!(
            "[database]\nurl = \"sqlite:{dir}/audit.db\"\n[audit]\nenabled = true\nspool = \"{dir}/audit.spool\"\n",
            dir = dir.display()
        ),
    );
    let mut conn = rig.connect();
    let request = rig.request(&conn, CALL);
    let per_call = allocations_per_call(&mut conn, &request);
    println!("allocations: the same, audited (SQLite): {per_call:.1}");
    drop(conn);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The heap an idle session holds in the router (the memory store): what
/// sessions opened by `initialize` and pinged once add to the heap, each.
/// Printed, not timed.
fn idle_sessions(_: &mut Criterion) {
    let rig = Rig::start(1, 0);
    let mut conn = rig.connect();
    let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#;
    let init = conn.request("/mcp", &[], init);
    let open = |n: usize, conn: &mut Conn| {
        for _ in 0..n {
            let answer = conn.send(&init);
            assert_eq!(answer.status, 200);
            let session = answer.header("mcp-session-id").expect("session id");
            let ping = conn.request(
                "/mcp",
                &[("Mcp-Session-Id", session), ("Mcp-Protocol-Version", "2025-11-25")],
                br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            );
            assert_eq!(conn.send(&ping).status, 200);
        }
    };
    // Past the first sessions' one-time costs (tables, pools), then 4,000.
    open(1_000, &mut conn);
    let before = live_bytes();
    let sessions = 4_000;
    open(sessions, &mut conn);
    let per_session = (live_bytes() - before) as f64 / sessions as f64;
    println!("memory: heap bytes an idle session holds (memory store): {per_session:.0}");
}

fn tools_list_50_upstreams(c: &mut Criterion) {
    let rig = Rig::start(50, 0);
    let mut conn = rig.connect();
    let request = rig.request(&conn, br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let first = conn.send(&request);
    assert_eq!(first.status, 200);
    let tools = serde_json::from_slice::<serde_json::Value>(&first.body).expect("json")["result"]["tools"]
        .as_array()
        .expect("tools")
        .len();
    println!("tools/list across 50 upstreams: {tools} tools, {} bytes", first.body.len());
    let mut group = c.benchmark_group("tools_list");
    group.bench_function("50_upstreams_cached", |b| b.iter(|| assert_eq!(conn.send(&request).status, 200)));
    group.finish();
}

fn call_with_catalog_size(c: &mut Criterion) {
    let mut group = c.benchmark_group("tools_call_catalog_size");
    for n in [10usize, 1_000, 10_000] {
        let rig = Rig::start(1, n);
        let mut conn = rig.connect();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"u0__tool_{}","arguments":{{}}}}}}"#,
            n - 1
        );
        let request = rig.request(&conn, body.as_bytes());
        assert_eq!(conn.send(&request).status, 200);
        group.bench_with_input(BenchmarkId::from_parameter(n), &request, |b, request| {
            b.iter(|| assert_eq!(conn.send(request).status, 200))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
    targets = tools_call, idle_sessions, tools_list_50_upstreams, call_with_catalog_size
}
criterion_main!(benches);
