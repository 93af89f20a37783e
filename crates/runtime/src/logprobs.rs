//! Log-probabilities of committed tokens (the OpenAI API's `logprobs`): for each token the decode loop
//! commits, ln softmax(z)[t] of the target's raw logits row z that judged it, and the row's `top` most
//! likely tokens. Raw means before the request's shaping (temperature, penalties, top-k / top-p), as
//! vLLM reports by default, so the numbers describe the model and not the sampler.
//!
//! `prompt_logprobs` scores a prompt the same way (the API's `echo`): entry i is prompt token i + 1 under
//! the row after the tokens before it.
//!
//! Invariant: one entry per committed token, in commit order (`TokenSink::commit_scored`); a token drawn
//! from a speculative verify row gets that row's values, which are the sequential decode's row (the
//! engines' verify rows equal their decode rows bit for bit), so greedy speculative and sequential runs
//! report the same numbers.

use families::{Backend, Rows, Wanted};

use crate::error::RuntimeError;
use crate::sink::CancelFlag;

/// Most alternatives a request may ask for per token (`top_logprobs` in the API; vLLM's default cap).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One committed token's log-probability and the row's most likely tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    /// ln p(token) under the raw distribution of its row.
    pub logprob: f32,
    /// The `top` most likely (token, ln p) of the row, most likely first; equal logits by lower id.
    pub top: Vec<(u32, f32)>,
}

/// `token`'s entry from its logits row, with the `top` most likely alternatives. The normaliser sums
/// f32 exponentials from the row's maximum in f64 (each term within 1 ulp of f32, so the entries are good to
/// ~1e-7 nats: f64 exponentials and a select over all ids took 3.0 ms a 151936-entry row on a 2-vCPU EPYC,
/// this 1.2); the top ones are kept in one pass. Non-finite logits order after every finite one.
pub fn token_logprob(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let key = |z: f32| if z.is_finite() { z } else { f32::NEG_INFINITY };
    let max = row
        .iter()
        .map(|&z| key(z))
        .fold(f32::NEG_INFINITY, f32::max);
    // Terms below e^-32 of the largest are skipped: all of them together are < V e^-32 of the sum (2e-9
    // at Qwen's 151936 ids), under f32's half ulp, and a trained model's row is mostly such terms.
    let sum: f64 = row
        .iter()
        .filter(|&&z| z.is_finite() && z - max > -32.0)
        .map(|&z| f64::from((z - max).exp()))
        .sum();
    let log_norm = f64::from(max) + sum.ln();
    let lp = |z: f32| -> f32 {
        match z.is_finite() {
            true => (f64::from(z) - log_norm) as f32,
            false => f32::NEG_INFINITY,
        }
    };
    // The best `top` (id, key), best first; equal keys by lower id (ids arrive in order, so a later
    // id never displaces an equal key).
    let top = top.min(row.len());
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &z) in row.iter().enumerate() {
            let k = key(z);
            if best.len() == top && best[top - 1].1 >= k {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= k);
            best.insert(at, (i as u32, k));
            best.truncate(top);
        }
    }
    TokenLogprob {
        token,
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&z| lp(z)),
        top: best
            .into_iter()
            .map(|(i, _)| (i, lp(row[i as usize])))
            .collect(),
    }
}

/// Prompt rows scored per forward: bounds the logits a pass brings back (64 x 151936 f32 = 39 MB).
const SCORE_CHUNK: usize = 64;

/// The entries of `prompt[1..]` under the model (the API's `echo` with `logprobs`): entry i is prompt
/// token i + 1 judged by the row after prompt[..=i], on a fresh state of its own (a session's state is
/// left alone). Cancellation is polled between chunks: `None` when it came. The rows are the backend's
/// multi-row pass: on CUDA its prefill GEMMs take bf16 activations (as transformers' bf16 forward), so the
/// scores there are within ~5e-2 nats of the CPU engine's (measured on the H200), not bitwise the decode rows'.
pub fn prompt_logprobs<B: Backend>(
    model: &B,
    prompt: &[u32],
    top: usize,
    cancel: &CancelFlag,
) -> Result<Option<Vec<TokenLogprob>>, RuntimeError> {
    let mut state = model.new_state()?;
    model.reserve(&mut state, prompt.len())?;
    let vocab = model.vocab();
    let wanted = Wanted {
        logits: Rows::All,
        ..Wanted::none()
    };
    let chunk = model.prefill_chunk().clamp(1, SCORE_CHUNK);
    let mut entries = Vec::with_capacity(prompt.len().saturating_sub(1));
    let mut pos = 0;
    // The last prompt row judges nothing in the prompt: it is never run.
    while pos + 1 < prompt.len() {
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let end = (pos + chunk).min(prompt.len() - 1);
        let out = model.forward(&prompt[pos..end], pos, &mut state, &wanted)?;
        if out.logits.len() != (end - pos) * vocab {
            return Err(RuntimeError::Device(
                format!(
                    "scoring rows {pos}..{end} returned {} logits, not {} rows of {vocab}",
                    out.logits.len(),
                    end - pos
                )
                .into(),
            ));
        }
        for (j, row) in out.logits.chunks_exact(vocab).enumerate() {
            entries.push(token_logprob(row, prompt[pos + j + 1], top));
        }
        pos = end;
    }
    Ok(Some(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ln softmax by the textbook formula in f64, for comparison.
    fn reference(row: &[f32]) -> Vec<f64> {
        let z: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
        let norm: f64 = z.iter().map(|x| x.exp()).sum::<f64>().ln();
        z.iter().map(|x| x - norm).collect()
    }

    #[test]
    fn logprobs_are_the_log_softmax_and_top_is_sorted() {
        let row = [1.5f32, -2.0, 3.25, 0.0, 3.25, -7.5];
        let want = reference(&row);
        let e = token_logprob(&row, 3, 4);
        assert_eq!(e.token, 3);
        assert!((f64::from(e.logprob) - want[3]).abs() < 1e-6);
        // Ties (ids 2 and 4) by lower id first.
        let ids: Vec<u32> = e.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [2, 4, 0, 3]);
        for (i, lp) in &e.top {
            assert!((f64::from(*lp) - want[*i as usize]).abs() < 1e-6);
        }
        let total: f64 = (0..row.len() as u32)
            .map(|t| f64::from(token_logprob(&row, t, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn large_logits_and_non_finite_entries() {
        let row = [1000.0f32, 999.0, f32::NEG_INFINITY, f32::NAN];
        let e = token_logprob(&row, 1, 10);
        assert!((e.logprob - (-1.0 - (1.0f64 + (-1.0f64).exp()).ln() as f32)).abs() < 1e-6);
        assert_eq!(e.top.len(), 4);
        assert_eq!(e.top[0].0, 0);
        assert!(e.top[2].1 == f32::NEG_INFINITY && e.top[3].1 == f32::NEG_INFINITY);
        assert_eq!(token_logprob(&row, 9, 0).logprob, f32::NEG_INFINITY);
    }
}
