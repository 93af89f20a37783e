//! Feed-forward blocks: the SwiGLU MLP `down(silu(gate(x)) · up(x))`, and the sparse MoE of Qwen3-Next,
//! Qwen3.5-MoE and Qwen3-MoE: router softmax over experts (f32) → top-k (ties to the lower index, as
//! torch.topk) → optional renormalisation of the k weights (`norm_topk_prob`) → Σ weight·expert(x), plus,
//! where the block has one (not Qwen3-MoE), the shared expert scaled by sigmoid(shared_expert_gate(x)).
//! Every row is computed independently of the other rows in the batch.

use super::{Linear, Tensors};
use crate::error::ModelError;
use model_io::{ModelConfig, MoeConfig};

#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate_proj: Linear, // [inter, hidden]
    pub up_proj: Linear,   // [inter, hidden]
    pub down_proj: Linear, // [hidden, inter]
}

impl Mlp {
    pub fn load(t: &Tensors<'_>, hidden: usize, inter: usize) -> Result<Self, ModelError> {
        Ok(Mlp {
            gate_proj: Linear::load(t, "gate_proj.weight", inter, hidden)?,
            up_proj: Linear::load(t, "up_proj.weight", inter, hidden)?,
            down_proj: Linear::load(t, "down_proj.weight", hidden, inter)?,
        })
    }

    /// x: [n, hidden] -> [n, hidden]
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let gate = self.gate_proj.forward(x, n);
        let up = self.up_proj.forward(x, n);
        let mut act = vec![0.0; gate.len()];
        kernels::silu_mul(&gate, &up, &mut act);
        self.down_proj.forward(&act, n)
    }

    /// [`Mlp::forward`] over several sequences' rows (`seg[i]` each, concatenated), every row with the
    /// bits its sequence's rows alone give it (`Linear::forward_segments`).
    pub fn forward_segments(&self, x: &[f32], seg: &[usize]) -> Vec<f32> {
        let gate = self.gate_proj.forward_segments(x, seg);
        let up = self.up_proj.forward_segments(x, seg);
        let mut act = vec![0.0; gate.len()];
        kernels::silu_mul(&gate, &up, &mut act);
        self.down_proj.forward_segments(&act, seg)
    }

    pub fn params(&self) -> usize {
        self.gate_proj.params() + self.up_proj.params() + self.down_proj.params()
    }
}

#[derive(Clone, Debug)]
pub struct Moe {
    pub router: Linear, // [experts, hidden]
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
    pub shared_gate: Option<Linear>, // [1, hidden]
    pub top_k: usize,
    pub norm_topk_prob: bool,
}

impl Moe {
    /// Accepts both expert layouts users have: per-expert `experts.{e}.{gate,up,down}_proj.weight` (the
    /// original checkpoints) and transformers 5's fused `experts.gate_up_proj` [E, 2I, H] / `experts.down_proj` [E, H, I].
    pub fn load(t: &Tensors<'_>, c: &ModelConfig, m: &MoeConfig) -> Result<Self, ModelError> {
        let (h, inter, e) = (c.hidden_size, m.moe_intermediate_size, m.num_experts);
        let router = Linear::load(t, "gate.weight", e, h)?;
        let mut experts = Vec::with_capacity(e);
        if t.contains("experts.gate_up_proj") {
            let gate_up = t.get("experts.gate_up_proj", &[e, 2 * inter, h])?;
            let down = t.get("experts.down_proj", &[e, h, inter])?;
            for x in 0..e {
                let gu = &gate_up[x * 2 * inter * h..(x + 1) * 2 * inter * h];
                experts.push(Mlp {
                    gate_proj: Linear::from_rows(gu[..inter * h].to_vec(), inter, h),
                    up_proj: Linear::from_rows(gu[inter * h..].to_vec(), inter, h),
                    down_proj: Linear::from_rows(
                        down[x * h * inter..(x + 1) * h * inter].to_vec(),
                        h,
                        inter,
                    ),
                });
            }
        } else {
            for x in 0..e {
                experts.push(Mlp::load(&t.sub(&format!("experts.{x}.")), h, inter)?);
            }
        }
        let (shared, shared_gate) = if m.shared_expert_intermediate_size > 0 {
            (
                Some(Mlp::load(
                    &t.sub("shared_expert."),
                    h,
                    m.shared_expert_intermediate_size,
                )?),
                Some(Linear::load(t, "shared_expert_gate.weight", 1, h)?),
            )
        } else {
            (None, None)
        };
        Ok(Moe {
            router,
            experts,
            shared,
            shared_gate,
            top_k: m.num_experts_per_tok,
            norm_topk_prob: m.norm_topk_prob,
        })
    }

    /// x: [n, hidden] -> [n, hidden]
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let h = self.router.in_dim;
        let e = self.experts.len();
        let logits = self.router.forward(x, n); // [n, experts]
        let mut out = vec![0.0f32; n * h];
        // Route: per row the top-k experts and their weights.
        let mut rows_of: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        for row in 0..n {
            let mut p = logits[row * e..(row + 1) * e].to_vec();
            kernels::softmax_inplace(&mut p);
            let mut order: Vec<usize> = (0..e).collect();
            // Stable sort by descending probability keeps the lower index first on ties.
            order.sort_by(|&i, &j| p[j].total_cmp(&p[i]));
            let chosen = &order[..self.top_k.min(e)];
            let sum: f32 = chosen.iter().map(|&i| p[i]).sum();
            for &i in chosen {
                let w = if self.norm_topk_prob {
                    p[i] / sum
                } else {
                    p[i]
                };
                rows_of[i].push((row, w));
            }
        }
        for (expert, rows) in self.experts.iter().zip(&rows_of) {
            if rows.is_empty() {
                continue;
            }
            let mut xs = Vec::with_capacity(rows.len() * h);
            for &(row, _) in rows {
                xs.extend_from_slice(&x[row * h..(row + 1) * h]);
            }
            let y = expert.forward(&xs, rows.len());
            for (j, &(row, w)) in rows.iter().enumerate() {
                for (o, &v) in out[row * h..(row + 1) * h]
                    .iter_mut()
                    .zip(&y[j * h..(j + 1) * h])
                {
                    *o += w * v;
                }
            }
        }
        if let (Some(shared), Some(gate)) = (&self.shared, &self.shared_gate) {
            let y = shared.forward(x, n);
            let g = gate.forward(x, n); // [n, 1]
            for row in 0..n {
                let s = kernels::sigmoid(g[row]);
                for (o, &v) in out[row * h..(row + 1) * h]
                    .iter_mut()
                    .zip(&y[row * h..(row + 1) * h])
                {
                    *o += s * v;
                }
            }
        }
        out
    }

    pub fn params(&self) -> usize {
        self.router.params()
            + self.experts.iter().map(Mlp::params).sum::<usize>()
            + self.shared.as_ref().map_or(0, Mlp::params)
            + self.shared_gate.as_ref().map_or(0, Linear::params)
    }
}

// One per layer, so the dense variant's size (three `Linear`s, quantized ones included) costs nothing
// worth an indirection on every forward.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Ffn {
    Dense(Mlp),
    Moe(Box<Moe>),
}

impl Ffn {
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        match self {
            Ffn::Dense(m) => m.forward(x, n),
            Ffn::Moe(m) => m.forward(x, n),
        }
    }

    pub fn params(&self) -> usize {
        match self {
            Ffn::Dense(m) => m.params(),
            Ffn::Moe(m) => m.params(),
        }
    }
}
