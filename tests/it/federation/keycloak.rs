//! Keycloak 26 as the upstream OpenID Provider: the Maven Central
//! distribution (`tests/support/install-upstreams` unpacks it into
//! `target/test-deps`), on Java 21 or newer, with a database of its own in
//! the tests' PostgreSQL, started once for this test (about 30 s), a realm
//! made through its admin API. People sign in on Keycloak's own login
//! page; the scenarios are those of a provider an organisation runs:
//! a sign-in that makes an account, a sign-in back to it, the linking
//! proof, a user whose address Keycloak never verified, and a Keycloak
//! administrator who sets a user's address to that of someone's account
//! here (the "nOAuth" takeover, which must fail).

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{add_upstream, answer_link, authorize_url, claims, link_to, linked, password_on};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::{application, exchange_code, pkce, Browser, Page, CALLBACK};
use latchkey::domain::federation::{NewUpstream, Protocol};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

const VERSION: &str = "26.7.3";
const REALM: &str = "latchkey-tests";
const CLIENT_SECRET: &str = "a-keycloak-secret-only-these-tests-use";
const CALLBACK_HERE: &str = "http://latchkey.test/oauth/upstream/keycloak/callback";
const ADMIN_PASSWORD: &str = "keycloak-admin-of-these-tests";
const USER_PASSWORD: &str = "Keycloak-user-pw-1";

/// A Keycloak server of this test: its process group, and its URL.
struct Keycloak {
    child: Child,
    base: String,
}

impl Drop for Keycloak {
    fn drop(&mut self) {
        // kc.sh starts java as its child: the whole group goes.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// A Java of version 21 or newer under /usr/lib/jvm (Keycloak 26 needs one).
fn java_home() -> std::path::PathBuf {
    let mut found = Vec::new();
    for dir in std::fs::read_dir("/usr/lib/jvm").expect("/usr/lib/jvm").flatten() {
        let release = std::fs::read_to_string(dir.path().join("release")).unwrap_or_default();
        let major = release
            .lines()
            .find_map(|l| l.strip_prefix("JAVA_VERSION=\""))
            .and_then(|v| v.split(['.', '"']).next())
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(m) = major.filter(|m| *m >= 21) {
            found.push((m, dir.path()));
        }
    }
    found.sort();
    found
        .pop()
        .map(|(_, p)| p)
        .expect("a Java 21 or newer under /usr/lib/jvm for Keycloak 26")
}

impl Keycloak {
    /// Started on a free loopback port, with database `kc_...` made in the
    /// tests' PostgreSQL.
    async fn start() -> Keycloak {
        let pg = std::env::var("LATCHKEY_TEST_DATABASE_URL")
            .expect("LATCHKEY_TEST_DATABASE_URL (scripts/with-services sets it)");
        let db = format!("kc_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&pg).await.unwrap();
            sqlx::query(&format!("CREATE DATABASE {db}"))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        let pg = url::Url::parse(&pg).unwrap();
        let jdbc = format!(
            "jdbc:postgresql://{}:{}/{db}",
            pg.host_str().unwrap(),
            pg.port().unwrap_or(5432)
        );
        let user = if pg.username().is_empty() {
            "postgres"
        } else {
            pg.username()
        };
        let kc = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("target/test-deps/keycloak-{VERSION}/bin/kc.sh"));
        assert!(
            kc.exists(),
            "{} (tests/support/install-upstreams installs it)",
            kc.display()
        );
        let mut command = Command::new(kc);
        command
            .args([
                "start-dev",
                "--http-host=127.0.0.1",
                "--http-port=0",
                "--db=postgres",
            ])
            .arg(format!("--db-url={jdbc}"))
            .arg(format!("--db-username={user}"))
            .arg(format!("--db-password={}", pg.password().unwrap_or("unused")))
            .args(["--db-pool-max-size=4", "--log-console-output=default"])
            .env("JAVA_HOME", java_home())
            .env("KC_BOOTSTRAP_ADMIN_USERNAME", "admin")
            .env("KC_BOOTSTRAP_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        tokio::task::spawn_blocking(move || {
            let mut child = command.spawn().expect("Keycloak starts");
            let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let (tx, rx) = std::sync::mpsc::channel();
            // Its log is read to the end, so that it never blocks on a
            // full pipe; the line that names its port is passed on.
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    if let Some(at) = line.find("Listening on: ") {
                        let _ = tx.send(line[at + 14..].trim().to_string());
                    }
                }
            });
            let base = match rx.recv_timeout(std::time::Duration::from_secs(300)) {
                Ok(base) => base,
                Err(_) => {
                    let _ = Command::new("kill")
                        .args(["-KILL", "--", &format!("-{}", child.id())])
                        .status();
                    panic!("Keycloak did not start within 300 s");
                }
            };
            Keycloak { child, base }
        })
        .await
        .unwrap()
    }

    fn issuer(&self) -> String {
        format!("{}/realms/{REALM}", self.base)
    }

    /// An access token of its administrator (the master realm's `admin-cli`).
    async fn admin(&self) -> String {
        let r: Value = reqwest::Client::new()
            .post(format!(
                "{}/realms/master/protocol/openid-connect/token",
                self.base
            ))
            .form(&[
                ("grant_type", "password"),
                ("client_id", "admin-cli"),
                ("username", "admin"),
                ("password", ADMIN_PASSWORD),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["access_token"].as_str().unwrap().to_string()
    }

    /// The realm of this test: latchkey's confidential client (code flow,
    /// PKCE S256, back-channel logout to `logout_url`) and `users`
    /// (username, address, verified).
    async fn realm(&self, logout_url: &str, users: &[(&str, &str, bool)]) {
        let users: Vec<Value> = users
            .iter()
            .map(|(name, email, verified)| {
                json!({"username": name, "email": email, "emailVerified": verified, "enabled": true,
                       "firstName": name, "lastName": "Tester",
                       "credentials": [{"type": "password", "value": USER_PASSWORD, "temporary": false}]})
            })
            .collect();
        let realm = json!({
            "realm": REALM, "enabled": true,
            "clients": [{
                "clientId": "latchkey", "secret": CLIENT_SECRET, "publicClient": false,
                "standardFlowEnabled": true, "directAccessGrantsEnabled": false,
                "redirectUris": [CALLBACK_HERE],
                "attributes": {"pkce.code.challenge.method": "S256", "backchannel.logout.url": logout_url,
                               "backchannel.logout.session.required": "true"},
            }],
            "users": users,
        });
        let r = reqwest::Client::new()
            .post(format!("{}/admin/realms", self.base))
            .bearer_auth(self.admin().await)
            .json(&realm)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{}", r.text().await.unwrap());
    }

    /// What a Keycloak administrator can do: set a user's address, and
    /// mark it verified.
    async fn set_email(&self, username: &str, email: &str) {
        let admin = self.admin().await;
        let http = reqwest::Client::new();
        let id = self.user_id(&admin, username).await;
        let r = http
            .put(format!("{}/admin/realms/{REALM}/users/{id}", self.base))
            .bearer_auth(&admin)
            .json(&json!({"email": email, "emailVerified": true}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }

    async fn user_id(&self, admin: &str, username: &str) -> String {
        let users: Value = reqwest::Client::new()
            .get(format!(
                "{}/admin/realms/{REALM}/users?exact=true&username={username}",
                self.base
            ))
            .bearer_auth(admin)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        users[0]["id"].as_str().unwrap().to_string()
    }

    /// What a Keycloak administrator can do: sign a user out of every
    /// session (Keycloak then posts its clients' back-channel logouts).
    async fn sign_out(&self, username: &str) {
        let admin = self.admin().await;
        let id = self.user_id(&admin, username).await;
        let r = reqwest::Client::new()
            .post(format!("{}/admin/realms/{REALM}/users/{id}/logout", self.base))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
}

/// An application's sign-in that takes "Continue with Keycloak" on
/// latchkey's page and signs in on Keycloak's login page as `username`:
/// the page latchkey answers with once back (its redirects followed), and
/// the application's PKCE verifier.
async fn through_keycloak(
    browser: &mut Browser<'_>,
    app: &TestApp,
    kc: &Keycloak,
    username: &str,
) -> (Page, String) {
    let (verifier, challenge) = pkce();
    let page = browser.get(&authorize_url(&challenge)).await;
    let page = browser.follow(page).await;
    let out = browser.get(&link_to(&page, "keycloak")).await;
    let to = out
        .location
        .unwrap_or_else(|| panic!("to Keycloak: {}", out.body));
    assert!(to.starts_with(&kc.issuer()), "{to}");
    let mut there = Browser::elsewhere(app, &kc.base);
    let login = there.get(&to).await;
    assert_eq!(
        login.status,
        StatusCode::OK,
        "Keycloak's login page: {}",
        login.body
    );
    let action = form_action(&login.body);
    let back = there
        .post(
            &action,
            &[
                ("username", username),
                ("password", USER_PASSWORD),
                ("credentialId", ""),
            ],
        )
        .await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back from Keycloak ({}): {}", back.status, back.body));
    assert!(callback.starts_with(CALLBACK_HERE), "{callback}");
    assert!(
        callback.contains("iss="),
        "Keycloak names itself (RFC 9207): {callback}"
    );
    let page = browser.get(&callback).await;
    (browser.follow(page).await, verifier)
}

/// The `action` of Keycloak's login form.
fn form_action(body: &str) -> String {
    let form = &body[body
        .find("id=\"kc-form-login\"")
        .unwrap_or_else(|| panic!("a login form: {body}"))..];
    let at = form.find("action=\"").unwrap() + 8;
    form[at..at + form[at..].find('"').unwrap()].replace("&amp;", "&")
}

/// Every scenario against one Keycloak (its start-up is the cost).
#[tokio::test]
async fn keycloak_as_the_upstream_makes_accounts_links_after_proof_signs_out_and_hands_no_account_to_its_administrator(
) {
    let app = TestApp::embedded(&[]).await;
    let app_secret = application(&app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let kc = Keycloak::start().await;
    let alice = unique_email("kc-alice");
    let victim = unique_email("kc-victim");
    let carol = unique_email("kc-carol");
    let mallory = unique_email("kc-mallory");
    kc.realm(
        &app.url("/oauth/upstream/keycloak/backchannel-logout"),
        &[
            ("alice", &alice, true),
            ("bob", &unique_email("kc-bob"), false),
            ("carol", &carol, true),
            ("mallory", &mallory, true),
            ("trent", &unique_email("kc-trent"), true),
        ],
    )
    .await;
    add_upstream(
        &app,
        NewUpstream {
            name: "keycloak".into(),
            display_name: "Keycloak".into(),
            issuer: kc.issuer(),
            client_id: "latchkey".into(),
            client_secret: CLIENT_SECRET.into(),
            scopes: String::new(),
            may_create: true,
            trusts_email_verified: true,
            protocol: Protocol::Oidc,
            trusts_mfa: false,
            email_claim: String::new(),
            name_claim: String::new(),
        },
    )
    .await;
    let accounts = || app.count("SELECT COUNT(*) FROM users");

    // A new person: an account at the verified address, amr fed; the
    // same Keycloak user comes back to it.
    let (back, verifier) = through_keycloak(&mut Browser::new(&app), &app, &kc, "alice").await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    assert!(callback.starts_with(CALLBACK), "{callback}");
    let tokens = exchange_code(&app, "app", &app_secret, &callback, &verifier).await;
    let id = claims(tokens["id_token"].as_str().unwrap());
    assert_eq!(id["email"], alice.as_str());
    assert_eq!(id["amr"], json!(["fed"]));
    let alices_token = tokens["access_token"].as_str().unwrap().to_string();
    let account = app.user(&alice).await;
    assert_eq!(account.name.as_deref(), Some("alice Tester"), "its name claim");
    let (back, _) = through_keycloak(&mut Browser::new(&app), &app, &kc, "alice").await;
    assert!(back.location.is_some_and(|l| l.starts_with(CALLBACK)));
    assert_eq!(accounts().await, 1);
    let links = app.services.store.identities_of(&account.id).await.unwrap();
    assert_eq!((links.len(), links[0].issuer.as_str()), (1, kc.issuer().as_str()));

    // An address Keycloak never verified: no account, no link.
    let (page, _) = through_keycloak(&mut Browser::new(&app), &app, &kc, "bob").await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.body);
    assert_eq!(accounts().await, 1);
    assert_eq!(linked(&app).await, 1);

    // An address of an account here: nothing until that account's
    // password and "Link"; then Keycloak's carol signs in to it directly.
    app.register_verified(&carol, PASSWORD).await;
    let mut browser = Browser::new(&app);
    let (page, _) = through_keycloak(&mut browser, &app, &kc, "carol").await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert_eq!(linked(&app).await, 1);
    let ask = password_on(&mut browser, &page, &carol).await;
    let back = answer_link(&mut browser, &ask, "link").await;
    assert!(back.location.is_some_and(|l| l.starts_with(CALLBACK)));
    assert_eq!(linked(&app).await, 2);
    let (back, _) = through_keycloak(&mut Browser::new(&app), &app, &kc, "carol").await;
    assert!(
        back.location.is_some_and(|l| l.starts_with(CALLBACK)),
        "signed in directly"
    );

    // The takeover: a Keycloak administrator sets a user's address to
    // that of someone's account here, verified. Not linked yet: the
    // sign-in page asks for that account's password, and nothing is
    // linked or signed in. Linked already (mallory signed in once with her
    // own address): the identity signs in to its own account, never the
    // address's.
    app.register_verified(&victim, PASSWORD).await;
    kc.set_email("trent", &victim).await;
    let mut browser = Browser::new(&app);
    let (page, _) = through_keycloak(&mut browser, &app, &kc, "trent").await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert!(page.location.is_none());
    assert!(!browser.cookies.keys().any(|k| k.contains("latchkey_session")));

    let (back, _) = through_keycloak(&mut Browser::new(&app), &app, &kc, "mallory").await;
    assert!(back.location.is_some_and(|l| l.starts_with(CALLBACK)));
    let mallorys = app.user(&mallory).await;
    // (Keycloak keeps addresses unique in a realm: another victim.)
    let victim = unique_email("kc-victim-2");
    app.register_verified(&victim, PASSWORD).await;
    kc.set_email("mallory", &victim).await;
    let (back, verifier) = through_keycloak(&mut Browser::new(&app), &app, &kc, "mallory").await;
    let tokens = exchange_code(
        &app,
        "app",
        &app_secret,
        back.location.as_deref().unwrap(),
        &verifier,
    )
    .await;
    let id = claims(tokens["id_token"].as_str().unwrap());
    assert_eq!(id["sub"], mallorys.id.as_str(), "her own account");
    assert_eq!(id["email"], mallory.as_str());
    let victims = app.user(&victim).await;
    assert!(app
        .services
        .store
        .identities_of(&victims.id)
        .await
        .unwrap()
        .is_empty());

    // Signed out at Keycloak (by its administrator): Keycloak's
    // back-channel logout ends alice's sessions here that began there.
    assert_eq!(
        app.get_bearer("/auth/validate", &alices_token).await.status(),
        StatusCode::OK
    );
    kc.sign_out("alice").await;
    let mut ended = false;
    for _ in 0..100 {
        if app.get_bearer("/auth/validate", &alices_token).await.status() == StatusCode::UNAUTHORIZED {
            ended = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ended, "signed out at Keycloak, signed out here");
}
