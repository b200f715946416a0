//! Passwords: checking one under the brute-force rules (a login's first
//! factor, or the current password before a sensitive change), changing
//! one, and resetting one with a mailed code. Every check pays the same
//! argon2 cost whether or not the account exists, and records a refused
//! attempt the same way.

use std::net::IpAddr;
use std::sync::Arc;

use super::codebook::CodeBook;
use super::codes::MAX_FAILURES;
use super::input::{Code, Email, Password};
use super::shared::Shared;
use super::tokens::Verified;
use super::AuthError;
use crate::clock::now_ms;
use crate::limits::{Attempt, PolicyName};
use crate::store::{Event, KeepSessions, Purpose, UserRecord, UNUSABLE_PASSWORD};

pub struct Passwords {
    shared: Arc<Shared>,
    codes: Arc<CodeBook>,
}

impl Passwords {
    pub fn new(shared: Arc<Shared>, codes: Arc<CodeBook>) -> Passwords {
        Passwords { shared, codes }
    }

    /// Checks a password for an email, paying the same argon2 cost whether or
    /// not the account exists, under the brute-force rules: the attempt is
    /// counted before the password is checked (so parallel guesses cannot
    /// slip through), cleared by a right password, taken back if it never
    /// reached a verdict (shed by the hashing pool, or a store failure).
    pub async fn check(
        &self,
        ip: IpAddr,
        email: &Email,
        password: &Password,
    ) -> Result<Arc<UserRecord>, AuthError> {
        let s = &self.shared;
        let client = s.limiter.ip_key(ip);
        let (account, client) = (email.as_str(), client.as_str());
        let attempt = self.begin_attempt(account, client).await?;
        // The per-account limit comes after the brute-force rules admitted
        // the attempt, so that attempts they refuse cannot drain it, and an
        // address the account logged in from does not spend it.
        if attempt.counted_for_account() {
            if let Err(l) = s.limiter.check(PolicyName::LoginAccount, account).await {
                s.brute_force.abandon(account, client, attempt).await;
                return Err(l.into());
            }
        }
        match self.verify(email, password).await {
            Ok((Some(u), true)) => {
                let verified = u.email_verified_at.is_some();
                s.brute_force.success(account, client, attempt, verified).await;
                Ok(u)
            }
            Ok((user, _)) => {
                // The same records (and work) whether or not the account
                // exists: only the user id differs, and only admins see it.
                let id = user.as_ref().map(|u| u.id.as_str());
                self.attempt_failed(id, ip, "invalid_credentials", &attempt).await;
                Err(AuthError::InvalidCredentials)
            }
            Err(e) => {
                s.brute_force.abandon(account, client, attempt).await;
                Err(e)
            }
        }
    }

    /// The current password of the token's account, checked before a step
    /// a stolen session must not take (a new password, a new factor): under
    /// the account's password-change limit and under the brute-force rules
    /// of its logins, as a login attempt from `ip` (a wrong one counts as a
    /// failed login of the account and is recorded as `login.failed` with
    /// reason `current_password`). An account that has no password (one
    /// verified while its registration was contested) has none to prove:
    /// `current` must then be `None`, and its session, which only the
    /// mailbox's owner can have, may set one.
    pub async fn check_current(
        &self,
        token: &Verified,
        ip: IpAddr,
        current: Option<Password>,
    ) -> Result<UserRecord, AuthError> {
        let s = &self.shared;
        s.limiter
            .check(PolicyName::PasswordAccount, &token.claims.sub)
            .await?;
        let Some(user) = s.store.user_by_id(&token.claims.sub).await? else {
            return Err(AuthError::InvalidToken);
        };
        // No password given: right only for an account that has none (a
        // missing one proves nothing, as a wrong one; it guesses nothing
        // either, so it is not counted).
        let Some(current) = current else {
            return if user.password_hash == UNUSABLE_PASSWORD {
                Ok(user)
            } else {
                Err(AuthError::InvalidCredentials)
            };
        };
        let client = s.limiter.ip_key(ip);
        let (account, client) = (user.email.as_str(), client.as_str());
        let attempt = self.begin_attempt(account, client).await?;
        let ok = if user.password_hash == UNUSABLE_PASSWORD {
            self.dummy_verify(&current).await.map(|()| false)
        } else {
            s.hashing
                .verify(&user.id, &current, &user.password_hash)
                .await
                .map_err(AuthError::from)
        };
        match ok {
            Ok(true) => {
                s.brute_force.success(account, client, attempt, true).await;
                Ok(user)
            }
            Ok(false) => {
                self.attempt_failed(Some(&user.id), ip, "current_password", &attempt)
                    .await;
                Err(AuthError::InvalidCredentials)
            }
            Err(e) => {
                s.brute_force.abandon(account, client, attempt).await;
                Err(e)
            }
        }
    }

    /// Records a refused login (`reason`: why), or (`locked_for_address`) the
    /// failure that locked the account for its address (`user.locked`). A
    /// failure to record is logged, not answered.
    pub async fn login_refused(&self, user_id: Option<&str>, ip: IpAddr, reason: &str) {
        let address = ip.to_string();
        let kind = if reason == "locked_for_address" {
            "user.locked"
        } else {
            "login.failed"
        };
        let mut e = Event::new(kind, now_ms()).ip(Some(&address)).reason(reason);
        if let Some(id) = user_id {
            e = e.user(id);
        }
        if let Err(err) = self.shared.store.record_event(&e).await {
            tracing::warn!(error = %err, "recording a failed login");
        }
    }

    /// Rehashes a password made with older parameters, after the answer.
    pub fn upgrade_hash_later(&self, user: &UserRecord, password: Password) {
        let s = &self.shared;
        if !s.hashing.passwords().needs_rehash(&user.password_hash) {
            return;
        }
        let (hashing, store, users) = (s.hashing.clone(), s.store.clone(), s.users.clone());
        let (id, email, old) = (user.id.clone(), user.email.clone(), user.password_hash.clone());
        tokio::spawn(async move {
            let Ok(new) = hashing.run("hash", move |p| p.hash(password.expose())).await else {
                return; // busy: try again at a later login
            };
            match store.upgrade_password_hash(&id, &old, &new, now_ms()).await {
                Ok(true) => {
                    users.forget(&email);
                    tracing::info!(user_id = %id, "password hash upgraded to current parameters");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "password hash upgrade failed"),
            }
        });
    }

    /// Changes the password; `end_other_sessions` ends every session but the
    /// caller's (the current one always stays). `current` is `None` only for
    /// an account without a password (see [`Self::check_current`]).
    pub async fn change(
        &self,
        token: &Verified,
        ip: IpAddr,
        current: Option<Password>,
        new: Password,
        end_other_sessions: bool,
    ) -> Result<(), AuthError> {
        let user = self.check_current(token, ip, current).await?;
        let new_hash = self
            .shared
            .hashing
            .run("hash", move |p| p.hash(new.expose()))
            .await?;
        let revoked = self
            .shared
            .store
            .change_password(
                &user.id,
                &user.password_hash,
                &new_hash,
                if end_other_sessions {
                    KeepSessions::Only(&token.claims.sid)
                } else {
                    KeepSessions::All
                },
                now_ms(),
            )
            .await?
            .ok_or(AuthError::InvalidCredentials)?;
        self.after_change(&user, revoked).await;
        Ok(())
    }

    /// Mails a reset code to the address if it has an account (and does
    /// the same work, with a code nothing matches, if not).
    pub async fn request_reset(&self, ip: IpAddr, email: Email) -> Result<(), AuthError> {
        let s = &self.shared;
        s.limiter
            .check(PolicyName::ResetIp, s.limiter.ip_key(ip).as_str())
            .await?;
        s.limiter.check(PolicyName::ResetEmail, email.as_str()).await?;
        let real = s.store.user_by_email(email.as_str()).await?.is_some();
        self.codes.issue(&email, Purpose::ResetPassword, real).await
    }

    /// Sets a new password with a mailed reset code; every session ends.
    pub async fn confirm_reset(
        &self,
        ip: IpAddr,
        email: Email,
        code: Code,
        new: Password,
    ) -> Result<(), AuthError> {
        let s = &self.shared;
        let user = s.store.user_by_email(email.as_str()).await?;
        let limit_key = format!("reset:{}", email.as_str());
        let code_id = self
            .codes
            .check(ip, &email, Purpose::ResetPassword, &code, &limit_key)
            .await?;
        let Some(user) = user else {
            return Err(AuthError::InvalidOtp);
        };
        let new_hash = s.hashing.run("hash", move |p| p.hash(new.expose())).await?;
        let revoked = s
            .store
            .reset_password(
                &user.id,
                email.as_str(),
                code_id,
                MAX_FAILURES,
                &new_hash,
                now_ms(),
            )
            .await?
            .ok_or(AuthError::InvalidOtp)?;
        self.codes.right_code(ip).await;
        self.after_change(&user, revoked).await;
        let client = s.limiter.ip_key(ip);
        s.brute_force.reset(email.as_str(), client.as_str()).await;
        Ok(())
    }

    /// Makes a committed password change felt everywhere. It runs to the end
    /// in its own task even if the request is cut short (the deadline), and
    /// the user caches of other instances also learn it from the database
    /// within seconds (housekeeping) if the Redis event is lost.
    async fn after_change(&self, user: &UserRecord, revoked: Vec<String>) {
        if let Some(c) = &self.shared.credentials {
            c.forget(&user.id);
        }
        let (revocations, email) = (self.shared.revocations.clone(), user.email.clone());
        let _ = tokio::spawn(async move {
            revocations.revoke(&revoked).await;
            revocations.user_changed(&email).await;
        })
        .await;
    }

    /// Admits a password attempt of `account` from `client` under the
    /// brute-force rules, counted as a failure until it proves otherwise.
    async fn begin_attempt(&self, account: &str, client: &str) -> Result<Attempt, AuthError> {
        self.shared
            .brute_force
            .begin(account, client)
            .await
            .map_err(|retry| AuthError::TooManyAttempts {
                retry_after: Some(retry),
            })
    }

    /// Records a wrong password (`reason`), and the lock it set for the
    /// address if it did.
    async fn attempt_failed(&self, user_id: Option<&str>, ip: IpAddr, reason: &str, attempt: &Attempt) {
        self.login_refused(user_id, ip, reason).await;
        if attempt.locks() {
            self.login_refused(user_id, ip, "locked_for_address").await;
        }
    }

    /// The cost of a password check where no password can match.
    async fn dummy_verify(&self, password: &Password) -> Result<(), AuthError> {
        let pw = password.clone();
        self.shared
            .hashing
            .run("verify", move |p| p.verify_dummy(pw.expose()))
            .await?;
        Ok(())
    }

    async fn find_user(&self, email: &Email) -> Result<Option<Arc<UserRecord>>, AuthError> {
        let s = &self.shared;
        if let Some(u) = s.users.get(email.as_str()) {
            return Ok(Some(u));
        }
        let u = s.store.user_by_email(email.as_str()).await?.map(Arc::new);
        if let Some(u) = &u {
            s.users.put(u.clone());
        }
        Ok(u)
    }

    /// The account of `email` if there is one, and whether `password` is its
    /// password (never for no account).
    async fn verify(
        &self,
        email: &Email,
        password: &Password,
    ) -> Result<(Option<Arc<UserRecord>>, bool), AuthError> {
        let user = self.find_user(email).await?;
        let ok = match &user {
            // No account, or one verified while contested (no password yet):
            // the same argon2 cost, and no password matches.
            None => {
                self.dummy_verify(password).await?;
                false
            }
            Some(u) if u.password_hash == UNUSABLE_PASSWORD => {
                self.dummy_verify(password).await?;
                false
            }
            Some(u) => {
                let credentials = self.shared.credentials.as_ref();
                if credentials.is_some_and(|c| c.check(&u.id, &u.password_hash, password.expose())) {
                    true
                } else {
                    let ok = self
                        .shared
                        .hashing
                        .verify(&u.id, password, &u.password_hash)
                        .await?;
                    if let (true, Some(c)) = (ok, credentials) {
                        c.remember(&u.id, &u.password_hash, password.expose());
                    }
                    ok
                }
            }
        };
        Ok((user, ok))
    }
}
