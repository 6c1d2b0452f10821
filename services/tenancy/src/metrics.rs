//! The directory's metrics: whether it reached the database, and requests
//! refused for their key.

use switchboard_core::metrics::{counter_vec, gauge, IntCounterVec, IntGauge, Registry};

/// Metrics about tenants and keys.
pub struct Metrics {
    auth_failures: IntCounterVec,
    db_up: IntGauge,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        Metrics {
            auth_failures: counter_vec(
                registry,
                "switchboard_auth_failures_total",
                "Requests refused for their API key, by reason (missing, invalid, expired, wrong_tenant).",
                &["reason"],
            ),
            db_up: gauge(
                registry,
                "switchboard_tenant_directory_db_up",
                "1 if the last refresh of tenants and keys reached the database, else 0.",
            ),
        }
    }

    /// A request refused for its key (or for naming another tenant's session).
    pub fn auth_failed(&self, reason: &str) {
        self.auth_failures.with_label_values(&[reason]).inc();
    }

    /// Whether the last refresh of tenants and keys reached the database.
    pub fn set_db_up(&self, up: bool) {
        self.db_up.set(up as i64);
    }
}
