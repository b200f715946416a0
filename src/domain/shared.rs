//! What the feature services share: one handle each to the store, the
//! caches, the rate limits and brute-force rules, the hashing pool and the
//! mail outbox, and the settings of accounts. A bag of handles with no rules
//! of its own: the rules are in the services (`signup`, `login`,
//! `passwords`, `mfa`, `sessions`, `admin`, `clients`, `webhooks`) and in
//! the pure decisions they call (`registration`, `refresh`, `codes`,
//! `mfa::challenge`, `limits::bruteforce`).
//!
//! ```text
//!   signup     ──> codebook, sessions, mfa
//!   login      ──> passwords, mfa, sessions
//!   mfa        ──> passwords          (the current password, before a new factor)
//!   passwords  ──> codebook
//!   admin      ──> codebook
//!   clients    ──> tokens
//!   sessions   ──> tokens, refresh
//!   (each of them ──> shared)
//! ```
//!
//! Only `sessions` starts, rotates and ends sessions (`store::create_session`
//! and the refresh rotations); `signup` starts the first one of a verified
//! account in the verification's own transaction, with a draft `sessions`
//! made.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::credcache::{CredentialCache, CredentialCacheSettings};
use super::hashing::HashPool;
use crate::cache::{Revocations, UserCache};
use crate::crypto::{MacKey, Sealer};
use crate::limits::{BruteForce, Limiter, Softlocks};
use crate::mail::Message;
use crate::settings::{secs, ConfigError, Source};
use crate::store::Store;

pub struct Shared {
    pub store: Store,
    pub hashing: Arc<HashPool>,
    /// Passwords verified lately (settings `credential_cache_*`; off by default).
    pub credentials: Option<CredentialCache>,
    pub users: Arc<UserCache>,
    pub revocations: Arc<Revocations>,
    pub limiter: Arc<Limiter>,
    pub brute_force: BruteForce,
    /// Wrong codes and second factors per client address, over every account.
    pub code_guesses: Softlocks,
    /// The key of the MACs of emailed codes and recovery codes.
    pub code_key: MacKey,
    pub outbox: Outbox,
}

impl Shared {
    /// The caches of an account (here and, through Redis, on the other
    /// instances) forget it: its password, its record.
    pub async fn forget_user(&self, user_id: &str, email: &str) {
        if let Some(c) = &self.credentials {
            c.forget(user_id);
        }
        self.revocations.user_changed(email).await;
    }
}

/// Mail goes out through the database: sealed into the outbox in the
/// transaction of the change that causes it, sent by the worker
/// (`mail::outbox`), which is woken once the change is committed.
#[derive(Clone)]
pub struct Outbox {
    pub sealer: Arc<Sealer>,
    pub wake: Arc<Notify>,
}

impl Outbox {
    pub fn seal(&self, m: &Message) -> Vec<u8> {
        m.seal(&self.sealer)
    }

    /// Mail was committed: the worker sends it now rather than at its next poll.
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// How long sessions and unverified accounts live, the credential cache,
/// and how long the audit trail keeps an event.
#[derive(Clone, Debug)]
pub struct AccountSettings {
    pub refresh_ttl: Duration,
    /// A rotated refresh token still refreshes this long (a client's retry).
    pub refresh_grace: Duration,
    /// Accounts never verified are deleted this long after their last registration.
    pub unverified_ttl: Duration,
    pub credential_cache: Option<CredentialCacheSettings>,
    /// How long the audit trail keeps an event.
    pub event_retention: Duration,
}

impl AccountSettings {
    pub fn read(src: &impl Source) -> Result<AccountSettings, ConfigError> {
        Ok(AccountSettings {
            refresh_ttl: src.get(
                "refresh_token_ttl_secs",
                Duration::from_secs(30 * 86_400),
                secs(60, 365 * 86_400),
            )?,
            refresh_grace: src.get("refresh_grace_secs", Duration::from_secs(10), secs(0, 300))?,
            unverified_ttl: src.get(
                "unverified_account_ttl_secs",
                Duration::from_secs(7 * 86_400),
                secs(60, 365 * 86_400),
            )?,
            credential_cache: CredentialCacheSettings::read(src)?,
            event_retention: src.get("event_retention_days", Duration::from_secs(90 * 86_400), |s| {
                secs(1, 3650)(s).map(|d| d * 86_400)
            })?,
        })
    }
}
