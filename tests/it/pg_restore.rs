//! The restore drill on PostgreSQL, with its own tools as docs/backup.md
//! advises: `pg_dump` of the database while sign-ups and sign-ins go on,
//! `pg_restore` into a fresh database, and a service there (the same master
//! secret) on which every account that existed before the dump signs in and
//! every session's refresh token rotates, and every account the dump caught
//! while it was being made is whole.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::common::{pg_url, unique_email, TestApp, PASSWORD};

/// `program args`, off the runtime's thread (the test's runtime has one,
/// which also serves the load meanwhile): its output if it succeeded.
async fn run(program: &'static str, args: Vec<String>) -> String {
    let out = tokio::task::spawn_blocking(move || Command::new(program).args(&args).output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{program} (postgresql-client): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program}: {text}");
    text
}

#[sqlx::test(migrations = false)]
async fn a_pg_dump_made_under_load_restores_to_a_database_where_every_account_signs_in_and_every_session_refreshes(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    // Limits off: the load's sign-ups all come from one address.
    let app = TestApp::postgres(opts.clone(), &[("rate_limit", "off")]).await;
    let mut before = Vec::new();
    for i in 0..4 {
        let email = unique_email(&format!("drill{i}"));
        let pair = app.register_verified(&email, PASSWORD).await;
        before.push((email, pair["refresh_token"].as_str().unwrap().to_string()));
    }

    // Load while the dump is made: new accounts, and sign-ins (each a new
    // session) of the accounts made before.
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, progress, base, emails) = (
            stop.clone(),
            progress.clone(),
            app.base.clone(),
            before.iter().map(|(e, _)| e.clone()).collect::<Vec<_>>(),
        );
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0;
            let mut signed_up = Vec::new();
            // Bounded: a few hundred requests at most, however slow the dump.
            while !stop.load(Ordering::Relaxed) && n < 300 {
                let email = unique_email("during-dump");
                let r = http
                    .post(format!("{base}/auth/register"))
                    .json(&json!({"email": email, "password": PASSWORD}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                signed_up.push(email);
                let r = http
                    .post(format!("{base}/auth/login"))
                    .json(&json!({"email": emails[n % emails.len()], "password": PASSWORD}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                n += 1;
                progress.store(n, Ordering::Relaxed);
            }
            signed_up
        })
    };
    // The dump starts once the load is under way.
    while progress.load(Ordering::Relaxed) < 5 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("latchkey.dump").display().to_string();
    run(
        "pg_dump",
        vec![
            "--format=custom".into(),
            "--file".into(),
            dump.clone(),
            pg_url(&opts),
        ],
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let signed_up_during = load.await.unwrap();
    assert!(signed_up_during.len() > 5, "the load went on during the dump");
    app.stop().await;

    // A fresh database of the same server, restored from the dump.
    // Short: PostgreSQL cuts names at 63 bytes, which the test's own has.
    let restored_name = format!("restored_{}", uuid::Uuid::new_v4().simple());
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts.clone())
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{restored_name}\""))
        .execute(&admin)
        .await
        .unwrap();
    let restored_opts = opts.clone().database(&restored_name);
    run(
        "pg_restore",
        vec![
            "--no-owner".into(),
            "--exit-on-error".into(),
            "--dbname".into(),
            pg_url(&restored_opts),
            dump,
        ],
    )
    .await;

    let restored = TestApp::postgres(restored_opts, &[]).await;
    for (email, refresh_token) in &before {
        assert_eq!(restored.login(email, PASSWORD).await.status(), 200, "{email}");
        let r = restored
            .post("/auth/refresh", json!({ "refresh_token": refresh_token }))
            .await;
        assert_eq!(r.status(), 200, "{email}'s session rotates");
    }
    // What the dump caught of the load is whole: each account it holds
    // comes with its verification code (one transaction made both).
    let mut caught = 0;
    for email in &signed_up_during {
        let rows = restored
            .count(&format!("SELECT count(*) FROM users WHERE email = '{email}'"))
            .await;
        if rows == 1 {
            caught += 1;
            let codes = restored
                .count(&format!(
                    "SELECT count(*) FROM codes WHERE email = '{email}' AND purpose = 'verify_email'"
                ))
                .await;
            assert_eq!(codes, 1, "{email}: an account without its code");
        }
    }
    // At least what was done before the dump began.
    assert!(caught >= 5, "{caught} of {}", signed_up_during.len());
    restored.stop().await;
    sqlx::query(&format!("DROP DATABASE \"{restored_name}\" WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
}
