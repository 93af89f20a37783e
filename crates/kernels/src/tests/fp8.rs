//! FP8 linear layers: e4m3 decoding against the format's definition, the kernel against an f64 dot
//! product over the dequantized weights, bit equality across instruction sets, row counts and output
//! prefixes (batch invariance), and the quantizer's scales and rounding.

use super::Rng;
use crate::fp8::{fp8_simd_paths, linear_fp8_path};
use crate::{e4m3_from_f32, e4m3_value, linear_fp8, linear_fp8_rows, Fp8Matrix};

/// e4m3 (float8_e4m3fn) from its definition: bias 7, subnormals m · 2^-9, no infinities.
fn e4m3_reference(q: u8) -> f64 {
    let (s, e, m) = (q >> 7, ((q >> 3) & 0xF) as i32, (q & 7) as f64);
    let v = if e == 0 {
        m * 2f64.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

#[test]
fn e4m3_bytes_decode_exactly() {
    for q in 0..=255u8 {
        if q & 0x7F == 0x7F {
            continue; // NaN codes
        }
        assert_eq!(e4m3_value(q) as f64, e4m3_reference(q), "code {q:#04x}");
    }
    assert_eq!(e4m3_value(0x7E), 448.0);
    assert_eq!(e4m3_value(0x01), 2f32.powi(-9));
}

#[test]
fn the_bf16_byte_tables_hold_every_e4m3_value() {
    for q in 0..128u8 {
        let bits = (crate::fp8::BF16_HI[q as usize] as u32) << 24
            | (crate::fp8::BF16_LO[q as usize] as u32) << 16;
        assert_eq!(f32::from_bits(bits), e4m3_value(q), "code {q:#04x}");
    }
}

#[test]
fn rounding_to_e4m3_is_nearest_even_and_saturates() {
    for q in (0..=0x7Eu8).chain(0x80..=0xFE) {
        assert_eq!(e4m3_from_f32(e4m3_value(q)), q, "code {q:#04x}");
    }
    assert_eq!(e4m3_from_f32(1.0625), 0x38); // halfway between 1 (0x38) and 1.125: to even
    assert_eq!(e4m3_from_f32(1.07), 0x39);
    assert_eq!(e4m3_from_f32(-1e6), 0xFE);
}

fn random(m: usize, k: usize, block: [usize; 2], seed: u64) -> (Fp8Matrix, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let w: Vec<f32> = (0..m * k)
        .map(|i| (rng.uniform() * 2.0 - 1.0) * (1.0 + (i % 7) as f32) * 0.01)
        .collect();
    let q = Fp8Matrix::quantize(&w, m, k, block);
    let mut deq = vec![0f32; m * k];
    for (r, row) in deq.chunks_exact_mut(k).enumerate() {
        q.dequantize_row(r, row);
    }
    (q, deq)
}

#[test]
fn quantized_blocks_keep_e4m3_precision() {
    let (m, k, block) = (200, 320, [128, 128]);
    let mut rng = Rng::new(5);
    let w: Vec<f32> = (0..m * k).map(|_| rng.uniform() - 0.5).collect();
    let q = Fp8Matrix::quantize(&w, m, k, block);
    let (data, scales) = q.parts();
    assert_eq!(scales.len(), 2 * 3);
    let mut row = vec![0f32; k];
    for r in 0..m {
        q.dequantize_row(r, &mut row);
        for c in 0..k {
            let s = scales[r / 128 * 3 + c / 128];
            // Half an e4m3 step of the value (3 mantissa bits), or of the subnormal spacing.
            let bound = (w[r * k + c].abs() / 16.0).max(s * 2f32.powi(-10)) * 1.0001;
            assert!((row[c] - w[r * k + c]).abs() <= bound, "({r}, {c})");
            assert_eq!(row[c], e4m3_value(data[r * k + c]) * s);
        }
    }
    // Each block's largest magnitude maps to ±448.
    let amax = (0..128)
        .flat_map(|r| w[r * k..r * k + 128].iter())
        .fold(0f32, |a, v| a.max(v.abs()));
    assert_eq!(scales[0], amax / 448.0);
}

#[test]
fn fp8_linear_matches_f64_and_every_path_gives_the_same_bits() {
    for (m, k, block, n) in [
        (130, 320, [128, 128], 3),
        (64, 40, [128, 128], 5),
        (96, 256, [32, 64], 17),
        (33, 128, [128, 128], 1),
        (50, 200, [16, 48], 10),
        (20, 96, [7, 16], 9),
    ] {
        let (w, deq) = random(m, k, block, m as u64 + k as u64);
        let mut rng = Rng::new(11);
        let x: Vec<f32> = (0..n * k).map(|_| rng.uniform() * 4.0 - 2.0).collect();
        let mut out = vec![0f32; n * m];
        linear_fp8(&x, &w, n, &mut out);
        for r in 0..n {
            for j in 0..m {
                let (wr, xr) = (&deq[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                let exact: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                let size: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let got = out[r * m + j] as f64;
                assert!(
                    (got - exact).abs() <= 1e-6 * size + 1e-12,
                    "[{m}x{k}] ({r}, {j})"
                );
            }
        }
        for path in fp8_simd_paths() {
            let mut o = vec![0f32; n * m];
            linear_fp8_path(path, &x, &w, n, &mut o);
            assert!(
                o.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{path} [{m}x{k}]"
            );
        }
        // Each row alone, and a prefix of the outputs, give the same bits.
        for r in 0..n {
            let mut one = vec![0f32; m];
            linear_fp8(&x[r * k..(r + 1) * k], &w, 1, &mut one);
            assert!(one
                .iter()
                .zip(&out[r * m..(r + 1) * m])
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        let rows = m / 2;
        let mut prefix = vec![0f32; n * rows];
        linear_fp8_rows(&x, &w, n, rows, &mut prefix);
        for r in 0..n {
            assert!(prefix[r * rows..(r + 1) * rows]
                .iter()
                .zip(&out[r * m..r * m + rows])
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}

#[test]
fn fp8_matrices_refuse_what_the_kernels_do_not_take() {
    assert!(Fp8Matrix::new(&[0; 4], &[1.0], 2, 2, [128, 100]).is_err());
    assert!(Fp8Matrix::new(&[0; 3], &[1.0], 2, 2, [128, 128]).is_err());
    assert!(Fp8Matrix::new(&[0; 4], &[1.0, 2.0], 2, 2, [128, 128]).is_err());
}

/// Prefill rows (more than a verify block) with row blocks of a multiple of 64 rows run on AMX tiles: the
/// e4m3 values exact in bf16, the inputs times their block scale split into three bf16 terms, so each
/// output is within f32 accumulation error of the f64 dot over the dequantized weights; a verify block
/// keeps the decode kernel's bits, prefixes and thread counts keep the bits. Other row blocks (and CPUs
/// without AMX): the decode kernel's bits for any row count.
#[test]
fn prefill_rows_run_on_tiles_at_f32_precision() {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (m, k, block, n) in [
        (130, 320, [128, 128], 40),
        (200, 256, [64, 64], 30),
        (70, 200, [16, 48], 23),
    ] {
        let (w, deq) = random(m, k, block, 3 + k as u64);
        let mut rng = Rng::new(19);
        let x: Vec<f32> = (0..n * k).map(|_| rng.uniform() * 4.0 - 2.0).collect();
        let mut out = vec![0f32; n * m];
        linear_fp8(&x, &w, n, &mut out);
        let mut decode = vec![0f32; n * m];
        linear_fp8_path("portable", &x, &w, n, &mut decode);
        if !(crate::amx::available() && block[0] % 64 == 0) {
            assert_eq!(w.batch_invariant_rows(), usize::MAX);
            assert_eq!(bits(&out), bits(&decode), "[{m}x{k}] on the decode kernel");
            continue;
        }
        assert_eq!(w.batch_invariant_rows(), crate::MATVEC_MAX_ROWS);
        for r in 0..n {
            for j in 0..m {
                let (wr, xr) = (&deq[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                let exact: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let size: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = out[r * m + j] as f64;
                assert!(
                    (got - exact).abs() <= 2e-6 * size + 1e-12,
                    "[{m}x{k}] ({r}, {j})"
                );
            }
        }
        let verify = crate::MATVEC_MAX_ROWS;
        let mut block_out = vec![0f32; verify * m];
        linear_fp8(&x[..verify * k], &w, verify, &mut block_out);
        assert_eq!(
            bits(&block_out),
            bits(&decode[..verify * m]),
            "[{m}x{k}] verify block"
        );
        super::assert_prefix_and_threads_keep_bits(
            &out,
            n,
            m,
            m / 2 + 1,
            |dst| linear_fp8(&x, &w, n, dst),
            |rows, dst| linear_fp8_rows(&x, &w, n, rows, dst),
            &format!("[{m}x{k}]"),
        );
    }
}
