//! How a process starts and stops its work, for the service and the gateway
//! alike. Ground floor: imports nothing from the crate.
//!
//! ```text
//!   signal() ──► stop serving ──► drain(served, timeout) ──► tasks.stop()
//!   (SIGTERM,     (listeners      (in-flight requests         (background
//!    SIGINT)       close)          finish, or give up)         tasks end)
//! ```
//!
//! - [`Shutdown`] is the one "stop now" every task listens for (a cloned
//!   receiver of one [`Trigger`]); a task polls it in its `select!`.
//! - [`Tasks`] is a set of background tasks sharing one trigger: spawned
//!   with [`Tasks::spawn`], stopped together with [`Tasks::stop`].
//! - [`Housekeeping`] is a process's periodic work: named chores, each due
//!   on its own period, run one after another by one task, each failure
//!   logged once per outage and counted
//!   (`latchkey_housekeeping_failures_total{chore}`). It is built on
//!   [`Ticks`] (one tick a period until shutdown) and [`Every`] (when a
//!   chore is due).
//! - [`Program`] is the shape of both programs' `main`: settings read (a
//!   mistake is one line and exit status 2), a runtime, the program run on
//!   it (an error is one line and exit status 1).
//! - [`Readiness`] builds the answer of `/health/ready` from named checks.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// SIGTERM or SIGINT. The handlers are installed by this call, not when the
/// future is first polled: a process calls it before it binds its
/// listeners, so that a signal sent as soon as the port answers stops it
/// gracefully instead of ending it by the signal's default action.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let received = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = received(term) => {}
                _ = received(int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Fires the [`Shutdown`] of every task subscribed to it.
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    pub fn new() -> Trigger {
        Trigger(watch::channel(false).0)
    }

    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }

    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

impl Default for Trigger {
    fn default() -> Self {
        Trigger::new()
    }
}

/// "Stop now", heard by one task.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Completes when the trigger fires (or is dropped).
    pub async fn wait(&mut self) {
        while !*self.0.borrow_and_update() {
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }

    /// For `with_graceful_shutdown` and other places that take a future.
    pub async fn into_wait(mut self) {
        self.wait().await
    }
}

/// Background tasks that stop together.
pub struct Tasks {
    trigger: Trigger,
    handles: Vec<JoinHandle<()>>,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            trigger: Trigger::new(),
            handles: Vec::new(),
        }
    }

    /// The shutdown a new task of this set listens for.
    pub fn shutdown(&self) -> Shutdown {
        self.trigger.subscribe()
    }

    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.handles.push(tokio::spawn(task));
    }

    /// Fires the shutdown and waits for each task, `grace` at most each.
    pub async fn stop(self, grace: Duration) {
        self.trigger.fire();
        for t in self.handles {
            let _ = tokio::time::timeout(grace, t).await;
        }
    }
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks::new()
    }
}

/// Waits for `served` (the listeners finishing their in-flight requests)
/// within `timeout`; `false` (and a warning) if they did not.
pub async fn drain(served: impl Future<Output = ()>, timeout: Duration) -> bool {
    let done = tokio::time::timeout(timeout, served).await.is_ok();
    if !done {
        tracing::warn!("in-flight requests did not finish within the shutdown timeout");
    }
    done
}

/// The loop of a periodic task: `while ticks.next().await { ... }` runs its
/// body every `period` (a late tick is delayed, not bunched) until shutdown.
pub struct Ticks {
    interval: tokio::time::Interval,
    shutdown: Shutdown,
}

impl Ticks {
    pub fn every(period: Duration, shutdown: Shutdown) -> Ticks {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ticks { interval, shutdown }
    }

    /// `true` at the next tick, `false` once shutdown is asked for.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            biased;
            _ = self.shutdown.wait() => false,
            _ = self.interval.tick() => true,
        }
    }
}

/// A chore inside a periodic task that is due every `period`.
pub struct Every {
    period: Duration,
    last: Instant,
}

impl Every {
    /// First due one `period` from now.
    pub fn new(period: Duration) -> Every {
        Every {
            period,
            last: Instant::now(),
        }
    }

    /// Whether the chore is due; if so, the next one is a period from now.
    pub fn due(&mut self) -> bool {
        if self.last.elapsed() < self.period {
            return false;
        }
        self.last = Instant::now();
        true
    }
}

/// The work of one chore of [`Housekeeping`]: `Err` says in one line what
/// failed. A closure returning a future is one; a chore with state of its
/// own (where the last run got to) implements it on that state.
pub trait Chore: Send {
    fn run(&mut self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}

impl<F, Fut> Chore for F
where
    F: FnMut() -> Fut + Send,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn run(&mut self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(self())
    }
}

/// A process's periodic work, one task: chores run in the order added,
/// each when its period has passed. A chore that fails is logged at `warn`
/// when it starts failing and at `info` when it works again (not once per
/// period through an outage), and counted every time.
pub struct Housekeeping {
    chores: Vec<Scheduled>,
}

struct Scheduled {
    name: &'static str,
    every: Every,
    failing: bool,
    work: Box<dyn Chore>,
}

impl Housekeeping {
    pub fn new() -> Housekeeping {
        Housekeeping { chores: Vec::new() }
    }

    /// Adds chore `name`, first due one `period` from the start.
    pub fn every(mut self, name: &'static str, period: Duration, work: impl Chore + 'static) -> Housekeeping {
        self.chores.push(Scheduled {
            name,
            every: Every::new(period),
            failing: false,
            work: Box::new(work),
        });
        self
    }

    /// Runs the chores until `shutdown`. It wakes at half the shortest
    /// period (a second at most), so that no chore runs a whole tick late.
    pub async fn run(mut self, shutdown: Shutdown) {
        let tick = self
            .chores
            .iter()
            .map(|c| c.every.period / 2)
            .min()
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut ticks = Ticks::every(tick, shutdown);
        while ticks.next().await {
            for c in &mut self.chores {
                if c.every.due() {
                    c.run_once().await;
                }
            }
        }
    }
}

impl Scheduled {
    async fn run_once(&mut self) {
        match self.work.run().await {
            Ok(()) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!(chore = self.name, "a housekeeping chore works again");
                }
            }
            Err(error) => {
                metrics::counter!("latchkey_housekeeping_failures_total", "chore" => self.name).increment(1);
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(chore = self.name, %error, "a housekeeping chore failed; retrying every period");
                }
            }
        }
    }
}

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping::new()
    }
}

/// The shape of both programs' `main` (`latchkey serve` and the other
/// service commands, `latchkey gateway`), so that they start, fail and
/// end alike.
pub struct Program(pub &'static str);

impl Program {
    /// The settings `read`, or, for a mistake in them, its one line on
    /// stderr and exit status 2 (nothing was started).
    pub fn settings<S>(&self, read: Result<S, impl std::fmt::Display>) -> Result<S, ExitCode> {
        read.map_err(|e| self.refuse(e))
    }

    /// Exit status 2 for a mistake in how the program was called, with its
    /// one line on stderr.
    pub fn refuse(&self, mistake: impl std::fmt::Display) -> ExitCode {
        eprintln!("{}: {mistake}", self.0);
        ExitCode::from(2)
    }

    /// Runs `work` on a multi-threaded runtime of `threads` worker threads
    /// (`None`: one per core): exit status 0 when it ends well; else 1, and
    /// the chain of causes on one line on stderr (settings are never in it).
    pub fn run(&self, threads: Option<usize>, work: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = threads {
            builder.worker_threads(n.max(1));
        }
        let rt = match builder.enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("{}: cannot start the runtime: {e}", self.0);
                return ExitCode::FAILURE;
            }
        };
        match rt.block_on(work) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let msg = format!("{e:#}").replace('\n', " ");
                eprintln!("{}: {msg}", self.0);
                ExitCode::FAILURE
            }
        }
    }
}

/// The answer of `/health/ready`: `200 {"status":"ok","checks":{...}}`, or
/// `503 {"error":"UNAVAILABLE","failing":[...],...}` naming the checks that
/// failed. Informational checks and extra fields never fail it.
pub struct Readiness {
    checks: serde_json::Map<String, serde_json::Value>,
    failing: Vec<&'static str>,
    extra: serde_json::Map<String, serde_json::Value>,
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness {
            checks: serde_json::Map::new(),
            failing: Vec::new(),
            extra: serde_json::Map::new(),
        }
    }

    /// A check that must pass for the process to be ready.
    pub fn check(self, name: &'static str, ok: bool) -> Readiness {
        let mut r = self.report(name, ok);
        if !ok {
            r.failing.push(name);
        }
        r
    }

    /// A check shown as `ok` or `failing` that never fails readiness (a
    /// dependency the process can do without for a while).
    pub fn report(mut self, name: &'static str, ok: bool) -> Readiness {
        self.checks
            .insert(name.into(), if ok { "ok" } else { "failing" }.into());
        self
    }

    /// A check shown but never failing readiness (`unknown` when not ok).
    pub fn inform(mut self, name: &'static str, ok: bool) -> Readiness {
        self.checks
            .insert(name.into(), if ok { "ok" } else { "unknown" }.into());
        self
    }

    /// A field of the healthy answer.
    pub fn with(mut self, name: &'static str, value: impl Into<serde_json::Value>) -> Readiness {
        self.extra.insert(name.into(), value.into());
        self
    }

    /// The answer; `what` says how a failing check failed ("not answering").
    pub fn respond(self, what: &str) -> Response {
        if self.failing.is_empty() {
            let mut body = serde_json::Map::new();
            body.insert("status".into(), "ok".into());
            body.insert("checks".into(), self.checks.into());
            body.extend(self.extra);
            (StatusCode::OK, Json(serde_json::Value::Object(body))).into_response()
        } else {
            let message = format!("not ready: {} {what}", self.failing.join(" and "));
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"error": "UNAVAILABLE", "message": message, "failing": self.failing, "checks": self.checks})),
            )
                .into_response()
        }
    }
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new()
    }
}

/// Whether `probe` answers `Ok` within `timeout` (a readiness check).
pub async fn answers<E>(timeout: Duration, probe: impl Future<Output = Result<(), E>>) -> bool {
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_task_hears_one_shutdown_and_stops() {
        let mut tasks = Tasks::new();
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        for i in 0..3 {
            let mut shutdown = tasks.shutdown();
            let tx = tx.clone();
            tasks.spawn(async move {
                shutdown.wait().await;
                tx.send(i).await.unwrap();
            });
        }
        drop(tx);
        tasks.stop(Duration::from_secs(5)).await;
        let mut heard = Vec::new();
        while let Some(i) = rx.recv().await {
            heard.push(i);
        }
        heard.sort();
        assert_eq!(heard, [0, 1, 2]);
    }

    #[tokio::test]
    async fn ticks_end_at_shutdown() {
        let trigger = Trigger::new();
        let mut ticks = Ticks::every(Duration::from_millis(1), trigger.subscribe());
        assert!(ticks.next().await);
        trigger.fire();
        // A fired shutdown wins over any number of due ticks.
        let mut ended = false;
        for _ in 0..100 {
            if !ticks.next().await {
                ended = true;
                break;
            }
        }
        assert!(ended);
    }

    #[test]
    fn a_chore_is_due_once_per_period() {
        let mut e = Every::new(Duration::from_secs(3600));
        assert!(!e.due());
        let mut now = Every::new(Duration::ZERO);
        assert!(now.due());
    }

    #[tokio::test]
    async fn housekeeping_runs_each_chore_on_its_period_and_goes_on_past_a_failure() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (fast, failing, slow) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (f, x, s) = (fast.clone(), failing.clone(), slow.clone());
        let trigger = Trigger::new();
        let task = tokio::spawn(
            Housekeeping::new()
                .every("fast", Duration::from_millis(20), move || {
                    f.fetch_add(1, Ordering::Relaxed);
                    async { Ok(()) }
                })
                .every("failing", Duration::from_millis(20), move || {
                    x.fetch_add(1, Ordering::Relaxed);
                    async { Err("down".to_string()) }
                })
                .every("slow", Duration::from_secs(3600), move || {
                    s.fetch_add(1, Ordering::Relaxed);
                    async { Ok(()) }
                })
                .run(trigger.subscribe()),
        );
        // Runs until both fast chores ran a few times (bounded: ~10 s).
        for _ in 0..1000 {
            if fast.load(Ordering::Relaxed) >= 3 && failing.load(Ordering::Relaxed) >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        trigger.fire();
        task.await.unwrap();
        assert!(fast.load(Ordering::Relaxed) >= 3);
        assert!(
            failing.load(Ordering::Relaxed) >= 3,
            "a failure does not stop a chore"
        );
        assert_eq!(slow.load(Ordering::Relaxed), 0, "not due within the run");
    }

    #[tokio::test]
    async fn readiness_names_what_fails() {
        let ok = Readiness::new()
            .check("database", true)
            .with("keys", 2)
            .respond("failing");
        assert_eq!(ok.status(), StatusCode::OK);
        let bad = Readiness::new()
            .check("database", true)
            .check("redis", false)
            .inform("revocations", false)
            .respond("not answering");
        assert_eq!(bad.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(bad.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["failing"], serde_json::json!(["redis"]));
        assert_eq!(v["message"], "not ready: redis not answering");
        assert_eq!(v["checks"]["revocations"], "unknown");
    }
}
