// Gated DeltaNet, chunked (WY) form, for prefill passes (more rows than gemv_max_rows, no tape). It
// computes the recurrence of gdn_rec (gdn.cu) on the same gdn_conv_prep rows, with the same conventions
//   S <- e^g S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q   (S [dk, dv] per value head)
// but C = GDC_C rows at a time as matrix products. In a chunk with log-decays g_t and G_t = g_0 + .. + g_t
// (inclusive, summed in f64), state S0 before it, and rows t, s of the chunk:
//   A[t][s] = beta_t (k_t . k_s) e^{G_t - G_s} for s < t (0 otherwise); (I + A) W = beta e^G K,
//   (I + A) U = beta V (forward substitution); V' = U - W S0 (the deltas);
//   O = (e^G Q) S0 + P V' with P[t][s] = (q_t . k_s) e^{G_t - G_s} for s <= t;
//   S1 = e^{G_last} S0 + (e^{G_last - G} K)^T V'.
// Only differences G_t - G_s with t >= s (and G_t, G_last - G_t) are exponentiated: every factor is in
// [0, 1], nothing overflows, and decays that underflow do so to 0 as in the product form.
//
// gdn_chunk_prep, grid (hv, chunks), GDC_THREADS threads: everything that does not depend on S0, all
// chunks in parallel: Gram matrices K K^T and Q K^T from dk slices staged in shared memory (4 x 4 per
// thread), A in shared memory, P to global; then one thread per column of [W | U] (dk + dv columns)
// runs the substitution down the chunk, reading back the rows it has written (its own writes).
// gdn_chunk_state, grid (hv, ceil(dv / GDC_COLS)), GDC_THREADS threads: the chunks in order, the slice
// S0[:, cols] in shared memory; per chunk V', O and S1 as above, each thread a 2 x 4 tile, operands
// staged GDC_C x GDC_KS at a time. It also advances the conv window exactly as gdn_rec does (the same
// gdn_window_advance); the gated RMSNorm follows as the gated_rmsnorm kernel.
//
// Scratch (np = chunks * GDC_C rows, padded rows written as 0): w [hv, np, dk], u [hv, np, dv],
// p [hv, np, GDC_C] (row t: P[t][0..C] within its chunk), fac [hv, np, 2] = (e^{G_t}, e^{G_last - G_t}).
// Invariant: not bitwise equal to gdn_rec (another summation order; f32 throughout, agreeing to
// rounding), so it never runs where rows must equal decode rows: decode, verify, tape and its replay.
#define GDC_C 64
#define GDC_THREADS 256
#define GDC_SL 32
#define GDC_KS 64
#define GDC_COLS 32

extern "C" __global__ void __launch_bounds__(GDC_THREADS)
    gdn_chunk_prep(const float* __restrict__ prep, int ldq, float* wbuf, float* ubuf, float* __restrict__ pbuf,
                   float* __restrict__ fac, int n, int hk, int hv, int dk, int dv) {
    PDL_ENTER();
    __shared__ float ks[GDC_C][GDC_SL + 1], qs[GDC_C][GDC_SL + 1];
    __shared__ float a[GDC_C][GDC_C + 1];
    __shared__ double gcum[GDC_C];
    __shared__ float gl[GDC_C], beta[GDC_C], eg[GDC_C];
    const int h = blockIdx.x, kh = h / (hv / hk), tid = threadIdx.x;
    const int t0 = blockIdx.y * GDC_C, nr = min(GDC_C, n - t0);
    const int cd = 2 * hk * dk + hv * dv;
    const size_t np = (size_t)gridDim.y * GDC_C, hrow = (size_t)h * np + t0;
    const int qoff = kh * dk, koff = hk * dk + kh * dk, voff = 2 * hk * dk + h * dv;
    if (tid < GDC_C) {
        const bool ok = tid < nr;
        const float* row = prep + (size_t)(t0 + tid) * ldq;
        gl[tid] = ok ? row[cd + 2 * hv + h] : 0.0f;
        beta[tid] = ok ? row[cd + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) {
        double acc = 0.0;
        for (int t = 0; t < GDC_C; ++t) {
            acc += (double)gl[t];
            gcum[t] = acc;
        }
    }
    __syncthreads();
    if (tid < GDC_C) {
        const bool ok = tid < nr;
        const float e = ok ? expf((float)gcum[tid]) : 0.0f;
        eg[tid] = e;
        fac[(hrow + tid) * 2] = e;
        fac[(hrow + tid) * 2 + 1] = ok ? expf((float)(gcum[nr - 1] - gcum[tid])) : 0.0f;
    }
    // K K^T and Q K^T, rows ib..ib+3, columns jb..jb+3 per thread.
    const int ib = 4 * (tid >> 4), jb = 4 * (tid & 15);
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int s = 0; s < 4; ++s) kk[r][s] = qk[r][s] = 0.0f;
    for (int d0 = 0; d0 < dk; d0 += GDC_SL) {
        __syncthreads();
        for (int e = tid; e < GDC_C * GDC_SL; e += GDC_THREADS) {
            const int t = e / GDC_SL, d = e % GDC_SL;
            const bool ok = t < nr && d0 + d < dk;
            const float* row = prep + (size_t)(t0 + t) * ldq + d0 + d;
            ks[t][d] = ok ? row[koff] : 0.0f;
            qs[t][d] = ok ? row[qoff] : 0.0f;
        }
        __syncthreads();
        for (int d = 0; d < GDC_SL; ++d) {
            float ki[4], qi[4], kj[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                ki[r] = ks[ib + r][d];
                qi[r] = qs[ib + r][d];
                kj[r] = ks[jb + r][d];
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    kk[r][s] = fmaf(ki[r], kj[s], kk[r][s]);
                    qk[r][s] = fmaf(qi[r], kj[s], qk[r][s]);
                }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int i = ib + r, j = jb + s;
            const float gd = (i < nr && j <= i) ? expf((float)(gcum[i] - gcum[j])) : 0.0f;
            a[i][j] = j < i ? beta[i] * kk[r][s] * gd : 0.0f;
            pbuf[(hrow + i) * GDC_C + j] = qk[r][s] * gd;
        }
    __syncthreads();
    // (I + A) [W | U] = [beta e^G K | beta V], row by row; column col of W (col < dk) or U.
    for (int col = tid; col < dk + dv; col += GDC_THREADS) {
        const bool is_w = col < dk;
        const int ld = is_w ? dk : dv;
        float* dst = is_w ? wbuf + hrow * dk + col : ubuf + hrow * dv + (col - dk);
        const int src = is_w ? koff + col : voff + (col - dk);
        for (int i = 0; i < GDC_C; ++i) {
            float x = 0.0f;
            if (i < nr) {
                const float in = prep[(size_t)(t0 + i) * ldq + src];
                x = is_w ? (beta[i] * eg[i]) * in : beta[i] * in;
                // Four independent sums (scalars: a dynamically indexed array would live in local memory).
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
                int j = 0;
                for (; j + 4 <= i; j += 4) {
                    s0 = fmaf(a[i][j], dst[(size_t)j * ld], s0);
                    s1 = fmaf(a[i][j + 1], dst[(size_t)(j + 1) * ld], s1);
                    s2 = fmaf(a[i][j + 2], dst[(size_t)(j + 2) * ld], s2);
                    s3 = fmaf(a[i][j + 3], dst[(size_t)(j + 3) * ld], s3);
                }
                for (; j < i; ++j) s0 = fmaf(a[i][j], dst[(size_t)j * ld], s0);
                x -= (s0 + s1) + (s2 + s3);
            }
            dst[(size_t)i * ld] = x;
        }
    }
}

// Stages rows 0..GDC_C of a [*, width] operand (row t at base + t * ld, columns d0..d0+GDC_KS, times
// fsm[t][f] when f >= 0) into stg, zero past nr rows or `width` columns, between two barriers.
__device__ __forceinline__ void gdc_stage(float (*stg)[GDC_KS + 1], const float* __restrict__ base, size_t ld,
                                          int width, int d0, int nr, const float (*fsm)[2], int f) {
    __syncthreads();
    for (int e = threadIdx.x; e < GDC_C * GDC_KS; e += GDC_THREADS) {
        const int t = e / GDC_KS, d = e % GDC_KS;
        const bool ok = t < nr && d0 + d < width;
        stg[t][d] = ok ? base[(size_t)t * ld + d0 + d] * (f < 0 ? 1.0f : fsm[t][f]) : 0.0f;
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(GDC_THREADS)
    gdn_chunk_state(const float* __restrict__ prep, int ldq, const float* __restrict__ wbuf,
                    const float* __restrict__ ubuf, const float* __restrict__ pbuf, const float* __restrict__ fac,
                    const float* __restrict__ proj, int ldp, float* __restrict__ window, float* __restrict__ state,
                    float* __restrict__ out, int n, int hk, int hv, int dk, int dv, int kernel) {
    PDL_ENTER();
    __shared__ __align__(16) float sm[GDN_MAX_DK][GDC_COLS];  // S0[:, cols]
    __shared__ __align__(16) float vp[GDC_C][GDC_COLS];       // V'[:, cols]
    __shared__ float stg[GDC_C][GDC_KS + 1];                  // staged operand rows
    __shared__ float fsm[GDC_C][2];
    const int h = blockIdx.x, kh = h / (hv / hk), tid = threadIdx.x;
    const int cd = 2 * hk * dk + hv * dv;
    const int col0 = blockIdx.y * GDC_COLS;
    const int chunks = (n + GDC_C - 1) / GDC_C;
    const size_t np = (size_t)chunks * GDC_C;
    const int qoff = kh * dk, koff = hk * dk + kh * dk;
    float* sh = state + (size_t)h * dk * dv;
    for (int e = tid; e < dk * GDC_COLS; e += GDC_THREADS) {
        const int d = e / GDC_COLS, c = col0 + e % GDC_COLS;
        sm[d][e % GDC_COLS] = c < dv ? sh[(size_t)d * dv + c] : 0.0f;
    }
    // This thread's tile: rows r0, r0 + 1 (of a chunk, or of a dk slice of S) x columns c0..c0+3.
    const int r0 = 2 * (tid >> 3), c0 = 4 * (tid & 7);
    for (int c = 0; c < chunks; ++c) {
        const int t0 = c * GDC_C, nr = min(GDC_C, n - t0);
        const size_t hrow = (size_t)h * np + t0;
        __syncthreads();
        if (tid < GDC_C) {
            fsm[tid][0] = fac[(hrow + tid) * 2];
            fsm[tid][1] = fac[(hrow + tid) * 2 + 1];
        }
        // V' = U - W S0.
        float acc[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const int t = r0 + rr, col = col0 + c0 + cc;
                acc[rr][cc] = (t < nr && col < dv) ? ubuf[(hrow + t) * dv + col] : 0.0f;
            }
        for (int d0 = 0; d0 < dk; d0 += GDC_KS) {
            gdc_stage(stg, wbuf + hrow * dk, dk, dk, d0, nr, fsm, -1);
            const int dn = min(GDC_KS, dk - d0);
            for (int d = 0; d < dn; ++d) {
                const float4 s4 = *reinterpret_cast<const float4*>(&sm[d0 + d][c0]);
                const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
                    const float wv = stg[r0 + rr][d];
#pragma unroll
                    for (int cc = 0; cc < 4; ++cc) acc[rr][cc] = fmaf(-wv, sv[cc], acc[rr][cc]);
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
            *reinterpret_cast<float4*>(&vp[r0 + rr][c0]) =
                make_float4(acc[rr][0], acc[rr][1], acc[rr][2], acc[rr][3]);
        // O = (e^G Q) S0 + P V'.
        float o[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) o[rr][cc] = 0.0f;
        const float* qrows = prep + (size_t)t0 * ldq + qoff;
        for (int d0 = 0; d0 < dk; d0 += GDC_KS) {
            gdc_stage(stg, qrows, ldq, dk, d0, nr, fsm, 0);
            const int dn = min(GDC_KS, dk - d0);
            for (int d = 0; d < dn; ++d) {
                const float4 s4 = *reinterpret_cast<const float4*>(&sm[d0 + d][c0]);
                const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
                    const float qv = stg[r0 + rr][d];
#pragma unroll
                    for (int cc = 0; cc < 4; ++cc) o[rr][cc] = fmaf(qv, sv[cc], o[rr][cc]);
                }
            }
        }
        gdc_stage(stg, pbuf + hrow * GDC_C, GDC_C, GDC_C, 0, nr, fsm, -1);
        for (int j = 0; j < GDC_C; ++j) {
            const float4 v4 = *reinterpret_cast<const float4*>(&vp[j][c0]);
            const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const float pv = stg[r0 + rr][j];
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) o[rr][cc] = fmaf(pv, vv[cc], o[rr][cc]);
            }
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const int t = r0 + rr, col = col0 + c0 + cc;
                if (t < nr && col < dv) out[((size_t)(t0 + t) * hv + h) * dv + col] = o[rr][cc];
            }
        // S1 = e^{G_last} S0 + (e^{G_last - G} K)^T V': this thread's S rows d0 + r0, d0 + r0 + 1. Each
        // element of sm is read here only by the thread that rewrites it (all other reads of S0 came
        // before the staging barriers).
        const float e_last = fac[(hrow + nr - 1) * 2];
        const float* krows = prep + (size_t)t0 * ldq + koff;
        for (int d0 = 0; d0 < dk; d0 += GDC_KS) {
            gdc_stage(stg, krows, ldq, dk, d0, nr, fsm, 1);
            float s[2][4];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) s[rr][cc] = e_last * sm[min(d0 + r0 + rr, dk - 1)][c0 + cc];
            for (int j = 0; j < nr; ++j) {
                const float4 v4 = *reinterpret_cast<const float4*>(&vp[j][c0]);
                const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
                    const float kv = stg[j][r0 + rr];
#pragma unroll
                    for (int cc = 0; cc < 4; ++cc) s[rr][cc] = fmaf(kv, vv[cc], s[rr][cc]);
                }
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
                if (d0 + r0 + rr < dk)
#pragma unroll
                    for (int cc = 0; cc < 4; ++cc) sm[d0 + r0 + rr][c0 + cc] = s[rr][cc];
        }
    }
    __syncthreads();
    for (int e = tid; e < dk * GDC_COLS; e += GDC_THREADS) {
        const int d = e / GDC_COLS, c = col0 + e % GDC_COLS;
        if (c < dv) sh[(size_t)d * dv + c] = sm[d][e % GDC_COLS];
    }
    // Last: fewer registers live (first, it made ptxas spill around the chunk loop).
    gdn_window_advance(window, proj, ldp, n, cd, kernel);
}
