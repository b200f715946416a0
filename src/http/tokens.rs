//! Handlers of the Tokens section: validation, JWKS and discovery.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::{invalid_token, rate_limited, ErrorBody};
use super::extract::ClientIp;
use super::pages::i18n::Lang;
use super::AppState;
use crate::domain::tokens::{bearer_token, AccessClaims};
use crate::limits::PolicyName;

/// The hot path: a cache hit costs a hash, a lookup and a revocation check.
#[utoipa::path(get, path = "/auth/validate", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, body = AccessClaims, description = "The token's claims"),
              (status = 401, body = ErrorBody, description = "INVALID_TOKEN, with WWW-Authenticate")))]
pub async fn validate(State(st): State<AppState>, ClientIp(ip): ClientIp, req: Request) -> Response {
    // Unlimited by default; `rate_limit_validate` turns a per-IP limit on.
    if st.limiter.is_active(PolicyName::Validate) {
        if let Err(l) = st
            .limiter
            .check(PolicyName::Validate, st.limiter.ip_key(ip).as_str())
            .await
        {
            return rate_limited(&l);
        }
    }
    // The request itself, not a `HeaderMap` extractor: that would copy
    // every header on the hottest path.
    let Some(token) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
    else {
        return invalid_token();
    };
    match st.tokens.validate(token).await {
        Ok(v) => {
            let mut r = Response::new(Body::from(v.json.clone()));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(_) => invalid_token(),
    }
}

#[utoipa::path(get, path = "/.well-known/jwks.json", tag = "tokens",
    responses((status = 200, description = "JWK Set of every key whose tokens may still be valid")))]
pub async fn jwks(State(st): State<AppState>) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/jwk-set+json"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=60"),
            ),
        ],
        st.tokens.jwks(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/.well-known/openid-configuration", tag = "tokens",
    responses((status = 200, description = "Discovery document (RFC 8414 / OpenID Connect Discovery)")))]
pub async fn discovery(State(st): State<AppState>) -> Response {
    let iss = st.tokens.issuer();
    let mut grants = vec!["authorization_code", "refresh_token", "client_credentials"];
    if st.provider.settings().password_grant {
        grants.push("password");
    }
    // The OpenID scopes only: the admin API's scope is for the operator's
    // service clients, and listing it would name it to anyone (RFC 8414
    // §2 lets a server leave scopes it supports unlisted).
    let scopes: Vec<&str> = crate::domain::oidc::client::OIDC_SCOPES.to_vec();
    let doc = serde_json::json!({
        "issuer": iss,
        "authorization_endpoint": format!("{iss}/oauth/authorize"),
        "token_endpoint": format!("{iss}/oauth/token"),
        "userinfo_endpoint": format!("{iss}/oauth/userinfo"),
        "end_session_endpoint": format!("{iss}/oauth/logout"),
        "jwks_uri": format!("{iss}/.well-known/jwks.json"),
        "introspection_endpoint": format!("{iss}/oauth/introspect"),
        "revocation_endpoint": format!("{iss}/oauth/revoke"),
        "grant_types_supported": grants,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "scopes_supported": scopes,
        "subject_types_supported": ["public"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
        "introspection_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "revocation_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "id_token_signing_alg_values_supported": st.provider.id_token_algorithms(),
        "access_token_signing_alg_values_supported": crate::domain::tokens::signing_algorithms(),
        "claims_supported": ["sub", "iss", "aud", "exp", "iat", "auth_time", "nonce", "acr", "amr", "sid", "azp",
                             "at_hash", "email", "email_verified", "name"],
        "acr_values_supported": [crate::domain::tokens::ACR_SINGLE, crate::domain::tokens::ACR_MFA],
        "prompt_values_supported": ["none", "login", "consent", "select_account"],
        "authorization_response_iss_parameter_supported": true,
        "claims_parameter_supported": false,
        "request_parameter_supported": false,
        "request_uri_parameter_supported": false,
        "require_request_uri_registration": false,
        "frontchannel_logout_supported": false,
        "backchannel_logout_supported": true,
        "backchannel_logout_session_supported": true,
        "ui_locales_supported": Lang::ALL.map(Lang::tag),
    });
    (
        [(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=300"),
        )],
        Json(doc),
    )
        .into_response()
}
