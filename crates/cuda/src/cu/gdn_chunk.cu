// Gated DeltaNet, chunked (WY) form, for prefill passes (more rows than gemv_max_rows, no tape). It
// computes the recurrence of gdn_rec (gdn.cu) on the same gdn_conv_prep rows, with the same conventions
//   S <- e^g S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q   (S [dk, dv] per value head)
// but C = GDC_C rows at a time as matrix products. In a chunk with log-decays g_t and G_t = g_0 + .. + g_t
// (inclusive, summed in f64), state S0 before it, and rows t, s of the chunk:
//   A[t][s] = beta_t (k_t . k_s) e^{G_t - G_s} for s < t (0 otherwise); T = (I + A)^-1 (unit lower
//   triangular); W = T (beta e^G K), U = T (beta V); V' = U - W S0 (the deltas);
//   O = e^G (Q S0) + P V' with P[t][s] = (q_t . k_s) e^{G_t - G_s} for s <= t;
//   S1 = e^{G_last} S0 + K^T (e^{G_last - G} V').
// Only differences G_t - G_s with t >= s (and G_t, G_last - G_t) are exponentiated: every factor is in
// [0, 1], nothing overflows, and decays that underflow do so to 0 as in the product form.
//
// gdn_chunk_prep, grid (hv, chunks), GDC_THREADS threads, 2 blocks per SM: everything that does not
// depend on S0, all chunks in parallel. Gram matrices K K^T and Q K^T from dk slices staged in shared
// memory (2 x 4 of each per thread); A to shared memory, P to global. T by forward substitution in
// shared memory, T^T row c (column c of T) by 4 lanes of one warp of the first 8 (strided partial sums,
// xor butterfly; only __syncwarp between rows, the column never leaves its warp). Then W and U as
// products T X over 64-column slabs of X = [beta e^G K | beta V] staged in shared memory, 2 x 4 outputs
// per thread, the sum stopping at the diagonal (T is lower triangular). Every slab is loaded into
// registers one phase ahead of its store to shared memory, so no global load latency is exposed but
// the first Gram slab's (issued before the decay sums).
// The grid is one wave (4B shape, 512 rows: 256 blocks on 132 SMs), so the kernel takes as long as one
// block: at 256 threads (4 x 4 tiles) ncu saw 23.5% warps active and 94 us; 512 threads halve each
// thread's share of the Gram and T X products (same per-element summation order: same bits).
// gdn_chunk_state, grid (hv, ceil(dv / GDC_COLS)), GDC_ST_THREADS threads, dynamic shared memory
// (GDC_ST_FLOATS floats, opt-in above 48 KiB): the chunks in order, S0[:, cols] in shared memory. Per
// chunk, with the chunk's W and Q rows ([W; Q], 2C x dk), K rows and P in shared memory:
//   1. [W; Q] S0 (each thread 2 rows x 4 columns): threads of W rows write V' = U - W S0 and its scaled
//      copy e^{G_last - G} V', threads of Q rows keep e^G (Q S0) for O;
//   2. S1 (2 rows x 4 columns each) over K and the scaled V'; the Q threads add P V' and write O.
// Operands of the next chunk are loaded into registers while this chunk computes (K and P during step
// 1, W and Q during step 2) and stored after it, the chunk's row factors (fac) before step 1: two
// barriers per chunk, no load latency exposed but the first chunk's. It also advances the conv window exactly as gdn_rec does (the same
// gdn_window_advance); the gated RMSNorm follows as the gated_rmsnorm kernel.
//
// Scratch (np = chunks * GDC_C rows, padded rows written as 0): w [hv, np, dk], u [hv, np, dv],
// p [hv, np, GDC_C] (row t: P[t][0..C] within its chunk), fac [hv, np, 2] = (e^{G_t}, e^{G_last - G_t}).
// Invariant: not bitwise equal to gdn_rec (another summation order; f32 throughout, agreeing to
// rounding), so it never runs where rows must equal decode rows: decode, verify, tape and its replay.
#define GDC_C 64
#define GDC_THREADS 512
#define GDC_SL 32
#define GDC_XS 68  // row stride of T^T, X slabs and staged P: float4 rows; T^T rows 4 banks apart
#define GDC_COLS 32
// gdn_chunk_prep's staged operands per thread: Gram slab elements (K and Q each), X slab elements.
#define GDC_G_REGS (GDC_C * GDC_SL / GDC_THREADS)
#define GDC_X_REGS (GDC_C * GDC_C / GDC_THREADS)
#define GDC_ST_THREADS 512
#define GDC_WS (GDN_MAX_DK + 4)  // row stride of staged W, Q, K rows: float4 rows 4 banks apart
// gdn_chunk_state's shared memory (gdn_chunk.rs: STATE_SMEM_BYTES): S0 slice, V', scaled V', [W; Q],
// K, P.
#define GDC_ST_FLOATS \
    (GDN_MAX_DK * GDC_COLS + 2 * GDC_C * GDC_COLS + 3 * GDC_C * GDC_WS + GDC_C * GDC_XS)

extern "C" __global__ void __launch_bounds__(GDC_THREADS, 2)
    gdn_chunk_prep(const float* __restrict__ prep, int ldq, float* __restrict__ wbuf, float* __restrict__ ubuf,
                   float* __restrict__ pbuf, float* __restrict__ fac, int n, int hk, int hv, int dk, int dv) {
    PDL_ENTER();
    // r1: the Gram slabs (ks, qs), then A, then the X slabs; one region, each dead before the next.
    __shared__ __align__(16) float r1[GDC_C * GDC_XS];
    __shared__ __align__(16) float tt[GDC_C][GDC_XS];  // tt[s][t] = T[t][s]
    __shared__ double gcum[GDC_C];
    __shared__ float gl[GDC_C], beta[GDC_C], eg[GDC_C];
    float(*ks)[GDC_SL + 1] = reinterpret_cast<float(*)[GDC_SL + 1]>(r1);
    float(*qs)[GDC_SL + 1] = reinterpret_cast<float(*)[GDC_SL + 1]>(r1 + GDC_C * (GDC_SL + 1));
    float(*a)[GDC_C + 1] = reinterpret_cast<float(*)[GDC_C + 1]>(r1);
    float(*xs)[GDC_XS] = reinterpret_cast<float(*)[GDC_XS]>(r1);
    const int h = blockIdx.x, kh = h / (hv / hk), tid = threadIdx.x;
    const int t0 = blockIdx.y * GDC_C, nr = min(GDC_C, n - t0);
    const int cd = 2 * hk * dk + hv * dv;
    const size_t np = (size_t)gridDim.y * GDC_C, hrow = (size_t)h * np + t0;
    const int qoff = kh * dk, koff = hk * dk + kh * dk, voff = 2 * hk * dk + h * dv;
    // Slab operands go global -> registers -> shared memory; each load is issued one phase ahead (the
    // first Gram slab before the decay sums, the first X slab before T, the next slab before this one's
    // product) so that its latency hides behind work. Element tid + GDC_THREADS k of a slab.
    float gk[GDC_G_REGS], gq[GDC_G_REGS], xr[GDC_X_REGS];
    auto load_gram = [&](int d0) {
        const int d = tid % GDC_SL, tb = tid / GDC_SL;
#pragma unroll
        for (int k = 0; k < GDC_G_REGS; ++k) {
            const int t = tb + GDC_THREADS / GDC_SL * k;
            const bool ok = t < nr && d0 + d < dk;
            const float* row = prep + (size_t)(t0 + t) * ldq + d0 + d;
            gk[k] = ok ? row[koff] : 0.0f;
            gq[k] = ok ? row[qoff] : 0.0f;
        }
    };
    // Slab sl of X: columns x0.. of K (sl < kslabs) or of V; scaled by beta (e^G) when stored.
    const int kslabs = (dk + GDC_C - 1) / GDC_C, slabs = kslabs + (dv + GDC_C - 1) / GDC_C;
    auto load_x = [&](int sl) {
        const bool is_w = sl < kslabs;
        const int x0 = (is_w ? sl : sl - kslabs) * GDC_C, width = is_w ? dk : dv;
        const int src = (is_w ? koff : voff) + x0, d = tid % GDC_C, sb = tid / GDC_C;
#pragma unroll
        for (int k = 0; k < GDC_X_REGS; ++k) {
            const int s = sb + GDC_THREADS / GDC_C * k;
            xr[k] = (s < nr && x0 + d < width) ? prep[(size_t)(t0 + s) * ldq + src + d] : 0.0f;
        }
    };
    load_gram(0);
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
    // K K^T and Q K^T, rows ib, ib + 1, columns jb..jb+3 per thread.
    const int ib = 2 * (tid >> 4), jb = 4 * (tid & 15);
    float kk[2][4], qk[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int s = 0; s < 4; ++s) kk[r][s] = qk[r][s] = 0.0f;
    for (int d0 = 0; d0 < dk; d0 += GDC_SL) {
        __syncthreads();
#pragma unroll
        for (int k = 0; k < GDC_G_REGS; ++k) {
            const int t = tid / GDC_SL + GDC_THREADS / GDC_SL * k;
            ks[t][tid % GDC_SL] = gk[k];
            qs[t][tid % GDC_SL] = gq[k];
        }
        __syncthreads();
        if (d0 + GDC_SL < dk) load_gram(d0 + GDC_SL);
        for (int d = 0; d < GDC_SL; ++d) {
            float ki[2], qi[2], kj[4];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                ki[r] = ks[ib + r][d];
                qi[r] = qs[ib + r][d];
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) kj[r] = ks[jb + r][d];
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    kk[r][s] = fmaf(ki[r], kj[s], kk[r][s]);
                    qk[r][s] = fmaf(qi[r], kj[s], qk[r][s]);
                }
        }
    }
    __syncthreads();  // A overwrites the slabs
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int i = ib + r, j = jb + s;
            const float gd = (i < nr && j <= i) ? expf((float)(gcum[i] - gcum[j])) : 0.0f;
            a[i][j] = j < i ? beta[i] * kk[r][s] * gd : 0.0f;
            pbuf[(hrow + i) * GDC_C + j] = qk[r][s] * gd;
        }
    __syncthreads();
    load_x(0);
    // T[i][c] = [i == c] - sum_{c <= j < i} A[i][j] T[j][c], rows in order; lanes 4c'..4c'+3 of warp w own
    // column c = 8w + c' (the first 4 GDC_C threads, whole warps), lane part p summing j = c + p,
    // c + p + 4, ...
    if (tid < 4 * GDC_C) {
        const int lane = tid & 31, c = 8 * (tid >> 5) + (lane >> 2), p = lane & 3;
        float* tc = tt[c];
        for (int i = 0; i < GDC_C; ++i) {
            float s0 = 0.0f, s1 = 0.0f;
            int j = c + p;
            for (; j + 4 < i; j += 8) {
                s0 = fmaf(a[i][j], tc[j], s0);
                s1 = fmaf(a[i][j + 4], tc[j + 4], s1);
            }
            if (j < i) s0 = fmaf(a[i][j], tc[j], s0);
            float s = s0 + s1;
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (p == 0) tc[i] = i > c ? -s : (i == c ? 1.0f : 0.0f);
            __syncwarp();
        }
    }
    // [W | U] = T X, 64 columns of X = [beta e^G K | beta V] at a time; rows i0, i0 + 1, columns
    // c0..c0+3. Rows s >= nr of X are 0, and T[i][s] = 0 for s > i: the sum stops at min(i0 + 2, nr).
    // Padded rows (i >= nr) come out 0: their rows of A are 0, so T[i][s < nr] = 0.
    const int i0 = 2 * (tid >> 4), c0 = 4 * (tid & 15), sn = min(i0 + 2, nr);
    for (int sl = 0; sl < slabs; ++sl) {
        const bool is_w = sl < kslabs;
        const int x0 = (is_w ? sl : sl - kslabs) * GDC_C, width = is_w ? dk : dv;
        __syncthreads();  // T complete (first slab); the previous slab's reads done
#pragma unroll
        for (int k = 0; k < GDC_X_REGS; ++k) {
            const int s = tid / GDC_C + GDC_THREADS / GDC_C * k;
            xs[s][tid % GDC_C] = (is_w ? beta[s] * eg[s] : beta[s]) * xr[k];
        }
        __syncthreads();
        if (sl + 1 < slabs) load_x(sl + 1);
        float acc[2][4];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) acc[r][cc] = 0.0f;
        for (int s = 0; s < sn; ++s) {
            const float2 t2 = *reinterpret_cast<const float2*>(&tt[s][i0]);
            const float4 x4 = *reinterpret_cast<const float4*>(&xs[s][c0]);
            const float tv[2] = {t2.x, t2.y}, xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) acc[r][cc] = fmaf(tv[r], xv[cc], acc[r][cc]);
        }
        float* dst = (is_w ? wbuf + hrow * dk : ubuf + hrow * dv) + x0;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc)
                if (x0 + c0 + cc < width) dst[(size_t)(i0 + r) * width + c0 + cc] = acc[r][cc];
    }
}

// Registers that carry a chunk's operands from global into shared memory across a compute phase:
// element e = threadIdx.x + GDC_ST_THREADS * k of a [rows, GDN_MAX_DK] (or [C, C]) operand.
#define GDC_WQ_REGS (2 * GDC_C * GDN_MAX_DK / GDC_ST_THREADS)
#define GDC_K_REGS (GDC_C * GDN_MAX_DK / GDC_ST_THREADS)
#define GDC_P_REGS (GDC_C * GDC_C / GDC_ST_THREADS)

// Rows 0..C of W and of Q of a chunk (row t at wrow + t * dk, qrow + t * ldq; zero past nr rows or dk):
// this thread's column d = tid % GDN_MAX_DK of rows tid / GDN_MAX_DK + 4k (k < C / 4). 32-bit offsets
// from one pointer per operand keep the addresses of the unrolled loads cheap in registers.
#define GDC_RSTEP (GDC_ST_THREADS / GDN_MAX_DK)
__device__ __forceinline__ void gdc_load_wq(float (&r)[GDC_WQ_REGS], const float* __restrict__ wrow,
                                            const float* __restrict__ qrow, int ldq, int nr, int dk) {
    const int d = threadIdx.x % GDN_MAX_DK, rb = threadIdx.x / GDN_MAX_DK;
    const bool dok = d < dk;
    const float* wp = wrow + rb * dk + d;
    const float* qp = qrow + rb * ldq + d;
#pragma unroll
    for (int k = 0; k < GDC_C / GDC_RSTEP; ++k) {
        const bool ok = dok && rb + GDC_RSTEP * k < nr;
        r[k] = ok ? wp[GDC_RSTEP * k * dk] : 0.0f;
        r[GDC_C / GDC_RSTEP + k] = ok ? qp[GDC_RSTEP * k * ldq] : 0.0f;
    }
}

__device__ __forceinline__ void gdc_store_wq(const float (&r)[GDC_WQ_REGS], float (*wq)[GDC_WS]) {
    const int d = threadIdx.x % GDN_MAX_DK, rb = threadIdx.x / GDN_MAX_DK;
#pragma unroll
    for (int k = 0; k < GDC_C / GDC_RSTEP; ++k) {
        wq[rb + GDC_RSTEP * k][d] = r[k];
        wq[GDC_C + rb + GDC_RSTEP * k][d] = r[GDC_C / GDC_RSTEP + k];
    }
}

extern "C" __global__ void __launch_bounds__(GDC_ST_THREADS, 1)
    gdn_chunk_state(const float* __restrict__ prep, int ldq, const float* __restrict__ wbuf,
                    const float* __restrict__ ubuf, const float* __restrict__ pbuf, const float* __restrict__ fac,
                    const float* __restrict__ proj, int ldp, float* __restrict__ window, float* __restrict__ state,
                    float* __restrict__ out, int n, int hk, int hv, int dk, int dv, int kernel) {
    PDL_ENTER();
    float* smem = DYN_SMEM(float);
    float(*sm)[GDC_COLS] = reinterpret_cast<float(*)[GDC_COLS]>(smem);  // S0[:, cols], GDN_MAX_DK rows
    float(*vp)[GDC_COLS] = sm + GDN_MAX_DK;                              // V'[:, cols]
    float(*vs)[GDC_COLS] = vp + GDC_C;                                   // e^{G_last - G} V'
    float(*wq)[GDC_WS] = reinterpret_cast<float(*)[GDC_WS]>(vs + GDC_C);  // W rows, then Q rows
    float(*ksm)[GDC_WS] = wq + 2 * GDC_C;                                // K rows
    float(*pp)[GDC_XS] = reinterpret_cast<float(*)[GDC_XS]>(ksm + GDC_C);  // P rows
    const int h = blockIdx.x, kh = h / (hv / hk), tid = threadIdx.x;
    const int cd = 2 * hk * dk + hv * dv;
    const int col0 = blockIdx.y * GDC_COLS;
    const int chunks = (n + GDC_C - 1) / GDC_C;
    const size_t np = (size_t)chunks * GDC_C;
    const int qoff = kh * dk, koff = hk * dk + kh * dk;
    const size_t hbase = (size_t)h * np;
    float* sh = state + (size_t)h * dk * dv;
    // Rows past dk stay 0: loaded as 0, and S1 adds K columns past dk (staged as 0) to them.
    // (The state is stored [dv, dk] per head, gdn.cu gdn_state_io: d runs fastest over the threads.)
    for (int e = tid; e < GDN_MAX_DK * GDC_COLS; e += GDC_ST_THREADS) {
        const int d = e % GDN_MAX_DK, c = col0 + e / GDN_MAX_DK;
        sm[d][e / GDN_MAX_DK] = (d < dk && c < dv) ? sh[(size_t)c * dk + d] : 0.0f;
    }
    float rw[GDC_WQ_REGS];
    gdc_load_wq(rw, wbuf + hbase * dk, prep + qoff, ldq, min(GDC_C, n), dk);
    gdc_store_wq(rw, wq);
    __syncthreads();
    // This thread's tile: rows r0, r0 + 1 of [W; Q] (step 1) and of S (step 2), columns c0..c0+3; the
    // threads of Q rows (tid >= GDC_ST_THREADS / 2, whole warps) own O rows r0 - C, r0 - C + 1.
    const int r0 = 2 * (tid >> 3), c0 = 4 * (tid & 7);
    const bool q_rows = r0 >= GDC_C;
    const int tq = r0 - GDC_C;
    for (int c = 0; c < chunks; ++c) {
        const int t0 = c * GDC_C, nr = min(GDC_C, n - t0);
        const size_t hrow = hbase + t0;
        // K and P of this chunk, to shared memory after step 1 (the previous chunk's step 2 read them).
        float rk[GDC_K_REGS], rp[GDC_P_REGS];
        {
            const int d = tid % GDN_MAX_DK, rb = tid / GDN_MAX_DK;
            const float* kp = prep + (size_t)(t0 + rb) * ldq + koff + d;
#pragma unroll
            for (int k = 0; k < GDC_K_REGS; ++k)
                rk[k] = (d < dk && rb + GDC_RSTEP * k < nr) ? kp[GDC_RSTEP * k * ldq] : 0.0f;
            const float* pq = pbuf + hrow * GDC_C + tid;
#pragma unroll
            for (int k = 0; k < GDC_P_REGS; ++k) rp[k] = pq[GDC_ST_THREADS * k];
        }
        float u[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const int col = col0 + c0 + cc;
                u[rr][cc] = (!q_rows && col < dv) ? ubuf[(hrow + r0 + rr) * dv + col] : 0.0f;
            }
        // Row factors (e^{G_t} for O rows, e^{G_last - G_t} for V' rows) and e^{G_last}, loaded before
        // step 1 so that their latency hides behind it.
        float f[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) f[rr] = q_rows ? fac[(hrow + tq + rr) * 2] : fac[(hrow + r0 + rr) * 2 + 1];
        const float e_last = fac[(hrow + nr - 1) * 2];
        // Step 1: [W; Q] S0, rows r0, r0 + 1.
        float x[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) x[rr][cc] = 0.0f;
#pragma unroll 1
        for (int d = 0; d < dk; d += 4) {
            const float4 a0 = *reinterpret_cast<const float4*>(&wq[r0][d]);
            const float4 a1 = *reinterpret_cast<const float4*>(&wq[r0 + 1][d]);
            const float av[2][4] = {{a0.x, a0.y, a0.z, a0.w}, {a1.x, a1.y, a1.z, a1.w}};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float4 s4 = *reinterpret_cast<const float4*>(&sm[d + e][c0]);
                const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
                for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                    for (int cc = 0; cc < 4; ++cc) x[rr][cc] = fmaf(av[rr][e], sv[cc], x[rr][cc]);
            }
        }
        float o[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            if (q_rows) {
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) o[rr][cc] = f[rr] * x[rr][cc];
            } else {
                float v[4];
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) v[cc] = u[rr][cc] - x[rr][cc];
                *reinterpret_cast<float4*>(&vp[r0 + rr][c0]) = make_float4(v[0], v[1], v[2], v[3]);
                *reinterpret_cast<float4*>(&vs[r0 + rr][c0]) =
                    make_float4(f[rr] * v[0], f[rr] * v[1], f[rr] * v[2], f[rr] * v[3]);
            }
        }
#pragma unroll
        for (int k = 0; k < GDC_K_REGS; ++k) ksm[tid / GDN_MAX_DK + GDC_RSTEP * k][tid % GDN_MAX_DK] = rk[k];
#pragma unroll
        for (int k = 0; k < GDC_P_REGS; ++k) {
            const int e = tid + GDC_ST_THREADS * k;
            pp[e / GDC_C][e % GDC_C] = rp[k];
        }
        __syncthreads();
        // The next chunk's W and Q, to shared memory after step 2 (step 1 above was their last reader).
        const bool more = c + 1 < chunks;
        if (more) gdc_load_wq(rw, wbuf + (hrow + GDC_C) * dk, prep + (size_t)(t0 + GDC_C) * ldq + qoff, ldq,
                              min(GDC_C, n - t0 - GDC_C), dk);
        // Step 2: S1 rows r0, r0 + 1 = e^{G_last} S0 + K^T (e^{G_last - G} V'). Each element of sm is read
        // here only by the thread that rewrites it (every other read of S0 was in step 1).
        float s[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) s[rr][cc] = e_last * sm[r0 + rr][c0 + cc];
#pragma unroll 4
        for (int j = 0; j < nr; ++j) {
            const float2 k2 = *reinterpret_cast<const float2*>(&ksm[j][r0]);
            const float4 v4 = *reinterpret_cast<const float4*>(&vs[j][c0]);
            const float kv[2] = {k2.x, k2.y}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) s[rr][cc] = fmaf(kv[rr], vv[cc], s[rr][cc]);
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
            *reinterpret_cast<float4*>(&sm[r0 + rr][c0]) = make_float4(s[rr][0], s[rr][1], s[rr][2], s[rr][3]);
        if (q_rows) {
            // O rows tq, tq + 1 += P V'; P[t][j] = 0 for j > t and V' rows past nr are 0, so the sum runs
            // to the next multiple of 4 past min(nr, tq + 2).
            const int jn = min(nr, tq + 2);
#pragma unroll 1
            for (int j = 0; j < jn; j += 4) {
                const float4 p0 = *reinterpret_cast<const float4*>(&pp[tq][j]);
                const float4 p1 = *reinterpret_cast<const float4*>(&pp[tq + 1][j]);
                const float pv[2][4] = {{p0.x, p0.y, p0.z, p0.w}, {p1.x, p1.y, p1.z, p1.w}};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float4 v4 = *reinterpret_cast<const float4*>(&vp[j + e][c0]);
                    const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                        for (int cc = 0; cc < 4; ++cc) o[rr][cc] = fmaf(pv[rr][e], vv[cc], o[rr][cc]);
                }
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) {
                    const int t = tq + rr, col = col0 + c0 + cc;
                    if (t < nr && col < dv) out[((size_t)(t0 + t) * hv + h) * dv + col] = o[rr][cc];
                }
        }
        if (more) gdc_store_wq(rw, wq);
        __syncthreads();
    }
    for (int e = tid; e < dk * GDC_COLS; e += GDC_ST_THREADS) {
        const int d = e % dk, c = col0 + e / dk;
        if (c < dv) sh[(size_t)c * dk + d] = sm[d][e / dk];
    }
    // Last: fewer registers live.
    gdn_window_advance(window, proj, ldp, n, cd, kernel);
}
