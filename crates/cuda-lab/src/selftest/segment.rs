//! Segments (segment.rs): a run of one-row GEMVs queued and launched as one persistent kernel must give
//! the per-GEMV launches' bits. The chain covers what the decode step queues: a normed GEMV with wide
//! rows read in several pieces and few output rows (several warps' parts per row, wpr 8), a SwiGLU
//! GEMV over its output, an accumulating GEMV back into it, and a normed GEMV with many rows (the LM
//! head's form).

use super::{bitwise_row, download, Rng, SelfTestRow};
use cuda_backend::lab::ops::{self, NormW};
use cuda_backend::lab::segment;
use cuda_backend::lab::DBuf;
use cuda_backend::lab::{Mat, WDtype};
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

fn bf16_mat(dev: &CudaDevice, rng: &mut Rng, rows: usize, cols: usize) -> Result<Mat, CudaError> {
    let scale = 1.0 / (cols as f32).sqrt();
    let bytes: Vec<u8> = rng
        .vec(rows * cols, scale)
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    Ok(Mat {
        buf: DBuf::from_host(dev, &bytes)?,
        rows,
        cols,
        dtype: WDtype::Bf16,
        tensor_cores: false,
        quant: None,
    })
}

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    rows: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    chain(dev, rng, rows, (6144, 40, 24, 700))?;
    // 2560- and 4096-wide inputs of GEMVs with enough rows for one warp per row (wpr 1: at least 8 per
    // SM and block slot, ops::gemv_wpr): the register-held inputs (segment::Config::kernel_for).
    let rows_wpr1 = 64 * dev.info.sms.max(1) as usize;
    chain(dev, rng, rows, (512, 2560, rows_wpr1, rows_wpr1 + 8))?;
    // (Every input a multiple of 4096 wide, so the segment takes 8 KB pages: one piece per row.)
    chain(
        dev,
        rng,
        rows,
        (4096, 4096, rows_wpr1.max(4096), rows_wpr1 + 8),
    )?;
    // An out projection's shape (4096 wide, 4 warps per row: 24 rows per SM; not held) beside held
    // one-warp rows 2560 wide (5 KB pages: the 4096-wide rows in two pieces) or 4096 wide (8 KB pages).
    let rows_wpr4 = 24 * dev.info.sms.max(1) as usize;
    pair(dev, rng, rows, (rows_wpr4, 4096), (rows_wpr1, 2560))?;
    pair(dev, rng, rows, (rows_wpr4, 4096), (rows_wpr1, 4096))
}

/// Whether the segment kernel ran where it should: one launch, or none where this device built no
/// segment kernel (no sm_90, no room for the ring). A launch that failed (segments then turn off and
/// the GEMVs fall back to their own launches, with the same bits) fails the row: it passed unnoticed
/// while a broken producer loop deadlocked in the simulator.
fn segment_ran(dev: &CudaDevice, launched: u64) -> bool {
    if let Some(why) = dev.segment_failure() {
        eprintln!("segment self-test: segments turned off after a failed launch: {why}");
        return false;
    }
    launched == 1 || dev.segment_status().is_err()
}

/// Two independent GEMVs y_a = A x_a (accumulating into y_a) and y_b = B x_b, A [a.0, a.1], B [b.0, b.1],
/// as launches and as one segment.
fn pair(
    dev: &CudaDevice,
    rng: &mut Rng,
    rows: &mut Vec<SelfTestRow>,
    a: (usize, usize),
    b: (usize, usize),
) -> Result<(), CudaError> {
    let (ma, mb) = (bf16_mat(dev, rng, a.0, a.1)?, bf16_mat(dev, rng, b.0, b.1)?);
    let (xa, xb_in, ya0) = (rng.vec(a.1, 1.0), rng.vec(b.1, 1.0), rng.vec(a.0, 1.0));
    let run = |segments: bool| -> Result<(Vec<f32>, Vec<f32>, u64), CudaError> {
        let (x1, x2) = (DBuf::from_host(dev, &xa)?, DBuf::from_host(dev, &xb_in)?);
        let (y1, y2) = (DBuf::from_host(dev, &ya0)?, DBuf::f32s(dev, b.0)?);
        let xb = DBuf::zeros(dev, a.1.max(b.1) * 2)?;
        let before = dev.segment_launches();
        let scope = if segments {
            segment::open(dev, false)
        } else {
            None
        };
        ops::linear(dev, &ma, x1.ptr, y1.ptr, 1, true, xb.ptr, 16)?;
        ops::linear(dev, &mb, x2.ptr, y2.ptr, 1, false, xb.ptr, 16)?;
        if let Some(scope) = scope {
            scope.finish()?;
        }
        let launched = dev.segment_launches() - before;
        Ok((download(dev, &y1, a.0)?, download(dev, &y2, b.0)?, launched))
    };
    let (a_plain, b_plain, _) = run(false)?;
    let (a_seg, b_seg, launched) = run(true)?;
    let ran = segment_ran(dev, launched);
    rows.push(bitwise_row(
        format!(
            "segment of {}x{} += and {}x{} == launches (bits; {launched} segment kernel(s))",
            a.0, a.1, b.0, b.1
        ),
        ran && super::same_bits(&a_plain, &a_seg) && super::same_bits(&b_plain, &b_seg),
    ));
    Ok(())
}

/// The chain x0 -> y1 = A norm(x0); act = SwiGLU(B norm(y1)); y1 += C act; out = D norm(y1) with
/// A [few, wide], B [2 inter, few], C [few, inter], D [many, few], as launches and as one segment.
fn chain(
    dev: &CudaDevice,
    rng: &mut Rng,
    rows: &mut Vec<SelfTestRow>,
    (wide, few, inter, many): (usize, usize, usize, usize),
) -> Result<(), CudaError> {
    let a = bf16_mat(dev, rng, few, wide)?;
    let b = bf16_mat(dev, rng, 2 * inter, few)?;
    let c = bf16_mat(dev, rng, few, inter)?;
    let d = bf16_mat(dev, rng, many, few)?;
    let x0 = rng.vec(wide, 1.0);
    let norm_a = DBuf::from_host(dev, &rng.vec(wide, 0.5))?;
    let norm_b = DBuf::from_host(dev, &rng.vec(few, 0.5))?;
    let norm = |w: &DBuf| NormW {
        w: w.ptr,
        eps: 1e-6,
        zero_centred: true,
    };
    let chain = |segments: bool| -> Result<(Vec<f32>, Vec<f32>, u64), CudaError> {
        let x = DBuf::from_host(dev, &x0)?;
        let y1 = DBuf::f32s(dev, few)?;
        let act = DBuf::f32s(dev, inter)?;
        let out = DBuf::f32s(dev, many)?;
        // h: a normed input (wide or few); big: a SwiGLU's [g ; u] or the many rows; xb: bf16 inputs.
        // The host emulation writes all three, so each holds the widest use.
        let widest = wide.max(few).max(inter);
        let (h, big, xb) = (
            DBuf::f32s(dev, widest)?,
            DBuf::f32s(dev, many.max(2 * inter))?,
            DBuf::zeros(dev, widest * 2)?,
        );
        let before = dev.segment_launches();
        let scope = if segments {
            segment::open(dev, false)
        } else {
            None
        };
        ops::linear_normed(dev, &a, x.ptr, norm(&norm_a), h.ptr, y1.ptr, 1, xb.ptr, 16)?;
        ops::linear_swiglu(
            dev,
            &b,
            y1.ptr,
            norm(&norm_b),
            h.ptr,
            big.ptr,
            act.ptr,
            1,
            xb.ptr,
            16,
        )?;
        ops::linear(dev, &c, act.ptr, y1.ptr, 1, true, xb.ptr, 16)?;
        ops::linear_normed(
            dev,
            &d,
            y1.ptr,
            norm(&norm_b),
            h.ptr,
            out.ptr,
            1,
            xb.ptr,
            16,
        )?;
        if let Some(scope) = scope {
            scope.finish()?;
        }
        let launched = dev.segment_launches() - before;
        Ok((
            download(dev, &y1, few)?,
            download(dev, &out, many)?,
            launched,
        ))
    };
    let (y_plain, out_plain, _) = chain(false)?;
    let (y_seg, out_seg, launched) = chain(true)?;
    let ran = segment_ran(dev, launched);
    rows.push(bitwise_row(
        format!(
            "segment of 4 GEMVs (normed {wide}-wide, SwiGLU {few}-wide, +=, {many} rows) == launches (bits; {launched} segment kernel(s))"
        ),
        ran && super::same_bits(&y_plain, &y_seg) && super::same_bits(&out_plain, &out_seg),
    ));
    Ok(())
}
