// A run of one-row bf16 GEMVs (a decode step between two mixer cores: out, gate_up, down, next in_proj)
// as ONE persistent kernel: one block per SM, C consumer warps computing rows and P producer warps
// streaming weight-row pieces into shared-memory pages with bulk copies (cp.async.bulk + mbarrier). The
// producers never wait for the grid barrier between stages, only for a free page, so the next stage's
// weights keep arriving while the consumers finish a stage, cross the barrier and stage the new input;
// with programmatic launch they start streaming while the previous kernel (a mixer core) still runs.
// Done with their copies, the producers prefetch into L2 what the caller named for the kernels after
// the segment (segment.rs prefetch_after: a GDN layer's state, read by the recurrence next).
// A stage may first apply a GDN layer's gated RMSNorm to its staged input (gate_z): the norm gdn_rec
// would otherwise end with after a fence and a counter (4B step 2.783 ms against 2.830).
// Rows summed by one warp in one piece may read their input from registers instead of the staged copy
// (seg_row_held, kernels of 8 consumers: the 4B step 2.728 ms against 2.756).
// A persistent ring of 128 GEMVs ran in 2.10 ms against 2.335 as launches (a standalone probe).
//
// Exactness: a row's sum is formed as linear.cu forms it for one row (linear_rows<bf16, 1>): lane l of
// part p accumulates vectors p*32 + l + k*32*wpr in k order with the same fmaf chain, each part is
// warp_sum'ed, the parts are added in part order; the staged input is normalised by 256 threads with
// rms_inv's arithmetic; the epilogues are the same expressions. So a segment's outputs equal the
// per-GEMV launches' bit for bit (cuda_check's bench compares the two configurations' logits).
//
// Work split: block b owns jobs b, b + grid, ... of every stage (a job: one output row, or a SwiGLU
// gate/up row pair) and reads their row pieces ("units") in order through one ring of pages (unit u in
// page u % pages); the block's k-th job of the whole kernel goes to consumer warp k % C. Page p is
// filled only by producer warp p % P (pages: a multiple of P, at most 64); a mbarrier phase must never
// be waited on two phases ahead (that reads as complete), so every consumer has its own `full`
// barrier per page, whose phases are that consumer's uses of the page, in its order; `empty` (one
// arrival per use) orders the reuses. Grid barrier: an arrival count that only grows (seg_grid_sync),
// so captured graphs replay it unchanged. The kernel must have all its blocks resident: one per SM, and
// it lets the next kernel launch (PDL_LAUNCH) only after the first grid barrier, when every block is.
// The kernel simulator runs it too (sim.h emulates the mbarriers, bulk copies and grid barrier).
#if defined(KERNEL_SIM) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define SEG_MAX_STAGES 8
#define SEG_MAX_IN 12288

struct SegStage {
    const bf16_t* w;       // [out, in]
    const float* x;        // [in]
    float* y;              // [out] (SwiGLU: [swiglu_inter])
    const float* norm_w;   // RMSNorm of x first, or null; with gate_z: the gated norm's weights [gated_dv]
    const float* gate_z;   // or null: x first gets a GDN layer's gated RMSNorm, per group of gated_dv values
    int in, out, accumulate, wpr, swiglu_inter, zero_centred, pieces, gated_dv;
    float eps;
    int norm_staged;  // RMSNorm weights staged after x (xs[in ..]) with it, not read as they are applied
};
#define SEG_MAX_PREFETCH 4
struct SegPrefetch {
    const unsigned char* p;  // 16-byte aligned
    unsigned long long bytes;  // a multiple of 16
};
struct SegParams {
    SegStage st[SEG_MAX_STAGES];
    // flags bit 0: weights stream with an L2 evict-first hint; bit 6: no stage stages its RMSNorm's
    // weights (measurements); bits 10-15: the pages a block may have in flight (the in-flight cap in
    // gemv_segment_body; 0: no cap); bits 16-21: the same at a stage boundary; bit 22: the boundary ends
    // as the grid barrier is passed (measurements)
    int n, page_bytes, pages, flags;
    int xs_floats;  // the staged input's room: the widest stage input (<= SEG_MAX_IN), a multiple of 4
    unsigned pages_m;  // seg_magic(pages), from the host (a kernel parameter costs no register)
    unsigned long long* barrier;  // arrivals at the grid barrier: zero at allocation, then only grows
    // Buffers the kernels after this launch read first (a GDN layer's recurrent state), prefetched into
    // L2 once the block's producers have issued their last copy (seg_prefetch_after); 0 bytes: none.
    SegPrefetch pf[SEG_MAX_PREFETCH];
};
static_assert(sizeof(SegStage) == 80, "SegStage layout is mirrored by segment.rs");
static_assert(sizeof(SegParams) == 736, "SegParams layout is mirrored by segment.rs");

// The synchronisation and copy primitives: segment_sync.cuh.
// The trace kernels (measurements only, TURBOSPARK_SEG_TRACE=1, segment_trace.rs) record per block, in
// 64 words after the grid barrier's: SM clocks at kernel entry / end, globaltimer at entry / end, the
// producers' first / last copy, the SM's id + 1 (word 6), and per stage s (words SEG_TR_STAGE + 6 s ..): stage start, input staged,
// rows done, grid barrier passed, cycles the consumer warps waited for pages, cycles producers waited for
// free pages; (words SEG_TR_LOADED + s) when thread 0's staging loads of stage s had returned; and each
// consumer warp's end of its rows (SEG_TR_WARPS).
#define SEG_TR_WORDS 128
#define SEG_TR_STAGE 8
#define SEG_TR_LOADED (SEG_TR_STAGE + 6 * SEG_MAX_STAGES)
#define SEG_TR_WARPS 64  // + 16 s + w: consumer warp w (< 16) done with its rows of stage s (< 4)
// + 16 s + 15 (no kernel has 16 consumers): the producers' waits for a free page during which a consumer warp
// of the block was itself waiting for a page (sampled as the wait begins and ends): the ring's coupling.
#define SEG_TR_COUPLED 15
// + 16 s + 14 (no kernel has more than 12 consumers): the producers' waits for their own earlier copy to land
// (the in-flight cap), a part of their waits.
#define SEG_TR_CAPPED 14
// + 16 s + 13: the units the producers had issued past the stage's first (landed or in flight) when the
// consumers began its rows: what the ring banked across the boundary.
#define SEG_TR_AHEAD 13
enum {
    SEG_TR_ENTRY = 0,
    SEG_TR_END = 1,
    SEG_TR_GT_ENTRY = 2,
    SEG_TR_GT_END = 3,
    SEG_TR_P_FIRST = 4,
    SEG_TR_P_LAST = 5,
    SEG_TR_SM = 6
};
// Barrier 1 over the C consumer warps only (the producers are elsewhere).
template <int C>
__device__ __forceinline__ void seg_consumers_sync() {
    SEG_BAR_SYNC(C * 32);
}

// Every block's consumers have finished the stage and its writes are visible GPU-wide. The barrier is
// a 64-bit arrival count that only grows: every block arrives once per barrier, so the count is a
// multiple of the grid between barriers (and between launches: graphs replay it unchanged), and a
// barrier is passed when the count reaches the next multiple. One acq_rel atomic per block and polling
// loads: the release reaches everyone one L2 round trip after the last arrival (trace, 4B step: the
// counter + generation pair with its reset and fences waited 3-5 us per barrier).
// (A fire-and-forget red.release arrival against a target read at entry, polled relaxed and followed
// by fence.acq_rel: 2.837 ms against 2.816: the fence costs more than the round trip it saves.)
template <int C, bool TRACE = false>
__device__ __forceinline__ void seg_grid_sync(unsigned long long* count, unsigned long long* tr = nullptr) {
    seg_consumers_sync<C>();
    if (threadIdx.x == 0) {
        if (TRACE) tr[2] = SEG_CLOCK();
        const unsigned long long g = gridDim.x, target = (seg_arrive(count) / g + 1) * g;
        while (seg_ld_acquire(count) < target) {
        }
        if (TRACE) tr[3] = SEG_CLOCK();
    }
    seg_consumers_sync<C>();
}

// The staged input in two planes of float4 (seg_x_at): element i of vector v = i / 8 is in plane
// (i / 4) % 2, so lane l's two float4 of vector v (8 consecutive values) come from 16-byte slots that
// are consecutive across the warp's lanes in each plane: 4 shared-memory wavefronts per plane and
// warp step instead of 8 for two loads 32 bytes apart (segment trace: the consumers' shared-memory
// traffic bounded the gate_up and in_proj stages).
// 1.0f / y as the IEEE division computes it (round to nearest), without its branch: the division's own
// fast path (MUFU.RCP, then one fma correction: the SASS of `1.0f / y`) for y whose
// exponent field is 1..252, the range the division's check sends there; `slow` is set for any other y,
// whose result the caller must take from the division itself. The simulator divides.
__device__ __forceinline__ float seg_rcp_fast(float y, bool& slow) {
    slow |= ((__float_as_uint(y) + 0x1800000u) & 0x7f800000u) <= 0x1ffffffu;
#ifdef KERNEL_SIM
    return 1.0f / y;
#else
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    const float e = fmaf(y, r, -1.0f);
    return fmaf(r, -e, r);
#endif
}

__device__ __forceinline__ int seg_x_at(int i, int in) { return ((i >> 2) & 1) * (in >> 1) + ((i >> 3) << 2) + (i & 3); }

// block_sum_d's arithmetic for 256 threads (the first 8 consumer warps), on the consumers' barrier.
template <int C>
__device__ __forceinline__ float seg_rms_inv(const float* xr, int width, float eps, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double ss = 0.0;
    if (threadIdx.x < NORM_THREADS)
        for (int i = threadIdx.x; i < width; i += NORM_THREADS) {
            const float v = xr[seg_x_at(i, width)];
            ss += (double)v * (double)v;
        }
    ss = warp_sum_d(ss);
    seg_consumers_sync<C>();
    if (lane == 0 && warp < NORM_THREADS / 32) scratch[warp] = ss;
    seg_consumers_sync<C>();
    double t = 0.0;
    for (int w = 0; w < NORM_THREADS / 32; ++w) t += scratch[w];
    const float variance = (float)(t / (double)width);
    return 1.0f / sqrtf(variance + eps);
}

__device__ __forceinline__ float seg_dot8(uint4 u, float4 a, float4 b, float s) {
    s = fmaf(bf16_lo(u.x), a.x, s);
    s = fmaf(bf16_hi(u.x), a.y, s);
    s = fmaf(bf16_lo(u.y), a.z, s);
    s = fmaf(bf16_hi(u.y), a.w, s);
    s = fmaf(bf16_lo(u.z), b.x, s);
    s = fmaf(bf16_hi(u.z), b.y, s);
    s = fmaf(bf16_lo(u.w), b.z, s);
    s = fmaf(bf16_hi(u.w), b.w, s);
    return s;
}

// A block's ring as one consumer warp sees it: `pages` pages in unit order (unit u in page u % pages),
// this warp's own `full` barriers, everyone's `empty` ones, and the parity of each page's next use by
// this warp (bit p).
// n / d for the ring's counts (n < 2^26, 4 <= d <= 64) by a multiply-high with m = ceil(2^32 / d) (segment.rs
// ring_magic): exact there (n (m d - 2^32) < 2^32), three instructions instead of a runtime division's ~20
// (the SASS: MUFU.RCP and I2F in every piece's page lookup and every producer copy).
__device__ __forceinline__ unsigned seg_div(unsigned n, unsigned m) { return __umulhi(n, m); }

template <class Par>  // the consumer's page parities: unsigned (at most 32 pages) or unsigned long long (64)
struct SegRing {
    unsigned char* pages;
    unsigned long long* full;   // [pages], this consumer's
    unsigned long long* empty;  // [pages]
    int pages_n, page_bytes;
    unsigned pages_m;  // SegParams::pages_m
    Par parity;  // bit k: page k's next phase for this consumer
    unsigned long long waited;  // trace kernels: cycles spent waiting for pages
    int* waiting;               // trace kernels: the block's consumer warps waiting for a page now
};

// The page of unit `seq` once its bytes have landed (this consumer's next phase of it).
template <bool TRACE, class R>
__device__ __forceinline__ int seg_page_take(R& r, unsigned seq) {
    const int k = (int)(seq - seg_div(seq, r.pages_m) * (unsigned)r.pages_n);
    if (TRACE) {
        const unsigned long long w0 = SEG_CLOCK();
        if (!seg_mbar_test(&r.full[k], (unsigned)(r.parity >> k) & 1u)) {
            const bool counts = (threadIdx.x & 31) == 0;
            if (counts) atomicAdd(r.waiting, 1);
            seg_mbar_wait(&r.full[k], (unsigned)(r.parity >> k) & 1u);
            if (counts) atomicAdd(r.waiting, -1);
        }
        r.waited += SEG_CLOCK() - w0;
    } else {
        seg_mbar_wait(&r.full[k], (unsigned)(r.parity >> k) & 1u);
    }
    r.parity ^= decltype(r.parity)(1) << k;
    return k;
}

// One weight row of `in` values, read from units seq, seq + 1, ... (`pieces` of them): the row's sum
// in linear.cu's order for `WPR` parts.
template <int WPR, bool TRACE, class R>
__device__ __forceinline__ float seg_row(R& r, unsigned seq, const float* xs, int in, int pieces, int lane) {
    float acc[WPR];
#pragma unroll
    for (int q = 0; q < WPR; ++q) acc[q] = 0.0f;
    const int pv = in / 8 / pieces;  // vectors per piece
    for (int pc = 0; pc < pieces; ++pc, ++seq) {
        const int k = seg_page_take<TRACE>(r, seq);
        const uint4* wv = reinterpret_cast<const uint4*>(r.pages + (size_t)k * r.page_bytes);
        const float4* xlo = reinterpret_cast<const float4*>(xs);
        const float4* xhi = reinterpret_cast<const float4*>(xs + (in >> 1));
        const int v0 = pc * pv, v1 = v0 + pv;
        // Vector v belongs to lane v % 32 and part (v / 32) % WPR; `base` is a multiple of 32 * WPR,
        // so vector base + q * 32 + lane is part q.
        const int base = ((v0 >> 5) & ~(WPR - 1)) << 5;
        // A round inside the piece issues all its loads before its arithmetic; guarded one vector at a
        // time, each vector's loads waited for its predecessor's eight dependent FMAs (SASS: a branch per
        // vector). 8B step 4.582 ms against 4.656, 9B 4.419 against 4.442, 4B equal. Rounds the
        // piece's ends cut (pieces not a multiple of 32 * WPR vectors) stay guarded: loading their outside
        // vectors too cost more than the branches (4B down projection rows 11.86 us against 11.41).
#pragma unroll 1
        for (int b = base; b < v1; b += 32 * WPR) {
            if (b >= v0 && b + 32 * WPR <= v1) {
                uint4 w[WPR];
                float4 lo[WPR], hi[WPR];
#pragma unroll
                for (int q = 0; q < WPR; ++q) {
                    const int v = b + q * 32 + lane;
                    w[q] = wv[v - v0];
                    lo[q] = xlo[v];
                    hi[q] = xhi[v];
                }
#pragma unroll
                for (int q = 0; q < WPR; ++q) acc[q] = seg_dot8(w[q], lo[q], hi[q], acc[q]);
            } else {
#pragma unroll
                for (int q = 0; q < WPR; ++q) {
                    const int v = b + q * 32 + lane;
                    if (v >= v0 && v < v1) acc[q] = seg_dot8(wv[v - v0], xlo[v], xhi[v], acc[q]);
                }
            }
        }
        __syncwarp();
        if (lane == 0) seg_mbar_arrive(&r.empty[k]);
    }
    float t = warp_sum(acc[0]);
#pragma unroll
    for (int q = 1; q < WPR; ++q) t += warp_sum(acc[q]);
    return t;
}

// A held input (seg_row_held): rows of 8 * 32 * NV values in one piece, summed by one warp (WPR 1). Lane
// l's vectors l + 32 j (j < NV) are the same for every row of the stage, so the lane holds the first NR of
// them in registers (the two planes) and reads only the rest and its weights from shared memory: for
// NR = NV, 4 wavefronts per warp step instead of 12. Vector 32 j + lane is the lane's j-th: seg_row<1>'s
// order, so the same bits. (Also holding the out projection's input (4 warps per row, in pieces): 4B
// step 2.752 ms against 2.729, 9B 4.700 against 4.557: its stage ran faster, the rest slower.)
template <bool B, class T, class F>
struct SegIf {
    using type = T;
};
template <class T, class F>
struct SegIf<false, T, F> {
    using type = F;
};
template <int NV_, int NR_>
struct SegHeld {
    static constexpr int NV = NV_, NR = NR_;
    static_assert(NR <= NV, "held vectors of the row");
    // A 4096-wide held row fills an 8 KB page, so its rings have at most 28 pages (segment_config.rs
    // HeldKernel::max_pages): 32-bit parities, as 64 spill 8 bytes in x16.
    using Parity = typename SegIf<NV_ >= 16, unsigned, unsigned long long>::type;
    __device__ __forceinline__ static bool fits(const SegStage& st) {
        return st.pieces == 1 && st.wpr == 1 && st.in == 8 * 32 * NV;
    }
};
using SegHeldNone = SegHeld<0, 0>;

template <class H, bool TRACE, class R>
__device__ __forceinline__ float seg_row_held(R& r, unsigned seq, const float4 (&xl)[H::NR],
                                              const float4 (&xh)[H::NR], const float* xs, int lane) {
    const int k = seg_page_take<TRACE>(r, seq);
    const uint4* wv = reinterpret_cast<const uint4*>(r.pages + (size_t)k * r.page_bytes);
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < H::NV; ++j) {
        const int v = 32 * j + lane;
        acc = j < H::NR ? seg_dot8(wv[v], xl[j], xh[j], acc) : seg_dot8(wv[v], x4[v], x4[32 * H::NV + v], acc);
    }
    __syncwarp();
    if (lane == 0) seg_mbar_arrive(&r.empty[k]);
    return warp_sum(acc);
}

template <bool TRACE, class R>
__device__ __forceinline__ float seg_row_any(R& r, unsigned seq, const float* xs, int in, int pieces, int wpr,
                                             int lane) {
    switch (wpr) {
        case 1: return seg_row<1, TRACE>(r, seq, xs, in, pieces, lane);
        case 2: return seg_row<2, TRACE>(r, seq, xs, in, pieces, lane);
        case 4: return seg_row<4, TRACE>(r, seq, xs, in, pieces, lane);
        default: return seg_row<8, TRACE>(r, seq, xs, in, pieces, lane);
    }
}

// Jobs of a stage (rows, or SwiGLU row pairs) and how many of them block b of g owns.
__device__ __forceinline__ int seg_jobs(const SegStage& s) { return s.swiglu_inter ? s.swiglu_inter : s.out; }
__device__ __forceinline__ int seg_owned(int jobs, int b, int g) { return b < jobs ? (jobs - b + g - 1) / g : 0; }

// Producer `who` of `n` prefetches its chunks of the ranges in p.pf (chunk c of the ranges' concatenation
// goes to producer c % n), after its last copy: the DRAM then serves them while the segment drains its
// ring, so the kernel after it finds its first reads in L2 (4B step, GDN state and conv window: 2.809
// ms against 2.815; the next segment's weights instead, 21-44 MB: 2.888-2.939 against 2.853:
// the recurrence's own reads then wait behind them).
#define SEG_PREFETCH_CHUNK 16384
__device__ __forceinline__ void seg_prefetch_after(const SegParams& p, int who, int n) {
    int c0 = 0;  // chunks of the ranges before r
    for (int r = 0; r < SEG_MAX_PREFETCH; ++r) {
        const unsigned long long bytes = p.pf[r].bytes;
        const int chunks = (int)((bytes + SEG_PREFETCH_CHUNK - 1) / SEG_PREFETCH_CHUNK);
        for (int c = ((who - c0) % n + n) % n; c < chunks; c += n) {
            const unsigned long long at = (unsigned long long)c * SEG_PREFETCH_CHUNK, left = bytes - at;
            seg_prefetch_l2(p.pf[r].p + at, left < SEG_PREFETCH_CHUNK ? (unsigned)left : SEG_PREFETCH_CHUNK);
        }
        c0 += chunks;
    }
}

// A consumer warp's rows of a stage (its jobs i0, i0 + C, ... of the block's `owned`), each summed by
// `row(first unit)`, with the stage's epilogue (SwiGLU, residual).
template <int C, class Row>
__device__ __forceinline__ void seg_stage_rows(const SegStage& st, int b, int g, int owned, int i0, unsigned seq0,
                                               unsigned units, int lane, Row row) {
    for (int i = i0; i < owned; i += C) {
        const int j = b + i * g;
        const unsigned seq = seq0 + (unsigned)i * units;
        // The residual this row adds to, fetched before the row so its L2 latency hides behind it.
        const float prev = st.accumulate && lane == 0 ? __ldcg(st.y + j) : 0.0f;
        // A SwiGLU job's gate then up row through one copy of the row's code (x10 kernel 97.7 KB of code
        // instead of 139.6; 4B step 2.609 / 2.608 ms against 2.611 / 2.611).
        float t = 0.0f, u = 0.0f;
#pragma unroll 1
        for (int half = 0; half < (st.swiglu_inter ? 2 : 1); ++half) {
            const float r = row(seq + half * st.pieces);
            if (half == 0) t = r;
            else u = r;
        }
        if (st.swiglu_inter) {
            if (lane == 0) st.y[j] = silu_f(t) * u;
        } else if (lane == 0) {
            st.y[j] = st.accumulate ? prev + t : t;
        }
    }
}

// seg_stage_rows with the stage's input held in registers (seg_row_held), loaded from the staged planes.
template <int C, class H, bool TRACE, class R>
__device__ __forceinline__ void seg_stage_rows_held(const SegStage& st, R& ring, const float* xs, int b, int g,
                                                    int owned, int i0, unsigned seq0, unsigned units, int lane) {
    float4 xl[H::NR], xh[H::NR];
    const float4* x4 = reinterpret_cast<const float4*>(xs);
#pragma unroll
    for (int j = 0; j < H::NR; ++j) {
        xl[j] = x4[32 * j + lane];
        xh[j] = x4[32 * H::NV + 32 * j + lane];
    }
    seg_stage_rows<C>(st, b, g, owned, i0, seq0, units, lane,
                      [&](unsigned seq) { return seg_row_held<H, TRACE>(ring, seq, xl, xh, xs, lane); });
}

// Stages that fit HELD (SegHeld) hold their input in registers.
template <int C, int PRODUCERS, bool TRACE, class HELD>
__device__ __forceinline__ void gemv_segment_body(const SegParams& p) {
    const int pages = p.pages;  // a multiple of PRODUCERS, at most 64 (the consumers' parity bits)
    unsigned char* smem = DYN_SMEM(unsigned char);
    float* xs = reinterpret_cast<float*>(smem + (size_t)pages * p.page_bytes);
    unsigned long long* empty = reinterpret_cast<unsigned long long*>(xs + p.xs_floats);
    unsigned long long* full = empty + pages;  // [C][pages]
    double* scratch = reinterpret_cast<double*>(full + C * pages);
    // In-flight cap (flags bits 10-15: F pages, a multiple of PRODUCERS; 0 or F >= pages: none): a producer
    // copies unit u only once unit u - F (its own: u = pw mod PRODUCERS) has landed, so a block has at most F
    // pages in flight and the rest of the ring holds landed pages. Fewer bytes queued in the memory system
    // stream faster and more evenly over the SMs (4B step 2.486 ms with 8 pages against 2.530 uncapped, run
    // 148; segment_config.rs FLIGHT_BYTES). The wait is on the full barrier the consumer of unit u - F waits
    // on, at that use's parity: flight_last[page] holds the consumer and parity of the page's last copy,
    // flight_par[page] per consumer the parity of the page's next copy for it (u - F < u: its page was not
    // refilled since, and that barrier has no later phase armed).
    const int flight = ((p.flags >> 10) & 63) < pages ? (p.flags >> 10) & 63 : 0;
    unsigned* flight_last = reinterpret_cast<unsigned*>(scratch + 32);  // [pages] (segment_config.rs smem_bytes)
    unsigned* flight_par = flight_last + pages;                          // [pages]
    // A producer copying for a stage its consumers have not yet staged (they finish the stage before, wait
    // at the grid barrier or stage its input) keeps fewer copies in flight (flags bits 16-21, 0: as
    // `flight`): the boundary's round trips queue behind fewer bytes. 4B / 9B / 8B step 2.433 / 4.260 /
    // 4.364 ms against 2.497 / 4.372 / 4.482 with no boundary rule.
    int* staged = reinterpret_cast<int*>(flight_par + pages);  // the stages the consumers have staged
    const int edge_flight = ((p.flags >> 16) & 63) < pages ? (p.flags >> 16) & 63 : 0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = gridDim.x, b = blockIdx.x;
    unsigned long long* tr = TRACE ? p.barrier + 2 + (size_t)b * SEG_TR_WORDS : nullptr;
    for (int i = threadIdx.x; i < pages * (C + 1); i += blockDim.x) seg_mbar_init(&empty[i], 1);
    for (int i = threadIdx.x; i <= 2 * pages; i += blockDim.x) flight_last[i] = 0;
    int* waiting = nullptr;  // trace kernels: SegRing::waiting
    unsigned* issued = nullptr;  // trace kernels: each producer's units issued (its last seq + 1)
    if constexpr (TRACE) {
        __shared__ int waiting_s;
        __shared__ unsigned issued_s[PRODUCERS];
        waiting = &waiting_s;
        issued = issued_s;
        if (threadIdx.x == 0) waiting_s = 0;
        if (threadIdx.x < PRODUCERS) issued_s[threadIdx.x] = 0;
    }
    SEG_MBAR_INIT_FENCE();
    __syncthreads();
    if (warp >= C) {
        // Producer warp pw (lane 0 only: spinning lanes of one warp starve each other) fills the pages
        // with index % PRODUCERS == pw, i.e. the units u with u % PRODUCERS == pw, each once the page's
        // previous use was read. Weights are never written, so this runs before the previous kernel ends.
        const int pw = warp - C;
        const bool evict_first = p.flags & 1;
        unsigned long long policy = 0;
        if (evict_first) SEG_EVICT_FIRST_POLICY(policy);
        unsigned seq0 = 0;  // the stage's first unit
        int k = 0;          // the block's jobs so far
        unsigned long long pwait = 0, pcoupled = 0, pcapped = 0;
        for (int s = 0; s < p.n && lane == 0; ++s) {
            const int in = p.st[s].in, pieces = p.st[s].pieces, inter = p.st[s].swiglu_inter;
            const unsigned char* w = reinterpret_cast<const unsigned char*>(p.st[s].w);
            const int owned = seg_owned(inter ? inter : p.st[s].out, b, g);
            const int units = inter ? 2 * pieces : pieces;
            const unsigned piece_bytes = (unsigned)(in / pieces) * 2u;
            for (int u = (int)((unsigned)(pw - (int)seq0) % PRODUCERS);; u += PRODUCERS) {
                const int i = units == 1 ? u : u / units, rem = u - i * units;
                if (i >= owned) break;  // (not `u < owned * units`: 2.797 ms against 2.814)
                const int half = rem >= pieces, pc = rem - half * pieces;
                const int c = (k + i) % C;
                const int j = b + i * g;
                const int row = half ? inter + j : j;
                const unsigned seq = seq0 + (unsigned)u;
                const unsigned use = seg_div(seq, p.pages_m);
                const int page = (int)(seq - use * (unsigned)pages);
                const unsigned long long w0 = TRACE ? SEG_CLOCK() : 0ull;
                const bool coupled_before = TRACE && use > 0 && *(volatile int*)waiting > 0;
                if (use > 0) seg_mbar_wait(&empty[page], (use - 1) & 1u);
                if (flight) {
                    const int f = edge_flight && s >= *(volatile int*)staged ? edge_flight : flight;
                    if (seq >= (unsigned)f) {
                        const unsigned long long c0 = TRACE ? SEG_CLOCK() : 0ull;
                        const unsigned before = seq - (unsigned)f;
                        const int q = (int)(before - seg_div(before, p.pages_m) * (unsigned)pages);
                        const unsigned m = flight_last[q];
                        seg_mbar_wait(&full[(m & 255u) * pages + q], m >> 8);
                        if (TRACE) pcapped += SEG_CLOCK() - c0;
                    }
                    const unsigned par = (flight_par[page] >> c) & 1u;
                    flight_par[page] ^= 1u << c;
                    flight_last[page] = (unsigned)c | par << 8;
                }
                if (TRACE) {
                    const unsigned long long w1 = SEG_CLOCK();
                    pwait += w1 - w0;
                    if (use > 0 && (coupled_before || *(volatile int*)waiting > 0)) pcoupled += w1 - w0;
                    if (pw == 0 && s == 0 && u == (int)((unsigned)(pw - (int)seq0) % PRODUCERS)) tr[SEG_TR_P_FIRST] = w1;
                }
                seg_bulk_load(smem + (size_t)page * p.page_bytes, w + ((size_t)row * in * 2 + (size_t)pc * piece_bytes),
                              piece_bytes, &full[c * pages + page], evict_first, policy);
                if (TRACE) *(volatile unsigned*)&issued[pw] = seq + 1;
            }
            seq0 += (unsigned)(owned * units);
            k += owned;
            if (TRACE && s < 8) {
                atomicAdd(&tr[SEG_TR_STAGE + 6 * s + 5], pwait);
                if (s < 4) atomicAdd(&tr[SEG_TR_WARPS + 16 * s + SEG_TR_COUPLED], pcoupled);
                if (s < 4) atomicAdd(&tr[SEG_TR_WARPS + 16 * s + SEG_TR_CAPPED], pcapped);
                pwait = pcoupled = pcapped = 0;
                if (pw == 0) tr[SEG_TR_P_LAST] = SEG_CLOCK();
            }
        }
        if (lane == 0) seg_prefetch_after(p, b * PRODUCERS + pw, g * PRODUCERS);
        // Stay until the consumers are done: a thread that exits with bulk copies in flight faults the launch.
        __syncthreads();
        return;
    }
    PDL_WAIT();
    if (TRACE && threadIdx.x == 0) {
        tr[SEG_TR_ENTRY] = SEG_CLOCK();
        tr[SEG_TR_GT_ENTRY] = SEG_GLOBALTIMER();
        tr[SEG_TR_SM] = SEG_SMID() + 1;
    }
    SegRing<typename HELD::Parity> ring;
    ring.pages = smem;
    ring.full = full + warp * pages;
    ring.empty = empty;
    ring.pages_n = pages;
    ring.pages_m = p.pages_m;
    ring.page_bytes = p.page_bytes;
    ring.parity = 0;
    ring.waited = 0;
    ring.waiting = waiting;
    int k = 0;
    unsigned seq0 = 0;  // the stage's first unit
    for (int s = 0; s < p.n; ++s) {
        const SegStage& st = p.st[s];
        // Every block is resident once the first barrier is behind (this is the second stage or later).
        if (s == p.n - 1 && s > 0) PDL_LAUNCH();
        unsigned long long* ts = TRACE ? tr + SEG_TR_STAGE + 6 * s : nullptr;
        if (TRACE && threadIdx.x == 0) ts[0] = SEG_CLOCK();
        // (Measurements, flags bit 22: the boundary ends as the barrier is passed, before the staging.)
        if ((p.flags & (1u << 22)) && threadIdx.x == 0) *(volatile int*)staged = s + 1;
        // The input was written by every block in the previous stage: L2 only (L1 may hold an old copy).
        float gw[4];  // a gated norm's weights w[lane + 32 k] (gated_dv <= 128)
        const bool norm_staged = st.norm_staged && !(p.flags & 64);
        {
            // x, then a gated norm's z (plainly, after x), loaded together, and the norm's weights of
            // this lane: one round trip (6.8 us of staging with them loaded in the norm's loop).
            if (st.gate_z)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int i = lane + 32 * k;
                    gw[k] = i < st.gated_dv ? __ldg(st.norm_w + i) : 0.0f;
                }
            // (An RMSNorm's weights likewise, when they fit: one round trip instead of two.)
            const float4* x4 = reinterpret_cast<const float4*>(st.x);
            const float4* z4 = reinterpret_cast<const float4*>(st.gate_z ? st.gate_z : st.norm_w);
            float4* d4 = reinterpret_cast<float4*>(xs);
            const int n4 = st.in >> 2, all4 = st.gate_z || norm_staged ? 2 * n4 : n4, step = C * 32;
            for (int i0 = threadIdx.x; i0 < all4; i0 += 8 * step) {
                float4 v[8];
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const int i4 = i0 + q * step;
                    if (i4 < all4) v[q] = __ldcg(i4 < n4 ? x4 + i4 : z4 + (i4 - n4));
                }
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const int i4 = i0 + q * step;
                    if (i4 < all4) d4[i4 < n4 ? (i4 & 1) * (n4 >> 1) + (i4 >> 1) : i4] = v[q];
                }
            }
            if (TRACE && threadIdx.x == 0) tr[SEG_TR_LOADED + s] = SEG_CLOCK();
        }
        seg_consumers_sync<C>();
        if (TRACE && threadIdx.x == 0 && s == 0) tr[SEG_TR_LOADED + SEG_MAX_STAGES - 4] = SEG_CLOCK();
        if (st.gate_z) {
            // gated_norm_warp's arithmetic (misc.cu) per group, one warp per group: the same bits as
            // gdn_rec's own norm or the gated_rmsnorm kernel, without their fence, counter and pass.
            // A warp takes 4 heads at a time, their sums and reductions interleaved (independent chains):
            // 2.774 ms against 2.784 one head at a time.
            const int dv = st.gated_dv, heads = st.in / dv;
            // ss / dv as ss * (1 / dv) when dv is a power of two: the same bits without the double
            // division's branchy sequence.
            const bool dv_pow2 = (dv & (dv - 1)) == 0;
            const double inv_dv = 1.0 / (double)dv;
            for (int h0 = warp; h0 < heads; h0 += 4 * C) {
                // The branch-free work for all 16 values of the lane first (loads, sums of squares, the
                // gates' denominators 1 + expf(-z)), so their latencies overlap; then the divisions, whose
                // range checks branch. One value at a time, each chain in its own basic block, the warp's
                // share took 3.66 us (1260 instructions of dependent latency). The denominator is
                // formed in one expression, as in sigmoid_f, so it contracts alike (the SASS fuses expf's last
                // multiply with the + 1).
                float xv[4][4], den[4][4];  // (z is read again where it gates: fewer live registers)
                double ss[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int h = h0 + r * C;
                    ss[r] = 0.0;
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int i = lane + 32 * k;
                        const bool ok = h < heads && i < dv;
                        xv[r][k] = ok ? xs[seg_x_at(h * dv + i, st.in)] : 0.0f;
                        const float zz = ok ? xs[st.in + h * dv + i] : 0.0f;
                        if (ok) ss[r] += (double)xv[r][k] * (double)xv[r][k];
                        den[r][k] = 1.0f + expf(-zz);
                    }
                }
#pragma unroll
                for (int r = 0; r < 4; ++r) ss[r] = warp_sum_d(ss[r]);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int h = h0 + r * C;
                    if (h >= heads) break;
                    const double mean = dv_pow2 ? ss[r] * inv_dv : ss[r] / (double)dv;
                    const float inv = 1.0f / sqrtf((float)mean + st.eps);
                    // The head's 4 gates' 1 / den without a branch each (seg_rcp_fast), again through the
                    // division in the rare case one is outside the fast path's range.
                    float sig[4];
                    bool slow = false;
#pragma unroll
                    for (int k = 0; k < 4; ++k) sig[k] = seg_rcp_fast(den[r][k], slow);
                    if (slow)
#pragma unroll
                        for (int k = 0; k < 4; ++k) sig[k] = 1.0f / den[r][k];
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const int i = lane + 32 * k;
                        // sigmoid_f(zz) = 1 / (1 + expf(-zz)), its denominator formed above.
                        if (i < dv)
                            xs[seg_x_at(h * dv + i, st.in)] =
                                ((xv[r][k] * inv) * gw[k]) * (xs[st.in + h * dv + i] * sig[k]);
                    }
                }
            }
            if (TRACE && threadIdx.x == 0 && s == 0) tr[SEG_TR_LOADED + SEG_MAX_STAGES - 3] = SEG_CLOCK();
            seg_consumers_sync<C>();
        } else if (st.norm_w) {
            const float inv = seg_rms_inv<C>(xs, st.in, st.eps, scratch);
            const float4* w4 = reinterpret_cast<const float4*>(st.norm_w);
            float4* x4 = reinterpret_cast<float4*>(xs);
            const float4* sw4 = norm_staged ? reinterpret_cast<const float4*>(xs + st.in) : w4;
            for (int i = threadIdx.x; i < (st.in >> 2); i += C * 32) {
                const float4 sw = sw4[i];
                float4& v = x4[(i & 1) * (st.in >> 3) + (i >> 1)];
                v.x = (v.x * inv) * (st.zero_centred ? 1.0f + sw.x : sw.x);
                v.y = (v.y * inv) * (st.zero_centred ? 1.0f + sw.y : sw.y);
                v.z = (v.z * inv) * (st.zero_centred ? 1.0f + sw.z : sw.z);
                v.w = (v.w * inv) * (st.zero_centred ? 1.0f + sw.w : sw.w);
            }
            seg_consumers_sync<C>();
        }
        if (TRACE && threadIdx.x == 0) ts[1] = SEG_CLOCK();
        if (threadIdx.x == 0) *(volatile int*)staged = s + 1;
        if (TRACE && threadIdx.x == 0 && s < 4) {
            unsigned most = 0;
            for (int q = 0; q < PRODUCERS; ++q) most = max(most, *(volatile unsigned*)&issued[q]);
            tr[SEG_TR_WARPS + 16 * s + SEG_TR_AHEAD] = most > seq0 ? most - seq0 : 0;
        }
        const int owned = seg_owned(seg_jobs(st), b, g);
        const unsigned units = (unsigned)(st.swiglu_inter ? 2 * st.pieces : st.pieces);
        const int i0 = (warp - k % C + C) % C;
        bool held = false;
        if constexpr (HELD::NV > 0) {
            held = HELD::fits(st);
            if (held) seg_stage_rows_held<C, HELD, TRACE>(st, ring, xs, b, g, owned, i0, seq0, units, lane);
        }
        if (!held) {
            seg_stage_rows<C>(st, b, g, owned, i0, seq0, units, lane, [&](unsigned seq) {
                return seg_row_any<TRACE>(ring, seq, xs, st.in, st.pieces, st.wpr, lane);
            });
        }
        k += owned;
        seq0 += (unsigned)owned * units;
        if (TRACE) {
            if (lane == 0) atomicAdd(&ts[4], ring.waited);
            if (lane == 0 && s < 4 && warp < 16) tr[SEG_TR_WARPS + 16 * s + warp] = SEG_CLOCK();
            ring.waited = 0;
        }
        if (s + 1 < p.n) {
            seg_grid_sync<C, TRACE>(p.barrier, ts);
        } else if (TRACE) {
            seg_consumers_sync<C>();
            if (threadIdx.x == 0) ts[2] = ts[3] = SEG_CLOCK();
        }
    }
    if (TRACE && threadIdx.x == 0) {
        tr[SEG_TR_END] = SEG_CLOCK();
        tr[SEG_TR_GT_END] = SEG_GLOBALTIMER();
    }
    __syncthreads();
}

// C consumer and P producer warps. 4B-shaped decode step on the H200: 8 / 12 / 16 consumers
// 3.066 / 2.947 / 2.981 ms (per-GEMV launches 3.040); 8 producers instead of 4: 3.091; registers capped
// so that a block fits beside two gdn_rec blocks: no gain (88) or spills (80).
// Held inputs need ~160 registers, so 12 warps at most: 16 x 128 registers fill the SM, and 14 x 144 do
// not fit its four register files. One kernel per held width (segment.rs HELD_KERNELS): a kernel
// carrying both widths' code ran the 4B step 0.06 ms slower. Held vectors: as many as fit 168
// registers without spills (ptxas, sm_90).
#define SEG_KERNEL(C, P, HELD, NAME)                                                                           \
    extern "C" __global__ void __launch_bounds__(((C) + (P)) * 32, 1) gemv_segment_##NAME(const SegParams p) {  \
        gemv_segment_body<C, P, false, HELD>(p);                                                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(((C) + (P)) * 32, 1) gemv_segment_trace_##NAME(const SegParams p) { \
        gemv_segment_body<C, P, true, HELD>(p);                                                               \
    }
using SegHeld10 = SegHeld<10, 10>;
// x16 holds 11: with 12 it spilled 8 bytes once norm weights were staged (9B 4.611 vs 4.551 ms).
using SegHeld16 = SegHeld<16, 11>;
SEG_KERNEL(8, 4, SegHeldNone, c8p4)
SEG_KERNEL(12, 4, SegHeldNone, c12p4)
SEG_KERNEL(8, 4, SegHeld10, c8p4_x10)
SEG_KERNEL(8, 4, SegHeld16, c8p4_x16)
// Registers capped (`TURBOSPARK_SEG_REGCAP=1`, measurements): 512 x 88 registers leave room for two
// 128-thread gdn_rec blocks of 64 on the same SM. Resident beside them only with every kernel's
// carveout at 100% and no cooperative launch (TURBOSPARK_CARVEOUT=100, TURBOSPARK_SEG_COOP=0: the
// producers start 4.5-5.7 us before the consumers, stage 0 rows 7.3 -> 4.9 us), yet the step is not
// faster: 2.838-2.850 ms against 2.815 (the recurrence's reads wait behind the stream).
extern "C" __global__ void __maxnreg__(88) gemv_segment_r88_c12p4(const SegParams p) {
    gemv_segment_body<12, 4, false, SegHeldNone>(p);
}
extern "C" __global__ void __maxnreg__(88) gemv_segment_trace_r88_c12p4(const SegParams p) {
    gemv_segment_body<12, 4, true, SegHeldNone>(p);
}
#endif
