//! Persistence: one `Store` over SQLite (embedded default) or PostgreSQL.
//!
//! Both backends run the same SQL text: sqlx binds `$1`-style parameters on
//! SQLite too, and the schema (`migrations/{sqlite,postgres}`) has the same
//! tables and columns. The [`db_op!`] macro compiles each query body once per
//! backend, so queries stay typed without `sqlx::Any` and its conversions, and
//! gives every operation its connection (timing the wait for it), its span
//! and its latency histogram.
//! Statements are prepared and cached per connection by sqlx.
//!
//! Query chains (`query(..).bind(..)...execute(..).await?.rows_affected()`)
//! repeat their shape from one operation to the next on purpose: each
//! statement stays next to its binds, in the order of its placeholders,
//! where a reader checks the one against the other; a helper over sqlx's
//! builders would move the binds away from the SQL they fill.

pub mod backup;
mod clients;
mod codes;
mod events;
mod factors;
mod group_commit;
mod keys;
mod oidc;
mod outbox;
mod pool;
mod registration;
mod sealed;
mod sessions;
mod settings;
mod upstreams;
mod users;
mod webhooks;

pub use clients::ClientRecord;
pub use codes::{CodeRecord, NewCode, Purpose, UNUSABLE_PASSWORD};
pub use events::{family, Event, EventFilter, EventRecord, KINDS};
pub use factors::{ChallengeRecord, FactorAdded, FactorChange, FactorRecord};
pub use keys::KeyRecord;
pub use oidc::{AuthorizationCode, ConsentRecord, Redeemed};
pub use outbox::OutboxRow;
pub use registration::{AccountState, Activation, CodeWrite, LiveCode, RegistrationState, RegistrationWrite};
pub use sealed::{KeyringRecord, SealedColumn};
pub use sessions::{
    KeepSessions, LiveRotation, NewSession, RefreshRecord, SessionRecord, SessionStart, MAX_LISTED_SESSIONS,
};
pub use settings::{DatabaseConfig, DatabaseUrl};
pub use upstreams::{IdentityRecord, LinkNotice, UpstreamRecord, UpstreamSignUp};
pub use users::{EmailChange, ImportOutcome, ImportedUser, UserFilter, UserRecord};
pub use webhooks::{Attempted, DeliveryRecord, DeliveryRow, WebhookRecord};

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use tracing::Instrument;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::PgPool;

/// The pool of one backend: sqlx's, with clean connections handed from one
/// operation to the next (`store/pool.rs`); it derefs to sqlx's pool.
#[derive(Clone)]
pub enum Db {
    Sqlite(pool::Pool<sqlx::Sqlite>),
    Postgres(pool::Pool<sqlx::Postgres>),
}

/// Runs one database operation, `$op` (the `op` label of its metrics and
/// spans): in a `db` span, takes a connection from the pool (the wait is
/// `latchkey_db_acquire_seconds`), then evaluates `$body`, a `StoreResult`,
/// with `$conn` bound to that connection (queries run on `&mut *$conn`). A
/// `return` in `$body` returns from the operation. The whole operation,
/// acquire included, is timed into `latchkey_db_query_seconds` as before.
/// A body that returned `Ok` is taken to have run its statements to their
/// end, and its connection is handed to an operation waiting for one
/// without sqlx's test (`store/pool.rs`): so a body never races a statement
/// against a timer or another future. A body that failed, or was
/// cancelled, gives its connection back to sqlx, which tests it.
///
/// One body is compiled once for each backend; an operation whose SQL differs
/// between the backends gives one body for each (`sqlite` first).
macro_rules! db_op {
    ($store:expr, $op:literal, $conn:ident => $body:expr) => {
        $crate::store::db_op!($store, $op, sqlite $conn => $body, postgres $conn => $body)
    };
    ($store:expr, $op:literal, sqlite $sconn:ident => $sqlite:expr, postgres $pconn:ident => $postgres:expr $(,)?) => {
        $crate::store::traced($op, async {
            match &$store.db {
                $crate::store::Db::Sqlite(pool) => {
                    #[allow(unused_mut)]
                    let mut $sconn = $crate::store::acquire(pool).await?;
                    let out: $crate::store::StoreResult<_> = async { $sqlite }.await;
                    pool.release($sconn, out.is_ok());
                    out
                }
                $crate::store::Db::Postgres(pool) => {
                    #[allow(unused_mut)]
                    let mut $pconn = $crate::store::acquire(pool).await?;
                    let out: $crate::store::StoreResult<_> = async { $postgres }.await;
                    pool.release($pconn, out.is_ok());
                    out
                }
            }
        })
        .await
    };
}
pub(crate) use db_op;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection could be had within the acquire timeout.
    #[error("database pool exhausted")]
    Overloaded,
    /// The database cannot be reached or dropped the connection (a restart,
    /// a failover, a network fault): the transaction rolled back (unless the
    /// connection was lost during its `COMMIT`), and asking again shortly is
    /// right.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// The database's disk is full ([`is_storage_full`]): the statement
    /// and its transaction rolled back, nothing was written. Asking again
    /// helps once an operator has freed space.
    #[error("database storage full: {0}")]
    StorageFull(#[source] sqlx::Error),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_storage_full(&e) {
            metrics::counter!("latchkey_db_storage_full_total").increment(1);
            tracing::error!(error = %e, "the database's storage is full; the write was rolled back and the request answers 503");
            return StoreError::StorageFull(e);
        }
        if is_transient(&e) {
            metrics::counter!("latchkey_db_unavailable_total").increment(1);
            tracing::warn!(error = %e, "database unavailable; the request answers 503");
            return StoreError::Unavailable(e);
        }
        match e {
            sqlx::Error::PoolTimedOut => StoreError::Overloaded,
            other => StoreError::Database(other),
        }
    }
}

/// A failure of the connection rather than of the statement: the socket
/// (`Io`), a pool closed under it, or one of PostgreSQL's SQLSTATEs of a
/// connection lost or refused: `08000`, `08001`, `08003`, `08004`, `08006`
/// (connection exceptions), `57P01` (admin shutdown), `57P02` (crash
/// shutdown), `57P03` (cannot connect now), `53300` (too many connections).
/// Not `08007` (transaction resolution unknown) nor `08P01` (a protocol
/// violation: a bug), which stay errors. A connection lost during `COMMIT`
/// may have committed: the callers' writes are safe to retry (idempotent,
/// or a retry answers as a replay does).
fn is_transient(e: &sqlx::Error) -> bool {
    const CODES: [&str; 9] = [
        "08000", "08001", "08003", "08004", "08006", "57P01", "57P02", "57P03", "53300",
    ];
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| CODES.contains(&c.as_ref())),
        _ => false,
    }
}

/// A write refused for want of space: SQLite's `SQLITE_FULL` (result code
/// 13, in any extended form) or PostgreSQL's `53100` (disk_full). Both roll
/// the statement back: the store is as it was before the request.
pub fn is_storage_full(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    let postgres = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some();
    db.code().is_some_and(|code| means_storage_full(&code, postgres))
}

/// Whether an error code of PostgreSQL (a SQLSTATE) or of SQLite (a
/// number) is [`is_storage_full`]'s. SQLSTATEs can be all digits too, so
/// the backend says which the code is.
fn means_storage_full(code: &str, postgres: bool) -> bool {
    if postgres {
        return code == "53100";
    }
    // SQLite's extended codes keep the primary code in the low byte.
    code.parse::<i32>().is_ok_and(|n| n & 0xff == 13)
}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Clone)]
pub struct Store {
    /// The pool; public so that tests and tools can inspect the database.
    pub db: Db,
    /// SQLite's refresh exchanges, committed together.
    group_commit: group_commit::GroupCommit,
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

impl Store {
    /// Opens the pool (creating the SQLite file and its directory if needed).
    /// Connections are made lazily beyond `min_connections`.
    pub async fn connect(cfg: &DatabaseConfig) -> anyhow::Result<Store> {
        use anyhow::Context;
        let db = match &cfg.url {
            DatabaseUrl::Sqlite(url) => {
                let opts = SqliteConnectOptions::from_str(url)
                    .context("LATCHKEY_DATABASE_URL is not a valid SQLite URL")?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .foreign_keys(true)
                    .busy_timeout(Duration::from_secs(5));
                secure_sqlite_files(opts.get_filename(), &cfg.own_dir)?;
                let pool = SqlitePoolOptions::new()
                    .max_connections(cfg.max_connections)
                    .min_connections(cfg.min_connections)
                    .acquire_timeout(cfg.acquire_timeout)
                    .test_before_acquire(false)
                    .before_acquire(|conn, meta| Box::pin(ping_if_idle(conn, meta)))
                    .connect_with(opts)
                    .await
                    .context("opening the SQLite database")?;
                Db::Sqlite(pool::Pool::new(pool))
            }
            DatabaseUrl::Postgres(url) => {
                let opts = PgConnectOptions::from_str(url.expose())
                    .context("LATCHKEY_DATABASE_URL is not a valid PostgreSQL URL")?;
                Db::Postgres(pool::Pool::new(Self::pg_pool(cfg, opts).await?))
            }
        };
        Ok(Store {
            db,
            group_commit: Default::default(),
        })
    }

    pub async fn pg_pool(cfg: &DatabaseConfig, opts: PgConnectOptions) -> anyhow::Result<PgPool> {
        use anyhow::Context;
        PgPoolOptions::new()
            .max_connections(cfg.max_connections)
            .min_connections(cfg.min_connections)
            .acquire_timeout(cfg.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| Box::pin(ping_if_idle(conn, meta)))
            .connect_with(opts)
            .await
            .context("connecting to PostgreSQL")
    }

    pub fn backend_name(&self) -> &'static str {
        match self.db {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    pub async fn migrate(&self) -> anyhow::Result<()> {
        match &self.db {
            Db::Sqlite(p) => SQLITE_MIGRATIONS.run(&**p).await?,
            Db::Postgres(p) => POSTGRES_MIGRATIONS.run(&**p).await?,
        }
        Ok(())
    }

    /// A round trip to the database, for readiness.
    pub async fn ping(&self) -> StoreResult<()> {
        db_op!(self, "ping", conn => {
            sqlx::query("SELECT 1").execute(&mut *conn).await?;
            Ok(())
        })
    }

    pub async fn close(&self) {
        match &self.db {
            Db::Sqlite(p) => p.close().await,
            Db::Postgres(p) => p.close().await,
        }
    }

    /// Pool size and idle connections, for metrics.
    pub fn pool_stats(&self) -> (u32, usize) {
        match &self.db {
            Db::Sqlite(p) => (p.size(), p.num_idle()),
            Db::Postgres(p) => (p.size(), p.num_idle()),
        }
    }
}

/// The SQLite database holds password hashes and sealed keys: its directory
/// is created 0700, or narrowed to 0700 if it is the service's own
/// `data_dir` (another directory, `/tmp` say, is not the service's to change:
/// a warning says it is readable), and the database file is made 0600
/// before SQLite opens it; SQLite gives its `-wal` and `-shm` files the
/// database file's mode, and files left by an older version are narrowed too.
fn secure_sqlite_files(db: &std::path::Path, own_dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    if db.as_os_str().is_empty() || db.to_string_lossy().starts_with(':') {
        return Ok(()); // in memory
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        let dir = db.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
            let own = match (dir.canonicalize(), own_dir.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if mode & 0o077 != 0 && own {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .with_context(|| format!("making {} private (0700)", dir.display()))?;
                tracing::info!(dir = %dir.display(), "data directory narrowed to 0700");
            } else if mode & 0o077 != 0 {
                tracing::warn!(dir = %dir.display(), mode = format!("{mode:o}"),
                    "the SQLite database's directory is readable by others (the file itself is 0600)");
            }
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(db)
            .with_context(|| format!("creating {}", db.display()))?;
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let f = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
            if let Ok(m) = std::fs::metadata(&f) {
                if m.permissions().mode() & 0o077 != 0 {
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))
                        .with_context(|| format!("making {} private (0600)", f.display()))?;
                }
            }
        }
    }
    #[cfg(not(unix))]
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// Runs one operation of [`db_op!`] in its `db` span, timing it whole.
pub(crate) async fn traced<T>(
    op: &'static str,
    body: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let _t = QueryTimer::start(op);
    let span = tracing::debug_span!("db", op, acquire_us = tracing::field::Empty);
    body.instrument(span).await
}

/// A pooled connection idle for this long is tested with a round trip
/// before it is handed out; one used more recently is not.
///
/// sqlx's default tests every connection on acquire, and it also tests every
/// connection when it returns to the pool (that one cannot be turned off;
/// `store/pool.rs` hands clean connections on without it). Under load a
/// connection is back in use within microseconds of its release test, so
/// the test on acquire was a second round trip per operation for nothing:
/// about 15 % of the service's CPU in a refresh (`perf`,
/// docs/performance.md). A connection the database dropped while it was
/// idle longer than this is still caught here; one that died within it
/// fails its statement (503, `database unavailable`, and sqlx discards the
/// connection), as a statement on a connection dying mid-use does. A
/// connection whose peer went silent (a half-open socket, no reset) is not
/// caught within that second either: its statement waits until the
/// request's deadline.
const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(1);

async fn ping_if_idle<C: sqlx::Connection>(
    conn: &mut C,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> Result<bool, sqlx::Error> {
    if meta.idle_for >= PING_WHEN_IDLE_FOR {
        conn.ping().await?;
    }
    Ok(true)
}

/// A connection from `pool`; the wait is recorded whether or not one came,
/// and a wait that hit the acquire timeout is counted and answered
/// [`StoreError::Overloaded`] (`503` at the HTTP edge).
pub(crate) async fn acquire<DB: sqlx::Database>(pool: &pool::Pool<DB>) -> StoreResult<pool::Conn<DB>> {
    let start = Instant::now();
    let conn = pool.acquire().await;
    let waited = start.elapsed();
    metrics::histogram!("latchkey_db_acquire_seconds").record(waited.as_secs_f64());
    // The `db` span of the operation, when spans are on.
    tracing::Span::current().record("acquire_us", waited.as_micros() as i64);
    conn.map_err(|e| {
        if matches!(e, sqlx::Error::PoolTimedOut) {
            metrics::counter!("latchkey_db_acquire_timeouts_total").increment(1);
        }
        StoreError::from(e)
    })
}

/// Records the latency of one operation under its name.
struct QueryTimer {
    op: &'static str,
    start: Instant,
}

impl QueryTimer {
    fn start(op: &'static str) -> Self {
        QueryTimer {
            op,
            start: Instant::now(),
        }
    }
}

impl Drop for QueryTimer {
    fn drop(&mut self) {
        metrics::histogram!("latchkey_db_query_seconds", "op" => self.op)
            .record(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sqlites_full_and_postgres_disk_full_codes_mean_the_storage_is_full() {
        // The real errors come from a real full disk in tests/it/full_disk.rs.
        assert!(means_storage_full("13", false));
        assert!(means_storage_full("53100", true));
        // SQLite: an I/O error, its write form, busy; a SQLSTATE is no
        // SQLite code even when it parses as a number.
        for code in ["10", "778", "5", "53100"] {
            assert!(!means_storage_full(code, false), "{code}");
        }
        // PostgreSQL: too many connections, out of memory, a unique key.
        for code in ["53300", "53200", "23505", "13"] {
            assert!(!means_storage_full(code, true), "{code}");
        }
    }

    #[test]
    fn a_lost_connection_is_unavailable_and_a_bad_statement_is_not() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert!(matches!(
            StoreError::from(sqlx::Error::Io(reset)),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            StoreError::from(sqlx::Error::PoolClosed),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            StoreError::from(sqlx::Error::PoolTimedOut),
            StoreError::Overloaded
        ));
        assert!(matches!(
            StoreError::from(sqlx::Error::RowNotFound),
            StoreError::Database(_)
        ));
    }
}
