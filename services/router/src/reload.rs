//! Hot reload of the configuration file: on SIGHUP, and when the file's
//! contents change (looked at every [`POLL`]).
//!
//! A new version is read and validated whole; one that does not validate is
//! refused (a log line naming every problem, `switchboard_config_reloads_total
//! {result="refused"}`) and the running configuration kept. A valid one is
//! applied without touching sessions or requests in flight: the
//! `[[upstreams]]` added, removed or changed (see `upstream_set.rs`), the
//! config file's `[[tenants]]`
//! (their upstreams, tools, limits, accepted credentials) and `log.level`.
//! Changes to other sections are not applied: they are named, logged and
//! reported as pending a restart. `GET /v1/config` on the admin API tells
//! which version is active.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::app::App;
use crate::config::Config;
use crate::upstream_set::{ActingForUsers, Entry};

/// How often the file is looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// Sets the log filter (the process's logging is the command's).
pub type LogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Where the configuration came from, and how to change the log level.
pub struct Source {
    pub path: PathBuf,
    pub log_level: Option<LogLevel>,
}

/// The configuration version running, as the admin API tells it.
#[derive(Debug, Clone, Serialize)]
pub struct Version {
    /// The first 12 hex digits of the file's SHA-256.
    pub version: String,
    /// When it was applied (ms since the epoch).
    pub loaded_at_ms: i64,
    pub path: String,
    /// Sections the file changes since the router started that apply only
    /// at a restart.
    pub pending_restart: Vec<String>,
    /// Why the last version of the file seen was refused, if it was.
    pub last_refusal: Option<String>,
    /// The upstream registry's version applied (`None`: no database, or
    /// not read yet).
    pub registry_version: Option<i64>,
}

struct State {
    /// The file's text last seen (applied or refused).
    seen: String,
    /// The sections the router started with, and those applied since.
    started: Map<String, Value>,
    applied: Map<String, Value>,
    version: Version,
}

pub struct Reloads {
    path: PathBuf,
    /// The upstream registry as last read.
    registry: Mutex<crate::registry::Applied>,
    log_level: Option<LogLevel>,
    state: Mutex<State>,
    reloads: IntCounterVec,
    info: IntGaugeVec,
}

/// Sections applied while running.
const LIVE: &[&str] = &["upstreams", "tenants", "log"];

/// Each `[[upstreams]]` entry of `sections`, by name.
fn upstream_entries(sections: &Map<String, Value>) -> std::collections::BTreeMap<String, &Value> {
    let entries = sections.get("upstreams").and_then(Value::as_array);
    entries.into_iter().flatten().filter_map(|e| Some((e.get("name")?.as_str()?.to_owned(), e))).collect()
}

fn version_of(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

impl Reloads {
    /// For the configuration the router started with (read from `source`'s file).
    pub fn new(source: Source, registry: &prometheus::Registry) -> Result<Reloads, String> {
        let text = std::fs::read_to_string(&source.path).map_err(|e| format!("{}: {e}", source.path.display()))?;
        let (_, sections) = Config::load_sections(&source.path).map_err(|e| e.to_string())?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "switchboard_config_reloads_total",
                "Versions of the config file read while running: applied, unchanged (nothing in it changed what runs), refused (invalid: the running configuration kept).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let info = IntGaugeVec::new(
            Opts::new(
                "switchboard_config_info",
                "1 for the configuration version running (the file's SHA-256, 12 hex digits).",
            ),
            &["version"],
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(reloads.clone()));
        let _ = registry.register(Box::new(info.clone()));
        for result in ["applied", "unchanged", "refused"] {
            reloads.with_label_values(&[result]);
        }
        let version = Version {
            version: version_of(&text),
            loaded_at_ms: switchboard_core::time::now_ms(),
            path: source.path.display().to_string(),
            pending_restart: Vec::new(),
            last_refusal: None,
            registry_version: None,
        };
        info.with_label_values(&[&version.version]).set(1);
        Ok(Reloads {
            path: source.path,
            registry: Mutex::default(),
            log_level: source.log_level,
            state: Mutex::new(State { seen: text, started: sections.clone(), applied: sections, version }),
            reloads,
            info,
        })
    }

    /// The configuration file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The names of the registry's upstreams, as last read.
    pub fn registered_names(&self) -> Vec<String> {
        self.registry.lock().expect("lock").names()
    }

    /// Reads the upstream registry if it changed, and applies it with the
    /// file as last seen. `None`: nothing to do (unchanged, no database,
    /// or the database cannot be reached: the running set is kept).
    pub async fn refresh_registry(&self, app: &Arc<App>) -> Option<&'static str> {
        let db = app.database.as_ref()?;
        let applied = self.registry.lock().expect("lock").version;
        match crate::registry::read_if_changed(db, &app.vault, applied).await {
            Ok(Some((version, entries))) => {
                {
                    let mut registry = self.registry.lock().expect("lock");
                    registry.version = Some(version);
                    registry.entries = entries;
                }
                let text = self.state.lock().expect("lock").seen.clone();
                Some(self.apply(app, text))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the upstream registry; the running upstreams are kept");
                None
            }
        }
    }

    /// The version running.
    pub fn version(&self) -> Version {
        self.state.lock().expect("lock").version.clone()
    }

    /// Reads the file and applies it if it changed (`force`: even if its
    /// text did not, as SIGHUP asks). Returns what became of it.
    pub fn reload(&self, app: &Arc<App>, force: bool) -> &'static str {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) => return self.refuse(None, format!("cannot read {}: {e}", self.path.display())),
        };
        {
            let mut state = self.state.lock().expect("lock");
            if state.seen == text && !force {
                return "same";
            }
            state.seen = text.clone();
        }
        self.apply(app, text)
    }

    /// Applies the file (whose text is `text`) with the registry as last
    /// read.
    fn apply(&self, app: &Arc<App>, text: String) -> &'static str {
        let (registered, registry_version) = {
            let registry = self.registry.lock().expect("lock");
            (registry.entries.clone(), registry.version)
        };
        let (config, sections) = match Config::load_with_registry(Some(&self.path), &registered) {
            Ok(loaded) => loaded,
            Err(e) => return self.refuse(Some(&text), e.to_string()),
        };
        if let Some(why) = needs_restart(app, &config) {
            return self.refuse(Some(&text), why);
        }
        let mut state = self.state.lock().expect("lock");
        let changed = |a: &Map<String, Value>, name: &str| a.get(name) != sections.get(name);
        let mut applied = Vec::new();
        // Upstreams first: tenants then resolve against the new set.
        let (before, after) = (upstream_entries(&state.applied), upstream_entries(&sections));
        let mut entries = Vec::new();
        for config in &config.upstreams {
            match before.get(&config.name) {
                None => entries.push(Entry::Added(config)),
                Some(old) if Some(old) != after.get(&config.name) => entries.push(Entry::Changed(config)),
                Some(_) => {}
            }
        }
        for name in before.keys().filter(|name| !after.contains_key(*name)) {
            entries.push(Entry::Removed(name));
        }
        let acting = ActingForUsers { delegated: &config.delegated, exchanged: &config.exchanged };
        let tag = format!("config:{}:{}", version_of(&text), registry_version.unwrap_or(0));
        match app.change_upstreams(&entries, acting, &tag) {
            Ok(change) => {
                applied.extend(change.added.iter().map(|n| format!("upstreams.{n} (added)")));
                applied.extend(change.changed.iter().map(|n| format!("upstreams.{n} (changed)")));
                applied.extend(change.removed.iter().map(|n| format!("upstreams.{n} (removed)")));
            }
            Err(why) => {
                drop(state);
                return self.refuse(Some(&text), why);
            }
        }
        if changed(&state.applied, "tenants") {
            app.directory.set_static_tenants(config.tenants.clone());
            applied.push("tenants".to_owned());
        }
        let level = |s: &Map<String, Value>| s.get("log").and_then(|l| l.get("level")).cloned();
        if level(&state.applied) != level(&sections) {
            match &self.log_level {
                Some(set) => match set(&config.log.level) {
                    Ok(()) => applied.push("log.level".to_owned()),
                    Err(e) => tracing::warn!(error = %e, "log.level not applied"),
                },
                None => tracing::warn!("log.level changed, but this process's logging cannot be changed while running"),
            }
        }
        let mut pending: Vec<String> = sections
            .keys()
            .chain(state.started.keys())
            .filter(|name| !LIVE.contains(&name.as_str()) && changed(&state.started, name))
            .cloned()
            .collect();
        let format = |s: &Map<String, Value>| s.get("log").and_then(|l| l.get("format")).cloned();
        if format(&state.started) != format(&sections) {
            pending.push("log.format".into());
        }
        pending.sort();
        pending.dedup();
        let version = version_of(&text);
        self.info.reset();
        self.info.with_label_values(&[&version]).set(1);
        let result = if applied.is_empty() { "unchanged" } else { "applied" };
        self.reloads.with_label_values(&[result]).inc();
        if pending.is_empty() {
            tracing::info!(%version, applied = ?applied, "configuration reloaded");
        } else {
            tracing::warn!(%version, applied = ?applied, pending_restart = ?pending, "configuration reloaded; these sections changed and apply only at the next restart");
        }
        state.applied = sections;
        state.version = Version {
            version,
            loaded_at_ms: switchboard_core::time::now_ms(),
            path: self.path.display().to_string(),
            pending_restart: pending,
            last_refusal: None,
            registry_version,
        };
        result
    }

    fn refuse(&self, text: Option<&str>, why: String) -> &'static str {
        self.reloads.with_label_values(&["refused"]).inc();
        tracing::error!(path = %self.path.display(), error = %why, "configuration file refused; the running configuration is kept");
        let mut state = self.state.lock().expect("lock");
        if let Some(text) = text {
            state.seen = text.to_owned();
        }
        state.version.last_refusal = Some(why);
        "refused"
    }

    /// Watches for SIGHUP, for changes to the file and to the upstream
    /// registry (notified on PostgreSQL; looked at every [`POLL`] on
    /// both), until the router stops.
    pub fn start(self: &Arc<Self>, app: Weak<App>, stopped: impl std::future::Future<Output = ()> + Send + 'static) {
        let me = self.clone();
        let notified = app.upgrade().and_then(|app| {
            let db = app.database.as_ref()?;
            Some(db.wakeups(switchboard_db::UPSTREAMS_CHANNEL, app.config.database.refresh))
        });
        tokio::spawn(async move {
            let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut notified = notified;
            tokio::pin!(stopped);
            loop {
                enum Wake {
                    Poll,
                    Hangup,
                    Registry,
                }
                let wake = tokio::select! {
                    () = &mut stopped => return,
                    () = tokio::time::sleep(POLL) => Wake::Poll,
                    Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => Wake::Hangup,
                    true = async { match notified.as_mut() { Some(n) => n.next().await, None => std::future::pending().await } } => Wake::Registry,
                };
                let Some(app) = app.upgrade() else { return };
                match wake {
                    Wake::Hangup => {
                        tracing::info!("SIGHUP: reading the configuration file again");
                        me.reload(&app, true);
                    }
                    Wake::Poll => {
                        me.reload(&app, false);
                        me.refresh_registry(&app).await;
                    }
                    Wake::Registry => {
                        me.refresh_registry(&app).await;
                    }
                }
            }
        });
    }
}

/// What the file asks for that needs something the router started
/// without (it cannot be added while running): the reason, if anything.
fn needs_restart(app: &App, config: &Config) -> Option<String> {
    if app.database.is_none() {
        if let Some((name, _)) = config.tenants.iter().find(|(_, p)| p.pinning.is_some()) {
            return Some(format!(
                "tenant {name:?} pins its tool definitions, which are kept in the database this router started without: restart it with this file"
            ));
        }
    }
    if let (Some(first), true) = (config.delegated.first(), app.vault.key_ids().is_empty()) {
        return Some(format!(
            "upstreams.{}.oauth (authorization_code) keeps users' tokens in the vault, whose key this router started without: restart it with this file",
            first.upstream
        ));
    }
    None
}
