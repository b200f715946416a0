//! The hosted page: a reference client of the JSON API for signing in with
//! a second factor or a passkey and for managing factors (plain HTML and a
//! short script, no framework). WebAuthn ceremonies need a browser and a
//! page on the relying party's origin; this is that page, and the browser
//! test drives it. Everything it does goes through the public API.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const HTML: &str = include_str!("ui/account.html");
const SCRIPT: &str = include_str!("ui/account.js");
const STYLE: &str = include_str!("ui/account.css");
const WEBAUTHN: &str = include_str!("ui/webauthn.js");

/// The page loads only its own script and style, talks only to this
/// origin, and is framed by nobody (no clickjacking of its buttons).
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

pub async fn page() -> Response {
    asset("text/html; charset=utf-8", HTML)
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The WebAuthn helpers the account page and the sign-in pages share.
pub async fn webauthn() -> Response {
    asset("text/javascript; charset=utf-8", WEBAUTHN)
}
