//! The surface the measurement lab (`crates/cuda-lab`: kernel self-test, GEMV sweep, profiler, segment
//! trace, the `cuda_check` binary) and the tests need below the public API: device buffers and raw
//! launches, the operations the self-test checks one by one against host references, and the
//! instrumented runs of the forward. It exists for the lab and the tests; the product (runtime, cli,
//! server, capi) does not use it, and nothing here is a stable interface.
//!
//! Everything is a re-export of an item of a private module, so this list is the whole surface.

use crate::error::CudaError;
use crate::model::CudaModel;
use crate::state::CudaState;

pub use crate::buf::{dtoh, elementwise_grid, htod, launch, Arg, DBuf};
pub use crate::profile::ProfileMark;
pub use crate::scratch::{Scratch, Widths};
pub use crate::segment_trace::{TracedLaunch, WORDS as TRACE_WORDS};
pub use crate::weights::{BlockFormat, Mat, QuantLayout, QuantPart, WDtype};

/// The forward's operations (ops.rs, gdn.rs, mma.rs) the self-test and the sweep launch directly.
pub mod ops {
    pub use crate::gdn::{gdn_recurrence, GdnArgs, GdnCols, GdnShape};
    pub use crate::mma::{with_gemv_kernel, GemvKernel, MMA_VARIANTS};
    pub use crate::ops::{
        attention, embed, linear, linear_normed, linear_swiglu, rmsnorm, AttnBufs, AttnCore,
        AttnShape, NormW, Rope, ATT_MAX_D, ATT_SPLITS_COARSE, ATT_SPLITS_FINE,
    };
}

/// The sparse-MoE feed-forward (moe.rs).
pub mod moe {
    pub use crate::moe::{forward, MoeShape, MoeW};
}

/// The chunked GDN form of prefill passes (gdn_chunk.rs).
pub mod gdn_chunk {
    pub use crate::gdn_chunk::{gdn_chunked, scratch_floats};
}

/// Segments: a scope in which one-row GEMVs queue into one persistent kernel (segment.rs).
pub mod segment {
    pub use crate::segment::{open, Scope};
}

/// Whether `dev` computes operations as the CPU engine does (the host emulation, not the kernels).
pub fn host_ops(dev: &crate::CudaDevice) -> bool {
    dev.engine() == crate::device::Engine::HostEmulation
}

/// Whether passes over more than the GEMV's rows run cuBLAS (the GPU), not the host emulation.
pub fn has_cublas(dev: &crate::CudaDevice) -> bool {
    dev.engine() == crate::device::Engine::Gpu
}

/// The segment launches traced so far (`TURBOSPARK_SEG_TRACE=1`) and the SM clock in kHz that converts
/// their cycles; None without a GPU or a segment kernel.
pub fn segment_trace(dev: &crate::CudaDevice) -> Option<(Vec<TracedLaunch>, f64)> {
    dev.segment_trace()
}

/// One decode step of `token` at the state's position, with a timing mark after every operation
/// (direct launches, no graph); advances the state by one like `forward`.
pub fn profile_decode(
    model: &CudaModel,
    state: &mut CudaState,
    token: u32,
) -> Result<Vec<ProfileMark>, CudaError> {
    model.profile_decode(state, token)
}

/// `tokens` as one forward pass (the prefill path for more than `gemv_max_rows` rows), logits for the
/// last row only, with a timing mark after every operation; advances the state like `forward`.
pub fn profile_pass(
    model: &CudaModel,
    state: &mut CudaState,
    tokens: &[u32],
) -> Result<Vec<ProfileMark>, CudaError> {
    model.profile_pass(state, tokens)
}

/// One speculative verify round with a timing mark after every operation: `tokens` forwarded with the
/// tape on and every row's logits to the host, then rolled back (the tape replay, its own mark). The
/// state ends where it started.
pub fn profile_verify(
    model: &CudaModel,
    state: &mut CudaState,
    tokens: &[u32],
) -> Result<Vec<ProfileMark>, CudaError> {
    model.profile_verify(state, tokens)
}

/// Device addresses of a state's one-row decode input id (i32) and logits row (f32 x vocab).
#[derive(Clone, Copy, Debug)]
pub struct DecodeIo {
    pub ids: u64,
    pub logits: u64,
}

/// [`DecodeIo`] of `state`.
pub fn decode_io(state: &CudaState) -> DecodeIo {
    DecodeIo {
        ids: state.one.ids.ptr,
        logits: state.one.logits.ptr,
    }
}

/// Whether `state` holds a captured one-row decode graph.
pub fn has_decode_graph(state: &CudaState) -> bool {
    state.graph.is_some()
}

/// Replays `state`'s decode graph once (queued, not waited for); nothing without one.
pub fn launch_decode_graph(state: &CudaState) -> Result<(), CudaError> {
    if let Some(g) = &state.graph {
        g.launch()
            .map_err(CudaError::driver("launching the decode graph"))?;
    }
    Ok(())
}
