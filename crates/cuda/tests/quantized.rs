//! Quantized weights on the CUDA backend (`--quantize q8_0|q4_k` on the fixtures: ggml blocks on the
//! device). On the host-emulated device (each operation as the CPU engine computes it) the model gives
//! the CPU engine's logits to f32 summation order and its greedy tokens; in the kernel simulator (the
//! quantized CUDA kernels, `src/cu/quant.cu`) decode rows follow the CPU engine's to the kernels' float
//! order and give its greedy tokens, and a verify block gives the decode rows' bits (speculation stays
//! exact on quantized weights).

use std::sync::Arc;

use cuda_backend::{CudaDevice, CudaModel, LoadOptions, WeightFormat};
use families::Wanted;
use kernels::QuantFormat;
use model_io::gguf::writer::rewrite;
use model_io::gguf::GgmlType;
use model_io::{Checkpoint, Quantize};
use safetensors::SafeTensors;

fn prompt(name: &str) -> Vec<u32> {
    let bytes = std::fs::read(testdata::fixture(name).join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensor("prompt_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .take(24)
        .collect()
}

fn quantized(name: &str, q: Quantize) -> Checkpoint {
    let mut ck = Checkpoint::open(&testdata::fixture(name)).unwrap();
    ck.tensors.set_quantize(Some(q)).unwrap();
    ck
}

/// A copy of the converter's f32 GGUF fixture with its weight matrices quantized as a llama.cpp mix
/// would: the value projections (attention V, the GDN's fused qkv) Q8_0, the other matrices Q4_0, so
/// that fused projections mix formats and the GDN output projection keeps its reordered columns.
fn mixed_gguf(dir: &std::path::Path) -> Checkpoint {
    let path = dir.join("mixed.gguf");
    let n = rewrite(
        &testdata::fixture("gguf/qwen3_5.gguf"),
        &path,
        |t, bytes| {
            let cols = t.extents[0];
            if t.ggml_type != GgmlType::F32 || t.extents.len() != 2 || cols % 32 != 0 {
                return None;
            }
            let wide = t.name.contains("attn_v") || t.name.contains("attn_qkv");
            let (format, id) = if wide {
                (QuantFormat::Q8_0, 8)
            } else {
                (QuantFormat::Q4_0, 2)
            };
            let x: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let m = kernels::quantize_matrix(format, &x, x.len() / cols, cols);
            Some((GgmlType::from_id(id).unwrap(), m.data().to_vec()))
        },
    )
    .unwrap();
    assert!(n > 10, "{n} tensors quantized");
    Checkpoint::open(&path).unwrap()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The prompt pass's logits and `steps` greedy decode rows (logits and tokens) of the CPU engine.
fn cpu_run(ck: &Checkpoint, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<Vec<f32>>, Vec<u32>) {
    let m = families::load(ck).unwrap();
    let mut st = m.new_state();
    let out = m.forward(prompt, 0, &mut st, &Wanted::all()).unwrap();
    let full = out.logits.clone();
    let mut next = kernels::argmax(out.row(prompt.len() - 1)) as u32;
    let (mut rows, mut tokens) = (Vec::new(), Vec::new());
    for i in 0..steps {
        tokens.push(next);
        let o = m
            .forward(&[next], prompt.len() + i, &mut st, &Wanted::last())
            .unwrap();
        next = kernels::argmax(o.row(0)) as u32;
        rows.push(o.logits);
    }
    (full, rows, tokens)
}

/// The same on the CUDA model; then the decode tokens again as one verify block on a fresh state, whose
/// rows must be the decode rows' bits.
fn cuda_run(m: &CudaModel, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<Vec<f32>>, Vec<u32>) {
    let n = prompt.len();
    let mut st = m.new_state(n + steps + 4).unwrap();
    let out = m.forward(prompt, 0, &mut st, &Wanted::all()).unwrap();
    let full = out.logits.clone();
    let mut next = kernels::argmax(out.row(n - 1)) as u32;
    let (mut rows, mut tokens) = (Vec::new(), Vec::new());
    for i in 0..steps {
        tokens.push(next);
        let o = m.forward(&[next], n + i, &mut st, &Wanted::last()).unwrap();
        next = kernels::argmax(o.row(0)) as u32;
        rows.push(o.logits);
    }
    let mut spec = m.new_state(n + steps + 4).unwrap();
    m.forward(prompt, 0, &mut spec, &Wanted::none()).unwrap();
    let verify = m.forward(&tokens, n, &mut spec, &Wanted::all()).unwrap();
    let same = verify.logits.len() == rows.concat().len()
        && verify
            .logits
            .iter()
            .zip(rows.concat())
            .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "verify rows are not the decode rows' bits");
    (full, rows, tokens)
}

/// Weights as stored (the non-quantized matrices stay f32, as the CPU engine keeps them), verify blocks
/// on the GEMV path.
fn opts() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::AsStored,
        ..LoadOptions::default()
    }
}

#[test]
fn emulated_quantized_models_match_the_cpu_engine() {
    let dev = Arc::new(CudaDevice::emulated());
    for name in ["qwen3_5", "qwen3"] {
        for q in [Quantize::Q8_0, Quantize::Q4K] {
            let ck = quantized(name, q);
            let p = prompt(name);
            let (full, rows, tokens) = cpu_run(&ck, &p, 6);
            let m = CudaModel::load(&dev, &ck, opts()).unwrap();
            let plain = Checkpoint::open(&testdata::fixture(name)).unwrap();
            let plain = CudaModel::load(&dev, &plain, opts()).unwrap();
            // f32 matrices to 8.5 bits a weight or fewer (a few small tensors stay as stored).
            assert!(
                3 * m.weight_bytes() < plain.weight_bytes(),
                "{name} {q:?}: {} bytes quantized, {} as stored",
                m.weight_bytes(),
                plain.weight_bytes()
            );
            let (g_full, g_rows, g_tokens) = cuda_run(&m, &p, 6);
            let d = max_abs(&g_full, &full);
            assert!(d <= 1e-4, "{name} {q:?}: prompt logits max |Δ| {d}");
            let d = max_abs(&g_rows.concat(), &rows.concat());
            assert!(d <= 1e-4, "{name} {q:?}: decode logits max |Δ| {d}");
            assert_eq!(g_tokens, tokens, "{name} {q:?}");
        }
    }
}

#[test]
fn simulated_quantized_kernels_follow_the_cpu_engine_and_verify_rows_equal_decode_rows() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if let Err(e) = std::process::Command::new(&cxx).arg("--version").output() {
        panic!("the kernel simulator needs a C++ compiler: `{cxx} --version` failed ({e})");
    }
    let dev = Arc::new(CudaDevice::simulated().unwrap());
    for (name, q) in [("qwen3_5", Quantize::Q8_0), ("qwen3", Quantize::Q4K)] {
        let ck = quantized(name, q);
        let p = prompt(name);
        let (_, rows, tokens) = cpu_run(&ck, &p, 4);
        let m = CudaModel::load(&dev, &ck, opts()).unwrap();
        let (_, g_rows, g_tokens) = cuda_run(&m, &p, 4);
        // Each kernel is the CPU's to 1e-5 (cuda-lab's quantized self-test). Through a model, an input
        // value that lands within rounding of a half step of its 8-bit grid can round the other way
        // after the kernels' other float order (attention, norms): one step of one input of one
        // product. The fixtures show up to 2% of the logits' scale after such flips; tokens agree.
        let scale = rows.concat().iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = max_abs(&g_rows.concat(), &rows.concat());
        assert!(
            d <= 0.05 * scale,
            "{name} {q:?}: decode logits max |Δ| {d} (scale {scale})"
        );
        assert_eq!(g_tokens, tokens, "{name} {q:?}");
    }
}

#[test]
fn quantized_gguf_with_mixed_formats_runs_on_the_gpu_paths() {
    let dir = tempfile::tempdir().unwrap();
    let ck = mixed_gguf(dir.path());
    let p: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 512).collect();
    let (full, rows, tokens) = cpu_run(&ck, &p, 6);
    let dev = Arc::new(CudaDevice::emulated());
    let m = CudaModel::load(&dev, &ck, opts()).unwrap();
    // Every projection in blocks (fused ones of mixed formats too): under a quarter of the f32 bytes.
    let plain = Checkpoint::open(&testdata::fixture("gguf/qwen3_5.gguf")).unwrap();
    let plain = CudaModel::load(&dev, &plain, opts()).unwrap();
    assert!(
        4 * m.weight_bytes() < plain.weight_bytes(),
        "{} bytes quantized, {} f32",
        m.weight_bytes(),
        plain.weight_bytes()
    );
    let (g_full, g_rows, g_tokens) = cuda_run(&m, &p, 6);
    assert!(max_abs(&g_full, &full) <= 1e-4, "emulated prompt logits");
    assert!(
        max_abs(&g_rows.concat(), &rows.concat()) <= 1e-4,
        "emulated decode logits"
    );
    assert_eq!(g_tokens, tokens, "emulated");
    let dev = Arc::new(CudaDevice::simulated().unwrap());
    let m = CudaModel::load(&dev, &ck, opts()).unwrap();
    let (_, g_rows, g_tokens) = cuda_run(&m, &p, 6);
    let scale = rows.concat().iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_abs(&g_rows.concat(), &rows.concat());
    assert!(
        d <= 0.05 * scale,
        "simulated decode logits max |Δ| {d} (scale {scale})"
    );
    assert_eq!(g_tokens, tokens, "simulated");
}

/// A fine-grained FP8 checkpoint (Qwen's layout, `qwen3_5_fp8`) and `--quantize fp8`: FP8 blocks on the
/// device; FP8 kernels read the f32 inputs as they are, so the kernels follow the CPU engine to rounding.
#[test]
fn fp8_weights_run_on_the_gpu_paths() {
    let sim = Arc::new(CudaDevice::simulated().unwrap());
    let emu = Arc::new(CudaDevice::emulated());
    let stored = Checkpoint::open(&testdata::fixture("qwen3_5_fp8")).unwrap();
    for (what, ck) in [
        ("qwen3_5_fp8", stored),
        (
            "qwen3_5 --quantize fp8",
            quantized("qwen3_5", Quantize::Fp8),
        ),
    ] {
        // A prompt within the GEMV's rows: the prefill path rounds bf16 activations (its own check is
        // the kernel self-test), which the fixture's bf16 tensors would show here.
        let p: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 200).collect();
        let (full, rows, tokens) = cpu_run(&ck, &p, 6);
        let m = CudaModel::load(&emu, &ck, opts()).unwrap();
        // The target's matrices as f32 would be 4 bytes a weight; in FP8 blocks most are 1.
        let f32_bytes: usize = ck
            .tensors
            .names()
            .filter(|n| !n.starts_with("mtp.") && !n.ends_with("_scale_inv"))
            .filter_map(|n| match ck.tensors.shape(n).unwrap() {
                [r, c] => Some(4 * r * c),
                _ => None,
            })
            .sum();
        assert!(
            m.weight_bytes() * 5 < f32_bytes * 3,
            "{what}: {} bytes on the device, {f32_bytes} as f32",
            m.weight_bytes()
        );
        let (g_full, g_rows, g_tokens) = cuda_run(&m, &p, 6);
        assert!(
            max_abs(&g_full, &full) <= 1e-4,
            "{what}: emulated prompt logits"
        );
        assert!(
            max_abs(&g_rows.concat(), &rows.concat()) <= 1e-4,
            "{what}: emulated decode"
        );
        assert_eq!(g_tokens, tokens, "{what}: emulated");
        let m = CudaModel::load(&sim, &ck, opts()).unwrap();
        let (_, g_rows, g_tokens) = cuda_run(&m, &p, 6);
        let d = max_abs(&g_rows.concat(), &rows.concat());
        assert!(d <= 1e-3, "{what}: simulated decode logits max |Δ| {d}");
        assert_eq!(g_tokens, tokens, "{what}: simulated");
    }
}
