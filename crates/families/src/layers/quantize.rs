//! `--quantize`: which block format each weight matrix of a bf16/f32 checkpoint is quantized to at load.
//!
//! llama.cpp's rules (llama-quantize, `llama_tensor_get_type`), which users know from its files:
//! - `q8_0`: every weight matrix Q8_0, the LM head too.
//! - `q4_k` (its Q4_K_M without the per-layer Q6_K promotions): weight matrices Q4_K, the LM head (or
//!   the embeddings a tied head reads) Q6_K.
//! - A matrix whose rows do not divide into the format's blocks falls back as llama.cpp's
//!   `convert_incompatible_tensor`: Q4_K to Q5_0, Q6_K to Q8_0; rows not a multiple of 32 stay as stored.
//! - The MoE router and one-row gates stay as stored (llama.cpp keeps `ffn_gate_inp` in f32).
//! - `fp8`: every weight matrix e4m3 with a scale per 128x128 block, as Qwen's FP8 checkpoints; the LM
//!   head, embeddings and routers stay as stored, as there.

use kernels::QuantFormat;
use model_io::Quantize;

/// The format of weight matrix `name` ([rows, cols]) under `quantize`; None keeps it as stored.
pub fn format_for(quantize: Quantize, name: &str, rows: usize, cols: usize) -> Option<QuantFormat> {
    if rows <= 1 || name.ends_with("mlp.gate.weight") {
        return None;
    }
    let head = name.ends_with("lm_head.weight") || name.ends_with("embed_tokens.weight");
    let wanted = match (quantize, head) {
        (Quantize::Q8_0, _) => QuantFormat::Q8_0,
        (Quantize::Q4K, true) => QuantFormat::Q6K,
        (Quantize::Q4K, false) => QuantFormat::Q4K,
        (Quantize::Fp8, _) => return None,
    };
    let fits = |f: QuantFormat| cols.is_multiple_of(f.block_len());
    let fallback = match wanted {
        QuantFormat::Q4K => QuantFormat::Q5_0,
        QuantFormat::Q5K => QuantFormat::Q5_1,
        QuantFormat::Q6K => QuantFormat::Q8_0,
        other => other,
    };
    [wanted, fallback].into_iter().find(|&f| fits(f))
}

/// The FP8 block of weight matrix `name` ([rows, cols]) under `--quantize fp8` (Qwen's FP8 checkpoints:
/// [128, 128], every linear but the LM head, the embeddings and the MoE routers); None keeps it as stored.
pub fn fp8_block_for(quantize: Quantize, name: &str, rows: usize) -> Option<[usize; 2]> {
    let kept = rows <= 1
        || name.ends_with("mlp.gate.weight")
        || name.ends_with("lm_head.weight")
        || name.ends_with("embed_tokens.weight");
    (quantize == Quantize::Fp8 && !kept).then_some(FP8_BLOCK)
}

/// The block of Qwen's FP8 checkpoints.
pub const FP8_BLOCK: [usize; 2] = [128, 128];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_llama_cpp() {
        use QuantFormat::*;
        let q4 = Quantize::Q4K;
        assert_eq!(
            format_for(q4, "model.layers.0.mlp.up_proj.weight", 1024, 1024),
            Some(Q4K)
        );
        assert_eq!(
            format_for(q4, "model.layers.0.mlp.up_proj.weight", 1024, 384),
            Some(Q5_0)
        );
        assert_eq!(format_for(q4, "lm_head.weight", 8192, 1024), Some(Q6K));
        assert_eq!(
            format_for(q4, "model.embed_tokens.weight", 8192, 384),
            Some(Q8_0)
        );
        assert_eq!(
            format_for(Quantize::Q8_0, "lm_head.weight", 8192, 384),
            Some(Q8_0)
        );
        assert_eq!(
            format_for(Quantize::Q8_0, "model.layers.0.mlp.gate.weight", 64, 1024),
            None
        );
        assert_eq!(
            format_for(Quantize::Q8_0, "x.shared_expert_gate.weight", 1, 1024),
            None
        );
        assert_eq!(format_for(Quantize::Q8_0, "x.weight", 16, 48), None);
    }
}
