//! The RP-Initiated Logout OP and Back-Channel Logout OP plans' modules
//! (the scenarios of `super`, with its relying parties, at latchkey and at
//! the certified provider).

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{every_pair, Rp};
use crate::common::TestApp;
use crate::oidc::{hidden, query, with_query, Page, AFTER_LOGOUT, ISSUER};
use crate::oidc_logout::{delivered, endpoint, validated_from, Received};

/// The logout URL of `params` at `rp`'s provider.
fn logout_url(rp: &Rp<'_>, params: &[(&str, &str)]) -> String {
    match rp.certified {
        None => with_query("/oauth/logout", params),
        Some(_) => with_query("/session/end", params),
    }
}

/// Confirms the logout page `page` (every parameter it carries): the answer.
async fn confirm(rp: &mut Rp<'_>, page: &Page) -> Page {
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    if rp.certified.is_some() {
        // node-oidc-provider's page: its token, and the button saying yes.
        let form = [
            ("xsrf", hidden(&page.body, "xsrf")),
            ("logout", "yes".to_string()),
        ];
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        return rp.browser.post("/session/end/confirm", &form).await;
    }
    let browser = &mut rp.browser;
    let mut form = vec![("csrf".to_string(), hidden(&page.body, "csrf"))];
    for k in ["id_token_hint", "client_id", "post_logout_redirect_uri", "state"] {
        if page.body.contains(&format!("name=\"{k}\"")) {
            form.push((k.to_string(), hidden(&page.body, k)));
        }
    }
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    browser.post("/oauth/logout/confirm", &form).await
}

/// Whether the browser session still signs in silently.
async fn still_signed_in(rp: &mut Rp<'_>) -> bool {
    let input = rp.input("openid", json!({"extra": {"prompt": "none"}}));
    let started = rp.start(&input).await;
    let back = rp.authorize(&started).await;
    back.location
        .as_deref()
        .is_some_and(|l| query(l).contains_key("code"))
}

/// A logout request of `params` that the provider must refuse: an error
/// page, no redirect, and the user still signed in.
async fn refused_logout(rp: &mut Rp<'_>, params: &[(&str, &str)]) {
    let page = rp.browser.get(&logout_url(rp, params)).await;
    assert_eq!(
        (page.status, page.location.as_deref()),
        (StatusCode::BAD_REQUEST, None),
        "{params:?}: an error page, never a redirect"
    );
    assert!(still_signed_in(rp).await, "{params:?}: still signed in");
}

/// `oidcc-rp-initiated-logout-bad-post-logout-redirect-uri`: a
/// `post_logout_redirect_uri` the client did not register is refused with
/// an error page: no redirect, and the user stays signed in.
pub(super) async fn oidcc_rp_initiated_logout_bad_post_logout_redirect_uri(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let mut rp = Rp::at(provider, app, "bad-plru", library, json!({})).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let hint = done["id_token"].as_str().unwrap();
        refused_logout(
            &mut rp,
            &[
                ("id_token_hint", hint),
                ("post_logout_redirect_uri", "http://127.0.0.1/elsewhere"),
                ("state", "s"),
            ],
        )
        .await;
    }
}

/// `oidcc-rp-initiated-logout-modified-id-token-hint`: an `id_token_hint`
/// whose signature does not verify is refused with an error page: no
/// redirect, and the user stays signed in.
pub(super) async fn oidcc_rp_initiated_logout_modified_id_token_hint(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let mut rp = Rp::at(provider, app, "bad-hint", library, json!({})).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let token = done["id_token"].as_str().unwrap();
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let flipped = if signature.starts_with('A') { "B" } else { "A" };
        let modified = format!("{signed}.{flipped}{}", &signature[1..]);
        refused_logout(
            &mut rp,
            &[
                ("id_token_hint", &modified),
                ("post_logout_redirect_uri", AFTER_LOGOUT),
                ("state", "s"),
            ],
        )
        .await;
    }
}

/// `oidcc-rp-initiated-logout-no-id-token-hint`: with a
/// `post_logout_redirect_uri` but neither `id_token_hint` nor `client_id`,
/// the provider cannot tell whose URI it is: it does not redirect there
/// (RP-Initiated Logout §3), and may refuse or ask the user. latchkey
/// refuses the request with an error page; the user stays signed in.
/// node-oidc-provider drops the URI and asks: confirming signs out, to its
/// own page.
pub(super) async fn oidcc_rp_initiated_logout_no_id_token_hint(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let mut rp = Rp::at(provider, app, "no-hint", library, json!({})).await;
        rp.sign_in(&rp.input("openid", json!({}))).await;
        let params = [("post_logout_redirect_uri", AFTER_LOGOUT), ("state", "s")];
        if rp.certified.is_none() {
            refused_logout(&mut rp, &params).await;
            continue;
        }
        let page = rp.browser.get(&logout_url(&rp, &params)).await;
        let out = confirm(&mut rp, &page).await;
        let out = rp.browser.follow(out).await;
        // Never redirected to a URI nobody vouched for.
        assert_eq!((out.status, out.location.as_deref()), (StatusCode::OK, None));
        assert!(!still_signed_in(&mut rp).await);
    }
}

/// `oidcc-rp-initiated-logout-no-params`: a logout without any parameter
/// asks the user, and confirming signs them out (a page, no redirect).
pub(super) async fn oidcc_rp_initiated_logout_no_params(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let mut rp = Rp::at(provider, app, "no-params", library, json!({})).await;
        rp.sign_in(&rp.input("openid", json!({}))).await;
        let page = rp.browser.get(&logout_url(&rp, &[])).await;
        let out = confirm(&mut rp, &page).await;
        let out = rp.browser.follow(out).await;
        assert_eq!(
            (out.status, out.location.as_deref()),
            (StatusCode::OK, None),
            "{}",
            out.body
        );
        assert!(!still_signed_in(&mut rp).await);
    }
}

/// `oidcc-rp-initiated-logout-no-post-logout-redirect-uri`: with an
/// `id_token_hint` only, the user is signed out and shown a page.
pub(super) async fn oidcc_rp_initiated_logout_no_post_logout_redirect_uri(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let mut rp = Rp::at(provider, app, "no-plru", library, json!({})).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let url = logout_url(&rp, &[("id_token_hint", done["id_token"].as_str().unwrap())]);
        let page = rp.browser.get(&url).await;
        let out = confirm(&mut rp, &page).await;
        let out = rp.browser.follow(out).await;
        assert_eq!((out.status, out.location.as_deref()), (StatusCode::OK, None));
        assert!(!still_signed_in(&mut rp).await);
    }
}

/// `oidcc-rp-initiated-logout-no-state`, `oidcc-rp-initiated-logout-only-state`:
/// without `state`, the redirect to the registered URI carries none; with
/// `state` but no `post_logout_redirect_uri`, there is no redirect to carry
/// it (a page).
pub(super) async fn oidcc_rp_initiated_logout_no_state_and_only_state(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let mut rp = Rp::at(provider, app, "states", library, json!({})).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let url = logout_url(
            &rp,
            &[
                ("id_token_hint", done["id_token"].as_str().unwrap()),
                ("post_logout_redirect_uri", AFTER_LOGOUT),
            ],
        );
        let page = rp.browser.get(&url).await;
        let out = confirm(&mut rp, &page).await;
        assert_eq!(out.location.as_deref(), Some(AFTER_LOGOUT), "no state added");

        rp.sign_in(&rp.input("openid", json!({}))).await;
        let url = logout_url(&rp, &[("state", "only")]);
        let page = rp.browser.get(&url).await;
        let out = confirm(&mut rp, &page).await;
        let out = rp.browser.follow(out).await;
        assert_eq!((out.status, out.location.as_deref()), (StatusCode::OK, None));
        assert!(!out.body.contains("only"), "the state goes nowhere");
    }
}

/// `oidcc-backchannel-rp-initiated-logout`: after an RP-initiated logout,
/// the provider posts a logout token to the client's
/// `backchannel_logout_uri`: a form with `logout_token` only, a JWT that
/// jose and go-oidc validate as the specification tells a relying party to
/// (signed with the client's algorithm by a key of the JWKS, `typ`
/// `logout+jwt`, `iss`, `aud`, `iat`, `jti`, the back-channel event, no
/// `nonce`), naming the `sid` and `sub` of the id_token; the browser
/// session is over (`prompt=none` answers without a code).
pub(super) async fn oidcc_backchannel_rp_initiated_logout(app: &TestApp) {
    for (library, &provider) in every_pair(app) {
        let received = Received::steady();
        let uri = endpoint(&received).await;
        let metadata = json!({"backchannel_logout_uri": uri, "backchannel_logout_session_required": true});
        let mut rp = Rp::at(provider, app, "bcl", library, metadata).await;
        let done = rp.sign_in(&rp.input("openid", json!({}))).await;
        let url = logout_url(
            &rp,
            &[
                ("id_token_hint", done["id_token"].as_str().unwrap()),
                ("post_logout_redirect_uri", AFTER_LOGOUT),
            ],
        );
        let page = rp.browser.get(&url).await;
        let out = confirm(&mut rp, &page).await;
        assert_eq!(out.location.as_deref(), Some(AFTER_LOGOUT));
        // Signed as the client's id_tokens are.
        let (issuer, base, alg) = match &rp.certified {
            None => (ISSUER.to_string(), app.url(""), "EdDSA"),
            Some(op) => (op.issuer.clone(), op.issuer.clone(), "RS256"),
        };
        let all = delivered(&received).await;
        assert_eq!(all.len(), 1, "one session ended: one logout token");
        let token = validated_from(&issuer, &base, &rp.id, alg, &all[0]).await;
        assert_eq!(
            (&token["sid"], &token["sub"]),
            (&done["claims"]["sid"], &done["claims"]["sub"])
        );
        assert!(
            token["sid"].is_string() && token.get("nonce").is_none(),
            "{token}"
        );
        assert!(!still_signed_in(&mut rp).await);
    }
}

/// `oidcc-rp-initiated-logout-discovery-endpoint-verification`,
/// `oidcc-backchannel-logout-discovery-endpoint-verification`: discovery
/// names the `end_session_endpoint` (under the issuer), and says
/// `backchannel_logout_supported` and `backchannel_logout_session_supported`.
pub(super) async fn oidcc_rp_initiated_logout_and_backchannel_logout_discovery_endpoint_verification(
    app: &TestApp,
) {
    let d: Value = app
        .get("/.well-known/openid-configuration")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(d["issuer"], ISSUER);
    assert_eq!(d["end_session_endpoint"], format!("{ISSUER}/oauth/logout"));
    assert_eq!(d["backchannel_logout_supported"], true);
    assert_eq!(d["backchannel_logout_session_supported"], true);
    assert_eq!(d["frontchannel_logout_supported"], false);
}
