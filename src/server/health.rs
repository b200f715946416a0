//! What both programs answer about themselves while they serve.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

#[utoipa::path(get, path = "/health/live", tag = "operations",
    responses((status = 200, description = "{\"status\":\"ok\"} while the process serves")))]
pub async fn live() -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        "{\"status\":\"ok\"}",
    )
        .into_response()
}
