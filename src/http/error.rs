//! The one place that turns domain errors into HTTP answers: status, error
//! code, `Retry-After`, `RateLimit-*` and `WWW-Authenticate`. A 5xx never
//! carries internal details; the cause is logged instead.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::domain::input::FieldError;
use crate::domain::AuthError;
pub use crate::server::answers::{
    error_response, invalid_token, overloaded, rate_limit_headers, rate_limited, with_header, ErrorBody,
};

/// How long a client waits before trying a write again on a full disk:
/// freeing space is an operator's task, not a matter of a second.
const STORAGE_FULL_RETRY_SECS: u64 = 30;

#[derive(Debug)]
pub enum ApiError {
    Auth(AuthError),
    TooLarge,
    UnsupportedMediaType,
    NotFound,
    MethodNotAllowed,
    /// An upstream provider could not be reached, or answered nonsense.
    UpstreamFailed,
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        ApiError::Auth(e)
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::Auth(AuthError::Invalid(e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::UpstreamFailed => error_response(
                StatusCode::BAD_GATEWAY,
                "UPSTREAM_FAILED",
                "the upstream provider could not be reached, or answered unexpectedly",
            ),
            ApiError::TooLarge => error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                "the body is larger than allowed",
            ),
            ApiError::UnsupportedMediaType => error_response(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UNSUPPORTED_MEDIA_TYPE",
                "the body must be JSON, sent with Content-Type: application/json",
            ),
            ApiError::NotFound => error_response(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint"),
            ApiError::MethodNotAllowed => error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "method not allowed on this endpoint",
            ),
            ApiError::Auth(e) => match e {
                AuthError::Invalid(f) => {
                    error_response(StatusCode::BAD_REQUEST, "INVALID_REQUEST", f.to_string())
                }
                AuthError::BadRequest(m) => error_response(StatusCode::BAD_REQUEST, "INVALID_REQUEST", m),
                AuthError::InvalidCredentials => error_response(
                    StatusCode::UNAUTHORIZED,
                    "INVALID_CREDENTIALS",
                    "invalid email or password",
                ),
                AuthError::VerificationPending => error_response(
                    StatusCode::UNAUTHORIZED,
                    "VERIFICATION_PENDING",
                    "verify your email address with the code sent to it",
                ),
                AuthError::InvalidOtp => error_response(
                    StatusCode::UNAUTHORIZED,
                    "INVALID_OTP",
                    "the code is wrong, expired or used",
                ),
                AuthError::TooManyAttempts { retry_after } => {
                    let r = error_response(
                        StatusCode::TOO_MANY_REQUESTS,
                        "TOO_MANY_ATTEMPTS",
                        match retry_after {
                            Some(_) => "too many failed attempts; retry later",
                            None => "too many wrong tries; request a new code",
                        },
                    );
                    match retry_after {
                        Some(s) => with_header(r, header::RETRY_AFTER, s),
                        None => r,
                    }
                }
                AuthError::InvalidToken => invalid_token(),
                AuthError::RateLimited(l) => rate_limited(&l),
                AuthError::Overloaded { retry_after } => overloaded(retry_after),
                AuthError::Unavailable(_) => {
                    let r = error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "UNAVAILABLE",
                        "the service cannot reach its database right now; retry shortly",
                    );
                    with_header(r, header::RETRY_AFTER, 1)
                }
                AuthError::StorageFull => {
                    let r = error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "STORAGE_FULL",
                        "the service's storage is full: the change was refused; retry later",
                    );
                    with_header(r, header::RETRY_AFTER, STORAGE_FULL_RETRY_SECS)
                }
                AuthError::InsufficientScope(scope) => {
                    let r = error_response(
                        StatusCode::FORBIDDEN,
                        "INSUFFICIENT_SCOPE",
                        format!("this call needs a client token with the scope {scope}"),
                    );
                    with_header(
                        r,
                        header::WWW_AUTHENTICATE,
                        format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\""),
                    )
                }
                AuthError::Conflict(why) => error_response(StatusCode::CONFLICT, "CONFLICT", why),
                AuthError::EmailTaken => error_response(
                    StatusCode::CONFLICT,
                    "EMAIL_TAKEN",
                    "an account with this email exists",
                ),
                AuthError::SecondFactorRequired(step_up) => {
                    let mut body = serde_json::json!({
                        "error": "MFA_REQUIRED",
                        "message": "the account has a second factor: complete the login at /auth/mfa/verify",
                    });
                    match step_up {
                        Some(s) => {
                            if let (Some(b), Ok(serde_json::Value::Object(extra))) =
                                (body.as_object_mut(), serde_json::to_value(&*s))
                            {
                                b.extend(extra);
                            }
                        }
                        None => {
                            body["message"] =
                                "the account has a second factor: log in through /auth/login".into();
                        }
                    }
                    let mut r = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
                    r.headers_mut()
                        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    r
                }
                AuthError::InvalidFactor { tries_left } => {
                    let mut body = serde_json::json!({
                        "error": "INVALID_FACTOR",
                        "message": "the second factor was not accepted",
                    });
                    if tries_left >= 0 {
                        body["tries_left"] = tries_left.into();
                    }
                    (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
                }
                AuthError::ReauthenticationRequired { max_age, mfa } => {
                    let r = error_response(
                        StatusCode::UNAUTHORIZED,
                        "REAUTHENTICATION_REQUIRED",
                        if mfa {
                            "log in again, with your second factor, to change factors"
                        } else {
                            "log in again to change factors"
                        },
                    );
                    let acr = if mfa { ", acr_values=\"2\"" } else { "" };
                    with_header(
                        r,
                        header::WWW_AUTHENTICATE,
                        format!("Bearer error=\"insufficient_user_authentication\", max_age={max_age}{acr}"),
                    )
                }
                AuthError::FirstPartyOnly => error_response(
                    StatusCode::FORBIDDEN,
                    "FIRST_PARTY_ONLY",
                    "this call needs a token from latchkey's own login, not one an OAuth client holds",
                ),
                AuthError::AccountDisabled => error_response(
                    StatusCode::FORBIDDEN,
                    "ACCOUNT_DISABLED",
                    "the account is disabled",
                ),
                AuthError::InvalidScope => error_response(
                    StatusCode::BAD_REQUEST,
                    "INVALID_SCOPE",
                    "the client may not have the scope asked for",
                ),
                AuthError::NotFound(what) => {
                    error_response(StatusCode::NOT_FOUND, "NOT_FOUND", format!("no such {what}"))
                }
                AuthError::InvalidClient => error_response(
                    StatusCode::UNAUTHORIZED,
                    "INVALID_CLIENT",
                    "client authentication failed",
                ),
                AuthError::Internal(e) => {
                    tracing::error!(error = ?e, "internal error");
                    error_response(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "internal error")
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_answers_503_storage_full_with_retry_after_never_500() {
        let r = ApiError::from(AuthError::StorageFull).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "30");
    }

    #[test]
    fn an_unreachable_database_answers_503_with_retry_after_never_500() {
        // What a lost database connection becomes (domain/error.rs).
        let e = AuthError::Unavailable("reset by peer".into());
        let r = ApiError::from(e).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
