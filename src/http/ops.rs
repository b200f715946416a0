//! Operations: liveness, readiness, metrics and the OpenAPI document.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::OpenApi;

use super::AppState;

#[utoipa::path(get, path = "/health/live", tag = "operations",
    responses((status = 200, description = "{\"status\":\"ok\"} while the process serves")))]
pub async fn live() -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        "{\"status\":\"ok\"}",
    )
        .into_response()
}

#[utoipa::path(get, path = "/health/ready", tag = "operations",
    responses((status = 200, description = "The database (and Redis, if configured) answer"),
              (status = 503, description = "A dependency does not answer; `failing` names it")))]
pub async fn ready(State(st): State<AppState>) -> Response {
    let timeout = Duration::from_secs(1);
    let db_ok = matches!(tokio::time::timeout(timeout, st.store.ping()).await, Ok(Ok(())));
    let redis_ok = match &st.redis {
        None => None,
        Some(r) => Some(matches!(
            tokio::time::timeout(timeout, r.ping()).await,
            Ok(Ok(()))
        )),
    };
    let mut checks = serde_json::Map::new();
    let mut failing = Vec::new();
    checks.insert("database".into(), if db_ok { "ok" } else { "failing" }.into());
    if !db_ok {
        failing.push("database");
    }
    if let Some(ok) = redis_ok {
        checks.insert("redis".into(), if ok { "ok" } else { "failing" }.into());
        if !ok {
            failing.push("redis");
        }
    }
    if failing.is_empty() {
        (
            StatusCode::OK,
            Json(serde_json::json!({"status": "ok", "checks": checks})),
        )
            .into_response()
    } else {
        let message = format!("not ready: {} not answering", failing.join(" and "));
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": "UNAVAILABLE", "message": message, "failing": failing, "checks": checks})),
        )
            .into_response()
    }
}

/// Prometheus text format; served on the admin listener only.
pub async fn metrics(State(st): State<AppState>) -> Response {
    crate::telemetry::record_gauges(&st);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        st.metrics.render(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "This document")))]
pub async fn openapi() -> Response {
    Json(super::ApiDoc::openapi()).into_response()
}

#[derive(serde::Deserialize)]
pub struct Since {
    /// Unix milliseconds.
    since: i64,
}

/// Sessions revoked since `since` (admin listener only): what a gateway
/// polls so that logouts reach it even when Redis does not.
pub async fn revocations(
    State(st): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<Since>,
) -> Response {
    match st.store.revoked_sessions_since(q.since).await {
        Ok(revoked) => Json(crate::cache::PolledRevocations { revoked }).into_response(),
        Err(e) => super::error::ApiError::Auth(e.into()).into_response(),
    }
}
