//! Log-probabilities of committed tokens (the OpenAI API's `logprobs`): for each token the decode loop
//! commits, ln softmax(z)[t] of the target's raw logits row z that judged it, and the row's `top` most
//! likely tokens. Raw means before the request's shaping (temperature, penalties, top-k / top-p), as
//! vLLM reports by default, so the numbers describe the model and not the sampler.
//!
//! Invariant: one entry per committed token, in commit order (`TokenSink::commit_scored`); a token drawn
//! from a speculative verify row gets that row's values, which are the sequential decode's row (the
//! engines' verify rows equal their decode rows bit for bit), so greedy speculative and sequential runs
//! report the same numbers.

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

/// `token`'s entry from its logits row, with the `top` most likely alternatives. The normaliser is
/// summed in f64 from the row's maximum, so a 151936-entry row loses no precision to the sum.
/// Non-finite logits order after every finite one.
pub fn token_logprob(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = row
        .iter()
        .copied()
        .filter(|z| z.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row
        .iter()
        .filter(|z| z.is_finite())
        .map(|&z| f64::from(z - max).exp())
        .sum();
    let log_norm = f64::from(max) + sum.ln();
    let lp = |z: f32| -> f32 {
        match z.is_finite() {
            true => (f64::from(z) - log_norm) as f32,
            false => f32::NEG_INFINITY,
        }
    };
    let key = |z: f32| if z.is_finite() { z } else { f32::NEG_INFINITY };
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let top = top.min(row.len());
    let order = |a: &u32, b: &u32| {
        key(row[*b as usize])
            .total_cmp(&key(row[*a as usize]))
            .then(a.cmp(b))
    };
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, order);
    }
    ids.truncate(top);
    ids.sort_unstable_by(order);
    TokenLogprob {
        token,
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&z| lp(z)),
        top: ids.into_iter().map(|i| (i, lp(row[i as usize]))).collect(),
    }
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
