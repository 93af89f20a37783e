//! Where a segment kernel's time goes (measurements only: `TURBOSPARK_SEG_TRACE=1`).
//!
//! The trace kernels (`gemv_segment_trace_*`, segment.cu) write per block, after the grid barrier's
//! words, SM clock stamps at each stage's start, input staged, rows done and grid barrier passed, the
//! cycles the consumer warps waited for pages and the producers for free pages, and globaltimer stamps
//! at entry and end. Every un-captured segment launch is followed by a synchronisation and a read-back
//! (graph replays are not traced). This module only records the words; the measurement lab
//! (`crates/cuda-lab`, `segment_trace.rs`) reads them through [`crate::lab::segment_trace`] and
//! summarises them per kind of segment (its stage shapes).

use std::sync::Mutex;

use crate::buf::{dtoh, htod};
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::segment::{SegKernel, Stage};

/// Words per block (SEG_TR_WORDS); the layout of a block's words is the lab's (segment.cu SEG_TR_*).
pub const WORDS: usize = 128;
/// Launches kept (a bench's un-graphed decode runs ~4 per layer and step).
const KEEP: usize = 4096;

/// One traced segment launch, as read back after it ran.
#[derive(Clone, Debug)]
pub struct TracedLaunch {
    /// Its stage shapes and kernel (launches of one kind are summarised together).
    pub kind: String,
    /// Consumer and producer warps of the kernel that ran it.
    pub warps: (usize, usize),
    /// Pages of its ring.
    pub pages: usize,
    /// Bytes of weights per stage.
    pub bytes: Vec<f64>,
    /// Jobs per stage (output rows, SwiGLU pairs).
    pub jobs: Vec<usize>,
    /// [blocks][WORDS]
    pub words: Vec<u64>,
}

#[derive(Default)]
pub(crate) struct Trace {
    launches: Mutex<Vec<TracedLaunch>>,
}

/// Bytes of the trace region after the barrier's 16.
pub(crate) fn region_bytes(blocks: usize) -> usize {
    blocks * WORDS * 8
}

fn capturing(dev: &CudaDevice) -> bool {
    let Some(stream) = dev.stream() else {
        return false;
    };
    let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream is live; plain out-parameter.
    unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

impl Trace {
    /// After a trace kernel's launch: waits for it, keeps its words and zeroes them for the next.
    pub(crate) fn record(
        &self,
        dev: &CudaDevice,
        region: u64,
        blocks: usize,
        stages: &[Stage],
        kernel: &SegKernel,
        pages: usize,
    ) -> Result<(), CudaError> {
        if capturing(dev) {
            return Ok(());
        }
        let mut words = vec![0u64; blocks * WORDS];
        dtoh(dev, &mut words, region)?;
        htod(dev, region, &vec![0u64; blocks * WORDS])?;
        let kind = stages
            .iter()
            .map(|s| {
                format!(
                    "{}x{}{}{}",
                    s.rows,
                    s.cols,
                    if s.inter > 0 { " swiglu" } else { "" },
                    if s.norm_w != 0 { " normed" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let kind = format!("{kind}] on [{}", kernel.name);
        let bytes = stages
            .iter()
            .map(|s| (s.rows * s.cols * 2) as f64)
            .collect();
        let jobs = stages
            .iter()
            .map(|s| if s.inter > 0 { s.inter } else { s.rows })
            .collect();
        if let Ok(mut l) = self.launches.lock() {
            if l.len() < KEEP {
                l.push(TracedLaunch {
                    kind,
                    warps: (kernel.consumers, kernel.producers),
                    pages,
                    bytes,
                    jobs,
                    words,
                });
            }
        }
        Ok(())
    }

    /// The launches recorded so far (the lab summarises them: `cuda_check`'s segment trace).
    pub(crate) fn launches(&self) -> Vec<TracedLaunch> {
        self.launches.lock().map(|l| l.clone()).unwrap_or_default()
    }
}
