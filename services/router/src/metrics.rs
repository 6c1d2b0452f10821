//! The router's metrics: its own (requests by method, upstream and outcome;
//! HTTP rejections) and a handle on each layer's, all in one registry that
//! `/metrics` renders. Names are a public interface: they are listed in
//! `docs/operations.md`, and renaming one breaks dashboards.
//!
//! Per-request counters are resolved once per (method, upstream) pair into a
//! table, so the hot path does an index and two atomic adds, never a label
//! lookup.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::{Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, TextEncoder};
use switchboard_core::metrics::{counter_vec, gauge, histogram_vec, Registry};
use switchboard_core::slots::Slots;
use switchboard_core::UpstreamId;
use switchboard_protocol::Method;

pub use switchboard_core::Outcome;

/// Counters and a latency histogram for one (method, upstream) pair (or
/// one tenant).
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

/// Counters and a latency histogram for one tenant's requests.
pub type TenantHandles = RequestHandles;

/// Tenants with series of their own, at most; the others share `_OTHER`.
pub const MAX_TENANT_SERIES: usize = 1000;

/// Every metric the router exports.
pub struct Metrics {
    registry: Registry,
    tenant_requests: IntCounterVec,
    tenant_duration: HistogramVec,
    /// Tenant names with series of their own.
    tenant_names: std::sync::Mutex<std::collections::HashSet<Arc<str>>>,
    /// Each upstream's name, by id.
    upstream_names: Slots<Arc<str>>,
    requests: IntCounterVec,
    duration: HistogramVec,
    /// The handles of each (upstream, method): column 0 for the router's
    /// own answers, then one per upstream id.
    table: Slots<Box<[OnceLock<RequestHandles>; METHODS]>>,
    rejections: IntCounterVec,
    in_flight: IntGauge,
    /// Upstream servers: reachability, era, re-initialisations, restarts.
    pub upstreams: Arc<switchboard_upstream::Metrics>,
    /// The merged catalog: fetches, upstreams left out, collisions.
    pub catalog: Arc<switchboard_catalog::Metrics>,
    /// Sessions: how many, adopted, repaired, store failures.
    pub sessions: Arc<switchboard_session::Metrics>,
    /// Tenants and keys: refused keys, the database's reachability.
    pub tenancy: Arc<switchboard_tenancy::Metrics>,
    pub oauth: switchboard_oauth::Metrics,
    /// Rate limits: refusals, Redis or local.
    pub limits: Arc<switchboard_limits::Metrics>,
    /// The audit writer: queue, spool, records.
    pub audit: Arc<switchboard_audit::Metrics>,
    /// Edge devices and their connections.
    pub edge: Arc<switchboard_devices::Metrics>,
}

const METHODS: usize = Method::Other as usize + 1;

impl Metrics {
    /// Registers every metric, for the given upstreams.
    pub fn new(upstream_names: &[Arc<str>]) -> Arc<Self> {
        let registry = Registry::new();
        let requests = counter_vec(
            &registry,
            "switchboard_requests_total",
            "Requests handled, by JSON-RPC method, upstream and outcome.",
            &["method", "upstream", "outcome"],
        );
        let duration = histogram_vec(
            &registry,
            "switchboard_request_duration_seconds",
            "Time from receiving a request to having its answer, by method and upstream.",
            &["method", "upstream"],
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0,
            ],
        );
        let rejections = counter_vec(
            &registry,
            "switchboard_http_rejections_total",
            "HTTP requests refused before reaching the MCP layer, by reason.",
            &["reason"],
        );
        let in_flight = gauge(
            &registry,
            "switchboard_requests_in_flight",
            "Requests this replica has sent upstream and not yet finished (streamed answers included).",
        );
        let tenant_requests = counter_vec(
            &registry,
            "switchboard_tenant_requests_total",
            "Requests of each tenant, by outcome (at most 1,000 tenants by name; the others as _OTHER).",
            &["tenant", "outcome"],
        );
        let tenant_duration = histogram_vec(
            &registry,
            "switchboard_tenant_request_duration_seconds",
            "Time from receiving a tenant's request to having its answer (at most 1,000 tenants by name; the others as _OTHER).",
            &["tenant"],
            &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        );
        let names: Vec<&str> = upstream_names.iter().map(|n| &**n).collect();
        let named = Slots::new();
        for (i, name) in upstream_names.iter().enumerate() {
            named.set(i, name.clone());
        }
        Arc::new(Metrics {
            upstreams: Arc::new(switchboard_upstream::Metrics::new(&registry, &names)),
            catalog: Arc::new(switchboard_catalog::Metrics::new(&registry)),
            sessions: Arc::new(switchboard_session::Metrics::new(&registry)),
            tenancy: Arc::new(switchboard_tenancy::Metrics::new(&registry)),
            oauth: switchboard_oauth::Metrics::new(&registry),
            limits: Arc::new(switchboard_limits::Metrics::new(&registry)),
            audit: Arc::new(switchboard_audit::Metrics::new(&registry)),
            edge: Arc::new(switchboard_devices::Metrics::new(&registry)),
            registry,
            tenant_requests,
            tenant_duration,
            tenant_names: Default::default(),
            upstream_names: named,
            requests,
            duration,
            table: Slots::new(),
            rejections,
            in_flight,
        })
    }

    /// The handles for `tenant`'s requests, kept with the tenant.
    pub fn tenant(&self, tenant: &switchboard_core::policy::Tenant) -> Arc<TenantHandles> {
        let meters = tenant.meters.get_or_init(|| {
            let name = {
                let mut names = self.tenant_names.lock().expect("lock");
                if names.contains(&tenant.name) || names.len() < MAX_TENANT_SERIES {
                    names.insert(tenant.name.clone());
                    &*tenant.name
                } else {
                    "_OTHER"
                }
            };
            Arc::new(TenantHandles {
                outcomes: Outcome::ALL.map(|o| self.tenant_requests.with_label_values(&[name, o.label()])),
                duration: self.tenant_duration.with_label_values(&[name]),
            })
        });
        meters.clone().downcast::<TenantHandles>().expect("only the router fills it")
    }

    /// Names upstream `u`, added while the router runs.
    pub fn name_upstream(&self, u: UpstreamId, name: &Arc<str>) {
        self.upstream_names.set(u.index(), name.clone());
        self.upstreams.added(name);
    }

    /// The handles for requests of `method` to `upstream` (`None`: answered by the router).
    pub fn request(&self, method: Method, upstream: Option<UpstreamId>) -> &RequestHandles {
        let column = upstream.map_or(0, |u| u.index() + 1);
        let row = self.table.get_or_init(column, || Box::new(std::array::from_fn(|_| OnceLock::new())));
        row[method as usize].get_or_init(|| {
            let upstream = upstream.and_then(|u| self.upstream_names.get(u.index())).map_or("", |n| &**n);
            let label = method.label();
            RequestHandles {
                outcomes: Outcome::ALL.map(|o| self.requests.with_label_values(&[label, upstream, o.label()])),
                duration: self.duration.with_label_values(&[label, upstream]),
            }
        })
    }

    /// The one registry, for a layer that registers its metrics later
    /// (Redis's health, only when Redis is configured).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// One more (`1`) or one fewer (`-1`) request in flight upstream.
    pub fn in_flight(&self, change: i64) {
        self.in_flight.add(change);
    }

    /// An HTTP request refused before the MCP layer, by reason.
    pub fn rejected(&self, reason: &str) {
        self.rejections.with_label_values(&[reason]).inc();
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
