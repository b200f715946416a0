//! What an administrator (a client holding the `latchkey:admin` scope) may
//! do to accounts: list and read them, rename, disable and enable, erase,
//! end their sessions, mail a password-reset code, and create one (with a
//! password or a hash of another system, `import.rs`). Resetting an
//! account's second factors is `mfa::SecondFactors::admin_reset`. The HTTP
//! edge checks the scope (`http::extract::AdminToken`); these operations
//! trust it.

use std::sync::Arc;

use serde::Serialize;

use super::codebook::CodeBook;
use super::import::{Checked, ImportRecord};
use super::input::Email;
use super::shared::Shared;
use super::AuthError;
use crate::clock::{now_ms, rfc3339};
use crate::store::{EmailChange, Event, ImportOutcome, Purpose, UserRecord};
pub use crate::store::{EventFilter, UserFilter};

/// The most accounts one page holds.
pub const MAX_PAGE: i64 = 200;

/// An account as an administrator sees it (never its password hash).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AdminUser {
    pub id: String,
    pub email: String,
    pub name: Option<String>,
    pub email_verified: bool,
    pub disabled: bool,
    /// RFC 3339 time, UTC.
    pub created_at: String,
}

impl From<UserRecord> for AdminUser {
    fn from(u: UserRecord) -> Self {
        AdminUser {
            id: u.id,
            email: u.email,
            name: u.name,
            email_verified: u.email_verified_at.is_some(),
            disabled: u.disabled_at.is_some(),
            created_at: rfc3339(u.created_at),
        }
    }
}

/// A page of accounts and the cursor of the next one (`None`: the last).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserPage {
    pub users: Vec<AdminUser>,
    pub next_cursor: Option<String>,
}

/// The changes of `PATCH /admin/users/{id}`; a field left out stays.
#[derive(Debug, Default)]
pub struct UserChange {
    /// `Some(None)` clears the name.
    pub name: Option<Option<String>>,
    pub disabled: Option<bool>,
    /// A new email: the account is unverified until a code sent there is
    /// entered, and every session ends.
    pub email: Option<Email>,
}

const NO_USER: AuthError = AuthError::NotFound("user");

/// An audit event as the admin API shows it. Deliberately its own type
/// beside `store::EventRecord` (the row): the API's shape (times as text and
/// milliseconds, the schema) stays stable whatever the table becomes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditEvent {
    pub id: i64,
    /// RFC 3339 time, UTC (whole seconds); `at_ms` has the milliseconds.
    pub at: String,
    pub at_ms: i64,
    /// A dotted kind (docs/events.md).
    pub kind: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    /// The admin client that acted, when not the user.
    pub actor: Option<String>,
    pub ip: Option<String>,
    /// A reason code, a client id or a key id.
    pub reason: Option<String>,
}

/// A page of events and the cursor of the next one (`None`: the last).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventPage {
    pub events: Vec<AuditEvent>,
    pub next_cursor: Option<String>,
}

pub struct Admin {
    shared: Arc<Shared>,
    codes: Arc<CodeBook>,
}

impl Admin {
    pub fn new(shared: Arc<Shared>, codes: Arc<CodeBook>) -> Admin {
        Admin { shared, codes }
    }

    /// A page of accounts in creation order, `limit` at most [`MAX_PAGE`].
    pub async fn users(&self, filter: &UserFilter, limit: i64) -> Result<UserPage, AuthError> {
        let limit = limit.clamp(1, MAX_PAGE);
        // One more than asked tells whether another page follows.
        let mut users = self.shared.store.users_page(filter, limit + 1).await?;
        let next_cursor = if users.len() as i64 > limit {
            users.truncate(limit as usize);
            users.last().map(|u| u.id.clone())
        } else {
            None
        };
        Ok(UserPage {
            users: users.into_iter().map(AdminUser::from).collect(),
            next_cursor,
        })
    }

    /// A page of the audit trail, oldest first, `limit` at most [`MAX_PAGE`].
    pub async fn events(&self, filter: &EventFilter, limit: i64) -> Result<EventPage, AuthError> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut events = self.shared.store.events_page(filter, limit + 1).await?;
        let next_cursor = if events.len() as i64 > limit {
            events.truncate(limit as usize);
            events.last().map(|e| e.id.to_string())
        } else {
            None
        };
        Ok(EventPage {
            events: events
                .into_iter()
                .map(|e| AuditEvent {
                    id: e.id,
                    at: rfc3339(e.at),
                    at_ms: e.at,
                    kind: e.kind,
                    user_id: e.user_id,
                    session_id: e.session_id,
                    actor: e.actor,
                    ip: e.ip,
                    reason: e.reason,
                })
                .collect(),
            next_cursor,
        })
    }

    pub async fn get(&self, id: &str) -> Result<AdminUser, AuthError> {
        Ok(self.user(id).await?.into())
    }

    async fn user(&self, id: &str) -> Result<UserRecord, AuthError> {
        // Account ids are UUIDs: anything else names no account.
        if uuid::Uuid::try_parse(id).is_err() {
            return Err(NO_USER);
        }
        self.shared.store.user_by_id(id).await?.ok_or(NO_USER)
    }

    /// Renames, disables or enables an account. Disabling ends every session
    /// at once (their access tokens are refused everywhere, as after a
    /// logout); a disabled account cannot log in or verify until enabled.
    pub async fn update_user(
        &self,
        actor: &str,
        id: &str,
        change: UserChange,
    ) -> Result<AdminUser, AuthError> {
        let user = self.user(id).await?;
        let now = now_ms();
        // The one change that can be refused (the email is taken) goes
        // first, so that a refused request changes nothing; a field that
        // already has its value is left alone (no write, no event).
        if let Some(email) = change.email.as_ref().filter(|e| e.as_str() != user.email) {
            self.change_email(actor, &user, email).await?;
        }
        if let Some(name) = change.name.filter(|n| *n != user.name) {
            if !self
                .shared
                .store
                .set_user_name(id, name.as_deref(), now, actor)
                .await?
            {
                return Err(NO_USER);
            }
        }
        if let Some(disabled) = change.disabled.filter(|d| *d != user.disabled_at.is_some()) {
            let ended = self
                .shared
                .store
                .set_user_disabled(id, disabled, now, actor)
                .await?
                .ok_or(NO_USER)?;
            self.shared.revocations.revoke(&ended).await;
        }
        self.shared.forget_user(&user.id, &user.email).await;
        self.get(id).await
    }

    /// A new email for an account: the store's change (sessions end, the old
    /// address is told), then a verification code to the new address.
    async fn change_email(&self, actor: &str, user: &UserRecord, email: &Email) -> Result<(), AuthError> {
        let notice = crate::mail::Message::email_changed(&user.email).seal(&self.shared.outbox.sealer);
        let outcome = self
            .shared
            .store
            .change_email(&user.id, email.as_str(), &notice, now_ms(), actor)
            .await?;
        match outcome {
            EmailChange::Changed { ended, .. } => {
                self.shared.revocations.revoke(&ended).await;
                self.shared.revocations.user_changed(email.as_str()).await;
                self.shared.brute_force.forget_known(&user.email).await;
                self.codes.issue(email, Purpose::VerifyEmail, true).await?;
                self.shared.outbox.wake();
                Ok(())
            }
            EmailChange::NoUser => Err(NO_USER),
            EmailChange::Taken => Err(AuthError::EmailTaken),
        }
    }

    /// Erases an account: the user, its sessions, refresh tokens and codes
    /// are deleted, and the access tokens of its sessions are refused.
    pub async fn delete_user(&self, actor: &str, id: &str) -> Result<(), AuthError> {
        let user = self.user(id).await?;
        let ended = self
            .shared
            .store
            .delete_user(id, now_ms(), actor)
            .await?
            .ok_or(NO_USER)?;
        self.shared.revocations.revoke(&ended).await;
        self.shared.forget_user(&user.id, &user.email).await;
        self.shared.brute_force.forget_known(&user.email).await;
        tracing::info!(user_id = %id, "account erased by an administrator");
        Ok(())
    }

    /// Lifts the brute-force locks and delays of an account, for every
    /// client address. (Those live in Redis or in memory, not in the
    /// database: the event is the only row written.)
    pub async fn unlock(&self, actor: &str, id: &str) -> Result<(), AuthError> {
        let user = self.user(id).await?;
        self.shared.brute_force.unlock(&user.email).await;
        let e = Event::new("user.unlocked", now_ms()).user(id).actor(actor);
        self.shared.store.record_event(&e).await?;
        Ok(())
    }

    /// Ends every session of an account.
    pub async fn end_sessions(&self, actor: &str, id: &str) -> Result<(), AuthError> {
        let user = self.user(id).await?;
        let ended = self
            .shared
            .store
            .revoke_user_sessions(&user.id, None, "ended_by_admin", now_ms(), Some(actor))
            .await?;
        self.shared.revocations.revoke(&ended).await;
        tracing::info!(user_id = %id, client_id = %actor, "sessions ended by an administrator");
        Ok(())
    }

    /// Mails the account a password-reset code (as `POST
    /// /auth/password-reset` would, without its per-address limits).
    pub async fn password_reset(&self, actor: &str, id: &str) -> Result<(), AuthError> {
        let user = self.user(id).await?;
        let email = Email::parse("email", &user.email)?;
        let e = Event::new("password.reset_requested", now_ms())
            .user(id)
            .actor(actor);
        self.codes
            .issue_with(&email, Purpose::ResetPassword, true, Some(e))
            .await
    }

    /// Creates one account (the admin API): `AuthError::EmailTaken` if the
    /// email has one.
    pub async fn create_user(&self, actor: &str, record: ImportRecord) -> Result<AdminUser, AuthError> {
        let Checked { mut user, plain } = record.check(true, now_ms()).map_err(AuthError::BadRequest)?;
        if let Some(p) = plain {
            user.password_hash = self
                .shared
                .hashing
                .run("hash", move |h| h.hash(p.expose()))
                .await?;
        }
        let id = user.id.clone();
        let (outcome, _) = self
            .shared
            .store
            .import_users(&[user], false, now_ms(), actor)
            .await?;
        if outcome.first() != Some(&ImportOutcome::Created) {
            return Err(AuthError::EmailTaken);
        }
        self.get(&id).await
    }
}
