// Row-wise and element-wise kernels: embedding gather, RMSNorm (plain / zero-centred), the gated
// DeltaNet output norm, SwiGLU's silu(gate) * up, and the random fill used by synthetic benchmarks.

// x[r, :] = embed[ids[r], :] (bf16 or f32 table -> f32). Ids were range-checked on the host.
extern "C" __global__ void embed_bf16(const bf16_t* __restrict__ table, const int* __restrict__ ids,
                                      float* __restrict__ x, int hidden) {
    PDL_ENTER();
    const bf16_t* src = table + (size_t)ids[blockIdx.x] * hidden;
    float* dst = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = bf2f(src[i]);
}
extern "C" __global__ void embed_f32(const float* __restrict__ table, const int* __restrict__ ids,
                                     float* __restrict__ x, int hidden) {
    PDL_ENTER();
    const float* src = table + (size_t)ids[blockIdx.x] * hidden;
    float* dst = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// One block of NORM_THREADS per row: y = (x * rms_inv(x)) * (zero_centred ? 1 + w : w), sum of squares
// in f64, the rest in f32 in torch's order (as crates/kernels/src/norm.rs).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int width,
            float eps, int zero_centred) {
    PDL_ENTER();
    __shared__ double scratch[32];
    const float* xr = x + (size_t)blockIdx.x * width;
    float* yr = y + (size_t)blockIdx.x * width;
    const float inv = rms_inv(xr, width, eps, scratch);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float scale = zero_centred ? 1.0f + w[i] : w[i];
        yr[i] = (xr[i] * inv) * scale;
    }
}

// Gated DeltaNet output norm of one (row, value head) by one warp: o <- (rmsnorm(o) * w) * (z * sigmoid(z)),
// f64 sum of squares over the lanes then the xor tree. gdn_rec's epilogues and gated_rmsnorm all call
// it, so the result does not depend on which of them ran. L2: o and z read at L2 (written by other
// blocks of the same launch).
template <bool L2 = false>
__device__ __forceinline__ void gated_norm_warp(float* __restrict__ o, const float* __restrict__ z,
                                                const float* __restrict__ w, float eps, int dv, int lane) {
    auto ld = [](const float* p) { return L2 ? __ldcg(p) : *p; };
    double ss = 0.0;
    for (int i = lane; i < dv; i += 32) ss += (double)ld(o + i) * (double)ld(o + i);
    ss = warp_sum_d(ss);
    const float inv = 1.0f / sqrtf((float)(ss / (double)dv) + eps);
    for (int i = lane; i < dv; i += 32) {
        const float zz = ld(z + i);
        o[i] = ((ld(o + i) * inv) * w[i]) * (zz * sigmoid_f(zz));
    }
}

// o: [n, hv, dv]; z: rows of the fused projection (stride ldz), head h at z[h * dv]. One warp per
// (row, head), 8 per block.
extern "C" __global__ void gated_rmsnorm(float* __restrict__ o, const float* __restrict__ z, int ldz,
                                         const float* __restrict__ w, float eps, int n, int hv, int dv) {
    PDL_ENTER();
    const int idx = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (idx >= n * hv) return;  // whole warps
    const int row = idx / hv, head = idx % hv;
    gated_norm_warp(o + (size_t)idx * dv, z + (size_t)row * ldz + (size_t)head * dv, w, eps, dv,
                    threadIdx.x & 31);
}

// SwiGLU: gate_up [n, 2I] (gate rows first, then up, per row) -> act [n, I] = silu(gate) * up.
extern "C" __global__ void silu_mul(const float* __restrict__ gate_up, float* __restrict__ act, int inter,
                                    long long count) {
    PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < count; i += stride) {
        long long r = i / inter, c = i % inter;
        const float* g = gate_up + r * 2 * inter;
        act[i] = silu_f(g[c]) * g[inter + c];
    }
}

// DFlash block attention (crates/cuda/src/dflash.rs): b query rows [b, hq, d] attending without a
// causal mask are one row of b * hq heads grouped by kv head, head (kvh * b + r) * group + j; this moves
// rows into that order (inverse = 0) or back (inverse = 1). Pure copies: the same bits.
extern "C" __global__ void dflash_regroup(const float* __restrict__ src, float* __restrict__ dst, int b,
                                          int hq, int hkv, int d, int inverse) {
    PDL_ENTER();
    const int group = hq / hkv;
    const long long count = (long long)b * hq * d;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const int e = (int)(i % d), rh = (int)(i / d), r = rh / hq, h = rh % hq;
        const long long grouped = ((long long)((h / group) * b + r) * group + h % group) * d + e;
        if (inverse)
            dst[i] = src[grouped];
        else
            dst[grouped] = src[i];
    }
}

// Deterministic pseudo-random bf16 fill (SplitMix64 hash of seed and index; Irwin-Hall sum of 4
// uniforms rescaled to unit variance, times std): synthetic benchmark weights, written on the GPU.
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
extern "C" __global__ void fill_normal_bf16(bf16_t* __restrict__ p, long long count, unsigned long long seed,
                                            float std) {
    PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < count; i += stride) {
        unsigned long long h = splitmix64(seed ^ ((unsigned long long)i * 0xD1B54A32D192ED03ull));
        float s = 0.0f;
        for (int k = 0; k < 4; ++k) s += ((float)((h >> (16 * k)) & 0xffffu) + 0.5f) * (1.0f / 65536.0f);
        p[i] = f2bf((s - 2.0f) * 1.7320508f * std);
    }
}

// A read-only stream over `n` 16-byte vectors (profile.rs read_bandwidth, the table's read ceiling): each
// thread keeps four streaming loads in flight per step and folds them into one word, stored only if it
// equals a value random data hardly gives, so the loads are not removed and nothing is written.
extern "C" __global__ void __launch_bounds__(512) read_stream(const uint4* __restrict__ src, long long n,
                                                             unsigned* __restrict__ sink) {
    PDL_ENTER();
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = __ldcs(src + i + k * stride);
#pragma unroll
        for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}

// The greedy token of each logits row without the row leaving the device (argmax.rs): out[2r] = the lowest
// index of the row's largest value, NaN skipped (kernels::argmax's rule); out[2r + 1] = 1 when the host
// would refuse the row (a NaN or +inf, or nothing but -inf: sampling's check_logits), so that the caller
// copies it and lets the host say what is wrong. One block of ARGMAX_THREADS per row; within a thread the
// indices rise, so a strict `>` keeps the first of equal values and the merges break ties by index.
#define ARGMAX_THREADS 1024
__device__ __forceinline__ void argmax_take(float v, int i, float& best, int& bi) {
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_rows(const float* __restrict__ logits, int vocab, int* __restrict__ out, int* __restrict__ next_id,
                int* __restrict__ next_start, int* __restrict__ host_pair, int* __restrict__ counter) {
    PDL_ENTER();
    __shared__ float sv[32];
    __shared__ int si[32], sbad[32];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float best = NEG_INF;
    int bi = 0x7fffffff, bad = 0;
    auto see = [&](float v, int i) {
        const unsigned u = __float_as_uint(v);
        bad |= (u & 0x7fffffffu) > 0x7f800000u || u == 0x7f800000u;  // NaN or +inf
        if (v > best) {
            best = v;
            bi = i;
        }
    };
    if ((vocab & 3) == 0 && ((unsigned long long)row & 15) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
        for (int j = threadIdx.x; j < (vocab >> 2); j += blockDim.x) {
            const float4 v = r4[j];
            see(v.x, 4 * j);
            see(v.y, 4 * j + 1);
            see(v.z, 4 * j + 2);
            see(v.w, 4 * j + 3);
        }
    } else {
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) see(row[i], i);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
        argmax_take(ov, oi, best, bi);
    }
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        sv[warp] = best;
        si[warp] = bi;
        sbad[warp] = bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            argmax_take(sv[w], si[w], best, bi);
            bad |= sbad[w];
        }
        const bool none = bi == 0x7fffffff;  // nothing above -inf
        out[2 * blockIdx.x] = none ? 0 : bi;
        out[2 * blockIdx.x + 1] = bad || none;
        // A chained decode step's input for the next one, and its pair in mapped host memory (argmax.rs
        // launch_feeding; one row): the host reads it after the step's event, which orders it.
        if (next_id) {
            // With a counter, pair c of host_pair, c counted up (the MTP head's draft steps, mtp.rs).
            const int c = counter ? counter[0] : 0;
            next_id[0] = none ? 0 : bi;
            next_start[0] += 1;
            host_pair[2 * c] = none ? 0 : bi;
            host_pair[2 * c + 1] = bad || none;
            if (counter) counter[0] = c + 1;
        }
    }
}

// Sampling candidates of logits rows (candidates.rs): every logit whose key in the total order (sampling's
// f32_key: -NaN < -inf < ... < -0 < +0 < ... < +inf < NaN) is at least the row's K-th largest key, so a
// top-k request (k <= K) is shaped from them on the host as from the whole row (sampling's
// ShapedDistribution::from_candidates). The K-th largest key by radix selection, 8 bits a pass from the top
// (a pass counts the digits of the keys that match the prefix chosen so far; lanes of a warp holding the
// same digit add once, __match_any_sync, as logits crowd into a few exponents), then one pass collects.
// One block of TOPK_THREADS per row. ids / vals [rows, cap] in no particular order (the host sorts them);
// meta [rows, 2] = [candidates, flags]: bit 0 a NaN or +inf in the row, bit 1 more than cap candidates
// (only cap of them stored). Either flag sends the host back to the row.
#define TOPK_THREADS 1024
__device__ __forceinline__ unsigned topk_key(float x) {
    const unsigned b = __float_as_uint(x);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    topk_candidates(const float* __restrict__ logits, int vocab, int K, int cap, int* __restrict__ ids,
                    float* __restrict__ vals, int* __restrict__ meta) {
    PDL_ENTER();
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_left;
    __shared__ int s_count, s_bad;
    const float* row = logits + (size_t)blockIdx.x * vocab;
    const int tid = threadIdx.x, lane = tid & 31;
    // Every lane runs every round (a shuffle needs the whole warp), past the row's end as `ok` false.
    const int rounds = (vocab + (int)blockDim.x - 1) / (int)blockDim.x;
    if (tid == 0) {
        s_prefix = 0;
        s_left = (unsigned)min(K, vocab);
        s_count = 0;
        s_bad = 0;
    }
    unsigned mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const unsigned prefix = s_prefix;
        int bad = 0;
        for (int r = 0; r < rounds; ++r) {
            const int i = r * (int)blockDim.x + tid;
            const bool ok = i < vocab;
            const float v = ok ? row[i] : 0.0f;
            const unsigned key = topk_key(v), u = __float_as_uint(v) & 0x7fffffffu;
            if (shift == 24 && ok && u >= 0x7f800000u && (u > 0x7f800000u || v > 0.0f)) bad = 1;  // NaN or +inf
            const bool in = ok && (key & mask) == prefix;
            const int digit = in ? (int)((key >> shift) & 255u) : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, digit);
            if (in && (peers & ((1u << lane) - 1u)) == 0u) atomicAdd(&hist[digit], (unsigned)__popc(peers));
        }
        if (bad) atomicAdd(&s_bad, 1);
        __syncthreads();
        if (tid == 0) {
            // The digit holding the K-th largest among the keys with this prefix (from the top).
            unsigned above = 0, left = s_left;
            int d = 255;
            for (; d > 0; --d) {
                if (above + hist[d] >= left) break;
                above += hist[d];
            }
            s_prefix = prefix | ((unsigned)d << shift);
            s_left = left - above;
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    const unsigned kth = s_prefix;
    for (int r = 0; r < rounds; ++r) {
        const int i = r * (int)blockDim.x + tid;
        if (i < vocab) {
            const float v = row[i];
            if (topk_key(v) >= kth) {
                const int slot = atomicAdd(&s_count, 1);
                if (slot < cap) {
                    ids[(size_t)blockIdx.x * cap + slot] = i;
                    vals[(size_t)blockIdx.x * cap + slot] = v;
                }
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        meta[2 * blockIdx.x] = s_count;
        meta[2 * blockIdx.x + 1] = (s_bad ? 1 : 0) | (s_count > cap ? 2 : 0);
    }
}
