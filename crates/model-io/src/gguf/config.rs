//! GGUF metadata -> the `config.json` the Hugging Face checkpoint had, parsed by [`ModelConfig`].
//!
//! Keys (gguf-py `constants.py` `Keys.LLM`, written by convert_hf_to_gguf.py): `{arch}.block_count`
//! (decoder layers plus `{arch}.nextn_predict_layers` MTP blocks), `.context_length`,
//! `.embedding_length`, `.feed_forward_length`, `.attention.head_count`, `.attention.head_count_kv`,
//! `.attention.key_length` (head_dim), `.attention.layer_norm_rms_epsilon`, `.rope.freq_base`,
//! `.rope.dimension_count` (rotary dims; qwen35: head_dim x partial_rotary_factor),
//! `.rope.scaling.type`; MoE (qwen35moe, qwen3next, qwen3moe): `.expert_count`, `.expert_used_count`,
//! `.expert_feed_forward_length`, `.expert_shared_feed_forward_length` (absent for qwen3moe: no shared
//! expert). qwen3moe records neither `norm_topk_prob` nor `decoder_sparse_step` / `mlp_only_layers`:
//! llama.cpp's qwen3moe graph puts the MoE block on every layer and always renormalises the top-k
//! weights (`build_moe_ffn(.., norm_w = true, ..)`), so its config says exactly that (a checkpoint
//! with dense layers does not convert; one with `norm_topk_prob: false` converts, and runs
//! renormalised in llama.cpp as here); GDN (qwen35*): `.ssm.conv_kernel`, `.ssm.state_size` (key head dim),
//! `.ssm.group_count` (key heads), `.ssm.time_step_rank` (value heads), `.ssm.inner_size` (value
//! heads x value head dim), `.attention.recurrent_layers` (per block) or `.full_attention_interval`.
//! The vocabulary size is the embedding's row count; the head is tied when `output.weight` is
//! absent; stop tokens are `tokenizer.ggml.eos_token_id` (and `eot_token_id`).
//!
//! Algorithm: build the JSON object transformers would have saved and hand it to
//! [`ModelConfig::from_json_str`], so GGUF and safetensors models pass the same validation.
//!
//! Invariant: a missing or mistyped key is an error naming the GGUF file and the key.

use serde_json::{json, Map, Value};

use super::names::{Arch, Layout};
use super::{GgufSet, MetaValue};
use crate::LoadError;

/// The synthesized config.json text and the tensor-name layout of `set`.
pub fn hf_config(set: &GgufSet) -> Result<(String, Layout), LoadError> {
    let keys = Keys { set };
    let arch_name = keys.string("general.architecture")?;
    let arch = Arch::from_name(&arch_name).ok_or_else(|| LoadError::UnknownArchitecture {
        path: set.path().to_path_buf(),
        architecture: arch_name.clone(),
        supported: "qwen3, qwen3moe, qwen35, qwen35moe, qwen3next (GGUF `general.architecture`)",
    })?;
    let k = |s: &str| format!("{arch_name}.{s}");
    let blocks = keys.usize(&k("block_count"))?;
    // Every block has tensors: a larger count is corrupt, and would size allocations below.
    let n_tensors = set.tensors().count();
    if blocks > n_tensors {
        return Err(keys.invalid(
            &k("block_count"),
            format!("{blocks} blocks but the file holds only {n_tensors} tensors"),
        ));
    }
    let nextn = keys.opt_usize(&k("nextn_predict_layers"))?.unwrap_or(0);
    let n_layer = blocks.checked_sub(nextn).ok_or_else(|| {
        keys.invalid(
            &k("nextn_predict_layers"),
            format!("{nextn} MTP layers exceed block_count {blocks}"),
        )
    })?;
    let (_, embd) = set
        .tensor("token_embd.weight")
        .ok_or_else(|| LoadError::MissingTensor {
            path: set.path().to_path_buf(),
            tensor: "token_embd.weight".into(),
        })?;
    let vocab = embd.shape().first().copied().unwrap_or(0);
    let heads = keys.usize(&k("attention.head_count"))?;
    let hidden = keys.usize(&k("embedding_length"))?;
    let head_dim = match keys.opt_usize(&k("attention.key_length"))? {
        Some(d) => d,
        None => hidden / heads.max(1),
    };
    let mut c = Map::new();
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(hidden));
    // Dense MLP width; MoE models may have none (config.json requires it where the MLP is dense).
    if let Some(width) = keys.opt_usize(&k("feed_forward_length"))? {
        c.insert("intermediate_size".into(), json!(width));
    }
    c.insert("num_hidden_layers".into(), json!(n_layer));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert(
        "num_key_value_heads".into(),
        json!(keys
            .opt_usize(&k("attention.head_count_kv"))?
            .unwrap_or(heads)),
    );
    c.insert("head_dim".into(), json!(head_dim));
    c.insert(
        "rms_norm_eps".into(),
        json!(keys.f64(&k("attention.layer_norm_rms_epsilon"))?),
    );
    c.insert(
        "max_position_embeddings".into(),
        json!(keys.usize(&k("context_length"))?),
    );
    c.insert(
        "tie_word_embeddings".into(),
        json!(set.tensor("output.weight").is_none()),
    );
    c.insert(
        "attention_bias".into(),
        json!(set.tensor("blk.0.attn_q.bias").is_some()),
    );
    let mut rope = Map::new();
    rope.insert(
        "rope_theta".into(),
        json!(keys.opt_f64(&k("rope.freq_base"))?.unwrap_or(10_000.0)),
    );
    let scaling = keys.opt_string(&k("rope.scaling.type"))?;
    let rope_type = match scaling.as_deref() {
        None | Some("none") => "default".to_string(),
        Some(other) => other.to_string(),
    };
    rope.insert("rope_type".into(), json!(rope_type));
    let eos = eos_ids(&keys)?;
    if !eos.is_empty() {
        c.insert("eos_token_id".into(), json!(eos));
    }
    let mut gdn = None;
    match arch {
        Arch::Qwen3 => {
            c.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
            c.insert("model_type".into(), json!("qwen3"));
        }
        Arch::Qwen3Moe => {
            c.insert("architectures".into(), json!(["Qwen3MoeForCausalLM"]));
            c.insert("model_type".into(), json!("qwen3_moe"));
            moe_keys(&keys, &arch_name, &mut c)?;
            c.insert("norm_topk_prob".into(), json!(true));
            c.insert("decoder_sparse_step".into(), json!(1));
            c.insert("mlp_only_layers".into(), json!([]));
        }
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => {
            if arch != Arch::Qwen35 {
                let (class, model_type) = match arch {
                    Arch::Qwen3Next => ("Qwen3NextForCausalLM", "qwen3_next"),
                    _ => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
                };
                c.insert("architectures".into(), json!([class]));
                c.insert("model_type".into(), json!(model_type));
                moe_keys(&keys, &arch_name, &mut c)?;
                let shared = keys.opt_usize(&k("expert_shared_feed_forward_length"))?;
                c.insert(
                    "shared_expert_intermediate_size".into(),
                    json!(shared.unwrap_or(0)),
                );
            } else {
                c.insert("architectures".into(), json!(["Qwen3_5ForCausalLM"]));
                c.insert("model_type".into(), json!("qwen3_5_text"));
            }
            let key_heads = keys.usize(&k("ssm.group_count"))?;
            let value_heads = keys.usize(&k("ssm.time_step_rank"))?;
            let key_dim = keys.usize(&k("ssm.state_size"))?;
            let inner = keys.usize(&k("ssm.inner_size"))?;
            if value_heads == 0 || !inner.is_multiple_of(value_heads) {
                return Err(keys.invalid(
                    &k("ssm.inner_size"),
                    format!("{inner} is not a multiple of ssm.time_step_rank {value_heads}"),
                ));
            }
            let value_dim = inner / value_heads;
            gdn = Some((key_heads, value_heads, key_dim, value_dim));
            c.insert(
                "linear_conv_kernel_dim".into(),
                json!(keys.usize(&k("ssm.conv_kernel"))?),
            );
            c.insert("linear_key_head_dim".into(), json!(key_dim));
            c.insert("linear_num_key_heads".into(), json!(key_heads));
            c.insert("linear_num_value_heads".into(), json!(value_heads));
            c.insert("linear_value_head_dim".into(), json!(value_dim));
            c.insert("mtp_num_hidden_layers".into(), json!(nextn));
            c.insert(
                "layer_types".into(),
                json!(layer_types(&keys, &arch_name, n_layer)?),
            );
            let rotary = keys
                .opt_usize(&k("rope.dimension_count"))?
                .unwrap_or(head_dim / 4);
            rope.insert(
                "partial_rotary_factor".into(),
                json!(rotary as f64 / head_dim.max(1) as f64),
            );
        }
    }
    c.insert("rope_parameters".into(), Value::Object(rope));
    let layout = Layout {
        arch,
        n_layer,
        nextn_layers: nextn,
        gdn,
    };
    Ok((Value::Object(c).to_string(), layout))
}

/// `num_experts`, `num_experts_per_tok`, `moe_intermediate_size` from `{arch}.expert_*`.
fn moe_keys(keys: &Keys<'_>, arch: &str, c: &mut Map<String, Value>) -> Result<(), LoadError> {
    let k = |s: &str| format!("{arch}.{s}");
    c.insert("num_experts".into(), json!(keys.usize(&k("expert_count"))?));
    let used = keys.usize(&k("expert_used_count"))?;
    c.insert("num_experts_per_tok".into(), json!(used));
    let width = keys.usize(&k("expert_feed_forward_length"))?;
    c.insert("moe_intermediate_size".into(), json!(width));
    Ok(())
}

/// `linear_attention` / `full_attention` per decoder layer: `attention.recurrent_layers` if present,
/// else every `full_attention_interval`-th layer is full attention.
fn layer_types(
    keys: &Keys<'_>,
    arch: &str,
    n_layer: usize,
) -> Result<Vec<&'static str>, LoadError> {
    let kind = |recurrent: bool| {
        if recurrent {
            "linear_attention"
        } else {
            "full_attention"
        }
    };
    let key = format!("{arch}.attention.recurrent_layers");
    if let Some(v) = keys.set.get(&key) {
        let flags = v.as_array().filter(|a| a.len() >= n_layer).ok_or_else(|| {
            keys.invalid(
                &key,
                format!("should be an array of at least {n_layer} bools"),
            )
        })?;
        return flags[..n_layer]
            .iter()
            .map(|f| {
                f.as_bool()
                    .map(kind)
                    .ok_or_else(|| keys.invalid(&key, "holds a non-bool".into()))
            })
            .collect();
    }
    let key = format!("{arch}.full_attention_interval");
    let interval = keys.opt_usize(&key)?.unwrap_or(4);
    if interval == 0 {
        return Err(keys.invalid(&key, "must be positive".into()));
    }
    Ok((0..n_layer)
        .map(|i| kind((i + 1) % interval != 0))
        .collect())
}

fn eos_ids(keys: &Keys<'_>) -> Result<Vec<u32>, LoadError> {
    let mut ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = keys.opt_usize(key)? {
            let id = u32::try_from(id)
                .map_err(|_| keys.invalid(key, format!("{id} is not a token id")))?;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// Typed metadata look-ups whose errors name the file and key.
pub(crate) struct Keys<'a> {
    pub set: &'a GgufSet,
}

impl Keys<'_> {
    pub fn invalid(&self, key: &str, reason: String) -> LoadError {
        LoadError::InvalidValue {
            path: self.set.path().to_path_buf(),
            field: key.to_string(),
            reason,
        }
    }

    fn wrong(&self, key: &str, expected: &'static str, found: &MetaValue) -> LoadError {
        LoadError::WrongType {
            path: self.set.path().to_path_buf(),
            field: key.to_string(),
            expected,
            found: found.type_name().to_string(),
        }
    }

    fn missing(&self, key: &str) -> LoadError {
        LoadError::MissingField {
            path: self.set.path().to_path_buf(),
            field: key.to_string(),
        }
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, LoadError> {
        match self.set.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a non-negative integer", v)),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize, LoadError> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, LoadError> {
        match self.set.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    pub fn f64(&self, key: &str) -> Result<f64, LoadError> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_string(&self, key: &str) -> Result<Option<String>, LoadError> {
        match self.set.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| self.wrong(key, "a string", v)),
        }
    }

    pub fn string(&self, key: &str) -> Result<String, LoadError> {
        self.opt_string(key)?.ok_or_else(|| self.missing(key))
    }
}
