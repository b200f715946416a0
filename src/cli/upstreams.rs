//! `latchkey upstreams`: the upstream OpenID Providers people may sign in
//! with (docs/federation.md).

use clap::Subcommand;

use crate::app::Services;
use crate::domain::federation::Protocol;

/// Google's issuer (its discovery document names it so).
const GOOGLE: &str = "https://accounts.google.com";

#[derive(Subcommand)]
pub enum UpstreamsCommand {
    /// Add an OpenID Provider by its issuer URL, or GitHub (`--github`) or
    /// Google (`--google`); prints the redirect URI to register there.
    Add {
        /// Its name in URLs (a-z, 0-9, -).
        name: String,
        /// The issuer (its discovery document is ISSUER/.well-known/openid-configuration);
        /// with --github, a GitHub Enterprise Server's URL (github.com if not given).
        #[arg(long, required_unless_present_any = ["github", "google"])]
        issuer: Option<String>,
        /// GitHub: OAuth 2.0 and its REST API, not OpenID Connect.
        #[arg(long, conflicts_with = "google")]
        github: bool,
        /// Google: the OpenID Provider https://accounts.google.com.
        #[arg(long, conflicts_with = "issuer")]
        google: bool,
        /// "Continue with ..." on the sign-in page; the name if not given.
        #[arg(long)]
        display_name: Option<String>,
        #[arg(long)]
        client_id: String,
        /// Better given in the environment than on the command line, where
        /// other users of the machine see it.
        #[arg(long, env = "LATCHKEY_UPSTREAM_CLIENT_SECRET", hide_env_values = true)]
        client_secret: String,
        /// Scopes to ask for, space-separated (an OpenID Provider is always
        /// asked `openid`); default `openid email profile`, for GitHub
        /// `read:user user:email`.
        #[arg(long, default_value = "")]
        scopes: String,
        /// A new person whose verified address no account has gets an
        /// account (otherwise only linked accounts sign in).
        #[arg(long)]
        may_create: bool,
        /// Believe its `email_verified` claim (only for a provider that
        /// verifies every address it asserts: docs/federation.md).
        #[arg(long)]
        trust_email_verified: bool,
        /// Take its `amr` value `mfa` as the second factor (only for a
        /// provider that enforces its own: docs/federation.md).
        #[arg(long)]
        trust_mfa: bool,
        /// The claim that carries the address (default `email`; its
        /// `email_verified` says whether it is verified).
        #[arg(long, default_value = "")]
        email_claim: String,
        /// The claim that carries the name of an account made (default `name`).
        #[arg(long, default_value = "")]
        name_claim: String,
    },
    /// List upstream providers.
    List,
    /// Remove an upstream provider (the links made through it stay).
    Remove { name: String },
}

/// Runs an `upstreams` command.
pub async fn run(st: &Services, command: UpstreamsCommand) -> anyhow::Result<()> {
    let federation = &st.features.federation;
    match command {
        UpstreamsCommand::Add {
            name,
            issuer,
            github,
            google,
            display_name,
            client_id,
            client_secret,
            scopes,
            may_create,
            trust_email_verified,
            trust_mfa,
            email_claim,
            name_claim,
        } => {
            let issuer = match (google, issuer) {
                (true, _) => GOOGLE.to_string(),
                (false, issuer) => issuer.unwrap_or_default(),
            };
            let u = crate::domain::federation::NewUpstream {
                display_name: display_name.unwrap_or_else(|| name.clone()),
                name: name.clone(),
                issuer,
                client_id,
                client_secret,
                scopes,
                may_create,
                trusts_email_verified: trust_email_verified,
                protocol: if github { Protocol::Github } else { Protocol::Oidc },
                trusts_mfa: trust_mfa,
                email_claim,
                name_claim,
            };
            if !federation.add(u, crate::clock::now_ms()).await? {
                anyhow::bail!("an upstream named {name:?} exists already");
            }
            println!(
                "added {name}; its redirect URI: {}",
                federation.redirect_uri(&name)
            );
        }
        UpstreamsCommand::List => {
            for u in federation.list().await? {
                println!(
                    "{}\t{}\t{}\t{}\tclient {}\tscopes {:?}\tmay_create {}\ttrusts_email_verified {}\ttrusts_mfa {}",
                    u.name,
                    u.protocol.as_str(),
                    u.display_name,
                    u.issuer,
                    u.client_id,
                    u.scopes,
                    u.may_create,
                    u.trusts_email_verified,
                    u.trusts_mfa
                );
            }
        }
        UpstreamsCommand::Remove { name } => {
            if !federation.remove(&name).await? {
                anyhow::bail!("no upstream named {name:?}");
            }
            println!("removed {name}");
        }
    }
    Ok(())
}
