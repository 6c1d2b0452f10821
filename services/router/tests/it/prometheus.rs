//! The Grafana dashboard and the Prometheus rules in `deploy/`, against a
//! real Prometheus (Debian's, with `promtool`) scraping two routers under
//! load: a healthy one (keys, a tenant's rate limit, SQLite audit, an edge
//! listener) and a broken one (its database, Redis and trace collector
//! unreachable, one upstream never up, one that dies, one slow). The rules
//! pass `promtool check rules`; every recording rule, every dashboard
//! panel's expression and every alert's quantity returns data; and every
//! alert fires in the situation it is for (the lost audit records one
//! excepted: that needs the spool's disk to fail).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use switchboard_test_support::peers::{closed_port, Process};
use switchboard_test_support::services::unique;
use switchboard_test_support::{eventually, get_text, http_upstream, mock_named, Client, MockServer, Router};

use super::tenancy::admin_for;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(path)
}

/// Debian's `prometheus` (scripts/install-peers installs it).
fn program(name: &str) -> PathBuf {
    let path = PathBuf::from("/usr/bin").join(name);
    assert!(path.exists(), "{} is missing: run scripts/install-peers", path.display());
    path
}

/// The value of an instant query (its result vector).
async fn query(prometheus: &str, expr: &str) -> Vec<Value> {
    let url = format!("{prometheus}/api/v1/query?query={}", switchboard_oauth::fetch::form_encode(expr));
    let answer: Value = serde_json::from_str(&get_text(&url).await).unwrap();
    assert_eq!(answer["status"], "success", "{expr}: {answer}");
    answer["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Alerts the test's broken router cannot make fire: audit records lost (the
/// spool's disk failing too) or refused by the database for what they hold.
const QUIET: [&str; 2] = ["SwitchboardAuditRecordsLost", "SwitchboardAuditRecordsRejected"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_rules_return_data_from_a_real_prometheus_and_the_alerts_fire() {
    let rules = deploy("prometheus/rules.yml");
    let checked =
        std::process::Command::new(program("promtool")).arg("check").arg("rules").arg(&rules).output().unwrap();
    assert!(checked.status.success(), "promtool: {}", String::from_utf8_lossy(&checked.stderr));

    // The healthy router: keys, a tenant limited to about one request a
    // second, audit to SQLite, edge devices.
    let dir = std::env::temp_dir().join(unique("sb-prom-"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut options = mock_named("good");
    options.whoami = true;
    let good = MockServer::start(options).await;
    let healthy_config = format!(
        "[auth]\nmode = \"keys\"\n[egress]\nallow = [\"loopback\"]\n[database]\nurl = \"sqlite://{db}?mode=rwc\"\n\
         [audit]\nspool = \"{spool}\"\n[edge]\nlisten = \"127.0.0.1:0\"\n\
         [[tenants]]\nname = \"acme\"\nupstreams = [\"good\"]\n[tenants.limits]\nkey = {{ per_second = 1, burst = 3 }}\n{upstream}",
        db = dir.join("audit.db").display(),
        spool = dir.join("healthy.spool").display(),
        upstream = http_upstream("good", &good.url, ""),
    );
    let admin = admin_for(&healthy_config).await;
    let key = admin.create_key("acme", None).await.unwrap().key;
    let other_key = admin.create_key("acme", None).await.unwrap().key;
    let healthy = Router::start(&healthy_config).await;

    // The broken one: nothing it depends on answers.
    let (_held, dead) = closed_port();
    let mut flaky = MockServer::start(mock_named("flaky")).await;
    let slow = MockServer::start(mock_named("slow")).await;
    let broken_config = format!(
        "[database]\nurl = \"postgres://postgres@127.0.0.1:{dead}/gone\"\nconnect_timeout = \"1s\"\n\
         [audit]\nspool = \"{spool}\"\n[redis]\nurl = \"redis://127.0.0.1:{dead}\"\n\
         [telemetry]\notlp_endpoint = \"http://127.0.0.1:{dead}\"\nsample_ratio = 1.0\nexport_timeout = \"1s\"\n\
         {gone}{flaky}{slow}",
        spool = dir.join("broken.spool").display(),
        gone = http_upstream("gone", &format!("http://127.0.0.1:{dead}/mcp"), ""),
        flaky = http_upstream("flaky", &flaky.url, ""),
        slow = http_upstream("slow", &slow.url, ""),
    );
    let broken = Router::start(&broken_config).await;

    // Prometheus, scraping both every second and evaluating the rules as
    // often (the file's own, with its groups' interval shortened).
    let (socket, port) = closed_port();
    drop(socket);
    let text = std::fs::read_to_string(&rules).unwrap().replace("interval: 30s", "interval: 1s");
    std::fs::write(dir.join("rules.yml"), text).unwrap();
    let config = json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [dir.join("rules.yml")],
        "scrape_configs": [{"job_name": "switchboard",
            "static_configs": [{"targets": [healthy.addr.to_string(), broken.addr.to_string()]}]}],
    });
    // JSON is YAML.
    std::fs::write(dir.join("prometheus.yml"), config.to_string()).unwrap();
    let _prometheus = Process::spawn(
        &program("prometheus"),
        &[
            &format!("--config.file={}", dir.join("prometheus.yml").display()),
            &format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            &format!("--web.listen-address=127.0.0.1:{port}"),
        ],
        &[],
    );
    let prometheus = format!("http://127.0.0.1:{port}");
    let up = eventually(Duration::from_secs(30), || async {
        reqwest_ok(&format!("{prometheus}/-/ready")).await && query(&prometheus, "up == 1").await.len() == 2
    })
    .await;
    assert!(up, "Prometheus did not come up scraping both routers");

    // Load, in rounds a scrape apart (a counter's first sample is no
    // increase): on the healthy router, calls (some over the tenant's
    // limit), a rejected request, a session ended; on the broken one, calls
    // to an upstream that died after its tools were listed (they fail), and
    // slow ones (over the 1 s SLO).
    let mut healthy_client = Client::with_key(&healthy.url, &key);
    healthy_client.initialize().await;
    let mut stranger = Client::with_key(&healthy.url, &other_key);
    stranger.session = Some("no-such-session".into());
    let mut ended = Client::with_key(&healthy.url, &other_key);
    ended.initialize().await;
    ended.delete().await;
    let mut client = Client::new(&broken.url);
    client.initialize().await;
    assert!(client.tool_names().await.contains(&"flaky__echo".to_owned()));
    flaky.stop();
    let call = |name: &str| json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": {"ms": 1100}}});
    for _ in 0..4 {
        let sleeping = {
            let (client, call) = (client.clone(), call("slow__sleep"));
            tokio::spawn(async move { client.post(call).await })
        };
        for _ in 0..2 {
            // Some answered 429: over the tenant's limit.
            healthy_client.post(call("good__echo")).await;
            client.post(call("flaky__echo")).await;
        }
        stranger.post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
        sleeping.await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Every recording rule returns data, and every alert but the lost
    // records one fires (pending: its `for` has not passed).
    let rules_answer = || async {
        let answer: Value = serde_json::from_str(&get_text(&format!("{prometheus}/api/v1/rules")).await).unwrap();
        answer["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect::<Vec<_>>()
    };
    let settled = eventually(Duration::from_secs(60), || async {
        let rules = rules_answer().await;
        let mut all = true;
        for rule in &rules {
            let name = rule["name"].as_str().unwrap();
            all &= rule["health"] == "ok";
            if rule["type"] == "recording" {
                all &= !query(&prometheus, name).await.is_empty();
            } else if !QUIET.contains(&name) {
                all &= rule["state"] != "inactive";
            }
        }
        all
    })
    .await;
    let rules = rules_answer().await;
    let mut problems = Vec::new();
    for rule in &rules {
        let name = rule["name"].as_str().unwrap();
        if rule["health"] != "ok" {
            problems.push(format!("{name}: {}", rule["lastError"]));
        } else if rule["type"] == "recording" && query(&prometheus, name).await.is_empty() {
            problems.push(format!("recording rule {name} has no data"));
        } else if rule["type"] == "alerting" && !QUIET.contains(&name) && rule["state"] == "inactive" {
            problems.push(format!("alert {name} did not fire: {}", rule["query"]));
        }
    }
    if !problems.is_empty() {
        for expr in [
            "switchboard_requests_total{upstream!=\"\"}",
            "switchboard:slo_slow:ratio5m",
            "switchboard:upstream_failures:ratio5m",
        ] {
            problems.push(format!("{expr} = {:?}", query(&prometheus, expr).await));
        }
    }
    assert!(settled && problems.is_empty(), "{problems:#?}");
    assert_eq!(rules.iter().filter(|r| r["type"] == "alerting").count(), 8);
    // The quiet alerts' quantities are there (zero), though they do not fire.
    for name in QUIET {
        let alert = rules.iter().find(|r| r["name"] == name).unwrap();
        let quantity = alert["query"].as_str().unwrap().rsplit_once(" > ").unwrap().0.to_owned();
        assert!(!query(&prometheus, &quantity).await.is_empty(), "{quantity}");
        assert_eq!(alert["state"], "inactive", "{name}");
    }

    // Every panel of the dashboard returns data.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("grafana/switchboard.json")).unwrap()).unwrap();
    let mut empty = Vec::new();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            panels += 1;
            let expr = target["expr"].as_str().unwrap().replace("$__rate_interval", "1m");
            if query(&prometheus, &expr).await.is_empty() {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(panels >= 25, "{panels} panels");
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
    drop((healthy, broken, slow));
}

async fn reqwest_ok(url: &str) -> bool {
    let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    match client.get(url.parse().unwrap()).await {
        Ok(resp) => resp.status().is_success(),
        Err(_) => false,
    }
}
