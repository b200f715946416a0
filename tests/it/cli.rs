//! The binary: configuration errors, graceful shutdown, and the commands.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, SECRET_KEY};

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

/// A client removed from the command line (another process than the
/// server, on the embedded default) loses every token on the server within
/// the revocations' second: its own, and those of the sessions it holds for
/// users, as the admin API refuses them. Before, `/auth/validate` accepted
/// them until they expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_removed_from_the_command_line_loses_its_tokens_at_once() {
    use crate::common::{unique_email, TestApp, PASSWORD};
    use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};
    let app = TestApp::embedded(&[]).await;
    let id = "an-app-to-remove";
    let secret = app
        .services
        .features
        .clients
        .add(
            id,
            None,
            &["svc:read".into()],
            Some(&ClientSettings {
                consent: ConsentMode::Skip,
                ..ClientSettings::new(ClientKind::Confidential, vec![crate::oidc::CALLBACK.into()])
            }),
        )
        .await
        .unwrap()
        .unwrap();
    let r = crate::oauth::form(
        &app,
        "/oauth/token",
        Some((id, &secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let own: serde_json::Value = r.json().await.unwrap();
    let own = own["access_token"].as_str().unwrap().to_string();
    let email = unique_email("removed-app");
    let first_party = app.register_verified(&email, PASSWORD).await;
    let pair = crate::oidc::code_grant(&app, id, &secret, &email, "openid").await;
    let users = pair["access_token"].as_str().unwrap().to_string();
    assert_eq!((app.validate(&own).await, app.validate(&users).await), (200, 200));
    let db = app
        .settings
        .iter()
        .find(|(k, _)| k == "database_url")
        .map(|(_, v)| v.clone())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = latchkey(dir.path())
        .env("LATCHKEY_DATABASE_URL", &db)
        .args(["clients", "remove", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let removed = Instant::now();
    while (app.validate(&own).await, app.validate(&users).await) != (401, 401) {
        assert!(removed.elapsed() < Duration::from_secs(5), "still accepted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("refused {:?} after the command", removed.elapsed());
    // The resync runs every half second: refused within the second.
    assert!(
        removed.elapsed() < Duration::from_millis(1500),
        "{:?}",
        removed.elapsed()
    );
    // The user's own session is not the client's: it goes on.
    assert_eq!(
        app.validate(first_party["access_token"].as_str().unwrap()).await,
        200
    );
    // A client added again under the same id (a new secret, say) is another:
    // its tokens are not the removed one's, and they pass.
    let secret = app
        .services
        .features
        .clients
        .add(id, None, &["svc:read".into()], None)
        .await
        .unwrap()
        .unwrap();
    let r = crate::oauth::form(
        &app,
        "/oauth/token",
        Some((id, &secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    let again: serde_json::Value = r.json().await.unwrap();
    assert_eq!(app.validate(again["access_token"].as_str().unwrap()).await, 200);
    assert_eq!(
        app.validate(&own).await,
        401,
        "the removed client's token stays refused"
    );
    app.stop().await;
}

#[test]
fn an_invalid_setting_stops_start_up_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value) in [
        ("LATCHKEY_DATABASE_URL", "nosuch://x"),
        ("LATCHKEY_LISTEN", "not-an-address"),
        ("LATCHKEY_REDIS_URL", "http://x"),
        ("LATCHKEY_MAIL", "pigeon"),
        ("LATCHKEY_RATE_LIMIT", "sometimes"),
    ] {
        let out = latchkey(dir.path())
            .arg("serve")
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{var}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{var}: {err}");
        assert!(err.contains(var), "{var}: {err}");
    }
    // Secrets in a bad setting are not echoed.
    let out = latchkey(dir.path())
        .arg("serve")
        .env("LATCHKEY_SECRET_KEY", "hunter2-is-too-short")
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("LATCHKEY_SECRET_KEY") && !err.contains("hunter2"),
        "{err}"
    );
}

#[test]
fn serves_on_the_embedded_default_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = latchkey(dir.path())
        .arg("serve")
        .env("LATCHKEY_LISTEN", format!("127.0.0.1:{port}"))
        .env_remove("LATCHKEY_SECRET_KEY")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = KillOnDrop(child);
    let child = &mut guard.0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "not listening");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        dir.path().join("data/latchkey.db").exists(),
        "the store lives under ./data/"
    );
    assert!(dir.path().join("data/secret.key").exists());
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < deadline, "did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The soft limit on open files (often 1,024) would stop accepting long
/// before `max_connections`: `serve` raises it to the hard limit, and warns
/// when even that cannot hold the cap.
#[test]
fn serve_raises_the_open_file_limit_and_warns_when_it_is_short_of_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("stderr.log");
    let hard: u64 = std::fs::read_to_string("/proc/self/limits")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4).map(|v| v.parse().unwrap()))
        .unwrap();
    let soft = 512.min(hard);
    let base = latchkey(dir.path());
    let child = Command::new("sh")
        .args(["-c", &format!("ulimit -Sn {soft} && exec \"$0\" serve")])
        .arg(base.get_program())
        .envs(base.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env("LATCHKEY_LISTEN", format!("127.0.0.1:{port}"))
        .env("LATCHKEY_MAX_CONNECTIONS", (hard + 1).to_string())
        .current_dir(dir.path())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "not listening");
        std::thread::sleep(Duration::from_millis(5));
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", guard.0.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], hard.to_string(), "soft limit raised: {line}");
    drop(guard);
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        err.contains("open-file limit"),
        "no warning with max_connections above the limit: {err}"
    );
}

#[test]
fn clients_keys_and_upstreams_commands() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = latchkey(dir.path()).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (ok, out, _) = run(&["clients", "add", "web", "--name", "Web app"]);
    assert!(ok);
    assert!(out.contains("client_secret:"));
    let (ok, _, err) = run(&["clients", "add", "web"]);
    assert!(!ok && err.contains("exists"), "{err}");
    let (_, out, _) = run(&["clients", "list"]);
    assert!(out.starts_with("web\tWeb app"), "{out}");
    assert!(!out.contains("client_secret"));
    assert!(run(&["clients", "remove", "web"]).0);
    assert!(!run(&["clients", "remove", "web"]).0);

    // A key per algorithm signed with: EdDSA, and RS256 for id_tokens
    // (id_token_signing_algorithms' default); a rotation renews both.
    let (_, before, _) = run(&["keys", "list"]);
    assert_eq!(before.lines().count(), 2, "{before}");
    assert!(run(&["keys", "rotate"]).0);
    let (_, after, _) = run(&["keys", "list"]);
    assert_eq!(after.lines().count(), 4, "{after}");
    assert_eq!(
        after.lines().filter(|l| l.ends_with("active")).count(),
        2,
        "{after}"
    );
    // Upstream providers: the secret from the environment, never printed.
    let mut add = latchkey(dir.path());
    add.env("LATCHKEY_UPSTREAM_CLIENT_SECRET", "upstream-secret-value")
        .args([
            "upstreams",
            "add",
            "corp",
            "--issuer",
            "https://sso.corp.example",
            "--client-id",
            "latchkey",
            "--display-name",
            "Corp SSO",
        ]);
    let out = add.output().unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("/oauth/upstream/corp/callback"), "{printed}");
    let mut github = latchkey(dir.path());
    github
        .env("LATCHKEY_UPSTREAM_CLIENT_SECRET", "github-secret-value")
        .args(["upstreams", "add", "github", "--github", "--client-id", "Iv1.abc"]);
    let out = github.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, list, _) = run(&["upstreams", "list"]);
    assert!(
        list.starts_with("corp\toidc\tCorp SSO\thttps://sso.corp.example"),
        "{list}"
    );
    assert!(
        list.contains(
            "github\tgithub\tgithub\thttps://github.com\tclient Iv1.abc\tscopes \"read:user user:email\""
        ),
        "{list}"
    );
    assert!(!list.contains("upstream-secret-value") && !printed.contains("upstream-secret-value"));
    let (ok, _, err) = run(&[
        "upstreams",
        "add",
        "Bad Name",
        "--issuer",
        "https://x.example",
        "--client-id",
        "c",
        "--client-secret",
        "s",
    ]);
    assert!(!ok && err.contains("name"), "{err}");
    assert!(run(&["upstreams", "remove", "corp"]).0);
    assert!(!run(&["upstreams", "remove", "corp"]).0);

    assert!(run(&["migrate"]).0);
    let (ok, out, _) = run(&["users", "seed", "--count", "3", "--password", "seeded-password"]);
    assert!(ok, "{out}");
    assert!(out.contains("seeded 3"), "{out}");
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn hash_capacity_measures_with_the_configured_parameters_and_bounds_odd_durations() {
    let dir = tempfile::tempdir().unwrap();
    // Cheap parameters, so that the test measures quickly; a negative and a
    // not-a-number duration are taken as the shortest and the default
    // measurement (5 s), never a panic or an endless loop. One thread: the
    // other core is left to the tests running beside this one, whose
    // services' hashing threads yield to any other work (two busy threads
    // for 5 s held a sign-up of another test past its deadline).
    for seconds in ["0.2", "-5", "NaN"] {
        let start = Instant::now();
        let out = latchkey(dir.path())
            .args(["hash-capacity", &format!("--seconds={seconds}")])
            .env("LATCHKEY_ARGON2_MEMORY_KIB", "64")
            .env("LATCHKEY_ARGON2_ITERATIONS", "1")
            .env("LATCHKEY_HASH_THREADS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{seconds}: {out:?}");
        assert!(start.elapsed() < Duration::from_secs(20), "{seconds}");
        let text = String::from_utf8(out.stdout).unwrap();
        let rate: f64 = text.split_whitespace().next().unwrap().parse().unwrap();
        assert!(rate > 0.0, "{text}");
        assert!(
            text.contains("on 1 threads") && text.contains("m=64 KiB, t=1, p=1"),
            "{text}"
        );
    }
    // A value that is not a number is refused by the argument parser.
    let out = latchkey(dir.path())
        .args(["hash-capacity", "--seconds", "soon"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
