//! The sparse-MoE block (norm → router GEMV → moe_route → moe_gate_up → moe_down) against a host
//! reference in f64 on the same bf16 weights, and its batch invariance: a block of rows equals each row
//! run alone, bit for bit. Shapes: expert and shared widths that are not multiples of a warp, a hidden
//! width that is not a multiple of the block's 8 warps, with and without a shared expert and top-k
//! renormalisation.

use super::{bf16_round, bitwise_row, download, rel_err, same_bits, Rng, SelfTestRow};
use cuda_backend::lab::moe::{self, MoeShape, MoeW};
use cuda_backend::lab::ops::NormW;
use cuda_backend::lab::{htod, DBuf};
use cuda_backend::lab::{Mat, WDtype};
use cuda_backend::lab::{Scratch, Widths};
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    let shape = |experts, top_k, inter, shared_inter, norm_topk, hidden| MoeShape {
        experts,
        top_k,
        inter,
        shared_inter,
        norm_topk,
        hidden,
    };
    for s in [
        shape(6, 3, 40, 24, true, 72),
        shape(40, 4, 16, 0, false, 100),
    ] {
        moe_check(dev, rng, out, s, 5)?;
    }
    Ok(())
}

/// A bf16 matrix from host values (returned rounded, as the reference must read them).
fn bf16_mat(
    dev: &CudaDevice,
    v: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(Mat, Vec<f32>), CudaError> {
    let bits: Vec<u16> = v
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let mat = Mat {
        buf: DBuf::from_host(dev, &bits)?,
        rows,
        cols,
        dtype: WDtype::Bf16,
        tensor_cores: false,
        quant: None,
    };
    Ok((mat, bf16_round(v)))
}

fn dot(w: &[f32], x: &[f64]) -> f64 {
    w.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()
}

/// x + moe(rmsnorm(x)) of one row in f64 (probabilities, top-k and weights as the CPU engine).
#[allow(clippy::too_many_arguments)]
fn reference(
    s: MoeShape,
    x: &[f32],
    router: &[f32],
    gu: &[f32],
    dn: &[f32],
    sgu: &[f32],
    sdn: &[f32],
) -> Vec<f32> {
    let (h, e, i, si) = (s.hidden, s.experts, s.inter, s.shared_inter);
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
    let inv = 1.0 / (ms + 1e-6).sqrt();
    let hn: Vec<f64> = x.iter().map(|&v| v as f64 * inv).collect();
    let logits: Vec<f64> = (0..s.ld_logits())
        .map(|r| dot(&router[r * h..(r + 1) * h], &hn))
        .collect();
    let mx = logits[..e].iter().cloned().fold(f64::MIN, f64::max);
    let ex: Vec<f64> = logits[..e].iter().map(|l| (l - mx).exp()).collect();
    let z: f64 = ex.iter().sum();
    let mut order: Vec<usize> = (0..e).collect();
    order.sort_by(|&a, &b| ex[b].total_cmp(&ex[a]));
    let chosen = &order[..s.top_k];
    let sum: f64 = chosen.iter().map(|&c| ex[c] / z).sum();
    let expert = |gu: &[f32], dn: &[f32], inter: usize| -> Vec<f64> {
        let act: Vec<f64> = (0..inter)
            .map(|j| {
                let g = dot(&gu[j * h..(j + 1) * h], &hn);
                let u = dot(&gu[(inter + j) * h..(inter + j + 1) * h], &hn);
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        (0..h)
            .map(|o| dot(&dn[o * inter..(o + 1) * inter], &act))
            .collect()
    };
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for &c in chosen {
        let p = ex[c] / z;
        let w = if s.norm_topk { p / sum } else { p };
        let o = expert(
            &gu[c * 2 * i * h..(c + 1) * 2 * i * h],
            &dn[c * h * i..(c + 1) * h * i],
            i,
        );
        y.iter_mut().zip(&o).for_each(|(a, b)| *a += w * b);
    }
    if si > 0 {
        let g = 1.0 / (1.0 + (-logits[e]).exp());
        let o = expert(sgu, sdn, si);
        y.iter_mut().zip(&o).for_each(|(a, b)| *a += g * b);
    }
    y.iter().map(|&v| v as f32).collect()
}

fn moe_check(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
    s: MoeShape,
    n: usize,
) -> Result<(), CudaError> {
    let (h, e, i, si) = (s.hidden, s.experts, s.inter, s.shared_inter);
    let (router, r_h) = bf16_mat(dev, &rng.vec(s.ld_logits() * h, 0.3), s.ld_logits(), h)?;
    let (gate_up, gu_h) = bf16_mat(dev, &rng.vec(e * 2 * i * h, 0.2), e * 2 * i, h)?;
    let (down, dn_h) = bf16_mat(dev, &rng.vec(e * h * i, 0.2), e * h, i)?;
    let (mut sgu_h, mut sdn_h) = (Vec::new(), Vec::new());
    let shared = if si > 0 {
        let (g, gh) = bf16_mat(dev, &rng.vec(2 * si * h, 0.2), 2 * si, h)?;
        let (d, dh) = bf16_mat(dev, &rng.vec(h * si, 0.2), h, si)?;
        (sgu_h, sdn_h) = (gh, dh);
        Some((g, d))
    } else {
        None
    };
    let w = MoeW {
        router,
        gate_up,
        down,
        shared,
        shape: s,
    };
    let widths = Widths {
        hidden: h,
        big: s.ld_logits(),
        mid: s.slots() * s.ld_act(),
        max_in: h,
        vocab: 1,
        heads: 1,
        head_dim: 1,
        moe_k: s.top_k,
        ..Widths::default()
    };
    let ones = DBuf::from_host(dev, &vec![1.0f32; h])?;
    let norm = NormW {
        w: ones.ptr,
        eps: 1e-6,
        zero_centred: false,
    };
    let x = rng.vec(n * h, 1.0);
    let run = |rows: &[f32], m: usize| -> Result<Vec<f32>, CudaError> {
        let sc = Scratch::new(dev, &widths, m, 1)?;
        htod(dev, sc.x.ptr, rows)?;
        moe::forward(dev, &w, norm, &sc, m, 16)?;
        download(dev, &sc.x, m * h)
    };
    let block = run(&x, n)?;
    let want: Vec<f32> = x
        .chunks_exact(h)
        .flat_map(|r| reference(s, r, &r_h, &gu_h, &dn_h, &sgu_h, &sdn_h))
        .collect();
    let tag = format!(
        "(E {e} top-{} I {i} shared {si} H {h}{})",
        s.top_k,
        if s.norm_topk { " renorm" } else { "" }
    );
    out.push(SelfTestRow {
        what: format!("moe block vs f64 reference {tag}"),
        error: rel_err(&block, &want),
        bound: 1e-5,
    });
    let mut alone = Vec::with_capacity(n * h);
    for r in x.chunks_exact(h) {
        alone.extend(run(r, 1)?);
    }
    out.push(bitwise_row(
        format!("moe {n} rows == one row per pass (bits) {tag}"),
        same_bits(&block, &alone),
    ));
    Ok(())
}
