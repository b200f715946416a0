//! Extractors: the JSON body (errors name the field), the client IP (proxy
//! headers only from trusted proxies) and the bearer token (the
//! authentication boundary: a handler taking `Bearer` cannot run without a
//! valid token).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;
use crate::domain::input::FieldError;
use crate::domain::sessions::Origin;
use crate::domain::tokens::{bearer_token, Verified};
use crate::domain::AuthError;
pub use crate::server::client_address::{client_ip, ProxyHeader};

/// A JSON body deserialised into `T`; any failure is `400 INVALID_REQUEST`
/// naming the field, or `413` past the body limit. The body must be declared
/// `application/json` (or `application/<x>+json`), else `415`: a web page can
/// make a visitor's browser post `text/plain` or a form to any site without
/// asking it (a CORS "simple request"), never JSON.
pub struct JsonBody<T>(pub T);

/// Whether a `Content-Type` value names JSON.
pub fn is_json(content_type: Option<&header::HeaderValue>) -> bool {
    let Some(mime) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = mime.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge
            } else {
                FieldError::new("body", "could not be read").into()
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(invalid("body", "a JSON object is required".into()));
    }
    // serde would also accept a struct written as an array: only objects are bodies.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() {
            return Err(invalid("body", "malformed JSON".into()));
        }
        return Err(invalid("body", "must be a JSON object".into()));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return invalid("body", format!("malformed JSON ({inner})"));
        }
        let text = inner.to_string();
        let text = text.split(" at line ").next().unwrap_or(&text).to_string();
        if let Some(field) = text
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            return invalid_owned(field.to_string(), "is required".into());
        }
        if path == "." || path.is_empty() {
            invalid("body", format!("must be a JSON object ({text})"))
        } else {
            invalid_owned(path, text)
        }
    })?;
    de.end()
        .map_err(|_| invalid("body", "trailing characters after the JSON value".into()))?;
    Ok(value)
}

fn invalid(field: &'static str, reason: String) -> ApiError {
    invalid_owned(field.to_string(), reason)
}

/// A `400` whose message is `<field>: <reason>`.
fn invalid_owned(field: String, reason: String) -> ApiError {
    ApiError::Auth(AuthError::BadRequest(format!("{field}: {reason}")))
}

/// The client's address: the socket peer, or, when the peer is a trusted
/// proxy, the right-most address of the one header that proxy writes
/// (`trusted_proxy_header`) that is not itself a trusted proxy. Every other
/// forwarding header is the client's own writing and is ignored.
pub struct ClientIp(pub IpAddr);

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        Ok(ClientIp(client_ip(
            peer,
            &parts.headers,
            &state.settings.client_address.trusted_proxies,
            state.settings.client_address.header,
        )))
    }
}

/// The client's address (as [`ClientIp`]) and its `User-Agent`: where a
/// request that starts a session comes from.
pub struct ClientOrigin(pub Origin);

impl FromRequestParts<AppState> for ClientOrigin {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Ok(ClientIp(ip)) = ClientIp::from_request_parts(parts, state).await;
        Ok(ClientOrigin(origin(ip, &parts.headers)))
    }
}

/// The longest `User-Agent` kept with a session.
const MAX_USER_AGENT: usize = 256;

/// `ip` and the request's `User-Agent`: printable ASCII only, trimmed, at
/// most [`MAX_USER_AGENT`] characters; anything else is left out.
pub fn origin(ip: IpAddr, headers: &axum::http::HeaderMap) -> Origin {
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .map(|s| s.chars().take(MAX_USER_AGENT).collect());
    Origin { ip, user_agent }
}

/// A verified access token from `Authorization`.
pub struct Bearer(pub Arc<Verified>);

impl FromRequestParts<AppState> for Bearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let v = verified_bearer(parts, state).await?;
        // A client's own token is no user's: user endpoints refuse it.
        if v.claims.is_client() {
            return Err(ApiError::Auth(AuthError::InvalidToken));
        }
        Ok(Bearer(v))
    }
}

/// A user's token from latchkey's own login (`/auth/*`), not one an OAuth
/// client holds for the user: the authentication of account management
/// (sessions, factors), which a third-party client must not reach with
/// the token it was given to call its own APIs.
pub struct AccountBearer(pub Arc<Verified>);

impl FromRequestParts<AppState> for AccountBearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Bearer(v) = Bearer::from_request_parts(parts, state).await?;
        if v.claims.client_id != crate::domain::sessions::FIRST_PARTY_CLIENT {
            return Err(ApiError::Auth(AuthError::FirstPartyOnly));
        }
        Ok(AccountBearer(v))
    }
}

/// The request's bearer token, verified (signature, claims, revocation).
async fn verified_bearer(parts: &Parts, state: &AppState) -> Result<Arc<Verified>, ApiError> {
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or(ApiError::Auth(AuthError::InvalidToken))?;
    state
        .tokens
        .validate(token)
        .await
        .map_err(|_| ApiError::Auth(AuthError::InvalidToken))
}

/// A query parameter that must be `true` or `false`.
pub fn query_bool(name: &'static str, value: &str) -> Result<bool, FieldError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(FieldError::new(name, "must be true or false")),
    }
}

/// A client token with the admin scope: the authentication of `/admin/*`.
/// No token or an invalid one is `401 INVALID_TOKEN`; a valid token without
/// the scope (any user's, or a client's without it) is `403
/// INSUFFICIENT_SCOPE`.
pub struct AdminToken(pub Arc<Verified>);

impl FromRequestParts<AppState> for AdminToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        use crate::domain::clients::ADMIN_SCOPE;
        let v = verified_bearer(parts, state).await?;
        if !v.claims.has_scope(ADMIN_SCOPE) {
            return Err(ApiError::Auth(AuthError::InsufficientScope(ADMIN_SCOPE)));
        }
        match state.clients.may(&v.claims.client_id, ADMIN_SCOPE).await? {
            Some(true) => Ok(AdminToken(v)),
            Some(false) => Err(ApiError::Auth(AuthError::InsufficientScope(ADMIN_SCOPE))),
            None => Err(ApiError::Auth(AuthError::InvalidToken)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Login {
        email: String,
        password: String,
    }

    fn message(r: Result<Login, ApiError>) -> String {
        match r {
            Err(ApiError::Auth(AuthError::BadRequest(m))) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn json_errors_name_the_field() {
        assert!(message(parse_json(br#"{"email":"a@b"}"#)).starts_with("password: "));
        assert!(message(parse_json(br#"{"email":5,"password":"x"}"#)).starts_with("email: "));
        assert!(message(parse_json(br#"{"email":"#)).starts_with("body: malformed"));
        assert!(message(parse_json(b"[1]")).starts_with("body: "));
        assert!(message(parse_json(b"")).starts_with("body: "));
        assert!(parse_json::<Login>(br#"{"email":"a","password":"b","extra":1}"#).is_ok());
    }
}
