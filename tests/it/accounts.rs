//! Every row and rule of API.md's Accounts section, on every backend.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};

crate::on_every_backend!(
    register_verify_login_and_me,
    register_rejects_bad_input_and_stores_nothing,
    registering_a_known_email_changes_nothing_and_reveals_nothing,
    a_new_code_replaces_the_old_one,
    five_wrong_codes_kill_the_code,
    expired_and_used_codes_are_refused,
    resend_sends_at_most_one_mail_per_minute,
    login_errors_do_not_enumerate,
    refresh_rotates_and_the_grace_window_returns_the_same_token,
    concurrent_refreshes_agree_and_keep_the_session,
    a_refresh_token_that_does_not_name_its_session_is_refused,
    a_refresh_the_session_limit_refuses_exchanges_nothing,
    many_sessions_refreshing_at_once_each_get_their_own_successor,
    logout_revokes_the_session_and_its_access_tokens,
    password_change_revokes_other_sessions,
    password_reset_flow,
    nothing_secret_is_stored_in_clear,
    a_sign_up_remembers_its_password_for_the_login_that_follows,
    racing_sign_ups_of_one_email_leave_at_most_one_password_remembered,
);

fn is_token_pair(v: &Value) {
    assert!(v["access_token"].as_str().unwrap().split('.').count() == 3, "{v}");
    assert_eq!(v["token_type"], "Bearer");
    assert_eq!(v["expires_in"], 900);
    assert!(v["refresh_token"].as_str().unwrap().len() >= 43);
    let r = v["refresh_expires_in"].as_u64().unwrap();
    assert!(r > 29 * 86_400 && r <= 30 * 86_400, "{r}");
}

async fn error_code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert!(body["message"].is_string(), "{body}");
    (status, body["error"].as_str().unwrap().to_string())
}

async fn register_verify_login_and_me(app: &TestApp) {
    let email = unique_email("flow");
    let r = app
        .post(
            "/auth/register",
            json!({"email": format!("  {}  ", email.to_uppercase()), "password": PASSWORD, "name": "Ada"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "VERIFICATION_PENDING");
    assert!(body["message"].is_string());

    // The email was normalised; its mail carries the code alone on a line.
    let (subject, text) = app.wait_for_mail(&email, 1).await;
    assert!(!subject.is_empty());
    let code = crate::common::code_in(&text).unwrap();

    // Right password before verification: VERIFICATION_PENDING.
    assert_eq!(
        error_code(app.login(&email, PASSWORD).await).await,
        (401, "VERIFICATION_PENDING".into())
    );
    // Wrong password before verification: no hint that the account exists.
    assert_eq!(
        error_code(app.login(&email, "wrong password").await).await,
        (401, "INVALID_CREDENTIALS".into())
    );

    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-store");
    let pair: Value = r.json().await.unwrap();
    is_token_pair(&pair);

    let r = app.login(&email, PASSWORD).await;
    assert_eq!(r.status(), 200);
    let pair2: Value = r.json().await.unwrap();
    is_token_pair(&pair2);
    assert_ne!(pair["refresh_token"], pair2["refresh_token"]);

    let r = app
        .get_bearer("/auth/me", pair2["access_token"].as_str().unwrap())
        .await;
    assert_eq!(r.status(), 200);
    let me: Value = r.json().await.unwrap();
    assert_eq!(me["email"], email);
    assert_eq!(me["name"], "Ada");
    assert_eq!(me["email_verified"], true);
    assert!(me["id"].is_string());
    assert!(me["created_at"].as_str().unwrap().ends_with('Z'));

    // `Bearer:` and a lower-case scheme are accepted too.
    let at = pair2["access_token"].as_str().unwrap();
    for h in [format!("Bearer: {at}"), format!("bearer {at}")] {
        let r = app
            .http
            .get(app.url("/auth/me"))
            .header("authorization", h)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = app.get("/auth/me").await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer error=\"invalid_token\"");
}

async fn register_rejects_bad_input_and_stores_nothing(app: &TestApp) {
    let cases: Vec<(Value, &str)> = vec![
        (json!({"email": "not-an-email", "password": PASSWORD}), "email"),
        (json!({"email": "a@b@c", "password": PASSWORD}), "email"),
        (
            json!({"email": format!("{}@x.io", "a".repeat(260)), "password": PASSWORD}),
            "email",
        ),
        (
            json!({"email": "ok@example.test", "password": "short"}),
            "password",
        ),
        (
            json!({"email": "ok@example.test", "password": "x".repeat(129)}),
            "password",
        ),
        (json!({"email": "ok@example.test"}), "password"),
        (json!({"password": PASSWORD}), "email"),
        (json!({"email": 42, "password": PASSWORD}), "email"),
        (
            json!({"email": "ok@example.test", "password": PASSWORD, "name": 7}),
            "name",
        ),
        (json!(["not", "an", "object"]), "body"),
    ];
    for (body, field) in cases {
        let r = app.post("/auth/register", body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"], "INVALID_REQUEST");
        assert!(e["message"].as_str().unwrap().starts_with(field), "{body} -> {e}");
    }
    for raw in ["{", "{\"email\":", "", "null", "{} extra"] {
        let r = app.post_raw("/auth/register", raw).await;
        assert_eq!(r.status(), 400, "{raw:?}");
    }
    // 128 Unicode scalar values is fine even though it is more bytes.
    let ok = unique_email("unicode");
    app.register(&ok, &"é".repeat(128)).await;
    assert!(app
        .services
        .store
        .user_by_email("ok@example.test")
        .await
        .unwrap()
        .is_none());
    // Larger than 16 KiB: 413.
    let big = "x".repeat(17 * 1024);
    let r = app
        .post(
            "/auth/register",
            json!({"email": "big@example.test", "password": big}),
        )
        .await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "PAYLOAD_TOO_LARGE");
}

async fn registering_a_known_email_changes_nothing_and_reveals_nothing(app: &TestApp) {
    let email = unique_email("dup");
    app.register_verified(&email, PASSWORD).await;
    let before = app.services.store.user_by_email(&email).await.unwrap().unwrap();

    let r = app
        .post(
            "/auth/register",
            json!({"email": email, "password": "another password", "name": "Mallory"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "VERIFICATION_PENDING");

    // A notice (no code) goes to the owner; nothing stored changed.
    let (_, notice) = app.wait_for_mail(&email, 2).await;
    assert!(crate::common::code_in(&notice).is_none(), "{notice}");
    let after = app.services.store.user_by_email(&email).await.unwrap().unwrap();
    assert_eq!(before.password_hash, after.password_hash);
    assert_eq!(before.name, after.name);
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    assert_eq!(app.login(&email, "another password").await.status(), 401);
}

async fn a_new_code_replaces_the_old_one(app: &TestApp) {
    let email = unique_email("replace");
    app.register(&email, PASSWORD).await;
    let first = app.wait_for_code(&email, 1).await;
    // Registering again (unverified), past the resend pause, sends a fresh
    // code. (Within it, the same password is a repeat and sends nothing:
    // attacks.rs, `a_registration_sent_twice_is_one_registration`.)
    app.sql("UPDATE codes SET created_at = created_at - 120000").await;
    app.register(&email, PASSWORD).await;
    let second = app.wait_for_code(&email, 2).await;
    if first != second {
        let r = app
            .post("/auth/verify-otp", json!({"email": email, "code": first}))
            .await;
        assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
    }
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": second}))
        .await;
    assert_eq!(r.status(), 200);
    // Single use.
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": second}))
        .await;
    assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
    // The same password twice is no contest: it is the account's now.
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
}

fn wrong_code(right: &str) -> String {
    format!("{:06}", (right.parse::<u32>().unwrap() + 1) % 1_000_000)
}

async fn five_wrong_codes_kill_the_code(app: &TestApp) {
    let email = unique_email("tries");
    app.register(&email, PASSWORD).await;
    let code = app.wait_for_code(&email, 1).await;
    for _ in 0..5 {
        let r = app
            .post(
                "/auth/verify-otp",
                json!({"email": email, "code": wrong_code(&code)}),
            )
            .await;
        assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
    }
    // The code is dead: even the right one is refused.
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await;
    assert_eq!(error_code(r).await, (429, "TOO_MANY_ATTEMPTS".into()));
    // Unknown emails and malformed codes.
    let r = app
        .post(
            "/auth/verify-otp",
            json!({"email": unique_email("nobody"), "code": "123456"}),
        )
        .await;
    assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": "12345"}))
        .await;
    assert_eq!(error_code(r).await, (400, "INVALID_REQUEST".into()));
}

async fn expired_and_used_codes_are_refused(app: &TestApp) {
    let email = unique_email("expired");
    app.register(&email, PASSWORD).await;
    let code = app.wait_for_code(&email, 1).await;
    // Age the code past its 10 minutes.
    app.sql("UPDATE codes SET expires_at = expires_at - 600001").await;
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await;
    assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
}

async fn resend_sends_at_most_one_mail_per_minute(app: &TestApp) {
    let email = unique_email("resend");
    // Unknown email: same answer, no mail.
    let r = app.post("/auth/resend-otp", json!({"email": email})).await;
    assert_eq!(r.status(), 202);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "SENT"}));
    app.register(&email, PASSWORD).await;
    app.wait_for_mail(&email, 1).await;
    for _ in 0..3 {
        let r = app.post("/auth/resend-otp", json!({"email": email})).await;
        assert_eq!(r.status(), 202);
    }
    // Pretend the last code was sent two minutes ago: the next resend sends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.mails_to(&email).len(), 1, "resend within 60 s sent nothing");
    app.sql("UPDATE codes SET created_at = created_at - 120000").await;
    let r = app.post("/auth/resend-otp", json!({"email": email})).await;
    assert_eq!(r.status(), 202);
    let code = app.wait_for_code(&email, 2).await;
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await;
    assert_eq!(r.status(), 200);
    let r = app.post("/auth/resend-otp", json!({"email": "nope"})).await;
    assert_eq!(r.status(), 400);
}

async fn login_errors_do_not_enumerate(app: &TestApp) {
    let email = unique_email("enum");
    app.register_verified(&email, PASSWORD).await;
    let unknown = unique_email("ghost");
    let a = app.login(&email, "wrong password").await;
    let b = app.login(&unknown, "wrong password").await;
    assert_eq!(a.status(), 401);
    assert_eq!(b.status(), 401);
    assert_eq!(a.text().await.unwrap(), b.text().await.unwrap());

    // An unknown email costs an argon2 verification like a wrong password,
    // judged against the same run's noise (`timing.rs`): rounds of two
    // unknown emails (A, A') and a known account's wrong password (B), each
    // account used at most four times (under the brute-force delays).
    let accounts: Vec<String> = (0..4).map(|i| unique_email(&format!("enum{i}"))).collect();
    for a in &accounts {
        app.register_verified(a, PASSWORD).await;
    }
    let verdict = crate::timing::compare(16, Duration::ZERO, |class, round| {
        let email = match class {
            crate::timing::Class::B => accounts[round % accounts.len()].clone(),
            _ => unique_email("ghost"),
        };
        async move {
            let r = app.login(&email, &format!("wrong password {round}")).await;
            assert_eq!(r.status(), 401);
        }
    })
    .await;
    eprintln!("login, wrong password (B) against unknown email (A): {verdict}");
    assert!(
        !verdict.differs(1.5),
        "the time tells the account exists: {verdict}"
    );
    assert!(
        verdict.median_a_ms > 3.0,
        "an unknown email must pay the hash: {verdict}"
    );

    let r = app.login("x", PASSWORD).await;
    assert_eq!(r.status(), 400);
    let r = app.login(&email, "short").await;
    assert_eq!(r.status(), 400);
}

async fn refresh_rotates_and_the_grace_window_returns_the_same_token(app: &TestApp) {
    let email = unique_email("rotate");
    let pair = app.register_verified(&email, PASSWORD).await;
    let t0 = pair["refresh_token"].as_str().unwrap().to_string();
    let r = app.post("/auth/refresh", json!({"refresh_token": t0})).await;
    assert_eq!(r.status(), 200);
    let p1: Value = r.json().await.unwrap();
    is_token_pair(&p1);
    let t1 = p1["refresh_token"].as_str().unwrap().to_string();
    assert_ne!(t0, t1);
    // Within the grace window, the old token gives the same new token.
    let r = app.post("/auth/refresh", json!({"refresh_token": t0})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["refresh_token"], t1.as_str());
    // The new token works and rotates again.
    let r = app.post("/auth/refresh", json!({"refresh_token": t1})).await;
    assert_eq!(r.status(), 200);
    // Unknown, empty or malformed tokens.
    for bad in [
        json!({"refresh_token": "nope"}),
        json!({"refresh_token": ""}),
        json!({}),
    ] {
        let r = app.post("/auth/refresh", bad.clone()).await;
        assert!(matches!(r.status().as_u16(), 400 | 401), "{bad}");
    }
    let r = app
        .post("/auth/refresh", json!({"refresh_token": "x".repeat(43)}))
        .await;
    assert_eq!(error_code(r).await, (401, "INVALID_TOKEN".into()));

    // After the window: reuse revokes the whole session.
    let short = TestApp::config(&app.settings); // the app's own settings, grace shortened below
    assert_eq!(short.accounts.refresh_grace, Duration::from_secs(10));
    app.sql("UPDATE refresh_tokens SET rotated_at = rotated_at - 11000 WHERE rotated_at IS NOT NULL")
        .await;
    let access = p1["access_token"].as_str().unwrap();
    assert_eq!(app.validate(access).await, 200);
    let r = app.post("/auth/refresh", json!({"refresh_token": t0})).await;
    assert_eq!(error_code(r).await, (401, "INVALID_TOKEN".into()));
    // The family is dead: the newest token fails too, and so do its access tokens.
    let r = app.post("/auth/refresh", json!({"refresh_token": t1})).await;
    assert_eq!(r.status(), 401);
    assert_eq!(app.validate(access).await, 401);
}

async fn concurrent_refreshes_agree_and_keep_the_session(app: &TestApp) {
    let email = unique_email("tabs");
    let pair = app.register_verified(&email, PASSWORD).await;
    let t0 = pair["refresh_token"].as_str().unwrap().to_string();
    let mut handles = Vec::new();
    for _ in 0..10 {
        let (http, url, t) = (app.http.clone(), app.url("/auth/refresh"), t0.clone());
        handles.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .json(&json!({"refresh_token": t}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }));
    }
    let mut tokens = Vec::new();
    for h in handles {
        let (status, body) = h.await.unwrap();
        assert_eq!(status, 200, "{body}");
        tokens.push(body["refresh_token"].as_str().unwrap().to_string());
    }
    tokens.dedup();
    assert_eq!(tokens.len(), 1, "every concurrent refresh got the same new token");
    // The exchange happened once: the family is the old token, exchanged
    // and holding its sealed successor, and one live token.
    let family = format!(
        "FROM refresh_tokens WHERE session_id = (SELECT session_id FROM refresh_tokens r JOIN sessions s \
         ON s.id = r.session_id JOIN users u ON u.id = s.user_id WHERE u.email = '{email}' LIMIT 1)"
    );
    assert_eq!(app.count(&format!("SELECT count(*) {family}")).await, 2);
    let exchanged = format!("SELECT count(*) {family} AND rotated_at IS NOT NULL AND successor IS NOT NULL");
    assert_eq!(app.count(&exchanged).await, 1);
    let r = app
        .post("/auth/refresh", json!({"refresh_token": tokens[0]}))
        .await;
    assert_eq!(r.status(), 200, "the session is still valid");
}

/// A SQL literal of `bytes` for the app's backend.
fn blob(app: &TestApp, bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if app.is_postgres() {
        format!("'\\x{hex}'::bytea")
    } else {
        format!("X'{hex}'")
    }
}

async fn refresh_to(app: &TestApp, token: &str) -> String {
    let r = app.post("/auth/refresh", json!({"refresh_token": token})).await;
    assert_eq!(r.status(), 200);
    let pair: Value = r.json().await.unwrap();
    is_token_pair(&pair);
    pair["refresh_token"].as_str().unwrap().to_string()
}

/// Every refresh token names its session (no release issued another form):
/// a token of any other form is refused as an unknown one, even when the
/// database holds its hash, and nothing is exchanged.
async fn a_refresh_token_that_does_not_name_its_session_is_refused(app: &TestApp) {
    use latchkey::crypto::{random_token, sha256};

    let pair = app.register_verified(&unique_email("otherform"), PASSWORD).await;
    let current = pair["refresh_token"].as_str().unwrap();
    assert_eq!(current.len(), 86);
    let other = random_token();
    app.sql(&format!(
        "UPDATE refresh_tokens SET token_hash = {} WHERE token_hash = {}",
        blob(app, &sha256(other.as_bytes())),
        blob(app, &sha256(current.as_bytes()))
    ))
    .await;
    let r = app.post("/auth/refresh", json!({"refresh_token": other})).await;
    assert_eq!(error_code(r).await, (401, "INVALID_TOKEN".into()));
    let row = format!(
        "SELECT count(*) FROM refresh_tokens WHERE token_hash = {} AND rotated_at IS NULL",
        blob(app, &sha256(other.as_bytes()))
    );
    assert_eq!(app.count(&row).await, 1, "nothing was exchanged");
}

/// The session's refresh limit is checked before anything is written: a
/// refused refresh leaves its token unexchanged, for the client to present
/// again once the limit allows.
async fn a_refresh_the_session_limit_refuses_exchanges_nothing(app: &TestApp) {
    use latchkey::crypto::sha256;

    let limited = app.twin_with(&[("rate_limit_refresh_session", "1/60")]).await;
    let pair = limited
        .register_verified(&unique_email("refused"), PASSWORD)
        .await;
    let next = refresh_to(&limited, pair["refresh_token"].as_str().unwrap()).await;
    let r = limited
        .post("/auth/refresh", json!({"refresh_token": next}))
        .await;
    assert_eq!(error_code(r).await, (429, "RATE_LIMITED".into()));
    let row = format!(
        "SELECT count(*) FROM refresh_tokens WHERE token_hash = {} AND rotated_at IS NULL AND successor IS NULL",
        blob(app, &sha256(next.as_bytes()))
    );
    assert_eq!(limited.count(&row).await, 1, "the refused token is unexchanged");
    let family = format!(
        "SELECT count(*) FROM refresh_tokens WHERE session_id = (SELECT session_id FROM refresh_tokens \
         WHERE token_hash = {})",
        blob(app, &sha256(next.as_bytes()))
    );
    assert_eq!(limited.count(&family).await, 2, "no successor was stored");
}

/// The `sid` claim of a token pair's access token (read, not verified).
fn sid_of(pair: &Value) -> String {
    use base64::Engine;
    let payload = pair["access_token"].as_str().unwrap().split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    claims["sid"].as_str().unwrap().to_string()
}

/// Refreshes that arrive together are written together on SQLite (one
/// transaction for the exchanges that queued): each must still get its
/// own session's successor, a token presented twice in one batch is
/// exchanged once, and a token the batch does not find is refused alone.
async fn many_sessions_refreshing_at_once_each_get_their_own_successor(app: &TestApp) {
    use latchkey::crypto::sha256;

    let email = unique_email("batch");
    app.register_verified(&email, PASSWORD).await;
    let mut sessions = Vec::new();
    for _ in 0..24 {
        let pair: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
        sessions.push((sid_of(&pair), pair["refresh_token"].as_str().unwrap().to_string()));
    }
    let gone = 4; // its token's row is deleted: the batch finds nothing for it
    app.sql(&format!(
        "DELETE FROM refresh_tokens WHERE token_hash = {}",
        blob(app, &sha256(sessions[gone].1.as_bytes()))
    ))
    .await;
    // On SQLite its one connection is held while the refreshes queue, so
    // that they are written in batches (store/group_commit.rs).
    let held = match &app.services.store.db {
        latchkey::store::Db::Sqlite(pool) => Some((**pool).acquire().await.unwrap()),
        latchkey::store::Db::Postgres(_) => None,
    };
    // Every token, and every third one twice in a row.
    let presented: Vec<usize> = (0..sessions.len())
        .flat_map(|i| if i % 3 == 0 { vec![i, i] } else { vec![i] })
        .collect();
    let mut handles = Vec::new();
    for &i in &presented {
        let (http, url, token) = (app.http.clone(), app.url("/auth/refresh"), sessions[i].1.clone());
        handles.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .json(&json!({"refresh_token": token}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(held);
    let mut successor: Vec<Option<String>> = vec![None; sessions.len()];
    for (&i, h) in presented.iter().zip(handles) {
        let (status, pair) = h.await.unwrap();
        if i == gone {
            assert_eq!(status, 401, "{pair}");
            continue;
        }
        assert_eq!(status, 200, "{pair}");
        assert_eq!(
            sid_of(&pair),
            sessions[i].0,
            "session {i} got another session's tokens"
        );
        let token = pair["refresh_token"].as_str().unwrap().to_string();
        let first = successor[i].get_or_insert_with(|| token.clone());
        assert_eq!(*first, token, "a token presented twice got two successors");
    }
    for (i, next) in successor.iter().enumerate().filter(|(i, _)| *i != gone) {
        let r = app
            .post(
                "/auth/refresh",
                json!({"refresh_token": next.as_deref().unwrap()}),
            )
            .await;
        assert_eq!(r.status(), 200, "session {i}");
        assert_eq!(sid_of(&r.json().await.unwrap()), sessions[i].0);
    }
    // The queue's wait and the batches' sizes are measured.
    if matches!(app.services.store.db, latchkey::store::Db::Sqlite(_)) {
        let metrics = app.metrics().await;
        for series in [
            "latchkey_db_group_commit_wait_seconds_count",
            "latchkey_db_group_commit_batch_size_count",
        ] {
            assert!(metrics.contains(series), "{series} missing");
        }
    }
}

async fn logout_revokes_the_session_and_its_access_tokens(app: &TestApp) {
    let email = unique_email("logout");
    app.register_verified(&email, PASSWORD).await;
    let pair: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let other: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let access = pair["access_token"].as_str().unwrap();
    assert_eq!(app.validate(access).await, 200);
    let r = app
        .post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(access).await, 401);
    assert_eq!(app.get_bearer("/auth/me", access).await.status(), 401);
    let r = app
        .post("/auth/refresh", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 401);
    // Other sessions live on.
    assert_eq!(app.validate(other["access_token"].as_str().unwrap()).await, 200);
    // Unknown tokens: 204 as well; a missing field: 400.
    assert_eq!(
        app.post("/auth/logout", json!({"refresh_token": "unknown"}))
            .await
            .status(),
        204
    );
    assert_eq!(app.post("/auth/logout", json!({})).await.status(), 400);
    assert_eq!(
        app.post("/auth/logout", json!({"refresh_token": 5}))
            .await
            .status(),
        400
    );
}

async fn password_change_revokes_other_sessions(app: &TestApp) {
    let email = unique_email("change");
    app.register_verified(&email, PASSWORD).await;
    let mine: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let other: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let at = mine["access_token"].as_str().unwrap();
    let change = |body: Value| {
        let (http, url, at) = (app.http.clone(), app.url("/auth/password"), at.to_string());
        async move { http.post(url).bearer_auth(at).json(&body).send().await.unwrap() }
    };
    let r =
        change(json!({"current_password": "not my password", "new_password": "a brand new secret"})).await;
    assert_eq!(error_code(r).await, (401, "INVALID_CREDENTIALS".into()));
    let r = change(json!({"current_password": PASSWORD, "new_password": "short"})).await;
    assert_eq!(error_code(r).await, (400, "INVALID_REQUEST".into()));
    let r = change(json!({"current_password": PASSWORD})).await;
    assert_eq!(r.status(), 400);
    let r = app
        .http
        .post(app.url("/auth/password"))
        .json(&json!({"current_password": PASSWORD, "new_password": "a brand new secret"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(r).await, (401, "INVALID_TOKEN".into()));

    let r = change(json!({"current_password": PASSWORD, "new_password": "a brand new secret"})).await;
    assert_eq!(r.status(), 204);
    // This session lives; the other one is revoked, access token included.
    assert_eq!(app.validate(at).await, 200);
    assert_eq!(app.validate(other["access_token"].as_str().unwrap()).await, 401);
    assert_eq!(
        app.post("/auth/refresh", json!({"refresh_token": other["refresh_token"]}))
            .await
            .status(),
        401
    );
    assert_eq!(
        app.post("/auth/refresh", json!({"refresh_token": mine["refresh_token"]}))
            .await
            .status(),
        200
    );
    assert_eq!(app.login(&email, PASSWORD).await.status(), 401);
    assert_eq!(app.login(&email, "a brand new secret").await.status(), 200);
}

async fn password_reset_flow(app: &TestApp) {
    let email = unique_email("reset");
    app.register_verified(&email, PASSWORD).await;
    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    // Unknown email: the same answer, no mail.
    let ghost = unique_email("ghost");
    let r = app.post("/auth/password-reset", json!({"email": ghost})).await;
    assert_eq!(r.status(), 202);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "SENT"}));
    let r = app.post("/auth/password-reset", json!({"email": email})).await;
    assert_eq!(r.status(), 202);
    let code = app.wait_for_code(&email, 2).await;
    assert!(app.mails_to(&ghost).is_empty());

    let confirm = |code: String, pw: &str| {
        app.post(
            "/auth/password-reset/confirm",
            json!({"email": email, "code": code, "new_password": pw}),
        )
    };
    let r = confirm(wrong_code(&code), "the new password").await;
    assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
    let r = confirm(code.clone(), "short").await;
    assert_eq!(error_code(r).await, (400, "INVALID_REQUEST".into()));
    let r = confirm(code.clone(), "the new password").await;
    assert_eq!(r.status(), 204);
    // Every session is revoked.
    assert_eq!(app.validate(session["access_token"].as_str().unwrap()).await, 401);
    assert_eq!(
        app.post(
            "/auth/refresh",
            json!({"refresh_token": session["refresh_token"]})
        )
        .await
        .status(),
        401
    );
    assert_eq!(app.login(&email, PASSWORD).await.status(), 401);
    assert_eq!(app.login(&email, "the new password").await.status(), 200);
    // The code was single use.
    let r = confirm(code, "yet another password").await;
    assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
    let r = app
        .post(
            "/auth/password-reset/confirm",
            json!({"email": unique_email("x"), "code": "123456", "new_password": "whatever123"}),
        )
        .await;
    assert_eq!(error_code(r).await, (401, "INVALID_OTP".into()));
}

async fn nothing_secret_is_stored_in_clear(app: &TestApp) {
    let email = unique_email("secret");
    let password = "a very memorable passphrase";
    app.register(&email, password).await;
    let code = app.wait_for_code(&email, 1).await;
    let pair: Value = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await
        .json()
        .await
        .unwrap();
    let refreshed: Value = app
        .post("/auth/refresh", json!({"refresh_token": pair["refresh_token"]}))
        .await
        .json()
        .await
        .unwrap();
    app.post("/auth/password-reset", json!({"email": email})).await;
    let reset_code = app.wait_for_code(&email, 2).await;
    let secrets = [
        password.to_string(),
        code.clone(),
        reset_code,
        pair["refresh_token"].as_str().unwrap().to_string(),
        refreshed["refresh_token"].as_str().unwrap().to_string(),
    ];
    let dump = crate::dump::database_text(app).await;
    for s in &secrets {
        assert!(
            !crate::dump::contains_word(&dump, s),
            "a secret was found in the database"
        );
    }
    assert!(dump.contains(&email), "the dump is real");
}

/// Whether the credential cache would let `password` log in to `email`
/// without argon2.
async fn cached(app: &TestApp, email: &str, password: &str) -> bool {
    let u = app.services.store.user_by_email(email).await.unwrap().unwrap();
    let cache = app.services.shared.credentials.as_ref().unwrap();
    cache.check(&u.id, &u.password_hash, password)
}

async fn a_sign_up_remembers_its_password_for_the_login_that_follows(app: &TestApp) {
    // A new account: the password just hashed is remembered.
    let email = unique_email("primed");
    app.register(&email, PASSWORD).await;
    assert!(cached(app, &email, PASSWORD).await);
    assert!(!cached(app, &email, "another password").await);
    // An unverified account taken over by a second sign-up: the new
    // password, not the old one (and the login answers as for a new account).
    app.register(&email, "second password").await;
    assert!(cached(app, &email, "second password").await);
    assert!(!cached(app, &email, PASSWORD).await);
    assert_eq!(
        error_code(app.login(&email, "second password").await).await,
        (401, "VERIFICATION_PENDING".into())
    );
    // A verified account: a sign-up with its email changes nothing, and its
    // password is not remembered.
    let verified = unique_email("primed-verified");
    app.register_verified(&verified, PASSWORD).await;
    let cache = app.services.shared.credentials.as_ref().unwrap();
    let u = app
        .services
        .store
        .user_by_email(&verified)
        .await
        .unwrap()
        .unwrap();
    cache.forget(&u.id);
    let r = app
        .post(
            "/auth/register",
            json!({"email": verified, "password": "not the owner's"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    assert!(!cached(app, &verified, "not the owner's").await);
    assert!(!cached(app, &verified, PASSWORD).await);
}

async fn racing_sign_ups_of_one_email_leave_at_most_one_password_remembered(app: &TestApp) {
    // Two sign-ups of one unverified email race: each remembers its own
    // password, but the cache binds the stored hash, so only the password
    // the account ended up with can skip argon2.
    let email = unique_email("primed-race");
    app.register(&email, PASSWORD).await;
    let body = |pw: &str| json!({"email": email, "password": pw});
    let (a, b) = tokio::join!(
        app.post("/auth/register", body("first racing password")),
        app.post("/auth/register", body("second racing password")),
    );
    assert_eq!(
        (a.status(), b.status()),
        (reqwest::StatusCode::CREATED, reqwest::StatusCode::CREATED)
    );
    let first = cached(app, &email, "first racing password").await;
    let second = cached(app, &email, "second racing password").await;
    assert!(first != second, "exactly one of the two: {first} {second}");
    assert!(!cached(app, &email, PASSWORD).await);
}
