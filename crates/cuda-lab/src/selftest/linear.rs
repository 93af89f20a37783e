//! GEMV / GEMM and RMSNorm checks: `ops::linear` (+= y), `linear_normed` and `linear_swiglu` against f64
//! references on the host, over both weight types, row counts that stage or not in shared memory, go
//! past one 8-row launch or to cuBLAS, and matrices whose few rows get several warps each; then the
//! same rows run one at a time must give the same bits.

use super::{bf16_round, bitwise_row, download, rel_err, same_bits, Rng, SelfTestRow};
use cuda_backend::lab::ops::{self, NormW};
use cuda_backend::lab::DBuf;
use cuda_backend::lab::{Mat, WDtype};
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

/// Row counts up to this use the GEMV kernel (as LoadOptions::default()).
const GEMV_ROWS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    /// y += W x
    Acc,
    /// y = W rmsnorm(x)
    Normed,
    /// act = silu(g) * u, [g ; u] = W rmsnorm(x)
    Swiglu,
}

fn upload(
    dev: &CudaDevice,
    w: &[f32],
    rows: usize,
    cols: usize,
    dtype: WDtype,
) -> Result<Mat, CudaError> {
    let bytes: Vec<u8> = match dtype {
        WDtype::Bf16 => w
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        WDtype::F32 => w.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        WDtype::Quant => unreachable!("quantized matrices: selftest/quant.rs"),
    };
    Ok(Mat {
        buf: DBuf::from_host(dev, &bytes)?,
        rows,
        cols,
        dtype,
        tensor_cores: true,
        quant: None,
    })
}

/// Runs `op` on the device over `n` rows of x; returns the output rows.
#[allow(clippy::too_many_arguments)]
fn run(
    dev: &CudaDevice,
    op: Op,
    mat: &Mat,
    x: &[f32],
    y0: &[f32],
    nw: &DBuf,
    n: usize,
) -> Result<Vec<f32>, CudaError> {
    let (m, cols) = (mat.rows, mat.cols);
    let xd = DBuf::from_host(dev, x)?;
    let xb = DBuf::zeros(dev, n * cols * 2)?;
    let h = DBuf::f32s(dev, n * cols)?;
    let big = DBuf::f32s(dev, n * m)?;
    let norm = NormW {
        w: nw.ptr,
        eps: 1e-6,
        zero_centred: true,
    };
    match op {
        Op::Acc => {
            let yd = DBuf::from_host(dev, y0)?;
            ops::linear(dev, mat, xd.ptr, yd.ptr, n, true, xb.ptr, GEMV_ROWS)?;
            download(dev, &yd, n * m)
        }
        Op::Normed => {
            let yd = DBuf::f32s(dev, n * m)?;
            ops::linear_normed(dev, mat, xd.ptr, norm, h.ptr, yd.ptr, n, xb.ptr, GEMV_ROWS)?;
            download(dev, &yd, n * m)
        }
        Op::Swiglu => {
            let yd = DBuf::f32s(dev, n * m / 2)?;
            ops::linear_swiglu(
                dev, mat, xd.ptr, norm, h.ptr, big.ptr, yd.ptr, n, xb.ptr, GEMV_ROWS,
            )?;
            download(dev, &yd, n * m / 2)
        }
    }
}

/// The host reference of `op` in f64 (norm: the CPU engine's f32 rms_norm; cuBLAS passes round the
/// GEMM input to bf16 for bf16 weights).
#[allow(clippy::too_many_arguments)]
fn reference(
    op: Op,
    w: &[f32],
    m: usize,
    cols: usize,
    x: &[f32],
    y0: &[f32],
    nw: &[f32],
    n: usize,
    dtype: WDtype,
) -> Vec<f32> {
    let mut xin = x.to_vec();
    if op != Op::Acc {
        kernels::rms_norm(x, nw, 1e-6, true, &mut xin);
    }
    if n > GEMV_ROWS && dtype == WDtype::Bf16 {
        xin = bf16_round(&xin);
    }
    let dot = |r: usize, o: usize| -> f64 {
        (0..cols)
            .map(|c| w[o * cols + c] as f64 * xin[r * cols + c] as f64)
            .sum()
    };
    match op {
        Op::Acc => (0..n * m)
            .map(|i| (y0[i] as f64 + dot(i / m, i % m)) as f32)
            .collect(),
        Op::Normed => (0..n * m).map(|i| dot(i / m, i % m) as f32).collect(),
        Op::Swiglu => {
            let inter = m / 2;
            (0..n * inter)
                .map(|i| {
                    let (r, j) = (i / inter, i % inter);
                    let (g, u) = (dot(r, j), dot(r, inter + j));
                    (g / (1.0 + (-g).exp()) * u) as f32
                })
                .collect()
        }
    }
}

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    use Op::*;
    // (op, dtype, out rows, cols, rows)
    // Bf16 with columns in whole 32s run the tensor-core kernel (linear_mma.cu), the rest the FMA kernel.
    let cases = [
        (Acc, WDtype::Bf16, 300, 256, 1),
        (Acc, WDtype::Bf16, 300, 256, 5),
        (Acc, WDtype::Bf16, 296, 512, 16),
        (Acc, WDtype::Bf16, 40, 1024, 9),
        (Normed, WDtype::Bf16, 300, 256, 13),
        (Normed, WDtype::Bf16, 40, 2560, 16),
        (Swiglu, WDtype::Bf16, 600, 256, 3),
        (Swiglu, WDtype::Bf16, 84, 2560, 16),
        (Acc, WDtype::Bf16, 300, 264, 1),
        (Acc, WDtype::Bf16, 300, 264, 3),
        (Acc, WDtype::Bf16, 300, 264, 11),
        (Acc, WDtype::Bf16, 300, 100, 2),
        (Acc, WDtype::F32, 300, 264, 3),
        (Acc, WDtype::F32, 300, 98, 9),
        (Acc, WDtype::Bf16, 40, 264, 2),
        (Acc, WDtype::Bf16, 100, 520, 1),
        (Acc, WDtype::Bf16, 300, 264, 40),
        (Acc, WDtype::F32, 300, 264, 40),
        (Normed, WDtype::Bf16, 300, 264, 1),
        (Normed, WDtype::Bf16, 300, 264, 6),
        (Normed, WDtype::F32, 100, 98, 3),
        (Normed, WDtype::Bf16, 40, 2560, 5),
        (Normed, WDtype::Bf16, 300, 264, 20),
        (Swiglu, WDtype::Bf16, 600, 264, 1),
        (Swiglu, WDtype::Bf16, 600, 264, 7),
        (Swiglu, WDtype::F32, 42, 98, 3),
        (Swiglu, WDtype::Bf16, 64, 2560, 6),
        (Swiglu, WDtype::Bf16, 600, 264, 20),
    ];
    for (op, dtype, m, cols, n) in cases {
        let w = bf16_round(&rng.vec(m * cols, 0.5));
        let x = rng.vec(n * cols, 1.0);
        let y0 = rng.vec(n * m, 1.0);
        let nwh = rng.vec(cols, 0.5);
        let nw = DBuf::from_host(dev, &nwh)?;
        let mat = upload(dev, &w, m, cols, dtype)?;
        let got = run(dev, op, &mat, &x, &y0, &nw, n)?;
        let want = reference(op, &w, m, cols, &x, &y0, &nwh, n, dtype);
        out.push(SelfTestRow {
            what: format!("{op:?} {dtype:?} [{m}x{cols}] rows {n}"),
            error: rel_err(&got, &want),
            bound: 1e-5,
        });
        // Batch invariance on the GEMV path: each row alone gives the same bits.
        if n > 1 && n <= GEMV_ROWS {
            let width = got.len() / n;
            let mut alone = Vec::with_capacity(got.len());
            for r in 0..n {
                let xr = &x[r * cols..(r + 1) * cols];
                let yr = &y0[r * m..(r + 1) * m];
                alone.extend(run(dev, op, &mat, xr, yr, &nw, 1)?);
            }
            debug_assert_eq!(alone.len(), n * width);
            out.push(bitwise_row(
                format!("{op:?} {dtype:?} [{m}x{cols}] {n} rows == each row alone (bits)"),
                same_bits(&got, &alone),
            ));
        }
    }
    norm_checks(dev, rng, out)
}

fn norm_checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    let (rows, width) = (3, 100);
    let x = rng.vec(rows * width, 3.0);
    let w = rng.vec(width, 1.0);
    for zc in [false, true] {
        let (xd, wd, yd) = (
            DBuf::from_host(dev, &x)?,
            DBuf::from_host(dev, &w)?,
            DBuf::f32s(dev, rows * width)?,
        );
        ops::rmsnorm(dev, xd.ptr, wd.ptr, yd.ptr, rows, width, 1e-6, zc)?;
        let mut want = vec![0.0; rows * width];
        kernels::rms_norm(&x, &w, 1e-6, zc, &mut want);
        out.push(SelfTestRow {
            what: format!("rmsnorm zero_centred={zc}"),
            error: rel_err(&download(dev, &yd, rows * width)?, &want),
            bound: 1e-6,
        });
    }
    Ok(())
}
