//! Rate limits (GCRA token buckets) and brute-force protection.
//!
//! One `Limiter` serves every policy. Without Redis the buckets live in this
//! process; with Redis a check is a step of an atomic script (loaded once,
//! reloaded by the client on `NOSCRIPT`), so every instance shares the same
//! buckets. A call takes a small lease of tokens instead of one where the
//! bucket has room (see `lease`): far fewer round trips, never more than
//! the limit. The checks that do ask Redis share calls (see `batch`): one
//! `EVALSHA` for every bucket queued while the limiter's calls were in
//! flight. If Redis fails, each policy either falls back to the local
//! buckets or lets the request through (`Fallback`); either way it is logged
//! and counted, never a 500.

mod batch;
mod bruteforce;
mod gcra;
mod lease;
mod settings;

pub use bruteforce::{Attempt, BruteForce, Rules as BruteForceRules, Softlock, Softlocks};
pub use gcra::LocalBuckets;
pub use settings::LimitSettings;

use std::time::Duration;

use crate::cache::RedisHandle;
use crate::settings::{ConfigError, Source};

/// The service's named policies; `ALL` lists them in declaration order (an
/// index into the limiter's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyName {
    RegisterIp,
    RegisterEmail,
    ResendIp,
    ResendEmail,
    ResetIp,
    ResetEmail,
    LoginIp,
    LoginAccount,
    VerifyAccount,
    RefreshSession,
    PasswordAccount,
    Validate,
}

impl PolicyName {
    pub const ALL: [PolicyName; 12] = [
        PolicyName::RegisterIp,
        PolicyName::RegisterEmail,
        PolicyName::ResendIp,
        PolicyName::ResendEmail,
        PolicyName::ResetIp,
        PolicyName::ResetEmail,
        PolicyName::LoginIp,
        PolicyName::LoginAccount,
        PolicyName::VerifyAccount,
        PolicyName::RefreshSession,
        PolicyName::PasswordAccount,
        PolicyName::Validate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::RegisterIp => "register_ip",
            PolicyName::RegisterEmail => "register_email",
            PolicyName::ResendIp => "resend_ip",
            PolicyName::ResendEmail => "resend_email",
            PolicyName::ResetIp => "reset_ip",
            PolicyName::ResetEmail => "reset_email",
            PolicyName::LoginIp => "login_ip",
            PolicyName::LoginAccount => "login_account",
            PolicyName::VerifyAccount => "verify_account",
            PolicyName::RefreshSession => "refresh_session",
            PolicyName::PasswordAccount => "password_account",
            PolicyName::Validate => "validate",
        }
    }

    /// (limit, window seconds); `None`: unlimited by default.
    fn default_rule(self) -> Option<(u32, u64)> {
        Some(match self {
            PolicyName::RegisterIp => (60, 60),
            PolicyName::RegisterEmail => (10, 3600),
            PolicyName::ResendIp => (60, 60),
            PolicyName::ResendEmail => (10, 3600),
            PolicyName::ResetIp => (60, 60),
            PolicyName::ResetEmail => (10, 3600),
            PolicyName::LoginIp => (600, 60),
            PolicyName::LoginAccount => (60, 60),
            PolicyName::VerifyAccount => (30, 600),
            PolicyName::RefreshSession => (120, 60),
            // Password changes per account: a stolen access token must not
            // become an unlimited oracle for the current password.
            PolicyName::PasswordAccount => (10, 600),
            PolicyName::Validate => return None,
        })
    }
}

/// What a policy does when Redis cannot be asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Use this process's buckets (the limit holds per instance).
    Local,
    /// Let the request through.
    Open,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub limit: u32,
    pub window: Duration,
    pub fallback: Fallback,
}

#[derive(Clone, Debug)]
pub struct Policies {
    rules: Vec<(PolicyName, Option<Policy>)>,
    /// IPv6 clients share a bucket per prefix of this many bits (a host gets
    /// a /64 and can rotate freely inside it); IPv4 clients are one each.
    pub ipv6_prefix: u8,
}

impl Policies {
    pub const DEFAULT_IPV6_PREFIX: u8 = 64;

    /// Defaults, overridden by `rate_limit_<policy>` settings:
    /// `LIMIT/WINDOW_SECS[,open|,local]` or `off`.
    pub fn read(src: &impl Source) -> Result<Policies, ConfigError> {
        let mut rules = Vec::new();
        for name in PolicyName::ALL {
            let default = name.default_rule().map(|(limit, secs)| Policy {
                limit,
                window: Duration::from_secs(secs),
                fallback: Fallback::Local,
            });
            let key = format!("rate_limit_{}", name.as_str());
            let rule = src.get(&key, default, parse_rule)?;
            rules.push((name, rule));
        }
        let ipv6_prefix = src.get("rate_limit_ipv6_prefix", Self::DEFAULT_IPV6_PREFIX, |s| {
            match s.parse::<u8>() {
                Ok(n) if (32..=128).contains(&n) => Ok(n),
                _ => Err("expected a prefix length from 32 to 128 (bits)".into()),
            }
        })?;
        Ok(Policies { rules, ipv6_prefix })
    }

    pub fn get(&self, name: PolicyName) -> Option<Policy> {
        self.rules.iter().find(|(n, _)| *n == name).and_then(|(_, p)| *p)
    }
}

fn parse_rule(s: &str) -> Result<Option<Policy>, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let (rule, fallback) = match s.split_once(',') {
        None => (s, Fallback::Local),
        Some((r, "open")) => (r, Fallback::Open),
        Some((r, "local")) => (r, Fallback::Local),
        Some(_) => return Err("fallback must be open or local".into()),
    };
    let (limit, window) = rule
        .split_once('/')
        .ok_or("expected LIMIT/WINDOW_SECS, e.g. 10/60, or off")?;
    let limit: u32 = limit.trim().parse().map_err(|_| "LIMIT must be a whole number")?;
    let window: u64 = window
        .trim()
        .parse()
        .map_err(|_| "WINDOW_SECS must be a whole number")?;
    if limit == 0 || window == 0 || window > 86_400 * 7 {
        return Err("LIMIT must be at least 1 and WINDOW_SECS 1..=604800".into());
    }
    Ok(Some(Policy {
        limit,
        window: Duration::from_secs(window),
        fallback,
    }))
}

/// A refused request: what the 429 answer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    pub limit: u32,
    pub remaining: u32,
    pub reset_secs: u64,
    pub retry_after_secs: u64,
}

/// A policy's counters, registered once (so that they show from the first
/// scrape, and a check does no registry lookup by name and label).
#[derive(Clone)]
pub struct PolicyMetrics {
    allowed: metrics::Counter,
    limited: metrics::Counter,
    /// Only with Redis (no-op handles otherwise).
    leased: metrics::Counter,
    fallback: metrics::Counter,
}

impl PolicyMetrics {
    /// The counters of policy `name`; `with_redis`: whether its buckets live in Redis.
    pub fn new(name: &'static str, p: &Policy, with_redis: bool) -> PolicyMetrics {
        let (leased, fallback) = if with_redis {
            let mode = match p.fallback {
                Fallback::Local => "local",
                Fallback::Open => "open",
            };
            (
                metrics::counter!("latchkey_ratelimit_leased_total", "policy" => name),
                metrics::counter!("latchkey_ratelimit_fallback_total", "policy" => name, "mode" => mode),
            )
        } else {
            (metrics::Counter::noop(), metrics::Counter::noop())
        };
        let m = PolicyMetrics {
            allowed: metrics::counter!("latchkey_ratelimit_allowed_total", "policy" => name),
            limited: metrics::counter!("latchkey_ratelimit_limited_total", "policy" => name),
            leased,
            fallback,
        };
        for c in [&m.allowed, &m.limited, &m.leased, &m.fallback] {
            c.increment(0);
        }
        m
    }

    /// A check answered from a leased token.
    fn allowed_from_lease(&self) {
        self.allowed.increment(1);
        self.leased.increment(1);
    }
}

pub struct Limiter {
    enabled: bool,
    ipv6_prefix: u8,
    /// The named policies, indexed by `PolicyName as usize`.
    named: Vec<Option<(Policy, PolicyMetrics)>>,
    local: std::sync::Arc<LocalBuckets>,
    leases: std::sync::Arc<lease::Leases>,
    /// With Redis: the queue into the task that asks it.
    redis: Option<batch::Batcher>,
}

impl Limiter {
    /// A limiter with no named policies: callers pass a policy to
    /// [`Limiter::check_policy`] (the gateway's routes carry their own).
    pub fn new(enabled: bool, redis: Option<RedisHandle>) -> Self {
        let leases = std::sync::Arc::new(lease::Leases::new());
        Limiter {
            enabled,
            ipv6_prefix: Policies::DEFAULT_IPV6_PREFIX,
            named: vec![None; PolicyName::ALL.len()],
            local: std::sync::Arc::new(LocalBuckets::new()),
            redis: redis.map(|r| batch::Batcher::new(r, leases.clone())),
            leases,
        }
    }

    /// The service's named policies, checked with [`Limiter::check`].
    pub fn with_policies(mut self, policies: &Policies) -> Self {
        let with_redis = self.redis.is_some();
        self.named = PolicyName::ALL
            .iter()
            .enumerate()
            .map(|(i, &name)| {
                debug_assert_eq!(i, name as usize);
                policies
                    .get(name)
                    .map(|p| (p, PolicyMetrics::new(name.as_str(), &p, with_redis)))
            })
            .collect();
        self.ipv6_prefix = policies.ipv6_prefix;
        self
    }

    /// The same policies and in-process buckets (the fallback), asking Redis
    /// over another connection: the gateway gives each serving thread one on
    /// its own runtime, so that a check does not wake another thread.
    pub fn with_redis_connection(&self, redis: RedisHandle) -> Limiter {
        Limiter {
            enabled: self.enabled,
            ipv6_prefix: self.ipv6_prefix,
            named: self.named.clone(),
            local: self.local.clone(),
            leases: self.leases.clone(),
            redis: Some(batch::Batcher::new(redis, self.leases.clone())),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The bucket key of a client address (IPv6: its configured prefix).
    pub fn ip_key(&self, ip: std::net::IpAddr) -> IpKey {
        IpKey::new(ip, self.ipv6_prefix)
    }

    /// Whether `policy` limits anything (limits on and the policy configured).
    pub fn is_active(&self, policy: PolicyName) -> bool {
        self.enabled && self.named[policy as usize].is_some()
    }

    /// Takes one token from the bucket of (`policy`, `key`).
    pub async fn check(&self, policy: PolicyName, key: &str) -> Result<(), Limited> {
        if !self.enabled {
            return Ok(());
        }
        let Some((p, m)) = &self.named[policy as usize] else {
            return Ok(());
        };
        self.check_policy(policy.as_str(), *p, m, key).await
    }

    /// Takes one token from the bucket of (`name`, `key`) under policy `p`,
    /// counted in `m` (the gateway's per-route policies use this directly).
    pub async fn check_policy(
        &self,
        name: &'static str,
        p: Policy,
        m: &PolicyMetrics,
        key: &str,
    ) -> Result<(), Limited> {
        if !self.enabled {
            return Ok(());
        }
        let policy = name;
        let window_us = p.window.as_micros() as i64;
        let interval_us = (window_us / p.limit as i64).max(1);
        let outcome = match &self.redis {
            None => self.local.take(policy, key, now_us(), interval_us, window_us),
            Some(r) => {
                let terms = lease::Terms::of(p.limit, window_us);
                // `{...}` is a hash tag: the bucket's slot is fixed on Redis Cluster.
                let bucket = || r.redis().key(&format!("rl:{{{}:{}}}", policy, key));
                let now = now_us();
                let want = match self.leases.take(policy, key, now, terms) {
                    lease::Take::Leased => {
                        m.allowed_from_lease();
                        return Ok(());
                    }
                    lease::Take::Renew(want) => {
                        let ask = batch::Ask {
                            bucket: bucket(),
                            interval_us,
                            window_us,
                            want,
                        };
                        r.renew(
                            ask,
                            batch::Renewal {
                                policy,
                                key: key.into(),
                                ttl: terms.ttl,
                                asked: now,
                            },
                        );
                        m.allowed_from_lease();
                        return Ok(());
                    }
                    lease::Take::Ask(n) => n,
                };
                let res = r
                    .ask(batch::Ask {
                        bucket: bucket(),
                        interval_us,
                        window_us,
                        want,
                    })
                    .await;
                match res {
                    Ok((granted, retry_us, reset_us)) => {
                        let granted = u32::try_from(granted).unwrap_or(0).min(want.max(1));
                        self.leases.granted(policy, key, now_us(), terms.ttl, granted);
                        // Refused, but a check that raced this one may have
                        // leased spare tokens meanwhile: they have left the
                        // bucket already, so using one is still exact.
                        let spare_only = lease::Terms {
                            renew: false,
                            ..terms
                        };
                        if granted == 0
                            && !matches!(
                                self.leases.take(policy, key, now_us(), spare_only),
                                lease::Take::Ask(_)
                            )
                        {
                            m.allowed_from_lease();
                            return Ok(());
                        }
                        gcra::Outcome {
                            allowed: granted >= 1,
                            retry_after: retry_us,
                            reset: reset_us,
                        }
                    }
                    Err(e) => {
                        m.fallback.increment(1);
                        tracing::warn!(policy = policy, error = %e, fallback = ?p.fallback,
                            "rate limit store unavailable");
                        match p.fallback {
                            Fallback::Open => return Ok(()),
                            Fallback::Local => self.local.take(policy, key, now_us(), interval_us, window_us),
                        }
                    }
                }
            }
        };
        if outcome.allowed {
            m.allowed.increment(1);
            Ok(())
        } else {
            m.limited.increment(1);
            let remaining = ((window_us - outcome.reset).max(0) / interval_us) as u32;
            Err(Limited {
                limit: p.limit,
                remaining: remaining.min(p.limit),
                reset_secs: ceil_secs(outcome.reset),
                retry_after_secs: ceil_secs(outcome.retry_after).max(1),
            })
        }
    }

    /// Drops local buckets that are full again (housekeeping).
    pub fn purge(&self) {
        self.local.purge(now_us());
        self.leases.purge(now_us());
    }
}

/// An IP address as a bucket key, formatted on the stack (a check on the
/// hot path allocates nothing for its key). An IPv6 address is cut to its
/// first `v6_prefix` bits and written `addr/bits`, so that one host cannot
/// rotate through the addresses of its network to get fresh buckets; an
/// IPv4-mapped IPv6 address counts as the IPv4 address.
pub struct IpKey {
    buf: [u8; 48],
    len: usize,
}

impl IpKey {
    pub fn new(ip: std::net::IpAddr, v6_prefix: u8) -> IpKey {
        use std::io::Write;
        use std::net::IpAddr;
        let mut buf = [0u8; 48];
        let mut cur = std::io::Cursor::new(&mut buf[..]);
        // At most 43 bytes (`ffff:...:ffff/128`): always fits.
        let _ = match ip {
            IpAddr::V4(v4) => write!(cur, "{v4}"),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => write!(cur, "{v4}"),
                None => {
                    let bits = u32::from(v6_prefix.min(128));
                    let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                    let net = std::net::Ipv6Addr::from(u128::from(v6) & mask);
                    write!(cur, "{net}/{bits}")
                }
            },
        };
        let len = cur.position() as usize;
        IpKey { buf, len }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

fn ceil_secs(us: i64) -> u64 {
    (us.max(0) as u64).div_ceil(1_000_000)
}

/// Microseconds on a monotonic clock (the buckets and leases of this
/// process only compare its own instants; Redis keeps its own time): a
/// wall clock stepped back would stretch every lease by the step.
pub(super) fn now_us() -> i64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    // Far from zero, so that "long ago" sentinels stay in the past.
    const START: i64 = 1 << 40;
    START + BASE.get_or_init(std::time::Instant::now).elapsed().as_micros() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Sources;

    #[test]
    fn rules_parse() {
        assert_eq!(parse_rule("off").unwrap(), None);
        let p = parse_rule("10/60,open").unwrap().unwrap();
        assert_eq!(
            (p.limit, p.window.as_secs(), p.fallback),
            (10, 60, Fallback::Open)
        );
        assert!(parse_rule("0/60").is_err());
        assert!(parse_rule("10").is_err());
        assert!(parse_rule("10/60,maybe").is_err());
    }

    #[tokio::test]
    async fn local_policy_lets_exactly_n_through() {
        let src = Sources::from_pairs([("rate_limit_login_ip", "5/60")]);
        let limiter = Limiter::new(true, None).with_policies(&Policies::read(&src).unwrap());
        let mut allowed = 0;
        let mut last = None;
        for _ in 0..50 {
            match limiter.check(PolicyName::LoginIp, "1.2.3.4").await {
                Ok(()) => allowed += 1,
                Err(l) => last = Some(l),
            }
        }
        assert_eq!(allowed, 5);
        let l = last.unwrap();
        assert_eq!((l.limit, l.remaining), (5, 0));
        assert!((11..=12).contains(&l.retry_after_secs), "{l:?}");
        assert!((59..=60).contains(&l.reset_secs), "{l:?}");
        // Another key has its own bucket.
        assert!(limiter.check(PolicyName::LoginIp, "5.6.7.8").await.is_ok());
    }

    #[tokio::test]
    async fn rates_above_one_per_millisecond_are_exact() {
        let src = Sources::from_pairs([("rate_limit_login_ip", "5000/1")]);
        let limiter = Limiter::new(true, None).with_policies(&Policies::read(&src).unwrap());
        let mut allowed = 0;
        for _ in 0..6000 {
            allowed += limiter.check(PolicyName::LoginIp, "k").await.is_ok() as u32;
        }
        // A burst of 5000, plus what refills while the loop runs (200 us per token).
        assert!((5000..5100).contains(&allowed), "{allowed}");
    }

    #[test]
    fn ip_keys_are_the_address_or_its_ipv6_network() {
        for (ip, prefix, want) in [
            ("10.0.0.1", 64, "10.0.0.1"),
            ("255.255.255.255", 64, "255.255.255.255"),
            ("::ffff:255.255.255.255", 64, "255.255.255.255"),
            ("::1", 128, "::1/128"),
            ("::1", 64, "::/64"),
            ("2001:db8::8a2e:370:7334", 64, "2001:db8::/64"),
            ("2001:db8:0:1:ffff::1", 64, "2001:db8:0:1::/64"),
            ("2001:db8:0:1:ffff::1", 56, "2001:db8::/56"),
            (
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                128,
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
            ),
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(IpKey::new(ip, prefix).as_str(), want, "{ip}/{prefix}");
        }
        // Two addresses of one /64 share a key; another /64 does not.
        let a = IpKey::new("2001:db8::1".parse().unwrap(), 64);
        let b = IpKey::new("2001:db8::ffff:1".parse().unwrap(), 64);
        let c = IpKey::new("2001:db8:0:1::1".parse().unwrap(), 64);
        assert_eq!(a.as_str(), b.as_str());
        assert_ne!(a.as_str(), c.as_str());
    }

    #[tokio::test]
    async fn disabled_limiter_allows_everything() {
        let src = Sources::from_pairs([("rate_limit_login_ip", "1/60")]);
        let limiter = Limiter::new(false, None).with_policies(&Policies::read(&src).unwrap());
        for _ in 0..10 {
            assert!(limiter.check(PolicyName::LoginIp, "k").await.is_ok());
        }
    }
}
