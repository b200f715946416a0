//! Operations: liveness, readiness, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::OpenApi;

use super::AppState;

pub use crate::server::health::{__path_live, live};

#[utoipa::path(get, path = "/health/ready", tag = "operations",
    responses((status = 200, description = "The database (and Redis, if configured) answer"),
              (status = 503, description = "A dependency does not answer; `failing` names it")))]
pub async fn ready(State(st): State<AppState>) -> Response {
    st.ops.readiness().await.respond("not answering")
}

/// Prometheus text format; served on the admin listener only.
pub async fn metrics(State(st): State<AppState>) -> Response {
    super::middleware::publish_in_flight();
    let mut text = st.ops.metrics_text();
    super::middleware::render_metrics(&mut text);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "This document")))]
pub async fn openapi() -> Response {
    // Rendered once (about 70 KB): every answer shares the same bytes, so
    // answers held for slow readers cost no copy each.
    static DOCUMENT: std::sync::OnceLock<bytes::Bytes> = std::sync::OnceLock::new();
    let body = DOCUMENT.get_or_init(|| {
        serde_json::to_vec(&super::ApiDoc::openapi())
            .expect("the OpenAPI document serializes")
            .into()
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.clone(),
    )
        .into_response()
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
    match st.ops.revoked_since(q.since).await {
        Ok(revoked) => Json(crate::cache::PolledRevocations { revoked }).into_response(),
        Err(e) => super::error::ApiError::Auth(e).into_response(),
    }
}
