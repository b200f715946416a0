//! Back-channel logout (OpenID Connect Back-Channel Logout 1.0): an
//! application that registered a `backchannel_logout_uri` is told, by a
//! signed logout token posted to it, when a session it holds ends, however
//! it ended. The application is a loopback listener that records what it
//! receives; each logout token is validated as the specification tells a
//! relying party to, by jose (the JWT library openid-client is built on,
//! `tests/support/oidc-rp/rp.mjs logout-token`), by go-oidc
//! (`tests/support/oidc-rp-go`) and by idpyoidc (`rp_idpy.py logout-token`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::{
    code_grant_in, hidden, rp, rp_of, Browser, AFTER_LOGOUT, CALLBACK, GO_OIDC, IDPYOIDC, ISSUER,
};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

crate::on_every_backend!(
    settings = &[
        ("webhook_retry_base_ms", "100"),
        ("webhook_allow_private_addresses", "true"),
        ("id_token_signing_algorithms", "RS256"),
    ];
    an_application_is_told_by_a_signed_logout_token_when_its_session_ends,
    an_application_is_told_when_an_admin_ends_its_users_sessions,
);

/// What the application's back-channel endpoint received: each request's
/// content type and body, in order. By default it answers `503` to the
/// first request (an application briefly down), `200` after.
#[derive(Clone, Default)]
pub struct Received {
    seen: Arc<Mutex<Vec<(String, String)>>>,
    /// Answers `200` from the first request on.
    steady: bool,
}

impl Received {
    /// An endpoint that is never down.
    pub fn steady() -> Received {
        Received {
            steady: true,
            ..Received::default()
        }
    }

    fn all(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// The application's back-channel endpoint on a loopback port: its URL.
pub async fn endpoint(received: &Received) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = received.clone();
    let router = axum::Router::new().route(
        "/backchannel-logout",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let seen = seen.clone();
            async move {
                let kind = headers
                    .get(axum::http::header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap_or("").to_string())
                    .unwrap_or_default();
                let mut all = seen.seen.lock().unwrap();
                all.push((kind, body));
                if all.len() == 1 && !seen.steady {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://127.0.0.1:{port}/backchannel-logout")
}

/// Registers application `id` (consent skipped, id_tokens in `alg`), with
/// a back-channel logout URI if one is given: its secret.
async fn application(app: &TestApp, id: &str, logout_uri: Option<String>, alg: &str) -> String {
    let mut s = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
    s.consent = ConsentMode::Skip;
    s.id_token_signed_response_alg = Some(alg.into());
    s.post_logout_redirect_uris = vec![AFTER_LOGOUT.into()];
    s.backchannel_logout_uri = logout_uri;
    app.services
        .features
        .clients
        .add(id, None, &[], Some(&s))
        .await
        .unwrap()
        .expect("a new client")
}

/// The claims of an id_token (its signature is the library's to check;
/// here only what it names is read).
fn claims(id_token: &str) -> Value {
    use base64::Engine;
    let payload = id_token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Waits (20 s at most) until the endpoint answered `200` once: every
/// request received by then, the successful one last.
pub async fn delivered(received: &Received) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let first_ok = if received.steady { 1 } else { 2 };
    loop {
        let all = received.all();
        if all.len() >= first_ok {
            return all;
        }
        assert!(Instant::now() < deadline, "no logout token arrived: {all:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The logout token of a received form, validated as one signed in `alg`
/// (the client's id_token algorithm) by latchkey ([`validated_from`]).
async fn validated(app: &TestApp, client: &str, alg: &str, request: &(String, String)) -> Value {
    validated_from(ISSUER, &app.url(""), client, alg, request).await
}

/// The logout token of a received form, validated as one of `issuer`
/// (reached at `base`) signed in `alg` by jose (the JWT library of
/// openid-client), by go-oidc's `VerifyLogout` and by idpyoidc's
/// `BackChannelLogoutRequest`: its claims.
pub async fn validated_from(
    issuer: &str,
    base: &str,
    client: &str,
    alg: &str,
    (kind, body): &(String, String),
) -> Value {
    assert_eq!(kind, "application/x-www-form-urlencoded");
    let form: Vec<(String, String)> = url::form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    assert_eq!(form.len(), 1, "only logout_token: {form:?}");
    assert_eq!(form[0].0, "logout_token");
    let input =
        json!({"issuer": issuer, "base": base, "client_id": client, "logout_token": form[0].1, "alg": alg});
    let go = rp_of(GO_OIDC, "logout-token", &input).await;
    assert!(
        go.get("error").is_none(),
        "go-oidc refused the logout token: {go}"
    );
    let idpy = rp_of(IDPYOIDC, "logout-token", &input).await;
    assert!(
        idpy.get("error").is_none(),
        "idpyoidc refused the logout token: {idpy}"
    );
    assert_eq!(idpy["claims"]["jti"], go["claims"]["jti"]);
    let out = rp("logout-token", &input).await;
    assert!(
        out.get("error").is_none(),
        "the library refused the logout token: {out}"
    );
    assert_eq!(out["header"]["typ"], "logout+jwt");
    assert_eq!(go["claims"], out["claims"]);
    out["claims"].clone()
}

/// Logout tokens queued for application `client` so far.
async fn queued(app: &TestApp, client: &str) -> i64 {
    app.count(&format!(
        "SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = 'backchannel:{client}'"
    ))
    .await
}

async fn an_application_is_told_by_a_signed_logout_token_when_its_session_ends(app: &TestApp) {
    let received = Received::default();
    // The crm wants its id_tokens, so its logout tokens, in RS256.
    let crm = application(app, "crm", Some(endpoint(&received).await), "RS256").await;
    // A second application, without a back-channel URI: told nothing.
    let wiki = application(app, "wiki", None, "EdDSA").await;
    let email = unique_email("bcl");
    app.register_verified(&email, PASSWORD).await;
    let user = app
        .services
        .store
        .user_by_email(&email)
        .await
        .unwrap()
        .unwrap()
        .id;

    let mut browser = Browser::new(app);
    let tokens = code_grant_in(&mut browser, "crm", &crm, &email, "openid").await;
    let id_token = tokens["id_token"].as_str().unwrap();
    let sid = claims(id_token)["sid"].as_str().unwrap().to_string();
    code_grant_in(&mut browser, "wiki", &wiki, &email, "openid").await;
    // A first-party session of the same user that ends is none of the
    // application's business.
    let own: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    app.post("/auth/logout", json!({"refresh_token": own["refresh_token"]}))
        .await;
    assert_eq!(queued(app, "crm").await, 0);

    // The user signs out at the provider (RP-initiated from the wiki).
    let wiki_token = code_grant_in(&mut browser, "wiki", &wiki, &email, "openid").await;
    let logout = format!(
        "/oauth/logout?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("id_token_hint", wiki_token["id_token"].as_str().unwrap()),
                ("post_logout_redirect_uri", AFTER_LOGOUT),
                ("state", "bye"),
            ])
            .finish()
    );
    let page = browser.get(&logout).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let fields: Vec<(&str, String)> = ["csrf", "id_token_hint", "post_logout_redirect_uri", "state"]
        .into_iter()
        .map(|k| (k, hidden(&page.body, k)))
        .collect();
    let form: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = browser.post("/oauth/logout/confirm", &form).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER, "{}", out.body);

    // The crm hears of it, through the endpoint's outage, by a token the
    // library accepts, naming the session its id_token named.
    let all = delivered(&received).await;
    for request in &all {
        let c = validated(app, "crm", "RS256", request).await;
        assert_eq!(c["sid"], sid.as_str());
        assert_eq!(c["sub"], user.as_str());
        assert_eq!(c["aud"], "crm");
        assert_eq!(c["iss"], ISSUER);
    }
    // The same token with its signature broken, or for another client:
    // every library refuses it.
    let form: Vec<(String, String)> = url::form_urlencoded::parse(all[0].1.as_bytes())
        .into_owned()
        .collect();
    let token = &form[0].1;
    let (signed, signature) = token.rsplit_once('.').unwrap();
    let flipped = if signature.starts_with('A') { "B" } else { "A" };
    let broken = format!("{signed}.{flipped}{}", &signature[1..]);
    for (client, token) in [("crm", broken.as_str()), ("wiki", token.as_str())] {
        let input = json!({"issuer": ISSUER, "base": app.url(""), "client_id": client, "logout_token": token, "alg": "RS256"});
        for library in [GO_OIDC, IDPYOIDC] {
            let out = rp_of(library, "logout-token", &input).await;
            assert!(
                out.get("error").is_some(),
                "{library} accepted a bad logout token ({client}): {out}"
            );
        }
        let out = rp("logout-token", &input).await;
        assert!(
            out.get("error").is_some(),
            "jose accepted a bad logout token ({client}): {out}"
        );
    }
    assert_eq!(queued(app, "crm").await, 1, "one session ended: one logout");
    assert_eq!(
        app.count("SELECT COUNT(*) FROM webhooks WHERE client_id IS NOT NULL")
            .await,
        1,
        "the wiki has no back-channel endpoint"
    );
}

async fn an_application_is_told_when_an_admin_ends_its_users_sessions(app: &TestApp) {
    let received = Received::default();
    let uri = endpoint(&received).await;
    // Registered without one, then given one through the admin API.
    let crm = application(app, "crm", None, "EdDSA").await;
    let admin = crate::admin::admin_token(app).await;
    let mut settings = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
    settings.consent = ConsentMode::Skip;
    settings.backchannel_logout_uri = Some(uri);
    let r = app
        .http
        .put(app.url("/admin/clients/crm/oidc"))
        .bearer_auth(&admin)
        .json(&json!({ "oidc": settings }))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let email = unique_email("bcl-admin");
    app.register_verified(&email, PASSWORD).await;
    let user = app
        .services
        .store
        .user_by_email(&email)
        .await
        .unwrap()
        .unwrap()
        .id;
    let tokens = code_grant_in(&mut Browser::new(app), "crm", &crm, &email, "openid").await;
    let sid = claims(tokens["id_token"].as_str().unwrap())["sid"]
        .as_str()
        .unwrap()
        .to_string();

    let r = app
        .http
        .delete(app.url(&format!("/admin/users/{user}/sessions")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let all = delivered(&received).await;
    let c = validated(app, "crm", "EdDSA", all.last().unwrap()).await;
    assert_eq!(c["sid"], sid.as_str());
    // The attempts show in the admin API's delivery history of the client's
    // back-channel webhook, and the webhook list does not show it.
    let history: Value = app
        .get_bearer("/admin/webhooks/backchannel:crm/deliveries", &admin)
        .await
        .json()
        .await
        .unwrap();
    let list = history["deliveries"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{history:#}");
    let hooks: Value = app
        .get_bearer("/admin/webhooks", &admin)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hooks["webhooks"], json!([]), "{hooks:#}");
    let removed = app
        .http
        .delete(app.url("/admin/webhooks/backchannel:crm"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 404, "it goes only with the client's settings");

    // Erasing the account ends the session it signed in with again, and
    // the application hears of it, though the session is gone with it.
    let tokens = code_grant_in(&mut Browser::new(app), "crm", &crm, &email, "openid").await;
    let sid = claims(tokens["id_token"].as_str().unwrap())["sid"]
        .as_str()
        .unwrap()
        .to_string();
    let heard = received.all().len();
    let r = app
        .http
        .delete(app.url(&format!("/admin/users/{user}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let deadline = Instant::now() + Duration::from_secs(20);
    while received.all().len() == heard {
        assert!(Instant::now() < deadline, "the erasure's logout never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let c = validated(app, "crm", "EdDSA", received.all().last().unwrap()).await;
    assert_eq!(
        (c["sid"].as_str(), c["sub"].as_str()),
        (Some(sid.as_str()), Some(user.as_str()))
    );
}
