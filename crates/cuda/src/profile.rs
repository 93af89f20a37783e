//! Per-operation GPU timing of one decode step (direct launches, no graph), for finding which kernel
//! keeps a decode step from the memory roofline. Events are recorded after each operation; an
//! operation's time is the gap between its event and the previous one, summed over layers by label.
//! Launch gaps count against the operation that follows them, so small kernels look slower here than
//! inside a graph; the total is the un-graphed step time.

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

/// Summed time of one operation label over a step.
#[derive(Clone, Debug)]
pub struct ProfileRow {
    pub label: &'static str,
    pub calls: usize,
    pub ms: f64,
    /// Weight bytes streamed by these calls (0 for non-matrix operations).
    pub bytes: usize,
}

impl CudaModel {
    /// Runs one decode step of `token` at the state's position with a timing event after every
    /// operation; advances the state by one like `forward`. Rows are in first-seen order.
    pub fn profile_decode(
        &self,
        state: &mut CudaState,
        token: u32,
    ) -> Result<Vec<ProfileRow>, CudaError> {
        let dev = &*self.dev;
        let start = state.position;
        if token as usize >= self.vocab || start + 1 > state.capacity {
            return Err(CudaError::Unsupported {
                what: format!("profiling token {token} at position {start}"),
            });
        }
        htod(dev, state.one.ids.ptr, &[token as i32])?;
        htod(dev, state.one.start.ptr, &[start as i32])?;
        let first = dev
            .gpu()?
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver("recording a profiling event"))?;
        let mut prof = Some(Prof { marks: Vec::new() });
        self.decode_body(state, &mut prof)?;
        dev.synchronize()?;
        state.position = start + 1;
        let mut rows: Vec<ProfileRow> = Vec::new();
        let mut prev = &first;
        for (label, bytes, e) in prof.as_ref().map_or(&[][..], |p| &p.marks[..]) {
            let ms = prev
                .elapsed_ms(e)
                .map_err(CudaError::driver("reading a profiling event"))?
                as f64;
            match rows.iter_mut().find(|r| r.label == *label) {
                Some(r) => {
                    r.calls += 1;
                    r.ms += ms;
                    r.bytes += bytes;
                }
                None => rows.push(ProfileRow {
                    label,
                    calls: 1,
                    ms,
                    bytes: *bytes,
                }),
            }
            prev = e;
        }
        Ok(rows)
    }
}
