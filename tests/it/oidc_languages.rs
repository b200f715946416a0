//! The languages of the hosted pages (English, German, French, Spanish):
//! the application's `ui_locales` first, through every page of its
//! sign-in, then the browser's `Accept-Language`, then English. The
//! conformance scenario `oidcc_ui_locales_and_claims_locales` has the
//! certified libraries ask; here the browser is played by hand.

use reqwest::StatusCode;

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::mfa::{enrol_totp, pyotp, settle_step};
use crate::oidc::{application, assert_speaks, hidden, Browser, Page, CALLBACK};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

crate::on_every_backend!(
    the_browsers_languages_choose_when_the_application_names_none,
    the_language_an_application_asks_for_holds_on_every_page_of_its_sign_in_and_logout,
    the_second_step_speaks_the_language_the_application_asked_for,
    discovery_lists_the_languages_of_the_pages,
);

/// An authorization request of client `id`, with `extra` parameters.
fn authorize_url(id: &str, extra: &[(&str, &str)]) -> String {
    let mut params = vec![
        ("response_type", "code"),
        ("client_id", id),
        ("redirect_uri", CALLBACK),
        ("scope", "openid email"),
        ("state", "s"),
        ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
        ("code_challenge_method", "S256"),
    ];
    params.extend_from_slice(extra);
    format!(
        "/oauth/authorize?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    )
}

async fn the_browsers_languages_choose_when_the_application_names_none(app: &TestApp) {
    application(app, "by-browser", ClientKind::Confidential, ConsentMode::Skip).await;
    for (languages, lang, text) in [
        ("de-CH,de;q=0.9,en;q=0.5", "de", "Passwort vergessen?"),
        ("fr;q=0.4, es;q=0.8", "es", "¿Olvidó su contraseña?"),
        ("ja, fr-CA;q=0.2", "fr", "Mot de passe oublié ?"),
        ("ja, zh;q=0.9", "en", "Forgot your password?"),
        ("de;q=0, *;q=0.1", "en", "Forgot your password?"),
        ("!!!;q=oops,,,", "en", "Forgot your password?"),
    ] {
        let mut browser = Browser::new(app);
        browser.languages = Some(languages.into());
        let page = browser.get(&authorize_url("by-browser", &[])).await;
        assert_eq!(page.status, StatusCode::OK, "{languages}");
        assert_speaks(&page, lang, text);
        // A ui_locales of none the pages speak leaves it to the browser.
        let page = browser
            .get(&authorize_url("by-browser", &[("ui_locales", "xx-YY tlh")]))
            .await;
        assert_speaks(&page, lang, text);
    }
    // Without any: English.
    let page = Browser::new(app).get(&authorize_url("by-browser", &[])).await;
    assert_speaks(&page, "en", "Forgot your password?");
    // An error page before the request checks out speaks the browser's too.
    let mut browser = Browser::new(app);
    browser.languages = Some("fr".into());
    let page = browser.get(&authorize_url("nobody", &[])).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert_speaks(&page, "fr", "n’est pas enregistrée pour la connexion");
}

/// A form of the pending request of `page` (its `authz` and `csrf`) with
/// `fields`.
fn form_of(page: &Page, fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut form = vec![
        ("authz".to_string(), hidden(&page.body, "authz")),
        ("csrf".to_string(), hidden(&page.body, "csrf")),
    ];
    form.extend(fields.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    form
}

/// Posts `form` to `action`, and follows where it leads.
async fn post(browser: &mut Browser<'_>, action: &str, form: &[(String, String)]) -> Page {
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = browser.post(action, &form).await;
    browser.follow(r).await
}

async fn the_language_an_application_asks_for_holds_on_every_page_of_its_sign_in_and_logout(app: &TestApp) {
    application(app, "polyglot", ClientKind::Confidential, ConsentMode::Explicit).await;
    let email = unique_email("polyglot");
    app.register_verified(&email, PASSWORD).await;
    // The browser prefers German; the application asks for Spanish.
    let mut browser = Browser::new(app);
    browser.languages = Some("de".into());
    let login = browser
        .get(&authorize_url("polyglot", &[("ui_locales", "ES-mx de")]))
        .await;
    assert_speaks(&login, "es", "¿Olvidó su contraseña?");
    let authz = hidden(&login.body, "authz");

    // Each page reached from it, and the answers to its forms.
    let signup = browser.get(&format!("/oauth/signup?authz={authz}")).await;
    assert_speaks(&signup, "es", "Crear la cuenta");
    let short = post(
        &mut browser,
        "/oauth/signup",
        &form_of(&signup, &[("email", "new@example.com"), ("password", "short")]),
    )
    .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert_speaks(&short, "es", "La contraseña debe tener entre 8 y 128 caracteres.");
    let reset = browser.get(&format!("/oauth/reset?authz={authz}")).await;
    assert_speaks(&reset, "es", "Enviar el código");
    let sent = post(
        &mut browser,
        "/oauth/reset",
        &form_of(&reset, &[("email", &email)]),
    )
    .await;
    assert_speaks(&sent, "es", &format!("Si {email} tiene una cuenta"));
    let back = browser.get(&format!("/oauth/continue?authz={authz}")).await;
    assert_speaks(&back, "es", "¿Olvidó su contraseña?");
    let wrong = post(
        &mut browser,
        "/oauth/login",
        &form_of(&login, &[("email", &email), ("password", "not the password")]),
    )
    .await;
    assert_speaks(
        &wrong,
        "es",
        "El correo electrónico o la contraseña no son correctos.",
    );
    let consent = post(
        &mut browser,
        "/oauth/login",
        &form_of(&wrong, &[("email", &email), ("password", PASSWORD)]),
    )
    .await;
    assert_speaks(&consent, "es", "Ver su dirección de correo electrónico");
    assert!(
        consent.body.contains("<strong>App polyglot</strong> solicita:"),
        "{}",
        consent.body
    );
    let done = browser.consent(&consent, "allow").await;
    assert!(done.location.as_deref().is_some_and(|l| l.starts_with(CALLBACK)));

    // Logout asks in the language it was asked in, and says so after.
    let logout = browser
        .get("/oauth/logout?client_id=polyglot&ui_locales=fr")
        .await;
    assert_speaks(
        &logout,
        "fr",
        "Se déconnecter de latchkey (demandé par App polyglot) ?",
    );
    let csrf = hidden(&logout.body, "csrf");
    let out = browser
        .post(
            "/oauth/logout/confirm",
            &[
                ("csrf", &csrf),
                ("client_id", "polyglot"),
                ("ui_locales", &hidden(&logout.body, "ui_locales")),
            ],
        )
        .await;
    assert_speaks(&out, "fr", "Vous êtes déconnecté.");
    // Nobody signed in any more, no ui_locales: the browser's language.
    let again = browser.get("/oauth/logout").await;
    assert_speaks(&again, "de", "Sie sind abgemeldet.");
}

async fn the_second_step_speaks_the_language_the_application_asked_for(app: &TestApp) {
    application(app, "zweifach", ClientKind::Confidential, ConsentMode::Skip).await;
    let email = unique_email("zweifach");
    let pair = app.register_verified(&email, PASSWORD).await;
    let (secret, _) = enrol_totp(app, pair["access_token"].as_str().unwrap()).await;
    let mut browser = Browser::new(app);
    let login = browser
        .get(&authorize_url("zweifach", &[("ui_locales", "de-AT")]))
        .await;
    assert_speaks(&login, "de", "Passwort vergessen?");
    let step = browser.sign_in(&login, &email, PASSWORD).await;
    assert_speaks(&step, "de", "<h1>Zweiter Schritt</h1>");
    assert!(
        step.body.contains("Code aus Ihrer Authenticator-App"),
        "{}",
        step.body
    );
    let form = |page: &Page, code: &str| {
        let mut f = form_of(page, &[("code", code)]);
        for k in ["mfa_token", "factors"] {
            f.push((k.to_string(), hidden(&page.body, k)));
        }
        f
    };
    // A code of five minutes ahead is no code of now.
    let wrong = post(&mut browser, "/oauth/mfa", &form(&step, &pyotp(&secret, 10))).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_speaks(&wrong, "de", "Das hat nicht geklappt. Noch ");
    settle_step().await;
    let back = post(&mut browser, "/oauth/mfa", &form(&wrong, &pyotp(&secret, 1))).await;
    assert!(
        back.location.as_deref().is_some_and(|l| l.starts_with(CALLBACK)),
        "{}",
        back.body
    );
}

async fn discovery_lists_the_languages_of_the_pages(app: &TestApp) {
    let d: serde_json::Value = app
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        d["ui_locales_supported"],
        serde_json::json!(["en", "de", "fr", "es"])
    );
}
