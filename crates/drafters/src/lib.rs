//! Drafters propose tokens for the speculative loop; the target verifies them.
//!
//! The interface is family-agnostic (DESIGN.md §1): a drafter sees committed token ids and the hidden-state
//! taps it asked the target for, never family internals. Its own context advances only through
//! `observe` with *verified* rows; anything `propose` writes past that is speculative and is discarded by
//! the next `observe` (the drafter rewinds to its committed position first).
//!
//! [`NgramDrafter`] (prompt lookup) and [`SuffixDrafter`] (SuffixDecoding's suffix structure, over the
//! current sequence and earlier requests') need no weights and no taps: they copy from committed tokens.
//!
//! The drafters here run on the host whatever device the target runs on: they read the target only
//! through `families::TargetHead` (embedding rows, LM head; the CPU engine itself or a `HostHead` copy)
//! and the taps the target's forward returns in host memory. A device may bring its own implementation
//! of [`Drafter`] (the CUDA backend's `CudaMtp` runs the MTP head on the GPU), which is why drafter calls
//! fail with a `BackendError` (a device failure, or the CPU engine's `ModelError`). Acceptance depends
//! only on the target's logits, so where the drafter runs cannot change what is generated.

pub mod cost;
pub mod dflash;
pub mod mixed;
pub mod mtp;
pub mod ngram;
pub mod suffix;

pub use dflash::DflashDrafter;
pub use mixed::MtpOrSuffix;
pub use mtp::MtpHead;
pub use ngram::NgramDrafter;
pub use suffix::SuffixDrafter;

/// What the round a drafter just observed cost ([`Drafter::record_costs`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundTiming {
    /// Target rows the round ran (its proposals + 1).
    pub rows: usize,
    /// Tokens the drafter proposed.
    pub proposals: usize,
    /// Seconds the drafter spent proposing.
    pub draft_seconds: f64,
    /// Seconds of the rest of the round: verify forward, rollback, and the drafter's observe.
    pub verify_seconds: f64,
}

use families::{BackendError, ModelError, Tap};

/// A drafter's `rewind` may only go back: `position` past the `committed` rows is the error.
pub fn check_rewind(committed: usize, position: usize) -> Result<(), BackendError> {
    if position > committed {
        return Err(ModelError::PositionMismatch {
            expected: committed,
            got: position,
        }
        .into());
    }
    Ok(())
}

/// How the loop turns a drafter's logits into a proposal: argmax at temperature 0, a draw from the shaped
/// distribution q when sampling (the loop keeps q for the rejection step). A deterministic drafter (one
/// without logits, such as prompt lookup) does not call it: the loop judges a round's proposals that
/// came without a drafted q as a point mass, which is exact. A drafter calls it for all of a round's
/// proposals or for none (the loop pairs the i-th q with the i-th proposal).
pub trait Chooser {
    /// `logits`: [vocab] for the position after `context` (committed history + earlier proposals).
    fn choose(&mut self, logits: &[f32], context: &[u32]) -> u32;

    /// True when `choose` is the argmax of the row itself (lowest index on ties) whatever the context:
    /// greedy without penalties. A drafter whose logits live on a device may then take that argmax
    /// there and skip `choose` (copying the row, and calling `choose`, only for a row the argmax
    /// refuses: NaN, +inf, all -inf).
    fn plain_argmax(&self) -> bool {
        false
    }
}

pub trait Drafter {
    fn name(&self) -> &'static str;
    /// Target taps this drafter needs from every target forward (prefill and verify).
    fn taps(&self) -> Vec<Tap>;
    /// Forget the sequence.
    fn reset(&mut self);
    /// Which drafter made the last proposal (its name, unless it combines several: `MtpOrSuffix`),
    /// for the statistics per drafter.
    fn proposer(&self) -> &'static str {
        self.name()
    }
    /// Forget what is remembered of earlier sequences (a drafter that learns across requests, such as
    /// [`SuffixDrafter`]), and do not remember the current one once it is rewound or reset: the next
    /// request comes from someone who must not learn, from how fast it runs, what earlier ones held.
    fn forget_earlier_requests(&mut self) {}
    /// Number of target rows observed so far (the drafter's committed position).
    fn position(&self) -> usize;
    /// Rewinds the committed context to `position` rows (prefix reuse after a shorter match).
    fn rewind(&mut self, position: usize) -> Result<(), BackendError>;
    /// Appends verified target rows at positions `position()..position()+n`: `taps[i]` is [n, width] for
    /// `taps()[i]` (no taps asked, none given: a speculating loop still calls it, to advance the
    /// position), and `next_tokens[j]` is the committed token that follows row j.
    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError>;
    /// Proposes up to `k` tokens following `history` (all committed tokens, the last of which the target has
    /// not yet run). Requires that `observe` has covered every row before the last committed token.
    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError>;
    /// Proposes for a round whose model-drafted block is `k` and whose proposals may reach `limit`
    /// (>= k: the named block, or under `auto` the drafter's cap): a drafter that sizes its own
    /// proposals (copies) may use the room, also when k = 0. Default: `propose(history, k)`, nothing
    /// for k = 0.
    fn propose_within(
        &mut self,
        history: &[u32],
        k: usize,
        limit: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        let _ = limit;
        if k == 0 {
            return Ok(Vec::new());
        }
        self.propose(history, k, chooser)
    }
    /// The costs of the round just observed, in greedy `auto` runs only (sampled runs never read the
    /// clock, so that a seeded run reproduces). Default: not used.
    fn record_costs(&mut self, timing: RoundTiming) {
        let _ = timing;
    }
}
