//! The `mfa_token` of a login that steps up, as a pure state machine (`now`
//! in ms passed in).
//!
//! ```text
//!   right password (or email code), the account has a factor
//!                  |
//!                  v
//!        PENDING(failures = 0, expires_at = now + 5 min)
//!          |  wrong factor, failures + 1 < 5 -----> PENDING(failures + 1)
//!          |  wrong factor, failures + 1 = 5 -----> DEAD (deleted)
//!          |  now >= expires_at -----------------> DEAD
//!          |  right factor ----------------------> USED (deleted; one session)
//! ```
//!
//! The token is single-use: whichever right answer deletes the row first
//! gets the session, any other gets nothing. Wrong factors also count in
//! the account's brute-force rules, so that fresh tokens (each needing the
//! password) do not buy unlimited guesses.

/// How long a login may wait for its second factor.
pub const TTL_MS: i64 = 5 * 60_000;
/// Wrong factors a token survives.
pub const MAX_FAILURES: i32 = 5;
/// How long a WebAuthn ceremony may take between its two calls.
pub const CEREMONY_TTL_MS: i64 = 5 * 60_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Pending { failures: i32 },
    Dead,
}

/// The state of a token with `failures` wrong tries that expires at `expires_at`.
pub fn state(failures: i32, expires_at: i64, now: i64) -> State {
    if now >= expires_at || failures >= MAX_FAILURES {
        State::Dead
    } else {
        State::Pending { failures }
    }
}

/// The state after one more wrong factor.
pub fn after_failure(failures: i32) -> State {
    if failures + 1 >= MAX_FAILURES {
        State::Dead
    } else {
        State::Pending {
            failures: failures + 1,
        }
    }
}

/// The answer to a right first factor when the account has a second.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct StepUp {
    /// Single use, 5 minutes, dead after 5 wrong factors.
    pub mfa_token: String,
    /// What `POST /auth/mfa/verify` accepts for this account: `totp`,
    /// `webauthn`, `recovery_code`.
    pub factors: Vec<&'static str>,
    /// With `webauthn`: the options of the assertion to make.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub webauthn: Option<serde_json::Value>,
    pub expires_in: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_wrong_factors_or_five_minutes_kill_the_token() {
        let t0 = 1_000_000;
        let mut s = state(0, t0 + TTL_MS, t0);
        let mut wrong = 0;
        while let State::Pending { failures } = s {
            s = after_failure(failures);
            wrong += 1;
        }
        assert_eq!(wrong, MAX_FAILURES);
        assert_eq!(
            state(0, t0 + TTL_MS, t0 + TTL_MS - 1),
            State::Pending { failures: 0 }
        );
        assert_eq!(state(0, t0 + TTL_MS, t0 + TTL_MS), State::Dead);
        assert_eq!(state(MAX_FAILURES, t0 + TTL_MS, t0), State::Dead);
        assert_eq!(
            state(MAX_FAILURES - 1, t0 + TTL_MS, t0),
            State::Pending { failures: 4 }
        );
    }
}
