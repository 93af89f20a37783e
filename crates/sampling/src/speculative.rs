//! Exact speculative acceptance (DESIGN.md §3; Leviathan et al. 2023, Chen et al. 2023): judging
//! drafted tokens against the target so the committed stream is distributed exactly as sequential
//! sampling from the target.
//!
//! Terms, per round of `k` proposals verified in one target pass (vLLM's rejection sampler uses
//! the same three names):
//! - **proposal** `x_i`: drafted token i, either drawn from the drafter's distribution `q_i`
//!   ([`Draft::Distribution`]) or chosen deterministically (argmax, structured search), which is
//!   `q_i` = point mass at `x_i` ([`Draft::PointMass`]);
//! - **accepted token**: a proposal for which [`accept`]`(p_i(x_i), q_i(x_i), r)` holds with a
//!   fresh uniform `r`, i.e. with probability `min(1, p_i(x_i) / q_i(x_i))`. Accepted tokens are
//!   committed in order; judging stops at the first rejection;
//! - **recovered token**: at the first rejection, the replacement drawn from the residual
//!   `normalize(max(p_i - q_i, 0))` ([`residual`]; for a point-mass draft, `p_i` with `x_i`
//!   removed, [`residual_point_mass`]). It ends the round;
//! - **bonus token**: when all `k` proposals are accepted, the target row after the last one is
//!   free: one more token drawn from `p_{k+1}` itself (no proposal, so nothing to judge).
//!
//! So every round commits its accepted prefix plus exactly one recovered or bonus token.
//!
//! Why it is exact: the output `y` of one judged step has
//! `P(y) = q(y) min(1, p(y)/q(y)) + P(reject) res(y) = min(p, q)(y) + max(p - q, 0)(y)`, because
//! `P(reject) = 1 - sum min(p, q) = sum max(p - q, 0)`, the residual's normaliser. That is `p(y)`.
//! Temperature 0 is the same rule: `p` is a point mass at the target argmax `a`, so a proposal is
//! accepted iff it equals `a`, and the recovered token is `a`.
//!
//! The caller's obligations: `p_i` is shaped with the history a sequential decode would have had
//! (prompt, committed tokens, and accepted proposals `x_<i`), and `r` and `u` are fresh uniforms,
//! independent of the one that drew `x_i` (distinct steps of one [`crate::DrawCounter`]);
//! reusing a uniform biases the stream.

use crate::{SamplingError, ShapedDistribution};

/// Below this much mass the residual is treated as empty (p and q agree to rounding).
const MIN_RESIDUAL_MASS: f64 = 1e-12;

/// What the drafter knows about how it chose a proposal.
#[derive(Debug, Clone, Copy)]
pub enum Draft<'a> {
    /// The proposal was drawn from this distribution (`q`).
    Distribution(&'a ShapedDistribution),
    /// The proposal was chosen deterministically: `q` is a point mass at it.
    PointMass,
}

/// The judgement of one proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Commit the proposal and judge the next one.
    Accepted,
    /// Commit `replacement` (the recovered token) instead, and end the round.
    Rejected { replacement: u32 },
}

/// The acceptance test `r * q(x) <= p(x)` for a uniform `r` in [0, 1) (DESIGN.md §3), which holds
/// with probability `min(1, p(x) / q(x))`. A token the target gives probability 0 is never
/// accepted: with the bare inequality, `r == 0` (odds 2^-53) would accept a token sequential
/// decoding can never produce, such as one the target's top-k filtered out.
pub fn accept(p_x: f64, q_x: f64, r: f64) -> bool {
    p_x > 0.0 && r * q_x <= p_x
}

/// `normalize(max(p - q, 0))` over p's vocabulary (q beyond it counts as 0); None when its mass
/// is <= 1e-12, i.e. p and q agree to rounding and rejection (odds = that mass) cannot happen.
pub fn residual(p: &ShapedDistribution, q: &ShapedDistribution) -> Option<ShapedDistribution> {
    if let Some(a) = p.as_point_mass() {
        // max(δ_a - q, 0) is 1 - q(a) at a and 0 elsewhere.
        let mass = 1.0 - q.probability(a);
        return (mass > MIN_RESIDUAL_MASS).then(|| p.clone());
    }
    // max(p - q, 0) is 0 wherever p is: a top-k p's residual lives on its few ids.
    if let Some((ids, probs)) = p.sparse_parts() {
        let weights = (ids.iter().zip(probs))
            .map(|(&i, &pi)| (pi - q.probability(i)).max(0.0))
            .collect();
        let vocab = p.vocab_size();
        return ShapedDistribution::normalized_sparse(
            vocab,
            ids.to_vec(),
            weights,
            MIN_RESIDUAL_MASS,
        );
    }
    let weights = (0..p.vocab_size())
        .map(|i| {
            let i = i as u32;
            (p.probability(i) - q.probability(i)).max(0.0)
        })
        .collect();
    ShapedDistribution::normalized(weights, MIN_RESIDUAL_MASS)
}

/// The residual against a point mass at `x`: `max(p - δ_x, 0)` is p with x removed, renormalised.
/// None when p puts (all but 1e-12 of) its mass on x.
pub fn residual_point_mass(p: &ShapedDistribution, x: u32) -> Option<ShapedDistribution> {
    if let Some(a) = p.as_point_mass() {
        return (a != x).then(|| p.clone());
    }
    if let Some((ids, probs)) = p.sparse_parts() {
        let weights = (ids.iter().zip(probs))
            .map(|(&i, &pi)| if i == x { 0.0 } else { pi })
            .collect();
        let vocab = p.vocab_size();
        return ShapedDistribution::normalized_sparse(
            vocab,
            ids.to_vec(),
            weights,
            MIN_RESIDUAL_MASS,
        );
    }
    let weights = (0..p.vocab_size())
        .map(|i| {
            let i = i as u32;
            if i == x {
                0.0
            } else {
                p.probability(i)
            }
        })
        .collect();
    ShapedDistribution::normalized(weights, MIN_RESIDUAL_MASS)
}

/// Judges `proposal` against the target distribution `target` (p) given how it was drafted (q):
/// accepted when [`accept`]`(p(x), q(x), r)`, else rejected with a replacement drawn by inverse
/// CDF with `u` from the residual. If the residual vanished (p and q equal to rounding, so this
/// branch has odds <= 1e-12) the replacement is drawn from p itself.
///
/// Errors when a [`Draft::Distribution`] gives the proposal probability 0: it cannot have been
/// drawn from q, and accepting it would bias the stream.
pub fn verify_step(
    target: &ShapedDistribution,
    draft: Draft<'_>,
    proposal: u32,
    r: f64,
    u: f64,
) -> Result<Verdict, SamplingError> {
    let q_x = match draft {
        Draft::Distribution(q) => q.probability(proposal),
        Draft::PointMass => 1.0,
    };
    if q_x <= 0.0 {
        return Err(SamplingError::ProposalOutsideDraft { token: proposal });
    }
    if accept(target.probability(proposal), q_x, r) {
        return Ok(Verdict::Accepted);
    }
    let residual = match draft {
        Draft::Distribution(q) => residual(target, q),
        Draft::PointMass => residual_point_mass(target, proposal),
    };
    let replacement = match residual {
        Some(res) => res.draw(u),
        None => target.draw(u),
    };
    Ok(Verdict::Rejected { replacement })
}
