//! Instruction counts of the hot paths, measured by callgrind through
//! gungraun: each benchmark runs once under valgrind and reports how many
//! instructions the path executed. Unlike a time, the count is nearly the
//! same on a busy machine as on an idle one (within 2 % from run to run:
//! hash seeds, random tokens, cache upkeep), so `scripts/instructions check`
//! compares it with the baseline in `benches/instructions.baseline` and
//! fails when a path grows by more than the margin written there.
//!
//! Every path but the limiter's goes through the real service stack in
//! process: the application built from settings as `latchkey serve` builds
//! it (the embedded default: SQLite in a temporary directory, in-process
//! caches and limits; no log subscriber, so events cost only their level
//! check), and one request handed to its router, with the same middleware,
//! without a socket.
//!
//! What is counted: everything the process executes between the two
//! client requests around the request, on every thread. That takes in the
//! SQLite worker thread of sqlx (the queries themselves), which a count of
//! the benchmark's own thread would miss. Setting up (building the
//! application, the account, the first login with its password hash) runs
//! with instrumentation off and is not counted.
//!
//! `scripts/instructions` runs this (`cargo bench --bench instructions`)
//! under valgrind and reads the counts. Built in the test profile (`cargo
//! test --all-targets`, so `scripts/test`), it runs each path once
//! natively instead and checks its answer: a benchmark whose set-up no
//! longer works fails the tests, not only the gate.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use gungraun::{library_benchmark, library_benchmark_group};
#[cfg(not(debug_assertions))]
use gungraun::{main, Callgrind, EntryPoint, LibraryBenchmarkConfig};
use latchkey::app::config::Config;
use latchkey::app::Services;
use latchkey::crypto::{b64url, sha256};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};
use latchkey::limits::{Limiter, Policies, PolicyName};
use latchkey::settings::Sources;
use serde_json::{json, Value};
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// Callgrind's client requests `CALLGRIND_START_INSTRUMENTATION` and
/// `CALLGRIND_STOP_INSTRUMENTATION` (valgrind's `callgrind.h`), written
/// out: the request number goes in an argument block whose address is in
/// `rax`, behind the instruction sequence valgrind recognises (four
/// rotations of `rdi` by 128 bits in all, which leave it as it was, then
/// `xchg rbx, rbx`). Run natively, the sequence does nothing. gungraun's
/// own binding of these requests is generated at build time with bindgen,
/// which needs libclang: two constants are cheaper.
mod callgrind {
    /// `VG_USERREQ_TOOL_BASE('C', 'T')`, callgrind's first request.
    const BASE: u64 = (b'C' as u64) << 24 | (b'T' as u64) << 16;

    pub fn start_instrumentation() {
        request(BASE + 4);
    }

    pub fn stop_instrumentation() {
        request(BASE + 5);
    }

    #[cfg(target_arch = "x86_64")]
    fn request(number: u64) {
        let args: [u64; 6] = [number, 0, 0, 0, 0, 0];
        // SAFETY: the sequence reads the six words at `rax` (under
        // valgrind) and writes only `rdx`; `rdi` ends as it began.
        unsafe {
            std::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") 0u64 => _,
                inout("rdi") 0u64 => _,
            );
        }
    }

    // Elsewhere nothing would be counted: refuse to build the benchmark
    // rather than measure zero (the test profile's run needs no valgrind).
    #[cfg(all(not(target_arch = "x86_64"), not(debug_assertions)))]
    compile_error!("benches/instructions.rs counts on x86_64 only (callgrind's client requests)");

    #[cfg(not(target_arch = "x86_64"))]
    fn request(_: u64) {}
}

const EMAIL: &str = "bench@example.com";
const PASSWORD: &str = "correct horse battery staple";
const CALLBACK: &str = "https://app.example/callback";
const VERIFIER: &str = "a-pkce-code-verifier-of-forty-three-characters-at-least";

/// The application on the embedded default, with its router and the
/// runtime (one thread) that drives it.
struct Stack {
    rt: Runtime,
    router: Router,
    services: Arc<Services>,
    _dir: tempfile::TempDir,
}

impl Stack {
    fn new() -> Stack {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().display().to_string();
        let settings = [
            ("database_url", format!("sqlite://{path}/latchkey.db")),
            ("data_dir", path.clone()),
            ("mail", format!("file:{path}/mail")),
            ("issuer", "http://latchkey.bench".into()),
            // Under valgrind a password hash takes seconds: let it wait
            // for its thread rather than be shed.
            ("hash_latency_objective_ms", "60000".into()),
            // No RSA key to make for id_tokens (seconds under valgrind).
            ("id_token_signing_algorithms", "".into()),
        ];
        let config = Config::from_sources(&Sources::from_pairs(
            settings.iter().map(|(k, v)| (*k, v.as_str())),
        ))
        .expect("valid settings");
        let services = rt
            .block_on(Services::build(config))
            .expect("the application builds");
        let router = latchkey::http::router(services.api_state());
        Stack {
            rt,
            router,
            services,
            _dir: dir,
        }
    }

    /// One request through the router, as from 192.0.2.1; the status and
    /// the body.
    fn send(&self, req: Request<Body>) -> (StatusCode, Vec<u8>) {
        self.rt.block_on(async {
            let mut req = req;
            req.extensions_mut()
                .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 40_000))));
            let res = self
                .router
                .clone()
                .oneshot(req)
                .await
                .expect("the router answers");
            let status = res.status();
            let location = res.headers().get(header::LOCATION).cloned();
            let body = axum::body::to_bytes(res.into_body(), 1 << 20)
                .await
                .expect("a body");
            match location {
                // A redirect's body is its location, for the setup to read.
                Some(l) if body.is_empty() => (status, l.as_bytes().to_vec()),
                _ => (status, body.to_vec()),
            }
        })
    }

    /// A verified account with a password, signed in once (so its
    /// password is in the credential cache): the tokens of that login.
    fn signed_in(&self) -> Value {
        let record = serde_json::from_value(json!({
            "email": EMAIL, "verified": true, "password": PASSWORD,
        }))
        .expect("an account record");
        self.rt
            .block_on(self.services.features.admin.create_user("bench", record))
            .expect("the account is created");
        self.login()
    }

    fn login(&self) -> Value {
        let (status, body) = self.send(json_post(
            "/auth/login",
            &json!({"email": EMAIL, "password": PASSWORD}),
        ));
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("a JSON body")
    }
}

fn json_post(path: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a request")
}

fn validate_request(token: &str) -> Request<Body> {
    Request::builder()
        .uri("/auth/validate")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .expect("a request")
}

/// Counts what `f` executes, on every thread (instrumentation on only
/// around it), and checks its answer after the count.
fn counted(stack: &Stack, req: Request<Body>, expect: StatusCode) {
    callgrind::start_instrumentation();
    let (status, body) = black_box(stack.send(black_box(req)));
    callgrind::stop_instrumentation();
    assert_eq!(status, expect, "{}", String::from_utf8_lossy(&body));
}

fn token(tokens: &Value, name: &str) -> String {
    tokens[name].as_str().expect("a token").to_string()
}

// ---- the set-ups: each builds a stack and a request for it

fn validate_cached() -> (Stack, Request<Body>) {
    let stack = Stack::new();
    let access = token(&stack.signed_in(), "access_token");
    let (status, _) = stack.send(validate_request(&access));
    assert_eq!(status, StatusCode::OK);
    let req = validate_request(&access);
    (stack, req)
}

fn validate_cold() -> (Stack, Request<Body>) {
    let stack = Stack::new();
    let access = token(&stack.signed_in(), "access_token");
    let req = validate_request(&access);
    (stack, req)
}

fn login_cached() -> (Stack, Request<Body>) {
    let stack = Stack::new();
    stack.signed_in();
    let req = json_post("/auth/login", &json!({"email": EMAIL, "password": PASSWORD}));
    (stack, req)
}

fn refresh() -> (Stack, Request<Body>) {
    let stack = Stack::new();
    let rt = token(&stack.signed_in(), "refresh_token");
    let req = json_post("/auth/refresh", &json!({"refresh_token": rt}));
    (stack, req)
}

/// A confidential client whose users are not asked (a first-party app), a
/// signed-in browser, and the code of its authorization request.
fn code_exchange() -> (Stack, Request<Body>) {
    let stack = Stack::new();
    let mut settings = ClientSettings::new(ClientKind::Confidential, vec![CALLBACK.into()]);
    settings.consent = ConsentMode::Skip;
    let secret = stack
        .rt
        .block_on(
            stack
                .services
                .features
                .clients
                .add("web", Some("Web"), &[], Some(&settings)),
        )
        .expect("the client is added")
        .expect("a new client");
    let rt = token(&stack.signed_in(), "refresh_token");
    let cookie = stack.services.features.provider.browser_cookie(&rt);
    let challenge = b64url(&sha256(VERIFIER.as_bytes()));
    let authorize = format!(
        "/oauth/authorize?response_type=code&client_id=web&scope=openid&state=s&nonce=n\
         &redirect_uri={}&code_challenge={challenge}&code_challenge_method=S256",
        CALLBACK.replace(':', "%3A").replace('/', "%2F"),
    );
    let (status, location) = stack.send(
        Request::builder()
            .uri(authorize)
            .header(header::COOKIE, format!("latchkey_session={cookie}"))
            .body(Body::empty())
            .expect("a request"),
    );
    let location = String::from_utf8(location).expect("a location");
    assert_eq!(status, StatusCode::SEE_OTHER, "{location}");
    let code = location
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("code="))
        .unwrap_or_else(|| panic!("a code in {location}"))
        .to_string();
    let form = format!(
        "grant_type=authorization_code&code={code}&redirect_uri={}&code_verifier={VERIFIER}",
        CALLBACK.replace(':', "%3A").replace('/', "%2F"),
    );
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("web:{secret}"));
    let req = Request::builder()
        .method(Method::POST)
        .uri("/oauth/token")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::AUTHORIZATION, format!("Basic {basic}"))
        .body(Body::from(form))
        .expect("a request");
    (stack, req)
}

/// The gateway in front of an upstream, with the service's keys: the
/// service and the upstream answer on loopback sockets (the gateway reads
/// the JWKS over HTTP, and forwards over HTTP), served by the stack's
/// runtime. A first request with the token has verified and cached it and
/// opened the connection to the upstream: the counted one is admitted with
/// the cached token and forwarded on that connection (the upstream's
/// trivial answer is in the count too).
fn gateway_admission() -> (Stack, Request<Body>) {
    let stack = Stack::new();
    let access = token(&stack.signed_in(), "access_token");
    let (service, upstream) = stack.rt.block_on(async {
        let service = serve(stack.router.clone()).await;
        let upstream = serve(Router::new().fallback(|| async { "upstream" })).await;
        (service, upstream)
    });
    let config = latchkey::gateway::GatewayConfig::from_toml(&format!(
        r#"
listen = "127.0.0.1:0"
jwks_url = "http://{service}/.well-known/jwks.json"
issuer = "http://latchkey.bench"
audiences = ["latchkey"]
log = "error"
workers = 1

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://{upstream}"
[routes.rate_limit]
limit = 1000000
window_secs = 60
key = "sub"
"#
    ))
    .expect("a valid gateway configuration");
    let gateway = stack
        .rt
        .block_on(latchkey::gateway::Gateway::build(config))
        .expect("the gateway starts");
    let gateway = Stack {
        router: gateway.router(),
        ..stack
    };
    let request = || {
        Request::builder()
            .uri("/api/orders/42")
            .header(header::HOST, "api.example.com")
            .header(header::AUTHORIZATION, format!("Bearer {access}"))
            .body(Body::empty())
            .expect("a request")
    };
    let (status, body) = gateway.send(request());
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let req = request();
    (gateway, req)
}

/// Serves `router` on a loopback port of the running runtime.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    addr
}

#[library_benchmark]
#[bench::cached(setup = validate_cached)]
#[bench::cold(setup = validate_cold)]
fn validate((stack, req): (Stack, Request<Body>)) -> Stack {
    counted(&stack, req, StatusCode::OK);
    stack
}

#[library_benchmark]
#[bench::credential_cache_hit(setup = login_cached)]
fn login((stack, req): (Stack, Request<Body>)) -> Stack {
    counted(&stack, req, StatusCode::OK);
    stack
}

#[library_benchmark]
#[bench::embedded(setup = refresh)]
fn refresh_token((stack, req): (Stack, Request<Body>)) -> Stack {
    counted(&stack, req, StatusCode::OK);
    stack
}

#[library_benchmark]
#[bench::cached_token(setup = gateway_admission)]
fn gateway((stack, req): (Stack, Request<Body>)) -> Stack {
    counted(&stack, req, StatusCode::OK);
    stack
}

#[library_benchmark]
#[bench::confidential_client(setup = code_exchange)]
fn authorization_code((stack, req): (Stack, Request<Body>)) -> Stack {
    counted(&stack, req, StatusCode::OK);
    stack
}

// One check of the in-process limiter (a login's by address), its key
// already known.
#[library_benchmark]
#[bench::in_process(setup = limiter)]
fn limiter_check((rt, limiter): (Runtime, Limiter)) -> (Runtime, Limiter) {
    counted_check(&rt, &limiter);
    (rt, limiter)
}

fn counted_check(rt: &Runtime, limiter: &Limiter) {
    callgrind::start_instrumentation();
    let r = black_box(rt.block_on(limiter.check(PolicyName::LoginIp, black_box("192.0.2.1"))));
    callgrind::stop_instrumentation();
    assert!(r.is_ok(), "within the limit");
}

fn limiter() -> (Runtime, Limiter) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let src = Sources::from_pairs([("rate_limit_login_ip", "1000000/60")]);
    let limiter = Limiter::new(true, None).with_policies(&Policies::read(&src).expect("a policy"));
    let first = rt.block_on(limiter.check(PolicyName::LoginIp, "192.0.2.1"));
    assert!(first.is_ok());
    (rt, limiter)
}

library_benchmark_group!(
    name = hot_paths,
    benchmarks = [
        validate,
        login,
        refresh_token,
        authorization_code,
        gateway,
        limiter_check
    ]
);

#[cfg(not(debug_assertions))]
main!(
    // Instrumentation is off from the start and turned on only around the
    // request (`counted`), on every thread; the default entry point (the
    // benchmark function, on its own thread) is not used.
    config = LibraryBenchmarkConfig::default().tool(
        Callgrind::with_args(["--instr-atstart=no"]).entry_point(EntryPoint::None)
    );
    library_benchmark_groups = hot_paths
);

/// The test profile's run (see the top of the file): every set-up and its
/// request once, without valgrind, each answer checked.
#[cfg(debug_assertions)]
fn main() {
    type Case = (&'static str, fn() -> (Stack, Request<Body>));
    let cases: [Case; 6] = [
        ("validate, cached", validate_cached),
        ("validate, cold", validate_cold),
        ("login, credential cache hit", login_cached),
        ("refresh", refresh),
        ("authorization code", code_exchange),
        ("gateway, cached token", gateway_admission),
    ];
    for (name, setup) in cases {
        let (stack, req) = setup();
        counted(&stack, req, StatusCode::OK);
        println!("instructions: {name}: answers 200");
    }
    let (rt, limiter) = limiter();
    counted_check(&rt, &limiter);
    println!("instructions: limiter check: within the limit");
}
