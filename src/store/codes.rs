//! One-time codes (email verification, password reset). The rules about them
//! live in `domain::codes`; this file only reads and writes rows, with
//! conditional updates so that concurrent requests cannot both succeed.

use sqlx::Connection;

use super::outbox::INSERT_OUTBOX;
use super::sessions::{NewSession, INSERT_REFRESH, INSERT_SESSION, REVOKE_USER_SESSIONS};
use super::{db_op, Store, StoreResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    VerifyEmail,
    ResetPassword,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::VerifyEmail => "verify_email",
            Purpose::ResetPassword => "reset_password",
        }
    }
}

#[derive(Clone, Debug)]
pub struct CodeRecord {
    pub code_hash: Vec<u8>,
    pub created_at: i64,
    pub expires_at: i64,
    pub failed_attempts: i32,
    pub consumed_at: Option<i64>,
}

/// A code to issue, with the sealed message that carries it.
pub struct NewCode<'a> {
    pub user_id: &'a str,
    pub purpose: Purpose,
    pub code_hash: &'a [u8],
    pub now: i64,
    pub expires_at: i64,
    /// No new code if the last one is younger than this.
    pub quiet_ms: i64,
    pub message: &'a [u8],
}

/// Insert or replace the code of (user, purpose); parameters
/// `$1 user_id, $2 purpose, $3 code_hash, $4 now, $5 expires_at`.
pub(super) const UPSERT_CODE: &str = "INSERT INTO one_time_codes \
     (user_id, purpose, code_hash, created_at, expires_at, failed_attempts, consumed_at) \
     VALUES ($1, $2, $3, $4, $5, 0, NULL) \
     ON CONFLICT (user_id, purpose) DO UPDATE SET code_hash = excluded.code_hash, \
     created_at = excluded.created_at, expires_at = excluded.expires_at, \
     failed_attempts = 0, consumed_at = NULL";

/// Marks the code used, only if it is the same code, unused and not dead.
const CONSUME_CODE: &str = "UPDATE one_time_codes SET consumed_at = $4 \
     WHERE user_id = $1 AND purpose = $2 AND created_at = $3 AND consumed_at IS NULL \
     AND failed_attempts < $5 AND expires_at > $4";

impl Store {
    pub async fn code_for(&self, user_id: &str, purpose: Purpose) -> StoreResult<Option<CodeRecord>> {
        type Row = (Vec<u8>, i64, i64, i32, Option<i64>);
        let row: Option<Row> = db_op!(self, "code_for", conn => Ok(sqlx::query_as(
            "SELECT code_hash, created_at, expires_at, failed_attempts, consumed_at \
             FROM one_time_codes WHERE user_id = $1 AND purpose = $2",
        )
        .bind(user_id)
        .bind(purpose.as_str())
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(row.map(|r| CodeRecord {
            code_hash: r.0,
            created_at: r.1,
            expires_at: r.2,
            failed_attempts: r.3,
            consumed_at: r.4,
        }))
    }

    /// Issues a new code with its email unless one was issued less than
    /// `quiet_ms` ago. The check and the write are one conditional statement,
    /// so concurrent requests send one email. Returns whether it sent.
    pub async fn issue_code(&self, c: NewCode<'_>) -> StoreResult<bool> {
        let NewCode {
            user_id,
            purpose,
            code_hash,
            now,
            expires_at,
            quiet_ms,
            message,
        } = c;
        let sql = "INSERT INTO one_time_codes \
             (user_id, purpose, code_hash, created_at, expires_at, failed_attempts, consumed_at) \
             VALUES ($1, $2, $3, $4, $5, 0, NULL) \
             ON CONFLICT (user_id, purpose) DO UPDATE SET code_hash = excluded.code_hash, \
             created_at = excluded.created_at, expires_at = excluded.expires_at, \
             failed_attempts = 0, consumed_at = NULL \
             WHERE one_time_codes.created_at <= $6";
        db_op!(self, "issue_code", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(sql)
                .bind(user_id)
                .bind(purpose.as_str())
                .bind(code_hash)
                .bind(now)
                .bind(expires_at)
                .bind(now - quiet_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n == 1 {
                sqlx::query(INSERT_OUTBOX).bind(message).bind(now).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(n == 1)
        })
    }

    /// Counts a wrong try against the code issued at `created_at`, if it is
    /// still that code and below `max` failures. Returns whether it counted.
    pub async fn record_code_failure(
        &self,
        user_id: &str,
        purpose: Purpose,
        created_at: i64,
        max: i32,
    ) -> StoreResult<bool> {
        let n = db_op!(self, "record_code_failure", conn => Ok(sqlx::query(
            "UPDATE one_time_codes SET failed_attempts = failed_attempts + 1 \
             WHERE user_id = $1 AND purpose = $2 AND created_at = $3 AND consumed_at IS NULL \
             AND failed_attempts < $4",
        )
        .bind(user_id)
        .bind(purpose.as_str())
        .bind(created_at)
        .bind(max)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    /// Consumes the verification code, marks the email verified and starts a
    /// session, in one transaction. `false` when the code was used concurrently.
    pub async fn verify_email(
        &self,
        user_id: &str,
        code_created_at: i64,
        max_failures: i32,
        session: &NewSession<'_>,
    ) -> StoreResult<bool> {
        db_op!(self, "verify_email", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(CONSUME_CODE)
                .bind(user_id)
                .bind(Purpose::VerifyEmail.as_str())
                .bind(code_created_at)
                .bind(session.now)
                .bind(max_failures)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            sqlx::query(
                "UPDATE users SET email_verified_at = COALESCE(email_verified_at, $2), updated_at = $2 WHERE id = $1",
            )
            .bind(user_id)
            .bind(session.now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(INSERT_SESSION)
                .bind(session.id)
                .bind(session.user_id)
                .bind(session.client_id)
                .bind(session.now)
                .bind(session.expires_at)
                .execute(&mut *tx)
                .await?;
            sqlx::query(INSERT_REFRESH)
                .bind(session.token_hash)
                .bind(session.id)
                .bind(session.now)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Consumes the reset code, sets the new password (the email counts as
    /// verified: the code reached it) and revokes every session, in one
    /// transaction. Returns the revoked session ids, or `None` when the code
    /// was used concurrently.
    pub async fn reset_password(
        &self,
        user_id: &str,
        code_created_at: i64,
        max_failures: i32,
        new_hash: &str,
        now: i64,
    ) -> StoreResult<Option<Vec<String>>> {
        db_op!(self, "reset_password", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(CONSUME_CODE)
                .bind(user_id)
                .bind(Purpose::ResetPassword.as_str())
                .bind(code_created_at)
                .bind(now)
                .bind(max_failures)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            sqlx::query(
                "UPDATE users SET password_hash = $2, email_verified_at = COALESCE(email_verified_at, $3), \
                 updated_at = $3 WHERE id = $1",
            )
            .bind(user_id)
            .bind(new_hash)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let ids: Vec<(String,)> = sqlx::query_as(REVOKE_USER_SESSIONS)
                .bind(user_id)
                .bind(now)
                .bind("password_reset")
                .bind("")
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(ids.into_iter().map(|r| r.0).collect()))
        })
    }
}
