//! The JSON side of signing in with other providers (docs/federation.md):
//! a user's linked identities (`/auth/identities`), and the administrator's
//! upstreams and links (`/admin/upstreams`, `/admin/users/{id}/identities`).
//! The browser's way through an upstream is in `oidc/upstream.rs`.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{AccountBearer, AdminToken, JsonBody};
use super::AppState;
use crate::domain::federation::{IdentityView, NewUpstream, Protocol, UpstreamView};
use crate::domain::AuthError;

#[derive(Serialize, ToSchema)]
pub struct IdentityList {
    identities: Vec<IdentityView>,
}

/// A path segment, or `NOT_FOUND` for one that does not decode.
fn segment(p: Result<Path<String>, PathRejection>, what: &'static str) -> Result<String, ApiError> {
    p.map(|Path(s)| s).map_err(|_| AuthError::NotFound(what).into())
}

/// `GET /auth/identities`: the caller's linked upstream identities.
#[utoipa::path(get, path = "/auth/identities", tag = "federation", security(("bearer" = [])),
    responses((status = 200, body = IdentityList), (status = 401, body = ErrorBody, description = "INVALID_TOKEN")))]
pub async fn identities(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
) -> Result<Json<IdentityList>, ApiError> {
    Ok(Json(IdentityList {
        identities: st.federation.identities(&token.claims.sub).await?,
    }))
}

/// `DELETE /auth/identities/{id}`: unlinks one of the caller's.
#[utoipa::path(delete, path = "/auth/identities/{id}", tag = "federation", security(("bearer" = [])),
    params(("id" = String, Path, description = "An identity's id (from the list)")),
    responses((status = 204, description = "Unlinked"), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND"),
              (status = 409, body = ErrorBody, description = "CONFLICT: the account's last way to sign in")))]
pub async fn unlink(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = segment(id, "identity")?;
    st.federation.unlink(&token.claims.sub, &id, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize, ToSchema)]
pub struct UpstreamList {
    upstreams: Vec<UpstreamView>,
}

#[utoipa::path(get, path = "/admin/upstreams", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    responses((status = 200, body = UpstreamList), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn upstreams(State(st): State<AppState>, _: AdminToken) -> Result<Json<UpstreamList>, ApiError> {
    Ok(Json(UpstreamList {
        upstreams: st.federation.list().await?,
    }))
}

/// An upstream provider to add.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamRequest {
    /// Its name in URLs: 1 to 32 of a-z, 0-9 and `-`.
    name: String,
    /// "Continue with ..."; the name if left out.
    display_name: Option<String>,
    /// Its discovery document is ISSUER/.well-known/openid-configuration;
    /// for `github`, github.com unless given (a GitHub
    /// Enterprise Server's URL).
    #[serde(default)]
    issuer: String,
    client_id: String,
    /// Stored sealed; never shown again.
    client_secret: String,
    /// Space-separated; an OpenID Provider is always asked `openid`
    /// (default `openid email profile`; for `github`, `read:user user:email`).
    scopes: Option<String>,
    /// A new person whose verified address no account has gets an account.
    #[serde(default)]
    may_create: bool,
    /// Believe its `email_verified` (docs/federation.md says when).
    #[serde(default)]
    trusts_email_verified: bool,
    /// `oidc` (default) or `github`.
    #[serde(default)]
    protocol: Option<Protocol>,
    /// Its `amr` value `mfa` counts as the second factor (an OpenID
    /// Provider only; docs/federation.md says when).
    #[serde(default)]
    trusts_mfa: bool,
}

#[utoipa::path(post, path = "/admin/upstreams", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    request_body = UpstreamRequest,
    responses((status = 201, body = UpstreamView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 409, body = ErrorBody, description = "CONFLICT: the name is taken")))]
pub async fn add_upstream(
    State(st): State<AppState>,
    _: AdminToken,
    JsonBody(req): JsonBody<UpstreamRequest>,
) -> Result<(StatusCode, Json<UpstreamView>), ApiError> {
    let u = NewUpstream {
        display_name: req.display_name.unwrap_or_else(|| req.name.clone()),
        name: req.name,
        issuer: req.issuer,
        client_id: req.client_id,
        client_secret: req.client_secret,
        scopes: req.scopes.unwrap_or_default(),
        may_create: req.may_create,
        trusts_email_verified: req.trusts_email_verified,
        protocol: req.protocol.unwrap_or(Protocol::Oidc),
        trusts_mfa: req.trusts_mfa,
    };
    let name = u.name.clone();
    if !st.federation.add(u, crate::clock::now_ms()).await? {
        return Err(AuthError::Conflict("an upstream has this name").into());
    }
    let view = st
        .federation
        .list()
        .await?
        .into_iter()
        .find(|u| u.name == name)
        .ok_or(AuthError::NotFound("upstream"))?;
    Ok((StatusCode::CREATED, Json(view)))
}

#[utoipa::path(delete, path = "/admin/upstreams/{name}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("name" = String, Path)),
    responses((status = 204, description = "Removed; the identities linked through it stay linked"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn remove_upstream(
    State(st): State<AppState>,
    _: AdminToken,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = segment(name, "upstream")?;
    if !st.federation.remove(&name).await? {
        return Err(AuthError::NotFound("upstream").into());
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/users/{id}/identities", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 200, body = IdentityList), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn user_identities(
    State(st): State<AppState>,
    _: AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<IdentityList>, ApiError> {
    let user = segment(id, "user")?;
    Ok(Json(IdentityList {
        identities: st.federation.identities(&user).await?,
    }))
}

#[utoipa::path(delete, path = "/admin/users/{id}/identities/{identity}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id"), ("identity" = String, Path, description = "An identity's id")),
    responses((status = 204, description = "Unlinked"), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"), (status = 404, body = ErrorBody, description = "NOT_FOUND"),
              (status = 409, body = ErrorBody, description = "CONFLICT: the account's last way to sign in")))]
pub async fn unlink_user_identity(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Ok(Path((user, identity))) = ids else {
        return Err(AuthError::NotFound("identity").into());
    };
    st.federation
        .unlink(&user, &identity, Some(&admin.claims.client_id))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
