//! Where a client may be sent back to: the redirect URIs it registered,
//! matched as strings (RFC 9700 §4.1.3: no prefix, no pattern, no
//! normalisation), with the one exception of native apps' loopback
//! addresses, where the port is the app's to choose at the time of the
//! request (RFC 8252 §7.3).
//!
//! ```text
//!   registered                      presented                          match
//!   https://app.example/cb          https://app.example/cb              yes
//!   https://app.example/cb          https://app.example/cb/x, ?x, /CB   no
//!   http://127.0.0.1/cb             http://127.0.0.1:51234/cb           yes (loopback: any port)
//!   http://localhost/cb             http://localhost:51234/cb           no  (a name, not an address)
//!   com.example.app:/cb             com.example.app:/cb                 yes (private-use scheme)
//! ```

/// Whether `uri` may be registered: an absolute URI without a fragment or
/// credentials, over `https`, over `http` on a loopback host (development
/// and native apps), or with a private-use scheme (a reversed domain name,
/// RFC 8252 §7.1).
pub fn check_registered(uri: &str) -> Result<(), String> {
    if uri.len() > 2048 {
        return Err("at most 2048 characters".into());
    }
    let u = url::Url::parse(uri).map_err(|e| format!("not an absolute URI: {e}"))?;
    if u.fragment().is_some() || uri.contains('#') {
        return Err("no fragment (RFC 6749 §3.1.2)".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("no user or password in it".into());
    }
    match u.scheme() {
        "https" if u.host().is_some() => Ok(()),
        "http" if is_loopback(&u) => Ok(()),
        "http" => Err("http only on a loopback host (127.0.0.1, [::1], localhost); else https".into()),
        s if s.contains('.') => Ok(()),
        _ => Err("https, http on a loopback host, or a private-use scheme such as com.example.app:".into()),
    }
}

fn is_loopback(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Whether `presented` is one of the `registered` URIs.
pub fn matches(registered: &[String], presented: &str) -> bool {
    let loopback = without_loopback_port(presented);
    registered
        .iter()
        .any(|r| r == presented || (loopback.is_some() && without_loopback_port(r) == loopback))
}

/// A URI on a loopback IP address (`http://127.0.0.1` or `http://[::1]`)
/// without its port, compared as text: what follows the port must be the
/// path, the query or nothing (so that `http://127.0.0.1:80@evil.example/`
/// and `http://127.0.0.1.evil.example/` are not taken for one).
fn without_loopback_port(uri: &str) -> Option<String> {
    for host in ["http://127.0.0.1", "http://[::1]"] {
        let Some(rest) = uri.strip_prefix(host) else {
            continue;
        };
        let rest = match rest.strip_prefix(':') {
            Some(port) => {
                let digits = port.bytes().take_while(u8::is_ascii_digit).count();
                if digits == 0 || digits > 5 {
                    return None;
                }
                &port[digits..]
            }
            None => rest,
        };
        if !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('?')) {
            return None;
        }
        return Some(format!("{host}{rest}"));
    }
    None
}

/// Whether a code sent to `uri` could land in any program of the user's
/// machine: a loopback address (any local process can listen on a port) or
/// a private-use scheme (any app can claim it). A public client's requests
/// to such a URI are never approved without the user (RFC 8252 §8.6).
pub fn reaches_any_local_program(uri: &str) -> bool {
    match url::Url::parse(uri) {
        Ok(u) => match u.scheme() {
            "https" => false,
            "http" => is_loopback(&u),
            _ => true,
        },
        Err(_) => true,
    }
}

/// `uri` with `params` added to its query (the authorization response,
/// RFC 6749 §4.1.2: a query it already has is kept).
pub fn with_params(uri: &str, params: &[(&str, &str)]) -> String {
    match url::Url::parse(uri) {
        Ok(mut u) => {
            {
                let mut q = u.query_pairs_mut();
                for (k, v) in params {
                    q.append_pair(k, v);
                }
            }
            u.to_string()
        }
        // Registered URIs parse; this is never reached with one.
        Err(_) => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_private_use_uris_reach_any_local_program_and_https_ones_do_not() {
        for uri in [
            "http://127.0.0.1:5000/cb",
            "http://[::1]/cb",
            "http://localhost/cb",
            "com.example.app:/cb",
        ] {
            assert!(reaches_any_local_program(uri), "{uri}");
        }
        assert!(!reaches_any_local_program("https://app.example.com/cb"));
    }

    fn reg(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_registered_uri_matches_only_itself() {
        let r = reg(&["https://app.example.com/cb"]);
        assert!(matches(&r, "https://app.example.com/cb"));
        for other in [
            "https://app.example.com/cb/",
            "https://app.example.com/cb/more",
            "https://app.example.com/cbx",
            "https://app.example.com/c",
            "https://app.example.com/cb?x=1",
            "https://app.example.com/cb#x",
            "https://app.example.com/CB",
            "https://APP.example.com/cb",
            "https://app.example.com:443/cb",
            "https://app.example.com:8443/cb",
            "http://app.example.com/cb",
            "https://evil@app.example.com/cb",
            "https://app.example.com@evil.example/cb",
            "https://app.example.com/x/../cb",
            "https://app.example.com/cb/../cb",
            "https://app.example.com.evil.example/cb",
            "https://app.example.com%2F@evil.example/cb",
            "",
        ] {
            assert!(!matches(&r, other), "{other}");
        }
    }

    #[test]
    fn a_loopback_address_matches_on_any_port_and_nothing_else() {
        let r = reg(&["http://127.0.0.1/cb", "http://[::1]:8080/cb?app=1"]);
        assert!(matches(&r, "http://127.0.0.1/cb"));
        assert!(matches(&r, "http://127.0.0.1:51234/cb"));
        assert!(matches(&r, "http://[::1]/cb?app=1"));
        assert!(matches(&r, "http://[::1]:1/cb?app=1"));
        for other in [
            "http://127.0.0.1:51234/cb/x",
            "http://127.0.0.1:51234/other",
            "http://127.0.0.1:/cb",
            "http://127.0.0.1:123456/cb",
            "http://127.0.0.1:80@evil.example/cb",
            "http://127.0.0.1.evil.example/cb",
            "https://127.0.0.1:51234/cb",
            "http://127.0.0.2:51234/cb",
            "http://[::1]:1/cb",
            "http://localhost:51234/cb",
        ] {
            assert!(!matches(&r, other), "{other}");
        }
        // A name is not an address: localhost matches as any URI does.
        let named = reg(&["http://localhost:3000/cb"]);
        assert!(matches(&named, "http://localhost:3000/cb"));
        assert!(!matches(&named, "http://localhost:3001/cb"));
    }

    #[test]
    fn a_private_use_scheme_matches_exactly() {
        let r = reg(&["com.example.app:/oauth2redirect"]);
        assert!(matches(&r, "com.example.app:/oauth2redirect"));
        assert!(!matches(&r, "com.example.app:/oauth2redirect/x"));
        assert!(!matches(&r, "com.example.apps:/oauth2redirect"));
    }

    #[test]
    fn only_safe_uris_can_be_registered() {
        for ok in [
            "https://app.example.com/cb",
            "https://app.example.com/cb?tenant=1",
            "http://127.0.0.1/cb",
            "http://[::1]:8080/cb",
            "http://localhost:3000/cb",
            "com.example.app:/oauth2redirect",
        ] {
            assert_eq!(check_registered(ok), Ok(()), "{ok}");
        }
        for bad in [
            "/cb",
            "app.example.com/cb",
            "https://app.example.com/cb#frag",
            "https://user:pw@app.example.com/cb",
            "http://app.example.com/cb",
            "http://10.0.0.1/cb",
            "javascript:alert(1)",
            "data:text/html,x",
            "file:///etc/passwd",
            "myapp:/cb",
        ] {
            assert!(check_registered(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_response_keeps_the_query_the_client_registered() {
        assert_eq!(
            with_params(
                "https://app.example.com/cb?tenant=1",
                &[("code", "a b"), ("state", "s")]
            ),
            "https://app.example.com/cb?tenant=1&code=a+b&state=s"
        );
        assert_eq!(
            with_params("com.example.app:/cb", &[("code", "c")]),
            "com.example.app:/cb?code=c"
        );
    }
}
