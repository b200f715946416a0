//! Second factors as their user manages them: the list, enrolling an
//! authenticator app or a passkey (after a recent authentication and the
//! current password), renaming, removing, new recovery codes; and an
//! administrator's reset. Every change mails a notice to the account in
//! the change's transaction.

use std::net::IpAddr;

use webauthn_rs::prelude::{CreationChallengeResponse, PasskeyRegistration, RegisterPublicKeyCredential};

use super::{
    challenge, check_name, json, options, passkey_of, state, totp, totp_aad, Ceremony, Enrolled, FactorInfo,
    FactorList, RecoveryCodes, SecondFactors, TotpEnrolment, PASSKEY_NAME, TOTP_NAME,
};
use crate::clock::now_ms;
use crate::crypto::{b64url, random_bytes, random_token, sha256};
use crate::domain::input::Password;
use crate::domain::tokens::Verified;
use crate::domain::AuthError;
use crate::limits::PolicyName;
use crate::store::{ChallengeRecord, FactorRecord};

impl SecondFactors {
    /// The caller's confirmed factors.
    pub async fn factors(&self, token: &Verified) -> Result<FactorList, AuthError> {
        let user = &token.claims.sub;
        let factors = Self::confirmed(self.shared.store.factors(user).await?);
        Ok(FactorList {
            factors: factors.iter().map(FactorInfo::from).collect(),
            recovery_codes_left: self.shared.store.recovery_codes_left(user).await?,
        })
    }

    /// Changing factors needs a recent authentication, and a second factor
    /// in it when the account has one (else a stolen session of a password
    /// alone could replace the factor).
    async fn require_recent(&self, token: &Verified) -> Result<Vec<FactorRecord>, AuthError> {
        let factors = Self::confirmed(self.shared.store.factors(&token.claims.sub).await?);
        let age_ms = now_ms() - token.claims.auth_time.unwrap_or(0) * 1000;
        let recent = age_ms <= self.settings.recent_auth.as_millis() as i64;
        let mfa_needed = !factors.is_empty() && !token.claims.is_mfa();
        if !recent || mfa_needed {
            return Err(AuthError::ReauthenticationRequired {
                max_age: self.settings.recent_auth.as_secs(),
                mfa: !factors.is_empty(),
            });
        }
        Ok(factors)
    }

    /// What adding any way in takes (a second factor, or an identity of
    /// another provider linked from the account page): a recent sign-in,
    /// with the second factor when the account has one, and the current
    /// password when it has one. The account.
    pub async fn authorize_new_way_in(
        &self,
        token: &Verified,
        ip: IpAddr,
        password: Option<Password>,
    ) -> Result<crate::store::UserRecord, AuthError> {
        self.require_recent(token).await?;
        self.passwords.check_current(token, ip, password).await
    }

    /// Starts a TOTP enrolment: a new secret, shown once. Adding a factor
    /// takes the current password as well as a recent login: a stolen
    /// session alone must not be able to plant a factor of its own.
    pub async fn start_totp(
        &self,
        token: &Verified,
        ip: IpAddr,
        name: &str,
        password: Password,
    ) -> Result<TotpEnrolment, AuthError> {
        self.require_recent(token).await?;
        let name = check_name(name, TOTP_NAME)?;
        let user = self.passwords.check_current(token, ip, Some(password)).await?;
        let secret = random_bytes::<{ totp::SECRET_BYTES }>();
        let id = format!("fac_{}", uuid::Uuid::new_v4().simple());
        self.shared
            .store
            .add_pending_totp(&FactorRecord {
                id: id.clone(),
                user_id: user.id.clone(),
                kind: "totp".into(),
                name,
                secret: Some(self.sealer.seal(&secret, &totp_aad(&id))),
                last_step: None,
                credential: None,
                credential_id: None,
                passwordless: false,
                created_at: now_ms(),
                confirmed_at: None,
                last_used_at: None,
            })
            .await?;
        let uri = totp::uri(&secret, &self.settings.totp_issuer, &user.email);
        Ok(TotpEnrolment {
            id,
            secret: totp::base32(&secret),
            qr_svg: totp::qr_svg(&uri).unwrap_or_default(),
            otpauth_uri: uri,
        })
    }

    /// Confirms a TOTP enrolment with a first code from the app.
    pub async fn confirm_totp(&self, token: &Verified, id: &str, code: &str) -> Result<Enrolled, AuthError> {
        self.require_recent(token).await?;
        let user_id = &token.claims.sub;
        let mut enrolment = self
            .shared
            .store
            .factors(user_id)
            .await?
            .into_iter()
            .find(|f| f.id == id && f.kind == "totp" && f.confirmed_at.is_none())
            .ok_or(AuthError::NotFound("factor"))?;
        self.shared
            .limiter
            .check(PolicyName::PasswordAccount, user_id)
            .await?;
        let secret = enrolment
            .secret
            .as_deref()
            .and_then(|s| self.sealer.open(s, &totp_aad(id)))
            .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("a TOTP secret cannot be unsealed")))?;
        let now = now_ms();
        let totp::Verdict::Accepted { step } = totp::check(&secret, code, now, None) else {
            return Err(AuthError::InvalidFactor { tries_left: -1 });
        };
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now,
                "An authenticator app was added to your account.",
                true,
            )
            .await?;
        let change = pending.change();
        let added = self
            .shared
            .store
            .confirm_totp(id, step, &change)
            .await?
            .ok_or(AuthError::NotFound("factor"))?;
        self.factor_added(&added).await;
        // As the store now has it (no second read).
        enrolment.confirmed_at = Some(now);
        enrolment.last_used_at = Some(now);
        Ok(Enrolled {
            factor: FactorInfo::from(&enrolment),
            recovery_codes: added.recovery_codes_given.then_some(pending.codes),
        })
    }

    /// Starts registering a passkey: the options for
    /// `navigator.credentials.create()`. A passkey that may log in alone
    /// (`passwordless`) must be discoverable.
    pub async fn start_passkey(
        &self,
        token: &Verified,
        ip: IpAddr,
        name: &str,
        passwordless: bool,
        password: Password,
    ) -> Result<Ceremony, AuthError> {
        let factors = self.require_recent(token).await?;
        let name = check_name(name, PASSKEY_NAME)?;
        let user = self.passwords.check_current(token, ip, Some(password)).await?;
        let uid = uuid::Uuid::try_parse(&user.id).map_err(|e| AuthError::Internal(e.into()))?;
        let exclude: Vec<_> = factors
            .iter()
            .filter_map(passkey_of)
            .map(|p| p.cred_id().clone())
            .collect();
        let (ccr, st): (CreationChallengeResponse, PasskeyRegistration) = self
            .webauthn
            .start_passkey_registration(
                uid,
                &user.email,
                user.name.as_deref().unwrap_or(&user.email),
                Some(exclude),
            )
            .map_err(|e| AuthError::Internal(anyhow::anyhow!("webauthn: {e}")))?;
        let mut opts = options(&ccr)?;
        if passwordless {
            // Discoverable: the authenticator keeps the credential with the
            // account, so that a login can start without naming one.
            let sel = &mut opts["publicKey"]["authenticatorSelection"];
            sel["residentKey"] = "required".into();
            sel["requireResidentKey"] = true.into();
        }
        let detail = serde_json::json!({"name": name, "passwordless": passwordless}).to_string();
        self.ceremony("passkey_register", Some(&user.id), json(&st)?, Some(detail), opts)
            .await
    }

    async fn ceremony(
        &self,
        purpose: &str,
        user_id: Option<&str>,
        state: String,
        detail: Option<String>,
        options: serde_json::Value,
    ) -> Result<Ceremony, AuthError> {
        let token = random_token();
        let now = now_ms();
        self.shared
            .store
            .create_challenge(&ChallengeRecord {
                token_hash: sha256(token.as_bytes()).to_vec(),
                purpose: purpose.into(),
                user_id: user_id.map(String::from),
                amr: String::new(),
                client_id: None,
                user_agent: None,
                ip: None,
                state: Some(state),
                detail,
                failures: 0,
                created_at: now,
                expires_at: now + challenge::CEREMONY_TTL_MS,
            })
            .await?;
        Ok(Ceremony {
            ceremony_token: token,
            options,
            expires_in: (challenge::CEREMONY_TTL_MS / 1000) as u64,
        })
    }

    /// Finishes registering a passkey with the authenticator's answer.
    pub async fn finish_passkey(
        &self,
        token: &Verified,
        ceremony_token: &str,
        credential: &RegisterPublicKeyCredential,
    ) -> Result<Enrolled, AuthError> {
        self.require_recent(token).await?;
        let user_id = &token.claims.sub;
        let hash = sha256(ceremony_token.as_bytes());
        let now = now_ms();
        let c = self
            .shared
            .store
            .challenge(&hash, "passkey_register", now)
            .await?
            .filter(|c| c.user_id.as_deref() == Some(user_id.as_str()))
            .ok_or(AuthError::InvalidToken)?;
        if !self.shared.store.consume_challenge(&hash).await? {
            return Err(AuthError::InvalidToken);
        }
        let st: PasskeyRegistration = state(&c)?;
        let passkey = self
            .webauthn
            .finish_passkey_registration(credential, &st)
            .map_err(|e| {
                tracing::info!(error = %e, "a passkey registration did not verify");
                AuthError::InvalidFactor { tries_left: -1 }
            })?;
        let detail: serde_json::Value = c
            .detail
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default();
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now,
                "A passkey was added to your account.",
                true,
            )
            .await?;
        let change = pending.change();
        let rec = FactorRecord {
            id: format!("fac_{}", uuid::Uuid::new_v4().simple()),
            user_id: user_id.clone(),
            kind: "passkey".into(),
            name: detail["name"].as_str().unwrap_or(PASSKEY_NAME).to_string(),
            secret: None,
            last_step: None,
            credential: Some(json(&passkey)?),
            credential_id: Some(b64url(passkey.cred_id().as_ref())),
            passwordless: detail["passwordless"].as_bool().unwrap_or(false),
            created_at: now,
            confirmed_at: Some(now),
            last_used_at: None,
        };
        let Some(added) = self.shared.store.add_passkey(&rec, &change).await? else {
            return Err(AuthError::Conflict("this passkey is registered already"));
        };
        self.factor_added(&added).await;
        Ok(Enrolled {
            factor: FactorInfo::from(&rec),
            recovery_codes: added.recovery_codes_given.then_some(pending.codes),
        })
    }

    pub async fn rename_factor(
        &self,
        token: &Verified,
        id: &str,
        name: &str,
    ) -> Result<FactorInfo, AuthError> {
        let user_id = &token.claims.sub;
        let mut factor = self
            .shared
            .store
            .factors(user_id)
            .await?
            .into_iter()
            .find(|f| f.id == id && f.confirmed_at.is_some())
            .ok_or(AuthError::NotFound("factor"))?;
        factor.name = check_name(name, &factor.name)?;
        if !self
            .shared
            .store
            .rename_factor(id, user_id, &factor.name, now_ms())
            .await?
        {
            return Err(AuthError::NotFound("factor"));
        }
        Ok(FactorInfo::from(&factor))
    }

    /// Removes a factor (with the last one, the recovery codes go too).
    pub async fn remove_factor(&self, token: &Verified, id: &str) -> Result<(), AuthError> {
        let factors = self.require_recent(token).await?;
        if !factors.iter().any(|f| f.id == id) {
            return Err(AuthError::NotFound("factor"));
        }
        let user_id = &token.claims.sub;
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now_ms(),
                "A second factor was removed from your account.",
                false,
            )
            .await?;
        let change = pending.change();
        if !self.shared.store.remove_factor(id, &change).await? {
            return Err(AuthError::NotFound("factor"));
        }
        self.shared.outbox.wake();
        Ok(())
    }

    /// A new set of recovery codes; the old set stops working.
    pub async fn new_recovery_codes(&self, token: &Verified) -> Result<RecoveryCodes, AuthError> {
        self.require_recent(token).await?;
        let user_id = &token.claims.sub;
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now_ms(),
                "New recovery codes were made for your account; the old ones no longer work.",
                true,
            )
            .await?;
        let change = pending.change();
        if !self.shared.store.new_recovery_codes(&change).await? {
            return Err(AuthError::Conflict(
                "recovery codes stand in for a second factor: add one first",
            ));
        }
        self.shared.outbox.wake();
        Ok(RecoveryCodes {
            recovery_codes: pending.codes,
        })
    }

    /// An administrator's reset of an account's factors (a user who lost
    /// every factor and every recovery code).
    pub async fn admin_reset(&self, actor: &str, user_id: &str) -> Result<(), AuthError> {
        if uuid::Uuid::try_parse(user_id).is_err() {
            return Err(AuthError::NotFound("user"));
        }
        let Ok(pending) = self
            .factor_change(
                user_id,
                "",
                now_ms(),
                "An administrator removed every second factor of your account.",
                false,
            )
            .await
        else {
            return Err(AuthError::NotFound("user"));
        };
        let change = pending.change();
        if self.shared.store.reset_factors(actor, &change).await? {
            self.shared.outbox.wake();
        }
        Ok(())
    }
}
