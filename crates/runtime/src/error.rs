//! The one error type of the runtime crate. Every variant names what is wrong and where: the
//! request parameter (by its API name: `max_tokens`, `temperature`, `stop`), the command-line
//! flag, the template file, the token id. Front ends show these messages to users verbatim, so
//! each one says what to change.

use std::path::PathBuf;

use crate::sink::StopReason;

/// Everything the runtime can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A request parameter is invalid; caught at admission, before any work is done.
    /// `field` is the parameter's request name (`prompt`, `max_tokens`, `stop`, `temperature`...).
    #[error("invalid request parameter `{field}`: {reason}")]
    InvalidRequest { field: &'static str, reason: String },

    /// A command-line flag (or its option-key twin on the C API) has a value we cannot parse.
    #[error("invalid value {value:?} for {flag}: {reason}")]
    InvalidFlag {
        flag: &'static str,
        value: String,
        reason: String,
    },

    /// A named speculation request that this model cannot serve. `auto` never produces this: it
    /// degrades to sequential decoding with a warning instead (see `policy::resolve`).
    #[error("{request} was asked for but cannot be served: {reason}")]
    SpeculationUnavailable { request: String, reason: String },

    /// The detokenizer failed on a token id sequence (e.g. an id outside the vocabulary).
    #[error("detokenizing {count} token ids (last id {last:?}) failed: {reason}")]
    Detokenize {
        count: usize,
        last: Option<u32>,
        reason: String,
    },

    /// A loop committed a token after the sink had already stopped: a bug in the calling loop.
    #[error("token {token} committed after the generation stopped ({reason})")]
    CommitAfterStop { token: u32, reason: StopReason },

    /// A loop asked for the sink's output before any stop condition ended the generation.
    #[error("the generation has not stopped yet: call `TokenSink::stop` before `finish`")]
    NotStopped,

    /// The model could not run a forward (bad token id, context overflow, state mismatch, ...).
    #[error(transparent)]
    Model(#[from] families::ModelError),

    /// The device the model runs on failed (driver call, out of device memory, a feature the backend
    /// does not implement); the source says which.
    #[error(transparent)]
    Device(Box<dyn std::error::Error + Send + Sync + 'static>),

    /// The checkpoint could not be loaded.
    #[error(transparent)]
    Load(#[from] model_io::LoadError),

    /// Shaping or selection failed for a reason other than a bad request parameter
    /// (e.g. a non-finite logit from the model).
    #[error("sampling failed: {0}")]
    Sampling(#[from] sampling::SamplingError),

    /// A tokenizer config or chat template file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// `tokenizer_config.json` (or another config) is not what we expect.
    #[error("{origin}: {reason}")]
    Config { origin: String, reason: String },

    /// The chat template does not compile, or rendering it failed (including the template's own
    /// `raise_exception`, whose message is kept).
    #[error("chat template from {origin} failed to {stage}: {message}")]
    Template {
        origin: String,
        stage: &'static str,
        message: String,
    },
}

impl From<families::BackendError> for RuntimeError {
    fn from(e: families::BackendError) -> Self {
        match e {
            families::BackendError::Model(m) => RuntimeError::Model(m),
            families::BackendError::Device(d) => RuntimeError::Device(d),
        }
    }
}

impl RuntimeError {
    /// A request-parameter error; `field` is the API name of the parameter.
    pub(crate) fn request(field: &'static str, reason: impl Into<String>) -> Self {
        RuntimeError::InvalidRequest {
            field,
            reason: reason.into(),
        }
    }
}
