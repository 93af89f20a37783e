//! Batch-1 decode throughput on a synthetic Qwen3.5-4B-shaped model and its roofline fraction.
//!
//! The model's shape is synth's `qwen35-4b` (its config.json parsed by model-io, so the GPU sees exactly
//! what a written checkpoint would give); its bf16 matrices are generated on the GPU, not written to disk
//! and uploaded (8 GB through synth's single-threaded writer would cost minutes of device time for no
//! information: decode speed does not depend on the weights' values).
//!
//! Roofline: a batch-1 decode step must read every matrix once, so tok/s <= bandwidth / weight bytes.
//! Bandwidth is the measured device-to-device copy rate counting read + write (the same convention as the
//! issue's ~530 tok/s for 7.9 GB at ~4.2 TB/s).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use cuda_backend::{CudaDevice, CudaModel, LoadOptions};
use families::Wanted;
use model_io::ModelConfig;

/// Device-to-device copy bandwidth in bytes/s, counting read + write: the best of 7 timed batches of 10
/// copies of 1 GiB. One batch alone read 3.80 TB/s where the same call's other measurements
/// read 4.22 (an overstated roofline fraction); the best batch is the conservative roofline.
pub fn copy_bandwidth(dev: &CudaDevice) -> Result<f64> {
    let bytes = 1usize << 30;
    let stream = dev
        .stream()
        .ok_or_else(|| anyhow::anyhow!("no GPU stream"))?;
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    for _ in 0..2 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    stream.synchronize()?;
    let iters = 10;
    let mut rates = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..iters {
            stream.memcpy_dtod(&src, &mut dst)?;
        }
        stream.synchronize()?;
        rates.push(2.0 * (bytes * iters) as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "D2D copy batches: {:.0} .. {:.0} GB/s (the best is the roofline's bandwidth)",
        rates[0] / 1e9,
        rates[rates.len() - 1] / 1e9
    );
    Ok(rates[rates.len() - 1])
}

/// One benchmark configuration's outcome.
struct Outcome {
    tokens: Vec<u32>,
    last_logits: Vec<f32>,
}

/// Decode and prefill throughput per launch configuration (CUDA graphs, programmatic dependent launch),
/// the per-operation profiles of one decode step and one prefill pass, and a verify-block round. Every
/// configuration must produce the same tokens and bitwise the same final logits (returns false if not).
pub fn run(
    dev: &Arc<CudaDevice>,
    shape_name: &str,
    prompt_len: usize,
    new_tokens: usize,
) -> Result<bool> {
    let shape = synth::shape(shape_name)?;
    let config = ModelConfig::from_json_str(
        &shape.config_json().to_string(),
        Path::new(&format!("synth:{shape_name}/config.json")),
    )?;
    // The kernel simulator has no bandwidth to measure: its numbers check the logic, not the speed.
    let bw = if dev.is_emulated() {
        f64::NAN
    } else {
        copy_bandwidth(dev)?
    };
    println!("bench: D2D copy {:.0} GB/s (read + write)", bw / 1e9);
    let default_pdl = dev.pdl();
    let mut reference: Option<Outcome> = None;
    let mut consistent = true;
    // The tensor-core GEMV (last) rounds differently, so only the FMA configurations must agree in bits.
    // Segments (one persistent kernel per run of GEMVs) must give the per-GEMV launches' bits.
    for (i, (graphs, pdl, tc, seg)) in [
        (true, true, false, false),
        (true, true, false, true),
        (true, false, false, false),
        (false, true, false, false),
        (false, true, false, true),
        (true, true, true, false),
    ]
    .into_iter()
    .enumerate()
    {
        // CUDA_CHECK_CONFIGS=1,3 runs only those configurations (e.g. under a profiler).
        if let Ok(only) = std::env::var("CUDA_CHECK_CONFIGS") {
            if !only.split(',').any(|c| c.trim() == i.to_string()) {
                continue;
            }
        }
        dev.set_pdl(pdl);
        let detail = i == 0 || tc || (seg && graphs);
        let outcome = one_config(
            dev, &config, shape_name, prompt_len, new_tokens, graphs, tc, seg, bw, detail,
        )?;
        let name = format!(
            "graphs={graphs} pdl={} tensor_core_gemv={tc} segments={seg}",
            dev.pdl()
        );
        if tc {
            let same = reference.as_ref().map_or(0, |r| {
                r.tokens
                    .iter()
                    .zip(&outcome.tokens)
                    .take_while(|(a, b)| a == b)
                    .count()
            });
            println!(
                "bench {name}: first {same} of {} tokens equal to the FMA configuration's",
                outcome.tokens.len()
            );
            continue;
        }
        match &reference {
            None => reference = Some(outcome),
            Some(r) => {
                let same = r.tokens == outcome.tokens
                    && r.last_logits.len() == outcome.last_logits.len()
                    && r.last_logits
                        .iter()
                        .zip(&outcome.last_logits)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                consistent &= same;
                println!(
                    "bench {name}: tokens and final logits vs the first configuration: {}",
                    if same { "identical (bits)" } else { "DIFFER" }
                );
            }
        }
    }
    dev.set_pdl(default_pdl);
    if let Some(report) = cuda_lab::segment_trace::device_report(dev) {
        print!("{report}");
    }
    println!("bench: segments {:?}", dev.segment_status());
    if let Some(why) = dev.pdl_failure() {
        println!("bench: programmatic dependent launch was turned off: {why}");
    }
    Ok(consistent)
}

/// Row counts of the verify-cost curve.
pub const VERIFY_ROWS: [usize; 8] = [1, 2, 4, 5, 8, 9, 12, 16];

/// Milliseconds of one verify round (n draft rows forwarded, tape on, rolled back) per n in
/// VERIFY_ROWS, each the median of 10 rounds after an untimed one (which captures the block's graph
/// when verify graphs are on). `ids_only`: the rows' argmax ids come back (a greedy round, as the
/// runtime runs it), else every logits row (a sampled round). The state is left where it was.
pub fn verify_curve(
    dev: &CudaDevice,
    model: &CudaModel,
    st: &mut cuda_backend::CudaState,
    next: u32,
    ids_only: bool,
) -> Result<Vec<f64>> {
    let rounds = 10;
    let wanted = Wanted {
        argmax_only: ids_only,
        candidates: 0,
        ..Wanted::all()
    };
    let mut out = Vec::new();
    for n in VERIFY_ROWS {
        let drafts: Vec<u32> = (0..n)
            .map(|i| (next as usize + 31 * i) as u32 % model.vocab as u32)
            .collect();
        let mut ms = Vec::with_capacity(rounds);
        for round in 0..=rounds {
            dev.synchronize()?;
            let t = Instant::now();
            let pos = st.position();
            model.begin_tape(st)?;
            model.forward(&drafts, pos, st, &wanted)?;
            model.rollback_retaining(st, 0)?;
            dev.synchronize()?;
            if round > 0 {
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        ms.sort_by(f64::total_cmp);
        out.push(ms[rounds / 2]);
    }
    Ok(out)
}

fn print_profile(title: &str, rows: &[cuda_lab::profile::ProfileRow]) {
    let total: f64 = rows.iter().map(|r| r.ms).sum();
    println!("bench profile of {title} ({total:.3} ms):");
    for r in rows {
        let gbs = if r.bytes > 0 {
            format!(" {:.0} GB/s", r.bytes as f64 / (r.ms * 1e-3) / 1e9)
        } else {
            String::new()
        };
        println!("  {:<24} x{:<3} {:8.3} ms{gbs}", r.label, r.calls, r.ms);
    }
}

/// One configuration; `detail` adds the verify round and the profiles.
#[allow(clippy::too_many_arguments)]
fn one_config(
    dev: &Arc<CudaDevice>,
    config: &ModelConfig,
    shape_name: &str,
    prompt_len: usize,
    new_tokens: usize,
    graphs: bool,
    tensor_cores: bool,
    segments: bool,
    bw: f64,
    detail: bool,
) -> Result<Outcome> {
    let t = Instant::now();
    let opts = LoadOptions {
        graphs,
        tensor_core_gemv: tensor_cores,
        segments,
        ..crate::base_options()
    };
    let model = CudaModel::random(dev, config, 7, opts)?;
    let load_s = t.elapsed().as_secs_f64();
    let wbytes = model.weight_bytes() as f64;
    let roof = bw / wbytes;
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| ((i * 7919 + 13) % model.vocab) as u32)
        .collect();
    // Warm-up prefill (cuBLAS picks its algorithms on first use), not timed.
    let mut warm = model.new_state(prompt_len + 1)?;
    model.forward(&prompt, 0, &mut warm, &Wanted::last())?;
    drop(warm);
    let mut st = model.new_state(prompt_len + new_tokens + 16)?; // + a verify block
    dev.synchronize()?;
    let t = Instant::now();
    let mut out = model.forward(&prompt, 0, &mut st, &Wanted::last())?;
    let prefill_s = t.elapsed().as_secs_f64();
    // Warm-up step (captures the graph), not timed.
    let mut next = kernels::argmax(out.row(0)) as u32;
    let mut tokens = vec![next];
    out = model.forward(&[next], st.position(), &mut st, &Wanted::last())?;
    let steps = new_tokens.saturating_sub(1).max(1);
    // Greedy as the runtime runs it: the argmax taken on the device; the last step returns its logits
    // row, which the modes compare.
    let greedy = Wanted {
        argmax_only: true,
        candidates: 0,
        ..Wanted::last()
    };
    let t = Instant::now();
    for i in 0..steps {
        next = match &out.argmax {
            Some(ids) => ids[0],
            None => kernels::argmax(out.row(0)) as u32,
        };
        tokens.push(next);
        let wanted = if i + 1 == steps {
            &Wanted::last()
        } else {
            &greedy
        };
        out = model.forward(&[next], st.position(), &mut st, wanted)?;
    }
    let decode_s = t.elapsed().as_secs_f64();
    let tps = steps as f64 / decode_s;
    let name = format!(
        "graphs={graphs} pdl={} tc={tensor_cores} seg={segments}",
        dev.pdl()
    );
    if graphs {
        println!("bench {name}: decode graph status {:?}", st.graph_status());
    }
    println!(
        "bench {shape_name} {name}: weights {:.2} GB (generated in {load_s:.1} s); prefill {prompt_len} tokens {:.1} ms ({:.0} tok/s); \
         decode {steps} tokens at ctx {}..{}: {tps:.1} tok/s = {:.1}% of roofline {roof:.0} tok/s ({:.0} GB/s effective)",
        wbytes / 1e9,
        prefill_s * 1e3,
        prompt_len as f64 / prefill_s,
        prompt_len + 1,
        st.position(),
        100.0 * tps / roof,
        tps * wbytes / 1e9,
    );
    let outcome = Outcome {
        tokens,
        last_logits: out.logits.clone(),
    };
    if !out.logits.iter().all(|x| x.is_finite()) {
        println!("bench: WARNING non-finite logits");
    }
    if detail {
        // The verify-cost curve: one speculative verify round (n rows, tape on, then rolled back) for
        // n = 1, 2, 4, 8, 16, relative to n = 1 — the physics that picks the block; greedy (ids back)
        // and sampled (every logits row back).
        for (ids_only, what) in [(true, "argmax ids"), (false, "all logits")] {
            let curve = verify_curve(dev, &model, &mut st, next, ids_only)?;
            for (n, ms) in VERIFY_ROWS.iter().zip(&curve) {
                println!(
                    "bench {name}: verify round of {n:2} rows ({what} to the host) + rollback: {ms:.3} ms = {:.2}x one row",
                    ms / curve[0]
                );
            }
        }
        println!("bench {name}: verify graphs {:?}", st.verify_graph_status());
        if dev.is_emulated() {
            return Ok(outcome);
        }
        if graphs {
            let mut scratch = model.new_state(prompt_len + 2)?;
            model.forward(&prompt, 0, &mut scratch, &Wanted::last())?;
            if let Some(ms) = cuda_lab::profile::time_decode_graph(&model, &mut scratch, next, 50)?
            {
                let wall_ms = 1e3 / tps;
                println!(
                    "bench {name}: decode graph alone {ms:.3} ms per step on the GPU ({:.1}% of roofline) vs {wall_ms:.3} ms per token end to end: host side {:.3} ms",
                    100.0 / (ms * 1e-3) / roof,
                    wall_ms - ms
                );
                if let Some(h) = cuda_lab::profile::host_costs(&model, &mut scratch, next, 50)? {
                    let argmax_ms = {
                        let row = out.row(0);
                        let t = Instant::now();
                        for _ in 0..50 {
                            std::hint::black_box(kernels::argmax(std::hint::black_box(row)));
                        }
                        t.elapsed().as_secs_f64() * 1e3 / 50.0
                    };
                    println!(
                        "bench {name}: host costs per step: logits row to the host {:.3} ms, id upload {:.3} ms, graph launch + wait {:.3} ms (GPU {ms:.3}), argmax {argmax_ms:.3} ms",
                        h.logits_copy_ms, h.id_upload_ms, h.graph_launch_sync_ms
                    );
                }
                // Chained greedy steps (chain.rs) from the prompt's end, as the runtime decodes: the
                // graph's time plus what still separates its steps; the same tokens as the steps above.
                let tokens = &outcome.tokens;
                let n = 50.min(tokens.len().saturating_sub(3));
                let mut chained = model.new_state(prompt_len + n + 8)?;
                model.forward(&prompt, 0, &mut chained, &Wanted::last())?;
                let mut got = Vec::new();
                let at = chained.position();
                // Two steps capture the chain's graphs, untimed.
                let mut keep = |t: u32| {
                    got.push(t);
                    true
                };
                if n > 0
                    && model
                        .greedy_chain(tokens[0], at, &mut chained, 2, &mut keep)?
                        .is_some()
                {
                    let at = chained.position();
                    let t = Instant::now();
                    model.greedy_chain(tokens[2], at, &mut chained, n, &mut keep)?;
                    let chain_ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
                    let same = got[..] == tokens[1..got.len() + 1];
                    println!(
                        "bench {name}: chained greedy steps {chain_ms:.3} ms per token end to end ({:.1}% of roofline; the graph alone {ms:.3}); tokens {}",
                        100.0 / (chain_ms * 1e-3) / roof,
                        if same { "identical" } else { "DIFFER" }
                    );
                    if !same {
                        anyhow::bail!(
                            "chained greedy tokens {got:?} differ from the stepped ones {:?}",
                            &tokens[1..got.len() + 1]
                        );
                    }
                }
            }
        }
        print_profile(
            "one un-graphed decode step",
            &cuda_lab::profile::profile_decode(&model, &mut st, next)?,
        );
        // Where a verify round's time goes (compare with the one-row step above).
        for rows in [4, 9] {
            let drafts: Vec<u32> = (0..rows)
                .map(|i| (next as usize + 31 * i) as u32 % model.vocab as u32)
                .collect();
            print_profile(
                &format!(
                    "one verify round of {rows} rows (tape, all logits to the host, rollback)"
                ),
                &cuda_lab::profile::profile_verify(&model, &mut st, &drafts)?,
            );
        }
        // A forward splits longer prompts into passes of max_pass_rows: profile the first pass.
        let pass_len = prompt_len.min(model.options().max_pass_rows.max(1));
        let mut ps = model.new_state(pass_len + 1)?;
        print_profile(
            &format!("one prefill pass of {pass_len} tokens"),
            &cuda_lab::profile::profile_pass(&model, &mut ps, &prompt[..pass_len])?,
        );
    }
    Ok(outcome)
}

/// The GEMV kernel sweep on the qwen35-4b matrix shapes (`--sweep`): one line per (shape, rows,
/// kernel), then the fastest kernel per (shape, rows).
pub fn sweep(dev: &CudaDevice) -> Result<(), Box<dyn std::error::Error>> {
    use cuda_lab::sweep::{gemv_sweep, SweepOp};
    let shapes = [
        ("gdn norm+proj", 12352, 2560, SweepOp::Normed),
        ("attn norm+qkv", 10240, 2560, SweepOp::Normed),
        ("o / gdn out", 2560, 4096, SweepOp::Acc),
        ("mlp gate_up", 18432, 2560, SweepOp::Swiglu),
        ("mlp down", 2560, 9216, SweepOp::Acc),
        ("norm+lm head", 151936, 2560, SweepOp::Normed),
    ];
    let rows = gemv_sweep(dev, &shapes, &[1, 4, 8, 16], 40)?;
    for r in &rows {
        println!(
            "sweep {:<32} rows {:>2} {:<16} {:>9.2} us {:>7.0} GB/s",
            r.shape, r.rows, r.kernel, r.us, r.gbs
        );
    }
    Ok(())
}
