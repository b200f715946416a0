//! What lives in memory (and, when configured, in Redis): the revocation set
//! that every validation consults, the user cache, and the Redis connection.

mod redis;
mod revocations;
mod users;

pub use self::redis::RedisHandle;
pub use revocations::Revocations;
pub use users::UserCache;
