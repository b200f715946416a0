//! "Continue with ...": the sign-in page's way through an upstream
//! provider (`domain/federation`, docs/federation.md). The journey (its
//! `state`, `nonce`, PKCE verifier and the pending request) is sealed into
//! a cookie of the browser that left, so that only that browser can come
//! back on it; the cookie is removed when it comes back, whatever the
//! outcome.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;

use crate::clock::now_ms;
use crate::domain::federation::{Arrival, Callback, FederationError, Refusal, JOURNEY_TTL};
use crate::domain::oidc::PageError;
use crate::domain::AuthError;
use crate::http::extract::ClientIp;
use crate::http::pages::i18n::{Key, Lang};
use crate::http::AppState;

use super::page::{
    dead_end, error_page, login_page, mfa_page, pending_client, refusal, see_other, signed_in, unavailable,
    visit, Pending, Visit,
};

/// The cookie of a journey through an upstream.
const JOURNEY: &str = "latchkey_upstream";

/// `GET /oauth/upstream/{name}?authz=...`: leaves for the upstream.
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
        Ok(d) => {
            let mut r = see_other(&d.url);
            r.headers_mut().append(
                header::SET_COOKIE,
                st.pages
                    .set_cookie(JOURNEY, &d.sealed_journey, JOURNEY_TTL.as_secs()),
            );
            v.finish(&st, r)
        }
        Err(e) => {
            if !matches!(e, FederationError::UnknownUpstream) {
                tracing::warn!(upstream = %name, error = %e, "leaving for an upstream failed");
            }
            let (status, text) = failure(&v, &display_name(&st, &name), &e);
            login_page(&st, &v, &p.authz, &client, "", Some((status, &text)))
        }
    }
}

/// `GET /oauth/upstream/{name}/callback`: back from upstream `name`.
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
                    Ok(Arrival::ProveFirst { email }) => {
                        let text = v.lang.format(Key::UpstreamProveFirst, &[("name", &shown)]);
                        login_page(
                            &st,
                            &v,
                            pending,
                            &client,
                            &email,
                            Some((StatusCode::CONFLICT, &text)),
                        )
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
