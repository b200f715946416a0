//! Observability: every series the Grafana dashboard reads exists in
//! `/metrics`, and no password, code or token ever reaches a log line.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, unique_email, TestApp, PASSWORD, SECRET_KEY};

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
    let text = app.get("/metrics").await.text().await.unwrap();
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
