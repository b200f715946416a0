//! Password hashes made by other systems, accepted on import and verified at
//! login until the first successful login rehashes the password to the
//! configured argon2id (`passwords::Passwords::upgrade_hash_later`).
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
//! bcrypt hashes hold only the first 72 bytes of a password; a longer
//! password never matches one (as a newer bcrypt would refuse it), so that
//! a password sharing the first 72 bytes is not taken for it.
//!
//! **Every hash is held to a budget** ([`BUDGET`]: 64 MiB and about one
//! second of a core per verification), estimated from its parameters
//! ([`Legacy::cost`]): an import refuses a hash over it with a message that
//! names the row, and a stored one over it never verifies. Each login
//! attempt of an imported account, wrong passwords included, pays that
//! cost on the shared hashing pool; without a budget one account with
//! `$scrypt$ln=18,r=32,p=4$...` (1 GiB, over a minute of a core) made two
//! parallel wrong-password logins hold every hashing thread, and every
//! other login and sign-up answer `503`. The pool also gives such hashes a
//! lane of their own (`hashing.rs`).

use std::num::NonZeroU32;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;

use crate::crypto::ct_eq;

/// What verifying a hash once costs: the memory it holds, and the time of
/// one core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub memory_bytes: u64,
    pub nanos: u64,
}

impl Cost {
    pub fn within(self, budget: Cost) -> bool {
        self.memory_bytes <= budget.memory_bytes && self.nanos <= budget.nanos
    }
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = self.memory_bytes as f64 / f64::from(1u32 << 20);
        write!(f, "{mib:.0} MiB and {:.2} s of a core", self.nanos as f64 / 1e9)
    }
}

/// The most one verification of an imported hash may cost (the issue's
/// figure: 64 MiB, 1 s). It admits what the peers recommend today: bcrypt
/// cost 14 (OWASP: 10 or more), PBKDF2-HMAC-SHA256 at 5 million iterations
/// (OWASP: 600,000), scrypt with N=2^16 and r=8 (Django's default is 2^14),
/// argon2id with 64 MiB and 3 passes (Bitwarden's). Not OWASP's largest
/// scrypt choice, N=2^17 with r=8, which holds 128 MiB: such accounts reset
/// their password (docs/import.md).
pub const BUDGET: Cost = Cost {
    // 64 MiB, and 64 KiB for the small buffers beside an algorithm's array.
    memory_bytes: (64 << 20) + (64 << 10),
    nanos: 1_000_000_000,
};

/// Nanoseconds per unit of work of each format, measured with this build's
/// implementations (release build, one core of a 2-vCPU AMD EPYC VM,
/// 2026-11-26) and rounded up: bcrypt's 2^10 rounds took 53 ms, PBKDF2's
/// iteration 0.154 us with HMAC-SHA256 and 0.380 us with HMAC-SHA512,
/// scrypt N=2^14 r=8 p=1 31 ms, argon2id 64 MiB with one pass 53 ms.
mod speed {
    /// bcrypt, per round (2^cost rounds).
    pub const BCRYPT_ROUND: u64 = 52_000;
    /// PBKDF2, per iteration and output block.
    pub const PBKDF2_SHA256: u64 = 160;
    pub const PBKDF2_SHA512: u64 = 390;
    /// scrypt, per unit of N * r * p (its mixing), and per unit of r * p
    /// (the PBKDF2 passes before and after it over the 128 r p bytes of its
    /// blocks: 1.4 us measured with a 256-byte salt and a 64-byte hash).
    pub const SCRYPT: u64 = 240;
    pub const SCRYPT_PBKDF2: u64 = 1_500;
    /// argon2, per KiB of memory and pass.
    pub const ARGON2: u64 = 850;
}

/// bcrypt hashes only the first 72 bytes of a password.
pub const BCRYPT_MAX_PASSWORD: usize = 72;

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
    /// A PHC argon2 string (verified by `hashing.rs`, with the argon2
    /// crate): its memory (KiB, all lanes together) and passes.
    Argon2 {
        m: u32,
        t: u32,
    },
}

impl Legacy {
    /// Parses and checks a hash, held to [`BUDGET`]; the error says why it
    /// is refused.
    pub fn parse(text: &str) -> Result<Legacy, String> {
        let hash = Legacy::parse_any(text)?;
        let cost = hash.cost();
        if !cost.within(BUDGET) {
            return Err(format!(
                "verifying this hash would take about {cost}; an imported hash may take at most {BUDGET} \
                 (the account can be imported with another hash, or reset its password)"
            ));
        }
        Ok(hash)
    }

    /// What verifying this hash costs, estimated from its parameters.
    pub fn cost(&self) -> Cost {
        let mul = |a: u64, b: u64| a.saturating_mul(b);
        match self {
            Legacy::Bcrypt(h) => {
                let cost: u32 = h.get(4..6).and_then(|c| c.parse().ok()).unwrap_or(31);
                Cost {
                    memory_bytes: 4 << 10,
                    nanos: mul(1u64 << cost.min(31), speed::BCRYPT_ROUND),
                }
            }
            Legacy::Pbkdf2 {
                prf,
                iterations,
                hash,
                ..
            } => {
                let (block, per) = match prf {
                    Prf::Sha256 => (32, speed::PBKDF2_SHA256),
                    Prf::Sha512 => (64, speed::PBKDF2_SHA512),
                };
                let blocks = hash.len().div_ceil(block) as u64;
                Cost {
                    memory_bytes: 4 << 10,
                    nanos: mul(mul(u64::from(*iterations), blocks), per),
                }
            }
            // Its memory: the array of N blocks of 128 r bytes, the p blocks
            // it mixes, and one more.
            Legacy::Scrypt { ln, r, p, .. } => {
                let (n, r, p) = (1u64 << (*ln).min(63), u64::from(*r), u64::from(*p));
                Cost {
                    memory_bytes: mul(mul(128, r), n.saturating_add(p).saturating_add(1)),
                    nanos: mul(mul(mul(n, r), p), speed::SCRYPT)
                        .saturating_add(mul(mul(r, p), speed::SCRYPT_PBKDF2)),
                }
            }
            // Lanes share the memory and, without threads, the time.
            Legacy::Argon2 { m, t, .. } => Cost {
                memory_bytes: mul(u64::from(*m), 1024),
                nanos: mul(mul(u64::from(*m), u64::from(*t)), speed::ARGON2),
            },
        }
    }

    /// Parses and checks a hash's form, whatever its cost.
    fn parse_any(text: &str) -> Result<Legacy, String> {
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
            // A longer password than bcrypt holds is never this one: it
            // would match any password sharing its first 72 bytes.
            Legacy::Bcrypt(_) if password.len() > BCRYPT_MAX_PASSWORD => false,
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
            Legacy::Argon2 { .. } => false,
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
    if parts[2].len() != 2 {
        return Err("bcrypt: the cost is two digits".into());
    }
    let cost: u32 = number(parts[2], "bcrypt cost")?;
    if !(4..=31).contains(&cost) {
        return Err(format!("bcrypt cost {cost}: expected 4 to 31"));
    }
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'/';
    if !parts[3].bytes().all(alphabet) {
        return Err("bcrypt: salt and hash must be bcrypt base64".into());
    }
    Ok(Legacy::Bcrypt(text.to_string()))
}

fn pbkdf2_checked(prf: Prf, iterations: u32, salt: Vec<u8>, hash: Vec<u8>) -> Result<Legacy, String> {
    if iterations == 0 {
        return Err("PBKDF2 iterations 0: expected at least 1".into());
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
    if !(1..=63).contains(&ln) || r == 0 || p == 0 {
        return Err("scrypt: ln must be 1 to 63, r and p at least 1".into());
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
    if h.hash.is_none() {
        return Err("argon2: no hash".into());
    }
    Ok(Legacy::Argon2 {
        m: p.m_cost(),
        t: p.t_cost(),
    })
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
            Legacy::parse(&bcrypt.replace("$04$", "$15$")).is_err(),
            "over the budget"
        );
        assert!(Legacy::parse(&bcrypt.replace("$04$", "$14$")).is_ok());
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
        assert!(Legacy::parse(&scrypt.replace("ln=4", "ln=64")).is_err());
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

    fn scrypt(ln: u8, r: u32, p: u32) -> String {
        format!(
            "$scrypt$ln={ln},r={r},p={p}${}${}",
            STANDARD_NO_PAD.encode(b"salt"),
            STANDARD_NO_PAD.encode([2u8; 32])
        )
    }

    fn pbkdf2(alg: &str, iterations: u32, len: usize) -> String {
        format!(
            "${alg}$i={iterations}${}${}",
            STANDARD_NO_PAD.encode(b"salty salt"),
            STANDARD_NO_PAD.encode(vec![7u8; len])
        )
    }

    fn argon2(m: u32, t: u32, p: u32) -> String {
        format!(
            "$argon2id$v=19$m={m},t={t},p={p}${}${}",
            STANDARD_NO_PAD.encode(b"saltsaltsalt"),
            STANDARD_NO_PAD.encode([3u8; 32])
        )
    }

    #[test]
    fn hashes_over_the_budget_are_refused_with_their_cost() {
        // The hash of the attack: 1 GiB and over a minute of a core.
        let err = Legacy::parse(&scrypt(18, 32, 4)).unwrap_err();
        assert!(
            err.contains("1024 MiB") && err.contains("at most 64 MiB and 1.00 s"),
            "{err}"
        );
        for over in [
            scrypt(17, 8, 1), // 128 MiB            scrypt(14, 8, 512),   // 16 MiB, but 512 passes
            // A tiny N with a huge p: its blocks and PBKDF2 passes dominate
            // (254 MiB and some 4 s of a core; the array alone looked free).
            format!(
                "$scrypt$ln=1,r=1,p=2083333${}${}",
                STANDARD_NO_PAD.encode([9u8; 256]),
                STANDARD_NO_PAD.encode([2u8; 64])
            ),
            argon2(131_072, 1, 1), // 128 MiB
            argon2(65_536, 20, 1), // 64 MiB, 20 passes
            pbkdf2("pbkdf2-sha256", 7_000_000, 32),
            pbkdf2("pbkdf2-sha512", 3_000_000, 64),
            pbkdf2("pbkdf2-sha256", 5_000_000, 64), // two output blocks
        ] {
            assert!(Legacy::parse(&over).is_err(), "{over}");
        }
        for within in [
            scrypt(16, 8, 1),
            scrypt(14, 8, 1),
            argon2(65_536, 3, 1),
            argon2(19_456, 2, 1),
            pbkdf2("pbkdf2-sha256", 5_000_000, 32),
            pbkdf2("pbkdf2-sha512", 210_000, 64),
        ] {
            let h = Legacy::parse(&within).unwrap_or_else(|e| panic!("{within}: {e}"));
            assert!(h.cost().within(BUDGET), "{within}");
        }
    }

    #[test]
    fn a_bcrypt_hash_never_matches_a_password_longer_than_it_holds() {
        let first = "a".repeat(BCRYPT_MAX_PASSWORD);
        let h = bcrypt::hash_with_salt(&first, 4, [5u8; 16]).unwrap().to_string();
        let h = Legacy::parse(&h).unwrap();
        assert!(h.verify(&first));
        assert!(!h.verify(&format!("{first}b")), "shares the first 72 bytes");
        assert!(!h.verify(&format!("{first}{first}")));
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
