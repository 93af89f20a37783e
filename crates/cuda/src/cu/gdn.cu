// Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) on the GPU, step form.
//
// conv1d_silu, one thread per channel: the depthwise causal conv (kernel K <= 8) + SiLU over the rows in
// order, reading inputs from the fused projection (stride ldp) and the carried window of the previous
// K-1 inputs (oldest first), which it updates. Same tap order as crates/kernels/src/conv.rs.
//
// gdn_step, one block per (value head, 32 value columns), 4 warps; lane = value column, warp w owns key
// rows [w*rpw, (w+1)*rpw) of S [dk, dv] in registers (dk <= 128). Per row t, in order:
//   q, k = L2-normalised key-head vectors (f64 sum of squares, eps 1e-6 inside the sqrt), q *= dk^-1/2;
//   beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias);
//   S <- exp(g) S; kv = S^T k; delta = beta (v - kv); S <- S + k delta^T; o = S^T q.
// Value columns are independent given (q, k, g, beta), so the column split needs no communication.
// A row's result depends only on the state before it, so n rows in one launch equal n launches of one
// row bit for bit: decode, verify and the tape replay all run this kernel.
#define GDN_WARPS 4
#define GDN_MAX_RPW 32
#define GDN_MAX_DK (GDN_WARPS * GDN_MAX_RPW)

extern "C" __global__ void conv1d_silu(const float* __restrict__ proj, int ldp, const float* __restrict__ w,
                                       float* __restrict__ window, float* __restrict__ out, int n, int c,
                                       int kernel) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c) return;
    float hist[7];
    const int h = kernel - 1;
#pragma unroll
    for (int j = 0; j < 7; ++j) hist[j] = j < h ? window[(size_t)j * c + ch] : 0.0f;
    float wt[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) wt[j] = j < kernel ? w[(size_t)ch * kernel + j] : 0.0f;
    for (int t = 0; t < n; ++t) {
        const float x = proj[(size_t)t * ldp + ch];
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j < h) acc += wt[j] * hist[j];
            else if (j == h) acc += wt[j] * x;
        }
        out[(size_t)t * c + ch] = silu_f(acc);
        // Shift the window (constant indices only, so it stays in registers).
#pragma unroll
        for (int j = 0; j < 7; ++j) {
            if (j + 1 < h) hist[j] = hist[j + 1];
            else if (j + 1 == h) hist[j] = x;
        }
    }
#pragma unroll
    for (int j = 0; j < 7; ++j)
        if (j < h) window[(size_t)j * c + ch] = hist[j];
}

extern "C" __global__ void __launch_bounds__(GDN_WARPS * 32)
    gdn_step(const float* __restrict__ mixed, const float* __restrict__ proj, int ldp, int ba_off,
             const float* __restrict__ a_log, const float* __restrict__ dt_bias, float* __restrict__ state,
             float* __restrict__ out, int n, int hk, int hv, int dk, int dv) {
    __shared__ float qs[GDN_MAX_DK], ks[GDN_MAX_DK];
    __shared__ float red[GDN_WARPS][32];
    __shared__ float norms[2];
    const int head = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.y * 32 + lane;
    const bool col_ok = col < dv;
    const int rpw = (dk + GDN_WARPS - 1) / GDN_WARPS;
    const int i0 = warp * rpw;
    const int kh = head / (hv / hk);
    const int conv_dim = 2 * hk * dk + hv * dv;
    const float qscale = 1.0f / sqrtf((float)dk);
    const float neg_a = -expf(a_log[head]);
    const float dtb = dt_bias[head];
    float* sh = state + (size_t)head * dk * dv;
    float s[GDN_MAX_RPW];
#pragma unroll
    for (int j = 0; j < GDN_MAX_RPW; ++j) {
        const int i = i0 + j;
        s[j] = (j < rpw && i < dk && col_ok) ? sh[(size_t)i * dv + col] : 0.0f;
    }
    for (int t = 0; t < n; ++t) {
        const float* mr = mixed + (size_t)t * conv_dim;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = mr[(size_t)kh * dk + i];
            ks[i] = mr[(size_t)hk * dk + (size_t)kh * dk + i];
        }
        __syncthreads();
        if (warp < 2) {
            const float* src = warp == 0 ? qs : ks;
            double acc = 0.0;
            for (int i = lane; i < dk; i += 32) acc += (double)src[i] * (double)src[i];
            acc = warp_sum_d(acc);
            if (lane == 0) norms[warp] = 1.0f / sqrtf((float)acc + 1e-6f);
        }
        __syncthreads();
        const float nq = norms[0], nk = norms[1];
        const float* pr = proj + (size_t)t * ldp + ba_off;
        const float beta = sigmoid_f(pr[head]);
        const float g = neg_a * softplus_f(pr[hv + head] + dtb);
        const float decay = expf(g);
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < GDN_MAX_RPW; ++j) {
            const int i = i0 + j;
            if (j < rpw && i < dk) {
                s[j] *= decay;
                part = fmaf(s[j], ks[i] * nk, part);
            }
        }
        red[warp][lane] = part;
        __syncthreads();
        float kv = 0.0f;
        for (int w = 0; w < GDN_WARPS; ++w) kv += red[w][lane];
        const float v = col_ok ? mr[(size_t)2 * hk * dk + (size_t)head * dv + col] : 0.0f;
        const float delta = (v - kv) * beta;
        __syncthreads();
        part = 0.0f;
#pragma unroll
        for (int j = 0; j < GDN_MAX_RPW; ++j) {
            const int i = i0 + j;
            if (j < rpw && i < dk) {
                s[j] = fmaf(ks[i] * nk, delta, s[j]);
                part = fmaf(s[j], (qs[i] * nq) * qscale, part);
            }
        }
        red[warp][lane] = part;
        __syncthreads();
        if (warp == 0 && col_ok) {
            float o = 0.0f;
            for (int w = 0; w < GDN_WARPS; ++w) o += red[w][lane];
            out[((size_t)t * hv + head) * dv + col] = o;
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < GDN_MAX_RPW; ++j) {
        const int i = i0 + j;
        if (j < rpw && i < dk && col_ok) sh[(size_t)i * dv + col] = s[j];
    }
}
