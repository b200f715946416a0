//! Gateway mode (`latchkey gateway --config gateway.toml`): a reverse proxy
//! in front of other services that checks latchkey access tokens and applies
//! rate limits, with the service's own token and limiter code.
//!
//! - Tokens are verified locally: keys come from the service's JWKS URL
//!   (fetched at start, every `jwks_refresh_secs`, and on an unknown `kid` at
//!   most every 2 s), verified tokens are cached, and with `redis_url` the
//!   revocations the service publishes (logout, password change, refresh
//!   reuse) arrive by pub/sub within milliseconds, exactly as on a second
//!   service instance.
//! - Rate limits are the service's GCRA limiter, per route, keyed by subject,
//!   client id or address, in process or in Redis.
//! - Upstream connections come from one keep-alive pool (hyper); bodies are
//!   streamed both ways, never buffered.
//! - `/metrics` and `/health/{live,ready}` are served on `admin_listen`, or on
//!   the main address when that is unset.
//! - SIGHUP re-reads the file and swaps the route table (routes, limits,
//!   identity header names, trusted proxies) without touching connections;
//!   an invalid file is refused with one log line and the old table stays.
//!
//! Why hyper and not pingora, and the rest of the design: `docs/gateway.md`.

pub mod config;
pub mod headers;
mod proxy;
pub mod routes;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cache::{RedisHandle, Revocations, UserCache};
use crate::config::{ConfigError, SigningAlgorithm, Sources};
use crate::domain::tokens::{TokenSettings, Tokens, LEEWAY_SECS};
use crate::limits::{Limiter, Policies};
use crate::store::now_ms;
pub use config::GatewayConfig;
use config::LimiterStore;
use routes::RouteTable;

type UpstreamClient = Client<HttpConnector, Body>;

/// Everything a request needs; the route table is swapped on reload.
pub struct GatewayState {
    table: RwLock<Arc<RouteTable>>,
    config: RwLock<GatewayConfig>,
    accepted_audiences: Vec<String>,
    pub tokens: Arc<Tokens>,
    pub limiter: Arc<Limiter>,
    pub revocations: Arc<Revocations>,
    pub redis: Option<RedisHandle>,
    client: UpstreamClient,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    jwks_loaded_at_ms: AtomicI64,
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
        let ignored = restart_only_changes(&old, &new);
        let table = Arc::new(RouteTable::new(&new));
        *self.table.write().expect("route table lock") = table;
        *old = new;
        Ok(ignored)
    }
}

/// Settings a reload cannot change (they shape listeners, pools and the verifier).
fn restart_only_changes(old: &GatewayConfig, new: &GatewayConfig) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let redis = |c: &GatewayConfig| {
        c.redis
            .as_ref()
            .map(|r| (r.url.expose().clone(), r.key_prefix.clone()))
    };
    let checks: [(&'static str, bool); 12] = [
        ("listen", old.listen != new.listen),
        ("admin_listen", old.admin_listen != new.admin_listen),
        ("jwks_url", old.jwks_url != new.jwks_url),
        ("issuer", old.issuer != new.issuer),
        ("audiences", old.audiences != new.audiences),
        ("jwks_refresh_secs", old.jwks_refresh != new.jwks_refresh),
        (
            "access_token_ttl_secs",
            old.access_token_ttl != new.access_token_ttl,
        ),
        (
            "token_cache_capacity",
            old.token_cache_capacity != new.token_cache_capacity,
        ),
        ("redis_url/redis_key_prefix", redis(old) != redis(new)),
        ("rate_limit_store", old.limiter != new.limiter),
        ("upstream", old.upstream != new.upstream),
        (
            "log/log_format/shutdown_timeout_secs",
            old.log_level != new.log_level
                || old.log_format != new.log_format
                || old.shutdown_timeout != new.shutdown_timeout,
        ),
    ];
    for (name, differs) in checks {
        if differs {
            changed.push(name);
        }
    }
    changed
}

/// Bound listeners and the state behind them, ready to run.
pub struct Gateway {
    listener: TcpListener,
    admin: Option<TcpListener>,
    state: Arc<GatewayState>,
}

impl Gateway {
    /// Connects Redis (if configured), fetches the JWKS (retrying for up to
    /// 10 s, since the gateway often starts beside the service), binds.
    pub async fn build(config: GatewayConfig) -> anyhow::Result<Gateway> {
        let metrics = crate::telemetry::metrics_handle();
        describe_metrics();
        let redis = match &config.redis {
            Some(r) => Some(
                RedisHandle::connect(r)
                    .await
                    .context("redis_url (gateway configuration)")?,
            ),
            None => None,
        };
        // The gateway has no user cache; `Revocations` forwards user events to this empty one.
        let users = Arc::new(UserCache::new(16, Duration::from_secs(1)));
        let retention = config.access_token_ttl + Duration::from_secs(LEEWAY_SECS as u64);
        let revocations = Arc::new(Revocations::new(redis.clone(), users, retention));
        let mut tokens = fetch_keys(&config, &revocations).await?;
        let accepted_audiences = config.all_audiences();
        tokens.accept_audiences(accepted_audiences.clone());
        let limiter_redis = match config.limiter {
            LimiterStore::Redis => redis.clone(),
            LimiterStore::Local => None,
        };
        // The service's named policies do not apply here; routes carry their own.
        let policies = Policies::from_sources(&Sources::from_pairs([]))?;
        let limiter = Arc::new(Limiter::new(true, policies, limiter_redis));
        let client = upstream_client(&config);
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding listen = {}", config.listen))?;
        let admin = match config.admin_listen {
            Some(a) => Some(
                TcpListener::bind(a)
                    .await
                    .with_context(|| format!("binding admin_listen = {a}"))?,
            ),
            None => None,
        };
        let state = Arc::new(GatewayState {
            table: RwLock::new(Arc::new(RouteTable::new(&config))),
            config: RwLock::new(config),
            accepted_audiences,
            tokens: Arc::new(tokens),
            limiter,
            revocations,
            redis,
            client,
            metrics,
            jwks_loaded_at_ms: AtomicI64::new(now_ms()),
        });
        Ok(Gateway {
            listener,
            admin,
            state,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
            .as_ref()
            .map(|l| l.local_addr().expect("a bound listener has an address"))
    }

    pub fn state(&self) -> &Arc<GatewayState> {
        &self.state
    }

    /// Serves until SIGTERM or SIGINT; SIGHUP reloads `config_path`.
    pub async fn run_until_stopped(self, config_path: PathBuf) -> anyhow::Result<()> {
        let reloader = tokio::spawn(reload_on_sighup(self.state.clone(), config_path));
        let out = self.run_until(crate::app::shutdown_signal()).await;
        reloader.abort();
        out
    }

    /// Serves until `stop` completes, then stops accepting, lets in-flight
    /// requests finish within `shutdown_timeout_secs`, stops the background tasks.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let st = self.state;
        let shutdown_timeout = st.config.read().expect("config lock").shutdown_timeout;
        let (bg_tx, bg_rx) = watch::channel(false);
        let tasks: Vec<JoinHandle<()>> = vec![
            tokio::spawn(st.revocations.clone().listen(bg_rx.clone())),
            tokio::spawn(housekeeping(st.clone(), bg_rx)),
        ];
        let ops = Router::new()
            .route("/health/live", get(live))
            .route("/health/ready", get(ready))
            .route("/metrics", get(metrics));
        let (main, admin) = match self.admin {
            Some(admin) => (Router::new(), Some((admin, ops.with_state(st.clone())))),
            None => (ops, None),
        };
        let main = main.fallback(proxy::handle).with_state(st.clone());
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut servers = vec![serve(self.listener, main, stop_rx.clone())];
        if let Some((listener, router)) = admin {
            servers.push(serve(listener, router, stop_rx));
        }
        stop.await;
        tracing::info!("gateway shutting down: no new connections, finishing in-flight requests");
        let _ = stop_tx.send(true);
        let drained = async {
            for s in servers {
                match s.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "server error during shutdown"),
                    Err(e) => tracing::warn!(error = %e, "server task failed"),
                }
            }
        };
        if tokio::time::timeout(shutdown_timeout, drained).await.is_err() {
            tracing::warn!("in-flight requests did not finish within the shutdown timeout");
        }
        let _ = bg_tx.send(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        tracing::info!("gateway stopped");
        Ok(())
    }
}

fn serve(
    listener: TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stop.changed().await;
        })
        .await
    })
}

async fn fetch_keys(config: &GatewayConfig, revocations: &Arc<Revocations>) -> anyhow::Result<Tokens> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let settings = TokenSettings {
            issuer: config.issuer.clone(),
            audience: config.audiences[0].clone(),
            algorithm: SigningAlgorithm::EdDsa, // unused: the gateway never signs
            access_ttl: config.access_token_ttl,
            cache_capacity: config.token_cache_capacity,
        };
        match Tokens::from_jwks(settings, config.jwks_url.clone(), revocations.clone()).await {
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

fn upstream_client(config: &GatewayConfig) -> UpstreamClient {
    let u = &config.upstream;
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(u.connect_timeout));
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(60)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(u.pool_idle_timeout)
        .pool_max_idle_per_host(u.pool_max_idle_per_host)
        .pool_timer(TokioTimer::new())
        .build(http)
}

/// Key refreshes, purges of forgotten revocations and full buckets.
async fn housekeeping(st: Arc<GatewayState>, mut shutdown: watch::Receiver<bool>) {
    let refresh = st.config.read().expect("config lock").jwks_refresh;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_keys = Instant::now();
    let mut last_purge = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if last_keys.elapsed() >= refresh {
            last_keys = Instant::now();
            match st.tokens.reload().await {
                Ok(()) => st.jwks_loaded_at_ms.store(now_ms(), Ordering::Relaxed),
                Err(e) => tracing::warn!(error = %e, "refreshing the JWKS failed; keeping the keys we have"),
            }
        }
        if last_purge.elapsed() >= Duration::from_secs(60) {
            last_purge = Instant::now();
            st.revocations.purge();
            st.limiter.purge();
        }
    }
}

#[cfg(unix)]
async fn reload_on_sighup(st: Arc<GatewayState>, path: PathBuf) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; configuration reload disabled");
        return;
    };
    while hup.recv().await.is_some() {
        reload_from(&st, &path);
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_: Arc<GatewayState>, _: PathBuf) {}

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

async fn live() -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        "{\"status\":\"ok\"}",
    )
        .into_response()
}

/// Ready when verification keys are loaded and Redis (if configured) answers.
async fn ready(State(st): State<Arc<GatewayState>>) -> Response {
    let keys = st.tokens.key_count();
    let redis_ok = match &st.redis {
        None => None,
        Some(r) => Some(matches!(
            tokio::time::timeout(Duration::from_secs(1), r.ping()).await,
            Ok(Ok(()))
        )),
    };
    let jwks_age = (now_ms() - st.jwks_loaded_at_ms.load(Ordering::Relaxed)).max(0) / 1000;
    let mut checks = serde_json::Map::new();
    let mut failing = Vec::new();
    checks.insert("jwks".into(), if keys > 0 { "ok" } else { "failing" }.into());
    if keys == 0 {
        failing.push("jwks");
    }
    if let Some(ok) = redis_ok {
        checks.insert("redis".into(), if ok { "ok" } else { "failing" }.into());
        if !ok {
            failing.push("redis");
        }
    }
    if failing.is_empty() {
        (
            StatusCode::OK,
            Json(serde_json::json!({"status": "ok", "checks": checks, "keys": keys, "jwks_age_secs": jwks_age})),
        )
            .into_response()
    } else {
        let message = format!("not ready: {} failing", failing.join(" and "));
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": "UNAVAILABLE", "message": message, "failing": failing, "checks": checks})),
        )
            .into_response()
    }
}

async fn metrics(State(st): State<Arc<GatewayState>>) -> Response {
    metrics::gauge!("latchkey_token_cache_size").set(st.tokens.cache_len() as f64);
    metrics::gauge!("latchkey_revocations_size").set(st.revocations.len() as f64);
    metrics::gauge!("latchkey_gateway_routes").set(st.table().routes().count() as f64);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        st.metrics.render(),
    )
        .into_response()
}

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        "latchkey_gateway_request_duration_seconds",
        Unit::Seconds,
        "Gateway latency to response headers, by route (unmatched: no route)"
    );
    describe_histogram!(
        "latchkey_gateway_upstream_duration_seconds",
        Unit::Seconds,
        "Time from sending to the upstream to its response headers, by route"
    );
    describe_counter!(
        "latchkey_gateway_requests_total",
        "Gateway requests by route and status class"
    );
    describe_counter!(
        "latchkey_gateway_auth_failures_total",
        "Requests refused 401 by route and reason (missing, signature, expired, revoked, audience, ...)"
    );
    describe_counter!(
        "latchkey_gateway_rate_limited_total",
        "Requests refused 429, by route"
    );
    describe_counter!(
        "latchkey_gateway_upstream_errors_total",
        "Upstream failures by route and kind (connect, io: 502; timeout: 504)"
    );
    describe_gauge!("latchkey_gateway_requests_in_flight", "Requests being proxied");
    describe_gauge!("latchkey_gateway_routes", "Routes in the active table");
}

/// `latchkey gateway --config FILE`: configuration, logging, runtime, run.
pub fn main(config_path: Option<&Path>, started: Instant) -> ExitCode {
    let Some(path) = config_path else {
        eprintln!("latchkey gateway: --config FILE is required (see deploy/gateway.example.toml)");
        return ExitCode::from(2);
    };
    let config = match GatewayConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("latchkey gateway: {e}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init_logging(config.log_format, &config.log_level);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latchkey gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = path.to_path_buf();
    let run = async move {
        let redis = config.redis.is_some();
        let routes = config.routes.len();
        let gw = Gateway::build(config).await?;
        tracing::info!(
            address = %gw.local_addr(),
            admin = ?gw.admin_addr(),
            routes,
            redis,
            keys = gw.state().tokens.key_count(),
            startup_ms = started.elapsed().as_millis() as u64,
            "latchkey gateway is serving"
        );
        if !redis {
            tracing::warn!("no redis_url: revocations (logout) are not seen by the gateway; tokens stay valid until they expire");
        }
        gw.run_until_stopped(path).await
    };
    match rt.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("latchkey gateway: {msg}");
            ExitCode::FAILURE
        }
    }
}
