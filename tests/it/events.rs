//! The audit trail: every security-relevant change leaves exactly one event
//! of a stable kind, without a secret or an email in it, readable through
//! `GET /admin/events` with filters and a cursor.

use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};

// No grace for a rotated refresh token: its second use is reuse at once.
crate::on_every_backend!(
    settings = &[("refresh_grace_secs", "0")];
    every_security_change_of_an_account_leaves_one_event,
    events_page_by_kind_family_time_and_cursor,
);

async fn admin_token(app: &TestApp) -> (String, String) {
    app.admin_client().await
}

async fn events(app: &TestApp, token: &str, query: &str) -> Value {
    let r = app.get_bearer(&format!("/admin/events?{query}"), token).await;
    assert_eq!(r.status(), 200, "{query}");
    r.json().await.unwrap()
}

fn kinds(page: &Value) -> Vec<String> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let reason = e["reason"].as_str().map(|r| format!(":{r}")).unwrap_or_default();
            format!("{}{reason}", e["kind"].as_str().unwrap())
        })
        .collect()
}

async fn every_security_change_of_an_account_leaves_one_event(app: &TestApp) {
    let (admin_id, admin) = admin_token(app).await;
    let email = unique_email("audit");
    let pair = app.register_verified(&email, PASSWORD).await;
    let me: Value = app
        .get_bearer("/auth/me", pair["access_token"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    let id = me["id"].as_str().unwrap().to_string();
    // A wrong password; a session whose refresh token is reused; one that
    // logs out; one that changes the password (ending the first).
    assert_eq!(app.login(&email, "wrong but secret 7").await.status(), 401);
    let second: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let again = json!({"refresh_token": second["refresh_token"]});
    assert_eq!(app.post("/auth/refresh", again.clone()).await.status(), 200);
    // Past the (zero) grace window, to the millisecond.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(app.post("/auth/refresh", again).await.status(), 401);
    let third: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    app.post("/auth/logout", json!({"refresh_token": third["refresh_token"]}))
        .await;
    let fourth: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let r = app
        .http
        .post(app.url("/auth/password"))
        .bearer_auth(fourth["access_token"].as_str().unwrap())
        .json(&json!({"current_password": PASSWORD, "new_password": "a second long passphrase"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // Sessions record the client address they started from...
    let before = events(app, &admin, &format!("user_id={id}&kind=session.created")).await;
    assert_eq!(before["events"][0]["ip"], "127.0.0.1");
    // An administrator disables, enables and erases the account.
    for body in [json!({"disabled": true}), json!({"disabled": false})] {
        let r = app
            .http
            .patch(app.url(&format!("/admin/users/{id}")))
            .bearer_auth(&admin)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = app
        .http
        .delete(app.url(&format!("/admin/users/{id}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    let page = events(app, &admin, &format!("user_id={id}")).await;
    assert_eq!(
        kinds(&page),
        [
            "user.registered",
            "user.verified",
            "session.created:latchkey",
            "login.failed:invalid_credentials",
            "session.created:latchkey",
            "session.reuse_detected:refresh_reuse",
            "session.created:latchkey",
            "session.ended:logout",
            "session.created:latchkey",
            "session.ended:password_change",
            "password.changed",
            "session.ended:user_disabled",
            "user.disabled",
            "user.enabled",
            "user.deleted",
        ]
        .map(String::from),
        "{page:#}"
    );
    let list = page["events"].as_array().unwrap();
    for e in list {
        assert_eq!(e["user_id"], id.as_str());
        assert!(e["at"].as_str().unwrap().ends_with('Z'));
    }
    let by_admin: Vec<&Value> = list.iter().filter(|e| e["actor"] == admin_id.as_str()).collect();
    assert_eq!(by_admin.len(), 3, "disable, enable and erase name their client");
    // ...which the erasure cleared, with everything personal.
    let created = list.iter().find(|e| e["kind"] == "session.created").unwrap();
    assert!(created["ip"].is_null(), "{created}");
    assert!(created["session_id"].is_string());
    // A failed login of an unknown email is recorded alike, without an account.
    assert_eq!(
        app.login(&unique_email("audit-nobody"), "wrong but secret 8")
            .await
            .status(),
        401
    );
    let failed = events(app, &admin, "kind=login.failed").await;
    assert!(
        failed["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "invalid_credentials" && e["user_id"].is_null()),
        "{failed:#}"
    );
    // Nothing secret, and no email, anywhere in the trail.
    let all = events(app, &admin, "limit=200").await;
    let text = all.to_string();
    for s in [
        email.as_str(),
        PASSWORD,
        "wrong but secret 7",
        "a second long passphrase",
        pair["refresh_token"].as_str().unwrap(),
        second["refresh_token"].as_str().unwrap(),
        fourth["access_token"].as_str().unwrap(),
    ] {
        assert!(!text.contains(s), "{s} reached the audit trail");
    }
}

async fn events_page_by_kind_family_time_and_cursor(app: &TestApp) {
    let (_, admin) = admin_token(app).await;
    let email = unique_email("audit-page");
    let pair = app.register_verified(&email, PASSWORD).await;
    let id = app
        .get_bearer("/auth/me", pair["access_token"].as_str().unwrap())
        .await
        .json::<Value>()
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for _ in 0..3 {
        assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    }
    // A family: every session.* event of the account.
    let family = events(app, &admin, &format!("user_id={id}&kind=session.")).await;
    assert_eq!(kinds(&family).len(), 4, "{family:#}");
    // Pages of two, oldest first, each id after the last.
    let p1 = events(app, &admin, &format!("user_id={id}&limit=2")).await;
    assert_eq!(kinds(&p1), ["user.registered", "user.verified"].map(String::from));
    let cursor = p1["next_cursor"].as_str().unwrap();
    let p2 = events(app, &admin, &format!("user_id={id}&limit=2&cursor={cursor}")).await;
    assert_eq!(kinds(&p2).len(), 2);
    assert!(p2["events"][0]["id"].as_i64() > p1["events"][1]["id"].as_i64());
    let p3 = events(
        app,
        &admin,
        &format!(
            "user_id={id}&limit=2&cursor={}",
            p2["next_cursor"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(
        kinds(&p3).len(),
        2,
        "six events: registered, verified, four sessions"
    );
    assert!(p3["next_cursor"].is_null());
    // Time: nothing after the far future, everything before it.
    let none = events(app, &admin, &format!("user_id={id}&from=2100-01-01T00:00:00Z")).await;
    assert!(kinds(&none).is_empty());
    let before = events(app, &admin, &format!("user_id={id}&before=2100-01-01T00:00:00Z")).await;
    assert_eq!(kinds(&before).len(), 6);
    // Client mistakes: 400 naming the parameter, never a 500.
    for bad in [
        "limit=0",
        "cursor=-1",
        "cursor=x",
        "from=today",
        "kind=a%00b",
        "user_id=%27%20OR%201=1",
    ] {
        let r = app.get_bearer(&format!("/admin/events?{bad}"), &admin).await;
        assert_eq!(r.status(), 400, "{bad}");
        let name = bad.split('=').next().unwrap();
        let body: Value = r.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains(name), "{body}");
    }
    // Users cannot read the trail.
    let r = app
        .get_bearer("/admin/events", pair["access_token"].as_str().unwrap())
        .await;
    assert_eq!(r.status(), 403);
}
