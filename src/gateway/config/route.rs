//! A route of the gateway's file (`[[routes]]`): its types and how it is
//! read, with the shared value parsers (`crate::settings`).

use std::collections::HashSet;
use std::time::Duration;

use axum::http::HeaderName;

use super::{Fields, IdentityHeaders, Result, UpstreamSettings};
use crate::limits::{Fallback, Policy};
use crate::settings::{millis, non_empty, number, one_of, switch, ConfigError, Source};

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
    /// Headers a proxy in front asserts ([`crate::gateway::headers::Reserved::ProxyAssertion`])
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

/// The `[[routes]]` of the file's table `t` (read by `f`), each checked
/// alone, then together (names and matchers are unique).
pub(super) fn routes(
    t: &toml::Table,
    f: &Fields,
    default_audiences: &[String],
    upstream: &UpstreamSettings,
    identity: &IdentityHeaders,
) -> Result<Vec<RouteConfig>> {
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
        parsed.push(route(i, path, table, default_audiences, upstream, identity)?);
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
    Ok(parsed)
}

/// A route's name: 1 to 64 of a-z, A-Z, 0-9, '-', '_', '.'.
fn route_name(n: &str) -> std::result::Result<String, String> {
    let valid = !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if valid {
        Ok(n.to_string())
    } else {
        Err("1..=64 characters among a-z, A-Z, 0-9, '-', '_', '.'".into())
    }
}

/// A host name or `*.domain`; empty or `*`: any host.
fn host_match(h: &str) -> std::result::Result<Option<HostMatch>, String> {
    if h.is_empty() || h == "*" {
        return Ok(None);
    }
    let bare = h.strip_prefix("*.").unwrap_or(h);
    let valid = !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
        && !bare.starts_with('.')
        && !bare.ends_with('.');
    if !valid {
        return Err(format!("{h:?} is not a host name (or *.domain)"));
    }
    Ok(Some(if h.starts_with("*.") {
        HostMatch::Subdomains(format!(".{}", bare.to_ascii_lowercase()))
    } else {
        HostMatch::Exact(bare.to_ascii_lowercase())
    }))
}

/// A path prefix, in the normal form requests are matched in: a prefix in
/// any other form would match one spelling of a path and not another.
fn path_prefix(p: &str) -> std::result::Result<String, String> {
    if !p.starts_with('/') || p.contains(['?', '#', ' ']) {
        return Err("must start with / and hold no ?, # or space".into());
    }
    let normal = crate::gateway::path::normalise(p).ok();
    if !p.is_ascii() || p.contains(['%', ';']) || normal.is_none_or(|n| n.path != p) {
        return Err("must be in normal form: ASCII, no %, ;, // or dot segments".into());
    }
    Ok(p.to_string())
}

/// An upstream's URL: its origin (`http://host:port`) and its path
/// without a trailing slash ("" for none).
fn upstream_url(s: &str) -> std::result::Result<(String, String), String> {
    let u = url::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    if u.scheme() != "http" {
        return Err(
            "expected an http:// URL (TLS to upstreams is not supported; terminate it in front)".into(),
        );
    }
    let Some(host) = u.host_str() else {
        return Err("the URL needs a host".into());
    };
    if u.query().is_some() || u.fragment().is_some() || !u.username().is_empty() {
        return Err("the URL must not hold a query, fragment or credentials".into());
    }
    let origin = match u.port() {
        Some(p) => format!("http://{host}:{p}"),
        None => format!("http://{host}"),
    };
    Ok((origin, u.path().trim_end_matches('/').to_string()))
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
    let (upstream_origin, upstream_path) = f.required("upstream", upstream_url)?;
    let auth = f.get("auth", true, switch)?;
    let audiences = f
        .non_empty_list("audiences", non_empty)?
        .unwrap_or_else(|| default_audiences.to_vec());
    if !auth && f.has("audiences") {
        return Err(f.err("audiences", "only meaningful with auth = true"));
    }
    let require_mfa = f.get("require_mfa", false, switch)?;
    if require_mfa && !auth {
        return Err(f.err("require_mfa", "only meaningful with auth = true"));
    }
    let rate_limit = match f.table("rate_limit")? {
        None => None,
        Some(rt) => Some(rate_limit(&f.name("rate_limit"), rt, auth)?),
    };
    Ok(RouteConfig {
        name: f.get("name", format!("route{index}"), route_name)?,
        host: f.get("host", None, host_match)?,
        path_prefix: f.get("path_prefix", "/".to_string(), path_prefix)?,
        upstream_origin,
        upstream_path,
        strip_prefix: f.get("strip_prefix", false, switch)?,
        preserve_host: f.get("preserve_host", false, switch)?,
        case_sensitive: f.get("case_sensitive", !auth, switch)?,
        allow_client_headers: allowed_client_headers(&f, identity)?,
        auth,
        require_mfa,
        audiences,
        forward_authorization: f.get("forward_authorization", true, switch)?,
        timeout: f.get("timeout_ms", upstream.timeout, millis(1, 3_600_000))?,
        rate_limit,
    })
}

/// `allow_client_headers`: names of headers a proxy in front asserts to
/// upstreams ([`crate::gateway::headers::Reserved::ProxyAssertion`]: a client
/// certificate from a TLS terminator, an identity from an authenticating
/// proxy) that the route takes from its `trusted_proxies`. Identity and
/// forwarding headers cannot be allowed (the gateway writes them), nor
/// facts about the request such as `SCRIPT_NAME` (they reroute it), and a
/// name the gateway does not remove needs no allowing: each is a mistake
/// worth a line at start.
fn allowed_client_headers(f: &Fields, identity: &IdentityHeaders) -> Result<Vec<HeaderName>> {
    use crate::gateway::headers::{reserved, Reserved};
    f.list("allow_client_headers", |n| {
        let h = HeaderName::from_bytes(n.as_bytes()).map_err(|_| format!("{n:?} is not a valid header name"))?;
        match reserved(&h, &identity.all()) {
            Some(Reserved::ProxyAssertion) => Ok(h),
            Some(Reserved::Identity | Reserved::Forwarding) => Err(format!(
                "{n:?} is an identity or forwarding header, which only the gateway writes"
            )),
            Some(Reserved::RequestMeta) => Err(format!(
                "{n:?} is a fact about the request (a CGI variable, or a header that reroutes it), never taken from a client"
            )),
            None => Err(format!(
                "{n:?} is not a header the gateway removes; it reaches the upstream already"
            )),
        }
    })
}

fn rate_limit(path: &str, t: &toml::Table, auth: bool) -> Result<RateLimitConfig> {
    let f = Fields::new(path, t, &["limit", "window_secs", "key", "on_redis_failure"])?;
    let limit = f.required("limit", number(1, u32::MAX))?;
    let window = f.required("window_secs", |s| {
        number(1, 7 * 86_400)(s).map(Duration::from_secs)
    })?;
    let key = f.get(
        "key",
        if auth { LimitKey::Subject } else { LimitKey::Ip },
        one_of(&[
            ("sub", LimitKey::Subject),
            ("client_id", LimitKey::ClientId),
            ("ip", LimitKey::Ip),
        ]),
    )?;
    if !auth && key != LimitKey::Ip {
        return Err(f.err(
            "key",
            "sub and client_id need auth = true on the route; use \"ip\"",
        ));
    }
    let fallback = f.get(
        "on_redis_failure",
        Fallback::Local,
        one_of(&[("local", Fallback::Local), ("open", Fallback::Open)]),
    )?;
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
    use crate::gateway::GatewayConfig;

    fn parse(routes: &str) -> Result<GatewayConfig> {
        GatewayConfig::from_toml(&format!(
            "jwks_url = \"http://127.0.0.1:8080/.well-known/jwks.json\"\nissuer = \"http://127.0.0.1:8080\"\n{routes}"
        ))
    }

    #[test]
    fn values_are_read_with_the_services_parsers_and_spellings() {
        let c = parse(
            "[[routes]]\nupstream = \"http://x\"\nstrip_prefix = \"on\"\ntimeout_ms = \"2500\"\n[routes.rate_limit]\nlimit = \"7\"\nwindow_secs = 60",
        )
        .unwrap();
        let r = &c.routes[0];
        assert!(r.strip_prefix);
        assert_eq!(r.timeout, Duration::from_millis(2500));
        assert_eq!(r.rate_limit.as_ref().unwrap().policy.limit, 7);
        let e = parse("[[routes]]\nupstream = \"http://x\"\n[routes.rate_limit]\nlimit = 5\nwindow_secs = 60\nkey = \"user\"")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid setting routes[0].rate_limit.key: expected \"sub\", \"client_id\" or \"ip\", got \"user\""
        );
        let e = parse("[[routes]]\nupstream = [\"http://x\"]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("invalid setting routes[0].upstream: expected a single value"),
            "{e}"
        );
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
    fn host_patterns() {
        let sub = HostMatch::Subdomains(".example.com".into());
        assert!(sub.matches("api.example.com"));
        assert!(sub.matches("A.B.EXAMPLE.COM"));
        assert!(!sub.matches("example.com"));
        assert!(!sub.matches("evilexample.com"));
        assert!(HostMatch::Exact("example.com".into()).matches("Example.COM"));
    }
}
