//! Qwen3 dense (`Qwen3ForCausalLM`): every layer full attention with plain RMSNorms (`x̂·w`), per-head
//! q_norm / k_norm, full rotary, SwiGLU MLP (or MoE for Qwen3-MoE-shaped configs).

use crate::error::ModelError;
use crate::layers::attention::Attention;
use crate::layers::ffn::{Ffn, Mlp};
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
        ffn: Ffn::Dense(Mlp::load(
            &lt.sub("mlp."),
            c.hidden_size,
            c.intermediate_size,
        )?),
    })
}
