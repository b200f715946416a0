//! Handlers of the Accounts section of docs/api.md: parse, call the domain, answer.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{query_bool, AccountBearer, ClientIp, ClientOrigin, JsonBody};
use super::schema;
use super::AppState;
use crate::domain::input::{parse_name, parse_opaque, Code, Email, FieldError, Password};
use crate::domain::sessions::{Profile, SessionInfo, TokenPair};

#[derive(Deserialize, ToSchema)]
pub struct RegisterRequest {
    #[schema(schema_with = schema::email)]
    email: String,
    #[schema(schema_with = schema::password)]
    password: String,
    #[serde(default)]
    #[schema(schema_with = schema::name)]
    name: Option<String>,
}

#[derive(Deserialize, ToSchema)]
pub struct VerifyRequest {
    #[schema(schema_with = schema::email)]
    email: String,
    #[schema(schema_with = schema::code)]
    code: String,
}

#[derive(Deserialize, ToSchema)]
pub struct EmailRequest {
    #[schema(schema_with = schema::email)]
    email: String,
}

#[derive(Deserialize, ToSchema)]
pub struct LoginRequest {
    #[schema(schema_with = schema::email)]
    email: String,
    #[schema(schema_with = schema::password)]
    password: String,
}

#[derive(Deserialize, ToSchema)]
pub struct RefreshRequest {
    #[schema(schema_with = schema::refresh_token)]
    refresh_token: String,
}

#[derive(Deserialize, ToSchema)]
pub struct LogoutRequest {
    #[schema(schema_with = schema::any_token)]
    refresh_token: String,
}

#[derive(Deserialize, ToSchema)]
pub struct PasswordChangeRequest {
    /// Required, unless the account has no password (it was verified while
    /// its registration was contested: the verification's answer said
    /// `PASSWORD_REQUIRED`); then it must be left out.
    #[schema(schema_with = schema::current_password)]
    #[serde(default)]
    current_password: Option<String>,
    #[schema(schema_with = schema::password)]
    new_password: String,
    /// End every other session of the account (the caller's stays). Default true.
    #[serde(default = "yes")]
    #[schema(default = true)]
    end_other_sessions: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, ToSchema)]
pub struct PasswordResetConfirmRequest {
    #[schema(schema_with = schema::email)]
    email: String,
    #[schema(schema_with = schema::code)]
    code: String,
    #[schema(schema_with = schema::password)]
    new_password: String,
}

#[derive(Serialize, ToSchema)]
pub struct StatusBody {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'static str>,
}

/// Token pairs are credentials: never cached (RFC 6749 §5.1).
pub fn token_response(pair: TokenPair) -> Response {
    let mut r = Json(pair).into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r.headers_mut()
        .insert(header::PRAGMA, header::HeaderValue::from_static("no-cache"));
    r
}

#[utoipa::path(post, path = "/auth/register", tag = "accounts", request_body = RegisterRequest,
    responses((status = 201, body = StatusBody, description = "Account created (or email already known: same answer); a code is emailed"),
              (status = 400, body = ErrorBody), (status = 413, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn register(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    JsonBody(req): JsonBody<RegisterRequest>,
) -> Result<Response, ApiError> {
    let email = Email::parse("email", &req.email)?;
    let password = Password::parse("password", &req.password)?;
    let name = parse_name("name", req.name.as_deref())?;
    st.signup.register(ip, email, password, name).await?;
    Ok((
        StatusCode::CREATED,
        Json(StatusBody {
            status: "VERIFICATION_PENDING",
            message: Some("Check your email for a 6-digit verification code."),
        }),
    )
        .into_response())
}

#[utoipa::path(post, path = "/auth/verify-otp", tag = "accounts", request_body = VerifyRequest,
    responses((status = 200, body = TokenPair), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_OTP, or MFA_REQUIRED (an account with a second factor whose new email was just verified: the body adds a StepUp)"),
              (status = 403, body = ErrorBody, description = "ACCOUNT_DISABLED"),
              (status = 429, body = ErrorBody, description = "TOO_MANY_ATTEMPTS or RATE_LIMITED")))]
pub async fn verify_otp(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<VerifyRequest>,
) -> Result<Response, ApiError> {
    let email = Email::parse("email", &req.email)?;
    let code = Code::parse("code", &req.code)?;
    Ok(token_response(
        st.signup.verify_email(&origin, email, code).await?,
    ))
}

#[utoipa::path(post, path = "/auth/resend-otp", tag = "accounts", request_body = EmailRequest,
    responses((status = 202, body = StatusBody), (status = 400, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn resend_otp(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    JsonBody(req): JsonBody<EmailRequest>,
) -> Result<Response, ApiError> {
    let email = Email::parse("email", &req.email)?;
    st.signup.resend_code(ip, email).await?;
    Ok(sent())
}

fn sent() -> Response {
    (
        StatusCode::ACCEPTED,
        Json(StatusBody {
            status: "SENT",
            message: None,
        }),
    )
        .into_response()
}

#[utoipa::path(post, path = "/auth/login", tag = "accounts", request_body = LoginRequest,
    responses((status = 200, body = TokenPair), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_CREDENTIALS, VERIFICATION_PENDING, or MFA_REQUIRED: the account has a second factor; the body adds a StepUp (mfa_token, factors, webauthn) for POST /auth/mfa/verify"),
              (status = 403, body = ErrorBody, description = "ACCOUNT_DISABLED"),
              (status = 429, body = ErrorBody, description = "TOO_MANY_ATTEMPTS or RATE_LIMITED"),
              (status = 503, body = ErrorBody, description = "OVERLOADED, with Retry-After")))]
pub async fn login(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<LoginRequest>,
) -> Result<Response, ApiError> {
    let email = Email::parse("email", &req.email)?;
    let password = Password::parse("password", &req.password)?;
    Ok(token_response(
        st.login.password(&origin, email, password, None).await?,
    ))
}

#[utoipa::path(post, path = "/auth/refresh", tag = "accounts", request_body = RefreshRequest,
    responses((status = 200, body = TokenPair), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody, description = "INVALID_TOKEN")))]
pub async fn refresh(
    State(st): State<AppState>,
    JsonBody(req): JsonBody<RefreshRequest>,
) -> Result<Response, ApiError> {
    let token = parse_opaque("refresh_token", &req.refresh_token)?;
    Ok(token_response(st.sessions.refresh(&token, None).await?))
}

#[utoipa::path(post, path = "/auth/logout", tag = "accounts", request_body = LogoutRequest,
    responses((status = 204, description = "Session revoked (also for an unknown token)"), (status = 400, body = ErrorBody)))]
pub async fn logout(
    State(st): State<AppState>,
    JsonBody(req): JsonBody<LogoutRequest>,
) -> Result<StatusCode, ApiError> {
    if req.refresh_token.is_empty() {
        return Err(FieldError::new("refresh_token", "must not be empty").into());
    }
    // A malformed token cannot be ours: nothing to revoke, same answer.
    if let Ok(token) = parse_opaque("refresh_token", &req.refresh_token) {
        st.sessions.logout(&token).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/auth/me", tag = "accounts", security(("bearer" = [])),
    responses((status = 200, body = Profile), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY: a token an OAuth client holds (an application reads /oauth/userinfo, which answers by the scopes the user granted)")))]
pub async fn me(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
) -> Result<Json<Profile>, ApiError> {
    Ok(Json(st.sessions.profile(&token).await?))
}

#[utoipa::path(post, path = "/auth/password", tag = "accounts", security(("bearer" = [])), request_body = PasswordChangeRequest,
    responses((status = 204, description = "Changed; every other session revoked unless end_other_sessions is false"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN or INVALID_CREDENTIALS"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY: a token an OAuth client holds"),
              (status = 429, body = ErrorBody, description = "TOO_MANY_ATTEMPTS (wrong current passwords count as failed logins) or RATE_LIMITED (policy password_account)"),
              (status = 503, body = ErrorBody, description = "OVERLOADED")))]
pub async fn change_password(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<PasswordChangeRequest>,
) -> Result<StatusCode, ApiError> {
    let current = req
        .current_password
        .as_deref()
        .map(current_password)
        .transpose()?;
    let new = Password::parse("new_password", &req.new_password)?;
    st.passwords
        .change(&token, origin.ip, current, new, req.end_other_sessions)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A `current_password` field: empty or beyond 1024 characters is a client
/// mistake (`400`); any other value outside the password rules cannot be
/// right (`401 INVALID_CREDENTIALS`, as a wrong one).
pub(super) fn current_password(raw: &str) -> Result<Password, ApiError> {
    if raw.is_empty() || raw.chars().count() > 1024 {
        return Err(FieldError::new("current_password", "must be the current password").into());
    }
    Password::parse("current_password", raw)
        .map_err(|_| ApiError::Auth(crate::domain::AuthError::InvalidCredentials))
}

#[derive(Serialize, ToSchema)]
pub struct SessionList {
    /// Live sessions, newest first (at most 500).
    sessions: Vec<SessionInfo>,
}

#[utoipa::path(get, path = "/auth/sessions", tag = "sessions", security(("bearer" = [])),
    responses((status = 200, body = SessionList, description = "The caller's live sessions, newest first"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY: a token an OAuth client holds")))]
pub async fn sessions(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
) -> Result<Response, ApiError> {
    let sessions = st.sessions.list(&token).await?;
    let mut r = Json(SessionList { sessions }).into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(r)
}

#[utoipa::path(delete, path = "/auth/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, description = "A session id, as listed by GET /auth/sessions")),
    responses((status = 204, description = "Ended: its refresh token and access tokens are refused from now on"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY: a token an OAuth client holds"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND: not a live session of the caller")))]
pub async fn end_session(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<StatusCode, ApiError> {
    // A path segment that does not decode names no session either.
    let Ok(Path(id)) = id else {
        return Err(crate::domain::AuthError::NotFound("session").into());
    };
    st.sessions.end_one(&token, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/auth/sessions", tag = "sessions", security(("bearer" = [])),
    params(("others" = Option<bool>, Query, description = "true: end every session but the caller's; false or absent: every session, the caller's too")),
    responses((status = 204, description = "Ended"),
              (status = 400, body = ErrorBody, description = "INVALID_REQUEST: others is not true or false"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY: a token an OAuth client holds")))]
pub async fn end_sessions(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    let mut others = false;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if k == "others" {
            others = query_bool("others", &v)?;
        }
    }
    st.sessions.end_all(&token, others).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/auth/password-reset", tag = "accounts", request_body = EmailRequest,
    responses((status = 202, body = StatusBody, description = "A code is emailed if the account exists"), (status = 400, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn password_reset(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    JsonBody(req): JsonBody<EmailRequest>,
) -> Result<Response, ApiError> {
    let email = Email::parse("email", &req.email)?;
    st.passwords.request_reset(ip, email).await?;
    Ok(sent())
}

#[utoipa::path(post, path = "/auth/password-reset/confirm", tag = "accounts", request_body = PasswordResetConfirmRequest,
    responses((status = 204, description = "Password set; every session revoked"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_OTP"), (status = 429, body = ErrorBody, description = "TOO_MANY_ATTEMPTS")))]
pub async fn password_reset_confirm(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    JsonBody(req): JsonBody<PasswordResetConfirmRequest>,
) -> Result<StatusCode, ApiError> {
    let email = Email::parse("email", &req.email)?;
    let code = Code::parse("code", &req.code)?;
    let new = Password::parse("new_password", &req.new_password)?;
    st.passwords.confirm_reset(ip, email, code, new).await?;
    Ok(StatusCode::NO_CONTENT)
}
