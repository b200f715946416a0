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
//!
//! And what a refresh token carries ([`RefreshTokens`]): its session's id,
//! under a tag only this service can make, so that the session's rate limit
//! is checked before the database is asked anything, and the lookup and the
//! rotation can be one statement.

use crate::crypto::{b64url, b64url_decode, random_bytes, MacKey};

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

/// The form of the refresh tokens this service issues:
///
/// ```text
///   base64url( session id (16 bytes, a UUID) | random (32 bytes) | tag (16 bytes) )   86 characters
///   tag = first 16 bytes of HMAC-SHA256(refresh-token key, session id, client, random)
/// ```
/// The random part is the secret, 256 bits as before; the database keeps the
/// SHA-256 of the whole token and remains the authority on whether it
/// refreshes. The tag only vouches that this service wrote the session id
/// for that client (the OAuth client of the session, or none for a
/// first-party one), so that neither a token made up by someone who knows a
/// session id (an access token's `sid`) nor a real token presented where
/// its client does not refresh (an OAuth client's at `/auth/refresh`) can
/// spend that session's refresh limit: both are refused as unknown tokens
/// are. Every session id is a UUID; no token of another form refreshes.
#[derive(Clone)]
pub struct RefreshTokens {
    key: MacKey,
}

const SID: usize = 16;
const RANDOM: usize = 32;
const TAG: usize = 16;

impl RefreshTokens {
    pub fn new(key: MacKey) -> Self {
        RefreshTokens { key }
    }

    fn tag(&self, sid: &[u8], client_id: Option<&str>, random: &[u8]) -> [u8; TAG] {
        let client = client_id.map_or(&b""[..], str::as_bytes);
        let mac = self
            .key
            .mac(&[sid, &[u8::from(client_id.is_some())], client, random]);
        let mut tag = [0u8; TAG];
        tag.copy_from_slice(&mac[..TAG]);
        tag
    }

    /// Whether `tag` is right under the key of any master secret held (a
    /// token minted before a rotation stays good).
    fn tag_checks(&self, sid: &[u8], client_id: Option<&str>, random: &[u8], tag: &[u8]) -> bool {
        let client = client_id.map_or(&b""[..], str::as_bytes);
        self.key
            .verify(&[sid, &[u8::from(client_id.is_some())], client, random], tag)
    }

    /// A new refresh token of session `session_id` of client `client_id`.
    pub fn mint(&self, session_id: &uuid::Uuid, client_id: Option<&str>) -> String {
        let sid = *session_id.as_bytes();
        let random = random_bytes::<RANDOM>();
        let mut raw = [0u8; SID + RANDOM + TAG];
        raw[..SID].copy_from_slice(&sid);
        raw[SID..SID + RANDOM].copy_from_slice(&random);
        raw[SID + RANDOM..].copy_from_slice(&self.tag(&sid, client_id, &random));
        b64url(&raw)
    }

    /// The session a token of this service's form names, if its tag checks
    /// out for `client_id`; `None` for any other string.
    pub fn session_of(&self, token: &str, client_id: Option<&str>) -> Option<uuid::Uuid> {
        if token.len() != 86 {
            return None;
        }
        let raw = b64url_decode(token)?;
        if raw.len() != SID + RANDOM + TAG {
            return None;
        }
        let (sid, rest) = raw.split_at(SID);
        let (random, tag) = rest.split_at(RANDOM);
        if !self.tag_checks(sid, client_id, random, tag) {
            return None;
        }
        uuid::Uuid::from_slice(sid).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::random_token;

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

    fn tokens() -> RefreshTokens {
        RefreshTokens::new(MacKey::new(b"a test key of thirty-two bytes!!"))
    }

    #[test]
    fn a_token_names_its_session_and_nothing_else_passes() {
        let t = tokens();
        let sid = uuid::Uuid::new_v4();
        let token = t.mint(&sid, None);
        assert_eq!(token.len(), 86);
        assert_eq!(t.session_of(&token, None), Some(sid));
        assert_ne!(t.mint(&sid, None), token, "the random part differs");
        // Another key, another client, any changed byte, a random token,
        // garbage: no session.
        let other = RefreshTokens::new(MacKey::new(b"another key of thirty-two bytes!"));
        assert_eq!(other.session_of(&token, None), None);
        assert_eq!(t.session_of(&token, Some("")), None);
        assert_eq!(t.session_of(&token, Some("app")), None);
        let of_app = t.mint(&sid, Some("app"));
        assert_eq!(t.session_of(&of_app, Some("app")), Some(sid));
        assert_eq!(t.session_of(&of_app, None), None);
        assert_eq!(t.session_of(&of_app, Some("ap")), None);
        let raw = b64url_decode(&token).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 1;
            assert_eq!(t.session_of(&b64url(&bad), None), None, "byte {i} changed");
        }
        for s in [random_token(), String::new(), "x".repeat(86), format!("{token}=")] {
            assert_eq!(t.session_of(&s, None), None, "{s}");
        }
    }
}
