//! Upstreams that take each caller's own OAuth access token, exchanged
//! (`[upstreams.oauth] grant = "token_exchange"`, RFC 8693).
//!
//! A request authenticated with an OAuth access token (the front door's
//! `[oauth]`) has that token, the subject token, traded at the configured
//! authorization server for a token of each such upstream its tenant sees,
//! before the request goes on: the new token names the same user and has
//! the upstream as its audience. The client's own token never goes to an
//! upstream.
//!
//! A token is exchanged once and kept for that user until it is due (a
//! tenth of its life early) or the user's requests come with another
//! subject token; one exchange at a time per user and upstream. A failed
//! exchange is not tried again for [`RETRY_AFTER`] with the same subject
//! token; its reason is the error of the requests that needed it. A request
//! waits at most [`WAIT`] for the exchanges it starts (they go on, and the
//! next request finds their tokens). At most [`MAX_HELD`] users' tokens
//! are kept per replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use sha2::{Digest, Sha256};
use switchboard_core::credential::{Credential, Credentials, Missing};
use switchboard_core::policy::Principal;

use crate::config::ExchangedConfig;

/// How long a failed exchange is not tried again with the same subject token.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long a request waits for the exchanges it starts.
pub const WAIT: Duration = Duration::from_secs(5);
/// Users' exchanged tokens kept per replica (per user and upstream).
pub const MAX_HELD: usize = 10_000;

/// Whose token, for which upstream: tenant, user, upstream.
type Key = (Arc<str>, Arc<str>, Arc<str>);

/// One user's token for one upstream.
#[derive(Default)]
struct Slot {
    /// Held while exchanging: one exchange at a time.
    flight: tokio::sync::Mutex<()>,
    held: Mutex<Option<Held>>,
}

#[derive(Clone)]
struct Held {
    /// The subject token it came from (its SHA-256).
    subject: [u8; 32],
    /// The credential to send, or why there is none.
    got: Result<Arc<Credential>, String>,
    /// Until when it is used (or the failure stands).
    until: Instant,
}

impl Slot {
    fn current(&self) -> Option<Held> {
        self.held.lock().expect("lock").clone().filter(|h| Instant::now() < h.until)
    }

    /// Whether what is held stands for `subject`.
    fn settled(&self, subject: &[u8; 32]) -> bool {
        self.current().is_some_and(|h| &h.subject == subject)
    }
}

pub struct TokenExchange {
    /// By upstream name; replaced when the config file's upstreams change.
    upstreams: arc_swap::ArcSwap<HashMap<String, Arc<ExchangedConfig>>>,
    held: Mutex<HashMap<Key, Arc<Slot>>>,
    metrics: Metrics,
}

impl TokenExchange {
    pub fn new(configs: &[ExchangedConfig], registry: &Registry) -> TokenExchange {
        TokenExchange {
            upstreams: arc_swap::ArcSwap::from_pointee(by_upstream(configs)),
            held: Mutex::default(),
            metrics: Metrics::new(registry),
        }
    }

    /// Whether `upstream` takes exchanged tokens.
    pub fn covers(&self, upstream: &str) -> bool {
        self.upstreams.load().contains_key(upstream)
    }

    /// Whether any upstream takes exchanged tokens.
    pub fn any(&self) -> bool {
        !self.upstreams.load().is_empty()
    }

    /// The upstreams taking exchanged tokens are now `configs` (the config
    /// file changed): the tokens held for those no longer among them, or
    /// named in `changed` (their authorization server may differ), are
    /// dropped; requests exchange anew.
    pub fn set(&self, configs: &[ExchangedConfig], changed: &[&str]) {
        let new = by_upstream(configs);
        let mut held = self.held.lock().expect("lock");
        held.retain(|(_, _, upstream), _| new.contains_key(&**upstream) && !changed.contains(&&**upstream));
        self.metrics.held.set(held.len() as i64);
        self.upstreams.store(Arc::new(new));
    }

    /// Before a request of `who`, which came with the access token
    /// `subject`: a token of each upstream taking exchanged tokens that
    /// its tenant sees, exchanged unless one is held for this subject
    /// token. Waits at most [`WAIT`]. Whether a token is held now where
    /// none was (the user's lists of those upstreams are worth fetching
    /// again).
    pub async fn prepare(
        self: &Arc<Self>,
        who: &Principal,
        subject: &str,
        upstreams: &switchboard_upstream::Upstreams,
    ) -> bool {
        let Some(user) = &who.user else { return false };
        let digest: [u8; 32] = Sha256::digest(subject.as_bytes()).into();
        let mut started = Vec::new();
        for u in upstreams.iter().filter(|u| self.covers(&u.name) && who.tenant.sees_upstream(u.id)) {
            let key = (who.tenant.name.clone(), user.clone(), u.name.clone());
            let slot = self.slot(&key);
            if slot.settled(&digest) {
                continue;
            }
            let me = self.clone();
            let subject = subject.to_owned();
            started.push(tokio::spawn(async move { me.exchange(&key, &slot, digest, &subject).await }));
        }
        if started.is_empty() {
            return false;
        }
        let done = tokio::time::timeout(WAIT, futures_util::future::join_all(started)).await;
        done.is_ok_and(|results| results.into_iter().any(|r| r.unwrap_or(false)))
    }

    /// Exchanges `subject` for a token of upstream `key.2`, unless another
    /// request did meanwhile; whether it got one where none was held.
    async fn exchange(&self, key: &Key, slot: &Slot, digest: [u8; 32], subject: &str) -> bool {
        let _flight = slot.flight.lock().await;
        if slot.settled(&digest) {
            return false;
        }
        let Some(config) = self.upstreams.load().get(&*key.2).cloned() else { return false };
        let had = slot.current().is_some_and(|h| h.got.is_ok());
        let held = match config.exchanger.exchange(subject).await {
            Ok(token) => match bearer(&config, &token.value, key) {
                Ok(credential) => {
                    self.metrics.exchanged(&key.2, "ok");
                    Held { subject: digest, got: Ok(credential), until: token.renew_at() }
                }
                Err(why) => self.failed(key, digest, why),
            },
            Err(why) => self.failed(
                key,
                digest,
                format!("the authorization server did not exchange your token for one of upstream {:?}: {why}", key.2),
            ),
        };
        let got = held.got.is_ok();
        *slot.held.lock().expect("lock") = Some(held);
        got && !had
    }

    fn failed(&self, key: &Key, digest: [u8; 32], why: String) -> Held {
        self.metrics.exchanged(&key.2, "failed");
        tracing::warn!(upstream = %key.2, tenant = %key.0, error = %why, "token exchange failed");
        Held { subject: digest, got: Err(why), until: Instant::now() + RETRY_AFTER }
    }

    /// The slot of `key`, made if new (at most [`MAX_HELD`]: beyond, those
    /// no longer used go, else all).
    fn slot(&self, key: &Key) -> Arc<Slot> {
        let mut held = self.held.lock().expect("lock");
        if let Some(slot) = held.get(key) {
            return slot.clone();
        }
        if held.len() >= MAX_HELD {
            held.retain(|_, slot| slot.current().is_some());
            if held.len() >= MAX_HELD {
                held.clear();
            }
            self.metrics.evictions.inc();
            tracing::warn!(
                limit = MAX_HELD,
                "exchanged tokens at their limit: dropped some (they are exchanged again when needed)"
            );
        }
        let slot = Arc::new(Slot::default());
        held.insert(key.clone(), slot.clone());
        self.metrics.held.set(held.len() as i64);
        slot
    }

    /// The upstream refused (401) the token held for `who`: not sent again;
    /// the next request exchanges anew.
    pub fn refused(&self, who: &Principal, upstream: &str) {
        let Some(user) = &who.user else { return };
        let key = (who.tenant.name.clone(), user.clone(), Arc::from(upstream));
        if let Some(slot) = self.held.lock().expect("lock").get(&key) {
            *slot.held.lock().expect("lock") = None;
            tracing::info!(upstream = %upstream, "the upstream refused an exchanged token; exchanged again at the next request");
        }
    }

    /// What a channel of `user` of `tenant` to `upstream` sends: the
    /// exchanged token held for the user, else `stored` (the vault's
    /// credential of the user or tenant, if any), else nothing (an error
    /// that says why).
    pub fn credentials(
        self: &Arc<Self>,
        tenant: &str,
        user: Option<&str>,
        upstream: &str,
        stored: Arc<dyn Credentials>,
    ) -> Arc<dyn Credentials> {
        Arc::new(Exchanged {
            me: self.clone(),
            key: user.map(|u| (Arc::from(tenant), Arc::from(u), Arc::from(upstream))),
            upstream: Arc::from(upstream),
            stored,
        })
    }
}

fn by_upstream(configs: &[ExchangedConfig]) -> HashMap<String, Arc<ExchangedConfig>> {
    configs.iter().map(|c| (c.upstream.clone(), Arc::new(c.clone()))).collect()
}

/// The credential of an exchanged token: `Authorization: Bearer` beside the
/// upstream's other headers.
fn bearer(config: &ExchangedConfig, token: &str, key: &Key) -> Result<Arc<Credential>, String> {
    let value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "the exchanged token is not a valid header value".to_owned())?;
    let mut headers = config.headers.clone();
    headers.push((http::header::AUTHORIZATION, value));
    Ok(Arc::new(Credential::new(format!("{}/{}/{} (exchanged)", key.0, key.1, key.2), headers)))
}

struct Exchanged {
    me: Arc<TokenExchange>,
    key: Option<Key>,
    upstream: Arc<str>,
    stored: Arc<dyn Credentials>,
}

impl Credentials for Exchanged {
    fn current(&self) -> Result<Option<Arc<Credential>>, Missing> {
        let held = self.key.as_ref().and_then(|key| self.me.held.lock().expect("lock").get(key).cloned());
        let held = held.and_then(|slot| slot.current());
        if let Some(Held { got: Ok(credential), .. }) = &held {
            return Ok(Some(credential.clone()));
        }
        if let Some(stored) = self.stored.current()? {
            return Ok(Some(stored));
        }
        Err(Missing(match held {
            Some(Held { got: Err(why), .. }) => why,
            _ => format!(
                "upstream {:?} takes your own OAuth access token, exchanged for one of its own: call with an access token of the router's authorization server (an API key or certificate has none), or have an operator store a credential for you",
                self.upstream
            ),
        }))
    }
}

struct Metrics {
    exchanges: IntCounterVec,
    held: IntGauge,
    evictions: prometheus::IntCounter,
}

impl Metrics {
    fn new(registry: &Registry) -> Metrics {
        let exchanges = IntCounterVec::new(
            Opts::new(
                "switchboard_token_exchanges_total",
                "Token exchanges (RFC 8693) of callers' access tokens for upstream tokens, by upstream and outcome (ok, failed).",
            ),
            &["upstream", "outcome"],
        )
        .expect("valid metric");
        let held =
            IntGauge::new("switchboard_token_exchange_held", "Users' exchanged upstream tokens kept on this replica.")
                .expect("valid metric");
        let evictions = prometheus::IntCounter::new(
            "switchboard_token_exchange_evictions_total",
            "Times the exchanged tokens kept reached their limit and some were dropped.",
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(exchanges.clone()));
        let _ = registry.register(Box::new(held.clone()));
        let _ = registry.register(Box::new(evictions.clone()));
        Metrics { exchanges, held, evictions }
    }

    fn exchanged(&self, upstream: &str, outcome: &str) {
        self.exchanges.with_label_values(&[upstream, outcome]).inc();
    }
}
