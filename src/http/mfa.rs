//! Handlers of second factors (docs/api.md, "Second factors"; docs/mfa.md):
//! the login's second step, passwordless login with a passkey, and the
//! factors a user manages. Parse, call the domain, answer.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;
use webauthn_rs::prelude::{PublicKeyCredential, RegisterPublicKeyCredential};

use super::accounts::{current_password, token_response};
use super::error::{ApiError, ErrorBody};
use super::extract::{AccountBearer, ClientOrigin, JsonBody};
use super::schema;
use super::AppState;
use crate::domain::input::{parse_opaque, FieldError};
use crate::domain::mfa::{Ceremony, Enrolled, FactorInfo, FactorList, Proof, RecoveryCodes, TotpEnrolment};
use crate::domain::sessions::TokenPair;
use crate::domain::AuthError;

/// The second step of a login: its `mfa_token` (from the `401
/// MFA_REQUIRED` answer) and exactly one second factor.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MfaVerifyRequest {
    Totp(TotpProof),
    RecoveryCode(RecoveryProof),
    WebAuthn(WebAuthnProof),
}

/// A code of the authenticator app.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TotpProof {
    #[schema(schema_with = schema::opaque_token)]
    mfa_token: String,
    #[schema(schema_with = schema::totp_code)]
    code: String,
}

/// One of the recovery codes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecoveryProof {
    #[schema(schema_with = schema::opaque_token)]
    mfa_token: String,
    #[schema(schema_with = schema::recovery_code)]
    recovery_code: String,
}

/// A passkey's assertion, made with the `webauthn` options of the answer.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebAuthnProof {
    #[schema(schema_with = schema::opaque_token)]
    mfa_token: String,
    #[schema(schema_with = schema::assertion)]
    webauthn: serde_json::Value,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NameRequest {
    /// At most 64 characters, no control characters.
    #[serde(default)]
    #[schema(schema_with = schema::factor_name)]
    name: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TotpRequest {
    #[serde(default)]
    #[schema(schema_with = schema::factor_name)]
    name: Option<String>,
    /// Adding a factor takes the current password too.
    #[schema(schema_with = schema::current_password)]
    current_password: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PasskeyRequest {
    #[serde(default)]
    #[schema(schema_with = schema::factor_name)]
    name: Option<String>,
    /// Adding a factor takes the current password too.
    #[schema(schema_with = schema::current_password)]
    current_password: String,
    /// Whether this passkey may log in without the password (it is then
    /// created discoverable). Default false: a second factor only.
    #[serde(default)]
    passwordless: bool,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeRequest {
    #[schema(schema_with = schema::totp_code)]
    code: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistrationFinish {
    #[schema(schema_with = schema::opaque_token)]
    ceremony_token: String,
    #[schema(schema_with = schema::registration)]
    credential: serde_json::Value,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginFinish {
    #[schema(schema_with = schema::opaque_token)]
    ceremony_token: String,
    #[schema(schema_with = schema::assertion)]
    credential: serde_json::Value,
}

/// A `PublicKeyCredential` in its JSON form, or a client mistake.
fn credential<T: serde::de::DeserializeOwned>(
    field: &'static str,
    v: serde_json::Value,
) -> Result<T, ApiError> {
    serde_json::from_value(v)
        .map_err(|_| FieldError::new(field, "must be a PublicKeyCredential in its JSON form").into())
}

/// A factor id from the path; anything that is not one names no factor.
fn factor_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    match id {
        Ok(Path(id)) if id.starts_with("fac_") && id.len() <= 64 => Ok(id),
        _ => Err(AuthError::NotFound("factor").into()),
    }
}

/// Secrets, codes and ceremonies are never cached (RFC 9111 `no-store`).
fn no_store_with<T: serde::Serialize>(status: StatusCode, body: T) -> Response {
    let mut r = (status, Json(body)).into_response();
    r.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    r
}

fn created<T: serde::Serialize>(body: T) -> Response {
    no_store_with(StatusCode::CREATED, body)
}

fn no_store<T: serde::Serialize>(body: T) -> Response {
    no_store_with(StatusCode::OK, body)
}

#[utoipa::path(post, path = "/auth/mfa/verify", tag = "second factors", request_body = MfaVerifyRequest,
    responses((status = 200, body = TokenPair, description = "The login is complete: amr says which factors"),
              (status = 400, body = ErrorBody, description = "INVALID_REQUEST: not exactly one factor"),
              (status = 401, body = ErrorBody, description = "INVALID_FACTOR (with tries_left), or INVALID_TOKEN: the mfa_token is unknown, used, expired or dead after 5 wrong factors"),
              (status = 403, body = ErrorBody, description = "ACCOUNT_DISABLED")))]
pub async fn verify(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<MfaVerifyRequest>,
) -> Result<Response, ApiError> {
    let (token, proof) = match req {
        MfaVerifyRequest::Totp(p) => (p.mfa_token, Proof::Totp(p.code.trim().to_string())),
        MfaVerifyRequest::RecoveryCode(p) => {
            if p.recovery_code.is_empty() || p.recovery_code.chars().count() > 64 {
                return Err(FieldError::new("recovery_code", "1 to 64 characters").into());
            }
            (p.mfa_token, Proof::RecoveryCode(p.recovery_code))
        }
        MfaVerifyRequest::WebAuthn(p) => {
            let cred = credential("webauthn", p.webauthn)?;
            (p.mfa_token, Proof::WebAuthn(Box::new(cred)))
        }
    };
    let token = parse_opaque("mfa_token", &token)?;
    Ok(token_response(
        st.login.second_factor(&origin, &token, proof).await?,
    ))
}

#[utoipa::path(post, path = "/auth/passkeys/login", tag = "second factors",
    responses((status = 200, body = Ceremony, description = "Options for navigator.credentials.get(), naming no account")))]
pub async fn passkey_login(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
) -> Result<Response, ApiError> {
    Ok(no_store(st.login.start_passkey(&origin).await?))
}

#[utoipa::path(post, path = "/auth/passkeys/login/finish", tag = "second factors", request_body = LoginFinish,
    responses((status = 200, body = TokenPair, description = "Logged in: amr [swk, mfa]"),
              (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_FACTOR (no passwordless passkey, or the assertion failed), INVALID_TOKEN (the ceremony is unknown, used or expired), VERIFICATION_PENDING"),
              (status = 403, body = ErrorBody, description = "ACCOUNT_DISABLED")))]
pub async fn passkey_login_finish(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<LoginFinish>,
) -> Result<Response, ApiError> {
    let token = parse_opaque("ceremony_token", &req.ceremony_token)?;
    let cred: PublicKeyCredential = credential("credential", req.credential)?;
    Ok(token_response(
        st.login.finish_passkey(&origin, &token, &cred).await?,
    ))
}

#[utoipa::path(get, path = "/auth/mfa/factors", tag = "second factors", security(("bearer" = [])),
    responses((status = 200, body = FactorList),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY")))]
pub async fn factors(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
) -> Result<Response, ApiError> {
    Ok(Json(st.factors.factors(&token).await?).into_response())
}

#[utoipa::path(post, path = "/auth/mfa/totp", tag = "second factors", security(("bearer" = [])), request_body = TotpRequest,
    responses((status = 201, body = TotpEnrolment, description = "Shown once; confirm it with a first code"),
              (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_CREDENTIALS (the current password), INVALID_TOKEN, or REAUTHENTICATION_REQUIRED (RFC 9470): a login more recent, with the second factor if the account has one"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY")))]
pub async fn start_totp(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<TotpRequest>,
) -> Result<Response, ApiError> {
    let name = req.name.unwrap_or_default();
    let password = current_password(&req.current_password)?;
    Ok(created(
        st.factors.start_totp(&token, origin.ip, &name, password).await?,
    ))
}

#[utoipa::path(post, path = "/auth/mfa/totp/{id}/confirm", tag = "second factors", security(("bearer" = [])), request_body = CodeRequest,
    params(("id" = String, Path, description = "The enrolment's factor id")),
    responses((status = 201, body = Enrolled, description = "Confirmed; the first factor of an account comes with its recovery codes"),
              (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_FACTOR (a wrong code), INVALID_TOKEN or REAUTHENTICATION_REQUIRED"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND: no such enrolment waiting")))]
pub async fn confirm_totp(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    id: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<CodeRequest>,
) -> Result<Response, ApiError> {
    let id = factor_id(id)?;
    Ok(created(
        st.factors.confirm_totp(&token, &id, req.code.trim()).await?,
    ))
}

#[utoipa::path(post, path = "/auth/mfa/passkeys", tag = "second factors", security(("bearer" = [])), request_body = PasskeyRequest,
    responses((status = 200, body = Ceremony, description = "Options for navigator.credentials.create()"),
              (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_CREDENTIALS (the current password), INVALID_TOKEN or REAUTHENTICATION_REQUIRED"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY")))]
pub async fn start_passkey(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<PasskeyRequest>,
) -> Result<Response, ApiError> {
    let name = req.name.unwrap_or_default();
    let password = current_password(&req.current_password)?;
    Ok(no_store(
        st.factors
            .start_passkey(&token, origin.ip, &name, req.passwordless, password)
            .await?,
    ))
}

#[utoipa::path(post, path = "/auth/mfa/passkeys/finish", tag = "second factors", security(("bearer" = [])), request_body = RegistrationFinish,
    responses((status = 201, body = Enrolled, description = "Registered; the first factor of an account comes with its recovery codes"),
              (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_FACTOR (the authenticator's answer does not verify), INVALID_TOKEN (the ceremony too) or REAUTHENTICATION_REQUIRED"),
              (status = 409, body = ErrorBody, description = "CONFLICT: this passkey is registered already"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY")))]
pub async fn finish_passkey(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    JsonBody(req): JsonBody<RegistrationFinish>,
) -> Result<Response, ApiError> {
    let ceremony = parse_opaque("ceremony_token", &req.ceremony_token)?;
    let cred: RegisterPublicKeyCredential = credential("credential", req.credential)?;
    Ok(created(
        st.factors.finish_passkey(&token, &ceremony, &cred).await?,
    ))
}

#[utoipa::path(patch, path = "/auth/mfa/factors/{id}", tag = "second factors", security(("bearer" = [])), request_body = NameRequest,
    params(("id" = String, Path, description = "A factor id")),
    responses((status = 200, body = FactorInfo),
              (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn rename_factor(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    id: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<NameRequest>,
) -> Result<Response, ApiError> {
    let id = factor_id(id)?;
    let name = req.name.unwrap_or_default();
    Ok(Json(st.factors.rename_factor(&token, &id, &name).await?).into_response())
}

#[utoipa::path(delete, path = "/auth/mfa/factors/{id}", tag = "second factors", security(("bearer" = [])),
    params(("id" = String, Path, description = "A factor id")),
    responses((status = 204, description = "Removed (with the last factor, the recovery codes go too)"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN or REAUTHENTICATION_REQUIRED"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn remove_factor(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = factor_id(id)?;
    st.factors.remove_factor(&token, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/auth/mfa/recovery-codes", tag = "second factors", security(("bearer" = [])),
    responses((status = 201, body = RecoveryCodes, description = "A new set; the old one no longer works"),
              (status = 409, body = ErrorBody, description = "CONFLICT: the account has no second factor to stand in for"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN or REAUTHENTICATION_REQUIRED"),
              (status = 403, body = ErrorBody, description = "FIRST_PARTY_ONLY")))]
pub async fn recovery_codes(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
) -> Result<Response, ApiError> {
    Ok(created(st.factors.new_recovery_codes(&token).await?))
}
