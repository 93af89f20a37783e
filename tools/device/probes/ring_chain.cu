// Probe: a persistent decode-chain kernel whose weights stream into a per-SM ring of shared-memory pages
// filled by producer warps with bulk copies (cp.async.bulk + mbarrier). The producers never wait for the
// grid barrier between stages, only for a free page, so the next stage's weights keep arriving while the
// consumers drain the current stage, cross the barrier and load the new input (decode_chain.cu measured
// ~5.5 us per GEMV boundary of ramp and drain in the one-kernel-per-GEMV form).
// Same chain as decode_chain.cu: the 4B-like hybrid's in_proj 2560->12352, out 4096->2560,
// gate_up 2560->18432, down 9216->2560, 32 layers, 7.25 GB of bf16 weights, stage s reads stage s-1's out.
// Block b owns rows b, b + 132, ... of every stage (all SMs read one window: contiguous ranges per SM
// lost 3%); a row longer than a page is split into segments whose partial sums meet in shared memory.
// Consumer warp p % C reads page p (8 bf16 per lane-vector, an fmaf chain per lane, a butterfly sum).
// Results (H200, session 6): tools/device/README.md, "Run 48". Best: 8 KB x 20 pages, 10 consumer and 4
// producer warps, 2.10 ms per chain against 2.335 for the product's linear.cu (gemv_chain.cu) and 1.60 to
// read every weight once; one producer thread caps a ring at ~2.6 TB/s.
//   nvcc -O3 -arch=sm_90 -o ring_chain ring_chain.cu && ./ring_chain
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

#define MAXIN 9216
#define MAXW 18432
#define MAXROWS 192

struct Stage {
    const uint4* w;  // [out, in/8] vectors of 8 bf16
    int in, out, nseg;
};

__device__ float g_act[2][MAXW];

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float dot8(uint4 u, const float* x, float s) {
    const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
    s = fmaf(__uint_as_float(u.x << 16), a.x, s);
    s = fmaf(__uint_as_float(u.x & 0xffff0000u), a.y, s);
    s = fmaf(__uint_as_float(u.y << 16), a.z, s);
    s = fmaf(__uint_as_float(u.y & 0xffff0000u), a.w, s);
    s = fmaf(__uint_as_float(u.z << 16), b.x, s);
    s = fmaf(__uint_as_float(u.z & 0xffff0000u), b.y, s);
    s = fmaf(__uint_as_float(u.w << 16), b.z, s);
    s = fmaf(__uint_as_float(u.w & 0xffff0000u), b.w, s);
    return s;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
// Spins give up after ~2 s with a report and a trap, so a protocol error shows as a launch error, not a hang.
__device__ __forceinline__ void watchdog(long long t0, const char* what, int a, int c) {
    if (clock64() - t0 > 4000000000ll) {
        printf("stuck: %s block %d thread %d (%d, %d)\n", what, blockIdx.x, threadIdx.x, a, c);
        __trap();
    }
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
    unsigned ok = 0;
    const long long t0 = clock64();
    do {
        watchdog(t0, "mbarrier", (int)parity, 0);
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(ok)
            : "r"(smem_addr(b)), "r"(parity)
            : "memory");
    } while (!ok);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* full) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(full)), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(full))
        : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void consumers_sync(int c) { asm volatile("bar.sync 1, %0;" ::"r"(c * 32) : "memory"); }

// Block b of g owns rows b, b + g, b + 2g, ... (INTERLEAVE) so that at any moment the SMs read one
// contiguous window, or the contiguous range [out*b/g, out*(b+1)/g). Returns the row count; row(i).
template <int INTERLEAVE>
struct Rows {
    int b, g, r0, count;
    __device__ Rows(int out, int b_, int g_) : b(b_), g(g_) {
        if (INTERLEAVE) {
            r0 = 0;
            count = b < out ? (out - b + g - 1) / g : 0;
        } else {
            r0 = (int)((long long)out * b / g);
            count = (int)((long long)out * (b + 1) / g) - r0;
        }
    }
    __device__ int row(int i) const { return INTERLEAVE ? b + g * i : r0 + i; }
};

// PAGE bytes per page, NP pages, C consumer warps + 1 producer warp. Dynamic smem: pages, x, acc, barriers.
template <int PAGE, int NP, int C, int IL = 1, int PR = 1>
__global__ void __launch_bounds__((C + PR) * 32, 1)
    ring_chain(const Stage* stages, int n, unsigned* bar, unsigned base, int mode) {
    // Page p is filled only by producer p % PR and read only by consumer warp p % C, so each side meets a
    // page's phases in order: a parity wait on a barrier two phases behind reads as complete (the
    // "immediately preceding phase"), which with pages shared between warps corrupted the barriers.
    static_assert(NP % C == 0 && NP % PR == 0, "pages must split evenly between consumers and producers");
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* pages = smem;
    float* xs = reinterpret_cast<float*>(smem + NP * PAGE);
    float* acc = xs + MAXIN;
    uint64_t* full = reinterpret_cast<uint64_t*>(acc + MAXROWS);
    uint64_t* empty = full + NP;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int p = 0; p < NP; ++p) {
            mbar_init(&full[p], 1);
            mbar_init(&empty[p], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp >= C) {  // producers: lane 0 of warp C + l issues the pages with seq % PR == l (one lane per
                      // warp: spinning lanes of one warp starve each other)
        const int pl = warp - C;
        unsigned seq = 0;
        // The producers stay until every consumer is done (the __syncthreads below): a thread that exits with
        // bulk copies in flight faults the launch ("unspecified launch failure", runs 48-49 of the probe).
        for (int s = 0; s < n && lane == 0; ++s) {
            const Stage st = stages[s];
            const Rows<IL> rows(st.out, b, g);
            const int seg = st.in / st.nseg, units = rows.count * st.nseg;
            const unsigned bytes = seg * 2;
            for (int j = 0; j < units; ++j, ++seq) {
                if ((int)(seq % PR) != pl) continue;
                const unsigned p = seq % NP, k = seq / NP;
                if (k > 0) mbar_wait(&empty[p], (k - 1) & 1);
                const int row = rows.row(j / st.nseg), sg = j % st.nseg;
                bulk_load(pages + p * PAGE, reinterpret_cast<const unsigned char*>(st.w) + ((size_t)row * st.in + (size_t)sg * seg) * 2,
                          bytes, &full[p]);
                // mode bits 3-4: also warm L2 with the unit NP or 2 NP pages ahead (this stage's only).
                const int ahead = ((mode >> 3) & 3) * NP;
                if (ahead && j + ahead < units) {
                    const int ja = j + ahead;
                    const unsigned char* src = reinterpret_cast<const unsigned char*>(st.w) +
                                               ((size_t)rows.row(ja / st.nseg) * st.in + (size_t)(ja % st.nseg) * seg) * 2;
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
                }
            }
        }
        __syncthreads();
        return;
    }
    unsigned seq0 = 0;
    for (int s = 0; s < n; ++s) {
        const Stage st = stages[s];
        const Rows<IL> rows(st.out, b, g);
        const int seg = st.in / st.nseg, units = rows.count * st.nseg;
        // The input: written by every block in the previous stage; L2 only (L1 may hold the old copy).
        const float4* x4 = reinterpret_cast<const float4*>(g_act[s & 1]);
        if (!(mode & 2) || s == 0) {
            if (mode & 4) {
                for (int i = threadIdx.x; i < st.in / 4; i += C * 32) reinterpret_cast<float4*>(xs)[i] = __ldcg(x4 + i);
            } else {  // every load in flight before the first store: one L2 round trip, not in / (4 * threads)
                constexpr int K = (MAXIN / 4 + C * 32 - 1) / (C * 32);
                float4 t[K];
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const int i = threadIdx.x + k * C * 32;
                    if (i < st.in / 4) t[k] = __ldcg(x4 + i);
                }
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const int i = threadIdx.x + k * C * 32;
                    if (i < st.in / 4) reinterpret_cast<float4*>(xs)[i] = t[k];
                }
            }
        }
        if (st.nseg > 1)
            for (int i = threadIdx.x; i < rows.count; i += C * 32) acc[i] = 0.0f;
        consumers_sync(C);
        float* y = g_act[(s + 1) & 1];
        for (int j = (int)((warp + C - seq0 % C) % C); j < units; j += C) {  // seq0 + j == warp (mod C)
            const unsigned sq = seq0 + j, p = sq % NP, k = sq / NP;
            mbar_wait(&full[p], k & 1);
            const uint4* wv = reinterpret_cast<const uint4*>(pages + p * PAGE);
            const float* xseg = xs + (j % st.nseg) * seg;
            float a = 0.0f;
            for (int v = lane; v < seg / 8; v += 32) a = dot8(wv[v], xseg + v * 8, a);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[p]);
            a = warp_sum(a);
            if (lane == 0) {
                if (st.nseg == 1)
                    y[rows.row(j) % MAXW] = a * 1e-3f;
                else
                    atomicAdd(&acc[j / st.nseg], a);
            }
        }
        seq0 += units;
        consumers_sync(C);
        if (st.nseg > 1)
            for (int i = threadIdx.x; i < rows.count; i += C * 32) y[rows.row(i)] = acc[i] * 1e-3f;
        consumers_sync(C);
        if (threadIdx.x == 0 && !(mode & 1)) {
            if (mode & 32) {  // arrive with a release reduction: no fence, no returned value to wait for
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
            } else {
                __threadfence();
                atomicAdd(bar, 1u);
            }
            const unsigned target = base + (unsigned)(s + 1) * g;
            const long long t0 = clock64();
            while (ld_acquire(bar) < target) watchdog(t0, "grid barrier", s, (int)ld_acquire(bar));
        }
        consumers_sync(C);
    }
    __syncthreads();
}

__global__ void read_all(const uint4* w, size_t n, float* out) {
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 u = __ldcs(w + i);
        acc += __uint_as_float(u.x) + __uint_as_float(u.w);
    }
    if (acc == 12345.0f) out[0] = acc;
}

__global__ void fill(uint4* w, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u;
        unsigned b = 0x3c00u | (h >> 25);
        w[i] = make_uint4(b | (b << 16), b, b << 16, b);
    }
}

int main() {
    setvbuf(stdout, nullptr, _IONBF, 0);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int shapes[4][2] = {{2560, 12352}, {4096, 2560}, {2560, 18432}, {9216, 2560}};
    const int layers = 32;
    size_t total = 0;
    for (auto& s : shapes) total += (size_t)s[0] * s[1] / 8;
    total *= layers;
    uint4* w;
    CK(cudaMalloc(&w, total * 16));
    fill<<<4096, 256>>>(w, total);
    unsigned* bar;
    CK(cudaMalloc(&bar, 4));
    float* junk;
    CK(cudaMalloc(&junk, 64));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const double gb = total * 16.0 / 1e9;
    const int reps = 20;
    auto report = [&](const char* name, float ms) {
        printf("%-52s %8.3f ms per chain  %7.0f GB/s\n", name, ms, gb / (ms * 1e-3));
    };
    // Stage lists per page size (a row longer than a page is split in equal segments of whole 256-element runs).
    auto make_stages = [&](int page, Stage** dev) -> int {
        std::vector<Stage> st;
        size_t off = 0;
        for (int l = 0; l < layers; ++l)
            for (auto& s : shapes) {
                Stage x;
                x.w = w + off;
                x.in = s[0];
                x.out = s[1];
                x.nseg = 1;
                while (x.in * 2 / x.nseg > page || x.in % (x.nseg * 256) != 0) ++x.nseg;
                st.push_back(x);
                off += (size_t)s[0] * s[1] / 8;
            }
        CK(cudaMalloc(dev, st.size() * sizeof(Stage)));
        CK(cudaMemcpy(*dev, st.data(), st.size() * sizeof(Stage), cudaMemcpyHostToDevice));
        return 0;
    };
    unsigned epoch = 0;
    // mode bit 0: no grid barrier, bit 1: x loaded once (diagnostics: wrong sums, right traffic);
    // big: one stage of the 32 layers' gate_up matrices as one 3 GB GEMV (the ring's steady state).
    auto ring = [&](auto kernel, int page, int np, int c, int pr, const char* name, int mode = 0, int big = 0) -> int {
        Stage* dst;
        if (make_stages(page, &dst)) return 1;
        if (big) {
            Stage x;
            CK(cudaMemcpy(&x, dst + 2, sizeof(Stage), cudaMemcpyDeviceToHost));
            x.w = w;
            x.out = 18432 * 24;
            CK(cudaMemcpy(dst, &x, sizeof(Stage), cudaMemcpyHostToDevice));
        }
        const int smem = np * page + MAXIN * 4 + MAXROWS * 4 + 2 * np * 8;
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int n = big ? 1 : layers * 4;
        CK(cudaMemsetAsync(bar, 0, 4, stream));  // on the kernels' stream: a legacy-stream memset may land mid-launch
        epoch = 0;
        auto launch = [&]() -> int {
            unsigned base = epoch;
            void* args[] = {(void*)&dst, (void*)&n, (void*)&bar, (void*)&base, (void*)&mode};
            CK(cudaLaunchCooperativeKernel((void*)kernel, sms, (c + pr) * 32, args, smem, stream));
            epoch += (unsigned)n * sms;
            return 0;
        };
        if (launch()) return 1;
        CK(cudaStreamSynchronize(stream));
        std::vector<float> ts;
        for (int r = 0; r < reps; ++r) {
            CK(cudaEventRecord(e0, stream));
            if (launch()) return 1;
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ts.push_back(t);
        }
        std::sort(ts.begin(), ts.end());
        char label[96];
        snprintf(label, sizeof label, "%s (%d B x %d pages, %d consumer + %d producer warps)", name, page, np, c, pr);
        if (big) {
            const double bgb = 18432.0 * 24 * 2560 * 2 / 1e9;
            printf("%-52s %8.3f ms  %7.0f GB/s (one %.2f GB GEMV)\n", label, ts[reps / 2], bgb / (ts[reps / 2] * 1e-3), bgb);
        } else {
            report(label, ts[reps / 2]);
        }
        CK(cudaFree(dst));
        return 0;
    };
    for (int trial = 0; trial < 1; ++trial) {
        read_all<<<sms * 8, 512, 0, stream>>>(w, total, junk);
        CK(cudaEventRecord(e0, stream));
        for (int r = 0; r < reps; ++r) read_all<<<sms * 8, 512, 0, stream>>>(w, total, junk);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        report("R read every weight once", ms / reps);
        if (ring(ring_chain<8192, 20, 10, 1, 4>, 8192, 20, 10, 4, "P ring")) return 1;
        if (ring(ring_chain<8192, 20, 10, 1, 4>, 8192, 20, 10, 4, "P ring, red.release arrival", 32)) return 1;
        if (ring(ring_chain<8192, 20, 10, 1, 4>, 8192, 20, 10, 4, "P ring")) return 1;
        if (ring(ring_chain<8192, 20, 10, 1, 4>, 8192, 20, 10, 4, "P ring, red.release arrival", 32)) return 1;
        if (ring(ring_chain<8192, 20, 10, 1, 4>, 8192, 20, 10, 4, "P ring, red.release, x once", 34)) return 1;
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
