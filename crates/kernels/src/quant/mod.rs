//! Linear layers over quantized weights kept in their blocks (ggml's Q4_0..Q8_0 and k-quants).
//!
//! Algorithm (llama.cpp's: integer dot products against an 8-bit copy of the input):
//! 1. Each input row is quantized once per call to 8 bits in blocks of 32 (`d = max|x| / 127`,
//!    `q = round(x / d)`), with per lane of 4 elements `dx = d` and `init = -o · Σq`, and per block
//!    `dxs = d · Σq` ([`QuantizedRows`]).
//! 2. A weight row is decoded in 256-element chunks (formats.rs): the chunk's scales once (`v`: per
//!    32-element sub-block a scale `a` and, for formats with a minimum, a term `b`), then its four 64-element
//!    steps into unsigned integers `u` (`w = a · (u - o) + b`). For each input row, per step and lane L
//!    (16 lanes of 4 elements): `isum = init[L] + Σ u·q` (= `Σ (u - o)·q`, exact in i32; one `vpdpbusd`
//!    for all 16 lanes), `acc[L] = fma(isum · dx[L], a[L], acc[L])`; after each chunk, for formats with a
//!    minimum, the terms of its 8 sub-blocks j: `acc[8 + j] = fma(b_j, dxs_j, acc[8 + j])`.
//! 3. The 16 lane accumulators are summed as a fixed tree (lanes L + L+8, then +4, +2, +1).
//!
//! Paths, chosen at run time in this order: AVX-512 VNNI (avx512.rs), AVX2+FMA (avx2.rs), portable (the
//! reference, [`dot_row_portable`]).
//!
//! Invariant (batch invariance: what keeps greedy speculation exact): an output value depends only on its
//! weight row and its own input row, through the same sequence of operations whatever the number of rows
//! in the call, the thread count or the tiling; and every instruction set computes that sequence exactly
//! (integer sums are exact, the float steps are the same IEEE operations in the same order), so every
//! path gives the portable one's bits (tests/quant.rs compares each path this CPU runs).

mod formats;
mod quantize;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use rayon::prelude::*;

use formats::{decode_chunk, decode_step, lane_scale, CHUNK_STEPS, LANES, STEP};
pub use formats::{dequantize_row, QuantFormat};
pub use quantize::{quantize_matrix, quantize_row};

/// A quantized weight matrix [m, k]: `m` rows of [`QuantFormat::row_bytes`]`(k)` bytes, in ggml's layout.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    format: QuantFormat,
    m: usize,
    k: usize,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// Most input rows one call gives the bits each row gets alone: [`MATVEC_MAX_ROWS`](crate::MATVEC_MAX_ROWS)
    /// where AMX runs (more rows are a prefill: the weights, rounded to bf16, on AMX tiles against the
    /// f32 inputs; about the decode kernels' error, several times their speed), else any number.
    pub fn batch_invariant_rows(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        if prefill_on_tiles() {
            return crate::MATVEC_MAX_ROWS;
        }
        usize::MAX
    }

    /// Takes `data` (m rows of ggml blocks); an error names what does not fit.
    pub fn new(format: QuantFormat, data: Vec<u8>, m: usize, k: usize) -> Result<Self, String> {
        if k == 0 || !k.is_multiple_of(format.block_len()) {
            return Err(format!(
                "{} rows of {k} elements: not a multiple of its {}-element blocks",
                format.name(),
                format.block_len()
            ));
        }
        let need = m.checked_mul(format.row_bytes(k));
        if need != Some(data.len()) {
            return Err(format!(
                "{} matrix [{m}, {k}] needs {} bytes, got {}",
                format.name(),
                need.map_or("more than usize".into(), |n| n.to_string()),
                data.len()
            ));
        }
        Ok(QuantMatrix { format, m, k, data })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output rows m.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Input columns k.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Stored bytes.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The blocks, row after row (ggml's layout).
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    pub(crate) fn row(&self, r: usize) -> &[u8] {
        let rb = self.format.row_bytes(self.k);
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Row `r` as f32 (ggml's dequantized values): embedding lookups.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        crate::linear::check_len("QuantMatrix::dequantize_row: out", out.len(), self.k);
        dequantize_row(self.format, self.row(r), self.k, &mut out[..self.k]);
    }
}

/// Input rows quantized to 8 bits, laid out per 64-element step for the kernels (kp = k rounded up to 64,
/// zero past k): `q` [n, kp]; per lane of 4 elements, `dx` [n, kp / 4] (the row block's scale) and `init`
/// [n, kp / 4] = `-o · Σq` (for the format's offset `o`, so that `init + Σ u · q = Σ (u - o) · q`); per
/// 32-element block, `dxs` [n, 8 · chunks] = `dx · Σq` (used by formats with a minimum). Rows start
/// 64-byte aligned.
pub(crate) struct QuantizedRows {
    pub n: usize,
    pub kp: usize,
    pub chunks: usize,
    pub q: Aligned<i8>,
    pub dx: Aligned<f32>,
    pub init: Aligned<i32>,
    pub dxs: Aligned<f32>,
}

impl QuantizedRows {
    /// Quantizes `x` [n, k] for weights of `format` (every instruction set computes the same bits, and
    /// each row's values depend on that row only).
    fn new(isa: QuantIsa, x: &[f32], n: usize, k: usize, format: QuantFormat) -> Self {
        let kp = k.next_multiple_of(STEP);
        let chunks = (kp / STEP).div_ceil(CHUNK_STEPS);
        let lanes = kp / 4;
        let mut rows = QuantizedRows {
            n,
            kp,
            chunks,
            q: Aligned::new(n * kp),
            dx: Aligned::new(n * lanes),
            init: Aligned::new(n * lanes),
            dxs: Aligned::new(n * 8 * chunks),
        };
        let o = format.offset();
        let one = |((((q, dx), init), dxs), x): (RowBufs, &[f32])| {
            let (q, dx, init, dxs) = (
                &mut q[..k],
                &mut dx[..k / 4],
                &mut init[..k / 4],
                &mut dxs[..k / 32],
            );
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the ISA comes from runtime detection; the slices hold k, k / 4, k / 4, k / 32
                // values, k a multiple of 32 (the format's block length).
                QuantIsa::Avx512Vnni => unsafe { avx512::quantize_row(x, o, q, dx, init, dxs) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                QuantIsa::Avx2 => unsafe { avx2::quantize_row(x, o, q, dx, init, dxs) },
                QuantIsa::Portable => quantize_input_row(x, o, q, dx, init, dxs),
            }
        };
        let parts = rows.q.chunks_mut(kp).zip(rows.dx.chunks_mut(lanes));
        let parts = parts
            .zip(rows.init.chunks_mut(lanes))
            .zip(rows.dxs.chunks_mut(8 * chunks));
        if n >= 4 && n * k >= 1 << 15 && rayon::current_num_threads() > 1 {
            let parts = rows.q.par_chunks_mut(kp).zip(rows.dx.par_chunks_mut(lanes));
            let parts = parts
                .zip(rows.init.par_chunks_mut(lanes))
                .zip(rows.dxs.par_chunks_mut(8 * chunks));
            parts.zip(x.par_chunks_exact(k)).for_each(one);
        } else {
            parts.zip(x.chunks_exact(k)).for_each(one);
        }
        rows
    }
}

/// One row's `q`, `dx`, `init`, `dxs`, as the zipped chunks come.
type RowBufs<'a> = (
    ((&'a mut [i8], &'a mut [f32]), &'a mut [i32]),
    &'a mut [f32],
);

/// One input row `x` [k] (k a multiple of 32) into `q` [k], `dx`, `init` [k / 4], `dxs` [k / 32]: the
/// reference the instruction-set paths reproduce (integer sums are exact; dxs is one rounded product).
fn quantize_input_row(
    x: &[f32],
    o: i32,
    q: &mut [i8],
    dx: &mut [f32],
    init: &mut [i32],
    dxs: &mut [f32],
) {
    let blocks = x.chunks_exact(32).zip(q.chunks_exact_mut(32));
    let lanes = dx.chunks_exact_mut(8).zip(init.chunks_exact_mut(8));
    for (((xb, qb), (dxb, initb)), dxs) in blocks.zip(lanes).zip(dxs) {
        let d = quantize_block(xb, qb);
        dxb.fill(d);
        let mut sum = 0i32;
        for (init, ql) in initb.iter_mut().zip(qb.chunks_exact(4)) {
            let s = ql.iter().map(|&v| v as i32).sum::<i32>();
            *init = -o * s;
            sum += s;
        }
        *dxs = d * sum as f32;
    }
}

/// A zeroed buffer of `T` (i8, i32, f32: any bit pattern valid) starting on a 64-byte boundary.
pub(crate) struct Aligned<T> {
    buf: Vec<Line>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl<T: Copy> Aligned<T> {
    fn new(len: usize) -> Self {
        let lines = (len * std::mem::size_of::<T>()).div_ceil(64);
        Aligned {
            buf: vec![Line([0; 64]); lines],
            len,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `buf` holds at least `len` T (zero bytes are a valid T for the types used), aligned to 64.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const T, self.len) }
    }
}

impl<T> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr() as *mut T, self.len) }
    }
}

/// Rounds half to even by the 1.5 · 2^23 shift (exact for |v| < 2^22): `(v + ROUND) - ROUND`.
const ROUND: f32 = 12_582_912.0;

/// One block of 32 inputs to 8 bits: returns `d = max|x| / 127`, writes `q = round(x / d)` (as `x · (1/d)`).
fn quantize_block(xb: &[f32], q: &mut [i8]) -> f32 {
    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(xb) {
        *q = ((v * id + ROUND) - ROUND) as i8;
    }
    d
}

/// The instruction set of the quantized kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QuantIsa {
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl QuantIsa {
    /// The instruction sets this CPU runs, best first.
    fn available() -> Vec<QuantIsa> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if avx512::available() {
                all.push(QuantIsa::Avx512Vnni);
            }
            if avx2::available() {
                all.push(QuantIsa::Avx2);
            }
        }
        all.push(QuantIsa::Portable);
        all
    }

    fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512Vnni => "avx512-vnni",
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx2 => "avx2",
            QuantIsa::Portable => "portable",
        }
    }
}

/// Whether prefills (more than `MATVEC_MAX_ROWS` rows) run on AMX tiles: AMX-BF16 and the AVX-512
/// decoding (VNNI, BF16, F16C) on this CPU.
#[cfg(target_arch = "x86_64")]
fn prefill_on_tiles() -> bool {
    crate::amx::available() && avx512::available()
}

fn best_isa() -> QuantIsa {
    static BEST: std::sync::OnceLock<QuantIsa> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| QuantIsa::available()[0])
}

/// Names the quantized kernels' instruction set on this machine, for logs.
pub fn quant_simd_path() -> &'static str {
    best_isa().name()
}

/// Every instruction-set path of the quantized kernels this CPU runs, best first (tests and benchmarks
/// compare them with [`linear_quant_path`]).
#[doc(hidden)]
pub fn quant_simd_paths() -> Vec<&'static str> {
    QuantIsa::available()
        .into_iter()
        .map(QuantIsa::name)
        .collect()
}

/// out[n, m] = x[n, k] · w^T. Overwrites `out`. Up to [`QuantMatrix::batch_invariant_rows`] rows, each row
/// gets the bits it gets alone; more rows (a prefill) may run on AMX tiles.
///
/// Panics (programmer error) if a slice is shorter than its shape says.
pub fn linear_quant(x: &[f32], w: &QuantMatrix, n: usize, out: &mut [f32]) {
    linear_quant_rows(x, w, n, w.rows(), out);
}

/// The first `rows` outputs of [`linear_quant`] (bit for bit): out[n, rows].
pub fn linear_quant_rows(x: &[f32], w: &QuantMatrix, n: usize, rows: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if n > w.batch_invariant_rows() {
        crate::linear::check_rows_call("linear_quant", x.len(), out.len(), n, w.k, rows, w.m);
        // SAFETY: batch_invariant_rows() is finite only where AMX and the AVX-512 decoding run; each
        // call asks for at most 64 rows inside the matrix, and the tiles hold a whole group.
        let fill = |first: usize, count: usize, tiles: &mut [u16]| unsafe {
            avx512::dequantize_tiles(w, first, count, tiles)
        };
        let (x, out) = (&x[..n * w.k], &mut out[..n * rows]);
        let (mode, inputs) = (crate::linear::Mode::Overwrite, crate::amx::Inputs::Bf16);
        crate::amx::linear_decoded(x, n, rows, w.k, mode, inputs, None, out, &fill);
        return;
    }
    linear_quant_with(best_isa(), x, w, n, rows, out);
}

/// [`linear_quant`] on the portable path whatever the CPU (tests compare the paths).
#[doc(hidden)]
pub fn linear_quant_portable(x: &[f32], w: &QuantMatrix, n: usize, out: &mut [f32]) {
    linear_quant_with(QuantIsa::Portable, x, w, n, w.rows(), out);
}

/// [`linear_quant_rows`] on the named path of [`quant_simd_paths`]. Panics if this CPU lacks it.
#[doc(hidden)]
pub fn linear_quant_path(
    path: &str,
    x: &[f32],
    w: &QuantMatrix,
    n: usize,
    rows: usize,
    out: &mut [f32],
) {
    let isa = QuantIsa::available()
        .into_iter()
        .find(|i| i.name() == path)
        .unwrap_or_else(|| panic!("linear_quant_path: no {path} path on this CPU"));
    linear_quant_with(isa, x, w, n, rows, out);
}

fn linear_quant_with(
    isa: QuantIsa,
    x: &[f32],
    w: &QuantMatrix,
    n: usize,
    rows: usize,
    out: &mut [f32],
) {
    let k = w.k;
    crate::linear::check_rows_call("linear_quant", x.len(), out.len(), n, k, rows, w.m);
    if n == 0 || rows == 0 {
        return;
    }
    let xq = QuantizedRows::new(isa, &x[..n * k], n, k, w.format);
    let per_task = rows_per_task(rows, w.format.row_bytes(k), n);
    let out = Out {
        ptr: out.as_mut_ptr(),
        rows,
    };
    // Each task writes the outputs of its own weight rows (disjoint elements of out).
    let job = |t: usize| {
        let first = t * per_task;
        dot_block(isa, w, first, per_task.min(rows - first), &xq, out);
    };
    if per_task >= rows {
        job(0);
    } else {
        (0..rows.div_ceil(per_task)).into_par_iter().for_each(job);
    }
}

/// out[n, rows] as the tasks write it: element (i, j) at `ptr[i * rows + j]`.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    ptr: *mut f32,
    rows: usize,
}

// SAFETY: tasks write disjoint elements (their own weight rows j) of a buffer that outlives them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The rows of `out` [n, rows] as tasks write them.
    pub(crate) fn new(out: &mut [f32], rows: usize) -> Self {
        Out {
            ptr: out.as_mut_ptr(),
            rows,
        }
    }

    /// # Safety
    /// `i < n`, `j < rows` of the buffer, and no other thread accesses element (i, j).
    #[inline(always)]
    pub(crate) unsafe fn set(self, i: usize, j: usize, v: f32) {
        *self.ptr.add(i * self.rows + j) = v;
    }
}

/// Weight rows per rayon task: ~4 tasks per thread, at most ~1 MiB of weights each, a multiple of 4 rows
/// (the one-input micro-tile); one task when the whole product is small (fork/join would cost more).
pub(crate) fn rows_per_task(rows: usize, row_bytes: usize, n: usize) -> usize {
    if rows * row_bytes * n <= 1 << 15 {
        return rows;
    }
    let tasks = rayon::current_num_threads().max(1) * 4;
    rows.div_ceil(tasks)
        .clamp(1, ((1usize << 20) / row_bytes.max(1)).max(1))
        .next_multiple_of(4)
}

/// out[i, j] = w[j] · x[i] for the weight rows j of `first..first + rows` (within out's rows).
fn dot_block(
    isa: QuantIsa,
    w: &QuantMatrix,
    first: usize,
    rows: usize,
    xq: &QuantizedRows,
    out: Out,
) {
    assert!(
        first + rows <= out.rows.min(w.m),
        "quant: rows outside the matrix"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA comes from runtime detection; the block's rows lie in `w` and in out (checked
        // above), whose n rows `xq` holds; this task alone writes these rows' outputs.
        QuantIsa::Avx512Vnni => unsafe { avx512::dot_block(w, first, rows, xq, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        QuantIsa::Avx2 => unsafe { avx2::dot_block(w, first, rows, xq, out) },
        QuantIsa::Portable => {
            let mut res = vec![0f32; xq.n];
            for j in first..first + rows {
                dot_row_portable(w.format, w.row(j), w.k, xq, &mut res);
                for (i, &v) in res.iter().enumerate() {
                    // SAFETY: i < n, j < rows (checked above); this task alone writes row j's outputs.
                    unsafe { out.set(i, j, v) };
                }
            }
        }
    }
}

/// The reference sequence of operations (module doc), one lane at a time.
#[allow(clippy::needless_range_loop)] // lanes index several arrays in step
fn dot_row_portable(
    format: QuantFormat,
    row: &[u8],
    k: usize,
    xq: &QuantizedRows,
    res: &mut [f32],
) {
    let (kp, lanes, o) = (xq.kp, xq.kp / 4, format.offset());
    let (mut v, mut u) = ([0f32; 16], [0u8; STEP]);
    let mut acc = vec![[0f32; LANES]; res.len()];
    for s in 0..kp / STEP {
        let (ch, c) = (s / CHUNK_STEPS, s % CHUNK_STEPS);
        if c == 0 {
            decode_chunk(format, row, k, ch, &mut v);
        }
        decode_step(format, row, k, s, &mut u);
        for (i, acc) in acc.iter_mut().enumerate() {
            let q = &xq.q[i * kp + s * STEP..i * kp + s * STEP + STEP];
            let at = i * lanes + s * LANES;
            for l in 0..LANES {
                let mut isum = if o != 0 { xq.init[at + l] } else { 0 };
                for e in 4 * l..4 * l + 4 {
                    isum += u[e] as i32 * q[e] as i32;
                }
                let t = isum as f32 * xq.dx[at + l];
                acc[l] = t.mul_add(v[lane_scale(format, c, l)], acc[l]);
            }
        }
        let last = s + 1 == kp / STEP;
        if format.has_min() && (c + 1 == CHUNK_STEPS || last) {
            for (i, acc) in acc.iter_mut().enumerate() {
                let dxs = &xq.dxs[(i * xq.chunks + ch) * 8..][..8];
                for j in 0..8 {
                    acc[8 + j] = v[8 + j].mul_add(dxs[j], acc[8 + j]);
                }
            }
        }
    }
    for (r, acc) in res.iter_mut().zip(&acc) {
        *r = reduce_lanes(acc);
    }
}

/// The fixed summation tree of the 16 lane accumulators (the AVX-512 path's order).
#[inline]
fn reduce_lanes(acc: &[f32; LANES]) -> f32 {
    let mut v = *acc;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}
