//! One authorization server, as the router knows it: its metadata (RFC
//! 8414 or OpenID discovery), its signing keys (cached; fetched again on
//! an unknown `kid` at a bounded rate, and in the background when old, so
//! keys rotate without a restart) and the answers of its introspection
//! endpoint (RFC 7662, cached for at most the token's remaining lifetime).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::fetch::{FetchError, Fetcher};
use crate::keys::KeySet;
use crate::token::{self, Rejection};
use crate::{Failure, Metrics, Settings};

/// How an authorization server is reached, as configured.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// The name configuration and metrics use.
    pub name: String,
    /// Its issuer identifier: the `iss` of its tokens.
    pub issuer: String,
    /// Where its metadata is, when not at the well-known places.
    pub metadata_url: Option<String>,
    /// Its JWKS, when not taken from the metadata.
    pub jwks_uri: Option<String>,
    /// Its introspection endpoint, when not taken from the metadata.
    pub introspection_endpoint: Option<String>,
    /// The router's client credentials for introspection.
    pub client: Option<(String, String)>,
    /// Extra trusted CA certificates (PEM) for its `https` endpoints.
    pub ca: Option<Vec<u8>>,
}

/// What the metadata says, as far as the router needs it.
#[derive(Debug, Clone, Default)]
struct Endpoints {
    jwks_uri: Option<String>,
    introspection: Option<String>,
}

/// The cached keys, and when they were fetched.
struct Keys {
    set: KeySet,
    at: Instant,
}

/// An introspection answer kept for a while: the claims of an active
/// token, or `None` for one the server said is not active.
struct Introspected {
    claims: Option<Arc<Map<String, Value>>>,
    until: Instant,
}

/// At most this many introspection answers are kept per server.
pub const MAX_INTROSPECTED: usize = 10_000;
/// An inactive token's answer is kept this long (so that a client
/// repeating one cannot make the router ask again and again).
const INACTIVE_FOR: Duration = Duration::from_secs(10);
/// At most this many introspection requests in flight per server.
const INTROSPECTIONS_IN_FLIGHT: usize = 32;

pub struct AuthServer {
    pub settings: ServerSettings,
    fetcher: Fetcher,
    endpoints: ArcSwapOption<Endpoints>,
    keys: ArcSwapOption<Keys>,
    /// When keys were last asked for (a success or not): an unknown `kid`
    /// fetches again only `Settings::refetch_every` after this.
    last_attempt: Mutex<Option<Instant>>,
    /// One key fetch at a time.
    fetching: tokio::sync::Mutex<()>,
    introspected: Mutex<HashMap<[u8; 32], Introspected>>,
    introspecting: tokio::sync::Semaphore,
}

impl AuthServer {
    pub fn new(
        settings: ServerSettings,
        timeout: Duration,
        egress: &switchboard_core::egress::Egress,
    ) -> Result<AuthServer, String> {
        let fetcher = Fetcher::new(settings.ca.as_deref(), timeout, egress.clone())?;
        Ok(AuthServer {
            settings,
            fetcher,
            endpoints: ArcSwapOption::empty(),
            keys: ArcSwapOption::empty(),
            last_attempt: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
            introspected: Mutex::new(HashMap::new()),
            introspecting: tokio::sync::Semaphore::new(INTROSPECTIONS_IN_FLIGHT),
        })
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// Whether keys are cached (for `readyz`-style reports and tests).
    pub fn has_keys(&self) -> bool {
        self.keys.load().is_some()
    }

    /// Whether opaque tokens can be introspected here.
    pub fn can_introspect(&self) -> bool {
        self.settings.client.is_some()
    }

    /// Verifies a decoded JWT with the cached keys; `None` when no cached
    /// key matches it (the caller then fetches them: [`AuthServer::refresh`]).
    pub fn verify_cached(
        self: &Arc<Self>,
        jwt: &token::Unverified<'_>,
        settings: &Settings,
        metrics: &Metrics,
    ) -> Option<Result<(), Failure>> {
        let keys = self.keys.load();
        let keys = keys.as_ref()?;
        let mut candidates = keys.set.candidates(jwt.kid.as_deref(), jwt.alg).peekable();
        candidates.peek()?;
        if keys.at.elapsed() >= settings.keys_max_age {
            self.refresh_in_background(settings, metrics);
        }
        Some(if candidates.any(|k| k.verify(jwt.alg, jwt.signed, &jwt.signature)) {
            Ok(())
        } else {
            Err(Failure::Rejected(Rejection::Signature))
        })
    }

    /// Fetches the keys again, unless that was tried less than
    /// `refetch_every` ago (then an unknown key stays unknown, and a server
    /// whose keys were never fetched is unavailable). Returns whether a
    /// fetch happened and succeeded, or why not.
    pub async fn refresh(&self, settings: &Settings, metrics: &Metrics) -> Result<(), Failure> {
        let seen = self.keys.load().as_ref().map(|k| k.at);
        let _one = self.fetching.lock().await;
        // Someone else fetched while this one waited: use theirs.
        if self.keys.load().as_ref().map(|k| k.at) != seen {
            return Ok(());
        }
        {
            let mut last = self.last_attempt.lock().expect("not poisoned");
            if last.is_some_and(|at| at.elapsed() < settings.refetch_every) {
                return Err(if seen.is_some() {
                    Failure::Rejected(Rejection::UnknownKey(None))
                } else {
                    Failure::Unavailable(format!("the keys of {} could not be fetched recently", self.name()))
                });
            }
            *last = Some(Instant::now());
        }
        match self.fetch_keys(metrics).await {
            Ok(set) => {
                for why in &set.skipped {
                    tracing::debug!(server = %self.name(), "JWKS: {why}");
                }
                tracing::info!(server = %self.name(), keys = set.keys.len(), "fetched the authorization server's keys");
                self.keys.store(Some(Arc::new(Keys { set, at: Instant::now() })));
                Ok(())
            }
            Err(why) => {
                tracing::warn!(server = %self.name(), "cannot fetch the authorization server's keys: {why}");
                Err(Failure::Unavailable(format!("the keys of {} cannot be fetched", self.name())))
            }
        }
    }

    fn refresh_in_background(self: &Arc<Self>, settings: &Settings, metrics: &Metrics) {
        // Only one background refresh per `refetch_every`.
        let mut last = self.last_attempt.lock().expect("not poisoned");
        if last.is_some_and(|at| at.elapsed() < settings.refetch_every) || self.fetching.try_lock().is_err() {
            return;
        }
        *last = None;
        drop(last);
        let (me, settings, metrics) = (self.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move {
            let _ = me.refresh(&settings, &metrics).await;
        });
    }

    async fn fetch_keys(&self, metrics: &Metrics) -> Result<KeySet, String> {
        let endpoints = self.endpoints(metrics).await.map_err(|e| e.to_string())?;
        let uri = endpoints.jwks_uri.as_deref().ok_or("the metadata names no jwks_uri")?;
        let document = self.fetcher.get(uri).await;
        metrics.fetched(self.name(), "jwks", document.is_ok());
        let document = document.map_err(|e| {
            // The metadata may have moved the keys: discover again next time.
            self.endpoints.store(None);
            e.to_string()
        })?;
        KeySet::parse(&document).map_err(|e| format!("{uri}: {e}"))
    }

    /// The endpoints, from the configuration or the server's metadata
    /// (fetched once, again after a failure).
    async fn endpoints(&self, metrics: &Metrics) -> Result<Arc<Endpoints>, FetchError> {
        if let Some(known) = self.endpoints.load_full() {
            return Ok(known);
        }
        let s = &self.settings;
        let mut endpoints = Endpoints { jwks_uri: s.jwks_uri.clone(), introspection: s.introspection_endpoint.clone() };
        let needs_metadata = endpoints.jwks_uri.is_none() || (endpoints.introspection.is_none() && s.client.is_some());
        if needs_metadata {
            let metadata = self.discover(metrics).await?;
            let text = |name: &str| metadata.get(name).and_then(Value::as_str).map(str::to_owned);
            endpoints.jwks_uri = endpoints.jwks_uri.or_else(|| text("jwks_uri"));
            endpoints.introspection = endpoints.introspection.or_else(|| text("introspection_endpoint"));
        }
        let endpoints = Arc::new(endpoints);
        self.endpoints.store(Some(endpoints.clone()));
        Ok(endpoints)
    }

    /// The server's metadata: from `metadata_url`, else the RFC 8414
    /// well-known URL, else OpenID discovery. Its `issuer` must be the
    /// configured one (RFC 8414, section 3.3).
    async fn discover(&self, metrics: &Metrics) -> Result<Map<String, Value>, FetchError> {
        let urls = match &self.settings.metadata_url {
            Some(url) => vec![url.clone()],
            None => metadata_urls(&self.settings.issuer),
        };
        let mut last = None;
        for url in urls {
            let answer = self.fetcher.get(&url).await;
            metrics.fetched(self.name(), "metadata", answer.is_ok());
            match answer.map(|body| serde_json::from_slice::<Map<String, Value>>(&body)) {
                Ok(Ok(metadata)) => {
                    let issuer = metadata.get("issuer").and_then(Value::as_str).unwrap_or_default();
                    if issuer.trim_end_matches('/') != self.settings.issuer.trim_end_matches('/') {
                        let why = format!("the metadata names issuer {issuer:?}, not the configured one");
                        last = Some(FetchError::Http(url, why));
                        continue;
                    }
                    return Ok(metadata);
                }
                Ok(Err(e)) => last = Some(FetchError::Http(url, format!("the metadata is not a JSON object: {e}"))),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| FetchError::Url(self.settings.issuer.clone())))
    }

    /// Asks the server about an opaque token (RFC 7662), or answers from
    /// the cache. `Ok(None)`: the server says the token is not active.
    pub async fn introspect(
        &self,
        token: &str,
        settings: &Settings,
        metrics: &Metrics,
    ) -> Result<Option<Arc<Map<String, Value>>>, Failure> {
        let Some((id, secret)) = &self.settings.client else {
            return Ok(None);
        };
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(kept) = self.introspected.lock().expect("not poisoned").get(&hash) {
            if kept.until > Instant::now() {
                metrics.introspection_cached();
                return Ok(kept.claims.clone());
            }
        }
        let _permit = tokio::time::timeout(settings.timeout, self.introspecting.acquire())
            .await
            .map_err(|_| Failure::Unavailable(format!("too many introspections waiting at {}", self.name())))?
            .expect("never closed");
        let unavailable = |e: String| {
            tracing::warn!(server = %self.name(), "token introspection failed: {e}");
            Failure::Unavailable(format!("{} cannot introspect tokens now", self.name()))
        };
        let endpoints = self.endpoints(metrics).await.map_err(|e| unavailable(e.to_string()))?;
        let url = endpoints.introspection.as_deref().ok_or_else(|| unavailable("no introspection endpoint".into()))?;
        let form = [("token", token), ("token_type_hint", "access_token")];
        let answer = self.fetcher.post_form(url, &form, Some((id, secret))).await;
        metrics.fetched(self.name(), "introspection", answer.is_ok());
        let answer: Map<String, Value> = serde_json::from_slice(&answer.map_err(|e| unavailable(e.to_string()))?)
            .map_err(|e| unavailable(format!("the answer is not a JSON object: {e}")))?;
        let now = Instant::now();
        let (claims, until) = if answer.get("active") == Some(&Value::Bool(true)) {
            let lifetime = answer
                .get("exp")
                .and_then(Value::as_f64)
                .map(|exp| Duration::from_secs((exp as i64 - switchboard_core::time::now_ms() / 1000).max(0) as u64));
            let keep = lifetime.map_or(settings.introspection_cache, |l| l.min(settings.introspection_cache));
            (Some(Arc::new(answer)), now + keep)
        } else {
            (None, now + INACTIVE_FOR.min(settings.introspection_cache))
        };
        let mut kept = self.introspected.lock().expect("not poisoned");
        if kept.len() >= MAX_INTROSPECTED {
            kept.retain(|_, k| k.until > now);
        }
        if kept.len() < MAX_INTROSPECTED {
            kept.insert(hash, Introspected { claims: claims.clone(), until });
        }
        Ok(claims)
    }
}

/// Where an issuer's metadata may be: RFC 8414's well-known URL (the path
/// inserted after the host), then OpenID discovery (appended, and inserted).
pub fn metadata_urls(issuer: &str) -> Vec<String> {
    let issuer = issuer.trim_end_matches('/');
    let (origin, path) = match issuer.find("://").map(|i| i + 3) {
        Some(start) => match issuer[start..].find('/') {
            Some(slash) => issuer.split_at(start + slash),
            None => (issuer, ""),
        },
        None => (issuer, ""),
    };
    let mut urls = vec![format!("{origin}/.well-known/oauth-authorization-server{path}")];
    urls.push(format!("{issuer}/.well-known/openid-configuration"));
    if !path.is_empty() {
        urls.push(format!("{origin}/.well-known/openid-configuration{path}"));
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_follow_rfc8414_then_openid() {
        assert_eq!(
            metadata_urls("https://as.example.com/"),
            [
                "https://as.example.com/.well-known/oauth-authorization-server",
                "https://as.example.com/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://as.example.com/tenant1"),
            [
                "https://as.example.com/.well-known/oauth-authorization-server/tenant1",
                "https://as.example.com/tenant1/.well-known/openid-configuration",
                "https://as.example.com/.well-known/openid-configuration/tenant1"
            ]
        );
    }
}
