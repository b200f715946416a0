//! OAuth clients: confidential clients with a generated 256-bit secret, stored
//! as a SHA-256 digest (a slow hash adds nothing for a random 256-bit secret).

use std::sync::Arc;

use serde::Serialize;

use super::oidc::client::ClientSettings;
use super::oidc::origins::ClientOrigins;
use super::sessions::FIRST_PARTY_CLIENT;
use super::tokens::{client_sid, Issuer};
use super::AuthError;
use crate::cache::Revocations;
use crate::clock::now_ms;
use crate::crypto::{ct_eq, random_token, sha256};
pub use crate::store::ClientRecord;
use crate::store::Store;

/// The scope of the admin API (`/admin/*`).
pub const ADMIN_SCOPE: &str = "latchkey:admin";

/// Whether `s` is a scope token (RFC 6749 §3.3, narrowed to
/// `A-Z a-z 0-9 : . _ -`, at most 64 characters).
fn valid_scope(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":._-".contains(&b))
}

/// The scope a client gets in the client_credentials grant: what it asked
/// for (`requested`, space-separated) if the client may have all of it, or
/// everything it may have when it asked for nothing. `None`: it asked for a
/// scope it may not have (`invalid_scope`), or it may have none.
pub fn granted_scope(client: &ClientRecord, requested: Option<&str>) -> Option<String> {
    let allowed: Vec<&str> = client.scopes.split(' ').filter(|s| !s.is_empty()).collect();
    let wanted: Vec<&str> = match requested {
        Some(r) => r.split(' ').filter(|s| !s.is_empty()).collect(),
        None => allowed.clone(),
    };
    if wanted.is_empty() || !wanted.iter().all(|w| allowed.contains(w)) {
        return None;
    }
    let mut granted: Vec<&str> = Vec::new();
    for w in wanted {
        if !granted.contains(&w) {
            granted.push(w);
        }
    }
    Some(granted.join(" "))
}

/// The answer to the client_credentials grant: no refresh token (RFC 6749 §4.4.3).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClientToken {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
    pub scope: String,
}

/// The OAuth clients service: their credentials, scopes and own tokens,
/// and (for the command line) adding and removing them.
pub struct Clients {
    store: Store,
    tokens: Arc<Issuer>,
    revocations: Arc<Revocations>,
    /// Whether back-channel logout URIs may be at non-public addresses
    /// (the webhooks' rule: `webhook_allow_private_addresses`).
    allow_private: bool,
    /// The origins clients registered for CORS, forgotten at each change.
    origins: Arc<ClientOrigins>,
}

impl Clients {
    pub fn new(
        store: Store,
        tokens: Arc<Issuer>,
        revocations: Arc<Revocations>,
        allow_private: bool,
        origins: Arc<ClientOrigins>,
    ) -> Clients {
        Clients {
            store,
            tokens,
            revocations,
            allow_private,
            origins,
        }
    }

    /// Checks a client's credentials. Unknown ids cost the same comparison.
    pub async fn authenticate(&self, id: &str, secret: &str) -> Result<ClientRecord, AuthError> {
        let rec = self.store.client(id).await?;
        let presented = sha256(secret.as_bytes());
        match rec {
            Some(rec) if ct_eq(&rec.secret_hash, &presented) => Ok(rec),
            Some(_) => Err(AuthError::InvalidClient),
            None => {
                let _ = ct_eq(&[0u8; 32], &presented);
                Err(AuthError::InvalidClient)
            }
        }
    }

    /// Whether client `id` still exists (`None`: removed) and may still have
    /// `scope`: checked on every admin call, so that removing a client or
    /// its scope takes effect at once, not when its tokens expire.
    pub async fn may(&self, id: &str, scope: &str) -> Result<Option<bool>, AuthError> {
        Ok(self
            .store
            .client(id)
            .await?
            .map(|c| c.scopes.split(' ').any(|s| s == scope)))
    }

    /// A client's own access token (the client_credentials grant).
    pub fn token(&self, client: &ClientRecord, requested: Option<&str>) -> Result<ClientToken, AuthError> {
        let scope = granted_scope(client, requested).ok_or(AuthError::InvalidScope)?;
        let access_token = self
            .tokens
            .issue_for_client(&client.id, client.created_at, &scope)?;
        Ok(ClientToken {
            access_token,
            token_type: "Bearer",
            expires_in: self.tokens.access_ttl().as_secs(),
            scope,
        })
    }

    /// Removes a client, ends the sessions it holds for users and revokes its
    /// own tokens, on every instance within the revocations' usual second (by
    /// Redis at once, and through the database's `revoked_sids` for instances
    /// that cannot hear this process). `false`: no such client.
    pub async fn remove(&self, id: &str) -> Result<bool, AuthError> {
        let Some(client) = self.store.client(id).await? else {
            return Ok(false);
        };
        let sid = client_sid(id, client.created_at);
        let removed = self
            .store
            .remove_client(id, client.created_at, &sid, now_ms())
            .await?;
        self.origins.forget();
        match removed {
            Some(sids) => {
                self.revocations.revoke(&sids).await;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Every client, by id.
    pub async fn list(&self) -> Result<Vec<ClientRecord>, AuthError> {
        Ok(self.store.clients().await?)
    }

    /// One client.
    pub async fn get(&self, id: &str) -> Result<Option<ClientRecord>, AuthError> {
        if id.is_empty() || id.len() > 128 {
            return Ok(None);
        }
        Ok(self.store.client(id).await?)
    }

    /// Replaces a client's settings for the authorization code flow
    /// (`None`: it no longer signs users in). A sign-in under way is held
    /// to the new settings when it resumes. `false`: no such client.
    pub async fn set_oidc(&self, id: &str, oidc: Option<&ClientSettings>) -> Result<bool, AuthError> {
        self.check(oidc)?;
        let changed = self
            .store
            .set_client_oidc(
                id,
                oidc.map(ClientSettings::to_json).as_deref(),
                logout_uri(oidc).as_deref(),
                now_ms(),
            )
            .await?;
        self.origins.forget();
        Ok(changed)
    }

    /// Settings as registration takes them: well formed, and a back-channel
    /// logout URI at an address the delivery worker may reach (a name is
    /// checked again at each delivery, where it resolves).
    fn check(&self, oidc: Option<&ClientSettings>) -> Result<(), AuthError> {
        let Some(settings) = oidc else {
            return Ok(());
        };
        settings.check().map_err(AuthError::BadRequest)?;
        if let Some(alg) = settings.id_token_algorithm() {
            let signed_with = self.tokens.id_token_algorithms();
            if !signed_with.contains(&alg.as_str()) {
                return Err(AuthError::BadRequest(format!(
                    "id_token_signed_response_alg: this provider signs id_tokens with {} \
                     (add {} to id_token_signing_algorithms)",
                    signed_with.join(", "),
                    alg.as_str()
                )));
            }
        }
        let longest = self.tokens.access_ttl().as_secs();
        if settings.access_token_ttl_secs.is_some_and(|t| t > longest) {
            return Err(AuthError::BadRequest(format!(
                "access_token_ttl_secs: at most {longest} (access_token_ttl_secs of the service: \
                 signing keys are kept for that long after they retire)"
            )));
        }
        if let Some(uri) = logout_uri(oidc).and_then(|u| url::Url::parse(&u).ok()) {
            crate::webhooks::refuse_private_host(&uri, self.allow_private)
                .map_err(|why| AuthError::BadRequest(format!("backchannel_logout_uri: {why}")))?;
        }
        Ok(())
    }

    /// Creates a client that may ask for `scopes`; returns its secret, shown once.
    pub async fn add(
        &self,
        id: &str,
        name: Option<&str>,
        scopes: &[String],
        oidc: Option<&ClientSettings>,
    ) -> Result<Option<String>, AuthError> {
        self.check(oidc)?;
        check_id_and_scopes(id, scopes)?;
        let secret = random_token();
        let rec = ClientRecord {
            id: id.to_string(),
            secret_hash: sha256(secret.as_bytes()).to_vec(),
            name: name.map(str::to_string),
            created_at: now_ms(),
            scopes: scopes.join(" "),
            oidc: oidc.map(ClientSettings::to_json),
        };
        let added = self.store.add_client(&rec, logout_uri(oidc).as_deref()).await?;
        self.origins.forget();
        Ok(added.then_some(secret))
    }
}

/// A client's id and client-credentials scopes, as a new client's.
fn check_id_and_scopes(id: &str, scopes: &[String]) -> Result<(), AuthError> {
    let bad = |m: String| Err(AuthError::BadRequest(m));
    if let Some(s) = scopes.iter().find(|s| !valid_scope(s)) {
        return bad(format!(
            "scope {s:?} must be 1..=64 characters of A-Z a-z 0-9 : . _ -"
        ));
    }
    if id.is_empty()
        || id.len() > 128
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return bad("client id must be 1..=128 characters of A-Z a-z 0-9 - _ .".into());
    }
    if id == FIRST_PARTY_CLIENT {
        return bad(format!(
            "client id {id:?} is reserved: it names tokens of the first-party endpoints"
        ));
    }
    Ok(())
}

impl Clients {
    /// Adds a client exported from another deployment (`latchkey users
    /// import`) as it was there (its secret's hash, scopes, settings and
    /// creation time), checked as a new client is. `false`: its id is
    /// taken here, and that client is left as it is.
    pub async fn import(&self, mut rec: ClientRecord) -> Result<bool, AuthError> {
        let settings =
            match rec.oidc.as_deref() {
                Some(json) => Some(ClientSettings::from_json(json).ok_or_else(|| {
                    AuthError::BadRequest("oidc: not this version's client settings".into())
                })?),
                None => None,
            };
        self.check(settings.as_ref())?;
        let scopes: Vec<String> = rec.scopes.split_whitespace().map(String::from).collect();
        check_id_and_scopes(&rec.id, &scopes)?;
        rec.scopes = scopes.join(" ");
        rec.oidc = settings.as_ref().map(ClientSettings::to_json);
        let added = self
            .store
            .add_client(&rec, logout_uri(settings.as_ref()).as_deref())
            .await?;
        self.origins.forget();
        Ok(added)
    }
}

/// The back-channel logout URI of these settings, if any, in the normal
/// form the check passed and the worker sends to.
fn logout_uri(oidc: Option<&ClientSettings>) -> Option<String> {
    let uri = oidc.and_then(|s| s.backchannel_logout_uri.as_deref())?;
    Some(url::Url::parse(uri).map_or_else(|_| uri.to_string(), |u| u.to_string()))
}

/// Logout tokens in the algorithm of the client's id_tokens (Back-Channel
/// Logout 1.0 §2.6 validates one as an id_token is).
impl crate::webhooks::LogoutTokens for Clients {
    fn logout_token(&self, client: &ClientRecord, sub: &str, sid: &str) -> anyhow::Result<String> {
        let alg = client
            .oidc
            .as_deref()
            .and_then(ClientSettings::from_json)
            .and_then(|s| s.id_token_algorithm());
        self.tokens.issue_logout_token(alg, &client.id, sub, sid)
    }
}
