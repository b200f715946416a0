//! Wiring: the service's parts built once from its configuration, in the
//! order they depend on each other.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Notify;

use super::config::Config;
use crate::cache::{RedisHandle, Revocations, UserCache};
use crate::crypto::ServerKeys;
use crate::domain::admin::Admin;
use crate::domain::clients::Clients;
use crate::domain::codebook::CodeBook;
use crate::domain::credcache::CredentialCache;
use crate::domain::federation::Federation;
use crate::domain::hashing::HashPool;
use crate::domain::login::Login;
use crate::domain::mfa::SecondFactors;
use crate::domain::oidc::Provider;
use crate::domain::ops::Operations;
use crate::domain::passwords::Passwords;
use crate::domain::refresh::RefreshTokens;
use crate::domain::sessions::Sessions;
use crate::domain::shared::{Outbox, Shared};
use crate::domain::signup::SignUp;
use crate::domain::tokens::{Issuer, LEEWAY_SECS};
use crate::domain::webhooks::Webhooks;
use crate::domain::Features;
use crate::http::{ApiState, AppState};
use crate::limits::{BruteForce, Limiter, Softlocks};
use crate::store::Store;

/// Everything the service runs on, built once. The HTTP handlers see only
/// the domain's part of it ([`ApiState`]); the background tasks, the
/// command line and the tests see all of it.
pub struct Services {
    pub config: Config,
    pub store: Store,
    pub redis: Option<RedisHandle>,
    /// Signs and rotates keys; its `verifier()` validates.
    pub tokens: Arc<Issuer>,
    /// The handles the domain's services share (the hashing pool, the
    /// brute-force rules, the outbox, ...).
    pub shared: Arc<Shared>,
    /// The domain's services, one per feature.
    pub features: Features,
    pub revocations: Arc<Revocations>,
    pub users: Arc<UserCache>,
    pub limiter: Arc<Limiter>,
    pub ops: Arc<Operations>,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub mail_wake: Arc<Notify>,
    /// The sign-in pages' templates (read once, at start).
    pub pages: crate::http::pages::Pages,
    /// Seals the scheduled backups (docs/backup.md).
    pub backup_key: crate::crypto::MacKey,
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
        let ServerKeys {
            codes,
            outbox,
            signing_keys,
            factors,
            ceremonies,
            refresh_tokens,
            authorizations,
            backups,
            upstreams,
            ..
        } = super::keyring::load(&config, &store).await?;
        let users = Arc::new(UserCache::new(100_000, Duration::from_secs(60)));
        let retention = config.tokens.access_ttl + Duration::from_secs(LEEWAY_SECS as u64);
        let revocations = Arc::new(Revocations::new(redis.clone(), retention));
        let forget = users.clone();
        revocations.on_user_changed(move |email| forget.forget(email));
        revocations
            .load_from_store(&store, revocations.horizon())
            .await
            .context("loading revoked sessions")?;
        let tokens = Arc::new(
            Issuer::load(
                config.tokens.clone(),
                store.clone(),
                signing_keys,
                revocations.clone(),
            )
            .await
            .context("loading signing keys")?,
        );
        let limits = &config.limits;
        let limiter = Arc::new(Limiter::new(limits.enabled, redis.clone()).with_policies(&limits.policies));
        let hashing = Arc::new(HashPool::new(&config.hashing)?);
        let mail_wake = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            store: store.clone(),
            hashing,
            credentials: config
                .accounts
                .credential_cache
                .as_ref()
                .map(|c| CredentialCache::new(c.capacity, c.ttl)),
            users: users.clone(),
            revocations: revocations.clone(),
            limiter: limiter.clone(),
            brute_force: BruteForce::new(
                limits.enabled,
                limits.brute_force,
                limits.brute_force_account,
                redis.clone(),
            ),
            code_guesses: Softlocks::new(limits.enabled, redis.clone()),
            code_key: codes,
            outbox: Outbox {
                sealer: Arc::new(outbox),
                wake: mail_wake.clone(),
            },
        });
        let codebook = Arc::new(CodeBook::new(shared.clone()));
        let sessions = Arc::new(Sessions::new(
            shared.clone(),
            tokens.clone(),
            config.accounts.refresh_ttl,
            config.accounts.refresh_grace,
            RefreshTokens::new(refresh_tokens),
        ));
        let passwords = Arc::new(Passwords::new(shared.clone(), codebook.clone()));
        let factors = Arc::new(SecondFactors::new(
            shared.clone(),
            passwords.clone(),
            config.mfa.clone(),
            factors,
            ceremonies,
        )?);
        let origins = Arc::new(crate::domain::oidc::origins::ClientOrigins::new(store.clone()));
        let provider = Arc::new(Provider::new(
            shared.clone(),
            sessions.clone(),
            tokens.clone(),
            authorizations,
            config.accounts.refresh_grace,
            config.oidc.clone(),
            origins.clone(),
        ));
        let login = Arc::new(Login::new(
            shared.clone(),
            passwords.clone(),
            factors.clone(),
            sessions.clone(),
        ));
        let features = Features {
            provider,
            signup: Arc::new(SignUp::new(
                shared.clone(),
                codebook.clone(),
                sessions.clone(),
                factors.clone(),
            )),
            login: login.clone(),
            federation: Arc::new(Federation::new(
                shared.clone(),
                login,
                factors.clone(),
                config.federation.clone(),
                upstreams,
                &config.tokens.issuer,
            )),
            admin: Arc::new(Admin::new(shared.clone(), codebook)),
            clients: Arc::new(Clients::new(
                store.clone(),
                tokens.clone(),
                revocations.clone(),
                config.webhooks.allow_private,
                origins,
            )),
            webhooks: Arc::new(Webhooks::new(
                store.clone(),
                shared.outbox.sealer.clone(),
                config.webhooks.allow_private,
            )),
            passwords,
            factors,
            sessions,
        };
        features
            .federation
            .refresh()
            .await
            .context("reading the upstream providers")?;
        let pages = crate::http::pages::Pages::load(
            config.http.pages_dir.as_deref(),
            config.tokens.issuer.starts_with("https://"),
        )?;
        let ops = Arc::new(Operations {
            store: store.clone(),
            redis: redis.clone(),
            shared: shared.clone(),
            tokens: tokens.verifier().clone(),
            revocations: revocations.clone(),
            users: users.clone(),
            metrics: metrics.clone(),
            db_max_connections: config.database.max_connections,
        });
        Ok(Arc::new(Services {
            config,
            store,
            redis,
            tokens,
            shared,
            features,
            revocations,
            users,
            limiter,
            ops,
            metrics,
            mail_wake,
            pages,
            backup_key: backups,
        }))
    }

    /// What the HTTP handlers get.
    pub fn api_state(&self) -> AppState {
        ApiState::new(
            self.features.clone(),
            self.tokens.verifier().clone(),
            self.limiter.clone(),
            self.ops.clone(),
            self.config.http.clone(),
            self.pages.clone(),
        )
    }
}

/// The keys of the configured master secret, for the commands that run
/// without the service (a backup, a restore): a secret that is not there
/// is an error, never made up.
pub(super) fn server_keys(config: &Config) -> anyhow::Result<ServerKeys> {
    let ring = super::keyring::configured(config, false)
        .context("loading the master secret (LATCHKEY_SECRET_KEY or <data_dir>/secret.key)")?
        .ok_or_else(|| super::keyring::no_secret(config))?;
    Ok(ServerKeys::of_ring(&ring))
}
