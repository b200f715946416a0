//! Issuing: the service's signing key (the newest active key whose
//! private half this master secret unseals), rotation, and the clean-up of
//! retired keys. The issuer keeps its verifier's keys in step.

use std::sync::Arc;
use std::time::Duration;

use super::keys::{generate_key, Signer};
use super::verifier::Verifier;
use super::{AccessClaims, Authn, Subject, TokenSettings, ACR_MFA, ACR_SINGLE};
use crate::cache::Revocations;
use crate::clock::now_ms;
use crate::crypto::Sealer;
use crate::store::Store;

pub struct Issuer {
    settings: TokenSettings,
    store: Store,
    signer: Arc<Signer>,
    verifier: Arc<Verifier>,
}

impl Issuer {
    /// Loads the keys, creating the first one if there is none; the
    /// verifier of this service's tokens comes with it.
    pub async fn load(
        settings: TokenSettings,
        store: Store,
        sealer: Sealer,
        revocations: Arc<Revocations>,
    ) -> anyhow::Result<Issuer> {
        let signer = Arc::new(Signer::new(sealer));
        let verifier = Arc::new(Verifier::from_store(
            settings.verifier_settings(),
            store.clone(),
            signer.clone(),
            revocations,
        ));
        let issuer = Issuer {
            settings,
            store,
            signer,
            verifier,
        };
        issuer.reload().await?;
        if issuer.signer.current().is_none() {
            issuer.rotate().await?;
        }
        Ok(issuer)
    }

    /// The verifier of the tokens this issuer signs.
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    pub fn access_ttl(&self) -> Duration {
        self.settings.access_ttl
    }

    /// Makes a new key the signer (`latchkey keys rotate`); others retire.
    pub async fn rotate(&self) -> anyhow::Result<String> {
        let rec = generate_key(self.settings.algorithm, self.signer.sealer())?;
        self.store.add_signing_key(&rec).await?;
        self.reload().await?;
        Ok(rec.kid)
    }

    /// Reloads the keys from the database (every instance does this
    /// periodically, so a rotation reaches all of them): the verifier's
    /// ring, then the signer, from one read.
    pub async fn reload(&self) -> anyhow::Result<()> {
        self.verifier.reload().await
    }

    /// Every signing key in the database, active and retired.
    pub async fn keys(&self) -> anyhow::Result<Vec<crate::store::KeyRecord>> {
        Ok(self.store.signing_keys().await?)
    }

    /// Deletes keys whose tokens have all expired.
    pub async fn purge_retired(&self) -> anyhow::Result<u64> {
        Ok(self
            .store
            .purge_signing_keys(now_ms() - self.verifier.retention_ms())
            .await?)
    }

    /// Signs an access token of a user's session. A token an application
    /// got through the code flow names the user's email only if the user
    /// let it see it (the `email` scope): the token is readable by its
    /// holder and by every service it is shown to.
    pub fn issue(&self, s: &Subject<'_>) -> anyhow::Result<String> {
        let email = match s.scope {
            Some(scope) if !scope.split(' ').any(|x| x == "email") => "",
            _ => s.email,
        };
        self.sign(
            s.user_id,
            email,
            s.session_id,
            s.client_id,
            s.scope.map(str::to_string),
            Some(s.authn),
        )
    }

    /// Signs an id_token: `claims` is given the algorithm of the key that
    /// will sign (for `at_hash`).
    pub fn issue_id_token(
        &self,
        claims: impl FnOnce(super::Algorithm) -> super::IdClaims,
    ) -> anyhow::Result<String> {
        let signer = self.signer.current();
        let key = signer.as_ref().ok_or_else(|| anyhow::anyhow!("no signing key"))?;
        let signing = key
            .signing
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this key cannot sign"))?;
        signing.sign_id_token(&claims(key.alg))
    }

    /// The algorithm of the key that signs now (`None`: no key yet).
    pub fn signing_algorithm(&self) -> Option<&'static str> {
        self.signer.current().map(|k| match k.alg {
            super::Algorithm::ES256 => "ES256",
            super::Algorithm::RS256 => "RS256",
            _ => "EdDSA",
        })
    }

    /// The issuer's URL (`iss`).
    pub fn issuer(&self) -> &str {
        &self.settings.issuer
    }

    /// How long access tokens live.
    pub fn access_lifetime(&self) -> std::time::Duration {
        self.settings.access_ttl
    }

    /// A client's own access token (the client_credentials grant): the
    /// client is its subject, its `sid` names the client as added at
    /// `client_created_at` ([`super::client_sid`]), and it carries the
    /// granted `scope`.
    pub fn issue_for_client(
        &self,
        client_id: &str,
        client_created_at: i64,
        scope: &str,
    ) -> anyhow::Result<String> {
        let sid = super::client_sid(client_id, client_created_at);
        self.sign(client_id, "", &sid, client_id, Some(scope.to_string()), None)
    }

    fn sign(
        &self,
        sub: &str,
        email: &str,
        sid: &str,
        client_id: &str,
        scope: Option<String>,
        authn: Option<&Authn>,
    ) -> anyhow::Result<String> {
        let signer = self.signer.current();
        let key = signer.as_ref().ok_or_else(|| anyhow::anyhow!("no signing key"))?;
        let now = now_ms() / 1000;
        let claims = AccessClaims {
            iss: self.settings.issuer.clone(),
            sub: sub.to_string(),
            aud: self.settings.audience.clone(),
            exp: now + self.settings.access_ttl.as_secs() as i64,
            iat: now,
            nbf: None,
            jti: uuid::Uuid::new_v4().to_string(),
            sid: sid.to_string(),
            email: email.to_string(),
            client_id: client_id.to_string(),
            scope,
            amr: authn.map(|a| {
                a.amr
                    .split(' ')
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect()
            }),
            acr: authn.map(|a| (if a.is_mfa() { ACR_MFA } else { ACR_SINGLE }).to_string()),
            auth_time: authn.map(|a| a.at_ms / 1000),
        };
        let token = key
            .signing
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this key cannot sign"))?
            .sign(&claims)?;
        metrics::counter!("latchkey_tokens_issued_total").increment(1);
        Ok(token)
    }
}
