//! The exact acceptance rule: residuals and verdicts by hand, then distribution tests proving that
//! speculative sampling (draw x ~ q, `verify_step`, residual on rejection) yields samples
//! distributed as the target p — and negative controls proving those tests catch wrong rules.

mod common;

use common::{assert_distributed_as, chi_square};
use sampling::{
    accept, residual, residual_point_mass, verify_step, Draft, DrawCounter, History, SamplingError,
    ShapedDistribution, Shaping, Verdict,
};

const TRIALS: usize = 200_000;

fn probs(d: &ShapedDistribution) -> Vec<f64> {
    (0..d.vocab_size() as u32)
        .map(|t| d.probability(t))
        .collect()
}

fn assert_probs_close(actual: &[f64], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len());
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() < 1e-12, "{actual:?} != {expected:?}");
    }
}

#[test]
fn accept_is_r_times_q_at_most_p() {
    assert!(accept(0.2, 0.4, 0.49), "0.49 * 0.4 = 0.196 <= 0.2");
    assert!(
        accept(0.2, 0.4, 0.5),
        "0.5 * 0.4 = 0.2 <= 0.2 (boundary accepts)"
    );
    assert!(!accept(0.2, 0.4, 0.51), "0.51 * 0.4 = 0.204 > 0.2");
    assert!(accept(0.6, 0.3, 0.9999), "p >= q always accepts");
    assert!(
        !accept(0.0, 1.0, 0.0),
        "p(x) = 0 never accepts, even at r = 0"
    );
}

#[test]
fn residual_by_hand() {
    // p = [0.5, 0.3, 0.2, 0], q = [0.2, 0.5, 0.1, 0.2]
    // max(p - q, 0) = [0.3, 0, 0.1, 0], mass 0.4 -> [0.75, 0, 0.25, 0]
    let p = ShapedDistribution::from_probs(&[0.5, 0.3, 0.2, 0.0]).unwrap();
    let q = ShapedDistribution::from_probs(&[0.2, 0.5, 0.1, 0.2]).unwrap();
    let res = residual(&p, &q).unwrap();
    assert_probs_close(&probs(&res), &[0.75, 0.0, 0.25, 0.0]);
    assert!(residual(&p, &p).is_none(), "p = q: no residual mass");
    // Target point mass at 0 (greedy): max(δ_0 - q, 0) = 0.8 at token 0 -> δ_0.
    let greedy = ShapedDistribution::point_mass(0, 4).unwrap();
    assert_eq!(residual(&greedy, &q).unwrap().as_point_mass(), Some(0));
    assert!(residual(&greedy, &greedy).is_none());
}

#[test]
fn point_mass_residual_by_hand() {
    // p = [0.5, 0.3, 0.2] without token 0 -> [0, 0.3, 0.2] / 0.5 = [0, 0.6, 0.4]
    let p = ShapedDistribution::from_probs(&[0.5, 0.3, 0.2]).unwrap();
    assert_probs_close(
        &probs(&residual_point_mass(&p, 0).unwrap()),
        &[0.0, 0.6, 0.4],
    );
    // It is the general residual against a point-mass q.
    let delta = ShapedDistribution::point_mass(0, 3).unwrap();
    assert_probs_close(&probs(&residual(&p, &delta).unwrap()), &[0.0, 0.6, 0.4]);
    // A token outside p's support removes nothing.
    assert_probs_close(
        &probs(&residual_point_mass(&p, 9).unwrap()),
        &[0.5, 0.3, 0.2],
    );
    let greedy = ShapedDistribution::point_mass(1, 3).unwrap();
    assert!(residual_point_mass(&greedy, 1).is_none());
    assert_eq!(
        residual_point_mass(&greedy, 2).unwrap().as_point_mass(),
        Some(1)
    );
}

#[test]
fn greedy_target_accepts_iff_proposal_is_argmax() {
    // Temperature 0: p = δ_a. Accepted iff x = a, recovered token = a, whatever the uniforms.
    let logits = [0.1, 0.9, 0.4];
    let p = ShapedDistribution::new(&logits, &Shaping::greedy(), History::empty()).unwrap();
    let q = ShapedDistribution::from_probs(&[0.3, 0.3, 0.4]).unwrap();
    for r in [0.0, 0.5, 0.9999] {
        for draft in [Draft::PointMass, Draft::Distribution(&q)] {
            assert_eq!(verify_step(&p, draft, 1, r, 0.3), Ok(Verdict::Accepted));
            for x in [0, 2] {
                assert_eq!(
                    verify_step(&p, draft, x, r, 0.3),
                    Ok(Verdict::Rejected { replacement: 1 })
                );
            }
        }
    }
}

#[test]
fn sampled_verdict_by_hand() {
    // p = [0.5, 0.3, 0.2], q = [0.2, 0.6, 0.2], x = 1: accept iff r * 0.6 <= 0.3, i.e. r <= 0.5.
    // Residual max(p - q, 0) = [0.3, 0, 0] -> δ_0.
    let p = ShapedDistribution::from_probs(&[0.5, 0.3, 0.2]).unwrap();
    let q = ShapedDistribution::from_probs(&[0.2, 0.6, 0.2]).unwrap();
    let q = Draft::Distribution(&q);
    assert_eq!(verify_step(&p, q, 1, 0.5, 0.9), Ok(Verdict::Accepted));
    assert_eq!(
        verify_step(&p, q, 1, 0.51, 0.9),
        Ok(Verdict::Rejected { replacement: 0 })
    );
    // Point-mass draft of x = 1: accept iff r <= 0.3; residual [0.5, 0, 0.2] / 0.7, and
    // u = 0.8 lands past 0.5 / 0.7 = 0.714 -> token 2.
    assert_eq!(
        verify_step(&p, Draft::PointMass, 1, 0.3, 0.8),
        Ok(Verdict::Accepted)
    );
    assert_eq!(
        verify_step(&p, Draft::PointMass, 1, 0.31, 0.8),
        Ok(Verdict::Rejected { replacement: 2 })
    );
}

#[test]
fn proposal_outside_its_draft_distribution_is_an_error() {
    let p = ShapedDistribution::from_probs(&[0.5, 0.5]).unwrap();
    let q = ShapedDistribution::from_probs(&[1.0, 0.0]).unwrap();
    assert_eq!(
        verify_step(&p, Draft::Distribution(&q), 1, 0.1, 0.1),
        Err(SamplingError::ProposalOutsideDraft { token: 1 })
    );
}

/// How one judged step turns a proposal into a committed token.
#[derive(Clone, Copy)]
enum Rule {
    /// `verify_step`: the rule under test.
    Exact,
    /// WRONG: on rejection, draw from p instead of the residual.
    RejectionDrawsFromTarget,
    /// WRONG: the acceptance test reuses the uniform that drew the proposal.
    ReusedUniform,
}

/// One speculative step with a sampled draft: x ~ q, judged by `rule`.
fn sampled_step(
    p: &ShapedDistribution,
    q: &ShapedDistribution,
    rule: Rule,
    c: &mut DrawCounter,
) -> u32 {
    let u_draft = c.next();
    let x = q.draw(u_draft);
    let (r, u) = (c.next(), c.next());
    match rule {
        Rule::Exact => match verify_step(p, Draft::Distribution(q), x, r, u).unwrap() {
            Verdict::Accepted => x,
            Verdict::Rejected { replacement } => replacement,
        },
        Rule::RejectionDrawsFromTarget => {
            if accept(p.probability(x), q.probability(x), r) {
                x
            } else {
                p.draw(u)
            }
        }
        Rule::ReusedUniform => {
            match verify_step(p, Draft::Distribution(q), x, u_draft, u).unwrap() {
                Verdict::Accepted => x,
                Verdict::Rejected { replacement } => replacement,
            }
        }
    }
}

/// Target and draft rows that disagree a lot: the target's top-k filters tokens the draft
/// proposes (q > 0 = p), and the draft gives little mass where the target gives much.
fn target_and_draft() -> (ShapedDistribution, ShapedDistribution) {
    let target_logits = [2.0, 0.5, 1.5, -1.0, 0.0, 1.0];
    let draft_logits = [0.5, 1.8, 1.5, 1.0, -2.0, 0.2];
    let target = Shaping {
        temperature: 0.9,
        top_k: 5,
        ..Shaping::default()
    };
    let draft = Shaping::default();
    let p = ShapedDistribution::new(&target_logits, &target, History::empty()).unwrap();
    let q = ShapedDistribution::new(&draft_logits, &draft, History::empty()).unwrap();
    assert_eq!(p.probability(3), 0.0, "the target filters token 3");
    assert!(q.probability(3) > 0.1, "the draft proposes token 3 often");
    (p, q)
}

fn sampled_counts(rule: Rule, seed: u64) -> (Vec<u64>, Vec<f64>) {
    let (p, q) = target_and_draft();
    let mut counts = vec![0u64; p.vocab_size()];
    let mut c = DrawCounter::new(seed);
    for _ in 0..TRIALS {
        counts[sampled_step(&p, &q, rule, &mut c) as usize] += 1;
    }
    (counts, probs(&p))
}

#[test]
fn sampled_draft_speculation_is_distributed_as_target() {
    let (counts, p) = sampled_counts(Rule::Exact, 11);
    assert_distributed_as(&counts, &p);
}

#[test]
fn point_mass_draft_speculation_is_distributed_as_target() {
    // Deterministic proposals (cycling through every token, filtered ones included) are q = δ_x.
    let (p, _) = target_and_draft();
    let mut counts = vec![0u64; p.vocab_size()];
    let mut c = DrawCounter::new(12);
    for trial in 0..TRIALS {
        let x = (trial % p.vocab_size()) as u32;
        let token = match verify_step(&p, Draft::PointMass, x, c.next(), c.next()).unwrap() {
            Verdict::Accepted => x,
            Verdict::Rejected { replacement } => replacement,
        };
        counts[token as usize] += 1;
    }
    assert_distributed_as(&counts, &probs(&p));
}

#[test]
fn negative_control_wrong_rules_fail_the_same_test() {
    // Same harness, same trials: drawing the correction from p instead of the residual, or
    // judging with the proposal's own uniform, is detected.
    for rule in [Rule::RejectionDrawsFromTarget, Rule::ReusedUniform] {
        let (counts, p) = sampled_counts(rule, 11);
        let result = chi_square(&counts, &p);
        assert!(!result.consistent(), "a wrong rule passed: {result:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Whole rounds with history-dependent shaping: two drafted tokens per round, verified in order,
// with a bonus token when both are accepted. The first two generated tokens must be distributed
// as sequential sampling gives them.

const VOCAB: usize = 4;
const PROMPT: [u32; 1] = [0];

/// A toy "model": the next-token logits depend on the last token.
fn target_logits(tokens: &[u32]) -> [f32; VOCAB] {
    const TABLE: [[f32; VOCAB]; VOCAB] = [
        [1.0, 2.0, 0.5, 1.5],
        [2.0, 0.0, 1.0, 1.2],
        [0.3, 1.7, 1.6, 0.0],
        [1.1, 0.9, 2.2, 0.4],
    ];
    TABLE[*tokens.last().unwrap() as usize]
}

fn draft_logits(tokens: &[u32]) -> [f32; VOCAB] {
    const TABLE: [[f32; VOCAB]; VOCAB] = [
        [0.2, 2.2, 1.0, 0.5],
        [1.0, 1.0, 1.0, 1.0],
        [1.5, 0.5, 0.0, 1.0],
        [0.0, 1.0, 2.5, 0.0],
    ];
    TABLE[*tokens.last().unwrap() as usize]
}

fn shaping() -> Shaping {
    Shaping {
        temperature: 0.9,
        top_k: 3,
        repetition_penalty: 2.0,
        presence_penalty: 1.0,
        ..Shaping::default()
    }
}

fn target_at(tokens: &[u32], penalty_history: &[u32]) -> ShapedDistribution {
    let history = History::new(penalty_history, penalty_history.len() - PROMPT.len()).unwrap();
    ShapedDistribution::new(&target_logits(tokens), &shaping(), history).unwrap()
}

/// Generates the first two tokens with speculative rounds of two proposals. With
/// `stale_history`, every row of a round is shaped with the round-start history (WRONG: the
/// second row's penalties miss the first accepted proposal).
fn speculative_pair(c: &mut DrawCounter, stale_history: bool) -> (u32, u32) {
    let mut tokens = PROMPT.to_vec();
    while tokens.len() < PROMPT.len() + 2 {
        let round_start = tokens.clone();
        let mut drafted = tokens.clone();
        let mut proposals = Vec::new();
        for _ in 0..2 {
            let history = History::new(&drafted, drafted.len() - PROMPT.len()).unwrap();
            let q = ShapedDistribution::new(&draft_logits(&drafted), &shaping(), history).unwrap();
            let x = q.draw(c.next());
            drafted.push(x);
            proposals.push((x, q));
        }
        let mut all_accepted = true;
        for (x, q) in &proposals {
            let penalty_history = if stale_history { &round_start } else { &tokens };
            let p = target_at(&tokens, penalty_history);
            match verify_step(&p, Draft::Distribution(q), *x, c.next(), c.next()).unwrap() {
                Verdict::Accepted => tokens.push(*x),
                Verdict::Rejected { replacement } => {
                    tokens.push(replacement);
                    all_accepted = false;
                    break;
                }
            }
        }
        if all_accepted {
            let bonus = target_at(&tokens, &tokens).draw(c.next());
            tokens.push(bonus);
        }
    }
    (tokens[1], tokens[2])
}

/// P(y1, y2) = p(y1 | prompt) * p(y2 | prompt, y1), indexed y1 * VOCAB + y2.
fn sequential_pair_probs() -> Vec<f64> {
    let first = target_at(&PROMPT, &PROMPT);
    let mut out = vec![0.0; VOCAB * VOCAB];
    for y1 in 0..VOCAB as u32 {
        let tokens = [PROMPT[0], y1];
        let second = target_at(&tokens, &tokens);
        for y2 in 0..VOCAB as u32 {
            out[y1 as usize * VOCAB + y2 as usize] = first.probability(y1) * second.probability(y2);
        }
    }
    out
}

fn pair_counts(stale_history: bool) -> Vec<u64> {
    let mut counts = vec![0u64; VOCAB * VOCAB];
    let mut c = DrawCounter::new(2024);
    for _ in 0..TRIALS {
        let (y1, y2) = speculative_pair(&mut c, stale_history);
        counts[y1 as usize * VOCAB + y2 as usize] += 1;
    }
    counts
}

#[test]
fn speculative_rounds_with_penalties_match_sequential_pairs() {
    assert_distributed_as(&pair_counts(false), &sequential_pair_probs());
}

#[test]
fn negative_control_stale_penalty_history_fails() {
    let result = chi_square(&pair_counts(true), &sequential_pair_probs());
    assert!(!result.consistent(), "stale history passed: {result:?}");
}
