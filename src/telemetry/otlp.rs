//! Trace export over OTLP/HTTP with the JSON encoding, without the
//! opentelemetry crates: a `tracing_subscriber` layer and one export thread.
//!
//! ```text
//!  request threads                          export thread ("latchkey-otlp")
//!  span opens:  ids, start, fields
//!  span closes: FinishedSpan --try_send--> bounded channel --> batch (512 or 1 s)
//!               (full: dropped, counted)                  --> POST {endpoint}/v1/traces
//! ```
//!
//! The layer gives each span a span id and the trace id of its parent; a
//! root span gets a new trace id, or the one of a valid W3C `traceparent`
//! recorded as its `traceparent` field (the request span does that), which
//! then also names its parent. A request never waits for the exporter: a
//! full channel drops the span (`latchkey_otlp_dropped_spans_total{reason=
//! "queue_full"}`), a failed export drops its batch (`reason="export_failed"`)
//! and is logged at most once a minute. Only this crate's spans at `debug`
//! and above are exported, never events, so the spans' fields are all it
//! sends: operation names, ids and timings, never a secret.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

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

/// The layer that exports spans to `traces_url` (see [`traces_url`]), with
/// its filter, and the export thread it feeds.
pub fn layer<S>(traces_url: &str) -> std::io::Result<Filtered<OtlpLayer, FilterFn, S>>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let uri: Uri = traces_url
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?;
    let (tx, rx) = mpsc::channel(QUEUE);
    std::thread::Builder::new()
        .name("latchkey-otlp".into())
        .spawn(
            move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(export_loop(rx, uri)),
                Err(e) => {
                    tracing::error!(error = %e, "OTLP export thread cannot start; traces are not exported")
                }
            },
        )?;
    let _ = EXPORTER.set(tx.clone());
    let filter = FilterFn::new(exported as fn(&Metadata<'_>) -> bool).with_max_level_hint(Level::DEBUG);
    Ok(OtlpLayer {
        tx,
        ids: IdSource::new(),
    }
    .with_filter(filter))
}

/// This crate's spans at `debug` and above; no events.
fn exported(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("latchkey") && *meta.level() <= Level::DEBUG
}

static EXPORTER: std::sync::OnceLock<mpsc::Sender<Message>> = std::sync::OnceLock::new();

/// Sends what is queued now and waits (at most `within`) for it to be sent:
/// at shutdown, so that the last requests' spans are not lost.
pub fn flush(within: Duration) {
    let Some(tx) = EXPORTER.get() else {
        return;
    };
    let (ack_tx, ack_rx) = std::sync::mpsc::sync_channel(1);
    if tx.try_send(Message::Flush(ack_tx)).is_ok() {
        let _ = ack_rx.recv_timeout(within);
    }
}

/// A W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`): the trace id
/// and the caller's span id, or `None` if it is not a valid one.
pub fn parse_traceparent(s: &str) -> Option<(u128, u64)> {
    let b = s.as_bytes();
    if !s.is_ascii() || b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let version = hex_value(&s[0..2])?;
    // Version 00 is exactly 55 characters; later ones may append fields.
    if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
        return None;
    }
    let trace_id = hex_value(&s[3..35])?;
    let parent_id = u64::try_from(hex_value(&s[36..52])?).ok()?;
    hex_value(&s[53..55])?;
    (trace_id != 0 && parent_id != 0).then_some((trace_id, parent_id))
}

/// Lowercase hex (as W3C Trace Context requires), up to 32 digits.
fn hex_value(s: &str) -> Option<u128> {
    if s.is_empty()
        || s.len() > 32
        || !s
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// Span and trace ids: unique and unpredictable enough for tracing (not
/// for security), without a system call per span: SplitMix64 over a random
/// per-process seed and a counter.
struct IdSource {
    seed: u64,
    counter: AtomicU64,
}

impl IdSource {
    fn new() -> Self {
        IdSource {
            seed: u64::from_le_bytes(crate::crypto::random_bytes::<8>()),
            counter: AtomicU64::new(1),
        }
    }

    fn next(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut z = self.seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).max(1) // 0 means "none" in OTLP
    }

    fn trace_id(&self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Double(f64),
}

/// What the layer keeps in a live span's extensions.
struct SpanData {
    trace_id: u128,
    span_id: u64,
    parent_id: u64,
    start: SystemTime,
    attributes: Vec<(&'static str, Value)>,
}

/// A closed span, on its way to the collector.
#[derive(Debug)]
struct FinishedSpan {
    name: &'static str,
    trace_id: u128,
    span_id: u64,
    parent_id: u64,
    start_ns: u64,
    end_ns: u64,
    attributes: Vec<(&'static str, Value)>,
}

enum Message {
    Span(FinishedSpan),
    Flush(std::sync::mpsc::SyncSender<()>),
}

pub struct OtlpLayer {
    tx: mpsc::Sender<Message>,
    ids: IdSource,
}

/// Collects a span's fields; `traceparent` is kept apart.
struct Fields<'a> {
    attributes: &'a mut Vec<(&'static str, Value)>,
    traceparent: Option<(u128, u64)>,
}

impl Fields<'_> {
    fn set(&mut self, field: &Field, value: Value) {
        let key = field.name();
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.attributes.push((key, value)),
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "traceparent" {
            self.traceparent = parse_traceparent(value);
        } else {
            self.set(field, Value::Str(value.to_string()));
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, Value::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        match i64::try_from(value) {
            Ok(v) => self.set(field, Value::Int(v)),
            Err(_) => self.set(field, Value::Str(value.to_string())),
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, Value::Bool(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, Value::Double(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `Display` values (`%x`) arrive here too; secrets are newtypes
        // whose `Debug` prints `***`.
        self.set(field, Value::Str(format!("{value:?}")));
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut attributes = Vec::with_capacity(attrs.fields().len());
        let mut fields = Fields {
            attributes: &mut attributes,
            traceparent: None,
        };
        attrs.record(&mut fields);
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<SpanData>().map(|d| (d.trace_id, d.span_id)));
        let (trace_id, parent_id) = match (parent, fields.traceparent) {
            (Some(local), _) => local,
            (None, Some(remote)) => remote,
            (None, None) => (self.ids.trace_id(), 0),
        };
        span.extensions_mut().replace(SpanData {
            trace_id,
            span_id: self.ids.next(),
            parent_id,
            start: SystemTime::now(),
            attributes,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut ext = span.extensions_mut();
        if let Some(data) = ext.get_mut::<SpanData>() {
            values.record(&mut Fields {
                attributes: &mut data.attributes,
                traceparent: None,
            });
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(data) = span.extensions_mut().remove::<SpanData>() else {
            return;
        };
        let finished = FinishedSpan {
            name: span.metadata().name(),
            trace_id: data.trace_id,
            span_id: data.span_id,
            parent_id: data.parent_id,
            start_ns: unix_nanos(data.start),
            end_ns: unix_nanos(SystemTime::now()),
            attributes: data.attributes,
        };
        if self.tx.try_send(Message::Span(finished)).is_err() {
            metrics::counter!("latchkey_otlp_dropped_spans_total", "reason" => "queue_full").increment(1);
        }
    }
}

/// Batches finished spans and sends them; ends when every sender is gone.
async fn export_loop(mut rx: mpsc::Receiver<Message>, uri: Uri) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut exporter = Exporter {
        client,
        uri,
        last_warning: None,
        failures: 0,
    };
    tracing::info!(url = %exporter.uri, "exporting traces over OTLP/HTTP");
    let mut batch: Vec<FinishedSpan> = Vec::with_capacity(MAX_BATCH);
    let mut deadline = tokio::time::Instant::now();
    loop {
        let message = if batch.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    exporter.send(&mut batch).await;
                    continue;
                }
            }
        };
        match message {
            Some(Message::Span(s)) => {
                if batch.is_empty() {
                    deadline = tokio::time::Instant::now() + FLUSH_INTERVAL;
                }
                batch.push(s);
                if batch.len() >= MAX_BATCH {
                    exporter.send(&mut batch).await;
                }
            }
            Some(Message::Flush(ack)) => {
                exporter.send(&mut batch).await;
                let _ = ack.send(());
            }
            None => {
                exporter.send(&mut batch).await;
                return;
            }
        }
    }
}

struct Exporter {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    uri: Uri,
    last_warning: Option<Instant>,
    failures: u64,
}

impl Exporter {
    /// Sends `batch` (and empties it). A failure drops the batch: spans are
    /// diagnostics, not worth memory or retries while a collector is down.
    async fn send(&mut self, batch: &mut Vec<FinishedSpan>) {
        if batch.is_empty() {
            return;
        }
        let result = match serde_json::to_vec(&ExportRequest(batch)) {
            Ok(body) => self.post(body).await,
            Err(e) => Err(format!("encoding: {e}")),
        };
        if let Err(why) = result {
            metrics::counter!("latchkey_otlp_dropped_spans_total", "reason" => "export_failed")
                .increment(batch.len() as u64);
            self.failures += 1;
            if self.last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                tracing::warn!(
                    url = %self.uri,
                    error = %why,
                    failed_exports = self.failures,
                    "OTLP trace export failed; spans dropped (logged at most once a minute)"
                );
                self.last_warning = Some(Instant::now());
                self.failures = 0;
            }
        }
        batch.clear();
    }

    async fn post(&self, body: Vec<u8>) -> Result<(), String> {
        let req = hyper::Request::post(self.uri.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            // Read the answer to the end, so that the connection is reused.
            let _ = resp.into_body().collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(format!("the collector answered {status}"))
            }
        };
        tokio::time::timeout(EXPORT_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }
}

// ---- The OTLP JSON encoding of ExportTraceServiceRequest
// (opentelemetry-proto, collector/trace/v1): lowerCamelCase field names,
// trace and span ids as hex, 64-bit integers as decimal strings, enums as
// numbers.

struct ExportRequest<'a>(&'a [FinishedSpan]);

impl Serialize for ExportRequest<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("resourceSpans", &[ResourceSpans(self.0)])?;
        m.end()
    }
}

struct ResourceSpans<'a>(&'a [FinishedSpan]);

impl Serialize for ResourceSpans<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let service = Value::Str("latchkey".into());
        let resource = Resource {
            attributes: [Attribute("service.name", &service)],
        };
        let scope_spans = [ScopeSpans {
            scope: Scope {
                name: "latchkey",
                version: env!("CARGO_PKG_VERSION"),
            },
            spans: self.0,
        }];
        let mut st = s.serialize_struct("ResourceSpans", 2)?;
        st.serialize_field("resource", &resource)?;
        st.serialize_field("scopeSpans", &scope_spans)?;
        st.end()
    }
}

#[derive(Serialize)]
struct Resource<'a> {
    attributes: [Attribute<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ScopeSpans<'a> {
    scope: Scope,
    spans: &'a [FinishedSpan],
}

#[derive(Serialize)]
struct Scope {
    name: &'static str,
    version: &'static str,
}

/// `SpanKind`: what the span's name says it is.
fn kind(name: &str) -> u8 {
    match name {
        "request" => 2,      // SPAN_KIND_SERVER
        "db" | "redis" => 3, // SPAN_KIND_CLIENT
        _ => 1,              // SPAN_KIND_INTERNAL
    }
}

impl Serialize for FinishedSpan {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let attributes: Vec<Attribute<'_>> = self.attributes.iter().map(|(k, v)| Attribute(k, v)).collect();
        // A request answered 5xx is an error (STATUS_CODE_ERROR).
        let failed = self.name == "request"
            && self
                .attributes
                .iter()
                .any(|(k, v)| *k == "status" && matches!(v, Value::Int(code) if *code >= 500));
        let mut st = s.serialize_struct("Span", 10)?;
        st.serialize_field("traceId", &format!("{:032x}", self.trace_id))?;
        st.serialize_field("spanId", &format!("{:016x}", self.span_id))?;
        if self.parent_id != 0 {
            st.serialize_field("parentSpanId", &format!("{:016x}", self.parent_id))?;
        }
        st.serialize_field("name", self.name)?;
        st.serialize_field("kind", &kind(self.name))?;
        st.serialize_field("startTimeUnixNano", &self.start_ns.to_string())?;
        st.serialize_field("endTimeUnixNano", &self.end_ns.max(self.start_ns).to_string())?;
        st.serialize_field("attributes", &attributes)?;
        if failed {
            st.serialize_field("status", &Status { code: 2 })?;
        }
        st.end()
    }
}

#[derive(Serialize)]
struct Status {
    code: u8,
}

/// `KeyValue` with an `AnyValue`.
struct Attribute<'a>(&'a str, &'a Value);

impl Serialize for Attribute<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("KeyValue", 2)?;
        st.serialize_field("key", self.0)?;
        st.serialize_field("value", &AnyValue(self.1))?;
        st.end()
    }
}

struct AnyValue<'a>(&'a Value);

impl Serialize for AnyValue<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        match self.0 {
            Value::Str(v) => m.serialize_entry("stringValue", v)?,
            Value::Int(v) => m.serialize_entry("intValue", &v.to_string())?,
            Value::Bool(v) => m.serialize_entry("boolValue", v)?,
            // JSON has no NaN or infinity: those go as text.
            Value::Double(v) if v.is_finite() => m.serialize_entry("doubleValue", v)?,
            Value::Double(v) => m.serialize_entry("stringValue", &v.to_string())?,
        }
        m.end()
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
    fn traceparent_parsing() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(tp),
            Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7))
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-x00f067aa0ba902b7-01",
            "00+4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        // A later version may append fields.
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz").is_some());
    }

    #[test]
    fn ids_are_distinct_and_never_zero() {
        let ids = IdSource::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = ids.next();
            assert_ne!(id, 0);
            assert!(seen.insert(id));
        }
        assert_ne!(ids.trace_id(), ids.trace_id());
    }

    #[test]
    fn encodes_the_otlp_json_shape() {
        let spans = [FinishedSpan {
            name: "request",
            trace_id: 0xab,
            span_id: 0xcd,
            parent_id: 0,
            start_ns: 1_700_000_000_000_000_000,
            end_ns: 1_700_000_000_000_000_500,
            attributes: vec![
                ("path", Value::Str("/auth/login".into())),
                ("status", Value::Int(503)),
                ("ok", Value::Bool(false)),
                ("ratio", Value::Double(f64::NAN)),
            ],
        }];
        let v: serde_json::Value = serde_json::to_value(ExportRequest(&spans)).unwrap();
        let rs = &v["resourceSpans"][0];
        assert_eq!(rs["resource"]["attributes"][0]["key"], "service.name");
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "latchkey"
        );
        let span = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "000000000000000000000000000000ab");
        assert_eq!(span["spanId"], "00000000000000cd");
        assert!(span.get("parentSpanId").is_none());
        assert_eq!(span["kind"], 2);
        assert_eq!(span["startTimeUnixNano"], "1700000000000000000");
        assert_eq!(span["endTimeUnixNano"], "1700000000000000500");
        assert_eq!(span["attributes"][1]["value"]["intValue"], "503");
        assert_eq!(span["attributes"][2]["value"]["boolValue"], false);
        assert_eq!(span["attributes"][3]["value"]["stringValue"], "NaN");
        assert_eq!(span["status"]["code"], 2);
    }
}
