//! Header rules of the proxy, in one place so that they can be read (and
//! tested) together:
//! - hop-by-hop headers (RFC 9110 §7.6.1) never cross the gateway: the ones
//!   named by `Connection`, `Connection` itself, `Keep-Alive`, `TE`,
//!   `Trailer`, `Transfer-Encoding`, `Upgrade`, and every `Proxy-*` (plus a
//!   bare `Proxy`, which some CGI stacks turn into `HTTP_PROXY`: "httpoxy");
//! - request paths with dot-segments or encoded slashes are refused, so that
//!   an upstream normalising `/public/../admin` cannot be reached through a
//!   route that does not check tokens;
//! - `X-Request-Id` is kept when sane, generated otherwise.

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

/// False for paths an upstream might resolve elsewhere than they read:
/// `.`/`..` segments (also percent-encoded), encoded `/` or `\`, and raw `\`.
pub fn is_safe_path(path: &str) -> bool {
    let b = path.as_bytes();
    if !b.iter().any(|c| matches!(c, b'.' | b'%' | b'\\')) {
        return true;
    }
    if b.contains(&b'\\') {
        return false;
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") {
        return false;
    }
    !lower.split('/').any(|seg| {
        let seg = seg.replace("%2e", ".");
        seg == "." || seg == ".."
    })
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
    fn paths_that_could_escape_a_route_are_unsafe() {
        for p in [
            "/",
            "/api/v1/users",
            "/a.b/c.json",
            "/x%20y",
            "/..a/b..",
            "/.well-known/jwks.json",
        ] {
            assert!(is_safe_path(p), "{p}");
        }
        for p in [
            "/public/../admin",
            "/public/..",
            "/./admin",
            "/public/%2e%2e/admin",
            "/public/.%2E/admin",
            "/public%2fadmin",
            "/public%5Cadmin",
            "/public\\..\\admin",
        ] {
            assert!(!is_safe_path(p), "{p}");
        }
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
