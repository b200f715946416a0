//! One multiplexed, self-reconnecting Redis connection per process, with every
//! command timed and bounded so that a slow or dead Redis cannot hold a
//! request hostage.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{aio::ConnectionManagerConfig, RedisError};
use tracing::Instrument;

use crate::settings::{optional, ConfigError, Secret, Source};

/// Where Redis is, for the service and the gateway alike.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    pub url: Secret<String>,
    /// Prefix of every key and channel, so that several deployments (or tests)
    /// can share one Redis server. Always ends with `:`.
    pub key_prefix: String,
}

impl RedisConfig {
    /// `redis_url` (unset or empty: no Redis) and `redis_key_prefix`.
    pub fn read(src: &impl Source) -> Result<Option<RedisConfig>, ConfigError> {
        let url = src.get("redis_url", None, optional(parse_redis_url))?;
        let key_prefix = src.get("redis_key_prefix", "latchkey:".to_string(), |s| {
            if s.is_empty() || s.len() > 64 {
                return Err("must be 1..=64 characters".into());
            }
            Ok(if s.ends_with(':') {
                s.to_string()
            } else {
                format!("{s}:")
            })
        })?;
        Ok(url.map(|url| RedisConfig { url, key_prefix }))
    }
}

fn parse_redis_url(s: &str) -> Result<Secret<String>, String> {
    let u = url::Url::parse(s).map_err(|e| format!("not a valid URL: {e}"))?;
    match u.scheme() {
        "redis" | "rediss" => Ok(Secret(s.to_string())),
        other => Err(format!(
            "unsupported scheme {other:?}: expected redis://host:port"
        )),
    }
}

/// Longest wait for one Redis command before we treat Redis as unavailable.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(250);

#[derive(Clone)]
pub struct RedisHandle {
    client: redis::Client,
    conn: ConnectionManager,
    prefix: String,
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
        let client = redis::Client::open(cfg.url.expose().as_str()).context("LATCHKEY_REDIS_URL")?;
        let conn_cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(2))
            .set_response_timeout(COMMAND_TIMEOUT)
            .set_number_of_retries(2)
            .set_max_delay(500);
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            ConnectionManager::new_with_config(client.clone(), conn_cfg),
        )
        .await
        .map_err(|_| anyhow::anyhow!("connecting to Redis timed out"))?
        .context("connecting to Redis (LATCHKEY_REDIS_URL)")?;
        metrics::counter!("latchkey_redis_errors_total", "op" => "ping").increment(0);
        Ok(RedisHandle {
            client,
            conn,
            prefix: cfg.key_prefix.clone(),
        })
    }

    pub fn client(&self) -> &redis::Client {
        &self.client
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

    /// Runs one command (or pipeline) with a timeout, in a `redis` span,
    /// recording its latency.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, RedisFailure>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let start = Instant::now();
        let command = tokio::time::timeout(COMMAND_TIMEOUT, f(self.conn.clone()));
        let out = match command.instrument(tracing::debug_span!("redis", op)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(RedisFailure::Error(e)),
            Err(_) => Err(RedisFailure::Timeout),
        };
        metrics::histogram!("latchkey_redis_command_seconds", "op" => op)
            .record(start.elapsed().as_secs_f64());
        if out.is_err() {
            metrics::counter!("latchkey_redis_errors_total", "op" => op).increment(1);
        }
        out
    }

    pub async fn ping(&self) -> Result<(), RedisFailure> {
        self.run("ping", |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .map(|_| ())
    }
}
