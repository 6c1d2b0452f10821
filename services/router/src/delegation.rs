//! Upstreams that act for each user (`[upstreams.oauth] grant =
//! "authorization_code"`): the router, an OAuth 2.1 client of the
//! upstream, gets each user's own token with their consent and keeps it in
//! the vault.
//!
//! The flow, from any replica to any other (all state travels sealed
//! under the vault key, so no replica remembers a flow):
//!
//! 1. A request of the user's is refused by the upstream (401, or 403 for
//!    a scope it lacks) with a Bearer challenge, or the user calls the
//!    upstream's `authorize` tool. The router answers with a link to its
//!    own `/oauth/start` carrying the sealed (tenant, user, upstream,
//!    challenge): as URL-mode elicitation (-32042) to a client that
//!    declared it, else as an error carrying the link (-32012).
//! 2. `/oauth/start` discovers the upstream's protected resource metadata
//!    and its authorization server's (asking the upstream for a challenge
//!    first if it has none), picks the client (configured, else the client
//!    ID metadata document, else dynamic registration), the scope and a
//!    PKCE verifier, and redirects to the authorization endpoint with all
//!    of that sealed as the `state`.
//! 3. `/oauth/callback` checks the response (state, `iss`), trades the code
//!    for tokens and stores them for that user in the vault, where every
//!    replica's requests find them.
//! 4. A background task renews grants before they expire (a refresh
//!    token's renewal is stored with a compare-and-set: one replica's
//!    renewal wins).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use switchboard_core::policy::Principal;
use switchboard_oauth::delegated::{self, Challenge, Client, Pkce, ServerMetadata, TokenAuth};
use switchboard_vault::{NewCredential, Vault};

use crate::config::DelegatedConfig;
use crate::user_catalogs::UserCatalogs;

/// How long an authorization link, and a flow once started, stay valid.
const LINK_LIFE_MS: i64 = 10 * 60 * 1000;
/// How often, at most, grants are looked at for renewal.
const RENEW_EVERY: Duration = Duration::from_secs(15);
/// How long a replica renewing a grant holds it (a failed renewal is tried
/// again after that).
const LEASE_MS: i64 = 60 * 1000;
/// Dynamic registrations kept (one per authorization server).
const MAX_REGISTRATIONS: usize = 256;

/// The sealed content of an authorization link.
#[derive(Serialize, Deserialize)]
struct Start {
    t: String,
    u: Option<String>,
    up: String,
    /// The upstream's challenge (`WWW-Authenticate`), if a request got one.
    c: Option<String>,
    /// Until when the link works (ms since the epoch).
    x: i64,
}

/// The sealed `state` of an authorization in progress.
#[derive(Serialize, Deserialize)]
struct Pending {
    t: String,
    u: Option<String>,
    up: String,
    verifier: String,
    server: ServerMetadata,
    client: Client,
    resource: String,
    scope: Option<String>,
    x: i64,
}

/// What the vault keeps with a user's tokens (the grant's particulars).
#[derive(Clone, Serialize, Deserialize)]
struct Particulars {
    issuer: String,
    token_endpoint: String,
    client: Client,
    resource: String,
    scope: Option<String>,
    refresh_token: Option<String>,
    /// When to renew (ms since the epoch), if the token expires.
    renew_at_ms: Option<i64>,
    /// Until when a replica is renewing it (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_until_ms: Option<i64>,
}

/// A page for the browser: status and text.
pub type Page = (http::StatusCode, String);

pub struct Delegation {
    vault: Vault,
    /// The router's address as users reach it.
    base: String,
    /// By upstream name; replaced when the config file's upstreams change.
    upstreams: arc_swap::ArcSwap<HashMap<String, Arc<DelegatedConfig>>>,
    /// Clients registered dynamically, by issuer.
    registered: Mutex<HashMap<String, Client>>,
    /// Users' catalogs (one is made afresh when its user's grant changes).
    catalogs: Arc<UserCatalogs>,
    metrics: Metrics,
    /// Told when this replica stores a new grant (the renewal loop looks
    /// again when it is due).
    stored: Arc<tokio::sync::Notify>,
}

impl Delegation {
    pub fn new(
        vault: Vault,
        base: String,
        configs: &[DelegatedConfig],
        catalogs: Arc<UserCatalogs>,
        registry: &prometheus::Registry,
    ) -> Delegation {
        Delegation {
            vault,
            base,
            upstreams: arc_swap::ArcSwap::from_pointee(by_upstream(configs)),
            registered: Mutex::default(),
            catalogs,
            metrics: Metrics::new(registry),
            stored: Arc::default(),
        }
    }

    /// Whether `upstream` acts for each user.
    pub fn covers(&self, upstream: &str) -> bool {
        self.upstreams.load().contains_key(upstream)
    }

    /// Whether any upstream acts for each user through it.
    pub fn any(&self) -> bool {
        !self.upstreams.load().is_empty()
    }

    /// The upstreams acting for each user are now `configs` (the config
    /// file changed). Users' grants stay in the vault: a grant for an
    /// upstream that no longer acts for users is neither used nor renewed;
    /// one the upstream's new authorization server refuses has its user
    /// asked to authorize again, as for any refused token.
    pub fn set(&self, configs: &[DelegatedConfig]) {
        self.upstreams.store(Arc::new(by_upstream(configs)));
        self.stored.notify_one();
    }

    fn redirect_uri(&self) -> String {
        format!("{}/oauth/callback", self.base)
    }

    /// The authorization link for `who` and `upstream`, which refused a
    /// request with `challenge` (if any); `None` without a vault key.
    pub fn link(&self, who: &Principal, upstream: &str, challenge: Option<&str>) -> Option<String> {
        let start = Start {
            t: who.tenant.name.to_string(),
            u: who.user.as_deref().map(str::to_owned),
            up: upstream.to_owned(),
            c: challenge.map(str::to_owned),
            x: now_ms() + LINK_LIFE_MS,
        };
        let sealed = self.vault.seal_state(&serde_json::to_vec(&start).expect("serializable"))?;
        self.metrics.authorized(upstream, "link");
        Some(format!("{}/oauth/start?s={sealed}", self.base))
    }

    /// A user's token was refused outright (401): it is dropped, so that
    /// the user is asked again rather than the upstream sent it again.
    pub fn refused(&self, who: &Principal, upstream: &str) {
        let user = who.user.as_deref();
        if self.vault.grant(&who.tenant.name, user, upstream).is_none() {
            return;
        }
        let (vault, tenant, user, upstream) =
            (self.vault.clone(), who.tenant.name.to_string(), user.map(str::to_owned), upstream.to_owned());
        tracing::info!(upstream = %upstream, tenant = %tenant, "the upstream refused a user's token; dropped, the user is asked to authorize again");
        tokio::spawn(async move {
            if let Err(e) = vault.delete(&tenant, user.as_deref(), &upstream).await {
                tracing::warn!(upstream = %upstream, error = %e, "cannot drop a refused token");
            }
        });
    }

    /// `GET /oauth/start?s=…`: where the link leads. Redirects to the
    /// authorization server, or says in a page why it cannot.
    pub async fn start(&self, query: &str) -> Result<String, Page> {
        let sealed = param(query, "s").ok_or_else(|| bad("this link is incomplete"))?;
        let start: Start = self
            .vault
            .open_state(&sealed)
            .and_then(|plain| serde_json::from_slice(&plain).ok())
            .ok_or_else(|| bad("this link is not one of this router's (or its key changed)"))?;
        if start.x < now_ms() {
            return Err(bad("this link has expired: make the request again for a new one"));
        }
        let config = self
            .upstreams
            .load()
            .get(&start.up)
            .cloned()
            .ok_or_else(|| bad("this upstream no longer acts for users"))?;
        let name = start.up.clone();
        let failed = |why: String| {
            self.metrics.authorized(&name, "failed");
            tracing::warn!(upstream = %name, error = %why, "cannot start an upstream authorization");
            (http::StatusCode::BAD_GATEWAY, format!("Cannot authorize {name}: {why}"))
        };
        let challenge = match &start.c {
            Some(c) => delegated::parse_challenge(c).unwrap_or_default(),
            None => self.probe(&config).await,
        };
        let found = delegated::discover(&config.fetcher, &config.server_url, &challenge).await.map_err(failed)?;
        let client = self.client(&config, &found.server).await.map_err(failed)?;
        let granted = self
            .vault
            .grant(&start.t, start.u.as_deref(), &start.up)
            .and_then(|g| serde_json::from_value::<Particulars>((*g.particulars).clone()).ok())
            .and_then(|p| p.scope);
        // A step-up (403, insufficient scope) asks for what was granted too.
        let step_up = challenge.error.as_deref() == Some("insufficient_scope");
        let scope = delegated::choose_scope(
            challenge.scope.as_deref(),
            &found.resource.scopes_supported,
            &found.server.scopes_supported,
            if step_up { granted.as_deref() } else { None },
        )
        .or_else(|| config.scope.clone());
        let resource = config.resource.clone().unwrap_or_else(|| found.resource.resource.clone());
        let pkce = Pkce::new();
        let pending = Pending {
            t: start.t,
            u: start.u,
            up: start.up,
            verifier: pkce.verifier.clone(),
            server: found.server,
            client,
            resource,
            scope,
            x: now_ms() + LINK_LIFE_MS,
        };
        let state = self
            .vault
            .seal_state(&serde_json::to_vec(&pending).expect("serializable"))
            .ok_or_else(|| failed("no vault key".into()))?;
        delegated::authorization_url(
            &pending.server,
            &pending.client.client_id,
            &self.redirect_uri(),
            &state,
            &pkce,
            pending.scope.as_deref(),
            &pending.resource,
        )
        .inspect(|_| self.metrics.authorized(&pending.up, "started"))
        .map_err(failed)
    }

    /// The upstream's challenge to a request without a token.
    async fn probe(&self, config: &DelegatedConfig) -> Challenge {
        let body = bytes::Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"switchboard","version":"0"}}}"#,
        );
        let answer =
            config.fetcher.fetch(http::Method::POST, &config.server_url, Some(("application/json", body)), None).await;
        answer.ok().and_then(|a| a.challenge).and_then(|c| delegated::parse_challenge(&c)).unwrap_or_default()
    }

    /// The router's client at `server`: the configured one, else its client
    /// ID metadata document's URL where the server takes those, else one
    /// registered dynamically (once per server).
    async fn client(&self, config: &DelegatedConfig, server: &ServerMetadata) -> Result<Client, String> {
        if let Some(id) = &config.client_id {
            let auth = config.auth.unwrap_or_else(|| {
                TokenAuth::choose(&server.token_endpoint_auth_methods_supported, config.client_secret.is_some())
            });
            return Ok(Client { client_id: id.clone(), client_secret: config.client_secret.clone(), auth });
        }
        let document = config
            .client_metadata_url
            .clone()
            .or_else(|| self.base.starts_with("https://").then(|| format!("{}/oauth/client-metadata.json", self.base)));
        if let (true, Some(url)) = (server.client_id_metadata_document_supported, document) {
            return Ok(Client { client_id: url, client_secret: None, auth: TokenAuth::None });
        }
        if let Some(client) = self.registered.lock().expect("lock").get(&server.issuer) {
            return Ok(client.clone());
        }
        let client = delegated::register(&config.fetcher, server, &self.redirect_uri(), "Switchboard").await?;
        let mut registered = self.registered.lock().expect("lock");
        if registered.len() >= MAX_REGISTRATIONS {
            registered.clear();
        }
        registered.insert(server.issuer.clone(), client.clone());
        Ok(client)
    }

    /// The router's client ID metadata document.
    pub fn client_metadata(&self) -> Value {
        json!({
            "client_id": format!("{}/oauth/client-metadata.json", self.base),
            "client_name": "Switchboard",
            "redirect_uris": [self.redirect_uri()],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        })
    }

    /// `GET /oauth/callback?…`: the authorization server's answer. Stores
    /// the user's tokens; a page says what happened.
    pub async fn callback(&self, query: &str) -> Page {
        match self.complete(query).await {
            Ok((upstream, user)) => (
                http::StatusCode::OK,
                format!(
                    "Switchboard can now reach {upstream} for {}. You can close this page and return to your client.",
                    user.as_deref().unwrap_or("your tenant")
                ),
            ),
            Err(page) => page,
        }
    }

    async fn complete(&self, query: &str) -> Result<(String, Option<String>), Page> {
        let state = param(query, "state").ok_or_else(|| bad("the authorization response has no state"))?;
        let pending: Pending = self
            .vault
            .open_state(&state)
            .and_then(|plain| serde_json::from_slice(&plain).ok())
            .ok_or_else(|| bad("the authorization response's state is not one of this router's"))?;
        if pending.x < now_ms() {
            return Err(bad("this authorization took too long: make the request again"));
        }
        let config = self
            .upstreams
            .load()
            .get(&pending.up)
            .cloned()
            .ok_or_else(|| bad("this upstream no longer acts for users"))?;
        let refused = |why: String| {
            self.metrics.authorized(&pending.up, "failed");
            tracing::warn!(upstream = %pending.up, error = %why, "an upstream authorization failed");
            (http::StatusCode::BAD_GATEWAY, format!("Cannot authorize {}: {why}", pending.up))
        };
        let code = delegated::authorization_code(query, &state, &pending.server).map_err(refused)?;
        let pkce = Pkce::of(pending.verifier.clone());
        let tokens = delegated::exchange_code(
            &config.fetcher,
            &pending.server,
            &pending.client,
            &code,
            &pkce,
            &self.redirect_uri(),
            &pending.resource,
        )
        .await
        .map_err(refused)?;
        let particulars = Particulars {
            issuer: pending.server.issuer.clone(),
            token_endpoint: delegated::token_endpoint(&pending.server).map_err(refused)?.to_owned(),
            client: pending.client.clone(),
            resource: pending.resource.clone(),
            scope: tokens.scope.clone().or_else(|| pending.scope.clone()),
            refresh_token: tokens.refresh_token.clone(),
            renew_at_ms: tokens.expires_in.map(|s| now_ms() + delegated::use_for(Some(s)).as_millis() as i64),
            lease_until_ms: None,
        };
        self.store(&pending.t, pending.u.as_deref(), &pending.up, &tokens.access_token, &particulars, None)
            .await
            .map_err(|e| refused(e.to_string()))?;
        self.metrics.authorized(&pending.up, "authorized");
        self.stored.notify_one();
        tracing::info!(upstream = %pending.up, tenant = %pending.t, "a user authorized the router at an upstream");
        self.catalogs.forget(&pending.t, pending.u.as_deref());
        Ok((pending.up, pending.u))
    }

    async fn store(
        &self,
        tenant: &str,
        user: Option<&str>,
        upstream: &str,
        access_token: &str,
        particulars: &Particulars,
        replacing: Option<&str>,
    ) -> Result<Option<String>, switchboard_vault::VaultError> {
        let new = NewCredential {
            tenant: tenant.to_owned(),
            user: user.map(str::to_owned),
            upstream: upstream.to_owned(),
            headers: vec![("Authorization".into(), format!("Bearer {access_token}"))],
        };
        let particulars = serde_json::to_value(particulars).expect("serializable");
        self.vault.put_grant(new, particulars, replacing, now_ms()).await
    }

    /// Renews, now, every grant due (its refresh token traded for new
    /// tokens). A replica first takes the grant's lease (a compare-and-set
    /// of the record it read, marking it as being renewed for
    /// [`LEASE_MS`]): the replica that gets it alone presents the refresh
    /// token, which an authorization server that detects the reuse of a
    /// rotated refresh token would otherwise answer by revoking the grant.
    pub async fn renew_due(&self) {
        let now = now_ms();
        for grant in self.vault.grants() {
            let Ok(p) = serde_json::from_value::<Particulars>((*grant.particulars).clone()) else { continue };
            let (Some(at), Some(refresh_token)) = (p.renew_at_ms, p.refresh_token.clone()) else { continue };
            if at > now || p.lease_until_ms.is_some_and(|until| until > now) {
                continue;
            }
            let Some(config) = self.upstreams.load().get(&grant.upstream).cloned() else { continue };
            let Some(access_token) = bearer_token(&grant.credential) else { continue };
            let user = Some(grant.user.as_str()).filter(|u| !u.is_empty());
            let leased = Particulars { lease_until_ms: Some(now + LEASE_MS), ..p.clone() };
            let lease =
                self.store(&grant.tenant, user, &grant.upstream, &access_token, &leased, Some(&grant.sealed)).await;
            let sealed = match lease {
                Ok(Some(sealed)) => sealed,
                Ok(None) => {
                    self.metrics.renewed(&grant.upstream, "elsewhere");
                    tracing::debug!(upstream = %grant.upstream, "another replica is renewing it");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(upstream = %grant.upstream, error = %e, "cannot take a grant's lease to renew it");
                    continue;
                }
            };
            let server: ServerMetadata = match serde_json::from_value(json!({
                "issuer": p.issuer, "token_endpoint": p.token_endpoint
            })) {
                Ok(s) => s,
                Err(_) => continue,
            };
            match delegated::refresh(&config.fetcher, &server, &p.client, &refresh_token, &p.resource).await {
                Ok(tokens) => {
                    let renewed = Particulars {
                        refresh_token: tokens.refresh_token.clone().or(p.refresh_token),
                        scope: tokens.scope.clone().or(p.scope),
                        renew_at_ms: tokens
                            .expires_in
                            .map(|s| now_ms() + delegated::use_for(Some(s)).as_millis() as i64),
                        lease_until_ms: None,
                        ..p
                    };
                    let stored = self
                        .store(&grant.tenant, user, &grant.upstream, &tokens.access_token, &renewed, Some(&sealed))
                        .await;
                    match stored {
                        Ok(Some(_)) => {
                            self.metrics.renewed(&grant.upstream, "ok");
                            tracing::debug!(upstream = %grant.upstream, "renewed a user's upstream token")
                        }
                        Ok(None) => {
                            // Replaced meanwhile (the user authorized again, or it was deleted).
                            self.metrics.renewed(&grant.upstream, "elsewhere");
                            tracing::debug!(upstream = %grant.upstream, "the grant changed while being renewed")
                        }
                        Err(e) => {
                            self.metrics.renewed(&grant.upstream, "failed");
                            tracing::warn!(upstream = %grant.upstream, error = %e, "cannot store a renewed token")
                        }
                    }
                }
                Err(e) => {
                    // The lease stands: tried again when it lapses.
                    self.metrics.renewed(&grant.upstream, "failed");
                    tracing::warn!(upstream = %grant.upstream, tenant = %grant.tenant, error = %e, "cannot renew a user's upstream token; tried again in a minute, and the user is asked to authorize again if the upstream refuses the old one")
                }
            }
        }
    }

    /// Renews grants in the background, until the router stops.
    pub fn start_renewing(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let (wait, stored) = {
                    let Some(me) = me.upgrade() else { return };
                    (me.until_due(), me.stored.clone())
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stored.notified() => continue,
                }
                let Some(me) = me.upgrade() else { return };
                me.renew_due().await;
            }
        });
    }

    /// How long until the first grant this replica knows of is due (its
    /// renewal time, or its lease's end): at least a second, at most
    /// [`RENEW_EVERY`] (grants stored by other replicas arrive meanwhile).
    /// Grants for upstreams no longer acting for users are not renewed.
    fn until_due(&self) -> Duration {
        let now = now_ms();
        let upstreams = self.upstreams.load();
        let due = self
            .vault
            .grants()
            .iter()
            .filter(|g| upstreams.contains_key(&g.upstream))
            .filter_map(|g| serde_json::from_value::<Particulars>((*g.particulars).clone()).ok())
            .filter(|p| p.refresh_token.is_some())
            .filter_map(|p| p.renew_at_ms.map(|at| at.max(p.lease_until_ms.unwrap_or(0))))
            .min();
        match due {
            Some(at) => {
                Duration::from_millis(at.saturating_sub(now).max(0) as u64).clamp(Duration::from_secs(1), RENEW_EVERY)
            }
            None => RENEW_EVERY,
        }
    }

    /// Whether `who` holds a grant for `upstream`.
    pub fn holds(&self, who: &Principal, upstream: &str) -> bool {
        self.vault.grant(&who.tenant.name, who.user.as_deref(), upstream).is_some()
    }
}

fn now_ms() -> i64 {
    switchboard_core::time::now_ms()
}

/// The access token a grant's credential sends.
fn bearer_token(credential: &switchboard_core::credential::Credential) -> Option<String> {
    let (_, value) = credential.headers().iter().find(|(name, _)| name == http::header::AUTHORIZATION)?;
    value.to_str().ok()?.strip_prefix("Bearer ").map(str::to_owned)
}

/// The metrics of users' authorizations at upstreams.
struct Metrics {
    authorizations: prometheus::IntCounterVec,
    renewals: prometheus::IntCounterVec,
}

impl Metrics {
    fn new(registry: &prometheus::Registry) -> Metrics {
        let counter = |name: &str, help: &str| {
            let c = prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), &["upstream", "outcome"])
                .expect("valid metric");
            let _ = registry.register(Box::new(c.clone()));
            c
        };
        Metrics {
            authorizations: counter(
                "switchboard_upstream_authorizations_total",
                "Users' authorizations of the router at upstreams acting for each user, by upstream and step: link (handed to a user), started (sent to the authorization server), authorized (tokens stored), failed.",
            ),
            renewals: counter(
                "switchboard_upstream_token_renewals_total",
                "Renewals of users' upstream tokens, by upstream and outcome: ok, failed, elsewhere (another replica renewed it, or it changed meanwhile).",
            ),
        }
    }

    fn authorized(&self, upstream: &str, step: &str) {
        self.authorizations.with_label_values(&[upstream, step]).inc();
    }

    fn renewed(&self, upstream: &str, outcome: &str) {
        self.renewals.with_label_values(&[upstream, outcome]).inc();
    }
}

fn bad(why: &str) -> Page {
    (http::StatusCode::BAD_REQUEST, why.to_owned())
}

/// The value of `name` in a URL query, decoded.
fn param(query: &str, name: &str) -> Option<String> {
    delegated::query_pairs(query).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn by_upstream(configs: &[DelegatedConfig]) -> HashMap<String, Arc<DelegatedConfig>> {
    configs.iter().map(|c| (c.upstream.clone(), Arc::new(c.clone()))).collect()
}
