//! What operators ask of a running service: is it ready, what do its
//! gauges say, which sessions were revoked lately (what a gateway polls).
//! The HTTP edge serves these on the admin listener; it never reaches the
//! store or Redis itself.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use super::shared::Shared;
use super::tokens::Verifier;
use super::AuthError;
use crate::cache::{RedisHandle, Revocations, UserCache};
use crate::lifecycle::{answers, Readiness};
use crate::store::Store;

pub struct Operations {
    pub(crate) store: Store,
    pub(crate) redis: Option<RedisHandle>,
    /// For the size of the credential cache.
    pub(crate) shared: Arc<Shared>,
    pub(crate) tokens: Arc<Verifier>,
    pub(crate) revocations: Arc<Revocations>,
    pub(crate) users: Arc<UserCache>,
    pub(crate) metrics: PrometheusHandle,
    pub(crate) db_max_connections: u32,
}

impl Operations {
    /// Ready when the database (and Redis, if configured and required)
    /// answer within a second.
    pub async fn readiness(&self) -> Readiness {
        let timeout = Duration::from_secs(1);
        let mut ready = Readiness::new().check("database", answers(timeout, self.store.ping()).await);
        if let Some(r) = &self.redis {
            ready = r.readiness(ready, answers(timeout, r.ping()).await);
        }
        ready
    }

    /// The Prometheus text, with the gauges read now.
    pub fn metrics_text(&self) -> String {
        let (size, idle) = self.store.pool_stats();
        metrics::gauge!("latchkey_db_pool_connections").set(size as f64);
        metrics::gauge!("latchkey_db_pool_idle").set(idle as f64);
        metrics::gauge!("latchkey_db_pool_max").set(self.db_max_connections as f64);
        metrics::gauge!("latchkey_token_cache_size").set(self.tokens.cache_len() as f64);
        metrics::gauge!("latchkey_user_cache_size").set(self.users.len() as f64);
        metrics::gauge!("latchkey_revocations_size").set(self.revocations.len() as f64);
        if let Some(c) = &self.shared.credentials {
            metrics::gauge!("latchkey_credential_cache_size").set(c.len() as f64);
        }
        crate::telemetry::record_process_gauges();
        crate::telemetry::render(&self.metrics)
    }

    /// Sessions revoked since `since` (Unix ms), with when.
    pub async fn revoked_since(&self, since: i64) -> Result<Vec<(String, i64)>, AuthError> {
        Ok(self.store.revoked_sessions_since(since).await?)
    }
}
