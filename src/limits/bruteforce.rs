//! Brute-force protection per account, as a pure state machine (`now` in ms
//! passed in), in the spirit of kanidm's softlock.
//!
//! ```text
//!             failure (n < free)                 failure (free <= n < lock_at)
//!   CLEAR ------------------------> COUNTING ----------------------------------> DELAYED
//!     ^                               |   ^  blocked 2^(n-free) s (<= max_delay_ms)  |
//!     |            success            |   +---------------- wait ---------------------+
//!     +-------------------------------+                                              |
//!     |            idle reset_after_ms                   failure (n >= lock_at)      v
//!     +------------------------------------------------------------------------- LOCKED
//!                                                         blocked lock_ms, bounded
//! ```
//! One state machine, three uses, each with its own [`Rules`]:
//! [`BruteForce`] keeps one state per account and client address (an
//! attacker's failures delay and lock that address only) and one per
//! account over all addresses (a far higher threshold, delays and no lock,
//! skipped by addresses the account logged in from), and the code endpoints
//! keep one per client address over all accounts ([`Rules::CODE_GUESSES`]).
//! Keys are the normalised email whether or not an account exists, so the
//! answers never tell whether it does. A lock is bounded (15 minutes by
//! default, an hour at most). The thresholds are set by the `brute_force_*`
//! settings; docs/security.md has the figures and the trade-off.
//!
//! **Attempts count before the password is checked.** [`Softlock::begin`]
//! admits an attempt and records it as a failure in one atomic step;
//! a right password then clears the state (`success`), and an attempt that
//! never reached a verdict (the hashing pool shed it) is taken back
//! (`abandon`). Counting afterwards would let parallel requests through the
//! rules: 60 guesses sent at once would all pass the check before the first
//! failure was recorded. Atomic means: under the process's lock in memory,
//! and a compare-and-set script in Redis (the state machine stays here, in
//! Rust, in one place; the script only swaps values).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::cache::RedisHandle;
use crate::clock::now_ms;

/// The thresholds of the state machine (settings `brute_force_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Consecutive failures allowed without delay.
    pub free: u32,
    /// Failures that lock the account (more than `free`).
    pub lock_at: u32,
    /// The longest delay between two failures before the lock.
    pub max_delay_ms: i64,
    /// How long a lock lasts.
    pub lock_ms: i64,
    /// A quiet period after which the count starts over.
    pub reset_after_ms: i64,
}

impl Rules {
    /// Per account and address.
    pub const DEFAULT: Rules = Rules {
        free: 5,
        lock_at: 20,
        max_delay_ms: 60_000,
        lock_ms: 15 * 60_000,
        reset_after_ms: 15 * 60_000,
    };

    /// Per account over every address: delays only, never a lock; the
    /// count fades only after a quiet day, so that pausing does not buy an
    /// attacker a fresh allowance every few minutes.
    pub const ACCOUNT_DEFAULT: Rules = Rules {
        free: 100,
        lock_at: u32::MAX,
        max_delay_ms: 60_000,
        lock_ms: 60_000,
        reset_after_ms: 86_400_000,
    };

    /// Wrong one-time codes per client address, over every account: mass
    /// guessing of codes from one address stops after a few dozen tries.
    pub const CODE_GUESSES: Rules = Rules {
        free: 10,
        lock_at: 30,
        max_delay_ms: 60_000,
        lock_ms: 15 * 60_000,
        reset_after_ms: 15 * 60_000,
    };

    /// How long a state is kept in Redis: past it, it would be CLEAR anyway.
    fn state_ttl_ms(&self) -> i64 {
        self.reset_after_ms.max(self.lock_ms) + self.max_delay_ms
    }
}
/// Compare-and-set rounds before an attempt is refused as contended.
const CAS_ROUNDS: usize = 16;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Softlock {
    pub failures: u32,
    pub last_failure: i64,
    pub blocked_until: i64,
}

impl Softlock {
    /// `Err(retry_after_ms)` while blocked.
    pub fn check(&self, now: i64) -> Result<(), i64> {
        if now < self.blocked_until {
            Err(self.blocked_until - now)
        } else {
            Ok(())
        }
    }

    pub fn record_failure(self, now: i64, rules: &Rules) -> Softlock {
        let failures = if now - self.last_failure > rules.reset_after_ms {
            1
        } else {
            self.failures.saturating_add(1)
        };
        let blocked_until = if failures >= rules.lock_at {
            now + rules.lock_ms
        } else if failures >= rules.free {
            now + (1000i64 << (failures - rules.free).min(16)).min(rules.max_delay_ms)
        } else {
            0
        };
        Softlock {
            failures,
            last_failure: now,
            blocked_until,
        }
    }

    /// Admits an attempt, counted as a failure until it proves otherwise
    /// (`Err(retry_after_ms)` while blocked, and then nothing changes).
    pub fn begin(self, now: i64, rules: &Rules) -> Result<Softlock, i64> {
        self.check(now)?;
        Ok(self.record_failure(now, rules))
    }

    /// Takes back an attempt that never reached a verdict. The count drops by
    /// one; a delay or lock already set stays (it may have come from a real
    /// failure in between), so taking back is never a way around the rules.
    pub fn abandon(self) -> Softlock {
        Softlock {
            failures: self.failures.saturating_sub(1),
            ..self
        }
    }

    pub fn is_locked(&self, rules: &Rules) -> bool {
        self.failures >= rules.lock_at
    }

    fn encode(&self) -> String {
        format!("{}:{}:{}", self.failures, self.last_failure, self.blocked_until)
    }

    fn decode(s: &str) -> Option<Softlock> {
        let mut it = s.split(':').map(|p| p.parse::<i64>().ok());
        Some(Softlock {
            failures: it.next()?? as u32,
            last_failure: it.next()??,
            blocked_until: it.next()??,
        })
    }
}

/// Replaces KEYS[1] by ARGV[2] (deletes it when ARGV[2] is empty; PX ARGV[3])
/// only if it still holds ARGV[1] (empty: absent). Returns `{1, ""}`, or `{0,
/// current value}` so that the caller can compute again from it.
const CAS_SCRIPT: &str = r#"
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return {0, cur} end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return {1, ''}
"#;

/// Softlock states by key, in process or in Redis; every transition is
/// atomic (see the module documentation).
pub struct Softlocks {
    enabled: bool,
    local: Mutex<HashMap<String, Softlock>>,
    redis: Option<RedisHandle>,
    cas: redis::Script,
}

impl Softlocks {
    pub fn new(enabled: bool, redis: Option<RedisHandle>) -> Self {
        Softlocks {
            enabled,
            local: Mutex::new(HashMap::new()),
            redis,
            cas: redis::Script::new(CAS_SCRIPT),
        }
    }

    /// Applies `step` to the state of `key` atomically and returns what it
    /// says. `step` gives the new state (`None`: clear) and the answer; it
    /// may run more than once (Redis: when another instance changed the
    /// state meanwhile). `contended` is the answer when Redis keeps changing
    /// under us; Redis unreachable: this process's state (logged).
    async fn transition<T: Copy>(
        &self,
        key: &str,
        rules: &Rules,
        contended: T,
        step: impl Fn(Softlock) -> (Option<Softlock>, T),
    ) -> T {
        if let Some(r) = &self.redis {
            match self.transition_redis(r, key, rules, contended, &step).await {
                Ok(out) => return out,
                Err(e) => {
                    tracing::warn!(error = %e, "brute-force state unavailable in Redis; using local state")
                }
            }
        }
        let mut local = self.local.lock().expect("softlock");
        let cur = local.get(key).copied().unwrap_or_default();
        let (new, out) = step(cur);
        match new {
            Some(s) if s != cur => {
                local.insert(key.to_string(), s);
            }
            Some(_) => {}
            None => {
                local.remove(key);
            }
        }
        out
    }

    async fn transition_redis<T: Copy>(
        &self,
        r: &RedisHandle,
        key: &str,
        rules: &Rules,
        contended: T,
        step: &impl Fn(Softlock) -> (Option<Softlock>, T),
    ) -> Result<T, crate::cache::RedisFailure> {
        let key = r.key(&format!("bf:{key}"));
        // First guess: no state (the common case, one round trip); a miss
        // returns the current value to compute from.
        let mut current = String::new();
        let mut known = false;
        for _ in 0..CAS_ROUNDS {
            let state = if current.is_empty() {
                Softlock::default()
            } else {
                Softlock::decode(&current).unwrap_or_default()
            };
            let (new, out) = step(state);
            let next = new.filter(|s| *s != Softlock::default()).map(|s| s.encode());
            if known && next.as_deref().unwrap_or("") == current {
                return Ok(out);
            }
            let (cas, key, expected, ttl) = (&self.cas, &key, &current, rules.state_ttl_ms());
            let next = next.unwrap_or_default();
            let (swapped, actual) = r
                .run("bruteforce", |mut c| async move {
                    cas.key(key)
                        .arg(expected)
                        .arg(&next)
                        .arg(ttl)
                        .invoke_async::<(i64, String)>(&mut c)
                        .await
                })
                .await?;
            if swapped == 1 {
                return Ok(out);
            }
            current = actual;
            known = true;
        }
        tracing::warn!("brute-force state contended; attempt refused");
        Ok(contended)
    }

    /// Admits one attempt under `rules`, counted as a failure until it is
    /// cleared or taken back; `Err(retry_after_ms)` while blocked. `Ok` carries
    /// the failures counted so far.
    pub async fn begin(&self, key: &str, rules: &Rules) -> Result<u32, i64> {
        if !self.enabled {
            return Ok(0);
        }
        let now = now_ms();
        self.transition(key, rules, Err(1000), |s| match s.begin(now, rules) {
            Ok(next) => (Some(next), Ok(next.failures)),
            Err(ms) => (Some(s), Err(ms)),
        })
        .await
    }

    /// The count starts over (a right password).
    pub async fn clear(&self, key: &str) {
        if !self.enabled {
            return;
        }
        if !self.delete_in_redis(&format!("bf:{key}")).await {
            self.local.lock().expect("softlock").remove(key);
        }
    }

    /// Clears every state whose key is `group` or starts with `group:` (an
    /// account's own and one per address), here and in Redis (by `SCAN`:
    /// an administrator's rare call, never a request's).
    pub async fn clear_group(&self, group: &str) {
        if !self.enabled {
            return;
        }
        let pairs = format!("{group}:");
        self.local
            .lock()
            .expect("softlock")
            .retain(|k, _| k != group && !k.starts_with(&pairs));
        let Some(r) = &self.redis else { return };
        // Redis glob: `*`, `?`, `[`, `]` and `\` stand for themselves when escaped.
        let mut escaped = String::with_capacity(group.len());
        for c in group.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        let own = r.key(&format!("bf:{group}"));
        let pattern = r.key(&format!("bf:{escaped}:*"));
        let res = r
            .run("bruteforce_clear", |mut c| async move {
                let mut doomed = vec![own.clone()];
                let mut cursor: u64 = 0;
                loop {
                    let scan = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .clone();
                    // The group's keys share its hash tag: one node holds them all.
                    let (next, keys): (u64, Vec<String>) = c.query_at(&own, &scan).await?;
                    doomed.extend(keys);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
                redis::cmd("DEL").arg(&doomed).query_async::<()>(&mut c).await
            })
            .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "clearing brute-force state in Redis failed");
        }
    }

    /// Deletes `suffix` (under the key prefix) in Redis; `false` without
    /// Redis or when it cannot be asked (the caller then uses local state).
    async fn delete_in_redis(&self, suffix: &str) -> bool {
        let Some(r) = &self.redis else { return false };
        let key = r.key(suffix);
        let res = r
            .run("bruteforce", |mut c| async move {
                redis::cmd("DEL").arg(&key).query_async::<()>(&mut c).await
            })
            .await;
        if let Err(e) = &res {
            tracing::warn!(error = %e, "brute-force state unavailable in Redis; using local state");
        }
        res.is_ok()
    }

    /// Takes back one attempt that never reached a verdict (or that proved
    /// right where a success must not wipe the count).
    pub async fn abandon(&self, key: &str, rules: &Rules) {
        if !self.enabled {
            return;
        }
        self.transition(key, rules, (), |s| (Some(s.abandon()), ())).await
    }

    /// Forgets local states that have gone quiet under `rules`' longest period.
    fn purge(&self, longest: &Rules) {
        let (now, reset) = (now_ms(), longest.reset_after_ms);
        self.local
            .lock()
            .expect("softlock")
            .retain(|_, s| now - s.last_failure <= reset || now < s.blocked_until);
    }
}

/// How long a successful login makes its address "known" for the account.
pub const KNOWN_ADDRESS_MS: i64 = 30 * 86_400_000;

/// An admitted login attempt: what [`BruteForce::abandon`] must take back.
#[must_use]
#[derive(Clone, Copy, Debug)]
pub struct Attempt {
    account_counted: bool,
    /// This attempt, if it fails, locks the account for its address.
    locks: bool,
}

impl Attempt {
    /// Whether this attempt, should it fail, is the one that locks the
    /// account for its address.
    pub fn locks(&self) -> bool {
        self.locks
    }

    /// Whether it counted on the account-wide level (it did not for a known
    /// address while that level was delaying).
    pub fn counted_for_account(&self) -> bool {
        self.account_counted
    }
}

/// Brute-force protection of password logins, keyed twice:
///
/// - per account **and client address** (`rules`): one address gets a few
///   free failures, then growing delays, then a bounded lock, for that
///   address only, so an attacker locks out nobody but themselves;
/// - per account over all addresses (`account_rules`): a much higher
///   threshold with growing delays and no lock, which caps guessing spread
///   over many addresses. An address from which the verified account logged
///   in within [`KNOWN_ADDRESS_MS`] skips this one, so a distributed attack
///   does not keep the owner out of their usual network either. The known
///   addresses of an email are forgotten whenever its mailbox is proven
///   again (verification, password reset): they belong to the owner who
///   earned them, never to whoever held the email before.
///
/// Keys are the normalised email whether or not an account exists, so the
/// answers never tell whether it does; in Redis the keys of an account share
/// one hash slot (`{email}`), and its known addresses are one hash.
pub struct BruteForce {
    rules: Rules,
    account_rules: Rules,
    states: Softlocks,
    /// Email -> (address -> until, ms), when there is no Redis.
    known: Mutex<HashMap<String, HashMap<String, i64>>>,
}

impl BruteForce {
    pub fn new(enabled: bool, rules: Rules, account_rules: Rules, redis: Option<RedisHandle>) -> Self {
        BruteForce {
            rules,
            account_rules,
            states: Softlocks::new(enabled, redis),
            known: Mutex::new(HashMap::new()),
        }
    }

    /// `{<digest of the account>}`: the hash tag of every key of one
    /// account, so that they share a slot of a Redis Cluster (an email's own
    /// characters could hold a `}`, which would end the tag early, or none).
    /// Redis keys then name no email either.
    fn tag(account: &str) -> String {
        let digest = crate::crypto::sha256(account.as_bytes());
        format!("{{{}}}", crate::crypto::hex(&digest[..16]))
    }

    fn pair_key(account: &str, client: &str) -> String {
        format!("{}:{client}", Self::tag(account))
    }

    fn account_key(account: &str) -> String {
        Self::tag(account)
    }

    /// Admits one attempt for `account` from `client` (an address key) and
    /// counts it as a failure until `success` or `abandon`;
    /// `Err(retry_after_secs)` when it may not try now.
    pub async fn begin(&self, account: &str, client: &str) -> Result<Attempt, u64> {
        let secs = |ms: i64| (ms.max(0) as u64).div_ceil(1000).max(1);
        let pair = Self::pair_key(account, client);
        let failures = self.states.begin(&pair, &self.rules).await.map_err(secs)?;
        let locks = failures == self.rules.lock_at;
        if locks {
            metrics::counter!("latchkey_bruteforce_locks_total").increment(1);
            tracing::warn!("account locked for one address after repeated failed logins");
        }
        match self
            .states
            .begin(&Self::account_key(account), &self.account_rules)
            .await
        {
            Ok(_) => Ok(Attempt {
                account_counted: true,
                locks,
            }),
            Err(_) if self.is_known(account, client).await => Ok(Attempt {
                account_counted: false,
                locks,
            }),
            Err(ms) => {
                metrics::counter!("latchkey_bruteforce_account_delays_total").increment(1);
                self.states.abandon(&pair, &self.rules).await;
                Err(secs(ms))
            }
        }
    }

    /// The attempt had the right password: this address starts over, and
    /// becomes known for the account if the login succeeds (`verified`: a
    /// right password of an unverified account, which anyone may have set,
    /// earns nothing). The account-wide count is only taken back by one: it
    /// fades with quiet time, so that a success of the owner in the middle
    /// of a distributed attack does not give the attackers a fresh allowance.
    pub async fn success(&self, account: &str, client: &str, attempt: Attempt, verified: bool) {
        self.states.clear(&Self::pair_key(account, client)).await;
        if attempt.account_counted {
            self.states
                .abandon(&Self::account_key(account), &self.account_rules)
                .await;
        }
        if verified {
            self.remember(account, client).await;
        }
    }

    /// The attempt never reached a verdict (shed, or an internal error): it
    /// no longer counts.
    pub async fn abandon(&self, account: &str, client: &str, attempt: Attempt) {
        self.states
            .abandon(&Self::pair_key(account, client), &self.rules)
            .await;
        if attempt.account_counted {
            self.states
                .abandon(&Self::account_key(account), &self.account_rules)
                .await;
        }
    }

    /// The owner proved the mailbox (a password reset): both counts of this
    /// address start over, and the addresses known before are forgotten.
    pub async fn reset(&self, account: &str, client: &str) {
        self.states.clear(&Self::pair_key(account, client)).await;
        self.states.clear(&Self::account_key(account)).await;
        self.forget_known(account).await;
    }

    /// Lifts every lock and delay of `account`, for every address (an
    /// administrator's unlock). Known addresses stay known.
    pub async fn unlock(&self, account: &str) {
        self.states.clear_group(&Self::account_key(account)).await;
    }

    /// Forgets every known address of `account` (its mailbox was proven by
    /// someone who may not be who logged in before).
    pub async fn forget_known(&self, account: &str) {
        if !self.states.delete_in_redis(&Self::known_key(account)).await {
            self.known.lock().expect("known addresses").remove(account);
        }
    }

    fn known_key(account: &str) -> String {
        format!("bf:{}:known", Self::tag(account))
    }

    async fn remember(&self, account: &str, client: &str) {
        let until = now_ms() + KNOWN_ADDRESS_MS;
        if let Some(r) = &self.states.redis {
            let key = r.key(&Self::known_key(account));
            let res = r
                .run("bruteforce", |mut c| async move {
                    redis::pipe()
                        .hset(&key, client, until)
                        .ignore()
                        .pexpire(&key, KNOWN_ADDRESS_MS)
                        .ignore()
                        .query_async::<()>(&mut c)
                        .await
                })
                .await;
            if res.is_ok() {
                return;
            }
        }
        if self.states.enabled {
            let mut known = self.known.lock().expect("known addresses");
            known
                .entry(account.to_string())
                .or_default()
                .insert(client.to_string(), until);
        }
    }

    pub async fn is_known(&self, account: &str, client: &str) -> bool {
        let now = now_ms();
        if let Some(r) = &self.states.redis {
            let key = r.key(&Self::known_key(account));
            let res = r
                .run("bruteforce", |mut c| async move {
                    redis::cmd("HGET")
                        .arg(&key)
                        .arg(client)
                        .query_async::<Option<i64>>(&mut c)
                        .await
                })
                .await;
            if let Ok(until) = res {
                return until.is_some_and(|u| now < u);
            }
        }
        let known = self.known.lock().expect("known addresses");
        known
            .get(account)
            .and_then(|m| m.get(client))
            .is_some_and(|&until| now < until)
    }

    /// Forgets local states that have gone quiet, and known addresses that expired.
    pub fn purge(&self) {
        let longest = if self.account_rules.reset_after_ms > self.rules.reset_after_ms {
            &self.account_rules
        } else {
            &self.rules
        };
        self.states.purge(longest);
        let now = now_ms();
        let mut known = self.known.lock().expect("known addresses");
        for addresses in known.values_mut() {
            addresses.retain(|_, &mut until| now < until);
        }
        known.retain(|_, addresses| !addresses.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Rules = Rules::DEFAULT;
    const FREE: u32 = R.free;
    const LOCK_AT: u32 = R.lock_at;
    const MAX_DELAY_MS: i64 = R.max_delay_ms;
    const LOCK_MS: i64 = R.lock_ms;
    const RESET_AFTER_MS: i64 = R.reset_after_ms;

    #[test]
    fn every_key_of_an_account_shares_one_hash_tag_whatever_its_email_holds() {
        for account in ["ada@example.com", "}x@example.com", "{a}b@example.com", "@"] {
            let tag = BruteForce::tag(account);
            assert_eq!(tag.len(), 34);
            let keys = [
                BruteForce::account_key(account),
                BruteForce::pair_key(account, "10.0.0.1"),
                BruteForce::known_key(account),
            ];
            for k in keys {
                // Redis hashes the text between the first `{` and the next `}`.
                let open = k.find('{').unwrap();
                let close = open + k[open..].find('}').unwrap();
                assert_eq!(&k[open..=close], tag, "{k}");
                assert!(!k.contains(account), "{k} names the email");
            }
        }
        assert_ne!(BruteForce::tag("a@b"), BruteForce::tag("a@c"));
    }

    #[test]
    fn free_failures_then_growing_delays_then_lock() {
        let mut s = Softlock::default();
        let mut now = 1_000_000;
        for _ in 1..FREE {
            s = s.record_failure(now, &R);
            assert_eq!(s.check(now), Ok(()));
        }
        let mut last_delay = 0;
        for n in FREE..LOCK_AT {
            s = s.record_failure(now, &R);
            assert_eq!(s.failures, n);
            let delay = s.check(now).unwrap_err();
            assert!(
                delay >= last_delay && delay <= MAX_DELAY_MS,
                "n={n} delay={delay}"
            );
            assert_eq!(s.check(now + delay), Ok(()), "the delay ends on time");
            last_delay = delay;
            now += delay;
        }
        assert_eq!(FREE, 5);
        s = s.record_failure(now, &R);
        assert!(s.is_locked(&R));
        assert_eq!(s.check(now), Err(LOCK_MS));
        assert_eq!(s.check(now + LOCK_MS - 1), Err(1));
        assert_eq!(s.check(now + LOCK_MS), Ok(()), "the lock is bounded");
    }

    #[test]
    fn first_delayed_failure_waits_one_second() {
        let mut s = Softlock::default();
        for _ in 0..FREE {
            s = s.record_failure(0, &R);
        }
        assert_eq!(s.check(0), Err(1000));
    }

    #[test]
    fn quiet_period_starts_over() {
        let mut s = Softlock::default();
        for _ in 0..FREE + 2 {
            s = s.record_failure(0, &R);
        }
        let later = RESET_AFTER_MS + 1;
        s = s.record_failure(later, &R);
        assert_eq!(s.failures, 1);
        assert_eq!(s.check(later), Ok(()));
    }

    #[test]
    fn attempts_count_before_the_verdict() {
        let s = Softlock::default().begin(0, &R).unwrap();
        assert_eq!(s.failures, 1, "an admitted attempt counts at once");
        // Taken back when it never reached a verdict.
        assert_eq!(s.abandon(), Softlock { failures: 0, ..s });
        // Parallel attempts at one instant: exactly FREE are admitted, then
        // the delay holds, however many arrive.
        let mut s = Softlock::default();
        let admitted = (0..100)
            .filter(|_| match s.begin(7, &R) {
                Ok(next) => {
                    s = next;
                    true
                }
                Err(_) => false,
            })
            .count();
        assert_eq!(admitted, FREE as usize);
        assert_eq!(s.begin(7, &R), Err(1000), "a refused attempt changes nothing");
    }

    #[test]
    fn abandon_never_lifts_a_delay_or_a_lock() {
        let mut s = Softlock::default();
        for _ in 0..LOCK_AT {
            s = s.record_failure(0, &R);
        }
        let a = s.abandon();
        assert_eq!(a.failures, LOCK_AT - 1);
        assert_eq!(a.check(0), Err(LOCK_MS), "the lock stays");
        assert_eq!(Softlock::default().abandon(), Softlock::default());
    }

    #[test]
    fn configured_rules_are_followed() {
        let r = Rules {
            free: 2,
            lock_at: 3,
            max_delay_ms: 1_000,
            lock_ms: 3_000,
            reset_after_ms: 60_000,
        };
        let s = Softlock::default().begin(0, &r).unwrap();
        assert_eq!(s.check(0), Ok(()), "one free failure");
        let s = s.begin(0, &r).unwrap();
        assert_eq!(s.check(0), Err(1_000), "then a delay");
        assert_eq!(s.begin(999, &r), Err(1));
        let s = s.begin(1_000, &r).unwrap();
        assert!(s.is_locked(&r));
        assert_eq!(s.check(1_000), Err(3_000));
        assert_eq!(s.check(3_999), Err(1));
        assert_eq!(s.check(4_000), Ok(()), "the lock ends on time");
        assert_eq!(s.record_failure(64_001, &r).failures, 1, "quiet period");
        // Delays grow up to max_delay_ms and no further.
        let r = Rules {
            lock_at: 100,
            max_delay_ms: 1_500,
            ..r
        };
        let mut s = Softlock::default();
        for _ in 0..10 {
            s = s.record_failure(0, &r);
        }
        assert_eq!(s.check(0), Err(1_500));
    }

    /// Every sequence of up to 7 steps (attempt with a wrong password, a
    /// right one, one shed before the verdict; 1 s, 61 s or the quiet period
    /// passing): the rules hold whatever the order, with the default rules
    /// and with short ones (lock after the first delay).
    #[test]
    fn every_short_sequence_keeps_the_rules() {
        every_short_sequence_keeps(&R);
        every_short_sequence_keeps(&Rules {
            free: 1,
            lock_at: 2,
            max_delay_ms: 1_000,
            lock_ms: 5_000,
            reset_after_ms: 60_000,
        });
    }

    fn every_short_sequence_keeps(r: &Rules) {
        #[derive(Clone, Copy, Debug)]
        enum Step {
            Wrong,
            Right,
            Shed,
            Wait(i64),
        }
        let steps = [
            Step::Wrong,
            Step::Right,
            Step::Shed,
            Step::Wait(1_000),
            Step::Wait(61_000),
            Step::Wait(r.reset_after_ms + 1),
        ];
        let mut seq = vec![0usize; 7];
        loop {
            let (mut s, mut now) = (Softlock::default(), 1_000_000i64);
            // Attempts admitted (wrong or shed) since the last right password.
            let mut since_right = 0u32;
            for &i in &seq {
                let before = s;
                match steps[i] {
                    Step::Wait(ms) => now += ms,
                    step => match s.begin(now, r) {
                        Err(retry) => {
                            assert!(retry > 0 && retry <= r.lock_ms, "{seq:?}");
                            assert!(
                                since_right >= r.free,
                                "refused after {since_right} attempts: {seq:?}"
                            );
                        }
                        Ok(next) => {
                            since_right += 1;
                            s = match step {
                                Step::Right => {
                                    since_right = 0;
                                    Softlock::default()
                                }
                                Step::Shed => {
                                    let back = next.abandon();
                                    let idle_reset = now - before.last_failure > r.reset_after_ms;
                                    let expected = if idle_reset { 0 } else { before.failures };
                                    assert_eq!(back.failures, expected, "taken back: {seq:?}");
                                    assert_eq!(back.blocked_until, next.blocked_until, "{seq:?}");
                                    back
                                }
                                _ => next,
                            };
                        }
                    },
                }
                assert!(s.failures <= since_right, "never more than the attempts: {seq:?}");
                assert!(s.blocked_until <= now + r.lock_ms, "a lock is bounded: {seq:?}");
                assert!(s.check(now + r.lock_ms).is_ok(), "every block ends: {seq:?}");
            }
            // Next sequence (odometer).
            let mut k = 0;
            while k < seq.len() {
                seq[k] += 1;
                if seq[k] < steps.len() {
                    break;
                }
                seq[k] = 0;
                k += 1;
            }
            if k == seq.len() {
                break;
            }
        }
    }

    #[test]
    fn encoding_round_trips() {
        let s = Softlock {
            failures: 7,
            last_failure: 123,
            blocked_until: 456,
        };
        assert_eq!(Softlock::decode(&s.encode()), Some(s));
        assert_eq!(Softlock::decode("garbage"), None);
    }
}
