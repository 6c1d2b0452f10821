//! The protocol crate alone: envelope parsing, routing-member parsing and the
//! splice that rewrites a tool name, for small, 10 KiB and 1 MiB payloads
//! (a request's envelope and target read as the router reads them, by the
//! one-pass scan, and by serde_json alone, which the scan stands in for);
//! an upstream's answer read by the one-pass scan and by the parser it
//! stands in for, at the same sizes; an HTTP/1.1 request head read by the
//! router's own parse and by httparse. Prints heap allocations per
//! operation next to criterion's times.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use switchboard_benches::{allocations_of, Counting};
use switchboard_protocol::http1;
use switchboard_protocol::jsonrpc::{span, Envelope, Target};
use switchboard_protocol::rewrite::{splice, Edit};
use switchboard_protocol::scan;
use switchboard_protocol::sse;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A `tools/call` whose arguments are about `size` bytes of varied JSON.
fn call_with_arguments(size: usize) -> Vec<u8> {
    let mut items = Vec::new();
    let mut total = 0;
    let mut i = 0;
    while total < size {
        let item = format!(r#"{{"id":{i},"name":"item \"{i}\"","tags":["a","b"],"score":{}.5,"ok":true}}"#, i * 7);
        total += item.len() + 1;
        items.push(item);
        i += 1;
    }
    format!(
        r#"{{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{{"name":"github__search","arguments":{{"items":[{}]}},"_meta":{{"progressToken":"p-1"}}}}}}"#,
        items.join(",")
    )
    .into_bytes()
}

fn rewrite(input: &[u8]) -> bytes::Bytes {
    let env = Envelope::parse(input).expect("valid");
    let target = env.target().expect("params").expect("target");
    let name = span(input, target.name.expect("name").get());
    splice(input, &mut [Edit::new(name, b"\"search\"")])
}

fn sizes() -> [(&'static str, Vec<u8>); 3] {
    [
        ("small", call_with_arguments(40)),
        ("10KiB", call_with_arguments(10 << 10)),
        ("1MiB", call_with_arguments(1 << 20)),
    ]
}

fn envelope(c: &mut Criterion) {
    let mut group = c.benchmark_group("envelope");
    for (label, input) in sizes() {
        let (_, parse_allocs) = allocations_of(|| Envelope::parse(&input).map(|e| e.kind));
        let (_, rewrite_allocs) = allocations_of(|| rewrite(&input));
        println!(
            "allocations: envelope/parse/{label}: {parse_allocs}, envelope/parse+rewrite/{label}: {rewrite_allocs}"
        );
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_with_input(BenchmarkId::new("parse", label), &input, |b, input| {
            b.iter(|| {
                let env = Envelope::parse(black_box(input)).expect("valid");
                black_box(env.target().expect("params").expect("target").name);
            })
        });
        group.bench_with_input(BenchmarkId::new("parse-by-serde", label), &input, |b, input| {
            b.iter(|| {
                let env = Envelope::parse_by_serde(black_box(input)).expect("valid");
                black_box(Target::parse(env.params.expect("params")).expect("target").name);
            })
        });
        group.bench_with_input(BenchmarkId::new("parse+rewrite", label), &input, |b, input| {
            b.iter(|| black_box(rewrite(black_box(input))))
        });
    }
    group.finish();
}

/// An answer whose result is about `size` bytes of varied JSON.
fn answer_of(size: usize) -> Vec<u8> {
    let call = call_with_arguments(size);
    let env = Envelope::parse(&call).expect("valid");
    let arguments = Target::parse(env.params.expect("params")).expect("target").arguments.expect("arguments");
    format!(r#"{{"jsonrpc":"2.0","id":42,"result":{{"structuredContent":{},"content":[]}}}}"#, arguments.get())
        .into_bytes()
}

/// The kind and id of an upstream's answer: the scan the router reads
/// answers with, and `Envelope::parse`, which it stands in for.
fn answer(c: &mut Criterion) {
    let mut group = c.benchmark_group("answer");
    for (label, size) in [("small", 40), ("10KiB", 10 << 10), ("1MiB", 1 << 20)] {
        let input = answer_of(size);
        let (_, scan_allocs) = allocations_of(|| scan::answer(&input));
        let (_, parse_allocs) = allocations_of(|| Envelope::parse(&input).map(|e| e.kind));
        println!("allocations: answer/scan/{label}: {scan_allocs}, answer/parse/{label}: {parse_allocs}");
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_with_input(BenchmarkId::new("scan", label), &input, |b, input| {
            b.iter(|| black_box(scan::answer(black_box(input)).expect("an answer")))
        });
        group.bench_with_input(BenchmarkId::new("parse", label), &input, |b, input| {
            b.iter(|| {
                let env = Envelope::parse(black_box(input)).expect("valid");
                black_box((env.kind, env.id))
            })
        });
    }
    group.finish();
}

/// A request head as the load test sends it (seven lines), and the same
/// with a kilobyte's bearer token (an OAuth access token), read by the
/// router's own HTTP/1.1 path: the narrow one-pass parse, then httparse for
/// what it leaves (`parse_request`), and httparse's walk alone.
fn head(c: &mut Criterion) {
    let common = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n\
        Accept: application/json, text/event-stream\r\nMcp-Session-Id: 3f2a9c1e-5b7d-4e8f-a1b2-c3d4e5f60718\r\n\
        Mcp-Protocol-Version: 2025-11-25\r\nContent-Length: 96\r\n";
    let token: String = (0..1024).map(|i| (b'A' + (i % 26) as u8) as char).collect();
    let mut group = c.benchmark_group("head");
    for (label, head) in
        [("common", format!("{common}\r\n")), ("bearer_1KiB", format!("{common}Authorization: Bearer {token}\r\n\r\n"))]
    {
        let head = head.into_bytes();
        let mut spans = Vec::with_capacity(http1::MAX_HEADERS);
        let (_, allocs) = allocations_of(|| http1::parse_request(&head, &mut spans).map(|h| h.map(|h| h.len)));
        println!("allocations: head/parse/{label}: {allocs}");
        group.throughput(Throughput::Bytes(head.len() as u64));
        group.bench_with_input(BenchmarkId::new("parse", label), &head, |b, head| {
            b.iter(|| black_box(http1::parse_request(black_box(head), &mut spans).expect("valid").expect("whole").len))
        });
        group.bench_with_input(BenchmarkId::new("httparse", label), &head, |b, head| {
            b.iter(|| {
                let mut lines = [httparse::EMPTY_HEADER; 16];
                let mut request = httparse::Request::new(&mut lines);
                black_box(request.parse(black_box(head)).expect("valid").is_complete())
            })
        });
    }
    group.finish();
}

fn sse_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse");
    for (label, input) in sizes() {
        let event = sse::encode_event(Some("7"), None, &input);
        group.throughput(Throughput::Bytes(event.len() as u64));
        group.bench_with_input(BenchmarkId::new("decode", label), &event, |b, event| {
            b.iter(|| {
                let mut decoder = sse::Decoder::new(usize::MAX);
                decoder.push(black_box(event));
                black_box(decoder.next_event().expect("valid").expect("one event"))
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = envelope, answer, head, sse_decode
}
criterion_main!(benches);
