//! OAuth clients, managed from the command line and the admin API.

use sqlx::Connection;

use super::webhooks::put_logout_hook;
use super::{db_op, Store, StoreResult};

#[derive(Clone, Debug)]
pub struct ClientRecord {
    pub id: String,
    pub secret_hash: Vec<u8>,
    pub name: Option<String>,
    pub created_at: i64,
    /// What the client may ask for in the client_credentials grant,
    /// space-separated (`latchkey:admin`); empty: nothing.
    pub scopes: String,
    /// Its settings for the authorization code flow, as JSON
    /// (`domain::oidc::client::ClientSettings`); `None`: it has none.
    pub oidc: Option<String>,
}

type Row = (String, Vec<u8>, Option<String>, i64, String, Option<String>);

fn client(r: Row) -> ClientRecord {
    ClientRecord {
        id: r.0,
        secret_hash: r.1,
        name: r.2,
        created_at: r.3,
        scopes: r.4,
        oidc: r.5,
    }
}

impl Store {
    /// Adds a client (`false`: the id is taken), with its back-channel
    /// logout webhook if it has a `logout_uri`.
    pub async fn add_client(&self, c: &ClientRecord, logout_uri: Option<&str>) -> StoreResult<bool> {
        db_op!(self, "add_client", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "INSERT INTO clients (id, secret_hash, name, created_at, scopes, oidc) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&c.id)
            .bind(&c.secret_hash)
            .bind(&c.name)
            .bind(c.created_at)
            .bind(&c.scopes)
            .bind(&c.oidc)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            put_logout_hook!(tx, &c.id, logout_uri, c.created_at);
            tx.commit().await?;
            Ok(true)
        })
    }

    pub async fn client(&self, id: &str) -> StoreResult<Option<ClientRecord>> {
        let row: Option<Row> = db_op!(self, "client", conn => Ok(sqlx::query_as(
            "SELECT id, secret_hash, name, created_at, scopes, oidc FROM clients WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(row.map(client))
    }

    pub async fn clients(&self) -> StoreResult<Vec<ClientRecord>> {
        let rows: Vec<Row> = db_op!(self, "clients", conn => Ok(sqlx::query_as(
            "SELECT id, secret_hash, name, created_at, scopes, oidc FROM clients ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows.into_iter().map(client).collect())
    }

    /// Replaces a client's settings for the authorization code flow, and
    /// its back-channel logout webhook with them; `false`: no such client.
    pub async fn set_client_oidc(
        &self,
        id: &str,
        oidc: Option<&str>,
        logout_uri: Option<&str>,
        now: i64,
    ) -> StoreResult<bool> {
        db_op!(self, "set_client_oidc", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("UPDATE clients SET oidc = $2 WHERE id = $1")
                .bind(id)
                .bind(oidc)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(false);
            }
            put_logout_hook!(tx, id, logout_uri, now);
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Removes the client `id` added at `created_at` and, in the same
    /// transaction, ends every session it holds for users and revokes its
    /// own tokens' `sid` (`client_sid`, kept in `revoked_sids` for the other
    /// instances' resync). Returns the revoked sids (the sessions' and
    /// `client_sid`), or `None` when there is no such client.
    pub async fn remove_client(
        &self,
        id: &str,
        created_at: i64,
        client_sid: &str,
        now: i64,
    ) -> StoreResult<Option<Vec<String>>> {
        db_op!(self, "remove_client", conn => {
            let mut tx = conn.begin().await?;
            let n = sqlx::query("DELETE FROM clients WHERE id = $1 AND created_at = $2")
                .bind(id)
                .bind(created_at)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if n != 1 {
                return Ok(None);
            }
            let ended: Vec<(String, String)> = sqlx::query_as(
                "UPDATE sessions SET revoked_at = $2, revoked_reason = 'client_removed' \
                 WHERE client_id = $1 AND revoked_at IS NULL RETURNING id, user_id",
            )
            .bind(id)
            .bind(now)
            .fetch_all(&mut *tx)
            .await?;
            for (sid, user) in &ended {
                let e = super::Event::new("session.ended", now).user(user).session(sid).reason("client_removed");
                super::events::record_event!(tx, &e);
            }
            // Its consents, unused codes and back-channel logout webhook
            // (the logouts just queued with it) go with it: a client added
            // again under the same id starts with none.
            put_logout_hook!(tx, id, None, now);
            sqlx::query("DELETE FROM consents WHERE client_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM authorization_codes WHERE client_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO revoked_sids (sid, revoked_at) VALUES ($1, $2) \
                 ON CONFLICT (sid) DO UPDATE SET revoked_at = excluded.revoked_at",
            )
            .bind(client_sid)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            let mut sids: Vec<String> = ended.into_iter().map(|(sid, _)| sid).collect();
            sids.push(client_sid.to_string());
            Ok(Some(sids))
        })
    }
}
