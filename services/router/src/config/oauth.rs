//! `[oauth]`: the router as an OAuth 2.1 resource server (the MCP
//! authorization specification): its resource identifier, the
//! authorization servers whose tokens it accepts and how a token maps to a
//! tenant and a user, and how scopes map to permissions.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
pub use switchboard_core::policy::Permission;
use switchboard_oauth::{Alg, ServerSettings, Settings};

use super::RawDuration;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOAuth {
    pub resource: Option<String>,
    pub resource_name: Option<String>,
    pub algorithms: Option<Vec<String>>,
    pub leeway: Option<RawDuration>,
    pub jwks_refetch_every: Option<RawDuration>,
    pub jwks_max_age: Option<RawDuration>,
    pub introspection_cache: Option<RawDuration>,
    pub fetch_timeout: Option<RawDuration>,
    pub scope: Option<String>,
    #[serde(default)]
    pub scopes: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub servers: BTreeMap<String, RawAuthServer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthServer {
    pub issuer: Option<String>,
    pub metadata_url: Option<String>,
    pub jwks_uri: Option<String>,
    pub introspection_endpoint: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub client_secret_file: Option<String>,
    pub ca: Option<String>,
    pub tenant: Option<String>,
    pub tenant_claim: Option<String>,
    pub user_claim: Option<String>,
}

/// A permission as `[oauth.scopes]` writes it.
fn parse_permission(text: &str) -> Option<Permission> {
    let (verb, pattern) = match text.split_once(':') {
        Some((verb, pattern)) if !pattern.is_empty() => (verb, Some(pattern.to_owned())),
        Some(_) => return None,
        None => (text, None),
    };
    match (verb, pattern) {
        ("list", None) => Some(Permission::List),
        ("call", p) => Some(Permission::Call(p)),
        ("read", p) => Some(Permission::Read(p)),
        _ => None,
    }
}

/// Where a token's tenant comes from.
#[derive(Debug, Clone)]
pub enum TenantFrom {
    /// Every token of the server is this tenant's.
    Fixed(String),
    /// The value of this claim names the tenant.
    Claim(String),
}

/// One authorization server.
#[derive(Debug, Clone)]
pub struct AuthServerConfig {
    pub settings: ServerSettings,
    pub tenant: TenantFrom,
    /// The claim naming the user (`sub` by default).
    pub user_claim: String,
}

/// `[oauth]`, validated. `None` in [`super::Config`] when no server is configured.
#[derive(Debug, Clone)]
pub struct OAuthConfig {
    /// The resource identifier (RFC 8707): the MCP endpoint's URL as
    /// clients reach it, and the `aud` tokens must carry.
    pub resource: String,
    pub resource_name: Option<String>,
    pub settings: Settings,
    pub servers: Vec<AuthServerConfig>,
    /// Scope → permissions; empty: scopes are not checked.
    pub scopes: BTreeMap<String, Vec<Permission>>,
    /// The scope a client is told to ask for in a 401 challenge.
    pub scope: Option<String>,
}

impl OAuthConfig {
    /// The URL of the protected resource metadata (RFC 9728, section 3.1:
    /// the well-known path inserted before the resource's path).
    pub fn metadata_url(&self) -> String {
        let (origin, path) = split_origin(&self.resource);
        format!("{origin}/.well-known/oauth-protected-resource{path}")
    }

    /// The path part of [`OAuthConfig::metadata_url`], served by the router.
    pub fn metadata_path(&self) -> String {
        let (_, path) = split_origin(&self.resource);
        format!("/.well-known/oauth-protected-resource{path}")
    }
}

/// `https://host:port/path` → (`https://host:port`, `/path`), without a trailing slash.
fn split_origin(url: &str) -> (&str, &str) {
    let url = url.trim_end_matches('/');
    match url.find("://").map(|i| i + 3).and_then(|start| url[start..].find('/').map(|s| start + s)) {
        Some(at) => url.split_at(at),
        None => (url, ""),
    }
}

fn is_url(text: &str, https_only: bool) -> bool {
    let Ok(uri) = text.parse::<http::Uri>() else { return false };
    let scheme_ok = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => !https_only,
        _ => false,
    };
    scheme_ok && uri.host().is_some_and(|h| !h.is_empty())
}

/// Validates `[oauth]`, reporting problems through `bad`.
pub fn validate(
    raw: RawOAuth,
    egress: &switchboard_core::egress::Egress,
    bad: &mut impl FnMut(String, String),
) -> Option<OAuthConfig> {
    let mut duration = |value: Option<RawDuration>, key: &str, default: Duration, zero_ok: bool| match value
        .as_ref()
        .map(RawDuration::parse)
    {
        None => default,
        Some(Ok(d)) if zero_ok || !d.is_zero() => d,
        Some(Ok(_)) => {
            bad(format!("oauth.{key}"), "must be greater than zero".into());
            default
        }
        Some(Err(e)) => {
            bad(format!("oauth.{key}"), e);
            default
        }
    };
    let leeway = duration(raw.leeway, "leeway", Duration::from_secs(60), true);
    let refetch_every = duration(raw.jwks_refetch_every, "jwks_refetch_every", Duration::from_secs(30), false);
    let keys_max_age = duration(raw.jwks_max_age, "jwks_max_age", Duration::from_secs(3600), false);
    let introspection_cache = duration(raw.introspection_cache, "introspection_cache", Duration::from_secs(60), true);
    let timeout = duration(raw.fetch_timeout, "fetch_timeout", Duration::from_secs(5), false);
    if leeway > Duration::from_secs(300) {
        bad("oauth.leeway".into(), "must be at most 5m (it lets expired tokens in)".into());
    }
    if raw.servers.is_empty() {
        if raw.resource.is_some() || !raw.scopes.is_empty() {
            bad("oauth.servers".into(), "name at least one authorization server ([oauth.servers.NAME])".into());
        }
        return None;
    }
    let resource = raw.resource.unwrap_or_default();
    if !is_url(&resource, false) || resource.contains('#') {
        bad(
            "oauth.resource".into(),
            "must be the MCP endpoint's URL as clients reach it, such as \"https://mcp.example.com/mcp\"".into(),
        );
    }
    let mut algorithms = Vec::new();
    for (i, name) in
        raw.algorithms.unwrap_or_else(|| Alg::ALL.iter().map(|a| a.name().to_owned()).collect()).iter().enumerate()
    {
        match Alg::parse(name) {
            Some(alg) => algorithms.push(alg),
            None => bad(
                format!("oauth.algorithms[{i}]"),
                format!("{name:?} is not one of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA (never none or HMAC)"),
            ),
        }
    }
    if algorithms.is_empty() {
        bad("oauth.algorithms".into(), "must name at least one algorithm".into());
    }
    let mut scopes = BTreeMap::new();
    for (scope, permissions) in raw.scopes {
        if scope.is_empty() || scope.bytes().any(|b| b <= b' ' || b == b'"' || b == b'\\' || b >= 0x7f) {
            bad(
                format!("oauth.scopes.{scope}"),
                "a scope is printable ASCII without spaces, quotes or backslashes".into(),
            );
        }
        let mut parsed = Vec::new();
        for (i, p) in permissions.iter().enumerate() {
            match parse_permission(p) {
                Some(p) => parsed.push(p),
                None => bad(
                    format!("oauth.scopes.{scope}[{i}]"),
                    format!("{p:?} is not \"list\", \"call\", \"call:PATTERN\", \"read\" or \"read:PATTERN\""),
                ),
            }
        }
        scopes.insert(scope, parsed);
    }
    let scope = raw.scope.filter(|s| !s.is_empty()).or_else(|| {
        let listing: Vec<&str> =
            scopes.iter().filter(|(_, p)| p.contains(&Permission::List)).map(|(s, _)| s.as_str()).collect();
        (!listing.is_empty()).then(|| listing.join(" "))
    });
    if let Some(s) = &scope {
        if s.contains('"') || s.contains('\\') {
            bad("oauth.scope".into(), "must not contain quotes or backslashes".into());
        }
    }
    let mut servers = Vec::new();
    for (name, s) in raw.servers {
        let key = |field: &str| format!("oauth.servers.{name}.{field}");
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            bad(format!("oauth.servers.{name}"), "a server's name is letters, digits, '_' and '-'".into());
        }
        let issuer = s.issuer.unwrap_or_default();
        if !is_url(&issuer, false) {
            bad(key("issuer"), "must be the authorization server's issuer URL (the iss of its tokens)".into());
        }
        for (field, url) in [
            ("metadata_url", &s.metadata_url),
            ("jwks_uri", &s.jwks_uri),
            ("introspection_endpoint", &s.introspection_endpoint),
        ] {
            if url.as_deref().is_some_and(|u| !is_url(u, false)) {
                bad(key(field), "must be an http(s) URL".into());
            }
        }
        let secret = match (s.client_secret.filter(|c| !c.is_empty()), s.client_secret_file.filter(|f| !f.is_empty())) {
            (Some(secret), None) => Some(secret),
            (None, Some(file)) => match std::fs::read_to_string(&file) {
                Ok(secret) => Some(secret.trim().to_owned()),
                Err(e) => {
                    bad(key("client_secret_file"), format!("cannot read {file}: {e}"));
                    None
                }
            },
            (None, None) => None,
            (Some(_), Some(_)) => {
                bad(key("client_secret"), "give client_secret or client_secret_file, not both".into());
                None
            }
        };
        let client = match (s.client_id.filter(|c| !c.is_empty()), secret) {
            (Some(id), Some(secret)) => Some((id, secret)),
            (None, None) => None,
            (Some(_), None) => {
                bad(key("client_secret"), "is required with client_id (introspection authenticates the router)".into());
                None
            }
            (None, Some(_)) => {
                bad(key("client_id"), "is required with a client secret".into());
                None
            }
        };
        let ca = match s.ca.filter(|c| !c.is_empty()) {
            Some(path) => match std::fs::read(&path) {
                Ok(pem) => Some(pem),
                Err(e) => {
                    bad(key("ca"), format!("cannot read {path}: {e}"));
                    None
                }
            },
            None => None,
        };
        let tenant = match (s.tenant.filter(|t| !t.is_empty()), s.tenant_claim.filter(|c| !c.is_empty())) {
            (Some(t), None) => TenantFrom::Fixed(t),
            (None, Some(c)) => TenantFrom::Claim(c),
            (None, None) => {
                bad(
                    key("tenant"),
                    "name the tenant its tokens belong to (tenant), or the claim that names it (tenant_claim)".into(),
                );
                TenantFrom::Fixed(String::new())
            }
            (Some(_), Some(_)) => {
                bad(key("tenant"), "give tenant or tenant_claim, not both".into());
                TenantFrom::Fixed(String::new())
            }
        };
        let settings = ServerSettings {
            name: name.clone(),
            issuer,
            metadata_url: s.metadata_url,
            jwks_uri: s.jwks_uri,
            introspection_endpoint: s.introspection_endpoint,
            client,
            ca,
        };
        if let Err(e) = switchboard_oauth::fetch::Fetcher::new(settings.ca.as_deref(), timeout, egress.clone()) {
            bad(key("ca"), e);
        }
        let user_claim = s.user_claim.filter(|c| !c.is_empty()).unwrap_or_else(|| "sub".into());
        servers.push(AuthServerConfig { settings, tenant, user_claim });
    }
    let settings = Settings {
        audience: resource.clone(),
        algorithms,
        leeway,
        refetch_every,
        keys_max_age,
        introspection_cache,
        timeout,
        egress: egress.clone(),
    };
    Some(OAuthConfig { resource, resource_name: raw.resource_name, settings, servers, scopes, scope })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_url_inserts_the_well_known_path() {
        let (o, p) = split_origin("https://mcp.example.com/mcp/");
        assert_eq!((o, p), ("https://mcp.example.com", "/mcp"));
        assert_eq!(split_origin("http://127.0.0.1:8080"), ("http://127.0.0.1:8080", ""));
    }

    #[test]
    fn permissions_parse() {
        assert_eq!(parse_permission("list"), Some(Permission::List));
        assert_eq!(parse_permission("call"), Some(Permission::Call(None)));
        assert_eq!(parse_permission("call:github__*"), Some(Permission::Call(Some("github__*".into()))));
        assert_eq!(parse_permission("read:file://*"), Some(Permission::Read(Some("file://*".into()))));
        for bad in ["list:x", "call:", "write", ""] {
            assert_eq!(parse_permission(bad), None, "{bad}");
        }
    }
}
