//! Several router replicas sharing sessions through Redis: any replica
//! serves any request of a session, a replica can die, Redis can restart.
//! Everything here is real: Redis over TCP (the machine's, or one of the
//! test's own to restart), router processes, an HTTP upstream that counts
//! its sessions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use switchboard_core::redis::RedisLink;
use switchboard_session::store::{Claim, Loaded, MemoryStore, Record, RedisStore, Repair, SessionStore, Stored, Touch};
use switchboard_test_support::peers::Process;
use switchboard_test_support::services::{redis_url, unique, PrivateRedis};
use switchboard_test_support::{
    eventually, get_text, http_upstream, mock_named, router_binary, Client, MockServer, Router, Stateless,
};
use switchboard_upstream::UpstreamSession;

mod agreement;
mod stateless;
mod streams;
mod takeover;

fn sample(tenant: &str) -> Stored {
    Stored {
        record: Record {
            key: String::new(),
            user: None,
            tenant: tenant.into(),
            version: "2025-11-25".into(),
            capabilities: r#"{"sampling":{}}"#.into(),
            opened_ms: 0,
        },
        upstreams: BTreeMap::new(),
    }
}

fn upstream_session(id: &str) -> UpstreamSession {
    UpstreamSession { replica: "http://127.0.0.1:1/mcp".into(), session: id.into(), version: "2025-11-25".into() }
}

/// What every store must do, checked on one with `idle` expiry.
async fn store_contract(store: Arc<dyn SessionStore>, idle: Duration) {
    store.create("a", &sample("t1")).await.unwrap();
    let loaded = store.load("a").await.unwrap().live().expect("a live session loads");
    assert_eq!(loaded, sample("t1"));
    assert_eq!(store.touch("a").await.unwrap(), Touch::Alive);
    assert_eq!(store.touch("never").await.unwrap(), Touch::Unknown);
    assert_eq!(store.load("never").await.unwrap(), Loaded::Unknown);

    // One upstream session per (session, upstream): the first claim wins,
    // a second one loses to it (and learns which it is), claiming what is
    // recorded wins again, and replacing needs the recorded one as `stale`.
    let (s1, s2, s3) = (upstream_session("s1"), upstream_session("s2"), upstream_session("s3"));
    assert_eq!(store.claim_upstream("a", "web", None, &s1).await.unwrap(), Claim::Won);
    assert_eq!(store.claim_upstream("a", "web", None, &s2).await.unwrap(), Claim::Lost(s1.clone()));
    assert_eq!(store.claim_upstream("a", "web", None, &s1).await.unwrap(), Claim::Won);
    assert_eq!(store.claim_upstream("a", "web", Some(&s3), &s2).await.unwrap(), Claim::Lost(s1.clone()));
    assert_eq!(store.claim_upstream("a", "web", Some(&s1), &s2).await.unwrap(), Claim::Won, "re-initialised");
    assert_eq!(store.upstream("a", "web").await.unwrap(), Some(s2.clone()));
    assert_eq!(store.upstream("a", "files").await.unwrap(), None);
    assert_eq!(store.claim_upstream("a", "files", None, &upstream_session("f1")).await.unwrap(), Claim::Won);
    assert_eq!(store.claim_upstream("never", "web", None, &s1).await.unwrap(), Claim::Gone);
    assert_eq!(store.load("never").await.unwrap(), Loaded::Unknown, "a claim does not create a session");
    let loaded = store.load("a").await.unwrap().live().unwrap();
    assert_eq!(loaded.upstreams.len(), 2);
    assert_eq!(loaded.upstreams["web"].session, "s2");
    // Two replicas claiming at once: exactly one wins, the other learns the winner.
    store.create("race", &sample("t1")).await.unwrap();
    let (x, y) = (upstream_session("x"), upstream_session("y"));
    let (first, second) =
        tokio::join!(store.claim_upstream("race", "web", None, &x), store.claim_upstream("race", "web", None, &y));
    let outcomes = [first.unwrap(), second.unwrap()];
    let winner = store.upstream("race", "web").await.unwrap().unwrap();
    assert_eq!(outcomes.iter().filter(|o| **o == Claim::Won).count(), 1, "{outcomes:?}");
    assert!(outcomes.contains(&Claim::Lost(winner.clone())), "{outcomes:?}");
    store.remove("race").await.unwrap();

    // The generation stays while the store keeps its data.
    let generation = store.generation().await.unwrap();
    assert_eq!(store.generation().await.unwrap().token, generation.token);

    // Removal hands back what it held, once; the session is then known to have ended.
    let removed = store.remove("a").await.unwrap().expect("removed");
    assert_eq!(removed.upstreams["files"].session, "f1");
    assert_eq!(store.remove("a").await.unwrap(), None);
    assert_eq!(store.touch("a").await.unwrap(), Touch::Ended);
    assert_eq!(store.load("a").await.unwrap(), Loaded::Ended);
    assert_eq!(store.repair("a", &sample("t1")).await.unwrap(), Repair::Ended, "an ended session is not written back");

    // Expiry slides with use, and each expired session goes to one sweeper.
    store.create("c", &sample("t2")).await.unwrap();
    store.claim_upstream("c", "web", None, &upstream_session("c1")).await.unwrap();
    // The store's clock is moved, not waited for: no margin for a slow machine to eat.
    store.skip_ahead(idle * 6 / 10);
    assert_eq!(store.touch("c").await.unwrap(), Touch::Alive);
    store.skip_ahead(idle * 6 / 10);
    assert!(store.take_expired(100).await.unwrap().is_empty(), "touched {:?} ago: still live", idle * 6 / 10);
    store.skip_ahead(idle * 6 / 10);
    let (first, second) = tokio::join!(store.take_expired(100), store.take_expired(100));
    let mut taken: Vec<(String, Stored)> = first.unwrap();
    taken.extend(second.unwrap());
    assert_eq!(taken.len(), 1, "exactly one sweeper gets it: {taken:?}");
    assert_eq!(taken[0].0, "c");
    assert_eq!(taken[0].1.upstreams["web"].session, "c1", "the sweeper learns which upstream sessions to end");
    assert_eq!(store.touch("c").await.unwrap(), Touch::Ended);

    // A session the store lost (no trace of it) is written back by a replica that has it.
    assert_eq!(store.repair("d", &sample("t3")).await.unwrap(), Repair::Written);
    assert_eq!(store.load("d").await.unwrap().live().unwrap().record.tenant, "t3");
    assert_eq!(
        store.repair("d", &sample("other")).await.unwrap(),
        Repair::Live,
        "a live session (another replica wrote it back first) is not overwritten"
    );
    assert_eq!(store.load("d").await.unwrap().live().unwrap().record.tenant, "t3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_stores_keep_the_same_contract() {
    // Long enough that nothing expires by the real clock during the test
    // (Redis's tombstones keep real time); expiry is reached with skip_ahead.
    let idle = Duration::from_secs(60);
    store_contract(Arc::new(MemoryStore::new(idle)), idle).await;
    let link = RedisLink::new(&redis_url(), &unique("sbtest:"), Duration::from_secs(2)).unwrap();
    store_contract(Arc::new(RedisStore::new(link, idle)), idle).await;
}

fn replica_config(redis: &str, prefix: &str, upstream_url: &str, idle: &str) -> String {
    format!(
        "[server]\nkeep_alive = \"1s\"\nsession_idle_timeout = \"{idle}\"\n\
         [sessions]\nstore = \"redis\"\ncache = \"100ms\"\n\
         [redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\ntimeout = \"500ms\"\n{}",
        http_upstream("web", upstream_url, "")
    )
}

fn text_of(response: &Value) -> String {
    response["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {response}")).to_owned()
}

/// The same client (same session id) pointed at another replica.
fn at(client: &Client, url: &str) -> Client {
    let mut other = client.clone();
    other.url = url.to_owned();
    other
}

/// An upstream, two replicas sharing Redis with sessions idle for `idle`,
/// and one session seen from each.
async fn two_replicas(idle: &str) -> (MockServer, Router, Router, Client, Client) {
    let web = MockServer::start(mock_named("web")).await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, idle);
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let mut on_a = Client::new(&a.url);
    on_a.initialize().await;
    let on_b = at(&on_a, &b.url);
    (web, a, b, on_a, on_b)
}

/// Has the mock announce an update of its `hello` resource, through `client`.
async fn touch(client: Client) {
    let told = client.call_tool("web__touch", json!({"uri": "mock://web/hello"})).await;
    assert_eq!(text_of(&told), "told 1 subscribers", "{told}");
}

/// Starts a `web__progress` call of `steps` steps `interval_ms` apart,
/// answered as SSE; returns its open stream.
async fn progress_call(
    client: &Client,
    steps: u64,
    interval_ms: u64,
    token: &str,
) -> switchboard_test_support::EventStream {
    let (status, _, stream) = client
        .request_stream(
            "tools/call",
            json!({"name": "web__progress", "arguments": {"steps": steps, "interval_ms": interval_ms},
                "_meta": {"progressToken": token}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    stream
}

/// Asserts that `stream` ends (within 10 s, with no further event), not
/// merely that it falls silent.
async fn assert_ends(stream: &mut switchboard_test_support::EventStream, what: &str) {
    let started = std::time::Instant::now();
    let next = stream.next_event(Duration::from_secs(30)).await;
    assert!(next.is_none(), "{what}: no further event: {next:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{what}: ended, rather than fell silent");
}

/// A sampling round trip: the call goes to `caller`, the answer to `answerer`.
async fn sampling_round_trip(caller: &Client, answerer: &Client, prompt: &str) {
    let (status, _, mut stream) =
        caller.request_stream("tools/call", json!({"name": "web__sample", "arguments": {"prompt": prompt}})).await;
    assert_eq!(status, StatusCode::OK);
    let ask = stream.next(Duration::from_secs(10)).await.expect("the sampling request");
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": format!("re {prompt}")}, "model": "test", "stopReason": "endTurn"}});
    assert_eq!(answerer.post(answer).await.status, StatusCode::ACCEPTED);
    let done = stream.next(Duration::from_secs(10)).await.expect("the tool result after the answer");
    assert_eq!(text_of(&done), format!("sampled: re {prompt}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_one_session_alternately_on_one_upstream_session() {
    let web = MockServer::start(mock_named("web")).await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m");
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let mut on_a = Client::new(&a.url);
    on_a.initialize_with(json!({"sampling": {}})).await;
    let on_b = at(&on_a, &b.url);

    let first = on_a.call_tool("web__echo", json!({"n": 0})).await;
    assert_eq!(text_of(&first), r#"{"n":0}"#);
    let upstream_inits = web.mock.initialize_count();

    for (i, client) in [&on_b, &on_a, &on_b, &on_a, &on_b].into_iter().enumerate() {
        assert!(client.tool_names().await.contains(&"web__echo".to_owned()));
        let echoed = client.call_tool("web__echo", json!({"n": i + 1})).await;
        assert_eq!(text_of(&echoed), format!("{{\"n\":{}}}", i + 1), "request {i}");
    }

    // Progress on the replica that did not create the session.
    let (_, _, mut stream) = on_b
        .request_stream(
            "tools/call",
            json!({"name": "web__progress", "arguments": {"steps": 3, "interval_ms": 20}, "_meta": {"progressToken": "p1"}}),
        )
        .await;
    let mut progress = Vec::new();
    let done = loop {
        let message = stream.next(Duration::from_secs(10)).await.expect("progress, then the result");
        if message["method"] == "notifications/progress" {
            assert_eq!(message["params"]["progressToken"], "p1");
            progress.push(message["params"]["progress"].clone());
        } else {
            break message;
        }
    };
    assert_eq!(progress.len(), 3, "{progress:?}");
    assert_eq!(text_of(&done), "done after 3 steps");

    // A server-to-client request answered through the other replica, both ways.
    sampling_round_trip(&on_a, &on_b, "from a").await;
    sampling_round_trip(&on_b, &on_a, "from b").await;

    assert_eq!(
        web.mock.initialize_count(),
        upstream_inits,
        "replica b continued the client's upstream session instead of opening its own"
    );
    assert_eq!(b.metric("switchboard_sessions_adopted_total", &[]).await, 1.0);
    assert!(b.metric("switchboard_upstream_sessions_resumed_total", &["upstream=\"web\""]).await >= 1.0);

    // DELETE through b ends the session everywhere, and its upstream session once.
    let deleted_before = web.mock.deleted_sessions();
    assert_eq!(on_b.delete().await, StatusCode::OK);
    assert_eq!(web.mock.deleted_sessions(), deleted_before + 1);
    // At b at once; at a once its cached view of the session (`cache`,
    // 100 ms here) is checked against the store again.
    let reply = on_b.post(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(
        eventually(Duration::from_secs(5), || async {
            on_a.post(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})).await.status == StatusCode::NOT_FOUND
        })
        .await,
        "the session ended at a too"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_expires_once_across_replicas_and_its_upstream_session_ends() {
    let (web, a, b, on_a, on_b) = two_replicas("3s").await;
    on_a.call_tool("web__echo", json!({})).await;
    on_b.call_tool("web__echo", json!({})).await;
    let deleted_before = web.mock.deleted_sessions();
    // Kept alive by use on either replica, for longer than the idle time.
    // The pause is the client's pace of use (a tenth of the idle time, so
    // only a stall of seconds could expire it), not a wait for an event.
    let started = std::time::Instant::now();
    for client in [&on_a, &on_b].into_iter().cycle() {
        if started.elapsed() > Duration::from_secs(4) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let reply = client.call_tool("web__echo", json!({})).await;
        assert!(reply["result"].is_object(), "a session in use does not expire: {reply}");
    }
    assert_eq!(web.mock.deleted_sessions(), deleted_before, "a session in use does not expire");
    assert!(
        eventually(Duration::from_secs(20), || async { web.mock.deleted_sessions() > deleted_before }).await,
        "left idle, it expires and its upstream session is ended"
    );
    // Both replicas have let go of it (their sweeps ran): a second end of
    // the upstream session would have happened by now.
    assert!(
        eventually(Duration::from_secs(20), || async {
            a.metric("switchboard_sessions", &[]).await == 0.0 && b.metric("switchboard_sessions", &[]).await == 0.0
        })
        .await
    );
    assert_eq!(web.mock.deleted_sessions(), deleted_before + 1, "its upstream session is ended exactly once");
    for client in [&on_a, &on_b] {
        let reply = client.post(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
    }
    a.stop().await;
    b.stop().await;
}

/// A router process (so that it can be killed), on a port of its own choosing.
async fn router_process(config: &str) -> (Process, String, tempfile_path::TempPath) {
    // Warnings only, but the line saying where it listens.
    router_process_logging(config, "warn").await
}

/// A router process logging at `level` (and the line saying where it listens).
async fn router_process_logging(config: &str, level: &str) -> (Process, String, tempfile_path::TempPath) {
    let file = tempfile_path::TempPath::new("switchboard-replica", ".toml");
    std::fs::write(
        &file.0,
        format!(
            "[auth]\nmode = \"none\"\n[database]\nurl = \"\"\n[egress]\nallow = [\"loopback\"]\n[log]\nlevel = \"{level},switchboard_router::server=info\"\n{config}"
        ),
    )
    .unwrap();
    let (process, addr) = Process::spawn_announced(
        &router_binary(),
        &["serve", "--config", file.0.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    (process, format!("http://{addr}/mcp"), file)
}

mod tempfile_path {
    /// A file path removed on drop.
    pub struct TempPath(pub std::path::PathBuf);

    impl TempPath {
        pub fn new(prefix: &str, suffix: &str) -> TempPath {
            TempPath(std::env::temp_dir().join(switchboard_test_support::services::unique(prefix) + suffix))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_sequence_loses_nothing_it_answered_and_the_other_goes_on() {
    let web = MockServer::start(mock_named("web")).await;
    let prefix = unique("sbtest:");
    let config = replica_config(&redis_url(), &prefix, &web.url, "30m");
    let (mut killed, killed_url, _file) = router_process(&config).await;
    let survivor = Router::start(&config).await;
    let mut on_killed = Client::new(&killed_url);
    on_killed.initialize_with(json!({"sampling": {}})).await;
    let on_survivor = at(&on_killed, &survivor.url);

    let mut answered = Vec::new();
    for i in 0..6 {
        let client = if i % 2 == 0 { &on_killed } else { &on_survivor };
        let echoed = client.call_tool("web__echo", json!({"seq": i})).await;
        answered.push(text_of(&echoed));
    }
    // A second session the survivor has never seen, until after the kill.
    let mut unseen = Client::new(&killed_url);
    unseen.initialize().await;
    assert_eq!(text_of(&unseen.call_tool("web__echo", json!({"before": 1})).await), r#"{"before":1}"#);
    let upstream_inits = web.mock.initialize_count();

    // A call in flight on the replica when it dies (the upstream has it): it
    // was never answered.
    let calls_before = web.mock.call_count();
    let in_flight = {
        let client = on_killed.clone();
        tokio::spawn(async move {
            let doomed = json!({"jsonrpc": "2.0", "id": "doomed", "method": "tools/call",
                "params": {"name": "web__sleep", "arguments": {"ms": 3000}}});
            client.try_post(doomed, Duration::from_secs(20)).await
        })
    };
    assert!(eventually(Duration::from_secs(10), || async { web.mock.call_count() > calls_before }).await);
    // And a call answered as SSE: its events so far were sent, so they were promised.
    let mut streamed = progress_call(&on_killed, 50, 100, "k").await;
    let mut seen = Vec::new();
    let mut first_id = None;
    while seen.len() < 3 {
        let event = streamed.next_event(Duration::from_secs(5)).await.expect("progress before the kill");
        if event.data.is_empty() {
            continue;
        }
        let message: Value = serde_json::from_slice(&event.data).unwrap();
        seen.push(message["params"]["progress"].as_u64().expect("progress"));
        first_id = first_id.or(event.id);
    }
    // Copies to Redis go behind the stream (milliseconds): wait until the
    // events the client saw are there (the entries of the session's event
    // logs; the key layout is the one thing this test knows of the inside).
    let session = on_killed.session.clone().unwrap();
    let redis = redis::Client::open(redis_url()).unwrap();
    let conn = redis.get_multiplexed_async_connection().await.unwrap();
    let copied = eventually(Duration::from_secs(10), || {
        let mut conn = conn.clone();
        let pattern = format!("{prefix}ev:{session}:*");
        async move {
            let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(&mut conn).await.unwrap();
            let mut entries = 0u64;
            for key in keys {
                entries += redis::cmd("XLEN").arg(&key).query_async::<u64>(&mut conn).await.unwrap_or(0);
            }
            entries >= 3
        }
    });
    assert!(copied.await, "the stream's events reach Redis");
    killed.child.start_kill().unwrap();
    killed.child.wait().await.unwrap();
    let doomed = in_flight.await.unwrap();
    let cause = doomed.expect_err("the call in flight died with its replica (no answer was promised)");
    assert_ne!(cause, "timed out", "the connection was cut, not left hanging");
    // Resumed at the survivor after the first event: every event the dead
    // replica sent comes again, then (this mock gives no event ids, so its
    // stream cannot be resumed) an error saying so, and the stream ends
    // instead of hanging.
    let (status, mut resumed) = on_survivor.resume_stream(first_id.as_deref()).await;
    assert_eq!(status, StatusCode::OK);
    let mut replayed = Vec::new();
    let resumed_at = std::time::Instant::now();
    let mut ending = None;
    while let Some(message) = resumed.next(Duration::from_secs(30)).await {
        if message["method"] == "notifications/progress" {
            assert!(ending.is_none(), "nothing after the answer: {message}");
            replayed.push(message["params"]["progress"].as_u64().unwrap());
        } else {
            ending = Some(message);
        }
    }
    let ending = ending.expect("an answer, not a stream that just stops");
    assert!(ending["error"]["message"].as_str().unwrap().contains("replica relaying this call stopped"), "{ending}");
    assert!(replayed.len() >= 2, "at least what the client saw after its first event: {replayed:?}");
    assert_eq!(replayed, (2..2 + replayed.len() as u64).collect::<Vec<_>>(), "in order, nothing lost");
    assert!(replayed.len() < 50);
    assert!(
        resumed_at.elapsed() < Duration::from_secs(29),
        "the stream ended; it did not hang until the test's timeout"
    );

    // The same session id goes on at the other replica, on the same upstream session.
    for i in 6..10 {
        let echoed = on_survivor.call_tool("web__echo", json!({"seq": i})).await;
        answered.push(text_of(&echoed));
    }
    sampling_round_trip(&on_survivor, &on_survivor, "after the kill").await;
    let unseen = at(&unseen, &survivor.url);
    assert_eq!(text_of(&unseen.call_tool("web__echo", json!({"after": 1})).await), r#"{"after":1}"#);
    assert_eq!(survivor.metric("switchboard_sessions_adopted_total", &[]).await, 2.0);
    let expected: Vec<String> = (0..10).map(|i| format!("{{\"seq\":{i}}}")).collect();
    assert_eq!(answered, expected, "every answered call, in order");
    assert_eq!(web.mock.initialize_count(), upstream_inits, "no new upstream session was needed");
    survivor.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarting_costs_no_live_session() {
    let mut redis = PrivateRedis::start();
    let web = MockServer::start(mock_named("web")).await;
    let config = replica_config(&redis.url, "sb:", &web.url, "30m");
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);
    let mut old = Client::new(&a.url);
    old.initialize().await;
    old.call_tool("web__echo", json!({})).await;
    at(&old, &b.url).call_tool("web__echo", json!({})).await;
    // A GET stream at A that hears resource updates.
    let uri = "web+mock://web/hello";
    assert_eq!(old.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    let mut stream = old.open_stream().await;
    let mut last_id = None;
    for _ in 0..50 {
        touch(old.clone()).await;
        if let Some((id, _)) = next_update(&mut stream, Duration::from_millis(200)).await {
            last_id = Some(id);
            break;
        }
    }
    let last_id = last_id.expect("an update on the GET stream before the outage");

    redis.stop();
    // An update during the outage waits in A's queue; a GET elsewhere
    // cannot be served and says so.
    touch(old.clone()).await;
    let (status, _) = at(&old, &b.url).resume_stream(Some(&last_id)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // Both replicas hold the session: it keeps working on each.
    for url in [&a.url, &b.url] {
        let echoed = at(&old, url).call_tool("web__echo", json!({"during": "outage"})).await;
        assert_eq!(text_of(&echoed), r#"{"during":"outage"}"#, "{url}");
    }
    // A session made during the outage works where it was made; the other
    // replica cannot load it and says so (503, not 404: it is not gone).
    let mut new = Client::new(&a.url);
    new.initialize().await;
    assert_eq!(text_of(&new.call_tool("web__echo", json!({"new": 1})).await), r#"{"new":1}"#);
    let elsewhere = at(&new, &b.url).post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    assert_eq!(elsewhere.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(elsewhere.json()["error"]["code"], -32603, "{:?}", elsewhere.json());
    for router in [&a, &b] {
        assert_eq!(get_text(&router.path("/healthz")).await, "ok\n");
    }
    // Ending a session needs the store (others may hold it): DELETE says
    // to retry, and the session is not ended.
    assert_eq!(old.delete().await, StatusCode::SERVICE_UNAVAILABLE);

    // Redis comes back empty. Replicas write back the sessions they hold
    // (A both, B the old one: whichever is first), after which the other
    // replica can load the one it never saw.
    redis.resume();
    let repaired = eventually(Duration::from_secs(10), || async {
        new.call_tool("web__echo", json!({})).await;
        old.call_tool("web__echo", json!({})).await;
        a.metric("switchboard_sessions_repaired_total", &[]).await
            + b.metric("switchboard_sessions_repaired_total", &[]).await
            >= 2.0
    })
    .await;
    assert!(repaired, "both sessions written back");
    // The update made during the outage reached Redis once it was back:
    // the client resumes its GET stream at B and gets it.
    drop(stream);
    let (status, mut resumed) = at(&old, &b.url).resume_stream(Some(&last_id)).await;
    assert_eq!(status, StatusCode::OK);
    let (id, update) =
        next_update(&mut resumed, Duration::from_secs(10)).await.expect("the update made during the outage");
    assert_eq!(update["params"]["uri"], uri);
    assert!(seq_of(&id).1 > seq_of(&last_id).1, "numbered after what the client saw: {id} after {last_id}");
    let echoed = at(&new, &b.url).call_tool("web__echo", json!({"new": 2})).await;
    assert_eq!(text_of(&echoed), r#"{"new":2}"#);
    // Both replicas held the old session: each checks it against the store
    // again, one finding it written back by the other, and it goes on at both.
    // This waits out the replicas' session cache (100 ms): what is tested
    // is the check against the store made once it is stale, which no event
    // announces.
    tokio::time::sleep(Duration::from_millis(150)).await;
    for url in [&a.url, &b.url, &a.url, &b.url] {
        let echoed = at(&old, url).call_tool("web__echo", json!({"after": "restart"})).await;
        assert_eq!(text_of(&echoed), r#"{"after":"restart"}"#, "{url}");
    }
    a.stop().await;
    b.stop().await;
}

/// Which upstream replica served a call of `client`'s session: the mock's
/// `log` tool logs under its `--name`.
async fn served_by(client: &Client) -> String {
    let (status, _, mut stream) =
        client.request_stream("tools/call", json!({"name": "web__log", "arguments": {"message": "who"}})).await;
    assert_eq!(status, StatusCode::OK);
    let mut logger = None;
    loop {
        let message = stream.next(Duration::from_secs(10)).await.expect("the log, then the result");
        if message["method"] == "notifications/message" {
            logger = message["params"]["logger"].as_str().map(str::to_owned);
        } else {
            assert_eq!(text_of(&message), "logged who", "{message}");
            return logger.expect("the log message came first");
        }
    }
}

/// A mock upstream process named `name` on a port of its own choosing;
/// returns it and its URL.
async fn mock_process(name: &str) -> (Process, String) {
    let (process, addr) = Process::spawn_announced(
        &switchboard_test_support::mock_binary(),
        &["--http", "127.0.0.1:0", "--name", name],
        &[],
        "switchboard-mock listening on",
    )
    .await;
    (process, format!("http://{addr}/mcp"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_spread_over_upstream_replicas_and_move_when_one_is_killed() {
    let (mut r1, r1_url) = mock_process("r1").await;
    let (_r2, r2_url) = mock_process("r2").await;
    let config = format!(
        "[server]\nkeep_alive = \"1s\"\n[sessions]\nstore = \"redis\"\ncache = \"100ms\"\n\
         [redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout = \"500ms\"\n\
         [[upstreams]]\nname = \"web\"\ntransport = \"http\"\nurls = [\"{r1_url}\", \"{r2_url}\"]\nhealth_interval = \"200ms\"\n",
        redis_url(),
        unique("sbtest:")
    );
    let (a, b) = (Router::start(&config).await, Router::start(&config).await);

    // Sessions spread over both replicas by consistent hashing, and each
    // stays on its replica, through either router.
    let mut sessions = Vec::new();
    for _ in 0..16 {
        let mut client = Client::new(&a.url);
        client.initialize().await;
        let replica = served_by(&client).await;
        assert_eq!(served_by(&at(&client, &b.url)).await, replica, "the other router continues on the same replica");
        sessions.push((client, replica));
    }
    let on_r1 = sessions.iter().filter(|(_, r)| r == "r1").count();
    assert!(on_r1 > 0 && on_r1 < 16, "both replicas get sessions: {on_r1} of 16 on r1");
    assert_eq!(a.metric("switchboard_upstream_replica_up", &[&format!("replica=\"{r1_url}\"")]).await, 1.0);

    // r1 dies. Its sessions move to r2 on their next call, through either
    // router, and the call succeeds; r2's sessions are untouched.
    r1.child.start_kill().unwrap();
    r1.child.wait().await.unwrap();
    for (i, (client, _)) in sessions.iter().enumerate() {
        let via = if i % 2 == 0 { at(client, &b.url) } else { client.clone() };
        assert_eq!(served_by(&via).await, "r2", "session {i} after the kill");
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.metric("switchboard_upstream_replica_up", &[&format!("replica=\"{r1_url}\"")]).await == 0.0
        })
        .await,
        "the health checks noticed"
    );
    // New sessions go to the replica that is up.
    let mut late = Client::new(&b.url);
    late.initialize().await;
    assert_eq!(served_by(&late).await, "r2");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_replica_hands_its_streams_off_and_leaves_its_sessions_to_the_others() {
    let web = MockServer::start(mock_named("web")).await;
    let config = replica_config(&redis_url(), &unique("sbtest:"), &web.url, "30m");
    let (mut draining, draining_url, _file) = router_process(&config).await;
    let other = Router::start(&config).await;
    let mut client = Client::new(&draining_url);
    client.initialize().await;
    client.call_tool("web__echo", json!({})).await;
    let (inits, deletes) = (web.mock.initialize_count(), web.mock.deleted_sessions());

    // A call in flight when SIGTERM arrives is finished, not cut.
    let calls_before = web.mock.call_count();
    let in_flight = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("web__sleep", json!({"ms": 1500})).await })
    };
    // A streamed call in flight is handed off: its stream ends here, the
    // client resumes it at the other replica, and the answer arrives there.
    let mut streamed = progress_call(&client, 8, 200, "d").await;
    let mut progress = Vec::new();
    let mut last_id = None;
    // Reads one event: a progress step is recorded, the answer returned.
    fn read(
        event: switchboard_protocol::sse::Event,
        progress: &mut Vec<u64>,
        last_id: &mut Option<String>,
    ) -> Option<Value> {
        if event.id.is_some() {
            *last_id = event.id;
        }
        if event.data.is_empty() {
            return None;
        }
        let message: Value = serde_json::from_slice(&event.data).unwrap();
        match message["params"]["progress"].as_u64() {
            Some(step) => {
                progress.push(step);
                None
            }
            None => Some(message),
        }
    }
    while progress.is_empty() {
        let event = streamed.next_event(Duration::from_secs(5)).await.expect("the first progress event");
        assert!(read(event, &mut progress, &mut last_id).is_none());
    }
    // Both calls are at the upstream before the signal.
    assert!(eventually(Duration::from_secs(10), || async { web.mock.call_count() >= calls_before + 2 }).await);
    let pid = nix::unistd::Pid::from_raw(draining.child.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let finished = in_flight.await.expect("the call in flight got its answer");
    assert_eq!(text_of(&finished), "slept 1500 ms");
    while let Some(event) = streamed.next_event(Duration::from_secs(5)).await {
        assert!(read(event, &mut progress, &mut last_id).is_none(), "the answer is not sent at the draining replica");
    }
    assert!(progress.len() < 8, "the stream was handed off before the answer: {progress:?}");
    let last = last_id.clone().expect("event ids");
    let (status, mut resumed) = at(&client, &other.url).resume_stream(Some(&last)).await;
    assert_eq!(status, StatusCode::OK);
    let answer = loop {
        let event = resumed.next_event(Duration::from_secs(10)).await.expect("the rest of the handed-off stream");
        if let Some(answer) = read(event, &mut progress, &mut last_id) {
            break answer;
        }
    };
    assert_eq!(text_of(&answer), "done after 8 steps");
    assert_eq!(progress, (1..=8).collect::<Vec<u64>>(), "every progress event once, in order, across both replicas");
    let status = tokio::time::timeout(Duration::from_secs(15), draining.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "a drained router exits 0: {status:?}");

    // The session goes on at the other replica, on the same upstream
    // session: the drained replica did not end it.
    let echoed = at(&client, &other.url).call_tool("web__echo", json!({"after": "drain"})).await;
    assert_eq!(text_of(&echoed), r#"{"after":"drain"}"#);
    assert_eq!(
        web.mock.initialize_count(),
        inits,
        "the client's upstream session was not ended: none was opened again"
    );
    assert_eq!(web.mock.deleted_sessions(), deletes + 1, "the drain ended only the router's own catalog session");
    other.stop().await;
}

async fn next_update(stream: &mut switchboard_test_support::EventStream, wait: Duration) -> Option<(String, Value)> {
    loop {
        let event = stream.next_event(wait).await?;
        if event.data.is_empty() {
            continue;
        }
        let message: Value = serde_json::from_slice(&event.data).expect("JSON event");
        if message["method"] == "notifications/resources/updated" {
            return Some((event.id.expect("events carry ids"), message));
        }
    }
}

fn seq_of(event_id: &str) -> (u64, u64) {
    let (stream, seq) = event_id.split_once('-').expect("STREAM-SEQ");
    (stream.parse().unwrap(), seq.parse().unwrap())
}
