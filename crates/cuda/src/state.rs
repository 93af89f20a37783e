//! Per-sequence GPU state, the counterpart of `families::State`: per attention layer a KV cache
//! [capacity, kv_heads, head_dim] (f32), per Gated-DeltaNet layer S [hv, dk, dv] and the conv window
//! [K-1, conv_dim] (f32), plus the scratch buffers of the forward passes and the captured decode graph.
//!
//! Invariants: KV rows 0..position hold the sequence's keys/values; every recurrent state summarises
//! tokens 0..position. Buffers are allocated once, at creation, and never move: `restore` and tape
//! rollback copy into them, so the decode graph (which holds their addresses) stays valid. The graph is
//! dropped whenever a scratch buffer it uses could be reallocated. A greedy chain (chain.rs) alternates its
//! steps between S / windows and a second pair (`alt`, allocated by the first chain) and copies the state
//! back before it returns, so outside a chain the state always lives in its own buffers.
//!
//! Tape (DESIGN.md §4, on the GPU): while a tape records, each GDN layer keeps S and the conv window as
//! they were at the tape's start and appends every row of its fused projection [qkv ; z ; b ; a].
//! `rollback_retaining(keep)` restores the start copies and reruns conv1d_silu + gdn_step over the first
//! `keep` recorded rows: the same kernels on the same inputs (a pass that records never runs the chunked
//! GDN form), so the state is bit-identical to having run only those rows; attention layers just move the cursor. No forward pass is needed.

use cudarc::driver::CudaGraph;

use crate::buf::{dtod, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::ops::GdnShape;
pub(crate) use crate::scratch::{Scratch, Widths, LOGIT_ROWS};

pub(crate) enum LayerState {
    Attention {
        k: DBuf,
        v: DBuf,
        row_floats: usize,
    },
    Recurrent {
        s: DBuf,
        conv: DBuf,
        shape: GdnShape,
        /// [S, window] of the same shapes, allocated by the first chain (chain.rs): its steps alternate
        /// between these and `s` / `conv`, so the last one queued can be dropped.
        alt: Option<(DBuf, DBuf)>,
    },
}

/// Where a one-row decode step reads each GDN layer's S and conv window and where it leaves the new ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepIo {
    InPlace,
    /// From the state's buffers into their alternates (a chain's even steps).
    MainToAlt,
    /// From the alternates back (its odd steps).
    AltToMain,
}

/// KV caches of `capacity` positions for a drafter's attention layers (the MTP head's, DFlash's).
pub(crate) fn attention_caches(
    dev: &CudaDevice,
    layers: &[crate::model::LayerW],
    capacity: usize,
) -> Result<Vec<LayerState>, CudaError> {
    layers
        .iter()
        .map(|l| {
            let crate::model::MixerW::Attention(a) = &l.mixer else {
                return Err(CudaError::Unsupported {
                    what: "a drafter layer that is not full attention".into(),
                });
            };
            let row_floats = a.shape.hkv * a.shape.d;
            Ok(LayerState::Attention {
                k: DBuf::f32s(dev, capacity * row_floats)?,
                v: DBuf::f32s(dev, capacity * row_floats)?,
                row_floats,
            })
        })
        .collect()
}

/// Copies positions 0..rows of each attention cache in `old` into the matching one in `new`.
pub(crate) fn copy_cache_rows(
    dev: &CudaDevice,
    new: &[LayerState],
    old: &[LayerState],
    rows: usize,
) -> Result<(), CudaError> {
    for (new, old) in new.iter().zip(old) {
        if let (
            LayerState::Attention {
                k: nk,
                v: nv,
                row_floats,
            },
            LayerState::Attention { k: ok, v: ov, .. },
        ) = (new, old)
        {
            let bytes = rows * row_floats * 4;
            dtod(dev, nk.ptr, ok.ptr, bytes)?;
            dtod(dev, nv.ptr, ov.ptr, bytes)?;
        }
    }
    Ok(())
}

/// Projection rows a new tape holds before it grows (a verify block is at most gemv_max_rows).
const TAPE_ROWS: usize = 32;

/// Recorded inputs of one GDN layer since the tape started.
pub(crate) struct LayerTape {
    pub s0: DBuf,
    pub conv0: DBuf,
    /// [capacity, proj_width]
    pub proj: DBuf,
    pub capacity: usize,
    pub rows: usize,
}

pub(crate) struct Tape {
    pub start_position: usize,
    pub layers: Vec<Option<LayerTape>>,
}

/// A GPU copy of a state's contents (see [`CudaState::snapshot`]).
pub struct CudaSnapshot {
    position: usize,
    signature: String,
    /// Per layer: KV prefix (k, v) or (S, conv window).
    layers: Vec<(DBuf, DBuf)>,
}

/// The GPU state of one sequence for a [`crate::CudaModel`].
pub struct CudaState {
    pub(crate) dev: std::sync::Arc<CudaDevice>,
    pub(crate) position: usize,
    pub(crate) capacity: usize,
    pub(crate) signature: String,
    pub(crate) layers: Vec<LayerState>,
    pub(crate) tape: Option<Tape>,
    /// The last ended tape's buffers, reused by the next `begin_tape` (a speculative round would
    /// otherwise allocate and free three buffers per GDN layer).
    pub(crate) spare_tape: Option<Tape>,
    /// Scratch for one-row passes (fixed: the decode graph uses it).
    pub(crate) one: Scratch,
    /// Scratch for multi-row passes, grown on demand.
    pub(crate) many: Option<Scratch>,
    pub(crate) widths: Widths,
    pub(crate) graph: Option<CudaGraph>,
    /// The decode graph that also leaves the final-norm hidden row in `one.h` (a drafter's tap: the
    /// speculative loop's plain steps), captured on first use.
    pub(crate) graph_hidden: Option<CudaGraph>,
    /// Why graph capture failed on this state (decode then uses direct launches).
    pub(crate) graph_error: Option<String>,
    /// A chain's step graphs and token slots (chain.rs), made by the first chain.
    pub(crate) chain: Option<crate::chain::ChainBufs>,
    /// Captured verify blocks (`verify_graph.rs`); cleared whenever `many` is replaced.
    pub(crate) verify_graphs: Vec<(crate::verify_graph::VerifyKey, CudaGraph)>,
    pub(crate) verify_graph_error: Option<String>,
    /// Counts tape buffer allocations (verify graphs hold the tape's buffers).
    pub(crate) tape_epoch: u64,
    /// Where sampled rows' candidates are selected (candidates.rs), made by the first forward that wants
    /// them, for LOGIT_ROWS rows.
    pub(crate) candidates: Option<crate::candidates::CandidateBufs>,
    /// The logits rows (device address, rows) the last forward answered with candidates instead of
    /// copying (`CudaModel::last_logits`); None after any other forward.
    pub(crate) last_logits: Option<(u64, usize)>,
    /// Layer-output tap rows of the current pass, copied here on the device as their layers finish and
    /// read back once at its end (forward.rs `pass`), grown on demand.
    pub(crate) tap_stage: Option<DBuf>,
}

// SAFETY: the raw handles a state holds (captured graphs, pinned host slots, events) are not bound to a
// thread: the driver only requires that calls on one handle are serialized, and a state is reached only
// through `&mut` (it is not `Sync`). Every launch binds the device's context to the calling thread first
// (cudarc's `CudaGraph::launch` and kernel launches do), so a session may move between threads, e.g.
// onto the model's kernel thread pool.
unsafe impl Send for CudaState {}

impl CudaState {
    /// Number of tokens the state summarises (the next token's position).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Largest position + 1 the KV caches can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn is_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent { .. }))
    }

    /// Rewinds an attention-only state to `position`; false (state untouched) for recurrent states or
    /// a position ahead of the state.
    pub fn rewind(&mut self, position: usize) -> bool {
        if self.is_recurrent() || position > self.position {
            return false;
        }
        self.position = position;
        self.retire_tape();
        true
    }

    /// A copy of the state's contents (KV rows 0..position, S and conv windows) on the GPU.
    pub fn snapshot(&self) -> Result<CudaSnapshot, CudaError> {
        let dev = &*self.dev;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                LayerState::Attention { k, v, row_floats } => {
                    let bytes = self.position * row_floats * 4;
                    let (ck, cv) = (DBuf::zeros(dev, bytes)?, DBuf::zeros(dev, bytes)?);
                    dtod(dev, ck.ptr, k.ptr, bytes)?;
                    dtod(dev, cv.ptr, v.ptr, bytes)?;
                    (ck, cv)
                }
                LayerState::Recurrent { s, conv, .. } => (s.duplicate(dev)?, conv.duplicate(dev)?),
            });
        }
        Ok(CudaSnapshot {
            position: self.position,
            signature: self.signature.clone(),
            layers,
        })
    }

    /// Restores a snapshot taken from this state (copies into the existing buffers; ends any tape).
    pub fn restore(&mut self, snap: &CudaSnapshot) -> Result<(), CudaError> {
        let dev = &*self.dev;
        if snap.signature != self.signature || snap.layers.len() != self.layers.len() {
            return Err(families::ModelError::StateMismatch(snap.signature.clone()).into());
        }
        for (l, (a, b)) in self.layers.iter_mut().zip(&snap.layers) {
            match l {
                LayerState::Attention { k, v, .. } => {
                    dtod(dev, k.ptr, a.ptr, a.bytes)?;
                    dtod(dev, v.ptr, b.ptr, b.bytes)?;
                }
                LayerState::Recurrent { s, conv, .. } => {
                    dtod(dev, s.ptr, a.ptr, a.bytes)?;
                    dtod(dev, conv.ptr, b.ptr, b.bytes)?;
                }
            }
        }
        self.position = snap.position;
        self.retire_tape();
        Ok(())
    }

    /// Starts recording a tape (replacing any previous one). Returns the position it starts at.
    pub(crate) fn begin_tape(&mut self) -> Result<usize, CudaError> {
        self.retire_tape();
        // A spare whose projection buffer grew (a tape of more than TAPE_ROWS rows) has moved: allocate
        // anew, so verify graphs never hold a freed buffer.
        let spare = self
            .spare_tape
            .take()
            .filter(|t| t.layers.iter().flatten().all(|l| l.capacity == TAPE_ROWS));
        if let Some(mut t) = spare {
            for l in t.layers.iter_mut().flatten() {
                l.rows = 0;
            }
            t.start_position = self.position;
            self.tape = Some(t);
            return Ok(self.position);
        }
        self.tape_epoch += 1;
        self.verify_graphs.clear();
        let dev = &*self.dev;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                LayerState::Attention { .. } => None,
                LayerState::Recurrent { s, conv, shape, .. } => {
                    let capacity = TAPE_ROWS;
                    Some(LayerTape {
                        s0: DBuf::zeros(dev, s.bytes)?,
                        conv0: DBuf::zeros(dev, conv.bytes)?,
                        proj: DBuf::f32s(dev, capacity * shape.proj_width())?,
                        capacity,
                        rows: 0,
                    })
                }
            });
        }
        self.tape = Some(Tape {
            start_position: self.position,
            layers,
        });
        Ok(self.position)
    }

    /// Allocates every GDN layer's alternate S and window (chain.rs), once.
    pub(crate) fn ensure_alternates(&mut self) -> Result<(), CudaError> {
        let dev = &*self.dev;
        for l in &mut self.layers {
            if let LayerState::Recurrent { s, conv, alt, .. } = l {
                if alt.is_none() {
                    *alt = Some((DBuf::zeros(dev, s.bytes)?, DBuf::zeros(dev, conv.bytes)?));
                }
            }
        }
        Ok(())
    }

    /// Copies every GDN layer's alternate S and window into its own buffers: a chain that ended with the
    /// state in the alternates leaves it where everything else reads it.
    pub(crate) fn settle_alternates(&mut self) -> Result<(), CudaError> {
        let dev = &*self.dev;
        for l in &self.layers {
            if let LayerState::Recurrent {
                s,
                conv,
                alt: Some((a_s, a_conv)),
                ..
            } = l
            {
                dtod(dev, s.ptr, a_s.ptr, s.bytes)?;
                dtod(dev, conv.ptr, a_conv.ptr, conv.bytes)?;
            }
        }
        Ok(())
    }

    /// Whether one-row decode steps replay a captured CUDA graph: `Ok(true)` once captured, `Ok(false)`
    /// before the first step, `Err(reason)` when capture failed and steps use direct launches.
    pub fn graph_status(&self) -> Result<bool, String> {
        match &self.graph_error {
            Some(e) => Err(e.clone()),
            None => Ok(self.graph.is_some()),
        }
    }

    /// Whether the decode graph with the final-hidden tap has been captured.
    pub fn hidden_graph_captured(&self) -> bool {
        self.graph_hidden.is_some()
    }

    /// Verify blocks captured as graphs so far, or why capture failed (blocks then launch directly).
    pub fn verify_graph_status(&self) -> Result<usize, String> {
        match &self.verify_graph_error {
            Some(e) => Err(e.clone()),
            None => Ok(self.verify_graphs.len()),
        }
    }

    pub fn has_tape(&self) -> bool {
        self.tape.is_some()
    }

    /// Ends the tape, keeping everything that was run.
    pub fn end_tape(&mut self) {
        self.retire_tape();
    }

    /// Ends any tape, keeping its buffers for the next one.
    pub(crate) fn retire_tape(&mut self) {
        if let Some(t) = self.tape.take() {
            self.spare_tape = Some(t);
        }
    }
}

impl LayerTape {
    /// Appends `rows` projection rows (at `proj`) and, on the first record, the starting S and window.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        dev: &CudaDevice,
        shape: GdnShape,
        s: &DBuf,
        conv: &DBuf,
        proj: u64,
        rows: usize,
    ) -> Result<(), CudaError> {
        if self.rows == 0 {
            dtod(dev, self.s0.ptr, s.ptr, s.bytes)?;
            dtod(dev, self.conv0.ptr, conv.ptr, conv.bytes)?;
        }
        let width = shape.proj_width();
        if self.rows + rows > self.capacity {
            let capacity = (self.rows + rows).next_power_of_two();
            let grown = DBuf::f32s(dev, capacity * width)?;
            dtod(dev, grown.ptr, self.proj.ptr, self.rows * width * 4)?;
            self.proj = grown;
            self.capacity = capacity;
        }
        dtod(
            dev,
            self.proj.f32_at(self.rows * width),
            proj,
            rows * width * 4,
        )?;
        self.rows += rows;
        Ok(())
    }
}

/// Signature check shared by forward and the tape.
pub(crate) fn check_signature(state: &CudaState, model_signature: &str) -> Result<(), CudaError> {
    if state.signature != model_signature {
        return Err(families::ModelError::StateMismatch(state.signature.clone()).into());
    }
    Ok(())
}
