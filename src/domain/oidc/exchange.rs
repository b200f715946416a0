//! The token endpoint's side of the provider: the authorization code
//! exchanged for an application's session, its tokens and an id_token (RFC
//! 6749 §4.1.3, RFC 7636 §4.6, Core §3.1.3), and userinfo (Core §5.3).

use serde::Serialize;

use super::client::{ClientKind, ClientSettings};
use super::Provider;
use crate::clock::now_ms;
use crate::crypto::ct_eq;
use crate::crypto::{b64url, sha256};
use crate::domain::clients::ClientRecord;
use crate::domain::sessions::{ClientGrant, Origin};
use crate::domain::tokens::{AccessClaims, IdClaims, ACR_MFA, ACR_SINGLE};
use crate::domain::AuthError;
use crate::store::{AuthorizationCode, Redeemed};

/// What a client presents with a code at the token endpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Presented<'a> {
    pub client_id: &'a str,
    pub redirect_uri: &'a str,
    /// The S256 challenge of the verifier presented (`None`: no verifier).
    pub code_challenge: Option<&'a str>,
}

/// What a presented code is worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Spend it and start the application's session.
    Redeem,
    /// A second use by the client it was issued to: end what its first use
    /// started (RFC 6749 §4.1.2, "SHOULD revoke").
    Reused,
    /// Nothing to give and nothing to change.
    Refused,
}

/// Judges a presented code against the code stored under its hash, at
/// `now` (Unix ms). A pure decision; the store then spends the code only if
/// still unspent (`Store::redeem_authorization_code`), so that two
/// presentations at once give one session.
///
/// ```text
///   no such code ───────────────────────────────────────────────> Refused
///   issued to another client ───────────────────────────────────> Refused
///   spent, verifier missing, extra or not matching ─────────────> Refused
///   spent, with its verifier ───────────────────────────────────> Reused
///   unspent, expired ───────────────────────────────────────────> Refused
///   unspent, other redirect_uri (RFC 6749 §4.1.3) ──────────────> Refused
///   unspent, verifier missing, extra or not matching (RFC 7636) ─> Refused
///   unspent, all of them match ─────────────────────────────────> Redeem
/// ```
///
/// Only the client a spent code was issued to, with the code's PKCE
/// verifier, ends what it got: a spent code found elsewhere (a log, a
/// history) must not sign the user out, whether presented by another
/// client or as a public client, which names itself by its id alone. The
/// verifier never left the application, and with it the presenter is the
/// application or has what it had. A refused presentation leaves an
/// unspent code usable by its client.
pub(crate) fn judge(code: Option<&AuthorizationCode>, p: &Presented<'_>, now: i64) -> Verdict {
    let Some(c) = code else { return Verdict::Refused };
    if c.client_id != p.client_id {
        return Verdict::Refused;
    }
    let challenge_matches = match (c.code_challenge.as_deref(), p.code_challenge) {
        (Some(stored), Some(given)) => ct_eq(stored.as_bytes(), given.as_bytes()),
        (None, None) => true,
        _ => false,
    };
    if c.used_at.is_some() {
        return if challenge_matches {
            Verdict::Reused
        } else {
            Verdict::Refused
        };
    }
    if c.expires_at <= now || c.redirect_uri != p.redirect_uri || !challenge_matches {
        return Verdict::Refused;
    }
    Verdict::Redeem
}

/// What the token endpoint answers to a code (RFC 6749 §5.1, Core §3.1.3.3).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CodeTokens {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_token: Option<String>,
    pub scope: String,
}

impl Provider {
    /// Identifies the client at the token endpoint: a confidential one by
    /// its secret (`Clients::authenticate`, done by the caller), a public
    /// one by its id alone.
    pub async fn public_client(&self, id: &str) -> Result<ClientRecord, AuthError> {
        match self.client(id).await? {
            Some((rec, s)) if s.kind == ClientKind::Public => Ok(rec),
            _ => Err(AuthError::InvalidClient),
        }
    }

    /// The authorization code grant (RFC 6749 §4.1.3, RFC 7636 §4.6): the
    /// code, for the client it was issued to, with the redirect URI and the
    /// PKCE verifier of its request, once.
    pub async fn exchange(
        &self,
        client: &ClientRecord,
        code: &str,
        redirect_uri: Option<&str>,
        verifier: Option<&str>,
        origin: &Origin,
    ) -> Result<CodeTokens, AuthError> {
        let settings = client
            .oidc
            .as_deref()
            .and_then(ClientSettings::from_json)
            .filter(|s| s.allows("authorization_code"))
            .ok_or(AuthError::InvalidClient)?;
        if let Some(v) = verifier {
            // RFC 7636 §4.1: 43 to 128 unreserved characters.
            let ok = (43..=128).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
            if !ok {
                return Err(AuthError::BadRequest(
                    "code_verifier: 43 to 128 characters of A-Z a-z 0-9 - . _ ~".into(),
                ));
            }
        }
        if code.is_empty() || code.len() > 256 {
            return Err(AuthError::InvalidToken);
        }
        // The id_token's key before the code is spent: nothing is used up
        // or started that could not be answered.
        if !self.issuer.can_sign(settings.id_token_algorithm()) {
            return Err(AuthError::Internal(anyhow::anyhow!(
                "client {} wants id_tokens in an algorithm this provider no longer signs with \
                 (id_token_signing_algorithms)",
                client.id
            )));
        }
        // Left out, it is the client's only registered redirect URI (Core
        // §3.1.3.2 lets a provider proceed; node-oidc-provider does); a
        // client with several must say which.
        let redirect_uri = match (redirect_uri, settings.redirect_uris.as_slice()) {
            (Some(given), _) => given,
            (None, [only]) => only.as_str(),
            (None, _) => {
                return Err(AuthError::BadRequest(
                    "redirect_uri: required (the client registered several)".into(),
                ))
            }
        };
        let challenge = verifier.map(|v| b64url(&sha256(v.as_bytes())));
        let hash = sha256(code.as_bytes());
        let now = now_ms();
        let stored = self.shared.store.authorization_code(&hash).await?;
        let presented = Presented {
            client_id: &client.id,
            redirect_uri,
            code_challenge: challenge.as_deref(),
        };
        let c = match judge(stored.as_ref(), &presented, now) {
            Verdict::Redeem => stored.expect("judged redeemable"),
            Verdict::Reused => {
                return Err(self
                    .code_reused(stored.as_ref().expect("judged reused"), now)
                    .await)
            }
            Verdict::Refused => return Err(AuthError::InvalidToken),
        };
        let user = self
            .shared
            .store
            .user_by_id(&c.user_id)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        let authn = crate::domain::tokens::Authn::new(&c.amr, c.auth_time);
        let grant = ClientGrant {
            client_id: &client.id,
            scope: &c.scope,
            parent: &c.session_id,
            access_ttl: settings.access_ttl(),
            session_ttl: settings.session_ttl(),
        };
        let (mut session, refresh_token) = self.sessions.draft_for_client(grant, origin, authn.clone());
        // One commit spends the code and starts the session (or neither):
        // the browser session must still be live (the user may have signed
        // out since), the account enabled.
        let pair = match self
            .shared
            .store
            .redeem_authorization_code(&hash, &session.as_new(&user.id))
            .await?
        {
            Redeemed::Started { expires_at } => {
                session.expires_at = expires_at;
                self.sessions
                    .pair(&user.id, &user.email, &session, &client.id, refresh_token)?
            }
            Redeemed::Refused(_) => return Err(AuthError::InvalidToken),
            // Spent by another presentation since it was read (this is the
            // second use), or expired or removed meanwhile.
            Redeemed::NotSpent => return Err(self.code_reused(&c, now).await),
        };
        let scopes: Vec<&str> = c.scope.split(' ').filter(|s| !s.is_empty()).collect();
        let id_token = if scopes.contains(&"openid") {
            let iat = now / 1000;
            let exp = iat
                + settings
                    .access_ttl()
                    .unwrap_or(self.issuer.access_lifetime())
                    .as_secs() as i64;
            let access = pair.access_token.clone();
            let email = scopes.contains(&"email");
            let profile = scopes.contains(&"profile");
            Some(
                self.issuer
                    .issue_id_token(settings.id_token_algorithm(), |alg| IdClaims {
                        iss: self.issuer.issuer().to_string(),
                        sub: user.id.clone(),
                        aud: client.id.clone(),
                        exp,
                        iat,
                        auth_time: c.auth_time / 1000,
                        nonce: c.nonce.clone(),
                        acr: (if authn.is_mfa() { ACR_MFA } else { ACR_SINGLE }).to_string(),
                        amr: c
                            .amr
                            .split(' ')
                            .filter(|m| !m.is_empty())
                            .map(String::from)
                            .collect(),
                        sid: c.session_id.clone(),
                        azp: client.id.clone(),
                        at_hash: Some(crate::domain::tokens::token_hash(alg, &access)),
                        email: email.then(|| user.email.clone()),
                        email_verified: email.then_some(user.email_verified_at.is_some()),
                        name: if profile { user.name.clone() } else { None },
                    })
                    .map_err(AuthError::Internal)?,
            )
        } else {
            None
        };
        let refresh = settings.allows("refresh_token")
            && (scopes.contains(&"offline_access") || settings.refresh_without_offline_access);
        Ok(CodeTokens {
            access_token: pair.access_token,
            token_type: "Bearer",
            expires_in: pair.expires_in,
            refresh_token: refresh.then_some(pair.refresh_token),
            id_token,
            scope: c.scope,
        })
    }

    /// A spent code presented again by its client: the session of its
    /// first exchange ends (RFC 6749 §4.1.2). The error to answer.
    async fn code_reused(&self, code: &AuthorizationCode, now: i64) -> AuthError {
        match self.shared.store.end_reused_code(code, now).await {
            Ok((spent, ended)) => {
                if spent {
                    tracing::warn!(client_id = %code.client_id, "an authorization code was presented again: the session of its first use ends");
                }
                if let Some(sid) = ended {
                    self.shared.revocations.revoke(&[sid]).await;
                }
                AuthError::InvalidToken
            }
            Err(e) => e.into(),
        }
    }

    /// The claims of `GET /oauth/userinfo` (Core §5.3) for an access token
    /// an application got through this flow with `openid`.
    pub async fn userinfo(&self, claims: &AccessClaims) -> Result<serde_json::Value, AuthError> {
        let scopes: Vec<&str> = claims.scope.as_deref().unwrap_or("").split(' ').collect();
        if claims.is_client() || !scopes.contains(&"openid") {
            return Err(AuthError::InsufficientScope("openid"));
        }
        let user = self
            .shared
            .store
            .user_by_id(&claims.sub)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        let mut doc = serde_json::json!({"sub": user.id});
        if scopes.contains(&"email") {
            doc["email"] = user.email.into();
            doc["email_verified"] = user.email_verified_at.is_some().into();
        }
        if scopes.contains(&"profile") {
            if let Some(n) = user.name {
                doc["name"] = n.into();
            }
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn code() -> AuthorizationCode {
        AuthorizationCode {
            code_hash: vec![1; 32],
            client_id: "app".into(),
            user_id: "u1".into(),
            session_id: "browser".into(),
            redirect_uri: "https://app.example/cb".into(),
            code_challenge: Some("challenge".into()),
            scope: "openid".into(),
            nonce: None,
            amr: "pwd".into(),
            auth_time: NOW - 5_000,
            created_at: NOW - 1_000,
            expires_at: NOW + 59_000,
            used_at: None,
            issued_session: None,
        }
    }

    fn presented() -> Presented<'static> {
        Presented {
            client_id: "app",
            redirect_uri: "https://app.example/cb",
            code_challenge: Some("challenge"),
        }
    }

    #[test]
    fn a_fresh_code_presented_by_its_client_with_its_redirect_uri_and_verifier_is_redeemed() {
        assert_eq!(judge(Some(&code()), &presented(), NOW), Verdict::Redeem);
    }

    #[test]
    fn an_unknown_code_is_refused() {
        assert_eq!(judge(None, &presented(), NOW), Verdict::Refused);
    }

    #[test]
    fn another_clients_code_is_refused_spent_or_not() {
        let other = Presented {
            client_id: "other",
            ..presented()
        };
        assert_eq!(judge(Some(&code()), &other, NOW), Verdict::Refused);
        let spent = AuthorizationCode {
            used_at: Some(NOW - 10),
            ..code()
        };
        assert_eq!(judge(Some(&spent), &other, NOW), Verdict::Refused);
    }

    #[test]
    fn a_spent_code_presented_again_by_its_client_with_its_verifier_is_a_reuse() {
        let spent = AuthorizationCode {
            used_at: Some(NOW - 10),
            expires_at: NOW - 1,
            ..code()
        };
        assert_eq!(judge(Some(&spent), &presented(), NOW), Verdict::Reused);
        let elsewhere = Presented {
            redirect_uri: "https://elsewhere.example/",
            ..presented()
        };
        assert_eq!(judge(Some(&spent), &elsewhere, NOW), Verdict::Reused);
    }

    #[test]
    fn a_spent_code_without_its_verifier_ends_nothing() {
        let spent = AuthorizationCode {
            used_at: Some(NOW - 10),
            ..code()
        };
        for challenge in [None, Some("challengf")] {
            let found = Presented {
                code_challenge: challenge,
                ..presented()
            };
            assert_eq!(
                judge(Some(&spent), &found, NOW),
                Verdict::Refused,
                "{challenge:?}"
            );
        }
    }

    #[test]
    fn a_code_is_refused_from_the_moment_it_expires() {
        let c = code();
        assert_eq!(judge(Some(&c), &presented(), c.expires_at - 1), Verdict::Redeem);
        assert_eq!(judge(Some(&c), &presented(), c.expires_at), Verdict::Refused);
    }

    #[test]
    fn another_redirect_uri_is_refused_even_one_that_differs_only_in_case_or_a_slash() {
        for uri in [
            "https://app.example/cb/",
            "https://APP.example/cb",
            "https://app.example/cb?x=1",
            "",
        ] {
            let p = Presented {
                redirect_uri: uri,
                ..presented()
            };
            assert_eq!(judge(Some(&code()), &p, NOW), Verdict::Refused, "{uri}");
        }
    }

    #[test]
    fn a_verifier_that_is_missing_wrong_or_not_asked_for_is_refused() {
        let missing = Presented {
            code_challenge: None,
            ..presented()
        };
        assert_eq!(judge(Some(&code()), &missing, NOW), Verdict::Refused);
        let wrong = Presented {
            code_challenge: Some("challengf"),
            ..presented()
        };
        assert_eq!(judge(Some(&code()), &wrong, NOW), Verdict::Refused);
        let without = AuthorizationCode {
            code_challenge: None,
            ..code()
        };
        assert_eq!(judge(Some(&without), &presented(), NOW), Verdict::Refused);
        assert_eq!(judge(Some(&without), &missing, NOW), Verdict::Redeem);
    }
}
