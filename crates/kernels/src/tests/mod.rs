//! Parity tests of every kernel against independent naive references written from the math in the module
//! docs (in f64), and against hand-computed values. Both SIMD paths are exercised on AVX2 machines.

mod attention;
mod conv;
mod elementwise;
mod fp8;
mod gdn;
mod linear;
mod norm;
mod quant;
mod quantize;
mod rope;

use crate::simd::Isa;

/// Deterministic SplitMix64 generator for test inputs.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.uniform()).collect()
    }
}

/// The instruction sets available here: always the portable one, plus AVX2/FMA when the CPU has it.
pub(crate) fn isas() -> Vec<Isa> {
    let mut all = vec![Isa::Portable];
    if crate::simd::best_isa() == Isa::Avx2Fma {
        all.push(Isa::Avx2Fma);
    }
    all
}

/// The matvec path's instruction sets available here: [`isas`] plus AVX-512 when the CPU has it.
pub(crate) fn matvec_isas() -> Vec<Isa> {
    let mut all = isas();
    if crate::simd::best_matvec_isa() == Isa::Avx512 {
        all.push(Isa::Avx512);
    }
    all
}

/// Largest |a - b| divided by the largest |b| (1 if b is all zero): "relative error" of a whole tensor.
pub(crate) fn rel_err(actual: &[f32], expected: &[f64]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    let scale = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let diff = actual
        .iter()
        .zip(expected)
        .fold(0.0f64, |m, (&a, &e)| m.max((a as f64 - e).abs()));
    diff / if scale > 0.0 { scale } else { 1.0 }
}

/// Asserts every element is within `tol` relative to the tensor's largest magnitude.
#[track_caller]
pub(crate) fn assert_close(actual: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert!(
        actual.iter().all(|v| v.is_finite()),
        "{what}: non-finite output"
    );
    let err = rel_err(actual, expected);
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e}");
}

pub(crate) fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// `out` [n, m] (a call's outputs) has the bits of the same call on a 3-thread pool (`full`), and its first
/// `rows` columns those of the prefix call (`prefix(rows, dst)` writing [n, rows]).
pub(crate) fn assert_prefix_and_threads_keep_bits(
    out: &[f32],
    n: usize,
    m: usize,
    rows: usize,
    full: impl Fn(&mut [f32]) + Send + Sync,
    prefix: impl Fn(usize, &mut [f32]),
    what: &str,
) {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut threaded = vec![0f32; n * m];
    pool.install(|| full(&mut threaded));
    assert_eq!(bits(&threaded), bits(out), "{what}: threads");
    let mut first = vec![0f32; n * rows];
    prefix(rows, &mut first);
    for i in 0..n {
        assert_eq!(
            bits(&first[i * rows..(i + 1) * rows]),
            bits(&out[i * m..i * m + rows]),
            "{what}: first {rows} rows of input {i}"
        );
    }
}
