//! Row normalisations: RMSNorm (plain `w` or zero-centred `1 + w`) and L2 normalisation.
//!
//! RMSNorm matches transformers' `Qwen3RMSNorm` / `Qwen3NextRMSNorm` in f32:
//! `y = (x * (1 / sqrt(mean(x^2) + eps))) * w` (or `* (1 + w)`). The sum of squares is accumulated in f64 so
//! it is as close to exact as torch's cascade sum; everything after it (mean + eps, sqrt, reciprocal,
//! products) is f32 in torch's order, so results agree to about one ulp.
//!
//! L2 normalisation matches transformers' `l2norm` in `modeling_qwen3_next.py` (and `qwen3_5`):
//! `x * rsqrt(sum(x^2) + eps)` with eps = 1e-6 *inside* the square root, applied to q and k of the gated
//! DeltaNet before the `dk^-1/2` query scale. FLA's kernel writes it `x / sqrt(sum(x^2) + eps)`: the same
//! value up to one rounding. We compute `1 / sqrt(..)` in f32 and multiply, as transformers does.
//!
//! Invariant: each row is normalised independently; rows are processed in parallel only when there is enough
//! work, which does not change any result.

use rayon::prelude::*;

use crate::linear::check_len;

/// Rows of at least this many values in total are normalised in parallel.
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// Sum of squares of a row, accumulated in f64 (4 partial sums, fixed order).
#[inline]
fn sum_squares(row: &[f32]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut chunks = row.chunks_exact(4);
    for c in &mut chunks {
        for l in 0..4 {
            let v = c[l] as f64;
            acc[l] += v * v;
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum();
    (acc[0] + acc[2]) + (acc[1] + acc[3]) + tail
}

/// 1 / sqrt(mean(x^2) + eps), with mean and the rest in f32 as torch computes `rsqrt(variance + eps)`.
#[inline]
fn rms_inverse(row: &[f32], eps: f32) -> f32 {
    let variance = (sum_squares(row) / row.len() as f64) as f32;
    1.0 / (variance + eps).sqrt()
}

#[inline]
fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, zero_centred: bool, out: &mut [f32]) {
    let inv = rms_inverse(x, eps);
    if zero_centred {
        for ((o, &xv), &wv) in out.iter_mut().zip(x).zip(w) {
            *o = (xv * inv) * (1.0 + wv);
        }
    } else {
        for ((o, &xv), &wv) in out.iter_mut().zip(x).zip(w) {
            *o = (xv * inv) * wv;
        }
    }
}

/// RMSNorm over rows of width `w.len()`: x [rows, width] -> out [rows, width].
/// `zero_centred` selects the Qwen3-Next / Qwen3.5 weight convention `(1 + w)`; otherwise `w` (Qwen3, and
/// the gated DeltaNet output norm).
///
/// Panics (programmer error) if `x.len()` is not a multiple of the width or `out` is shorter than `x`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, zero_centred: bool, out: &mut [f32]) {
    let width = w.len();
    if width == 0 {
        return;
    }
    assert!(
        x.len().is_multiple_of(width),
        "rms_norm: x holds {} values, not a multiple of width {width}",
        x.len()
    );
    check_len("rms_norm: out", out.len(), x.len());
    let out = &mut out[..x.len()];
    let job = |(xr, or): (&[f32], &mut [f32])| rms_norm_row(xr, w, eps, zero_centred, or);
    if x.len() >= PARALLEL_MIN_VALUES {
        x.par_chunks_exact(width)
            .zip(out.par_chunks_exact_mut(width))
            .for_each(job);
    } else {
        x.chunks_exact(width)
            .zip(out.chunks_exact_mut(width))
            .for_each(job);
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32, zero_centred: bool) {
    let width = w.len();
    if width == 0 {
        return;
    }
    assert!(
        x.len().is_multiple_of(width),
        "rms_norm_inplace: x holds {} values, not a multiple of width {width}",
        x.len()
    );
    let job = |row: &mut [f32]| {
        let inv = rms_inverse(row, eps);
        for (v, &wv) in row.iter_mut().zip(w) {
            let scale = if zero_centred { 1.0 + wv } else { wv };
            *v = (*v * inv) * scale;
        }
    };
    if x.len() >= PARALLEL_MIN_VALUES {
        x.par_chunks_exact_mut(width).for_each(job);
    } else {
        x.chunks_exact_mut(width).for_each(job);
    }
}

/// Row-wise L2 normalisation in place: x <- x * (1 / sqrt(sum(x^2) + eps)) over rows of width `d`.
/// Use eps = 1e-6 for the gated DeltaNet q/k (transformers' `l2norm` default, FLA's value).
///
/// Panics (programmer error) if `x.len()` is not a multiple of `d`.
pub fn l2_normalize_rows(x: &mut [f32], d: usize, eps: f32) {
    if d == 0 {
        return;
    }
    assert!(
        x.len().is_multiple_of(d),
        "l2_normalize_rows: x holds {} values, not a multiple of d {d}",
        x.len()
    );
    let job = |row: &mut [f32]| {
        let inv = 1.0 / ((sum_squares(row) as f32) + eps).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    };
    if x.len() >= PARALLEL_MIN_VALUES {
        x.par_chunks_exact_mut(d).for_each(job);
    } else {
        x.chunks_exact_mut(d).for_each(job);
    }
}
