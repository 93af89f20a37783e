//! Linear layers over fine-grained FP8 weights: e4m3 bytes with one f32 scale per [br, bc] block (Qwen's
//! FP8 checkpoints, `--quantize fp8`).
//!
//! Algorithm. Columns are taken in chunks of 64 (rows zero-padded to a multiple of 64). A chunk's 64
//! weights become four f32 vectors of 16 lanes, exactly (every e4m3 value is a normal f32): on AVX-512 VBMI
//! by two 128-entry byte tables (`vpermi2b`: the high and low byte of the value's bf16 bits), the sign
//! or-ed in, the byte pairs interleaved (`vpunpck[lh]bw`) and split into even / odd words as f32 (`<< 16`,
//! `& 0xffff0000`), one load and nine instructions per 64 weights, so decode streams the bytes at memory
//! speed (`kbench quant`). That fixes which columns a lane holds: lane d of vector v takes chunk column
//! `16 (d / 4) + 2 (d % 4) + 8 (v / 2) + v % 2`; the inputs are rearranged the same way once per call.
//! Per (weight row, input row) pair and chunk: `p = w0 x0; p = fma(w1, x1, p); p = fma(w2, x2, p);
//! p = fma(w3, x3, p); t = fma(p, s, t)`, s the lanes' block scales (a lane's columns share one block as
//! bc % 16 == 0), then t's 16 lanes summed by a fixed tree (l + l+8, + l+4, + l+2, + l+1).
//!
//! Paths, chosen at run time: AVX-512 VBMI (weights converted in registers, shared by up to 8 input rows),
//! AVX2 + F16C + FMA (a weight row widened once per call in the lane order through f16, then two 8-lane
//! halves), portable (the reference).
//!
//! Invariant (batch invariance): up to [`Fp8Matrix::batch_invariant_rows`] input rows, an output depends
//! only on its weight row and its input row, through the same operations whatever the number of rows, the
//! thread count or the path (every path gives the portable one's bits), so verify rows equal decode rows.
//!
//! Prefill (more rows, where AMX runs and a row block is a multiple of 64 rows): the e4m3 values, exact in
//! bf16, as AMX B tiles, against the inputs times their block's scale split into three bf16 terms
//! (`amx::linear_decoded`): f32's precision, at the tiles' rate.

use half::f16;
use rayon::prelude::*;

use crate::quant::Out;

/// Columns a chunk takes: one 64-byte load.
const CHUNK: usize = 64;

/// Lanes of a chunk's f32 vectors.
const LANES: usize = 16;

/// Input rows sharing one conversion of a weight chunk (AVX-512 path).
const GROUP: usize = 8;

/// An FP8 weight matrix [m, k]: e4m3 bytes with f32 scales per [br, bc] block.
#[derive(Clone, Debug)]
pub struct Fp8Matrix {
    m: usize,
    k: usize,
    /// k rounded up to 64: the stored row length (zero bytes past k).
    kp: usize,
    block: [usize; 2],
    /// [m, kp] e4m3.
    data: Vec<u8>,
    /// [⌈m / br⌉, ⌈k / bc⌉] block scales.
    scales: Vec<f32>,
    /// [⌈m / br⌉, kp / 64, 16]: each chunk lane's block scale.
    lane_scales: Vec<f32>,
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

/// The bf16 bits of the e4m3 magnitude code `q` (0..128), exact: normals move their exponent bias from
/// 7 to 127, subnormals m · 2^-9 are normalized.
const fn e4m3_bf16_bits(q: usize) -> u16 {
    let (e, m) = ((q >> 3) & 0xF, q & 7);
    if e > 0 {
        (((e + 120) << 7) | (m << 4)) as u16
    } else if m == 0 {
        0
    } else {
        let top = if m >= 4 {
            2
        } else if m >= 2 {
            1
        } else {
            0
        };
        (((118 + top) << 7) | ((m << (7 - top)) & 0x7F)) as u16
    }
}

/// Byte `half` (0 low, 1 high) of [`e4m3_bf16_bits`] for every magnitude code: the `vpermi2b` tables.
const fn bf16_byte_table(half: u32) -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut q = 0;
    while q < 128 {
        t[q] = (e4m3_bf16_bits(q) >> (8 * half)) as u8;
        q += 1;
    }
    t
}

pub(crate) const BF16_LO: [u8; 128] = bf16_byte_table(0);
pub(crate) const BF16_HI: [u8; 128] = bf16_byte_table(1);

/// The chunk column that lane `d` of vector `v` holds (the order the AVX-512 conversion leaves).
const fn chunk_column(v: usize, d: usize) -> usize {
    16 * (d / 4) + 2 * (d % 4) + 8 * (v / 2) + v % 2
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
        if block[0] == 0 || block[1] == 0 || !block[1].is_multiple_of(16) {
            return Err(format!(
                "FP8 block {block:?}: the kernels take [rows, cols] blocks with cols a multiple of 16"
            ));
        }
        if data.len() != m * k {
            return Err(format!(
                "FP8 matrix [{m}, {k}] needs {} bytes, got {}",
                m * k,
                data.len()
            ));
        }
        let (gm, gk) = (m.div_ceil(block[0]), k.div_ceil(block[1]));
        if scales.len() != gm * gk {
            return Err(format!(
                "FP8 matrix [{m}, {k}] in {block:?} blocks needs {} scales, got {}",
                gm * gk,
                scales.len()
            ));
        }
        let kp = k.next_multiple_of(CHUNK);
        let mut padded = vec![0u8; m * kp];
        if k > 0 {
            for (dst, src) in padded.chunks_exact_mut(kp).zip(data.chunks_exact(k)) {
                dst[..k].copy_from_slice(src);
            }
        }
        // A lane's columns lie in one 16-column group, so in one block; padding takes the last block's.
        let chunks = kp / CHUNK;
        let mut lane_scales = vec![0f32; gm * chunks * LANES];
        for (i, s) in lane_scales.iter_mut().enumerate() {
            let (rb, ch, d) = (i / (chunks * LANES), i / LANES % chunks, i % LANES);
            let col = ch * CHUNK + chunk_column(0, d);
            *s = scales[rb * gk + (col / block[1]).min(gk.max(1) - 1)];
        }
        Ok(Fp8Matrix {
            m,
            k,
            kp,
            block,
            data: padded,
            scales: scales.to_vec(),
            lane_scales,
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
        (data, self.scales.clone())
    }

    /// Most input rows one call gives the bits each row gets alone: [`MATVEC_MAX_ROWS`](crate::MATVEC_MAX_ROWS)
    /// where prefills run on AMX tiles (the CPU has them and a row block is a multiple of 64 rows, as
    /// Qwen's 128 x 128), else any number.
    pub fn batch_invariant_rows(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self.block[0].is_multiple_of(crate::amx::GROUP_ROWS) && tiles::available() {
            return crate::MATVEC_MAX_ROWS;
        }
        usize::MAX
    }

    /// Row `r` as f32 (e4m3 value times its block's scale).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        crate::linear::check_len("Fp8Matrix::dequantize_row: out", out.len(), self.k);
        let gk = self.k.div_ceil(self.block[1]);
        let scales = &self.scales[r / self.block[0] * gk..];
        let row = &self.data[r * self.kp..r * self.kp + self.k];
        for (c, (o, &q)) in out.iter_mut().zip(row).enumerate() {
            *o = e4m3_value(q) * scales[c / self.block[1]];
        }
    }

    /// Weight row `j`'s bytes [kp] and its lane scales [kp / 64, 16].
    fn row(&self, j: usize) -> (&[u8], &[f32]) {
        let per_block = self.kp / CHUNK * LANES;
        let rb = j / self.block[0];
        (
            &self.data[j * self.kp..(j + 1) * self.kp],
            &self.lane_scales[rb * per_block..(rb + 1) * per_block],
        )
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
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vbmi")
            {
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

/// out[n, m] = x[n, k] · w^T. Overwrites `out`. Up to [`Fp8Matrix::batch_invariant_rows`] rows, each row
/// gets the bits it gets alone; more rows (a prefill) may run on AMX tiles.
pub fn linear_fp8(x: &[f32], w: &Fp8Matrix, n: usize, out: &mut [f32]) {
    linear_fp8_rows(x, w, n, w.m, out);
}

/// The first `rows` outputs of [`linear_fp8`] (bit for bit): out[n, rows].
pub fn linear_fp8_rows(x: &[f32], w: &Fp8Matrix, n: usize, rows: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if n > w.batch_invariant_rows() {
        crate::linear::check_rows_call("linear_fp8", x.len(), out.len(), n, w.k, rows, w.m);
        // SAFETY: batch_invariant_rows() is finite only where tiles::available() holds; each call asks
        // for at most 64 rows inside the matrix, and the tiles hold a whole group.
        let fill = |first: usize, count: usize, dst: &mut [u16]| unsafe {
            tiles::e4m3_tiles(w, first, count, dst)
        };
        let scales = crate::amx::InputScales {
            block: w.block,
            scales: &w.scales,
        };
        let (x, out) = (&x[..n * w.k], &mut out[..n * rows]);
        let (mode, inputs) = (crate::linear::Mode::Overwrite, crate::amx::Inputs::Exact);
        crate::amx::linear_decoded(x, n, rows, w.k, mode, inputs, Some(scales), out, &fill);
        return;
    }
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
    crate::linear::check_rows_call("linear_fp8", x.len(), out.len(), n, k, rows, w.m);
    if n == 0 || rows == 0 {
        return;
    }
    // Inputs in the lanes' column order, zero past k (zeros meet the zero weights).
    let mut xp = vec![0f32; n * kp];
    for (d, s) in xp.chunks_exact_mut(kp).zip(x.chunks_exact(k.max(1))) {
        for (ch, dc) in d.chunks_exact_mut(CHUNK).enumerate() {
            for (i, v) in dc.iter_mut().enumerate() {
                let c = ch * CHUNK + chunk_column(i / LANES, i % LANES);
                if c < k {
                    *v = s[c];
                }
            }
        }
    }
    let per_task = crate::quant::rows_per_task(rows, kp, n);
    let out = Out::new(out, rows);
    let job = |t: usize| {
        let first = t * per_task;
        let last = (first + per_task).min(rows);
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // SAFETY: the ISA was detected at run time; this task owns weight rows first..last.
            unsafe { simd::dot_rows_avx512(w, first..last, &xp, n, out) };
            return;
        }
        for j in first..last {
            dot_row(isa, w, j, &xp, n, out);
        }
    };
    if per_task >= rows {
        job(0);
    } else {
        (0..rows.div_ceil(per_task)).into_par_iter().for_each(job);
    }
}

/// out[r, j] for every input row r: weight row j against the rearranged inputs `xp` [n, kp] (the paths
/// that widen a row first).
fn dot_row(isa: Isa, w: &Fp8Matrix, j: usize, xp: &[f32], n: usize, out: Out) {
    let kp = w.kp;
    let (row, scales) = w.row(j);
    WIDE.with(|wide| {
        let mut wide = wide.borrow_mut();
        wide.resize(kp, 0.0);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was detected at run time; row and wide hold kp (a multiple of 64) values.
            Isa::Avx2 => unsafe { simd::widen_avx2(row, &mut wide) },
            _ => widen_portable(row, &mut wide),
        }
        for r in 0..n {
            let x = &xp[r * kp..(r + 1) * kp];
            let v = match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the ISA was detected at run time; wide and x hold kp values, scales kp / 4.
                Isa::Avx2 => unsafe { simd::dot_avx2(&wide, x, scales) },
                _ => dot_portable(&wide, x, scales),
            };
            // SAFETY: this task owns weight row j; r < n.
            unsafe { out.set(r, j, v) };
        }
    });
}

thread_local! {
    /// A weight row widened to f32 in the lanes' column order, per thread.
    static WIDE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// e4m3 bytes [kp] into f32 [kp] in the lanes' column order (the reference widening).
fn widen_portable(row: &[u8], out: &mut [f32]) {
    for (rc, oc) in row.chunks_exact(CHUNK).zip(out.chunks_exact_mut(CHUNK)) {
        for (i, o) in oc.iter_mut().enumerate() {
            *o = e4m3_value(rc[chunk_column(i / LANES, i % LANES)]);
        }
    }
}

/// The reference: a widened weight row [kp] against an input row [kp] (both in the lanes' order), with
/// the lane scales [kp / 64, 16].
fn dot_portable(row: &[f32], x: &[f32], scales: &[f32]) -> f32 {
    let mut t = [0f32; LANES];
    for ((wc, xc), s) in row
        .chunks_exact(CHUNK)
        .zip(x.chunks_exact(CHUNK))
        .zip(scales.chunks_exact(LANES))
    {
        for d in 0..LANES {
            let mut p = wc[d] * xc[d];
            for v in 1..4 {
                p = wc[v * LANES + d].mul_add(xc[v * LANES + d], p);
            }
            t[d] = p.mul_add(s[d], t[d]);
        }
    }
    let l8: [f32; 8] = std::array::from_fn(|i| t[i] + t[i + 8]);
    let l4: [f32; 4] = std::array::from_fn(|i| l8[i] + l8[i + 4]);
    let l2 = [l4[0] + l4[2], l4[1] + l4[3]];
    l2[0] + l2[1]
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Fp8Matrix, Out, BF16_HI, BF16_LO, CHUNK, GROUP, LANES};

    /// The conversion's constants: the two 128-entry byte tables, the sign bit, the upper-word mask.
    #[derive(Clone, Copy)]
    struct Consts {
        hi: [__m512i; 2],
        lo: [__m512i; 2],
        sign: __m512i,
        upper: __m512i,
    }

    /// out[r, j] for the weight rows j of `rows` and every input row r of `xs` [n, kp] (lanes' order):
    /// each weight chunk converted once in registers for a group of up to 8 input rows.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VBMI; the caller owns out's columns `rows`; `xs` holds n rows of kp.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma")]
    pub(super) unsafe fn dot_rows_avx512(
        w: &Fp8Matrix,
        rows: std::ops::Range<usize>,
        xs: &[f32],
        n: usize,
        out: Out,
    ) {
        let kp = w.kp;
        let load = |t: &[u8; 128], at: usize| _mm512_loadu_si512(t.as_ptr().add(at).cast());
        let k = Consts {
            hi: [load(&BF16_HI, 0), load(&BF16_HI, 64)],
            lo: [load(&BF16_LO, 0), load(&BF16_LO, 64)],
            sign: _mm512_set1_epi8(0x80u8 as i8),
            upper: _mm512_set1_epi32(0xFFFF_0000u32 as i32),
        };
        for j in rows {
            let (row, scales) = w.row(j);
            let (wp, sp) = (row.as_ptr(), scales.as_ptr());
            for first in (0..n).step_by(GROUP) {
                let xp = xs.as_ptr().add(first * kp);
                let mut v = [0f32; GROUP];
                match n - first {
                    1 => group::<1>(&k, wp, sp, kp, xp, &mut v),
                    2 => group::<2>(&k, wp, sp, kp, xp, &mut v),
                    3 => group::<3>(&k, wp, sp, kp, xp, &mut v),
                    4 => group::<4>(&k, wp, sp, kp, xp, &mut v),
                    5 => group::<5>(&k, wp, sp, kp, xp, &mut v),
                    6 => group::<6>(&k, wp, sp, kp, xp, &mut v),
                    7 => group::<7>(&k, wp, sp, kp, xp, &mut v),
                    _ => group::<GROUP>(&k, wp, sp, kp, xp, &mut v),
                }
                for (r, &v) in v.iter().enumerate().take(GROUP.min(n - first)) {
                    out.set(first + r, j, v);
                }
            }
        }
    }

    /// G input rows at `xp` (row stride kp) against one weight row at `wp` with lane scales `sp`: the
    /// accumulators stay in registers (G is a constant).
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma")]
    #[inline]
    unsafe fn group<const G: usize>(
        k: &Consts,
        wp: *const u8,
        sp: *const f32,
        kp: usize,
        xp: *const f32,
        out: &mut [f32; GROUP],
    ) {
        let mut t = [_mm512_setzero_ps(); G];
        let mut c = 0;
        while c < kp {
            let q = _mm512_loadu_si512(wp.add(c).cast());
            // High bytes with the sign, low bytes; interleaved into bf16 words, split into f32.
            let h = _mm512_ternarylogic_epi32::<0xF8>(
                _mm512_permutex2var_epi8(k.hi[0], q, k.hi[1]),
                q,
                k.sign,
            );
            let l = _mm512_permutex2var_epi8(k.lo[0], q, k.lo[1]);
            let (wl, wh) = (_mm512_unpacklo_epi8(l, h), _mm512_unpackhi_epi8(l, h));
            let wv = [
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wl)),
                _mm512_castsi512_ps(_mm512_and_si512(wl, k.upper)),
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wh)),
                _mm512_castsi512_ps(_mm512_and_si512(wh, k.upper)),
            ];
            let s = _mm512_loadu_ps(sp.add(c / 4));
            for (r, t) in t.iter_mut().enumerate() {
                let x = xp.add(r * kp + c);
                let mut p = _mm512_mul_ps(wv[0], _mm512_loadu_ps(x));
                p = _mm512_fmadd_ps(wv[1], _mm512_loadu_ps(x.add(LANES)), p);
                p = _mm512_fmadd_ps(wv[2], _mm512_loadu_ps(x.add(2 * LANES)), p);
                p = _mm512_fmadd_ps(wv[3], _mm512_loadu_ps(x.add(3 * LANES)), p);
                *t = _mm512_fmadd_ps(p, s, *t);
            }
            c += CHUNK;
        }
        for (o, t) in out.iter_mut().zip(&t) {
            // (l + l+8), (+ l+4), (+ l+2), (+ l+1): the portable tree.
            let l8 = _mm256_add_ps(
                _mm512_castps512_ps256(*t),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*t), 1)),
            );
            *o = _mm_cvtss_f32(reduce8(l8));
        }
    }

    /// e4m3 bytes [kp] into f32 [kp] in the lanes' order: per 16-byte group j of a chunk, a byte shuffle
    /// puts the four columns of each vector together, widened through f16 (value · 2^-8) and scaled back
    /// by 2^8 (exact), stored at lanes 4j..4j + 4 of the four vectors.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_avx2(row: &[u8], out: &mut [f32]) {
        // Columns 0 2 4 6 | 1 3 5 7 | 8 10 12 14 | 9 11 13 15 of the group: vectors 0, 1, 2, 3.
        let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
        let (m7f, m80) = (_mm256_set1_epi16(0x7F), _mm256_set1_epi16(0x80));
        let k256 = _mm256_set1_ps(256.0);
        for c in (0..row.len()).step_by(CHUNK) {
            for j in 0..4 {
                let b =
                    _mm_shuffle_epi8(_mm_loadu_si128(row.as_ptr().add(c + 16 * j).cast()), order);
                let b = _mm256_cvtepu8_epi16(b);
                let h = _mm256_or_si256(
                    _mm256_slli_epi16(_mm256_and_si256(b, m7f), 7),
                    _mm256_slli_epi16(_mm256_and_si256(b, m80), 8),
                );
                let v01 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k256);
                let v23 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k256);
                let o = out.as_mut_ptr().add(c + 4 * j);
                _mm_storeu_ps(o, _mm256_castps256_ps128(v01));
                _mm_storeu_ps(o.add(LANES), _mm256_extractf128_ps(v01, 1));
                _mm_storeu_ps(o.add(2 * LANES), _mm256_castps256_ps128(v23));
                _mm_storeu_ps(o.add(3 * LANES), _mm256_extractf128_ps(v23, 1));
            }
        }
    }

    /// [`super::dot_portable`] in two halves of 8 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx2(row: &[f32], x: &[f32], scales: &[f32]) -> f32 {
        let (w, xp, sp) = (row.as_ptr(), x.as_ptr(), scales.as_ptr());
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut c = 0;
        while c < row.len() {
            for (half, t) in [(0, &mut lo), (8, &mut hi)] {
                let (wc, xc) = (w.add(c + half), xp.add(c + half));
                let mut p = _mm256_mul_ps(_mm256_loadu_ps(wc), _mm256_loadu_ps(xc));
                for v in 1..4 {
                    let o = v * LANES;
                    p = _mm256_fmadd_ps(_mm256_loadu_ps(wc.add(o)), _mm256_loadu_ps(xc.add(o)), p);
                }
                *t = _mm256_fmadd_ps(p, _mm256_loadu_ps(sp.add(c / 4 + half)), *t);
            }
            c += CHUNK;
        }
        _mm_cvtss_f32(reduce8(_mm256_add_ps(lo, hi)))
    }

    /// (l + l+4), (+ l+2), (+ l+1) of 8 lanes, in lane 0.
    #[inline(always)]
    unsafe fn reduce8(l8: __m256) -> __m128 {
        let l4 = _mm_add_ps(_mm256_castps256_ps128(l8), _mm256_extractf128_ps(l8, 1));
        let l2 = _mm_add_ps(l4, _mm_movehl_ps(l4, l4));
        _mm_add_ss(l2, _mm_shuffle_ps(l2, l2, 1))
    }
}

/// Prefill weights for AMX tiles.
#[cfg(target_arch = "x86_64")]
mod tiles {
    use std::arch::x86_64::*;

    use super::Fp8Matrix;

    /// AMX-BF16 and the AVX-512 BW/VL and F16C the conversion uses.
    pub(super) fn available() -> bool {
        crate::amx::available()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    /// Rows `first..first + rows` (at most 64) of `w`'s e4m3 values (exact in bf16; the scales go to the
    /// inputs) in the AMX B-tile layout (as `quant::avx512::dequantize_tiles`); columns past k (zero
    /// bytes) give zeros.
    ///
    /// # Safety
    /// [`available`]; `first + rows <= w.rows()`, `rows <= 64`, `dst` holds `rows.div_ceil(16) · kb · 512`
    /// values, kb = k / 32 rounded up.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn e4m3_tiles(w: &Fp8Matrix, first: usize, rows: usize, dst: &mut [u16]) {
        let kb = w.k.div_ceil(32);
        assert!(
            first + rows <= w.m && rows <= 64 && dst.len() >= rows.div_ceil(16) * kb * 512,
            "fp8 tiles: rows outside their shapes"
        );
        assert!(32 * kb <= w.kp, "fp8 tiles: row layout");
        let pairs = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
        let base = dst.as_mut_ptr().cast::<u32>();
        for r in 0..rows {
            let j = first + r;
            let row = w.data[j * w.kp..(j + 1) * w.kp].as_ptr();
            let rbase = base.add((r / 16) * kb * 256 + r % 16);
            for c in (0..32 * kb).step_by(16) {
                // e4m3 -> the f16 bits of its value times 2^-8 (exact) -> f32 times 256 -> bf16 (exact).
                let q = _mm256_cvtepu8_epi16(_mm_loadu_si128(row.add(c).cast::<__m128i>()));
                let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(q, _mm256_set1_epi16(0x80)));
                let mag = _mm256_slli_epi16::<7>(_mm256_and_si256(q, _mm256_set1_epi16(0x7F)));
                let v = _mm512_mul_ps(
                    _mm512_cvtph_ps(_mm256_or_si256(sign, mag)),
                    _mm512_set1_ps(256.0),
                );
                let bf: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
                let at = rbase.add((c / 32) * 256 + ((c % 32) / 2) * 16);
                _mm256_i32scatter_epi32::<4>(at.cast::<i32>(), pairs, bf);
            }
        }
    }
}
