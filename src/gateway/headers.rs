//! Header rules of the proxy, in one place so that they can be read (and
//! tested) together:
//! - hop-by-hop headers (RFC 9110 §7.6.1) never cross the gateway: the ones
//!   named by `Connection`, `Connection` itself, `Keep-Alive`, `TE`,
//!   `Trailer`, `Transfer-Encoding`, `Upgrade`, and every `Proxy-*` (plus a
//!   bare `Proxy`, which some CGI stacks turn into `HTTP_PROXY`: "httpoxy");
//! - names are compared as CGI-style stacks (WSGI, PHP, Rack, lighttpd) read
//!   them: lower case, every character other than a letter or digit alike,
//!   since `X_Auth_Subject` or `X.Auth.Subject` reaches such an upstream as
//!   `HTTP_X_AUTH_SUBJECT` just as `X-Auth-Subject` does;
//! - every header of the identity namespace (the four configured identity
//!   headers and anything named `x-auth-*`) and every forwarding header
//!   ([`FORWARDING`]: `X-Forwarded-*`, `Forwarded`, `X-Real-IP`,
//!   `X-Original-*`, `X-Rewrite-URL`, method overrides, ...) is removed
//!   from the client's request; the gateway then sets the identity headers
//!   (authenticated routes) and the forwarding headers it is configured to
//!   write, so an upstream sees only the gateway's values;
//! - so is every header an upstream server or framework may take for a fact
//!   about the request ([`REQUEST_META`]: the CGI meta-variables such as
//!   `SCRIPT_NAME`, which gunicorn cuts off the path before the application
//!   routes, `PATH_INFO`, `REMOTE_USER`; the headers middleware rewrites
//!   the request by, `X-Script-Name`, `X-Scheme`), and every header an
//!   authenticating proxy, a mesh or a TLS terminator asserts to its
//!   upstream ([`PROXY_ASSERTIONS`]: `X-Remote-*`, `X-Goog-Authenticated-*`,
//!   `X-SSL-Client-*`, ...); a route may take named ones of the latter from
//!   a trusted proxy (`allow_client_headers`);
//! - a request with more than one `Host` or `Authorization` is refused: an
//!   upstream could read the other one than the gateway did; `Host` and the
//!   target's authority are parsed strictly ([`HostPort`]) and must agree,
//!   and the upstream sees only the parsed value;
//! - `X-Request-Id` is kept when sane, generated otherwise.
//!
//! Paths have their own rules in `path`.

use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The fixed hop-by-hop names (RFC 9110 §7.6.1, and RFC 9112's `Transfer-Encoding`).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("proxy"),
];

pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name.as_str().starts_with("proxy-")
}

/// Removes every hop-by-hop header, including those named by `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if headers.keys().any(|k| k.as_str().starts_with("proxy-")) {
        let proxy: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("proxy-"))
            .cloned()
            .collect();
        for name in proxy {
            headers.remove(name);
        }
    }
}

/// Headers that say where a request came from or where it was going, or
/// that some framework routes or authorises by: only the gateway writes them.
pub const FORWARDING: [&str; 29] = [
    "forwarded",
    "forwarded-for",
    "x-forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-forwarded-uri",
    "x-forwarded-path",
    "x-real-ip",
    "x-client-ip",
    "client-ip",
    "x-cluster-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "cf-connecting-ipv6",
    "fastly-client-ip",
    "x-proxyuser-ip",
    "x-rewrite-url",
    "x-host",
    "x-url-scheme",
    "front-end-https",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The identity namespace beyond the four configured names.
const IDENTITY_PREFIX: &str = "x-auth-";
/// Every `X-Forwarded-*` and `X-Original-*` is the gateway's to write (or
/// to leave out): `X-Original-URL`, `-URI`, `-Host`, `-Method` and
/// `-Forwarded-For` are what proxies in front of IIS, Symfony and nginx's
/// `auth_request` report the request by.
const FORWARDING_PREFIXES: [&str; 2] = ["x-forwarded-", "x-original-"];

/// Request headers an upstream server or framework may read as facts
/// about the request rather than as headers: never taken from a client.
/// Where the names come from:
/// - the CGI meta-variables of RFC 3875 §4.1, and the ones Apache, nginx
///   and lighttpd add to that environment (`REQUEST_URI`, `SCRIPT_FILENAME`,
///   `DOCUMENT_ROOT`, `REMOTE_PORT`, `SERVER_ADDR`, `HTTPS`, ...): WSGI
///   servers (gunicorn takes a `SCRIPT_NAME` header as the application's
///   mount point and cuts it off the path it routes by), PHP-FPM, Rack and
///   CGI put headers and these variables in one namespace. `CONTENT_TYPE`
///   and `CONTENT_LENGTH` are not here: they are real headers;
/// - headers that widely copied middleware or a mesh reroutes the request
///   by: Flask's "ReverseProxied" snippet (`X-Script-Name`, `X-Scheme`),
///   Tornado's `xheaders` (`X-Scheme`), Envoy's `X-Envoy-Original-Path`,
///   Linkerd's `l5d-dst-override` (the destination service of a meshed
///   proxy).
pub const REQUEST_META: [&str; 29] = [
    // RFC 3875 §4.1, less the two that are real headers.
    "auth-type",
    "gateway-interface",
    "path-info",
    "path-translated",
    "query-string",
    "remote-addr",
    "remote-host",
    "remote-ident",
    "remote-user",
    "request-method",
    "script-name",
    "server-name",
    "server-port",
    "server-protocol",
    "server-software",
    // What web servers add to that environment.
    "request-uri",
    "request-scheme",
    "script-filename",
    "script-uri",
    "script-url",
    "document-root",
    "document-uri",
    "remote-port",
    "server-addr",
    "https",
    // Middleware and meshes that reroute by a header.
    "x-script-name",
    "x-scheme",
    "x-envoy-original-path",
    "l5d-dst-override",
];

/// Headers that an authenticating proxy, a mesh or a TLS terminator sets
/// for its upstream, which the upstream therefore believes: never taken
/// from a client, unless a route names one in `allow_client_headers` and
/// the request comes from a `trusted_proxies` address (the terminator in
/// front that sets it). Exact names: Authelia's `Remote-Groups`, `-Name`,
/// `-Email` (its `Remote-User` is a CGI variable above), Microsoft's
/// `X-Originating-IP`, Kong's `X-Credential-Identifier`,
/// `X-Anonymous-Consumer` and `X-Userinfo`, ASP.NET's `X-ARR-ClientCert`,
/// Fly.io's `Fly-Client-IP`.
pub const PROXY_ASSERTIONS: [&str; 9] = [
    "remote-groups",
    "remote-name",
    "remote-email",
    "x-originating-ip",
    "x-credential-identifier",
    "x-anonymous-consumer",
    "x-userinfo",
    "x-arr-clientcert",
    "fly-client-ip",
];

/// Name prefixes of [`PROXY_ASSERTIONS`]' kind: Kubernetes' front proxy
/// (`X-Remote-User`, `-Group`, `-Extra-*`), Grafana's auth proxy
/// (`X-WEBAUTH-USER`), Envoy and Istio (`X-Envoy-*`, `X-Istio-*`), AWS ALB
/// (`X-Amzn-Oidc-*`, `X-Amzn-Mtls-*`), Google IAP
/// (`X-Goog-Authenticated-User-*`, `X-Goog-IAP-*`), App Engine
/// (`X-AppEngine-*`), Azure App Service (`X-MS-Client-Principal*`,
/// `X-MS-Token-*`), Cloudflare Access (`Cf-Access-*`), Pomerium
/// (`X-Pomerium-*`), Kong (`X-Consumer-*`, `X-Authenticated-*`), authentik
/// (`X-authentik-*`), Vouch (`X-Vouch-*`), Tailscale (`Tailscale-User-*`),
/// oauth2-proxy (`GAP-Auth`, besides its `X-Forwarded-*` and
/// `X-Auth-Request-*`, reserved as forwarding and identity headers), and
/// client certificates passed on by TLS terminators (`X-SSL-*`,
/// `SSL-Client-*`, `X-Client-Cert*`).
pub const PROXY_ASSERTION_PREFIXES: [&str; 22] = [
    "x-remote-",
    "x-webauth-",
    "x-envoy-",
    "x-istio-",
    "x-amzn-oidc-",
    "x-amzn-mtls-",
    "x-goog-authenticated-",
    "x-goog-iap-",
    "x-appengine-",
    "x-ms-client-principal",
    "x-ms-token-",
    "cf-access-",
    "x-pomerium-",
    "x-consumer-",
    "x-authenticated-",
    "x-authentik-",
    "x-vouch-",
    "tailscale-user-",
    "gap-auth",
    "x-ssl-",
    "ssl-client-",
    "x-client-cert",
];

/// A header name's byte as CGI-style stacks fold it: letters and digits
/// stand, every other character (`-`, `_`, `.`, `~`, ...) becomes `-`
/// (lighttpd and older Apache turn each into `_`, PHP turns `.` into `_`).
fn fold(b: u8) -> u8 {
    if b.is_ascii_alphanumeric() {
        b
    } else {
        b'-'
    }
}

/// `name` (already lower case, as `HeaderName`s are) equals `target` once folded.
fn folded_eq(name: &str, target: &str) -> bool {
    name.len() == target.len() && name.bytes().zip(target.bytes()).all(|(a, b)| fold(a) == fold(b))
}

fn folded_starts_with(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len() && folded_eq(&name[..prefix.len()], prefix)
}

/// Why the gateway removes a client's header of some name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// The identity namespace: the configured identity headers and `x-auth-*`.
    Identity,
    /// Where the request came from or was going ([`FORWARDING`]).
    Forwarding,
    /// Facts about the request to some upstream ([`REQUEST_META`]).
    RequestMeta,
    /// What a proxy in front asserts to some upstream
    /// ([`PROXY_ASSERTIONS`]); a route may take it from a trusted proxy.
    ProxyAssertion,
}

/// Whether, and why, the gateway alone may write a header of this name,
/// in any spelling a CGI-style stack would fold together.
pub fn reserved(name: &HeaderName, identity: &[&HeaderName]) -> Option<Reserved> {
    let n = name.as_str();
    if folded_starts_with(n, IDENTITY_PREFIX) || identity.iter().any(|i| folded_eq(n, i.as_str())) {
        return Some(Reserved::Identity);
    }
    if FORWARDING_PREFIXES.iter().any(|p| folded_starts_with(n, p))
        || FORWARDING.iter().any(|f| folded_eq(n, f))
    {
        return Some(Reserved::Forwarding);
    }
    if REQUEST_META.iter().any(|m| folded_eq(n, m)) {
        return Some(Reserved::RequestMeta);
    }
    if PROXY_ASSERTIONS.iter().any(|m| folded_eq(n, m))
        || PROXY_ASSERTION_PREFIXES.iter().any(|p| folded_starts_with(n, p))
    {
        return Some(Reserved::ProxyAssertion);
    }
    None
}

/// Whether the gateway alone may write a header of this name (see [`reserved`]).
pub fn is_reserved(name: &HeaderName, identity: &[&HeaderName]) -> bool {
    reserved(name, identity).is_some()
}

/// Removes every header the gateway alone may write, but the
/// [`Reserved::ProxyAssertion`] ones in `allowed` (compared folded as
/// well): the route's `allow_client_headers` when a trusted proxy sent the
/// request, else none.
pub fn strip_reserved(headers: &mut HeaderMap, identity: &[&HeaderName], allowed: &[HeaderName]) {
    let removed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| match reserved(k, identity) {
            None => false,
            Some(Reserved::ProxyAssertion) => !allowed.iter().any(|a| folded_eq(k.as_str(), a.as_str())),
            Some(_) => true,
        })
        .cloned()
        .collect();
    for name in removed {
        headers.remove(name);
    }
}

/// Why a request's headers are refused, if they are.
pub fn ambiguous(headers: &HeaderMap) -> Option<&'static str> {
    if headers.get_all(header::HOST).iter().nth(1).is_some() {
        return Some("Host: more than one");
    }
    if headers.get_all(header::AUTHORIZATION).iter().nth(1).is_some() {
        return Some("Authorization: more than one");
    }
    None
}

fn sane_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
}

/// The client's `X-Request-Id` if it is sane, a new one otherwise.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    match headers.get("x-request-id") {
        Some(v) if sane_request_id(v) => v.clone(),
        _ => new_request_id(),
    }
}

/// 32 hex digits: a random per-process prefix and a counter. Unique without
/// a system call per request (ids are for correlation, not secrets).
fn new_request_id() -> HeaderValue {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    HeaderValue::from_str(&format!("{prefix:016x}{n:016x}")).expect("hex is a valid header")
}

/// A host and port as the gateway routes by and forwards: a host name in
/// lower case without a trailing dot, an IPv4 address, or an IPv6 address
/// (written in brackets), and an optional port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: Option<u16>,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

impl HostPort {
    /// Parses a `Host` value or a request target's authority strictly:
    /// anything else (user info, a second value, a port that is not a
    /// number, characters a host name cannot hold) is `None`, so that no
    /// upstream can read another host out of it than the gateway did.
    pub fn parse(raw: &str) -> Option<HostPort> {
        let (host, port) = if let Some(rest) = raw.strip_prefix('[') {
            let (v6, after) = rest.split_once(']')?;
            let ip: std::net::Ipv6Addr = v6.parse().ok()?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            };
            (ip.to_string(), port)
        } else {
            let (h, port) = match raw.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (raw, None),
            };
            let h = h.strip_suffix('.').unwrap_or(h);
            let labels_ok = !h.is_empty()
                && h.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !labels_ok || h.len() > 253 {
                return None;
            }
            (h.to_ascii_lowercase(), port)
        };
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
                Some(p.parse::<u16>().ok()?)
            }
            Some(_) => return None,
        };
        Some(HostPort { host, port })
    }
}

/// The host a request is for: the request target's authority (absolute
/// form, HTTP/2 `:authority`) and `Host`, which must agree when both are
/// there; `Err` with the reason when either is malformed, they differ, or an
/// HTTP/1.1 request names no host at all.
pub fn request_host(
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    version: axum::http::Version,
) -> Result<Option<HostPort>, &'static str> {
    let from_target = match uri.authority() {
        None => None,
        Some(a) => Some(HostPort::parse(a.as_str()).ok_or("the request target's authority is not a host")?),
    };
    let from_header = match headers.get(header::HOST) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(HostPort::parse)
                .ok_or("Host: not a host name with an optional port")?,
        ),
    };
    match (from_target, from_header) {
        (Some(t), Some(h)) if t != h => Err("Host: differs from the request target's authority"),
        (Some(t), _) => Ok(Some(t)),
        (None, Some(h)) => Ok(Some(h)),
        (None, None) if version == axum::http::Version::HTTP_11 => Err("Host: required"),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_including_those_named_by_connection() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("proxy", "http://evil:8080"),
            ("x-kept", "yes"),
            ("content-type", "text/plain"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-kept", "content-type"]);
    }

    #[test]
    fn reserved_names_match_in_every_cgi_spelling() {
        let subject = HeaderName::from_static("x-user-id");
        let identity = [&subject];
        for name in [
            "x-user-id",
            "x_user_id",
            "x-user_id",
            "x-auth-subject",
            "x_auth_subject",
            "x-auth-anything",
            "x_auth_",
            "x-forwarded-for",
            "x_forwarded_host",
            "x-real-ip",
            "x_real_ip",
            "x-original-url",
            "x-rewrite-url",
            "forwarded",
            "x-http-method-override",
            "x.auth.subject",
            "x~auth~subject",
            "x-forwarded-user",
            "x_forwarded_access_token",
            "x-forwarded-client-cert",
            "script_name",
            "SCRIPT-NAME",
            "path_info",
            "x_script_name",
            "x-scheme",
            "remote_user",
            "x-remote-user",
            "x-originating-ip",
            "x-original-method",
            "x-envoy-original-path",
            "x-webauth-user",
            "x-ms-client-principal-name",
            "l5d-dst-override",
            "x-arr-clientcert",
            "tailscale-user-login",
            "x-appengine-user-email",
            "fly-client-ip",
            "cf-connecting-ipv6",
        ] {
            assert!(
                is_reserved(&HeaderName::from_bytes(name.as_bytes()).unwrap(), &identity),
                "{name}"
            );
        }
        for name in [
            "x-user",
            "x-authz",
            "authorization",
            "x-forward",
            "x-request-id",
            "content-type",
        ] {
            assert!(
                !is_reserved(&HeaderName::from_bytes(name.as_bytes()).unwrap(), &identity),
                "{name}"
            );
        }
    }

    #[test]
    fn upstream_meta_data_is_removed_unless_the_route_allows_it() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("script_name", "/x"),
            ("x-script-name", "/x"),
            ("x-scheme", "https"),
            ("remote-user", "admin"),
            ("x-remote-group", "admins"),
            ("x-envoy-original-path", "/admin"),
            ("x-original-method", "DELETE"),
            ("x-goog-authenticated-user-email", "a@b"),
            ("cf-access-jwt-assertion", "x"),
            ("x-auth-subject", "victim"),
            ("content-type", "text/plain"),
            ("content_length", "5"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        // Allowing a request fact has no effect; a proxy's assertion does.
        let allowed = [
            HeaderName::from_static("x-scheme"),
            HeaderName::from_static("x-goog-authenticated-user-email"),
        ];
        strip_reserved(&mut h, &[], &allowed);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            [
                "content-type",
                "content_length",
                "x-goog-authenticated-user-email"
            ]
        );
        assert_eq!(
            reserved(&HeaderName::from_static("x_auth_subject"), &[]),
            Some(Reserved::Identity),
            "an allowed list never reaches the identity namespace"
        );
    }

    #[test]
    fn two_hosts_or_two_authorizations_are_ambiguous() {
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("a"));
        assert_eq!(ambiguous(&h), None);
        h.append(header::HOST, HeaderValue::from_static("b"));
        assert!(ambiguous(&h).is_some());
        let mut h = HeaderMap::new();
        h.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        h.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert!(ambiguous(&h).is_some());
    }

    #[test]
    fn request_ids_are_kept_when_sane() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", HeaderValue::from_static("bad id<script>"));
        assert_eq!(request_id(&h).len(), 32);
        let (a, b) = (request_id(&HeaderMap::new()), request_id(&HeaderMap::new()));
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }

    #[test]
    fn hosts_are_parsed_strictly_and_agree() {
        let hp = |s: &str| HostPort::parse(s).map(|h| h.to_string());
        assert_eq!(
            hp("Api.Example.com:8443").as_deref(),
            Some("api.example.com:8443")
        );
        assert_eq!(hp("admin.example.com.").as_deref(), Some("admin.example.com"));
        assert_eq!(hp("[::1]:8000").as_deref(), Some("[::1]:8000"));
        assert_eq!(hp("10.0.0.1").as_deref(), Some("10.0.0.1"));
        for bad in [
            "admin.example.com:x",
            "admin.example.com:80:80",
            "a.example, admin.example.com",
            "gw.test\", for=10.0.0.9",
            "user@admin.example.com",
            "",
            ":80",
            "a..b",
            "[::1",
            "[nothost]",
            "host:999999",
        ] {
            assert_eq!(hp(bad), None, "{bad}");
        }
        use axum::http::Version;
        let uri: axum::http::Uri = "/x".parse().unwrap();
        let mut h = HeaderMap::new();
        assert!(
            request_host(&uri, &h, Version::HTTP_11).is_err(),
            "HTTP/1.1 needs a host"
        );
        assert_eq!(request_host(&uri, &h, Version::HTTP_10), Ok(None));
        h.insert(header::HOST, HeaderValue::from_static("Shop.example:81"));
        let got = request_host(&uri, &h, Version::HTTP_11).unwrap().unwrap();
        assert_eq!((got.host.as_str(), got.port), ("shop.example", Some(81)));
        let abs: axum::http::Uri = "http://shop.example:82/x".parse().unwrap();
        assert!(request_host(&abs, &h, Version::HTTP_11).is_err(), "ports differ");
        let abs: axum::http::Uri = "http://SHOP.example:81/x".parse().unwrap();
        assert!(request_host(&abs, &h, Version::HTTP_11).is_ok());
    }
}
