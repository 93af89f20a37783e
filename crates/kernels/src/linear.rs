//! Linear layers: `out[n, m] = x[n, k] · w[m, k]^T` (PyTorch `nn.Linear` weight layout), overwritten or
//! accumulated (`out += scale · x·w^T`).
//!
//! Two paths, chosen by the number of input rows `n`:
//! - `n <= MATVEC_MAX_ROWS` (decode, verify blocks): memory-bound. The weight rows are split into blocks
//!   over the rayon pool; each block streams its weight rows from memory exactly once, 4 rows at a time, and
//!   dots them with all `n` inputs while they sit in L1/L2, with AVX2/FMA intrinsics when the CPU has them.
//! - larger `n` (prefill): compute-bound GEMM through the `gemm` crate, which dispatches on CPU features at
//!   run time and splits the work over the rayon pool.
//!
//! Invariant: both paths compute the same products up to f32 summation order; `out` is written exactly once
//! per element (overwrite) or updated once (accumulate).

use gemm::Parallelism;
use rayon::prelude::*;

use crate::simd::{self, Isa, WeightElem};

/// Largest `n` served by the matvec path. `kbench paths` on the 2-core AVX2 development machine (Xeon, 260 MiB
/// L3, quiet), 4096x4096, GFLOP/s matvec vs gemm with 1 thread: n=1 13 vs 10, n=4 31 vs 15, n=8 33 vs 25,
/// n=16 43 vs 40, n=24 48 vs 48; with 2 threads: n=8 93 vs 52, n=16 95 vs 74, n=24 93 vs 85. Verify blocks
/// of speculative decoding (n = 1 + drafts) live in this range, so it matters; and their rows must equal
/// one-row steps bit for bit, so it covers the largest block (MTP's and DFlash's 16 proposals: 17 rows;
/// at 16 a 17-row verify took the GEMM and its rows differed from decoding's, families batch_invariance).
pub const MATVEC_MAX_ROWS: usize = 17;

/// Below this many multiply-adds the matvec runs on the calling thread: rayon's fork/join costs more.
const MATVEC_SERIAL_WORK: usize = 1 << 16;

/// What a kernel does with the value already in `out`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mode {
    /// out = result
    Overwrite,
    /// out += scale * result
    Accumulate(f32),
}

impl Mode {
    #[inline(always)]
    pub(crate) fn apply(self, old: f32, result: f32) -> f32 {
        match self {
            Mode::Overwrite => result,
            Mode::Accumulate(scale) => old + scale * result,
        }
    }
}

/// out[n, m] = x[n, k] · w[m, k]^T. Overwrites `out`.
///
/// Panics (programmer error) if a slice is shorter than its shape says.
pub fn linear(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, out: &mut [f32]) {
    linear_with_mode(x, w, n, k, m, Mode::Overwrite, out);
}

/// out[n, m] += scale · x[n, k] · w[m, k]^T — residual adds and MoE expert sums (scale = routing weight).
///
/// Panics (programmer error) if a slice is shorter than its shape says.
pub fn linear_acc(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, scale: f32, out: &mut [f32]) {
    linear_with_mode(x, w, n, k, m, Mode::Accumulate(scale), out);
}

/// [`linear`] over a bf16 matrix: the same bits as `linear` on its f32 widening, with half the weight bytes
/// read on the matvec path (decode and verify rows, memory-bound); the GEMM path widens it first.
pub fn linear_bf16(x: &[f32], w: &[half::bf16], n: usize, k: usize, m: usize, out: &mut [f32]) {
    linear_bf16_with_mode(x, w, n, k, m, Mode::Overwrite, out);
}

/// A bf16 weight matrix [m, k] laid out for the fastest CPU path: packed into AMX tiles where the CPU and
/// kernel offer AMX-BF16 (every row count then runs on the tiles, and rows are batch-invariant for any n),
/// row-major otherwise (the matvec / GEMM paths of [`linear_bf16`]).
#[derive(Clone, Debug)]
pub enum Bf16Matrix {
    RowMajor {
        w: Vec<half::bf16>,
        m: usize,
        k: usize,
    },
    #[cfg(target_arch = "x86_64")]
    Amx(crate::amx::PackedBf16),
}

impl Bf16Matrix {
    /// Takes the row-major `w` [m, k], packing it for AMX when this machine runs AMX.
    pub fn new(w: Vec<half::bf16>, m: usize, k: usize) -> Self {
        check_len("Bf16Matrix: w [m, k]", w.len(), m * k);
        #[cfg(target_arch = "x86_64")]
        if crate::amx::available() {
            return Bf16Matrix::Amx(crate::amx::PackedBf16::pack(&w, m, k));
        }
        Bf16Matrix::RowMajor { w, m, k }
    }

    /// The row-major layout even where AMX runs (tests compare the two).
    #[doc(hidden)]
    pub fn row_major(w: Vec<half::bf16>, m: usize, k: usize) -> Self {
        check_len("Bf16Matrix: w [m, k]", w.len(), m * k);
        Bf16Matrix::RowMajor { w, m, k }
    }

    /// Most input rows one call may take with every row getting the bits it gets alone: any number on
    /// AMX tiles, else the matvec path's `MATVEC_MAX_ROWS` (the GEMM above it rounds otherwise).
    pub fn batch_invariant_rows(&self) -> usize {
        match self {
            Bf16Matrix::RowMajor { .. } => MATVEC_MAX_ROWS,
            #[cfg(target_arch = "x86_64")]
            Bf16Matrix::Amx(_) => usize::MAX,
        }
    }

    /// Output rows m.
    pub fn rows(&self) -> usize {
        match self {
            Bf16Matrix::RowMajor { m, .. } => *m,
            #[cfg(target_arch = "x86_64")]
            Bf16Matrix::Amx(p) => p.rows(),
        }
    }

    /// Input columns k.
    pub fn cols(&self) -> usize {
        match self {
            Bf16Matrix::RowMajor { k, .. } => *k,
            #[cfg(target_arch = "x86_64")]
            Bf16Matrix::Amx(p) => p.cols(),
        }
    }
}

/// out[n, m] = x[n, k] · w^T for a [`Bf16Matrix`]. Overwrites `out`.
///
/// Panics (programmer error) if a slice is shorter than its shape says.
pub fn linear_bf16_matrix(x: &[f32], w: &Bf16Matrix, n: usize, out: &mut [f32]) {
    linear_bf16_matrix_rows(x, w, n, w.rows(), out);
}

/// The first `rows` outputs of [`linear_bf16_matrix`]: out[n, rows] = x[n, k] · w[..rows]^T, each with the
/// bits the full call gives it (a draft head over the first `rows` tokens of a vocabulary).
///
/// Panics (programmer error) if `rows > w.rows()` or a slice is shorter than its shape says.
pub fn linear_bf16_matrix_rows(x: &[f32], w: &Bf16Matrix, n: usize, rows: usize, out: &mut [f32]) {
    assert!(
        rows <= w.rows(),
        "linear_bf16_matrix_rows: {rows} rows of a {}-row matrix",
        w.rows()
    );
    match w {
        Bf16Matrix::RowMajor { w, k, .. } => linear_bf16(x, &w[..rows * k], n, *k, rows, out),
        #[cfg(target_arch = "x86_64")]
        Bf16Matrix::Amx(p) => {
            let k = p.cols();
            check_len("linear: x [n, k]", x.len(), n * k);
            check_len("linear: out [n, m]", out.len(), n * rows);
            crate::amx::linear(
                &x[..n * k],
                p,
                n,
                rows,
                Mode::Overwrite,
                &mut out[..n * rows],
            );
        }
    }
}

/// [`linear_acc`] over a bf16 matrix.
pub fn linear_acc_bf16(
    x: &[f32],
    w: &[half::bf16],
    n: usize,
    k: usize,
    m: usize,
    scale: f32,
    out: &mut [f32],
) {
    linear_bf16_with_mode(x, w, n, k, m, Mode::Accumulate(scale), out);
}

fn linear_bf16_with_mode(
    x: &[f32],
    w: &[half::bf16],
    n: usize,
    k: usize,
    m: usize,
    mode: Mode,
    out: &mut [f32],
) {
    check_len("linear: w [m, k]", w.len(), m * k);
    if n <= MATVEC_MAX_ROWS && n > 0 && m > 0 && k > 0 {
        check_len("linear: x [n, k]", x.len(), n * k);
        check_len("linear: out [n, m]", out.len(), n * m);
        let (x, w, out) = (&x[..n * k], &w[..m * k], &mut out[..n * m]);
        matvec(best_isa_for_matvec(), x, w, n, k, m, mode, out);
        return;
    }
    let wide: Vec<f32> = w[..m * k].iter().map(|v| v.to_f32()).collect();
    linear_with_mode(x, &wide, n, k, m, mode, out);
}

fn linear_with_mode(
    x: &[f32],
    w: &[f32],
    n: usize,
    k: usize,
    m: usize,
    mode: Mode,
    out: &mut [f32],
) {
    check_len("linear: x [n, k]", x.len(), n * k);
    check_len("linear: w [m, k]", w.len(), m * k);
    check_len("linear: out [n, m]", out.len(), n * m);
    let (x, w, out) = (&x[..n * k], &w[..m * k], &mut out[..n * m]);
    if n == 0 || m == 0 {
        return;
    }
    if k == 0 {
        // An empty sum is zero.
        out.iter_mut().for_each(|o| *o = mode.apply(*o, 0.0));
        return;
    }
    if n <= MATVEC_MAX_ROWS {
        matvec(best_isa_for_matvec(), x, w, n, k, m, mode, out);
    } else {
        gemm_linear(x, w, n, k, m, mode, out);
    }
}

/// The checks of a call computing the first `rows` of a [m, k] matrix's outputs for n inputs: rows <= m,
/// x [n, k], out [n, rows] (programmer errors: panics naming `what`).
#[track_caller]
pub(crate) fn check_rows_call(
    what: &str,
    x: usize,
    out: usize,
    n: usize,
    k: usize,
    rows: usize,
    m: usize,
) {
    assert!(rows <= m, "{what}: {rows} rows of a {m}-row matrix");
    check_len(&format!("{what}: x [n, k]"), x, n * k);
    check_len(&format!("{what}: out [n, rows]"), out, n * rows);
}

/// Panics with a clear message when a buffer is shorter than its shape: callers are our own code, so this is
/// a programmer error, and continuing would read or write out of shape.
#[inline]
#[track_caller]
pub(crate) fn check_len(what: &str, len: usize, needed: usize) {
    assert!(
        len >= needed,
        "{what}: buffer holds {len} values, shape needs {needed}"
    );
}

#[inline]
fn best_isa_for_matvec() -> Isa {
    simd::best_matvec_isa()
}

/// The GEMM path: out (n x m, row stride m) = x (n x k, row stride k) · w^T where w^T is a k x m view of w
/// (row stride 1, column stride k).
fn gemm_linear(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, mode: Mode, out: &mut [f32]) {
    let (read_dst, beta) = match mode {
        Mode::Overwrite => (false, 1.0),
        Mode::Accumulate(scale) => (true, scale),
    };
    // SAFETY: lengths were checked by the caller: x >= n*k, w >= m*k, out >= n*m, and the strides below address
    // exactly those row-major layouts. gemm computes dst := 1·dst + beta·lhs·rhs (dst not read if !read_dst).
    unsafe {
        gemm::gemm(
            n,
            m,
            k,
            out.as_mut_ptr(),
            1,
            m as isize,
            read_dst,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            1.0f32,
            beta,
            false,
            false,
            false,
            Parallelism::Rayon(0), // 0 = rayon::current_num_threads(): honours the pool we run in.
        );
    }
}

/// The matvec path for few input rows. Tasks own disjoint blocks of weight rows.
#[allow(clippy::too_many_arguments)]
fn matvec<W: WeightElem>(
    isa: Isa,
    x: &[f32],
    w: &[W],
    n: usize,
    k: usize,
    m: usize,
    mode: Mode,
    out: &mut [f32],
) {
    let rows_per_task = matvec_rows_per_task(m, k, n);
    if n == 1 {
        // out [1, m] is already [m, 1]: each task writes its slice of out directly.
        let job = |(b, out_block): (usize, &mut [f32])| {
            let first = b * rows_per_task;
            let w_block = &w[first * k..(first + out_block.len()) * k];
            matvec_block(isa, x, w_block, k, 1, mode, out_block);
        };
        if rows_per_task >= m {
            job((0, out));
        } else {
            out.par_chunks_mut(rows_per_task).enumerate().for_each(job);
        }
        return;
    }
    // results [m, n] (transposed against out), filled per weight-row block, then scattered.
    let mut results = vec![0.0f32; m * n];
    let job = |(b, res_block): (usize, &mut [f32])| {
        let first = b * rows_per_task;
        let rows = res_block.len() / n;
        let w_block = &w[first * k..(first + rows) * k];
        matvec_block(isa, x, w_block, k, n, Mode::Overwrite, res_block);
    };
    if rows_per_task >= m {
        job((0, &mut results));
    } else {
        results
            .par_chunks_mut(rows_per_task * n)
            .enumerate()
            .for_each(job);
    }
    for (j, res_row) in results.chunks_exact(n).enumerate() {
        for (i, &r) in res_row.iter().enumerate() {
            let o = &mut out[i * m + j];
            *o = mode.apply(*o, r);
        }
    }
}

/// Weight rows per rayon task: about 4 tasks per thread for balance, a multiple of 4 (the row micro-tile),
/// capped so a task reads at most ~2 MiB of weights; one task for tiny problems.
fn matvec_rows_per_task(m: usize, k: usize, n: usize) -> usize {
    if m * k * n <= MATVEC_SERIAL_WORK {
        return m;
    }
    let tasks = rayon::current_num_threads().max(1) * 4;
    let max_rows = ((1usize << 19) / k.max(1)).max(4);
    m.div_ceil(tasks)
        .next_multiple_of(4)
        .clamp(4, max_rows.next_multiple_of(4))
}

/// res[r, i] = mode(res[r, i], w_block[r] · x[i]) for all rows r of `w_block` ([rows, k]) and the `n` rows
/// of `x` ([n, k]); res is [rows, n].
///
/// Loop order: weight tiles of `WEIGHT_TILE_ROWS` rows outside, input groups inside, so each weight row is
/// read from memory once and re-read from L1/L2 for every group of inputs.
fn matvec_block<W: WeightElem>(
    isa: Isa,
    x: &[f32],
    w_block: &[W],
    k: usize,
    n: usize,
    mode: Mode,
    res: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: Avx512 is only produced after runtime detection ([`crate::matvec_avx512::available`]);
        // the block's shapes are those its callers sliced.
        unsafe { crate::matvec_avx512::matvec_block(x, w_block, k, n, mode, res) };
        return;
    }
    let rows = w_block.len() / k;
    debug_assert_eq!(res.len(), rows * n);
    let group_size = input_group_size(n);
    for (w_tile, res_tile) in w_block
        .chunks(WEIGHT_TILE_ROWS * k)
        .zip(res.chunks_mut(WEIGHT_TILE_ROWS * n))
    {
        let tile_rows_count = w_tile.len() / k;
        let mut first_input = 0;
        while first_input < n {
            let group = (n - first_input).min(group_size);
            let xg = &x[first_input * k..(first_input + group) * k];
            let args = (isa, xg, w_tile, k, tile_rows_count, n, first_input, mode);
            match group {
                1 => tile_rows::<W, 4, 1>(args, res_tile),
                2 => tile_rows::<W, 4, 2>(args, res_tile),
                3 => tile_rows::<W, 4, 3>(args, res_tile),
                _ => tile_rows::<W, 2, 4>(args, res_tile),
            }
            first_input += group;
        }
    }
}

/// Weight rows kept hot while every input group passes over them (4 rows x k = 64 KiB at k = 4096).
const WEIGHT_TILE_ROWS: usize = 4;

/// Inputs per micro-kernel pass. Up to 4 inputs go in one pass; beyond that, groups of 3 use the 4x3 tile
/// (12 accumulators + 3 inputs + 1 weight = the 16 ymm registers, no spills; 7 loads per 12 FMAs, against
/// 6 per 8 for the 2x4 tile).
fn input_group_size(n: usize) -> usize {
    if n <= 4 {
        n.max(1)
    } else {
        3
    }
}

type TileArgs<'a, W> = (Isa, &'a [f32], &'a [W], usize, usize, usize, usize, Mode);

/// Covers all `rows` weight rows with R-row micro-tiles (then single rows for the remainder) against the N
/// input rows in `xg`, writing columns first_input..first_input+N of res [rows, n_total].
#[inline]
fn tile_rows<W: WeightElem, const R: usize, const N: usize>(
    args: TileArgs<'_, W>,
    res: &mut [f32],
) {
    let (isa, xg, w_block, k, rows, n_total, first_input, mode) = args;
    let mut write = |r0: usize, vals: &[[f32; N]]| {
        for (dr, row_vals) in vals.iter().enumerate() {
            for (i, &v) in row_vals.iter().enumerate() {
                let o = &mut res[(r0 + dr) * n_total + first_input + i];
                *o = mode.apply(*o, v);
            }
        }
    };
    let mut r = 0;
    while r + R <= rows {
        let w_tile = &w_block[r * k..(r + R) * k];
        write(r, &dot_rows::<W, R, N>(isa, w_tile, xg, k));
        r += R;
    }
    while r < rows {
        let w_row = &w_block[r * k..(r + 1) * k];
        write(r, &dot_rows::<W, 1, N>(isa, w_row, xg, k));
        r += 1;
    }
}

#[inline(always)]
fn dot_rows<W: WeightElem, const R: usize, const N: usize>(
    isa: Isa,
    w: &[W],
    x: &[f32],
    k: usize,
) -> [[f32; N]; R] {
    assert!(
        w.len() >= R * k && x.len() >= N * k,
        "dot_rows: tile out of bounds"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2Fma is only produced after runtime detection of avx2 and fma; lengths asserted above.
        Isa::Avx2Fma => unsafe { simd::dot_rows_avx2::<W, R, N>(w, x, k) },
        _ => simd::dot_rows_portable::<W, R, N>(w, x, k),
    }
}

/// The matvec path on the best instruction set regardless of n (for `examples/kbench.rs`).
#[doc(hidden)]
pub fn linear_matvec(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, out: &mut [f32]) {
    check_len("linear_matvec: x [n, k]", x.len(), n * k);
    check_len("linear_matvec: w [m, k]", w.len(), m * k);
    check_len("linear_matvec: out [n, m]", out.len(), n * m);
    if n == 0 || m == 0 || k == 0 {
        return;
    }
    matvec(
        simd::best_matvec_isa(),
        &x[..n * k],
        &w[..m * k],
        n,
        k,
        m,
        Mode::Overwrite,
        &mut out[..n * m],
    );
}

/// Test hook: the matvec path forced to a given instruction set (so both are tested on an AVX2 machine).
#[cfg(test)]
pub(crate) fn linear_matvec_with_isa<W: WeightElem>(
    isa: Isa,
    x: &[f32],
    w: &[W],
    n: usize,
    k: usize,
    m: usize,
    out: &mut [f32],
) {
    matvec(isa, x, w, n, k, m, Mode::Overwrite, out);
}

/// The GEMM path regardless of n (tests, and `examples/kbench.rs` to measure the path threshold).
#[doc(hidden)]
pub fn linear_gemm(x: &[f32], w: &[f32], n: usize, k: usize, m: usize, out: &mut [f32]) {
    check_len("linear_gemm: x [n, k]", x.len(), n * k);
    check_len("linear_gemm: w [m, k]", w.len(), m * k);
    check_len("linear_gemm: out [n, m]", out.len(), n * m);
    if n == 0 || m == 0 || k == 0 {
        return;
    }
    gemm_linear(x, w, n, k, m, Mode::Overwrite, out);
}

/// A strided read-only matrix view: element (r, c) is `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatView<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatView<'a> {
    /// A row-major [rows, cols] view.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major [cols, rows] buffer, seen as [rows, cols].
    pub fn transposed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: 1,
            cs: rows,
        }
    }

    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// dst[a.rows, b.cols] (row-major, contiguous) = (accumulate ? dst : 0) + scale · a · b, on the calling thread.
/// For the small matmuls inside kernels that are themselves parallel over heads.
pub(crate) fn matmul_serial(
    dst: &mut [f32],
    a: MatView<'_>,
    b: MatView<'_>,
    scale: f32,
    accumulate: bool,
) {
    assert!(
        a.cols == b.rows,
        "matmul_serial: inner dims {} vs {}",
        a.cols,
        b.rows
    );
    assert!(
        a.in_bounds() && b.in_bounds(),
        "matmul_serial: view out of bounds"
    );
    check_len("matmul_serial: dst", dst.len(), a.rows * b.cols);
    if a.rows == 0 || b.cols == 0 {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            dst[..a.rows * b.cols].iter_mut().for_each(|v| *v = 0.0);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if b.cs == 1 && crate::matmul_avx512::available() {
        // SAFETY: AVX-512 F was detected; the views are in bounds (checked above), b has unit column
        // stride, the inner dimensions agree and dst holds rows x cols.
        unsafe { crate::matmul_avx512::matmul(dst, a, b, scale, accumulate) };
        return;
    }
    // SAFETY: both views were checked to address only elements inside their slices, dst holds rows x cols.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            dst.as_mut_ptr(),
            1,
            b.cols as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0f32,
            scale,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}
