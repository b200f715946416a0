//! The hosted sign-in forms: password, the second step, a passkey alone,
//! sign-up with the emailed code, password reset. Each is a client of the
//! same domain services as the JSON API (`login`, `signup`, `passwords`).

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use webauthn_rs::prelude::PublicKeyCredential;

use crate::domain::input::{Code, Email, Password};
use crate::domain::mfa::Proof;
use crate::domain::sessions::TokenPair;
use crate::domain::AuthError;
use crate::http::extract::ClientIp;
use crate::http::pages::i18n::{Key, Lang};
use crate::http::AppState;

use super::page::{
    error_page, field, login_page, message, mfa_page, pending_client, pending_page, posted, refusal,
    signed_in, unavailable, visit, Pending, Visit,
};
use super::upstream::proved;

/// The answer to a sign-in of `pair`'s account: the request goes on
/// (after the question of a pending link to that account, if any).
async fn welcome(st: &AppState, headers: &HeaderMap, v: &Visit, pair: &TokenPair, pending: &str) -> Response {
    proved(st, headers, v, pair, pending, signed_in(st, v, pair, pending)).await
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
        Ok(pair) => welcome(&st, &headers, &v, &pair, pending).await,
        Err(AuthError::SecondFactorRequired(Some(step))) => mfa_page(&st, &v, pending, &client, &step, None),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            login_page(&st, &v, pending, &client, email_text, Some((status, &text)))
        }
    }
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
        return error_page(&st, &v, StatusCode::BAD_REQUEST, v.text(Key::EnterAFactor));
    };
    match st.login.second_factor(&v.origin, token, proof).await {
        Ok(pair) => welcome(&st, &headers, &v, &pair, pending).await,
        Err(e @ AuthError::InvalidFactor { tries_left }) if tries_left > 0 => {
            // The same step again: the login's challenge is still live (a
            // passkey's options are not carried: its form is left out).
            let (status, text) = refusal(v.lang, &e);
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
            let (status, text) = refusal(v.lang, &e);
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
            Some((StatusCode::BAD_REQUEST, v.text(Key::PasskeyNoAnswer))),
        );
    };
    match st
        .login
        .finish_passkey(&v.origin, field(&f, "ceremony_token"), &cred)
        .await
    {
        Ok(pair) => welcome(&st, &headers, &v, &pair, pending).await,
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
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
    form_page(
        &st,
        ip,
        &headers,
        &p.authz,
        Key::TitleCreateAccount,
        "signup.html",
    )
    .await
}

pub async fn reset_form(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Query(p): Query<Pending>,
) -> Response {
    form_page(&st, ip, &headers, &p.authz, Key::TitleResetPassword, "reset.html").await
}

async fn form_page(
    st: &AppState,
    ip: std::net::IpAddr,
    headers: &HeaderMap,
    pending: &str,
    title: Key,
    template: &str,
) -> Response {
    let mut v = match visit(st, headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(st, Lang::of_browser(headers), e),
    };
    let Some(client) = pending_client(st, &mut v, pending).await else {
        return error_page(st, &v, StatusCode::BAD_REQUEST, v.text(Key::LinkDamaged));
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
    let (status, title, template, msg) = match attempt.await {
        // The same answer whether or not the address had an account.
        Ok(()) => (StatusCode::OK, Key::TitleCheckEmail, "verify.html", String::new()),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            (
                status,
                Key::TitleCreateAccount,
                "signup.html",
                message(&text, true),
            )
        }
    };
    pending_page(
        &st, &v, &client, status, title, template, pending, email_text, &msg,
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
        Ok(pair) => welcome(&st, &headers, &v, &pair, pending).await,
        Err(AuthError::SecondFactorRequired(Some(step))) => mfa_page(&st, &v, pending, &client, &step, None),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            let msg = message(&text, true);
            pending_page(
                &st,
                &v,
                &client,
                status,
                Key::TitleCheckEmail,
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
            Key::TitleNewPassword,
            "reset_confirm.html",
            String::new(),
        ),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            (
                status,
                Key::TitleResetPassword,
                "reset.html",
                message(&text, true),
            )
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
            Some((StatusCode::OK, v.text(Key::PasswordChanged))),
        ),
        Err(e) => {
            let (status, text) = refusal(v.lang, &e);
            let msg = message(&text, true);
            pending_page(
                &st,
                &v,
                &client,
                status,
                Key::TitleNewPassword,
                "reset_confirm.html",
                pending,
                email_text,
                &msg,
            )
        }
    }
}
