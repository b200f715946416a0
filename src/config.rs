//! Settings: environment variables over an optional TOML file over defaults.
//!
//! Every setting has one key `k`. It is read from the environment as
//! `LATCHKEY_<K>` and from the TOML file (given with `--config`) as `k`; the
//! environment wins. An invalid value stops start-up with one line that names
//! the setting (`ConfigError`). Secrets are wrapped in [`Secret`] so that no
//! `Debug` or log line can print them.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::limits::Policies;

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(pub T);

impl<T> Secret<T> {
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An invalid setting: names it, says why, never echoes a secret value.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {name}: {message}")]
pub struct ConfigError {
    pub name: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            name: name.into(),
            message: message.into(),
        }
    }
}

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

#[derive(Clone, Debug)]
pub struct RedisConfig {
    pub url: Secret<String>,
    /// Prefix of every key and channel, so that several deployments (or tests)
    /// can share one Redis server. Always ends with `:`.
    pub key_prefix: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MailConfig {
    Log,
    File(PathBuf),
    Smtp {
        host: String,
        port: u16,
        credentials: Option<(String, Secret<String>)>,
        from: String,
        tls: SmtpTls,
        /// Extra trusted root certificates (PEM), for a relay with a private CA.
        ca_file: Option<PathBuf>,
    },
}

/// How mail reaches the SMTP relay. Real providers require TLS, and so does
/// latchkey unless plain text is asked for by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmtpTls {
    /// `smtps://`: TLS from the first byte (port 465 by default).
    Implicit,
    /// `smtp://`: STARTTLS, and no mail if the relay does not offer it.
    StartTls,
    /// `smtp://...?tls=none`: plain text (a relay on the same host or a test).
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigningAlgorithm {
    EdDsa,
    Es256,
}

impl SigningAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            SigningAlgorithm::EdDsa => "EdDSA",
            SigningAlgorithm::Es256 => "ES256",
        }
    }
}

impl FromStr for SigningAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "EdDSA" | "eddsa" | "ed25519" => Ok(SigningAlgorithm::EdDsa),
            "ES256" | "es256" => Ok(SigningAlgorithm::Es256),
            _ => Err("expected EdDSA or ES256".into()),
        }
    }
}

/// The one forwarding header a trusted proxy writes; the client address is
/// its right-most hop that is not a trusted proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyHeader {
    XForwardedFor,
    Forwarded,
}

impl ProxyHeader {
    pub fn name(self) -> &'static str {
        match self {
            ProxyHeader::XForwardedFor => "x-forwarded-for",
            ProxyHeader::Forwarded => "forwarded",
        }
    }

    pub fn parse(s: &str) -> Result<ProxyHeader, String> {
        match s.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ProxyHeader::XForwardedFor),
            "forwarded" => Ok(ProxyHeader::Forwarded),
            _ => Err("expected x-forwarded-for or forwarded (the header your proxy writes)".into()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Argon2Config {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub database: DatabaseConfig,
    pub redis: Option<RedisConfig>,
    pub mail: MailConfig,
    pub mail_from: String,
    pub rate_limit: bool,
    pub policies: Policies,
    pub brute_force: crate::limits::BruteForceRules,
    /// Per account over every address (delays only).
    pub brute_force_account: crate::limits::BruteForceRules,
    /// Accounts never verified are deleted this long after their last registration.
    pub unverified_account_ttl: Duration,
    /// Mail given up on is kept this long as a dead letter.
    pub mail_dead_letter_ttl: Duration,
    /// Where `/metrics` is served (an operator's listener, loopback by
    /// default); `None`: nowhere.
    pub admin_listen: Option<SocketAddr>,
    pub trusted_proxies: Vec<IpAddr>,
    pub trusted_proxy_header: ProxyHeader,
    pub log_format: LogFormat,
    pub log_level: String,
    /// Where to export spans over OTLP/HTTP (the full `.../v1/traces` URL);
    /// `None`: no export.
    pub otlp_traces_url: Option<String>,
    /// Master secret (32+ bytes). Unset: read or create `<data_dir>/secret.key`.
    pub secret_key: Option<Secret<Vec<u8>>>,
    pub issuer: String,
    pub audience: String,
    pub signing_algorithm: SigningAlgorithm,
    pub access_token_ttl: Duration,
    pub refresh_token_ttl: Duration,
    pub refresh_grace: Duration,
    pub argon2: Argon2Config,
    pub hash_threads: usize,
    pub hash_queue: usize,
    pub hash_budget: Duration,
    pub credential_cache: bool,
    pub credential_cache_ttl: Duration,
    pub credential_cache_capacity: usize,
    pub token_cache_capacity: usize,
    pub request_timeout: Duration,
    pub body_limit: usize,
    pub shutdown_timeout: Duration,
    pub key_refresh_interval: Duration,
}

/// Where the raw settings come from: the environment and an optional TOML table.
pub struct Sources {
    env: BTreeMap<String, String>,
    file: toml::Table,
}

impl Sources {
    /// The process environment plus the file at `path`, if any.
    pub fn load(path: Option<&Path>) -> Result<Sources, ConfigError> {
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with("LATCHKEY_") && !k.starts_with("LATCHKEY_TEST_"))
            .collect();
        let file = match path {
            None => toml::Table::new(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| ConfigError::new("--config", format!("cannot read {}: {e}", p.display())))?;
                text.parse::<toml::Table>().map_err(|e| {
                    ConfigError::new(
                        "--config",
                        format!("{}: {}", p.display(), e.message().replace('\n', " ")),
                    )
                })?
            }
        };
        Ok(Sources { env, file })
    }

    /// Settings given explicitly (tests, embedding).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Sources {
        Sources {
            env: pairs
                .into_iter()
                .map(|(k, v)| (format!("LATCHKEY_{}", k.to_ascii_uppercase()), v.to_string()))
                .collect(),
            file: toml::Table::new(),
        }
    }

    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.env
            .insert(format!("LATCHKEY_{}", key.to_ascii_uppercase()), value.into());
    }

    /// Raw value of setting `key` and the name to report it under.
    fn raw(&self, key: &str) -> Option<(String, String)> {
        let env_name = format!("LATCHKEY_{}", key.to_ascii_uppercase());
        if let Some(v) = self.env.get(&env_name) {
            return Some((v.clone(), env_name));
        }
        // In the file, `listen` and `LATCHKEY_LISTEN` are both accepted.
        let (file_key, v) = match self.file.get(key) {
            Some(v) => (key.to_string(), v),
            None => (env_name.clone(), self.file.get(&env_name)?),
        };
        let s = match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => format!("{other:?}"),
        };
        Some((s, format!("{file_key} (in the --config file)")))
    }

    /// Setting `key` parsed by `parse`, or `default` when it is not set.
    pub(crate) fn get<T>(
        &self,
        key: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        match self.raw(key) {
            None => Ok(default),
            Some((v, name)) => parse(v.trim()).map_err(|m| ConfigError::new(name, m)),
        }
    }

    fn name_of(&self, key: &str) -> String {
        self.raw(key)
            .map(|(_, n)| n)
            .unwrap_or_else(|| format!("LATCHKEY_{}", key.to_ascii_uppercase()))
    }

    pub fn file_table(&self, key: &str) -> Option<&toml::Table> {
        self.file.get(key).and_then(|v| v.as_table())
    }
}

fn parse_num<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, String>
where
    T: FromStr + PartialOrd + fmt::Display + Copy,
{
    move |s| {
        let v: T = s.parse().map_err(|_| format!("expected a number, got {s:?}"))?;
        if v < min || v > max {
            return Err(format!("must be between {min} and {max}"));
        }
        Ok(v)
    }
}

fn parse_secs(min: u64, max: u64) -> impl Fn(&str) -> Result<Duration, String> {
    move |s| parse_num(min, max)(s).map(Duration::from_secs)
}

fn parse_millis(min: u64, max: u64) -> impl Fn(&str) -> Result<Duration, String> {
    move |s| parse_num(min, max)(s).map(Duration::from_millis)
}

/// The brute-force thresholds (docs/design.md, "Security rules as pure state
/// machines"): the lock stays bounded (an hour at most), so that nobody can
/// keep a victim out for long.
fn brute_force_rules(src: &Sources) -> Result<crate::limits::BruteForceRules, ConfigError> {
    let d = crate::limits::BruteForceRules::DEFAULT;
    let secs =
        |name: &str, default: i64, max: i64| src.get(name, default, parse_num(1, max)).map(|s| s * 1000);
    let rules = crate::limits::BruteForceRules {
        free: src.get("brute_force_free_failures", d.free, parse_num(0, 100))?,
        lock_at: src.get("brute_force_lock_after", d.lock_at, parse_num(1, 1000))?,
        max_delay_ms: secs("brute_force_max_delay_secs", d.max_delay_ms / 1000, 3600)?,
        lock_ms: secs("brute_force_lock_secs", d.lock_ms / 1000, 3600)?,
        reset_after_ms: secs("brute_force_reset_secs", d.reset_after_ms / 1000, 86_400)?,
    };
    if rules.lock_at <= rules.free {
        return Err(ConfigError::new(
            src.name_of("brute_force_lock_after"),
            "must exceed brute_force_free_failures",
        ));
    }
    if rules.lock_ms < rules.max_delay_ms {
        return Err(ConfigError::new(
            src.name_of("brute_force_lock_secs"),
            "must be at least brute_force_max_delay_secs",
        ));
    }
    Ok(rules)
}

/// The account-wide thresholds: far above the per-address ones, growing
/// delays and no lock, so that distributed guessing is capped and nobody
/// can lock an owner out.
fn brute_force_account_rules(
    src: &Sources,
    per_address: &crate::limits::BruteForceRules,
) -> Result<crate::limits::BruteForceRules, ConfigError> {
    let d = crate::limits::BruteForceRules::ACCOUNT_DEFAULT;
    let rules = crate::limits::BruteForceRules {
        free: src.get("brute_force_account_free_failures", d.free, parse_num(1, 100_000))?,
        max_delay_ms: src.get(
            "brute_force_account_max_delay_secs",
            d.max_delay_ms / 1000,
            parse_num(1, 3600),
        )? * 1000,
        reset_after_ms: src.get(
            "brute_force_account_reset_secs",
            d.reset_after_ms / 1000,
            parse_num(60, 7 * 86_400),
        )? * 1000,
        ..d
    };
    if rules.free <= per_address.free {
        return Err(ConfigError::new(
            src.name_of("brute_force_account_free_failures"),
            "must exceed brute_force_free_failures (the account-wide count covers every address)",
        ));
    }
    Ok(rules)
}

fn parse_switch(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
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

fn parse_redis_url(s: &str) -> Result<Secret<String>, String> {
    let u = url::Url::parse(s).map_err(|e| format!("not a valid URL: {e}"))?;
    match u.scheme() {
        "redis" | "rediss" => Ok(Secret(s.to_string())),
        other => Err(format!(
            "unsupported scheme {other:?}: expected redis://host:port"
        )),
    }
}

pub fn parse_mail(s: &str) -> Result<MailConfig, String> {
    if s == "log" {
        return Ok(MailConfig::Log);
    }
    if let Some(dir) = s.strip_prefix("file:") {
        if dir.is_empty() {
            return Err("file: needs a directory, e.g. file:./data/mail".into());
        }
        return Ok(MailConfig::File(PathBuf::from(dir)));
    }
    if s.starts_with("smtp://") || s.starts_with("smtps://") {
        let u = url::Url::parse(s).map_err(|e| format!("not a valid URL: {e}"))?;
        let host = u
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("smtp:// needs a host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let implicit = u.scheme() == "smtps";
        let mut tls = if implicit {
            SmtpTls::Implicit
        } else {
            SmtpTls::StartTls
        };
        for (k, v) in u.query_pairs() {
            match (k.as_ref(), v.as_ref(), implicit) {
                ("tls", "none", false) => tls = SmtpTls::None,
                ("tls", "starttls", false) => tls = SmtpTls::StartTls,
                ("tls", _, _) => {
                    return Err("tls= takes starttls (the default) or none, and only with smtp://".into())
                }
                (other, _, _) => return Err(format!("unknown parameter {other:?} (known: tls)")),
            }
        }
        let port = u.port().unwrap_or(if implicit { 465 } else { 587 });
        let credentials = if u.username().is_empty() {
            None
        } else {
            let user = percent_decode(u.username());
            let pass = percent_decode(u.password().unwrap_or(""));
            Some((user, Secret(pass)))
        };
        return Ok(MailConfig::Smtp {
            host,
            port,
            credentials,
            from: String::new(),
            tls,
            ca_file: None,
        });
    }
    Err("expected log, file:DIR, smtps://[user:pass@]host[:port] or smtp://[user:pass@]host[:port][?tls=none]".into())
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let listen = src.get("listen", SocketAddr::from(([127, 0, 0, 1], 8080)), |s| {
            s.parse()
                .map_err(|_| format!("expected host:port such as 127.0.0.1:8080, got {s:?}"))
        })?;
        let data_dir = src.get("data_dir", PathBuf::from("./data"), |s| Ok(PathBuf::from(s)))?;
        let default_db = DatabaseUrl::Sqlite(format!("sqlite://{}", data_dir.join("latchkey.db").display()));
        let url = src.get("database_url", default_db, parse_database_url)?;
        let is_sqlite = matches!(url, DatabaseUrl::Sqlite(_));
        let database = DatabaseConfig {
            url,
            own_dir: data_dir.clone(),
            // SQLite has one writer: one connection avoids SQLITE_BUSY retries.
            max_connections: src.get(
                "database_max_connections",
                if is_sqlite { 1 } else { (cores as u32 * 4).max(8) },
                parse_num(1, 1000),
            )?,
            min_connections: src.get(
                "database_min_connections",
                if is_sqlite { 1 } else { 2 },
                parse_num(0, 1000),
            )?,
            acquire_timeout: src.get(
                "database_acquire_timeout_ms",
                Duration::from_millis(1000),
                parse_millis(1, 60_000),
            )?,
        };
        if database.min_connections > database.max_connections {
            return Err(ConfigError::new(
                src.name_of("database_min_connections"),
                "must not exceed database_max_connections",
            ));
        }
        let redis_url = src.get("redis_url", None, |s| {
            if s.is_empty() {
                Ok(None)
            } else {
                parse_redis_url(s).map(Some)
            }
        })?;
        let key_prefix = src.get("redis_key_prefix", "latchkey:".to_string(), |s| {
            if s.is_empty() || s.len() > 64 {
                return Err("must be 1..=64 characters".into());
            }
            Ok(if s.ends_with(':') {
                s.to_string()
            } else {
                format!("{s}:")
            })
        })?;
        let redis = redis_url.map(|url| RedisConfig { url, key_prefix });
        let mail_from = src.get("mail_from", "latchkey <no-reply@localhost>".to_string(), |s| {
            if s.contains('@') {
                Ok(s.to_string())
            } else {
                Err("expected an address such as Example <no-reply@example.com>".into())
            }
        })?;
        let mut mail = src.get("mail", MailConfig::Log, parse_mail)?;
        let mail_ca = src.get("mail_tls_ca_file", None, |s| Ok(Some(PathBuf::from(s))))?;
        if let MailConfig::Smtp { from, ca_file, .. } = &mut mail {
            *from = mail_from.clone();
            *ca_file = mail_ca;
        }
        let rate_limit = src.get("rate_limit", true, parse_switch)?;
        let policies = Policies::from_sources(src)?;
        let brute_force = brute_force_rules(src)?;
        let brute_force_account = brute_force_account_rules(src, &brute_force)?;
        let admin_listen = src.get(
            "admin_listen",
            Some(SocketAddr::from(([127, 0, 0, 1], 9180))),
            |s| {
                if s.eq_ignore_ascii_case("off") {
                    return Ok(None);
                }
                s.parse()
                    .map(Some)
                    .map_err(|_| format!("expected host:port such as 127.0.0.1:9180, or off, got {s:?}"))
            },
        )?;
        let trusted_proxies = src.get("trusted_proxies", Vec::new(), |s| {
            s.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse::<IpAddr>()
                        .map_err(|_| format!("{p:?} is not an IP address"))
                })
                .collect()
        })?;
        let trusted_proxy_header = src.get(
            "trusted_proxy_header",
            ProxyHeader::XForwardedFor,
            ProxyHeader::parse,
        )?;
        let log_format = src.get("log_format", LogFormat::Human, |s| match s {
            "human" | "text" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            _ => Err("expected human or json".into()),
        })?;
        let log_level = src.get("log", "info".to_string(), |s| {
            tracing_subscriber::EnvFilter::try_new(s)
                .map(|_| s.to_string())
                .map_err(|e| format!("not a log filter: {e}"))
        })?;
        let otlp_traces_url = src.get("otlp_endpoint", None, |s| {
            if s.is_empty() {
                Ok(None)
            } else {
                crate::telemetry::otlp::traces_url(s).map(Some)
            }
        })?;
        let secret_key = src.get("secret_key", None, |s| parse_secret_key(s).map(Some))?;
        let issuer = src.get("issuer", format!("http://{listen}"), |s| {
            url::Url::parse(s)
                .map(|_| s.trim_end_matches('/').to_string())
                .map_err(|e| format!("not a URL: {e}"))
        })?;
        let audience = src.get("audience", "latchkey".to_string(), |s| {
            if s.is_empty() {
                Err("must not be empty".into())
            } else {
                Ok(s.to_string())
            }
        })?;
        let argon2 = Argon2Config {
            memory_kib: src.get("argon2_memory_kib", 19_456, parse_num(8, 4 * 1024 * 1024))?,
            iterations: src.get("argon2_iterations", 2, parse_num(1, 100))?,
            parallelism: src.get("argon2_parallelism", 1, parse_num(1, 64))?,
        };
        Ok(Config {
            listen,
            data_dir,
            database,
            redis,
            mail,
            mail_from,
            rate_limit,
            policies,
            brute_force,
            brute_force_account,
            unverified_account_ttl: src.get(
                "unverified_account_ttl_secs",
                Duration::from_secs(7 * 86_400),
                parse_secs(60, 365 * 86_400),
            )?,
            mail_dead_letter_ttl: src.get(
                "mail_dead_letter_ttl_secs",
                Duration::from_secs(7 * 86_400),
                parse_secs(60, 365 * 86_400),
            )?,
            admin_listen,
            trusted_proxies,
            trusted_proxy_header,
            log_format,
            log_level,
            otlp_traces_url,
            secret_key,
            issuer,
            audience,
            signing_algorithm: src.get("signing_algorithm", SigningAlgorithm::EdDsa, |s| s.parse())?,
            access_token_ttl: src.get(
                "access_token_ttl_secs",
                Duration::from_secs(900),
                parse_secs(30, 86_400),
            )?,
            refresh_token_ttl: src.get(
                "refresh_token_ttl_secs",
                Duration::from_secs(30 * 86_400),
                parse_secs(60, 365 * 86_400),
            )?,
            refresh_grace: src.get("refresh_grace_secs", Duration::from_secs(10), parse_secs(0, 300))?,
            argon2,
            hash_threads: src.get("hash_threads", cores, parse_num(1, 256))?,
            hash_queue: src.get("hash_queue", 64, parse_num(0, 100_000))?,
            hash_budget: src.get(
                "hash_budget_ms",
                Duration::from_millis(150),
                parse_millis(1, 60_000),
            )?,
            credential_cache: src.get("credential_cache", true, parse_switch)?,
            credential_cache_ttl: src.get(
                "credential_cache_ttl_secs",
                Duration::from_secs(600),
                parse_secs(1, 86_400),
            )?,
            credential_cache_capacity: src.get(
                "credential_cache_capacity",
                100_000,
                parse_num(1, 10_000_000),
            )?,
            token_cache_capacity: src.get("token_cache_capacity", 100_000, parse_num(1, 10_000_000))?,
            request_timeout: src.get(
                "request_timeout_ms",
                Duration::from_millis(5000),
                parse_millis(10, 600_000),
            )?,
            body_limit: src.get("body_limit_bytes", 16 * 1024, parse_num(256, 16 * 1024 * 1024))?,
            shutdown_timeout: src.get(
                "shutdown_timeout_secs",
                Duration::from_secs(10),
                parse_secs(0, 600),
            )?,
            key_refresh_interval: src.get(
                "key_refresh_secs",
                Duration::from_secs(10),
                parse_secs(1, 3600),
            )?,
        })
    }

    pub fn is_sqlite(&self) -> bool {
        matches!(self.database.url, DatabaseUrl::Sqlite(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_embedded_setup() {
        let c = Config::from_sources(&Sources::from_pairs([])).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert!(c.is_sqlite());
        assert!(c.redis.is_none());
        assert_eq!(c.mail, MailConfig::Log);
        assert!(c.rate_limit);
        assert_eq!(c.argon2.memory_kib, 19_456);
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
    fn mail_settings_parse() {
        assert_eq!(
            parse_mail("file:/tmp/m").unwrap(),
            MailConfig::File("/tmp/m".into())
        );
        match parse_mail("smtp://a%40b:p@host:2525").unwrap() {
            MailConfig::Smtp {
                host,
                port,
                credentials,
                ..
            } => {
                assert_eq!((host.as_str(), port), ("host", 2525));
                assert_eq!(credentials.unwrap().0, "a@b");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_mail("carrier-pigeon").is_err());
        // TLS unless plain text is asked for by name.
        let tls = |s: &str| match parse_mail(s).unwrap() {
            MailConfig::Smtp { tls, port, .. } => (tls, port),
            other => panic!("{other:?}"),
        };
        assert_eq!(tls("smtp://relay.example"), (SmtpTls::StartTls, 587));
        assert_eq!(tls("smtps://relay.example"), (SmtpTls::Implicit, 465));
        assert_eq!(tls("smtp://127.0.0.1:2525?tls=none"), (SmtpTls::None, 2525));
        assert!(parse_mail("smtps://relay.example?tls=none").is_err());
        assert!(parse_mail("smtp://relay.example?tls=maybe").is_err());
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
        src.env.clear();
        let c = Config::from_sources(&src).unwrap();
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.mail, MailConfig::File("/tmp/m".into()));
        assert_eq!(c.hash_threads, 3);
        src.set("listen", "127.0.0.1:7777");
        assert_eq!(Config::from_sources(&src).unwrap().listen.port(), 7777);
        std::fs::write(&path, "hash_threads = \"many\"\n").unwrap();
        let mut src = Sources::load(Some(&path)).unwrap();
        src.env.clear();
        let err = Config::from_sources(&src).unwrap_err().to_string();
        assert!(err.contains("hash_threads") && err.contains("--config"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn otlp_endpoint() {
        let c = Config::from_sources(&Sources::from_pairs([])).unwrap();
        assert_eq!(c.otlp_traces_url, None);
        let c =
            Config::from_sources(&Sources::from_pairs([("otlp_endpoint", "http://127.0.0.1:4318")])).unwrap();
        assert_eq!(
            c.otlp_traces_url.as_deref(),
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

    #[test]
    fn brute_force_rules_are_bounded_and_consistent() {
        let c = Config::from_sources(&Sources::from_pairs([])).unwrap();
        assert_eq!(c.brute_force, crate::limits::BruteForceRules::DEFAULT);
        let c = Config::from_sources(&Sources::from_pairs([
            ("brute_force_free_failures", "2"),
            ("brute_force_lock_after", "3"),
            ("brute_force_lock_secs", "4"),
            ("brute_force_max_delay_secs", "1"),
        ]))
        .unwrap();
        assert_eq!((c.brute_force.free, c.brute_force.lock_at), (2, 3));
        assert_eq!(
            (c.brute_force.lock_ms, c.brute_force.max_delay_ms),
            (4_000, 1_000)
        );
        for (pairs, field) in [
            (vec![("brute_force_lock_secs", "3601")], "brute_force_lock_secs"),
            (vec![("brute_force_lock_secs", "0")], "brute_force_lock_secs"),
            (
                vec![("brute_force_free_failures", "-1")],
                "brute_force_free_failures",
            ),
            (
                vec![("brute_force_free_failures", "20")],
                "brute_force_lock_after",
            ),
            (vec![("brute_force_lock_secs", "30")], "brute_force_lock_secs"),
        ] {
            let e = Config::from_sources(&Sources::from_pairs(pairs.clone())).unwrap_err();
            assert!(e.to_string().to_lowercase().contains(field), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn rate_limit_switch() {
        let c = Config::from_sources(&Sources::from_pairs([("rate_limit", "off")])).unwrap();
        assert!(!c.rate_limit);
        assert!(Config::from_sources(&Sources::from_pairs([("rate_limit", "maybe")])).is_err());
    }
}
