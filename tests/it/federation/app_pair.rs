//! The JSON pair for applications with their own pages: the browser is
//! sent to `GET /auth/upstream/{name}` with the application's
//! `redirect_to` (one of `upstream_return_urls`) and PKCE challenge, comes
//! back there with a code, and the application redeems the code with its
//! verifier at `POST /auth/upstream/token`, answered as `/auth/login`
//! answers.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{upstream, CALLBACK_HERE};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::conformance::certified::{through_certified_pages, CertifiedProvider};
use crate::oidc::{pkce, query, with_query, Browser};

const BACK: &str = "https://app.example/signed-in";

crate::on_every_backend!(settings = &[("upstream_return_urls", "https://app.example/signed-in")];
    an_application_with_its_own_pages_signs_a_person_in_through_an_upstream_with_a_single_use_code,
);

/// The way to `GET /auth/upstream/node` with `challenge` and `state`.
fn start(redirect_to: &str, challenge: &str) -> String {
    with_query(
        "/auth/upstream/node",
        &[
            ("redirect_to", redirect_to),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256"),
            ("state", "app-state-1"),
        ],
    )
}

/// Through the upstream as `login`, from the application's start: where
/// the browser is sent back to.
async fn through(app: &TestApp, op: &CertifiedProvider, challenge: &str, login: &str) -> String {
    let mut browser = Browser::new(app);
    let out = browser.get(&start(BACK, challenge)).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER, "{}", out.body);
    let to = out.location.unwrap();
    assert!(to.starts_with(&op.issuer), "{to}");
    let mut there = Browser::elsewhere(app, &op.issuer);
    let page = there.get(&to).await;
    let page = there.follow(page).await;
    let back = through_certified_pages(&mut there, page, login, CALLBACK_HERE).await;
    let page = browser.get(&back.location.unwrap()).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    let location = page.location.unwrap();
    assert!(location.starts_with(BACK), "{location}");
    location
}

async fn redeem(app: &TestApp, code: &str, verifier: &str) -> (StatusCode, Value) {
    let r = app
        .http
        .post(app.url("/auth/upstream/token"))
        .json(&json!({"code": code, "code_verifier": verifier}))
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// A new person: the code comes back with the application's `state`, and
/// redeems once, with its verifier only, for a session whose `amr` is
/// `fed`. A wrong verifier spends the code. An account with a second
/// factor is answered `MFA_REQUIRED`, as a password login is.
async fn an_application_with_its_own_pages_signs_a_person_in_through_an_upstream_with_a_single_use_code(
    app: &TestApp,
) {
    let op = upstream(app, true, true).await;
    let email = unique_email("app-pair");
    let (verifier, challenge) = pkce();
    let back = through(app, &op, &challenge, &email).await;
    assert_eq!(query(&back).get("state").map(String::as_str), Some("app-state-1"));
    let code = query(&back)
        .get("code")
        .cloned()
        .unwrap_or_else(|| panic!("{back}"));
    let (status, body) = redeem(app, &code, &verifier).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = app
        .get_bearer("/auth/validate", body["access_token"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["email"], email.as_str());
    assert_eq!(v["amr"], json!(["fed"]));
    let (status, body) = redeem(app, &code, &verifier).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "single use: {body}");

    let back = through(app, &op, &challenge, &email).await;
    let code = query(&back)["code"].clone();
    let (other_verifier, _) = pkce();
    assert_eq!(
        redeem(app, &code, &other_verifier).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        redeem(app, &code, &verifier).await.0,
        StatusCode::BAD_REQUEST,
        "a wrong verifier spent it"
    );

    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    assert!(session.get("access_token").is_none(), "no password");
    let sessions: Value = app
        .get_bearer("/auth/me", body_token(app, &op, &email).await.as_str())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(sessions["email"], email.as_str());
}

/// A fresh sign-in's access token through the pair.
async fn body_token(app: &TestApp, op: &CertifiedProvider, login: &str) -> String {
    let (verifier, challenge) = pkce();
    let back = through(app, op, &challenge, login).await;
    let (_, body) = redeem(app, &query(&back)["code"].clone(), &verifier).await;
    body["access_token"].as_str().unwrap().to_string()
}

/// A `redirect_to` that is not configured is never sent to, nor is a
/// challenge method other than S256 taken; once `redirect_to` is known
/// good, failures go back there as `error`: an unknown upstream, an
/// address of an account here (`link_required`), and a second factor
/// asked at the redemption.
#[tokio::test]
async fn an_application_is_sent_back_only_to_its_configured_url_and_told_what_failed() {
    let app = TestApp::embedded(&[("upstream_return_urls", BACK)]).await;
    let op = upstream(&app, true, true).await;
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(&app);
    for bad in [
        start("https://evil.example/steal", &challenge),
        start(&format!("{BACK}/more"), &challenge),
        start(BACK, "short"),
        start(BACK, &challenge).replace("S256", "plain"),
        "/auth/upstream/node?code_challenge=x".to_string(),
    ] {
        let page = browser.get(&bad).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{bad}: {}", page.body);
        assert!(page.location.is_none());
        assert!(page.body.contains("INVALID_REQUEST"), "{}", page.body);
    }
    assert!(browser.cookies.is_empty());

    let page = browser
        .get(&start(BACK, &challenge).replace("/node?", "/nobody?"))
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    let to = page.location.unwrap();
    assert_eq!(
        query(&to).get("error").map(String::as_str),
        Some("unknown_upstream"),
        "{to}"
    );

    let taken = unique_email("app-taken");
    app.register_verified(&taken, PASSWORD).await;
    let back = through(&app, &op, &challenge, &taken).await;
    assert_eq!(
        query(&back).get("error").map(String::as_str),
        Some("link_required"),
        "{back}"
    );
    assert!(!query(&back).contains_key("code"));

    // An account with a second factor, linked to an identity there: the
    // code stands for the first factor only.
    let email = unique_email("app-mfa");
    app.register_verified(&email, PASSWORD).await;
    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    crate::mfa::enrol_totp(&app, session["access_token"].as_str().unwrap()).await;
    let login = unique_email("app-mfa-there");
    super::link_at(&app, &op.issuer, &app.user(&email).await.id, &login).await;
    let back = through(&app, &op, &challenge, &login).await;
    let (status, body) = redeem(&app, &query(&back)["code"].clone(), &verifier).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"], "MFA_REQUIRED");
    assert!(body["mfa_token"].is_string());
}
