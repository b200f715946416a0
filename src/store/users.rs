//! Users, and the transactions that create or change them together with the
//! code and the mail that the change causes.

use sqlx::Connection;

use super::events::record_event;
use super::sessions::revoke_user_sessions;
use super::Event;
use super::{db_op, outbox::INSERT_OUTBOX, Store, StoreResult};

#[derive(Clone, Debug)]
pub struct UserRecord {
    pub id: String,
    pub email: String,
    pub name: Option<String>,
    pub password_hash: String,
    pub email_verified_at: Option<i64>,
    pub created_at: i64,
    /// Set while an administrator has disabled the account.
    pub disabled_at: Option<i64>,
}

type UserRow = (
    String,
    String,
    Option<String>,
    String,
    Option<i64>,
    i64,
    Option<i64>,
);

fn user(r: UserRow) -> UserRecord {
    UserRecord {
        id: r.0,
        email: r.1,
        name: r.2,
        password_hash: r.3,
        email_verified_at: r.4,
        created_at: r.5,
        disabled_at: r.6,
    }
}

macro_rules! select_user {
    ($where:literal) => {
        concat!(
            "SELECT id, email, name, password_hash, email_verified_at, created_at, disabled_at FROM users ",
            $where
        )
    };
}

/// What [`Store::change_email`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum EmailChange {
    Changed {
        old: String,
        ended: Vec<String>,
    },
    NoUser,
    /// Another account has the new email.
    Taken,
}

/// Which accounts an administrator lists (every field narrows the list).
#[derive(Clone, Debug, Default)]
pub struct UserFilter {
    /// Emails that start with this (normalised, as stored).
    pub email_prefix: Option<String>,
    pub verified: Option<bool>,
    pub disabled: Option<bool>,
    /// Created at or after / before (Unix milliseconds).
    pub created_from: Option<i64>,
    pub created_before: Option<i64>,
    /// Ids after this one (the previous page's last).
    pub after: Option<String>,
}

impl Store {
    pub async fn user_by_email(&self, email: &str) -> StoreResult<Option<UserRecord>> {
        let sql = select_user!("WHERE email = $1");
        let row = db_op!(self, "user_by_email", conn => {
            Ok(sqlx::query_as::<_, UserRow>(sql).bind(email).fetch_optional(&mut *conn).await?)
        })?;
        Ok(row.map(user))
    }

    pub async fn user_by_id(&self, id: &str) -> StoreResult<Option<UserRecord>> {
        let sql = select_user!("WHERE id = $1");
        let row = db_op!(self, "user_by_id", conn => {
            Ok(sqlx::query_as::<_, UserRow>(sql).bind(id).fetch_optional(&mut *conn).await?)
        })?;
        Ok(row.map(user))
    }

    /// A page of accounts in id order (creation order: ids are UUIDv7).
    pub async fn users_page(&self, f: &UserFilter, limit: i64) -> StoreResult<Vec<UserRecord>> {
        let sql = select_user!(
            "WHERE ($1 IS NULL OR substr(email, 1, CAST($2 AS INTEGER)) = $1) \
             AND ($3 IS NULL OR (email_verified_at IS NOT NULL) = $3) \
             AND ($4 IS NULL OR (disabled_at IS NOT NULL) = $4) \
             AND ($5 IS NULL OR created_at >= $5) AND ($6 IS NULL OR created_at < $6) \
             AND ($7 IS NULL OR id > $7) ORDER BY id LIMIT $8"
        );
        let prefix_len = f.email_prefix.as_ref().map_or(0, |p| p.chars().count() as i64);
        let rows = db_op!(self, "users_page", conn => {
            Ok(sqlx::query_as::<_, UserRow>(sql)
                .bind(f.email_prefix.as_deref())
                .bind(prefix_len)
                .bind(f.verified)
                .bind(f.disabled)
                .bind(f.created_from)
                .bind(f.created_before)
                .bind(f.after.as_deref())
                .bind(limit)
                .fetch_all(&mut *conn)
                .await?)
        })?;
        Ok(rows.into_iter().map(user).collect())
    }

    /// Sets the name of an account (`actor`: the admin client); `false` if
    /// there is none.
    pub async fn set_user_name(
        &self,
        id: &str,
        name: Option<&str>,
        now: i64,
        actor: &str,
    ) -> StoreResult<bool> {
        db_op!(self, "set_user_name", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("UPDATE users SET name = $2, updated_at = $3 WHERE id = $1")
                .bind(id)
                .bind(name)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            record_event!(tx, &Event::new("user.updated", now).user(id).actor(actor).reason("name"));
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Disables (ending every session, in the same transaction) or enables
    /// an account. Returns the sessions it ended, or `None` if there is no
    /// such account.
    pub async fn set_user_disabled(
        &self,
        id: &str,
        disabled: bool,
        now: i64,
        actor: &str,
    ) -> StoreResult<Option<Vec<String>>> {
        db_op!(self, "set_user_disabled", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE users SET disabled_at = CASE WHEN $2 THEN COALESCE(disabled_at, $3) ELSE NULL END, \
                 updated_at = $3 WHERE id = $1",
            )
            .bind(id)
            .bind(disabled)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            let ended = if disabled {
                revoke_user_sessions!(tx, id, None, "user_disabled", now)
            } else {
                Vec::new()
            };
            let kind = if disabled { "user.disabled" } else { "user.enabled" };
            record_event!(tx, &Event::new(kind, now).user(id).actor(actor));
            tx.commit().await?;
            Ok(Some(ended))
        })
    }

    /// Changes an account's email (an administrator's change): the account
    /// becomes unverified until the new address proves itself, every session
    /// ends, the old address's codes go, and `notice` (sealed, for the old
    /// address) is queued, in one transaction. Nothing changes when the new
    /// email has an account ([`EmailChange::Taken`]).
    pub async fn change_email(
        &self,
        id: &str,
        new_email: &str,
        notice: &[u8],
        now: i64,
        actor: &str,
    ) -> StoreResult<EmailChange> {
        db_op!(self, "change_email", conn => {
            let mut tx = conn.begin().await?;
            let old: Option<(String,)> = sqlx::query_as("SELECT email FROM users WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((old,)) = old else {
                return Ok(EmailChange::NoUser);
            };
            let taken: Option<(String,)> = sqlx::query_as("SELECT id FROM users WHERE email = $1")
                .bind(new_email)
                .fetch_optional(&mut *tx)
                .await?;
            if taken.is_some() {
                return Ok(EmailChange::Taken);
            }
            sqlx::query(
                "UPDATE users SET email = $2, email_verified_at = NULL, email_changed_at = $3, updated_at = $3 \
                 WHERE id = $1",
            )
            .bind(id)
            .bind(new_email)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            // The codes of both addresses: the old one's are no longer the
            // account's, and a code left at the new one (an earlier sign-up's,
            // with its pending password) must not activate anything on it.
            sqlx::query("DELETE FROM codes WHERE email = $1 OR email = $2")
                .bind(&old)
                .bind(new_email)
                .execute(&mut *tx)
                .await?;
            let ended = revoke_user_sessions!(tx, id, None, "email_changed", now);
            sqlx::query(INSERT_OUTBOX)
                .bind(notice)
                .bind(now)
                .bind(&super::outbox::recipient(&old)[..])
                .execute(&mut *tx)
                .await?;
            record_event!(tx, &Event::new("user.updated", now).user(id).actor(actor).reason("email"));
            tx.commit().await?;
            Ok(EmailChange::Changed { old, ended })
        })
    }

    /// Erases an account: the user, its sessions and refresh tokens (by
    /// cascade; each live session's `session.ended` recorded first) and its
    /// codes, in one transaction. Returns the sessions that
    /// were live (to revoke their access tokens), or `None` if there is no
    /// such account.
    pub async fn delete_user(&self, id: &str, now: i64, actor: &str) -> StoreResult<Option<Vec<String>>> {
        db_op!(self, "delete_user", conn => {
            let mut tx = conn.begin().await?;
            let email: Option<(String,)> = sqlx::query_as("SELECT email FROM users WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((email,)) = email else {
                return Ok(None);
            };
            let live: Vec<(String,)> = sqlx::query_as(
                "SELECT id FROM sessions WHERE user_id = $1 AND revoked_at IS NULL AND expires_at > $2",
            )
            .bind(id)
            .bind(now)
            .fetch_all(&mut *tx)
            .await?;
            // Each live session ends on the record before it goes, so that
            // the applications holding one are told (back-channel logout,
            // queued with its `sid` while the session is still there).
            for (sid,) in &live {
                record_event!(tx, &Event::new("session.ended", now).user(id).session(sid).reason("user_deleted"));
            }
            sqlx::query("DELETE FROM codes WHERE email = $1")
                .bind(&email)
                .execute(&mut *tx)
                .await?;
            // Mail still waiting for it (a code, a notice) goes too.
            sqlx::query("DELETE FROM outbox WHERE recipient = $1")
                .bind(&super::outbox::recipient(&email)[..])
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM users WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            // The trail keeps the id only: its events hold no email or
            // name, and the client addresses they recorded go now.
            sqlx::query("UPDATE events SET ip = NULL WHERE user_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            record_event!(tx, &Event::new("user.deleted", now).user(id).actor(actor));
            tx.commit().await?;
            Ok(Some(live.into_iter().map(|r| r.0).collect()))
        })
    }

    /// Deletes accounts never verified whose last registration is older than
    /// `before`, with their verification codes (their sessions go by cascade).
    pub async fn purge_unverified_users(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_unverified_users", conn => {
            let mut tx = conn.begin().await?;
            // Their verification codes first (codes are keyed by email, with
            // no reference to the account): a code left with its pending
            // password would wait for the next account at that address.
            sqlx::query(
                "DELETE FROM codes WHERE purpose = 'verify_email' AND email IN (SELECT email FROM users \
                 WHERE email_verified_at IS NULL AND email_changed_at IS NULL AND updated_at < $1)",
            )
            .bind(before)
            .execute(&mut *tx)
            .await?;
            let n = sqlx::query(
                "DELETE FROM users WHERE email_verified_at IS NULL AND email_changed_at IS NULL AND updated_at < $1",
            )
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            Ok(n)
        })
    }

    /// Emails of accounts changed at or after `since` (ms): the safety net
    /// under the "user changed" events of the user caches.
    pub async fn users_changed_since(&self, since: i64) -> StoreResult<Vec<String>> {
        let rows: Vec<(String,)> = db_op!(self, "users_changed_since", conn => Ok(sqlx::query_as(
            "SELECT email FROM users WHERE updated_at >= $1",
        )
        .bind(since)
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    /// Replaces the hash only if it is still `old` (a concurrent change wins).
    pub async fn upgrade_password_hash(
        &self,
        user_id: &str,
        old: &str,
        new: &str,
        now: i64,
    ) -> StoreResult<bool> {
        let n = db_op!(self, "upgrade_password_hash", conn => Ok(sqlx::query(
            "UPDATE users SET password_hash = $3, updated_at = $4 WHERE id = $1 AND password_hash = $2",
        )
        .bind(user_id)
        .bind(old)
        .bind(new)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    /// Sets a new password and revokes the user's sessions but those it
    /// keeps, in one transaction, only if the hash is still `old`. Returns the
    /// revoked session ids, or `None` when the password changed concurrently.
    pub async fn change_password(
        &self,
        user_id: &str,
        old: &str,
        new: &str,
        keep: super::KeepSessions<'_>,
        now: i64,
    ) -> StoreResult<Option<Vec<String>>> {
        use super::KeepSessions;
        db_op!(self, "change_password", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE users SET password_hash = $3, updated_at = $4 WHERE id = $1 AND password_hash = $2",
            )
            .bind(user_id)
            .bind(old)
            .bind(new)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            let ids = match keep {
                KeepSessions::None => revoke_user_sessions!(tx, user_id, None, "password_change", now),
                KeepSessions::Only(id) => revoke_user_sessions!(tx, user_id, Some(id), "password_change", now),
                KeepSessions::All => {
                    super::sessions::end_pending_logins!(tx, user_id);
                    Vec::new()
                }
            };
            record_event!(tx, &Event::new("password.changed", now).user(user_id));
            tx.commit().await?;
            Ok(Some(ids))
        })
    }
}

/// An account brought from another system (or made by an administrator).
#[derive(Clone)]
pub struct ImportedUser {
    pub id: String,
    pub email: String,
    pub name: Option<String>,
    /// argon2id of ours, or a hash of another system (`domain::legacy`).
    pub password_hash: String,
    pub verified_at: Option<i64>,
    pub created_at: i64,
    /// Disabled in the system it comes from (an export of latchkey's): the
    /// account is disabled here too. An import never enables one (that is
    /// the admin API's, with its event).
    pub disabled: bool,
    /// Its second factors (an export of latchkey's, version 3), confirmed,
    /// TOTP secrets sealed here; their `user_id` is set as they are stored.
    /// When given, they replace an updated account's factors if it is the
    /// same account (its id); when not, an update leaves them as they are
    /// (an import never weakens an account). One another account here
    /// holds refuses the account ([`ImportOutcome::Refused`]).
    pub factors: Vec<super::FactorRecord>,
    /// Its unused recovery codes' keyed hashes. They are keyed to the
    /// account's id as well: stored only when the account keeps `id`
    /// (created with it, or updated with its factors and holding it).
    pub recovery_codes: Vec<Vec<u8>>,
}

/// What importing did with one account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportOutcome {
    Created,
    /// The email existed; its name, password hash and verification were
    /// replaced and its sessions ended (`update` only).
    Updated,
    /// The email existed and was left as it was.
    Skipped,
    /// Left out: a factor's id or passkey is another account's here (the
    /// same person under another address, most likely). Nothing written.
    Refused,
}

/// Stores an imported account's factors and recovery codes (an
/// [`ImportedUser`]'s) for the account `$u.id`, on the transaction `$tx`.
macro_rules! import_factors {
    ($tx:expr, $u:expr, $now:expr) => {
        for f in &$u.factors {
            sqlx::query(
                "INSERT INTO factors (id, user_id, kind, name, secret, last_step, credential, credential_id, \
                 passwordless, created_at, confirmed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(&f.id)
            .bind(&$u.id)
            .bind(&f.kind)
            .bind(&f.name)
            .bind(&f.secret)
            .bind(f.last_step)
            .bind(&f.credential)
            .bind(&f.credential_id)
            .bind(f.passwordless)
            .bind(f.created_at)
            .bind(f.confirmed_at)
            .execute(&mut *$tx)
            .await?;
        }
        for hash in &$u.recovery_codes {
            sqlx::query("INSERT INTO recovery_codes (user_id, code_hash, created_at) VALUES ($1, $2, $3)")
                .bind(&$u.id)
                .bind(hash)
                .bind($now)
                .execute(&mut *$tx)
                .await?;
        }
    };
}

impl Store {
    /// Imports accounts in one transaction: new emails are created; an
    /// existing email is left alone, or with `update` takes the imported
    /// name, hash and verification, and its sessions end. Returns each
    /// account's outcome and the sessions that ended.
    pub async fn import_users(
        &self,
        users: &[ImportedUser],
        update: bool,
        now: i64,
        actor: &str,
    ) -> StoreResult<(Vec<ImportOutcome>, Vec<String>)> {
        db_op!(self, "import_users", conn => {
            let mut tx = conn.begin().await?;
            let mut outcomes = Vec::with_capacity(users.len());
            let mut ended = Vec::new();
            for u in users {
                // A factor that another account here holds (its id, or its
                // passkey) refuses the account: never moved or cloned.
                let mut held = 0;
                for f in &u.factors {
                    let (n,): (i64,) = sqlx::query_as(
                        "SELECT COUNT(*) FROM factors JOIN users ON users.id = factors.user_id \
                         WHERE users.email <> $1 AND (factors.id = $2 OR factors.credential_id = $3)",
                    )
                    .bind(&u.email)
                    .bind(&f.id)
                    .bind(&f.credential_id)
                    .fetch_one(&mut *tx)
                    .await?;
                    held += n;
                }
                if held > 0 {
                    outcomes.push(ImportOutcome::Refused);
                    continue;
                }
                // An id from an export may be taken here: by another address,
                // or by an account since deleted (its events name it). The
                // account then comes in under a new one, without the
                // recovery codes keyed to the old.
                let (taken,): (i64,) = sqlx::query_as(
                    "SELECT (SELECT COUNT(*) FROM users WHERE id = $1 AND email <> $2) \
                     + (SELECT COUNT(*) FROM events WHERE user_id = $1 AND NOT EXISTS (SELECT 1 FROM users WHERE id = $1))",
                )
                .bind(&u.id)
                .bind(&u.email)
                .fetch_one(&mut *tx)
                .await?;
                let renamed = (taken > 0).then(|| ImportedUser {
                    id: uuid::Uuid::now_v7().to_string(),
                    recovery_codes: Vec::new(),
                    ..u.clone()
                });
                let u = renamed.as_ref().unwrap_or(u);
                let user_id = u.id.as_str();
                let created = sqlx::query(
                    "INSERT INTO users (id, email, name, password_hash, email_verified_at, created_at, updated_at, imported_at, \
                     disabled_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8) ON CONFLICT (email) DO NOTHING",
                )
                .bind(user_id)
                .bind(&u.email)
                .bind(&u.name)
                .bind(&u.password_hash)
                .bind(u.verified_at)
                .bind(u.created_at)
                .bind(now)
                .bind(u.disabled.then_some(now))
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                // A code left at the address (an earlier sign-up's, with its
                // pending password) must not activate anything on the
                // account that is now the import's.
                let drop_codes = sqlx::query("DELETE FROM codes WHERE email = $1 AND purpose = 'verify_email'")
                    .bind(&u.email);
                if created {
                    drop_codes.execute(&mut *tx).await?;
                    import_factors!(tx, u, now);
                    let e = Event::new("user.imported", now).user(user_id).actor(actor).reason("created");
                    record_event!(tx, &e);
                    outcomes.push(ImportOutcome::Created);
                    continue;
                }
                if !update {
                    outcomes.push(ImportOutcome::Skipped);
                    continue;
                }
                let id: (String,) = sqlx::query_as(
                    "UPDATE users SET name = $2, password_hash = $3, email_verified_at = $4, updated_at = $5, \
                     imported_at = $5, disabled_at = COALESCE(disabled_at, $6) WHERE email = $1 RETURNING id",
                )
                .bind(&u.email)
                .bind(&u.name)
                .bind(&u.password_hash)
                .bind(u.verified_at)
                .bind(now)
                .bind(u.disabled.then_some(now))
                .fetch_one(&mut *tx)
                .await?;
                drop_codes.execute(&mut *tx).await?;
                // The file's factors replace the account's only when it is
                // the same account (its id): never another's factors, and
                // never none.
                if !u.factors.is_empty() && id.0 == u.id {
                    for table in ["factors", "recovery_codes", "mfa_challenges"] {
                        sqlx::query(&format!("DELETE FROM {table} WHERE user_id = $1"))
                            .bind(&id.0)
                            .execute(&mut *tx)
                            .await?;
                    }
                    import_factors!(tx, u, now);
                }
                ended.extend(revoke_user_sessions!(tx, &id.0, None, "imported", now));
                let e = Event::new("user.imported", now).user(&id.0).actor(actor).reason("updated");
                record_event!(tx, &e);
                outcomes.push(ImportOutcome::Updated);
            }
            tx.commit().await?;
            Ok((outcomes, ended))
        })
    }
}
