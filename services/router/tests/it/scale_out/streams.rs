//! Streams across replicas: a GET stream or a request stream resumed at
//! another replica with `Last-Event-ID`, and cancellations that reach the
//! replica serving the request.

use std::time::Duration;

use serde_json::{json, Value};

use super::*;

/// The next `notifications/resources/updated` on `stream` with its event id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_stream_resumes_at_the_other_replica_with_last_event_id() {
    let (_web, a, b, on_a, on_b) = two_replicas("30m").await;
    let uri = "web+mock://web/hello";
    assert_eq!(on_a.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));

    // The GET stream at A hears an update made through B (the upstream's
    // own GET stream opens in the background: touch until one arrives).
    let mut stream = on_a.open_stream().await;
    let mut first = None;
    for _ in 0..50 {
        touch(on_b.clone()).await;
        if let Some(update) = next_update(&mut stream, Duration::from_millis(200)).await {
            first = Some(update);
            break;
        }
    }
    let (mut last_id, update) = first.expect("an update on the GET stream at A");
    assert_eq!(update["params"]["uri"], uri);
    while let Some((id, _)) = next_update(&mut stream, Duration::from_millis(300)).await {
        last_id = id;
    }
    assert_eq!(seq_of(&last_id).0, 0, "the GET stream is stream 0");

    // The client loses its connection; two updates happen meanwhile, through A and B.
    drop(stream);
    touch(on_a.clone()).await;
    touch(on_b.clone()).await;

    // It reconnects to B with the last id it saw: B replays what it missed.
    let (status, mut resumed) = on_b.resume_stream(Some(&last_id)).await;
    assert_eq!(status, StatusCode::OK);
    let mut missed = Vec::new();
    for _ in 0..2 {
        let (id, update) = next_update(&mut resumed, Duration::from_secs(5)).await.expect("a missed update");
        assert_eq!(update["params"]["uri"], uri);
        missed.push(seq_of(&id));
    }
    assert_eq!(missed, [(0, seq_of(&last_id).1 + 1), (0, seq_of(&last_id).1 + 2)], "exactly what followed");

    // Live updates reach the client at B, whichever replica hears them; the
    // next event is the live one (numbered right after the replay): nothing
    // was sent twice.
    touch(on_a.clone()).await;
    let (live_id, _) = next_update(&mut resumed, Duration::from_secs(5)).await.expect("a live update at B");
    assert_eq!(seq_of(&live_id), (0, seq_of(&last_id).1 + 3));

    // A GET at A takes the stream over: the response at B ends, and the new
    // one (no Last-Event-ID) goes on after what B delivered.
    let mut again = on_a.open_stream().await;
    assert_ends(&mut resumed, "the response at B, taken over").await;
    touch(on_b.clone()).await;
    let (next_id, _) = next_update(&mut again, Duration::from_secs(5)).await.expect("an update at A again");
    assert_eq!(seq_of(&next_id), (0, seq_of(&live_id).1 + 1), "after what was delivered, nothing replayed");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_stream_left_at_one_replica_resumes_at_the_other() {
    let (_web, a, b, on_a, on_b) = two_replicas("30m").await;

    let mut stream = progress_call(&on_a, 5, 200, "p").await;
    let primed = stream.next_event(Duration::from_secs(5)).await.expect("the priming event");
    assert!(primed.data.is_empty());
    let first = stream.next_event(Duration::from_secs(5)).await.expect("the first progress event");
    let first_message: Value = serde_json::from_slice(&first.data).unwrap();
    assert_eq!(first_message["params"]["progress"], 1);
    let first_id = first.id.expect("an event id");
    assert_ne!(seq_of(&first_id).0, 0, "a request stream");
    drop(stream);

    // The client comes back at B, which never served this request.
    let (status, mut resumed) = on_b.resume_stream(Some(&first_id)).await;
    assert_eq!(status, StatusCode::OK);
    let mut progress = Vec::new();
    let result = loop {
        let message = resumed.next(Duration::from_secs(10)).await.expect("the rest of the stream");
        if message["method"] == "notifications/progress" {
            progress.push(message["params"]["progress"].as_u64().unwrap());
        } else {
            break message;
        }
    };
    assert_eq!(progress, [2, 3, 4, 5], "every later event, once, in order");
    assert_eq!(text_of(&result), "done after 5 steps");
    assert_ends(&mut resumed, "the stream, after the answer").await;

    // A stream nobody spilled is unknown, at either replica.
    let (status, _) = on_b.resume_stream(Some("999-0")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_sent_to_another_replica_reaches_the_request() {
    let (web, a, b, on_a, on_b) = two_replicas("30m").await;
    let call = json!({"jsonrpc": "2.0", "id": "cancel-me", "method": "tools/call",
        "params": {"name": "web__progress", "arguments": {"steps": 10, "interval_ms": 100}, "_meta": {"progressToken": "c"}}});
    let (status, _, mut stream) = on_a.post_stream(bytes::Bytes::from(call.to_string()), &[]).await;
    assert_eq!(status, StatusCode::OK);
    // The first progress notification: the upstream has the request.
    let first = stream.next(Duration::from_secs(10)).await.expect("progress");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "cancel-me", "reason": "changed my mind"}});
    assert_eq!(on_b.post(note).await.status, StatusCode::ACCEPTED);
    assert!(
        eventually(Duration::from_secs(5), || async { web.mock.cancelled().contains(&"\"cancel-me\"".to_owned()) })
            .await,
        "the upstream heard the cancellation sent through B: {:?}",
        web.mock.cancelled()
    );
    // The mock ignores cancellations: the call's stream at A still ends.
    let rest = stream.until_end(Duration::from_secs(20)).await.expect("the cancelled call's stream ends");
    assert!(rest.iter().all(|m| m["method"] == "notifications/progress" || m["id"] == "cancel-me"), "{rest:?}");
    a.stop().await;
    b.stop().await;
}

/// The value of a counter (summed over its labels) in `registry`.
fn counter(registry: &prometheus::Registry, name: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric().iter().map(|m| m.get_counter().get_value()).collect::<Vec<_>>())
        .sum()
}

/// While Redis is down, a replica keeps at most 65,536 stream writes
/// waiting (beyond the one it is retrying); the rest are dropped and
/// counted, and what waited is written once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_writes_waiting_for_redis_are_bounded_and_the_excess_counted() {
    use switchboard_session::shared_streams::{SharedStreams, QUEUE};
    let mut redis = PrivateRedis::start();
    redis.stop();
    let registry = prometheus::Registry::new();
    let metrics = Arc::new(switchboard_session::Metrics::new(&registry));
    let link = RedisLink::new(&redis.url, &unique("sbtest:"), Duration::from_millis(200)).unwrap();
    let streams = SharedStreams::start(link, Duration::from_secs(60), metrics);
    let session: Arc<str> = "0123456789abcdef0123456789abcdef".into();
    let event = |i: usize| bytes::Bytes::from(format!(r#"{{"jsonrpc":"2.0","method":"n","params":{{"i":{i}}}}}"#));

    // One write taken by the writer, which retries it while Redis is down.
    // (Events of a request stream: a GET stream's would also be refused
    // beyond 512 its client has not read.)
    streams.spill(&session, 7, 0, event(0), None);
    assert!(
        eventually(Duration::from_secs(10), || async {
            counter(&registry, "switchboard_session_store_errors_total") >= 1.0
        })
        .await
    );
    // Then the queue: QUEUE more wait, five more are dropped.
    for i in 1..=QUEUE + 5 {
        streams.spill(&session, 7, i as u64, event(i), None);
    }
    assert_eq!(counter(&registry, "switchboard_stream_events_dropped_total"), 5.0);

    redis.resume();
    assert!(streams.flush(Duration::from_secs(60)).await, "what waited is written once Redis is back");
    assert_eq!(counter(&registry, "switchboard_stream_events_dropped_total"), 5.0);
}

/// A reader resuming a request stream after an event the copy in Redis does
/// not have yet (it lags behind what the client got) waits for what comes
/// next, rather than replaying the stream from the start as it does for a
/// GET stream whose numbering Redis lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_ahead_of_a_request_streams_copy_waits_for_what_follows() {
    use switchboard_session::shared_streams::SharedStreams;
    let link =
        switchboard_core::redis::RedisLink::new(&redis_url(), &unique("sbtest:"), Duration::from_secs(2)).unwrap();
    let metrics = std::sync::Arc::new(switchboard_session::Metrics::new(&Default::default()));
    let shared = SharedStreams::start(link, Duration::from_secs(60), metrics);
    let session: std::sync::Arc<str> = std::sync::Arc::from("a-session");
    let event = |seq: u64| {
        switchboard_protocol::sse::encode_with_id(
            switchboard_protocol::sse::EventId { stream: 7, seq },
            None,
            format!("{{\"n\":{seq}}}").as_bytes(),
        )
    };
    for seq in 0..3 {
        shared.spill(&session, 7, seq, event(seq), None);
    }
    assert!(shared.flush(Duration::from_secs(5)).await);
    // The client got events 0..=4; the copy has 0..=2.
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    assert!(shared.reader(&session, 7, Some(4), tx, ()).await.unwrap());
    let early = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
    assert!(early.is_err(), "nothing the client already had: {early:?}");
    shared.spill(&session, 7, 5, event(5), None);
    let next = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
    assert!(std::str::from_utf8(&next).unwrap().contains("\"n\":5"), "what follows: {next:?}");
}
