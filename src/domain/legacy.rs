//! Password hashes made by other systems, accepted on import and verified at
//! login until the first successful login rehashes the password to the
//! configured argon2id (`Accounts::upgrade_hash_later`).
//!
//! ```text
//!  import:  text --parse--> Legacy (format known, parameters within limits)
//!                             | refused: a per-line error, nothing stored
//!  login:   stored hash --argon2?--> argon2 verify (hashing.rs)
//!                       \--else----> Legacy::parse --> verify (constant time)
//!           right password --> rehash to argon2id, after the answer
//! ```
//!
//! Formats, as their makers write them:
//! - bcrypt: `$2a$`, `$2b$`, `$2y$` (Modular Crypt Format, cost 4-16);
//! - PBKDF2, PHC strings: `$pbkdf2-sha256$i=N,l=L$salt$hash` and
//!   `$pbkdf2-sha512$...` (salt and hash in unpadded standard base64), and
//!   passlib's `$pbkdf2-sha256$N$salt$hash` (its "adapted" base64, `.` for
//!   `+`);
//! - Django: `pbkdf2_sha256$N$salt$hash` (the salt is text, the hash padded
//!   base64);
//! - Keycloak's export (`credentialData` with `hashIterations` and
//!   `algorithm`, `secretData` with `value` and `salt`, base64): turned into
//!   the PHC form by [`from_keycloak`] at import;
//! - scrypt, PHC: `$scrypt$ln=L,r=R,p=P$salt$hash` (unpadded base64);
//! - argon2 (`$argon2i$`, `$argon2d$`, `$argon2id$`): verified by
//!   `hashing.rs` like the service's own.
//!
//! Parameters are capped so that an imported hash cannot make one login
//! cost more than a few seconds of a core.

use std::num::NonZeroU32;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;

use crate::crypto::ct_eq;

/// The most PBKDF2 iterations accepted (OWASP asks 600,000 for SHA-256).
pub const MAX_PBKDF2_ITERATIONS: u32 = 5_000_000;
/// The highest bcrypt cost accepted.
pub const MAX_BCRYPT_COST: u32 = 16;
/// scrypt: the largest `ln` (log2 N), `r` and `p` accepted.
pub const MAX_SCRYPT_LN: u8 = 20;
pub const MAX_SCRYPT_R: u32 = 32;
pub const MAX_SCRYPT_P: u32 = 16;
/// argon2: the most memory (KiB), passes and lanes accepted.
pub const MAX_ARGON2_M: u32 = 262_144;
pub const MAX_ARGON2_T: u32 = 20;
pub const MAX_ARGON2_P: u32 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prf {
    Sha256,
    Sha512,
}

/// A hash of another system, parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum Legacy {
    Bcrypt(String),
    Pbkdf2 {
        prf: Prf,
        iterations: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    Scrypt {
        ln: u8,
        r: u32,
        p: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    /// A PHC argon2 string, verified by the argon2 crate.
    Argon2(String),
}

impl Legacy {
    /// Parses and checks a hash; the error says why it is refused.
    pub fn parse(text: &str) -> Result<Legacy, String> {
        if text.len() > 1024 || !text.is_ascii() {
            return Err("not a password hash (too long, or not ASCII)".into());
        }
        if let Some(rest) = text.strip_prefix("pbkdf2_sha256$") {
            return django(rest);
        }
        let parts: Vec<&str> = text.split('$').collect();
        match parts.get(1).copied() {
            Some("2a" | "2b" | "2y") => bcrypt_hash(text, &parts),
            Some("pbkdf2-sha256") => pbkdf2_phc(Prf::Sha256, &parts),
            Some("pbkdf2-sha512") => pbkdf2_phc(Prf::Sha512, &parts),
            Some("scrypt") => scrypt_phc(&parts),
            Some("argon2i" | "argon2d" | "argon2id") => argon2_phc(text),
            _ => Err(
                "unknown hash format: expected bcrypt ($2a$, $2b$, $2y$), PBKDF2 ($pbkdf2-sha256$, \
                 $pbkdf2-sha512$, pbkdf2_sha256$), scrypt ($scrypt$) or argon2 ($argon2i$, $argon2id$)"
                    .into(),
            ),
        }
    }

    /// Whether `password` is the one this hash was made from (in constant
    /// time with respect to the hash). Costs what the hash's parameters say.
    pub fn verify(&self, password: &str) -> bool {
        match self {
            Legacy::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Legacy::Pbkdf2 {
                prf,
                iterations,
                salt,
                hash,
            } => {
                let alg = match prf {
                    Prf::Sha256 => ring::pbkdf2::PBKDF2_HMAC_SHA256,
                    Prf::Sha512 => ring::pbkdf2::PBKDF2_HMAC_SHA512,
                };
                let Some(n) = NonZeroU32::new(*iterations) else {
                    return false;
                };
                ring::pbkdf2::verify(alg, n, salt, password.as_bytes(), hash).is_ok()
            }
            Legacy::Scrypt { ln, r, p, salt, hash } => {
                let Ok(params) = scrypt::Params::new(*ln, *r, *p, hash.len()) else {
                    return false;
                };
                let mut out = vec![0u8; hash.len()];
                scrypt::scrypt(password.as_bytes(), salt, &params, &mut out).is_ok() && ct_eq(&out, hash)
            }
            // hashing.rs verifies argon2 strings itself; never reached.
            Legacy::Argon2(_) => false,
        }
    }
}

fn number<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 10 {
        return Err(format!("{what}: not a number"));
    }
    s.parse().map_err(|_| format!("{what}: out of range"))
}

fn b64(s: &str, what: &str) -> Result<Vec<u8>, String> {
    STANDARD_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| format!("{what}: not base64"))
}

fn bcrypt_hash(text: &str, parts: &[&str]) -> Result<Legacy, String> {
    if parts.len() != 4 || !parts[0].is_empty() || parts[3].len() != 53 {
        return Err("bcrypt: expected $2b$COST$ and 53 characters of salt and hash".into());
    }
    let cost: u32 = number(parts[2], "bcrypt cost")?;
    if !(4..=MAX_BCRYPT_COST).contains(&cost) {
        return Err(format!("bcrypt cost {cost}: expected 4 to {MAX_BCRYPT_COST}"));
    }
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'/';
    if !parts[3].bytes().all(alphabet) {
        return Err("bcrypt: salt and hash must be bcrypt base64".into());
    }
    Ok(Legacy::Bcrypt(text.to_string()))
}

fn pbkdf2_checked(prf: Prf, iterations: u32, salt: Vec<u8>, hash: Vec<u8>) -> Result<Legacy, String> {
    if !(1..=MAX_PBKDF2_ITERATIONS).contains(&iterations) {
        return Err(format!(
            "PBKDF2 iterations {iterations}: expected 1 to {MAX_PBKDF2_ITERATIONS}"
        ));
    }
    if salt.is_empty() || salt.len() > 256 || !(16..=64).contains(&hash.len()) {
        return Err("PBKDF2: a salt of 1 to 256 bytes and a hash of 16 to 64 bytes expected".into());
    }
    Ok(Legacy::Pbkdf2 {
        prf,
        iterations,
        salt,
        hash,
    })
}

/// `$pbkdf2-sha256$i=N[,l=L]$salt$hash` (PHC) or `$pbkdf2-sha256$N$salt$hash` (passlib).
fn pbkdf2_phc(prf: Prf, parts: &[&str]) -> Result<Legacy, String> {
    if parts.len() != 5 || !parts[0].is_empty() {
        return Err("PBKDF2: expected $pbkdf2-sha256$PARAMS$SALT$HASH".into());
    }
    if parts[2].bytes().all(|b| b.is_ascii_digit()) {
        // passlib: its adapted base64 uses '.' where base64 has '+'.
        let ab64 = |s: &str, what| b64(&s.replace('.', "+"), what);
        let iterations = number(parts[2], "PBKDF2 iterations")?;
        return pbkdf2_checked(prf, iterations, ab64(parts[3], "salt")?, ab64(parts[4], "hash")?);
    }
    let mut iterations = None;
    for kv in parts[2].split(',') {
        match kv.split_once('=') {
            Some(("i", v)) => iterations = Some(number(v, "PBKDF2 iterations")?),
            Some(("l", _)) => {} // the hash's length, which the hash itself gives
            _ => return Err(format!("PBKDF2: unknown parameter {kv:?}")),
        }
    }
    let iterations = iterations.ok_or("PBKDF2: the iteration count i= is missing")?;
    pbkdf2_checked(prf, iterations, b64(parts[3], "salt")?, b64(parts[4], "hash")?)
}

/// Django's `pbkdf2_sha256$N$salt$hash` (the prefix already taken off).
fn django(rest: &str) -> Result<Legacy, String> {
    let parts: Vec<&str> = rest.split('$').collect();
    if parts.len() != 3 {
        return Err("Django PBKDF2: expected pbkdf2_sha256$ITERATIONS$SALT$HASH".into());
    }
    let iterations = number(parts[0], "PBKDF2 iterations")?;
    let hash = STANDARD
        .decode(parts[2])
        .map_err(|_| "hash: not base64".to_string())?;
    pbkdf2_checked(Prf::Sha256, iterations, parts[1].as_bytes().to_vec(), hash)
}

/// `$scrypt$ln=L,r=R,p=P$salt$hash`.
fn scrypt_phc(parts: &[&str]) -> Result<Legacy, String> {
    if parts.len() != 5 || !parts[0].is_empty() {
        return Err("scrypt: expected $scrypt$ln=L,r=R,p=P$SALT$HASH".into());
    }
    let (mut ln, mut r, mut p) = (None, None, None);
    for kv in parts[2].split(',') {
        match kv.split_once('=') {
            Some(("ln", v)) => ln = Some(number::<u8>(v, "scrypt ln")?),
            Some(("r", v)) => r = Some(number::<u32>(v, "scrypt r")?),
            Some(("p", v)) => p = Some(number::<u32>(v, "scrypt p")?),
            _ => return Err(format!("scrypt: unknown parameter {kv:?}")),
        }
    }
    let (Some(ln), Some(r), Some(p)) = (ln, r, p) else {
        return Err("scrypt: ln, r and p are all needed".into());
    };
    if !(1..=MAX_SCRYPT_LN).contains(&ln)
        || !(1..=MAX_SCRYPT_R).contains(&r)
        || !(1..=MAX_SCRYPT_P).contains(&p)
    {
        return Err(format!(
            "scrypt parameters beyond ln<={MAX_SCRYPT_LN}, r<={MAX_SCRYPT_R}, p<={MAX_SCRYPT_P}"
        ));
    }
    let (salt, hash) = (b64(parts[3], "salt")?, b64(parts[4], "hash")?);
    if salt.is_empty() || salt.len() > 256 || !(16..=64).contains(&hash.len()) {
        return Err("scrypt: a salt of 1 to 256 bytes and a hash of 16 to 64 bytes expected".into());
    }
    if scrypt::Params::new(ln, r, p, hash.len()).is_err() {
        return Err("scrypt: parameters out of range".into());
    }
    Ok(Legacy::Scrypt { ln, r, p, salt, hash })
}

fn argon2_phc(text: &str) -> Result<Legacy, String> {
    let h = argon2::PasswordHash::new(text).map_err(|e| format!("argon2: {e}"))?;
    let p = argon2::Params::try_from(&h).map_err(|e| format!("argon2: {e}"))?;
    if p.m_cost() > MAX_ARGON2_M || p.t_cost() > MAX_ARGON2_T || p.p_cost() > MAX_ARGON2_P {
        return Err(format!(
            "argon2 parameters beyond m<={MAX_ARGON2_M}, t<={MAX_ARGON2_T}, p<={MAX_ARGON2_P}"
        ));
    }
    if h.hash.is_none() {
        return Err("argon2: no hash".into());
    }
    Ok(Legacy::Argon2(text.to_string()))
}

/// A Keycloak credential as its realm export writes it (`credentialData`
/// and `secretData`, each an object or a string holding one) in the PHC
/// form [`Legacy::parse`] reads: `$pbkdf2-sha256$i=N$salt$hash`.
pub fn from_keycloak(
    credential_data: &serde_json::Value,
    secret_data: &serde_json::Value,
) -> Result<String, String> {
    let object = |v: &serde_json::Value| -> Result<serde_json::Value, String> {
        match v {
            serde_json::Value::String(s) => serde_json::from_str(s).map_err(|_| "not JSON".to_string()),
            serde_json::Value::Object(_) => Ok(v.clone()),
            _ => Err("expected an object".into()),
        }
    };
    let cred = object(credential_data).map_err(|e| format!("credentialData: {e}"))?;
    let secret = object(secret_data).map_err(|e| format!("secretData: {e}"))?;
    let alg = match cred["algorithm"].as_str() {
        Some("pbkdf2-sha256") => "pbkdf2-sha256",
        Some("pbkdf2-sha512") => "pbkdf2-sha512",
        Some(other) => {
            return Err(format!(
                "Keycloak algorithm {other:?}: only pbkdf2-sha256 and pbkdf2-sha512"
            ))
        }
        None => return Err("credentialData.algorithm is missing".into()),
    };
    let iterations = cred["hashIterations"]
        .as_u64()
        .ok_or("credentialData.hashIterations is missing")?;
    let salt = STANDARD
        .decode(secret["salt"].as_str().ok_or("secretData.salt is missing")?)
        .map_err(|_| "secretData.salt: not base64")?;
    let hash = STANDARD
        .decode(secret["value"].as_str().ok_or("secretData.value is missing")?)
        .map_err(|_| "secretData.value: not base64")?;
    let phc = format!(
        "${alg}$i={iterations}${}${}",
        STANDARD_NO_PAD.encode(salt),
        STANDARD_NO_PAD.encode(hash)
    );
    Legacy::parse(&phc)?;
    Ok(phc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_limits_hold() {
        let bcrypt = "$2b$04$EGdrhbKUv8Oc9vGiXX0HQOxSg445d458Muh7DAHskb6QbtCvdxcie";
        assert!(matches!(Legacy::parse(bcrypt), Ok(Legacy::Bcrypt(_))));
        assert!(
            Legacy::parse(&bcrypt.replace("$04$", "$31$")).is_err(),
            "cost cap"
        );
        let phc = format!(
            "$pbkdf2-sha256$i=1000,l=32${}${}",
            STANDARD_NO_PAD.encode(b"salty salt"),
            STANDARD_NO_PAD.encode([7u8; 32])
        );
        assert!(matches!(
            Legacy::parse(&phc),
            Ok(Legacy::Pbkdf2 { iterations: 1000, .. })
        ));
        assert!(
            Legacy::parse(&phc.replace("i=1000", "i=999999999")).is_err(),
            "iteration cap"
        );
        assert!(Legacy::parse(&phc.replace("i=1000", "x=1")).is_err());
        let django = format!("pbkdf2_sha256$1000$salt${}", STANDARD.encode([1u8; 32]));
        assert!(matches!(
            Legacy::parse(&django),
            Ok(Legacy::Pbkdf2 { prf: Prf::Sha256, .. })
        ));
        let scrypt = format!(
            "$scrypt$ln=4,r=8,p=1${}${}",
            STANDARD_NO_PAD.encode(b"salt"),
            STANDARD_NO_PAD.encode([2u8; 32])
        );
        assert!(matches!(Legacy::parse(&scrypt), Ok(Legacy::Scrypt { ln: 4, .. })));
        assert!(
            Legacy::parse(&scrypt.replace("ln=4", "ln=30")).is_err(),
            "memory cap"
        );
        for bad in [
            "",
            "plain text",
            "$md5$x",
            "$2b$10$short",
            "pbkdf2_sha256$x$y",
            "$scrypt$ln=4$a$b",
        ] {
            assert!(Legacy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pbkdf2_and_scrypt_verify_what_they_made() {
        // Made here with ring and scrypt, so only the round trip is tested;
        // tests/it/import.rs checks vectors of other implementations.
        let mut out = [0u8; 32];
        let n = NonZeroU32::new(1000).unwrap();
        ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA256, n, b"salt", b"pw", &mut out);
        let phc = format!(
            "$pbkdf2-sha256$i=1000${}${}",
            STANDARD_NO_PAD.encode(b"salt"),
            STANDARD_NO_PAD.encode(out)
        );
        let h = Legacy::parse(&phc).unwrap();
        assert!(h.verify("pw"));
        assert!(!h.verify("pw2"));
        let params = scrypt::Params::new(4, 8, 1, 32).unwrap();
        scrypt::scrypt(b"pw", b"salt", &params, &mut out).unwrap();
        let phc = format!(
            "$scrypt$ln=4,r=8,p=1${}${}",
            STANDARD_NO_PAD.encode(b"salt"),
            STANDARD_NO_PAD.encode(out)
        );
        let h = Legacy::parse(&phc).unwrap();
        assert!(h.verify("pw"));
        assert!(!h.verify("pW"));
    }
}
