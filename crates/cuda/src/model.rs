//! The Qwen3 / Qwen3.5 decoder on the GPU: weights (see `weights.rs`) and their upload from a checkpoint
//! or a synthetic shape. The forward pass is in `forward.rs`.
//!
//! Layer by layer, as the CPU engine (`families::Transformer`): pre-norm residual blocks
//! `x += mixer(norm₁(x)); x += mlp(norm₂(x))`, the mixer being gated attention with partial RoPE over the
//! KV cache or a Gated DeltaNet; then the final norm and the LM head (tied to the embeddings or not).
//! Qwen3-Next: its fused head-grouped GDN projections are re-laid out at upload into [qkv ; z ; b ; a]
//! (the CPU engine's run list), and its sparse-MoE feed-forward runs on the device (`moe.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use families::layers::gdn::{fused_projection_runs, FusedPart};
use model_io::{Checkpoint, LayerKind, ModelConfig, MoeConfig};

use crate::buf::DBuf;
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::moe::{load_moe, MoeW};
use crate::ops::{
    AttnShape, GdnShape, ATT_MAX_D, ATT_SPLITS_FINE, CONV_MAX_K, GDN_MAX_DK, GDN_MAX_DV,
};
use crate::state::{CudaState, LayerState, Scratch, Widths};
use crate::weights::{Init, Mat, Source, Uploader, WeightFormat};

/// Load-time choices.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    pub weights: WeightFormat,
    /// Row counts up to this run the batch-invariant matrix-vector kernel with f32 activations; larger
    /// passes (prefill) use cuBLAS. `usize::MAX` keeps every pass on the f32-activation kernel.
    pub gemv_max_rows: usize,
    /// Capture one-row decode steps in a CUDA graph.
    pub graphs: bool,
    /// Also replay verify blocks (2..=16 rows) from CUDA graphs (`verify_graph.rs`). Default from
    /// `TURBOSPARK_VERIFY_GRAPHS` (on unless `0`).
    pub verify_graphs: bool,
    /// Run every GEMV of up to `gemv_max_rows` rows, decode rows included, on the tensor-core kernel
    /// (linear_mma.cu) instead of the FMA kernel (linear.cu). One kernel serves both so verify rows equal
    /// decode rows bit for bit; which one is a per-load trade measured on the H200 (qwen35-4b shape,
    /// greedy verify rounds): FMA 3.56 / 3.9 / 4.6 ms for 1 / 2 / 4 rows, tensor cores 4.51 /
    /// 5.1 / 5.4 ms, but 8.3 ms against FMA's 11.5 for 16 rows. The engine turns it on for checkpoints
    /// whose drafter is DFlash (16-row blocks) and not MTP.
    pub tensor_core_gemv: bool,
    /// Rows per internal pass of a long forward (bounds scratch memory; the result depends on it only
    /// to rounding, through the key splits of tensor-core attention).
    pub max_pass_rows: usize,
    /// Run the GDN recurrence of passes over `gemv_max_rows` rows without a tape (prefill) in chunked
    /// form (gdn_chunk.rs), equal to the step form to rounding; off: the step form everywhere. Default
    /// on unless `TURBOSPARK_GDN_CHUNKED=0`.
    pub gdn_chunked: bool,
    /// Attention of passes over `gemv_max_rows` rows (prefill) on the tensor cores (attention_tc.cu:
    /// bf16 operands, f32 softmax) in layers with bf16 matrices, whose prefill GEMMs already round
    /// activations to bf16; off, or with f32 matrices: the f32 split-K kernels of decode.
    pub attention_tc: bool,
    /// Key splits of tensor-core attention per pass (0: from the pass shape and the SM count).
    pub attention_tc_splits: usize,
    /// Run a decode step's one-row GEMVs between two mixer cores as one persistent kernel each
    /// (`segment.rs`; sm_90, bit for bit the per-GEMV launches' results). Default from
    /// `TURBOSPARK_SEGMENTS` (on unless `0`).
    pub segments: bool,
    /// A pass of at most 64 rows computes its RoPE cos / sin (f64 trig) in its first attention layer
    /// only; the later layers read them back (the same values; state.rs RopePass). Off: every layer
    /// computes them.
    pub rope_table: bool,
    /// Greedy sequential decoding queues each step before the host reads the previous one's token
    /// (`chain.rs`). Default from `TURBOSPARK_CHAIN` (on unless `0`).
    pub chain: bool,
    /// Sampled top-k rows come back as their candidates when the caller can take them
    /// (`Wanted::candidates`, candidates.rs). Default from `TURBOSPARK_CANDIDATES` (on unless `0`).
    pub candidates: bool,
}

impl LoadOptions {
    /// The defaults for a checkpoint: the FMA GEMV is faster for one row and for verify blocks up to
    /// ~4 rows (the MTP head's blocks), the tensor-core GEMV for DFlash's 16-row blocks (H200, 4B
    /// shape: 1 / 4 / 16 rows 3.6 / 4.7 / 11.6 ms against 4.5 / 5.4 / 8.2, `cuda_check --sweep`), so a
    /// checkpoint whose only drafter is DFlash loads the tensor-core family. Per load, so sequential and
    /// speculative runs of a model share one arithmetic.
    pub fn for_checkpoint(ck: &model_io::Checkpoint) -> Self {
        LoadOptions {
            tensor_core_gemv: crate::debug_env::get()
                .tensor_core_gemv
                .unwrap_or(ck.has_dflash && !ck.has_mtp),
            ..LoadOptions::default()
        }
    }
}

impl Default for LoadOptions {
    /// The defaults, with the environment's A/B toggles applied (`debug_env.rs`).
    fn default() -> Self {
        let env = crate::debug_env::get();
        LoadOptions {
            weights: WeightFormat::Bf16,
            // Verify blocks (<= 16 rows) stay on the batch-invariant path, as the CPU engine's matvec.
            gemv_max_rows: 16,
            graphs: env.graphs,
            verify_graphs: env.verify_graphs,
            tensor_core_gemv: env.tensor_core_gemv.unwrap_or(false),
            max_pass_rows: 512,
            gdn_chunked: env.gdn_chunked,
            segments: env.segments,
            attention_tc: true,
            attention_tc_splits: 0,
            rope_table: true,
            chain: env.chain,
            candidates: env.candidates,
        }
    }
}

pub(crate) struct AttnW {
    pub qkv: Mat, // [hq*d*(1+gated) + 2*hkv*d, hidden]
    pub o: Mat,   // [hidden, hq*d]
    pub q_norm: DBuf,
    pub k_norm: DBuf,
    pub inv_freq: DBuf, // [rot_half]
    pub shape: AttnShape,
}

pub(crate) struct GdnW {
    pub proj: Mat,     // [conv_dim + hv*dv + 2*hv, hidden]: [qkv ; z ; b ; a]
    pub conv_w: DBuf,  // [conv_dim, K]
    pub a_log: DBuf,   // [hv]
    pub dt_bias: DBuf, // [hv]
    pub norm_w: DBuf,  // [dv]
    pub out: Mat,      // [hidden, hv*dv]
    pub shape: GdnShape,
}

pub(crate) enum MixerW {
    Attention(AttnW),
    Gdn(GdnW),
}

/// A layer's feed-forward block (one per layer: the dense variant's size costs nothing).
#[allow(clippy::large_enum_variant)]
pub(crate) enum FfnW {
    Dense {
        gate_up: Mat, // [2*inter, hidden]
        down: Mat,    // [hidden, inter]
    },
    Moe(Box<MoeW>),
}

impl FfnW {
    /// Bytes one decode row streams.
    pub fn bytes(&self) -> usize {
        match self {
            FfnW::Dense { gate_up, down } => gate_up.bytes() + down.bytes(),
            FfnW::Moe(m) => m.bytes(),
        }
    }
}

pub(crate) struct LayerW {
    pub input_norm: DBuf,
    pub mixer: MixerW,
    pub post_norm: DBuf,
    pub ffn: FfnW,
}

/// A model resident on the GPU.
pub struct CudaModel {
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) layers: Vec<LayerW>,
    pub(crate) embed: Mat,
    pub(crate) final_norm: DBuf,
    pub(crate) lm_head: Option<Mat>,
    pub(crate) zero_centred: bool,
    /// Decode steps stream the weights with an L2 evict-first hint: models without recurrent layers,
    /// whose per-step re-read set (the KV cache: ~12 MB on the 8B at 640 tokens) then stays in L2. Decode
    /// graph, hint on against off: 8B 4.421 / 4.420 ms against 4.498 / 4.498; the
    /// hybrids lose (4B 2.521 against 2.487, 9B 4.386 against 4.314: their GDN states do not fit L2 anyway).
    pub(crate) stream_evict_first: bool,
    pub(crate) eps: f32,
    pub vocab: usize,
    pub hidden: usize,
    pub context: usize,
    pub(crate) opts: LoadOptions,
    pub(crate) signature: String,
    pub(crate) widths: Widths,
}

static MODEL_IDS: AtomicU64 = AtomicU64::new(1);

impl CudaModel {
    /// Uploads a checkpoint's decoder.
    pub fn load(
        dev: &Arc<CudaDevice>,
        ck: &Checkpoint,
        opts: LoadOptions,
    ) -> Result<Self, CudaError> {
        let zero_centred = ck.config.family.zero_centred_norms();
        Self::build(dev, &ck.config, Source::Checkpoint(ck), opts, zero_centred)
    }

    /// A synthetic model of `config`'s shape with random bf16 weights generated on the GPU
    /// (benchmarks; the checkpoint is never written to disk).
    pub fn random(
        dev: &Arc<CudaDevice>,
        config: &ModelConfig,
        seed: u64,
        opts: LoadOptions,
    ) -> Result<Self, CudaError> {
        let zero_centred = config.family.zero_centred_norms();
        let source = Source::Random { seed, zero_centred };
        Self::build(dev, config, source, opts, zero_centred)
    }

    fn build(
        dev: &Arc<CudaDevice>,
        c: &ModelConfig,
        source: Source<'_>,
        opts: LoadOptions,
        zero_centred: bool,
    ) -> Result<Self, CudaError> {
        let unsupported = |what: String| Err(CudaError::Unsupported { what });
        if c.attention_bias {
            return unsupported("attention_bias = true".into());
        }
        if c.head_dim > ATT_MAX_D || c.head_dim == 0 {
            return unsupported(format!("head_dim {} (max {ATT_MAX_D})", c.head_dim));
        }
        if c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        {
            return unsupported(format!(
                "{} query heads over {} KV heads",
                c.num_attention_heads, c.num_key_value_heads
            ));
        }
        let up = Uploader {
            dev,
            source,
            format: opts.weights,
            tensor_cores: opts.tensor_core_gemv,
            counter: std::cell::Cell::new(0),
        };
        let p = |s: &str| format!("{}{s}", c.tensor_prefix);
        let h = c.hidden_size;
        let mut widths = Widths {
            hidden: h,
            vocab: c.vocab_size,
            max_in: h.max(c.intermediate_size),
            mid: c.intermediate_size,
            big: 2 * c.intermediate_size,
            heads: c.num_attention_heads,
            head_dim: c.head_dim,
            ..Widths::default()
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut kinds = String::new();
        for i in 0..c.num_hidden_layers {
            let kind = c
                .layer_types
                .get(i)
                .copied()
                .unwrap_or(LayerKind::FullAttention);
            kinds.push(match kind {
                LayerKind::FullAttention => 'A',
                LayerKind::LinearAttention => 'L',
            });
            let lp = p(&format!("layers.{i}."));
            let moe = c.moe.as_ref().filter(|m| m.is_moe_layer(i));
            layers.push(load_layer(
                &up,
                c,
                &lp,
                kind,
                moe,
                zero_centred,
                &mut widths,
            )?);
        }
        let embed = up.embedding(&p("embed_tokens.weight"), c.vocab_size, h)?;
        // Tied checkpoints read the embeddings even if an `lm_head.weight` copy is stored (as transformers);
        // under `--quantize` their head is a quantized copy of the table.
        let lm_head = if c.tie_word_embeddings {
            up.tied_head(&p("embed_tokens.weight"), c.vocab_size, h)?
        } else {
            Some(up.matrix(&[("lm_head.weight".to_string(), c.vocab_size)], h)?)
        };
        let final_norm = up.vector(&p("norm.weight"), &[h], Init::Norm)?;
        dev.synchronize()?;
        let id = MODEL_IDS.fetch_add(1, Ordering::Relaxed);
        Ok(CudaModel {
            dev: dev.clone(),
            layers,
            embed,
            final_norm,
            lm_head,
            zero_centred,
            stream_evict_first: !kinds.contains('L'),
            eps: c.rms_norm_eps,
            vocab: c.vocab_size,
            hidden: h,
            context: c.max_position_embeddings,
            opts,
            signature: format!(
                "cuda-model-{id}/{:?}/{h}/{}/{kinds}",
                c.family, c.vocab_size
            ),
            widths,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    pub fn options(&self) -> LoadOptions {
        self.opts
    }

    /// Bytes of all matrices on the GPU (what one decode step streams: every layer's weights and the
    /// LM head; the embedding gather reads one row, so a tied table counts once).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.ffn.bytes()
                    + match &l.mixer {
                        MixerW::Attention(a) => a.qkv.bytes() + a.o.bytes(),
                        MixerW::Gdn(g) => g.proj.bytes() + g.out.bytes(),
                    }
            })
            .sum();
        layers + self.lm_head.as_ref().unwrap_or(&self.embed).bytes()
    }

    /// A fresh state (position 0) with KV capacity `capacity` (at most the model's context).
    pub fn new_state(&self, capacity: usize) -> Result<CudaState, CudaError> {
        let dev = &*self.dev;
        let capacity = capacity.clamp(1, self.context.max(1));
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match &l.mixer {
                MixerW::Attention(a) => {
                    let row_floats = a.shape.hkv * a.shape.d;
                    LayerState::Attention {
                        k: DBuf::f32s(dev, capacity * row_floats)?,
                        v: DBuf::f32s(dev, capacity * row_floats)?,
                        row_floats,
                    }
                }
                MixerW::Gdn(g) => {
                    let s = g.shape;
                    LayerState::Recurrent {
                        s: DBuf::f32s(dev, s.hv * s.dk * s.dv)?,
                        conv: DBuf::f32s(dev, (s.kernel - 1) * s.conv_dim())?,
                        shape: s,
                        alt: None,
                    }
                }
            });
        }
        let one = Scratch::new(dev, &self.widths, 1, ATT_SPLITS_FINE)?;
        dev.synchronize()?;
        Ok(CudaState {
            dev: self.dev.clone(),
            position: 0,
            capacity,
            signature: self.signature.clone(),
            layers,
            tape: None,
            spare_tape: None,
            one,
            many: None,
            widths: self.widths,
            graph: None,
            graph_hidden: None,
            candidates: None,
            last_logits: None,
            graph_error: None,
            chain: None,
            verify_graphs: Vec::new(),
            verify_graph_error: None,
            tape_epoch: 0,
            tap_stage: None,
        })
    }
}

/// One decoder layer under prefix `lp` (e.g. `model.layers.3.`, `mtp.layers.0.`), widening `widths` to
/// what its passes need.
pub(crate) fn load_layer(
    up: &Uploader<'_>,
    c: &ModelConfig,
    lp: &str,
    kind: LayerKind,
    moe: Option<&MoeConfig>,
    zero_centred: bool,
    widths: &mut Widths,
) -> Result<LayerW, CudaError> {
    let h = c.hidden_size;
    let mixer = match kind {
        LayerKind::FullAttention => {
            let a = load_attention(up, c, &format!("{lp}self_attn."), zero_centred)?;
            widths.big = widths.big.max(a.qkv.rows);
            widths.mid = widths.mid.max(a.o.cols);
            widths.q = widths.q.max(a.o.cols);
            widths.max_in = widths.max_in.max(a.o.cols);
            MixerW::Attention(a)
        }
        LayerKind::LinearAttention => {
            let g = load_gdn(up, c, &format!("{lp}linear_attn."))?;
            widths.big = widths.big.max(g.proj.rows);
            widths.mid = widths.mid.max(g.shape.prep_width());
            widths.gdn_chunk = widths
                .gdn_chunk
                .max(crate::gdn_chunk::floats_per_row(g.shape));
            widths.o = widths.o.max(g.out.cols);
            widths.max_in = widths.max_in.max(g.out.cols);
            MixerW::Gdn(g)
        }
    };
    let inter = c.intermediate_size;
    let mp = format!("{lp}mlp.");
    let ffn = match moe {
        Some(m) => FfnW::Moe(Box::new(load_moe(up, c, m, &mp, widths)?)),
        None => FfnW::Dense {
            gate_up: up.matrix(
                &[
                    (format!("{mp}gate_proj.weight"), inter),
                    (format!("{mp}up_proj.weight"), inter),
                ],
                h,
            )?,
            down: up.matrix(&[(format!("{mp}down_proj.weight"), h)], inter)?,
        },
    };
    Ok(LayerW {
        input_norm: up.vector(&format!("{lp}input_layernorm.weight"), &[h], Init::Norm)?,
        mixer,
        post_norm: up.vector(
            &format!("{lp}post_attention_layernorm.weight"),
            &[h],
            Init::Norm,
        )?,
        ffn,
    })
}

fn load_attention(
    up: &Uploader<'_>,
    c: &ModelConfig,
    ap: &str,
    zero_centred: bool,
) -> Result<AttnW, CudaError> {
    let (hq, hkv, d, h) = (
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.hidden_size,
    );
    let gated = c.attn_output_gate;
    let q_rows = hq * d * if gated { 2 } else { 1 };
    let rotary = c.rotary_dim();
    if !rotary.is_multiple_of(2) || rotary > d {
        return Err(CudaError::Unsupported {
            what: format!("rotary dim {rotary} with head_dim {d}"),
        });
    }
    let inv_freq = kernels::rope_inv_freq(rotary, c.rope_theta);
    Ok(AttnW {
        qkv: up.matrix(
            &[
                (format!("{ap}q_proj.weight"), q_rows),
                (format!("{ap}k_proj.weight"), hkv * d),
                (format!("{ap}v_proj.weight"), hkv * d),
            ],
            h,
        )?,
        o: up.matrix(&[(format!("{ap}o_proj.weight"), h)], hq * d)?,
        q_norm: up.vector(&format!("{ap}q_norm.weight"), &[d], Init::Norm)?,
        k_norm: up.vector(&format!("{ap}k_norm.weight"), &[d], Init::Norm)?,
        inv_freq: DBuf::from_host(up.dev, &inv_freq)?,
        shape: AttnShape {
            hq,
            hkv,
            d,
            rot_half: rotary / 2,
            gated,
            eps: c.rms_norm_eps,
            zero_centred,
        },
    })
}

fn load_gdn(up: &Uploader<'_>, c: &ModelConfig, gp: &str) -> Result<GdnW, CudaError> {
    let l = c.linear.as_ref().ok_or_else(|| CudaError::Unsupported {
        what: "a linear-attention layer without linear_* config fields".into(),
    })?;
    let s = GdnShape {
        hk: l.num_key_heads,
        hv: l.num_value_heads,
        dk: l.key_head_dim,
        dv: l.value_head_dim,
        kernel: l.conv_kernel,
    };
    // gdn_rec: 8 threads per value column, one block per head (<= 1024 threads).
    if s.dk > GDN_MAX_DK
        || !s.dv.is_multiple_of(16)
        || s.dv > GDN_MAX_DV
        || s.kernel == 0
        || s.kernel > CONV_MAX_K
        || s.hk == 0
        || !s.hv.is_multiple_of(s.hk)
    {
        return Err(CudaError::Unsupported {
            what: format!(
                "GDN shape (key heads {}, value heads {}, dk {} (max {GDN_MAX_DK}), dv {} (a multiple of 16, max {GDN_MAX_DV}), conv kernel {} (max {CONV_MAX_K}))",
                s.hk, s.hv, s.dk, s.dv, s.kernel
            ),
        });
    }
    let h = c.hidden_size;
    let cd = s.conv_dim();
    let fused = match &up.source {
        Source::Checkpoint(ck) => ck.tensors.contains(&format!("{gp}in_proj_qkvz.weight")),
        Source::Random { .. } => false,
    };
    // Qwen3-Next stores the projections head-grouped and fused; the rows are re-laid out on the host
    // into [qkv ; z ; b ; a], with the CPU engine's run list, so the kernels see one layout.
    let proj = if fused {
        let r = s.hv / s.hk;
        let parts = [
            (
                format!("{gp}in_proj_qkvz.weight"),
                s.hk * (2 * s.dk + 2 * r * s.dv),
            ),
            (format!("{gp}in_proj_ba.weight"), s.hk * 2 * r),
        ];
        let runs: Vec<(usize, usize, usize)> = fused_projection_runs(s.hk, s.hv, s.dk, s.dv)
            .into_iter()
            .map(|run| {
                let part = match run.part {
                    FusedPart::Qkvz => 0,
                    FusedPart::Ba => 1,
                };
                (part, run.first, run.count)
            })
            .collect();
        up.matrix_runs(&parts, &runs, h)?
    } else {
        up.matrix(
            &[
                (format!("{gp}in_proj_qkv.weight"), cd),
                (format!("{gp}in_proj_z.weight"), s.hv * s.dv),
                (format!("{gp}in_proj_b.weight"), s.hv),
                (format!("{gp}in_proj_a.weight"), s.hv),
            ],
            h,
        )?
    };
    Ok(GdnW {
        proj,
        conv_w: up.vector(
            &format!("{gp}conv1d.weight"),
            &[cd, 1, s.kernel],
            Init::Normal(0.2),
        )?,
        a_log: up.vector(&format!("{gp}A_log"), &[s.hv], Init::LogUniform(1.0, 16.0))?,
        dt_bias: up.vector(&format!("{gp}dt_bias"), &[s.hv], Init::One)?,
        norm_w: up.vector(&format!("{gp}norm.weight"), &[s.dv], Init::One)?,
        out: up.matrix(&[(format!("{gp}out_proj.weight"), h)], s.hv * s.dv)?,
        shape: s,
    })
}
