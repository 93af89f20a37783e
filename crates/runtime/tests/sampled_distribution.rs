//! Sampled speculative decoding is exact in distribution: the joint law of the first three generated tokens,
//! with temperature, top-k, top-p and a repetition penalty on, equals the sequential sampler's law — computed
//! exactly here by enumerating every continuation through the model. Chi-square over 20k seeds per arm at
//! p = 0.01, for the MTP head (a sampled q) and a deterministic drafter (point-mass q). A deliberately wrong
//! acceptance rule (redraw from p on rejection) must fail the same test.

mod common;

use std::collections::HashMap;

use common::{detok, fixture, Oracle};
use drafters::{Drafter, MtpHead};
use families::{Transformer, Wanted};
use runtime::{generate, Acceptance, CancelFlag, GenerationConfig, Request, Session, Speculative};
use sampling::{History, ShapedDistribution, Shaping};

const SEEDS: u64 = 20_000;

fn shaping() -> Shaping {
    Shaping {
        temperature: 1.0,
        top_k: 4,
        top_p: 0.9,
        repetition_penalty: 1.3,
        ..Shaping::greedy()
    }
}

fn dist(model: &Transformer, history: &[u32], prompt_len: usize) -> ShapedDistribution {
    let mut st = model.new_state();
    let out = model.forward(history, 0, &mut st, &Wanted::last()).unwrap();
    ShapedDistribution::new(
        out.row(0),
        &shaping(),
        History::new(history, history.len() - prompt_len).unwrap(),
    )
    .unwrap()
}

/// P(t1, t2, t3) by enumeration.
fn exact_joint(model: &Transformer, prompt: &[u32]) -> HashMap<[u32; 3], f64> {
    let mut joint = HashMap::new();
    let p1 = dist(model, prompt, prompt.len());
    for (t1, a) in p1.support() {
        let h1: Vec<u32> = prompt.iter().copied().chain([t1]).collect();
        for (t2, b) in dist(model, &h1, prompt.len()).support() {
            let h2: Vec<u32> = h1.iter().copied().chain([t2]).collect();
            for (t3, c) in dist(model, &h2, prompt.len()).support() {
                joint.insert([t1, t2, t3], a * b * c);
            }
        }
    }
    joint
}

fn sample(
    model: &Transformer,
    prompt: &[u32],
    drafter: Option<Box<dyn Drafter + Send>>,
    spec: Option<Speculative>,
) -> HashMap<[u32; 3], u64> {
    let d = detok(model.vocab as u32);
    let mut session = Session::new(model);
    if let Some(dr) = drafter {
        session = session.with_drafter(dr);
    }
    let mut counts = HashMap::new();
    for seed in 0..SEEDS {
        let cfg = GenerationConfig {
            seed,
            shaping: shaping(),
            ..GenerationConfig::greedy(3)
        };
        let req = Request {
            prompt,
            config: &cfg,
            eos: &[],
            detok: &d,
            speculative: spec,
            cancel: CancelFlag::new(),
        };
        let r = generate(model, &mut session, &req, &mut |_| {}).unwrap();
        assert_eq!(r.token_ids.len(), 3);
        *counts
            .entry([r.token_ids[0], r.token_ids[1], r.token_ids[2]])
            .or_insert(0) += 1;
    }
    counts
}

/// Pearson chi-square against the exact law (cells with expectation < 5 pooled); returns (statistic, critical
/// value at p = 0.01 by the Wilson–Hilferty approximation).
fn chi_square(exact: &HashMap<[u32; 3], f64>, counts: &HashMap<[u32; 3], u64>) -> (f64, f64) {
    let n = SEEDS as f64;
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_e, mut pooled_o) = (0.0, 0.0);
    for (k, &p) in exact {
        let e = p * n;
        let o = *counts.get(k).unwrap_or(&0) as f64;
        if e < 5.0 {
            pooled_e += e;
            pooled_o += o;
        } else {
            stat += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    let outside: u64 = counts
        .iter()
        .filter(|(k, _)| !exact.contains_key(*k))
        .map(|(_, c)| c)
        .sum();
    assert_eq!(
        outside, 0,
        "sampled a continuation the exact law gives probability 0"
    );
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    let df = (cells - 1) as f64;
    let z = 2.326; // one-sided 0.99 quantile of N(0, 1)
    let critical = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    (stat, critical)
}

#[test]
fn sampled_speculative_matches_sequential_distribution() {
    let (ck, model) = fixture("qwen3_5");
    let prompt: Vec<u32> = vec![17, 201, 5, 77, 310, 42, 9, 128];
    let exact = exact_joint(&model, &prompt);
    let mass: f64 = exact.values().sum();
    assert!(
        (mass - 1.0).abs() < 1e-9 && exact.len() > 8,
        "support {} mass {mass}",
        exact.len()
    );

    let (stat, crit) = chi_square(&exact, &sample(&model, &prompt, None, None));
    assert!(
        stat <= crit,
        "sequential sampler vs exact law: chi2 {stat:.1} > {crit:.1}"
    );

    let mtp = || -> Box<dyn Drafter + Send> {
        Box::new(MtpHead::load(&ck, model.clone()).unwrap().unwrap())
    };
    let (stat, crit) = chi_square(
        &exact,
        &sample(&model, &prompt, Some(mtp()), Some(Speculative::new(2))),
    );
    assert!(
        stat <= crit,
        "MTP block 2 vs exact law: chi2 {stat:.1} > {crit:.1}"
    );

    // A deterministic drafter proposing the greedy path: q is a point mass.
    let mut greedy = prompt.clone();
    let mut st = model.new_state();
    let mut out = model.forward(&prompt, 0, &mut st, &Wanted::last()).unwrap();
    for _ in 0..4 {
        let t = kernels::argmax(out.row(0)) as u32;
        greedy.push(t);
        out = model
            .forward(&[t], st.position(), &mut st, &Wanted::last())
            .unwrap();
    }
    let oracle = || {
        Box::new(Oracle {
            full: greedy.clone(),
            error_rate: 0.0,
            vocab: model.vocab as u32,
            calls: 0,
        })
    };
    let (stat, crit) = chi_square(
        &exact,
        &sample(&model, &prompt, Some(oracle()), Some(Speculative::new(2))),
    );
    assert!(
        stat <= crit,
        "point-mass drafter vs exact law: chi2 {stat:.1} > {crit:.1}"
    );

    // Negative control: the same test must reject a wrong acceptance rule (redrawing from p on rejection
    // gives the proposal a second chance, over-weighting the greedy path).
    let wrong = Speculative {
        acceptance: Acceptance::ResampleTargetOnReject,
        ..Speculative::new(2)
    };
    let (stat, crit) = chi_square(
        &exact,
        &sample(&model, &prompt, Some(oracle()), Some(wrong)),
    );
    assert!(
        stat > crit,
        "the wrong rule passed: chi2 {stat:.1} <= {crit:.1}"
    );
}
