//! Behaviour on a machine without a GPU (this project's CI): `CudaDevice::open` is one readable error,
//! never a panic; and, where NVRTC is loadable, the kernel module compiles for sm_90.
use cuda_backend::{CudaDevice, CudaError};

#[test]
fn open_without_a_gpu_is_one_clear_error() {
    match CudaDevice::open() {
        Ok(dev) => println!(
            "note: a GPU is present ({}); the no-device assertion is skipped",
            dev.summary()
        ),
        Err(e) => {
            let msg = e.to_string();
            println!("open() -> {msg}");
            assert!(
                matches!(e, CudaError::NoDriver { .. } | CudaError::NoDevice { .. }),
                "{e:?}"
            );
            assert!(msg.contains("libcuda") || msg.contains("GPU"), "{msg}");
            assert!(!msg.contains('\n'), "one line: {msg}");
        }
    }
}

#[test]
#[ignore = "needs libnvrtc (the CUDA toolkit): run with --ignored where it is installed"]
fn kernels_compile_with_nvrtc() {
    assert!(
        cuda_backend::nvrtc::nvrtc_present(),
        "libnvrtc is not loadable: install the CUDA toolkit's NVRTC or put it on LD_LIBRARY_PATH"
    );
    let src = cuda_backend::nvrtc::module_source();
    let include = cuda_backend::nvrtc::include_dirs();
    let cubin = cuda_backend::nvrtc::compile_cubin("test", &src, 90, &include)
        .unwrap_or_else(|e| panic!("{e}"));
    // Every kernel the backend looks up is an exported symbol of the cubin (an ELF string table entry).
    for name in cuda_backend::device::KERNELS {
        let needle = format!("{name}\0");
        assert!(
            cubin.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "kernel {name} missing from the cubin"
        );
    }
}
