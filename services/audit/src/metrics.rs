//! The audit writer's metrics: its queue, its spool, and what happened to
//! each record.

use switchboard_core::metrics::{counter, counter_vec, gauge, IntCounter, IntCounterVec, IntGauge, Registry};

/// Metrics about audit records.
pub struct Metrics {
    queue: IntGauge,
    spool_bytes: IntGauge,
    records: IntCounterVec,
    write_failures: IntCounter,
    batches: IntCounterVec,
    lag: prometheus::Gauge,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        let metrics = Metrics {
            queue: gauge(registry, "switchboard_audit_queue_depth", "Audit records waiting for the writer."),
            spool_bytes: gauge(
                registry,
                "switchboard_audit_spool_bytes",
                "Bytes of audit records in the spool file waiting for replay.",
            ),
            records: counter_vec(
                registry,
                "switchboard_audit_records_total",
                "Audit records by what happened to them: written, spooled, replayed, overflow (queue full, \
                 spooled by the request), rejected (refused by the database for what it holds, set aside in the \
                 rejected file), lost.",
                &["event"],
            ),
            write_failures: counter(
                registry,
                "switchboard_audit_write_failures_total",
                "Failed or timed-out audit writes to the database.",
            ),
            batches: counter_vec(
                registry,
                "switchboard_audit_batches_total",
                "Batches written to the database, by pace: paced (on PostgreSQL in COPYs of 64 rows, waiting for \
                 the server after each), at_once (in one COPY: a whole batch more was waiting, the writer behind, or \
                 the spool was being replayed; on SQLite every batch is written one way, and counted here too).",
                &["pace"],
            ),
            lag: {
                let lag = prometheus::Gauge::new(
                    "switchboard_audit_lag_seconds",
                    "Age of the oldest record of the last batch written to the database (since its request arrived).",
                )
                .expect("valid metric");
                let _ = registry.register(Box::new(lag.clone()));
                lag
            },
        };
        // Every event from the start, so that a rate or an increase of any of
        // them has a series to work on before it first happens.
        for event in ["written", "spooled", "replayed", "overflow", "rejected", "lost"] {
            metrics.records.with_label_values(&[event]);
        }
        for pace in ["paced", "at_once"] {
            metrics.batches.with_label_values(&[pace]);
        }
        metrics
    }

    pub(crate) fn batch_written(&self, pace: switchboard_db::Pace) {
        let pace = match pace {
            switchboard_db::Pace::Paced => "paced",
            switchboard_db::Pace::AtOnce => "at_once",
        };
        self.batches.with_label_values(&[pace]).inc();
    }

    /// The oldest record of a batch just written finished at `at_ms`.
    pub(crate) fn written_at(&self, at_ms: i64) {
        let lag = (switchboard_core::time::now_ms() - at_ms).max(0);
        self.lag.set(lag as f64 / 1000.0);
    }

    pub(crate) fn set_queue(&self, depth: usize) {
        self.queue.set(depth as i64);
    }

    pub(crate) fn set_spool_bytes(&self, bytes: u64) {
        self.spool_bytes.set(bytes as i64);
    }

    pub(crate) fn written(&self, n: usize) {
        self.records.with_label_values(&["written"]).inc_by(n as u64);
    }

    pub(crate) fn spooled(&self, n: usize) {
        self.records.with_label_values(&["spooled"]).inc_by(n as u64);
    }

    pub(crate) fn replayed(&self, n: usize) {
        self.records.with_label_values(&["replayed"]).inc_by(n as u64);
    }

    pub(crate) fn overflow(&self) {
        self.records.with_label_values(&["overflow"]).inc();
    }

    pub(crate) fn rejected(&self, n: usize) {
        self.records.with_label_values(&["rejected"]).inc_by(n as u64);
    }

    pub(crate) fn lost(&self, n: usize) {
        self.records.with_label_values(&["lost"]).inc_by(n as u64);
    }

    /// How many records went through `event`.
    #[cfg(test)]
    pub(crate) fn count(&self, event: &str) -> u64 {
        self.records.with_label_values(&[event]).get()
    }

    #[cfg(test)]
    pub(crate) fn batches(&self, pace: &str) -> u64 {
        self.batches.with_label_values(&[pace]).get()
    }

    pub(crate) fn write_failed(&self) {
        self.write_failures.inc();
    }
}
