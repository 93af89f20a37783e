//! Verify blocks through CUDA graphs: a forward of 2..=min(gemv_max_rows, LOGIT_ROWS) rows (a speculative
//! verify) is captured once per shape and replayed, like the one-row decode step, because on small
//! models its ~10 launches per layer cost more than its arithmetic (testbed on the H200: a graphed decode
//! step is 0.23 ms).
//!
//! What a graph holds: embed → every layer (with the tape's records when a tape is active) → final norm →
//! LM head, on the state's multi-row scratch; ids and the start position are copied in before the launch
//! (the kernels read the position from device memory), logits and the final-hidden tap are copied out
//! after it. The work is the same sequence of kernels `pass` launches for those rows, so the result is
//! bit for bit the same (the fixture checks compare both).
//!
//! On by default (`LoadOptions::verify_graphs`, `TURBOSPARK_VERIFY_GRAPHS=0` turns it off): with chained
//! sequential steps and fed drafts, verify graphs pay (testbed MTP block 4 on the H200: verify 0.33 ->
//! 0.31 ms, 1.17 -> 1.30x of the chained sequential with fed drafts; block 1 0.29 -> 0.25 ms). The verify
//! scratch is sized by the block's rows (fine attention splits), not a prefill's (coarse splits), so a
//! block never writes past its attention partials (`verify_scratch`, tested); the testbed MTP bench is
//! exact with graphs on.
//!
//! Invariants: a graph is keyed by (rows, first logits row, final-hidden tap, tape on) and by the buffers
//! it holds: the scratch (`verify_graphs` is cleared whenever `many` is replaced) and the tape buffers
//! (`tape_epoch` counts their allocations). A tape must be fresh (no rows recorded): the graph's records
//! go to row 0, and replaying one advances the host-side row counts as the captured `record`s did.

use cudarc::driver::CudaGraph;
use families::Tap;

use crate::buf::{dtoh, htod};
use crate::error::CudaError;
use crate::forward::PassOut;
use crate::model::CudaModel;
use crate::ops;
use crate::state::{CudaState, Scratch, Tape, LOGIT_ROWS};

/// What identifies a captured verify graph, or a rollback's tape replay (`rollback`: `rows` kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VerifyKey {
    rows: usize,
    first: usize,
    final_hidden: bool,
    /// The tape epoch the graph records into or replays (None: no tape).
    tape: Option<u64>,
    rollback: bool,
}

impl CudaModel {
    /// Runs `tokens` at `start` through a (captured on first use) graph when the shape allows; None
    /// when it does not, and the caller runs `pass`.
    pub(crate) fn graphed_verify(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut CudaState,
        first: usize,
        taps: &[Tap],
        candidates: usize,
    ) -> Result<Option<PassOut>, CudaError> {
        let n = tokens.len();
        let gm = self.opts.gemv_max_rows;
        let final_hidden = taps.contains(&Tap::FinalHidden);
        let eligible = self.opts.verify_graphs
            && self.graph_ok()
            && n >= 2
            && n <= gm.min(LOGIT_ROWS)
            && taps.iter().all(|t| *t == Tap::FinalHidden)
            && state.verify_graph_error.is_none()
            && state
                .tape
                .as_ref()
                .is_none_or(|t| t.layers.iter().flatten().all(|l| l.rows == 0));
        if !eligible {
            return Ok(None);
        }
        let dev = &*self.dev;
        // The scratch the graphs hold: sized for every verify block at once, so it is not replaced.
        let row_splits = n * ops::att_splits(n, gm);
        let fits = state
            .many
            .as_ref()
            .is_some_and(|s| s.rows >= n && s.row_splits >= row_splits);
        if !fits {
            let have = state
                .many
                .as_ref()
                .map_or((0, 0), |s| (s.rows, s.row_splits));
            let (rows, rs) = verify_scratch(have, gm);
            state.many = None;
            state.verify_graphs.clear();
            state.many = Some(Scratch::new(dev, &state.widths, rows, rs)?);
        }
        let key = VerifyKey {
            rows: n,
            first,
            final_hidden,
            tape: state.tape.as_ref().map(|_| state.tape_epoch),
            rollback: false,
        };
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        {
            let sc = state.many.as_ref().ok_or(CudaError::Unsupported {
                what: "missing scratch".into(),
            })?;
            htod(dev, sc.ids.ptr, &ids)?;
            htod(dev, sc.start.ptr, &[start as i32])?;
        }
        let captured = state.verify_graphs.iter().position(|(k, _)| *k == key);
        match captured {
            Some(i) => {
                state.verify_graphs[i]
                    .1
                    .launch()
                    .map_err(CudaError::driver("launching a verify graph"))?;
                // The captured records advanced the tape's host-side counts once, at capture.
                if let Some(t) = state.tape.as_mut() {
                    for l in t.layers.iter_mut().flatten() {
                        l.rows += n;
                    }
                }
            }
            None => match self.capture_verify(state, n, first, final_hidden) {
                Ok(graph) => {
                    graph
                        .launch()
                        .map_err(CudaError::driver("launching a verify graph"))?;
                    state.verify_graphs.push((key, graph));
                }
                Err(e) => {
                    // Nothing ran: later blocks of this state use direct launches.
                    state.verify_graph_error = Some(e.to_string());
                    if let Some(t) = state.tape.as_mut() {
                        for l in t.layers.iter_mut().flatten() {
                            l.rows = 0;
                        }
                    }
                    return Ok(None);
                }
            },
        }
        let logits_at = state
            .many
            .as_ref()
            .ok_or(CudaError::Unsupported {
                what: "missing scratch".into(),
            })?
            .logits
            .ptr;
        // Sampled rows' candidates instead of the rows, when asked for and no row is flagged.
        let chosen = match (candidates, first < n) {
            (k @ 1.., true) => self.select_candidates(state, logits_at, n - first, k)?,
            _ => None,
        };
        let sc = state.many.as_ref().ok_or(CudaError::Unsupported {
            what: "missing scratch".into(),
        })?;
        let mut logits = Vec::new();
        if first < n && chosen.is_none() {
            logits = vec![0.0f32; (n - first) * self.vocab];
            dtoh(dev, &mut logits, sc.logits.ptr)?;
        }
        let mut tap_out = vec![Vec::new(); taps.len()];
        if final_hidden {
            let mut normed = vec![0.0; n * self.hidden];
            dtoh(dev, &mut normed, sc.h.ptr)?;
            for slot in tap_out.iter_mut() {
                slot.clone_from(&normed);
            }
        }
        Ok(Some(PassOut {
            logits,
            argmax: None,
            candidates: chosen,
            taps: tap_out,
        }))
    }

    /// A rollback's device work (`rollback_body`) for `tape`, taken out of `state`, through a graph per
    /// kept row count when verify graphs are on (the testbed's rounds: ~30 launches, ~0.1 ms direct, run
    /// 168), else direct launches. The scratch is the one `rollback_body` reads (sized by the caller).
    pub(crate) fn replay_tape(
        &self,
        state: &mut CudaState,
        tape: &Tape,
        keep: usize,
    ) -> Result<(), CudaError> {
        let eligible = self.opts.verify_graphs
            && self.graph_ok()
            && state.verify_graph_error.is_none()
            && tape.layers.iter().flatten().all(|l| l.rows > 0);
        let key = VerifyKey {
            rows: keep,
            first: 0,
            final_hidden: false,
            tape: Some(state.tape_epoch),
            rollback: true,
        };
        let CudaState {
            layers,
            one,
            many,
            verify_graphs,
            verify_graph_error,
            ..
        } = state;
        let sc = match keep {
            0 | 1 => Some(&*one),
            _ => many.as_ref(),
        }
        .ok_or(CudaError::Unsupported {
            what: "missing scratch".into(),
        })?;
        if !eligible {
            return self.rollback_body(layers, tape, sc, keep);
        }
        if let Some((_, g)) = verify_graphs.iter().find(|(k, _)| *k == key) {
            return g
                .launch()
                .map_err(CudaError::driver("launching a rollback graph"));
        }
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        crate::note_capture();
        let stream = &self.dev.gpu()?.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("beginning rollback graph capture"))?;
        let body = self.rollback_body(layers, tape, sc, keep);
        // Always end the capture, also after a failed body, so the stream leaves capture mode.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(CudaError::driver("ending rollback graph capture"));
        match body.and(graph) {
            Ok(Some(g)) => {
                g.launch()
                    .map_err(CudaError::driver("launching a rollback graph"))?;
                verify_graphs.push((key, g));
                Ok(())
            }
            // Nothing ran: this and later rollbacks of the state use direct launches.
            Ok(None) => {
                *verify_graph_error = Some("an empty rollback graph".into());
                self.rollback_body(layers, tape, sc, keep)
            }
            Err(e) => {
                *verify_graph_error = Some(e.to_string());
                self.rollback_body(layers, tape, sc, keep)
            }
        }
    }

    /// Captures the device work of a verify block (nothing runs during capture).
    fn capture_verify(
        &self,
        state: &mut CudaState,
        n: usize,
        first: usize,
        final_hidden: bool,
    ) -> Result<CudaGraph, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        crate::note_capture();
        let stream = &self.dev.gpu()?.stream;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("beginning verify graph capture"))?;
        let body = self.verify_body(state, n, first, final_hidden);
        // Always end the capture, also after a failed body, so the stream leaves capture mode.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(CudaError::driver("ending verify graph capture"));
        body?;
        graph?.ok_or(CudaError::Unsupported {
            what: "an empty verify graph".into(),
        })
    }

    /// What `pass` launches for n rows, first logits row `first`, in the same order.
    fn verify_body(
        &self,
        state: &mut CudaState,
        n: usize,
        first: usize,
        final_hidden: bool,
    ) -> Result<(), CudaError> {
        let dev = &*self.dev;
        let CudaState {
            layers, tape, many, ..
        } = state;
        let sc = many.as_ref().ok_or(CudaError::Unsupported {
            what: "missing scratch".into(),
        })?;
        ops::embed(dev, &self.embed, sc.ids.ptr, sc.x.ptr, n)?;
        for (i, (layer, ls)) in self.layers.iter().zip(layers.iter_mut()).enumerate() {
            let lt = tape
                .as_mut()
                .and_then(|t| t.layers.get_mut(i))
                .and_then(|t| t.as_mut());
            self.layer(
                layer,
                ls,
                lt,
                crate::state::StepIo::InPlace,
                sc,
                n,
                &mut None,
            )?;
        }
        let from = if final_hidden { 0 } else { first };
        if from < n {
            self.final_norm_rows(sc, from, n)?;
        }
        if first < n {
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            ops::linear(
                dev,
                head,
                sc.h.f32_at(first * self.hidden),
                sc.logits.ptr,
                n - first,
                false,
                sc.xb.ptr,
                self.opts.gemv_max_rows,
            )?;
        }
        Ok(())
    }
}

/// (rows, attention row-splits) of a multi-row scratch that holds every verify block (2..=min(gm,
/// LOGIT_ROWS) rows, each row with its fine key chunks) and still what `have` held (a prefill's rows).
fn verify_scratch(have: (usize, usize), gm: usize) -> (usize, usize) {
    let block = gm.min(LOGIT_ROWS);
    let rows = block.max(have.0);
    let rs = (block * ops::att_splits(block, gm)).max(have.1);
    (rows, rs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_scratch_holds_every_block_after_a_prefill() {
        // A prefill of 35 rows leaves coarse splits (35 x 8 = 280): a 5-row block needs 5 x 64. Sizing the
        // splits from the prefill's rows once overflowed the attention partials (wrong tokens).
        for gm in [1usize, 4, 16] {
            for have in [(0, 0), (35, 35 * 8), (512, 512 * 8), (16, 16 * 64)] {
                let (rows, rs) = verify_scratch(have, gm);
                assert!(rows >= have.0 && rs >= have.1);
                for n in 2..=gm.min(LOGIT_ROWS) {
                    assert!(rows >= n, "rows {rows} < {n}");
                    assert!(rs >= n * ops::att_splits(n, gm), "splits {rs} for {n} rows");
                }
            }
        }
    }
}
