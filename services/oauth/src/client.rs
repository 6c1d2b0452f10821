//! The router as an OAuth 2.1 client of an upstream: the client credentials
//! grant (RFC 6749, section 4.4) for machine-to-machine upstreams, and token
//! exchange (RFC 8693) of a caller's own access token, each with the
//! upstream as the token's resource (RFC 8707).
//!
//! The token endpoint is configured, or found in the issuer's metadata
//! ([`delegated::server_metadata`]: RFC 8414, its `issuer` the one
//! configured); the request is [`delegated`]'s, with its client
//! authentication. A token is kept until shortly before it expires
//! ([`delegated::use_for`]), one fetch at a time however many requests
//! need it, and dropped at once when the upstream refuses it.

use std::sync::Arc;
use std::time::Instant;

use crate::delegated::{self, TokenAuth};
use crate::fetch::Fetcher;

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
    /// Basic (the default) or post.
    pub auth: TokenAuth,
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

impl Token {
    /// Whether it is still good to send (not due for renewal).
    pub fn fresh(&self) -> bool {
        Instant::now() < self.renew_at
    }

    /// When to stop sending it.
    pub fn renew_at(&self) -> Instant {
        self.renew_at
    }
}

/// Where a client's token endpoint is: configured, or found once in its
/// issuer's metadata.
struct Endpoint {
    issuer: Option<String>,
    token_url: Option<String>,
    found: tokio::sync::OnceCell<String>,
}

impl Endpoint {
    async fn url(&self, fetcher: &Fetcher) -> Result<&str, String> {
        let endpoint = self
            .found
            .get_or_try_init(|| async {
                if let Some(url) = &self.token_url {
                    return Ok(url.clone());
                }
                let issuer = self.issuer.as_deref().ok_or("neither token_url nor issuer is configured")?;
                let server = delegated::server_metadata(fetcher, issuer).await?;
                delegated::token_endpoint(&server).map(str::to_owned)
            })
            .await?;
        Ok(endpoint)
    }
}

/// Gets and keeps the tokens of one client.
pub struct ClientCredentials {
    settings: ClientSettings,
    client: delegated::Client,
    fetcher: Fetcher,
    endpoint: Endpoint,
    /// The token held; the lock also makes fetches one at a time.
    token: tokio::sync::Mutex<Option<Token>>,
}

impl ClientSettings {
    /// The client these settings describe, and where its token endpoint is.
    fn client_and_endpoint(&self) -> (delegated::Client, Endpoint) {
        let client = delegated::Client {
            client_id: self.client_id.clone(),
            client_secret: Some(self.client_secret.clone()),
            auth: self.auth,
        };
        let endpoint = Endpoint {
            issuer: self.issuer.clone(),
            token_url: self.token_url.clone(),
            found: tokio::sync::OnceCell::new(),
        };
        (client, endpoint)
    }
}

impl ClientCredentials {
    pub fn new(settings: ClientSettings, fetcher: Fetcher) -> ClientCredentials {
        let (client, endpoint) = settings.client_and_endpoint();
        ClientCredentials { settings, client, fetcher, endpoint, token: tokio::sync::Mutex::new(None) }
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

    async fn fetch(&self) -> Result<Token, String> {
        let endpoint = self.endpoint.url(&self.fetcher).await?;
        let s = &self.settings;
        let mut form = vec![("grant_type", "client_credentials"), ("resource", s.resource.as_str())];
        if let Some(scope) = &s.scope {
            form.push(("scope", scope));
        }
        let started = Instant::now();
        let tokens = delegated::token_request(&self.fetcher, endpoint, &self.client, form).await?;
        Ok(Token { value: Arc::from(tokens.access_token), renew_at: started + delegated::use_for(tokens.expires_in) })
    }
}

/// The token type of an access token (RFC 8693, section 3).
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// The token exchange grant type (RFC 8693, section 2.1).
pub const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// Token exchange (RFC 8693): a caller's access token, the subject token,
/// traded at the authorization server for a token of the upstream (its
/// `resource`, and `audience` if configured) acting for the same user.
pub struct TokenExchanger {
    settings: ClientSettings,
    audience: Option<String>,
    client: delegated::Client,
    fetcher: Fetcher,
    endpoint: Endpoint,
}

impl TokenExchanger {
    pub fn new(settings: ClientSettings, audience: Option<String>, fetcher: Fetcher) -> TokenExchanger {
        let (client, endpoint) = settings.client_and_endpoint();
        TokenExchanger { settings, audience, client, fetcher, endpoint }
    }

    /// A token of the upstream for the user of `subject_token`.
    pub async fn exchange(&self, subject_token: &str) -> Result<Token, String> {
        let endpoint = self.endpoint.url(&self.fetcher).await?;
        let s = &self.settings;
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE_GRANT),
            ("subject_token", subject_token),
            ("subject_token_type", ACCESS_TOKEN_TYPE),
            ("requested_token_type", ACCESS_TOKEN_TYPE),
            ("resource", s.resource.as_str()),
        ];
        if let Some(audience) = &self.audience {
            form.push(("audience", audience));
        }
        if let Some(scope) = &s.scope {
            form.push(("scope", scope));
        }
        let started = Instant::now();
        let tokens = delegated::token_request(&self.fetcher, endpoint, &self.client, form).await?;
        if tokens.issued_token_type.as_deref().is_some_and(|t| t != ACCESS_TOKEN_TYPE) {
            return Err(format!(
                "the authorization server issued a {:?}, not an access token",
                tokens.issued_token_type
            ));
        }
        Ok(Token { value: Arc::from(tokens.access_token), renew_at: started + delegated::use_for(tokens.expires_in) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_never_show_the_secret() {
        let s = ClientSettings {
            issuer: None,
            token_url: Some("https://as/token".into()),
            client_id: "router".into(),
            client_secret: "s3cret".into(),
            scope: None,
            resource: "https://upstream/mcp".into(),
            auth: TokenAuth::Basic,
        };
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
