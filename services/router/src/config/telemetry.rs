//! `[telemetry]`: traces, and the MCP metrics, exported over OTLP.

use std::time::Duration;

use serde::Deserialize;
use switchboard_telemetry::export::{Protocol, Settings};

use super::RawDuration;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub otlp_protocol: Option<String>,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
    pub queue: Option<u64>,
    pub batch: Option<u64>,
    pub export_timeout: Option<RawDuration>,
    pub flush_every: Option<RawDuration>,
    pub metrics_interval: Option<RawDuration>,
}

/// `[telemetry]` validated.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// Where spans go; `None`: no traces.
    pub export: Option<Settings>,
    /// Requests without a sampled parent traced, out of 1.
    pub sample_ratio: f64,
    /// How often the MCP metrics are sent to the collector; `None`: never
    /// (no collector, or `metrics_interval = "0s"`).
    pub metrics_interval: Option<Duration>,
}

pub fn validate(raw: RawTelemetry, bad: &mut impl FnMut(String, String)) -> TelemetryConfig {
    let sample_ratio = match raw.sample_ratio {
        None => 0.01,
        Some(r) if (0.0..=1.0).contains(&r) => r,
        Some(r) => {
            bad("telemetry.sample_ratio".into(), format!("{r} is not between 0 and 1"));
            0.01
        }
    };
    let protocol = match raw.otlp_protocol.as_deref() {
        None | Some("http/protobuf") => Protocol::HttpProtobuf,
        Some("grpc") => Protocol::Grpc,
        Some(other) => {
            bad("telemetry.otlp_protocol".into(), format!("{other:?} is not \"http/protobuf\" or \"grpc\""));
            Protocol::HttpProtobuf
        }
    };
    let timeout = match raw.export_timeout.as_ref().map(RawDuration::parse) {
        None => Duration::from_secs(10),
        Some(Ok(d)) if !d.is_zero() => d,
        Some(Ok(_)) => {
            bad("telemetry.export_timeout".into(), "must be greater than zero".into());
            Duration::from_secs(10)
        }
        Some(Err(e)) => {
            bad("telemetry.export_timeout".into(), e);
            Duration::from_secs(10)
        }
    };
    let count = |value: Option<u64>, default: u64, key: &str, bad: &mut dyn FnMut(String, String)| match value {
        None => default as usize,
        Some(n) if (1..=1_000_000).contains(&n) => n as usize,
        Some(n) => {
            bad(format!("telemetry.{key}"), format!("{n} is not between 1 and 1000000"));
            default as usize
        }
    };
    let flush_every = match raw.flush_every.as_ref().map(RawDuration::parse) {
        None => Duration::from_secs(1),
        Some(Ok(d)) if d <= Duration::from_secs(60) => d,
        Some(Ok(_)) => {
            bad("telemetry.flush_every".into(), "at most 60s".into());
            Duration::from_secs(1)
        }
        Some(Err(e)) => {
            bad("telemetry.flush_every".into(), e);
            Duration::from_secs(1)
        }
    };
    let queue = count(raw.queue, 2048, "queue", bad);
    let batch = count(raw.batch, 512, "batch", bad);
    let export = match raw.otlp_endpoint.filter(|e| !e.trim().is_empty()) {
        None => None,
        Some(endpoint) => {
            let plain = endpoint.starts_with("http://");
            if !plain && !endpoint.starts_with("https://") {
                bad("telemetry.otlp_endpoint".into(), format!("{endpoint:?} is not an http(s) URL"));
            } else if !plain && protocol == Protocol::HttpProtobuf {
                bad(
                    "telemetry.otlp_endpoint".into(),
                    "an https collector is reached over gRPC: set otlp_protocol = \"grpc\" (OTLP/HTTP is sent in the clear, to a local collector)".into(),
                );
            }
            Some(Settings {
                endpoint,
                protocol,
                service_name: raw.service_name.unwrap_or_else(|| "switchboard".into()),
                queue,
                batch,
                timeout,
                flush_every,
            })
        }
    };
    let metrics_interval = match raw.metrics_interval.as_ref().map(RawDuration::parse) {
        None => Some(Duration::from_secs(60)),
        Some(Ok(d)) if d.is_zero() => None,
        Some(Ok(d)) if d >= Duration::from_secs(1) => Some(d),
        Some(Ok(_)) => {
            bad("telemetry.metrics_interval".into(), "at least 1s (or 0s: never)".into());
            None
        }
        Some(Err(e)) => {
            bad("telemetry.metrics_interval".into(), e);
            None
        }
    }
    .filter(|_| export.is_some());
    TelemetryConfig { export, sample_ratio, metrics_interval }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flush_every(value: Option<RawDuration>) -> (Option<Duration>, Vec<String>) {
        let raw = RawTelemetry {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            flush_every: value,
            ..RawTelemetry::default()
        };
        let mut errors = Vec::new();
        let config = validate(raw, &mut |key, why| errors.push(format!("{key}: {why}")));
        (config.export.map(|e| e.flush_every), errors)
    }

    #[test]
    fn spans_are_gathered_for_flush_every() {
        assert_eq!(flush_every(None), (Some(Duration::from_secs(1)), vec![]));
        assert_eq!(flush_every(Some(RawDuration::Text("250ms".into()))), (Some(Duration::from_millis(250)), vec![]));
        assert_eq!(flush_every(Some(RawDuration::Seconds(0))), (Some(Duration::ZERO), vec![]));
        let (_, errors) = flush_every(Some(RawDuration::Seconds(61)));
        assert_eq!(errors, ["telemetry.flush_every: at most 60s"]);
        let (_, errors) = flush_every(Some(RawDuration::Text("soon".into())));
        assert!(errors.len() == 1 && errors[0].starts_with("telemetry.flush_every: "), "{errors:?}");
    }
}
