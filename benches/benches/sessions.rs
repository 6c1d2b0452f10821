//! What the Redis session store adds to a request, next to the in-memory
//! store, measured in one run: latency percentiles (p50, p99) of
//!
//! - the store's own operations (`touch`, which a replica sends at most once
//!   per `sessions.cache` per session; `load`, once per session on a replica
//!   that has not served it yet), on the machine's Redis;
//! - a full `tools/call` through the router to the mock upstream, with the
//!   memory store, with Redis at the default `cache = "2s"`, and with Redis
//!   checked on every request (`cache = "0s"`, the worst case);
//! - a `tools/call` answered as SSE (three progress events, then the result),
//!   with the memory store and with Redis, where every event of the stream
//!   is also copied to Redis for resumption at another replica (behind the
//!   request, by a write queue: the figure shows what that costs the call).
//!
//! Redis is `SWITCHBOARD_BENCH_REDIS` (default `redis://127.0.0.1:6379`);
//! without it only the memory store is measured. `cargo bench --bench
//! sessions -- --test` runs a few iterations only (the CI smoke run).
//! Not criterion: criterion reports means and medians, and the figure asked
//! for is the tail.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchboard_benches::rig::Rig;
use switchboard_core::redis::RedisLink;
use switchboard_session::store::{MemoryStore, Record, RedisStore, SessionStore, Stored};
use switchboard_upstream::UpstreamSession;

const CALL: &[u8] =
    br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"u0__echo","arguments":{"text":"hello"}}}"#;
const STREAMED: &[u8] = br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"u0__progress","arguments":{"steps":3,"interval_ms":0},"_meta":{"progressToken":1}}}"#;

/// p50 and p99 of `samples`, in microseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}

fn row(label: &str, samples: &mut [Duration]) -> (f64, f64) {
    let (p50, p99) = percentiles(samples);
    println!("{label:<44} {p50:>9.1} {p99:>9.1}");
    (p50, p99)
}

fn stored() -> Stored {
    let mut upstreams = BTreeMap::new();
    upstreams.insert(
        "everything".to_owned(),
        UpstreamSession {
            replica: "http://10.0.0.7:3001/mcp".into(),
            session: "6f1c2a0e-8d7b-4b8e-9a51-3c2f0d9e7a11".into(),
            version: "2025-11-25".into(),
        },
    );
    Stored {
        record: Record {
            key: String::new(),
            user: None,
            tenant: "acme".into(),
            version: "2025-11-25".into(),
            capabilities: r#"{"sampling":{},"elicitation":{"form":{}},"roots":{"listChanged":true}}"#.into(),
            opened_ms: 1_795_000_000_000,
        },
        upstreams,
    }
}

/// Times `n` of each store operation on `sessions` sessions.
fn store_ops(rt: &tokio::runtime::Runtime, name: &str, store: Arc<dyn SessionStore>, n: usize) {
    let sessions = 1_000.min(n);
    rt.block_on(async {
        let ids: Vec<String> = (0..sessions).map(|i| format!("bench-{name}-{i}")).collect();
        for id in &ids {
            store.create(id, &stored()).await.expect("create");
        }
        let mut touch = Vec::with_capacity(n);
        let mut load = Vec::with_capacity(n);
        for i in 0..n {
            let id = &ids[i % sessions];
            let started = Instant::now();
            store.touch(id).await.expect("touch");
            touch.push(started.elapsed());
            let started = Instant::now();
            store.load(id).await.expect("load").live().expect("live");
            load.push(started.elapsed());
        }
        row(&format!("{name}: touch"), &mut touch);
        row(&format!("{name}: load"), &mut load);
        for id in &ids {
            store.remove(id).await.expect("remove");
        }
    });
}

/// Times `n` sequential `tools/call`s over one keep-alive connection.
fn routed_calls(extra: &str, n: usize) -> Vec<Duration> {
    timed_calls(extra, CALL, n)
}

/// Times `n` sequential requests `body` over one keep-alive connection.
fn timed_calls(extra: &str, body: &[u8], n: usize) -> Vec<Duration> {
    let rig = Rig::start_with(1, 0, extra);
    let mut conn = rig.connect();
    let request = rig.request(&conn, body);
    for _ in 0..n.min(1_000) {
        assert_eq!(conn.send(&request).status, 200);
    }
    (0..n)
        .map(|_| {
            let started = Instant::now();
            let answer = conn.send(&request);
            let elapsed = started.elapsed();
            assert_eq!(answer.status, 200);
            elapsed
        })
        .collect()
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let (ops, calls) = if smoke { (50, 50) } else { (20_000, 20_000) };
    let redis_url = std::env::var("SWITCHBOARD_BENCH_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let prefix = format!("sbbench{}:", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis_up = rt.block_on(async {
        let link = RedisLink::new(&redis_url, &prefix, Duration::from_secs(1)).ok()?;
        RedisStore::new(link, Duration::from_secs(60)).touch("probe").await.ok()
    });

    println!("session store, per operation (µs)                 p50       p99");
    store_ops(&rt, "memory", Arc::new(MemoryStore::new(Duration::from_secs(1800))), ops);
    if redis_up.is_some() {
        let link = RedisLink::new(&redis_url, &prefix, Duration::from_secs(1)).expect("redis url");
        store_ops(&rt, "redis", Arc::new(RedisStore::new(link, Duration::from_secs(1800))), ops);
    } else {
        println!("(no Redis at {redis_url}: Redis not measured)");
    }

    println!();
    println!("routed tools/call, one connection (µs)            p50       p99");
    let (memory_p50, memory_p99) = row("memory store", &mut routed_calls("", calls));
    if redis_up.is_none() {
        return;
    }
    let redis = |cache: &str| {
        format!(
            "[sessions]\nstore = \"redis\"\ncache = \"{cache}\"\n[redis]\nurl = \"{redis_url}\"\nkey_prefix = \"{prefix}\"\ntimeout = \"1s\"\n"
        )
    };
    let (cached_p50, cached_p99) = row("redis store, cache 2s (default)", &mut routed_calls(&redis("2s"), calls));
    let (every_p50, every_p99) = row("redis store, checked every request", &mut routed_calls(&redis("0s"), calls));
    println!();
    println!(
        "added by the Redis store per request: p50 {:+.1} µs, p99 {:+.1} µs (default cache); p50 {:+.1} µs, p99 {:+.1} µs (checked every request)",
        cached_p50 - memory_p50,
        cached_p99 - memory_p99,
        every_p50 - memory_p50,
        every_p99 - memory_p99
    );

    println!();
    println!("tools/call answered as SSE, 5 events (µs)         p50       p99");
    let streamed = calls / 4;
    let (memory_p50, memory_p99) = row("memory store", &mut timed_calls("", STREAMED, streamed));
    let (shared_p50, shared_p99) =
        row("redis store (stream copied to Redis)", &mut timed_calls(&redis("2s"), STREAMED, streamed));
    println!();
    println!(
        "added by copying the stream to Redis: p50 {:+.1} µs, p99 {:+.1} µs",
        shared_p50 - memory_p50,
        shared_p99 - memory_p99
    );
}
