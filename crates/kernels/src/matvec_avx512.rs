//! The AVX-512 matvec block: `res[r, i] = mode(res[r, i], w[r] · x[i])` for a block of weight rows `w`
//! ([rows, k], f32 or bf16) and up to [`crate::MATVEC_MAX_ROWS`] input rows `x` ([n, k]).
//!
//! Algorithm. k is taken in blocks of 32. A bf16 weight block is one 64-byte load, split into its even
//! elements (`<< 16`) and odd elements (`& 0xffff0000`) as two f32 vectors: one instruction per 16 weights
//! instead of a widening shuffle and a shift (an f32 block is split by two permutes). The inputs are
//! rearranged the same way once per call (`[16 even, 16 odd]` per block, zero-padded to a multiple of 32).
//! Every (weight row, input row) pair is one 16-lane accumulator, `acc = fma(w_even, x_even, acc);
//! acc = fma(w_odd, x_odd, acc)` per block, then one `_mm512_reduce_add_ps`. Micro-tiles of R weight rows x
//! N input rows keep R·N accumulators in zmm registers, so each split weight block feeds 2N FMAs:
//! 8 x 1 for a single input (8 independent FMA chains; memory-bound), 8 x 2, 6 x 3 and 5 x 4 for input
//! groups of up to 4 (at most 20 accumulators + 2 weight halves + the inputs as memory operands).
//!
//! Invariant (batch invariance, what keeps greedy speculation exact): the value of each (r, i) pair is
//! computed by the same sequence of FMAs and the same reduction whatever the tile, group or row count, and
//! bf16 widening is exact, so a row of an n-row call has the bits of a one-row call, and a bf16 matrix the
//! bits of its f32 widening (tests/linear.rs).

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::linear::Mode;
use crate::simd::WeightElem;

/// k values per block: one 64-byte bf16 load, two f32 vectors.
const BLOCK: usize = 32;

/// Weight rows per pass of the input groups: their split blocks are re-read from L1/L2 by every group.
const TILE_ROWS: usize = 40;

/// Input rows per micro-kernel pass.
const GROUP: usize = 4;

thread_local! {
    /// The inputs rearranged per block as [16 even, 16 odd], [n, k rounded up to 32], reused across calls.
    static SPLIT_X: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether this CPU runs the AVX-512 matvec (F for the arithmetic, BW for the masked 16-bit tail loads, VL
/// for their 256-bit forms). `is_x86_feature_detected!` caches its answer.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// res[rows, n] (row stride n) for the block `w` [rows, k] and inputs `x` [n, k].
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL ([`available`]). Shapes are asserted.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn matvec_block<W: WeightElem>(
    x: &[f32],
    w: &[W],
    k: usize,
    n: usize,
    mode: Mode,
    res: &mut [f32],
) {
    let rows = w.len() / k.max(1);
    assert!(
        k > 0 && n > 0 && w.len() == rows * k && x.len() == n * k && res.len() == rows * n,
        "matvec_avx512: block shapes disagree"
    );
    let kp = k.next_multiple_of(BLOCK);
    SPLIT_X.with(|split| {
        let mut split = split.borrow_mut();
        if split.len() < n * kp {
            split.resize(n * kp, 0.0);
        }
        let split = &mut split[..n * kp];
        for (row, dst) in x.chunks_exact(k).zip(split.chunks_exact_mut(kp)) {
            split_row(row, dst);
        }
        let xs: &[f32] = split;
        let mut first_row = 0;
        while first_row < rows {
            let tile_rows = (rows - first_row).min(TILE_ROWS);
            let tile = Weights {
                ptr: w[first_row * k..].as_ptr(),
                k,
            };
            let res_tile = &mut res[first_row * n..(first_row + tile_rows) * n];
            // SAFETY: the tile holds tile_rows x k weights inside w; xs holds n x kp split inputs.
            unsafe { groups(tile, tile_rows, xs, kp, n, mode, res_tile) };
            first_row += tile_rows;
        }
    });
}

/// dst [kp] = the row [k] rearranged per 32-block as [even elements, odd elements], zero-padded.
fn split_row(row: &[f32], dst: &mut [f32]) {
    dst.iter_mut().for_each(|v| *v = 0.0);
    for (b, block) in row.chunks(BLOCK).enumerate() {
        let out = &mut dst[b * BLOCK..(b + 1) * BLOCK];
        for (j, &v) in block.iter().enumerate() {
            out[(j % 2) * (BLOCK / 2) + j / 2] = v;
        }
    }
}

/// A weight block: `k` values per row from `ptr`.
#[derive(Clone, Copy)]
struct Weights<W> {
    ptr: *const W,
    k: usize,
}

/// All input groups over one tile of weight rows.
///
/// # Safety
/// `w` addresses tile_rows rows; `xs` holds n split rows of kp values; res is [tile_rows, n].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn groups<W: WeightElem>(
    w: Weights<W>,
    tile_rows: usize,
    xs: &[f32],
    kp: usize,
    n: usize,
    mode: Mode,
    res: &mut [f32],
) {
    let mut first = 0;
    while first < n {
        let size = (n - first).min(GROUP);
        let xg = xs[first * kp..].as_ptr();
        // SAFETY: the group's split inputs lie inside xs; res is [tile_rows, n].
        unsafe {
            match size {
                1 => rows_tiles::<W, 8, 1>(w, tile_rows, xg, kp, n, first, mode, res),
                2 => rows_tiles::<W, 8, 2>(w, tile_rows, xg, kp, n, first, mode, res),
                3 => rows_tiles::<W, 6, 3>(w, tile_rows, xg, kp, n, first, mode, res),
                _ => rows_tiles::<W, 5, 4>(w, tile_rows, xg, kp, n, first, mode, res),
            }
        }
        first += size;
    }
}

/// Covers `rows` weight rows with R-row micro-tiles (single rows for the remainder) against the N split
/// inputs at `xs`, writing columns first_input..first_input + N of res [rows, n_total].
///
/// # Safety
/// As [`groups`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn rows_tiles<W: WeightElem, const R: usize, const N: usize>(
    w: Weights<W>,
    rows: usize,
    xs: *const f32,
    kp: usize,
    n_total: usize,
    first_input: usize,
    mode: Mode,
    res: &mut [f32],
) {
    let mut write = |r0: usize, vals: &[[f32; N]]| {
        for (dr, row_vals) in vals.iter().enumerate() {
            let at = (r0 + dr) * n_total + first_input;
            for (o, &v) in res[at..at + N].iter_mut().zip(row_vals) {
                *o = mode.apply(*o, v);
            }
        }
    };
    let mut r = 0;
    while r + R <= rows {
        // SAFETY: rows r..r+R lie inside the block.
        write(r, &unsafe { tile::<W, R, N>(w, r, xs, kp) });
        r += R;
    }
    while r < rows {
        // SAFETY: as above, one row.
        write(r, &unsafe { tile::<W, 1, N>(w, r, xs, kp) });
        r += 1;
    }
}

/// Dot products of weight rows first..first+R with N split input rows (row stride kp): [R][N].
///
/// # Safety
/// As [`groups`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile<W: WeightElem, const R: usize, const N: usize>(
    w: Weights<W>,
    first: usize,
    xs: *const f32,
    kp: usize,
) -> [[f32; N]; R] {
    let k = w.k;
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let body = k - k % BLOCK;
    let mut c = 0;
    while c < body {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: row first + r, values c..c+32, inside the block.
            let (we, wo) = unsafe { load_split(w.ptr.add((first + r) * k + c), None) };
            for (i, a) in acc_r.iter_mut().enumerate() {
                // SAFETY: split row i holds kp >= c + 32 values.
                let (xe, xo) = unsafe {
                    let p = xs.add(i * kp + c);
                    (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(BLOCK / 2)))
                };
                *a = _mm512_fmadd_ps(wo, xo, _mm512_fmadd_ps(we, xe, *a));
            }
        }
        c += BLOCK;
    }
    if body < k {
        // The last k % 32 weights: a masked load reads only them (the other lanes are zero, as are the
        // padded inputs).
        let mask = (1u32 << (k - body)) - 1;
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: the mask limits the load to the row's last k - body values.
            let (we, wo) = unsafe { load_split(w.ptr.add((first + r) * k + body), Some(mask)) };
            for (i, a) in acc_r.iter_mut().enumerate() {
                // SAFETY: split rows are padded to kp.
                let (xe, xo) = unsafe {
                    let p = xs.add(i * kp + body);
                    (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(BLOCK / 2)))
                };
                *a = _mm512_fmadd_ps(wo, xo, _mm512_fmadd_ps(we, xe, *a));
            }
        }
    }
    let mut out = [[0.0f32; N]; R];
    for (out_r, acc_r) in out.iter_mut().zip(&acc) {
        for (o, a) in out_r.iter_mut().zip(acc_r) {
            *o = _mm512_reduce_add_ps(*a);
        }
    }
    out
}

/// 32 weights as (even elements, odd elements) in f32, exactly; with a mask (bit j = element j), only the
/// masked elements are read and the others are zero.
///
/// # Safety
/// `p` addresses 32 values (or the masked ones); AVX-512 F/BW/VL.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_split<W: WeightElem>(p: *const W, mask: Option<u32>) -> (__m512, __m512) {
    // SAFETY: the caller guarantees the addressed range.
    unsafe {
        if W::BF16 {
            let raw = match mask {
                None => _mm512_loadu_si512(p.cast::<__m512i>()),
                Some(m) => _mm512_maskz_loadu_epi16(m, p.cast::<i16>()),
            };
            // Element 2j is the low half of 32-bit lane j, element 2j + 1 the high half.
            let even = _mm512_slli_epi32(raw, 16);
            let odd = _mm512_and_si512(raw, _mm512_set1_epi32(0xffff_0000u32 as i32));
            (_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd))
        } else {
            let p = p.cast::<f32>();
            let (lo, hi) = match mask {
                None => (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))),
                Some(m) => (
                    _mm512_maskz_loadu_ps(m as u16, p),
                    _mm512_maskz_loadu_ps((m >> 16) as u16, p.add(16)),
                ),
            };
            let even_idx =
                _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let odd_idx =
                _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            (
                _mm512_permutex2var_ps(lo, even_idx, hi),
                _mm512_permutex2var_ps(lo, odd_idx, hi),
            )
        }
    }
}
