//! Mail delivery through a real SMTP server (aiosmtpd) and the outbox's
//! promises: an SMTP outage loses nothing, and neither does a SIGKILL.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{
    code_in, free_port, parse_eml, unique_email, SupportServer, TestApp, PASSWORD, SECRET_KEY,
};

crate::on_every_backend!(
    // A relay that refuses connections: the service's own worker tries the
    // message now and then and reschedules it, never sends it.
    settings = &[("mail", "smtp://127.0.0.1:9?tls=none")];
    a_worker_whose_claim_ran_out_never_touches_the_new_holders_claim,
);

/// A worker whose claim on a message ran out, and another instance took it,
/// neither renews it nor reschedules, kills or releases it from under its
/// new holder (else both would send it).
async fn a_worker_whose_claim_ran_out_never_touches_the_new_holders_claim(app: &TestApp) {
    let email = unique_email("claim");
    let r = app
        .post("/auth/register", json!({"email": email, "password": PASSWORD}))
        .await;
    assert_eq!(r.status(), 201);
    let store = &app.services.store;
    // Claim it as a worker would, a minute from now: due by then, and past
    // any claim the service's own worker holds now.
    // (PostgreSQL skips a row the service's worker is updating just then:
    // try again.)
    let at = latchkey::clock::now_ms() + 60_000;
    let deadline = Instant::now() + Duration::from_secs(5);
    let id = loop {
        if let Some(row) = store.claim_outbox(at, 15_000, 20).await.unwrap().first() {
            break row.id;
        }
        assert!(
            Instant::now() < deadline,
            "the message never waited in the outbox"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let held = at + 15_000;
    assert_eq!(
        store
            .extend_outbox_claims(&[id], held, held + 1_000)
            .await
            .unwrap(),
        vec![id],
        "a claim still held is renewed"
    );
    let held = held + 1_000;

    // The claim ran out and another instance took the message.
    let theirs = held + 123_456;
    app.sql(&format!(
        "UPDATE outbox SET claimed_until = {theirs} WHERE id = {id}"
    ))
    .await;
    assert!(store
        .extend_outbox_claims(&[id], held, held + 2_000)
        .await
        .unwrap()
        .is_empty());
    store.outbox_failed(id, held, 0, "relay down").await.unwrap();
    store.outbox_dead(id, held, 0, "given up").await.unwrap();
    store.release_outbox_claim(id, held).await.unwrap();
    let query = format!("SELECT claimed_until FROM outbox WHERE id = {id} AND dead_at IS NULL");
    assert_eq!(
        app.count(&query).await,
        theirs,
        "the new holder's claim is intact"
    );
}

/// A real SMTP server (aiosmtpd) writing each message to `dir`.
fn smtp_sink(dir: &Path, port: u16) -> SupportServer {
    smtp_sink_with(dir, port, "plain")
}

/// The same with TLS: `mode` is `plain`, `starttls` (required) or
/// `implicit`; with TLS its CA certificate is `dir/ca.pem`.
pub(crate) fn smtp_sink_with(dir: &Path, port: u16, mode: &str) -> SupportServer {
    let port = port.to_string();
    SupportServer::start(
        "smtp_sink.py",
        &[dir.as_os_str(), port.as_ref(), mode.as_ref()],
        "pip install aiosmtpd cryptography",
    )
}

pub(crate) fn mails_in(dir: &Path, to: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut paths: Vec<_> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "eml"))
            .collect();
        paths.sort();
        for p in paths {
            if let Some((rcpt, _, body)) = std::fs::read_to_string(&p).ok().and_then(|t| parse_eml(&t)) {
                if rcpt.eq_ignore_ascii_case(to) {
                    out.push(body);
                }
            }
        }
    }
    out
}

pub(crate) async fn wait_mail(dir: &Path, to: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some(m) = mails_in(dir, to).pop() {
            return m;
        }
        assert!(Instant::now() < deadline, "no mail to {to} in {}", dir.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_delivery_and_an_outage_that_loses_nothing() {
    let port = free_port();
    let inbox = tempfile::tempdir().unwrap();
    // The SMTP server is down when the mail is queued.
    let app = TestApp::embedded(&[("mail", &format!("smtp://127.0.0.1:{port}?tls=none"))]).await;
    let email = unique_email("smtp");
    let r = app
        .post("/auth/register", json!({"email": email, "password": PASSWORD}))
        .await;
    assert_eq!(r.status(), 201, "a request never waits on mail");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(mails_in(inbox.path(), &email).is_empty());
    let _smtp = smtp_sink(inbox.path(), port);
    // Retried with backoff (1 s, 2 s, 4 s ...): it arrives.
    let body = wait_mail(inbox.path(), &email, Duration::from_secs(15)).await;
    let code = code_in(&body).expect("the code stands alone in the text body");
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await;
    assert_eq!(r.status(), 200);
    // Delivered mail leaves the outbox.
    let (backlog, _, _) = app.services.store.outbox_backlog().await.unwrap();
    assert_eq!(backlog, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_queued_in_an_outage_goes_out_when_the_relay_is_back_not_when_its_backoff_ends() {
    let port = free_port();
    let inbox = tempfile::tempdir().unwrap();
    let app = TestApp::embedded(&[("mail", &format!("smtp://127.0.0.1:{port}?tls=none"))]).await;
    let early = unique_email("outage-early");
    let r = app
        .post("/auth/register", json!({"email": early, "password": PASSWORD}))
        .await;
    assert_eq!(r.status(), 201);
    // Tried at 0, 1, 3 and 7 s: its next try is 8 s after the last.
    tokio::time::sleep(Duration::from_millis(7500)).await;
    let _smtp = smtp_sink(inbox.path(), port);
    let late = unique_email("outage-late");
    let r = app
        .post("/auth/register", json!({"email": late, "password": PASSWORD}))
        .await;
    assert_eq!(r.status(), 201);
    wait_mail(inbox.path(), &late, Duration::from_secs(5)).await;
    // The first success brings the backlog forward: well before 15 s.
    wait_mail(inbox.path(), &early, Duration::from_secs(3)).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greylisted_message_keeps_its_backoff_while_other_mail_flows() {
    let port = free_port();
    let inbox = tempfile::tempdir().unwrap();
    let _smtp = smtp_sink(inbox.path(), port);
    let app = TestApp::embedded(&[("mail", &format!("smtp://127.0.0.1:{port}?tls=none"))]).await;
    let failures = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("latchkey_outbox_failures_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = failures(&app.metrics().await);
    let greylisted = format!("greylist-{}", unique_email("g"));
    let r = app
        .post(
            "/auth/register",
            json!({"email": greylisted, "password": PASSWORD}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let start = Instant::now();
    // Other mail goes out every 300 ms or so: each delivery is a success
    // after the greylisted message's failure, and must not pull it forward.
    for _ in 0..12 {
        let other = unique_email("flowing");
        app.post("/auth/register", json!({"email": other, "password": PASSWORD}))
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Its own backoff: tried at 0, 1, 3, 7, 15 ... s (a slow machine makes
    // the loop above longer). On a loaded machine another delivery can time
    // out (an unreachable relay, which rightly brings the backlog forward)
    // once or twice; pulled forward after every delivery, it was tried 13
    // times.
    let elapsed = start.elapsed().as_secs_f64() + 1.0;
    let allowed = [0.0, 1.0, 3.0, 7.0, 15.0, 31.0]
        .iter()
        .filter(|&&t| t <= elapsed)
        .count() as f64;
    let tries = failures(&app.metrics().await) - before;
    assert!(
        (1.0..=allowed + 2.0).contains(&tries),
        "the greylisted message was tried {tries} times in {elapsed:.1} s"
    );
    app.stop().await;
}

struct Server {
    child: Child,
}

impl Server {
    /// On the embedded default in `dir`.
    fn spawn(dir: &Path, port: u16, mail: &str) -> Server {
        Self::spawn_on(dir, port, mail, None)
    }

    /// On `database` (a PostgreSQL URL), or the embedded default.
    fn spawn_on(dir: &Path, port: u16, mail: &str, database: Option<&str>) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_latchkey"));
        cmd.arg("serve")
            .current_dir(dir)
            .env("LATCHKEY_LISTEN", format!("127.0.0.1:{port}"))
            .env("LATCHKEY_ADMIN_LISTEN", "off")
            .env("LATCHKEY_MAIL", mail)
            .env("LATCHKEY_SECRET_KEY", SECRET_KEY)
            .env("LATCHKEY_LOG", "warn")
            .env_remove("LATCHKEY_DATABASE_URL")
            .env_remove("LATCHKEY_REDIS_URL")
            .stderr(Stdio::null());
        if let Some(url) = database {
            cmd.env("LATCHKEY_DATABASE_URL", url);
        }
        Server {
            child: cmd.spawn().unwrap(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn register_at(port: u16, email: &str) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/auth/register"))
        .json(&json!({"email": email, "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

async fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health/ready")).await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the server did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_register_loses_neither_account_nor_mail() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Mail cannot go out yet (no SMTP server), so it waits in the outbox.
    let dead = free_port();
    let mut server = Server::spawn(dir.path(), port, &format!("smtp://127.0.0.1:{dead}?tls=none"));
    wait_ready(port).await;
    let email = unique_email("kill");
    register_at(port, &email).await;
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    // The worst moment for the kill: while the worker held the message (a
    // claim far in the future here). The restarted instance must not wait
    // the lease out.
    let db = format!("sqlite://{}", dir.path().join("data/latchkey.db").display());
    let pool = sqlx::SqlitePool::connect(&db).await.unwrap();
    let held = sqlx::query("UPDATE outbox SET claimed_until = 9000000000000")
        .execute(&pool)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(held, 1, "the message waits in the outbox");
    pool.close().await;

    let mail_dir = dir.path().join("mail");
    let _server = Server::spawn(dir.path(), port, &format!("file:{}", mail_dir.display()));
    wait_ready(port).await;
    let body = wait_mail(&mail_dir, &email, Duration::from_secs(10)).await;
    let code = code_in(&body).unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/auth/verify-otp"))
        .json(&json!({"email": email, "code": code}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the account survived too");
}

/// An instance killed while it holds a message (its relay accepted the
/// connection and hangs) does not keep it for long: the claim is renewed
/// while its worker lives, and once it is gone another instance sends the
/// message within the claim's lease (15 s), not after a minute.
#[sqlx::test(migrations = false)]
async fn mail_held_by_a_killed_instance_goes_out_from_another_within_the_lease(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let url = crate::common::pg_url(&opts);
    let dir = tempfile::tempdir().unwrap();
    // A relay that takes the connection (the kernel's backlog) and never
    // greets: the worker waits on it, holding the message.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay = format!("smtp://127.0.0.1:{}?tls=none", hung.local_addr().unwrap().port());
    let port = free_port();
    let mut server = Server::spawn_on(dir.path(), port, &relay, Some(&url));
    wait_ready(port).await;
    let email = unique_email("held");
    register_at(port, &email).await;
    // The claim, then its renewal while the worker waits on the relay.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let claim = || async {
        sqlx::query_scalar::<_, Option<i64>>("SELECT claimed_until FROM outbox")
            .fetch_optional(&pool)
            .await
            .unwrap()
            .flatten()
    };
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(9);
    loop {
        match (first, claim().await) {
            (None, Some(c)) => first = Some(c),
            (Some(f), Some(c)) if c > f => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the worker never claimed and renewed the message (claim: {first:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.close().await;
    server.child.kill().unwrap(); // SIGKILL, the message held
    server.child.wait().unwrap();

    let mail_dir = dir.path().join("mail");
    let other = free_port();
    let _other = Server::spawn_on(
        dir.path(),
        other,
        &format!("file:{}", mail_dir.display()),
        Some(&url),
    );
    wait_ready(other).await;
    wait_mail(&mail_dir, &email, Duration::from_secs(25)).await;
}

/// A relay that takes the connection and then never answers holds a
/// delivery for `mail_timeout_secs` at most: the message is rescheduled as
/// when the relay cannot be reached, and the worker goes on. (lettre's own
/// timeout bounds only the connection's opening: without this one the
/// worker waited for ever, renewing its claims, and no instance sent the
/// batch.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_stops_answering_holds_a_delivery_no_longer_than_the_mail_timeout() {
    // The kernel completes the connection; nobody ever greets.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay = format!("smtp://127.0.0.1:{}?tls=none", hung.local_addr().unwrap().port());
    let app = TestApp::embedded(&[("mail", &relay), ("mail_timeout_secs", "1")]).await;
    let email = unique_email("hung");
    let r = app
        .post("/auth/register", json!({"email": email, "password": PASSWORD}))
        .await;
    assert_eq!(r.status(), 201);
    let given_back = "SELECT COUNT(*) FROM outbox WHERE claimed_until IS NULL AND attempts >= 1 \
                      AND last_error LIKE '%did not finish the delivery within 1 s%'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(given_back).await != 1 {
        assert!(Instant::now() < deadline, "the delivery still waits on the relay");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}

/// The outbox delivers at least once. An instance killed after its relay
/// stored a message, but before it heard the relay's 250 and deleted the row,
/// leaves the message to another instance, which sends it again once the
/// claim runs out. The second copy carries the first's Message-ID, so the
/// recipient's mail system can tell it is a copy (and Gmail's drops it).
#[sqlx::test(migrations = false)]
async fn a_message_sent_again_after_a_crash_carries_the_first_copys_message_id(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let url = crate::common::pg_url(&opts);
    let dir = tempfile::tempdir().unwrap();
    // The sink stores mail to "slow..." at once and answers 8 s later.
    let sink_dir = dir.path().join("sink");
    std::fs::create_dir_all(&sink_dir).unwrap();
    let sink_port = free_port();
    let _sink = smtp_sink(&sink_dir, sink_port);
    let port = free_port();
    let mut server = Server::spawn_on(
        dir.path(),
        port,
        &format!("smtp://127.0.0.1:{sink_port}?tls=none"),
        Some(&url),
    );
    wait_ready(port).await;
    let email = unique_email("slow");
    register_at(port, &email).await;
    wait_mail(&sink_dir, &email, Duration::from_secs(10)).await;
    server.child.kill().unwrap(); // SIGKILL, the relay's 250 not heard yet
    server.child.wait().unwrap();

    let mail_dir = dir.path().join("mail");
    let other = free_port();
    let _other = Server::spawn_on(
        dir.path(),
        other,
        &format!("file:{}", mail_dir.display()),
        Some(&url),
    );
    wait_ready(other).await;
    let again = wait_mail(&mail_dir, &email, Duration::from_secs(30)).await;
    assert_eq!(
        code_in(&again),
        code_in(&mails_in(&sink_dir, &email)[0]),
        "the same message"
    );
    let first = message_ids_in(&sink_dir);
    let copy = message_ids_in(&mail_dir);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first, copy, "the copy carries the first's Message-ID");
}

/// The Message-ID headers of the messages in `dir`.
fn message_ids_in(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "eml"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("Message-ID: ").map(str::to_owned))
        })
        .collect();
    ids.sort();
    ids
}

/// Two instances share the outbox: every message goes out once.
#[sqlx::test(migrations = false)]
async fn two_instances_deliver_each_message_once(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let a = TestApp::postgres(opts, &[("rate_limit", "off")]).await;
    let b = a.twin().await;
    let emails: Vec<String> = (0..12).map(|i| unique_email(&format!("once{i}"))).collect();
    for (i, e) in emails.iter().enumerate() {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = app
            .post("/auth/register", json!({"email": e, "password": PASSWORD}))
            .await;
        assert_eq!(r.status(), 201);
    }
    for e in &emails {
        a.wait_for_mail(e, 1).await;
    }
    // Give a duplicate time to show up, then count.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for e in &emails {
        assert_eq!(a.mails_to(e).len(), 1, "{e} got a duplicate");
    }
    b.stop().await;
    a.stop().await;
}
