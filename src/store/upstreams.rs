//! Upstream providers and the upstream identities linked to accounts
//! (`domain/federation`, docs/federation.md).

use sqlx::Connection;

use super::events::record_event;
use super::outbox::{recipient, INSERT_OUTBOX};
use super::{db_op, Event, Store, StoreResult};

/// An upstream OpenID Provider, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamRecord {
    /// Its name in URLs (`/oauth/upstream/{name}`).
    pub name: String,
    /// What the sign-in page says: "Continue with {display_name}".
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    /// The client secret, sealed under the master secret.
    pub client_secret: Vec<u8>,
    /// Space-separated, `openid` among them.
    pub scopes: String,
    pub may_create: bool,
    pub trusts_email_verified: bool,
    pub created_at: i64,
    /// `oidc` (an OpenID Provider) or `github` (GitHub's OAuth and API).
    pub protocol: String,
    /// Its `amr` value `mfa` counts as the account's second factor.
    pub trusts_mfa: bool,
    /// The claims that carry the address and the name.
    pub email_claim: String,
    pub name_claim: String,
}

/// An upstream identity linked to an account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRecord {
    pub issuer: String,
    pub subject: String,
    pub user_id: String,
    /// The upstream it was linked through.
    pub upstream: String,
    /// The address it asserted when it was linked.
    pub email: Option<String>,
    pub created_at: i64,
}

/// The mail that tells an account an identity was linked to it.
pub struct LinkNotice<'a> {
    pub email: &'a str,
    /// The message, sealed for the outbox.
    pub sealed: &'a [u8],
}

/// What [`Store::sign_up_upstream`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum UpstreamSignUp {
    Created,
    /// An account has the address now (made meanwhile): nothing written.
    EmailTaken,
    /// The identity is linked now (meanwhile): nothing written.
    Linked,
}

type UpstreamRow = (
    String,
    String,
    String,
    String,
    Vec<u8>,
    String,
    bool,
    bool,
    i64,
    String,
    bool,
    String,
    String,
);

fn upstream(r: UpstreamRow) -> UpstreamRecord {
    UpstreamRecord {
        name: r.0,
        display_name: r.1,
        issuer: r.2,
        client_id: r.3,
        client_secret: r.4,
        scopes: r.5,
        may_create: r.6,
        trusts_email_verified: r.7,
        created_at: r.8,
        protocol: r.9,
        trusts_mfa: r.10,
        email_claim: r.11,
        name_claim: r.12,
    }
}

type IdentityRow = (String, String, String, String, Option<String>, i64);

fn identity(r: IdentityRow) -> IdentityRecord {
    IdentityRecord {
        issuer: r.0,
        subject: r.1,
        user_id: r.2,
        upstream: r.3,
        email: r.4,
        created_at: r.5,
    }
}

const SELECT_UPSTREAM: &str =
    "SELECT name, display_name, issuer, client_id, client_secret, scopes, may_create, \
     trusts_email_verified, created_at, protocol, trusts_mfa, email_claim, name_claim FROM upstreams";
const SELECT_IDENTITY: &str =
    "SELECT issuer, subject, user_id, upstream, email, created_at FROM upstream_identities";

impl Store {
    /// Adds an upstream (`false`: the name is taken).
    pub async fn add_upstream(&self, u: &UpstreamRecord) -> StoreResult<bool> {
        db_op!(self, "add_upstream", conn => {
            let n = sqlx::query(
                "INSERT INTO upstreams (name, display_name, issuer, client_id, client_secret, scopes, may_create, \
                 trusts_email_verified, created_at, protocol, trusts_mfa, email_claim, name_claim) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(&u.name)
            .bind(&u.display_name)
            .bind(&u.issuer)
            .bind(&u.client_id)
            .bind(&u.client_secret)
            .bind(&u.scopes)
            .bind(u.may_create)
            .bind(u.trusts_email_verified)
            .bind(u.created_at)
            .bind(&u.protocol)
            .bind(u.trusts_mfa)
            .bind(&u.email_claim)
            .bind(&u.name_claim)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            Ok(n == 1)
        })
    }

    pub async fn upstreams(&self) -> StoreResult<Vec<UpstreamRecord>> {
        let rows: Vec<UpstreamRow> = db_op!(self, "upstreams", conn => Ok(sqlx::query_as(
            &format!("{SELECT_UPSTREAM} ORDER BY name")
        )
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows.into_iter().map(upstream).collect())
    }

    /// Removes an upstream (`false`: no such name). The identities linked
    /// through it stay: they sign in again if it is added back with the
    /// same issuer.
    pub async fn remove_upstream(&self, name: &str) -> StoreResult<bool> {
        db_op!(self, "remove_upstream", conn => {
            let n = sqlx::query("DELETE FROM upstreams WHERE name = $1")
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            Ok(n == 1)
        })
    }

    /// The identity (issuer, subject), if it is linked.
    pub async fn upstream_identity(
        &self,
        issuer: &str,
        subject: &str,
    ) -> StoreResult<Option<IdentityRecord>> {
        let row: Option<IdentityRow> = db_op!(self, "upstream_identity", conn => Ok(sqlx::query_as(
            &format!("{SELECT_IDENTITY} WHERE issuer = $1 AND subject = $2")
        )
        .bind(issuer)
        .bind(subject)
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(row.map(identity))
    }

    /// The identities linked to an account, oldest first.
    pub async fn identities_of(&self, user_id: &str) -> StoreResult<Vec<IdentityRecord>> {
        let rows: Vec<IdentityRow> = db_op!(self, "identities_of", conn => Ok(sqlx::query_as(
            &format!("{SELECT_IDENTITY} WHERE user_id = $1 ORDER BY created_at, issuer, subject")
        )
        .bind(user_id)
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows.into_iter().map(identity).collect())
    }

    /// Links an identity to its account, with the `identity.linked` event
    /// and, given one, the notice mailed to the account (sealed), in one
    /// transaction (`false`: the identity is linked already, to whichever
    /// account; nothing written).
    pub async fn link_identity(
        &self,
        i: &IdentityRecord,
        ip: Option<&str>,
        notice: Option<&LinkNotice<'_>>,
    ) -> StoreResult<bool> {
        db_op!(self, "link_identity", conn => {
            let mut tx = conn.begin().await?;
            let n = insert_identity!(tx, i);
            if n != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            if let Some(notice) = notice {
                sqlx::query(INSERT_OUTBOX)
                    .bind(notice.sealed)
                    .bind(i.created_at)
                    .bind(&recipient(notice.email)[..])
                    .execute(&mut *tx)
                    .await?;
            }
            let reason = i.upstream.as_str();
            record_event!(tx, &Event::new("identity.linked", i.created_at).user(&i.user_id).ip(ip).reason(reason));
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Unlinks an identity from `user_id`, with the `identity.unlinked`
    /// event (`false`: it is not that account's).
    pub async fn unlink_identity(
        &self,
        user_id: &str,
        issuer: &str,
        subject: &str,
        actor: Option<&str>,
        now: i64,
    ) -> StoreResult<bool> {
        db_op!(self, "unlink_identity", conn => {
            let mut tx = conn.begin().await?;
            let gone: Option<(String,)> = sqlx::query_as(
                "DELETE FROM upstream_identities WHERE user_id = $1 AND issuer = $2 AND subject = $3 RETURNING upstream",
            )
            .bind(user_id)
            .bind(issuer)
            .bind(subject)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((upstream,)) = gone else {
                tx.rollback().await?;
                return Ok(false);
            };
            let mut e = Event::new("identity.unlinked", now).user(user_id).reason(&upstream);
            if let Some(a) = actor {
                e = e.actor(a);
            }
            record_event!(tx, &e);
            tx.commit().await?;
            Ok(true)
        })
    }

    /// A new account for an upstream identity: verified at its asserted
    /// address, without a password (`UNUSABLE_PASSWORD`), and linked to the
    /// identity, with the `user.registered` and `identity.linked` events, in
    /// one transaction.
    pub async fn sign_up_upstream(
        &self,
        user_id: &str,
        i: &IdentityRecord,
        name: Option<&str>,
        ip: Option<&str>,
    ) -> StoreResult<UpstreamSignUp> {
        let email = i.email.as_deref().unwrap_or_default();
        db_op!(self, "sign_up_upstream", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "INSERT INTO users (id, email, name, password_hash, email_verified_at, created_at, updated_at) \
                 VALUES ($1, $2, $5, $3, $4, $4, $4) ON CONFLICT (email) DO NOTHING",
            )
            .bind(user_id)
            .bind(email)
            .bind(super::UNUSABLE_PASSWORD)
            .bind(i.created_at)
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                tx.rollback().await?;
                return Ok(UpstreamSignUp::EmailTaken);
            }
            if insert_identity!(tx, i) != 1 {
                tx.rollback().await?;
                return Ok(UpstreamSignUp::Linked);
            }
            let reason = i.upstream.as_str();
            record_event!(tx, &Event::new("user.registered", i.created_at).user(user_id).ip(ip).reason(reason));
            record_event!(tx, &Event::new("identity.linked", i.created_at).user(user_id).ip(ip).reason(reason));
            tx.commit().await?;
            Ok(UpstreamSignUp::Created)
        })
    }
}

/// Inserts an identity unless (issuer, subject) is linked: rows written.
macro_rules! insert_identity {
    ($tx:ident, $i:expr) => {
        sqlx::query(
            "INSERT INTO upstream_identities (issuer, subject, user_id, upstream, email, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (issuer, subject) DO NOTHING",
        )
        .bind(&$i.issuer)
        .bind(&$i.subject)
        .bind(&$i.user_id)
        .bind(&$i.upstream)
        .bind(&$i.email)
        .bind($i.created_at)
        .execute(&mut *$tx)
        .await?
        .rows_affected()
    };
}
use insert_identity;
