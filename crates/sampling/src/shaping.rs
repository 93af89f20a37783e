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

    /// Greedy with no penalty: the selected token is the argmax of the raw logits row itself, so a
    /// backend may compute it where the logits are (`families::Wanted::argmax_only`).
    pub fn is_plain_argmax(&self) -> bool {
        self.is_greedy() && self.repetition_penalty == 1.0 && !self.uses_counts()
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
    let max = penalized.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = shaping.temperature;
    let mut logits: Vec<f64> = penalized.iter().map(|&l| (l as f64 - max) / t).collect();
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

/// Drops every logit strictly below the k-th largest (1 <= k < len); ties with it are kept.
fn top_k(logits: &mut [f64], k: usize) {
    let mut sorted = logits.to_vec();
    // Descending: position k-1 then holds the k-th largest value.
    let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let threshold = *kth;
    for l in logits.iter_mut() {
        if *l < threshold {
            *l = f64::NEG_INFINITY;
        }
    }
}

/// Nucleus filter: walking tokens from least to most likely, drops each one while the cumulative
/// probability up to and including it is <= 1 - top_p; the most likely token is always kept.
fn top_p(logits: &mut [f64], top_p: f64) {
    let probs = softmax(logits);
    // Most likely first, lower id first among equals; walked in reverse (ascending) below.
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| probs[i] > 0.0).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let tail_budget = 1.0 - top_p;
    let mut cumulative = 0.0;
    // `skip(1)` of the descending order = never consider the most likely token.
    for &i in order.iter().skip(1).rev() {
        cumulative += probs[i];
        if cumulative > tail_budget {
            break;
        }
        logits[i] = f64::NEG_INFINITY;
    }
}

/// Drops every token whose probability is below `min_p` times the largest probability.
fn min_p(logits: &mut [f64], min_p: f64) {
    let probs = softmax(logits);
    let max = probs.iter().copied().fold(0.0, f64::max);
    let threshold = min_p * max;
    for (l, p) in logits.iter_mut().zip(&probs) {
        if *p < threshold {
            *l = f64::NEG_INFINITY;
        }
    }
}

/// Softmax over logits that are finite or -inf with at least one finite (-inf -> 0).
pub(crate) fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut probs: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = probs.iter().sum();
    for p in probs.iter_mut() {
        *p /= sum;
    }
    probs
}
