//! Copies of the embedded database: made online (SQLite's `VACUUM INTO`
//! on a connection of its own, one read transaction, so the copy is
//! consistent and the service's own connection is never held), and read
//! without being changed before a restore trusts them (`app::backup` has
//! the rules), and the settings of scheduled backups. PostgreSQL is backed
//! up with its own tools (docs/backup.md).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use super::{Db, Store, SQLITE_MIGRATIONS};
use crate::crypto::private_new_file;
use crate::settings::{number, optional, secs, ConfigError, Source};

/// Scheduled backups of the embedded database.
#[derive(Clone, Debug)]
pub struct BackupSettings {
    /// Where they go (`backup_dir`); unset: none are made.
    pub dir: Option<PathBuf>,
    /// How often (`backup_interval_secs`).
    pub interval: Duration,
    /// How many are kept, newest first (`backup_keep`).
    pub keep: usize,
}

impl BackupSettings {
    pub fn read(src: &impl Source) -> Result<BackupSettings, ConfigError> {
        Ok(BackupSettings {
            dir: src.get("backup_dir", None, optional(|s| Ok(PathBuf::from(s))))?,
            interval: src.get(
                "backup_interval_secs",
                Duration::from_secs(3600),
                secs(1, 7 * 86_400),
            )?,
            keep: src.get("backup_keep", 24, number(1, 10_000))?,
        })
    }
}

/// What a copy holds, read without changing it.
#[derive(Clone, Debug)]
pub struct CopyFacts {
    /// SQLite's `integrity_check`: `ok`, or its first finding.
    pub integrity: String,
    /// The newest migration applied to it (`None`: no schema of ours).
    pub schema_version: Option<i64>,
    /// Every migration applied to it: version and checksum.
    pub migrations: Vec<(i64, Vec<u8>)>,
    /// Triggers in it (latchkey's schema has none).
    pub triggers: i64,
    /// The check value of the master secret it was made under.
    pub secret_check: Option<Vec<u8>>,
}

/// The newest schema this build knows (its last SQLite migration).
pub fn newest_schema_version() -> i64 {
    SQLITE_MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
}

impl Store {
    /// The file of the embedded database, or `None` on PostgreSQL.
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        match &self.db {
            Db::Sqlite(pool) => Some(pool.connect_options().get_filename().to_path_buf()),
            Db::Postgres(_) => None,
        }
    }

    /// Moves what the embedded database's write-ahead log holds into its
    /// file and empties the log (before the file is moved aside).
    pub async fn checkpoint(&self) -> anyhow::Result<()> {
        if let Db::Sqlite(pool) = &self.db {
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&**pool)
                .await?;
        }
        Ok(())
    }

    /// Writes a consistent copy of the embedded database to `path` (which
    /// must not exist: it is made here, readable by its owner only, as the
    /// copy holds password hashes), while the service serves. Refused on
    /// PostgreSQL.
    pub async fn backup_into(&self, path: &Path) -> anyhow::Result<()> {
        let Some(file) = self.sqlite_file() else {
            anyhow::bail!(
                "the database is PostgreSQL: back it up with pg_dump, or base backups and WAL archiving (docs/backup.md)"
            );
        };
        private_new_file(path).with_context(|| {
            format!(
                "{}: a backup never overwrites, and needs a new file",
                path.display()
            )
        })?;
        let target = path
            .to_str()
            .context("the backup's path is not valid UTF-8")?
            .replace('\'', "''");
        let mut conn = SqliteConnectOptions::new()
            .filename(&file)
            .read_only(true)
            .busy_timeout(std::time::Duration::from_secs(30))
            .connect()
            .await
            .context("opening the database for a backup")?;
        // VACUUM INTO writes into an empty file as into a new one.
        let written = sqlx::query(&format!("VACUUM INTO '{target}'"))
            .execute(&mut conn)
            .await
            .with_context(|| format!("writing the backup to {}", path.display()));
        conn.close().await.ok();
        if written.is_err() {
            let _ = std::fs::remove_file(path);
        }
        written?;
        std::fs::File::open(path)?.sync_all()?;
        Ok(())
    }
}

/// The file of a SQLite database URL, parsed as the store parses it.
pub fn sqlite_file_of(url: &str) -> anyhow::Result<PathBuf> {
    Ok(SqliteConnectOptions::from_str(url)
        .context("not a SQLite URL")?
        .get_filename()
        .to_path_buf())
}

/// The migrations a copy holds that this build does not know as they are
/// (another version, or the same version with another checksum): a copy
/// with any is not one of this schema's.
pub fn unknown_migrations(facts: &CopyFacts) -> Vec<i64> {
    facts
        .migrations
        .iter()
        .filter(|(version, checksum)| {
            !SQLITE_MIGRATIONS
                .iter()
                .any(|m| m.version == *version && m.checksum.as_ref() == checksum.as_slice())
        })
        .map(|(version, _)| *version)
        .collect()
}

/// Reads what the copy at `path` holds, opened read-only by its file name
/// (a file that is not a SQLite database says so).
pub async fn inspect_copy(path: &Path) -> anyhow::Result<CopyFacts> {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .immutable(true)
        .connect()
        .await
        .with_context(|| format!("opening {}", path.display()))?;
    let (integrity,): (String,) = sqlx::query_as("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .with_context(|| format!("{} is not a SQLite database", path.display()))?;
    let migrations: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success = 1 ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap_or_default();
    let schema_version = migrations.iter().map(|(v, _)| *v).max();
    let triggers: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'")
        .fetch_one(&mut conn)
        .await?;
    let secret_check: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT value FROM installation WHERE name = 'secret_check'")
            .fetch_optional(&mut conn)
            .await
            .unwrap_or(None);
    conn.close().await.ok();
    Ok(CopyFacts {
        integrity,
        schema_version,
        migrations,
        triggers,
        secret_check,
    })
}
