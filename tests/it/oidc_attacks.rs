//! Attacks on the OpenID Provider, as an outside attacker would try them
//! (RFC 9700, the OAuth 2.0 Security Best Current Practice, names most of
//! them): redirect URIs that almost match, a stolen code without its
//! verifier or at another client, forms posted from another site, silent
//! requests that would need the user, and a browser session that ended
//! elsewhere. The browser is played in Rust (tests/it/oidc.rs); no
//! relying party library is needed to attack.

use base64::Engine;
use reqwest::StatusCode;
use serde_json::Value;

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::{application, hidden, pkce, query, with_query, Browser, Page, CALLBACK, ISSUER};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

crate::on_every_backend!(
    a_redirect_uri_that_almost_matches_gets_an_error_page_and_no_redirect,
    a_loopback_redirect_uri_matches_on_any_port_and_nothing_else,
    mistakes_after_the_redirect_uri_is_known_go_back_to_it_with_state_and_iss,
    a_stolen_code_is_useless_without_its_client_its_redirect_uri_and_its_verifier,
    a_form_posted_without_this_browsers_csrf_token_is_refused,
    a_silent_request_that_needs_the_user_answers_the_client_with_an_error,
    prompt_login_and_max_age_zero_ask_for_the_password_again,
    a_browser_session_ended_elsewhere_signs_nobody_in,
    the_password_grant_is_off_by_default,
    a_code_presented_twice_ends_the_session_it_started,
    a_spent_public_code_without_its_verifier_ends_nothing,
    a_token_request_that_repeats_a_parameter_is_refused,
    an_application_whose_refresh_grant_was_taken_away_refreshes_no_more,
    cross_origin_calls_are_answered_only_for_origins_a_client_registered,
    a_flood_of_cross_origin_requests_reads_the_clients_at_most_once_a_second,
    withdrawing_consent_voids_the_codes_not_yet_exchanged,
    an_applications_token_tells_only_what_the_user_let_it_see,
    the_browsers_session_cookie_is_no_refresh_token,
    a_sign_up_on_the_pages_needs_the_emailed_code_and_then_signs_in,
    a_back_channel_logout_uri_cannot_point_the_provider_at_its_own_network,
);

/// `/oauth/authorize?...` of these parameters.
fn authorize(params: &[(&str, &str)]) -> String {
    with_query("/oauth/authorize", params)
}

/// A well-formed request of `client` with `challenge`, and `extra`.
fn request(client: &str, challenge: &str, extra: &[(&str, &str)]) -> String {
    let mut p = vec![
        ("response_type", "code"),
        ("client_id", client),
        ("redirect_uri", CALLBACK),
        ("scope", "openid"),
        ("state", "st-1"),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
    ];
    for (k, v) in extra {
        p.retain(|(k2, _)| k2 != k);
        p.push((k, v));
    }
    authorize(&p)
}

/// A user, signed in at the hosted page in `browser` for `client` (consent
/// skipped): the code sent back.
async fn signed_in_code(browser: &mut Browser<'_>, client: &str, email: &str, challenge: &str) -> String {
    let page = browser.get(&request(client, challenge, &[])).await;
    let back = browser.sign_in(&page, email, PASSWORD).await;
    code_of(&back)
}

/// A new user signed in, in a new browser, to a new application `client`
/// that skips consent: (the browser, the user's email, a PKCE challenge).
async fn signed_in_browser<'a>(app: &'a TestApp, client: &str, tag: &str) -> (Browser<'a>, String, String) {
    application(app, client, ClientKind::Confidential, ConsentMode::Skip).await;
    let email = user(app, tag).await;
    let (_, challenge) = pkce();
    let mut browser = Browser::new(app);
    signed_in_code(&mut browser, client, &email, &challenge).await;
    (browser, email, challenge)
}

fn code_of(back: &Page) -> String {
    let to = back
        .location
        .as_deref()
        .unwrap_or_else(|| panic!("a redirect to the client: {} {}", back.status, back.body));
    query(to)
        .remove("code")
        .unwrap_or_else(|| panic!("a code in {to}"))
}

/// `POST /oauth/token` of `form` by the confidential `client` (id,
/// secret): the status and the JSON answer.
async fn token_call(app: &TestApp, client: (&str, &str), form: &[(&str, &str)]) -> (u16, Value) {
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth(client.0, Some(client.1))
        .form(form)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn exchange(app: &TestApp, client: (&str, &str), fields: &[(&str, &str)]) -> (u16, Value) {
    let mut form = vec![("grant_type", "authorization_code")];
    form.extend_from_slice(fields);
    token_call(app, client, &form).await
}

async fn refresh(app: &TestApp, client: (&str, &str), token: &str) -> (u16, Value) {
    token_call(
        app,
        client,
        &[("grant_type", "refresh_token"), ("refresh_token", token)],
    )
    .await
}

async fn user(app: &TestApp, tag: &str) -> String {
    let email = unique_email(tag);
    app.register_verified(&email, PASSWORD).await;
    email
}

async fn a_redirect_uri_that_almost_matches_gets_an_error_page_and_no_redirect(app: &TestApp) {
    let mut s = ClientSettings::new(
        ClientKind::Confidential,
        vec!["https://app.example.test/cb".into()],
    );
    s.consent = ConsentMode::Skip;
    app.services
        .features
        .clients
        .add("exact", None, &[], Some(&s))
        .await
        .unwrap()
        .unwrap();
    let (_, challenge) = pkce();
    let mut browser = Browser::new(app);
    for attempt in [
        "https://app.example.test/cb/",
        "https://app.example.test/cb/../evil",
        "https://app.example.test/cb?next=https://evil.example",
        "https://app.example.test/cb#x",
        "https://app.example.test/CB",
        "https://APP.example.test/cb",
        "https://app.example.test:444/cb",
        "http://app.example.test/cb",
        "https://app.example.test.evil.example/cb",
        "https://app.example.test@evil.example/cb",
        "https://evil.example/cb",
        "https://app.example.test/%63b",
        "",
    ] {
        let page = browser
            .get(&authorize(&[
                ("response_type", "code"),
                ("client_id", "exact"),
                ("redirect_uri", attempt),
                ("scope", "openid"),
                ("code_challenge", &challenge),
                ("code_challenge_method", "S256"),
            ]))
            .await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{attempt}: {}", page.body);
        assert_eq!(page.location, None, "{attempt}: never redirected");
    }
    // An unknown client gets the page too, whatever redirect_uri it names.
    let page = browser
        .get(&request("nobody-registered-this", &challenge, &[]))
        .await;
    assert_eq!((page.status, page.location), (StatusCode::BAD_REQUEST, None));
    // And the registered one, exactly, goes on to the sign-in page.
    let page = browser
        .get(&request(
            "exact",
            &challenge,
            &[("redirect_uri", "https://app.example.test/cb")],
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("/oauth/login"));
}

async fn a_loopback_redirect_uri_matches_on_any_port_and_nothing_else(app: &TestApp) {
    application(app, "native", ClientKind::Public, ConsentMode::Skip).await;
    let (_, challenge) = pkce();
    let mut browser = Browser::new(app);
    // RFC 8252 §7.3: a native app listens on a port of its choosing.
    let page = browser
        .get(&request(
            "native",
            &challenge,
            &[("redirect_uri", "http://127.0.0.1:53124/callback")],
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    for attempt in [
        "http://127.0.0.1:53124/callback/other",
        "http://127.0.0.2:53124/callback",
        "https://127.0.0.1:53124/callback",
        "http://127.0.0.1.evil.example:53124/callback",
    ] {
        let page = browser
            .get(&request("native", &challenge, &[("redirect_uri", attempt)]))
            .await;
        assert_eq!(
            (page.status, page.location.as_deref()),
            (StatusCode::BAD_REQUEST, None),
            "{attempt}"
        );
    }
}

async fn mistakes_after_the_redirect_uri_is_known_go_back_to_it_with_state_and_iss(app: &TestApp) {
    application(app, "errs", ClientKind::Confidential, ConsentMode::Skip).await;
    let (_, challenge) = pkce();
    let mut browser = Browser::new(app);
    for (extra, error) in [
        (&[("response_type", "token")][..], "unsupported_response_type"),
        (
            &[("response_type", "code id_token")][..],
            "unsupported_response_type",
        ),
        (&[("code_challenge_method", "plain")][..], "invalid_request"),
        (&[("code_challenge", "too-short")][..], "invalid_request"),
        (&[("prompt", "none login")][..], "invalid_request"),
        (&[("max_age", "soon")][..], "invalid_request"),
        (
            &[("request", "eyJhbGciOiJub25lIn0.e30.")][..],
            "request_not_supported",
        ),
        (
            &[("request_uri", "https://evil.example/r")][..],
            "request_uri_not_supported",
        ),
    ] {
        let page = browser.get(&request("errs", &challenge, extra)).await;
        let to = page
            .location
            .unwrap_or_else(|| panic!("{extra:?}: a redirect, got {}", page.body));
        assert!(to.starts_with(CALLBACK), "{to}");
        let q = query(&to);
        assert_eq!(q["error"], error, "{extra:?}");
        assert_eq!(q["state"], "st-1", "{extra:?}");
        assert_eq!(q["iss"], ISSUER, "{extra:?}: RFC 9207");
        assert!(!q.contains_key("code"));
    }
    // A parameter given twice (RFC 6749 §3.1).
    let twice = format!("{}&scope=openid", request("errs", &challenge, &[]));
    let page = browser.get(&twice).await;
    assert_eq!(
        query(page.location.as_deref().unwrap())["error"],
        "invalid_request"
    );
}

async fn a_stolen_code_is_useless_without_its_client_its_redirect_uri_and_its_verifier(app: &TestApp) {
    let secret = application(app, "victim", ClientKind::Confidential, ConsentMode::Skip).await;
    let other = application(app, "thief", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = user(app, "stolen-code").await;
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(app);
    let code = signed_in_code(&mut browser, "victim", &email, &challenge).await;
    let (wrong_verifier, _) = pkce();
    for (who, fields) in [
        (
            ("thief", other.as_str()),
            vec![
                ("code", code.as_str()),
                ("redirect_uri", CALLBACK),
                ("code_verifier", verifier.as_str()),
            ],
        ),
        (
            ("victim", secret.as_str()),
            vec![
                ("code", code.as_str()),
                ("redirect_uri", CALLBACK),
                ("code_verifier", wrong_verifier.as_str()),
            ],
        ),
        (
            ("victim", secret.as_str()),
            vec![("code", code.as_str()), ("redirect_uri", CALLBACK)],
        ),
        (
            ("victim", secret.as_str()),
            vec![
                ("code", code.as_str()),
                ("redirect_uri", "http://127.0.0.1/other"),
                ("code_verifier", verifier.as_str()),
            ],
        ),
    ] {
        let (status, body) = exchange(app, who, &fields).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_grant")),
            "{who:?} {fields:?}"
        );
    }
    // A wrong secret is not a client at all.
    let (status, body) = exchange(
        app,
        ("victim", "not-the-secret"),
        &[
            ("code", &code),
            ("redirect_uri", CALLBACK),
            ("code_verifier", &verifier),
        ],
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (401, Some("invalid_client")));
    // None of that spent it: the rightful exchange still works.
    let (status, body) = exchange(
        app,
        ("victim", &secret),
        &[
            ("code", &code),
            ("redirect_uri", CALLBACK),
            ("code_verifier", &verifier),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id_token"].is_string());
}

async fn a_code_presented_twice_ends_the_session_it_started(app: &TestApp) {
    let secret = application(app, "twice", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = user(app, "code-twice").await;
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(app);
    let code = signed_in_code(&mut browser, "twice", &email, &challenge).await;
    let fields = [
        ("code", code.as_str()),
        ("redirect_uri", CALLBACK),
        ("code_verifier", verifier.as_str()),
    ];
    let (status, first) = exchange(app, ("twice", &secret), &fields).await;
    assert_eq!(status, 200);
    let at = first["access_token"].as_str().unwrap();
    assert_eq!(app.validate(at).await, 200);
    // Another client presenting the spent code is refused and ends nothing:
    // a code found in a log must not log the user out.
    let other = application(app, "finder", ClientKind::Confidential, ConsentMode::Skip).await;
    let (status, _) = exchange(app, ("finder", &other), &fields).await;
    assert_eq!(status, 400);
    assert_eq!(app.validate(at).await, 200);
    let (status, again) = exchange(app, ("twice", &secret), &fields).await;
    assert_eq!((status, again["error"].as_str()), (400, Some("invalid_grant")));
    // RFC 6749 §4.1.2: what the first exchange issued is revoked.
    assert_eq!(app.validate(at).await, 401);
    let (status, _) = refresh(
        app,
        ("twice", &secret),
        first["refresh_token"].as_str().unwrap_or("none"),
    )
    .await;
    assert_eq!(status, 400);
}

/// A public client names itself by its `client_id` alone, so a spent code
/// read from its callback URL (a history, a log) would be enough to end the
/// user's session there, were the verifier not asked for too.
async fn a_spent_public_code_without_its_verifier_ends_nothing(app: &TestApp) {
    application(app, "spa-reuse", ClientKind::Public, ConsentMode::Skip).await;
    let email = user(app, "spa-reuse").await;
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(app);
    // A public client on a loopback redirect URI always asks for consent.
    let page = browser.get(&request("spa-reuse", &challenge, &[])).await;
    let page = browser.sign_in(&page, &email, PASSWORD).await;
    let code = code_of(&browser.consent(&page, "allow").await);
    let public_exchange = |fields: Vec<(&'static str, String)>| {
        let mut form = vec![
            ("grant_type", "authorization_code".to_string()),
            ("client_id", "spa-reuse".to_string()),
            ("code", code.clone()),
            ("redirect_uri", CALLBACK.to_string()),
        ];
        form.extend(fields);
        async move {
            let r = app
                .http
                .post(app.url("/oauth/token"))
                .form(&form)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, first) = public_exchange(vec![("code_verifier", verifier.clone())]).await;
    assert_eq!(status, 200, "{first}");
    let at = first["access_token"].as_str().unwrap();
    // The finder has the code and the client's id, not the verifier.
    let (other_verifier, _) = pkce();
    for fields in [vec![], vec![("code_verifier", other_verifier)]] {
        let (status, body) = public_exchange(fields).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_grant")),
            "{body}"
        );
        assert_eq!(app.validate(at).await, 200, "the application's session lives on");
    }
    // The application itself presenting it again: a reuse, which ends it.
    let (status, body) = public_exchange(vec![("code_verifier", verifier)]).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_grant")),
        "{body}"
    );
    assert_eq!(app.validate(at).await, 401);
}

/// RFC 6749 §3.2: no parameter is sent twice; the token endpoint refuses
/// what the authorization endpoint refuses, so that a proxy in front that
/// reads the other copy cannot disagree with it.
async fn a_token_request_that_repeats_a_parameter_is_refused(app: &TestApp) {
    let secret = application(app, "repeats", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = user(app, "repeats").await;
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(app);
    let code = signed_in_code(&mut browser, "repeats", &email, &challenge).await;
    let fields = [
        ("code", code.as_str()),
        ("redirect_uri", CALLBACK),
        ("code_verifier", verifier.as_str()),
    ];
    for twice in ["code", "redirect_uri", "code_verifier"] {
        let mut repeated = fields.to_vec();
        repeated.push((twice, "other"));
        let (status, body) = exchange(app, ("repeats", &secret), &repeated).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_request")),
            "{twice}: {body}"
        );
    }
    // Nothing was spent: the request as it should be still gets its tokens.
    let (status, body) = exchange(app, ("repeats", &secret), &fields).await;
    assert_eq!(status, 200, "{body}");
}

async fn an_application_whose_refresh_grant_was_taken_away_refreshes_no_more(app: &TestApp) {
    let secret = application(app, "demoted", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = user(app, "demoted").await;
    let tokens = crate::oidc::code_grant(app, "demoted", &secret, &email, "openid offline_access").await;
    let client = ("demoted", secret.as_str());
    let (status, pair) = refresh(app, client, tokens["refresh_token"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{pair}");
    let mut s = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
    s.consent = ConsentMode::Skip;
    s.grant_types = vec!["authorization_code".into()];
    assert!(app
        .services
        .features
        .clients
        .set_oidc("demoted", Some(&s))
        .await
        .unwrap());
    let (status, body) = refresh(app, client, pair["refresh_token"].as_str().unwrap()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("unauthorized_client")),
        "{body}"
    );
}

async fn a_form_posted_without_this_browsers_csrf_token_is_refused(app: &TestApp) {
    application(app, "csrf", ClientKind::Confidential, ConsentMode::Explicit).await;
    let email = user(app, "csrf").await;
    let (_, challenge) = pkce();
    let mut victim = Browser::new(app);
    let page = victim.get(&request("csrf", &challenge, &[])).await;
    let authz = hidden(&page.body, "authz");
    let csrf = hidden(&page.body, "csrf");
    // Another browser (the attacker's page posting into the victim's
    // browser has the victim's cookies but cannot read the token; one with
    // the token has no cookie): both are refused, and nobody is signed in.
    let mut attacker = Browser::new(app);
    for (attackers, token) in [(false, "guessed"), (false, ""), (true, csrf.as_str())] {
        let browser = if attackers { &mut attacker } else { &mut victim };
        let r = browser
            .post(
                "/oauth/login",
                &[
                    ("authz", &authz),
                    ("csrf", token),
                    ("email", &email),
                    ("password", PASSWORD),
                ],
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.location.is_none());
        assert!(!browser.cookies.contains_key("latchkey_session"));
    }
    // The consent form too: signed in properly, then a forged "allow".
    let consent_page = victim.sign_in(&page, &email, PASSWORD).await;
    let consent = hidden(&consent_page.body, "consent");
    let r = victim
        .post(
            "/oauth/consent",
            &[("consent", &consent), ("csrf", "guessed"), ("decision", "allow")],
        )
        .await;
    assert_eq!((r.status, r.location), (StatusCode::FORBIDDEN, None));
    // And the logout confirmation.
    let r = victim.post("/oauth/logout/confirm", &[("csrf", "guessed")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(victim.cookies.contains_key("latchkey_session"), "still signed in");
    // Every page refuses to be framed.
    assert_eq!(page.headers["x-frame-options"], "DENY");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
}

async fn a_silent_request_that_needs_the_user_answers_the_client_with_an_error(app: &TestApp) {
    application(app, "silent", ClientKind::Confidential, ConsentMode::Explicit).await;
    let email = user(app, "silent").await;
    let (_, challenge) = pkce();
    let mut browser = Browser::new(app);
    let silent = request("silent", &challenge, &[("prompt", "none")]);
    // Not signed in: login_required, and no page is shown.
    let back = browser.get(&silent).await;
    let q = query(back.location.as_deref().unwrap());
    assert_eq!(
        (q["error"].as_str(), q["state"].as_str()),
        ("login_required", "st-1")
    );
    // Signed in but never asked: consent_required.
    let page = browser.get(&request("silent", &challenge, &[])).await;
    let consent_page = browser.sign_in(&page, &email, PASSWORD).await;
    assert!(consent_page.body.contains("/oauth/consent"));
    let back = browser.get(&silent).await;
    assert_eq!(
        query(back.location.as_deref().unwrap())["error"],
        "consent_required"
    );
    // An id_token_hint of someone else: login_required, never a code for
    // the browser's user.
    let other = application(app, "hinted", ClientKind::Confidential, ConsentMode::Skip).await;
    let someone = user(app, "silent-other").await;
    let (v2, c2) = pkce();
    let mut their_browser = Browser::new(app);
    let code = signed_in_code(&mut their_browser, "hinted", &someone, &c2).await;
    let (_, tokens) = exchange(
        app,
        ("hinted", &other),
        &[
            ("code", &code),
            ("redirect_uri", CALLBACK),
            ("code_verifier", &v2),
        ],
    )
    .await;
    let hint = tokens["id_token"].as_str().unwrap();
    let mut mine = Browser::new(app);
    let page = mine.get(&request("hinted", &challenge, &[])).await;
    let back = mine.sign_in(&page, &email, PASSWORD).await;
    assert!(query(back.location.as_deref().unwrap()).contains_key("code"));
    let back = mine
        .get(&request(
            "hinted",
            &challenge,
            &[("prompt", "none"), ("id_token_hint", hint)],
        ))
        .await;
    assert_eq!(
        query(back.location.as_deref().unwrap())["error"],
        "login_required"
    );
}

async fn prompt_login_and_max_age_zero_ask_for_the_password_again(app: &TestApp) {
    let (mut browser, email, challenge) = signed_in_browser(app, "fresh", "fresh").await;
    // Signed in: a plain request gets a code at once.
    let back = browser.get(&request("fresh", &challenge, &[])).await;
    assert!(query(back.location.as_deref().unwrap()).contains_key("code"));
    for extra in [("prompt", "login"), ("max_age", "0")] {
        let page = browser.get(&request("fresh", &challenge, &[extra])).await;
        assert_eq!(page.status, StatusCode::OK, "{extra:?}");
        assert!(page.body.contains("/oauth/login"), "{extra:?}: the sign-in page");
        // Signing in again satisfies it (no loop back to the page).
        let back = browser.sign_in(&page, &email, PASSWORD).await;
        assert!(
            query(back.location.as_deref().unwrap()).contains_key("code"),
            "{extra:?}"
        );
    }
}

async fn a_browser_session_ended_elsewhere_signs_nobody_in(app: &TestApp) {
    let (mut browser, email, challenge) = signed_in_browser(app, "ended", "ended").await;
    // The user ends every session from another device (a new login there).
    crate::oidc::sign_out_elsewhere(app, &email).await;
    // The browser's cookie no longer signs anyone in.
    let page = browser.get(&request("ended", &challenge, &[])).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("/oauth/login"), "{}", page.body);
    let back = browser
        .get(&request("ended", &challenge, &[("prompt", "none")]))
        .await;
    assert_eq!(
        query(back.location.as_deref().unwrap())["error"],
        "login_required"
    );
}

async fn the_password_grant_is_off_by_default(app: &TestApp) {
    let secret = crate::oauth::client(app, "legacy").await;
    let email = user(app, "legacy").await;
    let r = crate::oauth::form(
        app,
        "/oauth/token",
        Some(("legacy", &secret)),
        &[
            ("grant_type", "password"),
            ("username", &email),
            ("password", PASSWORD),
        ],
    )
    .await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("unsupported_grant_type")),
        "{body}"
    );
    assert!(body["error_description"]
        .as_str()
        .unwrap()
        .contains("oauth_password_grant"));
}

/// Every request with an `Origin` header asks whether some client
/// registered it: a set in memory, read from the clients at most once a
/// second, so a flood of such requests is no flood of database reads. A
/// client added here is answered at once all the same.
async fn a_flood_of_cross_origin_requests_reads_the_clients_at_most_once_a_second(app: &TestApp) {
    let preflight = |origin: String| {
        app.http
            .request(reqwest::Method::OPTIONS, app.url("/oauth/token"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let reads = || app.services.features.provider.origin_reads();
    let before = reads();
    let started = std::time::Instant::now();
    for i in 0..300 {
        let r = preflight(format!("https://flood{i}.example")).await.unwrap();
        assert!(!r.headers().contains_key("access-control-allow-origin"));
    }
    let made = reads() - before;
    let allowed = started.elapsed().as_secs() + 2;
    assert!(made <= allowed, "{made} reads of every client for 300 requests");

    // Registered now, answered now: adding a client forgets what was read.
    let mut s = ClientSettings::new(ClientKind::Public, vec![CALLBACK.into()]);
    s.allowed_origins = vec!["https://new.example.test".into()];
    app.services
        .features
        .clients
        .add("spa-new", None, &[], Some(&s))
        .await
        .unwrap();
    let r = preflight("https://new.example.test".into()).await.unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://new.example.test"
    );
    // And removing it takes it away at once.
    app.services.features.clients.remove("spa-new").await.unwrap();
    let r = preflight("https://new.example.test".into()).await.unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
}

async fn cross_origin_calls_are_answered_only_for_origins_a_client_registered(app: &TestApp) {
    let mut s = ClientSettings::new(ClientKind::Public, vec![CALLBACK.into()]);
    s.allowed_origins = vec!["https://spa.example.test".into()];
    app.services
        .features
        .clients
        .add("spa-cors", None, &[], Some(&s))
        .await
        .unwrap();
    let preflight = |origin: &'static str, path: &'static str| {
        app.http
            .request(reqwest::Method::OPTIONS, app.url(path))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization, content-type")
            .send()
    };
    for path in [
        "/oauth/token",
        "/oauth/userinfo",
        "/oauth/revoke",
        "/oauth/introspect",
    ] {
        let r = preflight("https://spa.example.test", path).await.unwrap();
        assert_eq!(r.status(), 204, "{path}");
        let h = r.headers();
        assert_eq!(
            h["access-control-allow-origin"], "https://spa.example.test",
            "{path}"
        );
        assert!(h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST"));
        assert!(h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("authorization"));
        assert!(
            !h.contains_key("access-control-allow-credentials"),
            "never cookies"
        );
        // Another origin, or the registered one with another port or scheme.
        for other in [
            "https://evil.example",
            "https://spa.example.test:8443",
            "http://spa.example.test",
            "null",
        ] {
            let r = preflight(other, path).await.unwrap();
            assert!(
                !r.headers().contains_key("access-control-allow-origin"),
                "{path} {other}"
            );
        }
    }
    // The request itself: the origin in the answer only for a registered one.
    for (origin, allowed) in [
        ("https://spa.example.test", true),
        ("https://evil.example", false),
    ] {
        let r = app
            .http
            .post(app.url("/oauth/token"))
            .header("origin", origin)
            .form(&[
                ("grant_type", "authorization_code"),
                ("client_id", "spa-cors"),
                ("code", "x"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(
            r.headers().contains_key("access-control-allow-origin"),
            allowed,
            "{origin}"
        );
    }
    // Discovery and the JWKS are for anyone.
    for path in ["/.well-known/openid-configuration", "/.well-known/jwks.json"] {
        let r = app
            .http
            .get(app.url(path))
            .header("origin", "https://anyone.example")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["access-control-allow-origin"], "*", "{path}");
    }
    // Without an Origin, nothing changes: OPTIONS is not a method of these.
    let r = app
        .http
        .request(reqwest::Method::OPTIONS, app.url("/oauth/token"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(!r.headers().contains_key("access-control-allow-origin"));
}

async fn withdrawing_consent_voids_the_codes_not_yet_exchanged(app: &TestApp) {
    let secret = application(
        app,
        "withdrawn",
        ClientKind::Confidential,
        ConsentMode::Remembered { days: 30 },
    )
    .await;
    let email = user(app, "withdrawn").await;
    let pair: Value = app
        .post(
            "/auth/login",
            serde_json::json!({"email": email, "password": PASSWORD}),
        )
        .await
        .json()
        .await
        .unwrap();
    let (verifier, challenge) = pkce();
    let mut browser = Browser::new(app);
    let page = browser.get(&request("withdrawn", &challenge, &[])).await;
    let page = browser.sign_in(&page, &email, PASSWORD).await;
    let code = code_of(&browser.consent(&page, "allow").await);
    let r = app
        .http
        .delete(app.url("/auth/consents/withdrawn"))
        .bearer_auth(pair["access_token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (status, body) = exchange(
        app,
        ("withdrawn", &secret),
        &[
            ("code", &code),
            ("redirect_uri", CALLBACK),
            ("code_verifier", &verifier),
        ],
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_grant")),
        "{body}"
    );
}

async fn an_applications_token_tells_only_what_the_user_let_it_see(app: &TestApp) {
    let secret = application(app, "openid-only", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = user(app, "openid-only").await;
    let tokens = crate::oidc::code_grant(app, "openid-only", &secret, &email, "openid").await;
    let at = tokens["access_token"].as_str().unwrap();
    let claims: Value = {
        let payload = at.split('.').nth(1).unwrap();
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(
        claims["email"], "",
        "no email scope, no email in the token: {claims}"
    );
    let v: Value = app.get_bearer("/auth/validate", at).await.json().await.unwrap();
    assert_eq!(v["email"], "");
    // Nor through the account's own endpoint, which is first-party only.
    let r = app.get_bearer("/auth/me", at).await;
    assert_eq!(r.status(), 403);
    // userinfo answers by scope.
    let info: Value = app.get_bearer("/oauth/userinfo", at).await.json().await.unwrap();
    assert!(info.get("email").is_none(), "{info}");
    // Nor does introspecting its refresh token tell it.
    let tokens = crate::oidc::code_grant(app, "openid-only", &secret, &email, "openid offline_access").await;
    let refresh = tokens["refresh_token"]
        .as_str()
        .expect("offline_access gives a refresh token");
    let r = app
        .http
        .post(app.url("/oauth/introspect"))
        .basic_auth("openid-only", Some(&secret))
        .form(&[("token", refresh), ("token_type_hint", "refresh_token")])
        .send()
        .await
        .unwrap();
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["active"], true, "{doc}");
    assert!(doc.get("email").is_none(), "no email scope, no email: {doc}");
    // With the email scope, it may.
    let tokens = crate::oidc::code_grant(app, "openid-only", &secret, &email, "openid email").await;
    let v: Value = app
        .get_bearer("/auth/validate", tokens["access_token"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["email"], email);
}

async fn the_browsers_session_cookie_is_no_refresh_token(app: &TestApp) {
    let (mut browser, _, challenge) = signed_in_browser(app, "cookie", "cookie").await;
    let cookie = browser.cookies["latchkey_session"].clone();
    // Stolen, it is no credential of the JSON API...
    let r = app
        .post("/auth/refresh", serde_json::json!({"refresh_token": cookie}))
        .await;
    assert_eq!(r.status(), 401);
    // ... while it still signs the browser in (single sign-on).
    let back = browser.get(&request("cookie", &challenge, &[])).await;
    assert!(query(back.location.as_deref().unwrap()).contains_key("code"));
    // A cookie made up by the client is nobody's session.
    let mut forged = Browser::new(app);
    forged
        .cookies
        .insert("latchkey_session".into(), "AAAA".repeat(30));
    let page = forged.get(&request("cookie", &challenge, &[])).await;
    assert!(page.body.contains("/oauth/login"), "{}", page.body);
}

async fn a_sign_up_on_the_pages_needs_the_emailed_code_and_then_signs_in(app: &TestApp) {
    application(app, "newcomer", ClientKind::Confidential, ConsentMode::Skip).await;
    let (_, challenge) = pkce();
    let mut browser = Browser::new(app);
    let page = browser.get(&request("newcomer", &challenge, &[])).await;
    let authz = hidden(&page.body, "authz");
    let csrf = hidden(&page.body, "csrf");
    let email = unique_email("pages-signup");
    let form = |token: &'static str| -> Vec<(&str, &str)> {
        vec![
            ("authz", &authz),
            ("csrf", token),
            ("email", &email),
            ("password", PASSWORD),
        ]
    };
    // Without the browser's CSRF token: refused, nothing registered.
    let r = browser.post("/oauth/signup", &form("guessed")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(app.mails_to(&email).is_empty());
    // With it: the verification page, and a code by mail.
    let real = vec![
        ("authz", authz.as_str()),
        ("csrf", &csrf),
        ("email", &email),
        ("password", PASSWORD),
    ];
    let page = browser.post("/oauth/signup", &real).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("/oauth/signup/verify"), "{}", page.body);
    let code = app.wait_for_code(&email, 1).await;
    let r = browser
        .post(
            "/oauth/signup/verify",
            &[
                ("authz", &authz),
                ("csrf", &csrf),
                ("email", &email),
                ("code", &code),
            ],
        )
        .await;
    let back = browser.follow(r).await;
    let to = back
        .location
        .as_deref()
        .unwrap_or_else(|| panic!("{}", back.body));
    assert!(query(to).contains_key("code"), "{to}");
}

/// Server-side request forgery through back-channel logout: a client whose
/// logout URI names a loopback, private or metadata address would have the
/// provider post to it whenever a session ends. Registration refuses it
/// (the decision only: nothing is sent to the addresses refused), as it
/// refuses webhooks, unless the operator allows private addresses.
async fn a_back_channel_logout_uri_cannot_point_the_provider_at_its_own_network(app: &TestApp) {
    let clients = &app.services.features.clients;
    for (i, uri) in [
        "http://127.0.0.1:9180/revocations",
        "http://[::1]/logout",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.7/logout",
        "http://localhost/logout",
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
        s.backchannel_logout_uri = Some(uri.into());
        let id = format!("ssrf{i}");
        let refused = clients.add(&id, None, &[], Some(&s)).await.unwrap_err();
        assert!(
            refused.to_string().contains("backchannel_logout_uri"),
            "{uri}: {refused}"
        );
        assert!(
            clients.get(&id).await.unwrap().is_none(),
            "{uri}: nothing registered"
        );
        // Nor can settings given later point there.
        let ok = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
        clients.add(&id, None, &[], Some(&ok)).await.unwrap();
        assert!(clients.set_oidc(&id, Some(&s)).await.is_err(), "{uri}");
    }
    assert_eq!(
        app.count("SELECT COUNT(*) FROM webhooks WHERE client_id IS NOT NULL")
            .await,
        0
    );
}
