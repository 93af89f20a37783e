//! Tensor-core attention of prefill passes (attn_tc, attention_tc.cu) against the f32 split-K kernels
//! (checked against the CPU engine in `mixers`) on the same inputs: GQA groups of 2, 4 and 3 (4, 2 and
//! 1 heads per block), head dims 16..256, row counts that are not a multiple of the 16-row tile, keys
//! from a previous pass in the cache (start > 0), gated or not, one key split (normalised in the
//! kernel) or several (attn_tc_combine).
//!
//! Tolerance: q, K, V and P enter the tensor cores as bf16 (8 significant bits, relative rounding
//! <= 2^-9), as the prefill GEMMs' activations do; the scores carry two such roundings summed over d
//! (random signs: ~2^-9 of the score scale), the weights one more, the values one. The output is a
//! weighted mean of V, so its error is a few 2^-9 of the value scale: bounded here at 1e-2 of the
//! output's largest magnitude, which a wrong mask, tile or split (errors of order 1) would exceed.

use super::mixers::run_attention;
use super::{bitwise_row, rel_err, same_bits, Rng, SelfTestRow};
use cuda_backend::lab::ops::{AttnCore, AttnShape, Rope, ATT_SPLITS_COARSE};
use cuda_backend::lab::DBuf;
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

/// Bound on max |tc - split-K| / max |split-K| (module doc).
const TC_BOUND: f64 = 1e-2;

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    // (hq, hkv, d, gated, start, rows, splits)
    for (hq, hkv, d, gated, start, n, splits) in [
        (4, 2, 64, true, 0, 37, 1),
        (4, 2, 64, false, 50, 70, 3),
        (8, 2, 256, true, 20, 45, 8),
        (8, 2, 256, false, 0, 21, 1),
        (3, 1, 32, true, 40, 23, 2),
        (4, 2, 16, true, 7, 80, 1),
    ] {
        let s = AttnShape {
            hq,
            hkv,
            d,
            rot_half: d / 4,
            gated,
            eps: 1e-6,
            zero_centred: true,
        };
        tc_check(dev, rng, out, s, start, n, splits)?;
    }
    Ok(())
}

fn tc_check(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
    s: AttnShape,
    start: usize,
    n: usize,
    splits: usize,
) -> Result<(), CudaError> {
    let (hq, hkv, d) = (s.hq, s.hkv, s.d);
    let width = hq * d * if s.gated { 2 } else { 1 } + 2 * hkv * d;
    let qkv = rng.vec(n * width, 1.0);
    let norms = (
        DBuf::from_host(dev, &rng.vec(d, 0.3))?,
        DBuf::from_host(dev, &rng.vec(d, 0.3))?,
        DBuf::from_host(dev, &kernels::rope_inv_freq(2 * s.rot_half, 10000.0))?,
    );
    let nr = (&norms.0, &norms.1, &norms.2);
    // Keys 0..start as a previous pass left them (attn_prep writes start..start + n).
    let kc = rng.vec((start + n) * hkv * d, 1.0);
    let vc = rng.vec((start + n) * hkv * d, 1.0);
    let split_k = AttnCore::SplitK {
        s_max: ATT_SPLITS_COARSE,
    };
    let (want, kc_want, _) =
        run_attention(dev, s, &qkv, nr, &kc, &vc, start, n, split_k, Rope::Compute)?;
    let tc = AttnCore::TensorCores { splits };
    let (got, kc_got, _) = run_attention(dev, s, &qkv, nr, &kc, &vc, start, n, tc, Rope::Compute)?;
    let tag = format!(
        "hq {hq} hkv {hkv} d {d}, start {start}, {n} rows, {splits} splits{}",
        if s.gated { ", gated" } else { "" }
    );
    out.push(SelfTestRow {
        what: format!("tensor-core attention vs split-K ({tag})"),
        error: rel_err(&got, &want),
        bound: TC_BOUND,
    });
    // Equal bits would mean the split-K kernels ran (bf16 operands always move the low bits).
    out.push(bitwise_row(
        format!("tensor-core attention is not split-K (bits differ) ({tag})"),
        !same_bits(&got, &want),
    ));
    out.push(bitwise_row(
        format!("tensor-core attention: attn_prep's cache rows unchanged ({tag})"),
        same_bits(&kc_got, &kc_want),
    ));
    Ok(())
}
