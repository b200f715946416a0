//! Accounts brought from another system: one JSON object per account, from
//! a line of an import file (`latchkey users import FILE`) or the body of
//! `POST /admin/users`. A password comes as a hash of the old system
//! (`legacy.rs` lists the formats) and is rehashed to argon2id at the
//! account's first successful login; the admin API also takes a plain
//! password, hashed at once.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::input::{parse_name, Email, Password};
use super::legacy::{from_keycloak, Legacy};
use crate::cache::Revocations;
use crate::clock::{now_ms, parse_rfc3339};
use crate::crypto::{b64url, b64url_decode, Sealer};
use crate::store::{FactorRecord, Store};

use super::AuthError;
pub use crate::store::{ImportOutcome, ImportedUser};

/// A Keycloak credential as its realm export writes it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeycloakCredential {
    /// `{"hashIterations":27500,"algorithm":"pbkdf2-sha256"}`, or that as a string.
    #[schema(value_type = Object)]
    pub credential_data: serde_json::Value,
    /// `{"value":"<base64 hash>","salt":"<base64 salt>"}`, or that as a string.
    #[schema(value_type = Object)]
    pub secret_data: serde_json::Value,
}

/// One account to import.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportRecord {
    pub email: String,
    #[serde(default)]
    pub name: Option<String>,
    /// Whether the email address is known to be the user's (default false:
    /// the user verifies it with a code before the first login).
    #[serde(default)]
    pub verified: bool,
    /// A hash of the old system (bcrypt, PBKDF2, scrypt, argon2).
    #[serde(default)]
    pub password_hash: Option<String>,
    /// Or a Keycloak credential.
    #[serde(default)]
    pub keycloak: Option<KeycloakCredential>,
    /// Or, through the admin API only, the password itself.
    #[serde(default)]
    pub password: Option<String>,
    /// Or none: the account has no password yet (an export of latchkey's:
    /// a sign-up whose address was contested); the user sets one with a
    /// reset.
    #[serde(default)]
    pub no_password: bool,
    /// Disabled in the system it comes from (an export of latchkey's): it
    /// is disabled here too. An import never enables an account, `--update`
    /// included: a file without this field leaves a disabled one disabled.
    #[serde(default)]
    pub disabled: bool,
    /// When the account was created in the old system (RFC 3339, UTC).
    #[serde(default)]
    pub created_at: Option<String>,
}

/// An account checked and ready to store, but for a plain password still to hash.
pub struct Checked {
    pub user: ImportedUser,
    pub plain: Option<Password>,
}

impl ImportRecord {
    /// Checks every field; the error names the field and says why.
    pub fn check(self, plain_allowed: bool, now: i64) -> Result<Checked, String> {
        let email = Email::parse("email", &self.email).map_err(|e| e.to_string())?;
        let name = parse_name("name", self.name.as_deref()).map_err(|e| e.to_string())?;
        let given = [
            self.password_hash.is_some(),
            self.keycloak.is_some(),
            self.password.is_some(),
            self.no_password,
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err("give exactly one of password_hash, keycloak, password and no_password".into());
        }
        let (hash, plain) = if self.no_password {
            (crate::store::UNUSABLE_PASSWORD.to_string(), None)
        } else if let Some(h) = self.password_hash {
            Legacy::parse(&h).map_err(|e| format!("password_hash: {e}"))?;
            (h, None)
        } else if let Some(k) = self.keycloak {
            let h =
                from_keycloak(&k.credential_data, &k.secret_data).map_err(|e| format!("keycloak: {e}"))?;
            (h, None)
        } else {
            if !plain_allowed {
                return Err("password: an import file takes hashes, not passwords".into());
            }
            let p = Password::parse("password", self.password.as_deref().unwrap_or_default())
                .map_err(|e| e.to_string())?;
            (String::new(), Some(p))
        };
        let created_at = match self.created_at.as_deref() {
            Some(t) => parse_rfc3339(t).ok_or("created_at: expected an RFC 3339 time in UTC")?,
            None => now,
        };
        Ok(Checked {
            user: ImportedUser {
                id: uuid::Uuid::now_v7().to_string(),
                email: email.as_str().to_string(),
                name,
                password_hash: hash,
                verified_at: self.verified.then_some(now),
                created_at,
                disabled: self.disabled,
                factors: Vec::new(),
                recovery_codes: Vec::new(),
            },
            plain,
        })
    }
}

/// The first line of an export: what follows is version 3 of latchkey's
/// records: accounts (the import's, with `no_password` and `disabled`, and
/// their second factors: [`AccountLine`]), OAuth clients and webhooks
/// ([`Configured`]). Version 2 had no factors; version 1 accounts only. A
/// build that reads version 2 refuses a version 3 file by name, rather
/// than bring its accounts in without their factors.
pub const EXPORT_HEADER: &str = r#"{"format":"latchkey-users","version":3}"#;

/// The version of an export whose first line `line` is (`None`: not an
/// export's first line; `Err`: of a version this build cannot read).
pub fn export_version(line: &str) -> Result<Option<i64>, String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return Ok(None);
    };
    if v.get("format").and_then(|f| f.as_str()) != Some("latchkey-users") {
        return Ok(None);
    }
    match v.get("version").and_then(|n| n.as_i64()) {
        Some(n @ 1..=3) => Ok(Some(n)),
        other => Err(format!(
            "an export of version {other:?}: this latchkey reads versions 1 to 3"
        )),
    }
}

/// A second factor in an export (version 3). An authenticator app's
/// secret stays sealed under the master secret, bound to the factor's id
/// (so the id comes with it); a passkey's credential is its public key and
/// counter, bound to the relying party (`webauthn_rp_id`) it was made for.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportedFactor {
    pub id: String,
    /// `totp` or `passkey`.
    pub kind: String,
    pub name: String,
    pub created_at: String,
    pub confirmed_at: String,
    /// TOTP: the newest time step accepted (a code is never taken twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<i64>,
    /// TOTP: the secret, sealed (base64url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_secret: Option<String>,
    /// Passkey: the credential as the service keeps it (JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Passkey: its id (base64url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    /// Passkey: it signs in without the password.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passwordless: bool,
}

impl ExportedFactor {
    fn of(f: &FactorRecord) -> ExportedFactor {
        use crate::clock::rfc3339;
        ExportedFactor {
            id: f.id.clone(),
            kind: f.kind.clone(),
            name: f.name.clone(),
            created_at: rfc3339(f.created_at),
            confirmed_at: rfc3339(f.confirmed_at.unwrap_or(f.created_at)),
            last_step: f.last_step,
            sealed_secret: f.secret.as_deref().map(b64url),
            credential: f.credential.clone(),
            credential_id: f.credential_id.clone(),
            passwordless: f.passwordless,
        }
    }

    /// The factor to store, once each field is checked and a TOTP secret
    /// opens under `sealer` (sealed again under the current master secret
    /// if an older one of its keyring sealed it).
    fn check(self, sealer: &Sealer) -> Result<FactorRecord, String> {
        use crate::crypto::Resealed;
        let time = |field: &str, t: &str| {
            parse_rfc3339(t).ok_or_else(|| format!("factors: {field}: expected an RFC 3339 time in UTC"))
        };
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok {
            return Err("factors: id: 1 to 64 of A-Z, a-z, 0-9, - and _".into());
        }
        let name = parse_name("factors: name", Some(&self.name))
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let mut f = FactorRecord {
            id: self.id,
            user_id: String::new(),
            kind: self.kind,
            name,
            secret: None,
            last_step: None,
            credential: None,
            credential_id: None,
            passwordless: false,
            created_at: time("created_at", &self.created_at)?,
            confirmed_at: Some(time("confirmed_at", &self.confirmed_at)?),
            last_used_at: None,
        };
        match f.kind.as_str() {
            "totp" => {
                let sealed = self
                    .sealed_secret
                    .as_deref()
                    .and_then(b64url_decode)
                    .ok_or("factors: sealed_secret: base64url, for a totp factor")?;
                f.secret = match sealer.reseal(&sealed, &crate::domain::mfa::totp_aad(&f.id)) {
                    Resealed::Current => Some(sealed),
                    Resealed::Now(again) => Some(again),
                    Resealed::Unopenable => {
                        return Err(format!(
                            "factors: the authenticator app {:?} was sealed under another master secret: \
                             import under the secret of the export, or export --without-factors",
                            f.name
                        ))
                    }
                };
                f.last_step = self.last_step;
            }
            "passkey" => {
                let credential = self
                    .credential
                    .ok_or("factors: credential: JSON, for a passkey")?;
                let passkey: webauthn_rs::prelude::Passkey = serde_json::from_str(&credential)
                    .map_err(|_| "factors: credential: not a passkey's credential".to_string())?;
                let id = b64url(passkey.cred_id().as_ref());
                if self.credential_id.as_deref() != Some(id.as_str()) {
                    return Err("factors: credential_id: not the id of its credential".into());
                }
                f.credential = Some(credential);
                f.credential_id = Some(id);
                f.passwordless = self.passwordless;
            }
            _ => return Err("factors: kind: totp or passkey".into()),
        }
        Ok(f)
    }
}

/// The most factors, and recovery codes, one account line may carry.
const MAX_FACTORS: usize = 20;

/// An account line of an export: an [`ImportRecord`], and (version 3) its
/// second factors and unused recovery codes (their keyed hashes, good under
/// the master secret of the export only). Only `latchkey users import`
/// takes these: the admin API's records are [`ImportRecord`]s.
pub struct AccountLine {
    pub record: ImportRecord,
    /// The account's id there (the `sub` of its tokens), kept here when it
    /// is free: recovery codes are keyed to it.
    pub id: Option<String>,
    pub factors: Vec<ExportedFactor>,
    pub recovery_codes: Vec<String>,
}

impl AccountLine {
    pub fn parse(line: &str) -> Result<AccountLine, String> {
        let not_account = |e: serde_json::Error| format!("not an account object: {e}");
        let mut fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(line).map_err(not_account)?;
        let id = match fields.remove("id") {
            None => None,
            Some(serde_json::Value::String(s))
                if uuid::Uuid::try_parse(&s).is_ok_and(|u| u.to_string() == s) =>
            {
                Some(s)
            }
            Some(_) => return Err("id: a UUID in its lower-case hyphenated form".into()),
        };
        let mut take = |key: &str| fields.remove(key).unwrap_or(serde_json::Value::Array(Vec::new()));
        let factors = serde_json::from_value(take("factors")).map_err(|e| format!("factors: {e}"))?;
        let recovery_codes =
            serde_json::from_value(take("recovery_codes")).map_err(|e| format!("recovery_codes: {e}"))?;
        let record = serde_json::from_value(serde_json::Value::Object(fields)).map_err(not_account)?;
        Ok(AccountLine {
            record,
            id,
            factors,
            recovery_codes,
        })
    }

    /// [`ImportRecord::check`] (hashes only), then the factors. An account
    /// never comes in without a factor it left with: one that does not
    /// check refuses the account.
    pub fn check(self, now: i64, sealer: &Sealer) -> Result<Checked, String> {
        use std::collections::HashSet;
        let mut checked = self.record.check(false, now)?;
        if self.factors.len() > MAX_FACTORS || self.recovery_codes.len() > MAX_FACTORS {
            return Err(format!("factors, recovery_codes: at most {MAX_FACTORS} each"));
        }
        if !self.recovery_codes.is_empty() && self.id.is_none() {
            return Err("recovery_codes: only with the account's id, which they are keyed to".into());
        }
        if let Some(id) = self.id {
            checked.user.id = id;
        }
        let mut seen = HashSet::new();
        let mut factors: Vec<FactorRecord> = Vec::with_capacity(self.factors.len());
        for f in self.factors {
            let f = f.check(sealer)?;
            let passkey = f.credential_id.as_ref().map(|c| format!("passkey {c}"));
            for key in std::iter::once(f.id.clone()).chain(passkey) {
                if !seen.insert(key.clone()) {
                    return Err(format!("factors: {key} twice"));
                }
            }
            factors.push(f);
        }
        checked.user.factors = factors;
        let codes: Vec<Vec<u8>> = self
            .recovery_codes
            .iter()
            .map(|c| b64url_decode(c).filter(|h| h.len() == 32))
            .collect::<Option<_>>()
            .ok_or("recovery_codes: each the base64url of a 32-byte hash")?;
        let distinct: HashSet<&Vec<u8>> = codes.iter().collect();
        if distinct.len() != codes.len() {
            return Err("recovery_codes: a code twice".into());
        }
        checked.user.recovery_codes = codes;
        Ok(checked)
    }
}

/// A line of an export that is not an account (version 2): what the
/// deployment was configured with, as it was there.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Configured {
    Client(ExportedClient),
    Webhook(ExportedWebhook),
}

/// An OAuth client: its secret only as the SHA-256 the deployment keeps
/// (the client keeps its secret), its settings as the admin API shows them.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportedClient {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Hex.
    pub secret_sha256: String,
    /// Space-separated; empty: none.
    #[serde(default)]
    pub scopes: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<serde_json::Value>,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// An audit webhook, its signing secret sealed under the master secret of
/// the deployment it comes from: it imports only where the same secret is
/// configured (a client's back-channel logout URI comes with its client).
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportedWebhook {
    pub id: String,
    pub url: String,
    /// Base64url.
    pub sealed_secret: String,
    /// Space-separated kinds or families; empty: every event.
    #[serde(default)]
    pub kinds: String,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// Whether an export's line is a [`Configured`] record rather than an
/// account: an object whose first key is `client` or `webhook` (as the
/// export writes them).
pub fn is_configured(line: &str) -> bool {
    let rest = line.trim_start();
    let Some(rest) = rest.strip_prefix('{') else {
        return false;
    };
    let rest = rest.trim_start();
    rest.starts_with("\"client\"") || rest.starts_with("\"webhook\"")
}

impl Configured {
    /// What it is, for the import's list: the kind, the id, and what gives
    /// it power (a client's scopes, a webhook's address).
    pub fn describe(&self) -> String {
        // Escaped: a file's text must not drive the operator's terminal.
        let e = |t: &str| t.escape_debug().to_string();
        match self {
            Configured::Client(c) if c.scopes.is_empty() => format!("client {}", e(&c.id)),
            Configured::Client(c) => format!(
                "client {} with the scopes {} (its own tokens)",
                e(&c.id),
                e(&c.scopes)
            ),
            Configured::Webhook(w) => format!("webhook {} to {}", e(&w.id), e(&w.url)),
        }
    }

    /// The record of `c` (`Err`: its stored settings are not JSON).
    pub fn client(c: &crate::store::ClientRecord) -> anyhow::Result<Configured> {
        let oidc = match c.oidc.as_deref() {
            Some(j) => Some(
                serde_json::from_str(j)
                    .map_err(|e| anyhow::anyhow!("client {}: its stored settings are not JSON: {e}", c.id))?,
            ),
            None => None,
        };
        Ok(Configured::Client(ExportedClient {
            id: c.id.clone(),
            name: c.name.clone(),
            secret_sha256: crate::crypto::hex(&c.secret_hash),
            scopes: c.scopes.clone(),
            oidc,
            created_at: crate::clock::rfc3339(c.created_at),
        }))
    }

    /// The record of the audit webhook `w`.
    pub fn webhook(w: &crate::store::WebhookRecord) -> Configured {
        Configured::Webhook(ExportedWebhook {
            id: w.id.clone(),
            url: w.url.clone(),
            sealed_secret: crate::crypto::b64url(&w.secret),
            kinds: w.kinds.clone(),
            created_at: crate::clock::rfc3339(w.created_at),
        })
    }
}

/// What importing a [`Configured`] record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfiguredOutcome {
    Added,
    /// Its id is taken here: left as it is.
    Kept,
}

/// Adds an exported client or webhook (`latchkey users import`), checked
/// as a new one would be (`Clients::import`, `Webhooks::import`).
pub async fn import_configured(
    features: &super::Features,
    record: Configured,
    actor: &str,
) -> Result<ConfiguredOutcome, AuthError> {
    let created = |t: &str| {
        parse_rfc3339(t)
            .ok_or_else(|| AuthError::BadRequest("created_at: expected an RFC 3339 time in UTC".into()))
    };
    let added = match record {
        Configured::Client(c) => {
            let secret_hash = crate::crypto::hex_decode(&c.secret_sha256)
                .filter(|h| h.len() == 32)
                .ok_or_else(|| AuthError::BadRequest("secret_sha256: 64 hex digits".into()))?;
            let name = parse_name("name", c.name.as_deref())
                .map_err(|e| AuthError::BadRequest(format!("name: {}", e.reason)))?;
            let rec = crate::store::ClientRecord {
                id: c.id,
                secret_hash,
                name,
                created_at: created(&c.created_at)?,
                scopes: c.scopes,
                oidc: c.oidc.map(|v| v.to_string()),
            };
            features.clients.import(rec).await?
        }
        Configured::Webhook(w) => {
            let secret = crate::crypto::b64url_decode(&w.sealed_secret)
                .ok_or_else(|| AuthError::BadRequest("sealed_secret: base64url".into()))?;
            let rec = crate::store::WebhookRecord {
                id: w.id,
                url: w.url,
                secret,
                kinds: w.kinds,
                created_at: created(&w.created_at)?,
                client_id: None,
            };
            features.webhooks.import(actor, rec).await?
        }
    };
    Ok(if added {
        ConfiguredOutcome::Added
    } else {
        ConfiguredOutcome::Kept
    })
}

/// Writes the OAuth clients, the audit webhooks and every account of
/// `store` to `out` as JSON lines (`latchkey users export`):
/// [`EXPORT_HEADER`], a [`Configured`] record per client and webhook, then
/// one record per account in the form `latchkey users import` reads back
/// (password hashes as they are stored: argon2id, or an imported system's
/// hash not yet replaced), with its second factors and unused recovery
/// codes unless `with_factors` is false ([`AccountLine`]). Sessions and
/// consents are not in it (docs/import.md). Returns how many accounts were
/// written.
pub async fn export(store: &Store, out: &mut impl std::io::Write, with_factors: bool) -> anyhow::Result<u64> {
    writeln!(out, "{EXPORT_HEADER}")?;
    for c in store.clients().await? {
        writeln!(out, "{}", serde_json::to_string(&Configured::client(&c)?)?)?;
    }
    for w in store.webhooks().await?.iter().filter(|w| w.client_id.is_none()) {
        writeln!(out, "{}", serde_json::to_string(&Configured::webhook(w))?)?;
    }
    let mut filter = crate::store::UserFilter::default();
    let mut n = 0;
    loop {
        let page = store.users_page(&filter, 500).await?;
        let (found, found_codes) = match (with_factors, page.first(), page.last()) {
            (true, Some(first), Some(last)) => store.factors_of_accounts(&first.id, &last.id).await?,
            _ => Default::default(),
        };
        let mut factors: HashMap<String, Vec<ExportedFactor>> = HashMap::new();
        for f in &found {
            factors
                .entry(f.user_id.clone())
                .or_default()
                .push(ExportedFactor::of(f));
        }
        let mut codes: HashMap<String, Vec<String>> = HashMap::new();
        for (user, hash) in found_codes {
            codes.entry(user).or_default().push(b64url(&hash));
        }
        for u in &page {
            let mut record = serde_json::json!({
                "id": u.id,
                "email": u.email,
                "verified": u.email_verified_at.is_some(),
                "created_at": crate::clock::rfc3339(u.created_at),
            });
            if let Some(name) = &u.name {
                record["name"] = name.clone().into();
            }
            if u.password_hash == crate::store::UNUSABLE_PASSWORD {
                record["no_password"] = true.into();
            } else {
                record["password_hash"] = u.password_hash.clone().into();
            }
            if u.disabled_at.is_some() {
                record["disabled"] = true.into();
            }
            if let Some(exported) = factors.remove(&u.id) {
                record["factors"] = serde_json::to_value(exported)?;
            }
            if let Some(hashes) = codes.remove(&u.id) {
                record["recovery_codes"] = hashes.into();
            }
            writeln!(out, "{record}")?;
            n += 1;
        }
        match page.last() {
            Some(last) if page.len() == 500 => filter.after = Some(last.id.clone()),
            _ => break,
        }
    }
    out.flush()?;
    Ok(n)
}

/// Writes one batch of checked accounts (`latchkey users import`): created,
/// or with `update` replaced (their sessions end, everywhere, and every
/// instance forgets its cached copy), or skipped. One transaction.
pub async fn import_batch(
    store: &Store,
    revocations: &Revocations,
    batch: &[ImportedUser],
    update: bool,
    actor: &str,
) -> anyhow::Result<Vec<ImportOutcome>> {
    let (outcomes, ended) = store.import_users(batch, update, now_ms(), actor).await?;
    revocations.revoke(&ended).await;
    for (o, u) in outcomes.iter().zip(batch) {
        if *o == ImportOutcome::Updated {
            revocations.user_changed(&u.email).await;
        }
    }
    Ok(outcomes)
}

/// Verified accounts for load tests (`latchkey users seed`): `count`
/// emails made from `pattern` (its `{}` replaced by 1..=count) with one
/// password, hashed on `threads` threads; with `totp_secret`, each new one
/// also gets a confirmed authenticator app with that secret (a lab, never a
/// real deployment). Returns how many were created, and how many got the
/// authenticator.
pub async fn seed(
    store: &Store,
    passwords: std::sync::Arc<super::hashing::Passwords>,
    threads: usize,
    (pattern, count): (&str, usize),
    password: &str,
    totp: Option<(&crate::crypto::Sealer, &[u8])>,
) -> anyhow::Result<(usize, u64)> {
    let now = now_ms();
    let (pattern, password) = (pattern.to_string(), password.to_string());
    let threads = threads.max(1);
    let users = tokio::task::spawn_blocking(move || {
        let chunks: Vec<Vec<usize>> = (0..threads)
            .map(|t| (1..=count).filter(|i| i % threads == t).collect())
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|idx| {
                    let (p, pw, pat) = (passwords.clone(), password.clone(), pattern.clone());
                    s.spawn(move || {
                        idx.into_iter()
                            .map(|i| ImportedUser {
                                id: uuid::Uuid::now_v7().to_string(),
                                email: pat.replace("{}", &i.to_string()).to_lowercase(),
                                name: None,
                                password_hash: p.hash(&pw),
                                verified_at: Some(now),
                                created_at: now,
                                disabled: false,
                                factors: Vec::new(),
                                recovery_codes: Vec::new(),
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("hashing thread"))
                .collect::<Vec<_>>()
        })
    })
    .await?;
    let (outcomes, _) = store.import_users(&users, false, now, "cli").await?;
    let created: Vec<&str> = users
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| **o == ImportOutcome::Created)
        .map(|(u, _)| u.id.as_str())
        .collect();
    let with_totp = match totp {
        Some((sealer, secret)) => {
            super::mfa::seed_totp(store, sealer, created.iter().copied(), secret, now).await?
        }
        None => 0,
    };
    Ok((created.len(), with_totp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_or_webhook_line_is_told_from_an_account_by_its_first_key() {
        assert!(is_configured(r#"{"client":{"id":"a"}}"#));
        assert!(is_configured(r#"  { "webhook" : {}}"#));
        assert!(!is_configured(r#"{"email":"a@example.com","client":{}}"#));
        assert!(!is_configured(r#"{"clients":{}}"#));
        assert!(!is_configured(""));
        assert!(!is_configured(EXPORT_HEADER));
    }

    #[test]
    fn an_exported_record_reads_back_as_it_was_written() {
        let c = Configured::Client(ExportedClient {
            id: "app".into(),
            name: Some("App".into()),
            secret_sha256: "00".repeat(32),
            scopes: "latchkey:admin".into(),
            oidc: Some(serde_json::json!({"redirect_uris": ["https://app.example/cb"]})),
            created_at: "2026-11-27T10:00:00Z".into(),
        });
        let line = serde_json::to_string(&c).unwrap();
        assert!(is_configured(&line));
        assert_eq!(serde_json::from_str::<Configured>(&line).unwrap(), c);
        let unknown = line.replace("\"scopes\"", "\"scopez\"");
        assert!(serde_json::from_str::<Configured>(&unknown).is_err());
    }

    #[test]
    fn exports_of_versions_1_to_3_are_read_and_a_newer_one_is_refused_by_name() {
        for v in 1..=3 {
            let header = format!(r#"{{"format":"latchkey-users","version":{v}}}"#);
            assert_eq!(export_version(&header), Ok(Some(v)));
        }
        assert_eq!(export_version(EXPORT_HEADER), Ok(Some(3)));
        assert!(export_version(r#"{"format":"latchkey-users","version":4}"#)
            .unwrap_err()
            .contains("versions 1 to 3"));
        assert_eq!(export_version(r#"{"email":"a@example.com"}"#), Ok(None));
    }

    /// Why `line` does not import (it must not).
    fn refused(line: &str, sealer: &Sealer) -> String {
        match AccountLine::parse(line).and_then(|a| a.check(0, sealer)) {
            Ok(_) => panic!("imported: {line}"),
            Err(e) => e,
        }
    }

    fn totp_line(id: &str, sealer: &Sealer) -> String {
        let sealed = b64url(&sealer.seal(b"0123456789abcdef0123", &crate::domain::mfa::totp_aad(id)));
        serde_json::json!({
            "id": "01a21e6e-82b9-7324-a423-3488de112422",
            "email": "ada@example.com",
            "password_hash": "$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW",
            "factors": [{"id": id, "kind": "totp", "name": "Phone", "created_at": "2026-11-27T10:00:00Z",
                         "confirmed_at": "2026-11-27T10:00:05Z", "last_step": 59_000_000, "sealed_secret": sealed}],
            "recovery_codes": [b64url(&[7u8; 32])],
        })
        .to_string()
    }

    #[test]
    fn an_account_line_brings_its_factors_only_under_the_secret_that_sealed_them() {
        let keys = crate::crypto::ServerKeys::derive(b"the master secret of the export!");
        let line = totp_line("f1", &keys.factors);
        let c = AccountLine::parse(&line)
            .unwrap()
            .check(0, &keys.factors)
            .unwrap();
        assert_eq!(
            c.user.id, "01a21e6e-82b9-7324-a423-3488de112422",
            "the id is kept"
        );
        assert_eq!(c.user.factors.len(), 1);
        assert_eq!(c.user.factors[0].last_step, Some(59_000_000));
        assert_eq!(c.user.recovery_codes, vec![vec![7u8; 32]]);
        // Another deployment's secret: the account is refused, not weakened.
        let other = crate::crypto::ServerKeys::derive(b"another deployment's secret, 32!");
        let e = refused(&line, &other.factors);
        assert!(e.contains("another master secret"), "{e}");
        // The seal is bound to the factor's id: a renamed id does not open.
        let moved = line.replace("\"id\":\"f1\"", "\"id\":\"f2\"");
        refused(&moved, &keys.factors);
        // The admin API's records take no factors.
        assert!(serde_json::from_str::<ImportRecord>(&line).is_err());
    }

    #[test]
    fn an_account_line_names_what_is_wrong_with_its_factors() {
        let keys = crate::crypto::ServerKeys::derive(b"the master secret of the export!");
        let line: serde_json::Value = serde_json::from_str(&totp_line("f1", &keys.factors)).unwrap();
        let with = |path: &[&str], value: serde_json::Value| {
            let mut l = line.clone();
            let mut at = &mut l;
            for p in &path[..path.len() - 1] {
                at = if let Ok(i) = p.parse::<usize>() {
                    &mut at[i]
                } else {
                    &mut at[*p]
                };
            }
            at[path[path.len() - 1]] = value;
            refused(&l.to_string(), &keys.factors)
        };
        let cases: &[(&[&str], serde_json::Value, &str)] = &[
            (&["id"], "not-a-uuid".into(), "id:"),
            (&["factors", "0", "kind"], "sms".into(), "kind"),
            (&["factors", "0", "id"], "has space".into(), "id:"),
            (&["factors", "0", "sealed_secret"], "***".into(), "sealed_secret"),
            (
                &["factors", "0", "confirmed_at"],
                "yesterday".into(),
                "confirmed_at",
            ),
            (&["factors", "0", "kind"], "passkey".into(), "credential"),
            (
                &["recovery_codes"],
                serde_json::json!(["c2hvcnQ"]),
                "recovery_codes",
            ),
            (
                &["recovery_codes"],
                serde_json::json!([b64url(&[7u8; 32]), b64url(&[7u8; 32])]),
                "twice",
            ),
            (
                &["recovery_codes"],
                serde_json::json!(vec![b64url(&[7u8; 32]); 21]),
                "at most 20",
            ),
        ];
        for (path, value, named) in cases {
            let e = with(path, value.clone());
            assert!(e.contains(named), "{path:?}: {e}");
        }
        let mut anonymous = line.clone();
        anonymous.as_object_mut().unwrap().remove("id");
        let e = refused(&anonymous.to_string(), &keys.factors);
        assert!(e.contains("only with the account's id"), "{e}");
        let mut twice = line.clone();
        let f = twice["factors"][0].clone();
        twice["factors"].as_array_mut().unwrap().push(f);
        let e = refused(&twice.to_string(), &keys.factors);
        assert!(e.contains("twice"), "{e}");
        let mut passkey = line.clone();
        passkey["factors"][0] = serde_json::json!({"id": "p1", "kind": "passkey", "name": "Key",
            "created_at": "2026-11-27T10:00:00Z", "confirmed_at": "2026-11-27T10:00:00Z",
            "credential": "{}", "credential_id": "AAAA"});
        let e = refused(&passkey.to_string(), &keys.factors);
        assert!(e.contains("not a passkey's credential"), "{e}");
    }
}
