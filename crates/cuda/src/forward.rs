//! `CudaModel::forward(tokens, start, &mut CudaState, &Wanted) -> ForwardOut`, with the CPU engine's
//! semantics (`families::Transformer::forward`): rows at positions start..start+n extend the state by
//! n; logits come back only for the rows asked for, plus any hidden-state taps.
//!
//! Passes: a forward of more than `LoadOptions::max_pass_rows` rows runs as consecutive passes (causal, so the result
//! is the same) to bound scratch memory. Each pass: embed → per layer [norm+mixer projection → mixer
//! core → output projection (+= x) → norm+gate_up+SwiGLU → down (+= x)] → final norm of the rows that
//! need it → LM head in groups of `LOGIT_ROWS` rows (norms and SwiGLU fused into the GEMV for rows that
//! fit its shared-memory stage, separate kernels otherwise, with identical results). The GDN core of a
//! pass over `gemv_max_rows` rows with no tape runs in chunked form (`gdn_chunk.rs`), else step form.
//! Row position `start` lives in device memory (`Scratch::start`), so the one-row decode pass can be
//! captured once as a CUDA graph and replayed at any position: only the token id and position are
//! copied in before each launch, and the logits row is copied out after it.

use families::{Candidates, ForwardOut, ModelError, Rows, Tap, Wanted};

use crate::argmax;
use crate::buf::{dtod, dtoh, htod, DBuf};
use crate::candidates::CandidateBufs;
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::gdn::GdnOut;
use crate::gdn_chunk::{gdn_chunked, use_chunked};
use crate::model::{CudaModel, FfnW, LayerW, MixerW};
use crate::ops::{self, AttnBufs, GdnArgs, GdnCols, NormW};
use crate::profile::{mark, Prof};
use crate::state::{check_signature, CudaState, LayerState, Scratch, StepIo, Tape, LOGIT_ROWS};
use crate::weights::WDtype;

/// What a one-row decode step copies back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Nothing,
    Logits,
    Argmax,
    /// The row's candidates (K), else its logits (candidates.rs).
    Candidates(usize),
}

/// What one pass returns to the host.
pub(crate) struct PassOut {
    pub logits: Vec<f32>,
    /// The logits rows' argmax instead of `logits` (argmax_only, no row refused: argmax.rs).
    pub argmax: Option<Vec<u32>>,
    /// The logits rows' candidates instead of `logits` (`Wanted::candidates`, no row flagged).
    pub candidates: Option<Vec<Candidates>>,
    pub taps: Vec<Vec<f32>>,
}

/// The LM head's logits rows, or their argmax, or their candidates (lm_head_rows).
type HeadOut = (Vec<f32>, Option<Vec<u32>>, Option<Vec<Candidates>>);

/// A graphed decode step's logits row, argmax, candidates and final-hidden row (each when asked for).
type DecodeStepOut = (
    Vec<f32>,
    Option<Vec<u32>>,
    Option<Vec<Candidates>>,
    Option<Vec<f32>>,
);

impl CudaModel {
    /// Runs `tokens` at positions start..start+n (see the module doc). An attention-only state ahead
    /// of `start` is rewound to it first, as on the CPU.
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut CudaState,
        wanted: &Wanted,
    ) -> Result<ForwardOut, CudaError> {
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput.into());
        }
        check_signature(state, &self.signature)?;
        if start + n > self.context {
            return Err(ModelError::ContextOverflow {
                start,
                n,
                context: self.context,
            }
            .into());
        }
        if start + n > state.capacity {
            return Err(CudaError::CapacityExceeded {
                start,
                n,
                capacity: state.capacity,
            });
        }
        if start != state.position && !(start < state.position && state.rewind(start)) {
            return Err(ModelError::PositionMismatch {
                expected: state.position,
                got: start,
            }
            .into());
        }
        for tap in &wanted.taps {
            if let Tap::LayerOutput(i) = tap {
                if *i >= self.layers.len() {
                    return Err(ModelError::TapOutOfRange {
                        layer: *i,
                        layers: self.layers.len(),
                    }
                    .into());
                }
            }
        }
        for (index, &token) in tokens.iter().enumerate() {
            if token as usize >= self.vocab {
                return Err(ModelError::TokenOutOfRange {
                    token,
                    index,
                    vocab: self.vocab,
                }
                .into());
            }
        }
        let first = match wanted.logits {
            Rows::None => n,
            Rows::Last => n - 1,
            Rows::All => 0,
            Rows::From(f) => f.min(n),
        };
        let mut out = ForwardOut {
            first_row: first,
            rows: n - first,
            taps: vec![Vec::new(); wanted.taps.len()],
            ..Default::default()
        };
        state.last_logits = None;
        let candidates = self.candidate_rows(state, wanted)?;
        // One row with no taps, or the final hidden only (a drafter's plain steps): the decode graph.
        let final_hidden = wanted.taps == [Tap::FinalHidden];
        if n == 1
            && (wanted.taps.is_empty() || final_hidden)
            && state.tape.is_none()
            && self.graph_ok()
        {
            let want = match (first, wanted.argmax_only, candidates) {
                (0, true, _) => Want::Argmax,
                (0, false, 0) => Want::Logits,
                (0, false, k) => Want::Candidates(k),
                _ => Want::Nothing,
            };
            let hidden;
            (out.logits, out.argmax, out.candidates, hidden) =
                self.decode_graph_step(tokens[0], start, state, want, final_hidden)?;
            if let (Some(slot), Some(h)) = (out.taps.first_mut(), hidden) {
                *slot = h;
            }
            state.position = start + 1;
            return Ok(out);
        }
        if let Some(pass) =
            self.graphed_verify(tokens, start, state, first, &wanted.taps, candidates)?
        {
            out.logits = pass.logits;
            out.candidates = pass.candidates;
            out.taps = pass.taps;
            state.position = start + n;
            return Ok(out);
        }
        let mut p0 = 0;
        let pass_rows = self.opts.max_pass_rows.max(1);
        // Ids stand in for logits only when one pass returns every row.
        let argmax_only = wanted.argmax_only && n <= pass_rows;
        while p0 < n {
            let p1 = (p0 + pass_rows).min(n);
            let pass = self.pass(
                &tokens[p0..p1],
                start + p0,
                state,
                first.saturating_sub(p0).min(p1 - p0),
                &wanted.taps,
                argmax_only,
                if n <= pass_rows { candidates } else { 0 },
                &mut None,
            )?;
            out.logits.extend_from_slice(&pass.logits);
            out.argmax = pass.argmax;
            out.candidates = pass.candidates;
            for (slot, t) in out.taps.iter_mut().zip(pass.taps) {
                slot.extend_from_slice(&t);
            }
            state.position = start + p1;
            p0 = p1;
        }
        Ok(out)
    }

    pub(crate) fn graph_ok(&self) -> bool {
        self.opts.graphs && self.opts.gemv_max_rows >= 1 && !self.dev.is_emulated()
    }

    /// One pass of m rows at `start`; logits for rows first..m (pass-relative).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pass(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut CudaState,
        first: usize,
        taps: &[Tap],
        argmax_only: bool,
        candidates: usize,
        prof: &mut Option<Prof>,
    ) -> Result<PassOut, CudaError> {
        let dev = &*self.dev;
        let m = tokens.len();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let row_splits = m * ops::att_splits(m, self.opts.gemv_max_rows);
        let _plain = (m > self.opts.gemv_max_rows).then(|| dev.pause_pdl());
        if m > 1 {
            let fits = state
                .many
                .as_ref()
                .is_some_and(|s| s.rows >= m && s.row_splits >= row_splits);
            if !fits {
                let rows = m.max(state.many.as_ref().map_or(0, |s| s.rows));
                let rs = row_splits.max(state.many.as_ref().map_or(0, |s| s.row_splits));
                state.many = None;
                state.verify_graphs.clear();
                state.many = Some(Scratch::new(dev, &state.widths, rows, rs)?);
            }
        }
        // Layer-output taps are staged on the device and read back once at the end: a read-back right
        // after each tapped layer would stall the stream mid-pass once per tap.
        let staged = taps
            .iter()
            .filter(|t| matches!(t, Tap::LayerOutput(_)))
            .count();
        let stage_floats = staged * m * self.hidden;
        if state
            .tap_stage
            .as_ref()
            .is_none_or(|b| b.bytes < stage_floats * 4)
        {
            state.tap_stage = None;
            state.tap_stage = Some(DBuf::f32s(dev, stage_floats.max(1))?);
        }
        let CudaState {
            layers,
            tape,
            one,
            many,
            tap_stage,
            candidates: candidate_bufs,
            last_logits,
            ..
        } = state;
        let stage = tap_stage.as_ref().map_or(0, |b| b.ptr);
        let sc: &Scratch = if m == 1 {
            one
        } else {
            many.as_ref().ok_or(CudaError::Unsupported {
                what: "missing scratch".into(),
            })?
        };
        htod(dev, sc.ids.ptr, &ids)?;
        htod(dev, sc.start.ptr, &[start as i32])?;
        // A one-row pass (an un-graphed decode step) runs its GEMV runs as segments too.
        let scope = if m == 1 && self.opts.segments {
            crate::segment::open(dev, self.stream_evict_first)
        } else {
            None
        };
        ops::embed(dev, &self.embed, sc.ids.ptr, sc.x.ptr, m)?;
        mark(prof, dev, "embed", 0)?;
        let mut tap_out: Vec<Vec<f32>> = vec![Vec::new(); taps.len()];
        let row_bytes = m * self.hidden * 4;
        let rope_pass = sc.rope_pass.enter();
        for (i, (layer, ls)) in self.layers.iter().zip(layers.iter_mut()).enumerate() {
            let lt = tape
                .as_mut()
                .and_then(|t: &mut Tape| t.layers.get_mut(i))
                .and_then(|t| t.as_mut());
            self.layer(layer, ls, lt, StepIo::InPlace, sc, m, prof)?;
            let layer_taps = taps.iter().filter(|t| matches!(t, Tap::LayerOutput(_)));
            for (k, tap) in layer_taps.enumerate() {
                if *tap == Tap::LayerOutput(i) {
                    dtod(dev, stage + (k * row_bytes) as u64, sc.x.ptr, row_bytes)?;
                }
            }
        }
        drop(rope_pass);
        if staged > 0 {
            let mut all = vec![0.0f32; stage_floats];
            dtoh(dev, &mut all, stage)?;
            let mut rows = all.chunks_exact(m * self.hidden);
            for (slot, tap) in tap_out.iter_mut().zip(taps) {
                if matches!(tap, Tap::LayerOutput(_)) {
                    *slot = rows.next().map(<[f32]>::to_vec).unwrap_or_default();
                }
            }
        }
        let final_hidden = taps.contains(&Tap::FinalHidden);
        let from = if final_hidden { 0 } else { first };
        let (mut logits, mut argmax, mut chosen) = (Vec::new(), None, None);
        if from < m {
            let h = self.hidden;
            self.final_norm_rows(sc, from, m)?;
            if final_hidden {
                let mut normed = vec![0.0; m * h];
                dtoh(dev, &mut normed, sc.h.ptr)?;
                for (slot, tap) in tap_out.iter_mut().zip(taps) {
                    if *tap == Tap::FinalHidden {
                        slot.clone_from(&normed);
                    }
                }
            }
            let cands = candidate_bufs.as_ref().filter(|_| candidates > 0);
            let head =
                self.lm_head_rows(sc, first, m, argmax_only, cands.map(|b| (b, candidates)))?;
            (logits, argmax, chosen) = head;
            if chosen.is_some() {
                *last_logits = Some((sc.logits.ptr, m - first));
            }
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            mark(
                prof,
                dev,
                "final norm+lm head",
                head.bytes() * (m - first).div_ceil(LOGIT_ROWS),
            )?;
        }
        if let Some(scope) = scope {
            scope.finish()?;
        }
        Ok(PassOut {
            logits,
            argmax,
            candidates: chosen,
            taps: tap_out,
        })
    }

    /// sc.h rows from..m = the final RMSNorm of sc.x rows from..m.
    pub(crate) fn final_norm_rows(
        &self,
        sc: &Scratch,
        from: usize,
        m: usize,
    ) -> Result<(), CudaError> {
        let h = self.hidden;
        ops::rmsnorm(
            &self.dev,
            sc.x.f32_at(from * h),
            self.final_norm.ptr,
            sc.h.f32_at(from * h),
            m - from,
            h,
            self.eps,
            self.zero_centred,
        )
    }

    /// Logits of normed rows first..m of `sc.h`, in groups of LOGIT_ROWS; or, with `argmax_only` and
    /// one group, their argmax when no row is refused (argmax.rs).
    fn lm_head_rows(
        &self,
        sc: &Scratch,
        first: usize,
        m: usize,
        argmax_only: bool,
        candidates: Option<(&CandidateBufs, usize)>,
    ) -> Result<HeadOut, CudaError> {
        let dev = &*self.dev;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0.0f32; (m - first) * self.vocab];
        let mut r = first;
        while r < m {
            let g = (m - r).min(LOGIT_ROWS);
            ops::linear(
                dev,
                head,
                sc.h.f32_at(r * self.hidden),
                sc.logits.ptr,
                g,
                false,
                sc.xb.ptr,
                self.opts.gemv_max_rows,
            )?;
            if argmax_only && g == m - first {
                argmax::launch_rows(dev, sc.logits.ptr, g, self.vocab, sc.argmax.ptr)?;
                if let Some(ids) = argmax::read_ids(dev, sc.argmax.ptr, g)? {
                    return Ok((Vec::new(), Some(ids), None));
                }
            }
            if let Some((bufs, k)) = candidates.filter(|_| g == m - first) {
                bufs.launch(dev, sc.logits.ptr, g, self.vocab, k)?;
                if let Some(c) = bufs.read(dev, g)? {
                    return Ok((Vec::new(), None, Some(c)));
                }
            }
            let at = (r - first) * self.vocab;
            dtoh(dev, &mut logits[at..at + g * self.vocab], sc.logits.ptr)?;
            r += g;
        }
        Ok((logits, None, None))
    }

    /// The RMSNorm with weight `w` and the model's eps / centring.
    pub(crate) fn norm(&self, w: &DBuf) -> NormW {
        NormW {
            w: w.ptr,
            eps: self.eps,
            zero_centred: self.zero_centred,
        }
    }

    /// One decoder layer over the m rows in `sc.x` (updated in place). The input norms are fused into
    /// the projections that read them (ops::linear_normed / linear_swiglu), SwiGLU into gate_up.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layer(
        &self,
        l: &LayerW,
        ls: &mut LayerState,
        tape: Option<&mut crate::state::LayerTape>,
        io: StepIo,
        sc: &Scratch,
        m: usize,
        prof: &mut Option<Prof>,
    ) -> Result<(), CudaError> {
        let dev = &*self.dev;
        let gm = self.opts.gemv_max_rows;
        let input_norm = self.norm(&l.input_norm);
        match (&l.mixer, ls) {
            (MixerW::Attention(a), LayerState::Attention { k, v, .. }) => {
                let (x, h, big, xb) = (sc.x.ptr, sc.h.ptr, sc.big.ptr, sc.xb.ptr);
                ops::linear_normed(dev, &a.qkv, x, input_norm, h, big, m, xb, gm)?;
                mark(prof, dev, "attn norm+qkv linear", a.qkv.bytes())?;
                let bufs = AttnBufs {
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
                    rope: if self.opts.rope_table {
                        sc.rope_pass.next(&sc.rope, sc.rope_rows, m)
                    } else {
                        ops::Rope::Compute
                    },
                };
                ops::attention(
                    dev,
                    a.shape,
                    &bufs,
                    a.q_norm.ptr,
                    a.k_norm.ptr,
                    a.inv_freq.ptr,
                    m,
                    ops::attn_core(
                        a.shape,
                        m,
                        gm,
                        // bf16 operands only where the prefill GEMMs already round to bf16.
                        self.opts.attention_tc && a.qkv.dtype != WDtype::F32,
                        self.opts.attention_tc_splits,
                        dev.info.sms.max(0) as usize,
                    ),
                )?;
                mark(prof, dev, "attn core", 0)?;
                ops::linear(dev, &a.o, sc.mid.ptr, sc.x.ptr, m, true, sc.xb.ptr, gm)?;
                mark(prof, dev, "attn o linear", a.o.bytes())?;
            }
            (MixerW::Gdn(g), LayerState::Recurrent { s, conv, alt, .. }) => {
                let (x, h, big, xb) = (sc.x.ptr, sc.h.ptr, sc.big.ptr, sc.xb.ptr);
                ops::linear_normed(dev, &g.proj, x, input_norm, h, big, m, xb, gm)?;
                // [S, window] read, and where the new ones go (chain.rs's ping-pong, or in place).
                let (s_in, conv_in, into) = match (io, alt.as_ref()) {
                    (StepIo::InPlace, _) => (&*s, &*conv, (s.ptr, conv.ptr)),
                    (StepIo::MainToAlt, Some((a_s, a_conv))) => {
                        (&*s, &*conv, (a_s.ptr, a_conv.ptr))
                    }
                    (StepIo::AltToMain, Some((a_s, a_conv))) => (a_s, a_conv, (s.ptr, conv.ptr)),
                    (_, None) => {
                        return Err(CudaError::Unsupported {
                            what: "a chained decode step on a state without its alternate buffers"
                                .into(),
                        })
                    }
                };
                let into = GdnOut {
                    state: into.0,
                    window: into.1,
                };
                let (s, conv) = (s_in, conv_in);
                // The recurrence's first reads come from L2 (a decode step's segment prefetches them).
                crate::segment::prefetch_after(dev, &[(s.ptr, s.bytes), (conv.ptr, conv.bytes)]);
                mark(prof, dev, "gdn norm+proj linear", g.proj.bytes())?;
                let chunked = io == StepIo::InPlace
                    && use_chunked(self.opts.gdn_chunked, m, gm, tape.is_some());
                if let Some(t) = tape {
                    t.record(dev, g.shape, s, conv, sc.big.ptr, m)?;
                }
                let args = self.gdn_args(g);
                let (prep, o) = (sc.mid.ptr, sc.o.ptr);
                if chunked {
                    let sh = g.shape;
                    gdn_chunked(dev, sh, &args, big, conv.ptr, prep, s.ptr, o, &sc.gdn, m)?;
                } else {
                    let cols = GdnCols::Split {
                        done: Some(sc.gdn_done.ptr),
                    };
                    crate::gdn::gdn_recurrence_into(
                        dev, g.shape, &args, big, conv.ptr, prep, s.ptr, o, m, cols, into,
                    )?;
                }
                mark(prof, dev, "gdn conv+rec+norm", 0)?;
                ops::linear(dev, &g.out, sc.o.ptr, sc.x.ptr, m, true, sc.xb.ptr, gm)?;
                mark(prof, dev, "gdn out linear", g.out.bytes())?;
            }
            _ => {
                return Err(
                    ModelError::StateMismatch("layer kind differs from its state".into()).into(),
                )
            }
        }
        let post_norm = self.norm(&l.post_norm);
        match &l.ffn {
            FfnW::Dense { gate_up: gu, down } => {
                let (x, h, big, act) = (sc.x.ptr, sc.h.ptr, sc.big.ptr, sc.mid.ptr);
                ops::linear_swiglu(dev, gu, x, post_norm, h, big, act, m, sc.xb.ptr, gm)?;
                mark(prof, dev, "mlp norm+gate_up+silu", gu.bytes())?;
                ops::linear(dev, down, sc.mid.ptr, sc.x.ptr, m, true, sc.xb.ptr, gm)?;
                mark(prof, dev, "mlp down linear", down.bytes())
            }
            FfnW::Moe(w) => {
                crate::moe::forward(dev, w, post_norm, sc, m, gm)?;
                mark(prof, dev, "moe norm+router+experts", w.bytes())
            }
        }
    }

    /// The recurrence parameters of a GDN layer.
    pub(crate) fn gdn_args(&self, g: &crate::model::GdnW) -> GdnArgs {
        GdnArgs {
            conv_w: g.conv_w.ptr,
            a_log: g.a_log.ptr,
            dt_bias: g.dt_bias.ptr,
            norm_w: g.norm_w.ptr,
            eps: self.eps,
        }
    }

    /// One-row decode through the state's captured graph (captured on first use); returns what `want`
    /// asks for: the logits row, or its argmax (the row instead when the argmax kernel refused it); and
    /// with `final_hidden` the final-norm hidden row (the graph that also computes it).
    fn decode_graph_step(
        &self,
        token: u32,
        start: usize,
        state: &mut CudaState,
        want: Want,
        final_hidden: bool,
    ) -> Result<DecodeStepOut, CudaError> {
        let dev: &CudaDevice = &self.dev;
        htod(dev, state.one.ids.ptr, &[token as i32])?;
        htod(dev, state.one.start.ptr, &[start as i32])?;
        let captured = match final_hidden {
            false => state.graph.is_some(),
            true => state.graph_hidden.is_some(),
        };
        if !captured && state.graph_error.is_none() {
            match self.capture(state, StepIo::InPlace, 0, final_hidden) {
                Ok(Some(g)) if final_hidden => state.graph_hidden = Some(g),
                Ok(Some(g)) => state.graph = Some(g),
                Ok(None) => state.graph_error = Some("capture produced an empty graph".into()),
                Err(e) => state.graph_error = Some(e.to_string()),
            }
        }
        let graph = match final_hidden {
            false => &state.graph,
            true => &state.graph_hidden,
        };
        match graph {
            Some(g) => g
                .launch()
                .map_err(CudaError::driver("launching the decode graph"))?,
            None => self.decode_body(state, &mut None, StepIo::InPlace, 0, final_hidden)?,
        }
        let hidden = match final_hidden {
            true => {
                let mut h = vec![0.0f32; self.hidden];
                dtoh(dev, &mut h, state.one.h.ptr)?;
                Some(h)
            }
            false => None,
        };
        match want {
            Want::Nothing => return Ok((Vec::new(), None, None, hidden)),
            Want::Argmax => {
                if let Some(ids) = argmax::read_ids(dev, state.one.argmax.ptr, 1)? {
                    return Ok((Vec::new(), Some(ids), None, hidden));
                }
            }
            Want::Candidates(k) => {
                let logits = state.one.logits.ptr;
                if let Some(c) = self.select_candidates(state, logits, 1, k)? {
                    return Ok((Vec::new(), None, Some(c), hidden));
                }
            }
            Want::Logits => {}
        }
        let mut logits = vec![0.0f32; self.vocab];
        dtoh(dev, &mut logits, state.one.logits.ptr)?;
        Ok((logits, None, None, hidden))
    }

    /// Captures the one-row decode step of `state` into a graph (nothing runs during capture).
    pub(crate) fn capture(
        &self,
        state: &mut CudaState,
        io: StepIo,
        slot: u64,
        final_hidden: bool,
    ) -> Result<Option<cudarc::driver::CudaGraph>, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        crate::note_capture();
        let stream = &self.dev.gpu()?.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("beginning graph capture"))?;
        let body = self.decode_body(state, &mut None, io, slot, final_hidden);
        // Always end the capture, also after a failed body, so the stream leaves capture mode.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(CudaError::driver("ending graph capture"));
        body?;
        graph
    }

    /// The device work of one decode row (ids and start already in `state.one`): what the graph holds.
    /// A chained step (`io` not in place) also leaves its argmax and position + 1 as the next step's
    /// input, and its [token, refused] pair in host memory at `slot` (`argmax::launch_feeding`). With
    /// `final_hidden` the final-norm hidden row goes to `one.h` (the LM head stages its norm without
    /// storing it), by the kernel `pass` normalises its rows with, so the tap has `pass`'s bits.
    pub(crate) fn decode_body(
        &self,
        state: &mut CudaState,
        prof: &mut Option<Prof>,
        io: StepIo,
        slot: u64,
        final_hidden: bool,
    ) -> Result<(), CudaError> {
        let dev = &*self.dev;
        // GEMV runs as persistent kernels (segment.rs). A profiled step synchronises after every
        // operation, which flushes the queue each time: it runs (and reports) per-GEMV launches.
        let scope = if self.opts.segments {
            crate::segment::open(dev, self.stream_evict_first)
        } else {
            None
        };
        let CudaState { layers, one, .. } = state;
        ops::embed(dev, &self.embed, one.ids.ptr, one.x.ptr, 1)?;
        mark(prof, dev, "embed", 0)?;
        let rope_pass = one.rope_pass.enter();
        for (layer, ls) in self.layers.iter().zip(layers.iter_mut()) {
            self.layer(layer, ls, None, io, one, 1, prof)?;
        }
        drop(rope_pass);
        // The final norm fused into the LM head (pass() runs them apart, with identical results).
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        ops::linear_normed(
            dev,
            head,
            one.x.ptr,
            self.norm(&self.final_norm),
            one.h.ptr,
            one.logits.ptr,
            1,
            one.xb.ptr,
            self.opts.gemv_max_rows,
        )?;
        mark(prof, dev, "final norm+lm head", head.bytes())?;
        // In the graph whatever the caller wants of this step: 8 bytes, read only for Want::Argmax.
        match io {
            StepIo::InPlace => {
                argmax::launch_rows(dev, one.logits.ptr, 1, self.vocab, one.argmax.ptr)?
            }
            _ => {
                let next = (one.ids.ptr, one.start.ptr);
                argmax::launch_feeding(
                    dev,
                    one.logits.ptr,
                    self.vocab,
                    one.argmax.ptr,
                    next,
                    slot,
                    0,
                )?
            }
        }
        if final_hidden {
            // After the argmax: a launch here flushes the open segment, so before the LM head it would
            // run that GEMV apart from it.
            let h = self.hidden;
            ops::rmsnorm(
                dev,
                one.x.ptr,
                self.final_norm.ptr,
                one.h.ptr,
                1,
                h,
                self.eps,
                self.zero_centred,
            )?;
        }
        if let Some(scope) = scope {
            scope.finish()?;
        }
        mark(prof, dev, "argmax", 0)
    }
}
