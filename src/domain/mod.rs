//! The domain: accounts, sessions, tokens and the security rules behind them.
//! Nothing here knows about HTTP.
//!
//! The services, one per feature, each found by its name: `signup`,
//! `login`, `passwords`, `mfa` (second factors), `sessions` (the core that
//! alone starts, rotates and ends sessions), `admin`, `clients`, `webhooks`,
//! `ops`; they share the handles of `shared` and the mailed codes of
//! `codebook`. The rules they apply are pure functions with `now` passed
//! in: `registration`, `refresh`, `codes`, `mfa::challenge`, `admission`,
//! `input`, and `federation` (what an identity from another provider may
//! do to local accounts; the flow that will apply it is not built yet).

pub mod admin;
pub mod admission;
pub mod clients;
pub mod codebook;
pub mod codes;
pub mod credcache;
pub mod error;
pub mod federation;
pub mod hashing;
pub mod import;
pub mod input;
pub mod legacy;
pub mod login;
pub mod mfa;
pub mod oidc;
pub mod ops;
pub mod passwords;
pub mod refresh;
pub mod registration;
pub mod sessions;
pub mod shared;
pub mod signup;
pub mod tokens;
pub mod webhooks;

pub use error::AuthError;

use std::sync::Arc;

/// The domain's services, one per feature: what the HTTP handlers and the
/// command line call. Built once by the application (`app::services`).
#[derive(Clone)]
pub struct Features {
    pub signup: Arc<signup::SignUp>,
    pub login: Arc<login::Login>,
    pub passwords: Arc<passwords::Passwords>,
    pub factors: Arc<mfa::SecondFactors>,
    pub sessions: Arc<sessions::Sessions>,
    pub admin: Arc<admin::Admin>,
    pub clients: Arc<clients::Clients>,
    pub webhooks: Arc<webhooks::Webhooks>,
    pub provider: Arc<oidc::Provider>,
    pub federation: Arc<federation::Federation>,
}
