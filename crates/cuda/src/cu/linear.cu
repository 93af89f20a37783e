// y[r, o] (+)= sum_i W[o, i] * x[r, i] for N <= 8 rows: the memory-bound matrix-vector path (decode,
// verify blocks). One warp per output feature, 8 warps per block; each lane streams 16-byte weight
// vectors (8 bf16 or 4 f32) with a streaming cache hint and reuses them for all N rows.
// Batch invariance: a row's sum is formed in the same order (lane-strided fmaf chain, then a fixed
// xor-shuffle tree) whatever N is, so a verify row is bit-identical to the same row decoded alone.
#define LIN_WARPS 8

template <typename W> struct WVec;
template <> struct WVec<bf16_t> {
    enum { E = 8 };
    static __device__ __forceinline__ void load(const bf16_t* p, float* o) {
        uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
        o[0] = bf16_lo(u.x); o[1] = bf16_hi(u.x); o[2] = bf16_lo(u.y); o[3] = bf16_hi(u.y);
        o[4] = bf16_lo(u.z); o[5] = bf16_hi(u.z); o[6] = bf16_lo(u.w); o[7] = bf16_hi(u.w);
    }
    static __device__ __forceinline__ float one(const bf16_t* p) { return bf2f(*p); }
};
template <> struct WVec<float> {
    enum { E = 4 };
    static __device__ __forceinline__ void load(const float* p, float* o) {
        float4 f = __ldcs(reinterpret_cast<const float4*>(p));
        o[0] = f.x; o[1] = f.y; o[2] = f.z; o[3] = f.w;
    }
    static __device__ __forceinline__ float one(const float* p) { return *p; }
};

template <typename W, int N>
__device__ __forceinline__ void linear_rows(const W* __restrict__ w, const float* __restrict__ x,
                                            float* __restrict__ y, int in, int out, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5);
    if (o >= out) return;
    const W* wr = w + (size_t)o * in;
    float acc[N];
#pragma unroll
    for (int r = 0; r < N; ++r) acc[r] = 0.0f;
    const int E = WVec<W>::E;
    if (in % E == 0) {
        const int nv = in / E;
#pragma unroll 4
        for (int v = lane; v < nv; v += 32) {
            float wf[E];
            WVec<W>::load(wr + (size_t)v * E, wf);
#pragma unroll
            for (int r = 0; r < N; ++r) {
                const float4* xp = reinterpret_cast<const float4*>(x + (size_t)r * in + (size_t)v * E);
#pragma unroll
                for (int q = 0; q < E / 4; ++q) {
                    float4 xv = __ldg(xp + q);
                    acc[r] = fmaf(wf[4 * q + 0], xv.x, acc[r]);
                    acc[r] = fmaf(wf[4 * q + 1], xv.y, acc[r]);
                    acc[r] = fmaf(wf[4 * q + 2], xv.z, acc[r]);
                    acc[r] = fmaf(wf[4 * q + 3], xv.w, acc[r]);
                }
            }
        }
    } else {
        for (int i = lane; i < in; i += 32) {
            float wf = WVec<W>::one(wr + i);
#pragma unroll
            for (int r = 0; r < N; ++r) acc[r] = fmaf(wf, x[(size_t)r * in + i], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < N; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < N; ++r) {
            float* dst = y + (size_t)r * out + o;
            *dst = accumulate ? *dst + acc[r] : acc[r];
        }
    }
}

#define LINEAR_KERNEL(NAME, W, N)                                                                  \
    extern "C" __global__ void __launch_bounds__(LIN_WARPS * 32)                                   \
        NAME(const W* w, const float* x, float* y, int in, int out, int accumulate) {              \
        linear_rows<W, N>(w, x, y, in, out, accumulate);                                           \
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
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < count; i += stride) y[i] = f2bf(x[i]);
}
