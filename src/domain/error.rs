//! The one error type of the domain; `http::error` maps it to responses.

use super::hashing::Overloaded;
use super::input::FieldError;
use crate::limits::Limited;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid request: {0}")]
    Invalid(#[from] FieldError),
    /// A request refused at the edge; the message names the field.
    #[error("invalid request: {0}")]
    BadRequest(String),
    #[error("invalid credentials")]
    InvalidCredentials,
    #[error("email not verified")]
    VerificationPending,
    #[error("invalid one-time code")]
    InvalidOtp,
    #[error("too many attempts")]
    TooManyAttempts { retry_after: Option<u64> },
    #[error("invalid token")]
    InvalidToken,
    #[error("rate limited")]
    RateLimited(Limited),
    #[error("overloaded")]
    Overloaded { retry_after: u64 },
    /// A dependency (the database) cannot be reached right now; the change
    /// most likely was not made. `503 UNAVAILABLE` with `Retry-After`.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The database's disk is full: nothing of the request was written.
    /// `503 STORAGE_FULL` with `Retry-After`; reads still answer.
    #[error("storage full")]
    StorageFull,
    #[error("OAuth client authentication failed")]
    InvalidClient,
    /// What the request names does not exist for the caller (the same
    /// answer whether it exists for someone else or not at all).
    #[error("no such {0}")]
    NotFound(&'static str),
    /// A valid token without the scope the call needs.
    #[error("insufficient scope: {0} needed")]
    InsufficientScope(&'static str),
    /// A right first factor of an account with a second: the login goes on
    /// at `/auth/mfa/verify` with the step up (`None` for an OAuth client's
    /// password grant, which cannot pass one).
    #[error("second factor required")]
    SecondFactorRequired(Option<Box<super::mfa::challenge::StepUp>>),
    /// A wrong second factor; the login's token survives `tries_left` more
    /// (negative: no token involved).
    #[error("second factor not accepted")]
    InvalidFactor { tries_left: i32 },
    /// The call needs an authentication at most `max_age` seconds old, with
    /// a second factor when `mfa` (RFC 9470).
    #[error("a recent authentication is needed")]
    ReauthenticationRequired { max_age: u64, mfa: bool },
    /// Account management with a token an OAuth client holds for the user.
    #[error("first-party token needed")]
    FirstPartyOnly,
    /// The right password of an account an administrator has disabled.
    #[error("account disabled")]
    AccountDisabled,
    /// The request cannot apply to the account as it is (a passkey
    /// registered already, recovery codes without a factor).
    #[error("conflict: {0}")]
    Conflict(&'static str),
    /// An account exists with this email already.
    #[error("email taken")]
    EmailTaken,
    /// A client asked for a scope it may not have.
    #[error("invalid scope")]
    InvalidScope,
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<StoreError> for AuthError {
    fn from(e: StoreError) -> Self {
        match e {
            // Counted where it happened (`store::acquire`).
            StoreError::Overloaded => AuthError::Overloaded { retry_after: 1 },
            StoreError::Unavailable(e) => AuthError::Unavailable(e.to_string()),
            StoreError::StorageFull(_) => AuthError::StorageFull,
            other => AuthError::Internal(other.into()),
        }
    }
}

impl From<Overloaded> for AuthError {
    fn from(_: Overloaded) -> Self {
        AuthError::Overloaded { retry_after: 1 }
    }
}

impl From<Limited> for AuthError {
    fn from(l: Limited) -> Self {
        AuthError::RateLimited(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_database_connection_is_unavailable_not_internal() {
        let lost = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = AuthError::from(StoreError::from(sqlx::Error::Io(lost)));
        assert!(matches!(e, AuthError::Unavailable(_)), "{e:?}");
    }
}
