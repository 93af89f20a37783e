//! The kernel simulator: the same CUDA C module NVRTC compiles for the GPU, compiled instead by the
//! host C++ compiler against `src/sim/sim.h` (the CUDA device language on fibers) and loaded as a
//! shared library, so [`crate::CudaDevice::simulated`] runs the real kernels — their indexing,
//! barriers, shuffles and arithmetic — on the CPU, with host memory as device memory.
//!
//! Like the NVRTC path, the library is cached on disk under the kernel cache directory, keyed by an
//! FNV-1a hash of (compiler, flags, shim, module source). What it cannot check: timing, races between
//! blocks (blocks run one after another), and NVCC's multiply-add contraction (results agree with the
//! GPU to rounding; properties such as batch invariance hold within each).

use std::ffi::{c_char, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::buf::{arg_slots, Arg};
use crate::error::CudaError;
use crate::nvrtc;

const SIM_H: &str = include_str!("sim/sim.h");
const RUNTIME: &str = include_str!("sim/runtime.cpp");
const FLAGS: [&str; 6] = [
    "-std=c++20",
    "-O2",
    "-shared",
    "-fPIC",
    "-w",
    "-fno-strict-aliasing",
];

type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut *mut c_void,
    *mut c_char,
    u32,
) -> i32;

/// The simulator's state (fibers, the current block, `__shared__` statics) is process-wide: one launch
/// at a time, whichever thread or device asks.
static LAUNCH_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A loaded simulator library.
pub(crate) struct Sim {
    _lib: libloading::Library,
    launch: LaunchFn,
    pub path: PathBuf,
}

fn sim_error(what: impl Into<String>) -> CudaError {
    CudaError::Unsupported {
        what: format!("the kernel simulator: {}", what.into()),
    }
}

/// The translation unit: shim, module source, runtime, and one table entry per kernel.
fn translation_unit(kernels: &[&str]) -> String {
    let mut s = String::from("#include \"sim.h\"\n");
    s.push_str(&nvrtc::module_source());
    s.push_str("\n#include \"runtime.cpp\"\n");
    for k in kernels {
        s.push_str(&format!("SIM_KERNEL({k})\n"));
    }
    s.push_str("SIM_END\n");
    s
}

impl Sim {
    /// Compiles (or finds in the cache) and loads the simulator for `kernels`.
    pub fn load(kernels: &[&str]) -> Result<Self, CudaError> {
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let tu = translation_unit(kernels);
        let key = nvrtc::cache_key(&[&cxx, &FLAGS.join(" "), SIM_H, RUNTIME, &tu]);
        let dir = nvrtc::cache_dir().join(format!("sim-{key:016x}"));
        let lib = dir.join("libkernsim.so");
        if !lib.is_file() {
            compile(&cxx, &dir, &tu, &lib)?;
        }
        // SAFETY: the library is our own generated code; loading runs no initialisers with effects
        // beyond its statics.
        let loaded = unsafe { libloading::Library::new(&lib) }
            .map_err(|e| sim_error(format!("loading {}: {e}", lib.display())))?;
        // SAFETY: sim_launch has exactly the LaunchFn signature (runtime.cpp).
        let launch = unsafe { loaded.get::<LaunchFn>(b"sim_launch\0") }
            .map(|f| *f)
            .map_err(|e| sim_error(format!("symbol sim_launch: {e}")))?;
        Ok(Sim {
            _lib: loaded,
            launch,
            path: lib,
        })
    }

    /// Runs kernel `name` over `grid` blocks of `block` threads (one block at a time).
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let mut slots = arg_slots(args);
        let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
        self.launch_params(name, grid, block, shared, &mut ptrs)
    }

    /// [`Sim::launch`] with kernelParams as for cuLaunchKernel: one pointer per parameter, to a value
    /// of the parameter's type (segment.rs passes a struct this way).
    pub fn launch_params(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        ptrs: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let cname = CString::new(name).map_err(|_| sim_error("kernel name with a NUL"))?;
        let mut err = vec![0 as c_char; 512];
        // A poisoned lock only means another launch panicked; the simulator holds no Rust state.
        let _one_at_a_time = LAUNCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: every pointer in `ptrs` addresses a live value read as the kernel's parameter type
        // (8-byte slots read little-endian for scalars, a struct's bytes for a struct parameter);
        // buffers passed as addresses are live host buffers of the emulated device (callers'
        // invariant, as for the GPU).
        let rc = unsafe {
            (self.launch)(
                cname.as_ptr(),
                grid.0,
                grid.1,
                grid.2,
                block,
                shared,
                ptrs.as_mut_ptr(),
                err.as_mut_ptr(),
                err.len() as u32,
            )
        };
        if rc != 0 {
            let bytes: Vec<u8> = err
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            return Err(sim_error(String::from_utf8_lossy(&bytes).into_owned()));
        }
        Ok(())
    }
}

fn compile(cxx: &str, dir: &Path, tu: &str, lib: &Path) -> Result<(), CudaError> {
    let io = |source| CudaError::Cache {
        path: dir.to_path_buf(),
        source,
    };
    // Every file this compile writes has a name of its own (process and call), so concurrent compiles
    // of one library — test threads of one process on a fresh cache — never read each other's
    // half-written files; the last rename wins with identical bytes.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = format!(
        "{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    std::fs::create_dir_all(dir).map_err(io)?;
    let write_new = |name: &str, text: &str| -> Result<(), CudaError> {
        let tmp = dir.join(format!("{name}.{unique}.tmp"));
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, dir.join(name)).map_err(io)
    };
    write_new("sim.h", SIM_H)?;
    write_new("runtime.cpp", RUNTIME)?;
    let module = dir.join(format!("module.{unique}.cpp"));
    std::fs::write(&module, tu).map_err(io)?;
    let tmp = dir.join(format!("libkernsim.{unique}.tmp"));
    let out = Command::new(cxx)
        .args(FLAGS)
        .arg("-o")
        .arg(&tmp)
        .arg(&module)
        .output()
        .map_err(|e| sim_error(format!("running {cxx}: {e}")))?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr);
        let head: Vec<&str> = log.lines().take(30).collect();
        return Err(sim_error(format!(
            "{cxx} failed on {}:\n{}",
            module.display(),
            head.join("\n")
        )));
    }
    std::fs::rename(&tmp, lib).map_err(io)?;
    std::fs::rename(&module, dir.join("module.cpp")).map_err(io)
}
