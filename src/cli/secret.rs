//! `latchkey secret`: rotating the master secret (`app::keyring`,
//! docs/operations.md, "The master secret"). Both run with every instance
//! stopped.

use clap::Subcommand;

use crate::app::config::Config;
use crate::app::keyring::{self, Changed};

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Make a new master secret the one that seals: with
    /// LATCHKEY_SECRET_KEY, the one given there (the one it replaces in
    /// LATCHKEY_PREVIOUS_SECRET_KEYS); else a new <data_dir>/secret.key, the
    /// old one kept in <data_dir>/secret.previous. Everything the database
    /// holds sealed is sealed again under it.
    Rotate,
    /// Let the previous secrets go, once the database is under the current
    /// one (what they keyed that others hold, recovery codes and refresh
    /// tokens, stays good). Sign-ins in progress and the sign-in pages'
    /// browser sessions from before the rotation start again.
    /// <data_dir>/secret.previous becomes secret.retired-<unix time>: keep
    /// it with the backups made under it.
    Retire {
        /// Retire even though some sealed values open under no secret held
        /// (they are named; they are lost either way).
        #[arg(long)]
        force: bool,
    },
}

pub async fn run(config: &Config, command: SecretCommand) -> anyhow::Result<()> {
    let now = crate::clock::now_ms();
    match command {
        SecretCommand::Rotate => {
            let changed = keyring::rotate(config, now).await?;
            if changed.new_file_secret {
                println!(
                    "a new master secret is in {0}/secret.key; the one it replaces is in {0}/{1}",
                    config.data_dir.display(),
                    keyring::PREVIOUS_FILE
                );
            }
            report(&changed);
            println!(
                "the database is sealed under the current secret: start every instance with this keyring; \
                 `latchkey secret retire` lets the previous secret go"
            );
        }
        SecretCommand::Retire { force } => {
            let changed = keyring::retire(config, now, force).await?;
            report(&changed);
            println!("{} previous secret(s) retired", changed.retired);
            if !keyring::keeps_files(config) {
                println!("remove LATCHKEY_PREVIOUS_SECRET_KEYS from every instance's settings before starting them");
            }
        }
    }
    Ok(())
}

fn report(changed: &Changed) {
    for r in &changed.resealed {
        println!(
            "{}: {} sealed again, {} under the current secret already",
            r.column, r.resealed, r.current
        );
        if !r.unopenable.is_empty() {
            println!(
                "{}: {} open under no secret held, left as they are: {}",
                r.column,
                r.unopenable.len(),
                r.unopenable.join(", ")
            );
        }
    }
}
