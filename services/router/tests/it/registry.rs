//! The upstream registry: an upstream added through the admin API of one
//! replica serves calls through another within seconds, its headers sealed
//! in the database and never shown; removed, its tools leave every catalog
//! with `list_changed`; entries the registry does not take are refused;
//! the CLI lists it.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::services::{redis_url, unique, TempDatabase};
use switchboard_test_support::{eventually, mock_named, Client, MockServer, Router};

use super::keys::reqwest_like::Http;
use super::tenancy::admin_for;

/// Until the next `notifications/tools/list_changed` on `stream`, at most 10 s.
async fn hears_tools_changed(stream: &mut switchboard_test_support::EventStream) -> bool {
    while let Some(message) = stream.next(Duration::from_secs(10)).await {
        if message["method"] == "notifications/tools/list_changed" {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_registered_on_one_replica_serves_through_another_and_leaves_every_catalog_when_removed() {
    let mut options = mock_named("fresh");
    options.whoami = true;
    let fresh = MockServer::start(options).await;
    let db = TempDatabase::create().await;
    let vault_key = switchboard_vault::Key::generate();
    let dir = std::env::temp_dir().join(unique("sb-registry-"));
    std::fs::create_dir_all(&dir).unwrap();
    // A long refresh: on PostgreSQL, a change arrives by notification.
    let config = |spool: &str| {
        format!(
            "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n\
             [database]\nurl = \"{db}\"\nrefresh = \"60s\"\n[audit]\nspool = \"{spool}\"\n\
             [sessions]\nstore = \"redis\"\ncache = \"100ms\"\n[redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\
             [vault]\nkey = \"{vault_key}\"\n\
             [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"an-admin-token-for-tests\"\n\
             [[tenants]]\nname = \"acme\"\nupstreams = [\"*\"]\n",
            db = db.url,
            spool = dir.join(spool).display(),
            redis = redis_url(),
            prefix = unique("sbtest:"),
        )
    };
    let admin = admin_for(&config("cli.spool")).await;
    let key = admin.create_key("acme", None).await.unwrap().key;
    let (a, b) = (Router::start(&config("a.spool")).await, Router::start(&config("b.spool")).await);
    let http = Http::new("an-admin-token-for-tests");
    let api = format!("http://{}/v1/upstreams", a.admin_addr.expect("the admin API"));

    // A client of B, listening on its session's stream.
    let mut client = Client::with_key(&b.url, &key);
    client.initialize().await;
    let mut stream = client.open_stream().await;
    assert!(client.tool_names().await.is_empty());

    // Registered through A's admin API, with a header for the upstream.
    let entry = json!({"transport": "http", "url": fresh.url, "headers": {"Authorization": "Bearer registry-secret"}});
    let (status, body) = http.send("PUT", &format!("{api}/fresh"), entry.clone()).await;
    assert_eq!(status.as_u16(), 201, "{body}");
    assert_eq!(body["headers"], json!(["Authorization"]), "{body}");
    assert!(!body.to_string().contains("registry-secret"), "the header's value was shown: {body}");

    // B serves it within seconds: its client is told, lists it, calls it,
    // and the call carries the registered header.
    assert!(hears_tools_changed(&mut stream).await, "B's client was not told of the new upstream");
    let names = client.tool_names().await;
    assert!(names.contains(&"fresh__whoami".to_string()), "{names:?}");
    let answer = client.call_tool("fresh__whoami", json!({})).await;
    let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{answer}"));
    let seen: Value = serde_json::from_str(text).unwrap();
    assert_eq!(seen["authorizations"], json!(["Bearer registry-secret"]), "{seen}");

    // Nothing readable in the database; the API shows how it fares.
    let (_, rows) = admin.db.load_upstreams().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].spec.contains("registry-secret") && !rows[0].sealed.contains("registry-secret"), "{rows:?}");
    let (status, listed) = http.send("GET", &api, Value::Null).await;
    assert_eq!(status.as_u16(), 200, "{listed}");
    assert!(!listed.to_string().contains("registry-secret"), "{listed}");
    let running = listed["upstreams"].as_array().unwrap();
    let entry_of = running.iter().find(|u| u["name"] == "fresh").unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(entry_of["source"], "registry", "{entry_of}");
    assert_eq!(entry_of["up"], true, "{entry_of}");
    assert!(entry_of["tools"].as_u64().unwrap() > 0, "{entry_of}");
    assert_eq!(entry_of["protocol_version"], "2025-11-25", "{entry_of}");
    assert_eq!(listed["registry"][0]["name"], "fresh", "{listed}");

    // The CLI lists it, never a value.
    let file = dir.join("cli.toml");
    std::fs::write(&file, config("cli.spool")).unwrap();
    let out = std::process::Command::new(switchboard_test_support::router_binary())
        .args(["upstreams", "list", "--json", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed[0]["name"], "fresh", "{text}");
    assert_eq!(listed[0]["headers"], json!(["Authorization"]), "{text}");
    assert!(!text.contains("registry-secret"), "{text}");

    // What the registry does not take: a clear 400, nothing stored.
    for (bad, says) in [
        (json!({"transport": "stdio", "command": "/bin/sh"}), "config file"),
        (json!({"transport": "http", "url": "not a url"}), "url"),
        (json!({"transport": "http", "url": fresh.url, "name": "other"}), "renaming"),
        (json!(["not", "an", "object"]), "object"),
    ] {
        let (status, body) = http.send("PUT", &format!("{api}/odd"), bad.clone()).await;
        assert_eq!(status.as_u16(), 400, "{bad} → {body}");
        assert!(body.to_string().contains(says), "{bad} → {body}");
    }
    assert_eq!(admin.db.load_upstreams().await.unwrap().1.len(), 1);

    // Removed: its tools leave B's catalog, and the client is told.
    let (status, body) = http.send("DELETE", &format!("{api}/fresh"), Value::Null).await;
    assert_eq!(status.as_u16(), 204, "{body}");
    assert!(hears_tools_changed(&mut stream).await, "B's client was not told the upstream left");
    let gone = eventually(Duration::from_secs(10), || async { client.tool_names().await.is_empty() }).await;
    assert!(gone, "the removed upstream's tools are still listed at B");
    let answer = client.call_tool("fresh__whoami", json!({})).await;
    assert!(answer["error"].is_object(), "{answer}");
    // And at A, which it was registered through.
    let mut at_a = Client::with_key(&a.url, &key);
    at_a.initialize().await;
    let gone = eventually(Duration::from_secs(10), || async { at_a.tool_names().await.is_empty() }).await;
    assert!(gone, "the removed upstream's tools are still listed at A");
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}
