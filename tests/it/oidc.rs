//! The OpenID Provider, driven by a certified relying party library
//! (openid-client, `tests/support/oidc-rp/rp.mjs`): the test plays the
//! browser through the hosted pages (forms, cookies, redirects), the
//! library plays the application (discovery, PKCE, the code exchange,
//! the id_token's signature, nonce, `at_hash` and `iss`, userinfo,
//! refresh, the logout URL). Whatever the library refuses fails the test.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

// The WebAuthn relying party of the browser test (localhost on any port).
crate::on_every_backend!(
    settings = crate::mfa::WEBAUTHN;
    the_hosted_pages_sign_in_with_a_password_and_with_a_passkey_in_a_real_browser,
    an_application_signs_a_user_in_and_a_certified_library_accepts_every_answer,
    a_second_application_signs_in_from_the_browser_session_without_a_password,
    logging_out_ends_the_browser_session_and_what_the_applications_hold,
    a_public_client_signs_in_with_pkce_and_no_secret,
    a_user_sees_and_withdraws_the_applications_they_let_in,
    a_provider_signing_with_rs256_satisfies_a_library_left_at_its_defaults,
    one_application_gets_rs256_id_tokens_while_the_others_and_every_access_token_stay_on_eddsa,
    an_application_with_lifetimes_of_its_own_gets_shorter_tokens_and_sessions,
);

// The harness every OpenID test shares: the applications, the relying
// parties, the browser.
mod harness;
pub use harness::*;

async fn user_id(app: &TestApp, email: &str) -> String {
    app.services.store.user_by_email(email).await.unwrap().unwrap().id
}

async fn an_application_signs_a_user_in_and_a_certified_library_accepts_every_answer(app: &TestApp) {
    let secret = application(app, "notes", ClientKind::Confidential, ConsentMode::Explicit).await;
    let email = unique_email("oidc-code");
    app.register_verified(&email, PASSWORD).await;
    let input = rp_input(app, "notes", Some(&secret), "openid email profile offline_access");
    let started = rp("start", &input).await;

    let mut browser = Browser::new(app);
    let page = browser.get(started["url"].as_str().unwrap()).await;
    assert!(page.body.contains("App notes"), "the page names the application");
    let csp = page.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'self' http://127.0.0.1"),
        "{csp}"
    );
    let page = browser.sign_in(&page, &email, PASSWORD).await;
    let back = browser.consent(&page, "allow").await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    assert!(callback.starts_with(CALLBACK), "{callback}");
    let q = query(&callback);
    assert_eq!(q["iss"], ISSUER, "RFC 9207: the issuer in the response");
    assert_eq!(q["state"], started["state"].as_str().unwrap());

    let done = finish(&started, &input, &callback).await;
    let claims = &done["claims"];
    assert_eq!(claims["sub"], user_id(app, &email).await);
    assert_eq!(claims["aud"], "notes");
    assert_eq!(claims["email"], email);
    assert_eq!(claims["amr"], json!(["pwd"]));
    assert_eq!(claims["acr"], "1");
    assert!(claims["sid"].is_string() && claims["at_hash"].is_string());
    assert_eq!(done["userinfo"]["email"], email);
    assert_eq!(done["userinfo"]["email_verified"], true);
    assert!(
        done["refreshed"]["access_token"].is_string(),
        "offline_access: a refresh token that works"
    );
    // The access token is the application's: its scope, not the first-party one.
    let at = done["access_token"].as_str().unwrap();
    let v: Value = app.get_bearer("/auth/validate", at).await.json().await.unwrap();
    assert_eq!(v["client_id"], "notes");
    assert_eq!(v["scope"], "openid profile email offline_access");
    // It cannot manage the account.
    assert_eq!(app.get_bearer("/auth/sessions", at).await.status(), 403);
    // The code was single use: a second exchange is refused and ends what
    // the first one got.
    let again = rp("finish", &{
        let mut f = input.clone();
        f["callback"] = callback.clone().into();
        for k in ["code_verifier", "state", "nonce"] {
            f[k] = started[k].clone();
        }
        f
    })
    .await;
    assert!(again["error"].is_string(), "{again}");
    assert_eq!(app.validate(at).await, 401, "the first exchange's session ended");
}

async fn a_second_application_signs_in_from_the_browser_session_without_a_password(app: &TestApp) {
    let s1 = application(app, "mail", ClientKind::Confidential, ConsentMode::Skip).await;
    let s2 = application(app, "calendar", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = unique_email("oidc-sso");
    app.register_verified(&email, PASSWORD).await;
    let mut browser = Browser::new(app);

    let in1 = rp_input(app, "mail", Some(&s1), "openid email");
    let st1 = rp("start", &in1).await;
    let page = browser.get(st1["url"].as_str().unwrap()).await;
    let back = browser.sign_in(&page, &email, PASSWORD).await;
    let first = finish(&st1, &in1, back.location.as_deref().unwrap()).await;

    // The second application: straight back with a code, no page at all.
    let in2 = rp_input(app, "calendar", Some(&s2), "openid email");
    let st2 = rp("start", &in2).await;
    let back = browser.get(st2["url"].as_str().unwrap()).await;
    assert_eq!(
        back.status,
        StatusCode::SEE_OTHER,
        "no sign-in page: {}",
        back.body
    );
    let second = finish(&st2, &in2, back.location.as_deref().unwrap()).await;
    assert_eq!(second["claims"]["sub"], first["claims"]["sub"]);
    assert_eq!(
        second["claims"]["sid"], first["claims"]["sid"],
        "one browser session"
    );
    assert_eq!(
        second["claims"]["auth_time"], first["claims"]["auth_time"],
        "the authentication of the browser session"
    );

    // prompt=none works with the session, and says login_required without.
    let mut silent = in2.clone();
    silent["extra"] = json!({"prompt": "none"});
    let st3 = rp("start", &silent).await;
    let back = browser.get(st3["url"].as_str().unwrap()).await;
    assert!(query(back.location.as_deref().unwrap()).contains_key("code"));
    let mut stranger = Browser::new(app);
    let st4 = rp("start", &silent).await;
    let back = stranger.get(st4["url"].as_str().unwrap()).await;
    let q = query(back.location.as_deref().unwrap());
    assert_eq!(q["error"], "login_required");
    assert_eq!(q["iss"], ISSUER);
}

async fn logging_out_ends_the_browser_session_and_what_the_applications_hold(app: &TestApp) {
    let secret = application(app, "shop", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = unique_email("oidc-logout");
    app.register_verified(&email, PASSWORD).await;
    let mut browser = Browser::new(app);
    let input = rp_input(app, "shop", Some(&secret), "openid offline_access");
    let started = rp("start", &input).await;
    let page = browser.get(started["url"].as_str().unwrap()).await;
    let back = browser.sign_in(&page, &email, PASSWORD).await;
    let done = finish(&started, &input, back.location.as_deref().unwrap()).await;
    let at = done["refreshed"]["access_token"].as_str().unwrap().to_string();
    assert_eq!(app.validate(&at).await, 200);

    // RP-initiated logout: a confirmation page, then back to the app with its state.
    let page = browser.get(done["end_session"].as_str().unwrap()).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("App shop"), "{}", page.body);
    let mut form: Vec<(String, String)> = vec![("csrf".into(), hidden(&page.body, "csrf"))];
    for k in ["id_token_hint", "post_logout_redirect_uri", "state"] {
        form.push((k.into(), hidden(&page.body, k)));
    }
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = browser.post("/oauth/logout/confirm", &form).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(
        out.location.as_deref(),
        Some(format!("{AFTER_LOGOUT}?state=bye").as_str())
    );
    assert!(
        !browser.cookies.contains_key("latchkey_session"),
        "the cookie is gone"
    );
    // The application's tokens ended with the browser session.
    assert_eq!(app.validate(&at).await, 401);
    let refreshed = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth("shop", Some(&secret))
        .form(&[
            ("grant_type", "refresh_token"),
            (
                "refresh_token",
                done["refreshed"]["refresh_token"].as_str().unwrap(),
            ),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(refreshed.status(), 400);
    // And the next sign-in asks for the password again.
    let started = rp("start", &input).await;
    let page = browser.get(started["url"].as_str().unwrap()).await;
    assert!(page.body.contains("/oauth/login"), "{}", page.body);
}

async fn a_public_client_signs_in_with_pkce_and_no_secret(app: &TestApp) {
    application(app, "spa", ClientKind::Public, ConsentMode::Skip).await;
    let email = unique_email("oidc-public");
    app.register_verified(&email, PASSWORD).await;
    let mut browser = Browser::new(app);
    let input = rp_input(app, "spa", None, "openid offline_access");
    let started = rp("start", &input).await;
    let page = browser.get(started["url"].as_str().unwrap()).await;
    let page = browser.sign_in(&page, &email, PASSWORD).await;
    // Registered as "skip", but its code goes to a loopback address, where
    // any program of the machine may listen: the user is asked all the
    // same (RFC 8252 §8.6), and a silent request cannot get a code.
    let back = browser.consent(&page, "allow").await;
    let done = finish(&started, &input, back.location.as_deref().unwrap()).await;
    assert!(
        done["refreshed"]["access_token"].is_string(),
        "a public client refreshes with its id alone"
    );
    let silent = rp("start", &{
        let mut i = input.clone();
        i["extra"] = json!({"prompt": "none"});
        i
    })
    .await;
    let back = browser.get(silent["url"].as_str().unwrap()).await;
    assert_eq!(
        query(back.location.as_deref().unwrap())["error"],
        "consent_required"
    );
    // And revokes its session with its id alone (its logout, RFC 7009).
    let rt = done["refreshed"]["refresh_token"].as_str().unwrap();
    let r = app
        .http
        .post(app.url("/oauth/revoke"))
        .form(&[("client_id", "spa"), ("token", rt)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .form(&[
            ("grant_type", "refresh_token"),
            ("client_id", "spa"),
            ("refresh_token", rt),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "revoked");
    // Without PKCE, a public client's request goes back with an error.
    let bare = format!(
        "/oauth/authorize?response_type=code&client_id=spa&redirect_uri={}&scope=openid&state=s",
        urlencode(CALLBACK)
    );
    let back = browser.get(&bare).await;
    let q = query(back.location.as_deref().unwrap());
    assert_eq!(q["error"], "invalid_request");
    assert_eq!(q["state"], "s");
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

async fn a_user_sees_and_withdraws_the_applications_they_let_in(app: &TestApp) {
    let secret = application(
        app,
        "photos",
        ClientKind::Confidential,
        ConsentMode::Remembered { days: 30 },
    )
    .await;
    let email = unique_email("oidc-consent");
    let pair = app.register_verified(&email, PASSWORD).await;
    let account = pair["access_token"].as_str().unwrap().to_string();
    let mut browser = Browser::new(app);
    let input = rp_input(app, "photos", Some(&secret), "openid email");
    let started = rp("start", &input).await;
    let page = browser.get(started["url"].as_str().unwrap()).await;
    let page = browser.sign_in(&page, &email, PASSWORD).await;
    assert!(page.body.contains("See your email address"), "{}", page.body);
    let back = browser.consent(&page, "allow").await;
    let done = finish(&started, &input, back.location.as_deref().unwrap()).await;
    // Remembered: the next sign-in does not ask.
    let again = rp("start", &input).await;
    let back = browser.get(again["url"].as_str().unwrap()).await;
    assert!(
        query(back.location.as_deref().unwrap()).contains_key("code"),
        "{}",
        back.body
    );

    let list: Value = app
        .get_bearer("/auth/consents", &account)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["consents"][0]["client_id"], "photos");
    assert_eq!(list["consents"][0]["client_name"], "App photos");
    assert_eq!(list["consents"][0]["scope"], "openid email");
    let gone = app
        .http
        .delete(app.url("/auth/consents/photos"))
        .bearer_auth(&account)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 204);
    assert_eq!(
        app.validate(done["access_token"].as_str().unwrap()).await,
        401,
        "its sessions ended"
    );
    // Asked again next time.
    let third = rp("start", &input).await;
    let page = browser.get(third["url"].as_str().unwrap()).await;
    assert!(page.body.contains("/oauth/consent"), "{}", page.body);
    // Denying sends the application access_denied.
    let back = browser.consent(&page, "deny").await;
    assert_eq!(query(back.location.as_deref().unwrap())["error"], "access_denied");
}

/// The pages in headless Chromium (tests/support/oidc_browser.py drives it
/// through the DevTools protocol): the password and the consent page,
/// single sign-on at a second application, the second step with an
/// authenticator code and with a passkey, a passkey alone, the sign-up,
/// reset, logout and error pages. No page's policy blocks anything it uses,
/// axe-core finds no serious or critical accessibility violation, and each
/// page's screenshot is kept in target/oidc-pages/.
async fn the_hosted_pages_sign_in_with_a_password_and_with_a_passkey_in_a_real_browser(app: &TestApp) {
    application(app, "browser-a", ClientKind::Public, ConsentMode::Explicit).await;
    application(
        app,
        "browser-b",
        ClientKind::Public,
        ConsentMode::Remembered { days: 30 },
    )
    .await;
    let email = unique_email("oidc-browser");
    app.register_verified(&email, PASSWORD).await;
    let base = format!("http://localhost:{}", app.base.rsplit(':').next().unwrap());
    let root = env!("CARGO_MANIFEST_DIR");
    let shots = format!("{root}/target/oidc-pages/{}", email.split('@').next().unwrap());
    let args = [
        format!("{root}/tests/support/oidc_browser.py"),
        base,
        "browser-a".to_string(),
        "browser-b".to_string(),
        email.clone(),
        PASSWORD.to_string(),
        shots.clone(),
        format!("{root}/tests/support/oidc-rp/node_modules/axe-core/axe.min.js"),
    ];
    // Off the runtime's threads: the service answers the browser meanwhile.
    let out = tokio::task::spawn_blocking(move || std::process::Command::new("python3").args(args).output())
        .await
        .unwrap()
        .expect("python3 (with websocket-client and pyotp) and chromium");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "the browser run failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let line = |name: &str| {
        lines
            .iter()
            .find(|l| l["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}:\n{text}"))
            .clone()
    };
    let pages: Vec<&Value> = lines.iter().filter(|l| l["step"] == "page").collect();
    assert_eq!(pages.len(), 8, "{text}");
    for p in pages {
        assert_eq!(p["csp_violations"], json!([]), "{p}");
        assert!(p["axe_rules_passed"].as_u64().unwrap() > 10, "axe-core ran: {p}");
        let serious: Vec<&Value> = p["axe"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["impact"] == "serious" || v["impact"] == "critical")
            .collect();
        assert!(serious.is_empty(), "accessibility: {p}");
        let name = p["page"].as_str().unwrap();
        assert!(Path::new(&format!("{shots}/{name}.png")).exists(), "{name}");
    }
    assert_eq!(
        line("passkey offered")["offered"],
        true,
        "pages.js ran under the policy"
    );
    assert_eq!(line("single sign-on: first page")["asked_password"], false);
    let apps = line("account page: applications")["apps"].clone();
    assert!(apps.as_array().unwrap().contains(&json!("browser-b")), "{apps}");
    for (name, amr) in [
        ("password sign-in", &["pwd"][..]),
        ("single sign-on", &["pwd"]),
        ("password and authenticator code", &["pwd", "otp"]),
        ("password and passkey", &["pwd", "swk"]),
        ("passkey alone", &["swk"]),
    ] {
        let signed_in = line(name);
        assert_eq!(signed_in["state_matches"], true, "{signed_in}");
        assert_eq!(signed_in["query"]["iss"], ISSUER);
        let tokens = &signed_in["tokens"];
        let id_token = tokens["id_token"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {tokens}"));
        let claims: Value = {
            use base64::Engine;
            let payload = id_token.split('.').nth(1).unwrap();
            serde_json::from_slice(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(payload)
                    .unwrap(),
            )
            .unwrap()
        };
        let got: Vec<&str> = claims["amr"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(amr.iter().all(|m| got.contains(m)), "{name}: {claims}");
        assert_eq!(claims["email"], email);
    }
}

/// OpenID Connect Discovery §3 makes RS256 the algorithm every provider
/// supports, and openid-client expects it of an id_token unless told
/// otherwise: with `signing_algorithm = RS256`, the library's defaults work.
async fn a_provider_signing_with_rs256_satisfies_a_library_left_at_its_defaults(app: &TestApp) {
    let rs = app.twin_with(&[("signing_algorithm", "RS256")]).await;
    let d: Value = rs
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(d["id_token_signing_alg_values_supported"], json!(["RS256"]));
    let secret = application(&rs, "rsa-app", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = unique_email("oidc-rs256");
    rs.register_verified(&email, PASSWORD).await;
    let mut input = rp_input(&rs, "rsa-app", Some(&secret), "openid email");
    input["id_token_alg"] = "RS256".into();
    let started = rp("start", &input).await;
    let mut browser = Browser::new(&rs);
    let page = browser.get(started["url"].as_str().unwrap()).await;
    let back = browser.sign_in(&page, &email, PASSWORD).await;
    let done = finish(&started, &input, back.location.as_deref().unwrap()).await;
    assert_eq!(done["claims"]["email"], email);
    let header: Value = {
        use base64::Engine;
        let h = done["id_token"].as_str().unwrap().split('.').next().unwrap();
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(header["alg"], "RS256");
    rs.stop().await;
}

/// The JOSE header of a compact JWS.
fn jws_header(token: &str) -> Value {
    use base64::Engine;
    let h = token.split('.').next().unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(h)
            .unwrap(),
    )
    .unwrap()
}

/// `id_token_signing_algorithms` keeps an RS256 key beside the EdDSA one:
/// a client registered with `id_token_signed_response_alg = RS256` gets
/// RS256 id_tokens (a library at its defaults accepts them), the others
/// EdDSA ones, and every access token stays EdDSA.
async fn one_application_gets_rs256_id_tokens_while_the_others_and_every_access_token_stay_on_eddsa(
    app: &TestApp,
) {
    let both = app.twin_with(&[("id_token_signing_algorithms", "RS256")]).await;
    let d: Value = both
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        d["id_token_signing_alg_values_supported"],
        json!(["EdDSA", "RS256"])
    );
    let clients = &both.services.features.clients;
    let mut s = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
    s.consent = ConsentMode::Skip;
    s.id_token_signed_response_alg = Some("ES256".into());
    let refused = clients.add("es-app", None, &[], Some(&s)).await.unwrap_err();
    assert!(
        refused.to_string().contains("id_token_signed_response_alg"),
        "{refused}"
    );
    s.id_token_signed_response_alg = Some("RS256".into());
    let rs_secret = clients.add("rs-app", None, &[], Some(&s)).await.unwrap().unwrap();
    let ed_secret = application(&both, "ed-app", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = unique_email("oidc-two-algs");
    both.register_verified(&email, PASSWORD).await;
    let mut browser = Browser::new(&both);
    for (client, secret, alg) in [("rs-app", &rs_secret, "RS256"), ("ed-app", &ed_secret, "EdDSA")] {
        let mut input = rp_input(&both, client, Some(secret), "openid email");
        input["id_token_alg"] = alg.into();
        let started = rp("start", &input).await;
        let page = browser.get(started["url"].as_str().unwrap()).await;
        let back = if page.location.is_some() {
            browser.follow(page).await
        } else {
            browser.sign_in(&page, &email, PASSWORD).await
        };
        let done = finish(&started, &input, back.location.as_deref().unwrap()).await;
        assert_eq!(
            jws_header(done["id_token"].as_str().unwrap())["alg"],
            alg,
            "{client}"
        );
        assert_eq!(
            jws_header(done["access_token"].as_str().unwrap())["alg"],
            "EdDSA",
            "{client}"
        );
    }
    both.stop().await;
}

/// The claims of a compact JWS (read, not verified).
fn jws_claims(token: &str) -> Value {
    use base64::Engine;
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(p)
            .unwrap(),
    )
    .unwrap()
}

/// `access_token_ttl_secs` and `session_ttl_secs` of a client: its access
/// tokens and id_tokens live that long, at the exchange and at each
/// refresh, and its sessions end that soon; longer than the service's own
/// access-token lifetime is refused (keys retire by that one).
async fn an_application_with_lifetimes_of_its_own_gets_shorter_tokens_and_sessions(app: &TestApp) {
    let clients = &app.services.features.clients;
    let mut s = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
    s.consent = ConsentMode::Skip;
    s.access_token_ttl_secs = Some(1_000_000);
    let refused = clients.add("long-app", None, &[], Some(&s)).await.unwrap_err();
    assert!(refused.to_string().contains("access_token_ttl_secs"), "{refused}");
    s.access_token_ttl_secs = Some(60);
    s.session_ttl_secs = Some(120);
    let secret = clients
        .add("short-app", None, &[], Some(&s))
        .await
        .unwrap()
        .unwrap();
    let email = unique_email("oidc-lifetimes");
    app.register_verified(&email, PASSWORD).await;
    let tokens = code_grant(app, "short-app", &secret, &email, "openid offline_access").await;
    assert_eq!(tokens["expires_in"], 60);
    for token in ["access_token", "id_token"] {
        let c = jws_claims(tokens[token].as_str().unwrap());
        assert_eq!(
            c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
            60,
            "{token}"
        );
    }
    let sid = jws_claims(tokens["access_token"].as_str().unwrap())["sid"]
        .as_str()
        .unwrap()
        .to_string();
    let life = app
        .count(&format!(
            "SELECT expires_at - created_at FROM sessions WHERE id = '{sid}'"
        ))
        .await;
    assert_eq!(life, 120_000, "the session ends after session_ttl_secs");
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth("short-app", Some(&secret))
        .form(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", tokens["refresh_token"].as_str().unwrap()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let refreshed: Value = r.json().await.unwrap();
    assert_eq!(refreshed["expires_in"], 60);
    let c = jws_claims(refreshed["access_token"].as_str().unwrap());
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 60);
}
