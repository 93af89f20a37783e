//! The sparse-MoE fields of config.json (Qwen3-Next, Qwen3.5-MoE, Qwen3-MoE) -> [`MoeConfig`].

use super::{positive, ArchSpec, Family};
use crate::json::Fields;
use crate::LoadError;

/// Sparse MoE block sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to 1.
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// transformers' rule (`Qwen3NextDecoderLayer`, `Qwen3MoeDecoderLayer`): layer `i` has the sparse MoE block iff
    /// `i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0`;
    /// otherwise it has a dense MLP of `intermediate_size`.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        let on_step = layer
            .checked_add(1)
            .and_then(|n| n.checked_rem(self.decoder_sparse_step))
            == Some(0);
        !self.mlp_only_layers.contains(&layer) && self.num_experts > 0 && on_step
    }
}

/// Qwen3NextConfig / Qwen3_5MoeTextConfig / Qwen3MoeConfig. Qwen3.5-MoE has no `decoder_sparse_step`,
/// `mlp_only_layers` or `norm_topk_prob`: every layer is MoE and its router always renormalises.
/// Qwen3-MoE has no shared expert, and transformers 5 saves its expert count as `num_local_experts`
/// (`attribute_map`; the released checkpoints say `num_experts`): either is read, both must agree.
pub(super) fn read_moe(text: &Fields<'_>, spec: &ArchSpec) -> Result<Option<MoeConfig>, LoadError> {
    let (default_experts, default_top_k, default_width) = match spec.family {
        Family::Qwen3Next => (512, 10, 512),
        Family::Qwen3Moe => (128, 8, 768),
        _ => (256, 8, 512),
    };
    // Qwen3-Next and Qwen3-MoE read the sparse-step fields; Qwen3.5-MoE is MoE on every layer.
    let stepped = matches!(spec.family, Family::Qwen3Next | Family::Qwen3Moe);
    let num_experts = match spec.family {
        Family::Qwen3Moe => qwen3_moe_experts(text)?,
        _ => text.opt_usize("num_experts")?,
    }
    .unwrap_or(default_experts);
    if num_experts == 0 {
        if stepped {
            return Ok(None); // every layer dense (transformers' rule requires num_experts > 0)
        }
        return Err(text.invalid("num_experts", "must be positive, found 0"));
    }
    let num_experts_per_tok = text.usize_or("num_experts_per_tok", default_top_k)?;
    if num_experts_per_tok == 0 || num_experts_per_tok > num_experts {
        return Err(text.invalid(
            "num_experts_per_tok",
            format!("must lie in 1..={num_experts} (num_experts), found {num_experts_per_tok}"),
        ));
    }
    let moe = MoeConfig {
        num_experts,
        num_experts_per_tok,
        moe_intermediate_size: positive(
            text,
            "moe_intermediate_size",
            text.usize_or("moe_intermediate_size", default_width)?,
        )?,
        shared_expert_intermediate_size: match spec.family {
            Family::Qwen3Moe => 0,
            _ => text.usize_or("shared_expert_intermediate_size", 512)?,
        },
        norm_topk_prob: match spec.family {
            Family::Qwen3Next => text.bool_or("norm_topk_prob", true)?,
            Family::Qwen3Moe => text.bool_or("norm_topk_prob", false)?,
            _ => true,
        },
        decoder_sparse_step: if stepped {
            positive(
                text,
                "decoder_sparse_step",
                text.usize_or("decoder_sparse_step", 1)?,
            )?
        } else {
            1
        },
        mlp_only_layers: if stepped {
            text.opt_usize_list("mlp_only_layers")?.unwrap_or_default()
        } else {
            Vec::new()
        },
    };
    Ok(Some(moe))
}

/// `num_experts` or its alias `num_local_experts`; `None` when neither is given.
fn qwen3_moe_experts(text: &Fields<'_>) -> Result<Option<usize>, LoadError> {
    match (
        text.opt_usize("num_experts")?,
        text.opt_usize("num_local_experts")?,
    ) {
        (Some(a), Some(b)) if a != b => Err(text.invalid(
            "num_local_experts",
            format!("{b} disagrees with num_experts = {a} (the same field under two names)"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}
