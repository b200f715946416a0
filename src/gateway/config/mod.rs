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
use crate::server::connections::ConnectionSettings;
use crate::settings::{
    ip, millis, non_empty, number, one_of, optional, secs, socket_addr, url_text, ConfigError, Source,
};
use crate::telemetry::LogSettings;

mod route;

pub use route::{HostMatch, LimitKey, RateLimitConfig, RouteConfig};

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
/// Its values are read as the service's settings are ([`Source`]), with
/// the same parsers and messages: a value is its text (a TOML string,
/// number or boolean), a list is a TOML array whose items are named
/// `key[i]`; only the tables are its own.
pub(super) struct Fields<'a> {
    path: String,
    table: &'a toml::Table,
}

impl<'a> Fields<'a> {
    /// `table` at `path`, refused if it holds a key outside `allowed`.
    pub(super) fn new(
        path: impl Into<String>,
        table: &'a toml::Table,
        allowed: &[&str],
    ) -> Result<Fields<'a>> {
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

    pub(super) fn name(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    pub(super) fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.name(key), message)
    }

    /// Whether `key` is written at all.
    pub(super) fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    pub(super) fn table(&self, key: &str) -> Result<Option<&'a toml::Table>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(_) => Err(self.err(key, "expected a table")),
        }
    }

    /// A list that, when written, must hold at least one item.
    pub(super) fn non_empty_list<T>(
        &self,
        key: &str,
        parse: impl Fn(&str) -> std::result::Result<T, String>,
    ) -> Result<Option<Vec<T>>> {
        match self.items(key)? {
            None => Ok(None),
            Some(items) if items.is_empty() => Err(self.err(key, "must not be an empty list")),
            Some(_) => self.list(key, parse).map(Some),
        }
    }
}

/// The text of a single value, if it is one.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.trim().to_string()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

impl Source for Fields<'_> {
    fn text(&self, key: &str) -> Result<Option<(String, String)>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(v) => scalar(v)
                .map(|t| Some((t, self.name(key))))
                .ok_or_else(|| self.err(key, "expected a single value (a string, number or true/false)")),
        }
    }

    fn items(&self, key: &str) -> Result<Option<Vec<(String, String)>>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let name = format!("{}[{i}]", self.name(key));
                    scalar(v)
                        .map(|t| (t, name.clone()))
                        .ok_or_else(|| ConfigError::new(name, "expected a string"))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(self.err(key, "expected a list, e.g. [\"a\", \"b\"]")),
        }
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
        let admin_listen = f.get("admin_listen", None, optional(socket_addr("127.0.0.1:9181")))?;
        let jwks_url = f.required(
            "jwks_url",
            http_url("http://127.0.0.1:8080/.well-known/jwks.json"),
        )?;
        let issuer = f.required("issuer", url_text)?;
        let audiences = f
            .non_empty_list("audiences", non_empty)?
            .unwrap_or_else(|| vec!["latchkey".to_string()]);
        let redis = RedisConfig::read(&f)?;
        let limiter = match f.get("rate_limit_store", None, optional(one_of(LIMITER_STORES)))? {
            None if redis.is_some() => LimiterStore::Redis,
            None => LimiterStore::Local,
            Some(LimiterStore::Redis) if redis.is_none() => {
                return Err(f.err("rate_limit_store", "redis needs redis_url"))
            }
            Some(store) => store,
        };
        let forward_headers = match f.items("forward_headers")? {
            None => ForwardHeaders::default(),
            Some(_) => ForwardHeaders::only(&f.list("forward_headers", |s| {
                one_of(FORWARD_HEADERS)(&s.to_ascii_lowercase())
            })?),
        };
        let revocations = RevocationSource {
            poll_url: f.get(
                "revocations_url",
                None,
                optional(http_url(
                    "http://127.0.0.1:9180/revocations (the service's admin listener)",
                )),
            )?,
            poll_interval: f.get("revocations_poll_ms", Duration::from_secs(2), millis(100, 60_000))?,
            when_unknown: f.get(
                "on_unknown_revocations",
                UnknownRevocations::Refuse,
                one_of(&[
                    ("refuse", UnknownRevocations::Refuse),
                    ("accept", UnknownRevocations::Accept),
                ]),
            )?,
        };
        let identity = match f.table("identity_headers")? {
            None => IdentityHeaders::default(),
            Some(t) => identity_headers(t)?,
        };
        let upstream = upstream_settings(f.table("upstream")?.unwrap_or(&toml::Table::new()))?;
        let routes = route::routes(t, &f, &audiences, &upstream, &identity)?;
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Ok(GatewayConfig {
            listen,
            workers: f.get("workers", cores, number(1, 256))?,
            runtime: f.get(
                "runtime",
                RuntimeModel::PerCore,
                one_of(&[
                    ("per-core", RuntimeModel::PerCore),
                    ("work-stealing", RuntimeModel::WorkStealing),
                ]),
            )?,
            admin_listen,
            jwks_url,
            issuer,
            audiences,
            jwks_refresh: f.get("jwks_refresh_secs", Duration::from_secs(60), secs(1, 86_400))?,
            access_token_ttl: f.get(
                "access_token_ttl_secs",
                Duration::from_secs(900),
                secs(30, 86_400),
            )?,
            token_cache_capacity: f.get("token_cache_capacity", 100_000, number(1, 10_000_000))?,
            redis,
            limiter,
            trusted_proxies: f.list("trusted_proxies", ip)?,
            identity,
            forward_headers,
            revocations,
            upstream,
            shutdown_timeout: f.get("shutdown_timeout_secs", Duration::from_secs(10), secs(0, 600))?,
            read_ahead: f.get("request_read_ahead_bytes", 65_536, number(0, 16 * 1024 * 1024))?,
            connections: ConnectionSettings::read(&f)?,
            log: LogSettings::read(&f)?,
            routes,
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

const LIMITER_STORES: &[(&str, LimiterStore)] =
    &[("local", LimiterStore::Local), ("redis", LimiterStore::Redis)];

/// The forwarding headers by their names in `forward_headers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forwarding {
    For,
    Host,
    Proto,
    RealIp,
    Forwarded,
}

const FORWARD_HEADERS: &[(&str, Forwarding)] = &[
    ("x-forwarded-for", Forwarding::For),
    ("x-forwarded-host", Forwarding::Host),
    ("x-forwarded-proto", Forwarding::Proto),
    ("x-real-ip", Forwarding::RealIp),
    ("forwarded", Forwarding::Forwarded),
];

impl ForwardHeaders {
    /// Only the headers listed.
    fn only(list: &[Forwarding]) -> ForwardHeaders {
        ForwardHeaders {
            x_forwarded_for: list.contains(&Forwarding::For),
            x_forwarded_host: list.contains(&Forwarding::Host),
            x_forwarded_proto: list.contains(&Forwarding::Proto),
            x_real_ip: list.contains(&Forwarding::RealIp),
            forwarded: list.contains(&Forwarding::Forwarded),
        }
    }
}

/// An `http://` URL with a host (the service's JWKS and revocations are
/// read over the loopback or a private network); `example` shows the form.
fn http_url(example: &'static str) -> impl Fn(&str) -> std::result::Result<String, String> {
    move |s| match s.parse::<Uri>() {
        Ok(u) if u.scheme_str() == Some("http") && u.host().is_some() => Ok(s.to_string()),
        _ => Err(format!("expected an http:// URL such as {example}, got {s:?}")),
    }
}

/// A header name the gateway may write an identity into.
fn identity_header(s: &str) -> std::result::Result<HeaderName, String> {
    let h = HeaderName::from_bytes(s.as_bytes()).map_err(|_| format!("{s:?} is not a valid header name"))?;
    if super::headers::is_hop_by_hop(&h) || h == axum::http::header::HOST {
        return Err(format!("{s:?} is a hop-by-hop or reserved header"));
    }
    Ok(h)
}

fn identity_headers(t: &toml::Table) -> Result<IdentityHeaders> {
    let f = Fields::new(
        "identity_headers",
        t,
        &["subject", "email", "session", "client_id"],
    )?;
    let d = IdentityHeaders::default();
    let h = IdentityHeaders {
        subject: f.get("subject", d.subject, identity_header)?,
        email: f.get("email", d.email, identity_header)?,
        session: f.get("session", d.session, identity_header)?,
        client_id: f.get("client_id", d.client_id, identity_header)?,
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
        connect_timeout: f.get("connect_timeout_ms", Duration::from_secs(1), millis(1, 60_000))?,
        timeout: f.get("timeout_ms", Duration::from_secs(30), millis(1, 3_600_000))?,
        pool_idle_timeout: f.get("pool_idle_timeout_secs", Duration::from_secs(90), secs(1, 3600))?,
        pool_max_idle_per_host: f.get("pool_max_idle_per_host", 1024, number(0, 100_000))?,
        max_requests: f.get("max_requests", 10_000, number(1, 1_000_000))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Fallback;

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
            ("[[routes]]\nupstream = \"http://x\"\nauth = \"maybe\"", "routes[0].auth"),
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
            ("[[routes]]\nupstream = \"http://x\"\ncase_sensitive = \"sometimes\"", "routes[0].case_sensitive"),
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
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-auth-subject\"]", "routes[0].allow_client_headers[0]"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x_forwarded_for\"]", "routes[0].allow_client_headers[0]"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-custom\"]", "routes[0].allow_client_headers[0]"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"bad name\"]", "routes[0].allow_client_headers[0]"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"SCRIPT_NAME\"]", "routes[0].allow_client_headers[0]"),
            ("[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-scheme\"]", "routes[0].allow_client_headers[0]"),
            ("[identity_headers]\nsubject = \"x-remote-user\"\n[[routes]]\nupstream = \"http://x\"\nallow_client_headers = [\"x-remote-user\"]", "routes[0].allow_client_headers[0]"),
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
        let c = GatewayConfig::from_toml(include_str!("../../../deploy/gateway.example.toml")).unwrap();
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.identity.subject.as_str(), "x-auth-subject");
    }
}
