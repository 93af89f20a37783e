//! One decoder-only transformer covering every supported family: a stack of layers, each a token mixer
//! (attention or Gated DeltaNet) and a feed-forward block (dense or MoE), pre-norm residual:
//! `x += mixer(norm₁(x)); x += ffn(norm₂(x))`, then the final norm and the LM head.
//!
//! `forward(tokens, start, &mut State, &Wanted)` runs n rows at positions start..start+n, extends the
//! state by n, and returns logits only for the rows asked for plus any hidden-state taps a drafter asked
//! for. The model holds weights only; all per-sequence data lives in `State`.

use crate::error::ModelError;
use crate::layers::attention::Attention;
use crate::layers::ffn::Ffn;
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::{Linear, Norm};
use crate::state::{LayerState, State};
use crate::tape::LayerTape;

#[derive(Clone, Debug)]
pub enum Mixer {
    Attention(Attention),
    Linear(GatedDeltaNet),
}

#[derive(Clone, Debug)]
pub struct Layer {
    pub input_norm: Norm,
    pub mixer: Mixer,
    pub post_norm: Norm,
    pub ffn: Ffn,
}

impl Layer {
    /// x: [n, hidden] residual stream, updated in place.
    pub fn forward(
        &self,
        x: &mut [f32],
        n: usize,
        start: usize,
        state: &mut LayerState,
        tape: Option<&mut LayerTape>,
    ) -> Result<(), ModelError> {
        let mut h = vec![0.0; x.len()];
        self.input_norm.apply(x, &mut h);
        let mixed = match (&self.mixer, state) {
            (Mixer::Attention(a), LayerState::Attention(kv)) => a.forward(&h, n, start, kv),
            (Mixer::Linear(g), LayerState::Recurrent(r)) => g.forward(&h, n, r, tape),
            _ => {
                return Err(ModelError::StateMismatch(
                    "layer kind differs from its state".into(),
                ))
            }
        };
        kernels::add_inplace(x, &mixed);
        self.post_norm.apply(x, &mut h);
        let y = self.ffn.forward(&h, n);
        kernels::add_inplace(x, &y);
        Ok(())
    }
}

/// Which logits rows a forward returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rows {
    None,
    Last,
    All,
    /// Rows `from..n` (e.g. the verify rows of a speculative round).
    From(usize),
}

/// A hidden-state tap a drafter can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tap {
    /// The residual stream after decoder layer i (HF `hidden_states[i + 1]`).
    LayerOutput(usize),
    /// The hidden state after the final norm (what the LM head reads; the MTP head's input).
    FinalHidden,
}

#[derive(Clone, Debug)]
pub struct Wanted {
    pub logits: Rows,
    pub taps: Vec<Tap>,
    /// The caller needs only each returned row's argmax (lowest index on ties, NaN skipped: greedy
    /// decoding without penalties). A backend may then answer with `ForwardOut::argmax` and no logits
    /// (the GPU: 4 bytes per row across the bus instead of the whole row); it must send the logits
    /// whenever a row holds a NaN, +inf or nothing but -inf, so that the caller reports it.
    pub argmax_only: bool,
    /// K > 0: the caller can shape each returned row from its candidates, every logit at or above the
    /// row's K-th largest (sampling's `ShapedDistribution::from_candidates`: top-k requests). A
    /// backend may then answer with `ForwardOut::candidates` and no logits (the GPU: ~K values per row
    /// across the bus instead of the row), keeping the rows for `Backend::last_logits`; it must send
    /// the logits whenever a row holds a NaN or +inf.
    pub candidates: usize,
}

impl Wanted {
    pub fn last() -> Self {
        Wanted {
            logits: Rows::Last,
            taps: Vec::new(),
            argmax_only: false,
            candidates: 0,
        }
    }
    pub fn all() -> Self {
        Wanted {
            logits: Rows::All,
            taps: Vec::new(),
            argmax_only: false,
            candidates: 0,
        }
    }
    pub fn none() -> Self {
        Wanted {
            logits: Rows::None,
            taps: Vec::new(),
            argmax_only: false,
            candidates: 0,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ForwardOut {
    /// [rows, vocab] for the rows asked for, in order.
    pub logits: Vec<f32>,
    /// Index (within the forward's n rows) of the first returned logits row.
    pub first_row: usize,
    pub rows: usize,
    /// One [n, hidden] buffer per requested tap, in request order.
    pub taps: Vec<Vec<f32>>,
    /// The returned rows' argmax instead of their logits (`logits` then empty), when the caller set
    /// `Wanted::argmax_only` and the backend took that path.
    pub argmax: Option<Vec<u32>>,
    /// The returned rows' candidates instead of their logits (`logits` then empty), when the caller set
    /// `Wanted::candidates` and the backend took that path.
    pub candidates: Option<Vec<Candidates>>,
}

/// A logits row's largest values: every logit at or above the row's K-th largest (ties included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    /// Increasing token ids.
    pub ids: Vec<u32>,
    /// Their logits.
    pub logits: Vec<f32>,
}

impl ForwardOut {
    /// Logits of returned row i.
    pub fn row(&self, i: usize) -> &[f32] {
        let v = self.logits.len() / self.rows.max(1);
        &self.logits[i * v..(i + 1) * v]
    }
}

#[derive(Clone, Debug)]
pub struct Transformer {
    pub family: model_io::Family,
    pub embed: Vec<f32>, // [vocab, hidden]
    pub layers: Vec<Layer>,
    pub final_norm: Norm,
    /// None when tied to f32 embeddings (the head reads `embed`); tied bf16 embeddings get a bf16 copy here
    /// (`Linear::tied_head`).
    pub lm_head: Option<Linear>, // [vocab, hidden]
    pub vocab: usize,
    pub hidden: usize,
    pub context: usize,
}

impl Transformer {
    /// A fresh state (position 0) for this model.
    pub fn new_state(&self) -> State {
        State::for_layers(&self.layers, self.signature())
    }

    pub(crate) fn signature(&self) -> String {
        let kinds: String = self
            .layers
            .iter()
            .map(|l| {
                if matches!(l.mixer, Mixer::Attention(_)) {
                    'A'
                } else {
                    'L'
                }
            })
            .collect();
        format!("{:?}/{}/{}/{}", self.family, self.hidden, self.vocab, kinds)
    }

    /// Empty tapes for a speculative round (one per GDN layer).
    pub fn new_tapes(&self) -> Vec<Option<LayerTape>> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Linear(g) => Some(LayerTape::new(g.conv_dim(), g.kernel, g.hv, g.dk, g.dv)),
                Mixer::Attention(_) => None,
            })
            .collect()
    }

    /// Starts recording a tape on `state` (see `State::rollback_retaining`).
    pub fn begin_tape(&self, state: &mut State) {
        state.begin_tape(self.new_tapes());
    }

    pub fn is_hybrid(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.mixer, Mixer::Linear(_)))
    }

    pub fn embed_row(&self, token: u32) -> Option<&[f32]> {
        let t = token as usize;
        (t < self.vocab).then(|| &self.embed[t * self.hidden..(t + 1) * self.hidden])
    }

    /// Logits for hidden rows `h`: [n, hidden] (already final-normed) -> [n, vocab].
    pub fn lm_head(&self, h: &[f32], n: usize) -> Vec<f32> {
        match &self.lm_head {
            Some(head) => head.forward(h, n),
            None => {
                let mut out = vec![0.0; n * self.vocab];
                kernels::linear(h, &self.embed, n, self.hidden, self.vocab, &mut out);
                out
            }
        }
    }

    /// Runs `tokens` at positions start..start+n. The state must be at `start` (an attention-only state
    /// ahead of `start` is rewound to it first). One sequence of [`Transformer::forward_batch`].
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, ModelError> {
        let mut one = [crate::backend::SeqRows {
            tokens,
            start,
            state,
            wanted,
        }];
        let mut outs = self.forward_batch(&mut one)?;
        Ok(outs.remove(0))
    }
}
