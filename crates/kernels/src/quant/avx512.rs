//! The AVX-512 VNNI quantized dot products: the portable path's sequence of operations (quant/mod.rs),
//! 16 lanes at a time. `vpdpbusd` multiplies unsigned by signed bytes, so the weights are decoded into
//! signed integers `u - o` and the inputs taken as `q + 128` (a sign-bit flip), the excess removed by
//! starting each sum at `-128 · Σ (u - o)` (computed once per weight step): the integer is the portable
//! path's `Σ q · (u - o)` exactly. Micro-tiles of R weight rows x G inputs keep R·G accumulators in
//! registers: each decoded weight step serves G inputs, each loaded input step R rows.
//!
//! Invariant: each operation is the IEEE operation the portable path performs on the same lane (the
//! integer sum is exact; cvt, mul, fma and the reduction tree round the same), so both give the same bits.

use std::arch::x86_64::*;

use super::formats::{scale_min_k4, QuantFormat, LANES, STEP};
use super::{QuantMatrix, QuantizedRows, ROUND};

/// The f16 at `bytes[at..at + 2]` as f32 (F16C: exact, as the portable conversion).
#[inline(always)]
unsafe fn f16_at(bytes: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// AVX-512 F/BW/VL for the vectors and masks, VNNI for `vpdpbusd`, F16C for the block scales.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// [`super::quantize_block`] with the same IEEE operations (max is exact in any order).
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `xb` and `q` hold 32 values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn quantize_block(xb: &[f32], q: &mut [i8]) -> f32 {
    assert!(xb.len() == 32 && q.len() == 32, "quantize_block: 32 values");
    let (a, b) = (
        _mm512_loadu_ps(xb.as_ptr()),
        _mm512_loadu_ps(xb.as_ptr().add(16)),
    );
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    let d = amax / 127.0;
    let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let round = _mm512_set1_ps(ROUND);
    for (half, v) in [a, b].into_iter().enumerate() {
        let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, id), round), round);
        let bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
        _mm_storeu_si128(q.as_mut_ptr().add(16 * half) as *mut __m128i, bytes);
    }
    d
}

/// One decoded step: unsigned weights, lane scales, lane minimum terms.
type Decoded = (__m512i, __m512, __m512);

/// Decodes step `s` of a row (the formats.rs layouts, vectorized).
trait Decode {
    const HAS_MIN: bool;
    /// # Safety
    /// `row` holds the whole row of `k` elements; AVX-512 F/BW/VL are available.
    unsafe fn decode(row: &[u8], k: usize, s: usize) -> Decoded;
}

#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Lanes 0..8 = x, 8..16 = y.
#[inline(always)]
unsafe fn halves(x: f32, y: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(x), _mm512_set1_ps(y))
}

/// 16 packed nibbles -> 32 bytes [low nibbles, high nibbles].
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(x), m),
        _mm_and_si128(x, m),
    )
}

/// 32 packed nibbles -> 64 bytes [low nibbles, high nibbles].
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> (__m256i, __m256i) {
    let x = _mm256_loadu_si256(p as *const __m256i);
    let m = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(x, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(x), m),
    )
}

/// A 32-element-block format: `block(ptr) -> (u[32], a, b)`.
trait Block32 {
    const BYTES: usize;
    const HAS_MIN: bool;
    unsafe fn block(p: *const u8, blk: &[u8]) -> (__m256i, f32, f32);
}

impl<T: Block32> Decode for T {
    const HAS_MIN: bool = T::HAS_MIN;
    #[inline(always)]
    unsafe fn decode(row: &[u8], k: usize, s: usize) -> Decoded {
        let first = 2 * s;
        let p = row.as_ptr().add(first * T::BYTES);
        let (u0, a0, b0) = T::block(p, &row[first * T::BYTES..]);
        let (u1, a1, b1) = if first + 1 < k / 32 {
            T::block(p.add(T::BYTES), &row[(first + 1) * T::BYTES..])
        } else {
            (_mm256_setzero_si256(), 0.0, 0.0)
        };
        (join(u0, u1), halves(a0, a1), halves(b0, b1))
    }
}

struct Q8_0;
impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn block(p: *const u8, blk: &[u8]) -> (__m256i, f32, f32) {
        (
            _mm256_loadu_si256(p.add(2) as *const __m256i),
            f16_at(blk, 0),
            0.0,
        )
    }
}

struct Q4_0;
impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn block(p: *const u8, blk: &[u8]) -> (__m256i, f32, f32) {
        let u = nibbles16(p.add(2));
        (_mm256_sub_epi8(u, _mm256_set1_epi8(8)), f16_at(blk, 0), 0.0)
    }
}

struct Q4_1;
impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn block(p: *const u8, blk: &[u8]) -> (__m256i, f32, f32) {
        (nibbles16(p.add(4)), f16_at(blk, 0), f16_at(blk, 2))
    }
}

/// Q5_0 / Q5_1: nibbles with the fifth bit of element j at bit j of the u32 `qh`.
#[inline(always)]
unsafe fn five_bits(p_qh: *const u8) -> __m256i {
    let qh = (p_qh as *const u32).read_unaligned();
    let v = nibbles16(p_qh.add(4));
    _mm256_or_si256(v, _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)))
}

struct Q5_0;
impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn block(p: *const u8, blk: &[u8]) -> (__m256i, f32, f32) {
        let u = five_bits(p.add(2));
        (
            _mm256_sub_epi8(u, _mm256_set1_epi8(16)),
            f16_at(blk, 0),
            0.0,
        )
    }
}

struct Q5_1;
impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn block(p: *const u8, blk: &[u8]) -> (__m256i, f32, f32) {
        (five_bits(p.add(4)), f16_at(blk, 0), f16_at(blk, 2))
    }
}

/// Q4_K / Q5_K step `c` of a super-block: a, b of sub-blocks 2c and 2c+1.
#[inline(always)]
unsafe fn k4_scales(blk: &[u8], c: usize) -> (__m512, __m512) {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let scales = &blk[4..16];
    let (s0, m0) = scale_min_k4(2 * c, scales);
    let (s1, m1) = scale_min_k4(2 * c + 1, scales);
    (
        halves(d * s0 as f32, d * s1 as f32),
        halves(-(dmin * m0 as f32), -(dmin * m1 as f32)),
    )
}

struct Q4K;
impl Decode for Q4K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(row: &[u8], _k: usize, s: usize) -> Decoded {
        let (sb, c) = (s / 4, s % 4);
        let blk = &row[sb * 144..sb * 144 + 144];
        let (lo, hi) = nibbles32(blk.as_ptr().add(16 + 32 * c));
        let (a, b) = k4_scales(blk, c);
        (join(lo, hi), a, b)
    }
}

struct Q5K;
impl Decode for Q5K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(row: &[u8], _k: usize, s: usize) -> Decoded {
        let (sb, c) = (s / 4, s % 4);
        let blk = &row[sb * 176..sb * 176 + 176];
        let (lo, hi) = nibbles32(blk.as_ptr().add(48 + 32 * c));
        let qh = _mm256_loadu_si256(blk.as_ptr().add(16) as *const __m256i);
        let bit = _mm256_set1_epi8(0x10);
        let m_lo = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << (2 * c)) as i8));
        let m_hi = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << (2 * c + 1)) as i8));
        let lo = _mm256_or_si256(lo, _mm256_maskz_mov_epi8(m_lo, bit));
        let hi = _mm256_or_si256(hi, _mm256_maskz_mov_epi8(m_hi, bit));
        let (a, b) = k4_scales(blk, c);
        (join(lo, hi), a, b)
    }
}

struct Q6K;
impl Decode for Q6K {
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(row: &[u8], _k: usize, s: usize) -> Decoded {
        let (sb, c) = (s / 4, s % 4);
        let blk = &row[sb * 210..sb * 210 + 210];
        let h = c / 2;
        let p = blk.as_ptr();
        let x0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
        let x1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
        let vh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
        let m4 = _mm256_set1_epi8(0x0F);
        let (q0, q1) = if c % 2 == 1 {
            (
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(x0), m4),
                    _mm256_and_si256(vh, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(x1), m4),
                    _mm256_srli_epi16::<2>(_mm256_and_si256(vh, _mm256_set1_epi8(0xC0u8 as i8))),
                ),
            )
        } else {
            (
                _mm256_or_si256(
                    _mm256_and_si256(x0, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(vh, _mm256_set1_epi8(0x03))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(x1, m4),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(vh, _mm256_set1_epi8(0x0C))),
                ),
            )
        };
        let sc4 = (p.add(192 + 4 * c) as *const i32).read_unaligned();
        let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_cvtsi32_si128(sc4)));
        let a = _mm512_mul_ps(_mm512_set1_ps(f16_at(blk, 208)), sc);
        let spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        (
            _mm512_sub_epi8(join(q0, q1), _mm512_set1_epi8(32)),
            _mm512_permutexvar_ps(spread, a),
            _mm512_setzero_ps(),
        )
    }
}

/// res[r, i] = w[first + r] · x[i] for `rows` weight rows from `first` ([rows, n], row stride n).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be available ([`available`]); `w` holds rows `first..first + rows`
/// and `xq` holds n = `res.len() / rows` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(crate) unsafe fn dot_block(
    w: &QuantMatrix,
    first: usize,
    rows: usize,
    xq: &QuantizedRows,
    res: &mut [f32],
) {
    let n = res.len() / rows.max(1);
    assert!(
        first + rows <= w.rows() && res.len() == rows * n && xq.q.len() >= n * xq.kp,
        "quant avx512: rows or inputs outside their shapes"
    );
    match w.format() {
        QuantFormat::Q4_0 => tiles::<Q4_0>(w, first, rows, xq, res),
        QuantFormat::Q4_1 => tiles::<Q4_1>(w, first, rows, xq, res),
        QuantFormat::Q5_0 => tiles::<Q5_0>(w, first, rows, xq, res),
        QuantFormat::Q5_1 => tiles::<Q5_1>(w, first, rows, xq, res),
        QuantFormat::Q8_0 => tiles::<Q8_0>(w, first, rows, xq, res),
        QuantFormat::Q4K => tiles::<Q4K>(w, first, rows, xq, res),
        QuantFormat::Q5K => tiles::<Q5K>(w, first, rows, xq, res),
        QuantFormat::Q6K => tiles::<Q6K>(w, first, rows, xq, res),
    }
}

/// Covers the block with micro-tiles: 4 weight rows x 1 input for single rows (four independent
/// accumulator chains), 2 weight rows x up to 6 inputs otherwise; leftover rows one at a time.
#[inline(always)]
unsafe fn tiles<D: Decode>(
    w: &QuantMatrix,
    first: usize,
    rows: usize,
    xq: &QuantizedRows,
    res: &mut [f32],
) {
    let n = res.len() / rows;
    let mut r = 0;
    if n == 1 {
        while r + 4 <= rows {
            tile::<D, 4, 1>(w, first + r, xq, 0, n, &mut res[r * n..]);
            r += 4;
        }
    } else {
        while r + 2 <= rows {
            inputs::<D, 2>(w, first + r, xq, n, &mut res[r * n..]);
            r += 2;
        }
    }
    while r < rows {
        inputs::<D, 1>(w, first + r, xq, n, &mut res[r * n..]);
        r += 1;
    }
}

/// R weight rows against all n inputs, in groups of up to 6.
#[inline(always)]
unsafe fn inputs<D: Decode, const R: usize>(
    w: &QuantMatrix,
    row: usize,
    xq: &QuantizedRows,
    n: usize,
    res: &mut [f32],
) {
    let mut i0 = 0;
    while i0 < n {
        let g = (n - i0).min(6);
        match g {
            1 => tile::<D, R, 1>(w, row, xq, i0, n, res),
            2 => tile::<D, R, 2>(w, row, xq, i0, n, res),
            3 => tile::<D, R, 3>(w, row, xq, i0, n, res),
            4 => tile::<D, R, 4>(w, row, xq, i0, n, res),
            5 => tile::<D, R, 5>(w, row, xq, i0, n, res),
            _ => tile::<D, R, 6>(w, row, xq, i0, n, res),
        }
        i0 += g;
    }
}

/// Weight rows `row..row + R` x inputs `i0..i0 + G`: res[r * n + i0 + g].
#[inline(always)]
#[allow(clippy::needless_range_loop)] // g indexes the accumulators and the inputs
unsafe fn tile<D: Decode, const R: usize, const G: usize>(
    w: &QuantMatrix,
    row: usize,
    xq: &QuantizedRows,
    i0: usize,
    n: usize,
    res: &mut [f32],
) {
    let (k, kp, lanes) = (w.cols(), xq.kp, xq.kp / 4);
    let mut rows: [&[u8]; R] = [&[]; R];
    for (r, slot) in rows.iter_mut().enumerate() {
        *slot = w.row(row + r);
    }
    let mut acc = [[_mm512_setzero_ps(); G]; R];
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    for s in 0..kp / STEP {
        // Signed weights, scales, minimum terms, and -128 · Σ w per lane (the +128 of the inputs).
        let zero = (
            _mm512_setzero_si512(),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
            _mm512_setzero_si512(),
        );
        let mut dec = [zero; R];
        for (slot, row) in dec.iter_mut().zip(rows) {
            let (ws, a, b) = D::decode(row, k, s);
            let corr = _mm512_sub_epi32(
                _mm512_setzero_si512(),
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, ws),
            );
            *slot = (ws, a, b, corr);
        }
        for g in 0..G {
            let i = i0 + g;
            let q = _mm512_loadu_si512(xq.q.as_ptr().add(i * kp + s * STEP) as *const _);
            let xu = _mm512_xor_si512(q, bias); // q + 128, unsigned
            let at = i * lanes + s * LANES;
            let dx = _mm512_loadu_ps(xq.dx.as_ptr().add(at));
            let dxs = if D::HAS_MIN {
                _mm512_loadu_ps(xq.dxs.as_ptr().add(at))
            } else {
                _mm512_setzero_ps()
            };
            for (r, (ws, a, b, corr)) in dec.iter().enumerate() {
                // Σ (q + 128) · w - 128 · Σ w = Σ q · w, exactly.
                let isum = _mm512_dpbusd_epi32(*corr, xu, *ws);
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), dx);
                acc[r][g] = _mm512_fmadd_ps(t, *a, acc[r][g]);
                if D::HAS_MIN {
                    acc[r][g] = _mm512_fmadd_ps(*b, dxs, acc[r][g]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (g, &acc) in acc.iter().enumerate() {
            res[r * n + i0 + g] = reduce(acc);
        }
    }
}

/// Lanes L + L+8, then + 4, + 2, + 1 (the portable path's tree).
#[inline(always)]
unsafe fn reduce(acc: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
    _mm_cvtss_f32(s1)
}
