//! Around every request: the request id, the deadline, the access log and
//! the HTTP metrics. The route label is the route template the path
//! matches ([`RouteLabels`], built from the router's own table), never the
//! raw path.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderValue, Method};
use axum::response::Response;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::error::overloaded;
use crate::telemetry::striped;

const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "OTHER",
];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const UNMATCHED: &str = "unmatched";

/// The metrics' `route` label of a request, and the HTTP metrics by
/// (route, method, status class), kept in per-thread stripes
/// ([`striped::Histograms`]: no shared word written per request, no sample
/// buffered until a scrape) and rendered by [`render_metrics`].
///
/// The templates are the router's own (`http::router` builds both from one
/// table) and are matched the way axum matches them (the same `matchit`),
/// so a path gets the label of the route that serves it, or `unmatched`
/// (also for a method the route does not serve, see [`finish`]). It
/// takes one match of the path per request; the alternative, the router
/// handing its matched path out, costs an extension in the request (a
/// shared reference count written by every core), another in the response,
/// and a layer around every route (a boxed clone per request).
pub struct RouteLabels {
    matcher: matchit::Router<usize>,
    /// Route templates by index; `unmatched` last.
    names: Vec<&'static str>,
    histograms: striped::Histograms,
}

/// The service's routes, from the first router built: metrics are
/// process-wide, and so are these.
static LABELS: OnceLock<RouteLabels> = OnceLock::new();

impl RouteLabels {
    /// The labels of the service's routes, built from the first router's
    /// table. Every later router must have the same table.
    pub fn of(templates: &[&'static str]) -> &'static RouteLabels {
        let labels = LABELS.get_or_init(|| RouteLabels::new(templates));
        assert!(
            labels.names[..labels.names.len() - 1] == *templates,
            "every router of the service serves the same route table"
        );
        labels
    }

    fn new(templates: &[&'static str]) -> RouteLabels {
        let mut matcher = matchit::Router::new();
        let mut names = Vec::new();
        for &t in templates {
            matcher
                .insert(t, names.len())
                .expect("route templates are valid and distinct (axum checked them first)");
            names.push(t);
        }
        names.push(UNMATCHED);
        let histograms = striped::Histograms::new(names.len() * METHODS.len() * CLASSES.len());
        RouteLabels {
            matcher,
            names,
            histograms,
        }
    }

    /// The index of the route serving `path` (the last index if none does).
    fn route_of(&self, path: &str) -> usize {
        self.matcher
            .at(path)
            .map(|m| *m.value)
            .unwrap_or(self.unmatched())
    }

    fn unmatched(&self) -> usize {
        self.names.len() - 1
    }

    fn name(&self, route: usize) -> &'static str {
        self.names[route]
    }

    fn record(&self, route: usize, method: usize, class: usize, elapsed: Duration) {
        let cell = (route * METHODS.len() + method) * CLASSES.len() + class;
        self.histograms.record(cell, elapsed);
    }

    fn render(&self, out: &mut String) {
        self.histograms.render(
            out,
            (
                "latchkey_http_requests_total",
                "HTTP requests by route template, method and status class",
            ),
            (
                "latchkey_http_request_duration_seconds",
                "HTTP latency by route template, method and status class",
            ),
            |cell| {
                let (route, rest) = (
                    cell / (METHODS.len() * CLASSES.len()),
                    cell % (METHODS.len() * CLASSES.len()),
                );
                format!(
                    "route=\"{}\",method=\"{}\",status=\"{}\"",
                    self.names[route],
                    METHODS[rest / CLASSES.len()],
                    CLASSES[rest % CLASSES.len()]
                )
            },
        );
    }
}

/// Appends the HTTP request metrics (`latchkey_http_requests_total`,
/// `latchkey_http_request_duration_seconds`) to a Prometheus text; nothing
/// if no router was built.
pub fn render_metrics(out: &mut String) {
    if let Some(labels) = LABELS.get() {
        labels.render(out);
    }
}

fn sane_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
}

/// The index of a method's label in [`METHODS`].
fn method_label(m: &Method) -> usize {
    match *m {
        Method::GET => 0,
        Method::POST => 1,
        Method::PUT => 2,
        Method::DELETE => 3,
        Method::HEAD => 4,
        Method::OPTIONS => 5,
        Method::PATCH => 6,
        _ => 7,
    }
}

/// The index of a status's class in [`CLASSES`].
fn status_class(s: u16) -> usize {
    match s {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

/// A request id unique across processes without a syscall or a shared
/// write per request: a random per-process prefix, then a per-thread
/// counter. Each thread counts in its own block of 2^40 ids (a thread takes
/// a block when it first needs one), so no two threads hand out the same id
/// and no core writes a counter another one reads. There are 2^24 blocks;
/// a process would need that many threads (or ids) before one is reused.
fn new_request_id() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NEXT: Cell<u64> = const { Cell::new(0) };
    }
    let prefix = *PREFIX.get_or_init(|| u64::from_le_bytes(crate::crypto::random_bytes::<8>()));
    let n = NEXT.with(|next| {
        let mut n = next.get();
        if n % (1 << 40) == 0 {
            // A new thread, or one that used up its block.
            n = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed) << 40;
        }
        next.set(n + 1);
        n
    });
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

/// Requests being served, in per-thread stripes (one shared counter would be
/// written by every core twice per request), summed into
/// `latchkey_http_requests_in_flight` when metrics are read
/// ([`publish_in_flight`]).
static IN_FLIGHT: striped::Sum = striped::Sum::new();

/// Sets `latchkey_http_requests_in_flight` from its stripes: called before
/// the metrics are rendered.
pub fn publish_in_flight() {
    metrics::gauge!("latchkey_http_requests_in_flight").set(IN_FLIGHT.read() as f64);
}

/// Outer layer: the request id in and out, the deadline, the span and
/// access log, the HTTP metrics. A plain tower service with its own future
/// (no boxing, no per-request clone of the stack below, no timer unless the
/// handler has to wait): every request pays it, so it stays small.
#[derive(Clone, Copy)]
pub struct RequestContextLayer {
    /// Past it a request is answered `503` and its handler dropped.
    pub deadline: Duration,
    /// The routes below, for the metrics' `route` label.
    pub routes: &'static RouteLabels,
}

impl<S> Layer<S> for RequestContextLayer {
    type Service = RequestContext<S>;
    fn layer(&self, inner: S) -> RequestContext<S> {
        RequestContext {
            inner,
            deadline: self.deadline,
            routes: self.routes,
        }
    }
}

#[derive(Clone)]
pub struct RequestContext<S> {
    inner: S,
    deadline: Duration,
    routes: &'static RouteLabels,
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
        let route = self.routes.route_of(req.uri().path());
        // Disabled (a no-op handle) unless a log filter or the trace
        // exporter wants request spans.
        let span = tracing::info_span!(
            "request",
            request_id = id.to_str().unwrap_or(""),
            method = METHODS[method],
            path = req.uri().path(),
            route = self.routes.name(route),
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
                routes: self.routes,
                route,
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
    routes: &'static RouteLabels,
    route: usize,
    method: usize,
    span: tracing::Span,
    in_flight: InFlight,
}

/// One request in `latchkey_http_requests_in_flight`, until it is answered
/// or dropped (a client that hangs up drops its handler mid-way).
struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        IN_FLIGHT.add(1);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.add(-1);
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
        routes,
        route,
        method,
        span,
        in_flight,
    } = started;
    drop(in_flight);
    resp.headers_mut().insert("x-request-id", id);
    let elapsed = start.elapsed();
    let status = resp.status().as_u16();
    // A method the route does not serve counts as `unmatched`: otherwise any
    // client could open a series for each route and method.
    let route = if status == 405 { routes.unmatched() } else { route };
    routes.record(route, method, status_class(status), elapsed);
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
    // Integers as i64: OpenTelemetry attributes are signed (a u64 would go as text).
    span.record("status", i64::from(status));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_labelled_with_the_template_that_serves_it_and_never_with_itself() {
        let labels = RouteLabels::new(&[
            "/auth/sessions",
            "/auth/sessions/{id}",
            "/admin/users/{id}/sessions",
            "/health/live",
        ]);
        let label = |path: &str| labels.name(labels.route_of(path));
        assert_eq!(label("/auth/sessions"), "/auth/sessions");
        assert_eq!(label("/auth/sessions/0190b3f1"), "/auth/sessions/{id}");
        assert_eq!(label("/admin/users/42/sessions"), "/admin/users/{id}/sessions");
        assert_eq!(label("/health/live"), "/health/live");
        for unknown in [
            "/",
            "/health",
            "/health/live/x",
            "/auth/sessions/a/b",
            "/Health/live",
            "",
        ] {
            assert_eq!(label(unknown), UNMATCHED, "{unknown:?}");
        }
    }

    #[test]
    fn every_route_of_the_service_is_labelled_with_its_own_template() {
        let templates: Vec<&'static str> = super::super::routes().iter().map(|(t, _)| *t).collect();
        let labels = RouteLabels::new(&templates);
        for t in templates {
            let path = t.replace("{id}", "0190b3f1-0000-7000-8000-00000000beef");
            assert_eq!(labels.name(labels.route_of(&path)), t, "{path}");
        }
    }

    #[test]
    fn request_ids_are_distinct_across_threads_and_keep_their_shape() {
        let ids: Vec<HeaderValue> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).map(|_| new_request_id()).collect::<Vec<_>>()))
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
        });
        let distinct: std::collections::HashSet<&[u8]> = ids.iter().map(|v| v.as_bytes()).collect();
        assert_eq!(distinct.len(), ids.len());
        assert!(ids.iter().all(|v| v.len() == 32 && sane_request_id(v)));
        // One process prefix: ids from one instance are recognisable as such.
        assert!(ids.iter().all(|v| v.as_bytes()[..16] == ids[0].as_bytes()[..16]));
    }
}
