//! A full disk under the embedded default, for real: the service's data
//! directory is a tmpfs of a few MiB mounted for the test (mounting needs
//! root, which the test machines run as), filled to its last byte while
//! the service serves. Writes are refused with `503 STORAGE_FULL`, never a
//! 500, and leave nothing half-made; reads (token validation) go on; once
//! space is freed the service writes again without a restart, and nothing
//! it had accepted is lost: not an account, not a queued message.
//! A mail directory on a disk of its own that fills keeps the messages in
//! the outbox until they can be written.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};

/// A tmpfs of `mib` MiB mounted on `dir` until dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path, mib: u32) -> Tmpfs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0700"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount(8)");
        assert!(
            status.success(),
            "mounting a tmpfs for the full-disk test needs root"
        );
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Writes `path` until the filesystem has no byte left.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 16 * 1024];
    while f.write_all(&chunk).and_then(|_| f.sync_data()).is_ok() {}
    // The last bytes, one at a time.
    while f.write_all(&[0]).and_then(|_| f.sync_data()).is_ok() {}
}

/// How many messages were ever queued (SQLite's counter of the outbox's
/// ids, which a delivered message does not lower).
async fn mail_queued(app: &TestApp) -> i64 {
    app.count("SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'outbox'")
        .await
}

async fn users_named(app: &TestApp, email: &str) -> i64 {
    app.count(&format!("SELECT count(*) FROM users WHERE email = '{email}'"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_503_keeps_what_it_had_and_recovers_once_space_is_freed() {
    let tmp = Arc::new(tempfile::tempdir().unwrap());
    let mount = Tmpfs::mount(tmp.path(), 8);
    // Limits off: how many sign-ups fit before the refusal is the disk's.
    let app = TestApp::embedded_in(tmp.clone(), &[("rate_limit", "off")]).await;

    let before: Vec<String> = (0..3).map(|_| unique_email("before-full")).collect();
    let mut tokens = Vec::new();
    for email in &before {
        let pair = app.register_verified(email, PASSWORD).await;
        tokens.push(pair["access_token"].as_str().unwrap().to_string());
    }

    let filler = tmp.path().join("filler");
    fill(&filler);

    // Sign-ups until one is refused: SQLite may still reuse pages its log
    // had, so the first few can fit. Each answer is a success or the
    // refusal, never anything else.
    let mut accepted = Vec::new();
    let mut refused = None;
    for _ in 0..200 {
        let email = unique_email("while-full");
        let queued = mail_queued(&app).await;
        let r = app
            .post("/auth/register", json!({"email": email, "password": PASSWORD}))
            .await;
        let status = r.status();
        let retry_after = r.headers().get("retry-after").cloned();
        let body: Value = r.json().await.unwrap();
        match status.as_u16() {
            201 => accepted.push(email),
            503 => {
                assert_eq!(body["error"], "STORAGE_FULL", "{body}");
                assert_eq!(retry_after.unwrap(), "30");
                // Its code was not queued either.
                assert_eq!(mail_queued(&app).await, queued);
                refused = Some(email);
                break;
            }
            other => panic!("a sign-up on a full disk answered {other}: {body}"),
        }
    }
    let refused = refused.expect("a sign-up was refused once the disk was full");
    // Nothing of the refused sign-up was written.
    assert_eq!(users_named(&app, &refused).await, 0);
    // Reads go on: every token issued before still validates.
    for token in &tokens {
        assert_eq!(app.validate(token).await, 200);
    }
    // A sign-in needs a session written: refused the same way, or (if
    // the log had room) accepted; never a 500.
    let r = app.login(&before[0], PASSWORD).await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert!(
        status == 200 || (status == 503 && body["error"] == "STORAGE_FULL"),
        "a sign-in on a full disk: {status} {body}"
    );

    // Space is freed: the service writes again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    app.register(&refused, PASSWORD).await;
    assert_eq!(users_named(&app, &refused).await, 1);
    for email in &before {
        assert_eq!(app.login(email, PASSWORD).await.status(), 200, "{email}");
    }
    for email in &accepted {
        assert_eq!(users_named(&app, email).await, 1, "{email}");
    }
    // The refused sign-up queued nothing: its address gets one message,
    // the second sign-up's.
    app.wait_for_mail(&refused, 1).await;
    assert_eq!(app.mails_to(&refused).len(), 1);
    let integrity = app.count("SELECT count(*) FROM pragma_integrity_check WHERE integrity_check <> 'ok'");
    assert_eq!(integrity.await, 0);
    app.stop().await;
    drop(mount);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_that_cannot_be_written_to_a_full_disk_stays_queued_and_goes_out_once_space_is_freed() {
    let mail = tempfile::tempdir().unwrap();
    let mount = Tmpfs::mount(mail.path(), 1);
    let filler = mail.path().join("filler");
    fill(&filler);
    let setting = format!("file:{}", mail.path().display());
    let app = TestApp::embedded(&[("mail", &setting), ("rate_limit", "off")]).await;

    // The database has room: sign-ups are accepted, their codes queued.
    let emails: Vec<String> = (0..3).map(|_| unique_email("mail-full")).collect();
    for email in &emails {
        app.register(email, PASSWORD).await;
    }
    // The worker tried, and could not write a message (this database's
    // own record of it: the metrics are the whole test process's).
    let failed = || async {
        app.count("SELECT count(*) FROM outbox WHERE attempts > 0 AND last_error IS NOT NULL")
            .await
            > 0
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !failed().await {
        assert!(std::time::Instant::now() < deadline, "no delivery was tried");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for email in &emails {
        assert!(app.mails_to(email).is_empty(), "{email}");
    }

    std::fs::remove_file(&filler).unwrap();
    for email in &emails {
        let code = app.wait_for_code(email, 1).await;
        let r = app
            .post("/auth/verify-otp", json!({"email": email, "code": code}))
            .await;
        assert_eq!(r.status(), 200, "{email}");
    }
    // Every message is delivered: a file left half-written is one a failed
    // try did not remove.
    let parts = std::fs::read_dir(mail.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")
        })
        .count();
    assert_eq!(parts, 0, "half-written messages left behind");
    app.stop().await;
    drop(mount);
}
