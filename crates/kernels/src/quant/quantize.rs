//! Quantizing f32 rows into ggml's blocks: a port of ggml's reference quantizers
//! (`quantize_row_<type>_ref` in ggml/src/ggml-quants.c, llama.cpp 0c1e570).
//!
//! Invariant: [`quantize_row`] writes the bytes ggml's reference quantizer writes for the same row,
//! which are the bytes `llama-quantize` writes without an importance matrix (it calls
//! `ggml_quantize_chunk` -> `quantize_<type>` -> `quantize_row_<type>_ref` when there are no quant
//! weights; `quantize_q8_0` ignores them altogether). Blocks are independent, so rows and chunks of rows
//! quantize alike.
//!
//! How: every float operation is the C's, in the C's order, on f32. Rust never fuses `a * b + c` into an
//! FMA, and neither does ggml's reference as llama.cpp builds it on x86-64: ggml-quants.c is part of
//! ggml-base, compiled for the baseline ISA (no `-march`, even with GGML_NATIVE, which only reaches
//! ggml-cpu), so gcc has no FMA to contract into. A build whose compiler may contract (gcc's default
//! `-ffp-contract=fast`, clang's `on`, with FMA in the target ISA, as on aarch64) can write other bytes
//! where the k-quants' sums and error terms round differently. The conversions are the C's: float to
//! `int8_t` / `uint8_t` truncates toward zero (`c_int8`: also the out-of-range wrap of x86-64), `roundf`
//! is [`f32::round`] (half away from zero), `nearest_int` is ggml's float trick (round half to even by
//! adding 1.5 · 2^23 and reading the mantissa bits; exact for |v| < 2^22), and `GGML_FP32_TO_FP16` is
//! ported as ggml writes it (`fp16_from_f32`: round to nearest even, as `half::f16::from_f32`, checked
//! on every f32, but NaN to 0x7E00 with the sign). Comparisons are the C's too (`if (v < min)`, which
//! a NaN never passes), so inputs with NaN or infinities give ggml's bytes as well; llama-quantize
//! rejects rows whose scales come out non-finite. Checked against ggml's own code: tests/quantize.rs
//! (checksums of its output on varied blocks, and llama-quantize's files where llama.cpp is installed).
//!
//! Algorithms (`fp16` rounds to ggml's f16; `1/d` is 0 where d is 0):
//! - Q8_0 (32): `d = max|x| / 127`, `q = roundf(x · (1/d))`; stores `fp16(d)`.
//! - Q4_0 / Q5_0 (32): `d = m / -8` (`/ -16`) with `m` the first element of largest magnitude;
//!   `q = min(15, trunc(x · (1/d) + 8.5))` (`min(31, … + 16.5)`), so `m` itself maps to `q = 0`.
//! - Q4_1 / Q5_1 (32): `d = (max - min) / 15` (`/ 31`), `q = trunc((x - min) · (1/d) + 0.5)` (capped at
//!   15 for Q4_1); stores `fp16(d)` and `fp16(min)`.
//! - Q4_K / Q5_K (256 = 8 sub-blocks of 32): each sub-block gets a scale and a minimum from
//!   `make_qkx2_quants`: the grid `scale · l + min`, `l ∈ 0..=nmax` (15 / 31), weights
//!   `w = sqrt(mean(x²)) + |x|`; first `min = min(min x, 0)` and `scale = range / nmax`, then for each of
//!   21 (16) candidate inverse scales `(nmax + rmin + 0.1 i) / range` (rmin = -1 / -0.5) the levels it
//!   gives and the weighted least-squares `scale` and `min` for them (`min` again clamped to 0), keeping
//!   the candidate of least weighted squared error. The 8 scales and the 8 `-min` are quantized to 6 bits
//!   against their maxima (`d = fp16(max_scale / 63)`, `dmin = fp16(max_min / 63)`), and each element is
//!   requantized to the nearest level of its stored grid: `l = clamp(nearest_int((x + dmin · m) / (d ·
//!   sc)), 0, nmax)` (a sub-block whose `d · sc` is 0 keeps the search's levels).
//! - Q6_K (256 = 16 sub-blocks of 16): each sub-block gets a signed scale from `make_qx_quants` (levels
//!   `-32..=31`; of the inverse scales `-(32 + 0.1 i) / m`, i in -9..=9 and `m` the first element of
//!   largest magnitude, the one that maximizes `(Σ w·x·l)² / Σ w·l²` with `w = x²`); the 16 scales are
//!   quantized to signed 8 bits (`min(127, nearest_int(iscale · scale))`) with `iscale = -128 / s`, `s`
//!   the first scale of largest magnitude, `d = fp16(1 / iscale)`, and each element is requantized to
//!   `l = clamp(nearest_int(x / (d · sc)), -32, 31)` (a sub-block whose `d · sc` is 0 keeps the search's
//!   levels; a block whose scales are all below 1e-15 is all zero bytes).

use half::f16;
use rayon::prelude::*;

use super::formats::scales_mins_k4;
use super::{QuantFormat, QuantMatrix};

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Quantizes `x` (a multiple of `format`'s block length) into `out` (`format.row_bytes(x.len())`
/// bytes): ggml's reference quantizer's bytes (module doc).
///
/// Panics (programmer error) if the lengths do not fit.
pub fn quantize_row(format: QuantFormat, x: &[f32], out: &mut [u8]) {
    let (bl, bb) = (format.block_len(), format.block_bytes());
    assert!(
        x.len().is_multiple_of(bl),
        "quantize_row: {} values are not a multiple of {}'s {bl}-element blocks",
        x.len(),
        format.name()
    );
    assert_eq!(
        out.len(),
        format.row_bytes(x.len()),
        "quantize_row: {} bytes for {} {} values",
        out.len(),
        x.len(),
        format.name()
    );
    let block: fn(&[f32], &mut [u8]) = match format {
        QuantFormat::Q4_0 => q4_0,
        QuantFormat::Q4_1 => q4_1,
        QuantFormat::Q5_0 => q5_0,
        QuantFormat::Q5_1 => q5_1,
        QuantFormat::Q8_0 => q8_0,
        QuantFormat::Q4K => q4_k,
        QuantFormat::Q5K => q5_k,
        QuantFormat::Q6K => q6_k,
    };
    for (xb, ob) in x.chunks_exact(bl).zip(out.chunks_exact_mut(bb)) {
        block(xb, ob);
    }
}

/// Quantizes the matrix `x` [rows, cols] row by row ([`quantize_row`], in parallel over rows).
///
/// Panics (programmer error) if `x` is not [rows, cols] or `cols` is not a positive multiple of the
/// format's block length.
pub fn quantize_matrix(format: QuantFormat, x: &[f32], rows: usize, cols: usize) -> QuantMatrix {
    assert_eq!(
        Some(x.len()),
        rows.checked_mul(cols),
        "quantize_matrix: {} values for [{rows}, {cols}]",
        x.len()
    );
    assert!(
        cols > 0 && cols.is_multiple_of(format.block_len()),
        "quantize_matrix: rows of {cols} values do not divide into {}'s {}-element blocks",
        format.name(),
        format.block_len()
    );
    let rb = format.row_bytes(cols);
    let mut data = vec![0u8; rows * rb];
    data.par_chunks_mut(rb)
        .zip(x.par_chunks(cols))
        .for_each(|(out, row)| quantize_row(format, row, out));
    QuantMatrix::new(format, data, rows, cols).expect("quantize_matrix: the shape was checked")
}

/// ggml's `GGML_FP32_TO_FP16` (`ggml_compute_fp32_to_fp16`, from the FP16 library): round to nearest
/// even, overflow to infinity, NaN to 0x7E00 with the sign.
pub(crate) fn fp16_from_f32(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x7C00;
    let mantissa_bits = bits & 0x0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// Writes `fp16(v)` at `blk[at..at + 2]` (little-endian, as ggml's blocks are stored).
fn put_f16(blk: &mut [u8], at: usize, v: f32) {
    blk[at..at + 2].copy_from_slice(&fp16_from_f32(v).to_le_bytes());
}

/// The f32 value of the f16 at `blk[at..at + 2]` (exact).
fn get_f16(blk: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32()
}

/// ggml's `nearest_int`: `v` rounded half to even, by adding 1.5 · 2^23 and reading the low mantissa
/// bits (exact for |v| < 2^22; outside that, the same wrapped value as the C).
#[inline]
fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    (val.to_bits() as i32 & 0x007F_FFFF) - 0x0040_0000
}

/// C's float-to-`int8_t` conversion as llama.cpp's x86-64 build does it (`cvttss2si` to 32 bits, then
/// the low byte): `v as i8` where the value fits; out of range (C leaves it undefined) the wrapped
/// low byte, which Q8_0 reaches when a NaN resets its `MAX` chain and a larger value precedes it.
#[inline]
fn c_int8(v: f32) -> i8 {
    v as i32 as i8
}

/// The first element of largest magnitude (ggml's `if (amax < fabsf(v))` scan): (its magnitude, it).
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// The minimum and maximum as ggml scans them (`if (v < min) …; if (v > max) …`).
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `1 / d`, or 0 where `d` is 0 (ggml's `d ? 1.0f/d : 0.0f`).
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs 32 values of up to 5 bits into nibbles `qs[16]` (element j low, j + 16 high) and, for 5-bit
/// values, their fifth bits into `qh` (bit j of the little-endian u32).
fn pack_32(q: &[u8; 32], qs: &mut [u8], qh: Option<&mut [u8]>) {
    let mut bits = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q[j], q[j + 16]);
        qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        bits |= (u32::from(q0 & 0x10) >> 4) << j;
        bits |= (u32::from(q1 & 0x10) >> 4) << (j + 16);
    }
    if let Some(qh) = qh {
        qh.copy_from_slice(&bits.to_le_bytes());
    }
}

/// `quantize_row_q8_0_ref`: 32 values into d (f16) and 32 signed bytes.
fn q8_0(x: &[f32], blk: &mut [u8]) {
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a }; // MAX(amax, fabsf(v))
    }
    let d = amax / 127.0;
    let id = inverse(d);
    put_f16(blk, 0, d);
    for (q, &v) in blk[2..34].iter_mut().zip(x) {
        *q = c_int8((v * id).round()) as u8;
    }
}

/// `quantize_row_q4_0_ref` / `q5_0_ref`: symmetric levels `-half..half`, the largest magnitude at `-half`.
fn qx_0(x: &[f32], blk: &mut [u8], half: f32, qmax: i8) -> [u8; 32] {
    let (_, max) = signed_absmax(x);
    let d = max / -half;
    let id = inverse(d);
    put_f16(blk, 0, d);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = c_int8(v * id + (half + 0.5)).min(qmax) as u8;
    }
    q
}

fn q4_0(x: &[f32], blk: &mut [u8]) {
    let q = qx_0(x, blk, 8.0, 15);
    pack_32(&q, &mut blk[2..18], None);
}

fn q5_0(x: &[f32], blk: &mut [u8]) {
    let q = qx_0(x, blk, 16.0, 31);
    let (qh, qs) = blk[2..22].split_at_mut(4);
    pack_32(&q, qs, Some(qh));
}

/// `quantize_row_q4_1_ref` / `q5_1_ref`: levels `0..=nmax` from the minimum up.
fn qx_1(x: &[f32], blk: &mut [u8], nmax: u8) -> [u8; 32] {
    let (min, max) = min_max(x);
    let d = (max - min) / f32::from(nmax);
    let id = inverse(d);
    put_f16(blk, 0, d);
    put_f16(blk, 2, min);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        let t = (v - min) * id + 0.5;
        // Q4_1 caps at 15 (`MIN(15, (int8_t)…)`); Q5_1 converts straight to uint8_t.
        *q = if nmax == 15 {
            c_int8(t).min(15) as u8
        } else {
            c_int8(t) as u8
        };
    }
    q
}

fn q4_1(x: &[f32], blk: &mut [u8]) {
    let q = qx_1(x, blk, 15);
    pack_32(&q, &mut blk[4..20], None);
}

fn q5_1(x: &[f32], blk: &mut [u8]) {
    let q = qx_1(x, blk, 31);
    let (qh, qs) = blk[4..24].split_at_mut(4);
    pack_32(&q, qs, Some(qh));
}

/// The search of `make_qkx2_quants` (its callers here pass `use_mad = false`).
struct Qkx2 {
    nmax: u8,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
}

/// Q4_K's: `make_qkx2_quants(32, 15, …, -1.f, 0.1f, 20, false)`.
const Q4K_SEARCH: Qkx2 = Qkx2 {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
};

/// Q5_K's: `make_qkx2_quants(32, 31, …, -0.5f, 0.1f, 15, false)`.
const Q5K_SEARCH: Qkx2 = Qkx2 {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
};

/// `make_qkx2_quants` on one sub-block: fills the levels `l` and returns `(scale, the_min)` of the grid
/// `scale · l - the_min` of least weighted squared error found (module doc).
fn make_qkx2_quants(s: &Qkx2, x: &[f32], weights: &[f32], l: &mut [u8]) -> (f32, f32) {
    let nmax = s.nmax as i32;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let level =
        |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let iscale = s.nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for ((l, &v), &w) in l.iter_mut().zip(x).zip(weights) {
        *l = level(iscale, min, v);
        let diff = scale * f32::from(*l) + min - v;
        best_error += w * (diff * diff);
    }
    if s.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..x.len()];
    for is in 0..=s.nstep {
        let iscale = (s.rmin + s.rdelta * is as f32 + s.nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((la, &v), &w) in laux.iter_mut().zip(x).zip(weights) {
            *la = level(iscale, min, v);
            let lf = f32::from(*la);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for ((&la, &v), &w) in laux.iter().zip(x).zip(weights) {
                let diff = this_scale * f32::from(la) + this_min - v;
                cur_error += w * (diff * diff);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `quantize_row_q4_K_ref` / `q5_K_ref`: fills `blk`'s d, dmin and 12 packed scale bytes, and returns
/// the 256 levels (0..=nmax).
fn qk_k_scales(s: &Qkx2, x: &[f32], blk: &mut [u8]) -> [u8; 256] {
    let mut levels = [0u8; 256];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, (xs, ls)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(s, xs, &weights, ls);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut blk[4..16];
    for j in 0..8 {
        // `uint8_t ls = nearest_int(…)` keeps the low byte, then MIN(63, ls).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(blk, 0, max_scale / 63.0);
    put_f16(blk, 2, max_min / 63.0);
    let (d_all, dmin_all) = (get_f16(blk, 0), get_f16(blk, 2));
    for (j, (xs, ls)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let packed: &[u8; 12] = blk[4..16].try_into().expect("12 packed scale bytes");
        let scales_mins = scales_mins_k4(packed);
        let (sc, m) = (scales_mins[j], scales_mins[8 + j]);
        let d = d_all * f32::from(sc);
        if d == 0.0 {
            continue; // keeps make_qkx2_quants' levels, as ggml does
        }
        let dm = dmin_all * f32::from(m);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / d).clamp(0, s.nmax as i32) as u8;
        }
    }
    levels
}

fn q4_k(x: &[f32], blk: &mut [u8]) {
    let levels = qk_k_scales(&Q4K_SEARCH, x, blk);
    let qs = &mut blk[16..144];
    for (q, l) in qs.chunks_exact_mut(32).zip(levels.chunks_exact(64)) {
        for (k, q) in q.iter_mut().enumerate() {
            *q = l[k] | (l[k + 32] << 4);
        }
    }
}

fn q5_k(x: &[f32], blk: &mut [u8]) {
    let levels = qk_k_scales(&Q5K_SEARCH, x, blk);
    let (qh, qs) = blk[16..176].split_at_mut(32);
    qh.fill(0);
    for (n, (q, l)) in qs
        .chunks_exact_mut(32)
        .zip(levels.chunks_exact(64))
        .enumerate()
    {
        let (m1, m2) = (1u8 << (2 * n), 2u8 << (2 * n));
        for (k, q) in q.iter_mut().enumerate() {
            let (mut l1, mut l2) = (l[k], l[k + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[k] |= m1;
            }
            if l2 > 15 {
                l2 -= 16;
                qh[k] |= m2;
            }
            *q = l1 | (l2 << 4);
        }
    }
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, NULL)`: the levels `l + nmax` (l in -nmax..nmax) and
/// the scale of the best of 19 candidate grids by `(Σ w·x·l)² / Σ w·l²`, `w = x²` (module doc).
fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Σ w·x·l and Σ w·l² at `iscale` (w = x²).
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let lf = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        (sumlx, suml2)
    };
    let set_levels = |iscale: f32, levels: &mut [u8]| {
        for (q, &v) in levels.iter_mut().zip(x) {
            *q = (level(iscale, v) + nmax) as u8;
        }
    };
    let iscale = -nmaxf / max;
    set_levels(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmaxf + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set_levels(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref`: 256 values into ql[128], qh[64], 16 signed scales and d (f16).
fn q6_k(x: &[f32], blk: &mut [u8]) {
    let mut levels = [0u8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ((xs, ls), scale) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .zip(&mut scales)
    {
        *scale = make_qx_quants(32, xs, ls);
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = *scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        blk.fill(0); // and d = fp16(0) = 0
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(blk, 208, 1.0 / iscale);
    for (sc, &scale) in blk[192..208].iter_mut().zip(&scales) {
        *sc = nearest_int(iscale * scale).min(127) as i8 as u8;
    }
    let d_all = get_f16(blk, 208);
    for (j, (xs, ls)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        let d = d_all * f32::from(blk[192 + j] as i8);
        if d == 0.0 {
            continue; // keeps make_qx_quants' levels, as ggml does
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let (ql, rest) = blk.split_at_mut(128);
    let qh = &mut rest[..64];
    for ((ql, qh), l) in ql
        .chunks_exact_mut(64)
        .zip(qh.chunks_exact_mut(32))
        .zip(levels.chunks_exact(128))
    {
        for k in 0..32 {
            let (l1, l2, l3, l4) = (l[k], l[k + 32], l[k + 64], l[k + 96]);
            ql[k] = (l1 & 0xF) | ((l3 & 0xF) << 4);
            ql[k + 32] = (l2 & 0xF) | ((l4 & 0xF) << 4);
            qh[k] = (l1 >> 4) | ((l2 >> 4) << 2) | ((l3 >> 4) << 4) | ((l4 >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fp16_from_f32;
    use half::f16;

    /// ggml's f16 conversion against `half`'s (both round to nearest even): the same bits, but for NaN
    /// (ggml: 0x7E00 with the sign; half keeps payload bits).
    fn check(bits: u32) {
        let f = f32::from_bits(bits);
        let ours = fp16_from_f32(f);
        if f.is_nan() {
            assert_eq!(ours, 0x7E00 | ((bits >> 16) as u16 & 0x8000), "{bits:#x}");
        } else {
            assert_eq!(ours, f16::from_f32(f).to_bits(), "{bits:#x} ({f:e})");
        }
    }

    /// Every f16 value, the f32s next to it and next to the midpoints between it and its neighbour
    /// (where rounding ties are decided), and a strided sample of all bit patterns.
    #[test]
    fn fp16_rounding_is_halfs_round_to_nearest_even() {
        for h in 0..=u16::MAX {
            let v = f16::from_bits(h).to_f32();
            if v.is_nan() {
                continue;
            }
            let next = f16::from_bits(h.wrapping_add(1)).to_f32();
            let mid = ((v as f64 + next as f64) / 2.0) as f32;
            for base in [v.to_bits(), mid.to_bits()] {
                for b in base.saturating_sub(2)..=base.saturating_add(2) {
                    check(b);
                }
            }
        }
        for b in (0..=u32::MAX).step_by(65_521) {
            check(b);
        }
    }

    #[test]
    #[ignore = "exhaustive: all 2^32 f32 bit patterns (about a minute in release)"]
    fn fp16_rounding_is_halfs_on_every_f32() {
        for b in 0..=u32::MAX {
            check(b);
        }
    }
}
