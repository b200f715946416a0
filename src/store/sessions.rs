//! Sessions (refresh-token families) and their refresh tokens.

use sqlx::Connection;

use super::events::record_event;
use super::{acquire, db_op, traced, Db, Store, StoreError, StoreResult};

/// A session to start, with the hash of its first refresh token.
pub struct NewSession<'a> {
    pub id: &'a str,
    pub user_id: &'a str,
    pub client_id: Option<&'a str>,
    pub now: i64,
    pub expires_at: i64,
    pub token_hash: &'a [u8],
    /// Where it started: the client's `User-Agent` and address.
    pub user_agent: Option<&'a str>,
    pub ip: Option<&'a str>,
    /// How the user authenticated (RFC 8176 methods, space-separated), and
    /// when (Unix milliseconds).
    pub amr: &'a str,
    pub auth_time: i64,
    /// Whether that included a second factor. Without one, the session
    /// starts only if the account has no factor: the check is part of the
    /// insert, so a factor confirmed meanwhile is never skipped.
    pub second_factor: bool,
    /// An OAuth client's session: the scope it was granted, and the
    /// browser session it was started from (which takes it along when it
    /// ends).
    pub scope: Option<&'a str>,
    pub parent_id: Option<&'a str>,
}

/// Whether a session started, and why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStart {
    Started,
    /// The account is disabled (or gone).
    Disabled,
    /// The account has a second factor the login has not passed.
    FactorRequired,
}

impl NewSession<'_> {
    /// Its `session.created` event (the client id as the reason).
    pub(super) fn event(&self) -> super::Event<'_> {
        super::Event::new("session.created", self.now)
            .user(self.user_id)
            .session(self.id)
            .ip(self.ip)
            .reason(self.client_id.unwrap_or("latchkey"))
    }
}

/// A live session as its user sees it (no token, no hash).
#[derive(Clone, Debug)]
pub struct SessionRecord {
    pub id: String,
    pub client_id: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    /// Its newest refresh token's creation: the last refresh, or the start.
    pub last_used_at: i64,
    pub user_agent: Option<String>,
    pub ip: Option<String>,
    /// How it was authenticated (RFC 8176 methods, space-separated).
    pub amr: String,
}

/// Which of a user's sessions a password change leaves live.
#[derive(Clone, Copy, Debug)]
pub enum KeepSessions<'a> {
    /// None: every session ends.
    None,
    /// Only this one (the session that changed the password).
    Only(&'a str),
    /// All of them.
    All,
}

/// A user never sees more sessions than this at once (newest first).
pub const MAX_LISTED_SESSIONS: i64 = 500;

/// A refresh token and the session it belongs to (the columns of
/// `refresh_record!`).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct RefreshRecord {
    #[sqlx(rename = "id")]
    pub session_id: String,
    pub user_id: String,
    pub email: String,
    pub client_id: Option<String>,
    #[sqlx(rename = "expires_at")]
    pub session_expires_at: i64,
    #[sqlx(rename = "revoked")]
    pub session_revoked_at: Option<i64>,
    pub rotated_at: Option<i64>,
    pub successor: Option<Vec<u8>>,
    /// How and when the session was authenticated: every token of it says so.
    pub amr: String,
    pub auth_time: i64,
    /// The scope an OAuth client's session was granted (`None`: first-party).
    pub scope: Option<String>,
}

/// What `rotate_live_refresh` is asked: exchange `old` for `new` (its
/// hash), storing `successor` (the new token sealed under the old one).
/// Owned, so that on SQLite it can wait in the group commit's queue.
pub struct LiveRotation {
    pub old: [u8; 32],
    pub new: [u8; 32],
    pub successor: Vec<u8>,
    pub session_id: String,
    pub client_id: Option<String>,
    pub now: i64,
}

/// The columns of a `RefreshRecord`, from token `r`, session `s` and
/// account `u` (`refresh_record_from!`). A disabled account's sessions count
/// as revoked when it was disabled, whatever a login racing the disable
/// left behind.
macro_rules! refresh_record {
    () => {
        "s.id, s.user_id, u.email, s.client_id, s.expires_at, COALESCE(s.revoked_at, u.disabled_at) AS revoked, \
         r.rotated_at, r.successor, s.amr, COALESCE(s.auth_time, s.created_at) AS auth_time, s.scope"
    };
}

/// The tables of `refresh_record!`'s columns, the token's hash `$1`.
macro_rules! refresh_record_from {
    () => {
        " FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id JOIN users u ON u.id = s.user_id \
         WHERE r.token_hash = $1"
    };
}

/// `refresh_record!`'s columns, for SQL built at run time.
pub(super) const REFRESH_COLUMNS: &str = refresh_record!();

/// What `rotate_live_refresh` reads: the record, and whether this call
/// exchanged the token.
#[derive(sqlx::FromRow)]
pub(super) struct Rotated {
    #[sqlx(flatten)]
    rec: RefreshRecord,
    rotated: bool,
}

pub(super) const INSERT_REFRESH: &str =
    "INSERT INTO refresh_tokens (token_hash, session_id, created_at) VALUES ($1, $2, $3)";

/// The condition for a session of `$2` to start (`$9`: a second factor was
/// passed): an account that is not disabled, and either a second factor or
/// none to pass.
pub(super) const MAY_START: &str = "EXISTS (SELECT 1 FROM users WHERE id = $2 AND disabled_at IS NULL) \
     AND ($9 OR NOT EXISTS (SELECT 1 FROM factors WHERE user_id = $2 AND confirmed_at IS NOT NULL))";

/// A session started from another (`$12`, an application's session from
/// the browser's) starts only while that one is live...
pub(super) const PARENT_LIVE: &str = "($12 IS NULL OR EXISTS (SELECT 1 FROM sessions p \
     WHERE p.id = $12 AND p.revoked_at IS NULL AND p.expires_at > $4))";

/// ... and ends no later than it (`$5`: the session's own expiry).
pub(super) const CHILD_EXPIRY: &str =
    "CASE WHEN $12 IS NULL THEN $5 ELSE (SELECT CASE WHEN p.expires_at < $5 \
     THEN p.expires_at ELSE $5 END FROM sessions p WHERE p.id = $12) END";

/// Inserts a session and its first refresh token in the open transaction
/// `$tx` (either backend: the statements are the same), if it may start
/// ([`MAY_START`]); evaluates to a [`SessionStart`]. The check is part of
/// the insert, so a disable or a factor committed before it cannot be missed.
macro_rules! insert_session {
    ($tx:expr, $s:expr) => {{
        let s: &$crate::store::NewSession<'_> = $s;
        let n = sqlx::query(&format!(
            "INSERT INTO sessions (id, user_id, client_id, created_at, expires_at, user_agent, ip, amr, auth_time, \
             scope, parent_id) SELECT $1, $2, $3, $4, {}, $6, $7, $8, $10, $11, $12 WHERE {} AND {}",
            $crate::store::sessions::CHILD_EXPIRY,
            $crate::store::sessions::MAY_START,
            $crate::store::sessions::PARENT_LIVE,
        ))
        .bind(s.id)
        .bind(s.user_id)
        .bind(s.client_id)
        .bind(s.now)
        .bind(s.expires_at)
        .bind(s.user_agent)
        .bind(s.ip)
        .bind(s.amr)
        .bind(s.second_factor)
        .bind(s.auth_time)
        .bind(s.scope)
        .bind(s.parent_id)
        .execute(&mut *$tx)
        .await?
        .rows_affected();
        if n == 1 {
            sqlx::query($crate::store::sessions::INSERT_REFRESH)
                .bind(s.token_hash)
                .bind(s.id)
                .bind(s.now)
                .execute(&mut *$tx)
                .await?;
            $crate::store::events::record_event!($tx, &s.event());
            $crate::store::SessionStart::Started
        } else {
            $crate::store::sessions::why_not_started!($tx, s.user_id)
        }
    }};
}
pub(super) use insert_session;

/// Ends (in transaction `$tx`) the live sessions OAuth clients started from
/// the browser session `$parent` (single sign-on, docs/oidc.md): a session
/// ended ends what it signed in. Their ids.
macro_rules! end_children {
    ($tx:expr, $parent:expr, $now:expr) => {{
        let children: Vec<(String, String)> = sqlx::query_as(
            "UPDATE sessions SET revoked_at = $2, revoked_reason = 'parent_ended' \
             WHERE parent_id = $1 AND revoked_at IS NULL RETURNING id, user_id",
        )
        .bind($parent)
        .bind($now)
        .fetch_all(&mut *$tx)
        .await?;
        for (sid, user) in &children {
            let e = super::Event::new("session.ended", $now)
                .user(user)
                .session(sid)
                .reason("parent_ended");
            record_event!($tx, &e);
        }
        children.into_iter().map(|(sid, _)| sid).collect::<Vec<String>>()
    }};
}

/// Why a session of `$user` did not start (on `$conn`): its account is
/// disabled or gone, or it has a factor to pass.
macro_rules! why_not_started {
    ($conn:expr, $user:expr) => {{
        let enabled: Option<(bool,)> = sqlx::query_as("SELECT disabled_at IS NULL FROM users WHERE id = $1")
            .bind($user)
            .fetch_optional(&mut *$conn)
            .await?;
        match enabled {
            Some((true,)) => $crate::store::SessionStart::FactorRequired,
            _ => $crate::store::SessionStart::Disabled,
        }
    }};
}
pub(super) use why_not_started;
/// Ends the logins of user `$user` still waiting for their second factor
/// (on `$conn`): a password change, a reset, a disable or an email change
/// stops the logins begun before it, with the sessions.
macro_rules! end_pending_logins {
    ($conn:expr, $user:expr) => {
        sqlx::query("DELETE FROM mfa_challenges WHERE user_id = $1 AND purpose = 'login'")
            .bind($user)
            .execute(&mut *$conn)
            .await?;
    };
}
pub(super) use end_pending_logins;

/// Revokes every live session of user `$user` but `$keep` (`Option<&str>`)
/// on `$conn` (a connection or an open transaction, either backend), for
/// `$reason`; evaluates to the revoked session ids.
macro_rules! revoke_user_sessions {
    ($conn:expr, $user:expr, $keep:expr, $reason:expr, $now:expr) => {{
        let keep: Option<&str> = $keep;
        let ids: Vec<(String,)> = sqlx::query_as(
            "UPDATE sessions SET revoked_at = $2, revoked_reason = $3 \
             WHERE user_id = $1 AND revoked_at IS NULL AND id <> $4 RETURNING id",
        )
        .bind($user)
        .bind($now)
        .bind($reason)
        .bind(keep.unwrap_or(""))
        .fetch_all(&mut *$conn)
        .await?;
        let ids: Vec<String> = ids.into_iter().map(|r| r.0).collect();
        $crate::store::sessions::end_pending_logins!($conn, $user);
        for id in &ids {
            let e = $crate::store::Event::new("session.ended", $now)
                .user($user)
                .session(id)
                .reason($reason);
            $crate::store::events::record_event!($conn, &e);
        }
        ids
    }};
}
pub(super) use revoke_user_sessions;

/// PostgreSQL: one statement that starts a session (data-modifying CTEs
/// all run, in one transaction): the session, its first refresh token, its
/// event and the event's webhook deliveries (`event_ctes!`). It starts if
/// the account is enabled and a factor was passed or there is none to pass,
/// and `$when` holds over the tables `u` (the account) and `$from`, after
/// the CTEs `$with` (each followed by a comma); it ends at `$expiry`, and
/// selects `$select`. The rows of `$lock` are read FOR SHARE: a disable
/// (or the parent session's end) in flight either commits first (no
/// session) or waits for this one and then ends it with the others.
/// `$1`-`$16` as bound by [`bind_new_session!`].
macro_rules! start_session_statement {
    ($with:literal, $from:literal, $expiry:literal, $when:literal, $lock:literal, $select:literal) => {
        concat!(
            "WITH ",
            $with,
            "s AS (INSERT INTO sessions (id, user_id, client_id, created_at, expires_at, user_agent, ip, amr, \
             auth_time, scope, parent_id) SELECT $1, u.id, $3, $4, ",
            $expiry,
            ", $7, $8, $12, $14, $15, $16 FROM users u",
            $from,
            " WHERE u.id = $2 AND u.disabled_at IS NULL \
             AND ($13 OR NOT EXISTS (SELECT 1 FROM factors f WHERE f.user_id = u.id AND f.confirmed_at IS NOT NULL))",
            $when,
            " FOR SHARE OF ",
            $lock,
            " RETURNING id, user_id, expires_at), \
             r AS (INSERT INTO refresh_tokens (token_hash, session_id, created_at) SELECT $6, id, $4 FROM s), ",
            $crate::store::events::event_ctes!("s", "$4", "$9", "$11", "user_id", "id", "$8", "$10"),
            " SELECT ",
            $select
        )
    };
}
pub(super) use start_session_statement;

/// Binds `$1`-`$16` of [`start_session_statement!`] for session `$s` to
/// query `$q`.
macro_rules! bind_new_session {
    ($q:expr, $s:expr) => {{
        let s: &$crate::store::NewSession<'_> = $s;
        let e = s.event();
        $q.bind(s.id)
            .bind(s.user_id)
            .bind(s.client_id)
            .bind(s.now)
            .bind(s.expires_at)
            .bind(s.token_hash)
            .bind(s.user_agent)
            .bind(s.ip)
            .bind(e.kind)
            .bind(e.reason)
            .bind($crate::store::events::family(e.kind))
            .bind(s.amr)
            .bind(s.second_factor)
            .bind(s.auth_time)
            .bind(s.scope)
            .bind(s.parent_id)
    }};
}
pub(super) use bind_new_session;

impl Store {
    /// Starts a session if it may ([`SessionStart`] says why not): one
    /// statement on PostgreSQL ([`start_session_statement!`]), one local
    /// transaction on SQLite ([`insert_session!`]).
    pub async fn create_session(&self, s: &NewSession<'_>) -> StoreResult<SessionStart> {
        db_op!(self, "create_session",
            sqlite conn => {
                let mut tx = conn.begin().await?;
                let started = insert_session!(tx, s);
                tx.commit().await?;
                Ok(started)
            },
            postgres conn => {
                // An application's session from a browser session starts
                // with its code (`redeem_authorization_code`), which checks
                // and locks the parent.
                debug_assert!(s.parent_id.is_none(), "a session with a parent starts with its code");
                let (created,): (i64,) = bind_new_session!(
                    sqlx::query_as(start_session_statement!("", "", "$5", "", "u", "count(*) FROM s")),
                    s
                )
                .fetch_one(&mut *conn)
                .await?;
                if created == 1 {
                    Ok(SessionStart::Started)
                } else {
                    Ok(why_not_started!(conn, s.user_id))
                }
            },
        )
    }

    pub async fn refresh_token(&self, token_hash: &[u8]) -> StoreResult<Option<RefreshRecord>> {
        db_op!(self, "refresh_token", conn => Ok(sqlx::query_as(
            concat!("SELECT ", refresh_record!(), refresh_record_from!()),
        )
        .bind(token_hash)
        .fetch_optional(&mut *conn)
        .await?))
    }

    /// The refresh token `r.old` and its session as they were, and whether
    /// this call exchanged it for `r.new`: in one statement, it is exchanged
    /// only if it is unexchanged, of session `r.session_id` and of client
    /// `r.client_id`, and that session is neither revoked (nor its account
    /// disabled) nor expired at `r.now`. `None`: no such token. A token
    /// that another caller exchanged at the same moment comes back with
    /// `false`, either as it was before that (PostgreSQL's snapshot: the
    /// caller asks again, `refresh_token`, for the winner's successor) or
    /// already exchanged (SQLite, where the exchanges of a batch run one
    /// after the other).
    pub async fn rotate_live_refresh(&self, r: LiveRotation) -> StoreResult<Option<(RefreshRecord, bool)>> {
        let row = match &self.db {
            // Queued, and committed with the exchanges queued beside it
            // (store/group_commit.rs): the same statements, one transaction.
            Db::Sqlite(pool) => self.group_commit.exchange(pool, r).await?,
            // The record from the statement's snapshot, the exchange
            // (`rotate_refresh`'s) under the conditions above; of two
            // concurrent callers the update re-checks `rotated_at IS NULL`
            // on the row the other left, so exactly one exchanges.
            Db::Postgres(pool) => {
                traced("rotate_live_refresh", async {
                    let mut conn = acquire(pool).await?;
                    let out = sqlx::query_as(concat!(
                        "WITH rec AS (SELECT ", refresh_record!(), refresh_record_from!(), "), \
                         rot AS (UPDATE refresh_tokens SET rotated_at = $2, successor = $3 \
                         WHERE token_hash = $1 AND rotated_at IS NULL AND EXISTS (SELECT 1 FROM rec \
                         WHERE rec.id = $5 AND rec.client_id IS NOT DISTINCT FROM $6 AND rec.revoked IS NULL AND rec.expires_at > $2) \
                         RETURNING session_id), \
                         ins AS (INSERT INTO refresh_tokens (token_hash, session_id, created_at) SELECT $4, session_id, $2 FROM rot RETURNING 1) \
                         SELECT rec.*, EXISTS (SELECT 1 FROM ins) AS rotated FROM rec",
                    ))
                    .bind(&r.old[..])
                    .bind(r.now)
                    .bind(&r.successor[..])
                    .bind(&r.new[..])
                    .bind(r.session_id.as_str())
                    .bind(r.client_id.as_deref())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(StoreError::from);
                    pool.release(conn, out.is_ok());
                    out
                })
                .await?
            }
        };
        Ok(row.map(|Rotated { mut rec, rotated }| {
            if rotated {
                // As it was before this call (SQLite read it after).
                (rec.rotated_at, rec.successor) = (None, None);
            }
            (rec, rotated)
        }))
    }

    /// Exchanges `old` for `new` if `old` has not been exchanged yet: the
    /// conditional update is the lock, so of concurrent callers exactly one
    /// wins (`true`); the others read the successor the winner stored.
    pub async fn rotate_refresh(
        &self,
        old: &[u8],
        new: &[u8],
        successor: &[u8],
        now: i64,
    ) -> StoreResult<bool> {
        db_op!(self, "rotate_refresh",
            // One statement on each backend, so one round trip (on SQLite
            // a transaction would be four trips to its worker thread, each
            // holding the one connection): SQLite has no INSERT inside a
            // CTE, so its statement inserts two rows computed from the old
            // one while it is unexchanged, the successor and the old row
            // again; the old row's key exists, so that row becomes the
            // update of `ON CONFLICT` (rotated, with the sealed successor).
            // Two rows changed: exchanged; none: it was exchanged already (or
            // the new token's hash exists, which a 256-bit random token never
            // meets; the exchange then fails closed, as a unique-key error
            // does on PostgreSQL).
            sqlite conn => {
                let n = sqlx::query(
                    "INSERT INTO refresh_tokens (token_hash, session_id, created_at, rotated_at, successor) \
                     SELECT $4, session_id, $2, NULL, NULL FROM refresh_tokens WHERE token_hash = $1 AND rotated_at IS NULL \
                     AND NOT EXISTS (SELECT 1 FROM refresh_tokens WHERE token_hash = $4) \
                     UNION ALL \
                     SELECT token_hash, session_id, created_at, $2, $3 FROM refresh_tokens \
                     WHERE token_hash = $1 AND rotated_at IS NULL \
                     AND NOT EXISTS (SELECT 1 FROM refresh_tokens WHERE token_hash = $4) \
                     ON CONFLICT (token_hash) DO UPDATE SET rotated_at = excluded.rotated_at, successor = excluded.successor \
                     WHERE refresh_tokens.token_hash = $1 AND refresh_tokens.rotated_at IS NULL",
                )
                .bind(old)
                .bind(now)
                .bind(successor)
                .bind(new)
                .execute(&mut *conn)
                .await?
                .rows_affected();
                Ok(n == 2)
            },
            postgres conn => {
                let n = sqlx::query(
                    "WITH r AS (UPDATE refresh_tokens SET rotated_at = $2, successor = $3 \
                     WHERE token_hash = $1 AND rotated_at IS NULL RETURNING session_id) \
                     INSERT INTO refresh_tokens (token_hash, session_id, created_at) SELECT $4, session_id, $2 FROM r",
                )
                .bind(old)
                .bind(now)
                .bind(successor)
                .bind(new)
                .execute(&mut *conn)
                .await?
                .rows_affected();
                Ok(n == 1)
            },
        )
    }

    /// Revokes one session, with its event (`session.reuse_detected` for
    /// the reason `refresh_reuse`, else `session.ended`); `true` if it was live.
    pub async fn revoke_session(&self, session_id: &str, reason: &str, now: i64) -> StoreResult<Vec<String>> {
        let kind = if reason == "refresh_reuse" {
            "session.reuse_detected"
        } else {
            "session.ended"
        };
        db_op!(self, "revoke_session", conn => {
            let mut tx = conn.begin().await?;
            let user: Option<(String,)> = sqlx::query_as(
                "UPDATE sessions SET revoked_at = $2, revoked_reason = $3 WHERE id = $1 AND revoked_at IS NULL \
                 RETURNING user_id",
            )
            .bind(session_id)
            .bind(now)
            .bind(reason)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((user,)) = user else {
                return Ok(Vec::new());
            };
            let e = super::Event::new(kind, now).user(&user).session(session_id).reason(reason);
            record_event!(tx, &e);
            let mut ended = vec![session_id.to_string()];
            ended.extend(end_children!(tx, session_id, now));
            tx.commit().await?;
            Ok(ended)
        })
    }

    /// The user's live sessions (neither revoked nor expired), newest first,
    /// at most [`MAX_LISTED_SESSIONS`].
    pub async fn live_sessions(&self, user_id: &str, now: i64) -> StoreResult<Vec<SessionRecord>> {
        type Row = (
            String,
            Option<String>,
            i64,
            i64,
            Option<i64>,
            Option<String>,
            Option<String>,
            String,
        );
        let rows: Vec<Row> = db_op!(self, "live_sessions", conn => Ok(sqlx::query_as(
            "SELECT s.id, s.client_id, s.created_at, s.expires_at, \
             (SELECT MAX(r.created_at) FROM refresh_tokens r WHERE r.session_id = s.id), s.user_agent, s.ip, s.amr \
             FROM sessions s WHERE s.user_id = $1 AND s.revoked_at IS NULL AND s.expires_at > $2 \
             ORDER BY s.created_at DESC, s.id LIMIT $3",
        )
        .bind(user_id)
        .bind(now)
        .bind(MAX_LISTED_SESSIONS)
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows
            .into_iter()
            .map(|r| SessionRecord {
                id: r.0,
                client_id: r.1,
                created_at: r.2,
                expires_at: r.3,
                last_used_at: r.4.unwrap_or(r.2),
                user_agent: r.5,
                ip: r.6,
                amr: r.7,
            })
            .collect())
    }

    /// Revokes one of the user's live sessions; `false` if it is not one
    /// (another user's, unknown, already ended or expired).
    pub async fn revoke_user_session(
        &self,
        user_id: &str,
        session_id: &str,
        reason: &str,
        now: i64,
    ) -> StoreResult<Vec<String>> {
        db_op!(self, "revoke_user_session", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE sessions SET revoked_at = $3, revoked_reason = $4 \
                 WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL AND expires_at > $3",
            )
            .bind(session_id)
            .bind(user_id)
            .bind(now)
            .bind(reason)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(Vec::new());
            }
            let e = super::Event::new("session.ended", now).user(user_id).session(session_id).reason(reason);
            record_event!(tx, &e);
            let mut ended = vec![session_id.to_string()];
            ended.extend(end_children!(tx, session_id, now));
            tx.commit().await?;
            Ok(ended)
        })
    }

    /// Revokes every live session of the user but `keep` (if any); returns
    /// the revoked ids. `actor`: the admin client that asked, recorded as
    /// `user.sessions_ended`.
    pub async fn revoke_user_sessions(
        &self,
        user_id: &str,
        keep: Option<&str>,
        reason: &str,
        now: i64,
        actor: Option<&str>,
    ) -> StoreResult<Vec<String>> {
        db_op!(self, "revoke_user_sessions", conn => {
            let mut tx = conn.begin().await?;
            let ids = revoke_user_sessions!(tx, user_id, keep, reason, now);
            if let Some(actor) = actor {
                record_event!(tx, &super::Event::new("user.sessions_ended", now).user(user_id).actor(actor));
            }
            tx.commit().await?;
            Ok(ids)
        })
    }

    /// Revokes every live session of the user that began with a sign-in
    /// through an upstream provider (its `amr` starts with `fed`: the
    /// sessions of its browser and of the applications it signed in to),
    /// after that upstream's back-channel logout, and the sign-ins of the
    /// user still in flight; returns the revoked ids.
    pub async fn revoke_federated_sessions(&self, user_id: &str, now: i64) -> StoreResult<Vec<String>> {
        let reason = "upstream_logout";
        db_op!(self, "revoke_federated_sessions", conn => {
            let mut tx = conn.begin().await?;
            let ids: Vec<(String,)> = sqlx::query_as(
                "UPDATE sessions SET revoked_at = $2, revoked_reason = $3 \
                 WHERE user_id = $1 AND revoked_at IS NULL AND expires_at > $2 \
                 AND (amr = 'fed' OR amr LIKE 'fed %') RETURNING id",
            )
            .bind(user_id)
            .bind(now)
            .bind(reason)
            .fetch_all(&mut *tx)
            .await?;
            // Nor may a sign-in in flight finish: one waiting for its second
            // factor, an application's code not yet redeemed.
            sqlx::query("DELETE FROM mfa_challenges WHERE user_id = $1 AND purpose IN ('login', 'upstream_code')")
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
            let ids: Vec<String> = ids.into_iter().map(|r| r.0).collect();
            for id in &ids {
                let e = super::Event::new("session.ended", now).user(user_id).session(id).reason(reason);
                super::events::record_event!(tx, &e);
            }
            tx.commit().await?;
            Ok(ids)
        })
    }

    /// Sessions revoked after `since`, to rebuild the revocation set at start.
    pub async fn revoked_sessions_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>> {
        db_op!(self, "revoked_sessions_since", conn => Ok(sqlx::query_as(
            "SELECT id, revoked_at FROM sessions WHERE revoked_at IS NOT NULL AND revoked_at > $1 \
             UNION ALL SELECT sid, revoked_at FROM revoked_sids WHERE revoked_at > $1",
        )
        .bind(since)
        .fetch_all(&mut *conn)
        .await?))
    }

    /// Whether the session exists and is neither revoked nor expired.
    pub async fn session_is_live(&self, session_id: &str, now: i64) -> StoreResult<bool> {
        let row: Option<(i64,)> = db_op!(self, "session_is_live", conn => Ok(sqlx::query_as(
            "SELECT expires_at FROM sessions WHERE id = $1 AND revoked_at IS NULL",
        )
        .bind(session_id)
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(matches!(row, Some((exp,)) if exp > now))
    }

    /// Deletes sessions (and, by cascade, their tokens) that ended before `before`.
    pub async fn purge_sessions(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_sessions", conn => {
            sqlx::query("DELETE FROM revoked_sids WHERE revoked_at < $1")
                .bind(before)
                .execute(&mut *conn)
                .await?;
            Ok(sqlx::query(
                "DELETE FROM sessions WHERE expires_at < $1 OR (revoked_at IS NOT NULL AND revoked_at < $1)",
            )
            .bind(before)
            .execute(&mut *conn)
            .await?
            .rows_affected())
        })
    }
}
