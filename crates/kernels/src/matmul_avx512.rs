//! Small f32 matmuls on AVX-512 for the kernels that are themselves parallel over heads (the GDN chunked
//! form, prefill attention): `dst [m, n] (+)= alpha · a [m, k] · b [k, n]`, `b` with unit column stride.
//!
//! Algorithm. Register tiles of up to 4 rows x 32 columns (8 accumulators, two zmm a row, the tail columns
//! masked): per k step two loads of b's row, one broadcast of a per row, eight FMAs, so the two FMA ports
//! stay busy whatever a's layout (row- or column-major: a is read one element at a time). Each output is
//! the sum over k in order, one FMA a step, then `alpha · sum (+ dst)`.
//!
//! Invariant: an output depends only on its row of a and its column of b, in a fixed order (no split of k),
//! so the result does not depend on m, n or the tiling.

use std::arch::x86_64::*;

use crate::linear::MatView;

/// Whether this CPU runs the kernel (AVX-512 F).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

/// Rows per register tile.
const ROWS: usize = 4;
/// Columns per register tile: two zmm.
const COLS: usize = 32;

/// dst[a.rows, b.cols] (row-major, contiguous) = (accumulate ? dst : 0) + scale · a · b, for `b.cs == 1`.
///
/// # Safety
/// [`available`]; both views address only elements inside their slices (`MatView::in_bounds`), `b.cs == 1`,
/// `a.cols == b.rows` and dst holds a.rows · b.cols values.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn matmul(
    dst: &mut [f32],
    a: MatView<'_>,
    b: MatView<'_>,
    scale: f32,
    accumulate: bool,
) {
    let (m, n) = (a.rows, b.cols);
    debug_assert!(b.cs == 1 && a.cols == b.rows && dst.len() >= m * n);
    let mut j = 0;
    while j < n {
        let width = (n - j).min(COLS);
        let mut i = 0;
        while i < m {
            match (m - i).min(ROWS) {
                4 => tile::<4>(dst, a, b, i, j, width, scale, accumulate),
                3 => tile::<3>(dst, a, b, i, j, width, scale, accumulate),
                2 => tile::<2>(dst, a, b, i, j, width, scale, accumulate),
                _ => tile::<1>(dst, a, b, i, j, width, scale, accumulate),
            }
            i += ROWS;
        }
        j += COLS;
    }
}

/// Rows i..i + R, columns j..j + width (width <= 32) of dst.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize>(
    dst: &mut [f32],
    a: MatView<'_>,
    b: MatView<'_>,
    i: usize,
    j: usize,
    width: usize,
    scale: f32,
    accumulate: bool,
) {
    let n = b.cols;
    let mask = |half: usize| -> __mmask16 {
        let w = width.saturating_sub(16 * half).min(16);
        ((1u32 << w) - 1) as __mmask16
    };
    let (m0, m1) = (mask(0), mask(1));
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (ap, bp) = (a.data.as_ptr(), b.data.as_ptr());
    for p in 0..a.cols {
        let row = bp.add(p * b.rs + j);
        let b0 = _mm512_maskz_loadu_ps(m0, row);
        let b1 = _mm512_maskz_loadu_ps(m1, row.wrapping_add(16));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*ap.add((i + r) * a.rs + p * a.cs));
            acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
        }
    }
    let s = _mm512_set1_ps(scale);
    for (r, acc) in acc.iter().enumerate() {
        let out = dst.as_mut_ptr().add((i + r) * n + j);
        for (half, (&v, mk)) in acc.iter().zip([m0, m1]).enumerate() {
            if mk == 0 {
                continue;
            }
            let at = out.add(16 * half);
            let v = _mm512_mul_ps(v, s);
            let v = if accumulate {
                _mm512_add_ps(_mm512_maskz_loadu_ps(mk, at), v)
            } else {
                v
            };
            _mm512_mask_storeu_ps(at, mk, v);
        }
    }
}
