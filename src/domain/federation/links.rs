//! Links between upstream identities and accounts: the link a sign-in to
//! the account an upstream's address names may make (`Decision::ProveFirst`:
//! sealed into a cookie of the browser meanwhile, made only once the person
//! answers "Link"), and the links a person or an administrator lists and
//! removes.

use serde::{Deserialize, Serialize};

use super::id_token::{self, Identity};
use super::{
    account_of, decide, Arrival, Asserted, Decision, Departure, Federation, FederationError, Intent, Policy,
    Refusal, JOURNEY_TTL,
};
use crate::crypto::{b64url, b64url_decode, ct_eq};
use crate::domain::input::Password;
use crate::domain::sessions::Origin;
use crate::domain::tokens::Verified;
use crate::domain::AuthError;
use crate::store::{IdentityRecord, UpstreamRecord};

const LINK_AAD: &[u8] = b"latchkey upstream link after proof";

/// An identity to link once the person has signed in to the account its
/// address names (`Decision::ProveFirst`), sealed into a cookie of the
/// browser that came back from the upstream.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PendingLink {
    upstream: String,
    issuer: String,
    subject: String,
    email: Option<String>,
    /// The account the address named: only a sign-in to it links.
    user_id: String,
    at_ms: i64,
}

impl PendingLink {
    /// The link of identity `who` of upstream `up` to `account`, the one
    /// its address named.
    pub(super) fn new(up: &UpstreamRecord, who: &Identity, account: String, now: i64) -> PendingLink {
        PendingLink {
            upstream: up.name.clone(),
            issuer: up.issuer.clone(),
            subject: who.subject.clone(),
            email: who.email.clone(),
            user_id: account,
            at_ms: now,
        }
    }
}

/// An upstream identity linked to an account, as its owner and
/// administrators see it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct IdentityView {
    /// What `DELETE /auth/identities/{id}` names it by.
    pub id: String,
    /// The upstream it was linked through.
    pub upstream: String,
    pub issuer: String,
    pub subject: String,
    /// The address it asserted when it was linked.
    pub email: Option<String>,
    /// RFC 3339.
    pub linked_at: String,
}

impl From<IdentityRecord> for IdentityView {
    fn from(i: IdentityRecord) -> Self {
        IdentityView {
            id: identity_id(&i.issuer, &i.subject),
            upstream: i.upstream,
            issuer: i.issuer,
            subject: i.subject,
            email: i.email,
            linked_at: crate::clock::rfc3339(i.created_at),
        }
    }
}

/// An identity a sign-in may link, as the confirmation page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOffer {
    /// The upstream's display name.
    pub upstream: String,
    /// The address the upstream asserted.
    pub email: Option<String>,
}

/// An identity's id in URLs: (issuer, subject), base64url.
fn identity_id(issuer: &str, subject: &str) -> String {
    b64url(
        serde_json::to_string(&(issuer, subject))
            .expect("strings serialise")
            .as_bytes(),
    )
}

impl Federation {
    /// `link`, sealed for the browser's cookie.
    pub(super) fn seal_link(&self, link: &PendingLink) -> String {
        b64url(
            &self
                .sealer
                .seal(&serde_json::to_vec(link).expect("a link serialises"), LINK_AAD),
        )
    }

    /// The pending link of `sealed_link` if it may still be made to the
    /// account `user_id`, just signed in to: sealed by this service at
    /// most [`JOURNEY_TTL`] ago for that account; its upstream still
    /// configured with the same issuer and still trusted for addresses;
    /// the account still enabled, verified, at the address the upstream
    /// asserted (an administrator's change meanwhile voids it).
    async fn pending_link(
        &self,
        sealed_link: &str,
        user_id: &str,
        now: i64,
    ) -> Result<Option<(PendingLink, UpstreamRecord)>, AuthError> {
        let Some(link) = b64url_decode(sealed_link)
            .and_then(|b| self.sealer.open(&b, LINK_AAD))
            .and_then(|b| serde_json::from_slice::<PendingLink>(&b).ok())
        else {
            return Ok(None);
        };
        let young = (0..JOURNEY_TTL.as_millis() as i64).contains(&(now - link.at_ms));
        if !young || !ct_eq(link.user_id.as_bytes(), user_id.as_bytes()) {
            return Ok(None);
        }
        let store = &self.shared.store;
        let upstream = store
            .upstreams()
            .await?
            .into_iter()
            .find(|u| u.name == link.upstream && u.issuer == link.issuer && u.trusts_email_verified);
        let account = store.user_by_id(user_id).await?;
        let account_ok = account.is_some_and(|a| {
            a.disabled_at.is_none() && a.email_verified_at.is_some() && Some(&a.email) == link.email.as_ref()
        });
        Ok(match upstream {
            Some(up) if account_ok => Some((link, up)),
            _ => None,
        })
    }

    /// What a sign-in to `user_id` in the browser that holds `sealed_link`
    /// would link, for the person to confirm ([`Self::link_after_proof`]).
    pub async fn offer(
        &self,
        sealed_link: &str,
        user_id: &str,
        now: i64,
    ) -> Result<Option<LinkOffer>, AuthError> {
        Ok(self
            .pending_link(sealed_link, user_id, now)
            .await?
            .map(|(link, up)| LinkOffer {
                upstream: up.display_name,
                email: link.email,
            }))
    }

    /// Links the identity of `sealed_link` to `user_id` once the person,
    /// signed in to that account, confirmed it (the checks of
    /// [`Self::offer`] again). `true`: linked now.
    pub async fn link_after_proof(
        &self,
        sealed_link: &str,
        user_id: &str,
        origin: &Origin,
        now: i64,
    ) -> Result<bool, AuthError> {
        let Some((link, up)) = self.pending_link(sealed_link, user_id, now).await? else {
            return Ok(false);
        };
        // `pending_link` checked that the account's address is this one.
        let to = link.email.clone().unwrap_or_default();
        let identity = IdentityRecord {
            issuer: link.issuer,
            subject: link.subject,
            user_id: link.user_id,
            upstream: link.upstream,
            email: link.email,
            created_at: now,
        };
        self.link_and_tell(&identity, &up.display_name, &to, origin).await
    }

    /// Links `identity`, and mails the account's address `to` that it was
    /// (in the link's transaction: a link nobody is told of is what an
    /// attacker with a stolen session would want). `false`: it is linked
    /// already, to whichever account.
    pub(super) async fn link_and_tell(
        &self,
        identity: &IdentityRecord,
        display_name: &str,
        to: &str,
        origin: &Origin,
    ) -> Result<bool, AuthError> {
        let sealed = crate::mail::Message::identity_linked(to, display_name).seal(&self.shared.outbox.sealer);
        let notice = crate::store::LinkNotice {
            email: to,
            sealed: &sealed,
        };
        let linked = self
            .shared
            .store
            .link_identity(identity, Some(&origin.ip.to_string()), Some(&notice))
            .await?;
        if linked {
            self.shared.outbox.wake();
        }
        Ok(linked)
    }

    /// The identities linked to an account.
    pub async fn identities(&self, user_id: &str) -> Result<Vec<IdentityView>, AuthError> {
        let list = self.shared.store.identities_of(user_id).await?;
        Ok(list.into_iter().map(IdentityView::from).collect())
    }

    /// Unlinks identity `id` from the account `user_id` (by its owner, or
    /// by the administrator `actor`). Refused when it is the account's last
    /// way to sign in: no password, no passkey, no other identity (an
    /// emailed reset code would set a password, but an account should not
    /// depend on its owner thinking of it).
    pub async fn unlink(&self, user_id: &str, id: &str, actor: Option<&str>) -> Result<(), AuthError> {
        let store = &self.shared.store;
        let mine = store.identities_of(user_id).await?;
        let Some(target) = mine.iter().find(|i| identity_id(&i.issuer, &i.subject) == id) else {
            return Err(AuthError::NotFound("identity"));
        };
        let user = store
            .user_by_id(user_id)
            .await?
            .ok_or(AuthError::NotFound("identity"))?;
        let has_password = user.password_hash != crate::store::UNUSABLE_PASSWORD;
        let has_passkey = store
            .factors(user_id)
            .await?
            .iter()
            .any(|f| f.passwordless && f.confirmed_at.is_some());
        if !has_password && !has_passkey && mine.len() == 1 {
            return Err(AuthError::Conflict(
                "the account's last way to sign in: set a password or add a passkey first",
            ));
        }
        if !store
            .unlink_identity(
                user_id,
                &target.issuer,
                &target.subject,
                actor,
                crate::clock::now_ms(),
            )
            .await?
        {
            return Err(AuthError::NotFound("identity"));
        }
        Ok(())
    }
}

/// The account a journey from the account page links to, and the session
/// that started it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkTo {
    user_id: String,
    session_id: String,
}

impl Federation {
    /// Leaves for upstream `name` to link the identity found there to the
    /// account of `token` (its owner, on the account page). Like adding a
    /// second factor, it takes a recent sign-in, with the second factor
    /// when the account has one, and the current password when it has
    /// one: a stolen session must not be able to plant a way in of its
    /// own. The session must still be live when the browser comes back.
    pub async fn depart_to_link(
        &self,
        name: &str,
        token: &Verified,
        password: Option<Password>,
        origin: &Origin,
        now: i64,
    ) -> Result<Departure, FederationError> {
        self.factors
            .authorize_new_way_in(token, origin.ip, password)
            .await?;
        let to = LinkTo {
            user_id: token.claims.sub.clone(),
            session_id: token.claims.sid.clone(),
        };
        self.leave(name, "", Some(to), None, origin, now).await
    }

    /// The rule applied to an upstream identity its owner links to their
    /// own account `user_id` (`Intent::LinkTo`): whatever address it
    /// asserts, refused only when another account holds it or this one is
    /// disabled.
    pub(super) async fn settle_link(
        &self,
        up: &UpstreamRecord,
        who: id_token::Identity,
        to: &LinkTo,
        origin: &Origin,
        now: i64,
    ) -> Result<Arrival, FederationError> {
        // Signed out since it began: the journey is over.
        if self.shared.revocations.is_revoked(&to.session_id) {
            return Err(FederationError::Journey);
        }
        let store = &self.shared.store;
        let Some(me) = store.user_by_id(&to.user_id).await? else {
            return Err(FederationError::Journey);
        };
        let linked = match store.upstream_identity(&up.issuer, &who.subject).await? {
            Some(i) => store.user_by_id(&i.user_id).await?,
            None => None,
        };
        let decision = decide(
            &Intent::LinkTo(account_of(&me)),
            Policy {
                trusts_email_verified: up.trusts_email_verified,
                may_create: up.may_create,
            },
            Asserted {
                has_email: who.email.is_some(),
                email_verified: who.email_verified,
            },
            linked.as_ref().map(account_of).as_ref(),
            None,
        );
        match decision {
            Decision::Link(id) => {
                let identity = IdentityRecord {
                    issuer: up.issuer.clone(),
                    subject: who.subject,
                    user_id: id,
                    upstream: up.name.clone(),
                    email: who.email,
                    created_at: now,
                };
                if self
                    .link_and_tell(&identity, &up.display_name, &me.email, origin)
                    .await?
                {
                    Ok(Arrival::Linked)
                } else {
                    // Linked meanwhile, to whichever account.
                    Ok(Arrival::Refused(Refusal::LinkedElsewhere))
                }
            }
            Decision::AlreadyLinked => Ok(Arrival::Linked),
            Decision::Refuse(r) => Ok(Arrival::Refused(r)),
            other => Err(AuthError::Internal(anyhow::anyhow!("linking decided {other:?}")).into()),
        }
    }
}
