//! Around every request: the request id, the deadline, the access log and
//! the HTTP metrics. The route label is the matched route template (copied
//! into the response by `tag_route`), never the raw path.

use std::time::{Duration, Instant};

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

/// Outer layer: request id in and out, deadline, access log, metrics.
pub async fn request_context(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let id = match req.headers().get("x-request-id") {
        Some(v) if sane_request_id(v) => v.clone(),
        _ => {
            HeaderValue::from_str(&uuid::Uuid::new_v4().simple().to_string()).expect("hex is a valid header")
        }
    };
    let method = method_label(req.method());
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or(""),
        method,
        path = req.uri().path()
    );
    let in_flight = metrics::gauge!("latchkey_http_requests_in_flight");
    in_flight.increment(1.0);
    let deadline: Duration = st.config.request_timeout;
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
        .map(|t| t.0.as_str().to_string());
    let route = route.unwrap_or_else(|| "unmatched".to_string());
    let class = status_class(status);
    metrics::histogram!("latchkey_http_request_duration_seconds", "route" => route.clone(), "method" => method, "status" => class)
        .record(elapsed.as_secs_f64());
    metrics::counter!("latchkey_http_requests_total", "route" => route, "method" => method, "status" => class).increment(1);
    span.in_scope(|| {
        if status >= 500 {
            tracing::warn!(target: "latchkey::access", status, latency_ms = elapsed.as_secs_f64() * 1000.0, "request");
        } else {
            tracing::info!(target: "latchkey::access", status, latency_ms = elapsed.as_secs_f64() * 1000.0, "request");
        }
    });
    resp
}
