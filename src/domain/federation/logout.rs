//! An upstream's back-channel logout (OpenID Connect Back-Channel Logout
//! 1.0): the upstream posts a logout token when a person signs out there,
//! and latchkey ends the sessions that began with a sign-in through it.
//! The token is judged as §2.6 of that specification tells a relying
//! party to: signed by a key of the upstream's JWKS (`id_token`'s
//! signature check), `iss` the upstream's, `aud` this client, `iat`
//! present and recent, not expired if it says when, the back-channel
//! logout event in `events`, `sub` or `sid`, and no `nonce`.
//!
//! [`check`] is a pure function of the claims and `now`, tested below;
//! [`Federation::upstream_logout`] the service around it.
//!
//! What it ends: every live session of the account the token's `sub` is
//! linked to that began with a sign-in through an upstream (`amr` `fed`),
//! the sessions of the applications signed in from it included. A token
//! with a `sid` only ends nothing (latchkey keeps no upstream session
//! ids), and neither does one whose `sub` is linked to no account; both
//! are answered as done (§2.8: the upstream has nothing to retry).

use serde_json::Value;

use super::id_token::{self, Invalid, LEEWAY_SECS};
use super::{Federation, FederationError, Protocol};

/// The event a logout token must carry (§2.4).
pub const EVENT: &str = "http://schemas.openid.net/event/backchannel-logout";
/// A logout token issued longer ago than this is refused (§2.6 lets a
/// relying party refuse old ones; an upstream sends them at once).
pub const MAX_AGE_SECS: i64 = 600;

/// Whom a logout token signs out.
#[derive(Debug, PartialEq, Eq)]
pub struct LoggedOut {
    pub subject: Option<String>,
    pub session: Option<String>,
    /// Its `jti`: a token is taken once.
    pub id: String,
}

/// The claims of a logout token whose signature checked out.
pub fn check(c: &Value, issuer: &str, client_id: &str, now: i64) -> Result<LoggedOut, Invalid> {
    let c = c.as_object().ok_or(Invalid::Malformed)?;
    if c.get("iss").and_then(Value::as_str) != Some(issuer) {
        return Err(Invalid::Issuer);
    }
    let audience_ok = match c.get("aud") {
        Some(Value::String(a)) => a == client_id,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(client_id)),
        _ => false,
    };
    if !audience_ok {
        return Err(Invalid::Audience);
    }
    match c.get("iat").and_then(Value::as_i64) {
        Some(iat) if iat <= now.saturating_add(LEEWAY_SECS) && iat >= now.saturating_sub(MAX_AGE_SECS) => {}
        _ => return Err(Invalid::IssuedAt),
    }
    if let Some(exp) = c.get("exp") {
        let live = exp
            .as_i64()
            .is_some_and(|exp| exp.saturating_add(LEEWAY_SECS) > now);
        if !live {
            return Err(Invalid::Expired);
        }
    }
    let event = c.get("events").and_then(|e| e.get(EVENT));
    if !event.is_some_and(Value::is_object) || c.contains_key("nonce") {
        return Err(Invalid::NotLogout);
    }
    let text = |k: &str| {
        c.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= 255)
            .map(str::to_string)
    };
    let out = LoggedOut {
        subject: text("sub"),
        session: text("sid"),
        id: text("jti").ok_or(Invalid::NotLogout)?,
    };
    if out.subject.is_none() && out.session.is_none() {
        return Err(Invalid::NoSubject);
    }
    Ok(out)
}

impl Federation {
    /// The back-channel logout of upstream `name` with `logout_token`:
    /// the sessions ended (their number).
    pub async fn upstream_logout(
        &self,
        name: &str,
        logout_token: &str,
        origin: &crate::domain::sessions::Origin,
        now: i64,
    ) -> Result<usize, FederationError> {
        // Nothing is fetched for what is not even a JWS, and no client
        // address makes latchkey call upstreams without limit.
        jsonwebtoken::decode_header(logout_token)
            .map_err(|_| FederationError::IdToken(Invalid::Malformed))?;
        self.login.limit(origin).await?;
        let up = self.upstream(name).await?;
        let (protocol, d, _) = self.endpoints(&up).await?;
        if protocol != Protocol::Oidc {
            return Err(FederationError::UnknownUpstream);
        }
        let mut claims = id_token::signed_claims(logout_token, &*self.http.keys(&d.jwks_uri, false).await?);
        if claims == Err(Invalid::UnknownKey) {
            claims = id_token::signed_claims(logout_token, &*self.http.keys(&d.jwks_uri, true).await?);
        }
        let claims = claims.map_err(FederationError::IdToken)?;
        let out = check(&claims, &up.issuer, &up.client_id, now / 1000).map_err(FederationError::IdToken)?;
        // Each token once (§2.6 lets a relying party refuse a `jti` seen
        // before): a captured one replayed later would end the sessions
        // started since. Kept as long as a token is young enough to pass.
        let store = &self.shared.store;
        let seen = crate::crypto::sha256(format!("{}\n{}", up.issuer, out.id).as_bytes());
        let keep_until = now + (MAX_AGE_SECS + 2 * LEEWAY_SECS) * 1000;
        if !store
            .claim_challenge(&seen, "upstream_logout", now, keep_until)
            .await?
        {
            return Err(FederationError::IdToken(Invalid::Replayed));
        }
        let Some(subject) = out.subject else {
            return Ok(0);
        };
        let Some(identity) = store.upstream_identity(&up.issuer, &subject).await? else {
            return Ok(0);
        };
        let ended = store.revoke_federated_sessions(&identity.user_id, now).await?;
        self.shared.revocations.revoke(&ended).await;
        Ok(ended.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn token() -> Value {
        json!({"iss": "https://up.example", "aud": "latchkey", "iat": NOW - 2, "jti": "j-1",
               "sub": "u-1", "sid": "s-1", "events": {EVENT: {}}})
    }

    fn with(change: Value) -> Value {
        let mut c = token();
        for (k, v) in change.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    }

    fn judged(c: Value) -> Result<LoggedOut, Invalid> {
        check(&c, "https://up.example", "latchkey", NOW)
    }

    #[test]
    fn a_logout_token_names_the_subject_and_the_session_it_ends() {
        let out = judged(token()).unwrap();
        assert_eq!(out.subject.as_deref(), Some("u-1"));
        assert_eq!(out.session.as_deref(), Some("s-1"));
        assert!(judged(with(json!({"sid": null}))).is_ok());
        assert!(judged(with(json!({"sub": null}))).is_ok());
        assert!(judged(with(json!({"aud": ["other", "latchkey"], "exp": NOW + 60}))).is_ok());
    }

    #[test]
    fn a_logout_token_of_another_issuer_or_client_is_refused() {
        assert_eq!(
            judged(with(json!({"iss": "https://evil.example"}))),
            Err(Invalid::Issuer)
        );
        assert_eq!(judged(with(json!({"aud": "other"}))), Err(Invalid::Audience));
        assert_eq!(judged(with(json!({"aud": null}))), Err(Invalid::Audience));
    }

    #[test]
    fn an_old_future_or_expired_logout_token_is_refused() {
        assert_eq!(judged(with(json!({"iat": null}))), Err(Invalid::IssuedAt));
        assert_eq!(judged(with(json!({"iat": NOW + 3_600}))), Err(Invalid::IssuedAt));
        assert_eq!(
            judged(with(json!({"iat": NOW - MAX_AGE_SECS - 1}))),
            Err(Invalid::IssuedAt)
        );
        assert_eq!(judged(with(json!({"exp": NOW - 3_600}))), Err(Invalid::Expired));
        assert_eq!(judged(with(json!({"exp": "soon"}))), Err(Invalid::Expired));
    }

    #[test]
    fn an_id_token_or_a_token_without_the_logout_event_is_no_logout_token() {
        assert_eq!(judged(with(json!({"events": null}))), Err(Invalid::NotLogout));
        assert_eq!(
            judged(with(json!({"events": {"other": {}}}))),
            Err(Invalid::NotLogout)
        );
        assert_eq!(
            judged(with(json!({"events": {EVENT: "yes"}}))),
            Err(Invalid::NotLogout)
        );
        assert_eq!(judged(with(json!({"nonce": "n-1"}))), Err(Invalid::NotLogout));
    }

    #[test]
    fn a_logout_token_without_its_id_is_refused() {
        assert_eq!(judged(with(json!({"jti": null}))), Err(Invalid::NotLogout));
        assert_eq!(judged(with(json!({"jti": ""}))), Err(Invalid::NotLogout));
    }

    #[test]
    fn a_logout_token_that_names_nobody_is_refused() {
        assert_eq!(
            judged(with(json!({"sub": null, "sid": null}))),
            Err(Invalid::NoSubject)
        );
        assert_eq!(
            judged(with(json!({"sub": "", "sid": null}))),
            Err(Invalid::NoSubject)
        );
        assert_eq!(judged(json!("a string")), Err(Invalid::Malformed));
    }
}
