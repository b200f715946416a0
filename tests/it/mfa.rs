//! Second factors over HTTP: TOTP checked against a third-party
//! implementation (pyotp, with skew and replay), recovery codes, the
//! `mfa_token`'s limits, the recent authentication that changing factors
//! needs, and passkeys with a software authenticator from PyPI
//! (soft-webauthn), as a second factor and alone.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{unique_email, TestApp, PASSWORD};

/// The relying party of these tests: `localhost` on any port.
pub const WEBAUTHN: &[(&str, &str)] = &[
    ("webauthn_rp_id", "localhost"),
    ("webauthn_origin", "http://localhost"),
    ("webauthn_allow_any_port", "true"),
];

/// [`WEBAUTHN`], and the password grant on (an operator's choice for a
/// migration), to show that it cannot pass a second factor either.
const SETTINGS: &[(&str, &str)] = &[
    ("webauthn_rp_id", "localhost"),
    ("webauthn_origin", "http://localhost"),
    ("webauthn_allow_any_port", "true"),
    ("oauth_password_grant", "true"),
];

crate::on_every_backend!(
    settings = crate::mfa::SETTINGS;
    totp_interoperates_with_pyotp_and_the_login_steps_up,
    a_totp_code_is_never_accepted_twice_nor_outside_one_step_of_skew,
    recovery_codes_work_once_and_a_new_set_voids_the_old,
    the_mfa_token_is_single_use_and_dies_after_five_wrong_factors,
    changing_factors_needs_a_recent_login_with_the_second_factor,
    an_administrator_resets_the_factors_of_a_user_who_lost_them,
    passkeys_of_a_software_authenticator_step_up_and_sign_in_alone,
    passkeys_and_an_authenticator_app_work_in_a_real_browser_on_the_hosted_page,
    a_stolen_session_cannot_plant_a_factor_and_the_first_factor_ends_the_others,
    a_login_waiting_for_its_factor_dies_with_a_password_change_or_reset,
);

/// Wrong second factors from one address are counted over every account,
/// as wrong emailed codes are: with a list of stolen passwords of accounts
/// that have an authenticator app, guessing five codes on each account
/// (each account's own limit) from one address is refused after the
/// first ten wrong ones. Before, 40 wrong codes over 8 accounts all
/// answered 401. The owner, elsewhere, is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_second_factors_from_one_address_are_capped_over_every_account() {
    let mut settings = WEBAUTHN.to_vec();
    settings.push(("trusted_proxies", "127.0.0.1"));
    let app = TestApp::embedded(&settings).await;
    let mut accounts = Vec::new();
    for i in 0..8 {
        let email = unique_email(&format!("mfa-spray{i}"));
        let first = app.register_verified(&email, PASSWORD).await;
        let (secret, _) = enrol_totp(&app, access(&first)).await;
        accounts.push((email, secret));
    }
    let attacker = "198.51.100.90";
    let from = |ip: &'static str, body: Value| {
        let (http, url) = (app.http.clone(), app.url("/auth/mfa/verify"));
        async move {
            let r = http
                .post(url)
                .header("x-forwarded-for", ip)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, body["error"].as_str().unwrap_or("").to_string())
        }
    };
    let mut answers = Vec::new();
    for (email, _) in &accounts {
        let up = step_up(&app, email).await;
        for guess in ["000000", "111111", "222222", "333333", "444444"] {
            answers.push(from(attacker, json!({"mfa_token": up["mfa_token"], "code": guess})).await);
        }
    }
    let wrong = answers.iter().filter(|a| a.0 == 401).count();
    let refused = answers.iter().filter(|a| a.1 == "TOO_MANY_ATTEMPTS").count();
    assert_eq!((wrong, refused), (10, 30), "{answers:?}");
    // The owner of an account, from another address, signs in.
    let (email, secret) = &accounts[7];
    let up = step_up(&app, email).await;
    settle_step().await;
    let (status, body) = from(
        "203.0.113.9",
        json!({"mfa_token": up["mfa_token"], "code": pyotp(secret, 1)}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    app.stop().await;
}

/// The code pyotp (PyPI) computes for `secret` at now + `steps` × 30 s.
pub fn pyotp(secret: &str, steps: i64) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import pyotp, sys, time; print(pyotp.TOTP(sys.argv[1]).at(time.time() + 30 * int(sys.argv[2])))",
            secret,
            &steps.to_string(),
        ])
        .output()
        .expect("python3 with pyotp (pip install pyotp)");
    assert!(
        out.status.success(),
        "pyotp: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Waits out the last 3 s of a 30 s step, so that a code computed now is
/// judged in the same step.
pub async fn settle_step() {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 30_000;
    if ms > 27_000 {
        tokio::time::sleep(Duration::from_millis((30_000 - ms + 200) as u64)).await;
    }
}

pub async fn call(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut rb = app.http.request(method, app.url(path));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The factor list of the session `token`: (status, body).
async fn factors(app: &TestApp, token: &str) -> (u16, Value) {
    call(app, reqwest::Method::GET, "/auth/mfa/factors", Some(token), None).await
}

/// Removes factor `id` with the session `token`: (status, body).
async fn remove(app: &TestApp, token: &str, id: &str) -> (u16, Value) {
    call(
        app,
        reqwest::Method::DELETE,
        &format!("/auth/mfa/factors/{id}"),
        Some(token),
        None,
    )
    .await
}

async fn post(app: &TestApp, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    call(app, reqwest::Method::POST, path, token, Some(body)).await
}

fn access(pair: &Value) -> &str {
    pair["access_token"].as_str().unwrap()
}

pub async fn claims(app: &TestApp, token: &str) -> Value {
    app.get_bearer("/auth/validate", token)
        .await
        .json()
        .await
        .unwrap()
}

/// Enrols an authenticator app with the session `token`: its base32
/// secret, and the recovery codes when it was the first factor.
pub async fn enrol_totp(app: &TestApp, token: &str) -> (String, Option<Vec<String>>) {
    let (status, e) = post(
        app,
        "/auth/mfa/totp",
        Some(token),
        json!({"name": "My phone", "current_password": PASSWORD}),
    )
    .await;
    assert_eq!(status, 201, "{e}");
    let secret = e["secret"].as_str().unwrap().to_string();
    settle_step().await;
    let path = format!("/auth/mfa/totp/{}/confirm", e["id"].as_str().unwrap());
    let (status, done) = post(app, &path, Some(token), json!({"code": pyotp(&secret, 0)})).await;
    assert_eq!(status, 201, "{done}");
    let codes = done["recovery_codes"]
        .as_array()
        .map(|a| a.iter().map(|c| c.as_str().unwrap().to_string()).collect());
    (secret, codes)
}

/// A login of an account with a factor: the `401 MFA_REQUIRED` body.
pub async fn step_up(app: &TestApp, email: &str) -> Value {
    let r = app.login(email, PASSWORD).await;
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "MFA_REQUIRED", "{body}");
    body
}

async fn verify(app: &TestApp, mfa_token: &Value, proof: Value) -> (u16, Value) {
    let mut body = proof;
    body["mfa_token"] = mfa_token.clone();
    post(app, "/auth/mfa/verify", None, body).await
}

async fn totp_interoperates_with_pyotp_and_the_login_steps_up(app: &TestApp) {
    let email = unique_email("mfa-totp");
    let first = app.register_verified(&email, PASSWORD).await;
    let (status, list) = factors(app, access(&first)).await;
    assert_eq!((status, list["factors"].as_array().unwrap().len()), (200, 0));
    // The enrolment is shown once: the secret, the URI an app scans, its QR code.
    let (status, e) = post(
        app,
        "/auth/mfa/totp",
        Some(access(&first)),
        json!({"current_password": PASSWORD}),
    )
    .await;
    assert_eq!(status, 201);
    let secret = e["secret"].as_str().unwrap();
    let uri = e["otpauth_uri"].as_str().unwrap();
    assert!(
        uri.starts_with("otpauth://totp/latchkey:") && uri.contains(&format!("secret={secret}")),
        "{uri}"
    );
    assert!(e["qr_svg"].as_str().unwrap().contains("<svg"));
    // Until confirmed, nothing changes for the login.
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    let path = format!("/auth/mfa/totp/{}/confirm", e["id"].as_str().unwrap());
    let (status, wrong) = post(app, &path, Some(access(&first)), json!({"code": "000000"})).await;
    assert_eq!((status, wrong["error"].as_str()), (401, Some("INVALID_FACTOR")));
    settle_step().await;
    let (status, done) = post(
        app,
        &path,
        Some(access(&first)),
        json!({"code": pyotp(secret, 0)}),
    )
    .await;
    assert_eq!(status, 201, "{done}");
    assert_eq!(done["factor"]["type"], "totp");
    assert_eq!(done["recovery_codes"].as_array().unwrap().len(), 10);

    let up = step_up(app, &email).await;
    assert_eq!(up["factors"], json!(["totp", "recovery_code"]));
    assert!(up["webauthn"].is_null());
    assert_eq!(up["expires_in"], 300);
    // The next step's code (the app's clock a little ahead) logs in.
    let (status, pair) = verify(app, &up["mfa_token"], json!({"code": pyotp(secret, 1)})).await;
    assert_eq!(status, 200, "{pair}");
    let c = claims(app, access(&pair)).await;
    assert_eq!(c["amr"], json!(["pwd", "otp", "mfa"]));
    assert_eq!(c["acr"], "2");
    let auth_time = c["auth_time"].as_i64().unwrap();
    // A refresh carries the session's authentication on.
    let (status, next) = post(
        app,
        "/auth/refresh",
        None,
        json!({"refresh_token": pair["refresh_token"]}),
    )
    .await;
    assert_eq!(status, 200);
    let c = claims(app, access(&next)).await;
    assert_eq!(
        (c["amr"].clone(), c["auth_time"].as_i64()),
        (json!(["pwd", "otp", "mfa"]), Some(auth_time))
    );
    // A single-factor session says so too.
    let c = claims(app, access(&first)).await;
    assert_eq!(
        (c["amr"].clone(), c["acr"].as_str()),
        (json!(["email"]), Some("1"))
    );
    let (_, sessions) = call(
        app,
        reqwest::Method::GET,
        "/auth/sessions",
        Some(access(&next)),
        None,
    )
    .await;
    let current = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["current"] == true)
        .unwrap()
        .clone();
    assert_eq!(current["amr"], json!(["pwd", "otp", "mfa"]));
    // An OAuth client's password grant cannot pass a second factor.
    let secret_c = app
        .services
        .features
        .clients
        .add("mfa-app", None, &[], None)
        .await
        .unwrap()
        .unwrap();
    let r = crate::oauth::form(
        app,
        "/oauth/token",
        Some(("mfa-app", &secret_c)),
        &[
            ("grant_type", "password"),
            ("username", &email),
            ("password", PASSWORD),
        ],
    )
    .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_grant");
}

async fn a_totp_code_is_never_accepted_twice_nor_outside_one_step_of_skew(app: &TestApp) {
    let email = unique_email("mfa-skew");
    let first = app.register_verified(&email, PASSWORD).await;
    let (status, e) = post(
        app,
        "/auth/mfa/totp",
        Some(access(&first)),
        json!({"current_password": PASSWORD}),
    )
    .await;
    assert_eq!(status, 201);
    let secret = e["secret"].as_str().unwrap().to_string();
    settle_step().await;
    // Confirmed with the previous step's code (the app's clock behind).
    let path = format!("/auth/mfa/totp/{}/confirm", e["id"].as_str().unwrap());
    let (status, _) = post(
        app,
        &path,
        Some(access(&first)),
        json!({"code": pyotp(&secret, -1)}),
    )
    .await;
    assert_eq!(status, 201);
    let up = step_up(app, &email).await;
    // Two steps away either side: wrong.
    for steps in [-2, 2] {
        let (status, body) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, steps)})).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("INVALID_FACTOR")),
            "{steps}"
        );
    }
    // The confirming code again: a replay.
    let (status, _) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, -1)})).await;
    assert_eq!(status, 401);
    let (status, body) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, 0)})).await;
    assert_eq!(status, 200, "{body}");
    // The code just used, on a new login: refused; and the step before it.
    let up = step_up(app, &email).await;
    for steps in [0, -1] {
        let (status, body) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, steps)})).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("INVALID_FACTOR")),
            "{steps}"
        );
    }
    // Two logins racing with one code: one session.
    let (a, b) = (step_up(app, &email).await, step_up(app, &email).await);
    let code = pyotp(&secret, 1);
    let (ra, rb) = tokio::join!(
        verify(app, &a["mfa_token"], json!({"code": code})),
        verify(app, &b["mfa_token"], json!({"code": code}))
    );
    let wins = [ra.0, rb.0].iter().filter(|s| **s == 200).count();
    assert_eq!(wins, 1, "{ra:?} {rb:?}");
}

async fn recovery_codes_work_once_and_a_new_set_voids_the_old(app: &TestApp) {
    let email = unique_email("mfa-recovery");
    let first = app.register_verified(&email, PASSWORD).await;
    let (_, codes) = enrol_totp(app, access(&first)).await;
    let codes = codes.unwrap();
    assert_eq!(codes.iter().collect::<std::collections::HashSet<_>>().len(), 10);
    // Typed loosely: upper case, without the dash.
    let loose = codes[0].to_uppercase().replace('-', " ");
    let up = step_up(app, &email).await;
    let (status, pair) = verify(app, &up["mfa_token"], json!({"recovery_code": loose})).await;
    assert_eq!(status, 200, "{pair}");
    assert_eq!(
        claims(app, access(&pair)).await["amr"],
        json!(["pwd", "otp", "mfa"])
    );
    let (_, list) = factors(app, access(&pair)).await;
    assert_eq!(list["recovery_codes_left"], 9);
    // Used once: never again.
    let up = step_up(app, &email).await;
    let (status, _) = verify(app, &up["mfa_token"], json!({"recovery_code": codes[0]})).await;
    assert_eq!(status, 401);
    // A new set: the old codes stop working, the new ones work.
    let (status, fresh) = post(app, "/auth/mfa/recovery-codes", Some(access(&pair)), json!({})).await;
    assert_eq!(status, 201, "{fresh}");
    let (status, _) = verify(app, &up["mfa_token"], json!({"recovery_code": codes[1]})).await;
    assert_eq!(status, 401);
    let (status, _) = verify(
        app,
        &up["mfa_token"],
        json!({"recovery_code": fresh["recovery_codes"][0]}),
    )
    .await;
    assert_eq!(status, 200);
    // Neither the TOTP secret nor any recovery code is in the database.
    let dump = crate::dump::database_text(app).await;
    for c in codes.iter().chain(std::iter::once(
        &fresh["recovery_codes"][1].as_str().unwrap().to_string(),
    )) {
        assert!(
            !dump.contains(c.as_str()) && !dump.contains(&c.replace('-', "")),
            "{c}"
        );
    }
}

async fn the_mfa_token_is_single_use_and_dies_after_five_wrong_factors(app: &TestApp) {
    let email = unique_email("mfa-token");
    let first = app.register_verified(&email, PASSWORD).await;
    let (secret, _) = enrol_totp(app, access(&first)).await;
    let up = step_up(app, &email).await;
    for left in (0..5).rev() {
        let (status, body) = verify(app, &up["mfa_token"], json!({"code": "000000"})).await;
        assert_eq!((status, body["tries_left"].as_i64()), (401, Some(left)), "{body}");
    }
    // Dead: even the right code is refused.
    settle_step().await;
    let (status, body) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, 1)})).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("INVALID_TOKEN")));
    // The wrong factors count in the brute-force rules of the account and
    // address too: fresh tokens do not buy fresh guesses at once (the
    // delays double from 1 s, so a refusal comes within a few more tries).
    let (mut delay, mut more_wrong) = (None, 0);
    for _ in 0..8 {
        let up = step_up(app, &email).await;
        let r = app
            .http
            .post(app.url("/auth/mfa/verify"))
            .json(&json!({"mfa_token": up["mfa_token"], "code": "000000"}))
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            delay = Some(
                r.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap(),
            );
            break;
        }
        assert_eq!(r.status(), 401);
        more_wrong += 1;
    }
    let wait = delay.expect("wrong second factors are delayed");
    assert!((1..=60).contains(&wait), "{wait}");
    tokio::time::sleep(Duration::from_secs(wait)).await;
    settle_step().await;
    let up = step_up(app, &email).await;
    // A right factor spends the token: it does not start a second session.
    let (status, body) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, 1)})).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, 1)})).await;
    assert_eq!(status, 401);
    // Not exactly one factor, a forged token: refused plainly.
    for bad in [json!({}), json!({"code": "123456", "recovery_code": "x"})] {
        let (status, body) = verify(app, &json!("some-token"), bad.clone()).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("INVALID_REQUEST")),
            "{bad}"
        );
    }
    let (status, _) = verify(app, &json!("forged-token"), json!({"code": "123456"})).await;
    assert_eq!(status, 401);
    // Each wrong factor is in the trail: the five, and those judged before
    // the delay refused (none if the delay still ran when the loop began;
    // one or two if waiting for the code's time step outlasted it).
    let user = claims(app, access(&first)).await["sub"]
        .as_str()
        .unwrap()
        .to_string();
    let failed: Vec<_> = app
        .services
        .store
        .events_page(
            &latchkey::store::EventFilter {
                kind: Some("mfa.failed".into()),
                user_id: Some(user),
                ..Default::default()
            },
            50,
        )
        .await
        .unwrap();
    assert_eq!(failed.len(), 5 + more_wrong);
}

async fn changing_factors_needs_a_recent_login_with_the_second_factor(app: &TestApp) {
    let email = unique_email("mfa-recent");
    let first = app.register_verified(&email, PASSWORD).await;
    let (secret, codes) = enrol_totp(app, access(&first)).await;
    let codes = codes.unwrap();
    // The session that enrolled had no second factor: it cannot change
    // factors now that the account has one (a stolen password session
    // could otherwise swap in the attacker's app).
    let r = app
        .http
        .post(app.url("/auth/mfa/totp"))
        .bearer_auth(access(&first))
        .json(&json!({"current_password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let www = r.headers()["www-authenticate"].to_str().unwrap().to_string();
    assert!(
        www.contains("insufficient_user_authentication") && www.contains("acr_values=\"2\""),
        "{www}"
    );
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "REAUTHENTICATION_REQUIRED"
    );
    let (_, list) = factors(app, access(&first)).await;
    let id = list["factors"][0]["id"].as_str().unwrap().to_string();
    let (status, _) = remove(app, access(&first), &id).await;
    assert_eq!(status, 401);
    // A session with the second factor, but too old.
    settle_step().await;
    let up = step_up(app, &email).await;
    let (_, pair) = verify(app, &up["mfa_token"], json!({"code": pyotp(&secret, 1)})).await;
    app.sql("UPDATE sessions SET auth_time = auth_time - 3600000 WHERE amr LIKE '%mfa%'")
        .await;
    let (_, old) = post(
        app,
        "/auth/refresh",
        None,
        json!({"refresh_token": pair["refresh_token"]}),
    )
    .await;
    let (status, body) = remove(app, access(&old), &id).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("REAUTHENTICATION_REQUIRED"))
    );
    // Renaming is not a change of factors: any session of the user.
    let (status, f) = call(
        app,
        reqwest::Method::PATCH,
        &format!("/auth/mfa/factors/{id}"),
        Some(access(&old)),
        Some(json!({"name": "Old phone"})),
    )
    .await;
    assert_eq!((status, f["name"].as_str()), (200, Some("Old phone")));
    // A fresh login with the factor removes it; the recovery codes go with
    // the last factor, and the login is a single step again.
    settle_step().await;
    let up = step_up(app, &email).await;
    let (_, fresh) = verify(app, &up["mfa_token"], json!({"recovery_code": codes[0]})).await;
    let (status, _) = remove(app, access(&fresh), &id).await;
    assert_eq!(status, 204);
    let (_, list) = factors(app, access(&fresh)).await;
    assert_eq!(
        (
            list["factors"].as_array().unwrap().len(),
            list["recovery_codes_left"].as_i64()
        ),
        (0, Some(0))
    );
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    // Another user's factor is nobody's: the same 404 as none.
    let other = app.register_verified(&unique_email("mfa-other"), PASSWORD).await;
    let (status, _) = remove(app, access(&other), &id).await;
    assert_eq!(status, 404);
}

async fn an_administrator_resets_the_factors_of_a_user_who_lost_them(app: &TestApp) {
    let email = unique_email("mfa-reset");
    let first = app.register_verified(&email, PASSWORD).await;
    enrol_totp(app, access(&first)).await;
    let pending = step_up(app, &email).await;
    let user = claims(app, access(&first)).await["sub"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, admin) = app.admin_client().await;
    let (status, _) = call(
        app,
        reqwest::Method::DELETE,
        &format!("/admin/users/{user}/factors"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 204);
    // The login is a single step again, and a login waiting for its
    // factor from before the reset is dead.
    assert_eq!(app.login(&email, PASSWORD).await.status(), 200);
    let (status, _) = verify(app, &pending["mfa_token"], json!({"recovery_code": "anything"})).await;
    assert_eq!(status, 401);
    let (status, _) = call(
        app,
        reqwest::Method::DELETE,
        "/admin/users/not-a-user/factors",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 404);
}

/// soft-webauthn (PyPI) as an authenticator, in a process of its own.
pub struct SoftAuthenticator {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl SoftAuthenticator {
    pub fn start() -> SoftAuthenticator {
        let mut child = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/soft_authenticator.py"
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with soft-webauthn (pip install soft-webauthn)");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        SoftAuthenticator { child, input, output }
    }

    /// `create` or `get` with the API's options, from a page at `origin`.
    pub fn ask(&mut self, op: &str, options: &Value, origin: &str) -> Value {
        let line = json!({"op": op, "options": options, "origin": origin}).to_string();
        writeln!(self.input, "{line}").unwrap();
        let mut answer = String::new();
        self.output.read_line(&mut answer).unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap_or_else(|_| panic!("authenticator: {answer:?}"));
        assert!(v["error"].is_null(), "authenticator: {v}");
        v["credential"].clone()
    }
}

impl Drop for SoftAuthenticator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Registers a passkey of `device` with the session `token`.
async fn register_passkey(
    app: &TestApp,
    device: &mut SoftAuthenticator,
    token: &str,
    passwordless: bool,
    origin: &str,
) -> Value {
    let (status, start) = post(
        app,
        "/auth/mfa/passkeys",
        Some(token),
        json!({"name": "Laptop", "passwordless": passwordless, "current_password": PASSWORD}),
    )
    .await;
    assert_eq!(status, 200, "{start}");
    if passwordless {
        assert_eq!(
            start["options"]["publicKey"]["authenticatorSelection"]["residentKey"],
            "required"
        );
    }
    let credential = device.ask("create", &start["options"], origin);
    let (status, done) = post(
        app,
        "/auth/mfa/passkeys/finish",
        Some(token),
        json!({"ceremony_token": start["ceremony_token"], "credential": credential}),
    )
    .await;
    assert_eq!(status, 201, "{done}");
    done
}

async fn passkeys_of_a_software_authenticator_step_up_and_sign_in_alone(app: &TestApp) {
    let origin = format!("http://localhost:{}", app.base.rsplit(':').next().unwrap());
    let email = unique_email("mfa-passkey");
    let first = app.register_verified(&email, PASSWORD).await;
    let mut device = SoftAuthenticator::start();
    let done = register_passkey(app, &mut device, access(&first), true, &origin).await;
    assert_eq!(done["factor"]["type"], "passkey");
    assert_eq!(done["factor"]["passwordless"], true);
    assert_eq!(done["recovery_codes"].as_array().unwrap().len(), 10);

    // As the second factor.
    let up = step_up(app, &email).await;
    assert_eq!(up["factors"], json!(["webauthn", "recovery_code"]));
    let assertion = device.ask("get", &up["webauthn"], &origin);
    let (status, pair) = verify(app, &up["mfa_token"], json!({"webauthn": assertion})).await;
    assert_eq!(status, 200, "{pair}");
    // A key not backup eligible, but with `none` attestation: nothing shows
    // it is hardware-secured, so swk (RFC 8176's hwk needs attestation).
    assert_eq!(
        claims(app, access(&pair)).await["amr"],
        json!(["pwd", "swk", "mfa"])
    );
    // The same assertion again, on a new login: another challenge, refused.
    let up = step_up(app, &email).await;
    let (status, _) = verify(app, &up["mfa_token"], json!({"webauthn": assertion})).await;
    assert_eq!(status, 401);
    // An assertion made for another origin (a phishing page): refused.
    let phished = device.ask("get", &up["webauthn"], "http://latchkey.example.evil");
    let (status, _) = verify(app, &up["mfa_token"], json!({"webauthn": phished})).await;
    assert_eq!(status, 401);

    // Alone: no email, no password.
    let (status, start) = post(app, "/auth/passkeys/login", None, json!({})).await;
    assert_eq!(status, 200, "{start}");
    assert!(start["options"]["publicKey"]["allowCredentials"]
        .as_array()
        .is_none_or(|a| a.is_empty()));
    let assertion = device.ask("get", &start["options"], &origin);
    let finish = json!({"ceremony_token": start["ceremony_token"], "credential": assertion});
    let (status, pair) = post(app, "/auth/passkeys/login/finish", None, finish.clone()).await;
    assert_eq!(status, 200, "{pair}");
    let c = claims(app, access(&pair)).await;
    assert_eq!(
        (c["amr"].clone(), c["acr"].as_str(), c["email"].as_str()),
        (json!(["swk", "mfa"]), Some("2"), Some(email.as_str()))
    );
    // One assertion per ceremony.
    let (status, _) = post(app, "/auth/passkeys/login/finish", None, finish).await;
    assert_eq!(status, 401);
    // Starting a sign-in stores nothing (each call wrote a row, and nobody
    // needs to finish one): the ceremony travels sealed in its token, which
    // nothing else opens.
    let before = app.count("SELECT count(*) FROM mfa_challenges").await;
    let mut tokens = Vec::new();
    for _ in 0..20 {
        let (status, start) = post(app, "/auth/passkeys/login", None, json!({})).await;
        assert_eq!(status, 200);
        tokens.push(start["ceremony_token"].as_str().unwrap().to_string());
    }
    assert_eq!(app.count("SELECT count(*) FROM mfa_challenges").await, before);
    let mut forged = tokens[0].clone();
    forged.replace_range(10..11, if &forged[10..11] == "A" { "B" } else { "A" });
    for token in [
        forged,
        "not-a-ceremony".to_string(),
        up["mfa_token"].as_str().unwrap().to_string(),
    ] {
        let assertion = device.ask("get", &start["options"], &origin);
        let (status, body) = post(
            app,
            "/auth/passkeys/login/finish",
            None,
            json!({"ceremony_token": token, "credential": assertion}),
        )
        .await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("INVALID_TOKEN")),
            "{token}"
        );
    }

    // A passkey registered as a second factor only does not sign in alone.
    let second = app
        .register_verified(&unique_email("mfa-passkey2"), PASSWORD)
        .await;
    let mut other = SoftAuthenticator::start();
    register_passkey(app, &mut other, access(&second), false, &origin).await;
    let (_, start) = post(app, "/auth/passkeys/login", None, json!({})).await;
    let assertion = other.ask("get", &start["options"], &origin);
    let (status, body) = post(
        app,
        "/auth/passkeys/login/finish",
        None,
        json!({"ceremony_token": start["ceremony_token"], "credential": assertion}),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (401, Some("INVALID_FACTOR")));
    // Garbage in place of a credential: a clear 400.
    let (_, start) = post(app, "/auth/passkeys/login", None, json!({})).await;
    let (status, _) = post(
        app,
        "/auth/passkeys/login/finish",
        None,
        json!({"ceremony_token": start["ceremony_token"], "credential": {"id": 5}}),
    )
    .await;
    assert_eq!(status, 400);
}

/// The hosted page in headless Chromium with a virtual authenticator
/// (tests/support/passkey_browser.py drives it through the DevTools
/// protocol): a passkey and an authenticator app enrolled by pressing the
/// page's buttons, then the three ways to sign in with them.
async fn passkeys_and_an_authenticator_app_work_in_a_real_browser_on_the_hosted_page(app: &TestApp) {
    let email = unique_email("mfa-browser");
    app.register_verified(&email, PASSWORD).await;
    let base = format!("http://localhost:{}", app.base.rsplit(':').next().unwrap());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/passkey_browser.py");
    let args = [script.to_string(), base, email.clone(), PASSWORD.to_string()];
    // Off the runtime's threads: the service answers the browser meanwhile.
    let out = tokio::task::spawn_blocking(move || Command::new("python3").args(args).output())
        .await
        .unwrap()
        .expect("python3 (with websocket-client and pyotp) and chromium");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "the browser run failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let find = |step: &str, key: &str, value: &str| {
        lines
            .iter()
            .find(|l| l["step"] == step && l[key] == value)
            .unwrap_or_else(|| panic!("no {step} with {key} = {value}:\n{text}"))
            .clone()
    };
    let after = find("after passkey", "step", "after passkey");
    assert_eq!(
        (after["recovery_codes"].as_i64(), after["factors"].clone()),
        (Some(10), json!(["passkey"]))
    );
    assert_eq!(find("confirm TOTP", "state", "done")["qr"], true);
    assert_eq!(
        find("factors", "step", "factors")["factors"],
        json!(["passkey", "totp"])
    );
    assert_eq!(
        find("offered", "step", "offered")["offered"],
        json!({"totp": true, "webauthn": true, "recovery": true})
    );
    // A virtual platform authenticator's passkey: software, swk.
    assert_eq!(find("amr", "after", "password and passkey")["amr"], "pwd swk mfa");
    assert_eq!(find("amr", "after", "password and TOTP")["amr"], "pwd otp mfa");
    let alone = find("amr", "after", "passkey alone");
    assert_eq!(
        (alone["amr"].as_str(), alone["who"].as_str()),
        (Some("swk mfa"), Some(email.as_str()))
    );
    // What the page did went through the API: the account has both factors.
    let user = app.services.store.user_by_email(&email).await.unwrap().unwrap();
    let factors = app.services.store.factors(&user.id).await.unwrap();
    assert_eq!(factors.iter().filter(|f| f.confirmed_at.is_some()).count(), 2);
}

/// A stolen access token (a fresh login's, say through an XSS) must not
/// become a permanent way in: adding a factor takes the current password,
/// which the thief lacks. The owner's first factor ends every other session
/// (none of them passed a second factor), and every change is mailed.
async fn a_stolen_session_cannot_plant_a_factor_and_the_first_factor_ends_the_others(app: &TestApp) {
    let email = unique_email("mfa-stolen");
    let owner = app.register_verified(&email, PASSWORD).await;
    let stolen: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    for (path, mut body) in [
        ("/auth/mfa/totp", json!({})),
        ("/auth/mfa/passkeys", json!({"passwordless": true})),
    ] {
        let (status, answer) = post(app, path, Some(access(&stolen)), body.clone()).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (400, Some("INVALID_REQUEST")),
            "{path}: {answer}"
        );
        body["current_password"] = "a guess at the password".into();
        let (status, body) = post(app, path, Some(access(&stolen)), body).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("INVALID_CREDENTIALS")),
            "{path}: {body}"
        );
    }
    let (_, list) = factors(app, access(&owner)).await;
    assert_eq!(list["factors"].as_array().unwrap().len(), 0);
    // The owner adds an app: the other session (the thief's) ends.
    enrol_totp(app, access(&owner)).await;
    assert_eq!(app.validate(access(&stolen)).await, 401);
    let (status, _) = post(
        app,
        "/auth/refresh",
        None,
        json!({"refresh_token": stolen["refresh_token"]}),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(app.validate(access(&owner)).await, 200);
    let (_, body) = app.wait_for_mail(&email, 2).await;
    assert!(body.contains("An authenticator app was added"), "{body}");
}

/// A password change (even one that keeps the other sessions) or reset ends
/// the logins still waiting for their second factor: a token won with the
/// old password is worth nothing.
async fn a_login_waiting_for_its_factor_dies_with_a_password_change_or_reset(app: &TestApp) {
    let email = unique_email("mfa-reset-pending");
    let first = app.register_verified(&email, PASSWORD).await;
    let (secret, _) = enrol_totp(app, access(&first)).await;
    // A change that keeps the other sessions ends the waiting logins all the same.
    let pending = step_up(app, &email).await;
    let (status, _) = post(
        app,
        "/auth/password",
        Some(access(&first)),
        json!({"current_password": PASSWORD, "new_password": "an interim passphrase", "end_other_sessions": false}),
    )
    .await;
    assert_eq!(status, 204);
    settle_step().await;
    let (status, body) = verify(app, &pending["mfa_token"], json!({"code": pyotp(&secret, 1)})).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("INVALID_TOKEN")));
    let r = app.login(&email, "an interim passphrase").await;
    assert_eq!(r.status(), 401);
    let pending: Value = r.json().await.unwrap();
    assert_eq!(pending["error"], "MFA_REQUIRED");
    app.post("/auth/password-reset", json!({"email": email})).await;
    let code = app.wait_for_code(&email, 3).await;
    let r = app
        .post(
            "/auth/password-reset/confirm",
            json!({"email": email, "code": code, "new_password": "a brand new passphrase"}),
        )
        .await;
    assert_eq!(r.status(), 204);
    settle_step().await;
    let (status, body) = verify(app, &pending["mfa_token"], json!({"code": pyotp(&secret, 1)})).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("INVALID_TOKEN")));
}
