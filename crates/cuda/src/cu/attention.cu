// Gated attention over the GPU KV cache. `start` (the position of row 0) is read from device memory so
// that a captured decode graph stays valid as the position advances.
//
// attn_prep, one block per (head of q ∪ k, row): per-head RMSNorm (q_norm / k_norm), partial rotate-half
// RoPE at position start + row (angle = f32(pos) * inv_freq[j], cos/sin taken in f64 as the CPU engine;
// a pass's later attention layers read the first one's from a table: the same values), q (and the
// output gate) to their buffers, k and v into the cache at that position.
//
// attn_split + attn_combine (split-K flash decoding). Query row r sees keys 0..len, len = start + r + 1,
// cut into chunks of att_chunk(len, s_max) keys (a multiple of 16, at least ATT_MIN_CHUNK, at most s_max
// chunks). Block (split, kv head group, r) folds one chunk for GQ query heads that share a KV head, so
// each K/V row is loaded once for the group: 4 warps take U consecutive keys at a time (U = 4, 8 for head
// dims up to 128; loads of U keys in flight), online softmax per query head (running max m, sum l,
// acc = sum exp(s - m) v), warps merged in shared memory. attn_combine merges the chunks in order:
// out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, then out *= sigmoid(gate) for gated attention.
// Batch invariance: a row's chunking depends only on its own len and s_max, and every merge runs in a
// fixed order, so a verify row equals the same row decoded alone when both use the same s_max.
#define ATT_WARPS 4
#define ATT_U 4
#define ATT_MIN_CHUNK 32
#define ATT_MAX_SPLITS 64
#define ATT_MAX_D 256
#define ATT_PER_LANE (ATT_MAX_D / 32)

__device__ __forceinline__ int att_chunk(int len, int s_max) {
    int c = (len + s_max - 1) / s_max;
    c = (c + 15) & ~15;
    return c < ATT_MIN_CHUNK ? ATT_MIN_CHUNK : c;
}

#define ATT_PREP_THREADS 128  // ops.rs attn_prep's launch
// attn_prep's RoPE cos / sin: computed (f64), computed and stored in the pass's table, or read from it.
#define ATT_ROPE_COMPUTE 0
#define ATT_ROPE_STORE 1
#define ATT_ROPE_READ 2
#define ATT_PREP_PER (ATT_MAX_D / ATT_PREP_THREADS)
extern "C" __global__ void __launch_bounds__(ATT_PREP_THREADS)
    attn_prep(const float* __restrict__ qkv, const float* __restrict__ q_norm, const float* __restrict__ k_norm,
              const float* __restrict__ inv_freq, const int* __restrict__ start_p, float* __restrict__ q_out,
              float* __restrict__ gate_out, float* __restrict__ k_cache, float* __restrict__ v_cache, int hq, int hkv,
              int d, int rot_half, int gated, float eps, int zero_centred, float* rope, int rope_mode) {
    __shared__ double scratch[32];
    __shared__ float vals[ATT_MAX_D];
    const int head = blockIdx.x, row = blockIdx.y;
    // Before the wait: what no kernel of this step writes (the position, set before the graph runs; the
    // norm weights; inv_freq): the thread's norm scales and its RoPE cos / sin (f64), off the wait's path.
    // rope_mode ATT_ROPE_READ takes cos / sin from the table instead, which this pass's first attn_prep
    // stored (ATT_ROPE_STORE) at least four kernels earlier; every kernel signals its dependents only after
    // its own PDL wait, so that launch has completed and its stores are visible here before the wait (read
    // through L2). The f64 trig was 1.5 us a layer on the 8B's critical path (4.652 against 4.706 ms
    // without it).
    const int pos = *start_p + row;
    const float* nw = head < hq ? q_norm : k_norm;
    const float fpos = (float)pos;
    float* rope_row = rope + (size_t)row * 2 * ATT_MAX_D;  // [cos (ATT_MAX_D) | sin (ATT_MAX_D)]
    float scale[ATT_PREP_PER], rc[ATT_PREP_PER], rs[ATT_PREP_PER];
#pragma unroll
    for (int k = 0; k < ATT_PREP_PER; ++k) {
        const int i = threadIdx.x + k * ATT_PREP_THREADS;
        scale[k] = i < d ? (zero_centred ? 1.0f + nw[i] : nw[i]) : 0.0f;
        rc[k] = 1.0f, rs[k] = 0.0f;
        if (i < 2 * rot_half) {
            if (rope_mode == ATT_ROPE_READ) {
                rc[k] = __ldcg(rope_row + i), rs[k] = __ldcg(rope_row + ATT_MAX_D + i);
            } else {
                const int j = i < rot_half ? i : i - rot_half;
                const float angle = fpos * inv_freq[j];
                rc[k] = (float)cos((double)angle), rs[k] = (float)sin((double)angle);
            }
        }
    }
    PDL_ENTER();
    if (rope_mode == ATT_ROPE_STORE && head == 0) {
#pragma unroll
        for (int k = 0; k < ATT_PREP_PER; ++k) {
            const int i = threadIdx.x + k * ATT_PREP_THREADS;
            if (i < 2 * rot_half) rope_row[i] = rc[k], rope_row[ATT_MAX_D + i] = rs[k];
        }
    }
    const int qw = hq * d * (gated ? 2 : 1);
    const float* rowp = qkv + (size_t)row * (qw + 2 * hkv * d);
    const float* src;
    float* dst;
    if (head < hq) {
        src = rowp + (size_t)head * d * (gated ? 2 : 1);
        dst = q_out + ((size_t)row * hq + head) * d;
        if (gated)
            for (int i = threadIdx.x; i < d; i += ATT_PREP_THREADS)
                gate_out[((size_t)row * hq + head) * d + i] = src[d + i];
    } else {
        const int kh = head - hq;
        src = rowp + qw + (size_t)kh * d;
        dst = k_cache + ((size_t)pos * hkv + kh) * d;
        const float* vsrc = rowp + qw + (size_t)hkv * d + (size_t)kh * d;
        float* vdst = v_cache + ((size_t)pos * hkv + kh) * d;
        for (int i = threadIdx.x; i < d; i += ATT_PREP_THREADS) vdst[i] = vsrc[i];
    }
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += ATT_PREP_THREADS) ss += (double)src[i] * (double)src[i];
    ss = block_sum_d(ss, scratch);
    float inv = 1.0f / sqrtf((float)(ss / (double)d) + eps);
#pragma unroll
    for (int k = 0; k < ATT_PREP_PER; ++k) {
        const int i = threadIdx.x + k * ATT_PREP_THREADS;
        if (i < d) vals[i] = (src[i] * inv) * scale[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < ATT_PREP_PER; ++k) {
        const int i = threadIdx.x + k * ATT_PREP_THREADS;
        if (i >= d) continue;
        float out = vals[i];
        if (i < 2 * rot_half) {
            if (i < rot_half) out = vals[i] * rc[k] - vals[i + rot_half] * rs[k];
            else out = vals[i] * rc[k] + vals[i - rot_half] * rs[k];
        }
        dst[i] = out;
    }
}

// PL: head dims per lane (d <= 32 PL), U: keys a warp folds per round (loads of U keys in flight).
template <int GQ, int PL, int U>
__device__ __forceinline__ void attn_split_body(const float* __restrict__ q, const float* __restrict__ k_cache,
                                                const float* __restrict__ v_cache, const int* __restrict__ start_p,
                                                float* __restrict__ part_m, float* __restrict__ part_l,
                                                float* __restrict__ part_acc, int hq, int hkv, int d, int s_max,
                                                float scale) {
    __shared__ float sm[ATT_WARPS][GQ], sl[ATT_WARPS][GQ];
    __shared__ float sacc[ATT_WARPS][GQ][ATT_MAX_D];
    const int split = blockIdx.x, row = blockIdx.z;
    const int group = hq / hkv, blocks_per_kv = group / GQ;
    const int kvh = blockIdx.y / blocks_per_kv;
    const int h0 = kvh * group + (blockIdx.y % blocks_per_kv) * GQ;
    const int len = *start_p + row + 1;  // (the position is set before the graph runs)
    const int chunk = att_chunk(len, s_max);
    const int k0 = split * chunk;
    const int k1 = min(len, k0 + chunk);
    // Before the wait, the chunk's K / V rows into L2 (128-byte lines; the cache lives in DRAM between
    // steps): the loads after the wait then find them there. attn_prep writes this pass's rows meanwhile;
    // L2 is where those writes land, so a prefetched line is never stale.
    {
        const int lines = (d * 4 + 127) / 128, per_key = 2 * lines;
        for (int e = threadIdx.x; e < (k1 - k0) * per_key; e += blockDim.x) {
            const int t = k0 + e / per_key, r = e % per_key;
            const float* base = (r < lines ? k_cache : v_cache) + ((size_t)t * hkv + kvh) * d;
            PREFETCH_L2(base + (r % lines) * 32);
        }
    }
    PDL_ENTER();
    if (k0 >= len) return;  // uniform over the block
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float qv[GQ][PL], acc[GQ][PL], m[GQ], l[GQ];
#pragma unroll
    for (int g = 0; g < GQ; ++g) {
        const float* qr = q + ((size_t)row * hq + h0 + g) * d;
#pragma unroll
        for (int j = 0; j < PL; ++j) {
            const int i = lane + 32 * j;
            qv[g][j] = i < d ? qr[i] : 0.0f;
            acc[g][j] = 0.0f;
        }
        m[g] = NEG_INF;
        l[g] = 0.0f;
    }
    for (int base = k0 + warp * U; base < k1; base += ATT_WARPS * U) {
        // [U keys][d / 32 per lane], masked keys (t >= k1) read as zeros; key `base` is always valid.
        float kr[U][PL], vr[U][PL];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int t = base + u;
            const bool ok = t < k1;
            const float* kp = k_cache + ((size_t)(ok ? t : base) * hkv + kvh) * d;
            const float* vp = v_cache + ((size_t)(ok ? t : base) * hkv + kvh) * d;
#pragma unroll
            for (int j = 0; j < PL; ++j) {
                const int i = lane + 32 * j;
                kr[u][j] = (ok && i < d) ? kp[i] : 0.0f;
                vr[u][j] = (ok && i < d) ? vp[i] : 0.0f;
            }
        }
#pragma unroll
        for (int g = 0; g < GQ; ++g) {
            float s[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < PL; ++j) dot = fmaf(qv[g][j], kr[u][j], dot);
                dot = warp_sum(dot) * scale;
                s[u] = base + u < k1 ? dot : NEG_INF;
            }
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u]);
            const float corr = expf(m[g] - mx);  // m = -inf before the first key: corr = 0
            float p[U], ps = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                p[u] = expf(s[u] - mx);  // masked keys: exp(-inf) = 0
                ps += p[u];
            }
            l[g] = l[g] * corr + ps;
#pragma unroll
            for (int j = 0; j < PL; ++j) {
                float a = acc[g][j] * corr;
#pragma unroll
                for (int u = 0; u < U; ++u) a = fmaf(p[u], vr[u][j], a);
                acc[g][j] = a;
            }
            m[g] = mx;
        }
    }
#pragma unroll
    for (int g = 0; g < GQ; ++g) {
        if (lane == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
#pragma unroll
        for (int j = 0; j < PL; ++j) {
            const int i = lane + 32 * j;
            if (i < d) sacc[warp][g][i] = acc[g][j];
        }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GQ; ++g) {
        float mx = NEG_INF;
        for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, sm[w][g]);
        const size_t slot = ((size_t)row * hq + h0 + g) * s_max + split;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float a = 0.0f;
            for (int w = 0; w < ATT_WARPS; ++w)
                if (sl[w][g] > 0.0f) a += sacc[w][g][i] * expf(sm[w][g] - mx);
            part_acc[slot * d + i] = a;
        }
        if (threadIdx.x == 0) {
            float tl = 0.0f;
            for (int w = 0; w < ATT_WARPS; ++w)
                if (sl[w][g] > 0.0f) tl += sl[w][g] * expf(sm[w][g] - mx);
            part_m[slot] = mx;
            part_l[slot] = tl;
        }
    }
}

#define ATTN_SPLIT_KERNEL(NAME, GQ, PL, U)                                                                \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                                          \
        NAME(const float* q, const float* k_cache, const float* v_cache, const int* start_p, float* part_m, \
             float* part_l, float* part_acc, int hq, int hkv, int d, int s_max, float scale) {             \
        attn_split_body<GQ, PL, U>(q, k_cache, v_cache, start_p, part_m, part_l, part_acc, hq, hkv, d,     \
                                   s_max, scale);                                                          \
    }
// Head dims up to 256: 4 keys a warp per round (a 32-key chunk in two rounds). Up to 128 (ops.rs picks
// the _d128 forms): half the registers per key, so 8 keys a warp and a 32-key chunk in one round, one
// L2 round trip fewer on the critical path (the chunk's keys fold in groups of 8, not 4: other bits, the
// same for every row count, so verify rows still equal decode rows).
ATTN_SPLIT_KERNEL(attn_split_1, 1, ATT_PER_LANE, ATT_U)
ATTN_SPLIT_KERNEL(attn_split_2, 2, ATT_PER_LANE, ATT_U)
ATTN_SPLIT_KERNEL(attn_split_4, 4, ATT_PER_LANE, ATT_U)
ATTN_SPLIT_KERNEL(attn_split_1_d128, 1, 4, 8)
ATTN_SPLIT_KERNEL(attn_split_2_d128, 2, 4, 8)
ATTN_SPLIT_KERNEL(attn_split_4_d128, 4, 4, 8)

// Merges one (row, head)'s first `used` key splits in split order, for the block: out = sum_s w_s acc_s /
// sum_s w_s l_s with w_s = e^(m_s - M) (2^(m_s - M) with EXP2: maxima kept in the log2 domain), then
// out *= sigmoid(gate) when gate is given. Partials at base + s (m, l) and (base + s) * d (acc).
template <bool EXP2>
__device__ __forceinline__ void merge_splits(const float* __restrict__ part_m, const float* __restrict__ part_l,
                                             const float* __restrict__ part_acc, size_t base, int used, int d,
                                             const float* __restrict__ gate, float* __restrict__ out) {
    __shared__ float weight[ATT_MAX_SPLITS];
    __shared__ float inv_total;
    if (threadIdx.x == 0) {
        float mx = NEG_INF;
        for (int s = 0; s < used; ++s) mx = fmaxf(mx, part_m[base + s]);
        float tl = 0.0f;
        for (int s = 0; s < used; ++s) {
            weight[s] = EXP2 ? exp2f(part_m[base + s] - mx) : expf(part_m[base + s] - mx);
            tl += part_l[base + s] * weight[s];
        }
        inv_total = 1.0f / tl;
    }
    __syncthreads();
    const float inv = inv_total;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < used; ++s) a += part_acc[(base + s) * d + i] * weight[s];
        float o = a * inv;
        if (gate) o *= sigmoid_f(gate[i]);
        out[i] = o;
    }
}

// One block per (head, row, 64 dims of the head); out [n, hq, d]. merge_splits' arithmetic in its order, the
// same bits, but the splits' maxima and weights are taken by the block's threads in parallel (thread s:
// split s) and the head's dims spread over d / 64 blocks: decode's 16 heads filled 16 SMs, each behind one
// thread's 64 serial exponentials (6.4 us isolated).
#define ATT_COMBINE_DIMS 64
static_assert(ATT_MAX_SPLITS <= ATT_COMBINE_DIMS, "one split per thread");
extern "C" __global__ void __launch_bounds__(ATT_COMBINE_DIMS)
    attn_combine(const float* __restrict__ part_m, const float* __restrict__ part_l,
                 const float* __restrict__ part_acc, const int* __restrict__ start_p, const float* __restrict__ gate,
                 float* __restrict__ out, int hq, int d, int s_max, int gated) {
    __shared__ float weight[ATT_MAX_SPLITS], lsum[ATT_MAX_SPLITS], wmax[ATT_COMBINE_DIMS / 32];
    __shared__ float inv_total;
    PDL_ENTER();
    const int head = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
    const int len = *start_p + row + 1;
    const int chunk = att_chunk(len, s_max);
    const int used = (len + chunk - 1) / chunk;
    const size_t base = ((size_t)row * hq + head) * s_max;
    // Thread s takes split s (s_max <= ATT_MAX_SPLITS = the block's 64 threads).
    const float ms = tid < used ? part_m[base + tid] : NEG_INF;
    const float ls = tid < used ? part_l[base + tid] : 0.0f;
    float mx = ms;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) wmax[tid >> 5] = mx;
    __syncthreads();
    mx = wmax[0];
#pragma unroll
    for (int w = 1; w < ATT_COMBINE_DIMS / 32; ++w) mx = fmaxf(mx, wmax[w]);
    if (tid < used) {
        weight[tid] = expf(ms - mx);
        lsum[tid] = ls;
    }
    __syncthreads();
    if (tid == 0) {
        float tl = 0.0f;
        for (int s = 0; s < used; ++s) tl += lsum[s] * weight[s];
        inv_total = 1.0f / tl;
    }
    __syncthreads();
    const int i = blockIdx.z * ATT_COMBINE_DIMS + tid;
    if (i >= d) return;
    float a = 0.0f;
    for (int s = 0; s < used; ++s) a += part_acc[(base + s) * d + i] * weight[s];
    float o = a * inv_total;
    const size_t at = ((size_t)row * hq + head) * d + i;
    if (gated) o *= sigmoid_f(gate[at]);
    out[at] = o;
}
