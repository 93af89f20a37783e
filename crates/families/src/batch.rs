//! One forward over several sequences' rows: `Transformer::forward_batch`, the step a batching
//! scheduler runs (each sequence brings a decode row, a verify block or a prefill chunk, at its own
//! position on its own state) and what `Transformer::forward` runs for one sequence.
//!
//! Algorithm: the rows of every sequence are concatenated [T, hidden]. Per layer, the norms (row-wise),
//! the mixer's input and output projections and the dense feed-forward run over all T rows at once
//! (`Linear::forward_segments`: one weight stream for every sequence); the mixer's core runs per
//! sequence on that sequence's state (attention over its KV cache, or the GDN conv and recurrence, with
//! its tape); a sparse-MoE feed-forward runs per sequence (its experts see only that sequence's rows).
//! The final norm and the LM head run over the rows each sequence asked for, again all at once.
//!
//! Invariant: result i is what `forward` returns for sequence i alone, bit for bit, and leaves its state
//! as that would: every kernel computes a row from that row (and its own sequence's state) alone, and
//! `forward_segments` keeps each row on the kernel path its sequence alone takes (tests/batch.rs).

use crate::backend::SeqRows;
use crate::error::ModelError;
use crate::layers::ffn::Ffn;
use crate::layers::run_segments;
use crate::model::{ForwardOut, Layer, Mixer, Rows, Tap, Transformer, Wanted};
use crate::state::{LayerState, State};

/// Where sequence i's rows sit in the concatenated batch.
struct Span {
    r0: usize,
    n: usize,
    start: usize,
}

impl Transformer {
    /// Checks one sequence's call as `forward` does (an attention-only state ahead of `start` is
    /// rewound to it).
    fn admit(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut State,
        wanted: &Wanted,
    ) -> Result<(), ModelError> {
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        if state.signature != self.signature() {
            return Err(ModelError::StateMismatch(state.signature.clone()));
        }
        if start + n > self.context {
            return Err(ModelError::ContextOverflow {
                start,
                n,
                context: self.context,
            });
        }
        if start != state.position && !(start < state.position && state.rewind(start)) {
            return Err(ModelError::PositionMismatch {
                expected: state.position,
                got: start,
            });
        }
        for tap in &wanted.taps {
            if let Tap::LayerOutput(i) = tap {
                if *i >= self.layers.len() {
                    return Err(ModelError::TapOutOfRange {
                        layer: *i,
                        layers: self.layers.len(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Runs each sequence's `tokens` at positions start..start+n of its own state, all in one pass
    /// (module doc); result i is `forward`'s for sequence i alone. Every sequence is checked before any
    /// row runs; an error names the first sequence that fails.
    pub fn forward_batch(
        &self,
        batch: &mut [SeqRows<'_, State>],
    ) -> Result<Vec<ForwardOut>, ModelError> {
        for s in batch.iter_mut() {
            self.admit(s.tokens, s.start, s.state, s.wanted)?;
        }
        let hd = self.hidden;
        let mut spans = Vec::with_capacity(batch.len());
        let mut x = Vec::new(); // [T, hidden]
        for s in batch.iter() {
            spans.push(Span {
                r0: x.len() / hd,
                n: s.tokens.len(),
                start: s.start,
            });
            for (index, &token) in s.tokens.iter().enumerate() {
                let row = self.embed_row(token).ok_or(ModelError::TokenOutOfRange {
                    token,
                    index,
                    vocab: self.vocab,
                })?;
                x.extend_from_slice(row);
            }
        }
        let seg: Vec<usize> = spans.iter().map(|s| s.n).collect();
        let mut taps: Vec<Vec<Vec<f32>>> = batch
            .iter()
            .map(|s| vec![Vec::new(); s.wanted.taps.len()])
            .collect();
        for (i, layer) in self.layers.iter().enumerate() {
            layer_segments(layer, i, &mut x, &seg, &spans, batch)?;
            for ((s, span), slots) in batch.iter().zip(&spans).zip(taps.iter_mut()) {
                for (slot, tap) in slots.iter_mut().zip(&s.wanted.taps) {
                    if *tap == Tap::LayerOutput(i) {
                        *slot = x[span.r0 * hd..(span.r0 + span.n) * hd].to_vec();
                    }
                }
            }
        }
        for (s, span) in batch.iter_mut().zip(&spans) {
            s.state.position = span.start + span.n;
        }
        self.finish(batch, &spans, &x, taps)
    }

    /// Final norm, taps and LM head of every sequence's rows (`forward`'s last part).
    fn finish(
        &self,
        batch: &[SeqRows<'_, State>],
        spans: &[Span],
        x: &[f32],
        mut taps: Vec<Vec<Vec<f32>>>,
    ) -> Result<Vec<ForwardOut>, ModelError> {
        let hd = self.hidden;
        let mut outs = Vec::with_capacity(batch.len());
        let mut head_in = Vec::new(); // the logits rows of every sequence, [Σ rows, hidden]
        let mut head_seg = Vec::new();
        for ((s, span), seq_taps) in batch.iter().zip(spans).zip(taps.iter_mut()) {
            let n = span.n;
            let first = match s.wanted.logits {
                Rows::None => n,
                Rows::Last => n - 1,
                Rows::All => 0,
                Rows::From(f) => f.min(n),
            };
            let final_tap = s.wanted.taps.contains(&Tap::FinalHidden);
            if first < n || final_tap {
                // Only the rows that need it are normed when no FinalHidden tap asks for all of them.
                let from = if final_tap { 0 } else { first };
                let rows = &x[(span.r0 + from) * hd..(span.r0 + n) * hd];
                let mut normed = vec![0.0; rows.len()];
                self.final_norm.apply(rows, &mut normed);
                head_in.extend_from_slice(&normed[(first - from) * hd..]);
                for (slot, tap) in seq_taps.iter_mut().zip(&s.wanted.taps) {
                    if *tap == Tap::FinalHidden {
                        *slot = normed.clone();
                    }
                }
            }
            head_seg.push(n - first);
            outs.push(ForwardOut {
                first_row: first,
                rows: n - first,
                taps: std::mem::take(seq_taps),
                ..Default::default()
            });
        }
        let total: usize = head_seg.iter().sum();
        if total > 0 {
            let logits = self.lm_head_segments(&head_in, &head_seg);
            let mut at = 0;
            for (out, &rows) in outs.iter_mut().zip(&head_seg) {
                out.logits = logits[at * self.vocab..(at + rows) * self.vocab].to_vec();
                at += rows;
            }
        }
        Ok(outs)
    }

    /// [`Transformer::lm_head`] over several sequences' rows (`seg[i]` each), every row with the bits
    /// its sequence's rows alone give it.
    fn lm_head_segments(&self, h: &[f32], seg: &[usize]) -> Vec<f32> {
        let seg: Vec<usize> = seg.iter().copied().filter(|&n| n > 0).collect();
        match &self.lm_head {
            Some(head) => head.forward_segments(h, &seg),
            None => run_segments(h, self.hidden, &seg, kernels::MATVEC_MAX_ROWS, |x, n| {
                self.lm_head(x, n)
            }),
        }
    }
}

/// Layer `i` over every sequence's rows: x [T, hidden] updated in place (`Layer::forward`'s
/// arithmetic, per row).
fn layer_segments(
    layer: &Layer,
    i: usize,
    x: &mut [f32],
    seg: &[usize],
    spans: &[Span],
    batch: &mut [SeqRows<'_, State>],
) -> Result<(), ModelError> {
    let mismatch = || ModelError::StateMismatch("layer kind differs from its state".into());
    let mut h = vec![0.0; x.len()];
    layer.input_norm.apply(x, &mut h);
    let mixed = match &layer.mixer {
        Mixer::Attention(a) => {
            let p = a.project(&h, seg);
            let mut core = Vec::with_capacity(x.len());
            for (s, span) in batch.iter_mut().zip(spans) {
                let LayerState::Attention(kv) = &mut s.state.layers[i] else {
                    return Err(mismatch());
                };
                core.extend(a.core(&p, span.r0, span.n, span.start, kv));
            }
            a.o_proj.forward_segments(&core, seg)
        }
        Mixer::Linear(g) => {
            let p = g.project(&h, seg);
            let mut core = Vec::with_capacity(x.len());
            for (s, span) in batch.iter_mut().zip(spans) {
                let state = &mut *s.state;
                let tape = state
                    .tape
                    .as_mut()
                    .and_then(|t| t.layers.get_mut(i))
                    .and_then(|t| t.as_mut());
                let LayerState::Recurrent(r) = &mut state.layers[i] else {
                    return Err(mismatch());
                };
                core.extend(g.core(&p, span.r0, span.n, r, tape));
            }
            g.out_proj.forward_segments(&core, seg)
        }
    };
    kernels::add_inplace(x, &mixed);
    layer.post_norm.apply(x, &mut h);
    let y = match &layer.ffn {
        Ffn::Dense(m) => m.forward_segments(&h, seg),
        Ffn::Moe(_) => {
            let hd = x.len() / seg.iter().sum::<usize>().max(1);
            let mut y = Vec::with_capacity(x.len());
            for span in spans {
                let rows = &h[span.r0 * hd..(span.r0 + span.n) * hd];
                y.extend(layer.ffn.forward(rows, span.n));
            }
            y
        }
    };
    kernels::add_inplace(x, &y);
    Ok(())
}
