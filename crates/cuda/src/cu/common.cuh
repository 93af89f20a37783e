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
