//! Importing accounts with the password hashes of other systems: vectors
//! made by third-party implementations (tests/support/hash_vectors.py) log
//! in, and the first login turns the stored hash into the configured
//! argon2id; the import command streams a file, reports bad lines without
//! stopping, and is idempotent.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, unique_email, TestApp, SECRET_KEY};

crate::on_every_backend!(
    every_third_party_hash_logs_in_and_becomes_argon2id,
    a_hash_over_the_budget_is_refused_at_import_and_never_verified,
);

/// The vectors: {"format", "password", "record"} per hash.
fn vectors(tag: &str) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/hash_vectors.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(tag)
        .output()
        .expect("python3 runs tests/support/hash_vectors.py");
    assert!(
        out.status.success(),
        "hash_vectors.py failed (pip install bcrypt passlib django argon2-cffi): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(v.len(), 15, "{text}");
    v
}

async fn admin(app: &TestApp) -> String {
    app.admin_client().await.1
}

/// The hash of the attack: scrypt with ln=18, r=32, p=4 (1 GiB, over a
/// minute of a core per verification).
const STALLING_SCRYPT: &str =
    "$scrypt$ln=18,r=32,p=4$c2FsdHNhbHQ$AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI";

/// An imported hash that would cost more than the budget to verify is
/// refused at import with its cost, and one stored before the budget
/// existed never verifies (it costs nothing: it is not even tried).
async fn a_hash_over_the_budget_is_refused_at_import_and_never_verified(app: &TestApp) {
    let token = admin(app).await;
    let email = unique_email("stall");
    let r = app
        .http
        .post(app.url("/admin/users"))
        .bearer_auth(&token)
        .json(&json!({"email": email, "password_hash": STALLING_SCRYPT}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("1024 MiB") && message.contains("at most 64 MiB"),
        "{message}"
    );
    // As if imported by an earlier version: the login is refused at once.
    let ok = json!({"email": email, "password_hash": "$2b$04$EGdrhbKUv8Oc9vGiXX0HQOxSg445d458Muh7DAHskb6QbtCvdxcie"});
    let r = app
        .http
        .post(app.url("/admin/users"))
        .bearer_auth(&token)
        .json(&ok)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    app.sql(&format!(
        "UPDATE users SET password_hash = '{STALLING_SCRYPT}' WHERE email = '{email}'"
    ))
    .await;
    app.services.users.forget(&email);
    let start = Instant::now();
    assert_eq!(app.login(&email, "any password at all").await.status(), 401);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the hash was not run: {:?}",
        start.elapsed()
    );
}

/// Imported hashes of the greatest cost the budget admits (PBKDF2 at five
/// million iterations, about a second of a core each) cannot hold the
/// hashing pool: wrong passwords tried on several such accounts at once,
/// two at a time on each, take one thread of two (the lane of hashes of
/// other systems, one verification per account), and everybody else's
/// logins go on meanwhile. Without the lane, two such logins held both
/// threads and every other login and sign-up answered 503 OVERLOADED.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn imported_hashes_cannot_hold_the_hashing_pool() {
    // The default objective: a hash that cannot get a thread in time is shed.
    let app = TestApp::embedded(&[
        ("rate_limit", "off"),
        ("hash_threads", "2"),
        ("hash_latency_objective_ms", "500"),
    ])
    .await;
    let token = admin(&app).await;
    let slow: Vec<String> = (0..4).map(|i| unique_email(&format!("slow{i}"))).collect();
    for email in &slow {
        // A random hash: no password matches it, so every login is wrong.
        let hash = format!(
            "$pbkdf2-sha256$i=5000000$c2FsdHNhbHQ${}",
            "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA"
        );
        let r = app
            .http
            .post(app.url("/admin/users"))
            .bearer_auth(&token)
            .json(&json!({"email": email, "password_hash": hash}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }
    let normal = unique_email("normal");
    app.register_verified(&normal, crate::common::PASSWORD).await;
    let wrong: Vec<_> = slow
        .iter()
        .chain(slow.iter())
        .map(|email| {
            let (http, url, email) = (app.http.clone(), app.url("/auth/login"), email.clone());
            tokio::spawn(async move {
                let body = json!({"email": email, "password": "a wrong password"});
                http.post(url).json(&body).send().await.unwrap().status().as_u16()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut answers = Vec::new();
    for _ in 0..10 {
        answers.push(
            app.login(&normal, crate::common::PASSWORD)
                .await
                .status()
                .as_u16(),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut slow_answers = Vec::new();
    for w in wrong {
        slow_answers.push(w.await.unwrap());
    }
    assert!(answers.iter().all(|s| *s == 200), "the other logins: {answers:?}");
    assert!(
        slow_answers.iter().all(|s| *s == 401 || *s == 503),
        "{slow_answers:?}"
    );
    assert!(
        slow_answers.contains(&503),
        "eight at once cannot all have had a thread in time: {slow_answers:?}"
    );
}

async fn every_third_party_hash_logs_in_and_becomes_argon2id(app: &TestApp) {
    let token = admin(app).await;
    let tag = unique_email("imp").replace("@example.test", "");
    for v in vectors(&tag) {
        let format = v["format"].as_str().unwrap();
        let password = v["password"].as_str().unwrap();
        let email = v["record"]["email"].as_str().unwrap();
        let r = app
            .http
            .post(app.url("/admin/users"))
            .bearer_auth(&token)
            .json(&v["record"])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{format}: {}", r.text().await.unwrap());
        let created: Value = r.json().await.unwrap();
        assert_eq!(created["email"], email);
        assert_eq!(created["email_verified"], true);
        // The same email again: taken.
        let r = app
            .http
            .post(app.url("/admin/users"))
            .bearer_auth(&token)
            .json(&v["record"])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 409, "{format}");
        let stored = app.services.store.user_by_email(email).await.unwrap().unwrap();
        assert!(
            !stored.password_hash.starts_with("$argon2id$v=19$m=19456"),
            "{format}: imported as it came"
        );
        // A wrong password is wrong; the right one logs in.
        assert_eq!(
            app.login(email, "not the password at all").await.status(),
            401,
            "{format}"
        );
        let r = app.login(email, password).await;
        assert_eq!(r.status(), 200, "{format}: the right password of a {format} hash");
        // After the answer, the hash becomes the configured argon2id.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let u = app.services.store.user_by_email(email).await.unwrap().unwrap();
            let current = !app
                .services
                .shared
                .hashing
                .passwords()
                .needs_rehash(&u.password_hash);
            if u.password_hash.starts_with("$argon2id$") && current {
                break;
            }
            assert!(Instant::now() < deadline, "{format}: still {}", u.password_hash);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            app.login(email, password).await.status(),
            200,
            "{format}: after the rehash"
        );
        assert_eq!(
            app.login(email, "not the password at all").await.status(),
            401,
            "{format}"
        );
    }
    // Hashes that are not one, or beyond the limits: 400, nothing stored.
    let email = unique_email("imp-bad");
    for bad in [
        json!({"email": email, "password_hash": "plain text"}),
        json!({"email": email, "password_hash": "$2b$31$EGdrhbKUv8Oc9vGiXX0HQOxSg445d458Muh7DAHskb6QbtCvdxcie"}),
        json!({"email": email, "password_hash": "pbkdf2_sha256$999999999$salt$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
        json!({"email": email, "password_hash": "$argon2id$v=19$m=4194304,t=3,p=1$c2FsdHNhbHQ$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}),
        json!({"email": email}),
        json!({"email": email, "password": "long enough password", "password_hash": "$2b$04$EGdrhbKUv8Oc9vGiXX0HQOxSg445d458Muh7DAHskb6QbtCvdxcie"}),
        json!({"email": "not an email", "password": "long enough password"}),
    ] {
        let r = app
            .http
            .post(app.url("/admin/users"))
            .bearer_auth(&token)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "INVALID_REQUEST");
    }
    assert!(app.services.store.user_by_email(&email).await.unwrap().is_none());
    // A plain password through the admin API: hashed at once.
    let r = app
        .http
        .post(app.url("/admin/users"))
        .bearer_auth(&token)
        .json(&json!({"email": email, "password": "long enough password", "verified": true, "name": "Imported"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let u = app.services.store.user_by_email(&email).await.unwrap().unwrap();
    assert!(u.password_hash.starts_with("$argon2id$"));
    assert_eq!(app.login(&email, "long enough password").await.status(), 200);
}

fn latchkey(dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    c.current_dir(dir)
        .env("LATCHKEY_SECRET_KEY", SECRET_KEY)
        .env("LATCHKEY_LOG", "warn")
        .env("LATCHKEY_ADMIN_LISTEN", "off")
        .env_remove("LATCHKEY_DATABASE_URL")
        .env_remove("LATCHKEY_REDIS_URL");
    c
}

fn import(dir: &std::path::Path, file: &std::path::Path, update: bool) -> (String, String) {
    let mut c = latchkey(dir);
    c.args(["users", "import"]).arg(file);
    if update {
        c.arg("--update");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_import_command_reports_bad_lines_keeps_going_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let v = vectors("cli");
    let bcrypt = v.iter().find(|x| x["format"] == "bcrypt-2b").unwrap();
    let django = v.iter().find(|x| x["format"] == "django-pbkdf2-sha256").unwrap();
    let keycloak = v
        .iter()
        .find(|x| x["format"] == "keycloak-pbkdf2-sha512")
        .unwrap();
    let mut lines = [
        bcrypt["record"].to_string(),
        "this is not JSON".to_string(),
        json!({"email": "weird@example.test", "password_hash": "md5:abc"}).to_string(),
        String::new(),
        django["record"].to_string(),
        json!({"email": "plain@example.test", "password": "a plain password here"}).to_string(),
        keycloak["record"].to_string(),
        json!({"email": "stalling@example.test", "password_hash": STALLING_SCRYPT}).to_string(),
    ];
    let file = dir.path().join("users.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (out, err) = import(dir.path(), &file, false);
    assert!(
        out.contains("3 created, 0 updated, 0 skipped, 4 with errors"),
        "{out}"
    );
    assert!(
        err.contains("line 8: password_hash: verifying this hash would take about 1024 MiB"),
        "{err}"
    );
    assert!(err.contains("line 2: not an account object"), "{err}");
    assert!(
        err.contains("line 3: password_hash: unknown hash format"),
        "{err}"
    );
    assert!(
        err.contains("line 6: password: an import file takes hashes"),
        "{err}"
    );
    // Again: nothing new.
    let (out, _) = import(dir.path(), &file, false);
    assert!(out.contains("0 created, 0 updated, 3 skipped"), "{out}");
    // --update replaces; a changed name shows it.
    let mut rec = bcrypt["record"].clone();
    rec["name"] = "Renamed".into();
    lines[0] = rec.to_string();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (out, _) = import(dir.path(), &file, true);
    assert!(out.contains("0 created, 3 updated, 0 skipped"), "{out}");

    // The service on the same data logs the imported users in.
    let port = free_port();
    let mut child = latchkey(dir.path())
        .arg("serve")
        .env("LATCHKEY_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "LATCHKEY_MAIL",
            format!("file:{}", dir.path().join("mail").display()),
        )
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(format!("{base}/health/live")).send().await.is_err() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for x in [bcrypt, django, keycloak] {
        let r = http
            .post(format!("{base}/auth/login"))
            .json(&json!({"email": x["record"]["email"], "password": x["password"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", x["format"]);
    }
    let _ = child.kill();
    let _ = child.wait();
}
