// Probe: the decode step's GEMV chain through the real tensor-core kernels (linear_mma.cu, included from
// the directory given with -I; the same shapes as gemv_chain.cu: 32 layers of normed in_proj 2560->12352,
// out 4096->2560 (+=), normed SwiGLU gate_up 2560->18432, down 9216->2560 (+=), one row), variants and
// grids chosen as mma.rs chooses them, in a CUDA graph with programmatic dependent launch.
//   stage 1: each block splits (and normalises) the input row itself (the product's one-row decode);
//   stage 2: the fragments come precomputed from global memory (no prologue; the norm dropped).
//   nvcc -O3 -arch=sm_90 -I<dir with common.cuh, linear.cu, linear_mma.cu> -o mma_chain mma_chain.cu
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#include "common.cuh"
#include "linear.cu"
#include "linear_mma.cu"

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

__global__ void fill_words(unsigned* w, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u;
        unsigned b = 0x3c00u | (h >> 25);
        w[i] = b | (((h >> 7) & 1u) << 15) | ((b ^ 0x8000u) << 16);
    }
}
__global__ void fill_f(float* p, int n, float v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v * (1 + (i % 7));
}

typedef void (*MmaKernel)(const bf16_t*, const float*, float*, int, int, int, int, int, int, const float*, float,
                          int, int);

struct L {
    int in, out, acc, swiglu, norm;
    int x, y;  // 0 resid, 1 a, 2 act
};

int main(int argc, char** argv) {
    const int stage_mode = argc > 1 ? atoi(argv[1]) : 1;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const L shapes[4] = {{2560, 12352, 0, 0, 1, 0, 1}, {4096, 2560, 1, 0, 0, 1, 0}, {2560, 18432, 0, 1, 1, 0, 2},
                         {9216, 2560, 1, 0, 0, 2, 0}};
    const int layers = 32;
    size_t per_layer = 0;
    for (auto& s : shapes) per_layer += (size_t)s.in * s.out;
    const size_t total = per_layer * layers;
    bf16_t* w;
    CK(cudaMalloc(&w, total * 2));
    fill_words<<<4096, 256>>>((unsigned*)w, total / 2);
    float *bufs[3], *nw;
    unsigned* frags;
    for (int i = 0; i < 3; ++i) CK(cudaMalloc(&bufs[i], 18432 * 4));
    CK(cudaMalloc(&nw, 2560 * 4));
    CK(cudaMalloc(&frags, 9216 / 8 * 12 * 4));
    fill_words<<<64, 256>>>(frags, 9216 / 8 * 12);
    fill_f<<<16, 256>>>(nw, 2560, 0.01f);
    for (int i = 0; i < 3; ++i) fill_f<<<16, 256>>>(bufs[i], 18432, 0.001f);
    MmaKernel ks[3] = {linear_mma_t2_u4_b3_half, linear_mma_t4_u2_b3_half, linear_mma_t1_u8_b3_half};
    for (auto k : ks) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    size_t off = 0;
    for (int l = 0; l < layers; ++l)
        for (const L& s : shapes) {
            // mma.rs: mma_variant, units, mma_wpk, blocks.
            int tiles;
            MmaKernel k;
            if (s.swiglu) tiles = 2, k = ks[0];
            else if ((s.out + 31) / 32 >= 2 * sms) tiles = 4, k = ks[1];
            else if (s.in >= 8192) tiles = 1, k = ks[2];
            else tiles = 2, k = ks[0];
            const int inter = s.swiglu ? s.out / 2 : 0;
            const int units = s.swiglu ? (inter + 4 * tiles - 1) / (4 * tiles) : (s.out + 8 * tiles - 1) / (8 * tiles);
            int wpk = 1;
            while (wpk < 8 && units * wpk < 32 * sms) wpk *= 2;
            const int blocks = (units + 8 / wpk - 1) / (8 / wpk);
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(256);
            cfg.dynamicSmemBytes = stage_mode == 1 ? s.in * 6 : 0;
            cfg.stream = stream;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            const float* x = stage_mode == 1 ? bufs[s.x] : (const float*)frags;
            const float* norm = stage_mode == 1 && s.norm ? nw : nullptr;
            CK(cudaLaunchKernelEx(&cfg, k, (const bf16_t*)(w + off), x, bufs[s.y], 1, s.in, s.out, s.acc, wpk, inter,
                                  norm, 1e-6f, 1, stage_mode));
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
        printf("tensor-core GEMV chain (stage %d): %.3f ms per chain of %d GEMVs, %.0f GB/s\n", stage_mode, ms / 20,
               4 * layers, gb / (ms / 20 * 1e-3));
    }
    return 0;
}
