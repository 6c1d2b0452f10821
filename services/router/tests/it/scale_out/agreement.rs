//! Replicas agree on one upstream session per (client session, upstream),
//! whichever replica opens it and whenever: server requests and their
//! answers, and GET streams, follow the one the store records.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use switchboard_test_support::peers::Process;
use switchboard_test_support::services::{redis_url, unique, PrivateRedis};
use switchboard_test_support::{eventually, Client, MockOptions, MockServer, Router};

use super::{at, next_update, replica_config, router_process_logging, sampling_round_trip, text_of, touch};

/// The control channels of two replicas: one upstream session each.
const CONTROL_SESSIONS: usize = 2;

/// A mock whose `initialize` takes 300 ms, so that two replicas opening a
/// session's upstream session at once are both inside the handshake.
async fn slow_handshakes() -> MockServer {
    MockServer::start(MockOptions {
        name: "web".into(),
        initialize_delay: Duration::from_millis(300),
        ..MockOptions::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_opening_one_sessions_upstream_session_at_once_agree_on_one() {
    let web = slow_handshakes().await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m");
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let mut on_a = Client::new(&a.url);
    on_a.initialize_with(json!({"sampling": {}})).await;
    let on_b = at(&on_a, &b.url);
    assert!(eventually(Duration::from_secs(10), || async { web.mock.live_sessions() == CONTROL_SESSIONS }).await);
    let before = web.mock.initialize_count();

    // The session's first calls reach both replicas at once, as they do
    // behind a round-robin balancer: both open an upstream session.
    let (first, second) =
        tokio::join!(on_a.call_tool("web__echo", json!({"n": 1})), on_b.call_tool("web__echo", json!({"n": 2})));
    assert_eq!((text_of(&first), text_of(&second)), (r#"{"n":1}"#.to_owned(), r#"{"n":2}"#.to_owned()));
    assert_eq!(web.mock.initialize_count() - before, 2, "both replicas were inside the handshake at once");
    // One of them lost the race: its upstream session is ended, the winner's used.
    let lost = a.metric("switchboard_upstream_session_claims_lost_total", &[]).await
        + b.metric("switchboard_upstream_session_claims_lost_total", &[]).await;
    assert_eq!(lost, 1.0);
    assert!(
        eventually(Duration::from_secs(5), || async { web.mock.live_sessions() == CONTROL_SESSIONS + 1 }).await,
        "one upstream session for the client's session: {} live",
        web.mock.live_sessions()
    );

    // Server requests are answered through either replica: the answer goes
    // to the upstream session that asked.
    sampling_round_trip(&on_a, &on_b, "to b").await;
    sampling_round_trip(&on_b, &on_a, "to a").await;
    for (i, client) in [&on_a, &on_b, &on_a, &on_b].into_iter().enumerate() {
        assert_eq!(text_of(&client.call_tool("web__echo", json!({"i": i})).await), format!(r#"{{"i":{i}}}"#));
    }
    assert_eq!(web.mock.initialize_count() - before, 2, "no further handshake");
    assert_eq!(web.mock.live_sessions(), CONTROL_SESSIONS + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_stream_opened_before_the_upstream_session_hears_it_whichever_replica_opens_it() {
    let web = MockServer::start(switchboard_test_support::mock_named("web")).await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m");
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let mut on_a = Client::new(&a.url);
    on_a.initialize().await;
    let on_b = at(&on_a, &b.url);
    assert!(eventually(Duration::from_secs(10), || async { web.mock.listening_sessions() == CONTROL_SESSIONS }).await);

    // The GET stream opens at A while the session has no upstream session
    // yet; B opens one later (the subscription).
    let mut stream = on_a.open_stream().await;
    let uri = "web+mock://web/hello";
    assert_eq!(on_b.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    // A hears of it and listens on the upstream session's GET stream.
    assert!(
        eventually(Duration::from_secs(10), || async { web.mock.listening_sessions() == CONTROL_SESSIONS + 1 }).await,
        "the upstream session opened at B is listened to: {} listening",
        web.mock.listening_sessions()
    );
    touch(on_b.clone()).await;
    let (_, update) = next_update(&mut stream, Duration::from_secs(10)).await.expect("the update on A's GET stream");
    assert_eq!(update["params"]["uri"], uri, "{update}");
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_empty_no_live_session_is_answered_404_at_any_replica() {
    let mut redis = PrivateRedis::start();
    let web = MockServer::start(switchboard_test_support::mock_named("web")).await;
    let config = replica_config(&redis.url, "sb:", &web.url, "30m");
    let level = "warn,switchboard_core::redis=info,switchboard_session=debug";
    let ((a, a_url, _fa), (b, b_url, _fb)) =
        tokio::join!(router_process_logging(&config, level), router_process_logging(&config, level));
    // Sessions only A holds (made and used there), and one both hold.
    let mut only_a = Vec::new();
    for i in 0..10 {
        let mut client = Client::new(&a_url);
        client.initialize().await;
        assert_eq!(text_of(&client.call_tool("web__echo", json!({"i": i})).await), format!(r#"{{"i":{i}}}"#));
        only_a.push(client);
    }
    let mut both = Client::new(&b_url);
    both.initialize().await;
    at(&both, &a_url).call_tool("web__echo", json!({})).await;

    redis.stop();
    let said = |p: &Process, what: &str| p.output().iter().filter(|l| l.contains(what)).count();
    let unreachable = "Redis cannot be reached";
    assert!(
        eventually(Duration::from_secs(10), || async { said(&a, unreachable) == 1 && said(&b, unreachable) == 1 })
            .await,
        "each replica says once that Redis is gone: {:?} {:?}",
        a.output(),
        b.output()
    );
    redis.resume();
    // At once, every session at the replica that never held it: each is
    // written back by A (it notices the store's new generation, or is
    // asked to), none is 404.
    let asked = only_a.iter().map(|client| {
        let elsewhere = at(client, &b_url);
        async move { elsewhere.request("tools/call", json!({"name": "web__echo", "arguments": {"after": 1}})).await }
    });
    for reply in futures_util::future::join_all(asked).await {
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{} A: {:#?} B: {:#?}",
            String::from_utf8_lossy(&reply.body),
            a.output(),
            b.output()
        );
        assert_eq!(text_of(&reply.response()), r#"{"after":1}"#);
    }
    for url in [&a_url, &b_url] {
        assert_eq!(text_of(&at(&both, url).call_tool("web__echo", json!({"b": 1})).await), r#"{"b":1}"#);
    }
    let back = "Redis answers again";
    assert!(
        eventually(Duration::from_secs(10), || async { said(&a, back) == 1 && said(&b, back) == 1 }).await,
        "each replica says once that Redis is back: {:?} {:?}",
        a.output(),
        b.output()
    );
    assert_eq!((said(&a, unreachable), said(&b, unreachable)), (1, 1), "one warning each, however many calls failed");
}
