//! model-io: loads Hugging Face checkpoints of Qwen3, Qwen3.5 and Qwen3-Next as users have them.
//!
//! - [`ModelConfig`]: config.json with transformers 5.x's defaults and rules (layer pattern, RoPE
//!   settings old and new, MoE sparse step), validated.
//! - [`TensorStore`]: all safetensors shards memory-mapped, headers validated at open; tensors are
//!   converted to f32 (or handed out raw) on request, with the shape checked.
//! - [`Checkpoint`]: the directory: config, weights, generation defaults, chat template, tokenizer,
//!   and drafter detection (MTP tensors, a `dflash/` sub-directory).
//!
//! Invariant: bad input is a [`LoadError`] naming the file and what is wrong in it (field, tensor,
//! shard); nothing here panics on the contents of a checkpoint.

mod checkpoint;
mod config;
mod error;
mod fp8;
mod generation;
pub mod gguf;
mod json;
mod tensors;

pub use checkpoint::Checkpoint;
pub use config::{Family, LayerKind, LinearAttentionConfig, ModelConfig, MoeConfig};
pub use error::LoadError;
pub use fp8::{e4m3_to_f32, Fp8Tensor};
pub use generation::GenerationDefaults;
pub use tensors::{DType, Quantize, QuantizedTensor, TensorStore, QUANTIZED_TYPES};

/// Re-exported so users of [`Checkpoint::tokenizer`] need not pin the same version themselves.
pub use tokenizers;
