//! A call whose router replica dies before the answer: the client resumes
//! the request's stream at another replica with `Last-Event-ID`, which
//! takes the stream over and continues the upstream's own stream from the
//! last event the dead replica relayed; or, when the upstream cannot resume,
//! ends it with a JSON-RPC error saying why. Never a stream that just stops.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_test_support::services::{redis_url, unique};
use switchboard_test_support::{stdio_mock_upstream, Client, MockOptions, MockServer, Router};

use super::{at, replica_config, router_process};

/// A progress call (to `tool`: `web__progress` over HTTP, `local__progress`
/// over stdio) at a router process that is killed after two progress
/// notifications; the client resumes at `survivor`. Returns what the
/// resumed stream carried, and the progress values seen before.
async fn kill_mid_call(resumable: bool, tool: &str) -> (Vec<Value>, Vec<u64>, Router) {
    let web =
        MockServer::start(MockOptions { name: "web".into(), resumable_streams: resumable, ..MockOptions::default() })
            .await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m") + &stdio_mock_upstream("local", "");
    let (mut doomed, doomed_url, _file) = router_process(&config).await;
    let survivor = Router::start(&config).await;
    let mut client = Client::new(&doomed_url);
    client.initialize().await;
    let (status, _, mut stream) = client
        .request_stream(
            "tools/call",
            json!({"name": tool, "arguments": {"steps": 6, "interval_ms": 400},
                "_meta": {"progressToken": "t"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (mut last_id, mut seen) = (None, Vec::new());
    while seen.len() < 2 {
        let event = stream.next_event(Duration::from_secs(10)).await.expect("progress before the kill");
        last_id = event.id.clone().or(last_id);
        if !event.data.is_empty() {
            let message: Value = serde_json::from_slice(&event.data).unwrap();
            seen.push(message["params"]["progress"].as_u64().expect("a progress notification"));
        }
    }
    doomed.child.start_kill().expect("kill -9");
    let _ = doomed.child.wait().await;

    let (status, mut resumed) = at(&client, &survivor.url).resume_stream(last_id.as_deref()).await;
    assert_eq!(status, StatusCode::OK);
    let rest = resumed.until_end(Duration::from_secs(60)).await.expect("the resumed stream ends");
    drop(web);
    (rest, seen, survivor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_replica_is_killed_is_answered_through_another_from_an_upstream_that_resumes() {
    let (rest, seen, survivor) = kill_mid_call(true, "web__progress").await;
    let answer = rest.last().expect("the answer");
    assert_eq!(answer["result"]["content"][0]["text"], "done after 6 steps", "{rest:?}");
    let later: Vec<u64> = rest.iter().filter_map(|m| m["params"]["progress"].as_u64()).collect();
    assert!(
        later.iter().all(|p| *p >= seen[1]) && later.last() == Some(&6),
        "the upstream's stream continued where it was left: {seen:?} then {later:?}"
    );
    assert_eq!(survivor.metric("switchboard_streams_taken_over_total", &["result=\"resumed\""]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_replica_is_killed_ends_with_a_clear_error_when_the_upstream_cannot_resume() {
    let (rest, _, survivor) = kill_mid_call(false, "web__progress").await;
    let answer = rest.last().expect("an answer");
    let message = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("an error: {rest:?}"));
    assert!(message.contains("replica relaying this call stopped") && message.contains("no event ids"), "{message}");
    assert!(answer["id"].is_u64(), "the error answers the request: {answer}");
    assert_eq!(survivor.metric("switchboard_streams_taken_over_total", &["result=\"failed\""]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_stdio_upstream_whose_replica_is_killed_ends_with_a_clear_error() {
    // The process was the dead replica's own: nobody can continue the call,
    // but its client is answered, not left with a stream that just stops.
    let (rest, _, survivor) = kill_mid_call(false, "local__progress").await;
    let answer = rest.last().expect("an answer");
    let message = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("an error: {rest:?}"));
    assert!(message.contains("replica relaying this call stopped") && message.contains("cannot continue"), "{message}");
    assert!(answer["id"].is_u64(), "the error answers the request: {answer}");
    assert_eq!(survivor.metric("switchboard_streams_taken_over_total", &["result=\"failed\""]).await, 1.0);
}
