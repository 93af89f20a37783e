//! Qwen3 dense (`Qwen3ForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`): every layer full attention
//! with plain RMSNorms (`x̂·w`), per-head q_norm / k_norm, full rotary, no output gate; the MLP is
//! SwiGLU, or for Qwen3-MoE on the layers `MoeConfig::is_moe_layer` picks the sparse MoE block (router
//! `mlp.gate`, experts `mlp.experts.*`, no shared expert).

use crate::error::ModelError;
use crate::layers::attention::Attention;
use crate::layers::ffn::{Ffn, Mlp, Moe};
use crate::layers::{Norm, Tensors};
use crate::model::{Layer, Mixer};
use model_io::ModelConfig;

pub(crate) fn load_layer(t: &Tensors<'_>, c: &ModelConfig, i: usize) -> Result<Layer, ModelError> {
    let lt = t.sub(&format!("layers.{i}."));
    let eps = c.rms_norm_eps;
    Ok(Layer {
        input_norm: Norm::load(&lt, "input_layernorm.weight", c.hidden_size, eps, false)?,
        mixer: Mixer::Attention(Attention::load(&lt.sub("self_attn."), c, false)?),
        post_norm: Norm::load(
            &lt,
            "post_attention_layernorm.weight",
            c.hidden_size,
            eps,
            false,
        )?,
        ffn: match &c.moe {
            Some(m) if m.is_moe_layer(i) => Ffn::Moe(Box::new(Moe::load(&lt.sub("mlp."), c, m)?)),
            _ => Ffn::Dense(Mlp::load(
                &lt.sub("mlp."),
                c.hidden_size,
                c.intermediate_size,
            )?),
        },
    })
}
