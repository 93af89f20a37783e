//! Tape rollback for recurrent layers (DESIGN.md §4).
//!
//! While a tape is active, every Gated-DeltaNet layer records the state it started from (S₀ and the conv
//! window) and, per row, its conv input and recurrence inputs (q, k, v, g, beta). To keep only the first
//! `m` rows of what was run, each layer replays the step recurrence over those m rows from S₀ and rebuilds
//! its conv window from the recorded inputs; attention layers just truncate their KV cache. No forward pass
//! is needed, and because the replay runs the same step kernel over the same inputs, the rebuilt state is
//! bit-identical to a sequential run over the kept tokens (tested).

use crate::state::{LayerState, State};

/// Recorded inputs of one GDN layer since the tape started.
#[derive(Clone, Debug)]
pub struct LayerTape {
    pub(crate) conv_dim: usize,
    pub(crate) kernel: usize,
    pub(crate) hv: usize,
    pub(crate) dk: usize,
    pub(crate) dv: usize,
    /// S and conv window when the tape started (None until the first record).
    pub(crate) start: Option<(Vec<f32>, Vec<f32>)>,
    pub(crate) conv_in: Vec<f32>, // [rows, conv_dim]
    pub(crate) q: Vec<f32>,       // [rows, hv, dk]
    pub(crate) k: Vec<f32>,       // [rows, hv, dk]
    pub(crate) v: Vec<f32>,       // [rows, hv, dv]
    pub(crate) g: Vec<f32>,       // [rows, hv]
    pub(crate) beta: Vec<f32>,    // [rows, hv]
    pub(crate) rows: usize,
}

impl LayerTape {
    pub(crate) fn new(conv_dim: usize, kernel: usize, hv: usize, dk: usize, dv: usize) -> Self {
        LayerTape {
            conv_dim,
            kernel,
            hv,
            dk,
            dv,
            start: None,
            conv_in: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            g: Vec::new(),
            beta: Vec::new(),
            rows: 0,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        conv_before: Vec<f32>,
        s_before: &[f32],
        conv_in: &[f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        n: usize,
    ) {
        if self.start.is_none() {
            self.start = Some((s_before.to_vec(), conv_before));
        }
        self.conv_in.extend_from_slice(conv_in);
        self.q.extend_from_slice(q);
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
        self.g.extend_from_slice(g);
        self.beta.extend_from_slice(beta);
        self.rows += n;
    }

    /// (S, conv window) after the first `keep` recorded rows.
    fn replay(&self, keep: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let (s0, conv0) = self.start.as_ref()?;
        let (hv, dk, dv, cd) = (self.hv, self.dk, self.dv, self.conv_dim);
        let mut s = s0.clone();
        if keep > 0 {
            let mut out = vec![0.0; keep * hv * dv];
            kernels::gdn_recurrent(
                &self.q[..keep * hv * dk],
                &self.k[..keep * hv * dk],
                &self.v[..keep * hv * dv],
                &self.g[..keep * hv],
                &self.beta[..keep * hv],
                &mut s,
                keep,
                hv,
                dk,
                dv,
                &mut out,
            );
        }
        // The window is the last K-1 inputs of (old window ++ kept inputs).
        let w = self.kernel - 1;
        let mut all = conv0.clone();
        all.extend_from_slice(&self.conv_in[..keep * cd]);
        let conv = all[all.len() - w * cd..].to_vec();
        Some((s, conv))
    }
}

/// The tape of one speculative round: one entry per model layer (None for attention layers).
#[derive(Clone, Debug)]
pub struct Tape {
    pub(crate) start_position: usize,
    pub(crate) layers: Vec<Option<LayerTape>>,
}

impl State {
    /// Starts recording (replacing any previous tape). Returns the position the tape starts at.
    pub fn begin_tape(&mut self, layers: Vec<Option<LayerTape>>) -> usize {
        self.tape = Some(Tape {
            start_position: self.position,
            layers,
        });
        self.position
    }

    /// Whether a tape is recording.
    pub fn has_tape(&self) -> bool {
        self.tape.is_some()
    }

    /// Keeps the first `keep` rows run since `begin_tape` and drops the rest: KV caches are truncated and
    /// every recurrent layer is rebuilt by replaying its tape. Ends the tape. Returns false (state
    /// untouched) if there is no tape or `keep` exceeds what was recorded.
    pub fn rollback_retaining(&mut self, keep: usize) -> bool {
        let Some(tape) = self.tape.take() else {
            return false;
        };
        let recorded = self.position - tape.start_position;
        if keep > recorded {
            self.tape = Some(tape);
            return false;
        }
        if keep == recorded {
            return true;
        }
        for (layer, lt) in self.layers.iter_mut().zip(&tape.layers) {
            if let (LayerState::Recurrent(r), Some(lt)) = (layer, lt) {
                if let Some((s, conv)) = lt.replay(keep) {
                    r.s = s;
                    r.conv = conv;
                }
            }
        }
        self.truncate_kv(tape.start_position + keep);
        true
    }

    /// Ends the tape, keeping everything that was run.
    pub fn end_tape(&mut self) {
        self.tape = None;
    }
}
