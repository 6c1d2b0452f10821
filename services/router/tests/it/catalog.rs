//! The aggregated catalogs: list changes and the cache, composite cursors
//! across upstreams and across changes, colliding and long names.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::{eventually, http_upstream, mock_named, Client, MockOptions, MockServer, Router};

use super::routing::{config, router_with_web_and_local, text_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_invalidates_the_cache_and_tells_the_client_once() {
    let (router, _web) = router_with_web_and_local().await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let mut stream = client.open_stream().await;
    let uri = "web+mock://web/hello";
    assert_eq!(client.call("resources/subscribe", json!({"uri": uri})).await["result"], json!({}));
    let before = client.tool_names().await;
    assert!(!before.contains(&"web__fresh".to_owned()));
    client.call_tool("web__add_tool", json!({"name": "fresh"})).await;
    let note = stream.next(Duration::from_secs(10)).await.expect("a list_changed notification");
    assert_eq!(note["method"], "notifications/tools/list_changed");
    // Reported by the control session and by the client's own upstream
    // session: told once. A resource update made afterwards is the next
    // message, not a second list_changed.
    let told = client.call_tool("web__touch", json!({"uri": "mock://web/hello"})).await;
    assert_eq!(text_of(&told), "told 1 subscribers", "{told}");
    let next = stream.next(Duration::from_secs(10)).await.expect("the resource update");
    assert_eq!(next["method"], "notifications/resources/updated", "the change is announced once: {next}");
    let after = client.tool_names().await;
    assert!(after.contains(&"web__fresh".to_owned()), "{after:?}");
    assert_eq!(text_of(&client.call_tool("web__fresh", json!({"k": "v"})).await), r#"{"k":"v"}"#);
    router.stop().await;
}

/// Every tool name `client` lists, following cursors (pages at most `max`
/// long), and the number of pages.
async fn page_through(client: &Client, max: usize) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = client.call("tools/list", params).await;
        let tools = page["result"]["tools"].as_array().unwrap_or_else(|| panic!("{page}"));
        assert!(tools.len() <= max);
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        pages += 1;
        match page["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (names, pages),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_cursors_page_through_every_upstream() {
    // The upstream itself paginates (pages of 4); the router follows its
    // cursors, then serves pages of 5 across both upstreams.
    let a = MockServer::start(MockOptions { extra_tools: 7, page_size: 4, ..mock_named("a") }).await;
    let b = MockServer::start(MockOptions { extra_tools: 3, ..mock_named("b") }).await;
    let upstreams = format!("{}{}", http_upstream("a", &a.url, ""), http_upstream("b", &b.url, ""));
    let router = Router::start(&format!("[catalog]\npage_size = 5\n{upstreams}")).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let (names, pages) = page_through(&client, 5).await;
    // Every tool of each upstream once, as the upstreams list them directly.
    let direct = |url: String| async move {
        let mut c = Client::new(&url);
        c.initialize().await;
        page_through(&c, usize::MAX).await.0
    };
    let (on_a, on_b) = (direct(a.url.clone()).await, direct(b.url.clone()).await);
    assert!(on_a.len() > 5 && on_b.len() > 5, "more than a page each: {on_a:?} {on_b:?}");
    let mut expected: Vec<String> =
        on_a.iter().map(|n| format!("a__{n}")).chain(on_b.iter().map(|n| format!("b__{n}"))).collect();
    let mut sorted = names.clone();
    expected.sort();
    sorted.sort();
    assert_eq!(sorted, expected);
    assert_eq!(pages, names.len().div_ceil(5));
    let unique: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "no duplicates across pages");
    assert!(names.contains(&"a__tool_6".to_owned()) && names.contains(&"b__tool_2".to_owned()));
    assert!(names.iter().position(|n| n.starts_with("a__")) < names.iter().position(|n| n.starts_with("b__")));

    let bad = client.call("tools/list", json!({"cursor": "not-a-cursor"})).await;
    assert_eq!(bad["error"]["code"], -32602);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colliding_names_are_reported_and_the_first_upstream_wins() {
    let first = MockServer::start(mock_named("first")).await;
    let second = MockServer::start(mock_named("second")).await;
    let upstreams = format!(
        "{}{}",
        http_upstream("first", &first.url, "prefix = \"\""),
        http_upstream("second", &second.url, "prefix = \"\"")
    );
    let router = Router::start(&config(&upstreams)).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let names = client.tool_names().await;
    assert_eq!(names.iter().filter(|n| *n == "echo").count(), 1, "{names:?}");
    let mut direct = Client::new(&first.url);
    direct.initialize().await;
    assert_eq!(
        names.len(),
        direct.tool_names().await.len(),
        "the second upstream's identical names are left out, not merged"
    );
    client.call_tool("echo", json!({})).await;
    assert_eq!(first.mock.call_count(), 1);
    assert_eq!(second.mock.call_count(), 0);
    assert!(router.metric("switchboard_catalog_collisions_total", &["list=\"tools\""]).await >= 15.0);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_names_are_shortened_and_still_callable() {
    let web = MockServer::start(mock_named("web")).await;
    let prefix = "a_rather_long_upstream_prefix_for_testing";
    let router = Router::start(&config(&http_upstream("web", &web.url, &format!("prefix = \"{prefix}\"")))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    client.call_tool(&format!("{prefix}__add_tool"), json!({"name": "an_even_longer_tool_name_that_goes_on"})).await;
    // The upstream announces the new tool on its GET stream, which may reach
    // the router after the call's answer: list until it shows.
    assert!(
        eventually(Duration::from_secs(5), || async { client.tool_names().await.iter().any(|n| n.len() == 64) }).await,
        "the added tool never showed: {:?}",
        client.tool_names().await
    );
    let names = client.tool_names().await;
    assert!(
        names.iter().all(|n| n.len() <= 64 && n.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c))),
        "{names:?}"
    );
    let short = names.iter().find(|n| n.len() == 64).expect("a shortened name");
    assert_eq!(text_of(&client.call_tool(short, json!({"via": "short"})).await), r#"{"via":"short"}"#);
    router.stop().await;
}

/// Every tool name `client` lists from page `cursor` on, as `page_through`
/// does from the start.
async fn page_from(client: &Client, mut cursor: Option<String>) -> Result<Vec<String>, Value> {
    let mut names = Vec::new();
    loop {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let page = client.call("tools/list", params).await;
        let Some(tools) = page["result"]["tools"].as_array() else { return Err(page) };
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        match page["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return Ok(names),
        }
    }
}

/// The first `pages` pages: their names and the cursor of the next.
async fn first_pages(client: &Client, pages: usize) -> (Vec<String>, String) {
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..pages {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let page = client.call("tools/list", params).await;
        names
            .extend(page["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        cursor = Some(page["result"]["nextCursor"].as_str().expect("more pages").to_owned());
    }
    (names, cursor.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_collide_only_after_sanitising_are_not_merged() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    let collisions = || router.metric("switchboard_catalog_collisions_total", &["list=\"tools\""]);
    let before = collisions().await;
    // `a_b` is listed before `a b`, `x y` before `x_y`; `marker` last, so
    // that a list showing it was fetched after all of them.
    for name in ["a_b", "a b", "x y", "x_y", "marker"] {
        client.call_tool("web__add_tool", json!({"name": name})).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || async { client.tool_names().await.contains(&"web__marker".into()) })
            .await
    );
    let names = client.tool_names().await;
    assert_eq!(names.iter().filter(|n| *n == "web__a_b").count(), 1, "{names:?}");
    assert_eq!(names.iter().filter(|n| *n == "web__x_y").count(), 1, "{names:?}");
    assert!(names.iter().all(|n| !n.contains(' ')), "{names:?}");
    assert!(collisions().await >= before + 2.0, "both left-out names are counted");
    // Each exposed name reaches the item listed first, by its own name.
    client.call_tool("web__a_b", json!({})).await;
    client.call_tool("web__x_y", json!({})).await;
    assert_eq!(web.mock.called_tools(), vec!["a_b".to_owned(), "x y".to_owned()]);
    // The unsanitised name is no tool of the router's.
    let unknown = client.call_tool("web__a b", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_stays_good_when_lists_grow_between_pages() {
    let a = MockServer::start(MockOptions { extra_tools: 7, ..mock_named("a") }).await;
    let b = MockServer::start(MockOptions { extra_tools: 3, ..mock_named("b") }).await;
    let upstreams = format!("{}{}", http_upstream("a", &a.url, ""), http_upstream("b", &b.url, ""));
    let router = Router::start(&format!("[catalog]\npage_size = 5\n{upstreams}")).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    // Two pages into `a`; then both upstreams add a tool.
    let (mut names, cursor) = first_pages(&client, 2).await;
    assert!(names.iter().all(|n| n.starts_with("a__")));
    client.call_tool("a__add_tool", json!({"name": "a_new"})).await;
    client.call_tool("b__add_tool", json!({"name": "b_new"})).await;
    let mut fresh = Client::new(&router.url);
    fresh.initialize().await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            let all = page_from(&fresh, None).await.unwrap();
            all.contains(&"a__a_new".into()) && all.contains(&"b__b_new".into())
        })
        .await
    );
    // The old cursor goes on where it was: every tool once, the new ones too.
    names.extend(page_from(&client, Some(cursor)).await.expect("the cursor is still good"));
    let mut expected = page_from(&fresh, None).await.unwrap();
    assert_eq!(names.len(), expected.len(), "nothing twice, nothing skipped: {names:?}");
    names.sort();
    expected.sort();
    assert_eq!(names, expected);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_into_an_upstream_that_left_asks_to_start_again() {
    let a = MockServer::start(MockOptions { extra_tools: 2, ..mock_named("a") }).await;
    // `b` speaks 2026-07-28 with lists good for 200 ms, so the router asks
    // it again soon after it goes away.
    let mut options = MockOptions { extra_tools: 7, ..mock_named("b") };
    options.modern = true;
    options.modern_only = true;
    options.list_ttl_ms = 200;
    let mut b = MockServer::start(options).await;
    let upstreams = format!("{}{}", http_upstream("a", &a.url, ""), http_upstream("b", &b.url, ""));
    let router = Router::start(&format!("[catalog]\npage_size = 5\nretry_after = \"1h\"\n{upstreams}")).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    // Pages until one ends inside `b`'s tools.
    let mut pages = 1;
    let cursor = loop {
        let (names, cursor) = first_pages(&client, pages).await;
        if names.last().is_some_and(|n| n.starts_with("b__")) {
            break cursor;
        }
        pages += 1;
    };
    b.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let answer = loop {
        let page = client.call("tools/list", json!({"cursor": cursor})).await;
        if page["error"].is_object() {
            break page;
        }
        assert!(std::time::Instant::now() < deadline, "the cursor's upstream never left the list: {page}");
        // Polling: the router asks `b` again once its list's 200 ms are over.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("start again"), "{answer}");
    // Started again: `a`'s tools, without `b`'s.
    let names = page_from(&client, None).await.unwrap();
    assert!(!names.is_empty() && names.iter().all(|n| n.starts_with("a__")), "{names:?}");
    assert!(router.metric("switchboard_catalog_upstream_failures_total", &["upstream=\"b\""]).await >= 1.0);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_come_from_the_cache_until_an_upstream_says_they_changed() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let refreshes = || router.metric("switchboard_catalog_refreshes_total", &["upstream=\"web\"", "list=\"tools\""]);
    let mut one = Client::new(&router.url);
    one.initialize().await;
    let listed = one.tool_names().await;
    let fetched = refreshes().await;
    assert!(fetched >= 1.0);
    // More lists, from this client and another: no fetch.
    let mut two = Client::new(&router.url);
    two.initialize().await;
    for c in [&one, &two, &one, &two] {
        assert_eq!(c.tool_names().await, listed);
    }
    assert_eq!(refreshes().await, fetched, "served from the cache");
    // A change: fetched once more, then cached again.
    one.call_tool("web__add_tool", json!({"name": "fresh"})).await;
    assert!(
        eventually(Duration::from_secs(10), || async { two.tool_names().await.contains(&"web__fresh".into()) }).await
    );
    let after = refreshes().await;
    assert!(after > fetched);
    for c in [&one, &two, &one] {
        assert!(c.tool_names().await.contains(&"web__fresh".into()));
    }
    assert_eq!(refreshes().await, after, "cached again");
    router.stop().await;
}
