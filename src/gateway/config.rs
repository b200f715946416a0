//! The gateway's configuration: one TOML file (`latchkey gateway --config
//! FILE`), validated entirely at start. Any mistake stops start-up (or a
//! SIGHUP reload) with one line that names the field, e.g.
//! `invalid setting routes[2].rate_limit.key: expected "sub", "client_id" or "ip"`.
//! Unknown keys are errors too, so that a typo cannot silently turn a
//! protection off. `redis_url` may hold a password: it is never printed.
//!
//! The reference for every key is `deploy/gateway.example.toml` and
//! `docs/gateway.md`.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use axum::http::{HeaderName, Uri};

use crate::cache::RedisConfig;
use crate::limits::{Fallback, Policy};
use crate::server::connections::ConnectionSettings;
use crate::settings::{ip, socket_addr, ConfigError, Source};
use crate::telemetry::LogSettings;

/// What a route's rate limit counts by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKey {
    /// The token's subject (one bucket per user).
    Subject,
    /// The token's `client_id` (one bucket per OAuth client).
    ClientId,
    /// The client address (trusted proxies' `X-Forwarded-For` believed).
    Ip,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RateLimitConfig {
    pub policy: Policy,
    pub key: LimitKey,
}

/// Which hosts a route serves: one name, or `*.example.com` (any subdomain).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HostMatch {
    Exact(String),
    /// The suffix with its leading dot: `.example.com`.
    Subdomains(String),
}

impl HostMatch {
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Subdomains(suffix) => {
                host.len() > suffix.len()
                    && host.is_char_boundary(host.len() - suffix.len())
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub host: Option<HostMatch>,
    pub path_prefix: String,
    /// `http://host:port`, without a trailing slash.
    pub upstream_origin: String,
    /// The upstream URL's path without a trailing slash ("" for none).
    pub upstream_path: String,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    /// Whether `path_prefix` matches only in its own case. By default a
    /// protected route (`auth`) matches in any case (fail closed: behind
    /// an upstream that routes without regard to case, `/ADMIN` must not
    /// take the public route), a public one in its own; `case_sensitive`
    /// in the file sets it either way.
    pub case_sensitive: bool,
    /// Headers a proxy in front asserts ([`super::headers::Reserved::ProxyAssertion`])
    /// that this route takes from a `trusted_proxies` peer
    /// (`allow_client_headers`), on purpose.
    pub allow_client_headers: Vec<HeaderName>,
    pub auth: bool,
    /// Only tokens of a session that passed a second factor (`mfa` in
    /// `amr`); others answer 401 with RFC 9470's
    /// `insufficient_user_authentication`.
    pub require_mfa: bool,
    pub audiences: Vec<String>,
    pub forward_authorization: bool,
    pub timeout: Duration,
    pub rate_limit: Option<RateLimitConfig>,
}

/// Names of the identity headers sent upstream (and always stripped from clients).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityHeaders {
    pub subject: HeaderName,
    pub email: HeaderName,
    pub session: HeaderName,
    pub client_id: HeaderName,
}

impl Default for IdentityHeaders {
    fn default() -> Self {
        IdentityHeaders {
            subject: HeaderName::from_static("x-auth-subject"),
            email: HeaderName::from_static("x-auth-email"),
            session: HeaderName::from_static("x-auth-session"),
            client_id: HeaderName::from_static("x-auth-client-id"),
        }
    }
}

impl IdentityHeaders {
    pub fn all(&self) -> [&HeaderName; 4] {
        [&self.subject, &self.email, &self.session, &self.client_id]
    }
}

/// Which forwarding headers the gateway sets (all are removed from the client's request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardHeaders {
    /// `X-Forwarded-For`: the chain of a trusted proxy in front, then the peer.
    pub x_forwarded_for: bool,
    /// `X-Forwarded-Host`: the host the request was routed by.
    pub x_forwarded_host: bool,
    /// `X-Forwarded-Proto`: a trusted proxy's, else `http`.
    pub x_forwarded_proto: bool,
    /// `X-Real-IP`: the client address (rightmost untrusted hop).
    pub x_real_ip: bool,
    /// `Forwarded` (RFC 7239): `for=<client>;host=<host>;proto=<proto>`.
    pub forwarded: bool,
}

impl Default for ForwardHeaders {
    fn default() -> Self {
        ForwardHeaders {
            x_forwarded_for: true,
            x_forwarded_host: true,
            x_forwarded_proto: true,
            x_real_ip: false,
            forwarded: false,
        }
    }
}

/// What a token is worth when the gateway cannot know whether its session
/// was revoked (Redis unreachable and no poll answered lately).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownRevocations {
    /// `503` on authenticated routes until the view is back (the default).
    Refuse,
    /// Let the token through (its session may have ended).
    Accept,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevocationSource {
    /// The service's `http://<admin_listen>/revocations`, polled always (a
    /// safety net under Redis, the only source without it).
    pub poll_url: Option<String>,
    pub poll_interval: Duration,
    pub when_unknown: UnknownRevocations,
}

/// The upstream connection pool (shared by every route).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    /// Default of `routes[].timeout_ms`: time until the upstream's response headers.
    pub timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// Upstream requests open at once, all routes together (from sending
    /// until the answer's body ends); past it, `503 OVERLOADED`. With one
    /// serving thread per core, each thread has its share.
    pub max_requests: usize,
}

/// How requests are spread over the serving threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeModel {
    /// One single-threaded runtime, listener (SO_REUSEPORT) and upstream
    /// pool per thread: no cross-thread wake-ups, the most requests per core.
    PerCore,
    /// One multi-threaded runtime whose threads steal each other's tasks,
    /// one listener and one pool: a thread the OS preempts does not hold
    /// its connections back (better tails when the cores are oversubscribed).
    WorkStealing,
}

/// Where rate-limit buckets live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimiterStore {
    /// In this process (a limit holds per gateway instance).
    Local,
    /// In Redis (shared by every instance; one EVALSHA per check).
    Redis,
}

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    /// Serving threads. Default: the number of cores.
    pub workers: usize,
    /// How the serving threads share the work.
    pub runtime: RuntimeModel,
    /// `/metrics` and `/health/*` on their own address; unset: on `listen`.
    pub admin_listen: Option<SocketAddr>,
    pub jwks_url: String,
    pub issuer: String,
    pub audiences: Vec<String>,
    pub jwks_refresh: Duration,
    pub access_token_ttl: Duration,
    pub token_cache_capacity: usize,
    pub redis: Option<RedisConfig>,
    pub limiter: LimiterStore,
    pub trusted_proxies: Vec<IpAddr>,
    pub identity: IdentityHeaders,
    /// The forwarding headers the gateway writes (every other one, and every
    /// client-sent one, is removed).
    pub forward_headers: ForwardHeaders,
    /// Revocations the gateway cannot learn from Redis: polled from the
    /// service's admin listener (`GET /revocations`), and what to do with a
    /// token while neither source has been heard from.
    pub revocations: RevocationSource,
    pub upstream: UpstreamSettings,
    /// Time limits and the cap for client connections (`header_timeout_ms`,
    /// `max_connections`, read as the service reads them).
    pub connections: ConnectionSettings,
    pub shutdown_timeout: Duration,
    /// How much of a request body without a length (chunked) is read
    /// before anything goes upstream (`request_read_ahead_bytes`): within
    /// it, a framing error is a 400 the upstream never sees (`body.rs`).
    pub read_ahead: usize,
    pub log: LogSettings,
    pub routes: Vec<RouteConfig>,
    /// A digest of each `Restart` setting as the file wrote it (absent:
    /// not written), to tell a reload which of them changed. Digests, not
    /// the values: `redis_url` may hold a password.
    restart_values: std::collections::BTreeMap<&'static str, [u8; 32]>,
}

/// The digests of the `Restart` settings of the file's table `t`.
fn restart_values(t: &toml::Table) -> std::collections::BTreeMap<&'static str, [u8; 32]> {
    TOP_KEYS
        .iter()
        .filter(|(_, takes)| *takes == Takes::Restart)
        .filter_map(|(k, _)| {
            t.get(*k)
                .map(|v| (*k, crate::crypto::sha256(format!("{v:?}").as_bytes())))
        })
        .collect()
}

type Result<T> = std::result::Result<T, ConfigError>;

/// A TOML table being read, with the dotted path used in error messages.
struct Fields<'a> {
    path: String,
    table: &'a toml::Table,
}

impl<'a> Fields<'a> {
    fn new(path: impl Into<String>, table: &'a toml::Table, allowed: &[&str]) -> Result<Fields<'a>> {
        let f = Fields {
            path: path.into(),
            table,
        };
        for key in table.keys() {
            if !allowed.contains(&key.as_str()) {
                return Err(f.err(key, "unknown setting (check the spelling)"));
            }
        }
        Ok(f)
    }

    fn name(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.name(key), message)
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.trim())),
            Some(_) => Err(self.err(key, "expected a string")),
        }
    }

    fn required(&self, key: &str) -> Result<&'a str> {
        match self.string(key)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(self.err(key, "is required")),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool> {
        match self.table.get(key) {
            None => Ok(default),
            Some(toml::Value::Boolean(b)) => Ok(*b),
            Some(_) => Err(self.err(key, "expected true or false")),
        }
    }

    fn number(&self, key: &str, default: u64, min: u64, max: u64) -> Result<u64> {
        match self.table.get(key) {
            None => Ok(default),
            Some(toml::Value::Integer(i)) if (min as i128..=max as i128).contains(&(*i as i128)) => {
                Ok(*i as u64)
            }
            Some(toml::Value::Integer(_)) => Err(self.err(key, format!("must be between {min} and {max}"))),
            Some(_) => Err(self.err(key, "expected a whole number")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().map(str::trim).ok_or_else(|| {
                        ConfigError::new(format!("{}[{i}]", self.name(key)), "expected a string")
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(self.err(key, "expected a list of strings, e.g. [\"a\", \"b\"]")),
        }
    }

    fn table(&self, key: &str) -> Result<Option<&'a toml::Table>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(_) => Err(self.err(key, "expected a table")),
        }
    }
}

/// A table's values are read as the service's are, with the same parsers
/// and messages; a list is a TOML array, each item named `key[i]`, and a
/// number may be a TOML integer.
impl Source for Fields<'_> {
    /// A string, or a whole number given as one (`header_timeout_ms = 5000`).
    fn text(&self, key: &str) -> Result<Option<(String, String)>> {
        if let Some(toml::Value::Integer(i)) = self.table.get(key) {
            return Ok(Some((i.to_string(), self.name(key))));
        }
        Ok(self.string(key)?.map(|s| (s.to_string(), self.name(key))))
    }

    fn items(&self, key: &str) -> Result<Option<Vec<(String, String)>>> {
        Ok(self.strings(key)?.map(|items| {
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (v.to_string(), format!("{}[{i}]", self.name(key))))
                .collect()
        }))
    }

    fn name_of(&self, key: &str) -> String {
        self.name(key)
    }
}

/// When a change of a top-level setting takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takes {
    /// At the next reload (SIGHUP): it is part of the route table
    /// (`routes::RouteTable::new` reads only these).
    Reload,
    /// Only at restart: it shapes the listeners, the serving threads, the
    /// pools, the token verifier, the revocation sources or the log. A
    /// reload that changes it warns and keeps the running value.
    Restart,
}

/// Every top-level key of the file, and when a change to it takes effect:
/// the one list both the reader (unknown keys are errors) and the reload
/// (which reports the `Restart` keys whose values changed) go by.
const TOP_KEYS: &[(&str, Takes)] = &[
    ("listen", Takes::Restart),
    ("workers", Takes::Restart),
    ("runtime", Takes::Restart),
    ("admin_listen", Takes::Restart),
    ("jwks_url", Takes::Restart),
    ("issuer", Takes::Restart),
    ("audiences", Takes::Restart),
    ("jwks_refresh_secs", Takes::Restart),
    ("access_token_ttl_secs", Takes::Restart),
    ("token_cache_capacity", Takes::Restart),
    ("redis_url", Takes::Restart),
    ("redis_cluster", Takes::Restart),
    ("redis_readiness", Takes::Restart),
    ("redis_key_prefix", Takes::Restart),
    ("rate_limit_store", Takes::Restart),
    ("trusted_proxies", Takes::Reload),
    ("shutdown_timeout_secs", Takes::Restart),
    ("header_timeout_ms", Takes::Restart),
    ("max_connections", Takes::Restart),
    ("log", Takes::Restart),
    ("log_format", Takes::Restart),
    ("identity_headers", Takes::Reload),
    ("forward_headers", Takes::Reload),
    ("revocations_url", Takes::Restart),
    ("revocations_poll_ms", Takes::Restart),
    ("on_unknown_revocations", Takes::Reload),
    ("upstream", Takes::Restart),
    ("request_read_ahead_bytes", Takes::Reload),
    ("routes", Takes::Reload),
];

const ROUTE_KEYS: &[&str] = &[
    "name",
    "host",
    "path_prefix",
    "upstream",
    "strip_prefix",
    "preserve_host",
    "case_sensitive",
    "allow_client_headers",
    "auth",
    "require_mfa",
    "audiences",
    "forward_authorization",
    "timeout_ms",
    "rate_limit",
];

impl GatewayConfig {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<GatewayConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("--config", format!("cannot read {}: {e}", path.display())))?;
        GatewayConfig::from_toml(&text).map_err(|mut e| {
            if e.name == "--config" {
                e.message = format!("{}: {}", path.display(), e.message);
            }
            e
        })
    }

    /// Parses and validates a configuration given as TOML text.
    pub fn from_toml(text: &str) -> Result<GatewayConfig> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::new("--config", e.message().replace('\n', " ")))?;
        GatewayConfig::from_table(&table)
    }

    fn from_table(t: &toml::Table) -> Result<GatewayConfig> {
        let keys: Vec<&str> = TOP_KEYS.iter().map(|(k, _)| *k).collect();
        let f = Fields::new("", t, &keys)?;
        let listen = f.get(
            "listen",
            SocketAddr::from(([127, 0, 0, 1], 8000)),
            socket_addr("127.0.0.1:8000"),
        )?;
        let admin_listen = f.get("admin_listen", None, |s| {
            socket_addr("127.0.0.1:9181")(s).map(Some)
        })?;
        let jwks_url = f.required("jwks_url")?;
        let jwks: Uri = jwks_url.parse().map_err(|_| f.err("jwks_url", "not a URL"))?;
        if jwks.scheme_str() != Some("http") || jwks.host().is_none() {
            return Err(f.err(
                "jwks_url",
                "expected an http:// URL such as http://127.0.0.1:8080/.well-known/jwks.json",
            ));
        }
        let issuer = f.required("issuer")?;
        url::Url::parse(issuer).map_err(|e| f.err("issuer", format!("not a URL: {e}")))?;
        let issuer = issuer.trim_end_matches('/').to_string();
        let audiences = match f.strings("audiences")? {
            None => vec!["latchkey".to_string()],
            Some(v) if v.is_empty() || v.iter().any(|a| a.is_empty()) => {
                return Err(f.err("audiences", "must be a non-empty list of non-empty strings"))
            }
            Some(v) => v.into_iter().map(String::from).collect(),
        };
        let redis = RedisConfig::read(&f)?;
        let limiter = match f.string("rate_limit_store")? {
            None if redis.is_some() => LimiterStore::Redis,
            None | Some("local") => LimiterStore::Local,
            Some("redis") if redis.is_some() => LimiterStore::Redis,
            Some("redis") => return Err(f.err("rate_limit_store", "redis needs redis_url")),
            Some(_) => return Err(f.err("rate_limit_store", "expected \"local\" or \"redis\"")),
        };
        let trusted_proxies = f.list("trusted_proxies", ip)?;
        let log = LogSettings::read(&f)?;
        let identity = match f.table("identity_headers")? {
            None => IdentityHeaders::default(),
            Some(t) => identity_headers(t)?,
        };
        let forward_headers = match f.strings("forward_headers")? {
            None => ForwardHeaders::default(),
            Some(list) => {
                let mut h = ForwardHeaders {
                    x_forwarded_for: false,
                    x_forwarded_host: false,
                    x_forwarded_proto: false,
                    x_real_ip: false,
                    forwarded: false,
                };
                for (i, name) in list.iter().enumerate() {
                    let slot = match name.to_ascii_lowercase().as_str() {
                        "x-forwarded-for" => &mut h.x_forwarded_for,
                        "x-forwarded-host" => &mut h.x_forwarded_host,
                        "x-forwarded-proto" => &mut h.x_forwarded_proto,
                        "x-real-ip" => &mut h.x_real_ip,
                        "forwarded" => &mut h.forwarded,
                        _ => {
                            return Err(ConfigError::new(
                                format!("forward_headers[{i}]"),
                                "expected x-forwarded-for, x-forwarded-host, x-forwarded-proto, x-real-ip or forwarded",
                            ))
                        }
                    };
                    *slot = true;
                }
                h
            }
        };
        let poll_url = match f.string("revocations_url")? {
            None | Some("") => None,
            Some(s) => {
                let u: Uri = s.parse().map_err(|_| f.err("revocations_url", "not a URL"))?;
                if u.scheme_str() != Some("http") || u.host().is_none() {
                    return Err(f.err(
                        "revocations_url",
                        "expected the service's admin listener, e.g. http://127.0.0.1:9180/revocations",
                    ));
                }
                Some(s.to_string())
            }
        };
        let revocations = RevocationSource {
            poll_url,
            poll_interval: Duration::from_millis(f.number("revocations_poll_ms", 2000, 100, 60_000)?),
            when_unknown: match f.string("on_unknown_revocations")? {
                None | Some("refuse") => UnknownRevocations::Refuse,
                Some("accept") => UnknownRevocations::Accept,
                Some(_) => return Err(f.err("on_unknown_revocations", "expected \"refuse\" or \"accept\"")),
            },
        };
        let upstream = match f.table("upstream")? {
            None => upstream_settings(&toml::Table::new())?,
            Some(t) => upstream_settings(t)?,
        };
        let routes = match t.get("routes") {
            None => return Err(f.err("routes", "at least one [[routes]] table is required")),
            Some(toml::Value::Array(items)) if !items.is_empty() => items,
            Some(_) => return Err(f.err("routes", "expected one or more [[routes]] tables")),
        };
        let mut parsed = Vec::with_capacity(routes.len());
        for (i, item) in routes.iter().enumerate() {
            let path = format!("routes[{i}]");
            let table = item
                .as_table()
                .ok_or_else(|| ConfigError::new(&path, "expected a table ([[routes]])"))?;
            parsed.push(route(i, path, table, &audiences, &upstream, &identity)?);
        }
        let mut names = HashSet::new();
        let mut matchers = HashSet::new();
        for (i, r) in parsed.iter().enumerate() {
            if !names.insert(r.name.as_str()) {
                return Err(ConfigError::new(
                    format!("routes[{i}].name"),
                    format!("{:?} is used by an earlier route", r.name),
                ));
            }
            if !matchers.insert((r.host.clone(), r.path_prefix.as_str())) {
                return Err(ConfigError::new(
                    format!("routes[{i}].path_prefix"),
                    "an earlier route has the same host and path_prefix",
                ));
            }
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Ok(GatewayConfig {
            listen,
            workers: f.number("workers", cores as u64, 1, 256)? as usize,
            runtime: match f.string("runtime")? {
                None | Some("per-core") => RuntimeModel::PerCore,
                Some("work-stealing") => RuntimeModel::WorkStealing,
                Some(_) => return Err(f.err("runtime", "expected \"per-core\" or \"work-stealing\"")),
            },
            admin_listen,
            jwks_url: jwks_url.to_string(),
            issuer,
            audiences,
            jwks_refresh: Duration::from_secs(f.number("jwks_refresh_secs", 60, 1, 86_400)?),
            access_token_ttl: Duration::from_secs(f.number("access_token_ttl_secs", 900, 30, 86_400)?),
            token_cache_capacity: f.number("token_cache_capacity", 100_000, 1, 10_000_000)? as usize,
            redis,
            limiter,
            trusted_proxies,
            identity,
            forward_headers,
            revocations,
            upstream,
            shutdown_timeout: Duration::from_secs(f.number("shutdown_timeout_secs", 10, 0, 600)?),
            read_ahead: f.number("request_read_ahead_bytes", 65_536, 0, 16 * 1024 * 1024)? as usize,
            connections: ConnectionSettings::read(&f)?,
            log,
            routes: parsed,
            restart_values: restart_values(t),
        })
    }

    /// The `Restart` settings whose values differ in `new` (by their
    /// names in the file), which a reload cannot apply.
    pub fn restart_only_changes(&self, new: &GatewayConfig) -> Vec<&'static str> {
        TOP_KEYS
            .iter()
            .filter(|(k, takes)| {
                *takes == Takes::Restart && self.restart_values.get(k) != new.restart_values.get(k)
            })
            .map(|(k, _)| *k)
            .collect()
    }

    /// Every audience any route accepts (what the token verifier allows).
    pub fn all_audiences(&self) -> Vec<String> {
        let mut all: Vec<String> = self.audiences.clone();
        for r in &self.routes {
            for a in &r.audiences {
                if !all.contains(a) {
                    all.push(a.clone());
                }
            }
        }
        all
    }
}

fn identity_headers(t: &toml::Table) -> Result<IdentityHeaders> {
    let f = Fields::new(
        "identity_headers",
        t,
        &["subject", "email", "session", "client_id"],
    )?;
    let d = IdentityHeaders::default();
    let name = |key: &str, default: HeaderName| -> Result<HeaderName> {
        match f.string(key)? {
            None => Ok(default),
            Some(s) => {
                let h = HeaderName::from_bytes(s.as_bytes())
                    .map_err(|_| f.err(key, format!("{s:?} is not a valid header name")))?;
                if super::headers::is_hop_by_hop(&h) || h == axum::http::header::HOST {
                    return Err(f.err(key, format!("{s:?} is a hop-by-hop or reserved header")));
                }
                Ok(h)
            }
        }
    };
    let h = IdentityHeaders {
        subject: name("subject", d.subject)?,
        email: name("email", d.email)?,
        session: name("session", d.session)?,
        client_id: name("client_id", d.client_id)?,
    };
    let distinct: HashSet<&HeaderName> = h.all().into_iter().collect();
    if distinct.len() != 4 {
        return Err(f.err("subject", "the four identity headers must have different names"));
    }
    Ok(h)
}

fn upstream_settings(t: &toml::Table) -> Result<UpstreamSettings> {
    let f = Fields::new(
        "upstream",
        t,
        &[
            "connect_timeout_ms",
            "timeout_ms",
            "pool_idle_timeout_secs",
            "pool_max_idle_per_host",
            "max_requests",
        ],
    )?;
    Ok(UpstreamSettings {
        connect_timeout: Duration::from_millis(f.number("connect_timeout_ms", 1000, 1, 60_000)?),
        timeout: Duration::from_millis(f.number("timeout_ms", 30_000, 1, 3_600_000)?),
        pool_idle_timeout: Duration::from_secs(f.number("pool_idle_timeout_secs", 90, 1, 3600)?),
        pool_max_idle_per_host: f.number("pool_max_idle_per_host", 1024, 0, 100_000)? as usize,
        max_requests: f.number("max_requests", 10_000, 1, 1_000_000)? as usize,
    })
}

fn route(
    index: usize,
    path: String,
    t: &toml::Table,
    default_audiences: &[String],
    upstream: &UpstreamSettings,
    identity: &IdentityHeaders,
) -> Result<RouteConfig> {
    let f = Fields::new(path, t, ROUTE_KEYS)?;
    let name = match f.string("name")? {
        None => format!("route{index}"),
        Some(n)
            if !n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) =>
        {
            n.to_string()
        }
        Some(_) => return Err(f.err("name", "1..=64 characters among a-z, A-Z, 0-9, '-', '_', '.'")),
    };
    let host = match f.string("host")? {
        None | Some("") | Some("*") => None,
        Some(h) => {
            let bare = h.strip_prefix("*.").unwrap_or(h);
            let valid = !bare.is_empty()
                && bare
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
                && !bare.starts_with('.')
                && !bare.ends_with('.');
            if !valid {
                return Err(f.err("host", format!("{h:?} is not a host name (or *.domain)")));
            }
            Some(if h.starts_with("*.") {
                HostMatch::Subdomains(format!(".{}", bare.to_ascii_lowercase()))
            } else {
                HostMatch::Exact(bare.to_ascii_lowercase())
            })
        }
    };
    let path_prefix = f.string("path_prefix")?.unwrap_or("/").to_string();
    if !path_prefix.starts_with('/') || path_prefix.contains(['?', '#', ' ']) {
        return Err(f.err("path_prefix", "must start with / and hold no ?, # or space"));
    }
    // Requests are matched in normal form: a prefix in any other form
    // would match one spelling of a path and not another.
    let normal = super::path::normalise(&path_prefix).ok();
    if !path_prefix.is_ascii()
        || path_prefix.contains(['%', ';'])
        || normal.is_none_or(|n| n.path != path_prefix)
    {
        return Err(f.err(
            "path_prefix",
            "must be in normal form: ASCII, no %, ;, // or dot segments",
        ));
    }
    let upstream_url = f.required("upstream")?;
    let u = url::Url::parse(upstream_url).map_err(|e| f.err("upstream", format!("not a URL: {e}")))?;
    if u.scheme() != "http" {
        return Err(f.err(
            "upstream",
            "expected an http:// URL (TLS to upstreams is not supported; terminate it in front)",
        ));
    }
    let Some(host_str) = u.host_str() else {
        return Err(f.err("upstream", "the URL needs a host"));
    };
    if u.query().is_some() || u.fragment().is_some() || !u.username().is_empty() {
        return Err(f.err(
            "upstream",
            "the URL must not hold a query, fragment or credentials",
        ));
    }
    let upstream_origin = match u.port() {
        Some(p) => format!("http://{host_str}:{p}"),
        None => format!("http://{host_str}"),
    };
    let upstream_path = u.path().trim_end_matches('/').to_string();
    let auth = f.boolean("auth", true)?;
    let audiences = match f.strings("audiences")? {
        None => default_audiences.to_vec(),
        Some(v) if v.is_empty() || v.iter().any(|a| a.is_empty()) => {
            return Err(f.err("audiences", "must be a non-empty list of non-empty strings"))
        }
        Some(v) => v.into_iter().map(String::from).collect(),
    };
    if !auth && t.contains_key("audiences") {
        return Err(f.err("audiences", "only meaningful with auth = true"));
    }
    let require_mfa = f.boolean("require_mfa", false)?;
    if require_mfa && !auth {
        return Err(f.err("require_mfa", "only meaningful with auth = true"));
    }
    let timeout = match t.get("timeout_ms") {
        None => upstream.timeout,
        Some(_) => Duration::from_millis(f.number("timeout_ms", 0, 1, 3_600_000)?),
    };
    let rate_limit = match f.table("rate_limit")? {
        None => None,
        Some(rt) => Some(rate_limit(&f.name("rate_limit"), rt, auth)?),
    };
    Ok(RouteConfig {
        name,
        host,
        path_prefix,
        upstream_origin,
        upstream_path,
        strip_prefix: f.boolean("strip_prefix", false)?,
        preserve_host: f.boolean("preserve_host", false)?,
        case_sensitive: f.boolean("case_sensitive", !auth)?,
        allow_client_headers: allowed_client_headers(&f, identity)?,
        auth,
        require_mfa,
        audiences,
        forward_authorization: f.boolean("forward_authorization", true)?,
        timeout,
        rate_limit,
    })
}

/// `allow_client_headers`: names of headers a proxy in front asserts to
/// upstreams ([`super::headers::Reserved::ProxyAssertion`]: a client
/// certificate from a TLS terminator, an identity from an authenticating
/// proxy) that the route takes from its `trusted_proxies`. Identity and
/// forwarding headers cannot be allowed (the gateway writes them), nor
/// facts about the request such as `SCRIPT_NAME` (they reroute it), and a
/// name the gateway does not remove needs no allowing: each is a mistake
/// worth a line at start.
fn allowed_client_headers(f: &Fields, identity: &IdentityHeaders) -> Result<Vec<HeaderName>> {
    use super::headers::{reserved, Reserved};
    let Some(names) = f.strings("allow_client_headers")? else {
        return Ok(Vec::new());
    };
    let err = |n: &str, why: &str| f.err("allow_client_headers", format!("{n:?} {why}"));
    names
        .into_iter()
        .map(|n| {
            let h = HeaderName::from_bytes(n.as_bytes()).map_err(|_| err(n, "is not a valid header name"))?;
            match reserved(&h, &identity.all()) {
                Some(Reserved::ProxyAssertion) => Ok(h),
                Some(Reserved::Identity | Reserved::Forwarding) => Err(err(
                    n,
                    "is an identity or forwarding header, which only the gateway writes",
                )),
                Some(Reserved::RequestMeta) => Err(err(
                    n,
                    "is a fact about the request (a CGI variable, or a header that reroutes it), never taken from a client",
                )),
                None => Err(err(
                    n,
                    "is not a header the gateway removes; it reaches the upstream already",
                )),
            }
        })
        .collect()
}

fn rate_limit(path: &str, t: &toml::Table, auth: bool) -> Result<RateLimitConfig> {
    let f = Fields::new(path, t, &["limit", "window_secs", "key", "on_redis_failure"])?;
    if !t.contains_key("limit") {
        return Err(f.err("limit", "is required (requests per window)"));
    }
    if !t.contains_key("window_secs") {
        return Err(f.err("window_secs", "is required"));
    }
    let limit = f.number("limit", 0, 1, u32::MAX as u64)? as u32;
    let window = Duration::from_secs(f.number("window_secs", 0, 1, 7 * 86_400)?);
    let key = match f.string("key")? {
        None if auth => LimitKey::Subject,
        None => LimitKey::Ip,
        Some("sub") => LimitKey::Subject,
        Some("client_id") => LimitKey::ClientId,
        Some("ip") => LimitKey::Ip,
        Some(_) => return Err(f.err("key", "expected \"sub\", \"client_id\" or \"ip\"")),
    };
    if !auth && key != LimitKey::Ip {
        return Err(f.err(
            "key",
            "sub and client_id need auth = true on the route; use \"ip\"",
        ));
    }
    let fallback = match f.string("on_redis_failure")? {
        None | Some("local") => Fallback::Local,
        Some("open") => Fallback::Open,
        Some(_) => return Err(f.err("on_redis_failure", "expected \"local\" or \"open\"")),
    };
    Ok(RateLimitConfig {
        policy: Policy {
            limit,
            window,
            fallback,
        },
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
jwks_url = "http://127.0.0.1:8080/.well-known/jwks.json"
issuer = "http://127.0.0.1:8080"
"#;

    fn parse(extra: &str) -> Result<GatewayConfig> {
        GatewayConfig::from_toml(&format!("{BASE}\n{extra}"))
    }

    fn error(extra: &str) -> String {
        let e = parse(extra).expect_err("should be refused");
        let line = e.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        line
    }

    #[test]
    fn a_reload_names_the_changed_settings_it_cannot_apply_and_no_others() {
        let route = "[[routes]]\nupstream = \"http://127.0.0.1:9000\"";
        let old = parse(&format!(
            "redis_url = \"redis://:secret@127.0.0.1:6379\"\n{route}"
        ))
        .unwrap();
        let cases: [(&str, &[&str]); 7] = [
            ("redis_url = \"redis://:secret@127.0.0.1:6379\"", &[]),
            ("redis_url = \"redis://:other@127.0.0.1:6379\"", &["redis_url"]),
            (
                "redis_url = \"redis://:secret@127.0.0.1:6379\"\nruntime = \"work-stealing\"\nmax_connections = 10",
                &["runtime", "max_connections"],
            ),
            // Written as the default it was: still a change of the file.
            ("redis_url = \"redis://:secret@127.0.0.1:6379\"\nlisten = \"127.0.0.1:8000\"", &["listen"]),
            // Part of the route table: applied, not reported.
            (
                "redis_url = \"redis://:secret@127.0.0.1:6379\"\non_unknown_revocations = \"accept\"\ntrusted_proxies = [\"10.0.0.1\"]\nrequest_read_ahead_bytes = 0",
                &[],
            ),
            ("", &["redis_url"]),
            (
                "redis_url = \"redis://:secret@127.0.0.1:6379\"\n[identity_headers]\nsubject = \"x-user\"",
                &[],
            ),
        ];
        for (extra, changed) in cases {
            let new = parse(&format!("{extra}\n{route}")).unwrap();
            assert_eq!(old.restart_only_changes(&new), changed.to_vec(), "{extra}");
        }
        assert!(!format!("{old:?}").contains("secret"), "no value kept in clear");
    }

    #[test]
    fn every_top_level_key_is_listed_once() {
        let keys: HashSet<&str> = TOP_KEYS.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), TOP_KEYS.len());
    }

    #[test]
    fn a_minimal_file_gets_safe_defaults() {
        let c = parse("[[routes]]\nupstream = \"http://127.0.0.1:9000\"").unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8000");
        assert_eq!(c.audiences, vec!["latchkey"]);
        assert_eq!(c.jwks_refresh, Duration::from_secs(60));
        assert_eq!(c.limiter, LimiterStore::Local);
        let r = &c.routes[0];
        assert_eq!(r.name, "route0");
        assert!(r.auth, "authentication is on unless turned off");
        assert_eq!(r.path_prefix, "/");
        assert_eq!(r.upstream_origin, "http://127.0.0.1:9000");
        assert_eq!(r.upstream_path, "");
        assert_eq!(r.timeout, Duration::from_secs(30));
        assert_eq!(c.identity.subject.as_str(), "x-auth-subject");
        assert_eq!(c.connections.header_timeout, Duration::from_secs(30));
        assert_eq!(c.connections.max_connections, 10_000);
        assert_eq!(c.upstream.max_requests, 10_000);
    }

    #[test]
    fn protected_routes_ignore_case_unless_told_otherwise() {
        let c = parse(
            r#"
[[routes]]
name = "admin"
path_prefix = "/admin"
upstream = "http://x"
[[routes]]
name = "exact"
path_prefix = "/exact"
upstream = "http://x"
case_sensitive = true
[[routes]]
name = "public"
upstream = "http://x"
auth = false
[[routes]]
name = "public-any-case"
path_prefix = "/files"
upstream = "http://x"
auth = false
case_sensitive = false
"#,
        )
        .unwrap();
        let case: Vec<(&str, bool)> = c
            .routes
            .iter()
            .map(|r| (r.name.as_str(), r.case_sensitive))
            .collect();
        assert_eq!(
            case,
            [
                ("admin", false),
                ("exact", true),
                ("public", true),
                ("public-any-case", false)
            ]
        );
    }

    #[test]
    fn a_route_may_take_named_proxy_assertions() {
        let c = parse(
            "[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"X-SSL-Client-Cert\", \"cf_access_jwt_assertion\"]",
        )
        .unwrap();
        let allowed: Vec<&str> = c.routes[0]
            .allow_client_headers
            .iter()
            .map(|h| h.as_str())
            .collect();
        assert_eq!(allowed, ["x-ssl-client-cert", "cf_access_jwt_assertion"]);
        assert_eq!(c.read_ahead, 65_536);
    }

    #[test]
    fn connection_limits_are_read_as_numbers_or_strings() {
        let c =
            parse("header_timeout_ms = 2500\nmax_connections = \"64\"\n[[routes]]\nupstream = \"http://x\"")
                .unwrap();
        assert_eq!(c.connections.header_timeout, Duration::from_millis(2500));
        assert_eq!(c.connections.max_connections, 64);
    }

    #[test]
    fn a_full_route_parses() {
        let c = parse(
            r#"
redis_url = "redis://127.0.0.1:6379"
redis_key_prefix = "lk"
[identity_headers]
subject = "X-User"
[[routes]]
name = "api"
host = "*.Example.com"
path_prefix = "/api"
upstream = "http://10.0.0.5:8080/base/"
strip_prefix = true
audiences = ["orders", "latchkey"]
timeout_ms = 2500
[routes.rate_limit]
limit = 100
window_secs = 60
key = "client_id"
on_redis_failure = "open"
"#,
        )
        .unwrap();
        assert_eq!(c.limiter, LimiterStore::Redis);
        assert_eq!(c.redis.as_ref().unwrap().key_prefix, "lk:");
        assert_eq!(c.identity.subject.as_str(), "x-user");
        let r = &c.routes[0];
        assert_eq!(r.host, Some(HostMatch::Subdomains(".example.com".into())));
        assert_eq!(r.upstream_path, "/base");
        assert_eq!(r.timeout, Duration::from_millis(2500));
        let rl = r.rate_limit.as_ref().unwrap();
        assert_eq!(rl.key, LimitKey::ClientId);
        assert_eq!(rl.policy.fallback, Fallback::Open);
        assert_eq!((rl.policy.limit, rl.policy.window.as_secs()), (100, 60));
        assert_eq!(c.all_audiences(), vec!["latchkey", "orders"]);
    }

    #[test]
    fn mistakes_name_the_field() {
        let cases = [
            ("", "routes"),
            ("[[routes]]\nupstream = \"https://x\"", "routes[0].upstream"),
            ("[[routes]]\nupstream = \"not a url\"", "routes[0].upstream"),
            ("[[routes]]\nupstrem = \"http://x\"", "routes[0].upstrem"),
            ("[[routes]]\nupstream = \"http://x\"\npath_prefix = \"api\"", "routes[0].path_prefix"),
            ("[[routes]]\nupstream = \"http://x\"\ntimeout_ms = 0", "routes[0].timeout_ms"),
            ("[[routes]]\nupstream = \"http://x\"\nauth = \"yes\"", "routes[0].auth"),
            (
                "[[routes]]\nupstream = \"http://x\"\n[routes.rate_limit]\nlimit = 5\nwindow_secs = 60\nkey = \"user\"",
                "routes[0].rate_limit.key",
            ),
            (
                "[[routes]]\nupstream = \"http://x\"\nauth = false\n[routes.rate_limit]\nlimit = 5\nwindow_secs = 60\nkey = \"sub\"",
                "routes[0].rate_limit.key",
            ),
            (
                "[[routes]]\nupstream = \"http://x\"\n[routes.rate_limit]\nwindow_secs = 60",
                "routes[0].rate_limit.limit",
            ),
            (
                "[[routes]]\nupstream = \"http://x\"\n[[routes]]\nupstream = \"http://y\"",
                "routes[1].path_prefix",
            ),
            (
                "[[routes]]\nname = \"a\"\nupstream = \"http://x\"\n[[routes]]\nname = \"a\"\npath_prefix = \"/b\"\nupstream = \"http://y\"",
                "routes[1].name",
            ),
            ("listen = \"nowhere\"\n[[routes]]\nupstream = \"http://x\"", "listen"),
            ("rate_limit_store = \"redis\"\n[[routes]]\nupstream = \"http://x\"", "rate_limit_store"),
            ("trusted_proxies = [\"10.0.0.1\", \"proxy\"]\n[[routes]]\nupstream = \"http://x\"", "trusted_proxies[1]"),
            ("forward_headers = [\"x-forwarded-for\", \"x-originating-ip\"]\n[[routes]]\nupstream = \"http://x\"", "forward_headers[1]"),
            ("revocations_url = \"https://svc/revocations\"\n[[routes]]\nupstream = \"http://x\"", "revocations_url"),
            ("on_unknown_revocations = \"maybe\"\n[[routes]]\nupstream = \"http://x\"", "on_unknown_revocations"),
            ("revocations_poll_ms = 5\n[[routes]]\nupstream = \"http://x\"", "revocations_poll_ms"),
            ("[[routes]]\nupstream = \"http://x\"\ncase_sensitive = \"no\"", "routes[0].case_sensitive"),
            ("[[routes]]\nupstream = \"http://x\"\npath_prefix = \"/a/../b\"", "routes[0].path_prefix"),
            ("[[routes]]\nupstream = \"http://x\"\npath_prefix = \"/%61dmin\"", "routes[0].path_prefix"),
            ("[[routes]]\nupstream = \"http://x\"\npath_prefix = \"/caf\u{e9}\"", "routes[0].path_prefix"),
            ("[identity_headers]\nsubject = \"bad header\"\n[[routes]]\nupstream = \"http://x\"", "identity_headers.subject"),
            ("[identity_headers]\nemail = \"Connection\"\n[[routes]]\nupstream = \"http://x\"", "identity_headers.email"),
            ("[upstream]\nconnect_timeout_ms = -1\n[[routes]]\nupstream = \"http://x\"", "upstream.connect_timeout_ms"),
            ("[upstream]\nmax_requests = 0\n[[routes]]\nupstream = \"http://x\"", "upstream.max_requests"),
            ("header_timeout_ms = 5\n[[routes]]\nupstream = \"http://x\"", "header_timeout_ms"),
            ("max_connections = 0\n[[routes]]\nupstream = \"http://x\"", "max_connections"),
            ("max_connections = true\n[[routes]]\nupstream = \"http://x\"", "max_connections"),
            ("request_read_ahead_bytes = -1\n[[routes]]\nupstream = \"http://x\"", "request_read_ahead_bytes"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-auth-subject\"]", "routes[0].allow_client_headers"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x_forwarded_for\"]", "routes[0].allow_client_headers"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-custom\"]", "routes[0].allow_client_headers"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"bad name\"]", "routes[0].allow_client_headers"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"SCRIPT_NAME\"]", "routes[0].allow_client_headers"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-scheme\"]", "routes[0].allow_client_headers"),
            ("[identity_headers]\nsubject = \"x-remote-user\"\n[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-remote-user\"]", "routes[0].allow_client_headers"),
        ];
        for (extra, field) in cases {
            let line = error(extra);
            assert!(
                line.contains(&format!("invalid setting {field}:")),
                "{field}: {line}"
            );
        }
        let no_jwks = GatewayConfig::from_toml("issuer = \"http://x\"\n[[routes]]\nupstream = \"http://x\"")
            .unwrap_err()
            .to_string();
        assert!(no_jwks.contains("jwks_url"), "{no_jwks}");
    }

    #[test]
    fn the_redis_password_is_never_printed() {
        let c = parse("redis_url = \"redis://:hunter2@127.0.0.1:6379\"\n[[routes]]\nupstream = \"http://x\"")
            .unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        let e = error("redis_url = \"http://:hunter2@x\"\n[[routes]]\nupstream = \"http://x\"");
        assert!(e.contains("redis_url") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn the_example_file_is_valid() {
        let c = GatewayConfig::from_toml(include_str!("../../deploy/gateway.example.toml")).unwrap();
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.identity.subject.as_str(), "x-auth-subject");
    }

    #[test]
    fn host_patterns() {
        let sub = HostMatch::Subdomains(".example.com".into());
        assert!(sub.matches("api.example.com"));
        assert!(sub.matches("A.B.EXAMPLE.COM"));
        assert!(!sub.matches("example.com"));
        assert!(!sub.matches("evilexample.com"));
        assert!(HostMatch::Exact("example.com".into()).matches("Example.COM"));
    }
}
