//! The catalog's metrics: lists fetched, upstreams left out, names that collided.

use switchboard_core::metrics::{counter_vec, IntCounterVec, Registry};
use switchboard_protocol::methods::ListKind;

/// Metrics about building the merged catalog.
pub struct Metrics {
    failures: IntCounterVec,
    collisions: IntCounterVec,
    refreshes: IntCounterVec,
    oversized: IntCounterVec,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        Metrics {
            failures: counter_vec(
                registry,
                "switchboard_catalog_upstream_failures_total",
                "Times an upstream was left out of a list because it failed or was too slow.",
                &["upstream", "list"],
            ),
            collisions: counter_vec(
                registry,
                "switchboard_catalog_collisions_total",
                "Names left out of a list because another item has the same exposed name (another upstream's, or the same upstream listing it twice); once per name.",
                &["list"],
            ),
            refreshes: counter_vec(
                registry,
                "switchboard_catalog_refreshes_total",
                "Lists fetched from upstreams (cache misses).",
                &["upstream", "list"],
            ),
            oversized: counter_vec(
                registry,
                "switchboard_catalog_oversized_total",
                "Times an upstream's list was left out for exceeding catalog.max_upstream_items or catalog.max_upstream_bytes.",
                &["upstream", "list"],
            ),
        }
    }

    /// An upstream's list was left out for its size.
    pub fn oversized(&self, upstream: &str, list: ListKind) {
        self.oversized.with_label_values(&[upstream, list.label()]).inc();
    }

    /// An upstream's list was left out: it failed or was too slow.
    pub fn failed(&self, upstream: &str, list: ListKind) {
        self.failures.with_label_values(&[upstream, list.label()]).inc();
    }

    /// An item was dropped: its exposed name was taken.
    pub fn collision(&self, list: ListKind) {
        self.collisions.with_label_values(&[list.label()]).inc();
    }

    /// An upstream's list was fetched (a cache miss).
    pub fn refreshed(&self, upstream: &str, list: ListKind) {
        self.refreshes.with_label_values(&[upstream, list.label()]).inc();
    }
}
