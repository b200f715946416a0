//! Signing in with other providers (docs/federation.md): an upstream
//! OpenID Provider signs the person in, and latchkey starts a session of
//! the account the upstream identity is linked to, or of a new account,
//! by the rule of [`rule::decide`].
//!
//! ```text
//!  browser              latchkey (pages)                 upstream
//!    │ Continue with X ──> depart: state, nonce, PKCE ──────> /authorize
//!    │    (the journey sealed into a cookie of this browser)     │ signs in
//!    │ <───────────────────────────── code, state, iss ──────────┘
//!    │ ──> arrive: state = the cookie's? iss = X's?
//!    │         token request (code + verifier) ─────────────> /token
//!    │         id_token: signature (JWKS), iss, aud, azp, exp, nonce
//!    │         address: the id_token's, else userinfo's (same sub)
//!    │         decide(linked?, address?) ──> sign in (second factor still asked)
//!    │                                    ├> create (verified address, may_create)
//!    │                                    ├> prove the local account first
//!    │                                    └> refuse
//! ```
//!
//! An identity is (issuer, subject); an address is a reason to ask for
//! proof, never a key (`rule.rs`). A sign-in through an upstream is a
//! latchkey session like any other: its `amr` is `fed`, and an account
//! with a second factor steps up to it after the upstream (an upstream's
//! own `amr` is taken as the second factor only where the operator trusts
//! that upstream for it: `trusts_mfa`).
//!
//! GitHub is no OpenID Provider: for a `github` upstream the code flow is
//! OAuth 2.0's, and who signed in is what its REST API answers
//! ([`github::identity`]) instead of an id_token.

mod apps;
pub mod github;
pub mod id_token;
mod links;
pub mod logout;
mod registry;
pub use registry::secret_aad as upstream_secret_aad;
pub mod rule;
pub mod upstream;

pub use apps::{AppReturn, FederationSettings, APP_CODE_TTL};
pub use links::{IdentityView, LinkOffer, LinkTo};
pub use registry::{NewUpstream, UpstreamView};

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use rule::{decide, Account, Asserted, Decision, Intent, Policy, Refusal};
pub use upstream::{Failure, Protocol};

use super::login::Login;
use super::mfa::SecondFactors;
use super::sessions::{Origin, TokenPair};
use super::shared::Shared;
use super::AuthError;
use crate::crypto::{b64url, b64url_decode, ct_eq, random_token, sha256, Sealer};
use crate::store::{IdentityRecord, UpstreamRecord, UpstreamSignUp};

/// How long a journey through an upstream may take, start to callback.
pub const JOURNEY_TTL: Duration = Duration::from_secs(600);
/// The largest journey cookie value.
const MAX_JOURNEY: usize = 3800;
/// The associated data of sealed client secrets and journeys.
const SECRET_AAD: &[u8] = b"latchkey upstream client secret";
const JOURNEY_AAD: &[u8] = b"latchkey upstream journey";

/// A sign-in's journey through an upstream: what the callback must
/// match, sealed into a cookie of the browser that left.
#[derive(Debug, Serialize, Deserialize)]
pub struct Journey {
    pub upstream: String,
    state: String,
    nonce: String,
    verifier: String,
    /// The pending authorization request it continues (the pages' sealed
    /// `authz`); empty for a link from the account page.
    pub authz: String,
    started_ms: i64,
    /// The account it links the upstream identity to (from the account
    /// page, by its signed-in owner); `None`: a sign-in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_to: Option<LinkTo>,
    /// The upstream's issuer when the journey began: an upstream removed
    /// and added again under the same name with another issuer meanwhile
    /// gets none of this journey's answers.
    #[serde(default)]
    issuer: String,
    /// The application with its own pages it returns to (the JSON pair:
    /// [`Federation::depart_for_app`]); `None`: latchkey's pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<AppReturn>,
}

/// Where to send the browser, and the journey to keep in its cookie.
pub struct Departure {
    pub url: String,
    pub sealed_journey: String,
}

/// What the upstream sent back to the callback.
#[derive(Debug, Default, Deserialize)]
pub struct Callback {
    pub code: Option<String>,
    pub state: Option<String>,
    pub iss: Option<String>,
    pub error: Option<String>,
}

/// Where an arrival from an upstream ends.
#[derive(Debug)]
pub enum Arrival {
    /// The login's answer: a session, or the step up to a second factor
    /// (`AuthError::SecondFactorRequired`), or its refusal.
    SignedIn(Result<TokenPair, AuthError>),
    /// A verified account has the address (`Decision::ProveFirst`): the
    /// person signs in to it, and the identity is linked then
    /// ([`Federation::link_after_proof`] with `sealed_link`, kept in a
    /// cookie of this browser meanwhile).
    ProveFirst {
        email: String,
        sealed_link: String,
    },
    /// An account whose address was never confirmed has it
    /// (`Decision::ProveMailbox`): nothing is linked, and its password
    /// (someone's who may not own the mailbox) is not asked for.
    ProveMailbox {
        email: String,
    },
    Refused(Refusal),
    /// A journey from the account page: the identity is linked to that
    /// account now (or was already).
    Linked,
    /// A journey of an application with its own pages: the code it
    /// redeems for the sign-in ([`Federation::redeem`]).
    AppCode(String),
}

/// Why a journey through an upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum FederationError {
    #[error("no such upstream")]
    UnknownUpstream,
    /// No journey cookie, an expired one, or a `state` that is not its.
    #[error("the sign-in through the upstream is not this browser's, or is too old")]
    Journey,
    /// The `iss` of the answer is not the upstream's (RFC 9207: a mix-up).
    #[error("the answer names another issuer")]
    MixUp,
    /// The upstream answered the browser with an error (`access_denied`, ...).
    #[error("the upstream answered with an error: {0}")]
    Denied(String),
    /// The pending request is too large to travel in the journey's cookie.
    #[error("the request is too large to sign in through an upstream")]
    TooLarge,
    #[error(transparent)]
    Upstream(#[from] Failure),
    #[error("the upstream's id_token is refused: {0:?}")]
    IdToken(id_token::Invalid),
    #[error(transparent)]
    Auth(#[from] AuthError),
}

impl From<crate::store::StoreError> for FederationError {
    fn from(e: crate::store::StoreError) -> Self {
        FederationError::Auth(e.into())
    }
}

pub struct Federation {
    shared: Arc<Shared>,
    login: Arc<Login>,
    factors: Arc<SecondFactors>,
    settings: FederationSettings,
    sealer: Sealer,
    /// latchkey's issuer: the callbacks are under it.
    issuer: String,
    http: upstream::Upstreams,
    /// The list the sign-in page shows, and when it was read.
    list: Mutex<(Instant, Arc<Vec<UpstreamRecord>>)>,
    refreshing: AtomicBool,
}

impl Federation {
    /// `issuer`: latchkey's own (its callback is under it).
    pub fn new(
        shared: Arc<Shared>,
        login: Arc<Login>,
        factors: Arc<SecondFactors>,
        settings: FederationSettings,
        sealer: Sealer,
        issuer: &str,
    ) -> Federation {
        Federation {
            shared,
            login,
            factors,
            settings,
            sealer,
            issuer: issuer.trim_end_matches('/').to_string(),
            http: upstream::Upstreams::new(),
            list: Mutex::new((Instant::now(), Arc::new(Vec::new()))),
            refreshing: AtomicBool::new(false),
        }
    }

    /// The redirect URI to register at upstream `name`: one per upstream,
    /// so that a code comes back only to the upstream it was asked of (a
    /// code of one upstream never reaches another's token endpoint: the
    /// mix-up attack, RFC 9207 §1).
    pub fn redirect_uri(&self, name: &str) -> String {
        format!("{}/oauth/upstream/{name}/callback", self.issuer)
    }

    async fn upstream(&self, name: &str) -> Result<UpstreamRecord, FederationError> {
        self.shared
            .store
            .upstreams()
            .await?
            .into_iter()
            .find(|u| u.name == name)
            .ok_or(FederationError::UnknownUpstream)
    }

    /// Where upstream `up` signs people in: an OpenID Provider's discovery
    /// document, or GitHub's endpoints and its API's base URL.
    async fn endpoints(
        &self,
        up: &UpstreamRecord,
    ) -> Result<(Protocol, Arc<upstream::Discovery>, Option<String>), FederationError> {
        match Protocol::parse(&up.protocol) {
            Some(Protocol::Oidc) => Ok((Protocol::Oidc, self.http.discovery(&up.issuer).await?, None)),
            Some(Protocol::Github) => {
                let (d, api) = upstream::github(&up.issuer);
                Ok((Protocol::Github, Arc::new(d), Some(api)))
            }
            // Written by a later version: not guessed at.
            None => Err(FederationError::UnknownUpstream),
        }
    }

    /// Leaves for upstream `name` to continue the pending request `authz`:
    /// the upstream's authorization URL (code flow, PKCE S256, `state`,
    /// `nonce`), and the journey sealed for the browser's cookie.
    pub async fn depart(
        &self,
        name: &str,
        authz: &str,
        origin: &Origin,
        now: i64,
    ) -> Result<Departure, FederationError> {
        self.leave(name, authz, None, None, origin, now).await
    }

    async fn leave(
        &self,
        name: &str,
        authz: &str,
        link_to: Option<LinkTo>,
        app: Option<AppReturn>,
        origin: &Origin,
        now: i64,
    ) -> Result<Departure, FederationError> {
        self.login.limit(origin).await?;
        let up = self.upstream(name).await?;
        let (protocol, d, _) = self.endpoints(&up).await?;
        let journey = Journey {
            upstream: up.name.clone(),
            state: random_token(),
            nonce: random_token(),
            verifier: random_token(),
            authz: authz.to_string(),
            started_ms: now,
            link_to,
            app,
            issuer: up.issuer.clone(),
        };
        let challenge = b64url(&sha256(journey.verifier.as_bytes()));
        let mut url = url::Url::parse(&d.authorization_endpoint)
            .map_err(|_| Failure::BadAnswer("authorization_endpoint is no URL".into()))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &up.client_id)
            .append_pair("redirect_uri", &self.redirect_uri(&up.name))
            .append_pair("scope", &up.scopes)
            .append_pair("state", &journey.state)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        if protocol == Protocol::Oidc {
            url.query_pairs_mut().append_pair("nonce", &journey.nonce);
        }
        let sealed = self.sealer.seal(
            &serde_json::to_vec(&journey).expect("a journey serialises"),
            JOURNEY_AAD,
        );
        let sealed_journey = b64url(&sealed);
        // Browsers keep cookies of about 4 KB; a request that large (a huge
        // `state` of the application's) could not come back.
        if sealed_journey.len() > MAX_JOURNEY {
            return Err(FederationError::TooLarge);
        }
        Ok(Departure {
            url: url.into(),
            sealed_journey,
        })
    }

    /// The journey of a browser's cookie, if it opens and is young enough.
    pub fn journey(&self, sealed: &str, now: i64) -> Option<Journey> {
        let bytes = self.sealer.open(&b64url_decode(sealed)?, JOURNEY_AAD)?;
        let j: Journey = serde_json::from_slice(&bytes).ok()?;
        let age = now - j.started_ms;
        (0..JOURNEY_TTL.as_millis() as i64).contains(&age).then_some(j)
    }

    /// Back from the upstream with `back`, on the journey the browser's
    /// cookie held: the code redeemed, the id_token checked, the rule
    /// applied, and the sign-in it allows started.
    pub async fn arrive(
        &self,
        name: &str,
        journey: &Journey,
        back: &Callback,
        origin: &Origin,
        now: i64,
    ) -> Result<Arrival, FederationError> {
        let state = back.state.as_deref().unwrap_or_default();
        if name != journey.upstream || !ct_eq(state.as_bytes(), journey.state.as_bytes()) {
            return Err(FederationError::Journey);
        }
        self.login.limit(origin).await?;
        let up = self.upstream(&journey.upstream).await?;
        if up.issuer != journey.issuer {
            return Err(FederationError::Journey);
        }
        let (protocol, d, api) = self.endpoints(&up).await?;
        // RFC 9207 §2.4: the issuer it names must be this upstream's, and
        // an upstream that says it names it must have.
        match back.iss.as_deref() {
            Some(iss) if iss != up.issuer => return Err(FederationError::MixUp),
            None if d.names_issuer => return Err(FederationError::MixUp),
            _ => {}
        }
        if let Some(e) = &back.error {
            // Logged: printable characters only.
            return Err(FederationError::Denied(
                e.chars().filter(|c| c.is_ascii_graphic()).take(64).collect(),
            ));
        }
        let code = back
            .code
            .as_deref()
            .filter(|c| !c.is_empty())
            .ok_or(FederationError::Journey)?;
        let secret = self
            .sealer
            .open(&up.client_secret, &registry::secret_aad(&up.name))
            .ok_or_else(|| {
                AuthError::Internal(anyhow::anyhow!("upstream {}: its secret does not open", up.name))
            })?;
        let secret = String::from_utf8_lossy(&secret);
        let tokens = self
            .http
            .exchange(
                protocol,
                &d.token_endpoint,
                (&up.client_id, &secret),
                &[
                    ("grant_type", "authorization_code"),
                    ("code", code),
                    ("redirect_uri", &self.redirect_uri(&up.name)),
                    ("code_verifier", &journey.verifier),
                ],
            )
            .await?;
        let identity = match api {
            Some(api) => self.github_identity(&api, &tokens).await?,
            None => self.oidc_identity(&up, &d, &tokens, &journey.nonce, now).await?,
        };
        match &journey.link_to {
            Some(to) => self.settle_link(&up, identity, to, origin, now).await,
            None => {
                self.settle(&up, identity, journey.app.as_ref(), origin, now, true)
                    .await
            }
        }
    }

    /// Who signed in at GitHub: its API asked with the access token.
    async fn github_identity(
        &self,
        api: &str,
        tokens: &serde_json::Value,
    ) -> Result<id_token::Identity, FederationError> {
        let at = tokens["access_token"]
            .as_str()
            .ok_or_else(|| Failure::BadAnswer("no access_token".into()))?;
        let user = self.http.github_api(&format!("{api}/user"), at).await?;
        let emails = self.http.github_api(&format!("{api}/user/emails"), at).await?;
        Ok(github::identity(&user, &emails)
            .ok_or_else(|| Failure::BadAnswer("GET /user has no id".into()))?)
    }

    /// Who signed in at an OpenID Provider: its id_token, checked, and
    /// userinfo for an address the id_token lacks.
    async fn oidc_identity(
        &self,
        up: &UpstreamRecord,
        d: &upstream::Discovery,
        tokens: &serde_json::Value,
        nonce: &str,
        now: i64,
    ) -> Result<id_token::Identity, FederationError> {
        let id_token = tokens["id_token"]
            .as_str()
            .ok_or_else(|| Failure::BadAnswer("no id_token".into()))?;
        let expected = id_token::Expected {
            issuer: &up.issuer,
            client_id: &up.client_id,
            nonce,
            now: now / 1000,
            mapping: id_token::Mapping {
                email: &up.email_claim,
                name: &up.name_claim,
            },
        };
        let mut verified = id_token::verify(id_token, &*self.http.keys(&d.jwks_uri, false).await?, &expected);
        if verified == Err(id_token::Invalid::UnknownKey) {
            // A rotation upstream: its JWKS again, once.
            verified = id_token::verify(id_token, &*self.http.keys(&d.jwks_uri, true).await?, &expected);
        }
        let mut identity = verified.map_err(FederationError::IdToken)?;
        if identity.email.is_none() {
            // Scope claims may be in userinfo only (Core §5.4).
            if let (Some(endpoint), Some(at)) = (&d.userinfo_endpoint, tokens["access_token"].as_str()) {
                let info = self.http.userinfo(endpoint, at).await?;
                if info["sub"].as_str() != Some(identity.subject.as_str()) {
                    return Err(Failure::BadAnswer("userinfo names another subject".into()).into());
                }
                let info = info.as_object().expect("userinfo answers an object");
                (identity.email, identity.email_verified) = id_token::email_of(info, &expected.mapping);
                identity.name = identity
                    .name
                    .or_else(|| id_token::name_of(info, &expected.mapping));
            }
        }
        Ok(identity)
    }

    /// The rule applied to an upstream identity, and what it allows done.
    /// `retry`: whether a creation that lost a race decides again (once).
    async fn settle(
        &self,
        up: &UpstreamRecord,
        who: id_token::Identity,
        app: Option<&AppReturn>,
        origin: &Origin,
        now: i64,
        retry: bool,
    ) -> Result<Arrival, FederationError> {
        let store = &self.shared.store;
        let linked = match store.upstream_identity(&up.issuer, &who.subject).await? {
            Some(i) => store.user_by_id(&i.user_id).await?,
            None => None,
        };
        let policy = Policy {
            trusts_email_verified: up.trusts_email_verified,
            may_create: up.may_create,
        };
        let asserted = Asserted {
            has_email: who.email.is_some(),
            email_verified: who.email_verified,
        };
        let trusted = asserted.email_verified && policy.trusts_email_verified;
        let by_email = match (&who.email, trusted && linked.is_none()) {
            (Some(e), true) => store.user_by_email(e).await?,
            _ => None,
        };
        let decision = decide(
            &Intent::SignIn,
            policy,
            asserted,
            linked.as_ref().map(account_of).as_ref(),
            by_email.as_ref().map(account_of).as_ref(),
        );
        let ip = origin.ip.to_string();
        let user = match decision {
            Decision::SignIn(_) => linked.expect("decided on a linked account"),
            Decision::Create => {
                let id = uuid::Uuid::now_v7().to_string();
                let identity = IdentityRecord {
                    issuer: up.issuer.clone(),
                    subject: who.subject.clone(),
                    user_id: id.clone(),
                    upstream: up.name.clone(),
                    email: who.email.clone(),
                    created_at: now,
                };
                match store
                    .sign_up_upstream(&id, &identity, who.name.as_deref(), Some(&ip))
                    .await?
                {
                    UpstreamSignUp::Created => {}
                    // Another request made the account or the link meanwhile:
                    // deciding again on what is there now.
                    UpstreamSignUp::EmailTaken | UpstreamSignUp::Linked if retry => {
                        return Box::pin(self.settle(up, who, app, origin, now, false)).await;
                    }
                    UpstreamSignUp::EmailTaken | UpstreamSignUp::Linked => {
                        return Err(AuthError::Unavailable("the account changed meanwhile".into()).into());
                    }
                }
                store
                    .user_by_id(&id)
                    .await?
                    .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("an account just made is gone")))?
            }
            Decision::ProveFirst(account) => {
                let link = links::PendingLink::new(up, &who, account, now);
                return Ok(Arrival::ProveFirst {
                    email: who.email.unwrap_or_default(),
                    sealed_link: self.seal_link(&link),
                });
            }
            Decision::ProveMailbox(_) => {
                return Ok(Arrival::ProveMailbox {
                    email: who.email.unwrap_or_default(),
                })
            }
            Decision::Refuse(r) => return Ok(Arrival::Refused(r)),
            Decision::Link(_) | Decision::AlreadyLinked => unreachable!("a sign-in links nothing"),
        };
        let (amr, mfa) = rule::session_amr(up.trusts_mfa, &who.amr, who.auth_time, now);
        match app {
            None => Ok(Arrival::SignedIn(
                self.login.upstream(origin, &user, &amr, mfa).await,
            )),
            Some(app) => Ok(Arrival::AppCode(
                self.issue_app_code(app, up, &user, &amr, origin, now).await?,
            )),
        }
    }
}

/// An account as the rule sees it.
fn account_of(u: &crate::store::UserRecord) -> Account {
    Account {
        id: u.id.clone(),
        disabled: u.disabled_at.is_some(),
        email_verified: u.email_verified_at.is_some(),
    }
}
