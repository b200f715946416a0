//! Handlers of the admin API (`/admin/*`, docs/api.md): a client token with
//! the `latchkey:admin` scope ([`AdminToken`]) is the only way in.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{query_bool, AdminToken, JsonBody};
use super::AppState;
use crate::domain::admin::{AdminUser, EventFilter, EventPage, UserChange, UserFilter, UserPage, MAX_PAGE};
use crate::domain::clients::ClientRecord;
use crate::domain::input::{parse_name, FieldError};
use crate::domain::oidc::client::{ClientKind, ClientSettings};
use crate::domain::webhooks::{DeliveryPage, NewWebhook, Webhook};
use crate::domain::AuthError;

/// An id from the path; one that does not decode names no account.
fn user_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|_| AuthError::NotFound("user").into())
}

/// Unix milliseconds from an RFC 3339 time (`2026-01-31T12:00:00Z`, UTC).
fn time(name: &'static str, v: &str) -> Result<i64, FieldError> {
    crate::clock::parse_rfc3339(v)
        .ok_or_else(|| FieldError::new(name, "must be an RFC 3339 time in UTC, e.g. 2026-01-31T12:00:00Z"))
}

#[utoipa::path(get, path = "/admin/users", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(
        ("email_prefix" = Option<String>, Query, description = "Emails starting with this (lower case)"),
        ("verified" = Option<bool>, Query, description = "Only verified (true) or unverified (false) accounts"),
        ("disabled" = Option<bool>, Query, description = "Only disabled (true) or enabled (false) accounts"),
        ("created_from" = Option<String>, Query, description = "Created at or after this RFC 3339 time"),
        ("created_before" = Option<String>, Query, description = "Created before this RFC 3339 time"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("limit" = Option<i64>, Query, description = "Accounts per page, 1 to 200 (default 50)"),
    ),
    responses((status = 200, body = UserPage, description = "Accounts in creation order"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn users(
    State(st): State<AppState>,
    _: AdminToken,
    RawQuery(query): RawQuery,
) -> Result<Json<UserPage>, ApiError> {
    let mut filter = UserFilter::default();
    let mut limit = 50;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "email_prefix" => {
                if v.chars().count() > 254 || v.chars().any(char::is_control) {
                    return Err(FieldError::new(
                        "email_prefix",
                        "at most 254 characters, no control characters",
                    )
                    .into());
                }
                filter.email_prefix = Some(v.trim().to_lowercase());
            }
            "verified" => filter.verified = Some(query_bool("verified", &v)?),
            "disabled" => filter.disabled = Some(query_bool("disabled", &v)?),
            "created_from" => filter.created_from = Some(time("created_from", &v)?),
            "created_before" => filter.created_before = Some(time("created_before", &v)?),
            "cursor" => {
                if uuid::Uuid::try_parse(&v).is_err() {
                    return Err(FieldError::new("cursor", "must be a next_cursor of this endpoint").into());
                }
                filter.after = Some(v.into_owned());
            }
            "limit" => limit = page_limit(&v)?,
            _ => {}
        }
    }
    Ok(Json(st.admin.users(&filter, limit).await?))
}

#[utoipa::path(get, path = "/admin/events", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(
        ("kind" = Option<String>, Query, description = "A kind (session.created), or a family ending with a dot (session.)"),
        ("user_id" = Option<String>, Query, description = "Events of one account"),
        ("from" = Option<String>, Query, description = "At or after this RFC 3339 time"),
        ("before" = Option<String>, Query, description = "Before this RFC 3339 time"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("limit" = Option<i64>, Query, description = "Events per page, 1 to 200 (default 50)"),
    ),
    responses((status = 200, body = EventPage, description = "Events, oldest first"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn events(
    State(st): State<AppState>,
    _: AdminToken,
    RawQuery(query): RawQuery,
) -> Result<Json<EventPage>, ApiError> {
    let mut filter = EventFilter::default();
    let mut limit = 50;
    let text = |name: &'static str, v: &str| -> Result<String, FieldError> {
        let ok = !v.is_empty()
            && v.len() <= 128
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
        ok.then(|| v.to_string())
            .ok_or_else(|| FieldError::new(name, "1 to 128 characters of A-Z a-z 0-9 . _ : -"))
    };
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "kind" => filter.kind = Some(text("kind", &v)?),
            "user_id" => filter.user_id = Some(text("user_id", &v)?),
            "from" => filter.from = Some(time("from", &v)?),
            "before" => filter.before = Some(time("before", &v)?),
            "cursor" => {
                let c = v.parse::<i64>().ok().filter(|c| *c >= 0);
                filter.after =
                    Some(c.ok_or_else(|| {
                        FieldError::new("cursor", "must be a next_cursor of this endpoint")
                    })?);
            }
            "limit" => limit = page_limit(&v)?,
            _ => {}
        }
    }
    Ok(Json(st.admin.events(&filter, limit).await?))
}

/// `limit`: 1 to [`MAX_PAGE`].
fn page_limit(v: &str) -> Result<i64, FieldError> {
    v.parse::<i64>()
        .ok()
        .filter(|n| (1..=MAX_PAGE).contains(n))
        .ok_or_else(|| FieldError::new("limit", "must be a number from 1 to 200"))
}

#[utoipa::path(post, path = "/admin/users", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    request_body = crate::domain::import::ImportRecord,
    responses((status = 201, body = AdminUser, description = "Created; a password hash of another system is rehashed to argon2id at the first login"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 409, body = ErrorBody, description = "EMAIL_TAKEN")))]
pub async fn create_user(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    JsonBody(record): JsonBody<crate::domain::import::ImportRecord>,
) -> Result<(StatusCode, Json<AdminUser>), ApiError> {
    let created = st.admin.create_user(&admin.claims.client_id, record).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[utoipa::path(get, path = "/admin/users/{id}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 200, body = AdminUser), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"), (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn user(
    State(st): State<AppState>,
    _: AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<AdminUser>, ApiError> {
    Ok(Json(st.admin.get(&user_id(id)?).await?))
}

/// The fields an administrator may change; a field left out stays.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    /// A display name; `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    name: Option<Option<String>>,
    /// `true` disables the account and ends every session at once.
    disabled: Option<bool>,
    /// A new email: every session ends, the old address is told, and the
    /// account is unverified until the code mailed to the new one is entered
    /// (`POST /auth/verify-otp`).
    email: Option<String>,
}

/// A field that is present (even as `null`) is `Some`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[utoipa::path(patch, path = "/admin/users/{id}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")), request_body = UserPatch,
    responses((status = 200, body = AdminUser, description = "The account after the change"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND"),
              (status = 409, body = ErrorBody, description = "EMAIL_TAKEN: another account has the new email")))]
pub async fn update_user(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
    JsonBody(patch): JsonBody<UserPatch>,
) -> Result<Json<AdminUser>, ApiError> {
    let id = user_id(id)?;
    let name = match patch.name {
        Some(Some(n)) => Some(parse_name("name", Some(&n))?),
        Some(None) => Some(None),
        None => None,
    };
    let email = patch
        .email
        .as_deref()
        .map(|e| crate::domain::input::Email::parse("email", e))
        .transpose()?;
    let change = UserChange {
        name,
        disabled: patch.disabled,
        email,
    };
    Ok(Json(
        st.admin.update_user(&admin.claims.client_id, &id, change).await?,
    ))
}

#[utoipa::path(delete, path = "/admin/users/{id}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 204, description = "Erased: the account, its sessions and codes are gone"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn delete_user(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    st.admin
        .delete_user(&admin.claims.client_id, &user_id(id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/admin/users/{id}/sessions", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 204, description = "Every session of the account ended"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn end_sessions(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    st.admin
        .end_sessions(&admin.claims.client_id, &user_id(id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/admin/users/{id}/factors", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 204, description = "Every second factor and recovery code of the account removed: it logs in with its password alone until it enrols again"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn reset_factors(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    st.factors
        .admin_reset(&admin.claims.client_id, &user_id(id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/admin/users/{id}/unlock", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 204, description = "Every brute-force lock and delay of the account lifted, for every address"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn unlock(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    st.admin.unlock(&admin.claims.client_id, &user_id(id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/admin/users/{id}/password-reset", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "An account id")),
    responses((status = 202, description = "A reset code is mailed (at most one a minute per account)"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn password_reset(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    st.admin
        .password_reset(&admin.claims.client_id, &user_id(id)?)
        .await?;
    Ok(StatusCode::ACCEPTED)
}

/// A webhook to register.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    /// `http://` or `https://`: where the events are POSTed.
    url: String,
    /// Kinds (`user.deleted`) or families (`session.`) of docs/events.md;
    /// left out or empty: every event.
    #[serde(default)]
    kinds: Vec<String>,
}

#[utoipa::path(post, path = "/admin/webhooks", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    request_body = WebhookRequest,
    responses((status = 201, body = NewWebhook, description = "Registered; the secret is shown only now"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn add_webhook(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    JsonBody(req): JsonBody<WebhookRequest>,
) -> Result<(StatusCode, Json<NewWebhook>), ApiError> {
    let created = st
        .webhooks
        .add(&admin.claims.client_id, &req.url, &req.kinds)
        .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[derive(Serialize, ToSchema)]
pub struct WebhookList {
    webhooks: Vec<Webhook>,
}

#[utoipa::path(get, path = "/admin/webhooks", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    responses((status = 200, body = WebhookList), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn webhooks(State(st): State<AppState>, _: AdminToken) -> Result<Json<WebhookList>, ApiError> {
    Ok(Json(WebhookList {
        webhooks: st.webhooks.list().await?,
    }))
}

#[utoipa::path(delete, path = "/admin/webhooks/{id}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "A webhook id")),
    responses((status = 204, description = "Removed, with its pending deliveries"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn remove_webhook(
    State(st): State<AppState>,
    AdminToken(admin): AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Ok(Path(id)) = id else {
        return Err(AuthError::NotFound("webhook").into());
    };
    st.webhooks.remove(&admin.claims.client_id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/admin/webhooks/{id}/deliveries", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "A webhook id"),
           ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
           ("limit" = Option<i64>, Query, description = "Deliveries per page, 1 to 200 (default 50)")),
    responses((status = 200, body = DeliveryPage, description = "Deliveries, newest first"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn webhook_deliveries(
    State(st): State<AppState>,
    _: AdminToken,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<DeliveryPage>, ApiError> {
    let Ok(Path(id)) = id else {
        return Err(AuthError::NotFound("webhook").into());
    };
    let (mut before, mut limit) = (None, 50);
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "cursor" => {
                let c = v.parse::<i64>().ok().filter(|c| *c > 0);
                before =
                    Some(c.ok_or_else(|| {
                        FieldError::new("cursor", "must be a next_cursor of this endpoint")
                    })?);
            }
            "limit" => limit = page_limit(&v)?,
            _ => {}
        }
    }
    Ok(Json(st.webhooks.deliveries(&id, before, limit).await?))
}

/// A client as the admin API shows it (never its secret).
#[derive(Serialize, ToSchema)]
pub struct ClientView {
    client_id: String,
    name: Option<String>,
    /// Scopes of its own tokens (client_credentials).
    scopes: Vec<String>,
    /// RFC 3339, UTC.
    created_at: String,
    /// Its settings for signing users in (docs/oidc.md), if it has some.
    oidc: Option<ClientSettings>,
}

impl From<ClientRecord> for ClientView {
    fn from(c: ClientRecord) -> ClientView {
        ClientView {
            scopes: c
                .scopes
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            created_at: crate::clock::rfc3339(c.created_at),
            oidc: c.oidc.as_deref().and_then(ClientSettings::from_json),
            client_id: c.id,
            name: c.name,
        }
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientRequest {
    /// 1 to 128 characters of `A-Z a-z 0-9 - _ .`.
    client_id: String,
    name: Option<String>,
    /// Scopes of its own tokens (`latchkey:admin` for the admin API).
    #[serde(default)]
    scopes: Vec<String>,
    /// To sign users in with the authorization code flow.
    oidc: Option<ClientSettings>,
}

#[derive(Serialize, ToSchema)]
pub struct NewClient {
    client_id: String,
    /// Shown only now; absent for a public client, which has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
}

#[utoipa::path(post, path = "/admin/clients", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    request_body = ClientRequest,
    responses((status = 201, body = NewClient, description = "Registered; a confidential client's secret is shown only now"),
              (status = 400, body = ErrorBody, description = "INVALID_REQUEST: the message names the field"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 409, body = ErrorBody, description = "CONFLICT: a client has that id")))]
pub async fn add_client(
    State(st): State<AppState>,
    _: AdminToken,
    JsonBody(req): JsonBody<ClientRequest>,
) -> Result<(StatusCode, Json<NewClient>), ApiError> {
    let name = parse_name("name", req.name.as_deref())?;
    let secret = st
        .clients
        .add(&req.client_id, name.as_deref(), &req.scopes, req.oidc.as_ref())
        .await?
        .ok_or(AuthError::Conflict("a client has that id"))?;
    let public = req.oidc.as_ref().is_some_and(|s| s.kind == ClientKind::Public);
    Ok((
        StatusCode::CREATED,
        Json(NewClient {
            client_id: req.client_id,
            client_secret: (!public).then_some(secret),
        }),
    ))
}

#[derive(Serialize, ToSchema)]
pub struct ClientList {
    clients: Vec<ClientView>,
}

#[utoipa::path(get, path = "/admin/clients", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    responses((status = 200, body = ClientList), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE")))]
pub async fn clients(State(st): State<AppState>, _: AdminToken) -> Result<Json<ClientList>, ApiError> {
    let list = st.clients.list().await?;
    Ok(Json(ClientList {
        clients: list.into_iter().map(ClientView::from).collect(),
    }))
}

fn client_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|_| AuthError::NotFound("client").into())
}

#[utoipa::path(get, path = "/admin/clients/{id}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "A client id")),
    responses((status = 200, body = ClientView), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"), (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn client(
    State(st): State<AppState>,
    _: AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ClientView>, ApiError> {
    let id = client_id(id)?;
    let c = st.clients.get(&id).await?.ok_or(AuthError::NotFound("client"))?;
    Ok(Json(c.into()))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientOidcRequest {
    /// The new settings; `null`: the client no longer signs users in.
    oidc: Option<ClientSettings>,
}

#[utoipa::path(put, path = "/admin/clients/{id}/oidc", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "A client id")), request_body = ClientOidcRequest,
    responses((status = 204, description = "Replaced; sign-ins under way are held to the new settings"),
              (status = 400, body = ErrorBody, description = "INVALID_REQUEST"), (status = 401, body = ErrorBody, description = "INVALID_TOKEN"),
              (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"), (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn set_client_oidc(
    State(st): State<AppState>,
    _: AdminToken,
    id: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<ClientOidcRequest>,
) -> Result<StatusCode, ApiError> {
    let id = client_id(id)?;
    if !st.clients.set_oidc(&id, req.oidc.as_ref()).await? {
        return Err(AuthError::NotFound("client").into());
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/admin/clients/{id}", tag = "admin", security(("oauth2" = ["latchkey:admin"])),
    params(("id" = String, Path, description = "A client id")),
    responses((status = 204, description = "Removed; the sessions it held for users and its own tokens end at once"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN"), (status = 403, body = ErrorBody, description = "INSUFFICIENT_SCOPE"),
              (status = 404, body = ErrorBody, description = "NOT_FOUND")))]
pub async fn remove_client(
    State(st): State<AppState>,
    _: AdminToken,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = client_id(id)?;
    if !st.clients.remove(&id).await? {
        return Err(AuthError::NotFound("client").into());
    }
    Ok(StatusCode::NO_CONTENT)
}
