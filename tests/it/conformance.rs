//! The OpenID Foundation's certification test plans for providers (Basic
//! OP, RP-Initiated Logout OP, Back-Channel Logout OP), module by module:
//! each scenario here is named after the module it answers and says, in
//! our own words, what the module checks. The relying party is
//! openid-client (a certified library that refuses anything off the
//! specification: `tests/support/oidc-rp/rp.mjs`); the browser is played
//! in Rust (tests/it/oidc.rs). docs/conformance.md has the table of every
//! module of the three plans, with the scenario or existing test that
//! answers it, or why it does not apply.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::{
    application, assert_speaks, finish_with, hidden, query, rp_input, rp_of, Browser, Page, AFTER_LOGOUT,
    AUTHLIB, CALLBACK, GO_OIDC, ISSUER, OPENID_CLIENT,
};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

// The provider's defaults: an RS256 key for id_tokens beside the EdDSA one.
crate::on_every_backend!(
    settings = &[("id_token_signing_algorithms", "RS256")];
    oidcc_response_type_missing,
    oidcc_userinfo_get_post_header_and_post_body,
    oidcc_ensure_request_without_nonce_succeeds_for_code_flow,
    oidcc_scope_profile_email_address_phone_and_all,
    oidcc_ensure_other_scope_order_succeeds,
    oidcc_display_page_and_popup,
    oidcc_prompt_none_logged_in,
    oidcc_max_age_1_and_max_age_10000,
    oidcc_ensure_request_with_unknown_parameter_succeeds,
    oidcc_id_token_hint,
    oidcc_login_hint,
    oidcc_ui_locales_and_claims_locales,
    oidcc_ensure_request_with_acr_values_succeeds,
    oidcc_codereuse_30seconds,
    oidcc_ensure_post_request_succeeds,
    oidcc_server_client_secret_post,
    oidcc_claims_essential,
    oidcc_refresh_token,
    oidcc_rp_initiated_logout_bad_post_logout_redirect_uri,
    oidcc_rp_initiated_logout_modified_id_token_hint,
    oidcc_rp_initiated_logout_no_id_token_hint,
    oidcc_rp_initiated_logout_no_params,
    oidcc_rp_initiated_logout_no_post_logout_redirect_uri,
    oidcc_rp_initiated_logout_no_state_and_only_state,
    oidcc_rp_initiated_logout_and_backchannel_logout_discovery_endpoint_verification,
    a_certified_provider_answers_as_latchkey_does_but_for_the_differences_documented,
    the_libraries_sign_in_at_the_certified_provider_and_get_the_same_claims_but_for_those_documented,
);

/// The relying-party libraries every scenario that signs in runs with:
/// it passes only when each accepts every answer.
const LIBRARIES: [&str; 3] = [OPENID_CLIENT, AUTHLIB, GO_OIDC];

/// A relying party of the scenarios: a confidential client that skips
/// consent, a verified user, and a browser.
struct Rp<'a> {
    app: &'a TestApp,
    /// The relying party's library ([`LIBRARIES`]).
    library: &'static str,
    id: String,
    secret: String,
    email: String,
    browser: Browser<'a>,
}

impl<'a> Rp<'a> {
    /// Client `id` of `library` (its id made unique per library).
    async fn new(app: &'a TestApp, id: &str, library: &'static str) -> Rp<'a> {
        let id = format!("{id}-{library}");
        let secret = application(app, &id, ClientKind::Confidential, ConsentMode::Skip).await;
        let email = unique_email(&id);
        app.register_verified(&email, PASSWORD).await;
        Rp {
            app,
            library,
            id,
            secret,
            email,
            browser: Browser::new(app),
        }
    }

    /// The library's input for `scope`, with `extra` on top.
    fn input(&self, scope: &str, extra: Value) -> Value {
        let mut input = rp_input(self.app, &self.id, Some(&self.secret), scope);
        if let (Some(i), Some(e)) = (input.as_object_mut(), extra.as_object()) {
            i.extend(e.clone());
        }
        input
    }

    /// The library's authorization request for `input`.
    async fn start(&self, input: &Value) -> Value {
        rp_of(self.library, "start", input).await
    }

    /// The library's half after the browser came back with `callback`.
    async fn finish(&self, started: &Value, input: &Value, callback: &str) -> Value {
        finish_with(self.library, started, input, callback).await
    }

    /// The browser at the library's authorization URL: where it ends, a
    /// page of the provider or the redirect back.
    async fn authorize(&mut self, started: &Value) -> Page {
        let page = self.browser.get(started["url"].as_str().unwrap()).await;
        self.browser.follow(page).await
    }

    /// A whole sign-in: the library starts, the browser signs in if the
    /// provider asks, the library finishes (and refuses anything off the
    /// specification). The library's result.
    async fn sign_in(&mut self, input: &Value) -> Value {
        let started = self.start(input).await;
        let page = self.authorize(&started).await;
        let back = self.signed_in(page).await;
        self.finish(&started, input, back.location.as_deref().unwrap())
            .await
    }

    /// `page`, signed in with the password if it is the sign-in page.
    async fn signed_in(&mut self, page: Page) -> Page {
        if page.location.is_some() {
            return page;
        }
        let email = self.email.clone();
        self.browser.sign_in(&page, &email, PASSWORD).await
    }
}

/// `/oauth/authorize?...` of `params`.
fn authorize_url(params: &[(&str, &str)]) -> String {
    format!(
        "/oauth/authorize?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    )
}

/// `oidcc-response-type-missing`: an authorization request without
/// `response_type`, from a known client to its registered redirect URI,
/// goes back to the client with an error (`invalid_request`, or
/// `unsupported_response_type`), its `state` and `iss`, and no code.
async fn oidcc_response_type_missing(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "rt-missing", library).await;
        let url = authorize_url(&[
            ("client_id", rp.id.as_str()),
            ("redirect_uri", CALLBACK),
            ("scope", "openid"),
            ("state", "s-1"),
            ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
            ("code_challenge_method", "S256"),
        ]);
        let page = rp.browser.get(&url).await;
        let to = page.location.expect("back to the client");
        assert!(to.starts_with(CALLBACK), "{to}");
        let q = query(&to);
        assert!(
            ["invalid_request", "unsupported_response_type"].contains(&q["error"].as_str()),
            "{q:?}"
        );
        assert_eq!((q["state"].as_str(), q["iss"].as_str()), ("s-1", ISSUER));
        assert!(!q.contains_key("code"));
    }
}

/// `oidcc-userinfo-get`, `oidcc-userinfo-post-header`,
/// `oidcc-userinfo-post-body`: userinfo answers the same claims to `GET`
/// and to `POST` with the access token in the `Authorization` header; the
/// token in a form body (RFC 6750 §2.2, which Core does not require and
/// the module accepts a refusal of) is refused with `401` and a
/// `WWW-Authenticate` challenge, telling nothing.
async fn oidcc_userinfo_get_post_header_and_post_body(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "userinfo", library).await;
        let done = rp.sign_in(&rp.input("openid email", json!({}))).await;
        assert_eq!(done["userinfo"]["email"], rp.email.as_str(), "the library's GET");
        let at = done["access_token"].as_str().unwrap();
        let get: Value = app.get_bearer("/oauth/userinfo", at).await.json().await.unwrap();
        let post = app
            .http
            .post(app.url("/oauth/userinfo"))
            .bearer_auth(at)
            .send()
            .await
            .unwrap();
        assert_eq!(post.status(), 200);
        assert_eq!(post.json::<Value>().await.unwrap(), get);
        let body = app
            .http
            .post(app.url("/oauth/userinfo"))
            .form(&[("access_token", at)])
            .send()
            .await
            .unwrap();
        assert_eq!(body.status(), 401);
        assert!(body.headers().contains_key("www-authenticate"));
        assert!(!body.text().await.unwrap().contains(&rp.email));
    }
}

/// `oidcc-ensure-request-without-nonce-succeeds-for-code-flow`: `nonce` is
/// optional in the code flow (Core §3.1.2.1); without one the sign-in
/// succeeds and the id_token has none.
async fn oidcc_ensure_request_without_nonce_succeeds_for_code_flow(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "no-nonce", library).await;
        let done = rp.sign_in(&rp.input("openid", json!({"no_nonce": true}))).await;
        assert!(done["claims"].get("nonce").is_none(), "{done}");
    }
}

/// `oidcc-scope-profile`, `oidcc-scope-email`, `oidcc-scope-address`,
/// `oidcc-scope-phone`, `oidcc-scope-all`: each scope's claims come back
/// (`profile`: `name` when the user has one; `email`: `email` and
/// `email_verified`); `address` and `phone`, which this provider keeps no
/// data for and does not list in `scopes_supported`, are ignored, not
/// refused (Core §3.1.2.1), and the granted `scope` says so.
async fn oidcc_scope_profile_email_address_phone_and_all(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "scopes", library).await;
        let profile = rp.sign_in(&rp.input("openid profile", json!({}))).await;
        assert!(profile["userinfo"].get("email").is_none(), "{profile}");
        let email = rp.sign_in(&rp.input("openid email", json!({}))).await;
        assert_eq!(email["claims"]["email"], rp.email.as_str());
        assert_eq!(email["userinfo"]["email_verified"], true);
        let all = rp
            .sign_in(&rp.input("openid profile email address phone", json!({})))
            .await;
        assert_eq!(all["scope"], "openid profile email", "{all}");
        assert_eq!(all["userinfo"]["email"], rp.email.as_str());
        let d: Value = app
            .get("/.well-known/openid-configuration")
            .await
            .json()
            .await
            .unwrap();
        let supported: Vec<&str> = d["scopes_supported"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(!supported.contains(&"address") && !supported.contains(&"phone"));
    }
}

/// `oidcc-ensure-other-scope-order-succeeds`: scope order does not matter.
async fn oidcc_ensure_other_scope_order_succeeds(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "scope-order", library).await;
        let done = rp.sign_in(&rp.input("email openid", json!({}))).await;
        assert_eq!(done["claims"]["email"], rp.email.as_str());
    }
}

/// `oidcc-display-page`, `oidcc-display-popup`: `display` is accepted; the
/// page is the same one (Core §3.1.2.1 lets the provider choose).
async fn oidcc_display_page_and_popup(app: &TestApp) {
    for library in LIBRARIES {
        for display in ["page", "popup"] {
            let mut rp = Rp::new(app, &format!("display-{display}"), library).await;
            let input = rp.input("openid", json!({"extra": {"display": display}}));
            let started = rp.start(&input).await;
            let page = rp.authorize(&started).await;
            assert_eq!(page.status, StatusCode::OK, "{display}: the sign-in page");
            let back = rp.signed_in(page).await;
            rp.finish(&started, &input, back.location.as_deref().unwrap())
                .await;
        }
    }
}

/// `oidcc-prompt-none-logged-in`: with a browser session, `prompt=none`
/// answers at once with a code, and the sign-in completes.
async fn oidcc_prompt_none_logged_in(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "none-in", library).await;
        let first = rp.sign_in(&rp.input("openid", json!({}))).await;
        let input = rp.input("openid", json!({"extra": {"prompt": "none"}}));
        let started = rp.start(&input).await;
        let back = rp.authorize(&started).await;
        assert!(
            back.location.as_deref().is_some_and(|l| l.starts_with(CALLBACK)),
            "no page"
        );
        let done = rp
            .finish(&started, &input, back.location.as_deref().unwrap())
            .await;
        assert_eq!(done["claims"]["sub"], first["claims"]["sub"]);
    }
}

/// `oidcc-max-age-1`, `oidcc-max-age-10000`: a sign-in older than
/// `max_age` seconds asks for the password again and the new id_token's
/// `auth_time` is the new sign-in's; a younger one does not, and keeps the
/// old `auth_time`. The library checks `auth_time` against `max_age`
/// itself. (The module waits a second; here the session's sign-in is made
/// older in the database instead, so the scenario takes no time.)
async fn oidcc_max_age_1_and_max_age_10000(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "max-age", library).await;
        let first = rp.sign_in(&rp.input("openid", json!({}))).await;
        let user = first["claims"]["sub"].as_str().unwrap().to_string();
        app.sql(&format!(
            "UPDATE sessions SET auth_time = auth_time - 5000 WHERE user_id = '{user}'"
        ))
        .await;
        let input = rp.input("openid", json!({"max_age": 10000, "extra": {"max_age": "10000"}}));
        let started = rp.start(&input).await;
        let back = rp.authorize(&started).await;
        assert!(back.location.is_some(), "max_age=10000: no password asked");
        let kept = rp
            .finish(&started, &input, back.location.as_deref().unwrap())
            .await;
        let old = first["claims"]["auth_time"].as_i64().unwrap() - 5;
        assert_eq!(kept["claims"]["auth_time"].as_i64().unwrap(), old);

        let input = rp.input("openid", json!({"max_age": 1, "extra": {"max_age": "1"}}));
        let started = rp.start(&input).await;
        let page = rp.authorize(&started).await;
        assert!(
            page.body.contains("/oauth/login"),
            "max_age=1: the password again"
        );
        let back = rp.signed_in(page).await;
        let again = rp
            .finish(&started, &input, back.location.as_deref().unwrap())
            .await;
        assert!(again["claims"]["auth_time"].as_i64().unwrap() > old);
    }
}

/// `oidcc-ensure-request-with-unknown-parameter-succeeds`: parameters the
/// provider does not know are ignored (Core §3.1.2.1).
async fn oidcc_ensure_request_with_unknown_parameter_succeeds(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "unknown-param", library).await;
        rp.sign_in(&rp.input("openid", json!({"extra": {"extra": "foobar"}})))
            .await;
    }
}

/// `oidcc-id-token-hint`: `prompt=none` with the user's own id_token as
/// `id_token_hint` signs in silently, as the same user.
async fn oidcc_id_token_hint(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "hint", library).await;
        let first = rp.sign_in(&rp.input("openid", json!({}))).await;
        let hint = first["id_token"].as_str().unwrap();
        let input = rp.input(
            "openid",
            json!({"extra": {"prompt": "none", "id_token_hint": hint}}),
        );
        let started = rp.start(&input).await;
        let back = rp.authorize(&started).await;
        let done = rp
            .finish(&started, &input, back.location.as_deref().unwrap())
            .await;
        assert_eq!(done["claims"]["sub"], first["claims"]["sub"]);
    }
}

/// `oidcc-login-hint`: `login_hint` fills in the sign-in form's address.
async fn oidcc_login_hint(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "login-hint", library).await;
        let email = rp.email.clone();
        let input = rp.input("openid", json!({"extra": {"login_hint": email}}));
        let started = rp.start(&input).await;
        let page = rp.authorize(&started).await;
        assert!(
            page.body.contains(&format!(
                "name=\"email\" type=\"email\" autocomplete=\"username webauthn\" value=\"{email}\""
            )),
            "{}",
            page.body
        );
        let back = rp.signed_in(page).await;
        rp.finish(&started, &input, back.location.as_deref().unwrap())
            .await;
    }
}

/// `oidcc-ui-locales`, `oidcc-claims-locales`: both are accepted. The
/// pages speak the first language of `ui_locales` they know (en, de, fr,
/// es; `xx-YY fr` is French), English when they know none, and keep it
/// through the sign-in (the page after a wrong password); claims have no
/// localized forms (Core §5.2 lets a provider without them ignore
/// `claims_locales`).
async fn oidcc_ui_locales_and_claims_locales(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "locales", library).await;
        for (asked, lang, text) in [
            ("xx-YY fr", "fr", "Mot de passe oublié ?"),
            ("se xx-YY", "en", "Forgot your password?"),
        ] {
            let started = rp
                .start(&rp.input("openid", json!({"extra": {"ui_locales": asked}})))
                .await;
            let page = rp.authorize(&started).await;
            assert_eq!(page.status, StatusCode::OK, "{asked}: the sign-in page");
            assert_speaks(&page, lang, text);
        }

        let input = rp.input(
            "openid email",
            json!({"extra": {"ui_locales": "de", "claims_locales": "de"}}),
        );
        let started = rp.start(&input).await;
        let page = rp.authorize(&started).await;
        assert_speaks(&page, "de", "Passwort vergessen?");
        let email = rp.email.clone();
        let wrong = rp.browser.sign_in(&page, &email, "not the password").await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
        assert_speaks(&wrong, "de", "Die E-Mail-Adresse oder das Passwort ist falsch.");
        let again = rp
            .browser
            .post(
                "/oauth/login",
                &[
                    ("authz", &hidden(&wrong.body, "authz")),
                    ("csrf", &hidden(&wrong.body, "csrf")),
                    ("email", &email),
                    ("password", PASSWORD),
                ],
            )
            .await;
        let back = rp.browser.follow(again).await;
        let done = rp
            .finish(&started, &input, back.location.as_deref().unwrap())
            .await;
        assert_eq!(done["claims"]["email"], email.as_str());
        let localized = |v: &Value| v.as_object().unwrap().keys().any(|k| k.contains('#'));
        assert!(
            !localized(&done["claims"]) && !localized(&done["userinfo"]),
            "{done}"
        );
    }
}

/// `oidcc-ensure-request-with-acr-values-succeeds`: `acr_values` is a
/// voluntary request (Core §3.1.2.1): asking for `1 2` signs in; a user
/// without a second factor gets `acr` `1`.
async fn oidcc_ensure_request_with_acr_values_succeeds(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "acr", library).await;
        let done = rp
            .sign_in(&rp.input("openid", json!({"extra": {"acr_values": "1 2"}})))
            .await;
        assert_eq!(done["claims"]["acr"], "1", "{done}");
    }
}

/// `oidcc-codereuse-30seconds` (and `oidcc-codereuse`): a code presented
/// again, here 30 seconds after its first use (its use made older in the
/// database), is refused with `invalid_grant`, and what its first use
/// issued stops working (RFC 6749 §4.1.2).
async fn oidcc_codereuse_30seconds(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "reuse30", library).await;
        let input = rp.input("openid", json!({}));
        let started = rp.start(&input).await;
        let page = rp.authorize(&started).await;
        let back = rp.signed_in(page).await;
        let callback = back.location.unwrap();
        let done = rp.finish(&started, &input, &callback).await;
        app.sql("UPDATE authorization_codes SET used_at = used_at - 30000, created_at = created_at - 30000")
            .await;
        let again = app
            .http
            .post(app.url("/oauth/token"))
            .basic_auth(&rp.id, Some(&rp.secret))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", query(&callback)["code"].as_str()),
                ("redirect_uri", CALLBACK),
                ("code_verifier", started["code_verifier"].as_str().unwrap()),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 400);
        assert_eq!(again.json::<Value>().await.unwrap()["error"], "invalid_grant");
        let at = done["access_token"].as_str().unwrap();
        assert_eq!(app.get_bearer("/oauth/userinfo", at).await.status(), 401);
    }
}

/// `oidcc-ensure-post-request-succeeds`: the authorization request may be
/// a form `POST` (Core §3.1.2.1).
async fn oidcc_ensure_post_request_succeeds(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "post-authz", library).await;
        let input = rp.input("openid", json!({}));
        let started = rp.start(&input).await;
        let url = url::Url::parse(started["url"].as_str().unwrap()).unwrap();
        let form: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let page = rp.browser.post("/oauth/authorize", &form).await;
        let page = rp.browser.follow(page).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let back = rp.signed_in(page).await;
        rp.finish(&started, &input, back.location.as_deref().unwrap())
            .await;
    }
}

/// `oidcc-server-client-secret-post`: the whole sign-in with the client
/// authenticating by `client_secret_post` at the token endpoint.
async fn oidcc_server_client_secret_post(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "secret-post", library).await;
        let done = rp
            .sign_in(&rp.input("openid offline_access", json!({"auth": "post"})))
            .await;
        assert!(done["refreshed"]["access_token"].is_string(), "{done}");
    }
}

/// `oidcc-claims-essential`: the `claims` parameter, which this provider
/// does not support (`claims_parameter_supported: false`), is ignored and
/// the sign-in succeeds.
async fn oidcc_claims_essential(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "claims", library).await;
        let claims = json!({"userinfo": {"name": {"essential": true}}}).to_string();
        rp.sign_in(&rp.input("openid", json!({"extra": {"claims": claims}})))
            .await;
    }
}

/// `oidcc-refresh-token`: the refresh token works for its client (the
/// library refreshes) and not for another client, which gets
/// `invalid_grant`.
async fn oidcc_refresh_token(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "refresher", library).await;
        let done = rp.sign_in(&rp.input("openid offline_access", json!({}))).await;
        let other_id = format!("other-{library}");
        let other = application(app, &other_id, ClientKind::Confidential, ConsentMode::Skip).await;
        let r = app
            .http
            .post(app.url("/oauth/token"))
            .basic_auth(&other_id, Some(&other))
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
        assert_eq!(r.status(), 400);
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_grant");
    }
}

/// The logout URL of `params`.
fn logout_url(params: &[(&str, &str)]) -> String {
    format!(
        "/oauth/logout?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    )
}

/// Confirms the logout page `page` (every parameter it carries): the answer.
async fn confirm(browser: &mut Browser<'_>, page: &Page) -> Page {
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let mut form = vec![("csrf".to_string(), hidden(&page.body, "csrf"))];
    for k in ["id_token_hint", "client_id", "post_logout_redirect_uri", "state"] {
        if page.body.contains(&format!("name=\"{k}\"")) {
            form.push((k.to_string(), hidden(&page.body, k)));
        }
    }
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    browser.post("/oauth/logout/confirm", &form).await
}

/// Whether the browser session still signs in silently.
async fn still_signed_in(rp: &mut Rp<'_>) -> bool {
    let input = rp.input("openid", json!({"extra": {"prompt": "none"}}));
    let started = rp.start(&input).await;
    let back = rp.authorize(&started).await;
    back.location
        .as_deref()
        .is_some_and(|l| query(l).contains_key("code"))
}

/// A logout request of `params` that the provider must refuse: an error
/// page, no redirect, and the user still signed in.
async fn refused_logout(rp: &mut Rp<'_>, params: &[(&str, &str)]) {
    let page = rp.browser.get(&logout_url(params)).await;
    assert_eq!(
        (page.status, page.location.as_deref()),
        (StatusCode::BAD_REQUEST, None),
        "{params:?}: an error page, never a redirect"
    );
    assert!(still_signed_in(rp).await, "{params:?}: still signed in");
}

/// `oidcc-rp-initiated-logout-bad-post-logout-redirect-uri`: a
/// `post_logout_redirect_uri` the client did not register is refused with
/// an error page: no redirect, and the user stays signed in.
async fn oidcc_rp_initiated_logout_bad_post_logout_redirect_uri(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "bad-plru", library).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let hint = done["id_token"].as_str().unwrap();
        refused_logout(
            &mut rp,
            &[
                ("id_token_hint", hint),
                ("post_logout_redirect_uri", "http://127.0.0.1/elsewhere"),
                ("state", "s"),
            ],
        )
        .await;
    }
}

/// `oidcc-rp-initiated-logout-modified-id-token-hint`: an `id_token_hint`
/// whose signature does not verify is refused with an error page: no
/// redirect, and the user stays signed in.
async fn oidcc_rp_initiated_logout_modified_id_token_hint(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "bad-hint", library).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let token = done["id_token"].as_str().unwrap();
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let flipped = if signature.starts_with('A') { "B" } else { "A" };
        let modified = format!("{signed}.{flipped}{}", &signature[1..]);
        refused_logout(
            &mut rp,
            &[
                ("id_token_hint", &modified),
                ("post_logout_redirect_uri", AFTER_LOGOUT),
                ("state", "s"),
            ],
        )
        .await;
    }
}

/// `oidcc-rp-initiated-logout-no-id-token-hint`: with a
/// `post_logout_redirect_uri` but neither `id_token_hint` nor `client_id`,
/// the provider cannot tell whose URI it is: it does not redirect there
/// (RP-Initiated Logout §3). latchkey refuses the request with an error
/// page; the user stays signed in.
async fn oidcc_rp_initiated_logout_no_id_token_hint(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "no-hint", library).await;
        rp.sign_in(&rp.input("openid", json!({}))).await;
        // Never redirected to a URI nobody vouched for.
        refused_logout(
            &mut rp,
            &[("post_logout_redirect_uri", AFTER_LOGOUT), ("state", "s")],
        )
        .await;
    }
}

/// `oidcc-rp-initiated-logout-no-params`: a logout without any parameter
/// asks the user, and confirming signs them out (a page, no redirect).
async fn oidcc_rp_initiated_logout_no_params(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "no-params", library).await;
        rp.sign_in(&rp.input("openid", json!({}))).await;
        let page = rp.browser.get("/oauth/logout").await;
        let out = confirm(&mut rp.browser, &page).await;
        let out = rp.browser.follow(out).await;
        assert_eq!(
            (out.status, out.location.as_deref()),
            (StatusCode::OK, None),
            "{}",
            out.body
        );
        assert!(!still_signed_in(&mut rp).await);
    }
}

/// `oidcc-rp-initiated-logout-no-post-logout-redirect-uri`: with an
/// `id_token_hint` only, the user is signed out and shown a page.
async fn oidcc_rp_initiated_logout_no_post_logout_redirect_uri(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "no-plru", library).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let page = rp
            .browser
            .get(&logout_url(&[(
                "id_token_hint",
                done["id_token"].as_str().unwrap(),
            )]))
            .await;
        let out = confirm(&mut rp.browser, &page).await;
        let out = rp.browser.follow(out).await;
        assert_eq!((out.status, out.location.as_deref()), (StatusCode::OK, None));
        assert!(!still_signed_in(&mut rp).await);
    }
}

/// `oidcc-rp-initiated-logout-no-state`, `oidcc-rp-initiated-logout-only-state`:
/// without `state`, the redirect to the registered URI carries none; with
/// `state` but no `post_logout_redirect_uri`, there is no redirect to carry
/// it (a page).
async fn oidcc_rp_initiated_logout_no_state_and_only_state(app: &TestApp) {
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "states", library).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let page = rp
            .browser
            .get(&logout_url(&[
                ("id_token_hint", done["id_token"].as_str().unwrap()),
                ("post_logout_redirect_uri", AFTER_LOGOUT),
            ]))
            .await;
        let out = confirm(&mut rp.browser, &page).await;
        assert_eq!(out.location.as_deref(), Some(AFTER_LOGOUT), "no state added");

        rp.sign_in(&rp.input("openid", json!({}))).await;
        let page = rp.browser.get(&logout_url(&[("state", "only")])).await;
        let out = confirm(&mut rp.browser, &page).await;
        let out = rp.browser.follow(out).await;
        assert_eq!((out.status, out.location.as_deref()), (StatusCode::OK, None));
        assert!(!out.body.contains("only"), "the state goes nowhere");
    }
}

/// `oidcc-rp-initiated-logout-discovery-endpoint-verification`,
/// `oidcc-backchannel-logout-discovery-endpoint-verification`: discovery
/// names the `end_session_endpoint` (under the issuer), and says
/// `backchannel_logout_supported` and `backchannel_logout_session_supported`.
async fn oidcc_rp_initiated_logout_and_backchannel_logout_discovery_endpoint_verification(app: &TestApp) {
    let d: Value = app
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(d["issuer"], ISSUER);
    assert_eq!(d["end_session_endpoint"], format!("{ISSUER}/oauth/logout"));
    assert_eq!(d["backchannel_logout_supported"], true);
    assert_eq!(d["backchannel_logout_session_supported"], true);
    assert_eq!(d["frontchannel_logout_supported"], false);
}

/// node-oidc-provider (`tests/support/oidc-op/op.mjs`), certified for these
/// plans, on a free loopback port for as long as this value lives.
struct CertifiedProvider {
    child: std::process::Child,
    issuer: String,
}

impl CertifiedProvider {
    /// Started with the clients `clients` (its JSON client metadata).
    async fn start(clients: Value) -> CertifiedProvider {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/oidc-op/op.mjs");
        let arg = json!({ "clients": clients }).to_string();
        tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut child = std::process::Command::new("node")
                .arg(script)
                .arg(arg)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("node runs node-oidc-provider (tests/support/install-upstreams installs it)");
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let issuer = line
                .trim()
                .strip_prefix("ready ")
                .unwrap_or_else(|| panic!("node-oidc-provider did not start: {line:?}"))
                .to_string();
            CertifiedProvider { child, issuer }
        })
        .await
        .unwrap()
    }
}

impl Drop for CertifiedProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What an authorization request came to, in terms both providers share.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Back to the client with this `error` (and the request's `state`).
    Error(String),
    /// The user is asked to sign in.
    SignIn,
    /// A page of the provider's own with this status (no redirect to the client).
    Page(u16),
}

/// The answer of a provider's authorization endpoint to `url`.
async fn answer(http: &reqwest::Client, url: &str) -> Answer {
    let r = http.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    let location = r
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|v| v.to_str().unwrap().to_string());
    let body = r.text().await.unwrap();
    match location {
        Some(to) if to.starts_with(CALLBACK) => {
            // In the query, or in the fragment for a response type that
            // defaults to it (Core §3.2.2.5, OAuth 2.0 Multiple Response Types §5).
            let u = url::Url::parse(&to).unwrap();
            let q: std::collections::HashMap<String, String> = match u.fragment() {
                Some(f) => url::form_urlencoded::parse(f.as_bytes()).into_owned().collect(),
                None => u.query_pairs().into_owned().collect(),
            };
            assert_eq!(q.get("state").map(String::as_str), Some("st"), "{to}");
            Answer::Error(q.get("error").cloned().unwrap_or_else(|| "none".into()))
        }
        Some(_) => Answer::SignIn,
        None if status == 200 && body.contains("password") => Answer::SignIn,
        None => Answer::Page(status),
    }
}

/// Changes to a well-formed authorization request: a value `None` removes
/// the parameter.
type Change<'a> = Vec<(&'a str, Option<&'a str>)>;
/// A token request's form.
type Form<'a> = Vec<(&'a str, &'a str)>;

/// An authorization URL at `endpoint` of a well-formed request of client
/// `client`, with `change` applied (a value `None` removes the parameter).
fn probe_url(endpoint: &str, client: &str, change: &[(&str, Option<&str>)]) -> String {
    let mut params: Vec<(&str, &str)> = vec![
        ("response_type", "code"),
        ("client_id", client),
        ("redirect_uri", CALLBACK),
        ("scope", "openid"),
        ("state", "st"),
        ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
        ("code_challenge_method", "S256"),
    ];
    for (k, v) in change {
        params.retain(|(pk, _)| pk != k);
        if let Some(v) = v {
            params.push((k, v));
        }
    }
    format!(
        "{endpoint}?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    )
}

/// The certified provider and latchkey, given the same requests: their
/// discovery documents share the fields both support with the same values,
/// and every probe of the authorization and token endpoints gets the same
/// answer, but for the differences listed here and in docs/conformance.md
/// ("Differences from the certified provider"), each a deliberate choice.
async fn a_certified_provider_answers_as_latchkey_does_but_for_the_differences_documented(app: &TestApp) {
    let secret = application(app, "compared", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = CertifiedProvider::start(json!([{
        "client_id": "compared",
        "client_secret": secret,
        "redirect_uris": [CALLBACK],
        "post_logout_redirect_uris": [AFTER_LOGOUT],
    }]))
    .await;
    // A connection per request: a provider may close one after an error
    // answer, and a request sent on it meanwhile would fail.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let theirs: Value = http
        .get(format!("{}/.well-known/openid-configuration", op.issuer))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ours: Value = app
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();

    // Discovery: the fields both have carry the same values, but for the
    // endpoints' own URLs and what each supports beyond the other.
    let mut differences: Vec<String> = Vec::new();
    for (k, v) in ours.as_object().unwrap() {
        let Some(t) = theirs.get(k) else { continue };
        let same = match (v, t) {
            (Value::String(a), Value::String(b)) if a.starts_with("http") => {
                a.starts_with(ISSUER) == b.starts_with(&op.issuer)
            }
            (Value::Array(a), Value::Array(b)) => {
                let mut a: Vec<String> = a.iter().map(|x| x.to_string()).collect();
                let mut b: Vec<String> = b.iter().map(|x| x.to_string()).collect();
                a.sort();
                b.sort();
                a == b
            }
            (a, b) => a == b,
        };
        if !same {
            println!("discovery {k}: latchkey {v}, node-oidc-provider {t}");
            differences.push(format!("discovery {k}"));
        }
    }

    // The authorization endpoint, without a browser session.
    let probes: Vec<(&str, Change)> = vec![
        ("well formed", vec![]),
        ("response_type missing", vec![("response_type", None)]),
        ("response_type token", vec![("response_type", Some("token"))]),
        ("unknown scope", vec![("scope", Some("openid address"))]),
        ("no openid scope", vec![("scope", Some("email"))]),
        ("request_uri", vec![("request_uri", Some("https://rp.example/r"))]),
        (
            "request object",
            vec![("request", Some("eyJhbGciOiJub25lIn0.e30."))],
        ),
        ("PKCE plain", vec![("code_challenge_method", Some("plain"))]),
        (
            "PKCE missing",
            vec![("code_challenge", None), ("code_challenge_method", None)],
        ),
        ("prompt none, nobody signed in", vec![("prompt", Some("none"))]),
        ("unknown prompt", vec![("prompt", Some("sometimes"))]),
        ("unknown parameter", vec![("foo", Some("bar"))]),
        ("max_age not a number", vec![("max_age", Some("soon"))]),
        (
            "unregistered redirect_uri",
            vec![("redirect_uri", Some("http://127.0.0.1/elsewhere"))],
        ),
        ("unknown client", vec![("client_id", Some("nobody"))]),
    ];
    for (name, change) in &probes {
        let mine = answer(
            &http,
            &app.url(&probe_url("/oauth/authorize", "compared", change)),
        )
        .await;
        let certified = answer(
            &http,
            &probe_url(&format!("{}/auth", op.issuer), "compared", change),
        )
        .await;
        if mine != certified {
            differences.push(format!("authorize {name}: {mine:?} / {certified:?}"));
        }
    }

    // The token endpoint.
    let verifier = "v".repeat(43);
    let token_probes: Vec<(&str, Form, Option<&str>)> = vec![
        (
            "unknown code",
            vec![
                ("grant_type", "authorization_code"),
                ("code", "nope"),
                ("redirect_uri", CALLBACK),
                ("code_verifier", &verifier),
            ],
            Some(secret.as_str()),
        ),
        (
            "wrong secret",
            vec![
                ("grant_type", "authorization_code"),
                ("code", "nope"),
                ("redirect_uri", CALLBACK),
            ],
            Some("wrong"),
        ),
        (
            "password grant",
            vec![
                ("grant_type", "password"),
                ("username", "a@b.c"),
                ("password", "p"),
            ],
            Some(secret.as_str()),
        ),
        ("no grant_type", vec![], Some(secret.as_str())),
        (
            "unknown refresh token",
            vec![("grant_type", "refresh_token"), ("refresh_token", "nope")],
            Some(secret.as_str()),
        ),
    ];
    for (name, form, secret) in &token_probes {
        let mut outcomes = Vec::new();
        for url in [app.url("/oauth/token"), format!("{}/token", op.issuer)] {
            let mut r = http.post(url).form(form);
            if let Some(s) = secret {
                r = r.basic_auth("compared", Some(s));
            }
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let error = r
                .json::<Value>()
                .await
                .map(|v| v["error"].clone())
                .unwrap_or(Value::Null);
            outcomes.push((status, error));
        }
        if outcomes[0] != outcomes[1] {
            differences.push(format!("token {name}: {:?} / {:?}", outcomes[0], outcomes[1]));
        }
    }
    // Each a choice, explained in docs/conformance.md.
    let expected = [
        // latchkey lists every claim its id_tokens carry.
        "discovery claims_supported",
        // and the grant of its service clients.
        "discovery grant_types_supported",
        // EdDSA signs by default; RS256 for the clients that ask.
        "discovery id_token_signing_alg_values_supported",
        // The code flow's query only: no form_post, no fragment.
        "discovery response_modes_supported",
        // and the admin API's scope.
        "discovery scopes_supported",
        // No JWT client authentication.
        "discovery token_endpoint_auth_methods_supported",
    ];
    assert_eq!(differences, expected, "{differences:#?}");
}

/// Signs in at node-oidc-provider's development pages, as `login`, from
/// its authorization URL `url` (following its redirects, posting each
/// form: the sign-in, then the consent): the redirect back to the client.
async fn sign_in_at_the_certified_provider(
    http: &reqwest::Client,
    issuer: &str,
    url: &str,
    login: &str,
) -> String {
    let mut cookies: std::collections::HashMap<String, String> = Default::default();
    let mut next = (url.to_string(), None::<Vec<(String, String)>>);
    for _ in 0..12 {
        let header = cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        let r = match &next.1 {
            None => http.get(&next.0),
            Some(form) => http.post(&next.0).form(form),
        }
        .header(reqwest::header::COOKIE, header)
        .send()
        .await
        .unwrap();
        for v in r.headers().get_all(reqwest::header::SET_COOKIE) {
            let text = v.to_str().unwrap();
            let pair = text.split(';').next().unwrap();
            if let Some((k, val)) = pair.split_once('=') {
                cookies.insert(k.to_string(), val.to_string());
            }
        }
        let location = r
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| v.to_str().unwrap().to_string());
        match location {
            Some(to) if to.starts_with(CALLBACK) => return to,
            Some(to) if to.starts_with('/') => next = (format!("{issuer}{to}"), None),
            Some(to) => next = (to, None),
            None => {
                let body = r.text().await.unwrap();
                let action = attribute(&body, "action").unwrap_or_else(|| panic!("a form: {body}"));
                assert!(action.starts_with(issuer), "{action}");
                let mut form: Vec<(String, String)> = Vec::new();
                let mut rest = body.as_str();
                while let Some(at) = rest.find("<input") {
                    let tag = &rest[at..rest[at..].find('>').map_or(rest.len(), |e| at + e)];
                    if let Some(name) = attribute(tag, "name") {
                        let value = match name.as_str() {
                            "login" => login.to_string(),
                            "password" => "any".to_string(),
                            _ => attribute(tag, "value").unwrap_or_default(),
                        };
                        form.push((name, value));
                    }
                    rest = &rest[at + 6..];
                }
                next = (action, Some(form));
            }
        }
    }
    panic!("no way back to the client from {url}");
}

/// The value of the first `name="..."` attribute in `html`.
fn attribute(html: &str, name: &str) -> Option<String> {
    let needle = format!("{name}=\"");
    let at = html.find(&needle)? + needle.len();
    Some(html[at..at + html[at..].find('"')?].to_string())
}

/// Each library signs in at both providers (`openid profile email`, with
/// a refresh): the id_tokens carry the same claims but for those listed
/// (docs/conformance.md), and userinfo the same.
async fn the_libraries_sign_in_at_the_certified_provider_and_get_the_same_claims_but_for_those_documented(
    app: &TestApp,
) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for library in LIBRARIES {
        let mut rp = Rp::new(app, "beside", library).await;
        let op = CertifiedProvider::start(json!([{
            "client_id": rp.id,
            "client_secret": rp.secret,
            "redirect_uris": [CALLBACK],
            "post_logout_redirect_uris": [AFTER_LOGOUT],
            "id_token_signed_response_alg": "RS256",
        }]))
        .await;
        let scope = "openid profile email offline_access";
        let ours = rp
            .sign_in(&rp.input(scope, json!({"id_token_alg": "EdDSA"})))
            .await;
        let mut input = rp.input(
            scope,
            json!({"id_token_alg": "RS256", "extra": {"prompt": "consent"}}),
        );
        input["issuer"] = op.issuer.clone().into();
        input["base"] = op.issuer.clone().into();
        let started = rp.start(&input).await;
        let back =
            sign_in_at_the_certified_provider(&http, &op.issuer, started["url"].as_str().unwrap(), &rp.email)
                .await;
        let theirs = rp.finish(&started, &input, &back).await;
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let (mine, certified) = (keys(&ours["claims"]), keys(&theirs["claims"]));
        let only_mine: Vec<&String> = mine.iter().filter(|k| !certified.contains(k)).collect();
        let only_theirs: Vec<&String> = certified.iter().filter(|k| !mine.contains(k)).collect();
        // Optional claims latchkey's id_tokens always carry (Core §2,
        // §3.1.3.6, §5.4): `acr` and `amr` (how the user signed in),
        // `at_hash`, `auth_time`, `azp` (the client), `sid` (for logout),
        // and the email scope's claims (in userinfo too).
        let expected = [
            "acr",
            "amr",
            "at_hash",
            "auth_time",
            "azp",
            "email",
            "email_verified",
            "sid",
        ];
        let only_mine: Vec<&str> = only_mine.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            (only_mine, only_theirs),
            (expected.to_vec(), Vec::<&String>::new()),
            "{library}: latchkey {mine:?}, node-oidc-provider {certified:?}"
        );
        assert_eq!(
            keys(&ours["userinfo"]),
            keys(&theirs["userinfo"]),
            "{library}: userinfo"
        );
        assert!(
            theirs["refreshed"]["access_token"].is_string() && ours["refreshed"]["access_token"].is_string()
        );
    }
}
