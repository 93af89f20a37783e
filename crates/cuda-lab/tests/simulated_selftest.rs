//! The kernel self-test in the kernel simulator (`CudaDevice::simulated`: `src/cu/` compiled with the
//! host C++ compiler against the CUDA shim, every launch run on the CPU): each kernel against the CPU
//! engine's kernels, and batch invariance bit for bit, as `cuda_check` runs it on the device.

use std::sync::Arc;

use cuda_backend::CudaDevice;

/// The kernel simulator (`src/cu/` compiled by the host C++ compiler, `$CXX` or g++). CI has g++: a
/// missing compiler fails the test rather than skipping it.
fn simulated() -> Arc<CudaDevice> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if let Err(e) = std::process::Command::new(&cxx).arg("--version").output() {
        panic!("the kernel simulator needs a C++ compiler: `{cxx} --version` failed ({e}); install g++ or set CXX");
    }
    Arc::new(CudaDevice::simulated().unwrap())
}

#[test]
fn simulated_kernels_pass_the_self_test() {
    let dev = simulated();
    let rows = cuda_lab::selftest::self_test(&dev).unwrap();
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} (error {:.2e}, bound {:.0e})", r.what, r.error, r.bound))
        .collect();
    assert!(rows.len() > 40, "{} checks", rows.len());
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// The table's read-only stream kernel launches with its arguments (a rate needs the GPU: NaN here).
#[test]
fn simulated_read_stream_runs() {
    let dev = simulated();
    assert!(cuda_lab::profile::read_bandwidth(&dev).unwrap().is_nan());
}

/// The chunked GDN kernels against the step form and an f64 recurrence (also part of the self-test).
#[test]
fn simulated_chunked_gdn_matches_step_form_and_f64() {
    let dev = simulated();
    let rows = cuda_lab::selftest::self_test_gdn_chunked(&dev).unwrap();
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} (error {:.2e}, bound {:.0e})", r.what, r.error, r.bound))
        .collect();
    assert!(rows.len() >= 40, "{} checks", rows.len());
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// The quantized kernels (every block format, mixed parts, column order, embeddings) against the CPU
/// engine's quantized kernels, and their batch invariance (also part of the self-test).
#[test]
fn simulated_quantized_kernels_match_the_cpu() {
    let dev = simulated();
    let rows = cuda_lab::selftest::self_test_quant(&dev).unwrap();
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} (error {:.2e}, bound {:.0e})", r.what, r.error, r.bound))
        .collect();
    assert!(rows.len() >= 60, "{} checks", rows.len());
    assert!(failed.is_empty(), "failed: {failed:#?}");
}
