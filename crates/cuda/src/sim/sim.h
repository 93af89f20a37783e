// CUDA C on the host: just enough of the CUDA device language for the kernels in src/cu/ to compile
// as C++ and run on the CPU, so that their arithmetic, indexing, barriers and warp shuffles can be
// checked without a GPU (CudaDevice::simulated). Not a performance model.
//
// Execution model: one block at a time on the calling OS thread; each CUDA thread of the block is a
// fiber with its own stack, switched cooperatively (a 6-register x86-64 context switch). A fiber runs
// until it reaches a barrier (__syncthreads, __syncwarp, or the two halves of a shuffle) or exits;
// a barrier releases when every non-exited thread of its scope (block or warp) has arrived, as on
// sm_70+. If no fiber can run while some wait, the launch fails with "deadlock" (a barrier in
// divergent code); a shuffle reading an exited lane fails too. __shared__ variables are function
// statics: blocks never overlap, so one copy serves every block. Cooperative kernels (the GEMV
// segments, which meet at grid barriers and use only dynamic shared memory) run all their blocks'
// threads interleaved instead; their spin waits yield (sim_mbar_wait, sim_ld_acquire_spin), and the
// sm_90 mbarrier and bulk copy are emulated (a copy lands at once).
// Floating point is IEEE single/double as on the GPU; expf/sinf/... come from libm (last-ulp
// differences), and no multiply-add is contracted (NVCC contracts), so results agree with the GPU to
// rounding, not bitwise. Bitwise properties *within* the simulator (batch invariance) are meaningful.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#define KERNEL_SIM 1

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct int4 { int x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long b = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((b >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
// Explicitly rounded float steps and byte dot products (the quantized kernels, quant.cu).
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}

// ---- fibers
namespace sim {
enum State { RUNNABLE, BLOCKED, DONE };
struct Fiber {
    void* sp = nullptr;
    State state = RUNNABLE;
    int block = 0;   // index into `blocks`
    int thread = 0;  // threadIdx.x
};
struct Barrier {
    int arrived = 0;
    std::vector<int> waiting;
};
// What the threads of one block share: their barriers, the shuffle exchange, dynamic shared memory.
struct Block {
    dim3 idx;
    int alive = 0;
    int alive_warp[32] = {};
    Barrier bar, warp_bar[32], named[16];
    unsigned long long xch[32][32] = {};
    std::vector<unsigned char> dyn_smem;
};
extern "C" void sim_switch(void** save_sp, void* to_sp);
inline std::vector<Fiber> fibers;
inline std::vector<char*> stacks;
inline const size_t STACK = 256 * 1024;
inline void* sched_sp = nullptr;
inline int cur = 0;
inline std::vector<Block> blocks;
inline Block* blk = nullptr;  // the running fiber's block
inline std::function<void()> body;
inline std::string error;
inline size_t dyn_bytes = 0;
// Spin waits (mbarriers, grid barriers) yield to the scheduler; this many in a row with no barrier or
// mbarrier phase completing anywhere means nothing can progress.
inline unsigned long long idle_spins = 0;
inline const unsigned long long MAX_IDLE_SPINS = 200000000ull;

inline void fail(const std::string& what) {
    if (error.empty()) error = what;
}
inline void progressed() { idle_spins = 0; }
inline void yield_blocked() {
    fibers[cur].state = BLOCKED;
    sim_switch(&fibers[cur].sp, sched_sp);
}
// A polling thread gives the others a turn (it stays runnable).
inline void yield_spin() {
    if (++idle_spins > MAX_IDLE_SPINS) fail("deadlock: threads spin on a condition nothing will change");
    sim_switch(&fibers[cur].sp, sched_sp);
}
inline void release(Barrier& b) {
    for (int i : b.waiting) fibers[i].state = RUNNABLE;
    b.waiting.clear();
    b.arrived = 0;
    progressed();
}
inline void wait(Barrier& b, int alive) {
    b.arrived++;
    if (b.arrived >= alive) {
        release(b);
        return;
    }
    b.waiting.push_back(cur);
    yield_blocked();
}
inline void on_exit() {
    const int w = fibers[cur].thread >> 5;
    blk->alive--;
    blk->alive_warp[w]--;
    if (blk->bar.arrived > 0 && blk->bar.arrived >= blk->alive) release(blk->bar);
    if (blk->warp_bar[w].arrived > 0 && blk->warp_bar[w].arrived >= blk->alive_warp[w]) release(blk->warp_bar[w]);
}
[[noreturn]] inline void fiber_main() {
    body();
    fibers[cur].state = DONE;
    on_exit();
    progressed();
    void* dummy;
    sim_switch(&dummy, sched_sp);
    std::abort();
}
// Runs the blocks `idx` (each of blockDim.x fibers) to completion, their threads interleaved, so
// threads of different blocks may wait for each other (grid barriers); false on deadlock.
inline bool run_blocks(const std::vector<dim3>& idx) {
    const int per = (int)blockDim.x, n = per * (int)idx.size();
    for (int i = (int)stacks.size(); i < n; ++i) stacks.push_back((char*)std::aligned_alloc(64, STACK));
    blocks.assign(idx.size(), Block{});
    for (size_t b = 0; b < idx.size(); ++b) {
        blocks[b].idx = idx[b];
        blocks[b].alive = per;
        for (int w = 0; w < 32; ++w) blocks[b].alive_warp[w] = std::max(0, std::min(32, per - 32 * w));
        blocks[b].dyn_smem.assign(dyn_bytes, 0xcd);
    }
    fibers.assign(n, Fiber{});
    for (int i = 0; i < n; ++i) {
        fibers[i].block = i / per;
        fibers[i].thread = i % per;
        // Stack top 16-aligned: [top-8] fake return address, [top-16] entry, then 6 callee-saved slots.
        uintptr_t top = ((uintptr_t)stacks[i] + STACK) & ~(uintptr_t)15;
        void** sp = (void**)top;
        *--sp = nullptr;
        *--sp = (void*)&fiber_main;
        for (int r = 0; r < 6; ++r) *--sp = nullptr;
        fibers[i].sp = sp;
    }
    idle_spins = 0;
    int done = 0;
    while (done < n) {
        bool progress = false;
        done = 0;
        for (int i = 0; i < n; ++i) {
            if (fibers[i].state == RUNNABLE) {
                cur = i;
                blk = &blocks[fibers[i].block];
                threadIdx.x = (unsigned)fibers[i].thread;
                threadIdx.y = threadIdx.z = 0;
                blockIdx = blk->idx;
                sim_switch(&sched_sp, fibers[i].sp);
                progress = true;
                if (!error.empty()) return false;
            }
            if (fibers[i].state == DONE) done++;
        }
        if (!progress && done < n) {
            fail("deadlock: threads wait at a barrier that others never reach (divergent __syncthreads / shuffle)");
            return false;
        }
    }
    return true;
}
template <class T>
inline T shfl(T v, int src, bool take) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    const int t = fibers[cur].thread, lane = t & 31, w = t >> 5;
    std::memcpy(&blk->xch[w][lane], &v, sizeof(T));
    wait(blk->warp_bar[w], blk->alive_warp[w]);
    T r = v;
    if (take) {
        const int f = cur - t + w * 32 + (src & 31);
        if (w * 32 + (src & 31) >= (int)blockDim.x || fibers[f].state == DONE) fail("shuffle reads a lane that has exited");
        std::memcpy(&r, &blk->xch[w][src & 31], sizeof(T));
    }
    wait(blk->warp_bar[w], blk->alive_warp[w]);
    return r;
}

// mbarrier (sm_90) in its 8 bytes: bits 0-15 the expected arrivals, 16-31 the arrivals still pending in
// this phase, 32-62 transaction bytes pending, 63 the parity of the current (incomplete) phase.
inline void mbar_store(unsigned long long* b, unsigned expected, unsigned pending, unsigned tx, unsigned phase) {
    *b = (unsigned long long)expected | (unsigned long long)pending << 16 | (unsigned long long)tx << 32 |
         (unsigned long long)phase << 63;
}
inline void mbar_update(unsigned long long* b, int arrivals, long long tx_delta) {
    const unsigned long long v = *b;
    const unsigned expected = v & 0xffff, pending = (v >> 16) & 0xffff, phase = (unsigned)(v >> 63);
    const long long tx = (long long)((v >> 32) & 0x7fffffff) + tx_delta;
    if ((int)pending < arrivals || tx < 0) fail("mbarrier: more arrivals or bytes than the phase expects");
    const unsigned left = pending - arrivals;
    if (left == 0 && tx == 0) {
        mbar_store(b, expected, expected, 0, phase ^ 1u);
        progressed();
    } else {
        mbar_store(b, expected, left, (unsigned)tx, phase);
    }
}
// Whether the phase of parity `parity` has completed: the current phase has the other parity.
inline bool mbar_done(const unsigned long long* b, unsigned parity) { return (unsigned)(*b >> 63) != (parity & 1u); }
}  // namespace sim

inline void sim_mbar_init(unsigned long long* b, unsigned count) { sim::mbar_store(b, count, count, 0, 0); }
inline void sim_mbar_arrive(unsigned long long* b) { sim::mbar_update(b, 1, 0); }
inline void sim_mbar_expect_tx(unsigned long long* b, unsigned bytes) { sim::mbar_update(b, 1, bytes); }
inline void sim_mbar_wait(unsigned long long* b, unsigned parity) {
    while (!sim::mbar_done(b, parity) && sim::error.empty()) sim::yield_spin();
}
// cp.async.bulk global -> shared: the bytes land at once and complete their transaction on `b`.
inline void sim_bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
    std::memcpy(dst, src, bytes);
    sim::mbar_update(b, 0, -(long long)bytes);
}
// bar.sync id, count: `count` threads of the block meet.
inline void sim_named_barrier(int id, int count) { sim::wait(sim::blk->named[id & 15], count); }
// A load that other blocks' stores must eventually satisfy: polled with a turn for the others.
inline unsigned sim_ld_acquire_spin(const unsigned* p) {
    sim::yield_spin();
    return *(const volatile unsigned*)p;
}
inline unsigned long long sim_ld_acquire_spin_u64(const unsigned long long* p) {
    sim::yield_spin();
    return *(const volatile unsigned long long*)p;
}

asm(R"(
.text
.globl sim_switch
.type sim_switch,@function
sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size sim_switch,.-sim_switch
)");

inline void __syncthreads() { sim::wait(sim::blk->bar, sim::blk->alive); }
inline void __syncwarp(unsigned = 0xffffffffu) {
    const int w = sim::fibers[sim::cur].thread >> 5;
    sim::wait(sim::blk->warp_bar[w], sim::blk->alive_warp[w]);
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline int sim_lane() { return sim::fibers[sim::cur].thread & 31; }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) { return sim::shfl(v, sim_lane() ^ m, true); }
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return sim::shfl(v, src, true); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d) {
    int s = sim_lane() + (int)d;
    return sim::shfl(v, s, s < 32);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    int s = sim_lane() - (int)d;
    return sim::shfl(v, s, s >= 0);
}
template <class T> inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
// The lanes holding the same value as this one (all 32 lanes take part, as in a shuffle).
template <class T> inline unsigned __match_any_sync(unsigned, T v) {
    unsigned m = 0;
    for (int s = 0; s < 32; ++s)
        if (sim::shfl(v, s, true) == v) m |= 1u << s;
    return m;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
// The lanes whose predicate is true (all 32 lanes take part, as in a shuffle).
inline unsigned __ballot_sync(unsigned, int pred) {
    unsigned m = 0;
    for (int s = 0; s < 32; ++s)
        if (sim::shfl(pred != 0, s, true)) m |= 1u << s;
    return m;
}
template <class T> inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
inline void* sim_dyn_smem() { return sim::blk->dyn_smem.data(); }
