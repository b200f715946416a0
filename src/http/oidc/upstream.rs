//! "Continue with ...": the sign-in page's way through an upstream
//! provider (`domain/federation`, docs/federation.md). The journey (its
//! `state`, `nonce`, PKCE verifier and the pending request) is sealed into
//! a cookie of the browser that left, so that only that browser can come
//! back on it; the cookie is removed when it comes back, whatever the
//! outcome.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::clock::now_ms;
use crate::domain::federation::{
    AppReturn, Arrival, Callback, Departure, FederationError, Refusal, JOURNEY_TTL,
};
use crate::domain::oidc::PageError;
use crate::domain::sessions::TokenPair;
use crate::domain::AuthError;
use crate::http::extract::{ClientIp, ClientOrigin};
use crate::http::pages::i18n::{Key, Lang};
use crate::http::AppState;

use super::page::{
    checked_form, dead_end, error_page, field, login_page, mfa_page, pending_client, refusal, see_other,
    signed_in, unavailable, visit, Pending, Visit,
};

/// The cookie of a journey through an upstream.
pub(crate) const JOURNEY: &str = "latchkey_upstream";
/// The cookie of an identity to link once the person signs in to the
/// account its address names.
const LINK: &str = "latchkey_upstream_link";

/// `r` with the journey's cookie of departure `d` (the browser that
/// leaves is the one that may come back: the pages, the account page's
/// link and the applications' JSON pair all leave this way).
pub(crate) fn with_journey(st: &AppState, mut r: Response, d: &Departure) -> Response {
    r.headers_mut().append(
        header::SET_COOKIE,
        st.pages
            .set_cookie(JOURNEY, &d.sealed_journey, JOURNEY_TTL.as_secs()),
    );
    r
}

/// `GET /oauth/upstream/{name}?authz=...`: leaves for the upstream.
#[utoipa::path(get, path = "/oauth/upstream/{name}", tag = "federation",
    params(("name" = String, Path, description = "An upstream's name"),
           ("authz" = String, Query, description = "The pending sign-in (the sign-in page's link carries it)")),
    responses((status = 303, description = "To the upstream's authorization endpoint, with the journey's cookie"),
              (status = 400, description = "The sign-in page expired: an error page"),
              (status = 404, description = "No such upstream: the sign-in page, with a message"),
              (status = 502, description = "The upstream cannot be reached: the sign-in page, with a message")))]
pub async fn depart(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(p): Query<Pending>,
) -> Response {
    let mut v = match visit(&st, &headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(&st, Lang::of_browser(&headers), e),
    };
    let Some(client) = pending_client(&st, &mut v, &p.authz).await else {
        return dead_end(&st, &v, PageError::Expired);
    };
    match st.federation.depart(&name, &p.authz, &v.origin, now_ms()).await {
        Ok(d) => v.finish(&st, with_journey(&st, see_other(&d.url), &d)),
        Err(e) => {
            // Logged by a name the operator gave, never one from the URL.
            if let Some(known) = st.federation.listed().iter().find(|u| u.name == name) {
                tracing::warn!(upstream = %known.name, error = %e, "leaving for an upstream failed");
            }
            let (status, text) = failure(&v, &display_name(&st, &name), &e);
            login_page(&st, &v, &p.authz, &client, "", Some((status, &text)))
        }
    }
}

/// `GET /oauth/upstream/{name}/callback`: back from upstream `name`.
#[utoipa::path(get, path = "/oauth/upstream/{name}/callback", tag = "federation",
    params(("name" = String, Path), ("code" = Option<String>, Query), ("state" = Option<String>, Query),
           ("iss" = Option<String>, Query), ("error" = Option<String>, Query)),
    responses((status = 303, description = "Signed in: the sign-in goes on"),
              (status = 200, description = "The second step's page"),
              (status = 400, description = "Not this browser's journey (no cookie, another state or upstream, too old)"),
              (status = 403, description = "An address not verified or not trusted, no account linked, a disabled account"),
              (status = 409, description = "An account here has the address: sign in to it to link"),
              (status = 502, description = "The upstream failed, or its id_token or iss is refused")))]
pub async fn arrive(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(back): Query<Callback>,
) -> Response {
    let mut v = match visit(&st, &headers, ip).await {
        Ok(v) => v,
        Err(e) => return unavailable(&st, Lang::of_browser(&headers), e),
    };
    let now = now_ms();
    let journey = st
        .pages
        .cookie(&headers, JOURNEY)
        .and_then(|c| st.federation.journey(&c, now));
    let r = match journey {
        None => error_page(&st, &v, StatusCode::BAD_REQUEST, v.text(Key::UpstreamJourney)),
        Some(journey) if journey.app.is_some() => {
            let outcome = st.federation.arrive(&name, &journey, &back, &v.origin, now).await;
            if let Err(e) = &outcome {
                tracing::warn!(upstream = %journey.upstream, error = %e, "a sign-in through an upstream failed");
            }
            let app = journey.app.as_ref().expect("an application's journey");
            see_other(&app_return(app, outcome))
        }
        Some(journey) if journey.link_to.is_some() => {
            let outcome = st.federation.arrive(&name, &journey, &back, &v.origin, now).await;
            if let Err(e) = &outcome {
                tracing::warn!(upstream = %journey.upstream, error = %e, "linking through an upstream failed");
            }
            see_other(&format!(
                "/ui/account?{}",
                linked_query(&journey.upstream, outcome)
            ))
        }
        Some(journey) => match pending_client(&st, &mut v, &journey.authz).await {
            None => dead_end(&st, &v, PageError::Expired),
            Some(client) => {
                let shown = display_name(&st, &journey.upstream);
                let pending = journey.authz.as_str();
                let note =
                    |status, text: &str| login_page(&st, &v, pending, &client, "", Some((status, text)));
                match st.federation.arrive(&name, &journey, &back, &v.origin, now).await {
                    Ok(Arrival::SignedIn(Ok(pair))) => signed_in(&st, &v, &pair, pending),
                    Ok(Arrival::SignedIn(Err(AuthError::SecondFactorRequired(Some(step))))) => {
                        mfa_page(&st, &v, pending, &client, &step, None)
                    }
                    Ok(Arrival::SignedIn(Err(e))) => {
                        let (status, text) = refusal(v.lang, &e);
                        note(status, &text)
                    }
                    Ok(Arrival::ProveFirst { email, sealed_link }) => {
                        let text = v.lang.format(Key::UpstreamProveFirst, &[("name", &shown)]);
                        let mut r = login_page(
                            &st,
                            &v,
                            pending,
                            &client,
                            &email,
                            Some((StatusCode::CONFLICT, &text)),
                        );
                        r.headers_mut().append(
                            header::SET_COOKIE,
                            st.pages.set_cookie(LINK, &sealed_link, JOURNEY_TTL.as_secs()),
                        );
                        r
                    }
                    Ok(Arrival::ProveMailbox { email }) => {
                        let text = v.lang.format(Key::UpstreamProveMailbox, &[("name", &shown)]);
                        login_page(
                            &st,
                            &v,
                            pending,
                            &client,
                            &email,
                            Some((StatusCode::CONFLICT, &text)),
                        )
                    }
                    Ok(Arrival::Refused(r)) => {
                        let key = match r {
                            Refusal::Disabled => Key::AccountDisabled,
                            Refusal::UnverifiedEmail => Key::UpstreamUnverified,
                            Refusal::NoAccount | Refusal::LinkedElsewhere => Key::UpstreamNoAccount,
                        };
                        note(StatusCode::FORBIDDEN, &v.lang.format(key, &[("name", &shown)]))
                    }
                    Ok(Arrival::Linked | Arrival::AppCode(_)) => {
                        error_page(&st, &v, StatusCode::BAD_REQUEST, v.text(Key::UpstreamJourney))
                    }
                    Err(FederationError::Journey) => {
                        error_page(&st, &v, StatusCode::BAD_REQUEST, v.text(Key::UpstreamJourney))
                    }
                    Err(e) => {
                        tracing::warn!(upstream = %journey.upstream, error = %e, "a sign-in through an upstream failed");
                        let (status, text) = failure(&v, &shown, &e);
                        note(status, &text)
                    }
                }
            }
        },
    };
    // The journey is over, whatever came of it.
    let mut r = r;
    r.headers_mut()
        .append(header::SET_COOKIE, st.pages.set_cookie(JOURNEY, "", 0));
    r
}

/// `answer` to a sign-in of `pair`'s account, unless the browser holds a
/// pending link for that account (the proof the sign-in page asked for):
/// then the page that asks whether to link it, with `answer`'s cookies
/// (the session is started either way). A link that may not be made
/// (another account, too old, changed meanwhile) is dropped.
pub(super) async fn proved(
    st: &AppState,
    headers: &HeaderMap,
    v: &Visit,
    pair: &TokenPair,
    pending: &str,
    answer: Response,
) -> Response {
    let Some(sealed) = st.pages.cookie(headers, LINK) else {
        return answer;
    };
    let offer = match st.federation.offer(&sealed, &pair.user_id, now_ms()).await {
        Ok(offer) => offer,
        Err(e) => {
            tracing::warn!(error = %e, "reading a pending link failed");
            None
        }
    };
    let Some(offer) = offer else {
        let mut r = answer;
        r.headers_mut()
            .append(header::SET_COOKIE, st.pages.set_cookie(LINK, "", 0));
        return r;
    };
    let email = offer.email.unwrap_or_default();
    let mut page = st.pages.page(
        StatusCode::OK,
        v.lang,
        Key::TitleLink,
        "link.html",
        &[
            ("name", &offer.upstream),
            ("email", &email),
            ("authz", pending),
            ("csrf", &v.csrf),
        ],
        &[],
    );
    for c in answer.headers().get_all(header::SET_COOKIE) {
        page.headers_mut().append(header::SET_COOKIE, c.clone());
    }
    page
}

/// `POST /oauth/link`: the answer to the page of [`proved`]: `link` links
/// the pending identity to the browser session's account; anything else
/// does not. Then the sign-in goes on.
pub async fn confirm_link(
    State(st): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (v, f) = match checked_form(&st, ip, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if field(&f, "decision") == "link" {
        if let (Some(sealed), Some(session)) = (st.pages.cookie(&headers, LINK), &v.session) {
            if let Err(e) = st
                .federation
                .link_after_proof(&sealed, &session.user_id, &v.origin, now_ms())
                .await
            {
                tracing::warn!(error = %e, "linking an upstream identity failed");
            }
        }
    }
    let mut r = v.finish(
        &st,
        see_other(&format!("/oauth/continue?authz={}", field(&f, "authz"))),
    );
    r.headers_mut()
        .append(header::SET_COOKIE, st.pages.set_cookie(LINK, "", 0));
    r
}

/// Where a link from the account page ends: the account page, told
/// `linked={name}` or `link_error={code}` (`linked_elsewhere`:
/// another account holds the identity; `disabled`; `journey`: not this
/// browser's, or too old; `failed`: the upstream failed or refused).
fn linked_query(name: &str, outcome: Result<Arrival, FederationError>) -> String {
    let error = match outcome {
        Ok(Arrival::Linked) => return format!("linked={name}"),
        Ok(Arrival::Refused(Refusal::LinkedElsewhere)) => "linked_elsewhere",
        Ok(Arrival::Refused(Refusal::Disabled)) => "disabled",
        Err(FederationError::Journey) => "journey",
        Ok(_) | Err(_) => "failed",
    };
    format!("link_error={error}")
}

/// Where an application's journey ends: its `redirect_to` with `code`
/// (redeemed at `POST /auth/upstream/token`), or with `error`:
/// `link_required` (an account here has the address: the person signs in
/// to it and links the provider from there), `unverified_email`,
/// `no_account`, `account_disabled`, `access_denied` (at the upstream),
/// `invalid_journey` (not this browser's, or too old), `rate_limited`,
/// `upstream_failed`. Its `state` comes back as it was given.
fn app_return(app: &AppReturn, outcome: Result<Arrival, FederationError>) -> String {
    let (key, value) = match outcome {
        Ok(Arrival::AppCode(code)) => ("code", code),
        Ok(Arrival::ProveFirst { .. } | Arrival::ProveMailbox { .. }) => ("error", "link_required".into()),
        Ok(Arrival::Refused(Refusal::UnverifiedEmail)) => ("error", "unverified_email".into()),
        Ok(Arrival::Refused(Refusal::NoAccount | Refusal::LinkedElsewhere)) => ("error", "no_account".into()),
        Ok(Arrival::Refused(Refusal::Disabled)) => ("error", "account_disabled".into()),
        Err(FederationError::Denied(_)) => ("error", "access_denied".into()),
        Err(FederationError::Journey) => ("error", "invalid_journey".into()),
        Err(FederationError::Auth(AuthError::RateLimited(_))) => ("error", "rate_limited".into()),
        Ok(Arrival::SignedIn(_) | Arrival::Linked) | Err(_) => ("error", "upstream_failed".into()),
    };
    let mut url = url::Url::parse(&app.redirect_to).expect("a return URL checked when the journey began");
    url.query_pairs_mut().append_pair(key, &value);
    if let Some(s) = &app.state {
        url.query_pairs_mut().append_pair("state", s);
    }
    url.into()
}

/// The name the pages give upstream `name`.
fn display_name(st: &AppState, name: &str) -> String {
    st.federation
        .listed()
        .iter()
        .find(|u| u.name == name)
        .map_or_else(|| name.to_string(), |u| u.display_name.clone())
}

/// What the sign-in page says of a failed journey, and with what status.
fn failure(v: &Visit, name: &str, e: &FederationError) -> (StatusCode, String) {
    let text = |key| v.lang.format(key, &[("name", name)]);
    match e {
        FederationError::Auth(e) => refusal(v.lang, e),
        FederationError::UnknownUpstream => (StatusCode::NOT_FOUND, text(Key::UpstreamUnknown)),
        FederationError::Journey => (StatusCode::BAD_REQUEST, text(Key::UpstreamJourney)),
        FederationError::Denied(_) => (StatusCode::UNAUTHORIZED, text(Key::UpstreamFailed)),
        FederationError::TooLarge => (StatusCode::BAD_REQUEST, text(Key::UpstreamFailed)),
        FederationError::MixUp | FederationError::Upstream(_) | FederationError::IdToken(_) => {
            (StatusCode::BAD_GATEWAY, text(Key::UpstreamFailed))
        }
    }
}

/// The form of an upstream's back-channel logout.
#[derive(serde::Deserialize, utoipa::ToSchema)]
pub struct LogoutForm {
    logout_token: String,
}

/// `POST /oauth/upstream/{name}/backchannel-logout`: upstream `name`
/// signed someone out (OpenID Connect Back-Channel Logout 1.0); the
/// sessions of theirs that began through an upstream end. `200` when the
/// token is good (whether or not it ended anything), `400` otherwise
/// (§2.8), never cached.
#[utoipa::path(post, path = "/oauth/upstream/{name}/backchannel-logout", tag = "federation",
    params(("name" = String, Path, description = "An upstream's name")),
    request_body(content = LogoutForm, content_type = "application/x-www-form-urlencoded"),
    responses((status = 200, description = "Done"),
              (status = 400, description = "`invalid_request`: no logout token, or one refused (signature, issuer, audience, age, event)")))]
pub async fn backchannel_logout(
    State(st): State<AppState>,
    ClientOrigin(origin): ClientOrigin,
    Path(name): Path<String>,
    form: Result<axum::Form<LogoutForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let outcome = match form {
        Ok(axum::Form(f)) => st
            .federation
            .upstream_logout(&name, &f.logout_token, &origin, now_ms())
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.body_text()),
    };
    let (status, body) = match outcome {
        Ok(ended) => {
            tracing::info!(upstream = %name.chars().filter(char::is_ascii_alphanumeric).take(32).collect::<String>(),
                ended, "an upstream's back-channel logout");
            (StatusCode::OK, String::new())
        }
        Err(e) => {
            tracing::warn!(error = %e, "an upstream's logout token was refused");
            (
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "invalid_request", "error_description": "the logout token is refused"})
                    .to_string(),
            )
        }
    };
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    if status != StatusCode::OK {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
    }
    r
}
