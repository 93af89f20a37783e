//! The seam between the decode loop and the device a model runs on (DESIGN.md §1).
//!
//! The loop (`runtime::generate`, `runtime::Session`) drives a model only through [`Backend`] and its
//! state only through [`BackendState`]: forward over n rows, tape begin / rollback, snapshot / restore,
//! cursor rewind. The CPU engine ([`Transformer`], [`State`]) implements them here; the CUDA backend
//! implements them in `cuda_backend::adapter`; the `device` crate's `Model` / `ModelState` enums
//! dispatch between the two with a `match` (candle's `enum Storage`), so the loop is written once and
//! monomorphised, with no `dyn` on the hot path.
//!
//! Drafters run on the host and read only the target's embedding rows and LM head ([`TargetHead`]):
//! the CPU engine is its own head; a model on another device lends a [`HostHead`] (the embedding table
//! and LM head loaded to host memory). Acceptance depends only on the target's logits, so where the
//! drafter runs never changes what is generated.
//!
//! Invariant every implementation keeps (the CPU engine's semantics): `forward(tokens, start, ..)`
//! extends the state from `start` to `start + n`; `rollback_retaining(keep)` leaves the state exactly as
//! if only the first `keep` rows since `begin_tape` had been run; `restore(save())` returns the state
//! to the saved position and contents.

use crate::error::ModelError;
use crate::layers::{Linear, Tensors};
use crate::model::{ForwardOut, Transformer, Wanted};
use crate::state::State;

/// A backend failure: the CPU engine's meaning ([`ModelError`]: bad token, context overflow, state
/// mismatch, ...) or a device's own failure (driver call, out of memory, unsupported feature), kept
/// with its source so front ends print the whole cause.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Device(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// One sequence's rows in a [`Backend::forward_batch`]: `tokens` [n] at positions start..start+n of
/// `state` — a decode row, a verify block [next, d1..dk], or a prefill chunk — and what it wants back.
pub struct SeqRows<'a, S> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub state: &'a mut S,
    pub wanted: &'a Wanted,
}

/// A model the decode loop can drive. `State` is the per-sequence data the model reads and extends.
pub trait Backend {
    type State: BackendState;

    /// Longest sequence (positions) the model accepts.
    fn context(&self) -> usize;
    fn vocab(&self) -> usize;
    /// A fresh state at position 0.
    fn new_state(&self) -> Result<Self::State, BackendError>;
    /// Makes `state` able to hold `positions` positions (a device state with fixed buffers is moved
    /// into larger ones, keeping its contents); a no-op where storage grows by itself.
    fn reserve(&self, state: &mut Self::State, positions: usize) -> Result<(), BackendError>;
    /// Runs `tokens` at positions start..start+n (see `Transformer::forward`).
    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut Self::State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError>;
    /// Runs several sequences' rows in one call, each from its own start on its own state: result i
    /// is what `forward` would return for sequence i alone, bit for bit (a row's numerics never depend
    /// on the other sequences' rows). The decode loop calls this with one sequence; a batching
    /// scheduler passes many. Default: one `forward` per sequence.
    fn forward_batch(
        &self,
        batch: &mut [SeqRows<'_, Self::State>],
    ) -> Result<Vec<ForwardOut>, BackendError> {
        batch
            .iter_mut()
            .map(|s| self.forward(s.tokens, s.start, s.state, s.wanted))
            .collect()
    }
    /// Starts recording a tape on `state` (replacing any previous one).
    fn begin_tape(&self, state: &mut Self::State) -> Result<(), BackendError>;
    /// Keeps the first `keep` rows run since `begin_tape` and drops the rest; ends the tape. `Ok(false)`
    /// (state untouched) when there is no tape or `keep` exceeds what was recorded.
    fn rollback_retaining(
        &self,
        state: &mut Self::State,
        keep: usize,
    ) -> Result<bool, BackendError>;
    /// Greedy steps (plain argmax) queued back to back: runs `first` at `start`, then each step's argmax
    /// at the next position, handing every argmax to `on_token` in order until it returns false or
    /// `max_steps` were handed over. `Ok(Some(n))`: the state covers the n tokens run (`first` and the
    /// argmaxes before the last one handed over), bit for bit as n one-row `forward`s would leave it, even
    /// though a backend may have run one step more to overlap the host's work with the device's.
    /// `Ok(None)`: nothing ran (this backend or state does not chain); step with `forward`. A row greedy
    /// decoding must refuse (NaN, +inf, nothing above -inf) is an error.
    fn greedy_chain(
        &self,
        _first: u32,
        _start: usize,
        _state: &mut Self::State,
        _max_steps: usize,
        _on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, BackendError> {
        Ok(None)
    }
    /// The logits rows of the last `forward` on `state` that answered with `ForwardOut::candidates`, as
    /// its `logits` would have held them (for a row its candidates cannot shape). None: not kept.
    fn last_logits(&self, _state: &mut Self::State) -> Result<Option<Vec<f32>>, BackendError> {
        Ok(None)
    }
    /// A count that grows whenever the backend does work a later identical call will not repeat (a CUDA
    /// graph captured): whoever times calls to compare them (the block tuner) skips those that grew it.
    fn one_time_work(&self) -> u64 {
        0
    }
    /// Prompt rows per prefill forward: large enough for GEMM efficiency, small enough that cancellation
    /// and progress are polled often. The CPU engine's 256; a backend that splits forwards into passes
    /// itself says its pass size (a chunk smaller than a pass only adds passes).
    fn prefill_chunk(&self) -> usize {
        PREFILL_CHUNK
    }
}

/// [`Backend::prefill_chunk`]'s default.
pub const PREFILL_CHUNK: usize = 256;

/// The per-sequence state of a [`Backend`].
pub trait BackendState {
    /// A saved copy of the state's contents ([`BackendState::save`]).
    type Snapshot;

    /// Number of tokens the state summarises (the next token's position).
    fn position(&self) -> usize;
    /// Whether the state holds recurrent layers (and so cannot rewind by moving a cursor).
    fn is_recurrent(&self) -> bool;
    /// Rewinds an attention-only state to `position`; false (state untouched) for recurrent states or
    /// a position ahead of the state.
    fn rewind(&mut self, position: usize) -> bool;
    fn has_tape(&self) -> bool;
    /// Ends the tape, keeping everything that was run.
    fn end_tape(&mut self);
    /// A copy of the contents to restore later (snapshot rollback, session fork points).
    fn save(&self) -> Result<Self::Snapshot, BackendError>;
    /// Restores a snapshot saved from this state (ends any tape).
    fn restore(&mut self, snapshot: &Self::Snapshot) -> Result<(), BackendError>;
}

impl Backend for Transformer {
    type State = State;

    fn context(&self) -> usize {
        self.context
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn new_state(&self) -> Result<State, BackendError> {
        Ok(Transformer::new_state(self))
    }

    fn reserve(&self, _state: &mut State, _positions: usize) -> Result<(), BackendError> {
        Ok(())
    }

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        Ok(Transformer::forward(self, tokens, start, state, wanted)?)
    }

    fn forward_batch(
        &self,
        batch: &mut [SeqRows<'_, State>],
    ) -> Result<Vec<ForwardOut>, BackendError> {
        Ok(Transformer::forward_batch(self, batch)?)
    }

    fn begin_tape(&self, state: &mut State) -> Result<(), BackendError> {
        Transformer::begin_tape(self, state);
        Ok(())
    }

    fn rollback_retaining(&self, state: &mut State, keep: usize) -> Result<bool, BackendError> {
        Ok(state.rollback_retaining(keep))
    }
}

/// A shared model is the model (`Arc<Transformer>`, `Arc<CudaModel>` drive the loop directly).
impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    type State = T::State;

    fn context(&self) -> usize {
        (**self).context()
    }

    fn vocab(&self) -> usize {
        (**self).vocab()
    }

    fn new_state(&self) -> Result<T::State, BackendError> {
        (**self).new_state()
    }

    fn reserve(&self, state: &mut T::State, positions: usize) -> Result<(), BackendError> {
        (**self).reserve(state, positions)
    }

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut T::State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        (**self).forward(tokens, start, state, wanted)
    }

    fn begin_tape(&self, state: &mut T::State) -> Result<(), BackendError> {
        (**self).begin_tape(state)
    }

    fn forward_batch(
        &self,
        batch: &mut [SeqRows<'_, T::State>],
    ) -> Result<Vec<ForwardOut>, BackendError> {
        (**self).forward_batch(batch)
    }

    fn rollback_retaining(&self, state: &mut T::State, keep: usize) -> Result<bool, BackendError> {
        (**self).rollback_retaining(state, keep)
    }

    fn greedy_chain(
        &self,
        first: u32,
        start: usize,
        state: &mut T::State,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, BackendError> {
        (**self).greedy_chain(first, start, state, max_steps, on_token)
    }

    fn last_logits(&self, state: &mut T::State) -> Result<Option<Vec<f32>>, BackendError> {
        (**self).last_logits(state)
    }

    fn one_time_work(&self) -> u64 {
        (**self).one_time_work()
    }

    fn prefill_chunk(&self) -> usize {
        (**self).prefill_chunk()
    }
}

impl BackendState for State {
    type Snapshot = State;

    fn position(&self) -> usize {
        State::position(self)
    }

    fn is_recurrent(&self) -> bool {
        State::is_recurrent(self)
    }

    fn rewind(&mut self, position: usize) -> bool {
        State::rewind(self, position)
    }

    fn has_tape(&self) -> bool {
        State::has_tape(self)
    }

    fn end_tape(&mut self) {
        State::end_tape(self)
    }

    fn save(&self) -> Result<State, BackendError> {
        Ok(self.snapshot())
    }

    fn restore(&mut self, snapshot: &State) -> Result<(), BackendError> {
        if snapshot.signature != self.signature {
            return Err(ModelError::StateMismatch(snapshot.signature.clone()).into());
        }
        *self = snapshot.snapshot();
        Ok(())
    }
}

/// How drafters hold their target's head (the CPU engine itself, or a [`HostHead`]).
pub type SharedHead = std::sync::Arc<dyn TargetHead + Send + Sync>;

/// What a drafter reads from its target: sizes, embedding rows and the LM head, on the host.
pub trait TargetHead {
    fn hidden(&self) -> usize;
    fn vocab(&self) -> usize;
    /// Decoder layers of the target (bounds the layer taps a drafter may ask for).
    fn num_layers(&self) -> usize;
    /// Embedding row of `token` ([hidden]); None outside the vocabulary.
    fn embed_row(&self, token: u32) -> Option<&[f32]>;
    /// Logits for final-normed hidden rows: [n, hidden] -> [n, vocab].
    fn lm_head(&self, h: &[f32], n: usize) -> Vec<f32>;
    /// The logits of the first `tokens` ids only ([n, hidden] -> [n, tokens]), with the bits `lm_head`
    /// gives them: a draft head over a reduced vocabulary. The default computes the whole head.
    fn lm_head_prefix(&self, h: &[f32], n: usize, tokens: usize) -> Vec<f32> {
        let vocab = self.vocab();
        let tokens = tokens.min(vocab);
        let full = self.lm_head(h, n);
        full.chunks_exact(vocab)
            .flat_map(|row| row[..tokens].iter().copied())
            .collect()
    }
}

/// [`TargetHead::lm_head_prefix`] for a head held as `Option<Linear>` (None: tied to f32 embeddings).
fn head_prefix(
    head: &Option<Linear>,
    embed: &[f32],
    hidden: usize,
    h: &[f32],
    n: usize,
    tokens: usize,
) -> Vec<f32> {
    match head {
        Some(head) => head.forward_rows(h, n, tokens),
        None => {
            let tokens = tokens.min(embed.len() / hidden.max(1));
            let mut out = vec![0.0; n * tokens];
            kernels::linear(h, &embed[..tokens * hidden], n, hidden, tokens, &mut out);
            out
        }
    }
}

impl TargetHead for Transformer {
    fn hidden(&self) -> usize {
        self.hidden
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn embed_row(&self, token: u32) -> Option<&[f32]> {
        Transformer::embed_row(self, token)
    }

    fn lm_head(&self, h: &[f32], n: usize) -> Vec<f32> {
        Transformer::lm_head(self, h, n)
    }

    fn lm_head_prefix(&self, h: &[f32], n: usize, tokens: usize) -> Vec<f32> {
        head_prefix(&self.lm_head, &self.embed, self.hidden, h, n, tokens)
    }
}

/// A target's embedding table and LM head in host memory (f32), for host drafters of a model whose
/// decoder runs on another device. Loaded as `families::load` loads them (tied heads read the
/// embeddings), so its logits equal the CPU engine's LM head on the same rows.
#[derive(Clone, Debug)]
pub struct HostHead {
    embed: Vec<f32>,         // [vocab, hidden]
    lm_head: Option<Linear>, // [vocab, hidden]; None when tied to f32 embeddings (`Linear::tied_head`)
    vocab: usize,
    hidden: usize,
    layers: usize,
}

impl HostHead {
    pub fn load(ck: &model_io::Checkpoint) -> Result<Self, ModelError> {
        let c = &ck.config;
        let t = Tensors::new(&ck.tensors, c.tensor_prefix.clone());
        let embed = t.get("embed_tokens.weight", &[c.vocab_size, c.hidden_size])?;
        let root = Tensors::new(&ck.tensors, "");
        let lm_head = if c.tie_word_embeddings {
            Linear::tied_head(&t, "embed_tokens.weight", c.vocab_size, c.hidden_size)?
        } else {
            Some(Linear::load(
                &root,
                "lm_head.weight",
                c.vocab_size,
                c.hidden_size,
            )?)
        };
        Ok(HostHead {
            embed,
            lm_head,
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            layers: c.num_hidden_layers,
        })
    }
}

impl TargetHead for HostHead {
    fn hidden(&self) -> usize {
        self.hidden
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn num_layers(&self) -> usize {
        self.layers
    }

    fn embed_row(&self, token: u32) -> Option<&[f32]> {
        let t = token as usize;
        (t < self.vocab).then(|| &self.embed[t * self.hidden..(t + 1) * self.hidden])
    }

    fn lm_head(&self, h: &[f32], n: usize) -> Vec<f32> {
        match &self.lm_head {
            Some(head) => head.forward(h, n),
            None => {
                let mut out = vec![0.0; n * self.vocab];
                kernels::linear(h, &self.embed, n, self.hidden, self.vocab, &mut out);
                out
            }
        }
    }

    fn lm_head_prefix(&self, h: &[f32], n: usize, tokens: usize) -> Vec<f32> {
        head_prefix(&self.lm_head, &self.embed, self.hidden, h, n, tokens)
    }
}
