//! The OAuth 2.0 endpoints: token (password and refresh_token grants),
//! introspection (RFC 7662) and revocation (RFC 7009), with client
//! authentication and RFC 6749 error bodies.

use base64::Engine;
use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};

// The password grant is off unless an operator turns it on (RFC 9700
// §2.4): these tests of it turn it on; `the_password_grant_is_off_by_default`
// in tests/it/oidc.rs checks the default.
crate::on_every_backend!(
    settings = &[("oauth_password_grant", "true")];
    password_and_refresh_grants,
    client_authentication_and_errors,
    introspection,
    revocation,
);

pub(crate) async fn client(app: &TestApp, id: &str) -> String {
    app.services
        .features
        .clients
        .add(id, Some("test client"), &[], None)
        .await
        .unwrap()
        .unwrap()
}

pub(crate) async fn form(
    app: &TestApp,
    path: &str,
    auth: Option<(&str, &str)>,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let mut rb = app.http.post(app.url(path)).form(fields);
    if let Some((id, secret)) = auth {
        rb = rb.basic_auth(id, Some(secret));
    }
    rb.send().await.unwrap()
}

pub(crate) async fn oauth_error(r: reqwest::Response) -> (u16, String) {
    let s = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    (s, v["error"].as_str().unwrap().to_string())
}

async fn password_and_refresh_grants(app: &TestApp) {
    let secret = client(app, "web").await;
    let email = unique_email("oauth");
    app.register_verified(&email, PASSWORD).await;
    let r = form(
        app,
        "/oauth/token",
        Some(("web", &secret)),
        &[
            ("grant_type", "password"),
            ("username", &email),
            ("password", PASSWORD),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-store");
    let pair: Value = r.json().await.unwrap();
    assert_eq!(pair["token_type"], "Bearer");
    let claims: Value = app
        .get_bearer("/auth/validate", pair["access_token"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(claims["client_id"], "web");

    // Credentials in the body work too.
    let r = form(
        app,
        "/oauth/token",
        None,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", pair["refresh_token"].as_str().unwrap()),
            ("client_id", "web"),
            ("client_secret", &secret),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    let next: Value = r.json().await.unwrap();
    assert_ne!(next["refresh_token"], pair["refresh_token"]);

    // Another client cannot use this client's refresh token.
    let other = client(app, "other").await;
    let r = form(
        app,
        "/oauth/token",
        Some(("other", &other)),
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", next["refresh_token"].as_str().unwrap()),
        ],
    )
    .await;
    assert_eq!(oauth_error(r).await, (400, "invalid_grant".into()));

    let r = form(
        app,
        "/oauth/token",
        Some(("web", &secret)),
        &[
            ("grant_type", "password"),
            ("username", &email),
            ("password", "wrong password"),
        ],
    )
    .await;
    assert_eq!(oauth_error(r).await, (400, "invalid_grant".into()));
}

async fn client_authentication_and_errors(app: &TestApp) {
    let secret = client(app, "cli").await;
    let email = unique_email("oauth-err");
    app.register_verified(&email, PASSWORD).await;
    let fields = [
        ("grant_type", "password"),
        ("username", email.as_str()),
        ("password", PASSWORD),
    ];
    let r = form(app, "/oauth/token", Some(("cli", "wrong-secret")), &fields).await;
    assert!(r.headers().contains_key("www-authenticate"));
    assert_eq!(oauth_error(r).await, (401, "invalid_client".into()));
    let r = form(app, "/oauth/token", Some(("nobody", &secret)), &fields).await;
    assert_eq!(oauth_error(r).await, (401, "invalid_client".into()));
    let r = form(app, "/oauth/token", None, &fields).await;
    assert_eq!(oauth_error(r).await, (401, "invalid_client".into()));
    let r = form(
        app,
        "/oauth/token",
        Some(("cli", &secret)),
        &[("grant_type", "authorization_code")],
    )
    .await;
    assert_eq!(oauth_error(r).await, (400, "invalid_request".into()), "no code");
    let r = form(
        app,
        "/oauth/token",
        Some(("cli", &secret)),
        &[("grant_type", "urn:ietf:params:oauth:grant-type:device_code")],
    )
    .await;
    assert_eq!(oauth_error(r).await, (400, "unsupported_grant_type".into()));
    // A client without scopes gets no token of its own.
    let r = form(
        app,
        "/oauth/token",
        Some(("cli", &secret)),
        &[("grant_type", "client_credentials")],
    )
    .await;
    assert_eq!(oauth_error(r).await, (400, "invalid_scope".into()));
    let r = form(app, "/oauth/token", Some(("cli", &secret)), &[("username", "x")]).await;
    assert_eq!(oauth_error(r).await, (400, "invalid_request".into()));
    let r = form(
        app,
        "/oauth/token",
        Some(("cli", &secret)),
        &[("grant_type", "password"), ("username", &email)],
    )
    .await;
    assert_eq!(oauth_error(r).await, (400, "invalid_request".into()));
    // JSON is not the OAuth encoding.
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .basic_auth("cli", Some(&secret))
        .json(&json!({"grant_type": "password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(oauth_error(r).await, (400, "invalid_request".into()));
    // A percent-encoded Basic secret (RFC 6749 §2.3.1) is decoded.
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("cli:{}", secret.replace('-', "%2D")));
    let r = app
        .http
        .post(app.url("/oauth/token"))
        .header("authorization", format!("Basic {basic}"))
        .form(&fields)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

async fn introspection(app: &TestApp) {
    let secret = client(app, "rs").await;
    let email = unique_email("introspect");
    let pair = app.register_verified(&email, PASSWORD).await;
    let at = pair["access_token"].as_str().unwrap();
    let rt = pair["refresh_token"].as_str().unwrap();
    let r = form(app, "/oauth/introspect", Some(("rs", &secret)), &[("token", at)]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["active"], true);
    assert_eq!(v["email"], email.as_str());
    assert!(v["exp"].is_i64() && v["sub"].is_string() && v["sid"].is_string());
    // A refresh token is introspected only by the client it was issued to
    // (RFC 7662 §4): a first-party one by no client.
    let v: Value = form(
        app,
        "/oauth/introspect",
        Some(("rs", &secret)),
        &[("token", rt), ("token_type_hint", "refresh_token")],
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v, json!({"active": false}));
    let own: Value = form(
        app,
        "/oauth/token",
        Some(("rs", &secret)),
        &[
            ("grant_type", "password"),
            ("username", &email),
            ("password", PASSWORD),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    let v: Value = form(
        app,
        "/oauth/introspect",
        Some(("rs", &secret)),
        &[
            ("token", own["refresh_token"].as_str().unwrap()),
            ("token_type_hint", "refresh_token"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v["active"], true);
    assert_eq!(v["token_type"], "refresh_token");
    assert_eq!(v["client_id"], "rs");
    let v: Value = form(
        app,
        "/oauth/introspect",
        Some(("rs", &secret)),
        &[("token", "garbage")],
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v, json!({"active": false}));
    let r = form(app, "/oauth/introspect", None, &[("token", at)]).await;
    assert_eq!(oauth_error(r).await, (401, "invalid_client".into()));
    // After logout, both are inactive.
    app.post("/auth/logout", json!({"refresh_token": rt})).await;
    for t in [at, rt] {
        let v: Value = form(app, "/oauth/introspect", Some(("rs", &secret)), &[("token", t)])
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v, json!({"active": false}));
    }
}

async fn revocation(app: &TestApp) {
    let secret = client(app, "rv").await;
    let email = unique_email("revoke");
    let first = app.register_verified(&email, PASSWORD).await;
    let r = form(
        app,
        "/oauth/revoke",
        Some(("rv", &secret)),
        &[("token", first["refresh_token"].as_str().unwrap())],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.post("/auth/refresh", json!({"refresh_token": first["refresh_token"]}))
            .await
            .status(),
        401
    );
    assert_eq!(app.validate(first["access_token"].as_str().unwrap()).await, 401);
    // An access token's session can be revoked as well.
    let second: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let at = second["access_token"].as_str().unwrap();
    assert_eq!(
        form(app, "/oauth/revoke", Some(("rv", &secret)), &[("token", at)])
            .await
            .status(),
        200
    );
    assert_eq!(app.validate(at).await, 401);
    // Unknown tokens: 200 all the same; without client credentials too (docs/api.md:
    // "200 always"); wrong credentials: 401.
    assert_eq!(
        form(
            app,
            "/oauth/revoke",
            Some(("rv", &secret)),
            &[("token", "unknown")]
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        form(app, "/oauth/revoke", None, &[("token", "unknown")])
            .await
            .status(),
        200
    );
    assert_eq!(
        form(
            app,
            "/oauth/revoke",
            Some(("rv", "wrong")),
            &[("token", "unknown")]
        )
        .await
        .status(),
        401
    );
    let third: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    assert_eq!(
        form(
            app,
            "/oauth/revoke",
            None,
            &[("token", third["refresh_token"].as_str().unwrap())]
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        app.post("/auth/refresh", json!({"refresh_token": third["refresh_token"]}))
            .await
            .status(),
        401
    );
}
