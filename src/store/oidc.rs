//! The OpenID Provider's rows: authorization codes (single use, bound to
//! their request) and the consents users gave clients.

use sqlx::Connection;

use super::events::{event_ctes, record_event};
use super::sessions::{bind_new_session, insert_session, start_session_statement, why_not_started};
use super::{db_op, Event, NewSession, SessionStart, Store, StoreResult};

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

/// What redeeming a code did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redeemed {
    /// Spent by this call, and the session started; it ends at `expires_at`
    /// (Unix ms: no later than its browser session).
    Started { expires_at: i64 },
    /// Spent by this call, but the session may not start: the account is
    /// disabled or has a factor the sign-in did not pass
    /// ([`SessionStart`]), or the browser session ended.
    Refused(SessionStart),
    /// Not spent by this call: spent meanwhile, expired, or removed (a
    /// consent withdrawn). Nothing changed.
    NotSpent,
}

/// A consent as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ConsentRecord {
    pub client_id: String,
    pub scope: String,
    pub granted_at: i64,
    pub expires_at: Option<i64>,
}

/// Inserts the code `$1`-`$12` (as bound by `bind_code!`).
macro_rules! insert_code {
    () => {
        "INSERT INTO authorization_codes (code_hash, client_id, user_id, session_id, redirect_uri, \
         code_challenge, scope, nonce, amr, auth_time, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    };
}
const INSERT_CODE: &str = insert_code!();

/// Binds `$1`-`$12` of [`insert_code!`] for code `$c` to query `$q`.
macro_rules! bind_code {
    ($q:expr, $c:expr) => {{
        let c: &AuthorizationCode = $c;
        $q.bind(&c.code_hash)
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
    }};
}

/// Spends code `$3` (at `$1`, for session `$2`) if unspent and unexpired.
const SPEND_CODE: &str = "UPDATE authorization_codes SET used_at = $1, issued_session = $2 \
     WHERE code_hash = $3 AND used_at IS NULL AND expires_at > $1";

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
        let e = Event::new("oauth.authorized", c.created_at)
            .user(&c.user_id)
            .session(&c.session_id)
            .ip(ip)
            .reason(&c.client_id);
        db_op!(self, "create_authorization_code",
            sqlite conn => {
                let mut tx = conn.begin().await?;
                bind_code!(sqlx::query(INSERT_CODE), c).execute(&mut *tx).await?;
                record_event!(tx, &e);
                tx.commit().await?;
                Ok(())
            },
            postgres conn => {
                // The code, its event and the event's deliveries in one
                // statement.
                bind_code!(
                    sqlx::query(concat!(
                        "WITH c AS (", insert_code!(), " RETURNING user_id, session_id, client_id), ",
                        event_ctes!("c", "$11", "$13", "$14", "user_id", "session_id", "$15", "client_id"),
                        " SELECT 1"
                    )),
                    c
                )
                .bind(e.kind)
                .bind(super::events::family(e.kind))
                .bind(ip)
                .execute(&mut *conn)
                .await?;
                Ok(())
            },
        )
    }

    /// The code of `code_hash`, spent or not (the provider judges it:
    /// `domain::oidc::exchange::judge`).
    pub async fn authorization_code(&self, code_hash: &[u8]) -> StoreResult<Option<AuthorizationCode>> {
        db_op!(self, "authorization_code", conn => Ok(sqlx::query_as(&format!(
            "SELECT {CODE_COLUMNS} FROM authorization_codes WHERE code_hash = $1"
        ))
        .bind(code_hash)
        .fetch_optional(&mut *conn)
        .await?))
    }

    /// Spends the code of `code_hash` and starts the application's session
    /// `s` with it, in one commit: the code notes the session (what a
    /// second use of it ends), and the session starts if it may: the
    /// account enabled, its factor passed, and the browser session
    /// `s.parent_id` live (read FOR SHARE on PostgreSQL, so that a sign-out
    /// in flight either ends it too or comes first); it ends no later than
    /// the browser session. A code is spent even when its session may not
    /// start. One statement on PostgreSQL, one transaction on SQLite.
    pub async fn redeem_authorization_code(
        &self,
        code_hash: &[u8],
        s: &NewSession<'_>,
    ) -> StoreResult<Redeemed> {
        db_op!(self, "redeem_authorization_code",
            sqlite conn => {
                let mut tx = conn.begin().await?;
                let n = sqlx::query(SPEND_CODE)
                    .bind(s.now)
                    .bind(s.id)
                    .bind(code_hash)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if n == 0 {
                    return Ok(Redeemed::NotSpent);
                }
                let started = insert_session!(tx, s);
                let out = match started {
                    SessionStart::Started => {
                        let (expires_at,): (i64,) = sqlx::query_as("SELECT expires_at FROM sessions WHERE id = $1")
                            .bind(s.id)
                            .fetch_one(&mut *tx)
                            .await?;
                        Redeemed::Started { expires_at }
                    }
                    not => Redeemed::Refused(not),
                };
                tx.commit().await?;
                Ok(out)
            },
            postgres conn => {
                let (spent, expires_at): (i64, Option<i64>) = bind_new_session!(
                    sqlx::query_as(start_session_statement!(
                        "c AS (UPDATE authorization_codes SET used_at = $4, issued_session = $1 \
                         WHERE code_hash = $17 AND used_at IS NULL AND expires_at > $4 RETURNING code_hash), ",
                        ", sessions p",
                        "LEAST(p.expires_at, $5)",
                        " AND p.id = $16 AND p.revoked_at IS NULL AND p.expires_at > $4 AND EXISTS (SELECT 1 FROM c)",
                        "u, p",
                        "(SELECT count(*) FROM c), (SELECT max(expires_at) FROM s)"
                    )),
                    s
                )
                .bind(code_hash)
                .fetch_one(&mut *conn)
                .await?;
                Ok(match (spent, expires_at) {
                    (0, _) => Redeemed::NotSpent,
                    (_, Some(expires_at)) => Redeemed::Started { expires_at },
                    _ => Redeemed::Refused(why_not_started!(conn, s.user_id)),
                })
            },
        )
    }

    /// A spent code presented again by the client it was issued to (RFC
    /// 6749 §4.1.2): ends the session its first exchange started, if still
    /// live, and records `oauth.code_reused`, in one transaction. Nothing,
    /// if the code is not spent (it expired, or a withdrawn consent removed
    /// it, since it was read). Whether it was spent, and the id of the
    /// session ended.
    pub async fn end_reused_code(
        &self,
        code: &AuthorizationCode,
        now: i64,
    ) -> StoreResult<(bool, Option<String>)> {
        db_op!(self, "end_reused_code", conn => {
            let mut tx = conn.begin().await?;
            let spent: Option<(Option<String>,)> = sqlx::query_as(
                "SELECT issued_session FROM authorization_codes WHERE code_hash = $1 AND used_at IS NOT NULL",
            )
            .bind(&code.code_hash)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((issued,)) = spent else {
                return Ok((false, None));
            };
            let mut ended = None;
            if let Some(sid) = issued {
                let n = sqlx::query(
                    "UPDATE sessions SET revoked_at = $2, revoked_reason = 'code_reused' \
                     WHERE id = $1 AND revoked_at IS NULL",
                )
                .bind(&sid)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n == 1 {
                    let e = Event::new("session.ended", now).user(&code.user_id).session(&sid).reason("code_reused");
                    record_event!(tx, &e);
                    ended = Some(sid);
                }
            }
            let e = Event::new("oauth.code_reused", now).user(&code.user_id).reason(&code.client_id);
            record_event!(tx, &e);
            tx.commit().await?;
            Ok((true, ended))
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
