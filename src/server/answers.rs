//! The answers both programs give themselves (the service's errors and the
//! gateway's refusals alike): one JSON shape, `{"error", "message"}`, and
//! the headers that go with a status (`Retry-After`, `RateLimit-*`,
//! `WWW-Authenticate`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::limits::Limited;

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code such as `INVALID_REQUEST`.
    pub error: &'static str,
    /// Text for humans; for `INVALID_REQUEST` it names the field.
    pub message: String,
}

pub fn error_response(status: StatusCode, error: &'static str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            error,
            message: message.into(),
        }),
    )
        .into_response()
}

pub fn with_header(mut r: Response, name: header::HeaderName, value: impl ToString) -> Response {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        r.headers_mut().insert(name, v);
    }
    r
}

pub fn rate_limited(l: &Limited) -> Response {
    let r = error_response(
        StatusCode::TOO_MANY_REQUESTS,
        "RATE_LIMITED",
        "too many requests; retry later",
    );
    rate_limit_headers(r, l)
}

pub fn rate_limit_headers(r: Response, l: &Limited) -> Response {
    let r = with_header(r, header::RETRY_AFTER, l.retry_after_secs);
    let r = with_header(r, header::HeaderName::from_static("ratelimit-limit"), l.limit);
    let r = with_header(
        r,
        header::HeaderName::from_static("ratelimit-remaining"),
        l.remaining,
    );
    with_header(
        r,
        header::HeaderName::from_static("ratelimit-reset"),
        l.reset_secs,
    )
}

pub fn overloaded(retry_after: u64) -> Response {
    metrics::counter!("latchkey_http_shed_total").increment(1);
    let r = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "OVERLOADED",
        "the service is busy; retry shortly",
    );
    with_header(r, header::RETRY_AFTER, retry_after.max(1))
}

pub fn invalid_token() -> Response {
    let r = error_response(
        StatusCode::UNAUTHORIZED,
        "INVALID_TOKEN",
        "the token is missing, invalid, expired or revoked",
    );
    with_header(r, header::WWW_AUTHENTICATE, "Bearer error=\"invalid_token\"")
}
