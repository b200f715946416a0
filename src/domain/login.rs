//! Login: a password, then (for an account with a factor) the second step,
//! or a passkey alone; each ends in a session started by the sessions core.
//! The rules of each way in are with its credential (`passwords.rs`,
//! `mfa/step.rs`); this service strings them together and answers a
//! session that could not start (a disabled account, a factor the
//! authentication lacks).
//!
//! ```text
//!  password ──right──> sessions::start ──> Pair ─────────────> tokens
//!                                      ├─> FactorRequired ──> step up (401 MFA_REQUIRED)
//!                                      └─> Disabled ────────> 403 ACCOUNT_DISABLED
//!  step up ── right factor ──> sessions::start (second factor passed) ──> tokens
//!  passkey ── right assertion ──> sessions::start (second factor passed) ──> tokens
//!  upstream (federation) ──> sessions::start (amr fed) ──> as a password's
//! ```

use std::sync::Arc;

use webauthn_rs::prelude::PublicKeyCredential;

use super::input::{Email, Password};
use super::mfa::{Ceremony, Proof, SecondFactors};
use super::passwords::Passwords;
use super::sessions::{Origin, Sessions, Started, TokenPair};
use super::shared::Shared;
use super::tokens::Authn;
use super::AuthError;
use crate::clock::now_ms;
use crate::limits::PolicyName;
use crate::store::UserRecord;

pub struct Login {
    shared: Arc<Shared>,
    passwords: Arc<Passwords>,
    factors: Arc<SecondFactors>,
    sessions: Arc<Sessions>,
}

impl Login {
    pub fn new(
        shared: Arc<Shared>,
        passwords: Arc<Passwords>,
        factors: Arc<SecondFactors>,
        sessions: Arc<Sessions>,
    ) -> Login {
        Login {
            shared,
            passwords,
            factors,
            sessions,
        }
    }

    /// A login with a password, first-party (`client_id` `None`) or an
    /// OAuth client's password grant.
    pub async fn password(
        &self,
        origin: &Origin,
        email: Email,
        password: Password,
        client_id: Option<&str>,
    ) -> Result<TokenPair, AuthError> {
        let ip = origin.ip;
        self.login_limit(origin).await?;
        let user = self.passwords.check(ip, &email, &password).await?;
        if user.email_verified_at.is_none() {
            self.passwords
                .login_refused(Some(&user.id), ip, "verification_pending")
                .await;
            return Err(AuthError::VerificationPending);
        }
        if user.disabled_at.is_some() {
            self.passwords
                .login_refused(Some(&user.id), ip, "account_disabled")
                .await;
            return Err(AuthError::AccountDisabled);
        }
        self.passwords.upgrade_hash_later(&user, password);
        self.start_session(&user, client_id, origin, Authn::new("pwd", now_ms()), false)
            .await
    }

    /// The second step of a login that stepped up: a factor answering its
    /// `mfa_token`.
    pub async fn second_factor(
        &self,
        origin: &Origin,
        mfa_token: &str,
        proof: Proof,
    ) -> Result<TokenPair, AuthError> {
        self.login_limit(origin).await?;
        let (user, authn) = self.factors.verify(origin, mfa_token, proof).await?;
        self.start_session(&user, None, origin, authn, true).await
    }

    /// Starts a passwordless login: the options for the browser.
    pub async fn start_passkey(&self, origin: &Origin) -> Result<Ceremony, AuthError> {
        self.login_limit(origin).await?;
        self.factors.start_passkey_login().await
    }

    /// Finishes a passwordless login with the authenticator's assertion.
    pub async fn finish_passkey(
        &self,
        origin: &Origin,
        ceremony_token: &str,
        credential: &PublicKeyCredential,
    ) -> Result<TokenPair, AuthError> {
        self.login_limit(origin).await?;
        let (user, authn) = self
            .factors
            .finish_passkey_login(origin, ceremony_token, credential)
            .await?;
        self.start_session(&user, None, origin, authn, true).await
    }

    /// A login through an upstream provider that signed `user` in
    /// (`federation`, which applied the linking rule, and this login's
    /// limit with [`Self::limit`] before it called the upstream): a
    /// session whose `amr` is `amr` (`fed`, and what a trusted upstream
    /// asserted: `federation::rule::session_amr`), or the step up to the
    /// account's second factor, unless `mfa`: the upstream asserted more
    /// than one factor and is trusted for it (the second factor passed).
    pub async fn upstream(
        &self,
        origin: &Origin,
        user: &UserRecord,
        amr: &str,
        mfa: bool,
    ) -> Result<TokenPair, AuthError> {
        self.start_session(user, None, origin, Authn::new(amr, now_ms()), mfa)
            .await
    }

    /// The login limit of the client address, for a way in that checks it
    /// itself (a sign-in through an upstream, before it calls out).
    pub async fn limit(&self, origin: &Origin) -> Result<(), AuthError> {
        self.login_limit(origin).await
    }

    /// Every way in is under the client address's login limit (`login_ip`)
    /// first.
    async fn login_limit(&self, origin: &Origin) -> Result<(), AuthError> {
        let limiter = &self.shared.limiter;
        limiter
            .check(PolicyName::LoginIp, limiter.ip_key(origin.ip).as_str())
            .await?;
        Ok(())
    }

    /// Starts a session of `user` authenticated as `authn` (`second_factor`:
    /// that included one), or, when the account has a factor the
    /// authentication did not pass, answers with the step up to it.
    async fn start_session(
        &self,
        user: &UserRecord,
        client_id: Option<&str>,
        origin: &Origin,
        authn: Authn,
        second_factor: bool,
    ) -> Result<TokenPair, AuthError> {
        match self
            .sessions
            .start(user, client_id, origin, authn, second_factor)
            .await?
        {
            Started::Pair(pair, _) => Ok(pair),
            Started::Disabled => {
                self.passwords
                    .login_refused(Some(&user.id), origin.ip, "account_disabled")
                    .await;
                Err(AuthError::AccountDisabled)
            }
            Started::FactorRequired(authn) => {
                Err(self.factors.step_up(user, &authn, client_id, origin).await)
            }
        }
    }
}
