//! The distribution a token is drawn from, and the draw itself.
//!
//! A [`ShapedDistribution`] is either a point mass (greedy, or a deterministic draft) or a dense
//! normalised probability vector over the vocabulary. Drawing is the inverse CDF over token ids in
//! index order: `draw(u)` returns the smallest id whose cumulative probability exceeds
//! `u * total`, so it is a pure function of `u` and a zero-probability token is never returned
//! (its cumulative equals its predecessor's, which `u * total` was already not below).
//!
//! Sums run in blocks of `SUM_BLOCK` ids (each block in id order, then the blocks in order), and the
//! cumulative of id i is its block's prefix plus its partial sum inside the block: a draw walks ~38
//! block totals and one block of a 151936-token row instead of one 151936-long chain of dependent
//! additions (0.2 ms per chain on the H200's host). The result depends on the row alone.

use std::borrow::Cow;

use crate::shaping::{
    block_sums, check_logits, penalized_logits, softmax_in_place, warp, History, Shaping, SUM_BLOCK,
};
use crate::SamplingError;

#[derive(Debug, Clone, PartialEq)]
enum Repr {
    /// All mass on one token.
    Point(u32),
    /// `probs[i]` = probability of token i; `blocks[b]` = the sum of block b of `probs`; `total` =
    /// the sum of `blocks` (1 up to rounding), which the inverse CDF scales `u` by.
    Dense {
        probs: Vec<f64>,
        blocks: Vec<f64>,
        total: f64,
    },
}

/// A normalised distribution over token ids `0..vocab_size()`, with at least one token of
/// positive probability.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapedDistribution {
    vocab: usize,
    repr: Repr,
}

impl ShapedDistribution {
    /// Shapes one row of raw logits (`[vocab]`) as [`crate::shaping`] describes and normalises it.
    /// Temperature 0 gives a point mass at the argmax of the penalised logits.
    pub fn new(
        logits: &[f32],
        shaping: &Shaping,
        history: History<'_>,
    ) -> Result<Self, SamplingError> {
        shaping.validate()?;
        if shaping.is_plain_argmax() {
            // No penalty applies, so the penalised row would be a copy of this one (608 KB per token at
            // Qwen's vocabulary); the same checks, the same argmax.
            check_logits(logits)?;
            return Ok(ShapedDistribution {
                vocab: logits.len(),
                repr: Repr::Point(argmax_lowest(logits)),
            });
        }
        // Without penalties the penalised row is the row itself: checked, not copied.
        let penalized: Cow<'_, [f32]> = if shaping.has_penalties() {
            Cow::Owned(penalized_logits(logits, shaping, history)?)
        } else {
            check_logits(logits)?;
            Cow::Borrowed(logits)
        };
        if shaping.is_greedy() {
            return Ok(ShapedDistribution {
                vocab: penalized.len(),
                repr: Repr::Point(argmax_lowest(&penalized)),
            });
        }
        let probs = softmax_in_place(warp(&penalized, shaping));
        Ok(Self::dense(probs))
    }

    /// A distribution from non-negative weights (`[vocab]`), normalised to sum to 1.
    pub fn from_probs(probs: &[f64]) -> Result<Self, SamplingError> {
        if let Some((index, &value)) = probs
            .iter()
            .enumerate()
            .find(|(_, p)| !p.is_finite() || **p < 0.0)
        {
            return Err(SamplingError::InvalidProbability { index, value });
        }
        let mass: f64 = probs.iter().sum();
        Self::normalized(probs.to_vec(), 0.0).ok_or(SamplingError::NoMass {
            vocab: probs.len(),
            mass,
        })
    }

    /// All mass on `token`, over a vocabulary of `vocab` tokens.
    pub fn point_mass(token: u32, vocab: usize) -> Result<Self, SamplingError> {
        if token as usize >= vocab {
            return Err(SamplingError::TokenOutOfVocab {
                what: "point mass",
                token,
                vocab,
            });
        }
        Ok(ShapedDistribution {
            vocab,
            repr: Repr::Point(token),
        })
    }

    /// Normalises finite non-negative `weights`; None when their sum is <= `min_mass` (or
    /// zero, or not finite).
    pub(crate) fn normalized(mut weights: Vec<f64>, min_mass: f64) -> Option<Self> {
        let mass: f64 = block_sums(&weights).iter().sum();
        if !(mass > min_mass && mass > 0.0 && mass.is_finite()) {
            return None;
        }
        for w in weights.iter_mut() {
            *w /= mass;
        }
        Some(Self::dense(weights))
    }

    /// The dense distribution of normalised `probs`, with its block sums.
    fn dense(probs: Vec<f64>) -> Self {
        let blocks = block_sums(&probs);
        let total = blocks.iter().sum();
        ShapedDistribution {
            vocab: probs.len(),
            repr: Repr::Dense {
                probs,
                blocks,
                total,
            },
        }
    }

    /// Number of token ids the distribution is defined over.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The token holding all the mass, if this is a point mass (greedy or deterministic draft).
    pub fn as_point_mass(&self) -> Option<u32> {
        match self.repr {
            Repr::Point(token) => Some(token),
            Repr::Dense { .. } => None,
        }
    }

    /// Probability of `token`; 0 for filtered tokens and for ids outside the vocabulary.
    pub fn probability(&self, token: u32) -> f64 {
        match &self.repr {
            Repr::Point(t) => {
                if *t == token {
                    1.0
                } else {
                    0.0
                }
            }
            Repr::Dense { probs, .. } => probs.get(token as usize).copied().unwrap_or(0.0),
        }
    }

    /// Inverse-CDF draw for a uniform `u` in [0, 1): the smallest token id whose cumulative
    /// probability exceeds `u * total`. Deterministic in `u`; a point mass ignores it. Out-of-range
    /// `u` is clamped (below 0: first token of the support; 1 or more, or NaN: last).
    pub fn draw(&self, u: f64) -> u32 {
        match &self.repr {
            Repr::Point(token) => *token,
            Repr::Dense {
                probs,
                blocks,
                total,
            } => {
                let target = u * total;
                let mut prefix = 0.0;
                for (b, &sum) in blocks.iter().enumerate() {
                    if target < prefix + sum {
                        let start = b * SUM_BLOCK;
                        let mut partial = 0.0;
                        for (i, &p) in probs[start..].iter().take(SUM_BLOCK).enumerate() {
                            if p > 0.0 {
                                partial += p;
                                if target < prefix + partial {
                                    return (start + i) as u32;
                                }
                            }
                        }
                    }
                    prefix += sum;
                }
                // u >= 1, NaN, or rounding at the very end: the last token of the support.
                probs.iter().rposition(|&p| p > 0.0).unwrap_or(0) as u32
            }
        }
    }

    /// `(token, probability)` for every token of positive probability, in increasing id order.
    pub fn support(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        let (dense, point) = match &self.repr {
            Repr::Point(token) => (None, Some((*token, 1.0))),
            Repr::Dense { probs, .. } => (Some(probs), None),
        };
        dense
            .into_iter()
            .flat_map(|probs| probs.iter().enumerate())
            .filter(|(_, p)| **p > 0.0)
            .map(|(i, p)| (i as u32, *p))
            .chain(point)
    }
}

/// The argmax of a logits row, lowest index on ties (as `torch.argmax`). Errors on an empty row,
/// NaN or +inf, or a row that is all -inf.
pub fn greedy(logits: &[f32]) -> Result<u32, SamplingError> {
    check_logits(logits)?;
    Ok(argmax_lowest(logits))
}

/// Argmax with the lowest index winning ties (0 for an all -inf row, which callers rule out). The rows
/// reaching here hold no NaN (`check_logits`), where `kernels::argmax` is exactly this, vectorised.
fn argmax_lowest(logits: &[f32]) -> u32 {
    kernels::argmax(logits) as u32
}
