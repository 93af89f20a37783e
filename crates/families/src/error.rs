//! Errors of the model families: a load problem (from `model-io`) or a forward request the model cannot serve.

use model_io::LoadError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The checkpoint is well-formed but uses a feature this engine does not implement.
    #[error("{dir}: unsupported model feature: {what}")]
    Unsupported { dir: String, what: String },
    #[error("token id {token} at prompt index {index} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        token: u32,
        index: usize,
        vocab: usize,
    },
    #[error("forward at position {start} with {n} tokens exceeds the context length {context}")]
    ContextOverflow {
        start: usize,
        n: usize,
        context: usize,
    },
    #[error("forward must start at the state's position {expected} (recurrent state cannot rewind), got {got}")]
    PositionMismatch { expected: usize, got: usize },
    #[error("forward called with no tokens")]
    EmptyInput,
    #[error("state was built for a different model ({0})")]
    StateMismatch(String),
    #[error("tap layer {layer} out of range (model has {layers} layers)")]
    TapOutOfRange { layer: usize, layers: usize },
}
