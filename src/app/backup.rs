//! Backups of the embedded database and their restore (docs/backup.md).
//!
//! ```text
//!   latchkey backup PATH     a consistent copy while the service serves
//!   backup_dir + interval    the same on a schedule, the newest backup_keep kept
//!   latchkey restore PATH    trusted only if: its bytes match the seal
//!                            PATH.mac written beside it, SQLite's integrity
//!                            check passes, its schema is not newer than this
//!                            build's, and it was made under the configured
//!                            master secret; then put in place (older schemas
//!                            migrated)
//! ```
//!
//! A restore with the wrong secret is refused at once, not discovered
//! later when sealed second factors, webhooks and mail fail to open. The
//! seal is an HMAC of the whole file under a key of the master secret:
//! whoever can write where backups are kept, but does not hold the secret,
//! cannot change a password hash or add an account in a copy and have it
//! restored. A copy made another way (Litestream, `sqlite3 .backup`) has
//! no seal and restores only with `--unsealed`.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::config::Config;
use crate::crypto::{ct_eq, hex, private_new_file, MacKey};
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

/// The first word of a seal file: its format.
const SEAL_FORMAT: &str = "latchkey-backup-hmac-sha256-v1";

/// Where the seal of the backup `db` is kept: `db.mac`.
fn seal_path(db: &Path) -> PathBuf {
    beside(db, ".mac")
}

/// A seal: when the backup was made (Unix ms) and the HMAC of that time
/// (8 bytes, big-endian) followed by the copy's bytes. The time is sealed
/// too, so an old backup renamed as a new one still says when it was made.
struct Seal {
    made_at: i64,
    mac: [u8; 32],
}

impl Seal {
    fn line(&self) -> String {
        format!("{SEAL_FORMAT} {} {}\n", self.made_at, hex(&self.mac))
    }

    /// `(made_at, hex)` of a seal file's text.
    fn parse(text: &str) -> Option<(i64, &str)> {
        let mut words = text.trim_end_matches('\n').split(' ');
        let (format, made_at, mac) = (words.next()?, words.next()?, words.next()?);
        (format == SEAL_FORMAT && words.next().is_none()).then_some(())?;
        Some((made_at.parse().ok()?, mac))
    }
}

/// Copies `from` into the new private file `to`, computing the seal over
/// the bytes as they are written (not read back from `to`, which others
/// may be able to replace).
fn copy_sealed(key: &MacKey, made_at: i64, from: &Path, to: &Path) -> anyhow::Result<Seal> {
    use std::io::Write;
    let mut dst =
        private_new_file(to).with_context(|| format!("{}: a backup never overwrites", to.display()))?;
    let mut mac = key.stream();
    mac.update(&made_at.to_be_bytes());
    let copied = each_chunk(from, |chunk| {
        dst.write_all(chunk)
            .with_context(|| format!("writing {}", to.display()))?;
        mac.update(chunk);
        Ok(())
    })
    .and_then(|()| {
        dst.sync_all()
            .with_context(|| format!("writing {}", to.display()))
    });
    if let Err(e) = copied {
        // The file this call made, never one that was there.
        let _ = std::fs::remove_file(to);
        return Err(e);
    }
    Ok(Seal {
        made_at,
        mac: mac.finish(),
    })
}

/// Reads the file at `path` to its end, handing each chunk to `each`.
fn each_chunk(path: &Path, mut each: impl FnMut(&[u8]) -> anyhow::Result<()>) -> anyhow::Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(());
        }
        each(&buf[..n])?;
    }
}

/// Writes `seal` to `to`, a new private file (removed again if the write fails).
fn write_seal(seal: &Seal, to: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f =
        private_new_file(to).with_context(|| format!("{}: a backup never overwrites", to.display()))?;
    let written = f
        .write_all(seal.line().as_bytes())
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", to.display()));
    if written.is_err() {
        let _ = std::fs::remove_file(to);
    }
    written
}

/// A staging copy beside the database older than this was left by a
/// backup that never finished (a crash): removed before the next one.
const STALE_STAGING_MS: u128 = 24 * 3600 * 1000;

/// Removes the staging copies of `db` that backups left more than a day ago.
fn remove_stale_staging(db: &Path) {
    let (Some(dir), Some(name)) = (db.parent(), db.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let prefix = format!("{name}.backup-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        // Only names this code makes: the prefix and a UUID, nothing else
        // (an operator's own `latchkey.db.backup-<date>` is theirs).
        let ours = e.file_name().to_str().is_some_and(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|id| id.len() == 36 && uuid::Uuid::parse_str(id).is_ok())
        });
        let stale = ours
            && e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_millis() > STALE_STAGING_MS);
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Writes a sealed backup of the embedded database of `store` to `dest`
/// (a new private file) and its seal to `seal_at`. The copy is made in a
/// new private file beside the database (a directory only the service
/// writes), then copied to `dest` while it is sealed: whoever can write
/// where backups go cannot have their own file sealed in its place. Needs
/// the room of one more copy beside the database, for as long as it runs.
/// Nothing that was at `dest` or `seal_at` is ever touched.
async fn sealed_backup(
    store: &Store,
    key: &MacKey,
    dest: &Path,
    seal_at: &Path,
    made_at: i64,
) -> anyhow::Result<()> {
    for p in [dest, seal_at] {
        if p.symlink_metadata().is_ok() {
            anyhow::bail!("{} exists: a backup never overwrites", p.display());
        }
    }
    let db = store
        .sqlite_file()
        .context("the database is PostgreSQL: back it up with its own tools (docs/backup.md)")?;
    remove_stale_staging(&db);
    let staging = beside(&db, &format!(".backup-{}", uuid::Uuid::new_v4()));
    let sealed = async {
        store.backup_into(&staging).await?;
        let seal = copy_sealed(key, made_at, &staging, dest)?;
        if let Err(e) = write_seal(&seal, seal_at) {
            let _ = std::fs::remove_file(dest);
            return Err(e);
        }
        anyhow::Ok(())
    }
    .await;
    let _ = std::fs::remove_file(&staging);
    sealed
}

/// Checks the staged bytes of `copy` against the seal beside it; the time
/// the backup was made (`None`: no seal, allowed by `unsealed`). Refused:
/// a seal that does not match, or none without `unsealed`.
fn check_seal(key: &MacKey, copy: &Path, staged: &Path, unsealed: bool) -> anyhow::Result<Option<i64>> {
    let at = seal_path(copy);
    let text = match std::fs::read_to_string(&at) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if unsealed {
                tracing::warn!(copy = %copy.display(), "restoring a copy without a seal (--unsealed)");
                return Ok(None);
            }
            anyhow::bail!(
                "{} has no seal ({}): latchkey backup writes one beside every copy. A copy made \
                 another way (Litestream, sqlite3) restores with --unsealed, once you know where it came from",
                copy.display(),
                at.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", at.display())),
    };
    let (made_at, stated) =
        Seal::parse(&text).with_context(|| format!("{} is not a latchkey backup seal", at.display()))?;
    // A scheduled backup's name says when it was made: an older one
    // renamed as a newer one is refused (its seal keeps the real time).
    let name = copy.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if is_scheduled_name(name) && name != scheduled_name(made_at) {
        anyhow::bail!(
            "{} was made at {} as its seal says, not when its name says: a backup renamed",
            copy.display(),
            crate::clock::rfc3339(made_at)
        );
    }
    let mut mac = key.stream();
    mac.update(&made_at.to_be_bytes());
    each_chunk(staged, |chunk| {
        mac.update(chunk);
        Ok(())
    })?;
    if !ct_eq(stated.as_bytes(), hex(&mac.finish()).as_bytes()) {
        anyhow::bail!(
            "{} does not match its seal ({}): it was changed since latchkey made it, or made under \
             another master secret than LATCHKEY_SECRET_KEY (or <data_dir>/secret.key)",
            copy.display(),
            at.display()
        );
    }
    Ok(Some(made_at))
}

/// Makes a scheduled backup into `dir` (made private if new), then removes
/// the oldest scheduled backups beyond `keep`, with their seals (and any
/// seal left without its backup). The copy is written as `.partial`,
/// sealed, and renamed once complete, so an interrupted one never counts
/// as a backup. The backup's path.
pub async fn scheduled(
    store: &Store,
    key: &MacKey,
    dir: &Path,
    keep: usize,
    now_ms: i64,
) -> anyhow::Result<PathBuf> {
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
    if path.symlink_metadata().is_ok() {
        anyhow::bail!("{} exists: a backup never overwrites", path.display());
    }
    // What an interrupted backup of this very name left.
    let _ = std::fs::remove_file(&partial);
    sealed_backup(store, key, &partial, &seal_path(&path), now_ms).await?;
    if let Err(e) = std::fs::rename(&partial, &path) {
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(seal_path(&path));
        return Err(e).context("naming the finished backup");
    }
    let names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let mut ours: Vec<&String> = names.iter().filter(|n| is_scheduled_name(n)).collect();
    ours.sort();
    let excess = ours.len().saturating_sub(keep);
    for old in &ours[..excess] {
        let old = dir.join(old);
        std::fs::remove_file(&old).with_context(|| format!("removing the old backup {}", old.display()))?;
        let _ = std::fs::remove_file(seal_path(&old));
    }
    // Seals whose backup is gone (removed by hand, or a crash between the
    // two removals above).
    for seal in names
        .iter()
        .filter_map(|n| n.strip_suffix(".mac"))
        .filter(|n| is_scheduled_name(n))
    {
        if !dir.join(seal).exists() {
            let _ = std::fs::remove_file(dir.join(format!("{seal}.mac")));
        }
    }
    Ok(path)
}

/// `latchkey backup PATH`: the copy, and its seal at `PATH.mac`, under
/// the master secret the database was initialised with (the configured
/// one must be it).
pub async fn backup(config: &Config, path: &Path) -> anyhow::Result<()> {
    let DatabaseUrl::Sqlite(url) = &config.database.url else {
        anyhow::bail!(
            "the database is PostgreSQL: back it up with pg_dump, or base backups and WAL archiving (docs/backup.md)"
        );
    };
    let file = sqlite_file_of(url)?;
    if !file.exists() {
        anyhow::bail!(
            "{} does not exist: nothing to back up (is LATCHKEY_DATA_DIR the service's?)",
            file.display()
        );
    }
    let keys = super::services::server_keys(config)?;
    let store = Store::connect(&config.database).await?;
    match store.installation_get("secret_check").await? {
        Some(stored) if ct_eq(&stored, &keys.secret_check) => {}
        None => anyhow::bail!(
            "this database holds no master secret check yet (the service never started on it): start \
             `latchkey serve` on it once, then back it up"
        ),
        Some(_) => anyhow::bail!(
            "this database was not initialised under the configured master secret: run the backup with \
             the service's LATCHKEY_SECRET_KEY (or its <data_dir>/secret.key), or its seal would open under no other"
        ),
    }
    sealed_backup(
        &store,
        &keys.backups,
        path,
        &seal_path(path),
        crate::clock::now_ms(),
    )
    .await
}

/// What a restore did.
pub struct Restored {
    /// When the copy was made, as its seal says (`None`: restored unsealed).
    pub made_at: Option<i64>,
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

/// `latchkey restore PATH [--replace] [--unsealed]`: stages the copy
/// beside the embedded database, checks the staged bytes (the seal,
/// integrity, migrations, triggers, the master secret), migrates them, then
/// renames them into place (every instance must be stopped).
pub async fn restore(
    config: &Config,
    copy: &Path,
    replace: bool,
    unsealed: bool,
) -> anyhow::Result<Restored> {
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
    // A log left by an earlier restore that stopped half-way must not be
    // replayed onto them.
    let staged = beside(&target, ".restoring");
    for stale in [staged.clone(), beside(&staged, "-wal"), beside(&staged, "-shm")] {
        let _ = std::fs::remove_file(stale);
    }
    {
        let mut from = std::fs::File::open(copy).with_context(|| format!("opening {}", copy.display()))?;
        let mut to = private_new_file(&staged).with_context(|| format!("creating {}", staged.display()))?;
        std::io::copy(&mut from, &mut to).with_context(|| format!("copying {}", copy.display()))?;
        to.sync_all()?;
    }
    // The seal first: SQLite's checks open the file, which may rewrite
    // its header.
    let checked = match super::services::server_keys(config)
        .and_then(|k| check_seal(&k.backups, copy, &staged, unsealed))
    {
        Ok(made_at) => check_copy(config, copy, &staged).await.map(|v| (v, made_at)),
        Err(e) => Err(e),
    };
    let (version, made_at) = match checked {
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
        made_at,
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
    let check = super::services::server_keys(config)?.secret_check;
    match facts.secret_check {
        Some(stored) if ct_eq(&stored, &check) => Ok(version),
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
    fn only_staging_copies_this_code_named_and_a_day_old_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("latchkey.db");
        std::fs::write(&db, b"db").unwrap();
        let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 24 * 3600);
        let file = |name: &str, old: bool| {
            let p = dir.path().join(name);
            let f = std::fs::File::create(&p).unwrap();
            if old {
                f.set_modified(two_days_ago).unwrap();
            }
            p
        };
        let id = uuid::Uuid::new_v4();
        let stale = file(&format!("latchkey.db.backup-{id}"), true);
        let fresh = file(&format!("latchkey.db.backup-{}", uuid::Uuid::new_v4()), false);
        let operators = file("latchkey.db.backup-2026-11-27", true);
        let others = file(&format!("other.db.backup-{id}"), true);
        remove_stale_staging(&db);
        assert!(!stale.exists());
        for kept in [&fresh, &operators, &others, &db] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    #[test]
    fn a_seal_line_reads_back_and_nothing_else_passes_for_one() {
        let seal = Seal {
            made_at: 1_700_000_000_123,
            mac: [7; 32],
        };
        let line = seal.line();
        assert_eq!(
            Seal::parse(&line),
            Some((1_700_000_000_123, hex(&[7; 32]).as_str()))
        );
        let good_mac = hex(&[7; 32]);
        for bad in [
            String::new(),
            format!("latchkey-backup-hmac-sha256-v2 1 {good_mac}"),
            format!("{SEAL_FORMAT} soon {good_mac}"),
            format!("{SEAL_FORMAT} 1 {good_mac} extra"),
            format!("{SEAL_FORMAT} {good_mac}"),
            format!("{SEAL_FORMAT}  1 {good_mac}"),
        ] {
            assert_eq!(Seal::parse(&bad), None, "{bad:?}");
        }
    }

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
