//! The OpenID Provider: the authorization code flow with PKCE (OpenID
//! Connect Core 1.0, RFC 6749, RFC 7636, RFC 9700), id_tokens, userinfo,
//! consents and RP-initiated logout. docs/oidc.md has the flows as sequence
//! diagrams, the client settings, and what is not supported and why.
//!
//! ```text
//!  app ──> GET /oauth/authorize ──check──> error page | error to the app
//!                                   │
//!                                 decide (request.rs, from the browser's session cookie)
//!                                   ├──> sign-in pages (the pages are clients of login, signup,
//!                                   │     passwords and mfa: every rule of the JSON API holds)
//!                                   │        └──> a browser session (a first-party session whose
//!                                   │             refresh token is the cookie) ──> decide again
//!                                   ├──> consent page ──> decide again
//!                                   └──> code (60 s, single use, hashed) ──> app's redirect URI
//!  app ──> POST /oauth/token (code, verifier) ──> a session of the app's own, under the browser
//!          session (it ends with it), its tokens and an id_token
//! ```
//!
//! The browser session is the single sign-on: a second application is
//! signed in from it without a password, and ending it (a logout here, at
//! `/auth/logout`, `DELETE /auth/sessions/{id}`, a password change, an
//! administrator) ends the sessions the applications got from it.

pub mod client;
mod exchange;
pub mod origins;
pub mod redirect;
pub mod request;

pub use exchange::CodeTokens;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use self::client::{ClientKind, ClientSettings, ConsentMode};
pub use self::request::PageError;
use self::request::{AuthorizationRequest, Context, RequestError, SessionView, Step};
use super::clients::ClientRecord;
use super::refresh::{self, RefreshDecision, RefreshState};
use super::sessions::{Origin, Sessions};
use super::shared::Shared;
use super::tokens::{Issuer, Verifier};
use super::AuthError;
use crate::clock::now_ms;
use crate::crypto::{b64url, b64url_decode, ct_eq, random_token, sha256, Sealer};
use crate::settings::{switch, ConfigError, Source};
use crate::store::AuthorizationCode;

/// How long an authorization code lives (RFC 6749 §4.1.2: short, ten
/// minutes at most).
pub const CODE_TTL_MS: i64 = 60_000;
/// How long an authorization request may take through the sign-in pages.
pub const PENDING_TTL_MS: i64 = 30 * 60_000;

/// The provider's settings.
#[derive(Clone, Debug)]
pub struct OidcSettings {
    /// The resource owner password grant (RFC 6749 §4.3) at `/oauth/token`:
    /// off unless set (`oauth_password_grant`), since RFC 9700 §2.4 says it
    /// must not be used; for migrations only.
    pub password_grant: bool,
}

impl OidcSettings {
    pub fn read(src: &impl Source) -> Result<OidcSettings, ConfigError> {
        Ok(OidcSettings {
            password_grant: src.get("oauth_password_grant", false, switch)?,
        })
    }
}

/// The browser's session, from its cookie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrowserSession {
    pub session_id: String,
    pub user_id: String,
    pub email: String,
    pub amr: String,
    /// Unix ms.
    pub auth_time_ms: i64,
}

impl BrowserSession {
    fn view(&self) -> SessionView {
        SessionView {
            user_id: self.user_id.clone(),
            auth_time_ms: self.auth_time_ms,
            mfa: self.amr.split(' ').any(|m| m == "mfa"),
        }
    }
}

/// What an authorization request does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Send the browser here (303): a code or an error, to the client.
    Redirect(String),
    /// The sign-in page, carrying the request sealed (`pending`).
    Login {
        pending: String,
        login_hint: Option<String>,
        client: ClientView,
    },
    /// The consent page.
    Consent {
        pending: String,
        client: ClientView,
        scopes: Vec<String>,
    },
    /// An error page: the request cannot go back to any client.
    Page(PageError),
}

/// A client as the pages show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClientView {
    pub id: String,
    pub name: String,
    /// The origin of the redirect URI (what the pages' form-action allows).
    pub redirect_origin: String,
}

/// An application the user consented to (`GET /auth/consents`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConsentInfo {
    pub client_id: String,
    pub client_name: Option<String>,
    pub scope: String,
    /// RFC 3339, UTC.
    pub granted_at: String,
    /// RFC 3339, UTC; absent: until revoked. A consent given for one sign-in
    /// only (a client that asks every time) expired when it was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// Whether the client's current registration still allows `req`.
fn still_allowed(settings: &ClientSettings, req: &AuthorizationRequest) -> bool {
    settings.allows("authorization_code") && redirect::matches(&settings.redirect_uris, &req.redirect_uri)
}

/// A logout request (RP-Initiated Logout 1.0 §2) once checked.
#[derive(Debug, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Where to send the browser afterwards (with `state`), if the client
    /// registered it.
    pub redirect: Option<String>,
    pub client_name: Option<String>,
}

pub struct Provider {
    shared: Arc<Shared>,
    sessions: Arc<Sessions>,
    issuer: Arc<Issuer>,
    /// Seals pending requests (and the pages' CSRF tokens).
    sealer: Sealer,
    refresh_grace_ms: i64,
    settings: OidcSettings,
    /// The origins clients registered for CORS.
    origins: Arc<origins::ClientOrigins>,
}

/// The associated data of a sealed pending request.
const PENDING_AAD: &[u8] = b"latchkey authorization request v1";
const CONSENT_AAD: &[u8] = b"latchkey consent v1";
const BROWSER_AAD: &[u8] = b"latchkey browser session v1";

impl Provider {
    pub fn new(
        shared: Arc<Shared>,
        sessions: Arc<Sessions>,
        issuer: Arc<Issuer>,
        sealer: Sealer,
        refresh_grace: Duration,
        settings: OidcSettings,
        origins: Arc<origins::ClientOrigins>,
    ) -> Provider {
        Provider {
            shared,
            sessions,
            issuer,
            sealer,
            refresh_grace_ms: refresh_grace.as_millis() as i64,
            settings,
            origins,
        }
    }

    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    fn verifier(&self) -> &Verifier {
        self.issuer.verifier()
    }

    /// A client with its settings for this flow (`None`: no such client,
    /// or one without them).
    pub async fn client(&self, id: &str) -> Result<Option<(ClientRecord, ClientSettings)>, AuthError> {
        if id.is_empty() || id.len() > 128 {
            return Ok(None);
        }
        let Some(rec) = self.shared.store.client(id).await? else {
            return Ok(None);
        };
        let Some(settings) = rec.oidc.as_deref().and_then(ClientSettings::from_json) else {
            return Ok(None);
        };
        Ok(Some((rec, settings)))
    }

    /// The algorithms id_tokens are signed with (discovery):
    /// `signing_algorithm`'s, then `id_token_signing_algorithms`' (a client
    /// picks one with `id_token_signed_response_alg`).
    pub fn id_token_algorithms(&self) -> Vec<&'static str> {
        self.issuer.id_token_algorithms()
    }

    /// The browser's session cookie for a session the pages started: its
    /// refresh token, sealed. Only this service can open it, so a cookie
    /// that leaks signs in through the pages (while the session lives) but
    /// is no refresh token anywhere else (`/auth/refresh` refuses it).
    pub fn browser_cookie(&self, refresh_token: &str) -> String {
        b64url(&self.sealer.seal(refresh_token.as_bytes(), BROWSER_AAD))
    }

    /// Whether some client registered `origin` for its browser calls
    /// (CORS, `http/cors.rs`). A database failure answers no: the browser
    /// then refuses the call, which the application retries.
    pub async fn origin_allowed(&self, origin: &str) -> bool {
        self.origins.allows(origin).await
    }

    /// How many times this instance read the clients' origins (tests).
    pub fn origin_reads(&self) -> u64 {
        self.origins.reads()
    }

    /// The browser session of a session cookie: the refresh token of a
    /// live first-party session, not yet exchanged.
    pub async fn browser_session(&self, cookie: &str) -> Result<Option<BrowserSession>, AuthError> {
        if cookie.is_empty() || cookie.len() > 256 {
            return Ok(None);
        }
        let Some(token) = b64url_decode(cookie).and_then(|c| self.sealer.open(&c, BROWSER_AAD)) else {
            return Ok(None);
        };
        let Some(rec) = self.shared.store.refresh_token(&sha256(&token)).await? else {
            return Ok(None);
        };
        let live = refresh::decide(RefreshState::from(&rec), now_ms(), self.refresh_grace_ms)
            == RefreshDecision::Rotate;
        if !live || rec.client_id.is_some() {
            return Ok(None);
        }
        Ok(Some(BrowserSession {
            session_id: rec.session_id,
            user_id: rec.user_id,
            email: rec.email,
            amr: rec.amr,
            auth_time_ms: rec.auth_time,
        }))
    }

    /// An authorization request as received (each parameter with its value).
    pub async fn authorize(
        &self,
        params: &[(String, String)],
        session: Option<&BrowserSession>,
        origin: &Origin,
    ) -> Result<Next, AuthError> {
        let id = params
            .iter()
            .find(|(k, _)| k == "client_id")
            .map_or("", |(_, v)| v.as_str());
        let client = self.client(id).await?;
        match request::check(params, client.as_ref().map(|(_, s)| s), now_ms()) {
            Err(RequestError::Page(m)) => Ok(Next::Page(m)),
            Err(RequestError::Redirect {
                redirect_uri,
                error,
                description,
                state,
            }) => Ok(Next::Redirect(self.error_redirect(
                &redirect_uri,
                error,
                &description,
                state.as_deref(),
            ))),
            Ok(req) => {
                let (rec, settings) = client.expect("check needs the client");
                self.proceed(&req, &rec, &settings, session, origin).await
            }
        }
    }

    /// Takes a pending request up again, after a sign-in.
    pub async fn resume(
        &self,
        pending: &str,
        session: Option<&BrowserSession>,
        origin: &Origin,
    ) -> Result<Next, AuthError> {
        let Some(req) = self.open_pending(pending) else {
            return Ok(Next::Page(PageError::Expired));
        };
        let Some((rec, settings)) = self.client(&req.client_id).await? else {
            return Ok(Next::Page(PageError::ClientGone));
        };
        self.proceed(&req, &rec, &settings, session, origin).await
    }

    async fn proceed(
        &self,
        req: &AuthorizationRequest,
        rec: &ClientRecord,
        settings: &ClientSettings,
        session: Option<&BrowserSession>,
        origin: &Origin,
    ) -> Result<Next, AuthError> {
        let now = now_ms();
        // The client as it is registered now: a pending request may be up
        // to half an hour old, and a redirect URI removed since is dead.
        if !still_allowed(settings, req) {
            return Ok(Next::Page(PageError::NoLongerAllowed));
        }
        let hint = req
            .id_token_hint
            .as_deref()
            .map(|h| self.verifier().read_id_token_hint(h));
        let hint_subject = hint.as_ref().map(|h| h.as_ref().map(|h| h.sub.as_str()));
        let view = session.map(BrowserSession::view);
        // Never approved without the user when any local program could
        // be the one receiving the code (RFC 8252 §8.6).
        let unattended =
            !(settings.kind == ClientKind::Public && redirect::reaches_any_local_program(&req.redirect_uri));
        // A stored consent counts while the client remembers consents (an
        // operator may have switched it to ask every time since).
        let remembers = matches!(settings.consent, ConsentMode::Remembered { .. });
        let consented = match session {
            Some(s) if remembers && unattended => {
                self.consent_covers(&s.user_id, &rec.id, &req.scope, now).await?
            }
            _ => false,
        };
        let ctx = Context {
            session: view.as_ref(),
            hint_subject,
            consented,
            consent_skipped: settings.consent == ConsentMode::Skip && unattended,
            now_ms: now,
        };
        let client = client_view(rec, &req.redirect_uri);
        match request::decide(req, &ctx) {
            Step::Refuse(error) => Ok(Next::Redirect(self.error_redirect(
                &req.redirect_uri,
                error,
                "the user must sign in or consent, and prompt=none forbids asking",
                req.state.as_deref(),
            ))),
            Step::Login => Ok(Next::Login {
                pending: self.seal_pending(req),
                login_hint: req.login_hint.clone(),
                client,
            }),
            Step::Consent => {
                let s = session.expect("consent comes after a session");
                Ok(Next::Consent {
                    pending: self.seal_consent(req, &s.session_id),
                    client,
                    scopes: req.scope.clone(),
                })
            }
            Step::Issue => {
                let s = session.expect("a code needs a session");
                self.issue_code(req, s, origin).await.map(Next::Redirect)
            }
        }
    }

    /// The user's answer on the consent page (`consent`: the page's sealed
    /// request, bound to the session that saw it).
    pub async fn consent(
        &self,
        consent: &str,
        session: &BrowserSession,
        allow: bool,
        origin: &Origin,
    ) -> Result<Next, AuthError> {
        let Some(req) = self.open_consent(consent, &session.session_id) else {
            return Ok(Next::Page(PageError::ConsentNotYours));
        };
        let Some((rec, settings)) = self.client(&req.client_id).await? else {
            return Ok(Next::Page(PageError::ClientGone));
        };
        if !still_allowed(&settings, &req) {
            return Ok(Next::Page(PageError::NoLongerAllowed));
        }
        if !allow {
            return Ok(Next::Redirect(self.error_redirect(
                &req.redirect_uri,
                "access_denied",
                "the user did not consent",
                req.state.as_deref(),
            )));
        }
        let now = now_ms();
        let expires_at = match settings.consent {
            ConsentMode::Remembered { days } => Some(now + days as i64 * 86_400_000),
            // For this sign-in only; kept to show on the account page.
            ConsentMode::Explicit | ConsentMode::Skip => Some(now),
        };
        self.shared
            .store
            .grant_consent(&session.user_id, &rec.id, &req.scope.join(" "), now, expires_at)
            .await?;
        // Consented now: a prompt=consent is answered.
        let mut answered = req.clone();
        answered.prompt.consent = false;
        let ctx_consented = Context {
            session: Some(&session.view()),
            hint_subject: None,
            consented: true,
            consent_skipped: true,
            now_ms: now,
        };
        match request::decide(&answered, &ctx_consented) {
            Step::Issue => self.issue_code(&req, session, origin).await.map(Next::Redirect),
            // The session is no longer fresh enough (it cannot be another's:
            // the consent is bound to it): sign in again.
            _ => Ok(Next::Login {
                pending: self.seal_pending(&req),
                login_hint: None,
                client: client_view(&rec, &req.redirect_uri),
            }),
        }
    }

    async fn consent_covers(
        &self,
        user: &str,
        client: &str,
        scope: &[String],
        now: i64,
    ) -> Result<bool, AuthError> {
        let Some(c) = self.shared.store.consent(user, client).await? else {
            return Ok(false);
        };
        let live = c.expires_at.is_none_or(|e| e > now);
        let granted: Vec<&str> = c.scope.split(' ').collect();
        Ok(live && scope.iter().all(|s| granted.contains(&s.as_str())))
    }

    async fn issue_code(
        &self,
        req: &AuthorizationRequest,
        session: &BrowserSession,
        origin: &Origin,
    ) -> Result<String, AuthError> {
        let code = random_token();
        let now = now_ms();
        let ip = origin.ip.to_string();
        self.shared
            .store
            .create_authorization_code(
                &AuthorizationCode {
                    code_hash: sha256(code.as_bytes()).to_vec(),
                    client_id: req.client_id.clone(),
                    user_id: session.user_id.clone(),
                    session_id: session.session_id.clone(),
                    redirect_uri: req.redirect_uri.clone(),
                    code_challenge: req.code_challenge.clone(),
                    scope: req.scope.join(" "),
                    nonce: req.nonce.clone(),
                    amr: session.amr.clone(),
                    auth_time: session.auth_time_ms,
                    created_at: now,
                    expires_at: now + CODE_TTL_MS,
                    used_at: None,
                    issued_session: None,
                },
                Some(&ip),
            )
            .await?;
        let mut params = vec![("code", code.as_str())];
        if let Some(s) = &req.state {
            params.push(("state", s));
        }
        params.push(("iss", self.issuer.issuer()));
        Ok(redirect::with_params(&req.redirect_uri, &params))
    }

    /// The error response of an authorization request (RFC 6749 §4.1.2.1,
    /// with `iss`, RFC 9207).
    fn error_redirect(&self, uri: &str, error: &str, description: &str, state: Option<&str>) -> String {
        let mut params = vec![("error", error), ("error_description", description)];
        if let Some(s) = state {
            params.push(("state", s));
        }
        params.push(("iss", self.issuer.issuer()));
        redirect::with_params(uri, &params)
    }

    /// Reads an RP-initiated logout request (RP-Initiated Logout 1.0 §2):
    /// a `post_logout_redirect_uri` is followed only if the client (named
    /// by `client_id` or by the `id_token_hint`'s audience) registered it.
    pub async fn logout_request(
        &self,
        params: &[(String, String)],
    ) -> Result<Result<LogoutRequest, PageError>, AuthError> {
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .filter(|v| !v.is_empty())
        };
        let hint = match get("id_token_hint") {
            Some(h) => match self.verifier().read_id_token_hint(h) {
                Some(h) => Some(h),
                None => return Ok(Err(PageError::ForeignIdTokenHint)),
            },
            None => None,
        };
        let client_id = match (get("client_id"), &hint) {
            (Some(c), Some(h)) if c != h.aud => return Ok(Err(PageError::HintOfAnotherClient)),
            (Some(c), _) => Some(c.to_string()),
            (None, Some(h)) => Some(h.aud.clone()),
            (None, None) => None,
        };
        let client = match &client_id {
            Some(id) => self.client(id).await?,
            None => None,
        };
        let redirect = match get("post_logout_redirect_uri") {
            None => None,
            Some(uri) => {
                let Some((_, s)) = &client else {
                    return Ok(Err(PageError::LogoutRedirectWithoutClient));
                };
                if !s.post_logout_redirect_uris.iter().any(|r| r == uri) {
                    return Ok(Err(PageError::UnregisteredLogoutRedirect));
                }
                let state = get("state").filter(|s| s.len() <= request::MAX_STATE);
                Some(match state {
                    Some(st) => redirect::with_params(uri, &[("state", st)]),
                    None => uri.to_string(),
                })
            }
        };
        Ok(Ok(LogoutRequest {
            redirect,
            client_name: client.map(|(r, _)| r.name.unwrap_or(r.id)),
        }))
    }

    /// Ends the browser session, and every application session started
    /// from it.
    pub async fn sign_out(&self, session: &BrowserSession) -> Result<(), AuthError> {
        self.sessions.revoke(&session.session_id, "logout").await
    }

    /// The applications the user consented to.
    pub async fn consents(&self, user_id: &str) -> Result<Vec<ConsentInfo>, AuthError> {
        let list = self.shared.store.consents(user_id).await?;
        let mut out = Vec::with_capacity(list.len());
        for c in list {
            let name = self.shared.store.client(&c.client_id).await?.and_then(|r| r.name);
            out.push(ConsentInfo {
                client_id: c.client_id,
                client_name: name,
                scope: c.scope,
                granted_at: crate::clock::rfc3339(c.granted_at),
                expires_at: c.expires_at.map(crate::clock::rfc3339),
            });
        }
        Ok(out)
    }

    /// Withdraws the user's consent to `client_id`: the client's sessions
    /// for the user end, and its next sign-in asks again.
    pub async fn revoke_consent(&self, user_id: &str, client_id: &str) -> Result<(), AuthError> {
        let ended = self
            .shared
            .store
            .revoke_consent(user_id, client_id, now_ms())
            .await?
            .ok_or(AuthError::NotFound("consent"))?;
        self.shared.revocations.revoke(&ended).await;
        Ok(())
    }

    /// Whether a form's CSRF field is the browser's CSRF cookie (a random
    /// value the pages set: a page of another site can neither read nor
    /// set it).
    pub fn csrf_matches(&self, cookie: &str, field: &str) -> bool {
        !cookie.is_empty() && cookie.len() == field.len() && ct_eq(cookie.as_bytes(), field.as_bytes())
    }

    fn seal_pending(&self, req: &AuthorizationRequest) -> String {
        let body = serde_json::to_vec(&(req, req.started_ms + PENDING_TTL_MS)).expect("request serializes");
        b64url(&self.sealer.seal(&body, PENDING_AAD))
    }

    /// The request of a pending token this service sealed, if not expired.
    pub fn open_pending(&self, token: &str) -> Option<AuthorizationRequest> {
        let bytes = self.sealer.open(&b64url_decode(token)?, PENDING_AAD)?;
        let (req, expires): (AuthorizationRequest, i64) = serde_json::from_slice(&bytes).ok()?;
        (expires > now_ms()).then_some(req)
    }

    fn seal_consent(&self, req: &AuthorizationRequest, session_id: &str) -> String {
        let body =
            serde_json::to_vec(&(req, session_id, now_ms() + PENDING_TTL_MS)).expect("request serializes");
        b64url(&self.sealer.seal(&body, CONSENT_AAD))
    }

    /// The request of a consent page this service sealed for the session
    /// `session_id`, if not expired.
    pub fn open_consent(&self, token: &str, session_id: &str) -> Option<AuthorizationRequest> {
        let bytes = self.sealer.open(&b64url_decode(token)?, CONSENT_AAD)?;
        let (req, sid, expires): (AuthorizationRequest, String, i64) = serde_json::from_slice(&bytes).ok()?;
        (expires > now_ms() && sid == session_id).then_some(req)
    }
}

fn client_view(rec: &ClientRecord, redirect_uri: &str) -> ClientView {
    let origin = url::Url::parse(redirect_uri)
        .map(|u| match u.origin() {
            url::Origin::Tuple(..) => u.origin().ascii_serialization(),
            url::Origin::Opaque(_) => format!("{}:", u.scheme()),
        })
        .unwrap_or_default();
    ClientView {
        id: rec.id.clone(),
        name: rec.name.clone().unwrap_or_else(|| rec.id.clone()),
        redirect_origin: origin,
    }
}
