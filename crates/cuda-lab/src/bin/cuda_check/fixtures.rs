//! Fixture checks: the GPU forward against transformers' f32 reference logits and against the CPU engine
//! (logits, per-layer hidden states, greedy continuation), plus the state operations speculative
//! decoding relies on (batch-invariant verify rows, tape rollback, snapshot/restore, graph == no graph).
//!
//! Tolerances. Exact mode (weights as stored, f32 activations everywhere): the GPU runs the CPU engine's
//! arithmetic up to summation order, so the fixtures' f32 bound applies: max |Δlogit| <= 1e-3, and the
//! greedy continuation must equal the CPU engine's.
//! bf16 mode is checked in two steps. (1) With f32 activations, the GPU must equal the CPU engine run on
//! a copy of the checkpoint whose matrices are rounded to bf16 exactly as uploaded (an independent engine
//! computing the same function): <= 1e-3. (2) With default options (prefill passes also round GEMM
//! activations to bf16 for cuBLAS), the deviation from transformers' f32 logits must stay within
//! 2 · r + 2^-5 · max|logit|, where r = the CPU engine's own deviation on the rounded weights (the
//! weight rounding's effect, measured by an independent engine), doubled for the activations' rounding
//! on the other GEMM operand, plus an allowance for the activation rounding of models whose weights
//! are bf16 already (r = 0): measured on the emulated device it is 0.028 at max|logit| ≈ 2.2 for
//! qwen3_realtok, i.e. ~2^-6.3 of the scale. The fixtures make r large (0.11 for qwen3, 0.84 for
//! qwen3_5 at |logit| <= 17: tiny hidden sizes and GDN decays near 1 amplify it), so bf16 greedy
//! continuations are reported, not required. These two bf16 numbers describe bf16 itself; the
//! checks that would catch a bug are the 1e-3 ones.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use cuda_backend::{CudaDevice, CudaModel, LoadOptions, WeightFormat};
use families::{Rows, Tap, Wanted};
use model_io::Checkpoint;
use safetensors::SafeTensors;

pub struct Reference {
    pub prompt: Vec<u32>,
    pub tensors: Vec<(String, Vec<f32>)>,
    pub greedy: Vec<u32>,
}

impl Reference {
    fn get(&self, name: &str) -> Option<&[f32]> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

fn ints(st: &SafeTensors<'_>, name: &str) -> Result<Vec<u32>> {
    let t = st.tensor(name).map_err(|e| anyhow!("{name}: {e}"))?;
    Ok(match t.dtype() {
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as u32)
            .collect(),
        _ => t
            .data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect(),
    })
}

pub fn reference(dir: &Path) -> Result<Reference> {
    let path = dir.join("reference.safetensors");
    let bytes = std::fs::read(&path).with_context(|| path.display().to_string())?;
    let st = SafeTensors::deserialize(&bytes)?;
    let mut tensors = Vec::new();
    for name in [
        "logits_full",
        "logits_stepwise",
        "logits_chunked7",
        "logits_last",
        "topk8_logits",
    ] {
        if let Ok(t) = st.tensor(name) {
            let v = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            tensors.push((name.to_string(), v));
        }
    }
    let mut r = Reference {
        prompt: ints(&st, "prompt_ids")?,
        greedy: ints(&st, "greedy_ids")?,
        tensors,
    };
    if let Ok(ids) = ints(&st, "topk8_ids") {
        r.tensors
            .push(("topk8_ids".into(), ids.iter().map(|&i| i as f32).collect()));
    }
    Ok(r)
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

fn argmax(x: &[f32]) -> u32 {
    kernels::argmax(x) as u32
}

/// Logits of the prompt run in chunks of `chunk` on the GPU.
fn gpu_chunks(m: &CudaModel, prompt: &[u32], chunk: usize) -> Result<Vec<f32>> {
    let mut st = m.new_state(prompt.len() + 64)?;
    let mut out = Vec::new();
    for (i, c) in prompt.chunks(chunk).enumerate() {
        out.extend(m.forward(c, i * chunk, &mut st, &Wanted::all())?.logits);
    }
    Ok(out)
}

fn gpu_greedy(m: &CudaModel, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    let mut st = m.new_state(prompt.len() + n + 1)?;
    let mut out = m.forward(prompt, 0, &mut st, &Wanted::last())?;
    let mut ids = Vec::new();
    for _ in 0..n {
        let next = argmax(out.row(0));
        ids.push(next);
        out = m.forward(&[next], st.position(), &mut st, &Wanted::last())?;
    }
    Ok(ids)
}

fn cpu_greedy(m: &families::Transformer, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    let mut st = m.new_state();
    let mut out = m.forward(prompt, 0, &mut st, &Wanted::last())?;
    let mut ids = Vec::new();
    for _ in 0..n {
        let next = argmax(out.row(0));
        ids.push(next);
        out = m.forward(&[next], st.position(), &mut st, &Wanted::last())?;
    }
    Ok(ids)
}

fn first_diff(a: &[u32], b: &[u32]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        None if a.len() == b.len() => "equal".into(),
        None => format!("length {} vs {}", a.len(), b.len()),
        Some(i) => format!("DIFFER from index {i}"),
    }
}

/// Runs every check on one fixture in one mode; returns false when a check fails.
pub fn check(dev: &Arc<CudaDevice>, dir: &Path, exact: bool, tensor_cores: bool) -> Result<bool> {
    let name = dir
        .file_name()
        .map_or("?".into(), |n| n.to_string_lossy().into_owned());
    let mode = match (exact, tensor_cores) {
        (true, _) => "exact",
        (false, false) => "bf16",
        (false, true) => "bf16 tc",
    };
    let ck = Checkpoint::open(dir)?;
    let r = reference(dir)?;
    let cpu = families::load(&ck)?;
    let opts = LoadOptions {
        weights: if exact {
            WeightFormat::AsStored
        } else {
            WeightFormat::Bf16
        },
        gemv_max_rows: if exact {
            usize::MAX
        } else {
            LoadOptions::default().gemv_max_rows
        },
        tensor_core_gemv: tensor_cores,
        ..crate::base_options()
    };
    let gpu = CudaModel::load(dev, &ck, opts)?;
    // bf16 mode, step 1: f32 activations vs the CPU engine on bf16-rounded matrices.
    let mut rounding = 0.0f32;
    if !exact {
        let tmp = std::env::temp_dir().join(format!("cuda_check_{name}_{}", std::process::id()));
        cuda_backend::testing::write_bf16_matrix_copy(&ck, &tmp)?;
        let cpu_r = families::load(&Checkpoint::open(&tmp)?)?;
        let mut cs = cpu_r.new_state();
        let c = cpu_r.forward(&r.prompt, 0, &mut cs, &Wanted::all())?.logits;
        let _ = std::fs::remove_dir_all(&tmp);
        let strict_opts = LoadOptions {
            weights: WeightFormat::Bf16,
            gemv_max_rows: usize::MAX,
            ..crate::base_options()
        };
        let strict = CudaModel::load(dev, &ck, strict_opts)?;
        let mut gs = strict.new_state(r.prompt.len() + 8)?;
        let g = strict
            .forward(&r.prompt, 0, &mut gs, &Wanted::all())?
            .logits;
        let d = max_abs(&g, &c);
        let pass = d <= 1e-3;
        println!(
            "  [{name} {mode}] {:<34} max|Δ| {d:.3e} (tol 1.00e-03) {}",
            "f32-act vs CPU on rounded weights",
            if pass { "ok" } else { "FAIL" }
        );
        if !pass {
            return Ok(false);
        }
        let n = r.prompt.len();
        rounding = match (r.get("logits_full"), r.get("logits_last")) {
            (Some(f), _) => max_abs(&c, f),
            (None, Some(l)) => max_abs(&c[(n - 1) * gpu.vocab..], l),
            _ => 0.0,
        };
        println!("  [{name} {mode}] CPU engine on rounded weights vs transformers: max|Δ| {rounding:.3e} (= r)");
    }
    let v = gpu.vocab;
    let n = r.prompt.len();
    let mut ok = true;
    // bf16 activations (cuBLAS prefill) flip an MoE top-k choice now and then, which moves that row far
    // past the smooth bound (emulated qwen3_next one pass: layer 0 output 0.77 off at 1 row of 80, ~1e-2
    // at the others as qwen3_5's; logits 5.99): for MoE models in bf16 modes those lines are reported,
    // not judged; step 1 (f32 activations vs the CPU engine on the rounded weights, 1e-3) and the
    // bitwise state checks judge them.
    let judged = exact || ck.config.moe.is_none();
    let mut line = |what: &str, d: f32, tol: f32| {
        let pass = d <= tol;
        ok &= pass || !judged;
        let verdict = match (pass, judged) {
            (true, _) => "ok",
            (false, true) => "FAIL",
            (false, false) => "over (MoE routing flip; not judged)",
        };
        println!("  [{name} {mode}] {what:<34} max|Δ| {d:.3e} (tol {tol:.2e}) {verdict}");
    };

    // One pass, with every layer's output and the final hidden state, against the CPU engine.
    let layers = ck.config.num_hidden_layers;
    let mut taps: Vec<Tap> = (0..layers).map(Tap::LayerOutput).collect();
    taps.push(Tap::FinalHidden);
    let wanted = Wanted {
        logits: families::Rows::All,
        taps,
        argmax_only: false,
        candidates: 0,
    };
    let mut cs = cpu.new_state();
    let c_out = cpu.forward(&r.prompt, 0, &mut cs, &wanted)?;
    let mut gs = gpu.new_state(n + 64)?;
    let g_out = gpu.forward(&r.prompt, 0, &mut gs, &wanted)?;
    let scale = c_out.logits.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let tol = if exact {
        1e-3
    } else {
        2.0 * rounding + scale / 32.0
    };
    for (i, (g, c)) in g_out.taps.iter().zip(&c_out.taps).enumerate() {
        let hs = c.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = max_abs(g, c);
        let what = if i < layers {
            format!("layer {i} output vs CPU")
        } else {
            "final hidden vs CPU".into()
        };
        // Hidden states: the same relative bound at their own scale (not a pass/fail criterion).
        println!("  [{name} {mode}] {what:<34} max|Δ| {d:.3e} (max|h| {hs:.2})");
    }
    line(
        "one-pass logits vs CPU engine",
        max_abs(&g_out.logits, &c_out.logits),
        tol,
    );
    if let Some(full) = r.get("logits_full") {
        line(
            "one-pass logits vs transformers",
            max_abs(&g_out.logits, full),
            tol,
        );
    }
    if let Some(last) = r.get("logits_last") {
        line(
            "last-row logits vs transformers",
            max_abs(&g_out.logits[(n - 1) * v..], last),
            tol,
        );
    }
    if let (Some(tl), Some(ti)) = (r.get("topk8_logits"), r.get("topk8_ids")) {
        let ours: Vec<f32> = ti
            .chunks(8)
            .enumerate()
            .flat_map(|(row, ids)| ids.iter().map(move |&t| (row, t as usize)))
            .map(|(row, t)| g_out.logits[row * v + t])
            .collect();
        line("top-8 logits vs transformers", max_abs(&ours, tl), tol);
    }
    if let Some(step) = r.get("logits_stepwise") {
        line(
            "token-by-token vs transformers",
            max_abs(&gpu_chunks(&gpu, &r.prompt, 1)?, step),
            tol,
        );
    }
    if let Some(c7) = r.get("logits_chunked7") {
        line(
            "chunks of 7 vs transformers",
            max_abs(&gpu_chunks(&gpu, &r.prompt, 7)?, c7),
            tol,
        );
    }

    // Greedy continuation: GPU vs CPU engine vs transformers.
    let g_ids = gpu_greedy(&gpu, &r.prompt, r.greedy.len())?;
    let c_ids = cpu_greedy(&cpu, &r.prompt, r.greedy.len())?;
    let vs_cpu = first_diff(&g_ids, &c_ids);
    let vs_ref = first_diff(&g_ids, &r.greedy);
    println!(
        "  [{name} {mode}] greedy {} tokens: vs CPU engine {vs_cpu}; vs transformers {vs_ref}",
        g_ids.len()
    );
    if exact {
        ok &= vs_cpu == "equal";
    }

    ok &= state_ops(&gpu, &r.prompt, &name, mode)?;
    Ok(ok)
}

/// Verify rows == sequential rows (bitwise), tape rollback == sequential, snapshot/restore replays
/// bitwise, graph == no graph.
fn state_ops(gpu: &CudaModel, prompt: &[u32], name: &str, mode: &str) -> Result<bool> {
    let n = prompt.len();
    let cap = n + 32;
    let mut ok = true;
    let mut report = |what: &str, pass: bool| {
        ok &= pass;
        println!(
            "  [{name} {mode}] {what:<48} {}",
            if pass { "ok" } else { "FAIL" }
        );
    };
    let bits = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    // Sequential reference: prompt, then 6 greedy tokens one at a time (graph path).
    let mut seq = gpu.new_state(cap)?;
    let mut out = gpu.forward(prompt, 0, &mut seq, &Wanted::last())?;
    let mut drafts = Vec::new();
    let mut seq_rows = Vec::new();
    for _ in 0..6 {
        let t = argmax(out.row(0));
        drafts.push(t);
        out = gpu.forward(&[t], seq.position(), &mut seq, &Wanted::last())?;
        seq_rows.push(out.logits.clone());
    }
    // Verify block of 6 rows with a tape on a fresh state.
    let mut spec = gpu.new_state(cap)?;
    let first = gpu.forward(prompt, 0, &mut spec, &Wanted::last())?;
    gpu.begin_tape(&mut spec)?;
    let verify = gpu.forward(&drafts, n, &mut spec, &Wanted::all())?;
    let flat: Vec<f32> = seq_rows.concat();
    report(
        "verify rows == sequential decode rows (bitwise)",
        bits(&verify.logits, &flat),
    );
    let _ = first;
    // Roll back to 2 kept rows, then decode the third draft: must equal the sequential row 3.
    let kept = gpu.rollback_retaining(&mut spec, 2)?;
    let after = gpu.forward(&drafts[2..3], n + 2, &mut spec, &Wanted::last())?;
    report(
        "tape rollback(2) then step == sequential (bitwise)",
        kept && bits(&after.logits, &seq_rows[2]),
    );
    // Snapshot / restore.
    let snap = spec.snapshot()?;
    let a = gpu.forward(&drafts[3..5], n + 3, &mut spec, &Wanted::all())?;
    spec.restore(&snap)?;
    let b = gpu.forward(&drafts[3..5], n + 3, &mut spec, &Wanted::all())?;
    report(
        "snapshot/restore replays bitwise",
        bits(&a.logits, &b.logits),
    );
    // Graph vs direct launches for the same one-row step.
    let mut s1 = gpu.new_state(cap)?;
    gpu.forward(prompt, 0, &mut s1, &Wanted::none())?;
    let mut s2 = s1.snapshot()?;
    let g = gpu.forward(&drafts[..1], n, &mut s1, &Wanted::last())?;
    match s1.graph_status() {
        _ if gpu.device().is_emulated() => {}
        Ok(true) => {}
        Ok(false) => report("decode graph captured", false),
        Err(e) => {
            println!("  [{name} {mode}] decode graph capture failed: {e}");
            report("decode graph captured", false);
        }
    }
    let mut s3 = gpu.new_state(cap)?;
    s3.restore(&s2)?;
    gpu.begin_tape(&mut s3)?; // a recording tape bypasses the graph
    let d = gpu.forward(&drafts[..1], n, &mut s3, &Wanted::last())?;
    report(
        "graph step == direct launches (bitwise)",
        bits(&g.logits, &d.logits),
    );
    // The speculative loop's plain steps: one row with the final-hidden tap, through its own graph.
    let tapped = Wanted {
        logits: Rows::Last,
        taps: vec![Tap::FinalHidden],
        argmax_only: false,
        candidates: 0,
    };
    let mut s4 = gpu.new_state(cap)?;
    s4.restore(&s2)?;
    let gt = gpu.forward(&drafts[..1], n, &mut s4, &tapped)?;
    if s1.graph_status() == Ok(true) {
        report(
            "decode graph with the final-hidden tap captured",
            s4.hidden_graph_captured(),
        );
    }
    let mut s5 = gpu.new_state(cap)?;
    s5.restore(&s2)?;
    gpu.begin_tape(&mut s5)?;
    let dt = gpu.forward(&drafts[..1], n, &mut s5, &tapped)?;
    let tap = |o: &families::ForwardOut| o.taps.first().cloned().unwrap_or_default();
    report(
        "graph step with the final-hidden tap == direct (bitwise)",
        bits(&gt.logits, &dt.logits)
            && bits(&gt.logits, &g.logits)
            && !tap(&gt).is_empty()
            && bits(&tap(&gt), &tap(&dt)),
    );
    s2 = s1.snapshot()?;
    drop(s2);
    Ok(ok)
}

/// Speculative rounds as the runtime runs them (hybrid fork prefill, begin_tape, a verify block with
/// the final-hidden tap, rollback of the rejected rows, end_tape) over blocks of 2..=6 rows with one
/// wrong proposal in most blocks: every verify row whose inputs match the sequential stream must equal
/// the sequential decode row bit for bit. Returns false on the first mismatch (printed).
pub fn spec_rounds(
    dev: &Arc<CudaDevice>,
    dir: &Path,
    tensor_cores: bool,
    verify_graphs: bool,
) -> Result<bool> {
    let ck = Checkpoint::open(dir)?;
    let opts = LoadOptions {
        weights: WeightFormat::Bf16,
        tensor_core_gemv: tensor_cores,
        verify_graphs,
        ..crate::base_options()
    };
    let gpu = CudaModel::load(dev, &ck, opts)?;
    let name = dir
        .file_name()
        .map_or("?".into(), |n| n.to_string_lossy().into_owned());
    let vocab = gpu.vocab as u32;
    let prompt: Vec<u32> = (0..35u32).map(|i| (i * 7 + 3) % vocab).collect();
    let (n, steps) = (prompt.len(), 48);
    let bits = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    let prefill = |st: &mut cuda_backend::CudaState| -> Result<Vec<f32>> {
        gpu.forward(&prompt[..n - 1], 0, st, &Wanted::none())?;
        Ok(gpu
            .forward(&prompt[n - 1..], n - 1, st, &Wanted::last())?
            .logits)
    };
    // Sequential: tokens[i] is committed at position n + i; rows[i] = logits after it.
    let mut seq = gpu.new_state(n + steps + 8)?;
    let mut last = prefill(&mut seq)?;
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let t = argmax(&last);
        tokens.push(t);
        last = gpu
            .forward(&[t], seq.position(), &mut seq, &Wanted::last())?
            .logits;
        rows.push(last.clone());
    }
    let mut spec = gpu.new_state(n + steps + 8)?;
    prefill(&mut spec)?;
    let taps = [Tap::FinalHidden];
    let wanted = Wanted {
        logits: Rows::All,
        taps: taps.to_vec(),
        argmax_only: false,
        candidates: 0,
    };
    let (mut done, mut round) = (0usize, 0usize);
    while done + 7 < steps {
        let block = 2 + round % 5; // 2..=6 rows
        let wrong = (round * 3) % (block + 1); // == block - 1 + 1: all proposals right
        let mut feed: Vec<u32> = tokens[done..done + block].to_vec();
        if wrong >= 1 && wrong < block {
            feed[wrong] = (feed[wrong] + 1) % vocab;
        }
        gpu.begin_tape(&mut spec)?;
        let out = gpu.forward(&feed, n + done, &mut spec, &wanted)?;
        let valid = if wrong >= 1 && wrong < block {
            wrong
        } else {
            block
        };
        for i in 0..valid {
            if !bits(out.row(i), &rows[done + i]) {
                println!(
                    "  [{name} tc={tensor_cores} verify_graphs={verify_graphs}] speculative round {round} (block {block}, position {}): \
                     row {i} differs from the sequential row  FAIL",
                    n + done
                );
                return Ok(false);
            }
        }
        if valid < block {
            gpu.rollback_retaining(&mut spec, valid)?;
        }
        spec.end_tape();
        done += valid;
        round += 1;
    }
    println!(
        "  [{name} tc={tensor_cores} verify_graphs={verify_graphs}] {round} speculative rounds (blocks 2..6, rollbacks) == sequential rows (bitwise)  ok"
    );
    // Greedy chains (chain.rs) stopped by the caller after 5, 1 and 8 tokens, then one to the end of the
    // budget: the same tokens, and the state continues as the sequential one (the dropped steps' writes
    // went to the other buffers).
    let mut chained = gpu.new_state(n + steps + 8)?;
    prefill(&mut chained)?;
    let mut at = 0; // tokens[at] is the next to run, at position n + at
    for stop_after in [5, 1, 8, usize::MAX] {
        let budget = steps - 1 - at;
        let mut got = Vec::new();
        let mut on_token = |t: u32| {
            got.push(t);
            got.len() < stop_after
        };
        let Some(kept) =
            gpu.greedy_chain(tokens[at], n + at, &mut chained, budget, &mut on_token)?
        else {
            println!("  [{name} tc={tensor_cores}] greedy chain declined  FAIL");
            return Ok(false);
        };
        let want = &tokens[at + 1..at + 1 + got.len()];
        if got != want || kept != got.len() || chained.position() != n + at + kept {
            println!(
                "  [{name} tc={tensor_cores}] greedy chain from position {}: tokens {got:?} (kept {kept}, position {}) against {want:?}  FAIL",
                n + at,
                chained.position()
            );
            return Ok(false);
        }
        at += kept;
    }
    let probe = gpu.forward(&[tokens[at]], n + at, &mut chained, &Wanted::last())?;
    if !bits(&probe.logits, &rows[at]) {
        println!("  [{name} tc={tensor_cores}] the state after greedy chains differs from the sequential one  FAIL");
        return Ok(false);
    }
    println!("  [{name} tc={tensor_cores} verify_graphs={verify_graphs}] greedy chains stopped after 5 / 1 / 8 tokens and at the budget == sequential (tokens, then the state's next row bitwise)  ok");
    Ok(true)
}
