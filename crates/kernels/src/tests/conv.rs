//! Causal conv1d + SiLU against its definition, and invariance of outputs and window under any chunking.

use super::{assert_close, Rng};
use crate::{causal_conv1d_silu, silu};

/// Definition over the full input (previous window ++ x), in f64.
fn naive(x: &[f32], weight: &[f32], window: &[f32], n: usize, c: usize, kernel: usize) -> Vec<f64> {
    let full: Vec<f32> = window.iter().chain(x).copied().collect(); // [history + n, c]
    let mut out = vec![0.0f64; n * c];
    for t in 0..n {
        for ch in 0..c {
            let sum: f64 = (0..kernel)
                .map(|j| weight[ch * kernel + j] as f64 * full[(t + j) * c + ch] as f64)
                .sum();
            out[t * c + ch] = sum / (1.0 + (-sum).exp());
        }
    }
    out
}

#[test]
fn conv_matches_definition_from_zero_and_nonzero_windows() {
    let mut rng = Rng::new(9);
    for kernel in [1, 2, 4] {
        let (n, c) = (9, 5);
        let (x, weight) = (rng.vec(n * c), rng.vec(c * kernel));
        for window0 in [vec![0.0f32; (kernel - 1) * c], rng.vec((kernel - 1) * c)] {
            let mut window = window0.clone();
            let mut out = vec![f32::NAN; n * c];
            causal_conv1d_silu(&x, &weight, &mut window, n, c, kernel, &mut out);
            assert_close(
                &out,
                &naive(&x, &weight, &window0, n, c, kernel),
                1e-6,
                &format!("K={kernel}"),
            );
            assert_eq!(
                window,
                x[(n - (kernel - 1)) * c..].to_vec(),
                "window = last K-1 inputs"
            );
        }
    }
}

#[test]
fn conv_in_one_call_row_by_row_and_in_chunks_is_identical() {
    let mut rng = Rng::new(10);
    let (n, c, kernel) = (11, 7, 4);
    let (x, weight, window0) = (
        rng.vec(n * c),
        rng.vec(c * kernel),
        rng.vec((kernel - 1) * c),
    );
    let mut window_all = window0.clone();
    let mut out_all = vec![0.0f32; n * c];
    causal_conv1d_silu(&x, &weight, &mut window_all, n, c, kernel, &mut out_all);
    for chunks in [vec![1; 11], vec![2, 3, 1, 5], vec![4, 4, 3], vec![10, 1]] {
        let mut window = window0.clone();
        let mut out = vec![0.0f32; n * c];
        let mut t = 0;
        for len in chunks.iter().copied() {
            causal_conv1d_silu(
                &x[t * c..(t + len) * c],
                &weight,
                &mut window,
                len,
                c,
                kernel,
                &mut out[t * c..(t + len) * c],
            );
            t += len;
        }
        assert_eq!(out, out_all, "chunks {chunks:?}");
        assert_eq!(window, window_all, "chunks {chunks:?}");
    }
    // A hand check of one value: channel 0, t = 0 reads window rows 0..3 and x row 0.
    let sum: f32 = (0..3).map(|j| weight[j] * window0[j * c]).sum::<f32>() + weight[3] * x[0];
    assert!((out_all[0] - silu(sum)).abs() < 1e-6);
}
