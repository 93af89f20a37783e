//! MTP checks on the device: the GPU MTP head (`CudaMtp`) against the host head (`drafters::MtpHead`)
//! on the same taps (the CPU engine's final-norm hidden rows), for checkpoints carrying `mtp.*`.
//!
//! - teacher-forced logits slot by slot, vs the host head (and vs transformers' `mtp_logits` where the
//!   fixture stores them, exact mode): relative bound 1e-4 · max(1, max|logit|) — the same function in
//!   another f32 summation order (1e-5 holds on the emulated device and in the kernel simulator; the GPU
//!   adds multiply-add contraction). bf16 mode compares with the host head on bf16-rounded matrices;
//! - observe in chunks of 7 + propose 6 chained tokens (argmax): the proposals equal the host head's and
//!   every drafted logits row is within the bound;
//! - the graphed passes (draft step, verify-sized observes) equal direct launches bit for bit (a second
//!   head on a target loaded with graphs off), and the time of a draft step and of an observe of 4 rows
//!   both ways.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use cuda_backend::{CudaDevice, CudaModel, CudaMtp, LoadOptions, WeightFormat};
use drafters::{Chooser, Drafter, MtpHead};
use families::{Rows, Tap, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;

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

/// max |a - b| / max(1, max |b|) (infinite on a length mismatch or NaN).
fn rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    super::fixtures::max_abs(a, b) / scale
}

/// A plain argmax: the drafter may take it on the device and feed its draft steps there (mtp.rs
/// `propose_fed`).
struct PlainArgmax;

impl Chooser for PlainArgmax {
    fn choose(&mut self, logits: &[f32], _context: &[u32]) -> u32 {
        kernels::argmax(logits) as u32
    }

    fn plain_argmax(&self) -> bool {
        true
    }
}

fn propose(d: &mut dyn Drafter, history: &[u32], k: usize) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut r = Recorder::default();
    let out = d.propose(history, k, &mut r)?;
    Ok((out, r.rows))
}

/// Observes rows from..rows of the prompt in chunks of 7 (row j: taps row j, token j + 1).
fn observe(d: &mut dyn Drafter, taps: &[f32], prompt: &[u32], hd: usize) -> Result<()> {
    let rows = prompt.len() - 1;
    let mut at = d.position();
    while at < rows {
        let n = (rows - at).min(7);
        d.observe(
            &[taps[at * hd..(at + n) * hd].to_vec()],
            n,
            &prompt[at + 1..at + 1 + n],
        )?;
        at += n;
    }
    Ok(())
}

/// Runs the checks on the checkpoint at `dir` (skipped when it has no MTP head); false if one fails.
pub fn check(dev: &Arc<CudaDevice>, dir: &Path, exact: bool) -> Result<bool> {
    let name = dir
        .file_name()
        .map_or("?".into(), |n| n.to_string_lossy().into_owned());
    let mode = if exact { "exact" } else { "bf16" };
    let ck = Checkpoint::open(dir)?;
    if !ck.has_mtp {
        return Ok(true);
    }
    let path = dir.join("reference.safetensors");
    let bytes = std::fs::read(&path).with_context(|| path.display().to_string())?;
    let st = SafeTensors::deserialize(&bytes)?;
    let prompt: Vec<u32> = st
        .tensor("prompt_ids")?
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as u32)
        .collect();
    let reference: Option<Vec<f32>> = st.tensor("mtp_logits").ok().map(|t| {
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    });
    // The host side reads the checkpoint as the GPU holds it: bf16-rounded matrices in bf16 mode.
    let tmp = std::env::temp_dir().join(format!("cuda_check_mtp_{name}_{}", std::process::id()));
    let host_ck = if exact {
        Checkpoint::open(dir)?
    } else {
        cuda_backend::testing::write_bf16_matrix_copy(&ck, &tmp)?;
        Checkpoint::open(&tmp)?
    };
    let cpu = Arc::new(families::load(&host_ck)?);
    let mut host = MtpHead::load(&host_ck, cpu.clone())?.context("host MTP head")?;
    let _ = std::fs::remove_dir_all(&tmp);
    let wanted = Wanted {
        logits: Rows::None,
        taps: vec![Tap::FinalHidden],
        argmax_only: false,
        candidates: 0,
    };
    let mut cs = cpu.new_state();
    let taps = cpu.forward(&prompt, 0, &mut cs, &wanted)?.taps.remove(0);
    let opts = |graphs: bool| LoadOptions {
        weights: if exact {
            WeightFormat::AsStored
        } else {
            WeightFormat::Bf16
        },
        graphs,
        ..crate::base_options()
    };
    let target = Arc::new(CudaModel::load(dev, &ck, opts(true))?);
    let mut gpu = CudaMtp::load(&target, &ck)?.context("GPU MTP head")?;
    let (hd, v, rows) = (cpu.hidden, cpu.vocab, prompt.len() - 1);
    let bound = 1e-4;
    let mut ok = true;
    let mut line = |what: &str, d: f32, tol: f32| {
        let pass = d <= tol;
        ok &= pass;
        println!(
            "  [{name} {mode} mtp] {what:<34} rel|Δ| {d:.3e} (tol {tol:.0e}) {}",
            if pass { "ok" } else { "FAIL" }
        );
    };

    let (mut worst, mut worst_ref) = (0.0f32, 0.0f32);
    for slot in 0..rows {
        let h = &taps[slot * hd..(slot + 1) * hd];
        let next = [prompt[slot + 1]];
        let (_, want) = host.forward(h, &next, slot, true)?;
        let got = gpu.forward(h, &next, slot)?;
        worst = worst.max(rel(&got, &want));
        if let Some(r) = reference.as_ref().filter(|_| exact) {
            worst_ref = worst_ref.max(super::fixtures::max_abs(&got, &r[slot * v..(slot + 1) * v]));
        }
    }
    line("teacher-forced slots vs host head", worst, bound);
    if reference.is_some() && exact {
        line("teacher-forced slots vs transformers", worst_ref, 1e-3);
    }

    let k = 6;
    host.reset();
    gpu.reset();
    observe(&mut host, &taps, &prompt, hd)?;
    observe(&mut gpu, &taps, &prompt, hd)?;
    let (want_ids, want_rows) = propose(&mut host, &prompt, k)?;
    let (got_ids, got_rows) = propose(&mut gpu, &prompt, k)?;
    let d = got_rows
        .iter()
        .zip(&want_rows)
        .map(|(g, w)| rel(g, w))
        .fold(0.0, f32::max);
    line("drafted logits vs host head", d, bound);
    let same = got_ids == want_ids;
    ok &= same;
    println!(
        "  [{name} {mode} mtp] proposals {got_ids:?} vs host head: {}",
        if same { "equal ok" } else { "DIFFER FAIL" }
    );

    // Plain argmax: the draft steps fed on the device, all k queued before one wait.
    let fed = gpu.propose(&prompt, k, &mut PlainArgmax)?;
    let same = fed == want_ids;
    ok &= same;
    println!(
        "  [{name} {mode} mtp] proposals fed on the device {fed:?} vs host head: {}",
        if same { "equal ok" } else { "DIFFER FAIL" }
    );

    // Graph replay == direct launches, and the draft step's time each way.
    let direct_target = Arc::new(CudaModel::load(dev, &ck, opts(false))?);
    let mut direct = CudaMtp::load(&direct_target, &ck)?.context("GPU MTP head")?;
    observe(&mut direct, &taps, &prompt, hd)?;
    let (direct_ids, direct_rows) = propose(&mut direct, &prompt, k)?;
    let bitwise = direct_ids == got_ids
        && direct_rows.len() == got_rows.len()
        && direct_rows
            .iter()
            .zip(&got_rows)
            .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    ok &= bitwise;
    println!(
        "  [{name} {mode} mtp] graph {:?}: drafts == direct launches bitwise: {}",
        gpu.graph_status(),
        if bitwise { "ok" } else { "FAIL" }
    );
    if !dev.is_emulated() {
        let (g, dl) = (
            step_ms(&mut gpu, &prompt, k)?,
            step_ms(&mut direct, &prompt, k)?,
        );
        println!(
            "  [{name} {mode} mtp] one draft step (logits to the host): graph {g:.3} ms, direct {dl:.3} ms"
        );
        let rounds = 20;
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            gpu.propose(&prompt, k, &mut PlainArgmax)?;
        }
        let fed_ms = t.elapsed().as_secs_f64() * 1e3 / (rounds * (k - 1)) as f64;
        println!("  [{name} {mode} mtp] one draft step fed on the device (plain argmax, {k} drafts a wait): {fed_ms:.3} ms");
        let (g, dl) = (
            observe_ms(&mut gpu, &taps, &prompt, hd)?,
            observe_ms(&mut direct, &taps, &prompt, hd)?,
        );
        println!(
            "  [{name} {mode} mtp] observe of 4 rows (taps up, logits down): graph {g:.3} ms, direct {dl:.3} ms"
        );
    }
    Ok(ok)
}

/// Milliseconds per chained draft step (each copies its logits row to the host), over 20 proposals.
fn step_ms(d: &mut CudaMtp, history: &[u32], k: usize) -> Result<f64> {
    let rounds = 20;
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        propose(d, history, k)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / (rounds * (k - 1)) as f64)
}

/// Milliseconds per observe of the prompt's last 4 rows (rewound first), over 20 observes.
fn observe_ms(d: &mut CudaMtp, taps: &[f32], prompt: &[u32], hd: usize) -> Result<f64> {
    let rounds = 20;
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        d.rewind(prompt.len() - 5)?;
        observe(d, taps, prompt, hd)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / rounds as f64)
}
