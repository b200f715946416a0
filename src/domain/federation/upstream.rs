//! Talking to an upstream provider: its discovery document and JWKS
//! (cached, the JWKS read again when an id_token names a key it lacks, so
//! that a rotation upstream costs one fetch), the token request, userinfo.
//! Every request has a time limit ([`TIMEOUT`]) and a size limit
//! ([`MAX_BODY`]); an upstream that is down, slow or answers nonsense is a
//! [`Failure`], never a hang or a panic.
//!
//! Upstream URLs are the operator's (an issuer configured with the
//! command line or the admin API), so private addresses are allowed: an
//! upstream on the same network is the usual case.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::tokens::keys::Key;

/// The time limit of each request to an upstream.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read from an upstream.
const MAX_BODY: usize = 256 * 1024;
/// How long a discovery document and a JWKS are kept.
const KEEP: Duration = Duration::from_secs(600);
/// A JWKS is read again for an unknown `kid` at most this often.
const REFETCH_AFTER: Duration = Duration::from_secs(10);

/// What went wrong with an upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// It could not be reached in time.
    #[error("the upstream could not be reached: {0}")]
    Unreachable(String),
    /// It answered, but not as the specifications say.
    #[error("the upstream answered unexpectedly: {0}")]
    BadAnswer(String),
    /// Its token endpoint refused the code (its `error`).
    #[error("the upstream refused the code: {0}")]
    Refused(String),
}

/// The parts of an upstream's discovery document a sign-in uses.
#[derive(Clone, Debug)]
pub struct Discovery {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    pub userinfo_endpoint: Option<String>,
    /// `authorization_response_iss_parameter_supported` (RFC 9207): its
    /// answers name it, so an answer without `iss` is not its.
    pub names_issuer: bool,
}

/// How an upstream signs people in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// An OpenID Provider: discovery, the code flow, an id_token.
    Oidc,
    /// GitHub (or GitHub Enterprise Server), which is no OpenID Provider:
    /// OAuth 2.0's code flow, then its REST API for who signed in
    /// (`GET /user`) and their addresses (`GET /user/emails`).
    Github,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Oidc => "oidc",
            Protocol::Github => "github",
        }
    }

    /// As stored (anything unknown is refused as an upstream nobody can
    /// use rather than guessed).
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "oidc" => Some(Protocol::Oidc),
            "github" => Some(Protocol::Github),
            _ => None,
        }
    }

    /// The scopes asked when the operator names none.
    pub fn default_scopes(self) -> &'static str {
        match self {
            Protocol::Oidc => "openid email profile",
            // The profile, and the addresses with their verification
            // (`/user/emails` needs `user:email`).
            Protocol::Github => "read:user user:email",
        }
    }
}

/// GitHub's endpoints for the site at `base`: github.com's own, or those
/// of a GitHub Enterprise Server (`{base}/login/oauth/...` and the API at
/// `{base}/api/v3`), as GitHub documents them ("Authorizing OAuth apps",
/// "REST API endpoints for users" and "... for emails").
pub fn github(base: &str) -> (Discovery, String) {
    let base = base.trim_end_matches('/');
    let api = if base == GITHUB {
        "https://api.github.com".to_string()
    } else {
        format!("{base}/api/v3")
    };
    let d = Discovery {
        authorization_endpoint: format!("{base}/login/oauth/authorize"),
        token_endpoint: format!("{base}/login/oauth/access_token"),
        jwks_uri: String::new(),
        userinfo_endpoint: None,
        names_issuer: false,
    };
    (d, api)
}

/// github.com, the issuer of a GitHub upstream unless it is an Enterprise
/// Server.
pub const GITHUB: &str = "https://github.com";

/// Whether an upstream URL may be used: https, or http to a loopback
/// address (a provider on the same machine, as in the tests); plain http
/// elsewhere would let anyone on the path forge its keys and answers.
pub fn secure_enough(u: &url::Url) -> bool {
    if !u.username().is_empty() || u.password().is_some() {
        return false;
    }
    match (u.scheme(), u.host()) {
        ("https", Some(_)) => true,
        ("http", Some(url::Host::Ipv4(ip))) => ip.is_loopback(),
        ("http", Some(url::Host::Ipv6(ip))) => ip.is_loopback(),
        ("http", Some(url::Host::Domain(d))) => d == "localhost",
        _ => false,
    }
}

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;
/// An upstream's signing keys by `kid`.
pub(crate) type Keys = Arc<HashMap<String, Arc<Key>>>;

/// The HTTP side of federation, with the upstreams' documents it keeps.
pub struct Upstreams {
    client: Client<Https, Full<Bytes>>,
    discovery: Mutex<HashMap<String, (Instant, Arc<Discovery>)>>,
    jwks: Mutex<HashMap<String, (Instant, Keys)>>,
}

impl Default for Upstreams {
    fn default() -> Self {
        Self::new()
    }
}

impl Upstreams {
    pub fn new() -> Upstreams {
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(TIMEOUT));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Upstreams {
            client: Client::builder(TokioExecutor::new()).build(https),
            discovery: Mutex::new(HashMap::new()),
            jwks: Mutex::new(HashMap::new()),
        }
    }

    /// The discovery document of `issuer` (its `issuer` must be `issuer`
    /// exactly: OpenID Connect Discovery §4.3).
    pub async fn discovery(&self, issuer: &str) -> Result<Arc<Discovery>, Failure> {
        if let Some((at, d)) = self.discovery.lock().unwrap().get(issuer) {
            if at.elapsed() < KEEP {
                return Ok(d.clone());
            }
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let (status, doc) = self.send(get(&url)?).await?;
        if status != 200 {
            return Err(Failure::BadAnswer(format!("discovery answered {status}")));
        }
        if doc["issuer"].as_str() != Some(issuer) {
            return Err(Failure::BadAnswer("discovery names another issuer".into()));
        }
        // Every endpoint as safe as the issuer: https, or loopback http
        // for a loopback http issuer only (an https issuer's document
        // cannot send latchkey to a port of its own machine).
        let plain = issuer.starts_with("http://");
        let field = |name: &str| -> Result<String, Failure> {
            doc[name]
                .as_str()
                .filter(|u| {
                    url::Url::parse(u).is_ok_and(|u| secure_enough(&u) && (plain || u.scheme() == "https"))
                })
                .map(str::to_string)
                .ok_or_else(|| Failure::BadAnswer(format!("discovery lacks {name}, or it is not https")))
        };
        let d = Arc::new(Discovery {
            authorization_endpoint: field("authorization_endpoint")?,
            token_endpoint: field("token_endpoint")?,
            jwks_uri: field("jwks_uri")?,
            userinfo_endpoint: field("userinfo_endpoint").ok(),
            names_issuer: doc["authorization_response_iss_parameter_supported"] == Value::Bool(true),
        });
        self.discovery
            .lock()
            .unwrap()
            .insert(issuer.to_string(), (Instant::now(), d.clone()));
        Ok(d)
    }

    /// The keys of `jwks_uri` by `kid`; read again first when `fresh` (an
    /// id_token named a key the kept set lacks), unless it was read just now.
    pub(crate) async fn keys(
        &self,
        jwks_uri: &str,
        fresh: bool,
    ) -> Result<Arc<HashMap<String, Arc<Key>>>, Failure> {
        if let Some((at, k)) = self.jwks.lock().unwrap().get(jwks_uri) {
            let young = at.elapsed() < if fresh { REFETCH_AFTER } else { KEEP };
            if young {
                return Ok(k.clone());
            }
        }
        let (status, doc) = self.send(get(jwks_uri)?).await?;
        let list = doc["keys"]
            .as_array()
            .filter(|_| status == 200)
            .ok_or_else(|| Failure::BadAnswer("the JWKS has no keys".into()))?;
        let mut keys = HashMap::new();
        for (i, jwk) in list.iter().enumerate() {
            if jwk["use"].as_str().is_some_and(|u| u != "sig") {
                continue;
            }
            let kid = jwk["kid"]
                .as_str()
                .map_or_else(|| format!("#{i}"), str::to_string);
            if let Ok(key) = Key::public(&kid, jwk.clone(), 0) {
                keys.insert(kid, Arc::new(key));
            }
        }
        let keys = Arc::new(keys);
        self.jwks
            .lock()
            .unwrap()
            .insert(jwks_uri.to_string(), (Instant::now(), keys.clone()));
        Ok(keys)
    }

    /// The token request of a code: the token response. The client
    /// authenticates with `client_secret_basic` (RFC 6749 §2.3.1) at an
    /// OpenID Provider, and with its id and secret in the form at GitHub,
    /// which documents only those.
    pub async fn exchange(
        &self,
        protocol: Protocol,
        token_endpoint: &str,
        client: (&str, &str),
        form: &[(&str, &str)],
    ) -> Result<Value, Failure> {
        use base64::Engine;
        let mut body = form.to_vec();
        let mut request = hyper::Request::post(token_endpoint)
            .header(hyper::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(hyper::header::ACCEPT, "application/json");
        match protocol {
            Protocol::Oidc => {
                let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
                let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                    "{}:{}",
                    enc(client.0),
                    enc(client.1)
                ));
                request = request.header(hyper::header::AUTHORIZATION, format!("Basic {basic}"));
            }
            Protocol::Github => {
                body.push(("client_id", client.0));
                body.push(("client_secret", client.1));
            }
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(body)
            .finish();
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Failure::BadAnswer(e.to_string()))?;
        let (status, doc) = self.send(request).await?;
        match status {
            // GitHub answers a refused code with 200 and an `error`.
            200 if doc.get("error").is_none() => Ok(doc),
            200 | 400..=499 => Err(Failure::Refused(
                doc["error"]
                    .as_str()
                    .unwrap_or("invalid_request")
                    .chars()
                    .filter(|c| c.is_ascii_graphic())
                    .take(64)
                    .collect(),
            )),
            s => Err(Failure::BadAnswer(format!("the token endpoint answered {s}"))),
        }
    }

    /// Userinfo with an access token.
    pub async fn userinfo(&self, endpoint: &str, access_token: &str) -> Result<Value, Failure> {
        let request = hyper::Request::get(endpoint)
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::AUTHORIZATION, format!("Bearer {access_token}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| Failure::BadAnswer(e.to_string()))?;
        match self.send(request).await? {
            (200, doc) if doc.is_object() => Ok(doc),
            (s, _) => Err(Failure::BadAnswer(format!("userinfo answered {s}"))),
        }
    }

    /// A GET of GitHub's REST API with a user's token (its documented
    /// headers: the media type, the API version, a `User-Agent`, which it
    /// requires of every request).
    pub async fn github_api(&self, url: &str, access_token: &str) -> Result<Value, Failure> {
        let request = hyper::Request::get(url)
            .header(hyper::header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
            .header(hyper::header::AUTHORIZATION, format!("Bearer {access_token}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| Failure::BadAnswer(e.to_string()))?;
        match self.send(request).await? {
            (200, doc) => Ok(doc),
            (s, _) => Err(Failure::BadAnswer(format!("GitHub's API answered {s}"))),
        }
    }

    /// Sends `request` within [`TIMEOUT`]: the status and the JSON answer
    /// (`Null` when the body is no JSON).
    async fn send(&self, mut request: hyper::Request<Full<Bytes>>) -> Result<(u16, Value), Failure> {
        request.headers_mut().insert(
            hyper::header::USER_AGENT,
            hyper::header::HeaderValue::from_static(concat!("latchkey/", env!("CARGO_PKG_VERSION"))),
        );
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| Failure::Unreachable(e.to_string()))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|_| Failure::BadAnswer("an answer too large or cut short".into()))?
                .to_bytes();
            Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| Failure::Unreachable("no answer in time".into()))?
    }
}

fn get(url: &str) -> Result<hyper::Request<Full<Bytes>>, Failure> {
    hyper::Request::get(url)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| Failure::BadAnswer(format!("{url}: {e}")))
}
