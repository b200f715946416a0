//! In-process GCRA buckets: the theoretical arrival time (TAT) per key, in
//! sharded maps so that concurrent checks rarely contend.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// Times are in the caller's unit (the limiter uses microseconds).
pub struct Outcome {
    pub allowed: bool,
    pub retry_after: i64,
    /// Time until the bucket is full again.
    pub reset: i64,
}

/// GCRA step: `tat` the stored arrival time (or none), `interval` = window /
/// limit; a burst of `limit` fits in `window`. Returns the outcome and the new TAT.
pub fn step(tat: Option<i64>, now: i64, interval: i64, window: i64) -> (Outcome, Option<i64>) {
    let tat = tat.unwrap_or(now).max(now);
    let new_tat = tat + interval;
    let allow_at = new_tat - window;
    if now < allow_at {
        (
            Outcome {
                allowed: false,
                retry_after: allow_at - now,
                reset: tat - now,
            },
            None,
        )
    } else {
        (
            Outcome {
                allowed: true,
                retry_after: 0,
                reset: new_tat - now,
            },
            Some(new_tat),
        )
    }
}

/// Per shard: policy -> key -> TAT, nested so that a lookup by `&str`
/// allocates nothing (only a new key does).
type Shard = HashMap<&'static str, HashMap<Box<str>, i64>>;

pub struct LocalBuckets {
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for LocalBuckets {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalBuckets {
    pub fn new() -> Self {
        LocalBuckets {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        }
    }

    pub fn take(&self, policy: &'static str, key: &str, now: i64, interval: i64, window: i64) -> Outcome {
        let mut h = self.hasher.build_hasher();
        policy.hash(&mut h);
        key.hash(&mut h);
        let shard = &self.shards[h.finish() as usize % SHARDS];
        let mut map = shard.lock().expect("bucket lock");
        let keys = map.entry(policy).or_default();
        match keys.get_mut(key) {
            Some(tat) => {
                let (outcome, new_tat) = step(Some(*tat), now, interval, window);
                if let Some(t) = new_tat {
                    *tat = t;
                }
                outcome
            }
            None => {
                let (outcome, new_tat) = step(None, now, interval, window);
                if let Some(t) = new_tat {
                    keys.insert(key.into(), t);
                }
                outcome
            }
        }
    }

    /// Forgets buckets that are full again (TAT in the past).
    pub fn purge(&self, now: i64) {
        for shard in &self.shards {
            let mut map = shard.lock().expect("bucket lock");
            for keys in map.values_mut() {
                keys.retain(|_, tat| *tat > now);
            }
            map.retain(|_, keys| !keys.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_steady_rate() {
        // 3 per 3000 ms: interval 1000.
        let mut tat = None;
        for i in 0..3 {
            let (o, t) = step(tat, 0, 1000, 3000);
            assert!(o.allowed, "request {i}");
            tat = t;
        }
        let (o, t) = step(tat, 0, 1000, 3000);
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 1000);
        assert_eq!(o.reset, 3000);
        assert!(t.is_none());
        // One token back after one interval.
        let (o, t) = step(tat, 1000, 1000, 3000);
        assert!(o.allowed);
        assert!(!step(t, 1000, 1000, 3000).0.allowed);
    }

    #[test]
    fn local_buckets_purge() {
        let b = LocalBuckets::new();
        assert!(b.take("p", "k", 0, 1000, 1000).allowed);
        assert!(!b.take("p", "k", 0, 1000, 1000).allowed);
        b.purge(5000);
        assert!(b.take("p", "k", 0, 1000, 1000).allowed);
    }
}
