//! Progressive discovery: a tenant subscribed to upstreams with more than a
//! thousand tools gets three meta-tools in `tools/list`; the official
//! Python SDK finds a tool through search (only among the tools the tenant
//! may use), describes it and calls it through the call meta-tool, which
//! reaches the upstream as the tool's own call (audited as it). A tenant in
//! the default mode keeps the whole list and has no meta-tools.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use switchboard_core::policy::{Discovery, Policy, ToolFilter};
use switchboard_test_support::peers::run_python_client;
use switchboard_test_support::services::unique;
use switchboard_test_support::{eventually, http_upstream, mock_named, Client, MockServer, Router};

use super::tenancy::admin_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_finds_a_tool_among_a_thousand_through_search_and_calls_it() {
    let (alpha, beta) = tokio::join!(
        MockServer::start(switchboard_test_support::MockOptions { extra_tools: 700, ..mock_named("alpha") }),
        MockServer::start(switchboard_test_support::MockOptions { extra_tools: 700, ..mock_named("beta") })
    );
    let dir = std::env::temp_dir().join(unique("sb-discovery-"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n\
         [database]\nurl = \"sqlite:{db}?mode=rwc\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\nflush_every = \"20ms\"\n{}{}",
        http_upstream("alpha", &alpha.url, ""),
        http_upstream("beta", &beta.url, ""),
        db = dir.join("router.db").display(),
        spool = dir.join("audit.spool").display(),
    );
    let admin = admin_for(&config).await;
    // `big` searches; it may not use beta's `add`, so alpha's is the match.
    let mut tools = BTreeMap::new();
    tools.insert("beta".to_owned(), ToolFilter { allow: vec![], deny: vec!["add".into()] });
    let progressive =
        Policy { upstreams: vec!["*".into()], tools, discovery: Discovery::Progressive, ..Policy::default() };
    admin.create_tenant("big", progressive).await.unwrap();
    admin.create_tenant("plain", Policy { upstreams: vec!["*".into()], ..Policy::default() }).await.unwrap();
    let big = admin.create_key("big", None).await.unwrap().key;
    let plain = admin.create_key("plain", None).await.unwrap().key;
    let router = Router::start(&config).await;

    let out = run_python_client("discover.py", &[&router.url, &big, "add two numbers", r#"{"a": 2, "b": 3}"#]).await;
    assert_eq!(
        out["tools"],
        json!(["switchboard__search_tools", "switchboard__describe_tool", "switchboard__call_tool"]),
        "{out}"
    );
    assert_eq!(out["found"][0], "alpha__add", "{out}");
    assert!(
        !out["found"].as_array().unwrap().contains(&json!("beta__add")),
        "a tool the tenant may not use was found: {out}"
    );
    assert_eq!(out["described"]["inputSchema"]["required"], json!(["a", "b"]), "{out}");
    assert_eq!(out["result"]["content"][0]["text"], "5", "{out}");
    assert_eq!(alpha.mock.call_count(), 1, "the call reached the upstream as alpha's add");

    // Counted: the search found something; the call was of its first result.
    let found = router.metric("switchboard_discovery_searches_total", &["result=\"found\""]).await;
    assert!(found >= 1.0, "{found}");
    assert_eq!(router.metric("switchboard_discovery_calls_total", &["rank=\"1\""]).await, 1.0);
    // Audited as the tool itself.
    let audited = eventually(Duration::from_secs(5), || async {
        let records = admin.audit(&switchboard_db::AuditQuery { limit: 1000, ..Default::default() }).await.unwrap();
        records.iter().any(|(_, r)| r.target.as_deref() == Some("alpha__add") && r.tenant.as_deref() == Some("big"))
    })
    .await;
    let records = admin.audit(&switchboard_db::AuditQuery { limit: 1000, ..Default::default() }).await.unwrap();
    let seen: Vec<_> = records.iter().map(|(_, r)| (r.method.clone(), r.target.clone(), r.tenant.clone())).collect();
    assert!(audited, "the call through the meta-tool is not audited as alpha__add: {seen:?}");

    // A raw client of `big`: a search with nothing to find, an unknown
    // tool to describe, a call of a tool it may not use.
    let mut client = Client::with_key(&router.url, &big);
    client.initialize().await;
    let none = client.call_tool("switchboard__search_tools", json!({"query": "zzzqqq"})).await;
    assert_eq!(none["result"]["structuredContent"]["tools"], json!([]), "{none}");
    let unknown = client.call_tool("switchboard__describe_tool", json!({"name": "beta__add"})).await;
    assert_eq!(unknown["result"]["isError"], true, "{unknown}");
    let refused =
        client.call_tool("switchboard__call_tool", json!({"name": "beta__add", "arguments": {"a": 1, "b": 1}})).await;
    assert!(refused["error"]["message"].as_str().unwrap_or("").contains("beta__add"), "{refused}");
    let bad = client.call_tool("switchboard__call_tool", json!({"arguments": {}})).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // Tools found may be called directly too.
    let direct = client.call_tool("alpha__add", json!({"a": 1, "b": 1})).await;
    assert_eq!(direct["result"]["content"][0]["text"], "2", "{direct}");

    // The default mode: the whole list, no meta-tools.
    let mut whole = Client::with_key(&router.url, &plain);
    whole.initialize().await;
    let names = whole.tool_names().await;
    assert!(names.len() > 1400, "{}", names.len());
    assert!(!names.iter().any(|n| n.starts_with("switchboard__")), "meta-tools listed in the default mode");
    let not_here = whole.call_tool("switchboard__search_tools", json!({"query": "add"})).await;
    assert!(not_here["error"].is_object(), "{not_here}");
    let not_here =
        whole.call_tool("switchboard__call_tool", json!({"name": "alpha__add", "arguments": {"a": 1, "b": 1}})).await;
    assert!(not_here["error"]["message"].as_str().unwrap_or("").contains("switchboard__call_tool"), "{not_here}");
    router.stop().await;
}
