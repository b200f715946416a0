//! Validation: a key ring, a cache of verified tokens, the revocation set.
//! The service and the gateway verify alike; only where the keys come
//! from differs (the service's database, or its JWKS over HTTP).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use jsonwebtoken::Validation;

use super::keys::{Key, KeyRing, Signer};
use super::{AccessClaims, Rejection, Verified, LEEWAY_SECS};
use crate::cache::{bounded_cache, BoundedCache, Revocations};
use crate::clock::now_ms;
use crate::crypto::sha256;
use crate::store::{KeyRecord, Store};
use crate::telemetry::striped;

/// What a verifier checks besides the signature.
#[derive(Clone, Debug)]
pub struct VerifierSettings {
    /// The expected `iss`.
    pub issuer: String,
    /// Accepted `aud` values (the gateway: every route's; each route then
    /// checks its own).
    pub audiences: Vec<String>,
    /// Tokens live this long: a retired key stays trusted this long (plus
    /// the leeway) after its retirement.
    pub access_ttl: Duration,
    pub cache_capacity: usize,
}

/// Where the verification keys come from.
enum KeySource {
    /// The public halves stored in the service's database; the issuer's
    /// signer is renewed from the same read, after the ring, so that no
    /// token is ever signed with a key this verifier does not know yet.
    Store { store: Store, signer: Arc<Signer> },
    /// A JWKS served over `http://` (the gateway: the service's).
    Jwks(String),
}

pub struct Verifier {
    settings: VerifierSettings,
    source: KeySource,
    ring: RwLock<Arc<KeyRing>>,
    cache: BoundedCache<[u8; 32], Arc<Verified>>,
    revocations: Arc<Revocations>,
    last_reload: Mutex<Instant>,
}

impl Verifier {
    /// A verifier of the tokens this service's keys signed, keeping the
    /// issuer's `signer` in step (loaded by the first [`Verifier::reload`]).
    pub(super) fn from_store(
        settings: VerifierSettings,
        store: Store,
        signer: Arc<Signer>,
        revocations: Arc<Revocations>,
    ) -> Verifier {
        Verifier::new(settings, KeySource::Store { store, signer }, revocations)
    }

    /// A verifier whose keys come from the JWKS at `url` (fetched now, then
    /// on every `reload` and on an unknown `kid`). Only `http://` URLs.
    pub async fn from_jwks(
        settings: VerifierSettings,
        url: String,
        revocations: Arc<Revocations>,
    ) -> anyhow::Result<Verifier> {
        let verifier = Verifier::new(settings, KeySource::Jwks(url), revocations);
        verifier.reload().await?;
        Ok(verifier)
    }

    fn new(settings: VerifierSettings, source: KeySource, revocations: Arc<Revocations>) -> Verifier {
        Verifier {
            cache: bounded_cache(settings.cache_capacity, "tokens"),
            settings,
            source,
            ring: RwLock::new(Arc::new(KeyRing::empty())),
            revocations,
            last_reload: Mutex::new(Instant::now()),
        }
    }

    fn ring(&self) -> Arc<KeyRing> {
        self.ring.read().expect("key ring lock").clone()
    }

    /// The expected `iss` (discovery and introspection show it).
    pub fn issuer(&self) -> &str {
        &self.settings.issuer
    }

    /// How many verification keys are loaded (the gateway's readiness).
    pub fn key_count(&self) -> usize {
        self.ring().by_kid.len()
    }

    /// The published JWKS: every key a token may be signed with.
    pub fn jwks(&self) -> Bytes {
        self.ring().jwks.clone()
    }

    /// How long after retirement a key must stay trusted: tokens it signed
    /// live `access_ttl`, plus the leeway.
    pub fn retention_ms(&self) -> i64 {
        self.settings.access_ttl.as_millis() as i64 + LEEWAY_SECS * 1000
    }

    /// Rebuilds the key ring from its source (and, from the database, the
    /// issuer's signer from the same read). On any error nothing changes.
    pub async fn reload(&self) -> anyhow::Result<()> {
        match &self.source {
            KeySource::Store { store, signer } => {
                let records = store.signing_keys().await?;
                let next = signer.pick(&records);
                self.install(self.public_keys(&records))?;
                signer.install(next);
            }
            KeySource::Jwks(url) => self.install(keys_from_jwks(url).await?)?,
        }
        Ok(())
    }

    fn install(&self, by_kid: HashMap<String, Arc<Key>>) -> anyhow::Result<()> {
        *self.ring.write().expect("key ring lock") = Arc::new(KeyRing::new(by_kid)?);
        *self.last_reload.lock().expect("reload lock") = Instant::now();
        Ok(())
    }

    /// Every stored key not retired longer than the retention, by its public
    /// half (whatever the master secret: tokens verify with public keys).
    fn public_keys(&self, records: &[KeyRecord]) -> HashMap<String, Arc<Key>> {
        let now = now_ms();
        let retention = self.retention_ms();
        let mut by_kid = HashMap::new();
        for rec in records {
            if matches!(rec.retired_at, Some(r) if r + retention < now) {
                continue;
            }
            let Ok(jwk) = serde_json::from_str::<serde_json::Value>(&rec.public_jwk) else {
                continue;
            };
            match Key::public(&rec.kid, jwk, rec.activated_at) {
                Ok(key) => {
                    by_kid.insert(rec.kid.clone(), Arc::new(key));
                }
                Err(e) => tracing::warn!(kid = %rec.kid, error = %e, "ignoring a stored key we cannot use"),
            }
        }
        by_kid
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

    /// Reads an `id_token_hint` (OpenID Connect Core §3.1.2.1, RP-Initiated
    /// Logout §2): one of our id_tokens, by its signature and issuer; an
    /// expired one is taken (a hint names someone, it grants nothing).
    pub fn read_id_token_hint(&self, token: &str) -> Option<super::IdHint> {
        if token.len() > 8192 {
            return None;
        }
        let header = jsonwebtoken::decode_header(token).ok()?;
        if !matches!(header.typ.as_deref(), None | Some("JWT") | Some("jwt")) {
            return None;
        }
        let ring = self.ring();
        let key = ring.by_kid.get(header.kid.as_ref()?)?;
        if header.alg != key.alg {
            return None;
        }
        let mut v = Validation::new(key.alg);
        v.validate_exp = false;
        v.validate_aud = false;
        v.set_issuer(&[&self.settings.issuer]);
        v.set_required_spec_claims(&["iss", "sub", "aud"]);
        #[derive(serde::Deserialize)]
        struct Hint {
            sub: String,
            aud: String,
            sid: Option<String>,
        }
        let data = jsonwebtoken::decode::<Hint>(token, &key.decoding, &v).ok()?;
        Some(super::IdHint {
            sub: data.claims.sub,
            aud: data.claims.aud,
            sid: data.claims.sid,
        })
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
        v.set_audience(&self.settings.audiences);
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

async fn keys_from_jwks(url: &str) -> anyhow::Result<HashMap<String, Arc<Key>>> {
    let body = crate::cache::fetch::http_get(url).await?;
    let doc: serde_json::Value = serde_json::from_slice(&body)?;
    let mut by_kid = HashMap::new();
    let keys = doc["keys"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("{url}: no keys array"))?;
    for jwk in keys {
        let Some(kid) = jwk["kid"].as_str() else { continue };
        match Key::public(kid, jwk.clone(), 0) {
            Ok(key) => {
                by_kid.insert(kid.to_string(), Arc::new(key));
            }
            Err(e) => tracing::warn!(kid, error = %e, "ignoring a JWK we cannot use"),
        }
    }
    Ok(by_kid)
}

/// Counters of the validation hot path, looked up in the registry once and
/// kept in per-thread stripes until a scrape (two shared words written per
/// validation would be the dearest part of a cached one).
struct HotCounters {
    validated_ok: &'static striped::Counter,
    cache_hits: &'static striped::Counter,
    cache_misses: &'static striped::Counter,
}

fn hot_counters() -> &'static HotCounters {
    static C: std::sync::OnceLock<HotCounters> = std::sync::OnceLock::new();
    C.get_or_init(|| HotCounters {
        validated_ok: striped::Counter::register(metrics::counter!(
            "latchkey_tokens_validated_total",
            "result" => "ok"
        )),
        cache_hits: striped::Counter::register(metrics::counter!("latchkey_token_cache_hits_total")),
        cache_misses: striped::Counter::register(metrics::counter!("latchkey_token_cache_misses_total")),
    })
}
