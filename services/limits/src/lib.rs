//! Rate limits: per API key, per tenant and per tool, each a GCRA (generic
//! cell rate algorithm: a "theoretical arrival time" per limit, so one number
//! of state each), checked together and atomically — a request refused by one
//! limit uses none of the others.
//!
//! [`Limiter`] checks locally ([`local`]) unless Redis is configured, in which
//! case one Lua script ([`cluster`]) checks every limit of a request in one
//! round trip and the limits hold across all replicas. When Redis cannot be
//! reached the local limiter takes over at once (each replica then enforces
//! the full limit on its own), which logs and metrics say, and Redis is tried
//! again a second later.
//!
//! Also here: the limit on forwarded requests in flight per tenant (local to
//! a replica).

pub mod cluster;
pub mod local;
mod metrics;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::metrics::Metrics;
use switchboard_core::policy::{Principal, Rate};

/// One limit a request must pass.
#[derive(Debug, Clone)]
pub struct Check {
    /// `key`, `tenant` or `tool`: named in the refusal.
    pub limit: &'static str,
    /// The limited thing, unique across limits.
    pub subject: Subject,
    pub rate: Rate,
}

/// What a limit counts: made from the request's principal without
/// formatting a string (the names are shared), hashed quickly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    Key(Arc<str>),
    Tenant(Arc<str>),
    Tool { tenant: Arc<str>, tool: Box<str> },
}

impl std::fmt::Display for Subject {
    /// As Redis keys name it: `key:…`, `tenant:…`, `tool:TENANT:TOOL`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Key(id) => write!(f, "key:{id}"),
            Subject::Tenant(name) => write!(f, "tenant:{name}"),
            Subject::Tool { tenant, tool } => write!(f, "tool:{tenant}:{tool}"),
        }
    }
}

/// The verdict on a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Allow,
    /// Refused by `limit`; a request may pass again after `retry_after`.
    Deny {
        limit: &'static str,
        retry_after: Duration,
    },
}

/// The limits of a request from `who`, calling `tool` if it is a `tools/call`.
pub fn checks(who: &Principal, tool: Option<&str>) -> Vec<Check> {
    let limits = &who.tenant.limits;
    let mut out = Vec::new();
    if let Some(rate) = limits.key {
        out.push(Check { limit: "key", subject: Subject::Key(who.key_id.clone()), rate });
    }
    if let Some(rate) = limits.tenant {
        out.push(Check { limit: "tenant", subject: Subject::Tenant(who.tenant.name.clone()), rate });
    }
    if let (Some(rate), Some(tool)) = (limits.tool, tool) {
        let subject = Subject::Tool { tenant: who.tenant.name.clone(), tool: tool.into() };
        out.push(Check { limit: "tool", subject, rate });
    }
    out
}

/// GCRA parameters in microseconds: the interval between requests at the
/// sustained rate, and how far ahead of now the arrival time may run.
pub fn gcra(rate: Rate) -> (u64, u64) {
    let interval = (1_000_000.0 / rate.per_second).max(1.0) as u64;
    (interval, interval * u64::from(rate.burst.max(1)))
}

/// Local limits, or Redis-backed ones falling back to local.
pub struct Limiter {
    local: local::Local,
    redis: Option<Arc<cluster::Shared>>,
    metrics: Arc<Metrics>,
    redis_down: AtomicBool,
    inflight: Mutex<HashMap<Arc<str>, Arc<AtomicU32>>>,
}

impl Limiter {
    pub fn new(redis: Option<Arc<cluster::Shared>>, metrics: Arc<Metrics>) -> Limiter {
        if redis.is_some() {
            metrics.set_redis_up(true);
        }
        Limiter {
            local: local::Local::default(),
            redis,
            metrics,
            redis_down: AtomicBool::new(false),
            inflight: Mutex::default(),
        }
    }

    /// Checks, and if all pass counts, the request against every limit.
    pub async fn check(&self, checks: &[Check]) -> Decision {
        if checks.is_empty() {
            return Decision::Allow;
        }
        if let Some(redis) = &self.redis {
            // Boxed: a request's future holds only what local limits need.
            match Box::pin(redis.check(checks)).await {
                Ok(decision) => {
                    if self.redis_down.swap(false, Ordering::Relaxed) {
                        tracing::info!("rate limits: Redis reachable again; limits are shared across replicas");
                        self.metrics.set_redis_up(true);
                    }
                    return decision;
                }
                Err(e) => {
                    if !self.redis_down.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "rate limits: Redis unreachable; each replica now enforces limits locally");
                        self.metrics.set_redis_up(false);
                    }
                    self.metrics.fallback();
                }
            }
        }
        self.local.check(checks)
    }

    /// Takes one of the tenant's `max` slots for a forwarded request; `None`
    /// if all are taken. The slot is freed when the permit drops.
    pub fn enter(&self, tenant: &Arc<str>, max: u32) -> Option<InflightPermit> {
        let counter = self.inflight.lock().expect("lock").entry(tenant.clone()).or_default().clone();
        let mut current = counter.load(Ordering::Relaxed);
        loop {
            if current >= max {
                return None;
            }
            match counter.compare_exchange_weak(current, current + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(InflightPermit(counter)),
                Err(seen) => current = seen,
            }
        }
    }
}

/// A slot of the per-tenant concurrency limit.
#[derive(Debug)]
pub struct InflightPermit(Arc<AtomicU32>);

impl Drop for InflightPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
