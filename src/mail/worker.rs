//! Delivers the outbox. Claims a batch with a lease, delivers, deletes what
//! went out and reschedules what failed with exponential backoff. A crash
//! between delivery and delete means the message goes out again after the
//! lease (at-least-once); two instances never hold the same lease. A message
//! that cannot be delivered (a permanent SMTP failure, or temporary ones for
//! about a day) becomes a dead letter: kept, sealed, for `mail_dead_letter_ttl`
//! and counted in `latchkey_outbox_dead_total`, never retried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::lifecycle::Shutdown;

use super::{MailSink, Message, SinkError};
use crate::clock::now_ms;
use crate::crypto::Sealer;
use crate::store::Store;

/// How long a claim holds a message for its worker. A worker renews the
/// claims of its batch every [`RENEW`] while it delivers (a relay that
/// hangs holds a message up to `mail_timeout_secs`, a minute by default,
/// longer than a lease), so a claim runs out only once its worker is gone: the
/// mail of an instance killed mid-batch goes out from another within about
/// this long, not after the minute a single long lease would take.
const LEASE_MS: i64 = 15_000;
/// How often a worker renews its batch's claims (a third of the lease: a
/// renewal can fail twice before the claim runs out); also the least of a
/// claim that must be left for a message to be sent.
const RENEW_MS: i64 = 5_000;
const RENEW: Duration = Duration::from_millis(RENEW_MS.unsigned_abs());
const BATCH: i64 = 20;
const POLL: Duration = Duration::from_secs(1);
const MAX_BACKOFF_MS: i64 = 3_600_000;
/// Temporary failures before a message is given up: the backoff doubles from
/// 1 s to the hour, so this is about 20 hours of trying.
pub const MAX_ATTEMPTS: i32 = 30;

pub struct OutboxWorker {
    store: Store,
    sink: MailSink,
    sealer: Arc<Sealer>,
    from: String,
    wake: Arc<Notify>,
    /// A delivery found the relay unreachable: the first one that succeeds
    /// after it brings every backed-off message forward, so that mail queued
    /// during an outage goes out when the relay is back, not when its
    /// backoff (up to an hour) runs out. A message the relay refused for now
    /// (a 4xx reply: greylisting) does not set it, and so keeps its backoff.
    relay_failing: std::sync::atomic::AtomicBool,
    /// What a database error left unsettled, settled first thing next time.
    /// Only the worker's own task touches it (one batch at a time).
    unsettled: std::sync::Mutex<Vec<Unsettled>>,
}

/// A batch's claim value as its worker last set it.
type Held = tokio::sync::Mutex<i64>;

#[derive(Clone, Copy)]
enum Unsettled {
    /// Delivered, but its row could not be deleted: it would be sent again
    /// when its lease ends.
    Delivered(i64),
    /// Claimed (the claim's value) but not tried: it would wait out the
    /// whole lease.
    Untried(i64, i64),
}

impl OutboxWorker {
    pub fn new(store: Store, sink: MailSink, sealer: Arc<Sealer>, from: String, wake: Arc<Notify>) -> Self {
        OutboxWorker {
            store,
            sink,
            sealer,
            from,
            wake,
            relay_failing: Default::default(),
            unsettled: Default::default(),
        }
    }

    pub async fn run(self, mut shutdown: Shutdown) {
        tracing::debug!(sink = self.sink.kind(), "outbox worker started");
        metrics::counter!("latchkey_outbox_deliveries_total", "sink" => self.sink.kind()).increment(0);
        metrics::counter!("latchkey_outbox_failures_total", "sink" => self.sink.kind()).increment(0);
        metrics::counter!("latchkey_outbox_dead_total").increment(0);
        // The embedded backend is one process: a claim found at start-up was
        // left by a crash of this service, and waiting out its lease would
        // only delay the mail by up to a lease.
        if self.store.backend_name() == "sqlite" {
            match self.store.release_outbox_claims().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(messages = n, "outbox: claims left by a crash released"),
                Err(e) => tracing::warn!(error = %e, "outbox: releasing stale claims failed"),
            }
        }
        loop {
            let delivered = match self.deliver_batch().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox: claiming messages failed");
                    0
                }
            };
            if delivered as i64 == BATCH {
                continue; // more may be waiting
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.wait() => return,
            }
        }
    }

    /// Settles what an earlier database error left, one row at a time,
    /// stopping (and keeping the rest) at the first error.
    async fn settle(&self) -> anyhow::Result<()> {
        loop {
            let Some(next) = self.unsettled.lock().expect("unsettled").last().copied() else {
                return Ok(());
            };
            match next {
                Unsettled::Delivered(id) => self.store.outbox_delivered(id).await?,
                Unsettled::Untried(id, held) => self.store.release_outbox_claim(id, held).await?,
            }
            self.unsettled.lock().expect("unsettled").pop();
        }
    }

    /// Delivers one batch; returns how many were claimed.
    ///
    /// While it runs, the batch's claims are renewed every [`RENEW`]. A row
    /// whose claim was lost meanwhile (a renewal late past the lease, say
    /// while the database was slow: another instance may have claimed it)
    /// is left alone: not sent, and not settled, because it may be another
    /// instance's now. Every settlement is conditional on the claim this
    /// worker last set, so a lost row is never rescheduled or released
    /// from under its new holder.
    pub async fn deliver_batch(&self) -> anyhow::Result<usize> {
        self.settle().await?;
        let now = now_ms();
        let rows = self.store.claim_outbox(now, LEASE_MS, BATCH).await?;
        let n = rows.len();
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        // The claim's value as this worker last set it (one for the batch),
        // locked around each statement that sets or tests it, so that a
        // renewal and a settlement never cross.
        let held = Held::new(now + LEASE_MS);
        // How far the batch has got: the rows from here on are still
        // claimed (those before were settled: deleted, rescheduled or dead).
        let next = AtomicUsize::new(0);
        let lost = std::sync::Mutex::new(Vec::<i64>::new());
        let deliver = async {
            for (i, row) in rows.into_iter().enumerate() {
                next.store(i, Ordering::Relaxed);
                // Lost to a renewal, or too close to running out (renewals
                // failed) to be sent before another instance may take it.
                let lapsing = *held.lock().await - now_ms() < RENEW_MS;
                if lapsing || lost.lock().expect("lost").contains(&row.id) {
                    tracing::info!(
                        id = row.id,
                        "outbox: a claim lost or running out before its message was tried; left to run out"
                    );
                    continue;
                }
                if let Err(e) = self.deliver_one(row, &held).await {
                    // The rows after this one were claimed but not tried.
                    let claim = *held.lock().await;
                    self.unsettled
                        .lock()
                        .expect("unsettled")
                        .extend(ids[i + 1..].iter().map(|&id| Unsettled::Untried(id, claim)));
                    return Err(e);
                }
            }
            Ok(n)
        };
        // Beside the delivery, not in its way (on SQLite the renewal may
        // wait for the one connection a settlement holds).
        let renewals = async {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + RENEW, RENEW);
            loop {
                tick.tick().await;
                let mut claim = held.lock().await;
                let until = now_ms() + LEASE_MS;
                let left = &ids[next.load(Ordering::Relaxed)..];
                match self.store.extend_outbox_claims(left, *claim, until).await {
                    Ok(kept) => {
                        *claim = until;
                        // Rows settled since have no claim; the others not
                        // kept were lost.
                        lost.lock()
                            .expect("lost")
                            .extend(left.iter().filter(|id| !kept.contains(id)));
                    }
                    // Unknown whether it took: the next renewal finds out
                    // (rows it did extend then count as lost, and are left
                    // to run out: a delay, never a second send).
                    Err(e) => tracing::warn!(error = %e, "outbox: renewing the batch's claims failed"),
                }
            }
        };
        tokio::select! {
            done = deliver => done,
            _ = renewals => unreachable!("renewals run until the delivery ends"),
        }
    }

    /// Delivers `row` and settles it (`held`: the batch's claim, locked
    /// while a settlement tests it).
    async fn deliver_one(&self, row: crate::store::OutboxRow, held: &Held) -> anyhow::Result<()> {
        let Some(msg) = Message::open(&row.payload, &self.sealer) else {
            tracing::error!(
                id = row.id,
                "outbox: message cannot be unsealed (secret key changed?)"
            );
            return self.give_up(row.id, held, "cannot unseal").await;
        };
        match self
            .sink
            .deliver(&self.from, row.id, &Message::id_of(&row.payload), &msg)
            .await
        {
            Ok(()) => {
                metrics::counter!("latchkey_outbox_deliveries_total", "sink" => self.sink.kind())
                    .increment(1);
                if let Err(e) = self.store.outbox_delivered(row.id).await {
                    self.unsettled
                        .lock()
                        .expect("unsettled")
                        .push(Unsettled::Delivered(row.id));
                    return Err(e.into());
                }
                if self.relay_failing.swap(false, Ordering::Relaxed) {
                    let n = self.store.outbox_retry_now(now_ms()).await?;
                    if n > 0 {
                        tracing::info!(
                            messages = n,
                            "outbox: the relay answers again; retrying the backlog now"
                        );
                        self.wake.notify_one();
                    }
                }
            }
            Err(e) => {
                tracing::warn!(id = row.id, attempts = row.attempts, error = %e, "outbox: delivery failed");
                metrics::counter!("latchkey_outbox_failures_total", "sink" => self.sink.kind()).increment(1);
                if matches!(e, SinkError::Unreachable(_)) {
                    self.relay_failing.store(true, Ordering::Relaxed);
                }
                match &e {
                    SinkError::Temporary(why) | SinkError::Unreachable(why)
                        if row.attempts < MAX_ATTEMPTS =>
                    {
                        let backoff = (1000i64 << row.attempts.clamp(0, 22)).min(MAX_BACKOFF_MS);
                        // The lock held through the update: no renewal
                        // moves the claim meanwhile.
                        let guard = held.lock().await;
                        let claim = *guard;
                        let result = self
                            .store
                            .outbox_failed(row.id, claim, now_ms() + backoff, why)
                            .await;
                        drop(guard);
                        if let Err(e) = result {
                            self.unsettled
                                .lock()
                                .expect("unsettled")
                                .push(Unsettled::Untried(row.id, claim));
                            return Err(e.into());
                        }
                    }
                    SinkError::Temporary(why) | SinkError::Unreachable(why) | SinkError::Permanent(why) => {
                        self.give_up(row.id, held, why).await?
                    }
                }
            }
        }
        Ok(())
    }

    async fn give_up(&self, id: i64, held: &Held, why: &str) -> anyhow::Result<()> {
        tracing::error!(id, error = %why, "outbox: message undeliverable, kept as a dead letter");
        metrics::counter!("latchkey_outbox_dead_total").increment(1);
        let claim = held.lock().await;
        Ok(self.store.outbox_dead(id, *claim, now_ms(), why).await?)
    }
}
