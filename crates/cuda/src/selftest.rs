//! Kernel self-test on the device: each operation of the forward pass on small random inputs against an
//! independent host reference (f64 sums, or the CPU engine's f32 kernels from `crates/kernels`), so that a
//! wrong model output can be traced to one kernel. Shapes include the awkward cases: widths not a multiple
//! of the vector width, more rows than one GEMV launch, more value columns than one GDN block, and
//! attention rows whose keys span two splits.

use crate::buf::{dtoh, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::ops::{self, AttnBufs, AttnShape, GdnShape, ATT_CHUNK};
use crate::weights::{Mat, WDtype};

/// One self-test line: what, the worst error (relative to the reference's scale), and the bound.
#[derive(Clone, Debug)]
pub struct SelfTestRow {
    pub what: String,
    pub error: f64,
    pub bound: f64,
}

impl SelfTestRow {
    pub fn ok(&self) -> bool {
        self.error <= self.bound
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// max |a - b| / max(max |b|, tiny).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(1e-30f64, |m, &x| m.max(x.abs() as f64));
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            ((x as f64 - y as f64).abs() / scale).max(if x.is_nan() { 1e30 } else { 0.0 })
        })
        .fold(0.0, f64::max)
}

fn download(dev: &CudaDevice, buf: &DBuf, n: usize) -> Result<Vec<f32>, CudaError> {
    let mut v = vec![0.0f32; n];
    dtoh(dev, &mut v, buf.ptr)?;
    Ok(v)
}

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

/// Runs every check; never stops at the first failure.
pub fn self_test(dev: &CudaDevice) -> Result<Vec<SelfTestRow>, CudaError> {
    let mut rows = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    linear_checks(dev, &mut rng, &mut rows)?;
    norm_checks(dev, &mut rng, &mut rows)?;
    attention_check(dev, &mut rng, &mut rows)?;
    for (hk, hv, dk, dv) in [(2, 4, 16, 16), (1, 2, 128, 48), (2, 4, 128, 128)] {
        gdn_check(
            dev,
            &mut rng,
            &mut rows,
            GdnShape {
                hk,
                hv,
                dk,
                dv,
                kernel: 4,
            },
        )?;
    }
    Ok(rows)
}

fn linear_checks(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    for (dtype, cols, n) in [
        (WDtype::Bf16, 264, 1),
        (WDtype::Bf16, 264, 3),
        (WDtype::Bf16, 264, 11),
        (WDtype::Bf16, 100, 2),
        (WDtype::F32, 264, 3),
        (WDtype::F32, 98, 9),
        (WDtype::Bf16, 264, 40),
        (WDtype::F32, 264, 40),
    ] {
        let m = 300;
        let w = bf16_round(&rng.vec(m * cols, 0.5));
        let x = rng.vec(n * cols, 1.0);
        let y0 = rng.vec(n * m, 1.0);
        let wbytes: Vec<u8> = match dtype {
            WDtype::Bf16 => w
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            WDtype::F32 => w.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        };
        let mat = Mat {
            buf: DBuf::from_host(dev, &wbytes)?,
            rows: m,
            cols,
            dtype,
        };
        let xd = DBuf::from_host(dev, &x)?;
        let yd = DBuf::from_host(dev, &y0)?;
        let xb = DBuf::zeros(dev, n * cols * 2)?;
        ops::linear(dev, &mat, xd.ptr, yd.ptr, n, true, xb.ptr, 16)?;
        let got = download(dev, &yd, n * m)?;
        // cuBLAS passes (n > 16) round x to bf16 for bf16 weights.
        let xr = if n > 16 && dtype == WDtype::Bf16 {
            bf16_round(&x)
        } else {
            x.clone()
        };
        let want: Vec<f32> = (0..n * m)
            .map(|i| {
                let (r, o) = (i / m, i % m);
                let dot: f64 = (0..cols)
                    .map(|c| w[o * cols + c] as f64 * xr[r * cols + c] as f64)
                    .sum();
                (y0[i] as f64 + dot) as f32
            })
            .collect();
        out.push(SelfTestRow {
            what: format!("linear {dtype:?} [{m}x{cols}] rows {n} (+= y)"),
            error: rel_err(&got, &want),
            bound: 1e-5,
        });
    }
    Ok(())
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

fn attention_check(
    dev: &CudaDevice,
    rng: &mut Rng,
    out: &mut Vec<SelfTestRow>,
) -> Result<(), CudaError> {
    let s = AttnShape {
        hq: 4,
        hkv: 2,
        d: 16,
        rot_half: 4,
        gated: true,
        eps: 1e-6,
        zero_centred: true,
    };
    let (start, n) = (ATT_CHUNK + 44, 3);
    let (hq, hkv, d) = (s.hq, s.hkv, s.d);
    let width = 2 * hq * d + 2 * hkv * d;
    let qkv = rng.vec(n * width, 1.0);
    let qn = rng.vec(d, 0.3);
    let kn = rng.vec(d, 0.3);
    let inv_freq = kernels::rope_inv_freq(2 * s.rot_half, 10000.0);
    let total = start + n;
    let mut kc = rng.vec(total * hkv * d, 1.0);
    let mut vc = rng.vec(total * hkv * d, 1.0);
    let splits = total.div_ceil(ATT_CHUNK);
    let bufs = [
        DBuf::from_host(dev, &qkv)?,
        DBuf::f32s(dev, n * hq * d)?,
        DBuf::f32s(dev, n * hq * d)?,
        DBuf::from_host(dev, &kc)?,
        DBuf::from_host(dev, &vc)?,
        DBuf::from_host(dev, &[start as i32])?,
        DBuf::f32s(dev, n * hq * splits)?,
        DBuf::f32s(dev, n * hq * splits)?,
        DBuf::f32s(dev, n * hq * splits * d)?,
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
    };
    let (qnd, knd, fd) = (
        DBuf::from_host(dev, &qn)?,
        DBuf::from_host(dev, &kn)?,
        DBuf::from_host(dev, &inv_freq)?,
    );
    ops::attention(dev, s, &b, qnd.ptr, knd.ptr, fd.ptr, n, splits)?;
    let got = download(dev, &bufs[9], n * hq * d)?;
    // Host reference with the CPU engine's kernels.
    let (mut q, mut gate) = (vec![0.0; n * hq * d], vec![0.0; n * hq * d]);
    let (mut k, mut v) = (vec![0.0; n * hkv * d], vec![0.0; n * hkv * d]);
    for r in 0..n {
        let row = &qkv[r * width..(r + 1) * width];
        for h in 0..hq {
            q[(r * hq + h) * d..][..d].copy_from_slice(&row[h * 2 * d..h * 2 * d + d]);
            gate[(r * hq + h) * d..][..d].copy_from_slice(&row[h * 2 * d + d..(h + 1) * 2 * d]);
        }
        k[r * hkv * d..][..hkv * d].copy_from_slice(&row[2 * hq * d..2 * hq * d + hkv * d]);
        v[r * hkv * d..][..hkv * d].copy_from_slice(&row[2 * hq * d + hkv * d..]);
    }
    kernels::rms_norm_inplace(&mut q, &qn, 1e-6, true);
    kernels::rms_norm_inplace(&mut k, &kn, 1e-6, true);
    let positions: Vec<usize> = (start..start + n).collect();
    kernels::rope_with_inv_freq(&mut q, &positions, hq, d, &inv_freq);
    kernels::rope_with_inv_freq(&mut k, &positions, hkv, d, &inv_freq);
    kc[start * hkv * d..].copy_from_slice(&k);
    vc[start * hkv * d..].copy_from_slice(&v);
    let mut want = vec![0.0; n * hq * d];
    kernels::attention(
        &q,
        &kc,
        &vc,
        n,
        start,
        hq,
        hkv,
        d,
        1.0 / (d as f32).sqrt(),
        &mut want,
    );
    for (a, g) in want.iter_mut().zip(&gate) {
        *a *= kernels::sigmoid(*g);
    }
    out.push(SelfTestRow {
        what: format!("attention prep+split+combine (start {start}, {n} rows, {splits} splits)"),
        error: rel_err(&got, &want),
        bound: 1e-5,
    });
    let kc_got = download(dev, &bufs[3], total * hkv * d)?;
    out.push(SelfTestRow {
        what: "attention k cache rows written (norm + rope)".into(),
        error: rel_err(&kc_got, &kc),
        bound: 1e-6,
    });
    Ok(())
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
    let (pd, cwd, wd) = (
        DBuf::from_host(dev, &proj)?,
        DBuf::from_host(dev, &conv_w)?,
        DBuf::from_host(dev, &window0)?,
    );
    let (ald, dtd, sd) = (
        DBuf::from_host(dev, &a_log)?,
        DBuf::from_host(dev, &dt_bias)?,
        DBuf::from_host(dev, &s0)?,
    );
    let (mixed, od, nwd) = (
        DBuf::f32s(dev, n * cd)?,
        DBuf::f32s(dev, n * hv * dv)?,
        DBuf::from_host(dev, &norm_w)?,
    );
    ops::gdn_recurrence(
        dev, s, pd.ptr, cwd.ptr, wd.ptr, mixed.ptr, ald.ptr, dtd.ptr, sd.ptr, od.ptr, n,
    )?;
    let o_raw = download(dev, &od, n * hv * dv)?;
    ops::gated_norm(dev, s, od.ptr, pd.ptr, nwd.ptr, 1e-6, n)?;
    let o_normed = download(dev, &od, n * hv * dv)?;
    // Host reference: the CPU engine's conv and recurrence over the same inputs.
    let mut qkv_in = vec![0.0; n * cd];
    for r in 0..n {
        qkv_in[r * cd..(r + 1) * cd].copy_from_slice(&proj[r * pw..r * pw + cd]);
    }
    let mut window = window0.clone();
    let mut mixed_h = vec![0.0; n * cd];
    kernels::causal_conv1d_silu(&qkv_in, &conv_w, &mut window, n, cd, kk, &mut mixed_h);
    let (mut q, mut k, mut v) = (
        vec![0.0; n * hv * dk],
        vec![0.0; n * hv * dk],
        vec![0.0; n * hv * dv],
    );
    let (mut beta, mut g) = (vec![0.0; n * hv], vec![0.0; n * hv]);
    for r in 0..n {
        let m = &mixed_h[r * cd..(r + 1) * cd];
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
    let mut state = s0.clone();
    let mut o = vec![0.0; n * hv * dv];
    kernels::gdn_recurrent(&q, &k, &v, &g, &beta, &mut state, n, hv, dk, dv, &mut o);
    let tag = format!("hk {hk} hv {hv} dk {dk} dv {dv}");
    let checks = [
        (
            "conv1d_silu output",
            download(dev, &mixed, n * cd)?,
            mixed_h.clone(),
            1e-6,
        ),
        (
            "conv window",
            download(dev, &wd, (kk - 1) * cd)?,
            window.clone(),
            0.0,
        ),
        ("gdn_step output", o_raw, o.clone(), 1e-5),
        (
            "gdn_step final state",
            download(dev, &sd, hv * dk * dv)?,
            state,
            1e-5,
        ),
    ];
    for (what, got, want, bound) in checks {
        out.push(SelfTestRow {
            what: format!("{what} ({tag})"),
            error: rel_err(&got, &want),
            bound,
        });
    }
    for r in 0..n * hv {
        let (row, h) = (r / hv, r % hv);
        let orow = &mut o[r * dv..(r + 1) * dv];
        kernels::rms_norm_inplace(orow, &norm_w, 1e-6, false);
        for (i, y) in orow.iter_mut().enumerate() {
            let z = proj[row * pw + cd + h * dv + i];
            *y *= z * kernels::sigmoid(z);
        }
    }
    out.push(SelfTestRow {
        what: format!("gated_rmsnorm ({tag})"),
        error: rel_err(&o_normed, &o),
        bound: 1e-5,
    });
    Ok(())
}
