//! What every page of the OpenID Provider needs: the browser's visit (its
//! session and CSRF cookies), the checks of a posted form, and the pages
//! that answer where a sign-in stands (sign-in, second step, consent,
//! errors). Used by the protocol's endpoints (`mod.rs`) and the sign-in
//! forms (`signin.rs`).

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::domain::oidc::{BrowserSession, ClientView, Next};
use crate::domain::sessions::{Origin, TokenPair};
use crate::domain::AuthError;
use crate::http::extract::origin;
use crate::http::pages::escape;
use crate::http::AppState;

/// The session cookie (the browser session's refresh token, sealed) and the CSRF
/// cookie (`__Host-` prefixed over https).
pub(super) const SESSION: &str = "latchkey_session";
pub(super) const CSRF: &str = "latchkey_csrf";

/// A form's fields (the first of each name).
pub(super) type Fields = std::collections::HashMap<String, String>;

pub(super) fn fields(body: &[u8]) -> Fields {
    let mut f = Fields::new();
    for (k, v) in url::form_urlencoded::parse(body) {
        f.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    f
}

pub(super) fn field<'a>(f: &'a Fields, name: &str) -> &'a str {
    f.get(name).map(String::as_str).unwrap_or("")
}

/// What a page needs of the request: its CSRF value (the cookie's, or a new
/// one to set) and the browser session, if any.
pub(super) struct Visit {
    pub(super) csrf: String,
    pub(super) new_csrf: bool,
    pub(super) session: Option<BrowserSession>,
    pub(super) origin: Origin,
}

pub(super) async fn visit(
    st: &AppState,
    headers: &HeaderMap,
    ip: std::net::IpAddr,
) -> Result<Visit, AuthError> {
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
    pub(super) fn finish(&self, st: &AppState, mut r: Response) -> Response {
        if self.new_csrf {
            r.headers_mut()
                .append(header::SET_COOKIE, st.pages.set_cookie(CSRF, &self.csrf, 86_400));
        }
        r
    }

    /// Whether a posted form's CSRF field is this browser's.
    pub(super) fn csrf_ok(&self, st: &AppState, f: &Fields) -> bool {
        !self.new_csrf && st.provider.csrf_matches(&self.csrf, field(f, "csrf"))
    }
}

pub(super) fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

pub(super) fn message(text: &str, error: bool) -> String {
    let class = if error { "message error" } else { "message" };
    let role = if error { "alert" } else { "status" };
    format!("<p class=\"{class}\" role=\"{role}\">{}</p>", escape(text))
}

pub(super) fn error_page(st: &AppState, v: &Visit, status: StatusCode, text: &str) -> Response {
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
pub(super) fn refusal(e: &AuthError) -> (StatusCode, String) {
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
pub(super) fn answer(
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

pub(super) fn login_page(
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
pub(super) fn pending_page(
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
pub(super) fn scope_text(scope: &str) -> &'static str {
    match scope {
        "openid" => "Sign you in with your latchkey account",
        "email" => "See your email address",
        "profile" => "See your name",
        "offline_access" => "Stay signed in while you are away",
        _ => "Something this service does not know",
    }
}

pub(super) fn unavailable(st: &AppState, e: AuthError) -> Response {
    let (status, text) = refusal(&e);
    st.pages.page(
        status,
        "Something is wrong",
        "error.html",
        &[("message", &text)],
        &[],
    )
}

/// A signed-in browser: its session cookie, then the request goes on.
pub(super) fn signed_in(st: &AppState, v: &Visit, pair: &TokenPair, pending: &str) -> Response {
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
pub(super) async fn checked_form(
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
pub(super) async fn posted(
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

pub(super) async fn pending_client(st: &AppState, pending: &str) -> Option<ClientView> {
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

pub(super) fn mfa_page(
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

#[derive(serde::Deserialize)]
pub struct Pending {
    pub(super) authz: String,
}
