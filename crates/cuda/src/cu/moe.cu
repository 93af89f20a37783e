// Sparse mixture of experts (Qwen3-Next), three kernels per MoE layer after the router GEMV:
//   moe_route    logits [n, ld] (E router logits, then the shared-expert gate logit) -> per row the
//                top-k expert ids [n, k] and weights [n, k + 1] (slot k: sigmoid of the shared gate)
//   moe_gate_up  act[r, slot, :] = silu(W_e gate rows . h_r) * (W_e up rows . h_r), slot k = shared
//   moe_down     x[r, :] += sum over slots 0..k-1 of w[r, s] * (D_e . act[r, s]) + w[r, k] * (D_sh . act)
// Expert ids are read on the device (no host round trip, so decode stays capturable in a graph). Every
// output element is one warp's lane-strided dot product reduced by the xor tree, and the slot sum runs
// in a fixed order, so a row's result does not depend on how many rows are in the launch: verify rows
// equal decode rows bit for bit. Weights are streamed once per row (no grouping of rows by expert):
// fine for decode and verify blocks, slow for long prefills.
#define MOE_WARPS 8
#define MOE_MAX_EXPERTS 1024

// One warp per row. Softmax in f32 (max, exp, xor-tree sum), then k rounds of a warp argmax over the
// experts not yet taken, ties to the lower index (torch.topk); weights renormalised over the k when
// norm_topk (summed in slot order, as the CPU engine).
extern "C" __global__ void moe_route(const float* __restrict__ logits, int ld, int experts, int k,
                                     int norm_topk, int shared, int* __restrict__ ids,
                                     float* __restrict__ wts) {
    PDL_ENTER();
    __shared__ float p[MOE_MAX_EXPERTS];
    const int lane = threadIdx.x & 31, row = blockIdx.x;
    const float* lr = logits + (size_t)row * ld;
    float mx = NEG_INF;
    for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, lr[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < experts; e += 32) {
        const float v = expf(lr[e] - mx);
        p[e] = v;
        sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < experts; e += 32) p[e] = p[e] / sum;
    __syncwarp();
    int* ir = ids + (size_t)row * k;
    float* wr = wts + (size_t)row * (k + 1);
    for (int s = 0; s < k; ++s) {
        float best = -1.0f;
        int at = experts;
        for (int e = lane; e < experts; e += 32) {
            if (p[e] > best) {  // strict: within a lane the lower index wins ties
                best = p[e];
                at = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) {
                best = ob;
                at = oa;
            }
        }
        if (lane == 0) {
            ir[s] = at;
            wr[s] = best;
            p[at] = -2.0f;  // taken (probabilities are >= 0)
        }
        __syncwarp();
    }
    if (lane == 0) {
        if (norm_topk) {
            float t = 0.0f;
            for (int s = 0; s < k; ++s) t += wr[s];
            for (int s = 0; s < k; ++s) wr[s] = wr[s] / t;
        }
        wr[k] = shared ? sigmoid_f(lr[experts]) : 0.0f;
    }
}

__device__ __forceinline__ float moe_w(const bf16_t* p, int i) { return bf2f(p[i]); }
__device__ __forceinline__ float moe_w(const float* p, int i) { return p[i]; }

// Lane-strided dot of a weight row with an f32 vector, reduced over the warp (every lane gets it).
template <class W>
__device__ __forceinline__ float moe_dot(const W* __restrict__ w, const float* __restrict__ x, int n, int lane) {
    float acc = 0.0f;
    for (int c = lane; c < n; c += 32) acc += moe_w(w, c) * x[c];
    return warp_sum(acc);
}

// grid (ceil(max(I, Is) / MOE_WARPS), slots, n); warp -> one output i of one (row, slot). gate_up:
// [E, 2I, H] (gate rows then up rows per expert); sh_gate_up: [2 Is, H] (slot k, when slots = k + 1).
// act: [n, slots, ldact].
template <class W>
__device__ void moe_gate_up_body(const float* __restrict__ h, const W* __restrict__ gate_up,
                                 const W* __restrict__ sh_gate_up, const int* __restrict__ ids,
                                 float* __restrict__ act, int hidden, int inter, int sh_inter, int k,
                                 int ldact) {
    PDL_ENTER();
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    const int slot = blockIdx.y, row = blockIdx.z, slots = gridDim.y;
    const W* base;
    int width;
    if (slot < k) {
        base = gate_up + (size_t)ids[(size_t)row * k + slot] * 2 * inter * hidden;
        width = inter;
    } else {
        base = sh_gate_up;
        width = sh_inter;
    }
    if (i >= width) return;  // whole warps
    const float* hr = h + (size_t)row * hidden;
    const float g = moe_dot(base + (size_t)i * hidden, hr, hidden, lane);
    const float u = moe_dot(base + (size_t)(width + i) * hidden, hr, hidden, lane);
    if (lane == 0) act[((size_t)row * slots + slot) * ldact + i] = silu_f(g) * u;
}

// grid (ceil(H / MOE_WARPS), n); warp -> x[row, j] += the fixed-order slot sum. down: [E, H, I];
// sh_down: [H, Is].
template <class W>
__device__ void moe_down_body(const float* __restrict__ act, const W* __restrict__ down,
                              const W* __restrict__ sh_down, const int* __restrict__ ids,
                              const float* __restrict__ wts, float* __restrict__ x, int hidden, int inter,
                              int sh_inter, int k, int shared, int ldact) {
    PDL_ENTER();
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    const int row = blockIdx.y, slots = k + (shared ? 1 : 0);
    if (j >= hidden) return;  // whole warps
    const float* ar = act + (size_t)row * slots * ldact;
    const float* wr = wts + (size_t)row * (k + 1);
    float acc = 0.0f;
    for (int s = 0; s < k; ++s) {
        const W* d = down + ((size_t)ids[(size_t)row * k + s] * hidden + j) * inter;
        acc += wr[s] * moe_dot(d, ar + (size_t)s * ldact, inter, lane);
    }
    if (shared) acc += wr[k] * moe_dot(sh_down + (size_t)j * sh_inter, ar + (size_t)k * ldact, sh_inter, lane);
    if (lane == 0) x[(size_t)row * hidden + j] += acc;
}

#define MOE_KERNELS(SUFFIX, W)                                                                              \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                                             \
        moe_gate_up_##SUFFIX(const float* __restrict__ h, const W* __restrict__ gate_up,                    \
                             const W* __restrict__ sh_gate_up, const int* __restrict__ ids,                 \
                             float* __restrict__ act, int hidden, int inter, int sh_inter, int k, int ldact) { \
        moe_gate_up_body<W>(h, gate_up, sh_gate_up, ids, act, hidden, inter, sh_inter, k, ldact);          \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                                             \
        moe_down_##SUFFIX(const float* __restrict__ act, const W* __restrict__ down,                        \
                          const W* __restrict__ sh_down, const int* __restrict__ ids,                       \
                          const float* __restrict__ wts, float* __restrict__ x, int hidden, int inter,      \
                          int sh_inter, int k, int shared, int ldact) {                                      \
        moe_down_body<W>(act, down, sh_down, ids, wts, x, hidden, inter, sh_inter, k, shared, ldact);       \
    }
MOE_KERNELS(bf16, bf16_t)
MOE_KERNELS(f32, float)
