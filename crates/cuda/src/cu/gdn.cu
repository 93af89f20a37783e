// Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) on the GPU, step form, in two kernels (and a
// decode row's both in one, gdn_step, at the end).
//
// gdn_conv_prep, grid (hk + ceil(hv*dv / 256), n), 256 threads: everything that does not depend on the
// recurrent state, for all rows in parallel. The depthwise causal conv (kernel K <= 8, taps oldest
// first as crates/kernels/src/conv.rs) + SiLU of each channel at row t reads inputs t-K+1..t from the
// fused projection (stride ldp) or, before row 0, from the carried window (not updated here). Blocks
// bx < hk own key head bx: q and k channels (threads 0..dk and 128..128+dk), L2-normalised (f64 sum of
// squares, eps 1e-6 inside the sqrt), q *= dk^-1/2; and, for the value heads of that key head,
// beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias)). Other blocks convolve v channels.
// Instruction-bound on prefill (ncu, 4B shape, 512 rows: 214 warp instructions per thread at 79% SM
// throughput): the conv is unrolled with K = 4 a compile-time constant (gdn_conv_silu), rows t >= K-1
// skip the per-tap window select, and the gate loop's integer division runs only in the warp that needs
// it. Same operations in the same order as before, so the same bits.
// Output row layout (stride ldq): [q (hk*dk) | k (hk*dk) | v (hv*dv) | beta (hv) | decay (hv) | g (hv)],
// g = log decay (the chunked form in gdn_chunk.cu differences it; the step form multiplies by decay).
//
// gdn_rec, grid (hv, cb), GDN_P * dv / cb threads: the recurrence, rows in order. Thread = (value
// column, part): GDN_P threads per column, part p owning state rows i = GDN_P*j + p of S [dk, dv] in
// registers (dk <= 128, so at most 16 rows each). Per row:
//   S <- decay S; kv = S^T k; delta = beta (v - kv); S <- S + k delta^T; o = S^T q,
// each column sum as 4 interleaved partial sums per thread, then an xor butterfly over the GDN_P parts
// (symmetric: every part ends with the same bits). q/k rows are double-buffered in shared memory, one
// plane per part (element j = row GDN_P*j + p; planes padded so the parts hit different banks), read as
// float4; the next row's inputs are loaded while the current one is computed (one barrier per row).
// The kernel also moves the conv window forward (the last K-1 conv inputs), and applies the gated RMSNorm
// to its head's outputs at the end (gated_norm_warp): with cb == 1 the head's block; with cb > 1 the
// head's last block to finish (`head_done` counts them, fence + atomic, and is reset for the next
// launch), or, without `head_done`, the gated_rmsnorm kernel — identically.
// Invariant: a column's arithmetic depends only on the state before each row and that row's inputs, so
// n rows in one launch equal n launches of one row bit for bit, for any cb: decode, verify and the tape
// replay all run these kernels.
#define GDN_MAX_DK 128
#define GDN_P 8
#define GDN_CPW (32 / GDN_P)
#define GDN_RPT (GDN_MAX_DK / GDN_P)
#define GDN_PREP_THREADS 256
#define GDN_NEXT 2  // next-row q/k values per thread: 2 dk <= 256 over >= 128 threads (ops.rs)
#define GDN_PLANE (GDN_RPT + 4)

#define GDN_MAX_KERNEL 8  // ops.rs: CONV_MAX_K

// Causal conv + SiLU of channel c at row t. K > 0: K taps known at compile time (the models' 4), else
// `kernel` taps under an unrolled bound. Rows t >= K - 1 (all of a prefill but its first rows) read only
// proj, from one row pointer and 32-bit tap offsets; earlier rows pick proj or the carried window per
// tap. The same fma chain in tap order as the runtime loop it replaces: identical bits.
template <int K>
__device__ __forceinline__ float gdn_conv_silu(const float* __restrict__ proj, int ldp,
                                               const float* __restrict__ conv_w, const float* __restrict__ window,
                                               int cd, int kernel, int t, int c) {
    const int nk = K > 0 ? K : kernel;
    const float* w = conv_w + c * nk;  // cd * nk < 2^31
    const int t0 = t - (nk - 1);
    float acc = 0.0f;
    if (t0 >= 0) {
        const float* x = proj + (size_t)t0 * ldp + c;
#pragma unroll
        for (int j = 0; j < (K > 0 ? K : GDN_MAX_KERNEL); ++j)
            if (K > 0 || j < nk) acc += w[j] * x[j * ldp];
    } else {
#pragma unroll
        for (int j = 0; j < (K > 0 ? K : GDN_MAX_KERNEL); ++j)
            if (K > 0 || j < nk) {
                const int tt = t0 + j;
                const float xv = tt >= 0 ? proj[tt * ldp + c] : window[(tt + nk - 1) * cd + c];
                acc += w[j] * xv;
            }
    }
    return silu_f(acc);
}

extern "C" __global__ void __launch_bounds__(GDN_PREP_THREADS)
    gdn_conv_prep(const float* __restrict__ proj, int ldp, const float* __restrict__ conv_w,
                  const float* __restrict__ window, const float* __restrict__ a_log,
                  const float* __restrict__ dt_bias, float* __restrict__ prep, int ldq, int hk, int hv, int dk,
                  int dv, int kernel) {
    PDL_ENTER();
    __shared__ double sums[GDN_PREP_THREADS / 32];
    const int t = blockIdx.y, tid = threadIdx.x;
    const int cd = 2 * hk * dk + hv * dv;
    auto conv = [&](int c) {
        return kernel == 4 ? gdn_conv_silu<4>(proj, ldp, conv_w, window, cd, kernel, t, c)
                           : gdn_conv_silu<0>(proj, ldp, conv_w, window, cd, kernel, t, c);
    };
    float* out = prep + (size_t)t * ldq;
    if (blockIdx.x >= hk) {
        const int c = 2 * hk * dk + (blockIdx.x - hk) * GDN_PREP_THREADS + tid;
        if (c < cd) out[c] = conv(c);
        return;
    }
    const int kh = blockIdx.x;
    const bool is_k = tid >= 128;
    const int i = is_k ? tid - 128 : tid;
    const bool ok = i < dk;
    const int c = is_k ? hk * dk + kh * dk + i : kh * dk + i;
    const float val = ok ? conv(c) : 0.0f;
    double ss = ok ? (double)val * (double)val : 0.0;
    ss = warp_sum_d(ss);
    if ((tid & 31) == 0) sums[tid >> 5] = ss;
    __syncthreads();
    const int w0 = is_k ? 4 : 0;
    const double tot = ((sums[w0] + sums[w0 + 1]) + sums[w0 + 2]) + sums[w0 + 3];
    const float inv = 1.0f / sqrtf((float)tot + 1e-6f);
    if (ok) out[c] = is_k ? val * inv : (val * inv) * (1.0f / sqrtf((float)dk));
    // tid < hv / hk (hv is a multiple of hk, model.rs) without the integer division in every warp.
    if (tid * hk < hv) {
        const int h = kh * (hv / hk) + tid;
        const float* pr = proj + (size_t)t * ldp + cd + hv * dv;
        out[cd + h] = sigmoid_f(pr[h]);
        const float g = -expf(a_log[h]) * softplus_f(pr[hv + h] + dt_bias[h]);
        out[cd + hv + h] = expf(g);
        out[cd + 2 * hv + h] = g;
    }
}

// Conv window after n rows: new slot j = element n + j of [old window (K-1) ; the n new inputs]; in
// place, slot j only reads slots > j. Channels spread over every thread of the grid (x, y). A channel's
// sources are all loaded before its slots are stored (one memory round trip, not K - 1 dependent ones;
// also 28 bytes of gdn_rec spills instead of 68, NVRTC 13 sm_90).
__device__ __forceinline__ void gdn_window_advance_channel(float* __restrict__ window, const float* __restrict__ proj,
                                                           int ldp, int n, int cd, int kernel, int c) {
    float v[GDN_MAX_KERNEL - 1];
#pragma unroll
    for (int j = 0; j < GDN_MAX_KERNEL - 1; ++j) {
        const int src = n + j;
        if (j < kernel - 1)
            v[j] = src < kernel - 1 ? window[(size_t)src * cd + c] : proj[(size_t)(src - (kernel - 1)) * ldp + c];
    }
#pragma unroll
    for (int j = 0; j < GDN_MAX_KERNEL - 1; ++j)
        if (j < kernel - 1) window[(size_t)j * cd + c] = v[j];
}
__device__ __forceinline__ void gdn_window_advance(float* __restrict__ window, const float* __restrict__ proj,
                                                   int ldp, int n, int cd, int kernel) {
    const int stride = gridDim.x * gridDim.y * blockDim.x;
    for (int c = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; c < cd; c += stride)
        gdn_window_advance_channel(window, proj, ldp, n, cd, kernel, c);
}

// Slot of element i of [q ; k] (2 dk values) in gdn_rec's shared planes [2 GDN_P][GDN_PLANE]: q planes
// 0..P-1, k planes P..2P-1, element e of either in plane e % P at e / P.
__device__ __forceinline__ float* gdn_qk_slot(float* planes, int i, int dk) {
    const int e = i < dk ? i : i - dk;
    return planes + ((i < dk ? 0 : GDN_P) + e % GDN_P) * GDN_PLANE + e / GDN_P;
}

// Thread (column, part)'s rows i = GDN_P j + part of the head's state S (sh) to (STORE: from) the
// registers s. The GPU stores each head's S [dk, dv] transposed ([dv, dk]; gdn.rs state_to_device): a
// warp's 4 columns x 8 parts then cover 4 whole 32-byte sectors per row group, not 8 half sectors (run
// 140: the 4B decode step 2.505 ms against 2.540, the state stores being on the grid's completion path).
template <bool STORE>
__device__ __forceinline__ void gdn_state_io(float (&s)[GDN_RPT], float* __restrict__ sh, int part, int rpt, int dk,
                                             int dv, int col, bool col_ok) {
#pragma unroll
    for (int j = 0; j < GDN_RPT; ++j) {
        const int i = GDN_P * j + part;
        const bool ok = j < rpt && i < dk && col_ok;
        if (STORE) {
            if (ok) sh[(size_t)col * dk + i] = s[j];
        } else {
            s[j] = ok ? sh[(size_t)col * dk + i] : 0.0f;
        }
    }
}

// One row of the recurrence for thread (column, part), the row's q / k in `planes`:
//   S <- decay S; kv = S^T k; delta = beta (v - kv); S <- S + k delta^T; returns o = S^T q,
// each column sum as 4 interleaved partial sums, then the xor butterfly over the parts (every part the
// same bits).
__device__ __forceinline__ float gdn_rec_row(float (&s)[GDN_RPT], const float* planes, int part, int rpt, int dk,
                                             float v_c, float beta_c, float decay_c) {
    const float4* q4 = reinterpret_cast<const float4*>(planes + part * GDN_PLANE);
    const float4* k4 = reinterpret_cast<const float4*>(planes + (GDN_P + part) * GDN_PLANE);
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int jj = 0; jj < GDN_RPT / 4; ++jj) {
        const float4 kq = k4[jj];
        const float kv4[4] = {kq.x, kq.y, kq.z, kq.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = 4 * jj + e, i = GDN_P * j + part;
            if (j < rpt && i < dk) {
                s[j] *= decay_c;
                a[e] = fmaf(s[j], kv4[e], a[e]);
            }
        }
    }
    float kv = (a[0] + a[1]) + (a[2] + a[3]);
#pragma unroll
    for (int m = GDN_CPW; m < 32; m <<= 1) kv += __shfl_xor_sync(0xffffffffu, kv, m);
    const float delta = (v_c - kv) * beta_c;
    float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int jj = 0; jj < GDN_RPT / 4; ++jj) {
        const float4 kq = k4[jj], qq = q4[jj];
        const float kv4[4] = {kq.x, kq.y, kq.z, kq.w}, qv4[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = 4 * jj + e, i = GDN_P * j + part;
            if (j < rpt && i < dk) {
                s[j] = fmaf(kv4[e], delta, s[j]);
                c4[e] = fmaf(s[j], qv4[e], c4[e]);
            }
        }
    }
    float o = (c4[0] + c4[1]) + (c4[2] + c4[3]);
#pragma unroll
    for (int m = GDN_CPW; m < 32; m <<= 1) o += __shfl_xor_sync(0xffffffffu, o, m);
    return o;
}

extern "C" __global__ void __launch_bounds__(1024)
    gdn_rec(const float* __restrict__ prep, int ldq, const float* __restrict__ proj, int ldp,
            float* __restrict__ window, float* __restrict__ state, float* __restrict__ out,
            const float* __restrict__ norm_w, float eps, int n, int hk, int hv, int dk, int dv, int kernel,
            int* __restrict__ head_done) {
    // [buffer][q planes 0..P-1, k planes 0..P-1][j]
    __shared__ __align__(16) float qk[2][2 * GDN_P][GDN_PLANE];
    const int h = blockIdx.x, kh = h / (hv / hk);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int part = lane / GDN_CPW;
    const int cols = blockDim.x / GDN_P;
    const int col = blockIdx.y * cols + warp * GDN_CPW + lane % GDN_CPW;
    const bool col_ok = col < dv;
    const int cd = 2 * hk * dk + hv * dv;
    const int nqk = 2 * dk;
    // Element i of [q ; k] (2 dk values): its column in a prep row, and its shared-memory slot.
    auto qk_index = [&](int i) { return i < dk ? kh * dk + i : hk * dk + kh * dk + (i - dk); };
    auto qk_slot = [&](float* buf, int i) -> float* { return gdn_qk_slot(buf, i, dk); };
    const int rpt = (dk + GDN_P - 1) / GDN_P;
    float* sh = state + (size_t)h * dk * dv;
    float s[GDN_RPT];
    // The state is read before waiting for gdn_conv_prep: no kernel since this layer's last recurrence
    // writes it, so its loads overlap conv_prep's tail under programmatic launch. The conv window waits:
    // conv_prep reads it.
    gdn_state_io<false>(s, sh, part, rpt, dk, dv, col, col_ok);
    PDL_ENTER();
    gdn_window_advance(window, proj, ldp, n, cd, kernel);
    for (int i = tid; i < nqk; i += blockDim.x) *qk_slot(&qk[0][0][0], i) = prep[qk_index(i)];
    float v_c = col_ok ? prep[2 * hk * dk + (size_t)h * dv + col] : 0.0f;
    float beta_c = prep[cd + h], decay_c = prep[cd + hv + h];
    __syncthreads();
    for (int t = 0; t < n; ++t) {
        const int b = t & 1;
        float nxt[GDN_NEXT];
        float v_n = 0.0f, beta_n = 0.0f, decay_n = 0.0f;
        const bool more = t + 1 < n;
        if (more) {
            const float* pr = prep + (size_t)(t + 1) * ldq;
#pragma unroll
            for (int k = 0; k < GDN_NEXT; ++k) {
                const int i = tid + k * blockDim.x;
                nxt[k] = i < nqk ? pr[qk_index(i)] : 0.0f;
            }
            v_n = col_ok ? pr[2 * hk * dk + (size_t)h * dv + col] : 0.0f;
            beta_n = pr[cd + h];
            decay_n = pr[cd + hv + h];
        }
        const float o = gdn_rec_row(s, &qk[b][0][0], part, rpt, dk, v_c, beta_c, decay_c);
        if (part == 0 && col_ok) out[((size_t)t * hv + h) * dv + col] = o;
        if (more) {
#pragma unroll
            for (int k = 0; k < GDN_NEXT; ++k) {
                const int i = tid + k * blockDim.x;
                if (i < nqk) *qk_slot(&qk[b ^ 1][0][0], i) = nxt[k];
            }
            v_c = v_n;
            beta_c = beta_n;
            decay_c = decay_n;
        }
        __syncthreads();
    }
    gdn_state_io<true>(s, sh, part, rpt, dk, dv, col, col_ok);
    const int warps = blockDim.x >> 5;
    if (gridDim.y == 1) {
        // All of the head's columns are in this block: its outputs are complete after the last barrier.
        for (int t = warp; t < n; t += warps)
            gated_norm_warp(out + ((size_t)t * hv + h) * dv, proj + (size_t)t * ldp + cd + (size_t)h * dv, norm_w,
                            eps, dv, lane);
    } else if (head_done) {
        // The head's last block to finish normalises all its columns: one launch fewer per GDN layer
        // than the gated_rmsnorm kernel. Every block's outputs are fenced before it is counted.
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (tid == 0) last = atomicAdd(head_done + h, 1) == (int)gridDim.y - 1;
        __syncthreads();
        if (last) {
            __threadfence();
            for (int t = warp; t < n; t += warps)
                gated_norm_warp<true>(out + ((size_t)t * hv + h) * dv, proj + (size_t)t * ldp + cd + (size_t)h * dv,
                                      norm_w, eps, dv, lane);
            if (tid == 0) head_done[h] = 0;
        }
    }
}

// A decode row's conv of one channel (kernel 4, t = 0) in two halves: `load` reads what no kernel since
// this layer's last step writes (the window's 3 slots, the taps' weights), `finish` the new input and
// computes gdn_conv_silu<4>'s fma chain in its order (the same bits). x[1..3] are what the window moves to.
struct GdnConv4 {
    float x[4], w[4];
    __device__ __forceinline__ void load(const float* __restrict__ conv_w, const float* __restrict__ window, int cd,
                                         int c) {
        const float4 w4 = *reinterpret_cast<const float4*>(conv_w + (size_t)c * 4);
        w[0] = w4.x, w[1] = w4.y, w[2] = w4.z, w[3] = w4.w;
#pragma unroll
        for (int j = 0; j < 3; ++j) x[j] = window[(size_t)j * cd + c];
    }
    __device__ __forceinline__ float finish(const float* __restrict__ proj, int c) {
        x[3] = proj[c];
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) acc += w[j] * x[j];
        return silu_f(acc);
    }
    __device__ __forceinline__ void advance(float* __restrict__ window, int cd, int c) const {
#pragma unroll
        for (int j = 0; j < 3; ++j) window[(size_t)j * cd + c] = x[j + 1];
    }
};

// gdn_step: a decode row's gdn_conv_prep and gdn_rec in one launch (conv kernel 4), grid (hv, cb) and
// threads (4 to GDN_STEP_THREADS / 32 whole warps) as gdn_rec's; the gated norm is left to the caller (a
// segment's staging, or gated_rmsnorm). A block convolves what it reads: its key head's 2 dk q / k
// channels (the same for the head group's blocks), L2-normalised with gdn_conv_prep's grouping (32
// channels per warp sum, the groups added in its order: the same bits), its columns' v channels, its
// head's beta and decay; then gdn_rec's row. The state, the window's slots and the conv taps are read
// before the PDL wait (see gdn_rec), so only the projection row is read after it. The window moves
// forward (stores of taps already in registers) once its readers are done: v channels by their one
// block, a key head's q / k channels by the last of the head group's blocks to count itself in
// kh_done[kh] (zero between launches: that block resets it). gdn_step_into leaves the new state and
// window in another pair of buffers (a chained step's ping-pong, chain.rs); each form keeps __restrict__
// (one pointer per buffer: the form without it cost the 4B step 0.004 ms).
// Measured (4B decode step): the first form, 88 KB of code (both conv forms, 8 groups per
// thread: a once-a-layer kernel starts with a cold instruction cache), 2.799 ms against 2.659 for the two
// launches; 30 KB 2.743; reads before the wait 2.713 against 2.676; with gdn.rs's shared-memory
// reservation spreading the blocks two per SM, 2.610 against 2.664.
#define GDN_STEP_THREADS 512
template <bool INTO>  // window_in / state_in read, the new ones to window_out / state_out; else in place
__device__ __forceinline__ void gdn_step_body(const float* __restrict__ proj, int ldp,
                                              const float* __restrict__ conv_w, float* __restrict__ window,
                                              const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                              float* __restrict__ state, float* __restrict__ out, int hk, int hv,
                                              int dk, int dv, int* __restrict__ kh_done,
                                              float* __restrict__ window_into, float* __restrict__ state_into) {
    float* const window_out = INTO ? window_into : window;
    float* const state_out = INTO ? state_into : state;
    __shared__ __align__(16) float qk[2 * GDN_P][GDN_PLANE];
    __shared__ double sums[8];
    __shared__ int last;
    const int h = blockIdx.x, group = hv / hk, kh = h / group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, warps = blockDim.x >> 5;
    const int part = lane / GDN_CPW;
    const int col = blockIdx.y * (blockDim.x / GDN_P) + warp * GDN_CPW + lane % GDN_CPW;
    const bool col_ok = col < dv;
    const int cd = 2 * hk * dk + hv * dv;
    const int rpt = (dk + GDN_P - 1) / GDN_P;
    float s[GDN_RPT];
    gdn_state_io<false>(s, state + (size_t)h * dk * dv, part, rpt, dk, dv, col, col_ok);
    // Group g of 32 channels: g < 4 q channels 32 g + lane of key head kh, g >= 4 the k channels alike
    // (at least 4 warps: at most two groups per warp). Window slots and taps before the wait (as the state).
    GdnConv4 qk_conv[2], v_conv;
    int chan[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int g = warp + r * warps, i = 32 * (g & 3) + lane;
        chan[r] = g < 8 && i < dk ? (g >= 4 ? hk * dk + kh * dk + i : kh * dk + i) : -1;
        if (chan[r] >= 0) qk_conv[r].load(conv_w, window, cd, chan[r]);
    }
    const int v_chan = 2 * hk * dk + h * dv + col;
    if (col_ok) v_conv.load(conv_w, window, cd, v_chan);
    const float a_h = a_log[h], dt_h = dt_bias[h];
    // What needs no input row, before the wait: the decay's exp(A) and the q scale.
    const float exp_a = expf(a_h), q_scale = 1.0f / sqrtf((float)dk);
    PDL_ENTER();
    const float* pr = proj + cd + hv * dv;
    const float b_in = pr[h], a_in = pr[hv + h];
    float cv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cv[r] = chan[r] >= 0 ? qk_conv[r].finish(proj, chan[r]) : 0.0f;
    const float v_c = col_ok ? v_conv.finish(proj, v_chan) : 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int g = warp + r * warps;
        if (g < 8) {
            const double ss = warp_sum_d((double)cv[r] * (double)cv[r]);
            if (lane == 0) sums[g] = ss;
        }
    }
    const float beta_c = sigmoid_f(b_in);
    const float decay_c = expf(-exp_a * softplus_f(a_in + dt_h));
    __syncthreads();  // every window value of the block read, the sums complete
    int ticket = 0;
    if (tid == 0) ticket = atomicAdd(kh_done + kh, 1);  // awaited only after the row
    const double tq = ((sums[0] + sums[1]) + sums[2]) + sums[3], tk = ((sums[4] + sums[5]) + sums[6]) + sums[7];
    const float inv_q = 1.0f / sqrtf((float)tq + 1e-6f), inv_k = 1.0f / sqrtf((float)tk + 1e-6f);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int g = warp + r * warps, i = 32 * (g & 3) + lane;
        if (chan[r] >= 0)
            *gdn_qk_slot(&qk[0][0], g >= 4 ? dk + i : i, dk) =
                g >= 4 ? cv[r] * inv_k : (cv[r] * inv_q) * q_scale;
    }
    if (part == 0 && col_ok) v_conv.advance(window_out, cd, v_chan);
    __syncthreads();
    const float o = gdn_rec_row(s, &qk[0][0], part, rpt, dk, v_c, beta_c, decay_c);
    if (part == 0 && col_ok) out[(size_t)h * dv + col] = o;
    gdn_state_io<true>(s, state_out + (size_t)h * dk * dv, part, rpt, dk, dv, col, col_ok);
    if (tid == 0) {
        last = ticket == group * (int)gridDim.y - 1;
        if (last) kh_done[kh] = 0;
    }
    __syncthreads();
    if (last)
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (chan[r] >= 0) qk_conv[r].advance(window_out, cd, chan[r]);
}
extern "C" __global__ void __launch_bounds__(GDN_STEP_THREADS)
    gdn_step(const float* __restrict__ proj, int ldp, const float* __restrict__ conv_w, float* __restrict__ window,
             const float* __restrict__ a_log, const float* __restrict__ dt_bias, float* __restrict__ state,
             float* __restrict__ out, int hk, int hv, int dk, int dv, int* __restrict__ kh_done) {
    gdn_step_body<false>(proj, ldp, conv_w, window, a_log, dt_bias, state, out, hk, hv, dk, dv, kh_done, nullptr,
                         nullptr);
}
extern "C" __global__ void __launch_bounds__(GDN_STEP_THREADS)
    gdn_step_into(const float* __restrict__ proj, int ldp, const float* __restrict__ conv_w,
                  float* __restrict__ window, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                  float* __restrict__ state, float* __restrict__ out, int hk, int hv, int dk, int dv,
                  int* __restrict__ kh_done, float* __restrict__ window_out, float* __restrict__ state_out) {
    gdn_step_body<true>(proj, ldp, conv_w, window, a_log, dt_bias, state, out, hk, hv, dk, dv, kh_done, window_out,
                        state_out);
}
