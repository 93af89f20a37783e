//! `Wanted::argmax_only` through the decode loop: the loop asks for ids only when the request's shaping
//! is a plain argmax (greedy, no penalty), and a backend that then answers with ids alone (as the CUDA
//! backend does, 8 bytes per row instead of the logits) yields the stream the logits would have given —
//! sequential and speculative, for every verify row.

mod common;

use std::cell::Cell;

use common::{detok, fixture, prompt, Oracle};
use families::{Backend, BackendError, ForwardOut, State, Transformer, Wanted};
use runtime::{generate, CancelFlag, GenerationConfig, Request, Session, Speculative};
use sampling::Shaping;

/// The CPU engine, answering `argmax_only` forwards with ids alone; counts the forwards that returned
/// rows, by how they were asked.
struct IdsOnly<'a> {
    inner: &'a Transformer,
    asked_ids: Cell<usize>,
    asked_logits: Cell<usize>,
}

impl Backend for IdsOnly<'_> {
    type State = State;
    delegate_to_inner!();

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        let mut out = Backend::forward(self.inner, tokens, start, state, wanted)?;
        if out.rows > 0 {
            if wanted.argmax_only {
                self.asked_ids.set(self.asked_ids.get() + 1);
                let ids = (0..out.rows)
                    .map(|r| sampling::greedy(out.row(r)).unwrap())
                    .collect();
                out.argmax = Some(ids);
                out.logits.clear();
            } else {
                self.asked_logits.set(self.asked_logits.get() + 1);
            }
        }
        Ok(out)
    }
}

fn run<B: Backend<State = State>>(
    model: &B,
    shaping: Shaping,
    spec: Option<Oracle>,
    prompt: &[u32],
) -> Vec<u32> {
    let d = detok(model.vocab() as u32);
    let mut session = Session::open(model).unwrap();
    let speculative = spec.as_ref().map(|_| Speculative::new(3));
    if let Some(oracle) = spec {
        session = session.with_drafter(Box::new(oracle));
    }
    let cfg = GenerationConfig {
        shaping,
        seed: 5,
        ..GenerationConfig::greedy(24)
    };
    let req = Request {
        prompt,
        config: &cfg,
        eos: &[],
        detok: &d,
        speculative,
        cancel: CancelFlag::new(),
    };
    generate(model, &mut session, &req, &mut |_| {})
        .unwrap()
        .token_ids
}

#[test]
fn greedy_streams_from_ids_equal_streams_from_logits() {
    let (_, model) = fixture("qwen3_5");
    let ids_only = IdsOnly {
        inner: &model,
        asked_ids: Cell::new(0),
        asked_logits: Cell::new(0),
    };
    let p = prompt(&model, 12, 3);
    let want = run(&*model, Shaping::greedy(), None, &p);
    assert_eq!(
        run(&ids_only, Shaping::greedy(), None, &p),
        want,
        "sequential"
    );
    let oracle = || Oracle {
        full: [p.clone(), want.clone()].concat(),
        error_rate: 0.3,
        vocab: model.vocab as u32,
        calls: 0,
    };
    assert_eq!(
        run(&ids_only, Shaping::greedy(), Some(oracle()), &p),
        want,
        "speculative"
    );
    assert!(
        ids_only.asked_ids.get() > 0 && ids_only.asked_logits.get() == 0,
        "greedy asks for ids"
    );

    // Sampled, or greedy with a penalty: the loop needs the logits, and asks for them.
    let sampled = Shaping {
        temperature: 0.8,
        ..Shaping::default()
    };
    let penalised = Shaping {
        repetition_penalty: 1.3,
        ..Shaping::greedy()
    };
    for shaping in [sampled, penalised] {
        let before = ids_only.asked_ids.get();
        assert_eq!(
            run(&ids_only, shaping, None, &p),
            run(&*model, shaping, None, &p)
        );
        assert_eq!(
            ids_only.asked_ids.get(),
            before,
            "{shaping:?} asked for ids only"
        );
    }
}
