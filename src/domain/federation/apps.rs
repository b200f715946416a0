//! The JSON pair for applications with their own pages
//! (docs/federation.md): the browser leaves with the application's
//! `redirect_to` (one of `upstream_return_urls`) and PKCE challenge, comes
//! back there with a code, and the application redeems the code with its
//! verifier for the sign-in, answered as a password login is.
//!
//! ```text
//!  app's page ──> GET /auth/upstream/{name}?redirect_to&code_challenge ──> upstream
//!  upstream ──> callback ──> the rule (mod.rs) ──> a code: hashed, 60 s, bound
//!                                                  to the challenge (store)
//!  redirect_to?code&state ──> app ──> POST /auth/upstream/token (code, verifier)
//!                                 <── tokens, or MFA_REQUIRED
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{upstream, Departure, Federation, FederationError};
use crate::crypto::{b64url, ct_eq, random_token, sha256};
use crate::domain::sessions::{Origin, TokenPair};
use crate::domain::AuthError;
use crate::store::{ChallengeRecord, UpstreamRecord, UserRecord};

/// How long an application's code lives (RFC 6749 §4.1.2: short).
pub const APP_CODE_TTL: Duration = Duration::from_secs(60);
/// The purpose of an application's code among the store's challenges.
const APP_CODE: &str = "upstream_code";

/// Where a journey of an application with its own pages returns, and the
/// PKCE challenge its code is bound to.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AppReturn {
    pub redirect_to: String,
    challenge: String,
    /// The application's own `state`, given back as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// Where applications with their own pages may be sent back (setting
/// `upstream_return_urls`: exact URLs, comma-separated).
#[derive(Clone, Debug, Default)]
pub struct FederationSettings {
    pub return_urls: Vec<String>,
}

impl FederationSettings {
    pub fn read(
        src: &impl crate::settings::Source,
    ) -> Result<FederationSettings, crate::settings::ConfigError> {
        Ok(FederationSettings {
            return_urls: src.list("upstream_return_urls", |u| {
                let url = url::Url::parse(u).map_err(|e| format!("{u:?} is not a URL: {e}"))?;
                // A code travels in it: https, or http to this machine only.
                if url.fragment().is_some() || !upstream::secure_enough(&url) {
                    return Err(format!(
                        "{u:?}: an https URL without a fragment (http only on a loopback address)"
                    ));
                }
                Ok(u.to_string())
            })?,
        })
    }
}

impl Federation {
    /// Whether an application may be sent back to `redirect_to` (one of
    /// `upstream_return_urls`, exactly).
    pub fn may_return_to(&self, redirect_to: &str) -> bool {
        self.settings.return_urls.iter().any(|u| u == redirect_to)
    }

    /// Leaves for upstream `name` for an application with its own pages:
    /// it comes back to `redirect_to` (one of `upstream_return_urls`) with
    /// a code that only the holder of the PKCE verifier of `challenge`
    /// (S256) redeems, within [`APP_CODE_TTL`].
    pub async fn depart_for_app(
        &self,
        name: &str,
        redirect_to: &str,
        challenge: &str,
        state: Option<&str>,
        origin: &Origin,
        now: i64,
    ) -> Result<Departure, FederationError> {
        if state.is_some_and(|s| s.len() > 512) {
            return Err(AuthError::BadRequest("state: at most 512 bytes".into()).into());
        }
        if !self.may_return_to(redirect_to) {
            return Err(AuthError::BadRequest("redirect_to: not one of upstream_return_urls".into()).into());
        }
        let challenge_ok = challenge.len() == 43
            && challenge
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !challenge_ok {
            return Err(AuthError::BadRequest(
                "code_challenge: the S256 challenge (43 base64url characters)".into(),
            )
            .into());
        }
        let app = AppReturn {
            redirect_to: redirect_to.to_string(),
            challenge: challenge.to_string(),
            state: state.map(str::to_string),
        };
        self.leave(name, "", None, Some(app), origin, now).await
    }

    /// An application's code, with the PKCE verifier of its challenge: the
    /// sign-in it stands for, as `POST /auth/login` answers (a session, or
    /// the step up to the account's second factor). Single-use; a wrong
    /// verifier spends it too.
    pub async fn redeem(&self, code: &str, verifier: &str, origin: &Origin) -> Result<TokenPair, AuthError> {
        let store = &self.shared.store;
        let hash = sha256(code.as_bytes());
        let invalid = || AuthError::BadRequest("code: unknown, spent, expired or not this verifier's".into());
        let now = crate::clock::now_ms();
        let Some(c) = store.challenge(&hash, APP_CODE, now).await? else {
            return Err(invalid());
        };
        if !store.consume_challenge(&hash).await? {
            return Err(invalid());
        }
        let challenge = c.state.unwrap_or_default();
        if !ct_eq(
            b64url(&sha256(verifier.as_bytes())).as_bytes(),
            challenge.as_bytes(),
        ) {
            return Err(invalid());
        }
        let user = match c.user_id {
            Some(id) => store.user_by_id(&id).await?,
            None => None,
        }
        .ok_or_else(invalid)?;
        let mfa = c.amr.split(' ').any(|m| m == "mfa");
        self.login.upstream(origin, &user, &c.amr, mfa).await
    }

    /// The code of an application's sign-in of `user` through `up` (the
    /// rule allowed it; `amr`: the session's, with `mfa` when the upstream
    /// stands for the second factor):
    /// kept for [`APP_CODE_TTL`] in the store, hashed, bound to the
    /// application's challenge; the session starts when it is redeemed.
    pub(super) async fn issue_app_code(
        &self,
        app: &AppReturn,
        up: &UpstreamRecord,
        user: &UserRecord,
        amr: &str,
        origin: &Origin,
        now: i64,
    ) -> Result<String, AuthError> {
        let code = random_token();
        let record = ChallengeRecord {
            token_hash: sha256(code.as_bytes()).to_vec(),
            purpose: APP_CODE.into(),
            user_id: Some(user.id.clone()),
            amr: amr.into(),
            client_id: None,
            user_agent: origin.user_agent.clone(),
            ip: Some(origin.ip.to_string()),
            state: Some(app.challenge.clone()),
            detail: Some(up.name.clone()),
            failures: 0,
            created_at: now,
            expires_at: now + APP_CODE_TTL.as_millis() as i64,
        };
        self.shared.store.create_challenge(&record).await?;
        Ok(code)
    }
}
