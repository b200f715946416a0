//! Around every request: the request id, the deadline, the access log and
//! the HTTP metrics. The route label is the matched route template (copied
//! into the response by [`TagRoute`]), never the raw path.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method};
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::error::overloaded;

/// The matched route template, carried from the inner layer ([`TagRoute`])
/// to the outer one in the response's extensions.
#[derive(Clone)]
struct RouteTag(MatchedPath);

/// Inner layer (a `route_layer`, so it runs after routing): copies the
/// matched route template into the response, where [`RequestContext`] reads
/// it for the metrics' `route` label.
#[derive(Clone, Copy, Default)]
pub struct TagRouteLayer;

impl<S> Layer<S> for TagRouteLayer {
    type Service = TagRoute<S>;
    fn layer(&self, inner: S) -> TagRoute<S> {
        TagRoute { inner }
    }
}

#[derive(Clone)]
pub struct TagRoute<S> {
    inner: S,
}

impl<S> Service<Request> for TagRoute<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Tagged<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let route = req.extensions().get::<MatchedPath>().cloned();
        Tagged {
            inner: self.inner.call(req),
            route,
        }
    }
}

pin_project! {
    /// [`TagRoute`]'s answer: the handler's, with the route attached.
    pub struct Tagged<F> {
        #[pin]
        inner: F,
        route: Option<MatchedPath>,
    }
}

impl<F, E> Future for Tagged<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.inner.poll(cx))?;
        if let Some(m) = this.route.take() {
            resp.extensions_mut().insert(RouteTag(m));
        }
        Poll::Ready(Ok(resp))
    }
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
type ByRoute = HashMap<String, HashMap<(&'static str, &'static str), Handles>, BuildHasherDefault<Fnv>>;

thread_local! {
    /// Metric handles per (route, method, status class), looked up in the
    /// registry (hashing three labels, under its lock) once per worker
    /// thread and label set, not per request; the registry hands every
    /// thread the same counter and histogram.
    static HANDLES: RefCell<ByRoute> = RefCell::default();
}

fn record(route: &str, method: &'static str, class: &'static str, elapsed: Duration) {
    HANDLES.with_borrow_mut(|by_route| {
        if !by_route.contains_key(route) {
            by_route.insert(route.to_string(), HashMap::new());
        }
        let h = by_route
            .get_mut(route)
            .expect("inserted above")
            .entry((method, class))
            .or_insert_with(|| {
                let labels = [
                    ("route", route.to_string()),
                    ("method", method.to_string()),
                    ("status", class.to_string()),
                ];
                (
                    metrics::counter!("latchkey_http_requests_total", &labels),
                    metrics::histogram!("latchkey_http_request_duration_seconds", &labels),
                )
            });
        h.0.increment(1);
        h.1.record(elapsed.as_secs_f64());
    })
}

/// FNV-1a: the thread-local map's keys are short route templates and two
/// static labels, where SipHash's defence against chosen keys buys nothing
/// (the keys are the service's own routes, never the raw path).
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Requests being served, counted in per-thread slots (a request may end on
/// another thread than it started on: only the sum means anything) and
/// summed into `latchkey_http_requests_in_flight` when metrics are read
/// ([`publish_in_flight`]). One shared counter would be written by every
/// core twice per request.
struct InFlightSlots([CachePadded; IN_FLIGHT_SLOTS]);

const IN_FLIGHT_SLOTS: usize = 16;

#[repr(align(128))]
struct CachePadded(AtomicI64);

static IN_FLIGHT: InFlightSlots = InFlightSlots([const { CachePadded(AtomicI64::new(0)) }; IN_FLIGHT_SLOTS]);

fn in_flight_slot() -> &'static AtomicI64 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % IN_FLIGHT_SLOTS;
    }
    &IN_FLIGHT.0[SLOT.with(|s| *s)].0
}

/// Sets `latchkey_http_requests_in_flight` from the per-thread slots: called
/// before the metrics are rendered.
pub fn publish_in_flight() {
    let n: i64 = IN_FLIGHT.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum();
    metrics::gauge!("latchkey_http_requests_in_flight").set(n as f64);
}

/// Outer layer: the request id in and out, the deadline, the span and
/// access log, the HTTP metrics. A plain tower service with its own future
/// (no boxing, no per-request clone of the stack below, no timer unless the
/// handler has to wait): every request pays it, so it stays small.
#[derive(Clone, Copy)]
pub struct RequestContextLayer {
    /// Past it a request is answered `503` and its handler dropped.
    pub deadline: Duration,
}

impl<S> Layer<S> for RequestContextLayer {
    type Service = RequestContext<S>;
    fn layer(&self, inner: S) -> RequestContext<S> {
        RequestContext {
            inner,
            deadline: self.deadline,
        }
    }
}

#[derive(Clone)]
pub struct RequestContext<S> {
    inner: S,
    deadline: Duration,
}

impl<S> Service<Request> for RequestContext<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = InContext<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let start = Instant::now();
        let id = match req.headers().get("x-request-id") {
            Some(v) if sane_request_id(v) => v.clone(),
            _ => new_request_id(),
        };
        let method = method_label(req.method());
        // Disabled (a no-op handle) unless a log filter or the trace
        // exporter wants request spans.
        let span = tracing::info_span!(
            "request",
            request_id = id.to_str().unwrap_or(""),
            method,
            path = req.uri().path(),
            route = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        if !span.is_disabled() {
            // A caller's trace context, if valid: the exported spans join its trace.
            if let Some(tp) = req.headers().get("traceparent").and_then(|v| v.to_str().ok()) {
                crate::telemetry::otlp::continue_trace(&span, tp);
            }
        }
        let in_flight = InFlight::enter();
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        InContext {
            inner,
            timer: None,
            deadline: start + self.deadline,
            started: Some(Started {
                start,
                id,
                method,
                span,
                in_flight,
            }),
        }
    }
}

/// What [`RequestContext`] keeps from the request until its answer.
struct Started {
    start: Instant,
    id: HeaderValue,
    method: &'static str,
    span: tracing::Span,
    in_flight: InFlight,
}

/// One request in `latchkey_http_requests_in_flight`, until it is answered
/// or dropped (a client that hangs up drops its handler mid-way).
struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        in_flight_slot().fetch_add(1, Ordering::Relaxed);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        in_flight_slot().fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project! {
    /// [`RequestContext`]'s answer.
    pub struct InContext<F> {
        #[pin]
        inner: F,
        // Armed the first time the handler has to wait: most answers are
        // ready at once and never touch the timer wheel.
        #[pin]
        timer: Option<tokio::time::Sleep>,
        deadline: Instant,
        started: Option<Started>,
    }
}

impl<F> Future for InContext<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let started = this.started.as_ref().expect("polled after completion");
        let polled = {
            let _entered = started.span.enter();
            this.inner.poll(cx)
        };
        let resp = match polled {
            Poll::Ready(Ok(resp)) => resp,
            Poll::Pending => {
                if this.timer.is_none() {
                    this.timer
                        .set(Some(tokio::time::sleep_until((*this.deadline).into())));
                }
                let timer = this.timer.as_pin_mut().expect("armed above");
                ready!(timer.poll(cx));
                metrics::counter!("latchkey_http_deadline_exceeded_total").increment(1);
                overloaded(1)
            }
        };
        let started = this.started.take().expect("checked above");
        Poll::Ready(Ok(finish(started, resp)))
    }
}

/// The answer's request id, metrics, access log line and span fields.
fn finish(started: Started, mut resp: Response) -> Response {
    let Started {
        start,
        id,
        method,
        span,
        in_flight,
    } = started;
    drop(in_flight);
    resp.headers_mut().insert("x-request-id", id);
    let elapsed = start.elapsed();
    let status = resp.status().as_u16();
    let route = resp
        .extensions()
        .get::<RouteTag>()
        .map(|t| t.0.as_str())
        .unwrap_or("unmatched");
    record(route, method, status_class(status), elapsed);
    // The access line's level decides, not the span's: with `log = warn` the
    // request span is off but a 5xx is still logged (the macros check their
    // own level first, at the cost of a load).
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
