//! Depthwise causal conv1d over time with SiLU, in streaming form (the gated DeltaNet's short convolution,
//! transformers' `causal_conv1d_fn` / `causal_conv1d_update` with `activation="silu"`, no bias).
//!
//! For channel ch and time t: `out[t, ch] = silu(sum_{j<K} w[ch, j] * input[t - (K-1) + j, ch])`, where inputs
//! before the first new row come from `window` (the previous K-1 inputs, oldest first; zeros at sequence
//! start, which equals transformers' left zero padding).
//!
//! Invariant: after a call, `window` holds the last K-1 inputs of (old window ++ x), so processing a sequence
//! in one call, row by row, or in any chunking gives identical outputs and windows.

use crate::elementwise::silu;
use crate::linear::check_len;

/// x [n, c]; weight [c, K] (transformers' `conv1d.weight` [c, 1, K] flattened); window [K-1, c], updated in
/// place; out [n, c].
///
/// Panics (programmer error) if a buffer is shorter than its shape.
pub fn causal_conv1d_silu(
    x: &[f32],
    weight: &[f32],
    window: &mut [f32],
    n: usize,
    c: usize,
    kernel: usize,
    out: &mut [f32],
) {
    if kernel == 0 || c == 0 {
        out.iter_mut().take(n * c).for_each(|o| *o = 0.0);
        return;
    }
    let history = kernel - 1;
    check_len("causal_conv1d_silu: x [n, c]", x.len(), n * c);
    check_len(
        "causal_conv1d_silu: weight [c, K]",
        weight.len(),
        c * kernel,
    );
    check_len(
        "causal_conv1d_silu: window [K-1, c]",
        window.len(),
        history * c,
    );
    check_len("causal_conv1d_silu: out [n, c]", out.len(), n * c);
    let window = &mut window[..history * c];
    // Tap-major weights [K, c], so each tap is one contiguous multiply-add over the channels.
    let mut taps = vec![0.0f32; kernel * c];
    for (ch, w_ch) in weight.chunks_exact(kernel).take(c).enumerate() {
        for (j, &wv) in w_ch.iter().enumerate() {
            taps[j * c + ch] = wv;
        }
    }
    for (t, out_row) in out.chunks_exact_mut(c).take(n).enumerate() {
        out_row.iter_mut().for_each(|o| *o = 0.0);
        for (j, tap) in taps.chunks_exact(c).enumerate() {
            // Input index t - history + j, shifted by `history` so it is never negative.
            let shifted = t + j;
            let input = if shifted < history {
                &window[shifted * c..(shifted + 1) * c]
            } else {
                let s = shifted - history;
                &x[s * c..(s + 1) * c]
            };
            for ((o, &wv), &iv) in out_row.iter_mut().zip(tap).zip(input) {
                *o += wv * iv;
            }
        }
        out_row.iter_mut().for_each(|o| *o = silu(*o));
    }
    // The new window: the last K-1 rows of (window ++ x).
    if n >= history {
        window.copy_from_slice(&x[(n - history) * c..n * c]);
    } else {
        window.copy_within(n * c.., 0);
        window[(history - n) * c..].copy_from_slice(&x[..n * c]);
    }
}
