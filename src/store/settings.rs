//! The store's settings: which database, and its connection pool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::settings::{millis, number, ConfigError, Secret, Source};

#[derive(Clone, Debug)]
pub enum DatabaseUrl {
    Sqlite(String),
    Postgres(Secret<String>),
}

#[derive(Clone, Debug)]
pub struct DatabaseConfig {
    pub url: DatabaseUrl,
    /// The service's own directory (`data_dir`): made private (0700) when
    /// the SQLite file lives in it. Another directory is only warned about.
    pub own_dir: PathBuf,
    pub max_connections: u32,
    pub min_connections: u32,
    pub acquire_timeout: Duration,
}

impl DatabaseConfig {
    /// `database_url` (default: a SQLite file in `data_dir`) and the pool
    /// settings, whose defaults depend on the backend.
    pub fn read(src: &impl Source, data_dir: &Path) -> Result<DatabaseConfig, ConfigError> {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let default_db = DatabaseUrl::Sqlite(format!("sqlite://{}", data_dir.join("latchkey.db").display()));
        let url = src.get("database_url", default_db, parse_database_url)?;
        let is_sqlite = matches!(url, DatabaseUrl::Sqlite(_));
        let database = DatabaseConfig {
            url,
            own_dir: data_dir.to_path_buf(),
            // SQLite has one writer: one connection avoids SQLITE_BUSY retries.
            max_connections: src.get(
                "database_max_connections",
                if is_sqlite { 1 } else { (cores as u32 * 4).max(8) },
                number(1, 1000),
            )?,
            min_connections: src.get(
                "database_min_connections",
                if is_sqlite { 1 } else { 2 },
                number(0, 1000),
            )?,
            acquire_timeout: src.get(
                "database_acquire_timeout_ms",
                Duration::from_millis(1000),
                millis(1, 60_000),
            )?,
        };
        if database.min_connections > database.max_connections {
            return Err(ConfigError::new(
                src.name_of("database_min_connections"),
                "must not exceed database_max_connections",
            ));
        }
        Ok(database)
    }

    pub fn is_sqlite(&self) -> bool {
        matches!(self.url, DatabaseUrl::Sqlite(_))
    }
}

pub fn parse_database_url(s: &str) -> Result<DatabaseUrl, String> {
    if s.starts_with("sqlite:") {
        Ok(DatabaseUrl::Sqlite(s.to_string()))
    } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        url::Url::parse(s).map_err(|e| format!("not a valid URL: {e}"))?;
        Ok(DatabaseUrl::Postgres(Secret(s.to_string())))
    } else {
        let scheme = s.split(':').next().unwrap_or("");
        Err(format!(
            "unsupported scheme {scheme:?}: expected sqlite://PATH or postgres://..."
        ))
    }
}
