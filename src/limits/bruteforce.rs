//! Brute-force protection per account, as a pure state machine (`now` in ms
//! passed in), in the spirit of kanidm's softlock.
//!
//! ```text
//!             failure (n < FREE)                 failure (FREE <= n < LOCK_AT)
//!   CLEAR ------------------------> COUNTING ----------------------------------> DELAYED
//!     ^                               |   ^       blocked for 2^(n-FREE) s (<= 60 s)  |
//!     |            success            |   +---------------- wait ---------------------+
//!     +-------------------------------+                                              |
//!     |            idle RESET_AFTER                      failure (n >= LOCK_AT)      v
//!     +------------------------------------------------------------------------- LOCKED
//!                                                         blocked LOCK_MS, bounded
//! ```
//! The key is the normalised email whether or not an account exists, so the
//! answers never tell whether it does. The lock is bounded (15 minutes), and
//! per-IP rate limits come first, so one attacker cannot keep a victim out.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::cache::RedisHandle;
use crate::store::now_ms;

/// Consecutive failures allowed without delay.
pub const FREE: u32 = 5;
/// Failures that lock the account.
pub const LOCK_AT: u32 = 20;
pub const MAX_DELAY_MS: i64 = 60_000;
pub const LOCK_MS: i64 = 15 * 60_000;
/// A quiet period after which the count starts over.
pub const RESET_AFTER_MS: i64 = 15 * 60_000;

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

    pub fn record_failure(self, now: i64) -> Softlock {
        let failures = if now - self.last_failure > RESET_AFTER_MS {
            1
        } else {
            self.failures + 1
        };
        let blocked_until = if failures >= LOCK_AT {
            now + LOCK_MS
        } else if failures >= FREE {
            now + (1000i64 << (failures - FREE).min(16)).min(MAX_DELAY_MS)
        } else {
            0
        };
        Softlock {
            failures,
            last_failure: now,
            blocked_until,
        }
    }

    pub fn is_locked(&self) -> bool {
        self.failures >= LOCK_AT
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

/// Softlock states, in process or in Redis (read-modify-write: under a
/// concurrent burst a few extra attempts may be counted late, never lost
/// entirely; per-IP and per-account rate limits bound such bursts).
pub struct BruteForce {
    enabled: bool,
    local: Mutex<HashMap<String, Softlock>>,
    redis: Option<RedisHandle>,
}

impl BruteForce {
    pub fn new(enabled: bool, redis: Option<RedisHandle>) -> Self {
        BruteForce {
            enabled,
            local: Mutex::new(HashMap::new()),
            redis,
        }
    }

    async fn load(&self, account: &str) -> Softlock {
        if let Some(r) = &self.redis {
            let key = r.key(&format!("bf:{{{account}}}"));
            match r
                .run("bruteforce_get", |mut c| async move {
                    redis::cmd("GET")
                        .arg(&key)
                        .query_async::<Option<String>>(&mut c)
                        .await
                })
                .await
            {
                Ok(v) => return v.as_deref().and_then(Softlock::decode).unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %e, "brute-force state unavailable in Redis; using local state")
                }
            }
        }
        self.local
            .lock()
            .expect("softlock")
            .get(account)
            .copied()
            .unwrap_or_default()
    }

    async fn save(&self, account: &str, s: Option<Softlock>) {
        if let Some(r) = &self.redis {
            let key = r.key(&format!("bf:{{{account}}}"));
            let res = r
                .run("bruteforce_set", |mut c| async move {
                    match s {
                        Some(s) => {
                            redis::cmd("SET")
                                .arg(&key)
                                .arg(s.encode())
                                .arg("PX")
                                .arg(RESET_AFTER_MS.max(LOCK_MS) + MAX_DELAY_MS)
                                .query_async::<()>(&mut c)
                                .await
                        }
                        None => redis::cmd("DEL").arg(&key).query_async::<()>(&mut c).await,
                    }
                })
                .await;
            if res.is_ok() {
                return;
            }
        }
        let mut local = self.local.lock().expect("softlock");
        match s {
            Some(s) => local.insert(account.to_string(), s),
            None => local.remove(account),
        };
    }

    /// `Err(retry_after_secs)` when the account may not try now.
    pub async fn check(&self, account: &str) -> Result<(), u64> {
        if !self.enabled {
            return Ok(());
        }
        self.load(account)
            .await
            .check(now_ms())
            .map_err(|ms| (ms.max(0) as u64).div_ceil(1000).max(1))
    }

    pub async fn failure(&self, account: &str) {
        if !self.enabled {
            return;
        }
        let s = self.load(account).await.record_failure(now_ms());
        if s.failures == LOCK_AT {
            metrics::counter!("latchkey_bruteforce_locks_total").increment(1);
            tracing::warn!("account locked after repeated failed logins");
        }
        self.save(account, Some(s)).await;
    }

    pub async fn success(&self, account: &str) {
        if !self.enabled {
            return;
        }
        if self.load(account).await != Softlock::default() {
            self.save(account, None).await;
        }
    }

    /// Forgets local states that have gone quiet.
    pub fn purge(&self) {
        let now = now_ms();
        self.local
            .lock()
            .expect("softlock")
            .retain(|_, s| now - s.last_failure <= RESET_AFTER_MS || now < s.blocked_until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_failures_then_growing_delays_then_lock() {
        let mut s = Softlock::default();
        let mut now = 1_000_000;
        for _ in 1..FREE {
            s = s.record_failure(now);
            assert_eq!(s.check(now), Ok(()));
        }
        let mut last_delay = 0;
        for n in FREE..LOCK_AT {
            s = s.record_failure(now);
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
        s = s.record_failure(now);
        assert!(s.is_locked());
        assert_eq!(s.check(now), Err(LOCK_MS));
        assert_eq!(s.check(now + LOCK_MS - 1), Err(1));
        assert_eq!(s.check(now + LOCK_MS), Ok(()), "the lock is bounded");
    }

    #[test]
    fn first_delayed_failure_waits_one_second() {
        let mut s = Softlock::default();
        for _ in 0..FREE {
            s = s.record_failure(0);
        }
        assert_eq!(s.check(0), Err(1000));
    }

    #[test]
    fn quiet_period_starts_over() {
        let mut s = Softlock::default();
        for _ in 0..FREE + 2 {
            s = s.record_failure(0);
        }
        let later = RESET_AFTER_MS + 1;
        s = s.record_failure(later);
        assert_eq!(s.failures, 1);
        assert_eq!(s.check(later), Ok(()));
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
