//! The state a registration is decided on, and the writes of the decision
//! (`domain::registration`): read without locks, written in one transaction
//! only if the state is still the one read (compare-and-set), so that two
//! registrations of one email at once are told apart by the domain, never
//! by branches here.

use sqlx::Connection;

use super::codes::{consume_code, Purpose, CONSUME_CODE, UNUSABLE_PASSWORD};
use super::events::record_event;
use super::outbox::INSERT_OUTBOX;
use super::sessions::{insert_session, NewSession};
use super::{db_op, Event, SessionStart, Store, StoreResult};

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
    /// The name the registration gave with it.
    pub pending_name: Option<String>,
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

/// What proving the mailbox with a verification code does to the
/// account's password (decided by `domain::registration::activation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Activation {
    /// The password hash and name of the registration the code carries.
    Credentials { hash: String, name: Option<String> },
    /// Nothing: the account keeps the password it has (the code of an
    /// account that was given one: by an admin, an import, or a reset).
    Keep,
    /// No password: two registrations claimed the address before it was
    /// verified; whoever proves the mailbox chooses one next.
    NoPassword,
}

/// The columns of a user row a registration reads.
const ACCOUNT: &str = "SELECT id, email_verified_at IS NOT NULL, \
     (email_changed_at IS NOT NULL OR imported_at IS NOT NULL) FROM users WHERE email = $1";
/// The email's verification code if unused (`$2`, the time, is unused: the
/// decision judges expiry).
const LIVE_CODE: &str =
    "SELECT pending_password_hash, pending_name, created_at, expires_at, failed_attempts, contested \
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
type CodeRow = (Option<String>, Option<String>, i64, i64, i32, i32);

fn live_code((pending, pending_name, created_at, expires_at, failures, contested): CodeRow) -> LiveCode {
    LiveCode {
        pending,
        pending_name,
        created_at,
        expires_at,
        failures,
        contested: contested != 0,
    }
}

fn state(account: Option<AccountRow>, code: Option<CodeRow>) -> RegistrationState {
    RegistrationState {
        account: account.map_or(AccountState::None, |(id, verified, held)| {
            AccountState::of(id, verified, held)
        }),
        live: code.map(live_code),
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

    /// Verifies account `session.user_id`'s email with the code `expected`
    /// (the email's unused verification code as the caller read it), if
    /// the account is still unverified and the code is still that one
    /// (compare-and-set, with the account's row locked first, as
    /// registration locks it) and usable: applies `activation`, consumes
    /// the code and starts a session, in one transaction. `None` when
    /// anything changed meanwhile (the code was used, replaced or died; a
    /// reset verified the account); `Some(Disabled)` changes nothing;
    /// `Some(FactorRequired)` verifies without a session (the login goes on
    /// with the second factor). With the outcome: whether the account has
    /// a password now.
    pub async fn verify_email(
        &self,
        email: &str,
        expected: &LiveCode,
        activation: &Activation,
        max_failures: i32,
        session: &NewSession<'_>,
    ) -> StoreResult<Option<(SessionStart, bool)>> {
        let now = session.now;
        db_op!(self, "verify_email", conn => {
            let mut tx = conn.begin().await?;
            // Locks the account's row (SQLite: the write lock of the file).
            let n = sqlx::query(
                "UPDATE users SET email_verified_at = $2, updated_at = $2 \
                 WHERE id = $1 AND email = $3 AND email_verified_at IS NULL",
            )
            .bind(session.user_id)
            .bind(now)
            .bind(email)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let live: Option<CodeRow> = sqlx::query_as(LIVE_CODE)
                .bind(email)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            if n != 1 || live.map(live_code).as_ref() != Some(expected) {
                tx.rollback().await?;
                return Ok(None);
            }
            match activation {
                Activation::Credentials { hash, name } => {
                    sqlx::query("UPDATE users SET password_hash = $2, name = $3 WHERE id = $1")
                        .bind(session.user_id)
                        .bind(hash)
                        .bind(name)
                        .execute(&mut *tx)
                        .await?;
                }
                Activation::Keep => {}
                Activation::NoPassword => {
                    sqlx::query("UPDATE users SET password_hash = $2, name = NULL WHERE id = $1")
                        .bind(session.user_id)
                        .bind(UNUSABLE_PASSWORD)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            let (hash,): (String,) = sqlx::query_as("SELECT password_hash FROM users WHERE id = $1")
                .bind(session.user_id)
                .fetch_one(&mut *tx)
                .await?;
            if !consume_code!(tx, email, Purpose::VerifyEmail, expected.created_at, now, max_failures) {
                return Ok(None);
            }
            record_event!(tx, &Event::new("user.verified", now).user(session.user_id).ip(session.ip));
            let started = insert_session!(tx, session);
            if started == SessionStart::Disabled {
                return Ok(Some((started, hash != UNUSABLE_PASSWORD))); // disabled meanwhile: nothing changes
            }
            // With a factor to pass, the email is verified all the same.
            tx.commit().await?;
            Ok(Some((started, hash != UNUSABLE_PASSWORD)))
        })
    }
}
