//! The authorization request (OpenID Connect Core 1.0 §3.1.2, RFC 6749
//! §4.1.1, RFC 7636) as pure functions: [`check`] reads the parameters
//! against the client, and [`decide`] says what the request needs next,
//! from the browser's session and the user's consent, with `now` passed in.
//!
//! ```text
//!  parameters ──check──> unknown client or redirect URI ──> an error page (never a redirect)
//!                  │
//!                  ├──> any other mistake ──> error=... to the redirect URI (with state, iss)
//!                  └──> AuthorizationRequest ──decide──> Login       (no session, prompt=login, max_age,
//!                                                           │            another user's id_token_hint, acr 2)
//!                                                           ├──> Consent     (explicit, prompt=consent,
//!                                                           │                 no remembered consent covers it)
//!                                                           ├──> Refuse(e)   (prompt=none and one of the above:
//!                                                           │                 login_required, consent_required)
//!                                                           └──> Issue       (a code for the session)
//! ```
//!
//! A login or a consent given during the request satisfies it: the request
//! keeps the time it arrived (`started_ms`), and an authentication at or
//! after it counts as the fresh one `prompt=login` or `max_age` asked for
//! (otherwise a `prompt=login` would send the user back to the login page
//! forever).

use serde::{Deserialize, Serialize};

use super::client::{ClientKind, ClientSettings, OIDC_SCOPES};
use super::redirect;

/// The longest `state` and `nonce` taken (they come back in a URL or a token).
pub const MAX_STATE: usize = 1024;
/// The most of `ui_locales` kept (characters): a dozen language tags and
/// more; the pages read only the first few (`http/pages/i18n.rs`).
pub const MAX_UI_LOCALES: usize = 256;

/// At most this many parameters in one request: the specifications name
/// about twenty, and an application has no use for hundreds more.
pub const MAX_PARAMETERS: usize = 100;

/// The parameters of an authorization request this provider knows (OpenID
/// Connect Core §3.1.2.1, RFC 7636, RFC 9101): an error description names
/// one of these, never a name the request made up.
const KNOWN_PARAMETERS: &[&str] = &[
    "client_id",
    "redirect_uri",
    "response_type",
    "response_mode",
    "scope",
    "state",
    "nonce",
    "code_challenge",
    "code_challenge_method",
    "prompt",
    "max_age",
    "login_hint",
    "id_token_hint",
    "acr_values",
    "ui_locales",
    "claims_locales",
    "display",
    "claims",
    "request",
    "request_uri",
    "registration",
];

/// The first parameter given a second time: one pass, whatever the count
/// (comparing each with every earlier one is quadratic in a request that
/// can carry thousands of names).
fn first_repeated(params: &[(String, String)]) -> Option<&str> {
    let mut seen = std::collections::HashSet::with_capacity(params.len());
    params.iter().map(|(k, _)| k.as_str()).find(|k| !seen.insert(*k))
}

/// An authorization request that passed [`check`]: what the rest of the
/// flow needs of it, carried sealed through the sign-in pages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorizationRequest {
    pub client_id: String,
    pub redirect_uri: String,
    /// The scopes granted if the user agrees: known ones, in a fixed order.
    pub scope: Vec<String>,
    pub state: Option<String>,
    pub nonce: Option<String>,
    /// PKCE: base64url(SHA-256(code_verifier)). Always present once
    /// [`check`] passed (every client must use PKCE); an `Option` as the
    /// stored code's column is.
    pub code_challenge: Option<String>,
    pub prompt: Prompt,
    /// Seconds (`max_age`).
    pub max_age: Option<u64>,
    pub login_hint: Option<String>,
    pub id_token_hint: Option<String>,
    /// `acr_values` asked for a second factor (`2`).
    pub wants_mfa: bool,
    /// `ui_locales` as given (at most [`MAX_UI_LOCALES`] characters): the
    /// languages the pages of this sign-in should speak, best first.
    /// Absent from requests sealed before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui_locales: Option<String>,
    /// When the request arrived (Unix ms).
    pub started_ms: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    pub none: bool,
    pub login: bool,
    pub consent: bool,
    pub select_account: bool,
}

/// Why a request ends on an error page of the provider's own (nothing goes
/// back to any client). The pages say it in the user's language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageError {
    /// The request names no client (`client_id`).
    NoClientId,
    /// No client of that id signs in through the code flow.
    UnknownClient,
    NoRedirectUri,
    /// A redirect URI the client did not register.
    UnregisteredRedirectUri,
    /// `client_id` or `redirect_uri` given more than once.
    RepeatedClientOrRedirectUri,
    /// A pending request that expired, or a damaged one.
    Expired,
    /// The client was removed during the sign-in.
    ClientGone,
    /// The client's registration no longer allows the request.
    NoLongerAllowed,
    /// A consent page of another session, or one that expired.
    ConsentNotYours,
    /// Logout: an `id_token_hint` this provider did not issue.
    ForeignIdTokenHint,
    /// Logout: `client_id` and the hint's audience differ.
    HintOfAnotherClient,
    /// Logout: a `post_logout_redirect_uri` without a client to vouch for it.
    LogoutRedirectWithoutClient,
    /// Logout: a `post_logout_redirect_uri` the client did not register.
    UnregisteredLogoutRedirect,
}

/// Why a request cannot go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The client or the redirect URI is not known good: the user gets an
    /// error page, and nobody is redirected anywhere (RFC 6749 §4.1.2.1).
    Page(PageError),
    /// To the redirect URI: `error`, `error_description`, `state`.
    Redirect {
        redirect_uri: String,
        error: &'static str,
        description: String,
        state: Option<String>,
    },
}

/// Reads the request's parameters (each at most once, RFC 6749 §3.1)
/// against `client` (`None`: no client has that id; its settings, when it
/// has some for this flow).
pub fn check(
    params: &[(String, String)],
    client: Option<&ClientSettings>,
    now_ms: i64,
) -> Result<AuthorizationRequest, RequestError> {
    let get = |name: &str| -> Option<&str> {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let repeated = first_repeated(params);
    let Some(client_id) = get("client_id") else {
        return Err(RequestError::Page(PageError::NoClientId));
    };
    let Some(client) = client.filter(|c| c.allows("authorization_code")) else {
        return Err(RequestError::Page(PageError::UnknownClient));
    };
    let Some(redirect_uri) = get("redirect_uri") else {
        return Err(RequestError::Page(PageError::NoRedirectUri));
    };
    if !redirect::matches(&client.redirect_uris, redirect_uri) {
        return Err(RequestError::Page(PageError::UnregisteredRedirectUri));
    }
    if repeated == Some("client_id") || repeated == Some("redirect_uri") {
        return Err(RequestError::Page(PageError::RepeatedClientOrRedirectUri));
    }
    // From here on, mistakes go back to the client.
    let state = get("state").map(str::to_string);
    let fail = |error: &'static str, description: String| RequestError::Redirect {
        redirect_uri: redirect_uri.to_string(),
        error,
        description,
        state: state.clone().filter(|s| s.len() <= MAX_STATE),
    };
    // The descriptions below never repeat what the request made up: they
    // reach the application's page, which might show them (RFC 6749
    // §4.1.2.1 allows only printable ASCII there, and markup would be
    // somebody else's words under the provider's name).
    if params.len() > MAX_PARAMETERS {
        return Err(fail(
            "invalid_request",
            format!("at most {MAX_PARAMETERS} parameters"),
        ));
    }
    if let Some(k) = repeated {
        return Err(fail(
            "invalid_request",
            match KNOWN_PARAMETERS.iter().find(|known| **known == k) {
                Some(known) => format!("{known} is given more than once"),
                None => "a parameter is given more than once".into(),
            },
        ));
    }
    if get("request").is_some() {
        return Err(fail(
            "request_not_supported",
            "request objects are not supported".into(),
        ));
    }
    if get("request_uri").is_some() {
        return Err(fail(
            "request_uri_not_supported",
            "request_uri is not supported".into(),
        ));
    }
    if get("registration").is_some() {
        return Err(fail(
            "registration_not_supported",
            "registration is not supported".into(),
        ));
    }
    match get("response_type") {
        None => return Err(fail("invalid_request", "response_type is required".into())),
        Some("code") => {}
        Some(_) => {
            return Err(fail(
                "unsupported_response_type",
                "only the authorization code flow (response_type=code)".into(),
            ))
        }
    }
    if !matches!(get("response_mode"), None | Some("query")) {
        return Err(fail("invalid_request", "response_mode: only query".into()));
    }
    if state.as_ref().is_some_and(|s| s.len() > MAX_STATE) {
        return Err(fail(
            "invalid_request",
            format!("state: at most {MAX_STATE} characters"),
        ));
    }
    let nonce = get("nonce").map(str::to_string);
    if nonce.as_ref().is_some_and(|n| n.len() > MAX_STATE) {
        return Err(fail(
            "invalid_request",
            format!("nonce: at most {MAX_STATE} characters"),
        ));
    }
    let asked: Vec<&str> = get("scope")
        .unwrap_or("")
        .split(' ')
        .filter(|s| !s.is_empty())
        .collect();
    // A scope this provider does not know (`address`, `phone`, another
    // service's) is ignored, not refused (Core §3.1.2.1: "SHOULD be
    // ignored"; RFC 6749 §3.3 lets the server grant less than asked, and
    // the token answer's `scope` says what was granted). So is
    // offline_access for a client that may not refresh (Core §11).
    let scope: Vec<String> = OIDC_SCOPES
        .iter()
        .filter(|s| asked.contains(s))
        .filter(|s| **s != "offline_access" || client.allows("refresh_token"))
        .map(|s| s.to_string())
        .collect();
    let code_challenge = match (get("code_challenge"), get("code_challenge_method")) {
        (Some(c), Some("S256")) => {
            let well_formed = c.len() == 43
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !well_formed {
                return Err(fail(
                    "invalid_request",
                    "code_challenge: base64url of a SHA-256 digest (43 characters)".into(),
                ));
            }
            Some(c.to_string())
        }
        (Some(_), None) | (Some(_), Some("plain")) => {
            return Err(fail(
                "invalid_request",
                "code_challenge_method: only S256 (plain is refused)".into(),
            ))
        }
        (_, Some(m)) if m != "S256" => {
            return Err(fail("invalid_request", "code_challenge_method: only S256".into()))
        }
        (None, _) => {
            return Err(fail(
                "invalid_request",
                if client.kind == ClientKind::Public {
                    "code_challenge is required (PKCE, S256) of a public client".into()
                } else {
                    "code_challenge is required (PKCE, S256)".into()
                },
            ))
        }
        (Some(_), Some(_)) => unreachable!("S256 and the others are matched above"),
    };
    let mut prompt = Prompt::default();
    for p in get("prompt").unwrap_or("").split(' ').filter(|s| !s.is_empty()) {
        match p {
            "none" => prompt.none = true,
            "login" => prompt.login = true,
            "consent" => prompt.consent = true,
            "select_account" => prompt.select_account = true,
            _ => {
                return Err(fail(
                    "invalid_request",
                    "prompt: none, login, consent or select_account".into(),
                ))
            }
        }
    }
    if prompt.none && (prompt.login || prompt.consent || prompt.select_account) {
        return Err(fail(
            "invalid_request",
            "prompt=none goes with no other value".into(),
        ));
    }
    let max_age = match get("max_age") {
        None => None,
        Some(v) => match v.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => return Err(fail("invalid_request", "max_age: a number of seconds".into())),
        },
    };
    let wants_mfa = get("acr_values").is_some_and(|v| v.split(' ').any(|a| a == "2"));
    Ok(AuthorizationRequest {
        client_id: client_id.to_string(),
        redirect_uri: redirect_uri.to_string(),
        scope,
        state,
        nonce,
        code_challenge,
        prompt,
        max_age,
        login_hint: get("login_hint").map(|s| s.chars().take(320).collect()),
        id_token_hint: get("id_token_hint").map(str::to_string),
        wants_mfa,
        // Read by the pages, never an error (Core §3.1.2.1: a language
        // the provider lacks is no reason to refuse).
        ui_locales: get("ui_locales").map(|s| s.chars().take(MAX_UI_LOCALES).collect()),
        started_ms: now_ms,
    })
}

/// The browser's session, as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionView {
    pub user_id: String,
    /// When the user authenticated (Unix ms), and whether with a second factor.
    pub auth_time_ms: i64,
    pub mfa: bool,
}

/// What else the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context<'a> {
    pub session: Option<&'a SessionView>,
    /// The subject of `id_token_hint`, when the request has one that
    /// verifies (`Some(None)`: it has one that does not).
    pub hint_subject: Option<Option<&'a str>>,
    /// A consent of the user's that covers every scope asked, still valid.
    pub consented: bool,
    /// The client's users are never asked (a first-party application).
    pub consent_skipped: bool,
    pub now_ms: i64,
}

/// What the request needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Login,
    Consent,
    /// `prompt=none` and the user would have to do something: this error.
    Refuse(&'static str),
    Issue,
}

/// What the request needs next ([`Step`]).
pub fn decide(req: &AuthorizationRequest, ctx: &Context<'_>) -> Step {
    let interact = |need: Step, error: &'static str| {
        if req.prompt.none {
            Step::Refuse(error)
        } else {
            need
        }
    };
    if matches!(ctx.hint_subject, Some(None)) {
        // A hint that is not one of our id_tokens names nobody.
        return interact(Step::Login, "login_required");
    }
    let Some(s) = ctx.session else {
        return interact(Step::Login, "login_required");
    };
    if let Some(Some(sub)) = ctx.hint_subject {
        if sub != s.user_id {
            return interact(Step::Login, "login_required");
        }
    }
    // An authentication during this request satisfies every freshness rule.
    let fresh = s.auth_time_ms >= req.started_ms;
    let reauth = req.prompt.login || req.prompt.select_account || req.max_age == Some(0);
    let too_old = req
        .max_age
        .is_some_and(|m| ctx.now_ms - s.auth_time_ms > (m as i64).saturating_mul(1000));
    if !fresh && (reauth || too_old || (req.wants_mfa && !s.mfa)) {
        return interact(Step::Login, "login_required");
    }
    if req.prompt.consent || !(ctx.consent_skipped || ctx.consented) {
        return interact(Step::Consent, "consent_required");
    }
    Step::Issue
}

#[cfg(test)]
mod tests {
    use super::super::client::ConsentMode;
    use super::*;

    const NOW: i64 = 1_800_000_000_000;
    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    fn client(kind: ClientKind) -> ClientSettings {
        let mut c = ClientSettings::new(kind, vec!["https://app.example.com/cb".into()]);
        c.consent = ConsentMode::Skip;
        c
    }

    fn params(extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = [
            ("client_id", "app"),
            ("redirect_uri", "https://app.example.com/cb"),
            ("response_type", "code"),
            ("scope", "openid email"),
            ("state", "s1"),
            ("code_challenge", CHALLENGE),
            ("code_challenge_method", "S256"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in extra {
            p.retain(|(pk, _)| pk != k);
            if !v.is_empty() {
                p.push((k.to_string(), v.to_string()));
            }
        }
        p
    }

    fn error_of(r: Result<AuthorizationRequest, RequestError>) -> &'static str {
        match r {
            Err(RequestError::Redirect { error, state, .. }) => {
                assert_eq!(state.as_deref(), Some("s1"), "the state goes back");
                error
            }
            other => panic!("expected an error to the redirect URI, got {other:?}"),
        }
    }

    fn description_of(r: Result<AuthorizationRequest, RequestError>) -> String {
        match r {
            Err(RequestError::Redirect { description, .. }) => description,
            other => panic!("expected an error to the redirect URI, got {other:?}"),
        }
    }

    #[test]
    fn an_error_description_never_repeats_what_the_request_made_up() {
        let made_up = "<a href=https://evil.example>your account is locked, click here</a>";
        let mut repeated = params(&[]);
        repeated.push((made_up.to_string(), "1".into()));
        repeated.push((made_up.to_string(), "2".into()));
        let prompt = params(&[("prompt", made_up)]);
        for p in [repeated, prompt] {
            let d = description_of(check(&p, Some(&client(ClientKind::Public)), NOW));
            assert!(!d.contains("evil") && !d.contains('<'), "{d}");
            assert!(
                d.bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\'),
                "{d}"
            );
        }
        // A parameter the specifications name is named.
        let mut scope_twice = params(&[]);
        scope_twice.push(("scope".into(), "openid".into()));
        let d = description_of(check(&scope_twice, Some(&client(ClientKind::Public)), NOW));
        assert_eq!(d, "scope is given more than once");
    }

    #[test]
    fn a_request_with_more_parameters_than_any_application_needs_is_refused() {
        let mut p = params(&[]);
        let known = p.len();
        p.extend((known..MAX_PARAMETERS).map(|i| (format!("x{i}"), String::new())));
        assert!(
            check(&p, Some(&client(ClientKind::Public)), NOW).is_ok(),
            "{MAX_PARAMETERS} are read"
        );
        p.push(("one_more".into(), String::new()));
        let r = check(&p, Some(&client(ClientKind::Public)), NOW);
        assert_eq!(description_of(r), format!("at most {MAX_PARAMETERS} parameters"));
    }

    #[test]
    fn the_first_repeated_parameter_is_found_among_thousands() {
        let mut p: Vec<(String, String)> = (0..50_000).map(|i| (format!("p{i}"), String::new())).collect();
        assert_eq!(first_repeated(&p), None);
        p.push(("p49999".into(), String::new()));
        assert_eq!(first_repeated(&p), Some("p49999"));
    }

    #[test]
    fn a_good_request_is_read_whole() {
        let r = check(
            &params(&[("nonce", "n"), ("max_age", "60"), ("acr_values", "1 2")]),
            Some(&client(ClientKind::Public)),
            NOW,
        )
        .unwrap();
        assert_eq!(r.scope, ["openid", "email"]);
        assert_eq!(r.code_challenge.as_deref(), Some(CHALLENGE));
        assert_eq!(r.max_age, Some(60));
        assert!(r.wants_mfa);
        assert_eq!(r.started_ms, NOW);
    }

    #[test]
    fn an_unknown_client_or_redirect_uri_never_redirects() {
        let c = client(ClientKind::Confidential);
        for (p, client) in [
            (params(&[("client_id", "")]), Some(&c)),
            (params(&[]), None),
            (params(&[("redirect_uri", "")]), Some(&c)),
            (params(&[("redirect_uri", "https://evil.example/cb")]), Some(&c)),
            (
                params(&[("redirect_uri", "https://app.example.com/cb/x")]),
                Some(&c),
            ),
        ] {
            assert!(
                matches!(check(&p, client, NOW), Err(RequestError::Page(_))),
                "{p:?}"
            );
        }
        let mut no_code = c.clone();
        no_code.grant_types = vec!["refresh_token".into()];
        assert!(matches!(
            check(&params(&[]), Some(&no_code), NOW),
            Err(RequestError::Page(_))
        ));
        let mut twice = params(&[]);
        twice.push(("redirect_uri".into(), "https://evil.example/cb".into()));
        assert!(matches!(check(&twice, Some(&c), NOW), Err(RequestError::Page(_))));
    }

    #[test]
    fn other_mistakes_go_back_to_the_client_by_name() {
        let c = client(ClientKind::Public);
        let cases: [(&[(&str, &str)], &str); 13] = [
            (&[("response_type", "")], "invalid_request"),
            (&[("response_type", "token")], "unsupported_response_type"),
            (&[("response_type", "code id_token")], "unsupported_response_type"),
            (&[("response_mode", "fragment")], "invalid_request"),
            (&[("code_challenge", "")], "invalid_request"),
            (&[("code_challenge_method", "plain")], "invalid_request"),
            (&[("code_challenge_method", "")], "invalid_request"),
            (&[("code_challenge", "short")], "invalid_request"),
            (&[("prompt", "none login")], "invalid_request"),
            (&[("prompt", "sometimes")], "invalid_request"),
            (&[("max_age", "-1")], "invalid_request"),
            (&[("request", "eyJ...")], "request_not_supported"),
            (&[("request_uri", "https://x")], "request_uri_not_supported"),
        ];
        for (extra, error) in cases {
            assert_eq!(error_of(check(&params(extra), Some(&c), NOW)), error, "{extra:?}");
        }
        let mut twice = params(&[]);
        twice.push(("scope".into(), "openid".into()));
        assert_eq!(error_of(check(&twice, Some(&c), NOW)), "invalid_request");
    }

    #[test]
    fn pkce_is_required_of_every_client_and_plain_of_none() {
        for kind in [ClientKind::Public, ClientKind::Confidential] {
            let c = client(kind);
            assert_eq!(
                error_of(check(
                    &params(&[("code_challenge", ""), ("code_challenge_method", "")]),
                    Some(&c),
                    NOW
                )),
                "invalid_request"
            );
        }
    }

    #[test]
    fn ui_locales_is_kept_as_given_but_bounded_and_never_refused() {
        let c = client(ClientKind::Public);
        let r = check(&params(&[("ui_locales", "xx-YY fr")]), Some(&c), NOW).unwrap();
        assert_eq!(r.ui_locales.as_deref(), Some("xx-YY fr"));
        assert_eq!(check(&params(&[]), Some(&c), NOW).unwrap().ui_locales, None);
        let long = "é".repeat(10_000);
        let r = check(&params(&[("ui_locales", &long)]), Some(&c), NOW).unwrap();
        assert_eq!(r.ui_locales.unwrap().chars().count(), MAX_UI_LOCALES);
        // Not in the sealed request when not given, so a request sealed
        // before the field was kept reads the same.
        let plain = check(&params(&[]), Some(&c), NOW).unwrap();
        let sealed = serde_json::to_string(&plain).unwrap();
        assert!(!sealed.contains("ui_locales"), "{sealed}");
        assert_eq!(
            serde_json::from_str::<AuthorizationRequest>(&sealed).unwrap(),
            plain
        );
    }

    #[test]
    fn offline_access_needs_a_client_that_may_refresh() {
        let mut c = client(ClientKind::Confidential);
        let r = check(&params(&[("scope", "openid offline_access")]), Some(&c), NOW).unwrap();
        assert_eq!(r.scope, ["openid", "offline_access"]);
        c.grant_types = vec!["authorization_code".into()];
        let r = check(&params(&[("scope", "offline_access openid")]), Some(&c), NOW).unwrap();
        assert_eq!(r.scope, ["openid"]);
        // Scopes it does not know are ignored, not refused (Core §3.1.2.1).
        let r = check(
            &params(&[("scope", "phone openid address admin email")]),
            Some(&c),
            NOW,
        )
        .unwrap();
        assert_eq!(r.scope, ["openid", "email"]);
    }

    fn request(extra: &[(&str, &str)]) -> AuthorizationRequest {
        check(&params(extra), Some(&client(ClientKind::Public)), NOW).unwrap()
    }

    fn session(auth_time_ms: i64, mfa: bool) -> SessionView {
        SessionView {
            user_id: "u1".into(),
            auth_time_ms,
            mfa,
        }
    }

    fn ctx<'a>(s: Option<&'a SessionView>, consented: bool) -> Context<'a> {
        Context {
            session: s,
            hint_subject: None,
            consented,
            consent_skipped: false,
            now_ms: NOW + 1_000,
        }
    }

    /// Every combination of session (none, older, fresh), prompt, max_age,
    /// acr, hint and consent, against the rules written out once more.
    #[test]
    fn the_decision_follows_its_table() {
        let old = session(NOW - 3_600_000, false);
        let old_mfa = session(NOW - 3_600_000, true);
        let fresh = session(NOW + 500, false);
        let sessions = [None, Some(&old), Some(&old_mfa), Some(&fresh)];
        let prompts = ["", "none", "login", "consent", "select_account", "login consent"];
        let ages = ["", "0", "60", "86400"];
        let acrs = ["", "2"];
        let hints = [None, Some(None), Some(Some("u1")), Some(Some("u2"))];
        let mut n = 0;
        for s in sessions {
            for p in prompts {
                for a in ages {
                    for acr in acrs {
                        for hint in hints {
                            for consented in [false, true] {
                                for skipped in [false, true] {
                                    let r = request(&[("prompt", p), ("max_age", a), ("acr_values", acr)]);
                                    let c = Context {
                                        hint_subject: hint,
                                        consent_skipped: skipped,
                                        ..ctx(s, consented)
                                    };
                                    let none = p == "none";
                                    let needs_login = match s {
                                        None => true,
                                        Some(_) if hint == Some(None) => true,
                                        Some(v) => {
                                            let other_user = matches!(hint, Some(Some(u)) if u != v.user_id);
                                            let fresh = v.auth_time_ms >= r.started_ms;
                                            let old = match a {
                                                "0" => true,
                                                "" => false,
                                                secs => {
                                                    c.now_ms - v.auth_time_ms
                                                        > secs.parse::<i64>().unwrap() * 1000
                                                }
                                            };
                                            other_user
                                                || (!fresh
                                                    && (p.contains("login")
                                                        || p == "select_account"
                                                        || old
                                                        || (acr == "2" && !v.mfa)))
                                        }
                                    };
                                    let needs_consent = p.contains("consent") || !(consented || skipped);
                                    let expected = match (needs_login, needs_consent, none) {
                                        (true, _, true) => Step::Refuse("login_required"),
                                        (true, _, false) => Step::Login,
                                        (false, true, true) => Step::Refuse("consent_required"),
                                        (false, true, false) => Step::Consent,
                                        (false, false, _) => Step::Issue,
                                    };
                                    assert_eq!(decide(&r, &c), expected, "{s:?} prompt={p} max_age={a} acr={acr} hint={hint:?} consented={consented} skipped={skipped}");
                                    n += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 4 * 6 * 4 * 2 * 4 * 2 * 2);
    }

    #[test]
    fn a_login_during_the_request_satisfies_prompt_login_and_max_age_zero() {
        let r = request(&[("prompt", "login"), ("max_age", "0")]);
        let just_now = session(NOW + 10, false);
        assert_eq!(decide(&r, &ctx(Some(&just_now), true)), Step::Issue);
        let before = session(NOW - 10, false);
        assert_eq!(decide(&r, &ctx(Some(&before), true)), Step::Login);
    }
}
