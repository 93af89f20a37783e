//! Rotate-half RoPE against hand-computed values and the direct cos/sin formula, incl. partial rotary_dim.

use super::{assert_close, Rng};
use crate::{rope, rope_inv_freq};

#[test]
fn rope_hand_values_head_dim_4() {
    // theta = 10000, rotary_dim 4: inv_freq = [1, 0.01]; position 1 rotates (x0, x2) by 1 rad and (x1, x3)
    // by 0.01 rad: x0' = x0 cos - x2 sin, x2' = x2 cos + x0 sin.
    let mut x = vec![1.0f32, 2.0, 3.0, 4.0];
    rope(&mut x, &[1], 1, 4, 4, 10000.0);
    let expected = [
        -1.984_110_648_555_549_5,
        1.959_900_667_496_664,
        2.462_377_902_412_315_6,
        4.019_799_668_334_994,
    ];
    assert_close(&x, &expected, 1e-7, "hand values");
    assert_eq!(rope_inv_freq(4, 10000.0), vec![1.0, 0.01]);
}

/// Direct cos/sin formula in f64 from the definition: angle = pos * theta^(-2j / rotary_dim).
fn reference(
    x: &[f32],
    positions: &[usize],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f64,
) -> Vec<f64> {
    let half = rotary_dim / 2;
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (i, &pos) in positions.iter().enumerate() {
        for h in 0..heads {
            let base = (i * heads + h) * head_dim;
            for j in 0..half {
                let angle = pos as f64 * theta.powf(-2.0 * j as f64 / rotary_dim as f64);
                let (x1, x2) = (x[base + j] as f64, x[base + j + half] as f64);
                out[base + j] = x1 * angle.cos() - x2 * angle.sin();
                out[base + j + half] = x2 * angle.cos() + x1 * angle.sin();
            }
        }
    }
    out
}

#[test]
fn rope_matches_direct_formula_with_partial_rotary_dim() {
    let mut rng = Rng::new(6);
    let (heads, head_dim) = (3, 16);
    let positions = [0usize, 1, 5, 17, 40];
    for rotary_dim in [16, 4, 8] {
        let x = rng.vec(positions.len() * heads * head_dim);
        let mut y = x.clone();
        rope(&mut y, &positions, heads, head_dim, rotary_dim, 1_000_000.0);
        // Angles up to 40 rad carry f32 rounding of pos * inv_freq (as transformers computes them): ~4e-6.
        assert_close(
            &y,
            &reference(&x, &positions, heads, head_dim, rotary_dim, 1e6),
            2e-5,
            "partial rope",
        );
        for (row_x, row_y) in x.chunks(head_dim).zip(y.chunks(head_dim)) {
            assert_eq!(
                &row_x[rotary_dim..],
                &row_y[rotary_dim..],
                "dims past rotary_dim must pass through"
            );
        }
        let position_zero = &y[..heads * head_dim];
        assert_eq!(
            position_zero,
            &x[..heads * head_dim],
            "position 0 is the identity"
        );
    }
}
