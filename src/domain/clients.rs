//! OAuth clients: confidential clients with a generated 256-bit secret, stored
//! as a SHA-256 digest (a slow hash adds nothing for a random 256-bit secret).

use crate::cache::Revocations;
use crate::clock::now_ms;
use crate::crypto::{ct_eq, random_token, sha256};
pub use crate::store::ClientRecord;
use crate::store::Store;

use super::tokens::client_sid;
use super::AuthError;

/// The scope of the admin API (`/admin/*`).
pub const ADMIN_SCOPE: &str = "latchkey:admin";

/// Whether `s` is a scope token (RFC 6749 §3.3, narrowed to
/// `A-Z a-z 0-9 : . _ -`, at most 64 characters).
fn valid_scope(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":._-".contains(&b))
}

/// Removes a client, ends the sessions it holds for users and revokes its
/// own tokens, on every instance within the revocations' usual second (by
/// Redis at once, and through the database's `revoked_sids` for instances
/// that cannot hear this process). `false`: no such client.
pub async fn remove(store: &Store, revocations: &Revocations, id: &str) -> anyhow::Result<bool> {
    let Some(client) = store.client(id).await? else {
        return Ok(false);
    };
    let sid = client_sid(id, client.created_at);
    match store.remove_client(id, client.created_at, &sid, now_ms()).await? {
        Some(sids) => {
            revocations.revoke(&sids).await;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Every client, by id.
pub async fn list(store: &Store) -> anyhow::Result<Vec<ClientRecord>> {
    Ok(store.clients().await?)
}

/// Creates a client that may ask for `scopes`; returns its secret, shown once.
pub async fn add(
    store: &Store,
    id: &str,
    name: Option<&str>,
    scopes: &[String],
) -> anyhow::Result<Option<String>> {
    if let Some(bad) = scopes.iter().find(|s| !valid_scope(s)) {
        anyhow::bail!("scope {bad:?} must be 1..=64 characters of A-Z a-z 0-9 : . _ -");
    }
    if id.is_empty()
        || id.len() > 128
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        anyhow::bail!("client id must be 1..=128 characters of A-Z a-z 0-9 - _ .");
    }
    if id == super::accounts::FIRST_PARTY_CLIENT {
        anyhow::bail!("client id {id:?} is reserved: it names tokens of the first-party endpoints");
    }
    let secret = random_token();
    let rec = ClientRecord {
        id: id.to_string(),
        secret_hash: sha256(secret.as_bytes()).to_vec(),
        name: name.map(str::to_string),
        created_at: now_ms(),
        scopes: scopes.join(" "),
    };
    Ok(store.add_client(&rec).await?.then_some(secret))
}

/// The scope a client gets in the client_credentials grant: what it asked
/// for (`requested`, space-separated) if the client may have all of it, or
/// everything it may have when it asked for nothing. `None`: it asked for a
/// scope it may not have (`invalid_scope`), or it may have none.
pub fn granted_scope(client: &ClientRecord, requested: Option<&str>) -> Option<String> {
    let allowed: Vec<&str> = client.scopes.split(' ').filter(|s| !s.is_empty()).collect();
    let wanted: Vec<&str> = match requested {
        Some(r) => r.split(' ').filter(|s| !s.is_empty()).collect(),
        None => allowed.clone(),
    };
    if wanted.is_empty() || !wanted.iter().all(|w| allowed.contains(w)) {
        return None;
    }
    let mut granted: Vec<&str> = Vec::new();
    for w in wanted {
        if !granted.contains(&w) {
            granted.push(w);
        }
    }
    Some(granted.join(" "))
}

/// Checks a client's credentials. Unknown ids cost the same comparison.
pub async fn authenticate(store: &Store, id: &str, secret: &str) -> Result<ClientRecord, AuthError> {
    let rec = store.client(id).await?;
    let presented = sha256(secret.as_bytes());
    match rec {
        Some(rec) if ct_eq(&rec.secret_hash, &presented) => Ok(rec),
        Some(_) => Err(AuthError::InvalidClient),
        None => {
            let _ = ct_eq(&[0u8; 32], &presented);
            Err(AuthError::InvalidClient)
        }
    }
}
