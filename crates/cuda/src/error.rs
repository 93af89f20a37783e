//! Errors of the CUDA backend. Every variant names what failed and where (library, kernel, tensor, call),
//! so that "no GPU here" and "a kernel failed to compile" are one readable line each, never a panic.

use families::ModelError;
use model_io::LoadError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (libcuda.so.1) could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver: libcuda could not be loaded (searched the dynamic-loader path: {searched}); \
         this machine has no NVIDIA GPU/driver, or LD_LIBRARY_PATH lacks the driver directory"
    )]
    NoDriver { searched: String },
    /// The driver loaded but reports no usable device (or cuInit failed).
    #[error("CUDA driver present but no usable GPU: {reason}")]
    NoDevice { reason: String },
    /// A CUDA library other than the driver (NVRTC, cuBLAS) is missing.
    #[error("CUDA library {library} could not be loaded (needed for {purpose}); add its directory to LD_LIBRARY_PATH")]
    MissingLibrary {
        library: &'static str,
        purpose: &'static str,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed during {context}: {source}")]
    Driver {
        context: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// NVRTC rejected the kernel source (the log is NVRTC's).
    #[error("NVRTC failed to compile {module} for sm_{arch}: {log}")]
    Compile {
        module: String,
        arch: u32,
        log: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS failed during {context}: {reason}")]
    Blas { context: String, reason: String },
    /// The on-disk kernel cache could not be written (reading failures just recompile).
    #[error("kernel cache {path}: {source}")]
    Cache {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Input or state errors with the same meaning as the CPU engine's.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The checkpoint uses something this backend does not implement yet.
    #[error("CUDA backend does not support {what}")]
    Unsupported { what: String },
    /// A greedy step's logits that no token can be picked from (chain.rs: the argmax kernel refused them).
    #[error(
        "the logits of the decode step at position {position} hold a NaN or +inf, or nothing above -inf: \
         no greedy token"
    )]
    RefusedRow { position: usize },
    /// A forward would write past the KV capacity the state was created with.
    #[error(
        "forward at position {start} with {n} tokens exceeds the state's KV capacity {capacity}"
    )]
    CapacityExceeded {
        start: usize,
        n: usize,
        capacity: usize,
    },
}

impl CudaError {
    /// Wraps a driver error with what was being done.
    pub(crate) fn driver(
        context: impl Into<String>,
    ) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        let context = context.into();
        move |source| CudaError::Driver { context, source }
    }
}
