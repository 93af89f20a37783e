// The segment kernels' synchronisation and copy primitives (segment.cu): mbarrier init / arrive / wait /
// test, bulk copies into shared memory (cp.async.bulk completing on a page's mbarrier), acquire loads and
// arrivals of the grid barrier, L2 prefetches, clocks and the SM id. The GPU's PTX, and under KERNEL_SIM
// the simulator's versions (sim.h: mbarriers, bulk copies and the grid barrier emulated on fibers).
#ifdef KERNEL_SIM
__device__ __forceinline__ void seg_mbar_init(unsigned long long* b, unsigned count) { sim_mbar_init(b, count); }
__device__ __forceinline__ void seg_mbar_wait(unsigned long long* b, unsigned parity) {
    sim_mbar_wait(b, parity);
}
__device__ __forceinline__ void seg_mbar_arrive(unsigned long long* b) { sim_mbar_arrive(b); }
// Whether the phase of parity `parity` has completed, without waiting.
__device__ __forceinline__ bool seg_mbar_test(unsigned long long* b, unsigned parity) { return sim::mbar_done(b, parity); }
__device__ __forceinline__ void seg_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* full,
                                              bool, unsigned long long) {
    sim_mbar_expect_tx(full, bytes);
    sim_bulk_copy(dst, src, bytes, full);
}
__device__ __forceinline__ unsigned long long seg_ld_acquire(const unsigned long long* p) {
    return sim_ld_acquire_spin_u64(p);
}
__device__ __forceinline__ unsigned long long seg_arrive(unsigned long long* p) { return atomicAdd(p, 1ull); }
__device__ __forceinline__ void seg_prefetch_l2(const void*, unsigned) {}
#define SEG_MBAR_INIT_FENCE() ((void)0)
#define SEG_EVICT_FIRST_POLICY(p) ((void)(p))
#define SEG_BAR_SYNC(count) sim_named_barrier(1, (count))
#define SEG_CLOCK() 0ull
#define SEG_GLOBALTIMER() 0ull
#define SEG_SMID() ((unsigned)blockIdx.x)
#else
__device__ __forceinline__ unsigned seg_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void seg_mbar_init(unsigned long long* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(seg_smem_addr(b)), "r"(count));
}
// Waits for the phase of parity `parity` to complete, with try_wait (the thread may be suspended until it
// completes or a time limit passes).
__device__ __forceinline__ void seg_mbar_wait(unsigned long long* b, unsigned parity) {
    unsigned ok = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(ok)
            : "r"(seg_smem_addr(b)), "r"(parity)
            : "memory");
    } while (!ok);
}
__device__ __forceinline__ void seg_mbar_arrive(unsigned long long* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(seg_smem_addr(b)) : "memory");
}
// Whether the phase of parity `parity` has completed, without waiting.
__device__ __forceinline__ bool seg_mbar_test(unsigned long long* b, unsigned parity) {
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok)
                 : "r"(seg_smem_addr(b)), "r"(parity)
                 : "memory");
    return ok != 0;
}
__device__ __forceinline__ void seg_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* full,
                                              bool evict_first, unsigned long long policy) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(seg_smem_addr(full)), "r"(bytes)
                 : "memory");
    if (evict_first)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
                seg_smem_addr(dst)),
            "l"(src), "r"(bytes), "r"(seg_smem_addr(full)), "l"(policy)
            : "memory");
    else
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                seg_smem_addr(dst)),
            "l"(src), "r"(bytes), "r"(seg_smem_addr(full))
            : "memory");
}
__device__ __forceinline__ unsigned long long seg_ld_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
// One arrival at the grid barrier: releases the block's writes (ordered before it by the consumers'
// bar.sync; release is cumulative) and returns the count before it.
__device__ __forceinline__ unsigned long long seg_arrive(unsigned long long* p) {
    unsigned long long old;
    asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
    return old;
}
// An asynchronous prefetch of `bytes` (a multiple of 16) at `src` (16-byte aligned) into L2.
__device__ __forceinline__ void seg_prefetch_l2(const void* src, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
#define SEG_MBAR_INIT_FENCE() asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory")
#define SEG_EVICT_FIRST_POLICY(p) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p))
#define SEG_BAR_SYNC(count) asm volatile("bar.sync 1, %0;" ::"r"(count) : "memory")
#define SEG_CLOCK() ((unsigned long long)clock64())
__device__ __forceinline__ unsigned long long seg_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define SEG_GLOBALTIMER() seg_globaltimer()
__device__ __forceinline__ unsigned seg_smid() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#define SEG_SMID() seg_smid()
#endif
