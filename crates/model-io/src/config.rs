//! `config.json` -> [`ModelConfig`], following transformers 5.17's config classes field by field.
//!
//! Algorithm: pick the architecture (`architectures[0]`, else `model_type`), refuse unknown ones by
//! name; find the text config (top level, or `text_config` for the `*ForConditionalGeneration`
//! composites); read each field with the default of the transformers class when it is absent or
//! null; derive `layer_types` (`full_attention_interval` rule), RoPE settings (`rope_parameters`,
//! legacy `rope_scaling`, top-level `rope_theta` / `partial_rotary_factor`) and the MoE block; then
//! validate the values the families divide or index by.
//!
//! Invariant: a returned `ModelConfig` has non-zero sizes, `num_attention_heads` divisible by
//! `num_key_value_heads`, `layer_types.len() == num_hidden_layers`, an even non-zero `rotary_dim()`,
//! `linear` present iff some layer is linear attention, and `moe` with `decoder_sparse_step > 0` and
//! `1 <= num_experts_per_tok <= num_experts`.
//!
//! One deliberate departure from transformers: `vocab_size`, `hidden_size`, `num_hidden_layers`,
//! `num_attention_heads` (and `intermediate_size` for dense-MLP models, and for Qwen3-MoE models with a
//! dense layer) are required. Their class
//! defaults describe some other model (Qwen3-8B-like); `save_pretrained` always writes them, so a
//! config without them is broken and naming the field beats a tensor-shape error later.

use std::path::Path;

use serde_json::{Map, Value};

use crate::json::{read_object, Fields};
use crate::LoadError;

mod moe;

use moe::read_moe;
pub use moe::MoeConfig;

/// The largest `max_position_embeddings` accepted: 2^24 positions, 16x Qwen's longest context.
pub const MAX_POSITIONS: usize = 1 << 24;

/// The model family: decides which decoder layers and tensor names apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Qwen3 dense: every layer full attention (q_norm/k_norm), dense SwiGLU MLP.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention and norms, sparse MoE MLP (no shared expert) on the layers
    /// `MoeConfig::is_moe_layer` selects, dense SwiGLU on the others.
    Qwen3Moe,
    /// Qwen3.5 (and Qwen3.5-MoE, with `moe` set): hybrid GDN / gated full attention.
    Qwen35,
    /// Qwen3-Next: hybrid GDN (fused `in_proj_qkvz`/`in_proj_ba`) / gated attention, MoE MLP.
    Qwen3Next,
}

impl Family {
    /// RMSNorms are `x̂·(1+w)` with zero-centred stored weights (Qwen3.5, Qwen3-Next); `x̂·w` otherwise.
    pub fn zero_centred_norms(self) -> bool {
        matches!(self, Family::Qwen35 | Family::Qwen3Next)
    }

    /// Qwen3's attention: full RoPE over the whole head, no output gate.
    fn qwen3_attention(self) -> bool {
        matches!(self, Family::Qwen3 | Family::Qwen3Moe)
    }
}

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    FullAttention,
    /// Gated DeltaNet.
    LinearAttention,
}

/// Gated DeltaNet sizes (`linear_*` fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearAttentionConfig {
    pub num_key_heads: usize,
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
}

/// Everything the families need from `config.json`, with transformers' defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `architectures[0]` (or the architecture implied by `model_type`).
    pub architecture: String,
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense MLP width. 0 for Qwen3.5-MoE, whose config has no dense MLP (every layer is MoE).
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// Fraction of `head_dim` that RoPE rotates (1.0 for Qwen3, whose RoPE ignores the field).
    pub partial_rotary_factor: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// q_proj emits `[q, gate]` per head (Qwen3.5 / Qwen3-Next full attention).
    pub attn_output_gate: bool,
    /// `len == num_hidden_layers`; all `FullAttention` for Qwen3.
    pub layer_types: Vec<LayerKind>,
    pub linear: Option<LinearAttentionConfig>,
    pub moe: Option<MoeConfig>,
    /// 0 when absent.
    pub mtp_num_hidden_layers: usize,
    /// `"model."`, or `"model.language_model."` for the `*ForConditionalGeneration` layout.
    pub tensor_prefix: String,
    /// `eos_token_id` of config.json (int or list), may be empty.
    pub eos_token_ids: Vec<u32>,
}

/// How an architecture lays out its config and tensors.
pub(super) struct ArchSpec {
    architecture: &'static str,
    model_type: &'static str,
    /// `model_type` of the text sub-config (equal to `model_type` when there is no sub-config).
    text_model_type: &'static str,
    pub(super) family: Family,
    moe: bool,
    composite: bool,
}

const ARCHS: &[ArchSpec] = &[
    ArchSpec {
        architecture: "Qwen3ForCausalLM",
        model_type: "qwen3",
        text_model_type: "qwen3",
        family: Family::Qwen3,
        moe: false,
        composite: false,
    },
    ArchSpec {
        architecture: "Qwen3MoeForCausalLM",
        model_type: "qwen3_moe",
        text_model_type: "qwen3_moe",
        family: Family::Qwen3Moe,
        moe: true,
        composite: false,
    },
    ArchSpec {
        architecture: "Qwen3_5ForCausalLM",
        model_type: "qwen3_5_text",
        text_model_type: "qwen3_5_text",
        family: Family::Qwen35,
        moe: false,
        composite: false,
    },
    ArchSpec {
        architecture: "Qwen3_5ForConditionalGeneration",
        model_type: "qwen3_5",
        text_model_type: "qwen3_5_text",
        family: Family::Qwen35,
        moe: false,
        composite: true,
    },
    ArchSpec {
        architecture: "Qwen3_5MoeForCausalLM",
        model_type: "qwen3_5_moe_text",
        text_model_type: "qwen3_5_moe_text",
        family: Family::Qwen35,
        moe: true,
        composite: false,
    },
    ArchSpec {
        architecture: "Qwen3_5MoeForConditionalGeneration",
        model_type: "qwen3_5_moe",
        text_model_type: "qwen3_5_moe_text",
        family: Family::Qwen35,
        moe: true,
        composite: true,
    },
    ArchSpec {
        architecture: "Qwen3NextForCausalLM",
        model_type: "qwen3_next",
        text_model_type: "qwen3_next",
        family: Family::Qwen3Next,
        moe: true,
        composite: false,
    },
];

const SUPPORTED: &str = "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, \
                         Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3NextForCausalLM";

/// Class defaults of the transformers config classes (configuration_qwen3*.py, v5.17).
struct Defaults {
    num_key_value_heads: usize,
    head_dim: usize,
    partial_rotary_factor: f64,
}

/// `hidden_size` and `num_attention_heads` are validated positive before this is called.
fn defaults(spec: &ArchSpec, hidden_size: usize, num_attention_heads: usize) -> Defaults {
    match (spec.family, spec.moe) {
        (Family::Qwen3, _) => Defaults {
            num_key_value_heads: 32,
            head_dim: 128,
            partial_rotary_factor: 1.0,
        },
        // Qwen3MoeConfig has no head_dim field: the attention takes hidden_size // num_attention_heads.
        (Family::Qwen3Moe, _) => Defaults {
            num_key_value_heads: 4,
            head_dim: hidden_size / num_attention_heads,
            partial_rotary_factor: 1.0,
        },
        (Family::Qwen35, false) => Defaults {
            num_key_value_heads: 4,
            head_dim: 256,
            partial_rotary_factor: 0.25,
        },
        (Family::Qwen35, true) | (Family::Qwen3Next, _) => Defaults {
            num_key_value_heads: 2,
            head_dim: 256,
            partial_rotary_factor: 0.25,
        },
    }
}

impl ModelConfig {
    /// Reads and validates `path` (a checkpoint's config.json).
    pub fn from_json_file(path: &Path) -> Result<Self, LoadError> {
        let root = read_object(path, "config.json of the checkpoint")?;
        Self::from_object(path, &root)
    }

    /// Parses config.json text; `path` is only used to name the file in errors.
    pub fn from_json_str(json: &str, path: &Path) -> Result<Self, LoadError> {
        match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(root)) => Self::from_object(path, &root),
            Ok(other) => Err(LoadError::Json {
                path: path.to_path_buf(),
                reason: format!(
                    "top level should be an object, found {}",
                    crate::json::type_name(&other)
                ),
            }),
            Err(e) => Err(LoadError::Json {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        }
    }

    /// Number of leading dims of each head that RoPE rotates: `int(head_dim * partial_rotary_factor)`.
    pub fn rotary_dim(&self) -> usize {
        rotary_dim(self.head_dim, self.partial_rotary_factor as f64)
    }

    /// Whether `layer` has a sparse MoE block (false when the model has no MoE).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_moe_layer(layer))
    }

    /// Query heads per key/value head (0 only for a hand-built config with no KV heads).
    pub fn gqa_group_size(&self) -> usize {
        self.num_attention_heads
            .checked_div(self.num_key_value_heads)
            .unwrap_or(0)
    }

    fn from_object(path: &Path, root: &Map<String, Value>) -> Result<Self, LoadError> {
        let top = Fields::new(path, root, "");
        let spec = resolve_architecture(&top)?;
        let text_object = if spec.composite {
            top.opt_object("text_config")?
                .ok_or_else(|| top.missing("text_config"))?
        } else {
            root
        };
        let prefix = if spec.composite { "text_config." } else { "" };
        let text = Fields::new(path, text_object, prefix);
        if spec.composite {
            if let Some(mt) = text.opt_str("model_type")? {
                if mt != spec.text_model_type {
                    return Err(text.invalid(
                        "model_type",
                        format!("`{mt}` does not match `{}`", spec.text_model_type),
                    ));
                }
            }
        }

        let vocab_size = positive(&text, "vocab_size", text.usize_required("vocab_size")?)?;
        let hidden_size = positive(&text, "hidden_size", text.usize_required("hidden_size")?)?;
        let num_hidden_layers = positive(
            &text,
            "num_hidden_layers",
            text.usize_required("num_hidden_layers")?,
        )?;
        let num_attention_heads = positive(
            &text,
            "num_attention_heads",
            text.usize_required("num_attention_heads")?,
        )?;
        let d = defaults(spec, hidden_size, num_attention_heads);
        // Qwen3_5Moe has no dense MLP; everything else needs its width.
        let intermediate_size = if spec.family == Family::Qwen35 && spec.moe {
            text.usize_or("intermediate_size", 0)?
        } else if spec.family == Family::Qwen3Next {
            text.usize_or("intermediate_size", 5632)?
        } else if spec.family == Family::Qwen3Moe {
            // Only its dense layers use it: required below when there are any.
            text.usize_or("intermediate_size", 6144)?
        } else {
            positive(
                &text,
                "intermediate_size",
                text.usize_required("intermediate_size")?,
            )?
        };
        let num_key_value_heads = match text_object.get("num_key_value_heads") {
            // Qwen3Config.__post_init__: an explicit None means "as many as attention heads".
            Some(Value::Null) if spec.family == Family::Qwen3 => num_attention_heads,
            _ => text.usize_or("num_key_value_heads", d.num_key_value_heads)?,
        };
        let num_key_value_heads = positive(&text, "num_key_value_heads", num_key_value_heads)?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(text.invalid(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads = {num_attention_heads}"),
            ));
        }
        let head_dim = positive(&text, "head_dim", text.usize_or("head_dim", d.head_dim)?)?;
        let rms_norm_eps = positive_f32(
            &text,
            "rms_norm_eps",
            text.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        )?;
        let max_position_embeddings = text.usize_or("max_position_embeddings", 32768)?;
        // Positions index caches and RoPE tables; Qwen's largest releases use 262144 (1M with YaRN).
        if !(1..=MAX_POSITIONS).contains(&max_position_embeddings) {
            return Err(text.invalid(
                "max_position_embeddings",
                format!("{max_position_embeddings} is outside 1..={MAX_POSITIONS}"),
            ));
        }
        // transformers reads tie_word_embeddings from the model's own (top-level) config.
        let tie_word_embeddings = top.bool_or("tie_word_embeddings", false)?;
        let attention_bias = text.bool_or("attention_bias", false)?;

        let rope = read_rope(&text, spec, &d)?;
        let layer_types = read_layer_types(&text, spec, num_hidden_layers)?;
        let linear = if layer_types.contains(&LayerKind::LinearAttention) {
            Some(read_linear(&text)?)
        } else {
            None
        };
        let moe = if spec.moe {
            read_moe(&text, spec)?
        } else {
            None
        };
        let dense_layer =
            (0..num_hidden_layers).any(|i| !moe.as_ref().is_some_and(|m| m.is_moe_layer(i)));
        if spec.family == Family::Qwen3Moe && dense_layer {
            // Its dense MLP layers need their width: required, as for a dense model (module doc).
            positive(
                &text,
                "intermediate_size",
                text.usize_required("intermediate_size")?,
            )?;
        }
        let mtp_num_hidden_layers = match text.opt_usize("mtp_num_hidden_layers")? {
            Some(n) => n,
            None => top.usize_or("mtp_num_hidden_layers", 0)?,
        };

        let mut eos_token_ids = text.token_ids("eos_token_id")?;
        if spec.composite {
            for id in top.token_ids("eos_token_id")? {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }

        Ok(ModelConfig {
            architecture: spec.architecture.to_string(),
            family: spec.family,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta: rope.theta,
            partial_rotary_factor: rope.partial_rotary_factor,
            max_position_embeddings,
            tie_word_embeddings,
            attention_bias,
            attn_output_gate: !spec.family.qwen3_attention(),
            layer_types,
            linear,
            moe,
            mtp_num_hidden_layers,
            tensor_prefix: if spec.composite {
                "model.language_model.".to_string()
            } else {
                "model.".to_string()
            },
            eos_token_ids,
        })
    }
}

fn rotary_dim(head_dim: usize, factor: f64) -> usize {
    // Python's int() truncates toward zero; factor is validated to lie in (0, 1].
    (head_dim as f64 * factor) as usize
}

/// `architectures[0]` if present, else `model_type`; both must agree when both are given.
fn resolve_architecture(top: &Fields<'_>) -> Result<&'static ArchSpec, LoadError> {
    let model_type = top.opt_str("model_type")?;
    let architectures = top.opt_str_list("architectures")?.unwrap_or_default();
    let unknown = |name: &str| LoadError::UnknownArchitecture {
        path: top.path_buf(),
        architecture: name.to_string(),
        supported: SUPPORTED,
    };
    let spec = match (architectures.first(), model_type) {
        (Some(arch), _) => ARCHS
            .iter()
            .find(|s| s.architecture == *arch)
            .ok_or_else(|| unknown(arch))?,
        (None, Some(mt)) => ARCHS
            .iter()
            .find(|s| s.model_type == mt)
            .ok_or_else(|| unknown(&format!("model_type {mt}")))?,
        (None, None) => return Err(top.missing("architectures")),
    };
    if let Some(mt) = model_type {
        // A text-only model_type under a composite architecture (or the reverse) is still the same
        // family; a different family means the file was edited inconsistently.
        let same_family = ARCHS
            .iter()
            .any(|s| s.model_type == mt && s.family == spec.family && s.moe == spec.moe);
        if !same_family {
            return Err(top.invalid(
                "model_type",
                format!("`{mt}` does not match architecture `{}`", spec.architecture),
            ));
        }
    }
    Ok(spec)
}

pub(super) fn positive(f: &Fields<'_>, field: &str, value: usize) -> Result<usize, LoadError> {
    if value == 0 {
        return Err(f.invalid(field, "must be positive, found 0"));
    }
    Ok(value)
}

fn positive_f32(f: &Fields<'_>, field: &str, value: f64) -> Result<f32, LoadError> {
    if !(value.is_finite() && value > 0.0 && value <= f32::MAX as f64) {
        return Err(f.invalid(
            field,
            format!("must be a positive finite number, found {value}"),
        ));
    }
    Ok(value as f32)
}

struct Rope {
    theta: f32,
    partial_rotary_factor: f32,
}

/// transformers' `convert_rope_params_to_dict` + `standardize_rope_params` priority:
/// `rope_parameters` (or legacy `rope_scaling`) entries, then top-level `rope_theta` /
/// `partial_rotary_factor`, then the defaults (theta 10000, factor per class).
fn read_rope(text: &Fields<'_>, spec: &ArchSpec, d: &Defaults) -> Result<Rope, LoadError> {
    let (params_field, params) = match text.opt_object("rope_parameters")? {
        Some(p) => ("rope_parameters", Some(p)),
        None => ("rope_scaling", text.opt_object("rope_scaling")?),
    };
    let empty = Map::new();
    let mut params_name = text.name(params_field);
    let mut params = params.unwrap_or(&empty);
    // Per-layer-type form ({"full_attention": {...}, ...}): only full-attention layers use RoPE.
    if let Some(v) = params.get("full_attention") {
        params_name = format!("{params_name}.full_attention");
        params = v.as_object().ok_or_else(|| LoadError::WrongType {
            path: text.path_buf(),
            field: params_name.clone(),
            expected: "an object",
            found: crate::json::type_name(v),
        })?;
    }
    // Sub-field names are reported as `rope_parameters.rope_theta`, etc.
    let prefix = format!("{params_name}.");
    let p = Fields::new(text.path, params, &prefix);

    let rope_type = match p.opt_str("rope_type")? {
        Some(t) => Some(("rope_type", t)),
        None => p.opt_str("type")?.map(|t| ("type", t)),
    };
    if let Some((field, t)) = rope_type {
        // Qwen3.5's mrope with text-only positions (three equal rows) is plain RoPE: "default".
        if t != "default" {
            return Err(p.unsupported(
                field,
                format!("RoPE type `{t}` (only `default` is implemented)"),
            ));
        }
    }
    let theta = match p.opt_f64("rope_theta")? {
        Some(t) => (p, "rope_theta", t),
        None => (
            *text,
            "rope_theta",
            text.opt_f64("rope_theta")?.unwrap_or(10_000.0),
        ),
    };
    let theta = positive_f32(&theta.0, theta.1, theta.2)?;

    let (factor_fields, factor) = match p.opt_f64("partial_rotary_factor")? {
        Some(f) => (p, f),
        None => (
            *text,
            text.opt_f64("partial_rotary_factor")?
                .unwrap_or(d.partial_rotary_factor),
        ),
    };
    // Qwen3's (and Qwen3-MoE's) compute_default_rope_parameters rotates the whole head whatever the
    // config says.
    let factor = if spec.family.qwen3_attention() {
        1.0
    } else {
        factor
    };
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(factor_fields.invalid(
            "partial_rotary_factor",
            format!("must lie in (0, 1], found {factor}"),
        ));
    }
    let head_dim = text.usize_or("head_dim", d.head_dim)?;
    let dim = rotary_dim(head_dim, factor);
    if dim == 0 || !dim.is_multiple_of(2) {
        return Err(factor_fields.invalid(
            "partial_rotary_factor",
            format!("head_dim {head_dim} x {factor} gives rotary dim {dim}; it must be even and positive"),
        ));
    }
    Ok(Rope {
        theta,
        partial_rotary_factor: factor as f32,
    })
}

fn read_layer_types(
    text: &Fields<'_>,
    spec: &ArchSpec,
    num_hidden_layers: usize,
) -> Result<Vec<LayerKind>, LoadError> {
    match spec.family {
        Family::Qwen3 => return qwen3_layer_types(text, num_hidden_layers),
        Family::Qwen3Moe => return qwen3_moe_layer_types(text, num_hidden_layers),
        Family::Qwen35 | Family::Qwen3Next => {}
    }
    let kinds = match text.opt_str_list("layer_types")? {
        Some(names) => names
            .iter()
            .map(|name| match *name {
                // remap_legacy_layer_types: "attention" / "mamba" / "conv" are old spellings.
                "full_attention" | "attention" => Ok(LayerKind::FullAttention),
                "linear_attention" | "mamba" | "conv" => Ok(LayerKind::LinearAttention),
                other => Err(text.unsupported("layer_types", format!("layer type `{other}`"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => {
            let interval = text.usize_or("full_attention_interval", 4)?;
            let interval = positive(text, "full_attention_interval", interval)?;
            (0..num_hidden_layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        LayerKind::FullAttention
                    } else {
                        LayerKind::LinearAttention
                    }
                })
                .collect()
        }
    };
    if kinds.len() != num_hidden_layers {
        return Err(text.invalid(
            "layer_types",
            format!(
                "has {} entries but num_hidden_layers is {num_hidden_layers}",
                kinds.len()
            ),
        ));
    }
    Ok(kinds)
}

/// Qwen3Config: a layer slides iff it is `sliding_attention` and the model uses a sliding window
/// (`use_sliding_window` and a non-null `sliding_window`); by default layers from
/// `max_window_layers` on are sliding. Sliding windows are not implemented, so such a layer is an
/// error rather than a silently different model.
fn qwen3_layer_types(
    text: &Fields<'_>,
    num_hidden_layers: usize,
) -> Result<Vec<LayerKind>, LoadError> {
    let use_sliding_window = text.bool_or("use_sliding_window", false)?;
    let has_window = use_sliding_window
        && match text.object.get("sliding_window") {
            None => true, // class default 4096
            Some(Value::Null) => false,
            Some(_) => text.opt_usize("sliding_window")?.is_some(),
        };
    let max_window_layers = text.usize_or("max_window_layers", 28)?;
    let names: Vec<String> = match text.opt_str_list("layer_types")? {
        Some(list) => list.iter().map(|s| s.to_string()).collect(),
        None => (0..num_hidden_layers)
            .map(|i| {
                if has_window && i >= max_window_layers {
                    "sliding_attention".to_string()
                } else {
                    "full_attention".to_string()
                }
            })
            .collect(),
    };
    if names.len() != num_hidden_layers {
        return Err(text.invalid(
            "layer_types",
            format!(
                "has {} entries but num_hidden_layers is {num_hidden_layers}",
                names.len()
            ),
        ));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| match name.as_str() {
            "full_attention" => Ok(LayerKind::FullAttention),
            "sliding_attention" if !has_window => Ok(LayerKind::FullAttention),
            "sliding_attention" => Err(text.unsupported(
                "use_sliding_window",
                format!("layer {i} uses sliding-window attention, which is not implemented"),
            )),
            other => Err(text.unsupported("layer_types", format!("layer type `{other}`"))),
        })
        .collect()
}

/// Qwen3MoeConfig: no `layer_types`; with `use_sliding_window` and a non-null `sliding_window`
/// (class default 4096) every layer slides, which is not implemented.
fn qwen3_moe_layer_types(
    text: &Fields<'_>,
    num_hidden_layers: usize,
) -> Result<Vec<LayerKind>, LoadError> {
    if text.bool_or("use_sliding_window", false)? {
        let window = match text.object.get("sliding_window") {
            None => Some(4096),
            Some(Value::Null) => None,
            Some(_) => text.opt_usize("sliding_window")?,
        };
        if let Some(window) = window {
            return Err(text.unsupported(
                "use_sliding_window",
                format!(
                    "sliding-window attention (window {window}) on every layer is not implemented"
                ),
            ));
        }
    }
    Ok(vec![LayerKind::FullAttention; num_hidden_layers])
}

fn read_linear(text: &Fields<'_>) -> Result<LinearAttentionConfig, LoadError> {
    let get = |field: &str, default: usize| -> Result<usize, LoadError> {
        positive(text, field, text.usize_or(field, default)?)
    };
    let linear = LinearAttentionConfig {
        num_key_heads: get("linear_num_key_heads", 16)?,
        num_value_heads: get("linear_num_value_heads", 32)?,
        key_head_dim: get("linear_key_head_dim", 128)?,
        value_head_dim: get("linear_value_head_dim", 128)?,
        conv_kernel: get("linear_conv_kernel_dim", 4)?,
    };
    if !linear.num_value_heads.is_multiple_of(linear.num_key_heads) {
        return Err(text.invalid(
            "linear_num_value_heads",
            format!(
                "{} is not a multiple of linear_num_key_heads = {}",
                linear.num_value_heads, linear.num_key_heads
            ),
        ));
    }
    Ok(linear)
}
