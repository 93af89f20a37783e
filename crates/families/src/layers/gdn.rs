//! Gated DeltaNet linear attention (Qwen3.5 / Qwen3-Next), over an external recurrent state.
//!
//! Per row: qkv = in_proj_qkv(x) → depthwise causal conv1d (kernel K) + SiLU over [q; k; v] → split heads;
//! q, k L2-normalised (eps 1e-6), q scaled by dk^-½, both repeated over value heads (head i uses key head
//! i / (Hv/Hk)); beta = sigmoid(b); g = -exp(A_log)·softplus(a + dt_bias); then per value head
//! S ← exp(g)S; δ = beta(v − Sᵀk); S ← S + kδᵀ; o = Sᵀq; out = out_proj(RMSNorm(o)·w · silu(z)).
//! Prefill of more than `CHUNKED_MIN_ROWS` rows uses the chunked (WY) form, otherwise the step form; the
//! step form is what decode and verify use, so a verify row equals the sequential step bit for bit.
//! Qwen3-Next's fused head-grouped `in_proj_qkvz` / `in_proj_ba` are re-laid out at load into the
//! Qwen3.5 split layout, so one forward serves both.

use super::{Linear, Tensors};
use crate::error::ModelError;
use crate::state::RecurrentState;
use crate::tape::LayerTape;
use model_io::ModelConfig;

/// Rows above which prefill uses the chunked form. Verify blocks (≤ 17 rows) stay on the step form so
/// that speculative and sequential decode run the identical recurrence.
pub const CHUNKED_MIN_ROWS: usize = 32;

/// Input projections of rows (`GatedDeltaNet::project`): qkv [rows, conv_dim], z [rows, hv * dv],
/// b and a [rows, hv].
pub(crate) struct Projected {
    qkv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct GatedDeltaNet {
    pub in_proj_qkv: Linear,   // [2*Hk*dk + Hv*dv, hidden]
    pub in_proj_z: Linear,     // [Hv*dv, hidden]
    pub in_proj_b: Linear,     // [Hv, hidden]
    pub in_proj_a: Linear,     // [Hv, hidden]
    pub conv_weight: Vec<f32>, // [conv_dim, K]
    pub a_log: Vec<f32>,       // [Hv]
    pub dt_bias: Vec<f32>,     // [Hv]
    pub norm_weight: Vec<f32>, // [dv] plain (not zero-centred)
    pub norm_eps: f32,
    pub out_proj: Linear, // [hidden, Hv*dv]
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub kernel: usize,
}

impl GatedDeltaNet {
    fn dims(c: &ModelConfig) -> Result<(usize, usize, usize, usize, usize), ModelError> {
        let l = c.linear.as_ref().ok_or_else(|| ModelError::Unsupported {
            dir: "config.json".into(),
            what: "linear-attention layer without linear_* config fields".into(),
        })?;
        Ok((
            l.num_key_heads,
            l.num_value_heads,
            l.key_head_dim,
            l.value_head_dim,
            l.conv_kernel,
        ))
    }

    fn finish(
        t: &Tensors<'_>,
        c: &ModelConfig,
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    ) -> Result<Self, ModelError> {
        let (hk, hv, dk, dv, kernel) = Self::dims(c)?;
        let conv_dim = 2 * hk * dk + hv * dv;
        Ok(GatedDeltaNet {
            in_proj_qkv: qkv,
            in_proj_z: z,
            in_proj_b: b,
            in_proj_a: a,
            conv_weight: t.get("conv1d.weight", &[conv_dim, 1, kernel])?,
            a_log: t.get("A_log", &[hv])?,
            dt_bias: t.get("dt_bias", &[hv])?,
            norm_weight: t.get("norm.weight", &[dv])?,
            norm_eps: c.rms_norm_eps,
            out_proj: Linear::load(t, "out_proj.weight", c.hidden_size, hv * dv)?,
            hk,
            hv,
            dk,
            dv,
            kernel,
        })
    }

    /// Qwen3.5 layout: separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    pub fn load_split(t: &Tensors<'_>, c: &ModelConfig) -> Result<Self, ModelError> {
        let (hk, hv, dk, dv, _) = Self::dims(c)?;
        let h = c.hidden_size;
        let qkv = Linear::load(t, "in_proj_qkv.weight", 2 * hk * dk + hv * dv, h)?;
        let z = Linear::load(t, "in_proj_z.weight", hv * dv, h)?;
        let b = Linear::load(t, "in_proj_b.weight", hv, h)?;
        let a = Linear::load(t, "in_proj_a.weight", hv, h)?;
        Self::finish(t, c, qkv, z, b, a)
    }

    /// Qwen3-Next layout: `in_proj_qkvz` rows grouped per key head g as [q_g (dk), k_g (dk), v_g (r·dv),
    /// z_g (r·dv)] and `in_proj_ba` as [b_g (r), a_g (r)] with r = Hv/Hk; regrouped here into the split
    /// layout by [`fused_projection_runs`].
    pub fn load_fused(t: &Tensors<'_>, c: &ModelConfig) -> Result<Self, ModelError> {
        let (hk, hv, dk, dv, _) = Self::dims(c)?;
        let h = c.hidden_size;
        let r = hv / hk;
        let qkvz = t.get("in_proj_qkvz.weight", &[hk * (2 * dk + 2 * r * dv), h])?;
        let ba = t.get("in_proj_ba.weight", &[hk * 2 * r, h])?;
        let mut all = Vec::with_capacity((2 * hk * dk + 2 * hv * dv + 2 * hv) * h);
        for run in fused_projection_runs(hk, hv, dk, dv) {
            let src = match run.part {
                FusedPart::Qkvz => &qkvz,
                FusedPart::Ba => &ba,
            };
            all.extend_from_slice(&src[run.first * h..(run.first + run.count) * h]);
        }
        let conv_dim = 2 * hk * dk + hv * dv;
        let take = |from: usize, count: usize| all[from * h..(from + count) * h].to_vec();
        let (z0, b0) = (conv_dim, conv_dim + hv * dv);
        Self::finish(
            t,
            c,
            Linear::from_rows(take(0, conv_dim), conv_dim, h),
            Linear::from_rows(take(z0, hv * dv), hv * dv, h),
            Linear::from_rows(take(b0, hv), hv, h),
            Linear::from_rows(take(b0 + hv, hv), hv, h),
        )
    }

    pub fn conv_dim(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }

    pub fn new_state(&self) -> RecurrentState {
        RecurrentState {
            s: vec![0.0; self.hv * self.dk * self.dv],
            conv: vec![0.0; (self.kernel - 1) * self.conv_dim()],
        }
    }

    /// x: [n, hidden] (already normed). Returns [n, hidden]. When `tape` is given, records the rows'
    /// recurrence inputs so the state can later be rebuilt for any prefix of them.
    pub fn forward(
        &self,
        x: &[f32],
        n: usize,
        st: &mut RecurrentState,
        tape: Option<&mut LayerTape>,
    ) -> Vec<f32> {
        let p = self.project(x, &[n]);
        let o = self.core(&p, 0, n, st, tape);
        self.out_proj.forward(&o, n)
    }

    /// The input projections of several sequences' normed rows (`seg[i]` rows each, concatenated;
    /// `Linear::forward_segments`).
    pub(crate) fn project(&self, x: &[f32], seg: &[usize]) -> Projected {
        Projected {
            qkv: self.in_proj_qkv.forward_segments(x, seg),
            z: self.in_proj_z.forward_segments(x, seg),
            b: self.in_proj_b.forward_segments(x, seg),
            a: self.in_proj_a.forward_segments(x, seg),
        }
    }

    /// One sequence's rows r0..r0+n of `p` through the conv, the recurrence on `st` (recorded on
    /// `tape` when given) and the gated norm. Returns [n, hv * dv], the out_proj input.
    pub(crate) fn core(
        &self,
        p: &Projected,
        r0: usize,
        n: usize,
        st: &mut RecurrentState,
        tape: Option<&mut LayerTape>,
    ) -> Vec<f32> {
        let (hv, dk, dv) = (self.hv, self.dk, self.dv);
        let conv_dim = self.conv_dim();
        let qkv_in = &p.qkv[r0 * conv_dim..(r0 + n) * conv_dim]; // [n, conv_dim]
        let z = &p.z[r0 * hv * dv..(r0 + n) * hv * dv]; // [n, hv, dv]
        let b = &p.b[r0 * hv..(r0 + n) * hv]; // [n, hv]
        let a = &p.a[r0 * hv..(r0 + n) * hv]; // [n, hv]
        if let Some(tape) = &tape {
            debug_assert_eq!(tape.conv_dim, conv_dim);
        }
        let conv_before = tape.as_ref().map(|_| st.conv.clone());
        let mut mixed = vec![0.0; n * conv_dim];
        kernels::causal_conv1d_silu(
            qkv_in,
            &self.conv_weight,
            &mut st.conv,
            n,
            conv_dim,
            self.kernel,
            &mut mixed,
        );

        let (q, k, v) = self.split_heads(&mixed, n);
        let mut beta = vec![0.0; n * hv];
        let mut g = vec![0.0; n * hv];
        for row in 0..n {
            for head in 0..hv {
                let i = row * hv + head;
                beta[i] = kernels::sigmoid(b[i]);
                g[i] = -self.a_log[head].exp() * kernels::softplus(a[i] + self.dt_bias[head]);
            }
        }

        let mut o = vec![0.0; n * hv * dv]; // [n, hv, dv]
        if let Some(tape) = tape {
            tape.record(
                conv_before.unwrap_or_default(),
                &st.s,
                qkv_in,
                &q,
                &k,
                &v,
                &g,
                &beta,
                n,
            );
        }
        if n >= CHUNKED_MIN_ROWS {
            kernels::gdn_chunked(&q, &k, &v, &g, &beta, &mut st.s, n, hv, dk, dv, &mut o);
        } else {
            kernels::gdn_recurrent(&q, &k, &v, &g, &beta, &mut st.s, n, hv, dk, dv, &mut o);
        }

        // Gated RMSNorm per value head: norm(o)·w · silu(z).
        for (row_o, row_z) in o.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            kernels::rms_norm_inplace(row_o, &self.norm_weight, self.norm_eps, false);
            for (y, &zz) in row_o.iter_mut().zip(row_z) {
                *y *= zz * kernels::sigmoid(zz);
            }
        }
        o
    }

    /// mixed: [n, conv_dim] post-conv → q, k: [n, hv, dk] (L2-normalised, q scaled, repeated over value
    /// heads), v: [n, hv, dv].
    pub(crate) fn split_heads(&self, mixed: &[f32], n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        let conv_dim = self.conv_dim();
        let rep = hv / hk;
        let mut q = vec![0.0; n * hv * dk];
        let mut k = vec![0.0; n * hv * dk];
        let mut v = vec![0.0; n * hv * dv];
        let scale = 1.0 / (dk as f32).sqrt();
        for row in 0..n {
            let src = &mixed[row * conv_dim..(row + 1) * conv_dim];
            let (sq, rest) = src.split_at(hk * dk);
            let (sk, sv) = rest.split_at(hk * dk);
            v[row * hv * dv..(row + 1) * hv * dv].copy_from_slice(sv);
            for head in 0..hv {
                let kh = head / rep;
                let dst = (row * hv + head) * dk;
                q[dst..dst + dk].copy_from_slice(&sq[kh * dk..(kh + 1) * dk]);
                k[dst..dst + dk].copy_from_slice(&sk[kh * dk..(kh + 1) * dk]);
            }
        }
        kernels::l2_normalize_rows(&mut q, dk, 1e-6);
        kernels::l2_normalize_rows(&mut k, dk, 1e-6);
        for x in q.iter_mut() {
            *x *= scale;
        }
        (q, k, v)
    }

    pub fn params(&self) -> usize {
        self.in_proj_qkv.params()
            + self.in_proj_z.params()
            + self.in_proj_b.params()
            + self.in_proj_a.params()
            + self.conv_weight.len()
            + self.a_log.len()
            + self.dt_bias.len()
            + self.norm_weight.len()
            + self.out_proj.params()
    }
}

/// Which Qwen3-Next fused projection a run of rows comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedPart {
    /// `in_proj_qkvz` [Hk · (2·dk + 2·r·dv), hidden]
    Qkvz,
    /// `in_proj_ba` [Hk · 2·r, hidden]
    Ba,
}

/// `count` consecutive rows of `part` starting at row `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedRun {
    pub part: FusedPart,
    pub first: usize,
    pub count: usize,
}

/// The re-layout of Qwen3-Next's head-grouped `in_proj_qkvz` / `in_proj_ba` (rows per key head g:
/// [q_g (dk), k_g (dk), v_g (r·dv), z_g (r·dv)] and [b_g (r), a_g (r)], r = Hv/Hk) into the split
/// layout [q ; k ; v ; z ; b ; a] (all heads of each in head order): concatenating the runs' rows in
/// this order gives it. Shared by the CPU engine and the CUDA backend's upload, so both read the same
/// rows. `hk` must divide `hv`.
pub fn fused_projection_runs(hk: usize, hv: usize, dk: usize, dv: usize) -> Vec<FusedRun> {
    let r = hv.checked_div(hk).unwrap_or(0);
    let group = 2 * dk + 2 * r * dv;
    let run = |part, first, count| FusedRun { part, first, count };
    let mut runs = Vec::with_capacity(6 * hk);
    // Offsets inside a key head's group of each section, in the split layout's order.
    let sections = [
        (FusedPart::Qkvz, 0, dk, group),
        (FusedPart::Qkvz, dk, dk, group),
        (FusedPart::Qkvz, 2 * dk, r * dv, group),
        (FusedPart::Qkvz, 2 * dk + r * dv, r * dv, group),
        (FusedPart::Ba, 0, r, 2 * r),
        (FusedPart::Ba, r, r, 2 * r),
    ];
    for (part, offset, count, stride) in sections {
        for g in 0..hk {
            runs.push(run(part, g * stride + offset, count));
        }
    }
    runs
}
