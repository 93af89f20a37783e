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
// copies it and lets the host say what is wrong. Within a thread the indices rise, so a strict `>` keeps the
// first of equal values, and the merges break ties by index.
__device__ __forceinline__ void argmax_take(float v, int i, float& best, int& bi) {
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}
// argmax_parts: each block takes a chunk of a row ([part, row] grid, ARGMAX_PART_THREADS threads) and leaves
// its [best value's bits, its index, flags] in parts [rows, nparts, 3]; argmax_rows (one warp a row) merges a
// row's parts in order. The first form, one block of 1024 threads reading the whole row, took 24-27 us of each
// greedy 4B step (ncu): latency-bound.
#define ARGMAX_PART_THREADS 256
__device__ __forceinline__ void argmax_see(float v, int i, float& best, int& bi, int& bad) {
    const unsigned u = __float_as_uint(v);
    bad |= (u & 0x7fffffffu) > 0x7f800000u || u == 0x7f800000u;  // NaN or +inf
    if (v > best) {
        best = v;
        bi = i;
    }
}
extern "C" __global__ void __launch_bounds__(ARGMAX_PART_THREADS)
    argmax_parts(const float* __restrict__ logits, int vocab, int chunk, int* __restrict__ parts) {
    PDL_ENTER();
    __shared__ float sv[ARGMAX_PART_THREADS / 32];
    __shared__ int si[ARGMAX_PART_THREADS / 32], sbad[ARGMAX_PART_THREADS / 32];
    const int part = blockIdx.x, row = blockIdx.y, base = part * chunk;
    const int n = max(0, min(chunk, vocab - base));
    const float* x = logits + (size_t)row * vocab + base;
    float best = NEG_INF;
    int bi = 0x7fffffff, bad = 0;
    if (((n | base | vocab) & 3) == 0 && ((unsigned long long)x & 15) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
        for (int j = threadIdx.x; j < (n >> 2); j += blockDim.x) {
            const float4 v = x4[j];
            argmax_see(v.x, base + 4 * j, best, bi, bad);
            argmax_see(v.y, base + 4 * j + 1, best, bi, bad);
            argmax_see(v.z, base + 4 * j + 2, best, bi, bad);
            argmax_see(v.w, base + 4 * j + 3, best, bi, bad);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) argmax_see(x[i], base + i, best, bi, bad);
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
        int* o = parts + ((size_t)row * gridDim.x + part) * 3;
        o[0] = __float_as_int(best);
        o[1] = bi;
        o[2] = bad;
    }
}
extern "C" __global__ void __launch_bounds__(32)
    argmax_rows(const int* __restrict__ parts, int nparts, int* __restrict__ out, int* __restrict__ next_id,
                int* __restrict__ next_start, int* __restrict__ host_pair, int* __restrict__ counter) {
    PDL_ENTER();
    const int* pr = parts + (size_t)blockIdx.x * nparts * 3;
    float best = NEG_INF;
    int bi = 0x7fffffff, bad = 0;
    // Lane l takes parts l, l + 32, ...: indices rise within a lane, and the merge breaks ties by index.
    for (int p = threadIdx.x; p < nparts; p += 32) {
        argmax_take(__int_as_float(__ldcg(pr + 3 * p)), __ldcg(pr + 3 * p + 1), best, bi);
        bad |= __ldcg(pr + 3 * p + 2);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
        argmax_take(ov, oi, best, bi);
    }
    if (threadIdx.x == 0) {
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
// ShapedDistribution::from_candidates). Two kernels: topk_parts selects, per chunk of logits held in shared
// memory (2048 to TOPK_CHUNK: the smallest whose sets fit the merge, candidates.rs), the keys at or above the chunk's K-th largest (a chunk's set holds every row candidate
// inside it: fewer than K of the row's keys exceed a candidate); topk_merge selects the row's set from the
// union of its chunks'. The K-th largest by radix selection, 8 bits a pass from the top (a pass counts the
// digits of the keys that match the prefix chosen so far). The first form, one block scanning the row from
// L2 five times, took 294 us a 151936-logit row (latency-bound), 0.28 ms of a 2.59 ms sampled step;
// 19 chunks of 8192 and a merge, 56 + 43 us.
// ids / vals [rows, cap] in no particular order (the host sorts them); meta [rows, 2] = [candidates, flags]:
// bit 0 a NaN or +inf in the row, bit 1 more candidates than a buffer holds (only some stored), or fewer than K
// logits above -inf. Either flag sends the host back to the row.
#define TOPK_PART_THREADS 1024
#define TOPK_CHUNK 8192  // the largest chunk (shared memory); a launch's `chunk` (candidates.rs) may be smaller
#define TOPK_MERGE_THREADS 1024
#define TOPK_MERGE_MAX 10240
#define TOPK_MAX_PARTS 128
__device__ __forceinline__ unsigned topk_key(float x) {
    const unsigned b = __float_as_uint(x);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float topk_value(unsigned k) {
    return __uint_as_float((k >> 31) ? (k & 0x7fffffffu) : ~k);
}
// The K-th largest of keys[0..n) (shared memory), K <= n: radix selection over hist[256] (shared). Whole warps
// (blockDim a multiple of 32). A warp's lanes with the same digit count it with one shared atomic (the top
// digits of a row of logits are mostly equal: one address 32 times a warp otherwise), and warp 0 finds the digit
// holding the K-th largest by a scan over its lanes' 8 bins each (thread 0 walking the 256 bins took ~1 us a pass).
__device__ unsigned topk_select(const unsigned* keys, int n, int K, unsigned* hist, unsigned* s_prefix,
                                unsigned* s_left) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        *s_prefix = 0;
        *s_left = (unsigned)K;
    }
    unsigned mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const unsigned prefix = *s_prefix;
        for (int i = threadIdx.x; i - lane < n; i += blockDim.x) {  // the warp's trip count: whole warps
            const unsigned key = i < n ? keys[i] : 0u;
            const bool counted = i < n && (key & mask) == prefix;
            const unsigned digit = counted ? (key >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, digit);
            if (counted && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l holds bins 255 - 8 l .. 248 - 8 l (from the top); the digit is the first d from 255 down
            // with (keys above d's bin) + hist[d] >= left, or 0.
            unsigned c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += (c[j] = hist[255 - 8 * lane - j]);
            unsigned incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            const unsigned left = *s_left;
            const unsigned reached = __ballot_sync(0xffffffffu, incl >= left);
            const int first = reached ? __ffs(reached) - 1 : 31;
            if (lane == first) {
                unsigned above = incl - sum;
                int d = 255 - 8 * lane;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (d == 0 || above + c[j] >= left) break;
                    above += c[j];
                    --d;
                }
                *s_prefix = prefix | ((unsigned)d << shift);
                *s_left = left - above;
            }
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    return *s_prefix;
}
// Grid (parts, rows), chunks of `chunk` logits. part_ids / part_vals [rows, parts, capb]; part_meta [rows, parts, 2]
// as meta.
extern "C" __global__ void __launch_bounds__(TOPK_PART_THREADS)
    topk_parts(const float* __restrict__ logits, int vocab, int chunk, int K, int capb, int* __restrict__ part_ids,
               float* __restrict__ part_vals, int* __restrict__ part_meta) {
    PDL_ENTER();
    __shared__ unsigned keys[TOPK_CHUNK];
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_left;
    __shared__ int s_count, s_bad;
    const int part = blockIdx.x, parts = gridDim.x, row = blockIdx.y;
    const int base = part * chunk, n = min(chunk, vocab - base);
    const float* x = logits + (size_t)row * vocab + base;
    if (threadIdx.x == 0) {
        s_count = 0;
        s_bad = 0;
    }
    int bad = 0;
    for (int i0 = threadIdx.x; i0 < n; i0 += 4 * blockDim.x) {
        float v[4];  // four loads in flight before the stores
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = i0 + q * blockDim.x;
            v[q] = i < n ? __ldcg(x + i) : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = i0 + q * blockDim.x;
            if (i < n) {
                const unsigned u = __float_as_uint(v[q]) & 0x7fffffffu;
                if (u > 0x7f800000u || (u == 0x7f800000u && v[q] > 0.0f)) bad = 1;  // NaN or +inf
                keys[i] = topk_key(v[q]);
            }
        }
    }
    __syncthreads();
    if (bad) atomicAdd(&s_bad, 1);
    const unsigned kth = topk_select(keys, n, min(K, n), hist, &s_prefix, &s_left);
    const size_t at = ((size_t)row * parts + part) * capb;
    // -inf (masked) logits stay out: a chunk of them would overflow, and they are candidates only when
    // the row has fewer than K other values (the merge then sends the host back to the row).
    const unsigned neg_inf = topk_key(-__uint_as_float(0x7f800000u));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (keys[i] >= kth && keys[i] > neg_inf) {
            const int slot = atomicAdd(&s_count, 1);
            if (slot < capb) {
                part_ids[at + slot] = base + i;
                part_vals[at + slot] = topk_value(keys[i]);
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const size_t m = ((size_t)row * parts + part) * 2;
        part_meta[m] = s_count;
        part_meta[m + 1] = (s_bad ? 1 : 0) | (s_count > capb ? 2 : 0);
    }
}
// Grid rows: the row's candidates from its parts' (topk_parts, `parts` of them). Warp 0 lays the parts' sets out
// (a scan over 4 parts a lane), then a warp per part moves them in and out (a loop over the parts in one thread
// took most of the first form's 43 us: one dependent global load after another).
extern "C" __global__ void __launch_bounds__(TOPK_MERGE_THREADS)
    topk_merge(const int* __restrict__ part_ids, const float* __restrict__ part_vals,
               const int* __restrict__ part_meta, int parts, int capb, int K, int cap, int* __restrict__ ids,
               float* __restrict__ vals, int* __restrict__ meta) {
    PDL_ENTER();
    __shared__ unsigned keys[TOPK_MERGE_MAX];
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_left;
    __shared__ int s_offset[TOPK_MAX_PARTS + 1], s_flags, s_count;
    const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int* pm = part_meta + (size_t)row * parts * 2;
    if (warp == 0) {
        int cnt[4], sum = 0, flags = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int p = 4 * lane + q;
            cnt[q] = p < parts ? min(pm[2 * p], capb) : 0;
            flags |= p < parts ? pm[2 * p + 1] : 0;
            sum += cnt[q];
        }
        int incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) flags |= __shfl_xor_sync(0xffffffffu, flags, o);
        int at = incl - sum;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int p = 4 * lane + q;
            if (p < parts) s_offset[p] = at;
            at += cnt[q];
        }
        const int total = __shfl_sync(0xffffffffu, incl, 31);
        if (lane == 0) {
            if (parts > TOPK_MAX_PARTS || total > TOPK_MERGE_MAX || total < K) flags |= 2;
            s_offset[min(parts, TOPK_MAX_PARTS)] = total;
            s_flags = flags;
            s_count = 0;
        }
    }
    __syncthreads();
    if (s_flags) {
        if (threadIdx.x == 0) {
            meta[2 * row] = 0;
            meta[2 * row + 1] = s_flags;
        }
        return;
    }
    const int total = s_offset[parts];
    const size_t at = (size_t)row * parts * capb;
    for (int p = warp; p < parts; p += warps)
        for (int i = lane; i < s_offset[p + 1] - s_offset[p]; i += 32)
            keys[s_offset[p] + i] = topk_key(__ldcg(part_vals + at + (size_t)p * capb + i));
    __syncthreads();
    const unsigned kth = topk_select(keys, total, min(K, total), hist, &s_prefix, &s_left);
    for (int p = warp; p < parts; p += warps)
        for (int i = lane; i < s_offset[p + 1] - s_offset[p]; i += 32) {
            if (keys[s_offset[p] + i] >= kth) {
                const int slot = atomicAdd(&s_count, 1);
                if (slot < cap) {
                    ids[(size_t)row * cap + slot] = __ldcg(part_ids + at + (size_t)p * capb + i);
                    vals[(size_t)row * cap + slot] = topk_value(keys[s_offset[p] + i]);
                }
            }
        }
    __syncthreads();
    if (threadIdx.x == 0) {
        meta[2 * row] = s_count;
        meta[2 * row + 1] = s_count > cap ? 2 : 0;
    }
}
