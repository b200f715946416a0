//! Access tokens: RFC 9068 JWTs signed with EdDSA (default) or ES256,
//! signing keys stored in the database (private half sealed), and validation
//! with a cache of verified tokens.
//!
//! Validation of a token seen before costs a SHA-256 of the token, a cache
//! lookup, an expiry comparison and a look into the revocation set. A token
//! not seen before is verified in full: `typ` must be `at+jwt`, the `kid` must
//! be one of ours and the header's `alg` must be that key's algorithm (so
//! `none` and HMAC-with-the-public-key cannot even reach a verifier), then
//! signature, `iss`, `aud`, `exp` and `nbf` with 60 s leeway.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::cache::{bounded_cache, BoundedCache};
use bytes::Bytes;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde::{Deserialize, Serialize};

use crate::cache::Revocations;
use crate::clock::now_ms;
use crate::crypto::{b64url, sha256, Sealer};
use crate::settings::{non_empty, secs, url_text, ConfigError, Source};
use crate::store::{KeyRecord, Store};

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

struct SigningKey {
    kid: String,
    alg: Algorithm,
    /// `None` for keys known only from a JWKS (the gateway verifies, never signs).
    encoding: Option<EncodingKey>,
    decoding: DecodingKey,
    jwk: serde_json::Value,
    activated_at: i64,
}

struct KeyRing {
    signer: Option<Arc<SigningKey>>,
    by_kid: HashMap<String, Arc<SigningKey>>,
    jwks: Bytes,
}

#[derive(Clone, Debug)]
pub struct TokenSettings {
    pub issuer: String,
    pub audience: String,
    pub algorithm: SigningAlgorithm,
    pub access_ttl: Duration,
    pub cache_capacity: usize,
    /// How often keys are reloaded from the database (rotation reaches
    /// every instance within this time).
    pub key_refresh_interval: Duration,
}

impl TokenSettings {
    /// The service's token settings; the issuer defaults to `default_issuer`
    /// (the listen address as a URL).
    pub fn read(src: &impl Source, default_issuer: String) -> Result<TokenSettings, ConfigError> {
        Ok(TokenSettings {
            issuer: src.get("issuer", default_issuer, url_text)?,
            audience: src.get("audience", "latchkey".to_string(), non_empty)?,
            algorithm: src.get("signing_algorithm", SigningAlgorithm::EdDsa, |s| s.parse())?,
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
}

impl SigningAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            SigningAlgorithm::EdDsa => "EdDSA",
            SigningAlgorithm::Es256 => "ES256",
        }
    }
}

impl FromStr for SigningAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "EdDSA" | "eddsa" | "ed25519" => Ok(SigningAlgorithm::EdDsa),
            "ES256" | "es256" => Ok(SigningAlgorithm::Es256),
            _ => Err("expected EdDSA or ES256".into()),
        }
    }
}

/// Where keys come from: our database (the service signs and verifies), or
/// another service's JWKS (the gateway only verifies).
enum KeySource {
    // Boxed: a `Sealer` is large, and the JWKS variant is a URL.
    Database { store: Store, sealer: Box<Sealer> },
    Jwks { url: String },
}

pub struct Tokens {
    settings: TokenSettings,
    source: KeySource,
    ring: RwLock<Arc<KeyRing>>,
    cache: BoundedCache<[u8; 32], Arc<Verified>>,
    revocations: Arc<Revocations>,
    last_reload: Mutex<Instant>,
    /// Accepted `aud` values: `settings.audience`, or the gateway's list.
    audiences: Vec<String>,
}

impl Tokens {
    /// Loads the keys, creating the first one if there is none.
    pub async fn load(
        settings: TokenSettings,
        store: Store,
        sealer: Sealer,
        revocations: Arc<Revocations>,
    ) -> anyhow::Result<Tokens> {
        let source = KeySource::Database {
            store,
            sealer: Box::new(sealer),
        };
        let tokens = Tokens::new(settings, source, revocations);
        tokens.reload().await?;
        if tokens.ring().signer.is_none() {
            tokens.rotate().await?;
        }
        Ok(tokens)
    }

    /// A verifier whose keys come from the JWKS at `url` (fetched now, then on
    /// every `reload` and on an unknown `kid`). Only `http://` URLs.
    pub async fn from_jwks(
        settings: TokenSettings,
        url: String,
        revocations: Arc<Revocations>,
    ) -> anyhow::Result<Tokens> {
        let tokens = Tokens::new(settings, KeySource::Jwks { url }, revocations);
        tokens.reload().await?;
        Ok(tokens)
    }

    fn new(settings: TokenSettings, source: KeySource, revocations: Arc<Revocations>) -> Tokens {
        Tokens {
            audiences: vec![settings.audience.clone()],
            cache: bounded_cache(settings.cache_capacity, "tokens"),
            settings,
            source,
            ring: RwLock::new(Arc::new(KeyRing {
                signer: None,
                by_kid: HashMap::new(),
                jwks: Bytes::from_static(b"{\"keys\":[]}"),
            })),
            revocations,
            last_reload: Mutex::new(Instant::now()),
        }
    }

    fn ring(&self) -> Arc<KeyRing> {
        self.ring.read().expect("key ring lock").clone()
    }

    /// Accepts tokens whose `aud` is any of `audiences` (the gateway: the
    /// union of its routes' lists; each route then checks its own).
    pub fn accept_audiences(&mut self, audiences: Vec<String>) {
        if !audiences.is_empty() {
            self.audiences = audiences;
        }
    }

    /// How many verification keys are loaded (the gateway's readiness).
    pub fn key_count(&self) -> usize {
        self.ring().by_kid.len()
    }

    pub fn issuer(&self) -> &str {
        &self.settings.issuer
    }

    pub fn access_ttl(&self) -> Duration {
        self.settings.access_ttl
    }

    /// How long after retirement a key must stay published: tokens it signed
    /// live `access_ttl`, plus the leeway.
    fn retention_ms(&self) -> i64 {
        self.settings.access_ttl.as_millis() as i64 + LEEWAY_SECS * 1000
    }

    /// Makes a new key the signer (`latchkey keys rotate`); others retire.
    pub async fn rotate(&self) -> anyhow::Result<String> {
        let KeySource::Database { store, sealer } = &self.source else {
            anyhow::bail!("keys from a JWKS cannot be rotated here");
        };
        let rec = generate_key(self.settings.algorithm, sealer)?;
        store.add_signing_key(&rec).await?;
        self.reload().await?;
        Ok(rec.kid)
    }

    /// Rebuilds the key ring from the database (every instance does this
    /// periodically, so a rotation reaches all of them).
    pub async fn reload(&self) -> anyhow::Result<()> {
        let (store, sealer) = match &self.source {
            KeySource::Database { store, sealer } => (store, sealer),
            KeySource::Jwks { url } => return self.reload_from_jwks(url).await,
        };
        let now = now_ms();
        let retention = self.retention_ms();
        let records = store.signing_keys().await?;
        let mut by_kid = HashMap::new();
        let mut signer: Option<Arc<SigningKey>> = None;
        for rec in records {
            if matches!(rec.retired_at, Some(r) if r + retention < now) {
                continue;
            }
            let key = match open_key(&rec, sealer) {
                Ok(k) => Arc::new(k),
                Err(e) => {
                    // Its public half still verifies the tokens it signed.
                    tracing::warn!(kid = %rec.kid, error = %e, "signing key cannot sign here (another LATCHKEY_SECRET_KEY?); verifying with its public key");
                    let jwk: serde_json::Value = match serde_json::from_str(&rec.public_jwk) {
                        Ok(j) => j,
                        Err(_) => continue,
                    };
                    let Ok((alg, decoding)) = decoding_key(&jwk) else {
                        continue;
                    };
                    let key = Arc::new(SigningKey {
                        kid: rec.kid.clone(),
                        alg,
                        encoding: None,
                        decoding,
                        jwk,
                        activated_at: rec.activated_at,
                    });
                    by_kid.insert(rec.kid.clone(), key);
                    continue;
                }
            };
            let newer = signer.as_ref().is_none_or(|s| key.activated_at > s.activated_at);
            if rec.retired_at.is_none() && newer {
                signer = Some(key.clone());
            }
            by_kid.insert(rec.kid.clone(), key);
        }
        if let Some(s) = &signer {
            metrics::gauge!("latchkey_signing_key_age_seconds").set(((now - s.activated_at) / 1000) as f64);
        }
        self.install(signer, by_kid)
    }

    fn install(
        &self,
        signer: Option<Arc<SigningKey>>,
        by_kid: HashMap<String, Arc<SigningKey>>,
    ) -> anyhow::Result<()> {
        let mut keys: Vec<&Arc<SigningKey>> = by_kid.values().collect();
        keys.sort_by(|a, b| b.activated_at.cmp(&a.activated_at).then(a.kid.cmp(&b.kid)));
        let jwks = serde_json::json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() });
        let ring = KeyRing {
            signer,
            by_kid,
            jwks: Bytes::from(serde_json::to_vec(&jwks)?),
        };
        *self.ring.write().expect("key ring lock") = Arc::new(ring);
        *self.last_reload.lock().expect("reload lock") = Instant::now();
        Ok(())
    }

    async fn reload_from_jwks(&self, url: &str) -> anyhow::Result<()> {
        let body = crate::cache::fetch::http_get(url).await?;
        let doc: serde_json::Value = serde_json::from_slice(&body)?;
        let mut by_kid = HashMap::new();
        let keys = doc["keys"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("{url}: no keys array"))?;
        for jwk in keys {
            let Some(kid) = jwk["kid"].as_str() else { continue };
            match decoding_key(jwk) {
                Ok((alg, decoding)) => {
                    let key = SigningKey {
                        kid: kid.to_string(),
                        alg,
                        encoding: None,
                        decoding,
                        jwk: jwk.clone(),
                        activated_at: 0,
                    };
                    by_kid.insert(kid.to_string(), Arc::new(key));
                }
                Err(e) => tracing::warn!(kid, error = %e, "ignoring a JWK we cannot use"),
            }
        }
        self.install(None, by_kid)
    }

    /// Deletes keys whose tokens have all expired.
    pub async fn purge_retired(&self) -> anyhow::Result<u64> {
        match &self.source {
            KeySource::Database { store, .. } => {
                Ok(store.purge_signing_keys(now_ms() - self.retention_ms()).await?)
            }
            KeySource::Jwks { .. } => Ok(0),
        }
    }

    pub fn jwks(&self) -> Bytes {
        self.ring().jwks.clone()
    }

    pub fn signing_algorithms(&self) -> Vec<&'static str> {
        vec!["EdDSA", "ES256"]
    }

    /// Signs an access token for a session.
    pub fn issue(
        &self,
        user_id: &str,
        email: &str,
        session_id: &str,
        client_id: &str,
    ) -> anyhow::Result<String> {
        let ring = self.ring();
        let key = ring
            .signer
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no signing key"))?;
        let now = now_ms() / 1000;
        let claims = AccessClaims {
            iss: self.settings.issuer.clone(),
            sub: user_id.to_string(),
            aud: self.settings.audience.clone(),
            exp: now + self.settings.access_ttl.as_secs() as i64,
            iat: now,
            nbf: None,
            jti: uuid::Uuid::new_v4().to_string(),
            sid: session_id.to_string(),
            email: email.to_string(),
            client_id: client_id.to_string(),
        };
        let mut header = Header::new(key.alg);
        header.typ = Some("at+jwt".into());
        header.kid = Some(key.kid.clone());
        let encoding = key
            .encoding
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this key cannot sign"))?;
        let token = jsonwebtoken::encode(&header, &claims, encoding)?;
        metrics::counter!("latchkey_tokens_issued_total").increment(1);
        Ok(token)
    }

    /// Validates a bearer token (cache first, then full verification).
    pub async fn validate(&self, token: &str) -> Result<Arc<Verified>, Rejection> {
        let result = self.validate_inner(token).await;
        match &result {
            Ok(_) => hot_counters().validated_ok.increment(1),
            Err(r) => {
                metrics::counter!("latchkey_tokens_validated_total", "result" => r.as_str()).increment(1)
            }
        }
        result
    }

    async fn validate_inner(&self, token: &str) -> Result<Arc<Verified>, Rejection> {
        if token.len() > 8192 {
            return Err(Rejection::Malformed);
        }
        let digest = sha256(token.as_bytes());
        let now = now_ms() / 1000;
        if let Some(v) = self.cache.get(&digest) {
            hot_counters().cache_hits.increment(1);
            if now >= v.claims.exp + LEEWAY_SECS {
                self.cache.remove(&digest);
                return Err(Rejection::Expired);
            }
            if self.revocations.is_revoked(&v.claims.sid) {
                return Err(Rejection::Revoked);
            }
            return Ok(v);
        }
        hot_counters().cache_misses.increment(1);
        let verified = match self.verify(token) {
            Err(Rejection::UnknownKey) if self.may_reload() => {
                // A key rotated on another instance: look again, at most every few seconds.
                if let Err(e) = self.reload().await {
                    tracing::warn!(error = %e, "reloading signing keys failed");
                }
                self.verify(token)?
            }
            other => other?,
        };
        if self.revocations.is_revoked(&verified.claims.sid) {
            return Err(Rejection::Revoked);
        }
        let v = Arc::new(verified);
        self.cache.insert(digest, v.clone());
        Ok(v)
    }

    fn may_reload(&self) -> bool {
        let mut last = self.last_reload.lock().expect("reload lock");
        if last.elapsed() >= Duration::from_secs(2) {
            *last = Instant::now();
            true
        } else {
            false
        }
    }

    /// Full verification, no cache and no revocation check (benchmarks use it).
    pub fn verify(&self, token: &str) -> Result<Verified, Rejection> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Rejection::Malformed)?;
        match header.typ.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("at+jwt") | Some("application/at+jwt") => {}
            _ => return Err(Rejection::Type),
        }
        let ring = self.ring();
        let key = header
            .kid
            .as_ref()
            .and_then(|kid| ring.by_kid.get(kid))
            .ok_or(Rejection::UnknownKey)?;
        if header.alg != key.alg {
            return Err(Rejection::Algorithm);
        }
        let mut v = Validation::new(key.alg);
        v.leeway = LEEWAY_SECS as u64;
        v.validate_nbf = true;
        v.set_issuer(&[&self.settings.issuer]);
        v.set_audience(&self.audiences);
        v.set_required_spec_claims(&["exp", "iat", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<AccessClaims>(token, &key.decoding, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind::*;
            match e.kind() {
                InvalidSignature | Crypto(_) => Rejection::Signature,
                ExpiredSignature => Rejection::Expired,
                ImmatureSignature => Rejection::NotYetValid,
                InvalidIssuer => Rejection::Issuer,
                InvalidAudience => Rejection::Audience,
                InvalidAlgorithm | MissingAlgorithm | InvalidAlgorithmName => Rejection::Algorithm,
                _ => Rejection::Malformed,
            }
        })?;
        if data.claims.iat > now_ms() / 1000 + LEEWAY_SECS {
            return Err(Rejection::NotYetValid);
        }
        let json = Bytes::from(serde_json::to_vec(&data.claims).map_err(|_| Rejection::Malformed)?);
        Ok(Verified {
            claims: data.claims,
            json,
        })
    }

    /// Number of cached verified tokens (a metric).
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }
}

/// Counters of the validation hot path, looked up in the registry once.
struct HotCounters {
    validated_ok: metrics::Counter,
    cache_hits: metrics::Counter,
    cache_misses: metrics::Counter,
}

fn hot_counters() -> &'static HotCounters {
    static C: std::sync::OnceLock<HotCounters> = std::sync::OnceLock::new();
    C.get_or_init(|| HotCounters {
        validated_ok: metrics::counter!("latchkey_tokens_validated_total", "result" => "ok"),
        cache_hits: metrics::counter!("latchkey_token_cache_hits_total"),
        cache_misses: metrics::counter!("latchkey_token_cache_misses_total"),
    })
}

/// Generates a key pair; the private half is sealed for storage.
fn generate_key(alg: SigningAlgorithm, sealer: &Sealer) -> anyhow::Result<KeyRecord> {
    let rng = SystemRandom::new();
    let (pkcs8, jwk) = match alg {
        SigningAlgorithm::EdDsa => {
            let doc =
                Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| anyhow::anyhow!("key generation failed"))?;
            let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| anyhow::anyhow!("bad key"))?;
            let x = b64url(pair.public_key().as_ref());
            (
                doc.as_ref().to_vec(),
                serde_json::json!({"crv": "Ed25519", "kty": "OKP", "x": x}),
            )
        }
        SigningAlgorithm::Es256 => {
            let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .map_err(|_| anyhow::anyhow!("key generation failed"))?;
            let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref(), &rng)
                .map_err(|_| anyhow::anyhow!("bad key"))?;
            let point = pair.public_key().as_ref(); // 0x04 || X || Y
            let (x, y) = (b64url(&point[1..33]), b64url(&point[33..65]));
            (
                doc.as_ref().to_vec(),
                serde_json::json!({"crv": "P-256", "kty": "EC", "x": x, "y": y}),
            )
        }
    };
    // RFC 7638 thumbprint: the required members in lexicographic order, no spaces.
    let kid = b64url(&sha256(serde_json::to_string(&jwk)?.as_bytes()));
    let mut jwk = jwk;
    jwk["kid"] = kid.clone().into();
    jwk["alg"] = alg.as_str().into();
    jwk["use"] = "sig".into();
    let now = now_ms();
    Ok(KeyRecord {
        private_key: sealer.seal(&pkcs8, kid.as_bytes()),
        kid,
        alg: alg.as_str().to_string(),
        public_jwk: serde_json::to_string(&jwk)?,
        created_at: now,
        activated_at: now,
        retired_at: None,
    })
}

/// Whether `sealer` (a master secret's) opens the private half of `rec`.
pub fn can_unseal(rec: &KeyRecord, sealer: &Sealer) -> bool {
    sealer.open(&rec.private_key, rec.kid.as_bytes()).is_some()
}

fn open_key(rec: &KeyRecord, sealer: &Sealer) -> anyhow::Result<SigningKey> {
    let pkcs8 = sealer
        .open(&rec.private_key, rec.kid.as_bytes())
        .ok_or_else(|| anyhow::anyhow!("cannot unseal private key"))?;
    let jwk: serde_json::Value = serde_json::from_str(&rec.public_jwk)?;
    let (alg, decoding) = decoding_key(&jwk)?;
    let encoding = match alg {
        Algorithm::EdDSA => EncodingKey::from_ed_der(&pkcs8),
        _ => EncodingKey::from_ec_der(&pkcs8),
    };
    Ok(SigningKey {
        kid: rec.kid.clone(),
        alg,
        encoding: Some(encoding),
        decoding,
        jwk,
        activated_at: rec.activated_at,
    })
}

/// The verification key of a public JWK, pinned to the algorithm its type allows:
/// OKP/Ed25519 is EdDSA, EC/P-256 is ES256; anything else is refused.
fn decoding_key(jwk: &serde_json::Value) -> anyhow::Result<(Algorithm, DecodingKey)> {
    let field = |name: &str| -> anyhow::Result<&str> {
        jwk[name]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("JWK lacks {name}"))
    };
    match (field("kty")?, field("crv")?) {
        ("OKP", "Ed25519") => Ok((Algorithm::EdDSA, DecodingKey::from_ed_components(field("x")?)?)),
        ("EC", "P-256") => Ok((
            Algorithm::ES256,
            DecodingKey::from_ec_components(field("x")?, field("y")?)?,
        )),
        (kty, crv) => anyhow::bail!("unsupported key type {kty}/{crv}"),
    }
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
