//! The request path through the gateway:
//!
//! ```text
//! request ─► two Hosts or Authorizations, Host ≠ target's authority? ─► 400
//!            path normal form (`path`)? ──refused──► 400
//!            route found by the normal path's key? ─no─► 404
//!            strip hop-by-hop, Expect, and every identity and forwarding
//!              header in any spelling (`headers`)
//!            limit by ip? ──over──► 429            (before any token work)
//!            auth route: bearer token valid, audience accepted? ─no─► 401
//!              revocations unknown (Redis down, no poll)? ─refuse─► 503
//!            limit by sub / client_id? ──over──► 429
//!            identity headers, forwarding headers, X-Request-Id, Host
//!            the normal path (the one the route was chosen by) upstream
//!            upstream (pooled keep-alive connection), bodies streamed both ways
//!              connect/IO error ─► 502 BAD_GATEWAY
//!              no response headers within the route's timeout ─► 504 GATEWAY_TIMEOUT
//!            response: hop-by-hop headers stripped, X-Request-Id added
//! ```
//!
//! A refused request never reaches the upstream.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri, Version};
use axum::response::Response;

use super::config::{ForwardHeaders, LimitKey, UnknownRevocations};
use super::headers::{ambiguous, request_host, request_id, strip_hop_by_hop, strip_reserved};
use super::path;
use super::routes::{upstream_path_and_query, Route, RouteTable};
use super::{GatewayState, Worker};
use crate::domain::tokens::{bearer_token, Verified};
use crate::http::error::{error_response, invalid_token, rate_limited};
use crate::http::extract::client_ip;
use crate::http::extract::ProxyHeader;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

struct Outcome<'t> {
    response: Response,
    route: Option<&'t Route>,
    upstream: Option<Duration>,
}

impl<'t> Outcome<'t> {
    fn refused(route: Option<&'t Route>, response: Response) -> Self {
        Outcome {
            response,
            route,
            upstream: None,
        }
    }
}

/// Keeps the in-flight gauge right even when the client goes away mid-request.
struct InFlight<'a>(&'a metrics::Gauge);

impl<'a> InFlight<'a> {
    fn enter(g: &'a metrics::Gauge) -> Self {
        g.increment(1.0);
        InFlight(g)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Every request that is not one of the gateway's own endpoints.
pub async fn handle(
    State(w): State<Arc<Worker>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let start = Instant::now();
    let st = &w.gw;
    let table = st.table();
    let _in_flight = InFlight::enter(&table.in_flight);
    let id = request_id(req.headers());
    let method = req.method().clone();
    let uri = req.uri().clone();
    let Outcome {
        mut response,
        route,
        upstream,
    } = forward(st, &w, &table, peer.ip(), req, &id).await;
    response.headers_mut().insert(X_REQUEST_ID, id.clone());
    let elapsed = start.elapsed();
    let status = response.status().as_u16();
    let metrics = route.map_or(&table.unmatched, |r| &r.metrics);
    metrics.duration.record(elapsed.as_secs_f64());
    metrics.count(status);
    tracing::info!(
        target: "latchkey::gateway::access",
        request_id = id.to_str().unwrap_or(""),
        route = route.map_or("unmatched", |r| r.name),
        method = %method,
        path = uri.path(),
        status,
        latency_ms = elapsed.as_secs_f64() * 1000.0,
        upstream_ms = upstream.map(|d| d.as_secs_f64() * 1000.0),
        "request"
    );
    response
}

async fn forward<'t>(
    st: &GatewayState,
    w: &Worker,
    table: &'t RouteTable,
    peer: IpAddr,
    req: Request,
    id: &HeaderValue,
) -> Outcome<'t> {
    let limiter = w.limiter();
    let (mut parts, body) = req.into_parts();
    let bad_request = |message: &str| error_response(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message);
    if let Some(why) = ambiguous(&parts.headers) {
        return Outcome::refused(None, bad_request(why));
    }
    let normal = match path::normalise(parts.uri.path()) {
        Ok(n) => n,
        Err(why) => return Outcome::refused(None, bad_request(why.message())),
    };
    let host = match request_host(&parts.uri, &parts.headers, parts.version) {
        Ok(h) => h,
        Err(why) => return Outcome::refused(None, bad_request(why)),
    };
    if normal.non_ascii && table.any_case_insensitive {
        return Outcome::refused(
            None,
            bad_request("path: characters beyond ASCII are not allowed where routes ignore case"),
        );
    }
    let Some(route) = table.find(host.as_ref().map(|h| h.host.as_str()), normal.key()) else {
        return Outcome::refused(
            None,
            error_response(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                "no route for this host and path",
            ),
        );
    };
    let rc = &route.config;
    let client_addr = client_ip(
        peer,
        &parts.headers,
        &table.trusted_proxies,
        ProxyHeader::XForwardedFor,
    );
    let from_proxy = Forwarded::from_trusted(&parts.headers, peer, &table.trusted_proxies);
    // The host the request was routed by, as the gateway parsed it: the
    // upstream sees this, never the client's spelling.
    let forwarded_host = host.and_then(|h| HeaderValue::from_str(&h.to_string()).ok());
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    headers.remove(header::EXPECT); // answered by our server already
    strip_reserved(headers, &table.identity.all());

    // Limits by address come first: a flood of forged tokens costs no signature check.
    let limit = rc.rate_limit.as_ref().zip(route.limit_metrics.as_ref());
    if let Some((rl, m)) = limit.filter(|(rl, _)| rl.key == LimitKey::Ip) {
        if let Err(l) = limiter
            .check_policy(
                route.policy_name,
                rl.policy,
                m,
                limiter.ip_key(client_addr).as_str(),
            )
            .await
        {
            route.metrics.rate_limited.increment(1);
            return Outcome::refused(Some(route), rate_limited(&l));
        }
    }
    let verified = if rc.auth {
        if table.when_revocations_unknown == UnknownRevocations::Refuse && !st.revocations.is_current() {
            metrics::counter!("latchkey_gateway_auth_failures_total", "route" => route.name, "reason" => "revocations_unknown")
                .increment(1);
            let r = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                "sessions cannot be checked right now; retry shortly",
            );
            let mut r = r;
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Outcome::refused(Some(route), r);
        }
        match authenticate(st, route, headers).await {
            Ok(v) => Some(v),
            Err(reason) => {
                metrics::counter!("latchkey_gateway_auth_failures_total", "route" => route.name, "reason" => reason)
                    .increment(1);
                return Outcome::refused(Some(route), invalid_token());
            }
        }
    } else {
        None
    };
    if let (Some((rl, m)), Some(v)) = (limit, &verified) {
        let key = match rl.key {
            LimitKey::Subject => Some(v.claims.sub.as_str()),
            LimitKey::ClientId => Some(v.claims.client_id.as_str()),
            LimitKey::Ip => None,
        };
        if let Some(key) = key {
            if let Err(l) = limiter.check_policy(route.policy_name, rl.policy, m, key).await {
                route.metrics.rate_limited.increment(1);
                return Outcome::refused(Some(route), rate_limited(&l));
            }
        }
    }

    if let Some(v) = &verified {
        let c = &v.claims;
        let id_headers = &table.identity;
        for (name, value) in [
            (&id_headers.subject, &c.sub),
            (&id_headers.email, &c.email),
            (&id_headers.session, &c.sid),
            (&id_headers.client_id, &c.client_id),
        ] {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(name.clone(), v);
            }
        }
    }
    if !rc.forward_authorization {
        headers.remove(header::AUTHORIZATION);
    }
    from_proxy.write(headers, &table.forward, peer, client_addr, forwarded_host.clone());
    headers.insert(X_REQUEST_ID, id.clone());
    headers.remove(header::HOST);
    if let (Some(h), true) = (&forwarded_host, rc.preserve_host) {
        headers.insert(header::HOST, h.clone());
    }

    let target = upstream_path_and_query(rc, &normal.path, parts.uri.query());
    let uri = match Uri::try_from(format!("{}{target}", rc.upstream_origin)) {
        Ok(u) => u,
        Err(_) => {
            return Outcome::refused(
                Some(route),
                error_response(
                    StatusCode::BAD_REQUEST,
                    "INVALID_REQUEST",
                    "path: not a valid request target",
                ),
            )
        }
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    let upstream_req = Request::from_parts(parts, body);

    let sent = Instant::now();
    let result = tokio::time::timeout(rc.timeout, w.client.request(upstream_req)).await;
    let took = sent.elapsed();
    route.metrics.upstream.record(took.as_secs_f64());
    let response = match result {
        Ok(Ok(resp)) => {
            let (mut p, body) = resp.into_parts();
            // Our answer is ours: an HTTP/1.0 upstream does not make it 1.0.
            p.version = Version::HTTP_11;
            strip_hop_by_hop(&mut p.headers);
            Response::from_parts(p, Body::new(body))
        }
        Ok(Err(e)) => {
            let kind = if e.is_connect() { "connect" } else { "io" };
            metrics::counter!("latchkey_gateway_upstream_errors_total", "route" => route.name, "kind" => kind)
                .increment(1);
            tracing::warn!(route = route.name, upstream = %rc.upstream_origin, error = %error_chain(&e),
                "upstream request failed");
            error_response(
                StatusCode::BAD_GATEWAY,
                "BAD_GATEWAY",
                "the upstream service could not be reached or broke the connection",
            )
        }
        Err(_) => {
            metrics::counter!("latchkey_gateway_upstream_errors_total", "route" => route.name, "kind" => "timeout")
                .increment(1);
            tracing::warn!(route = route.name, upstream = %rc.upstream_origin, timeout_ms = rc.timeout.as_millis() as u64,
                "upstream did not answer in time");
            error_response(
                StatusCode::GATEWAY_TIMEOUT,
                "GATEWAY_TIMEOUT",
                "the upstream service did not answer in time",
            )
        }
    };
    Outcome {
        response,
        route: Some(route),
        upstream: Some(took),
    }
}

/// The verified token of an authenticated route, or why not (a metric label).
async fn authenticate(
    st: &GatewayState,
    route: &Route,
    headers: &HeaderMap,
) -> Result<Arc<Verified>, &'static str> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or("missing")?;
    let v = st.tokens.validate(token).await.map_err(|r| r.as_str())?;
    if !route.config.audiences.contains(&v.claims.aud) {
        return Err("audience");
    }
    Ok(v)
}

/// What a trusted proxy in front of the gateway said about the request
/// (read before the client's forwarding headers are stripped); nothing for
/// any other peer, whose claims are the client's own writing.
#[derive(Default)]
struct Forwarded {
    chain: Option<String>,
    proto: Option<HeaderValue>,
}

impl Forwarded {
    fn from_trusted(headers: &HeaderMap, peer: IpAddr, trusted: &[IpAddr]) -> Forwarded {
        if !trusted.contains(&peer) {
            return Forwarded::default();
        }
        let chain = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ");
        Forwarded {
            chain: (!chain.is_empty()).then_some(chain),
            proto: headers.get(&X_FORWARDED_PROTO).cloned(),
        }
    }

    /// Sets the forwarding headers `which` asks for (the client's are gone):
    /// `X-Forwarded-For` is the trusted chain then the peer, `X-Real-IP` and
    /// `Forwarded` name the client, `X-Forwarded-Host` the host the request
    /// was routed by, `X-Forwarded-Proto` the trusted proxy's or `http`.
    fn write(
        self,
        headers: &mut HeaderMap,
        which: &ForwardHeaders,
        peer: IpAddr,
        client: IpAddr,
        host: Option<HeaderValue>,
    ) {
        let proto = self.proto.unwrap_or(HeaderValue::from_static("http"));
        let mut set = |name: HeaderName, value: String| {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        };
        if which.x_forwarded_for {
            let chain = match self.chain {
                Some(c) => format!("{c}, {peer}"),
                None => peer.to_string(),
            };
            set(X_FORWARDED_FOR, chain);
        }
        if which.x_real_ip {
            set(X_REAL_IP, client.to_string());
        }
        if which.forwarded {
            let node = match client {
                IpAddr::V4(a) => a.to_string(),
                IpAddr::V6(a) => format!("\"[{a}]\""),
            };
            let p = proto.to_str().unwrap_or("http");
            let fwd = match host.as_ref().and_then(|h| h.to_str().ok()) {
                Some(h) => format!("for={node};host=\"{h}\";proto={p}"),
                None => format!("for={node};proto={p}"),
            };
            set(header::FORWARDED, fwd);
        }
        if let (true, Some(h)) = (which.x_forwarded_host, host) {
            headers.insert(X_FORWARDED_HOST, h);
        }
        if which.x_forwarded_proto {
            headers.insert(X_FORWARDED_PROTO, proto);
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_trusts_only_trusted_peers() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let stranger: IpAddr = "198.51.100.7".parse().unwrap();
        let client: IpAddr = "203.0.113.5".parse().unwrap();
        let spoofed = || {
            let mut h = HeaderMap::new();
            h.insert(X_FORWARDED_FOR, HeaderValue::from_static("1.2.3.4"));
            h.insert(header::FORWARDED, HeaderValue::from_static("for=1.2.3.4"));
            h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
            h.insert(X_REAL_IP, HeaderValue::from_static("1.2.3.4"));
            h
        };
        let through = |peer: IpAddr, which: ForwardHeaders| {
            let mut h = spoofed();
            let prior = Forwarded::from_trusted(&h, peer, &[proxy]);
            crate::gateway::headers::strip_reserved(&mut h, &[]);
            prior.write(
                &mut h,
                &which,
                peer,
                client,
                Some(HeaderValue::from_static("shop.example")),
            );
            h
        };
        let h = through(stranger, ForwardHeaders::default());
        assert_eq!(h[&X_FORWARDED_FOR], "198.51.100.7");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        assert_eq!(h[&X_FORWARDED_HOST], "shop.example");
        assert!(h.get(header::FORWARDED).is_none());
        assert!(h.get(&X_REAL_IP).is_none());
        let h = through(proxy, ForwardHeaders::default());
        assert_eq!(h[&X_FORWARDED_FOR], "1.2.3.4, 10.0.0.1");
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
        let all = ForwardHeaders {
            x_real_ip: true,
            forwarded: true,
            ..ForwardHeaders::default()
        };
        let h = through(stranger, all);
        assert_eq!(h[&X_REAL_IP], "203.0.113.5");
        assert_eq!(
            h[header::FORWARDED],
            "for=203.0.113.5;host=\"shop.example\";proto=http"
        );
    }
}
