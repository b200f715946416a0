//! The mail outbox: rows are written in the transaction that causes the mail
//! and claimed by the delivery worker with a lease, so that a crash loses
//! nothing and two instances do not deliver the same message.

use super::{db_op, Store, StoreResult};

/// `$1 sealed payload, $2 now, $3 the recipient's digest ([`recipient`])`.
pub(super) const INSERT_OUTBOX: &str =
    "INSERT INTO outbox (payload, created_at, next_attempt_at, recipient) VALUES ($1, $2, $2, $3)";

/// How queued mail names its recipient: SHA-256 of the normalised address
/// (the payload itself is sealed), so that erasing an account can erase the
/// mail still waiting for it.
pub(super) fn recipient(email: &str) -> [u8; 32] {
    crate::crypto::sha256(email.as_bytes())
}

#[derive(Debug)]
pub struct OutboxRow {
    pub id: i64,
    pub payload: Vec<u8>,
    pub attempts: i32,
}

impl Store {
    /// Claims up to `limit` due messages for `lease_ms`. PostgreSQL skips rows
    /// other instances hold (`FOR UPDATE SKIP LOCKED`); SQLite has one writer.
    pub async fn claim_outbox(&self, now: i64, lease_ms: i64, limit: i64) -> StoreResult<Vec<OutboxRow>> {
        let rows: Vec<(i64, Vec<u8>, i32)> = db_op!(self, "claim_outbox",
            sqlite conn => Ok(sqlx::query_as(
                "UPDATE outbox SET claimed_until = $2, attempts = attempts + 1 WHERE id IN ( \
                 SELECT id FROM outbox WHERE dead_at IS NULL AND next_attempt_at <= $1 AND (claimed_until IS NULL OR claimed_until < $1) \
                 ORDER BY id LIMIT $3) RETURNING id, payload, attempts",
            )
            .bind(now)
            .bind(now + lease_ms)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?),
            postgres conn => Ok(sqlx::query_as(
                "UPDATE outbox SET claimed_until = $2, attempts = attempts + 1 WHERE id IN ( \
                 SELECT id FROM outbox WHERE dead_at IS NULL AND next_attempt_at <= $1 AND (claimed_until IS NULL OR claimed_until < $1) \
                 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) RETURNING id, payload, attempts",
            )
            .bind(now)
            .bind(now + lease_ms)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?),
        )?;
        let mut rows: Vec<OutboxRow> = rows
            .into_iter()
            .map(|r| OutboxRow {
                id: r.0,
                payload: r.1,
                attempts: r.2,
            })
            .collect();
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }

    /// A delivered message leaves the database (its body may carry a code).
    pub async fn outbox_delivered(&self, id: i64) -> StoreResult<()> {
        db_op!(self, "outbox_delivered", conn => {
            sqlx::query("DELETE FROM outbox WHERE id = $1").bind(id).execute(&mut *conn).await?;
            Ok(())
        })
    }

    /// Reschedules `id`, if this worker's claim (`held`) is still on it:
    /// one that ran out and was taken by another instance is theirs.
    pub async fn outbox_failed(
        &self,
        id: i64,
        held: i64,
        next_attempt_at: i64,
        error: &str,
    ) -> StoreResult<()> {
        db_op!(self, "outbox_failed", conn => {
            sqlx::query(
                "UPDATE outbox SET claimed_until = NULL, next_attempt_at = $2, last_error = $3 \
                 WHERE id = $1 AND claimed_until = $4",
            )
            .bind(id)
            .bind(next_attempt_at)
            .bind(error)
            .bind(held)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }

    /// Makes every message waiting out a backoff due now (the relay
    /// answered again); how many.
    pub async fn outbox_retry_now(&self, now: i64) -> StoreResult<u64> {
        db_op!(self, "outbox_retry_now", conn => {
            let r = sqlx::query(
                "UPDATE outbox SET next_attempt_at = $1 \
                 WHERE dead_at IS NULL AND claimed_until IS NULL AND last_error IS NOT NULL \
                 AND next_attempt_at > $1",
            )
            .bind(now)
            .execute(&mut *conn)
            .await?;
            Ok(r.rows_affected())
        })
    }

    /// Gives up on a message, if this worker's claim (`held`) is still on
    /// it: it stays, sealed, as a dead letter (for an operator to see in
    /// `last_error`) until [`Store::purge_dead_letters`].
    pub async fn outbox_dead(&self, id: i64, held: i64, now: i64, error: &str) -> StoreResult<()> {
        db_op!(self, "outbox_dead", conn => {
            sqlx::query(
                "UPDATE outbox SET claimed_until = NULL, dead_at = $2, last_error = $3 \
                 WHERE id = $1 AND claimed_until = $4",
            )
            .bind(id)
            .bind(now)
            .bind(error)
            .bind(held)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
    }

    /// Drops dead letters older than `before`.
    pub async fn purge_dead_letters(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_dead_letters", conn => {
            Ok(sqlx::query("DELETE FROM outbox WHERE dead_at < $1")
                .bind(before)
                .execute(&mut *conn)
                .await?
                .rows_affected())
        })
    }

    /// Releases this worker's claim (`held`) on `id`, if it is still on
    /// it: the message is due again at once.
    pub async fn release_outbox_claim(&self, id: i64, held: i64) -> StoreResult<()> {
        db_op!(self, "release_outbox_claim", conn => {
            sqlx::query("UPDATE outbox SET claimed_until = NULL WHERE id = $1 AND claimed_until = $2")
                .bind(id)
                .bind(held)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    }

    /// Extends this worker's claims (`held`) on `ids` to `until`; returns
    /// the ids it still held (a message settled since has no claim, and one
    /// whose claim ran out may be another instance's now).
    pub async fn extend_outbox_claims(&self, ids: &[i64], held: i64, until: i64) -> StoreResult<Vec<i64>> {
        let kept: Vec<(i64,)> = db_op!(self, "extend_outbox_claims",
            sqlite conn => Ok(sqlx::query_as(
                "UPDATE outbox SET claimed_until = $2 WHERE claimed_until = $1 \
                 AND id IN (SELECT value FROM json_each($3)) RETURNING id",
            )
            .bind(held)
            .bind(until)
            .bind(serde_json::to_string(ids).expect("ids serialize"))
            .fetch_all(&mut *conn)
            .await?),
            postgres conn => Ok(sqlx::query_as(
                "UPDATE outbox SET claimed_until = $2 WHERE claimed_until = $1 AND id = ANY($3) RETURNING id",
            )
            .bind(held)
            .bind(until)
            .bind(ids)
            .fetch_all(&mut *conn)
            .await?),
        )?;
        Ok(kept.into_iter().map(|(id,)| id).collect())
    }

    /// Releases every claim (start-up of the single-process embedded backend).
    pub async fn release_outbox_claims(&self) -> StoreResult<u64> {
        db_op!(self, "release_outbox_claims", conn => {
            Ok(sqlx::query("UPDATE outbox SET claimed_until = NULL WHERE claimed_until IS NOT NULL")
                .execute(&mut *conn)
                .await?
                .rows_affected())
        })
    }

    /// Backlog size, the creation time of the oldest message waiting, and
    /// the number of dead letters.
    pub async fn outbox_backlog(&self) -> StoreResult<(i64, Option<i64>, i64)> {
        db_op!(self, "outbox_backlog", conn => {
            Ok(sqlx::query_as(
                "SELECT COUNT(*) FILTER (WHERE dead_at IS NULL), MIN(created_at) FILTER (WHERE dead_at IS NULL), \
                 COUNT(*) FILTER (WHERE dead_at IS NOT NULL) FROM outbox",
            )
            .fetch_one(&mut *conn)
            .await?)
        })
    }
}
