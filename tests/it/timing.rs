//! Timing comparisons that hold on a shared, noisy machine: whether two
//! classes of requests (an unknown email and a known account, say) take
//! the same time, judged against the noise of the same run rather than
//! against a fixed ratio of two medians (which failed a correct build on a
//! fresh clone at 1.26 against a bound of 1.25).
//!
//! The method:
//! - the requests are made in rounds; each round makes one of class A, a
//!   second one of class A (A', another instance of the same class) and
//!   one of class B, in an order that rotates through all six orders, so
//!   that drift in the machine's load and the order within a round touch
//!   the three alike;
//! - each round gives two paired log-ratios: `ln(B/A)`, the effect, and
//!   `ln(A'/A)`, the A/A comparison, whose distribution is what the effect
//!   would look like if the classes took the same time;
//! - the floor is how far the median of the A/A ratios moves when the
//!   rounds are resampled (bootstrap, fixed seed: the 99.9th percentile of
//!   the distance of 2,000 resampled medians from the median), i.e. the
//!   median's own uncertainty in this run;
//! - the check fails only when the effect's median stands well above it:
//!   beyond four times the floor and beyond a difference of `min_ratio`
//!   (a difference smaller than that is not what these tests look for: a
//!   skipped hash or a skipped write costs several times the request).
//!
//! A failure prints the medians, the floor and the rounds' spread, so that
//! a real difference can be told from a noisy run.

use std::future::Future;
use std::time::Instant;

/// Which request a round is making.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    A,
    /// Another request of class A: the A/A comparison.
    ASecond,
    B,
}

/// The six orders of a round, taken in turn.
const ORDERS: [[Class; 3]; 6] = [
    [Class::A, Class::ASecond, Class::B],
    [Class::A, Class::B, Class::ASecond],
    [Class::ASecond, Class::A, Class::B],
    [Class::ASecond, Class::B, Class::A],
    [Class::B, Class::A, Class::ASecond],
    [Class::B, Class::ASecond, Class::A],
];

/// What a comparison measured.
#[derive(Debug)]
pub struct Verdict {
    /// The median of `ln(B/A)` over the rounds, as a ratio.
    pub effect: f64,
    /// The median of `ln(A'/A)`, as a ratio.
    pub same: f64,
    /// The floor, as a ratio: 1 + the median's uncertainty.
    pub floor: f64,
    pub median_a_ms: f64,
    pub median_b_ms: f64,
}

impl Verdict {
    /// Whether B differs from A well beyond this run's noise and beyond
    /// `min_ratio`.
    pub fn differs(&self, min_ratio: f64) -> bool {
        let effect = self.effect.ln().abs();
        effect > 4.0 * self.floor.ln() && effect > min_ratio.ln()
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "B/A {:.3} (A/A {:.3}, floor {:.3}); medians A {:.3} ms, B {:.3} ms",
            self.effect, self.same, self.floor, self.median_a_ms, self.median_b_ms
        )
    }
}

/// Times `rounds` rounds of `one(class, round)` (see the module notes),
/// waiting `settle` after each request (untimed): a request that leaves
/// work behind (a mail to send) must not slow whichever request follows,
/// or the class that follows it more often looks slower.
pub async fn compare<F, Fut>(rounds: usize, settle: std::time::Duration, mut one: F) -> Verdict
where
    F: FnMut(Class, usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let (mut effect, mut same) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let (mut all_a, mut all_b) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for round in 0..rounds {
        let mut took = [0f64; 3];
        for class in ORDERS[round % ORDERS.len()] {
            let start = Instant::now();
            one(class, round).await;
            took[class as usize] = start.elapsed().as_secs_f64() * 1000.0;
            tokio::time::sleep(settle).await;
        }
        let [a, a2, b] = took;
        effect.push((b / a).ln());
        same.push((a2 / a).ln());
        all_a.push(a);
        all_b.push(b);
    }
    let floor = bootstrap_spread(&same, 2000, 0.999);
    Verdict {
        effect: median(&mut effect).exp(),
        same: median(&mut same).exp(),
        floor: floor.exp(),
        median_a_ms: median(&mut all_a),
        median_b_ms: median(&mut all_b),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `quantile` of how far the median of `samples`, resampled with
/// replacement, lands from the median itself (`resamples` times, with a
/// fixed seed so that a run is repeatable from its samples).
fn bootstrap_spread(samples: &[f64], resamples: usize, quantile: f64) -> f64 {
    let center = median(&mut samples.to_vec());
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        // xorshift64*: enough for picking indices.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut distances: Vec<f64> = (0..resamples)
        .map(|_| {
            let mut r: Vec<f64> = (0..samples.len())
                .map(|_| samples[(next() % samples.len() as u64) as usize])
                .collect();
            (median(&mut r) - center).abs()
        })
        .collect();
    distances.sort_by(f64::total_cmp);
    distances[((resamples as f64 * quantile) as usize).min(resamples - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_same_work_does_not_differ_and_twice_the_work_does() {
        let spin = |micros: u64| {
            let until = Instant::now() + std::time::Duration::from_micros(micros);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        let none = std::time::Duration::ZERO;
        let same = compare(60, none, |_, _| async { spin(300) }).await;
        assert!(!same.differs(1.15), "{same}");
        let double = compare(60, none, |c, _| async move {
            spin(if c == Class::B { 900 } else { 300 })
        })
        .await;
        assert!(double.differs(1.15), "{double}");
    }
}
