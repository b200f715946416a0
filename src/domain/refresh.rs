//! What presenting a refresh token means, as a pure function (RFC 9700 §4.14).
//!
//! ```text
//!   token T_n (current) --present--> ROTATE: T_n marked rotated at t, T_n+1 issued
//!   token T_n (rotated at t) --present at now <= t + grace--> same T_n+1 again
//!   token T_n (rotated at t) --present at now >  t + grace--> REUSE: revoke the family
//!   session revoked or expired --present--> INVALID
//! ```
//! The grace window absorbs client retries and several tabs refreshing at once;
//! outside it, a second use means the token leaked, and the whole session dies.

#[derive(Clone, Copy, Debug)]
pub struct RefreshState {
    pub session_revoked: bool,
    pub session_expires_at: i64,
    pub rotated_at: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefreshDecision {
    Rotate,
    ReturnSuccessor,
    Reuse,
    Invalid,
}

impl RefreshDecision {
    /// Whether the token still refreshes (what introspection calls active).
    pub fn is_live(self) -> bool {
        matches!(self, RefreshDecision::Rotate | RefreshDecision::ReturnSuccessor)
    }
}

impl From<&crate::store::RefreshRecord> for RefreshState {
    fn from(r: &crate::store::RefreshRecord) -> RefreshState {
        RefreshState {
            session_revoked: r.session_revoked_at.is_some(),
            session_expires_at: r.session_expires_at,
            rotated_at: r.rotated_at,
        }
    }
}

pub fn decide(s: RefreshState, now: i64, grace_ms: i64) -> RefreshDecision {
    if s.session_revoked || now >= s.session_expires_at {
        return RefreshDecision::Invalid;
    }
    match s.rotated_at {
        None => RefreshDecision::Rotate,
        Some(t) if now - t <= grace_ms => RefreshDecision::ReturnSuccessor,
        Some(_) => RefreshDecision::Reuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustive() {
        let grace = 10_000;
        let exp = 1_000_000;
        for revoked in [false, true] {
            for now in [0, 500_000, exp - 1, exp, exp + 1] {
                for rotated in [
                    None,
                    Some(now - grace - 1),
                    Some(now - grace),
                    Some(now),
                    Some(now - 1),
                ] {
                    let s = RefreshState {
                        session_revoked: revoked,
                        session_expires_at: exp,
                        rotated_at: rotated,
                    };
                    let want = if revoked || now >= exp {
                        RefreshDecision::Invalid
                    } else {
                        match rotated {
                            None => RefreshDecision::Rotate,
                            Some(t) if now - t <= grace => RefreshDecision::ReturnSuccessor,
                            Some(_) => RefreshDecision::Reuse,
                        }
                    };
                    assert_eq!(decide(s, now, grace), want, "{s:?} now={now}");
                }
            }
        }
    }

    #[test]
    fn zero_grace_makes_any_second_use_reuse() {
        let s = RefreshState {
            session_revoked: false,
            session_expires_at: 10,
            rotated_at: Some(5),
        };
        assert_eq!(decide(s, 5, 0), RefreshDecision::ReturnSuccessor);
        assert_eq!(decide(s, 6, 0), RefreshDecision::Reuse);
    }
}
