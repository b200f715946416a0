//! `latchkey users`: export, import and load-test seeding of accounts
//! (docs/import.md).

use std::time::Instant;

use anyhow::Context;
use clap::Subcommand;

use crate::app::config::Config;
use crate::app::Services;

#[derive(Subcommand)]
pub enum UsersCommand {
    /// Write the OAuth clients, the audit webhooks and every account to
    /// FILE (`-`: stdout) as JSON lines that `users import` reads back:
    /// clients with their secrets' hashes and settings, webhooks with their
    /// secrets sealed, accounts with names, verification, password hashes,
    /// disabled state and second factors (authenticator apps' secrets
    /// sealed: they import under the same master secret only) and unused
    /// recovery codes' hashes (docs/import.md, "Export").
    Export {
        file: std::path::PathBuf,
        /// Leave second factors and recovery codes out: for a deployment
        /// with another master secret. Their owners enrol again there; until
        /// then the password alone signs them in.
        #[arg(long)]
        without_factors: bool,
    },
    /// Import accounts from a JSON-lines file (docs/import.md): one object
    /// per line with `email`, `password_hash` (bcrypt, PBKDF2, scrypt,
    /// argon2) or `keycloak`, and optionally `name`, `verified`,
    /// `created_at`. Bad lines are reported and skipped; existing emails are
    /// skipped, or updated with `--update`.
    Import {
        file: std::path::PathBuf,
        /// Replace the name, hash and verification of existing emails (and
        /// end their sessions) instead of skipping them; `disabled` in a
        /// record disables an account, and nothing in a file enables one.
        #[arg(long)]
        update: bool,
        /// Also add the OAuth clients and webhooks of a latchkey export
        /// (version 2 or 3): each is listed as it is added. Without it they are
        /// left out: a client can carry the admin scope and a secret whoever
        /// wrote the file knows.
        #[arg(long)]
        with_clients: bool,
    },
    /// Create verified accounts for load tests, hashing each password with
    /// the configured argon2 parameters.
    Seed {
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// `{}` is replaced by the account number, from 1.
        #[arg(long, default_value = "user{}@loadtest.latchkey")]
        email: String,
        #[arg(long, default_value = "loadtest-password")]
        password: String,
        /// Give every account an authenticator app with this base32 secret
        /// (the two-step login scenario computes its codes): for a lab only.
        #[arg(long)]
        totp_secret: Option<String>,
    },
}

pub async fn run(config: Config, command: UsersCommand) -> anyhow::Result<()> {
    match command {
        UsersCommand::Import {
            file,
            update,
            with_clients,
        } => import_users(config, &file, update, with_clients).await,
        UsersCommand::Export {
            file,
            without_factors,
        } => {
            let st = crate::app::store(&config.database).await?;
            let n = if file.as_os_str() == "-" {
                crate::domain::import::export(&st, &mut std::io::stdout().lock(), !without_factors).await?
            } else {
                // Password hashes: a new file, its owner's only.
                let mut out =
                    std::io::BufWriter::new(crate::crypto::private_new_file(&file).with_context(|| {
                        format!(
                            "{}: an export never overwrites, and needs a new file",
                            file.display()
                        )
                    })?);
                crate::domain::import::export(&st, &mut out, !without_factors).await?
            };
            eprintln!("exported the clients, the webhooks and {n} accounts");
            Ok(())
        }
        UsersCommand::Seed {
            totp_secret,
            count,
            email,
            password,
        } => seed_users(config, count, &email, &password, totp_secret.as_deref()).await,
    }
}

/// Accounts written per transaction by `users import`.
const IMPORT_BATCH: usize = 500;

async fn import_users(
    config: Config,
    file: &std::path::Path,
    update: bool,
    with_clients: bool,
) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    let input = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let total_bytes = input.metadata().map(|m| m.len()).unwrap_or(0);
    let mut read_bytes = 0u64;
    let st = Services::build(config.clone()).await?;
    // The sealer of authenticator apps' secrets, under the keyring the
    // database records: an export's open under the same master secret.
    let factors = crate::app::keyring::load(&config, &st.store).await?.factors;
    let start = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut counts = ImportCounts::default();
    let mut batch = Vec::with_capacity(IMPORT_BATCH);
    let mut lines = std::io::BufReader::new(input).lines();
    let mut n = 0u64;
    // Clients and webhooks come only from a latchkey export of version 2 or 3.
    let mut version = None;
    loop {
        let line = lines.next().transpose().context("reading the import file")?;
        let done = line.is_none();
        if let Some(line) = line {
            n += 1;
            read_bytes += line.len() as u64 + 1;
            // An export's first line says its format and version.
            let header = n == 1 && {
                version = crate::domain::import::export_version(&line)
                    .map_err(|e| anyhow::anyhow!("line 1: {e}"))?;
                version.is_some()
            };
            if !header && crate::domain::import::is_configured(&line) {
                // A client or a webhook (an export of version 2 or 3): added
                // at once, not batched with the accounts, and named.
                use crate::domain::import::{import_configured, Configured, ConfiguredOutcome};
                let done = match serde_json::from_str::<Configured>(&line) {
                    Err(e) => Err(format!("not a client or webhook record: {e}")),
                    Ok(_) if !matches!(version, Some(2 | 3)) => Err(
                        "a client or webhook outside a latchkey export of version 2 or 3: left out".into(),
                    ),
                    Ok(rec) if !with_clients => {
                        counts.configured_left_out += 1;
                        println!("left out (no --with-clients): {}", rec.describe());
                        Ok(None)
                    }
                    Ok(rec) => {
                        let what = rec.describe();
                        import_configured(&st.features, rec, "cli")
                            .await
                            .map(|o| Some((o, what)))
                            .map_err(|e| e.to_string())
                    }
                };
                match done {
                    Ok(Some((ConfiguredOutcome::Added, what))) => {
                        counts.configured_added += 1;
                        println!("added {what}");
                    }
                    Ok(Some((ConfiguredOutcome::Kept, what))) => {
                        counts.configured_kept += 1;
                        println!("kept as it was here (the id is taken): {what}");
                    }
                    Ok(None) => {}
                    Err(why) => {
                        counts.errors += 1;
                        eprintln!("{}line {n}: {why}", if tty { "\r\x1b[K" } else { "" });
                    }
                }
            } else if !header && !line.trim().is_empty() {
                let checked = crate::domain::import::AccountLine::parse(&line)
                    .and_then(|r| r.check(crate::clock::now_ms(), &factors));
                match checked {
                    Ok(c) => batch.push(c.user),
                    Err(why) => {
                        counts.errors += 1;
                        eprintln!("{}line {n}: {why}", if tty { "\r\x1b[K" } else { "" });
                    }
                }
            }
        }
        if batch.len() >= IMPORT_BATCH || (done && !batch.is_empty()) {
            let outcomes =
                crate::domain::import::import_batch(&st.store, &st.revocations, &batch, update, "cli")
                    .await?;
            for (o, u) in outcomes.into_iter().zip(&batch) {
                if o == crate::domain::import::ImportOutcome::Refused {
                    eprintln!(
                        "{}refused {}: a second factor of it (its id, or its passkey) is another account's here",
                        if tty { "\r\x1b[K" } else { "" },
                        u.email
                    );
                }
                counts.add(o);
            }
            batch.clear();
            let bar = progress_line(read_bytes, total_bytes, n, start.elapsed());
            if tty {
                eprint!("\r\x1b[K{bar}: {counts}");
                let _ = std::io::stderr().flush();
            } else if n % 10_000 < IMPORT_BATCH as u64 {
                eprintln!("{bar}: {counts}");
            }
        }
        if done {
            break;
        }
    }
    if tty {
        eprintln!();
    }
    println!(
        "imported {n} lines in {:.1} s: {counts}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The import's progress: a bar and the share of the file read (by bytes,
/// so that no second pass counts the lines), the lines, their rate and the
/// time left.
fn progress_line(read: u64, total: u64, lines: u64, elapsed: std::time::Duration) -> String {
    const WIDTH: usize = 24;
    let share = if total == 0 {
        1.0
    } else {
        (read.min(total) as f64) / total as f64
    };
    let filled = (share * WIDTH as f64).round() as usize;
    let secs = elapsed.as_secs_f64().max(1e-3);
    let left = if share > 0.0 {
        secs * (1.0 - share) / share
    } else {
        0.0
    };
    format!(
        "[{}{}] {:>3.0} % {lines} lines, {:.0}/s, {left:.0} s left",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        share * 100.0,
        lines as f64 / secs,
    )
}

#[derive(Default)]
struct ImportCounts {
    created: u64,
    updated: u64,
    skipped: u64,
    errors: u64,
    /// Clients and webhooks added, kept as they were (id taken), and left
    /// out (no `--with-clients`).
    configured_added: u64,
    configured_kept: u64,
    configured_left_out: u64,
}

impl ImportCounts {
    fn add(&mut self, o: crate::domain::import::ImportOutcome) {
        use crate::domain::import::ImportOutcome::*;
        match o {
            Created => self.created += 1,
            Updated => self.updated += 1,
            Skipped => self.skipped += 1,
            Refused => self.errors += 1,
        }
    }
}

impl std::fmt::Display for ImportCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} created, {} updated, {} skipped, {} with errors",
            self.created, self.updated, self.skipped, self.errors
        )?;
        if self.configured_added + self.configured_kept + self.configured_left_out > 0 {
            write!(
                f,
                "; clients and webhooks: {} added, {} kept as they were (id taken), {} left out",
                self.configured_added, self.configured_kept, self.configured_left_out
            )?;
        }
        Ok(())
    }
}

async fn seed_users(
    config: Config,
    count: usize,
    pattern: &str,
    password: &str,
    totp_secret: Option<&str>,
) -> anyhow::Result<()> {
    if !pattern.contains("{}") {
        anyhow::bail!("--email must contain {{}} (replaced by the account number)");
    }
    let totp = totp_secret
        .map(|b32| {
            totp_rs::Secret::Encoded(b32.to_ascii_uppercase())
                .to_bytes()
                .ok()
                .filter(|b| b.len() >= 16)
                .ok_or_else(|| anyhow::anyhow!("--totp-secret: base32 of at least 16 bytes"))
        })
        .transpose()?;
    crate::domain::input::Password::parse("password", password)
        .map_err(|e| anyhow::anyhow!("--password: {}", e.reason))?;
    let store = crate::app::store(&config.database).await?;
    let passwords = std::sync::Arc::new(crate::domain::hashing::Passwords::new(&config.hashing.argon2)?);
    let start = Instant::now();
    let sealer = match &totp {
        None => None,
        // The keyring the database records, checked as a start checks it.
        Some(_) => Some(crate::app::keyring::load(&config, &store).await?.factors),
    };
    let totp = sealer.as_ref().zip(totp.as_deref());
    let (inserted, with_totp) = crate::domain::import::seed(
        &store,
        passwords,
        config.hashing.threads,
        (pattern, count),
        password,
        totp,
    )
    .await?;
    if totp.is_some() {
        println!("gave {with_totp} of them an authenticator app (--totp-secret)");
    }
    println!(
        "seeded {inserted} new verified accounts ({} requested) in {:.1} s",
        count,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::progress_line;
    use std::time::Duration;

    #[test]
    fn the_progress_bar_shows_the_share_read_and_the_time_left() {
        let line = progress_line(250, 1000, 50, Duration::from_secs(2));
        assert_eq!(line, "[######..................]  25 % 50 lines, 25/s, 6 s left");
        assert!(progress_line(1000, 1000, 200, Duration::from_secs(4))
            .starts_with("[########################] 100 %"));
        // An empty file is done at once.
        assert!(progress_line(0, 0, 0, Duration::ZERO).contains("100 %"));
    }
}
