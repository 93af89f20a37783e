//! Quantized matrices (ggml blocks, `quant.cu`): every block format's GEMV against the CPU engine's
//! quantized kernel (`kernels::linear_quant`: the same 8-bit inputs and integer sums, so only the float
//! order of the per-block steps differs), fused projections whose parts mix formats, a file's column
//! order, the prefill path (a bf16 weight tile and cuBLAS) against an f64 product of the bf16-rounded
//! operands, embedding rows bit for bit the CPU's dequantized values; and the batch invariance greedy
//! speculation relies on: rows computed together equal each row alone, bit for bit.

use std::sync::Arc;

use super::{bf16_round, bitwise_row, download, rel_err, same_bits, Rng, SelfTestRow};
use cuda_backend::lab::ops;
use cuda_backend::lab::{has_cublas, BlockFormat, DBuf, Mat, QuantLayout, QuantPart, WDtype};
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;
use kernels::{Fp8Matrix, QuantFormat, QuantMatrix};

/// Row counts up to this use the GEMV kernels (as LoadOptions::default()).
const GEMV_ROWS: usize = 16;

/// The format of a part of a test matrix.
#[derive(Clone, Copy, Debug)]
enum Fmt {
    Ggml(QuantFormat),
    /// FP8 in blocks of [rows, cols].
    Fp8([usize; 2]),
}

/// A part as the CPU engine holds it.
enum HostPart {
    Ggml(QuantMatrix),
    Fp8(Fp8Matrix),
}

impl HostPart {
    fn rows(&self) -> usize {
        match self {
            HostPart::Ggml(m) => m.rows(),
            HostPart::Fp8(m) => m.rows(),
        }
    }
}

/// A quantized matrix of `parts` (format, rows) over `cols`, from random weights; with the host copies
/// of each part and the dequantized values [rows, cols].
struct Case {
    mat: Mat,
    parts: Vec<HostPart>,
    dequantized: Vec<f32>,
    order: Option<Vec<usize>>,
}

fn upload(
    dev: &CudaDevice,
    rng: &mut Rng,
    parts: &[(Fmt, usize)],
    cols: usize,
    order: Option<Vec<usize>>,
) -> Result<Case, CudaError> {
    let (mut bytes, mut layout, mut hosts, mut dequantized) = (vec![], vec![], vec![], vec![]);
    let mut scales = Vec::new(); // (part, f32 scales) appended after the rows
    for &(fmt, rows) in parts {
        let w = rng.vec(rows * cols, 0.5);
        let mut row = vec![0f32; cols];
        let offset = bytes.len();
        let (format, host) = match fmt {
            Fmt::Ggml(f) => {
                let m = kernels::quantize_matrix(f, &w, rows, cols);
                bytes.extend_from_slice(m.data());
                for r in 0..rows {
                    m.dequantize_row(r, &mut row);
                    dequantized.extend_from_slice(&row);
                }
                (BlockFormat::Ggml(f), HostPart::Ggml(m))
            }
            Fmt::Fp8(block) => {
                let m = Fp8Matrix::quantize(&w, rows, cols, block);
                let (data, s) = m.parts();
                bytes.extend_from_slice(&data);
                scales.push((layout.len(), s));
                for r in 0..rows {
                    m.dequantize_row(r, &mut row);
                    dequantized.extend_from_slice(&row);
                }
                (BlockFormat::Fp8 { block, scales: 0 }, HostPart::Fp8(m))
            }
        };
        layout.push(QuantPart {
            format,
            rows,
            offset,
        });
        hosts.push(host);
    }
    for (part, s) in scales {
        bytes.resize(bytes.len().next_multiple_of(16), 0);
        if let BlockFormat::Fp8 { scales, .. } = &mut layout[part].format {
            *scales = bytes.len();
        }
        bytes.extend(s.iter().flat_map(|v| v.to_le_bytes()));
    }
    let input_order = match &order {
        Some(o) => Some(DBuf::from_host(
            dev,
            &o.iter().map(|&c| c as i32).collect::<Vec<_>>(),
        )?),
        None => None,
    };
    let mat = Mat {
        buf: DBuf::from_host(dev, &bytes)?,
        rows: parts.iter().map(|p| p.1).sum(),
        cols,
        dtype: WDtype::Quant,
        tensor_cores: false,
        quant: Some(Arc::new(QuantLayout {
            parts: layout,
            input_order,
        })),
    };
    Ok(Case {
        mat,
        parts: hosts,
        dequantized,
        order,
    })
}

/// x [n, cols] in the matrix's stored column order.
fn stored_order(x: &[f32], cols: usize, order: Option<&[usize]>) -> Vec<f32> {
    match order {
        None => x.to_vec(),
        Some(o) => x
            .chunks_exact(cols)
            .flat_map(|row| o.iter().map(move |&c| row[c]))
            .collect(),
    }
}

/// y (+)= x · wᵀ on the device.
fn run(dev: &CudaDevice, c: &Case, x: &[f32], y0: &[f32], n: usize) -> Result<Vec<f32>, CudaError> {
    let m = c.mat.rows;
    let (xd, yd) = (DBuf::from_host(dev, x)?, DBuf::from_host(dev, y0)?);
    let xb = DBuf::zeros(dev, n * c.mat.cols * 2)?;
    ops::linear(dev, &c.mat, xd.ptr, yd.ptr, n, true, xb.ptr, GEMV_ROWS)?;
    download(dev, &yd, n * m)
}

/// The CPU engine's quantized product, parts side by side, added to y0.
fn cpu(c: &Case, x: &[f32], y0: &[f32], n: usize) -> Vec<f32> {
    let (m, cols) = (c.mat.rows, c.mat.cols);
    let xs = stored_order(x, cols, c.order.as_deref());
    let mut y = y0.to_vec();
    let mut first = 0;
    for p in &c.parts {
        let mut o = vec![0f32; n * p.rows()];
        match p {
            HostPart::Ggml(m) => kernels::linear_quant(&xs, m, n, &mut o),
            HostPart::Fp8(m) => kernels::linear_fp8(&xs, m, n, &mut o),
        }
        for r in 0..n {
            for i in 0..p.rows() {
                y[r * m + first + i] += o[r * p.rows() + i];
            }
        }
        first += p.rows();
    }
    y
}

/// The prefill path's operands: bf16-rounded dequantized weights and inputs, summed in f64.
fn bf16_product(c: &Case, x: &[f32], y0: &[f32], n: usize) -> Vec<f32> {
    let (m, cols) = (c.mat.rows, c.mat.cols);
    let (w, xs) = (
        bf16_round(&c.dequantized),
        bf16_round(&stored_order(x, cols, c.order.as_deref())),
    );
    (0..n * m)
        .map(|i| {
            let (r, o) = (i / m, i % m);
            let dot: f64 = (0..cols)
                .map(|k| w[o * cols + k] as f64 * xs[r * cols + k] as f64)
                .sum();
            (y0[i] as f64 + dot) as f32
        })
        .collect()
}

/// (parts as (format, rows), cols, input rows).
type QuantCase = (Vec<(Fmt, usize)>, usize, usize);

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    use QuantFormat::*;
    let mut cases: Vec<QuantCase> = Vec::new();
    for f in QuantFormat::ALL {
        for n in [1, 5, 16, 40] {
            cases.push((vec![(Fmt::Ggml(f), 300)], 512, n));
        }
    }
    let g = Fmt::Ggml;
    cases.push((vec![(g(Q8_0), 40)], 2560, 3));
    cases.push((vec![(g(Q5_1), 70)], 288, 2));
    cases.push((vec![(g(Q4K), 200), (g(Q6K), 72)], 768, 3));
    cases.push((vec![(g(Q4K), 64), (g(Q4K), 64), (g(Q6K), 40)], 1024, 20));
    // FP8: partial blocks in both dimensions, fused parts (each with its own grid), prefill.
    let fp8 = Fmt::Fp8([128, 128]);
    for n in [1, 4, 16, 40] {
        cases.push((vec![(fp8, 300)], 320, n));
    }
    cases.push((vec![(fp8, 200), (fp8, 72), (fp8, 40)], 256, 3));
    cases.push((vec![(Fmt::Fp8([32, 64]), 70)], 192, 2));
    for (parts, cols, n) in cases {
        let c = upload(dev, rng, &parts, cols, None)?;
        check(dev, rng, &c, &format!("{parts:?} x {cols}"), n, out)?;
    }
    // A file's column order (the GDN out_proj's value heads): a permutation of whole 32-blocks and within.
    let cols = 512;
    let order: Vec<usize> = (0..cols).map(|c| (c * 37 + 11) % cols).collect();
    for n in [1, 4, 40] {
        let c = upload(dev, rng, &[(g(Q5_0), 96)], cols, Some(order.clone()))?;
        check(dev, rng, &c, "Q5_0 x 512, columns reordered", n, out)?;
    }
    embed_checks(dev, rng, out)
}

fn check(
    dev: &CudaDevice,
    rng: &mut Rng,
    c: &Case,
    what: &str,
    n: usize,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    let (m, cols) = (c.mat.rows, c.mat.cols);
    let x = rng.vec(n * cols, 1.0);
    let y0 = rng.vec(n * m, 1.0);
    let got = run(dev, c, &x, &y0, n)?;
    let (want, against) = if n > GEMV_ROWS && has_cublas(dev) {
        (bf16_product(c, &x, &y0, n), "bf16 f64")
    } else {
        (cpu(c, &x, &y0, n), "CPU")
    };
    out.push(SelfTestRow {
        what: format!("quantized {what} rows {n} vs {against}"),
        error: rel_err(&got, &want),
        bound: 1e-5,
    });
    if n > 1 && n <= GEMV_ROWS {
        let mut alone = Vec::with_capacity(got.len());
        for r in 0..n {
            let (xr, yr) = (&x[r * cols..(r + 1) * cols], &y0[r * m..(r + 1) * m]);
            alone.extend(run(dev, c, xr, yr, 1)?);
        }
        out.push(bitwise_row(
            format!("quantized {what}: {n} rows == each row alone (bits)"),
            same_bits(&got, &alone),
        ));
    }
    Ok(())
}

/// Embedding rows of a quantized table: the CPU's dequantized values, bit for bit.
fn embed_checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    for format in [
        QuantFormat::Q6K,
        QuantFormat::Q4K,
        QuantFormat::Q8_0,
        QuantFormat::Q5_1,
    ] {
        let (vocab, cols) = (50, 512);
        let c = upload(dev, rng, &[(Fmt::Ggml(format), vocab)], cols, None)?;
        let ids: Vec<i32> = vec![0, 49, 7, 7, 23];
        let idd = DBuf::from_host(dev, &ids)?;
        let x = DBuf::f32s(dev, ids.len() * cols)?;
        ops::embed(dev, &c.mat, idd.ptr, x.ptr, ids.len())?;
        let got = download(dev, &x, ids.len() * cols)?;
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&id| c.dequantized[id as usize * cols..(id as usize + 1) * cols].to_vec())
            .collect();
        out.push(bitwise_row(
            format!("quantized embedding {format:?} == CPU dequantized (bits)"),
            same_bits(&got, &want),
        ));
    }
    Ok(())
}
