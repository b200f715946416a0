//! Second factors: TOTP authenticators, passkeys (WebAuthn) and recovery
//! codes; the login that steps up to them; passwordless login with a
//! passkey; and their management by the user and by administrators.
//!
//! ```text
//!  POST /auth/login (right password)
//!     account without a factor ------------------------> session, amr [pwd]
//!     account with a factor --> 401 MFA_REQUIRED {mfa_token, factors, webauthn?}
//!                                   |
//!  POST /auth/mfa/verify {mfa_token, code | recovery_code | webauthn}
//!     right factor ------------------------------------> session, amr [pwd otp|swk mfa]
//!     wrong factor --> 401 INVALID_FACTOR (the token dies after 5; docs/mfa.md)
//!
//!  POST /auth/passkeys/login + /finish (a passkey the user let log in alone,
//!     user verification required) -----------------------> session, amr [swk mfa]
//! ```
//!
//! The rules of the `mfa_token` are `challenge.rs`, TOTP's `totp.rs` (both
//! pure); WebAuthn is the webauthn-rs relying party. The login's second
//! step is `step.rs` (the session itself is started by `login.rs`), the
//! management of factors `manage.rs`. Whether a login needs
//! a second factor is decided inside the statement that starts its session
//! (`store::NewSession::second_factor`), so a factor confirmed while a
//! login is under way is never skipped.

pub mod challenge;
mod manage;
mod step;
pub mod totp;

pub use challenge::StepUp;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use webauthn_rs::prelude::{Passkey, PublicKeyCredential, Url, Webauthn, WebauthnBuilder};

use super::passwords::Passwords;
use super::shared::Shared;
use super::AuthError;
use crate::clock::{now_ms, rfc3339};
use crate::crypto::{random_bytes, Sealer};
use crate::settings::{secs, switch, url_text, ConfigError, Source};
use crate::store::{ChallengeRecord, FactorChange, FactorRecord, UserRecord};

/// The associated data a TOTP secret is sealed under: its factor's id, so
/// that a sealed secret moved to another row does not open.
/// The associated data of a sealed TOTP secret: its factor.
pub fn totp_aad(factor_id: &str) -> Vec<u8> {
    format!("latchkey/totp-secret/{factor_id}").into_bytes()
}
/// Recovery codes in a set, and their shape: 10 characters of a 32-letter
/// alphabet (50 bits) shown as two groups of five.
pub const RECOVERY_CODES: usize = 10;
/// Crockford's base32 alphabet: no i, l, o or u to misread.
const RECOVERY_ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
/// The longest name a factor may have.
pub const MAX_NAME: usize = 64;
/// The names of factors given none.
const TOTP_NAME: &str = "Authenticator app";
const PASSKEY_NAME: &str = "Passkey";
/// TOTP enrolments never confirmed are dropped after this long.
const PENDING_TOTP_MS: i64 = 15 * 60_000;

/// The relying party of WebAuthn, TOTP's issuer name, and what counts as
/// a recent authentication (settings `webauthn_*`, `totp_issuer`,
/// `mfa_recent_auth_secs`).
#[derive(Clone, Debug)]
pub struct MfaSettings {
    /// The WebAuthn relying party id: the site's domain (default: the
    /// issuer's host).
    pub rp_id: String,
    /// The origin the browser reports (default: the issuer's origin).
    pub origin: String,
    /// Accept that origin on any port (development on localhost).
    pub allow_any_port: bool,
    /// The name authenticator apps show for the account.
    pub totp_issuer: String,
    /// Changing factors needs an authentication at most this old.
    pub recent_auth: Duration,
}

impl MfaSettings {
    pub fn read(src: &impl Source, issuer: &str) -> Result<MfaSettings, ConfigError> {
        // The issuer's site by default. An address is no relying party id
        // (WebAuthn wants a domain): an issuer at an address, the default
        // `http://127.0.0.1:8080` included, gives `localhost` on its port.
        let mut site = Url::parse(issuer).unwrap_or_else(|_| Url::parse("http://localhost").expect("a URL"));
        if !matches!(site.host(), Some(url::Host::Domain(_))) {
            let _ = site.set_host(Some("localhost"));
        }
        let default_origin = site.origin().ascii_serialization();
        let default_rp = site.host_str().unwrap_or("localhost").to_string();
        let settings = MfaSettings {
            rp_id: src.get("webauthn_rp_id", default_rp, crate::settings::non_empty)?,
            origin: src.get("webauthn_origin", default_origin, url_text)?,
            allow_any_port: src.get("webauthn_allow_any_port", false, switch)?,
            totp_issuer: src.get("totp_issuer", "latchkey".to_string(), crate::settings::non_empty)?,
            recent_auth: src.get("mfa_recent_auth_secs", Duration::from_secs(900), secs(60, 86_400))?,
        };
        settings
            .relying_party()
            .map_err(|m| ConfigError::new("LATCHKEY_WEBAUTHN_ORIGIN", m))?;
        Ok(settings)
    }

    fn relying_party(&self) -> Result<Webauthn, String> {
        let origin = Url::parse(&self.origin).map_err(|e| format!("not a URL: {e}"))?;
        WebauthnBuilder::new(&self.rp_id, &origin)
            .and_then(|b| {
                b.rp_name(&self.totp_issuer)
                    .allow_any_port(self.allow_any_port)
                    .build()
            })
            .map_err(|e| {
                format!(
                    "the WebAuthn relying party {} cannot serve the origin {}: {e}",
                    self.rp_id, self.origin
                )
            })
    }
}

/// The second factors service: enrolment and management (`manage.rs`),
/// the login's step up and passwordless sign-in (`step.rs`).
pub struct SecondFactors {
    shared: Arc<Shared>,
    /// The current password, asked before a factor is added.
    passwords: Arc<Passwords>,
    webauthn: Webauthn,
    settings: MfaSettings,
    /// Seals TOTP secrets at rest (a key of its own from the master secret).
    sealer: Sealer,
    /// Seals passwordless sign-ins' ceremonies into their tokens (another).
    ceremonies: Sealer,
}

impl SecondFactors {
    pub fn new(
        shared: Arc<Shared>,
        passwords: Arc<Passwords>,
        settings: MfaSettings,
        sealer: Sealer,
        ceremonies: Sealer,
    ) -> anyhow::Result<SecondFactors> {
        let webauthn = settings.relying_party().map_err(anyhow::Error::msg)?;
        Ok(SecondFactors {
            shared,
            passwords,
            webauthn,
            settings,
            sealer,
            ceremonies,
        })
    }

    fn recovery_hash(&self, user_id: &str, code: &str) -> [u8; 32] {
        self.shared.code_key.mac(&[
            b"recovery",
            user_id.as_bytes(),
            normalize_recovery(code).as_bytes(),
        ])
    }

    /// [`Self::recovery_hash`] under the code key of each master secret
    /// held, the current one first.
    fn recovery_hashes(&self, user_id: &str, code: &str) -> Vec<[u8; 32]> {
        let code = normalize_recovery(code);
        self.shared
            .code_key
            .macs(&[b"recovery", user_id.as_bytes(), code.as_bytes()])
            .collect()
    }

    /// A new set of recovery codes and their hashes.
    fn recovery_set(&self, user_id: &str) -> (Vec<String>, Vec<[u8; 32]>) {
        let codes: Vec<String> = (0..RECOVERY_CODES).map(|_| new_recovery_code()).collect();
        let hashes = codes.iter().map(|c| self.recovery_hash(user_id, c)).collect();
        (codes, hashes)
    }

    fn confirmed(factors: Vec<FactorRecord>) -> Vec<FactorRecord> {
        factors.into_iter().filter(|f| f.confirmed_at.is_some()).collect()
    }

    /// What a change of `user_id`'s factors takes to the store: the
    /// account, the notice mailed to it (`what` happened), and with
    /// `recovery_codes` a new set of them.
    async fn factor_change(
        &self,
        user_id: &str,
        session_id: &str,
        now: i64,
        what: &str,
        recovery_codes: bool,
    ) -> Result<PendingChange, AuthError> {
        let user = self
            .shared
            .store
            .user_by_id(user_id)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        let notice =
            crate::mail::Message::factors_changed(&user.email, what).seal(&self.shared.outbox.sealer);
        let (codes, hashes) = if recovery_codes {
            self.recovery_set(user_id)
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(PendingChange {
            user,
            notice,
            now,
            session_id: session_id.to_string(),
            codes,
            hashes,
        })
    }

    /// What follows a committed addition: the other sessions it ended are
    /// refused everywhere, and the notice goes out.
    async fn factor_added(&self, added: &crate::store::FactorAdded) {
        self.shared.revocations.revoke(&added.ended_sessions).await;
        self.shared.outbox.wake();
    }

    /// Drops expired challenges and TOTP enrolments never confirmed.
    pub async fn purge(&self) -> Result<u64, AuthError> {
        let now = now_ms();
        Ok(self
            .shared
            .store
            .purge_challenges(now, now - PENDING_TOTP_MS)
            .await?)
    }
}

/// A change of factors about to be stored, with what it owns: the store's
/// [`FactorChange`] borrows from it.
struct PendingChange {
    user: UserRecord,
    notice: Vec<u8>,
    now: i64,
    session_id: String,
    /// Recovery codes to show if the store keeps them, and their hashes.
    codes: Vec<String>,
    hashes: Vec<[u8; 32]>,
}

impl PendingChange {
    fn change(&self) -> FactorChange<'_> {
        FactorChange {
            user_id: &self.user.id,
            email: &self.user.email,
            notice: &self.notice,
            now: self.now,
            session_id: &self.session_id,
            recovery: &self.hashes,
        }
    }
}

/// A factor as its user sees it (no secret, no credential).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FactorInfo {
    pub id: String,
    /// `totp` or `passkey`.
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    /// A passkey that may log in without the password.
    pub passwordless: bool,
    /// RFC 3339 times, UTC.
    pub created_at: String,
    pub last_used_at: Option<String>,
}

impl From<&FactorRecord> for FactorInfo {
    fn from(f: &FactorRecord) -> Self {
        FactorInfo {
            id: f.id.clone(),
            kind: f.kind.clone(),
            name: f.name.clone(),
            passwordless: f.passwordless,
            created_at: rfc3339(f.created_at),
            last_used_at: f.last_used_at.map(rfc3339),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FactorList {
    /// Confirmed factors, oldest first.
    pub factors: Vec<FactorInfo>,
    /// Recovery codes not used yet.
    pub recovery_codes_left: i64,
}

/// A TOTP enrolment: shown once, confirmed by a first code.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TotpEnrolment {
    /// The factor id, for `POST /auth/mfa/totp/{id}/confirm`.
    pub id: String,
    /// The secret in base32, for typing into an authenticator app.
    pub secret: String,
    /// `otpauth://totp/...`, what the QR code holds.
    pub otpauth_uri: String,
    /// The URI as a QR code, an SVG document.
    pub qr_svg: String,
}

/// A factor just added, and the recovery codes when it was the first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Enrolled {
    pub factor: FactorInfo,
    /// Shown only now: 10 single-use codes, for when no factor is at hand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_codes: Option<Vec<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RecoveryCodes {
    /// Shown only now; the previous set no longer works.
    pub recovery_codes: Vec<String>,
}

/// A WebAuthn ceremony under way: its options for
/// `navigator.credentials.create()`/`.get()`, and the token that finishes it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Ceremony {
    pub ceremony_token: String,
    /// `{"publicKey": {...}}` with binary fields in base64url.
    #[schema(value_type = Object)]
    pub options: serde_json::Value,
    pub expires_in: u64,
}

/// What a user offers as the second factor.
pub enum Proof {
    Totp(String),
    RecoveryCode(String),
    WebAuthn(Box<PublicKeyCredential>),
}

impl Proof {
    fn label(&self) -> &'static str {
        match self {
            Proof::Totp(_) => "totp",
            Proof::RecoveryCode(_) => "recovery_code",
            Proof::WebAuthn(_) => "webauthn",
        }
    }
}

/// The brute-force key of an account's second factor (kept apart from the
/// password's, which is keyed by email).
fn mfa_key(user_id: &str) -> String {
    format!("mfa:{user_id}")
}

fn json<T: Serialize>(v: &T) -> Result<String, AuthError> {
    serde_json::to_string(v).map_err(|e| AuthError::Internal(e.into()))
}

fn options<T: Serialize>(v: &T) -> Result<serde_json::Value, AuthError> {
    serde_json::to_value(v).map_err(|e| AuthError::Internal(e.into()))
}

fn state<T: serde::de::DeserializeOwned>(c: &ChallengeRecord) -> Result<T, AuthError> {
    let s = c.state.as_deref().ok_or(AuthError::InvalidToken)?;
    serde_json::from_str(s).map_err(|e| AuthError::Internal(e.into()))
}

fn passkey_of(f: &FactorRecord) -> Option<Passkey> {
    serde_json::from_str(f.credential.as_deref()?).ok()
}

/// A factor's name: at most 64 characters, none that a display name may
/// not hold either (`input::refused_in_name`); trimmed, and `default` when
/// nothing is left.
pub fn check_name(name: &str, default: &str) -> Result<String, AuthError> {
    if name.chars().count() > MAX_NAME || name.chars().any(super::input::refused_in_name) {
        return Err(AuthError::BadRequest(format!(
            "name: at most {MAX_NAME} characters, no control, invisible or direction-changing ones"
        )));
    }
    let n = name.trim();
    Ok(if n.is_empty() { default } else { n }.to_string())
}

/// A recovery code as typed: case, spaces and dashes do not matter.
fn normalize_recovery(code: &str) -> String {
    code.chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn new_recovery_code() -> String {
    let bytes = random_bytes::<10>();
    let s: String = bytes
        .iter()
        .map(|b| RECOVERY_ALPHABET[(b & 31) as usize] as char)
        .collect();
    format!("{}-{}", &s[..5], &s[5..])
}

/// The RFC 8176 method of a passkey: `swk`, proof of possession of a key.
/// `hwk` means a *hardware-secured* key, which only a verified attestation
/// can show (the authenticator's certificate chain to a vendor's root, as
/// the FIDO Metadata Service publishes them). latchkey registers passkeys
/// with `none` attestation, and a key that is not backup eligible may still
/// live in software (a browser's virtual authenticator, a password manager
/// that does not sync), so it never claims `hwk`.
const PASSKEY_METHOD: &str = "swk";

/// Gives accounts a confirmed authenticator app with one shared secret:
/// `latchkey users seed --totp-secret`, for the two-step login scenario of
/// the load tests (a lab, never a real deployment). Returns how many.
pub async fn seed_totp<'a>(
    store: &crate::store::Store,
    sealer: &Sealer,
    users: impl Iterator<Item = &'a str>,
    secret: &[u8],
    now: i64,
) -> anyhow::Result<u64> {
    let mut n = 0;
    for user_id in users {
        let id = format!("fac_{}", uuid::Uuid::new_v4().simple());
        let f = FactorRecord {
            secret: Some(sealer.seal(secret, &totp_aad(&id))),
            id,
            user_id: user_id.to_string(),
            kind: "totp".into(),
            name: TOTP_NAME.into(),
            // The step before any code a load test sends: nothing is replayed.
            last_step: Some(totp::step_of(now) - 2),
            credential: None,
            credential_id: None,
            passwordless: false,
            created_at: now,
            confirmed_at: Some(now),
            last_used_at: None,
        };
        store.seed_factor(&f).await?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_codes_are_two_groups_of_five_and_typed_loosely() {
        let c = new_recovery_code();
        assert_eq!(c.len(), 11);
        assert_eq!(&c[5..6], "-");
        assert!(c
            .bytes()
            .filter(|b| *b != b'-')
            .all(|b| RECOVERY_ALPHABET.contains(&b)));
        assert_ne!(c, new_recovery_code());
        assert_eq!(normalize_recovery(" ABCDE-fghjk "), "abcdefghjk");
        assert_eq!(normalize_recovery("abcde fghjk"), "abcdefghjk");
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name("  My phone ", "x").unwrap(), "My phone");
        assert_eq!(check_name("  ", "Passkey").unwrap(), "Passkey");
        for bad in ["a\nb", "\u{85}", "admin\u{202E}", "a\u{200B}b", &"x".repeat(65)] {
            assert!(check_name(bad, "x").is_err(), "{bad:?}");
        }
    }
}
