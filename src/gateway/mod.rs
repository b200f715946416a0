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

mod body;
pub mod config;
pub mod headers;
mod ops;
pub mod path;
mod proxy;
pub mod routes;
mod serve;
mod state;
mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;

use crate::cache::{RedisHandle, Revocations};
use crate::clock::now_ms;
use crate::domain::tokens::LEEWAY_SECS;
use crate::lifecycle::{drain, Program, Tasks, Trigger};
use crate::limits::Limiter;
use crate::server::connections::{self, Connections};
pub use config::GatewayConfig;
use config::{LimiterStore, RuntimeModel};
use routes::RouteTable;
pub use state::{reload_from, GatewayState};
use worker::{UpstreamSlots, Worker};

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
        ops::describe_metrics();
        let redis = match &config.redis {
            Some(r) => Some(
                RedisHandle::connect(r)
                    .await
                    .context("redis_url (gateway configuration)")?,
            ),
            None => None,
        };
        let retention = config.access_token_ttl + Duration::from_secs(LEEWAY_SECS as u64);
        let revocations = Arc::new(Revocations::new(redis.clone(), retention));
        let tokens = state::fetch_keys(&config, &revocations).await?;
        let accepted_audiences = config.all_audiences();
        let limiter_redis = match config.limiter {
            LimiterStore::Redis => redis.clone(),
            LimiterStore::Local => None,
        };
        // Routes carry their own policies.
        let limiter = Arc::new(Limiter::new(true, limiter_redis));
        let sockets = match config.runtime {
            RuntimeModel::PerCore => config.workers,
            RuntimeModel::WorkStealing => 1,
        };
        let (listeners, local_addr) = serve::bind_per_worker(config.listen, sockets)
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

    /// What a serving thread answers with, without its socket: to drive
    /// the gateway in process (`benches/instructions.rs`). A request needs
    /// `ConnectInfo<SocketAddr>` among its extensions, as a served one has;
    /// what it admits still goes to its upstream over the network.
    pub fn router(&self) -> axum::Router {
        let config = self.state.config.read().expect("config lock");
        let worker = Worker {
            gw: self.state.clone(),
            client: serve::upstream_client(&config),
            limiter: None,
            upstream: UpstreamSlots::share(config.upstream.max_requests, 1),
        };
        serve::worker_router(worker, false)
    }

    /// Serves until `stop` (`lifecycle::signal()`); each of `hangups`
    /// reloads `config_path`. Both are made before the gateway is built.
    async fn run_until_stopped(
        self,
        config_path: PathBuf,
        stop: impl Future<Output = ()> + Send + 'static,
        hangups: state::Hangups,
    ) -> anyhow::Result<()> {
        let reloader = tokio::spawn(hangups.reload(self.state.clone(), config_path));
        let out = self.run_until(stop).await;
        reloader.abort();
        out
    }

    /// Serves until `stop` completes, then stops accepting, lets in-flight
    /// requests finish within `shutdown_timeout_secs`, stops the background tasks.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let st = self.state;
        let (shutdown_timeout, source, runtime, client_conns) = {
            let c = st.config.read().expect("config lock");
            (
                c.shutdown_timeout,
                c.revocations.clone(),
                c.runtime,
                c.connections,
            )
        };
        let mut tasks = Tasks::new();
        tasks.spawn(st.revocations.clone().listen(tasks.shutdown()));
        tasks.spawn(ops::housekeeping(&st).run(tasks.shutdown()));
        // Serve once logouts can be heard (Redis subscribed or a poll
        // answered), for a few seconds at most: before that, authenticated
        // routes would answer 503 under on_unknown_revocations = "refuse".
        if let Some(url) = source.poll_url {
            st.revocations.expect_polls(source.poll_interval);
            tasks.spawn(
                st.revocations
                    .clone()
                    .poll(url, source.poll_interval, tasks.shutdown()),
            );
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while !st.revocations.is_current() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // `listeners`: stop accepting, finish open requests; `kill`: at once.
        let (listeners, kill) = (Trigger::new(), Trigger::new());
        let with_ops = self.admin.is_none();
        let mut workers = Vec::new();
        // One cap for `listen`, whichever thread accepts.
        let public = Connections::new(client_conns);
        for (i, listener) in self.listeners.into_iter().enumerate() {
            let (stop, kill, conns) = (listeners.subscribe(), kill.subscribe(), public.clone());
            workers.push(match runtime {
                RuntimeModel::PerCore => {
                    serve::spawn_worker(i, listener, st.clone(), conns, with_ops, stop, kill)?
                }
                RuntimeModel::WorkStealing => {
                    serve::spawn_shared(listener, st.clone(), conns, with_ops, stop, kill)
                }
            });
        }
        let admin = self.admin.map(|listener| {
            // The ops routes only: this worker sends nothing upstream.
            let worker = Arc::new(Worker {
                gw: st.clone(),
                client: serve::upstream_client(&st.config.read().expect("config lock")),
                limiter: None,
                upstream: UpstreamSlots::share(1, 1),
            });
            let router = ops::ops_routes().with_state(worker);
            tokio::spawn(connections::serve(
                listener,
                router,
                Connections::new(client_conns),
                listeners.subscribe(),
            ))
        });
        stop.await;
        tracing::info!("gateway shutting down: no new connections, finishing in-flight requests");
        listeners.fire();
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
        if !drain(drained, shutdown_timeout).await {
            kill.fire();
        }
        tasks.stop(Duration::from_secs(5)).await;
        tracing::info!("gateway stopped");
        Ok(())
    }
}

/// `latchkey gateway --config FILE`: configuration, logging, runtime, run.
pub fn main(config_path: Option<&Path>, started: Instant) -> ExitCode {
    let program = Program("latchkey gateway");
    let Some(path) = config_path else {
        return program.refuse("--config FILE is required (see deploy/gateway.example.toml)");
    };
    let config = match program.settings(GatewayConfig::load(path)) {
        Ok(c) => c,
        Err(status) => return status,
    };
    crate::telemetry::init_logging(&config.log);
    // This runtime runs only start-up, the background tasks, the admin
    // endpoints and the Redis connection; requests are served by the
    // `workers` threads, each with its own runtime.
    let threads = match config.runtime {
        RuntimeModel::PerCore => 1,
        RuntimeModel::WorkStealing => config.workers,
    };
    let path = path.to_path_buf();
    program.run(Some(threads), async move {
        let redis = config.redis.is_some();
        let polls = config.revocations.poll_url.is_some();
        let routes = config.routes.len();
        config
            .connections
            .prepare_file_limit(config.upstream.max_requests);
        // Before the listener is bound (lifecycle::signal).
        let stop = crate::lifecycle::signal();
        let hangups = state::Hangups::listen();
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
        gw.run_until_stopped(path, stop, hangups).await
    })
}
