//! The router as an OAuth 2.1 client of an upstream: the client credentials
//! grant (RFC 6749, section 4.4) for machine-to-machine upstreams, with the
//! upstream as the token's resource (RFC 8707).
//!
//! The token endpoint is configured, or found in the issuer's metadata
//! (RFC 8414, whose `issuer` must be the one configured). A token is kept
//! until shortly before it expires (a tenth of its lifetime, at most 60 s,
//! early), one fetch at a time however many requests need it, and dropped
//! at once when the upstream refuses it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::fetch::Fetcher;

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// HTTP Basic (RFC 6749, section 2.3.1): the default.
    Basic,
    /// `client_id` and `client_secret` in the form.
    Post,
}

/// One upstream's client credentials.
#[derive(Clone)]
pub struct ClientSettings {
    /// Where the token endpoint is found (its metadata), unless `token_url`.
    pub issuer: Option<String>,
    pub token_url: Option<String>,
    pub client_id: String,
    pub client_secret: String,
    pub scope: Option<String>,
    /// The `resource` asked for: the upstream's URL, as written.
    pub resource: String,
    pub auth_method: AuthMethod,
}

impl std::fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSettings")
            .field("issuer", &self.issuer)
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("scope", &self.scope)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// An access token and when to stop using it.
#[derive(Clone)]
pub struct Token {
    pub value: Arc<str>,
    renew_at: Instant,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token").field("renew_at", &self.renew_at).finish_non_exhaustive()
    }
}

/// Gets and keeps the tokens of one client.
pub struct ClientCredentials {
    settings: ClientSettings,
    fetcher: Fetcher,
    /// The token endpoint, once found.
    endpoint: tokio::sync::OnceCell<String>,
    /// The token held; the lock also makes fetches one at a time.
    token: tokio::sync::Mutex<Option<Token>>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct Metadata {
    issuer: String,
    token_endpoint: Option<String>,
}

impl ClientCredentials {
    pub fn new(settings: ClientSettings, fetcher: Fetcher) -> ClientCredentials {
        ClientCredentials {
            settings,
            fetcher,
            endpoint: tokio::sync::OnceCell::new(),
            token: tokio::sync::Mutex::new(None),
        }
    }

    /// A token good for now: the one held, or a new one.
    pub async fn token(&self) -> Result<Token, String> {
        let mut held = self.token.lock().await;
        if let Some(token) = held.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(token.clone());
        }
        let token = self.fetch().await?;
        *held = Some(token.clone());
        Ok(token)
    }

    /// The upstream refused `value`: not used again.
    pub async fn refused(&self, value: &str) {
        let mut held = self.token.lock().await;
        if held.as_ref().is_some_and(|t| &*t.value == value) {
            *held = None;
        }
    }

    async fn token_endpoint(&self) -> Result<&str, String> {
        let endpoint = self
            .endpoint
            .get_or_try_init(|| async {
                if let Some(url) = &self.settings.token_url {
                    return Ok(url.clone());
                }
                let issuer = self.settings.issuer.as_deref().ok_or("neither token_url nor issuer is configured")?;
                let mut last = String::new();
                for url in crate::server::metadata_urls(issuer) {
                    match self.fetcher.get(&url).await {
                        Ok(body) => {
                            let meta: Metadata = serde_json::from_slice(&body)
                                .map_err(|e| format!("the metadata at {url} is not valid: {e}"))?;
                            // RFC 8414, section 3.3: the issuer it names is the one asked about.
                            if meta.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
                                return Err(format!(
                                    "the metadata at {url} names issuer {:?}, not {issuer:?}",
                                    meta.issuer
                                ));
                            }
                            return meta
                                .token_endpoint
                                .ok_or_else(|| format!("the metadata at {url} has no token_endpoint"));
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(format!("no authorization server metadata for {issuer}: {last}"))
            })
            .await?;
        Ok(endpoint)
    }

    async fn fetch(&self) -> Result<Token, String> {
        let endpoint = self.token_endpoint().await?;
        let s = &self.settings;
        let mut form = vec![("grant_type", "client_credentials"), ("resource", s.resource.as_str())];
        if let Some(scope) = &s.scope {
            form.push(("scope", scope));
        }
        let basic = match s.auth_method {
            AuthMethod::Basic => Some((s.client_id.as_str(), s.client_secret.as_str())),
            AuthMethod::Post => {
                form.push(("client_id", &s.client_id));
                form.push(("client_secret", &s.client_secret));
                None
            }
        };
        let started = Instant::now();
        let body = self.fetcher.post_form(endpoint, &form, basic).await.map_err(|e| format!("token request: {e}"))?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|e| format!("the token endpoint's answer is not a token: {e}"))?;
        if answer.token_type.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("bearer")) {
            return Err(format!(
                "the token endpoint gave a {:?} token; only bearer tokens are used",
                answer.token_type
            ));
        }
        if answer.access_token.is_empty() || answer.access_token.bytes().any(|b| b < 0x21 || b == 0x7f) {
            return Err("the token endpoint gave an empty or malformed access token".into());
        }
        Ok(Token { value: Arc::from(answer.access_token), renew_at: started + renew_after(answer.expires_in) })
    }
}

/// How long a token that lives `expires_in` seconds is used: until a tenth
/// of its life (at most 60 s) is left; an hour if the server does not say.
fn renew_after(expires_in: Option<u64>) -> Duration {
    let life = Duration::from_secs(expires_in.unwrap_or(3600));
    life - (life / 10).min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_renewed_before_it_expires() {
        assert_eq!(renew_after(Some(3600)), Duration::from_secs(3540));
        assert_eq!(renew_after(Some(100)), Duration::from_secs(90));
        assert_eq!(renew_after(Some(0)), Duration::ZERO);
        assert_eq!(renew_after(None), Duration::from_secs(3540));
    }

    #[test]
    fn settings_never_show_the_secret() {
        let s = ClientSettings {
            issuer: None,
            token_url: Some("https://as/token".into()),
            client_id: "router".into(),
            client_secret: "s3cret".into(),
            scope: None,
            resource: "https://upstream/mcp".into(),
            auth_method: AuthMethod::Basic,
        };
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
