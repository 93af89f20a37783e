//! `Transformer::forward_batch`: several sequences' rows in one pass give each sequence exactly (bit for
//! bit) what `forward` gives it alone — logits, taps, and the state it leaves (checked by the next step
//! and by a tape rollback) — whatever else is in the batch: decode rows, a verify block on a tape, a
//! 17-row block, prefill chunks longer than the matvec path (GEMM and, for GDN, the chunked form).

use std::path::PathBuf;

use families::backend::SeqRows;
use families::{Rows, State, Tap, Transformer, Wanted};
use model_io::Checkpoint;

fn ids(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % vocab as u32)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One sequence of the batch: a state advanced by `history` tokens, then `rows` run at its position.
struct Seq {
    state: State,
    start: usize,
    rows: Vec<u32>,
    wanted: Wanted,
    tape: bool,
}

fn check(label: &str, m: &Transformer) {
    let v = m.vocab;
    let wanted = |logits: Rows, taps: Vec<Tap>| Wanted {
        logits,
        taps,
        argmax_only: false,
        candidates: 0,
    };
    // (history, rows, wanted, tape)
    let plan = [
        (30, 1, wanted(Rows::Last, vec![]), false),
        (12, 5, wanted(Rows::All, vec![Tap::FinalHidden]), true),
        (0, 40, wanted(Rows::Last, vec![Tap::LayerOutput(0)]), false),
        (7, 17, wanted(Rows::From(1), vec![]), true),
        (0, 3, wanted(Rows::None, vec![Tap::FinalHidden]), false),
        (21, 2, wanted(Rows::All, vec![]), false),
    ];
    let mut seqs: Vec<Seq> = plan
        .into_iter()
        .enumerate()
        .map(|(i, (history, rows, wanted, tape))| {
            let mut state = m.new_state();
            if history > 0 {
                m.forward(
                    &ids(history, 100 + i as u32, v),
                    0,
                    &mut state,
                    &Wanted::none(),
                )
                .unwrap();
            }
            Seq {
                state,
                start: history,
                rows: ids(rows, i as u32, v),
                wanted,
                tape,
            }
        })
        .collect();
    for s in seqs.iter_mut().filter(|s| s.tape) {
        m.begin_tape(&mut s.state);
    }
    // Each alone.
    let mut alone_states: Vec<State> = seqs.iter().map(|s| s.state.clone()).collect();
    let alone: Vec<_> = seqs
        .iter()
        .zip(alone_states.iter_mut())
        .map(|(s, st)| m.forward(&s.rows, s.start, st, &s.wanted).unwrap())
        .collect();
    // All in one batch.
    let mut batch: Vec<SeqRows<'_, State>> = seqs
        .iter_mut()
        .map(|s| SeqRows {
            tokens: &s.rows,
            start: s.start,
            state: &mut s.state,
            wanted: &s.wanted,
        })
        .collect();
    let together = m.forward_batch(&mut batch).unwrap();
    drop(batch);
    assert_eq!(together.len(), alone.len());
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            (a.first_row, a.rows),
            (b.first_row, b.rows),
            "{label} seq {i}"
        );
        assert!(
            bits(&a.logits) == bits(&b.logits),
            "{label} seq {i}: logits differ"
        );
        assert_eq!(a.taps.len(), b.taps.len(), "{label} seq {i}");
        for (t, (x, y)) in a.taps.iter().zip(&b.taps).enumerate() {
            assert!(
                !x.is_empty() && bits(x) == bits(y),
                "{label} seq {i}: tap {t} differs"
            );
        }
    }
    // The states they leave: one more step each (after rolling the taped ones back to their first two
    // rows) gives the same bits.
    for (i, (s, st)) in seqs.iter_mut().zip(alone_states.iter_mut()).enumerate() {
        let mut pos = s.start + s.rows.len();
        if s.tape {
            assert!(s.state.rollback_retaining(2), "{label} seq {i}");
            assert!(st.rollback_retaining(2), "{label} seq {i}");
            pos = s.start + 2;
        }
        let next = [(i as u32 * 7 + 3) % v as u32];
        let a = m.forward(&next, pos, st, &Wanted::last()).unwrap();
        let b = m
            .forward(&next, pos, &mut s.state, &Wanted::last())
            .unwrap();
        assert!(
            bits(&a.logits) == bits(&b.logits),
            "{label} seq {i}: the next step differs"
        );
    }
}

fn fixture(name: &str) -> Transformer {
    families::load(&Checkpoint::open(&testdata::fixture(name)).unwrap()).unwrap()
}

#[test]
fn a_batch_gives_each_dense_sequence_its_own_forward() {
    check("qwen3", &fixture("qwen3"));
}

#[test]
fn a_batch_gives_each_hybrid_sequence_its_own_forward() {
    check("qwen3_5", &fixture("qwen3_5"));
}

#[test]
fn a_batch_gives_each_moe_sequence_its_own_forward() {
    check("qwen3_next", &fixture("qwen3_next"));
}

#[test]
fn a_batch_gives_each_qwen3_moe_sequence_its_own_forward() {
    check("qwen3_moe", &fixture("qwen3_moe"));
    check("qwen3_moe_mixed", &fixture("qwen3_moe_mixed"));
}

/// The testbed's bf16 layers (AMX tiles where the CPU has them: one call for the whole batch).
#[test]
fn a_batch_gives_each_testbed_sequence_its_own_forward() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    check(
        "testbed",
        &families::load(&Checkpoint::open(&dir).unwrap()).unwrap(),
    );
}

/// A bad sequence fails the whole call before any row runs, naming what is wrong.
#[test]
fn a_bad_sequence_is_an_error() {
    let m = fixture("qwen3");
    let (mut a, mut b) = (m.new_state(), m.new_state());
    let good = [1u32, 2];
    let bad = [m.vocab as u32];
    let w = Wanted::last();
    let mut batch = [
        SeqRows {
            tokens: &good,
            start: 0,
            state: &mut a,
            wanted: &w,
        },
        SeqRows {
            tokens: &bad,
            start: 0,
            state: &mut b,
            wanted: &w,
        },
    ];
    let err = m.forward_batch(&mut batch).unwrap_err();
    assert!(
        err.to_string().contains("vocab") || err.to_string().contains("token"),
        "{err}"
    );
}
