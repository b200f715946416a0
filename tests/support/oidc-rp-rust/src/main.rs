//! A relying party built on the `openidconnect` crate (Rust), the fifth
//! library that signs in with latchkey in the conformance scenarios
//! (tests/it/conformance.rs), beside openid-client (rp.mjs), Authlib
//! (rp.py), go-oidc and idpyoidc (rp_idpy.py). Same commands, same JSON in
//! and out:
//!
//!   oidc-rp-rust start  '{"issuer","base","client_id","client_secret"?,"redirect_uri","scope",
//!                         "extra"?,"no_nonce"?,"auth"?,"id_token_alg"?}'
//!     -> {"url", "code_verifier", "state", "nonce"}
//!   oidc-rp-rust finish '{...start's input, "callback", "code_verifier", "state", "nonce",
//!                         "max_age"?, "post_logout_redirect_uri"?}'
//!     -> {"claims", "userinfo", "refreshed", "end_session", "access_token", "id_token", "scope"}
//!
//! What it checks is the crate's: discovery (the issuer it names, its JWKS),
//! the id_token's signature against the JWKS with the algorithm pinned,
//! iss, aud, exp, the nonce (its `NonceVerifier`), at_hash (its
//! `AccessTokenHash`, Ed25519's SHA-512 for EdDSA), auth_time against
//! max_age (its `auth_time` hook, the age allowed being the application's),
//! userinfo's sub against the id_token's. Added here, as the crate leaves
//! them to the application: state, the `iss` response parameter (RFC 9207)
//! and azp (the crate does not check it).
//!
//! The crate always sends a nonce: with `no_nonce` the nonce is taken out
//! of the URL it built, and the id_token must then have none.
//! `base` is where latchkey really listens: every request to the issuer's
//! origin goes there (the HTTP client handed to the crate), and no redirect
//! is followed.
//!
//! Any refusal prints {"error", "code"} and exits 1.

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreErrorResponseType, CoreGenderClaim, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreResponseType, CoreRevocableToken,
    CoreRevocationErrorResponse, CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::http::{HeaderValue, Request, Response, StatusCode};
use openidconnect::{
    AccessTokenHash, AdditionalClaims, AuthType, AuthenticationFlow, AuthorizationCode, ClientId,
    ClientSecret, CsrfToken, EmptyExtraTokenFields, EndSessionUrl, EndpointMaybeSet, EndpointNotSet,
    EndpointSet, IdTokenFields, IssuerUrl, LogoutRequest, Nonce, OAuth2TokenResponse, PkceCodeChallenge,
    PkceCodeVerifier, PostLogoutRedirectUrl, ProviderMetadataWithLogout, RedirectUrl, RefreshToken, Scope,
    StandardErrorResponse, StandardTokenResponse, UserInfoClaims,
};
use serde_json::{json, Value};

/// The claims beyond the standard ones (`sid`, `acr`'s kin, ...), kept so
/// that the claims printed are all the token's.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
struct Other {
    #[serde(flatten)]
    rest: HashMap<String, Value>,
}
impl AdditionalClaims for Other {}

type TokenAnswer = StandardTokenResponse<
    IdTokenFields<
        Other,
        EmptyExtraTokenFields,
        CoreGenderClaim,
        CoreJweContentEncryptionAlgorithm,
        CoreJwsSigningAlgorithm,
    >,
    CoreTokenType,
>;

/// The crate's client as discovery makes it (the authorization endpoint
/// set, the token and userinfo endpoints maybe), with [`Other`] claims kept.
type Client = openidconnect::Client<
    Other,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    TokenAnswer,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// A refusal: `{"error", "code"}` on stdout, exit 1.
fn fail(code: &str, error: impl std::fmt::Display) -> ! {
    println!("{}", json!({"error": error.to_string(), "code": code}));
    std::process::exit(1);
}

/// Every error with its causes, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

/// The HTTP client handed to the crate: the issuer's origin is `base`, no
/// redirect is followed, and an error status is an answer (the crate reads
/// the OAuth error in it), not a failure of the transport.
struct Http {
    origin: String,
    base: String,
    agent: openidconnect::ureq::Agent,
}

impl Http {
    fn call(&self, request: Request<Vec<u8>>) -> Result<Response<Vec<u8>>, std::io::Error> {
        let uri = request.uri().to_string();
        let uri = match uri.strip_prefix(&self.origin) {
            Some(rest) => format!("{}{rest}", self.base),
            None => uri,
        };
        let mut req = self.agent.request(request.method().as_str(), &uri);
        for (name, value) in request.headers() {
            req = req.set(name.as_str(), value.to_str().map_err(std::io::Error::other)?);
        }
        let answer = if request.method() == openidconnect::http::Method::POST {
            req.send_bytes(request.body())
        } else {
            req.call()
        };
        let answer = match answer {
            Ok(r) | Err(openidconnect::ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(std::io::Error::other(e)),
        };
        let mut builder =
            Response::builder().status(StatusCode::from_u16(answer.status()).map_err(std::io::Error::other)?);
        for name in answer.headers_names() {
            if let Some(v) = answer.header(&name) {
                builder = builder.header(&name, HeaderValue::from_str(v).map_err(std::io::Error::other)?);
            }
        }
        let mut body = Vec::new();
        answer.into_reader().read_to_end(&mut body)?;
        builder.body(body).map_err(std::io::Error::other)
    }
}

impl openidconnect::SyncHttpClient for Http {
    type Error = std::io::Error;
    fn call(&self, request: Request<Vec<u8>>) -> Result<Response<Vec<u8>>, Self::Error> {
        Http::call(self, request)
    }
}

fn text<'a>(p: &'a Value, key: &str) -> Option<&'a str> {
    p.get(key).and_then(Value::as_str)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        fail("usage", "oidc-rp-rust start|finish JSON");
    }
    let p: Value = serde_json::from_str(&args[2]).unwrap_or_else(|e| fail("input", e));
    let issuer = text(&p, "issuer").unwrap_or_else(|| fail("input", "no issuer"));
    let origin = url::Url::parse(issuer).unwrap_or_else(|e| fail("input", e));
    let http = Http {
        origin: origin.origin().ascii_serialization(),
        base: text(&p, "base")
            .unwrap_or(issuer)
            .trim_end_matches('/')
            .to_string(),
        agent: openidconnect::ureq::AgentBuilder::new()
            .redirects(0)
            .timeout(Duration::from_secs(10))
            .build(),
    };
    let issuer = IssuerUrl::new(issuer.to_string()).unwrap_or_else(|e| fail("input", e));
    let meta =
        ProviderMetadataWithLogout::discover(&issuer, &http).unwrap_or_else(|e| fail("discovery", chain(&e)));
    let end_session = meta.additional_metadata().end_session_endpoint.clone();
    let named = meta.issuer().to_string();
    let secret = text(&p, "client_secret").map(|s| ClientSecret::new(s.into()));
    let public = secret.is_none();
    let redirect = RedirectUrl::new(text(&p, "redirect_uri").unwrap_or_default().into())
        .unwrap_or_else(|e| fail("input", e));
    let client: Client = Client::from_provider_metadata(
        meta,
        ClientId::new(text(&p, "client_id").unwrap_or_default().into()),
        secret,
    )
    .set_redirect_uri(redirect)
    .set_auth_type(if text(&p, "auth") == Some("post") || public {
        AuthType::RequestBody
    } else {
        AuthType::BasicAuth
    });
    match args[1].as_str() {
        "start" => start(&p, &client),
        "finish" => finish(&p, &client, &http, &named, end_session),
        other => fail("usage", format!("unknown command {other}")),
    }
}

fn start(p: &Value, client: &Client) {
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut request = client
        .authorize_url(
            AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .set_pkce_challenge(challenge);
    // `openid` is the crate's, always first.
    for s in text(p, "scope")
        .unwrap_or("openid email profile")
        .split_whitespace()
    {
        if s != "openid" {
            request = request.add_scope(Scope::new(s.into()));
        }
    }
    if let Some(extra) = p.get("extra").and_then(Value::as_object) {
        for (k, v) in extra {
            let v = v.as_str().map(String::from).unwrap_or_else(|| v.to_string());
            request = request.add_extra_param(k.clone(), v);
        }
    }
    let (mut url, state, nonce) = request.url();
    let nonce = if p.get("no_nonce").and_then(Value::as_bool) == Some(true) {
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "nonce")
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        url.query_pairs_mut().clear().extend_pairs(kept);
        Value::Null
    } else {
        nonce.secret().clone().into()
    };
    println!(
        "{}",
        json!({
            "url": url.as_str(),
            "code_verifier": verifier.secret(),
            "state": state.secret(),
            "nonce": nonce,
        })
    );
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn finish(p: &Value, client: &Client, http: &Http, issuer: &str, end_session: Option<EndSessionUrl>) {
    let callback =
        url::Url::parse(text(p, "callback").unwrap_or_default()).unwrap_or_else(|e| fail("callback", e));
    let q: HashMap<String, String> = callback.query_pairs().into_owned().collect();
    if let Some(e) = q.get("error") {
        fail(e, q.get("error_description").unwrap_or(e));
    }
    if q.get("state").map(String::as_str) != text(p, "state") {
        fail("state", "state mismatch");
    }
    if q.get("iss").map(String::as_str) != Some(issuer) {
        fail(
            "iss",
            "the iss response parameter is missing or another issuer's (RFC 9207)",
        );
    }
    let code = q.get("code").unwrap_or_else(|| fail("callback", "no code"));
    let token = client
        .exchange_code(AuthorizationCode::new(code.clone()))
        .unwrap_or_else(|e| fail("token", chain(&e)))
        .set_pkce_verifier(PkceCodeVerifier::new(
            text(p, "code_verifier").unwrap_or_default().into(),
        ))
        .request(http)
        .unwrap_or_else(|e| fail("token", chain(&e)));
    let id_token = token
        .extra_fields()
        .id_token()
        .unwrap_or_else(|| fail("id_token", "no id_token"));
    let alg = match text(p, "id_token_alg").unwrap_or("EdDSA") {
        "RS256" => CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
        "ES256" => CoreJwsSigningAlgorithm::EcdsaP256Sha256,
        _ => CoreJwsSigningAlgorithm::EdDsa,
    };
    let max_age = p.get("max_age").and_then(Value::as_i64);
    let verifier = client
        .id_token_verifier()
        .set_allowed_algs([alg])
        .set_auth_time_verifier_fn(move |auth_time| match (max_age, auth_time) {
            (None, _) => Ok(()),
            (Some(age), Some(t)) if now() - t.timestamp() <= age + 5 => Ok(()),
            _ => Err("auth_time missing or older than max_age".to_string()),
        });
    let expected = text(p, "nonce").map(|n| Nonce::new(n.into()));
    let claims = id_token
        .claims(&verifier, |got: Option<&Nonce>| match (&expected, got) {
            (Some(expected), _) => openidconnect::NonceVerifier::verify(expected, got),
            (None, None) => Ok(()),
            (None, Some(_)) => Err("a nonce in the id_token, none in the request".to_string()),
        })
        .unwrap_or_else(|e| fail("id_token", chain(&e)));
    // at_hash is optional in the code flow (Core §3.1.3.6); checked when present.
    if let Some(expected) = claims.access_token_hash() {
        let signing_alg = id_token
            .signing_alg()
            .unwrap_or_else(|e| fail("at_hash", chain(&e)));
        let key = id_token
            .signing_key(&verifier)
            .unwrap_or_else(|e| fail("at_hash", chain(&e)));
        let actual = AccessTokenHash::from_token(token.access_token(), signing_alg, key)
            .unwrap_or_else(|e| fail("at_hash", chain(&e)));
        if actual != *expected {
            fail("at_hash", "at_hash is not the access token's");
        }
    }
    if let Some(azp) = claims.authorized_party() {
        if **azp != **client.client_id() {
            fail("azp", "azp is another client");
        }
    }
    // Userinfo through the crate, its sub required to be the id_token's.
    let userinfo: UserInfoClaims<Other, CoreGenderClaim> = client
        .user_info(token.access_token().clone(), Some(claims.subject().clone()))
        .unwrap_or_else(|e| fail("userinfo", chain(&e)))
        .request(http)
        .unwrap_or_else(|e| fail("userinfo", chain(&e)));
    let refreshed = token.refresh_token().map(|rt| {
        let r = client
            .exchange_refresh_token(&RefreshToken::new(rt.secret().clone()))
            .unwrap_or_else(|e| fail("refresh", chain(&e)))
            .request(http)
            .unwrap_or_else(|e| fail("refresh", chain(&e)));
        json!({
            "access_token": r.access_token().secret(),
            "refresh_token": r.refresh_token().map(|t| t.secret().clone()),
        })
    });
    let end_session = end_session.unwrap_or_else(|| fail("discovery", "no end_session_endpoint"));
    let mut logout = LogoutRequest::from(end_session).set_id_token_hint(id_token);
    if let Some(uri) = text(p, "post_logout_redirect_uri") {
        logout = logout
            .set_post_logout_redirect_uri(
                PostLogoutRedirectUrl::new(uri.into()).unwrap_or_else(|e| fail("input", e)),
            )
            .set_state(CsrfToken::new("bye".into()));
    }
    let scope = token
        .scopes()
        .map(|s| s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "));
    println!(
        "{}",
        json!({
            "claims": serde_json::to_value(claims).unwrap(),
            "userinfo": serde_json::to_value(userinfo).unwrap(),
            "refreshed": refreshed,
            "end_session": logout.http_get_url().as_str(),
            "access_token": token.access_token().secret(),
            "id_token": id_token.to_string(),
            "scope": scope,
        })
    );
}
