//! The MCP metrics of the conventions, exported over OTLP as well as shown
//! on `/metrics`: every `interval`, the four histograms are read from the
//! router's registry (where requests record them: nothing more is done on
//! a request's path) and sent under their OpenTelemetry names
//! (`mcp.server.operation.duration`, …) and attribute names
//! (`mcp.method.name`, …), cumulative, over OTLP/HTTP (`/v1/metrics`,
//! protobuf) or OTLP/gRPC (`MetricsService/Export`).
//!
//! `switchboard_otlp_metric_exports_total{outcome}` counts the exports that
//! were taken (`exported`) and those that were not (`failed`: logged, and
//! the next export carries the same totals, cumulative).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, AggregationTemporality, Histogram, HistogramDataPoint, Metric, ResourceMetrics, ScopeMetrics,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts, Registry};
use prost::Message;

use crate::export::{Protocol, Settings};

/// The Prometheus name of each exported metric, its OpenTelemetry name,
/// and its description.
const METRICS: &[(&str, &str, &str)] = &[
    (
        "mcp_server_operation_duration_seconds",
        "mcp.server.operation.duration",
        "MCP request or notification duration as observed on the receiver from the time it was received until the result or ack is sent.",
    ),
    (
        "mcp_client_operation_duration_seconds",
        "mcp.client.operation.duration",
        "The duration of the MCP request or notification as observed on the sender from the time it was sent until the response or ack is received.",
    ),
    (
        "mcp_server_session_duration_seconds",
        "mcp.server.session.duration",
        "The duration of the MCP session as observed on the MCP server.",
    ),
    (
        "mcp_client_session_duration_seconds",
        "mcp.client.session.duration",
        "The duration of the MCP session as observed on the MCP client.",
    ),
];

/// A Prometheus label's attribute name (labels are attribute names with
/// dots made underscores; the namespaces with an underscore of their own
/// are named here).
fn attribute_name(label: &str) -> String {
    for (prefix, namespace) in [("gen_ai_", "gen_ai."), ("jsonrpc_", "jsonrpc.")] {
        if let Some(rest) = label.strip_prefix(prefix) {
            return format!("{namespace}{}", rest.replace('_', "."));
        }
    }
    match label {
        "error_type" => "error.type".into(),
        other => other.replace('_', "."),
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.to_owned())) }),
    }
}

fn nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// One Prometheus histogram family as an OTLP cumulative histogram
/// (labels with empty values are attributes not set).
fn histogram(family: &MetricFamily, name: &str, description: &str, start: u64, now: u64) -> Metric {
    let data_points = family
        .get_metric()
        .iter()
        .map(|m| {
            let h = m.get_histogram();
            let attributes = m
                .get_label()
                .iter()
                .filter(|l| !l.value().is_empty())
                .map(|l| {
                    let key = attribute_name(l.name());
                    // Ports are integers in the conventions.
                    match (key.as_str(), l.value().parse::<i64>()) {
                        ("server.port", Ok(port)) => {
                            KeyValue { key, value: Some(AnyValue { value: Some(any_value::Value::IntValue(port)) }) }
                        }
                        _ => text(&key, l.value()),
                    }
                })
                .collect();
            let mut bounds = Vec::new();
            let mut counts = Vec::new();
            let mut below = 0u64;
            for bucket in h.get_bucket() {
                if bucket.upper_bound().is_infinite() {
                    continue;
                }
                bounds.push(bucket.upper_bound());
                counts.push(bucket.cumulative_count().saturating_sub(below));
                below = bucket.cumulative_count();
            }
            counts.push(h.get_sample_count().saturating_sub(below));
            HistogramDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: h.get_sample_count(),
                sum: Some(h.get_sample_sum()),
                bucket_counts: counts,
                explicit_bounds: bounds,
                ..Default::default()
            }
        })
        .collect();
    Metric {
        name: name.to_owned(),
        description: description.to_owned(),
        unit: "s".to_owned(),
        data: Some(metric::Data::Histogram(Histogram {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        })),
        ..Default::default()
    }
}

/// The request carrying the MCP metrics as `registry` holds them now.
pub fn request(registry: &Registry, service_name: &str, start: SystemTime) -> ExportMetricsServiceRequest {
    let (start, now) = (nanos(start), nanos(SystemTime::now()));
    let families = registry.gather();
    let metrics = METRICS
        .iter()
        .filter_map(|(prometheus, name, description)| {
            let family = families.iter().find(|f| f.name() == *prometheus)?;
            Some(histogram(family, name, description, start, now))
        })
        .filter(|m| matches!(&m.data, Some(metric::Data::Histogram(h)) if !h.data_points.is_empty()))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service_name),
                    text("service.version", env!("CARGO_PKG_VERSION")),
                ],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope { name: "switchboard".into(), ..Default::default() }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Sends the MCP metrics every `interval` until the process ends.
pub fn start(settings: &Settings, registry: &Registry, interval: Duration) {
    let exports = IntCounterVec::new(
        Opts::new(
            "switchboard_otlp_metric_exports_total",
            "Exports of the MCP metrics over OTLP, by outcome: exported, failed (the collector did not take them; the next export carries the same cumulative totals).",
        ),
        &["outcome"],
    )
    .expect("valid metric");
    let _ = registry.register(Box::new(exports.clone()));
    for outcome in ["exported", "failed"] {
        exports.with_label_values(&[outcome]);
    }
    let (settings, registry, started) = (settings.clone(), registry.clone(), SystemTime::now());
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.tick().await;
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
        let mut grpc: Option<MetricsServiceClient<tonic::transport::Channel>> = None;
        loop {
            ticks.tick().await;
            let request = request(&registry, &settings.service_name, started);
            if request.resource_metrics[0].scope_metrics[0].metrics.is_empty() {
                continue;
            }
            let sent = match settings.protocol {
                Protocol::HttpProtobuf => send_http(&http, &settings, request).await,
                Protocol::Grpc => send_grpc(&mut grpc, &settings, request).await,
            };
            match sent {
                Ok(()) => exports.with_label_values(&["exported"]).inc(),
                Err(why) => {
                    exports.with_label_values(&["failed"]).inc();
                    tracing::warn!(error = %why, "the OTLP collector did not take the MCP metrics (the next export carries them)");
                }
            }
        }
    });
}

type HttpClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, http_body_util::Full<Bytes>>;

async fn send_http(
    client: &HttpClient,
    settings: &Settings,
    request: ExportMetricsServiceRequest,
) -> Result<(), String> {
    let url = format!("{}/v1/metrics", settings.endpoint.trim_end_matches('/'));
    let req = http::Request::post(&url)
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(http_body_util::Full::new(Bytes::from(request.encode_to_vec())))
        .map_err(|e| format!("{url}: {e}"))?;
    let answer = tokio::time::timeout(settings.timeout, client.request(req))
        .await
        .map_err(|_| format!("{url}: no answer within {:?}", settings.timeout))?
        .map_err(|e| format!("{url}: {e}"))?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(format!("{url}: {}", answer.status()))
    }
}

async fn send_grpc(
    client: &mut Option<MetricsServiceClient<tonic::transport::Channel>>,
    settings: &Settings,
    request: ExportMetricsServiceRequest,
) -> Result<(), String> {
    if client.is_none() {
        let mut endpoint = tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
            .map_err(|e| format!("{}: {e}", settings.endpoint))?
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout);
        if settings.endpoint.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots())
                .map_err(|e| format!("{}: {e}", settings.endpoint))?;
        }
        *client = Some(MetricsServiceClient::new(endpoint.connect_lazy()));
    }
    let grpc = client.as_mut().expect("made above");
    grpc.export(request).await.map(|_| ()).map_err(|status| format!("{}: {status}", settings.endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{HistogramOpts, HistogramVec};

    #[test]
    fn prometheus_histograms_become_cumulative_otlp_histograms_under_the_conventions_names() {
        assert_eq!(attribute_name("mcp_method_name"), "mcp.method.name");
        assert_eq!(attribute_name("gen_ai_tool_name"), "gen_ai.tool.name");
        assert_eq!(attribute_name("network_protocol_version"), "network.protocol.version");
        assert_eq!(attribute_name("error_type"), "error.type");
        let registry = Registry::new();
        let h = HistogramVec::new(
            HistogramOpts::new("mcp_client_operation_duration_seconds", "x").buckets(vec![0.1, 1.0]),
            &["mcp_method_name", "error_type", "server_port"],
        )
        .unwrap();
        registry.register(Box::new(h.clone())).unwrap();
        for seconds in [0.05, 0.5, 0.7, 3.0] {
            h.with_label_values(&["tools/call", "", "8080"]).observe(seconds);
        }
        let started = SystemTime::now() - Duration::from_secs(5);
        let request = request(&registry, "switchboard", started);
        let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(metrics.len(), 1, "only metrics with points");
        assert_eq!((metrics[0].name.as_str(), metrics[0].unit.as_str()), ("mcp.client.operation.duration", "s"));
        let Some(metric::Data::Histogram(histogram)) = &metrics[0].data else { panic!("a histogram") };
        assert_eq!(histogram.aggregation_temporality, AggregationTemporality::Cumulative as i32);
        let point = &histogram.data_points[0];
        assert_eq!(point.count, 4);
        assert_eq!(point.explicit_bounds, [0.1, 1.0]);
        assert_eq!(point.bucket_counts, [1, 2, 1]);
        assert!((point.sum.unwrap() - 4.25).abs() < 1e-9);
        let keys: Vec<&str> = point.attributes.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["mcp.method.name", "server.port"], "an empty label is no attribute");
        assert_eq!(point.attributes[1].value, Some(AnyValue { value: Some(any_value::Value::IntValue(8080)) }));
        assert!(point.start_time_unix_nano < point.time_unix_nano);
    }
}
