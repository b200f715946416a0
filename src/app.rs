//! Builds the service from its configuration and runs it. The binary and the
//! tests use the same `Application::build`; tests pass port 0.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::cache::{RedisHandle, Revocations, UserCache};
use crate::config::Config;
use crate::crypto::{load_master_secret, ServerKeys};
use crate::domain::accounts::Accounts;
use crate::domain::credcache::CredentialCache;
use crate::domain::hashing::HashPool;
use crate::domain::tokens::{TokenSettings, Tokens, LEEWAY_SECS};
use crate::limits::{BruteForce, Limiter, Softlocks};
use crate::mail::{MailSink, OutboxWorker};
use crate::store::{now_ms, Store};

/// Everything a request handler may need, built once.
pub struct Services {
    pub config: Config,
    pub store: Store,
    pub redis: Option<RedisHandle>,
    pub tokens: Arc<Tokens>,
    pub accounts: Accounts,
    pub revocations: Arc<Revocations>,
    pub users: Arc<UserCache>,
    pub limiter: Arc<Limiter>,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub mail_wake: Arc<Notify>,
}

impl Services {
    /// Connects the stores, applies migrations, loads (or creates) the keys.
    pub async fn build(config: Config) -> anyhow::Result<Arc<Services>> {
        let metrics = crate::telemetry::metrics_handle();
        let store = Store::connect(&config.database).await?;
        store.migrate().await.context("applying database migrations")?;
        Self::build_with_store(config, store, metrics).await
    }

    pub async fn build_with_store(
        config: Config,
        store: Store,
        metrics: metrics_exporter_prometheus::PrometheusHandle,
    ) -> anyhow::Result<Arc<Services>> {
        let redis = match &config.redis {
            Some(r) => Some(RedisHandle::connect(r).await?),
            None => None,
        };
        let master = load_master_secret(config.secret_key.as_ref(), &config.data_dir)
            .context("loading the master secret (LATCHKEY_SECRET_KEY or <data_dir>/secret.key)")?;
        let ServerKeys {
            codes,
            outbox,
            signing_keys,
            secret_check,
        } = ServerKeys::derive(&master);
        check_master_secret(&store, &secret_check, &signing_keys).await?;
        let users = Arc::new(UserCache::new(100_000, Duration::from_secs(60)));
        let retention = config.access_token_ttl + Duration::from_secs(LEEWAY_SECS as u64);
        let revocations = Arc::new(Revocations::new(redis.clone(), users.clone(), retention));
        revocations
            .load_from_store(&store, revocations.horizon())
            .await
            .context("loading revoked sessions")?;
        let tokens = Arc::new(
            Tokens::load(
                TokenSettings {
                    issuer: config.issuer.clone(),
                    audience: config.audience.clone(),
                    algorithm: config.signing_algorithm,
                    access_ttl: config.access_token_ttl,
                    cache_capacity: config.token_cache_capacity,
                },
                store.clone(),
                signing_keys,
                revocations.clone(),
            )
            .await
            .context("loading signing keys")?,
        );
        let limiter = Arc::new(Limiter::new(
            config.rate_limit,
            config.policies.clone(),
            redis.clone(),
        ));
        let hashing = Arc::new(HashPool::new(
            config.hash_threads,
            config.hash_queue,
            config.hash_budget,
            &config.argon2,
        )?);
        let mail_wake = Arc::new(Notify::new());
        let accounts = Accounts {
            store: store.clone(),
            hashing,
            credentials: config
                .credential_cache
                .then(|| CredentialCache::new(config.credential_cache_capacity, config.credential_cache_ttl)),
            users: users.clone(),
            tokens: tokens.clone(),
            revocations: revocations.clone(),
            limiter: limiter.clone(),
            brute_force: BruteForce::new(
                config.rate_limit,
                config.brute_force,
                config.brute_force_account,
                redis.clone(),
            ),
            code_guesses: Softlocks::new(config.rate_limit, redis.clone()),
            code_key: codes,
            outbox_sealer: Arc::new(outbox),
            mail_wake: mail_wake.clone(),
            refresh_ttl: config.refresh_token_ttl,
            refresh_grace: config.refresh_grace,
        };
        Ok(Arc::new(Services {
            config,
            store,
            redis,
            tokens,
            accounts,
            revocations,
            users,
            limiter,
            metrics,
            mail_wake,
        }))
    }
}

/// Refuses to run under another master secret than the database was
/// initialised with: the check value stored by the first instance must match.
/// A database from before the check value existed gets it now, unless its
/// signing keys show it was initialised under another secret (none unseals
/// here): the first instance to start must not decide for the others.
async fn check_master_secret(
    store: &Store,
    check: &[u8; 32],
    sealer: &crate::crypto::Sealer,
) -> anyhow::Result<()> {
    let mismatch = || {
        anyhow::anyhow!(
            "LATCHKEY_SECRET_KEY: this database was initialised under another master secret; \
             every instance must use the same LATCHKEY_SECRET_KEY (or the same <data_dir>/secret.key)"
        )
    };
    let stored = match store.installation_get("secret_check").await? {
        Some(v) => v,
        None => {
            let keys = store.signing_keys().await?;
            if !keys.is_empty() && !keys.iter().any(|k| crate::domain::tokens::can_unseal(k, sealer)) {
                return Err(mismatch());
            }
            store
                .installation_value("secret_check", check)
                .await
                .context("storing the master secret's check value")?
        }
    };
    if !crate::crypto::ct_eq(&stored, check) {
        return Err(mismatch());
    }
    Ok(())
}

/// Bound listeners (the public one, and the operators' one for `/metrics`)
/// and the services behind them, ready to run.
pub struct Application {
    listener: TcpListener,
    admin: Option<TcpListener>,
    services: Arc<Services>,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        let listen = config.listen;
        let services = Services::build(config).await?;
        Self::with_services(listen, services).await
    }

    pub async fn with_services(listen: SocketAddr, services: Arc<Services>) -> anyhow::Result<Application> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding LATCHKEY_LISTEN={listen}"))?;
        let admin = match services.config.admin_listen {
            None => None,
            Some(a) => Some(
                TcpListener::bind(a)
                    .await
                    .with_context(|| format!("binding LATCHKEY_ADMIN_LISTEN={a}"))?,
            ),
        };
        Ok(Application {
            listener,
            admin,
            services,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where `/metrics` is served, if anywhere.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
            .as_ref()
            .map(|l| l.local_addr().expect("a bound listener has an address"))
    }

    pub fn services(&self) -> &Arc<Services> {
        &self.services
    }

    /// Serves until SIGTERM or SIGINT.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `stop` completes, then shuts down gracefully: stop
    /// accepting, let in-flight requests finish within `shutdown_timeout`,
    /// stop the background tasks, close the pools.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let st = self.services.clone();
        let (bg_tx, bg_rx) = watch::channel(false);
        let mut tasks = spawn_background(&st, bg_rx);
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let app = crate::http::router(st.clone());
        let listener = self.listener;
        let admin_stop = stop_rx.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.changed().await;
                })
                .await
        });
        if let Some(admin) = self.admin {
            let app = crate::http::admin_router(st.clone());
            let mut stop = admin_stop;
            tasks.push(tokio::spawn(async move {
                let served = axum::serve(admin, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop.changed().await;
                    })
                    .await;
                if let Err(e) = served {
                    tracing::warn!(error = %e, "admin listener failed");
                }
            }));
        }
        stop.await;
        tracing::info!("shutting down: no new connections, finishing in-flight requests");
        let _ = stop_tx.send(true);
        match tokio::time::timeout(st.config.shutdown_timeout, server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "server error during shutdown"),
            Ok(Err(e)) => tracing::warn!(error = %e, "server task failed"),
            Err(_) => tracing::warn!("in-flight requests did not finish within the shutdown timeout"),
        }
        let _ = bg_tx.send(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        st.store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// SIGTERM or SIGINT (the gateway uses it too).
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// The outbox worker, the revocation listener and the housekeeping loop.
fn spawn_background(st: &Arc<Services>, shutdown: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    match MailSink::new(&st.config.mail) {
        Ok(sink) => {
            let worker = OutboxWorker::new(
                st.store.clone(),
                sink,
                st.accounts.outbox_sealer.clone(),
                st.config.mail_from.clone(),
                st.mail_wake.clone(),
            );
            tasks.push(tokio::spawn(worker.run(shutdown.clone())));
        }
        Err(e) => tracing::error!(error = %e, "mail sink unusable; mail stays queued"),
    }
    tasks.push(tokio::spawn(st.revocations.clone().listen(shutdown.clone())));
    tasks.push(tokio::spawn(housekeeping(st.clone(), shutdown)));
    tasks
}

/// Periodic work, one task: key reloads (rotation reaches every instance),
/// revocation resync from the database (a safety net under Redis), purges,
/// and the outbox gauges.
async fn housekeeping(st: Arc<Services>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_keys = Instant::now();
    let mut last_resync = Instant::now();
    let mut last_purge = Instant::now();
    let mut resync_from = now_ms() - 10_000;
    let mut users_from = now_ms() - 10_000;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if last_keys.elapsed() >= st.config.key_refresh_interval {
            last_keys = Instant::now();
            if let Err(e) = st.tokens.reload().await {
                tracing::warn!(error = %e, "reloading signing keys failed");
            }
        }
        if last_resync.elapsed() >= Duration::from_secs(5) {
            last_resync = Instant::now();
            let now = now_ms();
            match st.revocations.load_from_store(&st.store, resync_from).await {
                Ok(()) => resync_from = now - 10_000, // overlap absorbs commit delays
                Err(e) => tracing::warn!(error = %e, "revocation resync failed"),
            }
            // Histogram samples wait in lock-free buckets until drained: drain
            // them even when nothing scrapes /metrics, or they pile up.
            st.metrics.run_upkeep();
            if let Ok((backlog, oldest, dead)) = st.store.outbox_backlog().await {
                metrics::gauge!("latchkey_outbox_backlog").set(backlog as f64);
                let age = oldest.map(|t| (now - t).max(0) as f64 / 1000.0).unwrap_or(0.0);
                metrics::gauge!("latchkey_outbox_oldest_age_seconds").set(age);
                metrics::gauge!("latchkey_outbox_dead_letters").set(dead as f64);
            }
            // The safety net under "user changed" events: a password changed
            // on another instance whose Redis publish was lost is forgotten
            // here within seconds, not at the end of the cache's lifetime.
            match st.store.users_changed_since(users_from).await {
                Ok(emails) => {
                    users_from = now - 10_000;
                    for e in emails {
                        st.users.forget(&e);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "user cache resync failed"),
            }
        }
        if last_purge.elapsed() >= Duration::from_secs(60) {
            last_purge = Instant::now();
            st.revocations.purge();
            st.limiter.purge();
            st.accounts.brute_force.purge();
            // Keep ended sessions a day for audit, then drop them.
            if let Err(e) = st.store.purge_sessions(now_ms() - 86_400_000).await {
                tracing::warn!(error = %e, "purging sessions failed");
            }
            if let Err(e) = st.tokens.purge_retired().await {
                tracing::warn!(error = %e, "purging retired keys failed");
            }
            let now = now_ms();
            // Codes, real and shadow alike, a day after they expired.
            if let Err(e) = st.store.purge_codes(now - 86_400_000).await {
                tracing::warn!(error = %e, "purging codes failed");
            }
            let ttl = st.config.unverified_account_ttl.as_millis() as i64;
            match st.store.purge_unverified_users(now - ttl).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(accounts = n, "deleted accounts never verified"),
                Err(e) => tracing::warn!(error = %e, "purging unverified accounts failed"),
            }
            let ttl = st.config.mail_dead_letter_ttl.as_millis() as i64;
            if let Err(e) = st.store.purge_dead_letters(now - ttl).await {
                tracing::warn!(error = %e, "purging dead letters failed");
            }
        }
    }
}
