//! Configuration: a TOML file plus `SWITCHBOARD__…` environment overrides,
//! read into a raw form and then [`validate`](RawConfig::validate)d into the
//! [`Config`] the rest of the router uses.
//!
//! Every problem is reported with the key it concerns
//! (`upstreams[1].url: …`), all of them at once. Every option is documented in
//! `docs/config.md`; keep the two in step.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod mtls;
pub mod oauth;
mod raw;
pub mod telemetry;
pub mod vault;

pub use self::mtls::MtlsConfig;
pub use self::oauth::{OAuthConfig, Permission, TenantFrom};
pub use self::raw::RawConfig;
pub use self::vault::VaultConfig;
pub use switchboard_catalog::CatalogConfig;
pub use switchboard_devices::EdgeConfig;
pub use switchboard_upstream::config::{HttpConfig, StdioConfig, TransportConfig, UpstreamConfig};

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub catalog: CatalogConfig,
    pub upstreams: Vec<UpstreamConfig>,
    pub log: LogConfig,
    /// `[telemetry]`: traces.
    pub telemetry: telemetry::TelemetryConfig,
    pub auth: AuthConfig,
    pub database: DatabaseConfig,
    pub redis: RedisConfig,
    pub sessions: SessionsConfig,
    pub audit: AuditConfig,
    pub admin: AdminConfig,
    pub edge: EdgeConfig,
    /// `[[tenants]]` declared in the file (the database wins on a name in both).
    pub tenants: Vec<(String, switchboard_core::policy::Policy)>,
    /// `[oauth]`: `None` unless an authorization server is configured.
    pub oauth: Option<OAuthConfig>,
    /// `[mtls]`: `None` unless a client CA is configured.
    pub mtls: Option<MtlsConfig>,
    /// `[egress] allow`: the addresses beyond public ones that upstreams and
    /// authorization servers may be at.
    pub egress: switchboard_core::egress::Egress,
    /// `[vault]`: the key that seals upstream credentials.
    pub vault: VaultConfig,
    /// The upstreams that act for each user (`[upstreams.oauth] grant =
    /// "authorization_code"`), and how the router gets their tokens.
    pub delegated: Vec<DelegatedConfig>,
    /// The upstreams that take each caller's own OAuth token, exchanged
    /// (`[upstreams.oauth] grant = "token_exchange"`).
    pub exchanged: Vec<ExchangedConfig>,
}

/// `[upstreams.oauth] grant = "token_exchange"`: each caller's OAuth access
/// token traded (RFC 8693) for one of the upstream.
#[derive(Clone)]
pub struct ExchangedConfig {
    pub upstream: String,
    pub exchanger: std::sync::Arc<switchboard_oauth::client::TokenExchanger>,
    /// The upstream's other configured headers, sent beside the token.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl std::fmt::Debug for ExchangedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangedConfig").field("upstream", &self.upstream).finish_non_exhaustive()
    }
}

/// `[upstreams.oauth] grant = "authorization_code"`: the router, an OAuth
/// client of the upstream, gets each user's token with their consent.
#[derive(Clone)]
pub struct DelegatedConfig {
    pub upstream: String,
    /// The upstream's URL as written (discovery starts from it; its
    /// resource metadata must name it).
    pub server_url: String,
    /// The RFC 8707 resource asked for (default: the one the upstream's
    /// protected resource metadata names).
    pub resource: Option<String>,
    /// A pre-registered client (else the client ID metadata document, else
    /// dynamic registration).
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub auth: Option<switchboard_oauth::delegated::TokenAuth>,
    pub client_metadata_url: Option<String>,
    /// The scope asked for when neither the challenge nor the resource
    /// metadata names one.
    pub scope: Option<String>,
    pub fetcher: switchboard_oauth::fetch::Fetcher,
}

impl std::fmt::Debug for DelegatedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedConfig")
            .field("upstream", &self.upstream)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// `[auth]`.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `false` (`mode = "none"`): no API keys; every request is tenant `default`, which sees everything.
    pub required: bool,
}

/// `[database]`: tenants, keys and the audit log.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `postgres://…` or `sqlite:…`; `None` (`url = ""`) for no database.
    pub url: Option<String>,
    /// Apply migrations when the router starts.
    pub migrate_on_start: bool,
    /// How often replicas check for changed tenants and keys (PostgreSQL also notifies at once).
    pub refresh: Duration,
    /// Longest wait for a database connection.
    pub connect_timeout: Duration,
}

/// `[redis]`: cluster-wide rate limits.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://host:port[/db]`; `None` for local limits only.
    pub url: Option<String>,
    /// Prefix of every key the router writes.
    pub key_prefix: String,
    /// Longest wait for one Redis answer before falling back to local limits.
    pub timeout: Duration,
}

/// `[sessions]`: where sessions live.
#[derive(Debug, Clone)]
pub struct SessionsConfig {
    /// `redis`: in Redis (`[redis] url`), shared by every replica; else in memory.
    pub redis: bool,
    /// How long a replica uses its local copy of a session before checking
    /// the store again (which also slides the expiry there).
    pub cache: Duration,
}

/// `[audit]`.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Write audit records (needs a database).
    pub enabled: bool,
    /// The spool file used while the database is unreachable (one per replica).
    pub spool: PathBuf,
    pub queue: usize,
    pub batch: usize,
    pub write_timeout: Duration,
    pub retry_every: Duration,
    /// How long the writer gathers records before an insert that is not full.
    pub flush_every: Duration,
}

/// `[admin]`: the administration API.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where it listens; `None` for no admin API.
    pub listen: Option<SocketAddr>,
    /// The bearer token it requires.
    pub token: Option<String>,
    /// TLS on the admin listener: certificate chain and key (PEM), reloaded
    /// as the MCP listener's are.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// `[server]`: the downstream listener and its limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Largest accepted request body; larger gets 413.
    pub max_body_bytes: usize,
    /// Origins allowed to call (`Origin` header); requests without `Origin` are always allowed.
    pub allowed_origins: Vec<OriginPattern>,
    /// A session unused for this long is ended.
    pub session_idle_timeout: Duration,
    /// At most this many live sessions; `initialize` beyond it gets 503.
    pub max_sessions: usize,
    /// Comment sent on an idle SSE stream this often.
    pub keep_alive: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// Threads serving connections, each with a current-thread runtime of
    /// its own; 0 for one per available core.
    pub worker_threads: usize,
    /// How answers that are complete at once are sent.
    pub response_mode: ResponseMode,
    /// A connection must send its first request's headers within this long
    /// of being accepted (and each later request's within this long of
    /// their first byte).
    pub header_timeout: Duration,
    /// TLS on the MCP listener: the PEM certificate chain and key, reloaded
    /// when they change on disk (and on SIGHUP).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// Connections open at once, at most; beyond, 503 and closed.
    pub max_connections: usize,
    /// The router's address as its users reach it (`https://host`): where
    /// authorization links and callbacks point. Default: `http://` + listen.
    pub public_url: Option<String>,
    /// Connections open at once from one client address (0: no bound).
    pub max_connections_per_address: usize,
}

/// `server.response_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseMode {
    /// `application/json`, unless the upstream streams (the fastest).
    Json,
    /// `text/event-stream` whenever the client accepts it, as the SDK servers do.
    Sse,
}

/// `[log]`.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// A `tracing` filter such as `info` or `switchboard=debug`; `RUST_LOG` wins when set.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// An allowed `Origin`: exact, any port of a host (`http://localhost:*`), or anything (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    Any,
    Exact(String),
    AnyPort(String),
}

impl OriginPattern {
    fn parse(s: &str) -> Option<Self> {
        if s == "*" {
            return Some(OriginPattern::Any);
        }
        if !(s.starts_with("http://") || s.starts_with("https://")) {
            return None;
        }
        match s.strip_suffix(":*") {
            Some(base) => Some(OriginPattern::AnyPort(base.to_ascii_lowercase())),
            None => Some(OriginPattern::Exact(s.trim_end_matches('/').to_ascii_lowercase())),
        }
    }

    /// Whether `origin` (an `Origin` header value) matches.
    pub fn matches(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        match self {
            OriginPattern::Any => true,
            OriginPattern::Exact(o) => *o == origin,
            OriginPattern::AnyPort(base) => match origin.strip_prefix(base.as_str()) {
                Some("") => true,
                Some(rest) => {
                    rest.strip_prefix(':').is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                }
                None => false,
            },
        }
    }
}

/// Every problem found in a configuration, each with its key.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<(String, String)>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration:")?;
        for (key, message) in &self.problems {
            writeln!(f, "  {key}: {message}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    fn one(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { problems: vec![(key.into(), message.into())] }
    }
}

// ---- The raw, deserialized form -------------------------------------------

/// Parses `"250ms"`, `"5s"`, `"1.5s"`, `"2m"`, `"1h"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("{text:?} is not a duration (try \"500ms\", \"5s\", \"2m\")"))?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (use ms, s, m, h or d)")),
    };
    Ok(Duration::from_secs_f64(value * scale))
}

/// The `SWITCHBOARD__SECTION__KEY` environment overrides.
fn environment() -> config::Environment {
    config::Environment::with_prefix("SWITCHBOARD").prefix_separator("__").separator("__").try_parsing(true)
}

impl Config {
    /// Reads `path` (TOML), applies `SWITCHBOARD__SECTION__KEY` environment
    /// overrides, and validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let built = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(environment())
            .build()
            .map_err(|e| ConfigError::one(path.display().to_string(), e.to_string()))?;
        let raw: RawConfig = built.try_deserialize().map_err(|e| ConfigError::one("config", e.to_string()))?;
        raw.validate()
    }

    /// [`Config::load`], and each top-level section as it reads (file and
    /// environment together), to tell which sections a new version of the
    /// file changes.
    pub fn load_sections(path: &Path) -> Result<(Config, serde_json::Map<String, serde_json::Value>), ConfigError> {
        Self::load_with_registry(Some(path), &[])
    }

    /// [`Config::load_sections`] of `path` (`None`: the environment only),
    /// with the upstream registry's entries (`[[upstreams]]` entries as
    /// JSON) in place of the file's of the same name, and after the others.
    pub fn load_with_registry(
        path: Option<&Path>,
        registered: &[serde_json::Value],
    ) -> Result<(Config, serde_json::Map<String, serde_json::Value>), ConfigError> {
        let from = path.map_or_else(|| "environment".to_owned(), |p| p.display().to_string());
        let builder = || {
            let mut builder = config::Config::builder();
            if let Some(path) = path {
                builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
            }
            builder.add_source(environment())
        };
        let mut built = builder().build().map_err(|e| ConfigError::one(from.clone(), e.to_string()))?;
        let mut sections: serde_json::Map<String, serde_json::Value> =
            built.clone().try_deserialize().map_err(|e| ConfigError::one("config", e.to_string()))?;
        if !registered.is_empty() {
            let mut entries = sections.get("upstreams").and_then(|u| u.as_array()).cloned().unwrap_or_default();
            for entry in registered {
                match entries.iter_mut().find(|e| e.get("name").is_some() && e.get("name") == entry.get("name")) {
                    Some(file_entry) => *file_entry = entry.clone(),
                    None => entries.push(entry.clone()),
                }
            }
            let overlay = serde_json::json!({ "upstreams": entries }).to_string();
            built = builder()
                .add_source(config::File::from_str(&overlay, config::FileFormat::Json))
                .build()
                .map_err(|e| ConfigError::one("the upstream registry", e.to_string()))?;
            sections = built.clone().try_deserialize().map_err(|e| ConfigError::one("config", e.to_string()))?;
        }
        let raw: RawConfig = built.try_deserialize().map_err(|e| ConfigError::one("config", e.to_string()))?;
        Ok((raw.validate()?, sections))
    }

    /// The defaults with `SWITCHBOARD__SECTION__KEY` environment overrides
    /// only (a command run without a configuration file).
    pub fn from_env() -> Result<Config, ConfigError> {
        let built = config::Config::builder()
            .add_source(environment())
            .build()
            .map_err(|e| ConfigError::one("environment", e.to_string()))?;
        let raw: RawConfig = built.try_deserialize().map_err(|e| ConfigError::one("environment", e.to_string()))?;
        raw.validate()
    }

    /// Parses and validates TOML text, without environment overrides (for tests and tools).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let built = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .map_err(|e| ConfigError::one("config", e.to_string()))?;
        let raw: RawConfig = built.try_deserialize().map_err(|e| ConfigError::one("config", e.to_string()))?;
        raw.validate()
    }

    /// What this configuration leaves out that a reader might assume is
    /// there, one sentence each (`check-config` prints them, `serve` logs
    /// them as warnings).
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.database.url.is_none() {
            notes.push(
                "database.url is \"\" (no database): no audit record is written, no key can be created, and only the [[tenants]] of this file exist"
                    .into(),
            );
        }
        if !self.auth.required {
            notes.push(
                "auth.mode is \"none\": every request is the tenant \"default\", which sees every upstream".into(),
            );
        }
        notes
    }

    /// The upstream with this name.
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }
}

/// A duration written as `"250ms"`, `"5s"`, `"2m"`, `"1h"`, or a number of seconds.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum RawDuration {
    Seconds(u64),
    Text(String),
}

impl RawDuration {
    pub fn parse(&self) -> Result<Duration, String> {
        match self {
            RawDuration::Seconds(s) => Ok(Duration::from_secs(*s)),
            RawDuration::Text(t) => parse_duration(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(toml: &str) -> Vec<(String, String)> {
        Config::from_toml(toml).expect_err("invalid").problems
    }

    #[test]
    fn registered_upstreams_replace_the_files_of_their_name_and_follow_the_others() {
        let dir = std::env::temp_dir().join(format!("sb-registry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("router.toml");
        std::fs::write(
            &path,
            "[[upstreams]]\nname = \"a\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [[upstreams]]\nname = \"b\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:2/mcp\"\nprefix = \"bee\"\n",
        )
        .unwrap();
        let registered = [
            serde_json::json!({"name": "c", "transport": "http", "url": "http://127.0.0.1:3/mcp", "timeout": "5s"}),
            serde_json::json!({"name": "b", "transport": "http", "url": "http://127.0.0.1:4/mcp"}),
        ];
        let (config, sections) = Config::load_with_registry(Some(&path), &registered).unwrap();
        let names: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        // b is the registry's whole: its URL, and none of the file's prefix.
        assert_eq!(config.upstreams[1].prefix, "b");
        assert!(matches!(&config.upstreams[1].transport, TransportConfig::Http(h) if h.url.port_u16() == Some(4)));
        assert_eq!(config.upstreams[2].timeout, std::time::Duration::from_secs(5));
        assert_eq!(sections["upstreams"].as_array().unwrap().len(), 3);
        // A bad entry fails the whole, naming it.
        let bad = [serde_json::json!({"name": "d", "transport": "carrier-pigeon"})];
        let err = Config::load_with_registry(Some(&path), &bad).unwrap_err().to_string();
        assert!(err.contains("upstreams[2]"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn two_upstream_names_with_one_key_are_refused() {
        // Two names whose 32-bit keys collide (found by search: about 2^16 names).
        let mut seen = std::collections::HashMap::new();
        let (a, b) = (0..)
            .map(|i| format!("u{i}"))
            .find_map(|name| seen.insert(switchboard_upstream::key_of(&name), name.clone()).map(|other| (other, name)))
            .unwrap();
        let entry = |name: &str| {
            format!("[[upstreams]]\nname = \"{name}\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:1/mcp\"\n")
        };
        let p = problems(&format!("{}{}", entry(&a), entry(&b)));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "upstreams[1].name");
        assert!(p[0].1.contains("same key") && p[0].1.contains(&a), "{p:?}");
    }

    #[test]
    fn a_tenants_pinning_is_read_and_needs_a_database() {
        let tenant = "[[tenants]]\nname = \"acme\"\nupstreams = [\"*\"]\n[tenants.pinning]\non_change = \"warn\"\n";
        let config =
            Config::from_toml(&format!("[database]\nurl = \"sqlite::memory:\"\n[audit]\nenabled = false\n{tenant}"))
                .unwrap();
        let pinning = config.tenants[0].1.pinning.expect("pinning");
        assert_eq!(
            (pinning.approve, pinning.on_change),
            (switchboard_core::policy::Approve::FirstSight, switchboard_core::policy::OnChange::Warn)
        );
        let p = problems(&format!("[database]\nurl = \"\"\n{tenant}"));
        assert!(p.iter().any(|(k, m)| k == "tenants[0].pinning" && m.contains("database.url")), "{p:?}");
        let p = problems(&format!("[database]\nurl = \"sqlite::memory:\"\n{}", tenant.replace("warn", "shout")));
        assert!(p.iter().any(|(k, m)| format!("{k} {m}").contains("shout")), "{p:?}");
    }

    #[test]
    fn the_issue_example_is_valid() {
        let config = Config::from_toml(
            r#"
            [server]
            listen = "127.0.0.1:8080"
            [[upstreams]]
            name = "everything"
            transport = "http"
            url = "http://127.0.0.1:3001/mcp"
            [[upstreams]]
            name = "time"
            transport = "stdio"
            command = "mcp-server-time"
            args = ["--local-timezone", "UTC"]
            "#,
        )
        .unwrap();
        assert_eq!(config.upstreams.len(), 2);
        assert_eq!(config.upstreams[0].prefix, "everything");
        assert!(matches!(&config.upstreams[1].transport, TransportConfig::Stdio(s) if s.args.len() == 2));
        assert_eq!(config.catalog.separator, "__");
        assert_eq!(config.server.max_body_bytes, 4 << 20);
    }

    #[test]
    fn errors_name_their_keys() {
        let p = problems(
            r#"
            [server]
            listen = "nowhere"
            session_idle_timeout = "5 fortnights"
            [catalog]
            separator = "::"
            [[upstreams]]
            name = "a b"
            transport = "http"
            [[upstreams]]
            name = "t"
            transport = "stdio"
            url = "http://x/mcp"
            [[upstreams]]
            name = "t"
            transport = "carrier-pigeon"
            "#,
        );
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        for expected in [
            "server.listen",
            "server.session_idle_timeout",
            "catalog.separator",
            "upstreams[0].name",
            "upstreams[0].url",
            "upstreams[1].command",
            "upstreams[1].url",
            "upstreams[2].name",
            "upstreams[2].transport",
        ] {
            assert!(keys.contains(&expected), "{expected} missing from {p:?}");
        }
    }

    #[test]
    fn token_exchange_needs_the_front_doors_oauth() {
        let upstream = r#"
            [[upstreams]]
            name = "docs"
            transport = "http"
            url = "https://docs.example/mcp"
            [upstreams.oauth]
            grant = "token_exchange"
            issuer = "https://as.example"
            client_id = "router"
            client_secret = "s"
            audience = "docs"
            "#;
        let p = problems(upstream);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "upstreams.docs.oauth");
        assert!(p[0].1.contains("configure [oauth]"), "{p:?}");
        let front = r#"
            [oauth]
            resource = "https://router.example/mcp"
            [oauth.servers.a]
            issuer = "https://as.example"
            tenant = "acme"
            "#;
        let config = Config::from_toml(&format!("{front}{upstream}")).unwrap();
        assert_eq!(config.exchanged.len(), 1);
        // Only that user's token lists or calls it.
        assert!(config.upstreams[0].per_user && config.upstreams[0].credential_required);
        // `audience` is the exchange's alone.
        let p = problems(&upstream.replace("token_exchange", "client_credentials"));
        assert!(p.iter().any(|(k, _)| k == "upstreams[0].oauth.audience"), "{p:?}");
    }

    #[test]
    fn the_redis_session_store_needs_redis() {
        let p = problems("[sessions]\nstore = \"redis\"\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "sessions.store");
        let p = problems("[sessions]\nstore = \"etcd\"\n");
        assert_eq!(p[0].0, "sessions.store");
        let config = Config::from_toml(
            "[sessions]\nstore = \"redis\"\ncache = \"500ms\"\n[redis]\nurl = \"redis://127.0.0.1:6379\"\n",
        )
        .unwrap();
        assert!(config.sessions.redis);
        assert_eq!(config.sessions.cache, Duration::from_millis(500));
        assert!(!Config::from_toml("").unwrap().sessions.redis, "memory by default");
    }

    #[test]
    fn upstream_replicas() {
        let config = Config::from_toml(
            "[[upstreams]]\nname = \"w\"\ntransport = \"http\"\nurls = [\"http://a:1/mcp\", \"http://b:1/mcp\"]\nhealth_interval = \"500ms\"\n",
        )
        .unwrap();
        let TransportConfig::Http(http) = &config.upstreams[0].transport else { panic!("http") };
        assert_eq!(http.replicas.len(), 2);
        assert_eq!(http.url, http.replicas[0]);
        assert_eq!(http.health_interval, Duration::from_millis(500));
        for (toml, key) in [
            ("url = \"http://a/mcp\"\nurls = [\"http://b/mcp\"]", "upstreams[0].urls"),
            ("urls = []", "upstreams[0].urls"),
            ("urls = [\"http://a/mcp\", \"http://a/mcp\"]", "upstreams[0].urls[1]"),
            ("urls = [\"ftp://a\"]", "upstreams[0].urls[0]"),
            ("url = \"http://a/mcp\"\nhealth_interval = \"1s\"", "upstreams[0].health_interval"),
        ] {
            let p = problems(&format!("[[upstreams]]\nname = \"w\"\ntransport = \"http\"\n{toml}\n"));
            assert!(p.iter().any(|(k, _)| k == key), "{toml}: {p:?}");
        }
        let p = problems("[[upstreams]]\nname = \"w\"\ntransport = \"sse\"\nurls = [\"http://a/sse\"]\n");
        assert!(p.iter().any(|(k, _)| k == "upstreams[0].urls"), "{p:?}");
    }

    #[test]
    fn worker_threads_are_bounded() {
        assert_eq!(Config::from_toml("[server]\nworker_threads = 3\n").unwrap().server.worker_threads, 3);
        let p = problems("[server]\nworker_threads = 100000\n");
        assert_eq!(p[0].0, "server.worker_threads", "{p:?}");
        assert!(p[0].1.contains("at most 1024"), "{p:?}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let p = problems("[server]\nlisten_on = \"1.2.3.4:5\"\n");
        assert!(p[0].1.contains("listen_on"), "{p:?}");
    }

    #[test]
    fn prefixes_must_be_unique_but_empty_ones_may_repeat() {
        let base = |p1: &str, p2: &str| {
            format!(
                "[[upstreams]]\nname=\"a\"\nprefix=\"{p1}\"\ntransport=\"stdio\"\ncommand=\"x\"\n\
                 [[upstreams]]\nname=\"b\"\nprefix=\"{p2}\"\ntransport=\"stdio\"\ncommand=\"x\"\n"
            )
        };
        assert!(Config::from_toml(&base("", "")).is_ok());
        assert!(Config::from_toml(&base("x", "y")).is_ok());
        assert_eq!(problems(&base("x", "X"))[0].0, "upstreams[1].prefix");
        // my_db and my-db would both namespace resource URIs as my-db+...
        assert_eq!(problems(&base("my_db", "my-db"))[0].0, "upstreams[1].prefix");
        assert_eq!(problems(&base("9x", "u9x"))[0].0, "upstreams[1].prefix");
    }

    #[test]
    fn tenants_and_guard_sections() {
        let config = Config::from_toml(
            r#"
            [database]
            url = "postgres://postgres@127.0.0.1:5432/switchboard"
            [redis]
            url = "redis://127.0.0.1:6379"
            [admin]
            listen = "127.0.0.1:9091"
            token = "a-token-long-enough"
            [[upstreams]]
            name = "Files"
            transport = "stdio"
            command = "x"
            [[tenants]]
            name = "acme"
            upstreams = ["Files"]
            audit_arguments = true
            [tenants.tools.Files]
            deny = ["delete_*"]
            [tenants.limits]
            key = { per_second = 20, burst = 40 }
            concurrent = 4
            "#,
        )
        .unwrap();
        assert!(config.auth.required);
        assert_eq!(config.redis.url.as_deref(), Some("redis://127.0.0.1:6379"));
        let (name, policy) = &config.tenants[0];
        assert_eq!(name, "acme");
        // Upstream names keep their case as table keys too.
        assert_eq!(policy.tools["Files"].deny, ["delete_*"]);
        assert_eq!(policy.limits.key.unwrap().burst, 40);
        assert_eq!(policy.limits.concurrent, Some(4));
        assert!(policy.audit_arguments);

        let p = problems(
            "[auth]\nmode = \"maybe\"\n[database]\nurl = \"mysql://x\"\n[admin]\nlisten = \"127.0.0.1:1\"\n\
             [[tenants]]\nname = \"t\"\nupstreams = [\"ghost\"]\n[tenants.limits]\ntool = { per_second = 0 }\n",
        );
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        for expected in
            ["auth.mode", "database.url", "admin.token", "tenants[0].upstreams[0]", "tenants[0].limits.tool.per_second"]
        {
            assert!(keys.contains(&expected), "{expected} missing from {p:?}");
        }
        // [oauth]: every bad key named at once; a good one validates.
        let p = problems(
            "[oauth]\nresource = \"mcp\"\nalgorithms = [\"HS256\", \"none\"]\nleeway = \"1h\"\n\
             [oauth.scopes]\n\"mcp:x\" = [\"write\"]\n[oauth.servers.corp]\nissuer = \"not a url\"\n\
             client_id = \"router\"\nca = \"/nonexistent/ca.pem\"\n[[tenants]]\nname = \"t\"\naccept = [\"tokens\"]\n",
        );
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        for expected in [
            "oauth.resource",
            "oauth.algorithms[0]",
            "oauth.algorithms[1]",
            "oauth.leeway",
            "oauth.scopes.mcp:x[0]",
            "oauth.servers.corp.issuer",
            "oauth.servers.corp.client_secret",
            "oauth.servers.corp.ca",
            "oauth.servers.corp.tenant",
            "tenants[0].accept[0]",
        ] {
            assert!(keys.contains(&expected), "{expected} missing from {p:?}");
        }
        let good = Config::from_toml(
            "[oauth]\nresource = \"https://mcp.example.com/mcp\"\n[oauth.scopes]\n\"mcp:list\" = [\"list\"]\n\
             [oauth.servers.corp]\nissuer = \"https://auth.example.com\"\ntenant = \"acme\"\n",
        )
        .unwrap();
        let oauth = good.oauth.expect("[oauth] on");
        assert_eq!(oauth.metadata_url(), "https://mcp.example.com/.well-known/oauth-protected-resource/mcp");
        assert_eq!(oauth.scope.as_deref(), Some("mcp:list"));
        // OAuth needs authentication on.
        let p = problems(
            "[auth]\nmode = \"none\"\n[oauth]\nresource = \"https://r/mcp\"\n\
             [oauth.servers.x]\nissuer = \"https://a\"\ntenant = \"t\"\n",
        );
        assert_eq!(p.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["oauth"], "{p:?}");
        // Upstream TLS keys: only for https, files that read, pairs whole.
        let p = problems(
            "[[upstreams]]\nname = \"a\"\ntransport = \"http\"\nurl = \"http://x/mcp\"\nca = \"ca.pem\"\n\
             [[upstreams]]\nname = \"b\"\ntransport = \"http\"\nurl = \"https://x/mcp\"\nca = \"/nonexistent/ca.pem\"\n\
             [[upstreams]]\nname = \"c\"\ntransport = \"sse\"\nurl = \"https://x/sse\"\ntls_client_cert = \"c.pem\"\n\
             [[upstreams]]\nname = \"d\"\ntransport = \"http\"\nurl = \"ftp://x/mcp\"\n",
        );
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        for expected in ["upstreams[0].ca", "upstreams[1].ca", "upstreams[2].tls_client_key", "upstreams[3].url"] {
            assert!(keys.contains(&expected), "{expected} missing from {p:?}");
        }
        let https =
            Config::from_toml("[[upstreams]]\nname = \"s\"\ntransport = \"http\"\nurl = \"https://x.test/mcp\"\n")
                .unwrap();
        match &https.upstreams[0].transport {
            TransportConfig::Http(h) => assert!(h.tls.is_some(), "an https upstream has its TLS client"),
            other => panic!("{other:?}"),
        }
        // [mtls]: a CA, TLS on the listener, subjects that parse, once each.
        let p = problems("[mtls]\nrequired = true\n[mtls.subjects]\n\"CN=a,O=b\" = \"t\"\n\"build-bot\" = \"t\"\n");
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["mtls.ca"], "{p:?}");
        let p = problems(
            "[mtls]\nca = \"ca.pem\"\n[mtls.subjects]\n\"CN=a,O=b\" = \"t\"\n\"/O=b/CN=a\" = \"u\"\n\"bot\" = \"t\"\n",
        );
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        for expected in ["mtls.ca", "mtls.subjects.\"CN=a,O=b\"", "mtls.subjects.\"bot\""] {
            assert!(keys.contains(&expected), "{expected} missing from {p:?}");
        }
        let dir = std::env::temp_dir().join(format!("sb-config-mtls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=clients"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(made.status.success());
        let good = Config::from_toml(&format!(
            "[server]\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n[mtls]\nca = \"{}\"\n\
             [mtls.subjects]\n\"O = Acme, CN = bot\" = \"acme\"\n[[tenants]]\nname = \"acme\"\naccept = [\"client_cert\"]\n",
            dir.join("ca.pem").display()
        ))
        .unwrap();
        let mtls = good.mtls.expect("[mtls] on");
        assert!(!mtls.required);
        assert_eq!(mtls.subjects[&crate::subject::Subject::parse("CN=bot,O=Acme").unwrap()], "acme");

        // No database: only config tenants, no audit, and the notes say so.
        let none = Config::from_toml("[database]\nurl = \"\"\n").unwrap();
        assert!(none.database.url.is_none());
        assert!(!none.audit.enabled, "no database, no audit");
        assert!(none.notes().iter().any(|n| n.contains("no audit record is written")), "{:?}", none.notes());
        assert!(Config::from_toml("").unwrap().notes().is_empty(), "the defaults leave nothing out");
        // Asking for audit with no database is a contradiction, named.
        let err = Config::from_toml("[database]\nurl = \"\"\n[audit]\nenabled = true\n").unwrap_err().to_string();
        assert!(err.contains("audit.enabled") && err.contains("need one"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn origins() {
        let any_port = OriginPattern::parse("http://localhost:*").unwrap();
        assert!(any_port.matches("http://localhost:3000"));
        assert!(any_port.matches("http://LOCALHOST"));
        assert!(!any_port.matches("http://localhost.evil.com"));
        assert!(!any_port.matches("http://localhost:"));
        let exact = OriginPattern::parse("https://app.example.com/").unwrap();
        assert!(exact.matches("https://app.example.com"));
        assert!(!exact.matches("https://app.example.com:8443"));
        assert!(OriginPattern::parse("*").unwrap().matches("null"));
        assert!(OriginPattern::parse("example.com").is_none());
    }
}
