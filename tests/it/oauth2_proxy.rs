//! oauth2-proxy (Go), the reverse proxy many teams put in front of an
//! internal tool, as an application of latchkey's OpenID Provider. It
//! reads discovery at the issuer, sends the browser to the authorization
//! endpoint with PKCE, redeems the code with its secret, verifies the
//! id_token (go-oidc inside it), passes the person's identity to the
//! tool behind it, and renews its session with the refresh token. The test
//! plays the browser (cookies, redirects, the sign-in form); the tool is
//! `tests/support/echo_upstream.py`, which answers with what reached it.
//!
//! oauth2-proxy is built by `tests/support/install-upstreams` into
//! `target/test-deps/oauth2-proxy-VERSION`. It needs an issuer it can
//! reach, so latchkey listens here on a reserved port that is also its
//! issuer, on the embedded backend (the flows themselves run on both
//! backends in tests/it/oidc.rs).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{free_port, reserve_port, unique_email, SupportServer, TestApp, PASSWORD};
use crate::oidc::{hidden, Browser, Page};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

const VERSION: &str = "v7.15.6";
/// oauth2-proxy renews a session older than this with the refresh token.
const COOKIE_REFRESH_SECS: u64 = 1;

struct Proxy {
    child: Child,
    base: String,
    log: std::path::PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    /// oauth2-proxy for the client `tools` of `issuer`, in front of `upstream`.
    async fn start(app: &TestApp, issuer: &str, port: u16, secret: &str, upstream: &str) -> Proxy {
        let base = format!("http://127.0.0.1:{port}");
        let bin =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/test-deps/oauth2-proxy-{VERSION}"));
        let log = app.tmp.path().join("oauth2-proxy.log");
        let child = Command::new(&bin)
            .args([
                format!("--http-address=127.0.0.1:{port}"),
                "--provider=oidc".into(),
                format!("--oidc-issuer-url={issuer}"),
                "--client-id=tools".into(),
                format!("--client-secret={secret}"),
                format!("--redirect-url={base}/oauth2/callback"),
                format!("--upstream={upstream}/"),
                "--email-domain=*".into(),
                "--scope=openid email profile offline_access".into(),
                "--code-challenge-method=S256".into(),
                "--skip-provider-button=true".into(),
                "--pass-access-token=true".into(),
                format!("--cookie-refresh={COOKIE_REFRESH_SECS}s"),
                "--cookie-secure=false".into(),
                // 32 bytes: an AES-256 key for the session cookie.
                "--cookie-secret=MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=".into(),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{} ({e}): run tests/support/install-upstreams", bin.display()));
        let mut proxy = Proxy { child, base, log };
        proxy.wait_ready().await;
        proxy
    }

    async fn wait_ready(&mut self) {
        let http = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("oauth2-proxy exited ({status}): {}", self.log());
            }
            let ping = http.get(format!("{}/ping", self.base)).send().await;
            if ping.map(|r| r.status() == 200).unwrap_or(false) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("oauth2-proxy did not answer /ping: {}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Follows every redirect from `url`, whoever sends it, as a browser
/// would: the address and the page it ends on.
async fn visit(browser: &mut Browser<'_>, url: &str) -> (String, Page) {
    let mut url = url.to_string();
    for _ in 0..12 {
        let page = browser.get(&url).await;
        match &page.location {
            Some(to) => url = url::Url::parse(&url).unwrap().join(to).unwrap().to_string(),
            None => return (url, page),
        }
    }
    panic!("a redirect loop at {url}");
}

/// What reached the tool behind the proxy, or None if the page is not its.
fn echoed(page: &Page) -> Option<Value> {
    serde_json::from_str::<Value>(&page.body)
        .ok()
        .filter(|v| v.get("headers").is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_proxy_signs_a_person_in_to_the_tool_behind_it_and_renews_the_session() {
    // latchkey's issuer must be an address oauth2-proxy reaches.
    let reserved = reserve_port();
    let issuer = format!("http://127.0.0.1:{}", reserved.port);
    let app = TestApp::embedded(&[
        ("listen", &issuer["http://".len()..]),
        ("issuer", &issuer),
        ("id_token_signing_algorithms", "RS256"),
    ])
    .await;
    drop(reserved);
    assert_eq!(app.base, issuer);

    let proxy_port = free_port();
    let mut settings = ClientSettings::new(
        ClientKind::Confidential,
        vec![format!("http://127.0.0.1:{proxy_port}/oauth2/callback")],
    );
    settings.consent = ConsentMode::Skip;
    // go-oidc, inside oauth2-proxy, accepts RS256 unless told otherwise.
    settings.id_token_signed_response_alg = Some("RS256".into());
    let secret = app
        .services
        .features
        .clients
        .add("tools", Some("Internal tools"), &[], Some(&settings))
        .await
        .unwrap()
        .expect("a new client");
    let email = unique_email("proxy");
    app.register_verified(&email, PASSWORD).await;

    let tool = SupportServer::start("echo_upstream.py", &[], "the tool behind the proxy");
    let upstream = format!("http://127.0.0.1:{}", tool.ready);
    let proxy = Proxy::start(&app, &issuer, proxy_port, &secret, &upstream).await;
    let mut browser = Browser::new(&app);

    // Without a session the tool is not reached: the proxy sends the
    // browser to latchkey's sign-in page.
    let (at, page) = visit(&mut browser, &proxy.url("/reports?month=11")).await;
    assert!(
        echoed(&page).is_none(),
        "the tool answered without a sign-in: {}",
        page.body
    );
    assert!(at.starts_with(&format!("{issuer}/")), "ended at {at}");
    assert!(
        page.body.contains("name=\"password\""),
        "a sign-in page: {}",
        page.body
    );

    // The person signs in; the proxy redeems the code and lets them through
    // to the page they asked for, with their identity.
    let form = [
        ("authz", hidden(&page.body, "authz")),
        ("csrf", hidden(&page.body, "csrf")),
        ("email", email.clone()),
        ("password", PASSWORD.to_string()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let posted = browser.post(&format!("{issuer}/oauth/login"), &form).await;
    let next = posted.location.clone().expect("a redirect after signing in");
    let next = url::Url::parse(&issuer).unwrap().join(&next).unwrap();
    let (_, page) = visit(&mut browser, next.as_str()).await;
    let seen = echoed(&page).unwrap_or_else(|| panic!("the tool's answer: {}\n{}", page.body, proxy.log()));
    assert_eq!(seen["path"], "/reports?month=11");
    assert_eq!(seen["headers"]["x-forwarded-email"], email.as_str());
    let first_token = seen["headers"]["x-forwarded-access-token"]
        .as_str()
        .expect("the access token passed on")
        .to_string();
    let me = app.get_bearer("/oauth/userinfo", &first_token).await;
    assert_eq!(me.status(), 200);
    let me: Value = me.json().await.unwrap();
    assert_eq!(seen["headers"]["x-forwarded-user"], me["sub"]);

    // Once the session is older than --cookie-refresh, the proxy renews it
    // at the token endpoint with the refresh token: a new access token.
    tokio::time::sleep(Duration::from_secs(COOKIE_REFRESH_SECS + 1)).await;
    let (_, page) = visit(&mut browser, &proxy.url("/reports")).await;
    let seen = echoed(&page).unwrap_or_else(|| panic!("after renewal: {}\n{}", page.body, proxy.log()));
    let renewed = seen["headers"]["x-forwarded-access-token"].as_str().unwrap();
    assert_ne!(
        renewed,
        first_token,
        "the session was not renewed:\n{}",
        proxy.log()
    );
    assert_eq!(app.get_bearer("/oauth/userinfo", renewed).await.status(), 200);

    // Signing out of the proxy ends its session only: the next visit goes
    // back through latchkey, whose session signs the person in again
    // without a password (single sign-on).
    let out = browser.get(&proxy.url("/oauth2/sign_out")).await;
    assert!(out.status.is_redirection(), "{}", out.body);
    // Its session cookie (in chunks, `_oauth2_proxy_0`..., when large) is gone.
    let session_cookie = |k: &String| k.starts_with("_oauth2_proxy") && !k.ends_with("_csrf");
    assert!(
        !browser.cookies.keys().any(session_cookie),
        "{:?}",
        browser.cookies.keys()
    );
    let (_, page) = visit(&mut browser, &proxy.url("/again")).await;
    let seen = echoed(&page).unwrap_or_else(|| panic!("single sign-on: {}\n{}", page.body, proxy.log()));
    assert_eq!(seen["headers"]["x-forwarded-email"], email.as_str());

    // Another browser, without either session, still gets no further than
    // the sign-in page.
    let mut stranger = Browser::new(&app);
    let (at, page) = visit(&mut stranger, &proxy.url("/reports")).await;
    assert!(echoed(&page).is_none());
    assert!(at.starts_with(&format!("{issuer}/")), "ended at {at}");
    app.stop().await;
}
