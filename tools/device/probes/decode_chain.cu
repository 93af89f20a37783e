// Probe: what would a persistent decode kernel, or other ways of overlapping consecutive GEMVs, buy over
// one kernel per GEMV (graph + PDL)? Streams the 4B-like hybrid's per-layer GEMV chain (in_proj
// 2560->12352, out 4096->2560, gate_up 2560->18432, down 9216->2560; 32 layers, 7.2 GB of bf16 weights,
// each stage's input the previous stage's output) with simplified kernels:
//   R  one kernel reading every weight once (the bandwidth ceiling),
//   A  one kernel per GEMV, captured in a CUDA graph with programmatic dependent launch (the product's
//      form; modes: input staged one float per step / with float4 loads / read via L1 / empty kernels),
//   C, D  the weights through a per-lane cp.async ring in shared memory (x staged / via L1), optionally
//      triggering the next launch first thing so two GEMVs' blocks are co-resident,
//   B  one cooperative kernel, stages separated by grid-wide barriers, optionally with the next stage's
//      first 4 or 8 weight vectors per lane loaded into registers before the barrier.
// Each line also prints the steady state of its kernel on one 6 GB GEMV. Results: tools/device/README.md.
// Build and run on the device: nvcc -O3 -arch=sm_90 -o decode_chain decode_chain.cu && ./decode_chain
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
namespace cg = cooperative_groups;

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

#define WARPS 8
#define MAXW 18432

struct Stage {
    const uint4* w;  // [out, in/8] vectors of 8 bf16
    int in, out, wpr, blocks;
};

__device__ float g_act[2][MAXW];

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float dot8(uint4 u, const float* x) {
    const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
    float s = __uint_as_float(u.x << 16) * a.x;
    s = fmaf(__uint_as_float(u.x & 0xffff0000u), a.y, s);
    s = fmaf(__uint_as_float(u.y << 16), a.z, s);
    s = fmaf(__uint_as_float(u.y & 0xffff0000u), a.w, s);
    s = fmaf(__uint_as_float(u.z << 16), b.x, s);
    s = fmaf(__uint_as_float(u.z & 0xffff0000u), b.y, s);
    s = fmaf(__uint_as_float(u.w << 16), b.z, s);
    s = fmaf(__uint_as_float(u.w & 0xffff0000u), b.w, s);
    return s;
}

__device__ __forceinline__ void stage_x(const float* xg, float* xs, int in) {
    for (int i = threadIdx.x; i < in; i += blockDim.x) xs[i] = xg[i];
    __syncthreads();
}

// First P vectors (P <= 2U) this lane reads for stage `st` in block `b` (its first row group).
template <int P, int U = 4>
__device__ __forceinline__ void preload(const Stage& st, int b, uint4* pre) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_group = WARPS / st.wpr, slot = warp / st.wpr, part = warp % st.wpr;
    const int o = b * per_group + slot, nv = st.in / 8;
    if (b >= st.blocks || o >= st.out) return;
#pragma unroll
    for (int u = 0; u < P; ++u) {
        const int v = part * 32 + lane + u * 32 * st.wpr;
        if (v < nv) pre[u] = __ldcs(st.w + (size_t)o * nv + v);
    }
}

template <int P, int U = 4>
__device__ __forceinline__ void gemv_rows(const Stage& st, const float* xs, float* y, int b0, int nb,
                                          const uint4* pre) {
    __shared__ float red[WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_group = WARPS / st.wpr, slot = warp / st.wpr, part = warp % st.wpr;
    const int groups = (st.out + per_group - 1) / per_group, nv = st.in / 8;
    int batch = 0;
    for (int g = b0; g < groups; g += nb) {
        const int o = g * per_group + slot;
        const bool valid = o < st.out;
        float acc = 0.0f;
        if (valid) {
            const uint4* wr = st.w + (size_t)o * nv;
            for (int v0 = part * 32 + lane; v0 < nv; v0 += 32 * st.wpr * U, ++batch) {
                uint4 raw[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + u * 32 * st.wpr;
                    if (v < nv) {
                        // The first P / U batches of the block's first group were loaded before the barrier.
                        if (P > 0 && pre && batch < P / U)
                            raw[u] = (P > U && batch == 1) ? pre[(P > U ? U : 0) + u] : pre[u];
                        else
                            raw[u] = __ldcs(wr + v);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + u * 32 * st.wpr;
                    if (v < nv) acc += dot8(raw[u], xs + (size_t)v * 8);
                }
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) red[warp] = acc;
        __syncthreads();
        if (part == 0 && lane == 0 && valid) {
            float t = 0.0f;
            for (int p = 0; p < st.wpr; ++p) t += red[slot * st.wpr + p];
            y[o % MAXW] = t * 1e-3f;
        }
        __syncthreads();
        batch = 1 << 20;  // preloaded vectors belong to the first group only
    }
}

__device__ int g_ctr[256];  // MODE 5: the next row group of stage s to claim, minus the grid size
__global__ void reset_ctr() { g_ctr[threadIdx.x] = 0; }

// MODE 0: x staged into shared memory one float per thread per step (today's form); 1: staged with float4
// loads; 2: not staged, the dot products read x from global memory (L1); 3: only the kernel boundary (no
// work); 4: boundary + staging only.
template <int U, int MODE = 0>
__global__ void __launch_bounds__(256, 4) gemv_kernel(Stage st, int s) {
    extern __shared__ __align__(16) float xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (MODE != 3 && MODE != 4) {
        const int per_group = WARPS / st.wpr, o = blockIdx.x * per_group + warp / st.wpr;
        const int v = (warp % st.wpr) * 32 + lane;
        if (o < st.out) asm volatile("prefetch.global.L2 [%0];" ::"l"(st.w + (size_t)o * (st.in / 8) + v));
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
    if (MODE == 3) return;
    const float* x = g_act[s & 1];
    if (MODE == 0 || MODE == 4) {
        stage_x(x, xs, st.in);
    } else if (MODE == 1 || MODE == 5) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* s4 = reinterpret_cast<float4*>(xs);
        float4 t[9];
#pragma unroll
        for (int k = 0; k < 9; ++k) {
            const int i = threadIdx.x + k * 256;
            if (i < st.in / 4) t[k] = x4[i];
        }
#pragma unroll
        for (int k = 0; k < 9; ++k) {
            const int i = threadIdx.x + k * 256;
            if (i < st.in / 4) s4[i] = t[k];
        }
        __syncthreads();
    }
    if (MODE == 4) {
        if (threadIdx.x == 0 && xs[st.in - 1] == 12345.0f) g_act[(s + 1) & 1][0] = 1.0f;
        return;
    }
    if (MODE == 5) {
        // Dynamic row groups: a block claims its next group (one atomic, issued while it streams the current
        // one) instead of taking every gridDim-th, so blocks that stream faster take more and the GEMV's
        // blocks finish together. Each row's arithmetic is the static form's.
        __shared__ int next;
        const int groups = (st.out + WARPS / st.wpr - 1) / (WARPS / st.wpr);
        int g = blockIdx.x;
        while (g < groups) {
            if (threadIdx.x == 0) next = atomicAdd(&g_ctr[s], 1) + gridDim.x;
            gemv_rows<0, U>(st, xs, g_act[(s + 1) & 1], g, groups, nullptr);  // one group (ends synced)
            g = next;
            __syncthreads();
        }
        return;
    }
    gemv_rows<0, U>(st, MODE == 2 ? x : xs, g_act[(s + 1) & 1], blockIdx.x, gridDim.x, nullptr);
}

template <int P>
__global__ void __launch_bounds__(256, 4) chain_kernel(const Stage* stages, int n) {
    extern __shared__ float xs[];
    cg::grid_group grid = cg::this_grid();
    uint4 pre[P > 0 ? P : 1];
    if (P > 0) preload<P>(stages[0], blockIdx.x, pre);
    for (int s = 0; s < n; ++s) {
        const Stage st = stages[s];
        if (blockIdx.x < st.blocks) {
            stage_x(g_act[s & 1], xs, st.in);
            gemv_rows<P>(st, xs, g_act[(s + 1) & 1], blockIdx.x, st.blocks, P > 0 ? pre : nullptr);
        }
        if (P > 0 && s + 1 < n) preload<P>(stages[s + 1], blockIdx.x, pre);
        grid.sync();
    }
}


__device__ __forceinline__ void cp_async16(void* smem, const void* g) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// C / D: each lane streams its weight vectors through its own S-slot cp.async ring in shared memory, so a
// warp keeps S vectors per lane in flight across batch and row-group boundaries (the first S issued
// before griddepcontrol.wait: weights only). STAGE_X (C): x staged into shared memory after the ring,
// else (D) read from global memory (L1). EARLY: launch_dependents first thing, so that the next GEMV's
// blocks become resident beside this one's (grid sized to fewer blocks per SM) and put their first S
// weight vectors per lane in flight during this kernel's tail.
template <int S, int EARLY, int STAGE_X = 0>
__global__ void __launch_bounds__(256, 4) gemv_ring(Stage st, int s) {
    extern __shared__ __align__(16) float smem[];
    uint4* ring = reinterpret_cast<uint4*>(smem);
    __shared__ float red[WARPS];
    if (EARLY) asm volatile("griddepcontrol.launch_dependents;" :::);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_group = WARPS / st.wpr, slot = warp / st.wpr, part = warp % st.wpr;
    const int groups = (st.out + per_group - 1) / per_group, nv = st.in / 8;
    const int J = (nv + 32 * st.wpr - 1) / (32 * st.wpr);
    const int my_groups = (int)blockIdx.x < groups ? (groups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = my_groups * J;
    uint4* my = ring + warp * 32 * S + lane;
    int ig = blockIdx.x, ij = 0, ik = 0;
    auto issue = [&]() {
        if (ik < total) {
            const int o = ig * per_group + slot, v = part * 32 + lane + ij * 32 * st.wpr;
            if (o < st.out && v < nv) cp_async16(my + (ik % S) * 32, st.w + (size_t)o * nv + v);
            if (++ij == J) { ij = 0; ig += gridDim.x; }
        }
        ++ik;
        cp_commit();
    };
    for (int k = 0; k < S; ++k) issue();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!EARLY) asm volatile("griddepcontrol.launch_dependents;" :::);
    const float* xs = g_act[s & 1];
    if (STAGE_X) {
        stage_x(xs, smem + S * WARPS * 32 * 4, st.in);
        xs = smem + S * WARPS * 32 * 4;
    }
    float acc = 0.0f;
    int g = blockIdx.x, j = 0;
    for (int k = 0; k < total; ++k) {
        cp_wait<S - 1>();
        const int o = g * per_group + slot, v = part * 32 + lane + j * 32 * st.wpr;
        if (o < st.out && v < nv) acc += dot8(my[(k % S) * 32], xs + (size_t)v * 8);
        issue();
        if (++j == J) {
            acc = warp_sum(acc);
            if (lane == 0) red[warp] = acc;
            __syncthreads();
            if (part == 0 && lane == 0 && o < st.out) {
                float t = 0.0f;
                for (int p = 0; p < st.wpr; ++p) t += red[slot * st.wpr + p];
                g_act[(s + 1) & 1][o % MAXW] = t * 1e-3f;
            }
            __syncthreads();
            acc = 0.0f;
            j = 0;
            g += gridDim.x;
        }
    }
    cp_wait<0>();
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
        unsigned b = 0x3c00u | (h >> 25);  // small positive bf16
        w[i] = make_uint4(b | (b << 16), b, b << 16, b);
    }
}

int main(int argc, char** argv) {
    const int skip_coop = argc > 1;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int shapes[4][2] = {{2560, 12352}, {4096, 2560}, {2560, 18432}, {9216, 2560}};
    const int layers = 32, per_sm = 4, target = 2 * per_sm * sms;
    size_t total = 0;
    for (auto& s : shapes) total += (size_t)s[0] * s[1] / 8;
    total *= layers;
    uint4* w;
    CK(cudaMalloc(&w, total * 16));
    fill<<<4096, 256>>>(w, total);
    std::vector<Stage> st;
    size_t off = 0;
    for (int l = 0; l < layers; ++l)
        for (auto& s : shapes) {
            Stage x;
            x.w = w + off;
            x.in = s[0];
            x.out = s[1];
            x.wpr = 1;
            while (x.wpr < 8 && (x.out * x.wpr + WARPS - 1) / WARPS < target) x.wpr *= 2;
            const int groups = (x.out + WARPS / x.wpr - 1) / (WARPS / x.wpr);
            const int rounds = (groups + per_sm * sms - 1) / (per_sm * sms);
            x.blocks = (groups + rounds - 1) / rounds;
            st.push_back(x);
            off += (size_t)s[0] * s[1] / 8;
        }
    const int n = (int)st.size();
    Stage* dst;
    CK(cudaMalloc(&dst, n * sizeof(Stage)));
    CK(cudaMemcpy(dst, st.data(), n * sizeof(Stage), cudaMemcpyHostToDevice));
    const double gb = total * 16.0 / 1e9;
    const int smem = 9216 * 4;
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 20;
    float* junk;
    CK(cudaMalloc(&junk, 64));
    auto report = [&](const char* name, float ms) {
        printf("%-44s %8.3f ms per chain  %7.0f GB/s\n", name, ms, gb / (ms * 1e-3));
    };
    for (int trial = 0; trial < 2; ++trial) {
        // R: the ceiling.
        read_all<<<sms * 8, 512, 0, stream>>>(w, total, junk);
        CK(cudaEventRecord(e0, stream));
        for (int r = 0; r < reps; ++r) read_all<<<sms * 8, 512, 0, stream>>>(w, total, junk);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        report("R read every weight once", ms / reps);
        // A / C: kernel per GEMV in a graph; grid balanced over the blocks resident per SM.
        auto graph_chain = [&](auto kernel, int ring_bytes, int pdl, const char* name, int per_sm_cap = 99, int stage_x_smem = 1, int dyn = 0) -> int {
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            if (dyn) reset_ctr<<<1, 256, 0, stream>>>();
            int occ_min = 99;
            for (int s = 0; s < n; ++s) {
                const int sm_bytes = ring_bytes + (stage_x_smem ? st[s].in * 4 : 0);
                int occ = 0;
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 256, sm_bytes));
                occ = occ < per_sm_cap ? occ : per_sm_cap;
                occ_min = occ < occ_min ? occ : occ_min;
                Stage x = st[s];
                const int groups = (x.out + WARPS / x.wpr - 1) / (WARPS / x.wpr);
                const int rounds = (groups + occ * sms - 1) / (occ * sms);
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(dyn ? (groups < occ * sms ? groups : occ * sms) : (groups + rounds - 1) / rounds);
                cfg.blockDim = dim3(256);
                cfg.dynamicSmemBytes = sm_bytes;
                cfg.stream = stream;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = pdl;
                CK(cudaLaunchKernelEx(&cfg, kernel, x, s));
            }
            CK(cudaStreamEndCapture(stream, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, stream));
            CK(cudaEventRecord(e0, stream));
            for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            char label[96];
            snprintf(label, sizeof label, "%s (occ >= %d/SM)", name, occ_min);
            report(label, t / reps);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            // One big GEMV (32 gate_up matrices as one, 3 GB): the loop's steady state.
            Stage big = st[2];
            big.w = w;
            big.out = 18432 * 64;
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 256, ring_bytes + big.in * 4));
            occ = occ < per_sm_cap ? occ : per_sm_cap;
            const int groups = (big.out + WARPS / big.wpr - 1) / (WARPS / big.wpr);
            const int rounds = (groups + occ * sms - 1) / (occ * sms);
            const int blocks = (groups + rounds - 1) / rounds;
            if (dyn) reset_ctr<<<1, 256, 0, stream>>>();
            kernel<<<blocks, 256, ring_bytes + big.in * 4, stream>>>(big, 0);
            CK(cudaEventRecord(e0, stream));
            for (int r = 0; r < 5; ++r) {
                if (dyn) reset_ctr<<<1, 256, 0, stream>>>();
                kernel<<<blocks, 256, ring_bytes + big.in * 4, stream>>>(big, 0);
            }
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&t, e0, e1));
            const double bgb = (double)big.out * big.in * 2 / 1e9;
            printf("    one %5.2f GB GEMV of this kind: %7.0f GB/s\n", bgb, bgb / (t / 5 * 1e-3));
            return 0;
        };
        if (graph_chain(gemv_kernel<4, 1>, 0, 1, "A1 kernel per GEMV, x staged with float4")) return 1;
        if (graph_chain(gemv_kernel<4, 5>, 0, 1, "A5 ... + row groups claimed dynamically", 99, 1, 1)) return 1;
        if (graph_chain(gemv_kernel<4, 1>, 0, 1, "A1 kernel per GEMV, x staged with float4")) return 1;
        if (graph_chain(gemv_kernel<4, 5>, 0, 1, "A5 ... + row groups claimed dynamically", 99, 1, 1)) return 1;
        if (skip_coop) continue;
        // B: persistent cooperative kernel.
        auto coop = [&](auto kernel, const char* name) -> int {
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 256, smem));
            const int grid = sms * (occ < per_sm ? occ : per_sm);
            int nn = n;
            void* args[] = {(void*)&dst, (void*)&nn};
            CK(cudaLaunchCooperativeKernel((void*)kernel, grid, 256, args, smem, stream));
            CK(cudaEventRecord(e0, stream));
            for (int r = 0; r < reps; ++r) CK(cudaLaunchCooperativeKernel((void*)kernel, grid, 256, args, smem, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            char label[96];
            snprintf(label, sizeof label, "%s (occ %d/SM)", name, occ);
            report(label, t / reps);
            return 0;
        };
        if (coop(chain_kernel<0>, "B persistent, grid barriers")) return 1;
        if (coop(chain_kernel<4>, "B4 + 4 vectors/lane before barrier")) return 1;
        if (coop(chain_kernel<8>, "B8 + 8 vectors/lane before barrier")) return 1;

    }
    CK(cudaDeviceSynchronize());
    return 0;
}
