//! Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention), recurrent and chunked forms.
//!
//! Per head, with state S [dk, dv] and for each row t (q, k L2-normalised by the caller, q already scaled by
//! dk^-1/2, as transformers does before its `torch_*_gated_delta_rule` loops):
//!   S <- exp(g_t) S;  kv = S^T k_t;  delta = beta_t (v_t - kv);  S <- S + k_t delta^T;  o_t = S^T q_t.
//!
//! The chunked form (transformers' `torch_chunk_gated_delta_rule`, chunk C = 64; the last chunk may be
//! shorter, which equals transformers' zero padding since padded rows have k = v = 0 and g = 0): within a
//! chunk, with c_t = sum_{s<=t} g_s (inclusive cumulative log decay) and Γ_ij = exp(c_i - c_j) for j <= i,
//!   A  = strict_lower((beta k) k^T ⊙ Γ)            the UT-transform system (I + A), unit lower triangular
//!   U  = (I + A)^-1 (beta v),  W = (I + A)^-1 (beta k ⊙ exp(c))      by forward substitution
//!   V' = U - W S                                      the corrected values ("v_new")
//!   o  = (q ⊙ exp(c)) S + (q k^T ⊙ Γ, lower incl. diagonal) V'
//!   S <- exp(c_last) S + (k ⊙ exp(c_last - c))^T V'
//! Every exponent is <= 0 (g <= 0), so nothing overflows; Γ is exp(c_i - c_0) · exp(c_0 - c_j) when the
//! chunk's decay spans less than exp(-80) (two exps a row), else one exp a pair. The products are small
//! matmuls (`matmul_serial`: AVX-512 register tiles, else `gemm`); the forward substitution solves 16 rows
//! at a time, the rows before a block entering it through one matmul.
//!
//! Heads are independent: both forms run one rayon task per head. Invariant: both forms compute the same
//! function of (inputs, initial state) — the chunked one up to f32 rounding (tests: ~1e-5 relative).

use rayon::prelude::*;

use crate::linear::{check_len, matmul_serial, MatView};
use crate::simd::{self, Isa};

/// Rows per chunk of the chunked form (transformers' and FLA's default).
pub const GDN_CHUNK: usize = 64;

/// Largest log decay over a chunk for which Γ is taken as exp(c_i - c_0) · exp(c_0 - c_j): exp(80) and
/// its products with values <= 1 stay far inside f32's range (exp(88.7) overflows).
const GAMMA_SPLIT_SPAN: f32 = 80.0;

/// Rows per block of the chunk's forward substitution (module doc).
const SOLVE_BLOCK: usize = 16;

/// Shapes of one call.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    h: usize,
    dk: usize,
    dv: usize,
}

/// The per-row inputs of all heads, as passed by the caller.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: &'a [f32],    // [n, h, dk]
    k: &'a [f32],    // [n, h, dk]
    v: &'a [f32],    // [n, h, dv]
    g: &'a [f32],    // [n, h]
    beta: &'a [f32], // [n, h]
}

#[allow(clippy::too_many_arguments)]
fn check_shapes(what: &str, inp: &Inputs<'_>, state: &[f32], dims: Dims, out: &[f32]) {
    let Dims { n, h, dk, dv } = dims;
    check_len(&format!("{what}: q [n, h, dk]"), inp.q.len(), n * h * dk);
    check_len(&format!("{what}: k [n, h, dk]"), inp.k.len(), n * h * dk);
    check_len(&format!("{what}: v [n, h, dv]"), inp.v.len(), n * h * dv);
    check_len(&format!("{what}: g [n, h]"), inp.g.len(), n * h);
    check_len(&format!("{what}: beta [n, h]"), inp.beta.len(), n * h);
    check_len(
        &format!("{what}: state [h, dk, dv]"),
        state.len(),
        h * dk * dv,
    );
    check_len(&format!("{what}: out [n, h, dv]"), out.len(), n * h * dv);
}

/// Runs `per_head(head, state [dk, dv]) -> [n, dv]` for every head in parallel and scatters the results into
/// out [n, h, dv].
fn for_each_head<F>(state: &mut [f32], dims: Dims, out: &mut [f32], per_head: F)
where
    F: Fn(usize, &mut [f32]) -> Vec<f32> + Sync,
{
    let Dims { n, h, dk, dv } = dims;
    let state = &mut state[..h * dk * dv];
    let results: Vec<Vec<f32>> = if h == 1 {
        vec![per_head(0, state)]
    } else {
        state
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(head, s)| per_head(head, s))
            .collect()
    };
    for (head, o_head) in results.iter().enumerate() {
        for (t, o_row) in o_head.chunks_exact(dv).take(n).enumerate() {
            let at = (t * h + head) * dv;
            out[at..at + dv].copy_from_slice(o_row);
        }
    }
}

/// Gated DeltaNet recurrence, step form, over n rows. q, k [n, h, dk]; v [n, h, dv]; g, beta [n, h];
/// state [h, dk, dv] updated in place; out [n, h, dv].
///
/// Panics (programmer error) if a buffer is shorter than its shape.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrent(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    n: usize,
    h: usize,
    dk: usize,
    dv: usize,
    out: &mut [f32],
) {
    gdn_recurrent_with_isa(simd::best_isa(), q, k, v, g, beta, state, n, h, dk, dv, out);
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_recurrent_with_isa(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    n: usize,
    h: usize,
    dk: usize,
    dv: usize,
    out: &mut [f32],
) {
    let dims = Dims { n, h, dk, dv };
    let inp = Inputs { q, k, v, g, beta };
    check_shapes("gdn_recurrent", &inp, state, dims, out);
    if n == 0 || h == 0 || dv == 0 {
        return;
    }
    for_each_head(state, dims, out, |head, s| match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2Fma is only produced after runtime detection of avx2 and fma.
        Isa::Avx2Fma => unsafe { recurrent_head_avx2(&inp, dims, head, s) },
        _ => recurrent_head(&inp, dims, head, s),
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_head_avx2(
    inp: &Inputs<'_>,
    dims: Dims,
    head: usize,
    s: &mut [f32],
) -> Vec<f32> {
    recurrent_head(inp, dims, head, s)
}

/// The step recurrence for one head; s [dk, dv]; returns o [n, dv].
#[inline(always)]
fn recurrent_head(inp: &Inputs<'_>, dims: Dims, head: usize, s: &mut [f32]) -> Vec<f32> {
    let Dims { n, h, dk, dv } = dims;
    let mut o = vec![0.0f32; n * dv];
    let mut kv = vec![0.0f32; dv];
    let mut delta = vec![0.0f32; dv];
    for (t, o_t) in o.chunks_exact_mut(dv).enumerate() {
        let row = t * h + head;
        let q_t = &inp.q[row * dk..(row + 1) * dk];
        let k_t = &inp.k[row * dk..(row + 1) * dk];
        let v_t = &inp.v[row * dv..(row + 1) * dv];
        let decay = inp.g[row].exp();
        let beta_t = inp.beta[row];
        // Pass 1: S <- exp(g) S and kv = S^T k, one sweep over the state rows.
        kv.iter_mut().for_each(|x| *x = 0.0);
        for (s_i, &k_i) in s.chunks_exact_mut(dv).zip(k_t) {
            simd::scale_inplace(s_i, decay);
            simd::axpy(k_i, s_i, &mut kv);
        }
        for ((d, &vv), &kvv) in delta.iter_mut().zip(v_t).zip(&kv) {
            *d = (vv - kvv) * beta_t;
        }
        // Pass 2: S <- S + k delta^T and o = S^T q.
        for ((s_i, &k_i), &q_i) in s.chunks_exact_mut(dv).zip(k_t).zip(q_t) {
            simd::axpy(k_i, &delta, s_i);
            simd::axpy(q_i, s_i, o_t);
        }
    }
    o
}

/// The same computation as [`gdn_recurrent`] in chunked (WY / UT-transform) form, chunk size [`GDN_CHUNK`],
/// matmul-shaped, for prefill.
///
/// Panics (programmer error) if a buffer is shorter than its shape.
#[allow(clippy::too_many_arguments)]
pub fn gdn_chunked(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    n: usize,
    h: usize,
    dk: usize,
    dv: usize,
    out: &mut [f32],
) {
    let dims = Dims { n, h, dk, dv };
    let inp = Inputs { q, k, v, g, beta };
    check_shapes("gdn_chunked", &inp, state, dims, out);
    if n == 0 || h == 0 || dv == 0 {
        return;
    }
    let isa = simd::best_isa();
    for_each_head(state, dims, out, |head, s| match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2Fma is only produced after runtime detection of avx2 and fma.
        Isa::Avx2Fma => unsafe { chunked_head_avx2(&inp, dims, head, s) },
        _ => chunked_head(&inp, dims, head, s),
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunked_head_avx2(inp: &Inputs<'_>, dims: Dims, head: usize, s: &mut [f32]) -> Vec<f32> {
    chunked_head(inp, dims, head, s)
}

/// Per-chunk scratch of one head, allocated once per call.
struct ChunkScratch {
    q: Vec<f32>,          // [C, dk]  q ⊙ exp(c) once the intra-chunk scores are taken
    k: Vec<f32>,          // [C, dk]  k, then k ⊙ exp(c_last - c) for the state update
    k_t: Vec<f32>,        // [dk, C]  k transposed (row stride: the chunk's length)
    v_beta: Vec<f32>,     // [C, dv]  beta v, solved in place into U, then V' = U - W S
    k_beta: Vec<f32>,     // [C, dk]  beta k
    w: Vec<f32>,          // [C, dk]  beta k ⊙ exp(c), solved in place into W
    cum: Vec<f32>,        // [C]      inclusive cumulative log decay
    decay_to: Vec<f32>,   // [C]      exp(c - c_0) <= 1
    decay_from: Vec<f32>, // [C]    exp(c_0 - c) < exp(GAMMA_SPLIT_SPAN)
    system: Vec<f32>,     // [C, C]   (beta k) k^T ⊙ Γ, strictly lower part used
    qk: Vec<f32>,         // [C, C]   q k^T ⊙ Γ, lower incl. diagonal
    state_in: Vec<f32>,   // [dk, dv] the state at the chunk start
}

/// The chunked form for one head; s [dk, dv]; returns o [n, dv].
#[inline(always)]
fn chunked_head(inp: &Inputs<'_>, dims: Dims, head: usize, s: &mut [f32]) -> Vec<f32> {
    let Dims { n, dk, dv, .. } = dims;
    let c = GDN_CHUNK.min(n);
    let mut sc = ChunkScratch {
        q: vec![0.0; c * dk],
        k: vec![0.0; c * dk],
        k_t: vec![0.0; dk * c],
        v_beta: vec![0.0; c * dv],
        k_beta: vec![0.0; c * dk],
        w: vec![0.0; c * dk],
        cum: vec![0.0; c],
        decay_to: vec![0.0; c],
        decay_from: vec![0.0; c],
        system: vec![0.0; c * c],
        qk: vec![0.0; c * c],
        state_in: vec![0.0; dk * dv],
    };
    let mut o = vec![0.0f32; n * dv];
    let mut first = 0;
    while first < n {
        let len = GDN_CHUNK.min(n - first);
        chunk_step(
            inp,
            dims,
            head,
            first,
            len,
            s,
            &mut sc,
            &mut o[first * dv..(first + len) * dv],
        );
        first += len;
    }
    o
}

/// One chunk of `len` rows starting at row `first`: writes o_chunk [len, dv] and advances s [dk, dv].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk_step(
    inp: &Inputs<'_>,
    dims: Dims,
    head: usize,
    first: usize,
    len: usize,
    s: &mut [f32],
    sc: &mut ChunkScratch,
    o_chunk: &mut [f32],
) {
    let Dims { h, dk, dv, .. } = dims;
    // Gather the chunk's rows of this head into contiguous [len, *] buffers; cumulative decay in f32 order.
    let mut running = 0.0f32;
    for t in 0..len {
        let row = (first + t) * h + head;
        let beta_t = inp.beta[row];
        running += inp.g[row];
        sc.cum[t] = running;
        let decay_t = running.exp();
        let (kr, qr, vr) = (
            row * dk..(row + 1) * dk,
            t * dk..(t + 1) * dk,
            t * dv..(t + 1) * dv,
        );
        sc.q[qr.clone()].copy_from_slice(&inp.q[kr.clone()]);
        sc.k[qr.clone()].copy_from_slice(&inp.k[kr.clone()]);
        for ((kb, wv), &kv) in sc.k_beta[qr.clone()]
            .iter_mut()
            .zip(&mut sc.w[qr.clone()])
            .zip(&inp.k[kr])
        {
            *kb = kv * beta_t;
            *wv = *kb * decay_t;
        }
        for (vb, &vv) in sc.v_beta[vr]
            .iter_mut()
            .zip(&inp.v[row * dv..(row + 1) * dv])
        {
            *vb = vv * beta_t;
        }
    }
    let (q, k, k_beta) = (&sc.q[..len * dk], &sc.k[..len * dk], &sc.k_beta[..len * dk]);
    let cum = &sc.cum[..len];
    // system = (beta k) k^T ⊙ Γ and qk = q k^T ⊙ Γ, both [len, len]; entries above the diagonal unused/zeroed.
    let system = &mut sc.system[..len * len];
    let qk = &mut sc.qk[..len * len];
    for (t, k_row) in k.chunks_exact(dk).enumerate() {
        for (d, &kv) in k_row.iter().enumerate() {
            sc.k_t[d * len + t] = kv;
        }
    }
    let k_t = MatView::row_major(&sc.k_t[..dk * len], dk, len);
    matmul_serial(system, MatView::row_major(k_beta, len, dk), k_t, 1.0, false);
    matmul_serial(qk, MatView::row_major(q, len, dk), k_t, 1.0, false);
    // Γ_ij = exp(c_i - c_j) = exp(c_i - c_0) · exp(c_0 - c_j) when the chunk's whole decay stays within
    // f32's range (2 exps a row instead of one per pair; ~1 ulp from the direct form), else directly.
    let span = cum[0] - cum[len - 1]; // >= 0: g <= 0
    let factored = span < GAMMA_SPLIT_SPAN;
    if factored {
        for (t, &c) in cum.iter().enumerate() {
            sc.decay_to[t] = (c - cum[0]).exp();
            sc.decay_from[t] = (cum[0] - c).exp();
        }
    }
    for i in 0..len {
        let (sys_row, qk_row) = (
            &mut system[i * len..(i + 1) * len],
            &mut qk[i * len..(i + 1) * len],
        );
        if factored {
            let di = sc.decay_to[i];
            for ((sv, qv), &dj) in sys_row[..=i]
                .iter_mut()
                .zip(&mut qk_row[..=i])
                .zip(&sc.decay_from[..=i])
            {
                let gamma = di * dj;
                *sv *= gamma;
                *qv *= gamma;
            }
        } else {
            for j in 0..=i {
                let gamma = (cum[i] - cum[j]).exp();
                sys_row[j] *= gamma;
                qk_row[j] *= gamma;
            }
        }
        qk_row[i + 1..].iter_mut().for_each(|v| *v = 0.0);
    }
    // Forward substitution with the unit lower-triangular (I + strict_lower(system)):
    // X_i = B_i - sum_{j<i} system[i, j] X_j, for B = beta v (-> U) and B = beta k ⊙ exp(c) (-> W),
    // in blocks of SOLVE_BLOCK rows: the rows solved before a block enter it through one matmul each,
    // then its own rows one by one.
    let u = &mut sc.v_beta[..len * dv];
    let w = &mut sc.w[..len * dk];
    for b0 in (0..len).step_by(SOLVE_BLOCK) {
        let b1 = (b0 + SOLVE_BLOCK).min(len);
        if b0 > 0 {
            let a = MatView {
                data: &system[b0 * len..],
                rows: b1 - b0,
                cols: b0,
                rs: len,
                cs: 1,
            };
            for (x, d) in [(&mut *u, dv), (&mut *w, dk)] {
                let (solved, rest) = x.split_at_mut(b0 * d);
                let solved = MatView::row_major(solved, b0, d);
                matmul_serial(&mut rest[..(b1 - b0) * d], a, solved, -1.0, true);
            }
        }
        for i in b0 + 1..b1 {
            let (solved_u, rest_u) = u.split_at_mut(i * dv);
            let (solved_w, rest_w) = w.split_at_mut(i * dk);
            let (u_i, w_i) = (&mut rest_u[..dv], &mut rest_w[..dk]);
            for j in b0..i {
                let a = system[i * len + j];
                simd::axpy(-a, &solved_u[j * dv..(j + 1) * dv], u_i);
                simd::axpy(-a, &solved_w[j * dk..(j + 1) * dk], w_i);
            }
        }
    }
    // V' = U - W S, in place in u: [len, dv].
    sc.state_in.copy_from_slice(s);
    let state_in = MatView::row_major(&sc.state_in, dk, dv);
    matmul_serial(u, MatView::row_major(w, len, dk), state_in, -1.0, true);
    // o = (q ⊙ exp(c)) S_in + qk V'.
    let q = &mut sc.q[..len * dk];
    for (q_t, &c_t) in q.chunks_exact_mut(dk).zip(cum) {
        simd::scale_inplace(q_t, c_t.exp());
    }
    matmul_serial(
        o_chunk,
        MatView::row_major(q, len, dk),
        state_in,
        1.0,
        false,
    );
    matmul_serial(
        o_chunk,
        MatView::row_major(qk, len, len),
        MatView::row_major(u, len, dv),
        1.0,
        true,
    );
    // S <- exp(c_last) S_in + (k ⊙ exp(c_last - c))^T V'.
    let c_last = cum[len - 1];
    let k = &mut sc.k[..len * dk];
    for (k_t, &c_t) in k.chunks_exact_mut(dk).zip(cum) {
        simd::scale_inplace(k_t, (c_last - c_t).exp());
    }
    simd::scale_inplace(s, c_last.exp());
    matmul_serial(
        s,
        MatView::transposed(k, dk, len),
        MatView::row_major(u, len, dv),
        1.0,
        true,
    );
}
