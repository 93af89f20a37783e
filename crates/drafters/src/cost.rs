//! What a round costs, measured while a greedy `auto` run goes ([`crate::Drafter::record_costs`]), for
//! the drafters that size their own proposals: the suffix drafter chooses each copy's length, and
//! `mtp+suffix` also the source, by expected committed tokens per second.
//!
//! Model. A round that runs r target rows costs V(r) = a + b·r seconds (the verify forward, rollback
//! and the drafters' observe), fitted by least squares over the rounds, each weighted by `MEMORY` per
//! round after it, the slope pulled toward 0 by `RIDGE` rows² of weight (one row count alone gives a
//! flat line, never a wild slope) and kept >= 0. A model-drafted proposal costs D seconds more (the
//! decayed mean of the MTP head's seconds per proposal). On the CPU testbed V is close to linear in r
//! (AMX tiles: 2 / 5 / 9 / 17 rows cost ~1.1 / 1.3 / 1.9 / 3 one-row steps) and D is ~0.3 of a step,
//! so a copy's extra rows are cheap and an MTP proposal is not (`turbospark bench --workload ...`).
//!
//! Before any round is measured, and in sampled runs (which never read the clock, so that a seeded run
//! reproduces), V is flat (1 for every r) and D = 0: a copy is as long as its support allows, and the
//! mix takes the source expected to commit more tokens.
//!
//! Rate of a proposal of L tokens expected to commit E of them: (1 + E) / (V(L + 1) + D·L) for a model
//! draft, (1 + E) / V(L + 1) for a copy; a plain step commits 1 token for V(1).

/// Per-round decay of the samples (the text and the machine's load move the costs).
const MEMORY: f64 = 0.95;
/// Weight, in rows², pulling the fitted slope toward 0.
const RIDGE: f64 = 1.0;

/// Measured round costs; see the module doc.
#[derive(Clone, Debug, Default)]
pub struct RoundCosts {
    /// Decayed sums over verify samples (rows x, seconds y): weight, x, y, x², x·y.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    /// Decayed model-draft seconds and proposals.
    draft_seconds: f64,
    draft_proposals: f64,
}

impl RoundCosts {
    pub fn new() -> Self {
        Self::default()
    }

    /// A round of `rows` target rows took `seconds` (verify, rollback, observe).
    pub fn record_verify(&mut self, rows: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) || rows == 0 {
            return;
        }
        let x = rows as f64;
        self.w = self.w * MEMORY + 1.0;
        self.x = self.x * MEMORY + x;
        self.y = self.y * MEMORY + seconds;
        self.xx = self.xx * MEMORY + x * x;
        self.xy = self.xy * MEMORY + x * seconds;
    }

    /// A model drafter spent `seconds` on `proposals` proposals.
    pub fn record_model_draft(&mut self, proposals: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) || proposals == 0 {
            return;
        }
        self.draft_seconds = self.draft_seconds * MEMORY + seconds;
        self.draft_proposals = self.draft_proposals * MEMORY + proposals as f64;
    }

    /// V(rows): the fitted seconds of a round of `rows` rows, or 1 before any is measured.
    pub fn verify(&self, rows: usize) -> f64 {
        if self.w <= 0.0 {
            return 1.0;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let sxx = self.xx - self.x * mx;
        let sxy = self.xy - self.x * my;
        let b = (sxy / (sxx + RIDGE)).max(0.0);
        let a = my - b * mx;
        // A line fitted on long rounds only could cross zero before one row: never cheaper than b·1.
        (a + b * rows as f64)
            .max(b * rows as f64)
            .max(f64::MIN_POSITIVE)
    }

    /// D: a model draft's seconds per proposal, or 0 before any is measured.
    pub fn draft(&self) -> f64 {
        if self.draft_proposals <= 0.0 {
            0.0
        } else {
            self.draft_seconds / self.draft_proposals
        }
    }

    /// Committed tokens per second of a model draft of `k` proposals expected to commit `expected`
    /// (k = 0: a plain step).
    pub fn model_rate(&self, k: usize, expected: f64) -> f64 {
        (1.0 + expected) / (self.verify(k + 1) + self.draft() * k as f64)
    }

    /// The length of a copy to propose from its steps' chances `p[i]` of being accepted (given the
    /// ones before it, so the expected count of the first L is their sum), with its rate: the L of
    /// 0..=p.len() (0: a plain step) with the most committed tokens per second, the shorter on a tie.
    pub fn copy_length(&self, p: &[f64]) -> (usize, f64) {
        let mut best = (0, 1.0 / self.verify(1));
        let mut expected = 0.0;
        for (i, &pi) in p.iter().enumerate() {
            expected += pi;
            let rate = (1.0 + expected) / self.verify(i + 2);
            if rate > best.1 {
                best = (i + 1, rate);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmeasured_costs_are_flat_and_copies_take_their_whole_support() {
        let c = RoundCosts::new();
        assert_eq!((c.verify(1), c.verify(17), c.draft()), (1.0, 1.0, 0.0));
        assert_eq!(c.copy_length(&[0.9, 0.5, 0.2]).0, 3);
        assert_eq!(c.model_rate(3, 2.0), 3.0);
    }

    #[test]
    fn the_fit_follows_a_linear_cost_and_prices_rows() {
        let mut c = RoundCosts::new();
        // V(r) = 2 ms + 0.25 ms a row, rounds of 1 to 9 rows.
        for i in 0..200 {
            let r = 1 + i % 9;
            c.record_verify(r, 2e-3 + 0.25e-3 * r as f64);
        }
        assert!((c.verify(1) - 2.25e-3).abs() < 0.05e-3, "{}", c.verify(1));
        assert!((c.verify(17) - 6.25e-3).abs() < 0.3e-3, "{}", c.verify(17));
        // A sure copy goes long; one whose chances fall stops where a row costs more than it brings.
        assert_eq!(c.copy_length(&[1.0; 16]).0, 16);
        // 0.35, 0.245, 0.17, 0.12, ...: the rate peaks at 3 tokens (1.77 / 3.25 ms).
        let falling: Vec<f64> = (0..16).map(|i| 0.7f64.powi(i + 1) * 0.5).collect();
        assert_eq!(c.copy_length(&falling).0, 3);
        // A hopeless copy loses to a plain step.
        assert_eq!(c.copy_length(&[0.01, 0.001]).0, 0);
        // The model's drafts are priced per proposal.
        c.record_model_draft(3, 3e-3);
        assert!((c.draft() - 1e-3).abs() < 1e-12);
        assert!(c.model_rate(3, 2.0) < (1.0 + 2.0) / c.verify(4));
    }

    #[test]
    fn one_row_count_alone_gives_a_flat_line_and_bad_samples_are_ignored() {
        let mut c = RoundCosts::new();
        for _ in 0..10 {
            c.record_verify(4, 3e-3);
        }
        c.record_verify(4, f64::NAN);
        c.record_verify(0, 1.0);
        assert!((c.verify(1) - 3e-3).abs() < 1e-9 && (c.verify(16) - 3e-3).abs() < 1e-9);
    }
}
