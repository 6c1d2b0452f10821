//! Hot reload of the configuration file, on the router process: a tenant
//! removed and added back (its key stops, then works again), a broken file
//! refused with the running configuration kept, SIGHUP reading the file
//! again, `log.level` applied, a section that needs a restart reported as
//! pending; a session and a call in flight across all of it; the admin API
//! telling which version runs. And upstreams added, removed and changed
//! while a session holds and calls are in flight, its client told with
//! `list_changed`.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::peers::{closed_port, Process};
use switchboard_test_support::services::unique;
use switchboard_test_support::{eventually, get_text, get_text_with, http_upstream, mock_named, Client, MockServer};

use super::tenancy::admin_for;

/// Warnings, and the line saying where the router listens.
const WARN: &str = "warn,switchboard_router::server=info";

/// The router's configuration: tenant acme always, beta when `beta`.
fn config(dir: &Path, admin_port: u16, good: &str, beta: bool, level: &str, extra: &str) -> String {
    format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[log]\nlevel = \"{level}\"\nformat = \"json\"\n\
         [database]\nurl = \"sqlite://{db}?mode=rwc\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken = \"an-admin-token-for-tests\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"good\"]\n{beta}{upstream}{extra}",
        db = dir.join("router.db").display(),
        spool = dir.join("audit.spool").display(),
        beta = if beta { "[[tenants]]\nname = \"beta\"\nupstreams = [\"good\"]\n" } else { "" },
        upstream = http_upstream("good", good, ""),
    )
}

async fn status_of(client: &Client) -> u16 {
    client.post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await.status.as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_file_reloads_tenants_and_log_level_and_refuses_a_broken_one_with_sessions_untouched() {
    let dir = std::env::temp_dir().join(unique("sb-reload-"));
    std::fs::create_dir_all(&dir).unwrap();
    let good = MockServer::start(mock_named("good")).await;
    let (socket, admin_port) = closed_port();
    drop(socket);
    let file = dir.join("router.toml");
    let write = |text: String| std::fs::write(&file, text).unwrap();
    write(config(&dir, admin_port, &good.url, true, WARN, ""));
    let admin = admin_for(&std::fs::read_to_string(&file).unwrap()).await;
    let acme_key = admin.create_key("acme", None).await.unwrap().key;
    let beta_key = admin.create_key("beta", None).await.unwrap().key;
    let (router, addr) = Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    let url = format!("http://{addr}/mcp");
    let admin_api = format!("http://127.0.0.1:{admin_port}/v1/config");
    let version = || async {
        let text = get_text_with(&admin_api, &[("authorization", "Bearer an-admin-token-for-tests")]).await;
        serde_json::from_str::<Value>(&text).unwrap()
    };
    let metric = |result: &'static str| {
        let url = format!("http://{addr}/metrics");
        async move {
            let text = get_text(&url).await;
            let line = format!("switchboard_config_reloads_total{{result=\"{result}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0.0, |v| v.parse().unwrap())
        }
    };
    let first = version().await;
    assert_eq!(first["pending_restart"], json!([]), "{first}");

    // A session of acme's, and a call of it in flight through the reloads.
    let mut acme = Client::with_key(&url, &acme_key);
    acme.initialize().await;
    let mut beta = Client::with_key(&url, &beta_key);
    beta.initialize().await;
    assert_eq!(status_of(&beta).await, 200);
    let in_flight = {
        let acme = acme.clone();
        tokio::spawn(async move { acme.call_tool("good__sleep", json!({"ms": 5000})).await })
    };

    // beta removed from the file: its key stops working, within the poll.
    write(config(&dir, admin_port, &good.url, false, WARN, ""));
    let gone = eventually(Duration::from_secs(10), || async { status_of(&beta).await == 401 }).await;
    assert!(gone, "beta's key still works after beta left the file");
    let second = version().await;
    assert_ne!(second["version"], first["version"]);
    assert_eq!(metric("applied").await, 1.0);

    // A broken file: refused, logged, counted; the running configuration kept.
    write(config(&dir, admin_port, &good.url, true, WARN, "[server]\nmax_sessions = \"many\"\n"));
    let refused = eventually(Duration::from_secs(10), || async { metric("refused").await >= 1.0 }).await;
    assert!(refused, "the broken file was not refused");
    assert_eq!(status_of(&beta).await, 401, "a refused file changed the tenants");
    let third = version().await;
    assert_eq!(third["version"], second["version"]);
    assert!(third["last_refusal"].as_str().unwrap().contains("server.max_sessions"), "{third}");
    assert!(
        router.output().iter().any(|l| l.contains("configuration file refused") && l.contains("server.max_sessions")),
        "no log line says why"
    );

    // Fixed, with beta back, debug logs, and a change only a restart
    // applies: beta's key works again, the level is applied, the section
    // is reported pending.
    write(config(
        &dir,
        admin_port,
        &good.url,
        true,
        "warn,switchboard_router=debug",
        "[server]\nmax_sessions = 5000\n",
    ));
    let back = eventually(Duration::from_secs(10), || async { status_of(&beta).await == 200 }).await;
    assert!(back, "beta's key does not work again");
    let fourth = version().await;
    assert_eq!(fourth["pending_restart"], json!(["server"]), "{fourth}");
    assert!(fourth["last_refusal"].is_null(), "{fourth}");
    acme.post(json!({"jsonrpc": "2.0", "id": 5, "method": "ping"})).await;
    let debug = eventually(Duration::from_secs(5), || async {
        router.output().iter().any(|l| l.contains("\"DEBUG\"") && l.contains("request finished"))
    })
    .await;
    assert!(debug, "log.level was not applied");

    // SIGHUP reads the file again (the same text: nothing to apply).
    let unchanged = metric("unchanged").await;
    let pid = router.child.id().unwrap();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    let reread = eventually(Duration::from_secs(5), || async { metric("unchanged").await > unchanged }).await;
    assert!(reread, "SIGHUP did not read the file again");

    // The call in flight and the session went through it all.
    let answer = in_flight.await.unwrap();
    assert!(answer["result"].is_object(), "{answer}");
    assert_eq!(status_of(&acme).await, 200);
    drop(router);
}

/// The upstream-set test's configuration: tenant acme sees every upstream;
/// `upstreams` are `[[upstreams]]` entries.
fn set_config(dir: &Path, admin_port: u16, upstreams: &str) -> String {
    format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[log]\nlevel = \"{WARN},switchboard_router::upstream_set=info\"\nformat = \"json\"\n\
         [server]\nshutdown_grace = \"1s\"\n\
         [database]\nurl = \"sqlite://{db}?mode=rwc\"\nrefresh = \"200ms\"\n[audit]\nspool = \"{spool}\"\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken = \"an-admin-token-for-tests\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"*\"]\n{upstreams}",
        db = dir.join("router.db").display(),
        spool = dir.join("audit.spool").display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_are_added_removed_and_changed_while_a_session_holds_and_calls_are_in_flight() {
    let dir = std::env::temp_dir().join(unique("sb-reload-set-"));
    std::fs::create_dir_all(&dir).unwrap();
    let (good, old, new) = tokio::join!(
        MockServer::start(mock_named("good")),
        MockServer::start(mock_named("old")),
        MockServer::start(mock_named("new"))
    );
    let (socket, admin_port) = closed_port();
    drop(socket);
    let file = dir.join("router.toml");
    let write = |text: String| std::fs::write(&file, text).unwrap();
    let before = format!("{}{}", http_upstream("good", &good.url, ""), http_upstream("old", &old.url, ""));
    write(set_config(&dir, admin_port, &before));
    let admin = admin_for(&std::fs::read_to_string(&file).unwrap()).await;
    let key = admin.create_key("acme", None).await.unwrap().key;
    let (router, addr) = Process::spawn_announced(
        &switchboard_test_support::router_binary(),
        &["serve", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0"],
        &[],
        "switchboard listening on",
    )
    .await;
    let url = format!("http://{addr}/mcp");
    let metrics_url = format!("http://{addr}/metrics");
    let metrics = || get_text(&metrics_url);

    let mut client = Client::with_key(&url, &key);
    client.initialize().await;
    let mut stream = client.open_stream().await;
    let names = client.tool_names().await;
    assert!(names.contains(&"good__echo".to_string()) && names.contains(&"old__echo".to_string()), "{names:?}");
    // Both upstreams hold an upstream session of this session's.
    assert!(client.call_tool("good__echo", json!({"text": "a"})).await["result"].is_object());
    assert!(client.call_tool("old__echo", json!({"text": "a"})).await["result"].is_object());
    let good_sessions = good.mock.initialize_count();
    // Calls in flight to the upstream that stays and to the one that goes.
    let to_good = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("good__sleep", json!({"ms": 2000})).await })
    };
    let to_old = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("old__sleep", json!({"ms": 2000})).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // "old" removed, "new" added, "good" changed (a longer timeout).
    let after =
        format!("{}{}", http_upstream("good", &good.url, "timeout = \"45s\""), http_upstream("new", &new.url, ""));
    write(set_config(&dir, admin_port, &after));

    // The client hears that its tool list changed, on its session's stream.
    let mut heard = false;
    while let Some(message) = stream.next(Duration::from_secs(10)).await {
        if message["method"] == "notifications/tools/list_changed" {
            heard = true;
            break;
        }
    }
    assert!(heard, "no notifications/tools/list_changed after the upstreams changed");
    let names = client.tool_names().await;
    assert!(names.contains(&"new__echo".to_string()), "the added upstream's tools are not listed: {names:?}");
    assert!(names.contains(&"good__echo".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("old__")), "the removed upstream's tools are listed: {names:?}");

    // Both calls in flight finish, the one to the removed upstream too.
    let (to_good, to_old) = (to_good.await.unwrap(), to_old.await.unwrap());
    assert!(to_good["result"].is_object(), "{to_good}");
    assert!(to_old["result"].is_object(), "the call in flight to the removed upstream failed: {to_old}");

    // The same session calls the added upstream and the changed one (a new
    // upstream session: its settings changed); the removed one is unknown.
    let answer = client.call_tool("new__echo", json!({"text": "hello"})).await;
    assert!(answer["result"].is_object(), "{answer}");
    assert_eq!(new.mock.call_count(), 1, "the added upstream did not get the call");
    let answer = client.call_tool("good__echo", json!({"text": "again"})).await;
    assert!(answer["result"].is_object(), "{answer}");
    // Two new upstream sessions: the catalog's (it lists the changed
    // upstream afresh) and the client session's.
    assert_eq!(good.mock.initialize_count(), good_sessions + 2, "the changed upstream kept its old upstream sessions");
    let answer = client.call_tool("old__echo", json!({"text": "gone"})).await;
    assert!(answer["error"].is_object(), "{answer}");

    // Its grace over, the removed upstream's upstream sessions (the
    // catalog's and the client session's) are ended and its gauges leave
    // /metrics.
    let ended = eventually(Duration::from_secs(10), || async { old.mock.deleted_sessions() == 2 }).await;
    assert!(ended, "the removed upstream's sessions were not ended: {} of 2", old.mock.deleted_sessions());
    let gone = eventually(Duration::from_secs(5), || async {
        !metrics().await.contains("switchboard_upstream_up{upstream=\"old\"}")
    })
    .await;
    assert!(gone, "the removed upstream is still reported up or down");
    let text = metrics().await;
    assert!(text.contains("switchboard_config_reloads_total{result=\"applied\"} 1"), "{text}");
    // The session let go of its channel to it: that upstream session's
    // duration is measured (and nothing of it stays in the session).
    let port = old.addr.port();
    let measured = text.lines().any(|l| {
        l.starts_with("mcp_client_session_duration_seconds_count{")
            && l.contains(&format!("server_port=\"{port}\""))
            && l.ends_with(" 1")
    });
    assert!(measured, "the session's upstream session with the removed upstream was not ended by the session");

    // The admin API: nothing pending, the tenants' upstreams follow the set.
    let config = get_text_with(
        &format!("http://127.0.0.1:{admin_port}/v1/config"),
        &[("authorization", "Bearer an-admin-token-for-tests")],
    )
    .await;
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["pending_restart"], json!([]), "{config}");
    let status = client.post(json!({"jsonrpc": "2.0", "id": 9, "method": "ping"})).await.status;
    assert_eq!(status.as_u16(), 200, "the session did not survive");
    assert!(router.output().iter().any(|l| l.contains("upstreams changed")), "no log line says the upstreams changed");
    drop(router);
}
