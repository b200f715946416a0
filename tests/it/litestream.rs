//! Continuous replication of the embedded database with Litestream (a
//! SQLite replication tool, run beside latchkey; docs/backup.md): replicate
//! to a local directory while the service serves, lose the database file,
//! restore from the replica, and sign in where it was restored.
//!
//! Litestream is built by `tests/support/install-upstreams` into
//! `target/test-deps/litestream-VERSION`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{unique_email, TestApp, PASSWORD};

const VERSION: &str = "v0.5.18";

fn litestream() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/test-deps/litestream-{VERSION}"))
}

/// `litestream replicate` of `db` into the directory `replica`.
struct Replication(Child);

impl Replication {
    fn start(db: &Path, replica: &Path, dir: &Path) -> Replication {
        let config = dir.join("litestream.yml");
        std::fs::write(
            &config,
            format!(
                "dbs:\n  - path: {}\n    replica:\n      type: file\n      path: {}\n",
                db.display(),
                replica.display()
            ),
        )
        .unwrap();
        let child = Command::new(litestream())
            .args(["replicate", "-config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("litestream.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{} ({e}): run tests/support/install-upstreams",
                    litestream().display()
                )
            });
        Replication(child)
    }
}

impl Drop for Replication {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `litestream restore` of the replica at `replica` into `to`: whether it
/// restored anything.
async fn restore(replica: &Path, to: &Path) -> bool {
    let url = format!("file://{}", replica.display());
    let to = to.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Command::new(litestream())
            .args(["restore", "-o"])
            .arg(&to)
            .arg(&url)
            .output()
            .map(|o| o.status.success() && to.exists())
            .unwrap_or(false)
    })
    .await
    .unwrap()
}

/// Whether a database file holds an account with `email`.
async fn holds(db: &Path, email: &str) -> bool {
    use sqlx::{ConnectOptions, Connection};
    let Ok(mut conn) = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .read_only(true)
        .connect()
        .await
    else {
        return false;
    };
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE email = ?")
        .bind(email)
        .fetch_one(&mut conn)
        .await
        .unwrap_or(0);
    let _ = conn.close().await;
    n == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_lost_while_litestream_replicates_is_restored_with_every_account_and_session() {
    let app = TestApp::embedded(&[]).await;
    let db = app.tmp.path().join("latchkey.db");
    let work = tempfile::tempdir().unwrap();
    let replica = work.path().join("replica");
    let replication = Replication::start(&db, &replica, work.path());

    let mut accounts = Vec::new();
    for i in 0..5 {
        let email = unique_email(&format!("litestream{i}"));
        let pair = app.register_verified(&email, PASSWORD).await;
        accounts.push((email, pair["refresh_token"].as_str().unwrap().to_string()));
    }
    // The recovery point: how long after the last write the replica
    // holds it (restored into a scratch file until it does; bounded).
    let written = Instant::now();
    let (last, _) = accounts.last().unwrap().clone();
    let mut tries = 0;
    let lag = loop {
        tries += 1;
        let scratch = work.path().join(format!("probe{tries}.db"));
        if restore(&replica, &scratch).await && holds(&scratch, &last).await {
            break written.elapsed();
        }
        assert!(
            written.elapsed() < Duration::from_secs(120),
            "the replica never held the last account: {}",
            std::fs::read_to_string(work.path().join("litestream.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("litestream: the last write was in the replica {lag:?} after it was made ({tries} restores)");

    // The disaster: the service stops and its database is gone.
    app.stop().await;
    drop(replication);
    for side in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{side}", db.display()));
    }
    assert!(!db.exists());

    let restored_dir = Arc::new(tempfile::tempdir().unwrap());
    assert!(restore(&replica, &restored_dir.path().join("latchkey.db")).await);
    let restored = TestApp::embedded_in(restored_dir, &[]).await;
    for (email, refresh_token) in &accounts {
        assert_eq!(restored.login(email, PASSWORD).await.status(), 200, "{email}");
        let r = restored
            .post("/auth/refresh", json!({ "refresh_token": refresh_token }))
            .await;
        assert_eq!(r.status(), 200, "{email}'s session rotates");
    }
    assert_eq!(
        restored
            .count("SELECT count(*) FROM pragma_integrity_check WHERE integrity_check <> 'ok'")
            .await,
        0
    );
    restored.stop().await;
}
