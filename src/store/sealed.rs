//! The values kept sealed under the master secret, for `latchkey secret
//! rotate` (`app::keyring`): read each, and replace it only if it is still
//! what was read. The database's record of the keyring is here too.

use sqlx::Connection;

use super::events::record_event;
use super::{db_op, Event, Store, StoreResult};

/// A column of sealed values, with the key of its rows. Their associated
/// data is the domain's (`app::keyring` says which is which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealedColumn {
    /// Queued mail (`outbox.payload`).
    Outbox,
    /// Webhooks' and back-channel logout URIs' signing secrets.
    Webhooks,
    /// Private signing keys.
    SigningKeys,
    /// TOTP secrets (a passkey has none).
    Factors,
    /// Upstream providers' client secrets.
    Upstreams,
}

impl SealedColumn {
    pub const ALL: [SealedColumn; 5] = [
        SealedColumn::Outbox,
        SealedColumn::Webhooks,
        SealedColumn::SigningKeys,
        SealedColumn::Factors,
        SealedColumn::Upstreams,
    ];

    /// The statements' table, key and column: fixed names, never input.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            SealedColumn::Outbox => ("outbox", "id", "payload"),
            SealedColumn::Webhooks => ("webhooks", "id", "secret"),
            SealedColumn::SigningKeys => ("signing_keys", "kid", "private_key"),
            SealedColumn::Factors => ("factors", "id", "secret"),
            SealedColumn::Upstreams => ("upstreams", "name", "client_secret"),
        }
    }

    /// The key as it is read (text), and the parameter `$2` as it is
    /// matched: the outbox's key is a number, read as text and matched as
    /// a number (so that its index is used).
    fn key_forms(self) -> (&'static str, &'static str) {
        match self {
            SealedColumn::Outbox => ("CAST(id AS TEXT)", "CAST($2 AS BIGINT)"),
            _ => (self.names().1, "$2"),
        }
    }

    pub fn name(self) -> &'static str {
        self.names().0
    }
}

/// What the database records of the keyring (`app::keyring`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyringRecord {
    /// The current secret's check value; `None` before the first start.
    pub current: Option<Vec<u8>>,
    /// The previous secrets' check values, 32 bytes each, sorted.
    pub previous: Vec<u8>,
    /// The retired secrets' keys, sealed (`crypto::RetiredMacKeys`).
    pub retired: Option<Vec<u8>>,
}

impl Store {
    /// Every sealed value of `column`, with its row's key.
    pub async fn sealed_values(&self, column: SealedColumn) -> StoreResult<Vec<(String, Vec<u8>)>> {
        let (table, _, col) = column.names();
        let (key, _) = column.key_forms();
        let sql = format!("SELECT {key}, {col} FROM {table} WHERE {col} IS NOT NULL ORDER BY 1");
        db_op!(self, "sealed_values", conn => Ok(sqlx::query_as(&sql).fetch_all(&mut *conn).await?))
    }

    /// Replaces the value of `column` in the row `key` with `new`, if it
    /// is still `old`: a value changed meanwhile (a factor removed, mail
    /// sent) is left alone. Whether it was replaced.
    pub async fn replace_sealed(
        &self,
        column: SealedColumn,
        key: &str,
        old: &[u8],
        new: &[u8],
    ) -> StoreResult<bool> {
        let (table, key_column, col) = column.names();
        let (_, param) = column.key_forms();
        let sql = format!("UPDATE {table} SET {col} = $1 WHERE {key_column} = {param} AND {col} = $3");
        let n = db_op!(self, "replace_sealed", conn => Ok(sqlx::query(&sql)
            .bind(new)
            .bind(key)
            .bind(old)
            .execute(&mut *conn)
            .await?
            .rows_affected()))?;
        Ok(n == 1)
    }

    pub async fn keyring_record(&self) -> StoreResult<KeyringRecord> {
        let rows: Vec<(String, Vec<u8>)> = db_op!(self, "keyring_record", conn => Ok(sqlx::query_as(
            "SELECT name, value FROM installation \
             WHERE name IN ('secret_check', 'previous_secret_checks', 'retired_secret_keys')",
        )
        .fetch_all(&mut *conn)
        .await?))?;
        let mut record = KeyringRecord::default();
        for (name, value) in rows {
            match name.as_str() {
                "secret_check" => record.current = Some(value),
                "previous_secret_checks" => record.previous = value,
                _ => record.retired = Some(value),
            }
        }
        Ok(record)
    }

    /// Records a keyring in one transaction, with the event `kind`
    /// (`master_secret.rotated` or `master_secret.retired`), if the
    /// recorded current secret is still `was` (`false`: another command
    /// changed it meanwhile, and nothing was written).
    pub async fn record_keyring(
        &self,
        was: &[u8],
        record: &KeyringRecord,
        kind: &'static str,
        now: i64,
    ) -> StoreResult<bool> {
        let current = record.current.as_deref().unwrap_or_default();
        let retired = record.retired.as_deref();
        db_op!(self, "record_keyring", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("UPDATE installation SET value = $1 WHERE name = 'secret_check' AND value = $2")
                .bind(current)
                .bind(was)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            for (name, value) in [
                ("previous_secret_checks", Some(record.previous.as_slice())),
                ("retired_secret_keys", retired),
            ] {
                let Some(value) = value else { continue };
                sqlx::query(
                    "INSERT INTO installation (name, value) VALUES ($1, $2) \
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                )
                .bind(name)
                .bind(value)
                .execute(&mut *tx)
                .await?;
            }
            record_event!(tx, &Event::new(kind, now).actor("cli"));
            tx.commit().await?;
            Ok(true)
        })
    }
}
