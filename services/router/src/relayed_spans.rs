//! Server-to-client requests (sampling, elicitation, roots) relayed to a
//! client, as spans: with traces on, a relayed request whose upstream named
//! its trace (`params._meta.traceparent`), or that comes within a traced
//! call, is a CLIENT span of the router (it asks the client), its parent
//! the upstream's span, else the call's span towards the upstream. The
//! client is told of it in the relayed request's `params._meta.traceparent`;
//! the span ends when the client's answer comes back through this replica.
//!
//! Bounded: at most [`MAX_OPEN`] relayed requests await their answer here
//! with a span; beyond, the oldest is dropped unfinished (counted with the
//! spans `dropped`). An answer that reaches another replica ends nothing
//! here: its span is dropped when it ages out ([`MAX_AGE`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use switchboard_protocol::jsonrpc::{Envelope, Target};
use switchboard_telemetry::{context, Finished, KeyValue, SpanId, Telemetry, Trace};

/// Relayed requests awaiting their answer with a span, at most.
pub const MAX_OPEN: usize = 10_000;
/// How long one waits for its answer before it is forgotten.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// A relayed request's span, until its answer.
struct Open {
    trace: Trace,
    parent: Option<SpanId>,
    start: SystemTime,
    started: Instant,
    method: String,
    session: String,
    upstream: String,
    id: String,
}

/// The spans of relayed requests awaiting their answers.
#[derive(Default)]
pub struct RelayedSpans {
    open: Mutex<HashMap<(String, String), Open>>,
}

impl RelayedSpans {
    /// A request of `upstream` relayed to `session`'s client as `relayed`
    /// (its id already the router's, `ours`): when traced, its span is
    /// opened and the message returned with the span in
    /// `params._meta.traceparent`; else the message as it is. `within`:
    /// the trace of the call it comes in, and the call's span towards the
    /// upstream.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &self,
        telemetry: &Telemetry,
        session: &str,
        upstream: &str,
        ours: &str,
        relayed: Bytes,
        within: Option<(&Trace, SpanId)>,
    ) -> Bytes {
        if !telemetry.tracing() {
            return relayed;
        }
        let Ok(env) = Envelope::parse(&relayed) else { return relayed };
        let target = env.params.and_then(|p| Target::parse(p).ok());
        let theirs = target.as_ref().and_then(|t| t.traceparent).and_then(|raw| {
            let text = switchboard_protocol::jsonrpc::as_str(raw)?;
            context::parse_traceparent(&text)
        });
        let (trace, parent) = match (theirs, within) {
            (Some(p), _) => (
                Trace { trace: p.trace, span: context::new_span_id(), parent: Some(p.span), sampled: p.sampled },
                Some(p.span),
            ),
            (None, Some((call, span))) => (
                Trace { trace: call.trace, span: context::new_span_id(), parent: Some(span), sampled: call.sampled },
                Some(span),
            ),
            (None, None) => return relayed,
        };
        if !trace.sampled {
            return relayed;
        }
        let traceparent = trace.traceparent(&trace.span);
        let Some(target) = target else { return relayed };
        let out = switchboard_protocol::jsonrpc::with_traceparent(&relayed, &env, &target, &traceparent)
            .unwrap_or_else(|| relayed.clone());
        let open = Open {
            parent,
            start: SystemTime::now(),
            started: Instant::now(),
            method: env.method_str().to_owned(),
            session: session.to_owned(),
            upstream: upstream.to_owned(),
            id: ours.to_owned(),
            trace,
        };
        let mut spans = self.open.lock().expect("lock");
        if spans.len() >= MAX_OPEN {
            let now = Instant::now();
            spans.retain(|_, o| now.duration_since(o.started) < MAX_AGE);
            if spans.len() >= MAX_OPEN {
                if let Some(oldest) = spans.iter().min_by_key(|(_, o)| o.started).map(|(k, _)| k.clone()) {
                    spans.remove(&oldest);
                    telemetry.dropped(1);
                }
            }
        }
        spans.insert((session.to_owned(), ours.to_owned()), open);
        out
    }

    /// The client answered relayed request `ours` of `session` (with an
    /// error: `error`): its span ends.
    pub fn end(&self, telemetry: &Telemetry, session: &str, ours: &str, error: Option<String>) {
        if !telemetry.tracing() {
            return;
        }
        let Some(open) = self.open.lock().expect("lock").remove(&(session.to_owned(), ours.to_owned())) else {
            return;
        };
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", open.method.clone()),
            KeyValue::new("mcp.session.id", open.session),
            KeyValue::new("jsonrpc.request.id", open.id),
            KeyValue::new("switchboard.upstream", open.upstream),
            KeyValue::new("network.transport", "tcp"),
        ];
        if error.is_some() {
            attributes.push(KeyValue::new("error.type", "_OTHER"));
        }
        telemetry.emit(Finished {
            name: open.method.into(),
            server: false,
            trace: &open.trace,
            span: open.trace.span,
            parent: open.parent,
            start: open.start,
            end: open.start + open.started.elapsed(),
            attributes,
            error,
        });
    }
}
