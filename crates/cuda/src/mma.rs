//! Host side of the tensor-core GEMV (`src/cu/linear_mma.cu`): which matrices take it
//! (`LoadOptions::tensor_core_gemv`, bf16, whole 32-column chunks, sm_80+), the compiled variants and the
//! choice among them per matrix shape, and the launcher.
//!
//! Invariant: the kernel and variant of a matrix depend on its shape, the device and the load option
//! only, never on the row count, so a verify row equals the same row decoded alone, bit for bit.

use crate::buf::{launch, launch_smem, Arg};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::ops::{GemvMode, NormW, LIN_WARPS};
use crate::weights::{Mat, WDtype};

pub(crate) use crate::launch_limits::{MMA_MAX_ROWS, MMA_STAGE_BYTES};
/// Normed launches of at least this many rows split their input once (mma_split_rows) instead of in
/// every block: the per-block prologue grows with the rows (a 4-row verify's normed GEMVs at
/// 1.5-1.9x one row); one row keeps the in-block stage (no extra launch on the decode path).
const PRESPLIT_MIN_ROWS: usize = 2;

/// Whether `w` runs on the tensor-core GEMV (linear_mma.cu): bf16 weights in whole 32-column chunks on a
/// device with bf16 mma (sm_80+; the simulator emulates it). A function of the matrix and the device
/// only, so decode rows and verify rows of one matrix always take the same kernel.
pub(crate) fn mma_path(dev: &CudaDevice, w: &Mat) -> bool {
    match FORCED.with(|c| c.get()) {
        Some(GemvKernel::Fma) => return false,
        Some(GemvKernel::Mma(_)) => {}
        None if !w.tensor_cores => return false,
        None => {}
    }
    w.dtype == WDtype::Bf16
        && w.cols.is_multiple_of(32)
        && (dev.sim().is_some() || dev.info.arch >= 80)
}

/// A compiled tensor-core GEMV variant (linear_mma.cu): weight tiles of 8 rows per warp, 32-column chunks
/// in flight per warp, and the minimum resident blocks per SM it was compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaVariant {
    pub tiles: usize,
    pub unroll: usize,
    pub min_blocks: usize,
}

/// Every variant compiled into the module (LINEAR_MMA_VARIANT in linear_mma.cu).
pub const MMA_VARIANTS: [MmaVariant; 7] = [
    MmaVariant::new(1, 4, 4),
    MmaVariant::new(1, 8, 3),
    MmaVariant::new(2, 2, 4),
    MmaVariant::new(2, 4, 2),
    MmaVariant::new(2, 4, 3),
    MmaVariant::new(4, 2, 2),
    MmaVariant::new(4, 2, 3),
];

impl MmaVariant {
    pub const fn new(tiles: usize, unroll: usize, min_blocks: usize) -> Self {
        MmaVariant {
            tiles,
            unroll,
            min_blocks,
        }
    }

    /// The kernel's name for `rows` input rows (more than 8 use the A fragment's rows g + 8 too).
    pub fn kernel(&self, rows: usize) -> String {
        let (t, u, b) = (self.tiles, self.unroll, self.min_blocks);
        let half = if rows > 8 { "full" } else { "half" };
        format!("linear_mma_t{t}_u{u}_b{b}_{half}")
    }
}

/// A GEMV kernel choice the GEMV sweep (cuda-lab `sweep.rs`) can force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvKernel {
    /// The FMA kernel (linear.cu).
    Fma,
    Mma(MmaVariant),
}

thread_local! {
    /// The kernel the GEMV sweep forces on this thread (None: chosen by shape).
    static FORCED: std::cell::Cell<Option<GemvKernel>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every bf16 GEMV on this thread using `kernel` (the GEMV sweep).
pub fn with_gemv_kernel<R>(kernel: Option<GemvKernel>, f: impl FnOnce() -> R) -> R {
    let before = FORCED.with(|c| c.replace(kernel));
    let out = f();
    FORCED.with(|c| c.set(before));
    out
}

/// The variant for a [rows, cols] matrix, from the shape and device alone (batch invariance).
fn mma_variant(rows: usize, cols: usize, swiglu: bool, sms: usize) -> MmaVariant {
    if let Some(GemvKernel::Mma(v)) = FORCED.with(|c| c.get()) {
        if !(swiglu && v.tiles < 2) {
            return v;
        }
    }
    // The fastest variant per qwen35-4b shape over 1, 4 and 8 rows (measured with `cuda_check --sweep`).
    if swiglu {
        MmaVariant::new(2, 4, 3)
    } else if rows.div_ceil(32) >= 2 * sms.max(1) {
        MmaVariant::new(4, 2, 3)
    } else if cols >= 8192 {
        MmaVariant::new(1, 8, 3)
    } else {
        MmaVariant::new(2, 4, 3)
    }
}

/// Warps splitting the columns of one tensor-core GEMV unit: the fewest (1, 2, 4 or 8) giving at least
/// 32 warps per SM (two resident 8-warp blocks per SM, twice over), from the shape and device alone.
fn mma_wpk(units: usize, sms: usize) -> usize {
    let target = 32 * sms.max(1);
    let mut wpk = 1;
    while wpk < LIN_WARPS && units * wpk < target {
        wpk *= 2;
    }
    wpk
}

/// The tensor-core GEMV over `rows` rows (groups of at most 16): y (+)= W x, with the input RMSNorm
/// computed in the kernel (`mode.norm`, no staging) and the SwiGLU epilogue.
pub(crate) fn gemv_mma(
    dev: &CudaDevice,
    w: &Mat,
    x: u64,
    y: u64,
    rows: usize,
    mode: GemvMode,
) -> Result<(), CudaError> {
    let norm = mode.norm.unwrap_or(NormW {
        w: 0,
        eps: 0.0,
        zero_centred: false,
    });
    if !(x | y | w.buf.ptr | norm.w).is_multiple_of(16) {
        return Err(CudaError::Unsupported {
            what: format!(
                "the tensor-core GEMV on operands not 16-byte aligned (w {:#x}, x {x:#x}, y {y:#x}, \
                 norm {:#x})",
                w.buf.ptr, norm.w
            ),
        });
    }
    let sms = dev.info.sms.max(1) as usize;
    let variant = mma_variant(w.rows, w.cols, mode.swiglu, sms);
    let tiles = variant.tiles;
    let (y_width, units, inter) = if mode.swiglu {
        let inter = w.rows / 2;
        (inter, inter.div_ceil(4 * tiles), inter)
    } else {
        (w.rows, w.rows.div_ceil(8 * tiles), 0)
    };
    let wpk = mma_wpk(units, sms);
    let blocks = units.div_ceil(LIN_WARPS / wpk);
    let mut r0 = 0;
    while r0 < rows {
        let n = (rows - r0).min(MMA_MAX_ROWS);
        // More than 8 rows use the A fragment's rows g + 8 too; a row's result is the same either way.
        let name = variant.kernel(n);
        // The input rows as split fragments: 3 bf16 terms per value.
        let stage_bytes = n * w.cols * 6;
        let mut stage = (stage_bytes <= MMA_STAGE_BYTES) as i32;
        let (mut xin, mut nw) = (x + (r0 * w.cols * 4) as u64, norm.w);
        let presplit = dev
            .frag_scratch()
            .filter(|b| mode.norm.is_some() && n >= PRESPLIT_MIN_ROWS && stage_bytes <= b.bytes);
        if let Some(frags) = presplit {
            launch(
                dev,
                "mma_split_rows",
                (n as u32, 1, 1),
                (LIN_WARPS * 32) as u32,
                &[
                    Arg::P(xin),
                    Arg::P(frags.ptr),
                    Arg::I(w.cols as i32),
                    Arg::P(norm.w),
                    Arg::F(norm.eps),
                    Arg::I(norm.zero_centred as i32),
                ],
            )?;
            (stage, xin, nw) = (2, frags.ptr, 0);
        }
        launch_smem(
            dev,
            &name,
            (blocks as u32, 1, 1),
            (LIN_WARPS * 32) as u32,
            if stage == 1 { stage_bytes as u32 } else { 0 },
            &[
                Arg::P(w.buf.ptr),
                Arg::P(xin),
                Arg::P(y + (r0 * y_width * 4) as u64),
                Arg::I(n as i32),
                Arg::I(w.cols as i32),
                Arg::I(w.rows as i32),
                Arg::I(mode.accumulate as i32),
                Arg::I(wpk as i32),
                Arg::I(inter as i32),
                Arg::P(nw),
                Arg::F(norm.eps),
                Arg::I(norm.zero_centred as i32),
                Arg::I(stage),
            ],
        )?;
        r0 += n;
    }
    Ok(())
}
