//! Header rules of the proxy, in one place so that they can be read (and
//! tested) together:
//! - hop-by-hop headers (RFC 9110 §7.6.1) never cross the gateway: the ones
//!   named by `Connection`, `Connection` itself, `Keep-Alive`, `TE`,
//!   `Trailer`, `Transfer-Encoding`, `Upgrade`, and every `Proxy-*` (plus a
//!   bare `Proxy`, which some CGI stacks turn into `HTTP_PROXY`: "httpoxy");
//! - names are compared as CGI-style stacks (WSGI, PHP, Rack) read them:
//!   lower case, with `_` and `-` alike, since `X_Auth_Subject` reaches such
//!   an upstream as `HTTP_X_AUTH_SUBJECT` just as `X-Auth-Subject` does;
//! - every header of the identity namespace (the four configured identity
//!   headers and anything named `x-auth-*`) and every forwarding header
//!   ([`FORWARDING`]: `X-Forwarded-*`, `Forwarded`, `X-Real-IP`,
//!   `X-Original-URL`, `X-Rewrite-URL`, method overrides, ...) is removed
//!   from the client's request; the gateway then sets the identity headers
//!   (authenticated routes) and the forwarding headers it is configured to
//!   write, so an upstream sees only the gateway's values;
//! - a request with more than one `Host` or `Authorization` is refused: an
//!   upstream could read the other one than the gateway did;
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
pub const FORWARDING: [&str; 32] = [
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
    "x-original-forwarded-for",
    "x-real-ip",
    "x-client-ip",
    "client-ip",
    "x-cluster-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-proxyuser-ip",
    "x-original-url",
    "x-original-uri",
    "x-rewrite-url",
    "x-original-host",
    "x-host",
    "x-url-scheme",
    "front-end-https",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The identity namespace beyond the four configured names.
const IDENTITY_PREFIX: &str = "x-auth-";

/// `name` (already lower case, as `HeaderName`s are) equals `target` when
/// `_` is read as `-`.
fn folded_eq(name: &str, target: &str) -> bool {
    name.len() == target.len()
        && name
            .bytes()
            .zip(target.bytes())
            .all(|(a, b)| a == b || (a == b'_' && b == b'-'))
}

fn folded_starts_with(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len() && folded_eq(&name[..prefix.len()], prefix)
}

/// Whether the gateway alone may write a header of this name: the identity
/// namespace (`identity`, and `x-auth-*`) and the forwarding headers, in any
/// spelling a CGI-style stack would fold together.
pub fn is_reserved(name: &HeaderName, identity: &[&HeaderName]) -> bool {
    let n = name.as_str();
    folded_starts_with(n, IDENTITY_PREFIX)
        || identity.iter().any(|i| folded_eq(n, i.as_str()))
        || FORWARDING.iter().any(|f| folded_eq(n, f))
}

/// Removes every header the gateway alone may write.
pub fn strip_reserved(headers: &mut HeaderMap, identity: &[&HeaderName]) {
    let reserved: Vec<HeaderName> = headers
        .keys()
        .filter(|k| is_reserved(k, identity))
        .cloned()
        .collect();
    for name in reserved {
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

/// The host a request is for, without port: the request target's authority
/// (absolute form, HTTP/2 `:authority`) or else `Host`.
pub fn request_host<'a>(uri: &'a axum::http::Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    if let Some(h) = uri.host() {
        return Some(h.trim_start_matches('[').trim_end_matches(']'));
    }
    host_header(headers)
}

/// The host named by the `Host` header, without port.
pub fn host_header(headers: &HeaderMap) -> Option<&str> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next();
    }
    Some(host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    }))
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
    fn hosts_lose_their_port() {
        let uri: axum::http::Uri = "/x".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("Api.Example.com:8443"));
        assert_eq!(request_host(&uri, &h), Some("Api.Example.com"));
        h.insert(header::HOST, HeaderValue::from_static("[::1]:8000"));
        assert_eq!(request_host(&uri, &h), Some("::1"));
        let abs: axum::http::Uri = "http://other.example:81/x".parse().unwrap();
        assert_eq!(request_host(&abs, &h), Some("other.example"));
    }
}
