//! The OpenID Provider's browser side: the authorization endpoint and the
//! hosted pages (sign-in, second step, passkey, sign-up, password reset,
//! consent, logout), and userinfo. The pages are clients of the same
//! domain services as the JSON API (`login`, `signup`, `passwords`):
//! every brute-force rule, second factor and event applies unchanged.
//! docs/oidc.md describes the flows.
//!
//! Every form carries a CSRF field equal to the browser's CSRF cookie (a
//! random value set with the first page; `SameSite=Lax`, `HttpOnly`), and
//! every page says where its forms may go (`form-action`) and that no page
//! may frame it.
//!
//! `page.rs` holds what every page needs, `signin.rs` the sign-in forms,
//! `upstream.rs` the way through another provider ("Continue with ...");
//! this file the protocol's endpoints (authorize, consent, logout,
//! userinfo, consents).

mod page;
mod signin;
pub mod upstream;

pub use signin::{login, mfa, passkey, reset, reset_confirm, reset_form, signup, signup_form, verify};
pub use upstream::{arrive as upstream_arrive, confirm_link, depart as upstream_depart};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::extract::{AccountBearer, Bearer, ClientIp};
use super::pages::escape;
use super::pages::i18n::{Key, Lang};
use super::{ApiError, AppState};

use self::page::{
    answer, checked_form, dead_end, error_page, field, refusal, see_other, unavailable, visit, Pending,
    SESSION,
};

/// The form of `POST /oauth/authorize`, for the OpenAPI document (the
/// handler reads the pairs itself: a parameter given twice is an error).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct AuthorizeForm {
    response_type: String,
    client_id: String,
    redirect_uri: String,
    scope: Option<String>,
    state: Option<String>,
    nonce: Option<String>,
    code_challenge: String,
    code_challenge_method: String,
    prompt: Option<String>,
    max_age: Option<u64>,
    login_hint: Option<String>,
    id_token_hint: Option<String>,
    acr_values: Option<String>,
    ui_locales: Option<String>,
}

/// The form of `POST /oauth/logout`, for the OpenAPI document.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct LogoutForm {
    id_token_hint: Option<String>,
    client_id: Option<String>,
    post_logout_redirect_uri: Option<String>,
    state: Option<String>,
    ui_locales: Option<String>,
}

/// The value of parameter `name`, if given (the first).
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `GET /oauth/authorize` (OpenID Connect Core §3.1.2.1).
#[utoipa::path(get, path = "/oauth/authorize", tag = "openid",
    params(("response_type" = String, Query, description = "code"), ("client_id" = String, Query),
           ("redirect_uri" = String, Query), ("scope" = Option<String>, Query, description = "openid profile email offline_access"),
           ("state" = Option<String>, Query), ("nonce" = Option<String>, Query),
           ("code_challenge" = String, Query, description = "PKCE: base64url(SHA-256(code_verifier))"),
           ("code_challenge_method" = String, Query, description = "S256"),
           ("prompt" = Option<String>, Query, description = "none, login, consent, select_account"),
           ("max_age" = Option<u64>, Query), ("login_hint" = Option<String>, Query),
           ("id_token_hint" = Option<String>, Query), ("acr_values" = Option<String>, Query, description = "2: a second factor"),
           ("ui_locales" = Option<String>, Query, description = "The pages' language: space-separated BCP 47 tags, best first; the first of en, de, fr, es wins (de-CH is de), else the browser's Accept-Language, else en. Others are ignored")),
    responses((status = 200, content_type = "text/html", description = "The sign-in or consent page"),
              (status = 303, description = "To the redirect URI with code, state and iss, or with error, error_description, state and iss"),
              (status = 400, content_type = "text/html", description = "Unknown client or unregistered redirect URI: an error page, no redirect")))]
pub async fn authorize_get(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let params: Vec<(String, String)> = url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    authorize(&st, ip, &headers, &params).await
}

/// `POST /oauth/authorize`: the same parameters, form-encoded.
#[utoipa::path(post, path = "/oauth/authorize", tag = "openid",
    request_body(content = AuthorizeForm, content_type = "application/x-www-form-urlencoded", description = "The parameters of GET /oauth/authorize"),
    responses((status = 200, content_type = "text/html", description = "The sign-in or consent page"),
              (status = 303, description = "To the redirect URI with code or error, state and iss"),
              (status = 400, content_type = "text/html", description = "Unknown client or unregistered redirect URI")))]
pub async fn authorize_post(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params: Vec<(String, String)> = url::form_urlencoded::parse(&body).into_owned().collect();
    authorize(&st, ip, &headers, &params).await
}

async fn authorize(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    params: &[(String, String)],
) -> Response {
    let mut v = match visit(st, headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(st, Lang::of_browser(headers), e),
    };
    // The same value the request keeps sealed for its later pages.
    v.asked(param(params, "ui_locales"));
    match st.provider.authorize(params, v.session.as_ref(), &v.origin).await {
        Ok(next) => answer(st, &v, next, None, None),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            error_page(st, &v, status, &text)
        }
    }
}

/// `GET /oauth/continue?authz=`: the request taken up again after a step.
pub async fn resume(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Query(p): Query<Pending>,
) -> Response {
    let mut v = match visit(&st, &headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(&st, Lang::of_browser(&headers), e),
    };
    if let Some(req) = st.provider.open_pending(&p.authz) {
        v.asked(req.ui_locales.as_deref());
    }
    match st.provider.resume(&p.authz, v.session.as_ref(), &v.origin).await {
        Ok(next) => answer(&st, &v, next, None, None),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            error_page(&st, &v, status, &text)
        }
    }
}

/// `POST /oauth/consent`: allow or deny.
pub async fn consent(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (mut v, f) = match checked_form(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(session) = v.session.clone() else {
        return error_page(&st, &v, StatusCode::UNAUTHORIZED, v.text(Key::NotSignedIn));
    };
    if let Some(req) = st
        .provider
        .open_consent(field(&f, "consent"), &session.session_id)
    {
        v.asked(req.ui_locales.as_deref());
    }
    let allow = field(&f, "decision") == "allow";
    match st
        .provider
        .consent(field(&f, "consent"), &session, allow, &v.origin)
        .await
    {
        Ok(next) => answer(&st, &v, next, None, None),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            error_page(&st, &v, status, &text)
        }
    }
}

/// The parameters of a logout request carried to its confirmation
/// (`ui_locales`: RP-Initiated Logout 1.0 §2, the pages' language).
const LOGOUT_PARAMS: [&str; 5] = [
    "id_token_hint",
    "client_id",
    "post_logout_redirect_uri",
    "state",
    "ui_locales",
];

/// `GET|POST /oauth/logout` (RP-Initiated Logout 1.0): asks the user.
#[utoipa::path(get, path = "/oauth/logout", tag = "openid",
    params(("id_token_hint" = Option<String>, Query), ("client_id" = Option<String>, Query),
           ("post_logout_redirect_uri" = Option<String>, Query, description = "Registered by the client, exact"),
           ("state" = Option<String>, Query),
           ("ui_locales" = Option<String>, Query, description = "The pages' language, as for /oauth/authorize")),
    responses((status = 200, content_type = "text/html", description = "The confirmation page (POST /oauth/logout/confirm ends the session), or \"signed out\" when nobody is signed in"),
              (status = 303, description = "Nobody signed in: to the post_logout_redirect_uri"),
              (status = 400, content_type = "text/html", description = "A hint or redirect URI that is not the client's")))]
pub async fn logout_get(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let params = url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    logout(&st, ip, &headers, params).await
}

/// `POST /oauth/logout`: the same parameters, form-encoded.
#[utoipa::path(post, path = "/oauth/logout", tag = "openid",
    request_body(content = LogoutForm, content_type = "application/x-www-form-urlencoded", description = "The parameters of GET /oauth/logout, all optional"),
    responses((status = 200, content_type = "text/html", description = "As GET /oauth/logout"),
              (status = 303, description = "Nobody signed in: to the post_logout_redirect_uri"),
              (status = 400, content_type = "text/html", description = "A hint or redirect URI that is not the client's")))]
pub async fn logout_post(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = url::form_urlencoded::parse(&body).into_owned().collect();
    logout(&st, ip, &headers, params).await
}

async fn logout(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    params: Vec<(String, String)>,
) -> Response {
    let mut v = match visit(st, headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(st, Lang::of_browser(headers), e),
    };
    v.asked(param(&params, "ui_locales"));
    let req = match st.provider.logout_request(&params).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return dead_end(st, &v, e),
        Err(e) => return unavailable(st, v.lang, e),
    };
    if v.session.is_none() {
        // Nobody to sign out here.
        return match req.redirect {
            Some(to) => v.finish(st, see_other(&to)),
            None => v.finish(st, signed_out(st, v.lang)),
        };
    }
    let carried: String = LOGOUT_PARAMS
        .iter()
        .filter_map(|k| params.iter().find(|(pk, _)| pk == k))
        .map(|(k, val)| {
            format!(
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                escape(k),
                escape(val)
            )
        })
        .collect();
    // Plain text: the page escapes it. Not named `from`, which the page
    // of earlier versions took as HTML (`{{{from}}}`): an operator's copy
    // of that page now shows nothing there rather than a raw client name.
    let requester = req
        .client_name
        .as_deref()
        .map(|n| format!(" ({})", v.lang.format(Key::AskedBy, &[("client", n)])))
        .unwrap_or_default();
    let targets: Vec<String> = req.redirect.iter().filter_map(|r| origin_of(r)).collect();
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    v.finish(
        st,
        st.pages.page(
            StatusCode::OK,
            v.lang,
            Key::TitleSignOut,
            "logout.html",
            &[
                ("csrf", &v.csrf),
                ("carried", &carried),
                ("requester", &requester),
            ],
            &targets,
        ),
    )
}

fn signed_out(st: &AppState, lang: Lang) -> Response {
    st.pages.page(
        StatusCode::OK,
        lang,
        Key::TitleSignedOut,
        "signed_out.html",
        &[],
        &[],
    )
}

fn origin_of(uri: &str) -> Option<String> {
    let u = url::Url::parse(uri).ok()?;
    Some(match u.origin() {
        url::Origin::Tuple(..) => u.origin().ascii_serialization(),
        url::Origin::Opaque(_) => format!("{}:", u.scheme()),
    })
}

/// `POST /oauth/logout/confirm`: ends the browser session and what it
/// signed in to, then back to the application if it asked.
pub async fn logout_confirm(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (mut v, f) = match checked_form(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let params: Vec<(String, String)> = LOGOUT_PARAMS
        .iter()
        .filter_map(|k| f.get(*k).map(|val| (k.to_string(), val.clone())))
        .collect();
    v.asked(param(&params, "ui_locales"));
    let req = match st.provider.logout_request(&params).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return dead_end(&st, &v, e),
        Err(e) => return unavailable(&st, v.lang, e),
    };
    if let Some(s) = &v.session {
        if let Err(e) = st.provider.sign_out(s).await {
            return unavailable(&st, v.lang, e);
        }
    }
    let mut r = match req.redirect {
        Some(to) => see_other(&to),
        None => signed_out(&st, v.lang),
    };
    r.headers_mut()
        .append(header::SET_COOKIE, st.pages.set_cookie(SESSION, "", 0));
    r
}

/// `GET|POST /oauth/userinfo` (Core §5.3): the claims of the scopes the
/// access token was granted.
#[utoipa::path(get, path = "/oauth/userinfo", tag = "openid", security(("bearer" = [])),
    responses((status = 200, description = "{\"sub\", \"email\"?, \"email_verified\"?, \"name\"?} by the token's scopes"),
              (status = 401, description = "INVALID_TOKEN"), (status = 403, description = "INSUFFICIENT_SCOPE: no openid scope")))]
pub async fn userinfo_get(st: State<AppState>, token: Bearer) -> Result<Response, ApiError> {
    userinfo(st, token).await
}

#[utoipa::path(post, path = "/oauth/userinfo", tag = "openid", security(("bearer" = [])),
    responses((status = 200, description = "As GET /oauth/userinfo"),
              (status = 401, description = "INVALID_TOKEN"), (status = 403, description = "INSUFFICIENT_SCOPE: no openid scope")))]
pub async fn userinfo_post(st: State<AppState>, token: Bearer) -> Result<Response, ApiError> {
    userinfo(st, token).await
}

async fn userinfo(State(st): State<AppState>, Bearer(token): Bearer) -> Result<Response, ApiError> {
    let doc = st.provider.userinfo(&token.claims).await?;
    let mut r = Json(doc).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// `GET /auth/consents`: the applications the caller let in.
#[utoipa::path(get, path = "/auth/consents", tag = "openid", security(("bearer" = [])),
    responses((status = 200, description = "{\"consents\": [{\"client_id\", \"client_name\", \"scope\", \"granted_at\", \"expires_at\"?}]}"),
              (status = 401, description = "INVALID_TOKEN")))]
pub async fn consents(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
) -> Result<Response, ApiError> {
    let list = st.provider.consents(&token.claims.sub).await?;
    Ok(Json(serde_json::json!({ "consents": list })).into_response())
}

/// `DELETE /auth/consents/{client_id}`: withdraws one; that application's
/// sessions for the caller end.
#[utoipa::path(delete, path = "/auth/consents/{client_id}", tag = "openid", security(("bearer" = [])),
    params(("client_id" = String, Path)),
    responses((status = 204, description = "Withdrawn; the application's sessions for the user ended"),
              (status = 401, description = "INVALID_TOKEN"), (status = 404, description = "NOT_FOUND: no consent to that client")))]
pub async fn revoke_consent(
    State(st): State<AppState>,
    AccountBearer(token): AccountBearer,
    axum::extract::Path(client_id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    st.provider.revoke_consent(&token.claims.sub, &client_id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn pages_css(State(st): State<AppState>) -> Response {
    st.pages.asset("pages.css", "text/css; charset=utf-8")
}

pub async fn pages_js(State(st): State<AppState>) -> Response {
    st.pages.asset("pages.js", "text/javascript; charset=utf-8")
}
