//! What every page of the OpenID Provider needs: the browser's visit (its
//! session and CSRF cookies), the checks of a posted form, and the pages
//! that answer where a sign-in stands (sign-in, second step, consent,
//! errors). Used by the protocol's endpoints (`mod.rs`) and the sign-in
//! forms (`signin.rs`).
//!
//! A page speaks the language of its visit ([`Visit::lang`]): the
//! browser's (`Accept-Language`) until the handler has the pending
//! request, whose `ui_locales` then comes first (`http/pages/i18n.rs`).

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::domain::oidc::{BrowserSession, ClientView, Next, PageError};
use crate::domain::sessions::{Origin, TokenPair};
use crate::domain::AuthError;
use crate::http::extract::origin;
use crate::http::pages::escape;
use crate::http::pages::i18n::{Key, Lang};
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
/// one to set), the browser session, if any, and the pages' language.
pub(super) struct Visit {
    pub(super) csrf: String,
    pub(super) new_csrf: bool,
    pub(super) session: Option<BrowserSession>,
    pub(super) origin: Origin,
    /// The browser's language, or the request's once [`Visit::asked`].
    pub(super) lang: Lang,
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
        lang: Lang::of_browser(headers),
    })
}

impl Visit {
    /// The request's `ui_locales` chooses the language, if it names one
    /// the pages speak.
    pub(super) fn asked(&mut self, ui_locales: Option<&str>) {
        self.lang = self.lang.or_asked(ui_locales);
    }

    /// The text of `key` in the visit's language.
    pub(super) fn text(&self, key: Key) -> &'static str {
        self.lang.text(key)
    }

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
    v.finish(st, error_in(st, v.lang, status, text))
}

fn error_in(st: &AppState, lang: Lang, status: StatusCode, text: &str) -> Response {
    st.pages.page(
        status,
        lang,
        Key::TitleError,
        "error.html",
        &[("message", text)],
        &[],
    )
}

/// The error page of a request that cannot go back to its client.
pub(super) fn dead_end(st: &AppState, v: &Visit, e: PageError) -> Response {
    error_page(st, v, StatusCode::BAD_REQUEST, v.text(page_error(e)))
}

/// What the pages say of a [`PageError`].
fn page_error(e: PageError) -> Key {
    match e {
        PageError::NoClientId => Key::NoClientId,
        PageError::UnknownClient => Key::UnknownClient,
        PageError::NoRedirectUri => Key::NoRedirectUri,
        PageError::UnregisteredRedirectUri => Key::UnregisteredRedirectUri,
        PageError::RepeatedClientOrRedirectUri => Key::RepeatedClientOrRedirectUri,
        PageError::Expired => Key::PendingExpired,
        PageError::ClientGone => Key::ClientGone,
        PageError::NoLongerAllowed => Key::NoLongerAllowed,
        PageError::ConsentNotYours => Key::ConsentNotYours,
        PageError::ForeignIdTokenHint => Key::ForeignIdTokenHint,
        PageError::HintOfAnotherClient => Key::HintOfAnotherClient,
        PageError::LogoutRedirectWithoutClient => Key::LogoutRedirectWithoutClient,
        PageError::UnregisteredLogoutRedirect => Key::UnregisteredLogoutRedirect,
    }
}

/// What a refused step tells the person at the page, in `lang`, and with
/// what status.
pub(super) fn refusal(lang: Lang, e: &AuthError) -> (StatusCode, String) {
    let text = |key| lang.text(key).to_string();
    let seconds = |key, n: u64| lang.format(key, &[("n", &n.to_string())]);
    match e {
        AuthError::InvalidCredentials => (StatusCode::UNAUTHORIZED, text(Key::WrongCredentials)),
        AuthError::VerificationPending => (StatusCode::FORBIDDEN, text(Key::NotVerified)),
        AuthError::AccountDisabled => (StatusCode::FORBIDDEN, text(Key::AccountDisabled)),
        AuthError::InvalidOtp => (StatusCode::UNAUTHORIZED, text(Key::WrongCode)),
        AuthError::InvalidFactor { tries_left } if *tries_left > 0 => (
            StatusCode::UNAUTHORIZED,
            lang.format(Key::FactorFailedTries, &[("n", &tries_left.to_string())]),
        ),
        AuthError::InvalidFactor { .. } => (StatusCode::UNAUTHORIZED, text(Key::FactorFailed)),
        AuthError::InvalidToken => (StatusCode::UNAUTHORIZED, text(Key::StepExpired)),
        AuthError::TooManyAttempts { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            seconds(Key::TooManyAttempts, retry_after.unwrap_or(60)),
        ),
        AuthError::RateLimited(l) => (
            StatusCode::TOO_MANY_REQUESTS,
            seconds(Key::TooManyRequests, l.retry_after_secs),
        ),
        AuthError::Overloaded { .. } | AuthError::Unavailable(_) | AuthError::StorageFull => {
            (StatusCode::SERVICE_UNAVAILABLE, text(Key::Busy))
        }
        // The fields of the pages' forms; another one (none today) in
        // the JSON API's words.
        AuthError::Invalid(f) => (
            StatusCode::BAD_REQUEST,
            match f.field {
                "email" => text(Key::InvalidEmail),
                "password" => text(Key::InvalidPassword),
                "code" => text(Key::InvalidCode),
                _ => f.to_string(),
            },
        ),
        AuthError::BadRequest(m) => (StatusCode::BAD_REQUEST, m.clone()),
        AuthError::EmailTaken => (StatusCode::CONFLICT, text(Key::EmailTaken)),
        other => {
            if let AuthError::Internal(e) = other {
                tracing::error!(error = ?e, "internal error on a sign-in page");
            }
            (StatusCode::INTERNAL_SERVER_ERROR, text(Key::Internal))
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
        Next::Page(e) => dead_end(st, v, e),
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
                .map(|s| format!("  <li>{}</li>\n", escape(v.text(scope_text(s)))))
                .collect();
            let page = st.pages.page(
                StatusCode::OK,
                v.lang,
                Key::TitleAllow,
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
        Key::TitleSignIn,
        "login.html",
        pending,
        email,
        &msg,
    )
}

/// "Continue with ..." for each upstream provider (the sign-in and sign-up
/// pages show them).
fn upstream_links(st: &AppState, v: &Visit, pending: &str) -> String {
    st.federation
        .listed()
        .iter()
        .map(|u| {
            format!(
                "<p class=\"upstream\"><a href=\"/oauth/upstream/{}?authz={}\">{}</a></p>\n",
                escape(&u.name),
                escape(pending),
                escape(&v.lang.format(Key::ContinueWith, &[("name", &u.display_name)]))
            )
        })
        .collect()
}

/// A page of a pending sign-in that carries its form's hidden fields (the
/// sealed request, the CSRF token), the email typed, and a message.
#[allow(clippy::too_many_arguments)]
pub(super) fn pending_page(
    st: &AppState,
    v: &Visit,
    client: &ClientView,
    status: StatusCode,
    title: Key,
    template: &str,
    pending: &str,
    email: &str,
    msg: &str,
) -> Response {
    let upstreams = upstream_links(st, v, pending);
    let values = [
        ("client", client.name.as_str()),
        ("message", msg),
        ("authz", pending),
        ("csrf", v.csrf.as_str()),
        ("email", email),
        ("upstreams", upstreams.as_str()),
    ];
    v.finish(
        st,
        st.pages.page(
            status,
            v.lang,
            title,
            template,
            &values,
            &[&client.redirect_origin],
        ),
    )
}

/// What a scope lets the application do, as the consent page says it.
pub(super) fn scope_text(scope: &str) -> Key {
    match scope {
        "openid" => Key::ScopeOpenid,
        "email" => Key::ScopeEmail,
        "profile" => Key::ScopeProfile,
        "offline_access" => Key::ScopeOfflineAccess,
        _ => Key::ScopeUnknown,
    }
}

/// The page of a failure before the visit could be read (or after), in
/// `lang`.
pub(super) fn unavailable(st: &AppState, lang: Lang, e: AuthError) -> Response {
    let (status, text) = refusal(lang, &e);
    error_in(st, lang, status, &text)
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
    let v = visit(st, headers, ip)
        .await
        .map_err(|e| unavailable(st, Lang::of_browser(headers), e))?;
    let f = fields(body);
    if !v.csrf_ok(st, &f) {
        return Err(error_page(
            st,
            &v,
            StatusCode::FORBIDDEN,
            v.text(Key::ForeignForm),
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
    let (mut v, f) = checked_form(st, ip, headers, body).await?;
    let client = match pending_client(st, &mut v, field(&f, "authz")).await {
        Some(c) => c,
        None => return Err(dead_end(st, &v, PageError::Expired)),
    };
    Ok((v, f, client))
}

/// The client of a pending request, as the pages show it; the visit
/// takes up the language the request asked for.
pub(super) async fn pending_client(st: &AppState, v: &mut Visit, pending: &str) -> Option<ClientView> {
    let req = st.provider.open_pending(pending)?;
    v.asked(req.ui_locales.as_deref());
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
            "totp" => forms.push_str(&st.pages.fill("mfa_totp.html", v.lang, &common)),
            "webauthn" => {
                let options = step.webauthn.as_ref().map(|o| o.to_string()).unwrap_or_default();
                let mut values = common.to_vec();
                values.push(("options", &options));
                forms.push_str(&st.pages.fill("mfa_passkey.html", v.lang, &values));
            }
            "recovery_code" => forms.push_str(&st.pages.fill("mfa_recovery.html", v.lang, &common)),
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
            v.lang,
            Key::TitleSecondStep,
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
