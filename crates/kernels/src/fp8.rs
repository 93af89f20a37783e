//! Linear layers over fine-grained FP8 weights: e4m3 bytes with one f32 scale per [br, bc] block (Qwen's
//! FP8 checkpoints, `--quantize fp8`).
//!
//! Algorithm: a weight byte q becomes the f16 whose bits are `(q & 0x80) << 8 | (q & 0x7F) << 7`, the
//! e4m3 value times 2^-8 exactly (subnormals included), widened to f32 (`vcvtph2ps`); the block scale is
//! kept times 2^8 (exact), so the products are the true ones. A weight row is widened once per call into
//! an f32 row (exact), then for each input row r, per column block b: four sets of 16 lanes, set
//! `t = (c / 16) % 4` taking column c, `l[t][c % 16] = fma(w_c, x_c, l[t][c % 16])` over the block's columns
//! in order (four independent chains), the sets summed as `(l0 + l1) + (l2 + l3)`, the lanes by a fixed
//! tree (l + l+8, + l+4, + l+2, + l+1), then `acc = fma(partial, s_b, acc)`. Rows are padded with zero
//! weights to a multiple of 16 columns.
//!
//! Paths, chosen at run time: AVX-512 (16 lanes in one register), AVX2 + F16C + FMA (two registers of 8
//! lanes, the same sums), portable (the reference).
//!
//! Invariant (batch invariance): an output depends only on its weight row and its input row, through
//! the same operations whatever the number of rows, the thread count or the path (every path gives the
//! portable one's bits), so verify rows equal decode rows.

use half::f16;
use rayon::prelude::*;

use crate::quant::Out;

/// Lanes of the per-block dot product.
const LANES: usize = 16;

/// An FP8 weight matrix [m, k]: e4m3 bytes with f32 scales per [br, bc] block.
#[derive(Clone, Debug)]
pub struct Fp8Matrix {
    m: usize,
    k: usize,
    /// k rounded up to 16: the stored row length (zero bytes past k).
    kp: usize,
    block: [usize; 2],
    /// [m, kp] e4m3.
    data: Vec<u8>,
    /// [⌈m / br⌉, ⌈k / bc⌉] block scales times 2^8.
    scales: Vec<f32>,
}

/// An e4m3 byte as the f16 bits of its value times 2^-8 (exact).
#[inline(always)]
fn e4m3_f16_bits(q: u8) -> u16 {
    ((q as u16 & 0x80) << 8) | ((q as u16 & 0x7F) << 7)
}

/// An e4m3 byte as f32 (exact; the NaN code S.1111.111 gives a finite 480, never in real weights).
pub fn e4m3_value(q: u8) -> f32 {
    f16::from_bits(e4m3_f16_bits(q)).to_f32() * 256.0
}

/// The e4m3 byte nearest to `x` (ties to even), saturating at ±448 as transformers clamps before
/// torch's cast.
pub fn e4m3_from_f32(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = if x.is_nan() { 0.0 } else { x.abs().min(448.0) };
    // The largest code whose value is <= a (codes 0..=0x7E increase with their value), then the nearer.
    let (mut lo, mut hi) = (0u8, 0x7E);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if e4m3_value(mid) <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let code = if lo == 0x7E {
        lo
    } else {
        let (down, up) = (a - e4m3_value(lo), e4m3_value(lo + 1) - a);
        if down < up || (down == up && lo % 2 == 0) {
            lo
        } else {
            lo + 1
        }
    };
    code | sign
}

impl Fp8Matrix {
    /// Takes `data` (e4m3 [m, k]) and `scales` (f32 [⌈m / br⌉, ⌈k / bc⌉]); an error names what does
    /// not fit.
    pub fn new(
        data: &[u8],
        scales: &[f32],
        m: usize,
        k: usize,
        block: [usize; 2],
    ) -> Result<Self, String> {
        if block[0] == 0 || block[1] == 0 || !block[1].is_multiple_of(LANES) {
            return Err(format!(
                "FP8 block {block:?}: the kernels take [rows, cols] blocks with cols a multiple of {LANES}"
            ));
        }
        if data.len() != m * k {
            return Err(format!(
                "FP8 matrix [{m}, {k}] needs {} bytes, got {}",
                m * k,
                data.len()
            ));
        }
        let grid = m.div_ceil(block[0]) * k.div_ceil(block[1]);
        if scales.len() != grid {
            return Err(format!(
                "FP8 matrix [{m}, {k}] in {block:?} blocks needs {grid} scales, got {}",
                scales.len()
            ));
        }
        let kp = k.next_multiple_of(LANES);
        let mut padded = vec![0u8; m * kp];
        if k > 0 {
            for (dst, src) in padded.chunks_exact_mut(kp).zip(data.chunks_exact(k)) {
                dst[..k].copy_from_slice(src);
            }
        }
        Ok(Fp8Matrix {
            m,
            k,
            kp,
            block,
            data: padded,
            scales: scales.iter().map(|s| s * 256.0).collect(),
        })
    }

    /// Quantizes `w` [m, k] as transformers' FP8 quantizer does: per block, scale = max|w| / 448 and
    /// q = e4m3(w / scale) (a zero block keeps scale 1).
    pub fn quantize(w: &[f32], m: usize, k: usize, block: [usize; 2]) -> Self {
        crate::linear::check_len("Fp8Matrix::quantize: w", w.len(), m * k);
        let (gm, gk) = (m.div_ceil(block[0]), k.div_ceil(block[1]));
        let mut scales = vec![1f32; gm * gk];
        for (b, s) in scales.iter_mut().enumerate() {
            let (bi, bj) = (b / gk, b % gk);
            let rows = bi * block[0]..((bi + 1) * block[0]).min(m);
            let cols = bj * block[1]..((bj + 1) * block[1]).min(k);
            let amax = rows
                .flat_map(|r| w[r * k + cols.start..r * k + cols.end].iter())
                .fold(0f32, |a, v| a.max(v.abs()));
            if amax > 0.0 {
                *s = amax / 448.0;
            }
        }
        let mut data = vec![0u8; m * k];
        data.par_chunks_mut(k.max(1))
            .enumerate()
            .for_each(|(r, row)| {
                for (c, q) in row.iter_mut().enumerate() {
                    let s = scales[r / block[0] * gk + c / block[1]];
                    *q = e4m3_from_f32(w[r * k + c] / s);
                }
            });
        Fp8Matrix::new(&data, &scales, m, k, block).expect("shapes made here")
    }

    pub fn rows(&self) -> usize {
        self.m
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn block(&self) -> [usize; 2] {
        self.block
    }

    /// Stored bytes (weights and scales).
    pub fn bytes(&self) -> usize {
        self.m * self.k + 4 * self.scales.len()
    }

    /// The e4m3 bytes [m, k] and the scales [⌈m / br⌉, ⌈k / bc⌉] as stored in the checkpoint.
    pub fn parts(&self) -> (Vec<u8>, Vec<f32>) {
        let data = self
            .data
            .chunks_exact(self.kp)
            .flat_map(|r| r[..self.k].iter().copied())
            .collect();
        (data, self.scales.iter().map(|s| s / 256.0).collect())
    }

    /// Row `r` as f32 (e4m3 value times its block's scale).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        crate::linear::check_len("Fp8Matrix::dequantize_row: out", out.len(), self.k);
        let gk = self.k.div_ceil(self.block[1]);
        let scales = &self.scales[r / self.block[0] * gk..];
        let row = &self.data[r * self.kp..r * self.kp + self.k];
        for (c, (o, &q)) in out.iter_mut().zip(row).enumerate() {
            *o = f16::from_bits(e4m3_f16_bits(q)).to_f32() * scales[c / self.block[1]];
        }
    }
}

/// The instruction sets of the FP8 kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Isa {
    fn available() -> Vec<Isa> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                all.push(Isa::Avx512);
            }
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                all.push(Isa::Avx2);
            }
        }
        all.push(Isa::Portable);
        all
    }

    fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }
}

fn best_isa() -> Isa {
    static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| Isa::available()[0])
}

/// Every path of the FP8 kernel this CPU runs, best first (tests compare them).
#[doc(hidden)]
pub fn fp8_simd_paths() -> Vec<&'static str> {
    Isa::available().into_iter().map(Isa::name).collect()
}

/// out[n, m] = x[n, k] · w^T. Overwrites `out`; every row count takes the same path.
pub fn linear_fp8(x: &[f32], w: &Fp8Matrix, n: usize, out: &mut [f32]) {
    linear_fp8_with(best_isa(), x, w, n, w.m, out);
}

/// The first `rows` outputs of [`linear_fp8`] (bit for bit): out[n, rows].
pub fn linear_fp8_rows(x: &[f32], w: &Fp8Matrix, n: usize, rows: usize, out: &mut [f32]) {
    linear_fp8_with(best_isa(), x, w, n, rows, out);
}

/// [`linear_fp8`] on the named path of [`fp8_simd_paths`]; panics if this CPU lacks it.
#[doc(hidden)]
pub fn linear_fp8_path(path: &str, x: &[f32], w: &Fp8Matrix, n: usize, out: &mut [f32]) {
    let isa = Isa::available()
        .into_iter()
        .find(|i| i.name() == path)
        .unwrap_or_else(|| panic!("linear_fp8_path: no {path} path on this CPU"));
    linear_fp8_with(isa, x, w, n, w.m, out);
}

fn linear_fp8_with(isa: Isa, x: &[f32], w: &Fp8Matrix, n: usize, rows: usize, out: &mut [f32]) {
    let (k, kp) = (w.k, w.kp);
    assert!(
        rows <= w.m,
        "linear_fp8: {rows} rows of a {}-row matrix",
        w.m
    );
    crate::linear::check_len("linear_fp8: x [n, k]", x.len(), n * k);
    crate::linear::check_len("linear_fp8: out [n, rows]", out.len(), n * rows);
    if n == 0 || rows == 0 {
        return;
    }
    // Inputs padded to kp columns (zeros meet the zero weights).
    let xp: std::borrow::Cow<[f32]> = if kp == k {
        std::borrow::Cow::Borrowed(&x[..n * k])
    } else {
        let mut v = vec![0f32; n * kp];
        for (d, s) in v.chunks_exact_mut(kp).zip(x.chunks_exact(k)) {
            d[..k].copy_from_slice(s);
        }
        std::borrow::Cow::Owned(v)
    };
    let per_task = crate::quant::rows_per_task(rows, kp, n);
    let out = Out::new(out, rows);
    let job = |t: usize| {
        let first = t * per_task;
        for j in first..(first + per_task).min(rows) {
            dot_row(isa, w, j, &xp, n, out);
        }
    };
    if per_task >= rows {
        job(0);
    } else {
        (0..rows.div_ceil(per_task)).into_par_iter().for_each(job);
    }
}

/// out[r, j] for every input row r: weight row j against the padded inputs `xp` [n, kp].
fn dot_row(isa: Isa, w: &Fp8Matrix, j: usize, xp: &[f32], n: usize, out: Out) {
    let kp = w.kp;
    let row = &w.data[j * kp..(j + 1) * kp];
    let gk = w.k.div_ceil(w.block[1]);
    let scales = &w.scales[j / w.block[0] * gk..(j / w.block[0] + 1) * gk];
    if n == 1 {
        // One input row: widen in registers (the same values, so the same bits as the widened row).
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // SAFETY: the ISA was detected at run time; row and xp hold kp (a multiple of 16) values.
            let v = unsafe { simd::dot_bytes_avx512(row, &xp[..kp], scales, w.block[1]) };
            // SAFETY: this task owns weight row j.
            unsafe { out.set(0, j, v) };
            return;
        }
    }
    WIDE.with(|wide| {
        let mut wide = wide.borrow_mut();
        wide.resize(kp, 0.0);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was detected at run time; row and wide hold kp (a multiple of 16) values.
            Isa::Avx512 => unsafe { simd::widen_avx512(row, &mut wide) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { simd::widen_avx2(row, &mut wide) },
            Isa::Portable => {
                for (o, &q) in wide.iter_mut().zip(row) {
                    *o = f16::from_bits(e4m3_f16_bits(q)).to_f32();
                }
            }
        }
        for r in 0..n {
            let x = &xp[r * kp..(r + 1) * kp];
            let v = match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the ISA was detected at run time; wide and x hold kp (a multiple of 16) values.
                Isa::Avx512 => unsafe { simd::dot_avx512(&wide, x, scales, w.block[1]) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Isa::Avx2 => unsafe { simd::dot_avx2(&wide, x, scales, w.block[1]) },
                Isa::Portable => dot_portable(&wide, x, scales, w.block[1]),
            };
            // SAFETY: this task owns weight row j; r < n.
            unsafe { out.set(r, j, v) };
        }
    });
}

thread_local! {
    /// A weight row widened to f32 (its e4m3 values times 2^-8), per thread.
    static WIDE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The reference: one widened weight row [kp] against one input row [kp], blocks of `bc` columns.
fn dot_portable(row: &[f32], x: &[f32], scales: &[f32], bc: usize) -> f32 {
    let mut acc = 0f32;
    for ((wb, xb), &s) in row.chunks(bc).zip(x.chunks(bc)).zip(scales) {
        let mut l = [[0f32; LANES]; 4];
        for (step, (w16, x16)) in wb
            .chunks_exact(LANES)
            .zip(xb.chunks_exact(LANES))
            .enumerate()
        {
            let set = &mut l[step % 4];
            for i in 0..LANES {
                set[i] = w16[i].mul_add(x16[i], set[i]);
            }
        }
        let l: [f32; LANES] = std::array::from_fn(|i| (l[0][i] + l[1][i]) + (l[2][i] + l[3][i]));
        let l8: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
        let l4: [f32; 4] = std::array::from_fn(|i| l8[i] + l8[i + 4]);
        let l2 = [l4[0] + l4[2], l4[1] + l4[3]];
        acc = (l2[0] + l2[1]).mul_add(s, acc);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// e4m3 bytes [kp] into f32 [kp] (their values times 2^-8), 16 at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn widen_avx512(row: &[u8], out: &mut [f32]) {
        for c in (0..row.len()).step_by(16) {
            let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(row.as_ptr().add(c).cast()));
            let h = _mm256_or_si256(
                _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7),
                _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
            );
            _mm512_storeu_ps(out.as_mut_ptr().add(c), _mm512_cvtph_ps(h));
        }
    }

    /// [`widen_avx512`] 8 at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_avx2(row: &[u8], out: &mut [f32]) {
        for c in (0..row.len()).step_by(8) {
            let b = _mm_cvtepu8_epi16(_mm_loadl_epi64(row.as_ptr().add(c).cast()));
            let h = _mm_or_si128(
                _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7),
                _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
            );
            _mm256_storeu_ps(out.as_mut_ptr().add(c), _mm256_cvtph_ps(h));
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn dot_avx512(row: &[f32], x: &[f32], scales: &[f32], bc: usize) -> f32 {
        let kp = row.len();
        let (w, xp) = (row.as_ptr(), x.as_ptr());
        let mut acc = _mm_setzero_ps();
        let mut b = 0;
        while b * bc < kp {
            let (start, end) = (b * bc, ((b + 1) * bc).min(kp));
            // Step t of the block (16 columns) goes to set t % 4.
            let (mut l0, mut l1, mut l2, mut l3) = (
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
            );
            let fma = |c: usize, l: __m512| {
                _mm512_fmadd_ps(_mm512_loadu_ps(w.add(c)), _mm512_loadu_ps(xp.add(c)), l)
            };
            let mut c = start;
            while c + 64 <= end {
                l0 = fma(c, l0);
                l1 = fma(c + 16, l1);
                l2 = fma(c + 32, l2);
                l3 = fma(c + 48, l3);
                c += 64;
            }
            if c < end {
                l0 = fma(c, l0);
            }
            if c + 16 < end {
                l1 = fma(c + 16, l1);
            }
            if c + 32 < end {
                l2 = fma(c + 32, l2);
            }
            let l = _mm512_add_ps(_mm512_add_ps(l0, l1), _mm512_add_ps(l2, l3));
            // (l + l+8), (+ l+4), (+ l+2), (+ l+1): the portable tree.
            let l8 = _mm256_add_ps(
                _mm512_castps512_ps256(l),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(l), 1)),
            );
            acc = _mm_fmadd_ss(reduce8(l8), _mm_set_ss(*scales.get_unchecked(b)), acc);
            b += 1;
        }
        _mm_cvtss_f32(acc)
    }

    /// [`dot_avx512`] reading the e4m3 bytes, widened in registers (the same values and operations).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn dot_bytes_avx512(row: &[u8], x: &[f32], scales: &[f32], bc: usize) -> f32 {
        let kp = row.len();
        let (w, xp) = (row.as_ptr(), x.as_ptr());
        let (m7f, m80) = (_mm256_set1_epi16(0x7F), _mm256_set1_epi16(0x80));
        let widen = |c: usize| {
            let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(w.add(c).cast()));
            let h = _mm256_or_si256(
                _mm256_slli_epi16(_mm256_and_si256(b, m7f), 7),
                _mm256_slli_epi16(_mm256_and_si256(b, m80), 8),
            );
            _mm512_cvtph_ps(h)
        };
        let fma = |c: usize, l: __m512| _mm512_fmadd_ps(widen(c), _mm512_loadu_ps(xp.add(c)), l);
        let mut acc = _mm_setzero_ps();
        let mut b = 0;
        while b * bc < kp {
            let (start, end) = (b * bc, ((b + 1) * bc).min(kp));
            let (mut l0, mut l1, mut l2, mut l3) = (
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
                _mm512_setzero_ps(),
            );
            let mut c = start;
            while c + 64 <= end {
                l0 = fma(c, l0);
                l1 = fma(c + 16, l1);
                l2 = fma(c + 32, l2);
                l3 = fma(c + 48, l3);
                c += 64;
            }
            if c < end {
                l0 = fma(c, l0);
            }
            if c + 16 < end {
                l1 = fma(c + 16, l1);
            }
            if c + 32 < end {
                l2 = fma(c + 32, l2);
            }
            let l = _mm512_add_ps(_mm512_add_ps(l0, l1), _mm512_add_ps(l2, l3));
            let l8 = _mm256_add_ps(
                _mm512_castps512_ps256(l),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(l), 1)),
            );
            acc = _mm_fmadd_ss(reduce8(l8), _mm_set_ss(*scales.get_unchecked(b)), acc);
            b += 1;
        }
        _mm_cvtss_f32(acc)
    }

    /// (l + l+4), (+ l+2), (+ l+1) of 8 lanes, in lane 0.
    #[inline(always)]
    unsafe fn reduce8(l8: __m256) -> __m128 {
        let l4 = _mm_add_ps(_mm256_castps256_ps128(l8), _mm256_extractf128_ps(l8, 1));
        let l2 = _mm_add_ps(l4, _mm_movehl_ps(l4, l4));
        _mm_add_ss(l2, _mm_shuffle_ps(l2, l2, 1))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx2(row: &[f32], x: &[f32], scales: &[f32], bc: usize) -> f32 {
        let kp = row.len();
        let (w, xp) = (row.as_ptr(), x.as_ptr());
        let mut acc = _mm_setzero_ps();
        let mut b = 0;
        while b * bc < kp {
            let (start, end) = (b * bc, ((b + 1) * bc).min(kp));
            // Step t of the block (16 columns, two registers) goes to set t % 4.
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            let (mut c, mut t) = (start, 0);
            while c < end {
                let (p, q) = (w.add(c), xp.add(c));
                lo[t] = _mm256_fmadd_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(q), lo[t]);
                hi[t] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(q.add(8)), hi[t]);
                c += 16;
                t = (t + 1) & 3;
            }
            let lo = _mm256_add_ps(_mm256_add_ps(lo[0], lo[1]), _mm256_add_ps(lo[2], lo[3]));
            let hi = _mm256_add_ps(_mm256_add_ps(hi[0], hi[1]), _mm256_add_ps(hi[2], hi[3]));
            let partial = reduce8(_mm256_add_ps(lo, hi));
            acc = _mm_fmadd_ss(partial, _mm_set_ss(*scales.get_unchecked(b)), acc);
            b += 1;
        }
        _mm_cvtss_f32(acc)
    }
}
