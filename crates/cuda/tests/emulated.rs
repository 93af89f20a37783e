//! The backend's host side on the host-emulated device (no GPU needed): fused weight layouts, scratch
//! strides, multi-pass forwards, KV and recurrent state, tape replay and snapshots, against transformers'
//! reference logits and the CPU engine. The GPU kernels themselves are checked on the device by
//! `cuda_check` (kernel self-test); here each operation runs as the CPU engine computes it.

use std::path::PathBuf;
use std::sync::Arc;

use cuda_backend::{CudaDevice, CudaModel, LoadOptions, WeightFormat};
use families::{Rows, Tap, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    testdata::fixture(name)
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn ids(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn exact() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::AsStored,
        gemv_max_rows: usize::MAX,
        graphs: true,
        verify_graphs: false,
        tensor_core_gemv: false,
        max_pass_rows: 512,
        gdn_chunked: true,
        attention_tc: true,
        attention_tc_splits: 0,
        segments: false,
        rope_table: true,
        chain: true,
        candidates: true,
    }
}

fn load(name: &str, opts: LoadOptions) -> (Checkpoint, CudaModel) {
    let ck = Checkpoint::open(&fixture(name)).unwrap();
    let dev = Arc::new(CudaDevice::emulated());
    let m = CudaModel::load(&dev, &ck, opts).unwrap();
    (ck, m)
}

fn chunks(m: &CudaModel, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = m.new_state(prompt.len() + 8).unwrap();
    let mut out = Vec::new();
    for (i, c) in prompt.chunks(chunk).enumerate() {
        out.extend(
            m.forward(c, i * chunk, &mut st, &Wanted::all())
                .unwrap()
                .logits,
        );
    }
    assert_eq!(st.position(), prompt.len());
    out
}

fn greedy(m: &CudaModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut st = m.new_state(prompt.len() + n + 1).unwrap();
    let mut out = m.forward(prompt, 0, &mut st, &Wanted::last()).unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let next = kernels::argmax(out.row(0)) as u32;
        ids.push(next);
        out = m
            .forward(&[next], st.position(), &mut st, &Wanted::last())
            .unwrap();
    }
    ids
}

fn check_fixture(name: &str) {
    let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = ids(&st, "prompt_ids");
    let (_, m) = load(name, exact());
    // One pass, token by token and in chunks of 7 against transformers (the CPU engine's bound).
    let d = max_abs(
        &chunks(&m, &prompt, prompt.len()),
        &f32s(&st, "logits_full"),
    );
    assert!(d <= 1e-3, "{name}: one pass max |Δ| {d}");
    let d = max_abs(&chunks(&m, &prompt, 1), &f32s(&st, "logits_stepwise"));
    assert!(d <= 1e-3, "{name}: token by token max |Δ| {d}");
    let d = max_abs(&chunks(&m, &prompt, 7), &f32s(&st, "logits_chunked7"));
    assert!(d <= 1e-3, "{name}: chunks of 7 max |Δ| {d}");
    assert_eq!(greedy(&m, &prompt, 32), ids(&st, "greedy_ids"), "{name}");
    // Passes of 9 rows give the one-pass result.
    let (_, small) = load(
        name,
        LoadOptions {
            max_pass_rows: 9,
            ..exact()
        },
    );
    let d = max_abs(
        &chunks(&small, &prompt, prompt.len()),
        &f32s(&st, "logits_full"),
    );
    assert!(d <= 1e-3, "{name}: passes of 9 rows max |Δ| {d}");
}

#[test]
fn qwen3_matches_transformers_on_the_emulated_device() {
    check_fixture("qwen3");
}

#[test]
fn qwen3_5_matches_transformers_on_the_emulated_device() {
    check_fixture("qwen3_5");
}

/// Qwen3-Next: fused head-grouped GDN projections re-laid out at upload, sparse-MoE feed-forward
/// (router, top-k, renormalisation, shared expert) on every layer.
#[test]
fn qwen3_next_matches_transformers_on_the_emulated_device() {
    check_fixture("qwen3_next");
}

/// Qwen3-MoE: Qwen3's plain norms and ungated attention, the sparse MoE without a shared expert on the
/// layers its config picks (all, or those of decoder_sparse_step / mlp_only_layers), bf16 as stored.
#[test]
fn qwen3_moe_matches_transformers_on_the_emulated_device() {
    check_fixture("qwen3_moe");
    check_fixture("qwen3_moe_mixed");
}

#[test]
fn real_vocabulary_bf16_model_matches_transformers() {
    let bytes = std::fs::read(fixture("qwen3_realtok").join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = ids(&st, "prompt_ids");
    let (_, m) = load("qwen3_realtok", exact());
    let logits = chunks(&m, &prompt, prompt.len());
    let v = m.vocab;
    let d = max_abs(&logits[(prompt.len() - 1) * v..], &f32s(&st, "logits_last"));
    assert!(d <= 1e-3, "last row max |Δ| {d}");
    assert_eq!(greedy(&m, &prompt, 32), ids(&st, "greedy_ids"));
}

/// bf16 mode computes what the CPU engine computes on the same bf16-rounded matrices (f32 tolerance),
/// and with default options stays within cuda_check's stated bf16 bound of transformers' f32 logits:
/// 2·r + 2^-5·max|logit|, r = the CPU engine's deviation on the rounded weights.
#[test]
fn bf16_weights_match_the_cpu_engine_on_rounded_weights() {
    for name in ["qwen3", "qwen3_5", "qwen3_next"] {
        let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let prompt = ids(&st, "prompt_ids");
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        cuda_backend::testing::write_bf16_matrix_copy(&ck, dir.path()).unwrap();
        let rounded = Checkpoint::open(dir.path()).unwrap();
        let cpu = families::load(&rounded).unwrap();
        let mut cs = cpu.new_state();
        let c = cpu
            .forward(&prompt, 0, &mut cs, &Wanted::all())
            .unwrap()
            .logits;
        let (_, m) = load(
            name,
            LoadOptions {
                weights: WeightFormat::Bf16,
                gemv_max_rows: usize::MAX,
                ..LoadOptions::default()
            },
        );
        let g = chunks(&m, &prompt, prompt.len());
        let d = max_abs(&g, &c);
        assert!(
            d <= 1e-3,
            "{name}: bf16 GPU path vs CPU engine on rounded weights: {d}"
        );
        // The rounding itself is visible against the f32 reference (the weights really are bf16).
        let full = f32s(&st, "logits_full");
        let rounding = max_abs(&c, &full);
        assert!(max_abs(&g, &full) > 1e-3, "{name}: no rounding seen");
        // Default options add bf16 activations on cuBLAS passes: one more rounding of the same size. Not
        // for the MoE model: that rounding flips a top-k routing choice now and then (qwen3_next one
        // pass: layer 0 output 0.77 off at 1 row of 80, ~1e-2 at the others as qwen3_5's; logits 5.99),
        // which no smooth bound covers. Its f32-activation check above is the judge.
        if name == "qwen3_next" {
            continue;
        }
        let (_, fast) = load(name, LoadOptions::default());
        let d = max_abs(&chunks(&fast, &prompt, prompt.len()), &full);
        let scale = full.iter().fold(0.0f32, |a, x| a.max(x.abs()));
        let bound = 2.0 * rounding + scale / 32.0;
        assert!(
            d <= bound,
            "{name}: default bf16 vs transformers {d} > {bound}"
        );
    }
}

/// Hidden-state taps equal the CPU engine's (layer outputs, final hidden) and respect `Rows`.
#[test]
fn taps_and_rows_match_the_cpu_engine() {
    let (ck, m) = load("qwen3_5", exact());
    let cpu = families::load(&ck).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 512).collect();
    let wanted = Wanted {
        logits: Rows::From(15),
        taps: vec![Tap::LayerOutput(2), Tap::FinalHidden],
        argmax_only: false,
        candidates: 0,
    };
    let mut gs = m.new_state(32).unwrap();
    let g = m.forward(&prompt, 0, &mut gs, &wanted).unwrap();
    let mut cs = cpu.new_state();
    let c = cpu.forward(&prompt, 0, &mut cs, &wanted).unwrap();
    assert_eq!((g.first_row, g.rows), (15, 5));
    assert_eq!(g.logits.len(), 5 * m.vocab);
    assert!(max_abs(&g.logits, &c.logits) <= 1e-4);
    for (a, b) in g.taps.iter().zip(&c.taps) {
        assert!(max_abs(a, b) <= 1e-4);
    }
    let none = m.forward(&[1], 20, &mut gs, &Wanted::none()).unwrap();
    assert!(none.logits.is_empty() && none.rows == 0);
    assert!(
        m.forward(&[1], 5, &mut gs, &Wanted::last()).is_err(),
        "recurrent state cannot rewind"
    );
    assert!(
        m.forward(&[600], 21, &mut gs, &Wanted::last()).is_err(),
        "token out of range"
    );
}

/// Speculative decoding's state operations: verify rows equal sequential rows, tape rollback equals
/// running only the kept rows, snapshot/restore replays, attention-only states rewind.
#[test]
fn verify_rollback_and_snapshot_equal_sequential_decoding() {
    for name in ["qwen3_5", "qwen3", "qwen3_next"] {
        let (_, m) = load(name, LoadOptions::default());
        let prompt: Vec<u32> = (0..24).map(|i| (i * 53 + 7) % 512).collect();
        let n = prompt.len();
        let mut seq = m.new_state(64).unwrap();
        let mut out = m.forward(&prompt, 0, &mut seq, &Wanted::last()).unwrap();
        let (mut drafts, mut rows) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            let t = kernels::argmax(out.row(0)) as u32;
            drafts.push(t);
            out = m
                .forward(&[t], seq.position(), &mut seq, &Wanted::last())
                .unwrap();
            rows.push(out.logits.clone());
        }
        let mut spec = m.new_state(64).unwrap();
        m.forward(&prompt, 0, &mut spec, &Wanted::none()).unwrap();
        m.begin_tape(&mut spec).unwrap();
        let verify = m.forward(&drafts, n, &mut spec, &Wanted::all()).unwrap();
        assert!(
            bits_eq(&verify.logits, &rows.concat()),
            "{name}: verify rows"
        );
        assert!(m.rollback_retaining(&mut spec, 2).unwrap());
        assert_eq!(spec.position(), n + 2);
        let after = m
            .forward(&drafts[2..3], n + 2, &mut spec, &Wanted::last())
            .unwrap();
        assert!(
            bits_eq(&after.logits, &rows[2]),
            "{name}: rollback then step"
        );
        let snap = spec.snapshot().unwrap();
        let a = m
            .forward(&drafts[3..5], n + 3, &mut spec, &Wanted::all())
            .unwrap();
        spec.restore(&snap).unwrap();
        let b = m
            .forward(&drafts[3..5], n + 3, &mut spec, &Wanted::all())
            .unwrap();
        assert!(bits_eq(&a.logits, &b.logits), "{name}: snapshot/restore");
        assert_eq!(spec.rewind(n), !spec.is_recurrent(), "{name}: rewind");
    }
}

/// The GPU DFlash drafter proposes at the end of the context window: its block (anchor + mask rows)
/// may reach past the target's context, which its own caches allow, while the proposals the loop asks
/// for stay within it. Testbed drafter, a target whose context is cut to 12 positions.
#[test]
fn dflash_proposes_at_the_end_of_the_context() {
    use drafters::{Chooser, Drafter};
    struct Argmax;
    impl Chooser for Argmax {
        fn choose(&mut self, logits: &[f32], _context: &[u32]) -> u32 {
            let mut best = 0;
            for (i, l) in logits.iter().enumerate() {
                if *l > logits[best] {
                    best = i;
                }
            }
            best as u32
        }
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    let ck = Checkpoint::open(&dir).unwrap();
    let dev = Arc::new(CudaDevice::emulated());
    let mut m = CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap();
    m.context = 12;
    let target = Arc::new(m);
    let mut d = cuda_backend::CudaDflash::load(&target, &dir.join("dflash")).unwrap();
    let (h, taps) = (target.hidden, d.taps().len());
    let n = 11; // rows 0..11 observed; the anchor is the 12th token, at the last position
    let tap: Vec<f32> = (0..n * h).map(|i| (i % 97) as f32 / 97.0 - 0.5).collect();
    d.observe(&vec![tap; taps], n, &vec![0; n]).unwrap();
    let history: Vec<u32> = (0..12).collect();
    let got = d.propose(&history, 1, &mut Argmax).unwrap();
    assert_eq!(got.len(), 1);
    assert!((got[0] as usize) < target.vocab);
}

/// A DFlash drafter that does not fit its GPU target is refused at load with the field and file named:
/// a tapped layer the target lacks, an embedding scale the GPU path does not apply.
#[test]
fn dflash_drafters_that_do_not_fit_are_refused_by_name() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
    let ck = Checkpoint::open(&dir).unwrap();
    let dev = Arc::new(CudaDevice::emulated());
    let target = Arc::new(CudaModel::load(&dev, &ck, LoadOptions::default()).unwrap());
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("dflash/config.json")).unwrap()).unwrap();
    let with = |edit: &dyn Fn(&mut serde_json::Value)| -> String {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(tmp.path().join("config.json"), c.to_string()).unwrap();
        std::os::unix::fs::symlink(
            dir.join("dflash/model.safetensors").canonicalize().unwrap(),
            tmp.path().join("model.safetensors"),
        )
        .unwrap();
        match cuda_backend::CudaDflash::load(&target, tmp.path()) {
            Ok(_) => "loaded".into(),
            Err(e) => e.to_string(),
        }
    };
    let e = with(&|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 3, 99]));
    assert!(
        e.contains("target_layer_ids") && e.contains("99") && e.contains("config.json"),
        "{e}"
    );
    let e = with(&|c| c["dflash_config"]["input_embedding_scale"] = serde_json::json!(2.0));
    assert!(e.contains("input_embedding_scale"), "{e}");
    assert_eq!(with(&|_| {}), "loaded");
}
