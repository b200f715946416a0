//! The route table: which route serves a request, and each route's
//! pre-registered metric handles (so that the hot path does no registry
//! lookups). A table is immutable; a reload builds a new one and swaps it in.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram};

use super::config::{
    ForwardHeaders, GatewayConfig, HostMatch, IdentityHeaders, LimiterStore, RouteConfig, UnknownRevocations,
};
use super::path::{case_key, drop_segments, prefix_matches, PrefixRule};
use crate::limits::PolicyMetrics;

/// A `&'static str` for a name that lives as long as the process (route
/// names are metric labels and rate-limit policy names). Interned, so that
/// reloads do not leak a copy each time.
fn intern(s: String) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().expect("intern lock");
    let set = names.get_or_insert_with(HashSet::new);
    if let Some(existing) = set.get(s.as_str()) {
        return existing;
    }
    let leaked: &'static str = Box::leak(s.into_boxed_str());
    set.insert(leaked);
    leaked
}

pub struct RouteMetrics {
    pub duration: Histogram,
    pub upstream: Histogram,
    /// By status class: 1xx .. 5xx.
    pub requests: [Counter; 5],
    pub rate_limited: Counter,
}

impl RouteMetrics {
    fn new(route: &'static str) -> RouteMetrics {
        let class = |c: &'static str| metrics::counter!("latchkey_gateway_requests_total", "route" => route, "status" => c);
        RouteMetrics {
            duration: metrics::histogram!("latchkey_gateway_request_duration_seconds", "route" => route),
            upstream: metrics::histogram!("latchkey_gateway_upstream_duration_seconds", "route" => route),
            requests: [
                class("1xx"),
                class("2xx"),
                class("3xx"),
                class("4xx"),
                class("5xx"),
            ],
            rate_limited: metrics::counter!("latchkey_gateway_rate_limited_total", "route" => route),
        }
    }

    pub fn count(&self, status: u16) {
        let i = (status / 100).clamp(1, 5) as usize - 1;
        self.requests[i].increment(1);
    }
}

pub struct Route {
    pub name: &'static str,
    /// The rate-limit policy name (`gateway.<route>`), the limiter's bucket namespace.
    pub policy_name: &'static str,
    pub config: RouteConfig,
    pub metrics: RouteMetrics,
    /// The counters of the route's rate limit, if it has one.
    pub limit_metrics: Option<PolicyMetrics>,
}

pub struct RouteTable {
    /// Most specific first: exact host, then `*.domain`, then any host;
    /// within each, longer prefixes first; ties keep the file's order.
    routes: Vec<Route>,
    pub identity: IdentityHeaders,
    pub forward: ForwardHeaders,
    pub when_revocations_unknown: UnknownRevocations,
    /// `request_read_ahead_bytes` (`body.rs`).
    pub read_ahead: usize,
    pub trusted_proxies: Vec<IpAddr>,
    /// Requests no route serves.
    pub unmatched: RouteMetrics,
    pub in_flight: Gauge,
}

impl RouteTable {
    pub fn new(cfg: &GatewayConfig) -> RouteTable {
        let limits_in_redis = cfg.limiter == LimiterStore::Redis && cfg.redis.is_some();
        let mut routes: Vec<(usize, Route)> = cfg
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let name = intern(r.name.clone());
                let policy_name = intern(format!("gateway.{}", r.name));
                let limit_metrics = r
                    .rate_limit
                    .as_ref()
                    .map(|rl| PolicyMetrics::new(policy_name, &rl.policy, limits_in_redis));
                (
                    i,
                    Route {
                        name,
                        policy_name,
                        config: r.clone(),
                        metrics: RouteMetrics::new(name),
                        limit_metrics,
                    },
                )
            })
            .collect();
        // (class, longer wildcard suffix first): exact host 0, `*.domain` 1, any host 2.
        let host_rank = |h: &Option<HostMatch>| match h {
            Some(HostMatch::Exact(_)) => (0, std::cmp::Reverse(0)),
            Some(HostMatch::Subdomains(s)) => (1, std::cmp::Reverse(s.len())),
            None => (2, std::cmp::Reverse(0)),
        };
        routes.sort_by_key(|(i, r)| {
            (
                host_rank(&r.config.host),
                std::cmp::Reverse(r.config.path_prefix.len()),
                *i,
            )
        });
        RouteTable {
            routes: routes.into_iter().map(|(_, r)| r).collect(),
            identity: cfg.identity.clone(),
            forward: cfg.forward_headers,
            when_revocations_unknown: cfg.revocations.when_unknown,
            read_ahead: cfg.read_ahead,
            trusted_proxies: cfg.trusted_proxies.clone(),
            unmatched: RouteMetrics::new("unmatched"),
            in_flight: metrics::gauge!("latchkey_gateway_requests_in_flight"),
        }
    }

    /// The route serving `host` (if known) and the match key of a
    /// normalised path (`path::Normal::key`). A protected route matches in
    /// any case, with a format suffix and without its prefix's trailing
    /// slash ([`PrefixRule`]) unless its file says `case_sensitive = true`,
    /// so that no spelling an upstream may take for a protected path
    /// reaches it through a public route.
    pub fn find(&self, host: Option<&str>, key: &str) -> Option<&Route> {
        let mut folded = None;
        self.routes.iter().find(|r| {
            let c = &r.config;
            let host_ok = match (&c.host, host) {
                (None, _) => true,
                (Some(m), Some(h)) => m.matches(h),
                (Some(_), None) => false,
            };
            // A protected route fails closed unless told to match exactly.
            let rule = PrefixRule {
                case_sensitive: c.case_sensitive,
                fail_closed: c.auth && !c.case_sensitive,
            };
            let key = if c.case_sensitive {
                key
            } else {
                folded.get_or_insert_with(|| case_key(key))
            };
            host_ok && prefix_matches(&c.path_prefix, key, rule)
        })
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }
}

/// The path sent upstream: the upstream URL's own path, then the request
/// path (without the route prefix when `strip_prefix`), then the query.
pub fn upstream_path_and_query(route: &RouteConfig, path: &str, query: Option<&str>) -> String {
    let rest = if route.strip_prefix {
        let segments = route.path_prefix.split('/').filter(|s| !s.is_empty()).count();
        drop_segments(path, segments)
    } else {
        path
    };
    let mut out =
        String::with_capacity(route.upstream_path.len() + rest.len() + 1 + query.map_or(0, |q| q.len() + 1));
    out.push_str(&route.upstream_path);
    if !rest.starts_with('/') {
        out.push('/');
    }
    out.push_str(rest);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(routes: &str) -> RouteTable {
        let cfg = GatewayConfig::from_toml(&format!(
            "jwks_url = \"http://a/jwks\"\nissuer = \"http://a\"\n{routes}"
        ))
        .unwrap();
        RouteTable::new(&cfg)
    }

    #[test]
    fn the_most_specific_route_wins() {
        let t = table(
            r#"
[[routes]]
name = "all"
upstream = "http://u0"
[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://u1"
[[routes]]
name = "api-admin"
path_prefix = "/api/admin/"
upstream = "http://u2"
[[routes]]
name = "host"
host = "Shop.example.com"
upstream = "http://u3"
[[routes]]
name = "wild"
host = "*.example.com"
path_prefix = "/api"
upstream = "http://u4"
"#,
        );
        let name = |h: Option<&str>, p: &str| t.find(h, p).map(|r| r.name);
        assert_eq!(name(None, "/"), Some("all"));
        assert_eq!(name(None, "/api"), Some("api"));
        assert_eq!(name(None, "/api/x"), Some("api"));
        assert_eq!(name(None, "/apiary"), Some("all"));
        assert_eq!(name(None, "/api/admin/users"), Some("api-admin"));
        assert_eq!(
            name(None, "/api/admin"),
            Some("api-admin"),
            "a protected /api/admin/ serves /api/admin too (routers mount it there)"
        );
        assert_eq!(name(Some("shop.example.com"), "/api/x"), Some("host"));
        assert_eq!(name(Some("eu.example.com"), "/api/x"), Some("wild"));
        assert_eq!(name(Some("eu.example.com"), "/other"), Some("all"));
        assert_eq!(name(Some("example.org"), "/api/admin/x"), Some("api-admin"));
    }

    #[test]
    fn no_route_no_match() {
        let t = table("[[routes]]\npath_prefix = \"/only\"\nupstream = \"http://u\"");
        assert!(t.find(None, "/other").is_none());
    }

    #[test]
    fn upstream_paths() {
        let cfg = GatewayConfig::from_toml(
            r#"
jwks_url = "http://a/jwks"
issuer = "http://a"
[[routes]]
path_prefix = "/api"
upstream = "http://u/v2/"
strip_prefix = true
[[routes]]
path_prefix = "/keep/"
upstream = "http://u"
"#,
        )
        .unwrap();
        let (strip, keep) = (&cfg.routes[0], &cfg.routes[1]);
        assert_eq!(
            upstream_path_and_query(strip, "/api/users", Some("a=1")),
            "/v2/users?a=1"
        );
        assert_eq!(upstream_path_and_query(strip, "/api", None), "/v2/");
        assert_eq!(upstream_path_and_query(keep, "/keep/x", None), "/keep/x");
    }
}
