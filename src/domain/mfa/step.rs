//! The login's second step: the challenge a login with a right password
//! gets when its account has a factor, the factor that answers it, and
//! passwordless sign-in with a passkey. The rules of the challenge
//! (`mfa_token`) are `challenge.rs`; this file applies them, under the
//! brute-force rules of the account and the count of wrong factors per
//! client address. None of it starts a session, nor checks the address's
//! login limit: the login (`login.rs`) does both, around what these return,
//! and only the domain may call them (the HTTP edge calls `Login`).

use std::net::IpAddr;

use webauthn_rs::prelude::{
    DiscoverableAuthentication, DiscoverableKey, Passkey, PasskeyAuthentication, PublicKeyCredential,
    RequestChallengeResponse,
};

use super::{
    challenge, json, mfa_key, options, passkey_of, state, totp, totp_aad, Ceremony, Proof, SecondFactors,
    StepUp, PASSKEY_METHOD,
};
use crate::clock::now_ms;
use crate::crypto::{b64url, b64url_decode, random_token, sha256};
use crate::domain::sessions::Origin;
use crate::domain::tokens::Authn;
use crate::domain::AuthError;
use crate::limits::BruteForceRules;
use crate::store::{ChallengeRecord, Event, FactorRecord, UserRecord};

/// A passwordless login's ceremony, sealed into its token.
#[derive(serde::Serialize, serde::Deserialize)]
struct LoginCeremony {
    expires_at: i64,
    state: DiscoverableAuthentication,
}

/// How much longer than its ceremony a spent one is remembered: instances
/// whose clocks disagree by less cannot both take it for unspent.
const CLAIM_MARGIN_MS: i64 = 5 * 60_000;

/// The associated data of a sealed [`LoginCeremony`]: a token sealed for
/// anything else does not open as one.
const LOGIN_CEREMONY_AAD: &[u8] = b"latchkey passkey login ceremony v1";

impl SecondFactors {
    /// The step up of a login whose first factor (`authn`) was right, for
    /// an account with a second: a challenge, answered as
    /// [`AuthError::SecondFactorRequired`]. An OAuth client's password
    /// grant has no way to pass a second factor: it gets the refusal alone.
    pub(in crate::domain) async fn step_up(
        &self,
        user: &UserRecord,
        authn: &Authn,
        client_id: Option<&str>,
        origin: &Origin,
    ) -> AuthError {
        if client_id.is_some() {
            return AuthError::SecondFactorRequired(None);
        }
        match self.new_login_challenge(user, authn, origin).await {
            Ok(step_up) => AuthError::SecondFactorRequired(Some(Box::new(step_up))),
            Err(e) => e,
        }
    }

    async fn new_login_challenge(
        &self,
        user: &UserRecord,
        authn: &Authn,
        origin: &Origin,
    ) -> Result<StepUp, AuthError> {
        let factors = Self::confirmed(self.shared.store.factors(&user.id).await?);
        let mut kinds = Vec::new();
        if factors.iter().any(|f| f.kind == "totp") {
            kinds.push("totp");
        }
        let passkeys: Vec<Passkey> = factors.iter().filter_map(passkey_of).collect();
        let (webauthn, state) = if passkeys.is_empty() {
            (None, None)
        } else {
            kinds.push("webauthn");
            let (rcr, st) = self
                .webauthn
                .start_passkey_authentication(&passkeys)
                .map_err(|e| AuthError::Internal(anyhow::anyhow!("webauthn: {e}")))?;
            (Some(options(&rcr)?), Some(json(&st)?))
        };
        if self.shared.store.recovery_codes_left(&user.id).await? > 0 {
            kinds.push("recovery_code");
        }
        let token = random_token();
        let now = now_ms();
        self.shared
            .store
            .create_challenge(&ChallengeRecord {
                token_hash: sha256(token.as_bytes()).to_vec(),
                purpose: "login".into(),
                user_id: Some(user.id.clone()),
                amr: authn.amr.clone(),
                client_id: None,
                user_agent: origin.user_agent.clone(),
                ip: Some(origin.ip.to_string()),
                state,
                detail: None,
                failures: 0,
                created_at: now,
                expires_at: now + challenge::TTL_MS,
            })
            .await?;
        Ok(StepUp {
            mfa_token: token,
            factors: kinds,
            webauthn,
            expires_in: (challenge::TTL_MS / 1000) as u64,
        })
    }

    /// Completes a login that stepped up: the second factor against the
    /// login's challenge, under the account's brute-force rules; a right
    /// one spends the challenge. Returns the account and how it was
    /// authenticated; the login (`login.rs`) starts the session.
    pub(in crate::domain) async fn verify(
        &self,
        origin: &Origin,
        mfa_token: &str,
        proof: Proof,
    ) -> Result<(UserRecord, Authn), AuthError> {
        let (hash, c, now) = self.live_challenge(mfa_token, "login").await?;
        if challenge::state(c.failures, c.expires_at, now) == challenge::State::Dead {
            return Err(AuthError::InvalidToken);
        }
        let user_id = c.user_id.clone().ok_or(AuthError::InvalidToken)?;
        let client = self.shared.limiter.ip_key(origin.ip);
        let key = mfa_key(&user_id);
        // The address's wrong second factors over every account first, so
        // that guesses it refuses spend none of the account's allowance; not
        // for an address the account passed its second factor from before
        // (anyone with an account of their own can fill the address's count,
        // and so hold up everybody behind the same NAT or proxy but those).
        let guess = if self.shared.brute_force.is_known(&key, client.as_str()).await {
            None
        } else {
            Some(self.factor_guess(origin.ip).await?)
        };
        let attempt = match self.shared.brute_force.begin(&key, client.as_str()).await {
            Ok(a) => a,
            Err(retry) => {
                self.factor_guess_taken_back(guess.as_deref()).await;
                return Err(AuthError::TooManyAttempts {
                    retry_after: Some(retry),
                });
            }
        };
        let label = proof.label();
        let method = match self.judge(&user_id, &c, proof, now).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                let dead = self
                    .shared
                    .store
                    .challenge_failed(&hash, challenge::MAX_FAILURES)
                    .await?;
                let address = origin.ip.to_string();
                let e = Event::new("mfa.failed", now)
                    .user(&user_id)
                    .ip(Some(&address))
                    .reason(label);
                if let Err(err) = self.shared.store.record_event(&e).await {
                    tracing::warn!(error = %err, "recording a failed second factor");
                }
                let left = dead.map_or(0, |n| (challenge::MAX_FAILURES - n).max(0));
                return Err(AuthError::InvalidFactor { tries_left: left });
            }
            Err(e) => {
                self.shared
                    .brute_force
                    .abandon(&key, client.as_str(), attempt)
                    .await;
                self.factor_guess_taken_back(guess.as_deref()).await;
                return Err(e);
            }
        };
        // A right factor was no guess.
        self.factor_guess_taken_back(guess.as_deref()).await;
        // Single use: of two right answers, one session.
        if !self.shared.store.consume_challenge(&hash).await? {
            return Err(AuthError::InvalidToken);
        }
        self.shared
            .brute_force
            .success(&key, client.as_str(), attempt, true)
            .await;
        let user = self
            .shared
            .store
            .user_by_id(&user_id)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        if user.email_verified_at.is_none() {
            return Err(AuthError::VerificationPending);
        }
        let amr = format!("{} {method} mfa", c.amr);
        Ok((user, Authn::new(amr.trim(), now)))
    }

    /// Admits a second factor from `ip` under the rule of wrong second
    /// factors per client address over every account
    /// (`Rules::CODE_GUESSES`, as for emailed codes: ten free, then delays,
    /// a lock at thirty): a list of stolen passwords of accounts with
    /// factors cannot be worked through by guessing a TOTP code on each.
    /// The attempt counts as wrong until [`Self::factor_guess_taken_back`].
    async fn factor_guess(&self, ip: IpAddr) -> Result<String, AuthError> {
        let key = format!("factors:{}", self.shared.limiter.ip_key(ip).as_str());
        self.shared
            .code_guesses
            .begin(&key, &BruteForceRules::CODE_GUESSES)
            .await
            .map_err(|ms| AuthError::TooManyAttempts {
                retry_after: Some((ms.max(0) as u64).div_ceil(1000).max(1)),
            })?;
        Ok(key)
    }

    /// A factor that was right, or never judged: not a wrong guess.
    async fn factor_guess_taken_back(&self, key: Option<&str>) {
        if let Some(key) = key {
            self.shared
                .code_guesses
                .abandon(key, &BruteForceRules::CODE_GUESSES)
                .await;
        }
    }

    /// A login's live challenge of `purpose` under `token`: its hash, the
    /// row, and the time it was read.
    async fn live_challenge(
        &self,
        token: &str,
        purpose: &str,
    ) -> Result<([u8; 32], ChallengeRecord, i64), AuthError> {
        let hash = sha256(token.as_bytes());
        let now = now_ms();
        let c = self
            .shared
            .store
            .challenge(&hash, purpose, now)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        Ok((hash, c, now))
    }

    /// The RFC 8176 method a right proof stands for, or `None` when wrong.
    async fn judge(
        &self,
        user_id: &str,
        c: &ChallengeRecord,
        proof: Proof,
        now: i64,
    ) -> Result<Option<&'static str>, AuthError> {
        match proof {
            Proof::Totp(code) => {
                for f in Self::confirmed(self.shared.store.factors(user_id).await?) {
                    if f.kind != "totp" {
                        continue;
                    }
                    let Some(secret) = f
                        .secret
                        .as_deref()
                        .and_then(|s| self.sealer.open(s, &totp_aad(&f.id)))
                    else {
                        tracing::warn!(factor = %f.id, "a TOTP secret cannot be unsealed (secret key changed?)");
                        continue;
                    };
                    if let totp::Verdict::Accepted { step } = totp::check(&secret, &code, now, f.last_step) {
                        // A concurrent use of the same code loses here.
                        if self.shared.store.use_totp_step(&f.id, step, now).await? {
                            return Ok(Some("otp"));
                        }
                    }
                }
                Ok(None)
            }
            Proof::RecoveryCode(code) => {
                // Under the current code key, then under each older one (a
                // code made before a rotation of the master secret).
                for hash in self.recovery_hashes(user_id, &code) {
                    if self.shared.store.use_recovery_code(user_id, &hash, now).await? {
                        // A look-up secret: something the user has, like an OTP device.
                        return Ok(Some("otp"));
                    }
                }
                Ok(None)
            }
            Proof::WebAuthn(credential) => {
                let Ok(st) = state::<PasskeyAuthentication>(c) else {
                    return Ok(None); // the account had no passkey at login
                };
                let Ok(result) = self.webauthn.finish_passkey_authentication(&credential, &st) else {
                    return Ok(None);
                };
                let used = b64url(result.cred_id().as_ref());
                let Some(f) = self.shared.store.passkey_by_credential(&used).await? else {
                    return Ok(None);
                };
                if f.user_id != user_id {
                    return Ok(None);
                }
                self.passkey_used(&f, &result, now).await?;
                Ok(Some(PASSKEY_METHOD))
            }
        }
    }

    async fn passkey_used(
        &self,
        f: &FactorRecord,
        result: &webauthn_rs::prelude::AuthenticationResult,
        now: i64,
    ) -> Result<(), AuthError> {
        let mut passkey = passkey_of(f)
            .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("unreadable passkey {}", f.id)))?;
        let changed = passkey.update_credential(result) == Some(true);
        let credential = if changed { Some(json(&passkey)?) } else { None };
        self.shared
            .store
            .passkey_used(&f.id, credential.as_deref(), now)
            .await?;
        Ok(())
    }

    /// Starts a passwordless login: options for `navigator.credentials.get()`
    /// naming no account (the authenticator offers its passkeys). Nothing
    /// is stored: the ceremony's state travels sealed in its token (AES-GCM
    /// under the master secret, with its expiry), so that calls nobody
    /// finishes cost no row; the token becomes single-use only once an
    /// assertion succeeds ([`Self::finish_passkey_login`]).
    pub(in crate::domain) async fn start_passkey_login(&self) -> Result<Ceremony, AuthError> {
        let (mut rcr, st): (RequestChallengeResponse, DiscoverableAuthentication) = self
            .webauthn
            .start_discoverable_authentication()
            .map_err(|e| AuthError::Internal(anyhow::anyhow!("webauthn: {e}")))?;
        // A login button, not the autofill of a username field.
        rcr.mediation = None;
        let sealed = LoginCeremony {
            expires_at: now_ms() + challenge::CEREMONY_TTL_MS,
            state: st,
        };
        let bytes = serde_json::to_vec(&sealed).map_err(|e| AuthError::Internal(e.into()))?;
        Ok(Ceremony {
            ceremony_token: b64url(&self.ceremonies.seal(&bytes, LOGIN_CEREMONY_AAD)),
            options: options(&rcr)?,
            expires_in: (challenge::CEREMONY_TTL_MS / 1000) as u64,
        })
    }

    /// Finishes a passwordless login: a passkey its user let log in alone,
    /// with user verification, of an enabled and verified account. A right
    /// assertion spends the ceremony (its token's hash is stored until a
    /// while after it expires), so that it signs in once. Returns the account and how it was
    /// authenticated; the login (`login.rs`) starts the session. Wrong assertions
    /// are not counted per address: forging one is not a guess anyone can
    /// make, and counting them would let anyone, with no account at all,
    /// hold up the second factors of everybody behind an address.
    pub(in crate::domain) async fn finish_passkey_login(
        &self,
        origin: &Origin,
        ceremony_token: &str,
        credential: &PublicKeyCredential,
    ) -> Result<(UserRecord, Authn), AuthError> {
        let now = now_ms();
        let ceremony = self.open_login_ceremony(ceremony_token, now)?;
        let refused = AuthError::InvalidFactor { tries_left: 0 };
        let Ok((uid, cred_id)) = self.webauthn.identify_discoverable_authentication(credential) else {
            return Err(refused);
        };
        let Some(f) = self.shared.store.passkey_by_credential(&b64url(cred_id)).await? else {
            return Err(refused);
        };
        if !f.passwordless || f.user_id != uid.to_string() {
            return Err(refused);
        }
        let passkey = passkey_of(&f)
            .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("unreadable passkey {}", f.id)))?;
        let Ok(result) = self.webauthn.finish_discoverable_authentication(
            credential,
            ceremony.state,
            &[DiscoverableKey::from(&passkey)],
        ) else {
            let address = origin.ip.to_string();
            let e = Event::new("mfa.failed", now)
                .user(&f.user_id)
                .ip(Some(&address))
                .reason("passkey_login");
            if let Err(err) = self.shared.store.record_event(&e).await {
                tracing::warn!(error = %err, "recording a failed passkey login");
            }
            return Err(refused);
        };
        // One sign-in per ceremony: the first right assertion claims it.
        let hash = sha256(ceremony_token.as_bytes());
        if !self
            .shared
            .store
            .claim_challenge(&hash, "passkey_login", now, ceremony.expires_at + CLAIM_MARGIN_MS)
            .await?
        {
            return Err(AuthError::InvalidToken);
        }
        self.passkey_used(&f, &result, now).await?;
        let user = self.shared.store.user_by_id(&f.user_id).await?.ok_or(refused)?;
        if user.email_verified_at.is_none() {
            return Err(AuthError::VerificationPending);
        }
        let amr = format!("{PASSKEY_METHOD} mfa");
        Ok((user, Authn::new(&amr, now)))
    }

    /// The state of a passwordless login's ceremony from its token, if the
    /// token is one this service sealed and has not expired.
    fn open_login_ceremony(&self, token: &str, now: i64) -> Result<LoginCeremony, AuthError> {
        let sealed = b64url_decode(token).ok_or(AuthError::InvalidToken)?;
        let bytes = self
            .ceremonies
            .open(&sealed, LOGIN_CEREMONY_AAD)
            .ok_or(AuthError::InvalidToken)?;
        let ceremony: LoginCeremony = serde_json::from_slice(&bytes).map_err(|_| AuthError::InvalidToken)?;
        if ceremony.expires_at <= now {
            return Err(AuthError::InvalidToken);
        }
        Ok(ceremony)
    }
}
