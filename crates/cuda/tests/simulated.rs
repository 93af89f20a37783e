//! The CUDA kernels themselves, without a GPU: `CudaDevice::simulated` compiles `src/cu/` with the host
//! C++ compiler against the CUDA shim and runs every launch on the CPU. Checked here (the kernel
//! self-test is cuda-lab's tests/simulated_selftest.rs): a fixture forward against transformers with the state operations speculative decoding relies on
//! (verify rows == sequential decode rows, tape rollback), as cuda_check does on the device.
//! They need a C++ compiler (`$CXX` or g++) and fail, naming it, without one.

use std::path::PathBuf;
use std::sync::Arc;

use cuda_backend::{CudaDevice, CudaModel, LoadOptions, WeightFormat};
use families::Wanted;
use model_io::Checkpoint;
use safetensors::SafeTensors;

/// The kernel simulator (`src/cu/` compiled by the host C++ compiler, `$CXX` or g++). CI has g++: a
/// missing compiler fails the test rather than skipping it.
fn simulated() -> Arc<CudaDevice> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if let Err(e) = std::process::Command::new(&cxx).arg("--version").output() {
        panic!("the kernel simulator needs a C++ compiler: `{cxx} --version` failed ({e}); install g++ or set CXX");
    }
    Arc::new(CudaDevice::simulated().unwrap())
}

fn fixture(name: &str) -> PathBuf {
    testdata::fixture(name)
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn prompt_ids(st: &SafeTensors) -> Vec<u32> {
    st.tensor("prompt_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

/// A prefill over gemv_max_rows runs the chunked GDN form: its logits, and a decode row after it,
/// agree with the step form's (forced by `gdn_chunked: false`) to rounding, and are not the same bits
/// (which would mean the chunked kernels never ran). The fixture prompt (80 rows) spans two chunks.
#[test]
fn simulated_chunked_gdn_prefill_matches_step_form_prefill() {
    let dev = simulated();
    let dir = fixture("qwen3_5");
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt: Vec<u32> = st
        .tensor("prompt_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let n = prompt.len();
    assert!(
        n > 64 && n > LoadOptions::default().gemv_max_rows,
        "{n} rows"
    );
    let ck = Checkpoint::open(&dir).unwrap();
    let run = |gdn_chunked| {
        let opts = LoadOptions {
            weights: WeightFormat::AsStored,
            gdn_chunked,
            ..LoadOptions::default()
        };
        let m = CudaModel::load(&dev, &ck, opts).unwrap();
        let mut s = m.new_state(n + 4).unwrap();
        let pre = m
            .forward(&prompt, 0, &mut s, &Wanted::all())
            .unwrap()
            .logits;
        let next = kernels::argmax(&pre[(n - 1) * pre.len() / n..]) as u32;
        let step = m.forward(&[next], n, &mut s, &Wanted::last()).unwrap();
        (pre, next, step.logits)
    };
    let (chunk_pre, chunk_next, chunk_step) = run(true);
    let (step_pre, step_next, step_step) = run(false);
    let scale = step_pre.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let max_d = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    let (d_pre, d_step) = (max_d(&chunk_pre, &step_pre), max_d(&chunk_step, &step_step));
    println!(
        "chunked vs step prefill max |Δ| {d_pre:.2e}, next decode row {d_step:.2e} (scale {scale})"
    );
    assert!(d_pre <= 1e-5 * scale, "prefill logits: max |Δ| {d_pre}");
    assert_eq!(chunk_next, step_next);
    assert!(
        d_step <= 1e-5 * scale,
        "decode row after it: max |Δ| {d_step}"
    );
    assert!(!bits_eq(&chunk_pre, &step_pre), "chunked GDN not used");
}

#[test]
fn simulated_hybrid_forward_matches_transformers_and_verify_rows_equal_decode_rows() {
    let dev = simulated();
    check_hybrid(&dev, "qwen3_5");
}

/// The dense Qwen3 shape: four attention layers, so a pass's later layers read the RoPE table.
#[test]
fn simulated_dense_forward_matches_transformers_and_verify_rows_equal_decode_rows() {
    let dev = simulated();
    check_hybrid(&dev, "qwen3");
}

/// Qwen3-Next's re-laid-out GDN projections and the MoE kernels (moe_route, moe_gate_up, moe_down).
#[test]
fn simulated_qwen3_next_moe_matches_transformers_and_verify_rows_equal_decode_rows() {
    let dev = simulated();
    check_hybrid(&dev, "qwen3_next");
}

/// One pass vs transformers (1e-3), then 4 greedy decode rows == the same 4 as one verify block
/// (bitwise), and tape rollback to 2 then a step == the decode row (bitwise).
fn check_hybrid(dev: &Arc<CudaDevice>, name: &str) {
    let dir = fixture(name);
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = prompt_ids(&st);
    let want: Vec<f32> = st
        .tensor("logits_full")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let ck = Checkpoint::open(&dir).unwrap();
    // f32 weights as stored; default row limits, so verify blocks take the GEMV path and the prompt the
    // (host) GEMM path, as on the device.
    let opts = LoadOptions {
        weights: WeightFormat::AsStored,
        ..LoadOptions::default()
    };
    let m = CudaModel::load(dev, &ck, opts).unwrap();
    let n = prompt.len();
    let mut seq = m.new_state(n + 16).unwrap();
    let out = m.forward(&prompt, 0, &mut seq, &Wanted::all()).unwrap();
    let d = out
        .logits
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(d <= 1e-3, "{name}: one pass vs transformers max |Δ| {d}");
    println!("{name}: simulated one pass vs transformers max |Δ| {d:.2e}");
    // Sequential decode of 4 greedy tokens, then the same 4 as one verify block on a fresh state.
    let mut next = kernels::argmax(out.row(n - 1)) as u32;
    let (mut drafts, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        drafts.push(next);
        let o = m
            .forward(&[next], seq.position(), &mut seq, &Wanted::last())
            .unwrap();
        next = kernels::argmax(o.row(0)) as u32;
        rows.push(o.logits);
    }
    let mut spec = m.new_state(n + 16).unwrap();
    m.forward(&prompt, 0, &mut spec, &Wanted::none()).unwrap();
    m.begin_tape(&mut spec).unwrap();
    let verify = m.forward(&drafts, n, &mut spec, &Wanted::all()).unwrap();
    assert!(
        bits_eq(&verify.logits, &rows.concat()),
        "{name}: verify rows differ"
    );
    assert!(m.rollback_retaining(&mut spec, 2).unwrap());
    let after = m
        .forward(&drafts[2..3], n + 2, &mut spec, &Wanted::last())
        .unwrap();
    assert!(
        bits_eq(&after.logits, &rows[2]),
        "{name}: rollback then step differs"
    );
    // Every attention layer computing its own RoPE cos / sin gives the same bits as the later layers
    // reading the first one's (LoadOptions::rope_table), for the prompt and for the decode rows.
    let own = CudaModel::load(
        dev,
        &ck,
        LoadOptions {
            rope_table: false,
            ..opts
        },
    )
    .unwrap();
    let mut seq = own.new_state(n + 16).unwrap();
    let prompt_own = own.forward(&prompt, 0, &mut seq, &Wanted::all()).unwrap();
    assert!(
        bits_eq(&prompt_own.logits, &out.logits),
        "{name}: prompt pass with per-layer RoPE differs"
    );
    for (t, row) in drafts.iter().zip(&rows) {
        let o = own
            .forward(&[*t], seq.position(), &mut seq, &Wanted::last())
            .unwrap();
        assert!(
            bits_eq(&o.logits, row),
            "{name}: decode row with per-layer RoPE differs"
        );
    }
}

#[test]
fn simulated_tensor_core_gemv_agrees_with_fma_and_verify_rows_equal_decode_rows() {
    let dev = simulated();
    let ck = Checkpoint::open(&fixture("qwen3_5")).unwrap();
    let load = |tensor_core_gemv| {
        let opts = LoadOptions {
            weights: WeightFormat::Bf16,
            tensor_core_gemv,
            ..LoadOptions::default()
        };
        CudaModel::load(&dev, &ck, opts).unwrap()
    };
    let (fma, tc) = (load(false), load(true));
    // Short enough that every row stays on the GEMV path.
    let prompt = [3u32, 17, 5, 42, 8, 11];
    let n = prompt.len();
    let run = |m: &CudaModel| {
        let mut s = m.new_state(n + 16).unwrap();
        let out = m.forward(&prompt, 0, &mut s, &Wanted::all()).unwrap();
        (out, s)
    };
    let (a, _) = run(&fma);
    let (b, mut seq) = run(&tc);
    let scale = a.logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = a
        .logits
        .iter()
        .zip(&b.logits)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(
        d <= 1e-5 * scale.max(1.0),
        "tensor cores vs FMA max |Δ| {d}"
    );
    // Different summation order: equal bits would mean the tensor-core kernel never ran.
    assert!(!bits_eq(&a.logits, &b.logits), "tensor-core GEMV not used");
    let mut next = kernels::argmax(b.row(n - 1)) as u32;
    let (mut drafts, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        drafts.push(next);
        let o = tc
            .forward(&[next], seq.position(), &mut seq, &Wanted::last())
            .unwrap();
        next = kernels::argmax(o.row(0)) as u32;
        rows.push(o.logits);
    }
    let mut spec = tc.new_state(n + 16).unwrap();
    tc.forward(&prompt, 0, &mut spec, &Wanted::none()).unwrap();
    let verify = tc.forward(&drafts, n, &mut spec, &Wanted::all()).unwrap();
    assert!(
        bits_eq(&verify.logits, &rows.concat()),
        "tensor-core verify rows differ from decode rows"
    );
}

/// Prefill passes (more rows than gemv_max_rows) over bf16 matrices run attention on the tensor cores
/// (bf16 operands, f32 softmax). The fixture prompt's logits agree with the f32 split-K kernels far
/// inside the error bf16 activations already cost the prefill (its logits vs f32 activations, the
/// GEMV path throughout): in one pass (key splits from the shape, or one), and in passes of 32 rows
/// whose later passes attend to the cache rows of earlier ones (3 key splits, attn_tc_combine).
#[test]
fn simulated_tensor_core_prefill_attention_agrees_with_split_k() {
    let dev = simulated();
    let dir = fixture("qwen3_5");
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let prompt = prompt_ids(&SafeTensors::deserialize(&bytes).unwrap());
    // The second pass of 32 rows (start 32) must be a prefill pass too.
    assert!(prompt.len() >= 2 * 32 && 32 > LoadOptions::default().gemv_max_rows);
    let ck = Checkpoint::open(&dir).unwrap();
    let logits = |opts: LoadOptions| {
        let m = CudaModel::load(&dev, &ck, opts).unwrap();
        let mut s = m.new_state(prompt.len()).unwrap();
        m.forward(&prompt, 0, &mut s, &Wanted::all())
            .unwrap()
            .logits
    };
    let max_abs = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    let bf16 = LoadOptions {
        weights: WeightFormat::Bf16,
        ..LoadOptions::default()
    };
    let f32_act = logits(LoadOptions {
        gemv_max_rows: usize::MAX,
        ..bf16
    });
    let split_k = |max_pass_rows| {
        logits(LoadOptions {
            attention_tc: false,
            max_pass_rows,
            ..bf16
        })
    };
    let budget = max_abs(&split_k(512), &f32_act);
    for (splits, pass) in [(0, 512), (1, 512), (3, 32)] {
        // Same passes on both sides (the last pass of 80 / 32 is a GEMV pass, with f32 activations).
        let want = split_k(pass);
        let got = logits(LoadOptions {
            attention_tc_splits: splits,
            max_pass_rows: pass,
            ..bf16
        });
        let d = max_abs(&got, &want);
        println!(
            "tensor-core prefill attention ({splits} splits, passes of {pass}): max |Δ| {d:.2e} vs \
             split-K; bf16 prefill vs f32 activations {budget:.2e}"
        );
        // Measured 3.5e-2 against 0.81.
        assert!(
            d <= 0.25 * budget,
            "splits {splits}, passes of {pass}: max |Δ| {d}"
        );
        assert!(!bits_eq(&got, &want), "tensor-core attention not used");
    }
}

/// `Wanted::candidates`: a sampled decode row comes back as its candidates (the device's selection, no
/// logits), they shape Qwen3's card (top-k 20) into the distribution the whole row gives, bit for bit,
/// and `last_logits` returns that row.
#[test]
fn simulated_sampled_rows_come_back_as_candidates_with_the_rows_distribution() {
    let dev = simulated();
    let dir = fixture("qwen3_5");
    let ck = Checkpoint::open(&dir).unwrap();
    let m = CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap();
    let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % m.vocab as u32).collect();
    let shaping = sampling::Shaping {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        ..sampling::Shaping::default()
    };
    let mut s = m.new_state(16).unwrap();
    m.forward(&prompt, 0, &mut s, &Wanted::none()).unwrap();
    let snap = s.snapshot().unwrap();
    let full = m
        .forward(&[3], prompt.len(), &mut s, &Wanted::last())
        .unwrap();
    s.restore(&snap).unwrap();
    let wanted = Wanted {
        candidates: 40,
        ..Wanted::last()
    };
    let got = m.forward(&[3], prompt.len(), &mut s, &wanted).unwrap();
    let c = &got.candidates.as_ref().expect("candidates")[0];
    assert!(got.logits.is_empty() && c.ids.len() >= 40);
    let want = sampling::ShapedDistribution::new(full.row(0), &shaping, sampling::History::empty())
        .unwrap();
    let from = sampling::ShapedDistribution::from_candidates(m.vocab, &c.ids, &c.logits, &shaping)
        .unwrap()
        .expect("the candidates shape the row");
    assert_eq!(from, want);
    assert!(bits_eq(
        &m.last_logits(&mut s).unwrap().unwrap(),
        full.row(0)
    ));
}

/// `Wanted::argmax_only`: a decode row and a 3-row verify forward return the argmax of the logits the
/// same forward returns without it (the device kernel, not the host scan), and no logits.
#[test]
fn simulated_argmax_only_forwards_return_the_logits_argmax() {
    let dev = simulated();
    let dir = fixture("qwen3_5");
    let ck = Checkpoint::open(&dir).unwrap();
    let m = CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap();
    let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % m.vocab as u32).collect();
    let ids_only = |logits: families::Rows| Wanted {
        logits,
        taps: Vec::new(),
        argmax_only: true,
        candidates: 0,
    };
    let mut s = m.new_state(16).unwrap();
    m.forward(&prompt, 0, &mut s, &Wanted::none()).unwrap();
    let snap = s.snapshot().unwrap();
    for (feed, rows) in [
        (vec![3u32], families::Rows::Last),
        (vec![3, 9, 27], families::Rows::All),
    ] {
        s.restore(&snap).unwrap();
        let full = m
            .forward(
                &feed,
                prompt.len(),
                &mut s,
                &Wanted {
                    argmax_only: false,
                    candidates: 0,
                    ..ids_only(rows.clone())
                },
            )
            .unwrap();
        s.restore(&snap).unwrap();
        let ids = m
            .forward(&feed, prompt.len(), &mut s, &ids_only(rows))
            .unwrap();
        let want: Vec<u32> = (0..full.rows)
            .map(|r| kernels::argmax(full.row(r)) as u32)
            .collect();
        assert_eq!(
            ids.argmax.as_deref(),
            Some(&want[..]),
            "{} rows",
            feed.len()
        );
        assert!(ids.logits.is_empty() && full.argmax.is_none());
    }
}

/// The GPU DFlash drafter's real kernels (the regroup into one row of block × heads, split-K attention
/// over it, the multi-row GEMVs) give the host drafter's block logits: the testbed's trained drafter,
/// context from two observes of synthetic taps, several anchors. bf16 weights on both sides (the host
/// widens them exactly), so the difference is summation order only.
#[test]
fn simulated_dflash_block_matches_the_host_drafter() {
    use drafters::Drafter;
    let dev = simulated();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    let ck = Checkpoint::open(&dir).unwrap();
    let target = Arc::new(CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap());
    let cpu = Arc::new(families::load(&ck).unwrap());
    let mut host = drafters::DflashDrafter::load(&dir.join("dflash"), cpu).unwrap();
    let mut gpu = cuda_backend::CudaDflash::load(&target, &dir.join("dflash")).unwrap();
    assert_eq!(gpu.taps(), host.taps());
    let (h, vocab, tap_count) = (target.hidden, target.vocab, host.taps().len());
    let taps_of = |rows: std::ops::Range<usize>| -> Vec<Vec<f32>> {
        (0..tap_count)
            .map(|t| {
                rows.clone()
                    .flat_map(|r| {
                        (0..h).map(move |i| {
                            ((r * 7919 + i * 104_729 + t * 31) % 2001) as f32 / 1000.0 - 1.0
                        })
                    })
                    .collect()
            })
            .collect()
    };
    for (rows, anchors) in [(0..5, [17u32, 400]), (5..7, [3, 8000])] {
        let n = rows.len();
        let taps = taps_of(rows);
        let next = vec![0u32; n];
        host.observe(&taps, n, &next).unwrap();
        gpu.observe(&taps, n, &next).unwrap();
        for anchor in anchors {
            let want = host.block_logits(anchor).unwrap();
            let got = gpu.block_logits(anchor).unwrap();
            let want = &want[vocab..]; // the host's rows include the anchor row
            assert_eq!(got.len(), want.len());
            let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let err = got
                .iter()
                .zip(want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            println!(
                "dflash block at {} rows, anchor {anchor}: max |diff| {err:.2e} of {scale:.2}",
                host.position()
            );
            assert!(
                err <= 1e-4 * scale.max(1.0),
                "anchor {anchor}: {err} (scale {scale})"
            );
        }
    }
}

/// Decode steps whose GEMV runs go through the persistent segment kernel (segment.rs; its grid barrier,
/// mbarrier ring and bulk copies emulated by the simulator) give the per-GEMV launches' logits bit for
/// bit, and so equal verify rows; the segment kernel must actually have run.
#[test]
fn simulated_segments_equal_per_gemv_launches() {
    let dev = simulated();
    check_segments(&dev, &fixture("qwen3_5"));
}

/// The testbed's value heads (48 wide) split over two gdn_rec blocks, so its segments also take each
/// GDN layer's gated norm into their staging (segment::defer_gated_norm).
#[test]
fn simulated_segments_with_staged_gated_norms_equal_per_gemv_launches() {
    let dev = simulated();
    let before = dev.segment_staged_norms();
    check_segments(
        &dev,
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed"),
    );
    assert!(
        dev.segment_staged_norms() > before,
        "no gated norm was staged by a segment"
    );
}

fn check_segments(dev: &Arc<CudaDevice>, dir: &std::path::Path) {
    assert!(dev.segment_status().is_ok(), "{:?}", dev.segment_status());
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let prompt = prompt_ids(&SafeTensors::deserialize(&bytes).unwrap());
    let n = prompt.len();
    let ck = Checkpoint::open(dir).unwrap();
    // bf16 weights: segments run bf16 matrices only.
    let decode = |segments: bool| {
        let opts = LoadOptions {
            weights: WeightFormat::Bf16,
            segments,
            ..LoadOptions::default()
        };
        let m = CudaModel::load(dev, &ck, opts).unwrap();
        let mut st = m.new_state(n + 8).unwrap();
        let out = m.forward(&prompt, 0, &mut st, &Wanted::last()).unwrap();
        let before = dev.segment_launches();
        let mut next = kernels::argmax(out.row(0)) as u32;
        let (mut tokens, mut rows) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            tokens.push(next);
            let o = m
                .forward(&[next], st.position(), &mut st, &Wanted::last())
                .unwrap();
            next = kernels::argmax(o.row(0)) as u32;
            rows.push(o.logits);
        }
        (m, tokens, rows.concat(), dev.segment_launches() - before)
    };
    let (_, tokens, plain, none) = decode(false);
    let (m, seg_tokens, segmented, launches) = decode(true);
    assert_eq!(none, 0, "segments ran although turned off");
    assert!(
        launches >= 3,
        "the decode steps ran {launches} segment kernels"
    );
    assert_eq!(tokens, seg_tokens);
    assert!(
        bits_eq(&plain, &segmented),
        "segmented decode rows differ from per-GEMV launches"
    );
    // The same rows as one verify block (multi-row GEMVs, no segments).
    let mut spec = m.new_state(n + 8).unwrap();
    m.forward(&prompt, 0, &mut spec, &Wanted::none()).unwrap();
    let verify = m.forward(&tokens, n, &mut spec, &Wanted::all()).unwrap();
    assert!(
        bits_eq(&verify.logits, &segmented),
        "verify rows differ from segmented decode rows"
    );
}

/// Greedy chains (chain.rs) with the real kernels: the argmax kernel feeding the next step and storing
/// the token pair in host memory, the GDN layers alternating buffer pairs (the testbed's fused
/// gdn_step_into; the qwen3_5 fixture's heads are too narrow for it and copy first). A chain stopped
/// after 2 tokens (one more step queued, then dropped) gives the sequential tokens, and the state then
/// continues as the sequential one, bit for bit.
#[test]
fn simulated_greedy_chains_equal_sequential_steps() {
    let dev = simulated();
    let testbed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    for dir in [fixture("qwen3_5"), fixture("qwen3"), testbed] {
        let ck = Checkpoint::open(&dir).unwrap();
        let m = CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap();
        let prompt = [3u32, 17, 5, 42];
        let n = prompt.len();
        let mut seq = m.new_state(n + 8).unwrap();
        let out = m.forward(&prompt, 0, &mut seq, &Wanted::last()).unwrap();
        let mut tokens = vec![kernels::argmax(out.row(0)) as u32];
        let mut rows = Vec::new();
        for _ in 0..3 {
            let t = *tokens.last().unwrap();
            let o = m
                .forward(&[t], seq.position(), &mut seq, &Wanted::last())
                .unwrap();
            tokens.push(kernels::argmax(o.row(0)) as u32);
            rows.push(o.logits);
        }
        let mut chained = m.new_state(n + 8).unwrap();
        m.forward(&prompt, 0, &mut chained, &Wanted::none())
            .unwrap();
        let mut got = Vec::new();
        let kept = m
            .greedy_chain(tokens[0], n, &mut chained, 3, &mut |t| {
                got.push(t);
                got.len() < 2
            })
            .unwrap();
        let name = dir.display();
        assert_eq!((kept, &got[..]), (Some(2), &tokens[1..3]), "{name}");
        assert_eq!(chained.position(), n + 2, "{name}");
        let next = m
            .forward(&tokens[2..3], n + 2, &mut chained, &Wanted::last())
            .unwrap();
        assert!(
            bits_eq(&next.logits, &rows[2]),
            "{name}: the state after a chain differs from the sequential one"
        );
    }
}
