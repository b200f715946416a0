//! Rotating the master secret (`latchkey secret rotate` and `retire`,
//! docs/operations.md): what the database holds sealed opens under the new
//! secret alone; what others hold (access and refresh tokens, recovery
//! codes) stays good; an instance with another keyring refuses to start.
//! On both backends, and with the embedded default's own files.

use std::path::Path;
use std::sync::Arc;

use latchkey::app::keyring::{reseal_all, retire, rotate};
use latchkey::crypto::ServerKeys;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD, SECRET_KEY};
use crate::mfa::{enrol_totp, pyotp, step_up};

const NEXT_KEY: &str = "dGhlLW5leHQtbWFzdGVyLXNlY3JldC0zMi1ieXRlcyE=";

fn secret(base64: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(base64).unwrap()
}

/// `settings` with the master secret `current` and the previous ones.
fn keyring(settings: &[(String, String)], current: Option<&str>, previous: &[&str]) -> Vec<(String, String)> {
    let mut s: Vec<(String, String)> = settings
        .iter()
        .filter(|(k, _)| k != "secret_key" && k != "previous_secret_keys")
        .cloned()
        .collect();
    if let Some(c) = current {
        s.push(("secret_key".into(), c.into()));
    }
    if !previous.is_empty() {
        s.push(("previous_secret_keys".into(), previous.join(",")));
    }
    s
}

/// Why an instance with `settings` does not start (it must not).
async fn refused(settings: &[(String, String)]) -> String {
    match latchkey::app::Application::build(TestApp::config(settings)).await {
        Ok(_) => panic!("an instance started with a keyring the database does not record"),
        Err(e) => format!("{e:#}"),
    }
}

async fn verify(app: &TestApp, mfa_token: &Value, proof: Value) -> (u16, Value) {
    let mut body = proof;
    body["mfa_token"] = mfa_token.clone();
    let r = app.post("/auth/mfa/verify", body).await;
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn refreshes(app: &TestApp, refresh_token: &str) -> bool {
    let r = app
        .post("/auth/refresh", json!({ "refresh_token": refresh_token }))
        .await;
    r.status() == 200
}

/// Puts one mail in the outbox, sealed under `keys`, as a service would.
async fn queue_mail(app: &TestApp, keys: &ServerKeys, to: &str) {
    let sealed = latchkey::mail::Message {
        to: to.into(),
        subject: "queued before the rotation".into(),
        body: "sealed under the old secret".into(),
    }
    .seal(&keys.outbox);
    let sql = "INSERT INTO outbox (payload, created_at, next_attempt_at) VALUES ($1, $2, $2)";
    let now = latchkey::clock::now_ms();
    match &app.services.store.db {
        latchkey::store::Db::Sqlite(p) => sqlx::query(sql)
            .bind(sealed)
            .bind(now)
            .execute(&**p)
            .await
            .map(|_| ()),
        latchkey::store::Db::Postgres(p) => sqlx::query(sql)
            .bind(sealed)
            .bind(now)
            .execute(&**p)
            .await
            .map(|_| ()),
    }
    .unwrap();
}

/// An account with an authenticator app: its email, the TOTP secret, its
/// recovery codes, and the token pair of a session.
async fn account_with_factor(app: &TestApp) -> (String, String, Vec<String>, Value) {
    let email = unique_email("keyring");
    let first = app.register_verified(&email, PASSWORD).await;
    let (secret, codes) = enrol_totp(app, first["access_token"].as_str().unwrap()).await;
    // The first factor ends the other sessions: a new one, through the factor.
    let up = step_up(app, &email).await;
    let codes = codes.unwrap();
    let (status, pair) = verify(app, &up["mfa_token"], json!({ "recovery_code": codes[0] })).await;
    assert_eq!(status, 200, "{pair}");
    (email, secret, codes, pair)
}

async fn a_rotated_secret_seals_everything_and_leaves_every_token_and_code_good(app: TestApp) {
    let old_keys = ServerKeys::derive(&secret(SECRET_KEY));
    let (email, totp, codes, pair) = account_with_factor(&app).await;
    // A second session, left alone until the old secret is retired.
    let up = step_up(&app, &email).await;
    let (_, idle) = verify(&app, &up["mfa_token"], json!({ "recovery_code": codes[1] })).await;
    let webhook = app
        .services
        .features
        .webhooks
        .add("cli", "http://127.0.0.1:9/hook", &[])
        .await
        .unwrap();
    let settings = app.settings.clone();
    let tmp = app.tmp.clone();
    let queued_to = unique_email("queued");
    queue_mail(&app, &old_keys, &queued_to).await;
    app.stop().await;

    // The new secret, with the one it replaces as the previous one.
    let rotated = keyring(&settings, Some(NEXT_KEY), &[SECRET_KEY]);
    let changed = rotate(&TestApp::config(&rotated), latchkey::clock::now_ms())
        .await
        .unwrap();
    let moved = |column: &str| {
        changed
            .resealed
            .iter()
            .find(|r| r.column == column)
            .unwrap()
            .resealed
    };
    assert!(
        moved("signing_keys") >= 1 && moved("factors") == 1 && moved("webhooks") == 1,
        "{changed:?}"
    );
    assert!(moved("outbox") >= 1, "{changed:?}");
    assert!(
        changed.resealed.iter().all(|r| r.unopenable.is_empty()),
        "{changed:?}"
    );

    // The old secret alone, or the new one without the old, does not start.
    let e = refused(&keyring(&settings, Some(SECRET_KEY), &[])).await;
    assert!(e.contains("another master secret"), "{e}");
    let e = refused(&keyring(&settings, Some(NEXT_KEY), &[])).await;
    assert!(e.contains("previous master secrets"), "{e}");

    let app = TestApp::relaunch(tmp.clone(), rotated.clone()).await;
    // Every sealed value opens under the new secret alone: nothing is left
    // under the old one.
    let next_only = ServerKeys::derive(&secret(NEXT_KEY));
    for r in reseal_all(&app.services.store, &next_only).await.unwrap() {
        assert_eq!((r.resealed, r.unopenable.len()), (0, 0), "{r:?}");
    }
    // The mail queued under the old secret goes out.
    app.wait_for_mail(&queued_to, 1).await;
    // Tokens from before: the access token validates, the refresh token rotates.
    assert_eq!(app.validate(pair["access_token"].as_str().unwrap()).await, 200);
    assert!(refreshes(&app, pair["refresh_token"].as_str().unwrap()).await);
    // The factor opens; a recovery code from before still counts.
    let up = step_up(&app, &email).await;
    let (status, body) = verify(&app, &up["mfa_token"], json!({ "code": pyotp(&totp, 1) })).await;
    assert_eq!(status, 200, "{body}");
    let up = step_up(&app, &email).await;
    let (status, body) = verify(&app, &up["mfa_token"], json!({ "recovery_code": codes[2] })).await;
    assert_eq!(status, 200, "{body}");
    // The webhook's secret is the one its receiver was given.
    let rec = app
        .services
        .store
        .webhook(&webhook.webhook.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        latchkey::webhooks::open_secret(&rec.secret, &next_only.outbox).as_deref(),
        Some(webhook.secret.as_str())
    );
    app.stop().await;

    // Neither command lets a recorded previous secret go unretired: a third
    // secret without the first, or a retire without it, is refused.
    let third = "dGhlLXRoaXJkLW1hc3Rlci1zZWNyZXQtMzItYnl0ZXM=";
    let skipped = keyring(&settings, Some(third), &[NEXT_KEY]);
    let e = format!("{:#}", rotate(&TestApp::config(&skipped), 0).await.unwrap_err());
    assert!(
        e.contains("previous master secrets this keyring does not hold"),
        "{e}"
    );
    let without = keyring(&settings, Some(NEXT_KEY), &[]);
    let e = format!(
        "{:#}",
        retire(&TestApp::config(&without), 0, false).await.unwrap_err()
    );
    assert!(e.contains("not the ones the database records"), "{e}");

    // Retire: the new secret alone from now on.
    let changed = retire(&TestApp::config(&rotated), latchkey::clock::now_ms(), false)
        .await
        .unwrap();
    assert_eq!(changed.retired, 1);
    let e = refused(&rotated).await;
    assert!(e.contains("previous master secrets"), "{e}");
    let e = refused(&keyring(&settings, Some(SECRET_KEY), &[])).await;
    assert!(e.contains("another master secret"), "{e}");
    let app = TestApp::relaunch(tmp, keyring(&settings, Some(NEXT_KEY), &[])).await;
    // What owners hold from before the rotation stays good: the idle
    // session's refresh token, another recovery code.
    assert!(refreshes(&app, idle["refresh_token"].as_str().unwrap()).await);
    let up = step_up(&app, &email).await;
    let (status, body) = verify(&app, &up["mfa_token"], json!({ "recovery_code": codes[3] })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        app.count("SELECT COUNT(*) FROM events WHERE kind LIKE 'master_secret.%'")
            .await,
        2
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_rotated_secret_seals_everything_and_leaves_every_token_and_code_good() {
    let app = TestApp::embedded(&[("webhook_allow_private_addresses", "true")]).await;
    a_rotated_secret_seals_everything_and_leaves_every_token_and_code_good(app).await;
}

#[sqlx::test(migrations = false)]
async fn postgres_a_rotated_secret_seals_everything_and_leaves_every_token_and_code_good(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let app = TestApp::postgres(opts, &[("webhook_allow_private_addresses", "true")]).await;
    a_rotated_secret_seals_everything_and_leaves_every_token_and_code_good(app).await;
}

/// `latchkey secret ARGS` on the embedded default in `data_dir`, its
/// secret in `<data_dir>/secret.key`: (success, output).
async fn secret_command(data_dir: &Path, args: &[&str]) -> (bool, String) {
    let mut c = crate::backup::embedded_command(data_dir);
    c.arg("secret")
        .args(args)
        .env_remove("LATCHKEY_SECRET_KEY")
        .env_remove("LATCHKEY_PREVIOUS_SECRET_KEYS");
    crate::backup::output_of(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_default_rotates_its_own_secret_file_and_retires_the_old_one() {
    let tmp = Arc::new(tempfile::tempdir().unwrap());
    let dir = tmp.path().to_path_buf();
    let first = TestApp::embedded_in(tmp.clone(), &[]).await;
    // Its settings without a configured secret: the same one, in
    // <data_dir>/secret.key.
    let settings = keyring(&first.settings, None, &[]);
    first.stop().await;
    std::fs::write(dir.join("secret.key"), secret(SECRET_KEY)).unwrap();
    let app = TestApp::relaunch(tmp.clone(), settings.clone()).await;
    let email = unique_email("keyfile");
    let pair = app.register_verified(&email, PASSWORD).await;
    app.stop().await;
    let old = std::fs::read(dir.join("secret.key")).unwrap();

    let (ok, out) = secret_command(&dir, &["rotate"]).await;
    assert!(ok, "{out}");
    let new = std::fs::read(dir.join("secret.key")).unwrap();
    assert_ne!(new, old);
    let previous = std::fs::read_to_string(dir.join("secret.previous")).unwrap();
    assert_eq!(previous.trim(), latchkey::crypto::b64url(&old));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for f in ["secret.key", "secret.previous"] {
            let mode = std::fs::metadata(dir.join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{f} is its owner's only");
        }
    }
    let app = TestApp::relaunch(tmp.clone(), settings.clone()).await;
    assert!(refreshes(&app, pair["refresh_token"].as_str().unwrap()).await);
    app.stop().await;

    let (ok, out) = secret_command(&dir, &["retire"]).await;
    assert!(ok, "{out}");
    assert!(!dir.join("secret.previous").exists());
    // Put away, not deleted: the backups made before the rotation need it.
    let kept: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("secret.retired-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read_to_string(dir.join(&kept[0])).unwrap(), previous);
    let app = TestApp::relaunch(tmp, settings).await;
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    app.stop().await;
}
