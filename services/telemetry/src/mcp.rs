//! The MCP operation metrics of the OpenTelemetry semantic conventions, on
//! the router's Prometheus registry under their Prometheus names
//! (`mcp.server.operation.duration` → `mcp_server_operation_duration_seconds`).
//! The session ones are the session crate's, where sessions end.
//!
//! Tool and prompt names are labels (`gen_ai_tool_name`,
//! `gen_ai_prompt_name`), at most [`MAX_NAMES`] distinct ones per
//! replica: later ones are counted as `_OTHER`, so that a tenant with a
//! huge catalog cannot grow the registry without bound.

use std::collections::HashSet;
use std::sync::RwLock;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, Registry};

/// The conventions' bucket boundaries (seconds), for all four MCP metrics.
pub const BUCKETS: [f64; 14] = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Distinct tool and prompt names used as labels, at most.
pub const MAX_NAMES: usize = 1000;

pub struct McpMetrics {
    server_operation: HistogramVec,
    client_operation: HistogramVec,
    names: RwLock<HashSet<String>>,
}

/// One operation, as the metrics label it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Operation<'a> {
    pub method: &'a str,
    /// The JSON-RPC error code, or another low-cardinality error class.
    pub error_type: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub prompt: Option<&'a str>,
    pub protocol_version: Option<&'a str>,
    /// `1.1` or `2` (HTTP), for the server side.
    pub network_protocol_version: Option<&'a str>,
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), labels).expect("valid metric");
    let _ = registry.register(Box::new(h.clone()));
    h
}

const OPERATION: &[&str] = &[
    "mcp_method_name",
    "error_type",
    "gen_ai_tool_name",
    "gen_ai_prompt_name",
    "mcp_protocol_version",
    "network_transport",
    "network_protocol_name",
    "network_protocol_version",
];

impl McpMetrics {
    pub fn new(registry: &Registry) -> McpMetrics {
        let mut client = OPERATION.to_vec();
        client.extend(["server_address", "server_port"]);
        McpMetrics {
            server_operation: histogram(
                registry,
                "mcp_server_operation_duration_seconds",
                "mcp.server.operation.duration: MCP request or notification duration as observed on the receiver (the router, for its clients), from the time it was received until the result or ack is sent.",
                OPERATION,
            ),
            client_operation: histogram(
                registry,
                "mcp_client_operation_duration_seconds",
                "mcp.client.operation.duration: the duration of the MCP request as observed on the sender (the router, towards an upstream) from the time it was sent until the response is received.",
                &client,
            ),
            names: RwLock::default(),
        }
    }

    /// `name` as a label value: itself while fewer than [`MAX_NAMES`] are in use.
    fn bounded<'a>(&self, name: Option<&'a str>) -> &'a str {
        let Some(name) = name else { return "" };
        if self.names.read().expect("lock").contains(name) {
            return name;
        }
        let mut names = self.names.write().expect("lock");
        if names.contains(name) {
            return name;
        }
        if names.len() >= MAX_NAMES {
            return "_OTHER";
        }
        names.insert(name.to_owned());
        name
    }

    fn labels<'a>(&self, op: &Operation<'a>, transport: &'a str) -> [&'a str; 8] {
        let http = if transport == "pipe" { "" } else { "http" };
        [
            op.method,
            op.error_type.unwrap_or(""),
            self.bounded(op.tool),
            self.bounded(op.prompt),
            op.protocol_version.unwrap_or(""),
            transport,
            http,
            op.network_protocol_version.unwrap_or(""),
        ]
    }

    /// A client's request to the router, answered.
    pub fn served(&self, op: &Operation<'_>, took: Duration) {
        self.server_operation.with_label_values(&self.labels(op, "tcp")).observe(took.as_secs_f64());
    }

    /// A request the router sent an upstream (at `address`: host and port,
    /// as text; a stdio upstream has none), answered.
    pub fn sent(&self, op: &Operation<'_>, address: Option<(&str, &str)>, took: Duration) {
        let transport = if address.is_some() { "tcp" } else { "pipe" };
        let [a, b, c, d, e, f, g, h] = self.labels(op, transport);
        let (host, port) = address.unwrap_or(("", ""));
        self.client_operation.with_label_values(&[a, b, c, d, e, f, g, h, host, port]).observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_bounded_labels() {
        let registry = Registry::new();
        let m = McpMetrics::new(&registry);
        for i in 0..MAX_NAMES + 5 {
            let tool = format!("t{i}");
            let op = Operation { method: "tools/call", tool: Some(&tool), ..Operation::default() };
            m.served(&op, Duration::from_millis(3));
        }
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
        assert!(text.contains(r#"gen_ai_tool_name="t0""#));
        assert!(text.contains(r#"gen_ai_tool_name="_OTHER""#));
        assert!(!text.contains(&format!(r#"gen_ai_tool_name="t{}""#, MAX_NAMES + 1)));
        assert!(text.contains("mcp_server_operation_duration_seconds_bucket{"));
    }
}
