//! The authorization code's one use, as the store keeps it: the code is
//! spent and the application's session starts in one commit, so a code
//! presented twice at once gives one session and ends it, a code whose
//! browser session ended starts nothing, and an application's session ends
//! no later than the browser session it came from (RFC 6749 §4.1.2 and
//! §10.5, docs/oidc.md).

use futures_util::future::join_all;
use serde_json::Value;

use crate::common::{free_port, unique_email, TestApp, PASSWORD};
use crate::oidc::{application, pkce, query, Browser, CALLBACK};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

crate::on_every_backend!(
    // The webhook of the events' test points at a loopback port where
    // nothing listens.
    settings = &[("webhook_allow_private_addresses", "true")];
    a_code_presented_many_times_at_once_starts_one_session_and_the_others_end_it,
    a_code_whose_browser_session_ended_starts_nothing_and_is_spent,
    an_applications_session_ends_no_later_than_the_browser_session_it_came_from,
    the_code_flow_records_its_events_with_their_webhook_deliveries,
    a_code_is_exchanged_without_redirect_uri_only_by_a_client_with_one_registered,
);

/// A signed-in user's code for the new application `id` (consent
/// skipped): (its secret, the code, the PKCE verifier, the user's email).
async fn fresh_code(app: &TestApp, id: &str) -> (String, String, String, String) {
    let secret = application(app, id, ClientKind::Confidential, ConsentMode::Skip).await;
    let email = unique_email(id);
    app.register_verified(&email, PASSWORD).await;
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(app);
    let back = browser
        .authorize_and_sign_in(id, "openid offline_access", &challenge, &email)
        .await;
    let to = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    (secret, query(&to)["code"].clone(), verifier, email)
}

async fn exchange(app: &TestApp, id: &str, secret: &str, code: &str, verifier: &str) -> (u16, Value) {
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth(id, Some(secret))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", CALLBACK),
            ("code_verifier", verifier),
        ])
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn a_code_presented_many_times_at_once_starts_one_session_and_the_others_end_it(app: &TestApp) {
    let (secret, code, verifier, _) = fresh_code(app, "at-once").await;
    let answers = join_all((0..8).map(|_| exchange(app, "at-once", &secret, &code, &verifier))).await;
    let won: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(won.len(), 1, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!((*status, body["error"].as_str()), (400, Some("invalid_grant")));
    }
    assert_eq!(
        app.count("SELECT count(*) FROM sessions WHERE client_id = 'at-once'")
            .await,
        1
    );
    // Every other presentation was a second use, after the winner's commit
    // or waiting for it: the session it started has ended.
    assert_eq!(app.validate(won[0]["access_token"].as_str().unwrap()).await, 401);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM sessions WHERE client_id = 'at-once' AND revoked_reason = 'code_reused'"
        )
        .await,
        1
    );
}

async fn a_code_whose_browser_session_ended_starts_nothing_and_is_spent(app: &TestApp) {
    let (secret, code, verifier, email) = fresh_code(app, "after-end").await;
    // The user ends every other session from another device between the
    // redirect and the exchange.
    crate::oidc::sign_out_elsewhere(app, &email).await;
    let (status, body) = exchange(app, "after-end", &secret, &code, &verifier).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_grant")),
        "{body}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM sessions WHERE client_id = 'after-end'")
            .await,
        0
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM authorization_codes WHERE client_id = 'after-end' AND used_at IS NOT NULL"
        )
        .await,
        1
    );
}

async fn an_applications_session_ends_no_later_than_the_browser_session_it_came_from(app: &TestApp) {
    let (secret, code, verifier, _) = fresh_code(app, "child").await;
    let (status, body) = exchange(app, "child", &secret, &code, &verifier).await;
    assert_eq!(status, 200, "{body}");
    let later = app
        .count(
            "SELECT count(*) FROM sessions c JOIN sessions p ON p.id = c.parent_id \
             WHERE c.client_id = 'child' AND c.expires_at > p.expires_at",
        )
        .await;
    let children = app
        .count("SELECT count(*) FROM sessions WHERE client_id = 'child' AND parent_id IS NOT NULL")
        .await;
    assert_eq!((children, later), (1, 0));
}

async fn the_code_flow_records_its_events_with_their_webhook_deliveries(app: &TestApp) {
    let (_, admin) = app.admin_client().await;
    let r = app
        .http
        .post(app.url("/admin/webhooks"))
        .bearer_auth(&admin)
        .json(&serde_json::json!({
            "url": format!("http://127.0.0.1:{}/never", free_port()),
            "kinds": ["oauth.authorized", "session.created"],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let (secret, code, verifier, _) = fresh_code(app, "recorded").await;
    let (status, body) = exchange(app, "recorded", &secret, &code, &verifier).await;
    assert_eq!(status, 200, "{body}");
    // The code's event, written with the code, and the application's
    // session's, written with the session: each with its delivery.
    for kind in ["oauth.authorized", "session.created"] {
        let sql = format!(
            "SELECT count(*) FROM events e WHERE e.kind = '{kind}' AND e.reason = 'recorded' \
             AND e.user_id IS NOT NULL AND e.session_id IS NOT NULL AND e.ip IS NOT NULL \
             AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)"
        );
        assert_eq!(app.count(&sql).await, 1, "{kind}");
    }
}

async fn a_code_is_exchanged_without_redirect_uri_only_by_a_client_with_one_registered(app: &TestApp) {
    // OpenID Connect Core §3.1.3.2: left out, it is the client's only
    // registered redirect URI; a client with several must say which.
    let (secret, code, verifier, email) = fresh_code(app, "one-uri").await;
    let send = |client: &'static str, secret: String, fields: Vec<(&'static str, String)>| async move {
        let r = app
            .http
            .post(app.url("/oauth/token"))
            .basic_auth(client, Some(secret))
            .form(&fields)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let form = |code: &str, verifier: &str| {
        vec![
            ("grant_type", "authorization_code".to_string()),
            ("code", code.to_string()),
            ("code_verifier", verifier.to_string()),
        ]
    };
    let mut other = form(&code, &verifier);
    other.push(("redirect_uri", format!("{CALLBACK}/other")));
    let (status, body) = send("one-uri", secret.clone(), other).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")));
    let (status, body) = send("one-uri", secret, form(&code, &verifier)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id_token"].is_string());

    let mut two = ClientSettings::new(
        ClientKind::Confidential,
        vec![CALLBACK.into(), format!("{CALLBACK}/other")],
    );
    two.consent = ConsentMode::Skip;
    let secret = app
        .services
        .features
        .clients
        .add("two-uris", None, &[], Some(&two))
        .await
        .unwrap()
        .unwrap();
    let (verifier, challenge) = pkce();
    let back = Browser::new(app)
        .authorize_and_sign_in("two-uris", "openid", &challenge, &email)
        .await;
    let code = query(back.location.as_deref().unwrap())["code"].clone();
    let (status, body) = send("two-uris", secret.clone(), form(&code, &verifier)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    // Nothing was spent: with its redirect_uri, the code still works.
    let mut named = form(&code, &verifier);
    named.push(("redirect_uri", CALLBACK.to_string()));
    let (status, body) = send("two-uris", secret, named).await;
    assert_eq!(status, 200, "{body}");
}
