//! The test harness: a real latchkey (the same `Application` the binary
//! runs) on port 0, on the embedded backend (a fresh SQLite file) or on
//! PostgreSQL (a database created per test by `#[sqlx::test]`) with Redis
//! (a key prefix per test). Mail goes to the real `file:` sink, from which
//! tests read the codes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::app::config::{Config, Sources};
use latchkey::app::{Application, Services};
use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Runs the same test body on every backend: the embedded default and
/// PostgreSQL + Redis.
/// `on_every_backend!(settings = &[("key", "value")]; names...)` starts
/// every instance with those settings on top of the test defaults.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_backend!(settings = &[]; $($name),*);
    };
    (settings = $settings:expr; $($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = $crate::common::TestApp::embedded($settings).await;
                    super::$name(&app).await;
                    app.stop().await;
                }
            )*
        }
        mod postgres_redis {
            $(
                #[sqlx::test(migrations = false)]
                async fn $name(_: sqlx::postgres::PgPoolOptions, opts: sqlx::postgres::PgConnectOptions) {
                    let app = $crate::common::TestApp::postgres(opts, $settings).await;
                    super::$name(&app).await;
                    app.stop().await;
                }
            )*
        }
    };
}

/// Runs test bodies on PostgreSQL with a Redis Cluster (3 masters) in place
/// of one Redis server: the bodies that exercise Redis across instances
/// (shared limits, brute-force state and its unlock, revocations).
/// `on_redis_cluster!(names...)`, once per file beside `on_every_backend!`.
#[macro_export]
macro_rules! on_redis_cluster {
    ($($name:ident),* $(,)?) => {
        mod redis_cluster {
            $(
                #[sqlx::test(migrations = false)]
                async fn $name(_: sqlx::postgres::PgPoolOptions, opts: sqlx::postgres::PgConnectOptions) {
                    let app = $crate::common::TestApp::postgres_cluster(opts).await;
                    super::$name(&app).await;
                    app.stop().await;
                }
            )*
        }
    };
}

pub const SECRET_KEY: &str = "dGVzdC1zZWNyZXQta2V5LW9mLXRoaXJ0eS10d28tYnl0ZXMhIQ==";

pub struct TestApp {
    pub base: String,
    /// The admin listener (`/metrics`).
    pub admin_base: String,
    pub http: reqwest::Client,
    pub mail_dir: PathBuf,
    pub services: Arc<Services>,
    pub settings: Vec<(String, String)>,
    pub tmp: Arc<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

pub fn redis_url() -> String {
    std::env::var("LATCHKEY_TEST_REDIS_URL")
        .expect("LATCHKEY_TEST_REDIS_URL must be set (run ./scripts/test, which starts Redis)")
}

pub fn redis_cluster_url() -> String {
    std::env::var("LATCHKEY_TEST_REDIS_CLUSTER_URL").expect(
        "LATCHKEY_TEST_REDIS_CLUSTER_URL must be set (run ./scripts/test, which starts a Redis Cluster)",
    )
}

pub fn pg_url(opts: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        opts.get_username(),
        opts.get_host(),
        opts.get_port(),
        opts.get_database().expect("sqlx::test names the database")
    )
}

impl TestApp {
    /// The embedded default: SQLite, in-process caches and limits.
    pub async fn embedded(extra: &[(&str, &str)]) -> TestApp {
        Self::embedded_in(Arc::new(tempfile::tempdir().unwrap()), extra).await
    }

    /// The embedded default in the directory `tmp` (its `latchkey.db` and
    /// mail there), which may hold a database already (a restored one).
    pub async fn embedded_in(tmp: Arc<tempfile::TempDir>, extra: &[(&str, &str)]) -> TestApp {
        let db = format!("sqlite://{}", tmp.path().join("latchkey.db").display());
        Self::start(tmp, vec![("database_url".into(), db)], extra).await
    }

    /// PostgreSQL (this test's own database) and Redis (this test's own prefix).
    pub async fn postgres(opts: PgConnectOptions, extra: &[(&str, &str)]) -> TestApp {
        let tmp = Arc::new(tempfile::tempdir().unwrap());
        let prefix = format!("t{}:", uuid::Uuid::new_v4().simple());
        let base = vec![
            ("database_url".into(), pg_url(&opts)),
            ("redis_url".into(), redis_url()),
            ("redis_key_prefix".into(), prefix),
            ("database_max_connections".into(), "10".into()),
        ];
        Self::start(tmp, base, extra).await
    }

    /// PostgreSQL (this test's own database) and a Redis Cluster (this
    /// test's own prefix).
    pub async fn postgres_cluster(opts: PgConnectOptions) -> TestApp {
        let cluster = redis_cluster_url();
        Self::postgres(opts, &[("redis_url", &cluster), ("redis_cluster", "true")]).await
    }

    async fn start(
        tmp: Arc<tempfile::TempDir>,
        base: Vec<(String, String)>,
        extra: &[(&str, &str)],
    ) -> TestApp {
        let mail_dir = tmp.path().join("mail");
        let mut settings: Vec<(String, String)> = vec![
            ("listen".into(), "127.0.0.1:0".into()),
            ("admin_listen".into(), "127.0.0.1:0".into()),
            ("data_dir".into(), tmp.path().display().to_string()),
            ("mail".into(), format!("file:{}", mail_dir.display())),
            ("secret_key".into(), SECRET_KEY.into()),
            ("issuer".into(), "http://latchkey.test".into()),
            ("log".into(), "warn".into()),
            // No test fails because the machine running it is busy: a hash
            // waits for a thread rather than being shed at the default
            // objective (500 ms). Tests of shedding set their own.
            ("hash_latency_objective_ms".into(), "60000".into()),
            // No RS256 key for id_tokens (the default keeps one): making a
            // 2048-bit RSA key costs a new database a fifth of a second.
            // The tests of the OpenID Provider that need one set it.
            ("id_token_signing_algorithms".into(), "".into()),
        ];
        settings.extend(base);
        for (k, v) in extra {
            settings.retain(|(key, _)| key != k);
            settings.push((k.to_string(), v.to_string()));
        }
        Self::launch(tmp, settings).await
    }

    pub fn config(settings: &[(String, String)]) -> Config {
        Config::from_sources(&Sources::from_pairs(
            settings.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ))
        .expect("test settings are valid")
    }

    async fn launch(tmp: Arc<tempfile::TempDir>, settings: Vec<(String, String)>) -> TestApp {
        let config = Self::config(&settings);
        let mail_dir = match &config.mail.transport {
            latchkey::mail::MailConfig::File(d) => d.clone(),
            _ => tmp.path().join("mail"),
        };
        let app = Application::build(config).await.expect("the application starts");
        let addr = app.local_addr();
        let admin = app.admin_addr().expect("tests serve an admin listener");
        let services = app.services().clone();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            app.run_until(async move {
                let _ = rx.await;
            })
            .await
            .expect("the application runs");
        });
        TestApp {
            base: format!("http://{addr}"),
            admin_base: format!("http://{admin}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            mail_dir,
            services,
            settings,
            tmp,
            stop: Some(tx),
            handle: Some(handle),
        }
    }

    /// An instance with exactly `settings` in the directory `tmp`: for a
    /// restart of a stopped one with its settings changed.
    pub async fn relaunch(tmp: Arc<tempfile::TempDir>, settings: Vec<(String, String)>) -> TestApp {
        Self::launch(tmp, settings).await
    }

    /// A second instance on the same database (and Redis), as a deployment of two.
    pub async fn twin(&self) -> TestApp {
        Self::launch(self.tmp.clone(), self.settings.clone()).await
    }

    /// A second instance with these settings on top of this one's (later
    /// pairs win).
    pub async fn twin_with(&self, extra: &[(&str, &str)]) -> TestApp {
        let mut settings = self.settings.clone();
        settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Self::launch(self.tmp.clone(), settings).await
    }

    /// Runs one SQL statement on the app's database, behind the service's
    /// back: for ageing codes and tokens, or setting up a race's outcome.
    pub async fn sql(&self, statement: &str) {
        match &self.services.store.db {
            latchkey::store::Db::Sqlite(p) => sqlx::query(statement).execute(&**p).await.map(|_| ()).unwrap(),
            latchkey::store::Db::Postgres(p) => {
                sqlx::query(statement).execute(&**p).await.map(|_| ()).unwrap()
            }
        }
    }

    /// The one integer a query answers (`SELECT count(*) ...`), read behind
    /// the service's back.
    pub async fn count(&self, query: &str) -> i64 {
        match &self.services.store.db {
            latchkey::store::Db::Sqlite(p) => sqlx::query_scalar(query).fetch_one(&**p).await.unwrap(),
            latchkey::store::Db::Postgres(p) => sqlx::query_scalar(query).fetch_one(&**p).await.unwrap(),
        }
    }

    /// A new OAuth client with the admin scope and its own access token
    /// (the client_credentials grant): `(client id, token)`.
    pub async fn admin_client(&self) -> (String, String) {
        let id = format!("admin-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let secret = self
            .services
            .features
            .clients
            .add(&id, None, &["latchkey:admin".into()], None)
            .await
            .unwrap()
            .unwrap();
        let r = self
            .http
            .post(self.url("/oauth/token"))
            .basic_auth(&id, Some(&secret))
            .form(&[("grant_type", "client_credentials")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        (id, body["access_token"].as_str().unwrap().to_string())
    }

    pub fn is_postgres(&self) -> bool {
        self.services.store.backend_name() == "postgres"
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), h).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http.post(self.url(path)).json(&body).send().await.unwrap()
    }

    pub async fn post_raw(&self, path: &str, body: &'static str) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.unwrap()
    }

    /// The Prometheus text of this instance's admin listener.
    pub async fn metrics(&self) -> String {
        let r = self
            .http
            .get(format!("{}/metrics", self.admin_base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    pub async fn get_bearer(&self, path: &str, token: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    pub async fn validate(&self, token: &str) -> u16 {
        self.get_bearer("/auth/validate", token).await.status().as_u16()
    }

    /// Every message delivered to `to`, oldest first, as (subject, body).
    pub fn mails_to(&self, to: &str) -> Vec<(String, String)> {
        read_mails(&self.mail_dir, to)
    }

    /// Waits for the `n`-th message to `to` (1-based) and returns it.
    pub async fn wait_for_mail(&self, to: &str, n: usize) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mails = self.mails_to(to);
            if mails.len() >= n {
                return mails[n - 1].clone();
            }
            assert!(
                Instant::now() < deadline,
                "mail #{n} to {to} did not arrive (have {})",
                mails.len()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn wait_for_code(&self, to: &str, n: usize) -> String {
        let (_, body) = self.wait_for_mail(to, n).await;
        code_in(&body).unwrap_or_else(|| panic!("no code in mail: {body}"))
    }

    pub async fn register(&self, email: &str, password: &str) {
        let r = self
            .post("/auth/register", json!({"email": email, "password": password}))
            .await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }

    /// Registers and verifies; returns the token pair of the first session.
    pub async fn register_verified(&self, email: &str, password: &str) -> Value {
        self.register(email, password).await;
        let code = self.wait_for_code(email, 1).await;
        let r = self
            .post("/auth/verify-otp", json!({"email": email, "code": code}))
            .await;
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    /// The account of `email`, which must exist.
    pub async fn user(&self, email: &str) -> latchkey::store::UserRecord {
        self.services
            .store
            .user_by_email(email)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("an account of {email}"))
    }

    pub async fn login(&self, email: &str, password: &str) -> reqwest::Response {
        self.post("/auth/login", json!({"email": email, "password": password}))
            .await
    }
}

/// The 6-digit code standing alone on a line of a message body.
pub fn code_in(body: &str) -> Option<String> {
    body.lines()
        .map(str::trim)
        .find(|l| l.len() == 6 && l.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_string)
}

pub fn read_mails(dir: &Path, to: &str) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "eml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| parse_eml(&std::fs::read_to_string(p).ok()?))
        .filter(|(rcpt, _, _)| rcpt.eq_ignore_ascii_case(to))
        .map(|(_, s, b)| (s, b))
        .collect()
}

/// (To, Subject, body) of an RFC 5322 message with a plain-text body.
pub fn parse_eml(text: &str) -> Option<(String, String, String)> {
    let (head, body) = text.split_once("\r\n\r\n").or_else(|| text.split_once("\n\n"))?;
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().trim_start_matches('<').trim_end_matches('>').to_string())
    };
    let body = decode_body(head, body);
    Some((header("To:")?, header("Subject:")?, body))
}

fn decode_body(head: &str, body: &str) -> String {
    if head
        .to_ascii_lowercase()
        .contains("content-transfer-encoding: quoted-printable")
    {
        let joined = body.replace("=\r\n", "").replace("=\n", "");
        let mut out = Vec::new();
        let b = joined.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'=' && i + 2 < b.len() {
                if let Ok(v) = u8::from_str_radix(&joined[i + 1..i + 3], 16) {
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    } else {
        body.to_string()
    }
}

pub fn unique_email(tag: &str) -> String {
    format!(
        "{tag}-{}@example.test",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub const PASSWORD: &str = "correct horse battery";

/// A Redis server owned by one test, so that the test can stop and restart it.
pub struct OwnRedis {
    pub port: u16,
    child: Option<std::process::Child>,
}

/// A loopback port held for a server the test starts later: bound and never
/// listening (a connection to it is refused, as to a server that is down),
/// with SO_REUSEADDR, so that the server can bind it with SO_REUSEADDR too
/// (Python's http.server does) while no other socket of the machine can take
/// it in between. Drop it once the server is up.
pub struct ReservedPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

pub fn reserve_port() -> ReservedPort {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    ReservedPort {
        _socket: socket,
        port,
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl OwnRedis {
    pub async fn start() -> OwnRedis {
        let mut r = OwnRedis {
            port: free_port(),
            child: None,
        };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn restart(&mut self) {
        let bin = std::env::var("LATCHKEY_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = std::process::Command::new(bin)
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install -y redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A server from `tests/support/` (Python, or Node for `.js`), started with `args`, killed on
/// drop. It prints `READY [port]` once it listens; `ready` is the rest of
/// that line. `hint` says what to install when it does not start.
pub struct SupportServer {
    child: std::process::Child,
    pub ready: String,
}

impl SupportServer {
    pub fn start(script: &str, args: &[&std::ffi::OsStr], hint: &str) -> SupportServer {
        use std::io::BufRead;
        // `.js` runs on Node, everything else on Python.
        let interpreter = if script.ends_with(".js") {
            "node"
        } else {
            "python3"
        };
        let mut child = std::process::Command::new(interpreter)
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/support")
                    .join(script),
            )
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{interpreter} for {script} ({hint}): {e}"));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(ready) = line.strip_prefix("READY") else {
            let _ = child.kill();
            panic!("{script} did not start ({hint}): {line:?}");
        };
        let ready = ready.trim().to_string();
        SupportServer { child, ready }
    }
}

impl Drop for SupportServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
