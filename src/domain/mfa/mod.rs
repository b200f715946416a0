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
//! pure); WebAuthn is the webauthn-rs relying party. Whether a login needs
//! a second factor is decided inside the statement that starts its session
//! (`store::NewSession::second_factor`), so a factor confirmed while a
//! login is under way is never skipped.

pub mod challenge;
pub mod totp;

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;
use webauthn_rs::prelude::{
    CreationChallengeResponse, DiscoverableAuthentication, DiscoverableKey, Passkey, PasskeyAuthentication,
    PasskeyRegistration, PublicKeyCredential, RegisterPublicKeyCredential, RequestChallengeResponse, Url,
    Webauthn, WebauthnBuilder,
};

use super::accounts::{rfc3339, Accounts, Origin, TokenPair};
use super::input::Password;
use super::tokens::{Authn, Verified};
use super::AuthError;
use crate::clock::now_ms;
use crate::crypto::{b64url, b64url_decode, random_bytes, random_token, sha256, Sealer};
use crate::limits::{BruteForceRules, PolicyName};
use crate::settings::{secs, switch, url_text, ConfigError, Source};
use crate::store::{ChallengeRecord, Event, FactorChange, FactorRecord, UserRecord};

/// The associated data a TOTP secret is sealed under: its factor's id, so
/// that a sealed secret moved to another row does not open.
fn totp_aad(factor_id: &str) -> Vec<u8> {
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

/// The second-factor machinery of the service.
pub struct Mfa {
    webauthn: Webauthn,
    settings: MfaSettings,
    /// Seals TOTP secrets at rest (a key of its own from the master secret).
    sealer: Sealer,
    /// Seals passwordless sign-ins' ceremonies into their tokens (another).
    ceremonies: Sealer,
}

impl Mfa {
    pub fn new(settings: MfaSettings, sealer: Sealer, ceremonies: Sealer) -> anyhow::Result<Mfa> {
        let webauthn = settings.relying_party().map_err(anyhow::Error::msg)?;
        Ok(Mfa {
            webauthn,
            settings,
            sealer,
            ceremonies,
        })
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

/// The answer to a right first factor when the account has a second.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StepUp {
    /// Single use, 5 minutes, dead after 5 wrong factors.
    pub mfa_token: String,
    /// What `POST /auth/mfa/verify` accepts for this account: `totp`,
    /// `webauthn`, `recovery_code`.
    pub factors: Vec<&'static str>,
    /// With `webauthn`: the options of the assertion to make.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub webauthn: Option<serde_json::Value>,
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

/// A passwordless login's ceremony, sealed into its token.
#[derive(serde::Serialize, serde::Deserialize)]
struct LoginCeremony {
    expires_at: i64,
    state: DiscoverableAuthentication,
}

/// How much longer than its ceremony a spent one is remembered: instances
/// whose clocks disagree by less cannot both take it for unspent.
const CLAIM_MARGIN_MS: i64 = 5 * 60_000;

/// The associated data of a sealed [`LoginCeremony`]: a token sealed for
/// anything else does not open as one.
const LOGIN_CEREMONY_AAD: &[u8] = b"latchkey passkey login ceremony v1";

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

impl Accounts {
    fn recovery_hash(&self, user_id: &str, code: &str) -> [u8; 32] {
        self.code_key.mac(&[
            b"recovery",
            user_id.as_bytes(),
            normalize_recovery(code).as_bytes(),
        ])
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

    /// The step up of a login whose first factor (`authn`) was right, for
    /// an account with a second: a challenge, answered as
    /// [`AuthError::SecondFactorRequired`]. An OAuth client's password
    /// grant has no way to pass a second factor: it gets the refusal alone.
    pub(super) async fn step_up(
        &self,
        user: &UserRecord,
        authn: &Authn,
        client_id: Option<&str>,
        origin: &Origin,
    ) -> AuthError {
        if client_id.is_some() {
            return AuthError::SecondFactorRequired(None);
        }
        match self.new_login_challenge(user, authn, origin).await {
            Ok(step_up) => AuthError::SecondFactorRequired(Some(Box::new(step_up))),
            Err(e) => e,
        }
    }

    async fn new_login_challenge(
        &self,
        user: &UserRecord,
        authn: &Authn,
        origin: &Origin,
    ) -> Result<StepUp, AuthError> {
        let factors = Self::confirmed(self.store.factors(&user.id).await?);
        let mut kinds = Vec::new();
        if factors.iter().any(|f| f.kind == "totp") {
            kinds.push("totp");
        }
        let passkeys: Vec<Passkey> = factors.iter().filter_map(passkey_of).collect();
        let (webauthn, state) = if passkeys.is_empty() {
            (None, None)
        } else {
            kinds.push("webauthn");
            let (rcr, st) = self
                .mfa
                .webauthn
                .start_passkey_authentication(&passkeys)
                .map_err(|e| AuthError::Internal(anyhow::anyhow!("webauthn: {e}")))?;
            (Some(options(&rcr)?), Some(json(&st)?))
        };
        if self.store.recovery_codes_left(&user.id).await? > 0 {
            kinds.push("recovery_code");
        }
        let token = random_token();
        let now = now_ms();
        self.store
            .create_challenge(&ChallengeRecord {
                token_hash: sha256(token.as_bytes()).to_vec(),
                purpose: "login".into(),
                user_id: Some(user.id.clone()),
                amr: authn.amr.clone(),
                client_id: None,
                user_agent: origin.user_agent.clone(),
                ip: Some(origin.ip.to_string()),
                state,
                detail: None,
                failures: 0,
                created_at: now,
                expires_at: now + challenge::TTL_MS,
            })
            .await?;
        Ok(StepUp {
            mfa_token: token,
            factors: kinds,
            webauthn,
            expires_in: (challenge::TTL_MS / 1000) as u64,
        })
    }

    /// Completes a login that stepped up: the second factor against the
    /// login's challenge, under the account's brute-force rules; a right
    /// one spends the challenge and starts the session.
    pub async fn verify_second_factor(
        &self,
        origin: &Origin,
        mfa_token: &str,
        proof: Proof,
    ) -> Result<TokenPair, AuthError> {
        let (hash, c, now) = self.live_challenge(origin, mfa_token, "login").await?;
        if challenge::state(c.failures, c.expires_at, now) == challenge::State::Dead {
            return Err(AuthError::InvalidToken);
        }
        let user_id = c.user_id.clone().ok_or(AuthError::InvalidToken)?;
        let client = self.limiter.ip_key(origin.ip);
        let key = mfa_key(&user_id);
        // The address's wrong second factors over every account first, so
        // that guesses it refuses spend none of the account's allowance; not
        // for an address the account passed its second factor from before
        // (anyone with an account of their own can fill the address's count,
        // and so hold up everybody behind the same NAT or proxy but those).
        let guess = if self.brute_force.is_known(&key, client.as_str()).await {
            None
        } else {
            Some(self.factor_guess(origin.ip).await?)
        };
        let attempt = match self.brute_force.begin(&key, client.as_str()).await {
            Ok(a) => a,
            Err(retry) => {
                self.factor_guess_taken_back(guess.as_deref()).await;
                return Err(AuthError::TooManyAttempts {
                    retry_after: Some(retry),
                });
            }
        };
        let label = proof.label();
        let method = match self.judge(&user_id, &c, proof, now).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                let dead = self
                    .store
                    .challenge_failed(&hash, challenge::MAX_FAILURES)
                    .await?;
                let address = origin.ip.to_string();
                let e = Event::new("mfa.failed", now)
                    .user(&user_id)
                    .ip(Some(&address))
                    .reason(label);
                if let Err(err) = self.store.record_event(&e).await {
                    tracing::warn!(error = %err, "recording a failed second factor");
                }
                let left = dead.map_or(0, |n| (challenge::MAX_FAILURES - n).max(0));
                return Err(AuthError::InvalidFactor { tries_left: left });
            }
            Err(e) => {
                self.brute_force.abandon(&key, client.as_str(), attempt).await;
                self.factor_guess_taken_back(guess.as_deref()).await;
                return Err(e);
            }
        };
        // A right factor was no guess.
        self.factor_guess_taken_back(guess.as_deref()).await;
        // Single use: of two right answers, one session.
        if !self.store.consume_challenge(&hash).await? {
            return Err(AuthError::InvalidToken);
        }
        self.brute_force
            .success(&key, client.as_str(), attempt, true)
            .await;
        let user = self
            .store
            .user_by_id(&user_id)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        if user.email_verified_at.is_none() {
            return Err(AuthError::VerificationPending);
        }
        let amr = format!("{} {method} mfa", c.amr);
        self.start_session(&user, None, origin, Authn::new(amr.trim(), now), true)
            .await
    }

    /// Admits a second factor from `ip` under the rule of wrong second
    /// factors per client address over every account
    /// (`Rules::CODE_GUESSES`, as for emailed codes: ten free, then delays,
    /// a lock at thirty): a list of stolen passwords of accounts with
    /// factors cannot be worked through by guessing a TOTP code on each.
    /// The attempt counts as wrong until [`Self::factor_guess_taken_back`].
    async fn factor_guess(&self, ip: IpAddr) -> Result<String, AuthError> {
        let key = format!("factors:{}", self.limiter.ip_key(ip).as_str());
        self.code_guesses
            .begin(&key, &BruteForceRules::CODE_GUESSES)
            .await
            .map_err(|ms| AuthError::TooManyAttempts {
                retry_after: Some((ms.max(0) as u64).div_ceil(1000).max(1)),
            })?;
        Ok(key)
    }

    /// A factor that was right, or never judged: not a wrong guess.
    async fn factor_guess_taken_back(&self, key: Option<&str>) {
        if let Some(key) = key {
            self.code_guesses
                .abandon(key, &BruteForceRules::CODE_GUESSES)
                .await;
        }
    }

    /// A login's live challenge of `purpose` under `token`, after the
    /// address's login limit: its hash, the row, and the time it was read.
    async fn live_challenge(
        &self,
        origin: &Origin,
        token: &str,
        purpose: &str,
    ) -> Result<([u8; 32], ChallengeRecord, i64), AuthError> {
        self.limiter
            .check(PolicyName::LoginIp, self.limiter.ip_key(origin.ip).as_str())
            .await?;
        let hash = sha256(token.as_bytes());
        let now = now_ms();
        let c = self
            .store
            .challenge(&hash, purpose, now)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        Ok((hash, c, now))
    }

    /// The RFC 8176 method a right proof stands for, or `None` when wrong.
    async fn judge(
        &self,
        user_id: &str,
        c: &ChallengeRecord,
        proof: Proof,
        now: i64,
    ) -> Result<Option<&'static str>, AuthError> {
        match proof {
            Proof::Totp(code) => {
                for f in Self::confirmed(self.store.factors(user_id).await?) {
                    if f.kind != "totp" {
                        continue;
                    }
                    let Some(secret) = f
                        .secret
                        .as_deref()
                        .and_then(|s| self.mfa.sealer.open(s, &totp_aad(&f.id)))
                    else {
                        tracing::warn!(factor = %f.id, "a TOTP secret cannot be unsealed (secret key changed?)");
                        continue;
                    };
                    if let totp::Verdict::Accepted { step } = totp::check(&secret, &code, now, f.last_step) {
                        // A concurrent use of the same code loses here.
                        if self.store.use_totp_step(&f.id, step, now).await? {
                            return Ok(Some("otp"));
                        }
                    }
                }
                Ok(None)
            }
            Proof::RecoveryCode(code) => {
                let ok = self
                    .store
                    .use_recovery_code(user_id, &self.recovery_hash(user_id, &code), now)
                    .await?;
                // A look-up secret: something the user has, like an OTP device.
                Ok(ok.then_some("otp"))
            }
            Proof::WebAuthn(credential) => {
                let Ok(st) = state::<PasskeyAuthentication>(c) else {
                    return Ok(None); // the account had no passkey at login
                };
                let Ok(result) = self.mfa.webauthn.finish_passkey_authentication(&credential, &st) else {
                    return Ok(None);
                };
                let used = b64url(result.cred_id().as_ref());
                let Some(f) = self.store.passkey_by_credential(&used).await? else {
                    return Ok(None);
                };
                if f.user_id != user_id {
                    return Ok(None);
                }
                self.passkey_used(&f, &result, now).await?;
                Ok(Some(PASSKEY_METHOD))
            }
        }
    }

    async fn passkey_used(
        &self,
        f: &FactorRecord,
        result: &webauthn_rs::prelude::AuthenticationResult,
        now: i64,
    ) -> Result<(), AuthError> {
        let mut passkey = passkey_of(f)
            .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("unreadable passkey {}", f.id)))?;
        let changed = passkey.update_credential(result) == Some(true);
        let credential = if changed { Some(json(&passkey)?) } else { None };
        self.store.passkey_used(&f.id, credential.as_deref(), now).await?;
        Ok(())
    }

    /// The caller's confirmed factors.
    pub async fn factors(&self, token: &Verified) -> Result<FactorList, AuthError> {
        let user = &token.claims.sub;
        let factors = Self::confirmed(self.store.factors(user).await?);
        Ok(FactorList {
            factors: factors.iter().map(FactorInfo::from).collect(),
            recovery_codes_left: self.store.recovery_codes_left(user).await?,
        })
    }

    /// Changing factors needs a recent authentication, and a second factor
    /// in it when the account has one (else a stolen session of a password
    /// alone could replace the factor).
    async fn require_recent(&self, token: &Verified) -> Result<Vec<FactorRecord>, AuthError> {
        let factors = Self::confirmed(self.store.factors(&token.claims.sub).await?);
        let age_ms = now_ms() - token.claims.auth_time.unwrap_or(0) * 1000;
        let recent = age_ms <= self.mfa.settings.recent_auth.as_millis() as i64;
        let mfa_needed = !factors.is_empty() && !token.claims.is_mfa();
        if !recent || mfa_needed {
            return Err(AuthError::ReauthenticationRequired {
                max_age: self.mfa.settings.recent_auth.as_secs(),
                mfa: !factors.is_empty(),
            });
        }
        Ok(factors)
    }

    /// Starts a TOTP enrolment: a new secret, shown once. Adding a factor
    /// takes the current password as well as a recent login: a stolen
    /// session alone must not be able to plant a factor of its own.
    pub async fn start_totp(
        &self,
        token: &Verified,
        ip: IpAddr,
        name: &str,
        password: Password,
    ) -> Result<TotpEnrolment, AuthError> {
        self.require_recent(token).await?;
        let name = check_name(name, TOTP_NAME)?;
        let user = self.check_current_password(token, ip, Some(password)).await?;
        let secret = random_bytes::<{ totp::SECRET_BYTES }>();
        let id = format!("fac_{}", uuid::Uuid::new_v4().simple());
        self.store
            .add_pending_totp(&FactorRecord {
                id: id.clone(),
                user_id: user.id.clone(),
                kind: "totp".into(),
                name,
                secret: Some(self.mfa.sealer.seal(&secret, &totp_aad(&id))),
                last_step: None,
                credential: None,
                credential_id: None,
                passwordless: false,
                created_at: now_ms(),
                confirmed_at: None,
                last_used_at: None,
            })
            .await?;
        let uri = totp::uri(&secret, &self.mfa.settings.totp_issuer, &user.email);
        Ok(TotpEnrolment {
            id,
            secret: totp::base32(&secret),
            qr_svg: totp::qr_svg(&uri).unwrap_or_default(),
            otpauth_uri: uri,
        })
    }

    /// Confirms a TOTP enrolment with a first code from the app.
    pub async fn confirm_totp(&self, token: &Verified, id: &str, code: &str) -> Result<Enrolled, AuthError> {
        self.require_recent(token).await?;
        let user_id = &token.claims.sub;
        let mut enrolment = self
            .store
            .factors(user_id)
            .await?
            .into_iter()
            .find(|f| f.id == id && f.kind == "totp" && f.confirmed_at.is_none())
            .ok_or(AuthError::NotFound("factor"))?;
        self.limiter.check(PolicyName::PasswordAccount, user_id).await?;
        let secret = enrolment
            .secret
            .as_deref()
            .and_then(|s| self.mfa.sealer.open(s, &totp_aad(id)))
            .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("a TOTP secret cannot be unsealed")))?;
        let now = now_ms();
        let totp::Verdict::Accepted { step } = totp::check(&secret, code, now, None) else {
            return Err(AuthError::InvalidFactor { tries_left: -1 });
        };
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now,
                "An authenticator app was added to your account.",
                true,
            )
            .await?;
        let change = pending.change();
        let added = self
            .store
            .confirm_totp(id, step, &change)
            .await?
            .ok_or(AuthError::NotFound("factor"))?;
        self.factor_added(&added).await;
        // As the store now has it (no second read).
        enrolment.confirmed_at = Some(now);
        enrolment.last_used_at = Some(now);
        Ok(Enrolled {
            factor: FactorInfo::from(&enrolment),
            recovery_codes: added.recovery_codes_given.then_some(pending.codes),
        })
    }

    /// Starts registering a passkey: the options for
    /// `navigator.credentials.create()`. A passkey that may log in alone
    /// (`passwordless`) must be discoverable.
    pub async fn start_passkey(
        &self,
        token: &Verified,
        ip: IpAddr,
        name: &str,
        passwordless: bool,
        password: Password,
    ) -> Result<Ceremony, AuthError> {
        let factors = self.require_recent(token).await?;
        let name = check_name(name, PASSKEY_NAME)?;
        let user = self.check_current_password(token, ip, Some(password)).await?;
        let uid = uuid::Uuid::try_parse(&user.id).map_err(|e| AuthError::Internal(e.into()))?;
        let exclude: Vec<_> = factors
            .iter()
            .filter_map(passkey_of)
            .map(|p| p.cred_id().clone())
            .collect();
        let (ccr, st): (CreationChallengeResponse, PasskeyRegistration) = self
            .mfa
            .webauthn
            .start_passkey_registration(
                uid,
                &user.email,
                user.name.as_deref().unwrap_or(&user.email),
                Some(exclude),
            )
            .map_err(|e| AuthError::Internal(anyhow::anyhow!("webauthn: {e}")))?;
        let mut opts = options(&ccr)?;
        if passwordless {
            // Discoverable: the authenticator keeps the credential with the
            // account, so that a login can start without naming one.
            let sel = &mut opts["publicKey"]["authenticatorSelection"];
            sel["residentKey"] = "required".into();
            sel["requireResidentKey"] = true.into();
        }
        let detail = serde_json::json!({"name": name, "passwordless": passwordless}).to_string();
        self.ceremony("passkey_register", Some(&user.id), json(&st)?, Some(detail), opts)
            .await
    }

    async fn ceremony(
        &self,
        purpose: &str,
        user_id: Option<&str>,
        state: String,
        detail: Option<String>,
        options: serde_json::Value,
    ) -> Result<Ceremony, AuthError> {
        let token = random_token();
        let now = now_ms();
        self.store
            .create_challenge(&ChallengeRecord {
                token_hash: sha256(token.as_bytes()).to_vec(),
                purpose: purpose.into(),
                user_id: user_id.map(String::from),
                amr: String::new(),
                client_id: None,
                user_agent: None,
                ip: None,
                state: Some(state),
                detail,
                failures: 0,
                created_at: now,
                expires_at: now + challenge::CEREMONY_TTL_MS,
            })
            .await?;
        Ok(Ceremony {
            ceremony_token: token,
            options,
            expires_in: (challenge::CEREMONY_TTL_MS / 1000) as u64,
        })
    }

    /// Finishes registering a passkey with the authenticator's answer.
    pub async fn finish_passkey(
        &self,
        token: &Verified,
        ceremony_token: &str,
        credential: &RegisterPublicKeyCredential,
    ) -> Result<Enrolled, AuthError> {
        self.require_recent(token).await?;
        let user_id = &token.claims.sub;
        let hash = sha256(ceremony_token.as_bytes());
        let now = now_ms();
        let c = self
            .store
            .challenge(&hash, "passkey_register", now)
            .await?
            .filter(|c| c.user_id.as_deref() == Some(user_id.as_str()))
            .ok_or(AuthError::InvalidToken)?;
        if !self.store.consume_challenge(&hash).await? {
            return Err(AuthError::InvalidToken);
        }
        let st: PasskeyRegistration = state(&c)?;
        let passkey = self
            .mfa
            .webauthn
            .finish_passkey_registration(credential, &st)
            .map_err(|e| {
                tracing::info!(error = %e, "a passkey registration did not verify");
                AuthError::InvalidFactor { tries_left: -1 }
            })?;
        let detail: serde_json::Value = c
            .detail
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default();
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now,
                "A passkey was added to your account.",
                true,
            )
            .await?;
        let change = pending.change();
        let rec = FactorRecord {
            id: format!("fac_{}", uuid::Uuid::new_v4().simple()),
            user_id: user_id.clone(),
            kind: "passkey".into(),
            name: detail["name"].as_str().unwrap_or(PASSKEY_NAME).to_string(),
            secret: None,
            last_step: None,
            credential: Some(json(&passkey)?),
            credential_id: Some(b64url(passkey.cred_id().as_ref())),
            passwordless: detail["passwordless"].as_bool().unwrap_or(false),
            created_at: now,
            confirmed_at: Some(now),
            last_used_at: None,
        };
        let Some(added) = self.store.add_passkey(&rec, &change).await? else {
            return Err(AuthError::Conflict("this passkey is registered already"));
        };
        self.factor_added(&added).await;
        Ok(Enrolled {
            factor: FactorInfo::from(&rec),
            recovery_codes: added.recovery_codes_given.then_some(pending.codes),
        })
    }

    pub async fn rename_factor(
        &self,
        token: &Verified,
        id: &str,
        name: &str,
    ) -> Result<FactorInfo, AuthError> {
        let user_id = &token.claims.sub;
        let mut factor = self
            .store
            .factors(user_id)
            .await?
            .into_iter()
            .find(|f| f.id == id && f.confirmed_at.is_some())
            .ok_or(AuthError::NotFound("factor"))?;
        factor.name = check_name(name, &factor.name)?;
        if !self
            .store
            .rename_factor(id, user_id, &factor.name, now_ms())
            .await?
        {
            return Err(AuthError::NotFound("factor"));
        }
        Ok(FactorInfo::from(&factor))
    }

    /// Removes a factor (with the last one, the recovery codes go too).
    pub async fn remove_factor(&self, token: &Verified, id: &str) -> Result<(), AuthError> {
        let factors = self.require_recent(token).await?;
        if !factors.iter().any(|f| f.id == id) {
            return Err(AuthError::NotFound("factor"));
        }
        let user_id = &token.claims.sub;
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now_ms(),
                "A second factor was removed from your account.",
                false,
            )
            .await?;
        let change = pending.change();
        if !self.store.remove_factor(id, &change).await? {
            return Err(AuthError::NotFound("factor"));
        }
        self.mail_wake.notify_one();
        Ok(())
    }

    /// A new set of recovery codes; the old set stops working.
    pub async fn new_recovery_codes(&self, token: &Verified) -> Result<RecoveryCodes, AuthError> {
        self.require_recent(token).await?;
        let user_id = &token.claims.sub;
        let pending = self
            .factor_change(
                user_id,
                &token.claims.sid,
                now_ms(),
                "New recovery codes were made for your account; the old ones no longer work.",
                true,
            )
            .await?;
        let change = pending.change();
        if !self.store.new_recovery_codes(&change).await? {
            return Err(AuthError::Conflict(
                "recovery codes stand in for a second factor: add one first",
            ));
        }
        self.mail_wake.notify_one();
        Ok(RecoveryCodes {
            recovery_codes: pending.codes,
        })
    }

    /// Starts a passwordless login: options for `navigator.credentials.get()`
    /// naming no account (the authenticator offers its passkeys). Nothing
    /// is stored: the ceremony's state travels sealed in its token (AES-GCM
    /// under the master secret, with its expiry), so that calls nobody
    /// finishes cost no row; the token becomes single-use only once an
    /// assertion succeeds ([`Self::finish_passkey_login`]).
    pub async fn start_passkey_login(&self, origin: &Origin) -> Result<Ceremony, AuthError> {
        self.limiter
            .check(PolicyName::LoginIp, self.limiter.ip_key(origin.ip).as_str())
            .await?;
        let (mut rcr, st): (RequestChallengeResponse, DiscoverableAuthentication) = self
            .mfa
            .webauthn
            .start_discoverable_authentication()
            .map_err(|e| AuthError::Internal(anyhow::anyhow!("webauthn: {e}")))?;
        // A login button, not the autofill of a username field.
        rcr.mediation = None;
        let sealed = LoginCeremony {
            expires_at: now_ms() + challenge::CEREMONY_TTL_MS,
            state: st,
        };
        let bytes = serde_json::to_vec(&sealed).map_err(|e| AuthError::Internal(e.into()))?;
        Ok(Ceremony {
            ceremony_token: b64url(&self.mfa.ceremonies.seal(&bytes, LOGIN_CEREMONY_AAD)),
            options: options(&rcr)?,
            expires_in: (challenge::CEREMONY_TTL_MS / 1000) as u64,
        })
    }

    /// Finishes a passwordless login: a passkey its user let log in alone,
    /// with user verification, of an enabled and verified account. A right
    /// assertion spends the ceremony (its token's hash is stored until a
    /// while after it expires), so that it signs in once. Wrong assertions
    /// are not counted per address: forging one is not a guess anyone can
    /// make, and counting them would let anyone, with no account at all,
    /// hold up the second factors of everybody behind an address.
    pub async fn finish_passkey_login(
        &self,
        origin: &Origin,
        ceremony_token: &str,
        credential: &PublicKeyCredential,
    ) -> Result<TokenPair, AuthError> {
        self.limiter
            .check(PolicyName::LoginIp, self.limiter.ip_key(origin.ip).as_str())
            .await?;
        let now = now_ms();
        let ceremony = self.open_login_ceremony(ceremony_token, now)?;
        let refused = AuthError::InvalidFactor { tries_left: 0 };
        let Ok((uid, cred_id)) = self.mfa.webauthn.identify_discoverable_authentication(credential) else {
            return Err(refused);
        };
        let Some(f) = self.store.passkey_by_credential(&b64url(cred_id)).await? else {
            return Err(refused);
        };
        if !f.passwordless || f.user_id != uid.to_string() {
            return Err(refused);
        }
        let passkey = passkey_of(&f)
            .ok_or_else(|| AuthError::Internal(anyhow::anyhow!("unreadable passkey {}", f.id)))?;
        let Ok(result) = self.mfa.webauthn.finish_discoverable_authentication(
            credential,
            ceremony.state,
            &[DiscoverableKey::from(&passkey)],
        ) else {
            let address = origin.ip.to_string();
            let e = Event::new("mfa.failed", now)
                .user(&f.user_id)
                .ip(Some(&address))
                .reason("passkey_login");
            if let Err(err) = self.store.record_event(&e).await {
                tracing::warn!(error = %err, "recording a failed passkey login");
            }
            return Err(refused);
        };
        // One sign-in per ceremony: the first right assertion claims it.
        let hash = sha256(ceremony_token.as_bytes());
        if !self
            .store
            .claim_challenge(&hash, "passkey_login", now, ceremony.expires_at + CLAIM_MARGIN_MS)
            .await?
        {
            return Err(AuthError::InvalidToken);
        }
        self.passkey_used(&f, &result, now).await?;
        let user = self.store.user_by_id(&f.user_id).await?.ok_or(refused)?;
        if user.email_verified_at.is_none() {
            return Err(AuthError::VerificationPending);
        }
        let amr = format!("{PASSKEY_METHOD} mfa");
        self.start_session(&user, None, origin, Authn::new(&amr, now), true)
            .await
    }

    /// The state of a passwordless login's ceremony from its token, if the
    /// token is one this service sealed and has not expired.
    fn open_login_ceremony(&self, token: &str, now: i64) -> Result<LoginCeremony, AuthError> {
        let sealed = b64url_decode(token).ok_or(AuthError::InvalidToken)?;
        let bytes = self
            .mfa
            .ceremonies
            .open(&sealed, LOGIN_CEREMONY_AAD)
            .ok_or(AuthError::InvalidToken)?;
        let ceremony: LoginCeremony = serde_json::from_slice(&bytes).map_err(|_| AuthError::InvalidToken)?;
        if ceremony.expires_at <= now {
            return Err(AuthError::InvalidToken);
        }
        Ok(ceremony)
    }

    /// An administrator's reset of an account's factors (a user who lost
    /// every factor and every recovery code).
    pub async fn admin_reset_factors(&self, actor: &str, user_id: &str) -> Result<(), AuthError> {
        if uuid::Uuid::try_parse(user_id).is_err() {
            return Err(AuthError::NotFound("user"));
        }
        let Ok(pending) = self
            .factor_change(
                user_id,
                "",
                now_ms(),
                "An administrator removed every second factor of your account.",
                false,
            )
            .await
        else {
            return Err(AuthError::NotFound("user"));
        };
        let change = pending.change();
        if self.store.reset_factors(actor, &change).await? {
            self.mail_wake.notify_one();
        }
        Ok(())
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
            .store
            .user_by_id(user_id)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        let notice = crate::mail::Message::factors_changed(&user.email, what).seal(&self.outbox_sealer);
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
        self.revocations.revoke(&added.ended_sessions).await;
        self.mail_wake.notify_one();
    }

    /// Drops expired challenges and TOTP enrolments never confirmed.
    pub async fn purge_mfa(&self) -> Result<u64, AuthError> {
        let now = now_ms();
        Ok(self.store.purge_challenges(now, now - PENDING_TOTP_MS).await?)
    }
}

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
