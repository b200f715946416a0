//! Observability: every series the Grafana dashboard reads exists in
//! `/metrics`, no password, code or token ever reaches a log line, and spans
//! reach a real OTLP receiver as one trace per request (without secrets).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, unique_email, SupportServer, TestApp, PASSWORD, SECRET_KEY};

crate::on_every_backend!(every_metric_on_the_dashboard_exists);

/// Metric names used in the dashboard's queries.
fn dashboard_metrics() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/latchkey.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let bytes = expr.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                let rest = &expr[i..];
                let starts = (rest.starts_with("latchkey_") || rest.starts_with("process_"))
                    && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
                if starts {
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    names.push(rest[..end].to_string());
                    i += end;
                } else {
                    i += 1;
                }
            }
        }
    }
    names.sort();
    names.dedup();
    assert!(names.len() > 20, "{names:?}");
    names
}

async fn every_metric_on_the_dashboard_exists(app: &TestApp) {
    // Exercise the service so that every kind of series has a sample.
    let email = unique_email("metrics");
    let pair = app.register_verified(&email, PASSWORD).await;
    let at = pair["access_token"].as_str().unwrap();
    app.validate(at).await;
    app.validate(at).await;
    app.validate("garbage").await;
    app.login(&email, PASSWORD).await;
    app.login(&email, "wrong password").await;
    app.post("/auth/refresh", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    app.get("/health/ready").await;
    let text = app.metrics().await;
    let present = |name: &str| {
        text.lines()
            .any(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{')))
    };
    let mut missing = Vec::new();
    for name in dashboard_metrics() {
        let needs_redis = name.starts_with("latchkey_redis_") || name == "latchkey_ratelimit_fallback_total";
        let expected = !needs_redis || app.is_postgres();
        if expected && !present(&name) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "series used by the dashboard but absent from /metrics: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_code_or_token_reaches_a_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mail = dir.path().join("mail");
    let log_path = dir.path().join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_latchkey"))
        .arg("serve")
        .current_dir(dir.path())
        .env("LATCHKEY_LISTEN", format!("127.0.0.1:{port}"))
        .env("LATCHKEY_ADMIN_LISTEN", "off")
        .env("LATCHKEY_MAIL", format!("file:{}", mail.display()))
        .env("LATCHKEY_SECRET_KEY", SECRET_KEY)
        .env("LATCHKEY_LOG", "debug")
        .env("LATCHKEY_LOG_FORMAT", "json")
        .env_remove("LATCHKEY_DATABASE_URL")
        .env_remove("LATCHKEY_REDIS_URL")
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(format!("{base}/health/live")).send().await.is_err() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let post = |path: &str, body: Value| http.post(format!("{base}{path}")).json(&body).send();
    let email = unique_email("logs");
    let password = "unmistakable passphrase 1";
    let new_password = "unmistakable passphrase 2";
    let wait_code = |n: usize| {
        let (mail, email) = (mail.clone(), email.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let mails = crate::common::read_mails(&mail, &email);
                if mails.len() >= n {
                    return crate::common::code_in(&mails[n - 1].1).unwrap();
                }
                assert!(Instant::now() < deadline);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    };
    post("/auth/register", json!({"email": email, "password": password}))
        .await
        .unwrap();
    let code = wait_code(1).await;
    post("/auth/verify-otp", json!({"email": email, "code": "000000"}))
        .await
        .unwrap();
    let pair: Value = post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let login: Value = post("/auth/login", json!({"email": email, "password": password}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    post(
        "/auth/login",
        json!({"email": email, "password": "wrong but secret 1"}),
    )
    .await
    .unwrap();
    let refreshed: Value = post("/auth/refresh", json!({"refresh_token": login["refresh_token"]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let at = refreshed["access_token"].as_str().unwrap().to_string();
    http.get(format!("{base}/auth/validate"))
        .bearer_auth(&at)
        .send()
        .await
        .unwrap();
    http.get(format!("{base}/auth/me"))
        .header("authorization", format!("Bearer: {at}"))
        .send()
        .await
        .unwrap();
    http.post(format!("{base}/auth/password"))
        .bearer_auth(&at)
        .json(&json!({"current_password": password, "new_password": new_password}))
        .send()
        .await
        .unwrap();
    post("/auth/password-reset", json!({"email": email}))
        .await
        .unwrap();
    let reset = wait_code(2).await;
    post(
        "/auth/password-reset/confirm",
        json!({"email": email, "code": reset, "new_password": "unmistakable passphrase 3"}),
    )
    .await
    .unwrap();
    post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
        .await
        .unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.lines().count() > 10, "the server logged: {log}");
    assert!(log.contains("/auth/login"), "access log lines are there");
    let secrets = [
        password.to_string(),
        new_password.to_string(),
        "wrong but secret 1".to_string(),
        code,
        reset,
        pair["refresh_token"].as_str().unwrap().to_string(),
        pair["access_token"].as_str().unwrap().to_string(),
        login["refresh_token"].as_str().unwrap().to_string(),
        refreshed["refresh_token"].as_str().unwrap().to_string(),
        at.clone(),
        at.split('.').nth(2).unwrap().to_string(),
    ];
    for s in &secrets {
        assert!(!crate::dump::contains_word(&log, s), "a secret reached the log");
    }
}

/// The OTLP receiver of `tests/support/otlp_sink.py`: every span it parsed,
/// one JSON object per line of `out`.
struct OtlpSink {
    _server: SupportServer,
    port: u16,
    out: std::path::PathBuf,
}

impl OtlpSink {
    fn start(out: std::path::PathBuf) -> OtlpSink {
        let server = SupportServer::start(
            "otlp_sink.py",
            &[out.as_os_str(), "0".as_ref()],
            "pip install opentelemetry-proto",
        );
        let port = server.ready.parse().expect("otlp sink: READY <port>");
        OtlpSink {
            _server: server,
            port,
            out,
        }
    }

    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let spans: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        for s in &spans {
            assert!(s.get("error").is_none(), "the sink refused an export: {s}");
        }
        spans
    }
}

/// `latchkey serve` as a process (trace export is process-wide), embedded
/// backend, mail to files; stopped with SIGTERM on drop.
struct Served {
    child: std::process::Child,
    base: String,
    admin: String,
    mail: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(env: &[(&str, String)]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let (port, admin) = (free_port(), free_port());
        let mail = dir.path().join("mail");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_latchkey"));
        cmd.arg("serve")
            .current_dir(dir.path())
            .env("LATCHKEY_LISTEN", format!("127.0.0.1:{port}"))
            .env("LATCHKEY_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
            .env("LATCHKEY_MAIL", format!("file:{}", mail.display()))
            .env("LATCHKEY_SECRET_KEY", SECRET_KEY)
            .env("LATCHKEY_LOG", "warn")
            .env_remove("LATCHKEY_DATABASE_URL")
            .env_remove("LATCHKEY_REDIS_URL")
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let served = Served {
            child,
            base: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            mail,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while reqwest::get(served.url("/health/live")).await.is_err() {
            assert!(Instant::now() < deadline, "latchkey serve did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        served
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn wait_code(&self, email: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mails = crate::common::read_mails(&self.mail, email);
            if mails.len() >= n {
                return crate::common::code_in(&mails[n - 1].1).unwrap();
            }
            assert!(Instant::now() < deadline, "no mail #{n} to {email}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// SIGTERM, and the exit (which flushes the spans still queued).
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

mod otlp {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_spans_reach_a_collector_as_one_trace_per_request() {
        super::one_trace_per_request(Vec::new()).await;
    }

    #[sqlx::test(migrations = false)]
    async fn postgres_redis_spans_reach_a_collector_as_one_trace_per_request(
        _: sqlx::postgres::PgPoolOptions,
        opts: sqlx::postgres::PgConnectOptions,
    ) {
        let prefix = format!("t{}:", uuid::Uuid::new_v4().simple());
        super::one_trace_per_request(vec![
            ("LATCHKEY_DATABASE_URL", crate::common::pg_url(&opts)),
            ("LATCHKEY_REDIS_URL", crate::common::redis_url()),
            ("LATCHKEY_REDIS_KEY_PREFIX", prefix),
        ])
        .await;
    }
}

/// Registers, verifies and logs in (twice, once as a traced caller) with
/// export to a real OTLP receiver, and reads the traces it received.
async fn one_trace_per_request(mut env: Vec<(&str, String)>) {
    let redis = env.iter().any(|(k, _)| *k == "LATCHKEY_REDIS_URL");
    let dir = tempfile::tempdir().unwrap();
    let sink = OtlpSink::start(dir.path().join("spans.jsonl"));
    env.push((
        "LATCHKEY_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", sink.port),
    ));
    // Every login pays the hash, so that every login has a hash span.
    env.push(("LATCHKEY_CREDENTIAL_CACHE", "off".into()));
    let served = Served::start(&env).await;
    let http = reqwest::Client::new();
    let email = unique_email("otlp");
    let password = "unmistakable trace passphrase";
    let post = |path: &str, body: Value| http.post(served.url(path)).json(&body).send();
    let r = post("/auth/register", json!({"email": email, "password": password}))
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let code = served.wait_code(&email, 1).await;
    let pair: Value = post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let login = post("/auth/login", json!({"email": email, "password": password}))
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let login_id = login.headers()["x-request-id"].to_str().unwrap().to_string();
    let login: Value = login.json().await.unwrap();
    // A caller that is itself traced: the request joins its trace.
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let joined = http
        .post(served.url("/auth/login"))
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .header("x-request-id", "joined-login")
        .json(&json!({"email": email, "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), 200);
    let joined: Value = joined.json().await.unwrap();
    served.stop(); // flushes

    let deadline = Instant::now() + Duration::from_secs(10);
    let request_of = |spans: &[Value], id: &str| {
        spans
            .iter()
            .find(|s| s["name"] == "request" && attr(s, "request_id") == id)
            .cloned()
    };
    let spans = loop {
        let spans = sink.spans();
        if request_of(&spans, &login_id).is_some() && request_of(&spans, "joined-login").is_some() {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "the login spans did not arrive; the sink has: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for s in &spans {
        assert_eq!(s["service"], "latchkey", "{s}");
    }
    let children = |parent: &Value| -> Vec<Value> {
        spans
            .iter()
            .filter(|s| s["parentSpanId"] == parent["spanId"])
            .inspect(|s| assert_eq!(s["traceId"], parent["traceId"], "a child in another trace: {s}"))
            .cloned()
            .collect()
    };

    // The login: a root request span, its database calls and its hash as
    // children in the same trace.
    let request = request_of(&spans, &login_id).unwrap();
    assert_eq!(request["parentSpanId"], "", "{request}");
    assert_eq!(request["kind"], 2, "SPAN_KIND_SERVER: {request}");
    assert_eq!(attr(&request, "path"), "/auth/login");
    assert_eq!(attr(&request, "route"), "/auth/login");
    assert_eq!(attr(&request, "method"), "POST");
    assert_eq!(attr(&request, "status"), 200);
    let kids = children(&request);
    let db: Vec<&Value> = kids.iter().filter(|s| s["name"] == "db").collect();
    assert!(
        db.iter().any(|s| attr(s, "op") == "create_session"),
        "no db span for the new session among {kids:#?}"
    );
    for s in &db {
        assert_eq!(s["kind"], 3, "SPAN_KIND_CLIENT: {s}");
        assert!(attr(s, "acquire_us").is_i64(), "the pool wait is recorded: {s}");
        assert!(
            s["start"].as_u64() >= request["start"].as_u64() && s["end"].as_u64() <= request["end"].as_u64(),
            "a child outside its request's time: {s} in {request}"
        );
    }
    let hash: Vec<&Value> = kids.iter().filter(|s| s["name"] == "hash").collect();
    assert_eq!(hash.len(), 1, "one password verification: {kids:#?}");
    assert_eq!(attr(hash[0], "op"), "verify");
    assert!(
        attr(hash[0], "wait_us").is_i64() && attr(hash[0], "hash_us").as_i64() > Some(0),
        "{}",
        hash[0]
    );
    if redis {
        // The login's rate-limit check asked Redis.
        let r: Vec<&Value> = kids.iter().filter(|s| s["name"] == "redis").collect();
        assert!(
            r.iter().any(|s| attr(s, "op") == "ratelimit"),
            "no redis span among {kids:#?}"
        );
        assert!(r.iter().all(|s| s["kind"] == 3));
    }

    // Registering hashed the password in its own trace.
    let register = spans
        .iter()
        .find(|s| s["name"] == "request" && attr(s, "path") == "/auth/register")
        .expect("the register request span");
    assert_ne!(register["traceId"], request["traceId"]);
    let kids = children(register);
    assert!(
        kids.iter()
            .any(|s| s["name"] == "hash" && attr(s, "op") == "hash"),
        "{kids:#?}"
    );
    // It read the address's state, then wrote what the decision planned.
    for op in ["registration_state", "apply_registration"] {
        assert!(
            kids.iter().any(|s| s["name"] == "db" && attr(s, "op") == op),
            "no {op} span among {kids:#?}"
        );
    }

    // The traced caller's login is in the caller's trace, under its span.
    let request = request_of(&spans, "joined-login").unwrap();
    assert_eq!(request["traceId"], caller_trace);
    assert_eq!(request["parentSpanId"], caller_span);
    assert!(children(&request).iter().any(|s| s["name"] == "hash"));

    // Nothing secret in any span.
    let text = std::fs::read_to_string(&sink.out).unwrap();
    let secrets = [
        password.to_string(),
        code,
        pair["access_token"].as_str().unwrap().to_string(),
        pair["refresh_token"].as_str().unwrap().to_string(),
        login["access_token"].as_str().unwrap().to_string(),
        login["refresh_token"].as_str().unwrap().to_string(),
        joined["refresh_token"].as_str().unwrap().to_string(),
    ];
    for s in &secrets {
        assert!(!crate::dump::contains_word(&text, s), "a secret reached a span");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_costs_requests_nothing() {
    // Nothing listens there: every export fails.
    let served = Served::start(&[(
        "LATCHKEY_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", free_port()),
    )])
    .await;
    let http = reqwest::Client::new();
    for _ in 0..20 {
        let r = http.get(served.url("/health/ready")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = http
            .get(format!("{}/metrics", served.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dropped = text
            .lines()
            .find_map(|l| l.strip_prefix("latchkey_otlp_dropped_spans_total{reason=\"export_failed\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if dropped >= 20.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "failed exports are not counted: {dropped}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    served.stop();
}
