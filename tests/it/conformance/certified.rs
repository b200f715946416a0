//! Side by side with a certified provider: node-oidc-provider given the
//! same requests as latchkey, and each library of `super` signing in at
//! both (docs/conformance.md, "Side by side with a certified provider").

use serde_json::{json, Value};

use super::{Rp, LIBRARIES};
use crate::common::TestApp;
use crate::oidc::{application, Browser, Page, AFTER_LOGOUT, CALLBACK, ISSUER};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

/// node-oidc-provider (`tests/support/oidc-op/op.mjs`), certified for these
/// plans, on a free loopback port for as long as this value lives.
pub(crate) struct CertifiedProvider {
    child: std::process::Child,
    pub(crate) issuer: String,
}

impl CertifiedProvider {
    /// Started with the clients `clients` (its JSON client metadata).
    pub(crate) async fn start(clients: Value) -> CertifiedProvider {
        Self::start_with(json!({ "clients": clients })).await
    }

    /// Started with `input` (`tests/support/oidc-op/op.mjs` says what it takes).
    pub(crate) async fn start_with(input: Value) -> CertifiedProvider {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/oidc-op/op.mjs");
        let arg = input.to_string();
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

/// An HTTP client that follows no redirect, with a connection per request:
/// a provider may close one after an error answer, and a request sent on it
/// meanwhile would fail.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
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
/// ("Side by side with a certified provider"), each a deliberate choice.
pub(super) async fn a_certified_provider_answers_as_latchkey_does_but_for_the_differences_documented(
    app: &TestApp,
) {
    let secret = application(app, "compared", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = CertifiedProvider::start(json!([{
        "client_id": "compared",
        "client_secret": secret,
        "redirect_uris": [CALLBACK],
        "post_logout_redirect_uris": [AFTER_LOGOUT],
    }]))
    .await;
    let http = no_redirects();
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
        // No JWT client authentication.
        "discovery token_endpoint_auth_methods_supported",
    ];
    assert_eq!(differences, expected, "{differences:#?}");
}

/// Signs in at node-oidc-provider's development pages, as `login`, from
/// its authorization URL `url`: the redirect back to the client.
async fn sign_in_at_the_certified_provider(app: &TestApp, issuer: &str, url: &str, login: &str) -> String {
    let mut browser = Browser::elsewhere(app, issuer);
    let page = browser.get(url).await;
    let page = browser.follow(page).await;
    let back = through_certified_pages(&mut browser, page, login, CALLBACK).await;
    back.location.unwrap()
}

/// Goes on from `page` through node-oidc-provider's development pages
/// (`browser` is at its origin), posting each form as `login` (its sign-in
/// accepts any password; its consent page, a button) until it redirects
/// back to the client, at `back_to`: that redirect.
pub(crate) async fn through_certified_pages(
    browser: &mut Browser<'_>,
    mut page: Page,
    login: &str,
    back_to: &str,
) -> Page {
    for _ in 0..4 {
        if let Some(to) = &page.location {
            assert!(to.starts_with(back_to), "back to the client: {to}");
            return page;
        }
        let action = attribute(&page.body, "action").unwrap_or_else(|| panic!("a form: {}", page.body));
        let mut form: Vec<(String, String)> = Vec::new();
        let mut rest = page.body.as_str();
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
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let next = browser.post(&action, &form).await;
        page = browser.follow(next).await;
    }
    panic!("no way back to the client: {}", page.body);
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
pub(super) async fn the_libraries_sign_in_at_the_certified_provider_and_get_the_same_claims_but_for_those_documented(
    app: &TestApp,
) {
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
            sign_in_at_the_certified_provider(app, &op.issuer, started["url"].as_str().unwrap(), &rp.email)
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

/// A token request's form, owned.
type TokenForm = Vec<(&'static str, String)>;
/// A misuse of a code: its name, and what it changes in the rightful form.
type Misuse<'a> = (&'a str, &'a dyn Fn(&mut TokenForm));

/// Where a code comes from and goes to, at one provider.
enum Side<'a> {
    Latchkey(crate::oidc::Browser<'a>),
    Certified(String),
}

impl Side<'_> {
    fn name(&self) -> &'static str {
        match self {
            Side::Latchkey(_) => "latchkey",
            Side::Certified(_) => "node-oidc-provider",
        }
    }

    /// A fresh code for `client`, signed in as `email`: (code, verifier).
    async fn code(&mut self, app: &TestApp, client: &str, email: &str) -> (String, String) {
        let (verifier, challenge) = crate::oidc::pkce();
        let back = match self {
            Side::Latchkey(browser) => {
                let page = browser
                    .authorize_and_sign_in(client, "openid", &challenge, email)
                    .await;
                page.location
                    .unwrap_or_else(|| panic!("back to the client: {}", page.body))
            }
            Side::Certified(issuer) => {
                let url = probe_url(
                    &format!("{issuer}/auth"),
                    client,
                    &[("code_challenge", Some(&challenge)), ("state", None)],
                );
                sign_in_at_the_certified_provider(app, issuer, &url, email).await
            }
        };
        (crate::oidc::query(&back)["code"].clone(), verifier)
    }

    fn url(&self, app: &TestApp, path: &str) -> String {
        match self {
            Side::Latchkey(_) => app.url(&format!("/oauth/{path}")),
            Side::Certified(issuer) => format!("{issuer}/{}", if path == "userinfo" { "me" } else { path }),
        }
    }
}

/// A token request's (status, `error`, `access_token`).
async fn exchange(
    http: &reqwest::Client,
    url: &str,
    client: (&str, &str),
    form: &[(&str, &str)],
) -> (u16, Value, Option<String>) {
    let r = http
        .post(url)
        .basic_auth(client.0, Some(client.1))
        .form(form)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (
        status,
        body["error"].clone(),
        body["access_token"].as_str().map(String::from),
    )
}

/// A signed-in user's real codes, misused at the token endpoint of both
/// providers: each misuse gets the same status and `error` at both, and so
/// does what follows it (the rightful exchange after a refused one, a code
/// presented twice and the first exchange's access token at userinfo), and
/// it is what the specifications ask.
pub(super) async fn a_real_codes_misuses_get_the_same_answers_at_the_certified_provider(app: &TestApp) {
    const CLIENT: &str = "codes-compared";
    // Two redirect URIs: a token request must name the code's (Core
    // §3.1.3.2 lets a provider fill in a client's only one).
    let other_uri = format!("{CALLBACK}/other");
    let mut settings = latchkey::domain::oidc::client::ClientSettings::new(
        ClientKind::Confidential,
        vec![CALLBACK.into(), other_uri.clone()],
    );
    settings.consent = ConsentMode::Skip;
    let secret = app
        .services
        .features
        .clients
        .add(CLIENT, None, &[], Some(&settings))
        .await
        .unwrap()
        .expect("a new client");
    let email = crate::common::unique_email(CLIENT);
    app.register_verified(&email, crate::common::PASSWORD).await;
    let op = CertifiedProvider::start(json!([{
        "client_id": CLIENT,
        "client_secret": secret,
        "redirect_uris": [CALLBACK, other_uri],
    }]))
    .await;
    let http = no_redirects();
    let client = (CLIENT, secret.as_str());
    let mut outcomes: Vec<Vec<String>> = Vec::new();
    for mut side in [
        Side::Latchkey(crate::oidc::Browser::new(app)),
        Side::Certified(op.issuer.clone()),
    ] {
        let token = side.url(app, "token");
        let mut seen = Vec::new();
        let mut note = |what: &str, (status, error, _): &(u16, Value, Option<String>)| {
            seen.push(format!("{what}: {status} {error}"));
        };
        let right = |code: &str, verifier: &str| {
            vec![
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", CALLBACK),
                ("code_verifier", verifier),
            ]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect::<TokenForm>()
        };
        let send = |form: TokenForm| {
            let (http, token) = (&http, token.clone());
            async move {
                let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
                exchange(http, &token, client, &form).await
            }
        };
        let misuses: [Misuse; 4] = [
            ("another verifier", &|f| f[3].1 = "w".repeat(43)),
            ("no verifier", &|f| {
                f.pop();
            }),
            ("another redirect_uri", &|f| f[2].1 = format!("{CALLBACK}/other")),
            ("no redirect_uri", &|f| {
                f.remove(2);
            }),
        ];
        for (name, change) in misuses {
            let (code, verifier) = side.code(app, CLIENT, &email).await;
            let mut form = right(&code, &verifier);
            change(&mut form);
            note(name, &send(form).await);
            note(
                &format!("{name}, then the rightful exchange"),
                &send(right(&code, &verifier)).await,
            );
        }
        let (code, verifier) = side.code(app, CLIENT, &email).await;
        let first = send(right(&code, &verifier)).await;
        note("a code, exchanged", &first);
        note("the same code again", &send(right(&code, &verifier)).await);
        let userinfo = http
            .get(side.url(app, "userinfo"))
            .bearer_auth(first.2.as_deref().unwrap_or("none"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        seen.push(format!(
            "the first exchange's access token at userinfo: {userinfo}"
        ));
        println!("{}: {seen:#?}", side.name());
        outcomes.push(seen);
    }
    let differences: Vec<String> = outcomes[0]
        .iter()
        .zip(&outcomes[1])
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("{a} / {b}"))
        .collect();
    let expected: [&str; 0] = [];
    assert_eq!(differences, expected, "{differences:#?}");
    // And what both answer is what the specifications ask.
    for line in [
        "another verifier: 400 \"invalid_grant\"",
        "another verifier, then the rightful exchange: 200 null",
        "no redirect_uri: 400 \"invalid_request\"",
        "a code, exchanged: 200 null",
        "the same code again: 400 \"invalid_grant\"",
        "the first exchange's access token at userinfo: 401",
    ] {
        assert!(
            outcomes[0].iter().any(|o| o == line),
            "{line}: {:#?}",
            outcomes[0]
        );
    }
}
