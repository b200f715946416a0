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

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use webauthn_rs::prelude::PublicKeyCredential;

use super::extract::{origin, AccountBearer, Bearer, ClientIp};
use super::pages::escape;
use super::{ApiError, AppState};
use crate::domain::input::{Code, Email, Password};
use crate::domain::mfa::Proof;
use crate::domain::oidc::{BrowserSession, ClientView, Next};
use crate::domain::sessions::{Origin, TokenPair};
use crate::domain::AuthError;

/// The session cookie (the browser session's refresh token) and the CSRF
/// cookie (`__Host-` prefixed over https).
const SESSION: &str = "latchkey_session";
const CSRF: &str = "latchkey_csrf";

/// A form's fields (the first of each name).
type Fields = std::collections::HashMap<String, String>;

fn fields(body: &[u8]) -> Fields {
    let mut f = Fields::new();
    for (k, v) in url::form_urlencoded::parse(body) {
        f.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    f
}

fn field<'a>(f: &'a Fields, name: &str) -> &'a str {
    f.get(name).map(String::as_str).unwrap_or("")
}

/// What a page needs of the request: its CSRF value (the cookie's, or a new
/// one to set) and the browser session, if any.
struct Visit {
    csrf: String,
    new_csrf: bool,
    session: Option<BrowserSession>,
    origin: Origin,
}

async fn visit(st: &AppState, headers: &HeaderMap, ip: std::net::IpAddr) -> Result<Visit, AuthError> {
    let (csrf, new_csrf) = match st.pages.cookie(headers, CSRF).filter(|c| c.len() == 43) {
        Some(c) => (c, false),
        None => (crate::crypto::random_token(), true),
    };
    let session = match st.pages.cookie(headers, SESSION) {
        Some(c) => st.provider.browser_session(&c).await?,
        None => None,
    };
    Ok(Visit {
        csrf,
        new_csrf,
        session,
        origin: origin(ip, headers),
    })
}

impl Visit {
    /// Adds the CSRF cookie to a page that sets it first.
    fn finish(&self, st: &AppState, mut r: Response) -> Response {
        if self.new_csrf {
            r.headers_mut()
                .append(header::SET_COOKIE, st.pages.set_cookie(CSRF, &self.csrf, 86_400));
        }
        r
    }

    /// Whether a posted form's CSRF field is this browser's.
    fn csrf_ok(&self, st: &AppState, f: &Fields) -> bool {
        !self.new_csrf && st.provider.csrf_matches(&self.csrf, field(f, "csrf"))
    }
}

fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn message(text: &str, error: bool) -> String {
    let class = if error { "message error" } else { "message" };
    let role = if error { "alert" } else { "status" };
    format!("<p class=\"{class}\" role=\"{role}\">{}</p>", escape(text))
}

fn error_page(st: &AppState, v: &Visit, status: StatusCode, text: &str) -> Response {
    v.finish(
        st,
        st.pages.page(
            status,
            "Something is wrong",
            "error.html",
            &[("message", text)],
            &[],
        ),
    )
}

/// What a refused step tells the person at the page, and with what status.
fn refusal(e: &AuthError) -> (StatusCode, String) {
    match e {
        AuthError::InvalidCredentials => (StatusCode::UNAUTHORIZED, "The email or the password is wrong.".into()),
        AuthError::VerificationPending => (
            StatusCode::FORBIDDEN,
            "This email address is not verified yet: enter the code we emailed, or create the account again for a new one.".into(),
        ),
        AuthError::AccountDisabled => (StatusCode::FORBIDDEN, "This account is disabled.".into()),
        AuthError::InvalidOtp => (StatusCode::UNAUTHORIZED, "That code is wrong or expired.".into()),
        AuthError::InvalidFactor { tries_left } if *tries_left > 0 => (
            StatusCode::UNAUTHORIZED,
            format!("That did not work. {tries_left} more tries for this sign-in."),
        ),
        AuthError::InvalidFactor { .. } => (StatusCode::UNAUTHORIZED, "That did not work.".into()),
        AuthError::InvalidToken => (
            StatusCode::UNAUTHORIZED,
            "This step has expired or was used already: start again.".into(),
        ),
        AuthError::TooManyAttempts { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            format!("Too many attempts: try again in {} seconds.", retry_after.unwrap_or(60)),
        ),
        AuthError::RateLimited(l) => (
            StatusCode::TOO_MANY_REQUESTS,
            format!("Too many requests: try again in {} seconds.", l.retry_after_secs),
        ),
        AuthError::Overloaded { .. } | AuthError::Unavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The service is busy: try again in a moment.".into(),
        ),
        AuthError::Invalid(f) => (StatusCode::BAD_REQUEST, f.to_string()),
        AuthError::BadRequest(m) => (StatusCode::BAD_REQUEST, m.clone()),
        AuthError::EmailTaken => (StatusCode::CONFLICT, "This email address has an account already.".into()),
        other => {
            if let AuthError::Internal(e) = other {
                tracing::error!(error = ?e, "internal error on a sign-in page");
            }
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong on our side: try again.".into(),
            )
        }
    }
}

/// The answer to where an authorization request stands.
fn answer(
    st: &AppState,
    v: &Visit,
    next: Next,
    prefill: Option<&str>,
    note: Option<(StatusCode, &str)>,
) -> Response {
    match next {
        Next::Redirect(to) => v.finish(st, see_other(&to)),
        Next::Page(text) => error_page(st, v, StatusCode::BAD_REQUEST, &text),
        Next::Login {
            pending,
            login_hint,
            client,
        } => {
            let email = prefill.map(str::to_string).or(login_hint).unwrap_or_default();
            login_page(st, v, &pending, &client, &email, note)
        }
        Next::Consent {
            pending,
            client,
            scopes,
        } => {
            let email = v.session.as_ref().map_or("", |s| s.email.as_str());
            let list: String = scopes
                .iter()
                .map(|s| format!("  <li>{}</li>\n", escape(scope_text(s))))
                .collect();
            let page = st.pages.page(
                StatusCode::OK,
                "Allow access?",
                "consent.html",
                &[
                    ("client", &client.name),
                    ("scopes", &list),
                    ("email", email),
                    ("consent", &pending),
                    ("csrf", &v.csrf),
                ],
                &[&client.redirect_origin],
            );
            v.finish(st, page)
        }
    }
}

fn login_page(
    st: &AppState,
    v: &Visit,
    pending: &str,
    client: &ClientView,
    email: &str,
    note: Option<(StatusCode, &str)>,
) -> Response {
    let (status, msg) = match note {
        Some((s, m)) => (s, message(m, s.is_client_error() || s.is_server_error())),
        None => (StatusCode::OK, String::new()),
    };
    pending_page(
        st,
        v,
        client,
        status,
        "Sign in",
        "login.html",
        pending,
        email,
        &msg,
    )
}

/// A page of a pending sign-in that carries its form's hidden fields (the
/// sealed request, the CSRF token), the email typed, and a message.
#[allow(clippy::too_many_arguments)]
fn pending_page(
    st: &AppState,
    v: &Visit,
    client: &ClientView,
    status: StatusCode,
    title: &str,
    template: &str,
    pending: &str,
    email: &str,
    msg: &str,
) -> Response {
    v.finish(
        st,
        st.pages.page(
            status,
            title,
            template,
            &[
                ("client", &client.name),
                ("message", msg),
                ("authz", pending),
                ("csrf", &v.csrf),
                ("email", email),
            ],
            &[&client.redirect_origin],
        ),
    )
}

/// What a scope lets the application do, as the consent page says it.
fn scope_text(scope: &str) -> &'static str {
    match scope {
        "openid" => "Sign you in with your latchkey account",
        "email" => "See your email address",
        "profile" => "See your name",
        "offline_access" => "Stay signed in while you are away",
        _ => "Something this service does not know",
    }
}

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
}

/// The form of `POST /oauth/logout`, for the OpenAPI document.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct LogoutForm {
    id_token_hint: Option<String>,
    client_id: Option<String>,
    post_logout_redirect_uri: Option<String>,
    state: Option<String>,
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
           ("id_token_hint" = Option<String>, Query), ("acr_values" = Option<String>, Query, description = "2: a second factor")),
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
    let v = match visit(st, headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(st, e),
    };
    match st.provider.authorize(params, v.session.as_ref(), &v.origin).await {
        Ok(next) => answer(st, &v, next, None, None),
        Err(e) => {
            let (status, text) = refusal(&e);
            error_page(st, &v, status, &text)
        }
    }
}

fn unavailable(st: &AppState, e: AuthError) -> Response {
    let (status, text) = refusal(&e);
    st.pages.page(
        status,
        "Something is wrong",
        "error.html",
        &[("message", &text)],
        &[],
    )
}

#[derive(serde::Deserialize)]
pub struct Pending {
    authz: String,
}

/// `GET /oauth/continue?authz=`: the request taken up again after a step.
pub async fn resume(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Query(p): Query<Pending>,
) -> Response {
    let v = match visit(&st, &headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(&st, e),
    };
    match st.provider.resume(&p.authz, v.session.as_ref(), &v.origin).await {
        Ok(next) => answer(&st, &v, next, None, None),
        Err(e) => {
            let (status, text) = refusal(&e);
            error_page(&st, &v, status, &text)
        }
    }
}

/// A signed-in browser: its session cookie, then the request goes on.
fn signed_in(st: &AppState, v: &Visit, pair: &TokenPair, pending: &str) -> Response {
    let mut r = see_other(&format!("/oauth/continue?authz={pending}"));
    r.headers_mut().append(
        header::SET_COOKIE,
        st.pages.set_cookie(
            SESSION,
            &st.provider.browser_cookie(&pair.refresh_token),
            pair.refresh_expires_in,
        ),
    );
    v.finish(st, r)
}

/// A posted form whose CSRF field is this browser's (the cookie's), with
/// the browser's visit, or the page to answer instead.
async fn checked_form(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Visit, Fields), Response> {
    let v = visit(st, headers, ip).await.map_err(|e| unavailable(st, e))?;
    let f = fields(body);
    if !v.csrf_ok(st, &f) {
        return Err(error_page(
            st,
            &v,
            StatusCode::FORBIDDEN,
            "This form did not come from this service's page (or your browser refused its cookie): go back and try again.",
        ));
    }
    Ok((v, f))
}

/// A posted form of a pending request: its CSRF field and its request
/// checked, or the page to answer instead.
async fn posted(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Visit, Fields, ClientView), Response> {
    let (v, f) = checked_form(st, ip, headers, body).await?;
    let client = match pending_client(st, field(&f, "authz")).await {
        Some(c) => c,
        None => {
            return Err(error_page(
                st,
                &v,
                StatusCode::BAD_REQUEST,
                "This sign-in took too long or its link is damaged: start again from the application.",
            ))
        }
    };
    Ok((v, f, client))
}

async fn pending_client(st: &AppState, pending: &str) -> Option<ClientView> {
    let req = st.provider.open_pending(pending)?;
    let (rec, _) = st.provider.client(&req.client_id).await.ok()??;
    let origin = url::Url::parse(&req.redirect_uri)
        .ok()
        .map(|u| match u.origin() {
            url::Origin::Tuple(..) => u.origin().ascii_serialization(),
            url::Origin::Opaque(_) => format!("{}:", u.scheme()),
        })?;
    Some(ClientView {
        name: rec.name.clone().unwrap_or_else(|| rec.id.clone()),
        id: rec.id,
        redirect_origin: origin,
    })
}

/// `POST /oauth/login`: email and password.
pub async fn login(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let email_text = field(&f, "email");
    let attempt = async {
        let email = Email::parse("email", email_text)?;
        let password = Password::parse("password", field(&f, "password"))?;
        st.login.password(&v.origin, email, password, None).await
    };
    match attempt.await {
        Ok(pair) => signed_in(&st, &v, &pair, pending),
        Err(AuthError::SecondFactorRequired(Some(step))) => mfa_page(&st, &v, pending, &client, &step, None),
        Err(e) => {
            let (status, text) = refusal(&e);
            login_page(&st, &v, pending, &client, email_text, Some((status, &text)))
        }
    }
}

fn mfa_page(
    st: &AppState,
    v: &Visit,
    pending: &str,
    client: &ClientView,
    step: &crate::domain::mfa::StepUp,
    note: Option<(StatusCode, &str)>,
) -> Response {
    let factors = step.factors.join(" ");
    let common = [
        ("authz", pending),
        ("csrf", v.csrf.as_str()),
        ("mfa_token", step.mfa_token.as_str()),
        ("factors", factors.as_str()),
    ];
    let mut forms = String::new();
    for kind in &step.factors {
        match *kind {
            "totp" => forms.push_str(&st.pages.fill("mfa_totp.html", &common)),
            "webauthn" => {
                let options = step.webauthn.as_ref().map(|o| o.to_string()).unwrap_or_default();
                let mut values = common.to_vec();
                values.push(("options", &options));
                forms.push_str(&st.pages.fill("mfa_passkey.html", &values));
            }
            "recovery_code" => forms.push_str(&st.pages.fill("mfa_recovery.html", &common)),
            _ => {}
        }
    }
    let (status, msg) = match note {
        Some((s, m)) => (s, message(m, true)),
        None => (StatusCode::OK, String::new()),
    };
    v.finish(
        st,
        st.pages.page(
            status,
            "Second step",
            "mfa.html",
            &[("client", &client.name), ("message", &msg), ("forms", &forms)],
            &[&client.redirect_origin],
        ),
    )
}

/// `POST /oauth/mfa`: the second step, by authenticator code, recovery
/// code or passkey.
pub async fn mfa(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let token = field(&f, "mfa_token");
    let proof = if !field(&f, "code").is_empty() {
        Some(Proof::Totp(field(&f, "code").replace(' ', "")))
    } else if !field(&f, "recovery_code").is_empty() {
        Some(Proof::RecoveryCode(field(&f, "recovery_code").to_string()))
    } else {
        serde_json::from_str::<PublicKeyCredential>(field(&f, "webauthn"))
            .ok()
            .map(|c| Proof::WebAuthn(Box::new(c)))
    };
    let Some(proof) = proof else {
        return error_page(
            &st,
            &v,
            StatusCode::BAD_REQUEST,
            "Enter a code, a recovery code or use a passkey.",
        );
    };
    match st.login.second_factor(&v.origin, token, proof).await {
        Ok(pair) => signed_in(&st, &v, &pair, pending),
        Err(e @ AuthError::InvalidFactor { tries_left }) if tries_left > 0 => {
            // The same step again: the login's challenge is still live (a
            // passkey's options are not carried: its form is left out).
            let (status, text) = refusal(&e);
            let step = crate::domain::mfa::StepUp {
                mfa_token: token.to_string(),
                factors: field(&f, "factors")
                    .split(' ')
                    .filter_map(|k| ["totp", "recovery_code"].into_iter().find(|x| *x == k))
                    .collect(),
                webauthn: None,
                expires_in: 0,
            };
            mfa_page(&st, &v, pending, &client, &step, Some((status, &text)))
        }
        Err(e) => {
            let (status, text) = refusal(&e);
            login_page(&st, &v, pending, &client, "", Some((status, &text)))
        }
    }
}

/// `POST /oauth/passkey`: signing in with a passkey alone (the ceremony
/// started at `POST /auth/passkeys/login` by the page's script).
pub async fn passkey(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let Ok(cred) = serde_json::from_str::<PublicKeyCredential>(field(&f, "credential")) else {
        return login_page(
            &st,
            &v,
            pending,
            &client,
            "",
            Some((StatusCode::BAD_REQUEST, "The passkey gave no answer.")),
        );
    };
    match st
        .login
        .finish_passkey(&v.origin, field(&f, "ceremony_token"), &cred)
        .await
    {
        Ok(pair) => signed_in(&st, &v, &pair, pending),
        Err(e) => {
            let (status, text) = refusal(&e);
            login_page(&st, &v, pending, &client, "", Some((status, &text)))
        }
    }
}

/// `GET /oauth/signup?authz=` and `GET /oauth/reset?authz=`: the forms.
pub async fn signup_form(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Query(p): Query<Pending>,
) -> Response {
    form_page(&st, ip, &headers, &p.authz, "Create an account", "signup.html").await
}

pub async fn reset_form(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Query(p): Query<Pending>,
) -> Response {
    form_page(&st, ip, &headers, &p.authz, "Reset your password", "reset.html").await
}

async fn form_page(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    pending: &str,
    title: &str,
    template: &str,
) -> Response {
    let v = match visit(st, headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(st, e),
    };
    let Some(client) = pending_client(st, pending).await else {
        return error_page(
            st,
            &v,
            StatusCode::BAD_REQUEST,
            "This link is damaged or too old: start again from the application.",
        );
    };
    pending_page(st, &v, &client, StatusCode::OK, title, template, pending, "", "")
}

/// `POST /oauth/signup`: a new account; its code goes by mail.
pub async fn signup(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let email_text = field(&f, "email");
    let attempt = async {
        let email = Email::parse("email", email_text)?;
        let password = Password::parse("password", field(&f, "password"))?;
        st.signup.register(v.origin.ip, email, password, None).await
    };
    let values = |msg: &str| -> Vec<(&str, String)> {
        vec![
            ("client", client.name.clone()),
            ("authz", pending.to_string()),
            ("csrf", v.csrf.clone()),
            ("email", email_text.to_string()),
            ("message", msg.to_string()),
        ]
    };
    let (status, title, template, msg) = match attempt.await {
        // The same answer whether or not the address had an account.
        Ok(()) => (StatusCode::OK, "Check your email", "verify.html", String::new()),
        Err(e) => {
            let (status, text) = refusal(&e);
            (status, "Create an account", "signup.html", message(&text, true))
        }
    };
    let vals = values(&msg);
    let refs: Vec<(&str, &str)> = vals.iter().map(|(k, v)| (*k, v.as_str())).collect();
    v.finish(
        &st,
        st.pages
            .page(status, title, template, &refs, &[&client.redirect_origin]),
    )
}

/// `POST /oauth/signup/verify`: the emailed code; the account's first
/// session becomes the browser's.
pub async fn verify(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let email_text = field(&f, "email");
    let attempt = async {
        let email = Email::parse("email", email_text)?;
        let code = Code::parse("code", field(&f, "code"))?;
        st.signup.verify_email(&v.origin, email, code).await
    };
    match attempt.await {
        Ok(pair) => signed_in(&st, &v, &pair, pending),
        Err(AuthError::SecondFactorRequired(Some(step))) => mfa_page(&st, &v, pending, &client, &step, None),
        Err(e) => {
            let (status, text) = refusal(&e);
            let msg = message(&text, true);
            pending_page(
                &st,
                &v,
                &client,
                status,
                "Check your email",
                "verify.html",
                pending,
                email_text,
                &msg,
            )
        }
    }
}

/// `POST /oauth/reset`: mails a reset code (the same answer for any address).
pub async fn reset(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let email_text = field(&f, "email");
    let attempt = async {
        let email = Email::parse("email", email_text)?;
        st.passwords.request_reset(v.origin.ip, email).await
    };
    let (status, title, template, msg) = match attempt.await {
        Ok(()) => (
            StatusCode::OK,
            "Choose a new password",
            "reset_confirm.html",
            String::new(),
        ),
        Err(e) => {
            let (status, text) = refusal(&e);
            (status, "Reset your password", "reset.html", message(&text, true))
        }
    };
    pending_page(
        &st, &v, &client, status, title, template, pending, email_text, &msg,
    )
}

/// `POST /oauth/reset/confirm`: the code and the new password; then sign in.
pub async fn reset_confirm(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (v, f, client) = match posted(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pending = field(&f, "authz");
    let email_text = field(&f, "email");
    let attempt = async {
        let email = Email::parse("email", email_text)?;
        let code = Code::parse("code", field(&f, "code"))?;
        let password = Password::parse("password", field(&f, "password"))?;
        st.passwords
            .confirm_reset(v.origin.ip, email, code, password)
            .await
    };
    match attempt.await {
        Ok(()) => login_page(
            &st,
            &v,
            pending,
            &client,
            email_text,
            Some((StatusCode::OK, "Your password is changed: sign in with it.")),
        ),
        Err(e) => {
            let (status, text) = refusal(&e);
            let msg = message(&text, true);
            pending_page(
                &st,
                &v,
                &client,
                status,
                "Choose a new password",
                "reset_confirm.html",
                pending,
                email_text,
                &msg,
            )
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
    let (v, f) = match checked_form(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(session) = v.session.clone() else {
        return error_page(
            &st,
            &v,
            StatusCode::UNAUTHORIZED,
            "You are not signed in any more: start again from the application.",
        );
    };
    let allow = field(&f, "decision") == "allow";
    match st
        .provider
        .consent(field(&f, "consent"), &session, allow, &v.origin)
        .await
    {
        Ok(next) => answer(&st, &v, next, None, None),
        Err(e) => {
            let (status, text) = refusal(&e);
            error_page(&st, &v, status, &text)
        }
    }
}

/// The parameters of a logout request carried to its confirmation.
const LOGOUT_PARAMS: [&str; 4] = ["id_token_hint", "client_id", "post_logout_redirect_uri", "state"];

/// `GET|POST /oauth/logout` (RP-Initiated Logout 1.0): asks the user.
#[utoipa::path(get, path = "/oauth/logout", tag = "openid",
    params(("id_token_hint" = Option<String>, Query), ("client_id" = Option<String>, Query),
           ("post_logout_redirect_uri" = Option<String>, Query, description = "Registered by the client, exact"),
           ("state" = Option<String>, Query)),
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
    let v = match visit(st, headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(st, e),
    };
    let req = match st.provider.logout_request(&params).await {
        Ok(Ok(r)) => r,
        Ok(Err(text)) => return error_page(st, &v, StatusCode::BAD_REQUEST, &text),
        Err(e) => return unavailable(st, e),
    };
    if v.session.is_none() {
        // Nobody to sign out here.
        return match req.redirect {
            Some(to) => v.finish(st, see_other(&to)),
            None => v.finish(
                st,
                st.pages
                    .page(StatusCode::OK, "Signed out", "signed_out.html", &[], &[]),
            ),
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
    let from = req
        .client_name
        .as_deref()
        .map(|n| format!(" (asked by {})", escape(n)))
        .unwrap_or_default();
    let targets: Vec<String> = req.redirect.iter().filter_map(|r| origin_of(r)).collect();
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    v.finish(
        st,
        st.pages.page(
            StatusCode::OK,
            "Sign out",
            "logout.html",
            &[("csrf", &v.csrf), ("carried", &carried), ("from", &from)],
            &targets,
        ),
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
    let (v, f) = match checked_form(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let params: Vec<(String, String)> = LOGOUT_PARAMS
        .iter()
        .filter_map(|k| f.get(*k).map(|val| (k.to_string(), val.clone())))
        .collect();
    let req = match st.provider.logout_request(&params).await {
        Ok(Ok(r)) => r,
        Ok(Err(text)) => return error_page(&st, &v, StatusCode::BAD_REQUEST, &text),
        Err(e) => return unavailable(&st, e),
    };
    if let Some(s) = &v.session {
        if let Err(e) = st.provider.sign_out(s).await {
            return unavailable(&st, e);
        }
    }
    let mut r = match req.redirect {
        Some(to) => see_other(&to),
        None => st
            .pages
            .page(StatusCode::OK, "Signed out", "signed_out.html", &[], &[]),
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
