//! The command line: `serve`, `migrate`, `backup`, `restore`, `secret`, `clients`, `keys`, `users`,
//! `webhooks`, `upstreams`, `gateway`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

use crate::app::config::Config;
use crate::app::{Application, Services};
use crate::lifecycle::Program;

mod secret;
mod upstreams;
mod users;
pub use secret::SecretCommand;
pub use upstreams::UpstreamsCommand;
pub use users::UsersCommand;

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
        Command::Users { command } => users::run(config, command).await,
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
