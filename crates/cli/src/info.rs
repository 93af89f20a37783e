//! `turbospark info [DIR]`: what a checkpoint is, read from its files alone (config, safetensors
//! headers, tokenizer/template presence, drafter files) — the weights are not converted, so this is
//! fast on any size and works on checkpoints without a tokenizer.
//!
//! The layer pattern is reported by its shortest period: Qwen3.5's `[linear ×3, full]` repeated
//! reads "3 linear : 1 full, repeating every 4 layers (LLLF)".

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use turbospark::model_io::{Checkpoint, DType, Family, LayerKind};

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Checkpoint directory. Default: $TURBOSPARK_MODEL, else the embedded testbed.
    #[arg(value_name = "DIR", env = "TURBOSPARK_MODEL")]
    pub dir: Option<PathBuf>,
}

pub fn run(args: &InfoArgs) -> Result<()> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => crate::embedded_model()?,
    };
    let checkpoint = Checkpoint::open(&dir).context("cannot open the checkpoint")?;
    let text = describe(&checkpoint);
    io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

pub fn family_name(family: Family) -> &'static str {
    match family {
        Family::Qwen3 => "Qwen3 (dense attention)",
        Family::Qwen3Moe => "Qwen3-MoE (dense attention, sparse MoE)",
        Family::Qwen35 => "Qwen3.5 (hybrid: Gated DeltaNet + gated full attention)",
        Family::Qwen3Next => "Qwen3-Next (hybrid: Gated DeltaNet + gated full attention, MoE)",
    }
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
    }
}

/// `1234567` → `"1.23M"`.
pub fn human_count(n: usize) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// The layer pattern by its shortest period, e.g. "3 linear : 1 full, repeating every 4 layers
/// (LLLF)" (L = linear attention, F = full attention), or "28 full attention" for a dense model.
pub fn layer_pattern(kinds: &[LayerKind]) -> String {
    let n = kinds.len();
    if n == 0 {
        return "no layers".into();
    }
    let period = (1..=n)
        .find(|&p| n.is_multiple_of(p) && kinds.iter().enumerate().all(|(i, k)| *k == kinds[i % p]))
        .unwrap_or(n);
    let linear = kinds[..period]
        .iter()
        .filter(|k| **k == LayerKind::LinearAttention)
        .count();
    let full = period - linear;
    let letters: String = kinds[..period]
        .iter()
        .map(|k| match k {
            LayerKind::LinearAttention => 'L',
            LayerKind::FullAttention => 'F',
        })
        .collect();
    match (linear, full) {
        (0, _) => format!("{n} full attention"),
        (_, 0) => format!("{n} linear attention"),
        _ if period == n => format!("{linear} linear : {full} full ({letters})"),
        _ => format!("{linear} linear : {full} full, repeating every {period} layers ({letters})"),
    }
}

/// Each stored ggml type's share of a GGUF model's tensor bytes, largest first, e.g.
/// "Q4_K 61.0% (98 tensors), Q6_K 25.3% (1), F32 0.4% (161)". On the CPU, weight matrices of the
/// `QUANTIZED_TYPES` stay in their blocks; other tensors are widened to f32 (bf16 kept) at load.
fn gguf_type_shares(tensors: &turbospark::model_io::TensorStore) -> String {
    let mut by_type: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for name in tensors.names() {
        if let (Ok(ty), Ok(bytes)) = (tensors.stored_dtype_name(name), tensors.stored_bytes(name)) {
            let e = by_type.entry(ty).or_default();
            e.0 += bytes;
            e.1 += 1;
        }
    }
    let total: usize = by_type.values().map(|v| v.0).sum::<usize>().max(1);
    let mut rows: Vec<_> = by_type.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = rows
        .iter()
        .map(|(ty, (bytes, n))| {
            format!(
                "{ty} {:.1}% ({n} tensors)",
                100.0 * *bytes as f64 / total as f64
            )
        })
        .collect();
    parts.join(", ")
}

/// Stored bytes of the weight matrices one decoded token reads: every 2-D tensor but the embeddings
/// (a lookup reads one row) and the MTP head, plus the embeddings once as a tied LM head.
fn decode_bytes(checkpoint: &Checkpoint) -> usize {
    let tensors = &checkpoint.tensors;
    tensors
        .names()
        .filter(|n| !n.starts_with("mtp.") && tensors.shape(n).is_ok_and(|s| s.len() >= 2))
        .filter(|n| !n.ends_with("embed_tokens.weight") || checkpoint.config.tie_word_embeddings)
        .map(|n| tensors.stored_bytes(n).unwrap_or(0))
        .sum()
}

/// The whole report, one `key: value` line per fact.
pub fn describe(checkpoint: &Checkpoint) -> String {
    let c = &checkpoint.config;
    let tensors = &checkpoint.tensors;
    let mut dtypes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut mtp_params = 0usize;
    for name in tensors.names() {
        if let Ok(dtype) = tensors.dtype(name) {
            *dtypes.entry(dtype_name(dtype)).or_default() += 1;
        }
        if name.starts_with("mtp.") {
            mtp_params += tensors.numel(name).unwrap_or(0);
        }
    }
    let quantized = tensors
        .names()
        .filter(|n| {
            tensors
                .stored_dtype_name(n)
                .is_ok_and(|t| turbospark::model_io::QUANTIZED_TYPES.contains(&t.as_str()))
        })
        .count();
    let fp8 = tensors
        .names()
        .filter(|n| tensors.stored_dtype_name(n).is_ok_and(|t| t == "F8_E4M3"))
        .count();
    // Quantized tensors report f32 (what `load_f32` widens them to); the kernels keep their blocks.
    for (label, count) in [("ggml blocks", quantized), ("fp8 e4m3 blocks", fp8)] {
        if count > 0 {
            *dtypes.entry("f32").or_default() -= count.min(dtypes.get("f32").copied().unwrap_or(0));
            dtypes.retain(|_, n| *n > 0);
            dtypes.insert(label, count);
        }
    }
    let dtype = match dtypes.len() {
        0 => "none (no tensors)".to_string(),
        1 => dtypes.keys().map(|k| k.to_string()).collect(),
        _ => {
            let parts: Vec<String> = dtypes
                .iter()
                .map(|(k, count)| format!("{k} ×{count}"))
                .collect();
            format!("mixed ({} tensors)", parts.join(", "))
        }
    };
    let total = checkpoint.parameter_count();
    let mut s = String::new();
    let mut line = |key: &str, value: String| {
        let _ = writeln!(s, "{:<16}{value}", format!("{key}:"));
    };
    line("model", checkpoint.dir.display().to_string());
    line("architecture", c.architecture.clone());
    line("family", family_name(c.family).to_string());
    line(
        "parameters",
        format!(
            "{} ({total}), of which MTP head {}",
            human_count(total),
            human_count(mtp_params)
        ),
    );
    line("weights dtype", dtype);
    if tensors.is_gguf() {
        line("GGUF types", gguf_type_shares(tensors));
    }
    line(
        "weights/token",
        format!(
            "{:.1} MB stored (the matrices a CPU decode step reads: all but the embeddings' lookup and the MTP head{})",
            decode_bytes(checkpoint) as f64 / 1e6,
            if c.moe.is_some() { "; every MoE expert counted" } else { "" }
        ),
    );
    line("context", format!("{} tokens", c.max_position_embeddings));
    line(
        "layers",
        format!("{}: {}", c.num_hidden_layers, layer_pattern(&c.layer_types)),
    );
    line(
        "dimensions",
        format!(
            "hidden {}, vocab {}, {} heads / {} kv heads × head_dim {}, intermediate {}",
            c.hidden_size,
            c.vocab_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.intermediate_size
        ),
    );
    if let Some(l) = &c.linear {
        line(
            "linear attn",
            format!(
                "{} key heads / {} value heads, dk {}, dv {}, conv kernel {}",
                l.num_key_heads, l.num_value_heads, l.key_head_dim, l.value_head_dim, l.conv_kernel
            ),
        );
    }
    if let Some(m) = &c.moe {
        let moe_layers = (0..c.num_hidden_layers)
            .filter(|&i| m.is_moe_layer(i))
            .count();
        line(
            "MoE",
            format!(
                "{} experts, top {}{}, expert width {}, shared expert {}, on {moe_layers} of {} layers",
                m.num_experts,
                m.num_experts_per_tok,
                if m.norm_topk_prob { " (renormalised)" } else { "" },
                m.moe_intermediate_size,
                if m.shared_expert_intermediate_size > 0 {
                    m.shared_expert_intermediate_size.to_string()
                } else {
                    "none".into()
                },
                c.num_hidden_layers
            ),
        );
    }
    line(
        "MTP head",
        if checkpoint.has_mtp {
            format!("yes ({} layer(s), mtp.* tensors)", c.mtp_num_hidden_layers)
        } else {
            "no".into()
        },
    );
    line(
        "DFlash drafter",
        if checkpoint.has_dflash {
            let config = checkpoint.dir.join("dflash").join("config.json");
            match turbospark::drafters::dflash::DflashConfig::from_json_file(&config) {
                Ok(c) => format!(
                    "yes (dflash/: {} layer(s), block {}, taps of layers {:?})",
                    c.num_hidden_layers, c.block_size, c.target_layer_ids
                ),
                Err(e) => format!("dflash/ present but unusable: {e}"),
            }
        } else {
            "no".into()
        },
    );
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    line("tokenizer", yes_no(checkpoint.has_tokenizer()));
    line("chat template", yes_no(checkpoint.chat_template.is_some()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use LayerKind::{FullAttention as F, LinearAttention as L};

    #[test]
    fn layer_pattern_reports_the_shortest_period() {
        assert_eq!(
            layer_pattern(&[L, L, L, F, L, L, L, F]),
            "3 linear : 1 full, repeating every 4 layers (LLLF)"
        );
        assert_eq!(layer_pattern(&[L, L, L, F]), "3 linear : 1 full (LLLF)");
        assert_eq!(layer_pattern(&[F, F, F]), "3 full attention");
        assert_eq!(layer_pattern(&[L, F, F]), "1 linear : 2 full (LFF)");
        assert_eq!(
            layer_pattern(&[L, F, L, F, L, F]),
            "1 linear : 1 full, repeating every 2 layers (LF)"
        );
        assert_eq!(layer_pattern(&[]), "no layers");
    }

    #[test]
    fn human_count_uses_three_significant_units() {
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1_500), "1.5K");
        assert_eq!(human_count(1_234_567), "1.23M");
        assert_eq!(human_count(3_960_000_000), "3.96B");
    }
}
