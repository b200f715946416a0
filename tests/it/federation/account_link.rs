//! Linking from the account page (`POST /auth/identities`): a person
//! signed in to their account adds an identity of an upstream to it,
//! whatever address that identity asserts (the rule's `LinkTo`), after a
//! recent sign-in with their second factor if they have one; an identity
//! another account holds is refused.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{
    add_upstream, claims, linked, node, through_upstream, CALLBACK_HERE, UPSTREAM_CLIENT, UPSTREAM_SECRET,
};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::conformance::certified::{through_certified_pages, CertifiedProvider};
use crate::oidc::{application, exchange_code, Browser, Page};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

crate::on_every_backend!(
    a_signed_in_person_links_an_upstream_identity_to_their_own_account_and_then_signs_in_with_it,
);

/// node-oidc-provider as upstream `node`, trusted for nothing and making
/// no accounts: a link from the account page needs neither.
async fn untrusted_upstream(app: &TestApp) -> CertifiedProvider {
    let op = CertifiedProvider::start(json!([{
        "client_id": UPSTREAM_CLIENT,
        "client_secret": UPSTREAM_SECRET,
        "redirect_uris": [CALLBACK_HERE],
    }]))
    .await;
    add_upstream(app, node(&op.issuer)).await;
    op
}

/// From the account page with `token` (and the account's password):
/// leaves for upstream `node`, signs in there as `login`, and comes back:
/// where latchkey sends the browser.
async fn link_from_account_page(app: &TestApp, op: &CertifiedProvider, token: &str, login: &str) -> String {
    let mut browser = Browser::new(app);
    let start = start_link(&mut browser, token).await;
    back_through_node(app, op, &mut browser, &start, login).await
}

async fn start_link(browser: &mut Browser<'_>, token: &str) -> Page {
    let body = json!({"upstream": "node", "current_password": PASSWORD});
    browser.post_json("/auth/identities", token, &body).await
}

/// The link started with `start` (in `browser`), through the upstream as
/// `login` and back: where latchkey sends the browser.
async fn back_through_node(
    app: &TestApp,
    op: &CertifiedProvider,
    browser: &mut Browser<'_>,
    start: &Page,
    login: &str,
) -> String {
    assert_eq!(start.status, StatusCode::OK, "{}", start.body);
    assert!(
        browser.cookies.contains_key("latchkey_upstream"),
        "the journey's cookie"
    );
    let to = serde_json::from_str::<Value>(&start.body).unwrap()["url"]
        .as_str()
        .unwrap()
        .to_string();
    let mut there = Browser::elsewhere(app, &op.issuer);
    let page = there.get(&to).await;
    let page = there.follow(page).await;
    let back = through_certified_pages(&mut there, page, login, CALLBACK_HERE).await;
    let page = browser.get(&back.location.unwrap()).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert!(
        !browser.cookies.contains_key("latchkey_upstream"),
        "the journey is over"
    );
    page.location.unwrap()
}

/// The upstream identity asserts an address that is not the account's,
/// and not even verified: the owner links it all the same, since they
/// proved the account by signing in to it. It then signs in to that
/// account through the upstream (which makes no accounts and trusts no
/// address). Linking it again is no change; linking it to another account
/// is refused, and that account's list stays empty.
async fn a_signed_in_person_links_an_upstream_identity_to_their_own_account_and_then_signs_in_with_it(
    app: &TestApp,
) {
    let app_secret = application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = untrusted_upstream(app).await;
    let email = unique_email("link-owner");
    app.register_verified(&email, PASSWORD).await;
    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let token = session["access_token"].as_str().unwrap();
    let upstream_login = unique_email("unverified-elsewhere");

    let list: Value = app
        .get_bearer("/auth/identities", token)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["identities"], json!([]));
    assert_eq!(
        list["upstreams"],
        json!([{"name": "node", "display_name": "Node Example"}])
    );

    let mails_before = app.mails_to(&email).len();
    let to = link_from_account_page(app, &op, token, &upstream_login).await;
    assert_eq!(to, "/ui/account?linked=node");
    let user = app.user(&email).await;
    let links = app.services.store.identities_of(&user.id).await.unwrap();
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].subject, upstream_login);
    let events = format!(
        "SELECT COUNT(*) FROM events WHERE user_id = '{}' AND kind = 'identity.linked'",
        user.id
    );
    assert_eq!(app.count(&events).await, 1);
    let (subject, body) = app.wait_for_mail(&email, mails_before + 1).await;
    assert_eq!(
        subject, "A sign-in was linked to your account",
        "the owner is told"
    );
    assert!(body.contains("Node Example"), "{body}");

    let (back, verifier) = through_upstream(&mut Browser::new(app), app, &op, &upstream_login).await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("signed in through the link: {}", back.body));
    let tokens = exchange_code(app, "app", &app_secret, &callback, &verifier).await;
    assert_eq!(
        claims(tokens["id_token"].as_str().unwrap())["sub"],
        user.id.as_str()
    );

    assert_eq!(
        link_from_account_page(app, &op, token, &upstream_login).await,
        "/ui/account?linked=node"
    );
    assert_eq!(linked(app).await, 1);

    let other = unique_email("link-other");
    app.register_verified(&other, PASSWORD).await;
    let session: Value = app.login(&other, PASSWORD).await.json().await.unwrap();
    let to = link_from_account_page(
        app,
        &op,
        session["access_token"].as_str().unwrap(),
        &upstream_login,
    )
    .await;
    assert_eq!(to, "/ui/account?link_error=linked_elsewhere");
    assert_eq!(linked(app).await, 1);
    let other = app.user(&other).await;
    assert!(app
        .services
        .store
        .identities_of(&other.id)
        .await
        .unwrap()
        .is_empty());
}

/// What a stolen session cannot do: start a link without the account's
/// password, or at all once the account has a second factor the session
/// did not pass (nothing leaves for the upstream, no journey is set); nor
/// finish one it started after it was signed out.
#[tokio::test]
async fn linking_takes_the_password_a_live_session_and_the_second_factor_when_the_account_has_one() {
    let app = TestApp::embedded(&[]).await;
    let op = untrusted_upstream(&app).await;
    let email = unique_email("link-mfa");
    app.register_verified(&email, PASSWORD).await;
    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let token = session["access_token"].as_str().unwrap();
    let mut browser = Browser::new(&app);
    for body in [
        json!({"upstream": "node"}),
        json!({"upstream": "node", "current_password": "not-the-password-1"}),
    ] {
        let start = browser.post_json("/auth/identities", token, &body).await;
        assert_eq!(start.status, StatusCode::UNAUTHORIZED, "{}", start.body);
        assert!(start.body.contains("INVALID_CREDENTIALS"), "{}", start.body);
    }
    assert!(browser.cookies.is_empty());

    // Signed out between the start and the way back: nothing linked.
    let start = start_link(&mut browser, token).await;
    let r = app
        .http
        .post(app.url("/auth/logout"))
        .json(&json!({"refresh_token": session["refresh_token"]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let to = back_through_node(&app, &op, &mut browser, &start, &unique_email("elsewhere")).await;
    assert_eq!(to, "/ui/account?link_error=journey");
    assert_eq!(linked(&app).await, 0);

    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let token = session["access_token"].as_str().unwrap();
    crate::mfa::enrol_totp(&app, token).await;
    let mut browser = Browser::new(&app);
    let start = start_link(&mut browser, token).await;
    assert_eq!(start.status, StatusCode::UNAUTHORIZED, "{}", start.body);
    assert!(start.body.contains("REAUTHENTICATION_REQUIRED"), "{}", start.body);
    assert!(browser.cookies.is_empty());

    let start = browser
        .post_json(
            "/auth/identities",
            token,
            &json!({"upstream": "nobody", "current_password": PASSWORD}),
        )
        .await;
    assert_eq!(
        start.status,
        StatusCode::UNAUTHORIZED,
        "the second factor comes first"
    );
}
