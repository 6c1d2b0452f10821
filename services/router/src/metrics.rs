//! Prometheus metrics. Names are a public interface: they are listed in
//! `docs/operations.md`, and renaming one breaks dashboards.
//!
//! Per-request counters are resolved once per (method, upstream) pair into a
//! table, so the hot path does an index and two atomic adds, never a label
//! lookup.

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use switchboard_core::UpstreamId;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use switchboard_protocol::Method;

pub use switchboard_core::Outcome;

/// Counters and a latency histogram for one (method, upstream) pair.
pub struct RequestHandles {
    outcomes: [IntCounter; 6],
    duration: Histogram,
}

impl RequestHandles {
    /// Records one finished request.
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        self.outcomes[outcome as usize].inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// Every metric the router exports.
pub struct Metrics {
    registry: Registry,
    upstream_names: Vec<Arc<str>>,
    requests: IntCounterVec,
    duration: HistogramVec,
    table: Vec<OnceLock<RequestHandles>>,
    rejections: IntCounterVec,
    /// Upstream servers: reachability, era, re-initialisations, restarts.
    pub upstreams: Arc<switchboard_upstream::Metrics>,
    /// The merged catalog: fetches, upstreams left out, collisions.
    pub catalog: Arc<switchboard_catalog::Metrics>,
    /// Sessions: how many, adopted, repaired, store failures.
    pub sessions: Arc<switchboard_session::Metrics>,
    guard: Guard,
    /// Edge devices and their connections.
    pub edge: EdgeMetrics,
}

/// Edge devices: connections, frames, calls and text tasks.
pub struct EdgeMetrics {
    devices: IntGaugeVec,
    services: IntGauge,
    connections: IntCounterVec,
    frames: IntCounterVec,
    frame_errors: IntCounterVec,
    calls: IntCounterVec,
    call_duration: Histogram,
    tasks: IntCounterVec,
}

/// The label of a frame type.
fn frame_type(kind: u8) -> &'static str {
    match kind {
        switchboard_protocol::edge::MCP => "mcp",
        switchboard_protocol::edge::TEXT => "text",
        switchboard_protocol::edge::END => "end",
        _ => "unknown",
    }
}

impl EdgeMetrics {
    /// Devices connected, devices in their reconnect grace period, and
    /// services registered.
    pub fn set_devices(&self, connected: usize, disconnected: usize, services: usize) {
        self.devices.with_label_values(&["connected"]).set(connected as i64);
        self.devices.with_label_values(&["grace"]).set(disconnected as i64);
        self.services.set(services as i64);
    }

    /// A connection ended its registration step: `registered`, or why not.
    pub fn connection(&self, outcome: &str) {
        self.connections.with_label_values(&[outcome]).inc();
    }

    pub fn frame_in(&self, kind: u8) {
        self.frames.with_label_values(&["in", frame_type(kind)]).inc();
    }

    pub fn frame_out(&self, kind: u8) {
        self.frames.with_label_values(&["out", frame_type(kind)]).inc();
    }

    /// Something a device sent that could not be used, by reason.
    pub fn frame_error(&self, reason: &str) {
        self.frame_errors.with_label_values(&[reason]).inc();
    }

    /// A tools/call answered by a device.
    pub fn call(&self, outcome: Outcome, elapsed: Duration) {
        self.calls.with_label_values(&[outcome.label()]).inc();
        self.call_duration.observe(elapsed.as_secs_f64());
    }

    /// A text task: `answered`, `no_handler`, `handler_failed`, `too_large`, `bad_text`.
    pub fn task(&self, outcome: &str) {
        self.tasks.with_label_values(&[outcome]).inc();
    }
}

/// Authentication, rate limits, the tenant directory and the audit writer.
struct Guard {
    auth_failures: IntCounterVec,
    rate_limited: IntCounterVec,
    ratelimit_redis_up: IntGauge,
    ratelimit_fallbacks: IntCounter,
    directory_db_up: IntGauge,
    audit_queue: IntGauge,
    audit_spool_bytes: IntGauge,
    audit_records: IntCounterVec,
    audit_write_failures: IntCounter,
}

const METHODS: usize = Method::Other as usize + 1;

impl Metrics {
    /// Registers every metric, for the given upstreams.
    pub fn new(upstream_names: &[Arc<str>]) -> Arc<Self> {
        let registry = Registry::new();
        macro_rules! reg {
            ($metric:expr) => {{
                let m = $metric;
                registry.register(Box::new(m.clone())).expect("metric names are unique");
                m
            }};
        }
        let requests = reg!(IntCounterVec::new(
            Opts::new("switchboard_requests_total", "Requests handled, by JSON-RPC method, upstream and outcome."),
            &["method", "upstream", "outcome"]
        )
        .expect("valid"));
        let duration = reg!(HistogramVec::new(
            HistogramOpts::new(
                "switchboard_request_duration_seconds",
                "Time from receiving a request to having its answer, by method and upstream."
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0
            ]),
            &["method", "upstream"]
        )
        .expect("valid"));
        let rejections = reg!(IntCounterVec::new(
            Opts::new(
                "switchboard_http_rejections_total",
                "HTTP requests refused before reaching the MCP layer, by reason."
            ),
            &["reason"]
        )
        .expect("valid"));
        let guard = Guard {
            auth_failures: reg!(IntCounterVec::new(
                Opts::new(
                    "switchboard_auth_failures_total",
                    "Requests refused for their API key, by reason (missing, invalid, expired, wrong_tenant)."
                ),
                &["reason"]
            )
            .expect("valid")),
            rate_limited: reg!(IntCounterVec::new(
                Opts::new("switchboard_rate_limited_total", "Requests refused by a rate limit, by tenant and limit."),
                &["tenant", "limit"]
            )
            .expect("valid")),
            ratelimit_redis_up: reg!(IntGauge::new(
                "switchboard_ratelimit_redis_up",
                "1 while rate limits are shared through Redis, 0 while this replica falls back to local limits."
            )
            .expect("valid")),
            ratelimit_fallbacks: reg!(IntCounter::new(
                "switchboard_ratelimit_local_fallbacks_total",
                "Rate-limit checks done locally because Redis was unreachable."
            )
            .expect("valid")),
            directory_db_up: reg!(IntGauge::new(
                "switchboard_tenant_directory_db_up",
                "1 if the last refresh of tenants and keys reached the database, else 0."
            )
            .expect("valid")),
            audit_queue: reg!(
                IntGauge::new("switchboard_audit_queue_depth", "Audit records waiting for the writer.").expect("valid")
            ),
            audit_spool_bytes: reg!(IntGauge::new(
                "switchboard_audit_spool_bytes",
                "Bytes of audit records in the spool file waiting for replay."
            )
            .expect("valid")),
            audit_records: reg!(IntCounterVec::new(
                Opts::new(
                    "switchboard_audit_records_total",
                    "Audit records by what happened to them: written, spooled, replayed, overflow (queue full, \
                     spooled by the request), lost."
                ),
                &["event"]
            )
            .expect("valid")),
            audit_write_failures: reg!(IntCounter::new(
                "switchboard_audit_write_failures_total",
                "Failed or timed-out audit writes to the database."
            )
            .expect("valid")),
        };
        let edge = EdgeMetrics {
            devices: reg!(IntGaugeVec::new(
                Opts::new(
                    "switchboard_edge_devices",
                    "Edge devices registered: connected, or disconnected within their reconnect grace period."
                ),
                &["state"]
            )
            .expect("valid")),
            services: reg!(IntGauge::new(
                "switchboard_edge_services",
                "Services registered by edge devices (each one a tool of its tenant)."
            )
            .expect("valid")),
            connections: reg!(IntCounterVec::new(
                Opts::new(
                    "switchboard_edge_connections_total",
                    "Edge connections by how registration ended: registered, unauthenticated, invalid, timeout, \
                     closed, full."
                ),
                &["outcome"]
            )
            .expect("valid")),
            frames: reg!(IntCounterVec::new(
                Opts::new("switchboard_edge_frames_total", "Edge frames by direction and type."),
                &["direction", "type"]
            )
            .expect("valid")),
            frame_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "switchboard_edge_frame_errors_total",
                    "Input from edge devices that could not be used: garbage, too_large, bad_header, truncated, \
                     unknown_type, bad_json, unknown_message, unknown_call_id."
                ),
                &["reason"]
            )
            .expect("valid")),
            calls: reg!(IntCounterVec::new(
                Opts::new("switchboard_edge_calls_total", "Tool calls answered by edge devices, by outcome."),
                &["outcome"]
            )
            .expect("valid")),
            call_duration: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "switchboard_edge_call_duration_seconds",
                    "Time from a tool call's arrival to the device's answer."
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
                ])
            )
            .expect("valid")),
            tasks: reg!(IntCounterVec::new(
                Opts::new("switchboard_edge_tasks_total", "Text tasks from edge devices, by outcome."),
                &["outcome"]
            )
            .expect("valid")),
        };
        for state in ["connected", "grace"] {
            edge.devices.with_label_values(&[state]).set(0);
        }
        let names: Vec<&str> = upstream_names.iter().map(|n| &**n).collect();
        let upstreams = Arc::new(switchboard_upstream::Metrics::new(&registry, &names));
        let catalog = Arc::new(switchboard_catalog::Metrics::new(&registry));
        let sessions = Arc::new(switchboard_session::Metrics::new(&registry));
        let mut table = Vec::new();
        table.resize_with(METHODS * (upstream_names.len() + 1), OnceLock::new);
        Arc::new(Metrics {
            registry,
            upstream_names: upstream_names.to_vec(),
            requests,
            duration,
            table,
            rejections,
            upstreams,
            catalog,
            sessions,
            guard,
            edge,
        })
    }

    /// The handles for requests of `method` to `upstream` (`None`: answered by the router).
    pub fn request(&self, method: Method, upstream: Option<UpstreamId>) -> &RequestHandles {
        let column = upstream.map_or(0, |u| u.index() + 1);
        let slot = method as usize * (self.upstream_names.len() + 1) + column;
        self.table[slot].get_or_init(|| {
            let upstream = upstream.map_or("", |u| &self.upstream_names[u.index()]);
            let label = method.label();
            RequestHandles {
                outcomes: Outcome::ALL.map(|o| self.requests.with_label_values(&[label, upstream, o.label()])),
                duration: self.duration.with_label_values(&[label, upstream]),
            }
        })
    }

    pub fn rejected(&self, reason: &str) {
        self.rejections.with_label_values(&[reason]).inc();
    }

    pub fn auth_failed(&self, reason: &str) {
        self.guard.auth_failures.with_label_values(&[reason]).inc();
    }

    pub fn rate_limited(&self, tenant: &str, limit: &str) {
        self.guard.rate_limited.with_label_values(&[tenant, limit]).inc();
    }

    pub fn set_ratelimit_redis(&self, up: bool) {
        self.guard.ratelimit_redis_up.set(up as i64);
    }

    pub fn ratelimit_fallback(&self) {
        self.guard.ratelimit_fallbacks.inc();
    }

    pub fn set_directory_db(&self, up: bool) {
        self.guard.directory_db_up.set(up as i64);
    }

    pub fn set_audit_queue(&self, depth: usize) {
        self.guard.audit_queue.set(depth as i64);
    }

    pub fn set_audit_spool_bytes(&self, bytes: u64) {
        self.guard.audit_spool_bytes.set(bytes as i64);
    }

    pub fn audit_written(&self, n: usize) {
        self.guard.audit_records.with_label_values(&["written"]).inc_by(n as u64);
    }

    pub fn audit_spooled(&self, n: usize) {
        self.guard.audit_records.with_label_values(&["spooled"]).inc_by(n as u64);
    }

    pub fn audit_replayed(&self, n: usize) {
        self.guard.audit_records.with_label_values(&["replayed"]).inc_by(n as u64);
    }

    pub fn audit_overflow(&self) {
        self.guard.audit_records.with_label_values(&["overflow"]).inc();
    }

    pub fn audit_lost(&self, n: usize) {
        self.guard.audit_records.with_label_values(&["lost"]).inc_by(n as u64);
    }

    pub fn audit_write_failed(&self) {
        self.guard.audit_write_failures.inc();
    }

    /// The exposition text for `/metrics`.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_handles_count_by_label() {
        let m = Metrics::new(&[Arc::from("a"), Arc::from("b")]);
        m.request(Method::ToolsCall, Some(UpstreamId::new(1))).record(Outcome::Ok, Duration::from_millis(2));
        m.request(Method::ToolsCall, Some(UpstreamId::new(1))).record(Outcome::Timeout, Duration::from_millis(2));
        m.request(Method::Ping, None).record(Outcome::Ok, Duration::from_micros(5));
        let text = m.render();
        assert!(
            text.contains(r#"switchboard_requests_total{method="tools/call",outcome="ok",upstream="b"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"switchboard_requests_total{method="tools/call",outcome="timeout",upstream="b"} 1"#));
        assert!(text.contains(r#"switchboard_requests_total{method="ping",outcome="ok",upstream=""} 1"#));
        assert!(text.contains(r#"switchboard_upstream_up{upstream="a"} 0"#));
    }
}
