//! The CUDA backend behind the decode loop's seam (`families::Backend` / `families::BackendState`), so
//! `runtime::generate` runs sequential and speculative decoding on the GPU unchanged: batched verify,
//! tape begin / rollback (replayed on the GPU), snapshot / restore, KV cursor rewind.
//!
//! Only the public API of [`CudaModel`] / [`CudaState`] is used here. A `CudaState` has fixed buffers
//! (the decode graph holds their addresses), so it is created with a KV capacity and `reserve` moves its
//! contents into a larger state when a request needs more positions: capacity doubles (powers of two,
//! capped at the model's context), so a long session reallocates O(log n) times.
//!
//! Invariant: every operation has the CPU engine's meaning; `CudaError::Model` (bad token, context
//! overflow, position mismatch, ...) surfaces as `BackendError::Model`, everything device-specific
//! (driver, cuBLAS, capacity, unsupported) as `BackendError::Device` with its source.

use families::{Backend, BackendError, BackendState, ForwardOut, Wanted};

use crate::error::CudaError;
use crate::model::CudaModel;
use crate::state::{CudaSnapshot, CudaState};

/// KV positions of a new state before any `reserve` (grown on demand up to the context).
pub const INITIAL_CAPACITY: usize = 1024;

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Model(m) => BackendError::Model(m),
            other => BackendError::Device(Box::new(other)),
        }
    }
}

/// The capacity to grow to for `positions` (None when `current` already holds them).
pub fn grown_capacity(current: usize, positions: usize, context: usize) -> Option<usize> {
    let want = positions.min(context);
    (want > current).then(|| want.next_power_of_two().min(context.max(1)))
}

impl Backend for CudaModel {
    type State = CudaState;

    fn context(&self) -> usize {
        self.context
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn new_state(&self) -> Result<CudaState, BackendError> {
        Ok(CudaModel::new_state(
            self,
            INITIAL_CAPACITY.min(self.context),
        )?)
    }

    fn reserve(&self, state: &mut CudaState, positions: usize) -> Result<(), BackendError> {
        let Some(capacity) = grown_capacity(state.capacity(), positions, self.context) else {
            return Ok(());
        };
        let contents = state.snapshot()?;
        let mut larger = CudaModel::new_state(self, capacity)?;
        larger.restore(&contents)?;
        *state = larger;
        Ok(())
    }

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut CudaState,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        Ok(CudaModel::forward(self, tokens, start, state, wanted)?)
    }

    fn begin_tape(&self, state: &mut CudaState) -> Result<(), BackendError> {
        CudaModel::begin_tape(self, state)?;
        Ok(())
    }

    fn rollback_retaining(&self, state: &mut CudaState, keep: usize) -> Result<bool, BackendError> {
        Ok(CudaModel::rollback_retaining(self, state, keep)?)
    }

    fn greedy_chain(
        &self,
        first: u32,
        start: usize,
        state: &mut CudaState,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, BackendError> {
        Ok(CudaModel::greedy_chain(
            self, first, start, state, max_steps, on_token,
        )?)
    }

    fn last_logits(&self, state: &mut CudaState) -> Result<Option<Vec<f32>>, BackendError> {
        Ok(CudaModel::last_logits(self, state)?)
    }

    fn one_time_work(&self) -> u64 {
        crate::graph_captures()
    }

    /// One pass (`LoadOptions::max_pass_rows`): the runtime's 256-row chunks made the 4B's 512-token
    /// prefill two passes, 23.9k tok/s through the server against 32.3k for one.
    fn prefill_chunk(&self) -> usize {
        self.opts.max_pass_rows.max(1)
    }
}

impl BackendState for CudaState {
    type Snapshot = CudaSnapshot;

    fn position(&self) -> usize {
        CudaState::position(self)
    }

    fn is_recurrent(&self) -> bool {
        CudaState::is_recurrent(self)
    }

    fn rewind(&mut self, position: usize) -> bool {
        CudaState::rewind(self, position)
    }

    fn has_tape(&self) -> bool {
        CudaState::has_tape(self)
    }

    fn end_tape(&mut self) {
        CudaState::end_tape(self)
    }

    fn save(&self) -> Result<CudaSnapshot, BackendError> {
        Ok(self.snapshot()?)
    }

    fn restore(&mut self, snapshot: &CudaSnapshot) -> Result<(), BackendError> {
        Ok(CudaState::restore(self, snapshot)?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use families::{Backend, BackendState, Wanted};

    use super::grown_capacity;
    use crate::{CudaDevice, CudaModel, LoadOptions};

    /// A state grown by `reserve` continues bit-identically to one created large enough.
    #[test]
    fn reserve_moves_the_contents_into_a_larger_state() {
        let dir = testdata::fixture("qwen3_5");
        let ck = model_io::Checkpoint::open(&dir).unwrap();
        let dev = Arc::new(CudaDevice::emulated());
        let m = CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap();
        let prompt: Vec<u32> = (0..20).map(|i| (i * 41 + 3) % 512).collect();
        let mut small = CudaModel::new_state(&m, 8).unwrap();
        m.forward(&prompt[..8], 0, &mut small, &Wanted::none())
            .unwrap();
        assert!(Backend::forward(&m, &prompt[8..], 8, &mut small, &Wanted::all()).is_err());
        Backend::reserve(&m, &mut small, 20).unwrap();
        assert_eq!((small.capacity(), BackendState::position(&small)), (32, 8));
        let a = m
            .forward(&prompt[8..], 8, &mut small, &Wanted::all())
            .unwrap();
        let mut big = CudaModel::new_state(&m, 64).unwrap();
        m.forward(&prompt[..8], 0, &mut big, &Wanted::none())
            .unwrap();
        let b = m
            .forward(&prompt[8..], 8, &mut big, &Wanted::all())
            .unwrap();
        assert!(a
            .logits
            .iter()
            .zip(&b.logits)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        assert_eq!(a.logits.len(), 12 * m.vocab);
    }

    /// Dense models stream their weights past L2 (evict-first); hybrids, whose recurrent states do not
    /// fit it, do not (CudaModel::stream_evict_first).
    #[test]
    fn only_models_without_recurrent_layers_stream_weights_evict_first() {
        let dev = Arc::new(CudaDevice::emulated());
        let root = testdata::fixtures();
        for (family, dense) in [("qwen3", true), ("qwen3_5", false), ("qwen3_next", false)] {
            let ck = model_io::Checkpoint::open(&root.join(family)).unwrap();
            let m = CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap();
            assert_eq!(m.stream_evict_first, dense, "{family}");
        }
    }

    #[test]
    fn capacity_doubles_to_a_power_of_two_capped_at_the_context() {
        assert_eq!(grown_capacity(1024, 1000, 4096), None);
        assert_eq!(grown_capacity(1024, 1024, 4096), None);
        assert_eq!(grown_capacity(1024, 1025, 4096), Some(2048));
        assert_eq!(grown_capacity(1024, 3000, 3500), Some(3500));
        // Past the context: grow to the context; the forward reports the overflow itself.
        assert_eq!(grown_capacity(1024, 9000, 4096), Some(4096));
        assert_eq!(grown_capacity(4096, 9000, 4096), None);
    }
}
