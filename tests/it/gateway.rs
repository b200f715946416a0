//! Gateway mode: a real latchkey (token issuer and JWKS), a real upstream
//! HTTP server started here (it echoes what it received and counts hits),
//! and the gateway between a client and it. On the embedded backend the
//! gateway limits in process; on PostgreSQL + Redis it limits in Redis and
//! learns revocations by pub/sub, under the service's key prefix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http_body_util::BodyExt;
use latchkey::gateway::{Gateway, GatewayConfig, GatewayState};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common::{free_port, unique_email, TestApp, PASSWORD};

crate::on_every_backend!(
    a_valid_token_reaches_the_upstream_with_the_identity,
    forged_missing_and_foreign_tokens_never_reach_the_upstream,
    identity_and_hop_by_hop_headers_from_the_client_are_stripped,
    limits_answer_429_with_ratelimit_headers,
    a_down_upstream_is_502_and_a_slow_one_504,
    bodies_stream_both_ways,
    health_metrics_and_reload,
    a_key_rotated_at_the_service_is_fetched_on_its_first_token,
    a_route_that_requires_a_second_factor_refuses_single_factor_sessions,
);

/// The upstream: echoes method, path, query, headers and body length as
/// JSON; `/slow` answers after 3 s; `/stream` sends two chunks 400 ms apart.
struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

async fn echo(State(hits): State<Arc<AtomicUsize>>, req: Request) -> Response {
    hits.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    match parts.uri.path() {
        "/api/slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "slow".into_response()
        }
        "/api/stream" => {
            let chunks = futures_util::stream::unfold(0u8, |i| async move {
                match i {
                    0 => Some((Ok::<_, std::io::Error>(Bytes::from_static(b"first\n")), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        Some((Ok(Bytes::from_static(b"second\n")), 2))
                    }
                    _ => None,
                }
            });
            Body::from_stream(chunks).into_response()
        }
        _ => {
            let len = body.collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
            let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in &parts.headers {
                headers
                    .entry(k.as_str().to_string())
                    .or_default()
                    .push(String::from_utf8_lossy(v.as_bytes()).into_owned());
            }
            axum::Json(json!({
                "method": parts.method.as_str(),
                "path": parts.uri.path(),
                "query": parts.uri.query(),
                "headers": headers,
                "body_len": len,
            }))
            .into_response()
        }
    }
}

impl Upstream {
    async fn start() -> Upstream {
        let hits = Arc::new(AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(echo).with_state(hits.clone());
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Upstream {
            addr,
            hits,
            _stop: tx,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

struct TestGateway {
    base: String,
    state: Arc<GatewayState>,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl TestGateway {
    async fn start(toml: &str) -> TestGateway {
        let config = GatewayConfig::from_toml(toml).expect("the test configuration is valid");
        let gw = Gateway::build(config).await.expect("the gateway starts");
        let base = format!("http://{}", gw.local_addr());
        let state = gw.state().clone();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            gw.run_until(async move {
                let _ = rx.await;
            })
            .await
            .expect("the gateway runs");
        });
        TestGateway {
            base,
            state,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            stop: Some(tx),
            handle: Some(handle),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut r = self.http.get(self.url(path));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send().await.unwrap()
    }

    /// Polls `path` until it answers `want` (within `within`); answers in
    /// between must be among `meanwhile` (any, when it is empty).
    async fn until_status(
        &self,
        path: &str,
        token: Option<&str>,
        want: u16,
        meanwhile: &[u16],
        within: Duration,
    ) -> reqwest::Response {
        let start = Instant::now();
        loop {
            let r = self.get(path, token).await;
            let status = r.status().as_u16();
            if status == want {
                return r;
            }
            assert!(
                meanwhile.is_empty() || meanwhile.contains(&status),
                "{path} answered {status} while waiting for {want}"
            );
            assert!(
                start.elapsed() < within,
                "{path} still answers {status}, not {want}, after {:?}",
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), h).await;
        }
    }
}

/// The service's Redis and key prefix (PostgreSQL backend), so that the
/// gateway hears its revocations.
fn redis_settings(app: &TestApp) -> String {
    let get = |k: &str| {
        app.settings
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    match (get("redis_url"), get("redis_key_prefix")) {
        (Some(url), Some(prefix)) => format!("redis_url = \"{url}\"\nredis_key_prefix = \"{prefix}\"\n"),
        _ => String::new(),
    }
}

/// The configuration most tests use; `extra` is appended (more routes).
fn config(app: &TestApp, up: &Upstream, extra: &str) -> String {
    let down = free_port();
    format!(
        r#"
listen = "127.0.0.1:0"
jwks_url = "{jwks}"
issuer = "http://latchkey.test"
audiences = ["latchkey"]
log = "warn"
{redis}
[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://{up}"
timeout_ms = 500

[[routes]]
name = "public"
path_prefix = "/public"
upstream = "http://{up}"
auth = false

[[routes]]
name = "limited"
path_prefix = "/limited"
upstream = "http://{up}"
[routes.rate_limit]
limit = 3
window_secs = 60
key = "sub"

[[routes]]
name = "by-ip"
path_prefix = "/by-ip"
upstream = "http://{up}"
auth = false
[routes.rate_limit]
limit = 2
window_secs = 60
key = "ip"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "http://{up}"
audiences = ["orders"]

[[routes]]
name = "down"
path_prefix = "/down"
upstream = "http://127.0.0.1:{down}"
{extra}
"#,
        jwks = app.url("/.well-known/jwks.json"),
        redis = redis_settings(app),
        up = up.addr,
    )
}

async fn user(app: &TestApp, tag: &str) -> (String, Value) {
    let email = unique_email(tag);
    let pair = app.register_verified(&email, PASSWORD).await;
    (email, pair)
}

fn claims(token: &str) -> Value {
    let c = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(c).unwrap()).unwrap()
}

fn header<'a>(echo: &'a Value, name: &str) -> Option<&'a str> {
    echo["headers"][name][0].as_str()
}

async fn a_valid_token_reaches_the_upstream_with_the_identity(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (email, pair) = user(app, "gw-ok").await;
    let at = pair["access_token"].as_str().unwrap();
    let c = claims(at);

    let r = gw
        .http
        .get(gw.url("/api/things?colour=red"))
        .bearer_auth(at)
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-42");
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/api/things");
    assert_eq!(echo["query"], "colour=red");
    assert_eq!(header(&echo, "x-auth-subject"), c["sub"].as_str());
    assert_eq!(header(&echo, "x-auth-email"), Some(email.as_str()));
    assert_eq!(header(&echo, "x-auth-session"), c["sid"].as_str());
    assert_eq!(header(&echo, "x-auth-client-id"), c["client_id"].as_str());
    assert_eq!(header(&echo, "x-request-id"), Some("req-42"));
    assert_eq!(
        header(&echo, "authorization"),
        Some(format!("Bearer {at}").as_str()),
        "the token is passed on by default"
    );
    assert_eq!(header(&echo, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(header(&echo, "host"), Some(up.addr.to_string().as_str()));
    assert_eq!(up.hits(), 1);

    // Without a request id, the gateway makes one and both sides see it.
    let r = gw.get("/api/again", Some(at)).await;
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(header(&echo, "x-request-id"), Some(id.as_str()));

    // A route without authentication needs no token and gets no identity.
    let echo: Value = gw.get("/public/x", None).await.json().await.unwrap();
    assert_eq!(echo["path"], "/public/x");
    assert!(header(&echo, "x-auth-subject").is_none());
    // The cached path answers the same.
    for _ in 0..3 {
        assert_eq!(gw.get("/api/cached", Some(at)).await.status(), 200);
    }
    gw.stop().await;
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

async fn forged_missing_and_foreign_tokens_never_reach_the_upstream(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (_, pair) = user(app, "gw-forged").await;
    let at = pair["access_token"].as_str().unwrap();
    let mut parts = at.split('.');
    let (h, _, sig) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let mut c = claims(at);
    c["sub"] = "someone-else".into();
    let tampered = format!("{h}.{}.{sig}", b64(&c));
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap();
    let none = json!({"alg": "none", "typ": "at+jwt", "kid": header["kid"]});
    let alg_none = format!("{}.{}.", b64(&none), b64(&claims(at)));
    let mut unknown = header.clone();
    unknown["kid"] = "no-such-key".into();
    let unknown_kid = format!("{}.{}.{sig}", b64(&unknown), at.split('.').nth(1).unwrap());

    for (what, auth) in [
        ("no token", None),
        ("not a JWT", Some("Bearer garbage".to_string())),
        ("tampered claims", Some(format!("Bearer {tampered}"))),
        ("alg none", Some(format!("Bearer {alg_none}"))),
        ("unknown kid", Some(format!("Bearer {unknown_kid}"))),
        ("basic auth", Some("Basic dXNlcjpwYXNz".to_string())),
    ] {
        let mut req = gw.http.get(gw.url("/api/secret"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{what}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer error=\"invalid_token\"");
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"],
            "INVALID_TOKEN",
            "{what}"
        );
    }
    // A valid token, but for another audience than the route accepts.
    let r = gw.get("/orders/1", Some(at)).await;
    assert_eq!(r.status(), 401, "audience");
    assert_eq!(up.hits(), 0, "no refused request reached the upstream");

    assert_eq!(gw.get("/api/secret", Some(at)).await.status(), 200);
    assert_eq!(up.hits(), 1);

    let metrics = gw.get("/metrics", None).await.text().await.unwrap();
    for reason in ["missing", "malformed", "signature", "unknown_kid", "audience"] {
        let line = if reason == "audience" {
            "latchkey_gateway_auth_failures_total{route=\"orders\",reason=\"audience\"}".to_string()
        } else {
            format!("latchkey_gateway_auth_failures_total{{route=\"api\",reason=\"{reason}\"}}")
        };
        assert!(metrics.contains(&line), "{line} missing from /metrics");
    }
    gw.stop().await;
}

/// One raw HTTP/1.1 exchange (the client libraries tidy hop-by-hop headers).
async fn raw_request(base: &str, request: String) -> String {
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the gateway answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

async fn identity_and_hop_by_hop_headers_from_the_client_are_stripped(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (_, pair) = user(app, "gw-spoof").await;
    let at = pair["access_token"].as_str().unwrap();
    let sub = claims(at)["sub"].as_str().unwrap().to_string();

    // With a valid token: the spoofed values are replaced by the token's.
    let r = gw
        .http
        .get(gw.url("/api/me"))
        .bearer_auth(at)
        .header("x-auth-subject", "admin")
        .header("X-Auth-Email", "boss@example.test")
        .header("x-auth-session", "forged")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-auth-subject"], json!([sub]));
    assert_ne!(header(&echo, "x-auth-email"), Some("boss@example.test"));
    assert_ne!(header(&echo, "x-auth-session"), Some("forged"));

    // Without authentication: they are simply gone, as are hop-by-hop headers.
    let resp = raw_request(
        &gw.base,
        "GET /public/raw HTTP/1.1\r\nHost: shop.example\r\nConnection: close, X-Hop\r\n\
         X-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\n\
         Proxy-Authorization: Basic eDp5\r\nProxy: http://evil:3128\r\nX-Auth-Subject: admin\r\n\
         X-Auth-Client-Id: trusted-app\r\nX-Forwarded-For: 6.6.6.6\r\nX-Kept: yes\r\n\r\n"
            .to_string(),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let body = resp.split("\r\n\r\n").nth(1).unwrap();
    let body = body.trim();
    let start = body.find('{').unwrap();
    let echo: Value = serde_json::from_str(&body[start..body.rfind('}').unwrap() + 1]).unwrap();
    let seen: Vec<&str> = echo["headers"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for gone in [
        "x-hop",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy",
        "x-auth-subject",
        "x-auth-client-id",
    ] {
        assert!(!seen.contains(&gone), "{gone} reached the upstream: {seen:?}");
    }
    assert_eq!(header(&echo, "x-kept"), Some("yes"));
    assert_eq!(
        header(&echo, "x-forwarded-for"),
        Some("127.0.0.1"),
        "an untrusted client's X-Forwarded-For is replaced"
    );
    assert_eq!(header(&echo, "x-forwarded-host"), Some("shop.example"));
    gw.stop().await;
}

async fn limits_answer_429_with_ratelimit_headers(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (_, a) = user(app, "gw-limit-a").await;
    let (_, b) = user(app, "gw-limit-b").await;
    let (a, b) = (
        a["access_token"].as_str().unwrap(),
        b["access_token"].as_str().unwrap(),
    );
    for i in 0..3 {
        assert_eq!(gw.get("/limited/x", Some(a)).await.status(), 200, "request {i}");
    }
    let r = gw.get("/limited/x", Some(a)).await;
    assert_eq!(r.status(), 429);
    let h = r.headers();
    assert_eq!(h["ratelimit-limit"], "3");
    assert_eq!(h["ratelimit-remaining"], "0");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "retry-after {retry}");
    assert!(h.contains_key("ratelimit-reset"));
    assert!(h.contains_key("x-request-id"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "RATE_LIMITED");
    assert_eq!(up.hits(), 3, "the refused request did not reach the upstream");
    // Another subject has its own bucket.
    assert_eq!(gw.get("/limited/x", Some(b)).await.status(), 200);

    // By address, on a route without authentication.
    let statuses: Vec<u16> = futures_util::future::join_all((0..5).map(|_| gw.get("/by-ip/y", None)))
        .await
        .iter()
        .map(|r| r.status().as_u16())
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 2, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 3, "{statuses:?}");
    let metrics = gw.get("/metrics", None).await.text().await.unwrap();
    assert!(metrics.contains("latchkey_gateway_rate_limited_total{route=\"limited\"}"));
    gw.stop().await;
}

/// Slow and idle clients are cut off at the gateway as at the service
/// (`connections.rs`), with one cap for all the serving threads' sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_at_the_gateway() {
    let app = TestApp::embedded(&[]).await;
    let up = Upstream::start().await;
    let limits: String = crate::connections::SETTINGS
        .iter()
        .map(|(k, v)| format!("\n{k} = {v}"))
        .collect();
    let toml = config(&app, &up, "").replacen(
        "log = \"warn\"",
        &format!("log = \"warn\"\nworkers = 2{limits}"),
        1,
    );
    let gw = TestGateway::start(&toml).await;
    let addr = gw.base.trim_start_matches("http://").parse().unwrap();
    crate::connections::slow_clients_are_cut_off(addr, "/public/slowloris").await;
    crate::connections::answers_held_back_by_a_one_byte_window_do_not_hold_their_connection(
        addr,
        "/public/slowloris",
    )
    .await;
    gw.stop().await;
    app.stop().await;
}

/// A gateway with [`config`] and `extra`, on one serving thread (so that
/// the whole `upstream.max_requests` is that thread's share), and its address.
async fn one_thread_gateway(app: &TestApp, up: &Upstream, extra: &str) -> (TestGateway, SocketAddr) {
    let toml = config(app, up, extra).replacen("log = \"warn\"", "log = \"warn\"\nworkers = 1", 1);
    let gw = TestGateway::start(&toml).await;
    let addr = gw.base.trim_start_matches("http://").parse().unwrap();
    (gw, addr)
}

/// At most `upstream.max_requests` upstream requests are open at once
/// (from sending until the answer's body ends): past it the gateway
/// answers `503 OVERLOADED` at once and sends nothing upstream. Without the
/// cap, a client's HTTP/2 streams each holding an upstream request (a body
/// sent slowly, an answer left unread) multiplied its connections by a
/// hundred on the upstream side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_requests_past_the_cap_are_refused_and_never_reach_the_upstream() {
    let app = TestApp::embedded(&[]).await;
    let up = Upstream::start().await;
    let (gw, addr) = one_thread_gateway(&app, &up, "[upstream]\nmax_requests = 2").await;
    let hits = || up.hits.load(Ordering::SeqCst);

    // Two uploads that never finish hold two upstream requests.
    let mut holds = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /public/hold HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
            .await
            .unwrap();
        holds.push(s);
    }
    let before = Instant::now();
    while hits() < 2 {
        assert!(
            before.elapsed() < Duration::from_secs(5),
            "the uploads never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = gw.get("/public/x", None).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "OVERLOADED");
    assert_eq!(hits(), 2, "a refused request reached the upstream");

    // A client that goes away frees its request's slot.
    drop(holds.pop());
    gw.until_status("/public/x", None, 200, &[503], Duration::from_secs(5))
        .await;

    // An answer being streamed holds its slot until its end: the stream's
    // second chunk comes 400 ms after its first.
    let (_, pair) = user(&app, "gw-cap").await;
    let at = pair["access_token"].as_str().unwrap();
    let mut streamed = gw.get("/api/stream", Some(at)).await;
    assert_eq!(streamed.chunk().await.unwrap().unwrap(), "first\n");
    assert_eq!(gw.get("/public/x", None).await.status(), 503);
    while streamed.chunk().await.unwrap().is_some() {}
    assert_eq!(gw.get("/public/x", None).await.status(), 200);

    drop(holds);
    gw.stop().await;
    app.stop().await;
}

/// An upstream may answer before it has read the request's body and go on
/// reading it (Go's and Node's servers do): the exchange keeps its slot
/// until the body has been sent, not only until the answer has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_answers_before_the_body_ends_keeps_its_slot_until_it_does() {
    let app = TestApp::embedded(&[]).await;
    let up = Upstream::start().await;
    let early = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let early_addr = early.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = early.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let extra = format!(
        "[[routes]]\nname = \"early\"\npath_prefix = \"/early\"\nupstream = \"http://{early_addr}\"\nauth = false\n\n\
         [upstream]\nmax_requests = 1"
    );
    let (gw, addr) = one_thread_gateway(&app, &up, &extra).await;

    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /early/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let answer = crate::connections::read_head(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Answered, but the body is still being sent: the slot is held.
    assert_eq!(gw.get("/public/x", None).await.status(), 503);
    // The rest of the body: the slot is free.
    s.write_all(&[b'a'; 97]).await.unwrap();
    gw.until_status("/public/x", None, 200, &[503], Duration::from_secs(5))
        .await;
    gw.stop().await;
    app.stop().await;
}

async fn a_down_upstream_is_502_and_a_slow_one_504(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (_, pair) = user(app, "gw-down").await;
    let at = pair["access_token"].as_str().unwrap();

    let r = gw.get("/down/x", Some(at)).await;
    assert_eq!(r.status(), 502);
    assert!(r.headers().contains_key("x-request-id"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "BAD_GATEWAY");
    assert!(body["message"].is_string());

    let start = Instant::now();
    let r = gw.get("/api/slow", Some(at)).await;
    assert_eq!(r.status(), 504);
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "{:?}",
        start.elapsed()
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "GATEWAY_TIMEOUT");

    // No route, and paths that could escape a route's checks.
    let r = gw.get("/nowhere", Some(at)).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "NOT_FOUND");
    // Dot segments resolve before routing (RFC 3986 §5.2.4): the path is
    // served by the route it names, here one that wants a token; an encoded
    // slash is refused.
    for (p, status) in [
        ("/public/../api/secret", "401"),
        ("/public/%2e%2e/api/secret", "401"),
        ("/public%2f..%2fapi", "400"),
    ] {
        let resp = raw_request(
            &gw.base,
            format!("GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(resp.starts_with(&format!("HTTP/1.1 {status}")), "{p}: {resp}");
    }
    // The gateway still serves.
    assert_eq!(gw.get("/api/ok", Some(at)).await.status(), 200);
    gw.stop().await;
}

async fn bodies_stream_both_ways(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (_, pair) = user(app, "gw-stream").await;
    let at = pair["access_token"].as_str().unwrap();

    // A 4 MB upload, sent in chunks (no Content-Length).
    let chunks: Vec<Result<hyper::body::Frame<Bytes>, std::io::Error>> = (0..64)
        .map(|_| Ok(hyper::body::Frame::data(Bytes::from(vec![b'x'; 64 * 1024]))))
        .collect();
    let upload = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    let r = gw
        .http
        .post(gw.url("/api/upload"))
        .bearer_auth(at)
        .body(reqwest::Body::wrap(upload))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["body_len"], 4 * 1024 * 1024);
    assert_eq!(echo["method"], "POST");

    // The first chunk of a slow response arrives before the upstream has finished.
    let mut r = gw.get("/api/stream", Some(at)).await;
    assert_eq!(r.status(), 200);
    let start = Instant::now();
    let first = r.chunk().await.unwrap().unwrap();
    let first_at = start.elapsed();
    assert_eq!(&first[..], b"first\n");
    let mut rest = Vec::new();
    while let Some(c) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert_eq!(rest, b"second\n");
    assert!(
        start.elapsed() >= first_at + Duration::from_millis(300),
        "the body was buffered: first chunk at {first_at:?}, end at {:?}",
        start.elapsed()
    );
    gw.stop().await;
}

async fn health_metrics_and_reload(app: &TestApp) {
    let up = Upstream::start().await;
    let admin = free_port();
    let extra = format!("admin_listen = \"127.0.0.1:{admin}\"\n");
    // admin_listen is a top-level key: put it before the routes.
    let toml = config(app, &up, "").replacen("log = \"warn\"", &format!("log = \"warn\"\n{extra}"), 1);
    let gw = TestGateway::start(&toml).await;
    let admin_url = |p: &str| format!("http://127.0.0.1:{admin}{p}");
    let (_, pair) = user(app, "gw-ops").await;
    let at = pair["access_token"].as_str().unwrap();
    assert_eq!(gw.get("/api/a", Some(at)).await.status(), 200);

    let live = gw.http.get(admin_url("/health/live")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let ready: Value = gw
        .http
        .get(admin_url("/health/ready"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ok", "{ready}");
    assert_eq!(ready["checks"]["jwks"], "ok");
    if app.is_postgres() {
        assert_eq!(ready["checks"]["redis"], "ok");
    }
    let metrics = gw
        .http
        .get(admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "latchkey_gateway_requests_total{route=\"api\",status=\"2xx\"}",
        "latchkey_gateway_request_duration_seconds_bucket{route=\"api\"",
        "latchkey_gateway_upstream_duration_seconds_bucket{route=\"api\"",
    ] {
        assert!(metrics.contains(needle), "{needle} missing");
    }
    // With an admin address, the main one proxies everything (no route: 404).
    assert_eq!(gw.get("/metrics", None).await.status(), 404);

    // Reload: a new route appears; a configuration with a new audience is refused.
    let with_new_route = format!(
        "{toml}\n[[routes]]\nname = \"late\"\npath_prefix = \"/late\"\nupstream = \"http://{}\"\nauth = false\n",
        up.addr
    );
    assert_eq!(gw.get("/late/x", None).await.status(), 404);
    gw.state
        .reload(GatewayConfig::from_toml(&with_new_route).unwrap())
        .expect("reloaded");
    assert_eq!(gw.get("/late/x", None).await.status(), 200);
    let new_audience = with_new_route.replace("audiences = [\"orders\"]", "audiences = [\"billing\"]");
    let err = gw
        .state
        .reload(GatewayConfig::from_toml(&new_audience).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("routes[4].audiences"), "{err}");
    assert_eq!(gw.get("/late/x", None).await.status(), 200, "the table stayed");
    gw.stop().await;
}

async fn a_key_rotated_at_the_service_is_fetched_on_its_first_token(app: &TestApp) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(app, &up, "")).await;
    let (email, _) = user(app, "gw-rotate").await;
    let kid = app.services.tokens.rotate().await.unwrap();
    let pair: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let at = pair["access_token"].as_str().unwrap();
    let header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(at.split('.').next().unwrap()).unwrap()).unwrap();
    assert_eq!(header["kid"], kid.as_str());
    // Unknown kids trigger a JWKS fetch at most every 2 s.
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let status = gw.get("/api/rotated", Some(at)).await.status();
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway never learnt the new key");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.stop().await;
}

/// PostgreSQL + Redis only: the gateway hears the service's revocations.
mod revocation {
    use super::*;

    #[sqlx::test(migrations = false)]
    async fn a_logout_at_the_service_is_refused_at_the_gateway_within_a_second(
        _: sqlx::postgres::PgPoolOptions,
        opts: sqlx::postgres::PgConnectOptions,
    ) {
        let app = TestApp::postgres(opts, &[]).await;
        let up = Upstream::start().await;
        let gw = TestGateway::start(&config(&app, &up, "")).await;
        let (_, pair) = user(&app, "gw-logout").await;
        let at = pair["access_token"].as_str().unwrap();
        // Verified and cached by the gateway.
        assert_eq!(gw.get("/api/x", Some(at)).await.status(), 200);
        assert_eq!(gw.get("/api/x", Some(at)).await.status(), 200);
        let hits = up.hits();
        let r = app
            .post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
            .await;
        assert_eq!(r.status(), 204);
        // A logged-out token is refused within a second.
        gw.until_status("/api/x", Some(at), 401, &[], Duration::from_secs(1))
            .await;
        let refused_at = up.hits();
        assert_eq!(gw.get("/api/x", Some(at)).await.status(), 401);
        assert_eq!(
            up.hits(),
            refused_at,
            "a revoked token does not reach the upstream"
        );
        assert!(refused_at - hits <= 50);
        let metrics = gw.get("/metrics", None).await.text().await.unwrap();
        assert!(metrics.contains("latchkey_gateway_auth_failures_total{route=\"api\",reason=\"revoked\"}"));
        gw.stop().await;
        app.stop().await;
    }

    /// Redis goes away; a logout still reaches a gateway that polls the
    /// service's `GET /revocations`, and a gateway that cannot learn of
    /// logouts at all refuses tokens (503) rather than honour ended sessions,
    /// unless told to accept them.
    #[sqlx::test(migrations = false)]
    async fn a_logout_during_a_redis_outage_reaches_the_gateway(
        _: sqlx::postgres::PgPoolOptions,
        opts: sqlx::postgres::PgConnectOptions,
    ) {
        let mut redis = crate::common::OwnRedis::start().await;
        let app = TestApp::postgres(opts, &[("redis_url", &redis.url())]).await;
        let up = Upstream::start().await;
        let polling = format!(
            "revocations_url = \"{}/revocations\"\nrevocations_poll_ms = 200\n",
            app.admin_base
        );
        let gw = TestGateway::start(
            &config(&app, &up, "").replace("log = \"warn\"", &format!("log = \"warn\"\n{polling}")),
        )
        .await;
        let blind = TestGateway::start(&config(&app, &up, "")).await;
        let lenient = TestGateway::start(&config(&app, &up, "").replace(
            "log = \"warn\"",
            "log = \"warn\"\non_unknown_revocations = \"accept\"",
        ))
        .await;
        let (_, pair) = user(&app, "gw-outage").await;
        let at = pair["access_token"].as_str().unwrap();
        for g in [&gw, &blind, &lenient] {
            assert_eq!(g.get("/api/x", Some(at)).await.status(), 200);
        }
        redis.stop();
        let r = app
            .post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
            .await;
        assert_eq!(r.status(), 204);
        // The polling gateway refuses the logged-out token.
        gw.until_status("/api/x", Some(at), 401, &[200], Duration::from_secs(5))
            .await;
        // Without a source that answers, the others cannot tell.
        let r = blind
            .until_status("/api/x", Some(at), 503, &[], Duration::from_secs(5))
            .await;
        assert!(r.headers().contains_key("retry-after"));
        assert_eq!(
            lenient.get("/api/x", Some(at)).await.status(),
            200,
            "accept, as configured"
        );
        // Public routes do not depend on it.
        assert_eq!(blind.get("/public/x", None).await.status(), 200);
        for g in [gw, blind, lenient] {
            g.stop().await;
        }
        app.stop().await;
    }
}

/// The binary: bad files stop start-up with one line naming the field;
/// a good one serves, reloads on SIGHUP and stops on SIGTERM.
mod binary {
    use super::*;

    fn gateway(config: &std::path::Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_latchkey"));
        c.arg("gateway").arg("--config").arg(config);
        c
    }

    #[test]
    fn an_invalid_file_stops_start_up_with_one_line_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        for (body, field) in [
            (
                "jwks_url = \"http://127.0.0.1:1/jwks\"\nissuer = \"http://x\"\n[[routes]]\nupstream = \"ftp://x\"\n",
                "routes[0].upstream",
            ),
            (
                "jwks_url = \"http://127.0.0.1:1/jwks\"\nissuer = \"http://x\"\n[[routes]]\nupstream = \"http://x\"\n[routes.rate_limit]\nlimit = 10\nwindow_secs = 60\non_redis_failure = \"maybe\"\n",
                "routes[0].rate_limit.on_redis_failure",
            ),
            ("issuer = \"http://x\"\n[[routes]]\nupstream = \"http://x\"\n", "jwks_url"),
            ("this is not toml", "--config"),
        ] {
            std::fs::write(&path, body).unwrap();
            let out = gateway(&path).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{field}");
            let err = String::from_utf8(out.stderr).unwrap();
            assert_eq!(err.trim_end().lines().count(), 1, "{field}: {err}");
            assert!(err.contains(field), "{field}: {err}");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_latchkey"))
            .arg("gateway")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_reloads_on_sighup_and_stops_on_sigterm() {
        let app = TestApp::embedded(&[]).await;
        let up = Upstream::start().await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        let port = free_port();
        let toml = config(&app, &up, "").replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1);
        std::fs::write(&path, &toml).unwrap();
        let child = gateway(&path).stderr(Stdio::null()).spawn().unwrap();
        let mut guard = KillOnDrop(child);
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "not listening");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A SIGHUP as soon as the port answers is a reload (of the same
        // file), not the end of the process: its handler is installed
        // before the listener is bound.
        let pid = guard.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
        let get = |p: &str| http.get(format!("{base}{p}")).send();
        assert_eq!(get("/public/a").await.unwrap().status(), 200);
        assert_eq!(get("/late/a").await.unwrap().status(), 404);

        let added = format!(
            "{toml}\n[[routes]]\nname = \"late\"\npath_prefix = \"/late\"\nupstream = \"http://{}\"\nauth = false\n",
            up.addr
        );
        std::fs::write(&path, added).unwrap();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
        let deadline = Instant::now() + Duration::from_secs(5);
        while get("/late/a").await.unwrap().status() != 200 {
            assert!(Instant::now() < deadline, "SIGHUP did not add the route");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A broken file on SIGHUP keeps the running table.
        std::fs::write(&path, "broken = [").unwrap();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(get("/late/a").await.unwrap().status(), 200);

        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = guard.0.try_wait().unwrap() {
                assert!(status.success(), "exit status {status}");
                break;
            }
            assert!(Instant::now() < deadline, "did not stop on SIGTERM");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        app.stop().await;
    }

    struct KillOnDrop(std::process::Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `require_mfa = true`: only tokens of a session that passed a second
/// factor reach the upstream; others get RFC 9470's answer, which tells
/// the client to log in again with one.
async fn a_route_that_requires_a_second_factor_refuses_single_factor_sessions(app: &TestApp) {
    use crate::mfa::{enrol_totp, pyotp, settle_step, step_up};
    let up = Upstream::start().await;
    let extra = format!(
        "[[routes]]\nname = \"secure\"\npath_prefix = \"/secure\"\nupstream = \"http://{}\"\nrequire_mfa = true\n",
        up.addr
    );
    let gw = TestGateway::start(&config(app, &up, &extra)).await;
    let (email, pair) = user(app, "gw-mfa").await;
    let single = pair["access_token"].as_str().unwrap();
    let r = gw.get("/secure/report", Some(single)).await;
    assert_eq!(r.status(), 401);
    let www = r.headers()["www-authenticate"].to_str().unwrap().to_string();
    assert!(
        www.contains("insufficient_user_authentication") && www.contains("acr_values=\"2\""),
        "{www}"
    );
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "INSUFFICIENT_USER_AUTHENTICATION"
    );
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    // Routes without the setting take it as before.
    assert_eq!(gw.get("/api/x", Some(single)).await.status(), 200);
    let (secret, _) = enrol_totp(app, single).await;
    settle_step().await;
    let up_body = step_up(app, &email).await;
    let r = app
        .post(
            "/auth/mfa/verify",
            serde_json::json!({"mfa_token": up_body["mfa_token"], "code": pyotp(&secret, 1)}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let strong: Value = r.json().await.unwrap();
    let r = gw.get("/secure/report", strong["access_token"].as_str()).await;
    assert_eq!(r.status(), 200);
    gw.stop().await;
}
