//! Operations and conventions: health, readiness with a failing Redis,
//! request ids, 404/405, metrics, and the OpenAPI document.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{OwnRedis, TestApp};

crate::on_every_backend!(
    health_request_ids_and_unknown_routes,
    openapi_documents_every_endpoint,
    metrics_are_exposed
);
crate::on_redis_cluster!(health_request_ids_and_unknown_routes,);

async fn health_request_ids_and_unknown_routes(app: &TestApp) {
    let r = app.get("/health/live").await;
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert!(id.len() >= 16);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"status": "ok"})
    );
    let r = app.get("/health/ready").await;
    assert_eq!(r.status(), 200);
    let checks = &r.json::<Value>().await.unwrap()["checks"];
    assert_eq!(checks["database"], "ok");
    if app.is_postgres() {
        assert_eq!(checks["redis"], "ok");
    }
    // A sane client id is echoed; an insane one is replaced.
    let r = app
        .http
        .get(app.url("/health/live"))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "abc-123");
    let r = app
        .http
        .get(app.url("/health/live"))
        .header("x-request-id", "bad id with spaces")
        .send()
        .await
        .unwrap();
    assert_ne!(r.headers()["x-request-id"], "bad id with spaces");

    let r = app.get("/no/such/path").await;
    assert_eq!(r.status(), 404);
    assert!(r.headers().contains_key("x-request-id"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "NOT_FOUND");
    let r = app.http.delete(app.url("/auth/login")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "METHOD_NOT_ALLOWED");
    let r = app.get("/auth/login").await;
    assert_eq!(r.status(), 405);
}

/// Endpoints of the API contract: this list, and every `METHOD /path` row of
/// docs/api.md, so that a new endpoint there cannot be missed.
fn api_md_endpoints() -> Vec<(String, String)> {
    let mut eps: Vec<(String, String)> = [
        ("post", "/auth/register"),
        ("post", "/auth/verify-otp"),
        ("post", "/auth/resend-otp"),
        ("post", "/auth/login"),
        ("post", "/auth/refresh"),
        ("post", "/auth/logout"),
        ("get", "/auth/me"),
        ("post", "/auth/password"),
        ("post", "/auth/password-reset"),
        ("post", "/auth/password-reset/confirm"),
        ("get", "/auth/validate"),
        ("get", "/.well-known/jwks.json"),
        ("get", "/.well-known/openid-configuration"),
        ("post", "/oauth/token"),
        ("post", "/oauth/introspect"),
        ("post", "/oauth/revoke"),
        ("get", "/health/live"),
        ("get", "/health/ready"),
        ("get", "/openapi.json"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    let api_md = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md");
    {
        let text = std::fs::read_to_string(api_md).expect("docs/api.md, the API contract");
        for line in text.lines().filter(|l| l.starts_with("| `")) {
            let cell = line.split('`').nth(1).unwrap_or("");
            if let Some((m, p)) = cell.split_once(' ') {
                if matches!(m, "GET" | "POST" | "PUT" | "DELETE" | "PATCH") {
                    let ep = (m.to_lowercase(), p.to_string());
                    if !eps.contains(&ep) {
                        eps.push(ep);
                    }
                }
            }
        }
    }
    eps
}

async fn openapi_documents_every_endpoint(app: &TestApp) {
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), 200);
    let doc: Value = r.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    for (method, path) in api_md_endpoints() {
        assert!(
            doc["paths"][&path][&method].is_object(),
            "{method} {path} is not in /openapi.json"
        );
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    assert!(doc["components"]["securitySchemes"]["oauth2"].is_object());
}

async fn metrics_are_exposed(app: &TestApp) {
    app.get("/health/live").await;
    app.post(
        "/auth/login",
        serde_json::json!({"email": "nobody@example.test", "password": "whatever123"}),
    )
    .await;
    // Not on the public listener: its counters tell which emails have accounts.
    assert_eq!(app.get("/metrics").await.status(), 404);
    let text = app.metrics().await;
    for name in [
        "latchkey_http_requests_total",
        "latchkey_http_request_duration_seconds_bucket",
        "latchkey_hash_seconds_bucket",
        "latchkey_db_query_seconds_bucket",
        "latchkey_db_pool_connections",
        "process_resident_memory_bytes",
        "latchkey_build_info",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(
        text.contains("route=\"/auth/login\""),
        "routes are labelled by template"
    );
    // A path with a parameter counts under its template; an unknown path
    // and a method the route does not serve as `unmatched`: never a raw
    // path or a series per route and method, which would let any client
    // grow the label set.
    let id = "0190b3f1-0000-7000-8000-00000000beef";
    let gone = app
        .http
        .delete(app.url(&format!("/auth/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 401);
    assert_eq!(app.get("/oauth/token").await.status(), 405);
    assert_eq!(app.get(&format!("/no/such/{id}")).await.status(), 404);
    let text = app.metrics().await;
    for series in [
        "latchkey_http_requests_total{route=\"/auth/sessions/{id}\",method=\"DELETE\",status=\"4xx\"}",
        "latchkey_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"4xx\"}",
    ] {
        assert!(text.contains(series), "{series} missing from /metrics");
    }
    assert!(!text.contains(id), "a raw path became a label");
    assert!(
        !text.contains("route=\"/oauth/token\",method=\"GET\""),
        "a 405 opened a series of its own"
    );
    // The request layer renders its families after the recorder's: each
    // family is still declared once.
    let mut families: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let declared = families.len();
    families.sort_unstable();
    families.dedup();
    assert_eq!(families.len(), declared, "a metric family declared twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_a_failing_redis_and_recovers_without_restart() {
    let mut redis = OwnRedis::start().await;
    let app = TestApp::embedded(&[("redis_url", &redis.url())]).await;
    // Behind a load balancer: Redis is named but does not fail readiness.
    let reported = app.twin_with(&[("redis_readiness", "reported")]).await;
    assert_eq!(app.get("/health/ready").await.status(), 200);
    redis.stop();
    let r = reported.get("/health/ready").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["checks"]["redis"], "failing", "{body}");
    reported.stop().await;
    let r = app.get("/health/ready").await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["failing"], serde_json::json!(["redis"]));
    assert!(body["message"].as_str().unwrap().contains("redis"));
    assert_eq!(body["error"], "UNAVAILABLE");
    // Validation keeps working without Redis: it never asks Redis.
    assert_eq!(app.get("/health/live").await.status(), 200);
    redis.restart().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.get("/health/ready").await.status() != 200 {
        assert!(Instant::now() < deadline, "readiness did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_answers_503_quickly() {
    let app = TestApp::embedded(&[("database_acquire_timeout_ms", "100")]).await;
    let latchkey::store::Db::Sqlite(pool) = &app.services.store.db else {
        unreachable!()
    };
    // The embedded pool has one connection: hold it.
    let held = pool.acquire().await.unwrap();
    let start = Instant::now();
    let r = app
        .post(
            "/auth/resend-otp",
            serde_json::json!({"email": "someone@example.test"}),
        )
        .await;
    assert_eq!(r.status(), 503);
    assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "OVERLOADED");
    // Validation does not need the database and keeps working.
    assert_eq!(app.get("/health/live").await.status(), 200);
    drop(held);
    let r = app
        .post(
            "/auth/resend-otp",
            serde_json::json!({"email": "someone@example.test"}),
        )
        .await;
    assert_eq!(r.status(), 202);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_is_answered_503() {
    // 10 ms is less than one argon2id hash (about 16 ms): register cannot finish in time.
    let app = TestApp::embedded(&[("request_timeout_ms", "10")]).await;
    let start = Instant::now();
    let r = app
        .post(
            "/auth/register",
            serde_json::json!({"email": "late@example.test", "password": "long enough"}),
        )
        .await;
    assert_eq!(r.status(), 503);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "OVERLOADED");
    assert_eq!(app.get("/health/live").await.status(), 200);
    app.stop().await;
}

/// The pool tests a connection before handing it out only when it has been
/// idle for a second or more (under load, sqlx's test on every acquire was
/// a second round trip per statement): connections the database dropped
/// while idle (a restart, `pg_terminate_backend`, an idle timeout) are
/// still replaced, and no request fails for them.
#[sqlx::test(migrations = false)]
async fn connections_the_database_dropped_while_idle_are_replaced_before_use(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    // Ten connections from the start (the service's background workers
    // take one or two of the dropped ones; requests get the others).
    let settings = [("rate_limit", "off"), ("database_min_connections", "10")];
    let app = TestApp::postgres(opts, &settings).await;
    let email = crate::common::unique_email("idle");
    app.register_verified(&email, crate::common::PASSWORD).await;
    let start = Instant::now();
    while app.services.store.pool_stats().0 < 10 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the pool never opened ten connections"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dropped = app
        .count(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .await;
    assert!(dropped >= 5, "the pool held {dropped} other connections");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..3 {
        let logins = (0..10).map(|_| app.login(&email, crate::common::PASSWORD));
        for r in futures_util::future::join_all(logins).await {
            assert_eq!(r.status(), 200, "a dropped idle connection reached a request");
        }
    }
    app.stop().await;
}
