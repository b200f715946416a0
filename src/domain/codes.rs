//! The rules of one-time codes, as a pure function of the stored state, the
//! comparison result and `now`.
//!
//! ```text
//!            issue (new code replaces the old one)
//!                 |
//!                 v
//!   +-------->  LIVE  --correct-->  USED (single use) --- judged as a decoy:
//!   | wrong     |  |                                    every guess wrong,
//!   +-----------+  +--10 min-->  EXPIRED                 counted, 5th: DEAD
//!   (failures < 5)  \
//!                    +--5th wrong--> DEAD (every later try: TOO_MANY_ATTEMPTS)
//! ```
//! EXPIRED and a missing code answer `INVALID_OTP`, like a wrong code, so a
//! caller learns nothing about which case it hit. A USED code is judged
//! as the decoy of an unknown email is (a live code nothing matches): each
//! guess is wrong and counted, and the fifth kills it. Otherwise, in the
//! minute after an account verified or reset (when a resend leaves the used
//! code in place), wrong codes for its email would answer `INVALID_OTP` for
//! ever where an unknown email's answer `TOO_MANY_ATTEMPTS` after five.

/// A code lives 10 minutes.
pub const CODE_TTL_MS: i64 = 10 * 60 * 1000;
/// Wrong tries a code survives; the 5th kills it.
pub const MAX_FAILURES: i32 = 5;
/// At most one code email per account and purpose per minute from resend.
pub const RESEND_QUIET_MS: i64 = 60 * 1000;

#[derive(Clone, Copy, Debug)]
pub struct CodeState {
    pub expires_at: i64,
    pub failed_attempts: i32,
    pub consumed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeVerdict {
    /// The code is right and usable: consume it.
    Accept,
    /// The code is live (or used, and judged as a decoy) but the guess is
    /// wrong: count a failure, answer INVALID_OTP.
    Wrong,
    /// No usable code (missing, expired): INVALID_OTP, nothing to record.
    Invalid,
    /// Too many wrong tries: the code is dead, TOO_MANY_ATTEMPTS.
    Dead,
}

pub fn judge(state: Option<CodeState>, guess_matches: bool, now: i64) -> CodeVerdict {
    let Some(s) = state else {
        return CodeVerdict::Invalid;
    };
    if s.failed_attempts >= MAX_FAILURES {
        return CodeVerdict::Dead;
    }
    if now >= s.expires_at {
        return CodeVerdict::Invalid;
    }
    if guess_matches && !s.consumed {
        CodeVerdict::Accept
    } else {
        CodeVerdict::Wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustive() {
        let exp = 1_000;
        assert_eq!(judge(None, true, 0), CodeVerdict::Invalid);
        assert_eq!(judge(None, false, 0), CodeVerdict::Invalid);
        for consumed in [false, true] {
            for failed in 0..=MAX_FAILURES + 1 {
                for now in [0, exp - 1, exp, exp + 1] {
                    for matches in [false, true] {
                        let s = CodeState {
                            expires_at: exp,
                            failed_attempts: failed,
                            consumed,
                        };
                        let want = if failed >= MAX_FAILURES {
                            CodeVerdict::Dead
                        } else if now >= exp {
                            CodeVerdict::Invalid
                        } else if matches && !consumed {
                            CodeVerdict::Accept
                        } else {
                            CodeVerdict::Wrong
                        };
                        assert_eq!(
                            judge(Some(s), matches, now),
                            want,
                            "{s:?} now={now} matches={matches}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn five_wrong_tries_kill_the_code() {
        let mut s = CodeState {
            expires_at: CODE_TTL_MS,
            failed_attempts: 0,
            consumed: false,
        };
        for _ in 0..MAX_FAILURES {
            assert_eq!(judge(Some(s), false, 1), CodeVerdict::Wrong);
            s.failed_attempts += 1;
        }
        // Even the right code is refused now.
        assert_eq!(judge(Some(s), true, 1), CodeVerdict::Dead);
    }

    #[test]
    fn a_used_code_is_judged_as_a_decoy() {
        let mut s = CodeState {
            expires_at: CODE_TTL_MS,
            failed_attempts: 0,
            consumed: true,
        };
        // Its own digits again are as wrong as any others.
        assert_eq!(judge(Some(s), true, 1), CodeVerdict::Wrong);
        for _ in 0..MAX_FAILURES {
            assert_eq!(judge(Some(s), false, 1), CodeVerdict::Wrong);
            s.failed_attempts += 1;
        }
        assert_eq!(judge(Some(s), false, 1), CodeVerdict::Dead);
    }
}
