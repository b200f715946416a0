//! The GitHub upstream (`protocol` `github`): OAuth 2.0's code flow with
//! PKCE, then GitHub's REST API for who signed in. github.com cannot be
//! reached from the tests: `tests/support/github_site.py` serves the
//! endpoints latchkey uses as GitHub documents them, at a GitHub
//! Enterprise Server's paths (`/login/oauth/...`, `/api/v3/...`),
//! including GitHub's habits: a refused code answered with HTTP 200 and an
//! `error`, and API requests without a `User-Agent` refused.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{add_upstream, authorize_url, claims, link_to, linked};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::{application, exchange_code, pkce, Browser, Page, CALLBACK};
use latchkey::domain::federation::{NewUpstream, Protocol};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

crate::on_every_backend!(
    a_github_account_signs_in_by_its_id_and_comes_back_to_the_same_account_after_a_rename,
);

#[tokio::test]
async fn a_github_account_without_a_verified_primary_address_gets_no_account_and_no_link() {
    let app = TestApp::embedded(&[]).await;
    application(&app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let site = github_upstream(&app).await;
    site.signed_in(json!({"login": "nomail", "id": 7, "name": "No Mail", "emails": [
        {"email": unique_email("gh-unverified"), "primary": true, "verified": false},
        {"email": unique_email("gh-secondary"), "primary": false, "verified": true},
    ]}))
    .await;
    let (page, _) = through_github(&mut Browser::new(&app), &app, &site).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.body);
    assert!(
        page.body.contains("did not confirm your email address"),
        "{}",
        page.body
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM users").await, 0);
    assert_eq!(linked(&app).await, 0);
}

#[tokio::test]
async fn a_github_address_that_names_an_account_here_asks_for_that_accounts_password_first() {
    let app = TestApp::embedded(&[]).await;
    application(&app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let site = github_upstream(&app).await;
    let email = unique_email("gh-taken");
    app.register_verified(&email, PASSWORD).await;
    site.signed_in(user(9, "taken", &email)).await;
    let (page, _) = through_github(&mut Browser::new(&app), &app, &site).await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert!(page.body.contains(&format!("value=\"{email}\"")), "{}", page.body);
    assert_eq!(linked(&app).await, 0);
    assert_eq!(app.count("SELECT COUNT(*) FROM users").await, 1);
}

/// A person who declines at GitHub, and a code GitHub refuses (answered
/// with HTTP 200 and `error`, as GitHub does): each ends on a page that
/// says the sign-in failed, and nothing is written.
#[tokio::test]
async fn a_declined_authorization_and_a_refused_code_end_on_a_clear_page_and_write_nothing() {
    let app = TestApp::embedded(&[]).await;
    application(&app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let site = github_upstream(&app).await;
    site.signed_in(json!({"declines": true})).await;
    let (page, _) = through_github(&mut Browser::new(&app), &app, &site).await;
    assert_eq!(page.status, StatusCode::UNAUTHORIZED, "{}", page.body);

    site.signed_in(user(11, "octo", &unique_email("gh-refused")))
        .await;
    let mut browser = Browser::new(&app);
    let callback = leave_for_github(&mut browser, &app, &site).await;
    let forged = callback.replace("code=", "code=0");
    let page = browser.get(&forged).await;
    let page = browser.follow(page).await;
    assert_eq!(page.status, StatusCode::BAD_GATEWAY, "{}", page.body);
    assert_eq!(app.count("SELECT COUNT(*) FROM users").await, 0);
    assert_eq!(linked(&app).await, 0);
}

#[tokio::test]
async fn github_upstreams_are_added_with_githubs_defaults_and_never_trusted_for_an_amr() {
    let app = TestApp::embedded(&[]).await;
    let admin = crate::admin::admin_token(&app).await;
    let add = |body: Value| {
        let r = app
            .http
            .post(app.url("/admin/upstreams"))
            .bearer_auth(&admin)
            .json(&body);
        async move {
            let r = r.send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, view) = add(
        json!({"name": "github", "protocol": "github", "client_id": "Iv1.abc", "client_secret": "s3cret"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    assert_eq!(view["issuer"], "https://github.com");
    assert_eq!(view["protocol"], "github");
    assert_eq!(view["scopes"], "read:user user:email");
    assert!(view.get("client_secret").is_none());
    let (status, _) = add(
        json!({"name": "ghes", "protocol": "github", "issuer": "https://ghe.example.com",
                               "client_id": "x", "client_secret": "y", "trusts_mfa": true}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "GitHub asserts no amr");
    let (status, _) = add(
        json!({"name": "other", "protocol": "saml", "issuer": "https://idp.example.com",
                               "client_id": "x", "client_secret": "y"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, view) = add(
        json!({"name": "ghes", "protocol": "github", "issuer": "https://ghe.example.com",
                                   "client_id": "x", "client_secret": "y"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    assert_eq!(view["issuer"], "https://ghe.example.com");
}

/// The first sign-in with GitHub makes an account at the verified primary
/// address (`amr` `fed`); after the person renames their GitHub login and
/// changes their primary address, the same GitHub account (its numeric
/// id) signs in to the same account, and nothing more is made. latchkey
/// sent GitHub what it documents: the client in the form, the PKCE
/// verifier, a `User-Agent` and the API version on API calls.
async fn a_github_account_signs_in_by_its_id_and_comes_back_to_the_same_account_after_a_rename(
    app: &TestApp,
) {
    let secret = application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let site = github_upstream(app).await;
    let email = unique_email("gh-new");
    site.signed_in(user(583231, "octocat", &email)).await;
    let (back, verifier) = through_github(&mut Browser::new(app), app, &site).await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    assert!(callback.starts_with(CALLBACK), "{callback}");
    let tokens = exchange_code(app, "app", &secret, &callback, &verifier).await;
    let id = claims(tokens["id_token"].as_str().unwrap());
    assert_eq!(id["amr"], json!(["fed"]));
    assert_eq!(id["email"], email.as_str());
    let account = app.user(&email).await;
    assert_eq!(account.name.as_deref(), Some("Mona"), "GitHub's profile name");
    let links = app.services.store.identities_of(&account.id).await.unwrap();
    assert_eq!(links.len(), 1);
    assert_eq!(
        (links[0].issuer.as_str(), links[0].subject.as_str()),
        (site.base.as_str(), "583231")
    );

    site.signed_in(user(583231, "octocat-renamed", &unique_email("gh-changed")))
        .await;
    let (back, verifier) = through_github(&mut Browser::new(app), app, &site).await;
    let tokens = exchange_code(app, "app", &secret, back.location.as_deref().unwrap(), &verifier).await;
    assert_eq!(
        claims(tokens["id_token"].as_str().unwrap())["sub"],
        account.id.as_str()
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM users").await, 1);
    assert_eq!(linked(app).await, 1);

    let seen: Vec<Value> = reqwest::get(format!("{}/_test/requests", site.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = seen
        .iter()
        .find(|r| r["path"] == "/login/oauth/access_token")
        .unwrap();
    assert_eq!(
        token["form_keys"],
        json!([
            "client_id",
            "client_secret",
            "code",
            "code_verifier",
            "grant_type",
            "redirect_uri"
        ])
    );
    let api: Vec<&Value> = seen
        .iter()
        .filter(|r| r["path"] == "/api/v3/user/emails")
        .collect();
    assert_eq!(api.len(), 2);
    assert_eq!(api[0]["headers"]["x-github-api-version"], "2022-11-28");
    assert!(api[0]["headers"]["user-agent"]
        .as_str()
        .unwrap()
        .starts_with("latchkey/"));
}

const CLIENT: &str = "Iv1.latchkey-tests";
const SECRET: &str = "a-github-secret-only-these-tests-use";
const CALLBACK_HERE: &str = "http://latchkey.test/oauth/upstream/github/callback";

/// The stand-in for GitHub, running on a loopback port.
struct GitHubSite {
    child: std::process::Child,
    base: String,
}

impl GitHubSite {
    /// Who is signed in at GitHub now (or `{"declines": true}`).
    async fn signed_in(&self, who: Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/_test/signed-in", self.base))
            .json(&who)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}

impl Drop for GitHubSite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GitHub account with one address, verified and primary.
fn user(id: u64, login: &str, email: &str) -> Value {
    json!({"login": login, "id": id, "name": "Mona", "emails": [
        {"email": email, "primary": true, "verified": true},
    ]})
}

/// The stand-in started, and added to latchkey as upstream `github`
/// (GitHub Enterprise Server at its URL, making accounts, trusting the
/// addresses GitHub verified).
async fn github_upstream(app: &TestApp) -> GitHubSite {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/github_site.py");
    let config =
        json!({"clients": [{"client_id": CLIENT, "client_secret": SECRET, "redirect_uri": CALLBACK_HERE}]});
    let site = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .arg(config.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the GitHub stand-in");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("the GitHub stand-in did not start: {line:?}"))
            .to_string();
        GitHubSite { child, base }
    })
    .await
    .unwrap();
    add_upstream(
        app,
        NewUpstream {
            name: "github".into(),
            display_name: "GitHub".into(),
            issuer: site.base.clone(),
            client_id: CLIENT.into(),
            client_secret: SECRET.into(),
            scopes: String::new(),
            may_create: true,
            trusts_email_verified: true,
            protocol: Protocol::Github,
            trusts_mfa: false,
            email_claim: String::new(),
            name_claim: String::new(),
        },
    )
    .await;
    site
}

/// "Continue with GitHub" on latchkey's sign-in page, to GitHub, which
/// answers at once for the person signed in there: the way back to
/// latchkey, and the application's PKCE verifier.
async fn leave_for_github(browser: &mut Browser<'_>, app: &TestApp, site: &GitHubSite) -> String {
    let (_, callback) = leave(browser, app, site).await;
    callback
}

async fn leave(browser: &mut Browser<'_>, app: &TestApp, site: &GitHubSite) -> (String, String) {
    let (verifier, challenge) = pkce();
    let page = browser.get(&authorize_url(&challenge)).await;
    let page = browser.follow(page).await;
    assert!(page.body.contains("Continue with GitHub"), "{}", page.body);
    let out = browser.get(&link_to(&page, "github")).await;
    let to = out.location.unwrap_or_else(|| panic!("to GitHub: {}", out.body));
    assert!(
        to.starts_with(&format!("{}/login/oauth/authorize?", site.base)),
        "{to}"
    );
    assert!(
        to.contains("code_challenge_method=S256") && !to.contains("nonce="),
        "{to}"
    );
    let at_github = Browser::elsewhere(app, &site.base).get(&to).await;
    let back = at_github
        .location
        .unwrap_or_else(|| panic!("back from GitHub: {}", at_github.body));
    assert!(back.starts_with(CALLBACK_HERE), "{back}");
    (verifier, back)
}

/// The whole way through GitHub: the page latchkey answers with once back
/// (its own redirects followed), and the application's PKCE verifier.
async fn through_github(browser: &mut Browser<'_>, app: &TestApp, site: &GitHubSite) -> (Page, String) {
    let (verifier, callback) = leave(browser, app, site).await;
    let page = browser.get(&callback).await;
    (browser.follow(page).await, verifier)
}
