//! Temperature 0: the speculative stream equals the sequential stream token for token, and the state it
//! leaves behind is bit-identical, for both rollback kinds, over prompts × blocks 1..8 × stop strings × max
//! tokens × drafter error rates — every branch of a round: all accepted, first rejected, stop token inside an
//! accepted run, stop string across the bonus token, max tokens mid-round, cancellation mid-round. The
//! same cases run with the weight-free drafters, prompt lookup (`drafters::NgramDrafter`) and the suffix
//! drafter (`drafters::SuffixDrafter`): no taps, rounds without a match are plain steps, fixed and tuned
//! blocks, on prompts that repeat themselves so that they are accepted.

mod common;

use common::{detok, fixture, prompt, Oracle};
use drafters::{Drafter, MtpHead, MtpOrSuffix, NgramDrafter, SuffixDrafter};
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
    let spec = spec.map(|(s, o)| (s, Box::new(o) as Box<dyn Drafter + Send>));
    run_with(model, case, spec)
}

fn run_with(
    model: &families::Transformer,
    case: &Case,
    spec: Option<(Speculative, Box<dyn Drafter + Send>)>,
) -> (runtime::GenerationResult, families::State, String) {
    let d = detok(model.vocab as u32);
    let mut session = Session::new(model);
    let speculative = spec.as_ref().map(|(s, _)| *s);
    if let Some((_, drafter)) = spec {
        session = session.with_drafter(drafter);
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
        for case in &variants(&base, &seq) {
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

/// `base` (whose sequential run is `seq`) with each way a generation ends: max tokens (40, 7), a stop
/// token, stop strings, cancellation.
fn variants(base: &Case, seq: &runtime::GenerationResult) -> Vec<Case> {
    let (ids, text) = (&seq.token_ids, &seq.text);
    vec![
        Case {
            max_tokens: 40,
            ..base_clone(base)
        },
        Case {
            max_tokens: 7,
            ..base_clone(base)
        },
        Case {
            eos: vec![ids[9]],
            ..base_clone(base)
        },
        Case {
            stop: vec![chars(text, 11, 15)],
            ..base_clone(base)
        },
        Case {
            stop: vec![chars(text, 20, 23), "zzzz".into()],
            max_tokens: 30,
            ..base_clone(base)
        },
        Case {
            cancel_after: Some(6),
            ..base_clone(base)
        },
    ]
}

/// A weight-free drafter (`make`) over the same cases: fixed blocks 1..8 with both rollbacks, and
/// tuned blocks, on prompts that repeat a phrase (so the drafter finds matches in the prompt and in the
/// output) and on one that does not. Its proposals must be accepted somewhere, and rejected somewhere.
/// Returns the drafters that proposed (`Drafter::proposer`: two for `auto`'s mix).
fn check_weight_free(
    name: &str,
    make: &dyn Fn() -> Box<dyn Drafter + Send>,
) -> std::collections::BTreeSet<&'static str> {
    let drafter_name = make().name();
    let mut proposers = std::collections::BTreeSet::new();
    let (_, model) = fixture(name);
    let (mut proposed, mut accepted, mut rejected_rounds, mut cases) = (0, 0, 0, 0);
    for salt in 0..3u32 {
        let phrase = prompt(&model, 4 + 3 * salt as usize, salt);
        // The phrase, something else, the phrase again: salt 0 without the repeat.
        let mut p = phrase.clone();
        if salt > 0 {
            p.extend(prompt(&model, 3, 100 + salt));
            p.extend_from_slice(&phrase);
        }
        let base = Case {
            prompt: p,
            max_tokens: 40,
            stop: vec![],
            eos: vec![],
            cancel_after: None,
        };
        let (seq, _, _) = run(&model, &base, None);
        for case in &variants(&base, &seq) {
            let (want, want_state, _) = run(&model, case, None);
            let mut specs: Vec<Speculative> = (1..=8)
                .flat_map(|block| {
                    [Rollback::Tape, Rollback::Snapshot].map(|rollback| Speculative {
                        rollback,
                        ..Speculative::new(block)
                    })
                })
                .collect();
            specs.push(Speculative::tuned(4, 16));
            specs.push(Speculative::new(16));
            for spec in specs {
                let (got, state, stream) = run_with(&model, case, Some((spec, make())));
                let label = format!(
                    "{name} {drafter_name} salt {salt} {spec:?} max {} stop {:?} eos {:?} cancel {:?}",
                    case.max_tokens, case.stop, case.eos, case.cancel_after
                );
                assert_eq!(got.token_ids, want.token_ids, "{label}");
                assert_eq!(got.reason, want.reason, "{label}");
                assert_eq!(got.text, want.text, "{label}");
                assert_eq!(stream, got.text, "{label}: deltas");
                assert!(
                    state.bitwise_eq(&want_state),
                    "{label}: state differs from the sequential run's"
                );
                let s = got.spec.as_ref().unwrap();
                proposed += s.proposed;
                accepted += s.accepted;
                rejected_rounds += s.rollbacks;
                proposers.extend(s.by_drafter.iter().map(|d| d.drafter));
                cases += 1;
            }
        }
    }
    println!("{name}: {cases} {drafter_name} cases, {accepted}/{proposed} proposals accepted, {rejected_rounds} rounds rolled back");
    assert!(
        accepted > 0 && rejected_rounds > 0,
        "{name}: {drafter_name} proposals: {accepted} of {proposed} accepted, {rejected_rounds} rounds rolled back"
    );
    proposers
}

fn ngram() -> Box<dyn Drafter + Send> {
    Box::new(NgramDrafter::new())
}

fn suffix() -> Box<dyn Drafter + Send> {
    Box::new(SuffixDrafter::new())
}

/// A session speculating with a weight-free drafter keeps its drafter's position with the state (the
/// loop has it observe the committed rows although it asks for no taps), so a next turn that extends
/// the conversation reuses the covered prefix, and both turns keep the greedy stream.
fn session_reuses_its_prefix(name: &str, make: &dyn Fn() -> Box<dyn Drafter + Send>) {
    let (_, model) = fixture(name);
    let d = detok(model.vocab as u32);
    let phrase = prompt(&model, 6, 9);
    let p = [&phrase[..], &prompt(&model, 2, 10), &phrase[..]].concat();
    let generate_from = |session: &mut Session, prompt: &[u32], speculative| {
        let cfg = GenerationConfig::greedy(20);
        let req = Request {
            prompt,
            config: &cfg,
            eos: &[],
            detok: &d,
            speculative,
            cancel: CancelFlag::new(),
        };
        generate(&*model, session, &req, &mut |_| {}).unwrap()
    };
    let mut session = Session::new(&model).with_drafter(make());
    let first = generate_from(&mut session, &p, Some(Speculative::new(3)));
    let turn = [&p[..], &first.token_ids, &phrase[..3]].concat();
    let second = generate_from(&mut session, &turn, Some(Speculative::new(3)));
    assert!(
        second.reused_tokens >= p.len() + first.token_ids.len() - 1,
        "{name}: reused {} of {} tokens",
        second.reused_tokens,
        turn.len()
    );
    let mut plain = Session::new(&model);
    assert_eq!(
        first.token_ids,
        generate_from(&mut plain, &p, None).token_ids,
        "{name}"
    );
    let mut plain = Session::new(&model);
    assert_eq!(
        second.token_ids,
        generate_from(&mut plain, &turn, None).token_ids,
        "{name}"
    );
}

#[test]
fn an_ngram_session_reuses_its_prefix() {
    session_reuses_its_prefix("qwen3", &ngram);
    session_reuses_its_prefix("qwen3_5", &ngram);
}

#[test]
fn a_suffix_session_reuses_its_prefix() {
    session_reuses_its_prefix("qwen3", &suffix);
    session_reuses_its_prefix("qwen3_5", &suffix);
}

#[test]
fn greedy_ngram_equals_sequential_hybrid() {
    check_weight_free("qwen3_5", &ngram);
}

#[test]
fn greedy_ngram_equals_sequential_dense() {
    check_weight_free("qwen3", &ngram);
}

#[test]
fn greedy_suffix_equals_sequential_hybrid() {
    check_weight_free("qwen3_5", &suffix);
}

#[test]
fn greedy_suffix_equals_sequential_dense() {
    check_weight_free("qwen3", &suffix);
}

/// Qwen3-MoE: the verify block routes each row to its own experts; the stream stays sequential's.
#[test]
fn greedy_ngram_equals_sequential_qwen3_moe() {
    check_weight_free("qwen3_moe", &ngram);
}

#[test]
fn greedy_suffix_equals_sequential_qwen3_moe() {
    check_weight_free("qwen3_moe", &suffix);
}

/// `auto`'s per-round mix of the MTP head and the suffix drafter (`MtpOrSuffix`) over the same cases:
/// the stream stays sequential's, and both drafters have proposals judged.
#[test]
fn greedy_mtp_suffix_mix_equals_sequential_hybrid() {
    let (ck, model) = fixture("qwen3_5");
    let head: families::SharedHead = model.clone();
    let mix = || -> Box<dyn Drafter + Send> {
        let mtp = MtpHead::load(&ck, head.clone()).unwrap().unwrap();
        Box::new(MtpOrSuffix::new(Box::new(mtp), SuffixDrafter::new()))
    };
    let proposers = check_weight_free("qwen3_5", &mix);
    assert!(
        proposers.contains("mtp") && proposers.contains("suffix"),
        "{proposers:?}"
    );
}

/// The suffix drafter remembers a session's earlier request: asked the same prompt again after the
/// session forgot the sequence (nothing reused, the prompt prefilled afresh), it proposes the earlier
/// output, which the greedy stream repeats, so nearly every proposal is accepted; told to forget
/// earlier requests first, it has only the prompt to copy from.
fn suffix_session_remembers_earlier_requests(name: &str) {
    let (_, model) = fixture(name);
    let d = detok(model.vocab as u32);
    let generate_from = |session: &mut Session, prompt: &[u32], speculative| {
        let cfg = GenerationConfig::greedy(24);
        let req = Request {
            prompt,
            config: &cfg,
            eos: &[],
            detok: &d,
            speculative,
            cancel: CancelFlag::new(),
        };
        generate(&*model, session, &req, &mut |_| {}).unwrap()
    };
    let p = prompt(&model, 8, 21);
    let want = generate_from(&mut Session::new(&model), &p, None).token_ids;
    let accepted = |forget: bool| {
        let spec = Some(Speculative::new(8));
        let mut session = Session::new(&model).with_drafter(suffix());
        assert_eq!(generate_from(&mut session, &p, spec).token_ids, want);
        if forget {
            session.forget_earlier_requests();
        }
        session.reset_all().unwrap();
        let again = generate_from(&mut session, &p, spec);
        assert_eq!(again.reused_tokens, 0, "{name}: the sequence was forgotten");
        assert_eq!(again.token_ids, want, "{name} forget {forget}");
        again.spec.unwrap().accepted
    };
    let (remembered, forgotten) = (accepted(false), accepted(true));
    assert!(
        remembered >= want.len() - 4 && forgotten < remembered / 2,
        "{name}: {remembered} proposals accepted with memory, {forgotten} without"
    );
}

#[test]
fn a_suffix_session_remembers_earlier_requests_until_told_to_forget() {
    suffix_session_remembers_earlier_requests("qwen3");
    suffix_session_remembers_earlier_requests("qwen3_5");
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

#[test]
fn greedy_speculative_equals_sequential_qwen3_moe() {
    check_model("qwen3_moe", 200);
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
