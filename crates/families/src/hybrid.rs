//! Qwen3.5 (`Qwen3_5ForCausalLM`, and the text half of `Qwen3_5ForConditionalGeneration`) and Qwen3-Next
//! (`Qwen3NextForCausalLM`): Gated-DeltaNet layers interleaved with gated full attention (`layer_types`),
//! zero-centred RMSNorms `x̂·(1+w)` everywhere except the GDN output norm, partial rotary.
//! Qwen3-Next differs in its fused head-grouped GDN projections and its sparse-MoE feed-forward.

use crate::error::ModelError;
use crate::layers::attention::Attention;
use crate::layers::ffn::{Ffn, Mlp, Moe};
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::{Norm, Tensors};
use crate::model::{Layer, Mixer};
use model_io::{LayerKind, ModelConfig};

pub(crate) fn load_layer(t: &Tensors<'_>, c: &ModelConfig, i: usize) -> Result<Layer, ModelError> {
    let kind = c
        .layer_types
        .get(i)
        .copied()
        .unwrap_or(LayerKind::FullAttention);
    let moe = c.moe.as_ref().is_some_and(|m| m.is_moe_layer(i));
    load_decoder_layer(&t.sub(&format!("layers.{i}.")), c, kind, moe)
}

/// One hybrid decoder layer under `lt` (`model.layers.{i}.` or `mtp.layers.{j}.`).
pub fn load_decoder_layer(
    lt: &Tensors<'_>,
    c: &ModelConfig,
    kind: LayerKind,
    moe: bool,
) -> Result<Layer, ModelError> {
    let eps = c.rms_norm_eps;
    let mixer = match kind {
        LayerKind::LinearAttention => {
            let at = lt.sub("linear_attn.");
            Mixer::Linear(if at.contains("in_proj_qkvz.weight") {
                GatedDeltaNet::load_fused(&at, c)?
            } else {
                GatedDeltaNet::load_split(&at, c)?
            })
        }
        _ => Mixer::Attention(Attention::load(&lt.sub("self_attn."), c, true)?),
    };
    let ffn = match &c.moe {
        Some(m) if moe => Ffn::Moe(Box::new(Moe::load(&lt.sub("mlp."), c, m)?)),
        _ => Ffn::Dense(Mlp::load(
            &lt.sub("mlp."),
            c.hidden_size,
            c.intermediate_size,
        )?),
    };
    Ok(Layer {
        input_norm: Norm::load(lt, "input_layernorm.weight", c.hidden_size, eps, true)?,
        mixer,
        post_norm: Norm::load(
            lt,
            "post_attention_layernorm.weight",
            c.hidden_size,
            eps,
            true,
        )?,
        ffn,
    })
}
