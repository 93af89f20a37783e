//! `linear` / `linear_acc` against the f64 triple loop, on both paths (matvec on each ISA, gemm) and odd sizes.

use super::{assert_close, matvec_isas as isas, Rng};
use crate::linear::{linear_gemm, linear_matvec_with_isa};
use crate::{
    linear, linear_acc, linear_acc_bf16, linear_bf16, linear_bf16_matrix, linear_bf16_matrix_rows,
    Bf16Matrix, MATVEC_MAX_ROWS,
};

/// out[i, j] = sum_kk x[i, kk] * w[j, kk], the definition, in f64.
fn naive(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; n * m];
    for i in 0..n {
        for j in 0..m {
            out[i * m + j] = (0..k)
                .map(|kk| x[i * k + kk] as f64 * w[j * k + kk] as f64)
                .sum();
        }
    }
    out
}

const ODD_SHAPES: [(usize, usize); 6] = [(1, 1), (7, 5), (8, 4), (13, 33), (67, 129), (301, 517)];

#[test]
fn matvec_path_matches_naive_on_both_isas_and_odd_sizes() {
    let mut rng = Rng::new(1);
    for n in 1..=MATVEC_MAX_ROWS.max(8) {
        for &(k, m) in &ODD_SHAPES {
            let (x, w) = (rng.vec(n * k), rng.vec(m * k));
            let expected = naive(&x, &w, n, k, m);
            for isa in isas() {
                let mut out = vec![f32::NAN; n * m];
                linear_matvec_with_isa(isa, &x, &w, n, k, m, &mut out);
                assert_close(
                    &out,
                    &expected,
                    1e-5,
                    &format!("matvec {isa:?} n={n} k={k} m={m}"),
                );
            }
        }
    }
}

#[test]
fn gemm_path_matches_naive_on_odd_sizes() {
    let mut rng = Rng::new(2);
    for n in [1, 3, MATVEC_MAX_ROWS + 1, 17, 70] {
        for &(k, m) in &ODD_SHAPES {
            let (x, w) = (rng.vec(n * k), rng.vec(m * k));
            let expected = naive(&x, &w, n, k, m);
            let mut out = vec![f32::NAN; n * m];
            linear_gemm(&x, &w, n, k, m, &mut out);
            assert_close(&out, &expected, 1e-5, &format!("gemm n={n} k={k} m={m}"));
        }
    }
}

#[test]
fn public_linear_matches_naive_across_the_path_threshold() {
    let mut rng = Rng::new(3);
    let (k, m) = (129, 65);
    for n in 1..=MATVEC_MAX_ROWS + 3 {
        let (x, w) = (rng.vec(n * k), rng.vec(m * k));
        let mut out = vec![f32::NAN; n * m];
        linear(&x, &w, n, k, m, &mut out);
        assert_close(
            &out,
            &naive(&x, &w, n, k, m),
            1e-5,
            &format!("linear n={n}"),
        );
    }
}

#[test]
fn linear_acc_adds_the_scaled_product_on_both_paths() {
    let mut rng = Rng::new(4);
    let (k, m, scale) = (77, 91, -0.37f32);
    for n in [1, 2, 5, MATVEC_MAX_ROWS, MATVEC_MAX_ROWS + 1, 30] {
        let (x, w, start) = (rng.vec(n * k), rng.vec(m * k), rng.vec(n * m));
        let product = naive(&x, &w, n, k, m);
        let expected: Vec<f64> = start
            .iter()
            .zip(&product)
            .map(|(&o, &p)| o as f64 + scale as f64 * p)
            .collect();
        let mut out = start.clone();
        linear_acc(&x, &w, n, k, m, scale, &mut out);
        assert_close(&out, &expected, 1e-5, &format!("linear_acc n={n}"));
    }
}

#[test]
fn empty_inner_dimension_gives_zero_product() {
    let mut out = vec![5.0f32; 6];
    linear(&[], &[], 2, 0, 3, &mut out);
    assert_eq!(out, vec![0.0; 6]);
    let mut acc = vec![5.0f32; 6];
    linear_acc(&[], &[], 2, 0, 3, 2.0, &mut acc);
    assert_eq!(acc, vec![5.0; 6]);
}

#[test]
#[should_panic(expected = "linear: w [m, k]")]
fn short_weight_buffer_is_a_clear_panic() {
    let mut out = vec![0.0f32; 4];
    linear(&[1.0; 6], &[1.0; 5], 2, 3, 2, &mut out);
}

/// Verify blocks (n ≤ MATVEC_MAX_ROWS rows) must give every row exactly what a single-row call gives.
#[test]
fn matvec_rows_are_bitwise_independent_of_n() {
    let (k, m) = (67, 45);
    let w: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 700.0)
        .collect();
    let rows = crate::MATVEC_MAX_ROWS;
    let x: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 104729 % 997) as f32 - 498.0) / 300.0)
        .collect();
    let single: Vec<Vec<f32>> = (0..rows)
        .map(|r| {
            let mut o = vec![0.0; m];
            crate::linear(&x[r * k..(r + 1) * k], &w, 1, k, m, &mut o);
            o
        })
        .collect();
    for n in 1..=crate::MATVEC_MAX_ROWS {
        let mut o = vec![0.0; n * m];
        crate::linear(&x[..n * k], &w, n, k, m, &mut o);
        for (r, want) in single.iter().take(n).enumerate() {
            let same = o[r * m..(r + 1) * m]
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "row {r} of an {n}-row linear differs from the single-row call"
            );
        }
    }
}

/// A bf16 matrix gives exactly the bits of its f32 widening, on the matvec path (each ISA, every row count)
/// and the GEMM path, overwriting and accumulating: only the bytes read differ.
#[test]
fn bf16_weights_give_the_bits_of_their_f32_widening() {
    let mut rng = Rng::new(7);
    let bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    for &(k, m) in &[(7usize, 5usize), (13, 33), (67, 129), (384, 40)] {
        let w16: Vec<half::bf16> = rng
            .vec(m * k)
            .iter()
            .map(|&v| half::bf16::from_f32(v))
            .collect();
        let w32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        for n in [1usize, 2, 3, 4, 5, 7, 16, 20] {
            let x = rng.vec(n * k);
            if n <= MATVEC_MAX_ROWS {
                for isa in isas() {
                    let (mut a, mut b) = (vec![0.0; n * m], vec![0.0; n * m]);
                    linear_matvec_with_isa(isa, &x, &w16, n, k, m, &mut a);
                    linear_matvec_with_isa(isa, &x, &w32, n, k, m, &mut b);
                    assert!(bits(&a, &b), "matvec {isa:?} n={n} k={k} m={m}");
                }
            }
            let (mut a, mut b) = (vec![0.0; n * m], vec![0.0; n * m]);
            linear_bf16(&x, &w16, n, k, m, &mut a);
            linear(&x, &w32, n, k, m, &mut b);
            assert!(bits(&a, &b), "linear n={n} k={k} m={m}");
            let y0 = rng.vec(n * m);
            let (mut a, mut b) = (y0.clone(), y0);
            linear_acc_bf16(&x, &w16, n, k, m, 0.5, &mut a);
            linear_acc(&x, &w32, n, k, m, 0.5, &mut b);
            assert!(bits(&a, &b), "linear_acc n={n} k={k} m={m}");
        }
    }
}

fn bf16_matrix(rng: &mut Rng, m: usize, k: usize) -> (Vec<half::bf16>, Vec<f32>) {
    let w16: Vec<half::bf16> = rng
        .vec(m * k)
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .collect();
    let w32 = w16.iter().map(|v| v.to_f32()).collect();
    (w16, w32)
}

/// The layout `Bf16Matrix::new` picks on this machine (AMX tiles where the CPU and kernel offer them,
/// row-major otherwise) computes x · w^T for every row count, decode, verify and prefill sizes alike.
#[test]
fn bf16_matrix_matches_naive_for_every_row_count() {
    let mut rng = Rng::new(8);
    for &(k, m) in &[
        (1usize, 1usize),
        (7, 5),
        (31, 17),
        (33, 47),
        (67, 129),
        (384, 40),
    ] {
        let (w16, w32) = bf16_matrix(&mut rng, m, k);
        let mat = Bf16Matrix::new(w16, m, k);
        assert_eq!((mat.rows(), mat.cols()), (m, k));
        for n in [1usize, 2, 3, 5, 6, 10, 11, 17, 21, 40] {
            let x = rng.vec(n * k);
            let mut out = vec![f32::NAN; n * m];
            linear_bf16_matrix(&x, &mat, n, &mut out);
            assert_close(
                &out,
                &naive(&x, &w32, n, k, m),
                1e-5,
                &format!("{mat:?} n={n} k={k} m={m}"),
            );
        }
    }
}

/// Each row of an n-row call has the bits of the one-row call (what keeps greedy speculation exact), for
/// the layout this machine gets and for every n (AMX) or every n up to MATVEC_MAX_ROWS (row-major).
#[test]
fn bf16_matrix_rows_are_bitwise_independent_of_n() {
    let mut rng = Rng::new(9);
    let (k, m) = (100, 70);
    let (w16, _) = bf16_matrix(&mut rng, m, k);
    let mat = Bf16Matrix::new(w16, m, k);
    let max_n = match mat {
        Bf16Matrix::RowMajor { .. } => MATVEC_MAX_ROWS,
        #[cfg(target_arch = "x86_64")]
        Bf16Matrix::Amx(_) => 40,
    };
    let x = rng.vec(max_n * k);
    let single: Vec<Vec<f32>> = (0..max_n)
        .map(|r| {
            let mut o = vec![0.0; m];
            linear_bf16_matrix(&x[r * k..(r + 1) * k], &mat, 1, &mut o);
            o
        })
        .collect();
    for n in 1..=max_n {
        let mut o = vec![0.0; n * m];
        linear_bf16_matrix(&x[..n * k], &mat, n, &mut o);
        for (r, want) in single.iter().take(n).enumerate() {
            let same = o[r * m..(r + 1) * m]
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{mat:?}: row {r} of an {n}-row call differs from the one-row call"
            );
        }
    }
}

/// The first `rows` outputs alone (a draft vocabulary) have the bits of the same outputs of the full call.
#[test]
fn bf16_matrix_row_prefix_has_the_full_calls_bits() {
    let mut rng = Rng::new(10);
    let (k, m) = (70, 200);
    let (w16, _) = bf16_matrix(&mut rng, m, k);
    let mat = Bf16Matrix::new(w16, m, k);
    for n in [1usize, 4, 9] {
        let x = rng.vec(n * k);
        let mut full = vec![0.0; n * m];
        linear_bf16_matrix(&x, &mat, n, &mut full);
        for rows in [1usize, 16, 50, 64, 65, 200] {
            let mut part = vec![f32::NAN; n * rows];
            linear_bf16_matrix_rows(&x, &mat, n, rows, &mut part);
            for i in 0..n {
                let same = part[i * rows..(i + 1) * rows]
                    .iter()
                    .zip(&full[i * m..i * m + rows])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{mat:?}: row {i}, first {rows} outputs of {n} rows");
            }
        }
    }
}

/// The small matmuls of the GDN chunk and prefill attention (`matmul_serial`: AVX-512 register tiles where
/// the CPU has them, `gemm` otherwise) against f64, on tails of rows and columns, a column-major a, a
/// strided b, and accumulation with a scale.
#[test]
fn small_matmuls_match_f64_on_tails_layouts_and_accumulation() {
    use crate::linear::{matmul_serial, MatView};
    let mut rng = Rng::new(23);
    for (m, k, n) in [
        (1, 1, 1),
        (3, 5, 15),
        (4, 48, 16),
        (7, 48, 17),
        (64, 48, 33),
        (16, 32, 130),
    ] {
        let a = rng.vec(m * k);
        let stride = n + 3;
        let b = rng.vec(k * stride);
        let init = rng.vec(m * n);
        for transposed_a in [false, true] {
            // The same logical a [m, k], stored row-major or as the transpose of a row-major [k, m].
            let a_store: Vec<f32> = if transposed_a {
                (0..k * m).map(|i| a[(i % m) * k + i / m]).collect()
            } else {
                a.clone()
            };
            let av = if transposed_a {
                MatView::transposed(&a_store, m, k)
            } else {
                MatView::row_major(&a_store, m, k)
            };
            let bv = MatView {
                data: &b,
                rows: k,
                cols: n,
                rs: stride,
                cs: 1,
            };
            for accumulate in [false, true] {
                let mut dst = init.clone();
                matmul_serial(&mut dst, av, bv, -0.5, accumulate);
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..k)
                            .map(|p| a[i * k + p] as f64 * b[p * stride + j] as f64)
                            .sum();
                        let size: f64 = (0..k)
                            .map(|p| (a[i * k + p] as f64 * b[p * stride + j] as f64).abs())
                            .sum();
                        let want = if accumulate {
                            init[i * n + j] as f64
                        } else {
                            0.0
                        } - 0.5 * dot;
                        let got = dst[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-6 * (size + 1.0),
                            "[{m}x{k}x{n}] t={transposed_a} acc={accumulate} ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
