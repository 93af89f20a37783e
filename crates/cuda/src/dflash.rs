//! The DFlash block drafter (z-lab's `DFlashDraftModel`) on the GPU: the same function as the host
//! drafter `drafters::DflashDrafter`, run with the target's kernels next to the target, so a round
//! costs one block pass on the device instead of a tap copy and a host forward per token (the host
//! drafter next to an H200 target ran at 0.16-0.21x, docs/PERFORMANCE.md).
//!
//! Context (observe): for each verified target row j, c_j = hidden_norm(fc([taps of row j])), the
//! taps (`target_layer_ids` outputs) concatenated on the host and uploaded [n, taps * H]; each layer
//! writes k_norm(k_proj(c_j)) rotated at j and v_proj(c_j) into its KV cache (attn_prep over the
//! layer's qkv projection of c, without the input norm; the q it also computes is unused).
//! Block (propose): rows [anchor, mask × (B−1)] at positions p..p+B, embedded with the target's table;
//! every layer is a Qwen3 decoder layer whose queries see all context rows and every block row (no
//! causal mask inside the block). attn_prep writes the block's k/v at p..p+B (past the committed rows,
//! so the next observe overwrites them) and its q [B, hq, d]; `dflash_regroup` turns those B rows into
//! one row of B·hq heads grouped by kv head, whose causal attention at position p+B−1 is exactly the
//! block's non-causal attention (the host drafter's `block_attention` does the same on the CPU); the
//! output is regrouped back for o_proj. Then `norm` and the target's LM head on rows 1..=m.
//!
//! Invariant: KV rows 0..position() hold the verified context; a block's rows beyond it are scratch.
//! On a GPU the block pass (~9 kernels per layer) replays a captured graph; observes launch directly.

use std::sync::Arc;

use cudarc::driver::CudaGraph;

use drafters::dflash::{context_input, DflashConfig};
use drafters::{Chooser, Drafter};
use families::{BackendError, ModelError, Tap};
use model_io::{Checkpoint, Family, GenerationDefaults, LayerKind, ModelConfig, TensorStore};

use crate::adapter::{grown_capacity, INITIAL_CAPACITY};
use crate::argmax;
use crate::buf::{dtoh, htod, DBuf};
use crate::error::CudaError;
use crate::model::{load_layer, CudaModel, FfnW, LayerW, MixerW};
use crate::mtp::OwnedGraph;
use crate::ops::{self, AttnBufs, AttnCore, AttnShape, NormW};
use crate::state::{attention_caches, copy_cache_rows, LayerState, Scratch, Widths, LOGIT_ROWS};
use crate::weights::{Init, Mat, Source, Uploader};

/// A DFlash drafter on the device of its [`CudaModel`] target, as a [`Drafter`].
pub struct CudaDflash {
    /// The block pass captured (GPU only): its inputs come from device memory (ids, start, last), so
    /// it replays for any anchor and position; dropped whenever the caches or the scratch move.
    /// First, so it is destroyed before the buffers it uses.
    graph: Option<OwnedGraph>,
    /// Why a capture failed (then the block pass launches its kernels directly).
    graph_error: Option<String>,
    target: Arc<CudaModel>,
    config: DflashConfig,
    fc: Mat,           // [hidden, taps * hidden]
    hidden_norm: DBuf, // [hidden]
    layers: Vec<LayerW>,
    norm: DBuf, // [hidden]
    widths: Widths,
    /// Per layer, its KV cache of `capacity` positions.
    kv: Vec<LayerState>,
    capacity: usize,
    /// Scratch of observe and block passes, grown on demand; `cat` [rows, taps * hidden] the uploaded taps.
    io: Option<(Scratch, DBuf)>,
    /// i32 [1]: the block's last position, where its regrouped row attends from.
    last: DBuf,
    /// [B * hq * d] the block's queries and attention outputs as one regrouped row.
    q1: DBuf,
    o1: DBuf,
    committed: usize,
}

impl CudaDflash {
    /// Loads the drafter in `dir` (`config.json` and its safetensors) onto `target`'s device, checked
    /// against the target as the host drafter checks it.
    pub fn load(target: &Arc<CudaModel>, dir: &std::path::Path) -> Result<Self, CudaError> {
        let t = &**target;
        let config_path = dir.join("config.json");
        let c = DflashConfig::from_json_file(&config_path).map_err(ModelError::Load)?;
        let invalid = |field: &str, reason: String| -> CudaError {
            ModelError::Load(model_io::LoadError::InvalidValue {
                path: config_path.clone(),
                field: field.to_string(),
                reason,
            })
            .into()
        };
        let target_layers = t.layers.len();
        if c.hidden_size != t.hidden {
            return Err(invalid(
                "hidden_size",
                format!(
                    "{} differs from the target's hidden size {}",
                    c.hidden_size, t.hidden
                ),
            ));
        }
        if let Some(n) = c.num_target_layers.filter(|n| *n != target_layers) {
            return Err(invalid(
                "num_target_layers",
                format!(
                    "the drafter was trained on a {n}-layer target; this one has {target_layers}"
                ),
            ));
        }
        if let Some(l) = c.target_layer_ids.iter().find(|l| **l >= target_layers) {
            return Err(invalid(
                "dflash_config.target_layer_ids",
                format!("layer {l} does not exist in the {target_layers}-layer target"),
            ));
        }
        if c.mask_token_id as usize >= t.vocab {
            return Err(invalid(
                "dflash_config.mask_token_id",
                format!(
                    "{} is outside the target vocabulary ({})",
                    c.mask_token_id, t.vocab
                ),
            ));
        }
        if c.block_size < 2 || c.block_size > LOGIT_ROWS + 1 {
            return Err(invalid(
                "block_size",
                format!(
                    "{} (the GPU drafter takes 2..={})",
                    c.block_size,
                    LOGIT_ROWS + 1
                ),
            ));
        }
        if c.input_embedding_scale != 1.0 {
            return Err(CudaError::Unsupported {
                what: format!(
                    "a DFlash drafter with input_embedding_scale {} on the GPU",
                    c.input_embedding_scale
                ),
            });
        }
        let tensors = TensorStore::open(dir).map_err(ModelError::Load)?;
        // z-lab checkpoints store the draft model's tensors unprefixed; accept a `model.` wrapper too.
        let prefix = if tensors.contains("model.fc.weight") {
            "model."
        } else {
            ""
        };
        let ck = Checkpoint {
            dir: dir.to_path_buf(),
            config: layer_config(&c, t, prefix),
            tensors,
            generation: GenerationDefaults::default(),
            chat_template: None,
            has_mtp: false,
            has_dflash: false,
            gguf_vocab: None,
        };
        let up = Uploader {
            dev: &t.dev,
            source: Source::Checkpoint(&ck),
            format: t.opts.weights,
            tensor_cores: t.opts.tensor_core_gemv,
            counter: std::cell::Cell::new(0),
        };
        let (h, taps) = (c.hidden_size, c.target_layer_ids.len());
        let mut widths = t.widths;
        widths.big = widths.big.max(2 * c.intermediate_size);
        widths.mid = widths.mid.max(c.intermediate_size);
        widths.max_in = widths.max_in.max(c.intermediate_size).max(taps * h);
        widths.heads = widths.heads.max(c.num_attention_heads);
        widths.head_dim = widths.head_dim.max(c.head_dim);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let lp = format!("{prefix}layers.{i}.");
                load_layer(
                    &up,
                    &ck.config,
                    &lp,
                    LayerKind::FullAttention,
                    None,
                    false,
                    &mut widths,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let q_floats = c.block_size * c.num_attention_heads * c.head_dim;
        let drafter = CudaDflash {
            fc: up.matrix(&[(format!("{prefix}fc.weight"), h)], taps * h)?,
            hidden_norm: up.vector(&format!("{prefix}hidden_norm.weight"), &[h], Init::Norm)?,
            norm: up.vector(&format!("{prefix}norm.weight"), &[h], Init::Norm)?,
            kv: attention_caches(&t.dev, &layers, INITIAL_CAPACITY.min(t.context).max(1))?,
            capacity: INITIAL_CAPACITY.min(t.context).max(1),
            io: None,
            last: DBuf::zeros(&t.dev, 4)?,
            q1: DBuf::f32s(&t.dev, q_floats)?,
            o1: DBuf::f32s(&t.dev, q_floats)?,
            committed: 0,
            graph: None,
            graph_error: None,
            layers,
            widths,
            config: c,
            target: target.clone(),
        };
        t.dev.synchronize()?;
        Ok(drafter)
    }

    /// Logits [block_size - 1, vocab] of block rows 1.. for `anchor` at position `position()` (before
    /// the output multiplier and soft cap): what `propose` chooses from; parity tests compare it with
    /// `DflashDrafter::block_logits`.
    pub fn block_logits(&mut self, anchor: u32) -> Result<Vec<f32>, CudaError> {
        let m = self.config.block_size - 1;
        if m == 0 || m > LOGIT_ROWS || anchor as usize >= self.target.vocab {
            return Err(ModelError::EmptyInput.into());
        }
        self.block(anchor)?;
        let mut logits = vec![0.0f32; m * self.target.vocab];
        if let Some((sc, _)) = self.io.as_ref() {
            dtoh(&self.target.dev, &mut logits, sc.logits.ptr)?;
        }
        Ok(logits)
    }

    fn norm_w(&self, w: &DBuf) -> NormW {
        NormW {
            w: w.ptr,
            eps: self.config.rms_norm_eps,
            zero_centred: false,
        }
    }

    /// Makes the scratch hold passes of `rows` rows (and the block's), keeping it when it does.
    fn fit(&mut self, rows: usize) -> Result<(), CudaError> {
        let t = &*self.target;
        let gm = t.opts.gemv_max_rows;
        let b = self.config.block_size;
        let rows = rows.max(b);
        let splits = (rows * ops::att_splits(rows, gm)).max(b * ops::att_splits(b, gm));
        if self
            .io
            .as_ref()
            .is_some_and(|(sc, _)| sc.rows >= rows && sc.row_splits >= splits)
        {
            return Ok(());
        }
        self.graph = None;
        self.io = None;
        let cat = DBuf::f32s(&t.dev, rows * self.config.target_layer_ids.len() * t.hidden)?;
        self.io = Some((Scratch::new(&t.dev, &self.widths, rows, splits)?, cat));
        Ok(())
    }

    /// Makes the KV caches hold positions start..start+n, keeping rows 0..start. A block may reach
    /// `block_size` positions past the target's context (its last rows are only ever proposals), so
    /// the caches may too.
    fn ensure(&mut self, start: usize, n: usize) -> Result<(), CudaError> {
        let t = &*self.target;
        let limit = t.context + self.config.block_size;
        if start + n > limit {
            return Err(ModelError::ContextOverflow {
                start,
                n,
                context: limit,
            }
            .into());
        }
        let Some(capacity) = grown_capacity(self.capacity, start + n, limit) else {
            return Ok(());
        };
        let kv = attention_caches(&t.dev, &self.layers, capacity)?;
        copy_cache_rows(&t.dev, &kv, &self.kv, start)?;
        self.graph = None;
        self.kv = kv;
        self.capacity = capacity;
        Ok(())
    }

    /// Writes the context keys/values of n verified rows (taps `cat` [n, taps * H] already uploaded)
    /// at positions start..start+n.
    fn context_rows(&mut self, start: usize, n: usize) -> Result<(), CudaError> {
        let t = self.target.clone();
        let dev = &*t.dev;
        let gm = t.opts.gemv_max_rows;
        let hn = self.norm_w(&self.hidden_norm);
        let Some((sc, cat)) = self.io.as_ref() else {
            return Err(CudaError::Unsupported {
                what: "a DFlash pass without its scratch".into(),
            });
        };
        htod(dev, sc.start.ptr, &[start as i32])?;
        // c = hidden_norm(fc(taps))   [n, H] in sc.h
        ops::linear(dev, &self.fc, cat.ptr, sc.x.ptr, n, false, sc.xb.ptr, gm)?;
        ops::rmsnorm(
            dev,
            sc.x.ptr,
            hn.w,
            sc.h.ptr,
            n,
            t.hidden,
            hn.eps,
            hn.zero_centred,
        )?;
        for (l, ls) in self.layers.iter().zip(self.kv.iter()) {
            let (MixerW::Attention(a), LayerState::Attention { k, v, .. }) = (&l.mixer, ls) else {
                return Err(not_attention());
            };
            ops::linear(dev, &a.qkv, sc.h.ptr, sc.big.ptr, n, false, sc.xb.ptr, gm)?;
            let bufs = attn_bufs(sc, k, v);
            let (qn, kn, f) = (a.q_norm.ptr, a.k_norm.ptr, a.inv_freq.ptr);
            ops::attn_prep(dev, a.shape, &bufs, qn, kn, f, n)?;
        }
        Ok(())
    }

    /// The block pass for `anchor` at position `committed`: leaves the logits of block rows 1..B in
    /// the scratch's logits buffer [B - 1, vocab] (replaying its graph on a GPU).
    fn block(&mut self, anchor: u32) -> Result<(), CudaError> {
        let b = self.config.block_size;
        let p = self.committed;
        self.fit(b)?;
        self.ensure(p, b)?;
        let t = self.target.clone();
        let dev = &*t.dev;
        let Some((sc, _)) = self.io.as_ref() else {
            return Err(not_attention());
        };
        let mut ids = vec![self.config.mask_token_id as i32; b];
        ids[0] = anchor as i32;
        htod(dev, sc.ids.ptr, &ids)?;
        htod(dev, sc.start.ptr, &[p as i32])?;
        htod(dev, self.last.ptr, &[(p + b - 1) as i32])?;
        if t.graph_ok() && self.graph_error.is_none() {
            if self.graph.is_none() {
                match self.capture() {
                    Ok(Some(g)) => self.graph = Some(OwnedGraph(g)),
                    Ok(None) => self.graph_error = Some("capture produced an empty graph".into()),
                    Err(e) => self.graph_error = Some(e.to_string()),
                }
            }
            if let Some(g) = &self.graph {
                return g
                    .0
                    .launch()
                    .map_err(CudaError::driver("launching the DFlash block graph"));
            }
        }
        self.block_body()
    }

    /// Captures the block pass into a graph (nothing runs during capture).
    fn capture(&mut self) -> Result<Option<CudaGraph>, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let dev = self.target.dev.clone();
        crate::note_capture();
        let stream = &dev.gpu()?.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("beginning DFlash graph capture"))?;
        let body = self.block_body();
        // Always end the capture, also after a failed body, so the stream leaves capture mode.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(CudaError::driver("ending DFlash graph capture"));
        body?;
        graph
    }

    /// The block pass's device work, its inputs (ids, start, last) already uploaded: what the graph holds.
    fn block_body(&self) -> Result<(), CudaError> {
        let (b, t) = (self.config.block_size, &*self.target);
        let (dev, gm, h, m) = (&*t.dev, t.opts.gemv_max_rows, t.hidden, b - 1);
        let Some((sc, _)) = self.io.as_ref() else {
            return Err(not_attention());
        };
        ops::embed(dev, &t.embed, sc.ids.ptr, sc.x.ptr, b)?;
        let s_max = ops::att_splits(b, gm);
        for (l, ls) in self.layers.iter().zip(self.kv.iter()) {
            let (MixerW::Attention(a), LayerState::Attention { k, v, .. }) = (&l.mixer, ls) else {
                return Err(not_attention());
            };
            let input_norm = self.norm_w(&l.input_norm);
            ops::linear_normed(
                dev, &a.qkv, sc.x.ptr, input_norm, sc.h.ptr, sc.big.ptr, b, sc.xb.ptr, gm,
            )?;
            let bufs = attn_bufs(sc, k, v);
            let s = a.shape;
            ops::attn_prep(dev, s, &bufs, a.q_norm.ptr, a.k_norm.ptr, a.inv_freq.ptr, b)?;
            // The block's B query rows as one row of B * hq heads at the block's last position.
            ops::regroup(dev, sc.q.ptr, self.q1.ptr, b, s.hq, s.hkv, s.d, false)?;
            let wide = AttnShape { hq: b * s.hq, ..s };
            let one = AttnBufs {
                q: self.q1.ptr,
                start: self.last.ptr,
                out: self.o1.ptr,
                rope: crate::ops::Rope::Compute,
                ..bufs
            };
            ops::attn_run_core(dev, wide, &one, 1, AttnCore::SplitK { s_max })?;
            ops::regroup(dev, self.o1.ptr, sc.mid.ptr, b, s.hq, s.hkv, s.d, true)?;
            ops::linear(dev, &a.o, sc.mid.ptr, sc.x.ptr, b, true, sc.xb.ptr, gm)?;
            let FfnW::Dense { gate_up, down } = &l.ffn else {
                return Err(not_attention());
            };
            let post_norm = self.norm_w(&l.post_norm);
            ops::linear_swiglu(
                dev, gate_up, sc.x.ptr, post_norm, sc.h.ptr, sc.big.ptr, sc.mid.ptr, b, sc.xb.ptr,
                gm,
            )?;
            ops::linear(dev, down, sc.mid.ptr, sc.x.ptr, b, true, sc.xb.ptr, gm)?;
        }
        // Rows 1..B propose tokens p+1..p+B (propose reads the first m it wants).
        let n = self.norm_w(&self.norm);
        ops::rmsnorm(
            dev,
            sc.x.f32_at(h),
            n.w,
            sc.h.ptr,
            m,
            h,
            n.eps,
            n.zero_centred,
        )?;
        let head = t.lm_head.as_ref().unwrap_or(&t.embed);
        ops::linear(dev, head, sc.h.ptr, sc.logits.ptr, m, false, sc.xb.ptr, gm)
    }
}

impl Drafter for CudaDflash {
    fn name(&self) -> &'static str {
        "dflash (cuda)"
    }

    fn taps(&self) -> Vec<Tap> {
        self.config
            .target_layer_ids
            .iter()
            .map(|&i| Tap::LayerOutput(i))
            .collect()
    }

    fn reset(&mut self) {
        self.committed = 0;
    }

    fn position(&self) -> usize {
        self.committed
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        if position > self.committed {
            return Err(ModelError::PositionMismatch {
                expected: self.committed,
                got: position,
            }
            .into());
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
        let width = self.target.hidden;
        let cat = context_input(taps, n, width, &self.config.target_layer_ids)?;
        let row = cat.len() / n.max(1);
        let pass_rows = self.target.opts.max_pass_rows.max(1);
        let mut j0 = 0;
        while j0 < n {
            let rows = (n - j0).min(pass_rows);
            self.fit(rows)?;
            self.ensure(self.committed, rows)?;
            if let Some((_, buf)) = &self.io {
                htod(&self.target.dev, buf.ptr, &cat[j0 * row..(j0 + rows) * row])?;
            }
            self.context_rows(self.committed, rows)?;
            self.committed += rows;
            j0 += rows;
        }
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        // The anchor is history's last token; its context is every row before it.
        let m = k.min(self.config.block_size - 1).min(LOGIT_ROWS);
        let Some(&anchor) = history.last() else {
            return Ok(Vec::new());
        };
        if m == 0 || self.committed + 1 != history.len() {
            return Ok(Vec::new());
        }
        let vocab = self.target.vocab;
        if anchor as usize >= vocab {
            return Err(ModelError::TokenOutOfRange {
                token: anchor,
                index: history.len() - 1,
                vocab,
            }
            .into());
        }
        // The whole trained block runs even when fewer proposals are wanted: block rows see each other.
        self.block(anchor)?;
        let dev = &*self.target.dev;
        let Some((sc, _)) = self.io.as_ref() else {
            return Err(not_attention().into());
        };
        let (mult, cap) = (
            self.config.output_multiplier,
            self.config.final_logit_softcapping,
        );
        // A positive multiplier and the soft cap keep each row's argmax.
        if chooser.plain_argmax() && mult > 0.0 {
            argmax::launch_rows(dev, sc.logits.ptr, m, vocab, sc.argmax.ptr)?;
            if let Some(ids) = argmax::read_ids(dev, sc.argmax.ptr, m)? {
                return Ok(ids);
            }
        }
        let mut logits = vec![0.0f32; m * vocab];
        dtoh(dev, &mut logits, sc.logits.ptr)?;
        if mult != 1.0 {
            logits.iter_mut().for_each(|l| *l *= mult);
        }
        if let Some(c) = cap {
            logits.iter_mut().for_each(|l| *l = c * (*l / c).tanh());
        }
        let mut context = history.to_vec();
        for row in logits.chunks_exact(vocab) {
            let token = chooser.choose(row, &context);
            context.push(token);
        }
        Ok(context.split_off(history.len()))
    }
}

/// The decoder layers' config in the target's terms: Qwen3 layers (plain RMSNorm, q/k norm, full
/// rotate-half RoPE, SwiGLU), no attention gate, no bias.
fn layer_config(c: &DflashConfig, t: &CudaModel, prefix: &str) -> ModelConfig {
    ModelConfig {
        architecture: "DFlashDraftModel".into(),
        family: Family::Qwen3,
        vocab_size: t.vocab,
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        num_hidden_layers: c.num_hidden_layers,
        num_attention_heads: c.num_attention_heads,
        num_key_value_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        rms_norm_eps: c.rms_norm_eps,
        rope_theta: c.rope_theta,
        partial_rotary_factor: 1.0,
        max_position_embeddings: t.context,
        tie_word_embeddings: false,
        attention_bias: false,
        attn_output_gate: false,
        layer_types: vec![LayerKind::FullAttention; c.num_hidden_layers],
        linear: None,
        moe: None,
        mtp_num_hidden_layers: 0,
        tensor_prefix: prefix.into(),
        eos_token_ids: Vec::new(),
    }
}

fn attn_bufs(sc: &Scratch, k: &DBuf, v: &DBuf) -> AttnBufs {
    AttnBufs {
        qkv: sc.big.ptr,
        q: sc.q.ptr,
        gate: sc.gate.ptr,
        k_cache: k.ptr,
        v_cache: v.ptr,
        start: sc.start.ptr,
        part_m: sc.part_m.ptr,
        part_l: sc.part_l.ptr,
        part_acc: sc.part_acc.ptr,
        out: sc.mid.ptr,
        rope: crate::ops::Rope::Compute,
    }
}

fn not_attention() -> CudaError {
    CudaError::Unsupported {
        what: "a DFlash layer that is not a dense full-attention layer, or a pass without scratch"
            .into(),
    }
}
