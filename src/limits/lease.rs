//! Token leases: how the Redis limiter avoids one round trip per request
//! without ever letting more than the limit through.
//!
//! Under a policy of more than [`EXACT_UP_TO`] per window, every Redis call
//! asks for several tokens: up to [`COLD_LEASE`] for a key this process has
//! no lease for, up to [`MAX_LEASE`] for a hot one (its previous call less
//! than [`HOT`] ago). The script grants at most a sixteenth of the room
//! left in the bucket (never more than asked, at least one), takes them all
//! from the shared bucket at once, and this process hands the spare ones
//! out locally for a sixteenth of the policy's window, at most a minute
//! ([`ttl`]), in a table of bounded size ([`MAX_KEYS_PER_SHARD`]). Policies
//! of at most [`EXACT_UP_TO`] per window (every default policy but login
//! per address: a login per account, a code per account) ask for exactly
//! one token per call, hot or not, and are never renewed: the per-request
//! check, exact to the token, with no tokens stranded in one instance.
//!
//! A lease of such a large policy is renewed ahead of its end: the check
//! that uses its last token, or a token after half its life, is answered at
//! once and asks Redis for the next lease in the background
//! ([`Take::Renew`], one at a time per key), for twice what was served
//! since the last renewal. The renewal's tokens wait behind the current
//! ones, each grant under its own end, so a client that comes back steadily
//! (at least once per half a lease's life) never waits for Redis after its
//! first check.
//!
//! What stays exact across any number of instances: a leased token has
//! already left the shared bucket, so the tokens used never exceed the
//! tokens GCRA granted, and each is used at most a sixteenth of the window
//! (and the call's round trip) after GCRA granted it, so the bucket's rate
//! and burst hold, shifted by at most that much; a renewal changes neither.
//! Lease times are on a monotonic clock (`now_us`): a wall clock stepped
//! back cannot stretch them. What leases can cost is a little
//! under-admission: tokens still unused when a lease expires are lost (at
//! most 1/16 of the room per grant, from that client's own bucket; with
//! renewals, a client that stops coming back loses its last renewal too).
//!
//! ```text
//!   no lease / expired ──ask COLD_LEASE──> granted g: use 1, keep g-1 until fetched + ttl
//!   lease with tokens  ──────────────────> use one locally (no round trip)
//!     ... its last one, or past half its life ──> and renew in the background:
//!         granted r: r more, after the current ones, until renewed + ttl
//!   lease used up, fetched < HOT ago ─ask MAX_LEASE─> (a hot key)
//!   refused (g = 0) ─────────────────────> a spare token a racing call leased, if any
//! ```

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
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

/// The longest a lease lives (microseconds): a minute, whatever the window.
pub const MAX_TTL: i64 = 60_000_000;

/// How long spare leased tokens may be used (microseconds): a sixteenth of
/// the policy's window, at most [`MAX_TTL`] (a week-long window would
/// otherwise keep a lease, and its entry, for ten hours).
pub fn ttl(window_us: i64) -> i64 {
    (window_us / 16).clamp(1, MAX_TTL)
}

/// Most keys a shard of the lease table holds (16 shards: 131,072 keys,
/// about 16 MiB). A key new to a full shard asks for one token and is not
/// stored: it is checked per request, exactly, as a small policy's key is
/// (a grant of more that raced the table filling up loses its spare
/// tokens: under-admission for that client only). Memory is bounded by count,
/// not by the request rate times the purge period: an attacker who
/// rotates addresses cannot grow the table.
pub const MAX_KEYS_PER_SHARD: usize = 8_192;

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

/// How long a renewal may be in flight before another may be asked for
/// (microseconds): past it, one that never answered is forgotten.
pub const RENEW_WAIT: i64 = 1_000_000;

/// "No renewal asked for": far enough in the past for any `now`.
const NEVER: i64 = i64::MIN / 2;

/// What a policy's leases follow, from its limit and window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    /// Tokens a key without a lease asks for ([`cold_ask`]).
    pub cold: u32,
    /// Tokens a hot key asks for.
    pub hot: u32,
    /// A lease's life ([`ttl`]).
    pub ttl: i64,
    /// Whether leases are renewed ahead of their end.
    pub renew: bool,
}

impl Terms {
    /// Policies of more than [`EXACT_UP_TO`] per window lease and renew;
    /// the others ask for exactly one token per call, hot or not.
    pub fn of(limit: u32, window_us: i64) -> Terms {
        let leases = limit > EXACT_UP_TO;
        Terms {
            cold: cold_ask(limit),
            hot: if leases { MAX_LEASE } else { 1 },
            ttl: ttl(window_us),
            renew: leases,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// A leased token was used: no need to ask Redis.
    Leased,
    /// A leased token was used, and the lease is used up or half gone: ask
    /// Redis for this many in the background (the caller does not wait;
    /// the answer goes to [`Leases::renewed`]).
    Renew(u32),
    /// Ask Redis for this many tokens.
    Ask(u32),
}

/// Per shard: the leases by the hash of (policy, key), the one hash that
/// also picked the shard (one SipHash and one table probe per check). Each
/// entry keeps its policy and key: a key whose hash an entry of another key
/// already holds is treated like a key a full table will not store (it
/// asks for one token, exactly), so two keys never share a lease.
type Shard = HashMap<u64, Entry, BuildHasherDefault<Prehashed>>;

struct Entry {
    policy: &'static str,
    key: Box<str>,
    lease: Lease,
}

impl Entry {
    fn is(&self, policy: &'static str, key: &str) -> bool {
        self.policy == policy && *self.key == *key
    }
}

/// The identity hasher of a table whose keys are already SipHash values
/// (keyed per process, so an attacker cannot choose collisions).
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; fold anything else all the same.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, h: u64) {
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Lease {
    tokens: u32,
    /// When the last Redis call for this key returned.
    fetched: i64,
    /// Until when its spare tokens may be used.
    until: i64,
    /// A renewal's tokens, used once the current ones are gone or expired,
    /// until `next_until` (a renewal's life starts at its own grant).
    next_tokens: u32,
    next_until: i64,
    /// Tokens served since the lease began or the last renewal was asked
    /// for (the caller's included): a renewal asks for twice as many.
    used: u32,
    /// When the last renewal was asked for (one at a time, see [`RENEW_WAIT`]).
    renew_asked: i64,
}

pub struct Leases {
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
    /// [`MAX_KEYS_PER_SHARD`], smaller in tests.
    keys_per_shard: usize,
    /// Tests: every key hashes alike.
    #[cfg(test)]
    colliding: bool,
}

impl Default for Leases {
    fn default() -> Self {
        Self::new()
    }
}

impl Leases {
    pub fn new() -> Self {
        Self::with_keys_per_shard(MAX_KEYS_PER_SHARD)
    }

    fn with_keys_per_shard(keys_per_shard: usize) -> Self {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::default())).collect(),
            hasher: Default::default(),
            keys_per_shard,
            #[cfg(test)]
            colliding: false,
        }
    }

    /// The shard of (policy, key) and the key's hash in it. The shard takes
    /// bits of the hash that the table does not use for its buckets (the
    /// low bits) or its tags (the top seven).
    fn locate(&self, policy: &'static str, key: &str) -> (&Mutex<Shard>, u64) {
        let mut h = self.hasher.build_hasher();
        policy.hash(&mut h);
        key.hash(&mut h);
        let h = h.finish();
        #[cfg(test)]
        let h = if self.colliding { 0 } else { h };
        (&self.shards[(h >> 32) as usize % SHARDS], h)
    }

    /// Uses a leased token if one is left, or says how many to ask for
    /// (`terms.cold` when the key has no lease and is not hot). Under
    /// `terms.renew`, a token used from a lease that is used up or half
    /// gone also says to ask for the next lease in the background
    /// ([`Take::Renew`]), once at a time.
    pub fn take(&self, policy: &'static str, key: &str, now: i64, terms: Terms) -> Take {
        let (shard, h) = self.locate(policy, key);
        let mut map = shard.lock().expect("lease lock");
        let full = map.len() >= self.keys_per_shard;
        let l = match map.get_mut(&h) {
            Some(e) if e.is(policy, key) => &mut e.lease,
            // Another key holds this hash: this one is not stored.
            Some(_) => return Take::Ask(1),
            // A key a full table will not store asks for one token: spare
            // ones would be lost.
            None if full => return Take::Ask(1),
            None => return Take::Ask(terms.cold),
        };
        if !(l.tokens > 0 && now < l.until) && l.next_tokens > 0 && now < l.next_until {
            (l.tokens, l.until, l.next_tokens) = (l.next_tokens, l.next_until, 0);
        }
        if l.tokens > 0 && now < l.until {
            l.tokens -= 1;
            l.used += 1;
            let next_live = l.next_tokens > 0 && now < l.next_until;
            let renewing = now - l.renew_asked < RENEW_WAIT;
            if terms.renew && !next_live && !renewing && (l.tokens == 0 || l.until - now < terms.ttl / 2) {
                l.renew_asked = now;
                // Twice what was served since the last renewal (about half
                // a lease's life): a client seen now and then renews a
                // token or two, not a cold lease each time.
                let hot = l.tokens == 0 && now - l.fetched < HOT;
                let want = if hot {
                    terms.hot
                } else {
                    (2 * l.used).clamp(1, terms.hot)
                };
                l.used = 0;
                return Take::Renew(want);
            }
            return Take::Leased;
        }
        if now - l.fetched < HOT {
            Take::Ask(terms.hot)
        } else {
            Take::Ask(terms.cold)
        }
    }

    /// Records a Redis grant of `granted` tokens (one of them used by the
    /// caller), usable until `now + ttl`. A grant of zero (refused) leaves
    /// spare tokens that a racing call leased: they have left the bucket,
    /// and the refused caller may take one (exact either way).
    pub fn granted(&self, policy: &'static str, key: &str, now: i64, ttl: i64, granted: u32) {
        let (shard, h) = self.locate(policy, key);
        let mut map = shard.lock().expect("lease lock");
        let full = map.len() >= self.keys_per_shard;
        let entry = match map.entry(h) {
            Slot::Occupied(e) if e.get().is(policy, key) => e.into_mut(),
            // Another key's hash, or a full table: not stored.
            Slot::Occupied(_) => return,
            Slot::Vacant(_) if full => return,
            Slot::Vacant(e) => e.insert(Entry {
                policy,
                key: key.into(),
                lease: Lease {
                    fetched: now,
                    until: now,
                    renew_asked: NEVER,
                    ..Lease::default()
                },
            }),
        };
        let entry = &mut entry.lease;
        if granted == 0 {
            entry.fetched = now;
            return;
        }
        if now >= entry.until || entry.tokens == 0 {
            entry.tokens = 0;
            entry.until = now + ttl;
            entry.used = 0;
        }
        entry.used += 1;
        // Added to live spare tokens, the new ones expire with them: no
        // token is used later than a lease's life after its grant.
        entry.tokens += granted - 1;
        entry.fetched = now;
    }

    /// Records the answer to the renewal asked for at `asked` ([`Take::Renew`]):
    /// `granted` tokens, none of them used yet, usable until `now + ttl`;
    /// `None` if Redis did not answer. Another renewal may be asked for from
    /// now on (unless one was asked for since: this answer is late).
    pub fn renewed(
        &self,
        policy: &'static str,
        key: &str,
        now: i64,
        ttl: i64,
        asked: i64,
        granted: Option<u32>,
    ) {
        let (shard, h) = self.locate(policy, key);
        let mut map = shard.lock().expect("lease lock");
        let Some(entry) = map
            .get_mut(&h)
            .filter(|e| e.is(policy, key))
            .map(|e| &mut e.lease)
        else {
            // Purged meanwhile (a key not seen for a lease's life): its
            // tokens are wasted, never used late.
            return;
        };
        if entry.renew_asked == asked {
            entry.renew_asked = NEVER;
        }
        let Some(granted) = granted.filter(|&g| g > 0) else {
            return;
        };
        entry.fetched = now;
        if entry.tokens > 0 && now < entry.until {
            // The current lease still has tokens: these wait their turn,
            // under their own end (any unused ones of an earlier renewal
            // are dropped: none outlives its grant by more than `ttl`).
            (entry.next_tokens, entry.next_until) = (granted, now + ttl);
        } else {
            (entry.tokens, entry.until) = (granted, now + ttl);
        }
    }

    /// Forgets leases that expired (housekeeping).
    pub fn purge(&self, now: i64) {
        for shard in &self.shards {
            shard.lock().expect("lease lock").retain(|_, e| {
                let l = &e.lease;
                (l.tokens > 0 && now < l.until)
                    || (l.next_tokens > 0 && now < l.next_until)
                    || now - l.fetched < HOT
                    || now - l.renew_asked < RENEW_WAIT
            });
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
    /// A policy of more than `EXACT_UP_TO` per window, without renewals.
    const COLD: Terms = Terms {
        cold: COLD_LEASE,
        hot: MAX_LEASE,
        ttl: TTL,
        renew: false,
    };
    /// The same with renewals (what such a policy has).
    const RENEWING: Terms = Terms { renew: true, ..COLD };

    #[test]
    fn a_lease_lives_a_sixteenth_of_the_window() {
        assert_eq!(ttl(16_000_000), TTL);
        assert_eq!(ttl(60_000_000), 3_750_000);
        assert_eq!(ttl(1), 1, "never zero");
        assert_eq!(ttl(7 * 86_400_000_000), MAX_TTL, "at most a minute");
    }

    #[test]
    fn small_policies_ask_for_one_token_on_a_cold_key() {
        assert_eq!(cold_ask(1), 1);
        assert_eq!(cold_ask(EXACT_UP_TO), 1);
        assert_eq!(cold_ask(EXACT_UP_TO + 1), COLD_LEASE);
        let l = Leases::new();
        assert_eq!(l.take("p", "k", 0, Terms::of(60, 16 * TTL)), Take::Ask(1));
        // ... and are never renewed ahead: a renewal takes tokens early.
        assert!(!Terms::of(EXACT_UP_TO, 16 * TTL).renew);
        assert!(Terms::of(EXACT_UP_TO + 1, 16 * TTL).renew);
        // ... and ask for one when hot too: one token per call.
        l.granted("p", "k", 0, TTL, 1);
        assert_eq!(l.take("p", "k", 1, Terms::of(60, 16 * TTL)), Take::Ask(1));
        assert_eq!(l.take("p", "k", 1, Terms::of(65, 16 * TTL)), Take::Ask(MAX_LEASE));
    }

    #[test]
    fn a_lease_half_gone_or_used_up_is_renewed_in_the_background_once_at_a_time() {
        let l = Leases::new();
        let half = TTL / 2;
        l.granted("p", "k", 0, TTL, 4);
        assert_eq!(l.take("p", "k", 10, RENEWING), Take::Leased);
        // Past half its life: the caller is served, and asks for the next,
        // twice what this lease served (three).
        assert_eq!(l.take("p", "k", half + 1, RENEWING), Take::Renew(6));
        // One renewal at a time.
        assert_eq!(l.take("p", "k", half + 2, RENEWING), Take::Leased);
        assert_eq!(l.take("p", "k", half + 3, RENEWING), Take::Ask(COLD_LEASE));
        // The renewal lands on an empty lease: it becomes the lease, whole
        // (its caller used none of it).
        l.renewed("p", "k", half + 4, TTL, half + 1, Some(4));
        for _ in 0..3 {
            assert_eq!(l.take("p", "k", half + 5, RENEWING), Take::Leased);
        }
        // The last token: renewed again, now as a hot key.
        assert_eq!(l.take("p", "k", half + 5, RENEWING), Take::Renew(MAX_LEASE));
        // Redis did not answer: another renewal may be asked for at once.
        l.renewed("p", "k", half + 6, TTL, half + 5, None);
        l.granted("p", "k", half + 7, TTL, 2);
        assert_eq!(l.take("p", "k", half + 8, RENEWING), Take::Renew(MAX_LEASE));
        // One that never answers is forgotten after RENEW_WAIT.
        assert_eq!(l.take("p", "k", half + 9, RENEWING), Take::Ask(MAX_LEASE));
        l.granted("p", "k", half + 10, TTL, 3);
        assert_eq!(l.take("p", "k", half + 11, RENEWING), Take::Leased);
        assert_eq!(l.take("p", "k", half + 8 + RENEW_WAIT, RENEWING), Take::Renew(6));
        // The lost one answers at last: it does not clear the new one's mark.
        l.renewed("p", "k", half + 9 + RENEW_WAIT, TTL, half + 8, None);
        l.granted("p", "k", half + 10 + RENEW_WAIT, TTL, 3);
        assert_eq!(l.take("p", "k", half + 11 + RENEW_WAIT, RENEWING), Take::Leased);
        assert_eq!(l.take("p", "k", half + 11 + RENEW_WAIT, RENEWING), Take::Leased);
    }

    #[test]
    fn a_renewal_waits_for_the_current_lease_and_keeps_its_own_end() {
        let l = Leases::new();
        let half = TTL / 2;
        l.granted("p", "k", 0, TTL, 4);
        assert_eq!(l.take("p", "k", half + 1, RENEWING), Take::Renew(4));
        l.renewed("p", "k", half + 2, TTL, half + 1, Some(3));
        // The current lease's two tokens go first; no second renewal while
        // the next lease waits.
        assert_eq!(l.take("p", "k", half + 3, RENEWING), Take::Leased);
        assert_eq!(l.take("p", "k", half + 3, RENEWING), Take::Leased);
        // Then the renewal's three, each at most TTL after its grant.
        assert_eq!(l.take("p", "k", half + 4, RENEWING), Take::Leased);
        // Four served since the renewal was asked for: it asks for eight.
        assert_eq!(l.take("p", "k", half + 2 + TTL - 1, RENEWING), Take::Renew(8));
        assert_eq!(l.take("p", "k", half + 2 + TTL, RENEWING), Take::Ask(COLD_LEASE));
        // A renewal whose lease expired before its turn is dropped unused.
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 64);
        assert_eq!(l.take("p", "k", half + 1, RENEWING), Take::Renew(4));
        l.renewed("p", "k", half + 2, 10, half + 1, Some(3));
        assert_eq!(
            l.take("p", "k", half + 12, RENEWING),
            Take::Renew(2),
            "the current lease's token, and a renewal again: the last one ended"
        );
        assert_eq!(
            l.take("p", "k", TTL, RENEWING),
            Take::Ask(COLD_LEASE),
            "both ended"
        );
    }

    #[test]
    fn tokens_added_to_a_live_lease_expire_with_it() {
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 3);
        // A racing grant lands later: its spare tokens join the live ones.
        l.granted("p", "k", TTL / 2, TTL, 3);
        for _ in 0..3 {
            assert_eq!(l.take("p", "k", TTL - 1, COLD), Take::Leased);
        }
        // One is left, granted at TTL / 2, but it dies with the first lease.
        assert_eq!(l.take("p", "k", TTL, COLD), Take::Ask(COLD_LEASE));
    }

    #[test]
    fn cold_keys_ask_for_a_small_lease_hot_keys_for_a_large_one() {
        let l = Leases::new();
        assert_eq!(l.take("p", "k", 0, COLD), Take::Ask(COLD_LEASE));
        l.granted("p", "k", 0, TTL, 1);
        // Checked again soon after, nothing spare: hot.
        assert_eq!(l.take("p", "k", HOT - 1, COLD), Take::Ask(MAX_LEASE));
        // ... but not after a pause.
        assert_eq!(l.take("p", "k", HOT, COLD), Take::Ask(COLD_LEASE));
        // Another key or policy is its own.
        assert_eq!(l.take("p", "other", 1, COLD), Take::Ask(COLD_LEASE));
        assert_eq!(l.take("q", "k", 1, COLD), Take::Ask(COLD_LEASE));
    }

    #[test]
    fn spare_tokens_are_used_locally_until_gone_or_expired() {
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 4);
        for _ in 0..3 {
            assert_eq!(l.take("p", "k", 10, COLD), Take::Leased);
        }
        assert_eq!(l.take("p", "k", 10, COLD), Take::Ask(MAX_LEASE));
        l.granted("p", "k", 20, TTL, 3);
        assert_eq!(l.take("p", "k", 20 + TTL - 1, COLD), Take::Leased);
        // Expired: the last spare token is not used.
        assert_eq!(l.take("p", "k", 20 + TTL, COLD), Take::Ask(COLD_LEASE));
        // Grants made concurrently add up.
        l.granted("p", "k", 30 + TTL, TTL, 3);
        l.granted("p", "k", 31 + TTL, TTL, 3);
        let leased = (0..10)
            .filter(|_| l.take("p", "k", 32 + TTL, COLD) == Take::Leased)
            .count();
        assert_eq!(leased, 4);
        // A refusal keeps what a racing call leased (those tokens have
        // left the bucket), and does not make them live longer.
        l.granted("p", "k", 40 + TTL, TTL, 2);
        l.granted("p", "k", 41 + TTL, TTL, 0);
        assert_eq!(l.take("p", "k", 42 + TTL, COLD), Take::Leased);
        assert_eq!(l.take("p", "k", 42 + TTL, COLD), Take::Ask(MAX_LEASE));
        l.granted("p", "k", 50 + TTL, TTL, 2);
        l.granted("p", "k", 51 + TTL, TTL, 0);
        assert_eq!(l.take("p", "k", 50 + 2 * TTL, COLD), Take::Ask(COLD_LEASE));
        // Each grant lives its own policy's time.
        l.granted("short", "k", 0, 10, 3);
        assert_eq!(l.take("short", "k", 9, COLD), Take::Leased);
        assert_eq!(l.take("short", "k", 10, COLD), Take::Ask(MAX_LEASE));
    }

    #[test]
    fn a_full_table_stores_no_new_keys_and_their_callers_lose_only_spare_tokens() {
        let l = Leases::with_keys_per_shard(2);
        for i in 0..200 {
            l.granted("p", &format!("k{i}"), 0, TTL, 4);
        }
        let stored: Vec<_> = (0..200)
            .filter(|i| l.take("p", &format!("k{i}"), 1, COLD) == Take::Leased)
            .collect();
        assert_eq!(stored.len(), SHARDS * 2, "two keys per shard: {stored:?}");
        // A key not stored asks Redis again, exact as ever, for one token.
        let lost = (0..200).find(|i| !stored.contains(i)).unwrap();
        assert_eq!(l.take("p", &format!("k{lost}"), 2, COLD), Take::Ask(1));
        // Stored keys keep working, and room comes back with the purge.
        let kept = stored[0];
        assert_eq!(l.take("p", &format!("k{kept}"), 2, COLD), Take::Leased);
        l.purge(TTL + HOT);
        l.granted("p", &format!("k{lost}"), TTL + HOT, TTL, 4);
        assert_eq!(l.take("p", &format!("k{lost}"), TTL + HOT, COLD), Take::Leased);
    }

    #[test]
    fn two_keys_with_one_hash_never_share_a_lease() {
        let l = Leases {
            colliding: true,
            ..Leases::new()
        };
        l.granted("p", "a", 0, TTL, 4);
        // "b" has "a"'s hash: it is checked per request, for one token, and
        // never handed "a"'s spare tokens, nor stores a lease over them.
        assert_eq!(l.take("p", "b", 1, COLD), Take::Ask(1));
        l.granted("p", "b", 1, TTL, 4);
        assert_eq!(l.take("p", "b", 2, COLD), Take::Ask(1));
        l.renewed("p", "b", 2, TTL, NEVER, Some(8));
        assert_eq!(l.take("p", "b", 3, COLD), Take::Ask(1));
        // The same key under another policy is another key.
        assert_eq!(l.take("q", "a", 3, COLD), Take::Ask(1));
        // "a" keeps exactly its three spare tokens.
        for t in 4..7 {
            assert_eq!(l.take("p", "a", t, COLD), Take::Leased);
        }
        assert_eq!(l.take("p", "a", 7, COLD), Take::Ask(MAX_LEASE));
    }

    #[test]
    fn purge_forgets_expired_leases() {
        let l = Leases::new();
        l.granted("p", "k", 0, TTL, 5);
        l.purge(TTL - 1);
        assert_eq!(l.take("p", "k", 1, COLD), Take::Leased);
        l.purge(TTL);
        assert_eq!(l.take("p", "k", TTL, COLD), Take::Ask(COLD_LEASE));
        // A renewal's lease, and a renewal in flight, are kept.
        l.granted("p", "k", 0, TTL, 2);
        assert_eq!(l.take("p", "k", TTL / 2 + 1, RENEWING), Take::Renew(4));
        l.purge(TTL + HOT);
        l.renewed("p", "k", TTL + HOT, TTL, TTL / 2 + 1, Some(2));
        l.purge(2 * TTL + HOT - 1);
        assert_eq!(l.take("p", "k", 2 * TTL + HOT - 1, RENEWING), Take::Renew(2));
    }
}
