//! `synth`: random-weight checkpoints of a named shape, written exactly as users have checkpoints —
//! `config.json` (transformers' field names), bf16 `model-0000i-of-0000n.safetensors` shards streamed
//! to disk (a 4B model never sits in memory) and `model.safetensors.index.json`.
//!
//! Weights: N(0, 0.02) for projections and embeddings (transformers' `initializer_range`), zeros for the
//! zero-centred norm weights (so the scale is 1 + 0), ones for the GDN output norm and dt_bias,
//! A_log = ln U(1, 16). Deterministic in the seed, so a benchmark is repeatable across machines.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape '{0}' (known: {1})")]
    UnknownShape(String, String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A named model shape.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    /// "qwen3" or "qwen3_5_text".
    pub model_type: &'static str,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Hybrid only: linear-attention key heads, value heads, head dim (k and v).
    pub linear: Option<(usize, usize, usize)>,
    pub tied: bool,
    pub mtp: bool,
}

pub const SHAPES: &[Shape] = &[
    // ~100M-parameter Qwen3.5-shaped hybrid: the CPU benchmark model of issue 2.
    Shape {
        name: "qwen35-100m",
        model_type: "qwen3_5_text",
        vocab: 32768,
        hidden: 768,
        intermediate: 2048,
        layers: 12,
        heads: 8,
        kv_heads: 2,
        head_dim: 128,
        linear: Some((8, 16, 64)),
        tied: true,
        mtp: true,
    },
    // A ~0.8B Qwen3.5-architecture hybrid with an MTP head: 1.5 GB of bf16, larger than any CPU cache,
    // so CPU decode and verify are bandwidth-bound as on real models.
    Shape {
        name: "qwen35-0.8b",
        model_type: "qwen3_5_text",
        vocab: 151936,
        hidden: 1024,
        intermediate: 4096,
        layers: 28,
        heads: 8,
        kv_heads: 2,
        head_dim: 256,
        linear: Some((16, 16, 128)),
        tied: true,
        mtp: true,
    },
    // Qwen3-0.6B's shape (dense, tied embeddings).
    Shape {
        name: "qwen3-0.6b",
        model_type: "qwen3",
        vocab: 151936,
        hidden: 1024,
        intermediate: 3072,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        linear: None,
        tied: true,
        mtp: false,
    },
    // Qwen3.5-4B-like (the GPU's reference shape: 3.96B params, 7.92 GB bf16).
    Shape {
        name: "qwen35-4b",
        model_type: "qwen3_5_text",
        vocab: 151936,
        hidden: 2560,
        intermediate: 9216,
        layers: 32,
        heads: 16,
        kv_heads: 4,
        head_dim: 256,
        linear: Some((16, 32, 128)),
        tied: true,
        mtp: false,
    },
    // Qwen3.5-9B-like.
    Shape {
        name: "qwen35-9b",
        model_type: "qwen3_5_text",
        vocab: 248320,
        hidden: 4096,
        intermediate: 12288,
        layers: 32,
        heads: 16,
        kv_heads: 4,
        head_dim: 256,
        linear: Some((16, 32, 128)),
        tied: false,
        mtp: false,
    },
    // Qwen3-8B-like dense.
    Shape {
        name: "qwen3-8b",
        model_type: "qwen3",
        vocab: 151936,
        hidden: 4096,
        intermediate: 12288,
        layers: 36,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        linear: None,
        tied: false,
        mtp: false,
    },
    // Tiny shapes for tests.
    Shape {
        name: "tiny-hybrid",
        model_type: "qwen3_5_text",
        vocab: 256,
        hidden: 64,
        intermediate: 128,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        linear: Some((2, 4, 16)),
        tied: true,
        mtp: true,
    },
    Shape {
        name: "tiny-dense",
        model_type: "qwen3",
        vocab: 256,
        hidden: 64,
        intermediate: 128,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        linear: None,
        tied: false,
        mtp: false,
    },
];

mod dflash;
pub use dflash::write_dflash;

pub fn shape(name: &str) -> Result<&'static Shape, SynthError> {
    SHAPES.iter().find(|s| s.name == name).ok_or_else(|| {
        SynthError::UnknownShape(
            name.into(),
            SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        )
    })
}

enum Init {
    Normal(f32),
    Const(f32),
    LogUniform(f32, f32),
}

struct TensorSpec {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

impl Shape {
    pub fn is_hybrid(&self) -> bool {
        self.linear.is_some()
    }

    fn full_attention(&self, layer: usize) -> bool {
        !self.is_hybrid() || (layer + 1).is_multiple_of(4)
    }

    fn tensors(&self) -> Vec<TensorSpec> {
        let (h, hd) = (self.hidden, self.head_dim);
        let mut v = Vec::new();
        let mut add =
            |name: String, shape: Vec<usize>, init: Init| v.push(TensorSpec { name, shape, init });
        let norm_init = || {
            if self.is_hybrid() {
                Init::Const(0.0)
            } else {
                Init::Const(1.0)
            }
        };
        add(
            "model.embed_tokens.weight".into(),
            vec![self.vocab, h],
            Init::Normal(0.02),
        );
        let attention = |add: &mut dyn FnMut(String, Vec<usize>, Init), p: &str| {
            let q_rows = self.heads * hd * if self.is_hybrid() { 2 } else { 1 };
            add(
                format!("{p}self_attn.q_proj.weight"),
                vec![q_rows, h],
                Init::Normal(0.02),
            );
            add(
                format!("{p}self_attn.k_proj.weight"),
                vec![self.kv_heads * hd, h],
                Init::Normal(0.02),
            );
            add(
                format!("{p}self_attn.v_proj.weight"),
                vec![self.kv_heads * hd, h],
                Init::Normal(0.02),
            );
            add(
                format!("{p}self_attn.o_proj.weight"),
                vec![h, self.heads * hd],
                Init::Normal(0.02),
            );
            add(format!("{p}self_attn.q_norm.weight"), vec![hd], norm_init());
            add(format!("{p}self_attn.k_norm.weight"), vec![hd], norm_init());
        };
        let mlp_norms = |add: &mut dyn FnMut(String, Vec<usize>, Init), p: &str| {
            add(
                format!("{p}mlp.gate_proj.weight"),
                vec![self.intermediate, h],
                Init::Normal(0.02),
            );
            add(
                format!("{p}mlp.up_proj.weight"),
                vec![self.intermediate, h],
                Init::Normal(0.02),
            );
            add(
                format!("{p}mlp.down_proj.weight"),
                vec![h, self.intermediate],
                Init::Normal(0.02),
            );
            add(format!("{p}input_layernorm.weight"), vec![h], norm_init());
            add(
                format!("{p}post_attention_layernorm.weight"),
                vec![h],
                norm_init(),
            );
        };
        for i in 0..self.layers {
            let p = format!("model.layers.{i}.");
            if self.full_attention(i) {
                attention(&mut add, &p);
            } else if let Some((hk, hv, d)) = self.linear {
                let conv = 2 * hk * d + hv * d;
                let a = format!("{p}linear_attn.");
                add(
                    format!("{a}in_proj_qkv.weight"),
                    vec![conv, h],
                    Init::Normal(0.02),
                );
                add(
                    format!("{a}in_proj_z.weight"),
                    vec![hv * d, h],
                    Init::Normal(0.02),
                );
                add(
                    format!("{a}in_proj_b.weight"),
                    vec![hv, h],
                    Init::Normal(0.02),
                );
                add(
                    format!("{a}in_proj_a.weight"),
                    vec![hv, h],
                    Init::Normal(0.02),
                );
                add(
                    format!("{a}conv1d.weight"),
                    vec![conv, 1, 4],
                    Init::Normal(0.2),
                );
                add(format!("{a}A_log"), vec![hv], Init::LogUniform(1.0, 16.0));
                add(format!("{a}dt_bias"), vec![hv], Init::Const(1.0));
                add(format!("{a}norm.weight"), vec![d], Init::Const(1.0));
                add(
                    format!("{a}out_proj.weight"),
                    vec![h, hv * d],
                    Init::Normal(0.02),
                );
            }
            mlp_norms(&mut add, &p);
        }
        add("model.norm.weight".into(), vec![h], norm_init());
        if !self.tied {
            add(
                "lm_head.weight".into(),
                vec![self.vocab, h],
                Init::Normal(0.02),
            );
        }
        if self.mtp {
            add("mtp.fc.weight".into(), vec![h, 2 * h], Init::Normal(0.02));
            add(
                "mtp.pre_fc_norm_embedding.weight".into(),
                vec![h],
                Init::Const(0.0),
            );
            add(
                "mtp.pre_fc_norm_hidden.weight".into(),
                vec![h],
                Init::Const(0.0),
            );
            add("mtp.norm.weight".into(), vec![h], Init::Const(0.0));
            attention(&mut add, "mtp.layers.0.");
            mlp_norms(&mut add, "mtp.layers.0.");
        }
        v
    }

    pub fn parameter_count(&self) -> usize {
        self.tensors()
            .iter()
            .filter(|t| !t.name.starts_with("mtp."))
            .map(|t| t.shape.iter().product::<usize>())
            .sum()
    }

    pub fn config_json(&self) -> serde_json::Value {
        let mut c = serde_json::json!({
            "model_type": self.model_type,
            "architectures": [if self.is_hybrid() { "Qwen3_5ForCausalLM" } else { "Qwen3ForCausalLM" }],
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": self.tied,
            "attention_bias": false,
            "torch_dtype": "bfloat16",
            "eos_token_id": 1,
        });
        if let Some((hk, hv, d)) = self.linear {
            let types: Vec<&str> = (0..self.layers)
                .map(|i| {
                    if self.full_attention(i) {
                        "full_attention"
                    } else {
                        "linear_attention"
                    }
                })
                .collect();
            c["layer_types"] = serde_json::json!(types);
            c["linear_num_key_heads"] = hk.into();
            c["linear_num_value_heads"] = hv.into();
            c["linear_key_head_dim"] = d.into();
            c["linear_value_head_dim"] = d.into();
            c["linear_conv_kernel_dim"] = 4.into();
            c["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25});
            if self.mtp {
                c["mtp_num_hidden_layers"] = 1.into();
            }
        } else {
            c["rope_parameters"] =
                serde_json::json!({"rope_type": "default", "rope_theta": 1000000.0});
        }
        c
    }
}

/// SplitMix64: a tiny deterministic generator (no dependency, same stream on every machine).
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    /// Approximately normal: the sum of 4 uniforms, rescaled (Irwin–Hall) — cheap and enough for weights.
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * (3.0f32).sqrt()
    }
}

/// Writes `tensors` (bf16, drawn from `rng` in order) as one safetensors file at `path`.
fn write_safetensors(
    path: &Path,
    tensors: &[&TensorSpec],
    rng: &mut SplitMix,
) -> Result<(), SynthError> {
    let io = |source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for t in tensors {
        let bytes = t.shape.iter().product::<usize>() * 2;
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": t.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path).map_err(io)?);
    w.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&h).map_err(io)?;
    for t in tensors {
        let n: usize = t.shape.iter().product();
        for _ in 0..n {
            let x = match t.init {
                Init::Normal(std) => rng.normal() * std,
                Init::Const(c) => c,
                Init::LogUniform(lo, hi) => (lo + (hi - lo) * rng.uniform()).ln(),
            };
            w.write_all(&half::bf16::from_f32(x).to_le_bytes())
                .map_err(io)?;
        }
    }
    w.flush().map_err(io)
}

/// Writes the checkpoint to `dir` with shards of at most `shard_bytes`. Returns the file paths written.
pub fn write(
    shape: &Shape,
    dir: &Path,
    seed: u64,
    shard_bytes: usize,
) -> Result<Vec<PathBuf>, SynthError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthError::Io {
            path: path.clone(),
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tensors = shape.tensors();
    // Group tensors into shards by size.
    let mut shards: Vec<Vec<&TensorSpec>> = vec![Vec::new()];
    let mut size = 0;
    for t in &tensors {
        let bytes = t.shape.iter().product::<usize>() * 2;
        if size > 0 && size + bytes > shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        if let Some(last) = shards.last_mut() {
            last.push(t);
        }
    }
    let mut rng = SplitMix(seed);
    let mut written = Vec::new();
    let mut weight_map = serde_json::Map::new();
    let count = shards.len();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, count);
        let path = dir.join(&file);
        for t in shard {
            weight_map.insert(t.name.clone(), file.clone().into());
        }
        write_safetensors(&path, shard, &mut rng)?;
        written.push(path);
    }
    let index = serde_json::json!({"metadata": {"total_size": tensors.iter().map(|t| t.shape.iter().product::<usize>() * 2).sum::<usize>()}, "weight_map": weight_map});
    let ip = dir.join("model.safetensors.index.json");
    std::fs::write(&ip, index.to_string()).map_err(io(&ip))?;
    let cp = dir.join("config.json");
    let config = serde_json::to_string_pretty(&shape.config_json()).unwrap_or_default();
    std::fs::write(&cp, config).map_err(io(&cp))?;
    let gp = dir.join("generation_config.json");
    std::fs::write(&gp, r#"{"eos_token_id": 1}"#).map_err(io(&gp))?;
    written.extend([ip, cp, gp]);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_4b_matches_the_reference_parameter_count() {
        // Issue 5 quotes 3.96B parameters for the Qwen3.5-4B-like shape.
        let p = shape("qwen35-4b").unwrap().parameter_count() as f64 / 1e9;
        assert!((p - 3.96).abs() < 0.03, "{p}B");
        let p = shape("qwen35-100m").unwrap().parameter_count() as f64 / 1e6;
        assert!((80.0..130.0).contains(&p), "{p}M");
        let p = shape("qwen35-0.8b").unwrap().parameter_count() as f64 / 1e9;
        assert!((0.7..0.9).contains(&p), "{p}B");
        // Qwen3-0.6B: 0.596B parameters with tied embeddings (its model card's 0.6B).
        let p = shape("qwen3-0.6b").unwrap().parameter_count() as f64 / 1e9;
        assert!((0.59..0.61).contains(&p), "{p}B");
    }

    #[test]
    fn unknown_shape_names_the_known_ones() {
        let e = shape("nope").unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("qwen35-4b"), "{e}");
    }

    #[test]
    fn writes_sharded_checkpoint_with_index() {
        let dir = tempfile::tempdir().unwrap();
        let files = write(shape("tiny-hybrid").unwrap(), dir.path(), 7, 64 * 1024).unwrap();
        let shards = files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .count();
        assert!(shards >= 2, "{shards} shards");
        let index: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        assert!(index["weight_map"]["mtp.fc.weight"].is_string());
        // Same seed, same bytes.
        let dir2 = tempfile::tempdir().unwrap();
        write(shape("tiny-hybrid").unwrap(), dir2.path(), 7, 64 * 1024).unwrap();
        let a = std::fs::read(dir.path().join("model-00001-of-00002.safetensors")).ok();
        let b = std::fs::read(dir2.path().join("model-00001-of-00002.safetensors")).ok();
        assert_eq!(a, b);
    }
}
