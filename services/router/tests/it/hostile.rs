//! Careless or hostile peers on either side: what a client can slip past
//! the router (repeated members, odd ids), what an upstream can answer
//! (another request's id); connections that hold the router without
//! asking anything, and too many of them.

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;
use switchboard_mock::AnswerIds;
use switchboard_test_support::{eventually, http_upstream, mock_named, Client, MockOptions, MockServer, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::routing::config;

fn call(id: &str, params: &str) -> bytes::Bytes {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#).into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_member_the_router_reads_or_records_is_refused_not_forwarded() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    for params in [
        // The upstream would run the second, the audit would record none.
        r#"{"name":"web__echo","arguments":{"text":"shown"},"arguments":{"text":"hidden"}}"#,
        r#"{"name":"web__echo","arguments":{},"_meta":{"progressToken":1,"progressToken":2}}"#,
        r#"{"name":"web__echo","arguments":{},"_meta":{},"_meta":{"progressToken":2}}"#,
    ] {
        let reply = client.post_raw(call("5", params), &[]).await;
        let answer = reply.json();
        assert_eq!(answer["id"], 5, "{answer}");
        assert_eq!(answer["error"]["code"], -32602, "{params}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("duplicate field"), "{answer}");
    }
    assert_eq!(web.mock.call_count(), 0, "nothing was forwarded");
    // Members the router neither reads nor records may repeat (JSON allows
    // it); the upstream decides what they mean.
    let reply = client
        .post_raw(call("6", r#"{"name":"web__echo","arguments":{"text":"a","text":"b"},"x":1,"x":2}"#), &[])
        .await;
    assert!(reply.json()["result"].is_object(), "{}", reply.json());
    assert_eq!(web.mock.call_count(), 1);
    // The router is still healthy.
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "ok"})).await["result"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_json_rpc_id_round_trips_through_an_upstream_that_reprints_numbers() {
    // A JavaScript server answers `1.0` as `1`: the router must not lose
    // the answer, whether it comes as JSON or in an SSE stream.
    for always_sse in [false, true] {
        let web =
            MockServer::start(MockOptions { answer_ids: AnswerIds::AsJavaScript, always_sse, ..mock_named("web") })
                .await;
        let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        for id in ["1.0", "1E2", "-0", "2.5e-3", "123456789012345678901", "7", r#""sb~7""#, r#""a\u00e9""#] {
            let reply = client.post_raw(call(id, r#"{"name":"web__echo","arguments":{"text":"x"}}"#), &[]).await;
            assert_eq!(reply.status, StatusCode::OK);
            let text = String::from_utf8_lossy(&reply.body).into_owned();
            assert!(
                text.contains(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#)),
                "sse={always_sse}: id {id} must come back as the client wrote it: {text}"
            );
        }
        assert_eq!(web.mock.call_count(), 8);
        // A cancellation naming such an id reaches the upstream under the
        // id it knows: nothing is in flight here, so check the mapping by a
        // call that is (the slow tool), cancelled by the client.
        let slow = client.clone();
        let call_slow = tokio::spawn(async move {
            slow.post_raw(call("3.0", r#"{"name":"web__sleep","arguments":{"ms":30000}}"#), &[]).await
        });
        let reached = eventually(Duration::from_secs(10), || async { web.mock.call_count() == 9 }).await;
        assert!(reached, "the slow call reached the upstream");
        let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3.0}}"#;
        assert_eq!(client.post_raw(cancel.into(), &[]).await.status, StatusCode::ACCEPTED);
        let cancelled =
            eventually(Duration::from_secs(10), || async { web.mock.cancelled().iter().any(|id| id == r#""sb~3.0""#) })
                .await;
        assert!(cancelled, "the upstream got the cancellation under its id: {:?}", web.mock.cancelled());
        call_slow.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_under_another_requests_id_is_dropped_and_the_request_gets_an_error() {
    for always_sse in [false, true] {
        let web =
            MockServer::start(MockOptions { answer_ids: AnswerIds::Stray, always_sse, ..mock_named("web") }).await;
        let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        let reply = client.post_raw(call("42", r#"{"name":"web__echo","arguments":{"text":"x"}}"#), &[]).await;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(!text.contains("1042"), "sse={always_sse}: another id's answer was delivered: {text}");
        let answer: Value = if always_sse {
            let data = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .next_back()
                .unwrap_or_else(|| panic!("no event in {text:?}"));
            serde_json::from_str(data).unwrap()
        } else {
            reply.json()
        };
        assert_eq!(answer["id"], 42, "{answer}");
        assert!(answer["result"].is_null(), "{answer}");
        assert!(answer["error"]["code"].is_i64(), "{answer}");
        let dropped = router.metric("switchboard_relay_dropped_total", &["upstream=\"web\"", "stray_response"]).await;
        assert_eq!(dropped, 1.0, "sse={always_sse}");
    }
}

/// A raw connection to the router from `source` (any 127.x.y.z address is
/// loopback), sending `request` if any; what it reads until the router
/// closes it, or `None` if it is still open after `wait`.
async fn raw(router: &Router, source: &str, request: &[u8], wait: Duration) -> Option<String> {
    let mut stream = connect_from(router, source).await;
    stream.write_all(request).await.unwrap();
    read_until_closed(&mut stream, wait).await
}

async fn connect_from(router: &Router, source: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(router.addr).await.unwrap()
}

async fn read_until_closed(stream: &mut tokio::net::TcpStream, wait: Duration) -> Option<String> {
    let mut got = Vec::new();
    match tokio::time::timeout(wait, stream.read_to_end(&mut got)).await {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(_) => None,
    }
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_silent_connections_are_closed_in_time_while_calls_and_streams_go_on() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&format!(
        "[server]\nkeep_alive = \"500ms\"\nheader_timeout = \"1s\"\nidle_timeout = \"2s\"\n{}",
        http_upstream("web", &web.url, "")
    ))
    .await;
    // Silent connections, one sending its headers a byte at a time, and one
    // that made a request and then says nothing.
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(connect_from(&router, "127.0.0.1").await);
    }
    let mut trickle = connect_from(&router, "127.0.0.1").await;
    let mut kept_alive = connect_from(&router, "127.0.0.1").await;
    kept_alive.write_all(b"GET /healthz HTTP/1.1\r\nHost: router\r\n\r\n").await.unwrap();
    // A client with an SSE stream open longer than the idle timeout.
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let (status, _, mut stream) = client
        .request_stream(
            "tools/call",
            serde_json::json!({"name": "web__progress", "arguments": {"steps": 7, "interval_ms": 500},
                "_meta": {"progressToken": "t"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    for byte in b"GET /healthz HTTP/1.1\r\n" {
        if trickle.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Calls keep working meanwhile.
    for _ in 0..5 {
        assert!(client.call_tool("web__echo", serde_json::json!({"text": "x"})).await["result"].is_object());
    }
    for mut conn in silent {
        let read = read_until_closed(&mut conn, Duration::from_secs(5)).await;
        assert_eq!(read.as_deref(), Some(""), "a silent connection is closed within header_timeout");
    }
    assert!(read_until_closed(&mut trickle, Duration::from_secs(5)).await.is_some(), "a trickling one too");
    let answered = read_until_closed(&mut kept_alive, Duration::from_secs(5)).await.expect("closed when idle");
    assert!(answered.starts_with("HTTP/1.1 200"), "answered, then closed after idle_timeout: {answered}");
    // The stream outlived the idle timeout: a request in flight is not idle.
    let events = stream.until_end(Duration::from_secs(10)).await.expect("the stream ends with its answer");
    assert!(events.last().unwrap()["result"].is_object(), "{events:?}");
    let closed = router.metric("switchboard_connections_closed_total", &["header_timeout"]).await;
    assert!(closed >= 51.0, "{closed}");
    assert!(router.metric("switchboard_connections_closed_total", &["\"idle\""]).await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_capped_per_address_and_in_all_and_the_router_stays_healthy() {
    let router =
        Router::start("[server]\nheader_timeout = \"30s\"\nmax_connections = 20\nmax_connections_per_address = 10\n")
            .await;
    let mut attacker = Vec::new();
    for _ in 0..10 {
        attacker.push(connect_from(&router, "127.0.0.1").await);
    }
    let refused = raw(&router, "127.0.0.1", HEALTHZ, Duration::from_secs(5)).await.expect("refused at once");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("too many connections"), "{refused}");
    let health = raw(&router, "127.0.0.2", HEALTHZ, Duration::from_secs(5)).await.expect("answered");
    assert!(health.starts_with("HTTP/1.1 200"), "another address is still served: {health}");
    for _ in 0..10 {
        attacker.push(connect_from(&router, "127.0.0.3").await);
    }
    // Once the router has taken all 20 (on a loaded machine it may take a
    // moment to accept them), a 21st from anywhere is refused.
    let capped = eventually(Duration::from_secs(5), || async {
        raw(&router, "127.0.0.4", HEALTHZ, Duration::from_secs(5)).await.is_some_and(|r| r.starts_with("HTTP/1.1 503"))
    })
    .await;
    assert!(capped, "the global cap holds");
    drop(attacker);
    let healthy = eventually(Duration::from_secs(5), || async {
        raw(&router, "127.0.0.1", HEALTHZ, Duration::from_secs(2)).await.is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    assert!(healthy, "places are given back when connections close");
    assert!(router.metric("switchboard_connections_refused_total", &["per_address"]).await >= 1.0);
    assert!(router.metric("switchboard_connections_refused_total", &["max_connections"]).await >= 1.0);
}

/// `initialize` by a new client with `key` (none: keys off): the status,
/// and the JSON-RPC answer.
async fn open_session(router: &Router, key: Option<&str>) -> (StatusCode, Value) {
    let client = match key {
        Some(key) => Client::with_key(&router.url, key),
        None => Client::new(&router.url),
    };
    let reply = client
        .request("initialize", serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}))
        .await;
    let answer = if reply.body.is_empty() { Value::Null } else { reply.json() };
    (reply.status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_session_flood_leaves_other_tenants_their_places() {
    use switchboard_core::policy::Limits;
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-sessions-"));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite:{}", dir.join("switchboard.db").display());
    let (_alpha, _beta, config, admin) = crate::tenancy::setup_with_admin(&db, "[server]\nmax_sessions = 9\n").await;
    let mut flood = crate::tenancy::policy(&["alpha"]);
    flood.limits = Limits { sessions: Some(4), key_sessions: Some(3), ..Limits::default() };
    admin.create_tenant("flood", flood).await.unwrap();
    admin.create_tenant("calm", crate::tenancy::policy(&["beta"])).await.unwrap();
    let first = admin.create_key("flood", None).await.unwrap().key;
    let second = admin.create_key("flood", None).await.unwrap().key;
    let calm = admin.create_key("calm", None).await.unwrap().key;
    let router = Router::start(&config).await;

    // One key: three sessions, then its own cap.
    for _ in 0..3 {
        assert_eq!(open_session(&router, Some(&first)).await.0, StatusCode::OK);
    }
    let (status, answer) = open_session(&router, Some(&first)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert_eq!(answer["error"]["code"], -32029);
    assert_eq!(answer["error"]["data"], serde_json::json!({"limit": "key_sessions", "max": 3}));
    // Another key of the tenant: one more, then the tenant's cap.
    assert_eq!(open_session(&router, Some(&second)).await.0, StatusCode::OK);
    let (status, answer) = open_session(&router, Some(&second)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert_eq!(answer["error"]["data"], serde_json::json!({"limit": "sessions", "max": 4}));
    // The other tenant still opens sessions, up to the router's own cap.
    for _ in 0..5 {
        assert_eq!(open_session(&router, Some(&calm)).await.0, StatusCode::OK);
    }
    let (status, answer) = open_session(&router, Some(&calm)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["error"]["data"], serde_json::json!({"limit": "max_sessions", "max": 9}));
    assert_eq!(router.metric("switchboard_http_rejections_total", &["reason=\"too_many_sessions\""]).await, 3.0);
    let limited = |limit: &'static str| {
        let router = &router;
        async move {
            router.metric("switchboard_rate_limited_total", &["tenant=\"flood\"", &format!("limit=\"{limit}\"")]).await
        }
    };
    assert_eq!(limited("key_sessions").await, 1.0);
    assert_eq!(limited("sessions").await, 1.0);
    assert_eq!(router.metric("switchboard_sessions", &[]).await, 9.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_frees_its_place_the_moment_it_expires() {
    // Sessions idle for 4 s expire; the sweep runs once a second. Right
    // after the sessions that fill the cap expire, a new one fits: the
    // sweep need not have run. (Were expiry left to the sweep, a round
    // would pass only if the sweep happened to run in the tenth of a
    // second between expiry and the new session; two rounds.)
    let web = MockServer::start(mock_named("web")).await;
    let extra = "[server]\nmax_sessions = 20\nsession_idle_timeout = \"4s\"\n";
    let router = Router::start(&format!("{extra}{}", http_upstream("web", &web.url, ""))).await;
    for round in 0..2 {
        // The cap fills (the second round's with the first round's last
        // session still live).
        let opened = futures_util::future::join_all((0..20).map(|_| open_session(&router, None))).await;
        let ok = opened.iter().filter(|(status, _)| *status == StatusCode::OK).count();
        assert_eq!(ok, 20 - round, "round {round}: {opened:?}");
        let full = tokio::time::Instant::now();
        assert_eq!(open_session(&router, None).await.0, StatusCode::SERVICE_UNAVAILABLE);
        tokio::time::sleep_until(full + Duration::from_millis(4050)).await;
        let (status, answer) = open_session(&router, None).await;
        assert_eq!(status, StatusCode::OK, "round {round}: {answer}");
        assert!(router.metric("switchboard_sessions", &[]).await <= 20.0);
    }
    assert_eq!(router.metric("switchboard_http_rejections_total", &["reason=\"too_many_sessions\""]).await, 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_lists_never_wait_on_upstreams_it_does_not_subscribe_to() {
    // `slow` trickles its lists (3 s each time it is asked, and it is asked
    // again after every change); tenant `quick` does not see it.
    let slow = MockServer::start(MockOptions { list_delay: Duration::from_secs(3), ..mock_named("slow") }).await;
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-lists-"));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite:{}", dir.join("switchboard.db").display());
    let (alpha, _beta, config, admin) =
        crate::tenancy::setup_with_admin(&db, &http_upstream("slow", &slow.url, "list_timeout = \"10s\"")).await;
    admin.create_tenant("quick", crate::tenancy::policy(&["alpha"])).await.unwrap();
    admin.create_tenant("patient", crate::tenancy::policy(&["alpha", "slow"])).await.unwrap();
    let quick = admin.create_key("quick", None).await.unwrap().key;
    let patient = admin.create_key("patient", None).await.unwrap().key;
    let router = Router::start(&config).await;

    // At start the catalog warm-up is fetching every upstream, `slow` too:
    // `quick` opens its session and lists at once all the same.
    let mut q = Client::with_key(&router.url, &quick);
    let mut p = Client::with_key(&router.url, &patient);
    let waiting = tokio::spawn(async move {
        p.initialize().await;
        p.tool_names().await
    });
    q.initialize().await;
    let names = q.tool_names().await;
    assert!(names.contains(&"alpha__echo".to_owned()), "{names:?}");
    assert!(!waiting.is_finished(), "the tenant that sees `slow` is still waiting for its list");
    let names = waiting.await.unwrap();
    assert!(names.contains(&"slow__echo".to_owned()) && names.contains(&"alpha__echo".to_owned()), "{names:?}");

    // `slow`'s tools change: its next list takes 3 s again, and only its
    // tenants wait for it.
    let lists = slow.mock.list_count();
    let mut p = Client::with_key(&router.url, &patient);
    p.initialize().await;
    p.call_tool("slow__add_tool", serde_json::json!({"name": "fresh"})).await;
    // The change reaches the router on `slow`'s GET stream, apart from the
    // call's answer: a list asked for before it arrives is still the cached
    // one, and the client hears of the change afterwards, so it lists until
    // it has the new tool, as a client told of the change would.
    let waiting = tokio::spawn(async move {
        loop {
            let names = p.tool_names().await;
            if names.contains(&"slow__fresh".to_owned()) {
                return names;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    // Asked within seconds; the bound is generous because a loaded machine
    // running the whole suite once took longer than 5 s to get there.
    assert!(
        eventually(Duration::from_secs(15), || async { slow.mock.list_count() > lists }).await,
        "the patient tenant's list asks `slow` again"
    );
    let names = q.tool_names().await;
    assert!(names.contains(&"alpha__echo".to_owned()), "{names:?}");
    assert!(!waiting.is_finished(), "the tenant that sees `slow` is still waiting for its list");
    let names = tokio::time::timeout(Duration::from_secs(15), waiting).await.expect("the new list").unwrap();
    assert!(names.contains(&"alpha__echo".to_owned()), "{names:?}");
    let _ = alpha;
}

/// A router process with `config` (TOML; no keys, no database unless
/// `config` has one, logs at `warn` and the listening line), and its port.
async fn router_process(config: &str) -> (switchboard_test_support::peers::Process, u16) {
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-hostile-"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("router.toml");
    let database = if config.contains("[database]") { "" } else { "[database]\nurl = \"\"\n" };
    let text =
        format!("[auth]\nmode = \"none\"\n{database}[egress]\nallow = [\"loopback\"]\n[log]\nlevel = \"warn,switchboard_router::server=info\"\n{config}");
    std::fs::write(&file, text).unwrap();
    let (process, addr) = switchboard_test_support::peers::Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    (process, addr.port())
}

/// The most resident memory a process has had, from `/proc`, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("a number") / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_catalog_is_left_out_and_the_routers_memory_stays_bounded() {
    // 40 pages of 5 MB (200 MB in all); one page of 60 MB; 50 small tools
    // against a bound of 40 items; and a careless server naming a tool twice.
    let pages =
        MockServer::start(MockOptions { extra_tools: 40, page_size: 1, tool_padding: 5 << 20, ..mock_named("pages") })
            .await;
    let page = MockServer::start(MockOptions { extra_tools: 60, tool_padding: 1 << 20, ..mock_named("page") }).await;
    let many = MockServer::start(MockOptions { extra_tools: 50, ..mock_named("many") }).await;
    let twice = MockServer::start(MockOptions { duplicate_tool: true, ..mock_named("twice") }).await;
    let config = format!(
        "[catalog]\nmax_upstream_items = 40\n{}{}{}{}",
        http_upstream("pages", &pages.url, "list_timeout = \"60s\""),
        http_upstream("page", &page.url, "list_timeout = \"60s\""),
        http_upstream("many", &many.url, ""),
        http_upstream("twice", &twice.url, ""),
    );
    let (process, port) = router_process(&config).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut client = Client::new(&url);
    client.initialize().await;
    let names = client.tool_names().await;
    assert!(names.contains(&"twice__echo".to_owned()), "{names:?}");
    assert_eq!(names.iter().filter(|n| *n == "twice__echo").count(), 1, "the first of the two is kept");
    for left_out in ["pages__", "page__", "many__"] {
        assert!(!names.iter().any(|n| n.starts_with(left_out)), "{left_out} is left out: {names:?}");
    }
    let router = format!("http://127.0.0.1:{port}/metrics");
    let metrics = switchboard_test_support::get_text(&router).await;
    for upstream in ["pages", "page", "many"] {
        let sample = format!("switchboard_catalog_oversized_total{{list=\"tools\",upstream=\"{upstream}\"}}");
        assert!(metrics.lines().any(|l| l.starts_with(&sample)), "{sample} counted");
    }
    // Listing again (the twice-listed name seen at every rebuild) logs the
    // duplicate once, as a warning.
    client.call_tool("twice__add_tool", serde_json::json!({"name": "later"})).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            client.tool_names().await.contains(&"twice__later".to_owned())
        })
        .await
    );
    let peak = peak_rss_mib(process.child.id().expect("running"));
    // Without the bounds it peaks near 1 GiB here; with them near 90 MiB.
    assert!(peak < 300, "the router held {peak} MiB at its peak");
    let output = process.output();
    let said = |text: &str| output.iter().filter(|l| l.contains(text)).count();
    assert_eq!(said("lists this name more than once"), 1, "{output:#?}");
    assert_eq!(said("name collision"), 0, "{output:#?}");
    assert!(said("catalog.max_upstream_bytes") >= 2, "{output:#?}");
    assert!(said("catalog.max_upstream_items (40)") >= 1, "{output:#?}");
    eprintln!("router peak RSS: {peak} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_server_requests_is_relayed_or_refused_back_every_one_counted() {
    const BURST: u64 = 20_000;
    let web = MockServer::start(MockOptions { burst_tool: true, ..mock_named("web") }).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;

    // 20,000 pings to the client at once, on the call's stream; the client
    // answers each it gets (16 answers in flight at a time).
    let (status, _, mut stream) = client
        .request_stream("tools/call", serde_json::json!({"name": "web__burst", "arguments": {"count": BURST}}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let places = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    let mut answers = tokio::task::JoinSet::new();
    let mut received = 0u64;
    let mut ids = std::collections::HashSet::new();
    let tally = loop {
        let message = stream.next(Duration::from_secs(60)).await.expect("the call ends within a minute");
        if message["method"] == "ping" {
            received += 1;
            assert!(ids.insert(message["id"].to_string()), "each request once: {message}");
            let place = places.clone().acquire_owned().await.unwrap();
            let client = client.clone();
            let id = message["id"].clone();
            answers.spawn(async move {
                let reply = client.post(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}})).await;
                drop(place);
                reply.status
            });
            continue;
        }
        assert_eq!(message["id"], 1, "{message}");
        break message["result"]["structuredContent"].clone();
    };
    while let Some(status) = answers.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::ACCEPTED);
    }
    // Every request got an answer: the client's, or the router's refusal.
    let refused = tally["errors"]["-32603"].as_u64().unwrap_or(0);
    assert_eq!(tally["missing"], 0, "{tally}");
    assert_eq!(tally["answered"].as_u64().unwrap() + refused, BURST, "{tally}");
    assert_eq!(tally["answered"].as_u64().unwrap(), received, "every request the client got, it answered: {tally}");
    assert_eq!(
        router.metric("switchboard_relay_dropped_total", &["upstream=\"web\"", "reason=\"client_backlog\""]).await,
        refused as f64
    );
    eprintln!("burst of {BURST}: {received} relayed, {refused} refused back");

    // The same on the session's GET stream, which the client reads.
    burst_on_the_get_stream(&router, &web, &client, 5000).await;

    // Requests the client never declared the capability for are refused
    // back, not relayed.
    let (_, _, mut stream) = client
        .request_stream(
            "tools/call",
            serde_json::json!({"name": "web__burst", "arguments": {"count": 10, "method": "sampling/createMessage"}}),
        )
        .await;
    let messages = stream.until_end(Duration::from_secs(40)).await.expect("the call ends");
    assert_eq!(messages.len(), 1, "nothing relayed: {messages:?}");
    let tally = &messages[0]["result"]["structuredContent"];
    assert_eq!(tally["errors"]["-32601"], 10, "{tally}");
    assert_eq!(
        router
            .metric("switchboard_relay_dropped_total", &["upstream=\"web\"", "reason=\"undeclared_capability\""])
            .await,
        10.0
    );
    // The router is still healthy.
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "ok"})).await["result"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_had_no_get_stream_is_asked_again_once_it_restarts() {
    let web = MockServer::start(MockOptions { burst_tool: true, ..mock_named("web") }).await;
    web.mock.refuse_get(true);
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "a"})).await["result"].is_object());
    // The client listens; the router asks the upstream for its GET stream
    // and is told there is none (405).
    let mut get = client.open_stream().await;
    let answering = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut pings = 0;
            while let Some(message) = get.next(Duration::from_secs(30)).await {
                if message["method"] == "ping" {
                    pings += 1;
                    let answer = serde_json::json!({"jsonrpc": "2.0", "id": message["id"], "result": {}});
                    client.post(answer).await;
                    break;
                }
            }
            pings
        })
    };
    let on_get = serde_json::json!({"count": 1, "on": "get"});
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = client.call_tool("web__burst", on_get.clone()).await;
    assert_eq!(reply["result"]["isError"], true, "no GET stream yet: {reply}");
    // The upstream is redeployed with a GET stream: it restarts, forgetting
    // its sessions; the router initialises a new one, and listens again.
    web.mock.refuse_get(false);
    web.mock.forget_sessions();
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "b"})).await["result"].is_object());
    let listening = eventually(Duration::from_secs(10), || async {
        client.call_tool("web__burst", on_get.clone()).await["result"]["structuredContent"]["answered"] == 1
    })
    .await;
    assert!(listening, "the router's GET stream to the upstream is open again and carries its requests");
    assert_eq!(answering.await.unwrap(), 1);
}

/// A request waits (at most 1 s) for the upstream GET its client's GET just
/// opened; an upstream that takes that GET and never answers it holds up
/// one request of the session, not every one after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_get_stream_never_answered_holds_up_one_request_at_most() {
    let web = MockServer::start(mock_named("web")).await;
    web.mock.hold_get(true);
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "a"})).await["result"].is_object());
    // The catalog's channel to the upstream listens (for list changes).
    let mock = &web.mock;
    let held = |n: u64| eventually(Duration::from_secs(10), move || async move { mock.held_gets() == n });
    assert!(held(1).await, "the catalog asked for its GET stream: {} held", web.mock.held_gets());
    let _get = client.open_stream().await;
    assert!(held(2).await, "the session asked for its GET stream: {} held", web.mock.held_gets());
    let started = std::time::Instant::now();
    let first = client.call_tool("web__echo", serde_json::json!({"text": "b"})).await;
    assert!(first["result"].is_object(), "{first}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "it waited for the GET stream: {waited:?}");
    // Ten more: had each waited as the first did, they would take 10 s.
    let started = std::time::Instant::now();
    for n in 0..10 {
        let reply = client.call_tool("web__echo", serde_json::json!({"text": n.to_string()})).await;
        assert!(reply["result"].is_object(), "{reply}");
    }
    let rest = started.elapsed();
    assert!(rest < Duration::from_secs(5), "the calls after the first did not wait again: {rest:?}");
    assert_eq!(web.mock.held_gets(), 2, "nor was the GET asked for again");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_1_request_without_exactly_one_host_is_refused() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let post = |host: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    for host in ["", "Host: a\r\nHost: b\r\n"] {
        let answer = raw(&router, "127.0.0.1", post(host).as_bytes(), Duration::from_secs(5)).await.expect("answered");
        assert!(answer.starts_with("HTTP/1.1 400"), "{host:?}: {answer}");
        assert!(answer.contains("\"code\":-32600") && answer.contains("Host header"), "{answer}");
    }
    assert_eq!(router.metric("switchboard_http_rejections_total", &["reason=\"missing_host\""]).await, 2.0);
    // With one Host it is served; HTTP/1.0 has no Host to require.
    let answer = raw(&router, "127.0.0.1", post("Host: router\r\n").as_bytes(), Duration::from_secs(5)).await.unwrap();
    assert!(!answer.contains("Host header"), "{answer}");
    let answer = raw(&router, "127.0.0.1", HEALTHZ, Duration::from_secs(5)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let old = raw(&router, "127.0.0.1", b"GET /healthz HTTP/1.0\r\n\r\n", Duration::from_secs(5)).await.unwrap();
    assert!(old.starts_with("HTTP/1.0 200"), "{old}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_is_bounded_and_timed_like_the_mcp_listener() {
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-admin-"));
    std::fs::create_dir_all(&dir).unwrap();
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let token = "an-admin-token-of-some-length";
    let config = format!(
        "[server]\nheader_timeout = \"1s\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{token}\"\n\
         [database]\nurl = \"sqlite:{}\"\n",
        dir.join("switchboard.db").display()
    );
    let (process, mcp_port) = router_process(&config).await;
    let admin: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let connect = |source: &'static str| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        socket.connect(admin).await.unwrap()
    };
    let _ = process;
    // A silent connection is closed after header_timeout.
    let mut silent = connect("127.0.0.1").await;
    assert_eq!(read_until_closed(&mut silent, Duration::from_secs(5)).await.as_deref(), Some(""));
    // 64 from one address are kept; the next is refused at once.
    let mut held = Vec::new();
    for _ in 0..64 {
        held.push(connect("127.0.0.1").await);
    }
    let mut refused = connect("127.0.0.1").await;
    let answer = read_until_closed(&mut refused, Duration::from_secs(5)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    // Another address is served.
    let mut other = connect("127.0.0.2").await;
    let request = format!(
        "GET /v1/tenants HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    other.write_all(request.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut other, Duration::from_secs(5)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let metrics = switchboard_test_support::get_text(&format!("http://127.0.0.1:{mcp_port}/metrics")).await;
    let sample = |name: &str| {
        metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(sample("switchboard_admin_connections_refused_total{reason=\"per_address\"}"), Some(1.0));
    // The silent one at least (the 64 held follow it after their second).
    assert!(sample("switchboard_admin_connections_closed_total{reason=\"header_timeout\"}").is_some_and(|n| n >= 1.0));
    drop(held);
}

/// `count` pings on the session's GET stream at once, which the client
/// reads and answers: every one answered by the client or refused back by
/// the router (-32603), and each refusal counted.
async fn burst_on_the_get_stream(router: &Router, web: &MockServer, client: &Client, count: u64) {
    // The router opens the session's GET stream to the upstream in the
    // background (besides its own catalog channel's).
    let listening = web.mock.listening_sessions();
    let mut get = client.open_stream().await;
    assert!(eventually(Duration::from_secs(10), || async { web.mock.listening_sessions() > listening }).await);
    let reader = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut received = 0u64;
            while let Some(message) = get.next(Duration::from_secs(5)).await {
                if message["method"] == "ping" {
                    received += 1;
                    let answer = serde_json::json!({"jsonrpc": "2.0", "id": message["id"], "result": {}});
                    assert_eq!(client.post(answer).await.status, StatusCode::ACCEPTED);
                }
            }
            received
        })
    };
    let before = router.metric("switchboard_relay_dropped_total", &["reason=\"client_backlog\""]).await;
    let arguments = serde_json::json!({"count": count, "on": "get"});
    let reply = client.call("tools/call", serde_json::json!({"name": "web__burst", "arguments": arguments})).await;
    let tally = reply["result"]["structuredContent"].clone();
    let received = reader.await.unwrap();
    let refused = tally["errors"]["-32603"].as_u64().unwrap_or(0);
    assert_eq!(tally["missing"], 0, "{tally}");
    assert_eq!(tally["answered"].as_u64().unwrap(), received, "{tally}");
    assert_eq!(received + refused, count, "{tally}");
    let after = router.metric("switchboard_relay_dropped_total", &["reason=\"client_backlog\""]).await;
    assert_eq!(after - before, refused as f64);
    eprintln!("burst of {count} on the GET stream: {received} relayed, {refused} refused back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_get_stream_kept_in_redis_is_relayed_or_refused_back_every_one_counted() {
    let web = MockServer::start(MockOptions { burst_tool: true, ..mock_named("web") }).await;
    let redis = switchboard_test_support::services::redis_url();
    let prefix = switchboard_test_support::services::unique("sbtest:");
    let extra = format!("[sessions]\nstore = \"redis\"\n[redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n");
    let router = Router::start(&format!("{extra}{}", http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    // The session's upstream session, so that there is one to listen on.
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "a"})).await["result"].is_object());
    burst_on_the_get_stream(&router, &web, &client, 3000).await;
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "ok"})).await["result"].is_object());
}
