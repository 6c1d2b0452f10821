//! What a tenant may use and how much ([`Policy`], as stored and
//! configured), the same resolved against the configured upstreams
//! ([`Tenant`], what the request path asks), and who made a request
//! ([`Principal`]). Plain values: how tenants are stored and keys checked is
//! `switchboard-tenancy`'s business.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::UpstreamId;

/// What a tenant may use and how much: stored as JSON in the database and
/// written as `[[tenants]]` in the config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Upstream names the tenant subscribes to; `"*"` for all.
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Per upstream name: which of its tools the tenant sees.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolFilter>,
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Store `tools/call` arguments in audit records.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub audit_arguments: bool,
    /// The credentials the tenant accepts: `"api_keys"`, `"oauth"` (a token
    /// of any authorization server that maps to it), `"oauth:NAME"` (of
    /// that one) or `"client_cert"` (a client certificate whose subject
    /// maps to it). Empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept: Vec<String>,
    /// How `tools/list` offers the tenant's tools: all of them (`full`, the
    /// default), or a few meta-tools that search, describe and call them
    /// (`progressive`, for catalogs too large for a model's context).
    #[serde(default, skip_serializing_if = "Discovery::is_full")]
    pub discovery: Discovery,
    /// The tool that answers the text tasks of the tenant's edge devices
    /// (an exposed name among its tools, or one of its devices' tools), in
    /// place of the router-wide `edge.task_handler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_handler: Option<String>,
    /// Tool-definition pinning: each tool's definition approved once, and
    /// a changed one held back (or flagged) until approved again. `None`:
    /// off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinning: Option<Pinning>,
}

/// How a tenant's tool definitions are pinned (see [`Policy::pinning`]).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Pinning {
    /// Who approves a tool's first definition.
    #[serde(default)]
    pub approve: Approve,
    /// What the tenant's clients get of a tool whose definition changed
    /// since it was approved, until an operator approves the new one.
    #[serde(default)]
    pub on_change: OnChange,
}

/// Who approves a tool's first definition.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Approve {
    /// Pinned as first seen.
    #[default]
    FirstSight,
    /// Withheld until an operator approves it.
    Operator,
}

/// What a tenant gets of a tool whose definition changed.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnChange {
    /// Neither listed nor callable.
    #[default]
    Withhold,
    /// Listed (marked in its `_meta`) and callable.
    Warn,
}

/// How a tenant's clients discover its tools (see [`Policy::discovery`]).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Discovery {
    #[default]
    Full,
    Progressive,
}

impl Discovery {
    pub fn is_full(&self) -> bool {
        *self == Discovery::Full
    }
}

/// Tool name patterns (`*` matches any run of characters, `?` one): a tool is
/// seen if it matches an `allow` pattern (or `allow` is empty) and no `deny`
/// pattern. Patterns match the upstream's own tool name, not the namespaced one.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl ToolFilter {
    pub fn permits(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|p| glob(p, name))) && !self.deny.iter().any(|p| glob(p, name))
    }
}

/// Rate limits of a tenant: each is optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Requests of one API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Rate>,
    /// Requests of all the tenant's keys together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Rate>,
    /// `tools/call` of one tool, by all the tenant's keys together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Rate>,
    /// Forwarded requests of the tenant in flight at once, on one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u32>,
    /// Sessions of the tenant held at once, on one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u32>,
    /// Sessions of one API key held at once, on one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sessions: Option<u32>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.key.is_none()
            && self.tenant.is_none()
            && self.tool.is_none()
            && self.concurrent.is_none()
            && self.sessions.is_none()
            && self.key_sessions.is_none()
    }
}

/// A sustained rate with a burst: `burst` requests at once, then one every
/// `1 / per_second` seconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub per_second: f64,
    #[serde(default = "one")]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

impl Policy {
    /// Problems with this policy, each as `(field, message)`; `upstreams`
    /// are the configured upstream names.
    pub fn problems(&self, upstreams: &[&str]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            if u != "*" && !upstreams.contains(&u.as_str()) {
                out.push((format!("upstreams[{i}]"), format!("{u:?} is not a configured upstream")));
            }
        }
        for u in self.tools.keys() {
            if !upstreams.contains(&u.as_str()) {
                out.push((format!("tools.{u}"), format!("{u:?} is not a configured upstream")));
            }
        }
        for (name, rate) in [("key", self.limits.key), ("tenant", self.limits.tenant), ("tool", self.limits.tool)] {
            if let Some(rate) = rate {
                if !(rate.per_second.is_finite() && rate.per_second > 0.0) {
                    out.push((format!("limits.{name}.per_second"), "must be greater than zero".into()));
                }
                if rate.burst == 0 {
                    out.push((format!("limits.{name}.burst"), "must be at least 1".into()));
                }
            }
        }
        if let Some(h) = &self.task_handler {
            if h.is_empty() || h.len() > 256 || h.chars().any(char::is_control) {
                out.push(("task_handler".into(), "a tool's name: 1 to 256 characters, no control characters".into()));
            }
        }
        if self.limits.concurrent == Some(0) {
            out.push(("limits.concurrent".into(), "must be at least 1".into()));
        }
        for (i, a) in self.accept.iter().enumerate() {
            let known = a == "api_keys"
                || a == "oauth"
                || a == "client_cert"
                || a.strip_prefix("oauth:").is_some_and(|n| !n.is_empty());
            if !known {
                out.push((
                    format!("accept[{i}]"),
                    format!("{a:?} is not \"api_keys\", \"oauth\", \"oauth:NAME\" or \"client_cert\""),
                ));
            }
        }
        out
    }
}

/// A tenant, resolved against the configured upstreams.
#[derive(Debug)]
pub struct Tenant {
    pub name: Arc<str>,
    /// Per upstream index: `None` if not subscribed.
    access: Vec<Option<ToolFilter>>,
    /// Subscribed to everything, with no tool filter.
    unrestricted: bool,
    pub limits: Limits,
    pub audit_arguments: bool,
    /// What the tenant accepts (see [`Policy::accept`]).
    accept: Vec<String>,
    /// How `tools/list` offers its tools.
    pub discovery: Discovery,
    /// The tool that answers its devices' text tasks (`None`: the router's).
    pub task_handler: Option<Arc<str>>,
    /// Its tool-definition pinning, if on.
    pub pinning: Option<Pinning>,
    /// A slot for the router's per-tenant metric handles, made on first use.
    pub meters: std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Tenant {
    /// Resolves `policy`; upstream names that are not configured are ignored.
    pub fn new(name: &str, policy: &Policy, upstreams: &[Arc<str>]) -> Tenant {
        let all = policy.upstreams.iter().any(|u| u == "*");
        let access: Vec<Option<ToolFilter>> = upstreams
            .iter()
            .map(|u| {
                let subscribed = all || policy.upstreams.iter().any(|p| **p == **u);
                subscribed.then(|| policy.tools.get(&**u).cloned().unwrap_or_default())
            })
            .collect();
        // A pinned catalog is filtered too: by each tool's approved definition.
        let unrestricted = policy.pinning.is_none()
            && access.iter().all(|a| a.as_ref().is_some_and(|f| f.allow.is_empty() && f.deny.is_empty()));
        Tenant {
            name: Arc::from(name),
            access,
            unrestricted,
            limits: policy.limits.clone(),
            audit_arguments: policy.audit_arguments,
            accept: policy.accept.clone(),
            discovery: policy.discovery,
            task_handler: policy.task_handler.as_deref().map(Arc::from),
            pinning: policy.pinning,
            meters: std::sync::OnceLock::new(),
        }
    }

    /// Whether the tenant takes API keys.
    pub fn accepts_keys(&self) -> bool {
        self.accept.is_empty() || self.accept.iter().any(|a| a == "api_keys")
    }

    /// Whether the tenant takes tokens of the authorization server `server`.
    pub fn accepts_oauth(&self, server: &str) -> bool {
        self.accept.is_empty() || self.accept.iter().any(|a| a == "oauth" || a.strip_prefix("oauth:") == Some(server))
    }

    /// Whether the tenant takes client certificates.
    pub fn accepts_client_cert(&self) -> bool {
        self.accept.is_empty() || self.accept.iter().any(|a| a == "client_cert")
    }

    /// Whether the tenant subscribes to upstream `u` (its resources, prompts, tools).
    pub fn sees_upstream(&self, u: UpstreamId) -> bool {
        self.access.get(u.index()).is_some_and(Option::is_some)
    }

    /// Whether the tenant sees tool `name` (the upstream's own name) of upstream `u`.
    pub fn sees_tool(&self, u: UpstreamId, name: &str) -> bool {
        match self.access.get(u.index()) {
            Some(Some(filter)) => filter.permits(name),
            _ => false,
        }
    }

    /// Sees every upstream and every tool: lists need no filtering.
    pub fn unrestricted(&self) -> bool {
        self.unrestricted
    }
}

/// Who made a request: the tenant, and the key or the user.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: Arc<Tenant>,
    /// The prefix of the API key used; empty when authentication is off or
    /// the caller presented an OAuth access token.
    pub key_prefix: Arc<str>,
    /// Who the caller is, for the per-key rate limit and session cap and
    /// for binding sessions: the key's hash, or for a token `u:` and a hash
    /// of its authorization server and user. Empty when authentication is off.
    pub key_id: Arc<str>,
    /// The user an OAuth access token names (its `sub`, or the configured
    /// claim), for audit records and traces; `None` for an API key.
    pub user: Option<Arc<str>>,
    /// The scopes of an OAuth access token, when the router maps scopes to
    /// permissions; `None`: everything the tenant may do.
    pub scopes: Option<Arc<Scopes>>,
}

/// An OAuth access token's scopes, with the permissions they map to
/// (`[oauth.scopes]`) worked out once per token, not at each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scopes {
    /// As the token names them (a refusal names them again).
    pub names: Box<[Box<str>]>,
    /// What they allow, together.
    pub allows: Box<[Permission]>,
}

/// What a token's scopes let it do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// `list`: the lists (tools, prompts, resources, templates).
    List,
    /// `call` or `call:PATTERN`: tools whose (namespaced) name matches.
    Call(Option<String>),
    /// `read` or `read:PATTERN`: prompts by name, resources by URI, completions.
    Read(Option<String>),
}

impl Principal {
    /// The caller of an API key (or, with empty `key_*`, of the open tenant).
    pub fn of_key(tenant: Arc<Tenant>, key_prefix: Arc<str>, key_id: Arc<str>) -> Principal {
        Principal { tenant, key_prefix, key_id, user: None, scopes: None }
    }
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Bearer` or `X-API-Key`.
    Missing,
    /// Not a key we know (or revoked).
    Invalid,
    /// Known, but past its expiry.
    Expired,
    /// Not known yet: the router has not loaded its keys, because the
    /// database has been unreachable since it started. The key may well be
    /// valid; try again shortly.
    NotLoaded,
    /// An OAuth access token that is not valid (signature, issuer,
    /// audience, malformed, revoked).
    TokenInvalid,
    /// An OAuth access token past its expiry.
    TokenExpired,
    /// A good token, but its tenant does not accept it (or it names no
    /// tenant of this router); or an API key of a tenant that accepts only
    /// tokens.
    NotAccepted,
    /// The token could not be checked: its authorization server cannot be
    /// reached and nothing about it is cached. Try again shortly.
    Unverifiable,
    /// A client certificate (verified) whose subject names no tenant, and
    /// no other credential.
    UnknownCertificate,
}

impl AuthFailure {
    pub fn label(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Invalid => "invalid",
            AuthFailure::Expired => "expired",
            AuthFailure::NotLoaded => "not_loaded",
            AuthFailure::TokenInvalid => "token_invalid",
            AuthFailure::TokenExpired => "token_expired",
            AuthFailure::NotAccepted => "not_accepted",
            AuthFailure::Unverifiable => "token_unverifiable",
            AuthFailure::UnknownCertificate => "certificate_unmapped",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "an API key is required: send it as \"Authorization: Bearer <key>\" or \"X-API-Key: <key>\""
            }
            AuthFailure::Invalid => "the API key is not valid (unknown or revoked)",
            AuthFailure::Expired => "the API key has expired; ask for a new one",
            AuthFailure::NotLoaded => {
                "the router cannot check API keys yet: its database has been unreachable since it started; try again shortly"
            }
            AuthFailure::TokenInvalid => "the access token is not valid",
            AuthFailure::TokenExpired => "the access token has expired",
            AuthFailure::NotAccepted => "this credential is not accepted for the tenant it names",
            AuthFailure::Unverifiable => {
                "the access token cannot be checked now: its authorization server is unreachable; try again shortly"
            }
            AuthFailure::UnknownCertificate => {
                "the client certificate's subject is not mapped to a tenant (mtls.subjects), and no API key or token was sent"
            }
        }
    }
}

/// `*` matches any run of characters, `?` exactly one; everything else itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(i: usize) -> UpstreamId {
        UpstreamId::new(i)
    }

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("echo", "echo"));
        assert!(!glob("echo", "echoes"));
        assert!(glob("echo*", "echoes"));
        assert!(glob("*_file", "create_file"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("g?t", "get"));
        assert!(!glob("g?t", "gt"));
    }

    #[test]
    fn filters() {
        let f = ToolFilter { allow: vec!["get_*".into(), "echo".into()], deny: vec!["get_secret*".into()] };
        assert!(f.permits("get_time"));
        assert!(f.permits("echo"));
        assert!(!f.permits("get_secret_key"));
        assert!(!f.permits("delete_all"));
        assert!(ToolFilter::default().permits("anything"));
    }

    #[test]
    fn tenants_resolve_against_upstreams() {
        let ups: Vec<Arc<str>> = vec!["a".into(), "b".into(), "c".into()];
        let mut policy = Policy { upstreams: vec!["a".into(), "c".into(), "gone".into()], ..Policy::default() };
        policy.tools.insert("c".into(), ToolFilter { allow: vec!["x*".into()], deny: vec![] });
        let t = Tenant::new("t", &policy, &ups);
        assert!(t.sees_upstream(u(0)) && !t.sees_upstream(u(1)) && t.sees_upstream(u(2)));
        assert!(t.sees_tool(u(0), "anything"));
        assert!(!t.sees_tool(u(1), "anything"));
        assert!(t.sees_tool(u(2), "xray") && !t.sees_tool(u(2), "yak"));
        assert!(!t.unrestricted());
        let all = Tenant::new("all", &Policy { upstreams: vec!["*".into()], ..Policy::default() }, &ups);
        assert!(all.unrestricted());
        assert_eq!(
            policy.problems(&["a", "b", "c"]).iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["upstreams[2]"]
        );
    }
}
