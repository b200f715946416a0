//! OAuth clients, managed from the command line.

use super::{with_db, QueryTimer, Store, StoreResult};

#[derive(Clone, Debug)]
pub struct ClientRecord {
    pub id: String,
    pub secret_hash: Vec<u8>,
    pub name: Option<String>,
    pub created_at: i64,
}

type Row = (String, Vec<u8>, Option<String>, i64);

fn client(r: Row) -> ClientRecord {
    ClientRecord {
        id: r.0,
        secret_hash: r.1,
        name: r.2,
        created_at: r.3,
    }
}

impl Store {
    pub async fn add_client(&self, c: &ClientRecord) -> StoreResult<bool> {
        let _t = QueryTimer::start("add_client");
        let n = with_db!(self, p => sqlx::query(
            "INSERT INTO clients (id, secret_hash, name, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&c.id)
        .bind(&c.secret_hash)
        .bind(&c.name)
        .bind(c.created_at)
        .execute(p)
        .await?
        .rows_affected());
        Ok(n == 1)
    }

    pub async fn client(&self, id: &str) -> StoreResult<Option<ClientRecord>> {
        let _t = QueryTimer::start("client");
        let row: Option<Row> = with_db!(self, p => sqlx::query_as(
            "SELECT id, secret_hash, name, created_at FROM clients WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(p)
        .await?);
        Ok(row.map(client))
    }

    pub async fn clients(&self) -> StoreResult<Vec<ClientRecord>> {
        let _t = QueryTimer::start("clients");
        let rows: Vec<Row> = with_db!(self, p => sqlx::query_as(
            "SELECT id, secret_hash, name, created_at FROM clients ORDER BY id",
        )
        .fetch_all(p)
        .await?);
        Ok(rows.into_iter().map(client).collect())
    }

    pub async fn remove_client(&self, id: &str) -> StoreResult<bool> {
        let _t = QueryTimer::start("remove_client");
        let n = with_db!(self, p => sqlx::query("DELETE FROM clients WHERE id = $1")
            .bind(id)
            .execute(p)
            .await?
            .rows_affected());
        Ok(n == 1)
    }
}
