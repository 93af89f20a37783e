//! Launchers of the quantized kernels (`src/cu/quant.cu`) over `WDtype::Quant` matrices (ggml blocks,
//! row runs of one format each: [`crate::weights::QuantLayout`]).
//!
//! - Up to `gemv_max_rows` rows (decode and verify): per group of at most 16 rows, `quant_input` quantizes
//!   the rows to 8 bits once (in the file's column order when it has one), then one `qgemv_<format>`
//!   launch per part writes that part's output columns. Each output value is computed by the same
//!   operations whatever the number of rows, so verify rows equal decode rows bit for bit.
//! - More rows (prefill): per part, tiles of weight rows dequantized to bf16 (`qdequant_bf16`, columns
//!   put back in Hugging Face order) and multiplied by cuBLAS against the bf16-rounded activations, as
//!   the bf16 GEMM path does. Prefill rows may therefore differ from decode rows in the last bits, as
//!   they do for bf16 weights.
//! - Embedding lookups (`qembed`): ggml's dequantized values, bit for bit the CPU engine's.
//! - FP8 parts (`fp8_gemv`, `fp8_dequant_bf16`) read the f32 inputs as they are (no 8-bit copy).

use crate::buf::{elementwise_grid, launch, Arg};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::launch_limits::{QUANT_MAX_COLS, QUANT_MAX_ROWS, QUANT_TILE_BYTES};
use crate::weights::{BlockFormat, Mat, QuantLayout, QuantPart};
use kernels::QuantFormat;

/// Warps per block of `qgemv_*` (QGEMV_WARPS).
const QGEMV_WARPS: usize = 8;

/// quant.cu's format number (QF_*).
fn format_id(f: QuantFormat) -> i32 {
    match f {
        QuantFormat::Q4_0 => 0,
        QuantFormat::Q4_1 => 1,
        QuantFormat::Q5_0 => 2,
        QuantFormat::Q5_1 => 3,
        QuantFormat::Q8_0 => 4,
        QuantFormat::Q4K => 5,
        QuantFormat::Q5K => 6,
        QuantFormat::Q6K => 7,
    }
}

fn gemv_kernel(f: QuantFormat) -> &'static str {
    match f {
        QuantFormat::Q4_0 => "qgemv_q4_0",
        QuantFormat::Q4_1 => "qgemv_q4_1",
        QuantFormat::Q5_0 => "qgemv_q5_0",
        QuantFormat::Q5_1 => "qgemv_q5_1",
        QuantFormat::Q8_0 => "qgemv_q8_0",
        QuantFormat::Q4K => "qgemv_q4_k",
        QuantFormat::Q5K => "qgemv_q5_k",
        QuantFormat::Q6K => "qgemv_q6_k",
    }
}

/// Warps per output row for a part of `m` rows of `k` columns: the fewest (1, 2, 4, 8) that give about
/// 32 warps per multiprocessor, while each warp keeps at least two 32-element sub-blocks per lane. A
/// function of the shape and the device only, so every row count sums a row in the same order.
fn gemv_wpr(m: usize, k: usize, sms: usize) -> usize {
    let (target, nsub) = (32 * sms.max(1), k / 32);
    let mut wpr = 1;
    while wpr < QGEMV_WARPS && m * wpr < target && 64 * wpr <= nsub {
        wpr *= 2;
    }
    wpr
}

fn layout(w: &Mat) -> &QuantLayout {
    w.quant
        .as_deref()
        .expect("a WDtype::Quant matrix carries its layout")
}

/// y [rows, w.rows] (+)= x [rows, w.cols] · wᵀ for a quantized `w` (the kernels of `exec::Kernels`).
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
    let q = layout(w);
    if rows > gemv_max_rows {
        return gemm(dev, w, q, x, y, rows, accumulate, xb);
    }
    let k = w.cols;
    if k > QUANT_MAX_COLS {
        return Err(CudaError::Unsupported {
            what: format!("a quantized matrix of {k} columns (at most {QUANT_MAX_COLS})"),
        });
    }
    let input = &dev.quant_scratch()?.input;
    let xq = input.ptr;
    let dx = xq + (QUANT_MAX_ROWS * QUANT_MAX_COLS) as u64;
    let dxs = dx + (QUANT_MAX_ROWS * QUANT_MAX_COLS / 32 * 4) as u64;
    let order = q.input_order.as_ref().map_or(0, |o| o.ptr);
    let ggml = q
        .parts
        .iter()
        .any(|p| matches!(p.format, BlockFormat::Ggml(_)));
    let sms = dev.info.sms.max(1) as usize;
    let mut r0 = 0;
    while r0 < rows {
        let n = (rows - r0).min(QUANT_MAX_ROWS);
        let x_rows = x + (r0 * k * 4) as u64;
        if ggml {
            let blocks = (n * k / 32).div_ceil(8).clamp(1, 65_535);
            launch(
                dev,
                "quant_input",
                (blocks as u32, 1, 1),
                256,
                &[
                    Arg::P(x_rows),
                    Arg::P(order),
                    Arg::I(k as i32),
                    Arg::I(n as i32),
                    Arg::P(xq),
                    Arg::P(dx),
                    Arg::P(dxs),
                ],
            )?;
        }
        let mut first_row = 0;
        for p in &q.parts {
            let wpr = gemv_wpr(p.rows, k, sms);
            let grid = (p.rows.div_ceil(QGEMV_WARPS / wpr) as u32, 1, 1);
            let out = y + ((r0 * w.rows + first_row) * 4) as u64;
            let weights = w.buf.ptr + p.offset as u64;
            match p.format {
                BlockFormat::Ggml(f) => launch(
                    dev,
                    gemv_kernel(f),
                    grid,
                    (QGEMV_WARPS * 32) as u32,
                    &[
                        Arg::P(weights),
                        Arg::L(f.row_bytes(k) as i64),
                        Arg::I(p.rows as i32),
                        Arg::I(k as i32),
                        Arg::I(n as i32),
                        Arg::P(xq),
                        Arg::P(dx),
                        Arg::P(dxs),
                        Arg::P(out),
                        Arg::I(w.rows as i32),
                        Arg::I(accumulate as i32),
                        Arg::I(wpr as i32),
                    ],
                )?,
                BlockFormat::Fp8 { block, scales } => launch(
                    dev,
                    "fp8_gemv",
                    grid,
                    (QGEMV_WARPS * 32) as u32,
                    &[
                        Arg::P(weights),
                        Arg::I(p.rows as i32),
                        Arg::I(k as i32),
                        Arg::I(block[0] as i32),
                        Arg::I(block[1] as i32),
                        Arg::P(w.buf.ptr + scales as u64),
                        Arg::I(n as i32),
                        Arg::P(x_rows),
                        Arg::P(out),
                        Arg::I(w.rows as i32),
                        Arg::I(accumulate as i32),
                        Arg::I(wpr as i32),
                    ],
                )?,
            }
            first_row += p.rows;
        }
        r0 += n;
    }
    Ok(())
}

/// The prefill path: tiles of weight rows dequantized to bf16, cuBLAS against bf16 activations.
#[allow(clippy::too_many_arguments)]
fn gemm(
    dev: &CudaDevice,
    w: &Mat,
    q: &QuantLayout,
    x: u64,
    y: u64,
    rows: usize,
    accumulate: bool,
    xb: u64,
) -> Result<(), CudaError> {
    let k = w.cols;
    let count = rows * k;
    launch(
        dev,
        "to_bf16",
        elementwise_grid(count),
        256,
        &[Arg::P(x), Arg::P(xb), Arg::L(count as i64)],
    )?;
    let tile = &dev.quant_scratch()?.tile;
    let tile_rows = (QUANT_TILE_BYTES / 2 / k).max(1);
    let order = q.input_order.as_ref().map_or(0, |o| o.ptr);
    let mut first_row = 0;
    for p in &q.parts {
        let row_bytes = p.format.row_bytes(k);
        let mut t0 = 0;
        while t0 < p.rows {
            let tr = (p.rows - t0).min(tile_rows);
            let weights = w.buf.ptr + (p.offset + t0 * row_bytes) as u64;
            match p.format {
                BlockFormat::Ggml(f) => launch(
                    dev,
                    "qdequant_bf16",
                    elementwise_grid(tr * k / 32),
                    256,
                    &[
                        Arg::I(format_id(f)),
                        Arg::P(weights),
                        Arg::L(row_bytes as i64),
                        Arg::I(tr as i32),
                        Arg::I(k as i32),
                        Arg::P(order),
                        Arg::P(tile.ptr),
                    ],
                )?,
                BlockFormat::Fp8 { block, scales } => launch(
                    dev,
                    "fp8_dequant_bf16",
                    elementwise_grid(tr * k),
                    256,
                    &[
                        Arg::P(weights),
                        Arg::I(tr as i32),
                        Arg::I(k as i32),
                        Arg::I(block[0] as i32),
                        Arg::I(block[1] as i32),
                        Arg::P(w.buf.ptr + scales as u64),
                        Arg::I(t0 as i32),
                        Arg::P(tile.ptr),
                    ],
                )?,
            }
            let out = y + ((first_row + t0) * 4) as u64;
            crate::ops::gemm_bf16(dev, tile.ptr, tr, k, xb, rows, out, w.rows, accumulate)?;
            t0 += tr;
        }
        first_row += p.rows;
    }
    Ok(())
}

/// x [rows, table.cols] = rows ids[r] of a quantized embedding table.
pub(crate) fn launch_embed(
    dev: &CudaDevice,
    table: &Mat,
    ids: u64,
    x: u64,
    rows: usize,
) -> Result<(), CudaError> {
    let q = layout(table);
    let [QuantPart {
        format: BlockFormat::Ggml(format),
        offset,
        ..
    }] = q.parts.as_slice()
    else {
        return Err(CudaError::Unsupported {
            what: "an embedding table in FP8 or fused from several quantized parts".into(),
        });
    };
    launch(
        dev,
        "qembed",
        (rows as u32, 1, 1),
        128,
        &[
            Arg::I(format_id(*format)),
            Arg::P(table.buf.ptr + *offset as u64),
            Arg::L(format.row_bytes(table.cols) as i64),
            Arg::P(ids),
            Arg::P(x),
            Arg::I(table.cols as i32),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warps_per_row_depend_on_the_shape_only() {
        // The 4B's o_proj (2560 rows of 4096) on an H100: two warps a row; a narrow matrix keeps one.
        assert_eq!(gemv_wpr(2560, 4096, 132), 2);
        assert_eq!(gemv_wpr(2560, 1024, 132), 1);
        assert_eq!(gemv_wpr(248_320, 2560, 132), 1);
        assert_eq!(gemv_wpr(64, 9728, 132), 8);
    }
}
