//! Backups of the embedded database and their restore (docs/backup.md):
//! `latchkey backup` while the service serves, `latchkey restore` into
//! another directory, and a service there on which every account signs in
//! and every session's refresh token still rotates; the copies a restore
//! must refuse; the scheduled backups.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{unique_email, TestApp, PASSWORD, SECRET_KEY};

/// `latchkey ARGS` on the embedded database of `data_dir`, under `secret`:
/// (success, stdout and stderr).
pub async fn latchkey(data_dir: &Path, secret: &str, args: &[&str]) -> (bool, String) {
    latchkey_with(data_dir, secret, args, &[]).await
}

/// [`latchkey`] with the settings `env` (`LATCHKEY_...` variables) too.
async fn latchkey_with(data_dir: &Path, secret: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut c = embedded_command(data_dir);
    c.envs(env.iter().copied());
    c.args(args).env("LATCHKEY_SECRET_KEY", secret);
    output_of(c).await
}

/// The `latchkey` binary on the embedded database of `data_dir`, with
/// warnings only and no setting of the tests' environment that names a
/// server (PostgreSQL, Redis).
pub fn embedded_command(data_dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    c.env("LATCHKEY_DATA_DIR", data_dir)
        .env("LATCHKEY_LOG", "warn")
        .env_remove("LATCHKEY_DATABASE_URL")
        .env_remove("LATCHKEY_REDIS_URL");
    c
}

/// Runs `c`: (success, stdout and stderr).
pub async fn output_of(mut c: Command) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A copy of `copy` at `to` with `statement` run on it: its path.
async fn altered(copy: &Path, to: &Path, statement: &str) -> String {
    use sqlx::{ConnectOptions, Connection};
    std::fs::copy(copy, to).unwrap();
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(to)
        .connect()
        .await
        .unwrap();
    sqlx::query(statement).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    to.display().to_string()
}

async fn refreshes(app: &TestApp, refresh_token: &str) -> bool {
    app.post("/auth/refresh", json!({ "refresh_token": refresh_token }))
        .await
        .status()
        == 200
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_backup_restores_to_a_service_where_every_account_signs_in_and_every_session_refreshes() {
    let app = TestApp::embedded(&[]).await;
    let mut users = Vec::new();
    for i in 0..3 {
        let email = unique_email(&format!("backup{i}"));
        let pair = app.register_verified(&email, PASSWORD).await;
        users.push((email, pair["refresh_token"].as_str().unwrap().to_string()));
    }
    let out = tempfile::tempdir().unwrap();
    let copy = out.path().join("copy.db");
    // The service keeps serving while the copy is made.
    let data_dir = app.tmp.path().to_path_buf();
    let copy_arg = copy.display().to_string();
    let args = ["backup", copy_arg.as_str()];
    let during_email = unique_email("during-backup");
    let (backup, during) = tokio::join!(
        latchkey(&data_dir, SECRET_KEY, &args),
        app.register_verified(&during_email, PASSWORD),
    );
    assert!(backup.0, "{}", backup.1);
    assert!(during["access_token"].is_string());
    // It holds password hashes: its owner's only, as its seal.
    #[cfg(unix)]
    for file in [copy.clone(), out.path().join("copy.db.mac")] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}: {mode:o}", file.display());
    }

    let restored_dir = Arc::new(tempfile::tempdir().unwrap());
    let (ok, text) = latchkey(restored_dir.path(), SECRET_KEY, &["restore", &copy_arg]).await;
    assert!(ok, "{text}");
    assert!(text.contains("restored"), "{text}");
    let restored = TestApp::embedded_in(restored_dir, &[]).await;
    for (email, refresh_token) in &users {
        assert_eq!(restored.login(email, PASSWORD).await.status(), 200, "{email}");
        assert!(
            refreshes(&restored, refresh_token).await,
            "{email}'s session rotates"
        );
    }
    restored.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_refuses_a_copy_it_cannot_trust_and_changes_nothing() {
    const OTHER: &str = "YW5vdGhlci1zZWNyZXQta2V5LW9mLXRoaXJ0eS10d28tYnl0ZXM=";
    let app = TestApp::embedded(&[]).await;
    app.register_verified(&unique_email("refused"), PASSWORD).await;
    let out = tempfile::tempdir().unwrap();
    let copy = out.path().join("copy.db");
    let copy_arg = copy.display().to_string();
    let (ok, text) = latchkey(app.tmp.path(), SECRET_KEY, &["backup", &copy_arg]).await;
    assert!(ok, "{text}");
    let before = std::fs::read(&copy).unwrap();
    let (again, text) = latchkey(app.tmp.path(), SECRET_KEY, &["backup", &copy_arg]).await;
    assert!(!again && text.contains("never overwrites"), "{text}");
    // A file already at the path, sealed or not, is left as it was.
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    let other_file = out.path().join("notes.txt");
    std::fs::write(&other_file, "an operator's file").unwrap();
    let (again, text) = latchkey(
        app.tmp.path(),
        SECRET_KEY,
        &["backup", &other_file.display().to_string()],
    )
    .await;
    assert!(!again && text.contains("never overwrites"), "{text}");
    assert_eq!(
        std::fs::read_to_string(&other_file).unwrap(),
        "an operator's file"
    );
    assert!(!out.path().join("notes.txt.mac").exists());
    // A backup sealed under another secret than the database's would
    // restore nowhere: refused, and nothing written.
    let elsewhere = out.path().join("other-secret.db");
    let (ok, text) = latchkey(
        app.tmp.path(),
        OTHER,
        &["backup", &elsewhere.display().to_string()],
    )
    .await;
    assert!(
        !ok && text.contains("not initialised under the configured master secret"),
        "{text}"
    );
    assert!(!elsewhere.exists() && !out.path().join("other-secret.db.mac").exists());
    // A database the service never started on has no check value yet: the
    // backup says so rather than blaming the secret.
    let fresh = tempfile::tempdir().unwrap();
    let (ok, text) = latchkey(fresh.path(), SECRET_KEY, &["migrate"]).await;
    assert!(ok, "{text}");
    let (ok, text) = latchkey(
        fresh.path(),
        SECRET_KEY,
        &["backup", &elsewhere.display().to_string()],
    )
    .await;
    assert!(!ok && text.contains("the service never started on it"), "{text}");
    assert!(!elsewhere.exists());
    app.stop().await;

    let target = tempfile::tempdir().unwrap();
    let db = target.path().join("latchkey.db");
    // Made under another master secret.
    let (ok, text) = latchkey(target.path(), OTHER, &["restore", &copy_arg]).await;
    assert!(!ok && text.contains("another master secret"), "{text}");
    assert!(!db.exists(), "nothing written");

    // A copy changed after latchkey made it, its seal kept beside it: an
    // account's password hash replaced by one the attacker knows. The seal
    // refuses it, --unsealed or not.
    let forged = altered(
        &copy,
        &out.path().join("forged.db"),
        "UPDATE users SET password_hash = '$argon2id$v=19$m=19456,t=2,p=1$YXR0YWNrZXJzYWx0$YXR0YWNrZXJzaGFzaHZhbHVlb2ZmaXhlZGxlbmd0aA'",
    )
    .await;
    std::fs::copy(out.path().join("copy.db.mac"), out.path().join("forged.db.mac")).unwrap();
    for extra in [None, Some("--unsealed")] {
        let mut args = vec!["restore", forged.as_str()];
        args.extend(extra);
        let (ok, text) = latchkey(target.path(), SECRET_KEY, &args).await;
        assert!(!ok && text.contains("does not match its seal"), "{text}");
        assert!(!db.exists(), "nothing written");
    }

    // Without any master secret (none configured, no secret.key where the
    // restore runs): refused, and none made up.
    let bare_dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    c.args(["restore", &copy_arg])
        .env("LATCHKEY_DATA_DIR", bare_dir.path())
        .env("LATCHKEY_LOG", "warn")
        .env_remove("LATCHKEY_SECRET_KEY")
        .env_remove("LATCHKEY_DATABASE_URL")
        .env_remove("LATCHKEY_REDIS_URL");
    let out_none = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    assert!(!out_none.status.success());
    assert!(
        String::from_utf8_lossy(&out_none.stderr).contains("no master secret"),
        "{out_none:?}"
    );
    assert!(!bare_dir.path().join("secret.key").exists(), "no secret made up");
    assert!(!bare_dir.path().join("latchkey.db").exists(), "nothing written");

    // A copy without a seal (made by hand): only with --unsealed, and then
    // every other check still applies (below).
    let bare = out.path().join("bare.db");
    std::fs::copy(&copy, &bare).unwrap();
    let bare_arg = bare.display().to_string();
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &bare_arg]).await;
    assert!(!ok && text.contains("has no seal"), "{text}");
    assert!(!db.exists(), "nothing written");

    // A newer schema than this build knows.
    let newer = altered(
        &copy,
        &out.path().join("newer.db"),
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (999999, 'from the future', 1, x'00', 0)",
    )
    .await;
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &newer, "--unsealed"]).await;
    assert!(!ok && text.contains("newer latchkey"), "{text}");
    assert!(!db.exists(), "nothing written");

    // A copy changed by hand: a trigger that would run on the service's
    // writes (the schema latchkey makes has none).
    let rigged = altered(
        &copy,
        &out.path().join("rigged.db"),
        "CREATE TRIGGER steal AFTER UPDATE ON users BEGIN UPDATE users SET name = 'x'; END",
    )
    .await;
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &rigged, "--unsealed"]).await;
    assert!(!ok && text.contains("triggers"), "{text}");
    assert!(!db.exists(), "nothing written");

    // A damaged file: the middle of it overwritten.
    let damaged = out.path().join("damaged.db");
    let mut bytes = std::fs::read(&copy).unwrap();
    let middle = bytes.len() / 2;
    let end = (middle + 4096).min(bytes.len());
    for b in &mut bytes[middle..end] {
        *b = 0x5a;
    }
    std::fs::write(&damaged, bytes).unwrap();
    let (ok, text) = latchkey(
        target.path(),
        SECRET_KEY,
        &["restore", &damaged.display().to_string(), "--unsealed"],
    )
    .await;
    assert!(!ok, "a damaged copy is refused: {text}");
    assert!(!db.exists(), "nothing written");

    // The copy without a seal, once its owner says so.
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &bare_arg, "--unsealed"]).await;
    assert!(ok, "{text}");
    std::fs::remove_file(&db).unwrap();

    // A good copy over an existing database needs --replace, and keeps it.
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &copy_arg]).await;
    assert!(ok && text.contains("the backup was made at 20"), "{text}");
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &copy_arg]).await;
    assert!(!ok && text.contains("--replace"), "{text}");
    let (ok, text) = latchkey(target.path(), SECRET_KEY, &["restore", &copy_arg, "--replace"]).await;
    assert!(ok, "{text}");
    let kept = std::fs::read_dir(target.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("latchkey.db.before-restore-")
        })
        .count();
    assert_eq!(kept, 1, "the database it replaced is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_keep_the_newest_and_say_when_the_last_one_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let backups = dir.path().display().to_string();
    let app = TestApp::embedded(&[
        ("backup_dir", &backups),
        ("backup_interval_secs", "1"),
        ("backup_keep", "2"),
    ])
    .await;
    app.register_verified(&unique_email("scheduled"), PASSWORD).await;
    let files = || -> Vec<std::path::PathBuf> {
        let mut f: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "db"))
            .collect();
        f.sort();
        f
    };
    // Four backups' time at least (bounded), then: two kept.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 4 {
        assert!(Instant::now() < deadline, "backups made: {seen:?}");
        seen.extend(files());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = files();
    assert!(kept.len() <= 2, "{kept:?}");
    // Each with its seal, and no seal of a backup pruned left behind.
    let seals = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|e| e == "mac"))
        .count();
    assert_eq!(seals, kept.len(), "{seals} seals for {kept:?}");
    for k in &kept {
        assert!(k.with_extension("db.mac").exists(), "no seal for {}", k.display());
    }
    let newest = kept.last().unwrap();
    let facts = latchkey::store::backup::inspect_copy(newest).await.unwrap();
    assert_eq!(facts.integrity, "ok");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("latchkey_backup_last_success_timestamp_seconds "),
        "{metrics}"
    );
    app.stop().await;
    // Stopped: no more backups nor pruning. An older backup copied, with
    // its seal, under a newer scheduled name: its seal keeps the time it
    // was made, and the restore refuses it.
    let kept = files();
    let renamed = dir.path().join("latchkey-20991231T235959Z.db");
    std::fs::copy(&kept[0], &renamed).unwrap();
    std::fs::copy(kept[0].with_extension("db.mac"), renamed.with_extension("db.mac")).unwrap();
    let target = tempfile::tempdir().unwrap();
    let (ok, text) = latchkey(
        target.path(),
        SECRET_KEY,
        &["restore", &renamed.display().to_string()],
    )
    .await;
    assert!(!ok && text.contains("a backup renamed"), "{text}");
    let (ok, text) = latchkey(
        target.path(),
        SECRET_KEY,
        &["restore", &kept[0].display().to_string()],
    )
    .await;
    assert!(ok, "under its own name it restores: {text}");
}

// The webhook of the export's test points at a loopback address.
crate::on_every_backend!(
    settings = &[("webhook_allow_private_addresses", "true")];
    an_export_imported_into_another_deployment_loses_no_account,
    an_export_carries_the_clients_and_webhooks_to_a_deployment_with_the_same_master_secret,
);

/// The clients (secrets as hashes, settings) and audit webhooks (secrets
/// sealed) of an export: imported where the master secret is the same,
/// each client signs in with its own secret there and keeps its settings;
/// imported again, nothing changes; under another master secret, the
/// webhook is refused by name and the clients still come.
async fn an_export_carries_the_clients_and_webhooks_to_a_deployment_with_the_same_master_secret(
    app: &TestApp,
) {
    use latchkey::domain::oidc::client::{ClientKind, ConsentMode};
    let (_, admin) = app.admin_client().await;
    let secret =
        crate::oidc::application(app, "moving-app", ClientKind::Confidential, ConsentMode::Skip).await;
    let r = app
        .http
        .post(app.url("/admin/webhooks"))
        .bearer_auth(&admin)
        .json(&json!({"url": "http://127.0.0.1:9/audit", "kinds": ["user.", "session.ended"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let hook: serde_json::Value = r.json().await.unwrap();
    let hook_id = hook["id"].as_str().unwrap().to_string();
    let mut file = Vec::new();
    latchkey::domain::import::export(&app.services.store, &mut file, true)
        .await
        .unwrap();
    let text = String::from_utf8(file).unwrap();
    assert!(!text.contains(&secret), "a client's secret is never in an export");

    let allow = [("LATCHKEY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true")];
    let other = TestApp::embedded(&[("webhook_allow_private_addresses", "true")]).await;
    let path = other.tmp.path().join("export.jsonl");
    std::fs::write(&path, &text).unwrap();
    // Without --with-clients, the accounts only: each client and webhook
    // is named and left out.
    let accounts_only = ["users", "import", &path.display().to_string()];
    let (ok, out) = latchkey_with(other.tmp.path(), SECRET_KEY, &accounts_only, &allow).await;
    assert!(
        ok && out.contains("left out (no --with-clients): client moving-app"),
        "{out}"
    );
    assert!(other.services.store.client("moving-app").await.unwrap().is_none());
    let import = ["users", "import", &path.display().to_string(), "--with-clients"];
    let (ok, out) = latchkey_with(other.tmp.path(), SECRET_KEY, &import, &allow).await;
    assert!(
        ok && out.contains("0 with errors") && out.contains("added client moving-app"),
        "{out}"
    );
    let before = app.services.store.client("moving-app").await.unwrap().unwrap();
    let after = other.services.store.client("moving-app").await.unwrap().unwrap();
    // Times travel as RFC 3339, to the second.
    assert_eq!(
        (&after.secret_hash, &after.name, &after.scopes, after.created_at),
        (
            &before.secret_hash,
            &before.name,
            &before.scopes,
            before.created_at / 1000 * 1000
        )
    );
    let settings = |c: &latchkey::store::ClientRecord| -> serde_json::Value {
        serde_json::from_str(c.oidc.as_deref().unwrap()).unwrap()
    };
    assert_eq!(settings(&after), settings(&before));
    // The client authenticates there with the secret it always had.
    let introspect = |secret: String| {
        let other = &other;
        async move {
            other
                .http
                .post(other.url("/oauth/introspect"))
                .basic_auth("moving-app", Some(secret))
                .form(&[("token", "not-a-token")])
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(introspect(secret.clone()).await, 200);
    assert_eq!(introspect(format!("{secret}x")).await, 401);
    let hooks = other.services.store.webhooks().await.unwrap();
    let moved = hooks.iter().find(|w| w.id == hook_id).expect("the webhook came");
    assert_eq!(
        (moved.url.as_str(), moved.kinds.as_str()),
        ("http://127.0.0.1:9/audit", "session.ended user.")
    );

    // Again: every client and webhook is there already and stays as it is.
    let (ok, out) = latchkey_with(other.tmp.path(), SECRET_KEY, &import, &allow).await;
    assert!(
        ok && out.contains("0 added") && out.contains("0 with errors"),
        "{out}"
    );
    other.stop().await;

    // Under another master secret: the webhook's secret would not open.
    const OTHER: &str = "YW5vdGhlci1zZWNyZXQta2V5LW9mLXRoaXJ0eS10d28tYnl0ZXM=";
    let third = tempfile::tempdir().unwrap();
    let path = third.path().join("export.jsonl");
    std::fs::write(&path, &text).unwrap();
    let import = ["users", "import", &path.display().to_string(), "--with-clients"];
    let (ok, out) = latchkey_with(third.path(), OTHER, &import, &allow).await;
    assert!(
        ok && out.contains("sealed under another master secret") && out.contains("1 with errors"),
        "{out}"
    );
}

/// `latchkey users export` read back by `latchkey users import` on another
/// deployment (here always the embedded default: a move between backends
/// too): every account arrives with its name, verification and disabled
/// state, and signs in with its own password; one without a password stays
/// without one.
async fn an_export_imported_into_another_deployment_loses_no_account(app: &TestApp) {
    let (_, admin) = app.admin_client().await;
    let named = unique_email("export-named");
    app.register_verified(&named, PASSWORD).await;
    let id = app
        .services
        .store
        .user_by_email(&named)
        .await
        .unwrap()
        .unwrap()
        .id;
    let r = app
        .http
        .patch(app.url(&format!("/admin/users/{id}")))
        .bearer_auth(&admin)
        .json(&json!({"name": "Ada Lovelace"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let disabled = unique_email("export-disabled");
    let nopass = unique_email("export-nopass");
    for body in [
        json!({"email": disabled, "password": "another password 1", "verified": true, "disabled": true}),
        json!({"email": nopass, "no_password": true, "verified": true}),
    ] {
        let r = app
            .http
            .post(app.url("/admin/users"))
            .bearer_auth(&admin)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }
    let mut file = Vec::new();
    let exported = latchkey::domain::import::export(&app.services.store, &mut file, true)
        .await
        .unwrap();
    let text = String::from_utf8(file).unwrap();
    assert_eq!(
        text.lines().next().unwrap(),
        latchkey::domain::import::EXPORT_HEADER
    );
    let accounts = text
        .lines()
        .skip(1)
        .filter(|l| !latchkey::domain::import::is_configured(l))
        .count();
    assert_eq!(exported as usize, accounts);

    let other = TestApp::embedded(&[]).await;
    let path = other.tmp.path().join("export.jsonl");
    std::fs::write(&path, &text).unwrap();
    let (ok, out) = latchkey(
        other.tmp.path(),
        SECRET_KEY,
        &["users", "import", &path.display().to_string()],
    )
    .await;
    assert!(ok, "{out}");
    assert!(out.contains(&format!("{exported} created")), "{out}");
    let moved = |email: &str| {
        let store = other.services.store.clone();
        let email = email.to_string();
        async move { store.user_by_email(&email).await.unwrap().unwrap() }
    };
    assert_eq!(other.login(&named, PASSWORD).await.status(), 200);
    assert_eq!(moved(&named).await.name.as_deref(), Some("Ada Lovelace"));
    assert!(moved(&named).await.email_verified_at.is_some());
    assert!(moved(&disabled).await.disabled_at.is_some(), "still disabled");
    assert_ne!(other.login(&disabled, "another password 1").await.status(), 200);
    assert_eq!(
        moved(&nopass).await.password_hash,
        latchkey::store::UNUSABLE_PASSWORD
    );
    // An update from a file that says nothing of it never enables an
    // account (only the admin API does, with its event).
    let update = other.tmp.path().join("update.jsonl");
    let hash = moved(&disabled).await.password_hash;
    let record = json!({"email": disabled, "password_hash": hash, "verified": true});
    std::fs::write(&update, format!("{record}\n")).unwrap();
    let (ok, out) = latchkey(
        other.tmp.path(),
        SECRET_KEY,
        &["users", "import", &update.display().to_string(), "--update"],
    )
    .await;
    assert!(ok && out.contains("1 updated"), "{out}");
    assert!(
        moved(&disabled).await.disabled_at.is_some(),
        "still disabled after --update"
    );
    other.stop().await;
}
