// Linear layers over quantized weights kept in ggml's blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K), as GGUF files store them (crates/kernels/src/quant/formats.rs describes the layouts).
//
// Decode / verify rows (qgemv_*): llama.cpp's algorithm, integer dot products against an 8-bit copy of the
// input. quant_input quantizes each input row once per call in blocks of 32 (d = max|x| / 127,
// q = round-half-even(x / d), and d * sum(q)), exactly as the CPU kernels do. A weight row is read as
// 32-element sub-blocks: integers u - o (signed bytes, the format's offset o taken out), a scale per
// 16 elements (a_lo, a_hi: equal except for Q6_K) and, for formats with a minimum, a term b. One
// thread takes one sub-block j against every input row r:
//     s = a * float(isum)   (Q6_K: fma(a_hi, float(isum_hi), a_lo * float(isum_lo)))
//     acc[r] = fma(s, dx[r][j], acc[r]);   acc[r] = fma(b, dxs[r][j], acc[r])   (with a minimum)
// with isum the exact dp4a sums; a warp strides over the sub-blocks (lane + 32 * wpr * i), the warp's
// lanes are summed by the xor tree, the wpr warps of a row in warp order.
// Invariant (batch invariance, what keeps greedy speculation exact): every step above depends only on
// the weight row, the input row and the shape (wpr is a function of the shape), never on the number of
// rows in the launch, so verify rows equal decode rows bit for bit. Float steps are written as explicit
// round-to-nearest intrinsics so that no contraction choice of the compiler can differ between them.
//
// Prefill rows (more than the GEMV takes) dequantize a tile of rows to bf16 (qdequant_bf16) for cuBLAS;
// embedding rows are dequantized to f32 (qembed) with ggml's arithmetic, bit for bit the CPU's values.

#define QF_Q4_0 0
#define QF_Q4_1 1
#define QF_Q5_0 2
#define QF_Q5_1 3
#define QF_Q8_0 4
#define QF_Q4_K 5
#define QF_Q5_K 6
#define QF_Q6_K 7
#define QGEMV_MAX_ROWS 16
#define QGEMV_WARPS 8

// IEEE half bits -> f32 (exact, subnormals included): the conversion instruction on the GPU.
__device__ __forceinline__ float f16_bits(unsigned h) {
#ifndef KERNEL_SIM
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
#endif
    const unsigned s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return s ? -v : v;
    }
    if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ unsigned q_u16(const unsigned char* p) { return *reinterpret_cast<const unsigned short*>(p); }
__device__ __forceinline__ float q_f16(const unsigned char* p) { return f16_bits(q_u16(p)); }
// 4 bytes at a 2-byte aligned address / at a 4-byte aligned address.
__device__ __forceinline__ int q_i32_a2(const unsigned char* p) { return (int)(q_u16(p) | (q_u16(p + 2) << 16)); }
__device__ __forceinline__ int q_i32_a4(const unsigned char* p) { return *reinterpret_cast<const int*>(p); }
// Bits 0..3 of x to bit 4 of bytes 0..3.
__device__ __forceinline__ int q_bit4(unsigned x) {
    return (int)(((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25));
}
// Per-byte a - b (wrapping), the signed integers u - o.
__device__ __forceinline__ int q_vsub(int a, int b) {
    return (int)((((unsigned)a | 0x80808080u) - (unsigned)b) ^ 0x80808080u);
}

// One 32-element sub-block of a weight row: v[i] holds elements 4i..4i+3 as signed bytes u - o.
struct QSub {
    int v[8];
    float a_lo, a_hi, b;
};

template <int F> struct QFmt;
template <> struct QFmt<QF_Q4_0> { enum { BLOCK = 32, BYTES = 18, MIN = 0 }; };
template <> struct QFmt<QF_Q4_1> { enum { BLOCK = 32, BYTES = 20, MIN = 1 }; };
template <> struct QFmt<QF_Q5_0> { enum { BLOCK = 32, BYTES = 22, MIN = 0 }; };
template <> struct QFmt<QF_Q5_1> { enum { BLOCK = 32, BYTES = 24, MIN = 1 }; };
template <> struct QFmt<QF_Q8_0> { enum { BLOCK = 32, BYTES = 34, MIN = 0 }; };
template <> struct QFmt<QF_Q4_K> { enum { BLOCK = 256, BYTES = 144, MIN = 1 }; };
template <> struct QFmt<QF_Q5_K> { enum { BLOCK = 256, BYTES = 176, MIN = 1 }; };
template <> struct QFmt<QF_Q6_K> { enum { BLOCK = 256, BYTES = 210, MIN = 0 }; };

// ggml's get_scale_min_k4 for sub-block t of the 12 packed bytes q (4-byte aligned), without branches
// (the lanes of a warp take different t): the four-at-a-time word form of the CPU's scales_mins_k4.
__device__ __forceinline__ void q_scale_min_k4(const unsigned char* q, int t, int* sc, int* mn) {
    const unsigned u0 = (unsigned)q_i32_a4(q), u1 = (unsigned)q_i32_a4(q + 4), u2 = (unsigned)q_i32_a4(q + 8);
    const bool lo = t < 4;
    const unsigned s = lo ? u0 & 0x3F3F3F3Fu : (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
    const unsigned m = lo ? u1 & 0x3F3F3F3Fu : ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
    const int shift = 8 * (t & 3);
    *sc = (int)((s >> shift) & 0xFFu);
    *mn = (int)((m >> shift) & 0xFFu);
}

// Sub-block j of `row` in format F: the scales a = d * sc (ggml's float products) and the term b.
template <int F>
__device__ __forceinline__ void q_decode(const unsigned char* __restrict__ row, int j, QSub& s) {
    s.b = 0.0f;
    if (F == QF_Q4_0 || F == QF_Q4_1) {
        const unsigned char* blk = row + j * QFmt<F>::BYTES;
        const int at = F == QF_Q4_0 ? 2 : 4;
        s.a_lo = s.a_hi = q_f16(blk);
        if (F == QF_Q4_1) s.b = q_f16(blk + 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int q = F == QF_Q4_0 ? q_i32_a2(blk + at + 4 * i) : q_i32_a4(blk + at + 4 * i);
            const int lo = q & 0x0F0F0F0F, hi = (q >> 4) & 0x0F0F0F0F;
            s.v[i] = F == QF_Q4_0 ? q_vsub(lo, 0x08080808) : lo;
            s.v[4 + i] = F == QF_Q4_0 ? q_vsub(hi, 0x08080808) : hi;
        }
    } else if (F == QF_Q5_0 || F == QF_Q5_1) {
        const unsigned char* blk = row + j * QFmt<F>::BYTES;
        const int at = F == QF_Q5_0 ? 2 : 4;
        s.a_lo = s.a_hi = q_f16(blk);
        if (F == QF_Q5_1) s.b = q_f16(blk + 2);
        const unsigned qh = F == QF_Q5_0 ? (unsigned)q_i32_a2(blk + at) : (unsigned)q_i32_a4(blk + at);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int q = F == QF_Q5_0 ? q_i32_a2(blk + at + 4 + 4 * i) : q_i32_a4(blk + at + 4 + 4 * i);
            const int lo = (q & 0x0F0F0F0F) | q_bit4(qh >> (4 * i));
            const int hi = ((q >> 4) & 0x0F0F0F0F) | q_bit4(qh >> (16 + 4 * i));
            s.v[i] = F == QF_Q5_0 ? q_vsub(lo, 0x10101010) : lo;
            s.v[4 + i] = F == QF_Q5_0 ? q_vsub(hi, 0x10101010) : hi;
        }
    } else if (F == QF_Q8_0) {
        const unsigned char* blk = row + j * QFmt<F>::BYTES;
        s.a_lo = s.a_hi = q_f16(blk);
#pragma unroll
        for (int i = 0; i < 8; ++i) s.v[i] = q_i32_a2(blk + 2 + 4 * i);
    } else if (F == QF_Q4_K || F == QF_Q5_K) {
        const unsigned char* sb = row + (j >> 3) * QFmt<F>::BYTES;
        const int t = j & 7;
        int sc, mn;
        q_scale_min_k4(sb + 4, t, &sc, &mn);
        s.a_lo = s.a_hi = __fmul_rn(q_f16(sb), (float)sc);
        s.b = __fmul_rn(-q_f16(sb + 2), (float)mn);
        const unsigned char* qs = sb + (F == QF_Q5_K ? 48 : 16) + 32 * (t >> 1);
        const int shift = 4 * (t & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int u = (q_i32_a4(qs + 4 * i) >> shift) & 0x0F0F0F0F;
            if (F == QF_Q5_K) u |= ((q_i32_a4(sb + 16 + 4 * i) >> t) & 0x01010101) << 4;
            s.v[i] = u;
        }
    } else {  // Q6_K
        const unsigned char* sb = row + (j >> 3) * QFmt<F>::BYTES;
        const int t = j & 7, h = t >> 2, c = t & 3;
        const unsigned char* ql = sb + 64 * h + 32 * (c & 1);
        const unsigned char* qh = sb + 128 + 32 * h;
        const float d = q_f16(sb + 208);
        s.a_lo = __fmul_rn(d, (float)(signed char)sb[192 + 8 * h + 2 * c]);
        s.a_hi = __fmul_rn(d, (float)(signed char)sb[193 + 8 * h + 2 * c]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int u = ((q_i32_a2(ql + 4 * i) >> (4 * (c >> 1))) & 0x0F0F0F0F) |
                          (((q_i32_a2(qh + 4 * i) >> (2 * c)) & 0x03030303) << 4);
            s.v[i] = q_vsub(u, 0x20202020);
        }
    }
}

// Input rows x [n, k] (the stored column c reads x[order[c]] when order is given) to 8 bits per 32-block:
// xq [n, k], dx [n, k / 32] = d, dxs [n, k / 32] = d * sum(q). One warp per block, lane = element.
extern "C" __global__ void quant_input(const float* __restrict__ x, const int* __restrict__ order, int k, int n,
                                       signed char* __restrict__ xq, float* __restrict__ dx,
                                       float* __restrict__ dxs) {
    PDL_ENTER();
    const int lane = threadIdx.x & 31;
    const long long blocks = (long long)n * (k >> 5);
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); b < blocks; b += warps) {
        const long long r = b / (k >> 5);
        const int c = (int)(b - r * (k >> 5)) * 32 + lane;
        const float v = x[r * k + (order ? order[c] : c)];
        float amax = fabsf(v);
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        const int q = __float2int_rn(__fmul_rn(v, id));
        int sum = q;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        xq[r * k + c] = (signed char)q;
        if (lane == 0) {
            dx[b] = d;
            dxs[b] = __fmul_rn(d, (float)sum);
        }
    }
}

// y[r * ldy + i] (+)= W[i] . x[r] for the m weight rows of one format (row_bytes each) and n <= 16 input
// rows quantized by quant_input. Blocks of QGEMV_WARPS warps, wpr warps per output row.
template <int F>
__device__ __forceinline__ void qgemv(const unsigned char* __restrict__ W, long long row_bytes, int m, int k, int n,
                                      const signed char* __restrict__ xq, const float* __restrict__ dx,
                                      const float* __restrict__ dxs, float* __restrict__ y, int ldy,
                                      int accumulate, int wpr) {
    __shared__ float part_sums[QGEMV_WARPS][QGEMV_MAX_ROWS];
    PDL_ENTER();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows_per_block = QGEMV_WARPS / wpr;
    const int i = blockIdx.x * rows_per_block + warp / wpr, part = warp % wpr;
    const int nsub = k >> 5;
    float acc[QGEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < QGEMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    if (i < m) {
        const unsigned char* row = W + (long long)i * row_bytes;
        for (int j = part * 32 + lane; j < nsub; j += 32 * wpr) {
            QSub s;
            q_decode<F>(row, j, s);
#pragma unroll
            for (int r = 0; r < QGEMV_MAX_ROWS; ++r) {
                if (r < n) {
                    const int4* xp = reinterpret_cast<const int4*>(xq + (long long)r * k + 32 * j);
                    const int4 x0 = xp[0], x1 = xp[1];
                    int lo = __dp4a(s.v[0], x0.x, 0);
                    lo = __dp4a(s.v[1], x0.y, lo);
                    lo = __dp4a(s.v[2], x0.z, lo);
                    lo = __dp4a(s.v[3], x0.w, lo);
                    int hi = __dp4a(s.v[4], x1.x, 0);
                    hi = __dp4a(s.v[5], x1.y, hi);
                    hi = __dp4a(s.v[6], x1.z, hi);
                    hi = __dp4a(s.v[7], x1.w, hi);
                    const long long xb = (long long)r * nsub + j;
                    const float sum = F == QF_Q6_K ? __fmaf_rn(s.a_hi, (float)hi, __fmul_rn(s.a_lo, (float)lo))
                                                   : __fmul_rn(s.a_lo, (float)(lo + hi));
                    acc[r] = __fmaf_rn(sum, dx[xb], acc[r]);
                    if (QFmt<F>::MIN) acc[r] = __fmaf_rn(s.b, dxs[xb], acc[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < QGEMV_MAX_ROWS; ++r)
        if (r < n) acc[r] = warp_sum(acc[r]);
    if (wpr > 1) {
        if (lane == 0)
            for (int r = 0; r < n; ++r) part_sums[warp][r] = acc[r];
        __syncthreads();
        if (part == 0 && lane == 0)
            for (int r = 0; r < n; ++r) {
                float t = part_sums[warp][r];
                for (int p = 1; p < wpr; ++p) t = __fadd_rn(t, part_sums[warp + p][r]);
                acc[r] = t;
            }
    }
    if (i < m && part == 0 && lane == 0)
        for (int r = 0; r < n; ++r) {
            float* out = y + (long long)r * ldy + i;
            *out = accumulate ? __fadd_rn(*out, acc[r]) : acc[r];
        }
}

#define QGEMV_KERNEL(NAME, F)                                                                                   \
    extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * 32)                                                 \
        NAME(const unsigned char* __restrict__ W, long long row_bytes, int m, int k, int n,                       \
             const signed char* __restrict__ xq, const float* __restrict__ dx, const float* __restrict__ dxs,     \
             float* __restrict__ y, int ldy, int accumulate, int wpr) {                                          \
        qgemv<F>(W, row_bytes, m, k, n, xq, dx, dxs, y, ldy, accumulate, wpr);                                    \
    }
QGEMV_KERNEL(qgemv_q4_0, QF_Q4_0)
QGEMV_KERNEL(qgemv_q4_1, QF_Q4_1)
QGEMV_KERNEL(qgemv_q5_0, QF_Q5_0)
QGEMV_KERNEL(qgemv_q5_1, QF_Q5_1)
QGEMV_KERNEL(qgemv_q8_0, QF_Q8_0)
QGEMV_KERNEL(qgemv_q4_k, QF_Q4_K)
QGEMV_KERNEL(qgemv_q5_k, QF_Q5_K)
QGEMV_KERNEL(qgemv_q6_k, QF_Q6_K)

// The 32 values of sub-block j as ggml dequantizes them: a * (u - o), plus b with a minimum.
template <int F>
__device__ __forceinline__ void q_values(const unsigned char* __restrict__ row, int j, float* out) {
    QSub s;
    q_decode<F>(row, j, s);
#pragma unroll
    for (int e = 0; e < 32; ++e) {
        const float q = (float)(signed char)(s.v[e >> 2] >> (8 * (e & 3)));
        const float w = __fmul_rn(e < 16 ? s.a_lo : s.a_hi, q);
        out[e] = QFmt<F>::MIN ? __fadd_rn(w, s.b) : w;
    }
}

__device__ __forceinline__ void q_values_any(int fmt, const unsigned char* row, int j, float* out) {
    switch (fmt) {
        case QF_Q4_0: q_values<QF_Q4_0>(row, j, out); break;
        case QF_Q4_1: q_values<QF_Q4_1>(row, j, out); break;
        case QF_Q5_0: q_values<QF_Q5_0>(row, j, out); break;
        case QF_Q5_1: q_values<QF_Q5_1>(row, j, out); break;
        case QF_Q8_0: q_values<QF_Q8_0>(row, j, out); break;
        case QF_Q4_K: q_values<QF_Q4_K>(row, j, out); break;
        case QF_Q5_K: q_values<QF_Q5_K>(row, j, out); break;
        default: q_values<QF_Q6_K>(row, j, out); break;
    }
}

// out [rows, k] bf16 = rows of W (format fmt, row_bytes each), stored column c written to column order[c]
// when the file reorders columns: the prefill GEMM's weight tile, in Hugging Face column order.
extern "C" __global__ void qdequant_bf16(int fmt, const unsigned char* __restrict__ W, long long row_bytes,
                                         int rows, int k, const int* __restrict__ order,
                                         bf16_t* __restrict__ out) {
    PDL_ENTER();
    const long long nsub = (long long)rows * (k >> 5);
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nsub;
         b += (long long)gridDim.x * blockDim.x) {
        const long long r = b / (k >> 5);
        const int j = (int)(b - r * (k >> 5));
        float v[32];
        q_values_any(fmt, W + r * row_bytes, j, v);
        bf16_t* o = out + r * k;
#pragma unroll
        for (int e = 0; e < 32; ++e) o[order ? order[32 * j + e] : 32 * j + e] = f2bf(v[e]);
    }
}

// x [rows, k] f32 = table rows ids[r] (format fmt): the embedding lookup of a quantized table.
extern "C" __global__ void qembed(int fmt, const unsigned char* __restrict__ table, long long row_bytes,
                                  const int* __restrict__ ids, float* __restrict__ x, int k) {
    PDL_ENTER();
    const long long r = blockIdx.x;
    const unsigned char* row = table + (long long)ids[r] * row_bytes;
    for (int j = threadIdx.x; j < (k >> 5); j += blockDim.x) {
        float v[32];
        q_values_any(fmt, row, j, v);
#pragma unroll
        for (int e = 0; e < 32; ++e) x[r * k + 32 * j + e] = v[e];
    }
}

// ---- FP8 (fine-grained e4m3, one f32 scale per [br, bc] block; Qwen's FP8 checkpoints, --quantize fp8)
//
// Decode / verify rows (fp8_gemv): f32 inputs as they are. A weight byte q becomes the f16 whose bits are
// (q & 0x80) << 8 | (q & 0x7F) << 7, the e4m3 value times 2^-8 exactly, widened to f32; the block scale
// is taken times 2^8 (exact), so the products are the true ones. One thread takes one 16-column chunk
// (inside one block: bc is a multiple of 16) against every input row r:
//     p_j = fma chain over the chunk's columns j ≡ e (mod 4), p = (p_0 + p_1) + (p_2 + p_3)
//     acc[r] = fma(p, 256 · s, acc[r])
// with the lanes and warps summed as qgemv. Batch invariant as qgemv: nothing depends on the row count.

__device__ __forceinline__ float e4m3_scaled(unsigned q) {
    return f16_bits(((q & 0x7Fu) << 7) | ((q & 0x80u) << 8));
}

// y[r * ldy + i] (+)= W[i] . x[r] for FP8 rows W [m, k] (k a multiple of 16), scales [ceil(m/br), ceil(k/bc)]
// and n <= 16 input rows x [n, k].
extern "C" __global__ void __launch_bounds__(QGEMV_WARPS * 32)
    fp8_gemv(const unsigned char* __restrict__ W, int m, int k, int br, int bc, const float* __restrict__ scales,
             int n, const float* __restrict__ x, float* __restrict__ y, int ldy, int accumulate, int wpr) {
    __shared__ float part_sums[QGEMV_WARPS][QGEMV_MAX_ROWS];
    PDL_ENTER();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows_per_block = QGEMV_WARPS / wpr;
    const int i = blockIdx.x * rows_per_block + warp / wpr, part = warp % wpr;
    const int nch = k >> 4, gk = (k + bc - 1) / bc;
    float acc[QGEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < QGEMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    if (i < m) {
        const unsigned char* row = W + (long long)i * k;
        const float* srow = scales + (long long)(i / br) * gk;
        for (int c = part * 32 + lane; c < nch; c += 32 * wpr) {
            const uint4 q = *reinterpret_cast<const uint4*>(row + 16 * c);
            const unsigned words[4] = {q.x, q.y, q.z, q.w};
            float w[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) w[e] = e4m3_scaled((words[e >> 2] >> (8 * (e & 3))) & 0xFFu);
            const float s = __fmul_rn(srow[(16 * c) / bc], 256.0f);
#pragma unroll
            for (int r = 0; r < QGEMV_MAX_ROWS; ++r) {
                if (r < n) {
                    const float4* xp = reinterpret_cast<const float4*>(x + (long long)r * k + 16 * c);
                    float xv[16];
#pragma unroll
                    for (int t = 0; t < 4; ++t) {
                        const float4 v = xp[t];
                        xv[4 * t] = v.x;
                        xv[4 * t + 1] = v.y;
                        xv[4 * t + 2] = v.z;
                        xv[4 * t + 3] = v.w;
                    }
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int e = 0; e < 16; ++e) p[e & 3] = __fmaf_rn(w[e], xv[e], p[e & 3]);
                    const float pc = __fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3]));
                    acc[r] = __fmaf_rn(pc, s, acc[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < QGEMV_MAX_ROWS; ++r)
        if (r < n) acc[r] = warp_sum(acc[r]);
    if (wpr > 1) {
        if (lane == 0)
            for (int r = 0; r < n; ++r) part_sums[warp][r] = acc[r];
        __syncthreads();
        if (part == 0 && lane == 0)
            for (int r = 0; r < n; ++r) {
                float t = part_sums[warp][r];
                for (int p = 1; p < wpr; ++p) t = __fadd_rn(t, part_sums[warp + p][r]);
                acc[r] = t;
            }
    }
    if (i < m && part == 0 && lane == 0)
        for (int r = 0; r < n; ++r) {
            float* out = y + (long long)r * ldy + i;
            *out = accumulate ? __fadd_rn(*out, acc[r]) : acc[r];
        }
}

// out [rows, k] bf16 = FP8 rows of W with their block scales (first_row: the tile's first row in the part).
extern "C" __global__ void fp8_dequant_bf16(const unsigned char* __restrict__ W, int rows, int k, int br, int bc,
                                            const float* __restrict__ scales, int first_row,
                                            bf16_t* __restrict__ out) {
    PDL_ENTER();
    const long long count = (long long)rows * k;
    const int gk = (k + bc - 1) / bc;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count;
         e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / k;
        const int c = (int)(e - r * k);
        const float s = scales[(long long)((first_row + r) / br) * gk + c / bc];
        out[e] = f2bf(__fmul_rn(__fmul_rn(e4m3_scaled(W[e]), 256.0f), s));
    }
}
