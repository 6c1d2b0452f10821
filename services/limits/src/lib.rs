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

/// One limit a request must pass, naming its subject with what the
/// request's principal already holds (nothing is copied or allocated to
/// check a request).
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// `key`, `tenant` or `tool`: named in the refusal.
    pub limit: &'static str,
    /// The limited thing, unique across limits.
    pub subject: SubjectRef<'a>,
    pub rate: Rate,
}

/// What a limit counts, as a request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubjectRef<'a> {
    Key(&'a str),
    Tenant(&'a str),
    Tool { tenant: &'a str, tool: &'a str },
}

/// What a limit counts, kept by the local limiter: a [`SubjectRef`] made
/// owned the first time it is counted. Hashed and compared as its
/// [`SubjectRef`], so that the map is searched with the borrowed form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Key(Box<str>),
    Tenant(Box<str>),
    Tool { tenant: Box<str>, tool: Box<str> },
}

impl Subject {
    pub fn as_ref(&self) -> SubjectRef<'_> {
        match self {
            Subject::Key(id) => SubjectRef::Key(id),
            Subject::Tenant(name) => SubjectRef::Tenant(name),
            Subject::Tool { tenant, tool } => SubjectRef::Tool { tenant, tool },
        }
    }
}

impl std::hash::Hash for Subject {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state);
    }
}

impl SubjectRef<'_> {
    pub fn to_owned(self) -> Subject {
        match self {
            SubjectRef::Key(id) => Subject::Key(id.into()),
            SubjectRef::Tenant(name) => Subject::Tenant(name.into()),
            SubjectRef::Tool { tenant, tool } => Subject::Tool { tenant: tenant.into(), tool: tool.into() },
        }
    }
}

impl hashbrown::Equivalent<Subject> for SubjectRef<'_> {
    fn equivalent(&self, key: &Subject) -> bool {
        *self == key.as_ref()
    }
}

impl std::fmt::Display for SubjectRef<'_> {
    /// As Redis keys name it: `key:…`, `tenant:…`, `tool:TENANT:TOOL`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubjectRef::Key(id) => write!(f, "key:{id}"),
            SubjectRef::Tenant(name) => write!(f, "tenant:{name}"),
            SubjectRef::Tool { tenant, tool } => write!(f, "tool:{tenant}:{tool}"),
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

/// The (at most three) limits of a request, in place: a slice of them by
/// `Deref`.
#[derive(Debug, Clone, Copy)]
pub struct Checks<'a> {
    list: [Check<'a>; 3],
    len: usize,
}

impl<'a> std::ops::Deref for Checks<'a> {
    type Target = [Check<'a>];
    fn deref(&self) -> &[Check<'a>] {
        &self.list[..self.len]
    }
}

impl<'a> Checks<'a> {
    fn push(&mut self, check: Check<'a>) {
        self.list[self.len] = check;
        self.len += 1;
    }
}

/// The limits of a request from `who`, calling `tool` if it is a `tools/call`.
pub fn checks<'a>(who: &'a Principal, tool: Option<&'a str>) -> Checks<'a> {
    const UNUSED: Check<'static> =
        Check { limit: "", subject: SubjectRef::Tenant(""), rate: Rate { per_second: 1.0, burst: 1 } };
    let limits = &who.tenant.limits;
    let mut out = Checks { list: [UNUSED; 3], len: 0 };
    if let Some(rate) = limits.key {
        out.push(Check { limit: "key", subject: SubjectRef::Key(&who.key_id), rate });
    }
    if let Some(rate) = limits.tenant {
        out.push(Check { limit: "tenant", subject: SubjectRef::Tenant(&who.tenant.name), rate });
    }
    if let (Some(rate), Some(tool)) = (limits.tool, tool) {
        out.push(Check { limit: "tool", subject: SubjectRef::Tool { tenant: &who.tenant.name, tool }, rate });
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

    /// Checks, and if all pass counts, the request against every limit;
    /// `at` is when it arrived (the local limiter's time; Redis keeps its
    /// own).
    pub async fn check(&self, checks: &[Check<'_>], at: std::time::Instant) -> Decision {
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
        self.local.check(checks, at)
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
