//! Stateless (2026-07-28) calls across replicas: rounds continued at any
//! replica, answers routed to the replica awaiting them, and the
//! `requestState` key agreed again after Redis restarts empty.

use super::*;

/// A sampling round of a stateless (2026-07-28) client: begun at `caller`,
/// continued (the retry with the answer) at `answerer`.
async fn stateless_round(caller: &Stateless, answerer: &Stateless, prompt: &str) {
    let params = json!({"name": "web__sample", "arguments": {"prompt": prompt}});
    let first = caller.call("tools/call", params.clone()).await;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    let (key, request) = first["result"]["inputRequests"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    let mut retry = params;
    retry["requestState"] = first["result"]["requestState"].clone();
    retry["inputResponses"] = json!({key: {"role": "assistant", "content": {"type": "text", "text": format!("re {prompt}")},
        "model": "test", "stopReason": "endTurn"}});
    let done = answerer.call("tools/call", retry).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(text_of(&done), format!("sampled: re {prompt}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_rounds_continue_at_any_replica_on_the_tenants_one_upstream_session() {
    let web = MockServer::start(mock_named("web")).await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m");
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let on_a = Stateless::new(&a.url, json!({"sampling": {}}));
    let mut on_b = on_a.clone();
    on_b.client.url = b.url.clone();
    // Both catalogs built (each replica has its own catalog session).
    for client in [&on_a, &on_b] {
        let listed = client.call("tools/list", json!({})).await;
        assert_eq!(listed["result"]["resultType"], "complete");
    }
    let before = web.mock.initialize_count();

    // Calls alternate between the replicas; rounds begun at one continue at the other.
    for i in 0..4 {
        let client = if i % 2 == 0 { &on_a } else { &on_b };
        let added = client.call("tools/call", json!({"name": "web__add", "arguments": {"a": i, "b": 10}})).await;
        assert_eq!(text_of(&added), (i + 10).to_string());
    }
    stateless_round(&on_a, &on_b, "from a to b").await;
    stateless_round(&on_b, &on_a, "from b to a").await;
    assert_eq!(
        web.mock.initialize_count(),
        before + 1,
        "the tenant's calls share one upstream session across both replicas"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_clients_answer_for_a_2026_only_upstream_may_reach_another_replica() {
    let mut options = mock_named("web");
    options.modern = true;
    options.modern_only = true;
    let web = MockServer::start(options).await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m");
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let mut on_a = Client::new(&a.url);
    on_a.initialize_with(json!({"sampling": {}})).await;
    let on_b = at(&on_a, &b.url);

    // The upstream's input_required becomes a sampling request on the
    // call's stream at A; the client answers through B.
    let (status, _, mut stream) =
        on_a.request_stream("tools/call", json!({"name": "web__sample", "arguments": {"prompt": "relay"}})).await;
    assert_eq!(status, StatusCode::OK);
    let ask = stream.next(Duration::from_secs(10)).await.expect("the sampling request");
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    assert!(ask["id"].as_str().is_some_and(|id| id.starts_with("m.")), "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "re relay"}, "model": "test", "stopReason": "endTurn"}});
    assert_eq!(on_b.post(answer).await.status, StatusCode::ACCEPTED);
    let done = stream.next(Duration::from_secs(10)).await.expect("the result after the answer");
    assert_eq!(text_of(&done), "sampled: re relay", "{done}");
    // The retry went upstream under an id of its own; the answer comes back
    // under the client's.
    assert!(done["id"].is_u64(), "the client's own id: {done}");
    assert_eq!(web.mock.initialize_count(), 0, "a 2026-07-28-only upstream is never initialised");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_empty_the_replicas_agree_on_the_request_state_key_again() {
    let mut redis = PrivateRedis::start();
    let web = MockServer::start(mock_named("web")).await;
    // A short idle timeout: the sweeper (which checks the key) runs often.
    let config = replica_config(&redis.url, "sb:", &web.url, "2s");
    let a = Router::start(&config).await;
    let on_a = Stateless::new(&a.url, json!({"sampling": {}}));
    stateless_round(&on_a, &on_a, "before").await;

    // Redis comes back empty, and a replica that starts now finds no key.
    redis.stop();
    redis.resume();
    let b = Router::start(&config).await;
    let mut on_b = on_a.clone();
    on_b.client.url = b.url.clone();
    let mut agreed = false;
    for _ in 0..50 {
        let first = on_a.call("tools/call", json!({"name": "web__sample", "arguments": {"prompt": "after"}})).await;
        if first["result"]["resultType"] != "input_required" {
            // Polling: the replicas agree once a sweep has put the key
            // back, which announces nothing a test could await.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let (key, _) = first["result"]["inputRequests"].as_object().unwrap().iter().next().unwrap();
        let retry = json!({"name": "web__sample", "arguments": {"prompt": "after"},
            "requestState": first["result"]["requestState"],
            "inputResponses": {key: {"role": "assistant", "content": {"type": "text", "text": "agreed"}, "model": "m"}}});
        let done = on_b.call("tools/call", retry).await;
        if done["result"]["content"][0]["text"] == "sampled: agreed" {
            agreed = true;
            break;
        }
        assert_eq!(done["error"]["code"], -32602, "refused as not this router's state, or answered: {done}");
        // Polling, as above.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(agreed, "a round begun at the old replica continues at the new one once they agree on the key");
    a.stop().await;
    b.stop().await;
}
