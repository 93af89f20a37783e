//! A verify forward over n rows must give each row exactly (bit for bit) what n single-row decode steps give:
//! that is what makes greedy speculative decoding equal sequential decoding token for token.

use families::{Transformer, Wanted};
use model_io::Checkpoint;
use std::path::PathBuf;

fn load(name: &str) -> Transformer {
    families::load(&Checkpoint::open(&testdata::fixture(name)).unwrap()).unwrap()
}

fn check(name: &str) {
    let m = load(name);
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % m.vocab as u32).collect();
    // 17 rows: the verify block of the largest MTP / DFlash block (16 proposals and the token before them).
    let tail: Vec<u32> = (0..17u32).map(|i| (i * 53 + 5) % m.vocab as u32).collect();
    let mut base = m.new_state();
    m.forward(&prompt, 0, &mut base, &Wanted::none()).unwrap();
    // Sequential: one row at a time.
    let mut seq_state = base.clone();
    let mut seq_logits = Vec::new();
    for (i, &t) in tail.iter().enumerate() {
        let out = m
            .forward(&[t], prompt.len() + i, &mut seq_state, &Wanted::last())
            .unwrap();
        seq_logits.push(out.logits);
    }
    for n in 1..=tail.len() {
        let mut st = base.clone();
        let out = m
            .forward(&tail[..n], prompt.len(), &mut st, &Wanted::all())
            .unwrap();
        for (i, want) in seq_logits.iter().take(n).enumerate() {
            let same = out
                .row(i)
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{name}: row {i} of a {n}-row forward differs from the single-row step"
            );
        }
    }
}

#[test]
fn dense_rows_are_independent_of_batch_size() {
    check("qwen3");
}

#[test]
fn hybrid_rows_are_independent_of_batch_size() {
    check("qwen3_5");
}

#[test]
fn moe_rows_are_independent_of_batch_size() {
    check("qwen3_next");
}

/// Qwen3-MoE: bf16 experts, rows routed to different experts within one forward; and dense layers mixed in.
#[test]
fn qwen3_moe_rows_are_independent_of_batch_size() {
    check("qwen3_moe");
    check("qwen3_moe_mixed");
}

/// A tied checkpoint stored in bf16 (the testbed) gets a bf16 copy of its embeddings as the LM head (half
/// the bytes a token streams) whose logits are the f32 embeddings': bit for bit in the row-major layout,
/// to f32 rounding (1e-6 of the largest logit) on AMX tiles, which sum in another order.
#[test]
fn a_tied_bf16_head_streams_bf16_with_the_f32_embeddings_logits() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    let ck = Checkpoint::open(&dir).unwrap();
    assert!(ck.config.tie_word_embeddings);
    let m = families::load(&ck).unwrap();
    let head = m
        .lm_head
        .as_ref()
        .expect("a bf16 head for the tied bf16 embeddings");
    let families::layers::Weights::Bf16(matrix) = &head.w else {
        panic!("the tied bf16 head is not bf16: {:?}", head.w);
    };
    let h: Vec<f32> = (0..3 * m.hidden)
        .map(|i| ((i * 7919) % 1013) as f32 * 0.003 - 1.5)
        .collect();
    let mut want = vec![0.0; 3 * m.vocab];
    kernels::linear(&h, &m.embed, 3, m.hidden, m.vocab, &mut want);
    let got = m.lm_head(&h, 3);
    match matrix {
        kernels::Bf16Matrix::RowMajor { .. } => assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits())),
        _ => {
            let scale = want.iter().fold(0.0f32, |s, v| s.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .fold(0.0f32, |s, (a, b)| s.max((a - b).abs()));
            assert!(
                worst <= 1e-6 * scale,
                "{matrix:?}: off by {worst} of {scale}"
            );
        }
    }
}
