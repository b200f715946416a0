//! Second factors (TOTP authenticators, passkeys), recovery codes, and the
//! challenges of logins waiting for a factor and of WebAuthn ceremonies.
//! Every change of a user's factors writes its event in its transaction.

use sqlx::Connection;

use super::events::record_event;
use super::outbox::{recipient, INSERT_OUTBOX};
use super::sessions::revoke_user_sessions;
use super::{db_op, Event, Store, StoreResult};

/// What goes with a change of a user's factors, in its transaction: the
/// notice mailed to the account (sealed), and for an addition the session
/// that made it and the recovery codes to give if the account has none.
pub struct FactorChange<'a> {
    pub user_id: &'a str,
    pub email: &'a str,
    pub notice: &'a [u8],
    pub now: i64,
    /// The session making the change (kept when others end).
    pub session_id: &'a str,
    /// A new set of recovery codes, stored if the account has none yet.
    pub recovery: &'a [[u8; 32]],
}

/// What adding a factor did.
#[derive(Debug, Default)]
pub struct FactorAdded {
    /// The recovery codes offered were stored: show them.
    pub recovery_codes_given: bool,
    /// It was the account's first factor: its other sessions, which
    /// passed none, ended (their ids).
    pub ended_sessions: Vec<String>,
}

/// Mails `$change.notice` on `$tx` (in the change's transaction).
macro_rules! queue_notice {
    ($tx:expr, $change:expr) => {{
        let c: &FactorChange<'_> = $change;
        sqlx::query(INSERT_OUTBOX)
            .bind(c.notice)
            .bind(c.now)
            .bind(&recipient(c.email)[..])
            .execute(&mut *$tx)
            .await?;
    }};
}

/// After a factor was added on `$tx`: recovery codes if the account has
/// none (decided here, so two first factors racing give one set), and,
/// for its first factor, the end of its other sessions (they passed no
/// second factor); the notice. Evaluates to a [`FactorAdded`].
macro_rules! after_factor_added {
    ($tx:expr, $change:expr) => {{
        let c: &FactorChange<'_> = $change;
        let (codes,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM recovery_codes WHERE user_id = $1")
            .bind(c.user_id)
            .fetch_one(&mut *$tx)
            .await?;
        let (factors,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM factors WHERE user_id = $1 AND confirmed_at IS NOT NULL")
                .bind(c.user_id)
                .fetch_one(&mut *$tx)
                .await?;
        let mut added = FactorAdded::default();
        if codes == 0 {
            replace_recovery_codes!($tx, c.user_id, c.recovery, c.now);
            added.recovery_codes_given = true;
        }
        if factors == 1 {
            added.ended_sessions =
                revoke_user_sessions!($tx, c.user_id, Some(c.session_id), "factor_added", c.now);
        }
        queue_notice!($tx, c);
        added
    }};
}

/// A factor as stored. A TOTP factor holds its sealed secret and the newest
/// step accepted; a passkey its credential (public key, counter, backup
/// state) as webauthn-rs serialises it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FactorRecord {
    pub id: String,
    pub user_id: String,
    pub kind: String,
    pub name: String,
    pub secret: Option<Vec<u8>>,
    pub last_step: Option<i64>,
    pub credential: Option<String>,
    pub credential_id: Option<String>,
    pub passwordless: bool,
    pub created_at: i64,
    /// `None` while a TOTP factor waits for its first code.
    pub confirmed_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

const FACTOR_COLUMNS: &str = "id, user_id, kind, name, secret, last_step, credential, credential_id, \
     passwordless, created_at, confirmed_at, last_used_at";

/// A login waiting for its second factor, or a WebAuthn ceremony between
/// its two calls.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ChallengeRecord {
    pub token_hash: Vec<u8>,
    /// `login`, `passkey_register` or `passkey_login`.
    pub purpose: String,
    pub user_id: Option<String>,
    /// The methods passed so far (a login: `pwd`), space-separated.
    pub amr: String,
    pub client_id: Option<String>,
    pub user_agent: Option<String>,
    pub ip: Option<String>,
    /// The WebAuthn ceremony's state, JSON.
    pub state: Option<String>,
    pub detail: Option<String>,
    pub failures: i32,
    pub created_at: i64,
    pub expires_at: i64,
}

const CHALLENGE_COLUMNS: &str = "token_hash, purpose, user_id, amr, client_id, user_agent, ip, state, \
     detail, failures, created_at, expires_at";

/// Replaces the recovery codes of `$user` on `$tx` with `$hashes` (a
/// slice of 32-byte hashes), at `$now`.
macro_rules! replace_recovery_codes {
    ($tx:expr, $user:expr, $hashes:expr, $now:expr) => {{
        sqlx::query("DELETE FROM recovery_codes WHERE user_id = $1")
            .bind($user)
            .execute(&mut *$tx)
            .await?;
        for h in $hashes {
            sqlx::query("INSERT INTO recovery_codes (user_id, code_hash, created_at) VALUES ($1, $2, $3)")
                .bind($user)
                .bind(&h[..])
                .bind($now)
                .execute(&mut *$tx)
                .await?;
        }
    }};
}

impl Store {
    /// Every factor of a user, confirmed or not, oldest first.
    pub async fn factors(&self, user_id: &str) -> StoreResult<Vec<FactorRecord>> {
        let sql = format!("SELECT {FACTOR_COLUMNS} FROM factors WHERE user_id = $1 ORDER BY created_at, id");
        db_op!(self, "factors", conn => Ok(sqlx::query_as(&sql)
            .bind(user_id)
            .fetch_all(&mut *conn)
            .await?))
    }

    /// The confirmed factors and the unused recovery codes' hashes of the
    /// accounts whose ids run from `first` to `last` (a page of an export),
    /// in the order of their accounts.
    pub async fn factors_of_accounts(
        &self,
        first: &str,
        last: &str,
    ) -> StoreResult<(Vec<FactorRecord>, Vec<(String, Vec<u8>)>)> {
        let sql = format!(
            "SELECT {FACTOR_COLUMNS} FROM factors WHERE user_id >= $1 AND user_id <= $2 \
             AND confirmed_at IS NOT NULL ORDER BY user_id, created_at, id"
        );
        db_op!(self, "factors_of_accounts", conn => {
            let factors = sqlx::query_as(&sql).bind(first).bind(last).fetch_all(&mut *conn).await?;
            let codes = sqlx::query_as(
                "SELECT user_id, code_hash FROM recovery_codes WHERE user_id >= $1 AND user_id <= $2 \
                 AND used_at IS NULL ORDER BY user_id, code_hash",
            )
            .bind(first)
            .bind(last)
            .fetch_all(&mut *conn)
            .await?;
            Ok((factors, codes))
        })
    }

    /// The passkey with this credential id (base64url), whoever owns it.
    pub async fn passkey_by_credential(&self, credential_id: &str) -> StoreResult<Option<FactorRecord>> {
        let sql =
            format!("SELECT {FACTOR_COLUMNS} FROM factors WHERE credential_id = $1 AND kind = 'passkey'");
        db_op!(self, "passkey_by_credential", conn => Ok(sqlx::query_as(&sql)
            .bind(credential_id)
            .fetch_optional(&mut *conn)
            .await?))
    }

    /// A TOTP factor waiting for its first code; the user's other waiting
    /// ones are dropped (one enrolment at a time).
    pub async fn add_pending_totp(&self, f: &FactorRecord) -> StoreResult<()> {
        db_op!(self, "add_pending_totp", conn => {
            let mut tx = conn.begin().await?;
            sqlx::query("DELETE FROM factors WHERE user_id = $1 AND kind = 'totp' AND confirmed_at IS NULL")
                .bind(&f.user_id)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO factors (id, user_id, kind, name, secret, created_at) VALUES ($1, $2, 'totp', $3, $4, $5)",
            )
            .bind(&f.id)
            .bind(&f.user_id)
            .bind(&f.name)
            .bind(&f.secret)
            .bind(f.created_at)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Confirms a waiting TOTP factor with the step of its first code (and
    /// what goes with an addition, [`FactorChange`]). `None`: no such
    /// waiting factor of this user.
    pub async fn confirm_totp(
        &self,
        id: &str,
        step: i64,
        change: &FactorChange<'_>,
    ) -> StoreResult<Option<FactorAdded>> {
        let (user_id, now) = (change.user_id, change.now);
        db_op!(self, "confirm_totp", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE factors SET confirmed_at = $3, last_step = $4, last_used_at = $3 \
                 WHERE id = $1 AND user_id = $2 AND kind = 'totp' AND confirmed_at IS NULL",
            )
            .bind(id)
            .bind(user_id)
            .bind(now)
            .bind(step)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            let added = after_factor_added!(tx, change);
            record_event!(tx, &Event::new("factor.added", now).user(user_id).reason("totp"));
            tx.commit().await?;
            Ok(Some(added))
        })
    }

    /// Stores a factor as it is, confirmed, without event or mail: the
    /// accounts of `latchkey users seed --totp-secret` (a load-test lab).
    pub async fn seed_factor(&self, f: &FactorRecord) -> StoreResult<()> {
        db_op!(self, "seed_factor", conn => {
            sqlx::query(
                "INSERT INTO factors (id, user_id, kind, name, secret, last_step, created_at, confirmed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&f.id)
            .bind(&f.user_id)
            .bind(&f.kind)
            .bind(&f.name)
            .bind(&f.secret)
            .bind(f.last_step)
            .bind(f.created_at)
            .bind(f.confirmed_at)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }

    /// Records the step of a code just accepted, unless a concurrent use
    /// recorded this step or a newer one first (`false`: a replay).
    pub async fn use_totp_step(&self, id: &str, step: i64, now: i64) -> StoreResult<bool> {
        let n = db_op!(self, "use_totp_step", conn => Ok(sqlx::query(
            "UPDATE factors SET last_step = $2, last_used_at = $3 \
             WHERE id = $1 AND confirmed_at IS NOT NULL AND (last_step IS NULL OR last_step < $2)",
        )
        .bind(id)
        .bind(step)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    /// Adds a passkey (and what goes with an addition, [`FactorChange`]).
    /// `None`: its credential id is registered already.
    pub async fn add_passkey(
        &self,
        f: &FactorRecord,
        change: &FactorChange<'_>,
    ) -> StoreResult<Option<FactorAdded>> {
        db_op!(self, "add_passkey", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "INSERT INTO factors (id, user_id, kind, name, credential, credential_id, passwordless, \
                 created_at, confirmed_at) VALUES ($1, $2, 'passkey', $3, $4, $5, $6, $7, $7) \
                 ON CONFLICT (credential_id) DO NOTHING",
            )
            .bind(&f.id)
            .bind(&f.user_id)
            .bind(&f.name)
            .bind(&f.credential)
            .bind(&f.credential_id)
            .bind(f.passwordless)
            .bind(f.created_at)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            let added = after_factor_added!(tx, change);
            record_event!(tx, &Event::new("factor.added", f.created_at).user(&f.user_id).reason("passkey"));
            tx.commit().await?;
            Ok(Some(added))
        })
    }

    /// A passkey's use: its credential as updated (counter, backup state)
    /// when it changed.
    pub async fn passkey_used(&self, id: &str, credential: Option<&str>, now: i64) -> StoreResult<()> {
        db_op!(self, "passkey_used", conn => {
            sqlx::query("UPDATE factors SET credential = COALESCE($2, credential), last_used_at = $3 WHERE id = $1")
                .bind(id)
                .bind(credential)
                .bind(now)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    }

    pub async fn rename_factor(&self, id: &str, user_id: &str, name: &str, now: i64) -> StoreResult<bool> {
        db_op!(self, "rename_factor", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("UPDATE factors SET name = $3 WHERE id = $1 AND user_id = $2 AND confirmed_at IS NOT NULL")
                .bind(id)
                .bind(user_id)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            record_event!(tx, &Event::new("factor.renamed", now).user(user_id).reason(id));
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Removes a factor; with the last one go the recovery codes (they
    /// stand in for a factor the account no longer has). The account is told.
    pub async fn remove_factor(&self, id: &str, change: &FactorChange<'_>) -> StoreResult<bool> {
        let (user_id, now) = (change.user_id, change.now);
        db_op!(self, "remove_factor", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("DELETE FROM factors WHERE id = $1 AND user_id = $2")
                .bind(id)
                .bind(user_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            sqlx::query(
                "DELETE FROM recovery_codes WHERE user_id = $1 AND NOT EXISTS \
                 (SELECT 1 FROM factors WHERE user_id = $1 AND confirmed_at IS NOT NULL)",
            )
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
            queue_notice!(tx, change);
            record_event!(tx, &Event::new("factor.removed", now).user(user_id).reason(id));
            tx.commit().await?;
            Ok(true)
        })
    }

    /// A new set of recovery codes (`change.recovery`) in place of the old;
    /// `false` when the user has no confirmed factor (the codes would stand
    /// in for none). The account is told.
    pub async fn new_recovery_codes(&self, change: &FactorChange<'_>) -> StoreResult<bool> {
        let (user_id, hashes, now) = (change.user_id, change.recovery, change.now);
        db_op!(self, "new_recovery_codes", conn => {
            let mut tx = conn.begin().await?;
            let (factors,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM factors WHERE user_id = $1 AND confirmed_at IS NOT NULL",
            )
            .bind(user_id)
            .fetch_one(&mut *tx)
            .await?;
            if factors == 0 {
                return Ok(false);
            }
            replace_recovery_codes!(tx, user_id, hashes, now);
            queue_notice!(tx, change);
            record_event!(tx, &Event::new("recovery_codes.generated", now).user(user_id));
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Spends a recovery code: `true` once, for a code of the set not used yet.
    pub async fn use_recovery_code(&self, user_id: &str, hash: &[u8], now: i64) -> StoreResult<bool> {
        db_op!(self, "use_recovery_code", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE recovery_codes SET used_at = $3 WHERE user_id = $1 AND code_hash = $2 AND used_at IS NULL",
            )
            .bind(user_id)
            .bind(hash)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            record_event!(tx, &Event::new("recovery_code.used", now).user(user_id));
            tx.commit().await?;
            Ok(true)
        })
    }

    pub async fn recovery_codes_left(&self, user_id: &str) -> StoreResult<i64> {
        let (n,): (i64,) = db_op!(self, "recovery_codes_left", conn => Ok(sqlx::query_as(
            "SELECT COUNT(*) FROM recovery_codes WHERE user_id = $1 AND used_at IS NULL",
        )
        .bind(user_id)
        .fetch_one(&mut *conn)
        .await?))?;
        Ok(n)
    }

    /// An administrator's reset: every factor and recovery code of the
    /// account goes, and its logins waiting for a factor; the account is
    /// told. `false`: it had none.
    pub async fn reset_factors(&self, actor: &str, change: &FactorChange<'_>) -> StoreResult<bool> {
        let (user_id, now) = (change.user_id, change.now);
        db_op!(self, "reset_factors", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("DELETE FROM factors WHERE user_id = $1")
                .bind(user_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query("DELETE FROM recovery_codes WHERE user_id = $1")
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM mfa_challenges WHERE user_id = $1")
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
            if n > 0 {
                queue_notice!(tx, change);
                record_event!(tx, &Event::new("factors.reset", now).user(user_id).actor(actor));
            }
            tx.commit().await?;
            Ok(n > 0)
        })
    }

    pub async fn create_challenge(&self, c: &ChallengeRecord) -> StoreResult<()> {
        db_op!(self, "create_challenge", conn => {
            sqlx::query(&format!(
                "INSERT INTO mfa_challenges ({CHALLENGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            ))
            .bind(&c.token_hash)
            .bind(&c.purpose)
            .bind(&c.user_id)
            .bind(&c.amr)
            .bind(&c.client_id)
            .bind(&c.user_agent)
            .bind(&c.ip)
            .bind(&c.state)
            .bind(&c.detail)
            .bind(c.failures)
            .bind(c.created_at)
            .bind(c.expires_at)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }

    /// The live challenge of this token hash and purpose.
    pub async fn challenge(
        &self,
        token_hash: &[u8],
        purpose: &str,
        now: i64,
    ) -> StoreResult<Option<ChallengeRecord>> {
        let sql = format!(
            "SELECT {CHALLENGE_COLUMNS} FROM mfa_challenges WHERE token_hash = $1 AND purpose = $2 AND expires_at > $3"
        );
        db_op!(self, "challenge", conn => Ok(sqlx::query_as(&sql)
            .bind(token_hash)
            .bind(purpose)
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?))
    }

    /// Counts a wrong factor against a challenge; at `max` failures it is
    /// deleted. Returns the failures counted, or `None` when it was gone.
    pub async fn challenge_failed(&self, token_hash: &[u8], max: i32) -> StoreResult<Option<i32>> {
        db_op!(self, "challenge_failed", conn => {
            let mut tx = conn.begin().await?;
            let row: Option<(i32,)> = sqlx::query_as(
                "UPDATE mfa_challenges SET failures = failures + 1 WHERE token_hash = $1 RETURNING failures",
            )
            .bind(token_hash)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((n,)) = row {
                if n >= max {
                    sqlx::query("DELETE FROM mfa_challenges WHERE token_hash = $1")
                        .bind(token_hash)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            tx.commit().await?;
            Ok(row.map(|r| r.0))
        })
    }

    /// Stores a spent ceremony's token hash until it expires (a sealed
    /// ceremony that had no row): `false` when it was spent already.
    pub async fn claim_challenge(
        &self,
        token_hash: &[u8],
        purpose: &str,
        now: i64,
        expires_at: i64,
    ) -> StoreResult<bool> {
        let n = db_op!(self, "claim_challenge", conn => Ok(sqlx::query(
            "INSERT INTO mfa_challenges (token_hash, purpose, created_at, expires_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (token_hash) DO NOTHING",
        )
        .bind(token_hash)
        .bind(format!("{purpose}_spent"))
        .bind(now)
        .bind(expires_at)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    /// Deletes a challenge; `true` for the one caller that did (single use).
    pub async fn consume_challenge(&self, token_hash: &[u8]) -> StoreResult<bool> {
        let n = db_op!(self, "consume_challenge", conn => Ok(sqlx::query(
            "DELETE FROM mfa_challenges WHERE token_hash = $1",
        )
        .bind(token_hash)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    /// Deletes expired challenges, and TOTP enrolments never confirmed
    /// (created before `pending_before`).
    pub async fn purge_challenges(&self, now: i64, pending_before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_challenges", conn => {
            let a = sqlx::query("DELETE FROM mfa_challenges WHERE expires_at <= $1")
                .bind(now)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            let b = sqlx::query("DELETE FROM factors WHERE confirmed_at IS NULL AND created_at < $1")
                .bind(pending_before)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            Ok(a + b)
        })
    }
}
