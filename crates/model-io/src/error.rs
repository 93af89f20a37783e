//! The one error type of this crate.
//!
//! Invariant: every variant names the file it is about (`path`), says what is wrong, and names the
//! tensor or config field when one is involved, so a user can fix the checkpoint from the message
//! alone. Nothing in this crate panics on input-derived data; every failure becomes one of these.

use std::path::PathBuf;

/// Why a checkpoint (or one of its files) could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file the checkpoint needs is absent.
    #[error("{}: file not found ({what})", path.display())]
    MissingFile { path: PathBuf, what: &'static str },

    /// A file exists but could not be read (permissions, I/O error, mmap failure).
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file is not valid JSON (or its top level is not an object).
    #[error("{}: invalid JSON: {reason}", path.display())]
    Json { path: PathBuf, reason: String },

    /// `architectures` / `model_type` name a model this runtime does not implement.
    #[error(
        "{}: unsupported architecture `{architecture}` (supported: {supported})",
        path.display()
    )]
    UnknownArchitecture {
        path: PathBuf,
        architecture: String,
        supported: &'static str,
    },

    /// A config field that has no usable default is absent.
    #[error("{}: required field `{field}` is missing", path.display())]
    MissingField { path: PathBuf, field: String },

    /// A config field has the wrong JSON type.
    #[error("{}: field `{field}` should be {expected}, found {found}", path.display())]
    WrongType {
        path: PathBuf,
        field: String,
        expected: &'static str,
        found: String,
    },

    /// A config field has the right type but a value the model cannot use.
    #[error("{}: field `{field}`: {reason}", path.display())]
    InvalidValue {
        path: PathBuf,
        field: String,
        reason: String,
    },

    /// A config feature that transformers supports but this runtime does not (yet).
    #[error("{}: field `{field}`: unsupported: {reason}", path.display())]
    Unsupported {
        path: PathBuf,
        field: String,
        reason: String,
    },

    /// A safetensors file is malformed (truncated, bad header, bad offsets).
    #[error("{}: invalid safetensors file: {reason}", path.display())]
    Safetensors { path: PathBuf, reason: String },

    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error(
        "{}: no weights found (expected model.safetensors or model.safetensors.index.json)",
        path.display()
    )]
    NoWeights { path: PathBuf },

    /// `model.safetensors.index.json` is malformed or disagrees with its shards.
    #[error("{}: invalid shard index: {reason}", path.display())]
    Index { path: PathBuf, reason: String },

    /// The shard index names a shard file that does not exist.
    #[error(
        "{}: shard `{shard}` (holding tensor `{tensor}`) does not exist",
        path.display()
    )]
    MissingShard {
        path: PathBuf,
        shard: String,
        tensor: String,
    },

    /// Two files of one checkpoint both hold a tensor of the same name.
    #[error(
        "{}: tensor `{tensor}` is also stored in {}",
        path.display(),
        other.display()
    )]
    DuplicateTensor {
        path: PathBuf,
        other: PathBuf,
        tensor: String,
    },

    /// A tensor the model needs is not in the checkpoint. `path` is the checkpoint directory.
    #[error("{}: tensor `{tensor}` not found in the checkpoint", path.display())]
    MissingTensor { path: PathBuf, tensor: String },

    /// A tensor exists with a different shape than the config implies.
    #[error(
        "{}: tensor `{tensor}` has shape {found:?}, expected {expected:?}",
        path.display()
    )]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// A tensor is stored in a dtype that cannot be used as weights (only F32, BF16, F16 can).
    #[error(
        "{}: tensor `{tensor}` has dtype {dtype}, which is not supported for weights (F32, BF16, F16 are)",
        path.display()
    )]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },

    /// A GGUF file is malformed (bad magic or version, truncated, bad counts, offsets or sizes).
    #[error("{}: invalid GGUF file: {reason}", path.display())]
    Gguf { path: PathBuf, reason: String },

    /// A GGUF tensor is stored in a ggml type this runtime cannot convert (IQ*, Q2_K, Q3_K, ...).
    #[error(
        "{}: tensor `{tensor}` has ggml type {ggml_type}, which is not supported (supported: {supported})",
        path.display()
    )]
    UnsupportedGgmlType {
        path: PathBuf,
        tensor: String,
        ggml_type: &'static str,
        supported: &'static str,
    },

    /// `tokenizer.json` is missing or cannot be parsed by the `tokenizers` crate.
    #[error("{}: cannot load tokenizer: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
}

impl LoadError {
    /// `Io` for `path`, except that "not found" becomes `MissingFile` with `what` as the explanation.
    pub(crate) fn from_io(path: PathBuf, source: std::io::Error, what: &'static str) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            LoadError::MissingFile { path, what }
        } else {
            LoadError::Io { path, source }
        }
    }
}
