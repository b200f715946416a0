//! What the OpenID tests share: the issuer's name and an application's
//! URIs, the relying parties (one library each, the same commands and JSON:
//! [`rp_of`]), and the browser that plays the user through the hosted pages
//! ([`Browser`]).

use std::collections::HashMap;
use std::path::Path;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

pub const ISSUER: &str = "http://latchkey.test";
pub const CALLBACK: &str = "http://127.0.0.1/callback";
pub const AFTER_LOGOUT: &str = "http://127.0.0.1/signed-out";

/// Registers an application of the authorization code flow; its secret.
pub async fn application(app: &TestApp, id: &str, kind: ClientKind, consent: ConsentMode) -> String {
    let mut s = ClientSettings::new(kind, vec![CALLBACK.into()]);
    s.consent = consent;
    s.post_logout_redirect_uris = vec![AFTER_LOGOUT.into()];
    app.services
        .features
        .clients
        .add(id, Some(&format!("App {id}")), &[], Some(&s))
        .await
        .unwrap()
        .expect("a new client")
}

/// The relying party: `start` or `finish` with its JSON input.
///
/// Run without blocking: the PostgreSQL tests run on one thread, which
/// also serves the requests the library makes.
pub async fn rp(command: &str, input: &Value) -> Value {
    rp_of(OPENID_CLIENT, command, input).await
}

/// openid-client (Node), `tests/support/oidc-rp/rp.mjs`.
pub const OPENID_CLIENT: &str = "openid-client";
/// Authlib (Python), `tests/support/oidc-rp/rp.py`.
pub const AUTHLIB: &str = "authlib";
/// coreos/go-oidc with golang.org/x/oauth2 (Go), `tests/support/oidc-rp-go`,
/// built by install-upstreams into `target/test-deps/oidc-rp-go`.
pub const GO_OIDC: &str = "go-oidc";
/// idpyoidc (Python, the identity Python project's OpenID Connect library),
/// `tests/support/oidc-rp/rp_idpy.py`, its packages installed by
/// install-upstreams into `target/test-deps/idpyoidc`.
pub const IDPYOIDC: &str = "idpyoidc";
/// The `openidconnect` crate (Rust), `tests/support/oidc-rp-rust`, built by
/// install-upstreams into `target/test-deps/oidc-rp-rust`.
pub const RUST_OPENIDCONNECT: &str = "openidconnect";

/// [`rp`] with the relying party built on `library` ([`OPENID_CLIENT`],
/// [`AUTHLIB`], [`GO_OIDC`], [`IDPYOIDC`] or [`RUST_OPENIDCONNECT`]): all
/// take the same commands and JSON.
pub async fn rp_of(library: &str, command: &str, input: &Value) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = match library {
        AUTHLIB => {
            let mut c = std::process::Command::new("python3");
            c.arg(root.join("tests/support/oidc-rp/rp.py"))
                .env("PYTHONPATH", root.join("target/test-deps/authlib"));
            c
        }
        GO_OIDC => std::process::Command::new(root.join("target/test-deps/oidc-rp-go")),
        IDPYOIDC => {
            let mut c = std::process::Command::new("python3");
            c.arg(root.join("tests/support/oidc-rp/rp_idpy.py"))
                .env("PYTHONPATH", root.join("target/test-deps/idpyoidc"));
            c
        }
        RUST_OPENIDCONNECT => std::process::Command::new(root.join("target/test-deps/oidc-rp-rust")),
        _ => {
            let mut c = std::process::Command::new("node");
            c.arg(root.join("tests/support/oidc-rp/rp.mjs"));
            c
        }
    };
    cmd.args([command.to_string(), input.to_string()]);
    let out = tokio::task::spawn_blocking(move || {
        cmd.output()
            .expect("the relying party runs (tests/support/install-upstreams installs its library)")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "{library} {command}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A browser: cookies kept per name, no redirect followed on its own (the
/// test reads each one), the issuer's name mapped to the app's address.
pub struct Browser<'a> {
    app: &'a TestApp,
    /// The origin of another provider whose pages this browser goes
    /// through instead of latchkey's: paths are on it.
    elsewhere: Option<String>,
    http: reqwest::Client,
    pub cookies: HashMap<String, String>,
    /// The `Accept-Language` it sends, if any.
    pub languages: Option<String>,
}

pub struct Page {
    pub status: StatusCode,
    pub location: Option<String>,
    pub body: String,
    pub headers: reqwest::header::HeaderMap,
}

impl<'a> Browser<'a> {
    pub fn new(app: &'a TestApp) -> Browser<'a> {
        Browser {
            app,
            elsewhere: None,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookies: HashMap::new(),
            languages: None,
        }
    }

    /// The headers of every request: its cookies and languages.
    fn headers(&self) -> reqwest::header::HeaderMap {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::COOKIE, self.cookie_header().parse().unwrap());
        if let Some(l) = &self.languages {
            h.insert(reqwest::header::ACCEPT_LANGUAGE, l.parse().unwrap());
        }
        h
    }

    /// A browser at another provider, whose origin is `origin`: paths and
    /// redirects are followed there.
    pub fn elsewhere(app: &'a TestApp, origin: &str) -> Browser<'a> {
        Browser {
            elsewhere: Some(origin.to_string()),
            ..Browser::new(app)
        }
    }

    fn address(&self, url: &str) -> String {
        match (&self.elsewhere, url.strip_prefix(ISSUER)) {
            (Some(origin), _) if url.starts_with('/') => format!("{origin}{url}"),
            (Some(_), _) => url.to_string(),
            (None, Some(path)) => self.app.url(path),
            (None, None) if url.starts_with('/') => self.app.url(url),
            (None, None) => url.to_string(),
        }
    }

    /// Whether a redirect to `url` stays at the provider.
    fn stays(&self, url: &str) -> bool {
        url.starts_with('/')
            || match &self.elsewhere {
                Some(origin) => url.starts_with(origin.as_str()),
                None => url.starts_with(ISSUER),
            }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn read(&mut self, r: reqwest::Response) -> Page {
        for v in r.headers().get_all(reqwest::header::SET_COOKIE) {
            let text = v.to_str().unwrap();
            let (pair, attrs) = text.split_once(';').unwrap_or((text, ""));
            let (k, val) = pair.split_once('=').unwrap();
            // Removed by an age of 0 or a date in the past (1970's, as
            // node's cookie library sends).
            if attrs.contains("Max-Age=0") || attrs.contains("1970") {
                self.cookies.remove(k);
            } else {
                self.cookies.insert(k.to_string(), val.to_string());
            }
        }
        let status = r.status();
        let headers = r.headers().clone();
        let location = headers
            .get(reqwest::header::LOCATION)
            .map(|v| v.to_str().unwrap().to_string());
        let body = r.text().await.unwrap();
        Page {
            status,
            location,
            body,
            headers,
        }
    }

    pub async fn get(&mut self, url: &str) -> Page {
        let r = self
            .http
            .get(self.address(url))
            .headers(self.headers())
            .send()
            .await
            .unwrap();
        self.read(r).await
    }

    pub async fn post(&mut self, url: &str, form: &[(&str, &str)]) -> Page {
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let r = self
            .http
            .post(self.address(url))
            .headers(self.headers())
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        self.read(r).await
    }

    /// A JSON call of the page's script (`fetch`): its cookies sent, those
    /// it sets kept, with `bearer`.
    pub async fn post_json(&mut self, url: &str, bearer: &str, body: &serde_json::Value) -> Page {
        let r = self
            .http
            .post(self.address(url))
            .headers(self.headers())
            .bearer_auth(bearer)
            .json(body)
            .send()
            .await
            .unwrap();
        self.read(r).await
    }

    /// Follows redirects within the provider; stops at one that leaves it
    /// (an application's URI) or at a page.
    pub async fn follow(&mut self, mut page: Page) -> Page {
        for _ in 0..10 {
            match &page.location {
                Some(to) if self.stays(to) => {
                    let to = to.clone();
                    page = self.get(&to).await;
                }
                _ => return page,
            }
        }
        panic!("a redirect loop");
    }

    /// Signs in on the sign-in page `page` with a password.
    pub async fn sign_in(&mut self, page: &Page, email: &str, password: &str) -> Page {
        assert_eq!(page.status, StatusCode::OK, "the sign-in page: {}", page.body);
        let authz = hidden(&page.body, "authz");
        let csrf = hidden(&page.body, "csrf");
        let r = self
            .post(
                "/oauth/login",
                &[
                    ("authz", &authz),
                    ("csrf", &csrf),
                    ("email", email),
                    ("password", password),
                ],
            )
            .await;
        self.follow(r).await
    }

    /// Answers the consent page.
    pub async fn consent(&mut self, page: &Page, decision: &str) -> Page {
        assert!(
            page.body.contains("/oauth/consent"),
            "a consent page: {}",
            page.body
        );
        let consent = hidden(&page.body, "consent");
        let csrf = hidden(&page.body, "csrf");
        let r = self
            .post(
                "/oauth/consent",
                &[("consent", &consent), ("csrf", &csrf), ("decision", decision)],
            )
            .await;
        self.follow(r).await
    }
}

/// A session of `email` (password [`PASSWORD`], no second factor) for
/// the application `id`, registered with [`application`] and consent
/// `skip`, through the code flow without the relying party library (for
/// tests of what an application's tokens may do): the token answer.
pub async fn code_grant(app: &TestApp, id: &str, secret: &str, email: &str, scope: &str) -> Value {
    code_grant_in(&mut Browser::new(app), id, secret, email, scope).await
}

/// [`code_grant`] in `browser`, which keeps the browser session.
pub async fn code_grant_in(
    browser: &mut Browser<'_>,
    id: &str,
    secret: &str,
    email: &str,
    scope: &str,
) -> Value {
    let app = browser.app;
    let (verifier, challenge) = pkce();
    let back = browser.authorize_and_sign_in(id, scope, &challenge, email).await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("back to the application: {}", back.body));
    exchange_code(app, id, secret, &callback, &verifier).await
}

/// The code of the redirect back to the application, `callback`,
/// exchanged by the confidential client `id` with PKCE `verifier`: the
/// token answer.
pub async fn exchange_code(app: &TestApp, id: &str, secret: &str, callback: &str, verifier: &str) -> Value {
    let code = query(callback)["code"].clone();
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth(id, Some(secret))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", CALLBACK),
            ("code_verifier", verifier),
        ])
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

/// Ends every session of `email` (password [`PASSWORD`]) but a new one, as
/// the user would from another device: a login there, then "sign out
/// everywhere else".
pub async fn sign_out_elsewhere(app: &TestApp, email: &str) {
    let pair: Value = app
        .post("/auth/login", json!({"email": email, "password": PASSWORD}))
        .await
        .json()
        .await
        .unwrap();
    let r = app
        .http
        .delete(app.url("/auth/sessions?others=true"))
        .bearer_auth(pair["access_token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

/// A fresh PKCE pair: (verifier, S256 challenge).
pub fn pkce() -> (String, String) {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let verifier = b64(ring::digest::digest(&ring::digest::SHA256, unique_email("v").as_bytes()).as_ref());
    let challenge = b64(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref());
    (verifier, challenge)
}

/// `path?...` with `params` form-encoded.
pub fn with_query(path: &str, params: &[(&str, &str)]) -> String {
    format!(
        "{path}?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    )
}

impl Browser<'_> {
    /// An authorization request of client `id` for `scope` (S256
    /// `challenge`, [`CALLBACK`]), signing in as `email` with [`PASSWORD`]
    /// if the provider asks: the page it ends on (the redirect back to the
    /// application when it went well).
    pub async fn authorize_and_sign_in(
        &mut self,
        id: &str,
        scope: &str,
        challenge: &str,
        email: &str,
    ) -> Page {
        let url = with_query(
            "/oauth/authorize",
            &[
                ("response_type", "code"),
                ("client_id", id),
                ("redirect_uri", CALLBACK),
                ("scope", scope),
                ("code_challenge", challenge),
                ("code_challenge_method", "S256"),
            ],
        );
        let page = self.get(&url).await;
        let page = self.follow(page).await;
        // Signed in already (single sign-on): straight back to the application.
        if page.location.is_some() {
            page
        } else {
            self.sign_in(&page, email, PASSWORD).await
        }
    }
}

/// The value of the hidden (or any) input `name` of a page.
pub fn hidden(body: &str, name: &str) -> String {
    let needle = format!("name=\"{name}\" value=\"");
    let at = body
        .find(&needle)
        .unwrap_or_else(|| panic!("no field {name} in {body}"))
        + needle.len();
    let end = body[at..].find('"').unwrap() + at;
    body[at..end]
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// That `page` is in language `lang` (its `<html lang>` and
/// `Content-Language`) and says `text` (as the page writes it).
pub fn assert_speaks(page: &Page, lang: &str, text: &str) {
    assert!(
        page.body.contains(&format!("<html lang=\"{lang}\">")),
        "not in {lang}: {}",
        page.body
    );
    assert_eq!(page.headers["content-language"], lang);
    assert!(page.body.contains(text), "no {text:?} in {}", page.body);
}

/// The query parameters of a URL.
pub fn query(url: &str) -> HashMap<String, String> {
    url::Url::parse(url).unwrap().query_pairs().into_owned().collect()
}

pub fn rp_input(app: &TestApp, id: &str, secret: Option<&str>, scope: &str) -> Value {
    let mut v = json!({
        "issuer": ISSUER,
        "base": app.url(""),
        "client_id": id,
        "redirect_uri": CALLBACK,
        "scope": scope,
        "post_logout_redirect_uri": AFTER_LOGOUT,
    });
    if let Some(s) = secret {
        v["client_secret"] = s.into();
    }
    v
}

/// The application's half after the browser came back with `callback`.
pub async fn finish(started: &Value, input: &Value, callback: &str) -> Value {
    finish_with(OPENID_CLIENT, started, input, callback).await
}

/// [`finish`] with the relying party of `library`.
pub async fn finish_with(library: &str, started: &Value, input: &Value, callback: &str) -> Value {
    let mut f = input.clone();
    f["callback"] = callback.into();
    for k in ["code_verifier", "state", "nonce"] {
        f[k] = started[k].clone();
    }
    let done = rp_of(library, "finish", &f).await;
    assert!(done.get("error").is_none(), "{library} refused: {done}");
    done
}
