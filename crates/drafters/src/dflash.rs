//! The DFlash block drafter (z-lab's `DFlashDraftModel`): one forward over a block proposes a whole run of
//! tokens.
//!
//! Context: for every committed target row j, the outputs of target layers `target_layer_ids` (our
//! `Tap::LayerOutput(i)`, HF `hidden_states[i + 1]`) are concatenated, projected by `fc` (no bias) and
//! normed by `hidden_norm`: c_j = hidden_norm(fc([h_{l1}(j); h_{l2}(j); …])). Each drafter layer turns c_j
//! into its own key/value (k_norm(k_proj(c_j)) rotated at position j, v_proj(c_j)); those rows are the
//! layer's context cache. The context features skip the layers' input norms and are never updated by
//! the block.
//!
//! Block: with the last committed token x_p (the anchor, not yet run by the target) at position p, the
//! block is [x_p, mask × (B−1)] at positions p..p+B, embedded with the *target's* `embed_tokens`. Every
//! layer is a Qwen3 decoder layer (plain RMSNorm `x̂·w`, q/k norm, full rotate-half RoPE, SwiGLU MLP)
//! whose queries are the block rows and whose keys/values are [context rows 0..p ; block rows], with no
//! causal mask inside the block. `norm` then the *target's* LM head give logits; block row i (i ≥ 1)
//! proposes token p+i.
//!
//! Invariant: the context caches hold exactly rows `0..position()`, all verified (fed by `observe`);
//! `propose` appends the block's keys/values only for the duration of one layer's attention and removes
//! them before returning, so nothing speculative survives a call.

use crate::{Chooser, Drafter};
use families::layers::ffn::Mlp;
use families::layers::{Linear, Norm, Tensors};
use families::{BackendError, ModelError, SharedHead, Tap};
use model_io::{LoadError, TensorStore};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The fields of a DFlash drafter's `config.json` this runtime reads (z-lab's names; the `dflash_config`
/// sub-object wins over a top-level field of the same name, as in z-lab's `_draft_value`).
#[derive(Clone, Debug, PartialEq)]
pub struct DflashConfig {
    /// Rows per block: the anchor plus `block_size - 1` mask rows (default 16).
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target layers whose outputs form the context features, in concatenation order.
    pub target_layer_ids: Vec<usize>,
    /// Layers of the target the drafter was trained against, when the config says.
    pub num_target_layers: Option<usize>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// Block embeddings are the target's embeddings times this (default 1).
    pub input_embedding_scale: f32,
    /// Logits are multiplied by this (default 1) …
    pub output_multiplier: f32,
    /// … then soft-capped `c·tanh(l/c)` when set and positive.
    pub final_logit_softcapping: Option<f32>,
}

impl DflashConfig {
    /// Reads and validates `path`; refuses the variants this runtime does not implement (DFlash2's
    /// convolutions and candidate selector, sliding-window or causal drafter layers, scaled RoPE, biases).
    pub fn from_json_file(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                LoadError::MissingFile {
                    path: path.to_path_buf(),
                    what: "config.json of the DFlash drafter",
                }
            } else {
                LoadError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
        let root = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(root)) => root,
            Ok(_) => {
                return Err(LoadError::Json {
                    path: path.to_path_buf(),
                    reason: "top level should be an object".into(),
                })
            }
            Err(e) => {
                return Err(LoadError::Json {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })
            }
        };
        Self::from_object(path, &root)
    }

    fn from_object(path: &Path, root: &Map<String, Value>) -> Result<Self, LoadError> {
        let f = Fields { path, root };
        if let Some(arch) = f.top("architectures").and_then(|a| a.get(0)) {
            if arch.as_str() != Some("DFlashDraftModel") {
                return Err(f.unsupported(
                    "architectures",
                    format!("{arch} (only DFlashDraftModel is implemented)"),
                ));
            }
        }
        if f.top("attention_bias").and_then(Value::as_bool) == Some(true) {
            return Err(f.unsupported("attention_bias", "true".into()));
        }
        if f.top("is_causal").and_then(Value::as_bool) == Some(true) {
            return Err(f.unsupported("is_causal", "causal drafter layers".into()));
        }
        if let Some(types) = f.top("layer_types").and_then(Value::as_array) {
            if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(f.unsupported("layer_types", format!("layer type {t}")));
            }
        }
        for rope in ["rope_parameters", "rope_scaling"] {
            let kind = f
                .top(rope)
                .and_then(|r| r.get("rope_type").or_else(|| r.get("type")));
            if let Some(kind) = kind.filter(|k| k.as_str() != Some("default")) {
                return Err(f.unsupported(rope, format!("rope type {kind}")));
            }
        }
        let hidden_size = f.positive("hidden_size")?;
        let num_attention_heads = f.positive("num_attention_heads")?;
        let num_key_value_heads = f.positive("num_key_value_heads")?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(f.invalid(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        // Absent fields take Qwen3Config's class defaults (z-lab's config class): head_dim 128, rope
        // theta 10⁴, eps 10⁻⁶.
        let head_dim = f.opt_usize("head_dim", false)?.unwrap_or(128);
        if head_dim == 0 || head_dim % 2 == 1 {
            return Err(f.invalid("head_dim", format!("{head_dim} is not even and positive")));
        }
        let rope_theta = match f
            .top("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            Some(t) => t,
            None => f.opt_f64("rope_theta", false)?.unwrap_or(10_000.0),
        };
        let block_size = f.opt_usize("block_size", true)?.unwrap_or(16);
        if block_size < 2 {
            return Err(f.invalid("block_size", format!("{block_size} leaves no proposal row")));
        }
        let mask_token_id = u32::try_from(f.usize_required("mask_token_id", true)?)
            .map_err(|_| f.invalid("mask_token_id", "exceeds u32".into()))?;
        let target_layer_ids = f.usize_list_required("target_layer_ids")?;
        if target_layer_ids.is_empty() {
            return Err(f.invalid("target_layer_ids", "empty".into()));
        }
        let softcap = f.opt_f64("final_logit_softcapping", true)?;
        Ok(DflashConfig {
            block_size,
            mask_token_id,
            target_layer_ids,
            num_target_layers: f.opt_usize("num_target_layers", false)?,
            hidden_size,
            intermediate_size: f.positive("intermediate_size")?,
            num_hidden_layers: f.positive("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f.opt_f64("rms_norm_eps", false)?.unwrap_or(1e-6) as f32,
            rope_theta: rope_theta as f32,
            input_embedding_scale: f.opt_f64("input_embedding_scale", true)?.unwrap_or(1.0) as f32,
            output_multiplier: f.opt_f64("output_multiplier", true)?.unwrap_or(1.0) as f32,
            final_logit_softcapping: softcap.filter(|c| *c > 0.0).map(|c| c as f32),
        })
    }
}

/// Typed field access with errors naming the file and field; `null` counts as absent.
struct Fields<'a> {
    path: &'a Path,
    root: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn top(&self, name: &str) -> Option<&Value> {
        self.root.get(name).filter(|v| !v.is_null())
    }

    /// `dflash_config.name` if present (when `draft` allows it), else the top-level field.
    fn lookup(&self, name: &str, draft: bool) -> Option<(String, &Value)> {
        let inner = self
            .top("dflash_config")
            .and_then(|d| d.get(name))
            .filter(|v| draft && !v.is_null());
        match inner {
            Some(v) => Some((format!("dflash_config.{name}"), v)),
            None => self.top(name).map(|v| (name.to_string(), v)),
        }
    }

    fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn wrong(&self, field: String, expected: &'static str, found: &Value) -> LoadError {
        LoadError::WrongType {
            path: self.path(),
            field,
            expected,
            found: found.to_string(),
        }
    }

    fn invalid(&self, field: &str, reason: String) -> LoadError {
        LoadError::InvalidValue {
            path: self.path(),
            field: field.to_string(),
            reason,
        }
    }

    fn unsupported(&self, field: &str, reason: String) -> LoadError {
        LoadError::Unsupported {
            path: self.path(),
            field: field.to_string(),
            reason,
        }
    }

    fn opt_usize(&self, name: &str, draft: bool) -> Result<Option<usize>, LoadError> {
        match self.lookup(name, draft) {
            None => Ok(None),
            Some((field, v)) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(field, "a non-negative integer", v)),
        }
    }

    fn usize_required(&self, name: &str, draft: bool) -> Result<usize, LoadError> {
        let value = self.opt_usize(name, draft)?;
        value.ok_or_else(|| LoadError::MissingField {
            path: self.path(),
            field: name.to_string(),
        })
    }

    /// A required size that the drafter divides or loops by.
    fn positive(&self, name: &str) -> Result<usize, LoadError> {
        match self.usize_required(name, false)? {
            0 => Err(self.invalid(name, "must be positive".into())),
            n => Ok(n),
        }
    }

    fn opt_f64(&self, name: &str, draft: bool) -> Result<Option<f64>, LoadError> {
        match self.lookup(name, draft) {
            None => Ok(None),
            Some((field, v)) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(field, "a number", v)),
        }
    }

    fn usize_list_required(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        let (field, v) = self
            .lookup(name, true)
            .ok_or_else(|| LoadError::MissingField {
                path: self.path(),
                field: format!("dflash_config.{name}"),
            })?;
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong(field.clone(), "a list of integers", v))?;
        items
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| usize::try_from(x).ok())
                    .ok_or_else(|| self.wrong(field.clone(), "a list of non-negative integers", v))
            })
            .collect()
    }
}

/// Keys and values of one drafter layer for the committed context rows.
#[derive(Clone, Debug, Default)]
struct ContextKv {
    k: Vec<f32>, // [rows, kv_heads, head_dim], normed and rotated
    v: Vec<f32>, // [rows, kv_heads, head_dim]
}

/// One Qwen3 decoder layer of the drafter; its attention reads [context ; block] without a causal mask.
#[derive(Clone, Debug)]
struct BlockLayer {
    input_norm: Norm, // [hidden]
    q_proj: Linear,   // [heads * head_dim, hidden]
    k_proj: Linear,   // [kv_heads * head_dim, hidden]
    v_proj: Linear,   // [kv_heads * head_dim, hidden]
    o_proj: Linear,   // [hidden, heads * head_dim]
    q_norm: Norm,     // [head_dim]
    k_norm: Norm,     // [head_dim]
    post_norm: Norm,  // [hidden]
    mlp: Mlp,
}

/// Head geometry and the RoPE table shared by every layer.
#[derive(Clone, Debug)]
struct Heads {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inv_freq: Vec<f32>, // [head_dim / 2]
}

impl BlockLayer {
    fn load(t: &Tensors<'_>, c: &DflashConfig) -> Result<Self, ModelError> {
        let (h, d, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let (q_rows, kv_rows) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let a = t.sub("self_attn.");
        Ok(BlockLayer {
            input_norm: Norm::load(t, "input_layernorm.weight", h, eps, false)?,
            q_proj: Linear::load(&a, "q_proj.weight", q_rows, h)?,
            k_proj: Linear::load(&a, "k_proj.weight", kv_rows, h)?,
            v_proj: Linear::load(&a, "v_proj.weight", kv_rows, h)?,
            o_proj: Linear::load(&a, "o_proj.weight", h, q_rows)?,
            q_norm: Norm::load(&a, "q_norm.weight", d, eps, false)?,
            k_norm: Norm::load(&a, "k_norm.weight", d, eps, false)?,
            post_norm: Norm::load(t, "post_attention_layernorm.weight", h, eps, false)?,
            mlp: Mlp::load(&t.sub("mlp."), h, c.intermediate_size)?,
        })
    }

    /// Keys (normed, rotated at `positions`) and values of rows `x`: [n, hidden] -> 2 × [n, kv_heads, head_dim].
    fn keys_values(&self, x: &[f32], positions: &[usize], g: &Heads) -> (Vec<f32>, Vec<f32>) {
        let n = positions.len();
        let mut k = self.k_proj.forward(x, n);
        self.k_norm.apply_inplace(&mut k);
        kernels::rope_with_inv_freq(&mut k, positions, g.kv_heads, g.head_dim, &g.inv_freq);
        (k, self.v_proj.forward(x, n))
    }

    /// Runs the block rows `x` [b, hidden] (positions `positions`) through the layer in place. `ctx` gains
    /// the block's keys/values only while they are attended to.
    fn forward(&self, x: &mut [f32], positions: &[usize], ctx: &mut ContextKv, g: &Heads) {
        let b = positions.len();
        let mut h = vec![0.0; x.len()]; // [b, hidden]
        self.input_norm.apply(x, &mut h);
        let mut q = self.q_proj.forward(&h, b); // [b, heads, head_dim]
        self.q_norm.apply_inplace(&mut q);
        kernels::rope_with_inv_freq(&mut q, positions, g.heads, g.head_dim, &g.inv_freq);
        let (k, v) = self.keys_values(&h, positions, g);
        let context_len = ctx.k.len();
        ctx.k.extend_from_slice(&k);
        ctx.v.extend_from_slice(&v);
        let attn = block_attention(&q, &ctx.k, &ctx.v, b, g);
        ctx.k.truncate(context_len);
        ctx.v.truncate(context_len);
        kernels::add_inplace(x, &self.o_proj.forward(&attn, b));
        self.post_norm.apply(x, &mut h);
        kernels::add_inplace(x, &self.mlp.forward(&h, b));
    }
}

/// softmax(q·kᵀ/√d)·v of `b` query rows over every row of `k`/`v` ([keys, kv_heads, d], GQA), no mask.
///
/// Non-causal attention of b rows is causal attention of a single row at the last position whose query
/// heads are the b × group (row, head) pairs of each kv head, so the kernel's decode path serves it:
/// query q[r, kvh·group + j] becomes head (kvh·b + r)·group + j of that one row.
fn block_attention(q: &[f32], k: &[f32], v: &[f32], b: usize, g: &Heads) -> Vec<f32> {
    let (hq, hkv, d) = (g.heads, g.kv_heads, g.head_dim);
    let group = hq / hkv;
    let keys = k.len() / (hkv * d);
    let regrouped_head = |r: usize, head: usize| ((head / group) * b + r) * group + head % group;
    let mut q1 = vec![0.0; b * hq * d]; // [1, kv_heads * b * group, d]
    for r in 0..b {
        for head in 0..hq {
            let to = regrouped_head(r, head) * d;
            q1[to..to + d].copy_from_slice(&q[(r * hq + head) * d..(r * hq + head + 1) * d]);
        }
    }
    let mut o1 = vec![0.0; b * hq * d];
    let scale = 1.0 / (d as f32).sqrt();
    kernels::attention(&q1, k, v, 1, keys - 1, b * hq, hkv, d, scale, &mut o1);
    let mut out = vec![0.0; b * hq * d]; // [b, heads, d]
    for r in 0..b {
        for head in 0..hq {
            let from = regrouped_head(r, head) * d;
            out[(r * hq + head) * d..(r * hq + head + 1) * d].copy_from_slice(&o1[from..from + d]);
        }
    }
    out
}

/// The fc input of n verified rows, [n, taps * width]: each row's taps (layer outputs of `target_layer_ids`,
/// one buffer [n, width] per layer, in that order) side by side; checked against the drafter's layers.
pub fn context_input(
    taps: &[Vec<f32>],
    n: usize,
    width: usize,
    target_layer_ids: &[usize],
) -> Result<Vec<f32>, ModelError> {
    if taps.len() != target_layer_ids.len() {
        return Err(ModelError::StateMismatch(format!(
            "dflash observe: {} tap buffers for {} target layers {target_layer_ids:?}",
            taps.len(),
            target_layer_ids.len()
        )));
    }
    if let Some((i, t)) = taps.iter().enumerate().find(|(_, t)| t.len() != n * width) {
        return Err(ModelError::StateMismatch(format!(
            "dflash observe: tap of target layer {} holds {} values, expected {n} rows × {width}",
            target_layer_ids[i],
            t.len()
        )));
    }
    let mut cat = Vec::with_capacity(n * taps.len() * width);
    for j in 0..n {
        for t in taps {
            cat.extend_from_slice(&t[j * width..(j + 1) * width]);
        }
    }
    Ok(cat)
}

pub struct DflashDrafter {
    target: SharedHead,
    config: DflashConfig,
    fc: Linear,        // [hidden, taps * target_hidden]
    hidden_norm: Norm, // [hidden]
    layers: Vec<BlockLayer>,
    norm: Norm, // [hidden]
    heads: Heads,
    /// One per layer: rows 0..committed of the context.
    context: Vec<ContextKv>,
    committed: usize,
}

impl DflashDrafter {
    /// Loads the drafter in `dir` (`config.json` + `model.safetensors` or a sharded index), checked against
    /// the `target` whose embeddings, LM head and layer outputs it uses.
    pub fn load(dir: &Path, target: SharedHead) -> Result<Self, ModelError> {
        let config_path = dir.join("config.json");
        let c = DflashConfig::from_json_file(&config_path)?;
        let invalid = |field: &str, reason: String| {
            ModelError::Load(LoadError::InvalidValue {
                path: config_path.clone(),
                field: field.to_string(),
                reason,
            })
        };
        if c.hidden_size != target.hidden() {
            return Err(invalid(
                "hidden_size",
                format!("{} differs from the target's hidden size {} (the drafter shares its embeddings and LM head)", c.hidden_size, target.hidden()),
            ));
        }
        let target_layers = target.num_layers();
        if let Some(n) = c.num_target_layers.filter(|n| *n != target_layers) {
            return Err(invalid(
                "num_target_layers",
                format!("the drafter was trained on a {n}-layer target; this target has {target_layers} layers"),
            ));
        }
        if let Some(l) = c.target_layer_ids.iter().find(|l| **l >= target_layers) {
            return Err(invalid(
                "dflash_config.target_layer_ids",
                format!("layer {l} does not exist in the {target_layers}-layer target"),
            ));
        }
        if c.mask_token_id as usize >= target.vocab() {
            return Err(invalid(
                "dflash_config.mask_token_id",
                format!(
                    "{} is outside the target vocabulary ({})",
                    c.mask_token_id,
                    target.vocab()
                ),
            ));
        }
        let store = TensorStore::open(dir)?;
        // z-lab checkpoints store the draft model's tensors unprefixed; accept a `model.` wrapper too.
        let prefix = if store.contains("model.fc.weight") {
            "model."
        } else {
            ""
        };
        let t = Tensors::new(&store, prefix);
        let h = c.hidden_size;
        let layers = (0..c.num_hidden_layers)
            .map(|i| BlockLayer::load(&t.sub(&format!("layers.{i}.")), &c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DflashDrafter {
            fc: Linear::load(
                &t,
                "fc.weight",
                h,
                c.target_layer_ids.len() * target.hidden(),
            )?,
            hidden_norm: Norm::load(&t, "hidden_norm.weight", h, c.rms_norm_eps, false)?,
            norm: Norm::load(&t, "norm.weight", h, c.rms_norm_eps, false)?,
            context: vec![ContextKv::default(); layers.len()],
            layers,
            heads: Heads {
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                inv_freq: kernels::rope_inv_freq(c.head_dim, c.rope_theta),
            },
            committed: 0,
            config: c,
            target,
        })
    }

    /// Rows per block (the anchor plus `block_size - 1` proposals).
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    pub fn config(&self) -> &DflashConfig {
        &self.config
    }

    /// Logits [block_size, vocab] of the block anchored at `anchor` at position `position()`, over the
    /// committed context; row i ≥ 1 scores token `position() + i`.
    pub fn block_logits(&mut self, anchor: u32) -> Result<Vec<f32>, ModelError> {
        let b = self.config.block_size;
        let hidden = self.block_hidden(anchor)?;
        Ok(self.logits(&hidden, b))
    }

    /// Normed block outputs [block_size, hidden] for `anchor` at position `position()`.
    fn block_hidden(&mut self, anchor: u32) -> Result<Vec<f32>, ModelError> {
        let (b, hd) = (self.config.block_size, self.config.hidden_size);
        let mut x = Vec::with_capacity(b * hd); // [b, hidden]
        for (row, token) in std::iter::once(anchor)
            .chain(std::iter::repeat_n(self.config.mask_token_id, b - 1))
            .enumerate()
        {
            let e = self
                .target
                .embed_row(token)
                .ok_or(ModelError::TokenOutOfRange {
                    token,
                    index: self.committed + row,
                    vocab: self.target.vocab(),
                })?;
            x.extend_from_slice(e);
        }
        let scale = self.config.input_embedding_scale;
        if scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let positions: Vec<usize> = (self.committed..self.committed + b).collect();
        for (layer, ctx) in self.layers.iter().zip(self.context.iter_mut()) {
            layer.forward(&mut x, &positions, ctx, &self.heads);
        }
        self.norm.apply_inplace(&mut x);
        Ok(x)
    }

    /// The target's LM head on `n` normed rows, with the drafter's output multiplier and soft cap.
    fn logits(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let mut logits = self.target.lm_head(hidden, n); // [n, vocab]
        let m = self.config.output_multiplier;
        if m != 1.0 {
            logits.iter_mut().for_each(|l| *l *= m);
        }
        if let Some(c) = self.config.final_logit_softcapping {
            logits.iter_mut().for_each(|l| *l = c * (*l / c).tanh());
        }
        logits
    }
}

impl Drafter for DflashDrafter {
    fn name(&self) -> &'static str {
        "dflash"
    }

    fn taps(&self) -> Vec<Tap> {
        self.config
            .target_layer_ids
            .iter()
            .map(|&i| Tap::LayerOutput(i))
            .collect()
    }

    fn reset(&mut self) {
        self.context = vec![ContextKv::default(); self.layers.len()];
        self.committed = 0;
    }

    fn position(&self) -> usize {
        self.committed
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        crate::check_rewind(self.committed, position)?;
        let row = self.heads.kv_heads * self.heads.head_dim;
        for ctx in &mut self.context {
            ctx.k.truncate(position * row);
            ctx.v.truncate(position * row);
        }
        self.committed = position;
        Ok(())
    }

    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        _next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        let width = self.target.hidden();
        let cat = context_input(taps, n, width, &self.config.target_layer_ids)?;
        if n == 0 {
            return Ok(());
        }
        // c = hidden_norm(fc([taps of row j, in target_layer_ids order]))   [n, taps * width] -> [n, hidden]
        let mut c = self.fc.forward(&cat, n);
        self.hidden_norm.apply_inplace(&mut c);
        let positions: Vec<usize> = (self.committed..self.committed + n).collect();
        for (layer, ctx) in self.layers.iter().zip(self.context.iter_mut()) {
            let (k, v) = layer.keys_values(&c, &positions, &self.heads);
            ctx.k.extend_from_slice(&k);
            ctx.v.extend_from_slice(&v);
        }
        self.committed += n;
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        // The anchor is history's last token; its context is every row before it, which observe must cover.
        let m = k.min(self.config.block_size - 1);
        let Some(&anchor) = history.last() else {
            return Ok(Vec::new());
        };
        if m == 0 || self.committed + 1 != history.len() {
            return Ok(Vec::new());
        }
        // The whole trained block runs even when fewer proposals are wanted: block rows see each other,
        // so a shorter block would change every row's prediction.
        let hd = self.config.hidden_size;
        let hidden = self.block_hidden(anchor)?;
        let logits = self.logits(&hidden[hd..(m + 1) * hd], m); // [m, vocab]
        let vocab = self.target.vocab();
        let mut context = history.to_vec();
        for row in logits.chunks_exact(vocab) {
            let token = chooser.choose(row, &context);
            context.push(token);
        }
        Ok(context.split_off(history.len()))
    }
}
