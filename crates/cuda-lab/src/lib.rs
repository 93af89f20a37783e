//! The CUDA backend's measurement lab: what measures or checks the kernels rather than serves a model.
//!
//! - [`selftest`]: each operation of the forward on small random inputs against a host reference, and
//!   the batch invariance speculative decoding relies on, bit for bit (on the GPU, the kernel simulator
//!   or the host emulation).
//! - [`sweep`]: every GEMV kernel timed on given shapes and row counts.
//! - [`profile`]: per-operation timing of a decode step, a prefill pass or a verify round; the decode
//!   graph's device time, the host costs of a step, the read-only stream rate.
//! - [`segment_trace`]: where a segment kernel's time goes (`TURBOSPARK_SEG_TRACE=1`).
//! - the `cuda_check` binary (`src/bin/cuda_check`), which runs them and the fixture checks.
//!
//! It reaches below the backend's public API only through `cuda_backend::lab`. Nothing in the product
//! (backend, runtime, cli, server, capi) depends on this crate.

pub mod profile;
pub mod segment_trace;
pub mod selftest;
pub mod sweep;
