//! OAuth clients, managed from the command line.

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
}

type Row = (String, Vec<u8>, Option<String>, i64, String);

fn client(r: Row) -> ClientRecord {
    ClientRecord {
        id: r.0,
        secret_hash: r.1,
        name: r.2,
        created_at: r.3,
        scopes: r.4,
    }
}

impl Store {
    pub async fn add_client(&self, c: &ClientRecord) -> StoreResult<bool> {
        let n = db_op!(self, "add_client", conn => Ok(sqlx::query(
            "INSERT INTO clients (id, secret_hash, name, created_at, scopes) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&c.id)
        .bind(&c.secret_hash)
        .bind(&c.name)
        .bind(c.created_at)
        .bind(&c.scopes)
        .execute(&mut *conn)
        .await?
        .rows_affected()))?;
        Ok(n == 1)
    }

    pub async fn client(&self, id: &str) -> StoreResult<Option<ClientRecord>> {
        let row: Option<Row> = db_op!(self, "client", conn => Ok(sqlx::query_as(
            "SELECT id, secret_hash, name, created_at, scopes FROM clients WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?))?;
        Ok(row.map(client))
    }

    pub async fn clients(&self) -> StoreResult<Vec<ClientRecord>> {
        let rows: Vec<Row> = db_op!(self, "clients", conn => Ok(sqlx::query_as(
            "SELECT id, secret_hash, name, created_at, scopes FROM clients ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows.into_iter().map(client).collect())
    }

    pub async fn remove_client(&self, id: &str) -> StoreResult<bool> {
        let n = db_op!(self, "remove_client", conn => {
            Ok(sqlx::query("DELETE FROM clients WHERE id = $1")
                .bind(id)
                .execute(&mut *conn)
                .await?
                .rows_affected())
        })?;
        Ok(n == 1)
    }
}
