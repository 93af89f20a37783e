//! The checkpoint's multi-token-prediction head (`mtp.*`, Qwen3.5 / Qwen3-Next) on the GPU: the same
//! function as the host drafter `drafters::MtpHead`, run with the target's kernels next to the target.
//!
//! Row t takes the target's hidden h_t *after its final norm* and the token x_{t+1} that followed it:
//! u = fc([norm_e(embed(x_{t+1})); norm_h(h_t)]), then the MTP decoder layer(s) (full-attention gated
//! layers, run by `CudaModel::layer`) at rope position t over the head's own KV cache, then `mtp.norm`;
//! the target's LM head turns that into logits for x_{t+2}. Drafting chains the head on its own normed
//! output as the next h. The fc matrix [H, 2H] is split at upload into its two input halves, so
//! u = fc_h·norm_h(h) + fc_e·norm_e(e) needs no concatenated row (the same dot product, summed in
//! another order). The embedding table and LM head are the target's buffers, shared, not copied.
//!
//! Traffic per round: observe uploads the verified taps rows [n, H] and n token ids; the last row's
//! logits (the first draft of the next round) stay on the device until propose; each further drafted
//! token uploads its id and position. Each drafted token then copies one [vocab] logits row back for
//! the loop's `Chooser` (a draw whose q the loop keeps for rejection sampling), or, when the chooser is
//! a plain argmax (`Chooser::plain_argmax`), only the argmax taken on the device (argmax.rs). On a GPU the draft step and verify-sized observes (up to
//! `gemv_max_rows`, at most 17 rows, one graph per row count) replay captured CUDA graphs; prefill-sized
//! observes launch their kernels directly.
//!
//! Drafting over a reduced vocabulary (`with_draft_vocab`, the engine's policy `drafters::mtp::draft_vocab`):
//! the LM head GEMV covers the first N rows and the logits row's tail stays -inf, as on the host head.
//!
//! Invariant: KV rows 0..position() hold verified pairs; rows a proposal wrote past it are overwritten by
//! the next observe. `last` holds the normed output of the last committed row and the scratch of pass
//! `first` its logits, both valid iff `first` is set (cleared by rewind and reset).

use std::cell::Cell;
use std::sync::Arc;

use cudarc::driver::CudaGraph;
use drafters::{Chooser, Drafter};
use families::{BackendError, ModelError, Tap};
use model_io::{Checkpoint, LayerKind};

use crate::adapter::{grown_capacity, INITIAL_CAPACITY};
use crate::argmax;
use crate::buf::{dtod, dtoh, htod, DBuf};
use crate::error::CudaError;
use crate::model::{load_layer, CudaModel, LayerW};
use crate::ops::{self, NormW, ATT_SPLITS_FINE};
use crate::state::{attention_caches, copy_cache_rows, LayerState, Scratch, Widths};
use crate::weights::{Init, Mat, Source, Uploader};

/// A captured graph owned by one drafter, so the drafter is `Send` as the session's drafter box
/// requires (a session may move between threads).
pub(crate) struct OwnedGraph(pub(crate) CudaGraph);

// SAFETY: CUDA graph handles are not bound to a thread; the driver requires only that calls on one graph
// are serialized. `OwnedGraph` is not `Sync` and is reached only through `&mut` of its drafter (CudaMtp,
// CudaDflash), so its calls are serialized; `CudaGraph::launch` binds the context to the calling thread first.
unsafe impl Send for OwnedGraph {}

/// The head's weights (the target's embedding and LM head are read through `target`).
struct Weights {
    target: Arc<CudaModel>,
    fc_e: Mat, // [hidden, hidden]: fc columns 0..H, applied to the normed embedding
    fc_h: Mat, // [hidden, hidden]: fc columns H..2H, applied to the normed target hidden
    pre_fc_norm_embedding: DBuf,
    pre_fc_norm_hidden: DBuf,
    layers: Vec<LayerW>,
    norm: DBuf,
    /// The LM head's first `draft_vocab` rows when drafting over fewer ids than the vocabulary
    /// (`with_draft_vocab`; a view of the target's buffer, kept alive by `target`).
    draft_head: Option<Mat>,
}

/// Scratch of passes of up to `sc.rows` rows, with the head's own inputs.
struct Io {
    sc: Scratch,
    emb: DBuf, // [rows, hidden] embeddings of the next tokens
    hid: DBuf, // [rows, hidden] uploaded target hidden rows
}

impl Io {
    fn new(t: &CudaModel, w: &Widths, rows: usize, row_splits: usize) -> Result<Self, CudaError> {
        Ok(Io {
            sc: Scratch::new(&t.dev, w, rows, row_splits)?,
            emb: DBuf::f32s(&t.dev, rows * t.hidden)?,
            hid: DBuf::f32s(&t.dev, rows * t.hidden)?,
        })
    }
}

/// Rows of observes that run in the fixed `small` scratch (and may be graphed): verify-sized.
const SMALL_ROWS: usize = 17;

/// One pass of the head, by the scratch it runs in.
#[derive(Clone, Copy, Debug)]
enum Pass {
    /// A chained draft row: hidden and output `work`, scratch `one`.
    Step,
    /// `Step` fed on the device (a plain-argmax proposal): its argmax becomes the next step's token and
    /// position + 1, and goes to the next of the `feed` slots.
    StepFed,
    /// An observe of m <= `small.sc.rows` rows: hidden `small.hid`, output `last`.
    Small(usize),
    /// An observe of m rows in `many`: hidden `many.hid`, output `last`.
    Many(usize),
}

impl Weights {
    /// Sets the logits row of `io` past the draft vocabulary to -inf (the head's GEMV writes only the
    /// ids before it). Nothing to do when drafting over every id.
    fn fill_draft_tail(&self, io: &Io) -> Result<(), CudaError> {
        let Some(head) = &self.draft_head else {
            return Ok(());
        };
        let tail = vec![f32::NEG_INFINITY; self.target.vocab - head.rows];
        htod(&self.target.dev, io.sc.logits.f32_at(head.rows), &tail)
    }
}

/// The MTP head of a [`CudaModel`]'s checkpoint, on the same device, as a [`Drafter`].
pub struct CudaMtp {
    /// Captured passes (GPU only; all dropped whenever the KV buffers move): slot 0 the draft step,
    /// slot m an observe of m rows in `small`. First, so they are destroyed before the buffers they use.
    graphs: Vec<Option<OwnedGraph>>,
    /// Why a capture failed (then every pass uses direct launches).
    graph_error: Option<String>,
    w: Weights,
    widths: Widths,
    /// Per MTP layer, its KV cache of `capacity` positions.
    kv: Vec<LayerState>,
    capacity: usize,
    /// Scratch of one-row draft steps (fixed: the step graph holds its addresses).
    one: Io,
    /// Scratch of observes of up to `small.sc.rows` rows (<= gemv_max_rows, verify-sized; fixed: their
    /// graphs hold its addresses).
    small: Io,
    /// Scratch of larger observes (prefill), grown on demand, never graphed.
    many: Option<Io>,
    /// [hidden] normed output of the last committed row.
    last: DBuf,
    /// [hidden] the chained hidden while proposing (input and output of each draft step).
    work: DBuf,
    committed: usize,
    /// The observe pass whose scratch holds the last committed row's logits (the first draft).
    first: Option<Pass>,
    /// Where fed draft steps leave their [token, refused] pairs.
    feed: DraftSlots,
}

/// Most drafts of a fed proposal (larger blocks draft step by step).
const FED_DRAFTS: usize = 32;

/// [FED_DRAFTS] [token, refused] pairs in host memory the device writes (pinned and mapped on a GPU), and
/// the device counter of the next one.
struct DraftSlots {
    pinned: Option<cudarc::driver::PinnedHostSlice<i32>>,
    _host: Box<[i32; 2 * FED_DRAFTS]>,
    /// The pairs' address as the kernels see it.
    slots: u64,
    counter: DBuf,
}

// SAFETY: the pinned slots are reached only through `&mut` of their drafter, as `OwnedGraph`.
unsafe impl Send for DraftSlots {}

impl DraftSlots {
    fn new(dev: &crate::device::CudaDevice) -> Result<Self, CudaError> {
        let mut host = Box::new([0i32; 2 * FED_DRAFTS]);
        let counter = DBuf::zeros(dev, 4)?;
        let Ok(gpu) = dev.gpu() else {
            let slots = host.as_mut_ptr() as u64;
            return Ok(DraftSlots {
                pinned: None,
                _host: host,
                slots,
                counter,
            });
        };
        crate::buf::bind(dev)?;
        use cudarc::driver::sys;
        // SAFETY: written by the kernels, read after the stream synchronised.
        let mut pinned = unsafe {
            gpu.ctx
                .alloc_pinned_with_flags::<i32>(2 * FED_DRAFTS, sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .map_err(CudaError::driver("allocating the MTP draft slots"))?;
        let ptr = pinned
            .as_mut_ptr()
            .map_err(CudaError::driver("the MTP draft slots"))?;
        let mut slots: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live page-locked allocation made with CU_MEMHOSTALLOC_DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut slots, ptr.cast(), 0) }
            .result()
            .map_err(CudaError::driver("mapping the MTP draft slots"))?;
        Ok(DraftSlots {
            pinned: Some(pinned),
            _host: host,
            slots,
            counter,
        })
    }

    /// Pair j, once the device work that wrote it completed.
    fn pair(&self, j: usize) -> Result<(u32, bool), CudaError> {
        let p = match &self.pinned {
            Some(pinned) => pinned
                .as_ptr()
                .map_err(CudaError::driver("the MTP draft slots"))?,
            None => self.slots as *const i32,
        };
        // SAFETY: 2 * FED_DRAFTS i32 live as long as `self`; the writes completed (the caller synchronised).
        let pair = unsafe {
            [
                p.add(2 * j).read_volatile(),
                p.add(2 * j + 1).read_volatile(),
            ]
        };
        Ok((pair[0] as u32, pair[1] != 0))
    }
}

impl CudaMtp {
    /// Uploads `mtp.*` of `ck` next to `target` (loaded from the same checkpoint, same weight format);
    /// `Ok(None)` when the checkpoint carries no head.
    pub fn load(target: &Arc<CudaModel>, ck: &Checkpoint) -> Result<Option<Self>, CudaError> {
        let c = &ck.config;
        if !ck.has_mtp || c.mtp_num_hidden_layers == 0 {
            return Ok(None);
        }
        let (h, t) = (c.hidden_size, &**target);
        if h != t.hidden || c.vocab_size != t.vocab {
            return Err(ModelError::StateMismatch(format!(
                "the MTP head of {} (hidden {h}, vocab {}) loaded onto a target with hidden {}, vocab {}",
                ck.dir.display(),
                c.vocab_size,
                t.hidden,
                t.vocab
            ))
            .into());
        }
        let up = Uploader {
            dev: &t.dev,
            source: Source::Checkpoint(ck),
            format: t.opts.weights,
            tensor_cores: t.opts.tensor_core_gemv,
            counter: Cell::new(0),
        };
        let mut widths = t.widths;
        let mut layers = Vec::with_capacity(c.mtp_num_hidden_layers);
        for j in 0..c.mtp_num_hidden_layers {
            let lp = format!("mtp.layers.{j}.");
            // A sparse-MoE MTP layer (Qwen3-Next) runs the target's MoE kernels, as the host head does.
            let moe = c
                .moe
                .as_ref()
                .filter(|_| ck.tensors.contains(&format!("{lp}mlp.gate.weight")));
            let kind = LayerKind::FullAttention;
            layers.push(load_layer(
                &up,
                c,
                &lp,
                kind,
                moe,
                t.zero_centred,
                &mut widths,
            )?);
        }
        let vector = |name: &str| up.vector(name, &[h], Init::Norm);
        let w = Weights {
            fc_e: up.matrix_columns("mtp.fc.weight", h, 2 * h, 0..h)?,
            fc_h: up.matrix_columns("mtp.fc.weight", h, 2 * h, h..2 * h)?,
            pre_fc_norm_embedding: vector("mtp.pre_fc_norm_embedding.weight")?,
            pre_fc_norm_hidden: vector("mtp.pre_fc_norm_hidden.weight")?,
            norm: vector("mtp.norm.weight")?,
            layers,
            draft_head: None,
            target: target.clone(),
        };
        let capacity = INITIAL_CAPACITY.min(t.context).max(1);
        // Small observes stay on the batch-invariant GEMV path (no cuBLAS inside a graph).
        let small_rows = t.opts.gemv_max_rows.clamp(1, SMALL_ROWS);
        let small_splits = (1..=small_rows)
            .map(|m| m * ops::att_splits(m, t.opts.gemv_max_rows))
            .max()
            .unwrap_or(ATT_SPLITS_FINE);
        let head = CudaMtp {
            kv: attention_caches(&t.dev, &w.layers, capacity)?,
            capacity,
            one: Io::new(t, &widths, 1, ATT_SPLITS_FINE)?,
            small: Io::new(t, &widths, small_rows, small_splits)?,
            many: None,
            last: DBuf::f32s(&t.dev, h)?,
            work: DBuf::f32s(&t.dev, h)?,
            committed: 0,
            first: None,
            feed: DraftSlots::new(&t.dev)?,
            // Slot 0 the draft step, 1..=small_rows the small observes, then the fed draft step.
            graphs: (0..=small_rows + 1).map(|_| None).collect(),
            graph_error: None,
            widths,
            w,
        };
        t.dev.synchronize()?;
        Ok(Some(head))
    }

    /// Drafts over the first `tokens` ids only (clamped to 1..=vocab), as `MtpHead::with_draft_vocab`:
    /// the head's LM head GEMV reads that many rows and every other id's logit is -inf, so a greedy
    /// draft is the argmax among them and a sampled draft's q the shaped distribution over them. The
    /// target judges every proposal, so what is generated does not change.
    pub fn with_draft_vocab(mut self, tokens: usize) -> Result<Self, CudaError> {
        let t = self.w.target.clone();
        let tokens = tokens.clamp(1, t.vocab);
        if tokens == t.vocab {
            return Ok(self);
        }
        let head = t.lm_head.as_ref().unwrap_or(&t.embed);
        self.w.draft_head = Some(head.row_prefix(tokens));
        self.graphs.iter_mut().for_each(|g| *g = None);
        for io in [Some(&self.one), Some(&self.small), self.many.as_ref()]
            .into_iter()
            .flatten()
        {
            self.w.fill_draft_tail(io)?;
        }
        Ok(self)
    }

    /// Whether draft steps replay a captured graph: `Ok(true)` once captured, `Ok(false)` before the
    /// first step or without a GPU, `Err(reason)` when a capture failed (direct launches from then on).
    pub fn graph_status(&self) -> Result<bool, String> {
        match &self.graph_error {
            Some(e) => Err(e.clone()),
            None => Ok(self.graphs.first().is_some_and(|g| g.is_some())),
        }
    }

    /// Rewinds to `start` (at most the committed position) and observes verified rows (hidden[j] [H],
    /// next_tokens[j]) at positions start..start+n; returns the last row's logits, the first draft of
    /// the next proposal. `observe` is this at the committed position; parity tests compare it with
    /// `MtpHead::forward`.
    pub fn forward(
        &mut self,
        hidden: &[f32],
        next_tokens: &[u32],
        start: usize,
    ) -> Result<Vec<f32>, CudaError> {
        if start > self.committed {
            return Err(ModelError::PositionMismatch {
                expected: self.committed,
                got: start,
            }
            .into());
        }
        // Until the rows are in, there is no valid first draft (a failed run leaves none).
        self.committed = start;
        self.first = None;
        let pass = self.run_rows(hidden, next_tokens, start)?;
        self.committed = start + next_tokens.len();
        self.first = Some(pass);
        let mut logits = vec![0.0f32; self.w.target.vocab];
        dtoh(
            &self.w.target.dev,
            &mut logits,
            self.io(pass)?.sc.logits.ptr,
        )?;
        Ok(logits)
    }

    /// Observes like `forward` and leaves the last row's logits on the device for `propose`.
    fn observe_rows(
        &mut self,
        hidden: &[f32],
        next_tokens: &[u32],
        start: usize,
    ) -> Result<(), CudaError> {
        self.committed = start;
        self.first = None;
        let pass = self.run_rows(hidden, next_tokens, start)?;
        self.committed = start + next_tokens.len();
        self.first = Some(pass);
        Ok(())
    }

    /// Uploads and runs rows at start..start+n in passes of at most `max_pass_rows` rows; the last
    /// row's normed output goes to `last`. Returns the last pass, whose scratch holds its logits.
    fn run_rows(
        &mut self,
        hidden: &[f32],
        next_tokens: &[u32],
        start: usize,
    ) -> Result<Pass, CudaError> {
        let n = next_tokens.len();
        let t = self.w.target.clone();
        let hd = t.hidden;
        if n == 0 || hidden.len() != n * hd {
            return Err(ModelError::EmptyInput.into());
        }
        for (index, &token) in next_tokens.iter().enumerate() {
            if token as usize >= t.vocab {
                return Err(ModelError::TokenOutOfRange {
                    token,
                    index,
                    vocab: t.vocab,
                }
                .into());
            }
        }
        self.ensure(start, n)?;
        let dev = &*t.dev;
        let pass_rows = t.opts.max_pass_rows.max(1);
        let mut last = Pass::Step;
        let mut p0 = 0;
        while p0 < n {
            let m = (n - p0).min(pass_rows);
            let pass = if m <= self.small.sc.rows {
                Pass::Small(m)
            } else {
                self.fit_many(m)?;
                Pass::Many(m)
            };
            let io = self.io(pass)?;
            let ids: Vec<i32> = next_tokens[p0..p0 + m].iter().map(|&x| x as i32).collect();
            htod(dev, io.sc.ids.ptr, &ids)?;
            htod(dev, io.sc.start.ptr, &[(start + p0) as i32])?;
            htod(dev, io.hid.ptr, &hidden[p0 * hd..(p0 + m) * hd])?;
            self.launch(pass)?;
            p0 += m;
            last = pass;
        }
        Ok(last)
    }

    /// The drafted token of the logits row in the scratch of `pass`: the device argmax for a plain-
    /// argmax chooser (8 bytes back), else the chooser's pick from the copied row.
    fn choose_from(
        &self,
        pass: Pass,
        chooser: &mut dyn Chooser,
        context: &[u32],
    ) -> Result<u32, CudaError> {
        let t = &*self.w.target;
        let sc = &self.io(pass)?.sc;
        if chooser.plain_argmax() {
            argmax::launch_rows(&t.dev, sc.logits.ptr, 1, t.vocab, sc.argmax.ptr)?;
            if let Some(ids) = argmax::read_ids(&t.dev, sc.argmax.ptr, 1)? {
                return Ok(ids[0]);
            }
        }
        let mut logits = vec![0.0f32; t.vocab];
        dtoh(&t.dev, &mut logits, sc.logits.ptr)?;
        Ok(chooser.choose(&logits, context))
    }

    /// The scratch `pass` runs in.
    fn io(&self, pass: Pass) -> Result<&Io, CudaError> {
        match pass {
            Pass::Step | Pass::StepFed => Ok(&self.one),
            Pass::Small(_) => Ok(&self.small),
            Pass::Many(_) => self.many.as_ref().ok_or(CudaError::Unsupported {
                what: "an MTP pass without its scratch".into(),
            }),
        }
    }

    /// Runs `pass` (inputs already uploaded): replays its graph where it has one (captured on first
    /// use on a GPU with graphs on), else launches its kernels directly.
    fn launch(&mut self, pass: Pass) -> Result<(), CudaError> {
        let slot = match pass {
            Pass::Step => Some(0),
            Pass::Small(m) => Some(m),
            Pass::StepFed => Some(self.graphs.len() - 1),
            Pass::Many(_) => None,
        };
        let graphs_on = self.w.target.graph_ok() && self.graph_error.is_none();
        if let Some(slot) = slot.filter(|_| graphs_on) {
            if self.graphs.get(slot).is_some_and(|g| g.is_none()) {
                match self.capture(pass) {
                    Ok(Some(g)) => self.graphs[slot] = Some(OwnedGraph(g)),
                    Ok(None) => self.graph_error = Some("capture produced an empty graph".into()),
                    Err(e) => self.graph_error = Some(format!("{pass:?}: {e}")),
                }
            }
            if let Some(Some(g)) = self.graphs.get(slot) {
                return g.0.launch().map_err(CudaError::driver(format!(
                    "launching the MTP graph {pass:?}"
                )));
            }
        }
        self.body(pass)
    }

    /// The device work of `pass`: what its graph holds.
    fn body(&mut self, pass: Pass) -> Result<(), CudaError> {
        let CudaMtp {
            w,
            kv,
            one,
            small,
            many,
            last,
            work,
            feed,
            ..
        } = self;
        if let Pass::StepFed = pass {
            rows(w, kv, one, work.ptr, 1, work.ptr)?;
            let t = &*w.target;
            let next = (one.sc.ids.ptr, one.sc.start.ptr);
            let (logits, pair) = (one.sc.logits.ptr, one.sc.argmax.ptr);
            return argmax::launch_feeding(
                &t.dev,
                logits,
                t.vocab,
                pair,
                next,
                feed.slots,
                feed.counter.ptr,
            );
        }
        let (io, hidden, out, m) = match pass {
            Pass::Step | Pass::StepFed => (&*one, work.ptr, work.ptr, 1),
            Pass::Small(m) => (&*small, small.hid.ptr, last.ptr, m),
            Pass::Many(m) => {
                let io = many.as_ref().ok_or(CudaError::Unsupported {
                    what: "an MTP pass without its scratch".into(),
                })?;
                (io, io.hid.ptr, last.ptr, m)
            }
        };
        rows(w, kv, io, hidden, m, out)
    }

    /// Captures `pass` into a graph (nothing runs during capture).
    fn capture(&mut self, pass: Pass) -> Result<Option<CudaGraph>, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let dev = self.w.target.dev.clone();
        crate::note_capture();
        let stream = &dev.gpu()?.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("beginning MTP graph capture"))?;
        let body = self.body(pass);
        // Always end the capture, also after a failed body, so the stream leaves capture mode.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(CudaError::driver("ending MTP graph capture"));
        body?;
        graph
    }

    /// Makes the multi-row scratch hold passes of m rows (as `CudaModel::pass` sizes its own).
    fn fit_many(&mut self, m: usize) -> Result<(), CudaError> {
        let t = &*self.w.target;
        let row_splits = m * ops::att_splits(m, t.opts.gemv_max_rows);
        let fits = self
            .many
            .as_ref()
            .is_some_and(|io| io.sc.rows >= m && io.sc.row_splits >= row_splits);
        if !fits {
            let rows = m.max(self.many.as_ref().map_or(0, |io| io.sc.rows));
            let rs = row_splits.max(self.many.as_ref().map_or(0, |io| io.sc.row_splits));
            self.many = None;
            let io = Io::new(t, &self.widths, rows, rs)?;
            self.w.fill_draft_tail(&io)?;
            self.many = Some(io);
        }
        Ok(())
    }

    /// Makes the KV caches hold positions start..start+n, keeping rows 0..start (capacity doubles, as
    /// the target state's; the graphs hold the old addresses, so they are dropped).
    fn ensure(&mut self, start: usize, n: usize) -> Result<(), CudaError> {
        let t = &*self.w.target;
        if start + n > t.context {
            return Err(ModelError::ContextOverflow {
                start,
                n,
                context: t.context,
            }
            .into());
        }
        let Some(capacity) = grown_capacity(self.capacity, start + n, t.context) else {
            return Ok(());
        };
        let kv = attention_caches(&t.dev, &self.w.layers, capacity)?;
        copy_cache_rows(&t.dev, &kv, &self.kv, start)?;
        self.graphs.iter_mut().for_each(|g| *g = None);
        self.kv = kv;
        self.capacity = capacity;
        Ok(())
    }

    /// One chained draft row at `position`: token `token`, hidden `work` (replaced by the row's normed
    /// output); its logits stay in the scratch of `Pass::Step`. KV capacity must already cover `position`.
    fn step(&mut self, token: u32, position: usize) -> Result<(), CudaError> {
        let t = self.w.target.clone();
        let dev = &*t.dev;
        if token as usize >= t.vocab {
            return Err(ModelError::TokenOutOfRange {
                token,
                index: 0,
                vocab: t.vocab,
            }
            .into());
        }
        htod(dev, self.one.sc.ids.ptr, &[token as i32])?;
        htod(dev, self.one.sc.start.ptr, &[position as i32])?;
        self.launch(Pass::Step)
    }

    /// k plain-argmax drafts with the steps fed on the device: the first draft's argmax (of `first`'s
    /// logits) and each fed step's become the next step's token and position, all k queued before one
    /// wait. The same kernels on the same inputs as `step` by `step`, so the same drafts and KV rows.
    /// None when a row is refused (NaN, +inf, nothing above -inf): its logits must reach the chooser.
    fn propose_fed(&mut self, first: Pass, k: usize) -> Result<Option<Vec<u32>>, CudaError> {
        let t = self.w.target.clone();
        let dev = &*t.dev;
        htod(dev, self.feed.counter.ptr, &[0i32])?;
        // The first fed step runs at `committed`: the feeding adds one.
        htod(dev, self.one.sc.start.ptr, &[self.committed as i32 - 1])?;
        let sc = &self.io(first)?.sc;
        let next = (self.one.sc.ids.ptr, self.one.sc.start.ptr);
        let (slots, counter) = (self.feed.slots, self.feed.counter.ptr);
        argmax::launch_feeding(
            dev,
            sc.logits.ptr,
            t.vocab,
            sc.argmax.ptr,
            next,
            slots,
            counter,
        )?;
        for _ in 1..k {
            self.launch(Pass::StepFed)?;
        }
        dev.synchronize()?;
        let mut drafts = Vec::with_capacity(k);
        for j in 0..k {
            let (token, refused) = self.feed.pair(j)?;
            if refused {
                return Ok(None);
            }
            drafts.push(token);
        }
        Ok(Some(drafts))
    }
}

impl Drafter for CudaMtp {
    fn name(&self) -> &'static str {
        "mtp (cuda)"
    }

    fn taps(&self) -> Vec<Tap> {
        vec![Tap::FinalHidden]
    }

    fn reset(&mut self) {
        self.committed = 0;
        self.first = None;
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
        // The first draft belonged to the old last row; the next observe recomputes it.
        self.first = None;
        Ok(())
    }

    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        let hidden = taps.first().ok_or(ModelError::EmptyInput)?;
        let hd = self.w.target.hidden;
        if hidden.len() < n * hd || next_tokens.len() != n {
            return Err(ModelError::EmptyInput.into());
        }
        self.observe_rows(&hidden[..n * hd], next_tokens, self.committed)?;
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        // The last committed row predicts the token after history's last: valid only when observe
        // covered every row before it.
        let Some(first) = self
            .first
            .filter(|_| k > 0 && self.committed + 1 == history.len())
        else {
            return Ok(Vec::new());
        };
        if k > 1 {
            self.ensure(self.committed, k - 1)?;
            let dev = self.w.target.dev.clone();
            dtod(&dev, self.work.ptr, self.last.ptr, self.last.bytes)?;
            if chooser.plain_argmax() && k <= FED_DRAFTS {
                if let Some(drafts) = self.propose_fed(first, k)? {
                    return Ok(drafts);
                }
                // A refused row: step by step, so the chooser sees its logits (the same KV rows rewritten).
                dtod(&dev, self.work.ptr, self.last.ptr, self.last.bytes)?;
            }
        }
        let mut context = history.to_vec();
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let pass = if i == 0 { first } else { Pass::Step };
            let token = self.choose_from(pass, chooser, &context)?;
            out.push(token);
            context.push(token);
            if i + 1 == k {
                break;
            }
            // Chain: the head's own output stands in for the target hidden of the drafted position.
            self.step(token, self.committed + i)?;
        }
        Ok(out)
    }
}

/// The head over m rows at positions `sc.start`..: ids in `io.sc.ids`, target hidden rows at `hidden`
/// [m, H]. Leaves the last row's normed output at `out` [H] and its logits in `io.sc.logits`. `hidden`
/// and `out` may be the same buffer (the input is consumed before the output is written).
fn rows(
    w: &Weights,
    kv: &mut [LayerState],
    io: &Io,
    hidden: u64,
    m: usize,
    out: u64,
) -> Result<(), CudaError> {
    let t = &*w.target;
    let dev = &*t.dev;
    let (sc, gm, h) = (&io.sc, t.opts.gemv_max_rows, t.hidden);
    ops::embed(dev, &t.embed, sc.ids.ptr, io.emb.ptr, m)?;
    // The head's own norms are zero-centred, as `MtpHead` loads them (Qwen3.5 / Qwen3-Next); its
    // decoder layer uses the target's convention, as the target's layers.
    let norm = |v: &DBuf| NormW {
        w: v.ptr,
        eps: t.eps,
        zero_centred: true,
    };
    // x = fc_h·norm_h(h_t) + fc_e·norm_e(embed(x_{t+1}))   [m, H]
    let norm_h = norm(&w.pre_fc_norm_hidden);
    ops::linear_normed(
        dev, &w.fc_h, hidden, norm_h, sc.h.ptr, sc.x.ptr, m, sc.xb.ptr, gm,
    )?;
    let norm_e = norm(&w.pre_fc_norm_embedding);
    ops::rmsnorm(
        dev,
        io.emb.ptr,
        norm_e.w,
        sc.h.ptr,
        m,
        h,
        norm_e.eps,
        norm_e.zero_centred,
    )?;
    ops::linear(dev, &w.fc_e, sc.h.ptr, sc.x.ptr, m, true, sc.xb.ptr, gm)?;
    for (l, ls) in w.layers.iter().zip(kv.iter_mut()) {
        t.layer(l, ls, None, crate::state::StepIo::InPlace, sc, m, &mut None)?;
    }
    // Only the last row feeds the chain and the logits.
    let last = sc.x.f32_at((m - 1) * h);
    let n = norm(&w.norm);
    ops::rmsnorm(dev, last, n.w, out, 1, h, n.eps, n.zero_centred)?;
    let head = w
        .draft_head
        .as_ref()
        .unwrap_or_else(|| t.lm_head.as_ref().unwrap_or(&t.embed));
    ops::linear(dev, head, out, sc.logits.ptr, 1, false, sc.xb.ptr, gm)
}
