//! cuda_check: the CUDA backend's device validation, run on the GPU machine (tools/device/cuda_check.sh).
//!
//! 1. Opens the device (prints driver, NVRTC, include path, kernel cache) and checks that
//!    `<cuda_bf16.h>` compiles with the include path found beside the loaded libnvrtc.
//! 2. For each fixture (qwen3, qwen3_5, qwen3_next, qwen3_realtok), in exact mode (weights as stored, f32 activations)
//!    and bf16 mode: logits vs transformers' reference and the CPU engine, per-layer hidden states vs the
//!    CPU engine, greedy continuation, verify/tape/snapshot/graph state checks (see fixtures.rs).
//! 3. The GPU MTP head against the host head on checkpoints carrying `mtp.*` (qwen3_5, qwen3_next, the testbed
//!    with `--testbed DIR`): logits, proposals, draft graph == direct launches, draft step time (mtp.rs).
//! 4. Batch-1 decode tok/s on a synthetic qwen35-4b and its roofline fraction (see bench.rs).
//!
//! Exit code: 0 all checks passed, 1 a check failed, 2 no GPU/driver.
//! `--fixtures DIR` (default `fixtures`, the repository's) is read through `testdata::materialize`: its
//! `*.zst` files are decompressed once into a cache beside this binary.
//! Usage: cuda_check [--fixtures DIR] [--only NAME] [--no-bench] [--shape NAME] [--prompt N] [--new N]
//!                   [--sweep]     (times every GEMV kernel variant on the qwen35-4b matrix shapes)
//!                   [--table]     (the issue's table: decode / prefill 512, 4096 / verify curves for
//!                                  qwen35-4b, qwen35-9b and qwen3-8b, one run; see table.rs)
//!                   [--testbed DIR] (also check the GPU MTP head on this checkpoint, e.g. models/testbed)
//!                   [--emulate]   (host-emulated device: checks this program's logic without a GPU)
//!                   [--simulate]  (the real kernels compiled for the CPU: checks the kernels without a GPU)
//! Environment: TURBOSPARK_ATTN_TC=0 runs prefill attention on the split-K kernels instead of the tensor
//! cores; TURBOSPARK_ATTN_TC_SPLITS=N fixes its key splits (default: from the pass shape).

mod bench;
mod fixtures;
mod mtp;
mod table;

use std::path::PathBuf;
use std::sync::Arc;

use cuda_backend::{nvrtc, CudaDevice};

struct Args {
    fixtures: PathBuf,
    only: Option<String>,
    bench: bool,
    shape: String,
    prompt: usize,
    new: usize,
    emulate: bool,
    simulate: bool,
    sweep: bool,
    table: bool,
    testbed: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        fixtures: PathBuf::from("fixtures"),
        only: None,
        bench: true,
        shape: "qwen35-4b".into(),
        prompt: 512,
        new: 128,
        emulate: false,
        simulate: false,
        sweep: false,
        table: false,
        testbed: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--fixtures" => a.fixtures = PathBuf::from(value()?),
            "--only" => a.only = Some(value()?),
            "--no-bench" => a.bench = false,
            "--emulate" => a.emulate = true,
            "--simulate" => a.simulate = true,
            "--sweep" => a.sweep = true,
            "--table" => a.table = true,
            "--testbed" => a.testbed = Some(PathBuf::from(value()?)),
            "--shape" => a.shape = value()?,
            "--prompt" => a.prompt = value()?.parse().map_err(|e| format!("--prompt: {e}"))?,
            "--new" => a.new = value()?.parse().map_err(|e| format!("--new: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// LoadOptions::default() with the environment's prefill-attention choices (module doc), so that a run
/// can compare them without a rebuild.
pub(crate) fn base_options() -> cuda_backend::LoadOptions {
    let d = cuda_backend::LoadOptions::default();
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    cuda_backend::LoadOptions {
        attention_tc: var("TURBOSPARK_ATTN_TC").map_or(d.attention_tc, |v| v != "0"),
        attention_tc_splits: var("TURBOSPARK_ATTN_TC_SPLITS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(d.attention_tc_splits),
        ..d
    }
}

const BF16_HEADER_PROBE: &str = r#"
#include <cuda_bf16.h>
extern "C" __global__ void probe(__nv_bfloat16* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __float2bfloat16(__bfloat162float(x[i]) * s);
}
"#;

fn main() {
    let mut args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cuda_check: {e}");
            std::process::exit(64);
        }
    };
    // fixtures/ stores its large files zstd-compressed (fixtures/README.md): check a plain copy of it.
    let plain = testdata::cache_dir().join("cuda_check-fixtures");
    match testdata::materialize(&args.fixtures, &plain) {
        Ok(()) => args.fixtures = plain,
        Err(e) => println!(
            "fixtures: {e} (reading {} as it is)",
            args.fixtures.display()
        ),
    }
    let t0 = std::time::Instant::now();
    let opened = if args.emulate {
        Ok(CudaDevice::emulated())
    } else if args.simulate {
        CudaDevice::simulated()
    } else {
        CudaDevice::open()
    };
    let dev = match opened {
        Ok(d) => Arc::new(d),
        Err(e) => {
            println!("RESULT: no device: {e}");
            std::process::exit(2);
        }
    };
    println!("device: {}", dev.summary());
    println!("programmatic dependent launch: {}", dev.pdl());
    println!("kernel cache: {}", dev.info.kernel_cache.display());
    if dev.is_emulated() {
        println!("<cuda_bf16.h> probe: not checked (no NVRTC without a GPU)");
    } else {
        let probe = nvrtc::compile_cubin(
            "bf16 header probe",
            BF16_HEADER_PROBE,
            dev.info.arch,
            &dev.info.include_dirs,
        );
        println!(
            "<cuda_bf16.h> with the discovered include path: {}",
            match probe {
                Ok(_) => "compiles".to_string(),
                Err(e) => format!(
                    "FAILS: {}",
                    e.to_string()
                        .lines()
                        .take(3)
                        .collect::<Vec<_>>()
                        .join(" / ")
                ),
            }
        );
    }
    let mut all_ok = true;
    // The self-test checks kernels (their layouts, their bits); the host emulation runs none.
    let kernels = !cuda_backend::lab::host_ops(&dev);
    if !kernels {
        println!("  [kernel] self-test: not run on the host emulation (it has no kernels)");
    }
    let rows = if kernels {
        cuda_lab::selftest::self_test(&dev)
    } else {
        Ok(Vec::new())
    };
    match rows {
        Ok(rows) => {
            for r in rows {
                all_ok &= r.ok();
                println!(
                    "  [kernel] {:<58} rel err {:.2e} (bound {:.0e}) {}",
                    r.what,
                    r.error,
                    r.bound,
                    if r.ok() { "ok" } else { "FAIL" }
                );
            }
        }
        Err(e) => {
            all_ok = false;
            println!("  [kernel] self-test ERROR: {e}");
        }
    }
    for name in ["qwen3", "qwen3_5", "qwen3_next", "qwen3_realtok"] {
        if args.only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let dir = args.fixtures.join(name);
        for (exact, tc) in [(true, false), (false, false), (false, true)] {
            match fixtures::check(&dev, &dir, exact, tc) {
                Ok(ok) => all_ok &= ok,
                Err(e) => {
                    all_ok = false;
                    println!(
                        "  [{name} {}] ERROR: {e:#}",
                        if exact { "exact" } else { "bf16" }
                    );
                }
            }
        }
    }
    if args.sweep && !dev.is_emulated() {
        if let Err(e) = bench::sweep(&dev) {
            all_ok = false;
            println!("sweep: ERROR {e:#}");
        }
    }
    let mut mtp_dirs = Vec::new();
    for name in ["qwen3_5", "qwen3_next"] {
        if args.only.as_deref().is_none_or(|o| o == name) {
            mtp_dirs.push(args.fixtures.join(name));
        }
    }
    mtp_dirs.extend(args.testbed.clone());
    for dir in &mtp_dirs {
        for (tc, vg) in [(false, false), (true, false), (true, true)] {
            match fixtures::spec_rounds(&dev, dir, tc, vg) {
                Ok(ok) => all_ok &= ok,
                Err(e) => {
                    all_ok = false;
                    println!("  [{} spec rounds] ERROR: {e:#}", dir.display());
                }
            }
        }
    }
    for dir in mtp_dirs {
        for exact in [true, false] {
            match mtp::check(&dev, &dir, exact) {
                Ok(ok) => all_ok &= ok,
                Err(e) => {
                    all_ok = false;
                    println!("  [{} mtp] ERROR: {e:#}", dir.display());
                }
            }
        }
    }
    // The simulator runs the benchmark's logic too (give it a small --shape).
    if args.bench && (!dev.is_emulated() || args.simulate) {
        match bench::run(&dev, &args.shape, args.prompt, args.new) {
            Ok(consistent) => all_ok &= consistent,
            Err(e) => {
                all_ok = false;
                println!("bench: ERROR {e:#}");
            }
        }
    }
    if args.table && !dev.is_emulated() {
        match table::run(&dev, &["qwen35-4b", "qwen35-9b", "qwen3-8b"], args.new) {
            Ok(ok) => all_ok &= ok,
            Err(e) => {
                all_ok = false;
                println!("table: ERROR {e:#}");
            }
        }
    }
    println!(
        "RESULT: {} ({:.1} s)",
        if all_ok {
            "ALL CHECKS PASSED"
        } else {
            "SOME CHECKS FAILED"
        },
        t0.elapsed().as_secs_f64()
    );
    std::process::exit(if all_ok { 0 } else { 1 });
}
