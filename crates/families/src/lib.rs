//! Model families behind one forward seam: `Transformer::forward(tokens, start, &mut State, &Wanted)`.
//!
//! A family is a loader that maps a checkpoint's config and tensor names onto the shared layer types
//! (`layers::*`); adding one touches its own file, the dispatch in `load`, and model-io's config parsing.

pub mod backend;
mod batch;
pub mod error;
pub mod hybrid;
pub mod layers;
pub mod model;
pub mod qwen3;
pub mod state;
pub mod tape;

pub use backend::{
    Backend, BackendError, BackendState, HostHead, SeqRows, SharedHead, TargetHead, PREFILL_CHUNK,
};
pub use error::ModelError;
pub use model::{Candidates, ForwardOut, Rows, Tap, Transformer, Wanted};
pub use state::State;
pub use tape::LayerTape;

/// Most rows a forward computes each exactly as a one-row step would (the CPU kernels' row paths): the
/// largest verify block of a speculative round that reproduces sequential decoding on the CPU.
pub const EXACT_ROWS: usize = kernels::MATVEC_MAX_ROWS;

use layers::{Linear, Norm, Tensors};
use model_io::{Checkpoint, Family};

/// Loads the target model of a checkpoint (weights converted to f32).
pub fn load(ck: &Checkpoint) -> Result<Transformer, ModelError> {
    let c = &ck.config;
    if c.attention_bias {
        return Err(ModelError::Unsupported {
            dir: ck.dir.display().to_string(),
            what: "attention_bias = true".into(),
        });
    }
    let t = Tensors::new(&ck.tensors, c.tensor_prefix.clone());
    let zero_centred = c.family.zero_centred_norms();
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for i in 0..c.num_hidden_layers {
        layers.push(match c.family {
            Family::Qwen3 | Family::Qwen3Moe => qwen3::load_layer(&t, c, i)?,
            Family::Qwen35 | Family::Qwen3Next => hybrid::load_layer(&t, c, i)?,
        });
    }
    let embed = t.get("embed_tokens.weight", &[c.vocab_size, c.hidden_size])?;
    // The LM head sits beside the `model.` prefix (`lm_head.weight`), also for ConditionalGeneration.
    let root = Tensors::new(&ck.tensors, "");
    // Tied checkpoints read the embeddings even if an `lm_head.weight` copy is stored (as transformers does).
    let lm_head = if c.tie_word_embeddings {
        Linear::tied_head(&t, "embed_tokens.weight", c.vocab_size, c.hidden_size)?
    } else {
        Some(Linear::load(
            &root,
            "lm_head.weight",
            c.vocab_size,
            c.hidden_size,
        )?)
    };
    Ok(Transformer {
        family: c.family,
        embed,
        layers,
        final_norm: Norm::load(
            &t,
            "norm.weight",
            c.hidden_size,
            c.rms_norm_eps,
            zero_centred,
        )?,
        lm_head,
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        context: c.max_position_embeddings,
    })
}
