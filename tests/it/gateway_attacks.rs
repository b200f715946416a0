//! The gateway under attack: a corpus of hostile requests (path confusion,
//! header folding and smuggling, forwarding headers, CGI-style and proxy
//! identity headers, request framing) sent raw to the gateway in front of
//! real, deliberately lenient upstream stacks: a WSGI server and Node's
//! HTTP server (`tests/support/lenient_upstream.*`), the same WSGI
//! application under gunicorn 27 and 21 (which take a `SCRIPT_NAME` header
//! as the mount point), a Flask application with the common
//! "ReverseProxied" middleware (`X-Script-Name`, `X-Scheme`), and an
//! Express application (whose router ignores case). For every request: no
//! handler that wants a token ran without a valid one, and no identity,
//! forwarding or upstream meta-data header reached the upstream from the
//! client.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use latchkey::gateway::{Gateway, GatewayConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::common::{unique_email, SupportServer, TestApp, PASSWORD};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_wsgi() {
    hostile_corpus(Stack::Wsgi).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_node() {
    hostile_corpus(Stack::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_gunicorn_27() {
    hostile_corpus(Stack::Gunicorn("27.0.1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_gunicorn_21() {
    hostile_corpus(Stack::Gunicorn("21.2.0")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_flask_behind_reverse_proxied() {
    hostile_corpus(Stack::Flask).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_express() {
    hostile_corpus(Stack::Express).await;
}

/// An upstream application stack of the corpus.
#[derive(Clone, Copy, Debug)]
enum Stack {
    Wsgi,
    Node,
    /// The WSGI application under this gunicorn version (installed with
    /// `pip install --target target/test-deps/gunicorn-VERSION` by
    /// `tests/support/install-upstreams`).
    Gunicorn(&'static str),
    Flask,
    Express,
}

impl Stack {
    fn start(self, log: &Path) -> SupportServer {
        let hint = "tests/support/install-upstreams installs what the stacks need";
        let log: OsString = log.into();
        match self {
            Stack::Wsgi => SupportServer::start("lenient_upstream.py", &[&log], "python3"),
            Stack::Node => SupportServer::start("lenient_upstream.js", &[&log], "node"),
            Stack::Gunicorn(version) => {
                let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("target/test-deps")
                    .join(format!("gunicorn-{version}"));
                assert!(
                    dir.join("gunicorn").is_dir(),
                    "no gunicorn {version} in {}: {hint}",
                    dir.display()
                );
                SupportServer::start(
                    "lenient_upstream.py",
                    &[&log, "--gunicorn".as_ref(), dir.as_os_str()],
                    hint,
                )
            }
            Stack::Flask => SupportServer::start("flask_upstream.py", &[&log], hint),
            Stack::Express => SupportServer::start("express/upstream.js", &[&log], hint),
        }
    }
}

/// One raw HTTP/1.1 exchange; the connection is closed by the request.
async fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A chunked body that stops arriving during the read-ahead is answered
/// `408` within the route's timeout, and nothing reaches the upstream
/// (the read-ahead had no deadline: such a request held its connection
/// for ever, outside the route's timeout and the upstream cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_during_the_read_ahead_is_answered_408_and_reaches_nothing() {
    let (app, dir) = (TestApp::embedded(&[]).await, tempfile::tempdir().unwrap());
    let log = dir.path().join("hits.jsonl");
    let upstream = Stack::Wsgi.start(&log);
    let (addr, stop) = small_gateway(&app, &upstream, "timeout_ms = 500").await;
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /x HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        .await
        .unwrap();
    let mut out = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut out))
        .await
        .expect("answered within the route's timeout")
        .unwrap();
    let answer = String::from_utf8_lossy(&out[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(hits(&log).is_empty(), "nothing reached the upstream");
    stop.await;
    app.stop().await;
}

/// A gateway with one public route to `upstream` (`extra` added to the
/// route), its JWKS at `app`: its address, and a future that stops it.
async fn small_gateway(
    app: &TestApp,
    upstream: &SupportServer,
    extra: &str,
) -> (String, impl std::future::Future<Output = ()>) {
    let toml = format!(
        "listen = \"127.0.0.1:0\"\njwks_url = \"{}\"\nissuer = \"http://latchkey.test\"\nlog = \"warn\"\n\
         trusted_proxies = [\"127.0.0.1\"]\n\
         [[routes]]\nupstream = \"http://127.0.0.1:{}\"\nauth = false\n{extra}\n",
        app.url("/.well-known/jwks.json"),
        upstream.ready
    );
    let gw = Gateway::build(GatewayConfig::from_toml(&toml).unwrap())
        .await
        .unwrap();
    let addr = gw.local_addr().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(gw.run_until(async move {
        let _ = stopped.await;
    }));
    (addr, async move {
        let _ = stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(15), running).await;
    })
}

/// A proxy's assertion that a route takes on purpose
/// (`allow_client_headers`) arrives from a trusted proxy only, and only
/// that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_takes_a_named_proxy_assertion_from_a_trusted_proxy_only() {
    let (app, dir) = (TestApp::embedded(&[]).await, tempfile::tempdir().unwrap());
    let log = dir.path().join("hits.jsonl");
    let upstream = Stack::Wsgi.start(&log);
    let (addr, stop) = small_gateway(&app, &upstream, "allow_client_headers = [\"x-ssl-client-cert\"]").await;
    let r = raw(
        &addr,
        b"GET /x HTTP/1.1\r\nHost: gw.test\r\nX-SSL-Client-Cert: CN=alice\r\nX-Remote-User: admin\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let hit = hits(&log).pop().unwrap();
    assert_eq!(
        hit["meta"],
        serde_json::json!({"x-ssl-client-cert": "CN=alice"}),
        "{hit}"
    );
    stop.await;
    app.stop().await;
}

/// One HTTP/2 (prior knowledge) GET with one extra header; its status.
async fn h2_get(addr: &str, path: &str, name: &'static str, value: &'static str) -> u16 {
    use http_body_util::Empty;
    use hyper::body::Bytes;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let req = hyper::Request::get(format!("http://{addr}{path}"))
        .header(name, value)
        .body(Empty::new())
        .unwrap();
    client
        .request(req)
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

fn hits(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a case of the corpus must lead to, beyond "no bypass".
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Any answer, as long as nothing reaches a handler it should not.
    Anything,
    /// `400`, and the upstream never saw the request.
    Refused,
    /// The upstream received a body of this many bytes.
    Body(u64),
}

/// A hostile request: what it is, its bytes, whether it carries the valid
/// token, and what it must lead to.
struct Case {
    what: String,
    request: Vec<u8>,
    with_token: bool,
    expect: Expect,
}

fn corpus(token: &str) -> Vec<Case> {
    let mut out: Vec<(String, Vec<u8>, bool)> = Vec::new();
    let get = |path: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\n{extra}Connection: close\r\n\r\n").into_bytes()
    };
    // Path confusion: every spelling an upstream might read as /admin.
    for path in [
        "/admin/users",
        "/%61dmin/users",
        "/%41DMIN/users",
        "/adm%69n/users",
        "//admin/users",
        "///admin//users",
        "/./admin/users",
        "/x/../admin/users",
        "/public/../admin/users",
        "/x/%2e%2e/admin/users",
        "/x/.%2E/admin/users",
        "/x/..;/admin/users",
        "/x/.;/admin/users",
        "/x/..%2fadmin/users",
        "/x%2f..%2fadmin/users",
        "/x/..%5cadmin/users",
        "/x\\..\\admin/users",
        "/%2561dmin/users",
        "/%252e%252e/admin/users",
        "/x/%c0%ae%c0%ae/admin/users",
        "/%c0%afadmin/users",
        "/x/%e0%80%ae%e0%80%ae/admin",
        "/ADMIN/users",
        "/Admin/users",
        "/admin;jsessionid=x/users",
        "/admin%3bx/users",
        "/admin%00/users",
        "/admin%09/users",
        "/admin?x=/public",
        "/public/%2e%2e%2fadmin",
        "/public/..%252fadmin",
        "/admin#/public",
        "/%2e/admin",
        "/admin/.",
        "/admin/./users",
        "/public/..",
        "/;/admin/users",
        "/;x/admin/users",
        "/public/;/../admin/users",
        "/adm%C4%B1n/users",
        "/adm\u{131}n/users",
        "/%E2%84%AAeys",
        "/admin.json",
        "/ADMIN.json",
        "/Admin/users.json",
        "/admin.json/users",
        "/admin",
        "/ADMIN",
        "/admin.",
    ] {
        out.push((format!("GET {path}"), get(path, ""), false));
    }
    // Absolute-form targets and Host games.
    out.push((
        "absolute-form admin".into(),
        b"GET http://gw.test/admin/users HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n".to_vec(),
        false,
    ));
    out.push((
        "absolute-form with another Host".into(),
        b"GET http://gw.test/admin/users HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n".to_vec(),
        false,
    ));
    // The host-based admin route (admin.gw.test), in other spellings.
    for host in [
        "admin.gw.test.",
        "ADMIN.gw.test",
        "admin.gw.test:x",
        "admin.gw.test:80:80",
        "gw.test, admin.gw.test",
        "gw.test\", for=10.0.0.9;host=admin.gw.test;proto=https, x=\"",
        "user@admin.gw.test",
    ] {
        out.push((
            format!("Host: {host}"),
            format!("GET /public HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes(),
            false,
        ));
    }
    out.push((
        "absolute-form to admin.gw.test.".into(),
        b"GET http://admin.gw.test./public HTTP/1.1\r\nHost: admin.gw.test.\r\nConnection: close\r\n\r\n"
            .to_vec(),
        false,
    ));
    out.push((
        "HTTP/1.1 without Host".into(),
        b"GET /public HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
        false,
    ));
    out.push((
        "two Hosts".into(),
        b"GET /admin/users HTTP/1.1\r\nHost: gw.test\r\nHost: admin.test\r\nConnection: close\r\n\r\n"
            .to_vec(),
        false,
    ));
    // Forwarding headers some frameworks route or authorise by.
    for h in [
        "X-Original-URL: /admin/users",
        "X-Rewrite-URL: /admin/users",
        "X_Original_URL: /admin/users",
        "x-original-url: /ADMIN/users",
        "X-Real-IP: 10.0.0.1",
        "X_Real_IP: 10.0.0.1",
        "X-Forwarded-Host: admin.internal",
        "X-Forwarded-Port: 443",
        "X-Forwarded-Proto: https",
        "X_Forwarded_For: 10.0.0.1",
        "Forwarded: for=10.0.0.1;host=admin.internal",
        "X-HTTP-Method-Override: DELETE",
        "X-Forwarded-User: admin",
        "X_Forwarded_User: admin",
        "X-Forwarded-Email: boss@corp.example",
        "X-Forwarded-Groups: admins",
        "X-Forwarded-Access-Token: t",
        "X-Forwarded-Client-Cert: By=spiffe://admin",
        "X-Forwarded-Protocol: https",
    ] {
        out.push((
            format!("GET /public with {h}"),
            get("/public", &format!("{h}\r\n")),
            false,
        ));
    }
    // Identity headers in every spelling, with and without a token.
    for h in [
        "X-Auth-Subject: victim-id",
        "X_Auth_Subject: victim-id",
        "x_auth_subject: victim-id",
        "X-AUTH-SUBJECT: victim-id",
        "X_Auth_Email: boss@corp.example",
        "X-Auth-Client-Id: trusted-app",
        "X-Auth-Roles: admin",
        "X_Auth_Session: forged",
        "X.Auth.Subject: victim-id",
        "X~Auth~Subject: victim-id",
    ] {
        out.push((
            format!("GET /public with {h}"),
            get("/public", &format!("{h}\r\n")),
            false,
        ));
        out.push((
            format!("GET /admin/users without a token, with {h}"),
            get("/admin/users", &format!("{h}\r\n")),
            false,
        ));
        out.push((
            format!("GET /admin/users with the token and {h}"),
            get(
                "/admin/users",
                &format!("Authorization: Bearer {token}\r\n{h}\r\n"),
            ),
            true,
        ));
    }
    // Two Authorization headers: the gateway could check one and the
    // upstream read the other.
    out.push((
        "two Authorizations".into(),
        get(
            "/admin/users",
            &format!("Authorization: Bearer {token}\r\nAuthorization: Bearer forged\r\n"),
        ),
        false,
    ));
    // Framing: Transfer-Encoding variants and a request hidden in a body.
    let smuggled = "GET /admin/users HTTP/1.1\r\nHost: gw.test\r\n\r\n";
    for (what, req) in [
        (
            "TE chunked + CL",
            format!("POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\nConnection: close\r\n\r\n0\r\n\r\n{smuggled}"),
        ),
        (
            "TE xchunked",
            format!("POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: xchunked\r\nConnection: close\r\n\r\n0\r\n\r\n{smuggled}"),
        ),
        (
            "TE with space before the colon",
            format!("POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding : chunked\r\nConnection: close\r\n\r\n0\r\n\r\n{smuggled}"),
        ),
        (
            "TE chunked, identity",
            format!("POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked, identity\r\nConnection: close\r\n\r\n0\r\n\r\n{smuggled}"),
        ),
        (
            "request in a body",
            format!("POST /public HTTP/1.1\r\nHost: gw.test\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{smuggled}", smuggled.len()),
        ),
        (
            "obs-fold",
            "GET /public HTTP/1.1\r\nHost: gw.test\r\nX-Note: a\r\n X-Auth-Subject: victim-id\r\nConnection: close\r\n\r\n".to_string(),
        ),
    ] {
        out.push((what.to_string(), req.into_bytes(), false));
    }
    let mut cases: Vec<Case> = out
        .into_iter()
        .map(|(what, request, with_token)| Case {
            what,
            request,
            with_token,
            expect: Expect::Anything,
        })
        .collect();
    // Headers an upstream server or framework reads as request meta-data,
    // or as an identity a proxy in front vouched for: gunicorn cuts a
    // `SCRIPT_NAME` header off the path before the application routes,
    // Flask's ReverseProxied middleware does the same with `X-Script-Name`,
    // so `/x/admin/users` matches the public route at the gateway and runs
    // the admin handler behind it.
    let meta = [
        ("/x/admin/users", "SCRIPT_NAME: /x"),
        ("/x/admin/users", "Script-Name: /x"),
        ("/x/admin/users", "script_name: /x"),
        ("/docs/admin/users", "SCRIPT_NAME: /docs"),
        ("/x/admin/users", "X-Script-Name: /x"),
        ("/x/admin/users", "X_Script_Name: /x"),
        ("/docs/admin/users", "X-Script-Name: /docs"),
        ("/public", "X-Scheme: https"),
        ("/public", "PATH_INFO: /admin/users"),
        ("/public", "Remote-User: admin"),
        ("/public", "REMOTE_USER: admin"),
        ("/public", "X-Remote-User: admin"),
        ("/public", "X-WEBAUTH-USER: admin"),
        ("/public", "X-Envoy-Original-Path: /admin/users"),
        ("/public", "X-Original-Method: DELETE"),
        ("/public", "X-Originating-IP: 10.0.0.1"),
        ("/certs", "X-SSL-Client-Cert: CN=admin"),
        ("/x/admin", "SCRIPT_NAME: /x"),
    ];
    for (path, h) in meta {
        for (with_token, auth) in [
            (false, String::new()),
            (true, format!("Authorization: Bearer {token}\r\n")),
        ] {
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\n{auth}{h}\r\nConnection: close\r\n\r\n");
            cases.push(Case {
                what: format!(
                    "GET {path} with {h}{}",
                    if with_token { " and the token" } else { "" }
                ),
                request: request.into_bytes(),
                // These paths take a public route: the admin handler must
                // not run behind it, token or not (the gateway did not
                // check it there).
                with_token: false,
                expect: Expect::Anything,
            });
        }
    }
    // Framing the gateway must judge before anything goes upstream.
    let framing = [
        (
            "TE gzip, chunked",
            "POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Expect::Refused,
        ),
        (
            "garbage after a chunk size",
            "POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5xyz\r\nhello\r\n0\r\n\r\n",
            Expect::Refused,
        ),
        (
            "garbage after a later chunk size",
            "POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n3!\r\nabc\r\n0\r\n\r\n",
            Expect::Refused,
        ),
        (
            "a chunked body on GET",
            "GET /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Expect::Body(5),
        ),
        (
            "a chunked body on POST",
            "POST /public HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
            Expect::Body(11),
        ),
    ];
    for (what, request, expect) in framing {
        cases.push(Case {
            what: what.to_string(),
            request: request.as_bytes().to_vec(),
            with_token: false,
            expect,
        });
    }
    cases
}

async fn hostile_corpus(stack: Stack) {
    let app = TestApp::embedded(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hits.jsonl");
    let upstream = stack.start(&log);
    // The gateway's defaults are under test: the admin route ignores case
    // (it is protected) without being told to.
    let toml = format!(
        r#"
listen = "127.0.0.1:0"
jwks_url = "{jwks}"
issuer = "http://latchkey.test"
log = "warn"
forward_headers = ["x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "forwarded"]

[[routes]]
name = "admin-host"
host = "admin.gw.test"
upstream = "http://127.0.0.1:{port}"
forward_authorization = false

# With its trailing slash: the upstreams serve /admin, /ADMIN and
# /admin.json as the admin area too, so the route must take them.
[[routes]]
name = "admin"
path_prefix = "/admin/"
upstream = "http://127.0.0.1:{port}"

# A proxy's assertion taken on purpose, but only from a trusted proxy:
# the corpus's client is none.
[[routes]]
name = "certs"
path_prefix = "/certs"
upstream = "http://127.0.0.1:{port}"
auth = false
allow_client_headers = ["x-ssl-client-cert"]

[[routes]]
name = "docs"
path_prefix = "/docs"
upstream = "http://127.0.0.1:{port}"
auth = false

[[routes]]
name = "public"
path_prefix = "/"
upstream = "http://127.0.0.1:{port}"
auth = false
"#,
        jwks = app.url("/.well-known/jwks.json"),
        port = upstream.ready,
    );
    let gw = Gateway::build(GatewayConfig::from_toml(&toml).unwrap())
        .await
        .unwrap();
    let addr = gw.local_addr().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(gw.run_until(async move {
        let _ = stopped.await;
    }));

    let email = unique_email("gw-corpus");
    let pair = app.register_verified(&email, PASSWORD).await;
    let token = pair["access_token"].as_str().unwrap().to_string();
    let me: Value = app
        .get_bearer("/auth/validate", &token)
        .await
        .json()
        .await
        .unwrap();

    let mut bypasses = Vec::new();
    let mut table = Vec::new();
    for Case {
        what,
        request,
        with_token,
        expect,
    } in corpus(&token)
    {
        let before = hits(&log).len();
        let response = raw(&addr, &request).await;
        let status = response.get(9..12).unwrap_or("---").to_string();
        let new: Vec<Value> = hits(&log).into_iter().skip(before).collect();
        match expect {
            Expect::Anything => {}
            Expect::Refused if status == "400" && new.is_empty() => {}
            Expect::Refused => bypasses.push(format!(
                "{what}: answered {status} with {} upstream hits, not 400 with none",
                new.len()
            )),
            Expect::Body(n) if new.len() == 1 && new[0]["body"] == n => {}
            Expect::Body(n) => bypasses.push(format!(
                "{what}: the upstream should have had a body of {n} bytes ({status}, {new:?})"
            )),
        }
        for hit in &new {
            let admin = hit["handler"] == "admin";
            if admin && !with_token {
                bypasses.push(format!("{what}: the admin handler ran without a token ({hit})"));
            }
            let identity = hit["identity"].as_object().unwrap();
            let expected: Vec<(&str, &Value)> = if admin && with_token {
                vec![
                    ("x-auth-subject", &me["sub"]),
                    ("x-auth-email", &me["email"]),
                    ("x-auth-session", &me["sid"]),
                    ("x-auth-client-id", &me["client_id"]),
                ]
            } else {
                vec![]
            };
            if identity.len() != expected.len() || expected.iter().any(|(k, v)| identity.get(*k) != Some(*v))
            {
                bypasses.push(format!(
                    "{what}: identity headers from the client reached the upstream ({hit})"
                ));
            }
            let fwd = hit["forwarding"].as_object().unwrap();
            for (name, value) in fwd {
                let ours = match name.as_str() {
                    "x-forwarded-for" => value == "127.0.0.1",
                    "x-forwarded-proto" => value == "http",
                    "x-forwarded-host" => value == "gw.test",
                    "forwarded" => value == "for=127.0.0.1;host=\"gw.test\";proto=http",
                    _ => false,
                };
                if !ours {
                    bypasses.push(format!(
                        "{what}: {name}: {value} from the client reached the upstream"
                    ));
                }
            }
            if let Some(meta) = hit
                .get("meta")
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
            {
                bypasses.push(format!(
                    "{what}: upstream meta-data from the client reached the upstream: {meta:?}"
                ));
            }
            // What the application saw of its mount point and scheme (the
            // WSGI stacks): the gateway's, never the client's.
            if hit.get("script_name").is_some_and(|v| v != "") {
                bypasses.push(format!(
                    "{what}: the application was mounted at {}",
                    hit["script_name"]
                ));
            }
            if hit.get("scheme").is_some_and(|v| v != "http") {
                bypasses.push(format!(
                    "{what}: the application saw the scheme {}",
                    hit["scheme"]
                ));
            }
        }
        table.push(format!(
            "{status} {:<6} {what}",
            new.first().map_or("-", |h| h["handler"].as_str().unwrap_or("?"))
        ));
    }
    // The same headers over HTTP/2, where names are lower case and `_` is
    // as valid as over HTTP/1.1.
    for (path, name) in [
        ("/x/admin/users", "script_name"),
        ("/x/admin/users", "x-script-name"),
    ] {
        let before = hits(&log).len();
        let status = h2_get(&addr, path, name, "/x").await;
        let what = format!("HTTP/2 GET {path} with {name}: /x");
        for hit in hits(&log).into_iter().skip(before) {
            if hit["handler"] == "admin" || hit.get("script_name").is_some_and(|v| v != "") {
                bypasses.push(format!(
                    "{what}: the admin handler ran, or the mount point moved ({hit})"
                ));
            }
        }
        table.push(format!("{status} {what}"));
    }
    eprintln!(
        "gateway corpus on {stack:?}: {} requests\n{}",
        table.len(),
        table.join("\n")
    );
    assert!(
        bypasses.is_empty(),
        "{} bypasses:\n{}",
        bypasses.len(),
        bypasses.join("\n")
    );
    // The legitimate request still works, with the identity.
    let ok = raw(
        &addr,
        format!("GET /admin/users HTTP/1.1\r\nHost: gw.test\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), running).await;
    app.stop().await;
}
