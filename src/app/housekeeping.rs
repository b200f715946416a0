//! The service's periodic work: one [`Housekeeping`] task whose chores are
//! listed here, each with its period. A chore that fails is logged when it
//! starts failing and when it works again, and counted
//! (`latchkey_housekeeping_failures_total{chore}`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Services;
use crate::clock::now_ms;
use crate::lifecycle::{Chore, Every, Housekeeping};

/// How long what ended stays for audit, or for a late second presentation
/// to be recognised (sessions, codes, authorization codes).
const A_DAY_MS: i64 = 86_400_000;

/// Key reloads (rotation reaches every instance), the revocation resync
/// from the database (a safety net under Redis), the user cache's resync,
/// the gauges, and the purges.
pub(super) fn chores(st: &Arc<Services>) -> Housekeeping {
    let minute = Duration::from_secs(60);
    let upkeep = Duration::from_secs(5);
    let mut chores = Housekeeping::new();
    if let Some(dir) = st.config.backups.dir.clone() {
        // The embedded database's scheduled backup (docs/backup.md).
        let keep = st.config.backups.keep;
        chores = chores.every(
            "backup",
            st.config.backups.interval,
            with(st, move |st| {
                let dir = dir.clone();
                async move {
                    let now = now_ms();
                    super::backup::scheduled(&st.store, &st.backup_key, &dir, keep, now)
                        .await
                        .map_err(|e| format!("{e:#}"))?;
                    metrics::gauge!("latchkey_backup_last_success_timestamp_seconds")
                        .set((now / 1000) as f64);
                    Ok(())
                }
            }),
        );
    }
    chores
        .every(
            "signing_key_reload",
            st.config.tokens.key_refresh_interval,
            with(st, |st| async move {
                st.tokens.refresh().await.map_err(|e| e.to_string())
            }),
        )
        // Every half second it may run: see `RevocationResync`.
        .every(
            "revocation_resync",
            Duration::from_millis(500),
            RevocationResync::new(st),
        )
        .every(
            "histogram_upkeep",
            upkeep,
            with(st, |st| async move {
                // Histogram samples wait in lock-free buckets until drained:
                // drain them even when nothing scrapes /metrics, or they pile up.
                st.metrics.run_upkeep();
                Ok(())
            }),
        )
        .every(
            "outbox_gauges",
            upkeep,
            with(st, |st| async move {
                let (backlog, oldest, dead) = st.store.outbox_backlog().await.map_err(|e| e.to_string())?;
                metrics::gauge!("latchkey_outbox_backlog").set(backlog as f64);
                let age = oldest
                    .map(|t| (now_ms() - t).max(0) as f64 / 1000.0)
                    .unwrap_or(0.0);
                metrics::gauge!("latchkey_outbox_oldest_age_seconds").set(age);
                metrics::gauge!("latchkey_outbox_dead_letters").set(dead as f64);
                Ok(())
            }),
        )
        .every("user_cache_resync", upkeep, UserCacheResync::new(st))
        .every(
            "purge_local_state",
            minute,
            with(st, |st| async move {
                st.revocations.purge();
                st.limiter.purge();
                st.shared.brute_force.purge();
                Ok(())
            }),
        )
        // Ended sessions stay a day for audit.
        .every(
            "purge_sessions",
            minute,
            with(st, |st| async move {
                st.store
                    .purge_sessions(now_ms() - A_DAY_MS)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
        .every(
            "purge_retired_keys",
            minute,
            with(st, |st| async move {
                st.tokens
                    .purge_retired()
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
        // Codes, real and shadow alike, a day after they expired.
        .every(
            "purge_codes",
            minute,
            with(st, |st| async move {
                st.store
                    .purge_codes(now_ms() - A_DAY_MS)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
        // Authorization codes a day after they expired: until then a second
        // presentation is still recognised (and ends the session the first
        // one started) rather than answered as unknown.
        .every(
            "purge_authorization_codes",
            minute,
            with(st, |st| async move {
                let before = now_ms() - A_DAY_MS;
                st.store
                    .purge_authorization_codes(before)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
        .every(
            "purge_unverified_accounts",
            minute,
            with(st, |st| async move {
                let ttl = st.config.accounts.unverified_ttl.as_millis() as i64;
                let n = st
                    .store
                    .purge_unverified_users(now_ms() - ttl)
                    .await
                    .map_err(|e| e.to_string())?;
                if n > 0 {
                    tracing::info!(accounts = n, "deleted accounts never verified");
                }
                Ok(())
            }),
        )
        // Audit events past their retention, and the delivery history that
        // goes with the events it delivered.
        .every(
            "purge_events",
            minute,
            with(st, |st| async move {
                let before = now_ms() - st.config.accounts.event_retention.as_millis() as i64;
                st.store.purge_events(before).await.map_err(|e| e.to_string())?;
                st.store
                    .purge_deliveries(before)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
        // Logins that never passed their second factor, ceremonies never
        // finished, TOTP enrolments never confirmed.
        .every(
            "purge_factor_challenges",
            minute,
            with(st, |st| async move {
                st.features
                    .factors
                    .purge()
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
        .every(
            "purge_dead_letters",
            minute,
            with(st, |st| async move {
                let before = now_ms() - st.config.mail.dead_letter_ttl.as_millis() as i64;
                st.store
                    .purge_dead_letters(before)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        )
}

/// A chore that needs only the services.
fn with<F, Fut>(st: &Arc<Services>, work: F) -> impl Chore + 'static
where
    F: Fn(Arc<Services>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let st = st.clone();
    move || work(st.clone())
}

/// Revocations are reloaded from the database every 5 s while Redis
/// carries them (a safety net), every half second while it cannot: then a
/// logout on one instance reaches every other within a second. On SQLite
/// too: its file has one server, but the command line writes to it as well
/// (a client removed there is refused within a second).
struct RevocationResync {
    st: Arc<Services>,
    slow: Every,
    /// Where the next read starts: 10 s before the last one began (the
    /// overlap absorbs commit delays).
    from: i64,
}

impl RevocationResync {
    fn new(st: &Arc<Services>) -> RevocationResync {
        RevocationResync {
            st: st.clone(),
            slow: Every::new(Duration::from_secs(5)),
            from: now_ms() - 10_000,
        }
    }
}

impl Chore for RevocationResync {
    fn run(&mut self) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move {
            if !self.slow.due() && self.st.revocations.hears_other_instances() {
                return Ok(());
            }
            let now = now_ms();
            self.st
                .revocations
                .load_from_store(&self.st.store, self.from)
                .await
                .map_err(|e| e.to_string())?;
            self.from = now - 10_000;
            Ok(())
        })
    }
}

/// The safety net under "user changed" events: a password changed on
/// another instance whose Redis publish was lost is forgotten here within
/// seconds, not at the end of the cache's lifetime.
struct UserCacheResync {
    st: Arc<Services>,
    /// As [`RevocationResync::from`].
    from: i64,
}

impl UserCacheResync {
    fn new(st: &Arc<Services>) -> UserCacheResync {
        UserCacheResync {
            st: st.clone(),
            from: now_ms() - 10_000,
        }
    }
}

impl Chore for UserCacheResync {
    fn run(&mut self) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move {
            let now = now_ms();
            let emails = self
                .st
                .store
                .users_changed_since(self.from)
                .await
                .map_err(|e| e.to_string())?;
            self.from = now - 10_000;
            for e in emails {
                self.st.users.forget(&e);
            }
            Ok(())
        })
    }
}
