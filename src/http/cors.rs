//! Cross-origin requests of browser applications (the Fetch standard's
//! CORS protocol) on the endpoints a single-page application calls itself:
//! the token, userinfo, revocation and introspection endpoints answer an
//! origin that a client registered (`--allowed-origin`, docs/oidc.md);
//! discovery and the JWKS, which are public, answer any origin.
//!
//! No credentials (cookies) are ever allowed cross-origin: these endpoints
//! authenticate with a bearer token or the client's own credentials, so
//! `Access-Control-Allow-Credentials` is never sent, and a page of another
//! origin cannot ride on the browser's sign-in cookie.
//!
//! A preflight does not say which client is asking, so an origin is
//! allowed when any client registered it; the request itself is then
//! answered only if it authenticates (the client, or its access token).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The paths that answer the origins clients registered.
pub const CLIENT_PATHS: [&str; 4] = [
    "/oauth/token",
    "/oauth/userinfo",
    "/oauth/revoke",
    "/oauth/introspect",
];
/// The paths that answer any origin.
pub const PUBLIC_PATHS: [&str; 2] = ["/.well-known/openid-configuration", "/.well-known/jwks.json"];

/// How long a browser may keep a preflight's answer (seconds).
const PREFLIGHT_MAX_AGE: &str = "600";

/// Layered on the paths above (`http::router`).
pub async fn layer(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let public = PUBLIC_PATHS.contains(&req.uri().path());
    let Some(origin) = origin(req.headers()) else {
        return next.run(req).await;
    };
    let allowed = public || st.provider.origin_allowed(&origin).await;
    if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        return preflight(req.uri().path(), &origin, allowed, public);
    }
    let mut r = next.run(req).await;
    if allowed {
        allow(r.headers_mut(), &origin, public);
    }
    r
}

/// The request's `Origin`, if it is one (not `null`, not garbled).
fn origin(h: &HeaderMap) -> Option<String> {
    let o = h.get(header::ORIGIN)?.to_str().ok()?;
    (o != "null" && !o.is_empty() && o.len() <= 256).then(|| o.to_string())
}

fn allow(h: &mut HeaderMap, origin: &str, public: bool) {
    let value = if public {
        HeaderValue::from_static("*")
    } else {
        match HeaderValue::from_str(origin) {
            Ok(v) => v,
            Err(_) => return,
        }
    };
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("www-authenticate, retry-after"),
    );
    if !public {
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

/// The answer to a preflight: `204`, with the permissions when the origin
/// is allowed (else none, and the browser refuses the request).
fn preflight(path: &str, origin: &str, allowed: bool, public: bool) -> Response {
    let mut r = (StatusCode::NO_CONTENT, Body::empty()).into_response();
    let h = r.headers_mut();
    if allowed {
        allow(h, origin, public);
        let methods = if path == "/oauth/userinfo" || public {
            "GET, POST"
        } else {
            "POST"
        };
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(methods),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
    }
    if !public {
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
    r
}
