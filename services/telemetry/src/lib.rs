//! Telemetry of the router: traces after the OpenTelemetry MCP semantic
//! conventions, exported over OTLP, and the conventions' MCP metrics.
//!
//! A request's trace is decided once, at its start ([`Telemetry::begin`]):
//! its parent is the caller's (`params._meta.traceparent`, else the
//! `traceparent` header), sampled as the parent says, else at the
//! configured ratio. Its spans are built when the request finishes, with
//! the ids chosen at the start (so that what the router sends upstream
//! names its span as the parent before that span exists): nothing is
//! allocated for a request that is not sampled.

pub mod context;
pub mod export;
pub mod mcp;
pub mod otlp_metrics;

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    SamplingDecision, SamplingResult, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState,
    Tracer as _,
};
pub use opentelemetry::KeyValue;
use prometheus::Registry;

pub use self::context::{SpanId, TraceId};
use self::export::{Exporting, Settings};

/// Traces (when configured) and the MCP metrics.
pub struct Telemetry {
    exporting: Option<Exporting>,
    /// Requests without a sampled parent traced, out of 1.
    ratio: f64,
    pub mcp: mcp::McpMetrics,
}

/// A request's place in its trace.
#[derive(Debug, Clone)]
pub struct Trace {
    pub trace: TraceId,
    /// The router's span for the request (when not sampled: the caller's,
    /// passed on unchanged).
    pub span: SpanId,
    /// The caller's span, if it sent one.
    pub parent: Option<SpanId>,
    pub sampled: bool,
}

impl Trace {
    /// The `traceparent` that names `span` of this trace.
    pub fn traceparent(&self, span: &SpanId) -> String {
        context::traceparent(&self.trace, span, self.sampled)
    }

    pub fn trace_id_hex(&self) -> String {
        context::hex(&self.trace)
    }
}

/// A span, once its operation has finished.
pub struct Finished<'a> {
    pub name: Cow<'a, str>,
    pub server: bool,
    pub trace: &'a Trace,
    pub span: SpanId,
    /// Its parent: the caller's span for a SERVER span, the router's
    /// SERVER span for a CLIENT one.
    pub parent: Option<SpanId>,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    /// The error's description, when it failed.
    pub error: Option<String>,
}

impl Telemetry {
    /// Metrics only: no traces.
    pub fn metrics_only(registry: &Registry) -> Telemetry {
        Telemetry { exporting: None, ratio: 0.0, mcp: mcp::McpMetrics::new(registry) }
    }

    /// Traces exported as `settings` say, `ratio` of the requests without
    /// a sampled parent traced (inside a Tokio runtime).
    pub fn exporting(settings: &Settings, ratio: f64, registry: &Registry) -> Result<Telemetry, String> {
        let exporting = export::start(settings, registry)?;
        Ok(Telemetry { exporting: Some(exporting), ratio, mcp: mcp::McpMetrics::new(registry) })
    }

    /// Whether traces are on.
    pub fn tracing(&self) -> bool {
        self.exporting.is_some()
    }

    /// The trace of a request that came with these `traceparent`s (in
    /// `params._meta`, in the header): `None` when traces are off, or when
    /// it is not sampled and has no parent to pass on.
    pub fn begin(&self, meta: Option<&str>, header: Option<&str>) -> Option<Trace> {
        self.exporting.as_ref()?;
        let parent = meta.and_then(context::parse_traceparent).or_else(|| header.and_then(context::parse_traceparent));
        match parent {
            Some(p) if p.sampled => {
                Some(Trace { trace: p.trace, span: context::new_span_id(), parent: Some(p.span), sampled: true })
            }
            // Not sampled by the caller: passed on as it came.
            Some(p) => Some(Trace { trace: p.trace, span: p.span, parent: Some(p.span), sampled: false }),
            None if context::sample(self.ratio) => Some(Trace {
                trace: context::new_trace_id(),
                span: context::new_span_id(),
                parent: None,
                sampled: true,
            }),
            None => None,
        }
    }

    /// Sends the spans gathered and queued, and stops exporting them (at
    /// shutdown, after the last request); waits at most `grace`.
    pub async fn close(&self, grace: std::time::Duration) {
        if let Some(exporting) = &self.exporting {
            exporting.close(grace).await;
        }
    }

    /// Counts spans dropped before they finished (a bound was hit).
    pub fn dropped(&self, n: u64) {
        if let Some(exporting) = &self.exporting {
            exporting.spans.with_label_values(&["dropped"]).inc_by(n);
        }
    }

    /// Sends a finished span (sampled traces only).
    pub fn emit(&self, span: Finished<'_>) {
        let Some(exporting) = &self.exporting else { return };
        if !span.trace.sampled {
            return;
        }
        let trace_id = opentelemetry::trace::TraceId::from_bytes(span.trace.trace);
        let parent_cx = match span.parent {
            Some(parent) => opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                opentelemetry::trace::SpanId::from_bytes(parent),
                TraceFlags::SAMPLED,
                span.server,
                TraceState::NONE,
            )),
            None => opentelemetry::Context::new(),
        };
        let tracer = &exporting.tracer;
        let mut builder = tracer
            .span_builder(span.name.into_owned())
            .with_kind(if span.server { SpanKind::Server } else { SpanKind::Client })
            .with_start_time(span.start)
            .with_attributes(span.attributes);
        builder.trace_id = Some(trace_id);
        builder.span_id = Some(opentelemetry::trace::SpanId::from_bytes(span.span));
        builder.sampling_result = Some(SamplingResult {
            decision: SamplingDecision::RecordAndSample,
            attributes: Vec::new(),
            trace_state: TraceState::NONE,
        });
        if let Some(error) = span.error {
            builder.status = Status::error(error);
        }
        let mut built = builder.start_with_context(tracer, &parent_cx);
        opentelemetry::trace::Span::end_with_timestamp(&mut built, span.end);
    }
}
