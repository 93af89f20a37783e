// Gated attention over the GPU KV cache. `start` (the position of row 0) is read from device memory so
// that a captured decode graph stays valid as the position advances.
//
// attn_prep, one block per (head of q ∪ k, row): per-head RMSNorm (q_norm / k_norm), partial rotate-half
// RoPE at position start + row (angle = f32(pos) * inv_freq[j], cos/sin taken in f64 as the CPU engine),
// q (and the output gate) to their buffers, k and v into the cache at that position.
//
// attn_split + attn_combine (split-K flash decoding): query row r of head h sees keys 0..start+r.
// Block (split, h, r) folds keys [split*ATT_CHUNK, ...) with an online softmax (running max m, sum l,
// accumulator acc = sum exp(s - m) v), 4 warps over interleaved keys, merged in shared memory; the
// combine kernel merges the splits: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, then
// out *= sigmoid(gate) for gated attention. The same kernels serve decode, verify and prefill rows.
#define ATT_CHUNK 256
#define ATT_WARPS 4
#define ATT_MAX_D 256
#define ATT_PER_LANE (ATT_MAX_D / 32)

extern "C" __global__ void attn_prep(const float* __restrict__ qkv, const float* __restrict__ q_norm,
                                     const float* __restrict__ k_norm, const float* __restrict__ inv_freq,
                                     const int* __restrict__ start_p, float* __restrict__ q_out,
                                     float* __restrict__ gate_out, float* __restrict__ k_cache,
                                     float* __restrict__ v_cache, int hq, int hkv, int d, int rot_half,
                                     int gated, float eps, int zero_centred) {
    __shared__ double scratch[32];
    __shared__ float vals[ATT_MAX_D];
    const int head = blockIdx.x, row = blockIdx.y;
    const int pos = *start_p + row;
    const int qw = hq * d * (gated ? 2 : 1);
    const float* rowp = qkv + (size_t)row * (qw + 2 * hkv * d);
    const float* src;
    const float* nw;
    float* dst;
    if (head < hq) {
        src = rowp + (size_t)head * d * (gated ? 2 : 1);
        nw = q_norm;
        dst = q_out + ((size_t)row * hq + head) * d;
        if (gated)
            for (int i = threadIdx.x; i < d; i += blockDim.x)
                gate_out[((size_t)row * hq + head) * d + i] = src[d + i];
    } else {
        const int kh = head - hq;
        src = rowp + qw + (size_t)kh * d;
        nw = k_norm;
        dst = k_cache + ((size_t)pos * hkv + kh) * d;
        const float* vsrc = rowp + qw + (size_t)hkv * d + (size_t)kh * d;
        float* vdst = v_cache + ((size_t)pos * hkv + kh) * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) vdst[i] = vsrc[i];
    }
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)src[i] * (double)src[i];
    ss = block_sum_d(ss, scratch);
    float inv = 1.0f / sqrtf((float)(ss / (double)d) + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float scale = zero_centred ? 1.0f + nw[i] : nw[i];
        vals[i] = (src[i] * inv) * scale;
    }
    __syncthreads();
    const float fpos = (float)pos;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float out = vals[i];
        if (i < 2 * rot_half) {
            const int j = i < rot_half ? i : i - rot_half;
            const float angle = fpos * inv_freq[j];
            const float c = (float)cos((double)angle), s = (float)sin((double)angle);
            if (i < rot_half) out = vals[i] * c - vals[i + rot_half] * s;
            else out = vals[i] * c + vals[i - rot_half] * s;
        }
        dst[i] = out;
    }
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_split(const float* __restrict__ q, const float* __restrict__ k_cache,
               const float* __restrict__ v_cache, const int* __restrict__ start_p,
               float* __restrict__ part_m, float* __restrict__ part_l, float* __restrict__ part_acc, int hq,
               int hkv, int d, int max_splits, float scale) {
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAX_D];
    const int split = blockIdx.x, head = blockIdx.y, row = blockIdx.z;
    const int len = *start_p + row + 1;
    const int k0 = split * ATT_CHUNK;
    if (k0 >= len) return;  // uniform over the block
    const int k1 = min(len, k0 + ATT_CHUNK);
    const int kvh = head / (hq / hkv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float qv[ATT_PER_LANE], acc[ATT_PER_LANE];
    const float* qr = q + ((size_t)row * hq + head) * d;
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        qv[j] = i < d ? qr[i] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int t = k0 + warp; t < k1; t += ATT_WARPS) {
        const float* kr = k_cache + ((size_t)t * hkv + kvh) * d;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_PER_LANE; ++j) {
            const int i = lane + 32 * j;
            if (i < d) s = fmaf(qv[j], kr[i], s);
        }
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);  // m = -inf on the first key: corr = 0
        const float p = expf(s - mn);
        l = l * corr + p;
        const float* vr = v_cache + ((size_t)t * hkv + kvh) * d;
#pragma unroll
        for (int j = 0; j < ATT_PER_LANE; ++j) {
            const int i = lane + 32 * j;
            if (i < d) acc[j] = acc[j] * corr + p * vr[i];
        }
        m = mn;
    }
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        if (i < d) sacc[warp][i] = acc[j];
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, sm[w]);
    const size_t slot = ((size_t)row * hq + head) * max_splits + split;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w)
            if (sl[w] > 0.0f) a += sacc[w][i] * expf(sm[w] - mx);
        part_acc[slot * d + i] = a;
    }
    if (threadIdx.x == 0) {
        float tl = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w)
            if (sl[w] > 0.0f) tl += sl[w] * expf(sm[w] - mx);
        part_m[slot] = mx;
        part_l[slot] = tl;
    }
}

// One block per (head, row); out [n, hq, d].
extern "C" __global__ void attn_combine(const float* __restrict__ part_m, const float* __restrict__ part_l,
                                        const float* __restrict__ part_acc, const int* __restrict__ start_p,
                                        const float* __restrict__ gate, float* __restrict__ out, int hq, int d,
                                        int max_splits, int gated) {
    const int head = blockIdx.x, row = blockIdx.y;
    const int len = *start_p + row + 1;
    const int splits = (len + ATT_CHUNK - 1) / ATT_CHUNK;
    const size_t base = ((size_t)row * hq + head) * max_splits;
    float mx = NEG_INF;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_m[base + s]);
    float tl = 0.0f;
    for (int s = 0; s < splits; ++s) tl += part_l[base + s] * expf(part_m[base + s] - mx);
    const float inv = 1.0f / tl;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < splits; ++s) a += part_acc[(base + s) * d + i] * expf(part_m[base + s] - mx);
        float o = a * inv;
        if (gated) o *= sigmoid_f(gate[((size_t)row * hq + head) * d + i]);
        out[((size_t)row * hq + head) * d + i] = o;
    }
}
