//! Kernel self-test on the device (or the kernel simulator): each operation of the forward pass on small
//! random inputs against an independent host reference (f64 sums, or the CPU engine's f32 kernels from
//! `crates/kernels`), so that a wrong model output can be traced to one kernel, plus the batch
//! invariance speculative decoding relies on, bit for bit: a row computed in a block of rows equals the
//! same row computed alone (GEMV plain / norm-fused / SwiGLU, staged or not; attention at its own
//! position; GDN rows in one launch or one by one, split over column blocks or not; MoE blocks).
//! Shapes include the awkward cases: widths not a multiple of the vector width, more rows than one GEMV
//! launch, matrices with few rows (several warps per row), query heads not a multiple of 4 per KV head,
//! head_dim below a warp, keys spanning many chunks, and more value columns than one GDN warp.
//! Tensor-core attention (prefill passes only) is checked against split-K to bf16 rounding. Segments
//! (one persistent kernel per run of one-row GEMVs) must equal the per-GEMV launches bit for bit.

mod attention_tc;
mod gdn_chunk;
mod linear;
mod mixers;
mod moe;
mod quant;
mod segment;

use cuda_backend::lab::{dtoh, DBuf};
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

/// One self-test line: what, the worst error (relative to the reference's scale), and the bound.
#[derive(Clone, Debug)]
pub struct SelfTestRow {
    pub what: String,
    pub error: f64,
    pub bound: f64,
}

impl SelfTestRow {
    pub fn ok(&self) -> bool {
        self.error <= self.bound
    }
}

pub(crate) struct Rng(u64);

impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// max |a - b| / max(max |b|, tiny).
pub(crate) fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(1e-30f64, |m, &x| m.max(x.abs() as f64));
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            ((x as f64 - y as f64).abs() / scale).max(if x.is_nan() { 1e30 } else { 0.0 })
        })
        .fold(0.0, f64::max)
}

pub(crate) fn download(dev: &CudaDevice, buf: &DBuf, n: usize) -> Result<Vec<f32>, CudaError> {
    let mut v = vec![0.0f32; n];
    dtoh(dev, &mut v, buf.ptr)?;
    Ok(v)
}

pub(crate) fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

/// Runs every check; never stops at the first failure.
pub fn self_test(dev: &CudaDevice) -> Result<Vec<SelfTestRow>, CudaError> {
    let mut rows = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    linear::checks(dev, &mut rng, &mut rows)?;
    mixers::checks(dev, &mut rng, &mut rows)?;
    gdn_chunk::checks(dev, &mut rng, &mut rows)?;
    attention_tc::checks(dev, &mut rng, &mut rows)?;
    moe::checks(dev, &mut rng, &mut rows)?;
    quant::checks(dev, &mut rng, &mut rows)?;
    segment::checks(dev, &mut rng, &mut rows)?;
    Ok(rows)
}

/// Only the chunked GDN checks (gdn_chunk.rs; also part of [`self_test`]).
pub fn self_test_gdn_chunked(dev: &CudaDevice) -> Result<Vec<SelfTestRow>, CudaError> {
    let mut rows = Vec::new();
    gdn_chunk::checks(dev, &mut Rng(0x2545_F491_4F6C_DD1D), &mut rows)?;
    Ok(rows)
}

/// Only the quantized-matrix checks (quant.rs; also part of [`self_test`]).
pub fn self_test_quant(dev: &CudaDevice) -> Result<Vec<SelfTestRow>, CudaError> {
    let mut rows = Vec::new();
    quant::checks(dev, &mut Rng(0x3C6E_F372_FE94_F82B), &mut rows)?;
    Ok(rows)
}

/// Only the segment checks (segment.rs; also part of [`self_test`]).
pub fn self_test_segments(dev: &CudaDevice) -> Result<Vec<SelfTestRow>, CudaError> {
    let mut rows = Vec::new();
    segment::checks(dev, &mut Rng(0x9E37_79B9_7F4A_7C15), &mut rows)?;
    Ok(rows)
}

/// Whether two results are the same bits.
pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A bitwise check as a row (error 0 when equal, 1 otherwise; bound 0).
pub(crate) fn bitwise_row(what: String, equal: bool) -> SelfTestRow {
    SelfTestRow {
        what,
        error: if equal { 0.0 } else { 1.0 },
        bound: 0.0,
    }
}
