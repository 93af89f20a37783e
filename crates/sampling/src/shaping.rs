//! Logit shaping: the parameters ([`Shaping`]), the token history they read ([`History`]), and the
//! rules that turn one row of raw logits into the logits a token is sampled from.
//!
//! Order, as transformers' `GenerationMixin._get_logits_processor` (transformers 4.57,
//! `generation/utils.py`) builds its processor list: processors that act in greedy mode too come
//! first (`RepetitionPenaltyLogitsProcessor`), then — only when sampling — the former "warpers" in
//! the order `TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`.
//! transformers has no presence/frequency penalty; we place them where vLLM's sampler applies them,
//! right after the repetition penalty and before temperature (vLLM `apply_penalties`: repetition,
//! then frequency, then presence). So, per row:
//!
//! 1. repetition penalty `r` (transformers): every distinct token in the *whole* history (prompt +
//!    generated, as transformers passes all `input_ids`), once: `l < 0 ? l * r : l / r`;
//! 2. frequency `f` and presence `pr` (OpenAI): `l -= f * count; l -= pr * [count > 0]`, counts over
//!    the tokens *generated in this request* only;
//! 3. temperature 0 stops here: greedy is the argmax of these logits (lowest index on ties), the
//!    same token transformers' greedy search picks, since its warpers only run when sampling;
//! 4. temperature `t`: `l / t`;
//! 5. top-k: drop every logit strictly below the k-th largest (ties at the boundary are kept);
//! 6. top-p: softmax, sort ascending, drop every token whose ascending cumulative probability is
//!    `<= 1 - top_p`, never the most likely one (the nucleus: the smallest top set with mass >= top_p);
//! 7. min-p: softmax, drop every token with probability `< min_p * max probability`;
//! 8. softmax over what is left.
//!
//! Steps 1–2 run in f32 with the parameter rounded to f32, as torch does on f32 logits, so the
//! greedy argmax agrees with transformers even in near-ties; steps 4–8 run in f64 on logits shifted
//! so their maximum is 0 (same distribution, no overflow for tiny temperatures).
//! Ties in the top-p sort are broken toward keeping the lower token id (torch's sort is not stable,
//! so transformers leaves this unspecified). Dropped tokens become -inf and get probability 0.

use serde::{Deserialize, Serialize};

use crate::SamplingError;

/// Sampling parameters of one request. Every rule has an "off" value, which is the default, so a
/// deserialized `{}` means plain sampling at temperature 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Shaping {
    /// Divides the logits; 0 selects greedy decoding (a point mass at the argmax).
    pub temperature: f64,
    /// Keep the `top_k` most likely tokens (plus boundary ties); 0 = off.
    pub top_k: u32,
    /// Keep the smallest most-likely set with mass >= `top_p`; in (0, 1], 1 = off.
    pub top_p: f64,
    /// Drop tokens less likely than `min_p` times the most likely one; in [0, 1], 0 = off.
    pub min_p: f64,
    /// transformers' multiplicative penalty on tokens seen in prompt + generated; > 0, 1 = off.
    pub repetition_penalty: f64,
    /// OpenAI's additive penalty on tokens generated at least once; in [-2, 2], 0 = off.
    pub presence_penalty: f64,
    /// OpenAI's additive penalty per generated occurrence; in [-2, 2], 0 = off.
    pub frequency_penalty: f64,
}

impl Default for Shaping {
    fn default() -> Self {
        Shaping {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

impl Shaping {
    /// Greedy decoding with every other rule off.
    pub fn greedy() -> Self {
        Shaping {
            temperature: 0.0,
            ..Shaping::default()
        }
    }

    /// Temperature 0: the selected token is the argmax of the penalised logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any penalty (repetition, presence, frequency) changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.uses_counts()
    }

    /// Greedy with no penalty: the selected token is the argmax of the raw logits row itself, so a
    /// backend may compute it where the logits are (`families::Wanted::argmax_only`).
    pub fn is_plain_argmax(&self) -> bool {
        self.is_greedy() && !self.has_penalties()
    }

    /// Checks every field, naming the first one that is NaN, infinite or out of range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn check(
            field: &'static str,
            value: f64,
            ok: bool,
            expected: &'static str,
        ) -> Result<(), SamplingError> {
            // NaN fails every comparison below, so `ok` is false for it too.
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(SamplingError::InvalidParameter {
                    field,
                    value,
                    expected,
                })
            }
        }
        let t = self.temperature;
        check("temperature", t, t >= 0.0, "a finite value >= 0")?;
        let p = self.top_p;
        check("top_p", p, p > 0.0 && p <= 1.0, "a value in (0, 1]")?;
        let m = self.min_p;
        check("min_p", m, (0.0..=1.0).contains(&m), "a value in [0, 1]")?;
        let r = self.repetition_penalty;
        check("repetition_penalty", r, r > 0.0, "a finite value > 0")?;
        let pr = self.presence_penalty;
        let in_openai_range = |v: f64| (-2.0..=2.0).contains(&v);
        check(
            "presence_penalty",
            pr,
            in_openai_range(pr),
            "a value in [-2, 2]",
        )?;
        let f = self.frequency_penalty;
        check(
            "frequency_penalty",
            f,
            in_openai_range(f),
            "a value in [-2, 2]",
        )?;
        Ok(())
    }

    pub(crate) fn uses_counts(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// The token ids the penalties read: the whole sequence so far (prompt, then the tokens generated
/// in this request) and how many of them, at its end, were generated.
///
/// One slice plus a count, rather than two slices, because the runtime keeps one id buffer per
/// sequence; a count at its end cannot disagree with it. "Generated" means generated in this
/// request: a reused session prefix counts as prompt, as it would in a fresh transformers call.
/// In a speculative round, the history must already hold the proposals accepted before the row
/// being judged (DESIGN.md §3), exactly as a sequential decode would have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History<'a> {
    tokens: &'a [u32],
    generated: usize,
}

impl<'a> History<'a> {
    /// `tokens` = prompt + generated; the last `generated` of them were generated.
    pub fn new(tokens: &'a [u32], generated: usize) -> Result<Self, SamplingError> {
        if generated > tokens.len() {
            return Err(SamplingError::GeneratedExceedsHistory {
                generated,
                len: tokens.len(),
            });
        }
        Ok(History { tokens, generated })
    }

    /// No tokens at all (penalties are then no-ops).
    pub fn empty() -> Self {
        History {
            tokens: &[],
            generated: 0,
        }
    }

    /// Prompt + generated: what the repetition penalty reads.
    pub fn tokens(&self) -> &'a [u32] {
        self.tokens
    }

    /// The generated suffix: what presence and frequency penalties count.
    pub fn generated(&self) -> &'a [u32] {
        let start = self.tokens.len() - self.generated; // `new` guarantees generated <= len
        &self.tokens[start..]
    }
}

/// Checks a row of logits: non-empty, no NaN or +inf, at least one token not masked (-inf).
pub(crate) fn check_logits(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    let bad = |l: f32| l.is_nan() || l == f32::INFINITY;
    // A branch-free pass first (it vectorises: 31 us instead of 108 us with `find` on a 152k-entry
    // row, paid per token); the index is looked for only when there is one.
    if logits.iter().fold(false, |any, &l| any | bad(l)) {
        if let Some((index, &value)) = logits.iter().enumerate().find(|(_, l)| bad(**l)) {
            return Err(SamplingError::NonFiniteLogit { index, value });
        }
    }
    if logits.iter().all(|l| *l == f32::NEG_INFINITY) {
        return Err(SamplingError::AllMasked {
            vocab: logits.len(),
        });
    }
    Ok(())
}

/// Steps 1–2: the logits after the repetition, frequency and presence penalties. Its argmax is
/// the greedy token. History tokens are checked against the vocabulary only when a penalty reads
/// them.
pub fn penalized_logits(
    logits: &[f32],
    shaping: &Shaping,
    history: History<'_>,
) -> Result<Vec<f32>, SamplingError> {
    check_logits(logits)?;
    let vocab = logits.len();
    let mut out = logits.to_vec();

    if shaping.repetition_penalty != 1.0 {
        let penalty = shaping.repetition_penalty as f32;
        let mut seen = vec![false; vocab];
        for &token in history.tokens() {
            let slot = slot_mut(&mut seen, token, vocab)?;
            if !*slot {
                *slot = true;
                // `vocab` checked by slot_mut, so the index is in range.
                let l = &mut out[token as usize];
                *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
            }
        }
    }

    if shaping.uses_counts() {
        let mut counts = vec![0u32; vocab];
        for &token in history.generated() {
            *slot_mut(&mut counts, token, vocab)? += 1;
        }
        let frequency = shaping.frequency_penalty as f32;
        let presence = shaping.presence_penalty as f32;
        for (l, &count) in out.iter_mut().zip(&counts) {
            if count > 0 {
                *l -= frequency * count as f32;
                *l -= presence;
            }
        }
    }
    Ok(out)
}

fn slot_mut<T>(slots: &mut [T], token: u32, vocab: usize) -> Result<&mut T, SamplingError> {
    slots
        .get_mut(token as usize)
        .ok_or(SamplingError::TokenOutOfVocab {
            what: "history",
            token,
            vocab,
        })
}

/// Steps 4–7 on penalised logits: temperature, then top-k, top-p, min-p. Returns f64 logits
/// shifted so the largest is 0 (every rule and the softmax depend only on differences, and the
/// shift keeps `l / t` finite or -inf for any t > 0, where a tiny t would overflow `l / t` to +inf
/// and make the softmax NaN). Dropped tokens are -inf; the most likely token always survives.
pub(crate) fn warp(penalized: &[f32], shaping: &Shaping) -> Vec<f64> {
    use rayon::prelude::*;
    let max = penalized.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = shaping.temperature;
    let scaled = |&l: &f32| (l as f64 - max) / t;
    let mut logits: Vec<f64> = if penalized.len() >= PARALLEL_MIN {
        penalized
            .par_iter()
            .with_min_len(4096)
            .map(scaled)
            .collect()
    } else {
        penalized.iter().map(scaled).collect()
    };
    let k = shaping.top_k as usize;
    if k > 0 && k < logits.len() {
        top_k(&mut logits, k);
    }
    if shaping.top_p < 1.0 {
        top_p(&mut logits, shaping.top_p);
    }
    if shaping.min_p > 0.0 {
        min_p(&mut logits, shaping.min_p);
    }
    logits
}

/// Steps 4 and 8 for a request with temperature only (no top-k, top-p or min-p): the unnormalised
/// softmax weights exp(scaled logit), straight from the f32 row. `warp` then `softmax_in_place`
/// compute the same values in two more passes over 1.2 MB: the largest shifted logit is exactly 0,
/// and x - 0.0 == x, so exp(x - max) is exp(x) bit for bit.
pub(crate) fn temperature_weights(penalized: &[f32], shaping: &Shaping) -> Vec<f64> {
    use rayon::prelude::*;
    let max = penalized.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = shaping.temperature;
    let weight = |&l: &f32| {
        let s = (l as f64 - max) / t;
        if s == f64::NEG_INFINITY {
            0.0
        } else {
            s.exp()
        }
    };
    if penalized.len() >= PARALLEL_MIN {
        penalized
            .par_iter()
            .with_min_len(4096)
            .map(weight)
            .collect()
    } else {
        penalized.iter().map(weight).collect()
    }
}

/// Largest `top_k` served by [`warp_top_k`] (the heap path of [`top_k`]).
pub(crate) const SPARSE_TOP_K_MAX: usize = 1024;

/// [`warp`] for a request with 1 <= top_k <= SPARSE_TOP_K_MAX < len: only the tokens top-k keeps,
/// as ids in increasing order and their shifted logits, then top-p and min-p on them (-inf where
/// they drop a token). Every kept value has the bits `warp` gives it, without the row of f64 logits
/// or the passes over it (1.2 MB and ~1 ms per 151936-logit row): the k-th largest is taken on
/// the f32 logits (the shift and scale are monotone, so it maps to warp's threshold), and the kept
/// set is every logit at or above the smallest f32 that still scales to it. top-p and min-p see the
/// same survivors in the same order (warp's pass them through `Survivors` too), so they drop the same.
pub(crate) fn warp_top_k(penalized: &[f32], shaping: &Shaping) -> (Vec<usize>, Vec<f64>) {
    let max = penalized.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = shaping.temperature;
    let k = shaping.top_k as usize;
    // The k largest keys of a slice (a min-heap of them).
    let largest = |row: &[f32]| {
        let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
        for &l in row {
            let key = std::cmp::Reverse(f32_key(l));
            if heap.len() < k {
                heap.push(key);
            } else if heap.peek().is_some_and(|m| key < *m) {
                heap.pop();
                heap.push(key);
            }
        }
        heap
    };
    // Per chunk on the rayon pool for long rows, then the k largest of their k largest: the k-th
    // largest value is the same whatever the split.
    let heap = if penalized.len() >= PARALLEL_MIN {
        use rayon::prelude::*;
        let parts: Vec<f32> = penalized
            .par_chunks(PARALLEL_MIN)
            .flat_map_iter(|c| largest(c).into_iter().map(|r| f32_from_key(r.0)))
            .collect();
        largest(&parts)
    } else {
        largest(penalized)
    };
    let kth = heap.peek().map_or(f32::NEG_INFINITY, |m| f32_from_key(m.0));
    let lo = lowest_kept(max, kth, t);
    warp_kept(max, lo, shaping, penalized.iter().copied().enumerate())
}

/// The smallest f32 that top-k keeps when `kth` is the k-th largest logit and `max` the largest:
/// lower f32 values that scale to the same logit are ties warp keeps too, so the smallest finite x
/// with scaled(x) >= scaled(kth), by bisection over the f32 order (the predicate is monotone; a
/// step-by-step walk could be long: with a tiny temperature everything below scales to -inf).
fn lowest_kept(max: f64, kth: f32, t: f64) -> f32 {
    let scaled = |l: f32| (l as f64 - max) / t;
    let threshold = scaled(kth);
    if !kth.is_finite() {
        return kth;
    }
    let (mut a, mut b) = (f32_key(-f32::MAX), f32_key(kth)); // answer in a..=b
    while a < b {
        let mid = a + (b - a) / 2;
        if scaled(f32_from_key(mid)) >= threshold {
            b = mid;
        } else {
            a = mid + 1;
        }
    }
    f32_from_key(a)
}

/// The (id, logit) pairs at or above `lo` (not -inf) of `row`, ids increasing, with warp's shifted
/// logits; then top-p and min-p on them.
fn warp_kept(
    max: f64,
    lo: f32,
    shaping: &Shaping,
    row: impl Iterator<Item = (usize, f32)>,
) -> (Vec<usize>, Vec<f64>) {
    let t = shaping.temperature;
    let k = shaping.top_k as usize;
    let (mut ids, mut vals) = (Vec::with_capacity(2 * k), Vec::with_capacity(2 * k));
    for (i, l) in row {
        if l >= lo && l != f32::NEG_INFINITY {
            ids.push(i);
            vals.push((l as f64 - max) / t);
        }
    }
    if shaping.top_p < 1.0 {
        top_p(&mut vals, shaping.top_p);
    }
    if shaping.min_p > 0.0 {
        min_p(&mut vals, shaping.min_p);
    }
    (ids, vals)
}

/// [`warp_top_k`] from a row's candidates instead of the row: `ids` increasing, `logits` theirs,
/// every logit of the row at or above the smallest candidate among them (a backend's selection of
/// the K >= k largest, with their ties). The same ids and bits as `warp_top_k` of the row, or None
/// when they might not be: fewer than k candidates, a NaN or +inf among them, or a kept value below
/// the smallest candidate (top-k keeps lower values that scale to the k-th largest's logit).
pub(crate) fn warp_top_k_candidates(
    ids: &[u32],
    logits: &[f32],
    shaping: &Shaping,
) -> Option<(Vec<usize>, Vec<f64>)> {
    let k = shaping.top_k as usize;
    if k == 0 || logits.len() < k || logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY) {
        return None;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut keys: Vec<u32> = logits.iter().map(|&l| f32_key(l)).collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let kth = f32_from_key(keys[k - 1]);
    let floor = f32_from_key(keys[keys.len() - 1]);
    let lo = lowest_kept(max, kth, shaping.temperature);
    // The least key `l >= lo` admits (-0.0 >= 0.0, so both zeros when lo is a zero) must be a candidate's.
    let least = if lo == 0.0 {
        f32_key(-0.0)
    } else {
        f32_key(lo)
    };
    if least < f32_key(floor) {
        return None;
    }
    let row = ids.iter().zip(logits).map(|(&i, &l)| (i as usize, l));
    Some(warp_kept(max, lo, shaping, row))
}

/// The bits of `x` as an unsigned key in `f32::total_cmp`'s order, and back.
fn f32_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | (1 << 31)
    }
}

fn f32_from_key(k: u32) -> f32 {
    f32::from_bits(if k >> 31 == 1 { k & !(1 << 31) } else { !k })
}

/// Drops every logit strictly below the k-th largest (1 <= k < len); ties with it are kept.
fn top_k(logits: &mut [f64], k: usize) {
    // The k-th largest in total_cmp's order, over integer keys: for the usual small k a min-heap of
    // the k largest seen (one compare for most tokens), else a selection.
    let threshold = if k <= 1024 {
        let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
        for &l in logits.iter() {
            let key = std::cmp::Reverse(ordered_bits(l));
            if heap.len() < k {
                heap.push(key);
            } else if heap.peek().is_some_and(|m| key < *m) {
                heap.pop();
                heap.push(key);
            }
        }
        heap.peek()
            .map_or(f64::NEG_INFINITY, |m| from_ordered_bits(m.0))
    } else {
        let mut keys: Vec<u64> = logits.iter().map(|&l| ordered_bits(l)).collect();
        let at = keys.len() - k;
        let (_, kth, _) = keys.select_nth_unstable(at);
        from_ordered_bits(*kth)
    };
    for l in logits.iter_mut() {
        if *l < threshold {
            *l = f64::NEG_INFINITY;
        }
    }
}

/// The bits of `x` as an unsigned key in `f64::total_cmp`'s order.
fn ordered_bits(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | (1 << 63)
    }
}

/// The inverse of [`ordered_bits`].
fn from_ordered_bits(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// Nucleus filter: walking tokens from least to most likely, drops each one while the cumulative
/// probability up to and including it is <= 1 - top_p; the most likely token is always kept.
///
/// The dropped set is the longest prefix of that ascending order whose mass fits the budget, so it is
/// found by a mass-weighted quickselect instead of sorting the vocabulary: partition around the
/// median, keep the lower half if its mass still fits, else search inside it. The prefix's mass is
/// summed half by half instead of token by token (equal up to rounding). A full sort of 151936
/// tokens cost 17 ms per sampled token on the H200's host (`cargo bench -p sampling --bench shaping`).
fn top_p(logits: &mut [f64], top_p: f64) {
    let s = Survivors::of(logits);
    let probs = &s.probs;
    // Ascending order key: smaller logit first, higher id first among equals (the reverse of "most
    // likely first, lower id first"). Logits here are finite (p > 0), so their order is that of the
    // IEEE bits with the sign folded, and one integer compare does; ids rise with the survivor index
    // j, so j stands in for the id.
    let key =
        |j: usize| ((ordered_bits(logits[s.id(j)]) as u128) << 32) | (u32::MAX - j as u32) as u128;
    let budget = 1.0 - top_p;
    // Tokens under budget / n are dropped whatever the order among them: they come first in the
    // ascending walk and together weigh less than n * (budget / n). Only the rest is searched, which
    // for a peaked row is a small part of the vocabulary.
    let positive = probs.iter().filter(|&&p| p > 0.0).count();
    let floor = budget / positive.max(1) as f64;
    let below = |p: f64| p > 0.0 && p < floor;
    // Their mass in blocks (one dependent chain of ~150k additions cost 0.5 ms), then the blocks in order.
    let below_mass = |c: &[f64]| c.iter().filter(|&&p| below(p)).sum::<f64>();
    let mut dropped_mass: f64 = if probs.len() >= PARALLEL_MIN {
        use rayon::prelude::*;
        let blocks: Vec<f64> = probs.par_chunks(SUM_BLOCK).map(below_mass).collect();
        blocks.iter().sum()
    } else {
        probs.chunks(SUM_BLOCK).map(below_mass).sum()
    };
    let mut ascending: Vec<u128> = (0..probs.len())
        .filter(|&j| probs[j] > 0.0 && !below(probs[j]))
        .map(key)
        .collect();
    for (j, &p) in probs.iter().enumerate() {
        if below(p) {
            logits[s.id(j)] = f64::NEG_INFINITY;
        }
    }
    let id = |k: u128| (u32::MAX - k as u32) as usize;
    let Some(top) = ascending.iter().copied().max() else {
        return;
    };
    // The most likely token is never dropped: leave it out of the search.
    let top_at = ascending.iter().position(|&k| k == top).unwrap_or(0);
    ascending.swap_remove(top_at);
    let (mut lo, mut hi) = (0, ascending.len());
    // Invariant: the tokens below the floor and ascending[..lo] are the prefix known to be dropped
    // (mass `dropped_mass`); the end of the dropped prefix lies in lo..=hi.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        ascending[lo..hi].select_nth_unstable(mid - lo);
        let lower: f64 = ascending[lo..mid].iter().map(|&k| probs[id(k)]).sum();
        let with_pivot = dropped_mass + lower + probs[id(ascending[mid])];
        if with_pivot <= budget {
            (lo, dropped_mass) = (mid + 1, with_pivot);
        } else if dropped_mass + lower <= budget {
            lo = mid; // the pivot is the first token kept
            break;
        } else {
            hi = mid;
        }
    }
    for &k in &ascending[..lo] {
        logits[s.id(id(k))] = f64::NEG_INFINITY;
    }
}

/// The softmax of `logits` on the tokens still in (finite logits), equal bit for bit to the full
/// row's softmax at those ids (the dropped tokens' zeros add nothing to the sum, which runs in id
/// order either way): after top-k only a few remain, so only they are exponentiated.
struct Survivors {
    /// The ids in increasing order; None: every id (most of the row is in, the dense softmax).
    ids: Option<Vec<usize>>,
    probs: Vec<f64>,
}

impl Survivors {
    fn of(logits: &[f64]) -> Self {
        let n = logits.iter().filter(|&&l| l != f64::NEG_INFINITY).count();
        if 2 * n > logits.len() {
            return Survivors {
                ids: None,
                probs: softmax_in_place(logits.to_vec()),
            };
        }
        let ids: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i] != f64::NEG_INFINITY)
            .collect();
        let probs = softmax_in_place(ids.iter().map(|&i| logits[i]).collect());
        Survivors {
            ids: Some(ids),
            probs,
        }
    }

    /// The token id of survivor j.
    fn id(&self, j: usize) -> usize {
        self.ids.as_ref().map_or(j, |ids| ids[j])
    }
}

/// Rows at least this long are exponentiated on the rayon pool (151936 logits: 2.7 ms per softmax
/// in one thread on the H200's host, `cargo bench -p sampling`); element-wise, so the result is the same either way.
pub(crate) const PARALLEL_MIN: usize = 16 * 1024;

/// Drops every token whose probability is below `min_p` times the largest probability.
fn min_p(logits: &mut [f64], min_p: f64) {
    let s = Survivors::of(logits);
    let max = s.probs.iter().copied().fold(0.0, f64::max);
    let threshold = min_p * max;
    for (j, p) in s.probs.iter().enumerate() {
        if *p < threshold {
            logits[s.id(j)] = f64::NEG_INFINITY;
        }
    }
}

/// Ids per block of the blocked sums (`block_sums`; distribution.rs draws with them too).
pub(crate) const SUM_BLOCK: usize = 4096;

/// The sums of consecutive blocks of `SUM_BLOCK` values, each in index order (on the rayon pool for
/// long rows): summing them in order is the row's sum, the same bits whatever the thread count, with
/// dependent chains of 4096 additions instead of the whole row's.
pub(crate) fn block_sums(v: &[f64]) -> Vec<f64> {
    use rayon::prelude::*;
    let block = |c: &[f64]| c.iter().sum::<f64>();
    if v.len() >= PARALLEL_MIN {
        v.par_chunks(SUM_BLOCK).map(block).collect()
    } else {
        v.chunks(SUM_BLOCK).map(block).collect()
    }
}

/// Softmax over logits that are finite or -inf with at least one finite (-inf -> 0).
#[cfg(test)]
pub(crate) fn softmax(logits: &[f64]) -> Vec<f64> {
    softmax_in_place(logits.to_vec())
}

/// [`softmax`] turning its own buffer into the probabilities (a 151936-row buffer freshly allocated
/// per token cost page faults on the host); element-wise work on the rayon pool for long rows, the sum
/// in index order, so the bits do not depend on either.
pub(crate) fn softmax_in_place(mut v: Vec<f64>) -> Vec<f64> {
    use rayon::prelude::*;
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // Dropped tokens (-inf) skip the libm call: after top-k nearly all of them are.
    let exp = |l: &mut f64| {
        *l = if *l == f64::NEG_INFINITY {
            0.0
        } else {
            (*l - max).exp()
        }
    };
    let parallel = v.len() >= PARALLEL_MIN;
    if parallel {
        v.par_iter_mut().with_min_len(4096).for_each(exp);
    } else {
        v.iter_mut().for_each(exp);
    }
    let sum: f64 = block_sums(&v).iter().sum();
    if parallel {
        v.par_iter_mut().with_min_len(4096).for_each(|p| *p /= sum);
    } else {
        v.iter_mut().for_each(|p| *p /= sum);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::uniform;

    /// The rule as written: sort everything most likely first (lower id first among equals), walk
    /// it from the least likely end.
    fn top_p_by_full_sort(logits: &mut [f64], top_p: f64) {
        let probs = softmax(logits);
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| probs[i] > 0.0).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let mut cumulative = 0.0;
        for &i in order.iter().skip(1).rev() {
            cumulative += probs[i];
            if cumulative > 1.0 - top_p {
                break;
            }
            logits[i] = f64::NEG_INFINITY;
        }
    }

    /// top-k (heap for k <= 1024, selection above) keeps what a full sort's k-th largest keeps.
    #[test]
    fn top_k_by_heap_or_selection_equals_top_k_by_sort() {
        let mut step = 0;
        let mut u = || {
            step += 1;
            uniform(11, step)
        };
        for vocab in [3usize, 2000, 151_936] {
            let row: Vec<f64> = (0..vocab)
                .map(|i| {
                    if i % 5 == 0 {
                        (u() * 8.0).floor()
                    } else {
                        u() * 8.0
                    }
                })
                .collect();
            for k in [1usize, 2, 20, 1024, 1025, 5000] {
                if k >= vocab {
                    continue;
                }
                let mut sorted = row.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let want: Vec<bool> = row.iter().map(|l| *l >= sorted[k - 1]).collect();
                let mut got = row.clone();
                top_k(&mut got, k);
                let kept: Vec<bool> = got.iter().map(|l| l.is_finite()).collect();
                assert_eq!(kept, want, "vocab {vocab} k {k}");
            }
        }
    }

    /// The quickselect nucleus keeps exactly the tokens the full sort keeps: peaked and flat rows,
    /// rows with ties and masked tokens, the vocabulary size of Qwen and tiny ones, several top_p.
    #[test]
    fn nucleus_by_selection_equals_nucleus_by_full_sort() {
        let mut step = 0;
        let mut u = || {
            step += 1;
            uniform(7, step)
        };
        for (case, vocab) in [
            (0, 151_936usize),
            (1, 151_936),
            (2, 5000),
            (3, 3),
            (4, 1),
            (5, 64),
        ] {
            let mut row: Vec<f64> = (0..vocab)
                .map(|_| match case {
                    0 => u() * 30.0 - 30.0,         // peaked: a few tokens hold the mass
                    1 => u() * 2.0,                 // flat: the nucleus is most of the vocabulary
                    2 => (u() * 6.0).floor() - 6.0, // six values only: ties everywhere
                    _ => u() * 4.0 - 4.0,
                })
                .collect();
            if vocab > 10 {
                for i in (0..vocab).step_by(7) {
                    row[i] = f64::NEG_INFINITY; // masked by an earlier rule
                }
            }
            for p in [0.05, 0.5, 0.9, 0.95, 0.999] {
                let (mut fast, mut slow) = (row.clone(), row.clone());
                top_p(&mut fast, p);
                top_p_by_full_sort(&mut slow, p);
                let kept = |r: &[f64]| r.iter().filter(|l| l.is_finite()).count();
                assert_eq!(
                    kept(&fast),
                    kept(&slow),
                    "case {case} vocab {vocab} top_p {p}: kept"
                );
                assert!(
                    fast.iter()
                        .zip(&slow)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "case {case} vocab {vocab} top_p {p}: a different token set"
                );
            }
        }
    }
}
