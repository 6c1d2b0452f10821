//! The rate limits' metrics: refusals, and whether limits are shared
//! through Redis right now.

use switchboard_core::metrics::{counter, counter_vec, gauge, IntCounter, IntCounterVec, IntGauge, Registry};

/// Metrics about rate limits.
pub struct Metrics {
    rate_limited: IntCounterVec,
    redis_up: IntGauge,
    fallbacks: IntCounter,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        Metrics {
            rate_limited: counter_vec(
                registry,
                "switchboard_rate_limited_total",
                "Requests refused by a rate limit, by tenant and limit.",
                &["tenant", "limit"],
            ),
            redis_up: gauge(
                registry,
                "switchboard_ratelimit_redis_up",
                "1 while rate limits are shared through Redis, 0 while this replica falls back to local limits.",
            ),
            fallbacks: counter(
                registry,
                "switchboard_ratelimit_local_fallbacks_total",
                "Rate-limit checks done locally because Redis was unreachable.",
            ),
        }
    }

    /// A request of `tenant` refused by its `limit` (key, tenant, tool, concurrent).
    pub fn rate_limited(&self, tenant: &str, limit: &str) {
        self.rate_limited.with_label_values(&[tenant, limit]).inc();
    }

    pub(crate) fn set_redis_up(&self, up: bool) {
        self.redis_up.set(up as i64);
    }

    pub(crate) fn fallback(&self) {
        self.fallbacks.inc();
    }
}
