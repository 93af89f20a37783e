//! A random DFlash drafter (z-lab's `DFlashDraftModel` layout, `dflash/` beside the target) for a
//! synth shape: Qwen3 decoder layers of the target's widths, the outputs of a few target layers spread
//! over the trunk as taps. Random weights are (almost) never accepted, so it measures what a round
//! costs — the drafter's block pass and a verify of block + 1 rows — not what it saves.
//! Sizes follow z-lab's Qwen3-4B drafter (5 layers, block 16, 5 taps) for shapes of hidden >= 1024, and
//! stay minimal (1 layer, block 4, 2 taps) for the tiny test shapes.

use std::path::{Path, PathBuf};

use crate::{write_safetensors, Init, Shape, SplitMix, SynthError, TensorSpec};

/// Writes the drafter to `dir/dflash/` (`config.json`, `model.safetensors`) for a target of `shape`
/// written to `dir`. Returns the files written.
pub fn write_dflash(shape: &Shape, dir: &Path, seed: u64) -> Result<Vec<PathBuf>, SynthError> {
    let (layers, block, taps) = if shape.hidden >= 1024 {
        (5, 16, 5)
    } else {
        (1, 4, 2)
    };
    let (h, hd) = (shape.hidden, shape.head_dim);
    // Taps spread over the trunk, first and last layers excluded (z-lab: 1 .. n-3 evenly).
    let target_layer_ids: Vec<usize> = (0..taps)
        .map(|i| 1 + i * (shape.layers.saturating_sub(3)) / (taps - 1).max(1))
        .collect();
    let mut v = Vec::new();
    let mut add =
        |name: String, shape: Vec<usize>, init: Init| v.push(TensorSpec { name, shape, init });
    add("fc.weight".into(), vec![h, taps * h], Init::Normal(0.02));
    add("hidden_norm.weight".into(), vec![h], Init::Const(1.0));
    add("norm.weight".into(), vec![h], Init::Const(1.0));
    for i in 0..layers {
        let p = format!("layers.{i}.");
        let a = format!("{p}self_attn.");
        add(
            format!("{a}q_proj.weight"),
            vec![shape.heads * hd, h],
            Init::Normal(0.02),
        );
        add(
            format!("{a}k_proj.weight"),
            vec![shape.kv_heads * hd, h],
            Init::Normal(0.02),
        );
        add(
            format!("{a}v_proj.weight"),
            vec![shape.kv_heads * hd, h],
            Init::Normal(0.02),
        );
        add(
            format!("{a}o_proj.weight"),
            vec![h, shape.heads * hd],
            Init::Normal(0.02),
        );
        add(format!("{a}q_norm.weight"), vec![hd], Init::Const(1.0));
        add(format!("{a}k_norm.weight"), vec![hd], Init::Const(1.0));
        for m in ["gate_proj", "up_proj"] {
            add(
                format!("{p}mlp.{m}.weight"),
                vec![shape.intermediate, h],
                Init::Normal(0.02),
            );
        }
        add(
            format!("{p}mlp.down_proj.weight"),
            vec![h, shape.intermediate],
            Init::Normal(0.02),
        );
        add(
            format!("{p}input_layernorm.weight"),
            vec![h],
            Init::Const(1.0),
        );
        add(
            format!("{p}post_attention_layernorm.weight"),
            vec![h],
            Init::Const(1.0),
        );
    }
    let out = dir.join("dflash");
    std::fs::create_dir_all(&out).map_err(|source| SynthError::Io {
        path: out.clone(),
        source,
    })?;
    let weights = out.join("model.safetensors");
    let refs: Vec<&TensorSpec> = v.iter().collect();
    write_safetensors(&weights, &refs, &mut SplitMix(seed ^ 0xD7A5_4000_0000_0001))?;
    let config = serde_json::json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block,
        "dflash_config": {"mask_token_id": shape.vocab - 1, "target_layer_ids": target_layer_ids},
        "num_target_layers": shape.layers,
        "vocab_size": shape.vocab,
        "hidden_size": h,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": hd,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "attention_bias": false,
        "tie_word_embeddings": false,
        "layer_types": vec!["full_attention"; layers],
    });
    let cp = out.join("config.json");
    let text = serde_json::to_string_pretty(&config).unwrap_or_default();
    std::fs::write(&cp, text).map_err(|source| SynthError::Io {
        path: cp.clone(),
        source,
    })?;
    Ok(vec![weights, cp])
}
