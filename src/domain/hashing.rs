//! Password hashing off the async threads, with admission control.
//!
//! `HashPool` owns `threads` OS threads that do nothing but argon2. A job
//! first needs one of `threads` permits. Whether it may wait for one is
//! decided by [`Admission`] against the latency objective
//! (`hash_latency_objective_ms`): a job is queued when it can still be
//! answered within the objective at the rate hashes are completing, and
//! refused at once otherwise (`Overloaded`, answered `503` with
//! `Retry-After`), as is a queued job that could not start in time. A client
//! gets a fast refusal instead of a slow answer after its patience ran out,
//! and the CPU goes to work that can still finish in time (an unbounded
//! queue of hashes makes every login late once the arrival rate passes the
//! hashing capacity); below capacity nobody is refused. `queue` only bounds
//! memory. Cheap requests never touch this pool, so they never wait behind
//! hashing.
//!
//! **Hashes of other systems** (imported bcrypt, PBKDF2, scrypt, argon2 with
//! other parameters: [`HashPool::verify`]) cost what their parameters say,
//! within `legacy::BUDGET` (up to a second of a core and 64 MiB), where the
//! service's own cost some 20 ms. They run in a lane of their own: at most
//! half of the threads (at least one) at once, waiting for the lane no
//! longer than the objective, and one at a time per account (a second
//! verification of the same account while one runs is refused). However
//! many imported accounts an attacker tries wrong passwords on, the other
//! half of the pool keeps serving everyone else; however many at once on
//! one account, they take one thread. Their time is not counted in the
//! estimate admission decides by, which is the service's own hashes'.
//!
//! A refusal is decided at once but answered at the objective, as late as an
//! admitted hash could have been. It costs a timer, not CPU, and it takes
//! away what makes overload collapse: a client that retries at once (a
//! script, a load generator, an impatient app) otherwise turns each fast
//! `503` into another request, and the CPU they take starves the hashing
//! threads (which run only on CPU nothing else wants, `lower_priority`). A
//! flood of sign-ups from 100 clients without a pause completed 34 % of the
//! hashes the machine can do with immediate refusals (docs/performance.md).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use tokio::sync::{oneshot, Semaphore};
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::admission::{Admission, Decision};
use super::input::Password;
use super::legacy::Legacy;
use crate::settings::{millis, number, ConfigError, Source};

/// Argon2id's cost parameters (OWASP: 19 MiB, 2 passes, 1 lane).
#[derive(Clone, Debug)]
pub struct Argon2Config {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

/// The hashing pool's settings: the cost of one hash, how many run, how
/// many may wait, and the latency a queued hash is held to.
#[derive(Clone, Debug)]
pub struct HashSettings {
    pub argon2: Argon2Config,
    pub threads: usize,
    /// How many of the `threads` run at ordinary priority, competing for
    /// the CPU like the request threads; the others run only on CPU nothing
    /// else wants ([`lower_priority`]).
    pub ordinary_threads: usize,
    /// At most this many jobs wait at once (a bound on memory; the
    /// objective decides first).
    pub queue: usize,
    /// A hashing request is refused (`503`) when it could not be answered
    /// within this: waiting for a thread plus one hash.
    pub objective: Duration,
}

impl HashSettings {
    pub fn read(src: &impl Source) -> Result<HashSettings, ConfigError> {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Ok(HashSettings {
            argon2: Argon2Config {
                memory_kib: src.get("argon2_memory_kib", 19_456, number(8, 4 * 1024 * 1024))?,
                iterations: src.get("argon2_iterations", 2, number(1, 100))?,
                parallelism: src.get("argon2_parallelism", 1, number(1, 64))?,
            },
            threads: src.get("hash_threads", cores, number(1, 256))?,
            ordinary_threads: src.get("hash_ordinary_threads", 0, number(0, 256))?,
            queue: src.get("hash_queue", 1024, number(0, 100_000))?,
            objective: src.get("hash_latency_objective_ms", DEFAULT_OBJECTIVE, millis(1, 60_000))?,
        })
    }
}

/// A sign-up or login answered within half a second, queue included; past
/// that a fast `503` serves the client better than a slow answer.
pub const DEFAULT_OBJECTIVE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("password hashing is overloaded")]
pub struct Overloaded;

type Job = Box<dyn FnOnce() + Send>;

pub struct HashPool {
    jobs: mpsc::Sender<Job>,
    threads: usize,
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    admission: Arc<Mutex<Admission>>,
    argon2: Arc<Passwords>,
    /// Threads hashes of other systems may hold at once.
    foreign_lane: Arc<Semaphore>,
    /// Accounts whose hash of another system is being verified.
    foreign_accounts: Arc<Mutex<HashSet<String>>>,
}

impl HashPool {
    pub fn new(settings: &HashSettings) -> anyhow::Result<HashPool> {
        let (threads, cfg) = (settings.threads, &settings.argon2);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            let ordinary = i < settings.ordinary_threads;
            std::thread::Builder::new()
                .name(format!("latchkey-hash-{i}"))
                .spawn(move || {
                    if !ordinary {
                        lower_priority();
                    }
                    loop {
                        let job = match rx.lock() {
                            Ok(guard) => guard.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return, // pool dropped
                        }
                    }
                })?;
        }
        Ok(HashPool {
            jobs: tx,
            threads,
            permits: Arc::new(Semaphore::new(threads)),
            waiting: AtomicUsize::new(0),
            admission: Arc::new(Mutex::new(
                Admission::new(threads, settings.objective).with_queue(settings.queue),
            )),
            argon2: Arc::new(Passwords::new(cfg)?),
            foreign_lane: Arc::new(Semaphore::new((threads / 2).max(1))),
            foreign_accounts: Arc::new(Mutex::new(HashSet::new())),
        })
    }

    /// Whether `password` matches the stored hash `phc` of `account`: the
    /// service's own argon2id like any hash job, a hash of another system
    /// in its lane (see the module notes).
    pub async fn verify(&self, account: &str, password: &Password, phc: &str) -> Result<bool, Overloaded> {
        let (pw, phc) = (password.clone(), phc.to_string());
        if self.argon2.costs_no_more_than_own(&phc) {
            return self.run("verify", move |p| p.verify(pw.expose(), &phc)).await;
        }
        let span = tracing::debug_span!(
            "hash",
            op = "verify_foreign",
            wait_us = Empty,
            hash_us = Empty,
            shed = Empty
        );
        async {
            let Some(turn) = ForeignTurn::take(&self.foreign_accounts, account) else {
                return Err(self.refuse("account_busy").await);
            };
            let objective = self.admission().objective();
            let Ok(Ok(lane)) =
                tokio::time::timeout(objective, self.foreign_lane.clone().acquire_owned()).await
            else {
                return Err(self.refuse("foreign_lane").await);
            };
            // The turn and the lane go with the job: they are held until the
            // hash is done on its thread, not until the request is (a client
            // that hangs up must not free them while the hash still runs).
            self.admit_and_run(false, move |p| {
                let _held = (turn, lane);
                p.verify(pw.expose(), &phc)
            })
            .await
        }
        .instrument(span)
        .await
    }

    pub fn passwords(&self) -> &Arc<Passwords> {
        &self.argon2
    }

    /// Runs `f` on a hashing thread if it can be answered within the latency
    /// objective ([`Admission`]), in a
    /// `hash` span named by `op` (`hash` or `verify`) that records the wait
    /// for a thread (`wait_us`) apart from the hash itself (`hash_us`).
    pub async fn run<R, F>(&self, op: &'static str, f: F) -> Result<R, Overloaded>
    where
        F: FnOnce(&Passwords) -> R + Send + 'static,
        R: Send + 'static,
    {
        let span = tracing::debug_span!("hash", op, wait_us = Empty, hash_us = Empty, shed = Empty);
        self.admit_and_run(true, f).instrument(span).await
    }

    /// Runs `f` once admitted; `observe`: its time counts in the estimate
    /// admission decides by (the service's own hashes).
    async fn admit_and_run<R, F>(&self, observe: bool, f: F) -> Result<R, Overloaded>
    where
        F: FnOnce(&Passwords) -> R + Send + 'static,
        R: Send + 'static,
    {
        let queued = Instant::now();
        // A free thread is taken at once (the semaphore hands released
        // permits to the jobs already waiting first, so a free one means
        // nobody waits for it).
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let waiting = Waiting::join(&self.waiting);
                let running = self.threads - self.permits.available_permits().min(self.threads);
                let decision = self.admission().decide(running, waiting.ahead);
                let got = match decision {
                    Decision::Start => Ok(self.permits.clone().acquire_owned().await),
                    Decision::Wait { at_most } => {
                        tokio::time::timeout(at_most, self.permits.clone().acquire_owned()).await
                    }
                    Decision::Shed | Decision::QueueFull => {
                        drop(waiting);
                        return Err(self
                            .refuse(if decision == Decision::Shed {
                                "objective"
                            } else {
                                "queue_full"
                            })
                            .await);
                    }
                };
                drop(waiting);
                match got {
                    Ok(Ok(p)) => p,
                    _ => return Err(self.shed("late")),
                }
            }
        };
        let waited = queued.elapsed();
        metrics::histogram!("latchkey_hash_wait_seconds").record(waited.as_secs_f64());
        // The span (with the request's above it) goes with the job to the
        // hashing thread, so that the hash is timed and logged in it.
        let span = Span::current();
        span.record("wait_us", waited.as_micros() as i64);
        let (tx, rx) = oneshot::channel();
        let passwords = self.argon2.clone();
        let admission = self.admission.clone();
        let job: Job = Box::new(move || {
            let start = Instant::now();
            let out = span.in_scope(|| f(&passwords));
            let took = start.elapsed();
            if observe {
                admission.lock().unwrap_or_else(|e| e.into_inner()).observe(took);
            }
            metrics::histogram!("latchkey_hash_seconds").record(took.as_secs_f64());
            span.record("hash_us", took.as_micros() as i64);
            drop(span);
            drop(permit);
            let _ = tx.send(out);
        });
        self.jobs.send(job).map_err(|_| Overloaded)?;
        rx.await.map_err(|_| Overloaded)
    }

    fn admission(&self) -> std::sync::MutexGuard<'_, Admission> {
        self.admission.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shed(&self, why: &'static str) -> Overloaded {
        metrics::counter!("latchkey_hash_shed_total", "reason" => why).increment(1);
        Span::current().record("shed", why);
        Overloaded
    }

    /// Refused now, answered at the objective (see the module notes).
    async fn refuse(&self, why: &'static str) -> Overloaded {
        let refused = self.shed(why);
        let objective = self.admission().objective();
        tokio::time::sleep(objective).await;
        refused
    }
}

/// An account's turn at verifying a hash of another system: at most one at
/// a time per account, until dropped.
struct ForeignTurn {
    accounts: Arc<Mutex<HashSet<String>>>,
    account: String,
}

impl ForeignTurn {
    fn take(accounts: &Arc<Mutex<HashSet<String>>>, account: &str) -> Option<ForeignTurn> {
        let mut set = accounts.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(account.to_string()).then(|| ForeignTurn {
            accounts: accounts.clone(),
            account: account.to_string(),
        })
    }
}

impl Drop for ForeignTurn {
    fn drop(&mut self) {
        self.accounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.account);
    }
}

/// What [`measure_capacity`] found.
pub struct Capacity {
    pub per_second: f64,
    /// The mean wall time of one hash on one thread.
    pub one_hash: Duration,
}

/// Hashes per second with `settings` (argon2 parameters, thread count) for
/// `duration`: every thread hashes back to back at ordinary priority. The
/// ceiling the pool works under, measured rather than assumed (the same
/// parameters cost twice as much on one day's host as on another's).
pub fn measure_capacity(settings: &HashSettings, duration: Duration) -> anyhow::Result<Capacity> {
    let passwords = Arc::new(Passwords::new(&settings.argon2)?);
    let start = Instant::now();
    let threads: Vec<_> = (0..settings.threads)
        .map(|_| {
            let passwords = passwords.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while start.elapsed() < duration {
                    std::hint::black_box(passwords.hash("hash capacity"));
                    n += 1;
                }
                (n, start.elapsed())
            })
        })
        .collect();
    let (mut hashes, mut busy) = (0u64, Duration::ZERO);
    for t in threads {
        let (n, took) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a hashing thread panicked"))?;
        hashes += n;
        busy += took;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(Capacity {
        per_second: hashes as f64 / elapsed,
        one_hash: busy.div_f64(hashes.max(1) as f64),
    })
}

/// One job in the queue, counted in `waiting` and the queue-depth gauge
/// until it leaves it, however it leaves: with a thread, refused, or
/// dropped with its request (a client that hangs up mid-wait must not leave
/// a phantom in the count that admission decides by).
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// The jobs that were waiting when this one arrived.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn join(count: &'a AtomicUsize) -> Waiting<'a> {
        let ahead = count.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!("latchkey_hash_queue_depth").increment(1.0);
        Waiting { count, ahead }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
        metrics::gauge!("latchkey_hash_queue_depth").decrement(1.0);
    }
}

thread_local! {
    /// The argon2 memory of this thread, reused from one hash to the next:
    /// 19 MiB allocated once per hashing thread instead of per hash (which
    /// costs page faults, and leaves freed blocks in the allocator's arenas).
    static BLOCKS: std::cell::RefCell<Vec<argon2::Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn with_blocks<R>(params: &Params, f: impl FnOnce(&mut [argon2::Block]) -> R) -> R {
    BLOCKS.with(|cell| {
        let mut blocks = cell.borrow_mut();
        let need = params.block_count();
        if blocks.len() != need {
            *blocks = vec![argon2::Block::default(); need];
        }
        f(&mut blocks[..])
    })
}

/// Runs hashing threads in Linux's `SCHED_IDLE` class: they get the CPU only
/// when no ordinary thread wants it, and an async thread that wakes up (a
/// validation, a refresh, a health probe) preempts them at once. With nice 10
/// (the first version) a waking async thread could still wait a scheduler
/// slice behind a hash, which showed as a validation P99 of 12 ms while
/// logins were overloaded. If the class cannot be set, nice 10. Hashing that
/// cannot get the CPU in time is shed by the budget, which is the point:
/// cheap requests first. Both settings are per thread on Linux.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: both calls act on the calling thread (pid/who 0) only and take
    // a parameter struct by reference; no memory is shared.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
        }
    }
}

/// argon2id with the configured parameters, and a dummy hash for unknown users.
pub struct Passwords {
    argon2: Argon2<'static>,
    params: Params,
    dummy: OnceLock<String>,
}

impl Passwords {
    pub fn new(cfg: &Argon2Config) -> anyhow::Result<Passwords> {
        let params = Params::new(cfg.memory_kib, cfg.iterations, cfg.parallelism, None)
            .map_err(|e| anyhow::anyhow!("argon2 parameters: {e}"))?;
        Ok(Passwords {
            argon2: Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone()),
            params,
            dummy: OnceLock::new(),
        })
    }

    /// A PHC string (`$argon2id$v=19$m=...`) with a fresh random salt.
    pub fn hash(&self, password: &str) -> String {
        self.hash_with(password, &crate::crypto::random_bytes::<16>())
    }

    /// The hash of `password` with the salt of `like`, when `like` is a hash
    /// this service would not rehash (argon2id with these parameters, see
    /// [`Passwords::needs_rehash`]); else with a fresh salt. The cost is the
    /// same either way. Two hashes of one password made so are equal: how a
    /// repeated registration is told from another party's (`Store::register`).
    pub fn hash_like(&self, password: &str, like: Option<&str>) -> String {
        let salt = like
            .filter(|phc| !self.needs_rehash(phc))
            .and_then(|phc| PasswordHash::new(phc).ok()?.salt)
            .and_then(|s| {
                let mut raw = [0u8; 16];
                <[u8; 16]>::try_from(s.decode_b64(&mut raw).ok()?).ok()
            });
        match salt {
            Some(salt) => self.hash_with(password, &salt),
            None => self.hash(password),
        }
    }

    fn hash_with(&self, password: &str, salt_bytes: &[u8; 16]) -> String {
        let salt = SaltString::encode_b64(salt_bytes).expect("16-byte salt");
        let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
        with_blocks(&self.params, |blocks| {
            self.argon2
                .hash_password_into_with_memory(password.as_bytes(), salt_bytes, &mut out, blocks)
        })
        .expect("argon2 with valid parameters cannot fail");
        PasswordHash {
            algorithm: Algorithm::Argon2id.ident(),
            version: Some(Version::V0x13.into()),
            params: ParamsString::try_from(&self.params).expect("valid parameters"),
            salt: Some(salt.as_salt()),
            hash: Some(Output::new(&out).expect("32-byte output")),
        }
        .to_string()
    }

    /// Verifies with the algorithm and parameters recorded in the PHC string.
    /// Whether `password` matches `phc`: an argon2 PHC string (the service's
    /// own, or imported), or an imported hash of another system
    /// (`legacy.rs`: bcrypt, PBKDF2, scrypt).
    /// A hash of another system (or of other argon2 parameters) is held to
    /// `legacy::BUDGET`: one over it never verifies.
    pub fn verify(&self, password: &str, phc: &str) -> bool {
        if !self.needs_rehash(phc) {
            return self.try_verify(password, phc, true).unwrap_or(false);
        }
        match Legacy::parse(phc) {
            Ok(Legacy::Argon2 { .. }) => self.try_verify(password, phc, false).unwrap_or(false),
            Ok(h) => h.verify(password),
            Err(why) => {
                // Over the budget (stored before it existed), or no hash at
                // all: the account can only reset its password. Said once per
                // attempt, without the hash.
                tracing::warn!(reason = %why, "a stored password hash cannot be verified");
                false
            }
        }
    }

    /// `own`: made with this service's parameters, so the thread's blocks
    /// are reused; others allocate their memory for this verification only.
    fn try_verify(&self, password: &str, phc: &str, own: bool) -> Option<bool> {
        let h = PasswordHash::new(phc).ok()?;
        let algorithm = Algorithm::try_from(h.algorithm).ok()?;
        let version = h
            .version
            .map(Version::try_from)
            .transpose()
            .ok()?
            .unwrap_or_default();
        let params = Params::try_from(&h).ok()?;
        let expected = h.hash?;
        let mut raw_salt = [0u8; 64];
        let salt = h.salt?.decode_b64(&mut raw_salt).ok()?;
        let mut out = vec![0u8; expected.len()];
        let argon2 = Argon2::new(algorithm, version, params.clone());
        if own {
            with_blocks(&params, |blocks| {
                argon2.hash_password_into_with_memory(password.as_bytes(), salt, &mut out, blocks)
            })
            .ok()?;
        } else {
            argon2
                .hash_password_into(password.as_bytes(), salt, &mut out)
                .ok()?;
        }
        Some(crate::crypto::ct_eq(&out, expected.as_bytes()))
    }

    /// Costs what a real verification costs, and always fails: for unknown users.
    pub fn verify_dummy(&self, password: &str) -> bool {
        let dummy = self
            .dummy
            .get_or_init(|| self.hash("dummy password that matches nothing"));
        let _ = self.verify(password, dummy);
        false
    }

    /// Whether `phc` is an argon2 hash that costs no more to verify than
    /// this service's own (its memory, and its memory times its passes, at
    /// most ours): such a hash, the service's own made with earlier
    /// parameters included, is verified like the service's own. Every other
    /// hash goes to the lane of hashes of other systems ([`HashPool::verify`]).
    pub fn costs_no_more_than_own(&self, phc: &str) -> bool {
        let Ok(h) = PasswordHash::new(phc) else {
            return false;
        };
        if Algorithm::try_from(h.algorithm).is_err() {
            return false;
        }
        let Ok(p) = Params::try_from(&h) else {
            return false;
        };
        let (m, t) = (u64::from(p.m_cost()), u64::from(p.t_cost()));
        let (own_m, own_t) = (u64::from(self.params.m_cost()), u64::from(self.params.t_cost()));
        m <= own_m && m * t <= own_m * own_t
    }

    /// True if `phc` was made with other parameters or another algorithm.
    pub fn needs_rehash(&self, phc: &str) -> bool {
        let Ok(h) = PasswordHash::new(phc) else {
            return true;
        };
        if h.algorithm.as_str() != "argon2id" {
            return true;
        }
        match Params::try_from(&h) {
            Ok(p) => {
                p.m_cost() != self.params.m_cost()
                    || p.t_cost() != self.params.t_cost()
                    || p.p_cost() != self.params.p_cost()
            }
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One thread, a queue of `queue`, an objective of `objective_ms`, cheap hashes.
    fn pool_of(queue: usize, objective_ms: u64) -> HashSettings {
        HashSettings {
            argon2: cheap(),
            threads: 1,
            ordinary_threads: 0,
            queue,
            objective: Duration::from_millis(objective_ms),
        }
    }

    /// A hash of another system that takes a while (PBKDF2 at a million
    /// iterations: some 150 ms here) and that no password matches.
    const SLOW_FOREIGN: &str =
        "$pbkdf2-sha256$i=1000000$c2FsdHNhbHQ$AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA";

    /// A client that hangs up while its foreign hash runs frees neither the
    /// lane nor its account's turn: both go with the job, until the hash is
    /// done on its thread. (They were the request's, and every hang-up let
    /// another foreign hash start: all the threads could be taken.)
    #[tokio::test]
    async fn a_foreign_hash_holds_its_lane_and_turn_until_it_is_done_not_until_its_request_is() {
        let mut settings = pool_of(16, 5_000);
        settings.threads = 2;
        let pool = Arc::new(HashPool::new(&settings).unwrap());
        let pw = Password::parse("password", "a wrong password").unwrap();
        let p2 = pool.clone();
        let request = tokio::spawn(async move { p2.verify("acct", &pw, SLOW_FOREIGN).await });
        // Until the hash runs (its turn taken, the lane's one permit gone).
        while pool.foreign_lane.available_permits() == 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        request.abort();
        let _ = request.await;
        let held = |pool: &HashPool| {
            let turn = pool.foreign_accounts.lock().unwrap().contains("acct");
            (turn, pool.foreign_lane.available_permits())
        };
        assert_eq!(held(&pool), (true, 0), "released with the request, not the hash");
        let deadline = Instant::now() + Duration::from_secs(30);
        while held(&pool) != (false, 1) {
            assert!(Instant::now() < deadline, "never released");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn cheap() -> Argon2Config {
        Argon2Config {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        }
    }

    #[test]
    fn hash_verify_and_rehash() {
        let p = Passwords::new(&cheap()).unwrap();
        let h = p.hash("correct horse");
        assert!(h.starts_with("$argon2id$v=19$m=64,t=1,p=1$"));
        assert!(p.verify("correct horse", &h));
        assert!(!p.verify("wrong horse", &h));
        assert!(!p.verify("x", "not a phc string"));
        assert!(!p.needs_rehash(&h));
        let stronger = Passwords::new(&Argon2Config {
            memory_kib: 128,
            ..cheap()
        })
        .unwrap();
        assert!(stronger.needs_rehash(&h));
        assert!(
            stronger.verify("correct horse", &h),
            "old parameters still verify"
        );
        assert!(!p.verify_dummy("anything"));
    }

    #[test]
    fn a_hash_made_like_another_is_equal_only_for_the_same_password() {
        let p = Passwords::new(&cheap()).unwrap();
        let first = p.hash("correct horse");
        assert_eq!(p.hash_like("correct horse", Some(&first)), first);
        let other = p.hash_like("wrong horse", Some(&first));
        assert_ne!(other, first);
        assert!(p.verify("wrong horse", &other));
        // Nothing to be like: a fresh salt each time.
        assert_ne!(
            p.hash_like("correct horse", None),
            p.hash_like("correct horse", None)
        );
        // A hash of other parameters, or no hash at all: a fresh salt.
        let stronger = Passwords::new(&Argon2Config {
            memory_kib: 128,
            ..cheap()
        })
        .unwrap();
        let theirs = stronger.hash("correct horse");
        let ours = p.hash_like("correct horse", Some(&theirs));
        assert_ne!(ours, theirs);
        assert!(ours.starts_with("$argon2id$v=19$m=64,t=1,p=1$") && p.verify("correct horse", &ours));
        for odd in ["", "!contested", "$2b$04$abcdefghijklmnopqrstuu"] {
            let h = p.hash_like("correct horse", Some(odd));
            assert!(p.verify("correct horse", &h), "{odd}");
        }
    }

    #[test]
    fn phc_strings_interoperate_with_the_reference_implementation() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        let p = Passwords::new(&cheap()).unwrap();
        let ours = p.hash("pw-123456");
        let reference = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(64, 1, 1, None).unwrap(),
        );
        assert!(reference
            .verify_password(b"pw-123456", &PasswordHash::new(&ours).unwrap())
            .is_ok());
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let theirs = reference.hash_password(b"pw-123456", &salt).unwrap().to_string();
        assert!(p.verify("pw-123456", &theirs));
        assert!(!p.verify("pw-654321", &theirs));
        // Another variant and other parameters verify too (older hashes).
        let argon2i = Argon2::new(
            Algorithm::Argon2i,
            Version::V0x13,
            Params::new(32, 2, 1, None).unwrap(),
        );
        let old = argon2i.hash_password(b"pw-123456", &salt).unwrap().to_string();
        assert!(p.verify("pw-123456", &old));
        assert!(p.needs_rehash(&old));
    }

    #[tokio::test]
    async fn sheds_when_the_queue_is_full() {
        let pool = HashPool::new(&pool_of(0, 50)).unwrap();
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let pool = Arc::new(pool);
        let p2 = pool.clone();
        let busy = tokio::spawn(async move { p2.run("test", move |_| hold_rx.recv().ok()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The only thread is busy and no one may wait: shed at once.
        assert_eq!(pool.run("test", |_| ()).await, Err(Overloaded));
        hold_tx.send(()).unwrap();
        assert!(busy.await.unwrap().is_ok());
        assert_eq!(pool.run("test", |_| 7).await, Ok(7));
    }

    #[tokio::test]
    async fn a_queued_hash_that_cannot_start_in_time_is_shed_at_the_objective() {
        let pool = Arc::new(HashPool::new(&pool_of(10, 30)).unwrap());
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let p2 = pool.clone();
        let busy = tokio::spawn(async move { p2.run("test", move |_| hold_rx.recv().ok()).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let start = Instant::now();
        assert_eq!(pool.run("test", |_| ()).await, Err(Overloaded));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        hold_tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
    }

    /// `n` jobs of `each` (a sleep on the hashing thread) at once; how each
    /// ended and when.
    async fn burst(pool: &Arc<HashPool>, n: usize, each: Duration) -> Vec<(bool, Duration)> {
        let start = Instant::now();
        let jobs: Vec<_> = (0..n)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let r = pool.run("test", move |_| std::thread::sleep(each)).await;
                    (r.is_ok(), start.elapsed())
                })
            })
            .collect();
        let mut out = Vec::new();
        for j in jobs {
            out.push(j.await.unwrap());
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn below_the_objective_a_burst_queues_and_nobody_is_refused() {
        // 30 jobs of 10 ms on one thread: the last is answered after about
        // 300 ms, within the 1 s objective. (A fixed 150 ms wait refused the
        // second half.)
        let pool = Arc::new(HashPool::new(&pool_of(1024, 1000)).unwrap());
        pool.run("test", |_| std::thread::sleep(Duration::from_millis(10)))
            .await
            .unwrap();
        let ends = burst(&pool, 30, Duration::from_millis(10)).await;
        assert!(ends.iter().all(|(ok, _)| *ok), "{ends:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_objective_the_excess_is_refused_and_the_rest_answered_in_time() {
        // Jobs of 20 ms on one thread, a 200 ms objective: about 8 fit.
        let pool = Arc::new(HashPool::new(&pool_of(1024, 200)).unwrap());
        pool.run("test", |_| std::thread::sleep(Duration::from_millis(20)))
            .await
            .unwrap();
        let ends = burst(&pool, 40, Duration::from_millis(20)).await;
        let answered: Vec<_> = ends.iter().filter(|(ok, _)| *ok).collect();
        let refused: Vec<_> = ends.iter().filter(|(ok, _)| !*ok).collect();
        assert!((5..=12).contains(&answered.len()), "{ends:?}");
        // Answers come within the objective (and a margin for a loaded test
        // machine). Refusals come at the objective (most: decided at once,
        // held), or one hash before it (a queued job that could not start in
        // time), never later.
        assert!(
            answered.iter().all(|(_, t)| *t < Duration::from_millis(300)),
            "{ends:?}"
        );
        assert!(
            refused
                .iter()
                .all(|(_, t)| *t >= Duration::from_millis(150) && *t < Duration::from_millis(300)),
            "{ends:?}"
        );
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_dropped_while_its_hash_waits_leaves_no_trace_in_the_queue() {
        // A client that hangs up drops its request's future mid-wait; the
        // queue count that admission decides by must not keep it.
        let pool = Arc::new(HashPool::new(&pool_of(1024, 5000)).unwrap());
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let p2 = pool.clone();
        let busy = tokio::spawn(async move { p2.run("test", move |_| hold_rx.recv().ok()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let p3 = pool.clone();
        let queued = tokio::spawn(async move { p3.run("test", |_| ()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 1);
        queued.abort();
        let _ = queued.await;
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0);
        hold_tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
        assert_eq!(pool.run("test", |_| 7).await, Ok(7));
    }
}
