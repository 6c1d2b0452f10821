//! Spans out over OTLP (HTTP/protobuf or gRPC) without ever holding up a
//! request: a finished span goes into a bounded queue (a full queue drops
//! it, counted), and one task sends batches to the collector.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor, Tracer};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::sync::{mpsc, Notify};

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies: `POST {endpoint}/v1/traces`.
    HttpProtobuf,
    /// OTLP/gRPC.
    Grpc,
}

/// Where and how to export.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collector's base URL (`http://collector:4318`, or for gRPC
    /// `http://collector:4317`).
    pub endpoint: String,
    pub protocol: Protocol,
    pub service_name: String,
    /// Spans waiting to be sent, at most; beyond, dropped (counted).
    pub queue: usize,
    /// Spans sent together, at most.
    pub batch: usize,
    /// How long one export may take.
    pub timeout: Duration,
    /// How long the first span waiting waits for others before its batch
    /// is sent (sooner when `batch` are waiting); zero: what is queued goes
    /// at once.
    pub flush_every: Duration,
}

/// The tracer, and what keeps its exports going.
pub struct Exporting {
    pub tracer: Tracer,
    provider: SdkTracerProvider,
    /// `switchboard_trace_spans_total`, by outcome.
    pub spans: IntCounterVec,
    stopper: Stopper,
}

impl Exporting {
    /// Sends the spans gathered and queued, and stops exporting (at
    /// shutdown, after the last request finished); waits at most `grace`.
    pub async fn close(&self, grace: Duration) {
        self.stopper.close(grace).await;
    }
}

impl Drop for Exporting {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Starts exporting (inside a Tokio runtime).
pub fn start(settings: &Settings, registry: &Registry) -> Result<Exporting, String> {
    let exporter = match settings.protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", settings.endpoint.trim_end_matches('/')))
            .with_timeout(settings.timeout)
            .build(),
        Protocol::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout);
            let builder = if settings.endpoint.starts_with("https://") {
                builder.with_tls_config(
                    opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots(),
                )
            } else {
                builder
            };
            builder.build()
        }
    }
    .map_err(|e| format!("the OTLP exporter: {e}"))?;
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let spans = IntCounterVec::new(
        Opts::new(
            "switchboard_trace_spans_total",
            "Spans finished, by what became of them: exported, dropped (the export queue was full), failed (the collector did not take them).",
        ),
        &["outcome"],
    )
    .expect("valid metric");
    let _ = registry.register(Box::new(spans.clone()));
    let (processor, stopper) = Bounded::start(exporter, resource.clone(), settings, spans.clone());
    let provider = SdkTracerProvider::builder().with_resource(resource).with_span_processor(processor).build();
    Ok(Exporting { tracer: provider.tracer("switchboard"), provider, spans, stopper })
}

/// The span processor: a bounded queue and one exporting task.
#[derive(Debug)]
struct Bounded {
    queue: mpsc::Sender<SpanData>,
    spans: IntCounterVec,
}

/// Stops the exporting task, which first sends what it holds.
#[derive(Debug)]
struct Stopper {
    stop: Arc<Notify>,
    done: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Bounded {
    fn start<E: SpanExporter + 'static>(
        mut exporter: E,
        resource: Resource,
        settings: &Settings,
        spans: IntCounterVec,
    ) -> (Bounded, Stopper) {
        exporter.set_resource(&resource);
        let (queue, waiting) = mpsc::channel::<SpanData>(settings.queue.max(1));
        let stop = Arc::new(Notify::new());
        let task = Exports {
            exporter,
            waiting,
            batch: settings.batch.max(1),
            timeout: settings.timeout,
            flush_every: settings.flush_every,
            counted: spans.clone(),
            quiet_until: tokio::time::Instant::now(),
        };
        let done = tokio::spawn(task.run(stop.clone()));
        (Bounded { queue, spans }, Stopper { stop, done: Mutex::new(Some(done)) })
    }
}

impl Stopper {
    /// Sends what is gathered and queued, and stops; waits at most `grace`.
    async fn close(&self, grace: Duration) {
        self.stop.notify_one();
        let done = self.done.lock().expect("not poisoned").take();
        if let Some(done) = done {
            if tokio::time::timeout(grace, done).await.is_err() {
                tracing::warn!("spans still being exported after {grace:?}: left unsent");
            }
        }
    }
}

/// The exporting task.
struct Exports<E> {
    exporter: E,
    waiting: mpsc::Receiver<SpanData>,
    batch: usize,
    timeout: Duration,
    flush_every: Duration,
    counted: IntCounterVec,
    quiet_until: tokio::time::Instant,
}

/// How often the task looks whether a batch is full while it gathers one
/// (rather than being woken for every span, often from another thread).
const LOOK_EVERY: Duration = Duration::from_millis(10);

impl<E: SpanExporter> Exports<E> {
    async fn run(mut self, stop: Arc<Notify>) {
        let mut spans = Vec::with_capacity(self.batch);
        let mut stopping = false;
        while !stopping {
            tokio::select! {
                n = self.waiting.recv_many(&mut spans, self.batch) => if n == 0 { return },
                () = stop.notified() => stopping = true,
            }
            // Others gather for up to `flush_every`: at a low sampling ratio
            // spans come one request (two spans) at a time, and an export
            // each (an HTTP request, its protobuf body) cost the router's
            // thread more than all the requests it traced.
            let deadline = tokio::time::Instant::now() + self.flush_every;
            while !stopping && !self.waiting.is_closed() && spans.len() + self.waiting.len() < self.batch {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline.min(now + LOOK_EVERY)) => {}
                    () = stop.notified() => stopping = true,
                }
            }
            if stopping {
                self.waiting.close();
            }
            // Everything queued goes, in batches (when stopping, until the
            // queue is empty).
            loop {
                while spans.len() < self.batch {
                    match self.waiting.try_recv() {
                        Ok(span) => spans.push(span),
                        Err(_) => break,
                    }
                }
                if spans.is_empty() {
                    break;
                }
                self.export(std::mem::take(&mut spans)).await;
                if !stopping {
                    break;
                }
            }
        }
    }

    async fn export(&mut self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.exporter.export(spans)).await {
            Ok(Ok(())) => self.counted.with_label_values(&["exported"]).inc_by(n),
            failed => {
                self.counted.with_label_values(&["failed"]).inc_by(n);
                // One warning a minute at most while the collector is away.
                if tokio::time::Instant::now() >= self.quiet_until {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {timeout:?}"),
                    };
                    tracing::warn!(error = %why, "the OTLP collector did not take spans (dropped; counted in switchboard_trace_spans_total)");
                    self.quiet_until = tokio::time::Instant::now() + Duration::from_secs(60);
                }
            }
        }
    }
}

impl SpanProcessor for Bounded {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            self.spans.with_label_values(&["dropped"]).inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{Span as _, Tracer as _};

    use super::*;

    /// Records the size of each batch it is given.
    #[derive(Debug, Clone, Default)]
    struct Batches(Arc<Mutex<Vec<usize>>>);

    impl SpanExporter for Batches {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().push(batch.len());
            Ok(())
        }
    }

    impl Batches {
        fn seen(&self) -> Vec<usize> {
            self.0.lock().unwrap().clone()
        }
    }

    fn provider(batches: &Batches, batch: usize, flush_every: Duration) -> (SdkTracerProvider, Stopper) {
        let settings = Settings {
            endpoint: "http://127.0.0.1:1".into(),
            protocol: Protocol::HttpProtobuf,
            service_name: "test".into(),
            queue: 100,
            batch,
            timeout: Duration::from_secs(1),
            flush_every,
        };
        let spans = IntCounterVec::new(Opts::new("spans", "spans"), &["outcome"]).unwrap();
        let resource = Resource::builder().with_service_name("test").build();
        let (processor, stopper) = Bounded::start(batches.clone(), resource, &settings, spans);
        (SdkTracerProvider::builder().with_span_processor(processor).build(), stopper)
    }

    fn end_spans(provider: &SdkTracerProvider, n: usize) {
        let tracer = provider.tracer("test");
        for i in 0..n {
            tracer.start(format!("span {i}")).end();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn spans_wait_to_be_sent_together() {
        let batches = Batches::default();
        let (provider, _stopper) = provider(&batches, 512, Duration::from_millis(300));
        end_spans(&provider, 5);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(batches.seen(), Vec::<usize>::new(), "sent before flush_every passed");
        end_spans(&provider, 2);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(batches.seen(), Vec::<usize>::new(), "sent before flush_every passed");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(batches.seen(), vec![7], "one batch, once flush_every passed since the first span");
        // A later span waits flush_every again.
        end_spans(&provider, 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(batches.seen(), vec![7]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(batches.seen(), vec![7, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_the_rest_when_the_tracer_stops() {
        let batches = Batches::default();
        let (provider, _stopper) = provider(&batches, 3, Duration::from_secs(60));
        end_spans(&provider, 7);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(batches.seen(), vec![3, 3], "full batches are not held back");
        // Stopped (the queue closes): what waits is sent, not lost.
        drop(provider);
        tokio::time::sleep(LOOK_EVERY * 2).await;
        assert_eq!(batches.seen(), vec![3, 3, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn closing_sends_what_is_gathered_and_queued() {
        let batches = Batches::default();
        let (provider, stopper) = provider(&batches, 4, Duration::from_secs(60));
        end_spans(&provider, 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(batches.seen(), Vec::<usize>::new());
        // Two gathered; nine more queued while the task looks only every
        // LOOK_EVERY: all go, in batches, before close returns.
        end_spans(&provider, 9);
        stopper.close(Duration::from_secs(1)).await;
        assert_eq!(batches.seen(), vec![4, 4, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_wait_sends_each_as_it_comes() {
        let batches = Batches::default();
        let (provider, _stopper) = provider(&batches, 512, Duration::ZERO);
        end_spans(&provider, 1);
        tokio::time::sleep(Duration::from_millis(1)).await;
        end_spans(&provider, 1);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(batches.seen(), vec![1, 1]);
    }
}
