//! An upstream provider's id_token, judged as OpenID Connect Core §3.1.3.7
//! tells a relying party to: signed by a key of the upstream's JWKS with
//! that key's algorithm (never `none`, never an algorithm the token picks
//! for a key of another kind), issued by the upstream (`iss` exactly), for
//! this client (`aud` contains it; with other audiences too, `azp` names
//! it), not expired, and answering this sign-in's `nonce`. What it asserts
//! beside (issuer, subject) is read, never trusted further than the
//! operator's policy for the upstream (`rule.rs`).
//!
//! [`check_claims`] is a pure function of the claims and `now`; [`verify`]
//! adds the signature.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::domain::tokens::keys::Key;

/// Clock difference allowed with the upstream, in seconds.
pub const LEEWAY_SECS: i64 = 60;

/// What this sign-in expects of the id_token.
pub struct Expected<'a> {
    pub issuer: &'a str,
    pub client_id: &'a str,
    pub nonce: &'a str,
    /// Unix seconds.
    pub now: i64,
    /// The claims that carry the address and the name.
    pub mapping: Mapping<'a>,
}

/// Which claims carry the account's address and name (per upstream;
/// `email_verified` says whether the address claim's value is verified).
#[derive(Clone, Copy, Debug)]
pub struct Mapping<'a> {
    pub email: &'a str,
    pub name: &'a str,
}

impl Mapping<'static> {
    /// OpenID Connect's standard claims (Core §5.1).
    pub const STANDARD: Mapping<'static> = Mapping {
        email: "email",
        name: "name",
    };
}

/// What the upstream asserted about the person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub subject: String,
    /// Lower-cased as latchkey stores addresses; `None`: none, or not an
    /// address.
    pub email: Option<String>,
    /// `email_verified: true` (absent counts as false).
    pub email_verified: bool,
    /// Its `amr` values (RFC 8176), as asserted.
    pub amr: Vec<String>,
    /// When the person signed in there (`auth_time`, Unix seconds).
    pub auth_time: Option<i64>,
    /// Their name, as asserted (given to an account made for them).
    pub name: Option<String>,
}

/// Why an id_token is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Not a JWS, or claims that are no JSON object.
    Malformed,
    /// No key of the JWKS has its `kid` (or it names none and the JWKS has
    /// several).
    UnknownKey,
    /// The signature does not verify, or the algorithm is not the key's.
    Signature,
    Issuer,
    Audience,
    /// Several audiences and `azp` is not this client.
    AuthorizedParty,
    Expired,
    /// `iat` missing or far in the future.
    IssuedAt,
    Nonce,
    NoSubject,
    /// A logout token without the back-channel logout event or a `jti`,
    /// or with a `nonce` (which would make it pass for an id_token).
    NotLogout,
    /// A logout token taken before (its `jti`).
    Replayed,
}

/// The claims of an id_token whose signature checked out, against what
/// the sign-in expects.
pub fn check_claims(c: &Value, e: &Expected) -> Result<Identity, Invalid> {
    let c = c.as_object().ok_or(Invalid::Malformed)?;
    if c.get("iss").and_then(Value::as_str) != Some(e.issuer) {
        return Err(Invalid::Issuer);
    }
    let audiences: Vec<&str> = match c.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !audiences.contains(&e.client_id) {
        return Err(Invalid::Audience);
    }
    let azp = c.get("azp").and_then(Value::as_str);
    if (audiences.len() > 1 || azp.is_some()) && azp != Some(e.client_id) {
        return Err(Invalid::AuthorizedParty);
    }
    match c.get("exp").and_then(Value::as_i64) {
        Some(exp) if exp.saturating_add(LEEWAY_SECS) > e.now => {}
        _ => return Err(Invalid::Expired),
    }
    match c.get("iat").and_then(Value::as_i64) {
        Some(iat) if iat <= e.now.saturating_add(LEEWAY_SECS) => {}
        _ => return Err(Invalid::IssuedAt),
    }
    let nonce = c.get("nonce").and_then(Value::as_str).unwrap_or_default();
    if !crate::crypto::ct_eq(nonce.as_bytes(), e.nonce.as_bytes()) {
        return Err(Invalid::Nonce);
    }
    let subject = c.get("sub").and_then(Value::as_str).unwrap_or_default();
    if subject.is_empty() || subject.len() > 255 {
        return Err(Invalid::NoSubject);
    }
    let (email, email_verified) = email_of(c, &e.mapping);
    Ok(Identity {
        name: name_of(c, &e.mapping),
        subject: subject.to_string(),
        email,
        email_verified,
        amr: c
            .get("amr")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default(),
        auth_time: c.get("auth_time").and_then(Value::as_i64),
    })
}

/// The address a set of claims asserts (an id_token's or userinfo's), and
/// whether it says it is verified.
pub fn email_of(c: &serde_json::Map<String, Value>, m: &Mapping) -> (Option<String>, bool) {
    let email = c
        .get(m.email)
        .and_then(Value::as_str)
        .and_then(|e| crate::domain::input::Email::parse("email", e).ok())
        .map(|e| e.as_str().to_string());
    // `email_verified` speaks for the `email` claim only (Core §5.1): an
    // address from another claim (a username an upstream's user may set to
    // anything) is never taken as verified.
    let verified =
        email.is_some() && m.email == "email" && c.get("email_verified") == Some(&Value::Bool(true));
    (email, verified)
}

/// The name a set of claims asserts, if it is one an account may have
/// (at most 200 characters, none invisible or direction-changing).
pub fn name_of(c: &serde_json::Map<String, Value>, m: &Mapping) -> Option<String> {
    let raw = c.get(m.name).and_then(Value::as_str)?;
    crate::domain::input::parse_name("name", Some(raw)).ok().flatten()
}

/// An id_token, its signature checked with a key of `keys` (by `kid`),
/// then its claims ([`check_claims`]).
pub(crate) fn verify(
    token: &str,
    keys: &HashMap<String, Arc<Key>>,
    e: &Expected,
) -> Result<Identity, Invalid> {
    check_claims(&signed_claims(token, keys)?, e)
}

/// The claims of a JWS signed by a key of `keys` (by `kid`) with that
/// key's own algorithm; nothing of them checked yet.
pub(crate) fn signed_claims(token: &str, keys: &HashMap<String, Arc<Key>>) -> Result<Value, Invalid> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| Invalid::Malformed)?;
    let key = match &header.kid {
        Some(kid) => keys.get(kid),
        None if keys.len() == 1 => keys.values().next(),
        None => None,
    }
    .ok_or(Invalid::UnknownKey)?;
    if header.alg != key.alg {
        return Err(Invalid::Signature);
    }
    let mut v = jsonwebtoken::Validation::new(key.alg);
    v.required_spec_claims.clear();
    v.validate_exp = false;
    v.validate_aud = false;
    let data = jsonwebtoken::decode::<Value>(token, &key.decoding, &v).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind::*;
        match e.kind() {
            InvalidSignature | InvalidAlgorithm | InvalidAlgorithmName | InvalidKeyFormat => {
                Invalid::Signature
            }
            _ => Invalid::Malformed,
        }
    })?;
    Ok(data.claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn expected() -> Expected<'static> {
        Expected {
            issuer: "https://up.example",
            client_id: "latchkey",
            nonce: "n-1",
            now: NOW,
            mapping: Mapping::STANDARD,
        }
    }

    fn claims() -> Value {
        json!({
            "iss": "https://up.example", "aud": "latchkey", "sub": "u-1",
            "exp": NOW + 300, "iat": NOW, "nonce": "n-1",
            "email": "Ann@Example.com", "email_verified": true, "amr": ["pwd", "mfa"],
        })
    }

    fn with(change: Value) -> Value {
        let mut c = claims();
        for (k, v) in change.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    }

    #[test]
    fn a_right_id_token_asserts_its_subject_and_its_address_lower_cased() {
        let a = check_claims(&claims(), &expected()).unwrap();
        assert_eq!(a.subject, "u-1");
        assert_eq!(a.email.as_deref(), Some("ann@example.com"));
        assert!(a.email_verified);
        assert_eq!(a.amr, ["pwd", "mfa"]);
    }

    #[test]
    fn each_broken_claim_is_refused_for_its_own_reason() {
        let cases = [
            (json!({"iss": "https://up.example/"}), Invalid::Issuer),
            (json!({"iss": null}), Invalid::Issuer),
            (json!({"aud": "another"}), Invalid::Audience),
            (json!({"aud": ["another", "yet another"]}), Invalid::Audience),
            (json!({"aud": ["latchkey", "another"]}), Invalid::AuthorizedParty),
            (
                json!({"aud": ["latchkey", "another"], "azp": "another"}),
                Invalid::AuthorizedParty,
            ),
            (json!({"azp": "another"}), Invalid::AuthorizedParty),
            (json!({"exp": NOW - LEEWAY_SECS}), Invalid::Expired),
            (json!({"exp": null}), Invalid::Expired),
            (json!({"iat": NOW + LEEWAY_SECS + 1}), Invalid::IssuedAt),
            (json!({"iat": null}), Invalid::IssuedAt),
            (json!({"nonce": "n-2"}), Invalid::Nonce),
            (json!({"nonce": null}), Invalid::Nonce),
            (json!({"sub": ""}), Invalid::NoSubject),
            (json!({"sub": null}), Invalid::NoSubject),
        ];
        for (change, why) in cases {
            assert_eq!(
                check_claims(&with(change.clone()), &expected()),
                Err(why),
                "{change}"
            );
        }
        assert_eq!(
            check_claims(&json!("a string"), &expected()),
            Err(Invalid::Malformed)
        );
    }

    #[test]
    fn several_audiences_pass_when_azp_names_this_client() {
        let c = with(json!({"aud": ["latchkey", "another"], "azp": "latchkey"}));
        assert!(check_claims(&c, &expected()).is_ok());
    }

    #[test]
    fn an_address_is_verified_only_by_email_verified_true() {
        for (verified, says) in [
            (json!(false), false),
            (json!("true"), false),
            (Value::Null, false),
        ] {
            let a = check_claims(&with(json!({"email_verified": verified})), &expected()).unwrap();
            assert_eq!(a.email_verified, says);
        }
        let a = check_claims(&with(json!({"email": "not an address"})), &expected()).unwrap();
        assert_eq!(
            (a.email, a.email_verified),
            (None, false),
            "no address, so nothing verified"
        );
    }

    #[test]
    fn a_signature_is_checked_with_the_key_its_kid_names_and_that_keys_algorithm() {
        use jsonwebtoken::{encode, EncodingKey, Header};
        let (kid, pkcs8, jwk) = crate::domain::tokens::keys::test_ed25519_key();
        let keys: HashMap<String, Arc<Key>> = [(kid.clone(), Arc::new(Key::public(&kid, jwk, 0).unwrap()))]
            .into_iter()
            .collect();
        let mut header = Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        let signed = encode(&header, &claims(), &EncodingKey::from_ed_der(&pkcs8)).unwrap();
        assert_eq!(verify(&signed, &keys, &expected()).unwrap().subject, "u-1");

        let (body, sig) = signed.rsplit_once('.').unwrap();
        let flipped = format!(
            "{body}.{}{}",
            if sig.starts_with('A') { "B" } else { "A" },
            &sig[1..]
        );
        assert_eq!(verify(&flipped, &keys, &expected()), Err(Invalid::Signature));

        header.kid = Some("another".into());
        let unknown = encode(&header, &claims(), &EncodingKey::from_ed_der(&pkcs8)).unwrap();
        assert_eq!(verify(&unknown, &keys, &expected()), Err(Invalid::UnknownKey));

        // An HMAC "signed" with the public key's bytes, naming the key.
        let mut hs = Header::new(jsonwebtoken::Algorithm::HS256);
        hs.kid = Some(kid);
        let confused = encode(&hs, &claims(), &EncodingKey::from_secret(b"anything")).unwrap();
        assert_eq!(verify(&confused, &keys, &expected()), Err(Invalid::Signature));

        let unsigned = format!(
            "{}.{}.",
            crate::crypto::b64url(br#"{"alg":"none"}"#),
            body.split('.').nth(1).unwrap()
        );
        assert_eq!(verify(&unsigned, &keys, &expected()), Err(Invalid::Malformed));
    }

    #[test]
    fn the_address_and_the_name_come_from_the_claims_the_upstream_is_mapped_to() {
        let c = with(json!({"upn": "Ann@Corp.example", "display": "Ann Corp", "name": "\u{202e}evil"}));
        let e = Expected {
            mapping: Mapping {
                email: "upn",
                name: "display",
            },
            ..expected()
        };
        let a = check_claims(&c, &e).unwrap();
        assert_eq!(a.email.as_deref(), Some("ann@corp.example"));
        assert!(!a.email_verified, "email_verified speaks for `email` only");
        assert_eq!(a.name.as_deref(), Some("Ann Corp"));
        let a = check_claims(&c, &expected()).unwrap();
        assert_eq!(
            a.name, None,
            "a name with a direction-changing character is no name"
        );
    }
}
