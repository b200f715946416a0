//! A single-page application on oidc-client-ts (the library browser apps
//! use) signs a person in with latchkey in headless Chromium
//! (`tests/support/spa_browser.py` drives it; the app is
//! `tests/support/spa/`): PKCE with the code exchanged from the browser
//! (CORS), two tabs refreshing with one refresh token at once, a silent
//! sign-in with `prompt=none`, and RP-initiated logout.
//!
//! The browser must reach the issuer, so latchkey listens on a reserved
//! port that is also its issuer, on the embedded backend (the flows run on
//! both backends in tests/it/oidc.rs).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::{reserve_port, unique_email, TestApp, PASSWORD};
use latchkey::domain::oidc::client::{ClientKind, ClientSettings, ConsentMode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_page_app_signs_in_refreshes_in_two_tabs_at_once_signs_in_silently_and_signs_out() {
    let reserved = reserve_port();
    let issuer = format!("http://127.0.0.1:{}", reserved.port);
    let app = TestApp::embedded(&[("listen", &issuer["http://".len()..]), ("issuer", &issuer)]).await;
    drop(reserved);
    let email = unique_email("spa");
    app.register_verified(&email, PASSWORD).await;

    let root = env!("CARGO_MANIFEST_DIR");
    let mut child = Command::new("python3")
        .args([
            format!("{root}/tests/support/spa_browser.py"),
            issuer.clone(),
            "notes-spa".into(),
            email.clone(),
            PASSWORD.into(),
            format!(
                "{root}/tests/support/oidc-rp/node_modules/oidc-client-ts/dist/browser/oidc-client-ts.min.js"
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (with websocket-client), chromium and openssl");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let ready = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        (line, stdout)
    });
    let (line, mut stdout) = ready.await.unwrap();
    let port = line
        .strip_prefix("READY ")
        .unwrap_or_else(|| panic!("the app did not start: {line:?}"))
        .trim()
        .to_string();

    // The app as its developer registers it: a public client at its https
    // origin, consent remembered.
    let origin = format!("https://spa.test:{port}");
    let mut settings = ClientSettings::new(ClientKind::Public, vec![format!("{origin}/callback")]);
    settings.post_logout_redirect_uris = vec![format!("{origin}/signed-out")];
    settings.allowed_origins = vec![origin.clone()];
    settings.consent = ConsentMode::Remembered { days: 30 };
    app.services
        .features
        .clients
        .add("notes-spa", Some("Notes"), &[], Some(&settings))
        .await
        .unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();

    // Off the runtime's threads: the service answers the browser meanwhile.
    let (rest, status, stderr) = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let out = child.wait_with_output().unwrap();
        (rest, out.status, String::from_utf8_lossy(&out.stderr).to_string())
    })
    .await
    .unwrap();
    assert!(status.success(), "the browser run failed:\n{rest}{stderr}");
    let lines: Vec<Value> = rest.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let step = |name: &str| {
        let line = lines
            .iter()
            .find(|l| l["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}:\n{rest}"))
            .clone();
        assert_eq!(line["state"], "done", "{line}");
        line
    };

    let signed_in = step("sign-in");
    assert_eq!(signed_in["user"]["email"], email.as_str());
    assert_eq!(signed_in["user"]["iss"], issuer.as_str());
    assert_eq!(signed_in["user"]["aud"], "notes-spa");
    assert!(signed_in["user"]["refresh_token"].is_string(), "{signed_in}");
    assert_eq!(signed_in["userinfo"]["value"]["body"]["email"], email.as_str());

    // The race: both tabs took the same token from the shared storage and
    // both got an answer. When their calls overlapped (the usual case)
    // the grace window handed both the same successor rather than forking
    // the family; on a loaded machine the second may start after the
    // first finished and rotate that successor instead. Either way, both
    // then refresh again and read userinfo.
    let race = step("two tabs refresh at once");
    let results = race["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["ok"], true, "{race}");
        assert_ne!(r["value"]["refresh_token"], race["shared_token"], "{race}");
    }
    step("both tabs stay signed in");

    let silent = step("silent sign-in");
    assert_eq!(silent["at"], "/callback");
    assert_eq!(silent["result"]["value"]["email"], email.as_str());

    assert_eq!(step("logout")["at"], format!("{origin}/signed-out"));
    assert_eq!(
        step("prompt=none after logout")["result"]["error"],
        "login_required"
    );
    assert_eq!(step("refresh after logout")["result"]["error"], "invalid_grant");
    app.stop().await;
}
