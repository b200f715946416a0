//! OAuth 2.0 endpoints (RFC 6749 token, RFC 7662 introspection, RFC 7009
//! revocation): form-encoded, with client authentication, and RFC 6749 error
//! bodies.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use utoipa::ToSchema;

use super::accounts::token_response;
use super::extract::ClientIp;
use super::schema;
use super::AppState;
use crate::domain::clients::ClientRecord;
use crate::domain::input::{parse_opaque, Email, Password};
use crate::domain::sessions::FIRST_PARTY_CLIENT;
use crate::domain::AuthError;

/// An RFC 6749 §5.2 error.
pub struct OAuthError {
    status: StatusCode,
    error: &'static str,
    description: String,
    retry_after: Option<u64>,
}

impl OAuthError {
    fn new(status: StatusCode, error: &'static str, description: impl Into<String>) -> Self {
        OAuthError {
            status,
            error,
            description: description.into(),
            retry_after: None,
        }
    }

    fn invalid_request(d: impl Into<String>) -> Self {
        OAuthError::new(StatusCode::BAD_REQUEST, "invalid_request", d)
    }
}

impl From<AuthError> for OAuthError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Invalid(f) => OAuthError::invalid_request(f.to_string()),
            AuthError::BadRequest(m) => OAuthError::invalid_request(m),
            AuthError::InvalidCredentials => OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_grant",
                "invalid username or password",
            ),
            AuthError::VerificationPending => OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_grant",
                "the email address is not verified",
            ),
            AuthError::InvalidScope => OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_scope",
                "the client may not have the scope asked for, or has none",
            ),
            AuthError::SecondFactorRequired(_) => OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_grant",
                "the account has a second factor: the password grant cannot pass it",
            ),
            AuthError::AccountDisabled => OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_grant",
                "the account is disabled",
            ),
            AuthError::InvalidOtp
            | AuthError::EmailTaken
            | AuthError::InvalidToken
            | AuthError::NotFound(_)
            | AuthError::FirstPartyOnly
            | AuthError::Conflict(_)
            | AuthError::InvalidFactor { .. }
            | AuthError::ReauthenticationRequired { .. }
            | AuthError::InsufficientScope(_) => OAuthError::new(
                StatusCode::BAD_REQUEST,
                "invalid_grant",
                "the grant is invalid, expired or revoked",
            ),
            AuthError::InvalidClient => OAuthError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "client authentication failed",
            ),
            AuthError::TooManyAttempts { retry_after } => OAuthError {
                retry_after: retry_after.or(Some(1)),
                ..OAuthError::new(StatusCode::TOO_MANY_REQUESTS, "slow_down", "too many attempts")
            },
            AuthError::RateLimited(l) => OAuthError {
                retry_after: Some(l.retry_after_secs),
                ..OAuthError::new(StatusCode::TOO_MANY_REQUESTS, "slow_down", "too many requests")
            },
            AuthError::Overloaded { retry_after } => OAuthError {
                retry_after: Some(retry_after),
                ..OAuthError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporarily_unavailable",
                    "the service is busy",
                )
            },
            AuthError::Unavailable(_) => OAuthError {
                retry_after: Some(1),
                ..OAuthError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporarily_unavailable",
                    "the service cannot reach its database right now",
                )
            },
            AuthError::StorageFull => OAuthError {
                retry_after: Some(30),
                ..OAuthError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporarily_unavailable",
                    "the service's storage is full",
                )
            },
            AuthError::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                OAuthError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "internal error",
                )
            }
        }
    }
}

impl IntoResponse for OAuthError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.error, "error_description": self.description});
        let mut r = (self.status, Json(body)).into_response();
        let h = r.headers_mut();
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.status == StatusCode::UNAUTHORIZED {
            h.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"latchkey\""),
            );
        }
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s.max(1)));
        }
        r
    }
}

type Form = HashMap<String, String>;

/// The parameters these endpoints read.
const KNOWN_PARAMETERS: [&str; 12] = [
    "grant_type",
    "code",
    "redirect_uri",
    "code_verifier",
    "scope",
    "username",
    "password",
    "refresh_token",
    "token",
    "token_type_hint",
    "client_id",
    "client_secret",
];

fn parse_form(headers: &HeaderMap, body: &[u8]) -> Result<Form, OAuthError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct
        .to_ascii_lowercase()
        .starts_with("application/x-www-form-urlencoded")
    {
        return Err(OAuthError::invalid_request(
            "the body must be application/x-www-form-urlencoded",
        ));
    }
    let mut form = Form::new();
    for (k, v) in url::form_urlencoded::parse(body) {
        // RFC 6749 §3.2: parameters must not be repeated; unknown ones
        // are ignored (the first stays).
        let known = KNOWN_PARAMETERS.contains(&k.as_ref());
        if form.contains_key(k.as_ref()) {
            if known {
                return Err(OAuthError::invalid_request(format!("{k}: repeated parameter")));
            }
            continue;
        }
        form.insert(k.to_string(), v.to_string());
    }
    Ok(form)
}

fn required<'a>(form: &'a Form, name: &str) -> Result<&'a str, OAuthError> {
    form.get(name)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| OAuthError::invalid_request(format!("{name}: is required")))
}

fn has_client_credentials(headers: &HeaderMap, form: &Form) -> bool {
    headers.contains_key(header::AUTHORIZATION) || form.contains_key("client_id")
}

/// Client authentication: HTTP Basic (RFC 6749 §2.3.1) or body parameters.
async fn authenticate_client(
    st: &AppState,
    headers: &HeaderMap,
    form: &Form,
) -> Result<ClientRecord, OAuthError> {
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
        .map(|(_, rest)| rest.trim());
    let (id, secret) = match basic {
        Some(b64) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    OAuthError::new(
                        StatusCode::UNAUTHORIZED,
                        "invalid_client",
                        "malformed Basic credentials",
                    )
                })?;
            let (id, secret) = decoded.split_once(':').ok_or_else(|| {
                OAuthError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "malformed Basic credentials",
                )
            })?;
            let dec = |s: &str| {
                url::form_urlencoded::parse(format!("x={s}").as_bytes())
                    .next()
                    .map(|(_, v)| v.to_string())
            };
            (dec(id).unwrap_or_default(), dec(secret).unwrap_or_default())
        }
        None => match (form.get("client_id"), form.get("client_secret")) {
            (Some(id), Some(secret)) => (id.clone(), secret.clone()),
            _ => {
                return Err(OAuthError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "client authentication is required",
                ))
            }
        },
    };
    Ok(st.clients.authenticate(&id, &secret).await?)
}

/// `grant_type=password` (RFC 6749 §4.3).
#[derive(serde::Deserialize, ToSchema)]
#[allow(dead_code)] // the document's shape; the handler reads the form itself
pub struct PasswordGrant {
    #[schema(schema_with = grant_password)]
    grant_type: String,
    #[schema(schema_with = schema::email)]
    username: String,
    #[schema(schema_with = schema::password)]
    password: String,
    /// With `client_secret`, instead of HTTP Basic.
    client_id: Option<String>,
    client_secret: Option<String>,
}

/// `grant_type=refresh_token` (RFC 6749 §6).
#[derive(serde::Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct RefreshGrant {
    #[schema(schema_with = grant_refresh)]
    grant_type: String,
    #[schema(schema_with = schema::refresh_token)]
    refresh_token: String,
    client_id: Option<String>,
    client_secret: Option<String>,
}

#[derive(serde::Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum TokenRequest {
    Password(PasswordGrant),
    Refresh(RefreshGrant),
    ClientCredentials(ClientCredentialsGrant),
}

/// `grant_type=client_credentials` (RFC 6749 §4.4): the client's own token.
#[derive(serde::Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct ClientCredentialsGrant {
    #[schema(schema_with = grant_client_credentials)]
    grant_type: String,
    /// Space-separated; left out: every scope the client may have.
    scope: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
}

/// An introspection or revocation request (RFC 7662 §2.1, RFC 7009 §2.1).
#[derive(serde::Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct TokenQuery {
    #[schema(min_length = 1)]
    token: String,
    /// `access_token` or `refresh_token`: where to look first.
    token_type_hint: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
}

fn one_value(v: &str) -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some([v]))
        .build()
}

fn grant_password() -> utoipa::openapi::schema::Object {
    one_value("password")
}

fn grant_refresh() -> utoipa::openapi::schema::Object {
    one_value("refresh_token")
}

fn grant_client_credentials() -> utoipa::openapi::schema::Object {
    one_value("client_credentials")
}

/// A client's token is a credential too: never cached.
fn client_token_response(token: crate::domain::clients::ClientToken) -> Response {
    no_store(Json(token).into_response())
}

/// Tokens are never cached (RFC 6749 §5.1).
fn no_store(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    r
}

#[utoipa::path(post, path = "/oauth/token", tag = "oauth", security(("client_basic" = [])),
    request_body(content = TokenRequest, content_type = "application/x-www-form-urlencoded", description = "With client_id/client_secret or HTTP Basic"),
    responses((status = 200, body = crate::domain::sessions::TokenPair, description = "A token pair; for client_credentials a ClientToken (no refresh token)"),
              (status = 400, description = "RFC 6749 error: invalid_request, invalid_grant, invalid_scope, unauthorized_client, unsupported_grant_type"),
              (status = 401, description = "invalid_client"), (status = 429, description = "slow_down"), (status = 503, description = "temporarily_unavailable")))]
pub async fn token(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match token_inner(&st, ip, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn token_inner(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, OAuthError> {
    let form = parse_form(headers, body)?;
    let grant = required(&form, "grant_type")?;
    // A public client (no secret) names itself with client_id, and only
    // for the grants of the authorization code flow (RFC 6749 §2.1).
    let public = !headers.contains_key(header::AUTHORIZATION)
        && !form.contains_key("client_secret")
        && matches!(grant, "authorization_code" | "refresh_token");
    let client = if public {
        let id = form.get("client_id").map(String::as_str).unwrap_or("");
        st.provider.public_client(id).await?
    } else {
        authenticate_client(st, headers, &form).await?
    };
    let origin = super::extract::origin(ip, headers);
    let pair = match grant {
        "authorization_code" => {
            let code = required(&form, "code")?;
            // May be left out when the request had PKCE (`judge`).
            let redirect_uri = form.get("redirect_uri").map(String::as_str).filter(|v| !v.is_empty());
            let verifier = form.get("code_verifier").map(String::as_str).filter(|v| !v.is_empty());
            let tokens = st
                .provider
                .exchange(&client, code, redirect_uri, verifier, &origin)
                .await?;
            return Ok(no_store(Json(tokens).into_response()));
        }
        "password" if !st.provider.settings().password_grant => {
            return Err(OAuthError::new(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                "the password grant is off (RFC 9700 §2.4); an operator may turn it on for a migration: oauth_password_grant",
            ))
        }
        "password" => {
            let email = Email::parse("username", required(&form, "username")?).map_err(AuthError::from)?;
            let password =
                Password::parse("password", required(&form, "password")?).map_err(AuthError::from)?;
            st.login
                .password(&origin, email, password, Some(&client.id))
                .await?
        }
        "refresh_token" => {
            let token =
                parse_opaque("refresh_token", required(&form, "refresh_token")?).map_err(AuthError::from)?;
            let settings = client
                .oidc
                .as_deref()
                .and_then(crate::domain::oidc::client::ClientSettings::from_json);
            // The client's registration as it is now: one whose
            // `refresh_token` grant was taken away refreshes no more.
            if settings.as_ref().is_some_and(|s| !s.allows("refresh_token")) {
                return Err(OAuthError::new(
                    StatusCode::BAD_REQUEST,
                    "unauthorized_client",
                    "this client may no longer use the refresh_token grant",
                ));
            }
            // A client with an access-token lifetime of its own keeps it.
            let access_ttl = settings.and_then(|s| s.access_ttl());
            st.sessions
                .refresh_for_client(&token, &client.id, access_ttl)
                .await?
        }
        "client_credentials" => {
            let scope = form.get("scope").map(String::as_str);
            let token = st.clients.token(&client, scope)?;
            return Ok(client_token_response(token));
        }
        other => {
            return Err(OAuthError::new(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                format!("grant_type {other:?} is not supported"),
            ))
        }
    };
    Ok(token_response(pair))
}

#[utoipa::path(post, path = "/oauth/introspect", tag = "oauth", security(("client_basic" = [])),
    request_body(content = TokenQuery, content_type = "application/x-www-form-urlencoded", description = "With client authentication"),
    responses((status = 200, description = "{\"active\":true, ...claims} or {\"active\":false}"), (status = 400, description = "invalid_request"),
              (status = 401, description = "invalid_client")))]
pub async fn introspect(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        let form = parse_form(&headers, &body)?;
        let caller = authenticate_client(&st, &headers, &form).await?;
        let token = required(&form, "token")?;
        let hint = form.get("token_type_hint").map(String::as_str);
        let inactive = serde_json::json!({"active": false});
        let as_access = || async {
            match st.tokens.validate(token).await {
                Ok(v) => {
                    let mut doc = serde_json::to_value(&v.claims).unwrap_or_default();
                    doc["active"] = true.into();
                    doc["token_type"] = "Bearer".into();
                    Some(doc)
                }
                Err(_) => None,
            }
        };
        // RFC 7662 §4: access tokens are for resource servers, so any
        // authenticated client may introspect them; a refresh token only by
        // the client it was issued to (first-party ones by none), or one
        // client would learn the users and sessions of another.
        let as_refresh = || async {
            let info = st.sessions.introspect_refresh(token, &caller.id).await.ok()??;
            let mut doc = serde_json::json!({
                "active": true, "token_type": "refresh_token", "sub": info.user_id, "sid": info.session_id,
                "client_id": info.client_id, "exp": info.expires_at / 1000, "iss": st.tokens.issuer(),
            });
            // Left out when the client may not see it (no `email` scope).
            if !info.email.is_empty() {
                doc["email"] = info.email.into();
            }
            Some(doc)
        };
        let doc = if hint == Some("refresh_token") {
            match as_refresh().await {
                Some(d) => Some(d),
                None => as_access().await,
            }
        } else {
            match as_access().await {
                Some(d) => Some(d),
                None => as_refresh().await,
            }
        };
        Ok::<_, OAuthError>(Json(doc.unwrap_or(inactive)).into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

#[utoipa::path(post, path = "/oauth/revoke", tag = "oauth", security((), ("client_basic" = [])),
    request_body(content = TokenQuery, content_type = "application/x-www-form-urlencoded", description = "Client authentication is optional: without it, only first-party tokens are revoked"),
    responses((status = 200, description = "Revoked, or nothing to revoke"), (status = 400, description = "invalid_request"),
              (status = 401, description = "invalid_client")))]
pub async fn revoke(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        let form = parse_form(&headers, &body)?;
        // docs/api.md: "200 always". Whoever holds a token may end its session (as
        // /auth/logout allows), so client credentials are optional here; when
        // given, they must be right (RFC 7009 §2.1).
        // A public client (no secret) names itself with client_id, and
        // revokes its own tokens so (RFC 7009 §5: its logout).
        let public = !headers.contains_key(header::AUTHORIZATION) && !form.contains_key("client_secret");
        let caller = match form.get("client_id") {
            Some(id) if public => Some(st.provider.public_client(id).await?),
            _ if has_client_credentials(&headers, &form) => {
                Some(authenticate_client(&st, &headers, &form).await?)
            }
            _ => None,
        };
        let token = required(&form, "token")?;
        // RFC 7009 §2.1: a client revokes only tokens issued to it. First-party
        // sessions end for whoever holds their token (as /auth/logout); a
        // token of another client is left alone, with the same 200.
        let caller = caller.as_ref().map(|c| c.id.as_str());
        // A refresh token ends its session; so does an access token (RFC 7009 §2, optional).
        if let Ok(t) = parse_opaque("token", token) {
            st.sessions.revoke_refresh_token(&t, caller).await?;
        }
        if let Ok(v) = st.tokens.validate(token).await {
            let owner = (v.claims.client_id != FIRST_PARTY_CLIENT).then_some(v.claims.client_id.as_str());
            if owner.is_none() || owner == caller {
                st.sessions.revoke_session_of(&v.claims.sid).await?;
            }
        }
        Ok::<_, OAuthError>(StatusCode::OK.into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}
