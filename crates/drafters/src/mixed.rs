//! `auto` on a checkpoint with an MTP head (`mtp+suffix`): each round proposes either the MTP head's
//! tokens or the suffix drafter's, whichever is expected to commit more per verified row.
//!
//! Algorithm. The suffix drafter is asked first (microseconds, no weights): its proposal S comes with
//! its support E_s, the tokens its counts expect accepted, scaled by how its expectations have fared
//! (accepted over expected, decayed, starting at 1). The MTP head's expectation for a block of k is
//! E_m = a1 + a1 a2 + ... + a1...ak, from its measured acceptance per position (decayed counts, each
//! position smoothed toward [`MTP_PRIOR_ACCEPTANCE`]). The round takes S when E_s >= E_m and S commits
//! at least as much per verified row, (1 + E_s) / (1 + |S|) >= (1 + E_m) / (1 + k); otherwise the MTP
//! head drafts. The MTP head's drafting time is not counted against it, so MTP keeps every round the
//! copy does not clearly win. Nothing here reads the clock: the choice depends only on committed
//! tokens and earlier rounds' outcomes, so a seeded sampled run reproduces.
//!
//! Invariant (exactness). Each round's proposals come from one drafter: the MTP head's with their
//! drafted q (it calls the [`Chooser`] for each), the suffix drafter's without (point masses, judged
//! as `Draft::PointMass`), and which one is decided before the round from the past only. Both
//! drafters observe every committed row (the MTP head with its taps), so either can propose next.

use crate::suffix::SuffixDrafter;
use crate::{Chooser, Drafter};
use families::{BackendError, Tap};

/// The MTP head's acceptance per position before it has been measured.
pub const MTP_PRIOR_ACCEPTANCE: f64 = 0.6;
/// Weight, in rounds, of the prior in each estimate.
const PRIOR_ROUNDS: f64 = 2.0;
/// Per-round decay of the counts (the text changes what each drafter gets right).
const MEMORY: f64 = 0.95;
/// Positions whose MTP acceptance is tracked (the exactness cap).
const POSITIONS: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Mtp,
    Suffix,
}

pub struct MtpOrSuffix {
    mtp: Box<dyn Drafter + Send>,
    suffix: SuffixDrafter,
    /// The last round's proposer, its proposal and (suffix) its support, judged at the next observe.
    pending: Option<(Source, Vec<u32>, f64)>,
    last: Source,
    /// Decayed counts of MTP rounds that reached / accepted each position.
    mtp_reached: [f64; POSITIONS],
    mtp_accepted: [f64; POSITIONS],
    /// Decayed sums of the suffix drafter's expected and accepted tokens.
    suffix_expected: f64,
    suffix_accepted: f64,
}

impl MtpOrSuffix {
    pub fn new(mtp: Box<dyn Drafter + Send>, suffix: SuffixDrafter) -> Self {
        MtpOrSuffix {
            mtp,
            suffix,
            pending: None,
            last: Source::Mtp,
            mtp_reached: [0.0; POSITIONS],
            mtp_accepted: [0.0; POSITIONS],
            suffix_expected: 0.0,
            suffix_accepted: 0.0,
        }
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

    /// How the suffix drafter's expectations have fared: accepted over expected (1 at first).
    fn suffix_calibration(&self) -> f64 {
        (self.suffix_accepted + PRIOR_ROUNDS) / (self.suffix_expected + PRIOR_ROUNDS)
    }

    /// Judges the last round's proposal against the committed tokens that followed it.
    fn learn(&mut self, next_tokens: &[u32]) {
        let Some((source, proposal, support)) = self.pending.take() else {
            return;
        };
        let accepted = proposal
            .iter()
            .zip(next_tokens)
            .take_while(|(p, t)| p == t)
            .count();
        match source {
            Source::Mtp => {
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
            Source::Suffix => {
                self.suffix_expected = self.suffix_expected * MEMORY + support;
                self.suffix_accepted = self.suffix_accepted * MEMORY + accepted as f64;
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
        self.mtp.reset();
        self.suffix.reset();
    }

    fn forget_earlier_requests(&mut self) {
        self.mtp.forget_earlier_requests();
        self.suffix.forget_earlier_requests();
    }

    fn position(&self) -> usize {
        self.mtp.position()
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        self.pending = None;
        self.mtp.rewind(position)?;
        self.suffix.rewind(position)
    }

    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        self.mtp.observe(taps, n, next_tokens)?;
        self.suffix.observe(&[], n, next_tokens)?;
        self.learn(next_tokens);
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        self.pending = None;
        if k == 0 {
            return Ok(Vec::new());
        }
        let (copy, support) = self.suffix.propose_with_support(history, k);
        let expected = f64::from(support) * self.suffix_calibration();
        let mtp = self.mtp_expected(k);
        let rows = |proposed: usize, expected: f64| (1.0 + expected) / (1.0 + proposed as f64);
        let take_copy =
            !copy.is_empty() && expected >= mtp && rows(copy.len(), expected) >= rows(k, mtp);
        let (source, proposal, support) = if take_copy {
            (Source::Suffix, copy, f64::from(support))
        } else {
            (Source::Mtp, self.mtp.propose(history, k, chooser)?, 0.0)
        };
        self.last = source;
        self.pending = Some((source, proposal.clone(), support));
        Ok(proposal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        // A one-token match (two proposals at most) is taken while the suffix drafter's expectations
        // have held; once they have failed (ten expected, none accepted), the MTP head drafts.
        let h = [40, 41, 42, 43, 44, 40];
        assert_eq!(d.propose(&h, 3, &mut chooser).unwrap(), vec![41, 42]);
        assert_eq!(d.proposer(), "suffix");
        (d.suffix_expected, d.suffix_accepted) = (10.0, 0.0);
        assert_eq!(d.propose(&h, 3, &mut chooser).unwrap(), vec![999; 3]);
        assert_eq!(d.proposer(), "mtp");
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
        // A suffix round that was wholly accepted raises its calibration above 1.
        let phrase: Vec<u32> = (10..30).collect();
        let h = [&phrase[..], &[5], &phrase[..8]].concat();
        let p = d.propose(&h, 3, &mut chooser).unwrap();
        assert_eq!(d.proposer(), "suffix");
        let next = [&p[..], &[21]].concat();
        d.observe(&[], next.len(), &next).unwrap();
        assert!(d.suffix_calibration() >= 1.0);
        // Both drafters followed every committed row.
        assert_eq!(d.position(), 1 + next.len());
        d.rewind(1).unwrap();
        assert_eq!(d.position(), 1);
    }
}
