//! The upstreams' metrics: reachability, era, sessions re-initialised or
//! resumed, child restarts, malformed or undeliverable messages.

use switchboard_core::metrics::{counter_vec, gauge_vec, IntCounterVec, IntGaugeVec, Registry};

use crate::Era;

/// Metrics about upstream servers, by upstream name.
pub struct Metrics {
    up: IntGaugeVec,
    era: IntGaugeVec,
    reinitializations: IntCounterVec,
    restarts: IntCounterVec,
    protocol_errors: IntCounterVec,
    relay_dropped: IntCounterVec,
    replica_up: IntGaugeVec,
    sessions_resumed: IntCounterVec,
    processes: IntGaugeVec,
    process_refusals: IntCounterVec,
}

impl Metrics {
    /// Registers the upstream metrics; every upstream in `names` starts down.
    pub fn new(registry: &Registry, names: &[&str]) -> Metrics {
        let metrics = Metrics {
            up: gauge_vec(
                registry,
                "switchboard_upstream_up",
                "1 if the upstream answered its last handshake or list, else 0.",
                &["upstream"],
            ),
            era: gauge_vec(
                registry,
                "switchboard_upstream_era",
                "1 for the protocol era the router found the upstream speaks: 2026-07-28 (stateless), 2025 (sessions) or 2024-11-05 (legacy HTTP+SSE).",
                &["upstream", "era"],
            ),
            reinitializations: counter_vec(
                registry,
                "switchboard_upstream_reinitializations_total",
                "Upstream sessions re-initialised after the upstream forgot them.",
                &["upstream"],
            ),
            restarts: counter_vec(
                registry,
                "switchboard_upstream_restarts_total",
                "Restarts of stdio upstream processes.",
                &["upstream"],
            ),
            protocol_errors: counter_vec(
                registry,
                "switchboard_upstream_protocol_errors_total",
                "Messages from an upstream that were not valid JSON-RPC.",
                &["upstream"],
            ),
            relay_dropped: counter_vec(
                registry,
                "switchboard_relay_dropped_total",
                "Upstream messages that could not be delivered to any client, by reason.",
                &["upstream", "reason"],
            ),
            replica_up: gauge_vec(
                registry,
                "switchboard_upstream_replica_up",
                "For an upstream with several urls: 1 while a replica accepts connections, else 0.",
                &["upstream", "replica"],
            ),
            sessions_resumed: counter_vec(
                registry,
                "switchboard_upstream_sessions_resumed_total",
                "Upstream sessions continued without a handshake (opened earlier, maybe by another replica).",
                &["upstream"],
            ),
            processes: gauge_vec(
                registry,
                "switchboard_upstream_processes",
                "Processes running for a stdio upstream with per_session (one per client session using it, and the catalog's).",
                &["upstream"],
            ),
            process_refusals: counter_vec(
                registry,
                "switchboard_upstream_process_refusals_total",
                "Sessions refused a process of a per_session stdio upstream because max_processes were running.",
                &["upstream"],
            ),
        };
        for name in names {
            metrics.set_up(name, false);
        }
        metrics
    }

    /// An upstream added while the router runs: it starts down.
    pub fn added(&self, upstream: &str) {
        self.set_up(upstream, false);
    }

    /// An upstream retired while the router runs: its gauges leave the
    /// exposition (an "upstream down" alert must not fire for it forever);
    /// its counters stay, as counters do.
    pub fn retired(&self, upstream: &str) {
        let _ = self.up.remove_label_values(&[upstream]);
        for e in Era::ALL {
            let _ = self.era.remove_label_values(&[upstream, e.label()]);
        }
        let _ = self.processes.remove_label_values(&[upstream]);
    }

    /// Whether the upstream answered its last handshake or list.
    pub fn set_up(&self, upstream: &str, up: bool) {
        self.up.with_label_values(&[upstream]).set(up as i64);
    }

    /// Records the era an upstream was found to speak (1 for it, 0 for the
    /// others). The era probe cannot tell a legacy HTTP+SSE server from a
    /// session-era one, so `Sessions` leaves a recorded `LegacySse` alone.
    pub fn set_era(&self, upstream: &str, era: Era) {
        if era == Era::Sessions && self.era.with_label_values(&[upstream, Era::LegacySse.label()]).get() == 1 {
            return;
        }
        for e in Era::ALL {
            self.era.with_label_values(&[upstream, e.label()]).set((e == era) as i64);
        }
    }

    pub fn reinitialized(&self, upstream: &str) {
        self.reinitializations.with_label_values(&[upstream]).inc();
    }

    pub fn restarted(&self, upstream: &str) {
        self.restarts.with_label_values(&[upstream]).inc();
    }

    /// A message that is not valid JSON-RPC.
    pub fn protocol_error(&self, upstream: &str) {
        self.protocol_errors.with_label_values(&[upstream]).inc();
    }

    /// A message no client can be given (`upstream` may be empty when it
    /// cannot be told), by reason.
    pub fn relay_dropped(&self, upstream: &str, reason: &str) {
        self.relay_dropped.with_label_values(&[upstream, reason]).inc();
    }

    pub fn set_replica_up(&self, upstream: &str, replica: &str, up: bool) {
        self.replica_up.with_label_values(&[upstream, replica]).set(up as i64);
    }

    /// Processes of a per-session stdio upstream running now.
    pub fn set_processes(&self, upstream: &str, n: usize) {
        self.processes.with_label_values(&[upstream]).set(n as i64);
    }

    /// A session refused a process: `max_processes` were running.
    pub fn process_refused(&self, upstream: &str) {
        self.process_refusals.with_label_values(&[upstream]).inc();
    }

    /// An upstream session continued without a handshake.
    pub fn session_resumed(&self, upstream: &str) {
        self.sessions_resumed.with_label_values(&[upstream]).inc();
    }
}
