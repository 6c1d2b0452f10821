//! Switchboard as an OAuth 2.1 resource server (the MCP authorization
//! specification; RFC 9068, RFC 7662, RFC 8414, RFC 8707).
//!
//! A [`Verifier`] knows the configured authorization servers and checks an
//! access token: a JWT against the keys of the server that issued it (its
//! `iss`), an opaque token through the introspection endpoint of the servers
//! that allow it. A good token yields its server and claims ([`Verified`]);
//! what they mean (tenant, user, permissions) is the router's business.
//!
//! - `keys`: JWKS documents and signature verification (asymmetric only).
//! - `token`: decoding JWTs and checking their claims.
//! - `server`: one authorization server: discovery, cached keys,
//!   introspection with its cache.
//! - `fetch`: the bounded HTTP(S) requests to authorization servers.
//! - `client`: the router as an OAuth client of upstreams (client
//!   credentials).
//! - `delegated`: the router as an OAuth client acting for a user:
//!   challenges, discovery, registration, scope, PKCE, the redirect's
//!   checks, token requests.

pub mod client;
pub mod delegated;
pub mod fetch;
pub mod keys;
pub mod server;
pub mod token;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntCounterVec, Registry};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use keys::Alg;
pub use server::{AuthServer, ServerSettings};
pub use token::Rejection;

/// How tokens are checked, for every server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This router's resource identifier: the `aud` tokens must carry.
    pub audience: String,
    /// The signature algorithms accepted.
    pub algorithms: Vec<Alg>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// An unknown `kid` fetches the keys again at most this often.
    pub refetch_every: Duration,
    /// Keys older than this are fetched again in the background.
    pub keys_max_age: Duration,
    /// An introspection answer, and a JWT found good, is kept at most this
    /// long (and never past the token's expiry).
    pub introspection_cache: Duration,
    /// Each request to an authorization server.
    pub timeout: Duration,
    /// Where requests to authorization servers may go (the SSRF guard).
    pub egress: switchboard_core::egress::Egress,
}

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The token is bad (a 401 with `error="invalid_token"`).
    Rejected(Rejection),
    /// The token could not be checked: its server cannot be reached and
    /// nothing is cached (a 503; the token may well be good).
    Unavailable(String),
}

/// A token that checked out.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The index of its server among those the verifier was given.
    pub server: usize,
    pub claims: Arc<Map<String, Value>>,
    /// What the caller makes of the claims (its tenant, user, scopes),
    /// worked out once: a remembered token hands out the same slot to every
    /// request that presents it.
    pub derived: Arc<std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>>,
    /// Until when the verifier holds the token good without checking it
    /// again (a JWT in its cache of good tokens: until its `exp`, at most
    /// `introspection_cache`); `None`: not kept, checked again each time.
    pub good_until: Option<Instant>,
}

impl Verified {
    fn new(server: usize, claims: Arc<Map<String, Value>>) -> Verified {
        Verified { server, claims, derived: Arc::default(), good_until: None }
    }
}

/// What the verifier records.
#[derive(Clone)]
pub struct Metrics {
    fetches: IntCounterVec,
    rejected: IntCounterVec,
    introspection_cached: IntCounter,
    verified_cached: IntCounter,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        use switchboard_core::metrics::counter_vec;
        let introspection_cached = IntCounter::new(
            "switchboard_oauth_introspection_cache_hits_total",
            "Opaque tokens answered from the introspection cache.",
        )
        .expect("valid metric");
        registry.register(Box::new(introspection_cached.clone())).expect("registered once");
        let verified_cached = IntCounter::new(
            "switchboard_oauth_verified_cache_hits_total",
            "JWT access tokens answered from the cache of tokens found good (no signature check), a connection presenting its last token again included.",
        )
        .expect("valid metric");
        registry.register(Box::new(verified_cached.clone())).expect("registered once");
        Metrics {
            fetches: counter_vec(
                registry,
                "switchboard_oauth_fetches_total",
                "Requests to authorization servers, by server, what (metadata, jwks, introspection) and result (ok, error).",
                &["server", "what", "result"],
            ),
            rejected: counter_vec(
                registry,
                "switchboard_oauth_rejected_tokens_total",
                "Access tokens refused, by reason (signature, expired, audience, issuer, unknown_key, inactive, …).",
                &["reason"],
            ),
            introspection_cached,
            verified_cached,
        }
    }

    fn fetched(&self, server: &str, what: &str, ok: bool) {
        self.fetches.with_label_values(&[server, what, if ok { "ok" } else { "error" }]).inc();
    }

    fn introspection_cached(&self) {
        self.introspection_cached.inc();
    }

    fn rejected(&self, why: &Rejection) {
        self.rejected.with_label_values(&[why.label()]).inc();
    }
}

/// Checks access tokens against the configured authorization servers.
pub struct Verifier {
    settings: Settings,
    servers: Vec<Arc<AuthServer>>,
    metrics: Metrics,
    /// JWTs found good, by their SHA-256: a client sends the same token
    /// with every request, and its signature need not be checked each time.
    good: Mutex<GoodTokens>,
}

struct GoodTokens {
    /// Each kept with its [`Verified::good_until`] set.
    tokens: HashMap<[u8; 32], Verified>,
    /// When the expired ones were last swept out (at most once a second,
    /// when the map is full).
    swept: Instant,
}

/// Whether a kept JWT is still held good at `now`.
fn held(verified: &Verified, now: Instant) -> bool {
    verified.good_until.is_some_and(|until| until > now)
}

/// At most this many good JWTs are kept (about 2 MB); beyond, each new one
/// takes the place of another.
pub const MAX_GOOD_TOKENS: usize = 10_000;

impl Verifier {
    pub fn new(settings: Settings, servers: Vec<ServerSettings>, metrics: Metrics) -> Result<Verifier, String> {
        let servers = servers
            .into_iter()
            .map(|s| {
                let name = s.name.clone();
                AuthServer::new(s, settings.timeout, &settings.egress).map(Arc::new).map_err(|e| format!("{name}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let good = GoodTokens { tokens: HashMap::new(), swept: Instant::now() };
        Ok(Verifier { settings, servers, metrics, good: Mutex::new(good) })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn servers(&self) -> &[Arc<AuthServer>] {
        &self.servers
    }

    /// Checks `token` with what is cached: `None` when that is not enough
    /// (the keys must be fetched, or the token introspected): then
    /// [`Verifier::verify`].
    pub fn verify_cached(&self, token: &str) -> Option<Result<Verified, Failure>> {
        if !token::looks_like_jwt(token) {
            return None;
        }
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(good) = self.good.lock().expect("not poisoned").tokens.get(&hash) {
            if held(good, Instant::now()) {
                self.metrics.verified_cached.inc();
                return Some(Ok(good.clone()));
            }
        }
        let jwt = match token::decode(token, &self.settings.algorithms) {
            Ok(jwt) => jwt,
            Err(why) => return Some(self.count(Err(Failure::Rejected(why)))),
        };
        let Some(server) = self.issuer_of(&jwt) else {
            return Some(self.count(Err(unknown_issuer(&jwt))));
        };
        let checked = self.servers[server].verify_cached(&jwt, &self.settings, &self.metrics)?;
        let mut outcome = checked.and_then(|()| self.finish(server, jwt.claims));
        if let Ok(verified) = &mut outcome {
            self.keep_good(hash, verified);
        }
        Some(self.count(outcome))
    }

    /// A token its caller had remembered as good (until the
    /// [`Verified::good_until`] it was given) was presented again: counted
    /// as answered from the cache, which it is.
    pub fn count_remembered(&self) {
        self.metrics.verified_cached.inc();
    }

    /// Keeps a good JWT until its `exp`, at most `introspection_cache`
    /// (and says so in its [`Verified::good_until`]).
    fn keep_good(&self, hash: [u8; 32], verified: &mut Verified) {
        let now_s = switchboard_core::time::now_ms() / 1000;
        let Some(exp) = verified.claims.get("exp").and_then(Value::as_f64) else {
            return;
        };
        let left = Duration::from_secs((exp as i64 - now_s).max(0) as u64).min(self.settings.introspection_cache);
        if left.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut good = self.good.lock().expect("not poisoned");
        if good.tokens.len() >= MAX_GOOD_TOKENS && now.duration_since(good.swept) >= Duration::from_secs(1) {
            good.tokens.retain(|_, g| held(g, now));
            good.swept = now;
        }
        if good.tokens.len() >= MAX_GOOD_TOKENS {
            // Still full: one makes room (any one: it is checked again when
            // next seen, nothing worse).
            if let Some(any) = good.tokens.keys().next().copied() {
                good.tokens.remove(&any);
            }
        }
        verified.good_until = Some(now + left);
        good.tokens.insert(hash, verified.clone());
    }

    /// Checks `token`, fetching keys or introspecting as needed.
    pub async fn verify(&self, token: &str) -> Result<Verified, Failure> {
        if let Some(done) = self.verify_cached(token) {
            return done;
        }
        let outcome =
            if token::looks_like_jwt(token) { self.verify_jwt(token).await } else { self.introspect(token).await };
        self.count(outcome)
    }

    async fn verify_jwt(&self, token: &str) -> Result<Verified, Failure> {
        let jwt = token::decode(token, &self.settings.algorithms).map_err(Failure::Rejected)?;
        let server = self.issuer_of(&jwt).ok_or_else(|| unknown_issuer(&jwt))?;
        let authority = &self.servers[server];
        let checked = match authority.verify_cached(&jwt, &self.settings, &self.metrics) {
            Some(done) => done,
            None => {
                authority.refresh(&self.settings, &self.metrics).await?;
                authority
                    .verify_cached(&jwt, &self.settings, &self.metrics)
                    .unwrap_or_else(|| Err(Failure::Rejected(Rejection::UnknownKey(jwt.kid.clone()))))
            }
        };
        let mut outcome = checked.and_then(|()| self.finish(server, jwt.claims));
        if let Ok(verified) = &mut outcome {
            self.keep_good(Sha256::digest(token.as_bytes()).into(), verified);
        }
        outcome
    }

    /// The server whose issuer the token names (before the signature is
    /// checked: it only picks the keys to check it with).
    fn issuer_of(&self, jwt: &token::Unverified<'_>) -> Option<usize> {
        let iss = jwt.claims.get("iss").and_then(Value::as_str)?;
        self.servers.iter().position(|s| s.settings.issuer.trim_end_matches('/') == iss.trim_end_matches('/'))
    }

    /// The claims' checks, once the signature is good.
    fn finish(&self, server: usize, claims: Map<String, Value>) -> Result<Verified, Failure> {
        let now_s = switchboard_core::time::now_ms() / 1000;
        let issuer = &self.servers[server].settings.issuer;
        let leeway = self.settings.leeway.as_secs() as i64;
        token::check_claims(&claims, issuer, &self.settings.audience, now_s, leeway).map_err(Failure::Rejected)?;
        Ok(Verified::new(server, Arc::new(claims)))
    }

    /// An opaque token: asked of each server that introspects, in order,
    /// until one says it is active.
    async fn introspect(&self, token: &str) -> Result<Verified, Failure> {
        if token.len() > token::MAX_TOKEN_BYTES || token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            return Err(Failure::Rejected(Rejection::Malformed("not a token")));
        }
        let mut unavailable = None;
        for (index, server) in self.servers.iter().enumerate().filter(|(_, s)| s.can_introspect()) {
            match server.introspect(token, &self.settings, &self.metrics).await {
                Ok(Some(claims)) => return self.check_introspected(index, claims),
                Ok(None) => {}
                Err(e) => unavailable = Some(e),
            }
        }
        Err(unavailable.unwrap_or(Failure::Rejected(Rejection::Inactive)))
    }

    /// An active token's introspection answer: its `iss` (if given) must be
    /// the server's, its `aud` must name this resource, and it must not
    /// have expired.
    fn check_introspected(&self, server: usize, claims: Arc<Map<String, Value>>) -> Result<Verified, Failure> {
        let issuer = &self.servers[server].settings.issuer;
        if let Some(iss) = claims.get("iss").and_then(Value::as_str) {
            if iss.trim_end_matches('/') != issuer.trim_end_matches('/') {
                return Err(Failure::Rejected(Rejection::Issuer(iss.chars().take(200).collect())));
            }
        }
        token::check_audience(&claims, &self.settings.audience).map_err(Failure::Rejected)?;
        if let Some(exp) = claims.get("exp").and_then(Value::as_f64) {
            let now_s = switchboard_core::time::now_ms() / 1000;
            if (exp as i64).saturating_add(self.settings.leeway.as_secs() as i64) <= now_s {
                return Err(Failure::Rejected(Rejection::Expired));
            }
        }
        Ok(Verified::new(server, claims))
    }

    fn count(&self, outcome: Result<Verified, Failure>) -> Result<Verified, Failure> {
        if let Err(Failure::Rejected(why)) = &outcome {
            self.metrics.rejected(why);
            tracing::debug!("access token refused: {why}");
        }
        outcome
    }
}

/// A JWT whose `iss` names no configured authorization server.
fn unknown_issuer(jwt: &token::Unverified<'_>) -> Failure {
    let iss = jwt.claims.get("iss").and_then(Value::as_str).unwrap_or("(none)");
    Failure::Rejected(Rejection::Issuer(iss.chars().take(200).collect()))
}
