//! Speculative rollback on the GPU: a verify block records each GDN layer's state at its start and the
//! rows' projections (a tape, `begin_tape`); keeping the first `keep` rows rebuilds S and the conv window
//! by replaying the recurrence over them (`rollback_body`, through a graph per kept count when verify
//! graphs are on: `verify_graph.rs`), and attention layers only move the cursor.
//!
//! Invariant: after `rollback_retaining(keep)` the state is bit for bit what running only the first `keep`
//! rows would have left (the same kernels on the same recorded inputs).

use crate::buf::dtod;
use crate::error::CudaError;
use crate::model::{CudaModel, MixerW};
use crate::ops::{self, GdnCols};
use crate::state::{check_signature, CudaState, LayerState, Scratch, Tape};

impl CudaModel {
    /// Keeps the first `keep` rows run since `begin_tape` and drops the rest: GDN layers are rebuilt by
    /// replaying their tape on the GPU, attention layers move the cursor. Ends the tape. Returns false
    /// (state untouched) when there is no tape or `keep` exceeds what was recorded.
    pub fn rollback_retaining(
        &self,
        state: &mut CudaState,
        keep: usize,
    ) -> Result<bool, CudaError> {
        check_signature(state, &self.signature)?;
        let Some(tape) = state.tape.take() else {
            return Ok(false);
        };
        let recorded = state.position - tape.start_position;
        if keep > recorded {
            state.tape = Some(tape);
            return Ok(false);
        }
        if keep == recorded {
            state.spare_tape = Some(tape);
            return Ok(true);
        }
        let dev = &*self.dev;
        if keep > 1 {
            let fits = state.many.as_ref().is_some_and(|s| s.rows >= keep);
            if !fits {
                let rs = state.many.as_ref().map_or(1, |s| s.row_splits);
                state.many = None;
                state.verify_graphs.clear();
                state.many = Some(Scratch::new(dev, &state.widths, keep, rs)?);
            }
        }
        // Not waited for: whatever reads the state next is queued behind the replay on the same stream
        // (a wait here was a host round trip per rejected speculative round).
        self.replay_tape(state, &tape, keep)?;
        state.position = tape.start_position + keep;
        state.spare_tape = Some(tape);
        Ok(true)
    }

    /// What a rollback to `keep` rows runs on the device (the caller sized the scratch): each GDN layer's S
    /// and conv window back to the tape's start, then its recurrence over the first `keep` recorded
    /// rows. The same kernels on the same recorded inputs, so S and the window come out bit for bit as
    /// if only `keep` rows had run (the outputs in the scratch's `o` are discarded).
    pub(crate) fn rollback_body(
        &self,
        layers: &[LayerState],
        tape: &Tape,
        sc: &Scratch,
        keep: usize,
    ) -> Result<(), CudaError> {
        let dev = &*self.dev;
        for ((layer, ls), lt) in self.layers.iter().zip(layers).zip(&tape.layers) {
            if let (MixerW::Gdn(g), LayerState::Recurrent { s, conv, .. }, Some(lt)) =
                (&layer.mixer, ls, lt)
            {
                if lt.rows == 0 {
                    continue;
                }
                dtod(dev, s.ptr, lt.s0.ptr, s.bytes)?;
                dtod(dev, conv.ptr, lt.conv0.ptr, conv.bytes)?;
                if keep > 0 {
                    let args = self.gdn_args(g);
                    let (proj, prep, o) = (lt.proj.ptr, sc.mid.ptr, sc.o.ptr);
                    let cols = GdnCols::Split {
                        done: Some(sc.gdn_done.ptr),
                    };
                    ops::gdn_recurrence(
                        dev, g.shape, &args, proj, conv.ptr, prep, s.ptr, o, keep, cols,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Starts recording a tape on `state` (see `rollback_retaining`).
    pub fn begin_tape(&self, state: &mut CudaState) -> Result<usize, CudaError> {
        check_signature(state, &self.signature)?;
        state.begin_tape()
    }
}
