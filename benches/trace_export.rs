//! What trace export costs a request: the spans of one request (a request
//! span, three database spans, one hashing span, each child entered twice
//! and given fields, as the service records them) under three subscribers:
//!
//! - `logs only`: the log-line layer alone, filtered at `info` (the
//!   service without `LATCHKEY_OTLP_ENDPOINT`);
//! - `latchkey exporter`: the same plus `telemetry::otlp::layer`, the
//!   service's export (the OpenTelemetry crates below, with the service's
//!   span shaping and drop counting around them and the real OTLP/HTTP
//!   exporter, to a closed local port: exports fail fast, off the request
//!   path);
//! - `opentelemetry crates`: the logs plus `tracing-opentelemetry` over the
//!   OpenTelemetry SDK's batch span processor (queue 4,096, batches of 512,
//!   1 s), with the same filter as ours, its optional work off (location,
//!   thread and target attributes, busy/idle times, context activation on
//!   every enter), and an exporter that drops every
//!   batch at once (the network part of OTLP is left out, in the crates'
//!   favour: it runs on the batch thread anyway).
//!
//! Time is taken over chunks of 256 requests (1,280 spans, well under
//! either queue), and the queues are drained between chunks, untimed: the
//! figure is the enqueue path a request pays, never the drop path.
//! `cargo bench --bench trace_export`; docs/observability.md has the figures.

use std::io;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter,
};
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, FilterFn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const CHUNK: u64 = 256;

/// One request's spans, as the service makes them.
fn request(i: u64) {
    let span = tracing::info_span!(target: "latchkey::http", "request",
        request_id = i, method = "POST", path = "/auth/login",
        route = tracing::field::Empty, status = tracing::field::Empty);
    let _enter = span.enter();
    for op in ["user_by_email", "insert_session", "touch_user"] {
        let db =
            tracing::debug_span!(target: "latchkey::store", "db", op, acquire_us = tracing::field::Empty);
        db.in_scope(|| db.record("acquire_us", 3));
        db.in_scope(|| std::hint::black_box(op.len()));
    }
    let hash = tracing::debug_span!(target: "latchkey::domain::hashing", "hash", kind = "verify");
    hash.in_scope(|| std::hint::black_box(i));
    hash.in_scope(|| std::hint::black_box(i + 1));
    span.record("route", "/auth/login");
    span.record("status", 200);
}

/// An exporter that drops every batch at once.
#[derive(Debug)]
struct Discard;

impl SpanExporter for Discard {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        std::hint::black_box(batch.len());
        Ok(())
    }
}

fn exported(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("latchkey") && *meta.level() <= Level::DEBUG
}

fn log_lines<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(io::sink)
        .with_filter(EnvFilter::new("info"))
}

/// Times chunks of requests under `dispatch`, draining with `drain` between them.
fn timed(dispatch: &tracing::Dispatch, drain: &dyn Fn(), iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = CHUNK.min(iters - done);
        let start = Instant::now();
        tracing::dispatcher::with_default(dispatch, || {
            for i in 0..n {
                request(done + i);
            }
        });
        total += start.elapsed();
        done += n;
        drain();
    }
    total
}

fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/v1/traces")
}

fn trace_export(c: &mut Criterion) {
    let mut g = c.benchmark_group("spans of one request");
    g.measurement_time(Duration::from_secs(10));

    let logs = tracing::Dispatch::new(tracing_subscriber::registry().with(log_lines()));
    g.bench_function("logs only", |b| b.iter_custom(|n| timed(&logs, &|| {}, n)));

    let ours = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(log_lines())
            .with(latchkey::telemetry::otlp::layer(&closed_port_url()).unwrap()),
    );
    let drain_ours = latchkey::telemetry::otlp::flush;
    g.bench_function("latchkey exporter", |b| {
        b.iter_custom(|n| timed(&ours, &drain_ours, n))
    });

    // The same batch settings and layer options as `telemetry::otlp::layer`
    // (deliberately repeated: this is the bare-crates reference it is
    // measured against).
    let batch = BatchSpanProcessor::builder(Discard)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(4096)
                .with_max_export_batch_size(512)
                .with_scheduled_delay(Duration::from_secs(1))
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder().with_span_processor(batch).build();
    let tracer = provider.tracer("latchkey");
    let filter = FilterFn::new(exported as fn(&Metadata<'_>) -> bool).with_max_level_hint(Level::DEBUG);
    let crates = tracing::Dispatch::new(
        tracing_subscriber::registry().with(log_lines()).with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                .with_context_activation(false)
                .with_filter(filter),
        ),
    );
    let drain_crates = || {
        let _ = provider.force_flush();
    };
    g.bench_function("opentelemetry crates", |b| {
        b.iter_custom(|n| timed(&crates, &drain_crates, n))
    });
    g.finish();
    let _ = provider.shutdown();
}

criterion_group!(benches, trace_export);
criterion_main!(benches);
