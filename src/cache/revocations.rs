//! The revocation set: session ids whose access tokens must fail validation.
//!
//! Validation never leaves the process: it asks the local set. Keeping the
//! sets of all instances complete is this module's job:
//! - a revocation is added locally at once, and with Redis it is also added
//!   to a sorted set (`<prefix>{revocations}`, score = when it may be
//!   forgotten) and published on `<prefix>{revocations}:events`, in one
//!   pipeline (one hash tag: one node of a cluster); every instance's
//!   listener applies it
//!   (within milliseconds);
//! - a listener that (re)subscribes first reloads the sorted set, so messages
//!   missed while disconnected are not lost;
//! - at start, and every few seconds as a safety net, the set is refilled from
//!   the database (sessions revoked recently), which also covers Redis outages.
//!
//! Entries are forgotten once every token of the session has expired
//! (`retention` = access-token lifetime + leeway).
//!
//! The same channel carries "user changed" events for the user cache.
//!
//! The gateway has no database: its safety net is a poll of the service's
//! `GET /revocations` (admin listener), and [`Revocations::is_current`] says
//! whether its view can be trusted right now (subscribed to Redis, or a poll
//! answered lately), so that it can refuse tokens it cannot check.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::lifecycle::Shutdown;
use futures_util::StreamExt;

use super::RedisHandle;
use crate::clock::now_ms;
use crate::store::Store;

/// The sorted set of revoked sessions, and the channel of revocations, user
/// changes and heartbeats, under the key prefix.
const SET: &str = "{revocations}";
const CHANNEL: &str = "{revocations}:events";
/// A listener publishes a heartbeat this often and trusts its subscription
/// while its own heartbeats come back within `HEARD_WITHIN_MS`.
const HEARTBEAT: Duration = Duration::from_millis(250);
const HEARD_WITHIN_MS: i64 = 1000;

type UserListener = Box<dyn Fn(&str) + Send + Sync>;

pub struct Revocations {
    set: RwLock<HashMap<String, i64>>,
    redis: Option<RedisHandle>,
    /// Told of every "user changed" event, local or from another instance
    /// (the service's user cache forgets the user).
    user_listeners: RwLock<Vec<UserListener>>,
    retention_ms: i64,
    /// Subscribed to the Redis channel (resynced), right now.
    subscribed: AtomicBool,
    /// When this listener last heard its own heartbeat (ms): a subscription
    /// can stay open and silent (a frozen node, a node the cluster gave up).
    heard_at: AtomicI64,
    /// This process's heartbeat, told apart from the other instances'.
    instance: u64,
    /// When a poll last answered (ms), and how often polls run (0: never).
    polled_at: AtomicI64,
    poll_every_ms: AtomicI64,
}

impl Revocations {
    pub fn new(redis: Option<RedisHandle>, retention: Duration) -> Self {
        Revocations {
            set: RwLock::new(HashMap::new()),
            redis,
            user_listeners: RwLock::new(Vec::new()),
            retention_ms: retention.as_millis() as i64,
            subscribed: AtomicBool::new(false),
            heard_at: AtomicI64::new(0),
            instance: u64::from_le_bytes(crate::crypto::random_bytes()),
            polled_at: AtomicI64::new(0),
            poll_every_ms: AtomicI64::new(0),
        }
    }

    /// Whether the set can be trusted to hold every recent revocation: with
    /// no source at all there is nothing to wait for (true); otherwise the
    /// Redis subscription is up, or a poll answered within three intervals.
    pub fn is_current(&self) -> bool {
        let every = self.poll_every_ms.load(Ordering::Relaxed);
        if self.redis.is_none() && every == 0 {
            return true;
        }
        self.hears_redis(2 * HEARD_WITHIN_MS)
            || (every > 0 && now_ms() - self.polled_at.load(Ordering::Relaxed) <= 3 * every)
    }

    /// Whether revocations of other instances arrive within milliseconds:
    /// subscribed to Redis, and no Redis command failed in the last 10 s (a
    /// silent subscription to a frozen node looks alive). Otherwise the
    /// service reloads them from the database every half second.
    pub fn hears_other_instances(&self) -> bool {
        match &self.redis {
            Some(r) => self.hears_redis(HEARD_WITHIN_MS) && !r.failed_within(10_000),
            None => false,
        }
    }

    /// Subscribed, and this listener's own heartbeat came back within `ms`.
    fn hears_redis(&self, ms: i64) -> bool {
        self.subscribed.load(Ordering::Relaxed) && now_ms() - self.heard_at.load(Ordering::Relaxed) <= ms
    }

    /// Polls will come every `every`: until one answers, the view is not current.
    pub fn expect_polls(&self, every: Duration) {
        self.poll_every_ms
            .store(every.as_millis() as i64, Ordering::Relaxed);
    }

    /// Polls `url` (the service's `GET /revocations`) every `every` until
    /// shutdown: each answer adds the sessions revoked since the last one
    /// (with an overlap, so that nothing committed late is missed).
    pub async fn poll(self: Arc<Self>, url: String, every: Duration, mut shutdown: Shutdown) {
        self.expect_polls(every);
        let mut since = self.horizon();
        loop {
            let asked_at = now_ms();
            let target = format!("{url}?since={since}");
            match super::fetch::http_get(&target).await.and_then(|body| {
                let doc: PolledRevocations = serde_json::from_slice(&body)?;
                Ok(doc)
            }) {
                Ok(doc) => {
                    for (sid, revoked_at) in doc.revoked {
                        self.insert_local(&sid, revoked_at + self.retention_ms);
                    }
                    self.polled_at.store(asked_at, Ordering::Relaxed);
                    since = asked_at - 10_000;
                }
                Err(e) => {
                    metrics::counter!("latchkey_revocation_poll_failures_total").increment(1);
                    tracing::warn!(error = %e, url = %url, "polling revocations failed");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.wait() => return,
            }
        }
    }

    pub fn is_revoked(&self, session_id: &str) -> bool {
        self.set.read().expect("revocation lock").contains_key(session_id)
    }

    fn insert_local(&self, session_id: &str, forget_at: i64) {
        let mut set = self.set.write().expect("revocation lock");
        let e = set.entry(session_id.to_string()).or_insert(forget_at);
        *e = (*e).max(forget_at);
    }

    /// Revokes sessions here and, with Redis, on every instance.
    pub async fn revoke(&self, session_ids: &[String]) {
        if session_ids.is_empty() {
            return;
        }
        let forget_at = now_ms() + self.retention_ms;
        for sid in session_ids {
            self.insert_local(sid, forget_at);
        }
        metrics::counter!("latchkey_revocations_total").increment(session_ids.len() as u64);
        if let Some(r) = &self.redis {
            let mut pipe = redis::pipe();
            let (zset, channel) = (r.key(SET), r.key(CHANNEL));
            for sid in session_ids {
                pipe.zadd(&zset, sid, forget_at).ignore();
                pipe.publish(&channel, format!("s:{sid}")).ignore();
            }
            if let Err(e) = r
                .run(
                    "revoke",
                    |mut c| async move { pipe.query_async::<()>(&mut c).await },
                )
                .await
            {
                // Other instances still learn it from the database within seconds.
                tracing::warn!(error = %e, "publishing a revocation to Redis failed");
            }
        }
    }

    /// Calls `listener` with the email of every user that changes, here or
    /// on another instance.
    pub fn on_user_changed(&self, listener: impl Fn(&str) + Send + Sync + 'static) {
        self.user_listeners
            .write()
            .expect("listener lock")
            .push(Box::new(listener));
    }

    fn tell_user_listeners(&self, email: &str) {
        for listener in self.user_listeners.read().expect("listener lock").iter() {
            listener(email);
        }
    }

    /// A user changed (password, verification): every instance's listeners
    /// hear of it (here at once, elsewhere through Redis).
    pub async fn user_changed(&self, email: &str) {
        self.tell_user_listeners(email);
        if let Some(r) = &self.redis {
            let mut pipe = redis::pipe();
            pipe.publish(r.key(CHANNEL), format!("u:{email}")).ignore();
            if let Err(e) = r
                .run(
                    "publish",
                    |mut c| async move { pipe.query_async::<()>(&mut c).await },
                )
                .await
            {
                tracing::warn!(error = %e, "publishing a user change to Redis failed");
            }
        }
    }

    /// Refills the set from sessions revoked since `since` (ms).
    pub async fn load_from_store(&self, store: &Store, since: i64) -> anyhow::Result<()> {
        for (sid, revoked_at) in store.revoked_sessions_since(since).await? {
            self.insert_local(&sid, revoked_at + self.retention_ms);
        }
        Ok(())
    }

    /// The oldest revocation that may still matter: older ones are forgotten.
    pub fn horizon(&self) -> i64 {
        now_ms() - self.retention_ms
    }

    /// Forgets entries whose tokens have all expired.
    pub fn purge(&self) {
        let now = now_ms();
        self.set
            .write()
            .expect("revocation lock")
            .retain(|_, forget_at| *forget_at > now);
    }

    pub fn len(&self) -> usize {
        self.set.read().expect("revocation lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn resync_from_redis(&self, r: &RedisHandle) -> Result<(), super::redis::RedisFailure> {
        self.resync_set(r, r.key(SET)).await
    }

    async fn resync_set(&self, r: &RedisHandle, zset: String) -> Result<(), super::redis::RedisFailure> {
        let now = now_ms();
        let z2 = zset.clone();
        let _: () = r
            .run("zremrangebyscore", |mut c| async move {
                redis::cmd("ZREMRANGEBYSCORE")
                    .arg(&z2)
                    .arg("-inf")
                    .arg(now)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let entries: Vec<(String, f64)> = r
            .run("zrangebyscore", |mut c| async move {
                redis::cmd("ZRANGEBYSCORE")
                    .arg(&zset)
                    .arg(now)
                    .arg("+inf")
                    .arg("WITHSCORES")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        for (sid, score) in entries {
            self.insert_local(&sid, score as i64);
        }
        Ok(())
    }

    /// With Redis: listens for events until shutdown, resubscribing (and
    /// resyncing) after any disconnection.
    pub async fn listen(self: Arc<Self>, mut shutdown: Shutdown) {
        let Some(r) = self.redis.clone() else {
            return;
        };
        let channels = [r.key(CHANNEL)];
        let heartbeat = format!("h:{}", self.instance);
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            let session = async {
                let mut pubsub = r.subscriber(attempt).get_async_pubsub().await?;
                for channel in &channels {
                    pubsub.subscribe(channel).await?;
                }
                match self.resync_from_redis(&r).await {
                    Ok(()) => {
                        self.heard_at.store(now_ms(), Ordering::Relaxed);
                        self.subscribed.store(true, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!(error = %e, "resyncing revocations from Redis failed"),
                }
                tracing::debug!("listening for revocations");
                let mut stream = pubsub.on_message();
                let mut beats = tokio::time::interval(HEARTBEAT);
                loop {
                    tokio::select! {
                        msg = stream.next() => {
                            let Some(msg) = msg else { break };
                            if let Ok(payload) = msg.get_payload::<String>() {
                                self.apply(&payload);
                            }
                        }
                        _ = beats.tick() => {
                            // Silent for 3 s although Redis takes commands:
                            // this subscription hears nothing; take another.
                            if now_ms() - self.heard_at.load(Ordering::Relaxed) > 3 * HEARD_WITHIN_MS
                                && !r.failed_within(HEARD_WITHIN_MS)
                            {
                                tracing::warn!("no heartbeat heard on the Redis subscription; resubscribing");
                                break;
                            }
                            let (channel, beat) = (channels[0].clone(), heartbeat.clone());
                            let _ = r
                                .run("heartbeat", |mut c| async move {
                                    redis::cmd("PUBLISH").arg(channel).arg(beat).query_async::<()>(&mut c).await
                                })
                                .await;
                        }
                    }
                }
                Ok::<(), redis::RedisError>(())
            };
            let ended = tokio::select! {
                res = session => Some(res),
                _ = shutdown.wait() => None,
            };
            self.subscribed.store(false, Ordering::Relaxed);
            match ended {
                Some(res) => {
                    match res {
                        Ok(()) => tracing::warn!("Redis event subscription ended; resubscribing"),
                        Err(e) => tracing::warn!(error = %e, "Redis event subscription failed; retrying"),
                    }
                    metrics::counter!("latchkey_redis_resubscribes_total").increment(1);
                }
                None => return,
            }
            attempt += 1;
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.wait() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn apply(&self, payload: &str) {
        if let Some(id) = payload.strip_prefix("h:") {
            if id.parse() == Ok(self.instance) {
                self.heard_at.store(now_ms(), Ordering::Relaxed);
            }
            return;
        }
        if let Some(sid) = payload.strip_prefix("s:") {
            self.insert_local(sid, now_ms() + self.retention_ms);
        } else if let Some(email) = payload.strip_prefix("u:") {
            self.tell_user_listeners(email);
        }
    }
}

/// The answer of the service's `GET /revocations?since=MS`.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct PolledRevocations {
    /// (session id, revoked at, ms).
    pub revoked: Vec<(String, i64)>,
}
