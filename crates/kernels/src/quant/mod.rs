//! Linear layers over quantized weights kept in their blocks (ggml's Q4_0..Q8_0 and k-quants).
//!
//! Algorithm (llama.cpp's: integer dot products against an 8-bit copy of the input, chosen over widening
//! the weights to f32 lanes by `cargo bench -p kernels --bench quant`, docs/PERFORMANCE.md):
//! 1. Each input row is quantized once per call to 8 bits in blocks of 32 (`d = max|x| / 127`,
//!    `q = round(x / d)`), with per-lane (4-element) sums of `q` ([`QuantizedRows`]).
//! 2. A weight row is decoded a 64-element step at a time into unsigned integers `u` with per-lane scale
//!    `a` and term `b` (formats.rs: `w = a · (u - o) + b`). For each input row, per lane L:
//!    `isum = Σ (u - o)·q` (exact in i32; one `vpdpbusd` for all 16 lanes),
//!    `acc[L] = fma(isum · dx, a, acc[L])`, and for formats with a minimum `acc[L] = fma(b, dx · Σq, acc[L])`.
//! 3. The 16 lane accumulators are summed as a fixed tree (lanes L + L+8, then +4, +2, +1).
//!
//! Invariant (batch invariance: what keeps greedy speculation exact): an output value depends only on its
//! weight row and its own input row, through the same sequence of operations whatever the number of rows
//! in the call, the thread count or the tiling; and every instruction set computes that sequence exactly
//! (integer sums are exact, the float steps are the same IEEE operations in the same order), so the
//! AVX-512 path and the portable one give the same bits (tests/quant.rs).

mod formats;
mod quantize;

#[cfg(target_arch = "x86_64")]
mod avx512;

use rayon::prelude::*;

use formats::{decode_step, Step, LANES, STEP};
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

/// Input rows quantized to 8 bits, laid out per 64-element step for the kernels: `q` [n, kp] (zero past
/// k), and per lane of 4 elements: `dx` (the row block's scale) and `dxs` = `dx · Σq` (for formats with a
/// minimum). kp = k rounded up to 64.
pub(crate) struct QuantizedRows {
    pub kp: usize,
    pub q: Vec<i8>,
    pub dx: Vec<f32>,
    pub dxs: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes `x` [n, k] for weights of `format` (every instruction set computes the same bits).
    fn new(isa: QuantIsa, x: &[f32], n: usize, k: usize, format: QuantFormat) -> Self {
        let kp = k.next_multiple_of(STEP);
        let lanes = kp / 4;
        let mut rows = QuantizedRows {
            kp,
            q: vec![0; n * kp],
            dx: vec![0.0; n * lanes],
            dxs: vec![0.0; if format.has_min() { n * lanes } else { 0 }],
        };
        for i in 0..n {
            let xr = &x[i * k..(i + 1) * k];
            let q = &mut rows.q[i * kp..i * kp + k];
            for (b, (xb, qb)) in xr.chunks(32).zip(q.chunks_mut(32)).enumerate() {
                let d = match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: Avx512Vnni comes from runtime detection; blocks are 32 values (k is a
                    // multiple of the format's block length).
                    QuantIsa::Avx512Vnni => unsafe { avx512::quantize_block(xb, qb) },
                    QuantIsa::Portable => quantize_block(xb, qb),
                };
                for lane in 0..qb.len().div_ceil(4) {
                    let at = i * lanes + b * 8 + lane;
                    let s: i32 = qb[4 * lane..(4 * lane + 4).min(qb.len())]
                        .iter()
                        .map(|&v| v as i32)
                        .sum();
                    rows.dx[at] = d;
                    if format.has_min() {
                        rows.dxs[at] = d * s as f32;
                    }
                }
            }
        }
        rows
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

/// The instruction set of the quantized kernels on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuantIsa {
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    Portable,
}

fn best_isa() -> QuantIsa {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        return QuantIsa::Avx512Vnni;
    }
    QuantIsa::Portable
}

/// Names the quantized kernels' instruction set on this machine, for logs.
pub fn quant_simd_path() -> &'static str {
    match best_isa() {
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni => "avx512-vnni",
        QuantIsa::Portable => "portable",
    }
}

/// out[n, m] = x[n, k] · w^T. Overwrites `out`. Every row count takes the same path (batch-invariant).
///
/// Panics (programmer error) if a slice is shorter than its shape says.
pub fn linear_quant(x: &[f32], w: &QuantMatrix, n: usize, out: &mut [f32]) {
    linear_quant_rows(x, w, n, w.rows(), out);
}

/// The first `rows` outputs of [`linear_quant`] (bit for bit): out[n, rows].
pub fn linear_quant_rows(x: &[f32], w: &QuantMatrix, n: usize, rows: usize, out: &mut [f32]) {
    linear_quant_with(best_isa(), x, w, n, rows, out);
}

/// [`linear_quant`] on the portable path whatever the CPU (tests compare the paths).
#[doc(hidden)]
pub fn linear_quant_portable(x: &[f32], w: &QuantMatrix, n: usize, out: &mut [f32]) {
    linear_quant_with(QuantIsa::Portable, x, w, n, w.rows(), out);
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
    assert!(
        rows <= w.m,
        "linear_quant: {rows} rows of a {}-row matrix",
        w.m
    );
    crate::linear::check_len("linear_quant: x [n, k]", x.len(), n * k);
    crate::linear::check_len("linear_quant: out [n, rows]", out.len(), n * rows);
    if n == 0 || rows == 0 {
        return;
    }
    let xq = QuantizedRows::new(isa, &x[..n * k], n, k, w.format);
    let per_task = rows_per_task(rows, w.format.row_bytes(k), n);
    // results [rows, n]: each task fills its block of weight rows for every input row.
    let mut results = vec![0f32; rows * n];
    let job = |(t, res): (usize, &mut [f32])| dot_block(isa, w, t * per_task, &xq, res);
    if per_task >= rows {
        job((0, &mut results));
    } else {
        results
            .par_chunks_mut(per_task * n)
            .enumerate()
            .for_each(job);
    }
    for (j, res_row) in results.chunks_exact(n).enumerate() {
        for (i, &v) in res_row.iter().enumerate() {
            out[i * rows + j] = v;
        }
    }
}

/// Weight rows per rayon task: ~4 tasks per thread, at most ~1 MiB of weights each; one task when the
/// whole product is small (fork/join would cost more).
fn rows_per_task(rows: usize, row_bytes: usize, n: usize) -> usize {
    if rows * row_bytes * n <= 1 << 15 {
        return rows;
    }
    let tasks = rayon::current_num_threads().max(1) * 4;
    rows.div_ceil(tasks)
        .clamp(1, ((1usize << 20) / row_bytes.max(1)).max(1))
}

/// res[r, i] = w[first + r] · x[i] for the block's rows ([rows, n]).
fn dot_block(isa: QuantIsa, w: &QuantMatrix, first: usize, xq: &QuantizedRows, res: &mut [f32]) {
    let n = xq.q.len() / xq.kp;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx512Vnni comes from runtime detection (`avx512::available`); the block's rows lie in
        // `w` and `xq` holds the n input rows `res` has columns for.
        QuantIsa::Avx512Vnni => unsafe { avx512::dot_block(w, first, res.len() / n, xq, res) },
        QuantIsa::Portable => {
            for (j, res_row) in res.chunks_exact_mut(n).enumerate() {
                dot_row_portable(w.format, w.row(first + j), w.k, xq, res_row);
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
    let kp = xq.kp;
    let lanes = kp / 4;
    let o = format.offset();
    let mut step = Step::zero();
    let mut acc = vec![[0f32; LANES]; res.len()];
    for s in 0..kp / STEP {
        decode_step(format, row, k, s, &mut step);
        for (i, acc) in acc.iter_mut().enumerate() {
            let q = &xq.q[i * kp + s * STEP..i * kp + s * STEP + STEP];
            let at = i * lanes + s * LANES;
            for l in 0..LANES {
                let mut isum = 0i32;
                for e in 4 * l..4 * l + 4 {
                    isum += (step.u[e] as i32 - o) * q[e] as i32;
                }
                let t = isum as f32 * xq.dx[at + l];
                acc[l] = t.mul_add(step.a[l], acc[l]);
                if format.has_min() {
                    acc[l] = step.b[l].mul_add(xq.dxs[at + l], acc[l]);
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
