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
        let signer = Arc::new(Signer::new(sealer, settings.signing_algorithms()));
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
        issuer.refresh().await?;
        Ok(issuer)
    }

    /// The verifier of the tokens this issuer signs.
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    pub fn access_ttl(&self) -> Duration {
        self.settings.access_ttl
    }

    /// Makes a new key the signer of each algorithm (`latchkey keys
    /// rotate`); the keys they replace retire, and so do the keys of any
    /// algorithm no longer signed with. The main algorithm's new key id.
    pub async fn rotate(&self) -> anyhow::Result<String> {
        let signed_with: Vec<&str> = self.signer.algorithms().iter().map(|a| a.as_str()).collect();
        let kids = self
            .add_keys(self.signer.algorithms(), Some(&signed_with))
            .await?;
        Ok(kids.into_iter().next().unwrap_or_default())
    }

    /// Reloads the keys, and makes the first key of each algorithm this
    /// issuer signs with that has none (a new deployment, one told to sign
    /// with another algorithm, or one whose key another instance's rotation
    /// retired for an algorithm it no longer signs with): at start, and at
    /// each periodic reload. Keys of other algorithms stay active here, so
    /// that instances configured apart during a rolling change all sign;
    /// the next rotation retires them.
    pub async fn refresh(&self) -> anyhow::Result<()> {
        self.reload().await?;
        let missing = self.signer.missing();
        if !missing.is_empty() {
            self.add_keys(&missing, None).await?;
        }
        Ok(())
    }

    /// A new active key of each of `algorithms`, replacing the active key
    /// of its algorithm; with `retire_all_but`, the active keys of every
    /// other algorithm retire too.
    async fn add_keys(
        &self,
        algorithms: &[super::SigningAlgorithm],
        retire_all_but: Option<&[&str]>,
    ) -> anyhow::Result<Vec<String>> {
        let mut kids = Vec::new();
        for alg in algorithms {
            let rec = generate_key(*alg, self.signer.sealer())?;
            self.store.add_signing_key(&rec, retire_all_but).await?;
            kids.push(rec.kid);
        }
        self.reload().await?;
        Ok(kids)
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

    /// Signs an access token of a user's session ([`visible_email`]). A token an application
    /// got through the code flow names the user's email only if the user
    /// let it see it (the `email` scope): the token is readable by its
    /// holder and by every service it is shown to.
    pub fn issue(&self, s: &Subject<'_>) -> anyhow::Result<String> {
        let email = visible_email(s.scope, s.email);
        let who = Who {
            sub: s.user_id,
            email,
            sid: s.session_id,
            client_id: s.client_id,
        };
        let ttl = s.access_ttl.unwrap_or(self.settings.access_ttl);
        self.sign(who, s.scope.map(str::to_string), Some(s.authn), ttl)
    }

    /// Signs an id_token with the key of `alg` (`None`: the main
    /// algorithm's): `claims` is given the algorithm of the key that will
    /// sign (for `at_hash`).
    pub fn issue_id_token(
        &self,
        alg: Option<super::SigningAlgorithm>,
        claims: impl FnOnce(super::Algorithm) -> super::IdClaims,
    ) -> anyhow::Result<String> {
        let alg = alg.unwrap_or(self.settings.algorithm);
        let key = self.signer.for_algorithm(alg).ok_or_else(|| {
            anyhow::anyhow!("no {} signing key (id_token_signing_algorithms)", alg.as_str())
        })?;
        let signing = key
            .signing
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this key cannot sign"))?;
        signing.sign_id_token(&claims(key.alg))
    }

    /// Whether an id_token can be signed in `alg` now (`None`: the main
    /// algorithm).
    pub fn can_sign(&self, alg: Option<super::SigningAlgorithm>) -> bool {
        self.signer
            .for_algorithm(alg.unwrap_or(self.settings.algorithm))
            .is_some()
    }

    /// The algorithms id_tokens may be signed with here: those with a
    /// current key, the main one first (discovery).
    pub fn id_token_algorithms(&self) -> Vec<&'static str> {
        self.signer
            .algorithms()
            .iter()
            .filter(|a| self.signer.for_algorithm(**a).is_some())
            .map(|a| a.as_str())
            .collect()
    }

    /// A logout token (OpenID Connect Back-Channel Logout 1.0 §2.4) telling
    /// client `client_id` that the session `sid` of user `sub` ended: `iss`,
    /// `aud`, `iat`, `exp` (two minutes), `jti`, `sub`, `sid` and the
    /// back-channel logout event; never a `nonce` (§2.4 forbids it, so that
    /// it cannot pass for an id_token).
    /// Signed with the key of `alg` (the client's id_token algorithm: §2.6
    /// validates a logout token as an id_token), `None`: the main one's.
    pub fn issue_logout_token(
        &self,
        alg: Option<super::SigningAlgorithm>,
        client_id: &str,
        sub: &str,
        sid: &str,
    ) -> anyhow::Result<String> {
        let alg = alg.unwrap_or(self.settings.algorithm);
        let key = self
            .signer
            .for_algorithm(alg)
            .ok_or_else(|| anyhow::anyhow!("no {} signing key", alg.as_str()))?;
        let signing = key
            .signing
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this key cannot sign"))?;
        let iat = now_ms() / 1000;
        signing.sign_logout_token(&serde_json::json!({
            "iss": self.settings.issuer,
            "aud": client_id,
            "iat": iat,
            "exp": iat + 120,
            "jti": uuid::Uuid::new_v4().to_string(),
            "sub": sub,
            "sid": sid,
            "events": {"http://schemas.openid.net/event/backchannel-logout": {}},
        }))
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
        let who = Who {
            sub: client_id,
            email: "",
            sid: &sid,
            client_id,
        };
        self.sign(who, Some(scope.to_string()), None, self.settings.access_ttl)
    }

    fn sign(
        &self,
        who: Who<'_>,
        scope: Option<String>,
        authn: Option<&Authn>,
        ttl: Duration,
    ) -> anyhow::Result<String> {
        let Who {
            sub,
            email,
            sid,
            client_id,
        } = who;
        let signer = self.signer.current();
        let key = signer.as_ref().ok_or_else(|| anyhow::anyhow!("no signing key"))?;
        let now = now_ms() / 1000;
        let claims = AccessClaims {
            iss: self.settings.issuer.clone(),
            sub: sub.to_string(),
            aud: self.settings.audience.clone(),
            exp: now + ttl.as_secs() as i64,
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

/// Whom an access token names.
struct Who<'a> {
    sub: &'a str,
    email: &'a str,
    sid: &'a str,
    client_id: &'a str,
}

/// The email an application may learn of a session's user: the user's for
/// a first-party session (`scope` `None`), else only with the `email`
/// scope the user granted (empty otherwise). Tokens and introspection
/// answer by it alike.
pub fn visible_email<'a>(scope: Option<&str>, email: &'a str) -> &'a str {
    match scope {
        Some(scope) if !scope.split(' ').any(|x| x == "email") => "",
        _ => email,
    }
}
