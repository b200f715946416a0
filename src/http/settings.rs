//! The HTTP edge's settings: listeners and their connections, the request
//! deadline and body limit, and whom to believe about a client's address.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::extract::ProxyHeader;
use crate::server::connections::ConnectionSettings;
use crate::settings::{ip, millis, number, socket_addr, ConfigError, Source};

#[derive(Clone, Debug)]
pub struct HttpSettings {
    pub listen: SocketAddr,
    /// Where `/metrics`, `/health/*` and `/revocations` are served (an
    /// operator's listener, loopback by default); `None`: nowhere.
    pub admin_listen: Option<SocketAddr>,
    pub request_timeout: Duration,
    pub body_limit: usize,
    pub client_address: ClientAddress,
    /// Time limits and the cap for client connections (both listeners).
    pub connections: ConnectionSettings,
    /// An operator's copies of the sign-in pages' templates
    /// (`pages_dir`; docs/oidc.md, "Your own pages").
    pub pages_dir: Option<std::path::PathBuf>,
}

/// How the client's address is found behind proxies.
#[derive(Clone, Debug)]
pub struct ClientAddress {
    pub trusted_proxies: Vec<IpAddr>,
    pub header: ProxyHeader,
}

impl HttpSettings {
    pub fn read(src: &impl Source) -> Result<HttpSettings, ConfigError> {
        Ok(HttpSettings {
            listen: src.get(
                "listen",
                SocketAddr::from(([127, 0, 0, 1], 8080)),
                socket_addr("127.0.0.1:8080"),
            )?,
            admin_listen: src.get(
                "admin_listen",
                Some(SocketAddr::from(([127, 0, 0, 1], 9180))),
                |s| {
                    if s.eq_ignore_ascii_case("off") {
                        return Ok(None);
                    }
                    s.parse()
                        .map(Some)
                        .map_err(|_| format!("expected host:port such as 127.0.0.1:9180, or off, got {s:?}"))
                },
            )?,
            request_timeout: src.get(
                "request_timeout_ms",
                Duration::from_millis(5000),
                millis(10, 600_000),
            )?,
            body_limit: src.get("body_limit_bytes", 16 * 1024, number(256, 16 * 1024 * 1024))?,
            client_address: ClientAddress {
                trusted_proxies: src.list("trusted_proxies", ip)?,
                header: src.get(
                    "trusted_proxy_header",
                    ProxyHeader::XForwardedFor,
                    ProxyHeader::parse,
                )?,
            },
            connections: ConnectionSettings::read(src)?,
            pages_dir: src.get("pages_dir", None, |s| Ok(Some(std::path::PathBuf::from(s))))?,
        })
    }
}
