// Shared helpers of every kernel. bf16 is handled as raw u16 bits so that the kernels need no toolkit
// header: bf16 -> f32 is a 16-bit shift (exact), f32 -> bf16 rounds to nearest even (NaN kept quiet).
// Numerics follow the CPU engine (crates/kernels): f64 sums of squares for norms, torch's formulas for
// sigmoid / silu / softplus, cos/sin of the f32 RoPE angle taken in f64.
typedef unsigned short bf16_t;
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float bf16_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
// `scratch` must hold 32 doubles; the call synchronises the block twice.
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < warps; ++w) t += scratch[w];
    return t;
}

// Dynamic shared memory of a launch (the launcher passes its size), 16-byte aligned.
//
// Programmatic dependent launch (sm_90; launches with the programmatic-stream-serialization attribute,
// buf.rs): a kernel may start while the previous one in the stream finishes. PDL_WAIT blocks until the
// previous kernel has completed and its writes are visible; PDL_LAUNCH lets the next kernel start. The
// discipline that keeps this exact: every kernel executes PDL_WAIT in every thread before it reads or
// writes any buffer another kernel touches (only weights, which no kernel writes, may be read before
// it), and before any early exit, so a kernel can never complete ahead of its predecessor. Without the
// attribute both are no-ops.
#ifdef KERNEL_SIM
#define DYN_SMEM(T) (reinterpret_cast<T*>(sim_dyn_smem()))
#define PREFETCH_L2(p) ((void)(p))
#define PDL_WAIT() ((void)0)
#define PDL_LAUNCH() ((void)0)
#else
extern __shared__ __align__(16) unsigned char dyn_smem_[];
#define DYN_SMEM(T) (reinterpret_cast<T*>(dyn_smem_))
#define PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" :::)
#endif
#define PDL_ENTER() \
    do {             \
        PDL_WAIT();  \
        PDL_LAUNCH(); \
    } while (0)

// 1 / sqrt(mean(x^2) + eps) of one row, for a block of 256 threads: f64 sum of squares strided by the
// thread index, block_sum_d. Every RMSNorm of the residual stream (the rmsnorm kernel and the GEMV
// prologue that normalises its input) calls this with 256 threads, so a row is normalised bit for bit
// the same wherever it is done.
#define NORM_THREADS 256
__device__ __forceinline__ float rms_inv(const float* __restrict__ xr, int width, float eps, double* scratch) {
    double ss = 0.0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss, scratch);
    const float variance = (float)(ss / (double)width);
    return 1.0f / sqrtf(variance + eps);
}

// dst[0, count) = src[0, count), global to shared memory, every thread's loads issued before its stores:
// a strided copy of one float per step left each step's L2 round trip exposed (a GEMV's staged input:
// 2.8 us per launch on the H200, measured by a standalone probe of the GEMV chain).
__device__ __forceinline__ void copy_to_smem(const float* __restrict__ src, float* dst, int count) {
    const bool vec = (count & 3) == 0 && ((unsigned long long)src & 15) == 0 && ((unsigned long long)dst & 15) == 0;
    if (!vec) {
        for (int i = threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
        return;
    }
    const float4* s4 = reinterpret_cast<const float4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    const int n4 = count >> 2, step = blockDim.x;
    for (int i0 = threadIdx.x; i0 < n4; i0 += 8 * step) {
        float4 v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if (i0 + k * step < n4) v[k] = s4[i0 + k * step];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if (i0 + k * step < n4) d4[i0 + k * step] = v[k];
    }
}

// x[i] = (x[i] * inv) * (zero_centred ? 1 + w[i] : w[i]) over one row: the rmsnorm kernel's arithmetic
// per element, w read four at a time.
__device__ __forceinline__ void scale_in_place(float* x, int width, float inv, const float* __restrict__ w,
                                               int zero_centred) {
    if ((width & 3) == 0 && ((unsigned long long)w & 15) == 0 && ((unsigned long long)x & 15) == 0) {
        float4* x4 = reinterpret_cast<float4*>(x);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        for (int i = threadIdx.x; i < (width >> 2); i += blockDim.x) {
            const float4 s = w4[i];
            float4 v = x4[i];
            v.x = (v.x * inv) * (zero_centred ? 1.0f + s.x : s.x);
            v.y = (v.y * inv) * (zero_centred ? 1.0f + s.y : s.y);
            v.z = (v.z * inv) * (zero_centred ? 1.0f + s.z : s.z);
            v.w = (v.w * inv) * (zero_centred ? 1.0f + s.w : s.w);
            x4[i] = v;
        }
    } else {
        for (int i = threadIdx.x; i < width; i += blockDim.x) x[i] = (x[i] * inv) * (zero_centred ? 1.0f + w[i] : w[i]);
    }
}
