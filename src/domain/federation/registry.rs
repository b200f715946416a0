//! The upstreams an operator configured (the command line and the admin
//! API): adding one (its client secret sealed), listing, removing, and
//! the list the sign-in page shows.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{upstream, Federation, Protocol, SECRET_AAD};
use crate::domain::AuthError;
use crate::store::UpstreamRecord;

/// How long the list of upstreams is kept between reads of the database
/// (the sign-in page shows it).
const LIST_KEEP: Duration = Duration::from_secs(5);

/// An upstream as an operator adds it.
#[derive(Clone)]
pub struct NewUpstream {
    pub name: String,
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// Space-separated; empty: the protocol's default. `openid` is added
    /// to an OpenID Provider's when missing.
    pub scopes: String,
    pub may_create: bool,
    pub trusts_email_verified: bool,
    pub protocol: Protocol,
    /// Whether its `amr` value `mfa` (RFC 8176: more than one factor)
    /// counts as the account's second factor here.
    pub trusts_mfa: bool,
    /// The claim of the id_token (or userinfo) that carries the address;
    /// empty: `email`. Its `email_verified` says whether it is verified.
    pub email_claim: String,
    /// The claim that carries the name given to an account made for the
    /// person; empty: `name`.
    pub name_claim: String,
}

impl std::fmt::Debug for NewUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewUpstream")
            .field("name", &self.name)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &"(hidden)")
            .finish_non_exhaustive()
    }
}

/// An upstream as it is shown (never its secret).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct UpstreamView {
    pub name: String,
    pub display_name: String,
    pub issuer: String,
    pub client_id: String,
    pub scopes: String,
    pub may_create: bool,
    pub trusts_email_verified: bool,
    pub protocol: Protocol,
    pub trusts_mfa: bool,
    pub email_claim: String,
    pub name_claim: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The redirect URI to register at the upstream.
    pub redirect_uri: String,
}

impl Federation {
    fn view(&self, u: &UpstreamRecord) -> UpstreamView {
        UpstreamView {
            redirect_uri: self.redirect_uri(&u.name),
            name: u.name.clone(),
            display_name: u.display_name.clone(),
            issuer: u.issuer.clone(),
            client_id: u.client_id.clone(),
            scopes: u.scopes.clone(),
            may_create: u.may_create,
            trusts_email_verified: u.trusts_email_verified,
            protocol: Protocol::parse(&u.protocol).unwrap_or(Protocol::Oidc),
            trusts_mfa: u.trusts_mfa,
            email_claim: u.email_claim.clone(),
            name_claim: u.name_claim.clone(),
            created_at: u.created_at,
        }
    }

    /// Adds an upstream (`false`: the name is taken).
    pub async fn add(&self, mut u: NewUpstream, now: i64) -> Result<bool, AuthError> {
        let bad = |m: &str| Err(AuthError::BadRequest(m.to_string()));
        let name_ok = !u.name.is_empty()
            && u.name.len() <= 32
            && u.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        // `token` is a path of its own: `POST /auth/upstream/token`.
        if !name_ok || u.name == "token" {
            return bad("name: 1 to 32 of a-z, 0-9 and - (not `token`)");
        }
        if u.display_name.trim().is_empty() || u.display_name.len() > 64 {
            return bad("display name: 1 to 64 bytes");
        }
        if u.protocol == Protocol::Github {
            // A site's URL, without the trailing slash: identities are keyed
            // by it, so one spelling only.
            u.issuer = match u.issuer.trim_end_matches('/') {
                "" => upstream::GITHUB.to_string(),
                site => site.to_string(),
            };
        }
        match url::Url::parse(&u.issuer) {
            Ok(i) if upstream::secure_enough(&i) && i.query().is_none() && i.fragment().is_none() => {}
            _ => {
                return bad(
                    "issuer: an https URL without query or fragment (http only on a loopback address)",
                )
            }
        }
        if u.client_id.is_empty()
            || u.client_id.len() > 255
            || u.client_secret.is_empty()
            || u.client_secret.len() > 1024
        {
            return bad("client id and secret: 1 to 255 and 1 to 1024 bytes");
        }
        let mut scopes: Vec<&str> = u.scopes.split_whitespace().collect();
        if scopes.is_empty() {
            scopes = u.protocol.default_scopes().split(' ').collect();
        }
        if u.protocol == Protocol::Oidc && !scopes.contains(&"openid") {
            scopes.insert(0, "openid");
        }
        if scopes
            .iter()
            .any(|s| !s.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'))
        {
            return bad("scopes: printable, space-separated");
        }
        if u.protocol == Protocol::Github && u.trusts_mfa {
            return bad("trusts_mfa: GitHub asserts no authentication methods");
        }
        if u.protocol == Protocol::Github && !(u.email_claim.is_empty() && u.name_claim.is_empty()) {
            return bad("email_claim, name_claim: GitHub's are its API's (the primary address, the name)");
        }
        let record = UpstreamRecord {
            client_secret: self.sealer.seal(u.client_secret.as_bytes(), &secret_aad(&u.name)),
            name: u.name,
            display_name: u.display_name.trim().to_string(),
            issuer: u.issuer,
            client_id: u.client_id,
            scopes: scopes.join(" "),
            may_create: u.may_create,
            trusts_email_verified: u.trusts_email_verified,
            created_at: now,
            protocol: u.protocol.as_str().to_string(),
            trusts_mfa: u.trusts_mfa,
            email_claim: claim(&u.email_claim, "email")?,
            name_claim: claim(&u.name_claim, "name")?,
        };
        let added = self.shared.store.add_upstream(&record).await?;
        self.refresh().await?;
        Ok(added)
    }

    pub async fn list(&self) -> Result<Vec<UpstreamView>, AuthError> {
        Ok(self
            .shared
            .store
            .upstreams()
            .await?
            .iter()
            .map(|u| self.view(u))
            .collect())
    }

    /// Removes an upstream (`false`: no such name).
    pub async fn remove(&self, name: &str) -> Result<bool, AuthError> {
        let removed = self.shared.store.remove_upstream(name).await?;
        self.refresh().await?;
        Ok(removed)
    }

    /// The upstreams the sign-in page lists, as read at most a few seconds
    /// ago: without waiting (a page is drawn without a database read); a
    /// list older than that is read again in the background.
    pub fn listed(self: &Arc<Self>) -> Arc<Vec<UpstreamRecord>> {
        let (at, list) = self.list.lock().unwrap().clone();
        if at.elapsed() >= LIST_KEEP && !self.refreshing.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move {
                let _ = me.refresh().await;
                me.refreshing.store(false, Ordering::Release);
            });
        }
        list
    }

    /// Reads the list of upstreams again (at start, and after a change).
    pub async fn refresh(&self) -> Result<(), AuthError> {
        let list = Arc::new(self.shared.store.upstreams().await?);
        *self.list.lock().unwrap() = (Instant::now(), list);
        Ok(())
    }
}

/// The associated data of an upstream's sealed client secret: its name.
pub fn secret_aad(name: &str) -> Vec<u8> {
    [SECRET_AAD, b" ", name.as_bytes()].concat()
}

/// A claim name as given (`default` when empty): 1 to 64 printable
/// characters.
fn claim(given: &str, default: &str) -> Result<String, AuthError> {
    let name = if given.is_empty() { default } else { given };
    if name.len() > 64 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AuthError::BadRequest(format!(
            "{default}_claim: 1 to 64 printable characters"
        )));
    }
    Ok(name.to_string())
}
