//! The turbospark runtime: the model-independent generation contract and, around it, the decode
//! loops that drive a model.
//!
//! - [`config`]: what a request asks ([`GenerationConfig`], checked by [`check_admission`]) and
//!   what it gets back ([`GenerationResult`], [`SpecStats`]).
//! - [`sink`]: [`TokenSink`], the one commit path of sequential and speculative decoding: stop
//!   rules in a fixed precedence, stop-string withholding, UTF-8-safe deltas, cancellation.
//! - [`detok`]: [`Detokenizer`] and the incremental decoder behind the deltas.
//! - [`policy`]: whether and how a run speculates, from the request and what the checkpoint has.
//! - [`drafter_options`]: the weight-free drafters' options (n-gram sizes, the suffix drafter's bound).
//! - [`tuner`]: the block of an `auto` run, tuned on measured throughput.
//! - [`batch`]: [`BatchHub`], continuous batching of generations on several threads at the model seam.
//! - [`chat`]: Hugging Face chat templates rendered as transformers renders them.
//! - [`logprobs`]: the log-probabilities of committed tokens (`GenerationConfig::logprobs`).
//!
//! Invariant shared by every loop: a token is committed only through [`TokenSink::commit`], so
//! everything a caller observes is decided in one place.

pub mod batch;
pub mod chat;
pub mod config;
pub mod detok;
pub mod drafter_options;
pub mod engine;
pub mod error;
pub mod generate;
pub mod logprobs;
pub mod policy;
pub mod session;
pub mod sink;
pub mod tuner;

pub use batch::{BatchHub, BatchStats, Batched};
pub use chat::{ChatMessage, ChatTemplate, RenderOptions};
pub use config::{check_admission, DrafterRounds, GenerationConfig, GenerationResult, SpecStats};
pub use detok::{ByteDetokenizer, Detokenizer, IncrementalDecoder};
pub use drafter_options::DrafterOptions;
pub use engine::{availability, load_drafter, Engine, Prepared};
pub use error::RuntimeError;
pub use generate::{generate, Acceptance, Request, Rollback, Speculative, PREFILL_CHUNK};
pub use logprobs::{prompt_logprobs, token_logprob, TokenLogprob, MAX_TOP_LOGPROBS};
pub use policy::{
    resolve, Drafter, DrafterAvailability, DrafterRequest, Speculation, SpeculationPlan,
};
pub use session::Session;
pub use sink::{CancelFlag, Event, SinkOutput, StopReason, TokenSink};
