//! Causal grouped-query attention over a KV cache (transformers' eager attention, f32).
//!
//! Query row i (absolute position start + i) of head h attends to cache rows t <= start + i of kv head
//! h / (hq / hkv): `out = softmax(q·k^T * scale) · v`, softmax with the row maximum subtracted, probabilities
//! normalised before the weighted sum of values (torch's order: scores, softmax, then matmul).
//!
//! Work split: one task per (kv head, block of query rows), on the rayon pool (a kv head's query heads are
//! split over several tasks only when there are fewer tasks than threads). A task gathers the queries of
//! its heads for its rows into Q [queries, d] and computes two small GEMMs through `gemm`
//! (runtime CPU dispatch), reading the cache in place through strided views:
//!   S = Q · K[0..keys]^T * scale   [queries, keys]    (keys = the block's last visible position + 1)
//!   O = softmax_causal(S) · V[0..keys]                 [queries, d]
//! so each cached row is read once per group and block, not once per query head.
//!
//! Invariant: no cache row past start + n - 1 is read; a query's probabilities past its own position are
//! exactly 0 (scores there are computed inside the block's triangle but overwritten before use); every output
//! row is written exactly once.

use rayon::prelude::*;

use crate::linear::{check_len, matmul_serial, MatView};

/// Query vectors (rows x heads of one group) per task: enough to make the GEMMs efficient, few enough that
/// the causal triangle computed and discarded inside a block stays small.
const QUERIES_PER_TASK: usize = 64;

/// Shapes of one attention call.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    start: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    group: usize,
    heads_per_task: usize,
    rows_per_block: usize,
    scale: f32,
}

/// Causal attention for n query rows at absolute positions start..start+n over a KV cache holding positions
/// 0..start+n. q [n, hq, d]; k_cache, v_cache [>= start+n, hkv, d] (row t = position t); query head h uses kv
/// head h / (hq / hkv). out [n, hq, d].
///
/// Panics (programmer error) if hq is not a multiple of hkv or a buffer is shorter than its shape.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n: usize,
    start: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f32,
    out: &mut [f32],
) {
    if n == 0 || hq == 0 || d == 0 {
        return;
    }
    assert!(
        hkv > 0 && hq.is_multiple_of(hkv),
        "attention: hq {hq} is not a multiple of hkv {hkv}"
    );
    check_len("attention: q [n, hq, d]", q.len(), n * hq * d);
    check_len(
        "attention: k_cache [start+n, hkv, d]",
        k_cache.len(),
        (start + n) * hkv * d,
    );
    check_len(
        "attention: v_cache [start+n, hkv, d]",
        v_cache.len(),
        (start + n) * hkv * d,
    );
    check_len("attention: out [n, hq, d]", out.len(), n * hq * d);
    if n <= ROW_PATH_MAX_ROWS {
        attention_rows(q, k_cache, v_cache, n, start, hq, hkv, d, scale, out);
        return;
    }
    let group = hq / hkv;
    let rows_per_block = (QUERIES_PER_TASK / group).clamp(1, n);
    let blocks = n.div_ceil(rows_per_block);
    let heads_per_task = group / head_parts(group, hkv * blocks, rayon::current_num_threads());
    let dims = Dims {
        n,
        start,
        hq,
        hkv,
        d,
        group,
        heads_per_task,
        rows_per_block,
        scale,
    };
    // Task t covers query heads [head_set * heads_per_task, +heads_per_task) for query-row block `block`.
    let head_sets = hq / heads_per_task;
    let tasks = head_sets * blocks;
    let run = |task: usize| attend_block(&dims, q, k_cache, v_cache, task / blocks, task % blocks);
    let results: Vec<Vec<f32>> = if tasks == 1 {
        vec![run(0)]
    } else {
        (0..tasks).into_par_iter().map(run).collect()
    };
    // Scatter each task's [rows, heads_per_task, d] result into out [n, hq, d].
    let width = heads_per_task * d;
    for (task, result) in results.iter().enumerate() {
        let (head_set, block) = (task / blocks, task % blocks);
        let first_row = block * rows_per_block;
        for (r, row_result) in result.chunks_exact(width).enumerate() {
            let at = (first_row + r) * hq * d + head_set * width;
            out[at..at + width].copy_from_slice(row_result);
        }
    }
}

/// Decode and verify blocks (≤ this many rows) take the per-query path, whose result for a row does not
/// depend on how many rows share the call: the GEMM path's blocking does, and a verify row must equal the
/// sequential step bit for bit for greedy speculative decoding to equal sequential decoding.
pub const ROW_PATH_MAX_ROWS: usize = crate::MATVEC_MAX_ROWS;

/// One task per (query row, head): scores, max-subtracted softmax, then the weighted sum of values, each
/// in a fixed order over cache positions.
#[allow(clippy::too_many_arguments)]
fn attention_rows(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n: usize,
    start: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f32,
    out: &mut [f32],
) {
    let group = hq / hkv;
    let work = |(idx, o): (usize, &mut [f32])| {
        let (row, head) = (idx / hq, idx % hq);
        let kvh = head / group;
        let qv = &q[idx * d..(idx + 1) * d];
        let keys = start + row + 1;
        let mut p: Vec<f32> = (0..keys)
            .map(|t| {
                let kv = &k_cache[(t * hkv + kvh) * d..(t * hkv + kvh + 1) * d];
                qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
            })
            .collect();
        let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for x in p.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        o.iter_mut().for_each(|x| *x = 0.0);
        for (t, &pt) in p.iter().enumerate() {
            let w = pt / sum;
            let vv = &v_cache[(t * hkv + kvh) * d..(t * hkv + kvh + 1) * d];
            for (x, &v) in o.iter_mut().zip(vv) {
                *x += w * v;
            }
        }
    };
    let out = &mut out[..n * hq * d];
    if (start + n) * hq * d < (1 << 15) {
        out.chunks_mut(d).enumerate().for_each(work);
    } else {
        out.par_chunks_mut(d).enumerate().for_each(work);
    }
}

/// Into how many parts each kv head's group of query heads is split: 1 (each cached row read once per
/// group) unless that leaves threads idle, as in decode with few kv heads (Qwen3-Next: 2); then the
/// smallest divisor of `group` that gives every thread a task. Parts re-read the same rows, from cache.
fn head_parts(group: usize, tasks: usize, threads: usize) -> usize {
    if tasks >= threads {
        return 1;
    }
    let wanted = threads.div_ceil(tasks.max(1));
    (1..=group)
        .find(|p| group.is_multiple_of(*p) && *p >= wanted)
        .unwrap_or(group)
}

/// One task: query rows of `block` for query heads [head_set * heads_per_task, +heads_per_task), all of one
/// kv head. Returns [rows, heads_per_task, d].
fn attend_block(
    dims: &Dims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    head_set: usize,
    block: usize,
) -> Vec<f32> {
    let Dims {
        n,
        start,
        hq,
        hkv,
        d,
        group,
        heads_per_task,
        rows_per_block,
        scale,
    } = *dims;
    let first_head = head_set * heads_per_task;
    let kv_head = first_head / group;
    let first_row = block * rows_per_block;
    let rows = rows_per_block.min(n - first_row);
    let queries = rows * heads_per_task;
    // Query vector r = (row first_row + r / heads_per_task, head first_head + r % heads_per_task) sees keys
    // 0..visible(r).
    let visible = |r: usize| start + first_row + r / heads_per_task + 1;
    let keys = start + first_row + rows; // visible() of the block's last row
    let mut query_buf = Vec::with_capacity(queries * d); // [rows, heads_per_task, d] = [queries, d]
    for row in first_row..first_row + rows {
        let at = (row * hq + first_head) * d;
        query_buf.extend_from_slice(&q[at..at + heads_per_task * d]);
    }
    // The kv head's rows 0..keys of the cache, read in place: row t starts at (t * hkv + kv_head) * d.
    let head_offset = kv_head * d;
    let row_stride = hkv * d;
    let keys_t = MatView {
        data: &k[head_offset..],
        rows: d,
        cols: keys,
        rs: 1,
        cs: row_stride,
    }; // [d, keys]
    let values = MatView {
        data: &v[head_offset..],
        rows: keys,
        cols: d,
        rs: row_stride,
        cs: 1,
    }; // [keys, d]
    let mut scores = vec![0.0f32; queries * keys]; // [queries, keys]
    matmul_serial(
        &mut scores,
        MatView::row_major(&query_buf, queries, d),
        keys_t,
        scale,
        false,
    );
    for (r, row) in scores.chunks_exact_mut(keys).enumerate() {
        let (seen, masked) = row.split_at_mut(visible(r));
        softmax(seen);
        masked.iter_mut().for_each(|p| *p = 0.0);
    }
    let mut out = vec![0.0f32; queries * d]; // [queries, d]
    matmul_serial(
        &mut out,
        MatView::row_major(&scores, queries, keys),
        values,
        1.0,
        false,
    );
    out
}

/// Max-subtracted softmax in place (torch's order: exp(x - max), sum, then scale by 1 / sum).
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for s in x.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|s| *s *= inv);
}
