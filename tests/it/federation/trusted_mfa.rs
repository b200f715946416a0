//! An upstream trusted for its multi-factor sign-ins (`trusts_mfa`): its
//! `amr` value `mfa` stands for the account's second factor, and only
//! then. node-oidc-provider asserts `amr` `["pwd", "mfa"]` for a login
//! that starts with "mfa" (`tests/support/oidc-op/op.mjs`).

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{add_upstream, claims, node, through_upstream, CALLBACK_HERE, UPSTREAM_CLIENT, UPSTREAM_SECRET};
use crate::common::{unique_email, TestApp, PASSWORD};
use crate::conformance::certified::CertifiedProvider;
use crate::oidc::{application, exchange_code, Browser};
use latchkey::domain::federation::NewUpstream;
use latchkey::domain::oidc::client::{ClientKind, ConsentMode};

crate::on_every_backend!(an_upstream_trusted_for_mfa_stands_for_the_second_factor_only_when_it_asserts_mfa,);

/// An account with a second factor, linked to upstream `node` (trusted
/// for `mfa`): a sign-in there with more than one factor gets a session
/// at once (`amr` `fed mfa`, `acr` `2`); one with a password only steps up
/// to the account's factor. The same multi-factor sign-in through an
/// upstream not trusted for it steps up too.
async fn an_upstream_trusted_for_mfa_stands_for_the_second_factor_only_when_it_asserts_mfa(app: &TestApp) {
    let app_secret = application(app, "app", ClientKind::Confidential, ConsentMode::Skip).await;
    let op = CertifiedProvider::start(json!([{
        "client_id": UPSTREAM_CLIENT,
        "client_secret": UPSTREAM_SECRET,
        "redirect_uris": [CALLBACK_HERE],
        "require_auth_time": true,
    }]))
    .await;
    add_upstream(
        app,
        NewUpstream {
            trusts_email_verified: true,
            trusts_mfa: true,
            ..node(&op.issuer)
        },
    )
    .await;
    // Two upstream identities of one account: one that signs in with two
    // factors there, one with a password only.
    let email = unique_email("fed-trust");
    app.register_verified(&email, PASSWORD).await;
    let session: Value = app.login(&email, PASSWORD).await.json().await.unwrap();
    crate::mfa::enrol_totp(app, session["access_token"].as_str().unwrap()).await;
    let user = app.user(&email).await;
    let strong = unique_email("mfa");
    let weak = unique_email("pwd");
    for subject in [&strong, &weak] {
        super::link_at(app, &op.issuer, &user.id, subject).await;
    }

    let (back, verifier) = through_upstream(&mut Browser::new(app), app, &op, &strong).await;
    let callback = back
        .location
        .unwrap_or_else(|| panic!("signed in without the second step: {}", back.body));
    let tokens = exchange_code(app, "app", &app_secret, &callback, &verifier).await;
    let id = claims(tokens["id_token"].as_str().unwrap());
    assert_eq!(id["sub"], user.id.as_str());
    assert_eq!(
        id["amr"],
        json!(["fed", "pwd", "mfa"]),
        "what node asserted, after fed: {id}"
    );
    assert_eq!(id["acr"], "2");

    let (page, _) = through_upstream(&mut Browser::new(app), app, &op, &weak).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("action=\"/oauth/mfa\""),
        "the second step: {}",
        page.body
    );

    // No longer trusted for it: the same two-factor sign-in steps up.
    let federation = &app.services.features.federation;
    assert!(federation.remove("node").await.unwrap());
    add_upstream(
        app,
        NewUpstream {
            trusts_email_verified: true,
            ..node(&op.issuer)
        },
    )
    .await;
    let (page, _) = through_upstream(&mut Browser::new(app), app, &op, &strong).await;
    assert!(
        page.body.contains("action=\"/oauth/mfa\""),
        "the second step: {}",
        page.body
    );
}
