//! Per-operation timing hooks: with a [`Prof`] passed down the forward, an event is recorded after each
//! operation, and an operation's time is the gap between its event and the previous one (direct
//! launches, no graph). The measurement lab (`crates/cuda-lab`, `profile.rs`) runs the profiled passes
//! through [`crate::lab`] and sums the marks by label.

use cudarc::driver::{sys::CUevent_flags, CudaEvent};

use crate::buf::htod;
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::model::CudaModel;
use crate::state::CudaState;

/// Event marks of one profiled step: (label, bytes of weights streamed, event).
pub(crate) struct Prof {
    marks: Vec<(&'static str, usize, CudaEvent)>,
}

/// Records a mark when profiling (no-op otherwise).
pub(crate) fn mark(
    prof: &mut Option<Prof>,
    dev: &CudaDevice,
    label: &'static str,
    bytes: usize,
) -> Result<(), CudaError> {
    if let Some(p) = prof {
        let e = dev
            .gpu()?
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver("recording a profiling event"))?;
        p.marks.push((label, bytes, e));
    }
    Ok(())
}

/// One operation of a profiled run: its label, the weight bytes it streamed (0 for non-matrix
/// operations) and the milliseconds since the previous mark (the first: since the run began).
#[derive(Clone, Debug)]
pub struct ProfileMark {
    pub label: &'static str,
    pub bytes: usize,
    pub ms: f64,
}

impl CudaModel {
    /// Runs one decode step of `token` at the state's position with a timing event after every
    /// operation; advances the state by one like `forward`.
    pub(crate) fn profile_decode(
        &self,
        state: &mut CudaState,
        token: u32,
    ) -> Result<Vec<ProfileMark>, CudaError> {
        let dev = &*self.dev;
        let start = state.position;
        if token as usize >= self.vocab || start + 1 > state.capacity {
            return Err(CudaError::Unsupported {
                what: format!("profiling token {token} at position {start}"),
            });
        }
        htod(dev, state.one.ids.ptr, &[token as i32])?;
        htod(dev, state.one.start.ptr, &[start as i32])?;
        let first = record(dev)?;
        let mut prof = Some(Prof { marks: Vec::new() });
        self.decode_body(state, &mut prof, crate::state::StepIo::InPlace, 0, false)?;
        dev.synchronize()?;
        state.position = start + 1;
        summarize(&first, prof)
    }

    /// Runs `tokens` as one forward pass (the prefill path for more than `gemv_max_rows` rows) at the
    /// state's position with a timing event after every operation, logits for the last row only;
    /// advances the state like `forward`.
    pub(crate) fn profile_pass(
        &self,
        state: &mut CudaState,
        tokens: &[u32],
    ) -> Result<Vec<ProfileMark>, CudaError> {
        let dev = &*self.dev;
        let (start, n) = (state.position, tokens.len());
        let fits = n > 0 && n <= self.opts.max_pass_rows.max(1) && start + n <= state.capacity;
        if !fits || tokens.iter().any(|&t| t as usize >= self.vocab) {
            return Err(CudaError::Unsupported {
                what: format!("profiling a pass of {n} tokens at position {start}"),
            });
        }
        let first = record(dev)?;
        let mut prof = Some(Prof { marks: Vec::new() });
        self.pass(tokens, start, state, n - 1, &[], false, 0, &mut prof)?;
        dev.synchronize()?;
        state.position = start + n;
        summarize(&first, prof)
    }
}

impl CudaModel {
    /// One speculative verify round with a timing event after every operation: `tokens` forwarded at
    /// the state's position with the tape on and every row's logits to the host (the LM head row
    /// includes that copy), then rolled back to the position before them (the tape replay, its own
    /// row). The state ends where it started.
    pub(crate) fn profile_verify(
        &self,
        state: &mut CudaState,
        tokens: &[u32],
    ) -> Result<Vec<ProfileMark>, CudaError> {
        let dev = &*self.dev;
        let (start, n) = (state.position, tokens.len());
        let fits = n > 0 && n <= self.opts.gemv_max_rows && start + n <= state.capacity;
        if !fits || tokens.iter().any(|&t| t as usize >= self.vocab) {
            return Err(CudaError::Unsupported {
                what: format!("profiling a verify block of {n} tokens at position {start}"),
            });
        }
        self.begin_tape(state)?;
        let first = record(dev)?;
        let mut prof = Some(Prof { marks: Vec::new() });
        self.pass(tokens, start, state, 0, &[], false, 0, &mut prof)?;
        state.position = start + n;
        self.rollback_retaining(state, 0)?;
        mark(&mut prof, dev, "rollback (tape replay)", 0)?;
        dev.synchronize()?;
        summarize(&first, prof)
    }
}

fn record(dev: &CudaDevice) -> Result<CudaEvent, CudaError> {
    dev.gpu()?
        .stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(CudaError::driver("recording a profiling event"))
}

/// The gaps between consecutive marks, starting at `first`.
fn summarize(first: &CudaEvent, prof: Option<Prof>) -> Result<Vec<ProfileMark>, CudaError> {
    let mut out = Vec::new();
    let mut prev = first;
    let marks = prof.map(|p| p.marks).unwrap_or_default();
    for (label, bytes, e) in &marks {
        let ms = prev
            .elapsed_ms(e)
            .map_err(CudaError::driver("reading a profiling event"))? as f64;
        out.push(ProfileMark {
            label,
            bytes: *bytes,
            ms,
        });
        prev = e;
    }
    Ok(out)
}
