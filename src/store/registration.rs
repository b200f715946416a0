//! The state a registration is decided on, and the writes of the decision
//! (`domain::registration`): read without locks, written in one transaction
//! only if the state is still the one read (compare-and-set), so that two
//! registrations of one email at once are told apart by the domain, never
//! by branches here.

use sqlx::Connection;

use super::events::record_event;
use super::outbox::INSERT_OUTBOX;
use super::{db_op, Event, Store, StoreResult};

/// The account an email names, as a registration sees it (from its three
/// timestamps: verified, moved to the address by an admin, created or
/// imported by an admin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountState {
    /// No account has the email.
    None,
    /// A sign-up not yet verified: until its code is used, the one who
    /// proves the mailbox decides whose it is.
    Unfinished { id: String },
    /// Somebody's, with its own password: verified, or held unverified for
    /// its owner (an admin moved it to the address, created or imported it).
    Owned { id: String, verified: bool },
}

impl AccountState {
    fn of(id: String, verified: bool, held: bool) -> AccountState {
        if verified || held {
            AccountState::Owned { id, verified }
        } else {
            AccountState::Unfinished { id }
        }
    }
}

/// The email's verification code while it is unused (expired or not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveCode {
    /// The password hash of the registration it would activate (none: a
    /// shadow, or the code of an account that keeps its own password).
    pub pending: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub failures: i32,
    /// Another registration's code was live when this one was issued.
    pub contested: bool,
}

/// What a registration of an email is decided on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistrationState {
    pub account: AccountState,
    pub live: Option<LiveCode>,
}

/// A registration's new code, and the mail that carries it.
pub struct CodeWrite<'a> {
    pub code_hash: &'a [u8],
    pub expires_at: i64,
    /// `None`: a shadow (no registration's credentials on it).
    pub pending: Option<(&'a str, Option<&'a str>)>,
    pub contested: bool,
    pub message: &'a [u8],
}

/// The writes of a decision.
pub enum RegistrationWrite<'a> {
    /// A new account (`id`, password hash, name) and its code.
    Create {
        id: &'a str,
        password_hash: &'a str,
        name: Option<&'a str>,
        ip: Option<&'a str>,
        code: CodeWrite<'a>,
    },
    /// The unfinished sign-up `id` takes this registration's password hash
    /// and name, and the code (which carries them, pending, too).
    Replace {
        id: &'a str,
        password_hash: &'a str,
        name: Option<&'a str>,
        code: CodeWrite<'a>,
    },
    /// A notice to the address: carried by `shadow` (a code in place of the
    /// live one, which no registration's credentials are on), or, without
    /// one, mailed alone and the code left as it is.
    Notice {
        message: &'a [u8],
        shadow: Option<CodeWrite<'a>>,
    },
}

/// The columns of a user row a registration reads.
const ACCOUNT: &str = "SELECT id, email_verified_at IS NOT NULL, \
     (email_changed_at IS NOT NULL OR imported_at IS NOT NULL) FROM users WHERE email = $1";
/// The email's verification code if unused (`$2`, the time, is unused: the
/// decision judges expiry).
const LIVE_CODE: &str = "SELECT pending_password_hash, created_at, expires_at, failed_attempts, contested \
     FROM codes WHERE email = $1 AND purpose = 'verify_email' AND consumed_at IS NULL AND $2 = $2";
/// Inserts or replaces the email's verification code: `$1 email, $2 code
/// hash, $3 created at, $4 expires at, $5 pending hash, $6 pending name,
/// $7 contested`.
const PUT_CODE: &str = "INSERT INTO codes \
     (email, purpose, code_hash, created_at, expires_at, failed_attempts, consumed_at, \
      pending_password_hash, pending_name, contested) \
     VALUES ($1, 'verify_email', $2, $3, $4, 0, NULL, $5, $6, $7) \
     ON CONFLICT (email, purpose) DO UPDATE SET code_hash = excluded.code_hash, \
     created_at = excluded.created_at, expires_at = excluded.expires_at, failed_attempts = 0, \
     consumed_at = NULL, pending_password_hash = excluded.pending_password_hash, \
     pending_name = excluded.pending_name, contested = excluded.contested";

type AccountRow = (String, bool, bool);
type CodeRow = (Option<String>, i64, i64, i32, i32);

fn state(account: Option<AccountRow>, code: Option<CodeRow>) -> RegistrationState {
    RegistrationState {
        account: account.map_or(AccountState::None, |(id, verified, held)| {
            AccountState::of(id, verified, held)
        }),
        live: code.map(
            |(pending, created_at, expires_at, failures, contested)| LiveCode {
                pending,
                created_at,
                expires_at,
                failures,
                contested: contested != 0,
            },
        ),
    }
}

/// The state of the email `$email` at `$now`, read on `$conn`.
macro_rules! read_state {
    ($conn:expr, $email:expr, $now:expr) => {{
        let account: Option<AccountRow> = sqlx::query_as(ACCOUNT)
            .bind($email)
            .fetch_optional(&mut *$conn)
            .await?;
        let code: Option<CodeRow> = sqlx::query_as(LIVE_CODE)
            .bind($email)
            .bind($now)
            .fetch_optional(&mut *$conn)
            .await?;
        state(account, code)
    }};
}

/// Writes `code` for `email` at `now`, and its mail.
macro_rules! put_code {
    ($tx:expr, $email:expr, $now:expr, $code:expr) => {{
        let c: &CodeWrite<'_> = $code;
        sqlx::query(PUT_CODE)
            .bind($email)
            .bind(c.code_hash)
            .bind($now)
            .bind(c.expires_at)
            .bind(c.pending.map(|p| p.0))
            .bind(c.pending.and_then(|p| p.1))
            .bind(i32::from(c.contested))
            .execute(&mut *$tx)
            .await?;
        sqlx::query(INSERT_OUTBOX)
            .bind(c.message)
            .bind($now)
            .bind(&super::outbox::recipient($email)[..])
            .execute(&mut *$tx)
            .await?;
    }};
}

impl Store {
    /// The account of `email` and its unused verification code (`now`
    /// names the moment of the read).
    pub async fn registration_state(&self, email: &str, now: i64) -> StoreResult<RegistrationState> {
        db_op!(self, "registration_state", conn => Ok(read_state!(conn, email, now)))
    }

    /// Applies `write` if the state of `email` is still `expected` (read
    /// again in the transaction, with the account's row locked by a write
    /// first: registrations and verifications of an email are thus one at a
    /// time), in one transaction: `false`, with nothing written, when it
    /// changed (the caller decides again on the new state).
    pub async fn apply_registration(
        &self,
        email: &str,
        now: i64,
        expected: &RegistrationState,
        write: &RegistrationWrite<'_>,
    ) -> StoreResult<bool> {
        db_op!(self, "apply_registration", conn => {
            let mut tx = conn.begin().await?;
            // Locks the account's row (SQLite: the write lock of the file).
            sqlx::query("UPDATE users SET updated_at = updated_at WHERE email = $1")
                .bind(email)
                .execute(&mut *tx)
                .await?;
            if read_state!(tx, email, now) != *expected {
                tx.rollback().await?;
                return Ok(false);
            }
            match write {
                RegistrationWrite::Create { id, password_hash, name, ip, code } => {
                    let n = sqlx::query(
                        "INSERT INTO users (id, email, name, password_hash, created_at, updated_at) \
                         VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (email) DO NOTHING",
                    )
                    .bind(id)
                    .bind(email)
                    .bind(name)
                    .bind(password_hash)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if n != 1 {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                    put_code!(tx, email, now, code);
                    record_event!(tx, &Event::new("user.registered", now).user(id).ip(*ip));
                }
                RegistrationWrite::Replace { id, password_hash, name, code } => {
                    sqlx::query("UPDATE users SET password_hash = $2, name = $3, updated_at = $4 WHERE id = $1")
                        .bind(id)
                        .bind(password_hash)
                        .bind(name)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    put_code!(tx, email, now, code);
                }
                RegistrationWrite::Notice { message, shadow } => match shadow {
                    Some(shadow) => put_code!(tx, email, now, shadow),
                    None => {
                        sqlx::query(INSERT_OUTBOX)
                            .bind(*message)
                            .bind(now)
                            .bind(&super::outbox::recipient(email)[..])
                            .execute(&mut *tx)
                            .await?;
                    }
                },
            }
            tx.commit().await?;
            Ok(true)
        })
    }
}
