//! The distribution a token is drawn from, and the draw itself.
//!
//! A [`ShapedDistribution`] is a point mass (greedy, or a deterministic draft), a dense normalised
//! probability vector over the vocabulary, or, for top-k requests, the same over the few ids top-k
//! keeps (every other id 0): shaping then never builds a row of the vocabulary's size (Qwen3's card,
//! top-k 20: 1.54 -> 0.32 ms per 151936-logit row on this session's 2-core host), and its
//! probabilities, support and draws have the dense form's bits (unit test). Drawing is the inverse CDF over token ids in
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
    block_sums, check_logits, penalized_logits, softmax_in_place, temperature_weights, warp,
    warp_top_k, warp_top_k_candidates, History, Shaping, SPARSE_TOP_K_MAX, SUM_BLOCK,
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
    /// The same over a few ids (top-k): `ids` increasing, `probs[j]` the probability of `ids[j]`
    /// (every other id 0); `blocks` the nonzero-capable block sums as (block index, sum), in order.
    /// Zeros add nothing to a sum of non-negative terms, so every sum, and so every draw, has the
    /// bits of the dense form of the same distribution.
    Sparse {
        ids: Vec<u32>,
        probs: Vec<f64>,
        blocks: Vec<(usize, f64)>,
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
        Self::shaped(logits, shaping, history, true)
    }

    /// `new`, with the sparse top-k and fused temperature paths allowed or not (tests compare).
    fn shaped(
        logits: &[f32],
        shaping: &Shaping,
        history: History<'_>,
        sparse_ok: bool,
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
        let k = shaping.top_k as usize;
        if sparse_ok && (1..=SPARSE_TOP_K_MAX).contains(&k) && k < penalized.len() {
            let (ids, shifted) = warp_top_k(&penalized, shaping);
            return Ok(Self::sparse(penalized.len(), ids, shifted));
        }
        if sparse_ok && shaping.top_k == 0 && shaping.top_p >= 1.0 && shaping.min_p <= 0.0 {
            let mut probs = temperature_weights(&penalized, shaping);
            let sum: f64 = block_sums(&probs).iter().sum();
            divide(&mut probs, sum);
            return Ok(Self::dense(probs));
        }
        let probs = softmax_in_place(warp(&penalized, shaping));
        Ok(Self::dense(probs))
    }

    /// [`ShapedDistribution::new`] of a row from its candidates, when that gives the same bits: a
    /// backend that selected the row's largest logits (on a GPU, instead of bringing the whole row
    /// back) passes their `ids` (increasing, `< vocab`) and `logits`, every logit of the row at or
    /// above the smallest candidate being among them. None when the shaping or the candidates do not
    /// allow it (penalties, no top-k, too few candidates, a kept value below them): shape the row.
    pub fn from_candidates(
        vocab: usize,
        ids: &[u32],
        logits: &[f32],
        shaping: &Shaping,
    ) -> Result<Option<Self>, SamplingError> {
        shaping.validate()?;
        let k = shaping.top_k as usize;
        let sparse = !shaping.has_penalties()
            && !shaping.is_greedy()
            && (1..=SPARSE_TOP_K_MAX).contains(&k)
            && k < vocab;
        if !sparse || ids.len() != logits.len() {
            return Ok(None);
        }
        if let Some(&token) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(SamplingError::TokenOutOfVocab {
                what: "candidate",
                token,
                vocab,
            });
        }
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Ok(None);
        }
        Ok(warp_top_k_candidates(ids, logits, shaping)
            .map(|(kept, shifted)| Self::sparse(vocab, kept, shifted)))
    }

    /// The softmax of `shifted` logits at `ids` (increasing; -inf for dropped ids) with every
    /// other id of `vocab` at 0: the dense softmax's arithmetic (the max, exp(l - max), the sum in
    /// blocks of SUM_BLOCK ids, the division) on the ids that can hold mass.
    fn sparse(vocab: usize, ids: Vec<usize>, shifted: Vec<f64>) -> Self {
        let max = shifted.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut probs: Vec<f64> = shifted
            .iter()
            .map(|&l| {
                if l == f64::NEG_INFINITY {
                    0.0
                } else {
                    (l - max).exp()
                }
            })
            .collect();
        let sum: f64 = sparse_block_sums(&ids, &probs).iter().map(|b| b.1).sum();
        for p in probs.iter_mut() {
            *p /= sum;
        }
        let blocks = sparse_block_sums(&ids, &probs);
        let total = blocks.iter().map(|b| b.1).sum();
        ShapedDistribution {
            vocab,
            repr: Repr::Sparse {
                ids: ids.into_iter().map(|i| i as u32).collect(),
                probs,
                blocks,
                total,
            },
        }
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

    /// `normalized` for weights that are 0 outside `ids` (increasing): the same bits as the dense
    /// weights' normalisation (zeros add nothing to its sums), as a sparse distribution.
    pub(crate) fn normalized_sparse(
        vocab: usize,
        ids: Vec<u32>,
        mut weights: Vec<f64>,
        min_mass: f64,
    ) -> Option<Self> {
        let at: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        let mass: f64 = sparse_block_sums(&at, &weights).iter().map(|b| b.1).sum();
        if !(mass > min_mass && mass > 0.0 && mass.is_finite()) {
            return None;
        }
        for w in weights.iter_mut() {
            *w /= mass;
        }
        let blocks = sparse_block_sums(&at, &weights);
        let total = blocks.iter().map(|b| b.1).sum();
        Some(ShapedDistribution {
            vocab,
            repr: Repr::Sparse {
                ids,
                probs: weights,
                blocks,
                total,
            },
        })
    }

    /// The ids and probabilities of a sparse distribution (top-k), None for the other forms.
    pub(crate) fn sparse_parts(&self) -> Option<(&[u32], &[f64])> {
        match &self.repr {
            Repr::Sparse { ids, probs, .. } => Some((ids, probs)),
            _ => None,
        }
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
            Repr::Dense { .. } | Repr::Sparse { .. } => None,
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
            Repr::Sparse { ids, probs, .. } => ids.binary_search(&token).map_or(0.0, |j| probs[j]),
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
            Repr::Sparse {
                ids,
                probs,
                blocks,
                total,
            } => {
                // The dense walk with the all-zero blocks and ids left out (they never end it).
                let target = u * total;
                let mut prefix = 0.0;
                let mut j = 0;
                for &(b, sum) in blocks {
                    let end = ids.partition_point(|&id| (id as usize) < (b + 1) * SUM_BLOCK);
                    if target < prefix + sum {
                        let mut partial = 0.0;
                        for (&id, &p) in ids[j..end].iter().zip(&probs[j..end]) {
                            if p > 0.0 {
                                partial += p;
                                if target < prefix + partial {
                                    return id;
                                }
                            }
                        }
                    }
                    prefix += sum;
                    j = end;
                }
                let last = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
                ids.get(last).copied().unwrap_or(0)
            }
        }
    }

    /// `(token, probability)` for every token of positive probability, in increasing id order.
    pub fn support(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        let (dense, sparse, point) = match &self.repr {
            Repr::Point(token) => (None, None, Some((*token, 1.0))),
            Repr::Dense { probs, .. } => (Some(probs), None, None),
            Repr::Sparse { ids, probs, .. } => (None, Some((ids, probs)), None),
        };
        dense
            .into_iter()
            .flat_map(|probs| probs.iter().enumerate().map(|(i, p)| (i as u32, *p)))
            .chain(
                sparse
                    .into_iter()
                    .flat_map(|(ids, probs)| ids.iter().copied().zip(probs.iter().copied())),
            )
            .filter(|(_, p)| *p > 0.0)
            .chain(point)
    }
}

/// v[i] /= by, on the rayon pool for long rows (element-wise: the same bits either way).
fn divide(v: &mut [f64], by: f64) {
    use rayon::prelude::*;
    if v.len() >= crate::shaping::PARALLEL_MIN {
        v.par_iter_mut().with_min_len(4096).for_each(|p| *p /= by);
    } else {
        v.iter_mut().for_each(|p| *p /= by);
    }
}

/// The sums of the SUM_BLOCK-id blocks that hold any of `ids` (increasing), each over its values in
/// id order, with the block's index.
fn sparse_block_sums(ids: &[usize], values: &[f64]) -> Vec<(usize, f64)> {
    let mut out: Vec<(usize, f64)> = Vec::new();
    for (&id, &v) in ids.iter().zip(values) {
        let b = id / SUM_BLOCK;
        match out.last_mut() {
            Some(last) if last.0 == b => last.1 += v,
            _ => out.push((b, v)),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::uniform;

    /// The K largest logits of a row with every tie of the K-th (what a backend's selection returns),
    /// ids increasing.
    fn candidates(row: &[f32], big_k: usize) -> (Vec<u32>, Vec<f32>) {
        let mut sorted: Vec<f32> = row.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let floor = sorted[big_k.min(row.len()) - 1];
        row.iter()
            .enumerate()
            .filter(|(_, l)| l.total_cmp(&floor).is_ge())
            .map(|(i, &l)| (i as u32, l))
            .unzip()
    }

    /// Candidates give the row's distribution bit for bit (probabilities, support, draws) whenever
    /// they answer, and they answer for the usual rows; too few candidates, or a floor above a value
    /// top-k keeps, do not answer (shape the row instead).
    #[test]
    fn candidates_give_the_rows_distribution_bit_for_bit_or_nothing() {
        let vocab = 3 * SUM_BLOCK + 77;
        let (mut answered, mut declined) = (0, 0);
        for seed in 0..10u64 {
            let mut row: Vec<f32> = (0..vocab)
                .map(|i| {
                    let u = uniform(seed, i as u64);
                    match i % 89 {
                        0 => f32::NEG_INFINITY,
                        1..=20 => (u * 6.0).floor() as f32, // exact ties, also at the boundary
                        _ => (u * 16.0 - 8.0) as f32,
                    }
                })
                .collect();
            row[11] = -0.0;
            row[12] = 0.0;
            for (k, t, p, m) in [
                (20, 0.7, 0.8, 0.0),
                (1, 1.0, 1.0, 0.0),
                (50, 1.3, 0.95, 0.05),
                (5, 1e-6, 1.0, 0.0),
            ] {
                let shaping = Shaping {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    min_p: m,
                    ..Shaping::default()
                };
                let full = ShapedDistribution::new(&row, &shaping, History::empty()).unwrap();
                for big_k in [k as usize, 2 * k as usize + 3] {
                    let (ids, logits) = candidates(&row, big_k);
                    match ShapedDistribution::from_candidates(vocab, &ids, &logits, &shaping)
                        .unwrap()
                    {
                        Some(d) => {
                            answered += 1;
                            assert_eq!(d, full, "seed {seed} k {k} K {big_k}");
                            for j in 0..64 {
                                let u = uniform(seed + 100, j);
                                assert_eq!(d.draw(u), full.draw(u));
                            }
                        }
                        None => declined += 1,
                    }
                }
                // Fewer than k candidates never answer.
                let (ids, logits) = candidates(&row, 1);
                if k > 1 && ids.len() < k as usize {
                    assert!(
                        ShapedDistribution::from_candidates(vocab, &ids, &logits, &shaping)
                            .unwrap()
                            .is_none()
                    );
                }
            }
            // A kept value below the candidates: with one logit at 1e30, every small logit minus it
            // rounds to -1e30, so top-k keeps all of them as ties of the k-th; 3 candidates cannot say.
            let shaping = Shaping {
                temperature: 0.7,
                top_k: 3,
                ..Shaping::default()
            };
            let mut huge = row.clone();
            huge[100] = 1e30;
            let (ids, logits) = candidates(&huge, 3);
            let got = ShapedDistribution::from_candidates(vocab, &ids, &logits, &shaping).unwrap();
            assert!(
                got.is_none(),
                "seed {seed}: answered for a row whose kept set it cannot see"
            );
            declined += 1;
        }
        assert!(answered > 60, "answered {answered}, declined {declined}");
        // Penalties or no top-k: never from candidates.
        let (ids, logits) = candidates(&[1.0, 2.0, 3.0, 0.5], 2);
        for shaping in [
            Shaping {
                temperature: 0.7,
                top_k: 2,
                repetition_penalty: 1.1,
                ..Shaping::default()
            },
            Shaping {
                temperature: 0.7,
                top_k: 0,
                ..Shaping::default()
            },
        ] {
            assert!(
                ShapedDistribution::from_candidates(4, &ids, &logits, &shaping)
                    .unwrap()
                    .is_none()
            );
        }
        assert!(ShapedDistribution::from_candidates(
            2,
            &[0, 5],
            &[1.0, 2.0],
            &Shaping {
                temperature: 0.7,
                top_k: 1,
                ..Shaping::default()
            }
        )
        .is_err());
    }

    /// Rows with ties, masked (-inf) ids and a wide range, over a vocabulary spanning several sum
    /// blocks; the sparse top-k path must give the dense path's distribution bit for bit: every
    /// probability, the support, and the draw for many u.
    #[test]
    fn sparse_top_k_equals_the_dense_path_bit_for_bit() {
        let vocab = 5 * SUM_BLOCK + 123; // past PARALLEL_MIN: the split heap
        let mut checked = 0;
        for seed in 0..12u64 {
            let mut logits: Vec<f32> = (0..vocab)
                .map(|i| {
                    let u = uniform(seed, i as u64);
                    match i % 97 {
                        0 => f32::NEG_INFINITY,
                        // coarse values: many exact ties, also at the top-k boundary
                        1..=30 => (u * 8.0).floor() as f32,
                        _ => (u * 20.0 - 10.0) as f32,
                    }
                })
                .collect();
            if seed % 3 == 0 {
                logits[5] = 50.0; // one dominant token
            }
            let history = [3u32, 17, 3, 4000, 9000];
            for (k, t, p, m, rep) in [
                (1, 0.7, 1.0, 0.0, 1.0),
                (2, 1.0, 1.0, 0.0, 1.0),
                (20, 0.6, 0.95, 0.0, 1.0),
                (50, 0.7, 0.9, 0.0, 1.1),
                (40, 1.3, 1.0, 0.05, 1.0),
                (1024, 0.8, 0.8, 0.02, 1.0),
                (300, 1e-3, 1.0, 0.0, 1.0),
                // Scaled logits overflow to -inf below the top: the tie search must stay short.
                (7, 1e-300, 1.0, 0.0, 1.0),
                (9, 1e30, 0.9, 0.0, 1.0),
            ] {
                let shaping = Shaping {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    min_p: m,
                    repetition_penalty: rep,
                    ..Shaping::default()
                };
                let h = History::new(&history, 2).unwrap();
                let sparse = ShapedDistribution::shaped(&logits, &shaping, h, true).unwrap();
                let dense = ShapedDistribution::shaped(&logits, &shaping, h, false).unwrap();
                assert!(
                    matches!(sparse.repr, Repr::Sparse { .. }),
                    "k {k}: not sparse"
                );
                let label = format!("seed {seed} k {k} t {t} p {p} m {m} rep {rep}");
                for id in 0..vocab as u32 {
                    let (a, b) = (sparse.probability(id), dense.probability(id));
                    assert_eq!(a.to_bits(), b.to_bits(), "{label}: p({id})");
                }
                let (s, d): (Vec<_>, Vec<_>) =
                    (sparse.support().collect(), dense.support().collect());
                assert_eq!(s, d, "{label}: support");
                for j in 0..2000u64 {
                    let u = uniform(seed + 99, j);
                    assert_eq!(sparse.draw(u), dense.draw(u), "{label}: draw({u})");
                }
                for u in [0.0, 1.0 - 1e-16, 1.0, f64::NAN, -0.5] {
                    assert_eq!(sparse.draw(u), dense.draw(u), "{label}: draw({u})");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 12 * 9);
    }

    /// Temperature alone: the fused weights give the two-pass softmax's distribution bit for bit.
    #[test]
    fn temperature_only_equals_the_unfused_path_bit_for_bit() {
        let vocab = 5 * SUM_BLOCK + 321;
        for seed in 0..6u64 {
            let mut logits: Vec<f32> = (0..vocab)
                .map(|i| (uniform(seed, i as u64) * 30.0 - 15.0) as f32)
                .collect();
            logits[7] = f32::NEG_INFINITY;
            logits[vocab - 1] = 40.0;
            for (t, rep) in [(0.7, 1.0), (1.0, 1.0), (1.9, 1.2), (1e-3, 1.0)] {
                let shaping = Shaping {
                    temperature: t,
                    repetition_penalty: rep,
                    ..Shaping::default()
                };
                let h = History::new(&[1, 2, 3], 1).unwrap();
                let fused = ShapedDistribution::shaped(&logits, &shaping, h, true).unwrap();
                let plain = ShapedDistribution::shaped(&logits, &shaping, h, false).unwrap();
                assert_eq!(fused, plain, "seed {seed} t {t} rep {rep}");
            }
        }
    }

    /// The residuals of speculative verification (crate::speculative) of a sparse p equal those of
    /// the same p in dense form, bit for bit, against a dense q, a sparse q and a point mass.
    #[test]
    fn residuals_of_a_sparse_p_equal_the_dense_ones() {
        use crate::speculative::{residual, residual_point_mass};
        let vocab = 5 * SUM_BLOCK + 7;
        let row = |seed: u64| -> Vec<f32> {
            (0..vocab)
                .map(|i| (uniform(seed, i as u64) * 12.0) as f32)
                .collect()
        };
        let top = |k| Shaping {
            temperature: 0.9,
            top_k: k,
            ..Shaping::default()
        };
        let h = History::empty();
        for seed in 0..6 {
            let logits = row(seed);
            let p_sparse = ShapedDistribution::shaped(&logits, &top(40), h, true).unwrap();
            let p_dense = ShapedDistribution::shaped(&logits, &top(40), h, false).unwrap();
            let drafter_row = row(seed + 100);
            let qs = [
                ShapedDistribution::shaped(&drafter_row, &top(30), h, false).unwrap(),
                ShapedDistribution::shaped(&drafter_row, &top(30), h, true).unwrap(),
                // q = p: nothing left (None both ways)
                p_dense.clone(),
            ];
            let same = |a: Option<ShapedDistribution>, b: Option<ShapedDistribution>| match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    (0..vocab as u32)
                        .all(|i| a.probability(i).to_bits() == b.probability(i).to_bits())
                        && (0..500).all(|j| a.draw(uniform(seed, j)) == b.draw(uniform(seed, j)))
                }
                _ => false,
            };
            for q in &qs {
                assert!(
                    same(residual(&p_sparse, q), residual(&p_dense, q)),
                    "seed {seed}"
                );
            }
            let x = p_dense.draw(0.3);
            let (a, b) = (
                residual_point_mass(&p_sparse, x),
                residual_point_mass(&p_dense, x),
            );
            assert!(same(a, b), "seed {seed}: point mass at {x}");
        }
    }
}
