//! The decode loop prefills in the backend's own chunk (`Backend::prefill_chunk`: the CPU engine's 256,
//! the CUDA backend's pass size): a backend that says 5 receives the prompt in forwards of at most 5 rows
//! — a hybrid's last prompt token alone, after its fork point — and the generation is the one the default
//! chunk gives.

mod common;

use std::cell::RefCell;

use common::{detok, fixture, prompt};
use families::{Backend, BackendError, ForwardOut, State, Transformer, Wanted};
use runtime::{generate, CancelFlag, GenerationConfig, Request, Session};

/// The CPU engine with a chosen prefill chunk, recording every forward's row count.
struct Chunked<'a> {
    inner: &'a Transformer,
    chunk: usize,
    forwards: RefCell<Vec<usize>>,
}

impl Backend for Chunked<'_> {
    type State = State;
    delegate_to_inner!();

    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        state: &mut State,
        wanted: &Wanted,
    ) -> Result<ForwardOut, BackendError> {
        self.forwards.borrow_mut().push(tokens.len());
        Backend::forward(self.inner, tokens, start, state, wanted)
    }
    fn prefill_chunk(&self) -> usize {
        self.chunk
    }
}

/// Greedy tokens of `prompt` on `model` (its forwards are recorded in `model.forwards`).
fn run(model: &Chunked<'_>, prompt: &[u32]) -> Vec<u32> {
    let d = detok(model.vocab() as u32);
    let mut session = Session::open(model).unwrap();
    let config = GenerationConfig::greedy(6);
    let request = Request {
        prompt,
        config: &config,
        eos: &[],
        detok: &d,
        speculative: None,
        cancel: CancelFlag::new(),
    };
    generate(model, &mut session, &request, &mut |_| {})
        .unwrap()
        .token_ids
}

#[test]
fn prefill_runs_in_the_backends_chunks() {
    for (name, recurrent) in [("qwen3", false), ("qwen3_5", true)] {
        let (_, m) = fixture(name);
        let p = prompt(&m, 23, 5);
        let chunked = |chunk| Chunked {
            inner: &m,
            chunk,
            forwards: RefCell::new(Vec::new()),
        };
        let five = chunked(5);
        let tokens = run(&five, &p);
        let prefill: Vec<usize> = five.forwards.borrow()[..if recurrent { 6 } else { 5 }].to_vec();
        // 23 tokens: 5, 5, 5, 5, 3; a hybrid keeps its fork point before the last token: ..., 2, 1.
        let want = if recurrent {
            vec![5, 5, 5, 5, 2, 1]
        } else {
            vec![5, 5, 5, 5, 3]
        };
        assert_eq!(prefill, want, "{name}");
        let default = chunked(families::PREFILL_CHUNK);
        assert_eq!(
            run(&default, &p),
            tokens,
            "{name}: the chunk changes no token"
        );
        let whole = if recurrent { vec![22, 1] } else { vec![23] };
        assert_eq!(
            default.forwards.borrow()[..whole.len()],
            whole[..],
            "{name}"
        );
    }
}
