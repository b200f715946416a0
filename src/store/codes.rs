//! One-time codes (email verification, password reset), keyed by normalised
//! email and purpose, whether or not an account has that email: a request
//! for an unknown email stores a shadow code (a random hash that nothing
//! matches, and no mail), so that the code endpoints run the same statements
//! and answer the same way for every email. The rules about codes live in
//! `domain::codes`; this file only reads and writes rows, with conditional
//! updates so that concurrent requests cannot both succeed.

use sqlx::Connection;

use super::outbox::INSERT_OUTBOX;
use super::sessions::revoke_user_sessions;
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

/// A code to issue, with the sealed message that carries it (`None`: a
/// shadow code, which no mail carries).
pub struct NewCode<'a> {
    pub email: &'a str,
    pub purpose: Purpose,
    pub code_hash: &'a [u8],
    pub now: i64,
    pub expires_at: i64,
    /// No new code if the last one is younger than this.
    pub quiet_ms: i64,
    pub message: Option<&'a [u8]>,
    /// Recorded with the code, when one is issued (an admin's request).
    pub event: Option<super::Event<'a>>,
}

/// The password hash of an account verified while contested: no password
/// matches it (it is no PHC string), and login pays a dummy hash for it.
pub const UNUSABLE_PASSWORD: &str = "!contested";

/// Marks the code used, only if it is the same code, unused and not dead.
/// `$1 email, $2 purpose, $3 created_at, $4 now, $5 max failures`.
pub(super) const CONSUME_CODE: &str = "UPDATE codes SET consumed_at = $4 \
     WHERE email = $1 AND purpose = $2 AND created_at = $3 AND consumed_at IS NULL \
     AND failed_attempts < $5 AND expires_at > $4";

/// Runs [`CONSUME_CODE`] in the transaction `$tx` (a macro, so that one text
/// serves both backends inside `db_op!`); `true` when the code was consumed.
macro_rules! consume_code {
    ($tx:expr, $email:expr, $purpose:expr, $created_at:expr, $now:expr, $max_failures:expr) => {
        sqlx::query(CONSUME_CODE)
            .bind($email)
            .bind($purpose.as_str())
            .bind($created_at)
            .bind($now)
            .bind($max_failures)
            .execute(&mut *$tx)
            .await?
            .rows_affected()
            == 1
    };
}
pub(super) use consume_code;

impl Store {
    pub async fn code_for(&self, email: &str, purpose: Purpose) -> StoreResult<Option<CodeRecord>> {
        type Row = (Vec<u8>, i64, i64, i32, Option<i64>);
        let row: Option<Row> = db_op!(self, "code_for", conn => Ok(sqlx::query_as(
            "SELECT code_hash, created_at, expires_at, failed_attempts, consumed_at \
             FROM codes WHERE email = $1 AND purpose = $2",
        )
        .bind(email)
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

    /// Issues a new code (with its email, unless it is a shadow) unless one
    /// was issued less than `quiet_ms` ago. The check and the write are one
    /// conditional statement, so concurrent requests send one email. Pending
    /// credentials of the code replaced stay with the new one. Returns
    /// whether a code was issued.
    pub async fn issue_code(&self, c: NewCode<'_>) -> StoreResult<bool> {
        let NewCode {
            email,
            purpose,
            code_hash,
            now,
            expires_at,
            quiet_ms,
            message,
            event,
        } = c;
        let sql = "INSERT INTO codes \
             (email, purpose, code_hash, created_at, expires_at, failed_attempts, consumed_at) \
             VALUES ($1, $2, $3, $4, $5, 0, NULL) \
             ON CONFLICT (email, purpose) DO UPDATE SET code_hash = excluded.code_hash, \
             created_at = excluded.created_at, expires_at = excluded.expires_at, \
             failed_attempts = 0, consumed_at = NULL \
             WHERE codes.created_at <= $6";
        db_op!(self, "issue_code", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(sql)
                .bind(email)
                .bind(purpose.as_str())
                .bind(code_hash)
                .bind(now)
                .bind(expires_at)
                .bind(now - quiet_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if let (1, Some(message)) = (n, message) {
                sqlx::query(INSERT_OUTBOX)
                    .bind(message)
                    .bind(now)
                    .bind(&super::outbox::recipient(email)[..])
                    .execute(&mut *tx)
                    .await?;
            }
            if let (1, Some(e)) = (n, &event) {
                super::events::record_event!(tx, e);
            }
            tx.commit().await?;
            Ok(n == 1)
        })
    }

    /// Counts a wrong try against the code issued at `created_at`, if it is
    /// still that code and below `max` failures (a used code too: it is
    /// judged as a decoy, `domain::codes`). Returns whether it counted.
    pub async fn record_code_failure(
        &self,
        email: &str,
        purpose: Purpose,
        created_at: i64,
        max: i32,
    ) -> StoreResult<bool> {
        let n = db_op!(self, "record_code_failure", conn => Ok(sqlx::query(
            "UPDATE codes SET failed_attempts = failed_attempts + 1 \
             WHERE email = $1 AND purpose = $2 AND created_at = $3 AND failed_attempts < $4",
        )
        .bind(email)
        .bind(purpose.as_str())
        .bind(created_at)
        .bind(max)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    /// Sets the new password if the reset code is still usable (the email
    /// counts as verified: the code reached it, and any verification code
    /// left is void), consumes the code, and revokes every session, in one
    /// transaction (users, then codes, as everywhere). Returns the revoked
    /// session ids, or `None` when the code was used concurrently.
    pub async fn reset_password(
        &self,
        user_id: &str,
        email: &str,
        code_created_at: i64,
        max_failures: i32,
        new_hash: &str,
        now: i64,
    ) -> StoreResult<Option<Vec<String>>> {
        db_op!(self, "reset_password", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE users SET password_hash = $2, email_verified_at = COALESCE(email_verified_at, $3), \
                 updated_at = $3 WHERE id = $1 AND EXISTS (SELECT 1 FROM codes WHERE email = $4 \
                 AND purpose = 'reset_password' AND created_at = $5 AND consumed_at IS NULL \
                 AND failed_attempts < $6 AND expires_at > $3)",
            )
            .bind(user_id)
            .bind(new_hash)
            .bind(now)
            .bind(email)
            .bind(code_created_at)
            .bind(max_failures)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            if !consume_code!(tx, email, Purpose::ResetPassword, code_created_at, now, max_failures) {
                return Ok(None);
            }
            sqlx::query(
                "UPDATE codes SET consumed_at = $2 WHERE email = $1 AND purpose = 'verify_email' \
                 AND consumed_at IS NULL",
            )
            .bind(email)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let ids = revoke_user_sessions!(tx, user_id, None, "password_reset", now);
            super::events::record_event!(tx, &super::Event::new("password.reset", now).user(user_id));
            tx.commit().await?;
            Ok(Some(ids))
        })
    }

    /// Drops codes (real and shadow alike) that expired before `before`.
    pub async fn purge_codes(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_codes", conn => Ok(sqlx::query("DELETE FROM codes WHERE expires_at < $1")
            .bind(before)
            .execute(&mut *conn)
            .await?
            .rows_affected()))
    }
}
