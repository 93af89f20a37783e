//! Per-operation GPU timing of one decode step or one prefill pass (direct launches, no graph), for
//! finding which kernel keeps a step from the memory roofline. Events are recorded after each
//! operation; an operation's time is the gap between its event and the previous one, summed over layers
//! by label. Launch gaps count against the operation that follows them, so small kernels look slower
//! here than inside a graph; the total is the un-graphed step time.

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
        let first = record(dev)?;
        let mut prof = Some(Prof { marks: Vec::new() });
        self.decode_body(state, &mut prof, crate::state::StepIo::InPlace, 0, false)?;
        dev.synchronize()?;
        state.position = start + 1;
        summarize(&first, prof)
    }

    /// Runs `tokens` as one forward pass (the prefill path for more than `gemv_max_rows` rows) at the
    /// state's position with a timing event after every operation, logits for the last row only;
    /// advances the state like `forward`. Rows are in first-seen order.
    pub fn profile_pass(
        &self,
        state: &mut CudaState,
        tokens: &[u32],
    ) -> Result<Vec<ProfileRow>, CudaError> {
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
    /// Device milliseconds per replay of `state`'s one-row decode graph, `n` replays queued back to back
    /// with no host work in between (ids, position and logits stay on the device). Set against the
    /// wall time per decoded token it splits a step into GPU time and host time (upload of the id and
    /// position, the logits copy, the caller's argmax). The replays advance the state's recurrent rows
    /// and rewrite one cache row: time on a scratch state. `None` without a captured graph.
    pub fn time_decode_graph(
        &self,
        state: &mut CudaState,
        token: u32,
        n: usize,
    ) -> Result<Option<f64>, CudaError> {
        let start = state.position;
        // A first step captures the graph.
        self.forward(&[token], start, state, &families::Wanted::last())?;
        let dev = &*self.dev;
        let Some(g) = &state.graph else {
            return Ok(None);
        };
        let a = record(dev)?;
        for _ in 0..n {
            g.launch()
                .map_err(CudaError::driver("launching the decode graph"))?;
        }
        let b = record(dev)?;
        dev.synchronize()?;
        Ok(Some(elapsed_ms(&a, &b)? as f64 / n.max(1) as f64))
    }
}

/// Host-side costs of one decode step, each the mean of `n` repetitions in milliseconds (wall clock):
/// copying one logits row to the host (`buf::dtoh`, through the pinned staging buffer), uploading one
/// id, and launching the decode graph then waiting for it (minus the graph's own GPU time gives the
/// launch-and-wake latency).
#[derive(Clone, Copy, Debug)]
pub struct HostCosts {
    pub logits_copy_ms: f64,
    pub id_upload_ms: f64,
    pub graph_launch_sync_ms: f64,
}

impl CudaModel {
    /// Measures [`HostCosts`] on `state` (a scratch state: the graph replays advance it).
    pub fn host_costs(
        &self,
        state: &mut CudaState,
        token: u32,
        n: usize,
    ) -> Result<Option<HostCosts>, CudaError> {
        let start = state.position;
        self.forward(&[token], start, state, &families::Wanted::last())?;
        let dev = &*self.dev;
        let n = n.max(1);
        let mut logits = vec![0.0f32; self.vocab];
        let t = std::time::Instant::now();
        for _ in 0..n {
            crate::buf::dtoh(dev, &mut logits, state.one.logits.ptr)?;
        }
        let logits_copy_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
        let t = std::time::Instant::now();
        for _ in 0..n {
            htod(dev, state.one.ids.ptr, &[token as i32])?;
        }
        dev.synchronize()?;
        let id_upload_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
        let Some(g) = &state.graph else {
            return Ok(None);
        };
        let t = std::time::Instant::now();
        for _ in 0..n {
            g.launch()
                .map_err(CudaError::driver("launching the decode graph"))?;
            dev.synchronize()?;
        }
        let graph_launch_sync_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
        Ok(Some(HostCosts {
            logits_copy_ms,
            id_upload_ms,
            graph_launch_sync_ms,
        }))
    }
}

impl CudaModel {
    /// One speculative verify round with a timing event after every operation: `tokens` forwarded at
    /// the state's position with the tape on and every row's logits to the host (the LM head row
    /// includes that copy), then rolled back to the position before them (the tape replay, its own
    /// row). The state ends where it started.
    pub fn profile_verify(
        &self,
        state: &mut CudaState,
        tokens: &[u32],
    ) -> Result<Vec<ProfileRow>, CudaError> {
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

impl CudaDevice {
    /// The read-only stream rate in bytes/s (read_stream, misc.cu): the best of 7 timed batches of 10
    /// passes over 1 GiB, 4 blocks of 512 threads per SM. The ceiling a decode step that reads each
    /// weight once could reach; the table's roofline keeps the copy rate (read + write: the issue's
    /// convention), and prints this beside it (run 48's probe read 4.5 TB/s where copies count 4.24).
    /// Without a GPU (the simulator) one small pass runs and the rate is NaN.
    pub fn read_bandwidth(&self) -> Result<f64, CudaError> {
        let timed = self.gpu().is_ok();
        let bytes: usize = if timed { 1 << 30 } else { 1 << 16 };
        let src = crate::buf::DBuf::zeros(self, bytes)?;
        let sink = crate::buf::DBuf::zeros(self, 4)?;
        let grid = (4 * self.info.sms.max(1)) as u32;
        let pass = || {
            crate::buf::launch(
                self,
                "read_stream",
                (grid, 1, 1),
                512,
                &[
                    crate::buf::Arg::P(src.ptr),
                    crate::buf::Arg::L((bytes / 16) as i64),
                    crate::buf::Arg::P(sink.ptr),
                ],
            )
        };
        pass()?;
        self.synchronize()?;
        if !timed {
            return Ok(f64::NAN);
        }
        let mut best = 0.0f64;
        for _ in 0..7 {
            let a = record(self)?;
            for _ in 0..10 {
                pass()?;
            }
            let b = record(self)?;
            self.synchronize()?;
            let ms = elapsed_ms(&a, &b)? as f64;
            best = best.max(10.0 * bytes as f64 / (ms / 1e3));
        }
        Ok(best)
    }
}

/// A timing event recorded on the device's stream now.
pub(crate) fn event(dev: &CudaDevice) -> Result<CudaEvent, CudaError> {
    record(dev)
}

/// Milliseconds between two recorded events (both completed).
pub(crate) fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f32, CudaError> {
    a.elapsed_ms(b)
        .map_err(CudaError::driver("reading a timing event"))
}

fn record(dev: &CudaDevice) -> Result<CudaEvent, CudaError> {
    dev.gpu()?
        .stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(CudaError::driver("recording a profiling event"))
}

/// Per-label sums of the gaps between consecutive marks, starting at `first`.
fn summarize(first: &CudaEvent, prof: Option<Prof>) -> Result<Vec<ProfileRow>, CudaError> {
    let mut rows: Vec<ProfileRow> = Vec::new();
    let mut prev = first;
    let marks = prof.map(|p| p.marks).unwrap_or_default();
    for (label, bytes, e) in &marks {
        let ms = prev
            .elapsed_ms(e)
            .map_err(CudaError::driver("reading a profiling event"))? as f64;
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
