//! Causal grouped-query attention over a KV cache (transformers' eager attention, f32).
//!
//! Query row i (absolute position start + i) of head h attends to cache rows t <= start + i of kv head
//! h / (hq / hkv): `out = softmax(q·k^T * scale) · v`, softmax with the row maximum subtracted, probabilities
//! normalised before the weighted sum of values (torch's order: softmax, then matmul).
//!
//! Work split: one task per (kv head, block of query rows). A task gathers the queries of all heads of its
//! group for its rows, then streams each key and value row once for all of them, so a cached row is read once
//! per group and block instead of once per query. Tasks run on the rayon pool; the inner dot products and
//! axpys are vectorised through runtime dispatch (see `simd`).
//!
//! Invariant: a query never reads a cache row beyond its own position (masked scores are never computed);
//! every output row is written exactly once.

use rayon::prelude::*;

use crate::linear::check_len;
use crate::simd::{self, Isa};

/// Query vectors (rows x heads of one group) per task: large enough to reuse each streamed K/V row, small
/// enough that the task's queries and outputs stay in L1/L2.
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
    attention_with_isa(
        simd::best_isa(),
        q,
        k_cache,
        v_cache,
        n,
        start,
        hq,
        hkv,
        d,
        scale,
        out,
    );
}

/// [`attention`] on a given instruction set (tests force the portable path on AVX2 machines).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_with_isa(
    isa: Isa,
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
        hkv > 0 && hq % hkv == 0,
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
    let group = hq / hkv;
    let rows_per_block = (QUERIES_PER_TASK / group).clamp(1, n);
    let dims = Dims {
        n,
        start,
        hq,
        hkv,
        d,
        group,
        rows_per_block,
        scale,
    };
    let blocks = n.div_ceil(rows_per_block);
    let run = |task: usize| -> Vec<f32> {
        let (kv_head, block) = (task / blocks, task % blocks);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx2Fma is only produced after runtime detection of avx2 and fma.
            Isa::Avx2Fma => unsafe {
                attend_block_avx2(&dims, q, k_cache, v_cache, kv_head, block)
            },
            _ => attend_block(&dims, q, k_cache, v_cache, kv_head, block),
        }
    };
    let tasks = hkv * blocks;
    let results: Vec<Vec<f32>> = if tasks == 1 {
        vec![run(0)]
    } else {
        (0..tasks).into_par_iter().map(run).collect()
    };
    // Scatter each task's [rows, group, d] result into out [n, hq, d].
    for (task, result) in results.iter().enumerate() {
        let (kv_head, block) = (task / blocks, task % blocks);
        let first_row = block * rows_per_block;
        for (r, row_result) in result.chunks_exact(group * d).enumerate() {
            let at = ((first_row + r) * hq + kv_head * group) * d;
            out[at..at + group * d].copy_from_slice(row_result);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_block_avx2(
    dims: &Dims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kv_head: usize,
    block: usize,
) -> Vec<f32> {
    attend_block(dims, q, k, v, kv_head, block)
}

/// One task: query rows of `block` for the heads of `kv_head`'s group. Returns [rows, group, d].
#[inline(always)]
fn attend_block(
    dims: &Dims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kv_head: usize,
    block: usize,
) -> Vec<f32> {
    let Dims {
        n,
        start,
        hq,
        hkv,
        d,
        group,
        rows_per_block,
        scale,
    } = *dims;
    let first_row = block * rows_per_block;
    let rows = rows_per_block.min(n - first_row);
    let queries = rows * group;
    // Query vector r = (row r / group, head kv_head * group + r % group); its last visible key is start + row.
    let visible = |r: usize| start + first_row + r / group + 1;
    let keys = visible(queries - 1); // the block's last row sees the most keys
    let mut query_buf = Vec::with_capacity(queries * d); // [rows, group, d]
    for row in first_row..first_row + rows {
        let at = (row * hq + kv_head * group) * d;
        query_buf.extend_from_slice(&q[at..at + group * d]);
    }
    // scores [queries, keys]; only t < visible(r) is written and read.
    let mut scores = vec![0.0f32; queries * keys];
    for t in 0..keys {
        let key = &k[(t * hkv + kv_head) * d..(t * hkv + kv_head + 1) * d];
        prefetch_row(k, (t + PREFETCH_AHEAD) * hkv + kv_head, d);
        for (r, qv) in query_buf.chunks_exact(d).enumerate() {
            if t < visible(r) {
                scores[r * keys + t] = simd::dot(qv, key) * scale;
            }
        }
    }
    for r in 0..queries {
        softmax_prefix(&mut scores[r * keys..r * keys + visible(r)]);
    }
    let mut out = vec![0.0f32; queries * d];
    for t in 0..keys {
        let value = &v[(t * hkv + kv_head) * d..(t * hkv + kv_head + 1) * d];
        prefetch_row(v, (t + PREFETCH_AHEAD) * hkv + kv_head, d);
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            if t < visible(r) {
                simd::axpy(scores[r * keys + t], value, o);
            }
        }
    }
    out
}

/// Cache rows fetched ahead of use: a kv head's rows are `hkv * d` apart, a stride the hardware prefetcher
/// follows poorly, and decode attention is bound by reading the cache.
const PREFETCH_AHEAD: usize = 8;

/// Hints the CPU to bring row `row` ([d] values) of `cache` into cache; a no-op past the end or off x86_64.
#[inline(always)]
fn prefetch_row(cache: &[f32], row: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(values) = cache.get(row * d..(row + 1) * d) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in values.chunks(16) {
            // SAFETY: prefetch never faults, and the pointer is inside `cache` anyway. SSE is baseline on x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (cache, row, d);
}

/// Max-subtracted softmax in place (inlined so it is vectorised with its caller's target features).
#[inline(always)]
fn softmax_prefix(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for s in x.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    simd::scale_inplace(x, 1.0 / sum);
}
