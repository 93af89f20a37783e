// y[r, o] (+)= sum_i W[o, i] * x[r, i] for N <= 8 rows: the memory-bound matrix-vector path (decode,
// verify blocks). A block is 8 warps; `wpr` warps share one output row (split-K inside the block, so
// matrices with few rows still fill the GPU), so a block covers 8 / wpr rows per step and loops over
// row groups (grid-stride). Each lane streams 16-byte weight vectors (8 bf16 or 4 f32) with a streaming
// cache hint, LIN_U(N) vectors in flight, and reuses them for all N rows.
//
// Input modes: `x` rows from global memory, or, with `stage`, the N input rows copied into shared
// memory first, RMSNorm-ed on the way when `norm_w` is given (rms_inv: the same arithmetic as the
// rmsnorm kernel, so a fused norm equals the separate one bit for bit). Epilogue: y = acc, y += acc
// (`accumulate`), or SwiGLU (`swiglu_inter` = I > 0): W is [gate ; up] ([2I, in]) and each step's row
// slots are half gate rows j, half the matching up rows I + j; y = act [N, I] = silu(gate) * up.
//
// Batch invariance: a row's sum is formed in one order whatever N is — each lane's fmaf chain over the
// vectors part*32 + lane + k*32*wpr, a fixed xor-shuffle tree, then the wpr partial sums in part order —
// and wpr is chosen from the matrix shape alone (ops.rs), so a verify row is bit-identical to the same
// row decoded alone, staged or not.
#define LIN_WARPS 8
// Weight vectors in flight per lane: 4, or 2 for more than 4 rows (their accumulators and input
// loads need the registers; 2 blocks per SM stay resident).
#define LIN_U(N) ((N) <= 4 ? 4 : 2)

template <typename W> struct WVec;
template <> struct WVec<bf16_t> {
    enum { E = 8 };
    typedef uint4 Raw;
    static __device__ __forceinline__ Raw load(const bf16_t* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
    // Elements 4q..4q+3 of a vector.
    static __device__ __forceinline__ float4 quad(const Raw& u, int q) {
        const unsigned a = q == 0 ? u.x : u.z, b = q == 0 ? u.y : u.w;
        return make_float4(bf16_lo(a), bf16_hi(a), bf16_lo(b), bf16_hi(b));
    }
    static __device__ __forceinline__ float one(const bf16_t* p) { return bf2f(*p); }
};
template <> struct WVec<float> {
    enum { E = 4 };
    typedef float4 Raw;
    static __device__ __forceinline__ Raw load(const float* p) { return __ldcs(reinterpret_cast<const float4*>(p)); }
    static __device__ __forceinline__ float4 quad(const Raw& f, int) { return f; }
    static __device__ __forceinline__ float one(const float* p) { return *p; }
};

template <typename W, int N, int LIN_U_N = LIN_U(N)>
__device__ __forceinline__ void linear_rows(const W* __restrict__ w, const float* __restrict__ x,
                                            float* __restrict__ y, int in, int out, int accumulate, int wpr,
                                            int swiglu_inter, const float* __restrict__ norm_w, float eps,
                                            int zero_centred, int stage) {
    __shared__ double scratch[32];
    __shared__ float red[LIN_WARPS][N];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_group = LIN_WARPS / wpr;   // row slots per step
    const int slot = warp / wpr, part = warp % wpr;
    const int half = per_group / 2;          // SwiGLU: gate slots [0, half), up slots [half, per_group)
    const int groups = swiglu_inter ? (swiglu_inter + half - 1) / half : (out + per_group - 1) / per_group;
    const int E = WVec<W>::E;
    const bool vec = in % E == 0;
    const int nv = in / E;
    auto row_of = [&](int g, bool* valid) {
        if (swiglu_inter) {
            const int j = g * half + (slot < half ? slot : slot - half);
            *valid = j < swiglu_inter;
            return slot < half ? j : swiglu_inter + j;
        }
        const int o = g * per_group + slot;
        *valid = o < out;
        return o;
    };
    // Warm L2 with this block's first weight vectors: weights are never written, so this may run before
    // the previous kernel has finished (PDL_WAIT).
    if (vec && blockIdx.x < groups) {
        bool valid;
        const int o = row_of(blockIdx.x, &valid);
        if (valid)
            for (int u = 0; u < LIN_U_N; ++u) {
                const int v = part * 32 + lane + u * 32 * wpr;
                if (v < nv) PREFETCH_L2(w + (size_t)o * in + (size_t)v * E);
            }
    }
    PDL_ENTER();
    const float* xs = x;
    if (stage) {
        // The rows come in with all loads in flight at once, then are normalised in place: the same
        // products as normalising on the way, reading the copy.
        float* hs = DYN_SMEM(float);
        copy_to_smem(x, hs, N * in);
        __syncthreads();
        if (norm_w)
            for (int r = 0; r < N; ++r) {
                float* hr = hs + (size_t)r * in;
                scale_in_place(hr, in, rms_inv(hr, in, eps, scratch), norm_w, zero_centred);
            }
        __syncthreads();
        xs = hs;
    }
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        bool valid;
        const int o = row_of(g, &valid);
        float acc[N];
#pragma unroll
        for (int r = 0; r < N; ++r) acc[r] = 0.0f;
        if (valid) {
            const W* wr = w + (size_t)o * in;
            if (vec) {
                for (int v0 = part * 32 + lane; v0 < nv; v0 += 32 * wpr * LIN_U_N) {
                    typename WVec<W>::Raw raw[LIN_U_N];
#pragma unroll
                    for (int u = 0; u < LIN_U_N; ++u) {
                        const int v = v0 + u * 32 * wpr;
                        if (v < nv) raw[u] = WVec<W>::load(wr + (size_t)v * E);
                    }
#pragma unroll
                    for (int u = 0; u < LIN_U_N; ++u) {
                        const int v = v0 + u * 32 * wpr;
                        if (v < nv) {
#pragma unroll
                            for (int r = 0; r < N; ++r) {
                                const float4* xp = reinterpret_cast<const float4*>(xs + (size_t)r * in + (size_t)v * E);
#pragma unroll
                                for (int q = 0; q < E / 4; ++q) {
                                    const float4 xv = xp[q];
                                    const float4 wv = WVec<W>::quad(raw[u], q);
                                    acc[r] = fmaf(wv.x, xv.x, acc[r]);
                                    acc[r] = fmaf(wv.y, xv.y, acc[r]);
                                    acc[r] = fmaf(wv.z, xv.z, acc[r]);
                                    acc[r] = fmaf(wv.w, xv.w, acc[r]);
                                }
                            }
                        }
                    }
                }
            } else {
                for (int i = part * 32 + lane; i < in; i += 32 * wpr) {
                    const float wf = WVec<W>::one(wr + i);
#pragma unroll
                    for (int r = 0; r < N; ++r) acc[r] = fmaf(wf, xs[(size_t)r * in + i], acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < N; ++r) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < N; ++r) red[warp][r] = acc[r];
        }
        __syncthreads();
        if (part == 0 && lane == 0 && valid && !(swiglu_inter && slot >= half)) {
#pragma unroll
            for (int r = 0; r < N; ++r) {
                float t = red[slot * wpr][r];
                for (int p = 1; p < wpr; ++p) t += red[slot * wpr + p][r];
                if (swiglu_inter) {
                    const int up_slot = slot + half;
                    float u = red[up_slot * wpr][r];
                    for (int p = 1; p < wpr; ++p) u += red[up_slot * wpr + p][r];
                    y[(size_t)r * swiglu_inter + o] = silu_f(t) * u;
                } else {
                    float* dst = y + (size_t)r * out + o;
                    *dst = accumulate ? *dst + t : t;
                }
            }
        }
        __syncthreads();
    }
}

// Minimum resident blocks per SM by row count: 4 (<= 64 registers) for 1-2 rows, 2 for more rows (more
// accumulators), so that a staged grid sized for that many blocks per SM (ops.rs) is resident at once.
#define LINEAR_KERNEL(NAME, W, N)                                                                     \
    extern "C" __global__ void __launch_bounds__(LIN_WARPS * 32, (N) <= 2 ? 4 : 2)   \
        NAME(const W* w, const float* x, float* y, int in, int out, int accumulate, int wpr,          \
             int swiglu_inter, const float* norm_w, float eps, int zero_centred, int stage) {         \
        linear_rows<W, N>(w, x, y, in, out, accumulate, wpr, swiglu_inter, norm_w, eps, zero_centred, \
                          stage);                                                                     \
    }
LINEAR_KERNEL(linear_bf16_1, bf16_t, 1)
LINEAR_KERNEL(linear_bf16_2, bf16_t, 2)
LINEAR_KERNEL(linear_bf16_3, bf16_t, 3)
LINEAR_KERNEL(linear_bf16_4, bf16_t, 4)
LINEAR_KERNEL(linear_bf16_5, bf16_t, 5)
LINEAR_KERNEL(linear_bf16_6, bf16_t, 6)
LINEAR_KERNEL(linear_bf16_7, bf16_t, 7)
LINEAR_KERNEL(linear_bf16_8, bf16_t, 8)
LINEAR_KERNEL(linear_f32_1, float, 1)
LINEAR_KERNEL(linear_f32_2, float, 2)
LINEAR_KERNEL(linear_f32_3, float, 3)
LINEAR_KERNEL(linear_f32_4, float, 4)
LINEAR_KERNEL(linear_f32_5, float, 5)
LINEAR_KERNEL(linear_f32_6, float, 6)
LINEAR_KERNEL(linear_f32_7, float, 7)
LINEAR_KERNEL(linear_f32_8, float, 8)

// x f32 [count] -> bf16 (round to nearest even): the activations fed to cuBLAS on the GEMM path.
extern "C" __global__ void to_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, long long count) {
    PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < count; i += stride) y[i] = f2bf(x[i]);
}
