//! The domain: accounts, sessions, tokens and the security rules behind them.
//! Nothing here knows about HTTP.

pub mod accounts;
pub mod admin;
pub mod admission;
pub mod clients;
pub mod codes;
pub mod credcache;
pub mod error;
pub mod hashing;
pub mod import;
pub mod input;
pub mod legacy;
pub mod mfa;
pub mod ops;
pub mod refresh;
pub mod registration;
pub mod tokens;
pub mod webhooks;

pub use error::AuthError;
