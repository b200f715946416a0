//! An upstream's back-channel logout (OpenID Connect Back-Channel Logout
//! 1.0): node-oidc-provider, told latchkey's
//! `/oauth/upstream/node/backchannel-logout` as its client's
//! `backchannel_logout_uri`, posts a logout token when the person signs out
//! there; latchkey ends the sessions that began with a sign-in through the
//! upstream, and refuses a token it cannot trust.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{add, authorize_url, upstream_link, CALLBACK_HERE, UPSTREAM_CLIENT, UPSTREAM_SECRET};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::conformance::certified::{through_certified_pages, CertifiedProvider};
use crate::oidc::{application, exchange_code, hidden, pkce, Browser};
use crate::oidc_logout::{delivered, endpoint, Received};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

crate::on_every_backend!(signing_out_at_the_upstream_ends_the_sessions_that_began_there_and_no_others,);

/// A person signs in to one account with their password, and through
/// node (linked to it). Signing out at node ends the
/// session that began there (its access token refused at once, its
/// refresh token spent) and leaves the password session alone. A logout
/// token that is not node's, or is replayed to another upstream's
/// endpoint, is refused with `400`.
async fn signing_out_at_the_upstream_ends_the_sessions_that_began_there_and_no_others(app: &TestApp) {
    let app_secret = application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = CertifiedProvider::start(json!([{
        "client_id": UPSTREAM_CLIENT,
        "client_secret": UPSTREAM_SECRET,
        "redirect_uris": [CALLBACK_HERE],
        "backchannel_logout_uri": app.url("/oauth/upstream/node/backchannel-logout"),
    }]))
    .await;
    add(app, &op.issuer, true, true).await;
    // An account with a password, linked to a person at node.
    let email = unique_email("fed-logout");
    app.register_verified(&email, PASSWORD).await;
    let user = app.user(&email).await;
    let login = unique_email("fed-logout-there");
    super::link_at(app, &op.issuer, &user.id, &login).await;
    let password: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let password = password["access_token"].as_str().unwrap().to_string();

    // Through node, keeping its browser (its session there).
    let (tokens, mut there) = signed_in_through_node(app, &op, &app_secret, &login).await;
    let federated = tokens["access_token"].as_str().unwrap().to_string();
    assert_eq!(
        app.get_bearer("/auth/validate", &federated).await.status(),
        StatusCode::OK
    );

    // Forged and misdirected tokens first: nothing ends.
    let forged = "eyJhbGciOiJub25lIn0.eyJpc3MiOiJ4In0.";
    for (path, token) in [
        ("/oauth/upstream/node/backchannel-logout", forged),
        ("/oauth/upstream/nobody/backchannel-logout", forged),
    ] {
        let r = app
            .http
            .post(app.url(path))
            .form(&[("logout_token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_request");
    }
    let r = app
        .http
        .post(app.url("/oauth/upstream/node/backchannel-logout"))
        .form(&[("other", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        app.get_bearer("/auth/validate", &federated).await.status(),
        StatusCode::OK
    );

    // Signing out at node: its page, its button.
    let page = there.get("/session/end").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let form = [
        ("xsrf", hidden(&page.body, "xsrf")),
        ("logout", "yes".to_string()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    there.post("/session/end/confirm", &form).await;
    let mut refused = false;
    for _ in 0..100 {
        if app.get_bearer("/auth/validate", &federated).await.status() == StatusCode::UNAUTHORIZED {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(refused, "the session that began at node ended");
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth("app", Some(&app_secret))
        .form(&[
            ("grant_type", "refresh_token"),
            (
                "refresh_token",
                tokens["refresh_token"].as_str().unwrap_or("none"),
            ),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        app.get_bearer("/auth/validate", &password).await.status(),
        StatusCode::OK,
        "the password session stays"
    );
    let ended = app
        .count(&format!(
            "SELECT COUNT(*) FROM events WHERE user_id = '{}' AND kind = 'session.ended' AND reason = 'upstream_logout'",
            user.id
        ))
        .await;
    assert!(ended >= 1, "{ended}");
}

/// A logout token is taken once: node's token, caught on its way (its
/// `backchannel_logout_uri` is a recorder here) and posted to latchkey
/// twice, ends the sessions the first time; presented again after the
/// person signed in anew, it is refused and the new session stays.
#[tokio::test]
async fn a_logout_token_presented_again_ends_nothing() {
    let app = TestApp::embedded(&[]).await;
    let app_secret = application(&app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let received = Received::steady();
    let op = CertifiedProvider::start(json!([{
        "client_id": UPSTREAM_CLIENT,
        "client_secret": UPSTREAM_SECRET,
        "redirect_uris": [CALLBACK_HERE],
        "backchannel_logout_uri": endpoint(&received).await,
    }]))
    .await;
    add(&app, &op.issuer, true, true).await;
    let login = unique_email("fed-replay");
    let (first, mut there) = signed_in_through_node(&app, &op, &app_secret, &login).await;
    let first = first["access_token"].as_str().unwrap().to_string();

    // Signing out at node: the token goes to the recorder.
    let page = there.get("/session/end").await;
    let form = [
        ("xsrf", hidden(&page.body, "xsrf")),
        ("logout", "yes".to_string()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    there.post("/session/end/confirm", &form).await;
    let (_, body) = delivered(&received).await.pop().unwrap();
    let post = |body: String| {
        let r = app
            .http
            .post(app.url("/oauth/upstream/node/backchannel-logout"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        async move { r.send().await.unwrap().status() }
    };
    assert_eq!(post(body.clone()).await, StatusCode::OK);
    assert_eq!(
        app.get_bearer("/auth/validate", &first).await.status(),
        StatusCode::UNAUTHORIZED
    );

    let (second, _) = signed_in_through_node(&app, &op, &app_secret, &login).await;
    let second = second["access_token"].as_str().unwrap();
    assert_eq!(post(body).await, StatusCode::BAD_REQUEST, "the same token again");
    assert_eq!(
        app.get_bearer("/auth/validate", second).await.status(),
        StatusCode::OK
    );
}

/// Through node as `login` to application `app`: its tokens, and the
/// browser at node (its session there).
async fn signed_in_through_node<'a>(
    app: &'a TestApp,
    op: &CertifiedProvider,
    app_secret: &str,
    login: &str,
) -> (Value, Browser<'a>) {
    let mut browser = Browser::new(app);
    let (verifier, challenge) = pkce();
    let page = browser.get(&authorize_url(&challenge)).await;
    let page = browser.follow(page).await;
    let leave = browser.get(&upstream_link(&page)).await;
    let mut there = Browser::elsewhere(app, &op.issuer);
    let page = there.get(&leave.location.unwrap()).await;
    let page = there.follow(page).await;
    let back = through_certified_pages(&mut there, page, login, CALLBACK_HERE).await;
    let page = browser.get(&back.location.unwrap()).await;
    let page = browser.follow(page).await;
    let callback = page
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", page.body));
    let tokens = exchange_code(app, "app", app_secret, &callback, &verifier).await;
    (tokens, there)
}
