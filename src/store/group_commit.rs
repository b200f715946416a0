//! SQLite's refresh exchanges, committed together.
//!
//! SQLite has one writer and the embedded backend one connection, so every
//! refresh waits for that connection, and each exchange on its own is a
//! commit of its own (its WAL frames written, the connection handed to the
//! next waiting operation across threads). Exchanges that arrive while
//! others are being written wait in a queue instead; whoever finds no
//! writer running starts one, which takes what has queued (up to `MAX`) and
//! writes it in one transaction, in one trip to SQLite's worker thread:
//!
//! ```text
//!   refresh ──push──▶ queue ──(no writer running: start one)──▶ writer task
//!      ▲                                                          │ BEGIN; exchange 1; record 1; ...;
//!      │                                                          │ exchange n; record n; COMMIT
//!      └───────────── its own record, and whether it won ◀────────┘ (then the next batch, if any)
//! ```
//!
//! Each exchange is the single-token one (`rotate_live_refresh`), with its
//! own parameters and a column naming its item, so every caller gets back
//! exactly what it would have got alone; exchanges of one token in one batch
//! are ordered, and only the first wins. The writer is a task of its own, so
//! a request that goes away cannot leave a transaction half written. A
//! batch whose statement fails is rolled back and each exchange of it is
//! written alone, so that one failing item fails only itself. PostgreSQL
//! needs none of this: its connections write concurrently, and the server
//! groups commits itself.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::oneshot;

use super::pool::Pool;
use super::sessions::{LiveRotation, Rotated};
use super::{acquire, traced, StoreError, StoreResult};

/// The most exchanges one transaction carries (six parameters each).
const MAX: usize = 64;

type Reply = oneshot::Sender<StoreResult<Option<Rotated>>>;

#[derive(Default)]
struct Queue {
    /// Each exchange with its caller's reply and when it was queued.
    waiting: Vec<(LiveRotation, Reply, Instant)>,
    writing: bool,
}

/// The queue of one SQLite store's exchanges.
#[derive(Clone, Default)]
pub(super) struct GroupCommit {
    queue: Arc<Mutex<Queue>>,
}

/// The writer's hold on the queue. Made before the writer is spawned and
/// moved into it, so that however the writer ends (its queue empty, a
/// panic, its runtime shutting down under it, even before its first poll)
/// the next exchange starts a writer again. Exchanges still queued when a
/// writer ends early are dropped unwritten: their callers answer that the
/// database is unavailable, and their tokens stay as they were.
struct Writing(Option<Arc<Mutex<Queue>>>);

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(queue) = self.0.take() {
            let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
            q.writing = false;
            q.waiting.clear();
        }
    }
}

impl GroupCommit {
    /// Queues `x` and waits for its outcome.
    pub async fn exchange(&self, pool: &Pool<sqlx::Sqlite>, x: LiveRotation) -> StoreResult<Option<Rotated>> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.waiting.push((x, tx, Instant::now()));
            !std::mem::replace(&mut q.writing, true)
        };
        if start {
            tokio::spawn(writer(Writing(Some(self.queue.clone())), pool.clone()));
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))
    }
}

/// Writes batches until the queue is empty. The look that finds it empty
/// and the end of `writing` are one step under the lock, so an exchange
/// queued after it starts a writer of its own. An exchange whose caller
/// has gone (its request cancelled, or past its deadline) is dropped
/// unwritten: written, it would exchange a token its client still holds,
/// and that client's next refresh, after the grace window, would read as
/// reuse and end the session.
///
/// Each batch records its size (`latchkey_db_group_commit_batch_size`) and
/// how long each of its exchanges waited in the queue
/// (`latchkey_db_group_commit_wait_seconds`): with the one connection busy,
/// refreshes wait here, not for the pool.
async fn writer(mut writing: Writing, pool: Pool<sqlx::Sqlite>) {
    let Some(queue) = writing.0.clone() else { return };
    loop {
        let batch: Vec<_> = {
            let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
            q.waiting.retain(|(_, reply, _)| !reply.is_closed());
            if q.waiting.is_empty() {
                q.writing = false;
                writing.0 = None;
                return;
            }
            let n = batch_size(q.waiting.len());
            let started = Instant::now();
            q.waiting
                .drain(..n)
                .map(|(x, reply, queued)| {
                    metrics::histogram!("latchkey_db_group_commit_wait_seconds")
                        .record(started.duration_since(queued).as_secs_f64());
                    (x, reply)
                })
                .collect()
        };
        metrics::histogram!("latchkey_db_group_commit_batch_size").record(batch.len() as f64);
        write(&pool, batch).await;
    }
}

/// A batch takes a power of two of the queued exchanges, at most `MAX`: few
/// texts of SQL, so few prepared statements in sqlx's cache (the rest wait
/// for the next batch).
fn batch_size(queued: usize) -> usize {
    let n = queued.min(MAX);
    if n == 0 {
        0
    } else {
        1 << n.ilog2()
    }
}

/// Writes `batch` in one transaction (or alone, when it is one exchange),
/// and answers each caller. A batch whose statements failed is rolled back
/// and written one exchange at a time, so that an exchange that fails fails
/// only itself; a failure to reach the database at all (no connection in
/// time, the pool closed, the connection lost) is every caller's answer at
/// once, with no retries queued behind it.
async fn write(pool: &Pool<sqlx::Sqlite>, batch: Vec<(LiveRotation, Reply)>) {
    if batch.len() > 1 {
        let exchanges: Vec<&LiveRotation> = batch.iter().map(|(x, _)| x).collect();
        match together(pool, &exchanges).await {
            Ok(rows) => {
                let mut answers: Vec<Option<Rotated>> = batch.iter().map(|_| None).collect();
                for (item, row) in rows {
                    if let Some(a) = usize::try_from(item).ok().and_then(|i| answers.get_mut(i)) {
                        *a = Some(row);
                    }
                }
                for ((_, reply), answer) in batch.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
                return;
            }
            Err(e @ (StoreError::Overloaded | StoreError::Unavailable(_))) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(again(&e)));
                }
                return;
            }
            // A full disk may still take a smaller write: one at a time.
            Err(StoreError::Database(_) | StoreError::StorageFull(_)) => {}
        }
    }
    let mut unreachable = None;
    for (x, reply) in batch {
        if reply.is_closed() {
            continue;
        }
        let out = match &unreachable {
            Some(e) => Err(again(e)),
            None => one(pool, &x).await,
        };
        if let Err(e @ (StoreError::Overloaded | StoreError::Unavailable(_))) = &out {
            unreachable.get_or_insert(again(e));
        }
        let _ = reply.send(out);
    }
}

/// The same failure again, for another caller.
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Overloaded => StoreError::Overloaded,
        _ => StoreError::Unavailable(sqlx::Error::PoolClosed),
    }
}

/// One exchange, alone: `rotate_live_refresh`'s SQLite statements.
async fn one(pool: &Pool<sqlx::Sqlite>, x: &LiveRotation) -> StoreResult<Option<Rotated>> {
    traced("rotate_live_refresh", async {
        let mut conn = acquire(pool).await?;
        let out = bind(sqlx::query_as::<_, Item>(sql(1)), x)
            .fetch_optional(&mut *conn)
            .await
            .map(|row| row.map(|r| r.rotated))
            .map_err(StoreError::from);
        pool.release(conn, out.is_ok());
        out
    })
    .await
}

/// Several exchanges in one transaction: each exchanged record with its
/// item's index. On an error the transaction is rolled back (or, if even
/// that fails, the connection is closed rather than pooled mid-transaction).
async fn together(pool: &Pool<sqlx::Sqlite>, batch: &[&LiveRotation]) -> StoreResult<Vec<(i64, Rotated)>> {
    traced("rotate_live_refresh_batch", async {
        let mut conn = acquire(pool).await?;
        let mut q = sqlx::query_as::<_, Item>(sql(batch.len()));
        for x in batch {
            q = bind(q, x);
        }
        match q.fetch_all(&mut *conn).await {
            Ok(rows) => {
                pool.release(conn, true);
                Ok(rows.into_iter().map(|r| (r.item, r.rotated)).collect())
            }
            Err(e) => {
                // SQLite may have ended the transaction itself (or not have
                // begun it, `BEGIN` being what failed): then there is
                // nothing to roll back, and the connection is fine.
                match sqlx::query("ROLLBACK").execute(&mut *conn).await {
                    Err(r) if !r.to_string().contains("no transaction is active") => pool.discard(conn),
                    _ => pool.release(conn, false),
                }
                Err(StoreError::from(e))
            }
        }
    })
    .await
}

/// An exchanged record and the index of its item in the batch.
#[derive(sqlx::FromRow)]
struct Item {
    item: i64,
    #[sqlx(flatten)]
    rotated: Rotated,
}

type Query<'q> = sqlx::query::QueryAs<'q, sqlx::Sqlite, Item, sqlx::sqlite::SqliteArguments<'q>>;

fn bind<'q>(q: Query<'q>, x: &'q LiveRotation) -> Query<'q> {
    q.bind(&x.old[..])
        .bind(x.now)
        .bind(x.successor.as_slice())
        .bind(&x.new[..])
        .bind(x.session_id.as_str())
        .bind(x.client_id.as_deref())
}

/// The SQL of `n` exchanges: exchange `k` (from 0) takes parameters
/// `$6k+1` to `$6k+6` (the old token's hash, now, the sealed successor, the
/// new token's hash, the session, the client) and answers with `k AS item`.
/// One text per `n`, made once (sqlx caches the prepared statements by it).
fn sql(n: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<OnceLock<String>>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| (0..MAX).map(|_| OnceLock::new()).collect());
    texts[n - 1].get_or_init(|| {
        let items: String = (0..n).map(exchange_sql).collect();
        if n == 1 {
            items
        } else {
            format!("BEGIN IMMEDIATE; {items} COMMIT;")
        }
    })
}

fn exchange_sql(k: usize) -> String {
    let p = |i: usize| format!("${}", 6 * k + i);
    let (old, now, successor, new, session, client) = (p(1), p(2), p(3), p(4), p(5), p(6));
    // The exchange of `rotate_refresh`, under the conditions of
    // `rotate_live_refresh` (store/sessions.rs), then the record as it is
    // now, with whether this exchange's successor is on it.
    format!(
        "WITH live AS (SELECT r.token_hash, r.session_id, r.created_at \
         FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id JOIN users u ON u.id = s.user_id \
         WHERE r.token_hash = {old} AND r.rotated_at IS NULL AND s.id = {session} AND s.client_id IS {client} \
         AND s.revoked_at IS NULL AND u.disabled_at IS NULL AND s.expires_at > {now} \
         AND NOT EXISTS (SELECT 1 FROM refresh_tokens WHERE token_hash = {new})) \
         INSERT INTO refresh_tokens (token_hash, session_id, created_at, rotated_at, successor) \
         SELECT {new}, session_id, {now}, NULL, NULL FROM live WHERE true \
         UNION ALL SELECT token_hash, session_id, created_at, {now}, {successor} FROM live WHERE true \
         ON CONFLICT (token_hash) DO UPDATE SET rotated_at = excluded.rotated_at, successor = excluded.successor \
         WHERE refresh_tokens.token_hash = {old} AND refresh_tokens.rotated_at IS NULL; \
         SELECT {k} AS item, {columns}, COALESCE(r.rotated_at = {now} AND r.successor = {successor}, 0) AS rotated \
         FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id JOIN users u ON u.id = s.user_id \
         WHERE r.token_hash = {old}; ",
        columns = super::sessions::REFRESH_COLUMNS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_exchange_has_parameters_of_its_own_and_a_batch_is_one_transaction() {
        assert!(!sql(1).contains("BEGIN"));
        assert!(sql(1).contains("$6") && !sql(1).contains("$7"));
        let three = sql(3);
        assert!(three.starts_with("BEGIN IMMEDIATE;") && three.trim_end().ends_with("COMMIT;"));
        assert!(three.contains("$18") && !three.contains("$19"));
        assert!(three.contains("SELECT 2 AS item"));
        assert!(std::ptr::eq(sql(3), three), "made once");
        assert_eq!(sql(MAX).matches("AS item").count(), MAX);
    }

    #[test]
    fn batches_take_powers_of_two_up_to_the_maximum() {
        let sizes: Vec<usize> = [0, 1, 2, 3, 5, 8, 63, 64, 65, 1000].map(batch_size).to_vec();
        assert_eq!(sizes, [0, 1, 2, 2, 4, 8, 32, 64, 64, 64]);
    }
}
