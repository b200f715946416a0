//! Webhooks: endpoints with their sealed signing secrets and event filters,
//! and their deliveries (queued with each event by `record_event!`, claimed
//! by the delivery worker with a lease, as the mail outbox is).

use sqlx::Connection;

use super::events::record_event;
use super::{db_op, Event, Store, StoreResult};

#[derive(Clone, Debug)]
pub struct WebhookRecord {
    pub id: String,
    pub url: String,
    /// The signing secret, sealed.
    pub secret: Vec<u8>,
    /// Space-separated kinds or families; empty: every event.
    pub kinds: String,
    pub created_at: i64,
    /// The client whose back-channel logout URI this is (it receives logout
    /// tokens, not events: [`logout_hook_id`]); `None`: an audit webhook.
    pub client_id: Option<String>,
}

type WebhookRow = (String, String, Vec<u8>, String, i64, Option<String>);

fn webhook(r: WebhookRow) -> WebhookRecord {
    WebhookRecord {
        id: r.0,
        url: r.1,
        secret: r.2,
        kinds: r.3,
        created_at: r.4,
        client_id: r.5,
    }
}

/// The id of client `client_id`'s back-channel logout webhook (its
/// deliveries are listed at `GET /admin/webhooks/{id}/deliveries`).
pub fn logout_hook_id(client_id: &str) -> String {
    format!("backchannel:{client_id}")
}

/// Writes (or, with `$uri` `None`, removes) client `$client`'s back-channel
/// logout webhook on `$tx`, at `$now`. Its pending deliveries go to the new
/// URI; removed, they go with it.
macro_rules! put_logout_hook {
    ($tx:expr, $client:expr, $uri:expr, $now:expr) => {{
        let client: &str = $client;
        let uri: Option<&str> = $uri;
        match uri {
            Some(uri) => {
                sqlx::query(
                    "INSERT INTO webhooks (id, url, secret, kinds, created_at, client_id) \
                     VALUES ($1, $2, $3, 'session.ended', $4, $5) \
                     ON CONFLICT (id) DO UPDATE SET url = excluded.url",
                )
                .bind($crate::store::webhooks::logout_hook_id(client))
                .bind(uri)
                .bind(&[][..] as &[u8])
                .bind($now)
                .bind(client)
                .execute(&mut *$tx)
                .await?;
            }
            None => {
                sqlx::query("DELETE FROM webhooks WHERE client_id = $1")
                    .bind(client)
                    .execute(&mut *$tx)
                    .await?;
            }
        }
    }};
}
pub(super) use put_logout_hook;

/// A claimed delivery: which event goes to which webhook. Its attempt is
/// counted when the worker takes it ([`Store::take_delivery`]).
#[derive(Clone, Debug)]
pub struct DeliveryRow {
    pub id: i64,
    pub webhook_id: String,
    pub event_id: i64,
    /// A back-channel logout's `sid` (none for an audit webhook's).
    pub sid: Option<String>,
}

/// What an attempt on a delivery came to: delivered (`error` None), to be
/// retried at `next`, or given up (`dead`).
#[derive(Clone, Debug)]
pub struct Attempted<'a> {
    pub at: i64,
    pub status: Option<i32>,
    pub error: Option<&'a str>,
    pub next: Option<i64>,
    pub dead: bool,
}

/// A delivery as its history shows it.
#[derive(Clone, Debug)]
pub struct DeliveryRecord {
    pub id: i64,
    pub event_id: i64,
    pub created_at: i64,
    pub attempts: i32,
    pub next_attempt_at: i64,
    pub delivered_at: Option<i64>,
    pub dead_at: Option<i64>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
}

impl Store {
    /// Adds a webhook unless its id is taken (`false`: an imported one's
    /// may be), with its `webhook.added` event at `now` (`actor`: who
    /// asked).
    pub async fn add_webhook(&self, w: &WebhookRecord, actor: &str, now: i64) -> StoreResult<bool> {
        db_op!(self, "add_webhook", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "INSERT INTO webhooks (id, url, secret, kinds, created_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&w.id)
            .bind(&w.url)
            .bind(&w.secret)
            .bind(&w.kinds)
            .bind(w.created_at)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(false);
            }
            record_event!(tx, &Event::new("webhook.added", now).actor(actor).reason(&w.id));
            tx.commit().await?;
            Ok(true)
        })
    }

    pub async fn webhooks(&self) -> StoreResult<Vec<WebhookRecord>> {
        let rows: Vec<WebhookRow> = db_op!(self, "webhooks", conn => Ok(sqlx::query_as(
            "SELECT id, url, secret, kinds, created_at, client_id FROM webhooks WHERE client_id IS NULL \
             ORDER BY created_at, id",
        )
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows.into_iter().map(webhook).collect())
    }

    pub async fn webhook(&self, id: &str) -> StoreResult<Option<WebhookRecord>> {
        let row: Option<WebhookRow> = db_op!(self, "webhook", conn => Ok(sqlx::query_as(
            "SELECT id, url, secret, kinds, created_at, client_id FROM webhooks WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(row.map(webhook))
    }

    /// Removes a webhook and its deliveries, with its `webhook.removed`
    /// event; `false` if there is none (a client's back-channel logout
    /// webhook goes only with the client's settings).
    pub async fn remove_webhook(&self, id: &str, now: i64, actor: &str) -> StoreResult<bool> {
        db_op!(self, "remove_webhook", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("DELETE FROM webhooks WHERE id = $1 AND client_id IS NULL")
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            record_event!(tx, &Event::new("webhook.removed", now).actor(actor).reason(id));
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Claims up to `limit` due deliveries until `now + lease_ms` (PostgreSQL
    /// skips rows other instances hold; SQLite has one writer). The claim's
    /// value, `claimed_until`, is how the worker knows the row is still its
    /// own: each later step ([`Store::take_delivery`],
    /// [`Store::delivery_attempted`]) applies only where it is unchanged, so
    /// a worker whose claim ran out, and another instance took the row,
    /// touches nothing. The lease of the mail outbox (`store/outbox.rs`) on
    /// another table: the two queues keep different columns and are read by
    /// different workers.
    pub async fn claim_deliveries(
        &self,
        now: i64,
        lease_ms: i64,
        limit: i64,
    ) -> StoreResult<Vec<DeliveryRow>> {
        const DUE: &str = "SELECT id FROM webhook_deliveries WHERE delivered_at IS NULL AND dead_at IS NULL \
             AND next_attempt_at <= $1 AND (claimed_until IS NULL OR claimed_until < $1) ORDER BY id LIMIT $3";
        let rows: Vec<(i64, String, i64, Option<String>)> = db_op!(self, "claim_deliveries",
            sqlite conn => Ok(sqlx::query_as(&format!(
                "UPDATE webhook_deliveries SET claimed_until = $2 WHERE id IN ({DUE}) \
                 RETURNING id, webhook_id, event_id, sid"
            ))
            .bind(now)
            .bind(now + lease_ms)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?),
            postgres conn => Ok(sqlx::query_as(&format!(
                "UPDATE webhook_deliveries SET claimed_until = $2 WHERE id IN ({DUE} \
                 FOR UPDATE SKIP LOCKED) RETURNING id, webhook_id, event_id, sid"
            ))
            .bind(now)
            .bind(now + lease_ms)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?),
        )?;
        let mut rows: Vec<DeliveryRow> = rows
            .into_iter()
            .map(|r| DeliveryRow {
                id: r.0,
                webhook_id: r.1,
                event_id: r.2,
                sid: r.3,
            })
            .collect();
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }

    /// Takes a claimed delivery for its attempt: its claim, still `held`,
    /// moves to `until`, and the attempt is counted. The attempts made so
    /// far, this one included, or `None` if the claim is no longer `held`
    /// (it ran out and another instance took the row: that one sends it).
    pub async fn take_delivery(&self, id: i64, held: i64, until: i64) -> StoreResult<Option<i32>> {
        db_op!(self, "take_delivery", conn => Ok(sqlx::query_scalar(
            "UPDATE webhook_deliveries SET claimed_until = $3, attempts = attempts + 1 \
             WHERE id = $1 AND claimed_until = $2 AND delivered_at IS NULL AND dead_at IS NULL \
             RETURNING attempts",
        )
        .bind(id)
        .bind(held)
        .bind(until)
        .fetch_optional(&mut *conn)
        .await?))
    }

    /// Records an attempt on a delivery whose claim is still `held`: `true`.
    /// A claim no longer held changes nothing: `false`.
    pub async fn delivery_attempted(&self, id: i64, held: i64, a: &Attempted<'_>) -> StoreResult<bool> {
        db_op!(self, "delivery_attempted", conn => {
            let n = sqlx::query(
                "UPDATE webhook_deliveries SET claimed_until = NULL, last_status = $3, last_error = $4, \
                 delivered_at = CASE WHEN $4 IS NULL THEN $2 ELSE NULL END, \
                 next_attempt_at = COALESCE($5, next_attempt_at), \
                 dead_at = CASE WHEN $6 THEN $2 ELSE NULL END WHERE id = $1 AND claimed_until = $7",
            )
            .bind(id)
            .bind(a.at)
            .bind(a.status)
            .bind(a.error)
            .bind(a.next)
            .bind(a.dead)
            .bind(held)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            Ok(n == 1)
        })
    }

    /// A webhook's deliveries, newest first, before delivery `before`.
    pub async fn deliveries(
        &self,
        webhook_id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<DeliveryRecord>> {
        type Row = (
            i64,
            i64,
            i64,
            i32,
            i64,
            Option<i64>,
            Option<i64>,
            Option<i32>,
            Option<String>,
        );
        let rows: Vec<Row> = db_op!(self, "deliveries", conn => Ok(sqlx::query_as(
            "SELECT id, event_id, created_at, attempts, next_attempt_at, delivered_at, dead_at, last_status, last_error \
             FROM webhook_deliveries WHERE webhook_id = $1 AND ($2 IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .bind(webhook_id)
        .bind(before)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows
            .into_iter()
            .map(|r| DeliveryRecord {
                id: r.0,
                event_id: r.1,
                created_at: r.2,
                attempts: r.3,
                next_attempt_at: r.4,
                delivered_at: r.5,
                dead_at: r.6,
                last_status: r.7,
                last_error: r.8,
            })
            .collect())
    }

    /// Deletes the history of deliveries that ended before `before`.
    pub async fn purge_deliveries(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_deliveries", conn => Ok(sqlx::query(
            "DELETE FROM webhook_deliveries WHERE COALESCE(delivered_at, dead_at) < $1",
        )
        .bind(before)
        .execute(&mut *conn)
        .await?
        .rows_affected()))
    }
}
