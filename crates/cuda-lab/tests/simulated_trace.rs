//! The segment kernels' trace instantiations (`TURBOSPARK_SEG_TRACE=1`, the instrument every decode
//! measurement reads: segment_trace.rs) in the kernel simulator: a traced segment must run (not fall back
//! to per-GEMV launches) and give the launches' bits. Its own test binary: the segment configuration is
//! read from the environment when the device is created, once per process.

use cuda_backend::CudaDevice;

#[test]
fn traced_segments_run_and_keep_the_bits() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if let Err(e) = std::process::Command::new(&cxx).arg("--version").output() {
        panic!("the kernel simulator needs a C++ compiler: `{cxx} --version` failed ({e}); install g++ or set CXX");
    }
    // The only test of this binary: no other thread reads the environment.
    std::env::set_var("TURBOSPARK_SEG_TRACE", "1");
    let dev = CudaDevice::simulated().unwrap();
    let rows = cuda_lab::selftest::self_test_segments(&dev).unwrap();
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.what.clone())
        .collect();
    assert!(rows.len() >= 5, "{} checks", rows.len());
    assert!(failed.is_empty(), "failed: {failed:#?}");
    assert!(
        dev.segment_launches() >= 5,
        "{} segment launches",
        dev.segment_launches()
    );
}
