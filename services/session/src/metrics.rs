//! The sessions' metrics: how many live here, adopted and repaired ones,
//! session store failures, stream events that could not be shared.

use switchboard_core::metrics::{counter, counter_vec, gauge, IntCounter, IntCounterVec, IntGauge, Registry};

/// A histogram with the OpenTelemetry MCP conventions' bucket boundaries.
fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::HistogramVec {
    let opts = prometheus::HistogramOpts::new(name, help).buckets(switchboard_telemetry::mcp::BUCKETS.to_vec());
    let h = prometheus::HistogramVec::new(opts, labels).expect("valid metric");
    let _ = registry.register(Box::new(h.clone()));
    h
}

/// Metrics about downstream sessions and where they are kept.
pub struct Metrics {
    sessions: IntGauge,
    adopted: IntCounter,
    repaired: IntCounter,
    store_errors: IntCounterVec,
    stream_events_dropped: IntCounter,
    claims_lost: IntCounter,
    store_lost: IntCounter,
    waited_for_repair: IntCounterVec,
    taken_over: IntCounterVec,
    reclaimed: IntCounter,
    server_session: prometheus::HistogramVec,
    client_session: prometheus::HistogramVec,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        Metrics {
            sessions: gauge(registry, "switchboard_sessions", "Live downstream sessions on this replica."),
            adopted: counter(
                registry,
                "switchboard_sessions_adopted_total",
                "Sessions this replica loaded from the shared session store to continue them.",
            ),
            repaired: counter(
                registry,
                "switchboard_sessions_repaired_total",
                "Live sessions written back to the session store after it lost them (a Redis restart).",
            ),
            store_errors: counter_vec(
                registry,
                "switchboard_session_store_errors_total",
                "Session store operations that failed, by operation.",
                &["op"],
            ),
            stream_events_dropped: counter(
                registry,
                "switchboard_stream_events_dropped_total",
                "Events for streams shared across replicas not copied to Redis: the queue to Redis was full, the event was over 4 MiB, or (a GET stream's message with no one to tell) its client had not read the 512 before it.",
            ),
            claims_lost: counter(
                registry,
                "switchboard_upstream_session_claims_lost_total",
                "Upstream sessions this replica opened for a session while another replica opened one first: ours was ended, theirs used.",
            ),
            store_lost: counter(
                registry,
                "switchboard_session_store_lost_total",
                "Times this replica found the session store had lost everything (Redis restarted empty) and wrote its sessions back.",
            ),
            waited_for_repair: counter_vec(
                registry,
                "switchboard_session_repair_waits_total",
                "Requests for a session the store had lost and this replica did not hold, which waited for the replica holding it to write it back, by result (found, not_found).",
                &["result"],
            ),
            taken_over: counter_vec(
                registry,
                "switchboard_streams_taken_over_total",
                "Request streams this replica took over from a replica that stopped before the answer, by result: resumed (from the upstream) or failed (the client got an error saying why).",
                &["result"],
            ),
            reclaimed: counter(
                registry,
                "switchboard_sessions_reclaimed_total",
                "Expired sessions ended the moment a session cap was reached, ahead of the sweep.",
            ),
            server_session: histogram(
                registry,
                "mcp_server_session_duration_seconds",
                "mcp.server.session.duration: how long a client's MCP session with the router lasted, measured where it ended (ended by the client or expired).",
                &["mcp_protocol_version", "network_transport", "network_protocol_name"],
            ),
            client_session: histogram(
                registry,
                "mcp_client_session_duration_seconds",
                "mcp.client.session.duration: how long an upstream session the router opened lasted, when it ends on the replica that opened it.",
                &["server_address", "server_port", "network_transport"],
            ),
        }
    }

    /// A client's session ended after `lasted`.
    pub(crate) fn session_ended(&self, version: &str, lasted: std::time::Duration) {
        self.server_session.with_label_values(&[version, "tcp", "http"]).observe(lasted.as_secs_f64());
    }

    /// An upstream session (at `address`, none for stdio) ended after `lasted`.
    pub(crate) fn upstream_session_ended(&self, address: Option<(&str, u16)>, lasted: std::time::Duration) {
        let port = address.map(|(_, p)| p.to_string()).unwrap_or_default();
        let (host, transport) = match address {
            Some((host, _)) => (host, "tcp"),
            None => ("", "pipe"),
        };
        self.client_session.with_label_values(&[host, &port, transport]).observe(lasted.as_secs_f64());
    }

    pub(crate) fn reclaimed(&self, n: usize) {
        self.reclaimed.inc_by(n as u64);
    }

    pub(crate) fn set_sessions(&self, n: usize) {
        self.sessions.set(n as i64);
    }

    pub(crate) fn adopted(&self) {
        self.adopted.inc();
    }

    pub(crate) fn repaired(&self) {
        self.repaired.inc();
    }

    /// A session store operation (`op`) failed.
    pub fn store_error(&self, op: &str) {
        self.store_errors.with_label_values(&[op]).inc();
    }

    pub(crate) fn claim_lost(&self) {
        self.claims_lost.inc();
    }

    pub(crate) fn store_lost(&self) {
        self.store_lost.inc();
    }

    #[cfg(test)]
    pub(crate) fn store_lost_count(&self) -> u64 {
        self.store_lost.get()
    }

    pub(crate) fn waited_for_repair(&self, found: bool) {
        self.waited_for_repair.with_label_values(&[if found { "found" } else { "not_found" }]).inc();
    }

    /// A request stream taken over from a replica that stopped ended:
    /// `resumed` or `failed`.
    pub fn taken_over(&self, result: &str) {
        self.taken_over.with_label_values(&[result]).inc();
    }

    pub(crate) fn stream_event_dropped(&self) {
        self.stream_events_dropped.inc();
    }
}
