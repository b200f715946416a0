//! The admin API's upstreams and links (`/admin/upstreams`,
//! `/admin/users/{id}/identities`).

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{link, linked};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::ISSUER;

crate::on_every_backend!(administrators_manage_upstreams_and_links_and_never_see_a_secret);

/// The admin API adds an upstream (its secret never in an answer), lists
/// upstreams with the redirect URI to register, refuses a taken or bad
/// name, lists and removes an account's links, and removes the upstream.
async fn administrators_manage_upstreams_and_links_and_never_see_a_secret(app: &TestApp) {
    let admin = crate::admin::admin_token(app).await;
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut r = app.http.request(method, app.url(path)).bearer_auth(&admin);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status();
            (status, r.text().await.unwrap())
        }
    };
    let upstream = json!({
        "name": "corp", "display_name": "Corp SSO", "issuer": "https://sso.corp.example",
        "client_id": "latchkey", "client_secret": "the-upstream-secret", "may_create": true,
    });
    let (status, body) = call(reqwest::Method::POST, "/admin/upstreams", Some(upstream.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!body.contains("the-upstream-secret"), "{body}");
    let (status, _) = call(reqwest::Method::POST, "/admin/upstreams", Some(upstream.clone())).await;
    assert_eq!(status, StatusCode::CONFLICT);
    for (field, value) in [
        ("name", "Bad Name"),
        ("name", "token"),
        ("issuer", "http://sso.corp.example"),
        ("issuer", "ftp://x.example"),
    ] {
        let mut bad = upstream.clone();
        bad[field] = value.into();
        let (status, body) = call(reqwest::Method::POST, "/admin/upstreams", Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field} {value}: {body}");
    }
    let (status, body) = call(reqwest::Method::GET, "/admin/upstreams", None).await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["upstreams"][0]["scopes"], "openid email profile");
    assert_eq!(
        list["upstreams"][0]["redirect_uri"],
        format!("{ISSUER}/oauth/upstream/corp/callback")
    );
    assert!(!body.contains("the-upstream-secret"));
    let stored = app
        .count("SELECT COUNT(*) FROM upstreams WHERE client_secret LIKE '%the-upstream-secret%'")
        .await;
    assert_eq!(stored, 0, "sealed at rest");

    let email = unique_email("admin-links");
    app.register_verified(&email, PASSWORD).await;
    let user = app.user(&email).await;
    link(app, &user.id, "sub-a").await;
    let (status, body) = call(
        reqwest::Method::GET,
        &format!("/admin/users/{}/identities", user.id),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let id = serde_json::from_str::<Value>(&body).unwrap()["identities"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/admin/users/{}/identities/{id}", user.id);
    assert_eq!(
        call(reqwest::Method::DELETE, &path, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(linked(app).await, 0);
    let actor = app
        .count("SELECT COUNT(*) FROM events WHERE kind = 'identity.unlinked' AND actor IS NOT NULL")
        .await;
    assert_eq!(actor, 1, "the administrator is named");

    assert_eq!(
        call(reqwest::Method::DELETE, "/admin/upstreams/corp", None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(reqwest::Method::DELETE, "/admin/upstreams/corp", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}
