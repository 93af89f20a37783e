//! CUDA backend for turbospark: the Qwen3 / Qwen3.5 forward pass on an NVIDIA GPU, with the CPU engine's
//! semantics (`families::Transformer::forward`) and state operations (rewind, snapshot/restore, tape
//! rollback), built without CUDA and run where a driver is present.
//!
//! - [`CudaDevice::open`]: dlopens libcuda / libnvrtc / libcublas (cudarc `dynamic-loading`); on a machine
//!   without them it is one clear [`CudaError`], so the same binary serves `--device cpu|cuda|auto`
//!   ([`driver_present`] is the cheap probe for `auto`).
//! - Kernels: CUDA C in `src/cu/`, compiled by NVRTC for the device's sm_XY and cached on disk
//!   (`nvrtc.rs`). bf16 weights with f32 accumulation and f32 activations for decode/verify rows;
//!   cuBLAS GEMMs and the chunked GDN form (`gdn_chunk.rs`) for prefill passes (`ops.rs`). On sm_90
//!   kernels are launched with programmatic dependent launch ([`CudaDevice::set_pdl`]), so each starts
//!   while its predecessor drains.
//! - [`CudaDevice::simulated`]: the same kernels compiled by the host C++ compiler against a CUDA shim
//!   (`src/sim/`) and run on the CPU, so they can be checked (`cuda_check --simulate`) without a GPU;
//!   [`CudaDevice::emulated`] instead computes each operation as the CPU engine does (`emu.rs`, a test
//!   double behind the device's one seam, `exec.rs`).
//! - [`CudaModel`]: weights on the GPU (`model.rs`, `weights.rs`) and the forward pass (`forward.rs`);
//!   one-row decode steps replay a captured CUDA graph, in which each run of GEMVs between two mixer
//!   cores is one persistent kernel fed by a shared-memory weight ring (`segment.rs`, sm_90).
//! - [`CudaState`]: KV caches and recurrent state on the GPU (`state.rs`).
//! - [`CudaMtp`]: the checkpoint's MTP head on the GPU, next to the target, as a `drafters::Drafter`
//!   (`mtp.rs`).
//!
//! Invariant: a verify block of up to `LoadOptions::gemv_max_rows` rows computes each row exactly as a
//! one-row decode step would (batch-invariant kernels, step-form GDN), so greedy speculative decoding
//! on the GPU equals sequential decoding on the GPU token for token.
//!
//! Layers: a file imports (`use crate::`) only from its own layer and the ones below it; cycles exist
//! only inside a layer.
//! 0. Base: `error.rs`, `debug_env.rs` (every environment switch), `nvrtc.rs`, `launch_limits.rs`
//!    (shared-memory opt-ins and warps the device layer needs from the kernels above it).
//! 1. Device and buffers: `device.rs`, `buf.rs`, `simulate.rs`, `weights.rs`, and the segment queue
//!    every launch and copy flushes first: `segment.rs`, `segment_config.rs`, `segment_trace.rs`.
//! 2. Kernels and operations: `exec.rs` (the device seam: the kernels, or the host emulation `emu.rs`
//!    that stands in for them in tests without a GPU), `ops.rs`, `attn.rs`, `mma.rs`, `gdn.rs`,
//!    `gdn_chunk.rs`, `moe.rs`, `quant.rs` (quantized matrices), `argmax.rs`, `scratch.rs` (the passes'
//!    scratch buffers).
//! 3. Forward and graphs: `model.rs`, `state.rs`, `forward.rs`, `verify_graph.rs`, `chain.rs`,
//!    `rollback.rs`, `candidates.rs`, `profile.rs` (timing marks of the forward).
//! 4. Drafters and surfaces: `adapter.rs` (`families::Model`), `mtp.rs`, `dflash.rs`, `lab.rs` (the
//!    measurement lab's access, `crates/cuda-lab`), `testing.rs` (test support).

pub mod adapter;
mod argmax;
mod attn;
mod buf;
mod candidates;
mod chain;
mod debug_env;
pub mod device;
mod dflash;
mod emu;
pub mod error;
mod exec;
mod forward;
mod gdn;
mod gdn_chunk;
#[doc(hidden)]
pub mod lab;
mod launch_limits;
mod mma;
pub mod model;
mod moe;
mod mtp;
pub mod nvrtc;
mod ops;
mod profile;
mod quant;
mod rollback;
mod scratch;
mod segment;
mod segment_config;
mod segment_trace;
mod simulate;
pub mod state;
#[doc(hidden)]
pub mod testing;
mod verify_graph;
mod weights;

pub use device::{driver_present, CudaDevice, DeviceInfo};
pub use dflash::CudaDflash;
pub use error::CudaError;
pub use model::{CudaModel, LoadOptions};
pub use mtp::CudaMtp;
pub use state::{CudaSnapshot, CudaState};
pub use weights::WeightFormat;

/// CUDA graphs captured by this process: a capture costs ~1-2 ms against a ~0.3 ms speculative round on
/// the testbed, so the block tuner leaves rounds during which this grew untimed.
static GRAPH_CAPTURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many CUDA graphs this process has begun capturing (decode steps, chains, verify blocks, drafters).
pub fn graph_captures() -> u64 {
    GRAPH_CAPTURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts one capture; called where each capture begins.
pub(crate) fn note_capture() {
    GRAPH_CAPTURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}
