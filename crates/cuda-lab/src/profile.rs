//! Per-operation GPU timing of one decode step, one prefill pass or one verify round (direct launches,
//! no graph), for finding which kernel keeps a step from the memory roofline. The backend records an
//! event after each operation (`cuda_backend::lab::profile_*`); an operation's time is the gap between
//! its event and the previous one, summed over layers by label here. Launch gaps count against the
//! operation that follows them, so small kernels look slower here than inside a graph; the total is the
//! un-graphed step time. Also: the decode graph's device time, the host-side costs of a step, and the
//! device's read-only stream rate.

use cudarc::driver::{sys::CUevent_flags, CudaEvent};

use cuda_backend::lab::{self, ProfileMark};
use cuda_backend::{CudaDevice, CudaError, CudaModel, CudaState};

/// Summed time of one operation label over a step.
#[derive(Clone, Debug)]
pub struct ProfileRow {
    pub label: &'static str,
    pub calls: usize,
    pub ms: f64,
    /// Weight bytes streamed by these calls (0 for non-matrix operations).
    pub bytes: usize,
}

/// Sums `marks` by label, in first-seen order.
pub fn summarize(marks: Vec<ProfileMark>) -> Vec<ProfileRow> {
    let mut rows: Vec<ProfileRow> = Vec::new();
    for m in marks {
        match rows.iter_mut().find(|r| r.label == m.label) {
            Some(r) => {
                r.calls += 1;
                r.ms += m.ms;
                r.bytes += m.bytes;
            }
            None => rows.push(ProfileRow {
                label: m.label,
                calls: 1,
                ms: m.ms,
                bytes: m.bytes,
            }),
        }
    }
    rows
}

/// One decode step of `token` at the state's position, timed per operation; advances the state by one
/// like `forward`. Rows are in first-seen order.
pub fn profile_decode(
    model: &CudaModel,
    state: &mut CudaState,
    token: u32,
) -> Result<Vec<ProfileRow>, CudaError> {
    Ok(summarize(lab::profile_decode(model, state, token)?))
}

/// `tokens` as one forward pass (the prefill path), timed per operation, logits for the last row only;
/// advances the state like `forward`. Rows are in first-seen order.
pub fn profile_pass(
    model: &CudaModel,
    state: &mut CudaState,
    tokens: &[u32],
) -> Result<Vec<ProfileRow>, CudaError> {
    Ok(summarize(lab::profile_pass(model, state, tokens)?))
}

/// One speculative verify round (forward with the tape, every row's logits to the host, rollback),
/// timed per operation; the state ends where it started. Rows are in first-seen order.
pub fn profile_verify(
    model: &CudaModel,
    state: &mut CudaState,
    tokens: &[u32],
) -> Result<Vec<ProfileRow>, CudaError> {
    Ok(summarize(lab::profile_verify(model, state, tokens)?))
}

/// Device milliseconds per replay of `state`'s one-row decode graph, `n` replays queued back to back
/// with no host work in between (ids, position and logits stay on the device). Set against the wall
/// time per decoded token it splits a step into GPU time and host time (upload of the id and position,
/// the logits copy, the caller's argmax). The replays advance the state's recurrent rows and rewrite one
/// cache row: time on a scratch state. `None` without a captured graph.
pub fn time_decode_graph(
    model: &CudaModel,
    state: &mut CudaState,
    token: u32,
    n: usize,
) -> Result<Option<f64>, CudaError> {
    let start = state.position();
    // A first step captures the graph.
    model.forward(&[token], start, state, &families::Wanted::last())?;
    let dev = &**model.device();
    if !lab::has_decode_graph(state) {
        return Ok(None);
    }
    let a = event(dev)?;
    for _ in 0..n {
        lab::launch_decode_graph(state)?;
    }
    let b = event(dev)?;
    dev.synchronize()?;
    Ok(Some(elapsed_ms(&a, &b)? as f64 / n.max(1) as f64))
}

/// Host-side costs of one decode step, each the mean of `n` repetitions in milliseconds (wall clock):
/// copying one logits row to the host (`dtoh`, through the pinned staging buffer), uploading one id, and
/// launching the decode graph then waiting for it (minus the graph's own GPU time gives the
/// launch-and-wake latency).
#[derive(Clone, Copy, Debug)]
pub struct HostCosts {
    pub logits_copy_ms: f64,
    pub id_upload_ms: f64,
    pub graph_launch_sync_ms: f64,
}

/// Measures [`HostCosts`] on `state` (a scratch state: the graph replays advance it).
pub fn host_costs(
    model: &CudaModel,
    state: &mut CudaState,
    token: u32,
    n: usize,
) -> Result<Option<HostCosts>, CudaError> {
    let start = state.position();
    model.forward(&[token], start, state, &families::Wanted::last())?;
    let dev = &**model.device();
    let n = n.max(1);
    let io = lab::decode_io(state);
    let mut logits = vec![0.0f32; model.vocab];
    let t = std::time::Instant::now();
    for _ in 0..n {
        lab::dtoh(dev, &mut logits, io.logits)?;
    }
    let logits_copy_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    let t = std::time::Instant::now();
    for _ in 0..n {
        lab::htod(dev, io.ids, &[token as i32])?;
    }
    dev.synchronize()?;
    let id_upload_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    if !lab::has_decode_graph(state) {
        return Ok(None);
    }
    let t = std::time::Instant::now();
    for _ in 0..n {
        lab::launch_decode_graph(state)?;
        dev.synchronize()?;
    }
    let graph_launch_sync_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    Ok(Some(HostCosts {
        logits_copy_ms,
        id_upload_ms,
        graph_launch_sync_ms,
    }))
}

/// The read-only stream rate in bytes/s (read_stream, misc.cu): the best of 7 timed batches of 10
/// passes over 1 GiB, 4 blocks of 512 threads per SM. The ceiling a decode step that reads each weight
/// once could reach; the table's roofline keeps the copy rate (read + write: the convention),
/// and prints this beside it (on the H200 the read-only probe reads ~4.5 TB/s where copies count ~4.24).
/// Without a GPU (the simulator) one small pass runs and the rate is NaN.
pub fn read_bandwidth(dev: &CudaDevice) -> Result<f64, CudaError> {
    let timed = dev.stream().is_some();
    let bytes: usize = if timed { 1 << 30 } else { 1 << 16 };
    let src = lab::DBuf::zeros(dev, bytes)?;
    let sink = lab::DBuf::zeros(dev, 4)?;
    let grid = (4 * dev.info.sms.max(1)) as u32;
    let pass = || {
        lab::launch(
            dev,
            "read_stream",
            (grid, 1, 1),
            512,
            &[
                lab::Arg::P(src.ptr),
                lab::Arg::L((bytes / 16) as i64),
                lab::Arg::P(sink.ptr),
            ],
        )
    };
    pass()?;
    dev.synchronize()?;
    if !timed {
        return Ok(f64::NAN);
    }
    let mut best = 0.0f64;
    for _ in 0..7 {
        let a = event(dev)?;
        for _ in 0..10 {
            pass()?;
        }
        let b = event(dev)?;
        dev.synchronize()?;
        let ms = elapsed_ms(&a, &b)? as f64;
        best = best.max(10.0 * bytes as f64 / (ms / 1e3));
    }
    Ok(best)
}

/// A timing event recorded on the device's stream now.
pub(crate) fn event(dev: &CudaDevice) -> Result<CudaEvent, CudaError> {
    dev.stream()
        .ok_or_else(|| CudaError::Unsupported {
            what: "timing events without a GPU".into(),
        })?
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(driver("recording a profiling event"))
}

/// Milliseconds between two recorded events (both completed).
pub(crate) fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f32, CudaError> {
    a.elapsed_ms(b).map_err(driver("reading a timing event"))
}

fn driver(context: &str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError + '_ {
    move |source| CudaError::Driver {
        context: context.into(),
        source,
    }
}
