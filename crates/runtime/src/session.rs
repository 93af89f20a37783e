//! A session keeps one sequence's model state between requests, so a prompt that extends what the state
//! already covers skips prefilling the covered prefix (multi-turn chat).
//!
//! Invariant: `state.position() == tokens.len()` and, when a drafter is attached, the drafter has observed
//! the same rows (`drafter.position() == tokens.len()`), or it is reset.
//! Reuse: attention-only models reuse any common prefix (the KV cursor moves back); hybrid models reuse a
//! pure continuation, or the prefix up to the fork-point checkpoint kept at the last prompt's final token.

use drafters::Drafter;
use families::{State, Transformer};

/// A saved state at a position, for hybrid models whose recurrent state cannot rewind.
struct Checkpoint {
    tokens: Vec<u32>,
    state: State,
}

pub struct Session {
    pub(crate) state: State,
    pub(crate) tokens: Vec<u32>,
    pub(crate) drafter: Option<Box<dyn Drafter + Send>>,
    checkpoint: Option<Checkpoint>,
}

impl Session {
    pub fn new(model: &Transformer) -> Self {
        Session {
            state: model.new_state(),
            tokens: Vec::new(),
            drafter: None,
            checkpoint: None,
        }
    }

    /// Attaches a drafter (speculative decoding); it starts from an empty context, so the session resets.
    pub fn with_drafter(mut self, drafter: Box<dyn Drafter + Send>) -> Self {
        self.drafter = Some(drafter);
        self.reset_all();
        self
    }

    pub fn has_drafter(&self) -> bool {
        self.drafter.is_some()
    }

    pub fn drafter_name(&self) -> Option<&'static str> {
        self.drafter.as_ref().map(|d| d.name())
    }

    /// Tokens the state covers.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn reset_all(&mut self) {
        self.state = self.state.zeroed();
        self.tokens.clear();
        self.checkpoint = None;
        if let Some(d) = &mut self.drafter {
            d.reset();
        }
    }

    /// Keeps a copy of the current state as the fork point (hybrids only; attention-only states rewind).
    pub(crate) fn save_checkpoint(&mut self) {
        if self.state.is_recurrent() {
            self.checkpoint = Some(Checkpoint {
                tokens: self.tokens.clone(),
                state: self.state.snapshot(),
            });
        }
    }

    /// Prepares the state to continue `prompt` and returns how many of its tokens are already covered
    /// (at most `prompt.len() - 1`: the last prompt token is always run, its logits pick the first token).
    pub(crate) fn reuse(&mut self, prompt: &[u32]) -> usize {
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
            self.state = cp.state.snapshot();
            cp.tokens.len()
        } else {
            0
        };
        if reused == 0 {
            self.reset_all();
            return 0;
        }
        self.tokens.truncate(reused);
        if let Some(d) = &mut self.drafter {
            if d.rewind(reused).is_err() {
                self.reset_all();
                return 0;
            }
        }
        reused
    }
}
