//! Registering webhooks (the admin API and `latchkey webhooks`), and their
//! delivery history. Delivery itself is `crate::webhooks::DeliveryWorker`.

use serde::Serialize;

use std::sync::Arc;

use super::AuthError;
use crate::clock::{now_ms, rfc3339};
use crate::crypto::Sealer;
use crate::store::Store;
use crate::store::{family, DeliveryRecord, WebhookRecord, KINDS};

/// A webhook as the admin API shows it (never its secret, but once).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Webhook {
    pub id: String,
    pub url: String,
    /// Kinds or families (`session.`) it receives; empty: every event.
    pub kinds: Vec<String>,
    pub created_at: String,
}

impl From<WebhookRecord> for Webhook {
    fn from(w: WebhookRecord) -> Self {
        Webhook {
            id: w.id,
            url: w.url,
            kinds: w
                .kinds
                .split(' ')
                .filter(|k| !k.is_empty())
                .map(String::from)
                .collect(),
            created_at: rfc3339(w.created_at),
        }
    }
}

/// A new webhook with its signing secret, shown only now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewWebhook {
    #[serde(flatten)]
    pub webhook: Webhook,
    /// `whsec_...`: give it to the receiver's Standard Webhooks verifier.
    pub secret: String,
}

/// One delivery of one event to one webhook.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Delivery {
    pub id: i64,
    pub event_id: i64,
    /// `pending` (waiting for its next attempt), `delivered` or `dead`.
    pub state: &'static str,
    pub attempts: i32,
    pub created_at: String,
    pub next_attempt_at: Option<String>,
    pub delivered_at: Option<String>,
    pub dead_at: Option<String>,
    /// The receiver's last HTTP status, if it answered.
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
}

impl From<DeliveryRecord> for Delivery {
    fn from(d: DeliveryRecord) -> Self {
        let state = match (d.delivered_at, d.dead_at) {
            (Some(_), _) => "delivered",
            (None, Some(_)) => "dead",
            (None, None) => "pending",
        };
        Delivery {
            id: d.id,
            event_id: d.event_id,
            state,
            attempts: d.attempts,
            created_at: rfc3339(d.created_at),
            next_attempt_at: (state == "pending").then(|| rfc3339(d.next_attempt_at)),
            delivered_at: d.delivered_at.map(rfc3339),
            dead_at: d.dead_at.map(rfc3339),
            last_status: d.last_status,
            last_error: d.last_error,
        }
    }
}

/// A page of deliveries, newest first, and the cursor of the next one.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryPage {
    pub deliveries: Vec<Delivery>,
    pub next_cursor: Option<String>,
}

const NO_WEBHOOK: AuthError = AuthError::NotFound("webhook");

/// `http(s)://host[:port]/path`, without credentials or a fragment, at a
/// public address unless private ones are allowed.
fn check_url(url: &str, allow_private: bool) -> Result<String, AuthError> {
    let bad = |why: &str| AuthError::BadRequest(format!("url: {why}"));
    if url.len() > 2048 {
        return Err(bad("at most 2048 characters"));
    }
    let u = url::Url::parse(url).map_err(|e| bad(&format!("not a URL: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("must be http:// or https://"));
    }
    if u.host_str().is_none_or(str::is_empty) || !u.username().is_empty() || u.password().is_some() {
        return Err(bad("needs a host, and no credentials"));
    }
    if u.fragment().is_some() {
        return Err(bad("no fragment"));
    }
    crate::webhooks::refuse_private_host(&u, allow_private).map_err(|why| bad(&why))?;
    Ok(u.to_string())
}

/// Each a kind of the catalogue or a family of one (`session.`).
fn check_kinds(kinds: &[String]) -> Result<String, AuthError> {
    for k in kinds {
        let known = KINDS.contains(&k.as_str()) || KINDS.iter().any(|x| family(x) == k);
        if !known {
            return Err(AuthError::BadRequest(format!(
                "kinds: {k:?} is neither a kind nor a family of docs/events.md"
            )));
        }
    }
    let mut list: Vec<&str> = kinds.iter().map(String::as_str).collect();
    list.sort_unstable();
    list.dedup();
    Ok(list.join(" "))
}

/// The webhooks service: registering, listing and removing webhooks, and
/// their deliveries.
pub struct Webhooks {
    store: Store,
    /// Seals webhook secrets at rest (the outbox's key).
    sealer: Arc<Sealer>,
    /// Whether webhooks may be registered at non-public addresses.
    allow_private: bool,
}

impl Webhooks {
    pub fn new(store: Store, sealer: Arc<Sealer>, allow_private: bool) -> Webhooks {
        Webhooks {
            store,
            sealer,
            allow_private,
        }
    }

    /// Registers a webhook for `kinds` (empty: every event); its secret is
    /// in the answer only.
    pub async fn add(&self, actor: &str, url: &str, kinds: &[String]) -> Result<NewWebhook, AuthError> {
        let url = check_url(url, self.allow_private)?;
        let kinds = check_kinds(kinds)?;
        let secret = crate::webhooks::new_secret();
        let rec = WebhookRecord {
            id: format!("wh_{}", uuid::Uuid::new_v4().simple()),
            url,
            secret: crate::webhooks::seal_secret(&secret, &self.sealer),
            kinds,
            created_at: now_ms(),
            client_id: None,
        };
        if !self.store.add_webhook(&rec, actor, rec.created_at).await? {
            return Err(AuthError::Internal(anyhow::anyhow!(
                "a new webhook's random id was taken"
            )));
        }
        tracing::info!(webhook = %rec.id, "webhook registered");
        Ok(NewWebhook {
            webhook: rec.into(),
            secret,
        })
    }

    /// Registers a webhook exported from another deployment (`latchkey
    /// users import`), its secret still sealed: only if the secret opens
    /// here (the same master secret), its address and kinds checked as a
    /// new webhook's. `false`: its id is taken here, and that webhook is
    /// left as it is.
    pub async fn import(&self, actor: &str, rec: WebhookRecord) -> Result<bool, AuthError> {
        let id_ok = rec.id.len() <= 64
            && rec
                .id
                .strip_prefix("wh_")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric()));
        if !id_ok {
            return Err(AuthError::BadRequest(
                "id: wh_ and letters or digits, as latchkey names webhooks".into(),
            ));
        }
        let url = check_url(&rec.url, self.allow_private)?;
        let kinds: Vec<String> = rec.kinds.split_whitespace().map(String::from).collect();
        let kinds = check_kinds(&kinds)?;
        // Sealed under the current master secret, or again under it if a
        // previous one of the keyring sealed it.
        let secret = match self.sealer.reseal(&rec.secret, crate::webhooks::AAD) {
            crate::crypto::Resealed::Current => rec.secret.clone(),
            crate::crypto::Resealed::Now(again) => again,
            crate::crypto::Resealed::Unopenable => {
                return Err(AuthError::BadRequest(
                    "sealed_secret: sealed under another master secret than this deployment's \
                     (register the webhook again here, with a new secret)"
                        .into(),
                ))
            }
        };
        let rec = WebhookRecord {
            url,
            kinds,
            secret,
            client_id: None,
            ..rec
        };
        Ok(self.store.add_webhook(&rec, actor, now_ms()).await?)
    }

    pub async fn list(&self) -> Result<Vec<Webhook>, AuthError> {
        Ok(self
            .store
            .webhooks()
            .await?
            .into_iter()
            .map(Webhook::from)
            .collect())
    }

    /// Removes a webhook; its pending deliveries are dropped.
    pub async fn remove(&self, actor: &str, id: &str) -> Result<(), AuthError> {
        if !self.store.remove_webhook(id, now_ms(), actor).await? {
            return Err(NO_WEBHOOK);
        }
        tracing::info!(webhook = %id, "webhook removed");
        Ok(())
    }

    /// A webhook's deliveries, newest first, before delivery `before`.
    pub async fn deliveries(
        &self,
        id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<DeliveryPage, AuthError> {
        if self.store.webhook(id).await?.is_none() {
            return Err(NO_WEBHOOK);
        }
        let limit = limit.clamp(1, super::admin::MAX_PAGE);
        let mut rows = self.store.deliveries(id, before, limit + 1).await?;
        let next_cursor = if rows.len() as i64 > limit {
            rows.truncate(limit as usize);
            rows.last().map(|d| d.id.to_string())
        } else {
            None
        };
        Ok(DeliveryPage {
            deliveries: rows.into_iter().map(Delivery::from).collect(),
            next_cursor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_kinds_are_checked() {
        assert!(check_url("https://hooks.example.com/latchkey?x=1", false).is_ok());
        assert!(check_url("http://127.0.0.1:9000/", false).is_err());
        assert!(check_url("http://127.0.0.1:9000/", true).is_ok());
        for bad in ["ftp://x/", "https://u:p@x/", "not a url", "https://x/#frag"] {
            assert!(check_url(bad, true).is_err(), "{bad}");
        }
        let k = |v: &[&str]| check_kinds(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            k(&["session.", "user.deleted", "session."]).unwrap(),
            "session. user.deleted"
        );
        assert_eq!(k(&[]).unwrap(), "");
        assert!(k(&["session.nope"]).is_err());
        assert!(k(&["sess"]).is_err());
    }
}
