//! Backups of the embedded database and their restore (docs/backup.md).
//!
//! ```text
//!   latchkey backup PATH     a consistent copy while the service serves
//!   backup_dir + interval    the same on a schedule, the newest backup_keep kept
//!   latchkey restore PATH    trusted only if: SQLite's integrity check passes,
//!                            its schema is not newer than this build's, and it
//!                            was made under the configured master secret;
//!                            then put in place (older schemas migrated)
//! ```
//!
//! A restore with the wrong secret is refused at once, not discovered
//! later when sealed second factors, webhooks and mail fail to open.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::config::Config;
use crate::crypto::private_new_file;
use crate::store::backup::{inspect_copy, newest_schema_version, sqlite_file_of, unknown_migrations};
use crate::store::{DatabaseUrl, Store};

/// The file name of a scheduled backup made at `now_ms`: sorts by time.
fn scheduled_name(now_ms: i64) -> String {
    let t = crate::clock::rfc3339(now_ms).replace([':', '-'], "");
    format!("latchkey-{t}.db")
}

/// Whether `name` is a scheduled backup's (`latchkey-<time>.db`, as
/// [`scheduled_name`] makes them): the only files pruning removes.
fn is_scheduled_name(name: &str) -> bool {
    name.strip_prefix("latchkey-")
        .and_then(|n| n.strip_suffix(".db"))
        .is_some_and(|t| {
            t.len() >= 16
                && t.starts_with(|c: char| c.is_ascii_digit())
                && t.chars().all(|c| c.is_ascii_digit() || "TZ.".contains(c))
        })
}

/// Makes a scheduled backup into `dir` (made private if new), then removes
/// the oldest scheduled backups beyond `keep`. The copy is written as
/// `.partial` and renamed once complete, so an interrupted one never
/// counts as a backup. The backup's path.
pub async fn scheduled(store: &Store, dir: &Path, keep: usize, now_ms: i64) -> anyhow::Result<PathBuf> {
    if !dir.exists() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let name = scheduled_name(now_ms);
    let path = dir.join(&name);
    let partial = dir.join(format!("{name}.partial"));
    let _ = std::fs::remove_file(&partial);
    store.backup_into(&partial).await?;
    std::fs::rename(&partial, &path).context("naming the finished backup")?;
    let mut ours: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_scheduled_name)
        })
        .collect();
    ours.sort();
    let excess = ours.len().saturating_sub(keep);
    for old in &ours[..excess] {
        std::fs::remove_file(old).with_context(|| format!("removing the old backup {}", old.display()))?;
    }
    Ok(path)
}

/// `latchkey backup PATH`.
pub async fn backup(config: &Config, path: &Path) -> anyhow::Result<()> {
    let store = Store::connect(&config.database).await?;
    store.backup_into(path).await
}

/// What a restore did.
pub struct Restored {
    pub schema_version: i64,
    pub migrated_to: i64,
    /// Where the database it replaced was kept.
    pub kept: Option<PathBuf>,
}

/// `path` with `suffix` added to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// `latchkey restore PATH [--replace]`: stages the copy beside the embedded
/// database, checks the staged bytes (integrity, migrations, triggers, the
/// master secret), migrates them, then renames them into place (every
/// instance must be stopped).
pub async fn restore(config: &Config, copy: &Path, replace: bool) -> anyhow::Result<Restored> {
    let DatabaseUrl::Sqlite(url) = &config.database.url else {
        anyhow::bail!("the database is PostgreSQL: restore it with its own tools (docs/backup.md)");
    };
    let target = sqlite_file_of(url)?;
    if target.exists() && !replace {
        anyhow::bail!(
            "{} exists: stop every instance, then restore with --replace (the current file is kept beside it)",
            target.display()
        );
    }
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The bytes checked are the bytes installed: copied first, private.
    let staged = beside(&target, ".restoring");
    let _ = std::fs::remove_file(&staged);
    {
        let mut from = std::fs::File::open(copy).with_context(|| format!("opening {}", copy.display()))?;
        let mut to = private_new_file(&staged).with_context(|| format!("creating {}", staged.display()))?;
        std::io::copy(&mut from, &mut to).with_context(|| format!("copying {}", copy.display()))?;
        to.sync_all()?;
    }
    let checked = check_copy(config, copy, &staged).await;
    let version = match checked {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_file(&staged);
            return Err(e);
        }
    };
    // Migrated before it goes in: a migration that fails leaves the
    // current database as it was.
    let mut staged_config = config.database.clone();
    staged_config.url = DatabaseUrl::Sqlite(format!("sqlite://{}", staged.display()));
    let migrated = async {
        let store = Store::connect(&staged_config).await?;
        store.migrate().await.context("migrating the copy")?;
        store.close().await;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = migrated {
        let _ = std::fs::remove_file(&staged);
        return Err(e);
    }
    for side in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(beside(&staged, side));
    }
    let kept = if target.exists() {
        // Whatever the current database's log holds goes into its file
        // first, so the file kept is whole.
        let mut old_config = config.database.clone();
        old_config.min_connections = 1;
        if let Ok(old) = Store::connect(&old_config).await {
            old.checkpoint().await.ok();
            old.close().await;
        }
        let kept = beside(&target, &format!(".before-restore-{}", crate::clock::now_ms()));
        std::fs::rename(&target, &kept).context("keeping the current database")?;
        for side in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(beside(&target, side));
        }
        Some(kept)
    } else {
        None
    };
    std::fs::rename(&staged, &target).context("putting the restored database in place")?;
    Ok(Restored {
        schema_version: version,
        migrated_to: newest_schema_version(),
        kept,
    })
}

/// The checks of a staged copy (`copy` names it in messages): its schema
/// version.
async fn check_copy(config: &Config, copy: &Path, staged: &Path) -> anyhow::Result<i64> {
    let facts = inspect_copy(staged).await?;
    if facts.integrity != "ok" {
        anyhow::bail!(
            "{} fails SQLite's integrity check: {}",
            copy.display(),
            facts.integrity
        );
    }
    let newest = newest_schema_version();
    let Some(version) = facts.schema_version else {
        anyhow::bail!(
            "{} is not a latchkey database (no migrations in it)",
            copy.display()
        );
    };
    if version > newest {
        anyhow::bail!(
            "{} was made by a newer latchkey (schema {version}; this one knows up to {newest}): restore it with that version",
            copy.display()
        );
    }
    let unknown = unknown_migrations(&facts);
    if !unknown.is_empty() || facts.triggers > 0 {
        anyhow::bail!(
            "{} does not hold this schema as latchkey made it (migrations {unknown:?} unknown or changed, {} triggers)",
            copy.display(),
            facts.triggers
        );
    }
    let check = super::services::secret_check(config)?;
    match facts.secret_check {
        Some(stored) if crate::crypto::ct_eq(&stored, &check) => Ok(version),
        Some(_) => anyhow::bail!(
            "{} was made under another master secret than LATCHKEY_SECRET_KEY (or <data_dir>/secret.key): \
             its second factors, webhook secrets and queued mail would not open; restore it with the secret it was made under",
            copy.display()
        ),
        None => anyhow::bail!(
            "{} holds no master secret check (a database never started): nothing to restore",
            copy.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_scheduled_backups_are_pruned() {
        assert!(is_scheduled_name(&scheduled_name(1_700_000_000_000)));
        for other in [
            "latchkey-mine.db",
            "latchkey-.db",
            "latchkey-20231114T221320Z.db.partial",
            "copy.db",
        ] {
            assert!(!is_scheduled_name(other), "{other}");
        }
    }

    #[test]
    fn scheduled_backups_sort_by_the_time_they_were_made() {
        let a = scheduled_name(1_700_000_000_000);
        let b = scheduled_name(1_700_000_060_000);
        assert!(a < b, "{a} {b}");
        assert!(
            a.starts_with("latchkey-") && a.ends_with(".db") && !a.contains(':'),
            "{a}"
        );
    }
}
