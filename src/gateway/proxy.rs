//! The request path through the gateway:
//!
//! ```text
//! request ─► two Hosts or Authorizations, Host ≠ target's authority? ─► 400
//!            Transfer-Encoding other than exactly chunked (`body`)? ─► 400
//!            path normal form (`path`)? ──refused──► 400
//!            route found by the normal path's key? ─no─► 404
//!            strip hop-by-hop, Expect, and every identity, forwarding and
//!              upstream meta-data header in any spelling (`headers`)
//!            limit by ip? ──over──► 429            (before any token work)
//!            auth route: bearer token valid, audience accepted? ─no─► 401
//!              revocations unknown (Redis down, no poll)? ─refuse─► 503
//!            limit by sub / client_id? ──over──► 429
//!            identity headers, forwarding headers, X-Request-Id, Host
//!            the normal path (the one the route was chosen by) upstream
//!            a body without a length read ahead (`body`); malformed? ─► 400
//!            upstream (pooled keep-alive connection), bodies streamed both ways
//!              this thread's share of upstream.max_requests open ─► 503 OVERLOADED
//!              connect/IO error ─► 502 BAD_GATEWAY
//!              no response headers within the route's timeout ─► 504 GATEWAY_TIMEOUT
//!            response: hop-by-hop headers stripped, X-Request-Id added
//! ```
//!
//! In code: [`admit`] (form, route, limits, token) then [`rewrite`] (the
//! headers and target the upstream sees) then [`send`]; every refusal is a
//! [`Refusal`], mapped to its answer in one place. A refused request never
//! reaches the upstream.

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
use super::routes::{upstream_path_and_query, Route, RouteTable};
use super::state::GatewayState;
use super::worker::{UpstreamSlot, Worker};
use super::{body, path};
use crate::domain::tokens::{bearer_token, Verified};
use crate::server::answers::{error_response, invalid_token, rate_limited};
use crate::server::client_address::{client_ip, ProxyHeader};

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

/// Why the gateway answers a request itself: every refusal, mapped to its
/// answer (and counted) in one place, [`Refusal::into_response`].
enum Refusal {
    /// 400: the request is ambiguous or its path, target or body is refused.
    BadRequest(&'static str),
    /// 408: a body without a length did not arrive within the route's timeout.
    BodyTimeout,
    /// 404: no route for this host and path.
    NoRoute,
    /// 429: a route's limit.
    RateLimited(crate::limits::Limited),
    /// 503: sessions cannot be checked (revocations unknown, "refuse").
    RevocationsUnknown,
    /// 401: the bearer token, with the reason counted.
    InvalidToken(&'static str),
    /// 401: a valid token of a session without a second factor, on a route
    /// that requires one (RFC 9470).
    SecondFactorRequired,
    /// 502: the upstream could not be reached or broke the connection.
    UpstreamFailed(&'static str),
    /// 504: no response headers within the route's timeout.
    UpstreamTimeout,
    /// 503: as many upstream requests open as this thread may have.
    UpstreamBusy,
}

impl Refusal {
    fn into_response(self, route: Option<&Route>) -> Response {
        let name = route.map_or("unmatched", |r| r.name);
        let auth_failure = |reason: &'static str| {
            metrics::counter!("latchkey_gateway_auth_failures_total", "route" => name, "reason" => reason)
                .increment(1)
        };
        let upstream_error = |kind: &'static str| {
            metrics::counter!("latchkey_gateway_upstream_errors_total", "route" => name, "kind" => kind)
                .increment(1)
        };
        // 503 with `Retry-After: 1`: the gateway itself cannot serve it now.
        let retry_shortly = |code: &'static str, message: &'static str| {
            let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, code, message);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        };
        match self {
            Refusal::BadRequest(why) => error_response(StatusCode::BAD_REQUEST, "INVALID_REQUEST", why),
            Refusal::BodyTimeout => {
                error_response(StatusCode::REQUEST_TIMEOUT, "REQUEST_TIMEOUT", body::TOO_SLOW)
            }
            Refusal::NoRoute => error_response(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                "no route for this host and path",
            ),
            Refusal::RateLimited(l) => {
                if let Some(r) = route {
                    r.metrics.rate_limited.increment(1);
                }
                rate_limited(&l)
            }
            Refusal::RevocationsUnknown => {
                auth_failure("revocations_unknown");
                retry_shortly(
                    "UNAVAILABLE",
                    "sessions cannot be checked right now; retry shortly",
                )
            }
            Refusal::InvalidToken(reason) => {
                auth_failure(reason);
                invalid_token()
            }
            Refusal::SecondFactorRequired => {
                auth_failure("mfa_required");
                let mut r = error_response(
                    StatusCode::UNAUTHORIZED,
                    "INSUFFICIENT_USER_AUTHENTICATION",
                    "this route needs a login with a second factor",
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer error=\"insufficient_user_authentication\", \
                         error_description=\"a second factor is required\", acr_values=\"2\"",
                    ),
                );
                r
            }
            Refusal::UpstreamFailed(kind) => {
                upstream_error(kind);
                error_response(
                    StatusCode::BAD_GATEWAY,
                    "BAD_GATEWAY",
                    "the upstream service could not be reached or broke the connection",
                )
            }
            Refusal::UpstreamBusy => {
                upstream_error("busy");
                retry_shortly(
                    "OVERLOADED",
                    "too many requests are open to the upstream services; retry shortly",
                )
            }
            Refusal::UpstreamTimeout => {
                upstream_error("timeout");
                error_response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "GATEWAY_TIMEOUT",
                    "the upstream service did not answer in time",
                )
            }
        }
    }
}

/// A request the gateway has decided to forward: its route, the path it
/// was routed by, and who sent it.
struct Admitted<'t, 'r> {
    route: &'t Route,
    normal: path::Normal<'r>,
    /// The host the request was routed by, as the gateway parsed it: the
    /// upstream sees this, never the client's spelling.
    host: Option<HeaderValue>,
    client_addr: IpAddr,
    from_proxy: Forwarded,
    verified: Option<Arc<Verified>>,
}

async fn forward<'t>(
    st: &GatewayState,
    w: &Worker,
    table: &'t RouteTable,
    peer: IpAddr,
    req: Request,
    id: &HeaderValue,
) -> Outcome<'t> {
    let (mut parts, body) = req.into_parts();
    // The client's target, taken out while `parts` becomes the upstream's
    // request (`rewrite` sets the upstream's).
    let uri = std::mem::take(&mut parts.uri);
    let admitted = match admit(st, w, table, peer, &mut parts.headers, &uri, parts.version).await {
        Ok(a) => a,
        Err((route, why)) => return Outcome::refused(route, why.into_response(route)),
    };
    let route = admitted.route;
    if let Err(why) = rewrite(table, peer, admitted, uri.query(), &mut parts, id) {
        return Outcome::refused(Some(route), why.into_response(Some(route)));
    }
    // The slot first: a body still arriving holds one, read ahead or sent.
    let Some(slot) = w.upstream.take() else {
        return Outcome::refused(Some(route), Refusal::UpstreamBusy.into_response(Some(route)));
    };
    let prepared = tokio::time::timeout(
        route.config.timeout,
        body::prepare(body, &mut parts.headers, table.read_ahead),
    )
    .await;
    let refuse = |why: Refusal| Outcome::refused(Some(route), why.into_response(Some(route)));
    let (body, fault) = match prepared {
        Ok(Ok(prepared)) => prepared,
        Ok(Err(why)) => return refuse(Refusal::BadRequest(why)),
        Err(_) => return refuse(Refusal::BodyTimeout),
    };
    let (response, took) = send(w, route, Request::from_parts(parts, body), &fault, slot).await;
    Outcome {
        response: response.unwrap_or_else(|why| why.into_response(Some(route))),
        route: Some(route),
        upstream: Some(took),
    }
}

/// Decides whether the request goes upstream, and by which route: the
/// request's form, its route, the limits and the token. The client's
/// address and forwarding chain are read first; then every header the
/// client may not write is removed, before the token is read.
async fn admit<'t, 'r>(
    st: &GatewayState,
    w: &Worker,
    table: &'t RouteTable,
    peer: IpAddr,
    headers: &mut HeaderMap,
    uri: &'r Uri,
    version: Version,
) -> Result<Admitted<'t, 'r>, (Option<&'t Route>, Refusal)> {
    let refuse = |why| (None, Refusal::BadRequest(why));
    if let Some(why) = ambiguous(headers) {
        return Err(refuse(why));
    }
    body::check_transfer_coding(headers).map_err(refuse)?;
    let normal = path::normalise(uri.path()).map_err(|why| refuse(why.message()))?;
    let host = request_host(uri, headers, version).map_err(refuse)?;
    let route = table
        .find(host.as_ref().map(|h| h.host.as_str()), normal.key())
        .ok_or((None, Refusal::NoRoute))?;
    let refuse = |why| (Some(route), why);
    let rc = &route.config;
    let client_addr = client_ip(peer, headers, &table.trusted_proxies, ProxyHeader::XForwardedFor);
    let from_proxy = Forwarded::from_trusted(headers, peer, &table.trusted_proxies);
    strip_hop_by_hop(headers);
    headers.remove(header::EXPECT); // answered by our server already
                                    // A proxy's assertions only from a trusted proxy, and only those the route names.
    let allowed: &[HeaderName] = if table.trusted_proxies.contains(&peer) {
        &rc.allow_client_headers
    } else {
        &[]
    };
    strip_reserved(headers, &table.identity.all(), allowed);
    let limiter = w.limiter();
    // Limits by address come first: a flood of forged tokens costs no signature check.
    let limit = rc.rate_limit.as_ref().zip(route.limit_metrics.as_ref());
    if let Some((rl, m)) = limit.filter(|(rl, _)| rl.key == LimitKey::Ip) {
        let key = limiter.ip_key(client_addr);
        limiter
            .check_policy(route.policy_name, rl.policy, m, key.as_str())
            .await
            .map_err(|l| refuse(Refusal::RateLimited(l)))?;
    }
    let verified = if rc.auth {
        if table.when_revocations_unknown == UnknownRevocations::Refuse && !st.revocations.is_current() {
            return Err(refuse(Refusal::RevocationsUnknown));
        }
        let v = authenticate(st, route, headers)
            .await
            .map_err(|reason| refuse(Refusal::InvalidToken(reason)))?;
        if rc.require_mfa && !v.claims.is_mfa() {
            return Err(refuse(Refusal::SecondFactorRequired));
        }
        Some(v)
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
            limiter
                .check_policy(route.policy_name, rl.policy, m, key)
                .await
                .map_err(|l| refuse(Refusal::RateLimited(l)))?;
        }
    }
    Ok(Admitted {
        route,
        from_proxy,
        host: host.and_then(|h| HeaderValue::from_str(&h.to_string()).ok()),
        normal,
        client_addr,
        verified,
    })
}

/// The request as the upstream sees it: the identity and forwarding
/// headers set, the normal path on the upstream's origin.
fn rewrite(
    table: &RouteTable,
    peer: IpAddr,
    a: Admitted<'_, '_>,
    query: Option<&str>,
    parts: &mut axum::http::request::Parts,
    id: &HeaderValue,
) -> Result<(), Refusal> {
    let rc = &a.route.config;
    let headers = &mut parts.headers;
    if let Some(v) = &a.verified {
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
    a.from_proxy
        .write(headers, &table.forward, peer, a.client_addr, a.host.clone());
    headers.insert(X_REQUEST_ID, id.clone());
    headers.remove(header::HOST);
    if let (Some(h), true) = (&a.host, rc.preserve_host) {
        headers.insert(header::HOST, h.clone());
    }
    let target = upstream_path_and_query(rc, &a.normal.path, query);
    parts.uri = Uri::try_from(format!("{}{target}", rc.upstream_origin))
        .map_err(|_| Refusal::BadRequest("path: not a valid request target"))?;
    parts.version = Version::HTTP_11;
    Ok(())
}

/// The upstream exchange over this thread's pool, within the route's
/// timeout; the response's hop-by-hop headers removed.
async fn send(
    w: &Worker,
    route: &Route,
    req: Request,
    fault: &body::ClientFault,
    slot: Arc<UpstreamSlot>,
) -> (Result<Response, Refusal>, Duration) {
    let rc = &route.config;
    // A request body still to come holds the slot too: an upstream may
    // answer early and go on reading it.
    let req = if hyper::body::Body::is_end_stream(req.body()) {
        req
    } else {
        let slot = slot.clone();
        req.map(|body| Body::new(SlotHeld { body, _slot: slot }))
    };
    let sent = Instant::now();
    let result = tokio::time::timeout(rc.timeout, w.client.request(req)).await;
    let took = sent.elapsed();
    route.metrics.upstream.record(took.as_secs_f64());
    let response = match result {
        Ok(Ok(resp)) => {
            let (mut p, body) = resp.into_parts();
            // Our answer is ours: an HTTP/1.0 upstream does not make it 1.0.
            p.version = Version::HTTP_11;
            strip_hop_by_hop(&mut p.headers);
            Ok(Response::from_parts(p, Body::new(SlotHeld { body, _slot: slot })))
        }
        // The client's body broke off mid-way (framing past the read-ahead):
        // the upstream got no complete request, the client its 400.
        Ok(Err(_)) if fault.happened() => Err(Refusal::BadRequest(body::MALFORMED)),
        Ok(Err(e)) => {
            tracing::warn!(route = route.name, upstream = %rc.upstream_origin, error = %error_chain(&e),
                "upstream request failed");
            Err(Refusal::UpstreamFailed(if e.is_connect() {
                "connect"
            } else {
                "io"
            }))
        }
        Err(_) => {
            tracing::warn!(route = route.name, upstream = %rc.upstream_origin, timeout_ms = rc.timeout.as_millis() as u64,
                "upstream did not answer in time");
            Err(Refusal::UpstreamTimeout)
        }
    };
    (response, took)
}

pin_project_lite::pin_project! {
    /// A body of an upstream exchange (the answer, or the request's while
    /// it is sent), holding the exchange's slot until it is dropped (sent
    /// to its end, or its client gone).
    struct SlotHeld<B> {
        #[pin]
        body: B,
        _slot: Arc<UpstreamSlot>,
    }
}

impl<B: hyper::body::Body> hyper::body::Body for SlotHeld<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
            crate::gateway::headers::strip_reserved(&mut h, &[], &[]);
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
