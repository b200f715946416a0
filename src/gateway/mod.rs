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
//! - Requests are served by `workers` threads (default: one per core), each
//!   with its own single-threaded runtime, its own listening socket on the
//!   same address (SO_REUSEPORT) and its own keep-alive pool of upstream
//!   connections (hyper), so that a request and its upstream exchange stay
//!   on one thread. Bodies are streamed both ways, never buffered.
//! - `/metrics` and `/health/{live,ready}` are served on `admin_listen`, or on
//!   the main address when that is unset.
//! - SIGHUP re-reads the file and swaps the route table (routes, limits,
//!   identity header names, trusted proxies) without touching connections;
//!   an invalid file is refused with one log line and the old table stays.
//!
//! Why hyper and not pingora, and the rest of the design: `docs/gateway.md`.

pub mod config;
pub mod headers;
pub mod path;
mod proxy;
pub mod routes;

use std::future::{Future, IntoFuture};
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
use config::{LimiterStore, RuntimeModel};
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

/// What one serving thread's handlers see: the shared state and this
/// thread's own upstream pool (connections stay on the thread that made them).
pub(crate) struct Worker {
    pub gw: Arc<GatewayState>,
    pub client: UpstreamClient,
    /// With Redis buckets: the shared limiter over this thread's own Redis connection.
    pub limiter: Option<Limiter>,
}

impl Worker {
    pub fn limiter(&self) -> &Limiter {
        self.limiter.as_ref().unwrap_or(&self.gw.limiter)
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
    let checks: [(&'static str, bool); 14] = [
        ("listen", old.listen != new.listen),
        ("workers", old.workers != new.workers),
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
            "revocations_url/revocations_poll_ms/on_unknown_revocations",
            old.revocations != new.revocations,
        ),
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
    /// One per serving thread, all bound to `listen` with SO_REUSEPORT.
    listeners: Vec<std::net::TcpListener>,
    local_addr: SocketAddr,
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
        let sockets = match config.runtime {
            RuntimeModel::PerCore => config.workers,
            RuntimeModel::WorkStealing => 1,
        };
        let (listeners, local_addr) = bind_per_worker(config.listen, sockets)
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
            metrics,
            jwks_loaded_at_ms: AtomicI64::new(now_ms()),
        });
        Ok(Gateway {
            listeners,
            local_addr,
            admin,
            state,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
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
        let mut tasks: Vec<JoinHandle<()>> = vec![
            tokio::spawn(st.revocations.clone().listen(bg_rx.clone())),
            tokio::spawn(housekeeping(st.clone(), bg_rx.clone())),
        ];
        // Serve once logouts can be heard (Redis subscribed or a poll
        // answered), for a few seconds at most: before that, authenticated
        // routes would answer 503 under on_unknown_revocations = "refuse".
        let source = st.config.read().expect("config lock").revocations.clone();
        if let Some(url) = source.poll_url {
            st.revocations.expect_polls(source.poll_interval);
            tasks.push(tokio::spawn(st.revocations.clone().poll(
                url,
                source.poll_interval,
                bg_rx,
            )));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while !st.revocations.is_current() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let (kill_tx, kill_rx) = watch::channel(false);
        let with_ops = self.admin.is_none();
        let runtime = st.config.read().expect("config lock").runtime;
        let mut workers = Vec::new();
        for (i, listener) in self.listeners.into_iter().enumerate() {
            let (stop, kill) = (stop_rx.clone(), kill_rx.clone());
            workers.push(match runtime {
                RuntimeModel::PerCore => spawn_worker(i, listener, st.clone(), with_ops, stop, kill)?,
                RuntimeModel::WorkStealing => spawn_shared(listener, st.clone(), with_ops, stop, kill),
            });
        }
        let admin = self.admin.map(|listener| {
            let worker = Arc::new(Worker {
                gw: st.clone(),
                client: upstream_client(&st.config.read().expect("config lock")),
                limiter: None,
            });
            let router = ops_routes().with_state(worker);
            let mut stop = stop_rx.clone();
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
        });
        stop.await;
        tracing::info!("gateway shutting down: no new connections, finishing in-flight requests");
        let _ = stop_tx.send(true);
        let drained = async {
            for w in &mut workers {
                match w.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "server error during shutdown"),
                    Err(_) => tracing::warn!("a serving thread ended abnormally"),
                }
            }
            if let Some(a) = admin {
                let _ = a.await;
            }
        };
        if tokio::time::timeout(shutdown_timeout, drained).await.is_err() {
            tracing::warn!("in-flight requests did not finish within the shutdown timeout");
            let _ = kill_tx.send(true);
        }
        let _ = bg_tx.send(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        tracing::info!("gateway stopped");
        Ok(())
    }
}

fn ops_routes() -> Router<Arc<Worker>> {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
}

/// `workers` listening sockets on `addr` (SO_REUSEPORT: the kernel spreads
/// connections over them). With port 0, the first socket picks the port.
fn bind_per_worker(
    addr: SocketAddr,
    workers: usize,
) -> std::io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let mut listeners = Vec::with_capacity(workers);
    let mut bound = addr;
    let reuseport = cfg!(unix) && workers > 1;
    for _ in 0..(if reuseport { workers } else { 1 }) {
        let socket = if bound.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        #[cfg(unix)]
        if reuseport {
            socket.set_reuseport(true)?;
        }
        socket.set_nodelay(true)?;
        socket.bind(bound)?;
        let listener = socket.listen(1024)?.into_std()?;
        bound = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok((listeners, bound))
}

/// One serving thread: its own single-threaded runtime, listener and
/// upstream pool, so that a request and its upstream exchange never wake
/// another thread (the shared state is the route table, the token cache,
/// the limiter and the revocation set). Ends when `stop` is sent and its
/// connections have finished, or at once on `kill`.
fn spawn_worker(
    index: usize,
    listener: std::net::TcpListener,
    st: Arc<GatewayState>,
    with_ops: bool,
    stop: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
) -> anyhow::Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let client_config = st.config.read().expect("config lock").clone();
    std::thread::Builder::new()
        .name(format!("gateway-{index}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = done_tx.send(Err(e));
                    return;
                }
            };
            let result = rt.block_on(async move {
                // Redis buckets: this thread's own connection (falls back to
                // the shared one, on the background runtime, if it cannot connect).
                let limiter = match (&client_config.redis, client_config.limiter) {
                    (Some(r), LimiterStore::Redis) => match RedisHandle::connect(r).await {
                        Ok(conn) => Some(st.limiter.with_redis_connection(conn)),
                        Err(e) => {
                            tracing::warn!(error = %e, "a serving thread could not open its own Redis connection");
                            None
                        }
                    },
                    _ => None,
                };
                let worker = Worker {
                    gw: st,
                    client: upstream_client(&client_config),
                    limiter,
                };
                serve(listener, worker, with_ops, stop, kill).await
            });
            let _ = done_tx.send(result);
        })
        .context("starting a serving thread")?;
    Ok(done_rx)
}

/// The work-stealing model: one listener served on the calling (multi-threaded)
/// runtime, one upstream pool.
fn spawn_shared(
    listener: std::net::TcpListener,
    st: Arc<GatewayState>,
    with_ops: bool,
    stop: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
) -> tokio::sync::oneshot::Receiver<std::io::Result<()>> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let client = upstream_client(&st.config.read().expect("config lock"));
    tokio::spawn(async move {
        let worker = Worker {
            gw: st,
            client,
            limiter: None,
        };
        let _ = done_tx.send(serve(listener, worker, with_ops, stop, kill).await);
    });
    done_rx
}

/// Serves `listener` (TCP_NODELAY on each connection) with `worker`, and the
/// ops routes if `with_ops`, until `stop` (graceful: open requests finish) or
/// `kill` (at once).
async fn serve(
    listener: std::net::TcpListener,
    worker: Worker,
    with_ops: bool,
    mut stop: watch::Receiver<bool>,
    mut kill: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = TcpListener::from_std(listener)?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let routes = if with_ops { ops_routes() } else { Router::new() };
    let router = routes.fallback(proxy::handle).with_state(Arc::new(worker));
    let server = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        let _ = stop.changed().await;
    });
    tokio::select! {
        r = server.into_future() => r,
        _ = kill.changed() => Ok(()),
    }
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

/// Key refreshes, histogram upkeep, purges of forgotten revocations and full buckets.
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
        // Histogram samples wait in lock-free buckets until drained: drain
        // them every second even when nothing scrapes /metrics (at 30,000
        // requests/s that is two samples per request piling up otherwise).
        st.metrics.run_upkeep();
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
async fn ready(State(w): State<Arc<Worker>>) -> Response {
    let st = &w.gw;
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
    // Informational: whether logouts are being heard (Redis or the poll).
    checks.insert(
        "revocations".into(),
        if st.revocations.is_current() {
            "ok"
        } else {
            "unknown"
        }
        .into(),
    );
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

async fn metrics(State(w): State<Arc<Worker>>) -> Response {
    let st = &w.gw;
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
    // This runtime runs only start-up, the background tasks, the admin
    // endpoints and the Redis connection; requests are served by the
    // `workers` threads, each with its own runtime.
    let threads = match config.runtime {
        RuntimeModel::PerCore => 1,
        RuntimeModel::WorkStealing => config.workers,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latchkey gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = path.to_path_buf();
    let run = async move {
        let redis = config.redis.is_some();
        let polls = config.revocations.poll_url.is_some();
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
        if !redis && !polls {
            tracing::warn!("neither redis_url nor revocations_url: revocations (logout) are not seen by the gateway; tokens stay valid until they expire");
        } else if !polls {
            tracing::warn!("no revocations_url: while Redis is unreachable, authenticated routes answer 503 (on_unknown_revocations)");
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
