//! The gateway under attack: a corpus of hostile requests (path confusion,
//! header folding and smuggling, forwarding headers, request framing) sent
//! raw to the gateway in front of two real, deliberately lenient upstream
//! stacks (a WSGI server and Node's HTTP server; `tests/support/
//! lenient_upstream.*`). For every request: no handler that wants a
//! token ran without a valid one, and no identity or forwarding header
//! reached the upstream from the client.

use std::path::Path;
use std::time::Duration;

use latchkey::gateway::{Gateway, GatewayConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::common::{unique_email, SupportServer, TestApp, PASSWORD};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_wsgi() {
    hostile_corpus("lenient_upstream.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_never_reach_an_admin_handler_on_node() {
    hostile_corpus("lenient_upstream.js").await;
}

/// One raw HTTP/1.1 exchange; the connection is closed by the request.
async fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn hits(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// (what, request bytes, whether it carries the valid token).
fn corpus(token: &str) -> Vec<(String, Vec<u8>, bool)> {
    let mut out = Vec::new();
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
    out
}

async fn hostile_corpus(stack: &str) {
    let app = TestApp::embedded(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hits.jsonl");
    let upstream = SupportServer::start(stack, &[log.as_os_str()], "python3, or node for .js");
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

[[routes]]
name = "admin"
path_prefix = "/admin"
upstream = "http://127.0.0.1:{port}"
# The upstream routes without regard to case: so must the gateway.
case_sensitive = false

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
    for (what, request, with_token) in corpus(&token) {
        let before = hits(&log).len();
        let response = raw(&addr, &request).await;
        let status = response.get(9..12).unwrap_or("---").to_string();
        let new: Vec<Value> = hits(&log).into_iter().skip(before).collect();
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
        }
        table.push(format!(
            "{status} {:<6} {what}",
            new.first().map_or("-", |h| h["handler"].as_str().unwrap_or("?"))
        ));
    }
    eprintln!(
        "gateway corpus on {stack}: {} requests\n{}",
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
