//! The decode loop on the CUDA backend, through the `device::Model` enum the front ends use, on the
//! backend's host emulation (`CudaDevice::emulated`: every GPU operation run on the CPU with the kernels'
//! layouts, so CI needs no GPU). Proves, on the GPU code path:
//! - greedy speculative == sequential (tokens, stop reason, text, streamed deltas) with tape and
//!   snapshot rollback, an oracle drafter at several error rates and the checkpoint's MTP head on the
//!   device (`CudaMtp`, fed the verified taps), and the state left behind continues bit-identically;
//! - a seeded sampled run reproduces, and equals the CPU engine's run for the same seed (sequential and
//!   speculative: the GPU MTP head against the host one), on f32 weights;
//! - the greedy stream on the real-vocabulary checkpoint equals the CPU engine's (ids and text);
//! - a session on the device reuses its prefix as on the CPU;
//! - log-probabilities from device rows: speculative == sequential bit for bit, and == the CPU engine's
//!   to f32 rounding on f32 weights;
//! - on the embedded testbed opened by `Engine::open_on(.., Device::CudaEmulated)` (the CLI's path, default
//!   GPU options), the trained MTP head and DFlash drafter (both on the device, fed the verified taps)
//!   are accepted and speculative greedy equals sequential greedy, and each drafts what its host
//!   twin drafts.

mod common;

use std::sync::Arc;

use common::{detok, fixture, prompt, Oracle};
use cuda_backend::{CudaDevice, CudaModel, LoadOptions, WeightFormat};
use device::{Device, Model, ModelState};
use drafters::Drafter;
use families::{Backend, BackendState, Wanted};
use model_io::Checkpoint;
use runtime::{
    generate, CancelFlag, Detokenizer, DrafterRequest, Engine, Event, GenerationConfig,
    GenerationResult, Request, Rollback, Session, Speculation, SpeculationPlan, Speculative,
    StopReason,
};
use sampling::Shaping;

/// The product's GPU options (bf16 weights, batch-invariant verify kernels), on the emulated device, or on
/// the real GPU with `TURBOSPARK_TEST_GPU=1` (how these gates are run on the H200: tools/device/README.md).
fn cuda(ck: &Checkpoint, opts: LoadOptions) -> Model {
    let dev = if std::env::var_os("TURBOSPARK_TEST_GPU").is_some() {
        Arc::new(CudaDevice::open().expect("TURBOSPARK_TEST_GPU is set but no GPU opened"))
    } else {
        Arc::new(CudaDevice::emulated())
    };
    Model::Cuda(Arc::new(CudaModel::load(&dev, ck, opts).unwrap()))
}

/// f32 weights and the f32-activation kernel for every pass: the CPU engine's arithmetic.
fn exact() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::AsStored,
        gemv_max_rows: usize::MAX,
        ..LoadOptions::default()
    }
}

struct Case {
    prompt: Vec<u32>,
    config: GenerationConfig,
    eos: Vec<u32>,
    cancel_after: Option<usize>,
}

/// One generation on a fresh session; returns the result, the streamed text and the state left behind.
fn run(
    model: &Model,
    detok: &(dyn Detokenizer + Sync),
    case: &Case,
    spec: Option<(Speculative, Box<dyn Drafter + Send>)>,
) -> (GenerationResult, String, ModelState) {
    let mut session = Session::open(model).unwrap();
    let speculative = spec.as_ref().map(|(s, _)| *s);
    if let Some((_, drafter)) = spec {
        session = session.with_drafter(drafter);
    }
    let cancel = CancelFlag::new();
    let req = Request {
        prompt: &case.prompt,
        config: &case.config,
        eos: &case.eos,
        detok,
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
    (r, streamed, session.into_state())
}

/// Logits of one more token on `state` (bit patterns): equal iff the states continue identically.
fn probe(model: &Model, mut state: ModelState) -> (usize, Vec<u32>) {
    let at = state.position();
    let out = model.forward(&[3], at, &mut state, &Wanted::all()).unwrap();
    (at, out.logits.iter().map(|x| x.to_bits()).collect())
}

fn greedy_case(prompt: Vec<u32>, max: usize) -> Case {
    Case {
        prompt,
        config: GenerationConfig::greedy(max),
        eos: Vec::new(),
        cancel_after: None,
    }
}

fn check_greedy_exactness(name: &str, mtp: bool) {
    let (ck, cpu) = fixture(name);
    let model = cuda(&ck, LoadOptions::default());
    let d = detok(cpu.vocab as u32);
    let mut runs = 0;
    let mut branches = std::collections::BTreeSet::new();
    let (mut mtp_rounds, mut mtp_accepted) = (0, 0);
    for salt in 0..3u32 {
        let p = prompt(&cpu, 5 + 7 * salt as usize, salt);
        let (seq, _, _) = run(&model, &d, &greedy_case(p.clone(), 32), None);
        let ids = seq.token_ids.clone();
        let text: Vec<char> = seq.text.chars().collect();
        let cases = vec![
            greedy_case(p.clone(), 32),
            greedy_case(p.clone(), 7),
            Case {
                eos: vec![ids[9]],
                ..greedy_case(p.clone(), 32)
            },
            Case {
                config: GenerationConfig {
                    stop_strings: vec![text[11..15].iter().collect()],
                    ..GenerationConfig::greedy(32)
                },
                ..greedy_case(p.clone(), 32)
            },
            Case {
                config: GenerationConfig {
                    stop_strings: vec![text[20..23].iter().collect(), "zzzz".into()],
                    ..GenerationConfig::greedy(30)
                },
                ..greedy_case(p.clone(), 30)
            },
            Case {
                cancel_after: Some(6),
                ..greedy_case(p.clone(), 32)
            },
        ];
        for case in &cases {
            let (want, want_stream, want_state) = run(&model, &d, case, None);
            assert_eq!(want_stream, want.text);
            let want_probe = probe(&model, want_state);
            for block in 1..=8 {
                for (error_rate, rollback) in [
                    (0.0, Rollback::Tape),
                    (0.3, Rollback::Tape),
                    (1.0, Rollback::Tape),
                    (0.3, Rollback::Snapshot),
                ] {
                    let use_mtp = mtp && error_rate == 0.3;
                    let drafter: Box<dyn Drafter + Send> = if use_mtp {
                        // The checkpoint's own head on the device, next to the target.
                        let head = model.mtp_drafter(&ck).unwrap().unwrap();
                        assert_eq!(head.name(), "mtp (cuda)");
                        head
                    } else {
                        let mut full = case.prompt.clone();
                        full.extend_from_slice(&ids);
                        Box::new(Oracle {
                            full,
                            error_rate,
                            vocab: cpu.vocab as u32,
                            calls: 0,
                        })
                    };
                    let spec = Speculative {
                        rollback,
                        ..Speculative::new(block)
                    };
                    let (got, stream, state) = run(&model, &d, case, Some((spec, drafter)));
                    let label = format!(
                        "{name} salt {salt} block {block} err {error_rate} {rollback:?} max {} eos {:?} stop {:?} cancel {:?}",
                        case.config.max_new_tokens, case.eos, case.config.stop_strings, case.cancel_after
                    );
                    assert_eq!(got.token_ids, want.token_ids, "{label}");
                    assert_eq!(got.reason, want.reason, "{label}");
                    assert_eq!(got.text, want.text, "{label}");
                    assert_eq!(stream, got.text, "{label}: deltas");
                    assert!(
                        probe(&model, state) == want_probe,
                        "{label}: the state left behind differs from the sequential run's"
                    );
                    let s = got.spec.as_ref().unwrap();
                    if use_mtp {
                        mtp_rounds += s.rounds;
                        mtp_accepted += s.accepted;
                    }
                    if s.rounds > 0 && s.accepted == s.proposed {
                        branches.insert("all accepted");
                    }
                    if s.rollbacks > 0 {
                        branches.insert("rollback");
                    }
                    branches.insert(match got.reason {
                        StopReason::StopToken(_) => "stop token",
                        StopReason::StopString(_) => "stop string",
                        StopReason::MaxTokens => "max tokens",
                        StopReason::Cancelled => "cancelled",
                        StopReason::ContextFull => "context",
                    });
                    runs += 1;
                }
            }
        }
    }
    for b in [
        "all accepted",
        "rollback",
        "stop token",
        "stop string",
        "max tokens",
        "cancelled",
    ] {
        assert!(
            branches.contains(b),
            "{name}: branch '{b}' never ran: {branches:?}"
        );
    }
    if mtp {
        println!("{name}: MTP head on the device accepted {mtp_accepted} in {mtp_rounds} rounds");
        assert!(mtp_rounds > 0);
    }
    assert_eq!(runs, 3 * 6 * 8 * 4);
}

#[test]
fn greedy_speculative_equals_sequential_on_cuda_hybrid() {
    check_greedy_exactness("qwen3_5", true);
}

#[test]
fn greedy_speculative_equals_sequential_on_cuda_dense() {
    check_greedy_exactness("qwen3", false);
}

/// Top-k 8, top-p 0.95, with a repetition penalty or without (then the device answers with the rows'
/// candidates instead of the rows: `Wanted::candidates`).
fn sampled(seed: u64, max: usize, penalty: bool) -> GenerationConfig {
    GenerationConfig {
        seed,
        shaping: Shaping {
            temperature: 1.0,
            top_k: 8,
            top_p: 0.95,
            repetition_penalty: if penalty { 1.1 } else { 1.0 },
            ..Shaping::greedy()
        },
        ..GenerationConfig::greedy(max)
    }
}

/// A seeded sampled run is a function of the seed: rerun equal, fresh vs reused device state equal,
/// and equal to the CPU engine's run (f32 weights, so the logits agree to ~1e-6 and every draw lands
/// on the same token), for sequential decoding and for speculative decoding with the model's drafter.
fn check_sampled_determinism(name: &str) {
    let (ck, cpu) = fixture(name);
    let gpu = cuda(&ck, exact());
    let cpu_model = Model::Cpu(cpu.clone());
    let d = detok(cpu.vocab as u32);
    let p = prompt(&cpu, 12, 5);
    let greedy_ids = run(&gpu, &d, &greedy_case(p.clone(), 24), None).0.token_ids;
    let drafter = |model: &Model, full: &[u32]| -> Box<dyn Drafter + Send> {
        match model.mtp_drafter(&ck).unwrap() {
            Some(head) => head,
            None => Box::new(Oracle {
                full: full.to_vec(),
                error_rate: 0.3,
                vocab: cpu.vocab as u32,
                calls: 0,
            }),
        }
    };
    let mut full = p.clone();
    full.extend_from_slice(&greedy_ids);
    let mut streams = std::collections::BTreeSet::new();
    for (seed, penalty) in (0..4u64).flat_map(|s| [(s, true), (s, false)]) {
        let case = Case {
            config: sampled(seed, 24, penalty),
            ..greedy_case(p.clone(), 24)
        };
        for block in [None, Some(3)] {
            let spec = |model: &Model| block.map(|b| (Speculative::new(b), drafter(model, &full)));
            let (a, _, _) = run(&gpu, &d, &case, spec(&gpu));
            let (b, _, _) = run(&gpu, &d, &case, spec(&gpu));
            let (c, _, _) = run(&cpu_model, &d, &case, spec(&cpu_model));
            let label = format!("{name} seed {seed} penalty {penalty} block {block:?}");
            assert_eq!(a.token_ids.len(), 24, "{label}");
            assert_eq!(a.token_ids, b.token_ids, "{label}: rerun");
            assert_eq!(a.text, b.text, "{label}: rerun text");
            assert_eq!(a.token_ids, c.token_ids, "{label}: CUDA vs CPU");
            if block.is_none() {
                streams.insert(a.token_ids.clone());
            }
        }
    }
    // Sampling is really on: the seeds give different streams, not the greedy one.
    assert!(
        streams.len() >= 3,
        "{name}: {} distinct streams",
        streams.len()
    );
    assert!(
        !streams.contains(&greedy_ids),
        "{name}: a sampled run was greedy"
    );
}

#[test]
fn seeded_sampled_runs_reproduce_on_cuda_hybrid() {
    check_sampled_determinism("qwen3_5");
}

#[test]
fn seeded_sampled_runs_reproduce_on_cuda_dense() {
    check_sampled_determinism("qwen3");
}

/// Log-probabilities on the device path (whole logits rows back from the device): a speculative run
/// (drafter on the device) reports the sequential run's entries bit for bit with the product's options,
/// and with the CPU engine's arithmetic (f32 weights) the entries equal the CPU engine's to f32 rounding.
#[test]
fn logprobs_on_cuda_match_speculation_and_the_cpu_engine() {
    for name in ["qwen3_5", "qwen3"] {
        let (ck, cpu) = fixture(name);
        let d = detok(cpu.vocab as u32);
        let p = prompt(&cpu, 12, 7);
        let case = Case {
            config: GenerationConfig {
                logprobs: Some(4),
                ..GenerationConfig::greedy(20)
            },
            ..greedy_case(p.clone(), 20)
        };
        let gpu = cuda(&ck, LoadOptions::default());
        let (seq, _, _) = run(&gpu, &d, &case, None);
        assert_eq!(seq.logprobs.len(), 20, "{name}");
        let full = [p.clone(), seq.token_ids.clone()].concat();
        let drafter: Box<dyn Drafter + Send> = match gpu.mtp_drafter(&ck).unwrap() {
            Some(head) => head,
            None => Box::new(Oracle {
                full,
                error_rate: 0.3,
                vocab: cpu.vocab as u32,
                calls: 0,
            }),
        };
        let (spec, _, _) = run(&gpu, &d, &case, Some((Speculative::new(3), drafter)));
        assert_eq!(spec.token_ids, seq.token_ids, "{name}");
        assert_eq!(
            spec.logprobs, seq.logprobs,
            "{name}: speculative == sequential"
        );
        let (exact_gpu, _, _) = run(&cuda(&ck, exact()), &d, &case, None);
        let (host, _, _) = run(&Model::Cpu(cpu.clone()), &d, &case, None);
        assert_eq!(exact_gpu.token_ids, host.token_ids, "{name}");
        for (i, (g, h)) in exact_gpu.logprobs.iter().zip(&host.logprobs).enumerate() {
            assert!((g.logprob - h.logprob).abs() < 1e-4, "{name} token {i}");
            // Near-equal alternatives may swap places: compare the values in order.
            for (a, b) in g.top.iter().zip(&h.top) {
                assert!((a.1 - b.1).abs() < 1e-4, "{name} token {i}: {g:?} vs {h:?}");
            }
        }
    }
}

/// The real Qwen3 vocabulary and tokenizer: the CUDA greedy stream equals the CPU engine's, ids and text.
#[test]
fn cuda_greedy_stream_equals_cpu_stream_with_the_real_tokenizer() {
    let (ck, cpu) = fixture("qwen3_realtok");
    let tokenizer = ck.tokenizer().unwrap();
    let gpu = cuda(&ck, exact());
    let cpu_model = Model::Cpu(cpu);
    for text in [
        "The quick brown fox jumps over the lazy dog.",
        "fn main() {\n    println!(\"héllo, wörld\");\n}",
        "Speculative decoding verifies a block of drafted tokens in one forward pass, and",
    ] {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let case = greedy_case(ids, 40);
        let (want, want_stream, _) = run(&cpu_model, &tokenizer, &case, None);
        let (got, stream, _) = run(&gpu, &tokenizer, &case, None);
        assert_eq!(got.token_ids, want.token_ids, "{text:?}");
        assert_eq!(got.text, want.text, "{text:?}");
        assert_eq!(stream, want_stream, "{text:?}");
        assert_eq!(got.reason, StopReason::MaxTokens);
        assert!(!got.text.is_empty());
    }
}

/// A device session reuses what its state covers (pure continuation, and the hybrid fork checkpoint
/// restored on the device) and continues exactly as a fresh session.
#[test]
fn cuda_session_reuses_its_prefix() {
    for name in ["qwen3", "qwen3_5"] {
        let (ck, cpu) = fixture(name);
        // f32 passes of every size: a reused prefix skips the long prefill pass, which under the
        // default options rounds activations to bf16 for cuBLAS, so only exact options make "reused
        // equals fresh" a question about the state rather than about rounding.
        let model = cuda(&ck, exact());
        let d = detok(cpu.vocab as u32);
        let turn = |session: &mut Session<ModelState>, p: &[u32]| {
            let cfg = GenerationConfig::greedy(10);
            let req = Request {
                prompt: p,
                config: &cfg,
                eos: &[],
                detok: &d,
                speculative: None,
                cancel: CancelFlag::new(),
            };
            generate(&model, session, &req, &mut |_| {}).unwrap()
        };
        let first = prompt(&cpu, 30, 1);
        let mut session = Session::open(&model).unwrap();
        let r1 = turn(&mut session, &first);
        let mut second = first.clone();
        second.extend_from_slice(&r1.token_ids);
        second.extend_from_slice(&prompt(&cpu, 7, 7));
        let r2 = turn(&mut session, &second);
        assert_eq!(r2.reused_tokens, first.len() + r1.token_ids.len() - 1);
        let fresh = turn(&mut Session::open(&model).unwrap(), &second);
        assert_eq!(r2.token_ids, fresh.token_ids, "{name}: continuation");
        // Regenerate: all but the last prompt token reused (hybrids via the fork checkpoint).
        let r3 = turn(&mut session, &second);
        assert_eq!(r3.reused_tokens, second.len() - 1, "{name}: regenerate");
        assert_eq!(r3.token_ids, fresh.token_ids, "{name}: regenerate");
        // A diverging prompt: the state is reset (hybrid) or rewound (dense) on the device.
        let mut diverged = second[..20].to_vec();
        diverged.extend_from_slice(&prompt(&cpu, 5, 11));
        let r4 = turn(&mut session, &diverged);
        let fresh4 = turn(&mut Session::open(&model).unwrap(), &diverged);
        assert_eq!(r4.token_ids, fresh4.token_ids, "{name}: diverged");
        assert_eq!(r4.reused_tokens, if name == "qwen3" { 20 } else { 0 });
    }
}

/// A CPU state cannot be driven by a GPU model (and vice versa): one clear error, no panic.
#[test]
fn a_state_of_the_other_device_is_refused() {
    let (ck, cpu) = fixture("qwen3");
    let gpu = cuda(&ck, exact());
    let mut cpu_state = Model::Cpu(cpu).new_state().unwrap();
    let err = gpu
        .forward(&[1, 2], 0, &mut cpu_state, &Wanted::last())
        .unwrap_err();
    assert!(err.to_string().contains("cpu state"), "{err}");
}

/// A copy of fixture `name` in a fresh directory whose embedding row `token` is NaN: feeding that token
/// makes every later row's logits NaN, while the rows before it are untouched (the qwen3 fixture's LM
/// head is not tied to the embeddings).
fn with_nan_embedding(name: &str, token: u32) -> Checkpoint {
    let src = testdata::fixture(name);
    let dir = std::env::temp_dir().join(format!(
        "turbospark-nan-embed-{name}-{token}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let embed = &header["model.embed_tokens.weight"];
    assert_eq!(embed["dtype"], "F32");
    let hidden = embed["shape"][1].as_u64().unwrap() as usize;
    let at =
        8 + n + embed["data_offsets"][0].as_u64().unwrap() as usize + token as usize * hidden * 4;
    for v in bytes[at..at + hidden * 4].chunks_exact_mut(4) {
        v.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    Checkpoint::open(&dir).unwrap()
}

/// Greedy sequential decoding on the device chains its steps (the token queued before it is read): a
/// row it must refuse (NaN logits) ends the generation with an error naming the position, and the
/// session forgets its tokens, since the state may hold a step past them. Without the NaN the same
/// generation runs, and the session covers the prompt and every token but the last.
#[test]
fn a_refused_row_ends_a_chained_generation_with_an_error() {
    let (ck, cpu) = fixture("qwen3");
    let d = detok(cpu.vocab as u32);
    let p = prompt(&cpu, 6, 3);
    let clean = cuda(&ck, LoadOptions::default());
    let (want, _, _) = run(&clean, &d, &greedy_case(p.clone(), 12), None);
    // The first generated token that the prompt and the tokens before it do not hold.
    let k = (1..want.token_ids.len())
        .find(|&k| {
            let t = want.token_ids[k];
            !p.contains(&t) && !want.token_ids[..k].contains(&t)
        })
        .expect("a fresh token among the greedy ones");
    let poisoned = cuda(
        &with_nan_embedding("qwen3", want.token_ids[k]),
        LoadOptions::default(),
    );
    let mut session = Session::open(&poisoned).unwrap();
    let config = GenerationConfig::greedy(12);
    let req = Request {
        prompt: &p,
        config: &config,
        eos: &[],
        detok: &d,
        speculative: None,
        cancel: CancelFlag::new(),
    };
    let err = generate(&poisoned, &mut session, &req, &mut |_| {}).unwrap_err();
    let at = p.len() + k;
    assert!(
        err.to_string().contains(&format!("position {at}")) && err.to_string().contains("NaN"),
        "{err}"
    );
    assert!(
        session.tokens().is_empty(),
        "the session keeps no tokens after a failed chain"
    );
    // The clean model's session: the prompt and the generated tokens but the last (never run).
    let mut session = Session::open(&clean).unwrap();
    let r = generate(&clean, &mut session, &req, &mut |_| {}).unwrap();
    assert_eq!(r.token_ids, want.token_ids);
    let mut covered = p.clone();
    covered.extend_from_slice(&want.token_ids[..want.token_ids.len() - 1]);
    assert_eq!(session.tokens(), &covered[..]);
    assert_eq!(session.state().position(), covered.len());
}

/// The CLI's path on the device: the engine opened on the (emulated) GPU with the product's options,
/// sessions with the checkpoint's drafters from `Engine::session`: the MTP head and DFlash on the
/// device (they upload the verified final-hidden / layer-output taps); a trained drafter is accepted,
/// which random proposals are not, and the greedy stream equals sequential decoding on the device.
#[test]
fn testbed_drafters_run_on_the_device_taps() {
    let dir = std::env::var_os("TURBOSPARK_TESTBED").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed"),
        std::path::PathBuf::from,
    );
    let engine = Engine::open_on(&dir, Device::CudaEmulated).unwrap();
    assert_eq!(engine.model.device_name(), "cuda (host emulation)");
    let prompt = engine
        .encode("def read_config(path):\n    \"\"\"Read a JSON file.\"\"\"\n    import json\n")
        .unwrap();
    let generate_with = |plan: &SpeculationPlan, rollback: Rollback| {
        let mut session = engine.session(plan).unwrap();
        let speculative = match plan {
            SpeculationPlan::Enabled { block, .. } => Some(Speculative {
                rollback,
                ..Speculative::new(*block)
            }),
            SpeculationPlan::Disabled { .. } => None,
        };
        let cfg = GenerationConfig::greedy(48);
        let req = Request {
            prompt: &prompt,
            config: &cfg,
            eos: &[],
            detok: &engine.tokenizer,
            speculative,
            cancel: CancelFlag::new(),
        };
        generate(&engine.model, &mut session, &req, &mut |_| {}).unwrap()
    };
    // Verify passes stay on the batch-invariant kernel (16 rows by default): a larger named block is
    // refused on the device, as it would not reproduce sequential decoding; the CPU serves it.
    let max = engine.model.max_exact_block().unwrap();
    let err = engine
        .plan(Speculation::Block(max + 1), DrafterRequest::Mtp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("batch-invariant"), "{err}");
    assert!(engine
        .plan(Speculation::Block(max), DrafterRequest::Mtp)
        .is_ok());
    let on_cpu = Engine::open_on(&dir, Device::Cpu).unwrap();
    assert!(on_cpu
        .plan(Speculation::Block(max + 1), DrafterRequest::Mtp)
        .is_ok());
    let off = engine.plan(Speculation::Off, DrafterRequest::Auto).unwrap();
    let sequential = generate_with(&off, Rollback::Tape);
    assert_eq!(sequential.token_ids.len(), 48);
    for (drafter, block) in [(DrafterRequest::Mtp, 3), (DrafterRequest::Dflash, 7)] {
        let plan = engine.plan(Speculation::Block(block), drafter).unwrap();
        // Both drafters run on the target's device.
        let name = engine.session(&plan).unwrap().drafter_name();
        let want = match drafter {
            DrafterRequest::Mtp => "mtp (cuda)",
            _ => "dflash (cuda)",
        };
        assert_eq!(name, Some(want));
        for rollback in [Rollback::Tape, Rollback::Snapshot] {
            let got = generate_with(&plan, rollback);
            let label = format!("{drafter:?} block {block} {rollback:?}");
            assert_eq!(got.token_ids, sequential.token_ids, "{label}");
            assert_eq!(got.text, sequential.text, "{label}");
            let s = got.spec.unwrap();
            println!(
                "{label}: accepted {} of {} in {} rounds",
                s.accepted, s.proposed, s.rounds
            );
            assert!(
                s.accepted * 5 > s.rounds,
                "{label}: the drafter is almost never accepted"
            );
        }
    }
    // `auto`: MTP (on the device, mixed with the suffix drafter) with its block tuned as the run goes,
    // block 0 (plain steps) among the choices; the stream stays sequential's, and the session's second
    // generation continues the first one's tuner.
    let plan = engine
        .plan(Speculation::Auto, DrafterRequest::Auto)
        .unwrap();
    let SpeculationPlan::Enabled {
        block,
        tune_up_to: Some(max),
        ..
    } = plan
    else {
        panic!("auto on the testbed: {plan:?}");
    };
    let mut session = engine.session(&plan).unwrap();
    // `auto` mixes the device's MTP head with the suffix drafter round by round.
    assert_eq!(session.drafter_name(), Some("mtp+suffix"));
    let mut rounds = 0;
    for turn in 0..2 {
        let cfg = GenerationConfig::greedy(48);
        let req = Request {
            prompt: &prompt,
            config: &cfg,
            eos: &[],
            detok: &engine.tokenizer,
            speculative: Some(Speculative::tuned(block, max)),
            cancel: CancelFlag::new(),
        };
        let got = generate(&engine.model, &mut session, &req, &mut |_| {}).unwrap();
        assert_eq!(got.token_ids, sequential.token_ids, "auto, turn {turn}");
        let now = session
            .block_tuner()
            .expect("a tuned run keeps its tuner")
            .rounds();
        assert!(now > rounds, "turn {turn}: the tuner did not continue");
        rounds = now;
    }
}

/// A drafter on the device drafts what its host twin drafts: on the testbed (trained drafters, real
/// acceptance), the engine's session (the drafter on the device, fed the verified taps) and a session
/// with the host drafter reading the device's taps give the same tokens as sequential decoding *and*
/// the same rounds, proposals and per-position acceptance, at several blocks and prompts (prompts
/// over 16 tokens observe their prefill rows in one pass). With TURBOSPARK_TEST_GPU the engine runs on
/// the GPU, whose kernels sum in another order than the host's, so near-ties may draft differently:
/// the tokens must still equal sequential decoding; the counts are compared on the emulation.
fn device_drafter_drafts_what_the_host_drafts(
    request: DrafterRequest,
    device_name: &str,
    host_drafter: impl Fn(&Engine) -> Box<dyn Drafter + Send>,
    blocks: &[usize],
) {
    let dir = std::env::var_os("TURBOSPARK_TESTBED").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed"),
        std::path::PathBuf::from,
    );
    let on_gpu = std::env::var_os("TURBOSPARK_TEST_GPU").is_some();
    let device = if on_gpu {
        Device::Cuda
    } else {
        Device::CudaEmulated
    };
    let engine = Engine::open_on(&dir, device).unwrap();
    for text in [
        "def read_config(path):\n    \"\"\"Read a JSON file.\"\"\"\n    import json\n",
        "Call me Ishmael. Some years ago",
    ] {
        let prompt = engine.encode(text).unwrap();
        let run = |session: &mut Session<ModelState>, block: Option<usize>| {
            let cfg = GenerationConfig::greedy(40);
            let req = Request {
                prompt: &prompt,
                config: &cfg,
                eos: &[],
                detok: &engine.tokenizer,
                speculative: block.map(Speculative::new),
                cancel: CancelFlag::new(),
            };
            generate(&engine.model, session, &req, &mut |_| {}).unwrap()
        };
        let off = engine.plan(Speculation::Off, DrafterRequest::Auto).unwrap();
        let sequential = run(&mut engine.session(&off).unwrap(), None);
        for &block in blocks {
            let plan = engine.plan(Speculation::Block(block), request).unwrap();
            let mut device_session = engine.session(&plan).unwrap();
            assert_eq!(device_session.drafter_name(), Some(device_name));
            let dev = run(&mut device_session, Some(block));
            let mut host_session = Session::open(&engine.model)
                .unwrap()
                .with_drafter(host_drafter(&engine));
            let host = run(&mut host_session, Some(block));
            let label = format!("{device_name} {text:?} block {block}");
            assert_eq!(dev.token_ids, sequential.token_ids, "{label}");
            assert_eq!(host.token_ids, sequential.token_ids, "{label}");
            let (g, h) = (dev.spec.unwrap(), host.spec.unwrap());
            let counts = |s: &runtime::SpecStats| {
                (
                    s.rounds,
                    s.proposed,
                    s.accepted,
                    s.per_position_accepted.clone(),
                )
            };
            if !on_gpu {
                assert_eq!(counts(&g), counts(&h), "{label}: device vs host drafter");
            }
            assert!(g.accepted * 3 > g.rounds, "{label}: rarely accepted");
            println!(
                "{label}: prompt {} tokens, accepted {} of {} in {} rounds (host: {} of {} in {})",
                prompt.len(),
                g.accepted,
                g.proposed,
                g.rounds,
                h.accepted,
                h.proposed,
                h.rounds
            );
        }
    }
}

#[test]
fn gpu_mtp_drafts_what_the_host_head_drafts_on_the_testbed() {
    let host = |engine: &Engine| -> Box<dyn Drafter + Send> {
        let head = engine.model.head(&engine.checkpoint).unwrap();
        let mtp = drafters::MtpHead::load(&engine.checkpoint, head).unwrap();
        Box::new(mtp.unwrap())
    };
    device_drafter_drafts_what_the_host_drafts(DrafterRequest::Mtp, "mtp (cuda)", host, &[1, 2, 4]);
}

/// DFlash on the device: context K/V from the uploaded taps, the block's non-causal attention as one
/// regrouped row (cuda_backend::CudaDflash).
#[test]
fn gpu_dflash_drafts_what_the_host_drafter_drafts_on_the_testbed() {
    let host = |engine: &Engine| -> Box<dyn Drafter + Send> {
        let head = engine.model.head(&engine.checkpoint).unwrap();
        let dir = engine.checkpoint.dir.join("dflash");
        Box::new(drafters::DflashDrafter::load(&dir, head).unwrap())
    };
    device_drafter_drafts_what_the_host_drafts(
        DrafterRequest::Dflash,
        "dflash (cuda)",
        host,
        &[1, 3, 7],
    );
}
