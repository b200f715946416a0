//! Rate limits and brute-force protection, on the in-process and the Redis
//! limiter, across two instances, and with Redis failing mid-test.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::common::{unique_email, OwnRedis, TestApp, PASSWORD};

crate::on_every_backend!(
    a_policy_of_n_lets_exactly_n_of_10n_concurrent_requests_through,
    limited_answers_carry_retry_after_and_ratelimit_headers,
    brute_force_delays_then_answers_the_same_for_unknown_accounts,
    a_success_resets_the_brute_force_count,
    a_lock_expires_on_time,
    parallel_guesses_cannot_outrun_the_brute_force_rules,
    password_changes_are_limited_per_account,
    hot_keys_never_exceed_the_limit_and_lease_from_redis,
);
crate::on_redis_cluster!(
    a_policy_of_n_lets_exactly_n_of_10n_concurrent_requests_through,
    brute_force_delays_then_answers_the_same_for_unknown_accounts,
    parallel_guesses_cannot_outrun_the_brute_force_rules,
    hot_keys_never_exceed_the_limit_and_lease_from_redis,
);

const POLICY: &[(&str, &str)] = &[
    ("rate_limit_resend_ip", "5/60"),
    ("rate_limit_resend_email", "off"),
];

/// Fires `n` resend requests at once, spread over `apps`; counts statuses.
async fn burst(apps: &[&TestApp], n: usize) -> HashMap<u16, usize> {
    let mut handles = Vec::new();
    for i in 0..n {
        let app = apps[i % apps.len()];
        let (http, url) = (app.http.clone(), app.url("/auth/resend-otp"));
        handles.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .json(&json!({"email": format!("burst{i}@example.test")}))
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }));
    }
    let mut counts = HashMap::new();
    for h in handles {
        *counts.entry(h.await.unwrap()).or_insert(0) += 1;
    }
    counts
}

async fn with_policy(app: &TestApp) -> TestApp {
    app.twin_with(POLICY).await
}

async fn a_policy_of_n_lets_exactly_n_of_10n_concurrent_requests_through(app: &TestApp) {
    let a = with_policy(app).await;
    let counts = burst(&[&a], 50).await;
    assert_eq!(counts.get(&202), Some(&5), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&45), "{counts:?}");
    a.stop().await;
    if app.is_postgres() {
        // Two instances sharing Redis share the buckets.
        let prefix = format!("t{}:", uuid::Uuid::new_v4().simple());
        let x = app
            .twin_with(&[POLICY, &[("redis_key_prefix", prefix.as_str())]].concat())
            .await;
        let y = x.twin().await;
        let counts = burst(&[&x, &y], 50).await;
        assert_eq!(counts.get(&202), Some(&5), "two instances: {counts:?}");
        x.stop().await;
        y.stop().await;
    }
}

async fn limited_answers_carry_retry_after_and_ratelimit_headers(app: &TestApp) {
    let a = with_policy(app).await;
    for i in 0..5 {
        let r = a
            .post("/auth/resend-otp", json!({"email": format!("h{i}@example.test")}))
            .await;
        assert_eq!(r.status(), 202);
    }
    let r = a
        .post("/auth/resend-otp", json!({"email": "h9@example.test"}))
        .await;
    assert_eq!(r.status(), 429);
    let h = |name: &str| r.headers()[name].to_str().unwrap().parse::<u64>().unwrap();
    // 5 per 60 s: one token every 12 s.
    assert!(
        (11..=12).contains(&h("retry-after")),
        "retry-after {}",
        h("retry-after")
    );
    assert_eq!(h("ratelimit-limit"), 5);
    assert_eq!(h("ratelimit-remaining"), 0);
    assert!(
        (58..=60).contains(&h("ratelimit-reset")),
        "reset {}",
        h("ratelimit-reset")
    );
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "RATE_LIMITED");
    a.stop().await;
}

async fn brute_force_delays_then_answers_the_same_for_unknown_accounts(app: &TestApp) {
    let known = unique_email("bf");
    app.register_verified(&known, PASSWORD).await;
    let unknown = unique_email("bf-ghost");
    for email in [&known, &unknown] {
        for i in 0..5 {
            let r = app.login(email, "wrong password").await;
            assert_eq!(r.status(), 401, "failure {i}");
        }
        // The 6th try comes too soon, whatever the password.
        let r = app.login(email, PASSWORD).await;
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "TOO_MANY_ATTEMPTS");
    }
    // The delay ends on time.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(app.login(&known, PASSWORD).await.status(), 200);
}

/// Short configured rules (one free failure, a delay, then a 3 s lock): the
/// lock refuses even the right password, tells how long in `Retry-After`,
/// holds past the delay and ends on time.
async fn a_lock_expires_on_time(app: &TestApp) {
    let a = app
        .twin_with(&[
            ("brute_force_free_failures", "2"),
            ("brute_force_lock_after", "3"),
            ("brute_force_max_delay_secs", "1"),
            ("brute_force_lock_secs", "4"),
        ])
        .await;
    let email = unique_email("bf-lock");
    a.register_verified(&email, PASSWORD).await;
    assert_eq!(a.login(&email, "wrong password").await.status(), 401);
    assert_eq!(a.login(&email, "wrong password").await.status(), 401);
    let r = a.login(&email, PASSWORD).await;
    assert_eq!(r.status(), 429, "the second failure brings a 1 s delay");
    assert_eq!(r.headers()["retry-after"], "1");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // The third failure locks; the lock starts when the attempt is admitted:
    // after `t0`, before `t1`. Judged only from those two instants, so that
    // a slow machine cannot fail a correct build.
    let lock = std::time::Duration::from_secs(4);
    let t0 = std::time::Instant::now();
    assert_eq!(a.login(&email, "wrong password").await.status(), 401);
    let t1 = std::time::Instant::now();
    let r = a.login(&email, PASSWORD).await;
    assert_eq!(r.status(), 429, "locked: even the right password waits");
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=4).contains(&retry), "Retry-After {retry}");
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "TOO_MANY_ATTEMPTS");
    // Past what a delay would have been (1 s), still locked: asserted when
    // the answer came before the earliest end of the lock.
    tokio::time::sleep_until((t1 + std::time::Duration::from_millis(1500)).into()).await;
    let status = a.login(&email, PASSWORD).await.status();
    if t0.elapsed() < lock {
        assert_eq!(status, 429, "still locked before its end");
    }
    // Over once its latest end has passed.
    tokio::time::sleep_until((t1 + lock + std::time::Duration::from_millis(200)).into()).await;
    assert_eq!(a.login(&email, PASSWORD).await.status(), 200, "the lock is over");
    a.stop().await;
}

async fn a_success_resets_the_brute_force_count(app: &TestApp) {
    let email = unique_email("bf-reset");
    app.register_verified(&email, PASSWORD).await;
    for _ in 0..4 {
        assert_eq!(app.login(&email, "wrong password").await.status(), 401);
    }
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    for _ in 0..4 {
        assert_eq!(
            app.login(&email, "wrong password").await.status(),
            401,
            "the count started over"
        );
    }
}

/// Guesses sent all at once are counted before any password is checked, so
/// exactly the free ones are judged and the rest wait, as if they had come
/// one by one; on PostgreSQL + Redis spread over two instances.
async fn parallel_guesses_cannot_outrun_the_brute_force_rules(app: &TestApp) {
    // No verification is shed for its wait (503 OVERLOADED, the attempt
    // taken back), however busy the machine running the test is: each of
    // the free guesses is judged (the test apps' objective is a minute).
    let email = unique_email("bf-parallel");
    app.register_verified(&email, PASSWORD).await;
    let twin = if app.is_postgres() {
        Some(app.twin().await)
    } else {
        None
    };
    let apps: Vec<&TestApp> = std::iter::once(app).chain(twin.as_ref()).collect();
    let guesses = (0..40).map(|i| apps[i % apps.len()].login(&email, "wrong password"));
    let mut counts: HashMap<(u16, String), usize> = HashMap::new();
    for r in futures_util::future::join_all(guesses).await {
        let status = r.status().as_u16();
        let error = r.json::<Value>().await.unwrap()["error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        *counts.entry((status, error)).or_insert(0) += 1;
    }
    assert_eq!(
        counts.get(&(401, "INVALID_CREDENTIALS".to_string())),
        Some(&5),
        "only the free attempts are judged: {counts:?}"
    );
    assert_eq!(
        counts.get(&(429, "TOO_MANY_ATTEMPTS".to_string())),
        Some(&35),
        "{counts:?}"
    );
    // The right password must wait out the delay too, then works.
    assert_eq!(app.login(&email, PASSWORD).await.status(), 429);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    if let Some(t) = twin {
        t.stop().await;
    }
}

/// A stolen access token is no unlimited oracle for the current password.
async fn password_changes_are_limited_per_account(app: &TestApp) {
    let a = app.twin_with(&[("rate_limit_password_account", "3/600")]).await;
    let email = unique_email("pw-limit");
    let at = a.register_verified(&email, PASSWORD).await["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    let change = |current: &'static str| {
        a.http
            .post(a.url("/auth/password"))
            .bearer_auth(&at)
            .json(&json!({"current_password": current, "new_password": "a brand new password"}))
            .send()
    };
    for _ in 0..3 {
        assert_eq!(change("wrong password").await.unwrap().status(), 401);
    }
    let r = change(PASSWORD).await.unwrap();
    assert_eq!(r.status(), 429, "even the right password waits");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "RATE_LIMITED");
    // Another account is not affected.
    let other = a.register_verified(&unique_email("pw-other"), PASSWORD).await;
    let r = a
        .http
        .post(a.url("/auth/password"))
        .bearer_auth(other["access_token"].as_str().unwrap())
        .json(&json!({"current_password": PASSWORD, "new_password": "a brand new password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_off_turns_every_limit_and_delay_off() {
    let app = TestApp::embedded(&[("rate_limit", "off"), ("rate_limit_resend_ip", "1/60")]).await;
    let counts = burst(&[&app], 20).await;
    assert_eq!(counts.get(&202), Some(&20), "{counts:?}");
    let email = unique_email("off");
    for _ in 0..8 {
        assert_eq!(app.login(&email, "wrong password").await.status(), 401);
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failure_falls_back_as_configured_and_never_500s() {
    let mut redis = OwnRedis::start().await;
    // resend per IP falls back to local buckets; register per IP fails open.
    let app = TestApp::embedded(&[
        ("redis_url", &redis.url()),
        ("rate_limit_resend_ip", "5/60,local"),
        ("rate_limit_resend_email", "off"),
        ("rate_limit_register_ip", "1/60,open"),
        ("rate_limit_register_email", "off"),
    ])
    .await;
    assert_eq!(burst(&[&app], 3).await.get(&202), Some(&3));
    redis.stop();
    let counts = burst(&[&app], 20).await;
    assert_eq!(
        counts.get(&202),
        Some(&5),
        "local fallback enforces the limit per instance: {counts:?}"
    );
    assert!(!counts.keys().any(|s| *s >= 500), "{counts:?}");
    for i in 0..3 {
        let r = app
            .post(
                "/auth/register",
                json!({"email": format!("open{i}@example.test"), "password": PASSWORD}),
            )
            .await;
        assert_eq!(r.status(), 201, "register fails open while Redis is down");
    }
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("latchkey_ratelimit_fallback_total"),
        "fallbacks are counted"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_is_unlimited_by_default_and_limitable() {
    let app = TestApp::embedded(&[]).await;
    let pair = app.register_verified(&unique_email("v"), PASSWORD).await;
    let at = pair["access_token"].as_str().unwrap().to_string();
    for _ in 0..50 {
        assert_eq!(app.validate(&at).await, 200);
    }
    app.stop().await;
    let app = TestApp::embedded(&[("rate_limit_validate", "3/60")]).await;
    let pair = app.register_verified(&unique_email("v"), PASSWORD).await;
    let at = pair["access_token"].as_str().unwrap().to_string();
    let statuses: Vec<u16> = futures_util::future::join_all((0..10).map(|_| app.validate(&at))).await;
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 7, "{statuses:?}");
    app.stop().await;
}

/// A hot key on the Redis limiter takes leases of tokens instead of one per
/// call: far fewer round trips, and still never more than the limit across
/// two instances. (On the embedded backend: the in-process buckets, exact.)
async fn hot_keys_never_exceed_the_limit_and_lease_from_redis(app: &TestApp) {
    const N: usize = 400;
    let (limit, prefix) = (format!("{N}/600"), format!("t{}:", uuid::Uuid::new_v4().simple()));
    let x = app
        .twin_with(&[
            ("rate_limit_validate", limit.as_str()),
            ("redis_key_prefix", prefix.as_str()),
        ])
        .await;
    let at = x.register_verified(&unique_email("lease"), PASSWORD).await["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    let apps = if app.is_postgres() {
        vec![x.twin().await, x]
    } else {
        vec![x]
    };
    // 10N validations, 16 at a time per instance, until every one has answered.
    let mut allowed = 0;
    for round in 0..(10 * N / 32) {
        let batch = (0..32).map(|i| apps[(round + i) % apps.len()].validate(&at));
        for status in futures_util::future::join_all(batch).await {
            assert!(status == 200 || status == 429, "{status}");
            allowed += (status == 200) as usize;
        }
    }
    assert!(allowed <= N, "{allowed} let through, limit {N}");
    if app.is_postgres() {
        // Unused leased tokens may be lost (at most a sixteenth of the room
        // per grant), never more let through.
        assert!(allowed >= N - N / 8, "{allowed} of {N}");
        // The metrics recorder is process-wide (both instances and every other
        // test in this binary); only this test leases on the validate policy.
        let metrics = apps[0].metrics().await;
        let leased = metrics
            .lines()
            .find(|l| l.starts_with("latchkey_ratelimit_leased_total{policy=\"validate\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        eprintln!("lease test: {allowed} of {N} let through, {leased} from leases");
        assert!(
            leased >= (allowed / 2) as f64,
            "{leased} of {allowed} answered from leases"
        );
    } else {
        assert_eq!(allowed, N);
    }
    for a in apps {
        a.stop().await;
    }
}

/// Cold keys share Redis calls and stay exact: 300 clients, each with a
/// limit of one, ask twice at once (600 checks), and one busy client with a
/// limit of 50 asks 200 times, all concurrently, through one limiter, then
/// 60 times more. Every client gets exactly its limit, and Redis's own count of script calls
/// (`INFO commandstats`, on a Redis of this test's own) shows that the
/// checks shared calls: one call per check would be about 700.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_that_ask_redis_share_calls_and_every_bucket_stays_exact() {
    use latchkey::limits::PolicyMetrics;
    use std::time::Duration;

    let redis = OwnRedis::start().await;
    let limiter = limiter_on(&redis).await;
    let one = open_policy(1, Duration::from_secs(600));
    let fifty = open_policy(50, Duration::from_secs(600));
    let (m1, m50) = (
        PolicyMetrics::new("batch_one", &one, true),
        PolicyMetrics::new("batch_fifty", &fifty, true),
    );
    let calls = || async {
        let client = redis::Client::open(redis.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        ["evalsha", "eval"]
            .iter()
            .filter_map(|cmd| {
                let line = info.lines().find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))?;
                line.split(['=', ',']).nth(1)?.parse::<u64>().ok()
            })
            .sum::<u64>()
    };
    let before = calls().await;
    let keys: Vec<String> = (0..300)
        .map(|i| format!("10.9.{}.{}", i / 256, i % 256))
        .collect();
    let cold = keys
        .iter()
        .chain(keys.iter())
        .map(|k| limiter.check_policy("batch_one", one, &m1, k));
    let busy = (0..200).map(|_| limiter.check_policy("batch_fifty", fifty, &m50, "busy"));
    let (cold, busy) = tokio::join!(
        futures_util::future::join_all(cold),
        futures_util::future::join_all(busy)
    );
    let allowed = |v: &[Result<(), latchkey::limits::Limited>]| v.iter().filter(|r| r.is_ok()).count();
    assert_eq!(allowed(&cold), 300, "each of the 300 clients exactly once");
    // Leased tokens still unused after the burst are this instance's: the
    // next checks take them, and the total is the limit, exactly.
    let mut busy_allowed = allowed(&busy);
    assert!(busy_allowed <= 50, "{busy_allowed} of 50 in the burst");
    for _ in 0..60 {
        busy_allowed += limiter
            .check_policy("batch_fifty", fifty, &m50, "busy")
            .await
            .is_ok() as usize;
    }
    assert_eq!(busy_allowed, 50);
    let used = calls().await - before;
    assert!((1..100).contains(&used), "{used} script calls for 860 checks");
}

/// A limiter (one instance) on `redis`, with no named policies.
async fn limiter_on(redis: &OwnRedis) -> latchkey::limits::Limiter {
    use latchkey::cache::{RedisConfig, RedisHandle};
    use latchkey::settings::Secret;
    let cfg = RedisConfig {
        urls: vec![Secret(redis.url())],
        cluster: false,
        key_prefix: "limits:".into(),
        required_for_readiness: true,
    };
    let handle = RedisHandle::connect(&cfg).await.unwrap();
    latchkey::limits::Limiter::new(true, Some(handle))
}

/// A client that comes back steadily never waits for Redis after its first
/// check: its lease is renewed in the background before it runs out or
/// expires. Leases here live 50 ms (a sixteenth of a 0.8 s window) and the
/// client checks every 5 ms for a second: without renewals, one check in ten
/// would find its lease expired and wait for a round trip. A check that is
/// not answered at its first poll is counted, then awaited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_comes_back_steadily_is_answered_from_renewed_leases_without_waiting() {
    use latchkey::limits::PolicyMetrics;
    use std::time::Duration;

    let redis = OwnRedis::start().await;
    let limiter = limiter_on(&redis).await;
    let policy = open_policy(3200, Duration::from_millis(800));
    let m = PolicyMetrics::new("steady", &policy, true);
    limiter
        .check_policy("steady", policy, &m, "client")
        .await
        .unwrap();
    let (mut waited, mut answered) = (0, 0);
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut check = std::pin::pin!(limiter.check_policy("steady", policy, &m, "client"));
        let r = match futures_util::poll!(check.as_mut()) {
            std::task::Poll::Ready(r) => {
                answered += 1;
                r
            }
            std::task::Poll::Pending => {
                waited += 1;
                check.await
            }
        };
        assert!(r.is_ok(), "{r:?}");
    }
    assert!(
        waited <= 3,
        "{waited} of 200 checks waited for Redis ({answered} answered at once)"
    );
}

/// A limiter used first from a runtime that then shut down (a gateway
/// serving thread that ended) had its batcher task on that runtime. Checks
/// from another runtime start the batcher again and keep asking Redis,
/// instead of taking the fallback for good (here `open`: every check would
/// pass). The connection lives on the test's own runtime, as the service's
/// shared one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_whose_batcher_stopped_with_its_runtime_starts_it_again() {
    use latchkey::limits::PolicyMetrics;
    use std::sync::Arc;
    use std::time::Duration;

    let redis = OwnRedis::start().await;
    let limiter = Arc::new(limiter_on(&redis).await);
    let two = open_policy(2, Duration::from_secs(600));
    let m = Arc::new(PolicyMetrics::new("restart", &two, true));
    // The first check, from a runtime of its own on a thread of its own,
    // which then ends.
    let (l, mm) = (limiter.clone(), m.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(rt.block_on(l.check_policy("restart", two, &mm, "k")).is_ok());
    })
    .join()
    .unwrap();
    // The second token, then a refusal: Redis's answers, not the fallback.
    assert!(limiter.check_policy("restart", two, &m, "k").await.is_ok());
    let third = limiter.check_policy("restart", two, &m, "k").await;
    assert!(
        third.is_err(),
        "the third check of a limit of two passed: {third:?}"
    );
}

/// A policy of `limit` per `window` that lets requests through when Redis
/// cannot be asked (so that a test sees Redis's answers, or none).
fn open_policy(limit: u32, window: std::time::Duration) -> latchkey::limits::Policy {
    latchkey::limits::Policy {
        limit,
        window,
        fallback: latchkey::limits::Fallback::Open,
    }
}
