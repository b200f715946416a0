//! Users by email, cached in process for a short time. Every change to a user
//! drops its entry here and, through `Revocations`' channel, on every other
//! instance, so a stale password hash cannot outlive a password change.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{bounded_cache, BoundedCache};

use crate::store::UserRecord;

pub struct UserCache {
    entries: BoundedCache<String, (Arc<UserRecord>, Instant)>,
    ttl: Duration,
}

impl UserCache {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        UserCache {
            entries: bounded_cache(capacity, "users"),
            ttl,
        }
    }

    pub fn get(&self, email: &str) -> Option<Arc<UserRecord>> {
        match self.entries.get(email) {
            Some((u, at)) if at.elapsed() < self.ttl => {
                metrics::counter!("latchkey_user_cache_hits_total").increment(1);
                Some(u)
            }
            _ => {
                metrics::counter!("latchkey_user_cache_misses_total").increment(1);
                None
            }
        }
    }

    pub fn put(&self, user: Arc<UserRecord>) {
        self.entries.insert(user.email.clone(), (user, Instant::now()));
    }

    pub fn forget(&self, email: &str) {
        self.entries.remove(email);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
