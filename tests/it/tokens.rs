//! The Tokens section: RFC 9068 access tokens, validation, JWKS, discovery,
//! key rotation, forged tokens, third-party verification, and revocation
//! across instances.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::common::{unique_email, OwnRedis, TestApp, PASSWORD, SECRET_KEY};

crate::on_every_backend!(
    validate_returns_the_claims_of_an_rfc9068_token,
    forged_and_expired_tokens_are_refused,
    jwks_and_discovery_describe_the_keys,
    rotation_keeps_old_tokens_valid_and_reaches_other_instances,
    a_token_of_an_unknown_key_switches_the_signer_with_the_keys,
    a_third_party_library_verifies_tokens_from_the_jwks,
    revocation_reaches_every_instance_within_a_second,
);
crate::on_redis_cluster!(revocation_reaches_every_instance_within_a_second,);

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

fn parts(token: &str) -> (Value, Value) {
    let mut it = token.split('.');
    let h = URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap();
    let c = URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap();
    (
        serde_json::from_slice(&h).unwrap(),
        serde_json::from_slice(&c).unwrap(),
    )
}

async fn session(app: &TestApp, tag: &str) -> Value {
    let email = unique_email(tag);
    app.register_verified(&email, PASSWORD).await
}

async fn validate_returns_the_claims_of_an_rfc9068_token(app: &TestApp) {
    let pair = session(app, "claims").await;
    let at = pair["access_token"].as_str().unwrap();
    let (header, claims) = parts(at);
    assert_eq!(header["typ"], "at+jwt");
    assert_eq!(header["alg"], "EdDSA");
    assert!(header["kid"].is_string());
    for c in [
        "iss",
        "sub",
        "aud",
        "exp",
        "iat",
        "jti",
        "sid",
        "email",
        "client_id",
    ] {
        assert!(!claims[c].is_null(), "claim {c} missing: {claims}");
    }
    assert_eq!(claims["iss"], "http://latchkey.test");
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        900
    );

    let r = app.get_bearer("/auth/validate", at).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body, claims, "validate answers with the token's claims");
    // Cached path answers the same.
    let again: Value = app.get_bearer("/auth/validate", at).await.json().await.unwrap();
    assert_eq!(again, claims);
    for h in [format!("Bearer: {at}"), format!("BEARER {at}")] {
        let r = app
            .http
            .get(app.url("/auth/validate"))
            .header("authorization", h)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    for h in ["", "Bearer", "Basic abc", "Bearer not.a.jwt"] {
        let r = app
            .http
            .get(app.url("/auth/validate"))
            .header("authorization", h)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{h:?}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer error=\"invalid_token\"");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "INVALID_TOKEN");
    }
}

/// The active key's private half, unsealed with the test's master secret.
async fn signing_key(app: &TestApp) -> (String, Algorithm, EncodingKey) {
    let master = base64::engine::general_purpose::STANDARD
        .decode(SECRET_KEY)
        .unwrap();
    let sealer = latchkey::crypto::ServerKeys::derive(&master).signing_keys;
    let rec = app
        .services
        .store
        .signing_keys()
        .await
        .unwrap()
        .into_iter()
        .find(|k| k.retired_at.is_none())
        .unwrap();
    let pkcs8 = sealer.open(&rec.private_key, rec.kid.as_bytes()).unwrap();
    let (alg, key) = match rec.alg.as_str() {
        "EdDSA" => (Algorithm::EdDSA, EncodingKey::from_ed_der(&pkcs8)),
        _ => (Algorithm::ES256, EncodingKey::from_ec_der(&pkcs8)),
    };
    (rec.kid, alg, key)
}

async fn forged_and_expired_tokens_are_refused(app: &TestApp) {
    let pair = session(app, "forged").await;
    let at = pair["access_token"].as_str().unwrap();
    let (header, claims) = parts(at);
    let sig = at.rsplit('.').next().unwrap();

    // alg:none, with and without a signature.
    let none = json!({"alg": "none", "typ": "at+jwt", "kid": header["kid"]});
    for t in [
        format!("{}.{}.", b64(&none), b64(&claims)),
        format!("{}.{}.{sig}", b64(&none), b64(&claims)),
    ] {
        assert_eq!(app.validate(&t).await, 401, "alg none");
    }
    // Tampered payload with the original signature.
    let mut tampered = claims.clone();
    tampered["sub"] = "someone-else".into();
    assert_eq!(
        app.validate(&format!("{}.{}.{sig}", b64(&header), b64(&tampered)))
            .await,
        401
    );
    // Unknown kid.
    let mut h = header.clone();
    h["kid"] = "no-such-key".into();
    assert_eq!(
        app.validate(&format!("{}.{}.{sig}", b64(&h), b64(&claims))).await,
        401
    );
    // HS256 keyed with the public key (algorithm confusion).
    let jwks: Value = app.get("/.well-known/jwks.json").await.json().await.unwrap();
    let x = jwks["keys"][0]["x"].as_str().unwrap();
    for secret in [
        x.as_bytes().to_vec(),
        URL_SAFE_NO_PAD.decode(x).unwrap(),
        serde_json::to_vec(&jwks["keys"][0]).unwrap(),
    ] {
        let mut hs = Header::new(Algorithm::HS256);
        hs.typ = Some("at+jwt".into());
        hs.kid = header["kid"].as_str().map(String::from);
        let t = jsonwebtoken::encode(&hs, &claims, &EncodingKey::from_secret(&secret)).unwrap();
        assert_eq!(app.validate(&t).await, 401, "HS256 with the public key");
    }

    // Properly signed, but expired (past the leeway), wrong audience, issuer or type.
    let (kid, alg, key) = signing_key(app).await;
    let sign = |claims: &Value, typ: &str| {
        let mut h = Header::new(alg);
        h.typ = Some(typ.into());
        h.kid = Some(kid.clone());
        jsonwebtoken::encode(&h, claims, &key).unwrap()
    };
    assert_eq!(
        app.validate(&sign(&claims, "at+jwt")).await,
        200,
        "the test signer is right"
    );
    let now = claims["iat"].as_i64().unwrap();
    let mut c = claims.clone();
    c["exp"] = (now - 61).into();
    c["iat"] = (now - 1000).into();
    assert_eq!(app.validate(&sign(&c, "at+jwt")).await, 401, "expired");
    let mut c = claims.clone();
    c["exp"] = (now - 30).into();
    assert_eq!(
        app.validate(&sign(&c, "at+jwt")).await,
        200,
        "within the 60 s leeway"
    );
    let mut c = claims.clone();
    c["nbf"] = (now + 600).into();
    assert_eq!(app.validate(&sign(&c, "at+jwt")).await, 401, "not yet valid");
    let mut c = claims.clone();
    c["aud"] = "someone-else".into();
    assert_eq!(app.validate(&sign(&c, "at+jwt")).await, 401, "audience");
    let mut c = claims.clone();
    c["iss"] = "https://evil.example".into();
    assert_eq!(app.validate(&sign(&c, "at+jwt")).await, 401, "issuer");
    assert_eq!(
        app.validate(&sign(&claims, "JWT")).await,
        401,
        "an ID token or other JWT is not an access token"
    );
}

async fn jwks_and_discovery_describe_the_keys(app: &TestApp) {
    let r = app.get("/.well-known/jwks.json").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["cache-control"].to_str().unwrap().contains("max-age"));
    let jwks: Value = r.json().await.unwrap();
    let k = &jwks["keys"][0];
    assert_eq!(k["use"], "sig");
    assert_eq!(k["alg"], "EdDSA");
    assert_eq!(k["kty"], "OKP");
    assert!(k["kid"].is_string());
    assert!(k.get("d").is_none(), "no private part");

    let d: Value = app
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(d["issuer"], "http://latchkey.test");
    assert_eq!(d["jwks_uri"], "http://latchkey.test/.well-known/jwks.json");
    for f in ["token_endpoint", "introspection_endpoint", "revocation_endpoint"] {
        assert!(
            d[f].as_str().unwrap().starts_with("http://latchkey.test/oauth/"),
            "{f}"
        );
    }
    let grants: Vec<&str> = d["grant_types_supported"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(grants.contains(&"authorization_code") && grants.contains(&"refresh_token"));
    assert!(
        !grants.contains(&"password"),
        "off unless an operator turns it on"
    );
    assert!(d["id_token_signing_alg_values_supported"]
        .as_array()
        .unwrap()
        .contains(&json!("EdDSA")));
}

async fn rotation_keeps_old_tokens_valid_and_reaches_other_instances(app: &TestApp) {
    let old = session(app, "rot-old").await;
    let old_at = old["access_token"].as_str().unwrap().to_string();
    let old_kid = parts(&old_at).0["kid"].as_str().unwrap().to_string();
    let twin = app.twin_with(&[("key_refresh_secs", "1")]).await;

    let new_kid = app.services.tokens.rotate().await.unwrap();
    assert_ne!(new_kid, old_kid);
    let jwks: Value = app.get("/.well-known/jwks.json").await.json().await.unwrap();
    let kids: Vec<&str> = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap())
        .collect();
    assert!(
        kids.contains(&old_kid.as_str()) && kids.contains(&new_kid.as_str()),
        "retired keys stay published"
    );
    assert_eq!(
        app.validate(&old_at).await,
        200,
        "tokens of the retired key stay valid"
    );

    // The other instance signs with the new key within its refresh interval.
    let email = unique_email("rot-new");
    app.register_verified(&email, PASSWORD).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pair: Value = twin.login(&email, PASSWORD).await.json().await.unwrap();
        let at = pair["access_token"].as_str().unwrap();
        if parts(at).0["kid"] == new_kid.as_str() {
            assert_eq!(app.validate(at).await, 200);
            break;
        }
        assert!(Instant::now() < deadline, "the twin did not switch keys");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    twin.stop().await;
}

/// A rotation on one instance reaches another the moment a token of the new
/// key arrives there: its verifier reloads the keys, and its signer comes
/// from the same read (without waiting for the periodic reload, here an hour
/// away), so that it does not go on signing with the retired key.
async fn a_token_of_an_unknown_key_switches_the_signer_with_the_keys(app: &TestApp) {
    let twin = app.twin_with(&[("key_refresh_secs", "3600")]).await;
    let new_kid = app.services.tokens.rotate().await.unwrap();
    // Reloads on an unknown key are at most every 2 s (from the twin's start).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let fresh = session(app, "rot-unknown").await;
    let at = fresh["access_token"].as_str().unwrap();
    assert_eq!(parts(at).0["kid"], new_kid.as_str());
    assert_eq!(twin.validate(at).await, 200, "the twin learns the new key");
    let email = unique_email("rot-signer");
    app.register_verified(&email, PASSWORD).await;
    let pair: Value = twin.login(&email, PASSWORD).await.json().await.unwrap();
    let signed = pair["access_token"].as_str().unwrap();
    assert_eq!(
        parts(signed).0["kid"],
        new_kid.as_str(),
        "the twin signs with the new key at once"
    );
    twin.stop().await;
}

async fn a_third_party_library_verifies_tokens_from_the_jwks(app: &TestApp) {
    for alg in ["EdDSA", "ES256", "RS256"] {
        let other = app.twin_with(&[("signing_algorithm", alg)]).await;
        if alg != "EdDSA" {
            other.services.tokens.rotate().await.unwrap();
        }
        let email = unique_email("interop");
        other.register_verified(&email, PASSWORD).await;
        let pair: Value = other.login(&email, PASSWORD).await.json().await.unwrap();
        let at = pair["access_token"].as_str().unwrap();
        assert_eq!(parts(at).0["alg"], alg);
        let out = pyjwt_verify(other.url("/.well-known/jwks.json"), at.to_string()).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "PyJWT refused an {alg} token: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let claims: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(claims["email"], email.as_str());
        // And PyJWT refuses a tampered one.
        let mut p: Vec<&str> = at.split('.').collect();
        let (_, mut c) = parts(at);
        c["sub"] = "x".into();
        let forged_claims = b64(&c);
        p[1] = &forged_claims;
        let out = pyjwt_verify(other.url("/.well-known/jwks.json"), p.join(".")).await;
        assert!(!out.status.success());
        other.stop().await;
    }
}

/// Runs PyJWT off the runtime's threads (the server must keep answering it).
async fn pyjwt_verify(jwks_url: String, token: String) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/verify_jwt.py"
            ))
            .arg(jwks_url)
            .arg("http://latchkey.test")
            .arg("latchkey")
            .arg(token)
            .output()
            .expect("python3 with PyJWT (pip install pyjwt cryptography)")
    })
    .await
    .unwrap()
}

/// Redis frozen or gone: the subscription falls silent (its heartbeats stop
/// coming back), and each instance reloads revocations from the database
/// every half second instead of every 5 s.
#[sqlx::test(migrations = false)]
async fn with_redis_gone_a_logout_still_reaches_every_instance_within_a_second(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let mut redis = OwnRedis::start().await;
    let app = TestApp::postgres(
        opts,
        &[("redis_url", &redis.url()), ("redis_readiness", "reported")],
    )
    .await;
    let twin = app.twin().await;
    let email = unique_email("redis-gone");
    app.register_verified(&email, PASSWORD).await;
    let pair: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let at = pair["access_token"].as_str().unwrap();
    assert_eq!(twin.validate(at).await, 200);
    redis.stop();
    // Long enough for the missing heartbeats to be noticed (1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = app
        .post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 204);
    let start = Instant::now();
    while twin.validate(at).await != 401 {
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "the other instance still accepts the token after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    twin.stop().await;
    app.stop().await;
}

async fn revocation_reaches_every_instance_within_a_second(app: &TestApp) {
    let twin = app.twin().await;
    let email = unique_email("two");
    app.register_verified(&email, PASSWORD).await;
    let pair: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    let at = pair["access_token"].as_str().unwrap();
    // Both instances have verified (and cached) the token.
    assert_eq!(app.validate(at).await, 200);
    assert_eq!(twin.validate(at).await, 200);
    let r = app
        .post("/auth/logout", json!({"refresh_token": pair["refresh_token"]}))
        .await;
    assert_eq!(r.status(), 204);
    let start = Instant::now();
    // With Redis, every instance learns it through pub/sub. The embedded
    // setup is one process (its twin here shares only the SQLite file and
    // learns it from the database resync, within 5 s).
    let bound = if app.is_postgres() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(7)
    };
    loop {
        if twin.validate(at).await == 401 {
            break;
        }
        assert!(
            start.elapsed() < bound,
            "the other instance still accepts the token after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(app.validate(at).await, 401);
    twin.stop().await;
}
