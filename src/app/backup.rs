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
use crate::store::backup::{inspect_copy, newest_schema_version};
use crate::store::{DatabaseUrl, Store};

/// The file name of a scheduled backup made at `now_ms`: sorts by time.
fn scheduled_name(now_ms: i64) -> String {
    let t = crate::clock::rfc3339(now_ms).replace([':', '-'], "");
    format!("latchkey-{t}.db")
}

/// Makes a scheduled backup into `dir`, then removes the oldest beyond
/// `keep`. The backup's path.
pub async fn scheduled(store: &Store, dir: &Path, keep: usize, now_ms: i64) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(scheduled_name(now_ms));
    store.backup_into(&path).await?;
    let mut ours: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("latchkey-") && n.ends_with(".db"))
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
}

/// `latchkey restore PATH [--replace]`: checks the copy, then puts it in
/// the place of the embedded database (every instance must be stopped).
pub async fn restore(config: &Config, copy: &Path, replace: bool) -> anyhow::Result<Restored> {
    let DatabaseUrl::Sqlite(url) = &config.database.url else {
        anyhow::bail!("the database is PostgreSQL: restore it with its own tools (docs/backup.md)");
    };
    let target = PathBuf::from(
        url.trim_start_matches("sqlite://")
            .split('?')
            .next()
            .unwrap_or_default(),
    );
    let facts = inspect_copy(copy).await?;
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
    let check = super::services::secret_check(config)?;
    match facts.secret_check {
        Some(stored) if crate::crypto::ct_eq(&stored, &check) => {}
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
    if target.exists() && !replace {
        anyhow::bail!(
            "{} exists: stop every instance, then restore with --replace (the current file is kept as {}.before-restore)",
            target.display(),
            target.display()
        );
    }
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The copy goes in beside the target and is renamed over it: the
    // database is either the old one or the restored one, never half.
    let incoming = target.with_extension("db.restoring");
    std::fs::copy(copy, &incoming).with_context(|| format!("copying {}", copy.display()))?;
    std::fs::File::open(&incoming)?.sync_all()?;
    if target.exists() {
        let kept = target.with_extension("db.before-restore");
        std::fs::rename(&target, &kept).context("keeping the current database")?;
    }
    for side in ["db-wal", "db-shm"] {
        let _ = std::fs::remove_file(target.with_extension(side));
    }
    std::fs::rename(&incoming, &target).context("putting the restored database in place")?;
    let store = Store::connect(&config.database).await?;
    store.migrate().await.context("migrating the restored database")?;
    Ok(Restored {
        schema_version: version,
        migrated_to: newest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
