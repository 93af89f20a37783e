// Probe: the decode step's GEMV chain through the real kernels (linear.cu, included from the directory
// given with -I), 32 layers of the 4B-like hybrid's GDN layer shapes: normed in_proj 2560->12352, out
// 4096->2560 (+=), normed SwiGLU gate_up 2560->18432, down 9216->2560 (+=), one row, in a CUDA graph
// with programmatic dependent launch, grids as ops.rs sizes them. Prints ms per chain and GB/s.
//   nvcc -O3 -arch=sm_90 -I<dir with common.cuh, linear.cu> -o gemv_chain gemv_chain.cu
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#include "common.cuh"
#include "linear.cu"

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

__global__ void fill(unsigned* w, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u;
        unsigned b = 0x3c00u | (h >> 25);
        w[i] = b | (((h >> 7) & 1u) << 15) | ((b ^ 0x8000u) << 16);
    }
}
__global__ void fill_f(float* p, int n, float v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v * (1 + (i % 7));
}

struct L {
    int in, out, acc, swiglu, norm, stage;
    int x, y;  // 0 resid, 1 a, 2 act
};

int main(int argc, char** argv) {
    const int stage_plain = argc > 1 ? atoi(argv[1]) : 0;
    const int balance_plain = argc > 2 ? atoi(argv[2]) : 0;  // grid-stride grid for unstaged launches too
    const int per_sm = argc > 3 ? atoi(argv[3]) : 4;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const L shapes[4] = {{2560, 12352, 0, 0, 1, 1, 0, 1},
                         {4096, 2560, 1, 0, 0, stage_plain, 1, 0},
                         {2560, 18432, 0, 1, 1, 1, 0, 2},
                         {9216, 2560, 1, 0, 0, stage_plain, 2, 0}};
    const int layers = 32;
    size_t per_layer = 0;
    for (auto& s : shapes) per_layer += (size_t)s.in * s.out;
    const size_t total = per_layer * layers;  // bf16 elements
    bf16_t* w;
    CK(cudaMalloc(&w, total * 2));
    fill<<<4096, 256>>>((unsigned*)w, total / 2);
    float *bufs[3], *nw;
    for (int i = 0; i < 3; ++i) CK(cudaMalloc(&bufs[i], 18432 * 4));
    CK(cudaMalloc(&nw, 2560 * 4));
    fill_f<<<16, 256>>>(nw, 2560, 0.01f);
    for (int i = 0; i < 3; ++i) fill_f<<<16, 256>>>(bufs[i], 18432, 0.001f);
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaFuncSetAttribute(linear_bf16_1, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    size_t off = 0;
    for (int l = 0; l < layers; ++l)
        for (const L& s : shapes) {
            const int target = 2 * 4 * sms, cap = s.swiglu ? 4 : 8;
            int wpr = 1;
            while (wpr < cap && (s.out * wpr + 7) / 8 < target) wpr *= 2;
            const int per_group = 8 / wpr, inter = s.swiglu ? s.out / 2 : 0;
            const int groups = s.swiglu ? (inter + per_group / 2 - 1) / (per_group / 2) : (s.out + per_group - 1) / per_group;
            const int stage = s.stage && s.in * 4 <= 40 * 1024;
            int blocks = groups;
            if (stage || balance_plain) {
                const int rounds = (groups + per_sm * sms - 1) / (per_sm * sms);
                blocks = (groups + rounds - 1) / rounds;
            }
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(256);
            cfg.dynamicSmemBytes = stage ? s.in * 4 : 0;
            cfg.stream = stream;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, linear_bf16_1, (const bf16_t*)(w + off), (const float*)bufs[s.x], bufs[s.y],
                                  s.in, s.out, s.acc, wpr, inter, (const float*)(s.norm ? nw : nullptr), 1e-6f, 1,
                                  stage));
            off += (size_t)s.in * s.out;
        }
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const double gb = total * 2.0 / 1e9;
    for (int trial = 0; trial < 3; ++trial) {
        CK(cudaGraphLaunch(ge, stream));
        CK(cudaEventRecord(e0, stream));
        for (int r = 0; r < 20; ++r) CK(cudaGraphLaunch(ge, stream));
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("real GEMV chain (stage_plain=%d balance_plain=%d per_sm=%d): %.3f ms per chain of %d GEMVs, %.0f GB/s\n", stage_plain, balance_plain, per_sm, ms / 20,
               4 * layers, gb / (ms / 20 * 1e-3));
    }
    return 0;
}
