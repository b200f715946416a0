//! Access tokens: RFC 9068 JWTs signed with EdDSA (default) or ES256,
//! signing keys stored in the database (private half sealed), and validation
//! with a cache of verified tokens.
//!
//! - [`Verifier`] (`verifier.rs`): validates; the service and the gateway
//!   both use it, with keys from the database or from a JWKS.
//! - [`Issuer`] (`issuer.rs`): signs, rotates and retires keys; the service
//!   only. It keeps its verifier's keys in step.
//! - `keys.rs`: generating, sealing, opening and publishing keys.
//!
//! Validation of a token seen before costs a SHA-256 of the token, a cache
//! lookup, an expiry comparison and a look into the revocation set. A token
//! not seen before is verified in full: `typ` must be `at+jwt`, the `kid` must
//! be one of ours and the header's `alg` must be that key's algorithm (so
//! `none` and HMAC-with-the-public-key cannot even reach a verifier), then
//! signature, `iss`, `aud`, `exp` and `nbf` with 60 s leeway.

mod issuer;
pub(crate) mod keys;
mod verifier;

pub use crate::store::KeyRecord;
pub use issuer::{visible_email, Issuer};
pub use jsonwebtoken::Algorithm;
pub use keys::can_unseal;
pub use verifier::{Verifier, VerifierSettings};

use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::settings::{non_empty, secs, url_text, ConfigError, Source};

/// Leeway for `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: i64 = 60;

/// The claims of an access token (RFC 9068 §2.2).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AccessClaims {
    pub iss: String,
    pub sub: String,
    pub aud: String,
    pub exp: i64,
    pub iat: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    pub jti: String,
    pub sid: String,
    pub email: String,
    pub client_id: String,
    /// Space-separated scopes: on a client's own token (the
    /// client_credentials grant), and on the tokens of a session an OAuth
    /// client started through the authorization code flow (what the user
    /// granted it); never on a first-party session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// How the user authenticated for this session (RFC 8176 values: `pwd`,
    /// `otp`, `swk`, `mfa`; `email` for a code sent by mail); user
    /// tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amr: Option<Vec<String>>,
    /// `"2"` when that took more than one factor (`mfa` in `amr`), else `"1"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acr: Option<String>,
    /// When the user authenticated (Unix seconds; OpenID Connect Core §2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_time: Option<i64>,
}

/// The claims of an id_token (OpenID Connect Core §2, §5.1): who signed in
/// to which client, when and how, and the claims of the scopes granted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdClaims {
    pub iss: String,
    pub sub: String,
    /// The client.
    pub aud: String,
    pub exp: i64,
    pub iat: i64,
    pub auth_time: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    pub acr: String,
    pub amr: Vec<String>,
    /// The browser session (what RP-initiated and back-channel logout name).
    pub sid: String,
    pub azp: String,
    /// The left half of the access token's digest (Core §3.1.3.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email_verified: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The `at_hash` of `access_token` for an id_token signed with `alg`: the
/// left half of the digest the algorithm uses (SHA-256 for ES256; SHA-512
/// for EdDSA with Ed25519, as the OpenID Foundation settled it), base64url.
pub fn token_hash(alg: jsonwebtoken::Algorithm, access_token: &str) -> String {
    let digest = match alg {
        jsonwebtoken::Algorithm::EdDSA => {
            ring::digest::digest(&ring::digest::SHA512, access_token.as_bytes())
        }
        _ => ring::digest::digest(&ring::digest::SHA256, access_token.as_bytes()),
    };
    let d = digest.as_ref();
    crate::crypto::b64url(&d[..d.len() / 2])
}

/// What an `id_token_hint` says, once its signature checked out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdHint {
    pub sub: String,
    /// The client it was issued to.
    pub aud: String,
    pub sid: Option<String>,
}

/// How and when a user authenticated for a session: every access token of
/// the session carries it (`amr`, `acr`, `auth_time`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authn {
    /// RFC 8176 method values, space-separated (`pwd otp mfa`).
    pub amr: String,
    /// Unix milliseconds.
    pub at_ms: i64,
}

/// Whom an access token of a user's session is for: the claims that vary
/// from session to session.
pub struct Subject<'a> {
    pub user_id: &'a str,
    pub email: &'a str,
    pub session_id: &'a str,
    pub client_id: &'a str,
    pub authn: &'a Authn,
    /// The scope an OAuth client's session was granted.
    pub scope: Option<&'a str>,
    /// The lifetime of the access token when its client has one of its own
    /// (shorter than `access_token_ttl_secs`); `None`: that setting's.
    pub access_ttl: Option<Duration>,
}

/// The `acr` of a multi-factor authentication, and of a single-factor one.
pub const ACR_MFA: &str = "2";
pub const ACR_SINGLE: &str = "1";

impl Authn {
    pub fn new(amr: &str, at_ms: i64) -> Authn {
        Authn {
            amr: amr.to_string(),
            at_ms,
        }
    }

    pub fn is_mfa(&self) -> bool {
        self.amr.split(' ').any(|m| m == "mfa")
    }
}

/// The `sid` of a client's own token: this prefix, the client id and the
/// time the client was added ([`client_sid`]). User sessions are UUIDs, so
/// the two never meet; revoking this `sid` refuses every token the client
/// holds, and a client added again under the same id gets another.
pub const CLIENT_SID_PREFIX: &str = "client:";

/// The `sid` of the own tokens of client `id` added at `created_at` (ms).
pub fn client_sid(id: &str, created_at: i64) -> String {
    format!("{CLIENT_SID_PREFIX}{id}@{created_at}")
}

impl AccessClaims {
    /// Whether the token is a client's own (client_credentials), not a user's.
    pub fn is_client(&self) -> bool {
        self.sid.starts_with(CLIENT_SID_PREFIX) && self.sub == self.client_id
    }

    /// Whether the user passed more than one factor for this session.
    pub fn is_mfa(&self) -> bool {
        self.amr.as_ref().is_some_and(|a| a.iter().any(|m| m == "mfa"))
    }

    /// Whether the token carries `scope` (a client's token only).
    pub fn has_scope(&self, scope: &str) -> bool {
        self.is_client()
            && self
                .scope
                .as_deref()
                .is_some_and(|s| s.split(' ').any(|x| x == scope))
    }
}

/// A token that passed verification, with its claims already serialised for
/// the `/auth/validate` answer.
#[derive(Debug)]
pub struct Verified {
    pub claims: AccessClaims,
    pub json: Bytes,
}

/// Why a token was refused (a metric label; the client only sees INVALID_TOKEN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    Malformed,
    Type,
    UnknownKey,
    Algorithm,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    Revoked,
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::Type => "type",
            Rejection::UnknownKey => "unknown_kid",
            Rejection::Algorithm => "algorithm",
            Rejection::Signature => "signature",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::Issuer => "issuer",
            Rejection::Audience => "audience",
            Rejection::Revoked => "revoked",
        }
    }
}
#[derive(Clone, Debug)]
pub struct TokenSettings {
    pub issuer: String,
    pub audience: String,
    pub algorithm: SigningAlgorithm,
    /// Further algorithms the issuer keeps a key of, for the id_tokens of
    /// clients that ask for one of them (`id_token_signed_response_alg`).
    pub id_token_algorithms: Vec<SigningAlgorithm>,
    pub access_ttl: Duration,
    pub cache_capacity: usize,
    /// How often keys are reloaded from the database (rotation reaches
    /// every instance within this time).
    pub key_refresh_interval: Duration,
}

impl TokenSettings {
    /// Every algorithm the issuer signs with: `signing_algorithm` first.
    pub fn signing_algorithms(&self) -> Vec<SigningAlgorithm> {
        let mut all = vec![self.algorithm];
        for a in &self.id_token_algorithms {
            if !all.contains(a) {
                all.push(*a);
            }
        }
        all
    }

    /// What this service's verifier checks: its own issuer and audience.
    pub fn verifier_settings(&self) -> VerifierSettings {
        VerifierSettings {
            issuer: self.issuer.clone(),
            audiences: vec![self.audience.clone()],
            access_ttl: self.access_ttl,
            cache_capacity: self.cache_capacity,
        }
    }

    /// The service's token settings; the issuer defaults to `default_issuer`
    /// (the listen address as a URL).
    pub fn read(src: &impl Source, default_issuer: String) -> Result<TokenSettings, ConfigError> {
        Ok(TokenSettings {
            issuer: src.get("issuer", default_issuer, url_text)?,
            audience: src.get("audience", "latchkey".to_string(), non_empty)?,
            algorithm: src.get("signing_algorithm", SigningAlgorithm::EdDsa, |s| s.parse())?,
            // RS256 unless told otherwise: OpenID Connect Discovery §3 has
            // every provider list it in id_token_signing_alg_values_supported.
            id_token_algorithms: match src.items("id_token_signing_algorithms")? {
                None => vec![SigningAlgorithm::Rs256],
                Some(_) => src.list("id_token_signing_algorithms", |s| s.parse())?,
            },
            access_ttl: src.get(
                "access_token_ttl_secs",
                Duration::from_secs(900),
                secs(30, 86_400),
            )?,
            cache_capacity: src.get(
                "token_cache_capacity",
                100_000,
                crate::settings::number(1, 10_000_000),
            )?,
            key_refresh_interval: src.get("key_refresh_secs", Duration::from_secs(10), secs(1, 3600))?,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigningAlgorithm {
    EdDsa,
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256 and a 2048-bit key: what OpenID
    /// Connect Discovery §3 names as the one every provider supports, and
    /// the id_token algorithm relying-party libraries assume unless told.
    Rs256,
}

impl SigningAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            SigningAlgorithm::EdDsa => "EdDSA",
            SigningAlgorithm::Es256 => "ES256",
            SigningAlgorithm::Rs256 => "RS256",
        }
    }

    /// The JWS algorithm of this name.
    pub fn jwt_algorithm(self) -> Algorithm {
        match self {
            SigningAlgorithm::EdDsa => Algorithm::EdDSA,
            SigningAlgorithm::Es256 => Algorithm::ES256,
            SigningAlgorithm::Rs256 => Algorithm::RS256,
        }
    }
}

impl FromStr for SigningAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "EdDSA" | "eddsa" | "ed25519" => Ok(SigningAlgorithm::EdDsa),
            "ES256" | "es256" => Ok(SigningAlgorithm::Es256),
            "RS256" | "rs256" => Ok(SigningAlgorithm::Rs256),
            _ => Err("expected EdDSA, ES256 or RS256".into()),
        }
    }
}

/// The algorithms a token may be signed with (discovery).
pub fn signing_algorithms() -> Vec<&'static str> {
    vec!["EdDSA", "ES256", "RS256"]
}

/// Extracts the token from an `Authorization` header value: `Bearer <t>`
/// (scheme case-insensitive) or the non-standard `Bearer: <t>`.
pub fn bearer_token(header: &str) -> Option<&str> {
    let header = header.trim();
    let (scheme, rest) = header.split_once([' ', ':'])?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start_matches(':').trim();
    if token.is_empty() || token.contains(' ') {
        None
    } else {
        Some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn bearer_forms() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER   abc "), Some("abc"));
        assert_eq!(bearer_token("Bearer: abc"), Some("abc"));
        assert_eq!(bearer_token("Bearer:abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer a b"), None);
    }
}
