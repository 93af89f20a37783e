//! A verify forward over n rows must give each row exactly (bit for bit) what n single-row decode steps give:
//! that is what makes greedy speculative decoding equal sequential decoding token for token.

use families::{Transformer, Wanted};
use model_io::Checkpoint;
use std::path::PathBuf;

fn load(name: &str) -> Transformer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    families::load(&Checkpoint::open(&dir).unwrap()).unwrap()
}

fn check(name: &str) {
    let m = load(name);
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % m.vocab as u32).collect();
    let tail: Vec<u32> = (0..16u32).map(|i| (i * 53 + 5) % m.vocab as u32).collect();
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
