//! The token endpoint's side of the provider: the authorization code
//! exchanged for an application's session, its tokens and an id_token (RFC
//! 6749 §4.1.3, RFC 7636 §4.6, Core §3.1.3), and userinfo (Core §5.3).

use serde::Serialize;

use super::client::{ClientKind, ClientSettings};
use super::Provider;
use crate::clock::now_ms;
use crate::crypto::{b64url, sha256};
use crate::domain::clients::ClientRecord;
use crate::domain::sessions::{ClientGrant, Origin, Started};
use crate::domain::tokens::{AccessClaims, IdClaims, ACR_MFA, ACR_SINGLE};
use crate::domain::AuthError;
use crate::store::CodeUse;

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
        redirect_uri: &str,
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
        let challenge = verifier.map(|v| b64url(&sha256(v.as_bytes())));
        let hash = sha256(code.as_bytes());
        let now = now_ms();
        let spent = self
            .shared
            .store
            .spend_authorization_code(&hash, &client.id, redirect_uri, challenge.as_deref(), now)
            .await?;
        let c = match spent {
            CodeUse::Spent(c) => c,
            CodeUse::Reused { ended, .. } => {
                tracing::warn!(client_id = %client.id, "an authorization code was presented again: the session of its first use ended");
                if let Some(sid) = ended {
                    self.shared.revocations.revoke(&[sid]).await;
                }
                return Err(AuthError::InvalidToken);
            }
            CodeUse::Refused => return Err(AuthError::InvalidToken),
        };
        // The user may have signed out (or been disabled) since.
        if !self.shared.store.session_is_live(&c.session_id, now).await? {
            return Err(AuthError::InvalidToken);
        }
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
        let (pair, session_id) = match self
            .sessions
            .start_for_client(&user, grant, origin, authn.clone())
            .await?
        {
            Started::Pair(pair, sid) => (pair, sid),
            Started::Disabled | Started::FactorRequired(_) => return Err(AuthError::InvalidToken),
        };
        self.shared.store.set_code_session(&hash, &session_id).await?;
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
