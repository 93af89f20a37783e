//! `auto` on a checkpoint with an MTP head (`mtp+suffix`): each round proposes either the MTP head's
//! tokens or the suffix drafter's copy, whichever is expected to commit more tokens per second.
//!
//! Algorithm. The suffix drafter plans its copy first (microseconds, no weights): up to the round's
//! limit, cut where more tokens would cost more than they bring ([`SuffixDrafter::plan_copy`]), with
//! its expected committed tokens E_s (step frequencies times the measured acceptance per copy
//! position). The MTP head's expectation for its block k (the tuner's) is E_m = a1 + a1 a2 + ... + a1...ak,
//! from its measured acceptance per position (decayed counts, each position smoothed toward
//! [`MTP_PRIOR_ACCEPTANCE`]). Rates at the measured round costs ([`RoundCosts`]): (1 + E_s) / V(|S| + 1)
//! for the copy, (1 + E_m) / (V(k + 1) + D·k) for the MTP head (its drafting priced per proposal; k = 0
//! is a plain step). The round takes the copy when its rate is at least the MTP head's. Costs are
//! measured in greedy `auto` runs only; elsewhere V is flat and D = 0 (the copy wins when E_s >= E_m),
//! so a seeded sampled run reproduces.
//!
//! The MTP head observes the rounds' committed rows lazily: their taps wait in a backlog (at most
//! `BACKLOG_ROWS` rows) until the head drafts, then it runs them in one call (a prompt's rows go
//! through at once, in prefill's time), so copy rounds do not pay the head's
//! per-row work (on the CPU testbed ~1 ms of a ~5 ms round) and a catch-up over many rows costs little
//! more than one (batch-invariant kernels give the same values either way).
//!
//! Invariant (exactness). Each round's proposals come from one drafter: the MTP head's with their
//! drafted q (it calls the [`Chooser`] for each), the suffix drafter's without (point masses, judged
//! as `Draft::PointMass`), and which one is decided before the round from the past only. Both
//! drafters observe every committed row (the MTP head with its taps), so either can propose next.

use crate::cost::RoundCosts;
use crate::suffix::SuffixDrafter;
use crate::{Chooser, Drafter, RoundTiming};
use families::{BackendError, Tap};

/// The MTP head's acceptance per position before it has been measured.
pub const MTP_PRIOR_ACCEPTANCE: f64 = 0.6;
/// Weight, in rounds, of the prior in each estimate.
const PRIOR_ROUNDS: f64 = 2.0;
/// Per-round decay of the counts (the text changes what each drafter gets right).
const MEMORY: f64 = 0.95;
/// Positions whose MTP acceptance is tracked (the exactness cap).
const POSITIONS: usize = 16;
/// Committed rows the MTP head may lag behind before it observes them anyway (bounds the backlog's
/// memory: rows x the taps' widths).
const BACKLOG_ROWS: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Mtp,
    Suffix,
}

pub struct MtpOrSuffix {
    mtp: Box<dyn Drafter + Send>,
    suffix: SuffixDrafter,
    /// The last round's proposer (None: a plain step) and the MTP head's proposal, judged at the next
    /// observe (the suffix drafter judges its own).
    pending: Option<(Source, Vec<u32>)>,
    last: Source,
    /// Who proposed in the last round (None: a plain step), for pricing it.
    round: Option<Source>,
    /// Decayed counts of MTP rounds that reached / accepted each position.
    mtp_reached: [f64; POSITIONS],
    mtp_accepted: [f64; POSITIONS],
    costs: RoundCosts,
    /// Rows committed but not yet observed by the MTP head: per tap [rows, width], and each row's
    /// next token.
    backlog_taps: Vec<Vec<f32>>,
    backlog_next: Vec<u32>,
}

impl MtpOrSuffix {
    pub fn new(mtp: Box<dyn Drafter + Send>, suffix: SuffixDrafter) -> Self {
        MtpOrSuffix {
            mtp,
            suffix,
            pending: None,
            last: Source::Mtp,
            round: None,
            mtp_reached: [0.0; POSITIONS],
            mtp_accepted: [0.0; POSITIONS],
            costs: RoundCosts::new(),
            backlog_taps: Vec::new(),
            backlog_next: Vec::new(),
        }
    }

    /// Lets the MTP head observe the backlog.
    fn catch_up(&mut self) -> Result<(), BackendError> {
        if self.backlog_next.is_empty() {
            return Ok(());
        }
        let next = std::mem::take(&mut self.backlog_next);
        let taps = std::mem::take(&mut self.backlog_taps);
        self.mtp.observe(&taps, next.len(), &next)
    }

    fn clear_backlog(&mut self) {
        self.backlog_taps.clear();
        self.backlog_next.clear();
    }

    /// The MTP head's expected accepted tokens for a block of `k`.
    fn mtp_expected(&self, k: usize) -> f64 {
        let (mut reach, mut sum) = (1.0, 0.0);
        for i in 0..k.min(POSITIONS) {
            let a = (self.mtp_accepted[i] + PRIOR_ROUNDS * MTP_PRIOR_ACCEPTANCE)
                / (self.mtp_reached[i] + PRIOR_ROUNDS);
            reach *= a;
            sum += reach;
        }
        sum
    }

    /// Judges the last round's MTP proposal against the committed tokens that followed it.
    fn learn(&mut self, next_tokens: &[u32]) {
        let Some((Source::Mtp, proposal)) = self.pending.take() else {
            return;
        };
        let accepted = proposal
            .iter()
            .zip(next_tokens)
            .take_while(|(p, t)| p == t)
            .count();
        for i in 0..POSITIONS {
            self.mtp_reached[i] *= MEMORY;
            self.mtp_accepted[i] *= MEMORY;
        }
        // Position i was judged when every one before it was accepted.
        let judged = (accepted + 1).min(proposal.len()).min(POSITIONS);
        for i in 0..judged {
            self.mtp_reached[i] += 1.0;
            if i < accepted {
                self.mtp_accepted[i] += 1.0;
            }
        }
    }
}

impl Drafter for MtpOrSuffix {
    fn name(&self) -> &'static str {
        "mtp+suffix"
    }

    fn proposer(&self) -> &'static str {
        match self.last {
            Source::Mtp => self.mtp.name(),
            Source::Suffix => self.suffix.name(),
        }
    }

    fn taps(&self) -> Vec<Tap> {
        self.mtp.taps()
    }

    fn reset(&mut self) {
        self.pending = None;
        self.clear_backlog();
        self.mtp.reset();
        self.suffix.reset();
    }

    fn forget_earlier_requests(&mut self) {
        self.mtp.forget_earlier_requests();
        self.suffix.forget_earlier_requests();
    }

    fn position(&self) -> usize {
        self.mtp.position() + self.backlog_next.len()
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        crate::check_rewind(self.position(), position)?;
        self.pending = None;
        let observed = self.mtp.position();
        if position >= observed {
            let rows = position - observed;
            let total = self.backlog_next.len().max(1);
            for t in &mut self.backlog_taps {
                t.truncate(t.len() / total * rows);
            }
            self.backlog_next.truncate(rows);
        } else {
            self.clear_backlog();
            self.mtp.rewind(position)?;
        }
        self.suffix.rewind(position)
    }

    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        if next_tokens.len() != n {
            return Err(families::ModelError::EmptyInput.into());
        }
        self.suffix.observe(&[], n, next_tokens)?;
        if self.backlog_taps.len() != taps.len() {
            self.catch_up()?;
            self.backlog_taps = vec![Vec::new(); taps.len()];
        }
        for (b, t) in self.backlog_taps.iter_mut().zip(taps) {
            b.extend_from_slice(t);
        }
        self.backlog_next.extend_from_slice(next_tokens);
        // A prompt's rows (more than any round keeps) go through at once, in prefill's time.
        if self.backlog_next.len() >= BACKLOG_ROWS || n > POSITIONS + 1 {
            self.catch_up()?;
        }
        self.learn(next_tokens);
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        self.propose_within(history, k, k, chooser)
    }

    fn propose_within(
        &mut self,
        history: &[u32],
        k: usize,
        limit: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        self.pending = None;
        self.round = None;
        let copy = self.suffix.plan_copy(history, limit.max(k), &self.costs);
        let mtp_rate = self.costs.model_rate(k, self.mtp_expected(k));
        if !copy.tokens.is_empty() && copy.rate >= mtp_rate {
            (self.last, self.round) = (Source::Suffix, Some(Source::Suffix));
            self.pending = Some((Source::Suffix, copy.tokens.clone()));
            return Ok(copy.tokens);
        }
        if k == 0 {
            return Ok(Vec::new());
        }
        self.catch_up()?;
        let proposal = self.mtp.propose(history, k, chooser)?;
        (self.last, self.round) = (Source::Mtp, Some(Source::Mtp));
        self.pending = Some((Source::Mtp, proposal.clone()));
        Ok(proposal)
    }

    fn record_costs(&mut self, timing: RoundTiming) {
        match self.round {
            Some(Source::Mtp) if timing.proposals > 0 => {
                self.costs
                    .record_model_draft(timing.proposals, timing.draft_seconds);
                self.costs.record_verify(timing.rows, timing.verify_seconds);
            }
            _ => self
                .costs
                .record_verify(timing.rows, timing.verify_seconds + timing.draft_seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suffix::COPY_PRIOR_ACCEPTANCE;
    use families::ModelError;

    /// A stand-in MTP head: proposes `k` copies of `token` through the chooser, counts its calls.
    struct Fixed {
        token: u32,
        position: usize,
        proposals: usize,
    }

    impl Drafter for Fixed {
        fn name(&self) -> &'static str {
            "mtp"
        }
        fn taps(&self) -> Vec<Tap> {
            Vec::new()
        }
        fn reset(&mut self) {
            self.position = 0;
        }
        fn position(&self) -> usize {
            self.position
        }
        fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
            if position > self.position {
                return Err(ModelError::EmptyInput.into());
            }
            self.position = position;
            Ok(())
        }
        fn observe(&mut self, _: &[Vec<f32>], n: usize, _: &[u32]) -> Result<(), BackendError> {
            self.position += n;
            Ok(())
        }
        fn propose(
            &mut self,
            history: &[u32],
            k: usize,
            chooser: &mut dyn Chooser,
        ) -> Result<Vec<u32>, BackendError> {
            self.proposals += 1;
            Ok((0..k)
                .map(|_| chooser.choose(&[0.0], history))
                .map(|_| self.token)
                .collect())
        }
    }

    struct Counting(usize);
    impl Chooser for Counting {
        fn choose(&mut self, _logits: &[f32], _context: &[u32]) -> u32 {
            self.0 += 1;
            0
        }
    }

    fn mixed() -> MtpOrSuffix {
        let mtp = Fixed {
            token: 999,
            position: 0,
            proposals: 0,
        };
        MtpOrSuffix::new(Box::new(mtp), SuffixDrafter::new())
    }

    #[test]
    fn a_supported_copy_wins_the_round_and_mtp_drafts_the_others() {
        let mut d = mixed();
        let mut chooser = Counting(0);
        // Nothing to copy: the MTP head drafts, through the chooser.
        let p = d.propose(&[1, 2, 3, 4], 3, &mut chooser).unwrap();
        assert_eq!((p, d.proposer(), chooser.0), (vec![999; 3], "mtp", 3));
        // A long phrase again: the copy is proposed as a point mass (no chooser call).
        let phrase: Vec<u32> = (10..30).collect();
        let h = [&phrase[..], &[5], &phrase[..8]].concat();
        let p = d.propose(&h, 3, &mut chooser).unwrap();
        assert_eq!(
            (p, d.proposer(), chooser.0),
            (vec![18, 19, 20], "suffix", 3)
        );
        // With room past the MTP block, the copy runs on (8 matched tokens: up to 16).
        let p = d.propose_within(&h, 3, 16, &mut chooser).unwrap();
        let whole = [(18..30).collect(), vec![5, 10, 11, 12]].concat();
        assert_eq!((p, chooser.0), (whole, 3));
        // A one-token match (two proposals at most) is taken while the suffix drafter's expectations
        // have held; once they have failed (ten expected, none accepted), the MTP head drafts.
        let h = [40, 41, 42, 43, 44, 40];
        assert_eq!(d.propose(&h, 3, &mut chooser).unwrap(), vec![41, 42]);
        assert_eq!(d.proposer(), "suffix");
        d.suffix.set_first_position_counts(10.0, 0.0);
        assert_eq!(d.propose(&h, 3, &mut chooser).unwrap(), vec![999; 3]);
        assert_eq!(d.proposer(), "mtp");
    }

    #[test]
    fn measured_costs_price_the_mtp_drafts_and_cut_long_copies() {
        let mut d = mixed();
        let mut chooser = Counting(0);
        // Rounds cost 2 ms + 0.1 ms a row; an MTP proposal 1 ms, and the head is sure of itself.
        for r in 1..=17 {
            d.costs.record_verify(r, 2e-3 + 1e-4 * r as f64);
        }
        d.costs.record_model_draft(1, 1e-3);
        (d.mtp_reached, d.mtp_accepted) = ([100.0; POSITIONS], [100.0; POSITIONS]);
        // A two-token copy expects less than MTP's three (2 < 3) but commits more per second:
        // 3 / 2.3 ms against 4 / 5.4 ms.
        let h = [40, 41, 42, 43, 44, 40];
        assert_eq!(d.propose(&h, 3, &mut chooser).unwrap(), vec![41, 42]);
        assert_eq!(chooser.0, 0);
        // When rows cost as much as steps, a copy whose chances fall is cut short.
        let mut costly = RoundCosts::new();
        for r in 1..=17 {
            costly.record_verify(r, 1e-3 * r as f64);
        }
        d.costs = costly;
        d.suffix.set_first_position_counts(100.0, 40.0);
        let phrase: Vec<u32> = (10..30).collect();
        let h = [&phrase[..], &[5], &phrase[..8]].concat();
        let p = d.propose_within(&h, 0, 16, &mut chooser).unwrap();
        assert!(p.len() < 8, "{p:?}");
    }

    #[test]
    fn outcomes_move_the_estimates() {
        let mut d = mixed();
        let mut chooser = Counting(0);
        let before = d.mtp_expected(3);
        // An MTP round whose first proposal was rejected.
        d.propose(&[1, 2, 3, 4], 3, &mut chooser).unwrap();
        d.observe(&[], 1, &[7]).unwrap();
        assert!(d.mtp_expected(3) < before);
        // A suffix round that was wholly accepted raises its first position above the prior.
        let phrase: Vec<u32> = (10..30).collect();
        let h = [&phrase[..], &[5], &phrase[..8]].concat();
        let p = d.propose(&h, 3, &mut chooser).unwrap();
        assert_eq!(d.proposer(), "suffix");
        let next = [&p[..], &[21]].concat();
        d.observe(&[], next.len(), &next).unwrap();
        assert!(d.suffix.position_acceptance(0) > COPY_PRIOR_ACCEPTANCE);
        // Both drafters followed every committed row.
        assert_eq!(d.position(), 1 + next.len());
        d.rewind(1).unwrap();
        assert_eq!(d.position(), 1);
    }
}
