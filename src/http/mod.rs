//! The HTTP edge: routes, extractors, and the mapping of errors to answers.
//!
//! Handlers have one shape on purpose (extract, parse, call one domain
//! operation, answer), and so do their OpenAPI annotations: each handler
//! reads whole where it stands, next to the contract it documents.

pub mod accounts;
pub mod admin;
pub mod cors;
mod federation;

pub mod error;
pub mod extract;
pub mod mfa;
pub mod middleware;
pub mod oauth;
pub mod oidc;
pub mod ops;
pub mod pages;
pub mod schema;
mod settings;
pub mod tokens;
mod ui;

pub use settings::{ClientAddress, HttpSettings};

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::domain::admin::Admin;
use crate::domain::clients::Clients;
use crate::domain::federation::Federation;
use crate::domain::login::Login;
use crate::domain::mfa::SecondFactors;
use crate::domain::oidc::Provider;
use crate::domain::ops::Operations;
use crate::domain::passwords::Passwords;
use crate::domain::sessions::Sessions;
use crate::domain::signup::SignUp;
use crate::domain::tokens::Verifier;
use crate::domain::webhooks::Webhooks;
use crate::domain::Features;
use crate::limits::Limiter;
use error::ApiError;

/// What handlers see: the domain's services and the edge's own settings,
/// nothing below them (no store, no Redis). Built by the application.
pub struct ApiState {
    signup: Arc<SignUp>,
    login: Arc<Login>,
    passwords: Arc<Passwords>,
    factors: Arc<SecondFactors>,
    sessions: Arc<Sessions>,
    admin: Arc<Admin>,
    clients: Arc<Clients>,
    webhooks: Arc<Webhooks>,
    provider: Arc<Provider>,
    federation: Arc<Federation>,
    /// The sign-in pages' templates.
    pages: pages::Pages,
    tokens: Arc<Verifier>,
    limiter: Arc<Limiter>,
    ops: Arc<Operations>,
    settings: HttpSettings,
}

impl ApiState {
    pub fn new(
        features: Features,
        tokens: Arc<Verifier>,
        limiter: Arc<Limiter>,
        ops: Arc<Operations>,
        settings: HttpSettings,
        pages: pages::Pages,
    ) -> AppState {
        let Features {
            signup,
            login,
            passwords,
            factors,
            sessions,
            admin,
            clients,
            webhooks,
            provider,
            federation,
        } = features;
        Arc::new(ApiState {
            signup,
            login,
            passwords,
            factors,
            sessions,
            admin,
            clients,
            webhooks,
            provider,
            federation,
            pages,
            tokens,
            limiter,
            ops,
            settings,
        })
    }
}

pub type AppState = Arc<ApiState>;

#[derive(OpenApi)]
#[openapi(
    info(title = "latchkey", description = "Authentication service: accounts, tokens, OAuth 2.0 endpoints. See docs/api.md."),
    paths(
        accounts::register, accounts::verify_otp, accounts::resend_otp, accounts::login, accounts::refresh,
        accounts::logout, accounts::me, accounts::change_password, accounts::password_reset,
        accounts::password_reset_confirm, accounts::sessions, accounts::end_session, accounts::end_sessions,
        admin::users, admin::create_user, admin::user, admin::events, admin::add_webhook, admin::webhooks,
        admin::remove_webhook, admin::webhook_deliveries, admin::unlock, admin::update_user, admin::delete_user, admin::end_sessions,
        admin::password_reset, admin::reset_factors, admin::add_client, admin::clients, admin::client,
        admin::set_client_oidc, admin::remove_client, mfa::verify, mfa::passkey_login, mfa::passkey_login_finish,
        mfa::factors, mfa::start_totp, mfa::confirm_totp, mfa::start_passkey, mfa::finish_passkey,
        mfa::rename_factor, mfa::remove_factor, mfa::recovery_codes, tokens::validate, tokens::jwks, tokens::discovery,
        oauth::token, oauth::introspect, oauth::revoke, oidc::authorize_get, oidc::authorize_post, oidc::logout_get, oidc::logout_post,
        oidc::userinfo_get, oidc::userinfo_post, oidc::consents, oidc::revoke_consent, ops::live, ops::ready, ops::openapi,
        federation::identities, federation::start_link, federation::app_depart, federation::app_token, federation::unlink, federation::upstreams, federation::add_upstream,
        federation::remove_upstream, federation::user_identities, federation::unlink_user_identity,
        oidc::upstream::depart, oidc::upstream::arrive, oidc::upstream::backchannel_logout,
    ),
    components(schemas(crate::domain::mfa::StepUp)),
    modifiers(&BearerAuth, &CommonResponses)
)]
pub struct ApiDoc;

/// The answers every operation may give whatever its handler does, added
/// to each so that the document lists every status a client can meet:
/// `503` (overloaded, or past the request deadline), `400`/`413`/`415` for a
/// body (malformed, too large, not JSON), `429` on the rate-limited
/// `/auth` and `/oauth` routes.
struct CommonResponses;

impl Modify for CommonResponses {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::response::Response;
        for (path, item) in doc.paths.paths.iter_mut() {
            for op in [&mut item.get, &mut item.post, &mut item.delete, &mut item.patch]
                .into_iter()
                .flatten()
            {
                let body = op
                    .request_body
                    .as_ref()
                    .map(|b| b.content.contains_key("application/json"));
                let mut add = |status: &str, text: &str| {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| Response::new(text).into());
                };
                add(
                    "503",
                    "OVERLOADED (with Retry-After), or the request deadline passed; UNAVAILABLE (with Retry-After): the database cannot be reached; STORAGE_FULL (with Retry-After): the database's disk is full, nothing was written",
                );
                if let Some(json) = body {
                    add(
                        "400",
                        "INVALID_REQUEST: malformed body, or a field outside its schema",
                    );
                    add("413", "PAYLOAD_TOO_LARGE");
                    if json {
                        add(
                            "415",
                            "UNSUPPORTED_MEDIA_TYPE: the body is not sent as application/json",
                        );
                    }
                }
                if path.starts_with("/auth/") || path.starts_with("/oauth/") {
                    add("429", "RATE_LIMITED or TOO_MANY_ATTEMPTS, with Retry-After");
                }
            }
        }
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
        // OAuth client authentication (RFC 6749 §2.3.1); the body parameters
        // client_id and client_secret are accepted too.
        components.add_security_scheme(
            "client_basic",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Basic).build()),
        );
        // Where OAuth clients get tokens (password grant).
        // and where a client gets its own token for the admin API.
        use utoipa::openapi::security::{ClientCredentials, Flow, OAuth2, Password, Scopes};
        components.add_security_scheme(
            "oauth2",
            SecurityScheme::OAuth2(OAuth2::new([
                Flow::Password(Password::new("/oauth/token", Scopes::new())),
                Flow::ClientCredentials(ClientCredentials::new(
                    "/oauth/token",
                    Scopes::from_iter([(crate::domain::clients::ADMIN_SCOPE, "the admin API (/admin/*)")]),
                )),
            ])),
        );
    }
}

/// Every route of the public listener, in one table: the router is built
/// from it, and so are the metrics' route labels
/// ([`middleware::RouteLabels`]).
fn routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/auth/register", post(accounts::register)),
        ("/auth/verify-otp", post(accounts::verify_otp)),
        ("/auth/resend-otp", post(accounts::resend_otp)),
        ("/auth/login", post(accounts::login)),
        ("/auth/refresh", post(accounts::refresh)),
        ("/auth/logout", post(accounts::logout)),
        ("/auth/me", get(accounts::me)),
        ("/auth/password", post(accounts::change_password)),
        (
            "/auth/sessions",
            get(accounts::sessions).delete(accounts::end_sessions),
        ),
        ("/auth/sessions/{id}", delete(accounts::end_session)),
        ("/auth/mfa/verify", post(mfa::verify)),
        ("/auth/mfa/factors", get(mfa::factors)),
        (
            "/auth/mfa/factors/{id}",
            axum::routing::patch(mfa::rename_factor).delete(mfa::remove_factor),
        ),
        ("/auth/mfa/totp", post(mfa::start_totp)),
        ("/auth/mfa/totp/{id}/confirm", post(mfa::confirm_totp)),
        ("/auth/mfa/passkeys", post(mfa::start_passkey)),
        ("/auth/mfa/passkeys/finish", post(mfa::finish_passkey)),
        ("/auth/mfa/recovery-codes", post(mfa::recovery_codes)),
        ("/auth/passkeys/login", post(mfa::passkey_login)),
        ("/auth/passkeys/login/finish", post(mfa::passkey_login_finish)),
        ("/admin/users", get(admin::users).post(admin::create_user)),
        ("/admin/events", get(admin::events)),
        ("/admin/webhooks", get(admin::webhooks).post(admin::add_webhook)),
        ("/admin/webhooks/{id}", delete(admin::remove_webhook)),
        ("/admin/clients", get(admin::clients).post(admin::add_client)),
        (
            "/admin/clients/{id}",
            get(admin::client).delete(admin::remove_client),
        ),
        (
            "/admin/clients/{id}/oidc",
            axum::routing::put(admin::set_client_oidc),
        ),
        ("/admin/webhooks/{id}/deliveries", get(admin::webhook_deliveries)),
        (
            "/admin/users/{id}",
            get(admin::user)
                .patch(admin::update_user)
                .delete(admin::delete_user),
        ),
        ("/admin/users/{id}/sessions", delete(admin::end_sessions)),
        ("/admin/users/{id}/unlock", post(admin::unlock)),
        ("/admin/users/{id}/factors", delete(admin::reset_factors)),
        ("/admin/users/{id}/password-reset", post(admin::password_reset)),
        ("/auth/password-reset", post(accounts::password_reset)),
        (
            "/auth/password-reset/confirm",
            post(accounts::password_reset_confirm),
        ),
        ("/auth/validate", get(tokens::validate)),
        ("/.well-known/jwks.json", get(tokens::jwks)),
        ("/.well-known/openid-configuration", get(tokens::discovery)),
        ("/oauth/token", post(oauth::token)),
        ("/oauth/introspect", post(oauth::introspect)),
        ("/oauth/revoke", post(oauth::revoke)),
        ("/health/live", get(ops::live)),
        ("/health/ready", get(ops::ready)),
        ("/openapi.json", get(ops::openapi)),
        ("/ui/account", get(ui::page)),
        ("/ui/account.js", get(ui::script)),
        ("/ui/account.css", get(ui::style)),
        ("/ui/webauthn.js", get(ui::webauthn)),
        (
            "/oauth/authorize",
            get(oidc::authorize_get).post(oidc::authorize_post),
        ),
        ("/oauth/continue", get(oidc::resume)),
        ("/oauth/login", post(oidc::login)),
        ("/oauth/mfa", post(oidc::mfa)),
        ("/oauth/passkey", post(oidc::passkey)),
        ("/oauth/upstream/{name}/callback", get(oidc::upstream_arrive)),
        (
            "/oauth/upstream/{name}/backchannel-logout",
            post(oidc::upstream::backchannel_logout),
        ),
        ("/oauth/upstream/{name}", get(oidc::upstream_depart)),
        ("/oauth/link", post(oidc::confirm_link)),
        ("/oauth/signup", get(oidc::signup_form).post(oidc::signup)),
        ("/oauth/signup/verify", post(oidc::verify)),
        ("/oauth/reset", get(oidc::reset_form).post(oidc::reset)),
        ("/oauth/reset/confirm", post(oidc::reset_confirm)),
        ("/oauth/consent", post(oidc::consent)),
        ("/oauth/logout", get(oidc::logout_get).post(oidc::logout_post)),
        ("/oauth/logout/confirm", post(oidc::logout_confirm)),
        (
            "/oauth/userinfo",
            get(oidc::userinfo_get).post(oidc::userinfo_post),
        ),
        ("/oauth/pages.css", get(oidc::pages_css)),
        ("/oauth/pages.js", get(oidc::pages_js)),
        ("/auth/consents", get(oidc::consents)),
        ("/auth/consents/{client_id}", delete(oidc::revoke_consent)),
        (
            "/auth/identities",
            get(federation::identities).post(federation::start_link),
        ),
        ("/auth/identities/{id}", delete(federation::unlink)),
        ("/auth/upstream/token", post(federation::app_token)),
        ("/auth/upstream/{name}", get(federation::app_depart)),
        (
            "/admin/upstreams",
            get(federation::upstreams).post(federation::add_upstream),
        ),
        ("/admin/upstreams/{name}", delete(federation::remove_upstream)),
        ("/admin/users/{id}/identities", get(federation::user_identities)),
        (
            "/admin/users/{id}/identities/{identity}",
            delete(federation::unlink_user_identity),
        ),
    ]
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.settings.body_limit;
    let table = routes();
    let templates: Vec<&'static str> = table.iter().map(|(path, _)| *path).collect();
    let router = table.into_iter().fold(Router::new(), |router, (path, methods)| {
        if cors::CLIENT_PATHS.contains(&path) || cors::PUBLIC_PATHS.contains(&path) {
            // The layer sees the methods the route lacks too (a preflight
            // is an OPTIONS): the fallback is set before it is layered.
            let cors = axum::middleware::from_fn_with_state(state.clone(), cors::layer);
            let methods = methods.fallback(|| async { ApiError::MethodNotAllowed });
            router.route(path, methods.layer(cors))
        } else {
            router.route(path, methods)
        }
    });
    router
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::RequestContextLayer {
            deadline: state.settings.request_timeout,
            routes: middleware::RouteLabels::of(&templates),
        })
        .with_state(state)
}

/// The operators' listener (`admin_listen`, loopback by default): metrics,
/// which would tell an outsider which emails have accounts (cache and
/// database counters move differently for them), the revocations a gateway
/// polls, and the health checks.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(ops::metrics))
        .route("/revocations", get(ops::revocations))
        .route("/health/live", get(ops::live))
        .route("/health/ready", get(ops::ready))
        .fallback(|| async { ApiError::NotFound })
        .with_state(state)
}
