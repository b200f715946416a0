//! One multiplexed, self-reconnecting Redis connection per process, with every
//! command timed and bounded so that a slow or dead Redis cannot hold a
//! request hostage.
//!
//! Redis is one server or a Redis Cluster (`redis_cluster = true`, with one
//! or more comma-separated seed URLs). On a cluster every key a script or a
//! pipeline touches shares a hash tag (`{...}`), so that each runs on one
//! node: `rl:{policy:key}`, `bf:{<account digest>}...`, `{revocations}` and its
//! channel. Pub/sub needs no tag: a cluster forwards every `PUBLISH` to all
//! of its nodes, so a subscriber on any node hears every instance.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{aio::ConnectionManagerConfig, Cmd, FromRedisValue, RedisError, RedisFuture, Value};
use tracing::Instrument;

use crate::lifecycle::Readiness;
use crate::settings::{optional, switch, ConfigError, Secret, Source};

/// Where Redis is, for the service and the gateway alike.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// One URL, or with `cluster` one or more seed nodes of the cluster.
    pub urls: Vec<Secret<String>>,
    /// A Redis Cluster: the client learns the slot map from the seeds and
    /// follows it through resharding and failover.
    pub cluster: bool,
    /// Prefix of every key and channel, so that several deployments (or tests)
    /// can share one Redis server. Always ends with `:`.
    pub key_prefix: String,
    /// Whether `/health/ready` fails while Redis does not answer (`required`,
    /// the default) or only names it (`reported`): every use of Redis has a
    /// fallback, and behind a load balancer a shared Redis that fails
    /// readiness takes every instance out at once.
    pub required_for_readiness: bool,
}

impl RedisConfig {
    /// `redis_url` (unset or empty: no Redis; with `redis_cluster`, a
    /// comma-separated list of seed nodes), `redis_cluster` and
    /// `redis_key_prefix`.
    pub fn read(src: &impl Source) -> Result<Option<RedisConfig>, ConfigError> {
        let urls = src.get("redis_url", None, optional(parse_redis_urls))?;
        let cluster = src.get("redis_cluster", false, switch)?;
        let key_prefix = src.get("redis_key_prefix", "latchkey:".to_string(), |s| {
            if s.is_empty() || s.len() > 64 {
                return Err("must be 1..=64 characters".into());
            }
            // A brace would move the hash tag of every key to the prefix and
            // so put all of them in one slot of a cluster.
            if s.contains(['{', '}']) {
                return Err("must not contain { or }".into());
            }
            Ok(if s.ends_with(':') {
                s.to_string()
            } else {
                format!("{s}:")
            })
        })?;
        let required_for_readiness = src.get("redis_readiness", true, |s| match s {
            "required" => Ok(true),
            "reported" => Ok(false),
            _ => Err("expected required or reported".into()),
        })?;
        let Some(urls) = urls else { return Ok(None) };
        if urls.len() > 1 && !cluster {
            return Err(ConfigError::new(
                src.name_of("redis_url"),
                "several URLs name the seeds of a Redis Cluster: set redis_cluster = true",
            ));
        }
        Ok(Some(RedisConfig {
            urls,
            cluster,
            key_prefix,
            required_for_readiness,
        }))
    }
}

fn parse_redis_urls(s: &str) -> Result<Vec<Secret<String>>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|s| {
            // The parse error names no part of the URL: it may hold a password.
            let u = url::Url::parse(s).map_err(|e| format!("not a valid URL: {e}"))?;
            match u.scheme() {
                "redis" | "rediss" => Ok(Secret(s.to_string())),
                other => Err(format!(
                    "unsupported scheme {other:?}: expected redis://host:port"
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| {
            if v.is_empty() {
                Err("names no URL".into())
            } else {
                Ok(v)
            }
        })
}

/// Longest wait for one Redis command before we treat Redis as unavailable.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct RedisHandle {
    /// One client per URL: where pub/sub subscribes (any node of a cluster).
    clients: Vec<redis::Client>,
    conn: Connection,
    prefix: String,
    required_for_readiness: bool,
    /// When a command last failed (ms; 0: never), shared by the clones.
    last_failure_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

/// The connection every command goes through: one server's, or a cluster's
/// (which routes each command to the node that owns its key's slot).
// Not boxed: `run` clones the connection for every command, and a boxed
// variant would allocate each time.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl Connection {
    /// Runs a keyless command (`SCAN`) on the node that holds `key`'s slot,
    /// so that a `SCAN ... MATCH` of keys sharing `key`'s hash tag sees all
    /// of them on a cluster as it does on one server.
    pub async fn query_at<T: FromRedisValue>(&mut self, key: &str, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Connection::Single(c) => cmd.query_async(c).await,
            Connection::Cluster(c) => {
                let route = Route::new(get_slot(key.as_bytes()), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                T::from_redis_value(&c.route_command(cmd, routing).await?)
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedisFailure {
    #[error("redis: {0}")]
    Error(#[from] RedisError),
    #[error("redis: timed out")]
    Timeout,
}

impl RedisHandle {
    pub async fn connect(cfg: &RedisConfig) -> anyhow::Result<RedisHandle> {
        use anyhow::Context;
        let clients = cfg
            .urls
            .iter()
            .map(|u| redis::Client::open(u.expose().as_str()))
            .collect::<Result<Vec<_>, _>>()
            .context("LATCHKEY_REDIS_URL")?;
        let connecting = async {
            if cfg.cluster {
                let client =
                    redis::cluster::ClusterClientBuilder::new(cfg.urls.iter().map(|u| u.expose().as_str()))
                        .connection_timeout(Duration::from_secs(2))
                        .response_timeout(COMMAND_TIMEOUT)
                        // Moved and failed-over slots are retried briefly; a longer
                        // outage is the callers' fallback, within COMMAND_TIMEOUT.
                        .retries(2)
                        .min_retry_wait(10)
                        .max_retry_wait(100)
                        .build()?;
                client.get_async_connection().await.map(Connection::Cluster)
            } else {
                let conn_cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Duration::from_secs(2))
                    .set_response_timeout(COMMAND_TIMEOUT)
                    .set_number_of_retries(2)
                    .set_max_delay(500);
                ConnectionManager::new_with_config(clients[0].clone(), conn_cfg)
                    .await
                    .map(Connection::Single)
            }
        };
        let conn = tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .map_err(|_| anyhow::anyhow!("connecting to Redis timed out"))?
            .context("connecting to Redis (LATCHKEY_REDIS_URL)")?;
        metrics::counter!("latchkey_redis_errors_total", "op" => "ping").increment(0);
        Ok(RedisHandle {
            clients,
            conn,
            prefix: cfg.key_prefix.clone(),
            required_for_readiness: cfg.required_for_readiness,
            last_failure_ms: Default::default(),
        })
    }

    /// The client of the `attempt`-th subscription: the seeds in turn, so
    /// that a subscriber whose node died moves to the next one.
    pub fn subscriber(&self, attempt: usize) -> &redis::Client {
        &self.clients[attempt % self.clients.len()]
    }

    /// Adds Redis's answer (`ok`) to a readiness answer: a failing check,
    /// or with `redis_readiness = reported` a named one that does not fail.
    pub fn readiness(&self, ready: Readiness, ok: bool) -> Readiness {
        if self.required_for_readiness {
            ready.check("redis", ok)
        } else {
            ready.report("redis", ok)
        }
    }

    /// `<prefix><suffix>`
    pub fn key(&self, suffix: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + suffix.len());
        k.push_str(&self.prefix);
        k.push_str(suffix);
        k
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Connection::Cluster(_))
    }

    /// Runs one command (or pipeline) with a timeout, in a `redis` span,
    /// recording its latency.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, RedisFailure>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.run_unspanned(op, f)
            .instrument(tracing::debug_span!("redis", op))
            .await
    }

    /// As [`RedisHandle::run`], in no span of its own: for a command sent on
    /// behalf of several requests (the rate limiter's shared calls), whose
    /// requests each record their own wait in their own trace; a span here
    /// would be a trace of its own, belonging to no request.
    pub async fn run_unspanned<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, RedisFailure>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let start = Instant::now();
        let command = tokio::time::timeout(COMMAND_TIMEOUT, f(self.conn.clone()));
        let out = match command.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(RedisFailure::Error(e)),
            Err(_) => Err(RedisFailure::Timeout),
        };
        metrics::histogram!("latchkey_redis_command_seconds", "op" => op)
            .record(start.elapsed().as_secs_f64());
        if out.is_err() {
            metrics::counter!("latchkey_redis_errors_total", "op" => op).increment(1);
            self.last_failure_ms
                .store(crate::clock::now_ms(), std::sync::atomic::Ordering::Relaxed);
        }
        out
    }

    /// Whether a command failed in the last `ms` milliseconds. A Redis that
    /// stopped answering (a frozen or partitioned node) leaves subscriptions
    /// open but silent; failed commands are how an instance learns of it.
    pub fn failed_within(&self, ms: i64) -> bool {
        let last = self.last_failure_ms.load(std::sync::atomic::Ordering::Relaxed);
        last > 0 && crate::clock::now_ms() - last <= ms
    }

    pub async fn ping(&self) -> Result<(), RedisFailure> {
        self.run("ping", |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Sources;

    fn read(pairs: &[(&str, &str)]) -> Result<Option<RedisConfig>, String> {
        RedisConfig::read(&Sources::from_pairs(pairs.iter().copied())).map_err(|e| e.to_string())
    }

    #[test]
    fn a_cluster_takes_several_seeds_and_one_server_takes_one() {
        let seeds = "redis://127.0.0.1:7000, redis://127.0.0.1:7001";
        let c = read(&[("redis_url", seeds), ("redis_cluster", "true")])
            .unwrap()
            .unwrap();
        assert_eq!(c.urls.len(), 2);
        assert!(c.cluster);
        let e = read(&[("redis_url", seeds)]).unwrap_err();
        assert!(e.contains("redis_cluster"), "{e}");
        let c = read(&[("redis_url", "redis://127.0.0.1:6379")]).unwrap().unwrap();
        assert!(!c.cluster && c.urls.len() == 1);
        assert!(read(&[("redis_url", "")]).unwrap().is_none());
        assert!(read(&[("redis_url", " , ")]).is_err());
    }

    #[test]
    fn a_prefix_may_not_carry_a_hash_tag_and_no_error_shows_a_password() {
        let e = read(&[("redis_url", "redis://h:1"), ("redis_key_prefix", "a{b}")]).unwrap_err();
        assert!(e.contains('{'), "{e}");
        let e = read(&[("redis_url", "redis://:hunter2@h:1,http://:hunter2@x")]).unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
