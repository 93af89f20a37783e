//! `GenerationConfig::logprobs` through the decode loop. Each generated token's entry must be ln softmax of
//! the logits that judged it: the reference is a fresh forward of prompt + the tokens before it (the model's
//! last row), normalised in f64 here. Speculative greedy runs (an oracle drafter that errs, so tokens come
//! from accepted, replacement and bonus rows) must report the sequential run's entries bit for bit, and a
//! backend that would answer argmax-only must be asked for whole rows.

mod common;

use std::cell::Cell;

use common::{detok, fixture, prompt, Oracle};
use families::{Backend, BackendError, ForwardOut, State, Transformer, Wanted};
use runtime::{
    generate, CancelFlag, Event, GenerationConfig, GenerationResult, Request, Session, Speculative,
};
use sampling::Shaping;

fn run<B: Backend<State = State>>(
    model: &B,
    shaping: Shaping,
    spec: Option<Oracle>,
    p: &[u32],
    logprobs: Option<usize>,
) -> (GenerationResult, Vec<runtime::TokenLogprob>) {
    let d = detok(model.vocab() as u32);
    let mut session = Session::open(model).unwrap();
    let speculative = spec.as_ref().map(|_| Speculative::new(3));
    if let Some(oracle) = spec {
        session = session.with_drafter(Box::new(oracle));
    }
    let cfg = GenerationConfig {
        shaping,
        seed: 11,
        logprobs,
        ..GenerationConfig::greedy(20)
    };
    let req = Request {
        prompt: p,
        config: &cfg,
        eos: &[],
        detok: &d,
        speculative,
        cancel: CancelFlag::new(),
    };
    let mut streamed = Vec::new();
    let result = generate(model, &mut session, &req, &mut |e| {
        if let Event::Logprob(l) = e {
            streamed.push(l.clone());
        }
    })
    .unwrap();
    (result, streamed)
}

/// ln softmax of the last row of a fresh forward over `tokens`.
fn reference(model: &Transformer, tokens: &[u32]) -> Vec<f64> {
    let mut state = Backend::new_state(model).unwrap();
    let out = Backend::forward(model, tokens, 0, &mut state, &Wanted::last()).unwrap();
    let row: Vec<f64> = out.row(0).iter().map(|&z| f64::from(z)).collect();
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let norm = max + row.iter().map(|z| (z - max).exp()).sum::<f64>().ln();
    row.iter().map(|z| z - norm).collect()
}

fn check_against_reference(model: &Transformer, p: &[u32], result: &GenerationResult, top: usize) {
    assert_eq!(result.logprobs.len(), result.token_ids.len());
    for (i, entry) in result.logprobs.iter().enumerate() {
        assert_eq!(entry.token, result.token_ids[i]);
        let want = reference(model, &[p, &result.token_ids[..i]].concat());
        let t = entry.token as usize;
        assert!(
            (f64::from(entry.logprob) - want[t]).abs() < 1e-4,
            "token {i}: {} against {}",
            entry.logprob,
            want[t]
        );
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by(|a, b| want[*b].total_cmp(&want[*a]).then(a.cmp(b)));
        let ids: Vec<usize> = entry.top.iter().map(|(id, _)| *id as usize).collect();
        assert_eq!(ids, order[..top], "token {i}'s top {top}");
        for (id, lp) in &entry.top {
            assert!((f64::from(*lp) - want[*id as usize]).abs() < 1e-4);
        }
    }
}

#[test]
fn greedy_entries_are_the_rows_log_softmax_and_speculation_reports_the_same_bits() {
    for name in ["qwen3", "qwen3_5"] {
        let (_, model) = fixture(name);
        let p = prompt(&model, 10, 5);
        let (seq, streamed) = run(&*model, Shaping::greedy(), None, &p, Some(5));
        // Greedy: every token is its row's most likely one.
        for e in &seq.logprobs {
            assert_eq!(e.top[0].0, e.token, "{name}");
        }
        assert_eq!(
            streamed, seq.logprobs,
            "{name}: streamed entries == the result's"
        );
        check_against_reference(&model, &p, &seq, 5);
        let (plain, _) = run(&*model, Shaping::greedy(), None, &p, None);
        assert_eq!(
            plain.token_ids, seq.token_ids,
            "{name}: asking changes no token"
        );
        assert!(plain.logprobs.is_empty());
        let oracle = Oracle {
            full: [p.clone(), seq.token_ids.clone()].concat(),
            error_rate: 0.3,
            vocab: model.vocab as u32,
            calls: 0,
        };
        let (spec, _) = run(&*model, Shaping::greedy(), Some(oracle), &p, Some(5));
        assert_eq!(spec.token_ids, seq.token_ids, "{name}");
        assert_eq!(
            spec.logprobs, seq.logprobs,
            "{name}: speculative == sequential"
        );
        let s = spec.spec.as_ref().unwrap();
        assert!(s.accepted > 0 && s.rollbacks > 0, "{name}: {s}");
    }
}

#[test]
fn sampled_entries_are_the_raw_rows_log_softmax() {
    let (_, model) = fixture("qwen3_5");
    let p = prompt(&model, 8, 9);
    let shaping = Shaping {
        temperature: 0.7,
        top_k: 4,
        repetition_penalty: 1.3,
        ..Shaping::greedy()
    };
    let (result, _) = run(&*model, shaping, None, &p, Some(0));
    assert!(result.logprobs.iter().all(|e| e.top.is_empty()));
    check_against_reference(&model, &p, &result, 0);
}

/// The CPU engine counting how forwards were asked.
struct Counting<'a> {
    inner: &'a Transformer,
    argmax_only: Cell<usize>,
}

impl Backend for Counting<'_> {
    type State = State;
    delegate_to_inner!();

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        if wanted.argmax_only || wanted.candidates > 0 {
            self.argmax_only.set(self.argmax_only.get() + 1);
        }
        Backend::forward(self.inner, tokens, start, state, wanted)
    }
}

#[test]
fn asking_for_logprobs_asks_the_backend_for_whole_rows() {
    let (_, model) = fixture("qwen3");
    let counting = Counting {
        inner: &model,
        argmax_only: Cell::new(0),
    };
    let p = prompt(&model, 6, 1);
    run(&counting, Shaping::greedy(), None, &p, None);
    assert!(
        counting.argmax_only.get() > 0,
        "greedy runs ask for ids alone"
    );
    counting.argmax_only.set(0);
    let (r, _) = run(&counting, Shaping::greedy(), None, &p, Some(2));
    assert_eq!(counting.argmax_only.get(), 0);
    assert_eq!(r.logprobs.len(), r.token_ids.len());
}

#[test]
fn prompt_entries_are_the_rows_log_softmax_and_match_the_generations() {
    let (_, model) = fixture("qwen3_5");
    let p = prompt(&model, 9, 4);
    let (gen, _) = run(&*model, Shaping::greedy(), None, &p, Some(3));
    // Scoring the prompt followed by its greedy continuation (150 rows: several chunks).
    let long: Vec<u32> = [p.clone(), gen.token_ids.clone()].concat().repeat(8);
    let cancel = CancelFlag::new();
    let entries = runtime::prompt_logprobs(&*model, &long, 3, &cancel)
        .unwrap()
        .unwrap();
    assert_eq!(entries.len(), long.len() - 1);
    for (i, e) in entries.iter().enumerate().step_by(37) {
        assert_eq!(e.token, long[i + 1]);
        let want = reference(&model, &long[..=i]);
        assert!(
            (f64::from(e.logprob) - want[e.token as usize]).abs() < 1e-4,
            "row {i}"
        );
    }
    // The rows that judged the generated tokens judge them alike when scored (to rounding: a prefill
    // pass runs the hybrid's GDN layers in their chunked form, decode in the step form).
    for (i, g) in gen.logprobs.iter().enumerate() {
        let e = &entries[p.len() - 1 + i];
        assert_eq!(e.token, g.token);
        assert!(
            (e.logprob - g.logprob).abs() < 1e-4,
            "token {i}: {e:?} vs {g:?}"
        );
        let ids = |x: &runtime::TokenLogprob| x.top.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(e), ids(g), "token {i}");
    }
    cancel.cancel();
    assert!(runtime::prompt_logprobs(&*model, &long, 3, &cancel)
        .unwrap()
        .is_none());
}
