//! The deployments in `deploy/`: every Kustomize overlay renders with
//! `kubectl kustomize` and validates against the Kubernetes 1.30 schemas
//! (`kubernetes-validate --strict`), with what each overlay promises (one
//! replica on SQLite on a volume; replicas with a disruption budget, an
//! autoscaler, probes and Secrets for PostgreSQL and Redis); the compose
//! file passes its schema check (`docker-compose config`); and the router
//! configurations they ship pass `switchboard check-config` with the
//! environment they set.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use switchboard_test_support::peers::{python, tools_dir};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(path)
}

/// Runs `program` with `args`; its stdout, or a failure naming its stderr.
fn run(program: &Path, args: &[&str], dir: Option<&Path>) -> String {
    let mut command = Command::new(program);
    command.args(args);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let out =
        command.output().unwrap_or_else(|e| panic!("{}: {e} (scripts/install-peers installs it)", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// YAML documents as JSON (with the tools' Python and its PyYAML).
fn documents(yaml: &str, dir: &Path) -> Vec<Value> {
    let file = dir.join("documents.yaml");
    std::fs::write(&file, yaml).unwrap();
    let script = "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))";
    serde_json::from_str(&run(&python(), &["-c", script, file.to_str().unwrap()], None)).unwrap()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

#[test]
fn every_kustomize_overlay_renders_and_validates_against_the_kubernetes_schemas() {
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-k8s-"));
    std::fs::create_dir_all(&dir).unwrap();
    let validate = tools_dir().join("venv/bin/kubernetes-validate");
    let overlays: Vec<_> =
        std::fs::read_dir(deploy("kubernetes/overlays")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(overlays.len(), 2, "{overlays:?}");
    for overlay in overlays {
        let name = overlay.file_name().unwrap().to_str().unwrap().to_owned();
        let yaml = run(Path::new("kubectl"), &["kustomize", overlay.to_str().unwrap()], None);
        let rendered = dir.join(format!("{name}.yaml"));
        std::fs::write(&rendered, &yaml).unwrap();
        let report = run(&validate, &["--strict", "-k", "1.30.0", rendered.to_str().unwrap()], None);
        assert!(!report.contains("ERROR") && !report.contains("failed"), "{name}: {report}");
        let docs = documents(&yaml, &dir);
        let deployment = kind(&docs, "Deployment")[0];
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        // Probes on the router's own endpoints, as a non-root user.
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true, "{name}");
        let env: Vec<&Value> = container["env"].as_array().unwrap().iter().collect();
        let var = |n: &str| env.iter().find(|e| e["name"] == n).copied();
        // The configuration it mounts passes check-config with its environment.
        let config = kind(&docs, "ConfigMap")[0]["data"]["switchboard.toml"].as_str().unwrap().to_owned();
        let mut check_env: Vec<(String, String)> = Vec::new();
        match name.as_str() {
            "single" => {
                assert_eq!(deployment["spec"]["replicas"], 1);
                assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
                let data = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "data").unwrap();
                let claim = data["persistentVolumeClaim"]["claimName"].as_str().unwrap();
                assert!(data.get("emptyDir").is_none(), "{data}");
                assert!(kind(&docs, "PersistentVolumeClaim").iter().any(|c| c["metadata"]["name"] == claim));
                let url = var("SWITCHBOARD__DATABASE__URL").unwrap()["value"].as_str().unwrap();
                assert!(url.starts_with("sqlite:///var/lib/switchboard/"), "{url}");
                check_env.push(("SWITCHBOARD__DATABASE__URL".into(), url.into()));
            }
            "ha" => {
                assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2);
                let pdb = kind(&docs, "PodDisruptionBudget")[0];
                assert_eq!(pdb["spec"]["selector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"]);
                let hpa = kind(&docs, "HorizontalPodAutoscaler")[0];
                assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], deployment["metadata"]["name"]);
                assert!(hpa["spec"]["minReplicas"].as_u64().unwrap() >= 2);
                let secret = kind(&docs, "Secret")[0]["metadata"]["name"].as_str().unwrap().to_owned();
                for (variable, key) in [
                    ("SWITCHBOARD__DATABASE__URL", "database-url"),
                    ("SWITCHBOARD__REDIS__URL", "redis-url"),
                    ("SWITCHBOARD__VAULT__KEY", "vault-key"),
                ] {
                    let from = &var(variable).unwrap_or_else(|| panic!("{variable}"))["valueFrom"]["secretKeyRef"];
                    assert_eq!((from["name"].as_str(), from["key"].as_str()), (Some(secret.as_str()), Some(key)));
                }
                assert_eq!(var("SWITCHBOARD__SESSIONS__STORE").unwrap()["value"], "redis");
                let key = run(&switchboard_test_support::router_binary(), &["vault", "new-key"], None);
                check_env.extend([
                    ("SWITCHBOARD__DATABASE__URL".into(), "postgres://switchboard@postgres:5432/switchboard".into()),
                    ("SWITCHBOARD__REDIS__URL".into(), "redis://redis:6379".into()),
                    ("SWITCHBOARD__SESSIONS__STORE".into(), "redis".into()),
                    ("SWITCHBOARD__VAULT__KEY".into(), key.trim().into()),
                    ("SWITCHBOARD__ADMIN__TOKEN".into(), "a-token-of-twenty-chars".into()),
                    ("SWITCHBOARD__ADMIN__LISTEN".into(), "0.0.0.0:9091".into()),
                ]);
            }
            other => panic!("an overlay this test does not know: {other}"),
        }
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, config).unwrap();
        let out = Command::new(switchboard_test_support::router_binary())
            .args(["check-config", file.to_str().unwrap()])
            .envs(check_env)
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn the_compose_file_passes_its_schema_check_with_everything_it_promises() {
    let dir = std::env::temp_dir().join(switchboard_test_support::services::unique("sb-compose-"));
    std::fs::create_dir_all(&dir).unwrap();
    let compose = deploy("compose");
    let resolved = run(Path::new("docker-compose"), &["-f", "compose.yaml", "config"], Some(&compose));
    let file = &documents(&resolved, &dir)[0];
    let services = file["services"].as_object().unwrap();
    for service in ["router-1", "router-2", "postgres", "redis", "otel-collector", "prometheus", "grafana"] {
        assert!(services.contains_key(service), "{service} missing: {:?}", services.keys());
    }
    // The routers share PostgreSQL and Redis and send their traces to the collector.
    for router in ["router-1", "router-2"] {
        let env = &services[router]["environment"];
        assert!(env["SWITCHBOARD__DATABASE__URL"].as_str().unwrap().contains("@postgres:5432/"));
        assert!(env["SWITCHBOARD__REDIS__URL"].as_str().unwrap().contains("redis:6379"));
        assert!(env["SWITCHBOARD__TELEMETRY__OTLP_ENDPOINT"].as_str().unwrap().contains("otel-collector:4318"));
    }
    // Grafana gets the dashboard, Prometheus the rules.
    let mounts = |s: &str| services[s]["volumes"].to_string();
    assert!(mounts("grafana").contains("switchboard.json"), "{}", mounts("grafana"));
    assert!(mounts("prometheus").contains("rules.yml"), "{}", mounts("prometheus"));
    // The routers' configuration passes check-config with their environment.
    let env = services["router-1"]["environment"].as_object().unwrap();
    let out = Command::new(switchboard_test_support::router_binary())
        .args(["check-config", compose.join("switchboard.toml").to_str().unwrap()])
        .envs(env.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The Dockerfile (no engine here to build it): the dependencies are cooked
/// in a layer before the sources are copied, and the image runs as a
/// non-root user.
#[test]
fn the_dockerfile_builds_dependencies_in_their_own_layer_and_runs_as_non_root() {
    let text = std::fs::read_to_string(deploy("Dockerfile")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix}"));
    let build = at("FROM chef AS build");
    let cook = build + lines[build..].iter().position(|l| l.contains("cargo chef cook")).expect("a cook step");
    let sources = build + lines[build..].iter().position(|l| *l == "COPY . .").expect("the sources copied");
    assert!(cook < sources, "the dependencies must be built before the sources are copied");
    let user = lines.iter().rev().find(|l| l.starts_with("USER ")).expect("a USER");
    let uid = user.trim_start_matches("USER ").split(':').next().unwrap();
    assert!(uid.parse::<u32>().is_ok_and(|u| u > 0), "{user}");
    assert!(lines.last().unwrap().starts_with("CMD"), "{lines:?}");
}
