//! The GPU MTP head (`CudaMtp`) against the host head (`drafters::MtpHead`) and transformers, on the
//! host-emulated device and on the kernel simulator (the real CUDA kernels compiled by g++).
//!
//! Both heads read the same taps (the CPU engine's final-norm hidden rows), so only the head differs.
//! Checked per fixture carrying `mtp.*` (fixtures/qwen3_5, models/testbed):
//! - teacher-forced logits slot by slot (the head's own KV cache) and in one pass, within a stated
//!   bound of the host head's (and of transformers' where the fixture stores them);
//! - through the `Drafter` interface: observe in chunks, propose k chained tokens (argmax): the
//!   proposals equal the host head's and every drafted logits row is within the bound; proposing again
//!   without observing repeats itself (the chain does not clobber the committed row); rewind +
//!   re-observe reproduces the proposals bit for bit.
//!
//! Bound: 1e-5 · max(1, max|logit|) (measured: under 7e-7 on every fixture and device). The GPU head
//! computes the host head's function in another f32 summation order (fc split in two halves, the
//! GEMV's own order); bf16 weights are compared with the host head on the bf16-rounded copy of the
//! checkpoint. A pass over more than `gemv_max_rows` rows with bf16 weights takes the GEMM path, which
//! rounds activations to bf16 as the target's prefill does: 1e-2 there.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cuda_backend::{CudaDevice, CudaModel, CudaMtp, LoadOptions, WeightFormat};
use drafters::{Chooser, Drafter, MtpHead};
use families::{Rows, Tap, Transformer, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The kernel simulator (`src/cu/` compiled by the host C++ compiler, `$CXX` or g++). CI has g++: a
/// missing compiler fails the test rather than skipping it.
fn simulated() -> Arc<CudaDevice> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if let Err(e) = std::process::Command::new(&cxx).arg("--version").output() {
        panic!("the kernel simulator needs a C++ compiler: `{cxx} --version` failed ({e}); install g++ or set CXX");
    }
    Arc::new(CudaDevice::simulated().unwrap())
}

fn tensor_f32(st: &SafeTensors<'_>, name: &str) -> Option<Vec<f32>> {
    let t = st.tensor(name).ok()?;
    Some(
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

fn prompt_ids(st: &SafeTensors<'_>) -> Vec<u32> {
    st.tensor("prompt_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

/// max |a - b| / max(1, max |b|).
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

/// Argmax, recording every logits row it was shown.
#[derive(Default)]
struct Recorder {
    rows: Vec<Vec<f32>>,
}

impl Chooser for Recorder {
    fn choose(&mut self, logits: &[f32], _context: &[u32]) -> u32 {
        self.rows.push(logits.to_vec());
        kernels::argmax(logits) as u32
    }
}

/// Greedy without penalties: says so, so the drafter may answer from its device argmax; counts the
/// rows it is shown anyway.
#[derive(Default)]
struct PlainArgmax {
    rows_seen: usize,
}

impl Chooser for PlainArgmax {
    fn choose(&mut self, logits: &[f32], _context: &[u32]) -> u32 {
        self.rows_seen += 1;
        kernels::argmax(logits) as u32
    }

    fn plain_argmax(&self) -> bool {
        true
    }
}

fn propose(d: &mut dyn Drafter, history: &[u32], k: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut r = Recorder::default();
    let out = d.propose(history, k, &mut r).unwrap();
    (out, r.rows)
}

struct Setup {
    /// The checkpoint the host head and the CPU target read (the bf16-rounded copy for bf16 runs).
    host_ck: Checkpoint,
    cpu: Arc<Transformer>,
    gpu: CudaMtp,
    prompt: Vec<u32>,
    /// The CPU engine's final-norm hidden rows of the prompt [P, H].
    taps: Vec<f32>,
    /// transformers' teacher-forced MTP logits [P-1, vocab], where the fixture stores them.
    reference_mtp: Option<Vec<f32>>,
    _rounded: Option<tempfile::TempDir>,
}

fn setup(dir: &Path, dev: &Arc<CudaDevice>, opts: LoadOptions) -> Setup {
    let ck = Checkpoint::open(dir).unwrap();
    let (host_ck, rounded) = match opts.weights {
        WeightFormat::AsStored => (Checkpoint::open(dir).unwrap(), None),
        WeightFormat::Bf16 => {
            let tmp = tempfile::tempdir().unwrap();
            cuda_backend::testing::write_bf16_matrix_copy(&ck, tmp.path()).unwrap();
            (Checkpoint::open(tmp.path()).unwrap(), Some(tmp))
        }
    };
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = prompt_ids(&st);
    let cpu = Arc::new(families::load(&host_ck).unwrap());
    let wanted = Wanted {
        logits: Rows::None,
        taps: vec![Tap::FinalHidden],
        argmax_only: false,
        candidates: 0,
    };
    let mut state = cpu.new_state();
    let taps = cpu
        .forward(&prompt, 0, &mut state, &wanted)
        .unwrap()
        .taps
        .remove(0);
    let target = Arc::new(CudaModel::load(dev, &ck, opts).unwrap());
    let gpu = CudaMtp::load(&target, &ck)
        .unwrap()
        .expect("the checkpoint carries an MTP head");
    Setup {
        host_ck,
        cpu,
        gpu,
        prompt,
        taps,
        reference_mtp: tensor_f32(&st, "mtp_logits"),
        _rounded: rounded,
    }
}

/// Runs every check of the module doc; returns the largest relative deviation seen.
fn check(label: &str, dir: &Path, dev: &Arc<CudaDevice>, opts: LoadOptions, bound: f32) -> f32 {
    let Setup {
        host_ck,
        cpu,
        mut gpu,
        prompt,
        taps,
        reference_mtp,
        _rounded,
    } = setup(dir, dev, opts);
    let mut host = MtpHead::load(&host_ck, cpu.clone()).unwrap().unwrap();
    let hd = cpu.hidden;
    let rows = prompt.len() - 1; // row j pairs h_j with prompt[j + 1]
    let mut worst = 0.0f32;
    let mut within = |what: String, got: &[f32], want: &[f32]| {
        let d = rel(got, want);
        worst = worst.max(d);
        assert!(
            d <= bound,
            "{label} {what}: relative deviation {d:.2e} > {bound:.0e}"
        );
    };

    // 1. Teacher-forced slot by slot (exercises the head's KV cache), then all slots in one pass.
    let v = cpu.vocab;
    for slot in 0..rows {
        let h = &taps[slot * hd..(slot + 1) * hd];
        let next = [prompt[slot + 1]];
        let (_, want) = host.forward(h, &next, slot, true).unwrap();
        let got = gpu.forward(h, &next, slot).unwrap();
        within(format!("slot {slot}"), &got, &want);
        if let (Some(r), WeightFormat::AsStored) = (&reference_mtp, opts.weights) {
            // transformers' head on its own hidden rows (the fixture's 1e-3 convention).
            let d = got
                .iter()
                .zip(&r[slot * v..(slot + 1) * v])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(d <= 1e-3, "{label} slot {slot} vs transformers: {d}");
        }
    }
    let (_, want) = host
        .forward(&taps[..rows * hd], &prompt[1..], 0, true)
        .unwrap();
    let got = gpu.forward(&taps[..rows * hd], &prompt[1..], 0).unwrap();
    let d = rel(&got, &want);
    // A pass over more than gemv_max_rows rows takes the GEMM path, which rounds bf16-weight
    // activations to bf16 (2^-9 relative per rounding, through the fc, the layer and the LM head).
    let pass_bound = if rows > opts.gemv_max_rows && opts.weights == WeightFormat::Bf16 {
        1e-2
    } else {
        bound
    };
    assert!(
        d <= pass_bound,
        "{label} one pass of {rows} rows: {d:.2e} > {pass_bound:.0e}"
    );

    // 2. The drafter interface: observe in chunks of 7 rows, propose 6.
    let k = 6;
    let observe = |d: &mut dyn Drafter, from: usize| {
        let mut at = from;
        while at < rows {
            let n = (rows - at).min(7);
            let t = taps[at * hd..(at + n) * hd].to_vec();
            d.observe(&[t], n, &prompt[at + 1..at + 1 + n]).unwrap();
            at += n;
        }
    };
    host.reset();
    gpu.reset();
    observe(&mut host, 0);
    observe(&mut gpu, 0);
    assert_eq!(gpu.position(), rows);
    let (want_ids, want_rows) = propose(&mut host, &prompt, k);
    let (got_ids, got_rows) = propose(&mut gpu, &prompt, k);
    assert_eq!(got_ids.len(), k, "{label}");
    for (i, (g, w)) in got_rows.iter().zip(&want_rows).enumerate() {
        within(format!("draft {i}"), g, w);
    }
    assert_eq!(got_ids, want_ids, "{label}: proposals");
    // Proposing again without observing repeats the proposals exactly.
    let (again, again_rows) = propose(&mut gpu, &prompt, k);
    assert_eq!(again, got_ids, "{label}: second proposal");
    assert!(again_rows == got_rows, "{label}: second proposal's logits");
    // A plain-argmax chooser: the same proposals from the device argmax, no logits row copied.
    let mut plain = PlainArgmax::default();
    let ids = gpu.propose(&prompt, k, &mut plain).unwrap();
    assert_eq!(ids, got_ids, "{label}: device-argmax proposals");
    assert_eq!(
        plain.rows_seen, 0,
        "{label}: rows copied for a plain argmax"
    );
    // Rewind three rows and observe them again: the same proposals, bit for bit.
    gpu.rewind(rows - 3).unwrap();
    assert!(
        propose(&mut gpu, &prompt, k).0.is_empty(),
        "{label}: stale draft after rewind"
    );
    observe(&mut gpu, rows - 3);
    let (re, re_rows) = propose(&mut gpu, &prompt, k);
    assert_eq!(re, got_ids, "{label}: after rewind");
    assert!(re_rows == got_rows, "{label}: logits after rewind");
    // Propose only when observe covered every row before the last token.
    assert!(propose(&mut gpu, &prompt[..rows], k).0.is_empty());
    println!("{label}: GPU MTP vs host MtpHead, worst relative deviation {worst:.2e}, proposals {got_ids:?}");
    worst
}

fn exact() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::AsStored,
        gemv_max_rows: usize::MAX,
        ..LoadOptions::default()
    }
}

#[test]
fn gpu_mtp_equals_host_mtp_on_the_emulated_device() {
    let dev = Arc::new(CudaDevice::emulated());
    check(
        "qwen3_5 f32",
        &testdata::fixture("qwen3_5"),
        &dev,
        exact(),
        1e-5,
    );
    // The product's options: bf16 matrices, verify-sized rows on the batch-invariant path.
    check(
        "qwen3_5 bf16",
        &testdata::fixture("qwen3_5"),
        &dev,
        LoadOptions::default(),
        1e-5,
    );
    // Qwen3-Next: the MTP layer's feed-forward is a sparse MoE.
    let next = testdata::fixture("qwen3_next");
    check("qwen3_next f32", &next, &dev, exact(), 1e-5);
    check("qwen3_next bf16", &next, &dev, LoadOptions::default(), 1e-5);
}

#[test]
fn gpu_mtp_equals_host_mtp_on_the_testbed() {
    let dev = Arc::new(CudaDevice::emulated());
    let dir = std::env::var_os("TURBOSPARK_TESTBED")
        .map_or_else(|| repo("models/testbed"), PathBuf::from);
    // The testbed is stored in bf16: as-stored and bf16 upload are the same weights.
    check("testbed", &dir, &dev, exact(), 1e-5);
}

#[test]
fn gpu_mtp_kernels_equal_host_mtp_in_the_simulator() {
    let dev = simulated();
    let dir = testdata::fixture("qwen3_5");
    check("simulated qwen3_5 f32", &dir, &dev, exact(), 1e-5);
    check(
        "simulated qwen3_5 bf16",
        &dir,
        &dev,
        LoadOptions::default(),
        1e-5,
    );
    let next = testdata::fixture("qwen3_next");
    check(
        "simulated qwen3_next bf16",
        &next,
        &dev,
        LoadOptions::default(),
        1e-5,
    );
}

/// The head's contract errors: a token outside the vocabulary, mismatched taps, a rewind ahead.
#[test]
fn bad_inputs_are_errors() {
    let dev = Arc::new(CudaDevice::emulated());
    let Setup {
        mut gpu,
        taps,
        prompt,
        cpu,
        ..
    } = setup(&testdata::fixture("qwen3_5"), &dev, exact());
    let hd = cpu.hidden;
    let h = taps[..hd].to_vec();
    let err = gpu
        .observe(std::slice::from_ref(&h), 1, &[cpu.vocab as u32])
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert!(gpu
        .observe(&[h[..hd - 1].to_vec()], 1, &prompt[1..2])
        .is_err());
    assert!(gpu.observe(&[], 1, &prompt[1..2]).is_err());
    assert!(gpu.rewind(1).is_err());
    gpu.observe(&[h], 1, &prompt[1..2]).unwrap();
    assert_eq!(gpu.position(), 1);
}

/// Drafting over the first half of the ids (`with_draft_vocab`, the engine's policy on both devices):
/// the GPU head proposes what the host head with the same reduction proposes, only ids below the cut,
/// from drafted rows whose ids past the cut are -inf and whose others match the host's within the
/// bound; the device-argmax path agrees.
#[test]
fn a_reduced_draft_vocabulary_matches_the_host_head() {
    let testbed = std::env::var_os("TURBOSPARK_TESTBED")
        .map_or_else(|| repo("models/testbed"), PathBuf::from);
    let emulated = Arc::new(CudaDevice::emulated());
    for (label, dir, dev) in [
        ("emulated testbed", testbed, emulated.clone()),
        ("emulated qwen3_5", testdata::fixture("qwen3_5"), emulated),
        (
            "simulated qwen3_5",
            testdata::fixture("qwen3_5"),
            simulated(),
        ),
    ] {
        let Setup {
            host_ck,
            cpu,
            gpu,
            prompt,
            taps,
            ..
        } = setup(&dir, &dev, exact());
        let (hd, vocab) = (cpu.hidden, cpu.vocab);
        let cut = vocab / 2;
        let mut gpu = gpu.with_draft_vocab(cut).unwrap();
        let mut host = MtpHead::load(&host_ck, cpu.clone())
            .unwrap()
            .unwrap()
            .with_draft_vocab(cut);
        let rows = prompt.len() - 1;
        for d in [&mut host as &mut dyn Drafter, &mut gpu] {
            d.observe(&[taps[..rows * hd].to_vec()], rows, &prompt[1..])
                .unwrap();
        }
        let (want_ids, want_rows) = propose(&mut host, &prompt, 6);
        let (got_ids, got_rows) = propose(&mut gpu, &prompt, 6);
        assert_eq!(got_ids, want_ids, "{label}: proposals");
        assert!(
            got_ids.iter().all(|&t| (t as usize) < cut),
            "{label}: a proposal past the first {cut} ids: {got_ids:?}"
        );
        assert_eq!(got_rows.len(), want_rows.len(), "{label}");
        for (i, (g, w)) in got_rows.iter().zip(&want_rows).enumerate() {
            assert!(
                g[cut..].iter().all(|&x| x == f32::NEG_INFINITY),
                "{label} draft {i}: a finite logit past the cut"
            );
            let d = rel(&g[..cut], &w[..cut]);
            assert!(d <= 1e-5, "{label} draft {i}: relative deviation {d:.2e}");
        }
        let mut plain = PlainArgmax::default();
        let ids = gpu.propose(&prompt, 6, &mut plain).unwrap();
        assert_eq!(ids, got_ids, "{label}: device-argmax proposals");
    }
}
