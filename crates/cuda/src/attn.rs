//! Launchers of the attention kernels (attention.cu, attention_tc.cu), re-exported by `ops.rs`:
//! `attn_prep` (q / k RMSNorm and RoPE, k and v into the caches), then the core over the cached keys —
//! split-K (`attn_split` + `attn_combine`, f32, batch-invariant per row) for decode and verify passes,
//! tensor cores (`attn_tc` + `attn_tc_combine`) for prefill passes ([`attn_core`] picks). Both reach the
//! device through its operations (`exec.rs`).

use crate::buf::{launch, launch_smem, Arg};
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Head dims per attn_combine block (ATT_COMBINE_DIMS).
const ATT_COMBINE_DIMS: usize = 64;
pub use crate::launch_limits::ATT_MAX_D;
/// Key chunks per row for passes of at most `gemv_max_rows` rows (decode, verify): enough blocks for a
/// one-row decode at any context (ATT_MAX_SPLITS in attention.cu).
pub const ATT_SPLITS_FINE: usize = 64;
/// Key chunks per row for larger (prefill) passes, whose rows already fill the GPU; bounds the partials.
pub const ATT_SPLITS_COARSE: usize = 8;

/// Chunks per attention row for a pass of `rows` rows (the kernels' s_max). Decode and verify rows
/// share one value, so a row's chunking (and bits) does not depend on its pass; `TURBOSPARK_ATT_SPLITS=N`
/// (1..=64) lowers it for every such pass (measurements: fewer, longer chunks, a smaller combine).
pub(crate) fn att_splits(rows: usize, gemv_max_rows: usize) -> usize {
    static FINE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if rows <= gemv_max_rows {
        *FINE.get_or_init(|| {
            crate::debug_env::get()
                .att_splits
                .map_or(ATT_SPLITS_FINE, |n| n.clamp(1, ATT_SPLITS_FINE))
        })
    } else {
        ATT_SPLITS_COARSE
    }
}

/// Shapes of one attention layer, for the launchers.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub rot_half: usize,
    pub gated: bool,
    pub eps: f32,
    pub zero_centred: bool,
}

/// Buffers of one attention call.
pub struct AttnBufs {
    pub qkv: u64,
    pub q: u64,
    pub gate: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub start: u64,
    pub part_m: u64,
    pub part_l: u64,
    pub part_acc: u64,
    pub out: u64,
    /// Where attn_prep's RoPE cos / sin come from.
    pub rope: Rope,
}

/// attn_prep's RoPE cos / sin (attention.cu ATT_ROPE_*): computed (f64 trig), or, within one pass of at
/// most the table's rows, computed and stored by the pass's first attention layer into `f32 [rows, 2,
/// ATT_MAX_D]` at the address and read back by the later ones (the same values, without the trig).
#[derive(Clone, Copy, Debug)]
pub enum Rope {
    Compute,
    Store(u64),
    Read(u64),
}

impl Rope {
    fn args(self) -> [Arg; 2] {
        match self {
            Rope::Compute => [Arg::P(0), Arg::I(0)],
            Rope::Store(p) => [Arg::P(p), Arg::I(1)],
            Rope::Read(p) => [Arg::P(p), Arg::I(2)],
        }
    }
}

/// Warps per attn_tc block (ATC_WARPS), each over 16 query rows of one head.
const ATT_TC_WARPS: usize = 4;
/// Dynamic shared memory of attn_tc_<d>: 64 (d + 8) words (Q, K and V tiles, attention_tc.cu).
pub(crate) fn att_tc_smem(d: usize) -> usize {
    256 * (d + 8)
}

/// How attention runs after attn_prep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnCore {
    /// attn_split + attn_combine (f32, CUDA cores) with `s_max` key chunks per row: decode and verify
    /// passes, batch-invariant per row.
    SplitK { s_max: usize },
    /// attn_tc (bf16 tensor cores, f32 softmax) over `splits` key ranges (1: no attn_tc_combine):
    /// prefill passes. `splits` <= the split buffers' s_max.
    TensorCores { splits: usize },
}

/// The attention core of a pass of `rows` rows: split-K up to `gemv_max_rows` rows (and for head dims
/// attn_tc is not built for, or with `tc` off); above, tensor cores with `tc_splits` key splits (0:
/// enough to put ~4 blocks on each of `sms` multiprocessors, at most ATT_SPLITS_COARSE).
pub(crate) fn attn_core(
    s: AttnShape,
    rows: usize,
    gemv_max_rows: usize,
    tc: bool,
    tc_splits: usize,
    sms: usize,
) -> AttnCore {
    let s_max = att_splits(rows, gemv_max_rows);
    if rows <= gemv_max_rows || !tc || ![16, 32, 64, 128, 256].contains(&s.d) {
        return AttnCore::SplitK { s_max };
    }
    let splits = if tc_splits > 0 {
        tc_splits
    } else {
        let blocks = rows.div_ceil(16 * ATT_TC_WARPS / att_gq(s)) * (s.hq / att_gq(s));
        (4 * sms.max(1)).div_ceil(blocks.max(1))
    };
    AttnCore::TensorCores {
        splits: splits.clamp(1, s_max),
    }
}

/// Query heads per block sharing one KV head's loads: the largest of 4, 2, 1 dividing the GQA group.
fn att_gq(s: AttnShape) -> usize {
    let group = s.hq / s.hkv;
    [4, 2, 1]
        .into_iter()
        .find(|g| group.is_multiple_of(*g))
        .unwrap_or(1)
}

/// attn_prep, then the attention `core` over `rows` rows. The split buffers are [rows, hq, s_max(, d)]
/// for split-K and [rows, hq, splits(, d)] for tensor cores.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
    rows: usize,
    core: AttnCore,
) -> Result<(), CudaError> {
    attn_prep(dev, s, b, q_norm, k_norm, inv_freq, rows)?;
    attn_run_core(dev, s, b, rows, core)
}

/// attn_prep over `rows` rows: q (normed, rotated) and gate to `b.q` / `b.gate`, k (normed, rotated)
/// and v into the caches at positions start..start+rows.
pub(crate) fn attn_prep(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
    rows: usize,
) -> Result<(), CudaError> {
    dev.exec()
        .attn_prep(dev, s, b, q_norm, k_norm, inv_freq, rows)
}

/// [`attn_prep`] as the kernel (`exec::Kernels`).
pub(crate) fn launch_prep(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let r = rows as u32;
    launch(
        dev,
        "attn_prep",
        ((s.hq + s.hkv) as u32, r, 1),
        128,
        &[
            Arg::P(b.qkv),
            Arg::P(q_norm),
            Arg::P(k_norm),
            Arg::P(inv_freq),
            Arg::P(b.start),
            Arg::P(b.q),
            Arg::P(b.gate),
            Arg::P(b.k_cache),
            Arg::P(b.v_cache),
            Arg::I(s.hq as i32),
            Arg::I(s.hkv as i32),
            Arg::I(s.d as i32),
            Arg::I(s.rot_half as i32),
            Arg::I(s.gated as i32),
            Arg::F(s.eps),
            Arg::I(s.zero_centred as i32),
            b.rope.args()[0],
            b.rope.args()[1],
        ],
    )
}

/// The attention `core` over `rows` query rows in `b.q` (row r attends to cache rows 0..=start+r)
/// into `b.out`, gated by `b.gate` when the shape is gated.
pub(crate) fn attn_run_core(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    rows: usize,
    core: AttnCore,
) -> Result<(), CudaError> {
    dev.exec().attn_run_core(dev, s, b, rows, core)
}

/// [`attn_run_core`] as kernels (`exec::Kernels`).
pub(crate) fn launch_core(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    rows: usize,
    core: AttnCore,
) -> Result<(), CudaError> {
    let r = rows as u32;
    let scale = 1.0f32 / (s.d as f32).sqrt();
    let s_max = match core {
        AttnCore::SplitK { s_max } => s_max,
        AttnCore::TensorCores { splits } => return attention_tc(dev, s, b, rows, splits, scale),
    };
    let (group, gq) = (s.hq / s.hkv, att_gq(s));
    // Head dims up to 128 fold 8 keys a warp per round (attention.cu's _d128 forms).
    let form = if s.d <= 128 { "_d128" } else { "" };
    launch(
        dev,
        &format!("attn_split_{gq}{form}"),
        (s_max as u32, (s.hkv * group / gq) as u32, r),
        128,
        &[
            Arg::P(b.q),
            Arg::P(b.k_cache),
            Arg::P(b.v_cache),
            Arg::P(b.start),
            Arg::P(b.part_m),
            Arg::P(b.part_l),
            Arg::P(b.part_acc),
            Arg::I(s.hq as i32),
            Arg::I(s.hkv as i32),
            Arg::I(s.d as i32),
            Arg::I(s_max as i32),
            Arg::F(scale),
        ],
    )?;
    launch(
        dev,
        "attn_combine",
        (s.hq as u32, r, s.d.div_ceil(ATT_COMBINE_DIMS) as u32),
        ATT_COMBINE_DIMS as u32,
        &[
            Arg::P(b.part_m),
            Arg::P(b.part_l),
            Arg::P(b.part_acc),
            Arg::P(b.start),
            Arg::P(b.gate),
            Arg::P(b.out),
            Arg::I(s.hq as i32),
            Arg::I(s.d as i32),
            Arg::I(s_max as i32),
            Arg::I(s.gated as i32),
        ],
    )
}

/// attn_tc_<d> (+ attn_tc_combine when splits > 1) over `rows` rows whose q and cache rows attn_prep
/// has written. Grid: (row blocks of 16 x 4 / gq rows, hkv x group / gq, splits), 4 warps.
fn attention_tc(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    rows: usize,
    splits: usize,
    scale: f32,
) -> Result<(), CudaError> {
    let gq = att_gq(s);
    let row_blocks = rows.div_ceil(16 * ATT_TC_WARPS / gq);
    launch_smem(
        dev,
        &format!("attn_tc_{}", s.d),
        (row_blocks as u32, (s.hq / gq) as u32, splits as u32),
        (32 * ATT_TC_WARPS) as u32,
        att_tc_smem(s.d) as u32,
        &[
            Arg::P(b.q),
            Arg::P(b.k_cache),
            Arg::P(b.v_cache),
            Arg::P(b.start),
            Arg::P(b.gate),
            Arg::P(b.out),
            Arg::P(b.part_m),
            Arg::P(b.part_l),
            Arg::P(b.part_acc),
            Arg::I(rows as i32),
            Arg::I(s.hq as i32),
            Arg::I(s.hkv as i32),
            Arg::I(gq as i32),
            Arg::I(splits as i32),
            Arg::I(s.gated as i32),
            Arg::F(scale),
        ],
    )?;
    if splits == 1 {
        return Ok(());
    }
    launch(
        dev,
        "attn_tc_combine",
        (s.hq as u32, rows as u32, 1),
        128,
        &[
            Arg::P(b.part_m),
            Arg::P(b.part_l),
            Arg::P(b.part_acc),
            Arg::P(b.start),
            Arg::P(b.gate),
            Arg::P(b.out),
            Arg::I(rows as i32),
            Arg::I(s.hq as i32),
            Arg::I(s.d as i32),
            Arg::I(splits as i32),
            Arg::I(s.gated as i32),
        ],
    )
}
