//! Token leases: how the Redis limiter avoids one round trip per request
//! without ever letting more than the limit through.
//!
//! Every Redis call asks for several tokens: up to [`COLD_LEASE`] for a key
//! this process has no lease for (one under a policy of at most
//! [`EXACT_UP_TO`] per window), up to [`MAX_LEASE`] for a hot one (its
//! previous call less than [`HOT`] ago). The script grants at most a
//! sixteenth of the room left in the bucket (never more than asked, at least
//! one), takes them all from the shared bucket at once, and this process
//! hands the spare ones out locally for a sixteenth of the policy's window
//! ([`ttl`]).
//!
//! What stays exact across any number of instances: a leased token has
//! already left the shared bucket, so the tokens used never exceed the
//! tokens GCRA granted, and each is used at most a sixteenth of the window
//! after GCRA granted it (the bucket's rate and burst hold, shifted by at
//! most that much). What leases can cost is a little under-admission: tokens still unused when a lease expires are lost
//! (at most 1/16 of the room per grant, from that client's own bucket).
//! Every bucket with less than 32 tokens of room (the security policies: a
//! login per account, a code per account) gets exactly one token per call:
//! the per-request check, exact to the token.
//!
//! ```text
//!   no lease / expired ──ask COLD_LEASE──> granted g: use 1, keep g-1 until fetched + ttl
//!   lease with tokens  ──────────────────> use one locally (no round trip)
//!   lease used up, fetched < HOT ago ─ask MAX_LEASE─> (a hot key)
//!   refused (g = 0) ─────────────────────> a spare token a racing call leased, if any
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 16;

/// Most tokens a hot key asks for in one call.
pub const MAX_LEASE: u32 = 64;
/// Most tokens a key without a lease asks for, under a policy of more than
/// [`EXACT_UP_TO`] per window: a client seen once wastes at most three of
/// its own tokens; one that comes back within the lease's life is answered
/// without a round trip.
pub const COLD_LEASE: u32 = 4;
/// Policies of at most this many per window (every default policy of the
/// service but login per address) ask for one token on a key without a
/// lease: a key spread over instances, or an attacker who hangs up after
/// asking, cannot strand a victim's tokens in leases.
pub const EXACT_UP_TO: u32 = 64;

/// What a key without a lease asks for under a policy of `limit` per window.
pub fn cold_ask(limit: u32) -> u32 {
    if limit > EXACT_UP_TO {
        COLD_LEASE
    } else {
        1
    }
}
/// A key whose previous Redis call is this recent (microseconds) is hot.
pub const HOT: i64 = 100_000;

/// How long spare leased tokens may be used (microseconds): a sixteenth of
/// the policy's window.
pub fn ttl(window_us: i64) -> i64 {
    (window_us / 16).max(1)
}

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
    /// Until when its spare tokens may be used.
    until: i64,
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

    /// Uses a leased token if one is left, or says how many to ask for
    /// (`cold`, see [`cold_ask`], when the key has no lease and is not hot).
    pub fn take(&self, policy: &'static str, key: &str, now: i64, cold: u32) -> Take {
        let mut map = self.shard(policy, key).lock().expect("lease lock");
        match map.get_mut(policy).and_then(|m| m.get_mut(key)) {
            Some(l) if l.tokens > 0 && now < l.until => {
                l.tokens -= 1;
                Take::Leased
            }
            Some(l) if now - l.fetched < HOT => Take::Ask(MAX_LEASE),
            _ => Take::Ask(cold),
        }
    }

    /// Records a Redis grant of `granted` tokens (one of them used by the
    /// caller), usable until `now + ttl`. A grant of zero (refused) leaves
    /// spare tokens that a racing call leased: they have left the bucket,
    /// and the refused caller may take one (exact either way).
    pub fn granted(&self, policy: &'static str, key: &str, now: i64, ttl: i64, granted: u32) {
        let mut map = self.shard(policy, key).lock().expect("lease lock");
        let keys = map.entry(policy).or_default();
        if !keys.contains_key(key) {
            keys.insert(
                key.into(),
                Lease {
                    tokens: 0,
                    fetched: now,
                    until: now,
                },
            );
        }
        let Some(entry) = keys.get_mut(key) else {
            return;
        };
        if granted == 0 {
            entry.fetched = now;
            return;
        }
        if now >= entry.until || entry.tokens == 0 {
            entry.tokens = 0;
            entry.until = now + ttl;
        }
        // Added to live spare tokens, the new ones expire with them: no
        // token is used later than a lease's life after its grant.
        entry.tokens += granted - 1;
        entry.fetched = now;
    }

    /// Forgets leases that expired (housekeeping).
    pub fn purge(&self, now: i64) {
        for shard in &self.shards {
            let mut map = shard.lock().expect("lease lock");
            for keys in map.values_mut() {
                keys.retain(|_, l| (l.tokens > 0 && now < l.until) || now - l.fetched < HOT);
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

    /// A lease's life in these tests (a window of 16 s).
    const TTL: i64 = 1_000_000;

    #[test]
    fn a_lease_lives_a_sixteenth_of_the_window() {
        assert_eq!(ttl(16_000_000), TTL);
        assert_eq!(ttl(60_000_000), 3_750_000);
        assert_eq!(ttl(1), 1, "never zero");
    }

    #[test]
    fn small_policies_ask_for_one_token_on_a_cold_key() {
        assert_eq!(cold_ask(1), 1);
        assert_eq!(cold_ask(EXACT_UP_TO), 1);
        assert_eq!(cold_ask(EXACT_UP_TO + 1), COLD_LEASE);
        let l = Leases::new();
        assert_eq!(l.take("p", "k", 0, cold_ask(60)), Take::Ask(1));
    }

    #[test]
    fn tokens_added_to_a_live_lease_expire_with_it() {
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 3);
        // A racing grant lands later: its spare tokens join the live ones.
        l.granted("p", "k", TTL / 2, TTL, 3);
        for _ in 0..3 {
            assert_eq!(l.take("p", "k", TTL - 1, COLD_LEASE), Take::Leased);
        }
        // One is left, granted at TTL / 2, but it dies with the first lease.
        assert_eq!(l.take("p", "k", TTL, COLD_LEASE), Take::Ask(COLD_LEASE));
    }

    #[test]
    fn cold_keys_ask_for_a_small_lease_hot_keys_for_a_large_one() {
        let l = Leases::new();
        assert_eq!(l.take("p", "k", 0, COLD_LEASE), Take::Ask(COLD_LEASE));
        l.granted("p", "k", 0, TTL, 1);
        // Checked again soon after, nothing spare: hot.
        assert_eq!(l.take("p", "k", HOT - 1, COLD_LEASE), Take::Ask(MAX_LEASE));
        // ... but not after a pause.
        assert_eq!(l.take("p", "k", HOT, COLD_LEASE), Take::Ask(COLD_LEASE));
        // Another key or policy is its own.
        assert_eq!(l.take("p", "other", 1, COLD_LEASE), Take::Ask(COLD_LEASE));
        assert_eq!(l.take("q", "k", 1, COLD_LEASE), Take::Ask(COLD_LEASE));
    }

    #[test]
    fn spare_tokens_are_used_locally_until_gone_or_expired() {
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 4);
        for _ in 0..3 {
            assert_eq!(l.take("p", "k", 10, COLD_LEASE), Take::Leased);
        }
        assert_eq!(l.take("p", "k", 10, COLD_LEASE), Take::Ask(MAX_LEASE));
        l.granted("p", "k", 20, TTL, 3);
        assert_eq!(l.take("p", "k", 20 + TTL - 1, COLD_LEASE), Take::Leased);
        // Expired: the last spare token is not used.
        assert_eq!(l.take("p", "k", 20 + TTL, COLD_LEASE), Take::Ask(COLD_LEASE));
        // Grants made concurrently add up.
        l.granted("p", "k", 30 + TTL, TTL, 3);
        l.granted("p", "k", 31 + TTL, TTL, 3);
        let leased = (0..10)
            .filter(|_| l.take("p", "k", 32 + TTL, COLD_LEASE) == Take::Leased)
            .count();
        assert_eq!(leased, 4);
        // A refusal keeps what a racing call leased (those tokens have
        // left the bucket), and does not make them live longer.
        l.granted("p", "k", 40 + TTL, TTL, 2);
        l.granted("p", "k", 41 + TTL, TTL, 0);
        assert_eq!(l.take("p", "k", 42 + TTL, COLD_LEASE), Take::Leased);
        assert_eq!(l.take("p", "k", 42 + TTL, COLD_LEASE), Take::Ask(MAX_LEASE));
        l.granted("p", "k", 50 + TTL, TTL, 2);
        l.granted("p", "k", 51 + TTL, TTL, 0);
        assert_eq!(l.take("p", "k", 50 + 2 * TTL, COLD_LEASE), Take::Ask(COLD_LEASE));
        // Each grant lives its own policy's time.
        l.granted("short", "k", 0, 10, 3);
        assert_eq!(l.take("short", "k", 9, COLD_LEASE), Take::Leased);
        assert_eq!(l.take("short", "k", 10, COLD_LEASE), Take::Ask(MAX_LEASE));
    }

    #[test]
    fn purge_forgets_expired_leases() {
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 5);
        l.purge(TTL - 1);
        assert_eq!(l.take("p", "k", 1, COLD_LEASE), Take::Leased);
        l.purge(TTL);
        assert_eq!(l.take("p", "k", TTL, COLD_LEASE), Take::Ask(COLD_LEASE));
    }
}
