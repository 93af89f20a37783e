//! The front door's one error type: the runtime's errors (each names the file, tensor, field or
//! request parameter at fault) and the few that only opening a [`crate::Model`] can raise.

/// What can go wrong opening a model or generating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// A builder option out of range, named as the caller set it (`threads`, ...).
    #[error("invalid model option `{option}`: {reason}")]
    InvalidOption {
        option: &'static str,
        reason: String,
    },
    /// The model's thread pool could not be started.
    #[error("cannot start {threads} kernel threads: {source}")]
    ThreadPool {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
}

impl Error {
    /// The runtime error underneath, if this is one (front ends match on its variants).
    pub fn as_runtime(&self) -> Option<&runtime::RuntimeError> {
        match self {
            Error::Runtime(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the device asked for could not be opened on this machine (no driver, no GPU, a missing
    /// CUDA library), as opposed to a failure of the model itself.
    pub fn is_device_unavailable(&self) -> bool {
        matches!(self, Error::Runtime(runtime::RuntimeError::Device(d)) if device::is_unavailable(d.as_ref()))
    }
}
