//! The AVX-512 VNNI quantized dot products: the portable path's sequence of operations (quant/mod.rs),
//! 16 lanes at a time. `vpdpbusd` multiplies the unsigned weights `u` by the signed inputs `q`, starting
//! from the input's `init = -o · Σq` per lane: the integer is the portable path's `Σ (u - o) · q` exactly.
//! A chunk's scales are decoded once into one vector (`v`: 32-element blocks' f16 scales by a gather,
//! k-quant 6-bit scales and mins by llama.cpp's word masks) and each step's lane scales picked from it by
//! one permute. Micro-tiles of R weight rows x G inputs keep R·G accumulators in registers: each decoded
//! weight step serves G inputs, each loaded input step R rows.
//!
//! Invariant: each operation is the IEEE operation the portable path performs on the same lane (the
//! integer sum is exact; cvt, mul, fma and the reduction tree round the same), so both give the same bits.

use std::arch::x86_64::*;

use super::formats::{scales_mins_k4, QuantFormat, CHUNK_STEPS, STEP};
use super::{Out, QuantMatrix, QuantizedRows, ROUND};

/// AVX-512 F/BW/VL for the vectors and masks, VNNI for `vpdpbusd`, F16C for the block scales.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// [`super::quantize_row`] with the same IEEE operations (max is exact in any order, sums are exact).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // b indexes x, q, dx, init and dxs
pub(crate) unsafe fn quantize_row(
    x: &[f32],
    o: i32,
    q: &mut [i8],
    dx: &mut [f32],
    init: &mut [i32],
    dxs: &mut [f32],
) {
    let blocks = x.len() / 32;
    assert!(
        x.len() == 32 * blocks && q.len() >= 32 * blocks && dx.len() >= 8 * blocks,
        "quantize_row: shapes"
    );
    assert!(
        init.len() >= 8 * blocks && dxs.len() >= blocks,
        "quantize_row: shapes"
    );
    let round = _mm512_set1_ps(ROUND);
    for b in 0..blocks {
        let (xp, qp) = (x.as_ptr().add(32 * b), q.as_mut_ptr().add(32 * b));
        let (lo, hi) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let mut ints = [_mm_setzero_si128(); 2];
        for (half, v) in [lo, hi].into_iter().enumerate() {
            let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, id), round), round);
            ints[half] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
        }
        let qv = _mm256_set_m128i(ints[1], ints[0]);
        _mm256_storeu_si256(qp as *mut __m256i, qv);
        _mm256_storeu_ps(dx.as_mut_ptr().add(8 * b), _mm256_set1_ps(d));
        let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), qv);
        let initv = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-o));
        _mm256_storeu_si256(init.as_mut_ptr().add(8 * b) as *mut __m256i, initv);
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        );
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
        dxs[b] = d * _mm_cvtsi128_si32(s1) as f32;
    }
}

/// A weight format's vectorized decoding (formats.rs: `decode_chunk`, `decode_step`).
trait Format {
    /// Whether the format has an offset `o` (the inputs' `init`).
    const OFFSET: bool;
    /// Whether the format has a minimum (the chunk's `v[8..16]`, against the inputs' `dxs`).
    const MIN: bool;
    /// 32-element blocks (else a 256-element super-block per chunk).
    const SMALL: bool;
    /// Q6_K's 16 scales a chunk (else 8, two a step).
    const SIXTEEN: bool = false;
    /// Bytes a block.
    const BYTES: usize;
    /// `v` of chunk `ch` of a row of `k` elements at `row`.
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> __m512;
    /// `u` of step `s`; `half`: only its first 32-element block lies in the row (the upper 32 bytes are
    /// then any value: the inputs are 0 there).
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> __m512i;
}

/// The gather offsets of eight consecutive blocks.
#[inline(always)]
unsafe fn block_offsets<F: Format>() -> __m256i {
    let b = F::BYTES as i32;
    _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b)
}

/// The chunk scales of a 32-element-block format: the f16 `d` (and `m`) at the start of each block.
#[inline(always)]
unsafe fn small_scales<F: Format>(row: *const u8, k: usize, ch: usize) -> __m512 {
    let first = 8 * ch;
    let blocks = (k / 32 - first).min(8);
    let mask = (((1u32 << blocks) - 1) & 0xFF) as __mmask8;
    let words = _mm256_mmask_i32gather_epi32::<1>(
        _mm256_setzero_si256(),
        mask,
        block_offsets::<F>(),
        row.add(first * F::BYTES) as *const i32,
    );
    if F::MIN {
        // [d0, m0, d1, m1, ...] -> [d0..d8, m0..m8]
        let dm = _mm512_cvtph_ps(words);
        let idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        _mm512_permutexvar_ps(idx, dm)
    } else {
        _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(words)))
    }
}

/// 16 packed nibbles at `p` and `p2` -> 64 bytes [low, high nibbles of p; low, high nibbles of p2].
#[inline(always)]
unsafe fn nibbles2x16(p: *const u8, p2: *const u8) -> __m512i {
    let x = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
    let x = _mm512_mask_broadcast_i32x4(x, 0xFF00, _mm_loadu_si128(p2 as *const __m128i));
    let four = 0x0004_0004_0004_0004;
    let shift = _mm512_setr_epi64(0, 0, four, four, 0, 0, four, four);
    _mm512_and_si512(_mm512_srlv_epi16(x, shift), _mm512_set1_epi8(0x0F))
}

/// 32 packed nibbles at `p` -> 64 bytes [low nibbles, high nibbles].
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m512i {
    let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i));
    let shift = _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xFFFF_0000, 4);
    _mm512_and_si512(_mm512_srlv_epi16(x, shift), _mm512_set1_epi8(0x0F))
}

struct Q8_0;
impl Format for Q8_0 {
    const OFFSET: bool = true;
    const MIN: bool = false;
    const SMALL: bool = true;
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> __m512 {
        small_scales::<Self>(row, k, ch)
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> __m512i {
        let p = row.add(2 * s * Self::BYTES + 2);
        let lo = _mm512_zextsi256_si512(_mm256_loadu_si256(p as *const __m256i));
        let w = if half {
            lo
        } else {
            let hi = _mm256_loadu_si256(p.add(Self::BYTES) as *const __m256i);
            _mm512_inserti64x4::<1>(lo, hi)
        };
        _mm512_xor_si512(w, _mm512_set1_epi8(0x80u8 as i8))
    }
}

/// Q4_0 (qs at byte 2) and Q4_1 (at 4).
struct Q4<const AT: usize, const MIN: bool>;
impl<const AT: usize, const MIN: bool> Format for Q4<AT, MIN> {
    const OFFSET: bool = !MIN;
    const MIN: bool = MIN;
    const SMALL: bool = true;
    const BYTES: usize = AT + 16;
    #[inline(always)]
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> __m512 {
        small_scales::<Self>(row, k, ch)
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> __m512i {
        let p = row.add(2 * s * Self::BYTES + AT);
        nibbles2x16(p, if half { p } else { p.add(Self::BYTES) })
    }
}

/// Q5_0 (qh at byte 2) and Q5_1 (at 4): nibbles with the fifth bit of element j at bit j of `qh`.
struct Q5<const AT: usize, const MIN: bool>;
impl<const AT: usize, const MIN: bool> Format for Q5<AT, MIN> {
    const OFFSET: bool = !MIN;
    const MIN: bool = MIN;
    const SMALL: bool = true;
    const BYTES: usize = AT + 20;
    #[inline(always)]
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> __m512 {
        small_scales::<Self>(row, k, ch)
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> __m512i {
        let p = row.add(2 * s * Self::BYTES + AT);
        let p2 = if half { p } else { p.add(Self::BYTES) };
        let u = nibbles2x16(p.add(4), p2.add(4));
        let qh0 = (p as *const u32).read_unaligned() as u64;
        let qh1 = if half {
            0
        } else {
            (p2 as *const u32).read_unaligned() as u64
        };
        _mm512_mask_add_epi8(u, qh0 | qh1 << 32, u, _mm512_set1_epi8(0x10))
    }
}

/// A Q4_K / Q5_K super-block's scales: `[d · sc_j, -dmin · m_j]`.
#[inline(always)]
unsafe fn k4_scales(blk: *const u8) -> __m512 {
    let sm = scales_mins_k4(&*(blk.add(4) as *const [u8; 12]));
    let ints = _mm512_cvtepu8_epi32(_mm_loadu_si128(sm.as_ptr() as *const __m128i));
    let dm = (blk as *const u32).read_unaligned() ^ 0x8000_0000; // [d, -dmin] as f16
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm as i32));
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let dm = _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(dm));
    _mm512_mul_ps(dm, _mm512_cvtepi32_ps(ints))
}

struct Q4K;
impl Format for Q4K {
    const OFFSET: bool = false;
    const MIN: bool = true;
    const SMALL: bool = false;
    const BYTES: usize = 144;
    #[inline(always)]
    unsafe fn scales(row: *const u8, _k: usize, ch: usize) -> __m512 {
        k4_scales(row.add(ch * Self::BYTES))
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, _half: bool) -> __m512i {
        let (sb, c) = (s / 4, s % 4);
        nibbles32(row.add(sb * Self::BYTES + 16 + 32 * c))
    }
}

struct Q5K;
impl Format for Q5K {
    const OFFSET: bool = false;
    const MIN: bool = true;
    const SMALL: bool = false;
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn scales(row: *const u8, _k: usize, ch: usize) -> __m512 {
        k4_scales(row.add(ch * Self::BYTES))
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, _half: bool) -> __m512i {
        let (sb, c) = (s / 4, s % 4);
        let blk = row.add(sb * Self::BYTES);
        let u = nibbles32(blk.add(48 + 32 * c));
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16) as *const __m256i));
        // bit 2c of qh[l] is bit 4 of element l, bit 2c + 1 that of element l + 32.
        let sel = _mm512_mask_set1_epi8(
            _mm512_set1_epi8((1u8 << (2 * c)) as i8),
            0xFFFF_FFFF_0000_0000,
            (1u8 << (2 * c + 1)) as i8,
        );
        let bits = _mm512_test_epi8_mask(qh, sel);
        _mm512_mask_add_epi8(u, bits, u, _mm512_set1_epi8(0x10))
    }
}

struct Q6K;
impl Format for Q6K {
    const OFFSET: bool = true;
    const MIN: bool = false;
    const SMALL: bool = false;
    const SIXTEEN: bool = true;
    const BYTES: usize = 210;
    #[inline(always)]
    unsafe fn scales(row: *const u8, _k: usize, ch: usize) -> __m512 {
        let blk = row.add(ch * Self::BYTES);
        let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(192) as *const __m128i));
        let d = _mm_cvtph_ps(_mm_cvtsi32_si128(
            (blk.add(208) as *const u16).read_unaligned() as i32,
        ));
        _mm512_mul_ps(_mm512_broadcastss_ps(d), _mm512_cvtepi32_ps(sc))
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, _half: bool) -> __m512i {
        let (sb, c) = (s / 4, s % 4);
        let (h, odd) = (c / 2, c % 2 == 1);
        let blk = row.add(sb * Self::BYTES);
        let ql = _mm512_loadu_si512(blk.add(64 * h) as *const _);
        let qh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i));
        // Element l: nibble of ql[l] | bits (shift, shift+1) of qh[l] at 4; element l + 32: nibble of
        // ql[l + 32] | bits (shift+2, shift+3) of qh[l] at 4 (shift = 0, or 4 for an odd step).
        let (lo, hi) = if odd {
            let lo = _mm512_srli_epi16::<4>(ql);
            let by = _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xFFFF_0000, 2);
            (lo, _mm512_srlv_epi16(qh, by))
        } else {
            let by = _mm512_mask_set1_epi16(_mm512_set1_epi16(4), 0xFFFF_0000, 2);
            (ql, _mm512_sllv_epi16(qh, by))
        };
        let lo = _mm512_and_si512(lo, _mm512_set1_epi8(0x0F));
        // lo | (hi & 0x30)
        _mm512_ternarylogic_epi32::<0xF8>(lo, hi, _mm512_set1_epi8(0x30))
    }
}

/// The lane scales of step `c` of a chunk: `v[2c + l / 8]` (Q6_K: `v[4c + l / 4]`).
#[inline(always)]
unsafe fn lane_scales<F: Format>(v: __m512, c: usize) -> __m512 {
    let l = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let idx = if F::SIXTEEN {
        let l4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        _mm512_add_epi32(l4, _mm512_set1_epi32(4 * c as i32))
    } else {
        _mm512_add_epi32(l, _mm512_set1_epi32(2 * c as i32))
    };
    _mm512_permutexvar_ps(idx, v)
}

/// out[i, j] = w[j] · x[i] for the `rows` weight rows j from `first`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be available ([`available`]); `out` has room for these rows and
/// `xq.n` inputs, and no other thread accesses their elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(crate) unsafe fn dot_block(
    w: &QuantMatrix,
    first: usize,
    rows: usize,
    xq: &QuantizedRows,
    out: Out,
) {
    let (k, kp, n) = (w.cols(), xq.kp, xq.n);
    assert!(
        first + rows <= w.rows()
            && kp == k.next_multiple_of(STEP)
            && xq.chunks * CHUNK_STEPS * STEP >= kp
            && xq.q.len() >= n * kp
            && xq.dx.len() >= n * kp / 4
            && xq.init.len() >= n * kp / 4
            && xq.dxs.len() >= n * 8 * xq.chunks,
        "quant avx512: rows or inputs outside their shapes"
    );
    match w.format() {
        QuantFormat::Q4_0 => tiles::<Q4<2, false>>(w, first, rows, xq, out),
        QuantFormat::Q4_1 => tiles::<Q4<4, true>>(w, first, rows, xq, out),
        QuantFormat::Q5_0 => tiles::<Q5<2, false>>(w, first, rows, xq, out),
        QuantFormat::Q5_1 => tiles::<Q5<4, true>>(w, first, rows, xq, out),
        QuantFormat::Q8_0 => tiles::<Q8_0>(w, first, rows, xq, out),
        QuantFormat::Q4K => tiles::<Q4K>(w, first, rows, xq, out),
        QuantFormat::Q5K => tiles::<Q5K>(w, first, rows, xq, out),
        QuantFormat::Q6K => tiles::<Q6K>(w, first, rows, xq, out),
    }
}

/// Covers the block with micro-tiles: 4 weight rows x 1 input for single rows (four independent
/// accumulator chains), 2 weight rows x up to 8 inputs otherwise; leftover rows one at a time.
#[inline(always)]
unsafe fn tiles<F: Format>(
    w: &QuantMatrix,
    first: usize,
    rows: usize,
    xq: &QuantizedRows,
    out: Out,
) {
    let end = first + rows;
    let mut r = first;
    if xq.n == 1 {
        while r + 4 <= end {
            tile::<F, 4, 1>(w, r, xq, 0, out);
            r += 4;
        }
    } else {
        while r + 2 <= end {
            inputs::<F, 2>(w, r, xq, out);
            r += 2;
        }
    }
    while r < end {
        inputs::<F, 1>(w, r, xq, out);
        r += 1;
    }
}

/// R weight rows against all n inputs, in groups of up to 8 (as even as they come).
#[inline(always)]
unsafe fn inputs<F: Format, const R: usize>(
    w: &QuantMatrix,
    row: usize,
    xq: &QuantizedRows,
    out: Out,
) {
    let n = xq.n;
    let mut i0 = 0;
    for left in (1..=n.div_ceil(8)).rev() {
        let g = (n - i0).div_ceil(left);
        match g {
            1 => tile::<F, R, 1>(w, row, xq, i0, out),
            2 => tile::<F, R, 2>(w, row, xq, i0, out),
            3 => tile::<F, R, 3>(w, row, xq, i0, out),
            4 => tile::<F, R, 4>(w, row, xq, i0, out),
            5 => tile::<F, R, 5>(w, row, xq, i0, out),
            6 => tile::<F, R, 6>(w, row, xq, i0, out),
            7 => tile::<F, R, 7>(w, row, xq, i0, out),
            _ => tile::<F, R, 8>(w, row, xq, i0, out),
        }
        i0 += g;
    }
}

/// Weight rows `row..row + R` x inputs `i0..i0 + G`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // g indexes the accumulators and the inputs
unsafe fn tile<F: Format, const R: usize, const G: usize>(
    w: &QuantMatrix,
    row: usize,
    xq: &QuantizedRows,
    i0: usize,
    out: Out,
) {
    let (k, kp) = (w.cols(), xq.kp);
    let steps = kp / STEP;
    let mut rows = [std::ptr::null::<u8>(); R];
    for (r, p) in rows.iter_mut().enumerate() {
        *p = w.row(row + r).as_ptr();
    }
    let mut acc = [[_mm512_setzero_ps(); G]; R];
    for ch in 0..xq.chunks {
        let mut v = [_mm512_setzero_ps(); R];
        for (v, &p) in v.iter_mut().zip(&rows) {
            *v = F::scales(p, k, ch);
        }
        let s0 = ch * CHUNK_STEPS;
        if s0 + CHUNK_STEPS <= steps && (!F::SMALL || 2 * (s0 + CHUNK_STEPS) <= k / 32) {
            for c in 0..CHUNK_STEPS {
                step::<F, R, G>(&rows, &v, s0 + c, c, false, xq, i0, &mut acc);
            }
        } else {
            for c in 0..(steps - s0).min(CHUNK_STEPS) {
                let half = F::SMALL && 2 * (s0 + c) + 1 >= k / 32;
                step::<F, R, G>(&rows, &v, s0 + c, c, half, xq, i0, &mut acc);
            }
        }
        if F::MIN {
            for g in 0..G {
                let p = xq.dxs.as_ptr().add(((i0 + g) * xq.chunks + ch) * 8);
                let dxs =
                    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p as *const f64)));
                for r in 0..R {
                    acc[r][g] = _mm512_mask3_fmadd_ps(v[r], dxs, acc[r][g], 0xFF00);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (g, &acc) in acc.iter().enumerate() {
            out.set(i0 + g, row + r, reduce(acc));
        }
    }
}

/// Step `s` (step `c` of its chunk, of scales `v`) of R rows against G inputs.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn step<F: Format, const R: usize, const G: usize>(
    rows: &[*const u8; R],
    v: &[__m512; R],
    s: usize,
    c: usize,
    half: bool,
    xq: &QuantizedRows,
    i0: usize,
    acc: &mut [[__m512; G]; R],
) {
    let (kp, lanes) = (xq.kp, xq.kp / 4);
    let mut u = [_mm512_setzero_si512(); R];
    let mut a = [_mm512_setzero_ps(); R];
    for r in 0..R {
        u[r] = F::weights(rows[r], s, half);
        a[r] = lane_scales::<F>(v[r], c);
    }
    for g in 0..G {
        let i = i0 + g;
        let q = _mm512_load_si512(xq.q.as_ptr().add(i * kp + s * STEP) as *const _);
        let at = i * lanes + s * 16;
        let dx = _mm512_load_ps(xq.dx.as_ptr().add(at));
        let init = if F::OFFSET {
            _mm512_load_si512(xq.init.as_ptr().add(at) as *const _)
        } else {
            _mm512_setzero_si512()
        };
        for r in 0..R {
            let isum = _mm512_dpbusd_epi32(init, u[r], q);
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), dx);
            acc[r][g] = _mm512_fmadd_ps(t, a[r], acc[r][g]);
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

/// Rows `first..first + rows` (at most 64) of `w` dequantized (`w = a · (u - o) + b`, formats.rs) and
/// rounded to bf16 into `dst`, in the AMX B-tile layout (`amx::linear_decoded`'s `fill`): row r sits in
/// block r / 16 as tile row pair p = (c % 32) / 2 of k block c / 32, u16 `(((r / 16) · kb + c / 32) · 16
/// + p) · 32 + (r % 16) · 2 + c % 2`, kb = k / 32.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI/BF16 and F16C must be available; `first + rows <= w.rows()`, `rows <= 64` and
/// `dst` holds `rows.div_ceil(16) · kb · 512` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,f16c")]
pub(crate) unsafe fn dequantize_tiles(w: &QuantMatrix, first: usize, rows: usize, dst: &mut [u16]) {
    let kb = w.cols().div_ceil(32);
    assert!(
        first + rows <= w.rows() && rows <= 64 && dst.len() >= rows.div_ceil(16) * kb * 512,
        "quant avx512: dequantized rows outside their shapes"
    );
    match w.format() {
        QuantFormat::Q4_0 => tile_rows::<Q4<2, false>>(w, first, rows, dst),
        QuantFormat::Q4_1 => tile_rows::<Q4<4, true>>(w, first, rows, dst),
        QuantFormat::Q5_0 => tile_rows::<Q5<2, false>>(w, first, rows, dst),
        QuantFormat::Q5_1 => tile_rows::<Q5<4, true>>(w, first, rows, dst),
        QuantFormat::Q8_0 => tile_rows::<Q8_0>(w, first, rows, dst),
        QuantFormat::Q4K => tile_rows::<Q4K>(w, first, rows, dst),
        QuantFormat::Q5K => tile_rows::<Q5K>(w, first, rows, dst),
        QuantFormat::Q6K => tile_rows::<Q6K>(w, first, rows, dst),
    }
}

#[inline(always)]
unsafe fn tile_rows<F: Format>(w: &QuantMatrix, first: usize, rows: usize, dst: &mut [u16]) {
    let k = w.cols();
    let kb = k.div_ceil(32);
    let o = _mm512_set1_epi32(w.format().offset());
    // The 8 bf16 pairs of 16 consecutive k values sit 16 u32 (one tile row) apart.
    let pairs = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
    let base = dst.as_mut_ptr().cast::<u32>();
    for r in 0..rows {
        let row = w.row(first + r).as_ptr();
        let rbase = base.add((r / 16) * kb * 256 + r % 16);
        let mut v = _mm512_setzero_ps();
        for s in 0..k.div_ceil(STEP) {
            let c = s % CHUNK_STEPS;
            if c == 0 {
                v = F::scales(row, k, s / CHUNK_STEPS);
            }
            let half = STEP * s + STEP > k;
            let u = F::weights(row, s, half);
            let quarters = [
                _mm512_extracti32x4_epi32::<0>(u),
                _mm512_extracti32x4_epi32::<1>(u),
                _mm512_extracti32x4_epi32::<2>(u),
                _mm512_extracti32x4_epi32::<3>(u),
            ];
            for (g, bytes) in quarters
                .into_iter()
                .enumerate()
                .take(if half { 2 } else { 4 })
            {
                let ints = _mm512_cvtepu8_epi32(bytes);
                let ints = if F::OFFSET {
                    _mm512_sub_epi32(ints, o)
                } else {
                    ints
                };
                let sub = if F::SIXTEEN { 4 * c + g } else { 2 * c + g / 2 };
                let a = _mm512_permutexvar_ps(_mm512_set1_epi32(sub as i32), v);
                let mut wv = _mm512_mul_ps(a, _mm512_cvtepi32_ps(ints));
                if F::MIN {
                    let b = _mm512_permutexvar_ps(_mm512_set1_epi32((8 + 2 * c + g / 2) as i32), v);
                    wv = _mm512_add_ps(wv, b);
                }
                let bf: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(wv));
                let e = STEP * s + 16 * g; // first element: k block e / 32, pairs from (e % 32) / 2
                let at = rbase.add((e / 32) * 256 + ((e % 32) / 2) * 16);
                _mm256_i32scatter_epi32::<4>(at.cast::<i32>(), pairs, bf);
            }
        }
    }
}
