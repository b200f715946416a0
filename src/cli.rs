//! The command line: `serve`, `migrate`, `backup`, `restore`, `secret`, `clients`, `keys`, `users`,
//! `webhooks`, `upstreams`, `gateway`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::app::config::Config;
use crate::app::{Application, Services};
use crate::lifecycle::Program;

mod secret;
mod upstreams;
pub use secret::SecretCommand;
pub use upstreams::UpstreamsCommand;

#[derive(Parser)]
#[command(name = "latchkey", version, about = "Authentication service and API gateway")]
pub struct Cli {
    /// TOML file with settings (keys as in the README; environment variables win).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the authentication service.
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Write a consistent copy of the embedded database to PATH while the
    /// service serves (docs/backup.md).
    Backup { path: std::path::PathBuf },
    /// Put a backup in place of the embedded database, once its bytes
    /// match the seal beside it (PATH.mac), it passes SQLite's integrity
    /// check, its schema is not newer than this build's, and it was made
    /// under the configured master secret. Stop every instance first.
    Restore {
        path: std::path::PathBuf,
        /// Replace an existing database (kept as latchkey.db.before-restore).
        #[arg(long)]
        replace: bool,
        /// Restore a copy without a seal (made by Litestream or sqlite3,
        /// not by `latchkey backup`); every other check still applies.
        #[arg(long)]
        unsealed: bool,
    },
    /// Rotate the master secret (docs/operations.md).
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// Manage OAuth clients.
    Clients {
        #[command(subcommand)]
        command: ClientsCommand,
    },
    /// Manage signing keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Manage users.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
    /// Manage webhooks (docs/events.md).
    Webhooks {
        #[command(subcommand)]
        command: WebhooksCommand,
    },
    /// Manage upstream providers users may sign in with (docs/federation.md).
    Upstreams {
        #[command(subcommand)]
        command: UpstreamsCommand,
    },
    /// Run the API gateway (`--config gateway.toml`; see deploy/gateway.example.toml).
    Gateway,
    /// Measure this machine's password-hashing capacity: the configured
    /// argon2id on `hash_threads` threads for `--seconds`, nothing else
    /// running; prints hashes per second (what logins that miss the
    /// credential cache and sign-ups can reach at most).
    HashCapacity {
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
}

#[derive(Subcommand)]
// `Add` carries every flag of a client's settings; the command is parsed
// once per process, so its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ClientsCommand {
    /// Add a client; prints its secret once (a public client has none).
    /// With `--redirect-uri`, it signs users in with the authorization code
    /// flow (docs/oidc.md).
    Add {
        id: String,
        #[arg(long)]
        name: Option<String>,
        /// A scope the client may ask for with the client_credentials grant
        /// (`latchkey:admin`: the admin API); repeat for several.
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// Where the authorization code flow may send users back to
        /// (matched exactly; a loopback one on any port); repeat for several.
        #[arg(long = "redirect-uri")]
        redirect_uris: Vec<String>,
        /// Where RP-initiated logout may send users afterwards; repeat.
        #[arg(long = "post-logout-redirect-uri")]
        post_logout_redirect_uris: Vec<String>,
        /// A single-page or native app: no secret, PKCE always.
        #[arg(long)]
        public: bool,
        /// `explicit` (ask every time, the default), `remembered:DAYS`, or
        /// `skip` (a first-party app: never ask).
        #[arg(long, default_value = "explicit")]
        consent: String,
        /// A refresh token with every sign-in, without `offline_access`.
        #[arg(long)]
        refresh_without_offline_access: bool,
        /// An origin whose pages may call the token and userinfo endpoints
        /// (CORS); repeat for several.
        #[arg(long = "allowed-origin")]
        allowed_origins: Vec<String>,
        /// Where a logout token is posted when a session of this client
        /// ends (OpenID Connect Back-Channel Logout 1.0).
        #[arg(long)]
        backchannel_logout_uri: Option<String>,
        /// The algorithm of this client's id_tokens (EdDSA, ES256, RS256).
        #[arg(long = "id-token-alg")]
        id_token_alg: Option<String>,
        /// This client's access and id_tokens live this long (seconds; at
        /// most access_token_ttl_secs).
        #[arg(long)]
        access_token_ttl_secs: Option<u64>,
        /// This client's sessions last at most this long (seconds).
        #[arg(long)]
        session_ttl_secs: Option<u64>,
    },
    /// List clients.
    List,
    /// Remove a client.
    Remove { id: String },
}

#[derive(Subcommand)]
pub enum WebhooksCommand {
    /// Register an endpoint for audit events; prints its signing secret once.
    Add {
        url: String,
        /// A kind (`user.deleted`) or family (`session.`) to send; repeat
        /// for several; none: every event.
        #[arg(long = "kind")]
        kinds: Vec<String>,
    },
    /// List webhooks.
    List,
    /// Remove a webhook (its pending deliveries are dropped).
    Remove { id: String },
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Make a new key the signer; the others retire (and stay published
    /// until every token they signed has expired).
    Rotate,
    /// List keys.
    List,
}

#[derive(Subcommand)]
pub enum UsersCommand {
    /// Write the OAuth clients, the audit webhooks and every account to
    /// FILE (`-`: stdout) as JSON lines that `users import` reads back:
    /// clients with their secrets' hashes and settings, webhooks with their
    /// secrets sealed, accounts with names, verification, password hashes
    /// and disabled state (docs/import.md, "Export").
    Export { file: std::path::PathBuf },
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
        /// (version 2): each is listed as it is added. Without it they are
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

pub fn main() -> ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    if let Command::Gateway = cli.command {
        // The gateway's file is its own format, not the service's settings.
        return crate::gateway::main(cli.config.as_deref(), started);
    }
    let program = Program("latchkey");
    let config = match program.settings(Config::load(cli.config.as_deref())) {
        Ok(c) => c,
        Err(status) => return status,
    };
    crate::telemetry::init(&config.telemetry);
    program.run(None, async move {
        let result = run(cli.command, config, started).await;
        // The spans of the last requests, if traces are exported.
        let flushed = tokio::task::spawn_blocking(|| {
            crate::telemetry::otlp::shutdown(std::time::Duration::from_secs(2))
        });
        let _ = flushed.await;
        result
    })
}

async fn run(command: Command, config: Config, started: Instant) -> anyhow::Result<()> {
    match command {
        Command::Serve => serve(config, started).await,
        Command::Backup { path } => {
            crate::app::backup::backup(&config, &path).await?;
            println!("backup written to {}", path.display());
            Ok(())
        }
        Command::Restore {
            path,
            replace,
            unsealed,
        } => {
            let r = crate::app::backup::restore(&config, &path, replace, unsealed).await?;
            println!(
                "restored {} (schema {}, migrated to {})",
                path.display(),
                r.schema_version,
                r.migrated_to
            );
            match r.made_at {
                Some(t) => println!(
                    "the backup was made at {} (as its seal says)",
                    crate::clock::rfc3339(t)
                ),
                None => println!("the copy had no seal (--unsealed): when it was made is not known"),
            }
            if let Some(kept) = r.kept {
                println!("the database it replaced is kept as {}", kept.display());
            }
            Ok(())
        }
        Command::Migrate => {
            let backend = crate::app::migrate(&config.database).await?;
            println!("migrations applied ({backend})");
            Ok(())
        }
        Command::Clients { command } => {
            let st = Services::build(config).await?;
            match command {
                ClientsCommand::Add {
                    id,
                    name,
                    scopes,
                    redirect_uris,
                    post_logout_redirect_uris,
                    public,
                    consent,
                    refresh_without_offline_access,
                    allowed_origins,
                    backchannel_logout_uri,
                    id_token_alg,
                    access_token_ttl_secs,
                    session_ttl_secs,
                } => {
                    let oidc = if redirect_uris.is_empty() {
                        let code_flow_only = public
                            || backchannel_logout_uri.is_some()
                            || id_token_alg.is_some()
                            || access_token_ttl_secs.is_some()
                            || session_ttl_secs.is_some();
                        if code_flow_only {
                            anyhow::bail!(
                                "--public, --backchannel-logout-uri, --id-token-alg and the lifetimes are for the \
                                 authorization code flow: give --redirect-uri"
                            );
                        }
                        None
                    } else {
                        use crate::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};
                        let kind = if public {
                            ClientKind::Public
                        } else {
                            ClientKind::Confidential
                        };
                        let mut s = ClientSettings::new(kind, redirect_uris);
                        s.post_logout_redirect_uris = post_logout_redirect_uris;
                        s.consent = match consent.split_once(':') {
                            None if consent == "explicit" => ConsentMode::Explicit,
                            None if consent == "skip" => ConsentMode::Skip,
                            Some(("remembered", days)) => ConsentMode::Remembered {
                                days: days
                                    .parse()
                                    .map_err(|_| anyhow::anyhow!("--consent remembered:DAYS"))?,
                            },
                            _ => anyhow::bail!("--consent: explicit, remembered:DAYS or skip"),
                        };
                        s.refresh_without_offline_access = refresh_without_offline_access;
                        s.allowed_origins = allowed_origins;
                        s.backchannel_logout_uri = backchannel_logout_uri;
                        s.id_token_signed_response_alg = id_token_alg;
                        s.access_token_ttl_secs = access_token_ttl_secs;
                        s.session_ttl_secs = session_ttl_secs;
                        Some(s)
                    };
                    match st
                        .features
                        .clients
                        .add(&id, name.as_deref(), &scopes, oidc.as_ref())
                        .await?
                    {
                        Some(_) if public => {
                            println!("client_id: {id}\n(a public client: no secret; PKCE is required)");
                            Ok(())
                        }
                        Some(secret) => {
                            println!("client_id:     {id}\nclient_secret: {secret}\n(the secret is shown only now)");
                            Ok(())
                        }
                        None => anyhow::bail!("a client named {id:?} exists already"),
                    }
                }
                ClientsCommand::List => {
                    for c in st.features.clients.list().await? {
                        println!(
                            "{}\t{}\t{}",
                            c.id,
                            c.name.unwrap_or_default(),
                            crate::clock::rfc3339(c.created_at)
                        );
                    }
                    Ok(())
                }
                ClientsCommand::Remove { id } => {
                    if st.features.clients.remove(&id).await? {
                        println!("removed {id}");
                        Ok(())
                    } else {
                        anyhow::bail!("no client named {id:?}")
                    }
                }
            }
        }
        Command::Webhooks { command } => {
            let st = Services::build(config).await?;
            match command {
                WebhooksCommand::Add { url, kinds } => {
                    let w = st.features.webhooks.add("cli", &url, &kinds).await?;
                    println!(
                        "id:     {}\nsecret: {}\n(the secret is shown only now)",
                        w.webhook.id, w.secret
                    );
                }
                WebhooksCommand::List => {
                    for w in st.features.webhooks.list().await? {
                        let kinds = if w.kinds.is_empty() {
                            "*".to_string()
                        } else {
                            w.kinds.join(" ")
                        };
                        println!("{}\t{}\t{}\t{}", w.id, w.url, kinds, w.created_at);
                    }
                }
                WebhooksCommand::Remove { id } => {
                    st.features.webhooks.remove("cli", &id).await?;
                    println!("removed {id}");
                }
            }
            Ok(())
        }
        Command::Secret { command } => secret::run(&config, command).await,
        Command::Upstreams { command } => upstreams::run(&*Services::build(config).await?, command).await,
        Command::Keys { command } => {
            let st = Services::build(config).await?;
            match command {
                KeysCommand::Rotate => {
                    let kid = st.tokens.rotate().await?;
                    println!(
                        "new signing key {kid}; every instance switches within its key refresh interval"
                    );
                }
                KeysCommand::List => {
                    for k in st.tokens.keys().await? {
                        let state = match k.retired_at {
                            None => "active".to_string(),
                            Some(t) => format!("retired {}", crate::clock::rfc3339(t)),
                        };
                        println!("{}\t{}\t{}", k.kid, k.alg, state);
                    }
                }
            }
            Ok(())
        }
        Command::Users { command } => match command {
            UsersCommand::Import {
                file,
                update,
                with_clients,
            } => import_users(config, &file, update, with_clients).await,
            UsersCommand::Export { file } => {
                let st = crate::app::store(&config.database).await?;
                let n = if file.as_os_str() == "-" {
                    crate::domain::import::export(&st, &mut std::io::stdout().lock()).await?
                } else {
                    // Password hashes: a new file, its owner's only.
                    let mut out = std::io::BufWriter::new(
                        crate::crypto::private_new_file(&file).with_context(|| {
                            format!(
                                "{}: an export never overwrites, and needs a new file",
                                file.display()
                            )
                        })?,
                    );
                    crate::domain::import::export(&st, &mut out).await?
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
        },
        Command::HashCapacity { seconds } => {
            let seconds = if seconds.is_finite() {
                seconds.clamp(0.1, 600.0)
            } else {
                5.0
            };
            let h = &config.hashing;
            let c = crate::domain::hashing::measure_capacity(h, std::time::Duration::from_secs_f64(seconds))?;
            println!(
                "{:.1} hashes/s on {} threads (one hash: {:.1} ms; argon2id m={} KiB, t={}, p={})",
                c.per_second,
                h.threads,
                c.one_hash.as_secs_f64() * 1000.0,
                h.argon2.memory_kib,
                h.argon2.iterations,
                h.argon2.parallelism
            );
            Ok(())
        }
        Command::Gateway => unreachable!("handled before the service configuration is read"),
    }
}

async fn serve(config: Config, started: Instant) -> anyhow::Result<()> {
    if !config.limits.enabled {
        tracing::warn!(
            "LATCHKEY_RATE_LIMIT=off: every rate limit and brute-force delay is OFF (lab use only)"
        );
    }
    if config.oidc.password_grant {
        tracing::warn!(
            "LATCHKEY_OAUTH_PASSWORD_GRANT=true: clients may send users' passwords to /oauth/token \
             (RFC 9700 says they must not); turn it off once they use the authorization code flow"
        );
    }
    if config.issuer_is_plain_http_off_loopback() {
        tracing::warn!(
            "LATCHKEY_ISSUER is http:// on a non-loopback address: the sign-in pages' cookies go without \
             Secure and the __Host- prefix; set the https:// URL browsers reach"
        );
    }
    if matches!(config.mail.transport, crate::mail::MailConfig::Log) {
        tracing::info!(
            "LATCHKEY_MAIL=log: mail (codes included) goes to the log; use file: or smtp:// in production"
        );
    }
    config.http.connections.prepare_file_limit(0);
    // Before the listener is bound (lifecycle::signal).
    let stop = crate::lifecycle::signal();
    let app = Application::build(config).await?;
    let st = app.services();
    tracing::info!(
        address = %app.local_addr(),
        admin = %app.admin_addr().map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
        database = st.store.backend_name(),
        redis = st.redis.is_some(),
        startup_ms = started.elapsed().as_millis() as u64,
        "latchkey is serving"
    );
    app.run_until(stop).await
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
    let st = Services::build(config).await?;
    let start = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut counts = ImportCounts::default();
    let mut batch = Vec::with_capacity(IMPORT_BATCH);
    let mut lines = std::io::BufReader::new(input).lines();
    let mut n = 0u64;
    // Clients and webhooks come only from a latchkey export of version 2.
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
                // A client or a webhook (an export of version 2): added
                // at once, not batched with the accounts, and named.
                use crate::domain::import::{import_configured, Configured, ConfiguredOutcome};
                let done = match serde_json::from_str::<Configured>(&line) {
                    Err(e) => Err(format!("not a client or webhook record: {e}")),
                    Ok(_) if version != Some(2) => {
                        Err("a client or webhook outside a latchkey export of version 2: left out".into())
                    }
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
                let checked = serde_json::from_str::<crate::domain::import::ImportRecord>(&line)
                    .map_err(|e| format!("not an account object: {e}"))
                    .and_then(|r| r.check(false, crate::clock::now_ms()));
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
            for o in outcomes {
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
        Some(_) => {
            let master = crate::crypto::load_master_secret(
                config.secret_key.as_ref().map(|s| s.expose().as_slice()),
                &config.data_dir,
            )?;
            Some(crate::crypto::ServerKeys::derive(&master).factors)
        }
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
