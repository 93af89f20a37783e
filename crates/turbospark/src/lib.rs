//! turbospark: lossless speculative decoding for Qwen3, Qwen3.5 and Qwen3-Next checkpoints in the
//! Hugging Face layout, on the CPU or an NVIDIA GPU.
//!
//! This crate is the front door for Rust programs; the `turbospark` CLI, the OpenAI-compatible
//! server and the C ABI are built on it alone.
//!
//! - [`Model`] opens a checkpoint directory on a [`Device`] with a speculation setting and a thread
//!   count ([`Model::builder`]). It owns its thread pool: every call that runs kernels runs inside it,
//!   so two models in one process can use different thread counts.
//! - [`Session`] is one sequence: it keeps the model state between calls, so a prompt that extends the
//!   previous one (the next chat turn) prefills only its new tokens. [`Session::generate`] and
//!   [`Session::chat`] stream [`Event`]s (text deltas, prefill progress, log-probabilities) and return a
//!   [`GenerationResult`] with the text, the stop reason, timings and, when speculating, [`SpecStats`].
//! - [`CancelFlag`] (from [`Session::cancel_flag`]) stops a running generation from another thread.
//!
//! Exactness: at temperature 0 a speculating session returns the tokens a sequential one returns; when
//! sampling, the same distribution (rejection sampling with residual correction).
//!
//! # Quick start
//!
//! ```
//! use turbospark::{Event, GenerationConfig, Model};
//!
//! let model = Model::builder(turbospark::EMBEDDED_MODEL).threads(2).build()?;
//! let mut session = model.session()?;
//! let mut streamed = String::new();
//! let result = session.generate("def fibonacci(n):", &GenerationConfig::greedy(16), |event| {
//!     if let Event::Delta(text) = event {
//!         streamed.push_str(text);
//!     }
//! })?;
//! assert_eq!(streamed, result.text);
//! println!("{} ({})", result.text, session.mode());
//! # Ok::<(), turbospark::Error>(())
//! ```
//!
//! The crates beneath this one are re-exported under their own names ([`runtime`], [`device`],
//! [`families`], [`model_io`], [`drafters`], [`kernels`], [`sampling`], [`synth`]) for tools that need
//! a lower layer (the CLI's benchmark, the server's job runner); docs/DESIGN.md describes them.

mod error;
mod model;
mod session;

pub use device::Device;
pub use error::Error;
pub use model::{Model, ModelBuilder};
pub use runtime::{
    CancelFlag, ChatMessage, DrafterOptions, DrafterRequest, Event, GenerationConfig,
    GenerationResult, RenderOptions, SpecStats, Speculation, StopReason, TokenLogprob,
};
pub use sampling::Shaping;
pub use session::Session;

pub use device;
pub use drafters;
pub use families;
pub use kernels;
pub use model_io;
pub use runtime;
pub use sampling;
pub use synth;

/// The repository's embedded default model, `models/testbed` (a small trained Qwen3.5-architecture
/// model with an MTP head and a DFlash drafter), as a path resolved when this crate was built.
pub const EMBEDDED_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/testbed");
