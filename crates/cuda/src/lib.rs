//! CUDA backend (placeholder doc; see below).
pub mod device;
pub mod error;
pub mod nvrtc;

pub use device::{driver_present, CudaDevice, DeviceInfo};
pub use error::CudaError;
