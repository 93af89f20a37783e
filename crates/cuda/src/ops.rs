//! Typed launchers, one per kernel in `src/cu/`, each mirroring its kernel's C signature. Shapes are in
//! rows of f32 unless said otherwise; every address is a device address of a buffer sized for them.
//!
//! `linear*` pick the path by row count: up to `gemv_max_rows` rows run the hand-written matrix-vector
//! kernel in groups of at most 16 rows (weights streamed once per group, f32 activations, batch-invariant
//! per row), with the input RMSNorm and the SwiGLU product fused when the rows fit in shared memory —
//! or, for matrices loaded with `LoadOptions::tensor_core_gemv`, the tensor-core kernel (`mma.rs`) in
//! groups of up to 16 rows, norm and SwiGLU fused always; more rows go to cuBLAS (`cublasGemmEx`: bf16 weights with activations rounded to bf16, or f32 x f32,
//! f32 accumulation and output) after a separate norm, which is compute-bound-fast for prefill.
//!
//! Each public launcher reaches its kernels through the device's operations (`exec.rs`): the
//! `launch_*` functions here are what `exec::Kernels` runs; the host emulation (`emu.rs`) stands in for
//! them on a device without kernels.

use cudarc::cublas::{result as blas, sys as bsys};

use crate::buf::{bind, elementwise_grid, launch, launch_smem, Arg};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::mma;
use crate::segment;
use crate::weights::{Mat, WDtype};

pub(crate) use crate::attn::{att_splits, attn_core, attn_prep, attn_run_core};
pub use crate::attn::{
    attention, AttnBufs, AttnCore, AttnShape, Rope, ATT_MAX_D, ATT_SPLITS_COARSE, ATT_SPLITS_FINE,
};
pub(crate) use crate::gdn::{
    conv_prep, gated_norm, gdn_recurrence, GdnArgs, GdnCols, GdnShape, CONV_MAX_K, GDN_MAX_DK,
    GDN_MAX_DV,
};

pub(crate) use crate::launch_limits::LIN_WARPS;
/// Rows per GEMV launch (the kernels are instantiated for 1..=16): a verify block of up to 16 rows
/// streams the weights once.
const LIN_MAX_ROWS: usize = 16;
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

/// The GEMV kernel over `rows` rows (groups of at most 16).
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
        WDtype::Quant => unreachable!("quantized matrices take quant::launch_linear"),
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
        let per_sm = match n {
            0..=1 => LIN_BLOCKS_PER_SM,
            2..=8 => LIN_BLOCKS_PER_SM / 2,
            _ => LIN_BLOCKS_PER_SM / 4,
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
    dev.exec()
        .linear(dev, w, x, y, rows, accumulate, xb, gemv_max_rows)
}

/// [`linear`] as kernels (`exec::Kernels`): the GEMV kernel up to `gemv_max_rows` rows, cuBLAS above.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_linear(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    y: u64,
    rows: usize,
    accumulate: bool,
    xb: u64,
    gemv_max_rows: usize,
) -> Result<(), CudaError> {
    if w.dtype == WDtype::Quant {
        return crate::quant::launch_linear(dev, w, x, y, rows, accumulate, xb, gemv_max_rows);
    }
    if rows > gemv_max_rows {
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
    // Quantized matrices take the norm and the SwiGLU as separate operations.
    let gemv_path = rows <= gemv_max_rows && dev.exec().has_gemv() && w.dtype != WDtype::Quant;
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
    // Quantized matrices take the norm and the SwiGLU as separate operations.
    let gemv_path = rows <= gemv_max_rows && dev.exec().has_gemv() && w.dtype != WDtype::Quant;
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
        WDtype::Quant => unreachable!("quantized matrices take quant::launch_linear"),
    };
    let g = Gemm {
        a: w.buf.ptr,
        m: w.rows,
        k: w.cols,
        b: b_ptr,
        n: rows,
        c: y,
        ldc: w.rows,
        accumulate,
    };
    gemm_ex(dev, a_type, g)
}

/// Row-major C[n, m] (ldc) (+)= B[n, k] · A[m, k]ᵀ by cuBLAS, f32 accumulation and output.
struct Gemm {
    a: u64,
    m: usize,
    k: usize,
    b: u64,
    n: usize,
    c: u64,
    ldc: usize,
    accumulate: bool,
}

/// [`Gemm`] over bf16 A and B (`quant.rs`: a dequantized weight tile against bf16 activations).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_bf16(
    dev: &CudaDevice,
    a: u64,
    m: usize,
    k: usize,
    b: u64,
    n: usize,
    c: u64,
    ldc: usize,
    accumulate: bool,
) -> Result<(), CudaError> {
    let g = Gemm {
        a,
        m,
        k,
        b,
        n,
        c,
        ldc,
        accumulate,
    };
    gemm_ex(dev, bsys::cudaDataType::CUDA_R_16BF, g)
}

fn gemm_ex(dev: &CudaDevice, ab_type: bsys::cudaDataType, g: Gemm) -> Result<(), CudaError> {
    let alpha = 1.0f32;
    let beta = if g.accumulate { 1.0f32 } else { 0.0f32 };
    bind(dev)?;
    // Row-major C[n, m] = B[n, k] · A[m, k]ᵀ is, column-major, Cᵀ[m, n] = op(A as [k, m])ᵀ · Bᵀ[k, n]:
    // transa = T, transb = N.
    // SAFETY: A, B and C are live device buffers of the stated shapes (C with row stride ldc >= m);
    // alpha/beta point to host f32 values (the handle's default pointer mode), and the handle is bound
    // to our stream.
    unsafe {
        blas::gemm_ex(
            *dev.gpu()?.blas.handle(),
            bsys::cublasOperation_t::CUBLAS_OP_T,
            bsys::cublasOperation_t::CUBLAS_OP_N,
            g.m as i32,
            g.n as i32,
            g.k as i32,
            (&alpha as *const f32).cast(),
            g.a as *const std::ffi::c_void,
            ab_type,
            g.k as i32,
            g.b as *const std::ffi::c_void,
            ab_type,
            g.k as i32,
            (&beta as *const f32).cast(),
            g.c as *mut std::ffi::c_void,
            bsys::cudaDataType::CUDA_R_32F,
            g.ldc as i32,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Blas {
        context: format!("GEMM {}x{}x{}", g.n, g.m, g.k),
        reason: format!("{e:?}"),
    })
}

/// x [rows, hidden] = table[ids[r]].
pub fn embed(
    dev: &CudaDevice,
    table: &Mat,
    ids: u64,
    x: u64,
    rows: usize,
) -> Result<(), CudaError> {
    dev.exec().embed(dev, table, ids, x, rows)
}

/// [`embed`] as the kernel (`exec::Kernels`).
pub(crate) fn launch_embed(
    dev: &CudaDevice,
    table: &Mat,
    ids: u64,
    x: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let name = match table.dtype {
        WDtype::Bf16 => "embed_bf16",
        WDtype::F32 => "embed_f32",
        WDtype::Quant => return crate::quant::launch_embed(dev, table, ids, x, rows),
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
    dev.exec()
        .rmsnorm(dev, x, w, y, rows, width, eps, zero_centred)
}

/// [`rmsnorm`] as the kernel (`exec::Kernels`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_rmsnorm(
    dev: &CudaDevice,
    x: u64,
    w: u64,
    y: u64,
    rows: usize,
    width: usize,
    eps: f32,
    zero_centred: bool,
) -> Result<(), CudaError> {
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
    dev.exec().silu_mul(dev, gate_up, act, rows, inter)
}

/// [`silu_mul`] as the kernel (`exec::Kernels`).
pub(crate) fn launch_silu_mul(
    dev: &CudaDevice,
    gate_up: u64,
    act: u64,
    rows: usize,
    inter: usize,
) -> Result<(), CudaError> {
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
    dev.exec().regroup(dev, src, dst, b, hq, hkv, d, inverse)
}

/// [`regroup`] as the kernel (`exec::Kernels`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_regroup(
    dev: &CudaDevice,
    src: u64,
    dst: u64,
    b: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    inverse: bool,
) -> Result<(), CudaError> {
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
