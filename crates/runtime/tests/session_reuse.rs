//! A session reuses what its state covers: a second chat turn that extends the first prefills only the new
//! tokens and continues exactly as a fresh session given the whole conversation would.

mod common;

use common::{detok, fixture, prompt};
use runtime::{generate, CancelFlag, GenerationConfig, GenerationResult, Request, Session};

fn turn(model: &families::Transformer, session: &mut Session, p: &[u32]) -> GenerationResult {
    let d = detok(model.vocab as u32);
    let cfg = GenerationConfig::greedy(12);
    let req = Request {
        prompt: p,
        config: &cfg,
        eos: &[],
        detok: &d,
        speculative: None,
        cancel: CancelFlag::new(),
    };
    generate(model, session, &req, &mut |_| {}).unwrap()
}

fn check(name: &str) {
    let (_, model) = fixture(name);
    let first = prompt(&model, 40, 1);
    let mut session = Session::new(&model);
    let r1 = turn(&model, &mut session, &first);
    assert_eq!(r1.reused_tokens, 0);
    // Turn 2: the conversation so far (prompt + reply) plus a new user message.
    let mut second = first.clone();
    second.extend_from_slice(&r1.token_ids);
    second.extend_from_slice(&prompt(&model, 9, 7));
    let r2 = turn(&model, &mut session, &second);
    assert_eq!(
        r2.reused_tokens,
        first.len() + r1.token_ids.len() - 1,
        "{name}: the whole first turn is reused"
    );
    let fresh = turn(&model, &mut Session::new(&model), &second);
    assert_eq!(fresh.reused_tokens, 0);
    assert_eq!(
        r2.token_ids, fresh.token_ids,
        "{name}: reused session continues like a fresh one"
    );
    // Regenerating the same prompt reuses all but its last token (hybrids through the fork checkpoint).
    let r3 = turn(&model, &mut session, &second);
    assert_eq!(r3.reused_tokens, second.len() - 1, "{name}: regenerate");
    assert_eq!(r3.token_ids, fresh.token_ids);
    // A prompt that diverges: dense models reuse the common prefix; hybrids keep only the fork point.
    let mut diverged = second[..30].to_vec();
    diverged.extend_from_slice(&prompt(&model, 5, 11));
    let r4 = turn(&model, &mut session, &diverged);
    let fresh4 = turn(&model, &mut Session::new(&model), &diverged);
    assert_eq!(r4.token_ids, fresh4.token_ids, "{name}: diverged prompt");
    if model.is_hybrid() {
        assert_eq!(r4.reused_tokens, 0);
    } else {
        assert_eq!(r4.reused_tokens, 30);
    }
}

#[test]
fn second_turn_reuses_first_dense() {
    check("qwen3");
}

#[test]
fn second_turn_reuses_first_hybrid() {
    check("qwen3_5");
}
