//! How to reach an upstream, as the router's configuration says once it is
//! validated (the TOML form and its checks are the router's).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

/// One `[[upstreams]]` entry.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Unique name; appears in metrics, logs and errors.
    pub name: String,
    /// Namespace for its tools and prompts (`prefix + separator + name`); empty for none.
    pub prefix: String,
    /// How to reach it.
    pub transport: TransportConfig,
    /// Longest wait for the answer to one request.
    pub timeout: Duration,
    /// Longest wait for one of its lists when building the catalog.
    pub list_timeout: Duration,
    /// `credentials = "required"`: a client's requests go only with a
    /// vault credential of its user or tenant, never with the upstream's
    /// own headers (which the router's own requests, the catalog's, use).
    pub credential_required: bool,
    /// It acts for each user (`[upstreams.oauth] grant =
    /// "authorization_code"`): only a user's own credential lists or calls
    /// it, so the router's catalog leaves it to each user's.
    pub per_user: bool,
}

/// The transport-specific part of an upstream.
#[derive(Debug, Clone)]
pub enum TransportConfig {
    /// Streamable HTTP.
    Http(HttpConfig),
    /// A child process speaking newline-delimited JSON.
    Stdio(StdioConfig),
    /// Legacy HTTP+SSE (2024-11-05): `url` is the SSE endpoint.
    Sse(HttpConfig),
}

/// `transport = "http"`.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The first of `replicas`.
    pub url: Uri,
    /// Every URL of the upstream (`urls`, or just `url`): replicas of one
    /// server, sessions spread over them by consistent hashing.
    pub replicas: Vec<Uri>,
    /// How often replicas are checked (with several).
    pub health_interval: Duration,
    /// Extra headers on every request (the router's own credentials for this upstream).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Use HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub http2: bool,
    /// For `https` URLs: the TLS client (the platform's roots plus the
    /// upstream's `ca`, its client certificate if any; ALPN set per use).
    pub tls: Option<std::sync::Arc<tokio_rustls::rustls::ClientConfig>>,
    /// The addresses it may be reached at (`[egress]`).
    pub egress: switchboard_core::egress::Egress,
    pub connect_timeout: Duration,
    /// Idle pooled connections kept per upstream.
    pub pool_max_idle: usize,
    /// The router's own credential obtained when needed (an OAuth client
    /// credentials token), sent where `headers` would be.
    pub own: Option<Own>,
}

/// The router's own credential for an upstream, obtained when needed.
#[derive(Clone)]
pub struct Own(pub std::sync::Arc<dyn crate::OwnCredential>);

impl std::fmt::Debug for Own {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Own(..)")
    }
}

/// `transport = "stdio"`.
#[derive(Debug, Clone)]
pub struct StdioConfig {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Pass the router's whole environment to the child (default: only a safe set).
    pub inherit_env: bool,
    pub cwd: Option<PathBuf>,
    /// Longest pause between restarts of a child that keeps exiting.
    pub restart_max_backoff: Duration,
    /// Grace between closing stdin and SIGTERM, and between SIGTERM and SIGKILL.
    pub shutdown_grace: Duration,
    /// Run one process per client session instead of one for all.
    pub per_session: Option<PerSession>,
}

/// `per_session = true`: a process of its own for each client session,
/// initialised with that client's capabilities (its roots, above all).
#[derive(Debug, Clone, Copy)]
pub struct PerSession {
    /// Processes of this upstream running at once, at most (the catalog's
    /// own included); a session beyond gets a clear error.
    pub max_processes: usize,
    /// A process idle this long is stopped; its session's next request
    /// starts a fresh one.
    pub idle_timeout: Duration,
}

/// The environment a stdio child gets when `inherit_env` is off.
pub const SAFE_ENV: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "TZ", "TMPDIR"];
