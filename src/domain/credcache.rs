//! The verified-credential cache: a login that skips argon2 for a password
//! this process verified recently, without keeping anything a thief could use.
//!
//! After a full argon2 verification succeeds, we keep
//! `HMAC(k, user_id | password_hash | password)` under a key `k` drawn at
//! random when the process starts. A later login whose MAC matches skips
//! argon2. A wrong password never matches, so it always pays the full hash.
//! The stored hash is part of the MAC input, so a password change or reset
//! invalidates the entry by itself (and `forget` drops it explicitly).
//! Entries live `ttl` and the cache is bounded. Nothing of it leaves the
//! process: not Redis, not disk. docs/credential-cache.md has the threat model.

use std::time::{Duration, Instant};

use crate::cache::{bounded_cache, BoundedCache};

use crate::crypto::{ct_eq, MacKey};
use crate::settings::{number, secs, switch, ConfigError, Source};

#[derive(Clone, Debug)]
pub struct CredentialCacheSettings {
    pub ttl: Duration,
    pub capacity: usize,
}

impl CredentialCacheSettings {
    /// `None` with `credential_cache = off`: every login pays argon2.
    pub fn read(src: &impl Source) -> Result<Option<CredentialCacheSettings>, ConfigError> {
        let settings = CredentialCacheSettings {
            ttl: src.get(
                "credential_cache_ttl_secs",
                Duration::from_secs(600),
                secs(1, 86_400),
            )?,
            capacity: src.get("credential_cache_capacity", 100_000, number(1, 10_000_000))?,
        };
        Ok(src.get("credential_cache", true, switch)?.then_some(settings))
    }
}

pub struct CredentialCache {
    key: MacKey,
    entries: BoundedCache<String, ([u8; 32], Instant)>,
    ttl: Duration,
}

impl CredentialCache {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        CredentialCache {
            key: MacKey::random(),
            entries: bounded_cache(capacity, "credentials"),
            ttl,
        }
    }

    fn mac(&self, user_id: &str, phc: &str, password: &str) -> [u8; 32] {
        self.key
            .mac(&[user_id.as_bytes(), phc.as_bytes(), password.as_bytes()])
    }

    /// True if this exact password was verified against this exact hash recently.
    pub fn check(&self, user_id: &str, phc: &str, password: &str) -> bool {
        let hit = match self.entries.get(user_id) {
            Some((mac, expires)) if Instant::now() < expires => {
                ct_eq(&mac, &self.mac(user_id, phc, password))
            }
            _ => false,
        };
        if hit {
            metrics::counter!("latchkey_credential_cache_hits_total").increment(1);
        } else {
            metrics::counter!("latchkey_credential_cache_misses_total").increment(1);
        }
        hit
    }

    pub fn remember(&self, user_id: &str, phc: &str, password: &str) {
        let mac = self.mac(user_id, phc, password);
        self.entries
            .insert(user_id.to_string(), (mac, Instant::now() + self.ttl));
    }

    pub fn forget(&self, user_id: &str) {
        self.entries.remove(user_id);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_password_and_hash_hit() {
        let c = CredentialCache::new(10, Duration::from_secs(60));
        assert!(!c.check("u1", "h1", "pw"));
        c.remember("u1", "h1", "pw");
        assert!(c.check("u1", "h1", "pw"));
        assert!(!c.check("u1", "h1", "pw2"), "wrong password");
        assert!(!c.check("u1", "h2", "pw"), "hash changed");
        assert!(!c.check("u2", "h1", "pw"), "other user");
        c.forget("u1");
        assert!(!c.check("u1", "h1", "pw"));
    }

    #[test]
    fn entries_expire() {
        let c = CredentialCache::new(10, Duration::from_millis(0));
        c.remember("u", "h", "p");
        assert!(!c.check("u", "h", "p"));
    }

    #[test]
    fn two_processes_have_different_keys() {
        let a = CredentialCache::new(1, Duration::from_secs(1));
        let b = CredentialCache::new(1, Duration::from_secs(1));
        assert_ne!(a.mac("u", "h", "p"), b.mac("u", "h", "p"));
    }
}
