//! Typed launchers, one per kernel in `src/cu/`, each mirroring its kernel's C signature. Shapes are in
//! rows of f32 unless said otherwise; every address is a device address of a buffer sized for them.
//!
//! `linear*` pick the path by row count: up to `gemv_max_rows` rows run the hand-written matrix-vector
//! kernel in groups of at most 8 rows (weights streamed once per group, f32 activations, batch-invariant
//! per row), with the input RMSNorm and the SwiGLU product fused when the rows fit in shared memory —
//! or, for matrices loaded with `LoadOptions::tensor_core_gemv`, the tensor-core kernel (`mma.rs`) in
//! groups of up to 16 rows, norm and SwiGLU fused always; more rows go to cuBLAS (`cublasGemmEx`: bf16 weights with activations rounded to bf16, or f32 x f32,
//! f32 accumulation and output) after a separate norm, which is compute-bound-fast for prefill.

use cudarc::cublas::{result as blas, sys as bsys};

use crate::buf::{bind, elementwise_grid, launch, launch_smem, Arg};
use crate::device::CudaDevice;
use crate::emu;
use crate::error::CudaError;
use crate::mma;
use crate::segment;
use crate::weights::{Mat, WDtype};

pub(crate) use crate::gdn::{
    conv_prep, gated_norm, gdn_recurrence, GdnArgs, GdnCols, GdnShape, CONV_MAX_K, GDN_MAX_DK,
    GDN_MAX_DV,
};

pub(crate) use crate::launch_limits::LIN_WARPS;
/// Rows per GEMV launch (the kernels are instantiated for 1..=8).
const LIN_MAX_ROWS: usize = 8;
/// Output rows per warp of the GEMV kernel for a launch of `n` input rows (LIN_R in linear.cu).
fn gemv_rows_per_warp(n: usize) -> usize {
    match n {
        0..=1 => 1,
        2 => 2,
        _ => 4,
    }
}
/// Largest staged input (rows x width x 4 bytes) of a GEMV block: dynamic shared memory without the
/// opt-in attribute is limited to 48 KiB, and 4 such blocks still fit on an SM.
const LIN_STAGE_BYTES: usize = 40 * 1024;
/// Resident GEMV blocks per SM aimed for (grid of a staged, grid-stride launch; wpr choice).
const LIN_BLOCKS_PER_SM: usize = 4;
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

/// Warps per output row of a GEMV over a matrix with `out` rows: the fewest (1, 2, 4 or 8) that give
/// at least 2 * LIN_BLOCKS_PER_SM blocks per SM. A function of the shape and the device only, so that
/// every row count sums a row in the same order. SwiGLU needs two row slots per block (<= 4).
fn gemv_wpr(out: usize, swiglu: bool, sms: usize) -> usize {
    let target = 2 * LIN_BLOCKS_PER_SM * sms.max(1);
    let cap = if swiglu { 4 } else { 8 };
    let mut wpr = 1;
    while wpr < cap && (out * wpr).div_ceil(LIN_WARPS) < target {
        wpr *= 2;
    }
    wpr
}

/// The RMSNorm applied to a GEMV's input rows.
#[derive(Clone, Copy, Debug)]
pub struct NormW {
    pub w: u64,
    pub eps: f32,
    pub zero_centred: bool,
}

/// What a GEMV launch does with its input and output.
#[derive(Clone, Copy)]
pub(crate) struct GemvMode {
    pub accumulate: bool,
    /// SwiGLU epilogue over [gate ; up] rows: act [rows, I] with I = w.rows / 2.
    pub swiglu: bool,
    /// Normalise the input rows in the kernel's prologue (requires staging on the FMA kernel).
    pub norm: Option<NormW>,
    pub stage: bool,
}

/// The GEMV kernel over `rows` rows (groups of at most 8).
fn gemv(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    y: u64,
    rows: usize,
    mode: GemvMode,
) -> Result<(), CudaError> {
    if mma::mma_path(dev, w) {
        return mma::gemv_mma(dev, w, x, y, rows, mode);
    }
    let prefix = match w.dtype {
        WDtype::Bf16 => "linear_bf16_",
        WDtype::F32 => "linear_f32_",
    };
    let sms = dev.info.sms.max(1) as usize;
    let wpr = gemv_wpr(w.rows, mode.swiglu, sms);
    let per_group = LIN_WARPS / wpr;
    let (y_width, inter) = if mode.swiglu {
        (w.rows / 2, w.rows / 2)
    } else {
        (w.rows, 0)
    };
    let mut r0 = 0;
    while r0 < rows {
        let n = (rows - r0).min(LIN_MAX_ROWS);
        let slot_rows = gemv_rows_per_warp(n);
        let groups = if mode.swiglu {
            inter.div_ceil(per_group / 2 * slot_rows)
        } else {
            w.rows.div_ceil(per_group * slot_rows)
        };
        // Staged launches loop over row groups with as many blocks as are resident at once (the
        // kernels' __launch_bounds__ minimum by row count).
        let per_sm = if n <= 1 {
            LIN_BLOCKS_PER_SM
        } else {
            LIN_BLOCKS_PER_SM / 2
        };
        // Balanced: every block takes the same number of row groups (rounds), so none idles at the end.
        let blocks = if mode.stage {
            let rounds = groups.div_ceil(per_sm * sms);
            groups.div_ceil(rounds)
        } else {
            groups
        };
        let shared = if mode.stage { n * w.cols * 4 } else { 0 };
        let norm = mode.norm.unwrap_or(NormW {
            w: 0,
            eps: 0.0,
            zero_centred: false,
        });
        if rows == 1 && w.dtype == WDtype::Bf16 {
            let st = segment::Stage {
                w: w.buf.ptr,
                x,
                y,
                // linear.cu normalises only a staged input.
                norm_w: if mode.stage { norm.w } else { 0 },
                gate_z: 0,
                gated_dv: 0,
                cols: w.cols,
                rows: w.rows,
                accumulate: mode.accumulate,
                wpr,
                inter,
                zero_centred: norm.zero_centred,
                eps: norm.eps,
                blocks: blocks as u32,
                stage: mode.stage,
            };
            if segment::queue(dev, st)? {
                r0 += n;
                continue;
            }
        }
        launch_smem(
            dev,
            &format!("{prefix}{n}"),
            (blocks as u32, 1, 1),
            (LIN_WARPS * 32) as u32,
            shared as u32,
            &[
                Arg::P(w.buf.ptr),
                Arg::P(x + (r0 * w.cols * 4) as u64),
                Arg::P(y + (r0 * y_width * 4) as u64),
                Arg::I(w.cols as i32),
                Arg::I(w.rows as i32),
                Arg::I(mode.accumulate as i32),
                Arg::I(wpr as i32),
                Arg::I(inter as i32),
                Arg::P(norm.w),
                Arg::F(norm.eps),
                Arg::I(norm.zero_centred as i32),
                Arg::I(mode.stage as i32),
            ],
        )?;
        r0 += n;
    }
    Ok(())
}

/// Whether groups of up to `rows` input rows of width `cols` fit the GEMV's shared-memory stage.
fn stageable(rows: usize, cols: usize) -> bool {
    rows.min(LIN_MAX_ROWS) * cols * 4 <= LIN_STAGE_BYTES
}

/// y [rows, w.rows] (+)= x [rows, w.cols] · wᵀ. `xb` is bf16 scratch of rows * w.cols for the cuBLAS path.
#[allow(clippy::too_many_arguments)]
pub fn linear(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    y: u64,
    rows: usize,
    accumulate: bool,
    xb: u64,
    gemv_max_rows: usize,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    if dev.host_ops() {
        return emu::linear(w, x, y, rows, accumulate, gemv_max_rows);
    }
    if rows > gemv_max_rows {
        if dev.sim().is_some() {
            // No cuBLAS in the simulator: the host GEMM with the same bf16 activation rounding.
            return emu::linear(w, x, y, rows, accumulate, gemv_max_rows);
        }
        return gemm(dev, w, x, y, rows, accumulate, xb);
    }
    let mode = GemvMode {
        accumulate,
        swiglu: false,
        norm: None,
        stage: false,
    };
    gemv(dev, w, x, y, rows, mode)
}

/// y [rows, w.rows] = RMSNorm(x) · wᵀ. The normalised rows go to `h` [rows, w.cols] whenever the norm
/// is not fused into the GEMV (more rows than stage, or the cuBLAS path).
#[allow(clippy::too_many_arguments)]
pub fn linear_normed(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    norm: NormW,
    h: u64,
    y: u64,
    rows: usize,
    xb: u64,
    gemv_max_rows: usize,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    let gemv_path = rows <= gemv_max_rows && !dev.host_ops();
    if gemv_path && (mma::mma_path(dev, w) || stageable(rows, w.cols)) {
        let mode = GemvMode {
            accumulate: false,
            swiglu: false,
            norm: Some(norm),
            stage: true,
        };
        return gemv(dev, w, x, y, rows, mode);
    }
    rmsnorm(dev, x, norm.w, h, rows, w.cols, norm.eps, norm.zero_centred)?;
    linear(dev, w, h, y, rows, false, xb, gemv_max_rows)
}

/// act [rows, I] = silu(g) * u with [g ; u] = RMSNorm(x) · wᵀ (w = [gate ; up], [2I, cols]). `h` takes
/// the normalised rows and `big` [rows, 2I] the projection when they are not fused.
#[allow(clippy::too_many_arguments)]
pub fn linear_swiglu(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    norm: NormW,
    h: u64,
    big: u64,
    act: u64,
    rows: usize,
    xb: u64,
    gemv_max_rows: usize,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    let gemv_path = rows <= gemv_max_rows && !dev.host_ops();
    if gemv_path && (mma::mma_path(dev, w) || stageable(rows, w.cols)) {
        let mode = GemvMode {
            accumulate: false,
            swiglu: true,
            norm: Some(norm),
            stage: true,
        };
        return gemv(dev, w, x, act, rows, mode);
    }
    rmsnorm(dev, x, norm.w, h, rows, w.cols, norm.eps, norm.zero_centred)?;
    if gemv_path {
        let mode = GemvMode {
            accumulate: false,
            swiglu: true,
            norm: None,
            stage: false,
        };
        return gemv(dev, w, h, act, rows, mode);
    }
    linear(dev, w, h, big, rows, false, xb, gemv_max_rows)?;
    silu_mul(dev, big, act, rows, w.rows / 2)
}

fn gemm(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    y: u64,
    rows: usize,
    accumulate: bool,
    xb: u64,
) -> Result<(), CudaError> {
    let (a_type, b_ptr) = match w.dtype {
        WDtype::Bf16 => {
            let count = rows * w.cols;
            launch(
                dev,
                "to_bf16",
                elementwise_grid(count),
                256,
                &[Arg::P(x), Arg::P(xb), Arg::L(count as i64)],
            )?;
            (bsys::cudaDataType::CUDA_R_16BF, xb)
        }
        WDtype::F32 => (bsys::cudaDataType::CUDA_R_32F, x),
    };
    let alpha = 1.0f32;
    let beta = if accumulate { 1.0f32 } else { 0.0f32 };
    bind(dev)?;
    // Row-major Y[rows, out] = X[rows, in] · W[out, in]ᵀ is, column-major, Yᵀ[out, rows] =
    // op(W as [in, out])ᵀ · Xᵀ[in, rows]: transa = T, m = out, n = rows, k = in.
    // SAFETY: W, X (or its bf16 copy) and Y are live device buffers of the stated shapes; alpha/beta
    // point to host f32 values (the handle's default pointer mode), and the handle is bound to our stream.
    unsafe {
        blas::gemm_ex(
            *dev.gpu()?.blas.handle(),
            bsys::cublasOperation_t::CUBLAS_OP_T,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            w.rows as i32,
            rows as i32,
            w.cols as i32,
            (&alpha as *const f32).cast(),
            w.buf.ptr as *const std::ffi::c_void,
            a_type,
            w.cols as i32,
            b_ptr as *const std::ffi::c_void,
            a_type,
            w.cols as i32,
            (&beta as *const f32).cast(),
            y as *mut std::ffi::c_void,
            bsys::cudaDataType::CUDA_R_32F,
            w.rows as i32,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Blas {
        context: format!("GEMM {rows}x{}x{}", w.rows, w.cols),
        reason: format!("{e:?}"),
    })
}

/// x [rows, hidden] = table[ids[r]].
pub(crate) fn embed(
    dev: &CudaDevice,
    table: &Mat,
    ids: u64,
    x: u64,
    rows: usize,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::embed(table, ids, x, rows);
    }
    let name = match table.dtype {
        WDtype::Bf16 => "embed_bf16",
        WDtype::F32 => "embed_f32",
    };
    launch(
        dev,
        name,
        (rows as u32, 1, 1),
        256,
        &[
            Arg::P(table.buf.ptr),
            Arg::P(ids),
            Arg::P(x),
            Arg::I(table.cols as i32),
        ],
    )
}

/// y [rows, width] = RMSNorm(x) with weight w [width].
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    dev: &CudaDevice,
    x: u64,
    w: u64,
    y: u64,
    rows: usize,
    width: usize,
    eps: f32,
    zero_centred: bool,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::rmsnorm(x, w, y, rows, width, eps, zero_centred);
    }
    launch(
        dev,
        "rmsnorm",
        (rows as u32, 1, 1),
        256,
        &[
            Arg::P(x),
            Arg::P(w),
            Arg::P(y),
            Arg::I(width as i32),
            Arg::F(eps),
            Arg::I(zero_centred as i32),
        ],
    )
}

/// act [rows, inter] = silu(gate_up[:, :inter]) * gate_up[:, inter:].
pub(crate) fn silu_mul(
    dev: &CudaDevice,
    gate_up: u64,
    act: u64,
    rows: usize,
    inter: usize,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::silu_mul(gate_up, act, rows, inter);
    }
    let count = rows * inter;
    launch(
        dev,
        "silu_mul",
        elementwise_grid(count),
        256,
        &[
            Arg::P(gate_up),
            Arg::P(act),
            Arg::I(inter as i32),
            Arg::L(count as i64),
        ],
    )
}

/// `dst` = the b rows [b, hq, d] of `src` as one row of b * hq heads grouped by kv head (head
/// (kvh * b + r) * group + j), or back with `inverse`: non-causal attention of b rows as causal
/// attention of that one row at the block's last position (dflash.rs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn regroup(
    dev: &CudaDevice,
    src: u64,
    dst: u64,
    b: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    inverse: bool,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::regroup(src, dst, b, hq, hkv, d, inverse);
    }
    launch(
        dev,
        "dflash_regroup",
        elementwise_grid(b * hq * d),
        256,
        &[
            Arg::P(src),
            Arg::P(dst),
            Arg::I(b as i32),
            Arg::I(hq as i32),
            Arg::I(hkv as i32),
            Arg::I(d as i32),
            Arg::I(inverse as i32),
        ],
    )
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
    if dev.host_ops() {
        return emu::attn_prep(s, b, q_norm, k_norm, inv_freq, rows);
    }
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
    if dev.host_ops() {
        return emu::attn_core(s, b, rows);
    }
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
