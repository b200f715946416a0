//! Token leases: how the Redis limiter avoids one round trip per request on
//! hot keys without ever letting more than the limit through.
//!
//! A key checked again within [`HOT`] of its last Redis call is hot: the next
//! call asks the script for up to [`MAX_LEASE`] tokens at once. The script
//! grants at most a sixteenth of the room left in the bucket (never more than
//! asked, at least one), takes them all from the shared bucket at once, and
//! this process hands the spare ones out locally for up to [`TTL`]. Because a
//! leased token has already left the shared bucket, leases never admit more
//! than the limit across all instances; what they can cost is a little
//! under-admission: tokens still unused when a lease expires are lost (at most
//! 1/16 of the room per grant). Keys at a few requests per second, and every
//! bucket with less than 32 tokens of room, get exactly one token per call: the
//! per-request behaviour, exact to the token.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 16;

/// Most tokens asked for in one call.
pub const MAX_LEASE: u32 = 64;
/// A key whose previous Redis call is this recent (microseconds) is hot.
pub const HOT: i64 = 100_000;
/// How long spare leased tokens may be used (microseconds).
pub const TTL: i64 = 1_000_000;

/// The rule the Redis script (`GCRA_SCRIPT`) follows, written out for the tests: how many tokens to grant: `room` is the number of
/// whole tokens left in the bucket (at least one, or nothing is granted).
#[cfg(test)]
pub fn grant(want: u32, room: i64) -> u32 {
    if room < 1 {
        return 0;
    }
    let share = (room / 16).clamp(1, i64::from(MAX_LEASE)) as u32;
    want.clamp(1, share.max(1))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// A leased token was used: no need to ask Redis.
    Leased,
    /// Ask Redis for this many tokens.
    Ask(u32),
}

type Shard = HashMap<&'static str, HashMap<Box<str>, Lease>>;

#[derive(Clone, Copy, Debug)]
struct Lease {
    tokens: u32,
    /// When the last Redis call for this key returned.
    fetched: i64,
}

pub struct Leases {
    /// Per shard: policy -> key -> lease (nested so that a lookup by `&str`
    /// allocates nothing).
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for Leases {
    fn default() -> Self {
        Self::new()
    }
}

impl Leases {
    pub fn new() -> Self {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        }
    }

    fn shard(&self, policy: &'static str, key: &str) -> &Mutex<Shard> {
        let mut h = self.hasher.build_hasher();
        policy.hash(&mut h);
        key.hash(&mut h);
        &self.shards[h.finish() as usize % SHARDS]
    }

    /// Uses a leased token if one is left, or says how many to ask for.
    pub fn take(&self, policy: &'static str, key: &str, now: i64) -> Take {
        let mut map = self.shard(policy, key).lock().expect("lease lock");
        match map.get_mut(policy).and_then(|m| m.get_mut(key)) {
            Some(l) if l.tokens > 0 && now - l.fetched < TTL => {
                l.tokens -= 1;
                Take::Leased
            }
            Some(l) if now - l.fetched < HOT => Take::Ask(MAX_LEASE),
            _ => Take::Ask(1),
        }
    }

    /// Records a Redis grant of `granted` tokens (one of them used by the
    /// caller); a grant of zero (refused) drops any spare ones.
    pub fn granted(&self, policy: &'static str, key: &str, now: i64, granted: u32) {
        let mut map = self.shard(policy, key).lock().expect("lease lock");
        let keys = map.entry(policy).or_default();
        if !keys.contains_key(key) {
            keys.insert(
                key.into(),
                Lease {
                    tokens: 0,
                    fetched: now,
                },
            );
        }
        let Some(entry) = keys.get_mut(key) else {
            return;
        };
        if granted == 0 || now - entry.fetched >= TTL {
            entry.tokens = 0;
        }
        entry.tokens += granted.saturating_sub(1);
        entry.fetched = now;
    }

    /// Forgets leases that expired (housekeeping).
    pub fn purge(&self, now: i64) {
        for shard in &self.shards {
            let mut map = shard.lock().expect("lease lock");
            for keys in map.values_mut() {
                keys.retain(|_, l| now - l.fetched < TTL);
            }
            map.retain(|_, keys| !keys.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_a_sixteenth_of_the_room_and_never_more_than_asked() {
        assert_eq!(grant(64, 0), 0);
        assert_eq!(grant(1, 0), 0);
        assert_eq!(grant(64, -5), 0);
        for room in 1..32 {
            assert_eq!(grant(64, room), 1, "small buckets stay exact (room {room})");
        }
        assert_eq!(grant(64, 32), 2);
        assert_eq!(grant(64, 160), 10);
        assert_eq!(grant(64, 1_000_000), MAX_LEASE);
        assert_eq!(grant(1, 1_000_000), 1);
        assert_eq!(grant(0, 1_000_000), 1, "a call always asks for at least one");
        for room in 0..5000 {
            for want in [0, 1, 2, 7, 64] {
                let g = grant(want, room) as i64;
                assert!(g <= room.max(0), "never more than the room: {want} {room}");
                assert!(g <= i64::from(want.max(1)));
                assert!(room < 1 || g >= 1);
                assert!(g <= 1 || g * 16 <= room, "at most a sixteenth: {want} {room}");
            }
        }
    }

    #[test]
    fn cold_keys_ask_for_one_token_hot_keys_for_a_lease() {
        let l = Leases::new();
        assert_eq!(l.take("p", "k", 0), Take::Ask(1));
        l.granted("p", "k", 0, 1);
        // Checked again soon after: hot.
        assert_eq!(l.take("p", "k", HOT - 1), Take::Ask(MAX_LEASE));
        // ... but not after a pause.
        assert_eq!(l.take("p", "k", HOT), Take::Ask(1));
        // Another key or policy is its own.
        assert_eq!(l.take("p", "other", 1), Take::Ask(1));
        assert_eq!(l.take("q", "k", 1), Take::Ask(1));
    }

    #[test]
    fn spare_tokens_are_used_locally_until_gone_or_expired() {
        let l = Leases::new();
        l.granted("p", "k", 0, 4);
        for _ in 0..3 {
            assert_eq!(l.take("p", "k", 10), Take::Leased);
        }
        assert_eq!(l.take("p", "k", 10), Take::Ask(MAX_LEASE));
        l.granted("p", "k", 20, 3);
        assert_eq!(l.take("p", "k", 20 + TTL - 1), Take::Leased);
        // Expired: the last spare token is not used.
        assert_eq!(l.take("p", "k", 20 + TTL), Take::Ask(1));
        // Grants made concurrently add up.
        l.granted("p", "k", 30 + TTL, 3);
        l.granted("p", "k", 31 + TTL, 3);
        let leased = (0..10)
            .filter(|_| l.take("p", "k", 32 + TTL) == Take::Leased)
            .count();
        assert_eq!(leased, 4);
        // A refusal drops what is left.
        l.granted("p", "k", 40 + TTL, 5);
        l.granted("p", "k", 41 + TTL, 0);
        assert_eq!(l.take("p", "k", 42 + TTL), Take::Ask(MAX_LEASE));
    }

    #[test]
    fn purge_forgets_expired_leases() {
        let l = Leases::new();
        l.granted("p", "k", 0, 5);
        l.purge(TTL - 1);
        assert_eq!(l.take("p", "k", 1), Take::Leased);
        l.purge(TTL);
        assert_eq!(l.take("p", "k", TTL), Take::Ask(1));
    }
}
