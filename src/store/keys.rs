//! Signing keys. The private half is stored sealed; see `domain::tokens`.

use sqlx::Connection;

use super::{db_op, Store, StoreResult};

#[derive(Clone, Debug)]
pub struct KeyRecord {
    pub kid: String,
    pub alg: String,
    pub private_key: Vec<u8>,
    pub public_jwk: String,
    pub created_at: i64,
    pub activated_at: i64,
    pub retired_at: Option<i64>,
}

impl Store {
    pub async fn signing_keys(&self) -> StoreResult<Vec<KeyRecord>> {
        type Row = (String, String, Vec<u8>, String, i64, i64, Option<i64>);
        let rows: Vec<Row> = db_op!(self, "signing_keys", conn => Ok(sqlx::query_as(
            "SELECT kid, alg, private_key, public_jwk, created_at, activated_at, retired_at \
             FROM signing_keys ORDER BY activated_at DESC, kid DESC",
        )
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows
            .into_iter()
            .map(|r| KeyRecord {
                kid: r.0,
                alg: r.1,
                private_key: r.2,
                public_jwk: r.3,
                created_at: r.4,
                activated_at: r.5,
                retired_at: r.6,
            })
            .collect())
    }

    /// Adds a key and makes it the signer: every other key is retired at `now`.
    /// Adds a key, which replaces the active key of its algorithm; with
    /// `retire_all_but`, active keys of algorithms outside it (no longer
    /// signed with) retire too. Retired keys verify until their tokens expire.
    pub async fn add_signing_key(&self, k: &KeyRecord, retire_all_but: Option<&[&str]>) -> StoreResult<()> {
        // '' retires no other algorithm.
        let signed_with = retire_all_but.map_or(String::new(), |algs| format!(" {} ", algs.join(" ")));
        db_op!(self, "add_signing_key", conn => {
            let mut tx = conn.begin().await?;
            sqlx::query(
                "UPDATE signing_keys SET retired_at = $1 WHERE retired_at IS NULL \
                 AND (alg = $2 OR ($3 <> '' AND $3 NOT LIKE ('% ' || alg || ' %')))",
            )
            .bind(k.activated_at)
            .bind(&k.alg)
            .bind(&signed_with)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO signing_keys (kid, alg, private_key, public_jwk, created_at, activated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&k.kid)
            .bind(&k.alg)
            .bind(&k.private_key)
            .bind(&k.public_jwk)
            .bind(k.created_at)
            .bind(k.activated_at)
            .execute(&mut *tx)
            .await?;
            // The first key at start-up, or a rotation: the key id as the reason.
            super::events::record_event!(tx, &super::Event::new("key.activated", k.activated_at).reason(&k.kid));
            tx.commit().await?;
            Ok(())
        })
    }

    /// Deletes keys retired before `before` (no token they signed is still valid).
    pub async fn purge_signing_keys(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_signing_keys", conn => {
            Ok(sqlx::query("DELETE FROM signing_keys WHERE retired_at IS NOT NULL AND retired_at < $1")
                .bind(before)
                .execute(&mut *conn)
                .await?
                .rows_affected())
        })
    }

    /// The value stored under `name` in the installation table, if any.
    pub async fn installation_get(&self, name: &str) -> StoreResult<Option<Vec<u8>>> {
        let row: Option<(Vec<u8>,)> = db_op!(self, "installation_get", conn => Ok(sqlx::query_as(
            "SELECT value FROM installation WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(row.map(|r| r.0))
    }

    /// The value stored under `name` in the installation table, after
    /// storing `value` there if nothing was (the first instance decides).
    pub async fn installation_value(&self, name: &str, value: &[u8]) -> StoreResult<Vec<u8>> {
        db_op!(self, "installation_value", conn => {
            sqlx::query("INSERT INTO installation (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
                .bind(name)
                .bind(value)
                .execute(&mut *conn)
                .await?;
            let row: (Vec<u8>,) = sqlx::query_as("SELECT value FROM installation WHERE name = $1")
                .bind(name)
                .fetch_one(&mut *conn)
                .await?;
            Ok(row.0)
        })
    }
}
