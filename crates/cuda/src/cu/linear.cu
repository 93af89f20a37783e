// y[r, o] (+)= sum_i W[o, i] * x[r, i] for N <= 16 rows: the memory-bound matrix-vector path (decode,
// verify blocks). A block is 8 warps; `wpr` warps share one output row (split-K inside the block, so
// matrices with few rows still fill the GPU), so a block covers 8 / wpr slots of LIN_R(N) output rows
// per step and loops over row groups (grid-stride). Each lane streams 16-byte weight vectors (8 bf16 or
// 4 f32) with a streaming cache hint, LIN_U(N) per weight row in flight, and reuses them for all N rows.
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
// Output rows per warp (R), weight vectors in flight per weight row (U), and double buffering (the
// next batch's loads issued before this batch's arithmetic), by input row count N. One row: 4 blocks per
// SM (<= 64 registers), 4 vectors in flight, no double buffer (its arithmetic is short). More rows: 2
// blocks per SM, R rows per warp so that each input value read from shared memory (or L1) feeds R
// weight rows, and the double buffer, which the longer arithmetic needs. With R = 1 and no double
// buffer, 4 rows cost 1.94x one row on the H200's verify round; with these, 1.10x for 2 rows, 1.30x for
// 4, 1.77x for 8 (R, U, DB variants A/B'd in one `cuda_check --sweep` call). None changes a row's summation order.
// 9..16 rows run in one launch too (the weights streamed once for a whole verify block), R = 4 with
// the warp reduction in passes of 32 values.
#define LIN_R(N) ((N) <= 1 ? 1 : (N) <= 2 ? 2 : 4)
#define LIN_U(N) ((N) <= 1 ? 4 : (N) <= 2 ? 2 : 1)
#define LIN_DB(N) ((N) >= 2)

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

#define LIN_POW2(V) ((V) <= 1 ? 1 : (V) <= 2 ? 2 : (V) <= 4 ? 4 : (V) <= 8 ? 8 : (V) <= 16 ? 16 : 32)

// Sums P values (a power of two <= 32) over the warp in 31 + log2(32 / P) shuffles instead of 5 P: at
// each xor distance o a lane keeps the half of its values selected by (lane & o) and adds the
// partner's copy of it, until one value is left, which finishes the plain butterfly. Every addition
// is the one warp_sum makes for that value (own + partner at the same distances, in the same order),
// so each sum has warp_sum's bits. Returns which value this lane holds (in vals[0]); the 32 / P lanes
// of an aligned group hold the same one.
// One level of warp_sum_scatter: W values at xor distance O.
template <int P, int W, int O>
__device__ __forceinline__ void scatter_level(float (&vals)[P], int lane, int& idx) {
    if constexpr (W > 1) {
        // Bit masks, not `up ? a : b`: NVVM turns that select of two array elements into a select of
        // their addresses and the array into local memory.
        const unsigned m = (lane & O) ? 0xffffffffu : 0u;
#pragma unroll
        for (int i = 0; i < W / 2; ++i) {
            const unsigned lo = __float_as_uint(vals[i]), hi = __float_as_uint(vals[i + W / 2]);
            const float mine = __uint_as_float((hi & m) | (lo & ~m));
            const float give = __uint_as_float((lo & m) | (hi & ~m));
            vals[i] = mine + __shfl_xor_sync(0xffffffffu, give, O);
        }
        idx += (lane & O) ? W / 2 : 0;
        scatter_level<P, W / 2, O / 2>(vals, lane, idx);
    }
}

template <int P>
__device__ __forceinline__ int warp_sum_scatter(float (&vals)[P], int lane) {
    int idx = 0;
    scatter_level<P, P, 16>(vals, lane, idx);
#pragma unroll
    for (int o = 16 / P; o > 0; o >>= 1) vals[0] += __shfl_xor_sync(0xffffffffu, vals[0], o);
    return idx;
}

// Row slots: a block step has LIN_WARPS / wpr slots, each of R consecutive output rows (SwiGLU: half
// the slots hold gate rows j, the other half the matching up rows I + j).
template <typename W, int N, int R = LIN_R(N), int U = LIN_U(N)>
__device__ __forceinline__ void linear_rows(const W* __restrict__ w, const float* __restrict__ x,
                                            float* __restrict__ y, int in, int out, int accumulate, int wpr,
                                            int swiglu_inter, const float* __restrict__ norm_w, float eps,
                                            int zero_centred, int stage) {
    __shared__ double scratch[32];
    __shared__ float red[LIN_WARPS][R * N];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_group = LIN_WARPS / wpr;   // row slots per step
    const int slot = warp / wpr, part = warp % wpr;
    const int half = per_group / 2;          // SwiGLU: gate slots [0, half), up slots [half, per_group)
    const int groups = swiglu_inter ? (swiglu_inter + half * R - 1) / (half * R)
                                    : (out + per_group * R - 1) / (per_group * R);
    const int E = WVec<W>::E;
    const bool vec = in % E == 0;
    const int nv = in / E;
    // Output row j of this warp's slot in group g; invalid rows (past the end) read row 0 and are
    // never written.
    auto row_of = [&](int g, int j, bool* valid) {
        if (swiglu_inter) {
            const int jj = (g * half + (slot < half ? slot : slot - half)) * R + j;
            *valid = jj < swiglu_inter;
            if (!*valid) return 0;
            return slot < half ? jj : swiglu_inter + jj;
        }
        const int o = (g * per_group + slot) * R + j;
        *valid = o < out;
        return *valid ? o : 0;
    };
    // Warm L2 with this block's first weight vectors: weights are never written, so this may run before
    // the previous kernel has finished (PDL_WAIT).
    if (vec && blockIdx.x < groups) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            bool valid;
            const int o = row_of(blockIdx.x, j, &valid);
            if (valid)
                for (int u = 0; u < U; ++u) {
                    const int v = part * 32 + lane + u * 32 * wpr;
                    if (v < nv) PREFETCH_L2(w + (size_t)o * in + (size_t)v * E);
                }
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
        bool valid[R];
        const W* wr[R];
#pragma unroll
        for (int j = 0; j < R; ++j) wr[j] = w + (size_t)row_of(g, j, &valid[j]) * in;
        float acc[R][N];
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
            for (int r = 0; r < N; ++r) acc[j][r] = 0.0f;
        if (valid[0]) {
            if (vec) {
                typedef typename WVec<W>::Raw Raw;
                const int step = 32 * wpr * U;
                // Vectors v0 + u * 32 * wpr of the R rows, u < U.
                auto load_batch = [&](int v0, Raw (&raw)[U][R]) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const int v = v0 + u * 32 * wpr;
                        if (v < nv)
#pragma unroll
                            for (int j = 0; j < R; ++j) raw[u][j] = WVec<W>::load(wr[j] + (size_t)v * E);
                    }
                };
                auto fma_batch = [&](int v0, const Raw (&raw)[U][R]) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const int v = v0 + u * 32 * wpr;
                        if (v < nv) {
#pragma unroll
                            for (int r = 0; r < N; ++r) {
                                const float4* xp = reinterpret_cast<const float4*>(xs + (size_t)r * in + (size_t)v * E);
#pragma unroll
                                for (int q = 0; q < E / 4; ++q) {
                                    const float4 xv = xp[q];
#pragma unroll
                                    for (int j = 0; j < R; ++j) {
                                        const float4 wv = WVec<W>::quad(raw[u][j], q);
                                        acc[j][r] = fmaf(wv.x, xv.x, acc[j][r]);
                                        acc[j][r] = fmaf(wv.y, xv.y, acc[j][r]);
                                        acc[j][r] = fmaf(wv.z, xv.z, acc[j][r]);
                                        acc[j][r] = fmaf(wv.w, xv.w, acc[j][r]);
                                    }
                                }
                            }
                        }
                    }
                };
                if constexpr (LIN_DB(N)) {
                    // The next batch's loads go out before this batch's arithmetic, which for several
                    // rows is long enough to leave the memory pipe idle otherwise.
                    Raw cur[U][R], nxt[U][R];
                    int v0 = part * 32 + lane;
                    load_batch(v0, cur);
                    for (; v0 < nv; v0 += step) {
                        if (v0 + step < nv) load_batch(v0 + step, nxt);
                        fma_batch(v0, cur);
#pragma unroll
                        for (int u = 0; u < U; ++u)
#pragma unroll
                            for (int j = 0; j < R; ++j) cur[u][j] = nxt[u][j];
                    }
                } else {
                    for (int v0 = part * 32 + lane; v0 < nv; v0 += step) {
                        Raw raw[U][R];
                        load_batch(v0, raw);
                        fma_batch(v0, raw);
                    }
                }
            } else {
                for (int i = part * 32 + lane; i < in; i += 32 * wpr) {
#pragma unroll
                    for (int j = 0; j < R; ++j) {
                        const float wf = WVec<W>::one(wr[j] + i);
#pragma unroll
                        for (int r = 0; r < N; ++r) acc[j][r] = fmaf(wf, xs[(size_t)r * in + i], acc[j][r]);
                    }
                }
            }
        }
        // The R * N sums over the warp in passes of up to 32, each lane ending with one sum of a pass
        // (warp_sum_scatter).
        {
            constexpr int V = R * N, P = LIN_POW2(V < 32 ? V : 32);
#pragma unroll
            for (int base = 0; base < V; base += 32) {
                float vals[P];
#pragma unroll
                for (int k = 0; k < P; ++k) vals[k] = base + k < V ? acc[(base + k) / N][(base + k) % N] : 0.0f;
                const int k = warp_sum_scatter<P>(vals, lane);
                if (lane % (32 / P) == 0 && base + k < V) red[warp][base + k] = vals[0];
            }
        }
        __syncthreads();
        // Lane k of the slot's first warp writes output row k / N of input row k % N (k < R * N, in
        // steps of 32).
        if (part == 0 && !(swiglu_inter && slot >= half))
        for (int k = lane; k < R * N; k += 32) {
            const int j = k / N, r = k % N;
            bool ok;
            const int o = row_of(g, j, &ok);
            if (ok) {
                float t = red[slot * wpr][k];
                for (int p = 1; p < wpr; ++p) t += red[slot * wpr + p][k];
                if (swiglu_inter) {
                    const int up_slot = slot + half;
                    float u = red[up_slot * wpr][k];
                    for (int p = 1; p < wpr; ++p) u += red[up_slot * wpr + p][k];
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

// Minimum resident blocks per SM by row count: 4 (<= 64 registers) for one row, 2 for up to 8 rows (more
// accumulators and the double buffer), 1 above (R * N = 64 accumulators), so that a staged grid sized
// for that many blocks per SM (ops.rs) is resident at once.
#define LIN_MIN_BLOCKS(N) ((N) <= 1 ? 4 : (N) <= 8 ? 2 : 1)
#define LINEAR_KERNEL(NAME, W, N)                                                                     \
    extern "C" __global__ void __launch_bounds__(LIN_WARPS * 32, LIN_MIN_BLOCKS(N))   \
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
LINEAR_KERNEL(linear_bf16_9, bf16_t, 9)
LINEAR_KERNEL(linear_bf16_10, bf16_t, 10)
LINEAR_KERNEL(linear_bf16_11, bf16_t, 11)
LINEAR_KERNEL(linear_bf16_12, bf16_t, 12)
LINEAR_KERNEL(linear_bf16_13, bf16_t, 13)
LINEAR_KERNEL(linear_bf16_14, bf16_t, 14)
LINEAR_KERNEL(linear_bf16_15, bf16_t, 15)
LINEAR_KERNEL(linear_bf16_16, bf16_t, 16)
LINEAR_KERNEL(linear_f32_1, float, 1)
LINEAR_KERNEL(linear_f32_2, float, 2)
LINEAR_KERNEL(linear_f32_3, float, 3)
LINEAR_KERNEL(linear_f32_4, float, 4)
LINEAR_KERNEL(linear_f32_5, float, 5)
LINEAR_KERNEL(linear_f32_6, float, 6)
LINEAR_KERNEL(linear_f32_7, float, 7)
LINEAR_KERNEL(linear_f32_8, float, 8)
LINEAR_KERNEL(linear_f32_9, float, 9)
LINEAR_KERNEL(linear_f32_10, float, 10)
LINEAR_KERNEL(linear_f32_11, float, 11)
LINEAR_KERNEL(linear_f32_12, float, 12)
LINEAR_KERNEL(linear_f32_13, float, 13)
LINEAR_KERNEL(linear_f32_14, float, 14)
LINEAR_KERNEL(linear_f32_15, float, 15)
LINEAR_KERNEL(linear_f32_16, float, 16)

// x f32 [count] -> bf16 (round to nearest even): the activations fed to cuBLAS on the GEMM path.
extern "C" __global__ void to_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, long long count) {
    PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < count; i += stride) y[i] = f2bf(x[i]);
}
