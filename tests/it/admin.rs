//! The admin API and the client_credentials grant that opens it: only a
//! client token with the `latchkey:admin` scope gets in; what an
//! administrator does to an account is felt at once (sessions end, logins
//! stop, erased data is gone).

use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oauth::form;

crate::on_every_backend!(
    the_client_credentials_grant_gives_a_scoped_token_and_no_refresh_token,
    every_admin_route_refuses_users_scopeless_clients_and_no_token,
    admins_list_accounts_with_filters_and_a_cursor,
    a_disabled_account_cannot_log_in_and_its_sessions_end_at_once,
    erasing_an_account_leaves_nothing_of_it,
    admins_end_sessions_and_mail_reset_codes,
    an_unlock_lifts_the_brute_force_delays_of_every_address,
    a_new_email_must_be_verified_and_ends_every_session,
    a_registration_of_the_address_an_admin_gave_an_account_takes_nothing_over,
    a_registration_of_an_address_an_admin_created_unverified_takes_nothing_over,
    a_code_left_by_a_purged_sign_up_activates_nothing_at_the_address,
    a_login_or_refresh_that_raced_a_disable_gets_no_session,
    a_refused_change_changes_nothing,
    clients_are_registered_listed_changed_and_removed_through_the_admin_api,
);
crate::on_redis_cluster!(an_unlock_lifts_the_brute_force_delays_of_every_address,);

/// A new client that may have `scopes`, and its id and secret.
async fn new_client(app: &TestApp, scopes: &[&str]) -> (String, String) {
    let id = format!("svc-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
    let secret = app
        .services
        .features
        .clients
        .add(&id, Some("service"), &scopes, None)
        .await
        .unwrap()
        .unwrap();
    (id, secret)
}

/// A token of a new client with the admin scope.
pub async fn admin_token(app: &TestApp) -> String {
    let (id, secret) = new_client(app, &["latchkey:admin"]).await;
    let r = form(
        app,
        "/oauth/token",
        Some((&id, &secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    body["access_token"].as_str().unwrap().to_string()
}

async fn call(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut rb = app.http.request(method, app.url(path));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    rb.send().await.unwrap()
}

async fn user_id(app: &TestApp, pair: &Value) -> String {
    let me: Value = app
        .get_bearer("/auth/me", pair["access_token"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    me["id"].as_str().unwrap().to_string()
}

async fn the_client_credentials_grant_gives_a_scoped_token_and_no_refresh_token(app: &TestApp) {
    let (id, secret) = new_client(app, &["latchkey:admin", "reports:read"]).await;
    let grant = |scope: Option<&'static str>| {
        let (id, secret) = (id.clone(), secret.clone());
        async move {
            let mut fields = vec![("grant_type", "client_credentials")];
            if let Some(s) = scope {
                fields.push(("scope", s));
            }
            form(app, "/oauth/token", Some((&id, &secret)), &fields).await
        }
    };
    // Nothing asked: everything the client may have.
    let r = grant(None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-store");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["scope"], "latchkey:admin reports:read");
    assert!(body.get("refresh_token").is_none(), "{body}");
    let token = body["access_token"].as_str().unwrap();
    // Resource servers validate it like any token; its subject is the client.
    let r = app.get_bearer("/auth/validate", token).await;
    assert_eq!(r.status(), 200);
    let claims: Value = r.json().await.unwrap();
    assert_eq!(claims["sub"], id.as_str());
    assert_eq!(claims["client_id"], id.as_str());
    assert_eq!(claims["scope"], "latchkey:admin reports:read");
    // It is no user's token: user endpoints refuse it.
    for path in ["/auth/me", "/auth/sessions"] {
        assert_eq!(app.get_bearer(path, token).await.status(), 401, "{path}");
    }
    // A narrower scope is granted as asked.
    let r = grant(Some("reports:read")).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["scope"], "reports:read");
    // A scope the client may not have: invalid_scope, and no token.
    let r = grant(Some("latchkey:admin other:thing")).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "invalid_scope");
    // A client with no scope at all gets nothing.
    let (bare, bare_secret) = new_client(app, &[]).await;
    let r = form(
        app,
        "/oauth/token",
        Some((&bare, &bare_secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    assert_eq!(r.status(), 400);
    // Without the client's secret: invalid_client.
    let r = form(
        app,
        "/oauth/token",
        Some((&id, "wrong")),
        &[("grant_type", "client_credentials")],
    )
    .await;
    assert_eq!(r.status(), 401);
}

/// Every admin route (`id` an account, `hook` a webhook), with a body where
/// it takes one; the erasing calls last.
fn admin_routes(id: &str, hook: &str) -> Vec<(reqwest::Method, String, Option<Value>)> {
    use reqwest::Method;
    vec![
        (Method::GET, "/admin/users".into(), None),
        (
            Method::POST,
            "/admin/users".into(),
            Some(json!({"email": unique_email("admin-route"), "password": "a long enough password"})),
        ),
        (Method::GET, format!("/admin/webhooks/{hook}/deliveries"), None),
        (Method::DELETE, format!("/admin/webhooks/{hook}"), None),
        (Method::GET, "/admin/events".into(), None),
        (Method::GET, "/admin/webhooks".into(), None),
        (
            Method::POST,
            "/admin/webhooks".into(),
            Some(json!({"url": "https://hooks.example.com/never"})),
        ),
        (Method::GET, format!("/admin/users/{id}"), None),
        (
            Method::PATCH,
            format!("/admin/users/{id}"),
            Some(json!({"disabled": true})),
        ),
        (Method::DELETE, format!("/admin/users/{id}/sessions"), None),
        (Method::POST, format!("/admin/users/{id}/unlock"), None),
        (Method::POST, format!("/admin/users/{id}/password-reset"), None),
        (Method::DELETE, format!("/admin/users/{id}/factors"), None),
        (Method::DELETE, format!("/admin/users/{id}"), None),
        (Method::GET, "/admin/clients".into(), None),
        (
            Method::POST,
            "/admin/clients".into(),
            Some(json!({"client_id": "never-added", "scopes": ["latchkey:admin"]})),
        ),
        (Method::GET, "/admin/clients/never-added".into(), None),
        (
            Method::PUT,
            "/admin/clients/never-added/oidc".into(),
            Some(json!({"oidc": null})),
        ),
        (Method::DELETE, "/admin/clients/never-added".into(), None),
    ]
}

async fn every_admin_route_refuses_users_scopeless_clients_and_no_token(app: &TestApp) {
    let hook = app
        .services
        .features
        .webhooks
        .add("test", "https://hooks.example.com/never", &[])
        .await
        .unwrap()
        .webhook
        .id;
    let email = unique_email("admin-authz");
    let pair = app.register_verified(&email, PASSWORD).await;
    let id = user_id(app, &pair).await;
    let user_token = pair["access_token"].as_str().unwrap().to_string();
    let (other, other_secret) = new_client(app, &["reports:read"]).await;
    let r = form(
        app,
        "/oauth/token",
        Some((&other, &other_secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    let scopeless: Value = r.json().await.unwrap();
    let scopeless = scopeless["access_token"].as_str().unwrap().to_string();
    for (method, path, body) in admin_routes(&id, &hook) {
        let r = call(app, method.clone(), &path, None, body.clone()).await;
        assert_eq!(r.status(), 401, "no token: {method} {path}");
        let r = call(app, method.clone(), &path, Some("not.a.token"), body.clone()).await;
        assert_eq!(r.status(), 401, "garbage: {method} {path}");
        for (who, token) in [
            ("a user", &user_token),
            ("a client without the scope", &scopeless),
        ] {
            let r = call(app, method.clone(), &path, Some(token), body.clone()).await;
            assert_eq!(r.status(), 403, "{who}: {method} {path}");
            let www = r.headers()["www-authenticate"].to_str().unwrap().to_string();
            assert!(www.contains("insufficient_scope"), "{www}");
            let b: Value = r.json().await.unwrap();
            assert_eq!(b["error"], "INSUFFICIENT_SCOPE");
        }
    }
    // Nothing happened to the account: it logs in, its session lives, no mail.
    assert_eq!(app.validate(&user_token).await, 200);
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    assert_eq!(app.mails_to(&email).len(), 1, "only the verification code");
    // A removed client's token opens nothing, at once.
    let (gone, gone_secret) = new_client(app, &["latchkey:admin"]).await;
    let r = form(
        app,
        "/oauth/token",
        Some((&gone, &gone_secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    let gone_token: Value = r.json().await.unwrap();
    let gone_token = gone_token["access_token"].as_str().unwrap().to_string();
    assert!(app.services.features.clients.remove(&gone).await.unwrap());
    for (method, path, body) in admin_routes(&id, &hook) {
        let r = call(app, method.clone(), &path, Some(&gone_token), body).await;
        assert_eq!(r.status(), 401, "a removed client: {method} {path}");
    }
    // With the scope, every route answers.
    let admin = admin_token(app).await;
    for (method, path, body) in admin_routes(&id, &hook) {
        let r = call(app, method.clone(), &path, Some(&admin), body).await;
        assert!(r.status().is_success(), "{method} {path}: {}", r.status());
    }
}

async fn admins_list_accounts_with_filters_and_a_cursor(app: &TestApp) {
    let admin = admin_token(app).await;
    let tag = format!("lst{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut emails = Vec::new();
    for i in 0..3 {
        let e = format!("{tag}-{i}@example.test");
        app.register_verified(&e, PASSWORD).await;
        emails.push(e);
    }
    let unverified = format!("{tag}-u@example.test");
    app.register(&unverified, PASSWORD).await;
    let list = |q: String| {
        let admin = admin.clone();
        async move {
            let r = call(
                app,
                reqwest::Method::GET,
                &format!("/admin/users?{q}"),
                Some(&admin),
                None,
            )
            .await;
            assert_eq!(r.status(), 200, "{q}");
            r.json::<Value>().await.unwrap()
        }
    };
    let all = list(format!("email_prefix={tag}")).await;
    let got: Vec<&str> = all["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["email"].as_str().unwrap())
        .collect();
    assert_eq!(
        got,
        [emails[0].as_str(), &emails[1], &emails[2], &unverified],
        "creation order"
    );
    assert!(all["next_cursor"].is_null());
    let u = &all["users"][0];
    assert!(
        u.get("password_hash").is_none() && !u.to_string().contains("argon2"),
        "{u}"
    );
    assert_eq!(u["email_verified"], true);
    assert_eq!(u["disabled"], false);
    // Pages of two.
    let p1 = list(format!("email_prefix={tag}&limit=2")).await;
    assert_eq!(p1["users"].as_array().unwrap().len(), 2);
    let cursor = p1["next_cursor"].as_str().unwrap();
    let p2 = list(format!("email_prefix={tag}&limit=2&cursor={cursor}")).await;
    let got: Vec<&str> = p2["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["email"].as_str().unwrap())
        .collect();
    assert_eq!(got, [emails[2].as_str(), &unverified]);
    assert!(p2["next_cursor"].is_null());
    // Filters.
    let v = list(format!("email_prefix={tag}&verified=false")).await;
    assert_eq!(v["users"].as_array().unwrap().len(), 1);
    assert_eq!(v["users"][0]["email"], unverified.as_str());
    let future = list(format!("email_prefix={tag}&created_from=2100-01-01T00:00:00Z")).await;
    assert!(future["users"].as_array().unwrap().is_empty());
    let past = list(format!("email_prefix={tag}&created_before=2100-01-01T00:00:00Z")).await;
    assert_eq!(past["users"].as_array().unwrap().len(), 4);
    // One account by id.
    let id = all["users"][1]["id"].as_str().unwrap();
    let r = call(
        app,
        reqwest::Method::GET,
        &format!("/admin/users/{id}"),
        Some(&admin),
        None,
    )
    .await;
    let one: Value = r.json().await.unwrap();
    assert_eq!(one["email"], emails[1].as_str());
    for missing in ["00000000-0000-7000-8000-000000000000", "nope", "%00"] {
        let r = call(
            app,
            reqwest::Method::GET,
            &format!("/admin/users/{missing}"),
            Some(&admin),
            None,
        )
        .await;
        assert_eq!(r.status(), 404, "{missing}");
    }
    // Client mistakes are 400 with the parameter named, never a 500.
    for bad in [
        "verified=yes",
        "limit=0",
        "limit=201",
        "limit=x",
        "cursor=abc",
        "created_from=yesterday",
        "email_prefix=a%00b",
    ] {
        let r = call(
            app,
            reqwest::Method::GET,
            &format!("/admin/users?{bad}"),
            Some(&admin),
            None,
        )
        .await;
        assert_eq!(r.status(), 400, "{bad}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["error"], "INVALID_REQUEST");
        let name = bad.split('=').next().unwrap();
        assert!(b["message"].as_str().unwrap().contains(name), "{b}");
    }
}

async fn a_disabled_account_cannot_log_in_and_its_sessions_end_at_once(app: &TestApp) {
    let admin = admin_token(app).await;
    let email = unique_email("admin-disable");
    let pair = app.register_verified(&email, PASSWORD).await;
    let second = app.login(&email, PASSWORD).await.json::<Value>().await.unwrap();
    let id = user_id(app, &pair).await;
    let patch = |body: Value| {
        let (admin, id) = (admin.clone(), id.clone());
        async move {
            call(
                app,
                reqwest::Method::PATCH,
                &format!("/admin/users/{id}"),
                Some(&admin),
                Some(body),
            )
            .await
        }
    };
    let r = patch(json!({"disabled": true, "name": "Ada"})).await;
    assert_eq!(r.status(), 200);
    let u: Value = r.json().await.unwrap();
    assert_eq!(u["disabled"], true);
    assert_eq!(u["name"], "Ada");
    for p in [&pair, &second] {
        assert_eq!(app.validate(p["access_token"].as_str().unwrap()).await, 401);
        let r = app
            .post("/auth/refresh", json!({"refresh_token": p["refresh_token"]}))
            .await;
        assert_eq!(r.status(), 401);
    }
    let r = app.login(&email, PASSWORD).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "ACCOUNT_DISABLED");
    // A wrong password still says only that.
    let r = app.login(&email, "not the password at all").await;
    assert_eq!(r.status(), 401);
    // Enabled again: it logs in; the name can be cleared.
    let r = patch(json!({"disabled": false, "name": null})).await;
    let u: Value = r.json().await.unwrap();
    assert_eq!(u["disabled"], false);
    assert!(u["name"].is_null());
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    // Unknown fields and wrong types are refused, nothing changes.
    for bad in [
        json!({"disabled": "yes"}),
        json!({"role": "admin"}),
        json!({"name": "x".repeat(1000)}),
    ] {
        let r = patch(bad.clone()).await;
        assert_eq!(r.status(), 400, "{bad}");
    }
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
}

async fn erasing_an_account_leaves_nothing_of_it(app: &TestApp) {
    let admin = admin_token(app).await;
    let email = unique_email("admin-erase");
    let pair = app.register_verified(&email, PASSWORD).await;
    let id = user_id(app, &pair).await;
    // A live reset code too.
    app.post("/auth/password-reset", json!({"email": email})).await;
    let reset = app.wait_for_code(&email, 2).await;
    let r = call(
        app,
        reqwest::Method::DELETE,
        &format!("/admin/users/{id}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(pair["access_token"].as_str().unwrap()).await, 401);
    let r = app
        .post("/auth/refresh", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 401);
    let r = call(
        app,
        reqwest::Method::GET,
        &format!("/admin/users/{id}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 404);
    assert!(app.services.store.user_by_id(&id).await.unwrap().is_none());
    assert!(app.services.store.live_sessions(&id, 0).await.unwrap().is_empty());
    for purpose in [
        latchkey::store::Purpose::VerifyEmail,
        latchkey::store::Purpose::ResetPassword,
    ] {
        assert!(app
            .services
            .store
            .code_for(&email, purpose)
            .await
            .unwrap()
            .is_none());
    }
    let r = app
        .post(
            "/auth/password-reset/confirm",
            json!({"email": email, "code": reset, "new_password": "a new long passphrase"}),
        )
        .await;
    assert_eq!(r.status(), 401, "the reset code went with the account");
    assert_eq!(app.login(&email, PASSWORD).await.status(), 401);
    // The trail keeps the id, and no client address of the account.
    let trail: Value = call(
        app,
        reqwest::Method::GET,
        &format!("/admin/events?user_id={id}"),
        Some(&admin),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    let trail = trail["events"].as_array().unwrap();
    assert!(trail.iter().any(|e| e["kind"] == "user.deleted"));
    assert!(trail.iter().all(|e| e["ip"].is_null()), "{trail:?}");
    // Erasing again: nothing to erase.
    let r = call(
        app,
        reqwest::Method::DELETE,
        &format!("/admin/users/{id}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 404);
    // The email is free for a new account (its code is the third mail).
    app.register(&email, PASSWORD).await;
    let code = app.wait_for_code(&email, 3).await;
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": code}))
        .await;
    assert_eq!(r.status(), 200);
}

async fn admins_end_sessions_and_mail_reset_codes(app: &TestApp) {
    let admin = admin_token(app).await;
    let email = unique_email("admin-sessions");
    let pair = app.register_verified(&email, PASSWORD).await;
    let id = user_id(app, &pair).await;
    let r = call(
        app,
        reqwest::Method::DELETE,
        &format!("/admin/users/{id}/sessions"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(pair["access_token"].as_str().unwrap()).await, 401);
    let r = call(
        app,
        reqwest::Method::POST,
        &format!("/admin/users/{id}/password-reset"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 202);
    let code = app.wait_for_code(&email, 2).await;
    let new_password = "set after an admin's reset";
    let r = app
        .post(
            "/auth/password-reset/confirm",
            json!({"email": email, "code": code, "new_password": new_password}),
        )
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.login(&email, new_password).await.status(), 200);
}

async fn an_unlock_lifts_the_brute_force_delays_of_every_address(app: &TestApp) {
    let admin = admin_token(app).await;
    let email = unique_email("admin-unlock");
    let pair = app.register_verified(&email, PASSWORD).await;
    let id = user_id(app, &pair).await;
    // Wrong passwords until this address must wait: then even the right
    // one is refused for now.
    let mut refused = false;
    for _ in 0..8 {
        if app.login(&email, "a wrong password here").await.status() == 429 {
            refused = true;
            break;
        }
    }
    assert!(refused, "the brute-force rules never delayed this address");
    assert_eq!(app.login(&email, PASSWORD).await.status(), 429);
    let r = call(
        app,
        reqwest::Method::POST,
        &format!("/admin/users/{id}/unlock"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    let trail: Value = app
        .get_bearer(&format!("/admin/events?user_id={id}&kind=user.unlocked"), &admin)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(trail["events"].as_array().unwrap().len(), 1);
}

async fn a_new_email_must_be_verified_and_ends_every_session(app: &TestApp) {
    let admin = admin_token(app).await;
    let old = unique_email("admin-old");
    let new = unique_email("admin-new");
    let pair = app.register_verified(&old, PASSWORD).await;
    let id = user_id(app, &pair).await;
    let patch = |body: Value| {
        let (admin, id) = (admin.clone(), id.clone());
        async move {
            call(
                app,
                reqwest::Method::PATCH,
                &format!("/admin/users/{id}"),
                Some(&admin),
                Some(body),
            )
            .await
        }
    };
    // Another account's email: taken, nothing changes.
    let other = unique_email("admin-other");
    app.register_verified(&other, PASSWORD).await;
    let r = patch(json!({"email": other})).await;
    assert_eq!(r.status(), 409);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "EMAIL_TAKEN");
    assert_eq!(app.validate(pair["access_token"].as_str().unwrap()).await, 200);
    // The change: sessions end, the old address is told, the new one gets a code.
    let r = patch(json!({"email": new.to_uppercase()})).await;
    assert_eq!(r.status(), 200);
    let u: Value = r.json().await.unwrap();
    assert_eq!(u["email"], new.as_str(), "normalised");
    assert_eq!(u["email_verified"], false);
    assert_eq!(app.validate(pair["access_token"].as_str().unwrap()).await, 401);
    let (subject, _) = app.wait_for_mail(&old, 2).await;
    assert!(subject.contains("email address was changed"), "{subject}");
    let code = app.wait_for_code(&new, 1).await;
    // Not before the new address is proven; the old one no longer signs in.
    assert_eq!(app.login(&new, PASSWORD).await.status(), 401);
    assert_eq!(app.login(&old, PASSWORD).await.status(), 401);
    // Never purged as an unfinished sign-up, however long it waits.
    app.services.store.purge_unverified_users(i64::MAX).await.unwrap();
    assert!(app.services.store.user_by_id(&id).await.unwrap().is_some());
    let r = app
        .post("/auth/verify-otp", json!({"email": new, "code": code}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.login(&new, PASSWORD).await.status(),
        200,
        "same password, new email"
    );
}

/// An admin moves an account to a new address; before its owner verifies
/// it, somebody registers that address with their own password. The
/// account is somebody's (its password, its factors): the registration
/// takes it over no more than a verified one. Its password stays, the
/// owner's code stands, and the address gets a notice, no code: whatever
/// code the owner then enters (the latest mailed), the owner's password is
/// the account's, and the registrant's is not.
async fn a_registration_of_the_address_an_admin_gave_an_account_takes_nothing_over(app: &TestApp) {
    let admin = admin_token(app).await;
    let old = unique_email("moved-old");
    let new = unique_email("moved-new");
    let pair = app.register_verified(&old, PASSWORD).await;
    let id = user_id(app, &pair).await;
    let r = call(
        app,
        reqwest::Method::PATCH,
        &format!("/admin/users/{id}"),
        Some(&admin),
        Some(json!({"email": new})),
    )
    .await;
    assert_eq!(r.status(), 200);
    app.wait_for_code(&new, 1).await;
    intruder_registers(app, &new).await;
    let (subject, body) = app.wait_for_mail(&new, 2).await;
    assert!(
        crate::common::code_in(&body).is_none(),
        "a notice, not a code: {subject}"
    );
    let me = the_owner_keeps_the_account(app, &new).await;
    assert_eq!(me["id"], id.as_str(), "{me}");
}

/// Somebody registers an address and never verifies; the unfinished
/// sign-up is purged, but its code (keyed by the address, with the
/// intruder's pending password) was left; an admin then moves an account
/// to the address, and its owner verifies it with a fresh code. The left
/// code's pending password must activate nothing: codes go with a purged
/// sign-up, and an address an account is moved or imported to starts with
/// none.
async fn a_code_left_by_a_purged_sign_up_activates_nothing_at_the_address(app: &TestApp) {
    let admin = admin_token(app).await;
    let address = unique_email("purged-left");
    intruder_registers(app, &address).await;
    app.wait_for_mail(&address, 1).await;
    // As the purge of unfinished sign-ups does it, a day later.
    let later = latchkey::clock::now_ms() + 1;
    app.services.store.purge_unverified_users(later).await.unwrap();
    let old = unique_email("purged-old");
    let pair = app.register_verified(&old, PASSWORD).await;
    let id = user_id(app, &pair).await;
    let r = call(
        app,
        reqwest::Method::PATCH,
        &format!("/admin/users/{id}"),
        Some(&admin),
        Some(json!({"email": address})),
    )
    .await;
    assert_eq!(r.status(), 200);
    app.wait_for_mail(&address, 2).await; // the code for the owner
    let me = the_owner_keeps_the_account(app, &address).await;
    assert_eq!(me["id"], id.as_str(), "{me}");
}

const INTRUDER: &str = "the intruder's password";

/// Somebody registers `email` with a password and a name of their own.
async fn intruder_registers(app: &TestApp, email: &str) {
    let r = app
        .post(
            "/auth/register",
            json!({"email": email, "password": INTRUDER, "name": "Intruder"}),
        )
        .await;
    assert_eq!(r.status(), 201, "answered as for any address");
}

/// The owner of `email` enters the latest code mailed to it: the account
/// is verified, the owner's password logs in and the intruder's does not.
/// Returns the owner's `/auth/me`.
async fn the_owner_keeps_the_account(app: &TestApp, email: &str) -> Value {
    let latest = app
        .mails_to(email)
        .iter()
        .rev()
        .find_map(|(_, body)| crate::common::code_in(body))
        .expect("a code for the owner");
    let r = app
        .post("/auth/verify-otp", json!({"email": email, "code": latest}))
        .await;
    assert_eq!(r.status(), 200, "the owner's code stands");
    let session: Value = r.json().await.unwrap();
    assert_eq!(
        app.login(email, INTRUDER).await.status(),
        401,
        "the intruder's password"
    );
    assert_eq!(
        app.login(email, PASSWORD).await.status(),
        200,
        "the owner's password"
    );
    let me: Value = app
        .get_bearer("/auth/me", session["access_token"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_ne!(me["name"], "Intruder", "{me}");
    me
}

/// An account an admin created (or imported) unverified holds its owner's
/// password from the start; the owner proves the address with a code from
/// `resend-otp` before the first login. Somebody who registers the address
/// first takes it over no more than a verified account: whatever code the
/// owner enters (the latest mailed), the owner's password is the account's.
async fn a_registration_of_an_address_an_admin_created_unverified_takes_nothing_over(app: &TestApp) {
    let admin = admin_token(app).await;
    let email = unique_email("created");
    let r = call(
        app,
        reqwest::Method::POST,
        "/admin/users",
        Some(&admin),
        Some(json!({"email": email, "password": PASSWORD, "name": "Owner"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    intruder_registers(app, &email).await;
    app.wait_for_mail(&email, 1).await;
    app.post("/auth/resend-otp", json!({"email": email})).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let me = the_owner_keeps_the_account(app, &email).await;
    assert_eq!(me["name"], "Owner", "{me}");
}

/// The outcome of a disable that raced a login: the account is disabled in
/// the database, but this instance still holds its enabled copy in its
/// caches, and a session of it was never ended. Neither a login (reading
/// the cached copy) nor that session's refresh token gets a session.
async fn a_login_or_refresh_that_raced_a_disable_gets_no_session(app: &TestApp) {
    let email = unique_email("admin-race");
    let pair = app.register_verified(&email, PASSWORD).await;
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200); // caches warm
    app.sql(&format!(
        "UPDATE users SET disabled_at = 1 WHERE email = '{email}'"
    ))
    .await;
    let r = app.login(&email, PASSWORD).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "ACCOUNT_DISABLED");
    let r = app
        .post("/auth/refresh", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 401);
    let admin = admin_token(app).await;
    let id = user_id(app, &pair).await;
    let sessions = call(
        app,
        reqwest::Method::GET,
        &format!("/admin/events?user_id={id}&kind=session.created"),
        Some(&admin),
        None,
    )
    .await
    .json::<Value>()
    .await
    .unwrap();
    assert_eq!(sessions["events"].as_array().unwrap().len(), 2, "{sessions}");
}

/// A change refused for one field (the new email is taken) leaves the
/// others as they were.
async fn a_refused_change_changes_nothing(app: &TestApp) {
    let admin = admin_token(app).await;
    let (email, other) = (unique_email("admin-atomic"), unique_email("admin-taken"));
    let pair = app.register_verified(&email, PASSWORD).await;
    app.register_verified(&other, PASSWORD).await;
    let id = user_id(app, &pair).await;
    let path = format!("/admin/users/{id}");
    let r = call(
        app,
        reqwest::Method::PATCH,
        &path,
        Some(&admin),
        Some(json!({"name": "Changed", "disabled": true, "email": other})),
    )
    .await;
    assert_eq!(r.status(), 409);
    let u: Value = call(app, reqwest::Method::GET, &path, Some(&admin), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (u["email"].as_str().unwrap(), u["disabled"].as_bool().unwrap()),
        (email.as_str(), false)
    );
    assert!(u["name"].is_null(), "{u}");
    assert_eq!(app.validate(pair["access_token"].as_str().unwrap()).await, 200);
}

async fn clients_are_registered_listed_changed_and_removed_through_the_admin_api(app: &TestApp) {
    use crate::oidc::CALLBACK;
    let admin = admin_token(app).await;
    let settings = json!({
        "kind": "confidential",
        "redirect_uris": [CALLBACK],
        "consent": {"mode": "skip"},
    });
    let r = call(
        app,
        reqwest::Method::POST,
        "/admin/clients",
        Some(&admin),
        Some(json!({"client_id": "admin-made", "name": "Made by an admin", "oidc": settings})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    let secret = made["client_secret"].as_str().unwrap().to_string();
    // Its id is taken; settings that cannot work are refused by name.
    let again = call(
        app,
        reqwest::Method::POST,
        "/admin/clients",
        Some(&admin),
        Some(json!({"client_id": "admin-made"})),
    )
    .await;
    assert_eq!(again.status(), 409);
    let bad = call(
        app,
        reqwest::Method::POST,
        "/admin/clients",
        Some(&admin),
        Some(json!({"client_id": "bad-uri", "oidc": {"kind": "public", "redirect_uris": ["https://app.example.com/cb#x"]}})),
    )
    .await;
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("redirect_uris[0]"),
        "{body}"
    );
    assert!(
        app.services
            .features
            .clients
            .get("bad-uri")
            .await
            .unwrap()
            .is_none(),
        "nothing written"
    );
    // A public client gets no secret.
    let r = call(
        app,
        reqwest::Method::POST,
        "/admin/clients",
        Some(&admin),
        Some(json!({"client_id": "admin-spa", "oidc": {"kind": "public", "redirect_uris": [CALLBACK]}})),
    )
    .await;
    assert_eq!(r.status(), 201);
    assert!(r.json::<Value>().await.unwrap().get("client_secret").is_none());

    let list: Value = call(app, reqwest::Method::GET, "/admin/clients", Some(&admin), None)
        .await
        .json()
        .await
        .unwrap();
    let listed = list["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["client_id"] == "admin-made")
        .unwrap()
        .clone();
    assert_eq!(listed["name"], "Made by an admin");
    assert_eq!(listed["oidc"]["redirect_uris"], json!([CALLBACK]));
    assert_eq!(
        listed["oidc"]["grant_types"],
        json!(["authorization_code", "refresh_token"])
    );
    assert!(listed.get("secret_hash").is_none() && listed.get("client_secret").is_none());

    // It signs users in.
    let email = unique_email("admin-made");
    app.register_verified(&email, PASSWORD).await;
    let tokens = crate::oidc::code_grant(app, "admin-made", &secret, &email, "openid").await;
    let at = tokens["access_token"].as_str().unwrap().to_string();
    assert_eq!(app.validate(&at).await, 200);

    // Its redirect URI replaced: the old one is refused with a page.
    let r = call(
        app,
        reqwest::Method::PUT,
        "/admin/clients/admin-made/oidc",
        Some(&admin),
        Some(json!({"oidc": {"kind": "confidential", "redirect_uris": ["https://app.example.com/cb"]}})),
    )
    .await;
    assert_eq!(r.status(), 204);
    let one: Value = call(
        app,
        reqwest::Method::GET,
        "/admin/clients/admin-made",
        Some(&admin),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        one["oidc"]["redirect_uris"],
        json!(["https://app.example.com/cb"])
    );
    let page = app
        .get(&format!(
            "/oauth/authorize?response_type=code&client_id=admin-made&scope=openid&redirect_uri={}\
             &code_challenge=E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256",
            url::form_urlencoded::byte_serialize(CALLBACK.as_bytes()).collect::<String>()
        ))
        .await;
    assert_eq!(page.status(), 400);

    // Removed: its users' tokens end at once.
    let r = call(
        app,
        reqwest::Method::DELETE,
        "/admin/clients/admin-made",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 204);
    assert_eq!(app.validate(&at).await, 401);
    let r = call(
        app,
        reqwest::Method::GET,
        "/admin/clients/admin-made",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 404);
    let r = call(
        app,
        reqwest::Method::DELETE,
        "/admin/clients/admin-made",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(r.status(), 404);
}
