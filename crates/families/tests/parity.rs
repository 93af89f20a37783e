//! Parity with transformers: logits of the committed fixtures (tools/fixtures/make_fixtures.py) computed
//! in one pass, token by token and in chunks of 7, and the 32-token greedy continuation.

use families::{State, Transformer, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;
use std::path::PathBuf;

const TOLERANCE: f32 = 1e-3;

fn fixture_dir(name: &str) -> PathBuf {
    testdata::fixture(name)
}

struct Reference {
    prompt: Vec<u32>,
    vocab: usize,
    full: Vec<f32>,
    stepwise: Vec<f32>,
    chunked: Vec<f32>,
    greedy: Vec<u32>,
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("reference tensor {name}: {e}"));
    assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name} must be f32");
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn ids(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("reference tensor {name}: {e}"));
    match t.dtype() {
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect(),
        safetensors::Dtype::I32 => t
            .data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect(),
        d => panic!("{name}: unexpected dtype {d:?}"),
    }
}

fn reference(name: &str) -> Reference {
    let bytes = std::fs::read(fixture_dir(name).join("reference.safetensors"))
        .expect("reference.safetensors");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = ids(&st, "prompt_ids");
    let full = f32s(&st, "logits_full");
    Reference {
        vocab: full.len() / prompt.len(),
        stepwise: f32s(&st, "logits_stepwise"),
        chunked: f32s(&st, "logits_chunked7"),
        greedy: ids(&st, "greedy_ids"),
        full,
        prompt,
    }
}

fn load(name: &str) -> Transformer {
    let ck = Checkpoint::open(&fixture_dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    families::load(&ck).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn run_chunks(m: &Transformer, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut state: State = m.new_state();
    let mut logits = Vec::new();
    for (i, c) in prompt.chunks(chunk).enumerate() {
        let out = m.forward(c, i * chunk, &mut state, &Wanted::all()).unwrap();
        logits.extend_from_slice(&out.logits);
    }
    assert_eq!(state.position(), prompt.len());
    logits
}

fn greedy(m: &Transformer, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = m.new_state();
    let mut out = m.forward(prompt, 0, &mut state, &Wanted::last()).unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let next = kernels::argmax(out.row(0)) as u32;
        ids.push(next);
        out = m
            .forward(&[next], state.position(), &mut state, &Wanted::last())
            .unwrap();
    }
    ids
}

fn check_family(name: &str) {
    let r = reference(name);
    let m = load(name);
    assert_eq!(m.vocab, r.vocab);
    let full = run_chunks(&m, &r.prompt, r.prompt.len());
    let d = max_abs_diff(&full, &r.full);
    assert!(d <= TOLERANCE, "{name}: one pass max |Δlogit| = {d}");
    let step = run_chunks(&m, &r.prompt, 1);
    let d = max_abs_diff(&step, &r.stepwise);
    assert!(d <= TOLERANCE, "{name}: token by token max |Δlogit| = {d}");
    let chunked = run_chunks(&m, &r.prompt, 7);
    let d = max_abs_diff(&chunked, &r.chunked);
    assert!(d <= TOLERANCE, "{name}: chunks of 7 max |Δlogit| = {d}");
    let ids = greedy(&m, &r.prompt, r.greedy.len());
    assert_eq!(
        ids, r.greedy,
        "{name}: greedy continuation differs from transformers"
    );
}

#[test]
fn qwen3_matches_transformers() {
    check_family("qwen3");
}

#[test]
fn qwen3_5_matches_transformers() {
    check_family("qwen3_5");
}

/// A fine-grained FP8 checkpoint in Qwen's layout (e4m3 weights, BF16 `weight_scale_inv` per 128x128
/// block, partial blocks, `modules_to_not_convert`): transformers on the dequantized weights.
#[test]
fn qwen3_5_fp8_matches_transformers() {
    check_family("qwen3_5_fp8");
}

#[test]
fn qwen3_next_matches_transformers() {
    check_family("qwen3_next");
}

/// Qwen3-MoE as released (every layer MoE, renormalised top-2 of 8, untied, bf16 weights).
#[test]
fn qwen3_moe_matches_transformers() {
    check_family("qwen3_moe");
}

/// Qwen3-MoE with dense layers (decoder_sparse_step 2, mlp_only_layers), unnormalised top-3, head_dim
/// from hidden / heads.
#[test]
fn qwen3_moe_mixed_matches_transformers() {
    check_family("qwen3_moe_mixed");
}

/// The real-vocabulary fixture stores the last row in full and the top-8 logits of every row (a full
/// [89, 151936] table would be 54 MB).
#[test]
fn qwen3_real_tokenizer_model_matches_transformers() {
    let bytes = std::fs::read(fixture_dir("qwen3_realtok").join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = ids(&st, "prompt_ids");
    let m = load("qwen3_realtok");
    let logits = run_chunks(&m, &prompt, prompt.len());
    let v = m.vocab;
    let last = &logits[(prompt.len() - 1) * v..];
    let d = max_abs_diff(last, &f32s(&st, "logits_last"));
    assert!(d <= TOLERANCE, "last row max |Δlogit| = {d}");
    let top_ids = ids(&st, "topk8_ids");
    let top_logits = f32s(&st, "topk8_logits");
    for (row, (tid, tl)) in top_ids.chunks(8).zip(top_logits.chunks(8)).enumerate() {
        for (&t, &l) in tid.iter().zip(tl) {
            let ours = logits[row * v + t as usize];
            assert!(
                (ours - l).abs() <= TOLERANCE,
                "row {row} token {t}: {ours} vs {l}"
            );
        }
    }
    assert_eq!(greedy(&m, &prompt, 32), ids(&st, "greedy_ids"));
}

/// `Qwen3_5ForConditionalGeneration` layout (text tower under `model.language_model.`, vision ignored);
/// its reference holds the one-pass logits and the greedy continuation.
#[test]
fn qwen3_5_conditional_generation_layout_matches_transformers() {
    let bytes = std::fs::read(fixture_dir("qwen3_5_vl").join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = ids(&st, "prompt_ids");
    let m = load("qwen3_5_vl");
    let d = max_abs_diff(
        &run_chunks(&m, &prompt, prompt.len()),
        &f32s(&st, "logits_full"),
    );
    assert!(d <= TOLERANCE, "one pass max |Δlogit| = {d}");
    assert_eq!(greedy(&m, &prompt, 32), ids(&st, "greedy_ids"));
}
