//! The codes mailed to an address (email verification, password reset):
//! issued at most one a minute per address and purpose, stored only as a
//! MAC, judged by the rules of `codes.rs` under a count of wrong codes per
//! client address over every account. Used by sign-up, password reset and
//! administration.

use std::net::IpAddr;
use std::sync::Arc;

use super::codes::{self, CodeState, CodeVerdict, CODE_TTL_MS, MAX_FAILURES, RESEND_QUIET_MS};
use super::input::{Code, Email};
use super::shared::Shared;
use super::AuthError;
use crate::clock::now_ms;
use crate::crypto::{random_bytes, random_code};
use crate::limits::{BruteForceRules, PolicyName};
use crate::mail::Message;
use crate::store::{Event, NewCode, Purpose};

pub struct CodeBook {
    shared: Arc<Shared>,
}

impl CodeBook {
    pub fn new(shared: Arc<Shared>) -> CodeBook {
        CodeBook { shared }
    }

    /// What is stored of a code: its MAC under the server's code key, bound
    /// to the purpose and the address.
    pub fn hash(&self, purpose: Purpose, email: &Email, code: &str) -> [u8; 32] {
        self.shared.code_key.mac(&[
            purpose.as_str().as_bytes(),
            email.as_str().as_bytes(),
            code.as_bytes(),
        ])
    }

    /// Whether `stored` is the hash of `code` under the code key of any
    /// master secret held (a code mailed just before a rotation still counts).
    fn is_hash_of(&self, stored: &[u8], purpose: Purpose, email: &Email, code: &str) -> bool {
        self.shared.code_key.verify(
            &[
                purpose.as_str().as_bytes(),
                email.as_str().as_bytes(),
                code.as_bytes(),
            ],
            stored,
        )
    }

    /// A new code, at most one per minute per email and purpose: a real one
    /// with its email, or (`real` false: no account to send it for) a shadow
    /// that nothing matches. Both do the same work, so neither the answer
    /// nor its timing tells them apart.
    pub async fn issue(&self, email: &Email, purpose: Purpose, real: bool) -> Result<(), AuthError> {
        self.issue_with(email, purpose, real, None).await
    }

    /// [`Self::issue`], recording `event` in the same transaction when a
    /// code is issued.
    pub async fn issue_with(
        &self,
        email: &Email,
        purpose: Purpose,
        real: bool,
        event: Option<Event<'_>>,
    ) -> Result<(), AuthError> {
        let code = random_code();
        let mac = self.hash(purpose, email, &code);
        let hash = if real { mac } else { random_bytes::<32>() };
        let msg = match purpose {
            Purpose::VerifyEmail => Message::verification(email.as_str(), &code),
            Purpose::ResetPassword => Message::password_reset(email.as_str(), &code),
        };
        let sealed = self.shared.outbox.seal(&msg);
        let now = now_ms();
        let sent = self
            .shared
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
            self.shared.outbox.wake();
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
    /// [`Self::right_code`] once the code is consumed.
    pub async fn check(
        &self,
        ip: IpAddr,
        email: &Email,
        purpose: Purpose,
        code: &Code,
        limit_key: &str,
    ) -> Result<i64, AuthError> {
        let s = &self.shared;
        let address = self.guess_key(ip);
        let rules = BruteForceRules::CODE_GUESSES;
        if let Err(ms) = s.code_guesses.begin(&address, &rules).await {
            return Err(AuthError::TooManyAttempts {
                retry_after: Some((ms.max(0) as u64).div_ceil(1000).max(1)),
            });
        }
        if let Err(l) = s.limiter.check(PolicyName::VerifyAccount, limit_key).await {
            s.code_guesses.abandon(&address, &rules).await;
            return Err(l.into());
        }
        let rec = match s.store.code_for(email.as_str(), purpose).await {
            Ok(rec) => rec,
            Err(e) => {
                // Nothing was judged: the guess is taken back, so that a
                // client retrying through a database outage (as the 503's
                // Retry-After asks) does not use up its address's allowance.
                s.code_guesses.abandon(&address, &rules).await;
                return Err(e.into());
            }
        };
        let matches = rec.as_ref().is_some_and(|r| {
            r.code_hash.len() == 32 && self.is_hash_of(&r.code_hash, purpose, email, code.expose())
        });
        let state = rec.as_ref().map(|r| CodeState {
            expires_at: r.expires_at,
            failed_attempts: r.failed_attempts,
            consumed: r.consumed_at.is_some(),
        });
        match codes::judge(state, matches, now_ms()) {
            CodeVerdict::Accept => Ok(rec.map(|r| r.created_at).unwrap_or_default()),
            CodeVerdict::Wrong => {
                let r = rec.expect("a wrong guess needs a code");
                s.store
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
        format!("codes:{}", self.shared.limiter.ip_key(ip).as_str())
    }

    /// A right code was consumed: it was no guess, so the address's count
    /// is taken back by one (never wiped: a success must not buy guesses).
    pub async fn right_code(&self, ip: IpAddr) {
        let rules = BruteForceRules::CODE_GUESSES;
        self.shared
            .code_guesses
            .abandon(&self.guess_key(ip), &rules)
            .await;
    }
}
