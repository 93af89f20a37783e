//! Rotary position embedding, rotate-half convention (transformers' `rotate_half` + `apply_rotary_pos_emb`),
//! with partial rotation: only the first `rotary_dim` dims of each head rotate, the rest pass through.
//!
//! For head vector x, half = rotary_dim / 2 and j < half:
//!   x[j]        <- x[j] * cos(f_j) - x[j + half] * sin(f_j)
//!   x[j + half] <- x[j + half] * cos(f_j) + x[j] * sin(f_j)
//! with f_j = pos * inv_freq[j] and inv_freq[j] = 1 / theta^(2j / rotary_dim).
//!
//! Numerics follow transformers' default rope: `inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))`
//! in f32, `freqs = pos.float() * inv_freq` as one f32 product, cos/sin of that f32 value rounded to f32 (we
//! take them through f64, i.e. correctly rounded; torch's f32 cos/sin is within 1 ulp of that).
//!
//! Invariant: dims at and beyond `rotary_dim` are never touched; each (row, head) is rotated exactly once.

use crate::linear::check_len;

/// inv_freq[j] = 1 / theta^(2j / rotary_dim) for j < rotary_dim / 2, computed in f32 like transformers.
pub fn rope_inv_freq(rotary_dim: usize, theta: f32) -> Vec<f32> {
    (0..rotary_dim / 2)
        .map(|j| {
            let exponent = (2 * j) as f32 / rotary_dim as f32;
            let power = (theta as f64).powf(exponent as f64) as f32;
            1.0f32 / power
        })
        .collect()
}

/// Rotate-half RoPE on x [n, heads, head_dim] in place over the first `rotary_dim` dims of each head; row i is
/// at position `positions[i]`; theta is the rope base (`rope_theta`).
///
/// Panics (programmer error) if `rotary_dim` is odd or exceeds `head_dim`, or a buffer is short.
pub fn rope(
    x: &mut [f32],
    positions: &[usize],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f32,
) {
    assert!(
        rotary_dim.is_multiple_of(2),
        "rope: rotary_dim {rotary_dim} is odd"
    );
    let inv_freq = rope_inv_freq(rotary_dim, theta);
    rope_with_inv_freq(x, positions, heads, head_dim, &inv_freq);
}

/// [`rope`] with caller-supplied inverse frequencies (rotary_dim = 2 * inv_freq.len()): for scaled rope
/// variants, or to compute the table once per model.
pub fn rope_with_inv_freq(
    x: &mut [f32],
    positions: &[usize],
    heads: usize,
    head_dim: usize,
    inv_freq: &[f32],
) {
    let half = inv_freq.len();
    assert!(
        2 * half <= head_dim,
        "rope: rotary_dim {} exceeds head_dim {head_dim}",
        2 * half
    );
    let n = positions.len();
    check_len(
        "rope: x [n, heads, head_dim]",
        x.len(),
        n * heads * head_dim,
    );
    if half == 0 || heads == 0 {
        return;
    }
    let mut cos = vec![0.0f32; half];
    let mut sin = vec![0.0f32; half];
    for (row, &pos) in x.chunks_exact_mut(heads * head_dim).zip(positions) {
        let pos = pos as f32;
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
            let freq = (pos * f) as f64;
            *c = freq.cos() as f32;
            *s = freq.sin() as f32;
        }
        for head in row.chunks_exact_mut(head_dim) {
            let (first, rest) = head.split_at_mut(half);
            let second = &mut rest[..half];
            for (((a, b), &c), &s) in first.iter_mut().zip(second.iter_mut()).zip(&cos).zip(&sin) {
                let (x1, x2) = (*a, *b);
                *a = x1 * c - x2 * s;
                *b = x2 * c + x1 * s;
            }
        }
    }
}
