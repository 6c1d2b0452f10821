//! The configuration file as written (TOML, every key optional, unknown
//! keys refused), and its validation into the [`Config`] the router uses:
//! every problem found at once, each naming its key.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use serde::Deserialize;

use super::{
    AdminConfig, AuditConfig, AuthConfig, CatalogConfig, Config, ConfigError, DatabaseConfig, EdgeConfig, HttpConfig,
    LogConfig, LogFormat, OriginPattern, RawDuration, RedisConfig, ResponseMode, ServerConfig, SessionsConfig,
    StdioConfig, TransportConfig, UpstreamConfig,
};

/// The file as written. Unknown keys are errors, so typos do not pass silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub catalog: RawCatalog,
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default)]
    pub database: RawDatabase,
    #[serde(default)]
    pub redis: RawRedis,
    #[serde(default)]
    pub sessions: RawSessions,
    #[serde(default)]
    pub audit: RawAudit,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub edge: RawEdge,
    #[serde(default)]
    pub tenants: Vec<RawTenant>,
    #[serde(default)]
    pub oauth: super::oauth::RawOAuth,
    #[serde(default)]
    pub mtls: super::mtls::RawMtls,
    #[serde(default)]
    pub egress: RawEgress,
    #[serde(default)]
    pub vault: super::vault::RawVault,
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEgress {
    #[serde(default)]
    pub allow: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub mode: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDatabase {
    pub url: Option<String>,
    pub migrate_on_start: Option<bool>,
    pub refresh: Option<RawDuration>,
    pub connect_timeout: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    pub url: Option<String>,
    pub key_prefix: Option<String>,
    pub timeout: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSessions {
    pub store: Option<String>,
    pub cache: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    pub enabled: Option<bool>,
    pub spool: Option<String>,
    pub queue: Option<u64>,
    pub batch: Option<u64>,
    pub write_timeout: Option<RawDuration>,
    pub retry_every: Option<RawDuration>,
    pub flush_every: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEdge {
    pub listen: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub max_frame_bytes: Option<u64>,
    pub register_timeout: Option<RawDuration>,
    pub call_timeout: Option<RawDuration>,
    pub grace: Option<RawDuration>,
    pub task_handler: Option<String>,
    pub task_timeout: Option<RawDuration>,
    pub max_devices: Option<u64>,
}

/// One `[[tenants]]` entry: a name and a [`switchboard_core::policy::Policy`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    pub name: Option<String>,
    #[serde(default)]
    pub upstreams: Vec<String>,
    #[serde(default)]
    pub tools: BTreeMap<String, switchboard_core::policy::ToolFilter>,
    #[serde(default)]
    pub limits: switchboard_core::policy::Limits,
    #[serde(default)]
    pub audit_arguments: bool,
    #[serde(default)]
    pub accept: Vec<String>,
    #[serde(default)]
    pub discovery: switchboard_core::policy::Discovery,
    #[serde(default)]
    pub task_handler: Option<String>,
    #[serde(default)]
    pub pinning: Option<switchboard_core::policy::Pinning>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub max_body_bytes: Option<u64>,
    pub allowed_origins: Option<Vec<String>>,
    pub session_idle_timeout: Option<RawDuration>,
    pub max_sessions: Option<u64>,
    pub keep_alive: Option<RawDuration>,
    pub shutdown_grace: Option<RawDuration>,
    pub worker_threads: Option<u64>,
    pub response_mode: Option<String>,
    pub header_timeout: Option<RawDuration>,
    pub idle_timeout: Option<RawDuration>,
    pub max_connections: Option<u64>,
    pub max_connections_per_address: Option<u64>,
    pub public_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCatalog {
    pub separator: Option<String>,
    pub page_size: Option<u64>,
    pub retry_after: Option<RawDuration>,
    pub max_upstream_pages: Option<u64>,
    pub max_upstream_items: Option<u64>,
    pub max_upstream_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub level: Option<String>,
    pub format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: Option<String>,
    pub transport: Option<String>,
    pub prefix: Option<String>,
    pub timeout: Option<RawDuration>,
    pub list_timeout: Option<RawDuration>,
    // http
    pub url: Option<String>,
    pub urls: Option<Vec<String>>,
    pub health_interval: Option<RawDuration>,
    pub headers: Option<BTreeMap<String, String>>,
    pub http2: Option<bool>,
    pub connect_timeout: Option<RawDuration>,
    pub pool_max_idle: Option<u64>,
    pub ca: Option<String>,
    pub tls_client_cert: Option<String>,
    pub tls_client_key: Option<String>,
    /// `"optional"` (default) or `"required"`: see [`UpstreamConfig::credential_required`].
    pub credentials: Option<String>,
    /// The router's own OAuth client of this upstream.
    pub oauth: Option<RawUpstreamOAuth>,
    // stdio
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub inherit_env: Option<bool>,
    pub cwd: Option<String>,
    pub restart_max_backoff: Option<RawDuration>,
    pub shutdown_grace: Option<RawDuration>,
    pub per_session: Option<bool>,
    pub max_processes: Option<u64>,
    pub idle_timeout: Option<RawDuration>,
}

/// `[upstreams.oauth]`: the router as an OAuth client of an upstream.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamOAuth {
    pub grant: Option<String>,
    pub issuer: Option<String>,
    pub token_url: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub client_secret_file: Option<String>,
    pub scope: Option<String>,
    pub resource: Option<String>,
    pub auth_method: Option<String>,
    pub ca: Option<String>,
    /// `grant = "authorization_code"`: the URL of the client ID metadata
    /// document the router offers as its client id.
    pub client_metadata_url: Option<String>,
    /// `grant = "token_exchange"`: the `audience` asked for, beside the
    /// resource.
    pub audience: Option<String>,
}

impl std::fmt::Debug for RawUpstreamOAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawUpstreamOAuth")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// What `[upstreams.oauth]` makes of an upstream.
enum UpstreamOAuth {
    /// The router's own token (client credentials).
    Own(switchboard_upstream::config::Own),
    /// Each user's, with their consent (authorization code).
    Delegated(Box<super::DelegatedConfig>),
    /// Each caller's own token, exchanged (token exchange).
    Exchanged(Box<super::ExchangedConfig>),
}

/// `[upstreams.oauth]` validated: the router's own token source for
/// upstream `name` at `url` (its default `resource`), sent with `headers`,
/// or how it gets its users' tokens.
fn upstream_oauth(
    raw: RawUpstreamOAuth,
    name: &str,
    url: &str,
    headers: &[(http::HeaderName, http::HeaderValue)],
    egress: &switchboard_core::egress::Egress,
    key: &dyn Fn(&str) -> String,
    bad: &mut impl FnMut(String, String),
) -> Option<UpstreamOAuth> {
    use switchboard_oauth::client::{ClientCredentials, ClientSettings, TokenExchanger};
    use switchboard_oauth::delegated::TokenAuth;
    if raw.grant.as_deref() == Some("authorization_code") {
        return delegated_oauth(raw, name, url, headers, egress, key, bad)
            .map(|d| UpstreamOAuth::Delegated(Box::new(d)));
    }
    let mut ok = true;
    let mut fail = |field: &str, problem: &str| {
        bad(key(&format!("oauth.{field}")), problem.to_owned());
        ok = false;
    };
    const GRANTS: &str = "\"client_credentials\", \"authorization_code\" or \"token_exchange\"";
    let exchange = raw.grant.as_deref() == Some("token_exchange");
    match raw.grant.as_deref() {
        Some("client_credentials" | "token_exchange") => {}
        Some(other) => fail("grant", &format!("{other:?} is not supported ({GRANTS})")),
        None => fail("grant", &format!("is required: {GRANTS}")),
    }
    if raw.client_metadata_url.is_some() {
        fail("client_metadata_url", "only applies to grant = \"authorization_code\"");
    }
    if raw.audience.is_some() && !exchange {
        fail("audience", "only applies to grant = \"token_exchange\"");
    }
    let is_url = |u: &str| u.starts_with("https://") || u.starts_with("http://");
    match (raw.issuer.as_deref(), raw.token_url.as_deref()) {
        (Some(_), Some(_)) => {
            fail("token_url", "give issuer (its metadata names the token endpoint) or token_url, not both")
        }
        (None, None) => fail("issuer", "is required (or token_url)"),
        (Some(u), None) | (None, Some(u)) if !is_url(u) => fail("issuer", &format!("{u:?} is not an http(s) URL")),
        _ => {}
    }
    let client_id = raw.client_id.clone().filter(|c| !c.is_empty());
    if client_id.is_none() {
        fail("client_id", "is required");
    }
    let secret = match oauth_secret(&raw) {
        Ok(Some(secret)) => Some(secret),
        Ok(None) => {
            fail("client_secret", "is required (or client_secret_file)");
            None
        }
        Err((field, problem)) => {
            fail(field, &problem);
            None
        }
    };
    let auth_method = match raw.auth_method.as_deref() {
        None | Some("client_secret_basic") => TokenAuth::Basic,
        Some("client_secret_post") => TokenAuth::Post,
        Some(other) => {
            fail("auth_method", &format!("{other:?} is not \"client_secret_basic\" or \"client_secret_post\""));
            TokenAuth::Basic
        }
    };
    if headers.iter().any(|(n, _)| n == http::header::AUTHORIZATION) {
        bad(
            key("headers.Authorization"),
            "the OAuth token goes in Authorization: remove it, or [upstreams.oauth]".into(),
        );
        ok = false;
    }
    let fetcher = match oauth_fetcher(raw.ca.as_deref(), egress) {
        Ok(f) => f,
        Err(e) => {
            bad(key("oauth.ca"), e);
            return None;
        }
    };
    if !ok {
        return None;
    }
    let settings = ClientSettings {
        issuer: raw.issuer,
        token_url: raw.token_url,
        client_id: client_id?,
        client_secret: secret?,
        scope: raw.scope.filter(|s| !s.is_empty()),
        resource: raw.resource.unwrap_or_else(|| url.to_owned()),
        auth: auth_method,
    };
    if exchange {
        let audience = raw.audience.filter(|a| !a.is_empty());
        return Some(UpstreamOAuth::Exchanged(Box::new(super::ExchangedConfig {
            upstream: name.to_owned(),
            exchanger: std::sync::Arc::new(TokenExchanger::new(settings, audience, fetcher)),
            headers: headers.to_vec(),
        })));
    }
    let token = crate::own_token::ClientToken::new(name, ClientCredentials::new(settings, fetcher), headers.to_vec());
    Some(UpstreamOAuth::Own(switchboard_upstream::config::Own(std::sync::Arc::new(token))))
}

/// The client secret of `[upstreams.oauth]`: `client_secret`, or the
/// contents of `client_secret_file`; `None` if neither is given; else the
/// field at fault and why.
fn oauth_secret(raw: &RawUpstreamOAuth) -> Result<Option<String>, (&'static str, String)> {
    match (raw.client_secret.as_deref(), raw.client_secret_file.as_deref()) {
        (None, None) => Ok(None),
        (Some(s), None) if !s.is_empty() => Ok(Some(s.to_owned())),
        (Some(_), None) => Err(("client_secret", "is empty".into())),
        (None, Some(file)) => match std::fs::read_to_string(file) {
            Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim().to_owned())),
            Ok(_) => Err(("client_secret_file", "is empty".into())),
            Err(e) => Err(("client_secret_file", format!("cannot read {file:?}: {e}"))),
        },
        (Some(_), Some(_)) => Err(("client_secret_file", "give client_secret or client_secret_file, not both".into())),
    }
}

/// The fetcher of `[upstreams.oauth]`: through the egress guard, trusting
/// the PEM file `ca` too if given.
fn oauth_fetcher(
    ca: Option<&str>,
    egress: &switchboard_core::egress::Egress,
) -> Result<switchboard_oauth::fetch::Fetcher, String> {
    let pem = ca.map(|path| std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}"))).transpose()?;
    switchboard_oauth::fetch::Fetcher::new(pem.as_deref(), Duration::from_secs(10), egress.clone())
}

/// `[upstreams.oauth] grant = "authorization_code"` validated.
fn delegated_oauth(
    raw: RawUpstreamOAuth,
    name: &str,
    url: &str,
    headers: &[(http::HeaderName, http::HeaderValue)],
    egress: &switchboard_core::egress::Egress,
    key: &dyn Fn(&str) -> String,
    bad: &mut impl FnMut(String, String),
) -> Option<super::DelegatedConfig> {
    use switchboard_oauth::delegated::TokenAuth;
    let mut ok = true;
    let mut fail = |field: &str, problem: &str| {
        bad(key(&format!("oauth.{field}")), problem.to_owned());
        ok = false;
    };
    for (field, given) in [("issuer", raw.issuer.is_some()), ("token_url", raw.token_url.is_some())] {
        if given {
            fail(field, "does not apply to grant = \"authorization_code\": the upstream's metadata names its authorization server");
        }
    }
    let client_id = raw.client_id.clone().filter(|c| !c.is_empty());
    let secret = oauth_secret(&raw).unwrap_or_else(|(field, problem)| {
        fail(field, &problem);
        None
    });
    if secret.is_some() && client_id.is_none() {
        fail("client_secret", "needs client_id");
    }
    let auth = match raw.auth_method.as_deref() {
        None => None,
        Some("client_secret_basic") => Some(TokenAuth::Basic),
        Some("client_secret_post") => Some(TokenAuth::Post),
        Some("none") => Some(TokenAuth::None),
        Some(other) => {
            fail(
                "auth_method",
                &format!("{other:?} is not \"client_secret_basic\", \"client_secret_post\" or \"none\""),
            );
            None
        }
    };
    if let Some(metadata) = raw.client_metadata_url.as_deref() {
        if !metadata.starts_with("https://") || metadata.len() <= "https://".len() {
            fail("client_metadata_url", "must be an https URL (a client ID metadata document's)");
        }
    }
    if headers.iter().any(|(n, _)| n == http::header::AUTHORIZATION) {
        fail("headers.Authorization", "each user's OAuth token goes in Authorization: remove it");
    }
    let fetcher = match oauth_fetcher(raw.ca.as_deref(), egress) {
        Ok(f) => f,
        Err(e) => {
            fail("ca", &e);
            return None;
        }
    };
    if !ok {
        return None;
    }
    Some(super::DelegatedConfig {
        upstream: name.to_owned(),
        server_url: url.to_owned(),
        resource: raw.resource.filter(|r| !r.is_empty()),
        client_id,
        client_secret: secret,
        auth,
        client_metadata_url: raw.client_metadata_url,
        scope: raw.scope.filter(|s| !s.is_empty()),
        fetcher,
    })
}

/// `server.worker_threads` above this is a mistake, not a machine.
const MAX_WORKER_THREADS: u64 = 1024;

const NAME_CHARS: &str = "letters, digits, '_' and '-'";

impl RawConfig {
    /// Checks every value and builds the [`Config`]; reports all problems at once.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let mut problems: Vec<(String, String)> = Vec::new();
        let mut bad = |key: String, message: String| problems.push((key, message));

        macro_rules! duration {
            ($value:expr, $key:expr, $default:expr) => {
                match $value.as_ref().map(RawDuration::parse) {
                    None => $default,
                    Some(Ok(d)) if !d.is_zero() => d,
                    Some(Ok(_)) => {
                        bad($key.to_string(), "must be greater than zero".into());
                        $default
                    }
                    Some(Err(e)) => {
                        bad($key.to_string(), e);
                        $default
                    }
                }
            };
        }

        // [server]
        let s = self.server;
        let listen = match s.listen.as_deref().unwrap_or("127.0.0.1:8080").parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                bad("server.listen".into(), "must be an address such as \"127.0.0.1:8080\"".into());
                SocketAddr::from(([127, 0, 0, 1], 8080))
            }
        };
        let mut allowed_origins = Vec::new();
        for (i, o) in s
            .allowed_origins
            .unwrap_or_else(|| vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()])
            .iter()
            .enumerate()
        {
            match OriginPattern::parse(o) {
                Some(p) => allowed_origins.push(p),
                None => bad(
                    format!("server.allowed_origins[{i}]"),
                    format!("{o:?} is not an origin (\"https://app.example.com\", \"http://localhost:*\" or \"*\")"),
                ),
            }
        }
        let max_body_bytes = s.max_body_bytes.unwrap_or(4 << 20);
        if max_body_bytes < 1024 {
            bad("server.max_body_bytes".into(), "must be at least 1024".into());
        }
        let server = ServerConfig {
            listen,
            max_body_bytes: max_body_bytes as usize,
            allowed_origins,
            session_idle_timeout: duration!(
                s.session_idle_timeout,
                "server.session_idle_timeout",
                Duration::from_secs(1800)
            ),
            max_sessions: s.max_sessions.unwrap_or(100_000) as usize,
            keep_alive: duration!(s.keep_alive, "server.keep_alive", Duration::from_secs(15)),
            shutdown_grace: duration!(s.shutdown_grace, "server.shutdown_grace", Duration::from_secs(10)),
            worker_threads: match s.worker_threads.unwrap_or(0) {
                n if n > MAX_WORKER_THREADS => {
                    bad("server.worker_threads".into(), format!("at most {MAX_WORKER_THREADS} (0: one per core)"));
                    0
                }
                n => n as usize,
            },
            header_timeout: duration!(s.header_timeout, "server.header_timeout", Duration::from_secs(10)),
            tls: tls_pair(s.tls_cert, s.tls_key, "server", &mut bad),
            idle_timeout: duration!(s.idle_timeout, "server.idle_timeout", Duration::from_secs(120)),
            max_connections: match s.max_connections.unwrap_or(10_000) {
                0 => {
                    bad("server.max_connections".into(), "must be at least 1".into());
                    1
                }
                n => n as usize,
            },
            max_connections_per_address: s.max_connections_per_address.unwrap_or(1_000) as usize,
            public_url: match s.public_url.map(|u| u.trim_end_matches('/').to_owned()) {
                Some(u) if (u.starts_with("https://") || u.starts_with("http://")) && u.parse::<Uri>().is_ok() => {
                    Some(u)
                }
                Some(u) => {
                    bad("server.public_url".into(), format!("{u:?} is not an http(s) URL"));
                    None
                }
                None => None,
            },
            response_mode: match s.response_mode.as_deref().unwrap_or("json") {
                "json" => ResponseMode::Json,
                "sse" => ResponseMode::Sse,
                other => {
                    bad("server.response_mode".into(), format!("{other:?} is not \"json\" or \"sse\""));
                    ResponseMode::Json
                }
            },
        };

        // [catalog]
        let c = self.catalog;
        let separator = c.separator.unwrap_or_else(|| "__".into());
        if separator.is_empty()
            || separator.len() > 4
            || !separator.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            bad("catalog.separator".into(), "must be 1 to 4 of letters, digits, '_', '.', '-'".into());
        }
        let catalog = CatalogConfig {
            separator,
            page_size: c.page_size.unwrap_or(0) as usize,
            retry_after: duration!(c.retry_after, "catalog.retry_after", Duration::from_secs(5)),
            max_upstream_pages: c.max_upstream_pages.unwrap_or(100).max(1) as usize,
            max_upstream_items: c.max_upstream_items.unwrap_or(10_000).max(1) as usize,
            max_upstream_bytes: c.max_upstream_bytes.unwrap_or(8 << 20).max(1024) as usize,
        };

        // [log]
        let format = match self.log.format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                bad("log.format".into(), format!("{other:?} is not \"text\" or \"json\""));
                LogFormat::Text
            }
        };
        let log = LogConfig { level: self.log.level.unwrap_or_else(|| "info".into()), format };
        let telemetry = super::telemetry::validate(self.telemetry, &mut bad);

        // [egress]: where upstreams and authorization servers may be.
        let egress = match switchboard_core::egress::Egress::parse(&self.egress.allow) {
            Ok(egress) => egress,
            Err(problems) => {
                for (i, problem) in problems {
                    bad(format!("egress.allow[{i}]"), problem);
                }
                switchboard_core::egress::Egress::public_only()
            }
        };

        // [[upstreams]]
        let mut upstreams = Vec::new();
        let mut delegated = Vec::new();
        let mut exchanged = Vec::new();
        let mut names = HashSet::new();
        let mut keys = std::collections::HashMap::new();
        let mut prefixes = HashSet::new();
        for (i, u) in self.upstreams.into_iter().enumerate() {
            let key = |field: &str| format!("upstreams[{i}].{field}");
            let name = u.name.clone().unwrap_or_default();
            let mut per_user = false;
            if !switchboard_core::ids::valid_name(&name) {
                bad(key("name"), format!("must be 1 to 48 of {NAME_CHARS}"));
            } else if !names.insert(name.clone()) {
                bad(key("name"), format!("{name:?} is used by another upstream"));
            } else if let Some(other) = keys.insert(switchboard_upstream::key_of(&name), name.clone()) {
                // Relayed request ids name upstreams by this 32-bit key.
                bad(key("name"), format!("{name:?} hashes to the same key as {other:?}: rename one"));
            }
            let prefix = u.prefix.clone().unwrap_or_else(|| name.clone());
            if !prefix.is_empty() {
                if !switchboard_core::ids::valid_name(&prefix) {
                    bad(key("prefix"), format!("must be empty or 1 to 48 of {NAME_CHARS}"));
                } else if prefix.eq_ignore_ascii_case("switchboard") {
                    bad(
                        key("prefix"),
                        "\"switchboard\" is the router's own namespace (progressive discovery's meta-tools): give the upstream another prefix".into(),
                    );
                } else if !prefixes.insert(switchboard_catalog::naming::scheme_prefix(&prefix)) {
                    bad(
                        key("prefix"),
                        format!(
                            "{prefix:?} is too close to another upstream's prefix: resource URIs would share the \
                             scheme prefix {:?} (prefixes are compared ignoring case, with '_' as '-')",
                            switchboard_catalog::naming::scheme_prefix(&prefix)
                        ),
                    );
                }
            }
            let timeout = duration!(u.timeout, key("timeout"), Duration::from_secs(60));
            let list_timeout = duration!(u.list_timeout, key("list_timeout"), Duration::from_secs(5));
            let transport = match u.transport.as_deref() {
                Some(kind @ ("http" | "streamable-http" | "sse")) => {
                    let sse = kind == "sse";
                    for field in [
                        "command",
                        "args",
                        "env",
                        "inherit_env",
                        "cwd",
                        "restart_max_backoff",
                        "shutdown_grace",
                        "per_session",
                        "max_processes",
                        "idle_timeout",
                    ] {
                        if u.has(field) {
                            bad(key(field), "only applies to transport = \"stdio\"".into());
                        }
                    }
                    let parse_url = |field: &str, text: &str, bad: &mut dyn FnMut(String, String)| -> Uri {
                        match text.parse::<Uri>() {
                            Ok(url) if matches!(url.scheme_str(), Some("http" | "https")) && url.host().is_some() => {
                                url
                            }
                            _ => {
                                bad(
                                    key(field),
                                    "must be an http:// or https:// URL such as \"https://mcp.example.com/mcp\"".into(),
                                );
                                Uri::from_static("http://invalid")
                            }
                        }
                    };
                    let replicas: Vec<Uri> = match (u.url.as_deref(), u.urls.as_deref()) {
                        (Some(url), None) => vec![parse_url("url", url, &mut bad)],
                        (None, Some(urls)) if !urls.is_empty() && !sse => {
                            let parsed: Vec<Uri> = urls
                                .iter()
                                .enumerate()
                                .map(|(i, url)| parse_url(&format!("urls[{i}]"), url, &mut bad))
                                .collect();
                            for (i, url) in parsed.iter().enumerate() {
                                if parsed[..i].contains(url) {
                                    bad(key(&format!("urls[{i}]")), "is listed twice".into());
                                }
                            }
                            parsed
                        }
                        (None, Some(_)) if sse => {
                            bad(key("urls"), "only applies to transport = \"http\"; give one url".into());
                            vec![Uri::from_static("http://invalid")]
                        }
                        (None, Some(_)) => {
                            bad(key("urls"), "must list at least one URL".into());
                            vec![Uri::from_static("http://invalid")]
                        }
                        (Some(_), Some(_)) => {
                            bad(key("urls"), "give either url or urls, not both".into());
                            vec![Uri::from_static("http://invalid")]
                        }
                        (None, None) => {
                            bad(key("url"), format!("is required for transport = \"{kind}\""));
                            vec![Uri::from_static("http://invalid")]
                        }
                    };
                    let url = replicas[0].clone();
                    if u.health_interval.is_some() && replicas.len() < 2 {
                        bad(key("health_interval"), "only applies to an upstream with several urls".into());
                    }
                    if sse && u.http2.is_some() {
                        bad(key("http2"), "only applies to transport = \"http\"".into());
                    }
                    let tls = upstream_tls(&u, &replicas, &key, &mut bad);
                    let mut headers = Vec::new();
                    for (k, v) in u.headers.unwrap_or_default() {
                        match switchboard_core::credential::header(&k, &v) {
                            Ok(header) => headers.push(header),
                            Err(problem) => bad(key(&format!("headers.{k}")), problem),
                        }
                    }
                    let own = match u.oauth {
                        Some(raw) => {
                            let written = u.url.clone().or_else(|| u.urls.as_ref().and_then(|v| v.first().cloned()));
                            let resource = written.unwrap_or_default();
                            match upstream_oauth(raw, &name, &resource, &headers, &egress, &key, &mut bad) {
                                Some(UpstreamOAuth::Own(own)) => Some(own),
                                Some(UpstreamOAuth::Delegated(d)) => {
                                    per_user = true;
                                    delegated.push(*d);
                                    None
                                }
                                Some(UpstreamOAuth::Exchanged(x)) => {
                                    per_user = true;
                                    exchanged.push(*x);
                                    None
                                }
                                None => None,
                            }
                        }
                        None => None,
                    };
                    let http = HttpConfig {
                        url,
                        replicas,
                        health_interval: duration!(u.health_interval, key("health_interval"), Duration::from_secs(2)),
                        headers,
                        http2: u.http2.unwrap_or(false),
                        tls,
                        egress: egress.clone(),
                        connect_timeout: duration!(u.connect_timeout, key("connect_timeout"), Duration::from_secs(3)),
                        pool_max_idle: u.pool_max_idle.unwrap_or(256) as usize,
                        own,
                    };
                    if sse {
                        TransportConfig::Sse(http)
                    } else {
                        TransportConfig::Http(http)
                    }
                }
                Some("stdio") => {
                    for field in [
                        "url",
                        "urls",
                        "health_interval",
                        "headers",
                        "http2",
                        "connect_timeout",
                        "pool_max_idle",
                        "ca",
                        "tls_client_cert",
                        "tls_client_key",
                        "credentials",
                        "oauth",
                    ] {
                        if u.has(field) {
                            bad(key(field), "only applies to transport = \"http\" or \"sse\"".into());
                        }
                    }
                    let command = match u.command.clone() {
                        Some(c) if !c.trim().is_empty() => c,
                        _ => {
                            bad(key("command"), "is required for transport = \"stdio\"".into());
                            String::new()
                        }
                    };
                    let per_session = match u.per_session {
                        Some(true) => Some(switchboard_upstream::config::PerSession {
                            max_processes: match u.max_processes {
                                None => 64,
                                Some(0) => {
                                    bad(key("max_processes"), "must be at least 1".into());
                                    1
                                }
                                Some(n) => n as usize,
                            },
                            idle_timeout: duration!(u.idle_timeout, key("idle_timeout"), Duration::from_secs(300)),
                        }),
                        _ => {
                            for field in ["max_processes", "idle_timeout"] {
                                if u.has(field) {
                                    bad(key(field), "only applies with per_session = true".into());
                                }
                            }
                            None
                        }
                    };
                    TransportConfig::Stdio(StdioConfig {
                        command,
                        args: u.args.clone().unwrap_or_default(),
                        env: u.env.clone().unwrap_or_default(),
                        inherit_env: u.inherit_env.unwrap_or(false),
                        cwd: u.cwd.clone().map(PathBuf::from),
                        restart_max_backoff: duration!(
                            u.restart_max_backoff,
                            key("restart_max_backoff"),
                            Duration::from_secs(30)
                        ),
                        shutdown_grace: duration!(u.shutdown_grace, key("shutdown_grace"), Duration::from_secs(2)),
                        per_session,
                    })
                }
                Some(other) => {
                    bad(key("transport"), format!("{other:?} is not \"http\", \"sse\" or \"stdio\""));
                    continue;
                }
                None => {
                    bad(key("transport"), "is required: \"http\", \"sse\" or \"stdio\"".into());
                    continue;
                }
            };
            let credential_required = match u.credentials.as_deref() {
                None | Some("optional") => false,
                Some("required") => true,
                Some(other) => {
                    bad(key("credentials"), format!("{other:?} is not \"optional\" or \"required\""));
                    false
                }
            };
            upstreams.push(UpstreamConfig {
                name,
                prefix,
                transport,
                timeout,
                list_timeout,
                // A user's token or none: never the upstream's own headers.
                credential_required: credential_required || per_user,
                per_user,
            });
        }

        // [auth], [database], [redis], [audit], [admin]
        let auth = AuthConfig {
            required: match self.auth.mode.as_deref().unwrap_or("keys") {
                "keys" => true,
                "none" => false,
                other => {
                    bad("auth.mode".into(), format!("{other:?} is not \"keys\" or \"none\""));
                    true
                }
            },
        };
        let d = self.database;
        let url = match d.url.as_deref() {
            None => Some("sqlite:switchboard.db".to_owned()),
            Some("") => None,
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") || u.starts_with("sqlite:") => {
                Some(u.to_owned())
            }
            Some(_) => {
                bad("database.url".into(), "must be postgres://…, sqlite:… or \"\" for no database".into());
                None
            }
        };
        let database = DatabaseConfig {
            url,
            migrate_on_start: d.migrate_on_start.unwrap_or(true),
            refresh: duration!(d.refresh, "database.refresh", Duration::from_secs(2)),
            connect_timeout: duration!(d.connect_timeout, "database.connect_timeout", Duration::from_secs(3)),
        };
        let r = self.redis;
        let redis = RedisConfig {
            url: match r.url.as_deref() {
                None | Some("") => None,
                Some(u) if u.starts_with("redis://") => Some(u.to_owned()),
                Some(_) => {
                    bad("redis.url".into(), "must be redis://host:port or \"\" for none".into());
                    None
                }
            },
            key_prefix: r.key_prefix.unwrap_or_else(|| "switchboard:".into()),
            timeout: duration!(r.timeout, "redis.timeout", Duration::from_millis(100)),
        };
        let ss = self.sessions;
        let sessions = SessionsConfig {
            redis: match ss.store.as_deref().unwrap_or("memory") {
                "memory" => false,
                "redis" => {
                    if redis.url.is_none() {
                        bad("sessions.store".into(), "\"redis\" needs [redis] url".into());
                    }
                    true
                }
                other => {
                    bad("sessions.store".into(), format!("{other:?} is not \"memory\" or \"redis\""));
                    false
                }
            },
            // Zero is allowed: check the store on every request.
            cache: match ss.cache.as_ref().map(RawDuration::parse) {
                None => Duration::from_secs(2),
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    bad("sessions.cache".into(), e);
                    Duration::from_secs(2)
                }
            },
        };
        let a = self.audit;
        // Audit needs a database: asked for with none, the file contradicts
        // itself; by default, audit is simply off (and `Config::notes` says so).
        if a.enabled == Some(true) && database.url.is_none() {
            bad(
                "audit.enabled".into(),
                "is true but database.url is \"\" (no database): audit records need one; give database.url, or set audit.enabled = false".into(),
            );
        }
        let audit = AuditConfig {
            enabled: a.enabled.unwrap_or(true) && database.url.is_some(),
            spool: PathBuf::from(a.spool.unwrap_or_else(|| "switchboard-audit.spool".into())),
            queue: a.queue.unwrap_or(65_536).max(1) as usize,
            batch: a.batch.unwrap_or(500).clamp(1, 2000) as usize,
            write_timeout: duration!(a.write_timeout, "audit.write_timeout", Duration::from_secs(5)),
            retry_every: duration!(a.retry_every, "audit.retry_every", Duration::from_secs(1)),
            flush_every: duration!(a.flush_every, "audit.flush_every", Duration::from_millis(100)),
        };
        let admin = AdminConfig {
            listen: match self.admin.listen.as_deref() {
                None | Some("") => None,
                Some(l) => match l.parse::<SocketAddr>() {
                    Ok(addr) => Some(addr),
                    Err(_) => {
                        bad("admin.listen".into(), "must be an address such as \"127.0.0.1:9090\"".into());
                        None
                    }
                },
            },
            token: self.admin.token.filter(|t| !t.is_empty()),
            tls: tls_pair(self.admin.tls_cert, self.admin.tls_key, "admin", &mut bad),
        };
        if admin.listen.is_some() {
            match &admin.token {
                None => bad("admin.token".into(), "is required when admin.listen is set".into()),
                Some(t) if t.len() < 16 => bad("admin.token".into(), "must be at least 16 characters".into()),
                Some(_) => {}
            }
        }

        // [edge]
        let e = self.edge;
        let edge = EdgeConfig {
            listen: match e.listen.as_deref() {
                None | Some("") => None,
                Some(l) => match l.parse::<SocketAddr>() {
                    Ok(addr) => Some(addr),
                    Err(_) => {
                        bad("edge.listen".into(), "must be an address such as \"127.0.0.1:7000\"".into());
                        None
                    }
                },
            },
            tls: tls_pair(e.tls_cert, e.tls_key, "edge", &mut bad),
            max_frame_bytes: match e.max_frame_bytes {
                None => 1 << 20,
                Some(n) if (64..=(64 << 20)).contains(&n) => n as usize,
                Some(_) => {
                    bad("edge.max_frame_bytes".into(), "must be between 64 and 67108864".into());
                    1 << 20
                }
            },
            register_timeout: duration!(e.register_timeout, "edge.register_timeout", Duration::from_secs(10)),
            call_timeout: duration!(e.call_timeout, "edge.call_timeout", Duration::from_secs(30)),
            grace: duration!(e.grace, "edge.grace", Duration::from_secs(5)),
            task_handler: e.task_handler.filter(|h| !h.is_empty()),
            task_timeout: duration!(e.task_timeout, "edge.task_timeout", Duration::from_secs(120)),
            max_devices: e.max_devices.unwrap_or(10_000).max(1) as usize,
        };

        // [[tenants]]
        let upstream_names: Vec<&str> = upstreams.iter().map(|u: &UpstreamConfig| u.name.as_str()).collect();
        let mut tenants = Vec::new();
        let mut tenant_names = HashSet::new();
        for (i, t) in self.tenants.into_iter().enumerate() {
            let name = t.name.unwrap_or_default();
            if !switchboard_core::ids::valid_name(&name) {
                bad(format!("tenants[{i}].name"), format!("must be 1 to 48 of {NAME_CHARS}"));
            } else if !tenant_names.insert(name.clone()) {
                bad(format!("tenants[{i}].name"), format!("{name:?} is used by another tenant"));
            }
            let policy = switchboard_core::policy::Policy {
                upstreams: t.upstreams,
                tools: t.tools,
                limits: t.limits,
                audit_arguments: t.audit_arguments,
                accept: t.accept,
                discovery: t.discovery,
                task_handler: t.task_handler,
                pinning: t.pinning,
            };
            for (field, message) in policy.problems(&upstream_names) {
                bad(format!("tenants[{i}].{field}"), message);
            }
            tenants.push((name, policy));
        }

        // [oauth]
        let oauth = super::oauth::validate(self.oauth, &egress, &mut bad);
        if oauth.is_some() && !auth.required {
            bad("oauth".into(), "OAuth needs authentication on: remove auth.mode = \"none\"".into());
        }
        if let (Some(first), None) = (exchanged.first(), &oauth) {
            bad(
                format!("upstreams.{}.oauth", first.upstream),
                "grant = \"token_exchange\" trades each caller's OAuth access token: configure [oauth]".into(),
            );
        }

        // [mtls]
        let mtls = super::mtls::validate(self.mtls, server.tls.is_some(), &mut bad);
        if mtls.is_some() && !auth.required {
            bad("mtls".into(), "client certificates need authentication on: remove auth.mode = \"none\"".into());
        }

        // [vault]
        let vault = super::vault::validate(self.vault, &mut bad);
        if !delegated.is_empty() && !vault.has_key() {
            bad(
                format!("upstreams.{}.oauth", delegated[0].upstream),
                "grant = \"authorization_code\" keeps each user's tokens in the vault: set vault.key (and database.url)".into(),
            );
        }
        if !delegated.is_empty() && server.public_url.is_none() && server.listen.port() == 0 {
            bad(
                "server.public_url".into(),
                "is required for grant = \"authorization_code\" when listening on port 0: the authorization callback's address".into(),
            );
        }
        if vault.has_key() && database.url.is_none() {
            bad("vault.key".into(), "the vault keeps credentials in the database: set database.url".into());
        }
        if database.url.is_none() {
            if let Some(i) = tenants.iter().position(|(_, p)| p.pinning.is_some()) {
                bad(
                    format!("tenants[{i}].pinning"),
                    "pinned tool definitions are kept in the database: set database.url".into(),
                );
            }
        }

        if problems.is_empty() {
            Ok(Config {
                server,
                catalog,
                upstreams,
                log,
                telemetry,
                auth,
                database,
                redis,
                sessions,
                audit,
                admin,
                edge,
                tenants,
                oauth,
                mtls,
                egress,
                vault,
                delegated,
                exchanged,
            })
        } else {
            Err(ConfigError { problems })
        }
    }
}

impl RawUpstream {
    fn has(&self, field: &str) -> bool {
        match field {
            "url" => self.url.is_some(),
            "urls" => self.urls.is_some(),
            "health_interval" => self.health_interval.is_some(),
            "headers" => self.headers.is_some(),
            "http2" => self.http2.is_some(),
            "connect_timeout" => self.connect_timeout.is_some(),
            "pool_max_idle" => self.pool_max_idle.is_some(),
            "ca" => self.ca.is_some(),
            "tls_client_cert" => self.tls_client_cert.is_some(),
            "tls_client_key" => self.tls_client_key.is_some(),
            "credentials" => self.credentials.is_some(),
            "oauth" => self.oauth.is_some(),
            "command" => self.command.is_some(),
            "args" => self.args.is_some(),
            "env" => self.env.is_some(),
            "inherit_env" => self.inherit_env.is_some(),
            "cwd" => self.cwd.is_some(),
            "restart_max_backoff" => self.restart_max_backoff.is_some(),
            "shutdown_grace" => self.shutdown_grace.is_some(),
            "per_session" => self.per_session.is_some(),
            "max_processes" => self.max_processes.is_some(),
            "idle_timeout" => self.idle_timeout.is_some(),
            _ => false,
        }
    }
}

/// The TLS client of an upstream with an `https` URL: the platform's roots
/// and its `ca`, its client certificate (`tls_client_cert` and
/// `tls_client_key`) if any; ALPN `http/1.1`. `None` for `http` URLs (where
/// those keys are errors).
fn upstream_tls(
    u: &RawUpstream,
    replicas: &[Uri],
    key: &dyn Fn(&str) -> String,
    bad: &mut impl FnMut(String, String),
) -> Option<std::sync::Arc<tokio_rustls::rustls::ClientConfig>> {
    let secure = replicas.iter().any(|url| url.scheme_str() == Some("https"));
    let (ca, cert, client_key) = (
        u.ca.as_deref().filter(|v| !v.is_empty()),
        u.tls_client_cert.as_deref().filter(|v| !v.is_empty()),
        u.tls_client_key.as_deref().filter(|v| !v.is_empty()),
    );
    if !secure {
        for (field, set) in
            [("ca", ca.is_some()), ("tls_client_cert", cert.is_some()), ("tls_client_key", client_key.is_some())]
        {
            if set {
                bad(key(field), "only applies to https:// URLs".into());
            }
        }
        return None;
    }
    let ca_pem = match ca.map(|path| (path, std::fs::read(path))) {
        None => None,
        Some((_, Ok(pem))) => Some(pem),
        Some((path, Err(e))) => {
            bad(key("ca"), format!("cannot read {path}: {e}"));
            return None;
        }
    };
    let client = match (cert, client_key) {
        (None, None) => None,
        (Some(cert), Some(client_key)) => {
            match switchboard_core::tls::read_pem(cert.as_ref(), client_key.as_ref(), "client") {
                Ok(pair) => Some(pair),
                Err(e) => {
                    bad(key("tls_client_cert"), e.to_string());
                    return None;
                }
            }
        }
        (Some(_), None) => {
            bad(key("tls_client_key"), "is required with tls_client_cert".into());
            return None;
        }
        (None, Some(_)) => {
            bad(key("tls_client_cert"), "is required with tls_client_key".into());
            return None;
        }
    };
    match switchboard_core::tls::client_config(ca_pem.as_deref(), client, &[b"http/1.1"]) {
        Ok(config) => Some(config),
        Err(e) => {
            bad(key(if e.contains("client certificate") { "tls_client_cert" } else { "ca" }), e);
            None
        }
    }
}

/// `SECTION.tls_cert` and `SECTION.tls_key`: both or neither.
fn tls_pair(
    cert: Option<String>,
    key: Option<String>,
    section: &str,
    bad: &mut impl FnMut(String, String),
) -> Option<(PathBuf, PathBuf)> {
    match (cert.filter(|c| !c.is_empty()), key.filter(|k| !k.is_empty())) {
        (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
        (None, None) => None,
        (Some(_), None) => {
            bad(format!("{section}.tls_key"), format!("is required with {section}.tls_cert"));
            None
        }
        (None, Some(_)) => {
            bad(format!("{section}.tls_cert"), format!("is required with {section}.tls_key"));
            None
        }
    }
}
