//! Properties of sign-up and refresh, checked over random sequences of
//! requests against the real service (the embedded default; argon2 made
//! cheap so that many sequences run): proptest draws the sequences and,
//! when one breaks a property, shrinks it to the shortest that still does.
//!
//! Two parties act on one address: its owner, who reads the mail sent to
//! it, and an intruder, who does not. The owner enters only the code of a
//! mail their own last request caused, and asks for a code again only
//! after signing up. The properties, checked after every step:
//! 1. nobody without the mailbox gets a usable password on the account:
//!    no password of the intruder's ever logs in;
//! 2. a verified account's password never changes through a registration;
//! 3. a verification the owner makes activates the owner's password, or
//!    none (the address was contested: `PASSWORD_REQUIRED`, and the owner
//!    sets one);
//! 4. a refresh-token family has at most one live token outside the grace
//!    window, whatever the order and timing of its presentations.
//!
//! `PROPTEST_CASES` sets how many sequences run (400 by default, some
//! fifteen seconds here; a longer search is `PROPTEST_CASES=20000 cargo
//! test --test it registration_properties`).

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::common::{code_in, unique_email, TestApp};

const OWNER: [&str; 2] = ["the owner's first password", "the owner's other password"];
const OWNER_SET: &str = "the password the owner chose";
const OWNER_RESET: &str = "the owner's reset password";
const OWNER_ADMIN: &str = "the password an admin gave";
const INTRUDER: [&str; 2] = ["the intruder's password", "the intruder's other password"];

/// Every password the owner may have, in the order checked.
const OWNERS: [&str; 5] = [OWNER[0], OWNER[1], OWNER_SET, OWNER_RESET, OWNER_ADMIN];

#[derive(Clone, Debug)]
enum Step {
    Register {
        intruder: bool,
        password: usize,
    },
    /// A resend; the owner's a minute after the last request (past the
    /// resend pause), as an owner who got no code clicks again.
    Resend {
        intruder: bool,
    },
    /// The owner enters the code of the mail their last request caused.
    OwnerVerifies,
    /// The owner, told `PASSWORD_REQUIRED`, sets a password.
    OwnerSetsPassword,
    /// The owner resets the password by email.
    OwnerResets,
    /// An administrator creates the account for the owner, unverified.
    AdminCreatesForOwner,
    /// Time passes: past the resend pause (1 minute) or a code's life (11).
    Later {
        minutes: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<bool>(), 0..2usize).prop_map(|(intruder, password)| Step::Register { intruder, password }),
        3 => any::<bool>().prop_map(|intruder| Step::Resend { intruder }),
        4 => Just(Step::OwnerVerifies),
        1 => Just(Step::OwnerSetsPassword),
        1 => Just(Step::OwnerResets),
        1 => Just(Step::AdminCreatesForOwner),
        2 => prop_oneof![Just(1i64), Just(11i64)].prop_map(|minutes| Step::Later { minutes }),
    ]
}

/// Moves the address's codes `minutes` into the past.
async fn later(app: &TestApp, email: &str, minutes: i64) {
    let ms = minutes * 60_000;
    app.sql(&format!(
        "UPDATE codes SET created_at = created_at - {ms}, expires_at = expires_at - {ms} WHERE email = '{email}'"
    ))
    .await;
}

/// The service, once for every sequence (each uses an address of its own).
fn service() -> &'static (tokio::runtime::Runtime, TestApp, String) {
    static APP: std::sync::OnceLock<(tokio::runtime::Runtime, TestApp, String)> = std::sync::OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (app, admin) = rt.block_on(async {
            let app = TestApp::embedded(&[
                ("rate_limit", "off"),
                ("argon2_memory_kib", "8"),
                ("argon2_iterations", "1"),
                ("refresh_grace_secs", "10"),
            ])
            .await;
            let (_, admin) = app.admin_client().await;
            (app, admin)
        });
        (rt, app, admin)
    })
}

/// What the owner holds while a sequence runs.
#[derive(Default)]
struct Owner {
    /// The code of the mail the owner's last request caused.
    code: Option<String>,
    /// The session of a verification that answered `PASSWORD_REQUIRED`.
    session: Option<String>,
    /// Whether the owner signed up (or an admin created the account for the
    /// owner): only then does the owner ask for a code again.
    signed_up: bool,
}

/// Waits until every queued mail is out.
async fn mail_sent(app: &TestApp) {
    for _ in 0..400 {
        if app.services.store.outbox_backlog().await.unwrap().0 == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the outbox did not empty");
}

/// Runs `request` for the owner; the code of the mail it caused, if any.
async fn owners_request(
    app: &TestApp,
    email: &str,
    request: impl std::future::Future<Output = ()>,
) -> Option<String> {
    let before = app.mails_to(email).len();
    request.await;
    mail_sent(app).await;
    let mails = app.mails_to(email);
    mails[before..].iter().rev().find_map(|(_, body)| code_in(body))
}

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let r = app.post(path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The owner's passwords that log in now.
async fn working(app: &TestApp, email: &str) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    for pw in OWNERS {
        if app.login(email, pw).await.status() == 200 {
            out.insert(pw);
        }
    }
    out
}

async fn verified(app: &TestApp, email: &str) -> bool {
    app.count(&format!(
        "SELECT count(*) FROM users WHERE email = '{email}' AND email_verified_at IS NOT NULL"
    ))
    .await
        == 1
}

/// Runs one sequence; `Err` names the step that broke a property.
async fn run(app: &TestApp, admin: &str, steps: &[Step]) -> Result<(), String> {
    let email = unique_email("prop");
    let mut owner = Owner::default();
    for (i, s) in steps.iter().enumerate() {
        let was_verified = verified(app, &email).await;
        let before = if was_verified {
            working(app, &email).await
        } else {
            BTreeSet::new()
        };
        match s {
            Step::Register {
                intruder: true,
                password,
            } => {
                let body = json!({"email": email, "password": INTRUDER[*password]});
                app.post("/auth/register", body).await;
                mail_sent(app).await;
            }
            Step::Register {
                intruder: false,
                password,
            } => {
                owner.signed_up = true;
                let body = json!({"email": email, "password": OWNER[*password]});
                owner.code = owners_request(app, &email, async {
                    app.post("/auth/register", body).await;
                })
                .await;
            }
            Step::Resend { intruder: true } => {
                app.post("/auth/resend-otp", json!({"email": email})).await;
                mail_sent(app).await;
            }
            Step::Resend { intruder: false } => {
                if !owner.signed_up {
                    continue;
                }
                // An owner who got no code clicks again after a while.
                later(app, &email, 1).await;
                if let Some(code) = owners_request(app, &email, async {
                    app.post("/auth/resend-otp", json!({"email": email})).await;
                })
                .await
                {
                    owner.code = Some(code);
                }
            }
            Step::OwnerVerifies => {
                let Some(code) = owner.code.take() else { continue };
                let (status, body) =
                    post(app, "/auth/verify-otp", json!({"email": email, "code": code})).await;
                if status == 200 {
                    // 3. The owner's password, or none, and then the owner is told.
                    let now = working(app, &email).await;
                    if body["status"] == "PASSWORD_REQUIRED" {
                        owner.session = body["access_token"].as_str().map(String::from);
                        if !now.is_empty() {
                            return Err(format!("step {i}: PASSWORD_REQUIRED, yet {now:?} log in"));
                        }
                    } else if now.is_empty() {
                        return Err(format!(
                            "step {i}: verified, no password works, and nobody was told"
                        ));
                    }
                }
            }
            Step::OwnerSetsPassword => {
                let Some(session) = owner.session.take() else {
                    continue;
                };
                let r = app
                    .http
                    .post(app.url("/auth/password"))
                    .bearer_auth(&session)
                    .json(&json!({"new_password": OWNER_SET}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                if status == 204 && !working(app, &email).await.contains(OWNER_SET) {
                    return Err(format!("step {i}: the password set does not log in"));
                }
            }
            Step::OwnerResets => {
                let code = owners_request(app, &email, async {
                    app.post("/auth/password-reset", json!({"email": email})).await;
                })
                .await;
                if let Some(code) = code {
                    let body = json!({"email": email, "code": code, "new_password": OWNER_RESET});
                    let (status, _) = post(app, "/auth/password-reset/confirm", body).await;
                    if status == 204 && working(app, &email).await != BTreeSet::from([OWNER_RESET]) {
                        return Err(format!(
                            "step {i}: after a reset, {:?} log in",
                            working(app, &email).await
                        ));
                    }
                }
            }
            Step::AdminCreatesForOwner => {
                let r = app
                    .http
                    .post(app.url("/admin/users"))
                    .bearer_auth(admin)
                    .json(&json!({"email": email, "password": OWNER_ADMIN, "verified": false}))
                    .send()
                    .await
                    .unwrap();
                // Only an account made for the owner is the owner's (a 409
                // leaves the address to whoever had it).
                if r.status() == 201 {
                    owner.code = None;
                    owner.signed_up = true;
                }
            }
            Step::Later { minutes } => later(app, &email, *minutes).await,
        }
        // 1. Nobody without the mailbox gets a usable password.
        for pw in INTRUDER {
            if app.login(&email, pw).await.status() == 200 {
                return Err(format!("step {i} ({s:?}): the intruder's {pw:?} logs in"));
            }
        }
        // 2. A verified account's password never changes through a registration.
        if was_verified && matches!(s, Step::Register { .. }) {
            let after = working(app, &email).await;
            if after != before {
                return Err(format!(
                    "step {i}: a registration changed {before:?} into {after:?}"
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(400),
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn nobody_without_the_mailbox_gets_a_usable_password(steps in proptest::collection::vec(step(), 1..14)) {
        let (rt, app, admin) = service();
        let outcome = rt.block_on(run(app, admin, &steps));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// The sequence the properties above first broke (with the contest judged
/// only on live codes): the owner's sign-up code expires, the intruder
/// registers the address again, and the owner's resend a minute later
/// carried the intruder's password, which the owner's verification then
/// activated. Kept as a fixed case, since a random search finds it rarely.
#[test]
fn an_owners_resend_after_an_intruders_late_sign_up_activates_nothing_of_theirs() {
    let (rt, app, admin) = service();
    let steps = vec![
        Step::Register {
            intruder: false,
            password: 0,
        },
        Step::Later { minutes: 11 },
        Step::Register {
            intruder: true,
            password: 0,
        },
        Step::Resend { intruder: false },
        Step::OwnerVerifies,
    ];
    let out = rt.block_on(run(app, admin, &steps));
    assert!(out.is_ok(), "{}", out.unwrap_err());
}

/// A presentation of a refresh token of one session.
#[derive(Clone, Debug)]
enum Presentation {
    /// The newest token the client holds.
    Latest,
    /// The one before it (a retry after a lost answer, or a thief's copy).
    Previous,
    /// Two requests with the newest token at once (two tabs).
    Twice,
    /// Time passes beyond the grace window (10 s here).
    PastGrace,
}

fn presentation() -> impl Strategy<Value = Presentation> {
    prop_oneof![
        4 => Just(Presentation::Latest),
        2 => Just(Presentation::Previous),
        2 => Just(Presentation::Twice),
        2 => Just(Presentation::PastGrace),
    ]
}

/// Runs one sequence of presentations on a new session; `Err` names the
/// step after which the session had more than one live token.
async fn refresh_run(app: &TestApp, steps: &[Presentation]) -> Result<(), String> {
    let email = unique_email("propref");
    let pair = app.register_verified(&email, OWNER[0]).await;
    let sid = crate::mfa::claims(app, pair["access_token"].as_str().unwrap()).await["sid"]
        .as_str()
        .unwrap()
        .to_string();
    let mut held: Vec<String> = vec![pair["refresh_token"].as_str().unwrap().to_string()];
    let refresh = |token: String| {
        let (http, url) = (app.http.clone(), app.url("/auth/refresh"));
        async move {
            let r = http
                .post(url)
                .json(&json!({"refresh_token": token}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status == 200).then(|| body["refresh_token"].as_str().unwrap().to_string())
        }
    };
    for (i, p) in steps.iter().enumerate() {
        let latest = held.last().cloned().unwrap();
        match p {
            Presentation::Latest => {
                if let Some(next) = refresh(latest).await {
                    held.push(next);
                }
            }
            Presentation::Previous => {
                let previous = held.iter().rev().nth(1).cloned().unwrap_or(latest);
                if let Some(next) = refresh(previous).await {
                    if !held.contains(&next) {
                        held.push(next);
                    }
                }
            }
            Presentation::Twice => {
                let (a, b) = tokio::join!(refresh(latest.clone()), refresh(latest));
                for next in [a, b].into_iter().flatten() {
                    if !held.contains(&next) {
                        held.push(next);
                    }
                }
            }
            Presentation::PastGrace => {
                app.sql(&format!(
                    "UPDATE refresh_tokens SET rotated_at = rotated_at - 11000 WHERE session_id = '{sid}'"
                ))
                .await;
            }
        }
        // 4. At most one live token per family outside the grace window:
        // one unexchanged token in a live session, none in an ended one.
        let live = app
            .count(&format!(
                "SELECT count(*) FROM refresh_tokens t JOIN sessions s ON s.id = t.session_id \
                 WHERE t.session_id = '{sid}' AND t.rotated_at IS NULL AND s.revoked_at IS NULL"
            ))
            .await;
        if live > 1 {
            return Err(format!("step {i} ({p:?}): {live} live tokens in one family"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse::<u32>().ok()).map_or(60, |c| c / 6),
        max_shrink_iters: 100,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_refresh_family_has_at_most_one_live_token(steps in proptest::collection::vec(presentation(), 1..12)) {
        let (rt, app, _) = service();
        let outcome = rt.block_on(refresh_run(app, &steps));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}
