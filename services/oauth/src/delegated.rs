//! The router as an OAuth 2.1 client of an upstream, acting for one of its
//! users (the MCP authorization specification, client side): what an
//! upstream's `401` challenge says; its protected resource metadata
//! (RFC 9728) and its authorization server's (RFC 8414, OpenID
//! discovery), each checked as the specification says; the client's
//! identity there (pre-registered, a client ID metadata document, or
//! dynamic registration, RFC 7591); the scope to ask for; the
//! authorization request with PKCE (RFC 7636) and the resource (RFC 8707);
//! the redirect's checks (`state`, `error`, `iss` per RFC 9207); and the
//! token requests (authorization code, refresh).
//!
//! Strings that identify things (the resource, issuers) are kept and
//! compared exactly as the servers wrote them: never normalised.

use std::time::Duration;

use base64::Engine as _;
use http::{Method, StatusCode, Uri};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::fetch::{form_encode, Answer, Fetcher};

/// What a `WWW-Authenticate: Bearer …` challenge says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

/// Reads a `Bearer` challenge (RFC 6750, section 3: auth-params in any
/// order, names case-insensitive, values tokens or quoted strings);
/// `None` if it is not one.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim_start();
    let scheme_end = header.find(|c: char| c.is_ascii_whitespace()).unwrap_or(header.len());
    if !header[..scheme_end].eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut rest = header[scheme_end..].trim_start();
    let mut challenge = Challenge::default();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let name = rest[..eq].trim().trim_start_matches(',').trim().to_ascii_lowercase();
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => out.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => out.push(c),
                }
            }
            rest = &quoted[end? + 1..];
            value = out;
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest[..end].trim().to_owned();
            rest = &rest[end..];
        }
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        match name.as_str() {
            "resource_metadata" => challenge.resource_metadata = Some(value),
            "scope" => challenge.scope = Some(value),
            "error" => challenge.error = Some(value),
            "error_description" => challenge.error_description = Some(value),
            _ => {}
        }
    }
    Some(challenge)
}

/// An upstream's protected resource metadata (RFC 9728).
#[derive(Debug, Clone, Deserialize)]
pub struct ProtectedResource {
    pub resource: String,
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    #[serde(default)]
    pub scopes_supported: Vec<String>,
}

/// An authorization server's metadata (RFC 8414).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct ServerMetadata {
    pub issuer: String,
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: Option<String>,
    pub registration_endpoint: Option<String>,
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Vec<String>,
    #[serde(default)]
    pub code_challenge_methods_supported: Vec<String>,
    #[serde(default)]
    pub client_id_metadata_document_supported: bool,
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: bool,
}

/// The scheme and authority of `url` (`https://host:port`), and its path
/// without a trailing slash (`""` for none).
fn origin_and_path(url: &str) -> Option<(String, String)> {
    let uri: Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?;
    let authority = uri.authority()?.as_str();
    let path = uri.path().trim_end_matches('/');
    Some((format!("{scheme}://{authority}"), path.to_owned()))
}

/// Where to look for the protected resource metadata of the upstream at
/// `server_url`: the challenge's `resource_metadata` alone if it names
/// one, else the path-based well-known URL, then the root one.
pub fn resource_metadata_urls(server_url: &str, challenge: &Challenge) -> Vec<String> {
    if let Some(url) = &challenge.resource_metadata {
        return vec![url.clone()];
    }
    let Some((origin, path)) = origin_and_path(server_url) else { return Vec::new() };
    let mut urls = Vec::new();
    if !path.is_empty() {
        urls.push(format!("{origin}/.well-known/oauth-protected-resource{path}"));
    }
    urls.push(format!("{origin}/.well-known/oauth-protected-resource"));
    urls
}

/// Whether the metadata's `resource` may stand for the upstream at
/// `server_url`: the same origin, and a path that is the upstream's or a
/// parent of it (by whole segments). Anything else is another resource,
/// whose tokens must not be asked for on this upstream's behalf.
pub fn check_resource(resource: &str, server_url: &str) -> Result<(), String> {
    let mismatch =
        || format!("the protected resource metadata names resource {resource:?}, which is not {server_url:?}");
    let (ro, rp) = origin_and_path(resource).ok_or_else(mismatch)?;
    let (so, sp) = origin_and_path(server_url).ok_or_else(mismatch)?;
    if !ro.eq_ignore_ascii_case(&so) {
        return Err(mismatch());
    }
    if rp.is_empty() || sp == rp || sp.strip_prefix(&rp).is_some_and(|rest| rest.starts_with('/')) {
        Ok(())
    } else {
        Err(mismatch())
    }
}

/// Where an issuer's metadata may be, in order: RFC 8414's well-known URL
/// (the path inserted after the host), OpenID discovery with the path
/// inserted, then appended. Never the root documents for an issuer with
/// a path (they are another server's).
pub fn server_metadata_urls(issuer: &str) -> Vec<String> {
    let Some((origin, path)) = origin_and_path(issuer) else { return Vec::new() };
    if path.is_empty() {
        return vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ];
    }
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}/.well-known/openid-configuration{path}"),
        format!("{origin}{path}/.well-known/openid-configuration"),
    ]
}

/// What discovery found for an upstream.
#[derive(Debug, Clone)]
pub struct Discovered {
    pub resource: ProtectedResource,
    /// The authorization server used (the metadata's first).
    pub server: ServerMetadata,
}

async fn json_at<T: serde::de::DeserializeOwned>(fetcher: &Fetcher, url: &str) -> Result<Option<T>, String> {
    let answer = fetcher.fetch(Method::GET, url, None, None).await.map_err(|e| e.to_string())?;
    if !answer.status.is_success() {
        return Ok(None);
    }
    serde_json::from_slice(&answer.body).map(Some).map_err(|e| format!("{url}: not valid metadata: {e}"))
}

/// Finds the upstream's protected resource metadata (checked against
/// `server_url`) and its authorization server's (whose `issuer` must be
/// the one named, byte for byte).
pub async fn discover(fetcher: &Fetcher, server_url: &str, challenge: &Challenge) -> Result<Discovered, String> {
    let mut resource = None;
    for url in resource_metadata_urls(server_url, challenge) {
        if let Some(found) = json_at::<ProtectedResource>(fetcher, &url).await? {
            resource = Some(found);
            break;
        }
    }
    let resource = resource.ok_or_else(|| format!("no protected resource metadata for {server_url}"))?;
    check_resource(&resource.resource, server_url)?;
    let issuer = resource
        .authorization_servers
        .first()
        .ok_or_else(|| format!("the protected resource metadata of {server_url} names no authorization server"))?
        .clone();
    let server = server_metadata(fetcher, &issuer).await?;
    Ok(Discovered { resource, server })
}

/// The metadata of the authorization server `issuer`, whose `issuer` must
/// be that one, byte for byte (RFC 8414, section 3.3).
pub async fn server_metadata(fetcher: &Fetcher, issuer: &str) -> Result<ServerMetadata, String> {
    for url in server_metadata_urls(issuer) {
        if let Some(server) = json_at::<ServerMetadata>(fetcher, &url).await? {
            if server.issuer != issuer {
                return Err(format!(
                    "the metadata at {url} names issuer {:?}, not {issuer:?}: refused (RFC 8414, section 3.3)",
                    server.issuer
                ));
            }
            return Ok(server);
        }
    }
    Err(format!("no authorization server metadata for {issuer}"))
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum TokenAuth {
    Basic,
    Post,
    /// A public client: `client_id` in the form only.
    None,
}

impl TokenAuth {
    fn parse(method: &str) -> Option<TokenAuth> {
        match method {
            "client_secret_basic" => Some(TokenAuth::Basic),
            "client_secret_post" => Some(TokenAuth::Post),
            "none" => Some(TokenAuth::None),
            _ => None,
        }
    }

    /// For a client with (or without) a secret at a server offering
    /// `supported` (empty: the server does not say, and basic is its default).
    pub fn choose(supported: &[String], has_secret: bool) -> TokenAuth {
        if !has_secret {
            return TokenAuth::None;
        }
        if supported.is_empty() || supported.iter().any(|m| m == "client_secret_basic") {
            TokenAuth::Basic
        } else if supported.iter().any(|m| m == "client_secret_post") {
            TokenAuth::Post
        } else {
            TokenAuth::None
        }
    }
}

/// The router's client at one authorization server.
#[derive(Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Client {
    pub client_id: String,
    pub client_secret: Option<String>,
    pub auth: TokenAuth,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("client_id", &self.client_id).field("auth", &self.auth).finish_non_exhaustive()
    }
}

/// Registers the router at `server` (RFC 7591) for `redirect_uri`.
pub async fn register(
    fetcher: &Fetcher,
    server: &ServerMetadata,
    redirect_uri: &str,
    client_name: &str,
) -> Result<Client, String> {
    let endpoint = server.registration_endpoint.as_deref().ok_or_else(|| {
        format!("{} offers no dynamic registration, and no client is configured for it", server.issuer)
    })?;
    // A loopback redirect is a native application's (RFC 8252); any other a web one's.
    let native = redirect_uri.starts_with("http://127.0.0.1") || redirect_uri.starts_with("http://localhost");
    let method = match TokenAuth::choose(&server.token_endpoint_auth_methods_supported, true) {
        TokenAuth::Basic => "client_secret_basic",
        TokenAuth::Post => "client_secret_post",
        TokenAuth::None => "none",
    };
    let body = json!({
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "application_type": if native { "native" } else { "web" },
        "token_endpoint_auth_method": method,
    });
    let answer = fetcher.post_json(endpoint, &body).await.map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    if !answer.status.is_success() {
        return Err(format!("registration at {endpoint} refused ({}): {}", answer.status, oauth_error(&v)));
    }
    let client_id = v["client_id"].as_str().ok_or_else(|| format!("registration at {endpoint}: no client_id"))?;
    let client_secret = v["client_secret"].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let auth = v["token_endpoint_auth_method"]
        .as_str()
        .and_then(TokenAuth::parse)
        .unwrap_or_else(|| TokenAuth::choose(&server.token_endpoint_auth_methods_supported, client_secret.is_some()));
    Ok(Client { client_id: client_id.to_owned(), client_secret, auth })
}

/// The scope to ask for: the challenge's, else every scope the resource
/// lists, else none; joined with what was granted before (a step-up asks
/// for both); `offline_access` added when the server offers it.
pub fn choose_scope(
    challenge: Option<&str>,
    resource: &[String],
    server: &[String],
    granted: Option<&str>,
) -> Option<String> {
    fn add(scopes: &mut Vec<String>, s: &str) {
        if !s.is_empty() && !scopes.iter().any(|t| t == s) {
            scopes.push(s.to_owned());
        }
    }
    let mut scopes: Vec<String> = Vec::new();
    granted.unwrap_or("").split(' ').for_each(|s| add(&mut scopes, s));
    match challenge.filter(|c| !c.trim().is_empty()) {
        Some(c) => c.split(' ').for_each(|s| add(&mut scopes, s)),
        None => resource.iter().for_each(|s| add(&mut scopes, s)),
    }
    if scopes.is_empty() {
        return None;
    }
    if server.iter().any(|s| s == "offline_access") {
        add(&mut scopes, "offline_access");
    }
    Some(scopes.join(" "))
}

/// A PKCE verifier and its S256 challenge.
#[derive(Clone)]
pub struct Pkce {
    pub verifier: String,
    pub challenge: String,
}

impl Pkce {
    /// A new random verifier (43 characters, 256 bits).
    pub fn new() -> Pkce {
        let mut bytes = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("randomness");
        Pkce::of(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    pub fn of(verifier: String) -> Pkce {
        let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        Pkce { verifier, challenge }
    }
}

impl Default for Pkce {
    fn default() -> Self {
        Pkce::new()
    }
}

/// The authorization request's URL.
pub fn authorization_url(
    server: &ServerMetadata,
    client_id: &str,
    redirect_uri: &str,
    state: &str,
    pkce: &Pkce,
    scope: Option<&str>,
    resource: &str,
) -> Result<String, String> {
    let endpoint = server
        .authorization_endpoint
        .as_deref()
        .ok_or_else(|| format!("{} has no authorization_endpoint", server.issuer))?;
    if !server.code_challenge_methods_supported.is_empty()
        && !server.code_challenge_methods_supported.iter().any(|m| m == "S256")
    {
        return Err(format!("{} does not offer PKCE with S256", server.issuer));
    }
    let mut params = vec![
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", redirect_uri),
        ("state", state),
        ("code_challenge", pkce.challenge.as_str()),
        ("code_challenge_method", "S256"),
        ("resource", resource),
    ];
    if let Some(scope) = scope {
        params.push(("scope", scope));
    }
    let query = params.iter().map(|(k, v)| format!("{k}={}", form_encode(v))).collect::<Vec<_>>().join("&");
    Ok(format!("{endpoint}{}{query}", if endpoint.contains('?') { '&' } else { '?' }))
}

/// The query of a URL, its pairs decoded.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// The code of an authorization response (the redirect's query), once
/// checked: the `state` sent, no `error`, and `iss` (RFC 9207) equal to
/// the server's issuer when present, and present when the server says it
/// sends it.
pub fn authorization_code(query: &str, state: &str, server: &ServerMetadata) -> Result<String, String> {
    let pairs = query_pairs(query);
    let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if get("state") != Some(state) {
        return Err("the authorization response's state is not the one sent".into());
    }
    match get("iss") {
        Some(iss) if iss != server.issuer => {
            return Err(format!("the authorization response comes from issuer {iss:?}, not {:?}", server.issuer));
        }
        None if server.authorization_response_iss_parameter_supported => {
            return Err("the authorization response lacks the iss its server says it sends".into());
        }
        _ => {}
    }
    if let Some(error) = get("error") {
        let description = get("error_description").unwrap_or("");
        return Err(format!("the authorization server refused: {error} {description}").trim().to_owned());
    }
    get("code")
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "the authorization response has no code".into())
}

/// Tokens from a token endpoint.
#[derive(Clone, Deserialize)]
pub struct Tokens {
    pub access_token: String,
    #[serde(default)]
    pub token_type: Option<String>,
    #[serde(default)]
    pub expires_in: Option<u64>,
    #[serde(default)]
    pub refresh_token: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    /// What a token exchange issued (RFC 8693, section 2.2.1).
    #[serde(default)]
    pub issued_token_type: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("expires_in", &self.expires_in)
            .field("refresh_token", &self.refresh_token.is_some())
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// An OAuth error body in words.
fn oauth_error(v: &Value) -> String {
    match (v["error"].as_str(), v["error_description"].as_str()) {
        (Some(e), Some(d)) => format!("{e}: {d}"),
        (Some(e), None) => e.to_owned(),
        _ => "no error named".to_owned(),
    }
}

/// A token request at `endpoint` with `client`'s authentication.
pub(crate) async fn token_request(
    fetcher: &Fetcher,
    endpoint: &str,
    client: &Client,
    mut form: Vec<(&str, &str)>,
) -> Result<Tokens, String> {
    let basic = match client.auth {
        TokenAuth::Basic => Some((client.client_id.as_str(), client.client_secret.as_deref().unwrap_or(""))),
        TokenAuth::Post => {
            form.push(("client_id", &client.client_id));
            form.push(("client_secret", client.client_secret.as_deref().unwrap_or("")));
            None
        }
        TokenAuth::None => {
            form.push(("client_id", &client.client_id));
            None
        }
    };
    let answer: Answer = fetcher.post_form_answer(endpoint, &form, basic).await.map_err(|e| e.to_string())?;
    if answer.status != StatusCode::OK {
        let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        return Err(format!("the token endpoint refused ({}): {}", answer.status, oauth_error(&v)));
    }
    let tokens: Tokens =
        serde_json::from_slice(&answer.body).map_err(|e| format!("the token endpoint's answer is not tokens: {e}"))?;
    if tokens.token_type.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("bearer")) {
        return Err(format!("a {:?} token; only bearer tokens are used", tokens.token_type));
    }
    if tokens.access_token.is_empty() || tokens.access_token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err("an empty or malformed access token".into());
    }
    Ok(tokens)
}

/// Trades an authorization code for tokens.
pub async fn exchange_code(
    fetcher: &Fetcher,
    server: &ServerMetadata,
    client: &Client,
    code: &str,
    pkce: &Pkce,
    redirect_uri: &str,
    resource: &str,
) -> Result<Tokens, String> {
    let form = vec![
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect_uri),
        ("code_verifier", pkce.verifier.as_str()),
        ("resource", resource),
    ];
    token_request(fetcher, token_endpoint(server)?, client, form).await
}

/// New tokens for a refresh token.
pub async fn refresh(
    fetcher: &Fetcher,
    server: &ServerMetadata,
    client: &Client,
    refresh_token: &str,
    resource: &str,
) -> Result<Tokens, String> {
    let form = vec![("grant_type", "refresh_token"), ("refresh_token", refresh_token), ("resource", resource)];
    token_request(fetcher, token_endpoint(server)?, client, form).await
}

/// Where `server` issues tokens.
pub fn token_endpoint(server: &ServerMetadata) -> Result<&str, String> {
    server.token_endpoint.as_deref().ok_or_else(|| format!("{} has no token_endpoint", server.issuer))
}

/// How long to use a token that lives `expires_in` seconds before
/// refreshing it (a tenth of its life early, at most a minute).
pub fn use_for(expires_in: Option<u64>) -> Duration {
    let life = Duration::from_secs(expires_in.unwrap_or(3600));
    life - (life / 10).min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(issuer: &str) -> ServerMetadata {
        serde_json::from_value(json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
            "code_challenge_methods_supported": ["S256"],
            "authorization_response_iss_parameter_supported": true,
        }))
        .unwrap()
    }

    #[test]
    fn challenges_are_read_in_any_order_with_quoted_values() {
        let c = parse_challenge(
            r#"Bearer error="insufficient_scope", scope="mcp:basic mcp:write", resource_metadata="http://h:1/.well-known/oauth-protected-resource/mcp""#,
        )
        .unwrap();
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.scope.as_deref(), Some("mcp:basic mcp:write"));
        assert_eq!(c.resource_metadata.as_deref(), Some("http://h:1/.well-known/oauth-protected-resource/mcp"));
        let c = parse_challenge(r#"bearer Scope=a,RESOURCE_METADATA="x\"y", realm=r"#).unwrap();
        assert_eq!((c.scope.as_deref(), c.resource_metadata.as_deref()), (Some("a"), Some("x\"y")));
        assert_eq!(parse_challenge("Bearer"), Some(Challenge::default()));
        assert!(parse_challenge(r#"Basic realm="x""#).is_none());
        assert!(parse_challenge(r#"Bearer scope="unterminated"#).is_none());
    }

    #[test]
    fn metadata_is_looked_for_where_the_specification_says_and_nowhere_else() {
        let named = Challenge { resource_metadata: Some("http://h/custom.json".into()), ..Default::default() };
        assert_eq!(resource_metadata_urls("http://h:1/mcp", &named), ["http://h/custom.json"]);
        assert_eq!(
            resource_metadata_urls("http://h:1/mcp", &Challenge::default()),
            ["http://h:1/.well-known/oauth-protected-resource/mcp", "http://h:1/.well-known/oauth-protected-resource"]
        );
        assert_eq!(
            server_metadata_urls("http://a:2/tenant1"),
            [
                "http://a:2/.well-known/oauth-authorization-server/tenant1",
                "http://a:2/.well-known/openid-configuration/tenant1",
                "http://a:2/tenant1/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            server_metadata_urls("http://a:2"),
            ["http://a:2/.well-known/oauth-authorization-server", "http://a:2/.well-known/openid-configuration"]
        );
    }

    #[test]
    fn a_resource_must_be_the_upstream_or_a_parent_of_it() {
        assert!(check_resource("http://h:1/mcp", "http://h:1/mcp").is_ok());
        assert!(check_resource("http://h:1", "http://h:1/mcp").is_ok());
        assert!(check_resource("http://H:1/", "http://h:1/mcp").is_ok());
        assert!(check_resource("http://h:1/api", "http://h:1/api/mcp").is_ok());
        assert!(check_resource("https://evil.example.com/mcp", "http://h:1/mcp").is_err());
        assert!(check_resource("http://h:1/mc", "http://h:1/mcp").is_err());
        assert!(check_resource("http://h:2/mcp", "http://h:1/mcp").is_err());
        assert!(check_resource("http://h:1/mcp/deeper", "http://h:1/mcp").is_err());
    }

    #[test]
    fn the_scope_is_the_challenges_else_the_resources_and_grows_on_step_up() {
        let listed = vec!["mcp:basic".to_owned(), "mcp:read".to_owned()];
        assert_eq!(choose_scope(Some("mcp:basic"), &listed, &[], None).as_deref(), Some("mcp:basic"));
        assert_eq!(choose_scope(None, &listed, &[], None).as_deref(), Some("mcp:basic mcp:read"));
        assert_eq!(choose_scope(None, &[], &[], None), None);
        assert_eq!(
            choose_scope(Some("mcp:write"), &listed, &[], Some("mcp:basic")).as_deref(),
            Some("mcp:basic mcp:write")
        );
        let offline = vec!["mcp:basic".to_owned(), "offline_access".to_owned()];
        assert_eq!(choose_scope(Some("mcp:basic"), &[], &offline, None).as_deref(), Some("mcp:basic offline_access"));
        assert_eq!(choose_scope(None, &[], &offline, None), None);
    }

    #[test]
    fn pkce_matches_rfc_7636_appendix_b() {
        let pkce = Pkce::of("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into());
        assert_eq!(pkce.challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        let fresh = Pkce::new();
        assert_eq!(fresh.verifier.len(), 43);
        assert_ne!(fresh.verifier, Pkce::new().verifier);
    }

    #[test]
    fn the_authorization_request_carries_pkce_state_and_the_resource_verbatim() {
        let s = server("http://a:2");
        let pkce = Pkce::of("v".repeat(43));
        let url = authorization_url(&s, "cid", "http://r/cb", "st", &pkce, Some("mcp:a mcp:b"), "http://h:1").unwrap();
        let (base, query) = url.split_once('?').unwrap();
        assert_eq!(base, "http://a:2/authorize");
        let pairs = query_pairs(query);
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("resource"), Some("http://h:1"), "no slash added");
        assert_eq!(get("scope"), Some("mcp:a mcp:b"));
        assert_eq!(get("code_challenge_method"), Some("S256"));
        assert_eq!(get("code_challenge"), Some(pkce.challenge.as_str()));
        assert_eq!(
            (get("state"), get("client_id"), get("redirect_uri")),
            (Some("st"), Some("cid"), Some("http://r/cb"))
        );
        let mut no_s256 = s.clone();
        no_s256.code_challenge_methods_supported = vec!["plain".into()];
        assert!(authorization_url(&no_s256, "c", "r", "s", &pkce, None, "x").is_err());
    }

    #[test]
    fn the_redirect_is_checked_for_state_error_and_issuer() {
        let s = server("http://a:2");
        let ok = "code=abc&state=st&iss=http%3A%2F%2Fa%3A2";
        assert_eq!(authorization_code(ok, "st", &s).unwrap(), "abc");
        assert!(authorization_code(ok, "other", &s).unwrap_err().contains("state"));
        assert!(authorization_code("code=abc&state=st&iss=https%3A%2F%2Fevil.example.com", "st", &s).is_err());
        // No normalisation: a trailing slash is another issuer.
        assert!(authorization_code("code=abc&state=st&iss=http%3A%2F%2Fa%3A2%2F", "st", &s).is_err());
        // Missing, though the server says it sends it.
        assert!(authorization_code("code=abc&state=st", "st", &s).unwrap_err().contains("lacks"));
        let mut quiet = s.clone();
        quiet.authorization_response_iss_parameter_supported = false;
        assert_eq!(authorization_code("code=abc&state=st", "st", &quiet).unwrap(), "abc");
        // Present though not advertised: still compared.
        assert!(authorization_code("code=abc&state=st&iss=x", "st", &quiet).is_err());
        let refused = authorization_code("error=access_denied&error_description=no+way&state=st", "st", &quiet);
        assert!(refused.unwrap_err().contains("access_denied no way"));
    }

    #[test]
    fn the_token_endpoint_method_follows_the_server() {
        let m = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(TokenAuth::choose(&m(&[]), true), TokenAuth::Basic);
        assert_eq!(TokenAuth::choose(&m(&["client_secret_post"]), true), TokenAuth::Post);
        assert_eq!(TokenAuth::choose(&m(&["none", "client_secret_basic"]), true), TokenAuth::Basic);
        assert_eq!(TokenAuth::choose(&m(&["client_secret_basic"]), false), TokenAuth::None);
        assert_eq!(use_for(Some(3600)), Duration::from_secs(3540));
        assert_eq!(use_for(Some(100)), Duration::from_secs(90));
        assert_eq!(use_for(Some(0)), Duration::ZERO);
        assert_eq!(use_for(None), Duration::from_secs(3540));
    }
}
