//! Runtime CPU-feature dispatch and the small vector primitives the kernels share.
//!
//! The binary is built for the baseline target (no `target-cpu=native`: it is carried to other machines), so
//! wide instructions are chosen at run time. Two mechanisms are used:
//! - explicit AVX2/FMA intrinsics for the memory-bound matvec inner loop ([`dot_rows_avx2`]);
//! - "multiversioning": a kernel body written with 8-lane array accumulators is marked `#[inline(always)]`
//!   and instantiated twice, once inside a `#[target_feature(enable = "avx2,fma")]` wrapper (LLVM turns each
//!   8-lane array into one ymm register) and once plainly (SSE2 on x86_64, NEON on aarch64).
//!
//! Invariant: every path computes the same sums up to f32 reassociation; the lane order of a reduction is
//! fixed (lane-wise partial sums, a pairwise horizontal sum, then the tail) so a given path is deterministic.

/// The instruction set a kernel runs with, decided once per call from the running CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// x86_64 with AVX-512 F/BW/VL: the matvec path only ([`crate::matvec_avx512`]); the other kernels run
    /// their AVX2/FMA versions on such CPUs ([`best_isa`] never returns it).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    /// x86_64 with AVX2 and FMA.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2Fma,
    /// Baseline code for the target (SSE2 on x86_64, NEON on aarch64, scalar elsewhere).
    Portable,
}

/// The fastest instruction set supported by this CPU. `is_x86_feature_detected!` caches its answer.
#[inline]
pub(crate) fn best_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx2Fma;
        }
    }
    Isa::Portable
}

/// The fastest instruction set of the matvec path (decode and verify rows) on this CPU.
#[inline]
pub(crate) fn best_matvec_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::matvec_avx512::available() {
            return Isa::Avx512;
        }
    }
    best_isa()
}

/// Names the instruction sets the CPU kernels use on this machine, for logs: AMX tiles for bf16 layers
/// where the CPU and kernel offer them, the matvec's AVX-512 or AVX2, the other kernels' AVX2 or portable code.
pub fn simd_path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if crate::amx::available() {
        return "amx-bf16 tiles for bf16 layers, avx512 matvec, avx2+fma";
    }
    match (best_matvec_isa(), best_isa()) {
        (Isa::Avx512, _) => "avx512 matvec, avx2+fma",
        (_, Isa::Avx2Fma) => "avx2+fma",
        _ => "portable",
    }
}

/// Lane count of the portable accumulators: one ymm register of f32.
pub(crate) const LANES: usize = 8;

/// Sums 8 partial sums pairwise (fixed order, so results are reproducible).
#[inline(always)]
pub(crate) fn reduce_lanes(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// A weight element the matvec path reads: f32, or bf16 widened on load (exactly: bf16 -> f32 is a 16-bit
/// shift), so a bf16-stored matrix gives the same bits as its f32 copy at half the memory traffic.
pub trait WeightElem: Copy + Send + Sync + 'static {
    /// bf16: the AVX2 path widens 8 values with a zero-extend and a shift instead of a plain load.
    const BF16: bool;
    fn to_f32(self) -> f32;
}

impl WeightElem for f32 {
    const BF16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl WeightElem for half::bf16 {
    const BF16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// a · b over min(len) elements. Four 8-lane partial sums (32 in all) so a 128-long dot is a chain of 4
/// dependent vector adds, not 16: attention's q·k and similar short dots are latency-bound otherwise.
/// Weights are widened element by element, so a bf16 row gives the same sum as its f32 copy.
#[inline(always)]
pub(crate) fn dot<W: WeightElem>(a: &[W], b: &[f32]) -> f32 {
    const WIDE: usize = 4 * LANES;
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [0.0f32; WIDE];
    let mut a_chunks = a.chunks_exact(WIDE);
    let mut b_chunks = b.chunks_exact(WIDE);
    for (ca, cb) in (&mut a_chunks).zip(&mut b_chunks) {
        for l in 0..WIDE {
            acc[l] += ca[l].to_f32() * cb[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in a_chunks.remainder().iter().zip(b_chunks.remainder()) {
        tail += x.to_f32() * y;
    }
    let mut lanes = [0.0f32; LANES];
    for (l, v) in lanes.iter_mut().enumerate() {
        *v = (acc[l] + acc[l + LANES]) + (acc[l + 2 * LANES] + acc[l + 3 * LANES]);
    }
    reduce_lanes(lanes) + tail
}

/// y += alpha * x over min(len) elements.
#[inline(always)]
pub(crate) fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += alpha * xv;
    }
}

/// x *= s.
#[inline(always)]
pub(crate) fn scale_inplace(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// Dot products of `R` weight rows with `N` input rows, all of length `k`, portable version.
/// `w` holds at least `R * k` values ([R, k]), `x` at least `N * k` ([N, k]); returns [R][N].
#[inline(always)]
pub(crate) fn dot_rows_portable<W: WeightElem, const R: usize, const N: usize>(
    w: &[W],
    x: &[f32],
    k: usize,
) -> [[f32; N]; R] {
    let mut out = [[0.0f32; N]; R];
    for (r, out_r) in out.iter_mut().enumerate() {
        let w_row = &w[r * k..(r + 1) * k];
        for (i, o) in out_r.iter_mut().enumerate() {
            *o = dot(w_row, &x[i * k..(i + 1) * k]);
        }
    }
    out
}

/// AVX2/FMA version of [`dot_rows_portable`]: streams each weight row once and keeps `R * N` ymm accumulators,
/// so every loaded weight vector is used `N` times and every input vector `R` times.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `w.len() >= R * k` and `x.len() >= N * k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn dot_rows_avx2<W: WeightElem, const R: usize, const N: usize>(
    w: &[W],
    x: &[f32],
    k: usize,
) -> [[f32; N]; R] {
    use std::arch::x86_64::*;
    debug_assert!(w.len() >= R * k && x.len() >= N * k);
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    let body = k - k % LANES;
    let mut c = 0;
    while c < body {
        let mut xv = [_mm256_setzero_ps(); N];
        for (i, v) in xv.iter_mut().enumerate() {
            // SAFETY: i * k + c + 8 <= N * k <= x.len().
            *v = unsafe { _mm256_loadu_ps(xp.add(i * k + c)) };
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: r * k + c + 8 <= R * k <= w.len(); a bf16 load reads 8 x 2 bytes there.
            let wv = unsafe {
                if W::BF16 {
                    let raw = _mm_loadu_si128(wp.add(r * k + c).cast::<__m128i>());
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16))
                } else {
                    _mm256_loadu_ps(wp.add(r * k + c).cast::<f32>())
                }
            };
            for (a, xi) in acc_r.iter_mut().zip(&xv) {
                *a = _mm256_fmadd_ps(wv, *xi, *a);
            }
        }
        c += LANES;
    }
    let mut out = [[0.0f32; N]; R];
    for r in 0..R {
        for i in 0..N {
            // Horizontal sum: 256 -> 128 -> 64 -> 32 bits.
            let v = acc[r][i];
            let s128 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s64 = _mm_add_ps(s128, _mm_movehl_ps(s128, s128));
            let s32 = _mm_add_ss(s64, _mm_shuffle_ps(s64, s64, 1));
            let mut total = _mm_cvtss_f32(s32);
            for j in body..k {
                total += w[r * k + j].to_f32() * x[i * k + j];
            }
            out[r][i] = total;
        }
    }
    out
}
