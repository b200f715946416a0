//! Keys: generated with ring, stored with the private half sealed, read
//! back as JWKs. A [`Key`] verifies; one that came with its private half
//! also signs. A [`KeyRing`] is the set a verifier uses, with its JWKS.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use jsonwebtoken::{Algorithm, DecodingKey};
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};

use super::SigningAlgorithm;
use crate::clock::now_ms;
use crate::crypto::{b64url, sha256, Sealer};
use crate::store::KeyRecord;

pub(crate) struct Key {
    pub kid: String,
    pub alg: Algorithm,
    /// Only for a key whose private half we hold (the issuer's signer).
    pub(super) signing: Option<SigningKey>,
    pub decoding: DecodingKey,
    pub jwk: serde_json::Value,
    /// 0 for keys known only from a JWKS.
    pub activated_at: i64,
}

impl Key {
    /// The public half of a JWK (`kid` from the JWK unless given).
    pub fn public(kid: &str, jwk: serde_json::Value, activated_at: i64) -> anyhow::Result<Key> {
        let (alg, decoding) = decoding_key(&jwk)?;
        Ok(Key {
            kid: kid.to_string(),
            alg,
            signing: None,
            decoding,
            jwk,
            activated_at,
        })
    }
}

/// A private key, parsed once when it is opened (parsing a PKCS#8 document
/// derives and checks the public key: most of a signature's cost if done
/// per token), with the JWS header of its tokens already encoded.
pub(super) struct SigningKey {
    pair: PrivatePair,
    /// `base64url({"typ":"at+jwt","alg":...,"kid":...})`.
    header: String,
    /// The header of the id_tokens it signs (`typ` `JWT`).
    id_header: String,
    /// The header of the logout tokens it signs (`typ` `logout+jwt`).
    logout_header: String,
}

enum PrivatePair {
    Ed25519(Ed25519KeyPair),
    Es256(EcdsaKeyPair, SystemRandom),
    Rs256(RsaKeyPair, SystemRandom),
}

impl SigningKey {
    fn open(alg: Algorithm, kid: &str, pkcs8: &[u8]) -> anyhow::Result<SigningKey> {
        let bad = |_| anyhow::anyhow!("the private key of {kid} does not parse");
        let (pair, alg_name) = match alg {
            Algorithm::EdDSA => (
                PrivatePair::Ed25519(Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8).map_err(bad)?),
                "EdDSA",
            ),
            Algorithm::ES256 => {
                let rng = SystemRandom::new();
                let pair =
                    EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng).map_err(bad)?;
                (PrivatePair::Es256(pair, rng), "ES256")
            }
            Algorithm::RS256 => (
                PrivatePair::Rs256(RsaKeyPair::from_pkcs8(pkcs8).map_err(bad)?, SystemRandom::new()),
                "RS256",
            ),
            other => anyhow::bail!("{other:?} keys do not sign here"),
        };
        let header = serde_json::json!({"typ": "at+jwt", "alg": alg_name, "kid": kid});
        let id_header = serde_json::json!({"typ": "JWT", "alg": alg_name, "kid": kid});
        let logout_header = serde_json::json!({"typ": "logout+jwt", "alg": alg_name, "kid": kid});
        Ok(SigningKey {
            pair,
            header: b64url(&serde_json::to_vec(&header)?),
            id_header: b64url(&serde_json::to_vec(&id_header)?),
            logout_header: b64url(&serde_json::to_vec(&logout_header)?),
        })
    }

    /// A compact JWS (RFC 7515) of `claims`: header, payload and signature
    /// in base64url; ES256 signatures in the fixed `r || s` form JWS wants.
    pub fn sign<T: serde::Serialize>(&self, claims: &T) -> anyhow::Result<String> {
        self.sign_under(&self.header, claims)
    }

    /// An id_token (OpenID Connect Core §2): the same signature under the
    /// header `typ` `JWT`.
    pub fn sign_id_token<T: serde::Serialize>(&self, claims: &T) -> anyhow::Result<String> {
        self.sign_under(&self.id_header, claims)
    }

    /// A logout token (Back-Channel Logout 1.0 §2.4): the same signature
    /// under the header `typ` `logout+jwt` (§4.1 recommends the explicit
    /// type, so that no other JWT of this issuer passes for one).
    pub fn sign_logout_token<T: serde::Serialize>(&self, claims: &T) -> anyhow::Result<String> {
        self.sign_under(&self.logout_header, claims)
    }

    fn sign_under<T: serde::Serialize>(&self, header: &str, claims: &T) -> anyhow::Result<String> {
        let payload = b64url(&serde_json::to_vec(claims)?);
        let mut token = String::with_capacity(header.len() + payload.len() + 90);
        token.push_str(header);
        token.push('.');
        token.push_str(&payload);
        let signature = match &self.pair {
            PrivatePair::Ed25519(pair) => pair.sign(token.as_bytes()).as_ref().to_vec(),
            PrivatePair::Es256(pair, rng) => pair
                .sign(rng, token.as_bytes())
                .map_err(|_| anyhow::anyhow!("ES256 signing failed"))?
                .as_ref()
                .to_vec(),
            PrivatePair::Rs256(pair, rng) => {
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, rng, token.as_bytes(), &mut sig)
                    .map_err(|_| anyhow::anyhow!("RS256 signing failed"))?;
                sig
            }
        };
        token.push('.');
        token.push_str(&b64url(&signature));
        Ok(token)
    }
}

/// The keys a verifier accepts, by `kid`, and the JWKS that publishes them.
pub(super) struct KeyRing {
    pub by_kid: HashMap<String, Arc<Key>>,
    pub jwks: Bytes,
}

impl KeyRing {
    pub fn empty() -> KeyRing {
        KeyRing {
            by_kid: HashMap::new(),
            jwks: Bytes::from_static(b"{\"keys\":[]}"),
        }
    }

    /// The ring of `keys`; the JWKS lists the newest first.
    pub fn new(by_kid: HashMap<String, Arc<Key>>) -> anyhow::Result<KeyRing> {
        let mut keys: Vec<&Arc<Key>> = by_kid.values().collect();
        keys.sort_by(|a, b| b.activated_at.cmp(&a.activated_at).then(a.kid.cmp(&b.kid)));
        let jwks = serde_json::json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() });
        Ok(KeyRing {
            jwks: Bytes::from(serde_json::to_vec(&jwks)?),
            by_kid,
        })
    }
}

/// Generates a key pair; the private half is sealed for storage.
pub(super) fn generate_key(alg: SigningAlgorithm, sealer: &Sealer) -> anyhow::Result<KeyRecord> {
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
        SigningAlgorithm::Rs256 => {
            use rsa::pkcs8::EncodePrivateKey;
            use rsa::traits::PublicKeyParts;
            // The rsa crate only generates the key (ring cannot); ring signs.
            let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
                .map_err(|e| anyhow::anyhow!("key generation failed: {e}"))?;
            let doc = key
                .to_pkcs8_der()
                .map_err(|e| anyhow::anyhow!("key encoding failed: {e}"))?;
            let (n, e) = (b64url(&key.n().to_bytes_be()), b64url(&key.e().to_bytes_be()));
            (
                doc.as_bytes().to_vec(),
                serde_json::json!({"e": e, "kty": "RSA", "n": n}),
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

pub(super) fn open_key(rec: &KeyRecord, sealer: &Sealer) -> anyhow::Result<Key> {
    let pkcs8 = sealer
        .open(&rec.private_key, rec.kid.as_bytes())
        .ok_or_else(|| anyhow::anyhow!("cannot unseal private key"))?;
    let jwk: serde_json::Value = serde_json::from_str(&rec.public_jwk)?;
    let (alg, decoding) = decoding_key(&jwk)?;
    let signing = SigningKey::open(alg, &rec.kid, &pkcs8)?;
    Ok(Key {
        kid: rec.kid.clone(),
        alg,
        signing: Some(signing),
        decoding,
        jwk,
        activated_at: rec.activated_at,
    })
}

/// The verification key of a public JWK, pinned to the algorithm its type allows:
/// OKP/Ed25519 is EdDSA, EC/P-256 is ES256, RSA is RS256; anything else is refused.
pub(super) fn decoding_key(jwk: &serde_json::Value) -> anyhow::Result<(Algorithm, DecodingKey)> {
    let field = |name: &str| -> anyhow::Result<&str> {
        jwk[name]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("JWK lacks {name}"))
    };
    match (field("kty")?, jwk["crv"].as_str().unwrap_or("")) {
        ("OKP", "Ed25519") => Ok((Algorithm::EdDSA, DecodingKey::from_ed_components(field("x")?)?)),
        ("EC", "P-256") => Ok((
            Algorithm::ES256,
            DecodingKey::from_ec_components(field("x")?, field("y")?)?,
        )),
        // RS256 only (not PS256, not an RSA key under an HMAC): 2048 bits at least.
        ("RSA", "") => {
            let n = field("n")?;
            if n.len() < 342 {
                anyhow::bail!("RSA keys of fewer than 2048 bits are refused");
            }
            Ok((
                Algorithm::RS256,
                DecodingKey::from_rsa_components(n, field("e")?)?,
            ))
        }
        (kty, crv) => anyhow::bail!("unsupported key type {kty}/{crv}"),
    }
}

/// The keys the issuer signs with, one per algorithm it signs with (the
/// first is `signing_algorithm`'s, which signs every access token; the
/// others sign the id_tokens of clients that ask for them), renewed by the
/// verifier's reload from the same read of the database as its ring.
pub(super) struct Signer {
    // Boxed: a `Sealer` is large.
    sealer: Box<Sealer>,
    algorithms: Vec<SigningAlgorithm>,
    current: RwLock<Vec<Arc<Key>>>,
    /// The algorithms with an active key in the database, whether or not
    /// this master secret unseals it.
    present: RwLock<Vec<SigningAlgorithm>>,
}

/// What a read of the keys gave the signer: the keys it can sign with, and
/// the algorithms the database has an active key of.
pub(super) struct Picked {
    keys: Vec<Arc<Key>>,
    present: Vec<SigningAlgorithm>,
}

impl Signer {
    /// The sealer of the private halves: new keys are sealed with it.
    pub(super) fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// A signer for `algorithms` (the main one first).
    pub(super) fn new(sealer: Sealer, algorithms: Vec<SigningAlgorithm>) -> Signer {
        Signer {
            sealer: Box::new(sealer),
            algorithms,
            current: RwLock::new(Vec::new()),
            present: RwLock::new(Vec::new()),
        }
    }

    pub(super) fn algorithms(&self) -> &[SigningAlgorithm] {
        &self.algorithms
    }

    /// For each algorithm, the newest active key of it whose private half
    /// this master secret unseals.
    pub(super) fn pick(&self, records: &[KeyRecord]) -> Picked {
        let mut picked: Vec<Arc<Key>> = Vec::new();
        let present = self
            .algorithms
            .iter()
            .copied()
            .filter(|a| {
                records
                    .iter()
                    .any(|r| r.alg == a.as_str() && r.retired_at.is_none())
            })
            .collect();
        for alg in &self.algorithms {
            let mut newest: Option<Arc<Key>> = None;
            for rec in records {
                if rec.alg != alg.as_str()
                    || rec.retired_at.is_some()
                    || newest
                        .as_ref()
                        .is_some_and(|s| rec.activated_at <= s.activated_at)
                {
                    continue;
                }
                match open_key(rec, &self.sealer) {
                    Ok(key) => newest = Some(Arc::new(key)),
                    // Its public half still verifies the tokens it signed.
                    Err(e) => tracing::warn!(kid = %rec.kid, error = %e,
                        "signing key cannot sign here (another LATCHKEY_SECRET_KEY?); verifying with its public key"),
                }
            }
            picked.extend(newest);
        }
        Picked {
            keys: picked,
            present,
        }
    }

    /// Signs with what `picked` found from now on. An algorithm it found
    /// no key of keeps the key it had (another instance's rotation retired
    /// it for an algorithm that instance no longer signs with): signing
    /// goes on until [`Issuer::refresh`](super::Issuer::refresh) makes a
    /// new one, within a reload period.
    pub(super) fn install(&self, picked: Picked) {
        let Picked { mut keys, present } = picked;
        let mut current = self.current.write().expect("signer lock");
        for old in current.iter() {
            if !keys.iter().any(|k| k.alg == old.alg) {
                keys.push(old.clone());
            }
        }
        let main = self.algorithms[0].jwt_algorithm();
        if let Some(s) = keys.iter().find(|k| k.alg == main) {
            metrics::gauge!("latchkey_signing_key_age_seconds")
                .set(((now_ms() - s.activated_at) / 1000) as f64);
        }
        *current = keys;
        *self.present.write().expect("signer lock") = present;
    }

    /// The key of the main algorithm (`None`: none yet).
    pub(super) fn current(&self) -> Option<Arc<Key>> {
        self.for_algorithm(self.algorithms[0])
    }

    /// The current key of `alg`, if this signer signs with it.
    pub(super) fn for_algorithm(&self, alg: SigningAlgorithm) -> Option<Arc<Key>> {
        let want = alg.jwt_algorithm();
        self.current
            .read()
            .expect("signer lock")
            .iter()
            .find(|k| k.alg == want)
            .cloned()
    }

    /// The algorithms the database has no active key of (to make one
    /// for). An active key this master secret cannot unseal counts: making
    /// another would retire it, and instances of two secrets would retire
    /// each other's keys at every reload (the service refuses to start on
    /// a secret that is not the installation's).
    pub(super) fn missing(&self) -> Vec<SigningAlgorithm> {
        let present = self.present.read().expect("signer lock");
        self.algorithms
            .iter()
            .copied()
            .filter(|a| !present.contains(a))
            .collect()
    }
}

/// An Ed25519 key for tests elsewhere in the crate: (kid, PKCS#8, public JWK).
#[cfg(test)]
pub(crate) fn test_ed25519_key() -> (String, Vec<u8>, serde_json::Value) {
    let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap();
    let x = b64url(pair.public_key().as_ref());
    let jwk = serde_json::json!({"crv": "Ed25519", "kty": "OKP", "x": x, "kid": "k-1"});
    ("k-1".to_string(), doc.as_ref().to_vec(), jwk)
}
