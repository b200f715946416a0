//! The service's periodic work, one task.

use std::sync::Arc;
use std::time::Duration;

use super::Services;
use crate::clock::now_ms;
use crate::lifecycle::{Every, Shutdown, Ticks};

/// Periodic work, one task: key reloads (rotation reaches every instance),
/// revocation resync from the database (a safety net under Redis), purges,
/// and the outbox gauges.
pub(super) async fn run(st: Arc<Services>, shutdown: Shutdown) {
    // Each chore has its own period; the tick only bounds how late one runs.
    let mut ticks = Ticks::every(Duration::from_millis(250), shutdown);
    let mut keys = Every::new(st.config.tokens.key_refresh_interval);
    // Revocations are reloaded from the database every 5 s while Redis
    // carries them (a safety net), every half second while it cannot: then
    // a logout on one instance reaches every other within a second. On
    // SQLite too: its file has one server, but the command line writes to
    // it as well (a client removed there is refused within a second).
    let mut resync = Every::new(Duration::from_secs(5));
    let mut fast_resync = Every::new(Duration::from_millis(500));
    let mut resync_failing = false;
    let mut purge = Every::new(Duration::from_secs(60));
    let mut resync_from = now_ms() - 10_000;
    let mut users_from = now_ms() - 10_000;
    while ticks.next().await {
        if keys.due() {
            if let Err(e) = st.tokens.reload().await {
                tracing::warn!(error = %e, "reloading signing keys failed");
            }
        }
        let upkeep = resync.due();
        if upkeep || (fast_resync.due() && !st.revocations.hears_other_instances()) {
            let now = now_ms();
            match st.revocations.load_from_store(&st.store, resync_from).await {
                Ok(()) => {
                    resync_from = now - 10_000; // overlap absorbs commit delays
                    if std::mem::take(&mut resync_failing) {
                        tracing::info!("revocation resync works again");
                    }
                }
                // Once per outage, not twice a second.
                Err(e) if !resync_failing => {
                    resync_failing = true;
                    tracing::warn!(error = %e, "revocation resync failed");
                }
                Err(_) => {}
            }
        }
        if upkeep {
            let now = now_ms();
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
        if purge.due() {
            st.revocations.purge();
            st.limiter.purge();
            st.shared.brute_force.purge();
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
            // Authorization codes a day after they expired: until then a
            // second presentation is still recognised (and ends the session
            // the first one started) rather than answered as unknown.
            if let Err(e) = st.store.purge_authorization_codes(now - 86_400_000).await {
                tracing::warn!(error = %e, "purging authorization codes failed");
            }
            let ttl = st.config.accounts.unverified_ttl.as_millis() as i64;
            match st.store.purge_unverified_users(now - ttl).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(accounts = n, "deleted accounts never verified"),
                Err(e) => tracing::warn!(error = %e, "purging unverified accounts failed"),
            }
            let keep = st.config.accounts.event_retention.as_millis() as i64;
            if let Err(e) = st.store.purge_events(now - keep).await {
                tracing::warn!(error = %e, "purging audit events failed");
            }
            // The delivery history goes with the events it delivered.
            if let Err(e) = st.store.purge_deliveries(now - keep).await {
                tracing::warn!(error = %e, "purging webhook deliveries failed");
            }
            // Logins that never passed their second factor, ceremonies never
            // finished, TOTP enrolments never confirmed.
            if let Err(e) = st.features.factors.purge().await {
                tracing::warn!(error = %e, "purging second-factor challenges failed");
            }
            let ttl = st.config.mail.dead_letter_ttl.as_millis() as i64;
            if let Err(e) = st.store.purge_dead_letters(now - ttl).await {
                tracing::warn!(error = %e, "purging dead letters failed");
            }
        }
    }
}
