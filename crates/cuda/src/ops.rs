//! Typed launchers, one per kernel in `src/cu/`, each mirroring its kernel's C signature. Shapes are in
//! rows of f32 unless said otherwise; every address is a device address of a buffer sized for them.
//!
//! `linear` picks the path by row count: up to `gemv_max_rows` rows run the hand-written matrix-vector
//! kernel in groups of at most 8 rows (weights streamed once per group, f32 activations, batch-invariant
//! per row); more rows go to cuBLAS (`cublasGemmEx`: bf16 weights with activations rounded to bf16, or
//! f32 x f32, f32 accumulation and output), which is compute-bound-fast for prefill.

use cudarc::cublas::{result as blas, sys as bsys};

use crate::buf::{bind, elementwise_grid, launch, Arg};
use crate::device::CudaDevice;
use crate::emu;
use crate::error::CudaError;
use crate::weights::{Mat, WDtype};

/// Output features per GEMV block (8 warps, one feature each).
const LIN_WARPS: usize = 8;
/// Rows per GEMV launch (the kernels are instantiated for 1..=8).
const LIN_MAX_ROWS: usize = 8;
/// Keys per attention split (ATT_CHUNK in attention.cu).
pub(crate) const ATT_CHUNK: usize = 256;
/// Largest head_dim the attention kernels hold per lane (ATT_MAX_D).
pub(crate) const ATT_MAX_D: usize = 256;
/// Largest key head dim of the GDN step kernel (GDN_MAX_DK).
pub(crate) const GDN_MAX_DK: usize = 128;
/// Largest conv kernel of conv1d_silu.
pub(crate) const CONV_MAX_K: usize = 8;

/// y [rows, w.rows] (+)= x [rows, w.cols] · wᵀ. `xb` is bf16 scratch of rows * w.cols for the cuBLAS path.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear(
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
    let prefix = match w.dtype {
        WDtype::Bf16 => "linear_bf16_",
        WDtype::F32 => "linear_f32_",
    };
    let grid = (w.rows.div_ceil(LIN_WARPS) as u32, 1, 1);
    let mut r0 = 0;
    while r0 < rows {
        let n = (rows - r0).min(LIN_MAX_ROWS);
        launch(
            dev,
            &format!("{prefix}{n}"),
            grid,
            (LIN_WARPS * 32) as u32,
            &[
                Arg::P(w.buf.ptr),
                Arg::P(x + (r0 * w.cols * 4) as u64),
                Arg::P(y + (r0 * w.rows * 4) as u64),
                Arg::I(w.cols as i32),
                Arg::I(w.rows as i32),
                Arg::I(accumulate as i32),
            ],
        )?;
        r0 += n;
    }
    Ok(())
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
pub(crate) fn rmsnorm(
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

/// Shapes of one attention layer, for the launchers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub rot_half: usize,
    pub gated: bool,
    pub eps: f32,
    pub zero_centred: bool,
}

/// Buffers of one attention call.
pub(crate) struct AttnBufs {
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
}

/// attn_prep + attn_split + attn_combine over `rows` rows; `max_splits` is the stride of the split
/// buffers and the grid's split extent (>= ceil((start + rows) / ATT_CHUNK)).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    dev: &CudaDevice,
    s: AttnShape,
    b: &AttnBufs,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
    rows: usize,
    max_splits: usize,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::attention(s, b, q_norm, k_norm, inv_freq, rows);
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
        ],
    )?;
    let scale = 1.0f32 / (s.d as f32).sqrt();
    launch(
        dev,
        "attn_split",
        (max_splits as u32, s.hq as u32, r),
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
            Arg::I(max_splits as i32),
            Arg::F(scale),
        ],
    )?;
    launch(
        dev,
        "attn_combine",
        (s.hq as u32, r, 1),
        128,
        &[
            Arg::P(b.part_m),
            Arg::P(b.part_l),
            Arg::P(b.part_acc),
            Arg::P(b.start),
            Arg::P(b.gate),
            Arg::P(b.out),
            Arg::I(s.hq as i32),
            Arg::I(s.d as i32),
            Arg::I(max_splits as i32),
            Arg::I(s.gated as i32),
        ],
    )
}

/// Shapes of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GdnShape {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub kernel: usize,
}

impl GdnShape {
    pub fn conv_dim(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    /// Width of the fused projection row [qkv ; z ; b ; a].
    pub fn proj_width(&self) -> usize {
        self.conv_dim() + self.hv * self.dv + 2 * self.hv
    }
}

/// conv1d_silu then gdn_step over `rows` rows of the fused projection `proj` [rows, proj_width]:
/// mixed [rows, conv_dim] (scratch), o [rows, hv, dv]; window and state updated in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_recurrence(
    dev: &CudaDevice,
    s: GdnShape,
    proj: u64,
    conv_w: u64,
    window: u64,
    mixed: u64,
    a_log: u64,
    dt_bias: u64,
    state: u64,
    o: u64,
    rows: usize,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::gdn_recurrence(
            s, proj, conv_w, window, mixed, a_log, dt_bias, state, o, rows,
        );
    }
    let cd = s.conv_dim();
    let ldp = s.proj_width() as i32;
    launch(
        dev,
        "conv1d_silu",
        (cd.div_ceil(128) as u32, 1, 1),
        128,
        &[
            Arg::P(proj),
            Arg::I(ldp),
            Arg::P(conv_w),
            Arg::P(window),
            Arg::P(mixed),
            Arg::I(rows as i32),
            Arg::I(cd as i32),
            Arg::I(s.kernel as i32),
        ],
    )?;
    launch(
        dev,
        "gdn_step",
        (s.hv as u32, s.dv.div_ceil(32) as u32, 1),
        128,
        &[
            Arg::P(mixed),
            Arg::P(proj),
            Arg::I(ldp),
            Arg::I((cd + s.hv * s.dv) as i32),
            Arg::P(a_log),
            Arg::P(dt_bias),
            Arg::P(state),
            Arg::P(o),
            Arg::I(rows as i32),
            Arg::I(s.hk as i32),
            Arg::I(s.hv as i32),
            Arg::I(s.dk as i32),
            Arg::I(s.dv as i32),
        ],
    )
}

/// o [rows, hv, dv] <- (RMSNorm(o) * w) * silu(z), z read from the fused projection.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_norm(
    dev: &CudaDevice,
    s: GdnShape,
    o: u64,
    proj: u64,
    w: u64,
    eps: f32,
    rows: usize,
) -> Result<(), CudaError> {
    if dev.host_ops() {
        return emu::gated_norm(s, o, proj, w, eps, rows);
    }
    let z = proj + (s.conv_dim() * 4) as u64;
    launch(
        dev,
        "gated_rmsnorm",
        ((rows * s.hv) as u32, 1, 1),
        128,
        &[
            Arg::P(o),
            Arg::P(z),
            Arg::I(s.proj_width() as i32),
            Arg::P(w),
            Arg::F(eps),
            Arg::I(s.hv as i32),
            Arg::I(s.dv as i32),
        ],
    )
}
