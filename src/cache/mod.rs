//! What lives in memory (and, when configured, in Redis): the revocation set
//! that every validation consults, the user cache, and the Redis connection.

pub mod fetch;
mod redis;
mod revocations;
mod users;

pub use self::redis::{RedisConfig, RedisFailure, RedisHandle, COMMAND_TIMEOUT as REDIS_COMMAND_TIMEOUT};
pub use revocations::{PolledRevocations, Revocations};
pub use users::UserCache;

use quick_cache::{sync::Cache, DefaultHashBuilder, Lifecycle, UnitWeighter};

/// Counts evictions of a bounded cache as `latchkey_cache_evictions_total{cache}`.
#[derive(Clone, Copy)]
pub struct CountEvictions(pub &'static str);

impl<K, V> Lifecycle<K, V> for CountEvictions {
    type RequestState = ();

    fn begin_request(&self) {}

    fn on_evict(&self, _: &mut (), _: K, _: V) {
        metrics::counter!("latchkey_cache_evictions_total", "cache" => self.0).increment(1);
    }
}

/// A bounded concurrent cache whose evictions are counted under `name`.
pub type BoundedCache<K, V> = Cache<K, V, UnitWeighter, DefaultHashBuilder, CountEvictions>;

pub fn bounded_cache<K, V>(capacity: usize, name: &'static str) -> BoundedCache<K, V>
where
    K: Eq + std::hash::Hash + Clone,
    V: Clone,
{
    Cache::with(
        capacity,
        capacity as u64,
        UnitWeighter,
        DefaultHashBuilder::default(),
        CountEvictions(name),
    )
}
