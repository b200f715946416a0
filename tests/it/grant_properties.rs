//! Properties of the authorization code flow's lifecycle (codes, grants,
//! an application's sessions and their refresh families), checked over
//! random sequences of requests against the real service (the embedded
//! default, argon2 made cheap): proptest draws the sequences and shrinks a
//! failing one to the shortest that still fails.
//!
//! One application and one user; the user's browser asks for codes (signing
//! in when it has no session), the application exchanges and refreshes,
//! codes age, and the user's sessions end. After every step:
//! 1. a code yields tokens at most once;
//! 2. once a code that yielded tokens is presented again, what it issued is
//!    refused (RFC 6749 §4.1.2);
//! 3. once the user's sessions end, every token an application held is
//!    refused at once;
//! 4. an application's session has at most one live refresh token outside
//!    the grace window;
//! 5. an expired code yields nothing.
//!
//! `PROPTEST_CASES` sets how many sequences run (40 by default here).

use proptest::prelude::*;
use serde_json::Value;

use crate::common::{unique_email, TestApp, PASSWORD};
use crate::oidc::{pkce, query, Browser, CALLBACK};
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

#[derive(Clone, Debug)]
enum Step {
    /// The browser asks for a code (signing in first if it has no session).
    Authorize,
    /// The application exchanges code `n` (counted from the newest).
    Exchange(usize),
    /// The application refreshes the session of grant `n` (from the newest)
    /// with the newest refresh token it holds for it.
    Refresh(usize),
    /// An administrator ends every session of the user.
    EndSessions,
    /// The codes age past their life (a minute).
    CodesExpire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Authorize),
        4 => (0..3usize).prop_map(Step::Exchange),
        3 => (0..3usize).prop_map(Step::Refresh),
        1 => Just(Step::EndSessions),
        1 => Just(Step::CodesExpire),
    ]
}

/// The service, the application's secret and an admin token, shared by
/// every sequence.
fn service() -> &'static (tokio::runtime::Runtime, TestApp, String, String) {
    static APP: std::sync::OnceLock<(tokio::runtime::Runtime, TestApp, String, String)> =
        std::sync::OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (app, secret, admin) = rt.block_on(async {
            let app = TestApp::embedded(&[
                ("rate_limit", "off"),
                ("argon2_memory_kib", "8"),
                ("argon2_iterations", "1"),
                ("refresh_grace_secs", "10"),
            ])
            .await;
            let secret =
                crate::oidc::application(&app, "prop-app", ClientKind::Confidential, ConsentMode::Skip).await;
            let (_, admin) = app.admin_client().await;
            (app, secret, admin)
        });
        (rt, app, secret, admin)
    })
}

/// A code the browser got, and what became of it.
struct Code {
    code: String,
    verifier: String,
    presented: u32,
    /// The grant its first exchange started (an index into `grants`).
    issued: Option<usize>,
}

/// What one exchange issued: the application's session.
struct Grant {
    sid: String,
    access: Vec<String>,
    refresh: String,
    /// Ended, by the rules: its code presented again, or the user's sessions ended.
    ended: bool,
}

fn sid_of(access: &str) -> String {
    use base64::Engine;
    let payload = access.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    claims["sid"].as_str().unwrap().to_string()
}

/// Runs one sequence; `Err` names the step after which a property broke.
async fn run(app: &'static TestApp, secret: &str, admin: &str, steps: &[Step]) -> Result<(), String> {
    let email = unique_email("propgrant");
    app.register_verified(&email, PASSWORD).await;
    let user = app
        .services
        .store
        .user_by_email(&email)
        .await
        .unwrap()
        .unwrap()
        .id;
    let mut browser = Browser::new(app);
    let mut codes: Vec<Code> = Vec::new();
    let mut grants: Vec<Grant> = Vec::new();
    let token = |form: Vec<(&'static str, String)>| {
        let (http, url, secret) = (app.http.clone(), app.url("/oauth/token"), secret.to_string());
        async move {
            let r = http
                .post(url)
                .basic_auth("prop-app", Some(secret))
                .form(&form)
                .send()
                .await
                .unwrap();
            let ok = r.status() == 200;
            let body: Value = r.json().await.unwrap_or(Value::Null);
            ok.then_some(body)
        }
    };
    for (i, s) in steps.iter().enumerate() {
        match s {
            Step::Authorize => {
                let (verifier, challenge) = pkce();
                let back = browser
                    .authorize_and_sign_in("prop-app", "openid offline_access", &challenge, &email)
                    .await;
                let to = back.location.ok_or(format!("step {i}: no code"))?;
                let code = query(&to).remove("code").ok_or(format!("step {i}: {to}"))?;
                codes.push(Code {
                    code,
                    verifier,
                    presented: 0,
                    issued: None,
                });
            }
            Step::Exchange(n) => {
                let Some(k) = codes.len().checked_sub(1 + n) else {
                    continue;
                };
                let c = &mut codes[k];
                c.presented += 1;
                let answer = token(vec![
                    ("grant_type", "authorization_code".into()),
                    ("code", c.code.clone()),
                    ("redirect_uri", CALLBACK.into()),
                    ("code_verifier", c.verifier.clone()),
                ])
                .await;
                match (answer, c.presented) {
                    (Some(_), p) if p > 1 => {
                        return Err(format!("step {i}: property 1, a code yielded tokens twice"))
                    }
                    (Some(body), _) => {
                        let access = body["access_token"].as_str().unwrap().to_string();
                        grants.push(Grant {
                            sid: sid_of(&access),
                            access: vec![access],
                            refresh: body["refresh_token"].as_str().unwrap().to_string(),
                            ended: false,
                        });
                        c.issued = Some(grants.len() - 1);
                    }
                    (None, p) => {
                        // 2. A second presentation ends what the first issued.
                        if let (Some(g), true) = (c.issued, p > 1) {
                            grants[g].ended = true;
                        }
                    }
                }
            }
            Step::Refresh(n) => {
                let Some(g) = grants.len().checked_sub(1 + n) else {
                    continue;
                };
                let answer = token(vec![
                    ("grant_type", "refresh_token".into()),
                    ("refresh_token", grants[g].refresh.clone()),
                ])
                .await;
                match answer {
                    Some(_) if grants[g].ended => {
                        return Err(format!("step {i}: an ended session refreshed"))
                    }
                    Some(body) => {
                        grants[g]
                            .access
                            .push(body["access_token"].as_str().unwrap().to_string());
                        grants[g].refresh = body["refresh_token"].as_str().unwrap().to_string();
                    }
                    None if !grants[g].ended => {
                        return Err(format!(
                            "step {i}: a live session's newest refresh token was refused"
                        ))
                    }
                    None => {}
                }
            }
            Step::EndSessions => {
                let r = app
                    .http
                    .delete(app.url(&format!("/admin/users/{user}/sessions")))
                    .bearer_auth(admin)
                    .send()
                    .await
                    .unwrap();
                if r.status() != 204 {
                    return Err(format!("step {i}: ending the sessions answered {}", r.status()));
                }
                for g in &mut grants {
                    g.ended = true;
                }
                // The browser's session ended with them: it signs in again.
                browser = Browser::new(app);
            }
            Step::CodesExpire => {
                app.sql("UPDATE authorization_codes SET created_at = created_at - 61000, expires_at = expires_at - 61000")
                    .await;
                for c in &mut codes {
                    // 5. An expired code yields nothing: presented, it must fail.
                    c.presented = c.presented.max(1);
                }
            }
        }
        // 2, 3: an ended grant's tokens are refused.
        for (k, g) in grants.iter().enumerate() {
            if g.ended {
                for a in &g.access {
                    if app.validate(a).await != 401 {
                        return Err(format!(
                            "step {i} ({s:?}): grant {k} ended, its access token still valid"
                        ));
                    }
                }
            }
            // 4. At most one live refresh token per session.
            let live = app
                .count(&format!(
                    "SELECT count(*) FROM refresh_tokens t JOIN sessions s ON s.id = t.session_id \
                     WHERE t.session_id = '{}' AND t.rotated_at IS NULL AND s.revoked_at IS NULL",
                    g.sid
                ))
                .await;
            if live > 1 {
                return Err(format!(
                    "step {i} ({s:?}): grant {k} has {live} live refresh tokens"
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse::<u32>().ok()).map_or(40, |c| c / 10),
        max_shrink_iters: 100,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_code_yields_once_and_what_ends_stays_ended(steps in proptest::collection::vec(step(), 1..14)) {
        let (rt, app, secret, admin) = service();
        let outcome = rt.block_on(run(app, secret, admin, &steps));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}
