//! Checks that share a Redis call: every check that has to ask Redis (a key
//! without a lease) goes through one task per limiter, which sends what has
//! queued up as ONE script call over all of those buckets. Up to
//! `MAX_IN_FLIGHT` calls are in flight at once; while they all are, checks
//! queue up and the next call takes them together.
//!
//! ```text
//!   request ─┐                       ┌─> reply (granted, retry, reset)
//!   request ─┼─> queue ─> batcher ───┼─> reply
//!   request ─┘   (fills while every  └─> reply
//!                 call is in flight)
//!                  │        ▲
//!                  ▼        │
//!        EVALSHA gcra N k1..kN a1..a3N  (one atomic script, one round trip)
//! ```
//!
//! Nothing about a bucket changes: the script runs the same GCRA step for
//! each key in turn, atomically, with Redis's clock, so the answers are the
//! ones N separate calls would have given in that order. What changes is
//! the cost: a key seen once (100,000 distinct clients) used to be a round
//! trip of its own, with its own syscalls, wake-ups and script call in
//! Redis; now a busy instance pays one round trip for everything that
//! arrived while its calls were in flight. An idle instance pays what it did.
//!
//! A Redis Cluster runs a script on one slot only, so a batch is split by
//! slot and its groups are sent at once, as one of the calls in flight (cold
//! keys of distinct clients are in distinct slots: a cluster gains little,
//! and a slow node holds up one call, not the queue).
//!
//! A lease renewal (see `lease`) waits in a list of its own: no request
//! waits for it, and only the first of a gathering wakes the batcher.
//! Renewals go with the next call for checks, or on their own once the
//! first has waited `RENEWAL_GATHER` and another call is free for checks;
//! one queued for `lease::RENEW_WAIT` is dropped unsent.
//!
//! Each caller waits at most [`REDIS_COMMAND_TIMEOUT`] from the moment it queued,
//! then takes its policy's fallback, as a failed command does; a batch that
//! answers later gives its answer to no one.

use redis::cluster_routing::get_slot;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::lease::Leases;
use crate::cache::{RedisHandle, REDIS_COMMAND_TIMEOUT};

/// Most buckets in one script call.
const MAX_BATCH: usize = 128;
/// Most script calls of one limiter in flight at once.
const MAX_IN_FLIGHT: usize = 4;
/// How long queued lease renewals wait for more to join them when no check
/// takes them along (no request waits for a renewal: a lease is renewed
/// with half its life left, half a sixteenth of the policy's window,
/// seconds under the default policies), so that renewals spread over time
/// still share calls.
const RENEWAL_GATHER: std::time::Duration = std::time::Duration::from_millis(2);

/// GCRA in Redis, with Redis's clock so that instances agree, for every
/// bucket of the call. KEYS are the buckets; for the i-th key, ARGV[3i-2]
/// is the emission interval (window / limit) and ARGV[3i-1] the window, in
/// microseconds (so that limits above 1,000 per second per key stay exact),
/// and ARGV[3i] how many tokens the caller would like (a lease, at most
/// `lease::MAX_LEASE`), of which it grants `lease::grant(want, room)`: at
/// most a sixteenth of the room left, at least one. Returns, per key,
/// `granted, retry_after_us, reset_us` (granted 0: refused), flat.
const GCRA_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i = 1, #KEYS do
  local interval = tonumber(ARGV[3 * i - 2])
  local window = tonumber(ARGV[3 * i - 1])
  local want = tonumber(ARGV[3 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  local room = math.floor((now + window - tat) / interval)
  if room < 1 then
    out[3 * i - 2] = 0
    out[3 * i - 1] = tat + interval - window - now
    out[3 * i] = tat - now
  else
    local grant = math.floor(room / 16)
    if grant > want then grant = want end
    if grant < 1 then grant = 1 end
    local new_tat = tat + grant * interval
    redis.call('SET', KEYS[i], new_tat, 'PX', math.max(1, math.ceil((new_tat - now) / 1000)))
    out[3 * i - 2] = grant
    out[3 * i - 1] = 0
    out[3 * i] = new_tat - now
  end
end
return out
"#;

/// One bucket's question: its full Redis key, the policy's interval and
/// window (microseconds) and the tokens wanted.
pub(super) struct Ask {
    pub bucket: String,
    pub interval_us: i64,
    pub window_us: i64,
    pub want: u32,
}

/// Redis's answer for one bucket: `(granted, retry_after_us, reset_us)`,
/// or why there is none (the caller's fallback applies).
pub(super) type Answer = Result<(i64, i64, i64), String>;

/// A lease renewal: whose lease, and how long the new one lives (see
/// `lease::Take::Renew`).
pub(super) struct Renewal {
    pub policy: &'static str,
    pub key: Box<str>,
    pub ttl: i64,
    /// When it was asked for (`super::now_us`): its stamp in the leases.
    pub asked: i64,
}

/// Who is waiting for a bucket's answer: a check, or no one (a renewal,
/// recorded in the leases when it comes).
enum Reply {
    Caller(oneshot::Sender<Answer>),
    Renewal(Renewal),
}

struct Pending {
    ask: Ask,
    reply: Reply,
}

impl Pending {
    /// Gives the answer to its caller, or records a renewal's in `leases`.
    fn answer(self, a: Answer, leases: &Leases) {
        match self.reply {
            Reply::Caller(tx) => {
                let _ = tx.send(a);
            }
            Reply::Renewal(r) => {
                let want = i64::from(self.ask.want.max(1));
                let granted = a.ok().map(|(g, _, _)| u32::try_from(g.min(want)).unwrap_or(0));
                leases.renewed(r.policy, &r.key, super::now_us(), r.ttl, r.asked, granted);
            }
        }
    }

    /// A renewal asked for `RENEW_WAIT` ago or more (see `lease`).
    fn stale(&self, now: i64) -> bool {
        matches!(&self.reply, Reply::Renewal(r) if now - r.asked >= super::lease::RENEW_WAIT)
    }

    /// A caller that gave up (timed out, or its request was dropped).
    fn abandoned(&self) -> bool {
        matches!(&self.reply, Reply::Caller(tx) if tx.is_closed())
    }
}

/// What goes into the batcher's queue: a check that waits for its answer,
/// or word that renewals have started to queue (they wait in a list of
/// their own, so that queueing one wakes no one).
enum Msg {
    Check(Pending),
    RenewalsQueued,
}

/// Most renewals waiting for a call; past it a renewal is dropped (the key
/// asks when its lease runs out, as without renewals). Checks need no such
/// bound: each is a request waiting, and requests are bounded where they
/// come in.
const MAX_RENEWALS_QUEUED: usize = 4 * MAX_IN_FLIGHT * MAX_BATCH;

type Renewals = Arc<std::sync::Mutex<Vec<Pending>>>;

/// The queue into one limiter's batcher task, started on first use on the
/// runtime of the caller (the gateway's serving threads each have their
/// own limiter, connection and runtime), and started again, on the
/// caller's runtime, if it has stopped (its runtime shut down): a limiter
/// never falls back for good because a task died.
pub(super) struct Batcher {
    redis: RedisHandle,
    queue: std::sync::Mutex<Option<mpsc::UnboundedSender<Msg>>>,
    renewals: Renewals,
    /// The limiter's leases, where renewals' answers go.
    leases: Arc<Leases>,
}

impl Batcher {
    pub fn new(redis: RedisHandle, leases: Arc<Leases>) -> Batcher {
        Batcher {
            redis,
            queue: std::sync::Mutex::new(None),
            renewals: Default::default(),
            leases,
        }
    }

    pub fn redis(&self) -> &RedisHandle {
        &self.redis
    }

    /// Asks Redis about one bucket, in the next batch.
    pub async fn ask(&self, ask: Ask) -> Answer {
        let (reply, answer) = oneshot::channel();
        let check = Pending {
            ask,
            reply: Reply::Caller(reply),
        };
        if self.send(Msg::Check(check)).is_err() {
            return Err("the rate-limit batcher cannot be started".into());
        }
        // The request's trace shows its wait as the Redis call it is.
        let wait = tokio::time::timeout(REDIS_COMMAND_TIMEOUT, answer)
            .instrument(tracing::debug_span!("redis", op = "ratelimit"));
        match wait.await {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => Err("the rate-limit batcher dropped the check".into()),
            Err(_) => Err("redis: timed out".into()),
        }
    }

    /// Asks Redis for a lease's renewal in a coming batch, without waiting:
    /// the answer goes to `renewal`'s leases.
    pub fn renew(&self, ask: Ask, renewal: Renewal) {
        let pending = Pending {
            ask,
            reply: Reply::Renewal(renewal),
        };
        let first = {
            let mut queued = self.renewals.lock().expect("renewals lock");
            if queued.len() >= MAX_RENEWALS_QUEUED {
                // Dropped: the key may ask again once `RENEW_WAIT` is over,
                // not at once (no churn while the queue is full).
                return;
            }
            queued.push(pending);
            queued.len() == 1
        };
        if first && self.send(Msg::RenewalsQueued).is_err() {
            let stranded = std::mem::take(&mut *self.renewals.lock().expect("renewals lock"));
            for p in stranded {
                p.answer(
                    Err("the rate-limit batcher cannot be started".into()),
                    &self.leases,
                );
            }
        }
    }

    /// Into the batcher's queue; a batcher that has stopped (or was never
    /// started) is started on the caller's runtime first. `Err` only
    /// outside a runtime.
    fn send(&self, msg: Msg) -> Result<(), Msg> {
        let mut queue = self.queue.lock().expect("batcher queue lock");
        let msg = match queue.as_ref() {
            Some(tx) => match tx.send(msg) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(msg)) => {
                    tracing::warn!("the rate-limit batcher had stopped; starting it again");
                    msg
                }
            },
            None => msg,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(msg);
        };
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(
            self.redis.clone(),
            rx,
            self.renewals.clone(),
            self.leases.clone(),
        ));
        // Renewals left queued by a batcher that stopped go with the first call.
        let stranded = !self.renewals.lock().expect("renewals lock").is_empty();
        if stranded && !matches!(msg, Msg::RenewalsQueued) {
            let _ = tx.send(Msg::RenewalsQueued);
        }
        let sent = tx.send(msg).map_err(|mpsc::error::SendError(m)| m);
        *queue = Some(tx);
        sent
    }
}

/// The batcher: takes the checks that have queued (at least one) as soon as
/// one of [`MAX_IN_FLIGHT`] calls is free, with the renewals queued so far,
/// sends them, and again; renewals alone go once the first of them has
/// waited [`RENEWAL_GATHER`]. It ends when its limiter (the sender) is gone.
/// Several calls in flight, so that a caller that queued behind a slow call
/// does not wait for it first (each caller has the one command timeout in
/// all); while they are all busy, the queue fills and the next call takes
/// it whole.
async fn run(
    redis: RedisHandle,
    mut queue: mpsc::UnboundedReceiver<Msg>,
    renewals: Renewals,
    leases: Arc<Leases>,
) {
    let script = Arc::new(redis::Script::new(GCRA_SCRIPT));
    let free = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut msgs = Vec::with_capacity(MAX_BATCH);
    let mut batch: Vec<Pending> = Vec::new();
    // When the renewals queued must go, if no check takes them first.
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let Ok(permit) = free.clone().acquire_owned().await else {
            return;
        };
        loop {
            let received = match due {
                None => queue.recv_many(&mut msgs, MAX_BATCH).await,
                Some(at) => tokio::time::timeout_at(at, queue.recv_many(&mut msgs, MAX_BATCH))
                    .await
                    .unwrap_or(usize::MAX),
            };
            if received == 0 {
                return;
            }
            for m in msgs.drain(..) {
                match m {
                    Msg::Check(p) => batch.push(p),
                    Msg::RenewalsQueued => {
                        due.get_or_insert_with(|| tokio::time::Instant::now() + RENEWAL_GATHER);
                    }
                }
            }
            // Callers that gave up (timed out, or their request was dropped)
            // are not asked about: their buckets keep their tokens.
            batch.retain(|p| !p.abandoned());
            if !batch.is_empty() {
                break;
            }
            // Renewals alone go only while another call is free for checks:
            // they never hold up a check that waits.
            let now = tokio::time::Instant::now();
            if due.is_some_and(|at| at <= now) {
                if free.available_permits() > 0 {
                    break;
                }
                due = Some(now + RENEWAL_GATHER);
            }
        }
        {
            let mut queued = renewals.lock().expect("renewals lock");
            // A renewal queued so long that its key may have asked again is
            // dropped unsent: its tokens would go to a lease already gone.
            let now = super::now_us();
            queued.retain(|p| !p.stale(now));
            let n = queued.len().min(MAX_BATCH.saturating_sub(batch.len()));
            batch.extend(queued.drain(..n));
            due = (!queued.is_empty()).then(tokio::time::Instant::now);
        }
        if batch.is_empty() {
            continue;
        }
        let groups = if redis.is_cluster() {
            let mut groups: Vec<(u16, Vec<Pending>)> = Vec::new();
            for p in batch.drain(..) {
                let slot = get_slot(p.ask.bucket.as_bytes());
                match groups.iter_mut().find(|(s, _)| *s == slot) {
                    Some((_, g)) => g.push(p),
                    None => groups.push((slot, vec![p])),
                }
            }
            groups.into_iter().map(|(_, g)| g).collect()
        } else {
            vec![std::mem::take(&mut batch)]
        };
        let (redis, script, leases) = (redis.clone(), script.clone(), leases.clone());
        tokio::spawn(async move {
            let calls = groups.into_iter().map(|g| call(&redis, &script, g, &leases));
            futures_util::future::join_all(calls).await;
            drop(permit);
        });
    }
}

/// One script call for `group` (buckets of one slot, or any on one server),
/// and each caller's answer.
async fn call(redis: &RedisHandle, script: &redis::Script, group: Vec<Pending>, leases: &Leases) {
    let mut invocation = script.prepare_invoke();
    for p in &group {
        invocation
            .key(&p.ask.bucket)
            .arg(p.ask.interval_us)
            .arg(p.ask.window_us)
            .arg(p.ask.want);
    }
    let res = redis
        .run_unspanned("ratelimit", |mut c| async move {
            invocation.invoke_async::<Vec<i64>>(&mut c).await
        })
        .await;
    metrics::histogram!("latchkey_ratelimit_batch_size").record(group.len() as f64);
    let why = match res {
        Ok(v) if v.len() == 3 * group.len() => {
            for (p, a) in group.into_iter().zip(v.chunks_exact(3)) {
                p.answer(Ok((a[0], a[1], a[2])), leases);
            }
            return;
        }
        Ok(v) => format!("redis: {} numbers for {} buckets", v.len(), group.len()),
        Err(e) => e.to_string(),
    };
    for p in group {
        p.answer(Err(why.clone()), leases);
    }
}
