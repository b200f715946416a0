//! Trace export over OTLP/HTTP with the JSON encoding, through the
//! OpenTelemetry crates: `tracing-opentelemetry` turns this crate's spans
//! into OpenTelemetry spans, the SDK's batch processor queues and batches
//! them on its own thread, and `opentelemetry-otlp` sends them.
//!
//! ```text
//!  request threads                         SDK batch thread
//!  span closes: SpanData --Shape--> queue --> batch (512 or 1 s) --Counted-->
//!               kind, status   (full: dropped, counted)   POST {endpoint}/v1/traces
//!                                                          over Hyper (own runtime)
//! ```
//!
//! Around the crates, this module keeps what the service promised before
//! them: a span's kind follows its name (`request` is a server span, `db`
//! and `redis` client spans) and a request answered 5xx is an error
//! ([`Shape`]); a request never waits for the exporter: a full queue drops
//! the span (`latchkey_otlp_dropped_spans_total{reason="queue_full"}`), a
//! failed export drops its batch (`reason="export_failed"`) and is logged
//! at most once a minute ([`Counted`]). A caller's W3C `traceparent` makes
//! the request span a child of the caller's span ([`continue_trace`]).
//! Only this crate's spans at `debug` and above are exported, never events,
//! so the spans' fields are all it sends: operation names, ids and timings,
//! never a secret. docs/observability.md has what this costs a request,
//! measured against the exporter it replaced.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, Value};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Spans waiting for the export thread; more are dropped.
const QUEUE: usize = 4096;
/// Spans per request to the collector.
const MAX_BATCH: usize = 512;
/// The longest a finished span waits before it is sent.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
const WARN_EVERY: Duration = Duration::from_secs(60);

/// `http://host:port[/base]` -> the traces URL, `.../v1/traces` (kept as
/// is when given already). Only plain HTTP: point it at a local collector.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let u = url::Url::parse(endpoint).map_err(|e| format!("not a URL: {e}"))?;
    match u.scheme() {
        "http" => {}
        "https" => {
            return Err("https is not supported: use http:// to a local OpenTelemetry Collector".into())
        }
        other => return Err(format!("unsupported scheme {other:?}: expected http://host:port")),
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("expected http://host:port".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("credentials in the URL are not supported".into());
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err("expected http://host:port[/path], without a query or fragment".into());
    }
    let base = u.as_str().trim_end_matches('/');
    let full = if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    };
    full.parse::<Uri>()
        .map_err(|e| format!("not a usable URL: {e}"))?;
    Ok(full)
}

/// The provider, once export runs: flushed and shut down at exit.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
/// Whether a request's `traceparent` is worth reading.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The layer that exports this crate's spans to `traces_url` (see
/// [`traces_url`]), with its filter; it starts the SDK's export thread.
pub fn layer<S>(
    traces_url: &str,
) -> std::io::Result<
    Filtered<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>, FilterFn, S>,
>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let queued = Arc::new(AtomicUsize::new(0));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Hyper::new()?)
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(traces_url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| invalid(e.to_string()))?;
    let exporter = Counted {
        inner: exporter,
        queued: queued.clone(),
        url: traces_url.to_string(),
        warnings: Mutex::new(Warnings::default()),
    };
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                // Room for every span `Shape` lets in: the SDK never drops.
                .with_max_queue_size(QUEUE + MAX_BATCH)
                .with_max_export_batch_size(MAX_BATCH)
                .with_scheduled_delay(FLUSH_INTERVAL)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Shape { inner: batch, queued })
        .with_resource(
            Resource::builder_empty()
                .with_service_name("latchkey")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let tracer = provider.tracer("latchkey");
    if PROVIDER.set(provider).is_ok() {
        EXPORTING.store(true, Ordering::Relaxed);
    }
    tracing::info!(url = %traces_url, "exporting traces over OTLP/HTTP");
    let filter = FilterFn::new(exported as fn(&Metadata<'_>) -> bool).with_max_level_hint(Level::DEBUG);
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Only the spans' own fields: no source locations, threads,
        // targets or busy/idle times, and no OpenTelemetry context switched
        // on every enter (nothing in the service reads it).
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(filter))
}

/// This crate's spans at `debug` and above; no events.
fn exported(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("latchkey") && *meta.level() <= Level::DEBUG
}

/// Sends what is queued now and waits for it to be sent.
pub fn flush() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
    }
}

/// At exit: sends what is queued (waiting at most `within`) and stops the
/// export thread, so that the last requests' spans are not lost.
pub fn shutdown(within: Duration) {
    if let Some(p) = PROVIDER.get() {
        let _ = p.shutdown_with_timeout(within);
    }
}

/// Makes `span` (not entered yet) a child of the caller's span named by a
/// W3C `traceparent` header, when that is a valid one and spans are
/// exported; otherwise nothing happens.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Header<'a>(&'a str);
    impl Extractor for Header<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == "traceparent").then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec!["traceparent"]
        }
    }

    if !EXPORTING.load(Ordering::Relaxed) {
        return;
    }
    let cx: Context =
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Header(traceparent));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// `SpanKind`: what the span's name says it is.
fn kind(name: &str) -> SpanKind {
    match name {
        "request" => SpanKind::Server,
        "db" | "redis" => SpanKind::Client,
        _ => SpanKind::Internal,
    }
}

/// Gives each finished span its end time, its kind and, for a request
/// answered 5xx, the error status; admits it to the batch processor only while fewer than
/// [`QUEUE`] spans wait, counting the rest as dropped.
#[derive(Debug)]
struct Shape {
    inner: BatchSpanProcessor,
    /// Spans handed to `inner` and not yet through an export.
    queued: Arc<AtomicUsize>,
}

impl SpanProcessor for Shape {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, mut span: SpanData) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= QUEUE {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            metrics::counter!("latchkey_otlp_dropped_spans_total", "reason" => "queue_full").increment(1);
            return;
        }
        // A span ends when it closes (tracing-opentelemetry takes its last
        // exit): a span entered by another thread after its task moved on
        // (SQLite's worker thread enters the `db` span for its commands)
        // still ends inside its parent, which closes only after its children.
        span.end_time = std::time::SystemTime::now();
        span.span_kind = kind(&span.name);
        if span.name == "request" {
            let failed = span
                .attributes
                .iter()
                .any(|kv| kv.key.as_str() == "status" && matches!(kv.value, Value::I64(code) if code >= 500));
            if failed {
                span.status = Status::error("");
            }
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[derive(Default)]
struct Warnings {
    last: Option<Instant>,
    failures: u64,
}

/// The OTLP exporter, counting what it drops and saying so at most once a
/// minute. A failed batch is not retried: spans are diagnostics, not worth
/// memory or retries while a collector is down.
struct Counted {
    inner: opentelemetry_otlp::SpanExporter,
    queued: Arc<AtomicUsize>,
    url: String,
    warnings: Mutex<Warnings>,
}

impl fmt::Debug for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted").field("url", &self.url).finish()
    }
}

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.queued.fetch_sub(n, Ordering::Relaxed);
        if let Err(e) = &result {
            metrics::counter!("latchkey_otlp_dropped_spans_total", "reason" => "export_failed")
                .increment(n as u64);
            let mut w = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
            w.failures += 1;
            if w.last.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                tracing::warn!(
                    url = %self.url,
                    error = %e,
                    failed_exports = w.failures,
                    "OTLP trace export failed; spans dropped (logged at most once a minute)"
                );
                w.last = Some(Instant::now());
                w.failures = 0;
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter's HTTP client: Hyper on a one-thread runtime of its own,
/// because the SDK's batch thread runs futures without Tokio.
struct Hyper {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Runtime,
}

impl fmt::Debug for Hyper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hyper")
    }
}

impl Hyper {
    fn new() -> std::io::Result<Hyper> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("latchkey-otlp")
            .enable_all()
            .build()?;
        let client = {
            let _in_runtime = runtime.enter();
            Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>()
        };
        Ok(Hyper { client, runtime })
    }
}

#[async_trait::async_trait]
impl HttpClient for Hyper {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = hyper::Request::from_parts(parts, Full::new(body));
        let client = self.client.clone();
        let exchange = async move {
            let response = client.request(request).await?;
            let status = response.status();
            // Read the answer to the end, so that the connection is reused.
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            if !status.is_success() {
                return Err(format!("the collector answered {status}").into());
            }
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let timed = async move {
            tokio::time::timeout(EXPORT_TIMEOUT, exchange)
                .await
                .unwrap_or_else(|_| Err("timed out".into()))
        };
        self.runtime.spawn(timed).await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/otlp/v1/traces").unwrap(),
            "http://c:4318/otlp/v1/traces"
        );
        for bad in [
            "https://c:4318",
            "grpc://c:4317",
            "c:4318",
            "http://u:p@c:4318",
            "http://c:4318/?x=1",
            "",
        ] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn span_kinds_follow_span_names() {
        assert_eq!(kind("request"), SpanKind::Server);
        assert_eq!(kind("db"), SpanKind::Client);
        assert_eq!(kind("redis"), SpanKind::Client);
        assert_eq!(kind("hash"), SpanKind::Internal);
    }
}
