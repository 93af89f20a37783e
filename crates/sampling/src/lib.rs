//! Token selection for turbospark: logit shaping, the shaped distribution a token is drawn from,
//! counter-based uniforms, and the exact speculative acceptance rule (DESIGN.md §3).
//!
//! Pipeline for one row of logits (the order transformers' `generate` applies its logits
//! processors; see [`shaping`] for the reference and the exact rules):
//!
//! ```text
//! raw logits (f32) -> repetition penalty -> frequency/presence penalty   (argmax-relevant; greedy stops here)
//!                  -> temperature -> top-k -> top-p -> min-p -> softmax  (sampling only)
//! ```
//!
//! Invariants the rest of the runtime relies on:
//! - a [`ShapedDistribution`] is normalised, has at least one token of positive probability, and
//!   gives probability exactly 0 to every filtered token, so such a token is never drawn or accepted;
//! - temperature 0 is a point mass at the argmax of the penalised logits, lowest index on ties;
//! - [`uniform`]`(seed, step)` is a pure function, so a seeded run reproduces bit for bit;
//! - [`verify_step`] makes a speculative round produce tokens distributed exactly as sequential
//!   sampling from the target would (proven by the chi-square tests in `tests/`).

mod distribution;
mod random;
pub mod shaping;
pub mod speculative;

pub use distribution::{greedy, ShapedDistribution};
pub use random::{uniform, DrawCounter};
pub use shaping::{penalized_logits, History, Shaping};
pub use speculative::{accept, residual, residual_point_mass, verify_step, Draft, Verdict};

/// Everything that can be wrong with the inputs of this crate. Each variant names the field,
/// index or token at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A [`Shaping`] field is NaN, infinite or outside its documented range.
    #[error("sampling parameter `{field}` = {value} is invalid: expected {expected}")]
    InvalidParameter {
        field: &'static str,
        value: f64,
        expected: &'static str,
    },
    /// The logits row has no entries.
    #[error("logits row is empty")]
    EmptyLogits,
    /// A logit is NaN or +inf (the model produced garbage); -inf is allowed and means "masked".
    #[error("logit at index {index} is {value}: logits must be finite or -inf")]
    NonFiniteLogit { index: usize, value: f32 },
    /// Every logit is -inf, so there is no token to select.
    #[error("all {vocab} logits are -inf: no token can be selected")]
    AllMasked { vocab: usize },
    /// A token id (in the history, a proposal, or a point mass) does not index the vocabulary.
    #[error("{what} token {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfVocab {
        what: &'static str,
        token: u32,
        vocab: usize,
    },
    /// The history claims more generated tokens than it holds.
    #[error("history claims {generated} generated tokens but holds only {len} tokens")]
    GeneratedExceedsHistory { generated: usize, len: usize },
    /// A probability given to [`ShapedDistribution::from_probs`] is NaN, infinite or negative.
    #[error("probability at index {index} is {value}: probabilities must be finite and >= 0")]
    InvalidProbability { index: usize, value: f64 },
    /// The probabilities given to [`ShapedDistribution::from_probs`] have no mass.
    #[error("probabilities over {vocab} tokens sum to {mass}: there is no mass to normalise")]
    NoMass { vocab: usize, mass: f64 },
    /// A sampled draft proposed a token its own distribution gives probability 0: the proposal
    /// was not drawn from that distribution, so the acceptance ratio is undefined.
    #[error("proposal {token} has probability 0 under the draft distribution it claims to be drawn from")]
    ProposalOutsideDraft { token: u32 },
}
