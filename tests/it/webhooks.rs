//! Webhooks: audit events reach a real receiver that verifies them with the
//! Standard Webhooks reference implementation (tests/support/
//! webhook_receiver.py); a receiver that is down loses nothing; a receiver
//! with another secret refuses every delivery.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, reserve_port, unique_email, SupportServer, TestApp, PASSWORD};

// Retries 200 ms apart at first, so that a short outage heals quickly.
crate::on_every_backend!(
    settings = &[("webhook_retry_base_ms", "200"), ("webhook_allow_private_addresses", "true")];
    signed_events_reach_the_receiver_after_its_outage_and_none_is_lost,
);

mod ssrf {
    // The defaults: receivers at public addresses only. One attempt.
    crate::on_every_backend!(
        settings = &[("webhook_max_attempts", "1")];
        webhooks_cannot_be_pointed_at_loopback_or_private_addresses,
    );

    async fn webhooks_cannot_be_pointed_at_loopback_or_private_addresses(app: &crate::common::TestApp) {
        super::ssrf(app).await;
    }
}

mod dead {
    // Two attempts 100 ms apart, then dead.
    crate::on_every_backend!(
        settings = &[("webhook_retry_base_ms", "100"), ("webhook_max_attempts", "2"), ("webhook_allow_private_addresses", "true")];
        a_delivery_that_never_succeeds_ends_dead_and_stays_in_the_history,
    );

    async fn a_delivery_that_never_succeeds_ends_dead_and_stays_in_the_history(app: &crate::common::TestApp) {
        super::dead_letters(app).await;
    }
}

mod claims {
    // A receiver that is never there, retried soon: the delivery stays due.
    crate::on_every_backend!(
        settings = &[("webhook_retry_base_ms", "200"), ("webhook_allow_private_addresses", "true")];
        a_worker_whose_claim_ran_out_never_touches_the_new_holders_delivery,
    );

    async fn a_worker_whose_claim_ran_out_never_touches_the_new_holders_delivery(
        app: &crate::common::TestApp,
    ) {
        super::lapsed_claim(app).await;
    }
}

/// A worker whose claim on a delivery ran out, and another instance took
/// the delivery, neither takes it for an attempt nor records an outcome on
/// it (else both would send it).
async fn lapsed_claim(app: &TestApp) {
    use latchkey::store::Attempted;
    let admin = admin_token(app).await;
    hook_to_nowhere(app, &admin).await;
    app.register(&unique_email("hooks-claim"), PASSWORD).await;
    let store = &app.services.store;
    // Claimed as a worker would, a minute from now: due by then, and past
    // any claim the service's own worker holds now. (PostgreSQL skips a row
    // the service's worker is updating just then: try again.)
    let at = latchkey::clock::now_ms() + 60_000;
    let deadline = Instant::now() + Duration::from_secs(5);
    let id = loop {
        if let Some(row) = store.claim_deliveries(at, 30_000, 20).await.unwrap().first() {
            break row.id;
        }
        assert!(Instant::now() < deadline, "the delivery never became due");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let held = at + 30_000;
    let until = held + 1_000;
    let attempts = store.take_delivery(id, held, until).await.unwrap();
    assert!(attempts.is_some_and(|n| n >= 1), "a claim still held is taken");

    // The claim ran out and another instance took the delivery.
    let theirs = until + 123_456;
    app.sql(&format!(
        "UPDATE webhook_deliveries SET claimed_until = {theirs} WHERE id = {id}"
    ))
    .await;
    let attempts = format!("SELECT CAST(attempts AS BIGINT) FROM webhook_deliveries WHERE id = {id}");
    let before = app.count(&attempts).await;
    assert_eq!(store.take_delivery(id, until, until + 2_000).await.unwrap(), None);
    assert_eq!(
        app.count(&attempts).await,
        before,
        "a refused take counts no attempt"
    );
    let delivered = Attempted {
        at,
        status: Some(200),
        error: None,
        next: None,
        dead: false,
    };
    assert!(!store.delivery_attempted(id, until, &delivered).await.unwrap());
    let given_up = Attempted {
        error: Some("given up"),
        status: None,
        dead: true,
        ..delivered
    };
    assert!(!store.delivery_attempted(id, until, &given_up).await.unwrap());
    let query = format!(
        "SELECT claimed_until FROM webhook_deliveries WHERE id = {id} \
         AND delivered_at IS NULL AND dead_at IS NULL"
    );
    assert_eq!(
        app.count(&query).await,
        theirs,
        "the new holder's claim is intact"
    );
}

/// A receiver that is never there: the delivery is dead after the last
/// attempt, and the history keeps it with its error.
async fn dead_letters(app: &TestApp) {
    let admin = admin_token(app).await;
    let hook = hook_to_nowhere(app, &admin).await;
    app.register(&unique_email("hooks-dead"), PASSWORD).await;
    let id = hook["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let history: Value = app
            .get_bearer(&format!("/admin/webhooks/{id}/deliveries"), &admin)
            .await
            .json()
            .await
            .unwrap();
        let list = history["deliveries"].as_array().unwrap();
        if list.len() == 1 && list[0]["state"] == "dead" {
            assert_eq!(list[0]["attempts"], 2, "{history:#}");
            assert!(list[0]["last_error"].is_string() && list[0]["dead_at"].is_string());
            break;
        }
        assert!(Instant::now() < deadline, "{history:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Dead stays dead: no further attempt.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let history: Value = app
        .get_bearer(&format!("/admin/webhooks/{id}/deliveries"), &admin)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(history["deliveries"][0]["attempts"], 2);
    // The admin's registration is in the trail, with its client.
    let trail: Value = app
        .get_bearer("/admin/events?kind=webhook.added", &admin)
        .await
        .json()
        .await
        .unwrap();
    assert!(trail["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["reason"] == id));
}

/// A name other than `localhost` that resolves to non-public addresses
/// only: this machine's host name (Debian and containers map it to a
/// loopback or private address), as a DNS name an attacker controls would.
async fn a_name_of_a_private_address() -> String {
    let name = std::fs::read_to_string("/etc/hostname")
        .unwrap_or_default()
        .trim()
        .to_string();
    let addrs: Vec<_> = tokio::net::lookup_host((name.as_str(), 80))
        .await
        .map(|a| a.collect())
        .unwrap_or_default();
    assert!(
        !name.is_empty() && !addrs.is_empty() && addrs.iter().all(|a| !latchkey::webhooks::is_public(a.ip())),
        "this test needs the host name ({name:?}) to resolve to private addresses only: {addrs:?}"
    );
    name
}

/// Whoever may register a webhook could make the service call its own
/// loopback listeners, the cloud's metadata address or the private network
/// (and read each answer's status in the history). Refused when registered
/// by address or `localhost`; a name that resolves to such an address (or
/// one changed behind the service's back) fails at delivery without a
/// connection.
async fn ssrf(app: &TestApp) {
    let admin = admin_token(app).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    let accepting = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let add = |url: String| {
        let admin = admin.clone();
        async move {
            app.http
                .post(app.url("/admin/webhooks"))
                .bearer_auth(&admin)
                .json(&json!({"url": url}))
                .send()
                .await
                .unwrap()
        }
    };
    for url in [
        format!("http://127.0.0.1:{port}/in"),
        format!("http://localhost:{port}/in"),
        format!("http://[::ffff:127.0.0.1]:{port}/in"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/in".to_string(),
        // Special-purpose ranges a review found accepted (and delivered
        // to): benchmarking, the 6to4 relay, and IPv6 blocks that embed an
        // IPv4 address (6to4 of 10.0.0.1, Teredo). Refused at registration:
        // nothing is sent to them.
        "http://198.18.0.1/in".to_string(),
        "http://192.88.99.1/in".to_string(),
        "http://[2002:a00:1::1]/in".to_string(),
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/in".to_string(),
    ] {
        let r = add(url.clone()).await;
        assert_eq!(r.status(), 400, "{url}");
    }
    let r = add("https://hooks.example.com/in".into()).await;
    assert_eq!(r.status(), 201);
    let hook: Value = r.json().await.unwrap();
    let id = hook["id"].as_str().unwrap();
    let name = a_name_of_a_private_address().await;
    app.sql(&format!(
        "UPDATE webhooks SET url = 'http://{name}:{port}/in' WHERE id = '{id}'"
    ))
    .await;
    app.register(&unique_email("hooks-ssrf"), PASSWORD).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let delivery = loop {
        let history: Value = app
            .get_bearer(&format!("/admin/webhooks/{id}/deliveries"), &admin)
            .await
            .json()
            .await
            .unwrap();
        let list = history["deliveries"].as_array().unwrap();
        // (A delivery attempted before the change of address fails on the
        // name hooks.example.com instead.)
        let refused = |d: &&Value| {
            d["state"] == "dead"
                && d["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("no public address"))
        };
        if let Some(d) = list.iter().find(refused) {
            break d.clone();
        }
        assert!(Instant::now() < deadline, "{history:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(delivery["last_status"].is_null(), "{delivery}");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    accepting.abort();
}

/// A webhook for `user.registered` at an address where nothing listens.
async fn hook_to_nowhere(app: &TestApp, admin: &str) -> Value {
    let r = app
        .http
        .post(app.url("/admin/webhooks"))
        .bearer_auth(admin)
        .json(
            &json!({"url": format!("http://127.0.0.1:{}/never", free_port()), "kinds": ["user.registered"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json().await.unwrap()
}

async fn admin_token(app: &TestApp) -> String {
    app.admin_client().await.1
}

fn receiver(out: &std::path::Path, port: u16, secret: &str) -> SupportServer {
    SupportServer::start(
        "webhook_receiver.py",
        &[out.as_os_str(), port.to_string().as_ref(), secret.as_ref()],
        "pip install standardwebhooks",
    )
}

fn received(out: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn signed_events_reach_the_receiver_after_its_outage_and_none_is_lost(app: &TestApp) {
    let admin = admin_token(app).await;
    let dir = tempfile::tempdir().unwrap();
    let add = |url: String, kinds: Value| {
        let admin = admin.clone();
        async move {
            let r = app
                .http
                .post(app.url("/admin/webhooks"))
                .bearer_auth(&admin)
                .json(&json!({"url": url, "kinds": kinds}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()
        }
    };
    // The receiver is down when the events happen: nothing listens yet
    // (the port is held, so nothing else takes it before the receiver).
    let reserved = reserve_port();
    let port = reserved.port;
    let hook = add(
        format!("http://127.0.0.1:{port}/hook"),
        json!(["session.", "user.deleted"]),
    )
    .await;
    let secret = hook["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));
    // A second endpoint whose receiver holds another secret: it must refuse.
    let wrong_reserved = reserve_port();
    let wrong_port = wrong_reserved.port;
    let wrong = add(
        format!("http://127.0.0.1:{wrong_port}/hook"),
        json!(["session.created"]),
    )
    .await;
    let wrong_out = dir.path().join("wrong.jsonl");
    let _wrong_receiver = receiver(&wrong_out, wrong_port, &latchkey::webhooks::new_secret());
    drop(wrong_reserved);

    let email = unique_email("hooks");
    let pair = app.register_verified(&email, PASSWORD).await;
    let user = app
        .get_bearer("/auth/me", pair["access_token"].as_str().unwrap())
        .await
        .json::<Value>()
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let second: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    app.post("/auth/logout", json!({"refresh_token": second["refresh_token"]}))
        .await;
    let r = app
        .http
        .delete(app.url(&format!("/admin/users/{user}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // What the trail holds for the kinds the endpoint asked for.
    let trail: Value = app
        .get_bearer(&format!("/admin/events?user_id={user}"), &admin)
        .await
        .json()
        .await
        .unwrap();
    let wanted: Vec<i64> = trail["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let k = e["kind"].as_str().unwrap();
            k.starts_with("session.") || k == "user.deleted"
        })
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        wanted.len(),
        5,
        "two sessions created, one ended by its logout and one by the erasure, the erasure: {trail:#}"
    );

    // Down for a while: every delivery fails at least once and waits.
    let id = hook["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let history: Value = app
            .get_bearer(&format!("/admin/webhooks/{id}/deliveries"), &admin)
            .await
            .json()
            .await
            .unwrap();
        let list = history["deliveries"].as_array().unwrap();
        assert!(list.iter().all(|d| d["state"] == "pending"), "{history:#}");
        if list.len() == wanted.len() && list.iter().all(|d| d["last_error"].is_string()) {
            break;
        }
        assert!(Instant::now() < deadline, "{history:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Up again: every event arrives, verified by the reference implementation.
    let out = dir.path().join("hook.jsonl");
    let _receiver = receiver(&out, port, &secret);
    drop(reserved);
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        let got = received(&out);
        if got.len() >= wanted.len() {
            break got;
        }
        assert!(Instant::now() < deadline, "delivered: {got:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for g in &got {
        assert_eq!(g["ok"], true, "{g}");
        assert_eq!(g["id"], format!("msg_{}", g["payload"]["data"]["id"]));
        assert_eq!(g["payload"]["type"], g["payload"]["data"]["kind"]);
        assert_eq!(g["payload"]["data"]["user_id"], user.as_str());
    }
    let mut delivered: Vec<i64> = got
        .iter()
        .map(|g| g["payload"]["data"]["id"].as_i64().unwrap())
        .collect();
    delivered.sort_unstable();
    delivered.dedup();
    assert_eq!(
        delivered, wanted,
        "every event the endpoint asked for, and only those"
    );
    // Nothing personal or secret went out.
    let text = std::fs::read_to_string(&out).unwrap();
    for s in [email.as_str(), PASSWORD, pair["refresh_token"].as_str().unwrap()] {
        assert!(!text.contains(s));
    }
    // The history says delivered, after more than one attempt.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let history: Value = app
            .get_bearer(&format!("/admin/webhooks/{id}/deliveries"), &admin)
            .await
            .json()
            .await
            .unwrap();
        let list = history["deliveries"].as_array().unwrap();
        if list.iter().all(|d| d["state"] == "delivered") {
            assert!(list
                .iter()
                .all(|d| d["attempts"].as_i64() > Some(1) && d["last_status"] == 204));
            break;
        }
        assert!(Instant::now() < deadline, "{history:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The receiver with another secret refused what it got.
    let deadline = Instant::now() + Duration::from_secs(10);
    while received(&wrong_out).is_empty() {
        assert!(Instant::now() < deadline, "the second endpoint got nothing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(received(&wrong_out).iter().all(|g| g["ok"] == false));
    // Listing and removing.
    let list: Value = app
        .get_bearer("/admin/webhooks", &admin)
        .await
        .json()
        .await
        .unwrap();
    assert!(list["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w.get("secret").is_none()));
    let wid = wrong["id"].as_str().unwrap();
    let r = app
        .http
        .delete(app.url(&format!("/admin/webhooks/{wid}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = app
        .get_bearer(&format!("/admin/webhooks/{wid}/deliveries"), &admin)
        .await;
    assert_eq!(r.status(), 404);
    // Bad registrations: 400, nothing stored.
    for bad in [
        json!({"url": "ftp://x/"}),
        json!({"url": "http://127.0.0.1:1/", "kinds": ["session.nope"]}),
        json!({"url": "http://127.0.0.1:1/", "secret": "mine"}),
    ] {
        let r = app
            .http
            .post(app.url("/admin/webhooks"))
            .bearer_auth(&admin)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
}
