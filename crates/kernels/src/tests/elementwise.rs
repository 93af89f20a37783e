//! Activations, softmax, argmax and add against hand-computed values (torch's formulas and thresholds).

use crate::{
    add_inplace, argmax, sigmoid, silu, silu_inplace, silu_mul, softmax_inplace, softplus,
};

#[test]
fn softplus_matches_torch_values_and_threshold() {
    // Values from log1p(exp(x)) in f64.
    assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
    assert!((softplus(1.0) - 1.313_261_7).abs() < 1e-6);
    assert!(
        (softplus(-30.0) / 9.357_623e-14 - 1.0).abs() < 1e-5,
        "log1p keeps precision for tiny values"
    );
    // torch returns x itself above the threshold 20 (no exp overflow for large x).
    assert_eq!(softplus(20.5), 20.5);
    assert_eq!(softplus(1e30), 1e30);
}

#[test]
fn sigmoid_and_silu_hand_values() {
    assert_eq!(sigmoid(0.0), 0.5);
    assert!((sigmoid(1.0) - 0.731_058_6).abs() < 1e-7);
    assert!((silu(1.0) - 0.731_058_6).abs() < 1e-7);
    assert!((silu(-2.0) - (-2.0 * 0.119_202_92)).abs() < 1e-7);
    assert_eq!(silu(-200.0), 0.0, "exp overflow must give (-)0, not NaN");
    let mut x = vec![1.0f32, -2.0, 0.0];
    silu_inplace(&mut x);
    assert_eq!(x, vec![silu(1.0), silu(-2.0), 0.0]);
    let mut out = vec![0.0f32; 3];
    silu_mul(&[1.0, -2.0, 3.0], &[2.0, 0.5, -1.0], &mut out);
    assert_eq!(out, vec![silu(1.0) * 2.0, silu(-2.0) * 0.5, -silu(3.0)]);
}

#[test]
fn long_silu_mul_uses_the_same_values_in_parallel() {
    let len = (1 << 17) + 3;
    let gate: Vec<f32> = (0..len).map(|i| (i % 97) as f32 * 0.1 - 4.0).collect();
    let up: Vec<f32> = (0..len).map(|i| (i % 13) as f32 - 6.0).collect();
    let mut out = vec![0.0f32; len];
    silu_mul(&gate, &up, &mut out);
    assert!(out
        .iter()
        .enumerate()
        .all(|(i, &o)| o == silu(gate[i]) * up[i]));
}

#[test]
fn argmax_takes_lowest_index_on_ties_and_skips_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 2.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[-5.0, -1.0, f32::NAN, -1.0]), 1);
    assert_eq!(argmax(&[]), 0);
}

/// The vectorised two-pass argmax equals a one-pass strict-`>` scan skipping NaN, on rows with ties,
/// NaN, signed zeros and maxima in every lane and in the tail.
#[test]
fn argmax_equals_a_one_pass_scan() {
    fn scan(x: &[f32]) -> usize {
        let (mut best, mut best_value) = (0, f32::NAN);
        for (i, &v) in x.iter().enumerate() {
            if !v.is_nan() && (best_value.is_nan() || v > best_value) {
                best = i;
                best_value = v;
            }
        }
        best
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for len in [1usize, 15, 16, 17, 31, 33, 100, 1000] {
        for _ in 0..200 {
            // Few distinct values, so ties are common.
            let x: Vec<f32> = (0..len)
                .map(|_| match next() % 11 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f32::NEG_INFINITY,
                    k => (k as f32 - 7.0) * 0.5,
                })
                .collect();
            assert_eq!(argmax(&x), scan(&x), "{x:?}");
        }
    }
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
}

#[test]
fn softmax_hand_values_and_shift_invariance() {
    let mut x = vec![1.0f32, 2.0, 3.0];
    softmax_inplace(&mut x);
    for (a, e) in x.iter().zip([0.090_030_57, 0.244_728_47, 0.665_240_96]) {
        assert!((a - e).abs() < 1e-7, "{a} vs {e}");
    }
    let mut big = vec![1001.0f32, 1002.0, 1003.0];
    softmax_inplace(&mut big);
    assert_eq!(big, x, "max subtraction makes large logits safe");
}

#[test]
fn add_inplace_adds() {
    let mut x = vec![1.0f32, 2.0];
    add_inplace(&mut x, &[0.5, -2.0]);
    assert_eq!(x, vec![1.5, 0.0]);
}
