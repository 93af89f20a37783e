//! Runs of one-row GEMVs launched as one persistent kernel (`cu/segment.cu`, `gemv_segment`).
//!
//! While a decode step is recorded or run (`open` .. `Scope::finish`), `ops::gemv` hands each eligible
//! one-row GEMV to `queue` instead of launching it; the first operation that is not such a GEMV (any
//! other launch, copy or synchronisation: `flush` is called from `buf.rs` and `CudaDevice::synchronize`)
//! launches what was queued first, as one `gemv_segment` for two or more stages, or as the ordinary
//! `linear_bf16_1` launch for one. The segment kernel's rows equal the ordinary launches' bit for bit
//! (see the kernel's doc), so whether a step runs segmented changes its speed only.
//!
//! Eligible: bf16 weights on the FMA GEMV, one input row of at most `MAX_IN` values, a multiple of 8.
//! Each launch picks its kernel (`Config::kernel_for`): one that holds a stage's input in registers when
//! a stage's rows allow it (`HELD_KERNELS`), else the 12-consumer kernel.
//!
//! Two hints from the step ride along: `prefetch_after` names buffers the kernels after a segment read
//! first (prefetched into L2 as it ends), and `defer_gated_norm` leaves a GDN gated norm to the GEMV that
//! reads its output next (applied as that stage stages its input; launched on its own otherwise).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::buf::{launch_smem, launch_struct, Arg, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;
pub(crate) use crate::segment_config::{Config, Ring, SegKernel, KERNELS};

/// Stages of one segment launch (SEG_MAX_STAGES).
pub(crate) const MAX_STAGES: usize = 8;
/// Widest staged input row (SEG_MAX_IN floats).
pub(crate) const MAX_IN: usize = 12288;
/// Byte ranges a segment prefetches into L2 for the kernels after it (SEG_MAX_PREFETCH).
pub(crate) const MAX_PREFETCH: usize = 4;

/// One queued GEMV: the kernel's SegStage fields plus what its ordinary launch needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stage {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    /// RMSNorm weights (0: none); with `gate_z`, the gated norm's.
    pub norm_w: u64,
    /// A GDN layer's gated RMSNorm of the input first, per group of `gated_dv`, gated by silu(z)
    /// (`defer_gated_norm`; 0: none).
    pub gate_z: u64,
    pub gated_dv: usize,
    pub cols: usize,
    pub rows: usize,
    pub accumulate: bool,
    pub wpr: usize,
    /// SwiGLU intermediate width (0: no SwiGLU).
    pub inter: usize,
    pub zero_centred: bool,
    pub eps: f32,
    /// The ordinary launch: its grid and whether it stages its input.
    pub blocks: u32,
    pub stage: bool,
}

/// What an open step has queued: the GEMVs of the next segment, and what is read after it.
#[derive(Default)]
struct Queued {
    stages: Vec<Stage>,
    prefetch: Vec<(u64, usize)>,
    /// The step's weights stream with an L2 evict-first hint (`open`).
    evict_first: bool,
    /// A gated norm not yet applied to its buffer: taken by the next queued GEMV that reads it, or
    /// launched as the gated_rmsnorm kernel before anything else.
    pending: Option<GatedNorm>,
}

/// gated_rmsnorm of one row of `heads` groups of `dv` values at `o`, gated by silu(z), weights `w`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GatedNorm {
    pub o: u64,
    pub z: u64,
    pub w: u64,
    pub eps: f32,
    pub dv: usize,
    pub heads: usize,
}

/// The device's segment state: configuration, grid barrier, and the queue while a step is open.
pub(crate) struct Segments {
    pub config: Config,
    /// Arrivals at the grid barrier (a u64 that only grows): allocated once, never moved (graphs hold its address).
    barrier: DBuf,
    queue: Mutex<Option<Queued>>,
    /// Why segments were turned off after a failed launch (then every GEMV launches on its own).
    failure: Mutex<Option<String>>,
    launches: AtomicU64,
    staged_norms: AtomicU64,
    pub trace: crate::segment_trace::Trace,
}

impl Segments {
    pub fn new(dev: &CudaDevice, config: Config) -> Result<Self, CudaError> {
        Ok(Segments {
            config,
            // The trace kernels' words follow the barrier's (16 bytes).
            barrier: DBuf::zeros(
                dev,
                if config.trace {
                    16 + crate::segment_trace::region_bytes(dev.info.sms.max(1) as usize)
                } else {
                    8
                },
            )?,
            queue: Mutex::new(None),
            failure: Mutex::new(None),
            launches: AtomicU64::new(0),
            staged_norms: AtomicU64::new(0),
            trace: Default::default(),
        })
    }

    /// Segment kernels launched so far.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Gated norms applied by segment kernels as they staged their input.
    pub fn staged_norms(&self) -> u64 {
        self.staged_norms.load(Ordering::Relaxed)
    }

    /// Why segments were turned off, if a launch failed.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    fn failed(&self) -> bool {
        self.failure.lock().map_or(true, |f| f.is_some())
    }
}

/// Queues `st` when a step is open and the GEMV is eligible; returns whether it was queued. A GEMV
/// reading a pending gated norm's buffer takes the norm into its staging; any other operation first
/// launches it.
pub(crate) fn queue(dev: &CudaDevice, mut st: Stage) -> Result<bool, CudaError> {
    let Some(seg) = dev.segments() else {
        return Ok(false);
    };
    let pending = seg.queue.lock().ok().and_then(|q| q.as_ref()?.pending);
    if let Some(g) = pending {
        let fits = g.o == st.x
            && g.heads * g.dv == st.cols
            && 2 * st.cols <= MAX_IN
            && g.dv <= 128
            && st.norm_w == 0
            && g.w.is_multiple_of(16)
            && g.z.is_multiple_of(16);
        if !fits {
            flush(dev)?;
            return queue(dev, st);
        }
        (st.norm_w, st.gate_z, st.gated_dv, st.eps) = (g.w, g.z, g.dv, g.eps);
    }
    let eligible = !seg.failed()
        && st.cols.is_multiple_of(8)
        && st.cols <= MAX_IN
        && matches!(st.wpr, 1 | 2 | 4 | 8)
        && st.norm_w.is_multiple_of(16)
        && st.x.is_multiple_of(16)
        && st.rows <= seg.config.max_rows
        && seg.config.ring(&[st], input_room(&[st])).is_some();
    if !eligible {
        if pending.is_some() {
            flush(dev)?;
        }
        return Ok(false);
    }
    let full = {
        let Ok(mut q) = seg.queue.lock() else {
            return Ok(false);
        };
        let Some(q) = q.as_mut() else {
            return Ok(false);
        };
        q.pending = None;
        q.stages.push(st);
        q.stages.len() >= seg.config.max_stages
    };
    if full {
        flush(dev)?;
    }
    Ok(true)
}

/// Launches what is queued (called before any other operation on the stream).
pub(crate) fn flush(dev: &CudaDevice) -> Result<(), CudaError> {
    let Some(seg) = dev.segments() else {
        return Ok(());
    };
    let Queued {
        stages,
        prefetch,
        pending,
        evict_first,
    } = match seg.queue.lock() {
        Ok(mut q) => match q.as_mut() {
            Some(v) if !v.stages.is_empty() || v.pending.is_some() => {
                let evict_first = v.evict_first;
                std::mem::replace(
                    v,
                    Queued {
                        evict_first,
                        ..Default::default()
                    },
                )
            }
            _ => return Ok(()),
        },
        Err(_) => return Ok(()),
    };
    launch_stages(dev, seg, &stages, &prefetch, evict_first)?;
    pending.map_or(Ok(()), |g| gated_norm(dev, &g))
}

/// Launches `stages`: one segment, or per-GEMV launches for one stage (or when segments failed).
fn launch_stages(
    dev: &CudaDevice,
    seg: &Segments,
    stages: &[Stage],
    prefetch: &[(u64, usize)],
    evict_first: bool,
) -> Result<(), CudaError> {
    if stages.is_empty() {
        return Ok(());
    }
    let cfg = seg.config;
    let xs_floats = input_room(stages);
    let ring = match cfg.ring(stages, xs_floats) {
        Some(ring) if stages.len() > 1 || cfg.single => ring,
        _ => return stages.iter().try_for_each(|s| launch_one(dev, s)),
    };
    let flags = cfg.flags_for(&ring) | cfg.evict_first.unwrap_or(evict_first) as u32;
    let words = params(stages, &ring, flags, seg.barrier.ptr, prefetch);
    let kernel = cfg.kernel_for(stages, &ring);
    // One block per SM: the grid barrier needs every block resident.
    let sms = dev.info.sms.max(1) as u32;
    let launched = launch_struct(
        dev,
        kernel.name,
        sms,
        kernel.threads(),
        ring.smem_bytes(kernel.consumers, xs_floats) as u32,
        &words,
        cfg.cooperative,
    );
    match launched {
        Ok(()) => {
            seg.launches.fetch_add(1, Ordering::Relaxed);
            let gated = stages.iter().filter(|s| s.gate_z != 0).count();
            seg.staged_norms.fetch_add(gated as u64, Ordering::Relaxed);
            if cfg.trace {
                seg.trace.record(
                    dev,
                    seg.barrier.ptr + 16,
                    sms as usize,
                    stages,
                    &kernel,
                    ring.pages,
                )?;
            }
            Ok(())
        }
        // Not possible here (e.g. a cooperative grid refused under MPS): per-GEMV launches from now on,
        // reported by `CudaDevice::segment_failure`.
        Err(e) => {
            if let Ok(mut f) = seg.failure.lock() {
                f.get_or_insert(e.to_string());
            }
            stages.iter().try_for_each(|s| launch_one(dev, s))
        }
    }
}

/// The kernel's SegParams (segment.cu) as 8-byte words: 8 SegStage of 80 bytes (w, x, y, norm_w,
/// gate_z, then in, out, accumulate, wpr, swiglu_inter, zero_centred, pieces, gated_dv, eps, norm_staged as
/// 4-byte fields), then n, page_bytes, pages, flags, xs_floats, pad, the barrier's address and
/// MAX_PREFETCH ranges (address, bytes): 736 bytes.
fn params(
    stages: &[Stage],
    ring: &Ring,
    flags: u32,
    barrier: u64,
    prefetch: &[(u64, usize)],
) -> Vec<u64> {
    let mut words = vec![0u64; 84 + 2 * MAX_PREFETCH];
    for (i, s) in stages.iter().take(MAX_STAGES).enumerate() {
        let pieces = ring.pieces(s.cols).unwrap_or(1);
        let fields = [
            s.cols as u32,
            s.rows as u32,
            s.accumulate as u32,
            s.wpr as u32,
            s.inter as u32,
            s.zero_centred as u32,
            pieces as u32,
            s.gated_dv as u32,
            s.eps.to_bits(),
            norm_staged(s) as u32,
        ];
        let at = i * 10;
        words[at..at + 5].copy_from_slice(&[s.w, s.x, s.y, s.norm_w, s.gate_z]);
        for (k, pair) in fields.chunks_exact(2).enumerate() {
            words[at + 5 + k] = pair[0] as u64 | (pair[1] as u64) << 32;
        }
    }
    words[80] = stages.len().min(MAX_STAGES) as u64 | (ring.page_bytes as u64) << 32;
    words[81] = ring.pages as u64 | (flags as u64) << 32;
    words[82] = input_room(stages) as u64 | (ring_magic(ring.pages) as u64) << 32;
    words[83] = barrier;
    for (i, &(p, bytes)) in prefetch.iter().take(MAX_PREFETCH).enumerate() {
        words[84 + 2 * i] = p;
        words[85 + 2 * i] = bytes as u64;
    }
    words
}

/// Names buffers the kernels after the GEMVs queued so far read first (a mixer core's state), for the
/// segment to prefetch into L2 as it ends: its producers are done early and the DRAM is then idle. Kept
/// are the 16-byte aligned ranges, whole 16-byte vectors of them; without an open step or a queued GEMV
/// nothing happens.
pub(crate) fn prefetch_after(dev: &CudaDevice, ranges: &[(u64, usize)]) {
    let Some(seg) = dev.segments().filter(|s| s.config.prefetch) else {
        return;
    };
    if let Ok(mut q) = seg.queue.lock() {
        if let Some(q) = q.as_mut().filter(|q| !q.stages.is_empty()) {
            q.prefetch = prefetch_ranges(ranges);
        }
    }
}

/// `prefetch_after`'s ranges as the kernel takes them.
fn prefetch_ranges(ranges: &[(u64, usize)]) -> Vec<(u64, usize)> {
    ranges
        .iter()
        .filter(|&&(p, n)| p.is_multiple_of(16) && n >= 16)
        .map(|&(p, n)| (p, n / 16 * 16))
        .take(MAX_PREFETCH)
        .collect()
}

/// SegParams::pages_m: ceil(2^32 / pages), for the kernel's n / pages as a multiply-high (segment.cu seg_div;
/// pages is 4..=64).
fn ring_magic(pages: usize) -> u32 {
    (u32::MAX / pages.max(1) as u32).wrapping_add(1)
}

/// Floats of staged input a segment needs: its widest input (twice a gated norm's: x, then z; twice a staged
/// RMSNorm's: x, then its weights), rounded up to whole 16-byte vectors.
fn input_room(stages: &[Stage]) -> usize {
    stages
        .iter()
        .map(|s| {
            if s.gate_z != 0 || norm_staged(s) {
                2 * s.cols
            } else {
                s.cols
            }
        })
        .max()
        .unwrap_or(0)
        .next_multiple_of(4)
}

/// Whether a stage's RMSNorm weights are staged with its input (SegStage::norm_staged): when both fit
/// the room every segment kernel is opted in for (MAX_IN floats).
fn norm_staged(s: &Stage) -> bool {
    s.norm_w != 0 && s.gate_z == 0 && 2 * s.cols <= MAX_IN
}

/// Whether `defer_gated_norm` would take a norm: a decode step is open and segments stage norms.
pub(crate) fn takes_gated_norms(dev: &CudaDevice) -> bool {
    dev.segments()
        .filter(|seg| seg.config.gated_norm)
        .and_then(|seg| seg.queue.lock().ok().map(|q| q.is_some()))
        .unwrap_or(false)
}

/// Leaves `g` to the open step: the next GEMV that reads its buffer applies it as it stages its input
/// (segment.cu), else it runs as the gated_rmsnorm kernel before the next operation. Returns false (the
/// caller applies it) when no step is open.
pub(crate) fn defer_gated_norm(dev: &CudaDevice, g: GatedNorm) -> Result<bool, CudaError> {
    let Some(seg) = dev.segments() else {
        return Ok(false);
    };
    let prior = {
        let Ok(mut q) = seg.queue.lock() else {
            return Ok(false);
        };
        let Some(q) = q.as_mut() else {
            return Ok(false);
        };
        q.pending.replace(g)
    };
    prior.map_or(Ok(true), |p| gated_norm(dev, &p).map(|()| true))
}

/// The gated_rmsnorm kernel over `g` in place (misc.cu: one warp per group, 8 per block).
fn gated_norm(dev: &CudaDevice, g: &GatedNorm) -> Result<(), CudaError> {
    launch_smem(
        dev,
        "gated_rmsnorm",
        (g.heads.div_ceil(8) as u32, 1, 1),
        256,
        0,
        &[
            Arg::P(g.o),
            Arg::P(g.z),
            Arg::I((g.heads * g.dv) as i32),
            Arg::P(g.w),
            Arg::F(g.eps),
            Arg::I(1),
            Arg::I(g.heads as i32),
            Arg::I(g.dv as i32),
        ],
    )
}

/// The ordinary one-row launch of a stage (ops::gemv's, for a segment of one), after its gated norm.
fn launch_one(dev: &CudaDevice, s: &Stage) -> Result<(), CudaError> {
    if s.gate_z != 0 {
        let heads = s.cols / s.gated_dv.max(1);
        let (o, z, w, eps, dv) = (s.x, s.gate_z, s.norm_w, s.eps, s.gated_dv);
        gated_norm(
            dev,
            &GatedNorm {
                o,
                z,
                w,
                eps,
                dv,
                heads,
            },
        )?;
    }
    let norm_w = if s.gate_z != 0 { 0 } else { s.norm_w };
    let shared = if s.stage { s.cols * 4 } else { 0 };
    launch_smem(
        dev,
        "linear_bf16_1",
        (s.blocks, 1, 1),
        (crate::launch_limits::LIN_WARPS * 32) as u32,
        shared as u32,
        &[
            Arg::P(s.w),
            Arg::P(s.x),
            Arg::P(s.y),
            Arg::I(s.cols as i32),
            Arg::I(s.rows as i32),
            Arg::I(s.accumulate as i32),
            Arg::I(s.wpr as i32),
            Arg::I(s.inter as i32),
            Arg::P(norm_w),
            Arg::F(s.eps),
            Arg::I(s.zero_centred as i32),
            Arg::I(s.stage as i32),
        ],
    )
}

/// A decode step whose eligible GEMVs are gathered into segments until `finish` (or drop, which
/// discards what an failed step left queued).
pub struct Scope<'a>(&'a CudaDevice);

/// Opens a scope when the device runs segments and none is open; `evict_first`: the step's weights
/// stream with an L2 evict-first hint (the model's choice, `CudaModel::stream_evict_first`, unless
/// `TURBOSPARK_SEG_EVICT_FIRST` sets it).
pub fn open(dev: &CudaDevice, evict_first: bool) -> Option<Scope<'_>> {
    let seg = dev.segments()?;
    let mut q = seg.queue.lock().ok()?;
    if q.is_some() {
        return None;
    }
    *q = Some(Queued {
        evict_first,
        ..Queued::default()
    });
    Some(Scope(dev))
}

impl Scope<'_> {
    /// Launches what is still queued and closes the scope.
    pub fn finish(self) -> Result<(), CudaError> {
        flush(self.0)
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        if let Some(seg) = self.0.segments() {
            if let Ok(mut q) = seg.queue.lock() {
                *q = None;
            }
        }
    }
}

/// A one-row GEMV of `rows` x `cols` (unit tests).
#[cfg(test)]
pub(crate) fn test_gemv(cols: usize, rows: usize) -> Stage {
    Stage {
        w: 0x1000,
        x: 0x2000,
        y: 0x3000,
        norm_w: 0x4000,
        gate_z: 0,
        gated_dv: 0,
        cols,
        rows,
        accumulate: true,
        wpr: 4,
        inter: 0,
        zero_centred: true,
        eps: 1e-6,
        blocks: 528,
        stage: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemv(cols: usize, rows: usize) -> Stage {
        test_gemv(cols, rows)
    }

    #[test]
    fn parameters_follow_the_kernels_struct_layout() {
        let st = gemv(9216, 2560);
        let gated = Stage {
            gate_z: 0x6000,
            gated_dv: 128,
            ..st
        };
        // A normed stage whose x and weights fit MAX_IN stages its weights with x (norm_staged).
        let narrow = gemv(2560, 9216);
        let words = params(
            &[st, gated, narrow],
            &Ring::of(5120),
            1,
            0xbeef,
            &[(0x5000, 4096)],
        );
        assert_eq!(words.len() * 8, 736);
        assert_eq!(&words[10..15], &[0x1000, 0x2000, 0x3000, 0x4000, 0x6000]);
        assert_eq!(words[15], 9216 | 2560 << 32);
        assert_eq!(words[16], 1 | 4 << 32);
        assert_eq!(words[17], 1 << 32);
        assert_eq!(words[18], 4 | 128 << 32);
        assert_eq!(words[19], 1e-6f32.to_bits() as u64);
        assert_eq!(
            words[9],
            1e-6f32.to_bits() as u64,
            "18432 floats: weights not staged"
        );
        assert_eq!(words[29], 1e-6f32.to_bits() as u64 | 1 << 32);
        assert_eq!(words[4], 0, "no gate: a null pointer");
        assert_eq!(words[80], 3 | 5120 << 32);
        assert_eq!(words[81], 44 | 1 << 32);
        assert_eq!(
            words[82] & 0xffff_ffff,
            2 * 9216,
            "room for x and the gated stage's z"
        );
        assert_eq!(words[83], 0xbeef);
        assert_eq!(&words[84..88], &[0x5000, 4096, 0, 0]);
    }

    #[test]
    fn ring_magic_divides_exactly_over_a_launchs_units() {
        // The kernel's seg_div: umulhi(n, m). Units per block and launch stay far below 2^20.
        for pages in 4..=32usize {
            let m = ring_magic(pages) as u64;
            for n in 0u64..1 << 20 {
                assert_eq!((n * m) >> 32, n / pages as u64, "n {n} pages {pages}");
            }
        }
    }

    #[test]
    fn prefetch_keeps_aligned_whole_vectors() {
        assert_eq!(
            prefetch_ranges(&[(0x10008, 64), (0x20000, 100), (0x30000, 8)]),
            vec![(0x20000, 96)]
        );
        let many = [(0x1000, 16); 6];
        assert_eq!(prefetch_ranges(&many).len(), MAX_PREFETCH);
    }

    #[test]
    fn devices_without_the_kernel_launch_every_gemv_themselves() {
        let dev = CudaDevice::emulated();
        assert!(open(&dev, false).is_none());
        assert!(!queue(&dev, gemv(2560, 2560)).unwrap());
        assert!(dev.segment_status().is_err());
    }
}
