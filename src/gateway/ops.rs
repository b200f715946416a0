//! The gateway's operations: health, metrics, and its periodic work (key
//! refreshes, purges).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::state::GatewayState;
use super::worker::Worker;
use crate::clock::now_ms;
use crate::lifecycle::{answers, Housekeeping, Readiness};

pub(super) fn ops_routes() -> Router<Arc<Worker>> {
    Router::new()
        .route("/health/live", get(crate::server::health::live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
}

/// Key refreshes, histogram upkeep, purges of forgotten revocations and full buckets.
pub(super) fn housekeeping(st: &Arc<GatewayState>) -> Housekeeping {
    let refresh = st.config.read().expect("config lock").jwks_refresh;
    let (keys, metrics, purge) = (st.clone(), st.clone(), st.clone());
    Housekeeping::new()
        // Histogram samples wait in lock-free buckets until drained: drain
        // them every second even when nothing scrapes /metrics (at 30,000
        // requests/s that is two samples per request piling up otherwise).
        .every("histogram_upkeep", Duration::from_secs(1), move || {
            metrics.metrics.run_upkeep();
            async { Ok(()) }
        })
        .every("jwks_refresh", refresh, move || {
            let st = keys.clone();
            async move {
                st.tokens.reload().await.map_err(|e| e.to_string())?;
                st.jwks_loaded_at_ms.store(now_ms(), Ordering::Relaxed);
                Ok(())
            }
        })
        .every(
            "purge_revocations_and_buckets",
            Duration::from_secs(60),
            move || {
                purge.revocations.purge();
                purge.limiter.purge();
                async { Ok(()) }
            },
        )
}

/// Ready when verification keys are loaded and Redis (if configured) answers.
async fn ready(State(w): State<Arc<Worker>>) -> Response {
    let st = &w.gw;
    let keys = st.tokens.key_count();
    let mut ready = Readiness::new().check("jwks", keys > 0);
    if let Some(r) = &st.redis {
        ready = r.readiness(ready, answers(Duration::from_secs(1), r.ping()).await);
    }
    let jwks_age = (now_ms() - st.jwks_loaded_at_ms.load(Ordering::Relaxed)).max(0) / 1000;
    // Informational: whether logouts are being heard (Redis or the poll).
    ready
        .inform("revocations", st.revocations.is_current())
        .with("keys", keys)
        .with("jwks_age_secs", jwks_age)
        .respond("failing")
}

async fn metrics(State(w): State<Arc<Worker>>) -> Response {
    let st = &w.gw;
    metrics::gauge!("latchkey_token_cache_size").set(st.tokens.cache_len() as f64);
    metrics::gauge!("latchkey_revocations_size").set(st.revocations.len() as f64);
    metrics::gauge!("latchkey_gateway_routes").set(st.table().routes().count() as f64);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        crate::telemetry::render(&st.metrics),
    )
        .into_response()
}

pub(super) fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        "latchkey_gateway_request_duration_seconds",
        Unit::Seconds,
        "Gateway latency to response headers, by route (unmatched: no route)"
    );
    describe_histogram!(
        "latchkey_gateway_upstream_duration_seconds",
        Unit::Seconds,
        "Time from sending to the upstream to its response headers, by route"
    );
    describe_counter!(
        "latchkey_gateway_requests_total",
        "Gateway requests by route and status class"
    );
    describe_counter!(
        "latchkey_gateway_auth_failures_total",
        "Requests refused 401 by route and reason (missing, signature, expired, revoked, audience, ...)"
    );
    describe_counter!(
        "latchkey_gateway_rate_limited_total",
        "Requests refused 429, by route"
    );
    describe_counter!(
        "latchkey_gateway_upstream_errors_total",
        "Upstream failures by route and kind (connect, io: 502; timeout: 504; busy: 503)"
    );
    describe_gauge!("latchkey_gateway_requests_in_flight", "Requests being proxied");
    describe_gauge!("latchkey_gateway_routes", "Routes in the active table");
    describe_counter!(
        "latchkey_housekeeping_failures_total",
        "Runs of a periodic chore (JWKS refresh) that failed, by chore"
    );
}
