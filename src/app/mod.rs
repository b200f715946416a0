//! The service: its configuration (`config`), its parts wired together
//! (`services`), its background work (`housekeeping`), and the
//! [`Application`] that the binary and the tests run alike (tests pass
//! port 0).

pub mod backup;
pub mod config;
mod housekeeping;
pub mod keyring;
mod services;

pub use services::Services;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::lifecycle::{drain, Tasks, Trigger};
use crate::mail::{MailSink, OutboxWorker};
use crate::server::connections::{serve, Connections};
use config::Config;

/// Applies the database's migrations (`latchkey migrate`): the backend's
/// name.
pub async fn migrate(config: &crate::store::DatabaseConfig) -> anyhow::Result<&'static str> {
    let store = crate::store::Store::connect(config).await?;
    store.migrate().await?;
    Ok(store.backend_name())
}

/// The database, migrated, without the rest of the service (what the
/// command line's seeding needs).
pub async fn store(config: &crate::store::DatabaseConfig) -> anyhow::Result<crate::store::Store> {
    let store = crate::store::Store::connect(config).await?;
    store.migrate().await?;
    Ok(store)
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
        let services = Services::build(config).await?;
        Self::with_services(services).await
    }

    pub async fn with_services(services: Arc<Services>) -> anyhow::Result<Application> {
        let http = &services.config.http;
        let listen = http.listen;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding LATCHKEY_LISTEN={listen}"))?;
        let admin = match http.admin_listen {
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

    /// Serves until `stop` completes, then shuts down gracefully: stop
    /// accepting, let in-flight requests finish within `shutdown_timeout`,
    /// stop the background tasks, close the pools.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let st = self.services.clone();
        let mut tasks = Tasks::new();
        spawn_background(&st, &mut tasks);
        let listeners = Trigger::new();
        let api = st.api_state();
        let connections = st.config.http.connections;
        let server = tokio::spawn(serve(
            self.listener,
            crate::http::router(api.clone()),
            Connections::new(connections),
            listeners.subscribe(),
        ));
        if let Some(admin) = self.admin {
            tasks.spawn(serve(
                admin,
                crate::http::admin_router(api),
                Connections::new(connections),
                listeners.subscribe(),
            ));
        }
        stop.await;
        tracing::info!("shutting down: no new connections, finishing in-flight requests");
        listeners.fire();
        drain(
            async {
                let _ = server.await;
            },
            st.config.shutdown_timeout,
        )
        .await;
        tasks.stop(Duration::from_secs(5)).await;
        st.store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The outbox worker, the revocation listener and the housekeeping loop.
fn spawn_background(st: &Arc<Services>, tasks: &mut Tasks) {
    match MailSink::new(&st.config.mail.transport) {
        Ok(sink) => {
            let worker = OutboxWorker::new(
                st.store.clone(),
                sink,
                st.shared.outbox.sealer.clone(),
                st.config.mail.from.clone(),
                st.mail_wake.clone(),
            );
            tasks.spawn(worker.run(tasks.shutdown()));
        }
        Err(e) => tracing::error!(error = %e, "mail sink unusable; mail stays queued"),
    }
    let deliveries = crate::webhooks::DeliveryWorker::new(
        st.store.clone(),
        st.shared.outbox.sealer.clone(),
        st.config.webhooks.clone(),
        st.features.clients.clone(),
    );
    tasks.spawn(deliveries.run(tasks.shutdown()));
    tasks.spawn(st.revocations.clone().listen(tasks.shutdown()));
    tasks.spawn(housekeeping::chores(st).run(tasks.shutdown()));
}
