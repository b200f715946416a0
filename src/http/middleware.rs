//! Around every request: the request id, the deadline, the access log and
//! the HTTP metrics. The route label is the matched route template (copied
//! into the response by `tag_route`), never the raw path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::error::overloaded;
use super::AppState;

#[derive(Clone)]
struct RouteTag(MatchedPath);

/// Inner layer (runs after routing): remembers which route matched.
pub async fn tag_route(req: Request, next: Next) -> Response {
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let mut resp = next.run(req).await;
    if let Some(m) = matched {
        resp.extensions_mut().insert(RouteTag(m));
    }
    resp
}

fn sane_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}

fn status_class(s: u16) -> &'static str {
    match s {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// A request id unique across processes without a syscall per request: a
/// random per-process prefix and a counter.
fn new_request_id() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| u64::from_le_bytes(crate::crypto::random_bytes::<8>()));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; 32];
    let hex = b"0123456789abcdef";
    for (i, b) in prefix
        .to_be_bytes()
        .iter()
        .chain(n.to_be_bytes().iter())
        .enumerate()
    {
        buf[2 * i] = hex[(b >> 4) as usize];
        buf[2 * i + 1] = hex[(b & 15) as usize];
    }
    HeaderValue::from_bytes(&buf).expect("hex is a valid header")
}

type Handles = (Counter, Histogram);
/// (method, status class) -> handles, per route template.
type ByRoute = HashMap<String, HashMap<(&'static str, &'static str), Handles>>;

/// Metric handles per (route, method, status class), made once: the registry
/// lookup (hashing three labels) is not paid per request.
struct HttpMetrics {
    in_flight: Gauge,
    by_route: RwLock<ByRoute>,
}

impl HttpMetrics {
    fn record(&self, route: &str, method: &'static str, class: &'static str, elapsed: Duration) {
        if let Some(h) = self
            .by_route
            .read()
            .expect("metrics lock")
            .get(route)
            .and_then(|m| m.get(&(method, class)))
        {
            h.0.increment(1);
            h.1.record(elapsed.as_secs_f64());
            return;
        }
        let labels = [
            ("route", route.to_string()),
            ("method", method.to_string()),
            ("status", class.to_string()),
        ];
        let h: Handles = (
            metrics::counter!("latchkey_http_requests_total", &labels),
            metrics::histogram!("latchkey_http_request_duration_seconds", &labels),
        );
        h.0.increment(1);
        h.1.record(elapsed.as_secs_f64());
        self.by_route
            .write()
            .expect("metrics lock")
            .entry(route.to_string())
            .or_default()
            .insert((method, class), h);
    }
}

fn http_metrics() -> &'static HttpMetrics {
    static M: OnceLock<HttpMetrics> = OnceLock::new();
    M.get_or_init(|| HttpMetrics {
        in_flight: metrics::gauge!("latchkey_http_requests_in_flight"),
        by_route: RwLock::new(HashMap::new()),
    })
}

/// Outer layer: request id in and out, deadline, access log, metrics.
pub async fn request_context(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let id = match req.headers().get("x-request-id") {
        Some(v) if sane_request_id(v) => v.clone(),
        _ => new_request_id(),
    };
    let method = method_label(req.method());
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or(""),
        method,
        path = req.uri().path(),
        route = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    // A caller's trace context, if valid: the exported spans join its trace.
    if let Some(tp) = req.headers().get("traceparent").and_then(|v| v.to_str().ok()) {
        crate::telemetry::otlp::continue_trace(&span, tp);
    }
    let in_flight = &http_metrics().in_flight;
    in_flight.increment(1.0);
    let deadline: Duration = st.settings.request_timeout;
    let mut resp = match tokio::time::timeout(deadline, next.run(req).instrument(span.clone())).await {
        Ok(r) => r,
        Err(_) => {
            metrics::counter!("latchkey_http_deadline_exceeded_total").increment(1);
            overloaded(1)
        }
    };
    in_flight.decrement(1.0);
    resp.headers_mut().insert("x-request-id", id);
    let elapsed = start.elapsed();
    let status = resp.status().as_u16();
    let route = resp
        .extensions()
        .get::<RouteTag>()
        .map(|t| t.0.as_str())
        .unwrap_or("unmatched");
    http_metrics().record(route, method, status_class(status), elapsed);
    span.in_scope(|| {
        if status >= 500 {
            tracing::warn!(target: "latchkey::access", status, latency_ms = elapsed.as_secs_f64() * 1000.0, "request");
        } else {
            tracing::info!(target: "latchkey::access", status, latency_ms = elapsed.as_secs_f64() * 1000.0, "request");
        }
    });
    // For exported traces (after the access line, which carries the status).
    span.record("route", route);
    // Integers as i64: OpenTelemetry attributes are signed (a u64 would go as text).
    span.record("status", i64::from(status));
    resp
}
