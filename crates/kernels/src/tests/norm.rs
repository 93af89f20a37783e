//! RMSNorm (plain and zero-centred) and L2 normalisation against hand-computed values and an f64 reference.

use super::{assert_close, Rng};
use crate::{l2_normalize_rows, rms_norm, rms_norm_inplace};

// Hand-computed: x = [1, 2, 3, 4], mean(x^2) = 7.5, y = x / sqrt(7.5 + 1e-6) * [1, 0.5, 2, -1].
const X: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
const EXPECTED: [f64; 4] = [
    0.365_148_347_326_888_4,
    0.365_148_347_326_888_4,
    2.190_890_083_961_330_3,
    -1.460_593_389_307_553_6,
];

#[test]
fn rms_norm_plain_matches_hand_values() {
    let mut out = vec![0.0f32; 4];
    rms_norm(&X, &[1.0, 0.5, 2.0, -1.0], 1e-6, false, &mut out);
    assert_close(&out, &EXPECTED, 3e-7, "plain");
}

#[test]
fn rms_norm_zero_centred_uses_one_plus_w() {
    // (1 + w) = [1, 0.5, 2, -1]: the same hand values as the plain case.
    let mut out = vec![0.0f32; 4];
    rms_norm(&X, &[0.0, -0.5, 1.0, -2.0], 1e-6, true, &mut out);
    assert_close(&out, &EXPECTED, 3e-7, "zero-centred");
}

#[test]
fn rms_norm_rows_are_independent_and_inplace_agrees() {
    let mut rng = Rng::new(5);
    let width = 33;
    let rows = 2200; // large enough for the parallel path
    let x = rng.vec(rows * width);
    let w = rng.vec(width);
    for zero_centred in [false, true] {
        let mut out = vec![0.0f32; x.len()];
        rms_norm(&x, &w, 1e-6, zero_centred, &mut out);
        let expected: Vec<f64> = x
            .chunks(width)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / width as f64;
                let inv = 1.0 / (ms + 1e-6).sqrt();
                row.iter()
                    .zip(&w)
                    .map(move |(&v, &wv)| {
                        v as f64
                            * inv
                            * if zero_centred {
                                1.0 + wv as f64
                            } else {
                                wv as f64
                            }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(&out, &expected, 1e-6, "rows");
        let mut inplace = x.clone();
        rms_norm_inplace(&mut inplace, &w, 1e-6, zero_centred);
        assert_eq!(inplace, out);
    }
}

#[test]
fn l2_normalize_has_eps_inside_the_sqrt() {
    let mut x = vec![3.0f32, 4.0, 0.0, 0.0];
    l2_normalize_rows(&mut x, 2, 1e-6);
    // 3 / sqrt(25 + 1e-6) = 0.599999988; a zero row stays zero instead of NaN.
    assert!((x[0] as f64 - 0.599_999_988).abs() < 1e-7);
    assert!((x[1] as f64 - 0.799_999_984).abs() < 1e-7);
    assert_eq!(&x[2..], &[0.0, 0.0]);
    let mut y = vec![3.0f32, 4.0];
    l2_normalize_rows(&mut y, 2, 0.0);
    assert_eq!(y, vec![0.6, 0.8]);
}
