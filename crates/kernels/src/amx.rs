//! bf16 linear layers on Intel AMX tiles (`out[n, m] = x[n, k] · w[m, k]^T`), for every row count.
//!
//! Algorithm. The weights are packed once, at load, into the tile layout `TDPBF16PS` reads as its B
//! operand: for each block of 16 output rows and 32 k values, 16 tile rows of 16 (pair of bf16) = 1 KiB,
//! zero-padded at the edges. The f32 inputs are split into three bf16 terms per value (`x1 = bf16(x)`,
//! `x2 = bf16(x - x1)`, `x3 = bf16(x - x1 - x2)`: 24 significant bits, f32's precision), so each input row
//! is three A-operand rows. Every bf16 product is exact in f32; the tiles accumulate in f32, and each output
//! is `(c1 + c2) + c3` of its three terms' sums. The micro-kernel keeps four accumulator tiles (16 split
//! rows = 5 input rows, against 64 output rows) and loads one A and four B tiles per 32 k values; more
//! rows take further passes over the task's weights (from L2 after the first).
//!
//! Invariant (batch invariance): an output's value depends only on its input row and weight row (tile
//! accumulation runs over k in a fixed order per element, whatever tile row the input occupies), so a
//! row of an n-row call has the bits of a one-row call for every n, decode, verify and prefill alike.
//! Subnormal bf16 values are read as zero (AMX's DAZ); results match the f32 dot to ~1e-6 relative.

use std::arch::asm;
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::linear::Mode;

/// Output rows per B tile (its 16 columns of f32 results).
const TILE_N: usize = 16;
/// k values per tile step (32 bf16 = one 64-byte tile row).
const TILE_K: usize = 32;
/// A-operand rows per tile.
const TILE_M: usize = 16;
/// Split rows per input row at most.
const TERMS: usize = 3;

/// How the f32 inputs become bf16 A-operand rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inputs {
    /// Three bf16 terms a value (x1 = bf16(x), x2 = bf16(x - x1), x3 = bf16(x - x1 - x2)): f32's 24 bits.
    Exact,
    /// One term, bf16(x): a third of the tile work, each input rounded to 8 bits of mantissa.
    Bf16,
}

impl Inputs {
    fn terms(self) -> usize {
        match self {
            Inputs::Exact => TERMS,
            Inputs::Bf16 => 1,
        }
    }

    /// Input rows per pass: one A tile of split rows.
    fn pass_rows(self) -> usize {
        TILE_M / self.terms()
    }
}
/// Output blocks per micro-kernel step (64 outputs): one A tile load feeds four B tiles.
const GROUP_BLOCKS: usize = 4;

/// Whether this CPU and kernel run AMX-BF16 (CPUID AMX-TILE and AMX-BF16, AVX512-BF16 for splitting the
/// inputs, and Linux grants the tile state to this process). Asked once.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    let (amx_bf16, amx_tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16");
    if !(amx_bf16 && amx_tile && avx512) {
        return false;
    }
    extern "C" {
        fn syscall(number: i64, ...) -> i64;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM) only asks the kernel to allow the tile state; it fails
    // cleanly (nonzero) on kernels or VMs that do not offer it.
    unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

/// A bf16 weight matrix [m, k] in the AMX B-tile layout.
#[derive(Clone)]
pub struct PackedBf16 {
    /// [m / 16 blocks][k / 32 blocks][16 tile rows][16 outputs][2] bf16 bits, zero-padded.
    data: Vec<u16>,
    m: usize,
    k: usize,
}

impl std::fmt::Debug for PackedBf16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedBf16 [{}, {}]", self.m, self.k)
    }
}

impl PackedBf16 {
    /// Packs the row-major `w` [m, k].
    pub fn pack(w: &[half::bf16], m: usize, k: usize) -> Self {
        crate::linear::check_len("PackedBf16: w [m, k]", w.len(), m * k);
        let (mb, kb) = (m.div_ceil(TILE_N), k.div_ceil(TILE_K));
        let mut data = vec![0u16; mb * kb * TILE_N * TILE_K];
        data.par_chunks_mut(kb * TILE_N * TILE_K)
            .enumerate()
            .for_each(|(jb, block)| {
                for n in 0..TILE_N.min(m - jb * TILE_N) {
                    let row = &w[(jb * TILE_N + n) * k..(jb * TILE_N + n + 1) * k];
                    for (c, v) in row.iter().enumerate() {
                        let (kblk, kk) = (c / TILE_K, c % TILE_K);
                        let at = kblk * TILE_N * TILE_K + (kk / 2) * 2 * TILE_N + n * 2 + kk % 2;
                        block[at] = v.to_bits();
                    }
                }
            });
        PackedBf16 { data, m, k }
    }

    pub fn rows(&self) -> usize {
        self.m
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    fn k_blocks(&self) -> usize {
        self.k.div_ceil(TILE_K)
    }

    /// The B tile of output block jb, k block kb (16 rows of 64 bytes).
    fn tile(&self, jb: usize, kb: usize) -> *const u16 {
        self.data[(jb * self.k_blocks() + kb) * TILE_N * TILE_K..].as_ptr()
    }
}

/// out[n, m] = mode(out, x[n, k] · w[..m]^T) on AMX: the first m <= w.rows() outputs (all of them, or a
/// prefix such as a draft vocabulary), each with the bits the full call gives it. The caller checked
/// [`available`] and the lengths.
pub(crate) fn linear(x: &[f32], w: &PackedBf16, n: usize, m: usize, mode: Mode, out: &mut [f32]) {
    let k = w.k;
    assert!(m <= w.m, "amx::linear: {m} outputs of a {}-row matrix", w.m);
    if n == 0 || m == 0 {
        return;
    }
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let splits = split_passes(x, n, k, Inputs::Exact);
    // Tasks own groups of output blocks (64 output columns); about 4 tasks per thread.
    let groups = m.div_ceil(GROUP_BLOCKS * TILE_N);
    let tasks = (rayon::current_num_threads() * 4).clamp(1, groups);
    let groups_per_task = groups.div_ceil(tasks);
    let job = |task: usize| {
        let range = task * groups_per_task..((task + 1) * groups_per_task).min(groups);
        // SAFETY: `available()` was checked by the caller; tasks write disjoint output columns.
        unsafe { passes(w, &splits, n, range, mode, out_ptr, m, 0, Inputs::Exact) };
    };
    if tasks == 1 || m * k * n < (1 << 16) {
        (0..tasks).for_each(job);
    } else {
        (0..tasks).into_par_iter().for_each(job);
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: tasks write disjoint elements through it (see `linear`).
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

/// The A operands of x [n, k], one per pass of up to `inputs.pass_rows()` rows.
fn split_passes(x: &[f32], n: usize, k: usize, inputs: Inputs) -> Vec<Vec<u16>> {
    let (kb, per) = (k.div_ceil(TILE_K), inputs.pass_rows());
    (0..n)
        .step_by(per)
        .map(|first| {
            let rows = (n - first).min(per);
            split_rows(
                &x[first * k..(first + rows) * k],
                rows,
                k,
                kb,
                inputs.terms(),
            )
        })
        .collect()
}

/// The A operand for up to 16 / terms input rows: [k blocks][16 split rows][32] bf16 bits; split row
/// terms·i + t holds term t of input row i; rows past terms · rows are zero.
fn split_rows(x: &[f32], rows: usize, k: usize, kb: usize, terms: usize) -> Vec<u16> {
    let mut split = vec![0u16; kb * TILE_M * TILE_K];
    for i in 0..rows {
        for (b, chunk) in x[i * k..(i + 1) * k].chunks(TILE_K).enumerate() {
            let mut v = [0.0f32; TILE_K];
            v[..chunk.len()].copy_from_slice(chunk);
            for half in 0..2 {
                let at = |t: usize| (b * TILE_M + terms * i + t) * TILE_K + half * (TILE_K / 2);
                // SAFETY: `available()` (checked before any packed matrix exists) includes AVX512-BF16;
                // the stores write 16 values at each of the first `terms` offsets inside split.
                unsafe {
                    split_16(
                        &v[half * 16..half * 16 + 16],
                        split.as_mut_ptr(),
                        [at(0), at(1), at(2)],
                        terms,
                    )
                };
            }
        }
    }
    split
}

/// The first `terms` bf16 terms of 16 f32 values (`x1 = bf16(x)`, `x2 = bf16(x - x1)`, `x3 = bf16(x - x1
/// - x2)`, rounding to nearest even; subnormal values read as zero), stored at the offsets of `dst`.
///
/// # Safety
/// AVX-512 F and BF16; dst + offset .. + 16 is writable for each of the first `terms` offsets.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn split_16(v: &[f32], dst: *mut u16, offsets: [usize; TERMS], terms: usize) {
    use std::arch::x86_64::*;
    assert!(v.len() >= 16);
    let widen = |h: __m256bh| {
        let bits: __m256i = std::mem::transmute(h);
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16))
    };
    // SAFETY: 16 values of v; the caller guarantees the destinations.
    unsafe {
        let x = _mm512_loadu_ps(v.as_ptr());
        let h1 = _mm512_cvtneps_pbh(x);
        let r1 = _mm512_sub_ps(x, widen(h1));
        let h2 = _mm512_cvtneps_pbh(r1);
        let h3 = _mm512_cvtneps_pbh(_mm512_sub_ps(r1, widen(h2)));
        for (h, off) in [h1, h2, h3].into_iter().zip(offsets).take(terms) {
            _mm256_storeu_si256(
                dst.add(off).cast::<__m256i>(),
                std::mem::transmute::<__m256bh, __m256i>(h),
            );
        }
    }
}

/// k blocks ahead that the weight tiles are prefetched: tile loads wait in order, so a tile that misses
/// the caches stalls the unit unless it was asked for early.
const PREFETCH_BLOCKS: usize = 4;

/// Asks for the 16 cache lines of B tile (jb, kk) (nothing past the last k block).
#[inline(always)]
fn prefetch_tile(w: &PackedBf16, jb: usize, kk: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    if kk < w.k_blocks() {
        let p = w.tile(jb, kk).cast::<i8>();
        for line in 0..TILE_N {
            // SAFETY: prefetch never faults; the address lies inside the tile anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line * 64)) };
        }
    }
}

/// The tile configuration: palette 1, all eight tiles 16 rows x 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const fn full() -> Self {
        let mut cfg = [0u8; 64];
        cfg[0] = 1;
        let mut t = 0;
        while t < 8 {
            cfg[16 + 2 * t] = 64; // bytes per row (little-endian u16)
            cfg[48 + t] = TILE_M as u8;
            t += 1;
        }
        TileConfig(cfg)
    }
}

static CONFIG: TileConfig = TileConfig::full();

/// Block scales of weights stored as `value · scale[r / br, c / bc]` ([br, bc] = `block`; `scales`
/// [⌈m / br⌉, ⌈k / bc⌉]), applied to the inputs by [`linear_decoded`].
#[derive(Clone, Copy)]
pub(crate) struct InputScales<'a> {
    pub block: [usize; 2],
    pub scales: &'a [f32],
}

/// Output rows per group: the B tiles one micro-kernel step reads.
pub(crate) const GROUP_ROWS: usize = GROUP_BLOCKS * TILE_N;

/// u16 values of one group's B tiles of k columns in [`PackedBf16`]'s layout (what a `fill` of
/// [`linear_decoded`] writes): [4 blocks][k / 32][16 pairs][16 rows][2].
pub(crate) fn group_tile_len(k: usize) -> usize {
    GROUP_BLOCKS * k.div_ceil(TILE_K) * TILE_N * TILE_K
}

/// out[n, m] = mode(out, x[n, k] · w[..m]^T) on AMX for weights kept in another format: each task decodes
/// a group of [`GROUP_ROWS`] weight rows at a time into bf16 B tiles (`fill(first, rows, tiles)` writes
/// rows first..first + rows in the layout of [`group_tile_len`]; what it leaves of a partial group's
/// last block is never written out) and runs every pass of inputs over them while they sit in L2. With
/// [`Inputs::Exact`] an output carries the rounding of its weights to bf16 and nothing else. With `scales`,
/// the weights' block scales multiply the inputs instead (x[i, c] · scale[row block, c / bc], rounded once
/// to f32, then split): a task splits the inputs again for each row block it meets. The caller checked
/// [`available`], the lengths, and that a row block is a whole number of groups.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_decoded(
    x: &[f32],
    n: usize,
    m: usize,
    k: usize,
    mode: Mode,
    inputs: Inputs,
    scales: Option<InputScales<'_>>,
    out: &mut [f32],
    fill: &(dyn Fn(usize, usize, &mut [u16]) + Sync),
) {
    if n == 0 || m == 0 {
        return;
    }
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let splits = match scales {
        None => split_passes(x, n, k, inputs),
        Some(sc) => {
            assert!(
                sc.block[0].is_multiple_of(GROUP_ROWS),
                "amx: row blocks split a group"
            );
            Vec::new()
        }
    };
    let groups = m.div_ceil(GROUP_ROWS);
    let tasks = (rayon::current_num_threads() * 4).clamp(1, groups);
    let groups_per_task = groups.div_ceil(tasks);
    let job = |task: usize| {
        let mut tiles = PackedBf16 {
            data: vec![0u16; group_tile_len(k)],
            m: 0,
            k,
        };
        let mut scaled: Option<(usize, Vec<Vec<u16>>)> = None;
        for group in task * groups_per_task..((task + 1) * groups_per_task).min(groups) {
            let first = group * GROUP_ROWS;
            tiles.m = (m - first).min(GROUP_ROWS);
            fill(first, tiles.m, &mut tiles.data);
            let splits = match scales {
                None => &splits,
                Some(sc) => {
                    let rb = first / sc.block[0];
                    if scaled.as_ref().is_none_or(|(at, _)| *at != rb) {
                        let gk = k.div_ceil(sc.block[1]);
                        let row = &sc.scales[rb * gk..(rb + 1) * gk];
                        let mut xs = x[..n * k].to_vec();
                        for xr in xs.chunks_exact_mut(k) {
                            for (part, &scale) in xr.chunks_mut(sc.block[1]).zip(row) {
                                part.iter_mut().for_each(|v| *v *= scale);
                            }
                        }
                        scaled = Some((rb, split_passes(&xs, n, k, inputs)));
                    }
                    &scaled.as_ref().expect("split above").1
                }
            };
            // SAFETY: `available()` was checked by the caller; this task alone writes the output
            // columns first..first + tiles.m.
            unsafe { passes(&tiles, splits, n, 0..1, mode, out_ptr, m, first, inputs) };
        }
    };
    if tasks == 1 {
        job(0);
    } else {
        (0..tasks).into_par_iter().for_each(job);
    }
}

/// Every pass (up to five input rows each with exact inputs, 16 with bf16 ones, split in `splits`) over the
/// output-block groups in `groups`, group by group, so a group's weights come from memory once and from L2
/// for the later passes. Passes go two at a time where they can: two A tiles against two B tiles per k
/// block, then one A tile against four B tiles for a last odd pass.
///
/// Group g's outputs are columns `col_base + 64 g ..` of out.
///
/// # Safety
/// AMX must be available (and permitted); `out` must address [n, m] f32 values, and no other thread may
/// write the output columns of these groups.
#[allow(clippy::too_many_arguments)]
unsafe fn passes(
    w: &PackedBf16,
    splits: &[Vec<u16>],
    n: usize,
    groups: std::ops::Range<usize>,
    mode: Mode,
    out: SyncPtr,
    m: usize,
    col_base: usize,
    inputs: Inputs,
) {
    // c: [2 passes x 16 split rows][4 blocks x 16 outputs] f32, row stride 256 bytes.
    let mut c = [[0.0f32; GROUP_BLOCKS * TILE_N]; 2 * TILE_M];
    let per = inputs.pass_rows();
    let rows_of = |pass: usize| (n - pass * per).min(per);
    // SAFETY: CONFIG is a valid palette-1 configuration (the caller checked AMX); the kernels' tile
    // accesses stay inside `w.data`, the splits and `c`.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        for group in groups {
            let col0 = col_base + GROUP_BLOCKS * group * TILE_N;
            let cols = (m - col0).min(GROUP_BLOCKS * TILE_N);
            let mut pass = 0;
            while pass < splits.len() {
                let both = pass + 1 < splits.len();
                if both {
                    two_by_two(w, group, &splits[pass], &splits[pass + 1], &mut c);
                } else {
                    one_by_four(w, group, &splits[pass], &mut c);
                }
                for (p, c_rows) in [pass, pass + 1].into_iter().zip(c.chunks(TILE_M)) {
                    if p == pass || both {
                        let rows = rows_of(p);
                        combine(c_rows, rows, p * per, col0, cols, mode, out, m, inputs);
                    }
                }
                pass += if both { 2 } else { 1 };
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// out[first_row + i, col0 + j] = mode(out, (t1 + t2) + t3) over the three split rows of input i.
///
/// # Safety
/// `out` addresses [n, m]; the columns col0..col0+cols of these rows are this task's alone.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn combine(
    c_rows: &[[f32; GROUP_BLOCKS * TILE_N]],
    rows: usize,
    first_row: usize,
    col0: usize,
    cols: usize,
    mode: Mode,
    out: SyncPtr,
    m: usize,
    inputs: Inputs,
) {
    for i in 0..rows {
        // SAFETY: row first_row + i, columns col0..col0 + cols lie inside out and belong to this task.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.0.add((first_row + i) * m + col0), cols) };
        match inputs {
            Inputs::Exact => {
                let (t1, t2, t3) = (
                    &c_rows[TERMS * i],
                    &c_rows[TERMS * i + 1],
                    &c_rows[TERMS * i + 2],
                );
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = mode.apply(*d, (t1[j] + t2[j]) + t3[j]);
                }
            }
            Inputs::Bf16 => {
                for (d, &t) in dst.iter_mut().zip(&c_rows[i]) {
                    *d = mode.apply(*d, t);
                }
            }
        }
    }
}

/// One A tile (five input rows) against the group's four B tiles: c[0..16][0..64].
/// Tiles: tmm0..3 accumulate, tmm4 holds A, tmm5..7 rotate through the B tiles.
///
/// # Safety
/// The tile configuration is loaded; `split` holds k_blocks A tiles.
#[inline]
unsafe fn one_by_four(
    w: &PackedBf16,
    group: usize,
    split: &[u16],
    c: &mut [[f32; GROUP_BLOCKS * TILE_N]; 2 * TILE_M],
) {
    let blocks = w.m.div_ceil(TILE_N);
    // Blocks past the last are clamped to it: computed again, never written.
    let jb = |t: usize| (GROUP_BLOCKS * group + t).min(blocks - 1);
    // SAFETY: tiles are 16 rows of 64 bytes inside w.data, split and c.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for kk in 0..w.k_blocks() {
            for t in 0..GROUP_BLOCKS {
                prefetch_tile(w, jb(t), kk + PREFETCH_BLOCKS);
            }
            asm!(
                "tileloadd tmm4, [{a} + {s}*1]",
                "tileloadd tmm5, [{b0} + {s}*1]",
                "tileloadd tmm6, [{b1} + {s}*1]",
                "tileloadd tmm7, [{b2} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tileloadd tmm5, [{b3} + {s}*1]",
                "tdpbf16ps tmm1, tmm4, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm4, tmm5",
                a = in(reg) split[kk * TILE_M * TILE_K..].as_ptr(),
                b0 = in(reg) w.tile(jb(0), kk),
                b1 = in(reg) w.tile(jb(1), kk),
                b2 = in(reg) w.tile(jb(2), kk),
                b3 = in(reg) w.tile(jb(3), kk),
                s = in(reg) 64usize,
                options(nostack, readonly)
            );
        }
        let cp = c.as_mut_ptr().cast::<f32>();
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) cp,
            c1 = in(reg) cp.add(TILE_N),
            c2 = in(reg) cp.add(2 * TILE_N),
            c3 = in(reg) cp.add(3 * TILE_N),
            s = in(reg) GROUP_BLOCKS * TILE_N * 4,
            options(nostack)
        );
    }
}

/// Two A tiles (ten input rows) against the group's B tiles two at a time: c[0..32][0..64].
/// Tiles: tmm0..3 accumulate (A0·B0, A0·B1, A1·B0, A1·B1), tmm4/5 hold A0/A1, tmm6/7 B0/B1.
///
/// # Safety
/// The tile configuration is loaded; both splits hold k_blocks A tiles.
#[inline]
unsafe fn two_by_two(
    w: &PackedBf16,
    group: usize,
    split0: &[u16],
    split1: &[u16],
    c: &mut [[f32; GROUP_BLOCKS * TILE_N]; 2 * TILE_M],
) {
    let blocks = w.m.div_ceil(TILE_N);
    let jb = |t: usize| (GROUP_BLOCKS * group + t).min(blocks - 1);
    let row_bytes = GROUP_BLOCKS * TILE_N * 4;
    // SAFETY: tiles are 16 rows of 64 bytes inside w.data, the splits and c.
    unsafe {
        for half in 0..2 {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for kk in 0..w.k_blocks() {
                prefetch_tile(w, jb(2 * half), kk + PREFETCH_BLOCKS);
                prefetch_tile(w, jb(2 * half + 1), kk + PREFETCH_BLOCKS);
                asm!(
                    "tileloadd tmm4, [{a0} + {s}*1]",
                    "tileloadd tmm6, [{b0} + {s}*1]",
                    "tileloadd tmm7, [{b1} + {s}*1]",
                    "tileloadd tmm5, [{a1} + {s}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) split0[kk * TILE_M * TILE_K..].as_ptr(),
                    a1 = in(reg) split1[kk * TILE_M * TILE_K..].as_ptr(),
                    b0 = in(reg) w.tile(jb(2 * half), kk),
                    b1 = in(reg) w.tile(jb(2 * half + 1), kk),
                    s = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
            let cp = c.as_mut_ptr().cast::<f32>().add(2 * half * TILE_N);
            asm!(
                "tilestored [{c00} + {s}*1], tmm0",
                "tilestored [{c01} + {s}*1], tmm1",
                "tilestored [{c10} + {s}*1], tmm2",
                "tilestored [{c11} + {s}*1], tmm3",
                c00 = in(reg) cp,
                c01 = in(reg) cp.add(TILE_N),
                c10 = in(reg) cp.add(TILE_M * GROUP_BLOCKS * TILE_N),
                c11 = in(reg) cp.add(TILE_M * GROUP_BLOCKS * TILE_N + TILE_N),
                s = in(reg) row_bytes,
                options(nostack)
            );
        }
    }
}
