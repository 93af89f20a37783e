//! The chunked GDN recurrence (gdn_chunk.rs) against the step form on the same inputs, and both against
//! an f64 recurrence on the prep rows the step form computed: row counts below, at and across chunk
//! boundaries, key dims below, at and across one staged slice, value columns filling part of a block,
//! decays mild (state carried across chunks) and strong (cumulative decays underflow within a chunk).
//!
//! Bounds (relative to the largest reference value): the chunked form reorders f32 sums (dot products
//! over dk, the substitution down a chunk, products with S0), so it differs from the step form by
//! rounding, not bitwise. Each path's error against f64 is measured a few 1e-7 on these shapes; 1e-5
//! leaves room for longer sums and the GPU's contracted multiply-adds while a wrong term (a missing
//! decay factor, an off-by-one in a chunk) gives errors of order 1e-2 or more. The conv window is moved
//! by the same code in both: bitwise.

use super::{bitwise_row, download, rel_err, same_bits, Rng, SelfTestRow};
use cuda_backend::lab::gdn_chunk;
use cuda_backend::lab::ops::{self, GdnArgs, GdnShape};
use cuda_backend::lab::DBuf;
use cuda_backend::CudaDevice;
use cuda_backend::CudaError;

/// Relative error bound of each path against f64, and between the two.
const BOUND: f64 = 1e-5;

pub(super) fn checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    let shape = |hk, hv, dk, dv| GdnShape {
        hk,
        hv,
        dk,
        dv,
        kernel: 4,
    };
    // (shape, rows, mild decays)
    let cases = [
        (shape(2, 4, 32, 32), 17, true),
        (shape(2, 4, 32, 32), 64, true),
        (shape(2, 4, 32, 32), 100, false),
        (shape(2, 4, 32, 32), 200, true),
        (shape(1, 2, 96, 48), 130, true),
        (shape(1, 2, 128, 128), 70, true),
    ];
    for (s, n, mild) in cases {
        check(dev, rng, out, s, n, mild)?;
    }
    Ok(())
}

/// (o normed, final state, window, prep rows) of one run.
type Run = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Random layer parameters and inputs of one case.
struct Case {
    proj: Vec<f32>,
    params: [DBuf; 4],
    norm_w: Vec<f32>,
    s0: Vec<f32>,
    window0: Vec<f32>,
}

fn run(dev: &CudaDevice, s: GdnShape, c: &Case, n: usize, chunked: bool) -> Result<Run, CudaError> {
    let (pd, wd, sd) = (
        DBuf::from_host(dev, &c.proj)?,
        DBuf::from_host(dev, &c.window0)?,
        DBuf::from_host(dev, &s.state_to_device(&c.s0))?,
    );
    let prep = DBuf::f32s(dev, n * s.prep_width())?;
    let od = DBuf::f32s(dev, n * s.hv * s.dv)?;
    let scratch = DBuf::f32s(dev, gdn_chunk::scratch_floats(s, n))?;
    let args = GdnArgs {
        conv_w: c.params[0].ptr,
        a_log: c.params[1].ptr,
        dt_bias: c.params[2].ptr,
        norm_w: c.params[3].ptr,
        eps: 1e-6,
    };
    let (p, w, st, o) = (pd.ptr, wd.ptr, sd.ptr, od.ptr);
    if chunked {
        gdn_chunk::gdn_chunked(dev, s, &args, p, w, prep.ptr, st, o, &scratch, n)?;
    } else {
        let cols = ops::GdnCols::Split { done: None };
        ops::gdn_recurrence(dev, s, &args, p, w, prep.ptr, st, o, n, cols)?;
    }
    Ok((
        download(dev, &od, n * s.hv * s.dv)?,
        s.state_from_device(&download(dev, &sd, c.s0.len())?),
        download(dev, &wd, c.window0.len())?,
        download(dev, &prep, n * s.prep_width())?,
    ))
}

/// The recurrence in f64 on the prep rows (q, k, v, beta, decay as the kernels use them), then the
/// gated RMSNorm: (o, final state).
fn reference(s: GdnShape, c: &Case, prep: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let (hk, hv, dk, dv) = (s.hk, s.hv, s.dk, s.dv);
    let (cd, pw, qw) = (s.conv_dim(), s.proj_width(), s.prep_width());
    let mut st: Vec<f64> = c.s0.iter().map(|&x| x as f64).collect();
    let mut o = vec![0.0f32; n * hv * dv];
    for t in 0..n {
        let row = &prep[t * qw..(t + 1) * qw];
        for h in 0..hv {
            let kh = h / (hv / hk);
            let q = &row[kh * dk..(kh + 1) * dk];
            let k = &row[hk * dk + kh * dk..hk * dk + (kh + 1) * dk];
            let v = &row[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let (beta, decay) = (row[cd + h] as f64, row[cd + hv + h] as f64);
            let sh = &mut st[h * dk * dv..(h + 1) * dk * dv];
            sh.iter_mut().for_each(|x| *x *= decay);
            let mut y = vec![0.0f64; dv];
            for (j, yj) in y.iter_mut().enumerate() {
                let kv: f64 = (0..dk).map(|i| sh[i * dv + j] * k[i] as f64).sum();
                let delta = beta * (v[j] as f64 - kv);
                for i in 0..dk {
                    sh[i * dv + j] += k[i] as f64 * delta;
                }
                *yj = (0..dk).map(|i| sh[i * dv + j] * q[i] as f64).sum();
            }
            let ms = y.iter().map(|x| x * x).sum::<f64>() / dv as f64;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            for (j, yj) in y.iter().enumerate() {
                let z = c.proj[t * pw + cd + h * dv + j] as f64;
                let gate = z / (1.0 + (-z).exp());
                o[(t * hv + h) * dv + j] = (yj * inv * c.norm_w[j] as f64 * gate) as f32;
            }
        }
    }
    (o, st.iter().map(|&x| x as f32).collect())
}

fn check(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
    s: GdnShape,
    n: usize,
    mild: bool,
) -> Result<(), CudaError> {
    let (hv, dk, dv, kk, cd) = (s.hv, s.dk, s.dv, s.kernel, s.conv_dim());
    let proj = rng.vec(n * s.proj_width(), 1.0);
    let conv_w = rng.vec(cd * kk, 0.5);
    // exp(a_log) in [1e-3, 0.1] (decays 0.8..1 per row) or in [1, 16] (as the step form's self-test).
    let a_log: Vec<f32> = (0..hv)
        .map(|_| {
            let u = rng.next() + 1.0;
            if mild {
                (1e-3 + 0.05 * u).ln()
            } else {
                (1.0 + 7.5 * u).ln()
            }
        })
        .collect();
    let norm_w = rng.vec(dv, 1.0);
    let c = Case {
        params: [
            DBuf::from_host(dev, &conv_w)?,
            DBuf::from_host(dev, &a_log)?,
            DBuf::from_host(dev, &rng.vec(hv, 1.0))?,
            DBuf::from_host(dev, &norm_w)?,
        ],
        proj,
        norm_w,
        s0: rng.vec(hv * dk * dv, 0.1),
        window0: rng.vec((kk - 1) * cd, 1.0),
    };
    let (o_step, s_step, w_step, prep) = run(dev, s, &c, n, false)?;
    let (o_chunk, s_chunk, w_chunk, _) = run(dev, s, &c, n, true)?;
    let (o_ref, s_ref) = reference(s, &c, &prep, n);
    let tag = format!(
        "hk {} hv {hv} dk {dk} dv {dv}, {n} rows, {} decays",
        s.hk,
        if mild { "mild" } else { "strong" }
    );
    let rows = [
        ("step form output vs f64", &o_step, &o_ref),
        ("step form state vs f64", &s_step, &s_ref),
        ("chunked output vs f64", &o_chunk, &o_ref),
        ("chunked state vs f64", &s_chunk, &s_ref),
        ("chunked output vs step form", &o_chunk, &o_step),
        ("chunked state vs step form", &s_chunk, &s_step),
    ];
    for (what, got, want) in rows {
        out.push(SelfTestRow {
            what: format!("gdn {what} ({tag})"),
            error: rel_err(got, want),
            bound: BOUND,
        });
    }
    out.push(bitwise_row(
        format!("gdn chunked conv window == step form (bits) ({tag})"),
        same_bits(&w_chunk, &w_step),
    ));
    if !cuda_backend::lab::host_ops(dev) {
        // Another summation order: equal bits would mean the chunked kernels never ran.
        out.push(bitwise_row(
            format!("gdn chunked output differs from the step form's bits ({tag})"),
            !same_bits(&o_chunk, &o_step),
        ));
    }
    Ok(())
}
