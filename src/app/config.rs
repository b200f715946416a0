//! The service's settings: environment variables over an optional TOML
//! file over defaults (`crate::settings::Sources`).
//!
//! This is a thin aggregate. Each part reads and owns its own settings
//! type (the store its database, the cache Redis, the limits their
//! policies, ...); a new setting goes into the type of the part that uses
//! it, and only settings of the process itself (data directory, master
//! secret, shutdown) live here. The README's "Settings" lists every key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cache::RedisConfig;
use crate::domain::hashing::HashSettings;
use crate::domain::mfa::MfaSettings;
use crate::domain::oidc::OidcSettings;
use crate::domain::shared::AccountSettings;
use crate::domain::tokens::TokenSettings;
use crate::http::HttpSettings;
use crate::limits::LimitSettings;
use crate::mail::MailSettings;
use crate::settings::secs;
pub use crate::settings::{ConfigError, Secret, Source, Sources};
use crate::store::DatabaseConfig;
use crate::telemetry::TelemetrySettings;
use crate::webhooks::WebhookSettings;

#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    /// Master secret (32+ bytes). Unset: read or create `<data_dir>/secret.key`.
    pub secret_key: Option<Secret<Vec<u8>>>,
    /// Master secrets before a rotation that still open what they sealed,
    /// comma-separated (`LATCHKEY_PREVIOUS_SECRET_KEYS`). Unset with
    /// `secret_key` unset: read `<data_dir>/secret.previous` (`app::keyring`).
    pub previous_secret_keys: Vec<Secret<Vec<u8>>>,
    pub shutdown_timeout: Duration,
    pub http: HttpSettings,
    pub database: DatabaseConfig,
    pub redis: Option<RedisConfig>,
    pub mail: MailSettings,
    pub limits: LimitSettings,
    pub hashing: HashSettings,
    pub tokens: TokenSettings,
    pub accounts: AccountSettings,
    pub telemetry: TelemetrySettings,
    pub webhooks: WebhookSettings,
    pub mfa: MfaSettings,
    pub oidc: OidcSettings,
    /// Where applications with their own pages come back from an upstream.
    pub federation: crate::domain::federation::FederationSettings,
    /// Scheduled backups of the embedded database (`app::backup`).
    pub backups: crate::store::backup::BackupSettings,
}

fn parse_secret_key(s: &str) -> Result<Secret<Vec<u8>>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s))
        .map_err(|_| "expected base64 (e.g. from `openssl rand -base64 32`)".to_string())?;
    if bytes.len() < 32 {
        return Err("must decode to at least 32 bytes".into());
    }
    Ok(Secret(bytes))
}

impl Config {
    /// Settings from the environment and the optional TOML file.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::from_sources(&Sources::load(path)?)
    }

    pub fn from_sources(src: &Sources) -> Result<Config, ConfigError> {
        let data_dir = src.get("data_dir", PathBuf::from("./data"), |s| Ok(PathBuf::from(s)))?;
        let http = HttpSettings::read(src)?;
        let default_issuer = format!("http://{}", http.listen);
        let tokens = TokenSettings::read(src, default_issuer)?;
        Ok(Config {
            mfa: MfaSettings::read(src, &tokens.issuer)?,
            oidc: OidcSettings::read(src)?,
            federation: crate::domain::federation::FederationSettings::read(src)?,
            database: DatabaseConfig::read(src, &data_dir)?,
            backups: crate::store::backup::BackupSettings::read(src)?,
            // Not `optional`: an empty value (a secret that rendered empty) is
            // an error, never a silent fallback to `<data_dir>/secret.key`.
            secret_key: src.get("secret_key", None, |s| parse_secret_key(s).map(Some))?,
            previous_secret_keys: src.get("previous_secret_keys", Vec::new(), |s| {
                s.split(',').map(|one| parse_secret_key(one.trim())).collect()
            })?,
            shutdown_timeout: src.get("shutdown_timeout_secs", Duration::from_secs(10), secs(0, 600))?,
            redis: RedisConfig::read(src)?,
            mail: MailSettings::read(src)?,
            limits: LimitSettings::read(src)?,
            hashing: HashSettings::read(src)?,
            tokens,
            accounts: AccountSettings::read(src)?,
            telemetry: TelemetrySettings::read(src)?,
            webhooks: WebhookSettings::read(src)?,
            http,
            data_dir,
        })
    }

    pub fn is_sqlite(&self) -> bool {
        self.database.is_sqlite()
    }

    /// Whether browsers reach the service over plain HTTP on an address
    /// other than loopback (the issuer is their URL): the sign-in pages'
    /// cookies then cannot be `Secure`.
    pub fn issuer_is_plain_http_off_loopback(&self) -> bool {
        let Ok(u) = url::Url::parse(&self.tokens.issuer) else {
            return false;
        };
        let loopback = match u.host() {
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => true,
        };
        u.scheme() == "http" && !loopback
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::MailConfig;

    #[test]
    fn an_http_issuer_is_flagged_only_off_loopback() {
        let with = |issuer: &str| {
            Config::from_sources(&Sources::from_pairs([("issuer", issuer)]))
                .unwrap()
                .issuer_is_plain_http_off_loopback()
        };
        assert!(with("http://id.example.com"));
        assert!(with("http://10.0.0.5:8080"));
        assert!(!with("http://127.0.0.1:8080"));
        assert!(!with("http://localhost:8080"));
        assert!(!with("https://id.example.com"));
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let c = Config::from_sources(&Sources::from_pairs([])).unwrap();
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:8080");
        assert!(c.is_sqlite());
        assert!(c.redis.is_none());
        assert_eq!(c.mail.transport, MailConfig::Log);
        assert!(c.limits.enabled);
        assert_eq!(c.hashing.argon2.memory_kib, 19_456);
    }

    #[test]
    fn an_empty_secret_key_is_refused_not_taken_for_unset() {
        let err = Config::from_sources(&Sources::from_pairs([("secret_key", "")])).unwrap_err();
        assert!(err.to_string().contains("LATCHKEY_SECRET_KEY"), "{err}");
    }

    #[test]
    fn previous_secret_keys_are_a_comma_separated_list_of_secrets_each_checked() {
        let two =
            "dGhlLW5leHQtbWFzdGVyLXNlY3JldC0zMi1ieXRlcyE=, dGhlLW9sZC1tYXN0ZXItc2VjcmV0LTMyLWJ5dGVzISE=";
        let c = Config::from_sources(&Sources::from_pairs([("previous_secret_keys", two)])).unwrap();
        assert_eq!(c.previous_secret_keys.len(), 2);
        assert!(Config::from_sources(&Sources::from_pairs([]))
            .unwrap()
            .previous_secret_keys
            .is_empty());
        for bad in ["c2hvcnQ=", "dGhlLW5leHQtbWFzdGVyLXNlY3JldC0zMi1ieXRlcyE=,"] {
            let err =
                Config::from_sources(&Sources::from_pairs([("previous_secret_keys", bad)])).unwrap_err();
            let line = err.to_string();
            assert!(
                line.contains("LATCHKEY_PREVIOUS_SECRET_KEYS") && !line.contains(bad),
                "{line}"
            );
        }
    }

    #[test]
    fn bad_database_url_names_the_setting() {
        let err = Config::from_sources(&Sources::from_pairs([("database_url", "nosuch://x")])).unwrap_err();
        let line = err.to_string();
        assert!(line.contains("LATCHKEY_DATABASE_URL"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn secrets_are_not_printed() {
        let c = Config::from_sources(&Sources::from_pairs([
            ("database_url", "postgres://u:hunter2@localhost/db"),
            ("redis_url", "redis://:sekrit@localhost:6379"),
            ("mail", "smtp://me:pa55@mail.example:2525"),
        ]))
        .unwrap();
        let dbg = format!("{c:?}");
        for s in ["hunter2", "sekrit", "pa55"] {
            assert!(!dbg.contains(s), "{s} leaked");
        }
    }

    #[test]
    fn toml_file_takes_both_key_forms_and_the_environment_wins() {
        let dir = std::env::temp_dir().join(format!("latchkey-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9999\"\nLATCHKEY_MAIL = \"file:/tmp/m\"\nhash_threads = 3\n",
        )
        .unwrap();
        let mut src = Sources::load(Some(&path)).unwrap();
        src.clear_environment();
        let c = Config::from_sources(&src).unwrap();
        assert_eq!(c.http.listen.port(), 9999);
        assert_eq!(c.mail.transport, MailConfig::File("/tmp/m".into()));
        assert_eq!(c.hashing.threads, 3);
        src.set("listen", "127.0.0.1:7777");
        assert_eq!(Config::from_sources(&src).unwrap().http.listen.port(), 7777);
        std::fs::write(&path, "hash_threads = \"many\"\n").unwrap();
        let mut src = Sources::load(Some(&path)).unwrap();
        src.clear_environment();
        let err = Config::from_sources(&src).unwrap_err().to_string();
        assert!(err.contains("hash_threads") && err.contains("--config"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn otlp_endpoint() {
        let c = Config::from_sources(&Sources::from_pairs([])).unwrap();
        assert_eq!(c.telemetry.otlp_traces_url, None);
        let c =
            Config::from_sources(&Sources::from_pairs([("otlp_endpoint", "http://127.0.0.1:4318")])).unwrap();
        assert_eq!(
            c.telemetry.otlp_traces_url.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        let err = Config::from_sources(&Sources::from_pairs([("otlp_endpoint", "https://c:4318")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("LATCHKEY_OTLP_ENDPOINT") && !err.contains('\n'),
            "{err}"
        );
    }
}
