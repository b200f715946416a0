//! The JSON side of signing in with other providers (docs/federation.md):
//! a user's linked identities (`/auth/identities`), and the administrator's
//! upstreams and links (`/admin/upstreams`, `/admin/users/{id}/identities`).
//! The browser's way through an upstream is in `oidc/upstream.rs`.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::extract::{AccountBearer, AdminToken, ClientOrigin, JsonBody};
use super::oidc::upstream::with_journey;
use super::AppState;
use crate::domain::federation::{FederationError, IdentityView, NewUpstream, Protocol, UpstreamView};
use crate::domain::AuthError;

#[derive(Serialize, ToSchema)]
pub struct IdentityList {
    identities: Vec<IdentityView>,
    /// The upstreams an identity can be linked from (`POST /auth/identities`;
    /// in the owner's list only).
    #[serde(skip_serializing_if = "Option::is_none")]
    upstreams: Option<Vec<UpstreamName>>,
}

#[derive(Serialize, ToSchema)]
pub struct UpstreamName {
    name: String,
    display_name: String,
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
        upstreams: Some(
            st.federation
                .listed()
                .iter()
                .map(|u| UpstreamName {
                    name: u.name.clone(),
                    display_name: u.display_name.clone(),
                })
                .collect(),
        ),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkRequest {
    /// The upstream's name.
    upstream: String,
    /// The account's password (not for an account without one).
    #[schema(schema_with = super::schema::current_password)]
    current_password: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct LinkDeparture {
    /// Where to send the browser: the upstream's authorization endpoint.
    /// The way back ends on `/ui/account?linked={name}` or
    /// `?link_error={linked_elsewhere|disabled|journey|failed}`.
    url: String,
}

/// `POST /auth/identities`: starts linking an identity of an upstream to
/// the caller's account. The answer sets the journey's cookie; the browser
/// that made the call goes to `url` and comes back through the upstream's
/// callback. Takes a recent sign-in (with the second factor when the
/// account has one) and the current password, as adding a factor does.
#[utoipa::path(post, path = "/auth/identities", tag = "federation", security(("bearer" = [])),
    request_body = LinkRequest,
    responses((status = 200, body = LinkDeparture, description = "With the journey's cookie"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN, REAUTHENTICATION_REQUIRED, INVALID_CREDENTIALS (the current password)"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND: no such upstream"),
              (status = 429, body = ErrorBody, description = "RATE_LIMITED"),
              (status = 502, body = ErrorBody, description = "UPSTREAM_FAILED: it cannot be reached")))]
pub async fn start_link(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    AccountBearer(token): AccountBearer,
    JsonBody(req): JsonBody<LinkRequest>,
) -> Result<Response, ApiError> {
    let password = req
        .current_password
        .as_deref()
        .map(super::accounts::current_password)
        .transpose()?;
    let d = match st
        .federation
        .depart_to_link(&req.upstream, &token, password, &origin, crate::clock::now_ms())
        .await
    {
        Ok(d) => d,
        Err(FederationError::Auth(e)) => return Err(e.into()),
        Err(FederationError::UnknownUpstream) => return Err(AuthError::NotFound("upstream").into()),
        Err(e) => {
            tracing::warn!(error = %e, "leaving for an upstream to link failed");
            return Err(ApiError::UpstreamFailed);
        }
    };
    let url = d.url.clone();
    Ok(with_journey(&st, Json(LinkDeparture { url }).into_response(), &d))
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
    /// The claim that carries the address (default `email`).
    #[serde(default)]
    email_claim: String,
    /// The claim that carries the name of an account made (default `name`).
    #[serde(default)]
    name_claim: String,
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
        email_claim: req.email_claim,
        name_claim: req.name_claim,
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
        upstreams: None,
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

/// An application with its own pages starts a sign-in through an upstream.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AppStart {
    /// Where the browser comes back: one of the setting `upstream_return_urls`, exactly.
    redirect_to: String,
    /// BASE64URL(SHA-256(code_verifier)) (RFC 7636).
    code_challenge: String,
    /// `S256`, the only one taken.
    code_challenge_method: Option<String>,
    /// Given back on `redirect_to` as it came (at most 512 bytes).
    state: Option<String>,
}

/// `GET /auth/upstream/{name}`: the start of the JSON pair for
/// applications with their own pages (docs/federation.md). The browser is
/// sent here (a navigation, not a `fetch`), leaves for the upstream with
/// the journey's cookie, and comes back to `redirect_to` with `code` (or
/// `error`) and `state`; the application redeems the code with its PKCE
/// verifier at `POST /auth/upstream/token`.
#[utoipa::path(get, path = "/auth/upstream/{name}", tag = "federation",
    params(("name" = String, Path, description = "An upstream's name"), AppStart),
    responses((status = 303, description = "To the upstream, with the journey's cookie; or to `redirect_to` with `error` when the upstream cannot be left for"),
              (status = 400, body = ErrorBody, description = "INVALID_REQUEST: a `redirect_to` not configured, a bad challenge (never redirected)")))]
pub async fn app_depart(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<AppStart>, QueryRejection>,
) -> Result<Response, ApiError> {
    let name = segment(name, "upstream")?;
    let Query(q) = query.map_err(|e| AuthError::BadRequest(e.body_text()))?;
    if q.code_challenge_method.as_deref().is_some_and(|m| m != "S256") {
        return Err(AuthError::BadRequest("code_challenge_method: S256 only".into()).into());
    }
    let departed = st
        .federation
        .depart_for_app(
            &name,
            &q.redirect_to,
            &q.code_challenge,
            q.state.as_deref(),
            &origin,
            crate::clock::now_ms(),
        )
        .await;
    let error = match departed {
        Ok(d) => {
            let to = (StatusCode::SEE_OTHER, [(header::LOCATION, d.url.clone())]).into_response();
            return Ok(with_journey(&st, to, &d));
        }
        Err(FederationError::Auth(e @ AuthError::BadRequest(_))) => return Err(e.into()),
        Err(FederationError::UnknownUpstream) => "unknown_upstream",
        Err(FederationError::Auth(AuthError::RateLimited(_))) => "rate_limited",
        Err(e) => {
            tracing::warn!(error = %e, "leaving for an upstream failed");
            "upstream_failed"
        }
    };
    if !st.federation.may_return_to(&q.redirect_to) {
        return Err(AuthError::BadRequest("redirect_to: not one of upstream_return_urls".into()).into());
    }
    let mut back =
        url::Url::parse(&q.redirect_to).map_err(|_| AuthError::BadRequest("redirect_to".into()))?;
    back.query_pairs_mut().append_pair("error", error);
    if let Some(s) = &q.state {
        back.query_pairs_mut().append_pair("state", s);
    }
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, String::from(back))]).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppCodeRequest {
    /// The `code` given to `redirect_to`.
    code: String,
    /// The PKCE verifier of the start's `code_challenge`.
    code_verifier: String,
}

/// `POST /auth/upstream/token`: the end of the JSON pair: the code and
/// its verifier, answered as `POST /auth/login` answers (tokens, or
/// `MFA_REQUIRED` with the step up to the account's second factor).
#[utoipa::path(post, path = "/auth/upstream/token", tag = "federation", request_body = AppCodeRequest,
    responses((status = 200, body = crate::domain::sessions::TokenPair),
              (status = 400, body = ErrorBody, description = "INVALID_REQUEST: a code unknown, spent, older than a minute, or not this verifier's (each spends it)"),
              (status = 401, body = ErrorBody, description = "MFA_REQUIRED: the body adds a StepUp for POST /auth/mfa/verify"),
              (status = 403, body = ErrorBody, description = "ACCOUNT_DISABLED")))]
pub async fn app_token(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    JsonBody(req): JsonBody<AppCodeRequest>,
) -> Result<Response, ApiError> {
    let pair = st
        .federation
        .redeem(&req.code, &req.code_verifier, &origin)
        .await?;
    Ok(super::accounts::token_response(pair))
}
