//! Pearson's chi-square goodness-of-fit test at significance 0.001, shared by the statistical
//! tests. Draws use fixed seeds, so every test is deterministic: it either always passes or always
//! fails; the threshold only says how surprising a pass/fail would be for a correct sampler.

#![allow(dead_code)] // each test binary uses a different subset

/// Upper 0.001 quantiles of the chi-square distribution for df = 1..=30 (standard tables;
/// re-derived by bisection on the regularised incomplete gamma function).
const CRITICAL_P001: [f64; 30] = [
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909,
    34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820, 45.315, 46.797, 48.268, 49.728, 51.179,
    52.620, 54.052, 55.476, 56.892, 58.301, 59.703,
];

/// The outcome of comparing observed counts with expected probabilities.
#[derive(Debug)]
pub struct ChiSquare {
    pub statistic: f64,
    pub df: usize,
    pub critical: f64,
    /// Draws that landed on a bin of probability 0 (any is a failure by itself).
    pub impossible_draws: u64,
}

impl ChiSquare {
    /// Consistent with the expected distribution at p = 0.001.
    pub fn consistent(&self) -> bool {
        self.impossible_draws == 0 && self.statistic <= self.critical
    }
}

/// Pearson's statistic of `counts[i]` against `probs[i] * total`, over bins with positive
/// probability (each must expect >= 5 draws for the approximation to hold).
pub fn chi_square(counts: &[u64], probs: &[f64]) -> ChiSquare {
    assert_eq!(counts.len(), probs.len());
    let total: u64 = counts.iter().sum();
    let mut statistic = 0.0;
    let mut bins = 0usize;
    let mut impossible_draws = 0;
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            impossible_draws += c;
            continue;
        }
        let expected = p * total as f64;
        assert!(
            expected >= 5.0,
            "bin expects {expected} draws: too few for chi-square"
        );
        statistic += (c as f64 - expected).powi(2) / expected;
        bins += 1;
    }
    assert!((2..=31).contains(&bins), "{bins} bins: outside the table");
    let df = bins - 1;
    ChiSquare {
        statistic,
        df,
        critical: CRITICAL_P001[df - 1],
        impossible_draws,
    }
}

/// Panics with the statistic when `counts` is not consistent with `probs`.
pub fn assert_distributed_as(counts: &[u64], probs: &[f64]) {
    let result = chi_square(counts, probs);
    assert!(
        result.consistent(),
        "not distributed as expected: {result:?}\ncounts {counts:?}\nprobs {probs:?}"
    );
}
