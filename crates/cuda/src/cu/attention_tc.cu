// Causal attention of prefill passes (more rows than gemv_max_rows) on the tensor cores, FlashAttention-2
// style: after attn_prep has written q and this pass's keys/values into the f32 KV cache, row r of the
// pass (position start + r) attends to keys 0..start+r, earlier passes' keys included.
//
// attn_tc_<D>: a block is 4 warps over one KV head: GQ query heads of that head's group (GQ = 4, 2 or 1
// dividing hq / hkv) x 4 / GQ tiles of 16 query rows, one (head, 16-row tile) per warp, so every K/V
// tile staged in shared memory serves all the query heads that share it. Per tile of ATC_BK keys:
//   1. the block converts K [BK, D] and V [BK, D] from the f32 cache to bf16 in shared memory;
//   2. each warp: S = Q K^T (mma.sync m16n8k16, bf16 in, f32 accumulate; [16, BK]), scaled by
//      softmax_scale * log2(e) and masked (key > row's position, or outside the block's key split);
//   3. online softmax in f32 per row: m = running max, P = exp2(S - m) rounded to bf16, l = running sum
//      of the rounded P (so the output is the exact weighted mean of bf16(V) under weights bf16(P)),
//      O *= exp2(m_old - m_new);
//   4. O += P V with the S accumulators re-packed as the A fragments (C layout of two n8 tiles = A
//      layout of one k16), V as B. O [16, D] stays in registers: D / 2 floats per lane (128 at D 256).
// ptxas (sm_90, no spills): 218 registers at D 256 (2 blocks per SM), 127 at D 128, 128 at D 64.
// Key splits (grid z): with `splits` > 1 the pass's keys 0..L (L = start + m) are cut into ranges of C =
// roundup(ceil(L / splits), BK) keys, so that short passes still fill the GPU; each block writes the
// unnormalised partial (m, l, acc) of its rows and attn_tc_combine merges them in split order. With
// splits == 1 the block normalises and gates (out *= sigmoid(gate)) itself, like attn_combine.
//
// Precision: q, K, V and P are rounded to bf16 (8 significant bits), products accumulate in f32. The
// prefill pass this serves already rounds every GEMM activation to bf16 (cuBLAS with bf16 weights), so
// the attention operands get the same treatment; decode and verify rows (<= gemv_max_rows) keep the f32
// split-K kernels of attention.cu, and their batch invariance does not involve this kernel.
// Shared-memory layouts (32-bit words, each holding two bf16) are chosen for conflict-free fragment
// loads: Q and K rows of D + 8 bf16 (stride = 4 mod 32 words: lane (g, t) hits bank 4g + t), V as key
// pairs [BK / 2][D + 8] words of (V[2p][c], V[2p + 1][c]) (stride = 8 mod 32: bank 8t + g), which is
// exactly the B fragment of P V.
#define ATC_WARPS 4
#define ATC_BK 32
#define ATC_LOG2E 1.4426950408889634f

// Two floats as bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
#if defined(KERNEL_SIM) || __CUDA_ARCH__ < 800
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
#else
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// Keys per split: all of them with one split, else ceil(L / splits) rounded up to whole tiles.
__device__ __forceinline__ int atc_chunk(int total, int splits) {
    const int c = (total + splits - 1) / splits;
    return (c + ATC_BK - 1) / ATC_BK * ATC_BK;
}

// Shared memory of attn_tc_<D> in bytes (the launcher's formula, ops.rs): Q [4][16][D + 8], K [BK][D + 8]
// bf16 and V [BK / 2][D + 8] words = 64 (D + 8) words.
template <int D>
__device__ __forceinline__ void attn_tc_body(const float* __restrict__ q, const float* __restrict__ k_cache,
                                             const float* __restrict__ v_cache, const int* __restrict__ start_p,
                                             const float* __restrict__ gate, float* __restrict__ out,
                                             float* __restrict__ part_m, float* __restrict__ part_l,
                                             float* __restrict__ part_acc, int m, int hq, int hkv, int gq,
                                             int splits, int gated, float scale) {
    constexpr int KW = (D + 8) / 2;  // words per Q / K row
    constexpr int VW = D + 8;        // words per V key pair
    constexpr int NT = D / 8;        // n8 tiles of O
    constexpr int KT = ATC_BK / 8;   // n8 tiles of S
    // Q fragments in registers for D <= 32, else re-read from shared memory per tile: keeping them
    // takes 220 registers instead of 127 at D 128 (2 resident blocks per SM instead of 4), 136 instead
    // of 128 at D 64 (3 instead of 4).
    constexpr bool QREG = D <= 32;
    unsigned* smem = DYN_SMEM(unsigned);
    unsigned* qs = smem;                            // [4][16][KW]
    unsigned* ks = qs + ATC_WARPS * 16 * KW;        // [BK][KW]
    unsigned* vs = ks + ATC_BK * KW;                // [BK / 2][VW]
    PDL_ENTER();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int group = hq / hkv, hblocks = group / gq;
    const int kvh = blockIdx.y / hblocks;
    const int head = kvh * group + (blockIdx.y % hblocks) * gq + warp % gq;
    const int rows_per_block = 16 * (ATC_WARPS / gq);
    const int r0 = blockIdx.x * rows_per_block, w0 = r0 + 16 * (warp / gq);
    const int split = blockIdx.z;
    const int start = *start_p;
    const int chunk = atc_chunk(start + m, splits);
    // Keys of this block: [kb, ke); the block's last row sees keys < start + min(m, r0 + rows).
    const int kb = split * chunk, kend = kb + chunk;
    const int ke = min(kend, start + min(m, r0 + rows_per_block));
    if (kb >= ke) return;  // uniform over the block
    // Each lane holds rows w0 + g and w0 + g + 8; lim = keys < lim are visible to that row here.
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = w0 + g + 8 * h;
        lim[h] = r < m ? min(start + r + 1, kend) : 0;
    }
    const int warp_lim = w0 < m ? min(start + min(m, w0 + 16), kend) : 0;  // max over the warp's rows

    // Q of this warp's 16 rows to bf16 (rows past m are zeros).
    unsigned* qw = qs + warp * 16 * KW;
    for (int i = lane; i < 16 * (D / 4); i += 32) {
        const int rr = i / (D / 4), c4 = i % (D / 4), r = w0 + rr;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < m) v = *reinterpret_cast<const float4*>(q + ((size_t)r * hq + head) * D + 4 * c4);
        uint2 w;
        w.x = pack_bf16(v.x, v.y), w.y = pack_bf16(v.z, v.w);
        *reinterpret_cast<uint2*>(qw + rr * KW + 2 * c4) = w;
    }
    __syncwarp();
    // A fragments of Q for k16 step kk: a0 = (row g, k 2t..2t+1), a1 = row g + 8, a2/a3 = k + 8.
    auto q_frag = [&](int kk, unsigned a[4]) {
        a[0] = qw[g * KW + kk * 8 + t];
        a[1] = qw[(g + 8) * KW + kk * 8 + t];
        a[2] = qw[g * KW + kk * 8 + 4 + t];
        a[3] = qw[(g + 8) * KW + kk * 8 + 4 + t];
    };
    unsigned qf[QREG ? D / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < (QREG ? D / 16 : 0); ++kk) q_frag(kk, qf[kk]);
    }

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mrun[2] = {NEG_INF, NEG_INF}, lrun[2] = {0.0f, 0.0f};
    const float sl2 = scale * ATC_LOG2E;

    for (int kt = kb; kt < ke; kt += ATC_BK) {
        __syncthreads();  // the previous tile's K / V are no longer read
        // K: [BK][D] f32 -> bf16 rows; keys past ke are zeros (never visible, but must not be NaN).
        // Unrolled so that several 16-byte loads per thread are in flight.
#pragma unroll 4
        for (int i = threadIdx.x; i < ATC_BK * (D / 4); i += ATC_WARPS * 32) {
            const int kr = i / (D / 4), c4 = i % (D / 4), key = kt + kr;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (key < ke) v = *reinterpret_cast<const float4*>(k_cache + ((size_t)key * hkv + kvh) * D + 4 * c4);
            uint2 w;
            w.x = pack_bf16(v.x, v.y), w.y = pack_bf16(v.z, v.w);
            *reinterpret_cast<uint2*>(ks + kr * KW + 2 * c4) = w;
        }
        // V: key pairs, word (p, c) = (V[2p][c], V[2p + 1][c]).
#pragma unroll 2
        for (int i = threadIdx.x; i < (ATC_BK / 2) * (D / 4); i += ATC_WARPS * 32) {
            const int p = i / (D / 4), c4 = i % (D / 4), key = kt + 2 * p;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
            if (key < ke) a = *reinterpret_cast<const float4*>(v_cache + ((size_t)key * hkv + kvh) * D + 4 * c4);
            if (key + 1 < ke)
                b = *reinterpret_cast<const float4*>(v_cache + ((size_t)(key + 1) * hkv + kvh) * D + 4 * c4);
            uint4 w;
            w.x = pack_bf16(a.x, b.x), w.y = pack_bf16(a.y, b.y), w.z = pack_bf16(a.z, b.z), w.w = pack_bf16(a.w, b.w);
            *reinterpret_cast<uint4*>(vs + p * VW + 4 * c4) = w;
        }
        __syncthreads();
        if (kt >= warp_lim) continue;  // no row of this warp sees these keys (warp-uniform)

        // S = Q K^T: [16 rows][BK keys] as KT n8 tiles; s[j][i]: row g + 8 (i >> 1), key 8j + 2t + (i & 1).
        float s[KT][4];
#pragma unroll
        for (int j = 0; j < KT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[4];
            if (QREG) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[e] = qf[QREG ? kk : 0][e];
            } else {
                q_frag(kk, a);
            }
#pragma unroll
            for (int j = 0; j < KT; ++j) {
                const unsigned b[2] = {ks[(8 * j + g) * KW + kk * 8 + t], ks[(8 * j + g) * KW + kk * 8 + 4 + t]};
                mma_16816(s[j], a, b);
            }
        }
        // Scale, mask, and the online softmax of each of the lane's two rows (a row's BK values are
        // spread over the 4 lanes of a quad).
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < KT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = kt + 8 * j + 2 * t + e;
                    const float v = key < lim[h] ? s[j][2 * h + e] * sl2 : NEG_INF;
                    s[j][2 * h + e] = v;
                    mx = fmaxf(mx, v);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrun[h], mx);
            // A row with no visible key yet keeps m = -inf; 0 as the reference avoids -inf - -inf.
            const float ref = mnew == NEG_INF ? 0.0f : mnew;
            corr[h] = exp2f(mrun[h] - ref);
            mrun[h] = mnew;
            float ps = 0.0f;
#pragma unroll
            for (int j = 0; j < KT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    // Rounded to bf16 here so that l sums exactly the weights the mma uses.
                    const float p = bf2f(f2bf(exp2f(s[j][2 * h + e] - ref)));
                    s[j][2 * h + e] = p;
                    ps += p;
                }
            lrun[h] = lrun[h] * corr[h] + ps;
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= corr[0], o[n][1] *= corr[0];
            o[n][2] *= corr[1], o[n][3] *= corr[1];
        }
        // O += P V: P's k16 step kk = S tiles 2kk (keys +0..7) and 2kk + 1 (keys +8..15).
#pragma unroll
        for (int kk = 0; kk < ATC_BK / 16; ++kk) {
            const unsigned a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                   pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const unsigned* v0 = vs + (8 * kk + t) * VW + g;  // key pair 8kk + t, column g
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const unsigned b[2] = {v0[8 * n], v0[4 * VW + 8 * n]};
                mma_16816(o[n], a, b);
            }
        }
    }

    // The lane's partial sums of l over its quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        lrun[h] += __shfl_xor_sync(0xffffffffu, lrun[h], 1);
        lrun[h] += __shfl_xor_sync(0xffffffffu, lrun[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = w0 + g + 8 * h;
        if (r >= m || start + r + 1 <= kb) continue;  // past the pass, or no key of this row in the split
        const size_t row_head = (size_t)r * hq + head;
        if (splits == 1) {
            const float inv = 1.0f / lrun[h];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int c = 8 * n + 2 * t;
                float2 v = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
                if (gated) {
                    const float2 gv = *reinterpret_cast<const float2*>(gate + row_head * D + c);
                    v.x *= sigmoid_f(gv.x), v.y *= sigmoid_f(gv.y);
                }
                *reinterpret_cast<float2*>(out + row_head * D + c) = v;
            }
        } else {
            const size_t slot = row_head * splits + split;
#pragma unroll
            for (int n = 0; n < NT; ++n)
                *reinterpret_cast<float2*>(part_acc + slot * D + 8 * n + 2 * t) =
                    make_float2(o[n][2 * h], o[n][2 * h + 1]);
            if (t == 0) {
                part_m[slot] = mrun[h];
                part_l[slot] = lrun[h];
            }
        }
    }
}

#define ATTN_TC_KERNEL(D)                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATC_WARPS * 32)                                             \
        attn_tc_##D(const float* q, const float* k_cache, const float* v_cache, const int* start_p,          \
                    const float* gate, float* out, float* part_m, float* part_l, float* part_acc, int m,     \
                    int hq, int hkv, int gq, int splits, int gated, float scale) {                            \
        attn_tc_body<D>(q, k_cache, v_cache, start_p, gate, out, part_m, part_l, part_acc, m, hq, hkv, gq,   \
                        splits, gated, scale);                                                               \
    }
ATTN_TC_KERNEL(16)
ATTN_TC_KERNEL(32)
ATTN_TC_KERNEL(64)
ATTN_TC_KERNEL(128)
ATTN_TC_KERNEL(256)

// Merges the key splits of attn_tc in split order, one block per (head, row); out [m, hq, d]:
// out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s (m in the log2 domain), then the gate.
extern "C" __global__ void attn_tc_combine(const float* __restrict__ part_m, const float* __restrict__ part_l,
                                           const float* __restrict__ part_acc, const int* __restrict__ start_p,
                                           const float* __restrict__ gate, float* __restrict__ out, int m,
                                           int hq, int d, int splits, int gated) {
    PDL_ENTER();
    const int head = blockIdx.x, row = blockIdx.y;
    const int start = *start_p, len = start + row + 1;
    const int chunk = atc_chunk(start + m, splits);
    const int used = (len + chunk - 1) / chunk;  // splits holding keys of this row: 0..used-1
    const size_t at = ((size_t)row * hq + head) * d;
    merge_splits<true>(part_m, part_l, part_acc, ((size_t)row * hq + head) * splits, used, d,
                       gated ? gate + at : nullptr, out + at);
}
