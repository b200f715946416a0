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
//! Each caller waits at most [`REDIS_COMMAND_TIMEOUT`] from the moment it queued,
//! then takes its policy's fallback, as a failed command does; a batch that
//! answers later gives its answer to no one.

use redis::cluster_routing::get_slot;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::cache::{RedisHandle, REDIS_COMMAND_TIMEOUT};

/// Most buckets in one script call.
const MAX_BATCH: usize = 128;
/// Most script calls of one limiter in flight at once.
const MAX_IN_FLIGHT: usize = 4;

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

struct Pending {
    ask: Ask,
    reply: oneshot::Sender<Answer>,
}

/// The queue into one limiter's batcher task, started on first use on the
/// runtime of the caller (the gateway's serving threads each have their
/// own limiter, connection and runtime).
pub(super) struct Batcher {
    redis: RedisHandle,
    queue: std::sync::OnceLock<mpsc::UnboundedSender<Pending>>,
}

impl Batcher {
    pub fn new(redis: RedisHandle) -> Batcher {
        Batcher {
            redis,
            queue: std::sync::OnceLock::new(),
        }
    }

    pub fn redis(&self) -> &RedisHandle {
        &self.redis
    }

    /// Asks Redis about one bucket, in the next batch. The queue needs no
    /// bound of its own: each entry is a request waiting for its answer, and
    /// requests are bounded where they come in.
    pub async fn ask(&self, ask: Ask) -> Answer {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.redis.clone(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        if queue.send(Pending { ask, reply }).is_err() {
            return Err("the rate-limit batcher has stopped".into());
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
}

/// The batcher: takes what has queued (at least one) as soon as one of
/// [`MAX_IN_FLIGHT`] calls is free, sends it, and again; it ends when its
/// limiter (the sender) is gone. Several calls in flight, so that a caller
/// that queued behind a slow call does not wait for it first (each caller
/// has the one command timeout in all); while they are all busy, the queue
/// fills and the next call takes it whole.
async fn run(redis: RedisHandle, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let script = std::sync::Arc::new(redis::Script::new(GCRA_SCRIPT));
    let free = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let Ok(permit) = free.clone().acquire_owned().await else {
            return;
        };
        if queue.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        // Callers that gave up (timed out, or their request was dropped)
        // are not asked about: their buckets keep their tokens.
        batch.retain(|p: &Pending| !p.reply.is_closed());
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
            vec![std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH))]
        };
        let (redis, script) = (redis.clone(), script.clone());
        tokio::spawn(async move {
            let calls = groups.into_iter().map(|g| call(&redis, &script, g));
            futures_util::future::join_all(calls).await;
            drop(permit);
        });
    }
}

/// One script call for `group` (buckets of one slot, or any on one server),
/// and each caller's answer.
async fn call(redis: &RedisHandle, script: &redis::Script, group: Vec<Pending>) {
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
                let _ = p.reply.send(Ok((a[0], a[1], a[2])));
            }
            return;
        }
        Ok(v) => format!("redis: {} numbers for {} buckets", v.len(), group.len()),
        Err(e) => e.to_string(),
    };
    for p in group {
        let _ = p.reply.send(Err(why.clone()));
    }
}
