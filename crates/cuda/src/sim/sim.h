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
// statics: blocks never overlap, so one copy serves every block.
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
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
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

// ---- fibers
namespace sim {
enum State { RUNNABLE, BLOCKED, DONE };
struct Fiber {
    void* sp = nullptr;
    State state = RUNNABLE;
};
struct Barrier {
    int arrived = 0;
    std::vector<int> waiting;
};
extern "C" void sim_switch(void** save_sp, void* to_sp);
inline std::vector<Fiber> fibers;
inline std::vector<char*> stacks;
inline const size_t STACK = 256 * 1024;
inline void* sched_sp = nullptr;
inline int cur = 0;
inline int alive_block = 0;
inline int alive_warp[32];
inline Barrier block_bar, warp_bar[32];
inline unsigned long long xch[32][32];
inline std::function<void()> body;
inline std::string error;
inline std::vector<unsigned char> dyn_smem;

inline void fail(const std::string& what) {
    if (error.empty()) error = what;
}
inline void yield_blocked() {
    fibers[cur].state = BLOCKED;
    sim_switch(&fibers[cur].sp, sched_sp);
}
inline void release(Barrier& b) {
    for (int i : b.waiting) fibers[i].state = RUNNABLE;
    b.waiting.clear();
    b.arrived = 0;
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
    int w = cur >> 5;
    alive_block--;
    alive_warp[w]--;
    if (block_bar.arrived > 0 && block_bar.arrived >= alive_block) release(block_bar);
    if (warp_bar[w].arrived > 0 && warp_bar[w].arrived >= alive_warp[w]) release(warp_bar[w]);
}
[[noreturn]] inline void fiber_main() {
    body();
    fibers[cur].state = DONE;
    on_exit();
    void* dummy;
    sim_switch(&dummy, sched_sp);
    std::abort();
}
// Runs one block of blockDim.x fibers to completion; false on deadlock.
inline bool run_block() {
    const int n = (int)blockDim.x;
    if ((int)stacks.size() < n) {
        for (int i = (int)stacks.size(); i < n; ++i) stacks.push_back((char*)std::aligned_alloc(64, STACK));
    }
    fibers.assign(n, Fiber{});
    alive_block = n;
    for (int w = 0; w < 32; ++w) {
        alive_warp[w] = std::max(0, std::min(32, n - 32 * w));
        warp_bar[w] = Barrier{};
    }
    block_bar = Barrier{};
    for (int i = 0; i < n; ++i) {
        // Stack top 16-aligned: [top-8] fake return address, [top-16] entry, then 6 callee-saved slots.
        uintptr_t top = ((uintptr_t)stacks[i] + STACK) & ~(uintptr_t)15;
        void** sp = (void**)top;
        *--sp = nullptr;
        *--sp = (void*)&fiber_main;
        for (int r = 0; r < 6; ++r) *--sp = nullptr;
        fibers[i].sp = sp;
    }
    int done = 0;
    while (done < n) {
        bool progress = false;
        done = 0;
        for (int i = 0; i < n; ++i) {
            if (fibers[i].state == RUNNABLE) {
                cur = i;
                threadIdx.x = (unsigned)i;
                threadIdx.y = threadIdx.z = 0;
                sim_switch(&sched_sp, fibers[i].sp);
                progress = true;
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
    const int lane = cur & 31, w = cur >> 5;
    std::memcpy(&xch[w][lane], &v, sizeof(T));
    wait(warp_bar[w], alive_warp[w]);
    T r = v;
    if (take) {
        const int f = w * 32 + (src & 31);
        if (f >= (int)fibers.size() || fibers[f].state == DONE) fail("shuffle reads a lane that has exited");
        std::memcpy(&r, &xch[w][src & 31], sizeof(T));
    }
    wait(warp_bar[w], alive_warp[w]);
    return r;
}
}  // namespace sim

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

inline void __syncthreads() { sim::wait(sim::block_bar, sim::alive_block); }
inline void __syncwarp(unsigned = 0xffffffffu) { sim::wait(sim::warp_bar[sim::cur >> 5], sim::alive_warp[sim::cur >> 5]); }
inline void __threadfence() {}
inline void __threadfence_block() {}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) { return sim::shfl(v, (sim::cur & 31) ^ m, true); }
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return sim::shfl(v, src, true); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d) {
    int s = (sim::cur & 31) + (int)d;
    return sim::shfl(v, s, s < 32);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    int s = (sim::cur & 31) - (int)d;
    return sim::shfl(v, s, s >= 0);
}
template <class T> inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
inline void* sim_dyn_smem() { return sim::dyn_smem.data(); }
