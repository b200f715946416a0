//! The connection pool: sqlx's, and a hand-over of clean connections to
//! operations that are waiting for one.
//!
//! sqlx tests every connection it takes back: a spawned task sends a round
//! trip (`Sync` on PostgreSQL, a command to SQLite's worker thread) before
//! the connection is idle again. That test is how sqlx recovers a
//! connection whose operation was cancelled mid-statement, and it cannot be
//! turned off. Under load it is pure cost: the connection is wanted again
//! within microseconds, and the test was the largest single part of the
//! service's CPU in a refresh (docs/performance.md).
//!
//! An operation of [`db_op!`](super::db_op) that ran to its end (its body
//! returned `Ok`) leaves its connection clean: no statement half-written,
//! and whatever its last statement left (a `ROLLBACK` queued by a
//! transaction dropped uncommitted) is sent by sqlx before the next
//! statement, as it is by the test. That holds because a body runs its
//! statements to their end: no body races a statement against a timer or
//! another future (a `select!` or a timeout inside a body would break it).
//! Such a connection is handed straight to an operation waiting for one:
//!
//! ```text
//!   acquire ──► sqlx has one idle (and no one queued ahead),
//!               or the pool can grow? ──yes──► sqlx's acquire (its idle test, or a connect)
//!                        │ no: every connection is in use
//!                        ▼
//!               queue a hand-over slot, wait for whichever comes first:
//!               a hand-over, or a connection sqlx frees (or opens, when the
//!               pool lost one: a hand-over then leaves that connect to
//!               finish into the pool, never cancels it)
//!
//!   release ──► clean, handed on fewer than MAX_HANDOVERS times in a row,
//!               the pool open, and an operation waiting? ──yes──► hand it over (no round trip)
//!                        │ no
//!                        ▼
//!               back to sqlx (its test, its lifetime checks)
//! ```
//!
//! What stays sqlx's: the pool's size and its growth, its acquire timeout,
//! the test of a connection idle for a while (`PING_WHEN_IDLE_FOR`),
//! closing connections past their lifetime (checked when a connection goes
//! back to sqlx, at the latest after `MAX_HANDOVERS` hand-overs in a row),
//! and every connection whose operation failed or was cancelled. An
//! operation that sqlx serves while others queue for hand-overs (one that
//! came when a connection sqlx had just taken back looked idle) waits until
//! a connection goes back to sqlx: at most `MAX_HANDOVERS` operations on
//! each connection.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use sqlx::pool::PoolConnection;
use sqlx::Database;
use tokio::sync::oneshot;

/// A connection goes back to sqlx after this many hand-overs in a row, so
/// that sqlx's checks (its lifetime, its test) still reach it under a load
/// that never lets it go idle, and so that an operation in sqlx's own queue
/// (a caller of sqlx's pool, such as the tests' helpers, or one sqlx took
/// in while others queued for hand-overs) is not kept waiting by them.
const MAX_HANDOVERS: u32 = 64;

/// sqlx's pool with a queue of operations waiting for a hand-over. Derefs
/// to sqlx's pool for everything else (migrations, statistics, tests).
pub struct Pool<DB: Database> {
    sqlx: sqlx::Pool<DB>,
    waiting: Arc<Mutex<VecDeque<oneshot::Sender<Conn<DB>>>>>,
}

impl<DB: Database> Clone for Pool<DB> {
    fn clone(&self) -> Self {
        Pool {
            sqlx: self.sqlx.clone(),
            waiting: Arc::clone(&self.waiting),
        }
    }
}

impl<DB: Database> Deref for Pool<DB> {
    type Target = sqlx::Pool<DB>;

    fn deref(&self) -> &sqlx::Pool<DB> {
        &self.sqlx
    }
}

/// A connection of the pool; derefs to the database's connection, as
/// sqlx's `PoolConnection` does. Dropped, it goes back to sqlx; given to
/// [`Pool::release`] after a clean end, it may be handed over instead.
pub struct Conn<DB: Database> {
    inner: PoolConnection<DB>,
    /// Hand-overs since it last came from sqlx.
    handovers: u32,
}

impl<DB: Database> Deref for Conn<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.inner
    }
}

impl<DB: Database> DerefMut for Conn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.inner
    }
}

impl<DB: Database> Pool<DB> {
    pub fn new(sqlx: sqlx::Pool<DB>) -> Self {
        Pool {
            sqlx,
            waiting: Arc::default(),
        }
    }

    /// A connection: from sqlx while it has one idle or can open one, else
    /// the first of a connection handed over by a finished operation or one
    /// sqlx frees, within sqlx's acquire timeout.
    pub async fn acquire(&self) -> Result<Conn<DB>, sqlx::Error> {
        let from_sqlx = |inner| Conn { inner, handovers: 0 };
        let handed = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            // Slots of operations that got their connection from sqlx, or
            // were cancelled, are dropped here: the queue holds at most the
            // operations that began waiting within the oldest waiter's
            // wait (the acquire timeout), whatever happens to the database.
            while waiting.front().is_some_and(|s| s.is_closed()) {
                waiting.pop_front();
            }
            // sqlx serves it when it has an idle connection (and no one is
            // queued ahead for a hand-over), or can open one: a hand-over
            // would cancel a connect under way. So operations queue only
            // while every connection is in use.
            let idle = self.sqlx.num_idle() > 0 && waiting.is_empty();
            let can_grow = self.sqlx.size() < self.sqlx.options().get_max_connections();
            if idle || can_grow || self.sqlx.is_closed() {
                None
            } else {
                let (slot, handed) = oneshot::channel();
                waiting.push_back(slot);
                Some(handed)
            }
        };
        let Some(handed) = handed else {
            return self.sqlx.acquire().await.map(from_sqlx);
        };
        // sqlx's acquire, owned (so that it can outlive this call) and
        // counted: polled again after its first poll, it was woken, which
        // almost always means sqlx gave it its turn (else its timeout, the
        // pool's close, or a spurious wake-up); pending since, it is
        // opening a connection (the pool lost one) or testing an idle one.
        let sqlx = self.sqlx.clone();
        let mut from_pool = Box::pin(async move { sqlx.acquire().await });
        let mut polls = 0u32;
        let sqlx_turn = std::future::poll_fn(|cx| {
            polls += 1;
            from_pool.as_mut().poll(cx)
        });
        let conn = tokio::select! {
            biased;
            Ok(conn) = handed => conn,
            conn = sqlx_turn => return conn.map(from_sqlx),
        };
        if polls > 1 {
            // Cancelled, that connect would be a PostgreSQL backend forked
            // for nothing, and the next waiter sqlx wakes would start
            // another, which the next hand-over would cancel again: the
            // connection is finished and left to the pool instead.
            tokio::spawn(async move { drop(from_pool.await) });
        }
        Ok(conn)
    }

    /// Ends an operation's use of `conn`: handed to an operation waiting
    /// for one if the operation ended `clean` (its body returned `Ok`), else
    /// back to sqlx, which tests it (and closes it if the test fails).
    pub fn release(&self, conn: Conn<DB>, clean: bool) {
        if !clean || conn.handovers >= MAX_HANDOVERS || self.sqlx.is_closed() {
            return; // dropped: sqlx takes it back
        }
        let mut conn = conn;
        conn.handovers += 1;
        loop {
            let slot = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            let Some(slot) = slot else { return };
            // A slot whose operation has its connection already, or was
            // cancelled, gives the connection back: the next one may want it.
            match slot.send(conn) {
                Ok(()) => return,
                Err(back) => conn = back,
            }
        }
    }

    /// Closes a connection instead of pooling it (its state is unknown:
    /// say, a transaction that could not be rolled back).
    pub fn discard(&self, mut conn: Conn<DB>) {
        conn.inner.close_on_drop();
    }

    /// Operations waiting for a hand-over.
    #[cfg(test)]
    fn queued(&self) -> usize {
        let waiting = self.waiting.lock().unwrap();
        waiting.iter().filter(|s| !s.is_closed()).count()
    }

    /// Slots in the queue, those of operations served otherwise included.
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.waiting.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    use sqlx::{Connection, Sqlite};
    use std::str::FromStr;
    use std::time::Duration;

    /// In-memory SQLite connections, at most `max` (the embedded default
    /// has one), one of them open and idle.
    async fn connections(max: u32) -> Pool<Sqlite> {
        slow_connections(max, Duration::ZERO).await
    }

    /// The same, each connect taking `connect` longer.
    async fn slow_connections(max: u32, connect: Duration) -> Pool<Sqlite> {
        let opts = SqliteConnectOptions::from_str("sqlite::memory:").unwrap();
        let sqlx = SqlitePoolOptions::new()
            .max_connections(max)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(2))
            .after_connect(move |_, _| {
                Box::pin(async move {
                    tokio::time::sleep(connect).await;
                    Ok(())
                })
            })
            .connect_with(opts)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (n INTEGER)")
            .execute(&sqlx)
            .await
            .unwrap();
        // sqlx takes a connection back in a task of its own.
        while sqlx.num_idle() == 0 {
            tokio::task::yield_now().await;
        }
        Pool::new(sqlx)
    }

    /// An operation that takes a connection, reporting its hand-overs.
    fn waiter(pool: &Pool<Sqlite>) -> tokio::task::JoinHandle<Result<u32, sqlx::Error>> {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire().await.map(|c| c.handovers) })
    }

    async fn until_queued(pool: &Pool<Sqlite>, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pool.queued() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "never queued for a hand-over"
            );
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_clean_connection_goes_to_the_operation_waiting_for_it() {
        let pool = connections(1).await;
        let first = pool.acquire().await.unwrap();
        let next = waiter(&pool);
        until_queued(&pool, 1).await;
        pool.release(first, true);
        assert_eq!(
            next.await.unwrap().unwrap(),
            1,
            "handed over, not taken back by sqlx"
        );
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_operation_gives_its_connection_back_to_sqlx() {
        let pool = connections(1).await;
        let failed = pool.acquire().await.unwrap();
        let next = waiter(&pool);
        until_queued(&pool, 1).await;
        pool.release(failed, false);
        assert_eq!(next.await.unwrap().unwrap(), 0, "from sqlx, after its test");

        // A cancelled operation drops its connection without a release.
        let cancelled = pool.acquire().await.unwrap();
        let next = waiter(&pool);
        until_queued(&pool, 1).await;
        drop(cancelled);
        assert_eq!(next.await.unwrap().unwrap(), 0, "from sqlx, after its test");
    }

    #[tokio::test]
    async fn with_no_one_waiting_a_connection_goes_back_to_sqlx() {
        let pool = connections(1).await;
        let conn = pool.acquire().await.unwrap();
        pool.release(conn, true);
        // sqlx has it again: a caller of sqlx's own pool gets it.
        let direct = tokio::time::timeout(Duration::from_secs(1), pool.sqlx.acquire()).await;
        assert!(direct.is_ok_and(|c| c.is_ok()));
    }

    #[tokio::test]
    async fn while_the_pool_can_grow_a_waiter_opens_a_connection_instead_of_queueing() {
        let pool = connections(2).await;
        let first = pool.acquire().await.unwrap();
        let next = waiter(&pool);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(pool.slots(), 0);
        // A hand-over now would cancel the connect under way.
        pool.release(first, true);
        assert_eq!(next.await.unwrap().unwrap(), 0);
        assert_eq!(pool.sqlx.size(), 2);
    }

    #[tokio::test]
    async fn a_hand_over_never_cancels_the_connect_sqlx_started_for_its_waiter() {
        let pool = slow_connections(2, Duration::from_millis(300)).await;
        let first = pool.acquire().await.unwrap();
        let mut second = pool.acquire().await.unwrap();
        assert_eq!(pool.sqlx.size(), 2);
        let next = waiter(&pool);
        until_queued(&pool, 1).await;
        // The pool loses a connection: sqlx gives the waiter its turn, and
        // the waiter starts opening a new one, which takes 300 ms.
        second.inner.close_on_drop();
        drop(second);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A hand-over comes before the connect ends.
        pool.release(first, true);
        assert_eq!(next.await.unwrap().unwrap(), 1);
        // The connect was finished, not cancelled: the pool is whole again.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while pool.sqlx.size() < 2 {
            assert!(std::time::Instant::now() < deadline, "the pool stayed one short");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_connection_returns_to_sqlx_after_max_handovers() {
        let pool = connections(1).await;
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("INSERT INTO t VALUES (7)")
            .execute(&mut *conn)
            .await
            .unwrap();
        for n in 1..=MAX_HANDOVERS + 1 {
            let next = {
                let pool = pool.clone();
                tokio::spawn(async move { pool.acquire().await })
            };
            until_queued(&pool, 1).await;
            pool.release(conn, true);
            conn = next.await.unwrap().unwrap();
            // The same connection each time: SQLite's in-memory database is
            // per connection, and this one holds the row written above.
            let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t WHERE n = 7")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(rows, 1);
            let expected = if n <= MAX_HANDOVERS { n } else { 0 };
            assert_eq!(conn.handovers, expected, "after {n} releases");
        }
        assert!(conn.ping().await.is_ok());
    }

    #[tokio::test]
    async fn slots_of_operations_served_by_sqlx_do_not_pile_up() {
        let pool = connections(1).await;
        for _ in 0..100 {
            let held = pool.acquire().await.unwrap();
            let next = waiter(&pool);
            until_queued(&pool, 1).await;
            // Back to sqlx: the waiter is served by sqlx and leaves its slot.
            drop(held);
            next.await.unwrap().unwrap();
        }
        assert!(pool.slots() <= 2, "{} slots queued", pool.slots());
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_passes_the_connection_to_the_next() {
        let pool = connections(1).await;
        let held = pool.acquire().await.unwrap();
        let gave_up = waiter(&pool);
        until_queued(&pool, 1).await;
        let next = waiter(&pool);
        until_queued(&pool, 2).await;
        gave_up.abort();
        let _ = gave_up.await;
        pool.release(held, true);
        // The first slot is dead: the connection goes to the second.
        assert_eq!(next.await.unwrap().unwrap(), 1);
    }

    #[tokio::test]
    async fn a_closed_pool_hands_nothing_over() {
        let pool = connections(1).await;
        let held = pool.acquire().await.unwrap();
        let next = waiter(&pool);
        until_queued(&pool, 1).await;
        // Closed, and the release comes before the waiter runs again (one
        // thread, no yield in between): it must not hand the connection on.
        let mut closing = Box::pin(pool.sqlx.close());
        tokio::select! {
            biased;
            _ = &mut closing => unreachable!("a connection is still out"),
            _ = std::future::ready(()) => {}
        }
        assert!(pool.sqlx.is_closed());
        pool.release(held, true);
        assert!(matches!(next.await.unwrap(), Err(sqlx::Error::PoolClosed)));
        closing.await;
    }
}
