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
pub const SOURCES: [(&str, &str); 12] = [
    ("common.cuh", include_str!("cu/common.cuh")),
    ("linear.cu", include_str!("cu/linear.cu")),
    ("linear_mma.cu", include_str!("cu/linear_mma.cu")),
    ("quant.cu", include_str!("cu/quant.cu")),
    ("misc.cu", include_str!("cu/misc.cu")),
    ("attention.cu", include_str!("cu/attention.cu")),
    ("attention_tc.cu", include_str!("cu/attention_tc.cu")),
    ("gdn.cu", include_str!("cu/gdn.cu")),
    ("gdn_chunk.cu", include_str!("cu/gdn_chunk.cu")),
    ("moe.cu", include_str!("cu/moe.cu")),
    ("segment_sync.cuh", include_str!("cu/segment_sync.cuh")),
    ("segment.cu", include_str!("cu/segment.cu")),
];

/// The whole module's source.
pub fn module_source() -> String {
    SOURCES
        .iter()
        .map(|(name, text)| format!("// ---- {name}\n{text}\n"))
        .collect()
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Cache key of a compilation: FNV-1a 64 over the parts, each followed by a 0xff separator (a byte that
/// never occurs in UTF-8), so ("ab", "c") and ("a", "bc") differ.
pub fn cache_key(parts: &[&str]) -> u64 {
    let mut bytes = Vec::new();
    for part in parts {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0xff);
    }
    fnv1a(&bytes)
}

/// Where cubins are cached: `$TURBOSPARK_CUDA_CACHE`, else `$XDG_CACHE_HOME/turbospark/cuda`, else
/// `$HOME/.cache/turbospark/cuda`, else the temporary directory.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = &crate::debug_env::get().cuda_cache {
        return dir.clone();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference (Noll): FNV-1a 64 of "" and "a", "foobar".
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn cache_key_separates_parts_and_sees_every_part() {
        assert_ne!(cache_key(&["ab", "c"]), cache_key(&["a", "bc"]));
        assert_ne!(
            cache_key(&["v", "sm_90", "src"]),
            cache_key(&["v", "sm_80", "src"])
        );
        assert_eq!(cache_key(&["a"]), fnv1a(b"a\xff".as_slice()));
    }

    #[test]
    fn include_dirs_follow_the_loaded_libnvrtc() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // Toolkit layout: <cuda>/lib64/libnvrtc.so.13 -> <cuda>/include.
        std::fs::create_dir_all(r.join("cuda/lib64")).unwrap();
        std::fs::create_dir_all(r.join("cuda/include")).unwrap();
        // Wheel layout: nvidia/cu13/lib -> nvidia/cu13/include and nvidia/cuda_runtime/include.
        std::fs::create_dir_all(r.join("nvidia/cu13/lib")).unwrap();
        std::fs::create_dir_all(r.join("nvidia/cuda_runtime/include")).unwrap();
        let maps = format!(
            "7f00-7f01 r-xp 00000000 00:00 1 {}/cuda/lib64/libnvrtc.so.13.0.88\n\
             7f02-7f03 r-xp 00000000 00:00 1 {}/nvidia/cu13/lib/libnvrtc.so.13\n\
             7f04-7f05 r-xp 00000000 00:00 1 /usr/lib/libc.so.6\n",
            r.display(),
            r.display()
        );
        let dirs = include_dirs_from(&maps, &[]);
        assert!(dirs.contains(&r.join("cuda/include")), "{dirs:?}");
        assert!(
            dirs.contains(&r.join("nvidia/cuda_runtime/include")),
            "{dirs:?}"
        );
        // Directories that do not exist are never passed to NVRTC.
        assert!(!dirs.contains(&r.join("nvidia/cu13/include")), "{dirs:?}");
        assert!(dirs.iter().all(|d| d.is_dir()));
        // CUDA_HOME-style roots are honoured too.
        let home = r.join("home");
        std::fs::create_dir_all(home.join("include")).unwrap();
        assert!(include_dirs_from("", std::slice::from_ref(&home)).contains(&home.join("include")));
    }

    #[test]
    #[ignore = "needs libnvrtc (the CUDA toolkit): run with --ignored where it is installed"]
    fn compiled_modules_are_cached_by_source_and_arch() {
        assert!(
            nvrtc_present(),
            "libnvrtc is not loadable: install the CUDA toolkit's NVRTC or put it on LD_LIBRARY_PATH"
        );
        let dir = tempfile::tempdir().unwrap();
        let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }";
        let a = compile_cached("t", src, 90, &[], dir.path()).unwrap();
        assert!(!a.from_cache);
        let b = compile_cached("t", src, 90, &[], dir.path()).unwrap();
        assert!(b.from_cache && b.cubin == a.cubin && b.path == a.path);
        let c = compile_cached("t", src, 80, &[], dir.path()).unwrap();
        assert!(!c.from_cache && c.path != a.path);
        let err = compile_cached("t", "this is not CUDA", 90, &[], dir.path()).unwrap_err();
        assert!(matches!(err, CudaError::Compile { .. }), "{err}");
    }
}
