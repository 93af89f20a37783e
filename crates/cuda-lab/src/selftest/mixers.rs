//! Attention and Gated DeltaNet checks against the CPU engine's kernels, and their batch invariance:
//! attention rows of a block equal the same rows run alone at their positions; GDN rows in one launch
//! equal one launch per row, with the columns in one block per head or split over several.

use super::{bitwise_row, download, rel_err, same_bits, Rng, SelfTestRow};
use cuda_backend::lab::ops::{
    self, AttnBufs, AttnCore, AttnShape, GdnArgs, GdnCols, GdnShape, Rope, ATT_MAX_D,
    ATT_SPLITS_COARSE, ATT_SPLITS_FINE,
};
use cuda_backend::lab::DBuf;
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    let shape = |hq, hkv, d, rot_half, gated, zero_centred| AttnShape {
        hq,
        hkv,
        d,
        rot_half,
        gated,
        eps: 1e-6,
        zero_centred,
    };
    // (shape, start, rows, s_max): 2 query heads per KV head, 4 per KV head at head_dim 256, 3 per KV
    // head ungated with coarse chunks, and a long context whose chunks grow past the minimum.
    for (s, start, n, s_max) in [
        (shape(4, 2, 16, 4, true, true), 300, 3, ATT_SPLITS_FINE),
        (shape(8, 2, 256, 32, true, true), 100, 2, ATT_SPLITS_FINE),
        (
            shape(3, 1, 64, 16, false, false),
            1000,
            3,
            ATT_SPLITS_COARSE,
        ),
        (shape(2, 2, 32, 8, true, true), 2500, 2, ATT_SPLITS_FINE),
    ] {
        attention_check(dev, rng, out, s, start, n, s_max)?;
    }
    // Conv kernel 4 (the models') takes gdn_conv_prep's compile-time path, 3 its runtime-length one.
    for (hk, hv, dk, dv, kernel) in [
        (2, 4, 16, 16, 4),
        (1, 2, 128, 48, 4),
        (2, 4, 128, 128, 4),
        (2, 4, 16, 16, 3),
    ] {
        let s = GdnShape {
            hk,
            hv,
            dk,
            dv,
            kernel,
        };
        gdn_check(dev, rng, out, s)?;
    }
    Ok(())
}

/// (out, k cache, v cache) after an attention run.
pub(super) type AttnOut = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Runs the attention kernels on copies of the inputs; returns (out, k cache, v cache).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_attention(
    dev: &CudaDevice,
    s: AttnShape,
    qkv: &[f32],
    norms: (&DBuf, &DBuf, &DBuf),
    kc: &[f32],
    vc: &[f32],
    start: usize,
    n: usize,
    core: AttnCore,
    rope: Rope,
) -> Result<AttnOut, CudaError> {
    let (hq, d) = (s.hq, s.d);
    let s_max = match core {
        AttnCore::SplitK { s_max } => s_max,
        AttnCore::TensorCores { splits } => splits,
    };
    let bufs = [
        DBuf::from_host(dev, qkv)?,
        DBuf::f32s(dev, n * hq * d)?,
        DBuf::f32s(dev, n * hq * d)?,
        DBuf::from_host(dev, kc)?,
        DBuf::from_host(dev, vc)?,
        DBuf::from_host(dev, &[start as i32])?,
        DBuf::f32s(dev, n * hq * s_max)?,
        DBuf::f32s(dev, n * hq * s_max)?,
        DBuf::f32s(dev, n * hq * s_max * d)?,
        DBuf::f32s(dev, n * hq * d)?,
    ];
    let b = AttnBufs {
        qkv: bufs[0].ptr,
        q: bufs[1].ptr,
        gate: bufs[2].ptr,
        k_cache: bufs[3].ptr,
        v_cache: bufs[4].ptr,
        start: bufs[5].ptr,
        part_m: bufs[6].ptr,
        part_l: bufs[7].ptr,
        part_acc: bufs[8].ptr,
        out: bufs[9].ptr,
        rope,
    };
    ops::attention(dev, s, &b, norms.0.ptr, norms.1.ptr, norms.2.ptr, n, core)?;
    Ok((
        download(dev, &bufs[9], n * hq * d)?,
        download(dev, &bufs[3], kc.len())?,
        download(dev, &bufs[4], vc.len())?,
    ))
}

#[allow(clippy::too_many_arguments)]
fn attention_check(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
    s: AttnShape,
    start: usize,
    n: usize,
    s_max: usize,
) -> Result<(), CudaError> {
    let (hq, hkv, d) = (s.hq, s.hkv, s.d);
    let split_k = AttnCore::SplitK { s_max };
    let qw = hq * d * if s.gated { 2 } else { 1 };
    let width = qw + 2 * hkv * d;
    let qkv = rng.vec(n * width, 1.0);
    let qn = rng.vec(d, 0.3);
    let kn = rng.vec(d, 0.3);
    let inv_freq = kernels::rope_inv_freq(2 * s.rot_half, 10000.0);
    let total = start + n;
    let mut kc = rng.vec(total * hkv * d, 1.0);
    let mut vc = rng.vec(total * hkv * d, 1.0);
    let norms = (
        DBuf::from_host(dev, &qn)?,
        DBuf::from_host(dev, &kn)?,
        DBuf::from_host(dev, &inv_freq)?,
    );
    let nr = (&norms.0, &norms.1, &norms.2);
    let (got, kc_got, vc_got) =
        run_attention(dev, s, &qkv, nr, &kc, &vc, start, n, split_k, Rope::Compute)?;
    // Host reference with the CPU engine's kernels.
    let (mut q, mut gate) = (vec![0.0; n * hq * d], vec![0.0; n * hq * d]);
    let (mut k, mut v) = (vec![0.0; n * hkv * d], vec![0.0; n * hkv * d]);
    let per_head = if s.gated { 2 * d } else { d };
    for r in 0..n {
        let row = &qkv[r * width..(r + 1) * width];
        for h in 0..hq {
            q[(r * hq + h) * d..][..d].copy_from_slice(&row[h * per_head..h * per_head + d]);
            if s.gated {
                gate[(r * hq + h) * d..][..d]
                    .copy_from_slice(&row[h * per_head + d..(h + 1) * per_head]);
            }
        }
        k[r * hkv * d..][..hkv * d].copy_from_slice(&row[qw..qw + hkv * d]);
        v[r * hkv * d..][..hkv * d].copy_from_slice(&row[qw + hkv * d..]);
    }
    kernels::rms_norm_inplace(&mut q, &qn, 1e-6, s.zero_centred);
    kernels::rms_norm_inplace(&mut k, &kn, 1e-6, s.zero_centred);
    let positions: Vec<usize> = (start..start + n).collect();
    kernels::rope_with_inv_freq(&mut q, &positions, hq, d, &inv_freq);
    kernels::rope_with_inv_freq(&mut k, &positions, hkv, d, &inv_freq);
    kc[start * hkv * d..].copy_from_slice(&k);
    vc[start * hkv * d..].copy_from_slice(&v);
    let mut want = vec![0.0; n * hq * d];
    let scale = 1.0 / (d as f32).sqrt();
    kernels::attention(&q, &kc, &vc, n, start, hq, hkv, d, scale, &mut want);
    if s.gated {
        for (a, g) in want.iter_mut().zip(&gate) {
            *a *= kernels::sigmoid(*g);
        }
    }
    let tag = format!("hq {hq} hkv {hkv} d {d}, start {start}, {n} rows, s_max {s_max}");
    out.push(SelfTestRow {
        what: format!("attention ({tag})"),
        error: rel_err(&got, &want),
        bound: 1e-5,
    });
    out.push(SelfTestRow {
        what: format!("attention k cache rows (norm + rope) ({tag})"),
        error: rel_err(&kc_got, &kc),
        bound: 1e-6,
    });
    // Each row alone at its own position (the cache as the block left it) gives the same bits.
    let mut alone = Vec::with_capacity(got.len());
    for r in 0..n {
        let row = &qkv[r * width..(r + 1) * width];
        let (o, _, _) = run_attention(
            dev,
            s,
            row,
            nr,
            &kc_got,
            &vc_got,
            start + r,
            1,
            split_k,
            Rope::Compute,
        )?;
        alone.extend(o);
    }
    out.push(bitwise_row(
        format!("attention rows == each row alone (bits) ({tag})"),
        same_bits(&got, &alone),
    ));
    // A pass's first attention layer stores its RoPE cos / sin, the later ones read them: the same bits
    // (outputs and cache rows) as computing them. Read before any store, the table is noise.
    let table = DBuf::from_host(dev, &rng.vec(n * 2 * ATT_MAX_D, 1.0))?;
    let with = |rope| run_attention(dev, s, &qkv, nr, &kc, &vc, start, n, split_k, rope);
    let (noise, _, _) = with(Rope::Read(table.ptr))?;
    out.push(bitwise_row(
        format!("attention reads its RoPE from the table (a noise table changes the bits) ({tag})"),
        !same_bits(&got, &noise),
    ));
    let stored = with(Rope::Store(table.ptr))?;
    let read = with(Rope::Read(table.ptr))?;
    for (how, (o, k, _)) in [("stored", stored), ("read back", read)] {
        out.push(bitwise_row(
            format!("attention with the RoPE table {how} == computed (bits) ({tag})"),
            same_bits(&got, &o) && same_bits(&kc_got, &k),
        ));
    }
    Ok(())
}

/// (outputs, final state, final window) of rows run one launch each.
type RowByRow = (Vec<f32>, Vec<f32>, Vec<f32>);

/// The outputs of one GDN run: (o normed, final state, window, prep rows).
type GdnOut = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Runs gdn_recurrence over `proj` rows from (s0, window0) on fresh buffers.
#[allow(clippy::too_many_arguments)]
fn run_gdn(
    dev: &CudaDevice,
    s: GdnShape,
    params: (&DBuf, &DBuf, &DBuf, &DBuf),
    proj: &[f32],
    s0: &[f32],
    window0: &[f32],
    n: usize,
    cols: GdnCols,
) -> Result<GdnOut, CudaError> {
    let (hv, dv) = (s.hv, s.dv);
    let (pd, wd, sd) = (
        DBuf::from_host(dev, proj)?,
        DBuf::from_host(dev, window0)?,
        DBuf::from_host(dev, &s.state_to_device(s0))?,
    );
    let (prep, od) = (
        DBuf::f32s(dev, n * s.prep_width())?,
        DBuf::f32s(dev, n * hv * dv)?,
    );
    let args = GdnArgs {
        conv_w: params.0.ptr,
        a_log: params.1.ptr,
        dt_bias: params.2.ptr,
        norm_w: params.3.ptr,
        eps: 1e-6,
    };
    ops::gdn_recurrence(
        dev, s, &args, pd.ptr, wd.ptr, prep.ptr, sd.ptr, od.ptr, n, cols,
    )?;
    Ok((
        download(dev, &od, n * hv * dv)?,
        s.state_from_device(&download(dev, &sd, s0.len())?),
        download(dev, &wd, window0.len())?,
        download(dev, &prep, n * s.prep_width())?,
    ))
}

fn gdn_check(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
    s: GdnShape,
) -> Result<(), CudaError> {
    let n = 5;
    let (hk, hv, dk, dv, kk) = (s.hk, s.hv, s.dk, s.dv, s.kernel);
    let (cd, pw) = (s.conv_dim(), s.proj_width());
    let proj = rng.vec(n * pw, 1.0);
    let conv_w = rng.vec(cd * kk, 0.5);
    let window0 = rng.vec((kk - 1) * cd, 1.0);
    let a_log: Vec<f32> = (0..hv)
        .map(|_| (1.0 + 7.5 * (rng.next() + 1.0)).ln())
        .collect();
    let dt_bias = rng.vec(hv, 1.0);
    let s0 = rng.vec(hv * dk * dv, 0.1);
    let norm_w = rng.vec(dv, 1.0);
    let params = (
        DBuf::from_host(dev, &conv_w)?,
        DBuf::from_host(dev, &a_log)?,
        DBuf::from_host(dev, &dt_bias)?,
        DBuf::from_host(dev, &norm_w)?,
    );
    let pr = (&params.0, &params.1, &params.2, &params.3);
    let per_head = GdnCols::PerHead;
    let (o_got, s_got, w_got, prep_got) = run_gdn(dev, s, pr, &proj, &s0, &window0, n, per_head)?;
    // Host reference: the CPU engine's conv, normalisation, recurrence and gated norm.
    let mut qkv_in = vec![0.0; n * cd];
    for r in 0..n {
        qkv_in[r * cd..(r + 1) * cd].copy_from_slice(&proj[r * pw..r * pw + cd]);
    }
    let mut window = window0.clone();
    let mut mixed = vec![0.0; n * cd];
    kernels::causal_conv1d_silu(&qkv_in, &conv_w, &mut window, n, cd, kk, &mut mixed);
    let (mut q, mut k, mut v) = (
        vec![0.0; n * hv * dk],
        vec![0.0; n * hv * dk],
        vec![0.0; n * hv * dv],
    );
    let (mut beta, mut g) = (vec![0.0; n * hv], vec![0.0; n * hv]);
    for r in 0..n {
        let m = &mixed[r * cd..(r + 1) * cd];
        for h in 0..hv {
            let kh = h / (hv / hk);
            q[(r * hv + h) * dk..][..dk].copy_from_slice(&m[kh * dk..(kh + 1) * dk]);
            k[(r * hv + h) * dk..][..dk]
                .copy_from_slice(&m[hk * dk + kh * dk..hk * dk + (kh + 1) * dk]);
            let b = proj[r * pw + cd + hv * dv + h];
            let a = proj[r * pw + cd + hv * dv + hv + h];
            beta[r * hv + h] = kernels::sigmoid(b);
            g[r * hv + h] = -a_log[h].exp() * kernels::softplus(a + dt_bias[h]);
        }
        v[r * hv * dv..(r + 1) * hv * dv].copy_from_slice(&m[2 * hk * dk..]);
    }
    kernels::l2_normalize_rows(&mut q, dk, 1e-6);
    kernels::l2_normalize_rows(&mut k, dk, 1e-6);
    let scale = 1.0 / (dk as f32).sqrt();
    q.iter_mut().for_each(|x| *x *= scale);
    // The prep rows' [q | k | v] as the kernels lay them out (per key head, not per value head).
    let group = hv / hk;
    let mut prep_want = Vec::new();
    let mut prep_seen = Vec::new();
    for r in 0..n {
        let row = &prep_got[r * s.prep_width()..(r + 1) * s.prep_width()];
        for kh in 0..hk {
            let h = kh * group;
            prep_want.extend_from_slice(&q[(r * hv + h) * dk..][..dk]);
            prep_seen.extend_from_slice(&row[kh * dk..(kh + 1) * dk]);
        }
        for kh in 0..hk {
            let h = kh * group;
            prep_want.extend_from_slice(&k[(r * hv + h) * dk..][..dk]);
            prep_seen.extend_from_slice(&row[hk * dk + kh * dk..hk * dk + (kh + 1) * dk]);
        }
        prep_want.extend_from_slice(&v[r * hv * dv..(r + 1) * hv * dv]);
        prep_seen.extend_from_slice(&row[2 * hk * dk..cd]);
    }
    let mut state = s0.clone();
    let mut o = vec![0.0; n * hv * dv];
    kernels::gdn_recurrent(&q, &k, &v, &g, &beta, &mut state, n, hv, dk, dv, &mut o);
    for r in 0..n * hv {
        let (row, h) = (r / hv, r % hv);
        let orow = &mut o[r * dv..(r + 1) * dv];
        kernels::rms_norm_inplace(orow, &norm_w, 1e-6, false);
        for (i, y) in orow.iter_mut().enumerate() {
            let z = proj[row * pw + cd + h * dv + i];
            *y *= z * kernels::sigmoid(z);
        }
    }
    let tag = format!("hk {hk} hv {hv} dk {dk} dv {dv} conv {kk}");
    let checks = [
        ("conv + silu + l2 norm (prep)", prep_seen, prep_want, 1e-6),
        ("conv window", w_got.clone(), window, 0.0),
        ("recurrence + gated norm output", o_got.clone(), o, 1e-5),
        ("final state", s_got.clone(), state, 1e-5),
    ];
    for (what, got, want, bound) in checks {
        out.push(SelfTestRow {
            what: format!("gdn {what} ({tag})"),
            error: rel_err(&got, &want),
            bound,
        });
    }
    // Columns split over blocks, the gated norm by its own kernel: the same bits.
    let split = GdnCols::Split { done: None };
    let (o_c, s_c, w_c, _) = run_gdn(dev, s, pr, &proj, &s0, &window0, n, split)?;
    out.push(bitwise_row(
        format!("gdn split columns == one block per head (bits) ({tag})"),
        same_bits(&o_c, &o_got) && same_bits(&s_c, &s_got) && same_bits(&w_c, &w_got),
    ));
    // Split, the gated norm by each head's last block (the decode launch), twice on one counter
    // buffer, which must come back to zero: the same bits.
    let done = DBuf::zeros(dev, hv * 4)?;
    let split = GdnCols::Split {
        done: Some(done.ptr),
    };
    let mut same = true;
    for _ in 0..2 {
        let (o_d, s_d, w_d, _) = run_gdn(dev, s, pr, &proj, &s0, &window0, n, split)?;
        same &= same_bits(&o_d, &o_got) && same_bits(&s_d, &s_got) && same_bits(&w_d, &w_got);
    }
    let mut left = vec![0i32; hv];
    cuda_backend::lab::dtoh(dev, &mut left, done.ptr)?;
    out.push(bitwise_row(
        format!(
            "gdn split columns, norm by the head's last block == one block per head (bits) ({tag})"
        ),
        same && left.iter().all(|&c| c == 0),
    ));
    // One launch per row, carrying state and window: (outputs, final state, final window).
    let row_by_row = |cols: GdnCols| -> Result<RowByRow, CudaError> {
        let (mut st, mut win) = (s0.clone(), window0.clone());
        let mut o_rows = Vec::new();
        for r in 0..n {
            let row = &proj[r * pw..(r + 1) * pw];
            let (o1, s1, w1, _) = run_gdn(dev, s, pr, row, &st, &win, 1, cols)?;
            o_rows.extend(o1);
            (st, win) = (s1, w1);
        }
        Ok((o_rows, st, win))
    };
    // Decode launches, one row each on one counter buffer: gdn_step where the shape takes it (whole
    // warps, split columns), conv_prep + gdn_rec otherwise; the same bits, the counter back to zero.
    let (o_rows, st, win) = row_by_row(split)?;
    cuda_backend::lab::dtoh(dev, &mut left, done.ptr)?;
    out.push(bitwise_row(
        format!("gdn decode rows (gdn_step) == {n} rows per launch (bits) ({tag})"),
        same_bits(&o_rows, &o_got)
            && same_bits(&st, &s_got)
            && same_bits(&win, &w_got)
            && left.iter().all(|&c| c == 0),
    ));
    // One launch per row, carrying state and window: the same bits.
    let (o_rows, st, win) = row_by_row(per_head)?;
    out.push(bitwise_row(
        format!("gdn {n} rows == one row per launch (bits) ({tag})"),
        same_bits(&o_rows, &o_got) && same_bits(&st, &s_got) && same_bits(&win, &w_got),
    ));
    Ok(())
}
