//! Metrics that every request writes, kept in per-thread stripes.
//!
//! A counter or histogram shared by every core costs a cache line moving
//! between cores on each write, and the Prometheus recorder's histogram
//! also keeps every sample (with a timestamp) in a shared buffer until the
//! next scrape. The few metrics on the request path are kept here instead:
//! each thread writes its own stripe (a relaxed add to a line no other core
//! writes), and a scrape sums the stripes.
//!
//! ```text
//!   worker thread 1 ──add──▶ stripe 1 ─┐
//!   worker thread 2 ──add──▶ stripe 2 ─┼─ sum, when /metrics is read ─▶ text
//!   ...             (a thread keeps   ─┘
//!                    its stripe)
//! ```
//!
//! - [`Counter`]: a recorder counter whose increments wait in stripes;
//!   [`publish_counters`] adds them to the recorder before it renders.
//! - [`Sum`]: a value that goes up and down (requests in flight), read by
//!   adding the stripes.
//! - [`Histograms`]: one latency histogram per cell (a label set chosen by
//!   its owner), rendered by its owner in the Prometheus text format with
//!   [`Histograms::render`]: bucket counts, `_sum` and `_count`, and a
//!   counter of the same requests.
//!
//! Nothing is lost or counted twice: each stripe is drained with one atomic
//! swap, and a sum read while threads write is the sum at some instant of
//! each stripe (Prometheus asks no more of a counter).

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Stripes per metric. Threads take them in turn, so beyond eight threads
/// some share a stripe (still exact, since every write is atomic, only
/// slower): sized for the worker threads of a small machine.
const STRIPES: usize = 8;

/// The stripe of the calling thread: threads take stripes in turn as they
/// first write a metric, and keep theirs.
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

#[repr(align(128))]
struct Padded<T>(T);

/// A sum kept in stripes and read by adding them up: a gauge that goes up
/// and down (a value may be added on one thread and taken away on another:
/// only the sum means anything).
pub struct Sum {
    stripes: [Padded<AtomicI64>; STRIPES],
}

impl Default for Sum {
    fn default() -> Sum {
        Sum::new()
    }
}

impl Sum {
    pub const fn new() -> Sum {
        Sum {
            stripes: [const { Padded(AtomicI64::new(0)) }; STRIPES],
        }
    }

    pub fn add(&self, n: i64) {
        self.stripes[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn read(&self) -> i64 {
        self.stripes.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// A recorder counter whose increments are kept per thread until
/// [`publish_counters`] adds them to it. For `'static` counters on the
/// request path: the recorder's own handle writes one shared word.
pub struct Counter {
    stripes: [Padded<AtomicU64>; STRIPES],
    target: metrics::Counter,
}

static COUNTERS: Mutex<Vec<&'static Counter>> = Mutex::new(Vec::new());

impl Counter {
    /// Wraps a recorder counter and registers it for [`publish_counters`]:
    /// once per counter and process (its stripes are never freed), for a
    /// fixed set of `'static` counters.
    pub fn register(target: metrics::Counter) -> &'static Counter {
        let c: &'static Counter = Box::leak(Box::new(Counter {
            stripes: [const { Padded(AtomicU64::new(0)) }; STRIPES],
            target,
        }));
        COUNTERS.lock().expect("striped counters").push(c);
        c
    }

    pub fn increment(&self, n: u64) {
        self.stripes[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    fn publish(&self) {
        let n: u64 = self.stripes.iter().map(|s| s.0.swap(0, Ordering::Relaxed)).sum();
        if n > 0 {
            self.target.increment(n);
        }
    }
}

/// Adds what every striped counter holds to its recorder counter: called
/// before the recorder renders.
pub fn publish_counters() {
    for c in COUNTERS.lock().expect("striped counters").iter() {
        c.publish();
    }
}

/// Buckets' upper bounds in seconds, 100 us to 5 s, dense enough to read
/// P50/P95/P99 (the recorder's histograms use the same).
pub const LATENCY_BUCKETS: [f64; 27] = [
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
];

/// One stripe of one histogram: observations per bucket (not cumulative;
/// the last is past every bound) and their sum in nanoseconds.
#[repr(align(128))]
struct Counts {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

/// Latency histograms, one per cell (`0..cells`), each in stripes that are
/// allocated the first time a thread records into that cell.
pub struct Histograms {
    cells: Box<[[OnceLock<Box<Counts>>; STRIPES]]>,
}

impl Histograms {
    pub fn new(cells: usize) -> Histograms {
        Histograms {
            cells: (0..cells).map(|_| [const { OnceLock::new() }; STRIPES]).collect(),
        }
    }

    pub fn record(&self, cell: usize, elapsed: Duration) {
        let counts = self.cells[cell][stripe()].get_or_init(|| {
            Box::new(Counts {
                buckets: [const { AtomicU64::new(0) }; LATENCY_BUCKETS.len() + 1],
                sum_ns: AtomicU64::new(0),
            })
        });
        let secs = elapsed.as_secs_f64();
        // A bucket counts what is at most its bound (Prometheus' `le`).
        let bucket = LATENCY_BUCKETS.partition_point(|&bound| bound < secs);
        counts.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        counts.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A cell's observations per bucket (cumulative, `+Inf` last) and their
    /// sum in seconds; `None` if nothing was ever recorded in it.
    fn read(&self, cell: usize) -> Option<([u64; LATENCY_BUCKETS.len() + 1], f64)> {
        let mut cumulative = [0u64; LATENCY_BUCKETS.len() + 1];
        let mut sum_ns = 0u64;
        let mut seen = false;
        for counts in self.cells[cell].iter().filter_map(OnceLock::get) {
            seen = true;
            for (total, b) in cumulative.iter_mut().zip(&counts.buckets) {
                *total += b.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.saturating_add(counts.sum_ns.load(Ordering::Relaxed));
        }
        for i in 1..cumulative.len() {
            cumulative[i] += cumulative[i - 1];
        }
        seen.then_some((cumulative, sum_ns as f64 / 1e9))
    }

    /// Appends, in the Prometheus text format, the counter `total` (the
    /// observations of each cell) and the histogram `histogram`, each with
    /// its help text. `labels(cell)` gives a cell's labels, already in the
    /// text format (`route="/x",method="GET"`). Cells never recorded into
    /// are left out.
    pub fn render(
        &self,
        out: &mut String,
        total: (&str, &str),
        histogram: (&str, &str),
        labels: impl Fn(usize) -> String,
    ) {
        let read: Vec<(String, [u64; LATENCY_BUCKETS.len() + 1], f64)> = (0..self.cells.len())
            .filter_map(|cell| self.read(cell).map(|(b, sum)| (labels(cell), b, sum)))
            .collect();
        let (name, help) = total;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, buckets, _) in &read {
            let _ = writeln!(out, "{name}{{{labels}}} {}", buckets[LATENCY_BUCKETS.len()]);
        }
        out.push('\n');
        let (name, help) = histogram;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (labels, buckets, sum) in &read {
            for (bound, n) in LATENCY_BUCKETS.iter().zip(buckets) {
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {n}");
            }
            let count = buckets[LATENCY_BUCKETS.len()];
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn observations_from_many_threads_are_summed_into_cumulative_buckets() {
        let h = Histograms::new(3);
        std::thread::scope(|s| {
            for _ in 0..12 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        h.record(1, Duration::from_micros(100)); // on the first bound: counted in it
                        h.record(1, ms(4)); // in (3 ms, 5 ms]
                        h.record(1, Duration::from_secs(9)); // past every bound
                    }
                });
            }
        });
        let (buckets, sum) = h.read(1).expect("recorded");
        assert_eq!(buckets[0], 12_000, "le=0.0001");
        let le_3ms = LATENCY_BUCKETS.iter().position(|&b| b == 0.003).unwrap();
        assert_eq!(buckets[le_3ms], 12_000);
        assert_eq!(buckets[le_3ms + 1], 24_000, "le=0.005");
        assert_eq!(buckets[LATENCY_BUCKETS.len() - 1], 24_000, "le=5");
        assert_eq!(buckets[LATENCY_BUCKETS.len()], 36_000, "+Inf: every observation");
        assert!((sum - 12_000.0 * (0.0001 + 0.004 + 9.0)).abs() < 1e-6, "{sum}");
        assert!(
            h.read(0).is_none() && h.read(2).is_none(),
            "other cells untouched"
        );
    }

    #[test]
    fn rendering_lists_recorded_cells_in_the_prometheus_text_format() {
        let h = Histograms::new(2);
        h.record(1, ms(2));
        h.record(1, ms(40));
        let mut out = String::new();
        h.render(&mut out, ("t_total", "Things"), ("t_seconds", "How long"), |c| {
            format!("cell=\"{c}\"")
        });
        let lines: Vec<&str> = out.lines().collect();
        for want in [
            "# HELP t_total Things",
            "# TYPE t_total counter",
            "t_total{cell=\"1\"} 2",
            "# TYPE t_seconds histogram",
            "t_seconds_bucket{cell=\"1\",le=\"0.0015\"} 0",
            "t_seconds_bucket{cell=\"1\",le=\"0.002\"} 1",
            "t_seconds_bucket{cell=\"1\",le=\"0.05\"} 2",
            "t_seconds_bucket{cell=\"1\",le=\"+Inf\"} 2",
            "t_seconds_sum{cell=\"1\"} 0.042",
            "t_seconds_count{cell=\"1\"} 2",
        ] {
            assert!(lines.contains(&want), "{want:?} missing from\n{out}");
        }
        assert!(
            !out.contains("cell=\"0\""),
            "a cell never recorded into is left out"
        );
    }

    #[test]
    fn a_sum_added_on_one_thread_and_taken_away_on_another_reads_right() {
        let in_flight = Sum::new();
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| (0..1000).for_each(|_| in_flight.add(1)));
            }
        });
        assert_eq!(in_flight.read(), 6000);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| (0..1000).for_each(|_| in_flight.add(-1)));
            }
        });
        assert_eq!(in_flight.read(), 3000);
    }

    #[test]
    fn a_striped_counter_hands_every_increment_to_its_recorder_counter_once() {
        // The recorder stand-in is metrics' own atomic counter: an `Arc<AtomicU64>`
        // is a `CounterFn`.
        let seen = std::sync::Arc::new(AtomicU64::new(0));
        let c = Counter::register(metrics::Counter::from_arc(seen.clone()));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| (0..500).for_each(|_| c.increment(1)));
            }
        });
        publish_counters();
        assert_eq!(seen.load(Ordering::Relaxed), 4000);
        c.increment(2);
        publish_counters();
        publish_counters();
        assert_eq!(seen.load(Ordering::Relaxed), 4002, "drained once, not twice");
    }
}
