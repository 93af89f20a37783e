//! The mutable state a forward pass reads and extends: per attention layer a KV cache, per Gated-DeltaNet
//! layer the recurrent matrix S and the conv window. The model never owns it (DESIGN.md §1), so the
//! generation loop can snapshot, restore and roll it back.
//!
//! Invariant: every KV cache holds exactly `position` rows, every recurrent state summarises tokens
//! `0..position`. Attention-only models rewind by truncating the caches (`rewind`); recurrent state
//! cannot be rewound and is restored from a `snapshot` or rebuilt from a `Tape`.

use crate::tape::Tape;

/// KV cache of one attention layer. `k`, `v`: [position, kv_heads, head_dim], row t = position t.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// kv_heads * head_dim: floats per cached position.
    pub row: usize,
}

/// State of one Gated-DeltaNet layer.
#[derive(Clone, Debug)]
pub struct RecurrentState {
    /// [value_heads, key_head_dim, value_head_dim]
    pub s: Vec<f32>,
    /// [conv_kernel - 1, conv_dim]: the last K-1 conv inputs, oldest first (zeros before the sequence start).
    pub conv: Vec<f32>,
}

#[derive(Clone, Debug)]
pub enum LayerState {
    Attention(KvCache),
    Recurrent(RecurrentState),
}

#[derive(Clone, Debug)]
pub struct State {
    pub(crate) position: usize,
    pub(crate) layers: Vec<LayerState>,
    /// When set, GDN layers record their per-step inputs so a rejected speculative suffix can be
    /// dropped by replay instead of a second forward (DESIGN.md §4).
    pub(crate) tape: Option<Tape>,
    /// Identifies the model layout this state fits (layer kinds and sizes), checked on every forward.
    pub(crate) signature: String,
}

impl State {
    /// A fresh state (position 0) with one cache per layer, tagged with the owner's `signature`.
    pub fn for_layers(layers: &[crate::model::Layer], signature: String) -> State {
        use crate::model::Mixer;
        let layers = layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attention(a) => LayerState::Attention(a.new_cache()),
                Mixer::Linear(g) => LayerState::Recurrent(g.new_state()),
            })
            .collect();
        State {
            position: 0,
            layers,
            tape: None,
            signature,
        }
    }

    /// Advances the cursor after the caller ran `layers` itself (drafter heads that reuse decoder layers).
    pub fn set_position(&mut self, position: usize) {
        self.position = position;
    }

    /// Mutable access to layer `i`'s cache, for heads that drive `Layer::forward` themselves.
    pub fn layer_mut(&mut self, i: usize) -> Option<&mut LayerState> {
        self.layers.get_mut(i)
    }

    /// Number of tokens the state summarises (the next token's position).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Whether the state contains recurrent layers (and so cannot rewind by moving a cursor).
    pub fn is_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent(_)))
    }

    /// Rewinds an attention-only state to `position` (KV rows past it are dropped). Returns false, leaving the
    /// state untouched, when it holds recurrent layers or `position` is ahead of the state.
    pub fn rewind(&mut self, position: usize) -> bool {
        if self.is_recurrent() || position > self.position {
            return false;
        }
        for layer in &mut self.layers {
            if let LayerState::Attention(kv) = layer {
                kv.k.truncate(position * kv.row);
                kv.v.truncate(position * kv.row);
            }
        }
        self.position = position;
        self.tape = None;
        true
    }

    /// A copy to restore later (snapshot rollback). KV caches are copied too; callers that only need the
    /// recurrent part can use `restore_recurrent` after truncating KV through `truncate_kv`.
    pub fn snapshot(&self) -> State {
        let mut s = self.clone();
        s.tape = None;
        s
    }

    /// Drops KV rows past `position` in every attention layer without touching recurrent layers, and sets the
    /// cursor. Used together with a restored/replayed recurrent state.
    pub(crate) fn truncate_kv(&mut self, position: usize) {
        for layer in &mut self.layers {
            if let LayerState::Attention(kv) = layer {
                kv.k.truncate(position * kv.row);
                kv.v.truncate(position * kv.row);
            }
        }
        self.position = position;
    }

    /// The same layout at position 0: empty KV caches, zeroed recurrent states.
    pub fn zeroed(&self) -> State {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) => LayerState::Attention(KvCache {
                    k: Vec::new(),
                    v: Vec::new(),
                    row: kv.row,
                }),
                LayerState::Recurrent(r) => LayerState::Recurrent(RecurrentState {
                    s: vec![0.0; r.s.len()],
                    conv: vec![0.0; r.conv.len()],
                }),
            })
            .collect();
        State {
            position: 0,
            layers,
            tape: None,
            signature: self.signature.clone(),
        }
    }

    /// Bit-for-bit equality of position, KV caches and recurrent states (the tape is ignored).
    pub fn bitwise_eq(&self, other: &State) -> bool {
        let same = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        };
        self.position == other.position
            && self.layers.len() == other.layers.len()
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|pair| match pair {
                    (LayerState::Attention(a), LayerState::Attention(b)) => {
                        same(&a.k, &b.k) && same(&a.v, &b.v)
                    }
                    (LayerState::Recurrent(a), LayerState::Recurrent(b)) => {
                        same(&a.s, &b.s) && same(&a.conv, &b.conv)
                    }
                    _ => false,
                })
    }

    /// Bytes held by the caches and recurrent states (for stats and memory planning).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) => (kv.k.len() + kv.v.len()) * 4,
                LayerState::Recurrent(r) => (r.s.len() + r.conv.len()) * 4,
            })
            .sum()
    }
}
