//! Quantizers (quant/quantize.rs): ggml's bytes on a varied fixed input (checksums of what ggml's
//! reference quantizer wrote), round trips within the bound each format's algorithm gives, zero,
//! constant and outlier rows, block independence, and re-quantizing dequantized rows where the format
//! guarantees the same blocks back (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1; not the k-quants, whose scales come
//! from a search that need not find the grid a dequantized block lies on).
//!
//! The tool-gated tests at the end compare with `llama-quantize` itself.

use super::Rng;
use crate::{dequantize_row, quantize_matrix, quantize_row, QuantFormat};

fn quantize(format: QuantFormat, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; format.row_bytes(x.len())];
    quantize_row(format, x, &mut out);
    out
}

fn dequantize(format: QuantFormat, bytes: &[u8], k: usize) -> Vec<f32> {
    let mut out = vec![0f32; k];
    dequantize_row(format, bytes, k, &mut out);
    out
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// FNV-1a (64-bit) of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// `n` values (a multiple of 32) whose 32-value blocks cycle through the cases that steer the
/// quantizers' branches: uniform values at scales 2^-12..2^12, zero blocks, constant blocks, an outlier
/// among small values, bf16-rounded values, small integers and halves (exact ties in `x / d` and in
/// `nearest_int`), all-positive and all-negative blocks (the k-quants' `min ≤ 0` clamp), values tiny
/// enough for subnormal f16 scales, and a largest magnitude shared by +v and -v (which one ggml takes).
fn varied(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut x = Vec::with_capacity(n);
    for b in 0..n / 32 {
        let scale = 2f32.powi((rng.next_u64() % 25) as i32 - 12);
        let block: Vec<f32> = match b % 11 {
            0 => rng.vec(32).iter().map(|v| v * scale).collect(),
            1 => vec![0.0; 32],
            2 => vec![rng.uniform() * scale; 32],
            3 => {
                let mut v: Vec<f32> = rng.vec(32).iter().map(|v| v * 0.01).collect();
                v[(rng.next_u64() % 32) as usize] = 300.0 * rng.uniform().signum();
                v
            }
            4 => rng
                .vec(32)
                .iter()
                .map(|v| f32::from_bits((v * scale).to_bits() & 0xFFFF_0000))
                .collect(),
            5 => (0..32)
                .map(|_| (rng.next_u64() % 17) as f32 - 8.0)
                .collect(),
            6 => (0..32)
                .map(|_| ((rng.next_u64() % 33) as f32 - 16.0) * 0.5 * scale)
                .collect(),
            7 => rng.vec(32).iter().map(|v| (v + 1.5) * scale).collect(),
            8 => rng.vec(32).iter().map(|v| (v - 1.5) * scale).collect(),
            9 => rng.vec(32).iter().map(|v| v * 1e-6).collect(),
            _ => {
                let mut v: Vec<f32> = rng.vec(32).iter().map(|v| v * 0.5).collect();
                let (i, j) = (
                    (rng.next_u64() % 16) as usize,
                    16 + (rng.next_u64() % 16) as usize,
                );
                v[i] = 0.75;
                v[j] = -0.75;
                if b % 2 == 0 {
                    v.swap(i, j);
                }
                v
            }
        };
        x.extend(block);
    }
    x
}

/// FNV-1a of the bytes ggml's reference quantizer wrote for `varied(1, 16384)` as 16 rows of 1024: a C
/// program calling `ggml_quantize_chunk(type, x, dst, 0, 16, 1024, NULL)` (no importance matrix, as
/// llama-quantize without `--imatrix`), linked against the `libggml-base.a` of llama.cpp 0c1e570 built
/// by its CMake (Release, gcc 12, x86-64).
const GGML_CHECKSUMS: [(QuantFormat, u64); 8] = [
    (QuantFormat::Q4_0, 0x608b_7f4f_931e_4a10),
    (QuantFormat::Q4_1, 0xb654_ac2e_056b_4b03),
    (QuantFormat::Q5_0, 0xe568_22c0_134e_703f),
    (QuantFormat::Q5_1, 0x2351_7009_ef16_8489),
    (QuantFormat::Q8_0, 0xbc04_6e88_0689_fc3a),
    (QuantFormat::Q4K, 0x61c2_5461_2fc2_7797),
    (QuantFormat::Q5K, 0xe761_d0e2_b84b_5873),
    (QuantFormat::Q6K, 0xf994_ce93_1cbf_d589),
];

#[test]
fn quantizers_write_ggml_reference_bytes_on_a_varied_input() {
    let x = varied(1, 16384);
    for (format, want) in GGML_CHECKSUMS {
        let m = quantize_matrix(format, &x, 16, 1024);
        let got = fnv1a(&(0..16).flat_map(|r| m.row(r).to_vec()).collect::<Vec<_>>());
        assert_eq!(got, want, "{}: bytes differ from ggml's", format.name());
    }
}

/// Checks every element of `x` against its reconstruction `w` from `bytes`, within the bound the
/// format's algorithm gives (f64; `slack` covers the f32 rounding of the quantizer's and the
/// dequantizer's few operations):
/// - Q8_0: `q = round(x / d)`, `d = max|x| / 127`, stored as `d16`: `|x - w| <= d/2 + |d - d16|·|q|`.
/// - Q4_0 / Q5_0: `q = min(h - 1, floor(x/d + 1/2))` for `h` = 8 / 16: `|x - d·q| <= |d|·max(1/2,
///   x/d - (h - 1))` (at most `|d|`: only `x/d` in `(h - 1/2, h]` is clamped), plus `|d - d16|·|q|`.
/// - Q4_1 / Q5_1: `|x - w| <= d/2 + |min - m16| + |d - d16|·q`.
/// - k-quants: each element's level is the nearest one of its sub-block's stored grid
///   (`a·l + b`, l over the format's levels): `|x - w| <= min over l |x - (a·l + b)|`.
fn check_bounds(format: QuantFormat, x: &[f32], bytes: &[u8], what: &str) {
    let w = dequantize(format, bytes, x.len());
    let bb = format.block_bytes();
    let slack = |v: &[f64]| v.iter().map(|a| a.abs()).sum::<f64>() * 4.0 * f32::EPSILON as f64;
    let fail = |i: usize, bound: f64| {
        panic!(
            "{what} {}: element {i}: {} reconstructed as {} (error {:e} > bound {bound:e})",
            format.name(),
            x[i],
            w[i],
            (x[i] as f64 - w[i] as f64).abs()
        )
    };
    for (b, (xb, blk)) in x
        .chunks_exact(format.block_len())
        .zip(bytes.chunks_exact(bb))
        .enumerate()
    {
        let base = b * format.block_len();
        let wb = &w[base..base + xb.len()];
        match format {
            QuantFormat::Q8_0 => {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = (amax / 127.0) as f64;
                let dd = (d - f16_at(blk, 0) as f64).abs();
                for (e, (&x, &w)) in xb.iter().zip(wb).enumerate() {
                    let q = (blk[2 + e] as i8) as f64;
                    let bound = d / 2.0 + dd * q.abs() + slack(&[x as f64, w as f64]);
                    if (x as f64 - w as f64).abs() > bound {
                        fail(base + e, bound);
                    }
                }
            }
            QuantFormat::Q4_0 | QuantFormat::Q5_0 => {
                let h = if format == QuantFormat::Q4_0 {
                    8.0
                } else {
                    16.0
                };
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in xb {
                    if amax < v.abs() {
                        (amax, max) = (v.abs(), v);
                    }
                }
                let d = (max / -(h as f32)) as f64;
                let d16 = f16_at(blk, 0) as f64;
                for (e, (&x, &w)) in xb.iter().zip(wb).enumerate() {
                    let q = if d16 != 0.0 { w as f64 / d16 } else { 0.0 };
                    let t = if d != 0.0 { x as f64 / d } else { 0.0 };
                    let bound = d.abs() * f64::max(0.5, t - (h - 1.0))
                        + (d - d16).abs() * q.abs()
                        + slack(&[x as f64, w as f64]);
                    if (x as f64 - w as f64).abs() > bound {
                        fail(base + e, bound);
                    }
                }
            }
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                let nmax = if format == QuantFormat::Q4_1 {
                    15.0
                } else {
                    31.0
                };
                let min = xb.iter().fold(f32::MAX, |m, &v| m.min(v));
                let max = xb.iter().fold(-f32::MAX, |m, &v| m.max(v));
                let d = ((max - min) / nmax as f32) as f64;
                let (d16, m16) = (f16_at(blk, 0) as f64, f16_at(blk, 2) as f64);
                for (e, (&x, &w)) in xb.iter().zip(wb).enumerate() {
                    let q = if d16 != 0.0 {
                        ((w as f64 - m16) / d16).round()
                    } else {
                        0.0
                    };
                    let bound = d / 2.0
                        + (min as f64 - m16).abs()
                        + (d - d16).abs() * q
                        + slack(&[x as f64, w as f64, m16]);
                    if (x as f64 - w as f64).abs() > bound {
                        fail(base + e, bound);
                    }
                }
            }
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => {
                for (e, (&x, &w)) in xb.iter().zip(wb).enumerate() {
                    let (a, b, levels) = k_grid(format, blk, e);
                    let nearest = levels
                        .clone()
                        .map(|l| (x as f64 - (a * l as f64 + b)).abs())
                        .fold(f64::INFINITY, f64::min);
                    let bound = nearest + slack(&[x as f64, a * levels.end as f64, b]);
                    if (x as f64 - w as f64).abs() > bound {
                        fail(base + e, bound);
                    }
                }
            }
        }
    }
}

/// The stored grid of element `e` of a k-quant block, decoded independently of formats.rs from
/// ggml's layouts: `(a, b, levels)` with values `a·l + b`.
fn k_grid(format: QuantFormat, blk: &[u8], e: usize) -> (f64, f64, std::ops::Range<i32>) {
    if format == QuantFormat::Q6K {
        let (d, sc) = (f16_at(blk, 208), blk[192 + e / 16] as i8);
        let a = (d * sc as f32) as f64;
        return (a, 0.0, -32..32);
    }
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let q = &blk[4..16];
    let j = e / 32;
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    let nmax = if format == QuantFormat::Q4K { 15 } else { 31 };
    (
        (d * sc as f32) as f64,
        -((dmin * m as f32) as f64),
        0..nmax + 1,
    )
}

#[test]
fn round_trips_stay_within_each_formats_bound() {
    for format in QuantFormat::ALL {
        for seed in 0..4 {
            let x = varied(seed, 4096);
            check_bounds(format, &x, &quantize(format, &x), "varied");
        }
    }
}

/// RMS error relative to the RMS value on uniform [-1, 1) rows: the uniform-noise model `Δ/√12` of a
/// level spacing `Δ` (Q8_0: 1/127, Q4_0: 1/8, Q5_0: 1/16, Q4_1 and Q4_K: 2/15, Q5_1 and Q5_K: 2/31,
/// Q6_K: 1/32; the RMS of the values is 1/√3), with 25 % headroom for blocks that span less than
/// [-1, 1] and for the k-quants' 6-bit scales.
#[test]
fn uniform_rows_have_the_expected_rms_error() {
    let x = Rng::new(9).vec(64 * 1024);
    for format in QuantFormat::ALL {
        let delta: f64 = match format {
            QuantFormat::Q8_0 => 1.0 / 127.0,
            QuantFormat::Q4_0 => 1.0 / 8.0,
            QuantFormat::Q5_0 => 1.0 / 16.0,
            QuantFormat::Q4_1 | QuantFormat::Q4K => 2.0 / 15.0,
            QuantFormat::Q5_1 | QuantFormat::Q5K => 2.0 / 31.0,
            QuantFormat::Q6K => 1.0 / 32.0,
        };
        let w = dequantize(format, &quantize(format, &x), x.len());
        let rms = |v: &mut dyn Iterator<Item = f64>| {
            (v.map(|e| e * e).sum::<f64>() / x.len() as f64).sqrt()
        };
        let err = rms(&mut x.iter().zip(&w).map(|(&a, &b)| a as f64 - b as f64))
            / rms(&mut x.iter().map(|&a| a as f64));
        let model = delta / 12f64.sqrt() * 3f64.sqrt();
        assert!(
            err <= 1.25 * model,
            "{}: relative RMS error {err:.5} > 1.25 × {model:.5}",
            format.name()
        );
    }
}

/// Zero rows dequantize to zeros; their bytes are ggml's: all zero, except Q4_0 / Q5_0, whose scale is
/// `0 / -8 = -0.0` (f16 0x8000) with every value at the middle level (8 / 16).
#[test]
fn zero_rows_give_zero_blocks() {
    for format in QuantFormat::ALL {
        let k = 512;
        let bytes = quantize(format, &vec![0.0; k]);
        let block: Vec<u8> = match format {
            QuantFormat::Q4_0 => [&[0x00, 0x80][..], &[0x88; 16]].concat(),
            QuantFormat::Q5_0 => [&[0x00, 0x80][..], &[0xFF; 4], &[0x00; 16]].concat(),
            _ => vec![0; format.block_bytes()],
        };
        for (b, got) in bytes.chunks_exact(format.block_bytes()).enumerate() {
            assert_eq!(got, &block[..], "{} block {b}", format.name());
        }
        let w = dequantize(format, &bytes, k);
        assert!(w.iter().all(|&v| v == 0.0), "{}", format.name());
    }
}

/// A constant row comes back within the f16 rounding of the one stored value that carries it
/// (2^-11 relative, plus f32 rounding), for constants whose scales are normal f16 values: Q8_0 stores
/// `c/127` (q = ±127), Q4_0 / Q5_0 `c/-8` (`c/-16`), Q4_1 / Q5_1 the minimum `c` (d = 0), Q6_K
/// `c/4096` (scales -128, level -32), Q4_K / Q5_K `(c/nmax)/63` (c > 0: top level, scales 63) or
/// `-c/63` as the minimum (c < 0: d = 0, minimums 63).
#[test]
fn constant_rows_come_back_within_f16_rounding() {
    for format in QuantFormat::ALL {
        for c in [0.37f32, -1.5, 3.0, -100.0, 1000.0] {
            let x = vec![c; 512];
            let bytes = quantize(format, &x);
            check_bounds(format, &x, &bytes, "constant");
            let w = dequantize(format, &bytes, x.len());
            for &v in &w {
                let rel = ((v as f64 - c as f64) / c as f64).abs();
                assert!(
                    rel <= 2f64.powi(-11) + 1e-6,
                    "{} constant {c}: {v} (relative error {rel:e})",
                    format.name()
                );
            }
        }
    }
}

/// One huge value among small ones: every element within its bound, and only the block (super-block)
/// holding it changes: every other block's bytes are those of the row without it.
#[test]
fn an_outlier_changes_only_its_own_block() {
    let k = 1024;
    for format in QuantFormat::ALL {
        let clean: Vec<f32> = Rng::new(21).vec(k).iter().map(|v| v * 0.01).collect();
        let clean_bytes = quantize(format, &clean);
        for (at, huge) in [(0usize, 3000f32), (517, -3000.0), (1023, 1e4)] {
            let mut x = clean.clone();
            x[at] = huge;
            let bytes = quantize(format, &x);
            check_bounds(format, &x, &bytes, "outlier");
            let bb = format.block_bytes();
            let own = at / format.block_len();
            for (b, (got, want)) in bytes
                .chunks_exact(bb)
                .zip(clean_bytes.chunks_exact(bb))
                .enumerate()
            {
                if b != own {
                    assert_eq!(got, want, "{} outlier at {at}: block {b}", format.name());
                }
            }
            let w = dequantize(format, &bytes, k);
            let rel = ((w[at] - huge) / huge).abs();
            // The outlier sets its block's scale: it lands on (or next to) the top level.
            let top = match format {
                QuantFormat::Q8_0 => 1.0 / 127.0,
                QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q4K => 1.0 / 15.0,
                _ => 1.0 / 31.0,
            };
            assert!(
                rel <= top,
                "{} outlier {huge}: {} (relative error {rel})",
                format.name(),
                w[at]
            );
        }
    }
}

/// Re-quantizing a dequantized row gives the same blocks back for the formats that guarantee it:
/// - Q8_0: the largest magnitude comes back as `127·d16` (exact in f32), so `d = d16` and
///   `round(d16·q · fl(1/d16)) = q`.
/// - Q4_0 / Q5_0: the first largest magnitude comes back as `-8·d16` (`-16·d16`), so `d = d16`, and
///   `trunc(k·(1 ± 2^-23) + 8.5) = k + 8`.
/// - Q4_1 / Q5_1: the minimum comes back as `m16` (level 0) and the maximum as `15·d16 + m16` (level
///   15 / 31), exactly when `d16·q + m16` is exact in f32 (here: |m16| within 2^12 of d16), so `d = d16`
///   and the levels follow as for Q8_0.
///
/// All provided `d16 != 0` (blocks whose scale does not round to zero in f16). The k-quants promise
/// nothing of the kind: the search may settle on another grid (e.g. a sub-block using levels 2..=13
/// only is refit to span 0..=15), so they are not checked (on 400 uniform random super-blocks, 400
/// Q4_K, 376 Q5_K and 172 Q6_K ones came back the same).
#[test]
fn requantizing_dequantized_rows_gives_the_same_blocks() {
    let formats = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q5_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_1,
    ];
    for format in formats {
        for (seed, scale) in [(1u64, 0.01f32), (2, 1.0), (3, 100.0), (4, 3.0)] {
            let mut x: Vec<f32> = Rng::new(seed).vec(2048).iter().map(|v| v * scale).collect();
            if seed == 4 {
                for v in &mut x[..256] {
                    *v += 5.0; // all-positive blocks
                }
                x[256..288].fill(0.0); // a zero block
                x[288..320].fill(-2.5); // a constant block
            }
            let bytes = quantize(format, &x);
            let again = quantize(format, &dequantize(format, &bytes, x.len()));
            let bb = format.block_bytes();
            for (b, (got, want)) in again
                .chunks_exact(bb)
                .zip(bytes.chunks_exact(bb))
                .enumerate()
            {
                assert_eq!(got, want, "{} scale {scale}: block {b}", format.name());
            }
        }
    }
}

#[test]
fn quantize_matrix_is_quantize_row_per_row() {
    let (rows, cols) = (13, 512);
    let x = varied(5, rows * cols);
    for format in QuantFormat::ALL {
        let m = quantize_matrix(format, &x, rows, cols);
        assert_eq!((m.rows(), m.cols(), m.format()), (rows, cols, format));
        for r in 0..rows {
            let want = quantize(format, &x[r * cols..(r + 1) * cols]);
            assert_eq!(m.row(r), &want[..], "{} row {r}", format.name());
        }
    }
}

#[test]
#[should_panic(expected = "not a multiple")]
fn a_row_that_is_not_whole_blocks_panics() {
    quantize_row(QuantFormat::Q4K, &[0.0; 384], &mut [0u8; 216]);
}

/// The ftypes llama-quantize is run with (`--pure`: each names the type of every tensor whose rows
/// divide into its blocks; the k-quants fall back to Q5_0 / Q5_1 / Q8_0 for the testbed's 384-wide
/// rows, which this compares too).
const LLAMA_QUANTIZE_TYPES: [(&str, QuantFormat); 8] = [
    ("Q8_0", QuantFormat::Q8_0),
    ("Q4_0", QuantFormat::Q4_0),
    ("Q4_1", QuantFormat::Q4_1),
    ("Q5_0", QuantFormat::Q5_0),
    ("Q5_1", QuantFormat::Q5_1),
    ("Q4_K", QuantFormat::Q4K),
    ("Q5_K", QuantFormat::Q5K),
    ("Q6_K", QuantFormat::Q6K),
];

/// For every tensor `quantized` stores in one of our formats: quantizes the same tensor of the f32 GGUF
/// `source` (its raw f32 rows, in the GGUF's own stored layout: rows of `extents[0]` values) and asserts
/// the bytes are llama-quantize's. Returns the number of tensors compared per format.
fn assert_quantized_as_llama_quantize_does(
    source: &std::path::Path,
    quantized: &std::path::Path,
) -> std::collections::BTreeMap<&'static str, usize> {
    use model_io::gguf::GgufSet;
    let (src, q) = (
        GgufSet::open(source).unwrap(),
        GgufSet::open(quantized).unwrap(),
    );
    let mut compared = std::collections::BTreeMap::new();
    for (qfile, qinfo) in q.tensors() {
        let Some(format) = QuantFormat::from_name(qinfo.ggml_type.name()) else {
            continue;
        };
        let (sfile, sinfo) = src.tensor(&qinfo.name).unwrap();
        assert_eq!(sinfo.ggml_type.name(), "F32", "{}", sinfo.name);
        assert_eq!(sinfo.extents, qinfo.extents, "{}", sinfo.name);
        let x: Vec<f32> = sfile
            .bytes(sinfo)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let cols = sinfo.extents[0];
        let rows = x.len() / cols;
        let want = qfile.bytes(qinfo).unwrap();
        let rb = format.row_bytes(cols);
        assert_eq!(want.len(), rows * rb, "{}", qinfo.name);
        let ours = quantize_matrix(format, &x, rows, cols);
        for r in 0..rows {
            let (got, want) = (ours.row(r), &want[r * rb..(r + 1) * rb]);
            if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
                let block = at / format.block_bytes();
                panic!(
                    "{}: tensor {} ({}) row {r} block {block}: bytes differ from llama-quantize's \
                     (ours {:02x?}, llama-quantize's {:02x?})",
                    quantized.display(),
                    qinfo.name,
                    format.name(),
                    &got[block * format.block_bytes()..(block + 1) * format.block_bytes()],
                    &want[block * format.block_bytes()..(block + 1) * format.block_bytes()],
                );
            }
        }
        *compared.entry(format.name()).or_default() += 1;
    }
    compared
}

fn testbed_f32_gguf() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    testdata::gguf_tools::converted(&dir, "testbed-f32.gguf", &["--outtype", "f32"])
}

/// Runs `llama-quantize --pure` on `source` for every type and compares (above); `tag` names the outputs
/// in the test cache. Every type must show up in the file made for it.
fn compare_every_type(source: &std::path::Path, tag: &str) {
    for (ftype, format) in LLAMA_QUANTIZE_TYPES {
        let name = format!("{tag}-pure-{ftype}.gguf");
        let path = testdata::gguf_tools::quantized_with(source, &name, &["--pure"], ftype);
        let compared = assert_quantized_as_llama_quantize_does(source, &path);
        eprintln!("{name}: identical tensors per type {compared:?}");
        assert!(
            compared.get(format.name()).is_some_and(|&n| n > 0),
            "{name}: no {} tensor ({compared:?})",
            format.name()
        );
    }
}

/// The testbed converted to f32 and quantized by llama-quantize `--pure` to each type: every tensor it
/// stores in one of our formats has our bytes (k-quants: the 1024-wide ffn_down rows; the 384-wide
/// rows fall back to Q5_0 / Q5_1 / Q8_0).
#[test]
#[ignore = "needs llama.cpp's converter and llama-quantize: set TURBOSPARK_LLAMA_CPP, TURBOSPARK_GGUF_PYTHON, TURBOSPARK_LLAMA_QUANTIZE (tools/fixtures/README.md)"]
fn testbed_quantizes_to_llama_quantizes_bytes() {
    compare_every_type(&testbed_f32_gguf(), "testbed");
}

/// The same with the testbed's ffn_down weights of every layer (1024-wide rows, so every type, the
/// k-quants included, quantizes them) replaced by `varied` rows: zero, constant, outlier, tie-prone,
/// one-signed and tiny blocks through llama-quantize itself.
#[test]
#[ignore = "needs llama.cpp's converter and llama-quantize: set TURBOSPARK_LLAMA_CPP, TURBOSPARK_GGUF_PYTHON, TURBOSPARK_LLAMA_QUANTIZE (tools/fixtures/README.md)"]
fn varied_rows_quantize_to_llama_quantizes_bytes() {
    let f32_path = testbed_f32_gguf();
    let set = model_io::gguf::GgufSet::open(&f32_path).unwrap();
    let mut image = std::fs::read(&f32_path).unwrap();
    let mut replaced = 0;
    for (seed, (_, info)) in set.tensors().enumerate() {
        if info.name.ends_with("ffn_down.weight") {
            assert_eq!(info.ggml_type.name(), "F32", "{}", info.name);
            let x = varied(seed as u64, info.numel());
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            image[info.begin..info.end].copy_from_slice(&bytes);
            replaced += 1;
        }
    }
    assert!(replaced > 0, "no ffn_down tensor in {}", f32_path.display());
    let dir = f32_path.parent().unwrap();
    let source = dir.join("testbed-varied-f32.gguf");
    std::fs::write(&source, &image).unwrap();
    for (ftype, _) in LLAMA_QUANTIZE_TYPES {
        // Made afresh: the cache would keep outputs of an earlier `varied`.
        let _ = std::fs::remove_file(dir.join(format!("testbed-varied-pure-{ftype}.gguf")));
    }
    compare_every_type(&source, "testbed-varied");
}
