//! Second factors in an export (`latchkey users export`, format version
//! 3, docs/import.md): an account moves with its authenticator app and
//! its unused recovery codes, into a deployment under the same master
//! secret; under another, it is refused by name rather than moved without
//! them, unless the export left them out on purpose.

use serde_json::{json, Value};

use crate::backup::latchkey;
use crate::common::{unique_email, TestApp, PASSWORD, SECRET_KEY};
use crate::mfa::{enrol_totp, pyotp, settle_step, step_up};

crate::on_every_backend!(an_account_moves_with_its_second_factors_or_is_refused_without_them);

const OTHER_KEY: &str = "dGhlLW9sZC1tYXN0ZXItc2VjcmV0LTMyLWJ5dGVzISE=";

async fn verify(app: &TestApp, mfa_token: &Value, proof: Value) -> u16 {
    let mut body = proof;
    body["mfa_token"] = mfa_token.clone();
    app.post("/auth/mfa/verify", body).await.status().as_u16()
}

/// The export of `app`, with or without factors, written into `to`'s
/// directory; then `latchkey users import` of it there under `secret`
/// (with `extra` arguments): the command's output.
async fn moved(app: &TestApp, to: &TestApp, secret: &str, with_factors: bool, extra: &[&str]) -> String {
    moved_as(app, to, secret, with_factors, extra, |text| text).await
}

/// [`moved`], the export's text changed by `edit` on its way.
async fn moved_as(
    app: &TestApp,
    to: &TestApp,
    secret: &str,
    with_factors: bool,
    extra: &[&str],
    edit: impl Fn(String) -> String,
) -> String {
    let mut file = Vec::new();
    latchkey::domain::import::export(&app.services.store, &mut file, with_factors)
        .await
        .unwrap();
    let file = edit(String::from_utf8(file).unwrap());
    let path = to
        .tmp
        .path()
        .join(format!("export-{}.jsonl", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, &file).unwrap();
    let path = path.display().to_string();
    let mut args = vec!["users", "import", path.as_str()];
    args.extend_from_slice(extra);
    let (ok, out) = latchkey(to.tmp.path(), secret, &args).await;
    assert!(ok, "{out}");
    out
}

async fn an_account_moves_with_its_second_factors_or_is_refused_without_them(app: &TestApp) {
    let email = unique_email("export-mfa");
    let pair = app.register_verified(&email, PASSWORD).await;
    settle_step().await;
    let (totp, codes) = enrol_totp(app, pair["access_token"].as_str().unwrap()).await;
    let codes = codes.unwrap();
    let up = step_up(app, &email).await;
    assert_eq!(
        verify(app, &up["mfa_token"], json!({ "recovery_code": codes[0] })).await,
        200
    );

    // Under the same secret: the factor and the 9 unused codes come along.
    let same = TestApp::embedded(&[]).await;
    let out = moved(app, &same, SECRET_KEY, true, &[]).await;
    assert!(out.contains("1 created"), "{out}");
    let up = step_up(&same, &email).await;
    assert_eq!(up["factors"], json!(["totp", "recovery_code"]), "{up}");
    // The step after the one the enrolment used: the last step came along.
    assert_eq!(
        verify(&same, &up["mfa_token"], json!({ "code": pyotp(&totp, 1) })).await,
        200
    );
    let up = step_up(&same, &email).await;
    assert_eq!(
        verify(&same, &up["mfa_token"], json!({ "recovery_code": codes[1] })).await,
        200
    );
    let up = step_up(&same, &email).await;
    assert_eq!(
        verify(&same, &up["mfa_token"], json!({ "recovery_code": codes[0] })).await,
        401,
        "a code used before the export stays used"
    );
    // --update replaces the account's factors with the file's: one, not two.
    let out = moved(app, &same, SECRET_KEY, true, &["--update"]).await;
    assert!(out.contains("1 updated"), "{out}");
    let user = same.user(&email).await;
    assert_eq!(same.services.store.factors(&user.id).await.unwrap().len(), 1);
    // The same account under another address (its email changed since):
    // its factor is the first one's here, so it is refused, not cloned.
    let renamed = unique_email("export-mfa-renamed");
    let out = moved_as(app, &same, SECRET_KEY, true, &[], |t| t.replace(&email, &renamed)).await;
    assert!(
        out.contains(&format!("refused {renamed}")) && out.contains("1 with errors"),
        "{out}"
    );
    assert!(same
        .services
        .store
        .user_by_email(&renamed)
        .await
        .unwrap()
        .is_none());
    same.stop().await;

    // Under another secret the account is refused, by name, not weakened.
    let other = TestApp::embedded(&[("secret_key", OTHER_KEY)]).await;
    let out = moved(app, &other, OTHER_KEY, true, &[]).await;
    assert!(
        out.contains("another master secret") && out.contains("1 with errors"),
        "{out}"
    );
    assert!(other
        .services
        .store
        .user_by_email(&email)
        .await
        .unwrap()
        .is_none());
    // Left out on purpose (--without-factors), it moves with its password alone.
    let out = moved(app, &other, OTHER_KEY, false, &[]).await;
    assert!(out.contains("1 created"), "{out}");
    assert_eq!(other.login(&email, PASSWORD).await.status(), 200);
    other.stop().await;
}
