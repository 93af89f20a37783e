//! Continuous batching at the model seam (`runtime::BatchHub`): generations on several threads meet in
//! shared forward steps, and each returns exactly what it returns alone — greedy and seeded sampled,
//! sequential and speculating with the MTP head — while the steps really hold several sequences.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{detok, fixture, prompt};
use drafters::MtpHead;
use families::{Backend, SeqRows, SharedHead, Transformer, Wanted};
use runtime::{
    generate, BatchHub, CancelFlag, GenerationConfig, GenerationResult, Request, Session,
    Speculative,
};

/// One request of the test: prompt salt, sampling, speculation block (0: sequential).
struct Job {
    salt: u32,
    config: GenerationConfig,
    block: usize,
}

fn jobs() -> Vec<Job> {
    let sampled = |seed| {
        let mut c = GenerationConfig::greedy(28);
        c.shaping.temperature = 0.8;
        c.seed = seed;
        c
    };
    vec![
        Job {
            salt: 0,
            config: GenerationConfig::greedy(32),
            block: 0,
        },
        Job {
            salt: 1,
            config: GenerationConfig::greedy(40),
            block: 3,
        },
        Job {
            salt: 2,
            config: sampled(7),
            block: 0,
        },
        Job {
            salt: 3,
            config: sampled(11),
            block: 2,
        },
        Job {
            salt: 4,
            config: GenerationConfig::greedy(24),
            block: 1,
        },
    ]
}

fn run<B: Backend<State = families::State>>(
    backend: &B,
    ck: &model_io::Checkpoint,
    model: &Arc<Transformer>,
    job: &Job,
) -> GenerationResult {
    let d = detok(model.vocab as u32);
    let p = prompt(model, 9 + 4 * job.salt as usize, job.salt);
    let mut session = Session::new(model);
    if job.block > 0 {
        let head: SharedHead = model.clone();
        let mtp = MtpHead::load(ck, head).unwrap().expect("an MTP head");
        session = session.with_drafter(Box::new(mtp));
    }
    let req = Request {
        prompt: &p,
        config: &job.config,
        eos: &[],
        detok: &d,
        speculative: (job.block > 0).then(|| Speculative::new(job.block)),
        cancel: CancelFlag::new(),
    };
    generate(backend, &mut session, &req, &mut |_| {}).unwrap()
}

#[test]
fn concurrent_generations_share_steps_and_each_equals_its_run_alone() {
    for name in ["qwen3_5", "qwen3_next"] {
        let (ck, model) = fixture(name);
        let jobs = jobs();
        let alone: Vec<GenerationResult> =
            jobs.iter().map(|j| run(&*model, &ck, &model, j)).collect();
        // A generous gather, so that the threads meet even on a loaded machine.
        let hub = BatchHub::new(Duration::from_millis(200));
        let together: Vec<GenerationResult> = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|j| {
                    let (hub, ck, model) = (&hub, &ck, &model);
                    s.spawn(move || {
                        let _in = hub.enter();
                        run(&hub.backend(&**model), ck, model, j)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(a.token_ids, b.token_ids, "{name} job {i}: tokens");
            assert_eq!(a.text, b.text, "{name} job {i}: text");
            assert_eq!(a.reason, b.reason, "{name} job {i}: stop reason");
        }
        let stats = hub.stats();
        assert!(
            stats.largest == jobs.len() && stats.sequences >= 2 * stats.steps,
            "{name}: the steps did not batch the generations: {stats:?}"
        );
    }
}

/// A sequence whose rows fail gets its own error; the one that met it in the step gets its result.
#[test]
fn a_failing_sequence_does_not_fail_its_step_neighbours() {
    let (_, model) = fixture("qwen3");
    let good: Vec<u32> = prompt(&model, 5, 1);
    let bad = vec![1, model.vocab as u32];
    let want = {
        let mut st = Transformer::new_state(&model);
        Transformer::forward(&model, &good, 0, &mut st, &Wanted::last()).unwrap()
    };
    let hub = BatchHub::new(Duration::from_secs(5));
    let b = hub.backend(&*model);
    let (good_out, bad_out) = std::thread::scope(|s| {
        let (ia, ib) = (hub.enter(), hub.enter());
        let run = |tokens: Vec<u32>, guard| {
            let b = &b;
            s.spawn(move || {
                let _g = guard;
                let mut st = families::Backend::new_state(b).unwrap();
                let w = Wanted::last();
                let mut one = [SeqRows {
                    tokens: &tokens,
                    start: 0,
                    state: &mut st,
                    wanted: &w,
                }];
                b.forward_batch(&mut one).map(|mut v| v.remove(0))
            })
        };
        let a = run(good.clone(), ia);
        let c = run(bad, ib);
        (a.join().unwrap(), c.join().unwrap())
    });
    let got = good_out.unwrap();
    assert!(got
        .logits
        .iter()
        .zip(&want.logits)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    let err = bad_out.unwrap_err().to_string();
    assert!(err.contains("vocab") || err.contains("token"), "{err}");
    let stats = hub.stats();
    assert_eq!(
        (stats.steps, stats.largest),
        (1, 2),
        "the two sequences met in one step"
    );
}
