//! llama.cpp's GGUF converter, for tests that convert a model at test time (too large to commit).
//!
//! Tooling (not installed by the build; tools/fixtures/README.md says how to set it up):
//! `TURBOSPARK_LLAMA_CPP` = the llama.cpp tree of the llama-cpp-python 0.3.36 sdist (nothing built),
//! `TURBOSPARK_GGUF_PYTHON` = a python with tools/fixtures/requirements.txt and requirements-gguf.txt.
//! Tests that use it are `#[ignore]`d with the reason, and run with `--ignored` where the tooling is;
//! run without it they panic naming the missing variable (never a silent pass).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The reason string of tests that need the converter.
pub const NEEDS_CONVERTER: &str =
    "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)";

fn var(name: &str) -> PathBuf {
    match std::env::var_os(name) {
        Some(v) => PathBuf::from(v),
        None => panic!("testdata: {name} is not set; this test {}", NEEDS_CONVERTER),
    }
}

/// Runs `program` with `args`; panics naming `what` with its stderr when it fails.
fn run_tool(program: &Path, args: &[&std::ffi::OsStr], what: &str) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("testdata: cannot run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "testdata: {what} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn fixture_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/gguf_models.py")
}

/// Converts the Hugging Face checkpoint `model_dir` to `out` with tools/fixtures/gguf_models.py and
/// `args` (e.g. `["--outtype", "f32"]`); skips the work when `out` exists. Panics with the
/// converter's output on failure.
pub fn convert_to_gguf(model_dir: &Path, out: &Path, args: &[&str]) -> PathBuf {
    if out.is_file() {
        return out.to_path_buf();
    }
    let llama_cpp = var("TURBOSPARK_LLAMA_CPP");
    let python = var("TURBOSPARK_GGUF_PYTHON");
    let script = fixture_script();
    let tmp = partial(out);
    let mut all = vec![
        script.as_os_str(),
        llama_cpp.as_os_str(),
        model_dir.as_os_str(),
        tmp.as_os_str(),
    ];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    run_tool(
        &python,
        &all,
        &format!("converting {}", model_dir.display()),
    );
    std::fs::rename(&tmp, out).unwrap_or_else(|e| panic!("testdata: {}: {e}", out.display()));
    out.to_path_buf()
}

/// `convert_to_gguf` into the test cache (`<target>/<profile>/testdata/gguf/<name>`).
pub fn converted(model_dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let dir = crate::cache_dir().join("gguf");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("testdata: {}: {e}", dir.display()));
    convert_to_gguf(model_dir, &dir.join(name), args)
}

/// A random tiny Qwen3.5-MoE checkpoint (`gguf_models.py --make-tiny-qwen35moe`), made once into the
/// test cache: the repository has no MoE Qwen3.5 fixture to convert.
pub fn tiny_qwen35_moe() -> PathBuf {
    let dir = crate::cache_dir().join("gguf").join("tiny-qwen35moe");
    if dir.join("config.json").is_file() {
        return dir;
    }
    let python = var("TURBOSPARK_GGUF_PYTHON");
    let script = fixture_script();
    let args = [
        script.as_os_str(),
        "--make-tiny-qwen35moe".as_ref(),
        dir.as_os_str(),
    ];
    run_tool(&python, &args, "making the tiny Qwen3.5-MoE");
    dir
}

/// `llama-quantize` (built from the same llama.cpp tree: `shared/tools/llama-cpp.sh DIR
/// llama-quantize`) at `TURBOSPARK_LLAMA_QUANTIZE`, run on `input` into the test cache as `name`
/// with llama.cpp's `ftype` (e.g. `Q4_K_M`).
pub fn quantized(input: &Path, name: &str, ftype: &str) -> PathBuf {
    quantized_with(input, name, &[], ftype)
}

/// [`quantized`] with llama-quantize's `flags` before the paths (e.g. `["--pure"]`: every tensor in
/// `ftype`'s type where its rows divide into the type's blocks, instead of the ftype's mixture).
pub fn quantized_with(input: &Path, name: &str, flags: &[&str], ftype: &str) -> PathBuf {
    let out = crate::cache_dir().join("gguf").join(name);
    if out.is_file() {
        return out;
    }
    let quantize = var("TURBOSPARK_LLAMA_QUANTIZE");
    let tmp = partial(&out);
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    args.extend([input.as_os_str(), tmp.as_os_str(), ftype.as_ref()]);
    run_tool(
        &quantize,
        &args,
        &format!("llama-quantize {flags:?} {ftype}"),
    );
    std::fs::rename(&tmp, &out).unwrap_or_else(|e| panic!("testdata: {}: {e}", out.display()));
    out
}

/// Every tensor of `gguf` dequantized to f32 by the pinned `gguf` Python package
/// (`gguf.quants.dequantize`), in file order: `(name, values)`, values in stored element order.
pub fn gguf_py_dequantized(gguf: &Path) -> Vec<(String, Vec<f32>)> {
    let python = var("TURBOSPARK_GGUF_PYTHON");
    let dump = gguf.with_extension("gguf-py.f32");
    let script = r#"
import sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1])
with open(sys.argv[2], "wb") as out:
    for t in r.tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).ravel()
        name = t.name.encode()
        out.write(len(name).to_bytes(4, "little") + name + v.size.to_bytes(8, "little") + v.tobytes())
"#;
    let args = [
        "-c".as_ref(),
        script.as_ref(),
        gguf.as_os_str(),
        dump.as_os_str(),
    ];
    run_tool(&python, &args, "gguf-py dequantization");
    let bytes =
        std::fs::read(&dump).unwrap_or_else(|e| panic!("testdata: {}: {e}", dump.display()));
    let mut out = Vec::new();
    let mut at = 0;
    let take = |at: &mut usize, n: usize| {
        let s = &bytes[*at..*at + n];
        *at += n;
        s
    };
    while at < bytes.len() {
        let len = u32::from_le_bytes(take(&mut at, 4).try_into().unwrap()) as usize;
        let name = String::from_utf8(take(&mut at, len).to_vec()).unwrap();
        let n = u64::from_le_bytes(take(&mut at, 8).try_into().unwrap()) as usize;
        let values = take(&mut at, 4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push((name, values));
    }
    out
}

/// A temporary name beside `out`, unique to this process and call: tests running at once may convert
/// the same model, and each renames its own finished file over `out` (atomic; the contents agree).
fn partial(out: &Path) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    out.with_extension(format!("partial-{}-{n}", std::process::id()))
}
