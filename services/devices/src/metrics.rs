//! Edge devices' metrics: devices, connections, frames, calls, text tasks.

use std::time::Duration;

use switchboard_core::metrics::{
    counter_vec, gauge, gauge_vec, histogram, Histogram, IntCounterVec, IntGauge, IntGaugeVec, Registry,
};
use switchboard_core::Outcome;

/// Edge devices: connections, frames, calls and text tasks.
pub struct Metrics {
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

impl Metrics {
    pub fn new(registry: &Registry) -> Metrics {
        let metrics = Metrics {
            devices: gauge_vec(
                registry,
                "switchboard_edge_devices",
                "Edge devices registered: connected, or disconnected within their reconnect grace period.",
                &["state"],
            ),
            services: gauge(
                registry,
                "switchboard_edge_services",
                "Services registered by edge devices (each one a tool of its tenant).",
            ),
            connections: counter_vec(
                registry,
                "switchboard_edge_connections_total",
                "Edge connections by how registration ended: registered, unauthenticated, invalid, timeout, \
                 closed, full.",
                &["outcome"],
            ),
            frames: counter_vec(
                registry,
                "switchboard_edge_frames_total",
                "Edge frames by direction and type.",
                &["direction", "type"],
            ),
            frame_errors: counter_vec(
                registry,
                "switchboard_edge_frame_errors_total",
                "Input from edge devices that could not be used: garbage, too_large, bad_header, truncated, \
                 unknown_type, bad_json, unknown_message, unknown_call_id.",
                &["reason"],
            ),
            calls: counter_vec(
                registry,
                "switchboard_edge_calls_total",
                "Tool calls answered by edge devices, by outcome.",
                &["outcome"],
            ),
            call_duration: histogram(
                registry,
                "switchboard_edge_call_duration_seconds",
                "Time from a tool call's arrival to the device's answer.",
                &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
            ),
            tasks: counter_vec(
                registry,
                "switchboard_edge_tasks_total",
                "Text tasks from edge devices, by outcome.",
                &["outcome"],
            ),
        };
        metrics.set_devices(0, 0, 0);
        metrics
    }

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
