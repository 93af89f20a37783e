//! A session keeps one sequence's model state between requests, so a prompt that extends what the state
//! already covers skips prefilling the covered prefix (multi-turn chat).
//!
//! Invariant (between generations, once one has run): `state.position() == tokens.len()` and, when a
//! drafter is attached, the drafter has observed the same rows (`drafter.position() == tokens.len()`),
//! or it is reset.
//! Reuse: attention-only models reuse any common prefix (the KV cursor moves back); hybrid models reuse a
//! pure continuation, or the prefix up to the fork-point checkpoint kept at the last prompt's final token.
//!
//! A session works on any backend of the seam (`families::Backend`): its state lives on the model's
//! device, and resetting restores the snapshot of the fresh state taken at creation (so a device state
//! keeps its buffers).

use drafters::Drafter;
use families::{Backend, BackendState, State, Transformer};

use crate::error::RuntimeError;
use crate::tuner::BlockTuner;

/// A saved state at a position, for hybrid models whose recurrent state cannot rewind.
struct Checkpoint<S> {
    tokens: Vec<u32>,
    state: S,
}

/// One sequence on a model whose per-sequence state is `S` (`families::State` on the CPU engine,
/// `device::ModelState` for a model on either device). Plain `Session` is the CPU engine's.
pub struct Session<S: BackendState = State> {
    pub(crate) state: S,
    pub(crate) tokens: Vec<u32>,
    pub(crate) drafter: Option<Box<dyn Drafter + Send>>,
    /// The `auto` block tuner of the last greedy speculative generation, continued by the next one (its
    /// acceptance and cost figures belong to this model, device and drafter, not to one sequence).
    pub(crate) tuner: Option<BlockTuner>,
    checkpoint: Option<Checkpoint<S::Snapshot>>,
    /// The state as created (position 0), restored by `reset_all`.
    fresh: S::Snapshot,
}

impl Session<State> {
    /// A session on the CPU engine (its state cannot fail to allocate).
    pub fn new(model: &Transformer) -> Self {
        let state = model.new_state();
        Session {
            fresh: state.snapshot(),
            state,
            tokens: Vec::new(),
            drafter: None,
            tuner: None,
            checkpoint: None,
        }
    }
}

impl<S: BackendState> Session<S> {
    /// A session on any backend (allocates the model's state on its device).
    pub fn open<B: Backend<State = S>>(model: &B) -> Result<Self, RuntimeError> {
        let state = model.new_state()?;
        Ok(Session {
            fresh: state.save()?,
            state,
            tokens: Vec::new(),
            drafter: None,
            tuner: None,
            checkpoint: None,
        })
    }

    /// Attaches a drafter (speculative decoding); it starts from an empty context, so the session forgets
    /// its tokens. The state itself is reset by the next generation, which then finds no covered prefix
    /// (`reuse` resets whenever it reuses nothing), so attaching cannot fail on a device.
    pub fn with_drafter(mut self, mut drafter: Box<dyn Drafter + Send>) -> Self {
        drafter.reset();
        self.drafter = Some(drafter);
        self.tuner = None;
        self.tokens.clear();
        self.checkpoint = None;
        self
    }

    pub fn has_drafter(&self) -> bool {
        self.drafter.is_some()
    }

    pub fn drafter_name(&self) -> Option<&'static str> {
        self.drafter.as_ref().map(|d| d.name())
    }

    /// The block tuner the next greedy `auto` generation continues, if one has run.
    pub fn block_tuner(&self) -> Option<&BlockTuner> {
        self.tuner.as_ref()
    }

    /// Tokens the state covers.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn state(&self) -> &S {
        &self.state
    }

    /// The state, ending the session (to probe what a generation left behind, e.g. in tests).
    pub fn into_state(self) -> S {
        self.state
    }

    /// Forgets the sequence: the state returns to its fresh contents, the drafter resets.
    pub fn reset_all(&mut self) -> Result<(), RuntimeError> {
        self.tokens.clear();
        self.checkpoint = None;
        if let Some(d) = &mut self.drafter {
            d.reset();
        }
        self.state.restore(&self.fresh)?;
        Ok(())
    }

    /// Makes the drafter forget earlier requests (`Drafter::forget_earlier_requests`): the server
    /// calls it before a request from another API key, or before every request when it has none.
    pub fn forget_earlier_requests(&mut self) {
        if let Some(d) = &mut self.drafter {
            d.forget_earlier_requests();
        }
    }

    /// Keeps a copy of the current state as the fork point (hybrids only; attention-only states rewind).
    pub(crate) fn save_checkpoint(&mut self) -> Result<(), RuntimeError> {
        if self.state.is_recurrent() {
            self.checkpoint = Some(Checkpoint {
                tokens: self.tokens.clone(),
                state: self.state.save()?,
            });
        }
        Ok(())
    }

    /// Prepares the state to continue `prompt` and returns how many of its tokens are already covered
    /// (at most `prompt.len() - 1`: the last prompt token is always run, its logits pick the first token).
    pub(crate) fn reuse(&mut self, prompt: &[u32]) -> Result<usize, RuntimeError> {
        let cap = prompt.len().saturating_sub(1);
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(cap);
        let drafter_at = self.drafter.as_ref().map_or(usize::MAX, |d| d.position());
        let reused = if !self.state.is_recurrent() {
            let keep = common.min(drafter_at);
            self.state.rewind(keep);
            keep
        } else if common == self.tokens.len() && drafter_at >= common {
            common
        } else if let Some(cp) = self.checkpoint.as_ref().filter(|cp| {
            cp.tokens.len() <= common
                && prompt.starts_with(&cp.tokens)
                && drafter_at >= cp.tokens.len()
        }) {
            self.state.restore(&cp.state)?;
            cp.tokens.len()
        } else {
            0
        };
        if reused == 0 {
            self.reset_all()?;
            return Ok(0);
        }
        self.tokens.truncate(reused);
        if let Some(d) = &mut self.drafter {
            if d.rewind(reused).is_err() {
                self.reset_all()?;
                return Ok(0);
            }
        }
        Ok(reused)
    }
}
