//! Who a registration may take over: a pure decision over the state the
//! store read (the account the email names and the email's live
//! verification code), applied by the store only if that state is still
//! the one it read (`Store::apply_registration`: a compare-and-set, so that
//! a race is detected and decided again here, never decided in SQL).
//!
//! ```text
//!   account of the email        unused code                    plan
//!   ─────────────────────       ─────────────────────────────  ──────────────────────────────
//!   none                        any                            Create (contested if a code of
//!                                                              another password)
//!   owned (verified)            any                            Notice, the code a shadow
//!   owned (held: an admin       any                            Notice, its owner's code kept
//!     moved, created or
//!     imported it unverified)
//!   unfinished                  a live registration's (unexpired,
//!                                 uncontested), not the one
//!                                 hashed like               ─► Rehash like it (unless the last try)
//!                                 same password, younger than
//!                                 the resend pause, alive  ─► Repeat: nothing written or sent
//!                               otherwise                   ─► Replace: this registration's
//!                                                              credentials on a fresh code;
//!                                                              contested if a code of another
//!                                                              password, expired or not
//! ```
//!
//! Proving the mailbox with the code is decided here too
//! ([`activation`]), and applied by `Store::verify_email` with the same
//! compare-and-set:
//!
//! ```text
//!   the code used                     the account's password
//!   ───────────────────────────────   ─────────────────────────────────────
//!   contested                      ─► none (NoPassword): chosen next
//!   carries a registration's hash  ─► that hash and name (Credentials)
//!   carries none                   ─► its own, unchanged (Keep: an admin,
//!                                     an import or a reset gave it one)
//! ```
//!
//! A *contested* code verifies the mailbox but activates no password: two parties claimed the address before it was
//! verified, and the one who proves the mailbox sets a password after. An
//! expired code contests as a live one does: otherwise, once the owner's
//! sign-up code had expired, someone without the mailbox could register
//! the address again, and the owner's next resend would carry that
//! registration's password to the owner, whose verification would then
//! activate it (found by the property tests). A registration with the same
//! password (hashed like the live one: the same salt, so the same hash)
//! contests nothing. The invariants these
//! rules keep are checked as properties over sequences of requests from
//! the mailbox's owner and from someone without it
//! (`tests/it/registration_properties.rs`).

use super::codes::{MAX_FAILURES, RESEND_QUIET_MS};
pub use crate::store::{AccountState, Activation, LiveCode, RegistrationState};

/// What a registration knows of itself.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    /// This registration's password hash.
    pub hash: &'a str,
    /// The pending hash it was hashed like (its salt and parameters), if
    /// the email had a live registration when it was hashed.
    pub hashed_like: Option<&'a str>,
    pub now: i64,
    /// The last try: whatever the live registration is now, decide; never
    /// [`Plan::Rehash`] (registrations racing without end must end).
    pub last_try: bool,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// A new account with this registration's credentials, on a fresh code.
    Create { contested: bool },
    /// Hash the password again like this pending hash, then decide again.
    Rehash { like: String },
    /// A repeat of the live registration (a second click, a proxy's retry):
    /// nothing is written or sent; the code already mailed stands.
    Repeat { id: String },
    /// The unfinished sign-up takes this registration's credentials, on a
    /// fresh code.
    Replace { id: String, contested: bool },
    /// The address is somebody's: a notice is mailed, nothing of the
    /// account changes; `shadow`: its code becomes a shadow (a verified
    /// account, whose codes are nobody's), else the owner's code stays.
    Notice { shadow: bool },
}

/// The pending hash of the email's live registration (an unfinished
/// sign-up's unexpired, uncontested code with pending credentials), which a
/// new registration's password is hashed like, so that a repeat has the
/// same hash.
pub fn live_registration(state: &RegistrationState, now: i64) -> Option<&str> {
    match (&state.account, &state.live) {
        (AccountState::Unfinished { .. }, Some(c)) if !c.contested && c.expires_at > now => {
            c.pending.as_deref()
        }
        _ => None,
    }
}

/// Whether a fresh code with pending hash `hash` contests the unused one:
/// it is another registration's (of another password, or contested
/// already), expired or not.
fn contests(live: Option<&LiveCode>, hash: &str) -> bool {
    live.is_some_and(|c| c.pending.as_deref().is_some_and(|p| c.contested || p != hash))
}

/// The decision (see the module notes).
pub fn decide(state: &RegistrationState, a: Attempt<'_>) -> Plan {
    let live = state.live.as_ref();
    match &state.account {
        AccountState::None => Plan::Create {
            contested: contests(live, a.hash),
        },
        AccountState::Owned { verified, .. } => Plan::Notice { shadow: *verified },
        AccountState::Unfinished { id } => {
            if let (Some(code), Some(pending)) = (live, live_registration(state, a.now)) {
                if a.hashed_like != Some(pending) && !a.last_try {
                    return Plan::Rehash {
                        like: pending.to_string(),
                    };
                }
                if pending == a.hash
                    && code.created_at > a.now - RESEND_QUIET_MS
                    && code.failures < MAX_FAILURES
                {
                    return Plan::Repeat { id: id.clone() };
                }
            }
            Plan::Replace {
                id: id.clone(),
                contested: contests(live, a.hash),
            }
        }
    }
}

/// What proving the mailbox with `code` does to the account's password
/// (see the module notes).
pub fn activation(code: &LiveCode) -> Activation {
    match (&code.pending, code.contested) {
        (_, true) => Activation::NoPassword,
        (Some(hash), false) => Activation::Credentials {
            hash: hash.clone(),
            name: code.pending_name.clone(),
        },
        (None, false) => Activation::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::codes::CODE_TTL_MS;

    const NOW: i64 = 1_000_000;

    fn code(pending: Option<&str>, age: i64, failures: i32, contested: bool) -> LiveCode {
        LiveCode {
            pending: pending.map(str::to_string),
            pending_name: pending.map(|p| format!("name of {p}")),
            created_at: NOW - age,
            expires_at: NOW - age + CODE_TTL_MS,
            failures,
            contested,
        }
    }

    fn attempt<'a>(hash: &'a str, like: Option<&'a str>, last_try: bool) -> Attempt<'a> {
        Attempt {
            hash,
            hashed_like: like,
            now: NOW,
            last_try,
        }
    }

    fn state(account: AccountState, live: Option<LiveCode>) -> RegistrationState {
        RegistrationState { account, live }
    }

    fn unfinished() -> AccountState {
        AccountState::Unfinished { id: "u1".into() }
    }

    /// Every combination of the inputs, against the table of the module
    /// notes written out again case by case.
    #[test]
    fn exhaustive() {
        let accounts = [
            AccountState::None,
            unfinished(),
            AccountState::Owned {
                id: "o1".into(),
                verified: true,
            },
            AccountState::Owned {
                id: "o2".into(),
                verified: false,
            },
        ];
        let mut codes = vec![None];
        for pending in [None, Some("h1"), Some("h2")] {
            for age in [0, RESEND_QUIET_MS - 1, RESEND_QUIET_MS, CODE_TTL_MS] {
                for failures in [0, MAX_FAILURES - 1, MAX_FAILURES] {
                    for contested in [false, true] {
                        codes.push(Some(code(pending, age, failures, contested)));
                    }
                }
            }
        }
        for account in &accounts {
            for live in &codes {
                for like in [None, Some("h1"), Some("h2")] {
                    for last_try in [false, true] {
                        let s = state(account.clone(), live.clone());
                        let got = decide(&s, attempt("h1", like, last_try));
                        let contested = live.as_ref().is_some_and(|c| {
                            c.pending.is_some() && (c.contested || c.pending.as_deref() != Some("h1"))
                        });
                        let want = match account {
                            AccountState::None => Plan::Create { contested },
                            AccountState::Owned { verified, .. } => Plan::Notice { shadow: *verified },
                            AccountState::Unfinished { id } => {
                                let reg = live
                                    .as_ref()
                                    .filter(|c| c.pending.is_some() && !c.contested && c.expires_at > NOW);
                                match reg {
                                    Some(c) if like != c.pending.as_deref() && !last_try => Plan::Rehash {
                                        like: c.pending.clone().unwrap(),
                                    },
                                    Some(c)
                                        if c.pending.as_deref() == Some("h1")
                                            && NOW - c.created_at < RESEND_QUIET_MS
                                            && c.failures < MAX_FAILURES =>
                                    {
                                        Plan::Repeat { id: id.clone() }
                                    }
                                    _ => Plan::Replace {
                                        id: id.clone(),
                                        contested,
                                    },
                                }
                            }
                        };
                        assert_eq!(got, want, "{account:?} {live:?} like={like:?} last={last_try}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_second_password_within_a_codes_life_contests_it() {
        let s = state(unfinished(), Some(code(Some("theirs"), 10, 0, false)));
        assert_eq!(
            decide(&s, attempt("mine", Some("theirs"), false)),
            Plan::Replace {
                id: "u1".into(),
                contested: true
            }
        );
    }

    #[test]
    fn the_same_password_is_a_repeat_within_the_pause_and_a_fresh_code_after_it() {
        let young = state(unfinished(), Some(code(Some("h"), 10, 0, false)));
        assert_eq!(
            decide(&young, attempt("h", Some("h"), false)),
            Plan::Repeat { id: "u1".into() }
        );
        let old = state(unfinished(), Some(code(Some("h"), RESEND_QUIET_MS, 0, false)));
        assert_eq!(
            decide(&old, attempt("h", Some("h"), false)),
            Plan::Replace {
                id: "u1".into(),
                contested: false
            }
        );
        // A code dead of wrong tries: a fresh one, no contest.
        let dead = state(unfinished(), Some(code(Some("h"), 10, MAX_FAILURES, false)));
        assert_eq!(
            decide(&dead, attempt("h", Some("h"), false)),
            Plan::Replace {
                id: "u1".into(),
                contested: false
            }
        );
    }

    #[test]
    fn an_expired_registration_of_another_password_is_contested_too() {
        let s = state(
            unfinished(),
            Some(code(Some("theirs"), CODE_TTL_MS + 1, 0, false)),
        );
        assert_eq!(
            decide(&s, attempt("mine", None, false)),
            Plan::Replace {
                id: "u1".into(),
                contested: true
            }
        );
    }

    #[test]
    fn a_password_hashed_like_another_registration_is_hashed_again() {
        let s = state(unfinished(), Some(code(Some("newer"), 10, 0, false)));
        assert_eq!(
            decide(&s, attempt("h", Some("older"), false)),
            Plan::Rehash { like: "newer".into() }
        );
        assert_eq!(
            decide(&s, attempt("h", Some("older"), true)),
            Plan::Replace {
                id: "u1".into(),
                contested: true
            },
            "the last try decides"
        );
    }

    #[test]
    fn a_contested_code_activates_no_password_whatever_it_carries() {
        for pending in [None, Some("h")] {
            assert_eq!(activation(&code(pending, 10, 0, true)), Activation::NoPassword);
        }
    }

    #[test]
    fn an_uncontested_code_activates_the_registration_it_carries_or_keeps_the_password() {
        assert_eq!(
            activation(&code(Some("h"), 10, 0, false)),
            Activation::Credentials {
                hash: "h".into(),
                name: Some("name of h".into())
            }
        );
        assert_eq!(activation(&code(None, 10, 0, false)), Activation::Keep);
    }
}
