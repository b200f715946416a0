//! Sessions a user can see and end: `GET /auth/sessions`, `DELETE
//! /auth/sessions/{id}`, `DELETE /auth/sessions[?others=true]`, and a
//! password change that may keep the other sessions.

use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};

crate::on_every_backend!(
    a_user_sees_their_live_sessions_and_which_is_current,
    ending_a_session_revokes_its_tokens_everywhere_at_once,
    no_one_sees_or_ends_another_users_session,
    ending_the_other_sessions_keeps_the_current_one,
    ending_every_session_ends_the_current_one_too,
    a_password_change_may_keep_the_other_sessions,
    session_routes_need_a_live_access_token,
    the_store_rotates_a_refresh_token_exactly_when_the_decision_says_rotate,
);
crate::on_redis_cluster!(ending_a_session_revokes_its_tokens_everywhere_at_once,);

/// A login with a user agent of its own; returns its token pair.
async fn login_as(app: &TestApp, email: &str, agent: &str) -> Value {
    let r = app
        .http
        .post(app.url("/auth/login"))
        .header("user-agent", agent)
        .json(&json!({"email": email, "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn access(pair: &Value) -> &str {
    pair["access_token"].as_str().unwrap()
}

/// The `sid` claim of an access token (read, not verified: the test's own token).
fn sid(pair: &Value) -> String {
    use base64::Engine;
    let payload = access(pair).split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    let claims: Value = serde_json::from_slice(&bytes).unwrap();
    claims["sid"].as_str().unwrap().to_string()
}

async fn sessions(app: &TestApp, pair: &Value) -> Vec<Value> {
    let r = app.get_bearer("/auth/sessions", access(pair)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-store");
    let body: Value = r.json().await.unwrap();
    body["sessions"].as_array().unwrap().clone()
}

async fn delete(app: &TestApp, path: &str, pair: &Value) -> reqwest::Response {
    app.http
        .delete(app.url(path))
        .bearer_auth(access(pair))
        .send()
        .await
        .unwrap()
}

async fn refresh_status(app: &TestApp, pair: &Value) -> u16 {
    app.post("/auth/refresh", json!({"refresh_token": pair["refresh_token"]}))
        .await
        .status()
        .as_u16()
}

async fn a_user_sees_their_live_sessions_and_which_is_current(app: &TestApp) {
    let email = unique_email("sessions-list");
    let first = app.register_verified(&email, PASSWORD).await;
    let phone = login_as(app, &email, "Phone/1.0 (test)").await;
    let laptop = login_as(app, &email, "Laptop/2.0 (test)").await;
    // Someone else's session is never listed.
    let other = unique_email("sessions-other");
    app.register_verified(&other, PASSWORD).await;
    // The first session refreshes: its last use moves.
    let r = app
        .post("/auth/refresh", json!({"refresh_token": first["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 200);
    // A logged-out session is not live.
    let gone = login_as(app, &email, "Gone/0").await;
    let r = app
        .post("/auth/logout", json!({"refresh_token": gone["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 204);

    let list = sessions(app, &phone).await;
    let ids: Vec<&str> = list.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(list.len(), 3, "{list:#?}");
    for pair in [&first, &phone, &laptop] {
        assert!(ids.contains(&sid(pair).as_str()), "{list:#?}");
    }
    for s in &list {
        let current = s["id"] == sid(&phone);
        assert_eq!(s["current"], current, "{s}");
        assert_eq!(s["client_id"], "latchkey");
        assert_eq!(s["ip"], "127.0.0.1");
        assert!(s["created_at"].as_str().unwrap().ends_with('Z'), "{s}");
        assert!(s["expires_at"].as_str().unwrap() > s["created_at"].as_str().unwrap());
        assert!(s["last_used_at"].as_str().unwrap() >= s["created_at"].as_str().unwrap());
    }
    let of = |id: &str| list.iter().find(|s| s["id"] == id).unwrap().clone();
    assert_eq!(of(&sid(&phone))["user_agent"], "Phone/1.0 (test)");
    assert_eq!(of(&sid(&laptop))["user_agent"], "Laptop/2.0 (test)");
    // Newest first (sessions started in the same millisecond in either order).
    let started: Vec<&str> = list.iter().map(|s| s["created_at"].as_str().unwrap()).collect();
    assert!(started.windows(2).all(|w| w[0] >= w[1]), "{started:?}");
    assert_eq!(of(&sid(&laptop))["created_at"], list[0]["created_at"]);
    // No token or hash of one in the answer.
    let text = serde_json::to_string(&list).unwrap();
    for pair in [&first, &phone, &laptop] {
        assert!(!text.contains(pair["refresh_token"].as_str().unwrap()));
    }
}

async fn ending_a_session_revokes_its_tokens_everywhere_at_once(app: &TestApp) {
    let email = unique_email("sessions-end");
    let first = app.register_verified(&email, PASSWORD).await;
    let second = login_as(app, &email, "Second").await;
    let twin = if app.is_postgres() {
        Some(app.twin().await)
    } else {
        None
    };
    if let Some(t) = &twin {
        assert_eq!(t.validate(access(&first)).await, 200);
    }
    let r = delete(app, &format!("/auth/sessions/{}", sid(&first)), &second).await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(access(&first)).await, 401);
    assert_eq!(refresh_status(app, &first).await, 401);
    if let Some(t) = &twin {
        // The other instance learns it within the second, as for a logout.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while t.validate(access(&first)).await != 401 {
            assert!(
                std::time::Instant::now() < deadline,
                "the twin still accepts the token"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert_eq!(app.validate(access(&second)).await, 200);
    let list = sessions(app, &second).await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], sid(&second));
    // Ending it again: it is no longer the user's live session.
    let r = delete(app, &format!("/auth/sessions/{}", sid(&first)), &second).await;
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "NOT_FOUND");
    // A session may end itself.
    let r = delete(app, &format!("/auth/sessions/{}", sid(&second)), &second).await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(access(&second)).await, 401);
    if let Some(t) = twin {
        t.stop().await;
    }
}

async fn no_one_sees_or_ends_another_users_session(app: &TestApp) {
    let alice = app.register_verified(&unique_email("sessions-a"), PASSWORD).await;
    let mallory = app.register_verified(&unique_email("sessions-m"), PASSWORD).await;
    // Mallory knows (or guesses) Alice's session id: the answer is the one
    // for a session that does not exist, and nothing happens.
    let r = delete(app, &format!("/auth/sessions/{}", sid(&alice)), &mallory).await;
    assert_eq!(r.status(), 404);
    let r2 = delete(
        app,
        "/auth/sessions/00000000-0000-4000-8000-000000000000",
        &mallory,
    )
    .await;
    assert_eq!(r2.status(), 404);
    assert_eq!(r.text().await.unwrap(), r2.text().await.unwrap());
    assert_eq!(app.validate(access(&alice)).await, 200);
    assert_eq!(sessions(app, &alice).await.len(), 1);
    // Ids that cannot be one: the same answer, never a 500.
    for bad in ["x", "%00", "..%2F..", &"a".repeat(300)] {
        let r = delete(app, &format!("/auth/sessions/{bad}"), &mallory).await;
        assert_eq!(r.status(), 404, "{bad}");
    }
}

async fn ending_the_other_sessions_keeps_the_current_one(app: &TestApp) {
    let email = unique_email("sessions-others");
    let first = app.register_verified(&email, PASSWORD).await;
    let second = login_as(app, &email, "Second").await;
    let current = login_as(app, &email, "Current").await;
    let r = delete(app, "/auth/sessions?others=true", &current).await;
    assert_eq!(r.status(), 204);
    for pair in [&first, &second] {
        assert_eq!(app.validate(access(pair)).await, 401);
        assert_eq!(refresh_status(app, pair).await, 401);
    }
    assert_eq!(app.validate(access(&current)).await, 200);
    assert_eq!(refresh_status(app, &current).await, 200);
    let list = sessions(app, &login_as(app, &email, "Next").await).await;
    assert_eq!(list.len(), 2, "the current one (refreshed) and the new one");
    // Anything but true or false is a client mistake.
    let r = delete(app, "/auth/sessions?others=maybe", &current).await;
    assert_eq!(r.status(), 400);
}

async fn ending_every_session_ends_the_current_one_too(app: &TestApp) {
    let email = unique_email("sessions-all");
    let first = app.register_verified(&email, PASSWORD).await;
    let current = login_as(app, &email, "Current").await;
    let r = delete(app, "/auth/sessions", &current).await;
    assert_eq!(r.status(), 204);
    for pair in [&first, &current] {
        assert_eq!(app.validate(access(pair)).await, 401);
        assert_eq!(refresh_status(app, pair).await, 401);
    }
    // The account itself is fine: a new login works.
    let again = login_as(app, &email, "Again").await;
    assert_eq!(sessions(app, &again).await.len(), 1);
}

async fn a_password_change_may_keep_the_other_sessions(app: &TestApp) {
    let email = unique_email("sessions-pw");
    let other = app.register_verified(&email, PASSWORD).await;
    let current = login_as(app, &email, "Current").await;
    let new_password = "another long passphrase 42";
    let r = app
        .http
        .post(app.url("/auth/password"))
        .bearer_auth(access(&current))
        .json(
            &json!({"current_password": PASSWORD, "new_password": new_password,
                      "end_other_sessions": false}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(access(&other)).await, 200);
    assert_eq!(refresh_status(app, &other).await, 200);
    // Left out, the field means true: the others end.
    let r = app
        .http
        .post(app.url("/auth/password"))
        .bearer_auth(access(&current))
        .json(&json!({"current_password": new_password, "new_password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(access(&other)).await, 401);
    assert_eq!(app.validate(access(&current)).await, 200);
    // Not a boolean: refused before anything changes.
    let r = app
        .http
        .post(app.url("/auth/password"))
        .bearer_auth(access(&current))
        .json(
            &json!({"current_password": PASSWORD, "new_password": new_password,
                      "end_other_sessions": "no"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
}

async fn session_routes_need_a_live_access_token(app: &TestApp) {
    let pair = app
        .register_verified(&unique_email("sessions-auth"), PASSWORD)
        .await;
    let id = sid(&pair);
    for (method, path) in [
        (reqwest::Method::GET, "/auth/sessions".to_string()),
        (reqwest::Method::DELETE, "/auth/sessions".to_string()),
        (reqwest::Method::DELETE, format!("/auth/sessions/{id}")),
    ] {
        let none = app
            .http
            .request(method.clone(), app.url(&path))
            .send()
            .await
            .unwrap();
        assert_eq!(none.status(), 401, "{method} {path}");
        let forged = app
            .http
            .request(method.clone(), app.url(&path))
            .bearer_auth("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.")
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), 401, "{method} {path}");
    }
    // A logged-out session's token cannot list or end anything.
    app.post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    let r = app.get_bearer("/auth/sessions", access(&pair)).await;
    assert_eq!(r.status(), 401);
}

/// Refresh is decided in one place, `refresh::decide`: the statement that
/// looks a token up and rotates it in one round trip
/// (`Store::rotate_live_refresh`) carries the same condition in SQL, and
/// this checks that the two agree on every state a token can be in (live,
/// past its session's end, rotated within the grace window and past it, its
/// session ended, its account disabled), on each backend.
async fn the_store_rotates_a_refresh_token_exactly_when_the_decision_says_rotate(app: &TestApp) {
    use latchkey::crypto::sha256;
    use latchkey::domain::refresh::{decide, RefreshDecision, RefreshState};
    use latchkey::store::LiveRotation;

    let store = &app.services.store;
    let grace = app.services.config.accounts.refresh_grace.as_millis() as i64;
    let email = unique_email("refresh-agree");
    app.register_verified(&email, PASSWORD).await;
    let user_id = store.user_by_email(&email).await.unwrap().unwrap().id;
    // The cases: how to bring a fresh token into its state, and when (ms
    // from the record's own times) to present it.
    enum Then {
        Now,
        AtSessionEnd,
        RotatedThenWithinGrace,
        RotatedThenPastGrace,
        LoggedOut,
        Disabled,
    }
    for case in [
        Then::Now,
        Then::AtSessionEnd,
        Then::RotatedThenWithinGrace,
        Then::RotatedThenPastGrace,
        Then::LoggedOut,
        Then::Disabled,
    ] {
        let pair = login_as(app, &email, "agreement").await;
        let token = pair["refresh_token"].as_str().unwrap().to_string();
        match case {
            Then::RotatedThenWithinGrace | Then::RotatedThenPastGrace => {
                let r = app.post("/auth/refresh", json!({"refresh_token": token})).await;
                assert_eq!(r.status(), 200);
            }
            Then::LoggedOut => {
                let r = app.post("/auth/logout", json!({"refresh_token": token})).await;
                assert!(r.status().is_success());
            }
            Then::Disabled => {
                store
                    .set_user_disabled(&user_id, true, latchkey::clock::now_ms(), "test")
                    .await
                    .unwrap();
            }
            Then::Now | Then::AtSessionEnd => {}
        }
        let hash = sha256(token.as_bytes());
        let rec = store.refresh_token(&hash).await.unwrap().unwrap();
        let now = match case {
            Then::AtSessionEnd => rec.session_expires_at,
            Then::RotatedThenWithinGrace => rec.rotated_at.unwrap() + grace / 2,
            Then::RotatedThenPastGrace => rec.rotated_at.unwrap() + grace + 1,
            _ => latchkey::clock::now_ms(),
        };
        let decision = decide(RefreshState::from(&rec), now, grace);
        let (_, rotated) = store
            .rotate_live_refresh(LiveRotation {
                old: hash,
                new: sha256(format!("successor of {token}").as_bytes()),
                successor: b"sealed successor".to_vec(),
                session_id: rec.session_id.clone(),
                client_id: None,
                now,
            })
            .await
            .unwrap()
            .expect("the record of an existing token");
        assert_eq!(
            rotated,
            decision == RefreshDecision::Rotate,
            "the statement and the decision ({decision:?}) disagree on {rec:?} at {now}"
        );
        if matches!(case, Then::Disabled) {
            store
                .set_user_disabled(&user_id, false, latchkey::clock::now_ms(), "test")
                .await
                .unwrap();
        }
    }
}
