//! The router's own access token for an upstream (`[upstreams.oauth]`,
//! the client credentials grant): obtained when a request needs it, sent
//! as `Authorization: Bearer` beside the upstream's other `headers`, on the
//! router's own requests and on those of callers without a vault credential.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use http::{HeaderName, HeaderValue};
use switchboard_core::credential::Credential;
use switchboard_oauth::client::ClientCredentials;
use switchboard_upstream::{OwnCredential, UpstreamError};

pub struct ClientToken {
    upstream: String,
    client: ClientCredentials,
    /// The upstream's other configured headers.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The credential made of the token last obtained.
    made: Mutex<Option<(Arc<str>, Arc<Credential>)>>,
}

impl ClientToken {
    pub fn new(upstream: &str, client: ClientCredentials, headers: Vec<(HeaderName, HeaderValue)>) -> ClientToken {
        ClientToken { upstream: upstream.to_owned(), client, headers, made: Mutex::new(None) }
    }
}

#[async_trait]
impl OwnCredential for ClientToken {
    async fn current(&self) -> Result<Arc<Credential>, UpstreamError> {
        let token = self.client.token().await.map_err(|e| {
            tracing::warn!(upstream = %self.upstream, error = %e, "cannot get an access token for the upstream");
            UpstreamError::Token(e)
        })?;
        let mut made = self.made.lock().expect("lock");
        if let Some((value, credential)) = made.as_ref() {
            if Arc::ptr_eq(value, &token.value) {
                return Ok(credential.clone());
            }
        }
        let bearer = HeaderValue::from_str(&format!("Bearer {}", token.value))
            .map_err(|_| UpstreamError::Token("the access token is not a valid header value".into()))?;
        let mut headers = self.headers.clone();
        headers.push((http::header::AUTHORIZATION, bearer));
        let credential = Arc::new(Credential::new(format!("{} (client credentials)", self.upstream), headers));
        *made = Some((token.value, credential.clone()));
        Ok(credential)
    }

    async fn refused(&self, used: &Arc<Credential>) {
        let value = {
            let made = self.made.lock().expect("lock");
            match made.as_ref() {
                Some((value, credential)) if Arc::ptr_eq(credential, used) => value.clone(),
                _ => return,
            }
        };
        tracing::info!(upstream = %self.upstream, "the upstream refused the router's access token; getting another");
        self.client.refused(&value).await;
    }
}
