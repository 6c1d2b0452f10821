//! Namespacing, catalog lookups with 10, 1,000 and 10,000 tools, composite
//! cursors, and progressive discovery's search over 1,000 and 10,000 tools.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use serde_json::{json, Map, Value};
use switchboard_benches::{allocations_of, Counting};
use switchboard_catalog::cursor::Cursor;
use switchboard_catalog::naming::expose_name;
use switchboard_catalog::Listing;
use switchboard_protocol::methods::ListKind;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn tools(n: usize) -> Vec<Map<String, Value>> {
    (0..n)
        .map(|i| {
            let Value::Object(map) = json!({"name": format!("tool_number_{i}"), "description": "A tool.", "inputSchema": {"type": "object"}}) else {
                unreachable!()
            };
            map
        })
        .collect()
}

fn naming(c: &mut Criterion) {
    let mut group = c.benchmark_group("naming");
    group.bench_function("expose_name/short", |b| {
        b.iter(|| expose_name(black_box("github"), "__", black_box("search")))
    });
    let long = "a_tool_name_that_is_long_enough_to_need_shortening_beyond_sixty_four";
    group.bench_function("expose_name/shortened", |b| {
        b.iter(|| expose_name(black_box("github"), "__", black_box(long)))
    });
    group.finish();
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("catalog_lookup");
    for n in [10usize, 1_000, 10_000] {
        let mut listing = Listing::default();
        listing.extend(switchboard_core::UpstreamId::new(0), ListKind::Tools, &tools(n), |name| {
            expose_name("up", "__", name)
        });
        listing.seal();
        let wanted = format!("up__tool_number_{}", n / 2);
        let (_, allocs) = allocations_of(|| listing.get(&wanted).map(|i| i.upstream));
        println!("allocations: catalog_lookup/{n}: {allocs}");
        group.bench_with_input(BenchmarkId::from_parameter(n), &wanted, |b, wanted| {
            b.iter(|| black_box(listing.get(black_box(wanted)).expect("present").upstream))
        });
    }
    group.finish();
}

fn cursors(c: &mut Criterion) {
    let mut group = c.benchmark_group("cursor");
    let cursor = Cursor { upstream: "github".into(), offset: 1234 };
    let text = cursor.encode();
    group.bench_function("encode", |b| b.iter(|| black_box(&cursor).encode()));
    group.bench_function("decode", |b| b.iter(|| Cursor::decode(black_box(&text)).expect("valid")));
    group.finish();
}

/// `n` tools named and described from a small vocabulary, as a catalog of
/// many services looks: many tools share words, few fit a query well.
fn varied_tools(n: usize) -> Vec<(String, Value)> {
    const VERBS: [&str; 12] = [
        "create", "list", "get", "update", "delete", "search", "archive", "assign", "comment", "merge", "export",
        "sync",
    ];
    const THINGS: [&str; 16] = [
        "issue",
        "repository",
        "pull_request",
        "file",
        "calendar_event",
        "message",
        "channel",
        "invoice",
        "customer",
        "ticket",
        "document",
        "folder",
        "contact",
        "deployment",
        "alert",
        "dashboard",
    ];
    const SERVICES: [&str; 8] = ["github", "gitlab", "slack", "linear", "stripe", "drive", "jira", "pagerduty"];
    (0..n)
        .map(|i| {
            let (verb, thing, service) = (VERBS[i % 12], THINGS[(i / 12) % 16], SERVICES[(i / 192) % 8]);
            let name = format!("{service}{}__{verb}_{thing}", i / 1536);
            let tool = json!({
                "name": name,
                "description": format!("{verb} a {} in {service}: the {} the caller names, with its details.", thing.replace('_', " "), thing.replace('_', " ")),
                "inputSchema": {"type": "object", "properties": {
                    "id": {"type": "string", "description": format!("The {thing}'s id.")},
                    "title": {"type": "string"}, "body": {"type": "string"}
                }}
            });
            (name, tool)
        })
        .collect()
}

fn search(c: &mut Criterion) {
    use switchboard_catalog::search::{tool_words, Index};
    let mut group = c.benchmark_group("discovery_search");
    for n in [1_000usize, 10_000] {
        let tools = varied_tools(n);
        let started = std::time::Instant::now();
        let index = Index::build(tools.iter().map(|(name, tool)| tool_words(name, tool)));
        println!("discovery: index of {n} tools built in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        let query = "create an issue in a github repository";
        let best = index.search(query, 10, |_| true);
        println!("discovery: {n} tools, best for {query:?}: {}", tools[best[0].0].0);
        group.bench_with_input(BenchmarkId::new("all", n), &index, |b, index| {
            b.iter(|| black_box(index.search(black_box(query), 10, |_| true)))
        });
        // A tenant that may use every other tool.
        group.bench_with_input(BenchmarkId::new("filtered", n), &index, |b, index| {
            b.iter(|| black_box(index.search(black_box(query), 10, |d| d % 2 == 0)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = naming, lookup, cursors, search
}
criterion_main!(benches);
