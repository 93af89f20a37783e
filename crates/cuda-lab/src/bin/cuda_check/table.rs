//! The performance table from one run (`cuda_check --table`): for each synthetic shape (random
//! bf16 weights generated on the GPU, synth's configs), batch-1 greedy decode tok/s after a 512-token
//! prompt (128 new tokens) and its fraction of the roofline, prefill tok/s at 512 and 4096 prompt
//! tokens, and the verify-cost curve (a greedy round: 1, 2, 4, 8, 16 rows relative to one, argmax ids
//! back, medians of 10) with the FMA GEMV and the tensor-core GEMV.
//!
//! Roofline = the device-to-device copy rate (read + write, measured once at the start) / the weight
//! bytes a decode step must read. Every figure is from this one process, shapes measured one after
//! another, so ratios between rows are side by side.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use cuda_backend::{CudaDevice, CudaModel, LoadOptions};
use families::Wanted;
use model_io::ModelConfig;

use crate::bench::{copy_bandwidth, verify_curve, VERIFY_ROWS};

/// One shape's measurements.
struct Row {
    shape: String,
    gb: f64,
    roofline: f64,
    decode_tps: f64,
    decode_tc_tps: f64,
    prefill_512: f64,
    prefill_4096: f64,
    verify_fma: Vec<f64>,
    verify_tc: Vec<f64>,
}

/// Seconds of one forward of `prompt` on a fresh state (after an untimed warm-up pass of 512 tokens,
/// so cuBLAS has chosen its algorithms).
fn prefill_s(dev: &CudaDevice, model: &CudaModel, prompt: &[u32]) -> Result<f64> {
    let mut st = model.new_state(prompt.len() + 1)?;
    dev.synchronize()?;
    let t = Instant::now();
    model.forward(prompt, 0, &mut st, &Wanted::last())?;
    dev.synchronize()?;
    Ok(t.elapsed().as_secs_f64())
}

/// Decode tok/s over `new` greedy tokens after `prompt`, as the runtime decodes greedy requests (steps
/// chained: chain.rs), and one forward call per token (the argmax taken on the device either way); the
/// state and last token for the verify curve.
fn decode(
    model: &CudaModel,
    prompt: &[u32],
    new: usize,
) -> Result<(f64, f64, cuda_backend::CudaState, u32)> {
    let greedy = Wanted {
        argmax_only: true,
        candidates: 0,
        ..Wanted::last()
    };
    let token = |out: &families::ForwardOut| match &out.argmax {
        Some(ids) => ids[0],
        None => kernels::argmax(out.row(0)) as u32,
    };
    let steps = new.saturating_sub(1).max(1);
    // Room for both runs and the verify curve's 16 rows after them.
    let mut st = model.new_state(prompt.len() + 2 * steps + 64)?;
    let out = model.forward(prompt, 0, &mut st, &greedy)?;
    let mut next = token(&out);
    // One untimed step captures the decode graph.
    let mut out = model.forward(&[next], st.position(), &mut st, &greedy)?;
    let t = Instant::now();
    for _ in 0..steps {
        next = token(&out);
        out = model.forward(&[next], st.position(), &mut st, &greedy)?;
    }
    let stepped = steps as f64 / t.elapsed().as_secs_f64();
    next = token(&out);
    // Two untimed chained steps capture the chain's graphs; then `steps` chained ones.
    let mut first = next;
    let at = st.position();
    model
        .greedy_chain(next, at, &mut st, 2, &mut |t| {
            first = t;
            true
        })?
        .ok_or_else(|| anyhow::anyhow!("the backend declined a greedy chain"))?;
    let mut last = first;
    let t = Instant::now();
    let at = st.position();
    model
        .greedy_chain(first, at, &mut st, steps, &mut |t| {
            last = t;
            true
        })?
        .ok_or_else(|| anyhow::anyhow!("the backend declined a greedy chain"))?;
    let chained = steps as f64 / t.elapsed().as_secs_f64();
    Ok((chained, stepped, st, last))
}

fn measure(dev: &Arc<CudaDevice>, shape_name: &str, bw: f64, new: usize) -> Result<Row> {
    let shape = synth::shape(shape_name)?;
    let config = ModelConfig::from_json_str(
        &shape.config_json().to_string(),
        Path::new(&format!("synth:{shape_name}/config.json")),
    )?;
    let mut row = Row {
        shape: shape_name.to_string(),
        gb: 0.0,
        roofline: 0.0,
        decode_tps: 0.0,
        decode_tc_tps: 0.0,
        prefill_512: 0.0,
        prefill_4096: 0.0,
        verify_fma: Vec::new(),
        verify_tc: Vec::new(),
    };
    for tc in [false, true] {
        let opts = LoadOptions {
            tensor_core_gemv: tc,
            ..crate::base_options()
        };
        let model = CudaModel::random(dev, &config, 7, opts)?;
        let prompt = |len: usize| -> Vec<u32> {
            (0..len)
                .map(|i| ((i * 7919 + 13) % model.vocab) as u32)
                .collect()
        };
        let p512 = prompt(512);
        prefill_s(dev, &model, &p512)?; // warm-up
        let (tps, stepped, mut st, next) = decode(&model, &p512, new)?;
        println!(
            "table: {shape_name} tc={tc}: decode {tps:.1} tok/s with chained steps, {stepped:.1} one forward call a token"
        );
        let curve = verify_curve(dev, &model, &mut st, next, true)?;
        drop(st);
        if tc {
            row.decode_tc_tps = tps;
            row.verify_tc = curve;
            continue;
        }
        row.gb = model.weight_bytes() as f64 / 1e9;
        row.roofline = bw / model.weight_bytes() as f64;
        row.decode_tps = tps;
        row.verify_fma = curve;
        row.prefill_512 = 512.0 / prefill_s(dev, &model, &p512)?;
        row.prefill_4096 = 4096.0 / prefill_s(dev, &model, &prompt(4096))?;
    }
    Ok(row)
}

/// Measures every shape and prints the table; false if a shape failed.
pub fn run(dev: &Arc<CudaDevice>, shapes: &[&str], new: usize) -> Result<bool> {
    let bw = copy_bandwidth(dev)?;
    println!("table: D2D copy {:.0} GB/s (read + write)", bw / 1e9);
    // The read-only ceiling beside it: the roofline column keeps the copy rate (the convention).
    match cuda_lab::profile::read_bandwidth(dev) {
        Ok(read) => println!(
            "table: read-only stream {:.0} GB/s; against it every roofline fraction below is x{:.3}",
            read / 1e9,
            bw / read
        ),
        Err(e) => println!("table: read-only stream not measured: {e}"),
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for s in shapes {
        match measure(dev, s, bw, new) {
            Ok(r) => rows.push(r),
            Err(e) => {
                ok = false;
                println!("table: {s}: ERROR {e:#}");
            }
        }
    }
    let curve = |v: &[f64]| {
        v.iter()
            .map(|ms| format!("{:.2}", ms / v[0]))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "\n| shape (bf16) | weights | roofline | decode tok/s (FMA GEMV) | decode tok/s (tensor-core GEMV) | prefill 512 | prefill 4096 | greedy verify {:?} rows x one row, FMA | same, tensor cores |",
        VERIFY_ROWS
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {:.2} GB | {:.0} tok/s | **{:.1}** ({:.1}%) | {:.1} ({:.1}%) | {:.1}k tok/s | {:.1}k tok/s | {} ({:.2} ms) | {} ({:.2} ms) |",
            r.shape,
            r.gb,
            r.roofline,
            r.decode_tps,
            100.0 * r.decode_tps / r.roofline,
            r.decode_tc_tps,
            100.0 * r.decode_tc_tps / r.roofline,
            r.prefill_512 / 1e3,
            r.prefill_4096 / 1e3,
            curve(&r.verify_fma),
            r.verify_fma[0],
            curve(&r.verify_tc),
            r.verify_tc[0],
        );
    }
    Ok(ok)
}
