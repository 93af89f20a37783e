//! Sampled speculative decoding is exact in distribution: the joint law of the first three generated tokens,
//! with temperature, top-k, top-p and a repetition penalty on, equals the sequential sampler's law — computed
//! exactly here by enumerating every continuation through the model. Chi-square over 20k seeds per arm at
//! p = 0.01, for the MTP head (a sampled q), a deterministic drafter (point-mass q) and the weight-free
//! drafters (`NgramDrafter`, `SuffixDrafter`: point-mass q, proposing only where the history repeats or,
//! for the suffix drafter, what the earlier seeds' runs in the session sampled most; on a prompt built for
//! them to copy from, sampled without the repetition penalty, which would discourage every copy). A
//! deliberately wrong acceptance rule (redraw from p on rejection) must fail the same test, with the
//! oracle's proposals and with each weight-free drafter's (so its arm is known to judge proposals).
//!
//! The gate runs on the CPU engine and on the CUDA backend (the host emulation of its operations in CI; the
//! real GPU with `TURBOSPARK_TEST_GPU=1`, tools/device/README.md says how), there with the GPU MTP head: the law is
//! enumerated through the same device, whose passes of <= 16 rows take the decode kernels, so the exact
//! law and the sampled runs read the same logits.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{detok, fixture, Oracle};
use cuda_backend::{CudaDevice, CudaModel, LoadOptions};
use device::Model;
use drafters::{Drafter, MtpOrSuffix, NgramDrafter, SuffixDrafter};
use families::{Backend, Wanted};
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

fn dist<B: Backend>(
    model: &B,
    history: &[u32],
    prompt_len: usize,
    shaping: &Shaping,
) -> ShapedDistribution {
    let mut st = model.new_state().unwrap();
    let out = model.forward(history, 0, &mut st, &Wanted::last()).unwrap();
    ShapedDistribution::new(
        out.row(0),
        shaping,
        History::new(history, history.len() - prompt_len).unwrap(),
    )
    .unwrap()
}

/// P(t1, t2, t3) by enumeration.
fn exact_joint<B: Backend>(model: &B, prompt: &[u32], shaping: &Shaping) -> HashMap<[u32; 3], f64> {
    let mut joint = HashMap::new();
    let p1 = dist(model, prompt, prompt.len(), shaping);
    for (t1, a) in p1.support() {
        let h1: Vec<u32> = prompt.iter().copied().chain([t1]).collect();
        for (t2, b) in dist(model, &h1, prompt.len(), shaping).support() {
            let h2: Vec<u32> = h1.iter().copied().chain([t2]).collect();
            for (t3, c) in dist(model, &h2, prompt.len(), shaping).support() {
                joint.insert([t1, t2, t3], a * b * c);
            }
        }
    }
    joint
}

/// The counts of each sampled continuation, and the proposals made over all runs.
fn sample<B: Backend>(
    model: &B,
    prompt: &[u32],
    shaping: &Shaping,
    drafter: Option<Box<dyn Drafter + Send>>,
    spec: Option<Speculative>,
) -> (HashMap<[u32; 3], u64>, usize) {
    let d = detok(model.vocab() as u32);
    let mut session = Session::open(model).unwrap();
    if let Some(dr) = drafter {
        session = session.with_drafter(dr);
    }
    let (mut counts, mut proposed) = (HashMap::new(), 0);
    for seed in 0..SEEDS {
        let cfg = GenerationConfig {
            seed,
            shaping: *shaping,
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
        proposed += r.spec.map_or(0, |s| s.proposed);
        *counts
            .entry([r.token_ids[0], r.token_ids[1], r.token_ids[2]])
            .or_insert(0) += 1;
    }
    (counts, proposed)
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

/// A prompt for prompt lookup: `[a, b] + prompt`, a not in `prompt`, b the target's likeliest token after
/// `prompt + [a]`. When the target samples a first, the drafter proposes b (what followed a). Of all a,
/// the one that maximizes P(first token a) · q(1 - q), q the probability of b after a: proposals
/// often made, neither always accepted nor always rejected, so the wrong rule can show.
fn lookup_prompt<B: Backend>(model: &B, prompt: &[u32], shaping: &Shaping) -> Vec<u32> {
    let likeliest =
        |d: ShapedDistribution| d.support().max_by(|x, y| x.1.total_cmp(&y.1)).unwrap().0;
    let mut best = (0.0, Vec::new());
    for a in (0..model.vocab() as u32).filter(|a| !prompt.contains(a)) {
        let after_a = [prompt, &[a]].concat();
        let b = likeliest(dist(model, &after_a, prompt.len(), shaping));
        let p = [&[a, b][..], prompt].concat();
        let pa = dist(model, &p, p.len(), shaping).probability(a);
        if pa == 0.0 {
            continue;
        }
        let q = dist(model, &[&p[..], &[a]].concat(), p.len(), shaping).probability(b);
        let score = pa * q * (1.0 - q);
        if score > best.0 {
            best = (score, p);
        }
    }
    assert!(
        best.0 > 0.05,
        "no prompt for prompt lookup to copy from: {best:?}"
    );
    best.1
}

/// A prompt, the shaping its runs sample with, and the exact law of their first three tokens.
struct Law {
    prompt: Vec<u32>,
    shaping: Shaping,
    exact: HashMap<[u32; 3], f64>,
}

impl Law {
    fn new<B: Backend>(model: &B, prompt: Vec<u32>, shaping: Shaping) -> Self {
        let exact = exact_joint(model, &prompt, &shaping);
        let mass: f64 = exact.values().sum();
        assert!(
            (mass - 1.0).abs() < 1e-9 && exact.len() > 8,
            "support {} mass {mass}",
            exact.len()
        );
        Law {
            prompt,
            shaping,
            exact,
        }
    }

    /// One arm: `SEEDS` runs on `model` with `drafter` and `spec`; (chi-square, critical value,
    /// proposals made).
    fn arm<B: Backend>(
        &self,
        model: &B,
        label: &str,
        drafter: Option<Box<dyn Drafter + Send>>,
        spec: Option<Speculative>,
    ) -> (f64, f64, usize) {
        let (counts, proposed) = sample(model, &self.prompt, &self.shaping, drafter, spec);
        let (stat, crit) = chi_square(&self.exact, &counts);
        println!("{label}: chi2 {stat:.1}, critical {crit:.1}, {proposed} proposals");
        (stat, crit, proposed)
    }
}

/// WRONG on purpose: redraw from p on rejection, which gives a proposal a second chance.
fn wrong_rule() -> Speculative {
    Speculative {
        acceptance: Acceptance::ResampleTargetOnReject,
        ..Speculative::new(2)
    }
}

/// The four arms on `model`: sequential, the MTP head (`mtp`), a point-mass drafter, and the wrong
/// acceptance rule, which must be rejected.
fn check_arms<B: Backend>(model: &B, mtp: &dyn Fn() -> Box<dyn Drafter + Send>, device: &str) {
    let law = Law::new(model, vec![17, 201, 5, 77, 310, 42, 9, 128], shaping());
    let prompt = &law.prompt;
    let arm = |name: &str, drafter: Option<Box<dyn Drafter + Send>>, spec: Option<Speculative>| {
        let (stat, crit, _) = law.arm(model, &format!("{device} {name}"), drafter, spec);
        (stat, crit)
    };

    let (stat, crit) = arm("sequential", None, None);
    assert!(
        stat <= crit,
        "{device}: sequential sampler vs exact law: chi2 {stat:.1} > {crit:.1}"
    );
    let (stat, crit) = arm("MTP block 2", Some(mtp()), Some(Speculative::new(2)));
    assert!(
        stat <= crit,
        "{device}: MTP block 2 vs exact law: chi2 {stat:.1} > {crit:.1}"
    );

    // A deterministic drafter proposing the greedy path: q is a point mass.
    let mut greedy = prompt.clone();
    let mut st = model.new_state().unwrap();
    let mut out = model.forward(prompt, 0, &mut st, &Wanted::last()).unwrap();
    for _ in 0..4 {
        let t = kernels::argmax(out.row(0)) as u32;
        greedy.push(t);
        let pos = greedy.len() - 1;
        out = model.forward(&[t], pos, &mut st, &Wanted::last()).unwrap();
    }
    let oracle = || {
        Box::new(Oracle {
            full: greedy.clone(),
            error_rate: 0.0,
            vocab: model.vocab() as u32,
            calls: 0,
        }) as Box<dyn Drafter + Send>
    };
    let (stat, crit) = arm(
        "point-mass drafter",
        Some(oracle()),
        Some(Speculative::new(2)),
    );
    assert!(
        stat <= crit,
        "{device}: point-mass drafter vs exact law: chi2 {stat:.1} > {crit:.1}"
    );

    // Negative control: the same test must reject a wrong acceptance rule (redrawing from p on rejection
    // gives the proposal a second chance, over-weighting the greedy path).
    let (stat, crit) = arm("wrong acceptance rule", Some(oracle()), Some(wrong_rule()));
    assert!(
        stat > crit,
        "{device}: the wrong rule passed: chi2 {stat:.1} <= {crit:.1}"
    );
}

/// The weight-free drafters on `model` (prompt lookup; the suffix drafter, which also proposes the
/// most frequent continuation among the session's earlier runs, the earlier seeds' samples), on a
/// prompt they copy from (`lookup_prompt`), sampled without the repetition penalty (which discourages
/// every copy): exact, proposing in many runs, and the wrong rule with their proposals rejected (so
/// each arm is known to judge them).
/// Builds a fresh drafter for an arm.
type MakeDrafter<'a> = dyn Fn() -> Box<dyn Drafter + Send> + 'a;

/// With `mtp`, also `auto`'s per-round mix of it and the suffix drafter (`MtpOrSuffix`: sampled q in
/// the MTP head's rounds, point masses in the suffix drafter's).
fn check_weight_free_arms<B: Backend>(
    model: &B,
    mtp: Option<&dyn Fn() -> Box<dyn Drafter + Send>>,
    device: &str,
) {
    let shaping = Shaping {
        repetition_penalty: 1.0,
        ..shaping()
    };
    let prompt = lookup_prompt(model, &[17, 201, 5, 77, 310, 42, 9, 128], &shaping);
    let law = Law::new(model, prompt, shaping);
    let ngram = || Box::new(NgramDrafter::new()) as Box<dyn Drafter + Send>;
    let suffix = || Box::new(SuffixDrafter::new()) as Box<dyn Drafter + Send>;
    let mix = |mtp: &dyn Fn() -> Box<dyn Drafter + Send>| {
        Box::new(MtpOrSuffix::new(mtp(), SuffixDrafter::new())) as Box<dyn Drafter + Send>
    };
    let mut drafters: Vec<(&str, Box<MakeDrafter<'_>>)> =
        vec![("ngram", Box::new(ngram)), ("suffix", Box::new(suffix))];
    if let Some(mtp) = mtp {
        drafters.push(("mtp+suffix", Box::new(move || mix(mtp))));
    }
    for (name, make) in drafters {
        let label = format!("{device} {name} block 2");
        let (stat, crit, proposed) =
            law.arm(model, &label, Some(make()), Some(Speculative::new(2)));
        assert!(
            stat <= crit,
            "{label} vs exact law: chi2 {stat:.1} > {crit:.1}"
        );
        assert!(
            proposed > SEEDS as usize / 4,
            "{label}: {proposed} proposals"
        );
        let label = format!("{device} wrong rule, {name}");
        let (stat, crit, _) = law.arm(model, &label, Some(make()), Some(wrong_rule()));
        assert!(
            stat > crit,
            "{label}: the wrong rule passed: chi2 {stat:.1} <= {crit:.1}"
        );
    }
}

#[test]
fn sampled_speculative_matches_sequential_distribution() {
    let (ck, model) = fixture("qwen3_5");
    let model = Model::Cpu(model);
    let mtp = || model.mtp_drafter(&ck).unwrap().unwrap();
    check_arms(&model, &mtp, "cpu");
    check_weight_free_arms(&model, Some(&mtp), "cpu");
}

/// A draft head over the first half of the vocabulary: its q is the shaped distribution over those ids
/// (-inf elsewhere), and the rejection step keeps the output's distribution the target's.
#[test]
fn a_reduced_draft_vocabulary_keeps_the_sampled_distribution() {
    let (ck, model) = fixture("qwen3_5");
    let draft_vocab = model.vocab / 2;
    let head: families::SharedHead = model.clone();
    let model = Model::Cpu(model);
    let mtp = || {
        let h = drafters::MtpHead::load(&ck, head.clone()).unwrap().unwrap();
        Box::new(h.with_draft_vocab(draft_vocab)) as Box<dyn Drafter + Send>
    };
    check_arms(&model, &mtp, "cpu, draft vocabulary of half the ids");
}

/// The same gate through the CUDA backend with the product's GPU options (bf16 weights, the batch-
/// invariant decode/verify kernels) and the GPU MTP head.
#[test]
fn sampled_speculative_matches_sequential_distribution_on_the_cuda_backend() {
    let (ck, _) = fixture("qwen3_5");
    let dev = if std::env::var_os("TURBOSPARK_TEST_GPU").is_some() {
        Arc::new(CudaDevice::open().expect("TURBOSPARK_TEST_GPU is set but no GPU opened"))
    } else {
        Arc::new(CudaDevice::emulated())
    };
    let model = Model::Cuda(Arc::new(
        CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap(),
    ));
    let mtp = || model.mtp_drafter(&ck).unwrap().unwrap();
    let device = if dev.is_emulated() {
        "cuda (emulated)"
    } else {
        "cuda"
    };
    check_arms(&model, &mtp, device);
    check_weight_free_arms(&model, None, device);
}
