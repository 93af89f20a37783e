//! Temperature 0: the speculative stream equals the sequential stream token for token, and the state it
//! leaves behind is bit-identical, for both rollback kinds, over prompts × blocks 1..8 × stop strings × max
//! tokens × drafter error rates — every branch of a round: all accepted, first rejected, stop token inside an
//! accepted run, stop string across the bonus token, max tokens mid-round, cancellation mid-round.

mod common;

use common::{detok, fixture, prompt, Oracle};
use runtime::{
    generate, CancelFlag, Event, GenerationConfig, Request, Rollback, Session, Speculative,
};

struct Case {
    prompt: Vec<u32>,
    max_tokens: usize,
    stop: Vec<String>,
    eos: Vec<u32>,
    cancel_after: Option<usize>,
}

fn run(
    model: &families::Transformer,
    case: &Case,
    spec: Option<(Speculative, Oracle)>,
) -> (runtime::GenerationResult, families::State, String) {
    let d = detok(model.vocab as u32);
    let mut session = Session::new(model);
    let speculative = spec.as_ref().map(|(s, _)| *s);
    if let Some((_, oracle)) = spec {
        session = session.with_drafter(Box::new(oracle));
    }
    let cfg = GenerationConfig {
        max_new_tokens: case.max_tokens,
        stop_strings: case.stop.clone(),
        ..GenerationConfig::greedy(case.max_tokens)
    };
    let cancel = CancelFlag::new();
    let req = Request {
        prompt: &case.prompt,
        config: &cfg,
        eos: &case.eos,
        detok: &d,
        speculative,
        cancel: cancel.clone(),
    };
    let mut streamed = String::new();
    let mut on_event = |e: Event<'_>| match e {
        Event::Delta(s) => streamed.push_str(s),
        Event::Decode { generated } if Some(generated) == case.cancel_after => cancel.cancel(),
        _ => {}
    };
    let r = generate(model, &mut session, &req, &mut on_event).unwrap();
    (r, session.state().clone(), streamed)
}

fn check_model(name: &str, min_cases: usize) {
    let (_, model) = fixture(name);
    let mut cases = 0;
    let mut branches = std::collections::BTreeSet::new();
    for salt in 0..3u32 {
        let p = prompt(&model, 5 + 7 * salt as usize, salt);
        // The sequential stream decides where stop tokens / strings can fall.
        let base = Case {
            prompt: p.clone(),
            max_tokens: 40,
            stop: vec![],
            eos: vec![],
            cancel_after: None,
        };
        let (seq, _, _) = run(&model, &base, None);
        let ids = seq.token_ids.clone();
        let text = seq.text.clone();
        let variants = vec![
            Case {
                max_tokens: 40,
                ..base_clone(&base)
            },
            Case {
                max_tokens: 7,
                ..base_clone(&base)
            },
            Case {
                eos: vec![ids[9]],
                ..base_clone(&base)
            },
            Case {
                stop: vec![chars(&text, 11, 15)],
                ..base_clone(&base)
            },
            Case {
                stop: vec![chars(&text, 20, 23), "zzzz".into()],
                max_tokens: 30,
                ..base_clone(&base)
            },
            Case {
                cancel_after: Some(6),
                ..base_clone(&base)
            },
        ];
        for case in &variants {
            let (want, want_state, want_stream) = run(&model, case, None);
            assert_eq!(want_stream, want.text);
            for block in 1..=8 {
                for (error_rate, rollback) in [
                    (0.0, Rollback::Tape),
                    (0.3, Rollback::Tape),
                    (1.0, Rollback::Tape),
                    (0.3, Rollback::Snapshot),
                ] {
                    let mut full = case.prompt.clone();
                    full.extend_from_slice(&ids);
                    let oracle = Oracle {
                        full,
                        error_rate,
                        vocab: model.vocab as u32,
                        calls: 0,
                    };
                    let spec = Speculative {
                        block,
                        rollback,
                        ..Speculative::new(block)
                    };
                    let (got, state, stream) = run(&model, case, Some((spec, oracle)));
                    let label = format!("{name} salt {salt} block {block} err {error_rate} {rollback:?} max {} stop {:?} eos {:?} cancel {:?}", case.max_tokens, case.stop, case.eos, case.cancel_after);
                    assert_eq!(got.token_ids, want.token_ids, "{label}");
                    assert_eq!(got.reason, want.reason, "{label}");
                    assert_eq!(got.text, want.text, "{label}");
                    assert_eq!(stream, got.text, "{label}: deltas");
                    assert!(
                        state.bitwise_eq(&want_state),
                        "{label}: state differs from the sequential run's"
                    );
                    let s = got.spec.as_ref().unwrap();
                    if s.rounds > 0 && s.accepted == s.proposed {
                        branches.insert("all accepted");
                    }
                    if s.per_position_offered.first().copied().unwrap_or(0)
                        > s.per_position_accepted.first().copied().unwrap_or(0)
                    {
                        branches.insert("first rejected");
                    }
                    if s.rollbacks > 0 {
                        branches.insert("rollback");
                    }
                    branches.insert(match got.reason {
                        runtime::StopReason::StopToken(_) => "stop token",
                        runtime::StopReason::StopString(_) => "stop string",
                        runtime::StopReason::MaxTokens => "max tokens",
                        runtime::StopReason::Cancelled => "cancelled",
                        runtime::StopReason::ContextFull => "context",
                    });
                    cases += 1;
                }
            }
        }
    }
    assert!(cases >= min_cases, "{cases} cases");
    for b in [
        "all accepted",
        "first rejected",
        "rollback",
        "stop token",
        "stop string",
        "max tokens",
        "cancelled",
    ] {
        assert!(branches.contains(b), "branch '{b}' never ran: {branches:?}");
    }
}

/// The text's characters from..to (stop strings cut on character, not byte, boundaries).
fn chars(text: &str, from: usize, to: usize) -> String {
    text.chars().skip(from).take(to - from).collect()
}

fn base_clone(c: &Case) -> Case {
    Case {
        prompt: c.prompt.clone(),
        max_tokens: c.max_tokens,
        stop: c.stop.clone(),
        eos: c.eos.clone(),
        cancel_after: c.cancel_after,
    }
}

#[test]
fn greedy_speculative_equals_sequential_hybrid() {
    check_model("qwen3_5", 200);
}

#[test]
fn greedy_speculative_equals_sequential_dense() {
    check_model("qwen3", 200);
}

/// An `auto` run tunes its block while it goes (runtime::tuner): the rounds propose several block
/// sizes, and the greedy stream and final state still equal the sequential run's. A sampled run keeps
/// its block (its seeded draws depend on the rounds).
fn tuned_runs(name: &str) {
    let (_, model) = fixture(name);
    for salt in 0..2u32 {
        let p = prompt(&model, 6 + 5 * salt as usize, salt);
        let case = Case {
            prompt: p.clone(),
            max_tokens: 48,
            stop: vec![],
            eos: vec![],
            cancel_after: None,
        };
        let (want, want_state, _) = run(&model, &case, None);
        for error_rate in [0.0, 0.3] {
            let mut full = p.clone();
            full.extend_from_slice(&want.token_ids);
            let oracle = Oracle {
                full,
                error_rate,
                vocab: model.vocab as u32,
                calls: 0,
            };
            let (got, state, stream) = run(&model, &case, Some((Speculative::tuned(2, 8), oracle)));
            let label = format!("{name} salt {salt} err {error_rate}");
            assert_eq!(got.token_ids, want.token_ids, "{label}");
            assert_eq!(stream, got.text, "{label}: deltas");
            assert!(state.bitwise_eq(&want_state), "{label}: state");
            let s = got.spec.as_ref().unwrap();
            // Started at 2: a round of 3 or more proposals was the tuner's.
            assert!(
                s.rounds_by_block.len() > 3,
                "{label}: never tuned: {:?}",
                s.rounds_by_block
            );
        }
    }
    // Sampled: the block stays (only the last rounds, with room for fewer tokens, propose fewer).
    let (_, model) = fixture(name);
    let p = prompt(&model, 9, 7);
    let d = detok(model.vocab as u32);
    // Proposals to judge: the prompt then arbitrary tokens (the oracle drafts from `full`).
    let mut full = p.clone();
    full.extend((0..64).map(|i| (i * 7 + 3) % model.vocab as u32));
    let mut session = Session::new(&model).with_drafter(Box::new(Oracle {
        full,
        error_rate: 0.5,
        vocab: model.vocab as u32,
        calls: 0,
    }));
    let mut cfg = GenerationConfig::greedy(40);
    cfg.shaping.temperature = 0.8;
    cfg.seed = 11;
    let req = Request {
        prompt: &p,
        config: &cfg,
        eos: &[],
        detok: &d,
        speculative: Some(Speculative::tuned(3, 8)),
        cancel: CancelFlag::new(),
    };
    let r = generate(&model, &mut session, &req, &mut |_| {}).unwrap();
    let s = r.spec.unwrap();
    assert!(s.rounds_by_block.len() <= 4, "{:?}", s.rounds_by_block);
    assert!(
        s.rounds_by_block[3] + 2 >= s.rounds,
        "{:?}",
        s.rounds_by_block
    );
}

/// A session's tuner carries over: the second greedy `auto` generation continues the first one's
/// tuning (its round count grows on), keeps the greedy stream, and a new drafter starts afresh.
#[test]
fn a_session_continues_its_tuning() {
    let (_, model) = fixture("qwen3");
    let d = detok(model.vocab as u32);
    let p = prompt(&model, 7, 3);
    let case = Case {
        prompt: p.clone(),
        max_tokens: 40,
        stop: vec![],
        eos: vec![],
        cancel_after: None,
    };
    let (want, _, _) = run(&model, &case, None);
    let mut full = p.clone();
    full.extend_from_slice(&want.token_ids);
    let oracle = || Oracle {
        full: full.clone(),
        error_rate: 0.1,
        vocab: model.vocab as u32,
        calls: 0,
    };
    let mut session = Session::new(&model).with_drafter(Box::new(oracle()));
    let generate_from = |session: &mut Session, prompt: &[u32], n: usize| {
        let cfg = GenerationConfig::greedy(n);
        let req = Request {
            prompt,
            config: &cfg,
            eos: &[],
            detok: &d,
            speculative: Some(Speculative::tuned(2, 8)),
            cancel: CancelFlag::new(),
        };
        generate(&model, session, &req, &mut |_| {}).unwrap()
    };
    let first = generate_from(&mut session, &p, 20);
    assert_eq!(first.token_ids, want.token_ids[..20]);
    let after_first = session
        .block_tuner()
        .expect("a greedy auto run keeps its tuner")
        .rounds();
    assert!(after_first > 0);
    let mut turn = p.clone();
    turn.extend_from_slice(&first.token_ids);
    let second = generate_from(&mut session, &turn, 20);
    assert_eq!(second.token_ids, want.token_ids[20..40]);
    let after_second = session.block_tuner().unwrap().rounds();
    assert!(
        after_second > after_first,
        "not continued: {after_first} then {after_second} rounds"
    );
    let session = session.with_drafter(Box::new(oracle()));
    assert!(
        session.block_tuner().is_none(),
        "a new drafter keeps the old figures"
    );
}

#[test]
fn tuned_blocks_keep_the_greedy_stream() {
    tuned_runs("qwen3_5");
    tuned_runs("qwen3");
}
