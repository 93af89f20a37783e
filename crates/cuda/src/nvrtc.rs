//! Run-time kernel compilation: the CUDA C sources in `src/cu/` are compiled by NVRTC for the device's
//! exact architecture (a cubin, `--gpu-architecture=sm_XY`) and cached on disk.
//!
//! Cache key: FNV-1a 64 of (NVRTC version, options, source), stable across Rust versions and machines;
//! the file is `<cache dir>/<key>-sm<arch>.cubin`, written to a temporary name and renamed, so a reader
//! never sees a half-written file. A cache file that cannot be read just recompiles.
//!
//! Include path: NVRTC has no built-in toolkit headers (`<cuda_bf16.h>` fails without one), so the
//! directories `<dir of the loaded libnvrtc>/../include` (toolkit and pip-wheel layouts alike),
//! `$CUDA_HOME/include` and `/usr/local/cuda/include` that exist are passed as `--include-path`. Our
//! kernels treat bf16 as raw u16 and need no header; the path is there for kernels that do.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

use crate::error::CudaError;

/// The kernel sources, concatenated in this order into one module.
pub const SOURCES: [(&str, &str); 5] = [
    ("common.cuh", include_str!("cu/common.cuh")),
    ("linear.cu", include_str!("cu/linear.cu")),
    ("misc.cu", include_str!("cu/misc.cu")),
    ("attention.cu", include_str!("cu/attention.cu")),
    ("gdn.cu", include_str!("cu/gdn.cu")),
];

/// The whole module's source.
pub fn module_source() -> String {
    SOURCES
        .iter()
        .map(|(name, text)| format!("// ---- {name}\n{text}\n"))
        .collect()
}

/// FNV-1a 64 over the given parts (with a separator so ("ab","c") != ("a","bc")).
pub fn cache_key(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.as_bytes().iter().chain(std::iter::once(&0xffu8)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Where cubins are cached: `$TURBOSPARK_CUDA_CACHE`, else `$XDG_CACHE_HOME/turbospark/cuda`, else
/// `$HOME/.cache/turbospark/cuda`, else the temporary directory.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("TURBOSPARK_CUDA_CACHE") {
        return dir;
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return dir.join("turbospark").join("cuda");
    }
    if let Some(home) = var("HOME") {
        return home.join(".cache").join("turbospark").join("cuda");
    }
    std::env::temp_dir().join("turbospark-cuda")
}

/// Candidate include directories, from the loaded libraries listed in `maps` (the text of
/// /proc/self/maps) and the environment's `CUDA_HOME`/`CUDA_PATH`; only those that exist are returned.
pub fn include_dirs_from(maps: &str, cuda_home: &[PathBuf]) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let file = path.rsplit('/').next().unwrap_or("");
        if file.starts_with("libnvrtc.so") || file.starts_with("libnvrtc.alt.so") {
            if let Some(root) = Path::new(path).parent().and_then(Path::parent) {
                candidates.push(root.join("include"));
                // pip wheels keep cuda_bf16.h in nvidia/cuda_runtime/include beside nvidia/cu13.
                if let Some(nvidia) = root.parent() {
                    candidates.push(nvidia.join("cuda_runtime").join("include"));
                }
            }
        }
    }
    for home in cuda_home {
        candidates.push(home.join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.push(PathBuf::from(
        "/usr/local/cuda/targets/x86_64-linux/include",
    ));
    let mut out: Vec<PathBuf> = Vec::new();
    for c in candidates {
        if c.is_dir() && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// [`include_dirs_from`] for this process (call after NVRTC has been loaded).
pub fn include_dirs() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let homes: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(|k| std::env::var_os(k).map(PathBuf::from))
        .collect();
    include_dirs_from(&maps, &homes)
}

/// Whether libnvrtc can be loaded (never panics).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library names; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; the library is present (checked by callers).
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// Compiles `src` to a cubin for sm_`arch` (no cache).
pub fn compile_cubin(
    module: &str,
    src: &str,
    arch: u32,
    include: &[PathBuf],
) -> Result<Vec<u8>, CudaError> {
    let fail = |log: String| CudaError::Compile {
        module: module.to_string(),
        arch,
        log,
    };
    let csrc = CString::new(src).map_err(|_| fail("source contains a NUL byte".into()))?;
    let prog = result::create_program(&csrc, None).map_err(|e| fail(format!("{e:?}")))?;
    let opts = options(arch, include);
    // SAFETY: `prog` is a live program handle until destroy_program below.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }
        .map(|l| {
            // SAFETY: NVRTC returns a NUL-terminated log.
            unsafe { CStr::from_ptr(l.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let out = match compiled {
        Err(e) => Err(fail(format!("{e:?}\n{log}"))),
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: as above; size is an out-parameter.
            let rc = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(fail(format!(
                    "nvrtcGetCUBINSize returned {rc:?}, size {size}"
                )))
            } else {
                let mut buf = vec![0u8; size];
                // SAFETY: buf holds exactly `size` bytes as NVRTC asked.
                let rc = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
                if rc == sys::nvrtcResult::NVRTC_SUCCESS {
                    Ok(buf)
                } else {
                    Err(fail(format!("nvrtcGetCUBIN returned {rc:?}")))
                }
            }
        }
    };
    // SAFETY: destroys the handle created above exactly once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn options(arch: u32, include: &[PathBuf]) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture=sm_{arch}"),
        "--std=c++17".to_string(),
    ];
    opts.extend(
        include
            .iter()
            .map(|d| format!("--include-path={}", d.display())),
    );
    opts
}

/// Where a compiled module is cached, and whether it came from the cache.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub path: PathBuf,
    pub from_cache: bool,
}

/// Compiles through the on-disk cache in `dir`.
pub fn compile_cached(
    module: &str,
    src: &str,
    arch: u32,
    include: &[PathBuf],
    dir: &Path,
) -> Result<Compiled, CudaError> {
    let (major, minor) = nvrtc_version();
    let version = format!("nvrtc {major}.{minor}");
    // Include directories change nothing for our header-free kernels but key them anyway.
    let opts = options(arch, include).join(" ");
    let key = cache_key(&[&version, &opts, src]);
    let path = dir.join(format!("{key:016x}-sm{arch}.cubin"));
    if let Ok(cubin) = std::fs::read(&path) {
        if !cubin.is_empty() {
            return Ok(Compiled {
                cubin,
                path,
                from_cache: true,
            });
        }
    }
    let cubin = compile_cubin(module, src, arch, include)?;
    let io = |source| CudaError::Cache {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!("{key:016x}-sm{arch}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, &cubin).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(Compiled {
        cubin,
        path,
        from_cache: false,
    })
}
