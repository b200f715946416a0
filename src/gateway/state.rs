//! What the gateway holds while it runs, and how a new file replaces it:
//! the route table (swapped whole on SIGHUP), the token verifier, the
//! limiter and the revocation set.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::config::GatewayConfig;
use super::routes::RouteTable;
use crate::cache::{RedisHandle, Revocations};
use crate::domain::tokens::{Verifier, VerifierSettings};
use crate::limits::Limiter;
use crate::settings::ConfigError;

/// Everything a request needs; the route table is swapped on reload.
pub struct GatewayState {
    pub(super) table: RwLock<Arc<RouteTable>>,
    pub(super) config: RwLock<GatewayConfig>,
    pub(super) accepted_audiences: Vec<String>,
    pub tokens: Arc<Verifier>,
    pub limiter: Arc<Limiter>,
    pub revocations: Arc<Revocations>,
    pub redis: Option<RedisHandle>,
    pub(super) metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub(super) jwks_loaded_at_ms: AtomicI64,
}

impl GatewayState {
    pub fn table(&self) -> Arc<RouteTable> {
        self.table.read().expect("route table lock").clone()
    }

    /// Applies a new configuration's routes, limits, identity header names
    /// and trusted proxies. Settings that need a restart are reported (and
    /// keep their old values); new audiences are refused, since the token
    /// verifier was built for the old set.
    pub fn reload(&self, new: GatewayConfig) -> Result<Vec<&'static str>, ConfigError> {
        for (i, r) in new.routes.iter().enumerate() {
            if let Some(a) = r.audiences.iter().find(|a| !self.accepted_audiences.contains(a)) {
                return Err(ConfigError::new(
                    format!("routes[{i}].audiences"),
                    format!("{a:?} is not among the audiences the gateway started with; restart to add it"),
                ));
            }
        }
        let mut old = self.config.write().expect("config lock");
        let ignored = old.restart_only_changes(&new);
        let table = Arc::new(RouteTable::new(&new));
        *self.table.write().expect("route table lock") = table;
        *old = new;
        Ok(ignored)
    }
}

pub(super) async fn fetch_keys(
    config: &GatewayConfig,
    revocations: &Arc<Revocations>,
) -> anyhow::Result<Verifier> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let settings = VerifierSettings {
            issuer: config.issuer.clone(),
            audiences: config.all_audiences(),
            access_ttl: config.access_token_ttl,
            cache_capacity: config.token_cache_capacity,
        };
        match Verifier::from_jwks(settings, config.jwks_url.clone(), revocations.clone()).await {
            Ok(t) => {
                if t.key_count() == 0 {
                    tracing::warn!(jwks_url = %config.jwks_url, "the JWKS holds no usable key yet");
                }
                return Ok(t);
            }
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(jwks_url = %config.jwks_url, error = %e, "fetching the JWKS failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.context(format!("fetching the JWKS (jwks_url = {})", config.jwks_url))),
        }
    }
}

/// SIGHUP, listened for from this call on. Made before the listener is
/// bound (as `lifecycle::signal` is), so that a SIGHUP sent as soon as the
/// port answers reloads instead of ending the process by the signal's
/// default action.
pub(super) struct Hangups(#[cfg(unix)] Option<tokio::signal::unix::Signal>);

impl Hangups {
    pub(super) fn listen() -> Hangups {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let hup = signal(SignalKind::hangup());
            if hup.is_err() {
                tracing::warn!("cannot listen for SIGHUP; configuration reload disabled");
            }
            Hangups(hup.ok())
        }
        #[cfg(not(unix))]
        Hangups()
    }

    /// Reloads `path` into `st` at every SIGHUP, until dropped.
    pub(super) async fn reload(self, st: Arc<GatewayState>, path: PathBuf) {
        #[cfg(unix)]
        if let Some(mut hup) = self.0 {
            while hup.recv().await.is_some() {
                reload_from(&st, &path);
            }
        }
        let _ = (st, path);
    }
}

/// Re-reads `path` and applies it; on any error the running table stays.
pub fn reload_from(st: &GatewayState, path: &Path) {
    match GatewayConfig::load(path).and_then(|c| st.reload(c)) {
        Ok(ignored) => {
            let routes = st.table().routes().count();
            tracing::info!(routes, "gateway configuration reloaded");
            if !ignored.is_empty() {
                tracing::warn!(
                    settings = ignored.join(", "),
                    "changed settings take effect only at restart"
                );
            }
        }
        Err(e) => tracing::error!("gateway configuration NOT reloaded: {e}"),
    }
}
