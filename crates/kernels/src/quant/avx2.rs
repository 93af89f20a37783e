//! The AVX2/FMA quantized dot products (CPUs without AVX-512): the portable path's sequence of operations
//! (quant/mod.rs), its 16 lanes as two 8-lane halves with the same float operations and reduction tree.
//! Without `vpdpbusd`, a lane's integer is `vpmaddwd(vpmaddubsw(u, q), 1)`: unsigned bytes times signed
//! bytes summed in pairs to i16, then in pairs to i32, the same 4 elements a lane as AVX-512's. The pair
//! sums cannot saturate: `u` <= 63 for every format but Q8_0, and Q8_0 uses llama.cpp's sign trick
//! (`|w|` times `q` with `w`'s sign, pairs <= 2 · 128 · 127), its weights signed so no `init` is needed.
//!
//! Invariant: each operation is the IEEE operation the portable path performs on the same lane (the
//! integer sum is exact; cvt, mul, fma and the reduction tree round the same), so both give the same bits.

use std::arch::x86_64::*;

use super::formats::{scales_mins_k4, QuantFormat, CHUNK_STEPS, STEP};
use super::{Out, QuantMatrix, QuantizedRows, ROUND};

/// AVX2 for the integer vectors, FMA, F16C for the block scales.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Horizontal sum of 8 i32 (exact).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)))
}

/// Per lane of 4 bytes, their sum (i32): `vpmaddwd(vpmaddubsw(1, q), 1)`.
#[inline(always)]
unsafe fn lane_sums(u: __m256i, q: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1))
}

/// [`super::quantize_row`] with the same IEEE operations (max is exact in any order, sums are exact).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`available`]).
#[target_feature(enable = "avx2,fma,f16c")]
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
    let (round, abs) = (
        _mm256_set1_ps(ROUND),
        _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)),
    );
    for b in 0..blocks {
        let xp = x.as_ptr().add(32 * b);
        let v = [0, 8, 16, 24].map(|at| _mm256_loadu_ps(xp.add(at)));
        let m = v.map(|v| _mm256_and_ps(v, abs));
        let m8 = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let r = v.map(|v| {
            let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, id), round), round);
            _mm256_cvtps_epi32(r)
        });
        // i32 -> i8 (no saturation: |q| <= 127), back into element order.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(r[0], r[1]),
            _mm256_packs_epi32(r[2], r[3]),
        );
        let qv = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr().add(32 * b) as *mut __m256i, qv);
        _mm256_storeu_ps(dx.as_mut_ptr().add(8 * b), _mm256_set1_ps(d));
        let sums = lane_sums(_mm256_set1_epi8(1), qv);
        let initv = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-o));
        _mm256_storeu_si256(init.as_mut_ptr().add(8 * b) as *mut __m256i, initv);
        dxs[b] = d * hsum_i32(sums) as f32;
    }
}

/// A weight format's vectorized decoding (formats.rs: `decode_chunk`, `decode_step`), as 8-lane halves.
trait Format {
    /// Whether the format has an offset `o` paid by the inputs' `init` (not Q8_0: signed weights here).
    const OFFSET: bool;
    /// Whether the format has a minimum (the chunk's `v[8..16]`, against the inputs' `dxs`).
    const MIN: bool;
    /// 32-element blocks (else a 256-element super-block per chunk).
    const SMALL: bool;
    /// Q6_K's 16 scales a chunk (else 8, two a step).
    const SIXTEEN: bool = false;
    /// Q8_0: `weights` gives signed weights, multiplied by the sign trick.
    const SIGNED: bool = false;
    const BYTES: usize;
    /// `v[0..8]`, `v[8..16]` of chunk `ch` of a row of `k` elements at `row`.
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> [__m256; 2];
    /// Elements 0..32 and 32..64 of step `s`; `half`: only its first 32-element block lies in the row
    /// (the second half is then any value: the inputs are 0 there).
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> [__m256i; 2];
}

/// The chunk scales of a 32-element-block format: the f16 `d` (and `m`) at the start of each block.
#[inline(always)]
unsafe fn small_scales<F: Format>(row: *const u8, k: usize, ch: usize) -> [__m256; 2] {
    let first = 8 * ch;
    let blocks = (k / 32 - first).min(8) as i32;
    let mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(blocks),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let b = F::BYTES as i32;
    let offsets = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
    let base = row.add(first * F::BYTES) as *const i32;
    let words = _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), base, offsets, mask);
    // [d0..d4, m0..m4 | d4..d8, m4..m8] as u16, then [d0..d8 | m0..m8].
    let d = _mm256_and_si256(words, _mm256_set1_epi32(0xFFFF));
    let halves = _mm256_packus_epi32(d, _mm256_srli_epi32::<16>(words));
    let halves = _mm256_permute4x64_epi64::<0b11_01_10_00>(halves);
    let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
    let hi = if F::MIN {
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(halves))
    } else {
        _mm256_setzero_ps()
    };
    [lo, hi]
}

/// 16 packed nibbles at `p` -> 32 bytes [low nibbles, high nibbles].
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(x), x);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte j = 0x10 where bit j of `bits` is set (llama.cpp's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bits_to_0x10(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let others = _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFE);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

struct Q8_0;
impl Format for Q8_0 {
    const OFFSET: bool = false;
    const MIN: bool = false;
    const SMALL: bool = true;
    const SIGNED: bool = true;
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> [__m256; 2] {
        small_scales::<Self>(row, k, ch)
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> [__m256i; 2] {
        let p = row.add(2 * s * Self::BYTES + 2);
        let lo = _mm256_loadu_si256(p as *const __m256i);
        let hi = if half {
            _mm256_setzero_si256()
        } else {
            _mm256_loadu_si256(p.add(Self::BYTES) as *const __m256i)
        };
        [lo, hi]
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
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> [__m256; 2] {
        small_scales::<Self>(row, k, ch)
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> [__m256i; 2] {
        let p = row.add(2 * s * Self::BYTES + AT);
        let lo = nibbles16(p);
        [
            lo,
            if half {
                lo
            } else {
                nibbles16(p.add(Self::BYTES))
            },
        ]
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
    unsafe fn scales(row: *const u8, k: usize, ch: usize) -> [__m256; 2] {
        small_scales::<Self>(row, k, ch)
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, half: bool) -> [__m256i; 2] {
        let p = row.add(2 * s * Self::BYTES + AT);
        let block = |p: *const u8| {
            let qh = (p as *const u32).read_unaligned();
            _mm256_or_si256(nibbles16(p.add(4)), bits_to_0x10(qh))
        };
        let lo = block(p);
        [lo, if half { lo } else { block(p.add(Self::BYTES)) }]
    }
}

/// A Q4_K / Q5_K super-block's scales: `[d · sc_j]`, `[-dmin · m_j]`.
#[inline(always)]
unsafe fn k4_scales(blk: *const u8) -> [__m256; 2] {
    let sm =
        _mm_loadu_si128(scales_mins_k4(&*(blk.add(4) as *const [u8; 12])).as_ptr() as *const _);
    let dm = (blk as *const u32).read_unaligned() ^ 0x8000_0000; // [d, -dmin] as f16
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm as i32));
    let d = _mm256_broadcastss_ps(dm);
    let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
    let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm, sm)));
    [_mm256_mul_ps(d, sc), _mm256_mul_ps(m, mn)]
}

/// 32 packed nibbles at `p` -> [low nibbles, high nibbles].
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> [__m256i; 2] {
    let x = _mm256_loadu_si256(p as *const __m256i);
    let m = _mm256_set1_epi8(0x0F);
    [
        _mm256_and_si256(x, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(x), m),
    ]
}

struct Q4K;
impl Format for Q4K {
    const OFFSET: bool = false;
    const MIN: bool = true;
    const SMALL: bool = false;
    const BYTES: usize = 144;
    #[inline(always)]
    unsafe fn scales(row: *const u8, _k: usize, ch: usize) -> [__m256; 2] {
        k4_scales(row.add(ch * Self::BYTES))
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, _half: bool) -> [__m256i; 2] {
        let (sb, c) = (s / 4, s % 4);
        nibbles32(row.add(sb * Self::BYTES + 16 + 32 * c))
    }
}

/// Bit `b` of each byte of `x` moved to bit 4 (others 0).
#[inline(always)]
unsafe fn bit_to_4(x: __m256i, b: usize) -> __m256i {
    let moved = match b {
        0 => _mm256_slli_epi16::<4>(x),
        1 => _mm256_slli_epi16::<3>(x),
        2 => _mm256_slli_epi16::<2>(x),
        3 => _mm256_slli_epi16::<1>(x),
        4 => x,
        5 => _mm256_srli_epi16::<1>(x),
        6 => _mm256_srli_epi16::<2>(x),
        _ => _mm256_srli_epi16::<3>(x),
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

struct Q5K;
impl Format for Q5K {
    const OFFSET: bool = false;
    const MIN: bool = true;
    const SMALL: bool = false;
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn scales(row: *const u8, _k: usize, ch: usize) -> [__m256; 2] {
        k4_scales(row.add(ch * Self::BYTES))
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, _half: bool) -> [__m256i; 2] {
        let (sb, c) = (s / 4, s % 4);
        let blk = row.add(sb * Self::BYTES);
        let [lo, hi] = nibbles32(blk.add(48 + 32 * c));
        let qh = _mm256_loadu_si256(blk.add(16) as *const __m256i);
        [
            _mm256_or_si256(lo, bit_to_4(qh, 2 * c)),
            _mm256_or_si256(hi, bit_to_4(qh, 2 * c + 1)),
        ]
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
    unsafe fn scales(row: *const u8, _k: usize, ch: usize) -> [__m256; 2] {
        let blk = row.add(ch * Self::BYTES);
        let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
        let d = _mm_cvtph_ps(_mm_cvtsi32_si128(
            (blk.add(208) as *const u16).read_unaligned() as i32,
        ));
        let d = _mm256_broadcastss_ps(d);
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc)));
        [_mm256_mul_ps(d, lo), _mm256_mul_ps(d, hi)]
    }
    #[inline(always)]
    unsafe fn weights(row: *const u8, s: usize, _half: bool) -> [__m256i; 2] {
        let (sb, c) = (s / 4, s % 4);
        let blk = row.add(sb * Self::BYTES).add(64 * (c / 2));
        let ql0 = _mm256_loadu_si256(blk as *const __m256i);
        let ql1 = _mm256_loadu_si256(blk.add(32) as *const __m256i);
        let qh = _mm256_loadu_si256(blk.add(128 - 32 * (c / 2)) as *const __m256i);
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        // Element l: nibble of ql[l] | bits (shift, shift+1) of qh[l] at 4; element l + 32: nibble of
        // ql[l + 32] | bits (shift+2, shift+3) of qh[l] at 4 (shift = 0, or 4 for an odd step).
        let (l0, l1, h0, h1) = if c % 2 == 1 {
            (
                _mm256_srli_epi16::<4>(ql0),
                _mm256_srli_epi16::<4>(ql1),
                qh,
                _mm256_srli_epi16::<2>(qh),
            )
        } else {
            (
                ql0,
                ql1,
                _mm256_slli_epi16::<4>(qh),
                _mm256_slli_epi16::<2>(qh),
            )
        };
        [
            _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(h0, m30)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(h1, m30)),
        ]
    }
}

/// The lane scales of half `h` of step `c` of a chunk: `v[2c + h]` (Q6_K: `v[4c + 2h + l / 4]`).
#[inline(always)]
unsafe fn lane_scales<F: Format>(v: &[__m256; 2], c: usize, h: usize) -> __m256 {
    if F::SIXTEEN {
        let j = 4 * c + 2 * h;
        let idx = _mm256_add_epi32(
            _mm256_set1_epi32((j % 8) as i32),
            _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        );
        _mm256_permutevar8x32_ps(v[j / 8], idx)
    } else {
        _mm256_permutevar8x32_ps(v[0], _mm256_set1_epi32((2 * c + h) as i32))
    }
}

/// out[i, j] = w[j] · x[i] for the `rows` weight rows j from `first`.
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`available`]); `out` has room for these rows and `xq.n`
/// inputs, and no other thread accesses their elements.
#[target_feature(enable = "avx2,fma,f16c")]
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
        "quant avx2: rows or inputs outside their shapes"
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

/// Covers the block with micro-tiles (16 ymm registers: R·G·2 accumulators): 4 weight rows x 1 input for
/// single rows, 2 weight rows x up to 3 inputs otherwise; leftover rows one at a time.
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

/// R weight rows against all n inputs, in groups of up to 3 (as even as they come).
#[inline(always)]
unsafe fn inputs<F: Format, const R: usize>(
    w: &QuantMatrix,
    row: usize,
    xq: &QuantizedRows,
    out: Out,
) {
    let n = xq.n;
    let mut i0 = 0;
    for left in (1..=n.div_ceil(3)).rev() {
        let g = (n - i0).div_ceil(left);
        match g {
            1 => tile::<F, R, 1>(w, row, xq, i0, out),
            2 => tile::<F, R, 2>(w, row, xq, i0, out),
            _ => tile::<F, R, 3>(w, row, xq, i0, out),
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
    let mut acc = [[[_mm256_setzero_ps(); 2]; G]; R];
    for ch in 0..xq.chunks {
        let mut v = [[_mm256_setzero_ps(); 2]; R];
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
                let dxs = _mm256_loadu_ps(xq.dxs.as_ptr().add(((i0 + g) * xq.chunks + ch) * 8));
                for r in 0..R {
                    acc[r][g][1] = _mm256_fmadd_ps(v[r][1], dxs, acc[r][g][1]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (g, acc) in acc.iter().enumerate() {
            out.set(i0 + g, row + r, reduce(acc));
        }
    }
}

/// Step `s` (step `c` of its chunk, of scales `v`) of R rows against G inputs, half by half.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn step<F: Format, const R: usize, const G: usize>(
    rows: &[*const u8; R],
    v: &[[__m256; 2]; R],
    s: usize,
    c: usize,
    half: bool,
    xq: &QuantizedRows,
    i0: usize,
    acc: &mut [[[__m256; 2]; G]; R],
) {
    let (kp, lanes) = (xq.kp, xq.kp / 4);
    // Unsigned weights; Q8_0: |w|, w's sign going onto the inputs below.
    let mut w = [[_mm256_setzero_si256(); 2]; R];
    let mut u = [[_mm256_setzero_si256(); 2]; R];
    for r in 0..R {
        w[r] = F::weights(rows[r], s, half);
        u[r] = if F::SIGNED {
            [_mm256_abs_epi8(w[r][0]), _mm256_abs_epi8(w[r][1])]
        } else {
            w[r]
        };
    }
    for h in 0..2 {
        let mut a = [_mm256_setzero_ps(); R];
        for r in 0..R {
            a[r] = lane_scales::<F>(&v[r], c, h);
        }
        for g in 0..G {
            let i = i0 + g;
            let q = _mm256_load_si256(xq.q.as_ptr().add(i * kp + s * STEP + 32 * h) as *const _);
            let at = i * lanes + s * 16 + 8 * h;
            let dx = _mm256_load_ps(xq.dx.as_ptr().add(at));
            for r in 0..R {
                let mut isum = if F::SIGNED {
                    lane_sums(u[r][h], _mm256_sign_epi8(q, w[r][h]))
                } else {
                    lane_sums(u[r][h], q)
                };
                if F::OFFSET {
                    let init = _mm256_load_si256(xq.init.as_ptr().add(at) as *const _);
                    isum = _mm256_add_epi32(isum, init);
                }
                let t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), dx);
                acc[r][g][h] = _mm256_fmadd_ps(t, a[r], acc[r][g][h]);
            }
        }
    }
}

/// Lanes L + L+8 (the two halves), then + 4, + 2, + 1 (the portable path's tree).
#[inline(always)]
unsafe fn reduce(acc: &[__m256; 2]) -> f32 {
    let s8 = _mm256_add_ps(acc[0], acc[1]);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
    _mm_cvtss_f32(s1)
}
