//! When a password hash may wait for a hashing thread: admission by a
//! latency objective (`hash_latency_objective_ms`).
//!
//! ```text
//!   a job arrives ── a thread is free and nobody waits ──────────► Start
//!        │
//!        ├── `queue` jobs wait already (the memory bound) ──────────► QueueFull
//!        │
//!        │ predicted answer = wait for a thread + one hash
//!        ├── predicted > objective ─────────────────────────────► Shed (at once)
//!        ▼
//!   Wait { at_most: objective - one hash } ── a thread frees ───► running
//!        │                                                          │
//!        │ still waiting at `at_most` (the queue moved slower       │ done: the
//!        ▼  than predicted: the CPU went elsewhere)                 ▼ mean learns
//!   shed late                                                    answered
//! ```
//!
//! The prediction: with every thread busy and `waiting` jobs ahead, a new
//! job starts after about `waiting / threads + 1/2` hash times (the running
//! jobs are half done on average). The hash time is the mean of the recent
//! jobs' wall time on their thread, preemptions included: when requests
//! take the CPU from the hashing threads, the mean grows and the queue
//! admits fewer jobs. So a hash is refused only when it could not be
//! answered within the objective, never because a fixed queue length or a
//! fixed wait was reached below capacity; and no admitted job waits past
//! the moment it can no longer finish in time.
//!
//! Pure: the pool ([`super::hashing::HashPool`]) counts running and waiting
//! jobs and times the hashes; this decides.

use std::time::Duration;

/// What to do with an arriving job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A thread is free: run now.
    Start,
    /// Queue, and give up if no thread is free within `at_most`.
    Wait { at_most: Duration },
    /// The objective cannot be met: refuse now.
    Shed,
    /// The queue holds its maximum (a bound on memory): refuse now.
    QueueFull,
}

/// The learnt hash time and the objective it is held to.
#[derive(Clone, Debug)]
pub struct Admission {
    threads: usize,
    objective: Duration,
    /// At most this many jobs wait at once.
    queue: usize,
    /// Exponentially weighted mean of the recent hashes' wall time; zero
    /// until the first hash is timed (the first jobs are admitted).
    mean: Duration,
}

/// The weight of the newest hash in the mean (1/8: a mean over about the
/// last eight hashes, quick to follow a change in the CPU the threads get).
const NEWEST_WEIGHT: f64 = 1.0 / 8.0;

impl Admission {
    pub fn new(threads: usize, objective: Duration) -> Admission {
        Admission {
            threads: threads.max(1),
            objective,
            queue: usize::MAX,
            mean: Duration::ZERO,
        }
    }

    /// At most `queue` jobs may wait at once, whatever the objective allows.
    pub fn with_queue(self, queue: usize) -> Admission {
        Admission { queue, ..self }
    }

    /// The decision for a job that finds `running` jobs on the threads and
    /// `waiting` jobs queued before it.
    pub fn decide(&self, running: usize, waiting: usize) -> Decision {
        if running < self.threads && waiting == 0 {
            return Decision::Start;
        }
        if waiting >= self.queue {
            return Decision::QueueFull;
        }
        let hashes_ahead = waiting as f64 / self.threads as f64 + 0.5;
        let predicted = self.mean.mul_f64(hashes_ahead) + self.mean;
        if predicted > self.objective {
            return Decision::Shed;
        }
        Decision::Wait {
            at_most: self.objective.saturating_sub(self.mean),
        }
    }

    /// A hash took `took` on its thread. One pathological job (an imported
    /// hash with costly parameters) counts as at most the objective: it
    /// cannot make the pool refuse everything.
    pub fn observe(&mut self, took: Duration) {
        let took = took.min(self.objective);
        self.mean = if self.mean.is_zero() {
            took
        } else {
            self.mean.mul_f64(1.0 - NEWEST_WEIGHT) + took.mul_f64(NEWEST_WEIGHT)
        };
    }

    /// The current estimate of one hash's wall time.
    pub fn mean(&self) -> Duration {
        self.mean
    }

    pub fn objective(&self) -> Duration {
        self.objective
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Two threads, a 500 ms objective, hashes of 20 ms learnt.
    fn learnt() -> Admission {
        let mut a = Admission::new(2, 500 * MS);
        a.observe(20 * MS);
        a
    }

    #[test]
    fn a_free_thread_starts_at_once_and_a_queue_forms_only_when_all_are_busy() {
        let a = learnt();
        assert_eq!(a.decide(0, 0), Decision::Start);
        assert_eq!(a.decide(1, 0), Decision::Start);
        assert_eq!(a.decide(2, 0), Decision::Wait { at_most: 480 * MS });
        // Someone already waits: a new job queues behind them even if a
        // thread has just been freed (first come, first served).
        assert_eq!(a.decide(1, 1), Decision::Wait { at_most: 480 * MS });
    }

    #[test]
    fn jobs_queue_up_to_what_the_objective_allows_and_no_further() {
        let a = learnt();
        // (w / 2 + 0.5) * 20 ms + 20 ms <= 500 ms  <=>  w <= 47.
        assert!(matches!(a.decide(2, 47), Decision::Wait { .. }));
        assert_eq!(a.decide(2, 48), Decision::Shed);
    }

    #[test]
    fn a_longer_objective_admits_a_longer_queue() {
        let mut a = Admission::new(2, 2000 * MS);
        a.observe(20 * MS);
        assert!(matches!(a.decide(2, 190), Decision::Wait { .. }));
        assert_eq!(a.decide(2, 200), Decision::Shed);
    }

    #[test]
    fn slower_hashes_shorten_the_queue() {
        let mut a = learnt();
        assert!(matches!(a.decide(2, 40), Decision::Wait { .. }));
        // The threads lose the CPU: hashes now take 60 ms on the wall clock.
        for _ in 0..40 {
            a.observe(60 * MS);
        }
        assert!((a.mean().as_secs_f64() - 0.060).abs() < 0.001, "{:?}", a.mean());
        assert_eq!(a.decide(2, 40), Decision::Shed);
        // (w / 2 + 0.5) * 60 + 60 <= 500  <=>  w <= 13.
        assert!(matches!(a.decide(2, 13), Decision::Wait { .. }));
        assert_eq!(a.decide(2, 14), Decision::Shed);
    }

    #[test]
    fn the_mean_follows_recent_hashes() {
        let mut a = Admission::new(1, 500 * MS);
        assert_eq!(a.mean(), Duration::ZERO);
        a.observe(16 * MS);
        assert_eq!(a.mean(), 16 * MS, "the first hash sets the mean");
        a.observe(24 * MS);
        assert_eq!(a.mean(), 17 * MS);
    }

    #[test]
    fn before_any_hash_is_timed_every_job_is_admitted() {
        let a = Admission::new(1, 500 * MS);
        assert_eq!(a.decide(1, 1000), Decision::Wait { at_most: 500 * MS });
    }

    #[test]
    fn a_hash_slower_than_the_objective_is_shed_when_it_would_have_to_wait() {
        let mut a = Admission::new(1, 100 * MS);
        a.observe(150 * MS);
        assert_eq!(a.decide(0, 0), Decision::Start, "a free thread still runs it");
        assert_eq!(a.decide(1, 0), Decision::Shed);
    }

    #[test]
    fn the_queue_bound_refuses_whatever_the_objective_allows() {
        let a = learnt().with_queue(10);
        assert!(matches!(a.decide(2, 9), Decision::Wait { .. }));
        assert_eq!(a.decide(2, 10), Decision::QueueFull);
        assert_eq!(a.decide(0, 0), Decision::Start, "a free thread needs no queue");
    }
}
