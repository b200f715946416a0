//! Signing in with another provider (docs/federation.md): node-oidc-provider
//! (`tests/support/oidc-op/op.mjs`, a certified OpenID Provider) is the
//! upstream, on a loopback port; a browser goes from latchkey's sign-in page
//! through "Continue with ..." to its pages and back, and the application
//! gets latchkey's tokens. The linking rule itself is tested row by row in
//! `domain/federation/rule.rs`; here, that the flow applies it.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::conformance::certified::{through_certified_pages, CertifiedProvider};
use crate::oidc::{application, exchange_code, pkce, with_query, Browser, Page, CALLBACK};
use latchkey::domain::federation::{NewUpstream, Protocol};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

mod account_link;
mod admin;
mod app_pair;
mod github;
mod keycloak;
mod trusted_mfa;
mod upstream_logout;

crate::on_every_backend!(
    a_new_person_signs_in_through_an_upstream_and_comes_back_to_the_same_account,
    an_upstream_address_that_names_an_account_here_signs_in_to_nothing,
    an_address_the_upstream_did_not_verify_or_is_not_trusted_for_neither_links_nor_creates,
    a_way_back_that_is_not_this_browsers_journey_is_refused,
    an_upstream_that_cannot_be_reached_gets_a_clear_page_and_nothing_is_written,
    an_account_with_a_second_factor_steps_up_after_the_upstream,
    a_person_sees_and_unlinks_their_identities_but_never_the_last_way_in,
);

/// The upstream's client for latchkey, and where it sends people back.
const UPSTREAM_CLIENT: &str = "latchkey";
const CALLBACK_HERE: &str = "http://latchkey.test/oauth/upstream/node/callback";
const UPSTREAM_SECRET: &str = "a-secret-only-these-tests-use";

/// node-oidc-provider started with latchkey as its client, and added to
/// latchkey as upstream `node` (`may_create`, `trust`: its policy).
async fn upstream(app: &TestApp, may_create: bool, trust: bool) -> CertifiedProvider {
    let op = CertifiedProvider::start(json!([{
        "client_id": UPSTREAM_CLIENT,
        "client_secret": UPSTREAM_SECRET,
                "redirect_uris": [CALLBACK_HERE],
    }]))
    .await;
    add(app, &op.issuer, may_create, trust).await;
    op
}

/// Adds upstream `node` at `issuer`.
async fn add(app: &TestApp, issuer: &str, may_create: bool, trust: bool) {
    add_upstream(
        app,
        NewUpstream {
            may_create,
            trusts_email_verified: trust,
            ..node(issuer)
        },
    )
    .await;
}

/// Upstream `node` at `issuer`, trusted for nothing, making no accounts.
fn node(issuer: &str) -> NewUpstream {
    NewUpstream {
        name: "node".into(),
        display_name: "Node Example".into(),
        issuer: issuer.into(),
        client_id: UPSTREAM_CLIENT.into(),
        client_secret: UPSTREAM_SECRET.into(),
        scopes: "openid email".into(),
        may_create: false,
        trusts_email_verified: false,
        protocol: Protocol::Oidc,
        trusts_mfa: false,
        email_claim: String::new(),
        name_claim: String::new(),
    }
}

async fn add_upstream(app: &TestApp, u: NewUpstream) {
    let added = app
        .services
        .features
        .federation
        .add(u, latchkey::clock::now_ms())
        .await
        .unwrap();
    assert!(added);
}

/// An application's sign-in that takes "Continue with Node Example" on
/// latchkey's sign-in page and signs in at the upstream as `login`: the
/// page latchkey answers with once back (following its own redirects), and
/// the PKCE verifier of the application's request.
async fn through_upstream(
    browser: &mut Browser<'_>,
    app: &TestApp,
    op: &CertifiedProvider,
    login: &str,
) -> (Page, String) {
    let (verifier, challenge) = pkce();
    let page = browser.get(&authorize_url(&challenge)).await;
    let page = browser.follow(page).await;
    assert!(page.body.contains("Continue with Node Example"), "{}", page.body);
    let link = upstream_link(&page);
    let leave = browser.get(&link).await;
    let to = leave
        .location
        .clone()
        .unwrap_or_else(|| panic!("to the upstream: {}", leave.body));
    assert!(to.starts_with(&op.issuer), "{to}");
    let mut there = Browser::elsewhere(app, &op.issuer);
    let page = there.get(&to).await;
    let page = there.follow(page).await;
    let back = through_certified_pages(&mut there, page, login, CALLBACK_HERE).await;
    let callback = back.location.unwrap();
    let page = browser.get(&callback).await;
    (browser.follow(page).await, verifier)
}

/// The sign-in page's "Continue with Node Example" link.
fn upstream_link(page: &Page) -> String {
    link_to(page, "node")
}

/// The sign-in page's link to upstream `name`.
fn link_to(page: &Page, name: &str) -> String {
    let at = page
        .body
        .find(&format!("href=\"/oauth/upstream/{name}?"))
        .unwrap_or_else(|| panic!("the upstream's link: {}", page.body));
    let href = &page.body[at + 6..];
    href[..href.find('"').unwrap()].replace("&amp;", "&")
}

fn authorize_url(challenge: &str) -> String {
    with_query(
        "/oauth/authorize",
        &[
            ("response_type", "code"),
            ("client_id", "app"),
            ("redirect_uri", CALLBACK),
            ("scope", "openid email"),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256"),
        ],
    )
}

/// The payload of a JWT (its signature is checked where it matters).
fn claims(jwt: &str) -> Value {
    use base64::Engine;
    let payload = jwt.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap()
}

async fn linked(app: &TestApp) -> i64 {
    app.count("SELECT COUNT(*) FROM upstream_identities").await
}

/// A new person comes through the upstream: an account is made at the
/// verified address it asserted, without a password, linked to the
/// upstream identity; the application's id_token says `amr` `fed`. In a
/// new browser, the same upstream identity signs in to the same account,
/// and nothing more is made. Events record the account and the link.
async fn a_new_person_signs_in_through_an_upstream_and_comes_back_to_the_same_account(app: &TestApp) {
    let secret = application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = upstream(app, true, true).await;
    let email = unique_email("fed-new");
    // "Continue with ..." on the sign-up page as on the sign-in page.
    let mut elsewhere = Browser::new(app);
    let page = elsewhere.get(&authorize_url(&pkce().1)).await;
    let page = elsewhere.follow(page).await;
    let authz = crate::oidc::hidden(&page.body, "authz");
    let signup = elsewhere.get(&format!("/oauth/signup?authz={authz}")).await;
    assert_eq!(upstream_link(&signup), upstream_link(&page), "{}", signup.body);
    let mut browser = Browser::new(app);
    let (back, verifier) = through_upstream(&mut browser, app, &op, &email).await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    assert!(callback.starts_with(CALLBACK), "{callback}");
    let tokens = exchange_code(app, "app", &secret, &callback, &verifier).await;
    let id = claims(tokens["id_token"].as_str().unwrap());
    assert_eq!(id["amr"], json!(["fed"]));
    assert_eq!(id["email"], email.as_str());
    let user = app.user(&email).await;
    assert_eq!(id["sub"], user.id.as_str());
    assert!(user.email_verified_at.is_some());
    assert_eq!(
        user.password_hash,
        latchkey::store::UNUSABLE_PASSWORD,
        "no password"
    );
    // The password route signs nobody in to it.
    assert_eq!(app.login(&email, PASSWORD).await.status(), 401);

    let mut again = Browser::new(app);
    let (back, verifier) = through_upstream(&mut again, app, &op, &email).await;
    let tokens = exchange_code(app, "app", &secret, back.location.as_deref().unwrap(), &verifier).await;
    assert_eq!(
        claims(tokens["id_token"].as_str().unwrap())["sub"],
        user.id.as_str()
    );
    assert_eq!(linked(app).await, 1);
    assert_eq!(app.count("SELECT COUNT(*) FROM users").await, 1);
    let events = app
        .count(&format!(
            "SELECT COUNT(*) FROM events WHERE user_id = '{}' AND kind IN ('user.registered', 'identity.linked')",
            user.id
        ))
        .await;
    assert_eq!(events, 2);
}

/// An account here has the address the upstream asserts (verified, and
/// trusted): the upstream identity does not sign in to it, and nothing is
/// linked; the sign-in page asks for the account's password, the address
/// filled in. Signing in to another account with it links nothing; signing
/// in to that account (the proof) asks whether to link the identity:
/// "not now" links nothing, "link" links it, and it then signs in to that
/// account directly.
async fn an_upstream_address_that_names_an_account_here_signs_in_to_nothing(app: &TestApp) {
    application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = upstream(app, true, true).await;
    let email = unique_email("fed-taken");
    app.register_verified(&email, PASSWORD).await;
    let mut browser = Browser::new(app);
    let (page, _) = through_upstream(&mut browser, app, &op, &email).await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert!(page.location.is_none());
    assert!(
        page.body.contains("Node Example is not linked to it"),
        "{}",
        page.body
    );
    assert!(page.body.contains(&format!("value=\"{email}\"")));
    assert_eq!(linked(app).await, 0);
    assert!(
        !browser.cookies.keys().any(|k| k.contains("latchkey_session")),
        "no browser session"
    );

    // Another account's password, in the same browser: nothing linked,
    // nothing asked.
    let other = unique_email("fed-other");
    app.register_verified(&other, PASSWORD).await;
    let mut elsewhere = Browser::new(app);
    elsewhere.cookies = browser.cookies.clone();
    let back = password_on(&mut elsewhere, &page, &other).await;
    assert!(back.location.is_some_and(|l| l.starts_with(CALLBACK)));
    assert_eq!(linked(app).await, 0, "not the account the address named");

    // The account's own password: the proof, then the question.
    let mut declines = Browser::new(app);
    declines.cookies = browser.cookies.clone();
    let ask = password_on(&mut declines, &page, &email).await;
    assert_eq!(ask.status, StatusCode::OK, "{}", ask.body);
    assert!(
        ask.body.contains("Link your Node Example account"),
        "{}",
        ask.body
    );
    let back = answer_link(&mut declines, &ask, "skip").await;
    assert!(back.location.is_some_and(|l| l.starts_with(CALLBACK)));
    assert_eq!(linked(app).await, 0, "not now");

    let ask = password_on(&mut browser, &page, &email).await;
    let back = answer_link(&mut browser, &ask, "link").await;
    assert!(back.location.is_some_and(|l| l.starts_with(CALLBACK)));
    assert_eq!(linked(app).await, 1);
    assert!(!browser.cookies.contains_key("latchkey_upstream_link"), "used up");
    let user = app.user(&email).await;
    let (back, _) = through_upstream(&mut Browser::new(app), app, &op, &email).await;
    assert!(
        back.location.is_some_and(|l| l.starts_with(CALLBACK)),
        "signed in directly"
    );
    let links = app.services.store.identities_of(&user.id).await.unwrap();
    assert_eq!((links.len(), links[0].subject.as_str()), (1, email.as_str()));
}

/// The password of `email` posted on the sign-in page `page` (whatever its
/// status), its redirects followed.
async fn password_on(browser: &mut Browser<'_>, page: &Page, email: &str) -> Page {
    let form = [
        ("authz", crate::oidc::hidden(&page.body, "authz")),
        ("csrf", crate::oidc::hidden(&page.body, "csrf")),
        ("email", email.to_string()),
        ("password", PASSWORD.to_string()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = browser.post("/oauth/login", &form).await;
    browser.follow(r).await
}

/// The link page `ask` answered with `decision`, its redirects followed.
async fn answer_link(browser: &mut Browser<'_>, ask: &Page, decision: &str) -> Page {
    let form = [
        ("authz", crate::oidc::hidden(&ask.body, "authz")),
        ("csrf", crate::oidc::hidden(&ask.body, "csrf")),
        ("decision", decision.to_string()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = browser.post("/oauth/link", &form).await;
    browser.follow(r).await
}

/// An address the upstream says it did not verify neither creates nor
/// links, and neither does a verified one from an upstream whose
/// `email_verified` the operator does not trust; a provider that may not
/// create accounts signs in only linked ones.
async fn an_address_the_upstream_did_not_verify_or_is_not_trusted_for_neither_links_nor_creates(
    app: &TestApp,
) {
    application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = upstream(app, true, true).await;
    let (page, _) = through_upstream(&mut Browser::new(app), app, &op, &unique_email("unverified")).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(
        page.body.contains("did not confirm your email address"),
        "{}",
        page.body
    );
    // The takeover this prevents: an upstream account whose unverified
    // address is that of an account here (the "nOAuth" attacks).
    let victim = unique_email("unverified-victim");
    app.register_verified(&victim, PASSWORD).await;
    let mut attacker = Browser::new(app);
    let (page, _) = through_upstream(&mut attacker, app, &op, &victim).await;
    assert_eq!((page.status, page.location), (StatusCode::FORBIDDEN, None));
    assert!(
        !attacker.cookies.keys().any(|k| k.contains("latchkey_session")),
        "no browser session"
    );

    let federation = &app.services.features.federation;
    assert!(federation.remove("node").await.unwrap());
    add(app, &op.issuer, true, false).await;
    let (page, _) = through_upstream(&mut Browser::new(app), app, &op, &unique_email("untrusted")).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);

    assert!(federation.remove("node").await.unwrap());
    add(app, &op.issuer, false, true).await;
    let (page, _) = through_upstream(&mut Browser::new(app), app, &op, &unique_email("no-creation")).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(page.body.contains("No account here is linked"), "{}", page.body);

    assert_eq!(
        (linked(app).await, app.count("SELECT COUNT(*) FROM users").await),
        (0, 1)
    );
}

/// The way back carries a code, a `state` and the upstream's `iss`; it
/// signs in only in the browser whose journey it ends (the journey's
/// cookie), with that journey's `state`, from that journey's upstream:
/// another browser presenting it (a login CSRF: the attacker's own code in
/// the victim's browser), a `state` that is not the journey's, another
/// upstream's way back, another `iss` or none from an upstream that names
/// it (a mix-up, RFC 9207) are refused with a page, before the code is
/// used; the journey presented again with its cookie kept gets nothing
/// either (the upstream refuses its spent code). One account, one link.
async fn a_way_back_that_is_not_this_browsers_journey_is_refused(app: &TestApp) {
    application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = upstream(app, true, true).await;
    let email = unique_email("fed-csrf");
    // The attacker's journey, stopped at the way back.
    let mut attacker = Browser::new(app);
    let (_, challenge) = pkce();
    let page = attacker.get(&authorize_url(&challenge)).await;
    let page = attacker.follow(page).await;
    let link = upstream_link(&page);
    let to = attacker.get(&link).await.location.unwrap();
    let mut there = Browser::elsewhere(app, &op.issuer);
    let page = there.get(&to).await;
    let page = there.follow(page).await;
    let callback = through_certified_pages(&mut there, page, &email, CALLBACK_HERE)
        .await
        .location
        .unwrap();

    // In the victim's browser, which has a journey of its own or none.
    let mut victim = Browser::new(app);
    let page = victim.get(&callback).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "no journey");
    let page = victim.get(&authorize_url(&challenge)).await;
    victim.follow(page).await;
    victim.get(&link).await;
    let page = victim.get(&callback).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "another journey's state");

    // The attacker's own journey (its cookie), with its answer changed.
    let journey = attacker.cookies.clone();
    let replay = |url: String| {
        let mut copy = Browser::new(app);
        copy.cookies = journey.clone();
        async move { copy.get(&url).await.status }
    };
    let q = crate::oidc::query(&callback);
    let answer = |iss: Option<&str>, state: &str, to: &str| {
        let mut params = vec![("code", q["code"].as_str()), ("state", state)];
        if let Some(iss) = iss {
            params.push(("iss", iss));
        }
        with_query(to, &params)
    };
    let back = "/oauth/upstream/node/callback";
    let (iss, state) = (q["iss"].as_str(), q["state"].as_str());
    assert_eq!(iss, op.issuer, "node-oidc-provider names itself");
    let refusals = [
        (
            answer(Some(iss), &format!("x{state}"), back),
            StatusCode::BAD_REQUEST,
            "a state not the journey's",
        ),
        (
            answer(Some(iss), state, "/oauth/upstream/other/callback"),
            StatusCode::BAD_REQUEST,
            "another upstream's way back",
        ),
        (
            answer(Some("https://evil.example"), state, back),
            StatusCode::BAD_GATEWAY,
            "another issuer",
        ),
        (
            answer(None, state, back),
            StatusCode::BAD_GATEWAY,
            "no issuer, from an upstream that names it",
        ),
    ];
    for (url, status, what) in refusals {
        assert_eq!(replay(url).await, status, "{what}");
    }
    let first = attacker.get(&callback).await;
    assert_eq!(
        first.status,
        StatusCode::SEE_OTHER,
        "its own journey: {}",
        first.body
    );
    let again = attacker.get(&callback).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "the journey is over");
    assert_eq!(
        replay(callback.clone()).await,
        StatusCode::BAD_GATEWAY,
        "the spent code, refused upstream"
    );
    assert_eq!(linked(app).await, 1, "only the rightful way back");
    assert_eq!(app.count("SELECT COUNT(*) FROM users").await, 1);
}

/// An upstream that answers nothing (a port nobody listens on): the
/// sign-in page again, saying so, with `502`; nothing is written.
async fn an_upstream_that_cannot_be_reached_gets_a_clear_page_and_nothing_is_written(app: &TestApp) {
    application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    add(app, &format!("http://127.0.0.1:{closed}"), true, true).await;
    let mut browser = Browser::new(app);
    let (_, challenge) = pkce();
    let page = browser.get(&authorize_url(&challenge)).await;
    let page = browser.follow(page).await;
    let link = upstream_link(&page);
    let page = browser.get(&link).await;
    assert_eq!(page.status, StatusCode::BAD_GATEWAY, "{}", page.body);
    assert!(
        page.body.contains("Signing in with Node Example did not work"),
        "{}",
        page.body
    );
    assert!(page.body.contains("name=\"password\""), "the sign-in page again");
    let unknown = browser.get(&link.replace("/node?", "/nobody?")).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        (app.count("SELECT COUNT(*) FROM users").await, linked(app).await),
        (0, 0)
    );
}

/// An account with an authenticator, linked to an upstream identity, is
/// asked for its code after the upstream, as after a password: the
/// upstream's sign-in is one factor. (The link is written as an earlier
/// sign-in would have made it.)
async fn an_account_with_a_second_factor_steps_up_after_the_upstream(app: &TestApp) {
    let app_secret = application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = upstream(app, true, true).await;
    let email = unique_email("fed-mfa");
    app.register_verified(&email, PASSWORD).await;
    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let (secret, _) = crate::mfa::enrol_totp(app, session["access_token"].as_str().unwrap()).await;
    let user = app.user(&email).await;
    let identity = latchkey::store::IdentityRecord {
        issuer: op.issuer.clone(),
        subject: email.clone(),
        user_id: user.id.clone(),
        upstream: "node".into(),
        email: Some(email.clone()),
        created_at: latchkey::clock::now_ms(),
    };
    assert!(app
        .services
        .store
        .link_identity(&identity, None, None)
        .await
        .unwrap());
    let mut browser = Browser::new(app);
    let (page, verifier) = through_upstream(&mut browser, app, &op, &email).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("action=\"/oauth/mfa\""),
        "the second step: {}",
        page.body
    );
    assert!(page.location.is_none());
    assert!(
        !browser.cookies.keys().any(|k| k.contains("latchkey_session")),
        "no session before the code"
    );
    // The code of the next step (the enrolment spent this one).
    let code = crate::mfa::pyotp(&secret, 1);
    let fields: Vec<(&str, String)> = ["authz", "csrf", "mfa_token", "factors"]
        .into_iter()
        .map(|k| (k, crate::oidc::hidden(&page.body, k)))
        .chain([("code", code)])
        .collect();
    let form: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let done = browser.post("/oauth/mfa", &form).await;
    let back = browser.follow(done).await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    let tokens = exchange_code(app, "app", &app_secret, &callback, &verifier).await;
    let id = claims(tokens["id_token"].as_str().unwrap());
    assert_eq!(id["amr"], json!(["fed", "otp", "mfa"]), "{id}");
    assert_eq!(id["acr"], "2");
}

/// Links an identity of upstream `node` (subject `subject`) to `user_id`,
/// as a sign-in through it would have.
async fn link(app: &TestApp, user_id: &str, subject: &str) {
    link_at(app, "https://upstream.example", user_id, subject).await;
}

/// Links the identity (`issuer`, `subject`) of upstream `node` to `user_id`.
async fn link_at(app: &TestApp, issuer: &str, user_id: &str, subject: &str) {
    let identity = latchkey::store::IdentityRecord {
        issuer: issuer.into(),
        subject: subject.into(),
        user_id: user_id.into(),
        upstream: "node".into(),
        email: None,
        created_at: latchkey::clock::now_ms(),
    };
    let store = &app.services.store;
    assert!(store.link_identity(&identity, None, None).await.unwrap());
}

/// `GET /auth/identities` lists the caller's links, `DELETE` removes one
/// (with the `identity.unlinked` event), and refuses with `409` to remove
/// the last way into an account without a password or a passkey; another
/// account's identity is `404`. A token an application holds is refused.
async fn a_person_sees_and_unlinks_their_identities_but_never_the_last_way_in(app: &TestApp) {
    let email = unique_email("links");
    app.register_verified(&email, PASSWORD).await;
    let user = app.user(&email).await;
    link(app, &user.id, "sub-1").await;
    link(app, &user.id, "sub-2").await;
    let pair: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let token = pair["access_token"].as_str().unwrap();
    let list: Value = app
        .get_bearer("/auth/identities", token)
        .await
        .json()
        .await
        .unwrap();
    let ids: Vec<String> = list["identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert_eq!(list["identities"][0]["upstream"], "node");
    let delete = |id: String| {
        let (app, token) = (app, token.to_string());
        async move {
            app.http
                .delete(app.url(&format!("/auth/identities/{id}")))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(delete(ids[0].clone()).await, StatusCode::NO_CONTENT);
    assert_eq!(delete(ids[0].clone()).await, StatusCode::NOT_FOUND);
    assert_eq!(delete("not-an-id".into()).await, StatusCode::NOT_FOUND);
    // Without a password now, the last identity is the only way in.
    app.sql(&format!(
        "UPDATE users SET password_hash = '{}' WHERE id = '{}'",
        latchkey::store::UNUSABLE_PASSWORD,
        user.id
    ))
    .await;
    assert_eq!(delete(ids[1].clone()).await, StatusCode::CONFLICT);
    let events = format!(
        "SELECT COUNT(*) FROM events WHERE user_id = '{}' AND kind = 'identity.unlinked'",
        user.id
    );
    assert_eq!(app.count(&events).await, 1);
    assert_eq!(linked(app).await, 1);
}

/// "Continue with ..." in headless Chromium (tests/support/federation_browser.py),
/// latchkey at http://localhost:PORT and node-oidc-provider at
/// http://127.0.0.1:PORT (different sites: the way back is a cross-site
/// navigation, which must carry the journey's cookie): a new person comes
/// back with an account; a person whose address has an account here is
/// asked for its password, then whether to link, links, and next time
/// comes straight through. The pages used have no policy violation and no
/// serious accessibility violation (axe-core); screenshots in
/// target/federation-pages/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_with_an_upstream_in_a_real_browser_makes_an_account_or_links_one_after_its_password() {
    let reserved = crate::common::reserve_port();
    let issuer = format!("http://localhost:{}", reserved.port);
    let app = TestApp::embedded(&[
        ("listen", &format!("127.0.0.1:{}", reserved.port)),
        ("issuer", &issuer),
    ])
    .await;
    drop(reserved);
    application(&app, "browser-app", ClientKind::Public, ConsentMode::Explicit).await;
    // Its session cookie as a real browser keeps it (no POSTed requests).
    let op = CertifiedProvider::start_with(json!({"post": false, "clients": [{
        "client_id": UPSTREAM_CLIENT,
        "client_secret": UPSTREAM_SECRET,
        "redirect_uris": [format!("{issuer}/oauth/upstream/node/callback")],
    }]}))
    .await;
    add(&app, &op.issuer, true, true).await;
    let taken = unique_email("browser-taken");
    app.register_verified(&taken, PASSWORD).await;
    let root = env!("CARGO_MANIFEST_DIR");
    let shots = format!("{root}/target/federation-pages");
    let run = |mode: &str, email: &str| {
        let args = [
            format!("{root}/tests/support/federation_browser.py"),
            mode.to_string(),
            issuer.clone(),
            "browser-app".to_string(),
            email.to_string(),
            PASSWORD.to_string(),
            shots.clone(),
            format!("{root}/tests/support/oidc-rp/node_modules/axe-core/axe.min.js"),
        ];
        async move {
            // Off the runtime's threads: the service answers the browser meanwhile.
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new("python3").args(args).output()
            })
            .await
            .unwrap()
            .expect("python3 (with websocket-client) and chromium");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "the browser run failed:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<Value>>()
        }
    };
    let line = |lines: &[Value], name: &str| {
        lines
            .iter()
            .find(|l| l["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}: {lines:?}"))
            .clone()
    };
    let fed = |done: &Value| {
        claims(
            done["tokens"]["id_token"]
                .as_str()
                .unwrap_or_else(|| panic!("{done}")),
        )
    };

    let new = unique_email("browser-new");
    let lines = run("new", &new).await;
    let id = fed(&line(&lines, "new person"));
    assert_eq!((&id["amr"], &id["email"]), (&json!(["fed"]), &json!(new)));

    let lines = run("link", &taken).await;
    assert_eq!(line(&lines, "asked for the password")["email"], taken.as_str());
    let ask = line(&lines, "asked to link")["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        ask.contains("Link your Node Example account") && ask.contains(&taken),
        "{ask}"
    );
    let user = app.user(&taken).await;
    assert_eq!(fed(&line(&lines, "linked"))["sub"], user.id.as_str());
    let through = fed(&line(&lines, "through the link"));
    assert_eq!(
        (&through["sub"], &through["amr"]),
        (&json!(user.id), &json!(["fed"]))
    );

    let pages: Vec<&Value> = lines.iter().chain(&[]).filter(|l| l["step"] == "page").collect();
    assert_eq!(pages.len(), 2, "{lines:?}");
    for p in pages {
        assert_eq!(p["csp_violations"], json!([]), "{p}");
        let serious = p["axe"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["impact"] == "serious" || v["impact"] == "critical");
        assert!(!serious, "accessibility: {p}");
    }
    app.stop().await;
}
