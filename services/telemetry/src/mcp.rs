//! The MCP operation metrics of the OpenTelemetry semantic conventions, on
//! the router's Prometheus registry under their Prometheus names
//! (`mcp.server.operation.duration` → `mcp_server_operation_duration_seconds`).
//! The session ones are the session crate's, where sessions end.
//!
//! Tool and prompt names are labels (`gen_ai_tool_name`,
//! `gen_ai_prompt_name`), at most [`MAX_NAMES`] distinct ones per
//! replica: later ones are counted as `_OTHER`, so that a tenant with a
//! huge catalog cannot grow the registry without bound.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, HistogramVec, Registry};

/// The conventions' bucket boundaries (seconds), for all four MCP metrics.
pub const BUCKETS: [f64; 14] = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Distinct tool and prompt names used as labels, at most.
pub const MAX_NAMES: usize = 1000;

pub struct McpMetrics {
    server_operation: HistogramVec,
    client_operation: HistogramVec,
    names: RwLock<HashSet<String>>,
    /// Tells this instance's handles from another's in [`HANDLES`].
    instance: u64,
}

/// The histograms of the label sets each thread used last, the most recent
/// near the front: a request's labels are compared with a few short strings
/// rather than hashed (twice per request, with a lock on the names) to find
/// them.
struct Handle {
    instance: u64,
    /// The labels as given (before tool and prompt names are bounded).
    labels: Box<[Box<str>]>,
    histogram: Histogram,
}

thread_local! {
    static HANDLES: RefCell<Vec<Handle>> = const { RefCell::new(Vec::new()) };
}

/// Label sets remembered per thread.
const REMEMBERED: usize = 32;

/// A label set found among the first this many stays where it is.
const KEPT_IN_PLACE: usize = 4;

static INSTANCES: AtomicU64 = AtomicU64::new(0);

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

/// `a == b` for label values, compared here rather than by the C library's
/// `memcmp` (which `==` on strings calls): the values are short (a method,
/// a tool name, a version, a port), and a call per value, nine per
/// observation, cost more than the comparing (under load, those calls were
/// 1.6% of the router's CPU samples, more than any function of its own).
/// A word at a time and the last word overlapping the one before, or two
/// halves of a short value overlapping: no byte at a time (the bytes after
/// the last word, one by one, were most of a label set's comparing).
#[inline]
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |x: &[u8], at: usize| u64::from_ne_bytes(x[at..at + 8].try_into().expect("8 bytes"));
    let half = |x: &[u8], at: usize| u32::from_ne_bytes(x[at..at + 4].try_into().expect("4 bytes"));
    match n {
        8.. => {
            let mut at = 0;
            while at + 8 < n {
                if word(a, at) != word(b, at) {
                    return false;
                }
                at += 8;
            }
            word(a, n - 8) == word(b, n - 8)
        }
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        0 => true,
    }
}

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
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Observes `seconds` on the histogram of `labels` (as given); `find`
    /// makes it when this thread has not used these labels lately.
    fn observe(&self, labels: &[&str], seconds: f64, find: impl FnOnce() -> Histogram) {
        HANDLES.with(|handles| {
            let mut handles = handles.borrow_mut();
            let hit = handles.iter().position(|h| {
                h.instance == self.instance
                    && h.labels.len() == labels.len()
                    && h.labels.iter().zip(labels).all(|(a, b)| same(a, b))
            });
            match hit {
                Some(at) => {
                    handles[at].histogram.observe(seconds);
                    // Moved to the front from further back only: a call
                    // observes two label sets (its own and its upstream's),
                    // which would otherwise trade the first two places on
                    // every observation.
                    if at >= KEPT_IN_PLACE {
                        handles[..=at].rotate_right(1);
                    }
                }
                None => {
                    let histogram = find();
                    histogram.observe(seconds);
                    if handles.len() == REMEMBERED {
                        handles.pop();
                    }
                    let labels = labels.iter().map(|&l| Box::from(l)).collect();
                    handles.insert(0, Handle { instance: self.instance, labels, histogram });
                }
            }
        });
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
        let given = [
            op.method,
            op.error_type.unwrap_or(""),
            op.tool.unwrap_or(""),
            op.prompt.unwrap_or(""),
            op.protocol_version.unwrap_or(""),
            op.network_protocol_version.unwrap_or(""),
        ];
        self.observe(&given, took.as_secs_f64(), || self.server_operation.with_label_values(&self.labels(op, "tcp")));
    }

    /// A request the router sent an upstream (at `address`: host and port,
    /// as text; a stdio upstream has none), answered.
    pub fn sent(&self, op: &Operation<'_>, address: Option<(&str, &str)>, took: Duration) {
        let transport = if address.is_some() { "tcp" } else { "pipe" };
        let (host, port) = address.unwrap_or(("", ""));
        // One more label than the server's: they never share a handle.
        let given = [
            "client",
            op.method,
            op.error_type.unwrap_or(""),
            op.tool.unwrap_or(""),
            op.prompt.unwrap_or(""),
            op.protocol_version.unwrap_or(""),
            op.network_protocol_version.unwrap_or(""),
            host,
            port,
        ];
        self.observe(&given, took.as_secs_f64(), || {
            let [a, b, c, d, e, f, g, h] = self.labels(op, transport);
            self.client_operation.with_label_values(&[a, b, c, d, e, f, g, h, host, port])
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_compare_as_strings_do() {
        // Every length around the 8-byte steps, equal, and different in
        // each place (first, inside a step, in the tail, last) or in length.
        for len in 0..40 {
            let a: String = (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            assert!(same(&a, &a.clone()), "{a:?}");
            for at in 0..len {
                let mut b = a.clone().into_bytes();
                b[at] ^= 1;
                let b = String::from_utf8(b).unwrap();
                assert!(!same(&a, &b), "{a:?} against {b:?}");
            }
            let longer = format!("{a}x");
            assert!(!same(&a, &longer) && !same(&longer, &a));
        }
        assert!(same("", ""));
        assert!(!same("2025-11-25", "2025-06-18"));
    }

    #[test]
    fn every_observation_counts_on_its_labels_however_many_sets_are_in_turn() {
        // More label sets than a thread remembers, taken in turn with a
        // call's two (served, sent): each count lands on its own labels.
        let registry = Registry::new();
        let m = McpMetrics::new(&registry);
        let tools: Vec<String> = (0..REMEMBERED + 8).map(|i| format!("t{i}")).collect();
        for round in 0..3 {
            for (i, tool) in tools.iter().enumerate() {
                let op = Operation { method: "tools/call", tool: Some(tool), ..Operation::default() };
                m.served(&op, Duration::from_millis(1));
                m.sent(&op, Some(("h", "1")), Duration::from_millis(1));
                if i % 3 == round {
                    m.served(&Operation { method: "ping", ..Operation::default() }, Duration::from_millis(1));
                }
            }
        }
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
        let count = |metric: &str, needle: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("{metric}_count")) && l.contains(needle))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum::<f64>()
        };
        for tool in &tools {
            let needle = format!("gen_ai_tool_name=\"{tool}\"");
            assert_eq!(count("mcp_server_operation_duration_seconds", &needle), 3.0, "{tool}");
            assert_eq!(count("mcp_client_operation_duration_seconds", &needle), 3.0, "{tool}");
        }
        let pings = count("mcp_server_operation_duration_seconds", "mcp_method_name=\"ping\"");
        assert_eq!(pings, tools.len() as f64);
    }

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

    #[test]
    fn remembered_handles_count_on_their_own_registry_and_labels() {
        let (one, two) = (Registry::new(), Registry::new());
        let (a, b) = (McpMetrics::new(&one), McpMetrics::new(&two));
        let call = Operation { method: "tools/call", tool: Some("x"), ..Operation::default() };
        let failed = Operation { error_type: Some("-32603"), ..call };
        for _ in 0..3 {
            a.served(&call, Duration::from_millis(1));
        }
        a.served(&failed, Duration::from_millis(1));
        b.served(&call, Duration::from_millis(1));
        a.sent(&call, Some(("h", "1")), Duration::from_millis(1));
        a.sent(&call, Some(("h", "2")), Duration::from_millis(1));
        let count = |r: &Registry, metric: &str, needle: &str| {
            let text = prometheus::TextEncoder::new().encode_to_string(&r.gather()).unwrap();
            text.lines()
                .filter(|l| l.starts_with(&format!("{metric}_count")) && l.contains(needle))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum::<f64>()
        };
        let server = "mcp_server_operation_duration_seconds";
        assert_eq!(count(&one, server, "error_type=\"\""), 3.0);
        assert_eq!(count(&one, server, "error_type=\"-32603\""), 1.0);
        assert_eq!(count(&two, server, ""), 1.0);
        let client = "mcp_client_operation_duration_seconds";
        let ports = (count(&one, client, "server_port=\"1\""), count(&one, client, "server_port=\"2\""));
        assert_eq!(ports, (1.0, 1.0));
        assert_eq!(count(&two, client, ""), 0.0);
    }
}
