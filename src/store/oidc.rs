//! The OpenID Provider's rows: authorization codes (single use, bound to
//! their request) and the consents users gave clients.

use sqlx::Connection;

use super::events::record_event;
use super::{db_op, Event, Store, StoreResult};

/// An authorization code about to be stored, or as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct AuthorizationCode {
    pub code_hash: Vec<u8>,
    pub client_id: String,
    pub user_id: String,
    /// The browser session that authorized.
    pub session_id: String,
    pub redirect_uri: String,
    pub code_challenge: Option<String>,
    pub scope: String,
    pub nonce: Option<String>,
    pub amr: String,
    /// Unix ms.
    pub auth_time: i64,
    pub created_at: i64,
    pub expires_at: i64,
    pub used_at: Option<i64>,
    /// The session its exchange started.
    pub issued_session: Option<String>,
}

/// What presenting a code did.
#[derive(Debug)]
pub enum CodeUse {
    /// This presentation spent it (the code as it was).
    Spent(Box<AuthorizationCode>),
    /// It was spent before: a second use (RFC 6749 §4.1.2). The session its
    /// first exchange started has been ended, in the same transaction.
    Reused {
        user_id: String,
        client_id: String,
        ended: Option<String>,
    },
    /// No such code, or one of another client, redirect URI or PKCE
    /// verifier, or expired: nothing changed.
    Refused,
}

/// A consent as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ConsentRecord {
    pub client_id: String,
    pub scope: String,
    pub granted_at: i64,
    pub expires_at: Option<i64>,
}

const CODE_COLUMNS: &str =
    "code_hash, client_id, user_id, session_id, redirect_uri, code_challenge, scope, nonce, \
     amr, auth_time, created_at, expires_at, used_at, issued_session";

impl Store {
    /// Stores a new code and records `oauth.authorized`.
    pub async fn create_authorization_code(
        &self,
        c: &AuthorizationCode,
        ip: Option<&str>,
    ) -> StoreResult<()> {
        db_op!(self, "create_authorization_code", conn => {
            let mut tx = conn.begin().await?;
            sqlx::query(
                "INSERT INTO authorization_codes (code_hash, client_id, user_id, session_id, redirect_uri, \
                 code_challenge, scope, nonce, amr, auth_time, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(&c.code_hash)
            .bind(&c.client_id)
            .bind(&c.user_id)
            .bind(&c.session_id)
            .bind(&c.redirect_uri)
            .bind(&c.code_challenge)
            .bind(&c.scope)
            .bind(&c.nonce)
            .bind(&c.amr)
            .bind(c.auth_time)
            .bind(c.created_at)
            .bind(c.expires_at)
            .execute(&mut *tx)
            .await?;
            let e = Event::new("oauth.authorized", c.created_at)
                .user(&c.user_id)
                .session(&c.session_id)
                .ip(ip)
                .reason(&c.client_id);
            record_event!(tx, &e);
            tx.commit().await?;
            Ok(())
        })
    }

    /// Spends the code of `code_hash` if it belongs to `client_id`, was
    /// issued for `redirect_uri` and `code_challenge` (the challenge of the
    /// verifier presented; `None`: no verifier), is unspent and not expired
    /// at `now`. A code spent before is a second use: the session its first
    /// exchange started ends with it (and `oauth.code_reused` is recorded),
    /// whoever presents it.
    pub async fn spend_authorization_code(
        &self,
        code_hash: &[u8],
        client_id: &str,
        redirect_uri: &str,
        code_challenge: Option<&str>,
        now: i64,
    ) -> StoreResult<CodeUse> {
        db_op!(self, "spend_authorization_code", conn => {
            let mut tx = conn.begin().await?;
            let spent: Option<AuthorizationCode> = sqlx::query_as(&format!(
                "UPDATE authorization_codes SET used_at = $5 WHERE code_hash = $1 AND client_id = $2 \
                 AND redirect_uri = $3 AND code_challenge IS NOT DISTINCT FROM $4 AND used_at IS NULL \
                 AND expires_at > $5 RETURNING {CODE_COLUMNS}"
            ))
            .bind(code_hash)
            .bind(client_id)
            .bind(redirect_uri)
            .bind(code_challenge)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(c) = spent {
                tx.commit().await?;
                return Ok(CodeUse::Spent(Box::new(c)));
            }
            let used: Option<(String, String, Option<String>)> = sqlx::query_as(
                "SELECT user_id, client_id, issued_session FROM authorization_codes \
                 WHERE code_hash = $1 AND used_at IS NOT NULL",
            )
            .bind(code_hash)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((user_id, owner, issued)) = used else {
                return Ok(CodeUse::Refused);
            };
            // Only the client the code was issued to ends what it got: a
            // spent code found elsewhere (a log, a history) presented by
            // another client must not log the user out of this one.
            if owner != client_id {
                return Ok(CodeUse::Refused);
            }
            let mut ended = None;
            if let Some(sid) = &issued {
                let n = sqlx::query(
                    "UPDATE sessions SET revoked_at = $2, revoked_reason = 'code_reused' \
                     WHERE id = $1 AND revoked_at IS NULL",
                )
                .bind(sid)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n == 1 {
                    let e = Event::new("session.ended", now).user(&user_id).session(sid).reason("code_reused");
                    record_event!(tx, &e);
                    ended = Some(sid.clone());
                }
            }
            let e = Event::new("oauth.code_reused", now).user(&user_id).reason(&owner);
            record_event!(tx, &e);
            tx.commit().await?;
            Ok(CodeUse::Reused {
                user_id,
                client_id: owner,
                ended,
            })
        })
    }

    /// Notes the session a spent code's exchange started (what a second use
    /// of the code ends).
    pub async fn set_code_session(&self, code_hash: &[u8], session_id: &str) -> StoreResult<()> {
        db_op!(self, "set_code_session", conn => {
            sqlx::query("UPDATE authorization_codes SET issued_session = $2 WHERE code_hash = $1")
                .bind(code_hash)
                .bind(session_id)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    }

    /// Drops codes expired before `before`.
    pub async fn purge_authorization_codes(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_authorization_codes", conn => Ok(
            sqlx::query("DELETE FROM authorization_codes WHERE expires_at < $1")
                .bind(before)
                .execute(&mut *conn)
                .await?
                .rows_affected()
        ))
    }

    /// The user's consent to `client_id`, if any.
    pub async fn consent(&self, user_id: &str, client_id: &str) -> StoreResult<Option<ConsentRecord>> {
        db_op!(self, "consent", conn => Ok(sqlx::query_as(
            "SELECT client_id, scope, granted_at, expires_at FROM consents WHERE user_id = $1 AND client_id = $2",
        )
        .bind(user_id)
        .bind(client_id)
        .fetch_optional(&mut *conn)
        .await?))
    }

    /// Every consent of the user, by client.
    pub async fn consents(&self, user_id: &str) -> StoreResult<Vec<ConsentRecord>> {
        db_op!(self, "consents", conn => Ok(sqlx::query_as(
            "SELECT client_id, scope, granted_at, expires_at FROM consents WHERE user_id = $1 ORDER BY client_id",
        )
        .bind(user_id)
        .fetch_all(&mut *conn)
        .await?))
    }

    /// Records that the user lets `client_id` have `scope` (until
    /// `expires_at`), replacing an earlier consent to it.
    pub async fn grant_consent(
        &self,
        user_id: &str,
        client_id: &str,
        scope: &str,
        now: i64,
        expires_at: Option<i64>,
    ) -> StoreResult<()> {
        db_op!(self, "grant_consent", conn => {
            let mut tx = conn.begin().await?;
            sqlx::query(
                "INSERT INTO consents (user_id, client_id, scope, granted_at, expires_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (user_id, client_id) DO UPDATE SET scope = excluded.scope, \
                 granted_at = excluded.granted_at, expires_at = excluded.expires_at",
            )
            .bind(user_id)
            .bind(client_id)
            .bind(scope)
            .bind(now)
            .bind(expires_at)
            .execute(&mut *tx)
            .await?;
            let e = Event::new("oauth.consent_granted", now).user(user_id).reason(client_id);
            record_event!(tx, &e);
            tx.commit().await?;
            Ok(())
        })
    }

    /// Withdraws the user's consent to `client_id`, drops the codes issued
    /// to it for the user and not yet exchanged, and ends the sessions that
    /// client holds for the user; their ids (`None`: there was no
    /// consent).
    pub async fn revoke_consent(
        &self,
        user_id: &str,
        client_id: &str,
        now: i64,
    ) -> StoreResult<Option<Vec<String>>> {
        db_op!(self, "revoke_consent", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("DELETE FROM consents WHERE user_id = $1 AND client_id = $2")
                .bind(user_id)
                .bind(client_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n == 0 {
                return Ok(None);
            }
            // A code issued just before must not start a session after it.
            sqlx::query("DELETE FROM authorization_codes WHERE user_id = $1 AND client_id = $2 AND used_at IS NULL")
                .bind(user_id)
                .bind(client_id)
                .execute(&mut *tx)
                .await?;
            let ended: Vec<(String,)> = sqlx::query_as(
                "UPDATE sessions SET revoked_at = $3, revoked_reason = 'consent_revoked' \
                 WHERE user_id = $1 AND client_id = $2 AND revoked_at IS NULL RETURNING id",
            )
            .bind(user_id)
            .bind(client_id)
            .bind(now)
            .fetch_all(&mut *tx)
            .await?;
            for (sid,) in &ended {
                let e = Event::new("session.ended", now).user(user_id).session(sid).reason("consent_revoked");
                record_event!(tx, &e);
            }
            let e = Event::new("oauth.consent_revoked", now).user(user_id).reason(client_id);
            record_event!(tx, &e);
            tx.commit().await?;
            Ok(Some(ended.into_iter().map(|(s,)| s).collect()))
        })
    }
}
