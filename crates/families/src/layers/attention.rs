//! Causal self-attention over an external KV cache, for Qwen3 (plain) and Qwen3.5 / Qwen3-Next (gated).
//!
//! Per row: q, k, v projections → per-head RMSNorm of q and k → (partial) rotate-half RoPE → append k, v
//! to the cache at their positions → softmax(q·kᵀ/√d)·v over positions ≤ the row's own (GQA) →
//! optional output gate `· sigmoid(gate)` (gated attention: q_proj emits [q, gate] per head) → o_proj.
//! Invariant: after a forward over rows start..start+n the cache holds exactly start+n positions.

use super::{Linear, Norm, Tensors};
use crate::state::KvCache;
use model_io::{LoadError, ModelConfig};

/// Projections of rows (`Attention::project`): qg [rows, heads * head_dim * (2 if gated else 1)],
/// k and v [rows, kv_heads * head_dim].
pub(crate) struct Projected {
    qg: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct Attention {
    /// [heads * head_dim * (2 if gated else 1), hidden]; gated rows are per head [q (head_dim), gate (head_dim)].
    pub q_proj: Linear,
    pub k_proj: Linear, // [kv_heads * head_dim, hidden]
    pub v_proj: Linear, // [kv_heads * head_dim, hidden]
    pub o_proj: Linear, // [hidden, heads * head_dim]
    pub q_norm: Norm,   // [head_dim]
    pub k_norm: Norm,   // [head_dim]
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub rope_theta: f32,
    pub gated: bool,
}

impl Attention {
    /// Loads `{prefix}q_proj.weight` etc. `zero_centred` selects the norm flavour of q_norm/k_norm.
    pub fn load(t: &Tensors<'_>, c: &ModelConfig, zero_centred: bool) -> Result<Self, LoadError> {
        let (h, kvh, d, hidden) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.hidden_size,
        );
        let gated = c.attn_output_gate;
        let q_rows = h * d * if gated { 2 } else { 1 };
        Ok(Attention {
            q_proj: Linear::load(t, "q_proj.weight", q_rows, hidden)?,
            k_proj: Linear::load(t, "k_proj.weight", kvh * d, hidden)?,
            v_proj: Linear::load(t, "v_proj.weight", kvh * d, hidden)?,
            o_proj: Linear::load(t, "o_proj.weight", hidden, h * d)?,
            q_norm: Norm::load(t, "q_norm.weight", d, c.rms_norm_eps, zero_centred)?,
            k_norm: Norm::load(t, "k_norm.weight", d, c.rms_norm_eps, zero_centred)?,
            heads: h,
            kv_heads: kvh,
            head_dim: d,
            rotary_dim: c.rotary_dim(),
            rope_theta: c.rope_theta,
            gated,
        })
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache {
            k: Vec::new(),
            v: Vec::new(),
            row: self.kv_heads * self.head_dim,
        }
    }

    /// x: [n, hidden] (already normed), rows at positions start..start+n. Returns [n, hidden].
    pub fn forward(&self, x: &[f32], n: usize, start: usize, cache: &mut KvCache) -> Vec<f32> {
        let p = self.project(x, &[n]);
        let attn = self.core(&p, 0, n, start, cache);
        self.o_proj.forward(&attn, n)
    }

    /// The q (with gate), k and v projections of several sequences' normed rows (`seg[i]` rows each,
    /// concatenated; `Linear::forward_segments`).
    pub(crate) fn project(&self, x: &[f32], seg: &[usize]) -> Projected {
        Projected {
            qg: self.q_proj.forward_segments(x, seg),
            k: self.k_proj.forward_segments(x, seg),
            v: self.v_proj.forward_segments(x, seg),
        }
    }

    /// One sequence's rows r0..r0+n of `p`, at positions start..start+n: q / k norms, RoPE, the cache
    /// append, attention and the output gate. Returns [n, heads * head_dim], the o_proj input.
    pub(crate) fn core(
        &self,
        p: &Projected,
        r0: usize,
        n: usize,
        start: usize,
        cache: &mut KvCache,
    ) -> Vec<f32> {
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        let qw = h * d * if self.gated { 2 } else { 1 };
        let qg = &p.qg[r0 * qw..(r0 + n) * qw]; // [n, h, d * (1 or 2)]
        let (mut q, gate) = if self.gated {
            // Split each head's [q | gate] pair.
            let mut q = vec![0.0; n * h * d];
            let mut gate = vec![0.0; n * h * d];
            for r in 0..n * h {
                q[r * d..(r + 1) * d].copy_from_slice(&qg[r * 2 * d..r * 2 * d + d]);
                gate[r * d..(r + 1) * d].copy_from_slice(&qg[r * 2 * d + d..(r + 1) * 2 * d]);
            }
            (q, Some(gate))
        } else {
            (qg.to_vec(), None)
        };
        let kw = kvh * d;
        let mut k = p.k[r0 * kw..(r0 + n) * kw].to_vec(); // [n, kvh, d]
        let v = &p.v[r0 * kw..(r0 + n) * kw]; // [n, kvh, d]
        self.q_norm.apply_inplace(&mut q);
        self.k_norm.apply_inplace(&mut k);
        let positions: Vec<usize> = (start..start + n).collect();
        kernels::rope(&mut q, &positions, h, d, self.rotary_dim, self.rope_theta);
        kernels::rope(&mut k, &positions, kvh, d, self.rotary_dim, self.rope_theta);

        debug_assert_eq!(cache.k.len(), start * kvh * d);
        cache.k.extend_from_slice(&k);
        cache.v.extend_from_slice(v);

        let mut attn = vec![0.0; n * h * d]; // [n, h, d]
        let scale = 1.0 / (d as f32).sqrt();
        kernels::attention(
            &q, &cache.k, &cache.v, n, start, h, kvh, d, scale, &mut attn,
        );
        if let Some(gate) = gate {
            for (a, g) in attn.iter_mut().zip(&gate) {
                *a *= kernels::sigmoid(*g);
            }
        }
        attn
    }

    pub fn params(&self) -> usize {
        self.q_proj.params()
            + self.k_proj.params()
            + self.v_proj.params()
            + self.o_proj.params()
            + 2 * self.head_dim
    }
}
