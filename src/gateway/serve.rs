//! Serving: the listening sockets, the serving threads and their runtimes
//! (one single-threaded runtime per core, or one work-stealing runtime),
//! and each thread's own pool of upstream connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;

use super::config::{GatewayConfig, LimiterStore};
use super::ops::ops_routes;
use super::proxy;
use super::state::GatewayState;
use super::worker::{UpstreamClient, UpstreamSlots, Worker};
use crate::cache::RedisHandle;
use crate::lifecycle::Shutdown;
use crate::server::connections::{self, Connections};

/// `workers` listening sockets on `addr` (SO_REUSEPORT: the kernel spreads
/// connections over them). With port 0, the first socket picks the port.
pub(super) fn bind_per_worker(
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
pub(super) fn spawn_worker(
    index: usize,
    listener: std::net::TcpListener,
    st: Arc<GatewayState>,
    connections: Connections,
    with_ops: bool,
    stop: Shutdown,
    kill: Shutdown,
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
                    upstream: UpstreamSlots::share(
                        client_config.upstream.max_requests,
                        client_config.workers,
                    ),
                };
                serve(listener, worker, connections, with_ops, stop, kill).await
            });
            let _ = done_tx.send(result);
        })
        .context("starting a serving thread")?;
    Ok(done_rx)
}

/// The work-stealing model: one listener served on the calling (multi-threaded)
/// runtime, one upstream pool.
pub(super) fn spawn_shared(
    listener: std::net::TcpListener,
    st: Arc<GatewayState>,
    connections: Connections,
    with_ops: bool,
    stop: Shutdown,
    kill: Shutdown,
) -> tokio::sync::oneshot::Receiver<std::io::Result<()>> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (client, upstream) = {
        let config = st.config.read().expect("config lock");
        let slots = UpstreamSlots::share(config.upstream.max_requests, 1);
        (upstream_client(&config), slots)
    };
    tokio::spawn(async move {
        let worker = Worker {
            gw: st,
            client,
            limiter: None,
            upstream,
        };
        let _ = done_tx.send(serve(listener, worker, connections, with_ops, stop, kill).await);
    });
    done_rx
}

/// Serves `listener` with `worker`, and the ops routes if `with_ops`, until
/// `stop` (graceful: open requests finish) or `kill` (at once).
async fn serve(
    listener: std::net::TcpListener,
    worker: Worker,
    connections: Connections,
    with_ops: bool,
    stop: Shutdown,
    mut kill: Shutdown,
) -> std::io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let router = worker_router(worker, with_ops);
    tokio::select! {
        _ = connections::serve(listener, router, connections, stop) => Ok(()),
        _ = kill.wait() => Ok(()),
    }
}

/// What one serving thread answers with: every request goes upstream
/// through [`proxy::handle`], except the ops routes if `with_ops`.
pub(super) fn worker_router(worker: Worker, with_ops: bool) -> Router {
    let routes = if with_ops { ops_routes() } else { Router::new() };
    routes.fallback(proxy::handle).with_state(Arc::new(worker))
}

pub(super) fn upstream_client(config: &GatewayConfig) -> UpstreamClient {
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
