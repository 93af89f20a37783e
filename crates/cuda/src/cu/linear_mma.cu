// y[r, o] (+)= sum_i W[o, i] * x[r, i] for 1..16 rows on the tensor cores: the matrix-vector path of
// decode and verify blocks over bf16 weights, so that a block of 16 rows streams the weights once and
// costs about what one row costs (the FMA kernel in linear.cu pays per row: 8 rows = 3-5 rows' time).
//
// mma.sync m16n8k16 (bf16 in, f32 accumulate) with the activations as A (16 rows: the input rows, unused
// ones zero) and the weights as B (8 output rows). f32 activations keep their precision: each x is split
// exactly into three bf16 terms hi + mid + lo (24 significant bits, like f32) and all three go through
// the tensor core, so the products are exact and only the f32 accumulation rounds.
//
// Work split: a warp owns one unit = T 8-row weight tiles (T = 1, 2 or 4; for SwiGLU half gate rows, half
// the matching up rows) over a contiguous range of 32-column chunks, U chunks in flight; `wpk` warps of a
// block split the columns of one unit and their partial sums are added in part order (T, U, the
// minimum blocks per SM and wpk come from the matrix shape: mma.rs, measured by `cuda_check --sweep`).
// Per chunk a lane loads 16 bytes of each tile's weight row and the A fragments of rows g (and g + 8):
// from shared memory, where the block split every input row once (`stage`, when n x in x 6 bytes fit),
// else split on the spot. The mma's k index is a fixed permutation of the chunk's columns (weights and x
// permuted alike), see `chunk_mma`. Splitting per chunk and warp with round-to-nearest made the kernel
// issue-bound (decode 84 tok/s on the H200 against 272 with the FMA kernel), hence truncation,
// staging and no g + 8 rows for <= 8. One row still costs 20-40% more than on the FMA kernel (latency-
// bound: 98-126 registers leave 2-3 blocks per SM), 8 rows 2x less, 16 rows 3x less (`cuda_check --sweep`).
//
// Batch invariance: an output element is D[m][n] of the same sequence of mma's whatever the row count —
// row m of A only ever meets row m's activations, other rows are other columns of the product — so a
// verify row equals the same row decoded alone, bit for bit. The RMSNorm prologue computes 1/rms of
// each row in rms_inv's exact summation order (same bits as the rmsnorm kernel).
#define MMA_WARPS 8
#define MMA_MAX_ROWS 16

#ifdef KERNEL_SIM
// The simulator has no tensor cores: the same fragment semantics through a per-warp exchange buffer.
__device__ inline void mma_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
    static unsigned xa[32][32][4], xb[32][32][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) xa[warp][lane][i] = a[i];
    for (int i = 0; i < 2; ++i) xb[warp][lane][i] = b[i];
    __syncwarp();
    auto half = [](unsigned v, int k) { return __uint_as_float(k & 1 ? (v & 0xffff0000u) : (v << 16)); };
    for (int i = 0; i < 4; ++i) {
        const int m = g + (i >= 2 ? 8 : 0), n = 2 * t + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; ++k) {
            const int kk = k & 7, src_a = (m & 7) * 4 + kk / 2, src_b = n * 4 + kk / 2;
            const unsigned ra = xa[warp][src_a][(m >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
            const unsigned rb = xb[warp][src_b][k >= 8 ? 1 : 0];
            acc = fmaf(half(ra, k), half(rb, k), acc);
        }
        d[i] = acc;
    }
    __syncwarp();
}
#else
__device__ __forceinline__ void mma_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
#endif

// Splits the 8 consecutive f32 of row g (xa) and, with FULL, of row g + 8 (xb) into the A fragments of
// two k16 mma's for each bf16 term: a[term][j][4]. The terms come by truncation: hi = the top 16 bits of
// x, mid = the top 16 bits of x - hi, lo = x - hi - mid, which has at most 8 significant bits left, so
// hi + mid + lo == x exactly. Fragment of mma j: a0 = row g, k 2t..2t+1 = x[4j..4j+1]; a1 = row g+8,
// same k; a2 = row g, k 2t+8..2t+9 = x[4j+2..4j+3]; a3 = row g+8, same k.
template <bool FULL>
__device__ __forceinline__ void split_a(const float* xa, const float* xb, unsigned a[3][2][4]) {
    unsigned ua[3][8], ub[3][8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        float ra = xa[e], rb = FULL ? xb[e] : 0.0f;
#pragma unroll
        for (int s = 0; s < 3; ++s) {
            ua[s][e] = __float_as_uint(ra);
            ra -= __uint_as_float(ua[s][e] & 0xffff0000u);
            if (FULL) {
                ub[s][e] = __float_as_uint(rb);
                rb -= __uint_as_float(ub[s][e] & 0xffff0000u);
            }
        }
    }
#pragma unroll
    for (int s = 0; s < 3; ++s)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            // __byte_perm(lo, hi, 0x7632): the upper halves (the bf16 bits) of two floats, lo first.
            a[s][j][0] = __byte_perm(ua[s][4 * j], ua[s][4 * j + 1], 0x7632);
            a[s][j][2] = __byte_perm(ua[s][4 * j + 2], ua[s][4 * j + 3], 0x7632);
            a[s][j][1] = FULL ? __byte_perm(ub[s][4 * j], ub[s][4 * j + 1], 0x7632) : 0u;
            a[s][j][3] = FULL ? __byte_perm(ub[s][4 * j + 2], ub[s][4 * j + 3], 0x7632) : 0u;
        }
}

// One 32-column chunk into acc[j % J][tile][4] (j: the chunk's k16 half): the weights w[tile] (8 bf16 of
// the tile's output row g at the lane's columns) are the B fragments b0 = w.x, b1 = w.y (mma 0) and
// b0 = w.z, b1 = w.w (mma 1), which matches split_a's column order. Terms go smallest first; the tile
// loop is innermost so that consecutive mma's write different accumulators.
template <int T, int J>
__device__ __forceinline__ void chunk_mma(float acc[J][T][4], const unsigned a[3][2][4], const uint4 w[T]) {
#pragma unroll
    for (int s = 2; s >= 0; --s)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int tile = 0; tile < T; ++tile) {
                const unsigned b[2] = {j ? w[tile].z : w[tile].x, j ? w[tile].w : w[tile].y};
                mma_16816(acc[j % J][tile], a[s][j], b);
            }
}

// 1/rms of rows 0..n-1 (n <= MMA_MAX_ROWS) for a 256-thread block, each in rms_inv's order (per-thread f64
// sums strided by the thread index, the xor tree, then the warps in order), so the bits equal rms_inv's.
__device__ __forceinline__ void rms_inv_rows(const float* __restrict__ x, int n, int width, float eps,
                                             float* inv) {
    __shared__ double part[MMA_MAX_ROWS][MMA_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = 0; r < n; ++r) {
        const float* xr = x + (size_t)r * width;
        double ss = 0.0;
        for (int i = threadIdx.x; i < width; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
        ss = warp_sum_d(ss);
        if (lane == 0) part[r][warp] = ss;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        double t = 0.0;
        for (int w = 0; w < MMA_WARPS; ++w) t += part[threadIdx.x][w];
        const float variance = (float)(t / (double)width);
        inv[threadIdx.x] = 1.0f / sqrtf(variance + eps);
    }
    __syncthreads();
}

// Loads the 8 inputs of row m at columns c..c+7 into v (zeros past the n rows), normalised like the
// rmsnorm kernel when norm_w is given: (x * inv) * scale.
__device__ __forceinline__ void load_x8(const float* __restrict__ x, int m, int n, int in, int c,
                                        const float* __restrict__ norm_w, int zero_centred,
                                        const float* inv, float v[8]) {
    if (m >= n) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = 0.0f;
        return;
    }
    const float4* p = reinterpret_cast<const float4*>(x + (size_t)m * in + c);
    const float4 lo = p[0], hi = p[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    if (norm_w) {
        const float4* q = reinterpret_cast<const float4*>(norm_w + c);
        const float4 s0 = q[0], s1 = q[1];
        const float nw[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
        const float r = inv[m];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float scale = zero_centred ? 1.0f + nw[e] : nw[e];
            v[e] = (v[e] * r) * scale;
        }
    }
}

// The staged fragments of row m (zeros past the n rows) at column group q into a[term][mma][hi ? 1 : 0]
// and a[term][mma][hi ? 3 : 2] (hi: the row is the A fragment's g + 8 row).
__device__ __forceinline__ void load_frag(const unsigned* frag, int m, int n, int groups8, int q,
                                          unsigned a[3][2][4], int hi) {
    uint4 f[3] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    if (m < n) {
        const uint4* p = reinterpret_cast<const uint4*>(frag + ((size_t)m * groups8 + q) * 12);
        f[0] = p[0], f[1] = p[1], f[2] = p[2];
    }
#pragma unroll
    for (int s = 0; s < 3; ++s) {
        a[s][0][hi] = f[s].x, a[s][0][2 + hi] = f[s].y;
        a[s][1][hi] = f[s].z, a[s][1][2 + hi] = f[s].w;
    }
}

// Split fragments q0..q1 (q = row * in/8 + column group) of the n input rows, normalised when norm_w
// is given (inv: the rows' 1/rms), into frag + q * 12: [term][mma][a0, a2] as load_frag reads them.
__device__ __forceinline__ void split_rows_into(const float* __restrict__ x, int n, int in,
                                                const float* __restrict__ norm_w, int zero_centred,
                                                const float* inv, unsigned* frag, int q0, int q1) {
    const int groups8 = in / 8;
    for (int q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
        const int m = q / groups8, c = (q % groups8) * 8;
        float v[8];
        load_x8(x, m, n, in, c, norm_w, zero_centred, inv, v);
        unsigned a[3][2][4];
        split_a<false>(v, v, a);
        unsigned* dst = frag + (size_t)q * 12;
#pragma unroll
        for (int s = 0; s < 3; ++s)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                dst[s * 4 + j * 2] = a[s][j][0];
                dst[s * 4 + j * 2 + 1] = a[s][j][2];
            }
    }
}

// mma_split_rows, grid (n), MMA_WARPS * 32 threads: the staged fragments of n input rows, written once
// to global memory (frag [n, in/8, 12]) for every block of the GEMV that follows (`stage` 2), instead of
// each block normalising and splitting all n rows itself — measured on the H200, that prologue
// made a 4-row verify's normed GEMVs 1.5-1.9x the one-row time. Block m does row m in rms_inv_rows'
// order and split_rows_into's arithmetic, so the fragments equal the in-kernel stage bit for bit and a
// row's result does not depend on which path its launch took.
extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32)
    mma_split_rows(const float* __restrict__ x, unsigned* __restrict__ frag, int in,
                   const float* __restrict__ norm_w, float eps, int zero_centred) {
    PDL_ENTER();
    __shared__ float inv[MMA_MAX_ROWS];
    const int m = blockIdx.x, groups8 = in / 8;
    const float* xr = x + (size_t)m * in;
    if (norm_w) rms_inv_rows(xr, 1, in, eps, inv);
    split_rows_into(xr, 1, in, norm_w, zero_centred, inv, frag + (size_t)m * groups8 * 12, 0, groups8);
}

// T weight tiles of 8 rows per warp (2: 16 output rows, or 8 gate + 8 up rows; 4: 32 / 16 + 16), chosen
// from the matrix shape (ops.rs); FULL: more than 8 input rows (A rows g + 8 in use). `units` =
// ceil(out / 8T), or ceil(I / 4T) for SwiGLU (swiglu_inter = I: W is [gate ; up], y = act [n, I]).
template <int T, int U, bool FULL>
__device__ __forceinline__ void linear_mma(const bf16_t* __restrict__ w, const float* __restrict__ x,
                                           float* __restrict__ y, int n, int in, int out, int accumulate,
                                           int wpk, int swiglu_inter, const float* __restrict__ norm_w,
                                           float eps, int zero_centred, int stage) {
    // U chunks in flight: U x T x 16 bytes per lane. J accumulators per tile (the chunk's k16 halves
    // when T = 1, so that consecutive mma's are independent).
    constexpr int J = T == 1 ? 2 : 1;
    constexpr int TH = T >= 2 ? T / 2 : 1;  // SwiGLU: gate tiles [0, TH), up tiles [TH, T) (T >= 2 only)
    __shared__ float red[MMA_WARPS][32][T * 4];
    __shared__ float inv[MMA_MAX_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int unit = blockIdx.x * (MMA_WARPS / wpk) + warp / wpk, part = warp % wpk;
    const int per_unit = swiglu_inter ? 8 * TH : 8 * T;
    const int units = swiglu_inter ? (swiglu_inter + per_unit - 1) / per_unit : (out + per_unit - 1) / per_unit;
    const int chunks = in / 32;
    const int c_begin = chunks * part / wpk, c_end = chunks * (part + 1) / wpk;
    // Weight row of each tile read by this lane, or -1 past the matrix.
    int wrow[T];
#pragma unroll
    for (int tile = 0; tile < T; ++tile) {
        if (swiglu_inter) {
            const int j = unit * per_unit + (tile % TH) * 8 + g;
            wrow[tile] = j < swiglu_inter ? j + (tile >= TH ? swiglu_inter : 0) : -1;
        } else {
            const int o = unit * per_unit + tile * 8 + g;
            wrow[tile] = o < out ? o : -1;
        }
        if (unit >= units) wrow[tile] = -1;
    }
    const int lane_col = t * 8;
    // Warm L2 with the first weights: weights are never written, so this may precede PDL_WAIT.
#pragma unroll
    for (int tile = 0; tile < T; ++tile)
        for (int u = 0; u < U && c_begin + u < c_end; ++u)
            if (wrow[tile] >= 0) PREFETCH_L2(w + (size_t)wrow[tile] * in + (size_t)(c_begin + u) * 32 + lane_col);
    PDL_ENTER();
    // Staged (`stage` 1: the launcher checked that n x in x 6 bytes fit): the block splits every input
    // row once into shared memory, as fragments [row][column group of 8][term][mma][a0, a2], so the loop
    // below only loads them: splitting per chunk and warp costs more issue slots than the weights allow.
    // `stage` 2: mma_split_rows already wrote those fragments (norm applied) to global memory at x.
    const int groups8 = in / 8;
    const unsigned* frag = stage == 2 ? reinterpret_cast<const unsigned*>(x) : DYN_SMEM(unsigned);
    if (stage == 1) {
        if (norm_w) rms_inv_rows(x, n, in, eps, inv);
        split_rows_into(x, n, in, norm_w, zero_centred, inv, DYN_SMEM(unsigned), 0, n * groups8);
        __syncthreads();
    } else if (stage == 0 && norm_w) {
        rms_inv_rows(x, n, in, eps, inv);
    }

    float acc2[J][T][4];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int tile = 0; tile < T; ++tile)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc2[j][tile][i] = 0.0f;
    for (int c0 = c_begin; c0 < c_end; c0 += U) {
        uint4 wv[U][T];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int tile = 0; tile < T; ++tile) {
                const int c = c0 + u;
                wv[u][tile] = make_uint4(0, 0, 0, 0);
                if (c < c_end && wrow[tile] >= 0)
                    wv[u][tile] = __ldcs(reinterpret_cast<const uint4*>(w + (size_t)wrow[tile] * in + (size_t)c * 32 + lane_col));
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u;
            if (c >= c_end) break;
            unsigned a[3][2][4];
            if (stage) {
                load_frag(frag, g, n, groups8, c * 4 + t, a, 0);
                if (FULL) load_frag(frag, g + 8, n, groups8, c * 4 + t, a, 1);
                else
#pragma unroll
                    for (int s = 0; s < 3; ++s) a[s][0][1] = a[s][0][3] = a[s][1][1] = a[s][1][3] = 0u;
            } else {
                float xa[8], xb[8];
                load_x8(x, g, n, in, c * 32 + lane_col, norm_w, zero_centred, inv, xa);
                if (FULL) load_x8(x, g + 8, n, in, c * 32 + lane_col, norm_w, zero_centred, inv, xb);
                split_a<FULL>(xa, xb, a);
            }
            chunk_mma<T, J>(acc2, a, wv[u]);
        }
    }
    float acc[T][4];
#pragma unroll
    for (int tile = 0; tile < T; ++tile)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[tile][i] = J == 1 ? acc2[0][tile][i] : acc2[0][tile][i] + acc2[J - 1][tile][i];
    // Partial sums of the wpk parts, added in part order by part 0.
    if (wpk > 1) {
#pragma unroll
        for (int tile = 0; tile < T; ++tile)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[warp][lane][tile * 4 + i] = acc[tile][i];
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int tile = 0; tile < T; ++tile)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float s = red[warp][lane][tile * 4 + i];
                for (int p = 1; p < wpk; ++p) s += red[warp + p][lane][tile * 4 + i];
                acc[tile][i] = s;
            }
    }
    if (unit >= units) return;
    // D element i of a tile: input row m = g + 8 (i >= 2), output row in tile = 2t + (i & 1).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        if (m >= n) continue;
#pragma unroll
        for (int tile = 0; tile < (swiglu_inter ? TH : T); ++tile) {
            if (swiglu_inter) {
                const int j = unit * per_unit + tile * 8 + col;
                if (j < swiglu_inter)
                    y[(size_t)m * swiglu_inter + j] = silu_f(acc[tile][i]) * acc[(tile + TH) % T][i];
            } else {
                const int o = unit * per_unit + tile * 8 + col;
                if (o < out) {
                    float* dst = y + (size_t)m * out + o;
                    *dst = accumulate ? *dst + acc[tile][i] : acc[tile][i];
                }
            }
        }
    }
}

// Variants by (tiles T, chunks in flight U, minimum resident blocks per SM); ops.rs picks one per matrix
// shape (MMA_VARIANTS there lists the same set).
#define LINEAR_MMA_KERNEL(T, U, MB, FULL, SUFFIX)                                                         \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, MB)                                      \
        linear_mma_t##T##_u##U##_b##MB##_##SUFFIX(const bf16_t* w, const float* x, float* y, int n, int in,  \
                                                  int out, int accumulate, int wpk, int swiglu_inter,        \
                                                  const float* norm_w, float eps, int zero_centred,          \
                                                  int stage) {                                               \
        linear_mma<T, U, FULL>(w, x, y, n, in, out, accumulate, wpk, swiglu_inter, norm_w, eps, zero_centred,  \
                               stage);                                                                        \
    }
#define LINEAR_MMA_VARIANT(T, U, MB)                \
    LINEAR_MMA_KERNEL(T, U, MB, false, half)        \
    LINEAR_MMA_KERNEL(T, U, MB, true, full)
LINEAR_MMA_VARIANT(1, 4, 4)
LINEAR_MMA_VARIANT(1, 8, 3)
LINEAR_MMA_VARIANT(2, 2, 4)
LINEAR_MMA_VARIANT(2, 4, 2)
LINEAR_MMA_VARIANT(2, 4, 3)
LINEAR_MMA_VARIANT(4, 2, 2)
LINEAR_MMA_VARIANT(4, 2, 3)
