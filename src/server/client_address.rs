//! The client's address as both programs read it: the socket peer, or,
//! from a trusted proxy, the right-most hop of the one forwarding header
//! that proxy writes that is not itself a trusted proxy.

use std::net::IpAddr;

/// The client's address: `peer`, or, when the peer is among `trusted`, the
/// right-most hop of the header `from` that is not a trusted proxy. Every
/// other forwarding header is the client's own writing and is ignored.
pub fn client_ip(
    peer: IpAddr,
    headers: &axum::http::HeaderMap,
    trusted: &[IpAddr],
    from: ProxyHeader,
) -> IpAddr {
    if !trusted.contains(&peer) {
        return peer;
    }
    // Every line of the header, in order: a proxy appends its hop last.
    // Hops are split on the raw bytes, so that a byte the client wrote that
    // is not text spoils only the client's own hop, not the proxy's.
    let hops: Vec<Option<IpAddr>> = headers
        .get_all(from.name())
        .into_iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|hop| {
            let hop = std::str::from_utf8(hop).ok()?;
            match from {
                ProxyHeader::XForwardedFor => hop.trim().parse().ok(),
                ProxyHeader::Forwarded => hop.split(';').find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.trim()
                        .eq_ignore_ascii_case("for")
                        .then(|| forwarded_node(v.trim()))?
                }),
            }
        })
        .collect();
    // Right to left: trusted hops are skipped; the first other hop is the
    // client. A hop that is not an address (unknown, obfuscated, garbled)
    // ends the walk: nothing left of it can be trusted.
    for hop in hops.into_iter().rev() {
        match hop {
            Some(ip) if trusted.contains(&ip) => continue,
            Some(ip) => return ip,
            None => return peer,
        }
    }
    peer
}

/// The address of an RFC 7239 node: `192.0.2.1`, `"192.0.2.1:80"`,
/// `"[2001:db8::1]:4711"`; `None` for `unknown` or an obfuscated name.
fn forwarded_node(v: &str) -> Option<IpAddr> {
    let v = v.trim_matches('"');
    if let Some(rest) = v.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    v.split(':').next()?.parse().ok()
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn proxy_headers_only_from_trusted_peers() {
        let proxy = ip("10.0.0.1");
        let xff = ProxyHeader::XForwardedFor;
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 10.0.0.1".parse().unwrap());
        let stranger = ip("198.51.100.7");
        assert_eq!(client_ip(stranger, &h, &[proxy], xff), stranger);
        assert_eq!(client_ip(proxy, &h, &[proxy], xff), ip("203.0.113.9"));
        let fwd = ProxyHeader::Forwarded;
        let mut f = HeaderMap::new();
        f.insert(
            "forwarded",
            "for=\"[2001:db8::1]:4711\";proto=https".parse().unwrap(),
        );
        assert_eq!(client_ip(proxy, &f, &[proxy], fwd), ip("2001:db8::1"));
        f.insert("forwarded", "proto=http;For=192.0.2.60:8080".parse().unwrap());
        assert_eq!(client_ip(proxy, &f, &[proxy], fwd), ip("192.0.2.60"));
    }

    /// The client picks its own address only if the proxy trusts its header:
    /// a `Forwarded` line written by the client is not read when the proxy
    /// appends `X-Forwarded-For`, and hops the client wrote left of the
    /// proxy's own are not reached.
    #[test]
    fn only_the_configured_header_and_its_rightmost_untrusted_hop_count() {
        let proxy = ip("10.0.0.1");
        let mut h = HeaderMap::new();
        h.insert("forwarded", "for=1.1.1.1".parse().unwrap());
        h.append("x-forwarded-for", "6.6.6.6".parse().unwrap()); // the client's own line
        h.append("x-forwarded-for", "203.0.113.9".parse().unwrap()); // the proxy's hop
        let got = client_ip(proxy, &h, &[proxy], ProxyHeader::XForwardedFor);
        assert_eq!(got, ip("203.0.113.9"));
        // With Forwarded configured, X-Forwarded-For is the client's writing.
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "6.6.6.6".parse().unwrap());
        h.insert("forwarded", "for=203.0.113.9".parse().unwrap());
        assert_eq!(
            client_ip(proxy, &h, &[proxy], ProxyHeader::Forwarded),
            ip("203.0.113.9")
        );
        // A garbled hop ends the walk at the proxy: nothing left of it counts.
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "6.6.6.6, garbage".parse().unwrap());
        assert_eq!(client_ip(proxy, &h, &[proxy], ProxyHeader::XForwardedFor), proxy);
        // A byte that is not text in the client's hop spoils that hop only.
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            axum::http::HeaderValue::from_bytes(b"9.9.9.9\xff, 5.5.5.5").unwrap(),
        );
        assert_eq!(
            client_ip(proxy, &h, &[proxy], ProxyHeader::XForwardedFor),
            ip("5.5.5.5")
        );
        // Two trusted proxies in a row are both skipped.
        let inner = ip("10.0.0.2");
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "6.6.6.6, 203.0.113.9, 10.0.0.2".parse().unwrap(),
        );
        assert_eq!(
            client_ip(proxy, &h, &[proxy, inner], ProxyHeader::XForwardedFor),
            ip("203.0.113.9")
        );
    }
}
