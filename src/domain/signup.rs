//! Sign-up: registering an address with a password, resending its code,
//! and verifying it, which starts the account's first session. Who a
//! registration may take over is decided by `registration::decide` from the
//! address's state; the store applies the plan only to the state it was
//! decided on (`store::apply_registration`). What verifying the address
//! activates is decided by `registration::activation` and applied the same
//! way (`store::verify_email`).

use std::net::IpAddr;
use std::sync::Arc;

use super::codebook::CodeBook;
use super::codes::{CODE_TTL_MS, MAX_FAILURES};
use super::input::{Code, Email, Password};
use super::mfa::SecondFactors;
use super::registration::{self, Plan};
use super::sessions::{Origin, Sessions, TokenPair, FIRST_PARTY_CLIENT, PASSWORD_REQUIRED};
use super::shared::Shared;
use super::tokens::Authn;
use super::AuthError;
use crate::clock::now_ms;
use crate::crypto::{random_bytes, random_code};
use crate::limits::PolicyName;
use crate::mail::Message;
use crate::store::{CodeWrite, Purpose, RegistrationWrite, SessionStart};

pub struct SignUp {
    shared: Arc<Shared>,
    codes: Arc<CodeBook>,
    sessions: Arc<Sessions>,
    factors: Arc<SecondFactors>,
}

impl SignUp {
    pub fn new(
        shared: Arc<Shared>,
        codes: Arc<CodeBook>,
        sessions: Arc<Sessions>,
        factors: Arc<SecondFactors>,
    ) -> SignUp {
        SignUp {
            shared,
            codes,
            sessions,
            factors,
        }
    }

    pub async fn register(
        &self,
        ip: IpAddr,
        email: Email,
        password: Password,
        name: Option<String>,
    ) -> Result<(), AuthError> {
        let s = &self.shared;
        s.limiter
            .check(PolicyName::RegisterIp, s.limiter.ip_key(ip).as_str())
            .await?;
        s.limiter.check(PolicyName::RegisterEmail, email.as_str()).await?;
        let code = random_code();
        let code_hash = self.codes.hash(Purpose::VerifyEmail, &email, &code);
        let id = uuid::Uuid::now_v7().to_string();
        let address = ip.to_string();
        let verification = s.outbox.seal(&Message::verification(email.as_str(), &code));
        let contested_mail = s
            .outbox
            .seal(&Message::verification_contested(email.as_str(), &code));
        let notice = s.outbox.seal(&Message::already_registered(email.as_str()));
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
            let state = s.store.registration_state(email.as_str(), now).await?;
            let like = registration::live_registration(&state, now).map(str::to_string);
            let stale = hashed.as_ref().is_none_or(|(l, _)| *l != like);
            if stale {
                let (pw, l) = (password.clone(), like.clone());
                let hash = s
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
            let code = |contested: bool| CodeWrite {
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
                    shadow: shadow.then(|| CodeWrite {
                        code_hash: &shadow_hash,
                        expires_at: now + CODE_TTL_MS,
                        pending: None,
                        contested: false,
                        message: &notice,
                    }),
                },
            };
            if s.store
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
            s.revocations.user_changed(email.as_str()).await;
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
        if let (Some(c), Some(holder), Some((_, hash))) = (&s.credentials, holder, &hashed) {
            c.remember(holder, hash, password.expose());
        }
        tracing::debug!(?plan, "register");
        s.outbox.wake();
        Ok(())
    }

    /// Mails a new verification code if the address has an unverified
    /// account (and does the same work, with a code nothing matches, if not).
    pub async fn resend_code(&self, ip: IpAddr, email: Email) -> Result<(), AuthError> {
        let s = &self.shared;
        s.limiter
            .check(PolicyName::ResendIp, s.limiter.ip_key(ip).as_str())
            .await?;
        s.limiter.check(PolicyName::ResendEmail, email.as_str()).await?;
        let user = s.store.user_by_email(email.as_str()).await?;
        let real = user.is_some_and(|u| u.email_verified_at.is_none());
        self.codes.issue(&email, Purpose::VerifyEmail, real).await
    }

    pub async fn verify_email(
        &self,
        origin: &Origin,
        email: Email,
        code: Code,
    ) -> Result<TokenPair, AuthError> {
        let s = &self.shared;
        let ip = origin.ip;
        let user = s.store.user_by_email(email.as_str()).await?;
        let code_id = self
            .codes
            .check(ip, &email, Purpose::VerifyEmail, &code, email.as_str())
            .await?;
        // A shadow code never matches: an accepted code has its account
        // (unless it was deleted meanwhile).
        let Some(user) = user else {
            return Err(AuthError::InvalidOtp);
        };
        if user.disabled_at.is_some() {
            return Err(AuthError::AccountDisabled);
        }
        // The code as it is now: still the one accepted, or nothing changes.
        let state = s.store.registration_state(email.as_str(), now_ms()).await?;
        let Some(code) = state.live.filter(|c| c.created_at == code_id) else {
            return Err(AuthError::InvalidOtp);
        };
        let (session, refresh) = self
            .sessions
            .draft(None, origin, Authn::new("email", now_ms()), false);
        let started = s
            .store
            .verify_email(
                email.as_str(),
                &code,
                &registration::activation(&code),
                MAX_FAILURES,
                &session.as_new(&user.id),
            )
            .await?;
        let (started, has_password) = match started {
            // Used concurrently, or verified by a reset; or disabled meanwhile.
            None | Some((SessionStart::Disabled, _)) => return Err(AuthError::InvalidOtp),
            Some(outcome) => outcome,
        };
        self.codes.right_code(ip).await;
        // The mailbox's owner starts with no address known from before.
        s.brute_force.forget_known(email.as_str()).await;
        s.forget_user(&user.id, email.as_str()).await;
        if started == SessionStart::FactorRequired {
            // The email is verified; the login goes on with a second factor
            // (an account that had factors before an email change).
            return Err(self.factors.step_up(&user, &session.authn, None, origin).await);
        }
        let mut pair = self
            .sessions
            .pair(&user.id, &user.email, &session, FIRST_PARTY_CLIENT, refresh)?;
        if !has_password {
            pair.status = Some(PASSWORD_REQUIRED);
            pair.message = Some(
                "Another sign-up for this address happened before it was verified, so no password \
                 was set. Choose one now: POST /auth/password with new_password and no current_password.",
            );
        }
        Ok(pair)
    }
}
