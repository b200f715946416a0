//! OAuth clients: confidential clients with a generated 256-bit secret, stored
//! as a SHA-256 digest (a slow hash adds nothing for a random 256-bit secret).

use crate::clock::now_ms;
use crate::crypto::{ct_eq, random_token, sha256};
pub use crate::store::ClientRecord;
use crate::store::Store;

use super::AuthError;

/// Creates a client; returns its secret, shown once.
pub async fn add(store: &Store, id: &str, name: Option<&str>) -> anyhow::Result<Option<String>> {
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
    };
    Ok(store.add_client(&rec).await?.then_some(secret))
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
