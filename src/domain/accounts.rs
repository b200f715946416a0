//! The account lifecycle: register, verify, login, refresh, logout, password
//! change and reset. Each operation checks its rate limits first, keeps the
//! answers identical whether or not an account exists, and writes every change
//! with the mail it causes in one transaction.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;

use super::codes::{self, CodeState, CodeVerdict, CODE_TTL_MS, MAX_FAILURES, RESEND_QUIET_MS};
use super::credcache::{CredentialCache, CredentialCacheSettings};
use super::hashing::HashPool;
use super::input::{Code, Email, Password};
use super::refresh::{self, RefreshDecision, RefreshState, RefreshTokens};
use super::registration::{self, Plan};
use super::tokens::{Authn, Issuer, Subject, Verified};
use super::AuthError;
use crate::cache::{Revocations, UserCache};
use crate::clock::now_ms;
pub use crate::clock::{parse_rfc3339, rfc3339};
use crate::crypto::{ct_eq, random_bytes, random_code, sha256, MacKey, Sealer};
use crate::limits::{Attempt, BruteForce, BruteForceRules, Limiter, PolicyName, Softlocks};
use crate::mail::Message;
use crate::settings::{secs, ConfigError, Source};
use crate::store::{
    ClientRecord, Event, KeepSessions, LiveRotation, NewCode, NewSession, Purpose, RefreshRecord,
    RegistrationWrite, SessionRecord, SessionStart, Store, UserRecord, UNUSABLE_PASSWORD,
};

/// The `client_id` claim of tokens issued through the first-party endpoints.
pub const FIRST_PARTY_CLIENT: &str = "latchkey";

/// The `client_id` claim of the tokens of a refresh token's session.
fn client_name(rec: &RefreshRecord) -> &str {
    rec.client_id.as_deref().unwrap_or(FIRST_PARTY_CLIENT)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenPair {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
    pub refresh_token: String,
    pub refresh_expires_in: u64,
    /// Only after a verification that set no password (two registrations
    /// contested the address before it was verified): `PASSWORD_REQUIRED`,
    /// and the session may set one with `POST /auth/password` without
    /// `current_password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'static str>,
}

/// The status of a verification that set no password ([`TokenPair::status`]).
pub const PASSWORD_REQUIRED: &str = "PASSWORD_REQUIRED";

/// The answer to the client_credentials grant: no refresh token (RFC 6749 §4.4.3).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClientToken {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
    pub scope: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Profile {
    pub id: String,
    pub email: String,
    pub name: Option<String>,
    pub email_verified: bool,
    /// RFC 3339 time, UTC.
    pub created_at: String,
}

/// Where a request comes from: the client address (after the trusted
/// proxies) and its `User-Agent`, recorded on the sessions it starts.
#[derive(Clone, Debug)]
pub struct Origin {
    pub ip: IpAddr,
    pub user_agent: Option<String>,
}

/// A live session, as its user sees it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    /// The OAuth client it belongs to (`latchkey` for the first-party endpoints).
    pub client_id: String,
    /// RFC 3339 times, UTC.
    pub created_at: String,
    pub last_used_at: String,
    pub expires_at: String,
    /// The `User-Agent` and client address of the request that started it.
    pub user_agent: Option<String>,
    pub ip: Option<String>,
    /// Whether the access token of this request belongs to it.
    pub current: bool,
    /// How it was authenticated (RFC 8176 methods: `pwd`, `otp`, `mfa`, ...).
    pub amr: Vec<String>,
}

impl SessionInfo {
    fn of(s: SessionRecord, current_sid: &str) -> SessionInfo {
        SessionInfo {
            current: s.id == current_sid,
            id: s.id,
            client_id: s.client_id.unwrap_or_else(|| FIRST_PARTY_CLIENT.into()),
            created_at: rfc3339(s.created_at),
            last_used_at: rfc3339(s.last_used_at),
            expires_at: rfc3339(s.expires_at),
            user_agent: s.user_agent,
            ip: s.ip,
            amr: s
                .amr
                .split(' ')
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect(),
        }
    }
}

/// A live refresh token, as introspection shows it.
pub struct RefreshInfo {
    pub user_id: String,
    pub session_id: String,
    pub email: String,
    pub client_id: String,
    /// Unix milliseconds.
    pub expires_at: i64,
}

/// How long sessions and unverified accounts live, and the credential cache.
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

pub struct Accounts {
    pub store: Store,
    pub hashing: Arc<HashPool>,
    pub credentials: Option<CredentialCache>,
    pub users: Arc<UserCache>,
    pub tokens: Arc<Issuer>,
    pub revocations: Arc<Revocations>,
    pub limiter: Arc<Limiter>,
    pub brute_force: BruteForce,
    /// Wrong codes per client address, over every account.
    pub code_guesses: Softlocks,
    pub code_key: MacKey,
    pub outbox_sealer: Arc<Sealer>,
    pub mail_wake: Arc<Notify>,
    pub refresh_ttl: Duration,
    pub refresh_grace: Duration,
    /// The form of refresh tokens: each names its session.
    pub refresh_tokens: RefreshTokens,
    /// Whether webhooks may be registered at non-public addresses.
    pub webhook_allow_private: bool,
    /// Second factors: the WebAuthn relying party, TOTP secrets' sealing.
    pub mfa: super::mfa::Mfa,
}

impl Accounts {
    fn code_hash(&self, purpose: Purpose, email: &Email, code: &str) -> [u8; 32] {
        self.code_key.mac(&[
            purpose.as_str().as_bytes(),
            email.as_str().as_bytes(),
            code.as_bytes(),
        ])
    }

    fn seal(&self, m: &Message) -> Vec<u8> {
        m.seal(&self.outbox_sealer)
    }

    pub async fn register(
        &self,
        ip: IpAddr,
        email: Email,
        password: Password,
        name: Option<String>,
    ) -> Result<(), AuthError> {
        self.limiter
            .check(PolicyName::RegisterIp, self.limiter.ip_key(ip).as_str())
            .await?;
        self.limiter
            .check(PolicyName::RegisterEmail, email.as_str())
            .await?;
        let code = random_code();
        let code_hash = self.code_hash(Purpose::VerifyEmail, &email, &code);
        let id = uuid::Uuid::now_v7().to_string();
        let address = ip.to_string();
        let verification = self.seal(&Message::verification(email.as_str(), &code));
        let contested_mail = self.seal(&Message::verification_contested(email.as_str(), &code));
        let notice = self.seal(&Message::already_registered(email.as_str()));
        let shadow_hash = random_bytes::<32>();
        // Read, decide (`registration::decide`), apply if the state is still
        // the one read; else read and decide again. The password is hashed
        // once, even when the email is taken (timing does not tell), and like
        // the registration the email's live code would activate, if there is
        // one (the same salt: a repeat of it then has the same hash, and is
        // not taken for another party's); again only if another registration
        // committed meanwhile (two clicks at once).
        const TRIES: usize = 5;
        let mut hashed: Option<(Option<String>, String)> = None;
        let mut done = None;
        for tries in 1..=TRIES {
            let now = now_ms();
            let state = self.store.registration_state(email.as_str(), now).await?;
            let like = registration::live_registration(&state, now).map(str::to_string);
            let stale = hashed.as_ref().is_none_or(|(l, _)| *l != like);
            if stale {
                let (pw, l) = (password.clone(), like.clone());
                let hash = self
                    .hashing
                    .run("hash", move |p| p.hash_like(pw.expose(), l.as_deref()))
                    .await?;
                hashed = Some((like, hash));
            }
            let (like, hash) = hashed.as_ref().expect("hashed above");
            let attempt = registration::Attempt {
                hash,
                hashed_like: like.as_deref(),
                now,
                last_try: tries == TRIES,
            };
            let plan = registration::decide(&state, attempt);
            let code = |contested: bool| crate::store::CodeWrite {
                code_hash: &code_hash,
                expires_at: now + CODE_TTL_MS,
                pending: Some((hash.as_str(), name.as_deref())),
                contested,
                message: if contested { &contested_mail } else { &verification },
            };
            let write = match &plan {
                Plan::Rehash { .. } => continue,
                Plan::Repeat { .. } => {
                    done = Some(plan);
                    break;
                }
                Plan::Create { contested } => RegistrationWrite::Create {
                    id: &id,
                    password_hash: hash,
                    name: name.as_deref(),
                    ip: Some(&address),
                    code: code(*contested),
                },
                Plan::Replace { id, contested } => RegistrationWrite::Replace {
                    id,
                    password_hash: hash,
                    name: name.as_deref(),
                    code: code(*contested),
                },
                Plan::Notice { shadow } => RegistrationWrite::Notice {
                    message: &notice,
                    shadow: shadow.then(|| crate::store::CodeWrite {
                        code_hash: &shadow_hash,
                        expires_at: now + CODE_TTL_MS,
                        pending: None,
                        contested: false,
                        message: &notice,
                    }),
                },
            };
            if self
                .store
                .apply_registration(email.as_str(), now, &state, &write)
                .await?
            {
                done = Some(plan);
                break;
            }
        }
        // Registrations of this email raced this one at every try.
        let Some(plan) = done else {
            return Err(super::hashing::Overloaded.into());
        };
        if matches!(plan, Plan::Replace { .. }) {
            // The unfinished sign-up now holds this registration's password.
            self.revocations.user_changed(email.as_str()).await;
        }
        // The account now holds this hash of `password`, just computed here:
        // what a verification would have established. The login that
        // usually follows a sign-up skips argon2, which halves the hashing
        // a sign-up costs. (An unfinished sign-up taken over by this
        // registration is remembered too, so that the two cases answer that
        // login alike.)
        let holder = match &plan {
            Plan::Create { .. } => Some(&id),
            Plan::Replace { id, .. } | Plan::Repeat { id } => Some(id),
            Plan::Notice { .. } | Plan::Rehash { .. } => None,
        };
        if let (Some(c), Some(holder), Some((_, hash))) = (&self.credentials, holder, &hashed) {
            c.remember(holder, hash, password.expose());
        }
        tracing::debug!(?plan, "register");
        self.mail_wake.notify_one();
        Ok(())
    }

    pub async fn resend_code(&self, ip: IpAddr, email: Email) -> Result<(), AuthError> {
        self.limiter
            .check(PolicyName::ResendIp, self.limiter.ip_key(ip).as_str())
            .await?;
        self.limiter
            .check(PolicyName::ResendEmail, email.as_str())
            .await?;
        let user = self.store.user_by_email(email.as_str()).await?;
        let real = user.is_some_and(|u| u.email_verified_at.is_none());
        self.issue_code(&email, Purpose::VerifyEmail, real).await
    }

    pub async fn request_password_reset(&self, ip: IpAddr, email: Email) -> Result<(), AuthError> {
        self.limiter
            .check(PolicyName::ResetIp, self.limiter.ip_key(ip).as_str())
            .await?;
        self.limiter.check(PolicyName::ResetEmail, email.as_str()).await?;
        let real = self.store.user_by_email(email.as_str()).await?.is_some();
        self.issue_code(&email, Purpose::ResetPassword, real).await
    }

    /// A new code, at most one per minute per email and purpose: a real one
    /// with its email, or (`real` false: no account to send it for) a shadow
    /// that nothing matches. Both do the same work, so neither the answer
    /// nor its timing tells them apart.
    pub(super) async fn issue_code(
        &self,
        email: &Email,
        purpose: Purpose,
        real: bool,
    ) -> Result<(), AuthError> {
        self.issue_code_with(email, purpose, real, None).await
    }

    /// [`Self::issue_code`], recording `event` in the same transaction
    /// when a code is issued.
    pub(super) async fn issue_code_with(
        &self,
        email: &Email,
        purpose: Purpose,
        real: bool,
        event: Option<Event<'_>>,
    ) -> Result<(), AuthError> {
        let code = random_code();
        let mac = self.code_hash(purpose, email, &code);
        let hash = if real { mac } else { random_bytes::<32>() };
        let msg = match purpose {
            Purpose::VerifyEmail => Message::verification(email.as_str(), &code),
            Purpose::ResetPassword => Message::password_reset(email.as_str(), &code),
        };
        let sealed = self.seal(&msg);
        let now = now_ms();
        let sent = self
            .store
            .issue_code(NewCode {
                email: email.as_str(),
                purpose,
                code_hash: &hash,
                now,
                expires_at: now + CODE_TTL_MS,
                quiet_ms: RESEND_QUIET_MS,
                message: real.then_some(&sealed[..]),
                event,
            })
            .await?;
        if sent && real {
            self.mail_wake.notify_one();
        }
        Ok(())
    }

    /// Judges a code against the stored one for `email` (a shadow code or
    /// none when there is no account: the same statements either way),
    /// counting a wrong try on the code and on the client address. The
    /// per-email limit (`verify_account`, keyed `limit_key`) is charged only
    /// once the address may guess, so that guesses it refuses cannot drain
    /// the owner's allowance. Returns the code's creation time (its
    /// identity) when accepted; the caller takes the guess back with
    /// `right_code` once the code is consumed.
    async fn check_code(
        &self,
        ip: IpAddr,
        email: &Email,
        purpose: Purpose,
        code: &Code,
        limit_key: &str,
    ) -> Result<i64, AuthError> {
        let address = self.guess_key(ip);
        let rules = BruteForceRules::CODE_GUESSES;
        if let Err(ms) = self.code_guesses.begin(&address, &rules).await {
            return Err(AuthError::TooManyAttempts {
                retry_after: Some((ms.max(0) as u64).div_ceil(1000).max(1)),
            });
        }
        if let Err(l) = self.limiter.check(PolicyName::VerifyAccount, limit_key).await {
            self.code_guesses.abandon(&address, &rules).await;
            return Err(l.into());
        }
        let rec = match self.store.code_for(email.as_str(), purpose).await {
            Ok(rec) => rec,
            Err(e) => {
                // Nothing was judged: the guess is taken back, so that a
                // client retrying through a database outage (as the 503's
                // Retry-After asks) does not use up its address's allowance.
                self.code_guesses.abandon(&address, &rules).await;
                return Err(e.into());
            }
        };
        let guess = self.code_hash(purpose, email, code.expose());
        let matches = rec.as_ref().is_some_and(|r| ct_eq(&r.code_hash, &guess));
        let state = rec.as_ref().map(|r| CodeState {
            expires_at: r.expires_at,
            failed_attempts: r.failed_attempts,
            consumed: r.consumed_at.is_some(),
        });
        match codes::judge(state, matches, now_ms()) {
            CodeVerdict::Accept => Ok(rec.map(|r| r.created_at).unwrap_or_default()),
            CodeVerdict::Wrong => {
                let r = rec.expect("a wrong guess needs a code");
                self.store
                    .record_code_failure(email.as_str(), purpose, r.created_at, MAX_FAILURES)
                    .await?;
                Err(AuthError::InvalidOtp)
            }
            CodeVerdict::Invalid => Err(AuthError::InvalidOtp),
            CodeVerdict::Dead => Err(AuthError::TooManyAttempts { retry_after: None }),
        }
    }

    /// The wrong-code count of a client address.
    fn guess_key(&self, ip: IpAddr) -> String {
        format!("codes:{}", self.limiter.ip_key(ip).as_str())
    }

    /// A right code was consumed: it was no guess, so the address's count
    /// is taken back by one (never wiped: a success must not buy guesses).
    async fn right_code(&self, ip: IpAddr) {
        let rules = BruteForceRules::CODE_GUESSES;
        self.code_guesses.abandon(&self.guess_key(ip), &rules).await;
    }

    pub async fn verify_email(
        &self,
        origin: &Origin,
        email: Email,
        code: Code,
    ) -> Result<TokenPair, AuthError> {
        let ip = origin.ip;
        let user = self.store.user_by_email(email.as_str()).await?;
        let code_id = self
            .check_code(ip, &email, Purpose::VerifyEmail, &code, email.as_str())
            .await?;
        // A shadow code never matches: an accepted code has its account
        // (unless it was deleted meanwhile).
        let Some(user) = user else {
            return Err(AuthError::InvalidOtp);
        };
        if user.disabled_at.is_some() {
            return Err(AuthError::AccountDisabled);
        }
        let (session, refresh) = self.new_session(None, origin, Authn::new("email", now_ms()), false);
        let started = self
            .store
            .verify_email(email.as_str(), code_id, MAX_FAILURES, &session.as_new(&user.id))
            .await?;
        let (started, has_password) = match started {
            // Used concurrently, or verified by a reset; or disabled meanwhile.
            None | Some((SessionStart::Disabled, _)) => return Err(AuthError::InvalidOtp),
            Some(outcome) => outcome,
        };
        self.right_code(ip).await;
        // The mailbox's owner starts with no address known from before.
        self.brute_force.forget_known(email.as_str()).await;
        if let Some(c) = &self.credentials {
            c.forget(&user.id);
        }
        self.revocations.user_changed(email.as_str()).await;
        if started == SessionStart::FactorRequired {
            // The email is verified; the login goes on with a second factor
            // (an account that had factors before an email change).
            return Err(self.step_up(&user, &session.authn, None, origin).await);
        }
        let mut pair = self.pair(&user.id, &user.email, &session, FIRST_PARTY_CLIENT, refresh)?;
        if !has_password {
            pair.status = Some(PASSWORD_REQUIRED);
            pair.message = Some(
                "Another sign-up for this address happened before it was verified, so no password \
                 was set. Choose one now: POST /auth/password with new_password and no current_password.",
            );
        }
        Ok(pair)
    }

    async fn find_user(&self, email: &Email) -> Result<Option<Arc<UserRecord>>, AuthError> {
        if let Some(u) = self.users.get(email.as_str()) {
            return Ok(Some(u));
        }
        let u = self.store.user_by_email(email.as_str()).await?.map(Arc::new);
        if let Some(u) = &u {
            self.users.put(u.clone());
        }
        Ok(u)
    }

    /// Checks a password for an email, paying the same argon2 cost whether or
    /// not the account exists, under the brute-force rules: the attempt is
    /// counted before the password is checked (so parallel guesses cannot
    /// slip through), cleared by a right password, taken back if it never
    /// reached a verdict (shed by the hashing pool, or a store failure).
    async fn check_password(
        &self,
        ip: IpAddr,
        email: &Email,
        password: &Password,
    ) -> Result<Arc<UserRecord>, AuthError> {
        let client = self.limiter.ip_key(ip);
        let (account, client) = (email.as_str(), client.as_str());
        let attempt = self.begin_attempt(account, client).await?;
        // The per-account limit comes after the brute-force rules admitted
        // the attempt, so that attempts they refuse cannot drain it, and an
        // address the account logged in from does not spend it.
        if attempt.counted_for_account() {
            if let Err(l) = self.limiter.check(PolicyName::LoginAccount, account).await {
                self.brute_force.abandon(account, client, attempt).await;
                return Err(l.into());
            }
        }
        match self.verify_password(email, password).await {
            Ok((Some(u), true)) => {
                let verified = u.email_verified_at.is_some();
                self.brute_force.success(account, client, attempt, verified).await;
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
                self.brute_force.abandon(account, client, attempt).await;
                Err(e)
            }
        }
    }

    /// Admits a password attempt of `account` from `client` under the
    /// brute-force rules, counted as a failure until it proves otherwise.
    async fn begin_attempt(&self, account: &str, client: &str) -> Result<Attempt, AuthError> {
        self.brute_force
            .begin(account, client)
            .await
            .map_err(|retry| AuthError::TooManyAttempts {
                retry_after: Some(retry),
            })
    }

    /// Records a wrong password (`reason`), and the lock it set for the
    /// address if it did.
    async fn attempt_failed(&self, user_id: Option<&str>, ip: IpAddr, reason: &str, attempt: &Attempt) {
        self.login_failed(user_id, ip, reason).await;
        if attempt.locks() {
            self.login_failed(user_id, ip, "locked_for_address").await;
        }
    }

    /// Records a refused login (`reason`: why), or (`locked_for_address`) the
    /// failure that locked the account for its address (`user.locked`). A
    /// failure to record is logged, not answered.
    async fn login_failed(&self, user_id: Option<&str>, ip: IpAddr, reason: &str) {
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
        if let Err(err) = self.store.record_event(&e).await {
            tracing::warn!(error = %err, "recording a failed login");
        }
    }

    /// The cost of a password check where no password can match.
    async fn dummy_verify(&self, password: &Password) -> Result<(), AuthError> {
        let pw = password.clone();
        self.hashing
            .run("verify", move |p| p.verify_dummy(pw.expose()))
            .await?;
        Ok(())
    }

    /// The account of `email` if there is one, and whether `password` is its
    /// password (never for no account).
    async fn verify_password(
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
                let cached = self
                    .credentials
                    .as_ref()
                    .is_some_and(|c| c.check(&u.id, &u.password_hash, password.expose()));
                if cached {
                    true
                } else {
                    let ok = self.hashing.verify(&u.id, password, &u.password_hash).await?;
                    if ok {
                        if let Some(c) = &self.credentials {
                            c.remember(&u.id, &u.password_hash, password.expose());
                        }
                    }
                    ok
                }
            }
        };
        Ok((user, ok))
    }

    pub async fn login(
        &self,
        origin: &Origin,
        email: Email,
        password: Password,
        client_id: Option<&str>,
    ) -> Result<TokenPair, AuthError> {
        let ip = origin.ip;
        self.limiter
            .check(PolicyName::LoginIp, self.limiter.ip_key(ip).as_str())
            .await?;
        let user = self.check_password(ip, &email, &password).await?;
        if user.email_verified_at.is_none() {
            self.login_failed(Some(&user.id), ip, "verification_pending")
                .await;
            return Err(AuthError::VerificationPending);
        }
        if user.disabled_at.is_some() {
            self.login_failed(Some(&user.id), ip, "account_disabled").await;
            return Err(AuthError::AccountDisabled);
        }
        self.upgrade_hash_later(&user, password);
        self.start_session(&user, client_id, origin, Authn::new("pwd", now_ms()), false)
            .await
    }

    /// Starts a session of `user` authenticated as `authn` (`second_factor`:
    /// that included one), or, when the account has a factor the
    /// authentication did not pass, answers with the step up to it.
    pub(super) async fn start_session(
        &self,
        user: &UserRecord,
        client_id: Option<&str>,
        origin: &Origin,
        authn: Authn,
        second_factor: bool,
    ) -> Result<TokenPair, AuthError> {
        let (session, refresh) = self.new_session(client_id, origin, authn, second_factor);
        match self.store.create_session(&session.as_new(&user.id)).await? {
            SessionStart::Started => self.pair(
                &user.id,
                &user.email,
                &session,
                client_id.unwrap_or(FIRST_PARTY_CLIENT),
                refresh,
            ),
            SessionStart::Disabled => {
                // Disabled after the account was read (a cached copy, or a race).
                self.login_failed(Some(&user.id), origin.ip, "account_disabled")
                    .await;
                Err(AuthError::AccountDisabled)
            }
            SessionStart::FactorRequired => Err(self.step_up(user, &session.authn, client_id, origin).await),
        }
    }

    /// Rehashes a password made with older parameters, after the answer.
    fn upgrade_hash_later(&self, user: &UserRecord, password: Password) {
        if !self.hashing.passwords().needs_rehash(&user.password_hash) {
            return;
        }
        let (hashing, store, users) = (self.hashing.clone(), self.store.clone(), self.users.clone());
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

    /// An OAuth client's credentials (`client_secret_basic` or `_post`).
    pub async fn authenticate_client(&self, id: &str, secret: &str) -> Result<ClientRecord, AuthError> {
        super::clients::authenticate(&self.store, id, secret).await
    }

    /// What introspection may tell `caller` of a refresh token: only the
    /// client it was issued to learns anything, and only while it refreshes.
    pub async fn introspect_refresh(
        &self,
        token: &str,
        caller: &str,
    ) -> Result<Option<RefreshInfo>, AuthError> {
        let Some(rec) = self.store.refresh_token(&sha256(token.as_bytes())).await? else {
            return Ok(None);
        };
        if rec.client_id.as_deref() != Some(caller) {
            return Ok(None);
        }
        let grace = self.refresh_grace.as_millis() as i64;
        if !refresh::decide(RefreshState::from(&rec), now_ms(), grace).is_live() {
            return Ok(None);
        }
        Ok(Some(RefreshInfo {
            user_id: rec.user_id,
            session_id: rec.session_id,
            email: rec.email,
            client_id: rec.client_id.unwrap_or_else(|| FIRST_PARTY_CLIENT.into()),
            expires_at: rec.session_expires_at,
        }))
    }

    pub async fn refresh(&self, token: &str, client_id: Option<&str>) -> Result<TokenPair, AuthError> {
        let hash = sha256(token.as_bytes());
        let grace = self.refresh_grace.as_millis() as i64;
        let state = |r: &RefreshRecord| RefreshState::from(r);
        let now = now_ms();
        let rec = match self.refresh_tokens.session_of(token, client_id) {
            // The token names its session: that session's limit first, then
            // the lookup and a rotation in one statement. What it did not
            // rotate is decided below, as for any other token.
            // A session belongs to the client that started it: first-party
            // sessions refresh at /auth/refresh (`None`), an OAuth client's
            // only at /oauth/token with that client's authentication. The
            // tag names the client too, so a token presented by another
            // client takes the lookup below and spends no limit.
            Some(session) => {
                let session_id = session.to_string();
                self.limiter
                    .check(PolicyName::RefreshSession, &session_id)
                    .await?;
                let next = self.refresh_tokens.mint(&session, client_id);
                let successor = Sealer::from_token(token, "successor").seal(next.as_bytes(), &hash);
                let asked = LiveRotation {
                    old: hash,
                    new: sha256(next.as_bytes()),
                    successor,
                    session_id: session_id.clone(),
                    client_id: client_id.map(str::to_string),
                    now,
                };
                let Some((rec, rotated)) = self.store.rotate_live_refresh(asked).await? else {
                    return Err(AuthError::InvalidToken);
                };
                if rec.session_id != session_id || rec.client_id.as_deref() != client_id {
                    return Err(AuthError::InvalidToken);
                }
                if rotated {
                    return self.refreshed_pair(&rec, next);
                }
                rec
            }
            // Not a token this service minted for this client.
            None => return Err(AuthError::InvalidToken),
        };
        let mut decision = refresh::decide(state(&rec), now, grace);
        let mut rec = rec;
        if decision == RefreshDecision::Rotate {
            let session = uuid::Uuid::parse_str(&rec.session_id).map_err(|_| AuthError::InvalidToken)?;
            let next = self.refresh_tokens.mint(&session, rec.client_id.as_deref());
            let successor = Sealer::from_token(token, "successor").seal(next.as_bytes(), &hash);
            if self
                .store
                .rotate_refresh(&hash, &sha256(next.as_bytes()), &successor, now_ms())
                .await?
            {
                return self.refreshed_pair(&rec, next);
            }
            // Another request rotated it first: answer as it did.
            rec = self
                .store
                .refresh_token(&hash)
                .await?
                .ok_or(AuthError::InvalidToken)?;
            decision = refresh::decide(state(&rec), now_ms(), grace);
        }
        match decision {
            RefreshDecision::ReturnSuccessor => {
                let next = rec
                    .successor
                    .as_deref()
                    .and_then(|s| Sealer::from_token(token, "successor").open(s, &hash))
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or(AuthError::InvalidToken)?;
                self.refreshed_pair(&rec, next)
            }
            RefreshDecision::Reuse => {
                tracing::warn!(session_id = %rec.session_id, "refresh token reused after rotation: session revoked");
                metrics::counter!("latchkey_refresh_reuse_total").increment(1);
                self.revoke_session(&rec.session_id, "refresh_reuse").await?;
                Err(AuthError::InvalidToken)
            }
            RefreshDecision::Invalid | RefreshDecision::Rotate => Err(AuthError::InvalidToken),
        }
    }

    /// Ends the first-party session of a refresh token; a token of an OAuth
    /// client is ended by that client at `/oauth/revoke`, and an unknown
    /// token is fine (the answer is the same).
    pub async fn logout(&self, token: &str) -> Result<(), AuthError> {
        self.revoke_refresh_token(token, None).await
    }

    /// Revokes the session of a refresh token (RFC 7009) if it is a
    /// first-party token or one issued to `caller`; others and unknown
    /// tokens are left alone (the answer is the same).
    pub async fn revoke_refresh_token(&self, token: &str, caller: Option<&str>) -> Result<(), AuthError> {
        let hash = sha256(token.as_bytes());
        if let Some(rec) = self.store.refresh_token(&hash).await? {
            let mine = rec.client_id.is_none() || rec.client_id.as_deref() == caller;
            if mine && rec.session_revoked_at.is_none() {
                let reason = if caller.is_none() { "logout" } else { "revoked" };
                self.revoke_session(&rec.session_id, reason).await?;
            }
        }
        Ok(())
    }

    /// Revokes a session by id (an access token's `sid`).
    pub async fn revoke_session_of(&self, session_id: &str) -> Result<(), AuthError> {
        self.revoke_session(session_id, "revoked").await
    }

    async fn revoke_session(&self, session_id: &str, reason: &str) -> Result<(), AuthError> {
        self.store.revoke_session(session_id, reason, now_ms()).await?;
        self.revocations.revoke(&[session_id.to_string()]).await;
        Ok(())
    }

    /// The caller's live sessions, newest first, the caller's own marked.
    pub async fn sessions(&self, token: &Verified) -> Result<Vec<SessionInfo>, AuthError> {
        let list = self.store.live_sessions(&token.claims.sub, now_ms()).await?;
        Ok(list
            .into_iter()
            .map(|s| SessionInfo::of(s, &token.claims.sid))
            .collect())
    }

    /// Ends one of the caller's live sessions (the caller's own included):
    /// its refresh token stops working and its access tokens are refused
    /// everywhere, as after a logout. Another user's session, or one that
    /// is not live, is [`AuthError::NotFound`] alike.
    pub async fn end_session(&self, token: &Verified, session_id: &str) -> Result<(), AuthError> {
        // Session ids are UUIDs: anything else names no session.
        if uuid::Uuid::try_parse(session_id).is_err() {
            return Err(AuthError::NotFound("session"));
        }
        let ended = self
            .store
            .revoke_user_session(&token.claims.sub, session_id, "ended_by_user", now_ms())
            .await?;
        if !ended {
            return Err(AuthError::NotFound("session"));
        }
        self.revocations.revoke(&[session_id.to_string()]).await;
        Ok(())
    }

    /// Ends every live session of the caller, or (`others`) every one but
    /// the caller's.
    pub async fn end_sessions(&self, token: &Verified, others: bool) -> Result<(), AuthError> {
        let keep = others.then_some(token.claims.sid.as_str());
        let ended = self
            .store
            .revoke_user_sessions(&token.claims.sub, keep, "ended_by_user", now_ms(), None)
            .await?;
        self.revocations.revoke(&ended).await;
        Ok(())
    }

    /// Whether client `id` still exists (`None`: removed) and may still have
    /// `scope`: checked on every admin call, so that removing a client or
    /// its scope takes effect at once, not when its tokens expire.
    pub async fn client_may(&self, id: &str, scope: &str) -> Result<Option<bool>, AuthError> {
        Ok(self
            .store
            .client(id)
            .await?
            .map(|c| c.scopes.split(' ').any(|s| s == scope)))
    }

    /// A client's own access token (the client_credentials grant).
    pub fn client_token(
        &self,
        client: &ClientRecord,
        requested: Option<&str>,
    ) -> Result<ClientToken, AuthError> {
        let scope = super::clients::granted_scope(client, requested).ok_or(AuthError::InvalidScope)?;
        let access_token = self
            .tokens
            .issue_for_client(&client.id, client.created_at, &scope)?;
        Ok(ClientToken {
            access_token,
            token_type: "Bearer",
            expires_in: self.tokens.access_ttl().as_secs(),
            scope,
        })
    }

    pub async fn profile(&self, token: &Verified) -> Result<Profile, AuthError> {
        let Some(u) = self.store.user_by_id(&token.claims.sub).await? else {
            return Err(AuthError::InvalidToken);
        };
        Ok(Profile {
            id: u.id,
            email: u.email,
            name: u.name,
            email_verified: u.email_verified_at.is_some(),
            created_at: rfc3339(u.created_at),
        })
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
    pub(super) async fn check_current_password(
        &self,
        token: &Verified,
        ip: IpAddr,
        current: Option<Password>,
    ) -> Result<UserRecord, AuthError> {
        self.limiter
            .check(PolicyName::PasswordAccount, &token.claims.sub)
            .await?;
        let Some(user) = self.store.user_by_id(&token.claims.sub).await? else {
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
        let client = self.limiter.ip_key(ip);
        let (account, client) = (user.email.as_str(), client.as_str());
        let attempt = self.begin_attempt(account, client).await?;
        let ok = if user.password_hash == UNUSABLE_PASSWORD {
            self.dummy_verify(&current).await.map(|()| false)
        } else {
            self.hashing
                .verify(&user.id, &current, &user.password_hash)
                .await
                .map_err(AuthError::from)
        };
        match ok {
            Ok(true) => {
                self.brute_force.success(account, client, attempt, true).await;
                Ok(user)
            }
            Ok(false) => {
                self.attempt_failed(Some(&user.id), ip, "current_password", &attempt)
                    .await;
                Err(AuthError::InvalidCredentials)
            }
            Err(e) => {
                self.brute_force.abandon(account, client, attempt).await;
                Err(e)
            }
        }
    }

    /// Changes the password; `end_other_sessions` ends every session but the
    /// caller's (the current one always stays). `current` is `None` only for
    /// an account without a password (see [`Self::check_current_password`]).
    pub async fn change_password(
        &self,
        token: &Verified,
        ip: IpAddr,
        current: Option<Password>,
        new: Password,
        end_other_sessions: bool,
    ) -> Result<(), AuthError> {
        let user = self.check_current_password(token, ip, current).await?;
        let new_hash = self.hashing.run("hash", move |p| p.hash(new.expose())).await?;
        let revoked = self
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
        self.after_password_change(&user, revoked).await;
        Ok(())
    }

    pub async fn confirm_password_reset(
        &self,
        ip: IpAddr,
        email: Email,
        code: Code,
        new: Password,
    ) -> Result<(), AuthError> {
        let user = self.store.user_by_email(email.as_str()).await?;
        let limit_key = format!("reset:{}", email.as_str());
        let code_id = self
            .check_code(ip, &email, Purpose::ResetPassword, &code, &limit_key)
            .await?;
        let Some(user) = user else {
            return Err(AuthError::InvalidOtp);
        };
        let new_hash = self.hashing.run("hash", move |p| p.hash(new.expose())).await?;
        let revoked = self
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
        self.right_code(ip).await;
        self.after_password_change(&user, revoked).await;
        let client = self.limiter.ip_key(ip);
        self.brute_force.reset(email.as_str(), client.as_str()).await;
        Ok(())
    }

    /// Makes a committed password change felt everywhere. It runs to the end
    /// in its own task even if the request is cut short (the deadline), and
    /// the user caches of other instances also learn it from the database
    /// within seconds (housekeeping) if the Redis event is lost.
    async fn after_password_change(&self, user: &UserRecord, revoked: Vec<String>) {
        if let Some(c) = &self.credentials {
            c.forget(&user.id);
        }
        let (revocations, email) = (self.revocations.clone(), user.email.clone());
        let _ = tokio::spawn(async move {
            revocations.revoke(&revoked).await;
            revocations.user_changed(&email).await;
        })
        .await;
    }

    fn new_session(
        &self,
        client_id: Option<&str>,
        origin: &Origin,
        authn: Authn,
        second_factor: bool,
    ) -> (SessionDraft, String) {
        let session = uuid::Uuid::new_v4();
        let token = self.refresh_tokens.mint(&session, client_id);
        let id = session.to_string();
        let now = now_ms();
        let draft = SessionDraft {
            id,
            client_id: client_id.map(str::to_string),
            now,
            expires_at: now + self.refresh_ttl.as_millis() as i64,
            token_hash: sha256(token.as_bytes()),
            user_agent: origin.user_agent.clone(),
            ip: origin.ip.to_string(),
            authn,
            second_factor,
        };
        (draft, token)
    }

    fn pair(
        &self,
        user_id: &str,
        email: &str,
        session: &SessionDraft,
        client_id: &str,
        refresh_token: String,
    ) -> Result<TokenPair, AuthError> {
        let subject = Subject {
            user_id,
            email,
            session_id: &session.id,
            client_id,
            authn: &session.authn,
        };
        self.token_pair(&subject, refresh_token, session.expires_at)
    }

    /// The pair of a refresh: the session's own authentication carries on.
    fn refreshed_pair(&self, rec: &RefreshRecord, refresh_token: String) -> Result<TokenPair, AuthError> {
        let authn = Authn::new(&rec.amr, rec.auth_time);
        let subject = Subject {
            user_id: &rec.user_id,
            email: &rec.email,
            session_id: &rec.session_id,
            client_id: client_name(rec),
            authn: &authn,
        };
        self.token_pair(&subject, refresh_token, rec.session_expires_at)
    }

    fn token_pair(
        &self,
        subject: &Subject<'_>,
        refresh_token: String,
        session_expires_at: i64,
    ) -> Result<TokenPair, AuthError> {
        let access_token = self.tokens.issue(subject)?;
        Ok(TokenPair {
            access_token,
            token_type: "Bearer",
            expires_in: self.tokens.access_ttl().as_secs(),
            refresh_token,
            refresh_expires_in: ((session_expires_at - now_ms()).max(0) / 1000) as u64,
            status: None,
            message: None,
        })
    }
}

/// A session about to be stored, with the hash of its first refresh token.
struct SessionDraft {
    id: String,
    client_id: Option<String>,
    now: i64,
    expires_at: i64,
    token_hash: [u8; 32],
    user_agent: Option<String>,
    ip: String,
    authn: Authn,
    second_factor: bool,
}

impl SessionDraft {
    fn as_new<'a>(&'a self, user_id: &'a str) -> NewSession<'a> {
        NewSession {
            id: &self.id,
            user_id,
            client_id: self.client_id.as_deref(),
            now: self.now,
            expires_at: self.expires_at,
            token_hash: &self.token_hash,
            user_agent: self.user_agent.as_deref(),
            ip: Some(&self.ip),
            amr: &self.authn.amr,
            auth_time: self.authn.at_ms,
            second_factor: self.second_factor,
        }
    }
}
