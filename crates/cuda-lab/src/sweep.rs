//! GEMV kernel sweep: times every compiled GEMV kernel (the FMA kernel and each tensor-core variant) on
//! given matrix shapes and row counts, so the per-shape choice in `ops::mma_variant` rests on
//! measurements from one run. Each timed call reads a different copy of the matrix (copies enough to
//! exceed the L2 cache), so the figures are DRAM figures, not L2 hits.

use cuda_backend::lab::ops::{self, GemvKernel, NormW, MMA_VARIANTS};
use cuda_backend::lab::{elementwise_grid, launch, Arg, DBuf};
use cuda_backend::lab::{Mat, WDtype};
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

/// What the GEMV does with its input and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepOp {
    /// y += W x
    Acc,
    /// y = W rmsnorm(x)
    Normed,
    /// act = silu(g) * u, [g ; u] = W rmsnorm(x)
    Swiglu,
}

/// One measured (shape, rows, kernel).
#[derive(Clone, Debug)]
pub struct SweepRow {
    pub shape: String,
    pub rows: usize,
    pub kernel: String,
    pub us: f64,
    pub gbs: f64,
}

/// Bytes of matrix copies cycled through (over the H200's 50 MB L2).
const COPIES_BYTES: usize = 256 << 20;

/// Times each kernel over `reps` calls per (shape, rows): `shapes` are (label, out rows, cols, op).
pub fn gemv_sweep(
    dev: &CudaDevice,
    shapes: &[(&str, usize, usize, SweepOp)],
    rows: &[usize],
    reps: usize,
) -> Result<Vec<SweepRow>, CudaError> {
    let mut kernels = vec![GemvKernel::Fma];
    kernels.extend(MMA_VARIANTS.iter().map(|&v| GemvKernel::Mma(v)));
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let mut out = Vec::new();
    for &(label, m, cols, op) in shapes {
        let bytes = m * cols * 2;
        let copies = COPIES_BYTES.div_ceil(bytes).clamp(1, 16);
        let mats = (0..copies)
            .map(|i| random_mat(dev, m, cols, i as u64))
            .collect::<Result<Vec<_>, _>>()?;
        let x = DBuf::from_host(dev, &vec![0.5f32; max_rows * cols])?;
        let y = DBuf::f32s(dev, max_rows * m)?;
        let h = DBuf::f32s(dev, max_rows * cols)?;
        let xb = DBuf::zeros(dev, max_rows * cols * 2)?;
        let nw = DBuf::from_host(dev, &vec![0.1f32; cols])?;
        let norm = NormW {
            w: nw.ptr,
            eps: 1e-6,
            zero_centred: true,
        };
        for &n in rows {
            for &k in &kernels {
                if op == SweepOp::Swiglu && matches!(k, GemvKernel::Mma(v) if v.tiles < 2) {
                    continue;
                }
                let call = |w: &Mat| -> Result<(), CudaError> {
                    match op {
                        SweepOp::Acc => ops::linear(dev, w, x.ptr, y.ptr, n, true, xb.ptr, 16),
                        SweepOp::Normed => {
                            ops::linear_normed(dev, w, x.ptr, norm, h.ptr, y.ptr, n, xb.ptr, 16)
                        }
                        SweepOp::Swiglu => ops::linear_swiglu(
                            dev, w, x.ptr, norm, h.ptr, y.ptr, y.ptr, n, xb.ptr, 16,
                        ),
                    }
                };
                let us = ops::with_gemv_kernel(Some(k), || -> Result<f64, CudaError> {
                    for w in mats.iter().take(3) {
                        call(w)?;
                    }
                    dev.synchronize()?;
                    let t0 = crate::profile::event(dev)?;
                    for r in 0..reps {
                        call(&mats[r % copies])?;
                    }
                    let t1 = crate::profile::event(dev)?;
                    dev.synchronize()?;
                    Ok(crate::profile::elapsed_ms(&t0, &t1)? as f64 * 1e3 / reps as f64)
                })?;
                out.push(SweepRow {
                    shape: format!("{label} [{m}x{cols}]"),
                    rows: n,
                    kernel: match k {
                        GemvKernel::Fma => "fma".into(),
                        GemvKernel::Mma(v) => {
                            format!("mma t{} u{} b{}", v.tiles, v.unroll, v.min_blocks)
                        }
                    },
                    us,
                    gbs: bytes as f64 / (us * 1e3),
                });
            }
        }
    }
    Ok(out)
}

fn random_mat(dev: &CudaDevice, rows: usize, cols: usize, seed: u64) -> Result<Mat, CudaError> {
    let buf = DBuf::zeros(dev, rows * cols * 2)?;
    if dev.stream().is_some() {
        launch(
            dev,
            "fill_normal_bf16",
            elementwise_grid(rows * cols),
            256,
            &[
                Arg::P(buf.ptr),
                Arg::L((rows * cols) as i64),
                Arg::U(0x5EED ^ seed),
                Arg::F(0.02),
            ],
        )?;
    }
    Ok(Mat {
        buf,
        rows,
        cols,
        dtype: WDtype::Bf16,
        tensor_cores: true,
        quant: None,
    })
}
